//! `eval`: the SFT and the RL checkpoints (and with `collab = true` the cross-agent fine-tuned
//! ones, `collab-sft`) on the same episodes: the hold-out families (the
//! `test` split of `sft-data`, never trained on) and, for per-tier rates, the train families;
//! every candidate is tested on the train and the hold-out shapes (full mode on a GPU). With
//! `kernelbench_samples`, also the curriculum's KernelBench `test` problems that have a native
//! launcher, per level ([`crate::kb_judge::KbJudge`]: recorded tests and timing against torch
//! eager on a GPU, compile-only without one).
//!
//! Transfer to new operators: each level's hold-out problems are also summarized apart by op
//! coverage. A problem's ops are the torch ops of its PyTorch source as
//! [`cudarl_curriculum::ops::op_names`] reads them (the recognizer `ingest-kernelbench` tiers
//! problems with, each feature by its base name: `nn.ReLU`, `F.relu`, `torch.relu` and
//! `x.relu()` are one op; aliases folded; views and reshapes left out); a task family's ops are
//! read the same way from its KernelBench-style module ([`TaskSpec::problem_source`]). The
//! training tasks are the families of the `train` and `rl` splits and the curriculum's
//! KernelBench `train` problems (`training_ops`); a problem with an op none of them uses is
//! `novel_ops`, the others `seen_ops`.
//!
//! When `rl-train` practised KernelBench `train` problems (`kernelbench_share`; read from its
//! `turns`), every checkpoint also runs on those it practised (split `kernelbench/practised`,
//! `kernelbench_samples` episodes each), and the summary gains RL minus SFT there, the SFT
//! checkpoint being the frozen control (the policy RL started from): per problem, RL's pass
//! rate (mean reward) minus SFT's, their mean with standard error `sd / sqrt(n)` over the `n`
//! problems (`n - 1` degrees of freedom; [`cudarl_rl::stats::MeanDiff`]).
//!
//! Metrics (docs/architecture.md, "Metrics") per checkpoint and split: compile rate and pass rate
//! of the first turn (single-turn) and of the episode's best verified turn (multi-turn: what the
//! generator-tester-optimizer loop hands back); fast_p for p in {0, 1, 1.5, 2}
//! (fraction of episodes whose best kernel is correct and more than p times faster than the
//! PyTorch reference; fast_0 = pass rate; KernelBench, Ouyang et al. 2025, arXiv:2502.10517);
//! geometric-mean speedup of the correct finals over the naive kernel and over PyTorch;
//! % regressions on hold-out shapes (best kernels that pass every train shape but fail a
//! hold-out shape, over those that pass the train shapes); mean final reward. The report adds
//! RL - SFT with one standard error, the episodes by their first turn's outcome (passed,
//! compiled but failed, compile error, no code) with the fraction of each that ended correct,
//! and the RL reward's first against its second half of steps.
//!
//! | table | columns |
//! |---|---|
//! | `summary` | checkpoint (utf8: sft, collab, rl; `rl_minus_sft`: a difference row, below), split (utf8: test, train, `test/tier{T}` and `train/tier{T}` (the families of tier T, 0-3), `kernelbench/level{L}`, `kernelbench/level{L}/novel_ops` and `kernelbench/level{L}/seen_ops` (that level's problems with an op no training task uses, and the rest; a side without problems has no row), `kernelbench/practised` (the KernelBench `train` problems `rl-train` practised; only with its `kernelbench_share`)), episodes (int64), single_turn_compile_rate, single_turn_pass_rate (float64, pass nullable), compile_rate, pass_rate (nullable), fast_0, fast_1, fast_1_5, fast_2 (nullable), geomean_speedup_vs_naive, geomean_speedup_vs_torch, fast_1_vs_compile, fast_1_5_vs_compile, fast_2_vs_compile, geomean_speedup_vs_compile (nullable; the `_vs_compile` columns against the reference under `torch.compile`, KernelBench rows only), holdout_regression_rate (nullable), mean_reward (float64), flagged_rate (float64: episodes with a hack-flagged turn; flagged kernels are not passes), mode, device (utf8), candidates (int64), gen_seconds, harness_seconds, harness_compile_seconds, harness_gpu_seconds, harness_sass_seconds (float64: what the split cost; 0 on the per-tier and op-coverage rows, whose episodes are their split's), pass_rate_se, mean_reward_se (float64, nullable), pairs (int64, nullable). The `rl_minus_sft` row (split `kernelbench/practised`): RL minus SFT paired by problem, episodes RL's, pass_rate, compile_rate, single_turn_compile_rate, flagged_rate and mean_reward the mean per-problem differences, pass_rate_se and mean_reward_se their standard errors, pairs the problems `n` (df `n - 1`); its other rates null |
//! | `episodes` | checkpoint, split, task_id (utf8), tier, episode, turns (int64), first_compiled (bool), first_correct (bool, nullable), compiled (bool), correct (bool, nullable), speedup_vs_naive, speedup_vs_torch, speedup_vs_torch_compile (float64, nullable), reward (float64) |
//! | `turns` | checkpoint, split (utf8), episode (int64: the `episodes` row), then the columns of `rl-train`'s `turns` from `turn` on (turn, task_id, tier, role, tokens, text, code, failure, feedback, reward, credit, advantage (0: eval does not train), value, components_json): what each agent wrote and what the tester said |
//! | `report` | file, digest, bytes: `report.md`, `reward_curve.png`, `per_tier.png`, `speedups.png` |

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{InputDecl, OutputDecl, ResolveContext, Stage, StageContext, StageError};
use cudarl_cuda::task::TaskSpec;
use cudarl_data::Table;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use cudarl_rl::episode::{Episode, EpisodeSettings, run_episodes};
use cudarl_rl::reward::RewardComponents;
use cudarl_rl::stats::{
    MeanDiff, first_turn_outcome, first_turn_table, geomean, mean_std, paired_diff, pooled,
    rate_diff, stratified_diff,
};

use crate::kb_judge::KbJudge;
use cudarl_rl::kernelbench::KbTask;

use crate::common::{CHECKPOINT, data_err, ingest_dir, params_json, resolve_device, write_rows};
use crate::rl_params::{TURN_FIELDS, TurnFields, harness, load_tasks};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "eval";

fn f(name: &str) -> Field {
    Field::new(name, DataType::Float64, true)
}

/// Schema of `summary`.
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

/// Schema of `episodes`.
pub static EPISODES: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("checkpoint", DataType::Utf8, false),
        Field::new("split", DataType::Utf8, false),
        Field::new("task_id", DataType::Utf8, false),
        Field::new("tier", DataType::Int64, false),
        Field::new("episode", DataType::Int64, false),
        Field::new("turns", DataType::Int64, false),
        Field::new("first_compiled", DataType::Boolean, false),
        Field::new("first_correct", DataType::Boolean, true),
        Field::new("compiled", DataType::Boolean, false),
        Field::new("correct", DataType::Boolean, true),
        f("speedup_vs_naive"),
        f("speedup_vs_torch"),
        f("speedup_vs_torch_compile"),
        Field::new("reward", DataType::Float64, false),
    ]))
});

/// Schema of `turns`: checkpoint, split, episode, then [`TURN_FIELDS`].
pub static TURNS: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut f = vec![
        Arc::new(Field::new("checkpoint", DataType::Utf8, false)),
        Arc::new(Field::new("split", DataType::Utf8, false)),
        Arc::new(Field::new("episode", DataType::Int64, false)),
    ];
    f.extend(TURN_FIELDS.iter().cloned());
    Arc::new(Schema::new(f))
});

fn d_samples() -> usize {
    8
}
fn d_true() -> bool {
    true
}

/// Parameters (`[stages.eval]`): the sampling and harness settings of `rl-train` plus these.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Episodes per task.
    #[serde(default = "d_samples")]
    pub samples: usize,
    /// Also evaluate on the train families (per-tier rates).
    #[serde(default = "d_true")]
    pub include_train: bool,
    /// The pre-registered primary metric of RL - SFT on the hold-out families, named before the
    /// runs (`pipelines/default.toml`): the report leads with it, paired by sampling seed, and
    /// writes it to `comparison.json` (`scripts/rl_learning.py` pools the draws). Absent: no
    /// pre-registered comparison, and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_metric: Option<Metric>,
    /// The guardrail beside it (e.g. the pass rate: RL must not fall by more than one standard
    /// error). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guardrail_metric: Option<Metric>,
    /// Also evaluate the cross-agent fine-tuned checkpoints (`collab-sft` and
    /// `collab-sft-optimizer`, checkpoint `collab`) with the same sampling seeds: the summary
    /// gains its rows, and the pre-registered comparison gives collab-SFT - SFT on the hold-out
    /// beside RL - SFT. Absent: off, and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collab: Option<bool>,
    /// Episodes per problem and checkpoint on the curriculum's KernelBench `test` problems that
    /// `kb-specs` gave a native launcher (on a GPU: those `testgen` recorded tests for), judged
    /// by [`crate::kb_judge::KbJudge`]; the summary gains a row per checkpoint and level (split
    /// `kernelbench/level{L}`) and per level and op coverage (`.../novel_ops`, `.../seen_ops`).
    /// Also the episodes per problem on the KernelBench `train` problems `rl-train` practised
    /// (`kernelbench/practised`). Absent or 0: none, and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernelbench_samples: Option<usize>,
    /// Sampling, turns, reward, mode, device (as `rl-train`; the update settings are unused).
    #[serde(flatten)]
    pub rl: crate::rl_params::Params,
}

