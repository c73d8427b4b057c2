//! Task specs: a task's typed native signature, named sizes, train and hold-out shapes, dtype,
//! tolerance, and byte/FLOP counts, loaded from `datasets/tasks/<id>/task.toml` beside the
//! task's naive and optimized kernels.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

use crate::diag::Diagnostic;

/// Role of a launcher argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArgKind {
    /// Read-only device buffer (`const T*`).
    Input,
    /// Device buffer the kernel must fully write (`T*`).
    Output,
    /// A size (`int64_t`), one of the task's named sizes.
    Size,
    /// A scalar parameter (`float`), value per shape.
    Scalar,
}

/// One launcher argument.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arg {
    /// C name.
    pub name: String,
    /// Role.
    pub kind: ArgKind,
    /// Element count as a product of size names and integers (buffers), e.g. `["rows", "cols"]`.
    #[serde(default)]
    pub shape: Vec<String>,
}

/// A task spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Task id, e.g. `vector_add`.
    pub id: String,
    /// Curriculum tier 0..3.
    pub tier: i64,
    /// One-line statement of what `launch` computes.
    pub description: String,
    /// Element type of every buffer: `f32`, `f16` (IEEE binary16, `__half`) or `bf16`
    /// (bfloat16, `__nv_bfloat16`). Scalars are always `float`.
    pub dtype: String,
    /// Whether an `f32` task admits tensor-core math on reduced-precision operands (TF32, f16,
    /// bf16, fp8 `mma`/`wmma`/`wgmma` in the kernel's PTX). Off by default: such a kernel is
    /// rejected (`tensor-core-precision`), since TF32 keeps 10 of f32's 23 mantissa bits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_tf32: bool,
    /// Input value ranges, one per seed in turn: seed `s` draws inputs uniform in
    /// `[-v, v)` with `v = input_scales[s % len]`. Default [`DEFAULT_INPUT_SCALES`]; f16 tasks
    /// whose outputs grow with the inputs (matmul) use smaller ones so the exact result stays
    /// within f16's range (max 65504).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_scales: Option<Vec<f64>>,
    /// Named integer sizes.
    pub sizes: Vec<String>,
    /// Launcher arguments in order (the stream comes last, implicitly).
    pub args: Vec<Arg>,
    /// Shapes the candidate sees in its prompt and training.
    pub train_shapes: Vec<BTreeMap<String, i64>>,
    /// Shapes never shown: odd sizes, large sizes.
    pub holdout_shapes: Vec<BTreeMap<String, i64>>,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance: an element passes when `|out - ref| <= atol + rtol * m`, `m` the
    /// reference's magnitude ([`crate::expr`]); an f32 task with a contraction is judged with
    /// at most f32's rounding bound instead ([`TaskSpec::rtol_for`]).
    pub rtol: f64,
    /// Bytes moved by an ideal kernel, as a sum of products, e.g. `12*n`.
    pub bytes: String,
    /// Floating-point operations, e.g. `n`.
    pub flops: String,
    /// The reference, per output buffer: an expression over the input buffers and scalars
    /// (see [`crate::expr`]), evaluated with libtorch in float64 after the candidate ran, and
    /// in the task's dtype for the `speedup_vs_torch` baseline.
    pub reference: BTreeMap<String, String>,
    /// Values of scalar arguments; a test with seed `s` uses `values[s % len]`.
    #[serde(default)]
    pub scalars: BTreeMap<String, Vec<f64>>,
    /// The naive kernel's file, relative to the task folder.
    pub naive: String,
    /// Optimized kernels' files.
    pub optimized: Vec<String>,
    /// The task as a KernelBench-style problem: a PyTorch `Model` whose `forward` computes what
    /// `launch` does, its size constants, `get_inputs` and `get_init_inputs`. Generated families
    /// carry their own; [`TaskSpec::problem_source`] renders one from `reference` for the rest.
    /// Prompts show every task through it (docs/architecture.md, "The task language").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// The template instance a generated family was drawn from (its op structure, e.g.
    /// `ew:leaky_relu>mul_scalar>sigmoid`): families of one group share a split, so no hold-out
    /// family shares a template instance with a training one. `None` for hand-written tasks
    /// (each its own group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Errors loading a task.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct TaskError {
    /// The task file.
    pub file: String,
    /// What is wrong.
    pub message: String,
}

