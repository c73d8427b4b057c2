//! The eval report: the rates of one checkpoint on one split (compile, pass, fast_p, speedups,
//! mean reward), RL against SFT and against its frozen control with their standard errors, and
//! `report.md` with its plots, built from the episodes `eval` ran and `rl-train`'s `metrics`
//! (docs/architecture.md, "The eval report"). The `eval` stage runs the episodes and writes the
//! tables; everything here is a function of them.

use std::collections::BTreeMap;

use cudarl_data::Table;
use cudarl_data::plot::{Series, bar_chart, histogram, line_chart};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::RlError;
use crate::episode::Episode;
use crate::reward::RewardComponents;
use crate::stats::{
    MeanDiff, first_turn_outcome, first_turn_table, geomean, mean_std, paired_diff, pooled,
    rate_diff, stratified_diff,
};

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
    pub fn name(self) -> &'static str {
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

    /// Whether the metric is measured without a GPU (a compile rate).
    pub fn compile_only(self) -> bool {
        matches!(self, Metric::Compile | Metric::SingleTurnCompile)
    }

    /// Whether episode `r` counts.
    pub fn hit(self, r: &Row) -> bool {
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

pub struct Row {
    pub ck: &'static str,
    pub split: &'static str,
    pub ep: Episode,
}

/// Whether an episode (a row of one checkpoint and split) counts for a rate.
pub type Outcome = dyn Fn(&Row) -> bool;

/// One row of `summary` (the columns of [`SUMMARY`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct SummaryRow {
    pub checkpoint: &'static str,
    pub split: &'static str,
    pub episodes: i64,
    pub single_turn_compile_rate: f64,
    pub single_turn_pass_rate: Option<f64>,
    pub compile_rate: f64,
    pub pass_rate: Option<f64>,
    pub fast_0: Option<f64>,
    pub fast_1: Option<f64>,
    pub fast_1_5: Option<f64>,
    pub fast_2: Option<f64>,
    pub geomean_speedup_vs_naive: Option<f64>,
    pub geomean_speedup_vs_torch: Option<f64>,
    pub fast_1_vs_compile: Option<f64>,
    pub fast_1_5_vs_compile: Option<f64>,
    pub fast_2_vs_compile: Option<f64>,
    pub geomean_speedup_vs_compile: Option<f64>,
    pub holdout_regression_rate: Option<f64>,
    pub mean_reward: f64,
    pub flagged_rate: f64,
    pub mode: &'static str,
    pub device: &'static str,
    pub candidates: i64,
    pub gen_seconds: f64,
    pub harness_seconds: f64,
    pub harness_compile_seconds: f64,
    pub harness_gpu_seconds: f64,
    pub harness_sass_seconds: f64,
    /// A difference row ([`RL_MINUS_SFT`]): the standard errors of its pass rate and mean
    /// reward ([`MeanDiff`]); `None` elsewhere.
    pub pass_rate_se: Option<f64>,
    pub mean_reward_se: Option<f64>,
    /// A difference row: the problems paired, `n` (`n - 1` degrees of freedom).
    pub pairs: Option<i64>,
}

/// The metrics of one checkpoint and split over its episodes `rows`; `full`: tests ran (a GPU),
/// so the pass rate and fast_p are rates (0 when nothing compiled), not n/a; `vs_compile`: the
/// split's references were also timed under `torch.compile` (KernelBench problems), so fast_p
/// against it is a rate too (a correct kernel whose reference did not compile counts as not
/// faster).
pub fn summary(rows: &[&Row], full: bool, vs_compile: bool) -> SummaryRow {
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

/// A level's hold-out problems against the training tasks' ops.
pub struct LevelOps<'a> {
    /// `kernelbench/level{L}`.
    pub split: &'static str,
    /// Its problems `eval` ran.
    pub problems: usize,
    /// Those with an op no training task uses, and those ops.
    pub novel: Vec<(&'a str, &'a [String])>,
}

/// The summary split of the KernelBench `train` problems `rl-train` practised
/// (`kernelbench_share`), run by every checkpoint; its `rl_minus_sft` row is RL minus the frozen
/// control, paired by problem ([`practised_minus_control`]).
pub const PRACTISED: &str = "kernelbench/practised";

/// The `checkpoint` of a `summary` row that is RL minus SFT paired by problem.
pub const RL_MINUS_SFT: &str = "rl_minus_sft";

