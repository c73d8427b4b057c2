//! Translation units for a torch extension, compiled in parallel
//! ([`crate::compile::Compiler::compile_torch_ext`]) and linked into one module.
//!
//! - The kernel/host layout ([`kernel_host_split`]), tried first: the device code in a CUDA
//!   unit without torch's headers, and the host code with the binding block in a host unit
//!   compiled with a precompiled torch header ([`HOST_PCH_HEADER`]); launches go through a
//!   trampoline defined beside each kernel. `cudarl-pipe bench torch-build`: 7.5 s against
//!   61.4 s for one unit, median over six archive kernels on a 16-core host, the header
//!   (29 s) built once beforehand (`benchmarks/results/torch_build_kernel_host_h200_2026-11-29.json`).
//! - The layout of `torch.utils.cpp_extension.load_inline` ([`split_extension`],
//!   [`split_inline`]): the CUDA sources with `torch/types.h` (ATen and the tensor factories;
//!   no Python, no pybind11, no C++ frontend modules) and a binding file with
//!   `torch/extension.h` that holds the `PYBIND11_MODULE` block and declarations of the
//!   functions it binds: 28.5 s against 51.9 s for one unit
//!   (`benchmarks/results/torch_build_h200_2026-11-29.json`).
//!
//! A split is only proposed where the source allows it: a CUDA source that uses Python,
//! pybind11 or a C++ frontend module outside `torch/types.h` ([`needs_full_headers`]) is built
//! as one unit, and the compiler falls back to one unit whenever a split unit fails to
//! compile, so a verdict never depends on the split.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::native_abi::split_top_level;
use cudarl_lex::c::{self, IDENT, matching_brace, matching_paren};

/// The two units of a split torch-extension build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TorchSplit {
    /// The CUDA unit (`cuda.cu`): `torch/types.h` and the CUDA runtime headers, then the
    /// candidate's CUDA source with any `#include <torch/extension.h>` as `torch/types.h`.
    pub cuda: String,
    /// The binding unit (`bind.cpp`): `torch/extension.h`, declarations (or the `load_inline`
    /// call's `cpp_sources`) and the `PYBIND11_MODULE` block.
    pub bind: String,
    /// The faster kernel/host layout of the same extension where the source allows it
    /// ([`kernel_host_split`]); tried first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_host: Option<KernelHostSplit>,
}

/// A torch extension as a torch-free CUDA unit and a host unit that includes torch through a
/// precompiled header ([`HOST_PCH_HEADER`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelHostSplit {
    /// `kernels.cu`: `cuda.h`, `cuda_runtime.h`, the source's preprocessor lines other than
    /// torch's and Python's includes, its device code (kernels, `__device__` functions and
    /// variables), the declarations both sides share, and one launch trampoline per kernel
    /// (`cudarl_launch_<kernel>(dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
    /// <the kernel's parameters>)`).
    pub kernels: String,
    /// `host.cpp`: the host functions with each `kernel<<<g, b[, s[, t]]>>>(args)` replaced by
    /// a call of its trampoline, the shared declarations, the `load_inline` call's C++
    /// sources and the `PYBIND11_MODULE` block; `torch/extension.h` left to the precompiled
    /// header, `TORCH_EXTENSION_NAME` defined by the compiler before it.
    pub host: String,
}

/// The header the host unit of a [`KernelHostSplit`] is compiled with, precompiled once per
/// torch installation and flags: everything of `torch/extension.h` a host unit may use
/// (ATen and the tensor factories, pybind11 with torch's type casters) without the C++
/// frontend modules, plus the CUDA stream, guard and error-check headers extensions include.
pub const HOST_PCH_HEADER: &str = "#include <torch/types.h>\n#include <torch/python.h>\n\
#include <ATen/cuda/CUDAContext.h>\n#include <c10/cuda/CUDAGuard.h>\n\
#include <c10/cuda/CUDAException.h>\n#include <cuda_runtime.h>\n";

