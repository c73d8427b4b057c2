//! RL's per-step tables (stage `rl-train`): [`RlMetricsRow`], one per step, and [`RlTierRow`],
//! one per tier opened. The eval report reads `metrics` for its reward curve.

use serde::{Deserialize, Serialize};

/// One row of `metrics`: one RL step.
///
/// | column | type | meaning |
/// |---|---|---|
/// | step | int64 | the RL step (from 1) |
/// | tier | int64 | the highest open tier |
/// | episodes | int64 | episodes this step |
/// | mean_reward, reward_std | float64 | final reward per episode: mean and standard deviation |
/// | compile_rate | float64 | share of episodes whose best turn compiled |
/// | pass_rate | float64, nullable | share whose best turn passed (null in compile-only mode) |
/// | first_turn_compile_rate | float64 | share whose first turn compiled |
/// | speedup | float64, nullable | geometric mean speedup vs naive of the correct finals |
/// | turns_used | float64 | mean turns per episode |
/// | kl, entropy | float64 | the generator update's KL to the reference and entropy (nats per token) |
/// | optimizer_kl | float64 | the optimizer update's KL to the reference |
/// | gen_seconds, harness_seconds, update_seconds | float64 | wall seconds of generation, the harness and the update |
/// | harness_ms_per_candidate, compile_overlap | float64 | harness ms per candidate; share of the candidates whose build a prefetch started while the batch still decoded |
/// | harness_compile_seconds, harness_gpu_seconds, harness_sass_seconds | float64 | the harness seconds by phase |
/// | verdict_reuse | float64 | share of the step's candidates answered from a verdict earlier in the run |
/// | signal_groups, optimizer_signal_groups | float64 | share of each agent's GRPO groups whose values differ at all |
/// | value_loss, optimizer_value_loss | float64, nullable | PPO's value loss per agent |
/// | max_approx_kl, optimizer_max_approx_kl | float64 | largest approximate KL from the generating policy, nats per token |
/// | max_ref_log_ratio, optimizer_max_ref_log_ratio | float64 | largest per-token log-ratio to the reference, nats |
/// | aux_scale, optimizer_aux_scale, max_aux_grad_ratio, optimizer_max_aux_grad_ratio | float64, nullable | how `aux_grad_cap` scaled the KL and PPO-ptx gradient, and its largest norm ratio to the policy gradient |
/// | skipped_minibatches, optimizer_skipped_minibatches | int64 | minibatches `target_kl` left unstepped |
/// | update_steps, optimizer_update_steps | int64 | AdamW steps of each agent's update |
/// | ptx_loss, optimizer_ptx_loss | float64, nullable | PPO-ptx's SFT cross-entropy, nats per assistant token (`ptx_coef`) |
/// | algorithm | utf8 | `grpo` or `ppo` |
/// | control_reward, control_compile_rate, control_pass_rate, control_seconds | float64, nullable | the frozen reference policies on the step's tasks and sampling seeds (`control = true`): mean final reward, rates of the best turns, wall seconds |
/// | reward_by_tier_json | utf8 | `{"<tier>": mean final reward of the step's episodes of that tier}` |
/// | mode, device | utf8 | `full` or `compile-only`; `cuda` or `cpu` |
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RlMetricsRow {
    /// See the table above.
    pub step: i64,
    /// See the table above.
    pub tier: i64,
    /// See the table above.
    pub episodes: i64,
    /// See the table above.
    pub mean_reward: f64,
    /// See the table above.
    pub reward_std: f64,
    /// See the table above.
    pub compile_rate: f64,
    /// See the table above.
    pub pass_rate: Option<f64>,
    /// See the table above.
    pub first_turn_compile_rate: f64,
    /// See the table above.
    pub speedup: Option<f64>,
    /// See the table above.
    pub turns_used: f64,
    /// See the table above.
    pub kl: f64,
    /// See the table above.
    pub entropy: f64,
    /// See the table above.
    pub optimizer_kl: f64,
    /// See the table above.
    pub gen_seconds: f64,
    /// See the table above.
    pub harness_seconds: f64,
    /// See the table above.
    pub update_seconds: f64,
    /// See the table above.
    pub harness_ms_per_candidate: f64,
    /// See the table above.
    pub compile_overlap: f64,
    /// See the table above.
    pub harness_compile_seconds: f64,
    /// See the table above.
    pub harness_gpu_seconds: f64,
    /// See the table above.
    pub harness_sass_seconds: f64,
    /// See the table above.
    pub verdict_reuse: f64,
    /// See the table above.
    pub signal_groups: f64,
    /// See the table above.
    pub optimizer_signal_groups: f64,
    /// See the table above.
    pub value_loss: Option<f64>,
    /// See the table above.
    pub optimizer_value_loss: Option<f64>,
    /// See the table above.
    pub max_approx_kl: f64,
    /// See the table above.
    pub optimizer_max_approx_kl: f64,
    /// See the table above.
    pub max_ref_log_ratio: f64,
    /// See the table above.
    pub optimizer_max_ref_log_ratio: f64,
    /// See the table above.
    pub aux_scale: Option<f64>,
    /// See the table above.
    pub optimizer_aux_scale: Option<f64>,
    /// See the table above.
    pub max_aux_grad_ratio: Option<f64>,
    /// See the table above.
    pub optimizer_max_aux_grad_ratio: Option<f64>,
    /// See the table above.
    pub skipped_minibatches: i64,
    /// See the table above.
    pub optimizer_skipped_minibatches: i64,
    /// See the table above.
    pub update_steps: i64,
    /// See the table above.
    pub optimizer_update_steps: i64,
    /// See the table above.
    pub ptx_loss: Option<f64>,
    /// See the table above.
    pub optimizer_ptx_loss: Option<f64>,
    /// See the table above.
    pub algorithm: String,
    /// See the table above.
    pub control_reward: Option<f64>,
    /// See the table above.
    pub control_compile_rate: Option<f64>,
    /// See the table above.
    pub control_pass_rate: Option<f64>,
    /// See the table above.
    pub control_seconds: Option<f64>,
    /// See the table above.
    pub reward_by_tier_json: String,
    /// See the table above.
    pub mode: String,
    /// See the table above.
    pub device: String,
}

