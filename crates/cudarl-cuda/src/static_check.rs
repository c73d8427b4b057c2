//! Static safety checks, run before compiling: named rules loaded from a TOML file
//! (`configs/harness/static_rules.toml`), not scattered `if`s. Each rule is a regex over the
//! source with comments and string literals blanked out; `#include`s are checked against an
//! allow-list per format.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Do not compile; the verdict fails with this reason.
    Reject,
    /// Record it in `static_flags`; compile and run anyway.
    Flag,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: String,
    message: String,
    pattern: String,
    formats: Vec<String>,
    action: Action,
    #[serde(default)]
    strings: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRules {
    rule: Vec<RawRule>,
    includes: std::collections::BTreeMap<String, Vec<String>>,
    objects: RawObjects,
    #[serde(default)]
    python: RawPython,
    extension_objects: RawExtensionObjects,
}

/// `[extension_objects]`: what a built torch extension may import from torch
/// ([`crate::extension_object`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExtensionObjects {
    /// Qualified torch names allowed (anchored regexes).
    torch_symbols: Vec<String>,
    /// Names refused wherever they live (anchored regexes, raw or qualified).
    refused_symbols: Vec<String>,
}

/// `[python]`: how KernelBench `ModelNew` files are screened before any of their code runs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPython {
    /// Screen every `ModelNew` file with the allow-list (`python/cudarl_screen.py`).
    allowlist: bool,
}

impl Default for RawPython {
    fn default() -> Self {
        RawPython { allowlist: true }
    }
}

/// `[objects]`: what a native candidate's compiled host object may import and register.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawObjects {
    /// Undefined symbols allowed (anchored regexes).
    native_symbols: Vec<String>,
    /// C names an object may not define besides those it may import (anchored regexes).
    #[serde(default)]
    reserved_exports: Vec<String>,
    /// The one `.init_array` entry allowed: nvcc's fat-binary registration.
    constructor: String,
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Rule id (e.g. `process-spawn`).
    pub id: String,
    /// Message shown when it matches.
    pub message: String,
    re: Regex,
    formats: Vec<String>,
    /// Reject or flag.
    pub action: Action,
    /// Match against the source with string literals kept (for inline-asm templates).
    pub strings: bool,
}

/// A rule that matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Rule id (`include` for the include allow-list).
    pub rule: String,
    /// Reject or flag.
    pub action: Action,
    /// 1-based line of the first match.
    pub line: u32,
    /// The matched text (trimmed, at most 80 characters).
    pub matched: String,
    /// The rule's message.
    pub message: String,
}

/// The rule set.
#[derive(Debug, Clone)]
pub struct Rules {
    rules: Vec<Rule>,
    includes: std::collections::BTreeMap<String, Vec<String>>,
    objects: ObjectRules,
    /// Whether `ModelNew` files must pass the allow-list (`[python] allowlist`, default on): a
    /// construct it does not name is the reject `py-allowlist`. Off only to test what stands
    /// behind it (the interpreter sandbox, the runner, the kernels-ran check).
    pub python_allowlist: bool,
    extension: ExtensionRules,
    /// BLAKE3 of the rules file's text (part of the compile cache key: findings depend on it).
    pub digest: String,
}

/// Errors loading a rules file.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct RulesError {
    /// The file.
    pub file: String,
    /// What is wrong (rule id and regex error, or TOML error with line).
    pub message: String,
}

/// A rule pattern that is not a valid regex.
#[derive(Debug, thiserror::Error)]
#[error("`{pattern}`: {source}")]
pub struct PatternError {
    /// The pattern as written.
    pub pattern: String,
    /// The regex crate's error.
    pub source: regex::Error,
}

/// Compiles each pattern anchored at both ends (`^(?:p)$`).
///
/// # Errors
/// A pattern that does not compile, named with the regex error.
pub fn anchored(patterns: &[String]) -> Result<Vec<Regex>, PatternError> {
    patterns
        .iter()
        .map(|p| {
            Regex::new(&format!("^(?:{p})$")).map_err(|source| PatternError {
                pattern: p.clone(),
                source,
            })
        })
        .collect()
}

