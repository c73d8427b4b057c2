//! The archives' kernels in the native ABI (stage `archive-native`): [`ArchiveNativeRow`], one
//! per archive kernel of the curriculum's KernelBench problems, and [`ArchiveSummaryRow`], the
//! counts per source. `sft-data` reads the first for its archive examples.

use serde::{Deserialize, Serialize};

/// One row of `archive_native`: an archive kernel (SakanaAI, CUDA-L1) put in its problem's
/// native ABI and judged like any native candidate.
///
/// | column | type | meaning |
/// |---|---|---|
/// | kernel_id | utf8 | the archive row's kernel id |
/// | source | utf8 | `sakana` or `cuda-l1` |
/// | problem_id, split | utf8 | the KernelBench problem and its curriculum split |
/// | tier | int64 | its curriculum tier |
/// | converted | bool | the native ABI was derived mechanically |
/// | reason | utf8, nullable | why not, or why the judge failed it |
/// | code | utf8, nullable | the native candidate |
/// | compiled | bool | it built against the launcher |
/// | correct | bool, nullable | it passed the recorded tests (null: compile-only) |
/// | median_ms | float64, nullable | its median time at the problem's own sizes (ms) |
/// | speedup_vs_torch | float64, nullable | torch eager median / its median |
/// | validated | utf8 | `correct`, `compile-only` (built; no GPU) or `failed` |
/// | feedback | utf8, nullable | the tester's words on it, as RL's optimizer reads them |
/// | description, signature | utf8 | the problem as the agents' prompts show it |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchiveNativeRow {
    /// The archive row's kernel id.
    pub kernel_id: String,
    /// `sakana` or `cuda-l1`.
    pub source: String,
    /// The KernelBench problem.
    pub problem_id: String,
    /// Its curriculum split.
    pub split: String,
    /// Its curriculum tier.
    pub tier: i64,
    /// The native ABI was derived mechanically.
    pub converted: bool,
    /// Why not, or why the judge failed it.
    pub reason: Option<String>,
    /// The native candidate.
    pub code: Option<String>,
    /// It built against the launcher.
    pub compiled: bool,
    /// It passed the recorded tests (`None`: compile-only).
    pub correct: Option<bool>,
    /// Median time at the problem's own sizes, ms.
    pub median_ms: Option<f64>,
    /// Torch eager median / its median.
    pub speedup_vs_torch: Option<f64>,
    /// `correct`, `compile-only` or `failed`.
    pub validated: String,
    /// The tester's words on it.
    pub feedback: Option<String>,
    /// The problem's description as prompts show it.
    pub description: String,
    /// The problem's launcher signature.
    pub signature: String,
}

crate::table_row!(ArchiveNativeRow, "archive_native");

/// One row of `archive-native`'s `summary`: the counts of one source.
///
/// | column | type | meaning |
/// |---|---|---|
/// | source | utf8 | `sakana` or `cuda-l1` |
/// | rows | int64 | its kernels of the curriculum's problems |
/// | converted, compiled, correct | int64 | of those, converted to the native ABI, built, correct |
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveSummaryRow {
    /// `sakana` or `cuda-l1`.
    pub source: String,
    /// Its kernels.
    pub rows: i64,
    /// Converted.
    pub converted: i64,
    /// Built.
    pub compiled: i64,
    /// Correct.
    pub correct: i64,
}

crate::table_row!(ArchiveSummaryRow, "summary");

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;

    /// The traced schemas are the ones the stage wrote column by column before: the same
    /// Parquet bytes.
    #[test]
    fn traced_schemas_are_the_stages_own() {
        use DataType::{Boolean, Float64, Int64, Utf8};
        crate::assert_columns::<ArchiveNativeRow>(&[
            ("kernel_id", Utf8, false),
            ("source", Utf8, false),
            ("problem_id", Utf8, false),
            ("split", Utf8, false),
            ("tier", Int64, false),
            ("converted", Boolean, false),
            ("reason", Utf8, true),
            ("code", Utf8, true),
            ("compiled", Boolean, false),
            ("correct", Boolean, true),
            ("median_ms", Float64, true),
            ("speedup_vs_torch", Float64, true),
            ("validated", Utf8, false),
            ("feedback", Utf8, true),
            ("description", Utf8, false),
            ("signature", Utf8, false),
        ]);
        crate::assert_columns::<ArchiveSummaryRow>(&[
            ("source", Utf8, false),
            ("rows", Int64, false),
            ("converted", Int64, false),
            ("compiled", Int64, false),
            ("correct", Int64, false),
        ]);
    }
}