/// Why an integer formula over size names ([`eval_formula`]) has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormulaError {
    /// A name that is neither a number nor one of the sizes.
    #[error("unknown size `{name}` in `{formula}`")]
    UnknownSize {
        /// The name.
        name: String,
        /// The whole formula.
        formula: String,
    },
    /// A formula that stops mid-term.
    #[error("`{0}` ends early")]
    EndsEarly(String),
    /// A token where none fits or a `(` never closed.
    #[error("{what} in `{formula}`")]
    Syntax {
        /// What is wrong (``unexpected `)` ``, ``unclosed `(` ``).
        what: String,
        /// The whole formula.
        formula: String,
    },
    /// Division by zero.
    #[error("division by zero in `{0}`")]
    DivisionByZero(String),
    /// A value outside `i64`.
    #[error("overflow in `{0}`")]
    Overflow(String),
}

/// An inconsistent task spec ([`TaskSpec::validate`]): a message naming the first
/// inconsistency (`reference.y: ...`, `test is empty`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

/// Evaluates an integer formula over size names: `+ - * /` (`/` divides integers, rounding
/// toward zero, as C does for the non-negative sizes a shape holds) with the usual precedence
/// and parentheses, e.g. `12*n`, `4*rows*cols + 4*rows`, `(height - kernel_size)/2 + 1`.
///
/// # Errors
/// Unknown name, bad token, division by zero, overflow.
pub fn eval_formula(f: &str, sizes: &BTreeMap<String, i64>) -> Result<i64, FormulaError> {
    let toks: Vec<&str> = formula_tokens(f);
    let mut pos = 0;
    let v = formula_sum(&toks, &mut pos, sizes, f)?;
    if pos != toks.len() {
        return Err(FormulaError::Syntax {
            what: format!("unexpected `{}`", toks[pos]),
            formula: f.into(),
        });
    }
    Ok(v)
}

fn formula_tokens(f: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in f.char_indices() {
        if c.is_ascii_alphanumeric() || c == '_' {
            start.get_or_insert(i);
            continue;
        }
        if let Some(s) = start.take() {
            out.push(&f[s..i]);
        }
        if !c.is_whitespace() {
            out.push(&f[i..i + c.len_utf8()]);
        }
    }
    if let Some(s) = start {
        out.push(&f[s..]);
    }
    out
}

fn formula_sum(
    t: &[&str],
    pos: &mut usize,
    sizes: &BTreeMap<String, i64>,
    f: &str,
) -> Result<i64, FormulaError> {
    let mut v = formula_product(t, pos, sizes, f)?;
    while let Some(&op @ ("+" | "-")) = t.get(*pos) {
        *pos += 1;
        let r = formula_product(t, pos, sizes, f)?;
        v = if op == "+" {
            v.checked_add(r)
        } else {
            v.checked_sub(r)
        }
        .ok_or_else(|| FormulaError::Overflow(f.into()))?;
    }
    Ok(v)
}

fn formula_product(
    t: &[&str],
    pos: &mut usize,
    sizes: &BTreeMap<String, i64>,
    f: &str,
) -> Result<i64, FormulaError> {
    let mut v = formula_atom(t, pos, sizes, f)?;
    while let Some(&op @ ("*" | "/")) = t.get(*pos) {
        *pos += 1;
        let r = formula_atom(t, pos, sizes, f)?;
        v = if op == "*" {
            v.checked_mul(r)
                .ok_or_else(|| FormulaError::Overflow(f.into()))?
        } else {
            v.checked_div(r)
                .ok_or_else(|| FormulaError::DivisionByZero(f.into()))?
        };
    }
    Ok(v)
}

