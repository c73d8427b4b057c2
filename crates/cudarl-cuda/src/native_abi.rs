//! Archive kernels put in the native ABI of a KernelBench problem, mechanically: a torch
//! extension (a SakanaAI-style `.cu` with a `PYBIND11_MODULE` block, or a Python file whose
//! `load_inline` call holds the CUDA source, as CUDA-L1 writes them) becomes the kernels it
//! defines plus the launcher `kb-specs` derived for the problem
//! (`extern "C" void launch(inputs..., params..., out, sizes..., cudaStream_t stream)`).
//!
//! The kernels and device code are kept as written. The bound host function's body becomes the
//! launcher's body: its tensor arguments become the launcher's pointers (inputs by position,
//! parameters by name, e.g. `conv_weight` for the state dict's `conv.weight`), the tensor it
//! allocates and returns becomes the output pointer, `x.size(i)`, `x.numel()`, `x.stride(i)` and
//! `x.dim()` become the problem's size names or literals, `x.data_ptr<float>()` the pointer,
//! torch's current stream the launcher's `stream` (every `<<<...>>>` launch runs on it), an
//! `AT_DISPATCH_*` over float becomes its body with `scalar_t = float`, and argument checks
//! (`TORCH_CHECK`, `CHECK_INPUT`, device guards, `.contiguous()`) go. Scalar arguments take the
//! problem's module constants (`scaling_factor = 0.5`). Anything else that needs torch at run
//! time (temporary tensors, `.options()`, ATen ops, several outputs) is not mechanical: the
//! conversion fails with the reason, and the kernel is left out.
//!
//! A conversion is not a verdict: the result is judged like any native candidate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::LazyLock;

use regex::{Captures, Regex};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::task::c_type;
use cudarl_lex::c::{self, IDENT, matching_brace, matching_paren};

/// Why a KernelBench problem's kernel has no native form: a `kb_specs` column that does not
/// parse, or a conversion that is not mechanical (no CUDA source, several bound functions, a
/// temporary tensor, an argument that matches no launcher buffer, torch left in the code), in
/// one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AbiError(pub String);

impl From<&str> for AbiError {
    fn from(m: &str) -> AbiError {
        AbiError(m.into())
    }
}

/// A buffer of a KernelBench problem's native ABI (`kb_specs.buffers_json`): a tensor (`dtype`)
/// or, for an input, a number (`scalar`, passed as `float`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KbBuffer {
    /// The launcher argument's name (`in0`, `weight`, `out`).
    pub name: String,
    /// Element type (`f32`, `f16`, `bf16`, `i64`, `i32`, `bool`) of a tensor.
    #[serde(default)]
    pub dtype: Option<String>,
    /// The problem's value of a number input.
    #[serde(default)]
    pub scalar: Option<String>,
    /// A tensor's dimensions: size names (the problem's constants) or literal extents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dims: Vec<Value>,
    /// A parameter's name in the reference's state dict (`conv.weight`; `name` is it with `.`
    /// as `_`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_name: Option<String>,
}

/// A KernelBench problem's native ABI, from its `kb-specs` row: `extern "C" void launch(...)`
/// taking the inputs (`const T*`, or `float` for a number), the `Model`'s parameters (its
/// state dict, `const T*`), the outputs (`T*`), the named sizes (`int64_t`, the problem's
/// constants at the test's sizes) and the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct KbNative {
    /// The launcher's declaration (`kb_specs.signature`).
    pub signature: String,
    /// Inputs, in `get_inputs()` order.
    pub inputs: Vec<KbBuffer>,
    /// Parameters, in state-dict order (names with `.` as `_`).
    pub params: Vec<KbBuffer>,
    /// Outputs, in `forward`'s order.
    pub outputs: Vec<KbBuffer>,
    /// Size names, in the signature's order.
    pub sizes: Vec<String>,
    /// The sizes' values at the problem's own sizes, in the same order.
    pub size_values: Vec<i64>,
}

impl KbNative {
    /// From a `kb_specs` row's `signature`, `buffers_json` and `sizes_json`.
    ///
    /// # Errors
    /// A JSON column that does not parse or lacks a list, naming it.
    pub fn from_row(
        signature: &str,
        buffers_json: &str,
        sizes_json: &str,
    ) -> Result<Self, AbiError> {
        let b: Value = serde_json::from_str(buffers_json)
            .map_err(|e| AbiError(format!("kb_specs.buffers_json: {e}")))?;
        let list = |k: &str| -> Result<Vec<KbBuffer>, AbiError> {
            serde_json::from_value(b[k].clone())
                .map_err(|e| AbiError(format!("kb_specs.buffers_json.{k}: {e}")))
        };
        let sizes: serde_json::Map<String, Value> = serde_json::from_str(sizes_json)
            .map_err(|e| AbiError(format!("kb_specs.sizes_json: {e}")))?;
        Ok(KbNative {
            signature: signature.to_string(),
            inputs: list("inputs")?,
            params: list("params")?,
            outputs: list("outputs")?,
            size_values: sizes.values().map(|v| v.as_i64().unwrap_or(0)).collect(),
            sizes: sizes.keys().cloned().collect(),
        })
    }

    /// A KernelBench `ModelNew` file running `source` (a native candidate defining this
    /// launcher) for problem `id`: the source and a binding built by
    /// `torch.utils.cpp_extension.load_inline` at import (as KernelBench's `ModelNew` files, and
    /// so the torch-format judge records the build), `forward(*inputs)` allocating the
    /// outputs and calling `launch` with the sizes read from the inputs' shapes (a size no input
    /// or parameter carries: the problem's value) on torch's current stream. A reference with
    /// parameters has them registered under its state-dict names, uninitialized: load them with
    /// `model_new.load_state_dict(model.state_dict())`. `note` opens the file's docstring.
    pub fn model_new(&self, id: &str, source: &str, note: &str) -> String {
        let call = self.launch_args(
            &|i| format!("(float)cudarl_s[{i}]"),
            &|i, ptr| format!("({ptr})cudarl_t[{i}].data_ptr()"),
            &|i| format!("cudarl_z[{i}]"),
            "at::cuda::getCurrentCUDAStream()",
        );
        let mut headers = self.half_headers();
        // Torch's headers go before the kernel (a kernel's `#define T 32` would break them), the
        // binding after it, its names prefixed so that the kernel's macros do not reach them.
        headers.push_str("#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n");
        let binding = format!(
            "void cudarl_run(std::vector<torch::Tensor> cudarl_t, std::vector<double> cudarl_s, \
             std::vector<int64_t> cudarl_z) {{\n    launch({});\n}}\n",
            call.join(", ")
        );
        let init = self.model_new_init();
        let fwd = self.model_new_forward();
        let args: Vec<String> = self.inputs.iter().map(py_input_var).collect();
        let tag = &blake3::hash(source.as_bytes()).to_hex()[..12];
        MODEL_NEW
            .replace("{note}", note)
            .replace("{id}", id)
            .replace("{tag}", tag)
            .replace("{init}", &init.join("\n"))
            .replace("{args}", &args.join(", "))
            .replace("{forward}", &fwd.join("\n"))
            .replace("{headers}", &py_str(&headers))
            .replace("{binding}", &py_str(&binding))
            // Last: nothing in the candidate's source is taken for a placeholder.
            .replace("{kernel}", &py_str(source))
    }

