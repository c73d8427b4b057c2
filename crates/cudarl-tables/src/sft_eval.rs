//! The generator after SFT on the hold-out families (stage `sft-eval`): [`SftSampleRow`], one
//! per completion, and [`SftEvalRow`], the compile rate per task.

use serde::{Deserialize, Serialize};

/// One row of `samples`: a completion of the RL prompt and what the harness's static rules and
/// nvcc made of its code block.
///
/// | column | type | meaning |
/// |---|---|---|
/// | task_id | utf8 | the hold-out family |
/// | sample | int64 | the completion's index for the task |
/// | text | utf8 | the completion |
/// | code | utf8, nullable | its extracted code block |
/// | tokens | int64 | tokens generated |
/// | finish | utf8 | `Eos` or `Length` |
/// | compiled | bool | the block passed the static rules and nvcc |
/// | failure | utf8, nullable | `no_code`, `static_reject`, `compile_error`, ... |
/// | detail | utf8, nullable | the failure's detail (at most 2,000 characters) |
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SftSampleRow {
    /// The hold-out family.
    pub task_id: String,
    /// The completion's index.
    pub sample: i64,
    /// The completion.
    pub text: String,
    /// Its code block.
    pub code: Option<String>,
    /// Tokens generated.
    pub tokens: i64,
    /// `Eos` or `Length`.
    pub finish: String,
    /// It compiled.
    pub compiled: bool,
    /// Why not.
    pub failure: Option<String>,
    /// The failure's detail.
    pub detail: Option<String>,
}

crate::table_row!(SftSampleRow, "samples");

/// One row of `sft_eval`: a hold-out family's compile rate after SFT.
///
/// | column | type | meaning |
/// |---|---|---|
/// | task_id | utf8 | the hold-out family |
/// | tier | int64 | its tier |
/// | samples, with_code, compiled | int64 | completions, those with a code block, those that compiled |
/// | compile_rate | float64 | compiled / samples |
/// | mode | utf8 | `compile-only` |
/// | device | utf8 | `cuda` or `cpu`, where the generator sampled |
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SftEvalRow {
    /// The hold-out family.
    pub task_id: String,
    /// Its tier.
    pub tier: i64,
    /// Completions.
    pub samples: i64,
    /// Those with a code block.
    pub with_code: i64,
    /// Those that compiled.
    pub compiled: i64,
    /// `compiled / samples`.
    pub compile_rate: f64,
    /// `compile-only`.
    pub mode: String,
    /// `cuda` or `cpu`.
    pub device: String,
}

crate::table_row!(SftEvalRow, "sft_eval");

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;

    /// The traced schemas are the ones the stage wrote column by column before: the same
    /// Parquet bytes.
    #[test]
    fn traced_schemas_are_the_stages_own() {
        use DataType::{Boolean, Float64, Int64, Utf8};
        crate::assert_columns::<SftSampleRow>(&[
            ("task_id", Utf8, false),
            ("sample", Int64, false),
            ("text", Utf8, false),
            ("code", Utf8, true),
            ("tokens", Int64, false),
            ("finish", Utf8, false),
            ("compiled", Boolean, false),
            ("failure", Utf8, true),
            ("detail", Utf8, true),
        ]);
        crate::assert_columns::<SftEvalRow>(&[
            ("task_id", Utf8, false),
            ("tier", Int64, false),
            ("samples", Int64, false),
            ("with_code", Int64, false),
            ("compiled", Int64, false),
            ("compile_rate", Float64, false),
            ("mode", Utf8, false),
            ("device", Utf8, false),
        ]);
    }
}