/// What a CUDA unit may not use to be built with `torch/types.h` instead of `torch/extension.h`:
/// Python and pybind11, and the C++ frontend namespaces and headers `torch/all.h` adds.
static NEEDS_FULL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"\b(?:py|pybind11)::|\bPYBIND11_|\bPy[A-Z]\w*|",
        r"\btorch::(?:nn|optim|jit|data|serialize|autograd|python|cuda|fft|linalg|special|",
        r"nested|sparse|utils|NoGradGuard|AutoGradMode|InferenceMode|manual_seed|",
        r"set_num_threads|get_num_threads|enable_grad|xpu|mps|stable)\b|",
        r#"#\s*include\s*[<"](?:torch/(?:all|python|script|nn|optim|torch|jit|autograd)\.h|Python\.h|pybind11/)"#,
    ))
    .expect("re")
});

static EXTENSION_INCLUDE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?m)^[ \t]*#[ \t]*include[ \t]*[<"]torch/extension\.h[>"]"#).expect("re")
});

static MODULE_START: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\bPYBIND11_MODULE\s*\(").expect("re"));

/// Whether `cuda` (a CUDA source) uses Python, pybind11 or a C++ frontend module that
/// `torch/types.h` does not declare, so it must be built with `torch/extension.h`.
pub fn needs_full_headers(cuda: &str) -> bool {
    NEEDS_FULL.is_match(&c::strip_comments_and_strings(cuda))
}

/// The CUDA unit of `cuda`: torch's `load_inline` prologue (`torch/types.h`, `cuda.h`,
/// `cuda_runtime.h`) and the source with `torch/extension.h` included as `torch/types.h`;
/// `None` when the source needs the full headers ([`needs_full_headers`]).
fn cuda_unit(cuda: &str) -> Option<String> {
    if needs_full_headers(cuda) {
        return None;
    }
    let body = EXTENSION_INCLUDE.replace_all(cuda, "#include <torch/types.h>");
    Some(format!(
        "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n{body}"
    ))
}

/// The split of a `load_inline` call: its CUDA sources, and its C++ sources (declarations of
/// the bound functions, as `load_inline` requires) with the generated `PYBIND11_MODULE` block
/// `module_block`. `None` when the CUDA sources need the full headers.
pub fn split_inline(cuda: &str, cpp: &str, module_block: &str) -> Option<TorchSplit> {
    Some(TorchSplit {
        cuda: cuda_unit(cuda)?,
        bind: format!("#include <torch/extension.h>\n{cpp}\n{module_block}"),
        kernel_host: kernel_host_split(cuda, cpp, module_block),
    })
}

/// The split of a SakanaAI-style extension (one `.cu` with `PYBIND11_MODULE`): the source
/// without the module block as the CUDA unit, and the block with a declaration of every
/// top-level function it names as the binding unit. `None` when there is no single module
/// block, the rest needs the full headers, or a bound function is not found at top level with
/// external linkage (then the extension is built as one unit).
pub fn split_extension(source: &str) -> Option<TorchSplit> {
    let stripped = c::strip_comments_and_strings(source);
    let mut starts = MODULE_START.find_iter(&stripped);
    let m = starts.next()?;
    if starts.next().is_some() {
        return None;
    }
    let open = m.start() + stripped[m.start()..].find('{')?;
    let close = matching_brace(&stripped, open)?;
    let block = &source[m.start()..=close];
    let rest = format!("{}{}", &source[..m.start()], &source[close + 1..]);
    let cuda = cuda_unit(&rest)?;
    let used: std::collections::BTreeSet<&str> = IDENT
        .find_iter(&stripped[m.start()..=close])
        .map(|i| i.as_str())
        .collect();
    let mut decls = String::new();
    let mut declared = 0usize;
    for (name, decl) in top_level_functions(&rest) {
        if used.contains(name.as_str()) {
            decls.push_str(&decl);
            decls.push('\n');
            declared += 1;
        }
    }
    if declared == 0 {
        return None;
    }
    Some(TorchSplit {
        cuda,
        bind: format!("#include <torch/extension.h>\n{decls}\n{block}\n"),
        kernel_host: kernel_host_split(&rest, "", block),
    })
}

/// Host functions defined at namespace scope of `src` with external linkage, as (name,
/// declaration `ret name(args);`); `__global__`/`__device__`, `static`, `inline` and template
/// functions are left out (they cannot be declared from another unit).
fn top_level_functions(src: &str) -> Vec<(String, String)> {
    let excluded = [
        "__global__",
        "__device__",
        "static",
        "inline",
        "template",
        "constexpr",
        "extern",
        "__forceinline__",
    ];
    crate::native_abi::top_level_spans(&c::strip_comments_and_strings(src))
        .into_iter()
        .filter(|f| {
            !excluded
                .iter()
                .any(|x| f.ret.split_whitespace().any(|w| w == *x))
        })
        .map(|f| (f.name, format!("{};", f.head)))
        .collect()
}

/// One item at namespace scope of a source: a preprocessor line (with its continuations), a
/// function definition, or anything else up to its `;` (declarations, `struct` definitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ItemKind {
    Pre,
    Function { open: usize },
    Other,
}