fn formula_atom(
    t: &[&str],
    pos: &mut usize,
    sizes: &BTreeMap<String, i64>,
    f: &str,
) -> Result<i64, FormulaError> {
    let Some(&tok) = t.get(*pos) else {
        return Err(FormulaError::EndsEarly(f.into()));
    };
    *pos += 1;
    match tok {
        "(" => {
            let v = formula_sum(t, pos, sizes, f)?;
            if t.get(*pos) != Some(&")") {
                return Err(FormulaError::Syntax {
                    what: "unclosed `(`".into(),
                    formula: f.into(),
                });
            }
            *pos += 1;
            Ok(v)
        }
        "-" => Ok(-formula_atom(t, pos, sizes, f)?),
        _ => match tok.parse::<i64>() {
            Ok(n) => Ok(n),
            Err(_) => sizes
                .get(tok)
                .copied()
                .ok_or_else(|| FormulaError::UnknownSize {
                    name: tok.into(),
                    formula: f.into(),
                }),
        },
    }
}

/// The default input ranges per seed (1, 100, 0.01): a kernel cannot lean on one range or sign.
pub const DEFAULT_INPUT_SCALES: [f64; 3] = [1.0, 100.0, 0.01];

/// The element types a task may declare.
pub const DTYPES: [&str; 3] = ["f32", "f16", "bf16"];

/// The C type of an element type: `f32` float, `f16` `__half`, `bf16` `__nv_bfloat16`, `i64`
/// `int64_t`, `i32` `int32_t`, `bool`; `None` for another.
pub fn c_type(dtype: &str) -> Option<&'static str> {
    Some(match dtype {
        "f32" => "float",
        "f16" => "__half",
        "bf16" => "__nv_bfloat16",
        "i64" => "int64_t",
        "i32" => "int32_t",
        "bool" => "bool",
        _ => return None,
    })
}

/// The shim appended to a native candidate: `headers` (the half-precision ones its buffers
/// need), the launcher's declaration `signature` (a candidate whose `launch` differs does not
/// compile) and `int cudarl_entry(void* const* buffers, const int64_t* sizes, const float*
/// scalars, cudaStream_t stream)` calling `launch(call...)` and returning `cudaGetLastError()`.
/// The shim's code comes after an `#undef` of every name it uses, so no macro of the
/// candidate's (`#define cudaGetLastError() cudaSuccess`, a renamed `cudarl_entry`) reaches it.
pub fn entry_shim(headers: &str, signature: &str, call: &[String]) -> String {
    let code = format!(
        "{signature};\nextern \"C\" int cudarl_entry(void* const* buffers, const int64_t* sizes, const float* scalars, cudaStream_t stream) {{\n    (void)buffers; (void)sizes; (void)scalars;\n    launch({});\n    return (int)cudaGetLastError();\n}}\n",
        call.join(", ")
    );
    let names: std::collections::BTreeSet<&str> = cudarl_lex::c::IDENT
        .find_iter(&code)
        .map(|m| m.as_str())
        .collect();
    let undefs: String = names.iter().map(|n| format!("#undef {n}\n")).collect();
    format!(
        "\n// ---- cudarl-pipe shim (generated) ----\n#include <cuda_runtime.h>\n#include <stdint.h>\n{headers}{undefs}{code}"
    )
}