/// An episode outcome a comparison counts (of the episode's best turn unless `single_turn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Compiled.
    Compile,
    /// Passed every test, no hack flag.
    Pass,
    /// The first turn compiled.
    SingleTurnCompile,
    /// The first turn passed.
    SingleTurnPass,
    /// Passed and faster than torch (fast_1, KernelBench's fast_p at p = 1).
    #[serde(rename = "fast_1")]
    Fast1,
    /// Passed and over 1.5x torch.
    #[serde(rename = "fast_1_5")]
    Fast15,
    /// Passed and over 2x torch.
    #[serde(rename = "fast_2")]
    Fast2,
    /// Passed and at least 1.5x the task's naive kernel: a fast layout, not the naive scan
    /// (the choice RL's speed term pays for).
    #[serde(rename = "fast_naive_1_5")]
    FastNaive15,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::Compile => "compile",
            Metric::Pass => "pass",
            Metric::SingleTurnCompile => "single_turn_compile",
            Metric::SingleTurnPass => "single_turn_pass",
            Metric::Fast1 => "fast_1",
            Metric::Fast15 => "fast_1_5",
            Metric::Fast2 => "fast_2",
            Metric::FastNaive15 => "fast_naive_1_5",
        }
    }

    /// Whether episode `r` counts.
    fn hit(self, r: &Row) -> bool {
        let (best, first) = (r.ep.best_components(), r.ep.first_components());
        let faster = |p: f64| best.honest_pass() && best.speedup_vs_torch.is_some_and(|s| s > p);
        match self {
            Metric::Compile => best.compiled,
            Metric::Pass => best.honest_pass(),
            Metric::SingleTurnCompile => first.compiled,
            Metric::SingleTurnPass => first.honest_pass(),
            Metric::Fast1 => faster(1.0),
            Metric::Fast15 => faster(1.5),
            Metric::Fast2 => faster(2.0),
            Metric::FastNaive15 => best.honest_pass() && best.speedup.is_some_and(|s| s >= 1.5),
        }
    }
}

/// The `eval` stage.
#[derive(Debug)]
pub struct Eval {
    params: Params,
}

impl Eval {
    /// From the pipeline's table.
    ///
    /// # Errors
    /// Unknown keys.
    pub fn from_table(t: toml::Table) -> Result<Self, String> {
        Ok(Eval {
            params: crate::common::parse_params(t)?,
        })
    }
}

struct Row {
    ck: &'static str,
    split: &'static str,
    ep: Episode,
}

/// Whether an episode (a row of one checkpoint and split) counts for a rate.
type Outcome = dyn Fn(&Row) -> bool;

/// One row of `summary` (the columns of [`SUMMARY`]).
#[derive(Debug, Clone, Default, Serialize)]
struct SummaryRow {
    checkpoint: &'static str,
    split: &'static str,
    episodes: i64,
    single_turn_compile_rate: f64,
    single_turn_pass_rate: Option<f64>,
    compile_rate: f64,
    pass_rate: Option<f64>,
    fast_0: Option<f64>,
    fast_1: Option<f64>,
    fast_1_5: Option<f64>,
    fast_2: Option<f64>,
    geomean_speedup_vs_naive: Option<f64>,
    geomean_speedup_vs_torch: Option<f64>,
    fast_1_vs_compile: Option<f64>,
    fast_1_5_vs_compile: Option<f64>,
    fast_2_vs_compile: Option<f64>,
    geomean_speedup_vs_compile: Option<f64>,
    holdout_regression_rate: Option<f64>,
    mean_reward: f64,
    flagged_rate: f64,
    mode: &'static str,
    device: &'static str,
    candidates: i64,
    gen_seconds: f64,
    harness_seconds: f64,
    harness_compile_seconds: f64,
    harness_gpu_seconds: f64,
    harness_sass_seconds: f64,
    /// A difference row ([`RL_MINUS_SFT`]): the standard errors of its pass rate and mean
    /// reward ([`MeanDiff`]); `None` elsewhere.
    pass_rate_se: Option<f64>,
    mean_reward_se: Option<f64>,
    /// A difference row: the problems paired, `n` (`n - 1` degrees of freedom).
    pairs: Option<i64>,
}

/// The metrics of one checkpoint and split over its episodes `rows`; `full`: tests ran (a GPU),
/// so the pass rate and fast_p are rates (0 when nothing compiled), not n/a; `vs_compile`: the
/// split's references were also timed under `torch.compile` (KernelBench problems), so fast_p
/// against it is a rate too (a correct kernel whose reference did not compile counts as not
/// faster).
fn summary(rows: &[&Row], full: bool, vs_compile: bool) -> SummaryRow {
    let n = rows.len().max(1) as f64;
    let frac = |f: &dyn Fn(&Row) -> bool| rows.iter().filter(|r| f(r)).count() as f64 / n;
    let correct = |r: &Row| r.ep.best_components().honest_pass();
    let fast_vs = |p: f64, on: bool, of: fn(&RewardComponents) -> Option<f64>| {
        (full && on)
            .then(|| frac(&|r| correct(r) && of(&r.ep.best_components()).is_some_and(|s| s > p)))
    };
    let fast = |p: f64| fast_vs(p, true, |c| c.speedup_vs_torch);
    let fast_compile = |p: f64| fast_vs(p, vs_compile, |c| c.speedup_vs_torch_compile);
    let speedups = |f: &dyn Fn(&Row) -> Option<f64>| -> Option<f64> {
        geomean(
            &rows
                .iter()
                .filter(|r| correct(r))
                .filter_map(|r| f(r))
                .collect::<Vec<_>>(),
        )
    };
    let train_ok: Vec<&&Row> = rows
        .iter()
        .filter(|r| r.ep.best_components().train_shapes_passed == Some(true))
        .collect();
    let regress = (full && !train_ok.is_empty()).then(|| {
        train_ok
            .iter()
            .filter(|r| r.ep.best_components().holdout_shapes_passed == Some(false))
            .count() as f64
            / train_ok.len() as f64
    });
    let rewards: Vec<f64> = rows.iter().map(|r| r.ep.final_reward()).collect();
    SummaryRow {
        episodes: rows.len() as i64,
        single_turn_compile_rate: frac(&|r| r.ep.first_components().compiled),
        single_turn_pass_rate: full.then(|| frac(&|r| r.ep.first_components().honest_pass())),
        compile_rate: frac(&|r| r.ep.best_components().compiled),
        pass_rate: full.then(|| frac(&correct)),
        fast_0: full.then(|| frac(&correct)),
        fast_1: fast(1.0),
        fast_1_5: fast(1.5),
        fast_2: fast(2.0),
        geomean_speedup_vs_naive: speedups(&|r| r.ep.best_components().speedup),
        geomean_speedup_vs_torch: speedups(&|r| r.ep.best_components().speedup_vs_torch),
        fast_1_vs_compile: fast_compile(1.0),
        fast_1_5_vs_compile: fast_compile(1.5),
        fast_2_vs_compile: fast_compile(2.0),
        geomean_speedup_vs_compile: speedups(&|r| r.ep.best_components().speedup_vs_torch_compile),
        holdout_regression_rate: regress,
        mean_reward: mean_std(&rewards).0,
        flagged_rate: frac(&|r| r.ep.flagged()),
        ..Default::default()
    }
}

/// One row of `episodes`.
#[derive(Debug, Serialize)]
struct EpisodeRow<'a> {
    checkpoint: &'static str,
    split: &'static str,
    task_id: &'a str,
    tier: i64,
    episode: i64,
    turns: i64,
    first_compiled: bool,
    first_correct: Option<bool>,
    compiled: bool,
    correct: Option<bool>,
    speedup_vs_naive: Option<f64>,
    speedup_vs_torch: Option<f64>,
    speedup_vs_torch_compile: Option<f64>,
    reward: f64,
}

impl<'a> EpisodeRow<'a> {
    fn of(i: usize, r: &'a Row) -> Self {
        let (first, best) = (r.ep.first_components(), r.ep.best_components());
        EpisodeRow {
            checkpoint: r.ck,
            split: r.split,
            task_id: &r.ep.task_id,
            tier: r.ep.tier,
            episode: i as i64,
            turns: r.ep.turns.len() as i64,
            first_compiled: first.compiled,
            first_correct: first.correct,
            compiled: best.compiled,
            correct: best.correct,
            speedup_vs_naive: best.speedup,
            speedup_vs_torch: best.speedup_vs_torch,
            speedup_vs_torch_compile: best.speedup_vs_torch_compile,
            reward: r.ep.final_reward(),
        }
    }
}

/// One row of `turns`.
#[derive(Debug, Serialize)]
struct TurnRow<'a> {
    checkpoint: &'static str,
    split: &'static str,
    episode: i64,
    #[serde(flatten)]
    turn: TurnFields<'a>,
}

/// What generating and judging one checkpoint's episodes on one split cost.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    gen_seconds: f64,
    harness: cudarl_rl::harness::HarnessUse,
}

/// [`Cost`] by (checkpoint, split).
type CostBy = BTreeMap<(&'static str, &'static str), Cost>;

/// The KernelBench problems `eval` runs by split, their judge, and the ops of the hold-out
/// problems that no training task uses.
struct KbSet {
    /// `kernelbench/level{L}` ([`kb_split`]): the curriculum's `test` problems with a native
    /// launcher, per level; then, when `rl-train` practised any, [`PRACTISED`]: the `train`
    /// problems it practised.
    by_split: Vec<(&'static str, Vec<KbTask>)>,
    judge: KbJudge,
    /// Per hold-out problem id, its ops that no training task uses
    /// ([`cudarl_curriculum::ops::OpCoverage::novel`] over [`training_ops`]; empty: covered).
    novel: BTreeMap<String, Vec<String>>,
}

impl KbSet {
    /// The summary's splits: one per level, then [`PRACTISED`] when it has problems.
    fn splits(&self) -> Vec<&'static str> {
        self.by_split.iter().map(|l| l.0).collect()
    }

    /// Whether hold-out problem `id` uses an op no training task uses.
    fn is_novel(&self, id: &str) -> bool {
        self.novel.get(id).is_some_and(|o| !o.is_empty())
    }

    /// Per level, its problems against the training tasks' ops (the report's sentence on them).
    fn level_ops(&self) -> Vec<LevelOps<'_>> {
        self.by_split
            .iter()
            .filter(|(split, _)| *split != PRACTISED)
            .map(|(split, tasks)| LevelOps {
                split,
                problems: tasks.len(),
                novel: tasks
                    .iter()
                    .filter_map(|t| {
                        let ops = self.novel.get(&t.id)?;
                        (!ops.is_empty()).then_some((t.id.as_str(), ops.as_slice()))
                    })
                    .collect(),
            })
            .collect()
    }
}

/// A level's hold-out problems against the training tasks' ops.
struct LevelOps<'a> {
    /// `kernelbench/level{L}`.
    split: &'static str,
    /// Its problems `eval` ran.
    problems: usize,
    /// Those with an op no training task uses, and those ops.
    novel: Vec<(&'a str, &'a [String])>,
}

