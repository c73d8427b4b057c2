//! Family task families: `synth-tasks`' `generate` table adds seeded random families beside
//! the hand-written ones in `datasets/tasks/`, each a full [`TaskSpec`] (reference expression,
//! tolerance, train and hold-out shapes) with a naive and an optimized kernel made from
//! templates in this file.
//!
//! Two hand-written kernels per family, templated into thousands of SFT rows, teach a small
//! model to recall a family's kernel from its name, not to write the kernel a description asks
//! for (zero pass rate on the hold-out families; with generated families 0.25 single-turn,
//! `benchmarks/results/rl_generated_families_h100_2026-11-22.json`). Many families
//! whose descriptions differ in the expression, and whose kernels carry that expression, teach
//! the mapping description -> code that a new task needs.
//!
//! Two kinds, float32:
//! - **elementwise** (tier 0): `out[i] = f(x[i], y[i], s)` with `f` a random expression tree of
//!   depth <= 3 over `relu`, `sigmoid`, `tanh`, `abs`, squaring, negation, `+ - *`,
//!   `fmaxf`/`fminf` and the constants 0.5 and 2. Kernels: one thread per element (naive); float4
//!   loads and stores in a grid-stride loop with a scalar tail (optimized).
//! - **row reductions** (tier 1): `out[r] = R_c g(x[r*cols + c])` with `R` one of sum, max, min,
//!   mean and `g` a random expression tree of depth <= 2 over `x` (and sometimes the scalar
//!   `s`), 1 to 5 nodes, drawn like the elementwise trees: thousands of distinct families.
//!   Kernels: one thread per row (naive); two of three optimized ones, drawn per family: one
//!   block per row with warp shuffles and a block size drawn from 256/512/1024 for long rows
//!   (`block_per_row.cu`), one warp per row (`warp_per_row.cu`), one block per row with float4
//!   loads unrolled by two (`block_vec4.cu`). So SFT shows a real choice between a naive scan
//!   and several fast layouts, where RL's speed term decides.
//!
//! Kernel and function names are the same in every family (`ew_naive`, `ew_op`, `ew_vec4`,
//! `row_naive`, `row_block`, `row_warp`, `row_vec4`): with the family id in each name, the `small` model had to copy a
//! 3-digit id consistently and every first turn failed to compile (H100, 2026-11-22).
//!
//! The description states the expression in CUDA C, exactly as the kernels compute it; the
//! reference is the same tree in the reference language of [`cudarl_cuda::expr`]. Families
//! whose reference equals one given in `exclude` (the hand-written families, so the hold-out
//! families `scalar_multiply` and `row_max` are never generated) or an earlier generated one
//! are drawn again. Tolerance: `rtol = 1e-5`, `atol = 1e-6` for every generated family (the
//! gelu/row_sum tolerance of `datasets/tasks/README.md`: CUDA's `expf`/`tanhf` are within 2 ulp).

use std::collections::{BTreeMap, BTreeSet};

use cudarl_cuda::task::{Arg, ArgKind, TaskSpec};
use cudarl_curriculum::prompts::{self, ChatMessage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// How many families to generate (`[stages.synth-tasks] generate = {...}`); all zero by default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateParams {
    /// Tier-0 elementwise families (ids `gen_ew_000`, ...).
    #[serde(default)]
    pub elementwise: usize,
    /// Tier-1 row-reduction families (ids `gen_rr_000`, ...).
    #[serde(default)]
    pub row_reduce: usize,
    /// Operator families over KernelBench's vocabulary, tiers 0-3, each stated as a
    /// KernelBench-style module ([`crate::operators`]; ids `gen_op_0000`, ...).
    #[serde(default)]
    pub operators: usize,
    /// ChaCha8 seed: the same seed gives the same families, byte for byte.
    #[serde(default)]
    pub seed: u64,
}

/// One generated family: its spec and kernel sources.
#[derive(Debug, Clone)]
pub struct Family {
    /// The spec (`naive` and `optimized` name the files below).
    pub spec: TaskSpec,
    /// The naive kernel (native ABI, with `launch`).
    pub naive: String,
    /// Optimized kernels as (file, source).
    pub optimized: Vec<(String, String)>,
}

/// Prefix of every generated family id (the `splits` stage draws `holdout_generated` and
/// `rl_generated` from their groups).
pub const PREFIX: &str = "gen_";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Un {
    Relu,
    Sigmoid,
    Tanh,
    Abs,
    Square,
    Neg,
}

const UNARY: [Un; 6] = [
    Un::Relu,
    Un::Sigmoid,
    Un::Tanh,
    Un::Abs,
    Un::Square,
    Un::Neg,
];