/// Rewrites the errors nvcc reports inside the shim's lines that declare or call `launch` (the
/// candidate's launcher does not have the task's signature, [`MISMATCH`]: "more than one
/// instance of overloaded function "launch" has "C" linkage", "too many arguments in function
/// call", ...) as one error in the candidate's terms: the declaration the task expects, at the
/// line of the candidate's own `launch`. Nothing changes when the candidate declares no
/// `launch`, or for other errors on those lines (a truncated candidate leaves the shim inside
/// its last function). `source` and `shim` ([`entry_shim`]) are what
/// [`crate::Compiler::compile`] joined (`{source}\n{shim}`).
pub fn explain_launcher_errors(diags: &mut Vec<Diagnostic>, source: &str, shim: &str) {
    if !diags.iter().any(|d| d.severity == "error") {
        return;
    }
    // The shim's first line is line `offset + 1` of the built file.
    let offset = source.matches('\n').count() as u32 + 1;
    let shim_lines: Vec<&str> = shim.split('\n').collect();
    let on_launch = |d: &Diagnostic| {
        d.severity == "error"
            && MISMATCH.is_match(&d.message)
            && d.file.as_deref() == Some(crate::inspect::SOURCE_NAME)
            && d.line
                .and_then(|l| l.checked_sub(offset + 1))
                .is_some_and(|i| {
                    shim_lines
                        .get(i as usize)
                        .is_some_and(|t| t.contains("launch("))
                })
    };
    let Some(first) = diags.iter().position(on_launch) else {
        return;
    };
    let Some(signature) = shim_lines
        .iter()
        .find(|l| l.starts_with("extern \"C\" void launch("))
    else {
        return;
    };
    let stripped = cudarl_lex::c::strip_comments_and_strings(source);
    let Some(own) = LAUNCH_DECL
        .find(&stripped)
        .map(|m| stripped[..m.start()].matches('\n').count() as u32 + 1)
    else {
        return;
    };
    diags[first] = Diagnostic {
        file: Some(crate::inspect::SOURCE_NAME.into()),
        line: Some(own),
        severity: "error".into(),
        message: format!(
            "`launch` does not have the task's launcher signature; declare it exactly as `{}`",
            signature.trim_end_matches(';')
        ),
        tool: "cudafe".into(),
    };
    let mut i = 0;
    diags.retain(|d| {
        i += 1;
        i - 1 == first || !on_launch(d)
    });
}

/// What nvcc says of a call or declaration of `launch` that does not match the candidate's
/// (the front end's words for a second C-linkage overload, a linkage clash, a wrong argument
/// count or type).
static MISMATCH: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(
        r#"has "C" linkage|linkage specification is incompatible|arguments in function call|is incompatible with parameter|declaration is incompatible|no suitable conversion"#,
    )
    .expect("re")
});

/// A declaration or definition of `launch`, in source with comments and strings blanked.
static LAUNCH_DECL: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"\bvoid\s+launch\s*\(").expect("re"));

/// Unit roundoff of IEEE binary32, `2^-24`.
pub const F32_UNIT_ROUNDOFF: f64 = 5.960_464_477_539_063e-8;

/// The constant `λ` of an f32 task's derived tolerance `(λ sqrt(K) + c) u`
/// ([`TaskSpec::rtol_for`]). A K-term inner product rounded in f32, in any order, is within
/// about `λ sqrt(K) u` times the sum of the terms' magnitudes with probability at least
/// `1 - 2K exp(-λ^2 / 2)` when the roundings are independent and of mean zero (Higham and Mary,
/// "A New Approach to Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019,
/// the inner-product theorem): at `λ = 8`, `2K e^-32`, about `K 2.5e-14` per output.
pub const F32_CONTRACTION_LAMBDA: f64 = 8.0;

/// The constant `c` of the derived tolerance `(λ sqrt(K) + c) u`: room for what is not a direct
/// K-term sum: the rounding of the steps after the contraction (a bias, an activation, a
/// square, at `K = 1` the whole output), and fast convolution algorithms (the transforms of
/// Winograd F(4x4, 3x3) add an error of the order of `10^2 u` of the magnitude at `K = 9`).
/// TF32 operands (10 mantissa bits) move a product by up to `2^-11` of itself, a K-term sum of
/// terms of either sign by about `2^-11 / sqrt(K)` of its magnitude: thousands of `u` at small
/// `K`.
pub const F32_CONTRACTION_ALLOWANCE: f64 = 256.0;