/// The summary split of the KernelBench `train` problems `rl-train` practised
/// (`kernelbench_share`), run by every checkpoint; its `rl_minus_sft` row is RL minus the frozen
/// control, paired by problem ([`practised_minus_control`]).
const PRACTISED: &str = "kernelbench/practised";

/// The `checkpoint` of a `summary` row that is RL minus SFT paired by problem.
const RL_MINUS_SFT: &str = "rl_minus_sft";

/// The ops the training tasks cover, in [`cudarl_curriculum::ops::op_names`]' vocabulary: the
/// task families not held out (the `train` and `rl` splits of `ts`, each through its
/// KernelBench-style source, [`TaskSpec::problem_source`]) and the curriculum's KernelBench
/// `train` problems of `kb` (`(split, problem)`, launcher or not: the pretraining corpus holds
/// their references, SFT and `rl-train` draw on those with one).
fn training_ops(
    ts: &cudarl_rl::tasks::TaskSet,
    kb: &[(String, KbTask)],
) -> cudarl_curriculum::ops::OpCoverage {
    let families: Vec<String> = ts
        .train
        .iter()
        .chain(&ts.rl)
        .map(TaskSpec::problem_source)
        .collect();
    let problems = kb
        .iter()
        .filter(|(split, _)| split == "train")
        .map(|(_, t)| t.code.as_str());
    cudarl_curriculum::ops::OpCoverage::of(families.iter().map(String::as_str).chain(problems))
}

/// The summary splits of a level's hold-out problems by op coverage: `[novel, seen]`, those
/// with an op no training task uses and those whose every op some training task uses.
const OPS_SPLITS: [(&str, [&str; 2]); 4] = [
    (
        "kernelbench/level1",
        [
            "kernelbench/level1/novel_ops",
            "kernelbench/level1/seen_ops",
        ],
    ),
    (
        "kernelbench/level2",
        [
            "kernelbench/level2/novel_ops",
            "kernelbench/level2/seen_ops",
        ],
    ),
    (
        "kernelbench/level3",
        [
            "kernelbench/level3/novel_ops",
            "kernelbench/level3/seen_ops",
        ],
    ),
    (
        "kernelbench/level4",
        [
            "kernelbench/level4/novel_ops",
            "kernelbench/level4/seen_ops",
        ],
    ),
];

/// The summary split of level split `split`'s problems with an op no training task uses
/// (`novel`) or without (`kernelbench/level{L}/novel_ops`, `.../seen_ops`).
fn ops_split(split: &str, novel: bool) -> &'static str {
    let pair = OPS_SPLITS
        .iter()
        .find(|(s, _)| *s == split)
        .map_or(["kernelbench/novel_ops", "kernelbench/seen_ops"], |p| p.1);
    pair[usize::from(!novel)]
}

/// The split name of KernelBench level `level` in `summary` and `episodes`.
fn kb_split(level: i64) -> &'static str {
    match level {
        1 => "kernelbench/level1",
        2 => "kernelbench/level2",
        3 => "kernelbench/level3",
        4 => "kernelbench/level4",
        _ => "kernelbench",
    }
}

impl Eval {
    /// Episodes per KernelBench problem (0: none).
    fn kernelbench(&self) -> usize {
        self.params.kernelbench_samples.unwrap_or(0)
    }

    /// The KernelBench problems to run and their judge (compiler and mode of `h`), or `None`
    /// when `kernelbench_samples` is 0: the curriculum's `test` problems with a native launcher
    /// per level, each with its ops no training task uses ([`training_ops`] of `ts` and the
    /// curriculum), and the `train` problems among `practised`. On a GPU, problems without
    /// recorded tests are left out.
    ///
    /// # Errors
    /// An input table cannot be read or lacks a column (file and field named).
    fn kernelbench_set(
        &self,
        ctx: &StageContext<'_>,
        h: &cudarl_rl::harness::Harness,
        ts: &cudarl_rl::tasks::TaskSet,
        practised: &std::collections::BTreeSet<String>,
    ) -> Result<Option<KbSet>, StageError> {
        if self.kernelbench() == 0 {
            return Ok(None);
        }
        let judge = crate::kb_judge::from_inputs(ctx, h, self.params.rl.timeout_s)?;
        let all = cudarl_rl::kernelbench::curriculum_problems(
            ctx.input_path("kb_curriculum")?,
            ctx.input_path("kb_problems")?,
        )
        .map_err(StageError::Failed)?;
        let coverage = training_ops(ts, &all);
        let (mut by_level, mut trained, mut novel) = (BTreeMap::new(), Vec::new(), BTreeMap::new());
        for (split, t) in all {
            if t.signature.is_empty() || !judge.judges(&t.id) {
                continue;
            }
            match split.as_str() {
                "test" => {
                    novel.insert(t.id.clone(), coverage.novel(&t.code));
                    by_level
                        .entry(kb_split(t.level))
                        .or_insert_with(Vec::new)
                        .push(t);
                }
                "train" if practised.contains(&t.id) => trained.push(t),
                _ => {}
            }
        }
        let mut by_split: Vec<(&'static str, Vec<KbTask>)> = by_level.into_iter().collect();
        if !trained.is_empty() {
            by_split.push((PRACTISED, trained));
        }
        Ok(Some(KbSet {
            by_split,
            judge,
            novel,
        }))
    }

    /// The checkpoints evaluated, in order, with their generator and optimizer inputs.
    fn checkpoints(&self) -> Vec<(&'static str, &'static str, &'static str)> {
        let mut v = vec![("sft", "sft_generator", "sft_optimizer")];
        if self.params.collab == Some(true) {
            v.push(("collab", "collab_generator", "collab_optimizer"));
        }
        v.push(("rl", "rl_generator", "rl_optimizer"));
        v
    }

    /// Every episode of every checkpoint on `splits`, and what each (checkpoint, split) cost.
    fn episodes(
        &self,
        ctx: &StageContext<'_>,
        (h, mut kb): (&mut cudarl_rl::harness::Harness, Option<&mut KbSet>),
        cfg: &cudarl_rl::reward::RewardConfig,
        splits: &[(&'static str, Vec<&TaskSpec>)],
        dir: &std::path::Path,
    ) -> Result<(Vec<Row>, CostBy), StageError> {
        let p = &self.params;
        let settings = EpisodeSettings {
            max_turns: p.rl.max_turns,
            public_seeds: h.public_seeds.clone(),
        };
        let (mut rows, mut cost) = (Vec::new(), BTreeMap::new());
        // Episodes of every checkpoint and split: one batch of episodes per (checkpoint, split).
        let kb_n = kb.as_ref().map_or(0, |k| {
            k.by_split.iter().map(|l| l.1.len()).sum::<usize>() * self.kernelbench()
        });
        let per_ck: usize = splits
            .iter()
            .map(|(_, t)| t.len() * p.samples.max(1))
            .sum::<usize>()
            + kb_n;
        let bar = ctx.progress("episodes", Some((per_ck * self.checkpoints().len()) as u64));
        for (ck, gi, oi) in self.checkpoints() {
            // The same sampling seeds for every checkpoint.
            let mut tc =
                p.rl.start_trainer(ctx, (gi, oi), &dir.join(ck), (None, true))?;
            for (split, tasks) in splits {
                let many: Vec<&TaskSpec> = tasks
                    .iter()
                    .flat_map(|t| std::iter::repeat_n(*t, p.samples.max(1)))
                    .collect();
                let (g0, m0) = (tc.gen_seconds, h.mark());
                let eps =
                    run_episodes(&many, &mut tc, h, cfg, &settings).map_err(StageError::Failed)?;
                let used = h.since(&m0);
                let c = Cost {
                    gen_seconds: tc.gen_seconds - g0,
                    harness: used,
                };
                cost.insert((ck, *split), c);
                bar.inc(eps.len() as u64);
                rows.extend(eps.into_iter().map(|ep| Row { ck, split, ep }));
            }
            if let Some(kb) = kb.as_deref_mut() {
                for (split, tasks) in &kb.by_split {
                    let many: Vec<&KbTask> = tasks
                        .iter()
                        .flat_map(|t| std::iter::repeat_n(t, self.kernelbench()))
                        .collect();
                    let (g0, u0) = (tc.gen_seconds, kb.judge.used);
                    let t0 = std::time::Instant::now();
                    let eps = run_episodes(&many, &mut tc, &mut kb.judge, cfg, &settings)
                        .map_err(StageError::Failed)?;
                    let u = kb.judge.used;
                    let gen_seconds = tc.gen_seconds - g0;
                    let harness = cudarl_rl::harness::HarnessUse {
                        candidates: u.candidates - u0.candidates,
                        seconds: (t0.elapsed().as_secs_f64() - gen_seconds).max(0.0),
                        phases: cudarl_rl::harness::HarnessPhases {
                            compile: u.compile_seconds - u0.compile_seconds,
                            gpu: u.gpu_seconds - u0.gpu_seconds,
                            sass: 0.0,
                        },
                        ..Default::default()
                    };
                    cost.insert(
                        (ck, *split),
                        Cost {
                            gen_seconds,
                            harness,
                        },
                    );
                    bar.inc(eps.len() as u64);
                    rows.extend(eps.into_iter().map(|ep| Row { ck, split, ep }));
                }
            }
            tc.quit();
        }
        bar.finish();
        Ok((rows, cost))
    }
}

impl Stage for Eval {
    fn kind(&self) -> &str {
        KIND
    }
    fn code_version(&self) -> u32 {
        // 7: an episode's best turn breaks reward ties by correct, compiled, has code.
        // 8: the report adds RL - SFT paired by sampling seed, and single-turn compile to the
        // stratified comparison.
        // 9: a turn with a hack flag is not a pass (it earns 0); the summary and the report
        // count flagged episodes (`flagged_rate`).
        // 10: a seeded batch samples the same whether the model had a decoder yet or not.
        // 11: the pre-registered comparison (`primary_metric`, `comparison.json`).
        // 12: the `collab` checkpoints (`collab`).
        // 13: the comparison gives RL's multi-turn minus single-turn rate.
        // 14: the report says a multi-turn difference without a standard error in words.
        // 15: KernelBench rows per level (`kernelbench_samples`); the per-tier plot and the
        // first-turn table count the task families only; in full mode a split where nothing
        // compiled has pass rate and fast_p 0, not n/a.
        // 16: KernelBench fast_p and speedups against `torch.compile`.
        // 17: a KernelBench kernel's reward has a speed term against torch eager.
        // 18: `summary` rows per tier of the task families (`test/tier{T}`).
        // 19: KernelBench rows by op coverage (`kernelbench/level{L}/novel_ops`, `seen_ops`);
        // the problems `rl-train` practised (`kernelbench/practised`) and RL minus SFT there
        // (`rl_minus_sft`, `pass_rate_se`, `mean_reward_se`, `pairs`).
        19
    }
    fn params(&self) -> Value {
        params_json(&self.params)
    }
    fn inputs(&self) -> Vec<InputDecl> {
        let mut v = crate::rl_params::task_inputs();
        v.extend(self.params.rl.agent_inputs([
            ("sft_generator", "sft-train", "checkpoint"),
            ("sft_optimizer", "sft-train-optimizer", "checkpoint"),
        ]));
        v.extend([
            InputDecl::node("rl_generator", "rl-train", "generator"),
            InputDecl::node("rl_optimizer", "rl-train", "optimizer"),
            InputDecl::node("rl_metrics", "rl-train", "metrics"),
            InputDecl::node("rl_turns", "rl-train", "turns"),
        ]);
        if self.kernelbench() > 0 {
            v.extend(crate::kb_judge::kb_inputs());
        }
        if self.params.collab == Some(true) {
            v.push(InputDecl::node(
                "collab_generator",
                "collab-sft",
                "checkpoint",
            ));
            v.push(InputDecl::node(
                "collab_optimizer",
                "collab-sft-optimizer",
                "checkpoint",
            ));
        }
        v
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("summary", SUMMARY.clone()),
            OutputDecl::table("episodes", EPISODES.clone()),
            OutputDecl::table("turns", TURNS.clone()),
            OutputDecl::table("report", CHECKPOINT.clone()),
        ]
    }
    fn resolve_external(
        &self,
        input: &str,
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        self.params
            .rl
            .resolve_external(input, ["sft_generator", "sft_optimizer"], ctx)
    }
    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        self.params.rl.environment(ctx)
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let p = &self.params;
        let cfg = p.rl.reward_config(ctx)?;
        let ts = load_tasks(ctx)?;
        let device = resolve_device(p.rl.device);
        let mut h = harness(ctx, &p.rl, ts.naive.clone())?;
        let mode = h.mode();
        let tmp = ctx.store().temp_dir()?;
        let dir = tmp.path();
        let mut splits: Vec<(&'static str, Vec<&TaskSpec>)> =
            vec![("test", ts.test.iter().collect())];
        if p.include_train {
            splits.push(("train", ts.train.iter().collect()));
        }
        let practised = practised_problems(ctx)?;
        if !practised.is_empty() && self.kernelbench() == 0 {
            ctx.warn(format!(
                "rl-train practised {} KernelBench problems; with eval.kernelbench_samples = 0 they are not evaluated",
                practised.len()
            ));
        }
        let mut kb = self.kernelbench_set(ctx, &h, &ts, &practised)?;
        let (rows, cost) = self.episodes(ctx, (&mut h, kb.as_mut()), &cfg, &splits, dir)?;
        let kb_splits: Vec<&'static str> = kb.as_ref().map_or(vec![], |k| k.splits());
        let mut sums = Vec::new();
        let cks: Vec<&'static str> = self.checkpoints().iter().map(|c| c.0).collect();
        for &checkpoint in &cks {
            let all = splits.iter().map(|s| s.0).chain(kb_splits.iter().copied());
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
            for &(split, _) in &splits {
                for tier in 0..TIER_SPLITS.len() {
                    part(split, tier_split(split, tier), &|r| {
                        r.ep.tier == tier as i64
                    });
                }
            }
            // Each level's hold-out problems by op coverage (`kernelbench/level{L}/novel_ops`
            // and `seen_ops`).
            let Some(k) = &kb else { continue };
            for (split, _) in k.by_split.iter().filter(|l| l.0 != PRACTISED) {
                for novel in [true, false] {
                    part(split, ops_split(split, novel), &|r| {
                        k.is_novel(&r.ep.task_id) == novel
                    });
                }
            }
        }
        // RL minus the frozen control on the KernelBench problems RL practised.
        if let Some(d) = practised_minus_control(&rows, mode == "full") {
            sums.push(SummaryRow { mode, device, ..d });
        }
        write_rows(ctx, "summary", &SUMMARY, &sums)?;
        let episodes: Vec<EpisodeRow<'_>> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| EpisodeRow::of(i, r))
            .collect();
        write_rows(ctx, "episodes", &EPISODES, &episodes)?;
        let turns: Vec<TurnRow<'_>> = rows
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                r.ep.turns.iter().map(move |t| TurnRow {
                    checkpoint: r.ck,
                    split: r.split,
                    episode: i as i64,
                    turn: TurnFields::of(t, &r.ep.task_id, r.ep.tier, 0.0),
                })
            })
            .collect();
        write_rows(ctx, "turns", &TURNS, &turns)?;
        let sums: Vec<Value> = sums
            .iter()
            .map(|s| serde_json::to_value(s).expect("a summary row serializes"))
            .collect();
        let rd = dir.join("report");
        std::fs::create_dir_all(&rd).map_err(|e| StageError::Failed(e.to_string()))?;
        let metrics =
            Table::read(ctx.input_path("rl_metrics")?, "rl-train.metrics").map_err(data_err)?;
        let pre = p.primary_metric.map(|m| (m, p.guardrail_metric));
        let kb_ops = kb.as_ref().map_or(vec![], KbSet::level_ops);
        report(
            &rd,
            (&sums, &rows, &metrics),
            (mode, device),
            &cks,
            &kb_ops,
            pre,
        )
        .map_err(StageError::Failed)?;
        ingest_dir(ctx, &rd, "report")
    }
}

