//! Why a node is stale: a diff of the stored preimage against the current one, one cause per
//! line (the model is cargo's fingerprint `DirtyReason`).

use std::collections::BTreeSet;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::key::{InputOrigin, Preimage};

/// One reason a node must (re-)run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum DirtyReason {
    /// No manifest of this node exists in the store.
    NeverRan,
    /// `--force` named this node.
    Forced,
    /// The stage kind wired to this node changed.
    StageChanged {
        /// Old kind.
        old: String,
        /// New kind.
        new: String,
    },
    /// The stage's code version changed.
    CodeVersionChanged {
        /// Old version.
        old: u32,
        /// New version.
        new: u32,
    },
    /// A param changed, appeared or disappeared (`path` is dotted, e.g. `fractions.train`).
    ParamChanged {
        /// Dotted path of the param.
        path: String,
        /// Old value (None: absent).
        old: Option<Value>,
        /// New value (None: absent).
        new: Option<Value>,
    },
    /// An input's content changed.
    InputChanged {
        /// Input name.
        name: String,
        /// Old hash (short).
        old: String,
        /// New hash (short).
        new: String,
        /// Which external files changed, or which upstream output, in words.
        detail: String,
    },
    /// An input was added to or removed from the stage.
    InputSetChanged {
        /// Input name.
        name: String,
        /// Whether it was added (true) or removed (false).
        added: bool,
    },
    /// A declared environment entry changed.
    EnvChanged {
        /// Entry name (e.g. `nvcc`).
        name: String,
        /// Old value.
        old: Option<String>,
        /// New value.
        new: Option<String>,
    },
    /// An upstream node is not fresh, so this node's inputs are not known yet.
    UpstreamStale {
        /// The upstream node.
        node: String,
    },
    /// The manifest exists but a blob it names is gone (e.g. deleted by hand).
    OutputMissing {
        /// Output name.
        output: String,
    },
    /// The key format (encoding version) changed.
    KeyFormatChanged,
}

fn show(v: &Option<Value>) -> String {
    match v {
        None => "(absent)".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

impl fmt::Display for DirtyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirtyReason::NeverRan => write!(f, "never ran: no manifest in the store"),
            DirtyReason::Forced => write!(f, "forced with --force"),
            DirtyReason::StageChanged { old, new } => write!(f, "stage changed: {old} -> {new}"),
            DirtyReason::CodeVersionChanged { old, new } => {
                write!(f, "code version changed: {old} -> {new}")
            }
            DirtyReason::ParamChanged { path, old, new } => {
                write!(f, "params changed: {path} {} -> {}", show(old), show(new))
            }
            DirtyReason::InputChanged {
                name,
                old,
                new,
                detail,
            } => write!(f, "input `{name}` changed ({old} -> {new}): {detail}"),
            DirtyReason::InputSetChanged { name, added } => {
                if *added {
                    write!(f, "input `{name}` added")
                } else {
                    write!(f, "input `{name}` removed")
                }
            }
            DirtyReason::EnvChanged { name, old, new } => write!(
                f,
                "environment changed: {name} {} -> {}",
                old.as_deref().unwrap_or("(absent)"),
                new.as_deref().unwrap_or("(absent)")
            ),
            DirtyReason::UpstreamStale { node } => {
                write!(f, "upstream `{node}` is not fresh; its outputs may change")
            }
            DirtyReason::OutputMissing { output } => {
                write!(f, "output `{output}` is missing from the store")
            }
            DirtyReason::KeyFormatChanged => write!(f, "cache key format changed"),
        }
    }
}