impl TaskSpec {
    /// The relative tolerance the judge applies to an output whose reference's longest
    /// contraction (a matmul's inner dimension, a convolution's `C_in / groups` times its kernel
    /// elements) has `contraction` terms: for an `f32` task that does not allow TF32, the
    /// smaller of [`TaskSpec::rtol`] and `(λ sqrt(K) + c) 2^-24` ([`F32_CONTRACTION_LAMBDA`],
    /// [`F32_CONTRACTION_ALLOWANCE`]), so math on reduced-precision operands (TF32, bf16) fails
    /// where it moves results beyond f32's own rounding; otherwise (no contraction, f16, bf16,
    /// `allow_tf32`) `rtol` itself. The test is `|out - ref| <= atol + rtol * m` with `m` the
    /// reference's magnitude (`crate::expr`). Where a reduction or a squashing function follows
    /// the contraction, TF32's error shrinks faster than `m` and can stay within the bound, and
    /// for `K` beyond a few thousand it does so anyway: the PTX check (`tensor-core-precision`)
    /// is the guard there.
    pub fn rtol_for(&self, contraction: i64) -> f64 {
        if self.dtype != "f32" || self.allow_tf32 || contraction <= 0 {
            return self.rtol;
        }
        let k = contraction as f64;
        let derived =
            (F32_CONTRACTION_LAMBDA * k.sqrt() + F32_CONTRACTION_ALLOWANCE) * F32_UNIT_ROUNDOFF;
        self.rtol.min(derived)
    }

    /// Loads `dir/task.toml`.
    ///
    /// # Errors
    /// TOML errors, unknown keys, and inconsistencies (see [`TaskSpec::validate`]).
    pub fn load(dir: &Path) -> Result<TaskSpec, TaskError> {
        let file = dir.join("task.toml");
        let fname = file.display().to_string();
        let text = std::fs::read_to_string(&file).map_err(|e| TaskError {
            file: fname.clone(),
            message: e.to_string(),
        })?;
        let t: TaskSpec = toml::from_str(&text).map_err(|e| TaskError {
            file: fname.clone(),
            message: e.to_string(),
        })?;
        t.validate().map_err(|m| TaskError {
            file: fname,
            message: m.0,
        })?;
        Ok(t)
    }