/// The report's paragraph on what a run without a GPU (compile-only) shows and does not: the
/// compile rates are real nvcc verdicts on the agents' kernels; correctness, speed and learning
/// from rewards need a GPU; and whether KernelBench problems were in the run (`sums` has their
/// `kernelbench/level{L}` rows; the `cpu` profile runs one episode per problem).
fn without_gpu(sums: &[Value]) -> String {
    let kb = sums
        .iter()
        .any(|s| s["split"].as_str().is_some_and(is_kernelbench));
    let kb = if kb {
        "KernelBench problems were only compiled."
    } else {
        "No KernelBench problem was in this run (`eval.kernelbench_samples = 0`)."
    };
    format!(
        "**What a run without a GPU shows.** The pipeline end to end on the real data with real nvcc, and how often the trained agents write a kernel that nvcc accepts in the task's ABI: the compile rates below, for the generator's first turn (`compile (1 turn)`) and after the optimizer's revisions (`compile`). It does not show correctness, speed or learning from rewards: no kernel ran, so pass rates, fast_p and speedups are n/a, and RL's rewards were compile-only. {kb} A run on a GPU measures all of them.\n\n"
    )
}

/// The KernelBench problems `rl-train` practised (with `kernelbench_share`): the `kb/` task ids
/// of its `turns` (input `rl_turns`); empty when it practised none.
///
/// # Errors
/// The table cannot be read or lacks `task_id` (file and field named).
fn practised_problems(
    ctx: &StageContext<'_>,
) -> Result<std::collections::BTreeSet<String>, StageError> {
    let t = Table::read(ctx.input_path("rl_turns")?, "rl-train.turns").map_err(data_err)?;
    let ids = t.req_strings("task_id").map_err(data_err)?;
    Ok((0..t.rows())
        .filter_map(|i| ids.get(i))
        .filter(|id| id.starts_with("kb/"))
        .map(str::to_string)
        .collect())
}

/// Per problem of `split`, checkpoint `other`'s mean of `x` over its episodes minus `base`'s
/// (problems `other` ran, in id order), and their mean with its standard error
/// ([`MeanDiff`]: paired by problem, `n` problems, `n - 1` degrees of freedom); `None` when
/// no problem has episodes on both sides.
fn per_problem_diff(
    rows: &[Row],
    split: &str,
    (base, other): (&str, &str),
    x: &dyn Fn(&Row) -> f64,
) -> Option<MeanDiff> {
    let side = |ck: &str| -> BTreeMap<&str, (f64, f64)> {
        let mut m: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for r in rows.iter().filter(|r| r.split == split && r.ck == ck) {
            let e = m.entry(r.ep.task_id.as_str()).or_default();
            (e.0, e.1) = (e.0 + 1.0, e.1 + x(r));
        }
        m
    };
    let (a, b) = (side(base), side(other));
    let d: Vec<f64> = b
        .iter()
        .filter_map(|(t, (nb, sb))| {
            let (na, sa) = a.get(t)?;
            Some(sb / nb - sa / na)
        })
        .collect();
    MeanDiff::of(&d)
}

/// The `summary` row of RL minus SFT (the frozen control: the policy `rl-train` started from)
/// on [`PRACTISED`], paired by problem ([`per_problem_diff`]): `pass_rate` (with `full`: tests
/// ran) and `mean_reward` are the mean per-problem differences with `pass_rate_se` and
/// `mean_reward_se`; `compile_rate`, `single_turn_compile_rate` and `flagged_rate` the same
/// differences without a standard error; `episodes` RL's, `pairs` the problems. `None` when
/// RL ran no practised problem.
fn practised_minus_control(rows: &[Row], full: bool) -> Option<SummaryRow> {
    let cks = ("sft", "rl");
    let diff = |x: &dyn Fn(&Row) -> f64| per_problem_diff(rows, PRACTISED, cks, x);
    let hit = |b: bool| f64::from(u8::from(b));
    let reward = diff(&|r| r.ep.final_reward())?;
    let pass = full
        .then(|| diff(&|r| hit(r.ep.best_components().honest_pass())))
        .flatten();
    let mean = |d: Option<MeanDiff>| d.map_or(0.0, |d| d.mean);
    Some(SummaryRow {
        checkpoint: RL_MINUS_SFT,
        split: PRACTISED,
        episodes: rows
            .iter()
            .filter(|r| r.split == PRACTISED && r.ck == "rl")
            .count() as i64,
        single_turn_compile_rate: mean(diff(&|r| hit(r.ep.first_components().compiled))),
        compile_rate: mean(diff(&|r| hit(r.ep.best_components().compiled))),
        pass_rate: pass.map(|d| d.mean),
        pass_rate_se: pass.and_then(|d| d.se),
        mean_reward: reward.mean,
        mean_reward_se: reward.se,
        flagged_rate: mean(diff(&|r| hit(r.ep.flagged()))),
        pairs: Some(reward.n as i64),
        ..Default::default()
    })
}

