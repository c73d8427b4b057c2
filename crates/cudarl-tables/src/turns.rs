//! What each agent wrote and what the tester said, one row per turn: `rl-train`'s `turns`
//! ([`RlTurnRow`], keyed by step and episode), `eval`'s ([`EvalTurnRow`], keyed by checkpoint,
//! split and episode) and `optimize`'s ([`OptimizeTurnRow`], keyed by problem and episode), all
//! ending with the same columns ([`TurnColumns`]).

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::TableRow;

/// The columns of a turn, after its table's key columns.
///
/// | column | type | meaning |
/// |---|---|---|
/// | turn | int64 | the turn's index in its episode (0: the generator's answer) |
/// | task_id | utf8 | the family or KernelBench problem |
/// | tier | int64 | its tier |
/// | role | utf8 | `generator` or `optimizer` |
/// | tokens | int64 | tokens generated |
/// | text | utf8 | the answer as generated |
/// | code | utf8, nullable | the code extracted from it (null: no code block) |
/// | failure | utf8, nullable | the harness's failure class (`no_code` without code) |
/// | feedback | utf8 | what the tester said |
/// | reward | float64 | the turn's reward |
/// | credit | float64 | the credit it was trained with (returns-to-go by default) |
/// | advantage | float64 | its advantage in the update (0 where nothing trains: `eval`) |
/// | value | float64, nullable | PPO: the critic's estimate before the turn |
/// | components_json | utf8 | every reward component |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnColumns {
    /// The turn's index in its episode.
    pub turn: i64,
    /// The family or problem.
    pub task_id: String,
    /// Its tier.
    pub tier: i64,
    /// `generator` or `optimizer`.
    pub role: String,
    /// Tokens generated.
    pub tokens: i64,
    /// The answer as generated.
    pub text: String,
    /// The extracted code.
    pub code: Option<String>,
    /// The harness's failure class.
    pub failure: Option<String>,
    /// The tester's feedback.
    pub feedback: String,
    /// The turn's reward.
    pub reward: f64,
    /// The credit it was trained with.
    pub credit: f64,
    /// Its advantage in the update.
    pub advantage: f64,
    /// PPO: the critic's estimate.
    pub value: Option<f64>,
    /// Every reward component, as JSON.
    pub components_json: String,
}

/// One row of `rl-train`'s `turns`: its key columns, then [`TurnColumns`]'.
///
/// | column | type | meaning |
/// |---|---|---|
/// | step | int64 | the RL step (from 1) |
/// | episode | int64 | the episode's index in its step |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RlTurnRow {
    /// The RL step (from 1).
    pub step: i64,
    /// The episode's index in its step.
    pub episode: i64,
    /// The turn.
    #[serde(flatten)]
    pub turn: TurnColumns,
}

/// One row of `eval`'s `turns`: its key columns, then [`TurnColumns`]'.
///
/// | column | type | meaning |
/// |---|---|---|
/// | checkpoint, split | utf8 | `sft`, `collab` or `rl`; the split (`test`, `kernelbench/level1`, ...) |
/// | episode | int64 | the episode's row in `episodes` |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalTurnRow {
    /// `sft`, `collab` or `rl`.
    pub checkpoint: String,
    /// The split.
    pub split: String,
    /// The episode's row in `episodes`.
    pub episode: i64,
    /// The turn.
    #[serde(flatten)]
    pub turn: TurnColumns,
}

/// One row of `optimize`'s `turns`: its key columns, then [`TurnColumns`]'.
///
/// | column | type | meaning |
/// |---|---|---|
/// | problem_id | utf8 | the KernelBench problem |
/// | episode | int64 | the episode's index among the problem's samples |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizeTurnRow {
    /// The KernelBench problem.
    pub problem_id: String,
    /// The episode's index among the problem's samples.
    pub episode: i64,
    /// The turn.
    #[serde(flatten)]
    pub turn: TurnColumns,
}