    /// The `ModelNew` `__init__` lines: the parameters, uninitialized, registered under the
    /// reference's state-dict names (with an empty `nn.Module` for each holder on the way).
    fn model_new_init(&self) -> Vec<String> {
        let mut init = Vec::new();
        let mut holders = std::collections::BTreeSet::new();
        for b in &self.params {
            let path = py_state_name(b);
            let parts: Vec<&str> = path.split('.').collect();
            let owner = |k: usize| {
                if k == 0 {
                    "self".to_string()
                } else {
                    format!("self.get_submodule({})", py_str(&parts[..k].join(".")))
                }
            };
            for k in 1..parts.len() {
                if holders.insert(parts[..k].join(".")) {
                    init.push(format!(
                        "        {}.add_module({}, nn.Module())",
                        owner(k - 1),
                        py_str(parts[k - 1])
                    ));
                }
            }
            init.push(format!(
                "        {}.register_parameter(\n            {}, nn.Parameter(torch.empty({}, dtype={}), requires_grad=False)\n        )",
                owner(parts.len() - 1),
                py_str(parts[parts.len() - 1]),
                self.py_shape(b, true),
                py_dtype(b.dtype.as_deref())
            ));
        }
        init
    }

    /// The `ModelNew` `forward` lines: the parameters, each size read from the first input or
    /// parameter that carries it (else the problem's value), the outputs allocated, one launch.
    fn model_new_forward(&self) -> Vec<String> {
        let mut fwd = Vec::new();
        for b in &self.params {
            fwd.push(format!(
                "        p_{} = self.get_parameter({}).detach()",
                b.name,
                py_str(&py_state_name(b))
            ));
        }
        let tensor_inputs: Vec<KbBuffer> = self
            .inputs
            .iter()
            .filter(|b| b.scalar.is_none())
            .cloned()
            .collect();
        for (n, v) in self.sizes.iter().zip(&self.size_values) {
            let carried = |bs: &[KbBuffer], var: &dyn Fn(&KbBuffer) -> String| {
                bs.iter().find_map(|b| {
                    let d = b.dims.iter().position(|d| d.as_str() == Some(n))?;
                    Some(format!("{}.shape[{d}]", var(b)))
                })
            };
            let read = carried(&tensor_inputs, &py_input_var)
                .or_else(|| carried(&self.params, &|b| format!("p_{}", b.name)))
                .unwrap_or_else(|| v.to_string());
            fwd.push(format!("        {} = {read}", py_size_var(n)));
        }
        let device = tensor_inputs
            .first()
            .map(|b| format!("{}.device", py_input_var(b)))
            .unwrap_or_else(|| "\"cuda\"".into());
        let mut tensors: Vec<String> = tensor_inputs
            .iter()
            .map(|b| format!("{}.contiguous()", py_input_var(b)))
            .collect();
        tensors.extend(
            self.params
                .iter()
                .map(|b| format!("p_{}.contiguous()", b.name)),
        );
        let outs: Vec<String> = (0..self.outputs.len()).map(|i| format!("out{i}")).collect();
        for (o, b) in outs.iter().zip(&self.outputs) {
            fwd.push(format!(
                "        {o} = torch.empty({}, dtype={}, device={device})",
                self.py_shape(b, false),
                py_dtype(b.dtype.as_deref())
            ));
        }
        tensors.extend(outs.iter().cloned());
        let scalars: Vec<String> = self
            .inputs
            .iter()
            .filter(|b| b.scalar.is_some())
            .map(py_input_var)
            .collect();
        let sizes: Vec<String> = self.sizes.iter().map(|n| py_size_var(n)).collect();
        fwd.push(format!(
            "        _EXT.cudarl_run(\n            [{}],\n            [{}],\n            [{}],\n        )",
            tensors.join(", "),
            scalars.join(", "),
            sizes.join(", ")
        ));
        fwd.push(format!(
            "        return {}",
            if outs.len() == 1 {
                outs[0].clone()
            } else {
                outs.join(", ")
            }
        ));
        fwd
    }

    /// A buffer's shape as a Python list: each dimension a size name (its local `n_<name>` in
    /// `forward`, its value when `at_init`) or a literal extent (kb-specs writes literal extents
    /// as strings, "1").
    fn py_shape(&self, b: &KbBuffer, at_init: bool) -> String {
        let dim = |d: &Value| -> String {
            match d.as_str() {
                Some(s) if s.parse::<i64>().is_ok() => s.to_string(),
                Some(s) if at_init => self
                    .sizes
                    .iter()
                    .position(|x| x == s)
                    .map_or(1, |i| self.size_values[i])
                    .to_string(),
                Some(s) => py_size_var(s),
                None => d.to_string(),
            }
        };
        let d: Vec<String> = b.dims.iter().map(dim).collect();
        format!("[{}]", d.join(", "))
    }

    /// The shim appended to a candidate ([`crate::task::entry_shim`]): `cudarl_entry` calls the
    /// launcher with the tensors (inputs, parameters, outputs) in `buffers`, the numbers in
    /// `scalars` and the sizes in `sizes`.
    pub fn shim(&self) -> String {
        let call = self.launch_args(
            &|i| format!("scalars[{i}]"),
            &|i, ptr| format!("({ptr})buffers[{i}]"),
            &|i| format!("sizes[{i}]"),
            "stream",
        );
        let headers = self.half_headers();
        crate::task::entry_shim(&headers, &self.signature, &call)
    }

    /// The launcher's arguments in order: each number input as `scalar(k)` (its k-th), each
    /// tensor as `tensor(k, "const float*")` (its k-th, with its pointer type), each size as
    /// `size(k)`, then `stream`.
    fn launch_args(
        &self,
        scalar: &dyn Fn(usize) -> String,
        tensor: &dyn Fn(usize, &str) -> String,
        size: &dyn Fn(usize) -> String,
        stream: &str,
    ) -> Vec<String> {
        let ty = |d: Option<&str>| d.and_then(crate::task::c_type).unwrap_or("float");
        let (mut bi, mut si, mut call) = (0, 0, Vec::new());
        for (b, konst) in self
            .inputs
            .iter()
            .chain(&self.params)
            .map(|b| (b, "const "))
            .chain(self.outputs.iter().map(|b| (b, "")))
        {
            if b.scalar.is_some() {
                call.push(scalar(si));
                si += 1;
            } else {
                call.push(tensor(bi, &format!("{konst}{}*", ty(b.dtype.as_deref()))));
                bi += 1;
            }
        }
        call.extend((0..self.sizes.len()).map(size));
        call.push(stream.to_string());
        call
    }

    /// The half-precision headers only where a buffer needs them: together they add about 0.4
    /// CPU seconds to a build.
    fn half_headers(&self) -> String {
        let mut headers = String::new();
        for (dtype, h) in [("f16", "cuda_fp16.h"), ("bf16", "cuda_bf16.h")] {
            if self.buffers().any(|b| b.dtype.as_deref() == Some(dtype)) {
                headers.push_str(&format!("#include <{h}>\n"));
            }
        }
        headers
    }

    /// Inputs, parameters and outputs, in the launcher's order.
    pub(crate) fn buffers(&self) -> impl Iterator<Item = &KbBuffer> {
        self.inputs.iter().chain(&self.params).chain(&self.outputs)
    }

    /// What the Python judge's runner needs to call the built launcher (`kind: native`).
    pub(crate) fn candidate(&self, so: &Path) -> Value {
        json!({"kind": "native", "so": so,
               "inputs": self.inputs, "params": self.params.iter().map(|b| &b.name).collect::<Vec<_>>(),
               "sizes": self.sizes})
    }
}

/// A Python string literal of `s` (JSON's escapes are Python's for these characters).
fn py_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The torch dtype (`torch.float16`...) of a buffer's element type (`f16`...; `f32` when absent
/// or unknown).
fn py_dtype(d: Option<&str>) -> &'static str {
    match d.unwrap_or("f32") {
        "f16" => "torch.float16",
        "bf16" => "torch.bfloat16",
        "i64" => "torch.int64",
        "i32" => "torch.int32",
        "bool" => "torch.bool",
        _ => "torch.float32",
    }
}

/// A buffer's name in the reference's state dict (`conv.weight`; its launcher name without one).
fn py_state_name(b: &KbBuffer) -> String {
    b.state_name.clone().unwrap_or_else(|| b.name.clone())
}