static INCLUDE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"(?m)^\s*#\s*include\s*[<"]([^>"]+)[>"]"#).expect("re"));

fn line_of(src: &str, offset: usize) -> u32 {
    src[..offset].bytes().filter(|&b| b == b'\n').count() as u32 + 1
}

impl Rules {
    /// The rules shipped with cudarl-pipe (`configs/harness/static_rules.toml`).
    pub fn builtin() -> Rules {
        static BUILTIN: LazyLock<Rules> = LazyLock::new(|| {
            Rules::parse(
                include_str!("../../../configs/harness/static_rules.toml"),
                "configs/harness/static_rules.toml",
            )
            .expect("built-in rules are valid")
        });
        BUILTIN.clone()
    }

    /// Parses a rules file.
    ///
    /// # Errors
    /// TOML errors, unknown keys, or a rule whose regex does not compile (naming its id).
    pub fn parse(text: &str, file: &str) -> Result<Rules, RulesError> {
        let raw: RawRules = toml::from_str(text).map_err(|e| RulesError {
            file: file.into(),
            message: e.to_string(),
        })?;
        let mut rules = Vec::new();
        for r in raw.rule {
            let re = Regex::new(&r.pattern).map_err(|e| RulesError {
                file: file.into(),
                message: format!("rule `{}`: bad pattern: {e}", r.id),
            })?;
            rules.push(Rule {
                id: r.id,
                message: r.message,
                re,
                formats: r.formats,
                action: r.action,
                strings: r.strings,
            });
        }
        let objects = ObjectRules::new(
            &raw.objects.native_symbols,
            &raw.objects.reserved_exports,
            &raw.objects.constructor,
        )
        .map_err(|m| RulesError {
            file: file.into(),
            message: format!("objects: bad pattern {m}"),
        })?;
        Ok(Rules {
            rules,
            includes: raw.includes,
            objects,
            python_allowlist: raw.python.allowlist,
            extension: ExtensionRules::new(
                &raw.extension_objects.torch_symbols,
                &raw.extension_objects.refused_symbols,
            )
            .map_err(|m| RulesError {
                file: file.into(),
                message: format!("extension_objects: bad pattern {m}"),
            })?,
            digest: blake3::hash(text.as_bytes()).to_hex().to_string(),
        })
    }

    /// What a built torch extension may import from torch.
    pub fn extension_rules(&self) -> &ExtensionRules {
        &self.extension
    }

    /// What a native candidate's host object may import and register.
    pub fn object_rules(&self) -> &ObjectRules {
        &self.objects
    }

    /// The headers a `format` candidate may include (`native`, or `native` plus `format`'s).
    pub fn allowed_includes(&self, format: &str) -> Vec<&str> {
        let mut allowed: Vec<&str> = self
            .includes
            .get("native")
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default();
        if format != "native"
            && let Some(v) = self.includes.get(format)
        {
            allowed.extend(v.iter().map(String::as_str));
        }
        allowed
    }

    /// Rule ids, in file order.
    pub fn ids(&self) -> Vec<&str> {
        self.rules.iter().map(|r| r.id.as_str()).collect()
    }

    /// Checks `source` of `format` (`native` or `torch`). Findings are in rule order; the
    /// include check comes first.
    pub fn check(&self, source: &str, format: &str) -> Vec<Finding> {
        let clean = cudarl_lex::c::strip_comments_and_strings(source);
        let mut out = Vec::new();
        let allowed = self.allowed_includes(format);
        for c in INCLUDE.captures_iter(&clean) {
            let name = c.get(1).expect("group").as_str().trim();
            if !allowed.contains(&name) {
                out.push(Finding {
                    rule: "include".into(),
                    action: Action::Reject,
                    line: line_of(&clean, c.get(0).expect("m").start()),
                    matched: format!("#include <{name}>"),
                    message: format!("header `{name}` is not on the {format} include allow-list"),
                });
            }
        }
        out.extend(self.check_text(source, format));
        out
    }

    /// The rules of `format` (not the include allow-list) on `text`: a source file, or the
    /// candidate's lines of a preprocessed text ([`crate::inspect::preprocessed`]).
    pub fn check_text(&self, text: &str, format: &str) -> Vec<Finding> {
        let clean = cudarl_lex::c::strip_comments_and_strings(text);
        let with_strings = cudarl_lex::c::strip_comments(text);
        let mut out = Vec::new();
        for r in &self.rules {
            if !r.formats.iter().any(|f| f == format) {
                continue;
            }
            let t = if r.strings { &with_strings } else { &clean };
            out.extend(r.find(t));
        }
        out
    }
}

impl Rule {
    /// The first match in `text`, as a finding.
    fn find(&self, text: &str) -> Option<Finding> {
        let m = self.re.find(text)?;
        let mut matched: String = m.as_str().split_whitespace().collect::<Vec<_>>().join(" ");
        matched.truncate(80);
        Some(Finding {
            rule: self.id.clone(),
            action: self.action,
            line: line_of(text, m.start()),
            matched,
            message: self.message.clone(),
        })
    }
}

impl Rules {
    /// Checks a Python (`ModelNew`) file with the rules of format `python`, on the source with
    /// comments and string literals blanked out ([`cudarl_lex::python::strip_comments_and_strings`]).
    pub fn check_python(&self, source: &str) -> Vec<Finding> {
        let clean = cudarl_lex::python::strip_comments_and_strings(source);
        self.rules
            .iter()
            .filter(|r| r.formats.iter().any(|f| f == "python"))
            .filter_map(|r| r.find(&clean))
            .collect()
    }
}

/// Whether any finding rejects the candidate.
pub fn rejected(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.action == Action::Reject)
}
/// What an object may import, which names it may not define, and which constructor it may have
/// (applied by [`crate::inspect`]).
#[derive(Debug, Clone)]
pub struct ObjectRules {
    symbols: Vec<Regex>,
    reserved: Vec<Regex>,
    pub(crate) constructor: String,
}