#[derive(Debug, Clone, Copy)]
struct Item {
    kind: ItemKind,
    start: usize,
    end: usize,
}

/// The items at namespace scope of `stripped` (comments and literals blanked), in order;
/// `None` for what is not split: a `namespace` or `extern` block, an unclosed brace, a
/// preprocessor line inside an item, trailing text.
fn top_level_items(stripped: &str) -> Option<Vec<Item>> {
    let b = stripped.as_bytes();
    let mut items = Vec::new();
    let mut start: Option<usize> = None;
    let mut i = 0usize;
    let line_start = |i: usize| {
        stripped[..i]
            .rsplit('\n')
            .next()
            .is_none_or(|l| l.trim().is_empty())
    };
    while i < b.len() {
        let c = b[i];
        if start.is_none() {
            if c.is_ascii_whitespace() {
                i += 1;
                continue;
            }
            if c == b'#' {
                let mut end = i;
                loop {
                    end = stripped[end..].find('\n').map_or(b.len(), |e| end + e);
                    if end < b.len() && stripped[..end].trim_end_matches('\r').ends_with('\\') {
                        end += 1;
                        continue;
                    }
                    break;
                }
                items.push(Item {
                    kind: ItemKind::Pre,
                    start: i,
                    end,
                });
                i = end;
                continue;
            }
            start = Some(i);
        }
        let s0 = start.unwrap_or(i);
        match c {
            b'#' if line_start(i) => return None,
            b'{' => {
                let close = matching_brace(stripped, i)?;
                let head = stripped[s0..i].trim();
                let first = head.split_whitespace().next().unwrap_or("");
                let is_fn = head.ends_with(')')
                    && !head.contains('=')
                    && !["struct", "class", "union", "enum", "typedef", "namespace"]
                        .contains(&first);
                // `extern "C" void f(...) {` is a function; `extern "C" {` a block.
                if first == "namespace" || (first == "extern" && !is_fn) {
                    return None;
                }
                if is_fn {
                    items.push(Item {
                        kind: ItemKind::Function { open: i },
                        start: s0,
                        end: close + 1,
                    });
                    start = None;
                }
                i = close + 1;
                continue;
            }
            b';' => {
                items.push(Item {
                    kind: ItemKind::Other,
                    start: s0,
                    end: i + 1,
                });
                start = None;
            }
            _ => {}
        }
        i += 1;
    }
    if start.is_some() { None } else { Some(items) }
}

/// The name of the function whose head is `head` (the identifier before its last
/// parenthesized group) and the text of its parameters.
fn fn_name_and_params(head: &str) -> Option<(&str, &str)> {
    let head = head.trim_end();
    let close = head.len().checked_sub(1)?;
    let mut depth = 0i64;
    let mut open = None;
    for (k, ch) in head.char_indices().rev() {
        match ch {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    open = Some(k);
                    break;
                }
            }
            _ => {}
        }
    }
    let open = open?;
    let before = head[..open].trim_end();
    let name_start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |k| k + 1);
    let name = &before[name_start..];
    (!name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()))
        .then_some((name, &head[open + 1..close]))
}

/// The parameters of a kernel as (declaration without a default value, name); `None` when
/// one has no name or is an array or function pointer.
fn kernel_params(params: &str) -> Option<Vec<(String, String)>> {
    let params = params.trim();
    if params.is_empty() || params == "void" {
        return Some(vec![]);
    }
    split_top_level(params, b',', true)
        .into_iter()
        .map(|p| {
            let p = p.split('=').next().unwrap_or(p).trim();
            if p.contains(['[', '(']) {
                return None;
            }
            let words: Vec<&str> = IDENT.find_iter(p).map(|m| m.as_str()).collect();
            let name = *words.last()?;
            (words.len() >= 2 && p.ends_with(name)).then(|| (p.to_string(), name.to_string()))
        })
        .collect()
}

