//! Parsing of nvcc output: diagnostics (`file(line): error: ...` from the CUDA front end,
//! `file:line:col: error: ...` from the host compiler, `ptxas error : ...`, linker errors) and
//! `-Xptxas -v` resource reports (registers, shared memory, stack frame, spills per kernel).

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// One compiler diagnostic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Source file as nvcc printed it (`kernel.cu` is the candidate).
    pub file: Option<String>,
    /// 1-based line in that file.
    pub line: Option<u32>,
    /// `error`, `warning` or `fatal`.
    pub severity: String,
    /// The message (first line).
    pub message: String,
    /// Which tool reported it: `cudafe` (CUDA front end), `host` (gcc), `ptxas`, `nvlink`, `ld`.
    pub tool: String,
}

/// Resources of one kernel from `-Xptxas -v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct KernelResources {
    /// Mangled kernel name.
    pub kernel: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub shared_mem_bytes: u32,
    /// Stack frame per thread, bytes.
    pub stack_frame_bytes: u32,
    /// Register spill stores per thread, bytes.
    pub spill_store_bytes: u32,
    /// Register spill loads per thread, bytes.
    pub spill_load_bytes: u32,
    /// Named barriers used.
    pub barriers: u32,
}

static EDG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?P<file>[^\s:()]+)\((?P<line>\d+)\): (?P<sev>error|warning|catastrophic error|remark)(?: #[\w-]+)?: (?P<msg>.*)$").expect("re")
});
static HOST: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?P<file>[^\s:]+):(?P<line>\d+):(?:\d+:)? (?P<sev>error|warning|fatal error): (?P<msg>.*)$").expect("re")
});
static TOOL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?P<tool>ptxas|nvlink|fatbinary)\s+(?P<sev>error|fatal|warning)\s*: (?P<msg>.*)$")
        .expect("re")
});
static LD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(?:/\S*/)?ld(?:\.\w+)?: (?P<msg>.*)$").expect("re"));
static ENTRY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"ptxas info\s*: Compiling entry function '(?P<k>[^']+)'").expect("re")
});
static PROPS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"ptxas info\s*: Function properties for (?P<k>\S+)").expect("re"));
static FRAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?P<stack>\d+) bytes stack frame, (?P<ss>\d+) bytes spill stores, (?P<sl>\d+) bytes spill loads").expect("re")
});
static USED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"ptxas info\s*: Used (?P<r>\d+) registers(?P<rest>.*)$").expect("re")
});
static BARRIERS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"used (?P<b>\d+) barriers").expect("re"));
static SMEM: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?P<s>\d+) bytes smem").expect("re"));

/// Longest mangled name [`demangle`] reads, bytes (names come from candidates' objects and from
/// kernel lists a runner reports).
const DEMANGLE_MAX: usize = 4096;

/// A C++ symbol's readable name from its mangled one (`_Z15vector_add_vec4PKfS0_Pfl` ->
/// `vector_add_vec4(float const*, float const*, float*, long)`), else the name as given: also
/// for a name longer than `DEMANGLE_MAX` bytes and where the demangler panics.
pub fn demangle(name: &str) -> String {
    if name.len() > DEMANGLE_MAX {
        return name.to_string();
    }
    std::panic::catch_unwind(|| {
        cpp_demangle::Symbol::new(name.as_bytes())
            .ok()
            .and_then(|s| s.demangle().ok())
    })
    .ok()
    .flatten()
    .unwrap_or_else(|| name.to_string())
}

