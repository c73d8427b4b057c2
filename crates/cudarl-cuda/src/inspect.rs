//! Checks on what was built, not only on what was written: the candidate's preprocessed text,
//! its host object and its PTX, read after nvcc ran (`-c --keep`), before the shared object is
//! linked. Macros, token pasting, line splices, digraphs and `__has_include` are resolved by the
//! preprocessor itself, and what the object imports or registers is read from the ELF file, so
//! spelling tricks that fool a regex over the source do not fool these checks.
//!
//! - [`preprocessed`]: the source rules ([`crate::Rules`]) on the lines of the preprocessed
//!   host and device texts that come from the candidate's own file (linemarkers say which), and
//!   every header the candidate's file includes, resolved to its path, against the include
//!   allow-list.
//! - [`object()`]: the host object's undefined symbols against the allow-list
//!   (`[objects] native_symbols` in `configs/harness/static_rules.toml`), no constructors or
//!   destructors beyond nvcc's own registration (`.init_array` entries,
//!   `.preinit_array`/`.fini_array`/`.ctors`/`.dtors`/`.init`/`.fini` sections), no `IFUNC`
//!   symbols (resolvers run at load time), and no `syscall`, `sysenter`, `int 0x80`, `rdtsc` or
//!   `rdtscp` in the host code (decoded with `iced-x86`).
//! - [`ptx`]: no reads of the `%globaltimer`/`%clock`/`%clock64` special registers.
//!
//! The findings use the rule ids `include`, the source rules' ids, `object-symbol`,
//! `object-constructor`, `object-ifunc`, `object-instruction` and `device-timer`; all reject.

use std::sync::LazyLock;

use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionKind};
use regex::Regex;

use crate::static_check::{Action, Finding, Rules};

/// The candidate's file name inside the build directory (linemarkers name it).
pub const SOURCE_NAME: &str = "kernel.cu";

fn reject(rule: &str, line: u32, matched: String, message: String) -> Finding {
    let mut matched = matched;
    matched.truncate(80);
    Finding {
        rule: rule.into(),
        action: Action::Reject,
        line,
        matched,
        message,
    }
}

static LINEMARKER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^#\s*(\d+)\s+"((?:[^"\\]|\\.)*)"((?:\s+\d+)*)\s*$"#).expect("re")
});

/// The lines of a preprocessed text that come from `file`, each with its line number in that
/// file, and every file `file` includes directly (its path as the preprocessor opened it, and
/// the line of the `#include`).
pub struct Split {
    /// `(line in the candidate's file, text)`.
    pub lines: Vec<(u32, String)>,
    /// `(path, line of the include)`.
    pub includes: Vec<(String, u32)>,
}

/// Splits preprocessor output (`# <line> "<file>" <flags>` linemarkers, GCC's format) into the
/// candidate's own lines and its direct includes.
pub fn split(pp: &str, file: &str) -> Split {
    let mut lines = Vec::new();
    let mut includes = Vec::new();
    let mut current = String::new();
    let mut next_line = 1u32;
    // The include stack: the file we are in and the line to return to.
    let mut stack: Vec<(String, u32)> = Vec::new();
    for l in pp.lines() {
        if let Some(c) = LINEMARKER.captures(l) {
            let n: u32 = c[1].parse().unwrap_or(1);
            let f = c[2].replace("\\\\", "\\").replace("\\\"", "\"");
            let flags: Vec<&str> = c[3].split_whitespace().collect();
            if flags.contains(&"1") {
                // Entering an include from `current` at its line `next_line - 1`.
                if current == file {
                    includes.push((f.clone(), next_line.saturating_sub(1).max(1)));
                }
                stack.push((current.clone(), next_line));
            } else if flags.contains(&"2") {
                stack.pop();
            }
            current = f;
            next_line = n;
            continue;
        }
        if current == file {
            lines.push((next_line, l.to_string()));
        }
        next_line = next_line.saturating_add(1);
    }
    Split { lines, includes }
}

/// Whether `path` (as the preprocessor opened it) is an allowed header: it ends with
/// `/<name>` for a name on the allow-list of `format`, and lies under one of `roots` (the
/// toolkit's and the host compiler's system include directories).
fn allowed_header(rules: &Rules, format: &str, path: &str, roots: &[String]) -> bool {
    let under_root = roots.iter().any(|r| path.starts_with(r.as_str()));
    under_root
        && rules
            .allowed_includes(format)
            .iter()
            .any(|name| path.ends_with(&format!("/{name}")))
}