/// Torch, ATen, c10 or Python named in a declaration: it belongs to the host unit.
static TORCH_NAMES: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b(?:torch|at|c10|caffe2|pybind11|py)::|\bTensor\b|\b(?:TORCH|AT|C10)_[A-Z_]+\b")
        .expect("re")
});

/// An include of torch's, ATen's, c10's, pybind11's or Python's headers.
static TORCH_INCLUDE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^\s*#\s*include\s*[<"](?:torch/|ATen/|c10/|THC/|pybind11/|Python\.h)"#)
        .expect("re")
});

/// Storage classes of device variables.
static DEVICE_VAR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b(?:__device__|__constant__|__shared__|__managed__)\b").expect("re")
});

fn words(s: &str) -> std::collections::BTreeSet<&str> {
    IDENT.find_iter(s).map(|m| m.as_str()).collect()
}

/// The kernel/host layout of an extension whose CUDA source (without its `PYBIND11_MODULE`
/// block) is `src`, whose `load_inline` C++ sources are `cpp` (empty for a `.cu` extension)
/// and whose binding block is `module_block` ([`KernelHostSplit`]). Device code compiles
/// without torch's headers (the one-unit build parses them in both of nvcc's passes) and the
/// host code with a precompiled header, so a build costs the kernels' own compile time plus
/// the host compiler's.
///
/// `None` (the extension is built as [`TorchSplit`]'s two units) where the layout is not
/// certain to mean the same program: template kernels, a kernel named other than in a
/// `<<<>>>` launch on the host (`cudaFuncSetAttribute`, `cudaLaunchKernel`), device
/// variables the host names (`cudaMemcpyToSymbol`), host functions device code calls,
/// non-inline `__host__ __device__` functions, `namespace`/`extern` blocks, C++ frontend
/// modules, or kernel parameters without a name. A unit that does not compile falls back the
/// same way at build time ([`crate::compile::Compiler::compile_torch_ext`]).
pub fn kernel_host_split(src: &str, cpp: &str, module_block: &str) -> Option<KernelHostSplit> {
    if needs_full_headers(src) || needs_full_headers(cpp) {
        return None;
    }
    let stripped = c::strip_comments_and_strings(src);
    let items = top_level_items(&stripped)?;
    let Sides {
        sides,
        kernels,
        device_vars,
        host_fns,
    } = classify_items(&stripped, &items)?;
    if kernels.is_empty() {
        return None;
    }
    let device_words: std::collections::BTreeSet<&str> = items
        .iter()
        .zip(&sides)
        .filter(|(it, s)| **s == Side::Kernels && it.kind != ItemKind::Pre)
        .flat_map(|(it, _)| words(&stripped[it.start..it.end]))
        .collect();
    if host_fns
        .iter()
        .any(|(_, n)| device_words.contains(n.as_str()))
    {
        return None;
    }
    let (kern, mut host) = emit_units(src, &stripped, &items, &sides, &kernels)?;
    let host_stripped = c::strip_comments_and_strings(&host);
    let host_words = words(&host_stripped);
    if kernels.keys().any(|k| host_words.contains(k.as_str()))
        || device_vars.iter().any(|v| host_words.contains(v.as_str()))
    {
        return None;
    }
    host.push_str(&EXTENSION_INCLUDE.replace_all(cpp, ""));
    host.push('\n');
    host.push_str(module_block);
    host.push('\n');
    Some(KernelHostSplit {
        kernels: kern,
        host,
    })
}

/// The unit a top-level item goes to in a [`kernel_host_split`].
#[derive(PartialEq)]
enum Side {
    Both,
    Kernels,
    Host,
}

/// Kernel name -> (its parameters as declared, the parameters' names).
type KernelDecls = std::collections::BTreeMap<String, (String, Vec<String>)>;

/// The top-level items of an extension sorted by unit ([`classify_items`]).
struct Sides {
    /// Each item's unit, in the items' order.
    sides: Vec<Side>,
    /// The kernels defined.
    kernels: KernelDecls,
    /// The device variables declared.
    device_vars: Vec<String>,
    /// The host functions defined: (item index, name).
    host_fns: Vec<(usize, String)>,
}

