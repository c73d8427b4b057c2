//! `curriculum`, `gates` and `validated_kernels` (stage `curriculum`): every problem and task
//! family with its tier, split and what the archives and the harness say of it; the thresholds
//! that open each tier; and every kernel the harness ran and found correct.

use serde::{Deserialize, Serialize};

/// One row of `curriculum`: a KernelBench problem or a synthetic task family.
///
/// | column | type | meaning |
/// |---|---|---|
/// | problem_id | utf8 | `kb/L{level}/{name}`, or `synth/<task>` for a family |
/// | source | utf8 | `kernelbench` or `synthetic` |
/// | level | int64, nullable | KernelBench level |
/// | name | utf8 | problem name |
/// | tier | int64 | 0 elementwise, 1 reduction/data movement, 2 tiled/normalizing, 3 fused |
/// | tier_reason | utf8 | why this tier |
/// | op_features | `list<utf8>` | ops from the reference |
/// | op_categories | `list<utf8>` | categories of those ops |
/// | unknown_ops | `list<utf8>` | ops with no category (tiered conservatively) |
/// | split | utf8 | the `splits` table's: `train`, `val` or `test`; synthetic families `train`, `rl` (kept out of SFT and pretraining for `rl-train`) or `test` (the hold-out families) |
/// | archive_kernels | int64 | kernels for this problem in the ingested archives |
/// | archive_claimed_correct | int64 | of those, claimed correct by their archive |
/// | archive_best_claimed_speedup | float64, nullable | best claimed speedup vs PyTorch eager among claimed-correct kernels with a `__global__` kernel (ratio; not validated here) |
/// | archive_reference_drift | bool | some archive kernel was written against a different reference than `problems.code` |
/// | signature | utf8, nullable | the native launcher of a synthetic task, or of a KernelBench problem covered by `kb-specs` |
/// | train_shapes, holdout_shapes | utf8, nullable | JSON lists of size maps (synthetic tasks: hold-out shapes are never shown in prompts) |
/// | validated_kernels | int64 | kernels of this problem the harness ran and found correct on every seed and shape |
/// | best_validated_speedup | float64, nullable | best measured speedup among them: vs the naive kernel (synthetic tasks), vs torch eager (KernelBench problems) |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurriculumRow {
    /// `kb/L{level}/{name}` or `synth/<task>`.
    pub problem_id: String,
    /// `kernelbench` or `synthetic`.
    pub source: String,
    /// KernelBench level.
    pub level: Option<i64>,
    /// Problem name.
    pub name: String,
    /// Tier 0..3.
    pub tier: i64,
    /// Why this tier.
    pub tier_reason: String,
    /// Ops of the reference.
    pub op_features: Vec<String>,
    /// Their categories.
    pub op_categories: Vec<String>,
    /// Ops without a category.
    pub unknown_ops: Vec<String>,
    /// The split.
    pub split: String,
    /// Archive kernels of the problem.
    pub archive_kernels: i64,
    /// Of them, claimed correct.
    pub archive_claimed_correct: i64,
    /// Best claimed speedup vs torch eager.
    pub archive_best_claimed_speedup: Option<f64>,
    /// Some archive kernel was written against another reference.
    pub archive_reference_drift: bool,
    /// The native launcher.
    pub signature: Option<String>,
    /// Train shapes (JSON).
    pub train_shapes: Option<String>,
    /// Hold-out shapes (JSON).
    pub holdout_shapes: Option<String>,
    /// Kernels found correct on every seed and shape.
    pub validated_kernels: i64,
    /// Best measured speedup among them.
    pub best_validated_speedup: Option<f64>,
}

crate::table_row!(CurriculumRow, "curriculum");

/// One row of `gates`: a tier, the thresholds that open the next one, and its problem counts.
///
/// | column | type | meaning |
/// |---|---|---|
/// | tier | int64 | 0..3 |
/// | min_compile_rate | float64 | compile rate on this tier must exceed this to open tier+1 |
/// | min_pass_rate | float64 | pass rate on this tier must exceed this to open tier+1 |
/// | problems, train, val, test | int64 | problem counts |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateRow {
    /// Tier 0..3.
    pub tier: i64,
    /// Compile rate that opens the next tier.
    pub min_compile_rate: f64,
    /// Pass rate that opens the next tier.
    pub min_pass_rate: f64,
    /// Problems of the tier.
    pub problems: i64,
    /// Of them in `train` (families: `train` and `rl`).
    pub train: i64,
    /// In `val`.
    pub val: i64,
    /// In `test`.
    pub test: i64,
}

crate::table_row!(GateRow, "gates");

/// One row of `validated_kernels`: a kernel the harness ran and found correct on every train
/// and hold-out shape and every public and hidden seed (none without a GPU: compile-only
/// verdicts validate nothing).
///
/// | column | type | meaning |
/// |---|---|---|
/// | kernel_id | utf8 | BLAKE3 of the code |
/// | problem_id | utf8 | curriculum row (`synth/<task>`) |
/// | role | utf8 | `naive` or `optimized` |
/// | tests | int64 | shapes x seeds run (all passed) |
/// | median_ms | float64 | candidate median |
/// | speedup_vs_naive, speedup_vs_torch | float64, nullable | measured ratios |
/// | gpu | utf8 | the GPU |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidatedKernelRow {
    /// BLAKE3 of the code.
    pub kernel_id: String,
    /// `synth/<task>`.
    pub problem_id: String,
    /// `naive` or `optimized`.
    pub role: String,
    /// Shapes x seeds run.
    pub tests: i64,
    /// Median, ms.
    pub median_ms: f64,
    /// Against the naive kernel.
    pub speedup_vs_naive: Option<f64>,
    /// Against torch eager.
    pub speedup_vs_torch: Option<f64>,
    /// The GPU.
    pub gpu: String,
}

crate::table_row!(ValidatedKernelRow, "validated_kernels");