/// Parses diagnostics from nvcc's combined output, in order.
pub fn parse_diagnostics(output: &str) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for line in output.lines() {
        let line = line.trim_end();
        if let Some(c) = EDG.captures(line) {
            let sev = match &c["sev"] {
                "catastrophic error" => "fatal",
                "remark" => continue,
                s => s,
            };
            out.push(Diagnostic {
                file: Some(c["file"].to_string()),
                line: c["line"].parse().ok(),
                severity: sev.to_string(),
                message: c["msg"].to_string(),
                tool: "cudafe".into(),
            });
        } else if let Some(c) = HOST.captures(line) {
            out.push(Diagnostic {
                file: Some(c["file"].to_string()),
                line: c["line"].parse().ok(),
                severity: if &c["sev"] == "fatal error" {
                    "fatal".into()
                } else {
                    c["sev"].to_string()
                },
                message: c["msg"].to_string(),
                tool: "host".into(),
            });
        } else if let Some(c) = TOOL.captures(line) {
            out.push(Diagnostic {
                file: None,
                line: None,
                severity: c["sev"].to_string(),
                message: c["msg"].trim().to_string(),
                tool: c["tool"].to_string(),
            });
        } else if line.contains("undefined reference to") {
            out.push(Diagnostic {
                file: None,
                line: None,
                severity: "error".into(),
                message: line.trim().to_string(),
                tool: "ld".into(),
            });
        } else if let Some(c) = LD.captures(line) {
            out.push(Diagnostic {
                file: None,
                line: None,
                severity: "error".into(),
                message: c["msg"].to_string(),
                tool: "ld".into(),
            });
        }
    }
    out
}

/// Parses `-Xptxas -v` output into per-kernel resources (entry functions only), sorted by name.
pub fn parse_resources(output: &str) -> Vec<KernelResources> {
    let mut entries: Vec<KernelResources> = Vec::new();
    let mut current: Option<usize> = None;
    for line in output.lines() {
        if let Some(c) = ENTRY.captures(line) {
            let k = c["k"].to_string();
            current = Some(match entries.iter().position(|e| e.kernel == k) {
                Some(i) => i,
                None => {
                    entries.push(KernelResources {
                        kernel: k,
                        ..Default::default()
                    });
                    entries.len() - 1
                }
            });
        } else if let Some(c) = PROPS.captures(line) {
            current = entries.iter().position(|e| e.kernel == c["k"]);
        } else if let Some(c) = FRAME.captures(line) {
            if let Some(i) = current {
                entries[i].stack_frame_bytes = c["stack"].parse().unwrap_or(0);
                entries[i].spill_store_bytes = c["ss"].parse().unwrap_or(0);
                entries[i].spill_load_bytes = c["sl"].parse().unwrap_or(0);
            }
        } else if let Some(c) = USED.captures(line)
            && let Some(i) = current
        {
            entries[i].registers = c["r"].parse().unwrap_or(0);
            let rest = &c["rest"];
            if let Some(b) = BARRIERS.captures(rest) {
                entries[i].barriers = b["b"].parse().unwrap_or(0);
            }
            if let Some(s) = SMEM.captures(rest) {
                entries[i].shared_mem_bytes = s["s"].parse().unwrap_or(0);
            }
        }
    }
    entries.sort_by(|a, b| a.kernel.cmp(&b.kernel));
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnostics_of_each_tool() {
        let out = "kernel.cu(1): error: identifier \"x\" is undefined\n  int main( { x\n ^\n\
                   kernel.cu(7): warning #177-D: variable \"y\" was declared but never referenced\n\
                   kernel.cu:12:5: error: 'foo' was not declared in this scope\n\
                   ptxas error   : Entry function '_Z1kv' uses too much shared data (0x12000 bytes, 0xc000 max)\n\
                   /usr/bin/ld: kernel.o: undefined reference to `bar'\n";
        let d = parse_diagnostics(out);
        assert_eq!(d.len(), 5);
        assert_eq!(
            (d[0].line, d[0].severity.as_str(), d[0].tool.as_str()),
            (Some(1), "error", "cudafe")
        );
        assert_eq!(d[1].severity, "warning");
        assert_eq!((d[2].line, d[2].tool.as_str()), (Some(12), "host"));
        assert!(d[3].message.contains("too much shared data"));
        assert_eq!(d[4].tool, "ld");
    }

    #[test]
    fn ptxas_resources() {
        let out = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function '_Z3addPKfS0_Pfl' for 'sm_90'\n\
            ptxas info    : Function properties for _Z3addPKfS0_Pfl\n    \
            8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 380 bytes cmem[0]\n";
        let r = parse_resources(out);
        assert_eq!(
            r,
            vec![KernelResources {
                kernel: "_Z3addPKfS0_Pfl".into(),
                registers: 40,
                shared_mem_bytes: 4096,
                stack_frame_bytes: 8,
                spill_store_bytes: 4,
                spill_load_bytes: 12,
                barriers: 1,
            }]
        );
    }
}