/// Whether `r` is an episode on a task family (not a KernelBench problem).
fn is_family(r: &Row) -> bool {
    !is_kernelbench(r.split)
}

/// The per-tier summary splits of the hold-out and train families, tiers 0-3.
const TIER_SPLITS: [[&str; 2]; 4] = [
    ["test/tier0", "train/tier0"],
    ["test/tier1", "train/tier1"],
    ["test/tier2", "train/tier2"],
    ["test/tier3", "train/tier3"],
];

/// The summary split of `split`'s (`test` or `train`) families of tier `tier` (0-3).
fn tier_split(split: &str, tier: usize) -> &'static str {
    TIER_SPLITS[tier][usize::from(split != "test")]
}

/// Whether `split` holds KernelBench problems (`kernelbench/level{L}`, [`kb_split`]).
fn is_kernelbench(split: &str) -> bool {
    split.starts_with("kernelbench")
}

/// The report's KernelBench section: per checkpoint and split, from the `summary` rows of the
/// `kernelbench/...` splits (none: nothing), then which hold-out problems of each level use an
/// op no training task uses (`kb_ops`), and RL minus the frozen control on the problems RL
/// practised (the [`RL_MINUS_SFT`] row, when there is one).
fn kernelbench_section(md: &mut String, sums: &[Value], kb_ops: &[LevelOps<'_>]) {
    let kb: Vec<&Value> = sums
        .iter()
        .filter(|s| s["split"].as_str().is_some_and(is_kernelbench))
        .filter(|s| s["checkpoint"] != RL_MINUS_SFT)
        .collect();
    if kb.is_empty() {
        return;
    }
    md.push_str("\n## KernelBench\n\nThe curriculum's KernelBench `test` problems with a native launcher (`kb-specs`), each candidate built against it and, on a GPU, run on `testgen`'s recorded tests and at the problem's own sizes, timed against the reference `Model` in torch eager and under `torch.compile` (Inductor, default mode; compiled once per problem). fast_p: the share of episodes whose best kernel is correct and more than p times faster than the baseline (fast_0 = correct; KernelBench, Ouyang et al. 2025, arXiv:2502.10517). A level where nothing passed reads 0.000; without a GPU (compile-only) the pass rate and fast_p are n/a. `level{L}/novel_ops` and `level{L}/seen_ops`: the level's problems with an op no training task uses, and the rest (below); `practised`: the `train` problems RL practised.\n\n| checkpoint | level | episodes | compile (1 turn) | pass (1 turn) | compile | fast_0 | fast_1 | fast_1.5 | fast_2 | geomean vs torch eager | fast_1 vs compile | fast_1.5 vs compile | fast_2 vs compile | geomean vs compile |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for s in kb {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            s["checkpoint"].as_str().unwrap_or_default(),
            s["split"]
                .as_str()
                .unwrap_or_default()
                .trim_start_matches("kernelbench/"),
            s["episodes"],
            fmt(&s["single_turn_compile_rate"]),
            fmt(&s["single_turn_pass_rate"]),
            fmt(&s["compile_rate"]),
            fmt(&s["fast_0"]),
            fmt(&s["fast_1"]),
            fmt(&s["fast_1_5"]),
            fmt(&s["fast_2"]),
            fmt(&s["geomean_speedup_vs_torch"]),
            fmt(&s["fast_1_vs_compile"]),
            fmt(&s["fast_1_5_vs_compile"]),
            fmt(&s["fast_2_vs_compile"]),
            fmt(&s["geomean_speedup_vs_compile"]),
        ));
    }
    md.push_str(&novel_ops_paragraph(kb_ops));
    if let Some(d) = sums.iter().find(|s| s["checkpoint"] == RL_MINUS_SFT) {
        md.push_str(&practised_line(d));
    }
}

/// The report's paragraph on transfer to new operators: per level, how many hold-out problems
/// use an op no training task uses, which, and with what op; a level without any says so (it
/// has no `novel_ops` row).
fn novel_ops_paragraph(kb_ops: &[LevelOps<'_>]) -> String {
    if kb_ops.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\nTransfer to new operators: a hold-out problem is `novel_ops` when one of its torch ops appears in no training task, `seen_ops` when each of its ops appears in some training task (a combination may still be new). Ops are read from the PyTorch source the same way for both sides (`cudarl_curriculum::ops::op_names`: `nn.ReLU`, `F.relu` and `torch.relu` are one op, `x + y` and `torch.add` another; views and reshapes are left out); the training tasks are the task families of the `train` and `rl` splits, through their KernelBench-style modules, and the curriculum's KernelBench `train` problems.",
    );
    for l in kb_ops {
        let level = l.split.trim_start_matches("kernelbench/");
        if l.novel.is_empty() {
            md.push_str(&format!(
                " {level}: none of the {} problems uses a new op (no `{}` row).",
                l.problems,
                ops_split(l.split, true)
            ));
        } else {
            let which: Vec<String> = l
                .novel
                .iter()
                .map(|(id, ops)| format!("`{id}` ({})", ops.join(", ")))
                .collect();
            md.push_str(&format!(
                " {level}: {} of {} problems use a new op: {}.",
                l.novel.len(),
                l.problems,
                which.join(", ")
            ));
        }
    }
    md.push('\n');
    md
}

/// The report's line on RL minus the frozen control on the KernelBench problems RL practised,
/// from the [`RL_MINUS_SFT`] row `d` of `summary`.
fn practised_line(d: &Value) -> String {
    let n = d["pairs"].as_i64().unwrap_or(0);
    let show = |k: &str| match (d[k].as_f64(), d[format!("{k}_se")].as_f64()) {
        (Some(x), Some(se)) => format!("{x:+.3} +- {se:.3}"),
        (Some(x), None) => format!("{x:+.3} (one problem: no standard error)"),
        _ => "n/a (no tests ran)".into(),
    };
    format!(
        "\nOn the KernelBench `train` problems RL practised (`rl-train.kernelbench_share`; {n} problems, {} episodes per checkpoint), RL - SFT (the frozen control: the policy RL started from), paired by problem: pass rate {}, mean reward {} (mean of the per-problem differences +- their standard deviation / sqrt(n), n = {n}, df = {}). RL trained on these problems: a gain here is practice, not transfer.\n",
        d["episodes"],
        show("pass_rate"),
        show("mean_reward"),
        (n - 1).max(0)
    )
}

fn fmt(v: &Value) -> String {
    match v.as_f64() {
        Some(x) => format!("{x:.3}"),
        None => "n/a".into(),
    }
}

/// The reward curve's columns of the `metrics` table: step, mean reward, its standard deviation.
struct RewardColumns {
    steps: cudarl_data::parquet_io::I64Col,
    mr: cudarl_data::parquet_io::F64Col,
    sd: cudarl_data::parquet_io::F64Col,
}

impl RewardColumns {
    /// Reads them.
    ///
    /// # Errors
    /// `metrics` lacks `step`, `mean_reward` or `reward_std`.
    fn read(metrics: &Table) -> Result<RewardColumns, String> {
        let e = |e: cudarl_data::DataError| e.to_string();
        Ok(RewardColumns {
            steps: metrics.req_ints("step").map_err(e)?,
            mr: metrics.req_floats("mean_reward").map_err(e)?,
            sd: metrics.req_floats("reward_std").map_err(e)?,
        })
    }
}

/// The report's RL-minus-SFT section per split (test, then train): each rate's difference with
/// one standard error, the same stratified by task, and paired by sampling seed.
fn rl_minus_sft(md: &mut String, sums: &[Value], rows: &[Row], mode: &str) {
    // RL minus SFT per split, with one standard error: is the difference evidence?
    for split in ["test", "train"] {
        let get = |ck: &str| {
            sums.iter()
                .find(|s| s["checkpoint"] == ck && s["split"] == split)
        };
        let (Some(s), Some(r)) = (get("sft"), get("rl")) else {
            continue;
        };
        let (ns, nr) = (
            s["episodes"].as_f64().unwrap_or(0.0),
            r["episodes"].as_f64().unwrap_or(0.0),
        );
        let parts: Vec<String> = [
            ("compile", "compile_rate"),
            ("pass", "pass_rate"),
            ("fast_1", "fast_1"),
        ]
        .iter()
        .filter_map(|(name, k)| {
            let (d, se) = rate_diff(s[*k].as_f64()?, ns, r[*k].as_f64()?, nr)?;
            Some(format!("{name} {d:+.3} +- {se:.3}"))
        })
        .collect();
        if !parts.is_empty() {
            md.push_str(&format!(
                "\nRL - SFT on `{split}` ({ns} and {nr} episodes; +- one standard error, two-proportion Wald): {}. A difference inside two standard errors is not evidence either way.\n",
                parts.join(", ")
            ));
        }
        // The same, stratified by task (every task has its own episodes on both sides).
        let per_task = |f: &dyn Fn(&Row) -> bool| {
            let mut t: BTreeMap<&str, (f64, f64, f64, f64)> = BTreeMap::new();
            for r in rows.iter().filter(|r| r.split == split) {
                let e = t.entry(r.ep.task_id.as_str()).or_default();
                let hit = f64::from(u8::from(f(r)));
                if r.ck == "sft" {
                    (e.0, e.1) = (e.0 + 1.0, e.1 + hit);
                } else {
                    (e.2, e.3) = (e.2 + 1.0, e.3 + hit);
                }
            }
            stratified_diff(&t.into_values().collect::<Vec<_>>())
        };
        // The outcomes both comparisons below count: the pass rate only where tests ran.
        let compiled = |r: &Row| r.ep.best_components().compiled;
        let passed = |r: &Row| r.ep.best_components().correct == Some(true);
        let first_compiled = |r: &Row| r.ep.first_components().compiled;
        let mut outcomes: Vec<(&str, &Outcome)> = vec![("compile", &compiled)];
        if mode == "full" {
            outcomes.push(("pass", &passed));
        }
        outcomes.push(("single-turn compile", &first_compiled));
        let strat: Vec<String> = outcomes
            .iter()
            .filter_map(|(name, f)| {
                per_task(*f).map(|(d, se)| format!("{name} {d:+.3} +- {se:.3}"))
            })
            .collect();
        if !strat.is_empty() {
            md.push_str(&format!(
                "Stratified by task (the same tasks on both sides; what holds on these tasks, not on new ones): {}.\n",
                strat.join(", ")
            ));
        }
        let paired = |f: &dyn Fn(&Row) -> bool| paired_by_seed(rows, split, ("sft", "rl"), f);
        let pair: Vec<String> = outcomes
            .iter()
            .filter_map(|(name, f)| {
                paired(*f).map(|(d, se, g, l)| {
                    let se = se.map_or("n/a (one task)".into(), |se| format!("{se:.3}"));
                    format!("{name} {d:+.3} +- {se} (RL gained {g}, lost {l})")
                })
            })
            .collect();
        if !pair.is_empty() {
            md.push_str(&format!(
                "Paired by sampling seed (episode i of a task drew the same seeds on both sides), +- one standard error clustered by task (what to expect on new tasks like these): {}.\n",
                pair.join(", ")
            ));
        }
    }
}