fn diff_values(path: &str, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<DirtyReason>) {
    match (old, new) {
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                diff_values(&p, a.get(k), b.get(k), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(DirtyReason::ParamChanged {
            path: if path.is_empty() {
                "(all)".into()
            } else {
                path.to_string()
            },
            old: a.cloned(),
            new: b.cloned(),
        }),
    }
}

/// The causes that turn preimage `old` into `new`, in a stable order. Empty if equal.
pub fn diff_preimages(old: &Preimage, new: &Preimage) -> Vec<DirtyReason> {
    let mut out = Vec::new();
    if old.format != new.format {
        out.push(DirtyReason::KeyFormatChanged);
    }
    if old.stage != new.stage {
        out.push(DirtyReason::StageChanged {
            old: old.stage.clone(),
            new: new.stage.clone(),
        });
    }
    if old.code_version != new.code_version {
        out.push(DirtyReason::CodeVersionChanged {
            old: old.code_version,
            new: new.code_version,
        });
    }
    diff_values("", Some(&old.params), Some(&new.params), &mut out);
    let names: BTreeSet<&String> = old.inputs.keys().chain(new.inputs.keys()).collect();
    for name in names {
        match (old.inputs.get(name), new.inputs.get(name)) {
            (Some(a), Some(b)) if a.hash != b.hash || a.origin != b.origin => {
                out.push(DirtyReason::InputChanged {
                    name: name.clone(),
                    old: a.hash.short(12),
                    new: b.hash.short(12),
                    detail: describe_input_change(&a.origin, &b.origin),
                });
            }
            (Some(_), Some(_)) => {}
            (None, Some(_)) => out.push(DirtyReason::InputSetChanged {
                name: name.clone(),
                added: true,
            }),
            (Some(_), None) => out.push(DirtyReason::InputSetChanged {
                name: name.clone(),
                added: false,
            }),
            (None, None) => unreachable!(),
        }
    }
    let env_names: BTreeSet<&String> = old.env.keys().chain(new.env.keys()).collect();
    for name in env_names {
        let (a, b) = (old.env.get(name), new.env.get(name));
        if a != b {
            out.push(DirtyReason::EnvChanged {
                name: name.clone(),
                old: a.cloned(),
                new: b.cloned(),
            });
        }
    }
    out
}

fn describe_input_change(old: &InputOrigin, new: &InputOrigin) -> String {
    match (old, new) {
        (
            InputOrigin::External {
                source: s1,
                files: f1,
            },
            InputOrigin::External {
                source: s2,
                files: f2,
            },
        ) => {
            let mut parts = Vec::new();
            if s1 != s2 {
                parts.push(format!("source {s1} -> {s2}"));
            }
            let names: BTreeSet<&String> = f1.keys().chain(f2.keys()).collect();
            let mut changed = Vec::new();
            for n in names {
                match (f1.get(n), f2.get(n)) {
                    (Some(a), Some(b)) if a != b => {
                        changed.push(format!("file {n} content changed"))
                    }
                    (None, Some(_)) => changed.push(format!("file {n} added")),
                    (Some(_), None) => changed.push(format!("file {n} removed")),
                    _ => {}
                }
            }
            let n = changed.len();
            parts.extend(changed.into_iter().take(5));
            if n > 5 {
                parts.push(format!("and {} more files", n - 5));
            }
            if parts.is_empty() {
                "external files changed".into()
            } else {
                parts.join(", ")
            }
        }
        (
            InputOrigin::Node { node, output },
            InputOrigin::Node {
                node: n2,
                output: o2,
            },
        ) if node == n2 && output == o2 => {
            format!("output `{output}` of upstream `{node}` has new content")
        }
        (_, InputOrigin::Node { node, output }) => format!("now wired to `{node}.{output}`"),
        (_, InputOrigin::External { source, .. }) => format!("now read from {source}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{InputFingerprint, KEY_FORMAT};
    use cudarl_store::Digest;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn pre(seed: i64, file: &[u8]) -> Preimage {
        let mut files = BTreeMap::new();
        files.insert("problems.parquet".into(), Digest::of_bytes(file));
        let mut inputs = BTreeMap::new();
        inputs.insert(
            "source".into(),
            InputFingerprint::external("bundled", files),
        );
        Preimage {
            format: KEY_FORMAT,
            stage: "curriculum".into(),
            code_version: 1,
            params: json!({"seed": seed, "split": {"train": 0.8}}),
            inputs,
            env: BTreeMap::new(),
        }
    }

    #[test]
    fn names_each_cause() {
        let a = pre(0, b"x");
        assert!(diff_preimages(&a, &a).is_empty());
        let b = pre(7, b"x");
        let d = diff_preimages(&a, &b);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].to_string(), "params changed: seed 0 -> 7");
        let c = pre(0, b"y");
        let d = diff_preimages(&a, &c);
        assert_eq!(d.len(), 1);
        assert!(
            d[0].to_string()
                .contains("file problems.parquet content changed"),
            "{}",
            d[0]
        );
        let mut e = pre(0, b"x");
        e.code_version = 2;
        e.env.insert("nvcc".into(), "13.0".into());
        let d: Vec<String> = diff_preimages(&a, &e)
            .iter()
            .map(|r| r.to_string())
            .collect();
        assert_eq!(
            d,
            vec![
                "code version changed: 1 -> 2".to_string(),
                "environment changed: nvcc (absent) -> 13.0".to_string()
            ]
        );
    }
}