/// The `ModelNew` `forward` argument of an input (`x_<name>`, so that no name of the problem's
/// shadows another).
fn py_input_var(b: &KbBuffer) -> String {
    format!("x_{}", b.name)
}

/// The `ModelNew` `forward` local of a size (`n_<name>`).
fn py_size_var(n: &str) -> String {
    format!("n_{n}")
}

/// The `ModelNew` file of [`KbNative::model_new`]: `{note}`, `{id}`, `{tag}`, `{init}`,
/// `{args}`, `{forward}`, `{headers}`, `{binding}` and `{kernel}` are filled in that order (the
/// kernel last, so nothing in it is taken for a placeholder). It passes the `ModelNew`
/// allow-list (`python/cudarl_screen.py`): straight-line code, parameters registered and read by
/// name, sizes from shapes, outputs from `torch.empty`.
const MODEL_NEW: &str = r#""""{note}

ModelNew for {id}: the native kernel in KERNEL, built with load_inline at import and called
through its launcher `launch`. Sizes come from the inputs' shapes. Parameters are registered
under the reference's state-dict names, uninitialized: load them with
model_new.load_state_dict(model.state_dict()).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

HEADERS = {headers}
KERNEL = {kernel}
BINDING = {binding}

# Built at import, as KernelBench's ModelNew files are.
_EXT = load_inline(
    name="cudarl_{tag}",
    cpp_sources="void cudarl_run(std::vector<torch::Tensor> t, std::vector<double> s, std::vector<int64_t> z);",
    cuda_sources=HEADERS + KERNEL + "\n" + BINDING,
    functions=["cudarl_run"],
)


class ModelNew(nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()
{init}

    def forward(self, {args}):
{forward}
"#;

/// The conversion's version: stages that store conversions key on it (raise it when a source
/// converts differently).
pub const VERSION: u32 = 1;

fn re(s: &str) -> Regex {
    Regex::new(s).expect("static regex")
}

static MODULE: LazyLock<Regex> = LazyLock::new(|| re(r"\bPYBIND11_MODULE\s*\("));
static DEF: LazyLock<Regex> =
    LazyLock::new(|| re(r#"\.def\s*\(\s*"[^"]*"\s*,\s*&?\s*(?:[A-Za-z_]\w*::)*([A-Za-z_]\w*)"#));
static TORCH_INCLUDE: LazyLock<Regex> = LazyLock::new(|| {
    re(r#"(?m)^[ \t]*#[ \t]*include[ \t]*[<"](?:torch|ATen|c10|pybind11)/[^>"]*[>"][^\n]*\n?"#)
});
static DEFINE: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?m)^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[^\n]*(?:\\\n[^\n]*)*\n?"));
static TORCHY: LazyLock<Regex> = LazyLock::new(|| {
    re(r"\b(?:torch|at|c10|py|pybind11)::|\bTensor\b|\bTORCH_\w*|\bAT_\w*|\bC10_\w*|\bPYBIND11_\w*")
});
static HEAD: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?s)^\s*(?P<ret>[A-Za-z_][\w:<>,\s\*&]*?[\s\*&])(?P<name>[A-Za-z_]\w*)\s*\((?P<args>.*)\)\s*$",
    )
});
static SCALAR_TYPE: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"^(?:const\s+)?(?:int|int64_t|int32_t|long|long long|unsigned|size_t|float|double|bool)\s*&?$",
    )
});
static DISPATCH: LazyLock<Regex> = LazyLock::new(|| re(r"\bAT_DISPATCH_\w+\s*\("));
static DROP: LazyLock<Regex> = LazyLock::new(|| {
    re(concat!(
        r"^(?:TORCH_CHECK\w*|TORCH_INTERNAL_ASSERT\w*|TORCH_WARN\w*|AT_ASSERT\w*|AT_ERROR|",
        r"C10_CUDA_CHECK|C10_CUDA_KERNEL_LAUNCH_CHECK|AT_CUDA_CHECK|CHECK_\w+)\s*\(|",
        r"^(?:const\s+)?(?:at|c10)::(?:cuda::)?(?:OptionalCUDAGuard|CUDAGuard|DeviceGuard)\b|",
        r"^(?:at|c10)::(?:cuda::)?(?:OptionalCUDAGuard|CUDAGuard|DeviceGuard)\b"
    ))
});
static ALLOC: LazyLock<Regex> = LazyLock::new(|| {
    re(concat!(
        r"^(?:auto|(?:torch|at)::Tensor)\s+([A-Za-z_]\w*)\s*=\s*(?:torch|at)::",
        r"(empty|zeros|empty_like|zeros_like)\s*\("
    ))
});
static ALIAS: LazyLock<Regex> = LazyLock::new(|| {
    re(concat!(
        r"^(?:const\s+)?(?:auto|(?:torch|at)::Tensor)\s*&?\s*([A-Za-z_]\w*)\s*=\s*",
        r"([A-Za-z_]\w*)\s*(?:\.\s*contiguous\s*\(\s*\)\s*)?;"
    ))
});
static SELF_CONTIGUOUS: LazyLock<Regex> =
    LazyLock::new(|| re(r"^([A-Za-z_]\w*)\s*=\s*([A-Za-z_]\w*)\s*\.\s*contiguous\s*\(\s*\)\s*;"));
static RETURN: LazyLock<Regex> =
    LazyLock::new(|| re(r"^return\s+([A-Za-z_]\w*)\s*(?:\.\s*(?:view|reshape)\s*\([^;]*\))?\s*;"));
static STREAM: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?:at|c10)::cuda::getCurrentCUDAStream\s*\([^()]*\)(?:\s*\.\s*stream\s*\(\s*\))?|\bat::cuda::getStreamFromPool\s*\([^()]*\)",
    )
});
static SELF_STREAM: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"^(?:const\s+)?(?:cudaStream_t|auto)\s+stream\s*=\s*(?:at|c10)::cuda::getCurrentCUDAStream\s*\([^()]*\)(?:\s*\.\s*stream\s*\(\s*\))?\s*;",
    )
});
static LAUNCH: LazyLock<Regex> = LazyLock::new(|| re(r"<<<(?s)(.*?)>>>"));
static PY_STRING: LazyLock<Regex> =
    LazyLock::new(|| re(r#"(?s)[rRbBuU]?(?:"""(.*?)"""|'''(.*?)''')"#));
static PY_FUNCTIONS: LazyLock<Regex> = LazyLock::new(|| re(r"(?s)\bfunctions\s*=\s*\[([^\]]*)\]"));
static QUOTED: LazyLock<Regex> = LazyLock::new(|| re(r#"["']([A-Za-z_]\w*)["']"#));
static PY_CONSTANT: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?m)^([A-Za-z_]\w*)\s*=\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|True|False))\s*(?:#.*)?$",
    )
});

/// The module-level number constants of a KernelBench problem's Python source
/// (`scaling_factor = 0.5`, `kernel_size = 3`, `bias = True` as `true`), by name, as C literals.
pub fn problem_constants(code: &str) -> BTreeMap<String, String> {
    PY_CONSTANT
        .captures_iter(code)
        .map(|c| {
            let v = match &c[2] {
                "True" => "true".to_string(),
                "False" => "false".to_string(),
                v => v.to_string(),
            };
            (c[1].to_string(), v)
        })
        .collect()
}

/// `code` (an archive row's source: a torch extension `.cu`, or a Python file with a
/// `load_inline` call) as a native candidate for the problem with launcher `abi`; `constants` are
/// the problem's module constants ([`problem_constants`]), which scalar arguments of the bound
/// function take.
///
/// # Errors
/// Why the conversion is not mechanical, in one line (no CUDA source, several bound functions,
/// a temporary tensor, an argument that matches no launcher buffer, torch left in the code...).
pub fn to_native(
    code: &str,
    abi: &KbNative,
    constants: &BTreeMap<String, String>,
) -> Result<String, AbiError> {
    let (cuda, bound) = if code.contains("load_inline") || code.contains("cpp_extension") {
        from_python(code)?
    } else {
        (code.to_string(), Vec::new())
    };
    convert(&cuda, &bound, abi, constants)
}