/// Checkpoint `other` - checkpoint `base` (e.g. RL - SFT) on `split` paired by seed (episode i
/// of a task drew the same sampling seeds on both sides) in the share of episodes `f` accepts: (difference, standard error clustered by task,
/// pairs RL gained, pairs it lost); `None` when the sides' tasks or episodes differ.
fn paired_by_seed(
    rows: &[Row],
    split: &str,
    (base, other): (&str, &str),
    f: &dyn Fn(&Row) -> bool,
) -> Option<(f64, Option<f64>, usize, usize)> {
    let side = |ck: &str| -> BTreeMap<&str, Vec<bool>> {
        let mut m: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
        for r in rows.iter().filter(|r| r.split == split && r.ck == ck) {
            m.entry(r.ep.task_id.as_str()).or_default().push(f(r));
        }
        m
    };
    let (a, b) = (side(base), side(other));
    let mut pairs = Vec::new();
    for (t, xa) in &a {
        let xb = b.get(t).filter(|xb| xb.len() == xa.len())?;
        pairs.extend(xa.iter().zip(xb).map(|(&x, &y)| (*t, x, y)));
    }
    (a.len() == b.len()).then_some(())?;
    paired_diff(&pairs)
}

/// The pre-registered comparison (`primary_metric`, `guardrail_metric`): RL - SFT on the
/// hold-out families paired by seed for each (and collab-SFT - SFT when `collab` was
/// evaluated), RL's multi-turn minus single-turn rate on the hold-out in the guardrail's
/// outcome (pass unless it is a compile rate), and RL - control per step from `metrics` (mean reward and pass rate, steps 2 on:
/// step 1 samples from identical weights). Appends its section to `md` and returns what
/// `comparison.json` holds.
fn comparison(
    md: &mut String,
    rows: &[Row],
    metrics: &Table,
    primary: Metric,
    guardrail: Option<Metric>,
) -> Value {
    let versus = |m: Metric, other: &str| {
        let (d, se, gained, lost) = paired_by_seed(rows, "test", ("sft", other), &|r| m.hit(r))?;
        let pairs = rows
            .iter()
            .filter(|r| r.split == "test" && r.ck == other)
            .count();
        Some(serde_json::json!({
            "metric": m.name(), format!("{other}_minus_sft"): d, "se": se, "gained": gained,
            "lost": lost, "pairs": pairs,
        }))
    };
    let holdout = |m: Metric| versus(m, "rl");
    let per_step = |col: &str| -> Option<Value> {
        let (c, m) = match col {
            "reward" => (
                metrics.floats("control_reward"),
                metrics.floats("mean_reward"),
            ),
            _ => (
                metrics.floats("control_pass_rate"),
                metrics.floats("pass_rate"),
            ),
        };
        let (c, m) = (c.ok()??, m.ok()??);
        let d: Vec<f64> = (1..metrics.rows())
            .filter_map(|i| Some(m.get(i)? - c.get(i)?))
            .collect();
        (d.len() >= 2).then(|| {
            let (mean, sd) = mean_std(&d);
            serde_json::json!({
                "rl_minus_control": mean,
                "se": sd / ((d.len() - 1) as f64).sqrt(),
                "steps": d.len(),
            })
        })
    };
    let mut out = serde_json::json!({
        "primary_metric": primary.name(),
        "guardrail_metric": guardrail.map(Metric::name),
        "holdout_primary": holdout(primary),
        "holdout_guardrail": guardrail.and_then(holdout),
        "practised_reward": per_step("reward"),
        "practised_pass_rate": per_step("pass"),
    });
    // Multi-turn above single-turn: each RL hold-out episode's best turn against its first, in
    // the guardrail metric's outcome (pass when none is named), clustered by task.
    let g = guardrail.unwrap_or(Metric::Pass);
    let first = match g {
        Metric::Compile | Metric::SingleTurnCompile => Metric::SingleTurnCompile,
        _ => Metric::SingleTurnPass,
    };
    let pairs: Vec<(&str, bool, bool)> = rows
        .iter()
        .filter(|r| r.split == "test" && r.ck == "rl")
        .map(|r| (r.ep.task_id.as_str(), first.hit(r), g.hit(r)))
        .collect();
    out["rl_multi_minus_single_turn"] = paired_diff(&pairs)
        .map(|(d, se, gained, _)| {
            serde_json::json!({
                "metric": g.name(), "multi_minus_single": d, "se": se, "episodes_gained": gained,
                "episodes": pairs.len(),
            })
        })
        .into();
    let collab = rows.iter().any(|r| r.ck == "collab");
    if collab {
        out["holdout_collab_primary"] = versus(primary, "collab").into();
        out["holdout_collab_guardrail"] = guardrail.and_then(|g| versus(g, "collab")).into();
    }
    // A difference `v[key]` with its standard error.
    let show = |v: &Value, key: &str| match (v[key].as_f64(), v["se"].as_f64()) {
        (Some(d), Some(se)) => format!("{d:+.3} +- {se:.3}"),
        (Some(d), None) => format!("{d:+.3} (one task: no standard error)"),
        _ => "n/a".into(),
    };
    md.push_str(&format!(
        "
## Pre-registered comparison

Primary metric, named in the pipeline before the run: **{}**. RL - SFT on the hold-out families, paired by sampling seed (+- one standard error clustered by task): {}.",
        primary.name(),
        show(&out["holdout_primary"], "rl_minus_sft")
    ));
    if let Some(g) = guardrail {
        md.push_str(&format!(
            " Guardrail {}: {}.",
            g.name(),
            show(&out["holdout_guardrail"], "rl_minus_sft")
        ));
    }
    let m = &out["rl_multi_minus_single_turn"];
    if m.is_object() {
        md.push_str(&format!(
            " RL's multi-turn minus single-turn {} on the hold-out (best turn against first turn, same episodes): {}.",
            m["metric"].as_str().unwrap_or_default(),
            show(m, "multi_minus_single")
        ));
    }
    if collab {
        md.push_str(&format!(
            " Cross-agent fine-tuning (`collab`), collab-SFT - SFT on the same episodes' seeds: {}",
            show(&out["holdout_collab_primary"], "collab_minus_sft")
        ));
        if let Some(g) = guardrail {
            md.push_str(&format!(
                ", guardrail {}: {}",
                g.name(),
                show(&out["holdout_collab_guardrail"], "collab_minus_sft")
            ));
        }
        md.push('.');
    }
    if let Some(p) = out["practised_reward"].as_object() {
        md.push_str(&format!(
            " On the practised tasks, RL - frozen control per step (steps 2 on): mean reward {:+.3} +- {:.3} over {} steps.",
            p["rl_minus_control"].as_f64().unwrap_or(f64::NAN),
            p["se"].as_f64().unwrap_or(f64::NAN),
            p["steps"]
        ));
    }
    md.push('\n');
    out
}

/// The report's learning-curve section from the `metrics` table (its reward curve in `curve`):
/// the first against the last half of the steps, RL against its frozen control per step, and
/// per tier.
fn learning_curves(md: &mut String, metrics: &Table, curve: &RewardColumns) {
    let RewardColumns { steps, mr, sd } = curve;
    // The first against the second half of the steps, pooled over their episodes.
    if let Ok(n) = metrics.req_ints("episodes") {
        let steps: Vec<(f64, f64, f64)> = (0..metrics.rows())
            .filter_map(|i| Some((n.get(i)? as f64, mr.get(i)?, sd.get(i)?)))
            .collect();
        let half = steps.len() / 2;
        if half > 0 {
            let (x, y) = (pooled(&steps[..half]), pooled(&steps[steps.len() - half..]));
            md.push_str(&format!(
                "First {half} steps: mean reward {:.3} +- {:.3} ({} episodes); last {half}: {:.3} +- {:.3} ({}); difference {:+.3} +- {:.3} (+- one standard error, episodes taken as independent: a GRPO group shares its task, so the spread is understated). A step's tasks come from `seed` alone, so runs with one seed share their task sequence: the frozen policy's curve on it (`--set rl-train.control=true`, or a run with `lr = 0`) is the baseline a rise is learning against (H100, 2026-11-24: a frozen policy's curve rose as much as RL's).\n",
                x.0,
                x.1,
                x.2,
                y.0,
                y.1,
                y.2,
                y.0 - x.0,
                (x.1 * x.1 + y.1 * y.1).sqrt()
            ));
        }
    }
    // RL against the frozen references on the same tasks and seeds (`rl-train.control`).
    if let (Ok(Some(c)), Ok(Some(m)), Ok(st)) = (
        metrics.floats("control_reward"),
        metrics.floats("mean_reward"),
        metrics.req_ints("step"),
    ) {
        let d: Vec<(i64, f64)> = (0..metrics.rows())
            .filter_map(|i| Some((st.get(i)?, m.get(i)? - c.get(i)?)))
            .collect();
        if !d.is_empty() {
            let per: Vec<String> = d.iter().map(|(s, x)| format!("{s}: {x:+.3}")).collect();
            // Step 1 samples from identical weights: the later steps are the evidence.
            let later: Vec<f64> = d.iter().skip(1).map(|x| x.1).collect();
            let (mean, sd) = mean_std(&later);
            md.push_str(&format!(
                "RL minus the frozen SFT policy (`control`: the same tasks and sampling seeds, no training), mean reward per step: {}.{}\n",
                per.join(", "),
                if later.len() >= 2 {
                    format!(
                        " Steps 2-{}: {mean:+.3} +- {:.3} (mean +- one standard error over steps).",
                        d.last().map_or(0, |x| x.0),
                        // Sample standard deviation (n - 1) over sqrt(n).
                        sd / ((later.len() - 1) as f64).sqrt()
                    )
                } else {
                    String::new()
                }
            ));
        }
    }
    // Per tier: the first and the last step that ran episodes of it, and the mean over each
    // half of those steps (a tier opening changes the mix; this curve is not confounded by it).
    if let Ok(bt) = metrics.req_strings("reward_by_tier_json") {
        let mut per: BTreeMap<i64, Vec<(f64, f64)>> = BTreeMap::new();
        for i in 0..metrics.rows() {
            let (Some(step), Some(j)) = (steps.get(i), bt.get(i)) else {
                continue;
            };
            let m: serde_json::Map<String, Value> = serde_json::from_str(j).unwrap_or_default();
            for (t, v) in m {
                if let (Ok(t), Some(v)) = (t.parse::<i64>(), v.as_f64()) {
                    per.entry(t).or_default().push((step as f64, v));
                }
            }
        }
        for (t, v) in &per {
            let half = v.len() / 2;
            let avg = |x: &[(f64, f64)]| x.iter().map(|p| p.1).sum::<f64>() / x.len().max(1) as f64;
            if half > 0 {
                md.push_str(&format!(
                    "Tier {t}: {} steps, mean reward {:.3} over the first half, {:.3} over the second.\n",
                    v.len(),
                    avg(&v[..half]),
                    avg(&v[v.len() - half..])
                ));
            }
        }
    }
}