/// The source rules of `format` and the include allow-list on the candidate's lines of
/// preprocessed texts (host and device passes; each rule reported once, at its first match).
/// `roots` are the system include directories a header may come from.
pub fn preprocessed(rules: &Rules, texts: &[&str], format: &str, roots: &[String]) -> Vec<Finding> {
    let mut out: Vec<Finding> = Vec::new();
    for text in texts {
        let s = split(text, SOURCE_NAME);
        for (path, line) in &s.includes {
            if path == SOURCE_NAME || out.iter().any(|f| f.rule == "include" && f.line == *line) {
                continue;
            }
            if !allowed_header(rules, format, path, roots) {
                let name = path.rsplit('/').next().unwrap_or(path);
                out.push(reject(
                    "include",
                    *line,
                    format!("#include <{name}>"),
                    format!(
                        "includes `{name}`, which is not on the {format} include allow-list (after the preprocessor resolved it)"
                    ),
                ));
            }
        }
        // One text per candidate line, so findings name the candidate's own line numbers.
        let mut body = String::new();
        let mut numbers = Vec::new();
        for (n, l) in &s.lines {
            body.push_str(l);
            body.push('\n');
            numbers.push(*n);
        }
        for mut f in rules.check_text(&body, format) {
            if out.iter().any(|g| g.rule == f.rule) {
                continue;
            }
            f.line = numbers
                .get(f.line.saturating_sub(1) as usize)
                .copied()
                .unwrap_or(f.line);
            f.message = format!("{} (after preprocessing)", f.message);
            out.push(f);
        }
    }
    out
}

/// Reads `%globaltimer`, `%clock` or `%clock64` in PTX (timer reads inside the kernel).
pub fn ptx(text: &str) -> Vec<Finding> {
    static TIMER: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"%(globaltimer(?:_lo|_hi)?|clock64|clock(?:_hi)?)\b").expect("re")
    });
    TIMER
        .find(text)
        .map(|m| {
            reject(
                "device-timer",
                0,
                m.as_str().into(),
                format!(
                    "the kernel reads the GPU clock ({}); timing is the harness's, not the kernel's",
                    m.as_str()
                ),
            )
        })
        .into_iter()
        .collect()
}

/// What an object may import and which constructor it may have.
#[derive(Debug, Clone)]
pub struct ObjectRules {
    symbols: Vec<Regex>,
    constructor: String,
}

