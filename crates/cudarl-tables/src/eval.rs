//! The hold-out evaluation's episodes (stage `eval`): [`EvalEpisodeRow`], one per episode of
//! every checkpoint on every split.

use serde::{Deserialize, Serialize};

/// One row of `episodes`: an episode of a checkpoint, its first turn and its best.
///
/// | column | type | meaning |
/// |---|---|---|
/// | checkpoint, split | utf8 | `sft`, `collab` or `rl`; the split (`test`, `kernelbench/level1`, ...) |
/// | task_id | utf8 | the family or KernelBench problem |
/// | tier, episode, turns | int64 | its tier; the episode's index in the stage's order; turns taken |
/// | first_compiled | bool | the first turn compiled |
/// | first_correct | bool, nullable | the first turn passed (null: compile-only) |
/// | compiled | bool | the best turn compiled |
/// | correct | bool, nullable | the best turn passed (null: compile-only) |
/// | speedup_vs_naive, speedup_vs_torch, speedup_vs_torch_compile | float64, nullable | the best turn's speedups (a correct, timed kernel only) |
/// | reward | float64 | the episode's final reward |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalEpisodeRow {
    /// `sft`, `collab` or `rl`.
    pub checkpoint: String,
    /// The split.
    pub split: String,
    /// The family or problem.
    pub task_id: String,
    /// Its tier.
    pub tier: i64,
    /// The episode's index.
    pub episode: i64,
    /// Turns taken.
    pub turns: i64,
    /// The first turn compiled.
    pub first_compiled: bool,
    /// The first turn passed.
    pub first_correct: Option<bool>,
    /// The best turn compiled.
    pub compiled: bool,
    /// The best turn passed.
    pub correct: Option<bool>,
    /// Speedup vs the naive kernel.
    pub speedup_vs_naive: Option<f64>,
    /// Speedup vs torch eager.
    pub speedup_vs_torch: Option<f64>,
    /// Speedup vs `torch.compile`.
    pub speedup_vs_torch_compile: Option<f64>,
    /// The final reward.
    pub reward: f64,
}

crate::table_row!(EvalEpisodeRow, "episodes");

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;

    /// The traced schema is the one the stage wrote column by column before: the same bytes.
    #[test]
    fn traced_schema_is_the_stages_own() {
        use DataType::{Boolean, Float64, Int64, Utf8};
        crate::assert_columns::<EvalEpisodeRow>(&[
            ("checkpoint", Utf8, false),
            ("split", Utf8, false),
            ("task_id", Utf8, false),
            ("tier", Int64, false),
            ("episode", Int64, false),
            ("turns", Int64, false),
            ("first_compiled", Boolean, false),
            ("first_correct", Boolean, true),
            ("compiled", Boolean, false),
            ("correct", Boolean, true),
            ("speedup_vs_naive", Float64, true),
            ("speedup_vs_torch", Float64, true),
            ("speedup_vs_torch_compile", Float64, true),
            ("reward", Float64, false),
        ]);
    }
}
