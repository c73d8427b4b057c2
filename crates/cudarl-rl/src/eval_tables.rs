//! The `eval` stage's tables as functions of its episodes: the `summary` rows (schema
//! [`SUMMARY`]; the metrics of [`crate::report::summary`] per checkpoint and split, with what
//! each split cost) and the `episodes` and `turns` rows of each episode (docs/architecture.md,
//! "The eval report"). The stage runs the episodes and writes the tables.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_tables::eval::EvalEpisodeRow;
use cudarl_tables::turns::EvalTurnRow;

use crate::harness::HarnessUse;
use crate::kb_eval::KbSet;
use crate::report::{
    PRACTISED, Row, SummaryRow, TIER_SPLITS, is_kernelbench, ops_split, practised_minus_control,
    summary, tier_split,
};

fn f(name: &str) -> Field {
    Field::new(name, DataType::Float64, true)
}

/// Schema of `summary`: the columns of [`SummaryRow`], in order (float64 rates and seconds,
/// nullable where the row's field is an `Option`; the module docs of the `eval` stage name
/// each).
pub static SUMMARY: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("checkpoint", DataType::Utf8, false),
        Field::new("split", DataType::Utf8, false),
        Field::new("episodes", DataType::Int64, false),
        f("single_turn_compile_rate"),
        f("single_turn_pass_rate"),
        f("compile_rate"),
        f("pass_rate"),
        f("fast_0"),
        f("fast_1"),
        f("fast_1_5"),
        f("fast_2"),
        f("geomean_speedup_vs_naive"),
        f("geomean_speedup_vs_torch"),
        f("fast_1_vs_compile"),
        f("fast_1_5_vs_compile"),
        f("fast_2_vs_compile"),
        f("geomean_speedup_vs_compile"),
        f("holdout_regression_rate"),
        f("mean_reward"),
        f("flagged_rate"),
        Field::new("mode", DataType::Utf8, false),
        Field::new("device", DataType::Utf8, false),
        Field::new("candidates", DataType::Int64, false),
        f("gen_seconds"),
        f("harness_seconds"),
        f("harness_compile_seconds"),
        f("harness_gpu_seconds"),
        f("harness_sass_seconds"),
        f("pass_rate_se"),
        f("mean_reward_se"),
        Field::new("pairs", DataType::Int64, true),
    ]))
});

/// What generating and judging one checkpoint's episodes on one split cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cost {
    /// Seconds the trainer spent generating (s).
    pub gen_seconds: f64,
    /// What the harness (or the KernelBench judge) did.
    pub harness: HarnessUse,
}

/// [`Cost`] by (checkpoint, split).
pub type CostBy = BTreeMap<(&'static str, &'static str), Cost>;

/// The `summary` rows (columns [`SUMMARY`]): per checkpoint (`cks`, in order) and split (the
/// task-family `splits`, then the
/// KernelBench splits of `kb`), its metrics over its episodes `rows` and what it cost; the
/// task-family splits again per tier and each KernelBench level by op coverage (episodes only);
/// and RL minus its frozen control on the problems RL practised.
pub fn summaries(
    rows: &[Row],
    cost: &CostBy,
    cks: &[&'static str],
    splits: &[&'static str],
    kb: Option<&KbSet>,
    mode: &'static str,
    device: &'static str,
) -> Vec<SummaryRow> {
    let kb_splits: Vec<&'static str> = kb.map_or(vec![], |k| k.splits());
    let mut sums = Vec::new();
    for &checkpoint in cks {
        let all = splits.iter().copied().chain(kb_splits.iter().copied());
        for split in all {
            let sel: Vec<&Row> = rows
                .iter()
                .filter(|r| r.ck == checkpoint && r.split == split)
                .collect();
            let c = cost.get(&(checkpoint, split)).copied().unwrap_or_default();
            sums.push(SummaryRow {
                checkpoint,
                split,
                mode,
                device,
                candidates: c.harness.candidates as i64,
                gen_seconds: c.gen_seconds,
                harness_seconds: c.harness.seconds,
                harness_compile_seconds: c.harness.phases.compile,
                harness_gpu_seconds: c.harness.phases.gpu,
                harness_sass_seconds: c.harness.phases.sass,
                ..summary(&sel, mode == "full", is_kernelbench(split))
            });
        }
        // A split's episodes again in parts, episodes only (their generation and harness
        // seconds are in the split's row); a part without episodes has no row.
        let mut part = |split: &str, name: &'static str, keep: &dyn Fn(&Row) -> bool| {
            let sel: Vec<&Row> = rows
                .iter()
                .filter(|r| r.ck == checkpoint && r.split == split && keep(r))
                .collect();
            if !sel.is_empty() {
                sums.push(SummaryRow {
                    checkpoint,
                    split: name,
                    mode,
                    device,
                    ..summary(&sel, mode == "full", is_kernelbench(split))
                });
            }
        };
        // The task-family splits per tier (`test/tier{t}`).
        for &split in splits {
            for tier in 0..TIER_SPLITS.len() {
                part(split, tier_split(split, tier), &|r| {
                    r.ep.tier == tier as i64
                });
            }
        }
        // Each level's hold-out problems by op coverage (`kernelbench/level{L}/novel_ops`
        // and `seen_ops`).
        let Some(k) = kb else { continue };
        for (split, _) in k.by_split.iter().filter(|l| l.0 != PRACTISED) {
            for novel in [true, false] {
                part(split, ops_split(split, novel), &|r| {
                    k.is_novel(&r.ep.task_id) == novel
                });
            }
        }
    }
    // RL minus the frozen control on the KernelBench problems RL practised.
    if let Some(d) = practised_minus_control(rows, mode == "full") {
        sums.push(SummaryRow { mode, device, ..d });
    }
    sums
}

impl Row {
    /// The `episodes` row of this episode, the `i`-th of the run (`episode` = `i`): its
    /// first turn's and its best turn's outcome, speedups and final reward.
    pub fn episode_row(&self, i: usize) -> EvalEpisodeRow {
        let (first, best) = (self.ep.first_components(), self.ep.best_components());
        EvalEpisodeRow {
            checkpoint: self.ck.into(),
            split: self.split.into(),
            task_id: self.ep.task_id.clone(),
            tier: self.ep.tier,
            episode: i as i64,
            turns: self.ep.turns.len() as i64,
            first_compiled: first.compiled,
            first_correct: first.correct,
            compiled: best.compiled,
            correct: best.correct,
            speedup_vs_naive: best.speedup,
            speedup_vs_torch: best.speedup_vs_torch,
            speedup_vs_torch_compile: best.speedup_vs_torch_compile,
            reward: self.ep.final_reward(),
        }
    }

    /// The `turns` rows of this episode, the `i`-th of the run, one per turn in order
    /// (advantage 0: nothing trains in eval).
    pub fn turn_rows(&self, i: usize) -> impl Iterator<Item = EvalTurnRow> + '_ {
        self.ep.turns.iter().map(move |t| EvalTurnRow {
            checkpoint: self.ck.to_string(),
            split: self.split.to_string(),
            episode: i as i64,
            turn: t.columns(&self.ep.task_id, self.ep.tier, 0.0),
        })
    }
}
