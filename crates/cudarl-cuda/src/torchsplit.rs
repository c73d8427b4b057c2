//! Two translation units for a torch extension, as `torch.utils.cpp_extension.load_inline` lays
//! them out: the CUDA sources with `torch/types.h` (ATen and the tensor factories; no Python,
//! no pybind11, no C++ frontend modules) and a binding file with `torch/extension.h` that holds
//! the `PYBIND11_MODULE` block and declarations of the functions it binds. The two compile in
//! parallel ([`crate::compile::Compiler::compile_torch_ext`]) and are linked into one module.
//!
//! pybind11 and Python's headers make up most of what nvcc's device front end (cicc) and
//! cudafe++ parse in a one-unit build: the CUDA unit with `torch/types.h` alone costs about a
//! third of the one-unit build, and the binding file is compiled by the host compiler only.
//! `cudarl-pipe bench torch-build` measures the whole build: 28.5 s against 51.9 s for one unit,
//! median over five archive kernels on a 16-core host (`benchmarks/results/
//! torch_build_h200_2026-11-29.json`).
//!
//! A split is only proposed where the source allows it: a CUDA source that uses Python,
//! pybind11 or a C++ frontend module outside `torch/types.h` ([`needs_full_headers`]) is built
//! as one unit, and the compiler falls back to one unit whenever either split unit fails to
//! compile, so a verdict never depends on the split.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::static_check::{IDENT, matching_brace, strip_c_comments_and_strings};

/// The two units of a split torch-extension build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TorchSplit {
    /// The CUDA unit (`cuda.cu`): `torch/types.h` and the CUDA runtime headers, then the
    /// candidate's CUDA source with any `#include <torch/extension.h>` as `torch/types.h`.
    pub cuda: String,
    /// The binding unit (`bind.cpp`): `torch/extension.h`, declarations (or the `load_inline`
    /// call's `cpp_sources`) and the `PYBIND11_MODULE` block.
    pub bind: String,
}

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
    NEEDS_FULL.is_match(&strip_c_comments_and_strings(cuda))
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
    })
}

/// The split of a SakanaAI-style extension (one `.cu` with `PYBIND11_MODULE`): the source
/// without the module block as the CUDA unit, and the block with a declaration of every
/// top-level function it names as the binding unit. `None` when there is no single module
/// block, the rest needs the full headers, or a bound function is not found at top level with
/// external linkage (then the extension is built as one unit).
pub fn split_extension(source: &str) -> Option<TorchSplit> {
    let stripped = strip_c_comments_and_strings(source);
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
    crate::native_abi::top_level_spans(&strip_c_comments_and_strings(src))
        .into_iter()
        .filter(|f| {
            !excluded
                .iter()
                .any(|x| f.ret.split_whitespace().any(|w| w == *x))
        })
        .map(|f| (f.name, format!("{};", f.head)))
        .collect()
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
}