/// The report's paragraph on what a run without a GPU (compile-only) shows and does not: the
/// compile rates are real nvcc verdicts on the agents' kernels; correctness, speed and learning
/// from rewards need a GPU; and whether KernelBench problems were in the run (`sums` has their
/// `kernelbench/level{L}` rows; the `cpu` profile runs one episode per problem).
pub fn without_gpu(sums: &[Value]) -> String {
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

/// Per problem of `split`, checkpoint `other`'s mean of `x` over its episodes minus `base`'s
/// (problems `other` ran, in id order), and their mean with its standard error
/// ([`MeanDiff`]: paired by problem, `n` problems, `n - 1` degrees of freedom); `None` when
/// no problem has episodes on both sides.
pub fn per_problem_diff(
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
pub fn practised_minus_control(rows: &[Row], full: bool) -> Option<SummaryRow> {
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
pub fn is_family(r: &Row) -> bool {
    !is_kernelbench(r.split)
}

/// The per-tier summary splits of the hold-out and train families, tiers 0-3.
pub const TIER_SPLITS: [[&str; 2]; 4] = [
    ["test/tier0", "train/tier0"],
    ["test/tier1", "train/tier1"],
    ["test/tier2", "train/tier2"],
    ["test/tier3", "train/tier3"],
];

/// The summary split of `split`'s (`test` or `train`) families of tier `tier` (0-3).
pub fn tier_split(split: &str, tier: usize) -> &'static str {
    TIER_SPLITS[tier][usize::from(split != "test")]
}

/// Whether `split` holds KernelBench problems (`kernelbench/level{L}`, [`kb_split`]).
pub fn is_kernelbench(split: &str) -> bool {
    split.starts_with("kernelbench")
}

/// The report's KernelBench section: per checkpoint and split, from the `summary` rows of the
/// `kernelbench/...` splits (none: nothing), then which hold-out problems of each level use an
/// op no training task uses (`kb_ops`), and RL minus the frozen control on the problems RL
/// practised (the [`RL_MINUS_SFT`] row, when there is one).
pub fn kernelbench_section(md: &mut String, sums: &[Value], kb_ops: &[LevelOps<'_>]) {
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
pub fn novel_ops_paragraph(kb_ops: &[LevelOps<'_>]) -> String {
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
pub fn practised_line(d: &Value) -> String {
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

pub fn fmt(v: &Value) -> String {
    match v.as_f64() {
        Some(x) => format!("{x:.3}"),
        None => "n/a".into(),
    }
}

/// The reward curve's columns of the `metrics` table: step, mean reward, its standard deviation.
pub struct RewardColumns {
    steps: cudarl_data::parquet_io::I64Col,
    mr: cudarl_data::parquet_io::F64Col,
    sd: cudarl_data::parquet_io::F64Col,
}

impl RewardColumns {
    /// Reads them.
    ///
    /// # Errors
    /// `metrics` lacks `step`, `mean_reward` or `reward_std`.
    fn read(metrics: &Table) -> Result<RewardColumns, RlError> {
        let e = RlError::from;
        Ok(RewardColumns {
            steps: metrics.req_ints("step").map_err(e)?,
            mr: metrics.req_floats("mean_reward").map_err(e)?,
            sd: metrics.req_floats("reward_std").map_err(e)?,
        })
    }
}

/// The report's RL-minus-SFT section per split (test, then train): each rate's difference with
/// one standard error, the same stratified by task, and paired by sampling seed.
pub fn rl_minus_sft(md: &mut String, sums: &[Value], rows: &[Row], mode: &str) {
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
pub fn paired_by_seed(
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
/// `comparison.json` holds. Without `full` (compile-only: no kernel ran) only compile rates
/// are measured: every comparison in another metric is null, and "n/a" in the text.
pub fn comparison(
    md: &mut String,
    rows: &[Row],
    metrics: &Table,
    (primary, guardrail): (Metric, Option<Metric>),
    full: bool,
) -> Value {
    let measured = |m: &Metric| full || m.compile_only();
    let versus = |m: Metric, other: &str| {
        measured(&m)
            .then(|| holdout_versus(rows, m, other))
            .flatten()
    };
    let mut out = serde_json::json!({
        "primary_metric": primary.name(),
        "guardrail_metric": guardrail.map(Metric::name),
        "holdout_primary": versus(primary, "rl"),
        "holdout_guardrail": guardrail.and_then(|g| versus(g, "rl")),
        "practised_reward": practised_per_step(metrics, "reward"),
        "practised_pass_rate": full.then(|| practised_per_step(metrics, "pass")).flatten(),
    });
    out["rl_multi_minus_single_turn"] = if guardrail.unwrap_or(Metric::Pass).compile_only() || full
    {
        multi_minus_single_turn(rows, guardrail)
    } else {
        Value::Null
    };
    let collab = rows.iter().any(|r| r.ck == "collab");
    if collab {
        out["holdout_collab_primary"] = versus(primary, "collab").into();
        out["holdout_collab_guardrail"] = guardrail.and_then(|g| versus(g, "collab")).into();
    }
    comparison_text(md, &out, (primary, guardrail), (collab, full));
    out
}

/// Checkpoint `other` - SFT on the hold-out families (`test`) in metric `m`, paired by seed
/// ([`paired_by_seed`]): the metric, the difference (key `{other}_minus_sft`), its standard
/// error, the pairs gained and lost, and `other`'s episodes; `None` when the sides differ.
fn holdout_versus(rows: &[Row], m: Metric, other: &str) -> Option<Value> {
    let (d, se, gained, lost) = paired_by_seed(rows, "test", ("sft", other), &|r| m.hit(r))?;
    let pairs = rows
        .iter()
        .filter(|r| r.split == "test" && r.ck == other)
        .count();
    Some(serde_json::json!({
        "metric": m.name(), format!("{other}_minus_sft"): d, "se": se, "gained": gained,
        "lost": lost, "pairs": pairs,
    }))
}

/// RL - the frozen control per step from `metrics` in `col` (`reward`: the mean reward, else
/// the pass rate), steps 2 on: the mean difference, its standard error and the steps; `None`
/// without the control's column or with fewer than two steps.
fn practised_per_step(metrics: &Table, col: &str) -> Option<Value> {
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
}

/// Multi-turn above single-turn: each RL hold-out episode's best turn against its first, in
/// the `guardrail` metric's outcome (pass when none is named), clustered by task (`null` when
/// there is no difference to take).
fn multi_minus_single_turn(rows: &[Row], guardrail: Option<Metric>) -> Value {
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
    paired_diff(&pairs)
        .map(|(d, se, gained, _)| {
            serde_json::json!({
                "metric": g.name(), "multi_minus_single": d, "se": se, "episodes_gained": gained,
                "episodes": pairs.len(),
            })
        })
        .into()
}

/// A difference `v[key]` with its standard error `v["se"]`, as the report shows it; `na` when
/// there is none.
fn show_diff(v: &Value, key: &str, na: &str) -> String {
    match (v[key].as_f64(), v["se"].as_f64()) {
        (Some(d), Some(se)) => format!("{d:+.3} +- {se:.3}"),
        (Some(d), None) => format!("{d:+.3} (one task: no standard error)"),
        _ => na.into(),
    }
}

/// Appends the pre-registered comparison's section to `md` from `out` (what
/// [`comparison`] returns); `collab`: collab-SFT was evaluated; `full`: kernels ran (else a
/// missing difference reads "n/a (not measured)").
fn comparison_text(
    md: &mut String,
    out: &Value,
    (primary, guardrail): (Metric, Option<Metric>),
    (collab, full): (bool, bool),
) {
    let na = if full { "n/a" } else { "n/a (not measured)" };
    md.push_str(&format!(
        "
## Pre-registered comparison

Primary metric, named in the pipeline before the run: **{}**. RL - SFT on the hold-out families, paired by sampling seed (+- one standard error clustered by task): {}.",
        primary.name(),
        show_diff(&out["holdout_primary"], "rl_minus_sft", na)
    ));
    if let Some(g) = guardrail {
        md.push_str(&format!(
            " Guardrail {}: {}.",
            g.name(),
            show_diff(&out["holdout_guardrail"], "rl_minus_sft", na)
        ));
    }
    let m = &out["rl_multi_minus_single_turn"];
    let g = guardrail
        .filter(|g| g.compile_only())
        .unwrap_or(Metric::Pass);
    md.push_str(&format!(
        " RL's multi-turn minus single-turn {} on the hold-out (best turn against first turn, same episodes): {}.",
        m["metric"].as_str().unwrap_or(g.name()),
        show_diff(m, "multi_minus_single", na)
    ));
    if collab {
        md.push_str(&format!(
            " Cross-agent fine-tuning (`collab`), collab-SFT - SFT on the same episodes' seeds: {}",
            show_diff(&out["holdout_collab_primary"], "collab_minus_sft", na)
        ));
        if let Some(g) = guardrail {
            md.push_str(&format!(
                ", guardrail {}: {}",
                g.name(),
                show_diff(&out["holdout_collab_guardrail"], "collab_minus_sft", na)
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
}

/// The report's learning-curve section from the `metrics` table (its reward curve in `curve`):
/// the first against the last half of the steps, RL against its frozen control per step, and
/// per tier.
pub fn learning_curves(md: &mut String, metrics: &Table, curve: &RewardColumns) {
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
pub fn report(
    dir: &std::path::Path,
    (sums, rows, metrics): (&[Value], &[Row], &Table),
    (mode, device): (&str, &str),
    cks: &[&str],
    kb_ops: &[LevelOps<'_>],
    pre: Option<(Metric, Option<Metric>)>,
) -> Result<(), RlError> {
    let curve = RewardColumns::read(metrics)?;
    let pts = reward_curve_plot(dir, metrics, &curve, (mode, device))?;
    per_tier_plot(dir, rows, cks, mode)?;
    let have_speedups = speedups_plot(dir, rows, cks)?;
    let mut md = summary_section(sums, mode, device);
    kernelbench_section(&mut md, sums, kb_ops);
    if let Some((primary, guardrail)) = pre {
        let c = comparison(&mut md, rows, metrics, (primary, guardrail), mode == "full");
        let text = serde_json::to_string_pretty(&c).map_err(|e| RlError::Failed(e.to_string()))?;
        write_file(&dir.join("comparison.json"), text + "\n")?;
    }
    rl_minus_sft(&mut md, sums, rows, mode);
    // What the loop made of each kind of start (full mode: "ended correct" needs tests).
    if mode == "full" {
        first_turn_section(&mut md, rows);
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
    write_file(&dir.join("report.md"), md)
}

/// Writes `text` to `to`; the error names the file.
///
/// # Errors
/// The file cannot be written.
fn write_file(to: &std::path::Path, text: String) -> Result<(), RlError> {
    std::fs::write(to, text).map_err(|e| RlError::Failed(format!("{}: {e}", to.display())))
}

/// Plots `reward_curve.png` in `dir`: the mean episode reward per RL step with one standard
/// deviation either side, from `curve` (the columns of `metrics`); returns its points
/// (step, mean, standard deviation).
///
/// # Errors
/// The plot cannot be drawn or written.
fn reward_curve_plot(
    dir: &std::path::Path,
    metrics: &Table,
    curve: &RewardColumns,
    (mode, device): (&str, &str),
) -> Result<Vec<(f64, f64, f64)>, RlError> {
    let RewardColumns { steps, mr, sd } = curve;
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
    Ok(pts)
}

/// Plots `per_tier.png` in `dir`: per checkpoint of `cks`, the share of family episodes whose
/// best turn compiled (and, in `full` mode, passed) per tier, as bars.
///
/// # Errors
/// The plot cannot be drawn or written.
fn per_tier_plot(
    dir: &std::path::Path,
    rows: &[Row],
    cks: &[&str],
    mode: &str,
) -> Result<(), RlError> {
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
    Ok(())
}

/// Plots `speedups.png` in `dir`, the histogram of log2 speedup vs naive of each checkpoint's
/// correct best kernels, when there is any; returns whether there was.
///
/// # Errors
/// The plot cannot be drawn or written.
fn speedups_plot(dir: &std::path::Path, rows: &[Row], cks: &[&str]) -> Result<bool, RlError> {
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
    Ok(have_speedups)
}

/// The report's title, what `mode` measured (with what a run without a GPU shows), and the
/// table of the `summary` rows `sums` per checkpoint and split (difference rows left out).
fn summary_section(sums: &[Value], mode: &str, device: &str) -> String {
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
    md
}

/// Appends the table of family episodes by their first turn's outcome to `md`: per checkpoint
/// and split, how many, and the fraction that ended correct.
fn first_turn_section(md: &mut String, rows: &[Row]) {
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

/// The summary splits of a level's hold-out problems by op coverage: `[novel, seen]`, those
/// with an op no training task uses and those whose every op some training task uses.
pub const OPS_SPLITS: [(&str, [&str; 2]); 4] = [
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
pub fn ops_split(split: &str, novel: bool) -> &'static str {
    let pair = OPS_SPLITS
        .iter()
        .find(|(s, _)| *s == split)
        .map_or(["kernelbench/novel_ops", "kernelbench/seen_ops"], |p| p.1);
    pair[usize::from(!novel)]
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
        r.ep.turns.push(crate::episode::Turn {
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

    /// Without a GPU only compile rates are measured: a comparison in pass or a fast_p is
    /// null in `comparison.json` and "n/a" in the report, never a measured-looking zero.
    #[test]
    fn a_compile_only_comparison_leaves_unmeasured_metrics_null() {
        let ep = |ck, t, pass| episode(ck, "test", t, pass, 0.5);
        let rows = vec![
            ep("sft", "a", false),
            ep("sft", "a", true),
            ep("sft", "b", false),
            ep("sft", "b", false),
            ep("rl", "a", true),
            ep("rl", "a", true),
            ep("rl", "b", true),
            ep("rl", "b", false),
        ];
        // Three RL steps with the frozen control's columns beside RL's.
        let cols = [
            "mean_reward",
            "control_reward",
            "pass_rate",
            "control_pass_rate",
        ];
        let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(
            cols.iter()
                .map(|c| {
                    arrow::datatypes::Field::new(*c, arrow::datatypes::DataType::Float64, false)
                })
                .collect::<Vec<_>>(),
        ));
        let column = |v: [f64; 3]| -> arrow::array::ArrayRef {
            std::sync::Arc::new(arrow::array::Float64Array::from(v.to_vec()))
        };
        let batch = arrow::record_batch::RecordBatch::try_new(
            schema.clone(),
            vec![
                column([0.1, 0.3, 0.5]),
                column([0.1, 0.2, 0.2]),
                column([0.0, 0.5, 0.5]),
                column([0.0, 0.25, 0.0]),
            ],
        )
        .expect("a metrics batch");
        let metrics = Table {
            file: "metrics".into(),
            batch,
            schema,
        };
        let pre = (Metric::FastNaive15, Some(Metric::Pass));
        let mut md = String::new();
        let c = comparison(&mut md, &rows, &metrics, pre, false);
        for k in [
            "holdout_primary",
            "holdout_guardrail",
            "practised_pass_rate",
        ] {
            assert!(c[k].is_null(), "{k}: {c}");
        }
        assert!(c["rl_multi_minus_single_turn"].is_null(), "{c}");
        // The reward was measured (compile-only rewards).
        assert_eq!(c["practised_reward"]["steps"], 2, "{c}");
        assert!(
            md.contains("fast_naive_1_5**. RL - SFT on the hold-out families, paired by sampling seed (+- one standard error clustered by task): n/a (not measured)")
                && !md.contains("+0.000"),
            "{md}"
        );
        // A compile rate is measured without a GPU (collab-SFT against SFT too); on a GPU every
        // metric is.
        let mut with_collab = rows;
        for (t, pass) in [("a", true), ("a", true), ("b", true), ("b", false)] {
            with_collab.push(ep("collab", t, pass));
        }
        let mut md = String::new();
        let c = comparison(
            &mut md,
            &with_collab,
            &metrics,
            (Metric::Compile, None),
            false,
        );
        assert_eq!(c["holdout_primary"]["pairs"], 4, "{c}");
        assert_eq!(c["holdout_collab_primary"]["collab_minus_sft"], 0.0, "{c}");
        assert_eq!(c["holdout_collab_primary"]["pairs"], 4, "{c}");
        let mut md = String::new();
        let c = comparison(&mut md, &with_collab, &metrics, pre, true);
        assert_eq!(c["holdout_guardrail"]["rl_minus_sft"], 0.5, "{c}");
        assert_eq!(c["holdout_primary"]["rl_minus_sft"], 0.0, "{c}");
        assert_eq!(c["practised_pass_rate"]["steps"], 2, "{c}");
        assert_eq!(c["rl_multi_minus_single_turn"]["metric"], "pass", "{c}");
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