    /// Checks the spec is consistent: sizes used in shapes and formulas exist, every shape
    /// gives every size, buffer shapes evaluate, kernels exist are checked by the loader.
    ///
    /// # Errors
    /// A message naming the first inconsistency.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !(0..=3).contains(&self.tier) {
            return Err(SpecError(format!("tier {} is not in 0..3", self.tier)));
        }
        if !DTYPES.contains(&self.dtype.as_str()) {
            return Err(SpecError(format!(
                "dtype `{}` is not one of {}",
                self.dtype,
                DTYPES.join(", ")
            )));
        }
        if let Some(v) = &self.input_scales
            && (v.is_empty() || v.iter().any(|x| !(x.is_finite() && *x > 0.0)))
        {
            return Err(SpecError(
                "input_scales: give one or more positive, finite values".into(),
            ));
        }
        for a in &self.args {
            match a.kind {
                ArgKind::Size if !self.sizes.contains(&a.name) => {
                    return Err(SpecError(format!(
                        "size argument `{}` is not in sizes",
                        a.name
                    )));
                }
                ArgKind::Input | ArgKind::Output if a.shape.is_empty() => {
                    return Err(SpecError(format!("buffer `{}` has no shape", a.name)));
                }
                _ => {}
            }
        }
        if !self.args.iter().any(|a| a.kind == ArgKind::Output) {
            return Err(SpecError("no output buffer".into()));
        }
        for a in &self.args {
            if a.kind == ArgKind::Output {
                let src = self.reference.get(&a.name).ok_or_else(|| {
                    SpecError(format!("reference: no expression for output `{}`", a.name))
                })?;
                let e = crate::expr::parse(src)
                    .map_err(|m| SpecError(format!("reference.{}: {m}", a.name)))?;
                for v in e.vars() {
                    if !self
                        .args
                        .iter()
                        .any(|x| x.name == v && matches!(x.kind, ArgKind::Input | ArgKind::Scalar))
                    {
                        return Err(SpecError(format!(
                            "reference.{}: `{v}` is not an input or scalar argument",
                            a.name
                        )));
                    }
                }
            }
            if a.kind == ArgKind::Scalar && self.scalars.get(&a.name).is_none_or(Vec::is_empty) {
                return Err(SpecError(format!(
                    "scalars: no values for scalar argument `{}`",
                    a.name
                )));
            }
        }
        for k in self.reference.keys() {
            if !self
                .args
                .iter()
                .any(|a| &a.name == k && a.kind == ArgKind::Output)
            {
                return Err(SpecError(format!("reference.{k}: not an output argument")));
            }
        }
        for (split, shapes) in [
            ("train_shapes", &self.train_shapes),
            ("holdout_shapes", &self.holdout_shapes),
        ] {
            if shapes.is_empty() {
                return Err(SpecError(format!("{split} is empty")));
            }
            for s in shapes {
                for n in &self.sizes {
                    match s.get(n) {
                        Some(v) if *v > 0 => {}
                        _ => {
                            return Err(SpecError(format!(
                                "{split}: shape {s:?} lacks a positive `{n}`"
                            )));
                        }
                    }
                }
                for a in &self.args {
                    for d in &a.shape {
                        match eval_formula(d, s) {
                            Ok(v) if v > 0 => {}
                            Ok(v) => {
                                return Err(SpecError(format!(
                                    "{split}: arg `{}`: dimension `{d}` is {v}",
                                    a.name
                                )));
                            }
                            Err(e) => return Err(SpecError(format!("arg `{}`: {e}", a.name))),
                        }
                    }
                }
                eval_formula(&self.bytes, s).map_err(|e| SpecError(format!("bytes: {e}")))?;
                eval_formula(&self.flops, s).map_err(|e| SpecError(format!("flops: {e}")))?;
            }
        }
        Ok(())
    }

    /// The task as a KernelBench-style problem: [`TaskSpec::module`] when the task has one, else
    /// a module rendered from the reference: `forward` takes the input buffers and scalars in
    /// launcher order and returns the first output's reference in PyTorch
    /// ([`crate::expr::Expr::to_torch`]), the sizes of the first train shape are module
    /// constants, and `get_inputs` draws each input with `torch.rand` of its shape (a scalar: its
    /// first value). An unparsable reference is shown as a comment (`validate` refuses it).
    pub fn problem_source(&self) -> String {
        if let Some(m) = &self.module {
            return m.clone();
        }
        let ins: Vec<&Arg> = self
            .args
            .iter()
            .filter(|a| matches!(a.kind, ArgKind::Input | ArgKind::Scalar))
            .collect();
        let names: Vec<&str> = ins.iter().map(|a| a.name.as_str()).collect();
        let mut body = String::new();
        for a in self.args.iter().filter(|a| a.kind == ArgKind::Output) {
            let src = self
                .reference
                .get(&a.name)
                .map(String::as_str)
                .unwrap_or("");
            let e = crate::expr::parse(src)
                .map(|e| e.to_torch())
                .unwrap_or_else(|m| format!("None  # {m}"));
            body.push_str(&format!("        {} = {e}\n", a.name));
        }
        let outs: Vec<&str> = self
            .args
            .iter()
            .filter(|a| a.kind == ArgKind::Output)
            .map(|a| a.name.as_str())
            .collect();
        let mut s = format!(
            "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    \"\"\"\n    {}\n    \"\"\"\n\n    \
             def __init__(self):\n        super(Model, self).__init__()\n\n    \
             def forward(self, {}):\n{body}        return {}\n\n\n",
            self.description,
            names.join(", "),
            outs.join(", ")
        );
        if let Some(shape) = self.train_shapes.first() {
            for k in &self.sizes {
                if let Some(v) = shape.get(k) {
                    s.push_str(&format!("{k} = {v}\n"));
                }
            }
        }
        s.push_str("\n\ndef get_inputs():\n");
        for a in &ins {
            match a.kind {
                ArgKind::Scalar => {
                    let v = self
                        .scalars
                        .get(&a.name)
                        .and_then(|v| v.first())
                        .copied()
                        .unwrap_or(1.0);
                    s.push_str(&format!("    {} = {v:?}\n", a.name));
                }
                _ => s.push_str(&format!(
                    "    {} = torch.rand({})\n",
                    a.name,
                    a.shape.join(", ")
                )),
            }
        }
        s.push_str(&format!(
            "    return [{}]\n\n\ndef get_init_inputs():\n    return []\n",
            names.join(", ")
        ));
        s
    }

    /// The exact C declaration of the launcher, e.g.
    /// `extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream)`.
    pub fn signature(&self) -> String {
        let t = c_type(&self.dtype).unwrap_or("float");
        let params: Vec<String> = self
            .args
            .iter()
            .map(|a| match a.kind {
                ArgKind::Input => format!("const {t}* {}", a.name),
                ArgKind::Output => format!("{t}* {}", a.name),
                ArgKind::Size => format!("int64_t {}", a.name),
                ArgKind::Scalar => format!("float {}", a.name),
            })
            .chain(["cudaStream_t stream".to_string()])
            .collect();
        format!("extern \"C\" void launch({})", params.join(", "))
    }

    /// The generated shim appended to every candidate: one uniform entry point
    /// `int cudarl_entry(void* const* buffers, const int64_t* sizes, const float* scalars, cudaStream_t stream)`
    /// that calls `launch` with the declared signature and returns `cudaGetLastError()`.
    /// Buffers are passed in argument order; sizes in `sizes` order; scalars in argument order.
    pub fn shim(&self) -> String {
        let t = c_type(&self.dtype).unwrap_or("float");
        let (mut bi, mut si) = (0, 0);
        let call: Vec<String> = self
            .args
            .iter()
            .map(|a| match a.kind {
                ArgKind::Input => {
                    bi += 1;
                    format!("(const {t}*)buffers[{}]", bi - 1)
                }
                ArgKind::Output => {
                    bi += 1;
                    format!("({t}*)buffers[{}]", bi - 1)
                }
                ArgKind::Size => format!(
                    "sizes[{}]",
                    self.sizes.iter().position(|s| s == &a.name).unwrap_or(0)
                ),
                ArgKind::Scalar => {
                    si += 1;
                    format!("scalars[{}]", si - 1)
                }
            })
            .chain(["stream".to_string()])
            .collect();
        let headers = match self.dtype.as_str() {
            "f16" => "#include <cuda_fp16.h>\n",
            "bf16" => "#include <cuda_bf16.h>\n",
            _ => "",
        };
        entry_shim(headers, &self.signature(), &call)
    }

    /// The input range for `seed`: inputs are uniform in `[-v, v)` (see `input_scales`).
    pub fn input_scale(&self, seed: u64) -> f64 {
        let v = self
            .input_scales
            .as_deref()
            .unwrap_or(DEFAULT_INPUT_SCALES.as_slice());
        v[(seed % v.len() as u64) as usize]
    }

    /// Bytes moved for one shape (from `bytes`).
    ///
    /// # Errors
    /// A size is missing from `shape`.
    pub fn bytes_for(&self, shape: &BTreeMap<String, i64>) -> Result<i64, FormulaError> {
        eval_formula(&self.bytes, shape)
    }

    /// FLOPs for one shape (from `flops`).
    ///
    /// # Errors
    /// A size is missing from `shape`.
    pub fn flops_for(&self, shape: &BTreeMap<String, i64>) -> Result<i64, FormulaError> {
        eval_formula(&self.flops, shape)
    }
}