#[derive(Debug, Clone, PartialEq)]
enum E {
    Var(&'static str),
    Num(&'static str),
    Un(Un, Box<E>),
    Bin(char, Box<E>, Box<E>),
    Max(Box<E>, Box<E>),
    Min(Box<E>, Box<E>),
}

/// How a tree is written: in the reference language or in CUDA C with variable spellings.
#[derive(Clone, Copy)]
enum Lang<'a> {
    Ref,
    C(&'a dyn Fn(&str) -> String),
}

fn render(e: &E, l: Lang<'_>) -> String {
    let wrap = |e: &E| match e {
        E::Bin(..) => format!("({})", render(e, l)),
        _ => render(e, l),
    };
    let c = matches!(l, Lang::C(_));
    match e {
        E::Var(v) => match l {
            Lang::Ref => (*v).to_string(),
            Lang::C(f) => f(v),
        },
        E::Num(n) => {
            if c {
                format!("{n}f")
            } else {
                (*n).to_string()
            }
        }
        E::Un(u, a) => {
            let inner = render(a, l);
            match (u, c) {
                (Un::Relu, false) => format!("relu({inner})"),
                (Un::Relu, true) => format!("fmaxf({inner}, 0.0f)"),
                (Un::Sigmoid, false) => format!("sigmoid({inner})"),
                (Un::Sigmoid, true) => format!("1.0f / (1.0f + expf(-{}))", wrap_neg(a, l)),
                (Un::Tanh, false) => format!("tanh({inner})"),
                (Un::Tanh, true) => format!("tanhf({inner})"),
                (Un::Abs, false) => format!("abs({inner})"),
                (Un::Abs, true) => format!("fabsf({inner})"),
                (Un::Square, _) => format!("{} * {}", wrap(a), wrap(a)),
                (Un::Neg, _) => format!("-{}", wrap_neg(a, l)),
            }
        }
        E::Bin(op, a, b) => format!("{} {op} {}", wrap(a), wrap(b)),
        E::Max(a, b) => {
            let f = if c { "fmaxf" } else { "maximum" };
            format!("{f}({}, {})", render(a, l), render(b, l))
        }
        E::Min(a, b) => {
            let f = if c { "fminf" } else { "minimum" };
            format!("{f}({}, {})", render(a, l), render(b, l))
        }
    }
}

/// The operand of a unary minus: parenthesized unless it is a name, number or call.
fn wrap_neg(a: &E, l: Lang<'_>) -> String {
    match a {
        E::Var(_) | E::Num(_) | E::Max(..) | E::Min(..) => render(a, l),
        E::Un(u, _) if !matches!(u, Un::Square | Un::Neg) => render(a, l),
        _ => format!("({})", render(a, l)),
    }
}

fn vars(e: &E, out: &mut BTreeSet<&'static str>) {
    match e {
        E::Var(v) => {
            out.insert(v);
        }
        E::Num(_) => {}
        E::Un(_, a) => vars(a, out),
        E::Bin(_, a, b) | E::Max(a, b) | E::Min(a, b) => {
            vars(a, out);
            vars(b, out);
        }
    }
}

/// Degenerate trees: a binary node with equal operands (`x - x`, `fminf(x, x)`), a compound
/// subtree without a tensor (`tanhf(0.5f)`, `s * 2.0f`), a double negation or a negated number.
fn degenerate(e: &E) -> bool {
    let tensorless = |e: &E| {
        let mut v = BTreeSet::new();
        vars(e, &mut v);
        !v.contains("x") && !v.contains("y")
    };
    match e {
        E::Var(_) | E::Num(_) => false,
        E::Un(Un::Neg, a) if matches!(**a, E::Num(_) | E::Un(Un::Neg, _)) => true,
        E::Un(_, a) => tensorless(e) || degenerate(a),
        E::Bin(_, a, b) | E::Max(a, b) | E::Min(a, b) => {
            a == b || tensorless(e) || degenerate(a) || degenerate(b)
        }
    }
}

fn size(e: &E) -> usize {
    match e {
        E::Var(_) | E::Num(_) => 1,
        E::Un(_, a) => 1 + size(a),
        E::Bin(_, a, b) | E::Max(a, b) | E::Min(a, b) => 1 + size(a) + size(b),
    }
}

/// A random tree over `leaves` (name, weight).
fn tree(rng: &mut ChaCha8Rng, depth: u32, leaves: &[(&'static str, u32)]) -> E {
    if depth == 0 || rng.random_bool(0.3) {
        let total: u32 = leaves.iter().map(|l| l.1).sum::<u32>() + 1;
        let mut k = rng.random_range(0..total);
        for (name, w) in leaves {
            if k < *w {
                return E::Var(name);
            }
            k -= w;
        }
        return E::Num(if rng.random_bool(0.5) { "0.5" } else { "2.0" });
    }
    let sub = |rng: &mut ChaCha8Rng| Box::new(tree(rng, depth - 1, leaves));
    match rng.random_range(0..10) {
        0..=3 => {
            let u = UNARY[rng.random_range(0..UNARY.len())];
            E::Un(u, sub(rng))
        }
        4..=8 => {
            let op = ['+', '-', '*'][rng.random_range(0..3)];
            let a = sub(rng);
            E::Bin(op, a, sub(rng))
        }
        _ => {
            let a = sub(rng);
            if rng.random_bool(0.5) {
                E::Max(a, sub(rng))
            } else {
                E::Min(a, sub(rng))
            }
        }
    }
}

/// A launcher argument `name` of `kind` with shape formulas `shape`.
pub(crate) fn arg(name: &str, kind: ArgKind, shape: &[&str]) -> Arg {
    Arg {
        name: name.into(),
        kind,
        shape: shape.iter().map(|s| s.to_string()).collect(),
    }
}

/// Shapes of a task: each a map from size name to value.
pub(crate) type Shapes = Vec<BTreeMap<String, i64>>;

/// `list`'s shapes as size maps.
pub(crate) fn shapes(list: &[&[(&str, i64)]]) -> Shapes {
    list.iter()
        .map(|s| s.iter().map(|(k, v)| (k.to_string(), *v)).collect())
        .collect()
}

const SCALARS: [[f64; 3]; 3] = [[1.5, -0.75, 3.0], [2.5, -0.5, 0.25], [0.5, 4.0, -2.0]];

fn spec(
    id: String,
    tier: i64,
    description: String,
    args: Vec<Arg>,
    reference: String,
    scalar: Option<usize>,
    reduce: bool,
) -> TaskSpec {
    let inputs = args.iter().filter(|a| a.kind == ArgKind::Input).count();
    let (sizes, train, holdout, bytes, flops) = if reduce {
        (
            vec!["rows".into(), "cols".into()],
            shapes(&[
                &[("rows", 1024), ("cols", 1024)],
                &[("rows", 16384), ("cols", 1024)],
                &[("rows", 64), ("cols", 65536)],
            ]),
            shapes(&[
                &[("rows", 1), ("cols", 1)],
                &[("rows", 1000), ("cols", 999)],
                &[("rows", 7), ("cols", 32769)],
            ]),
            "4*rows*cols + 4*rows".to_string(),
            "2*rows*cols".to_string(),
        )
    } else {
        (
            vec!["n".into()],
            shapes(&[&[("n", 1024)], &[("n", 1_048_576)], &[("n", 16_777_216)]]),
            shapes(&[&[("n", 1)], &[("n", 1_000_003)], &[("n", 4_194_319)]]),
            format!("{}*n", 4 * (inputs + 1)),
            "4*n".to_string(),
        )
    };
    TaskSpec {
        id,
        tier,
        description,
        dtype: "f32".into(),
        allow_tf32: false,
        input_scales: None,
        sizes,
        args,
        train_shapes: train,
        holdout_shapes: holdout,
        atol: 1e-6,
        rtol: 1e-5,
        bytes,
        flops,
        reference: BTreeMap::from([("out".to_string(), reference)]),
        scalars: scalar
            .map(|k| BTreeMap::from([("s".to_string(), SCALARS[k].to_vec())]))
            .unwrap_or_default(),
        naive: "naive.cu".into(),
        optimized: vec![if reduce {
            "block_per_row.cu".into()
        } else {
            "vec4.cu".into()
        }],
        module: None,
        group: None,
    }
}

const HEADER: &str = "#include <cuda_runtime.h>\n#include <stdint.h>\n#include <math.h>\n";

/// The kernel parameter list of `spec`'s launcher (without the stream), `restrict` on pointers
/// when asked, and the argument names for the call.
fn params(spec: &TaskSpec, restrict: bool) -> (String, String) {
    let sig = spec.signature();
    let inner = &sig[sig.find('(').map_or(0, |i| i + 1)..sig.rfind(", cudaStream_t").unwrap_or(0)];
    let decl = if restrict {
        inner.replace("* ", "* __restrict__ ")
    } else {
        inner.to_string()
    };
    let names: Vec<&str> = spec.args.iter().map(|a| a.name.as_str()).collect();
    (decl, names.join(", "))
}

fn elementwise(id: &str, e: &E, scalar: Option<usize>, block: u32) -> Family {
    let mut vs = BTreeSet::new();
    vars(e, &mut vs);
    let mut args = vec![arg("x", ArgKind::Input, &["n"])];
    if vs.contains("y") {
        args.push(arg("y", ArgKind::Input, &["n"]));
    }
    args.push(arg("out", ArgKind::Output, &["n"]));
    if scalar.is_some() {
        args.push(arg("s", ArgKind::Scalar, &[]));
    }
    args.push(arg("n", ArgKind::Size, &[]));
    let indexed = |v: &str| {
        if v == "s" {
            "s".into()
        } else {
            format!("{v}[i]")
        }
    };
    let c_i = render(e, Lang::C(&indexed));
    let spec = spec(
        id.to_string(),
        0,
        format!("out[i] = {c_i} for i in [0, n)"),
        args,
        render(e, Lang::Ref),
        scalar,
        false,
    );
    let sig = spec.signature();
    let (decl, names) = params(&spec, false);
    let naive = format!(
        "// naive: one thread per element.\n{HEADER}\n\
         __global__ void ew_naive({decl}) {{\n    \
         int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n    \
         if (i < n) {{\n        out[i] = {c_i};\n    }}\n}}\n\n\
         {sig} {{\n    const int block = {block};\n    \
         int64_t grid = (n + block - 1) / block;\n    \
         ew_naive<<<(unsigned)grid, block, 0, stream>>>({names});\n}}\n"
    );
    // The optimized kernel: a per-element function, float4 main loop, scalar tail.
    let ins: Vec<&str> = ["x", "y"].into_iter().filter(|v| vs.contains(v)).collect();
    let op_params: Vec<String> = ins
        .iter()
        .map(|v| format!("float {v}"))
        .chain(scalar.map(|_| "float s".to_string()))
        .collect();
    let plain = |v: &str| v.to_string();
    let body = render(e, Lang::C(&plain));
    let call = |lane: &str| -> String {
        ins.iter()
            .map(|v| {
                if lane.is_empty() {
                    format!("{v}[i]")
                } else {
                    format!("q_{v}.{lane}")
                }
            })
            .chain(scalar.map(|_| "s".to_string()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (rdecl, _) = params(&spec, true);
    let aligned = ins
        .iter()
        .map(|v| format!("reinterpret_cast<uintptr_t>({v})"))
        .chain(["reinterpret_cast<uintptr_t>(out)".to_string()])
        .collect::<Vec<_>>()
        .join(" | ");
    let loads: String = ins
        .iter()
        .map(|v| format!("        float4 q_{v} = reinterpret_cast<const float4*>({v})[j];\n"))
        .collect();
    let lanes: String = ["x", "y", "z", "w"]
        .iter()
        .map(|l| format!("        r.{l} = ew_op({});\n", call(l)))
        .collect();
    let optimized = format!(
        "// optimized: float4 (128-bit) loads and stores in a grid-stride loop sized to the SMs;\n\
         // scalar tail for n % 4 and for unaligned pointers.\n{HEADER}\n\
         __device__ __forceinline__ float ew_op({}) {{\n    return {body};\n}}\n\n\
         __global__ void ew_vec4({rdecl}) {{\n    \
         const int64_t stride = (int64_t)gridDim.x * blockDim.x;\n    \
         const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n    \
         const bool aligned = (({aligned}) & 15) == 0;\n    \
         const int64_t n4 = aligned ? n / 4 : 0;\n    \
         for (int64_t j = tid; j < n4; j += stride) {{\n{loads}        float4 r;\n{lanes}        \
         reinterpret_cast<float4*>(out)[j] = r;\n    }}\n    \
         for (int64_t i = n4 * 4 + tid; i < n; i += stride) {{\n        out[i] = ew_op({});\n    }}\n}}\n\n\
         {sig} {{\n    int device = 0, sms = 132;\n    cudaGetDevice(&device);\n    \
         cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);\n    \
         const int block = {block};\n    int64_t want = (n / 4 + block - 1) / block;\n    \
         int64_t grid = want < (int64_t)sms * 8 ? (want > 0 ? want : 1) : (int64_t)sms * 8;\n    \
         ew_vec4<<<(unsigned)grid, block, 0, stream>>>({names});\n}}\n",
        op_params.join(", "),
        call(""),
    );
    Family {
        spec,
        naive,
        optimized: vec![("vec4.cu".into(), optimized)],
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Red {
    Sum,
    Max,
    Min,
    Mean,
}

/// The optimized kernels a row-reduction family can carry (two per family, drawn).
#[derive(Debug, Clone, Copy, PartialEq)]
enum RowKernel {
    /// One block per row, a block size drawn per family (`block_per_row.cu`).
    Block,
    /// One warp per row, eight rows per block (`warp_per_row.cu`).
    Warp,
    /// One block per row, float4 loads unrolled by two (`block_vec4.cu`).
    Vec4,
}

const ROW_KERNELS: [RowKernel; 3] = [RowKernel::Block, RowKernel::Warp, RowKernel::Vec4];

impl RowKernel {
    fn file(self) -> &'static str {
        match self {
            RowKernel::Block => "block_per_row.cu",
            RowKernel::Warp => "warp_per_row.cu",
            RowKernel::Vec4 => "block_vec4.cu",
        }
    }
}

/// A row-reduction family: `out[r] = R_c e(x[r*cols + c])`, its naive kernel and the
/// optimized `kernels`; `block` is the block size [`RowKernel::Block`] uses for rows of at least
/// 4,096 columns (half of it from 512).
fn row_reduce(
    id: &str,
    r: Red,
    e: &E,
    scalar: Option<usize>,
    kernels: &[RowKernel],
    block: u32,
) -> Family {
    let mut spec = row_reduce_spec(id, r, e, scalar);
    let elem = render(e, Lang::C(&*leaf_as("v")));
    let naive = row_reduce_naive(&spec, r, &elem);
    let src = RowReduceSource::new(&spec, r, &elem);
    let optimized = kernels
        .iter()
        .map(|k| (k.file().to_string(), src.kernel(*k, block)))
        .collect::<Vec<_>>();
    spec.optimized = optimized.iter().map(|(f, _)| f.clone()).collect();
    Family {
        spec,
        naive,
        optimized,
    }
}

impl Red {
    /// The reduction's name, its identity, and the C expression combining `a` and `b`.
    fn ops(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Red::Sum => ("sum", "0.0f", "a + b"),
            Red::Mean => ("mean", "0.0f", "a + b"),
            Red::Max => ("max", "-INFINITY", "fmaxf(a, b)"),
            Red::Min => ("min", "INFINITY", "fminf(a, b)"),
        }
    }

    /// The row's result from the combined value `acc` (divided by `cols` for a mean).
    fn result(self, acc: &str) -> String {
        if self == Red::Mean {
            format!("{acc} / (float)cols")
        } else {
            acc.to_string()
        }
    }
}

/// A leaf renderer that writes `x` and `y` as `name` and the scalar as `s`.
fn leaf_as(name: &str) -> Box<dyn Fn(&str) -> String> {
    let name = name.to_string();
    Box::new(move |v: &str| if v == "s" { "s".into() } else { name.clone() })
}

/// The spec of the row reduction `r` of `e` over `x` of shape `(rows, cols)`.
fn row_reduce_spec(id: &str, r: Red, e: &E, scalar: Option<usize>) -> TaskSpec {
    let mut args = vec![
        arg("x", ArgKind::Input, &["rows", "cols"]),
        arg("out", ArgKind::Output, &["rows"]),
    ];
    if scalar.is_some() {
        args.push(arg("s", ArgKind::Scalar, &[]));
    }
    args.push(arg("rows", ArgKind::Size, &[]));
    args.push(arg("cols", ArgKind::Size, &[]));
    let (rname, _, _) = r.ops();
    let desc_elem = render(e, Lang::C(&*leaf_as("x[r*cols + c]")));
    let description = if r == Red::Mean {
        format!("out[r] = mean over c of {desc_elem} (the sum divided by cols), for r in [0, rows)")
    } else {
        format!("out[r] = {rname} over c of {desc_elem}, for r in [0, rows)")
    };
    spec(
        id.to_string(),
        1,
        description,
        args,
        format!("{rname}({}, 1)", render(e, Lang::Ref)),
        scalar,
        true,
    )
}

/// The naive row-reduction kernel: one thread per row, `elem` the C expression of element `v`.
fn row_reduce_naive(spec: &TaskSpec, r: Red, elem: &str) -> String {
    let sig = spec.signature();
    let (decl, names) = params(spec, false);
    let (_, init, _) = r.ops();
    let comb_of = |a: &str, b: &str| match r {
        Red::Sum | Red::Mean => format!("{a} + {b}"),
        Red::Max => format!("fmaxf({a}, {b})"),
        Red::Min => format!("fminf({a}, {b})"),
    };
    // A sum or mean scanned by one thread accumulates in double: float32 sequential sums of
    // 65,536 terms of one sign drift by about n u / 4 = 1e-3 of their magnitude, 100x the
    // tolerance (27 of 160 naive kernels failed the 64 x 65,536 train shape on an H200).
    let sums = matches!(r, Red::Sum | Red::Mean);
    let (acc_t, naive_step, naive_out) = if sums {
        (
            "double",
            format!("acc + (double)({elem})"),
            if r == Red::Mean {
                "(float)(acc / (double)cols)".to_string()
            } else {
                "(float)acc".to_string()
            },
        )
    } else {
        (
            "float",
            comb_of("acc", &format!("({elem})")),
            r.result("acc"),
        )
    };
    format!(
        "// naive: one thread per row, a sequential scan (neighbouring threads read different rows).\n\
         {HEADER}\n__global__ void row_naive({decl}) {{\n    \
         int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n    \
         if (r >= rows) return;\n    {acc_t} acc = {init};\n    \
         for (int64_t c = 0; c < cols; ++c) {{\n        float v = x[r * cols + c];\n        \
         acc = {naive_step};\n    }}\n    out[r] = {naive_out};\n}}\n\n\
         {sig} {{\n    const int block = 128;\n    \
         row_naive<<<(unsigned)((rows + block - 1) / block), block, 0, stream>>>({names});\n}}\n",
    )
}

/// What the optimized row-reduction kernels share.
struct RowReduceSource {
    /// The reduction's name and identity.
    rname: &'static str,
    init: &'static str,
    /// The launcher's signature, its parameter list with `__restrict__`, its argument names.
    sig: String,
    rdecl: String,
    names: String,
    /// The headers and `row_combine`.
    head: String,
    /// The update of `acc` by the element `v`.
    step: String,
    /// The block's combination of its threads' results, and the store of row `r`'s result.
    epilogue: String,
    /// The row's result from `acc`.
    result: String,
}

impl RowReduceSource {
    /// The shared pieces of the reduction `r` of `elem` (the C expression of element `v`).
    fn new(spec: &TaskSpec, r: Red, elem: &str) -> RowReduceSource {
        let (rname, init, comb) = r.ops();
        let (_, names) = params(spec, false);
        let (rdecl, _) = params(spec, true);
        let head = format!(
            "{HEADER}\n__device__ __forceinline__ float row_combine(float a, float b) {{\n    \
             return {comb};\n}}\n\n"
        );
        // The block's partial results: warp shuffles, then one warp over the warps' results.
        let epilogue = format!(
            "    for (int off = 16; off > 0; off >>= 1) acc = row_combine(acc, __shfl_xor_sync(0xffffffffu, acc, off));\n    \
             const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n    \
             if (lane == 0) part[warp] = acc;\n    __syncthreads();\n    \
             if (warp == 0) {{\n        acc = lane < (int)(blockDim.x >> 5) ? part[lane] : {init};\n        \
             for (int off = 16; off > 0; off >>= 1) acc = row_combine(acc, __shfl_xor_sync(0xffffffffu, acc, off));\n        \
             if (lane == 0) out[r] = {};\n    }}\n}}\n\n",
            r.result("acc"),
        );
        RowReduceSource {
            rname,
            init,
            sig: spec.signature(),
            rdecl,
            names,
            head,
            step: format!("acc = row_combine(acc, {elem});"),
            epilogue,
            result: r.result("acc"),
        }
    }

    /// The source of the optimized kernel `k`; `block` is [`RowKernel::Block`]'s block size.
    fn kernel(&self, k: RowKernel, block: u32) -> String {
        let RowReduceSource {
            rname,
            init,
            sig,
            rdecl,
            names,
            head,
            step,
            epilogue,
            result,
        } = self;
        match k {
            RowKernel::Block => format!(
                "// optimized: one block per row, coalesced loads, warp-shuffle then shared-memory {rname}.\n\
                 {head}__global__ void row_block({rdecl}) {{\n    __shared__ float part[32];\n    \
                 const int64_t r = blockIdx.x;\n    const float* row = x + r * cols;\n    \
                 float acc = {init};\n    \
                 for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {{\n        float v = row[c];\n        \
                 {step}\n    }}\n{epilogue}\
                 {sig} {{\n    const int block = cols >= 4096 ? {block} : (cols >= 512 ? {} : 64);\n    \
                 row_block<<<(unsigned)rows, block, 0, stream>>>({names});\n}}\n",
                block / 2,
            ),
            RowKernel::Warp => format!(
                "// optimized: one warp per row (eight rows per block), coalesced loads, warp-shuffle {rname}.\n\
                 {head}__global__ void row_warp({rdecl}) {{\n    \
                 const int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);\n    \
                 const int lane = threadIdx.x & 31;\n    if (r >= rows) return;\n    \
                 const float* row = x + r * cols;\n    float acc = {init};\n    \
                 for (int64_t c = lane; c < cols; c += 32) {{\n        float v = row[c];\n        \
                 {step}\n    }}\n    \
                 for (int off = 16; off > 0; off >>= 1) acc = row_combine(acc, __shfl_xor_sync(0xffffffffu, acc, off));\n    \
                 if (lane == 0) out[r] = {result};\n}}\n\n\
                 {sig} {{\n    const int warps = 8;\n    \
                 row_warp<<<(unsigned)((rows + warps - 1) / warps), warps * 32, 0, stream>>>({names});\n}}\n",
            ),
            RowKernel::Vec4 => format!(
                "// optimized: one block per row, float4 (128-bit) loads unrolled by two where the row is\n\
                 // 16-byte aligned (a scalar loop for the rest), warp-shuffle then shared-memory {rname}.\n\
                 {head}__global__ void row_vec4({rdecl}) {{\n    __shared__ float part[32];\n    \
                 const int64_t r = blockIdx.x;\n    const float* row = x + r * cols;\n    \
                 float acc = {init};\n    \
                 const int64_t n4 = (reinterpret_cast<uintptr_t>(row) & 15) == 0 ? cols / 4 : 0;\n    \
                 const float4* row4 = reinterpret_cast<const float4*>(row);\n    \
                 #pragma unroll 2\n    \
                 for (int64_t j = threadIdx.x; j < n4; j += blockDim.x) {{\n        \
                 const float4 q = row4[j];\n        float v = q.x;\n        {step}\n        \
                 v = q.y;\n        {step}\n        v = q.z;\n        {step}\n        \
                 v = q.w;\n        {step}\n    }}\n    \
                 for (int64_t c = n4 * 4 + threadIdx.x; c < cols; c += blockDim.x) {{\n        \
                 float v = row[c];\n        {step}\n    }}\n{epilogue}\
                 {sig} {{\n    const int block = cols >= 4096 ? 256 : 128;\n    \
                 row_vec4<<<(unsigned)rows, block, 0, stream>>>({names});\n}}\n",
            ),
        }
    }
}

/// A reference expression up to the order of the operands of `+`, `*`, `maximum` and
/// `minimum` (parsed by [`cudarl_cuda::expr::parse`]), so `x * s` matches `s * x`; unparsable
/// text is compared as is.
pub fn canonical(src: &str) -> String {
    use cudarl_cuda::expr::Expr as X;
    fn canon(e: X) -> X {
        match e {
            X::Neg(a) => X::Neg(Box::new(canon(*a))),
            X::Bin(op, a, b) => {
                let (a, b) = (canon(*a), canon(*b));
                if matches!(op, '+' | '*') && format!("{b:?}") < format!("{a:?}") {
                    X::Bin(op, Box::new(b), Box::new(a))
                } else {
                    X::Bin(op, Box::new(a), Box::new(b))
                }
            }
            X::Call(f, args) => {
                let mut args: Vec<X> = args.into_iter().map(canon).collect();
                if f == "maximum" || f == "minimum" {
                    args.sort_by_key(|a| format!("{a:?}"));
                }
                X::Call(f, args)
            }
            other => other,
        }
    }
    match cudarl_cuda::expr::parse(src) {
        Ok(e) => format!("{:?}", canon(e)),
        Err(_) => src.to_string(),
    }
}

/// Generates the families of `p`, skipping any whose reference is in `exclude` (up to
/// commuted operands, [`canonical`]).
///
/// Deterministic in `p` (ChaCha8). Elementwise trees are redrawn until they use `x` (and `y` /
/// `s` when drawn), have 2..=7 nodes, are not degenerate (`x - x`, `tanhf(0.5f)`, `--x`) and
/// have a reference not seen before up to commuted operands (at most 1,000 draws per
/// family; fewer families come back when the space is exhausted). Row reductions are drawn
/// after them, so their count does not change the elementwise families.
pub fn generate(p: &GenerateParams, exclude: &BTreeSet<String>) -> Vec<Family> {
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let mut seen: BTreeSet<String> = exclude.iter().map(|r| canonical(r)).collect();
    let mut out = Vec::new();
    for i in 0..p.elementwise {
        for _ in 0..1000 {
            let has_y = rng.random_bool(0.5);
            let has_s = rng.random_bool(0.4);
            let mut leaves = vec![("x", 4)];
            if has_y {
                leaves.push(("y", 3));
            }
            if has_s {
                leaves.push(("s", 2));
            }
            let e = tree(&mut rng, 3, &leaves);
            let mut vs = BTreeSet::new();
            vars(&e, &mut vs);
            let n = size(&e);
            if !vs.contains("x") || vs.contains("y") != has_y || vs.contains("s") != has_s {
                continue;
            }
            if !(2..=7).contains(&n)
                || degenerate(&e)
                || !seen.insert(canonical(&render(&e, Lang::Ref)))
            {
                continue;
            }
            let scalar = has_s.then(|| rng.random_range(0..SCALARS.len()));
            let block = [128, 256, 512][rng.random_range(0..3)];
            out.push(elementwise(
                &format!("{PREFIX}ew_{i:03}"),
                &e,
                scalar,
                block,
            ));
            break;
        }
    }
    // Row reductions: a reducer and a map drawn like the elementwise trees, over `x` and
    // sometimes `s`, depth <= 2 and 1..=5 nodes (`x` alone included), each family with two
    // of the three optimized kernels.
    let mut i = 0;
    let mut draws = 0;
    while i < p.row_reduce && draws < 1000 * p.row_reduce {
        draws += 1;
        let r = [Red::Sum, Red::Max, Red::Min, Red::Mean][rng.random_range(0..4)];
        let has_s = rng.random_bool(0.3);
        let mut leaves = vec![("x", 4)];
        if has_s {
            leaves.push(("s", 2));
        }
        let e = tree(&mut rng, 2, &leaves);
        let mut vs = BTreeSet::new();
        vars(&e, &mut vs);
        if !vs.contains("x") || vs.contains("s") != has_s || size(&e) > 5 || degenerate(&e) {
            continue;
        }
        let skip = rng.random_range(0..ROW_KERNELS.len());
        let kernels: Vec<RowKernel> = (0..ROW_KERNELS.len())
            .filter(|k| *k != skip)
            .map(|k| ROW_KERNELS[k])
            .collect();
        let block = [256, 512, 1024][rng.random_range(0..3)];
        let scalar = has_s.then(|| rng.random_range(0..SCALARS.len()));
        let g = row_reduce(
            &format!("{PREFIX}rr_{i:03}"),
            r,
            &e,
            scalar,
            &kernels,
            block,
        );
        if !seen.insert(canonical(&g.spec.reference["out"])) {
            continue;
        }
        out.push(g);
        i += 1;
    }
    // Operator families last, so their count changes none of the above.
    let refs: BTreeSet<String> = exclude
        .iter()
        .cloned()
        .chain(out.iter().flat_map(|f| f.spec.reference.values().cloned()))
        .collect();
    out.extend(crate::operators::generate(p.operators, p.seed, &refs));
    out
}

/// What pretraining's copy documents must never show: the references of every task (the
/// hold-out's included) and the groups (template instances) of every generated family.
#[derive(Debug, Clone, Default)]
pub struct CopyExclusions {
    /// Reference expressions.
    pub references: BTreeSet<String>,
    /// Family groups ([`TaskSpec::group`]).
    pub groups: BTreeSet<String>,
}

/// `n` pretraining conversations (system, user, assistant; rendered by the trainer with the
/// chat template, [`cudarl_curriculum::prompts`]) that each ask, in the generator's prompt
/// format, for an operator family ([`crate::operators`], drawn with `seed`) stated as its
/// KernelBench-style module, and answer with its naive kernel (even indices) or its fast one
/// (odd indices); the phrasing cycles through
/// [`INTROS`](cudarl_curriculum::prompts::INTROS) and
/// [`CLOSINGS`](cudarl_curriculum::prompts::CLOSINGS). Never a family whose reference or group
/// is in `exclude` (pass every task's, the hold-out's included), so the text teaches the map
/// from a module to its kernel without showing any task or any template instance of one.
/// It draws `4n + 64` families, so fewer than `n` come back only where the exclusions take
/// most groups (the default pipeline's 450 families leave 3000 of 3000; 1.8 s).
///
/// Measured with 3000 elementwise ones before the task language was modules (H100, 136
/// hold-out episodes per checkpoint): the SFT checkpoint's hold-out pass rate 0.132 -> 0.412
/// (`benchmarks/results/main_job_h100_2026-11-23_copy_documents.json`).
pub fn copy_documents(n: usize, seed: u64, exclude: &CopyExclusions) -> Vec<Vec<ChatMessage>> {
    // Draw more than needed: families of an excluded group are dropped.
    let drawn = crate::operators::generate(4 * n + 64, seed, &exclude.references);
    drawn
        .into_iter()
        .filter(|f| {
            f.spec
                .group
                .as_ref()
                .is_none_or(|g| !exclude.groups.contains(g))
        })
        .take(n)
        .enumerate()
        .map(|(i, f)| {
            let code = match (i % 2, f.optimized.first()) {
                (1, Some((_, src))) => src,
                _ => &f.naive,
            };
            let mut m = crate::episode::generator_conversation_phrased(
                &f.spec,
                i,
                i / prompts::INTROS.len(),
            );
            m.push(ChatMessage::new("assistant", prompts::fenced(code)));
            m
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(e: usize, r: usize) -> GenerateParams {
        GenerateParams {
            elementwise: e,
            row_reduce: r,
            operators: 0,
            seed: 7,
        }
    }

    #[test]
    fn copy_documents_state_a_module_answer_with_its_kernel_and_skip_the_excluded() {
        let tasks = crate::operators::generate(40, 3, &BTreeSet::new());
        let exclude = CopyExclusions {
            references: tasks
                .iter()
                .map(|f| f.spec.reference["out"].clone())
                .collect(),
            groups: tasks.iter().filter_map(|f| f.spec.group.clone()).collect(),
        };
        let docs = copy_documents(60, 11, &exclude);
        assert_eq!(docs.len(), 60);
        assert_eq!(docs, copy_documents(60, 11, &exclude), "deterministic");
        let modules: BTreeSet<&str> = tasks
            .iter()
            .map(|f| f.spec.module.as_deref().unwrap())
            .collect();
        let mut intros = BTreeSet::new();
        // The tasks' own seed with their references and groups excluded draws none of them.
        for (i, d) in docs
            .iter()
            .chain(&copy_documents(20, 3, &exclude))
            .enumerate()
        {
            let roles: Vec<&str> = d.iter().map(|m| m.role.as_str()).collect();
            assert_eq!(roles, ["system", "user", "assistant"]);
            assert_eq!(d[0].content, prompts::GENERATOR_SYSTEM);
            let (user, answer) = (&d[1].content, &d[2].content);
            intros.insert(user.lines().next().unwrap().to_string());
            assert!(
                user.contains("the forward pass of the PyTorch module below"),
                "{user}"
            );
            assert!(user.contains("```python\nimport torch"), "{user}");
            assert!(user.contains("extern \"C\" void launch("), "{user}");
            assert!(
                !modules.iter().any(|m| user.contains(m.trim_end())),
                "a task's module: {user}"
            );
            // The answer defines the launcher the prompt declares.
            let code = prompts::extract_code(answer).unwrap();
            let sig = user
                .lines()
                .find(|l| l.starts_with("extern \"C\" void launch("))
                .unwrap()
                .trim_end_matches(';');
            assert!(code.contains(sig), "{code}");
            if i % 2 == 0 && i < 60 {
                assert!(code.starts_with("// naive"), "{code}");
            } else if i < 60 {
                assert!(code.starts_with("// fast"), "{code}");
            }
        }
        assert_eq!(intros.len(), prompts::INTROS.len());
    }

    #[test]
    fn families_are_valid_distinct_and_reproducible() {
        let exclude = BTreeSet::from(["max(x, 1)".to_string(), "sum(x, 1)".to_string()]);
        let a = generate(&params(40, 200), &exclude);
        let b = generate(&params(40, 200), &exclude);
        assert_eq!(a.len(), 240, "hundreds of distinct row reductions");
        let mut files = BTreeMap::new();
        for g in a.iter().filter(|g| g.spec.tier == 1) {
            assert_eq!(g.optimized.len(), 2, "{}", g.spec.id);
            for (f, _) in &g.optimized {
                *files.entry(f.as_str()).or_insert(0) += 1;
            }
        }
        assert_eq!(files.len(), 3, "{files:?}");
        assert!(files.values().all(|n| *n > 100), "{files:?}");
        let mut refs = BTreeSet::new();
        for (g, h) in a.iter().zip(&b) {
            assert_eq!(g.spec, h.spec);
            assert_eq!(g.naive, h.naive);
            g.spec
                .validate()
                .unwrap_or_else(|e| panic!("{}: {e}", g.spec.id));
            let r = &g.spec.reference["out"];
            cudarl_cuda::expr::parse(r).unwrap_or_else(|e| panic!("{r}: {e}"));
            assert!(refs.insert(r.clone()), "duplicate {r}");
            assert!(!exclude.contains(r));
            assert!(g.naive.contains(&g.spec.signature()));
            for (f, src) in &g.optimized {
                assert!(src.contains(&g.spec.signature()), "{} {f}", g.spec.id);
            }
            let named: Vec<&String> = g.optimized.iter().map(|(f, _)| f).collect();
            assert_eq!(g.spec.optimized.iter().collect::<Vec<_>>(), named);
        }
        // Another seed, other families.
        let c = generate(
            &GenerateParams {
                seed: 8,
                ..params(40, 0)
            },
            &exclude,
        );
        assert_ne!(
            a[..40]
                .iter()
                .map(|g| &g.spec.reference)
                .collect::<Vec<_>>(),
            c.iter().map(|g| &g.spec.reference).collect::<Vec<_>>()
        );
    }

    #[test]
    fn exclusion_and_dedup_see_through_commuted_operands() {
        assert_eq!(canonical("x * s"), canonical("s * x"));
        assert_eq!(
            canonical("maximum(y, x) + 2.0"),
            canonical("2.0 + maximum(x, y)")
        );
        assert_ne!(canonical("x - s"), canonical("s - x"));
        let exclude = BTreeSet::from(["s * x".to_string(), "x + y".to_string()]);
        let gs = generate(&params(400, 0), &exclude);
        let mut seen = BTreeSet::new();
        for g in &gs {
            let c = canonical(&g.spec.reference["out"]);
            assert!(
                c != canonical("x * s") && c != canonical("y + x"),
                "{}",
                g.spec.id
            );
            assert!(seen.insert(c), "{} repeats a family", g.spec.id);
        }
    }

    #[test]
    fn description_kernel_and_reference_agree() {
        // sigmoid(x) * s + y, built by hand: the three renderings.
        let e = E::Bin(
            '+',
            Box::new(E::Bin(
                '*',
                Box::new(E::Un(Un::Sigmoid, Box::new(E::Var("x")))),
                Box::new(E::Var("s")),
            )),
            Box::new(E::Var("y")),
        );
        let g = elementwise("gen_ew_x", &e, Some(0), 256);
        assert_eq!(g.spec.reference["out"], "(sigmoid(x) * s) + y");
        assert_eq!(
            g.spec.description,
            "out[i] = (1.0f / (1.0f + expf(-x[i])) * s) + y[i] for i in [0, n)"
        );
        assert!(
            g.naive
                .contains("out[i] = (1.0f / (1.0f + expf(-x[i])) * s) + y[i];")
        );
        assert!(g.optimized[0].1.contains("r.z = ew_op(q_x.z, q_y.z, s);"));
        assert_eq!(
            g.spec.signature(),
            "extern \"C\" void launch(const float* x, const float* y, float* out, float s, int64_t n, cudaStream_t stream)"
        );
        let sq = E::Un(Un::Square, Box::new(E::Var("x")));
        let r = row_reduce("gen_rr_x", Red::Mean, &sq, None, &ROW_KERNELS, 512);
        assert_eq!(r.spec.reference["out"], "mean(x * x, 1)");
        assert!(r.naive.contains("double acc = 0.0f;"));
        assert!(r.naive.contains("acc = acc + (double)(v * v);"));
        assert!(r.naive.contains("out[r] = (float)(acc / (double)cols);"));
        let mx = row_reduce("gen_rr_y", Red::Max, &sq, None, &ROW_KERNELS, 512);
        assert!(mx.naive.contains("float acc = -INFINITY;"));
        assert!(mx.naive.contains("acc = fmaxf(acc, (v * v));"));
        assert_eq!(
            r.spec.optimized,
            ["block_per_row.cu", "warp_per_row.cu", "block_vec4.cu"]
        );
        for (file, src) in &r.optimized {
            assert!(src.contains("__shfl_xor_sync"), "{file}");
            assert!(src.contains("acc = row_combine(acc, v * v);"), "{file}");
            assert!(src.contains("out[r] = acc / (float)cols;"), "{file}");
        }
        assert!(
            r.optimized[0]
                .1
                .contains("cols >= 4096 ? 512 : (cols >= 512 ? 256 : 64)")
        );
        assert!(r.optimized[2].1.contains("float4"));
        assert_eq!(
            r.spec.description,
            "out[r] = mean over c of x[r*cols + c] * x[r*cols + c] (the sum divided by cols), for r in [0, rows)"
        );
        // Negation parenthesizes compound operands.
        let n = E::Un(
            Un::Neg,
            Box::new(E::Bin('-', Box::new(E::Var("x")), Box::new(E::Num("0.5")))),
        );
        assert_eq!(render(&n, Lang::Ref), "-(x - 0.5)");
        let idx = |v: &str| format!("{v}[i]");
        assert_eq!(render(&n, Lang::C(&idx)), "-(x[i] - 0.5f)");
    }

    /// Every template through real nvcc (sm_90): a row reduction and elementwise families with
    /// and without `y` and `s`, naive and optimized. Skipped (visibly) without nvcc unless
    /// `CUDARL_REQUIRE_NVCC` is set.
    #[test]
    fn generated_kernels_compile_with_nvcc() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let Some(nvcc) = cudarl_cuda::Nvcc::discover_or_skip(&root) else {
            return;
        };
        let mut gs = generate(&params(12, 2), &BTreeSet::new());
        // Every row kernel, with a scalar in the map.
        let e = E::Bin('*', Box::new(E::Var("s")), Box::new(E::Var("x")));
        gs.insert(
            0,
            row_reduce("gen_rr_x", Red::Max, &e, Some(0), &ROW_KERNELS, 1024),
        );
        let mut kinds = BTreeSet::new();
        let picked: Vec<&Family> = gs
            .iter()
            .filter(|g| {
                let k = (
                    g.spec.tier,
                    g.spec.args.iter().any(|a| a.name == "y"),
                    g.spec.args.iter().any(|a| a.name == "s"),
                );
                kinds.insert(k)
            })
            .collect();
        assert!(picked.len() >= 4, "{kinds:?}");
        let dir = tempfile::tempdir().expect("tempdir");
        for g in picked {
            for (name, src) in std::iter::once(("naive.cu".to_string(), g.naive.clone()))
                .chain(g.optimized.iter().cloned())
            {
                let f = dir.path().join(format!("{}_{name}", g.spec.id));
                std::fs::write(&f, format!("{src}{}", g.spec.shim())).expect("write");
                let out = std::process::Command::new(&nvcc.path)
                    .args(["-arch=sm_90", "-c", "-o"])
                    .arg(dir.path().join("k.o"))
                    .arg(&f)
                    .output()
                    .expect("nvcc runs");
                assert!(
                    out.status.success(),
                    "{} {name}: {}",
                    g.spec.id,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}