crate::table_row!(RlMetricsRow, "metrics");

/// One row of `tiers`: a tier and when the curriculum's gate opened it.
///
/// | column | type | meaning |
/// |---|---|---|
/// | tier | int64 | the tier |
/// | opened_at_step | int64 | the step that opened it (0: open from the start) |
/// | compile_rate, pass_rate | float64, nullable | the rates of the tier below that opened it |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RlTierRow {
    /// The tier.
    pub tier: i64,
    /// The step that opened it (0: from the start).
    pub opened_at_step: i64,
    /// The compile rate that opened it.
    pub compile_rate: Option<f64>,
    /// The pass rate that opened it.
    pub pass_rate: Option<f64>,
}

crate::table_row!(RlTierRow, "tiers");

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;
    use crate::TableRow;

    /// The traced schemas are the ones the stage wrote column by column before (the same
    /// Parquet bytes): its integers, strings and nullable floats where it had them.
    #[test]
    fn traced_schemas_are_the_stages_own() {
        let ints = [
            "step",
            "tier",
            "episodes",
            "skipped_minibatches",
            "optimizer_skipped_minibatches",
            "update_steps",
            "optimizer_update_steps",
        ];
        let strings = ["algorithm", "reward_by_tier_json", "mode", "device"];
        let nullable = [
            "pass_rate",
            "speedup",
            "value_loss",
            "optimizer_value_loss",
            "aux_scale",
            "optimizer_aux_scale",
            "max_aux_grad_ratio",
            "optimizer_max_aux_grad_ratio",
            "ptx_loss",
            "optimizer_ptx_loss",
            "control_reward",
            "control_compile_rate",
            "control_pass_rate",
            "control_seconds",
        ];
        let s = RlMetricsRow::schema();
        assert_eq!(s.fields().len(), 48);
        for f in s.fields() {
            let n = f.name().as_str();
            let want = if ints.contains(&n) {
                DataType::Int64
            } else if strings.contains(&n) {
                DataType::Utf8
            } else {
                DataType::Float64
            };
            assert_eq!(f.data_type(), &want, "{n}");
            assert_eq!(f.is_nullable(), nullable.contains(&n), "{n}");
        }
        crate::assert_columns::<RlTierRow>(&[
            ("tier", DataType::Int64, false),
            ("opened_at_step", DataType::Int64, false),
            ("compile_rate", DataType::Float64, true),
            ("pass_rate", DataType::Float64, true),
        ]);
    }
}