/// The schema of key columns `K` (a struct of them) followed by [`TurnColumns`]'.
fn keyed<K: Serialize + serde::de::DeserializeOwned>() -> SchemaRef {
    let (keys, turn) = (crate::traced::<K>(), crate::traced::<TurnColumns>());
    Arc::new(Schema::new(
        keys.fields()
            .iter()
            .chain(turn.fields().iter())
            .cloned()
            .collect::<Vec<_>>(),
    ))
}

/// [`RlTurnRow`]'s key columns, for tracing.
#[derive(Serialize, Deserialize)]
struct RlKeys {
    step: i64,
    episode: i64,
}

/// [`EvalTurnRow`]'s key columns, for tracing.
#[derive(Serialize, Deserialize)]
struct EvalKeys {
    checkpoint: String,
    split: String,
    episode: i64,
}

/// [`OptimizeTurnRow`]'s key columns, for tracing.
#[derive(Serialize, Deserialize)]
struct OptimizeKeys {
    problem_id: String,
    episode: i64,
}

/// [`TableRow`] for a `turns` row type `$row` whose key columns are the fields of `$keys` (the
/// flattened [`TurnColumns`] cannot be traced through the row type itself: `serde_arrow` traces
/// a flattened struct as a map).
macro_rules! turns_table {
    ($row:ty, $keys:ty) => {
        impl TableRow for $row {
            const NAME: &'static str = "turns";
            fn schema() -> SchemaRef {
                static S: LazyLock<SchemaRef> = LazyLock::new(keyed::<$keys>);
                S.clone()
            }
        }
    };
}

turns_table!(RlTurnRow, RlKeys);
turns_table!(EvalTurnRow, EvalKeys);
turns_table!(OptimizeTurnRow, OptimizeKeys);

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;

    /// The traced schemas are the ones the stages wrote column by column before (the same
    /// Parquet bytes).
    #[test]
    fn traced_schemas_are_the_stages_own() {
        let turn = [
            ("turn", DataType::Int64, false),
            ("task_id", DataType::Utf8, false),
            ("tier", DataType::Int64, false),
            ("role", DataType::Utf8, false),
            ("tokens", DataType::Int64, false),
            ("text", DataType::Utf8, false),
            ("code", DataType::Utf8, true),
            ("failure", DataType::Utf8, true),
            ("feedback", DataType::Utf8, false),
            ("reward", DataType::Float64, false),
            ("credit", DataType::Float64, false),
            ("advantage", DataType::Float64, false),
            ("value", DataType::Float64, true),
            ("components_json", DataType::Utf8, false),
        ];
        let rl = [
            ("step", DataType::Int64, false),
            ("episode", DataType::Int64, false),
        ];
        let eval = [
            ("checkpoint", DataType::Utf8, false),
            ("split", DataType::Utf8, false),
            ("episode", DataType::Int64, false),
        ];
        crate::assert_columns::<RlTurnRow>(&[&rl[..], &turn[..]].concat());
        crate::assert_columns::<EvalTurnRow>(&[&eval[..], &turn[..]].concat());
        let optimize = [
            ("problem_id", DataType::Utf8, false),
            ("episode", DataType::Int64, false),
        ];
        crate::assert_columns::<OptimizeTurnRow>(&[&optimize[..], &turn[..]].concat());
    }

    /// A row written through its schema reads back equal (the flattened turn columns included).
    #[test]
    fn rows_round_trip_through_their_schema() {
        let row = RlTurnRow {
            step: 3,
            episode: 1,
            turn: TurnColumns {
                turn: 0,
                task_id: "vector_add".into(),
                tier: 0,
                role: "generator".into(),
                tokens: 12,
                text: "```cuda\n```".into(),
                code: None,
                failure: Some("no_code".into()),
                feedback: "no code block".into(),
                reward: 0.0,
                credit: 0.0,
                advantage: -0.5,
                value: None,
                components_json: "{}".into(),
            },
        };
        let fields = RlTurnRow::schema().fields().to_vec();
        let batch = serde_arrow::to_record_batch(&fields, &vec![row.clone()]).unwrap();
        assert_eq!(batch.schema(), RlTurnRow::schema());
        let back: Vec<RlTurnRow> = serde_arrow::from_record_batch(&batch).unwrap();
        assert_eq!(back, vec![row]);
    }
}
