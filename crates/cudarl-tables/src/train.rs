//! The model stages' tables (`tokenizer`, `pretrain`, `sft-train`, `sft-train-optimizer`):
//! [`TrainMetricsRow`], one per optimizer step, and [`CorpusRow`], one per document the trainer
//! reads.

use serde::{Deserialize, Serialize};

/// One row of `metrics`: an optimizer step of pretraining or SFT.
///
/// | column | type | meaning |
/// |---|---|---|
/// | step, epoch | int64 | the step (from 1) and its epoch (from 0) |
/// | loss | float64 | nats per trained token |
/// | lr, grad_norm | float64 | the learning rate and the gradient's global L2 norm before clipping |
/// | tokens | int64 | trained tokens of the step |
/// | tokens_per_s | float64 | all tokens of the step per second |
/// | eval_loss | float64, nullable | the held-out loss where it was measured |
/// | device | utf8 | `cuda` or `cpu` |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainMetricsRow {
    /// The step.
    pub step: i64,
    /// Its epoch.
    pub epoch: i64,
    /// Nats per trained token.
    pub loss: f64,
    /// The learning rate.
    pub lr: f64,
    /// The gradient norm.
    pub grad_norm: f64,
    /// Trained tokens.
    pub tokens: i64,
    /// All tokens per second.
    pub tokens_per_s: f64,
    /// The held-out loss.
    pub eval_loss: Option<f64>,
    /// `cuda` or `cpu`.
    pub device: String,
}

crate::table_row!(TrainMetricsRow, "metrics");

/// One row of `corpus`: a document the trainer reads (the `train` split alone).
///
/// | column | type | meaning |
/// |---|---|---|
/// | kind | utf8 | `task_kernel`, `kernelbench` or `copy_document` |
/// | item_id | utf8, nullable | `synth/<task_id>` or the problem id; null for copy documents |
/// | line | utf8 | the JSON line the trainer reads, a string or a list of chat messages |
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorpusRow {
    /// `task_kernel`, `kernelbench` or `copy_document`.
    pub kind: String,
    /// The family or problem it comes from.
    pub item_id: Option<String>,
    /// The trainer's JSON line.
    pub line: String,
}

crate::table_row!(CorpusRow, "corpus");

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;

    /// The traced schemas are the ones the stages wrote column by column before: the same
    /// Parquet bytes.
    #[test]
    fn traced_schemas_are_the_stages_own() {
        use DataType::{Float64, Int64, Utf8};
        crate::assert_columns::<TrainMetricsRow>(&[
            ("step", Int64, false),
            ("epoch", Int64, false),
            ("loss", Float64, false),
            ("lr", Float64, false),
            ("grad_norm", Float64, false),
            ("tokens", Int64, false),
            ("tokens_per_s", Float64, false),
            ("eval_loss", Float64, true),
            ("device", Utf8, false),
        ]);
        crate::assert_columns::<CorpusRow>(&[
            ("kind", Utf8, false),
            ("item_id", Utf8, true),
            ("line", Utf8, false),
        ]);
    }
}