/// The unit of each of `items` (of `stripped`, comments and literals blanked), with the
/// kernels, device variables and host functions found; `None` where the split is not certain
/// (see [`kernel_host_split`]).
fn classify_items(stripped: &str, items: &[Item]) -> Option<Sides> {
    let mut s = Sides {
        sides: Vec::with_capacity(items.len()),
        kernels: Default::default(),
        device_vars: Vec::new(),
        host_fns: Vec::new(),
    };
    for (k, it) in items.iter().enumerate() {
        let text = &stripped[it.start..it.end];
        let side = match it.kind {
            ItemKind::Pre if TORCH_INCLUDE.is_match(text) => Side::Host,
            ItemKind::Pre => Side::Both,
            ItemKind::Function { open } => function_side(
                &stripped[it.start..open],
                k,
                &mut s.kernels,
                &mut s.host_fns,
            )?,
            ItemKind::Other => {
                let w = words(text);
                if w.contains("__global__") {
                    if w.contains("template") {
                        return None;
                    }
                    Side::Kernels
                } else if DEVICE_VAR.is_match(text) {
                    let decl = text.split(['=', '[', ';']).next().unwrap_or(text);
                    s.device_vars
                        .push(IDENT.find_iter(decl).last()?.as_str().to_string());
                    Side::Kernels
                } else if TORCH_NAMES.is_match(text) {
                    Side::Host
                } else {
                    Side::Both
                }
            }
        };
        s.sides.push(side);
    }
    Some(s)
}

/// The unit of function `k` with head `head`: a kernel (recorded in `kernels`), device code, a
/// host function (recorded in `host_fns`) or an inline `__host__ __device__` function for
/// both; `None` for a template kernel, a non-inline `__host__ __device__` function or a head
/// that does not parse.
fn function_side(
    head: &str,
    k: usize,
    kernels: &mut KernelDecls,
    host_fns: &mut Vec<(usize, String)>,
) -> Option<Side> {
    let w = words(head);
    let (name, params) = fn_name_and_params(head)?;
    Some(if w.contains("__global__") {
        if w.contains("template") {
            return None;
        }
        let ps = kernel_params(params)?;
        let decl = ps
            .iter()
            .map(|p| p.0.clone())
            .collect::<Vec<_>>()
            .join(", ");
        kernels.insert(
            name.to_string(),
            (decl, ps.into_iter().map(|p| p.1).collect()),
        );
        Side::Kernels
    } else if w.contains("__device__") && w.contains("__host__") {
        if ![
            "inline",
            "static",
            "__forceinline__",
            "template",
            "constexpr",
        ]
        .iter()
        .any(|q| w.contains(q))
        {
            return None;
        }
        Side::Both
    } else if w.contains("__device__") {
        Side::Kernels
    } else {
        host_fns.push((k, name.to_string()));
        Side::Host
    })
}

/// The kernel unit and the host unit (without the C++ sources and the module block) of `src`
/// (`stripped`: comments and literals blanked) with its `items` on their `sides`: each kernel
/// followed by its `cudarl_launch_<kernel>` trampoline, declared on the host where the kernel
/// is first declared or defined, and the host's launches rewritten to call it; `None` for a
/// launch [`rewrite_launches`] cannot rewrite.
fn emit_units(
    src: &str,
    stripped: &str,
    items: &[Item],
    sides: &[Side],
    kernels: &KernelDecls,
) -> Option<(String, String)> {
    let mut kern = String::from("#include <cuda.h>\n#include <cuda_runtime.h>\n");
    let mut host = String::from("#include <cuda_runtime.h>\n");
    let mut declared = std::collections::BTreeSet::new();
    for (it, side) in items.iter().zip(sides) {
        let text = &src[it.start..it.end];
        if *side != Side::Host {
            kern.push_str(text);
            kern.push('\n');
        }
        if *side != Side::Kernels {
            if it.kind == ItemKind::Pre && EXTENSION_INCLUDE.is_match(text) {
                continue;
            }
            let body = if matches!(it.kind, ItemKind::Function { .. }) {
                rewrite_launches(text, &stripped[it.start..it.end], kernels)?
            } else {
                text.to_string()
            };
            host.push_str(&body);
            host.push('\n');
        }
        // Each kernel's trampoline: defined after the kernel, declared on the host where the
        // kernel is first declared or defined.
        let head = match it.kind {
            ItemKind::Function { open } => &stripped[it.start..open],
            _ => stripped[it.start..it.end].trim_end().trim_end_matches(';'),
        };
        if *side == Side::Kernels
            && let Some((name, _)) = fn_name_and_params(head)
            && let Some((decl, names)) = kernels.get(name)
        {
            let sig = format!(
                "void cudarl_launch_{name}(dim3 cudarl_grid, dim3 cudarl_block, size_t cudarl_shmem, cudaStream_t cudarl_stream{}{decl})",
                if decl.is_empty() { "" } else { ", " }
            );
            if matches!(it.kind, ItemKind::Function { .. }) {
                kern.push_str(&format!(
                    "{sig} {{ {name}<<<cudarl_grid, cudarl_block, cudarl_shmem, cudarl_stream>>>({}); }}\n",
                    names.join(", ")
                ));
            }
            if declared.insert(name.to_string()) {
                host.push_str(&format!("{sig};\n"));
            }
        }
    }
    Some((kern, host))
}

