//! `validations` (stage `validate`): one row per kernel judged, the task kernels' or the
//! archives'.

use serde::{Deserialize, Serialize};

/// One row of `validations`.
///
/// | column | type | meaning |
/// |---|---|---|
/// | kernel_id, task_id, role | utf8 | the kernel (from the input table) |
/// | mode | utf8 | `compile-only` or `full` |
/// | compiled, executed | bool | |
/// | correct | bool, nullable | null when not executed |
/// | failure, failure_detail | utf8, nullable | see `Verdict::failure` |
/// | static_flags, hack_flags | `list<utf8>` | rule ids / run-time hack indicators |
/// | registers | int64, nullable | max registers per thread over the kernels |
/// | shared_mem_bytes, spill_bytes | int64, nullable | max static smem per block; spill stores + loads, bytes |
/// | tests, tests_passed | int64 | shapes × seeds run / passed |
/// | max_abs_err, max_rel_err | float64, nullable | over all tests |
/// | median_ms, p10_ms, p90_ms, cv | float64, nullable | timing of the candidate |
/// | speedup_vs_naive | float64, nullable | naive median / candidate median |
/// | torch_median_ms | float64, nullable | the task's reference in libtorch (f32), same shape |
/// | speedup_vs_torch | float64, nullable | torch median / candidate median |
/// | dram_fraction_of_peak | float64, nullable | roofline bound / median |
/// | gpu, nvcc, arch | utf8 | environment (gpu null without one) |
/// | verdict_json | utf8 | the full verdict, less what describes this run rather than the kernel (nvcc wall time, compile cache hit, the .so digest), so compile-only validations are identical across clean stores (GPU timings are measurements and differ) |
/// | source | utf8 | `synth` (a task kernel), `sakana` or `cuda-l1` |
/// | claimed_correct | bool, nullable | an archive kernel's claim |
/// | claimed_speedup | float64, nullable | an archive kernel's claimed speedup over torch eager |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationRow {
    /// The kernel.
    pub kernel_id: String,
    /// Its task (or KernelBench problem).
    pub task_id: String,
    /// `naive`, `optimized` or an archive's role.
    pub role: String,
    /// `compile-only` or `full`.
    pub mode: String,
    /// nvcc built it.
    pub compiled: bool,
    /// It ran.
    pub executed: bool,
    /// It passed every test (null when it did not run).
    pub correct: Option<bool>,
    /// Why not.
    pub failure: Option<String>,
    /// The failure's detail.
    pub failure_detail: Option<String>,
    /// Static rule ids that fired.
    pub static_flags: Vec<String>,
    /// Run-time hack indicators.
    pub hack_flags: Vec<String>,
    /// Max registers per thread.
    pub registers: Option<i64>,
    /// Max static shared memory per block, bytes.
    pub shared_mem_bytes: Option<i64>,
    /// Spill stores and loads, bytes.
    pub spill_bytes: Option<i64>,
    /// Tests run.
    pub tests: i64,
    /// Tests passed.
    pub tests_passed: i64,
    /// Max absolute error.
    pub max_abs_err: Option<f64>,
    /// Max relative error.
    pub max_rel_err: Option<f64>,
    /// Median, ms.
    pub median_ms: Option<f64>,
    /// 10th percentile, ms.
    pub p10_ms: Option<f64>,
    /// 90th percentile, ms.
    pub p90_ms: Option<f64>,
    /// Coefficient of variation.
    pub cv: Option<f64>,
    /// Naive median / candidate median.
    pub speedup_vs_naive: Option<f64>,
    /// The reference in libtorch, ms.
    pub torch_median_ms: Option<f64>,
    /// Torch median / candidate median.
    pub speedup_vs_torch: Option<f64>,
    /// Roofline bound / median.
    pub dram_fraction_of_peak: Option<f64>,
    /// The GPU.
    pub gpu: Option<String>,
    /// nvcc's version.
    pub nvcc: String,
    /// The SASS architecture.
    pub arch: String,
    /// The verdict (JSON).
    pub verdict_json: String,
    /// `synth`, `sakana` or `cuda-l1`.
    pub source: String,
    /// An archive kernel's claim.
    pub claimed_correct: Option<bool>,
    /// An archive kernel's claimed speedup.
    pub claimed_speedup: Option<f64>,
}

crate::table_row!(ValidationRow, "validations");

/// One row of `agreement`: an archive kernel (SakanaAI sample, CUDA-L1), our verdict beside the
/// archive's claim.
///
/// | column | type | meaning |
/// |---|---|---|
/// | kernel_id, task_id, source | utf8 | the kernel, its KernelBench problem, `sakana` or `cuda-l1` |
/// | claimed_correct | bool, nullable | the archive's verdict (SakanaAI `Correct`; CUDA-L1: a score exists) |
/// | our_correct | bool, nullable | ours (null: not executed, e.g. no GPU or the build was skipped) |
/// | agree | bool, nullable | both verdicts known and equal |
/// | our_reason | utf8, nullable | our failure and its detail (at most 300 bytes) |
/// | their_reason | utf8, nullable | the archive's error text (first line that says what failed) |
/// | claimed_speedup, our_speedup_vs_torch | float64, nullable | their speedup over torch eager / ours (same problem, full sizes, our GPU) |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgreementRow {
    /// The kernel.
    pub kernel_id: String,
    /// Its KernelBench problem.
    pub task_id: String,
    /// `sakana` or `cuda-l1`.
    pub source: String,
    /// The archive's verdict.
    pub claimed_correct: Option<bool>,
    /// Ours.
    pub our_correct: Option<bool>,
    /// Both known and equal.
    pub agree: Option<bool>,
    /// Our failure and its detail.
    pub our_reason: Option<String>,
    /// The archive's error text.
    pub their_reason: Option<String>,
    /// Their speedup over torch eager.
    pub claimed_speedup: Option<f64>,
    /// Ours over torch eager.
    pub our_speedup_vs_torch: Option<f64>,
}

crate::table_row!(AgreementRow, "agreement");

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;

    /// `agreement`'s traced schema is the one the stage wrote column by column before.
    #[test]
    fn agreement_schema_is_the_stages_own() {
        let (s, b, f) = (DataType::Utf8, DataType::Boolean, DataType::Float64);
        crate::assert_columns::<AgreementRow>(&[
            ("kernel_id", s.clone(), false),
            ("task_id", s.clone(), false),
            ("source", s.clone(), false),
            ("claimed_correct", b.clone(), true),
            ("our_correct", b.clone(), true),
            ("agree", b, true),
            ("our_reason", s.clone(), true),
            ("their_reason", s, true),
            ("claimed_speedup", f.clone(), true),
            ("our_speedup_vs_torch", f, true),
        ]);
    }
}