/// The CUDA source of a Python file with a `load_inline` call (the triple-quoted string that
/// defines a `__global__` function) and the functions the call binds (`functions=[...]`; empty
/// when the CUDA source has its own `PYBIND11_MODULE` block).
fn from_python(code: &str) -> Result<(String, Vec<String>), AbiError> {
    let strings: Vec<String> = PY_STRING
        .captures_iter(code)
        .map(|c| c.get(1).or(c.get(2)).map_or("", |m| m.as_str()).to_string())
        .collect();
    let mut cuda = strings.iter().filter(|s| s.contains("__global__"));
    let src = cuda.next().ok_or(AbiError::from(
        "no triple-quoted CUDA source with a __global__ kernel",
    ))?;
    if cuda.next().is_some() {
        return Err(AbiError("several CUDA sources".into()));
    }
    let bound = PY_FUNCTIONS
        .captures(code)
        .map(|c| {
            QUOTED
                .captures_iter(&c[1])
                .map(|q| q[1].to_string())
                .collect()
        })
        .unwrap_or_default();
    Ok((src.clone(), bound))
}

/// One function defined at namespace scope: its name, the byte range of its head
/// (`start..open`), its body's braces (`open`, `close`).
#[derive(Debug, Clone)]
pub(crate) struct FnSpan {
    pub name: String,
    /// The head (`ret name(args)`), preprocessor lines left out.
    pub head: String,
    pub ret: String,
    pub args: String,
    pub start: usize,
    pub open: usize,
    pub close: usize,
}