impl ObjectRules {
    /// From anchored patterns of the symbols an object may import, anchored patterns of the C
    /// names it may not define (besides those it may import), and the name of nvcc's
    /// registration constructor.
    ///
    /// # Errors
    /// A pattern is not a valid regex.
    pub fn new(
        patterns: &[String],
        reserved: &[String],
        constructor: &str,
    ) -> Result<ObjectRules, PatternError> {
        Ok(ObjectRules {
            symbols: anchored(patterns)?,
            reserved: anchored(reserved)?,
            constructor: constructor.into(),
        })
    }

    pub(crate) fn allows(&self, sym: &str) -> bool {
        self.symbols.iter().any(|r| r.is_match(sym))
    }

    pub(crate) fn reserves(&self, sym: &str) -> bool {
        self.reserved.iter().any(|r| r.is_match(sym))
    }
}

/// What a built extension may import from torch, and what it may never import (applied by
/// [`crate::extension_object::check`]).
#[derive(Debug, Clone)]
pub struct ExtensionRules {
    pub(crate) torch: Vec<Regex>,
    pub(crate) refused: Vec<Regex>,
}

impl ExtensionRules {
    /// From anchored patterns over qualified names (`at::_ops::zeros::call`) of the torch
    /// names allowed, and over raw or qualified names of those always refused.
    ///
    /// # Errors
    /// A pattern that does not compile (the message names it).
    pub fn new(torch: &[String], refused: &[String]) -> Result<Self, PatternError> {
        Ok(ExtensionRules {
            torch: anchored(torch)?,
            refused: anchored(refused)?,
        })
    }
}