/// `text` (a host function; `stripped` the same bytes with comments and literals blanked)
/// with every `kernel<<<grid, block[, shmem[, stream]]>>>(args)` of a kernel in `kernels`
/// replaced by `cudarl_launch_kernel(grid, block, shmem, stream, args)` (`0` for what the
/// launch leaves out); `None` for a launch of anything else (a template kernel, a
/// function pointer) or one that does not parse.
fn rewrite_launches(
    text: &str,
    stripped: &str,
    kernels: &std::collections::BTreeMap<String, (String, Vec<String>)>,
) -> Option<String> {
    let mut out = String::new();
    let mut at = 0usize;
    while let Some(rel) = stripped[at..].find("<<<") {
        let lt = at + rel;
        let before = stripped[..lt].trim_end();
        let name_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |k| k + 1);
        let name = &before[name_start..];
        if !kernels.contains_key(name) {
            return None;
        }
        let gt = lt + 3 + stripped[lt + 3..].find(">>>")?;
        let config = &text[lt + 3..gt];
        let config: Vec<&str> = if config.trim().is_empty() {
            vec![]
        } else {
            split_top_level(config, b',', false)
        };
        if config.is_empty() || config.len() > 4 {
            return None;
        }
        let after = gt + 3;
        let open = after + stripped[after..].find(|c: char| !c.is_whitespace())?;
        if stripped.as_bytes()[open] != b'(' {
            return None;
        }
        let close = matching_paren(stripped, open)?;
        let args = text[open + 1..close].trim();
        let mut cfg: Vec<String> = config.iter().map(|c| c.trim().to_string()).collect();
        cfg.resize(4, "0".into());
        out.push_str(&text[at..name_start]);
        out.push_str(&format!(
            "cudarl_launch_{name}({}{}{args})",
            cfg.join(", "),
            if args.is_empty() { "" } else { ", " }
        ));
        at = close + 1;
    }
    out.push_str(&text[at..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXT: &str = r#"#include <torch/extension.h>
#define TILE 32
// forward(a) { a comment with a brace
__global__ void k(const float* a, float* b, int n) { if (threadIdx.x < n) b[0] = a[0]; }
static int helper(int x) { return x; }
torch::Tensor forward(torch::Tensor a,
                      torch::Tensor b) {
    auto c = torch::empty_like(a);
    k<<<1, 32>>>(a.data_ptr<float>(), c.data_ptr<float>(), helper(1));
    return c;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("forward", &forward, "forward {with braces}");
}
"#;

    #[test]
    fn an_extension_splits_into_a_types_h_unit_and_a_binding_with_declarations() {
        let s = split_extension(EXT).expect("splits");
        assert!(s.cuda.starts_with("#include <torch/types.h>"));
        assert!(!s.cuda.contains("torch/extension.h") && !s.cuda.contains("PYBIND11_MODULE"));
        assert!(s.cuda.contains("torch::Tensor forward(torch::Tensor a,"));
        assert!(s.bind.contains("#include <torch/extension.h>"));
        assert!(
            s.bind.contains(
                "torch::Tensor forward(torch::Tensor a,\n                      torch::Tensor b);"
            ),
            "{}",
            s.bind
        );
        assert!(
            s.bind
                .contains("m.def(\"forward\", &forward, \"forward {with braces}\");")
        );
        assert!(!s.bind.contains("helper") && !s.bind.contains("__global__"));
    }

    #[test]
    fn sources_that_need_python_or_the_frontend_stay_one_unit() {
        let py = EXT.replace("return c;", "py::print(\"x\"); return c;");
        assert!(split_extension(&py).is_none());
        let nn = EXT.replace("return c;", "return torch::nn::functional::relu(c);");
        assert!(split_extension(&nn).is_none());
        // Only a comment names them: still split.
        let comment = EXT.replace("return c;", "return c; // not py::print");
        assert!(split_extension(&comment).is_some());
        // A bound function defined in a namespace is not found: one unit.
        let ns = EXT
            .replace(
                "torch::Tensor forward(",
                "namespace x { torch::Tensor forward(",
            )
            .replace("PYBIND11", "}\nPYBIND11")
            .replace("&forward", "&x::forward");
        assert!(split_extension(&ns).is_none());
        assert!(split_inline("#include <pybind11/pybind11.h>\n", "", "").is_none());
    }

    #[test]
    fn an_inline_call_keeps_its_cpp_sources_in_the_binding() {
        let s = split_inline(
            "#include <torch/extension.h>\n__global__ void k() {}\n",
            "torch::Tensor f(torch::Tensor a);",
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}",
        )
        .unwrap();
        assert_eq!(s.cuda.matches("#include <torch/types.h>").count(), 2);
        assert!(!s.cuda.contains("extension.h"));
        assert!(
            s.bind
                .contains("torch::Tensor f(torch::Tensor a);\nPYBIND11_MODULE")
        );
    }

    #[test]
    fn an_extension_splits_into_torch_free_kernels_and_a_host_unit_with_trampolines() {
        let kh = split_extension(EXT)
            .and_then(|s| s.kernel_host)
            .expect("kernel/host");
        // Kernels: no torch, the kernel as written and its trampoline.
        assert!(
            !kh.kernels.contains("torch") && !kh.kernels.contains("PYBIND11"),
            "{}",
            kh.kernels
        );
        assert!(kh.kernels.contains("#define TILE 32"));
        assert!(
            kh.kernels
                .contains("__global__ void k(const float* a, float* b, int n) {")
        );
        assert!(kh.kernels.contains(
            "void cudarl_launch_k(dim3 cudarl_grid, dim3 cudarl_block, size_t cudarl_shmem, cudaStream_t cudarl_stream, const float* a, float* b, int n) { k<<<cudarl_grid, cudarl_block, cudarl_shmem, cudarl_stream>>>(a, b, n); }"
        ), "{}", kh.kernels);
        assert!(!kh.kernels.contains("helper") && !kh.kernels.contains("forward"));
        // Host: the launch calls the trampoline (shared memory and stream default to 0), the
        // binding block stays, no kernel body and no torch/extension.h (the precompiled header).
        assert!(
            kh.host.contains(
                "cudarl_launch_k(1, 32, 0, 0, a.data_ptr<float>(), c.data_ptr<float>(), helper(1));"
            ),
            "{}",
            kh.host
        );
        assert!(kh.host.contains("void cudarl_launch_k(dim3 cudarl_grid"));
        assert!(!kh.host.contains("<<<") && !kh.host.contains("__global__"));
        assert!(!kh.host.contains("torch/extension.h"));
        assert!(kh.host.contains("static int helper(int x)"));
        assert!(
            kh.host
                .contains("m.def(\"forward\", &forward, \"forward {with braces}\");")
        );
    }

    #[test]
    fn launches_keep_their_shared_memory_and_stream_and_forward_declarations_place_trampolines() {
        let src = r#"#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
struct Params { float scale; int n; };
__device__ __constant__ float table[4];
__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, Params p);
template <typename T> __device__ T twice(T v) { return v + v; }
torch::Tensor forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    Params p{2.0f, (int)x.numel()};
    scale_kernel<<<dim3((p.n + 255) / 256, 1), 256, 8 * sizeof(float),
        at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), p);
    return y;
}
__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, Params p) {
    extern __shared__ float s[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) y[i] = twice(x[i]) * p.scale + table[0];
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
"#;
        let kh = split_extension(src)
            .and_then(|s| s.kernel_host)
            .expect("kernel/host");
        let decl = "void cudarl_launch_scale_kernel(dim3 cudarl_grid";
        // Declared on the host where the kernel is first declared: before `forward`.
        assert!(kh.host.find(decl).unwrap() < kh.host.find("torch::Tensor forward").unwrap());
        assert_eq!(kh.host.matches(decl).count(), 1);
        assert!(kh.host.contains(
            "cudarl_launch_scale_kernel(dim3((p.n + 255) / 256, 1), 256, 8 * sizeof(float), at::cuda::getCurrentCUDAStream(), x.data_ptr<float>(), y.data_ptr<float>(), p);"
        ), "{}", kh.host);
        // The struct is on both sides, the device variable and template only with the kernels.
        assert!(kh.host.contains("struct Params") && kh.kernels.contains("struct Params"));
        assert!(kh.kernels.contains("__constant__ float table[4]") && !kh.host.contains("table"));
        assert!(kh.kernels.contains("twice(T v)") && !kh.host.contains("twice"));
        assert!(!kh.kernels.contains("ATen") && kh.host.contains("ATen/cuda/CUDAContext.h"));
    }

    #[test]
    fn sources_the_kernel_host_layout_could_change_keep_the_two_unit_split() {
        let kh = |src: &str| split_extension(src).and_then(|s| s.kernel_host);
        assert!(kh(EXT).is_some());
        // A template kernel (its instantiations are chosen on the host).
        let t = EXT
            .replace(
                "__global__ void k(",
                "template <typename T> __global__ void k(",
            )
            .replace("k<<<", "k<float><<<");
        assert!(split_extension(&t).is_some() && kh(&t).is_none());
        // The kernel named outside a launch.
        let attr = EXT.replace(
            "auto c =",
            "cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 0); auto c =",
        );
        assert!(kh(&attr).is_none());
        // A device variable the host writes.
        let sym = EXT
            .replace(
                "#define TILE 32",
                "#define TILE 32\n__constant__ float w[2];",
            )
            .replace(
                "auto c =",
                "cudaMemcpyToSymbol(w, a.data_ptr<float>(), 8); auto c =",
            );
        assert!(kh(&sym).is_none());
        // A host function device code uses (constexpr with --expt-relaxed-constexpr).
        let cx = EXT
            .replace("static int helper", "constexpr int helper")
            .replace("b[0] = a[0];", "b[0] = a[helper(0)];");
        assert!(kh(&cx).is_none());
        // A non-inline __host__ __device__ function would be defined twice.
        let hd = EXT.replace(
            "static int helper(int x)",
            "__host__ __device__ int hd(int x) { return x; }\nstatic int helper(int x)",
        );
        assert!(kh(&hd).is_none());
        let hd_inline = hd.replace("__host__ __device__ int", "__host__ __device__ inline int");
        let s = kh(&hd_inline).expect("inline __host__ __device__ goes to both units");
        assert!(s.kernels.contains("inline int hd") && s.host.contains("inline int hd"));
        // An `extern "C"` host function is a host function; an `extern "C"` block is not split.
        let ec = EXT.replace("torch::Tensor forward(", "extern \"C\" void launch(const float* a, float* b, int n) { k<<<1, 32>>>(a, b, n); }\ntorch::Tensor forward(");
        let s = kh(&ec).expect("extern \"C\" function");
        assert!(s.host.contains("extern \"C\" void launch(const float* a, float* b, int n) { cudarl_launch_k(1, 32, 0, 0, a, b, n); }"), "{}", s.host);
        assert!(
            kh(&EXT.replace(
                "static int helper(int x) { return x; }",
                "extern \"C\" { static int helper(int x) { return x; } }"
            ))
            .is_none()
        );
        // A kernel parameter without a name.
        let unnamed = EXT.replace("int n) {", "int) {");
        assert!(kh(&unnamed).is_none());
    }

    #[test]
    fn an_inline_call_puts_its_cpp_sources_on_the_host() {
        let s = split_inline(
            "__global__ void k(float* x) { x[0] = 1.0f; }\ntorch::Tensor f(torch::Tensor a) { k<<<1, 1>>>(a.data_ptr<float>()); return a; }\n",
            "#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor a);",
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"f\", &f); }",
        )
        .unwrap();
        let kh = s.kernel_host.expect("kernel/host");
        assert!(
            kh.host
                .contains("cudarl_launch_k(1, 1, 0, 0, a.data_ptr<float>());")
        );
        assert!(
            kh.host
                .contains("torch::Tensor f(torch::Tensor a);\nPYBIND11_MODULE"),
            "{}",
            kh.host
        );
        assert!(!kh.host.contains("extension.h") && !kh.kernels.contains("torch"));
    }
}