/// The functions defined at namespace scope of `stripped` (comments and literals blanked),
/// in order.
pub(crate) fn top_level_spans(stripped: &str) -> Vec<FnSpan> {
    let bytes = stripped.as_bytes();
    let mut out = Vec::new();
    let mut head_start = 0usize;
    let mut i = 0usize;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => {
                let Some(close) = matching_brace(stripped, i) else {
                    break;
                };
                let head: String = stripped[head_start..i]
                    .lines()
                    .map(|l| {
                        if l.trim_start().starts_with('#') {
                            ""
                        } else {
                            l
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                if let Some(c) = HEAD.captures(&head) {
                    let lead = head.len() - head.trim_start().len();
                    out.push(FnSpan {
                        name: c["name"].to_string(),
                        head: head.trim().to_string(),
                        ret: c["ret"].trim().to_string(),
                        args: c["args"].to_string(),
                        start: head_start + lead,
                        open: i,
                        close,
                    });
                }
                i = close + 1;
                head_start = i;
                continue;
            }
            b';' => head_start = i + 1,
            b'\n' => {
                // A preprocessor line ends a head.
                let rest = stripped[i + 1..].trim_start_matches([' ', '\t']);
                if rest.starts_with('#') {
                    let end = stripped[i + 1..]
                        .find('\n')
                        .map_or(stripped.len(), |e| i + 1 + e);
                    head_start = end;
                    i = end;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// One argument of the bound host function.
#[derive(Debug)]
struct Arg {
    ty: String,
    name: String,
    tensor: bool,
}

/// `s` split at each `sep` outside parentheses, brackets and braces, and outside angle
/// brackets when `angles` (template arguments; not for expressions, where `<` compares).
pub(crate) fn split_top_level(s: &str, sep: u8, angles: bool) -> Vec<&str> {
    let (mut out, mut depth, mut from) = (Vec::new(), 0i32, 0usize);
    for (i, b) in s.bytes().enumerate() {
        match b {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b'<' if angles => depth += 1,
            b'>' if angles => depth -= 1,
            _ if b == sep && depth == 0 => {
                out.push(&s[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[from..]);
    out
}

fn parse_args(args: &str) -> Result<Vec<Arg>, AbiError> {
    let mut out = Vec::new();
    for a in split_top_level(args, b',', true) {
        let a = a.split('=').next().unwrap_or("").trim();
        if a.is_empty() || a == "void" {
            continue;
        }
        let cut = a
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .ok_or_else(|| AbiError(format!("argument `{a}` has no type")))?;
        let (ty, name) = (a[..=cut].trim().to_string(), a[cut + 1..].to_string());
        let tensor = ty.contains("Tensor");
        if !tensor && !SCALAR_TYPE.is_match(&ty) {
            return Err(AbiError(format!("argument `{name}` has type `{ty}`")));
        }
        out.push(Arg { ty, name, tensor });
    }
    Ok(out)
}

/// One launcher buffer with the host function's name for it.
struct Slot<'a> {
    buf: &'a KbBuffer,
    name: String,
}

/// Host tensor arguments matched to the launcher's inputs (by position) and parameters (by
/// name: equal, or the parameter's name ending in `_<argument>`; the rest by position).
fn match_buffers<'a>(abi: &'a KbNative, tensors: &[&Arg]) -> Result<Vec<Slot<'a>>, AbiError> {
    let tensor_inputs: Vec<&KbBuffer> = abi.inputs.iter().filter(|b| b.scalar.is_none()).collect();
    let want = tensor_inputs.len() + abi.params.len();
    if tensors.len() != want {
        return Err(AbiError(format!(
            "the host function takes {} tensors, the launcher {} (inputs and parameters)",
            tensors.len(),
            want
        )));
    }
    let mut param_of: Vec<Option<usize>> = vec![None; abi.params.len()];
    let mut used = BTreeSet::new();
    for (pi, p) in abi.params.iter().enumerate() {
        if let Some(ti) = tensors.iter().position(|t| t.name == p.name) {
            param_of[pi] = Some(ti);
            used.insert(ti);
        }
    }
    for (pi, p) in abi.params.iter().enumerate() {
        if param_of[pi].is_some() {
            continue;
        }
        let hits: Vec<usize> = (0..tensors.len())
            .filter(|ti| !used.contains(ti) && p.name.ends_with(&format!("_{}", tensors[*ti].name)))
            .collect();
        if let [ti] = hits[..] {
            param_of[pi] = Some(ti);
            used.insert(ti);
        }
    }
    let mut free = (0..tensors.len()).filter(|ti| !used.contains(ti));
    let mut slots = Vec::new();
    let mut input_slot = BTreeMap::new();
    for b in &tensor_inputs {
        let ti = free
            .next()
            .ok_or(AbiError::from("more inputs than tensor arguments"))?;
        input_slot.insert(b.name.clone(), ti);
    }
    for p in param_of.iter_mut().filter(|p| p.is_none()) {
        *p = Some(
            free.next()
                .ok_or(AbiError::from("a parameter matches no argument"))?,
        );
    }
    for b in &abi.inputs {
        let name = match input_slot.get(&b.name) {
            Some(&ti) => tensors[ti].name.clone(),
            None => b.name.clone(),
        };
        slots.push(Slot { buf: b, name });
    }
    for (pi, b) in abi.params.iter().enumerate() {
        let ti = param_of[pi].ok_or(AbiError::from("a parameter matches no argument"))?;
        slots.push(Slot {
            buf: b,
            name: tensors[ti].name.clone(),
        });
    }
    Ok(slots)
}

/// The C expression of a buffer's dimension `d` (a literal or a size name, renamed by `size`).
fn dim_expr(d: &serde_json::Value, size: &BTreeMap<String, String>) -> Result<String, AbiError> {
    let s = match d {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        _ => return Err(AbiError(format!("dimension {d} is not a size"))),
    };
    if s.parse::<i64>().is_ok() {
        return Ok(s);
    }
    size.get(&s)
        .cloned()
        .ok_or_else(|| AbiError(format!("dimension `{s}` is not a launcher size")))
}

/// The C expressions of a buffer's dimensions ([`dim_expr`]), outermost first.
fn dim_exprs(buf: &KbBuffer, size: &BTreeMap<String, String>) -> Result<Vec<String>, AbiError> {
    buf.dims.iter().map(|d| dim_expr(d, size)).collect()
}

fn product(dims: &[String]) -> String {
    if dims.is_empty() {
        return "1".into();
    }
    if let Ok(v) = dims
        .iter()
        .map(|d| d.parse::<i64>())
        .collect::<Result<Vec<_>, _>>()
    {
        return v.iter().product::<i64>().to_string();
    }
    format!("({})", dims.join(" * "))
}

/// `AT_DISPATCH_*(type, "name", [&] { body })` -> `{ using scalar_t = float; body }`.
fn unwrap_dispatch(body: &str) -> Result<String, AbiError> {
    let mut s = body.to_string();
    while let Some(m) = DISPATCH.find(&s) {
        let open = m.end() - 1;
        let close = matching_paren(&s, open).ok_or("an unclosed AT_DISPATCH")?;
        let inner = &s[open..close];
        let lam = inner
            .find("[&]")
            .ok_or("an AT_DISPATCH without a [&] lambda")?;
        let bo = open
            + lam
            + inner[lam..]
                .find('{')
                .ok_or("an AT_DISPATCH lambda without a body")?;
        let bc = matching_brace(&s, bo).ok_or("an unclosed AT_DISPATCH lambda")?;
        let rep = format!("{{ using scalar_t = float; {} }}", &s[bo + 1..bc]);
        s.replace_range(m.start()..=close, &rep);
    }
    Ok(s)
}

/// The end (index after the `;`) of the statement starting at `from`, parentheses balanced.
fn statement_end(s: &str, from: usize) -> Option<usize> {
    let mut depth = 0i64;
    for (i, c) in s[from..].char_indices() {
        match c {
            '(' | '{' => depth += 1,
            ')' | '}' => depth -= 1,
            ';' if depth == 0 => return Some(from + i + 1),
            _ => {}
        }
    }
    None
}

/// What the body rewrite learned: aliases (`auto y = x.contiguous();`), allocations by name
/// with their kind, the returned name.
#[derive(Default)]
struct Scan {
    alias: BTreeMap<String, String>,
    allocs: BTreeMap<String, String>,
    returned: BTreeSet<String>,
}

/// Removes the statements [`DROP`] names (and `checks`, the source's own check macros), records
/// and removes aliases, allocations and returns.
fn drop_statements(
    body: &str,
    checks: &BTreeSet<String>,
    tensors: &BTreeSet<String>,
    scan: &mut Scan,
) -> String {
    let mut s = body.to_string();
    let mut i = 0usize;
    let mut at_boundary = true;
    while i < s.len() {
        let c = s.as_bytes()[i];
        if at_boundary && !c.is_ascii_whitespace() {
            at_boundary = false;
            let rest = &s[i..];
            let user_check = rest
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .is_some_and(|w| checks.contains(w));
            let mut replace: Option<String> = None;
            if DROP.is_match(rest) || user_check {
                replace = Some(String::new());
            } else if let Some(c) = ALIAS
                .captures(rest)
                .filter(|c| tensors.contains(&c[2]) || scan.alias.contains_key(&c[2]))
            {
                let target = scan.alias.get(&c[2]).cloned().unwrap_or(c[2].to_string());
                scan.alias.insert(c[1].to_string(), target);
                replace = Some(String::new());
            } else if SELF_CONTIGUOUS.captures(rest).is_some_and(|c| c[1] == c[2])
                || SELF_STREAM.is_match(rest)
            {
                replace = Some(String::new());
            } else if let Some(c) = ALLOC.captures(rest) {
                scan.allocs.insert(c[1].to_string(), c[2].to_string());
                replace = Some(format!("/*alloc:{}*/", &c[1]));
            } else if let Some(c) = RETURN.captures(rest) {
                scan.returned.insert(c[1].to_string());
                replace = Some("return;".into());
            }
            if let Some(r) = replace
                && let Some(end) = statement_end(&s, i)
            {
                s.replace_range(i..end, &r);
                i += r.len();
                at_boundary = true;
                continue;
            }
        }
        if matches!(c, b';' | b'{' | b'}') {
            at_boundary = true;
        } else if c == b')' {
            // `if (...) TORCH_CHECK(...)`, `for (...) stmt`: a statement may follow.
            at_boundary = true;
        }
        i += 1;
    }
    s
}

/// `cuda` (a torch extension's CUDA source; `bound`, the functions a `load_inline` call binds)
/// as a native candidate for `abi`, as [`to_native`] describes.
fn convert(
    cuda: &str,
    bound: &[String],
    abi: &KbNative,
    constants: &BTreeMap<String, String>,
) -> Result<String, AbiError> {
    if abi.outputs.len() != 1 {
        return Err(AbiError(format!(
            "the launcher has {} outputs",
            abi.outputs.len()
        )));
    }
    let stripped = c::strip_comments_and_strings(cuda);
    let (host, cut) = bound_host(cuda, &stripped, bound)?;
    let rest = kernel_code(cuda, &cut)?;

    // The host function's arguments.
    let args = parse_args(&host.args)?;
    let tensors: Vec<&Arg> = args.iter().filter(|a| a.tensor).collect();
    let slots = match_buffers(abi, &tensors)?;
    let HostBody {
        code: body,
        scan,
        out_name,
        out_kind,
    } = host_body(cuda, &host, &rest.checks, &tensors)?;
    let size = launcher_sizes(abi, &rest.taken, &body, &args);
    let out_buf = &abi.outputs[0];
    let mut pointer: BTreeMap<String, (&KbBuffer, bool)> = BTreeMap::new();
    for s in &slots {
        pointer.insert(s.name.clone(), (s.buf, true));
    }
    pointer.insert(out_name.clone(), (out_buf, false));

    // Tensor expressions.
    let mut b = rewrite_tensors(body, &scan.alias, &pointer, &size)?;
    let out_ty = ctype(out_buf).ok_or(AbiError::from("the output's dtype has no C type"))?;
    let alloc = output_alloc(out_buf, out_ty, &out_name, &out_kind, &size)?;
    b = b.replace(&format!("/*alloc:{out_name}*/"), &alloc);
    let b = on_stream(b, &pointer)?;
    let prelude = scalar_prelude(&args, abi, &size, constants)?;

    // The launcher.
    let params = launcher_params(&slots, out_ty, &out_name, abi, &size)?;
    let body = tidy(&b);
    let launcher = format!(
        "extern \"C\" void launch({}) {{\n{prelude}{body}}}\n",
        params.join(", ")
    );
    let mut rest = tidy_file(&rest.code);
    if !rest.contains("cuda_runtime.h") {
        rest = format!("#include <cuda_runtime.h>\n{rest}");
    }
    if !rest.contains("stdint.h") && !rest.contains("cstdint") {
        rest = format!("#include <stdint.h>\n{rest}");
    }
    Ok(format!("{}\n\n{launcher}", rest.trim_end()))
}

/// The bound host function of `cuda` (`stripped`: the same bytes with comments and literals
/// blanked): the one function `bound` names or the `PYBIND11_MODULE` block binds (`forward`
/// among several), and the byte ranges to cut from the file (the module block, the host
/// function), in order.
fn bound_host(
    cuda: &str,
    stripped: &str,
    bound: &[String],
) -> Result<(FnSpan, Vec<(usize, usize)>), AbiError> {
    // The module block and the names it binds.
    let mut names: Vec<String> = bound.to_vec();
    let mut cut: Vec<(usize, usize)> = Vec::new();
    let blocks: Vec<_> = MODULE.find_iter(stripped).collect();
    if blocks.len() > 1 {
        return Err(AbiError("several PYBIND11_MODULE blocks".into()));
    }
    if let Some(m) = blocks.first() {
        let open = m.start()
            + stripped[m.start()..]
                .find('{')
                .ok_or(AbiError::from("a module block without a body"))?;
        let close =
            matching_brace(stripped, open).ok_or(AbiError::from("an unclosed module block"))?;
        let block = c::strip_comments(&cuda[m.start()..=close]);
        if names.is_empty() {
            names = DEF
                .captures_iter(&block)
                .map(|c| c[1].to_string())
                .collect();
        }
        cut.push((m.start(), close + 1));
    }
    names.dedup();
    let spans = top_level_spans(stripped);
    let host_name = match &names[..] {
        [] => return Err(AbiError("binds no function".into())),
        [one] => one.clone(),
        many => many
            .iter()
            .find(|n| n.as_str() == "forward")
            .cloned()
            .ok_or_else(|| AbiError(format!("binds {} functions", many.len())))?,
    };
    let mut found = spans.iter().filter(|f| f.name == host_name);
    let host = found.next().ok_or_else(|| {
        AbiError(format!(
            "the bound function `{host_name}` is not defined at top level"
        ))
    })?;
    if found.next().is_some() {
        return Err(AbiError(format!("`{host_name}` is overloaded")));
    }
    if !host.ret.contains("Tensor") || host.ret.contains('<') {
        return Err(AbiError(format!("`{host_name}` returns `{}`", host.ret)));
    }
    cut.push((host.start, host.close + 1));
    cut.sort();
    Ok((host.clone(), cut))
}

/// The file outside the bound function and the module block, as [`kernel_code`] leaves it.
struct KernelCode {
    /// Kernels, device code and other helpers, without torch includes and torch macros.
    code: String,
    /// The macros that use torch (or such a macro), removed.
    checks: BTreeSet<String>,
    /// Every identifier the remaining code uses.
    taken: BTreeSet<String>,
}

/// The rest of `cuda` once the `cut` byte ranges go: kernels, device code, other helpers,
/// without torch includes and the macros that use torch (`CHECK_INPUT(x)` -> `CHECK_CUDA(x)`
/// go too); fails where the remaining code still uses torch or one of those macros.
fn kernel_code(cuda: &str, cut: &[(usize, usize)]) -> Result<KernelCode, AbiError> {
    let mut rest = String::new();
    let mut at = 0;
    for (a, b) in cut {
        rest.push_str(&cuda[at..*a]);
        at = *b;
    }
    rest.push_str(&cuda[at..]);
    let mut checks: BTreeSet<String> = BTreeSet::new();
    loop {
        let before = checks.len();
        for c in DEFINE.captures_iter(&rest) {
            let (whole, name) = (c.get(0).expect("match"), c.get(1).expect("name"));
            let def = &whole.as_str()[name.end() - whole.start()..];
            let uses_check = IDENT.find_iter(def).any(|m| checks.contains(m.as_str()));
            if TORCHY.is_match(def) || uses_check {
                checks.insert(c[1].to_string());
            }
        }
        if checks.len() == before {
            break;
        }
    }
    let rest = DEFINE
        .replace_all(&rest, |c: &Captures| {
            if checks.contains(&c[1]) {
                String::new()
            } else {
                c[0].to_string()
            }
        })
        .into_owned();
    let rest = TORCH_INCLUDE.replace_all(&rest, "").into_owned();
    let rest_code = c::strip_comments_and_strings(&rest);
    if let Some(m) = TORCHY.find(&rest_code) {
        return Err(AbiError(format!(
            "code outside the bound function uses `{}`",
            m.as_str()
        )));
    }
    let taken: BTreeSet<String> = IDENT
        .find_iter(&rest_code)
        .map(|m| m.as_str().to_string())
        .collect();
    if let Some(c) = checks.iter().find(|c| taken.contains(*c)) {
        return Err(AbiError(format!("the kernels use the torch macro `{c}`")));
    }
    Ok(KernelCode {
        code: rest,
        checks,
        taken,
    })
}

/// The bound function's body as [`host_body`] rewrites it.
struct HostBody {
    /// The body, dispatches unwrapped, checks, aliases and returns removed, the output's
    /// allocation left as a `/*alloc:<name>*/` marker.
    code: String,
    /// What the rewrite learned.
    scan: Scan,
    /// The returned tensor (through its aliases).
    out_name: String,
    /// How it is allocated (`empty`, `zeros`, `empty_like`, `zeros_like`).
    out_kind: String,
}

/// The body of `host` (a function of `cuda`) with its `AT_DISPATCH_*` unwrapped and the
/// statements [`drop_statements`] takes out gone; fails unless it returns the one tensor it
/// allocates.
fn host_body(
    cuda: &str,
    host: &FnSpan,
    checks: &BTreeSet<String>,
    tensors: &[&Arg],
) -> Result<HostBody, AbiError> {
    let body = c::strip_comments(&cuda[host.open + 1..host.close]);
    let body = unwrap_dispatch(&body)?;
    let mut scan = Scan::default();
    let tensor_names: BTreeSet<String> = tensors.iter().map(|a| a.name.clone()).collect();
    let body = drop_statements(&body, checks, &tensor_names, &mut scan);
    let out_name = match scan.returned.iter().collect::<Vec<_>>()[..] {
        [one] => scan.alias.get(one).unwrap_or(one).clone(),
        [] => return Err(AbiError("returns no tensor it names".into())),
        _ => return Err(AbiError("returns different tensors".into())),
    };
    let out_kind = scan
        .allocs
        .get(&out_name)
        .cloned()
        .ok_or_else(|| AbiError(format!("returns `{out_name}`, which it does not allocate")))?;
    if let Some(t) = scan.allocs.keys().find(|k| **k != out_name) {
        return Err(AbiError(format!("allocates a temporary tensor `{t}`")));
    }
    Ok(HostBody {
        code: body,
        scan,
        out_name,
        out_kind,
    })
}

/// The launcher's name for each of `abi`'s sizes: its own, or `<size>_size` where the kernels
/// (`taken`), a declaration in `body` or an argument other than a scalar of that name uses it.
fn launcher_sizes(
    abi: &KbNative,
    taken: &BTreeSet<String>,
    body: &str,
    args: &[Arg],
) -> BTreeMap<String, String> {
    let body_decls: BTreeSet<String> =
        Regex::new(r"\b(?:int|int64_t|int32_t|long|auto|size_t|unsigned|float|double|const)\s+([A-Za-z_]\w*)\s*[=;\[(]")
            .expect("re")
            .captures_iter(body)
            .map(|c| c[1].to_string())
            .collect();
    let arg_names: BTreeSet<&str> = args.iter().map(|a| a.name.as_str()).collect();
    let mut size: BTreeMap<String, String> = BTreeMap::new();
    for s in &abi.sizes {
        let clash = taken.contains(s)
            || body_decls.contains(s)
            || (arg_names.contains(s.as_str()) && !args.iter().any(|a| &a.name == s && !a.tensor));
        size.insert(
            s.clone(),
            if clash {
                format!("{s}_size")
            } else {
                s.clone()
            },
        );
    }
    size
}

/// `b` with each alias of a launcher pointer replaced by its target, then every tensor
/// expression of each pointer (`pointer`: name -> buffer, and whether it is an input)
/// rewritten ([`rewrite_buffer`]).
fn rewrite_tensors(
    mut b: String,
    alias: &BTreeMap<String, String>,
    pointer: &BTreeMap<String, (&KbBuffer, bool)>,
    size: &BTreeMap<String, String>,
) -> Result<String, AbiError> {
    for (a, t) in alias {
        if pointer.contains_key(t) {
            b = Regex::new(&format!(r"\b{a}\b"))
                .expect("re")
                .replace_all(&b, t.as_str())
                .into_owned();
        }
    }
    for (name, (buf, is_input)) in pointer {
        b = rewrite_buffer(b, name, buf, *is_input, size)?;
    }
    Ok(b)
}

/// `b` with the tensor `name`'s (launcher buffer `buf`) expressions as C: `.contiguous()` and
/// `.data_ptr<T>()` the pointer, `.size(i)`, `.stride(i)`, `.numel()`, `.dim()` and
/// `.element_size()` the buffer's dimensions (sizes renamed by `size`) or literals, and, for
/// an input, `float* p = name;` as `const float* p = name;`.
fn rewrite_buffer(
    mut b: String,
    name: &str,
    buf: &KbBuffer,
    is_input: bool,
    size: &BTreeMap<String, String>,
) -> Result<String, AbiError> {
    let dims = dim_exprs(buf, size)?;
    let rank = dims.len() as i64;
    let n = regex::escape(name);
    let dim_at = |i: &str| -> Result<String, AbiError> {
        let i: i64 = i
            .parse()
            .map_err(|_| AbiError(format!("`{name}` dimension {i}")))?;
        let k = if i < 0 { rank + i } else { i };
        dims.get(k as usize)
            .cloned()
            .filter(|_| k >= 0)
            .ok_or_else(|| AbiError(format!("`{name}` has no dimension {i}")))
    };
    let mut err = None;
    let mut sub = |pat: &str, f: &dyn Fn(&Captures) -> Result<String, AbiError>| {
        let r = Regex::new(&format!(r"\b{n}\s*\.\s*{pat}")).expect("re");
        b = r
            .replace_all(&b, |c: &Captures| match f(c) {
                Ok(s) => s,
                Err(e) => {
                    err.get_or_insert(e);
                    String::new()
                }
            })
            .into_owned();
    };
    sub(r"contiguous\s*\(\s*\)", &|_| Ok(name.to_string()));
    sub(r"(?:data_ptr|data)\s*(?:<[^<>()]*>)?\s*\(\s*\)", &|_| {
        Ok(name.to_string())
    });
    sub(r"size\s*\(\s*(-?\d+)\s*\)", &|c| dim_at(&c[1]));
    sub(r"sizes\s*\(\s*\)\s*\[\s*(-?\d+)\s*\]", &|c| dim_at(&c[1]));
    sub(r"stride\s*\(\s*(-?\d+)\s*\)", &|c| {
        let i: i64 = c[1].parse().map_err(|_| AbiError("a stride".to_string()))?;
        let k = if i < 0 { rank + i } else { i };
        Ok(product(
            &dims[(k.clamp(0, rank) as usize + 1).min(dims.len())..],
        ))
    });
    sub(r"numel\s*\(\s*\)", &|_| Ok(product(&dims)));
    sub(r"(?:dim|ndimension)\s*\(\s*\)", &|_| Ok(rank.to_string()));
    sub(r"(?:is_cuda|is_contiguous)\s*\(\s*\)", &|_| {
        Ok("true".into())
    });
    sub(r"element_size\s*\(\s*\)", &|_| {
        Ok(format!("sizeof({})", ctype(buf).unwrap_or("float")))
    });
    if let Some(e) = err {
        return Err(e);
    }
    if is_input {
        // `float* p = x;` for a const input pointer: `const float* p = x;`.
        let r = Regex::new(&format!(
            r"(^|[;{{}}]\s*)((?:float|double|scalar_t|int|int64_t|__half|half)\s*\*\s*(?:__restrict__\s*)?[A-Za-z_]\w*\s*=\s*{n}\s*;)"
        ))
        .expect("re");
        b = r.replace_all(&b, "${1}const ${2}").into_owned();
    }
    Ok(b)
}

/// What stands for the output's allocation in the launcher: a `cudaMemsetAsync` of its
/// `product(dims)` elements of `out_ty` for a `zeros` kind (`out_kind`), else nothing.
fn output_alloc(
    out_buf: &KbBuffer,
    out_ty: &str,
    out_name: &str,
    out_kind: &str,
    size: &BTreeMap<String, String>,
) -> Result<String, AbiError> {
    let out_dims = dim_exprs(out_buf, size)?;
    Ok(if out_kind.starts_with("zeros") {
        format!(
            "cudaMemsetAsync({out_name}, 0, sizeof({out_ty}) * {}, stream);",
            product(&out_dims)
        )
    } else {
        String::new()
    })
}

/// `b` with torch's stream as the launcher's `stream` and every `<<<...>>>` launch on it;
/// fails where the code still uses torch or a method of a tensor in `pointer`, or creates its
/// own streams.
fn on_stream(b: String, pointer: &BTreeMap<String, (&KbBuffer, bool)>) -> Result<String, AbiError> {
    let b = STREAM.replace_all(&b, "stream").into_owned();
    let b = LAUNCH
        .replace_all(&b, |c: &Captures| {
            let parts: Vec<&str> = split_top_level(&c[1], b',', true)
                .into_iter()
                .map(str::trim)
                .collect();
            let cfg = match parts.len() {
                2 => format!("{}, {}, 0, stream", parts[0], parts[1]),
                3 => format!("{}, {}, {}, stream", parts[0], parts[1], parts[2]),
                _ if matches!(parts[3], "0" | "nullptr" | "NULL") => {
                    format!("{}, {}, {}, stream", parts[0], parts[1], parts[2])
                }
                _ => parts.join(", "),
            };
            format!("<<<{cfg}>>>")
        })
        .into_owned();
    if let Some(m) = TORCHY.find(&b) {
        return Err(AbiError(format!("the host code uses `{}`", m.as_str())));
    }
    for name in pointer.keys() {
        if let Some(m) = Regex::new(&format!(r"\b{}\s*\.\s*\w+", regex::escape(name)))
            .expect("re")
            .find(&b)
        {
            return Err(AbiError(format!("the host code uses `{}`", m.as_str())));
        }
    }
    if b.contains("cudaStreamCreate") {
        return Err(AbiError("the host code creates its own streams".into()));
    }
    Ok(b)
}

/// The launcher's declarations of the host function's scalar arguments that are not its own:
/// each a launcher size (renamed by `size`) or one of the problem's module `constants`.
fn scalar_prelude(
    args: &[Arg],
    abi: &KbNative,
    size: &BTreeMap<String, String>,
    constants: &BTreeMap<String, String>,
) -> Result<String, AbiError> {
    let mut prelude = String::new();
    for a in args.iter().filter(|a| !a.tensor) {
        let ty =
            a.ty.trim_start_matches("const")
                .trim()
                .trim_end_matches('&')
                .trim();
        if abi
            .inputs
            .iter()
            .any(|i| i.scalar.is_some() && i.name == a.name)
        {
            continue;
        }
        let value = match size.get(&a.name) {
            Some(p) if *p == a.name => continue,
            Some(p) => p.clone(),
            None => constants.get(&a.name).cloned().ok_or_else(|| {
                AbiError({
                    format!(
                        "argument `{}` is neither a launcher size nor a module constant",
                        a.name
                    )
                })
            })?,
        };
        prelude.push_str(&format!("    const {ty} {} = {value};\n", a.name));
    }
    Ok(prelude)
}

/// The launcher's parameters: the inputs and parameters (`slots`, `float` for a number), the
/// output `out_ty* out_name`, the sizes (`int64_t`, renamed by `size`) and the stream.
fn launcher_params(
    slots: &[Slot<'_>],
    out_ty: &str,
    out_name: &str,
    abi: &KbNative,
    size: &BTreeMap<String, String>,
) -> Result<Vec<String>, AbiError> {
    let mut params = Vec::new();
    for s in slots {
        if s.buf.scalar.is_some() {
            params.push(format!("float {}", s.name));
        } else {
            let t = ctype(s.buf).ok_or(AbiError::from("a buffer's dtype has no C type"))?;
            params.push(format!("const {t}* {}", s.name));
        }
    }
    params.push(format!("{out_ty}* {out_name}"));
    for s in &abi.sizes {
        params.push(format!("int64_t {}", size[s]));
    }
    params.push("cudaStream_t stream".into());
    Ok(params)
}

fn ctype(b: &KbBuffer) -> Option<&'static str> {
    c_type(b.dtype.as_deref()?)
}

/// The launcher body: blank lines collapsed, a final `return;` dropped, indented by 4.
fn tidy(body: &str) -> String {
    let mut lines: Vec<String> = Vec::new();
    let min_indent = body
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    for l in body.lines() {
        let t = l.trim_end();
        if t.trim().is_empty() {
            if lines.last().is_none_or(|p| p.is_empty()) {
                continue;
            }
            lines.push(String::new());
        } else {
            lines.push(format!(
                "    {}",
                &t[min_indent.min(t.len() - t.trim_start().len())..]
            ));
        }
    }
    while lines
        .last()
        .is_some_and(|l| l.is_empty() || l.trim() == "return;")
    {
        lines.pop();
    }
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

/// A file with runs of blank lines collapsed to one.
fn tidy_file(s: &str) -> String {
    let mut out = String::new();
    let mut blank = 0;
    for l in s.lines() {
        if l.trim().is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(l.trim_end());
        out.push('\n');
    }
    out.trim_start().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn abi(sig: &str, buffers: &str, sizes: &str) -> KbNative {
        KbNative::from_row(sig, buffers, sizes).unwrap()
    }

    /// The launcher of an N x N matmul problem.
    fn matmul_abi() -> KbNative {
        abi(
            r#"extern "C" void launch(const float* in0, const float* in1, float* out, int64_t N, cudaStream_t stream)"#,
            r#"{"inputs":[{"dims":["N","N"],"dtype":"f32","name":"in0"},{"dims":["N","N"],"dtype":"f32","name":"in1"}],"outputs":[{"dims":["N","N"],"dtype":"f32","name":"out"}],"params":[]}"#,
            r#"{"N":64}"#,
        )
    }

    const MATMUL: &str = r#"#include <torch/extension.h>
#include <cuda_runtime.h>
#define TILE 16
#define CHECK_INPUT(x) TORCH_CHECK(x.is_cuda(), #x " must be CUDA")
__global__ void mm(const float* A, const float* B, float* C, int N) {
    int r = blockIdx.y * TILE + threadIdx.y, c = blockIdx.x * TILE + threadIdx.x;
    if (r < N && c < N) { float s = 0; for (int k = 0; k < N; ++k) s += A[r * N + k] * B[k * N + c]; C[r * N + c] = s; }
}
torch::Tensor forward(torch::Tensor A, torch::Tensor B) {
    CHECK_INPUT(A); CHECK_INPUT(B);
    TORCH_CHECK(A.size(0) == A.size(1), "square");
    int64_t N = A.size(0);
    auto C = torch::zeros({N, N}, A.options());
    dim3 t(TILE, TILE), g((N + TILE - 1) / TILE, (N + TILE - 1) / TILE);
    mm<<<g, t>>>(A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), N);
    C10_CUDA_CHECK(cudaGetLastError());
    return C;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward, "mm"); }
"#;

    #[test]
    fn a_sakana_extension_becomes_kernels_and_the_launcher() {
        let a = matmul_abi();
        let n = to_native(MATMUL, &a, &BTreeMap::new()).unwrap();
        assert!(n.contains("extern \"C\" void launch(const float* A, const float* B, float* C, int64_t N_size, cudaStream_t stream)"), "{n}");
        assert!(n.contains("int64_t N = N_size;"), "{n}");
        assert!(
            n.contains("cudaMemsetAsync(C, 0, sizeof(float) * (N_size * N_size), stream);"),
            "{n}"
        );
        assert!(n.contains("mm<<<g, t, 0, stream>>>(A, B, C, N);"), "{n}");
        assert!(
            !n.contains("torch") && !n.contains("TORCH") && !n.contains("PYBIND11"),
            "{n}"
        );
        assert!(n.contains("__global__ void mm(") && n.contains("#define TILE 16"));
        assert!(!n.contains("CHECK_INPUT") && !n.contains("return"), "{n}");
    }

    #[test]
    fn weights_match_by_name_and_scalars_take_module_constants() {
        let src = r#"#include <torch/extension.h>
__global__ void k(const float* x, const float* w, const float* b, float* y, float s, int n) {}
torch::Tensor module_fn(torch::Tensor x, float scaling_factor, torch::Tensor bias, torch::Tensor weight) {
    x = x.contiguous();
    auto out = torch::empty({x.size(0), weight.size(0)}, x.options());
    const int threads = 256;
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "k", ([&] {
        k<<<(out.numel() + threads - 1) / threads, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(),
            out.data_ptr<scalar_t>(), scaling_factor, out.numel());
    }));
    return out;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &module_fn, "f"); }
"#;
        let a = abi(
            r#"extern "C" void launch(const float* in0, const float* linear_weight, const float* linear_bias, float* out, int64_t batch_size, cudaStream_t stream)"#,
            r#"{"inputs":[{"dims":["batch_size","512"],"dtype":"f32","name":"in0"}],"outputs":[{"dims":["batch_size","256"],"dtype":"f32","name":"out"}],"params":[{"dims":["256","512"],"dtype":"f32","name":"linear_weight"},{"dims":["256"],"dtype":"f32","name":"linear_bias"}]}"#,
            r#"{"batch_size":128}"#,
        );
        let consts = problem_constants("batch_size = 128\nscaling_factor = 0.5  # s\nname = 'x'\n");
        let n = to_native(src, &a, &consts).unwrap();
        assert!(n.contains("launch(const float* x, const float* weight, const float* bias, float* out, int64_t batch_size, cudaStream_t stream)"), "{n}");
        assert!(n.contains("const float scaling_factor = 0.5;"), "{n}");
        assert!(n.contains("using scalar_t = float;"), "{n}");
        assert!(n.contains(", threads, 0, stream>>>(\n"), "{n}");
        assert!(n.contains("(batch_size * 256)"), "{n}");
        // A missing constant is a reason, not a guess.
        let e = to_native(src, &a, &BTreeMap::new()).unwrap_err();
        assert!(e.0.contains("scaling_factor"), "{e}");
    }

    #[test]
    fn what_needs_torch_at_run_time_is_refused_with_the_reason() {
        let a = matmul_abi();
        let tmp = MATMUL.replace(
            "auto C = torch::zeros({N, N}, A.options());",
            "auto C = torch::zeros({N, N}, A.options()); auto T = torch::empty_like(C);",
        );
        assert!(
            to_native(&tmp, &a, &BTreeMap::new())
                .unwrap_err()
                .0
                .contains("temporary tensor `T`")
        );
        let aten = MATMUL.replace("return C;", "return torch::relu(C);");
        assert!(to_native(&aten, &a, &BTreeMap::new()).is_err());
        let three = MATMUL.replace("torch::Tensor B)", "torch::Tensor B, torch::Tensor D)");
        assert!(
            to_native(&three, &a, &BTreeMap::new())
                .unwrap_err()
                .0
                .contains("3 tensors")
        );
    }

    #[test]
    fn a_load_inline_python_file_gives_its_cuda_source() {
        let py = format!(
            "import torch\nfrom torch.utils.cpp_extension import load_inline\ncuda_src = \"\"\"\n{}\n\"\"\"\next = load_inline(name='m', cpp_sources='torch::Tensor forward(torch::Tensor A, torch::Tensor B);', cuda_sources=cuda_src, functions=['forward'])\n",
            MATMUL.split("PYBIND11_MODULE").next().unwrap()
        );
        let a = matmul_abi();
        let n = to_native(&py, &a, &BTreeMap::new()).unwrap();
        assert!(n.contains("mm<<<g, t, 0, stream>>>"), "{n}");
    }
}