/// `report.md` and its plots, over the checkpoints `cks`; `kb_ops`: the KernelBench levels'
/// hold-out problems against the training tasks' ops (empty without KernelBench problems).
fn report(
    dir: &std::path::Path,
    (sums, rows, metrics): (&[Value], &[Row], &Table),
    (mode, device): (&str, &str),
    cks: &[&str],
    kb_ops: &[LevelOps<'_>],
    pre: Option<(Metric, Option<Metric>)>,
) -> Result<(), String> {
    use cudarl_data::plot::{Series, bar_chart, histogram, line_chart};
    let curve = RewardColumns::read(metrics)?;
    let RewardColumns { steps, mr, sd } = &curve;
    let pts: Vec<(f64, f64, f64)> = (0..metrics.rows())
        .filter_map(|i| Some((steps.get(i)? as f64, mr.get(i)?, sd.get(i)?)))
        .collect();
    line_chart(
        &dir.join("reward_curve.png"),
        &format!("rl-train: mean episode reward ({mode}, {device})"),
        "RL step",
        "final reward",
        &[
            Series::new("mean", pts.iter().map(|p| (p.0, p.1)).collect()),
            Series::new("mean + std", pts.iter().map(|p| (p.0, p.1 + p.2)).collect()),
            Series::new("mean - std", pts.iter().map(|p| (p.0, p.1 - p.2)).collect()),
        ],
    )?;
    let mut tiers: BTreeMap<(&str, i64), (f64, f64, f64)> = BTreeMap::new();
    for r in rows.iter().filter(|r| is_family(r)) {
        let e = tiers.entry((r.ck, r.ep.tier)).or_default();
        e.0 += 1.0;
        e.1 += f64::from(u8::from(r.ep.best_components().compiled));
        e.2 += f64::from(u8::from(r.ep.best_components().correct == Some(true)));
    }
    let full = mode == "full";
    // Tiers as categories (bars), in order: a line between tiers would mean nothing.
    let tier_ids: Vec<i64> = tiers
        .keys()
        .map(|(_, t)| *t)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut series = Vec::new();
    for &ck in cks {
        let of = |k: usize| -> Vec<(f64, f64)> {
            tiers
                .iter()
                .filter(|((c, _), _)| *c == ck)
                .filter_map(|((_, t), v)| {
                    let i = tier_ids.iter().position(|x| x == t)?;
                    Some((i as f64, if k == 1 { v.1 / v.0 } else { v.2 / v.0 }))
                })
                .collect()
        };
        series.push(Series::new(format!("{ck} compile rate"), of(1)));
        if full {
            series.push(Series::new(format!("{ck} pass rate"), of(2)));
        }
    }
    bar_chart(
        &dir.join("per_tier.png"),
        &format!("eval: compile and pass rate per tier, best turn of each episode ({mode})"),
        &tier_ids
            .iter()
            .map(|t| format!("tier {t}"))
            .collect::<Vec<_>>(),
        "share of episodes",
        &series,
    )?;
    let sp = |ck: &str| -> Series {
        Series::new(
            ck,
            rows.iter()
                .filter(|r| r.ck == ck && r.ep.best_components().correct == Some(true))
                .filter_map(|r| {
                    r.ep.best_components()
                        .speedup
                        .map(|s| (0.0, s.max(1e-9).log2()))
                })
                .collect(),
        )
    };
    let groups: Vec<Series> = cks.iter().map(|ck| sp(ck)).collect();
    let have_speedups = groups.iter().any(|g| !g.points.is_empty());
    if have_speedups {
        histogram(
            &dir.join("speedups.png"),
            "eval: log2 speedup vs naive of the correct best kernels",
            "log2(speedup)",
            &groups,
            12,
        )?;
    }
    let mut md = String::new();
    md.push_str(&format!(
        "# cudarl-pipe eval report\n\nMode: **{mode}** (full = compiled, tested on train and hold-out shapes with public and hidden seeds, and timed on a GPU; compile-only = no GPU: only the static checks and nvcc ran, so pass rates and speedups are n/a). Models on: {device}.\n\n"
    ));
    if mode != "full" {
        md.push_str(&without_gpu(sums));
    }
    md.push_str("| checkpoint | split | episodes | compile (1 turn) | pass (1 turn) | compile | pass | fast_1 | fast_1.5 | fast_2 | geomean vs naive | geomean vs torch | hold-out regressions | mean reward | flagged |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for s in sums.iter().filter(|s| s["checkpoint"] != RL_MINUS_SFT) {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            s["checkpoint"].as_str().unwrap_or_default(),
            s["split"].as_str().unwrap_or_default(),
            s["episodes"],
            fmt(&s["single_turn_compile_rate"]),
            fmt(&s["single_turn_pass_rate"]),
            fmt(&s["compile_rate"]),
            fmt(&s["pass_rate"]),
            fmt(&s["fast_1"]),
            fmt(&s["fast_1_5"]),
            fmt(&s["fast_2"]),
            fmt(&s["geomean_speedup_vs_naive"]),
            fmt(&s["geomean_speedup_vs_torch"]),
            fmt(&s["holdout_regression_rate"]),
            fmt(&s["mean_reward"]),
            fmt(&s["flagged_rate"]),
        ));
    }
    kernelbench_section(&mut md, sums, kb_ops);
    if let Some((primary, guardrail)) = pre {
        let c = comparison(&mut md, rows, metrics, primary, guardrail);
        let text = serde_json::to_string_pretty(&c).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("comparison.json"), text + "\n").map_err(|e| e.to_string())?;
    }
    rl_minus_sft(&mut md, sums, rows, mode);
    // What the loop made of each kind of start (full mode: "ended correct" needs tests).
    if mode == "full" {
        let items: Vec<(&str, &str, &str, bool)> = rows
            .iter()
            .filter(|r| is_family(r))
            .map(|r| {
                (
                    r.ck,
                    r.split,
                    first_turn_outcome(&r.ep.first_components()),
                    r.ep.best_components().correct == Some(true),
                )
            })
            .collect();
        md.push_str(&format!(
            "\nEpisodes by their first turn (the generator's answer): how many, and in brackets the fraction that ended correct after the optimizer's turns.\n\n{}",
            first_turn_table(&items)
        ));
    }
    if let (Some(a), Some(b)) = (pts.first(), pts.last()) {
        md.push_str(&format!(
            "\nRL reward: step {} mean {:.3} (std {:.3}) -> step {} mean {:.3} (std {:.3}).\n",
            a.0, a.1, a.2, b.0, b.1, b.2
        ));
    }
    learning_curves(&mut md, metrics, &curve);
    md.push_str("\n![reward curve](reward_curve.png)\n\n![per-tier rates](per_tier.png)\n");
    if have_speedups {
        md.push_str("\n![speedups](speedups.png)\n");
    }
    std::fs::write(dir.join("report.md"), md).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compile_only_report_says_whether_kernelbench_was_in_the_run() {
        let fam = serde_json::json!({"split": "test"});
        let kb = serde_json::json!({"split": "kernelbench/level1"});
        let without = without_gpu(std::slice::from_ref(&fam));
        assert!(
            without.contains("No KernelBench problem was in this run"),
            "{without}"
        );
        let with = without_gpu(&[fam, kb]);
        assert!(
            with.contains("KernelBench problems were only compiled.")
                && !with.contains("No KernelBench"),
            "{with}"
        );
    }

    /// An episode of `task` with no turn (nothing compiled).
    fn empty(task: &str) -> Row {
        Row {
            ck: "sft",
            split: "kernelbench/level2",
            ep: Episode {
                task_id: task.into(),
                tier: 2,
                turns: vec![],
                seen: BTreeMap::new(),
                trajectory: vec![],
                failed: vec![],
                tried: vec![],
                done: true,
            },
        }
    }

    #[test]
    fn a_split_where_nothing_compiled_has_zero_rates_on_a_gpu_and_none_without_one() {
        let rows = [empty("kb/L2/1_a"), empty("kb/L2/2_b")];
        let sel: Vec<&Row> = rows.iter().collect();
        let full = summary(&sel, true, true);
        assert_eq!(full.episodes, 2);
        assert_eq!(full.compile_rate, 0.0);
        assert_eq!(full.pass_rate, Some(0.0));
        assert_eq!((full.fast_0, full.fast_1), (Some(0.0), Some(0.0)));
        assert_eq!(full.single_turn_pass_rate, Some(0.0));
        assert_eq!(full.geomean_speedup_vs_torch, None);
        assert_eq!(full.fast_1_vs_compile, Some(0.0));
        assert_eq!(summary(&sel, true, false).fast_1_vs_compile, None);
        let compile_only = summary(&sel, false, true);
        assert_eq!(compile_only.pass_rate, None);
        assert_eq!(compile_only.fast_1, None);
    }

    /// An episode of `task` on `split` by checkpoint `ck` with one turn: compiled, correct as
    /// `pass`, reward `reward`.
    fn episode(ck: &'static str, split: &'static str, task: &str, pass: bool, reward: f64) -> Row {
        let mut r = empty(task);
        (r.ck, r.split) = (ck, split);
        r.ep.turns.push(cudarl_rl::episode::Turn {
            turn: 0,
            role: cudarl_protocol::Role::Generator,
            completion: None,
            tokens: 1,
            text: String::new(),
            code: Some("__global__ void k() {}".into()),
            failure: None,
            feedback: String::new(),
            reward: RewardComponents {
                has_code: true,
                compiled: true,
                correct: Some(pass),
                reward,
                ..Default::default()
            },
            credit: 0.0,
            value: None,
            prompt: vec![],
        });
        r
    }

    #[test]
    fn rl_minus_the_frozen_control_on_the_practised_problems_is_paired_by_problem() {
        // Two episodes per problem and checkpoint. Problem a: SFT passes 0 of 2, RL 2 of 2
        // (+1); b: 1 of 2 and 1 of 2 (0); c: 2 of 2 and 1 of 2 (-0.5). Mean 1/6; the sample
        // variance ((5/6)^2 + (1/6)^2 + (2/3)^2) / 2 = 7/12, se = sqrt(7/12 / 3) = sqrt(7/36).
        // Rewards: pass 1.0, else 0.25, so each problem's reward difference is 0.75 times its
        // pass difference.
        let (s, r) = (PRACTISED, "rl");
        let ep = |ck, t, pass| episode(ck, s, t, pass, if pass { 1.0 } else { 0.25 });
        let mut rows = vec![
            ep("sft", "kb/L1/a", false),
            ep("sft", "kb/L1/a", false),
            ep("sft", "kb/L1/b", true),
            ep("sft", "kb/L1/b", false),
            ep("sft", "kb/L1/c", true),
            ep("sft", "kb/L1/c", true),
            ep(r, "kb/L1/a", true),
            ep(r, "kb/L1/a", true),
            ep(r, "kb/L1/b", false),
            ep(r, "kb/L1/b", true),
            ep(r, "kb/L1/c", true),
            ep(r, "kb/L1/c", false),
        ];
        // Episodes on other splits do not enter.
        rows.push(ep(r, "kb/L1/d", true));
        rows.last_mut().expect("a row").split = "kernelbench/level1";
        let d = practised_minus_control(&rows, true).expect("a difference row");
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert_eq!((d.checkpoint, d.split), (RL_MINUS_SFT, PRACTISED));
        assert_eq!((d.episodes, d.pairs), (6, Some(3)));
        let se = (7.0f64 / 36.0).sqrt();
        assert!(close(d.pass_rate.unwrap(), 1.0 / 6.0), "{d:?}");
        assert!(close(d.pass_rate_se.unwrap(), se), "{d:?}");
        assert!(close(d.mean_reward, 0.75 / 6.0), "{d:?}");
        assert!(close(d.mean_reward_se.unwrap(), 0.75 * se), "{d:?}");
        // Every episode compiled on both sides.
        assert_eq!((d.compile_rate, d.single_turn_compile_rate), (0.0, 0.0));
        // Compile-only: no pass rate, the reward difference still.
        let c = practised_minus_control(&rows, false).unwrap();
        assert_eq!((c.pass_rate, c.pass_rate_se), (None, None));
        assert!(close(c.mean_reward, 0.75 / 6.0));
        // RL practised nothing: no row.
        let families: Vec<Row> = rows.into_iter().filter(|r| r.split != PRACTISED).collect();
        assert!(practised_minus_control(&families, true).is_none());
        // The report's line names n and df.
        let v = serde_json::to_value(&d).unwrap();
        let line = practised_line(&v);
        assert!(
            line.contains("pass rate +0.167 +- 0.441") && line.contains("n = 3, df = 2"),
            "{line}"
        );
    }

    /// The bundled task families (`datasets/tasks` and the generated families of
    /// `pipelines/default.toml`) and KernelBench problems (`datasets/kernelbench`), split as
    /// that pipeline's `splits` stage splits them: the task set and the KernelBench problems
    /// `(split, problem)`.
    fn bundled() -> (cudarl_rl::tasks::TaskSet, Vec<(String, KbTask)>) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let pipeline: toml::Table =
            toml::from_str(&std::fs::read_to_string(root.join("pipelines/default.toml")).unwrap())
                .unwrap();
        let stage = |name: &str| pipeline["stages"][name].as_table().unwrap().clone();
        let tasks = cudarl_cuda::task::load_tasks(&root.join("datasets/tasks")).unwrap();
        let mut specs: Vec<TaskSpec> = tasks.iter().map(|t| t.spec.clone()).collect();
        let exclude = specs
            .iter()
            .flat_map(|s| s.reference.values().cloned())
            .collect();
        let generate: cudarl_rl::families::GenerateParams =
            stage("synth-tasks")["generate"].clone().try_into().unwrap();
        let generated = cudarl_rl::families::generate(&generate, &exclude);
        specs.extend(generated.into_iter().map(|f| f.spec));
        let splits = crate::splits::Splits::from_table(stage("splits")).unwrap();
        let mut ts = cudarl_rl::tasks::TaskSet::default();
        for (row, spec) in splits.families(&specs).into_iter().zip(specs) {
            match row.split.as_str() {
                "test" => ts.test.push(spec),
                "rl" => ts.rl.push(spec),
                _ => ts.train.push(spec),
            }
        }
        let kb = Table::read(
            &root.join("datasets/kernelbench/problems.parquet"),
            "problems",
        )
        .unwrap();
        let (level, name, code) = (
            kb.req_ints("level").unwrap(),
            kb.req_strings("name").unwrap(),
            kb.req_strings("code").unwrap(),
        );
        let problems: Vec<KbTask> = (0..kb.rows())
            .map(|i| KbTask {
                id: format!("kb/L{}/{}", level.get(i).unwrap(), name.get(i).unwrap()),
                tier: 0,
                level: level.get(i).unwrap(),
                name: name.get(i).unwrap().into(),
                code: code.get(i).unwrap().into(),
                signature: String::new(),
            })
            .collect();
        let ids: Vec<(String, i64)> = problems.iter().map(|p| (p.id.clone(), p.level)).collect();
        let drawn: BTreeMap<String, String> = splits
            .kernelbench(&ids)
            .into_iter()
            .map(|r| (r.item_id, r.split))
            .collect();
        let kb = problems
            .into_iter()
            .filter_map(|p| Some((drawn.get(&p.id)?.clone(), p)))
            .collect();
        (ts, kb)
    }

    #[test]
    fn hold_out_problems_with_an_op_no_training_task_uses_are_novel_on_the_bundled_data() {
        let (ts, kb) = bundled();
        let cov = training_ops(&ts, &kb);
        let test = |id: &str| -> &KbTask {
            kb.iter()
                .find(|(s, t)| s == "test" && t.id == id)
                .map(|(_, t)| t)
                .unwrap_or_else(|| panic!("{id} is no hold-out problem"))
        };
        let novel = |id: &str| cov.novel(&test(id).code);
        // Ops no family and no KernelBench `train` problem uses.
        assert_eq!(novel("kb/L1/51_Argmax_over_a_dimension"), ["argmax"]);
        // Covered since the families have a cumprod.
        assert_eq!(novel("kb/L1/90_cumprod"), Vec::<String>::new());
        assert_eq!(
            novel("kb/L2/8_Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum"),
            ["adaptiveavgpool3d"]
        );
        // One vocabulary for both sides: the families' modules cover a problem that writes
        // its ops otherwise (`nn.Linear`, `torch.sigmoid`, `torch.sum`, `x - y`, ...).
        let families_only = training_ops(&ts, &[]);
        for id in [
            "kb/L1/20_LeakyReLU",
            "kb/L1/40_LayerNorm",
            "kb/L2/9_Matmul_Subtract_Multiply_ReLU",
            "kb/L2/56_Matmul_Sigmoid_Sum",
        ] {
            assert_eq!(
                families_only.novel(&test(id).code),
                Vec::<String>::new(),
                "{id}"
            );
        }
        // Families and KernelBench `train` problems both cover 2-D convolutions.
        let conv = &test("kb/L1/63_conv_standard_2D__square_input__square_kernel").code;
        assert_eq!(families_only.novel(conv), Vec::<String>::new());
        assert_eq!(cov.novel(conv), Vec::<String>::new());
        // Hold-out families and `val` and `test` problems are not training tasks: with them
        // counted, fewer hold-out problems would be novel, never more.
        let mut all = ts.clone();
        all.train.append(&mut all.test.clone());
        let everything: Vec<(String, KbTask)> = kb
            .iter()
            .map(|(_, t)| ("train".to_string(), t.clone()))
            .collect();
        let wide = training_ops(&all, &everything);
        assert!(cov.seen().is_subset(wide.seen()));
        assert!(
            wide.novel(&test("kb/L1/51_Argmax_over_a_dimension").code)
                .is_empty()
        );
        // The levels `kb-specs` gives launchers (1 and 2) have novel and seen problems: 3 of
        // level 1's 25 (triu, argmax, narrow), 2 of level 2's 25 (docs/architecture.md says so).
        for (level, want) in [(1, 3), (2, 2)] {
            let held: Vec<&KbTask> = kb
                .iter()
                .filter(|(s, t)| s == "test" && t.level == level)
                .map(|(_, t)| t)
                .collect();
            let n = held
                .iter()
                .filter(|t| !cov.novel(&t.code).is_empty())
                .count();
            assert_eq!((n, held.len()), (want, 25), "level {level}");
        }
    }

    #[test]
    fn each_level_has_its_op_coverage_splits() {
        assert_eq!(
            ops_split("kernelbench/level1", true),
            "kernelbench/level1/novel_ops"
        );
        assert_eq!(
            ops_split("kernelbench/level2", false),
            "kernelbench/level2/seen_ops"
        );
        assert!(is_kernelbench(ops_split("kernelbench", true)));
        assert!(is_kernelbench(PRACTISED));
    }
}