impl ObjectRules {
    /// From anchored symbol patterns and the name of nvcc's registration constructor.
    ///
    /// # Errors
    /// A pattern is not a valid regex.
    pub fn new(patterns: &[String], constructor: &str) -> Result<ObjectRules, String> {
        let symbols = patterns
            .iter()
            .map(|p| Regex::new(&format!("^(?:{p})$")).map_err(|e| format!("`{p}`: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(ObjectRules {
            symbols,
            constructor: constructor.into(),
        })
    }

    fn allows(&self, sym: &str) -> bool {
        self.symbols.iter().any(|r| r.is_match(sym))
    }
}

/// The launcher the generated shim calls: undefined when the candidate does not define it,
/// which the link reports as a missing launcher (not a forbidden import).
pub const LAUNCHER: &str = "launch";

/// Checks a compiled host object (an ELF relocatable file; see the module docs).
///
/// # Errors
/// The bytes are not an object file `object` can read.
pub fn object(bytes: &[u8], rules: &ObjectRules) -> Result<Vec<Finding>, String> {
    let file = object::File::parse(bytes).map_err(|e| format!("object file: {e}"))?;
    let mut out = Vec::new();
    let mut bad: Vec<String> = file
        .symbols()
        .filter(|s| s.is_undefined())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .filter(|n| !n.is_empty() && n != LAUNCHER && !rules.allows(n))
        .collect();
    bad.sort();
    bad.dedup();
    if !bad.is_empty() {
        out.push(reject(
            "object-symbol",
            0,
            bad.join(" "),
            format!(
                "the host code calls {}, which a kernel launcher has no use for (allowed: CUDA launches, memsets/copies on the stream, attributes and occupancy queries, libm, printf)",
                bad.iter().map(|b| format!("`{b}`")).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    for s in file.symbols() {
        if let object::SymbolFlags::Elf { st_info, .. } = s.flags()
            && st_info.st_type() == object::elf::STT_GNU_IFUNC
        {
            out.push(reject(
                "object-ifunc",
                0,
                s.name().unwrap_or("?").into(),
                "defines an IFUNC symbol (its resolver runs when the library is loaded)".into(),
            ));
            break;
        }
    }
    for sec in file.sections() {
        let name = sec.name().unwrap_or("");
        match name {
            ".preinit_array" | ".fini_array" | ".ctors" | ".dtors" | ".init" | ".fini" => {
                out.push(reject(
                    "object-constructor",
                    0,
                    name.into(),
                    format!("has a `{name}` section: code that runs at load or unload"),
                ));
            }
            ".init_array" => {
                let targets = init_targets(&file, &sec);
                if targets.iter().any(|t| t != &rules.constructor) || targets.len() > 1 {
                    out.push(reject(
                        "object-constructor",
                        0,
                        targets.join(" "),
                        "has constructors beyond nvcc's registration (`__attribute__((constructor))`, a global with a dynamic initializer): code that runs at load".into(),
                    ));
                }
            }
            _ => {}
        }
        if sec.kind() == SectionKind::Text
            && let Ok(data) = sec.data()
            && let Some(f) = host_instructions(data, sec.address())
        {
            out.push(f);
        }
    }
    Ok(out)
}

/// The function names `.init_array`'s relocations point at (section-relative targets resolved
/// to the symbol defined at that offset).
fn init_targets<'d>(file: &object::File<'d>, sec: &object::Section<'d, '_>) -> Vec<String> {
    let mut out = Vec::new();
    for (_, rel) in sec.relocations() {
        let RelocationTarget::Symbol(i) = rel.target() else {
            out.push("?".into());
            continue;
        };
        let Ok(sym) = file.symbol_by_index(i) else {
            out.push("?".into());
            continue;
        };
        let name = sym.name().unwrap_or("");
        if sym.kind() == object::SymbolKind::Section {
            let at = sym.address().wrapping_add(rel.addend() as u64);
            let found = file.symbols().find(|s| {
                s.section_index() == sym.section_index()
                    && s.kind() == object::SymbolKind::Text
                    && s.address() == at
            });
            out.push(found.and_then(|s| s.name().ok()).unwrap_or("?").to_string());
        } else {
            out.push(name.to_string());
        }
    }
    out
}

/// The first system-call or timer instruction in x86-64 code, as a finding.
fn host_instructions(code: &[u8], ip: u64) -> Option<Finding> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};
    let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    for ins in &mut d {
        let what = match ins.mnemonic() {
            Mnemonic::Syscall => "syscall",
            Mnemonic::Sysenter => "sysenter",
            Mnemonic::Int if ins.immediate8() == 0x80 => "int 0x80",
            Mnemonic::Rdtsc => "rdtsc",
            Mnemonic::Rdtscp => "rdtscp",
            _ => continue,
        };
        return Some(reject(
            "object-instruction",
            0,
            what.into(),
            format!(
                "the host code contains a `{what}` instruction (a raw system call or clock read)"
            ),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_the_candidates_lines_with_their_numbers() {
        let pp = "# 1 \"kernel.cu\"\n# 1 \"<built-in>\" 1\n# 1 \"kernel.cu\" 2\n# 1 \"/usr/include/stdio.h\" 1 3 4\nint printf(const char*, ...);\n# 3 \"kernel.cu\" 2\nint x = 1;\n\nvoid f() { system(\"ls\"); }\n";
        let s = split(pp, "kernel.cu");
        assert_eq!(
            s.includes,
            vec![
                ("<built-in>".to_string(), 1),
                ("/usr/include/stdio.h".to_string(), 1)
            ]
        );
        let text: Vec<(u32, &str)> = s.lines.iter().map(|(n, l)| (*n, l.as_str())).collect();
        assert_eq!(
            text,
            vec![
                (3, "int x = 1;"),
                (4, ""),
                (5, "void f() { system(\"ls\"); }")
            ]
        );
    }

    #[test]
    fn host_instruction_decoding_finds_raw_syscalls_and_rdtsc() {
        // mov eax, 59; syscall
        assert_eq!(
            host_instructions(&[0xb8, 0x3b, 0, 0, 0, 0x0f, 0x05], 0)
                .unwrap()
                .matched,
            "syscall"
        );
        assert_eq!(
            host_instructions(&[0x0f, 0x31], 0).unwrap().matched,
            "rdtsc"
        );
        assert_eq!(
            host_instructions(&[0xcd, 0x80], 0).unwrap().matched,
            "int 0x80"
        );
        // push rbp; mov rbp, rsp; ret
        assert!(host_instructions(&[0x55, 0x48, 0x89, 0xe5, 0xc3], 0).is_none());
    }

    #[test]
    fn ptx_timer_reads_are_found() {
        assert_eq!(ptx("mov.u64 %rd1, %globaltimer;").len(), 1);
        assert_eq!(ptx("mov.u32 %r1, %clock;")[0].matched, "%clock");
        assert!(ptx("mov.u32 %r1, %tid.x; // clocks").is_empty());
    }
}