/// A loaded task with the paths of its kernels.
#[derive(Debug, Clone)]
pub struct Task {
    /// The spec.
    pub spec: TaskSpec,
    /// Task folder.
    pub dir: PathBuf,
}

impl Task {
    /// Source of the naive kernel.
    ///
    /// # Errors
    /// Unreadable file.
    pub fn naive_source(&self) -> Result<String, TaskError> {
        self.read(&self.spec.naive)
    }

    /// Sources of the optimized kernels, with their file names.
    ///
    /// # Errors
    /// Unreadable file.
    pub fn optimized_sources(&self) -> Result<Vec<(String, String)>, TaskError> {
        self.spec
            .optimized
            .iter()
            .map(|f| Ok((f.clone(), self.read(f)?)))
            .collect()
    }

    fn read(&self, rel: &str) -> Result<String, TaskError> {
        let p = self.dir.join(rel);
        std::fs::read_to_string(&p).map_err(|e| TaskError {
            file: p.display().to_string(),
            message: e.to_string(),
        })
    }
}

/// Loads every task folder under `root` (folders holding `task.toml`), sorted by id.
///
/// # Errors
/// The first task that fails to load, or two tasks with one id.
pub fn load_tasks(root: &Path) -> Result<Vec<Task>, TaskError> {
    let mut out = Vec::new();
    let rd = std::fs::read_dir(root).map_err(|e| TaskError {
        file: root.display().to_string(),
        message: e.to_string(),
    })?;
    let mut dirs: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("task.toml").is_file())
        .collect();
    dirs.sort();
    for d in dirs {
        let spec = TaskSpec::load(&d)?;
        out.push(Task { spec, dir: d });
    }
    out.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
    for w in out.windows(2) {
        if w[0].spec.id == w[1].spec.id {
            return Err(TaskError {
                file: w[1].dir.display().to_string(),
                message: format!("duplicate task id `{}`", w[1].spec.id),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_f32_contraction_is_judged_within_f32_rounding() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets/tasks");
        let mut t = TaskSpec::load(&dir.join("matmul")).unwrap();
        assert_eq!((t.dtype.as_str(), t.rtol), ("f32", 1e-4));
        let u = F32_UNIT_ROUNDOFF;
        // No contraction: the task's own rtol; K = 1024: (8 * 32 + 256) u = 3.05e-5.
        assert_eq!(t.rtol_for(0), 1e-4);
        assert!(
            (t.rtol_for(1024) - 512.0 * u).abs() < 1e-18,
            "{}",
            t.rtol_for(1024)
        );
        // Never looser than the task's own: at K = 10^6 the bound (8256 u) exceeds 1e-4.
        assert_eq!(t.rtol_for(1_000_000), 1e-4);
        t.allow_tf32 = true;
        assert_eq!(t.rtol_for(1024), 1e-4);
        t.allow_tf32 = false;
        t.dtype = "f16".into();
        assert_eq!(t.rtol_for(1024), 1e-4);
    }

    #[test]
    fn formulas_follow_precedence_and_name_bad_input() {
        let sizes = BTreeMap::from([("h".to_string(), 33), ("k".to_string(), 4)]);
        for (f, want) in [
            ("12*h", 396),
            ("4*h*k + 4*h", 660),
            ("h-k+1", 30),
            ("(h - k)/2 + 1", 15),
            ("(h+2*1-k)/2+1", 16),
            ("-k + h", 29),
            ("7", 7),
        ] {
            assert_eq!(eval_formula(f, &sizes), Ok(want), "{f}");
        }
        let syntax = |what: &str, f: &str| FormulaError::Syntax {
            what: what.into(),
            formula: f.into(),
        };
        for (f, want) in [
            (
                "h*w",
                FormulaError::UnknownSize {
                    name: "w".into(),
                    formula: "h*w".into(),
                },
            ),
            ("h/(k-4)", FormulaError::DivisionByZero("h/(k-4)".into())),
            ("(h-k", syntax("unclosed `(`", "(h-k")),
            ("h k", syntax("unexpected `k`", "h k")),
            ("h-", FormulaError::EndsEarly("h-".into())),
            (
                "9223372036854775807+h",
                FormulaError::Overflow("9223372036854775807+h".into()),
            ),
        ] {
            assert_eq!(eval_formula(f, &sizes), Err(want), "{f}");
        }
        assert_eq!(
            eval_formula("h k", &sizes).unwrap_err().to_string(),
            "unexpected `k` in `h k`"
        );
    }
}
