//! `eval`: the SFT and the RL checkpoints on the same episodes: the hold-out families (the
//! `test` split of `sft-data`, never trained on) and, for per-tier rates, the train families;
//! every candidate is tested on the train and the hold-out shapes (full mode on a GPU).
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
//! | `summary` | checkpoint (utf8: sft, rl), split (utf8: test, train), episodes (int64), single_turn_compile_rate, single_turn_pass_rate (float64, pass nullable), compile_rate, pass_rate (nullable), fast_0, fast_1, fast_1_5, fast_2 (nullable), geomean_speedup_vs_naive, geomean_speedup_vs_torch (nullable), holdout_regression_rate (nullable), mean_reward (float64), flagged_rate (float64: episodes with a hack-flagged turn; flagged kernels are not passes), mode, device (utf8) |
//! | `episodes` | checkpoint, split, task_id (utf8), tier, episode, turns (int64), first_compiled (bool), first_correct (bool, nullable), compiled (bool), correct (bool, nullable), speedup_vs_naive, speedup_vs_torch (float64, nullable), reward (float64) |
//! | `turns` | checkpoint, split (utf8), episode (int64: the `episodes` row), then the columns of `rl-train`'s `turns` from `turn` on (turn, task_id, tier, role, tokens, text, code, failure, feedback, reward, credit, advantage (0: eval does not train), value, components_json): what each agent wrote and what the tester said |
//! | `report` | file, digest, bytes: `report.md`, `reward_curve.png`, `per_tier.png`, `speedups.png` |

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{InputDecl, OutputDecl, ResolveContext, Stage, StageContext, StageError};
use cudarl_cuda::task::TaskSpec;
use cudarl_data::Table;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::{data_err, params_json, write_output};
use crate::episode::{Episode, EpisodeSettings, run_episodes};
use crate::rl_train::{harness, load_tasks, mean_std, serve_job};
use crate::rollout::{Sampling, TrainerClient};
use crate::train_stages::{CHECKPOINT, ingest_dir, materialize};

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
        Field::new("reward", DataType::Float64, false),
    ]))
});

/// Schema of `turns`: checkpoint, split, episode, then [`crate::rl_train::turn_fields`].
pub static TURNS: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut f = vec![
        Field::new("checkpoint", DataType::Utf8, false),
        Field::new("split", DataType::Utf8, false),
        Field::new("episode", DataType::Int64, false),
    ];
    f.extend(crate::rl_train::turn_fields());
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
    /// Sampling, turns, reward, mode, device (as `rl-train`; the update settings are unused).
    #[serde(flatten)]
    pub rl: crate::rl_train::Params,
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

fn summary(rows: &[&Row]) -> Value {
    let n = rows.len().max(1) as f64;
    let frac = |f: &dyn Fn(&Row) -> bool| rows.iter().filter(|r| f(r)).count() as f64 / n;
    let full = rows.iter().any(|r| r.ep.best_components().mode == "full");
    let correct = |r: &Row| r.ep.best_components().honest_pass();
    let fast = |p: f64| {
        full.then(|| {
            frac(&|r| {
                correct(r)
                    && r.ep
                        .best_components()
                        .speedup_vs_torch
                        .is_some_and(|s| s > p)
            })
        })
    };
    let geo = |v: Vec<f64>| {
        (!v.is_empty())
            .then(|| (v.iter().map(|x| x.max(1e-9).ln()).sum::<f64>() / v.len() as f64).exp())
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
    json!({
        "episodes": rows.len(),
        "single_turn_compile_rate": frac(&|r| r.ep.first_components().compiled),
        "single_turn_pass_rate": full.then(|| frac(&|r| r.ep.first_components().honest_pass())),
        "compile_rate": frac(&|r| r.ep.best_components().compiled),
        "pass_rate": full.then(|| frac(&correct)),
        "fast_0": full.then(|| frac(&correct)),
        "fast_1": fast(1.0), "fast_1_5": fast(1.5), "fast_2": fast(2.0),
        "geomean_speedup_vs_naive": geo(rows.iter().filter(|r| correct(r)).filter_map(|r| r.ep.best_components().speedup).collect()),
        "geomean_speedup_vs_torch": geo(rows.iter().filter(|r| correct(r)).filter_map(|r| r.ep.best_components().speedup_vs_torch).collect()),
        "holdout_regression_rate": regress,
        "mean_reward": mean_std(&rewards).0,
        "flagged_rate": frac(&|r| r.ep.flagged()),
    })
}

impl Stage for Eval {
    fn kind(&self) -> &str {
        "eval"
    }
    fn code_version(&self) -> u32 {
        // 7: an episode's best turn breaks reward ties by correct, compiled, has code.
        // 8: the report adds RL - SFT paired by sampling seed, and single-turn compile to the
        // stratified comparison.
        // 9: a turn with a hack flag is not a pass (it earns 0); the summary and the report
        // count flagged episodes (`flagged_rate`).
        9
    }
    fn params(&self) -> Value {
        params_json(&self.params)
    }
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            InputDecl::external("reward"),
            InputDecl::node("tasks", "synth-tasks", "tasks"),
            InputDecl::node("kernels", "synth-tasks", "task_kernels"),
            InputDecl::node("data", "sft-data", "sft_generator"),
            InputDecl::node("sft_generator", "sft-train", "checkpoint"),
            InputDecl::node("sft_optimizer", "sft-train-optimizer", "checkpoint"),
            InputDecl::node("rl_generator", "rl-train", "generator"),
            InputDecl::node("rl_optimizer", "rl-train", "optimizer"),
            InputDecl::node("rl_metrics", "rl-train", "metrics"),
        ]
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
        _input: &str,
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        self.params.rl.reward_external(ctx)
    }
    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        self.params.rl.environment(ctx)
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let p = &self.params;
        let cfg = p.rl.reward_config(ctx)?;
        let ts = load_tasks(ctx)?;
        let device = crate::train_stages::resolve_device(&p.rl.device);
        let mut h = harness(ctx, &p.rl.mode, p.rl.timeout_s, ts.naive.clone())?;
        let mode = if !h.pools.is_empty() {
            "full"
        } else {
            "compile-only"
        };
        let settings = EpisodeSettings {
            max_turns: p.rl.max_turns,
            public_seeds: h.public_seeds.clone(),
        };
        let tmp = ctx.store().temp_dir()?;
        let dir = tmp.path();
        let mut splits: Vec<(&'static str, Vec<&TaskSpec>)> =
            vec![("test", ts.test.iter().collect())];
        if p.include_train {
            splits.push(("train", ts.train.iter().collect()));
        }
        let mut rows: Vec<Row> = Vec::new();
        // Wall-clock seconds per (checkpoint, split): generation and the harness by phase.
        let mut times: BTreeMap<(&str, &str), serde_json::Map<String, Value>> = BTreeMap::new();
        for (ck, gi, oi) in [
            ("sft", "sft_generator", "sft_optimizer"),
            ("rl", "rl_generator", "rl_optimizer"),
        ] {
            let (g, o) = (dir.join(ck).join("gen"), dir.join(ck).join("opt"));
            materialize(ctx.store(), ctx.input_path(gi)?, &g)?;
            materialize(ctx.store(), ctx.input_path(oi)?, &o)?;
            let mut tc = TrainerClient::start(
                &serve_job(&g, &o, device, &p.rl),
                &dir.join(ck),
                Sampling {
                    max_new_tokens: p.rl.max_new_tokens,
                    temperature: p.rl.temperature,
                    top_p: p.rl.top_p,
                    // The same seeds for both checkpoints.
                    seed: p.rl.seed as i64,
                },
            )?;
            for (split, tasks) in &splits {
                let many: Vec<&TaskSpec> = tasks
                    .iter()
                    .flat_map(|t| std::iter::repeat_n(*t, p.samples.max(1)))
                    .collect();
                let (g0, m0) = (tc.gen_seconds, h.mark());
                let eps = run_episodes(&many, &mut tc, &mut h, &cfg, &settings)
                    .map_err(StageError::Failed)?;
                let used = h.since(&m0);
                let mut t = used.seconds_json();
                t.insert("candidates".into(), json!(used.candidates));
                t.insert("gen_seconds".into(), json!(tc.gen_seconds - g0));
                times.insert((ck, split), t);
                rows.extend(eps.into_iter().map(|ep| Row { ck, split, ep }));
            }
            tc.quit();
        }
        // summary
        let mut sums = Vec::new();
        for ck in ["sft", "rl"] {
            for (split, _) in &splits {
                let sel: Vec<&Row> = rows
                    .iter()
                    .filter(|r| r.ck == ck && r.split == *split)
                    .collect();
                let mut v = summary(&sel);
                v["checkpoint"] = ck.into();
                v["split"] = (*split).into();
                v["mode"] = mode.into();
                v["device"] = device.into();
                if let Some(t) = times.get(&(ck, *split)) {
                    for (k, x) in t {
                        v[k.as_str()] = x.clone();
                    }
                }
                sums.push(v);
            }
        }
        let schema = SUMMARY.clone();
        let cols: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|fl| -> ArrayRef {
                let k = fl.name().as_str();
                match fl.data_type() {
                    DataType::Int64 => Arc::new(Int64Array::from(
                        sums.iter()
                            .map(|r| r[k].as_i64().unwrap_or(0))
                            .collect::<Vec<_>>(),
                    )),
                    DataType::Utf8 => Arc::new(StringArray::from(
                        sums.iter()
                            .map(|r| r[k].as_str().unwrap_or_default().to_string())
                            .collect::<Vec<_>>(),
                    )),
                    _ => Arc::new(Float64Array::from(
                        sums.iter().map(|r| r[k].as_f64()).collect::<Vec<_>>(),
                    )),
                }
            })
            .collect();
        write_output(
            ctx,
            "summary",
            &cudarl_data::parquet_io::batch(&schema, cols).map_err(data_err)?,
        )?;
        let b = cudarl_data::parquet_io::batch(
            &EPISODES.clone(),
            vec![
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.ck).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.split).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(
                    rows.iter()
                        .map(|r| r.ep.task_id.clone())
                        .collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.ep.tier).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from((0..rows.len() as i64).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(
                    rows.iter()
                        .map(|r| r.ep.turns.len() as i64)
                        .collect::<Vec<_>>(),
                )),
                Arc::new(BooleanArray::from(
                    rows.iter()
                        .map(|r| r.ep.first_components().compiled)
                        .collect::<Vec<_>>(),
                )),
                Arc::new(BooleanArray::from(
                    rows.iter()
                        .map(|r| r.ep.first_components().correct)
                        .collect::<Vec<_>>(),
                )),
                Arc::new(BooleanArray::from(
                    rows.iter()
                        .map(|r| r.ep.best_components().compiled)
                        .collect::<Vec<_>>(),
                )),
                Arc::new(BooleanArray::from(
                    rows.iter()
                        .map(|r| r.ep.best_components().correct)
                        .collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(
                    rows.iter()
                        .map(|r| r.ep.best_components().speedup)
                        .collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(
                    rows.iter()
                        .map(|r| r.ep.best_components().speedup_vs_torch)
                        .collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(
                    rows.iter().map(|r| r.ep.final_reward()).collect::<Vec<_>>(),
                )),
            ],
        )
        .map_err(data_err)?;
        write_output(ctx, "episodes", &b)?;
        let turns: Vec<(usize, &Row, &crate::episode::Turn)> = rows
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.ep.turns.iter().map(move |t| (i, r, t)))
            .collect();
        let items: Vec<_> = turns
            .iter()
            .map(|(_, r, t)| (*t, r.ep.task_id.as_str(), r.ep.tier, 0.0))
            .collect();
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(
                turns.iter().map(|x| x.1.ck).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                turns.iter().map(|x| x.1.split).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                turns.iter().map(|x| x.0 as i64).collect::<Vec<_>>(),
            )),
        ];
        cols.extend(crate::rl_train::turn_columns(&items));
        let b = cudarl_data::parquet_io::batch(&TURNS.clone(), cols).map_err(data_err)?;
        write_output(ctx, "turns", &b)?;
        let rd = dir.join("report");
        std::fs::create_dir_all(&rd).map_err(|e| StageError::Failed(e.to_string()))?;
        let metrics =
            Table::read(ctx.input_path("rl_metrics")?, "rl-train.metrics").map_err(data_err)?;
        report(&rd, &sums, &rows, &metrics, mode, device).map_err(StageError::Failed)?;
        ingest_dir(ctx, &rd, "report")
    }
}

/// The mean over the episodes of several steps given each step's (episodes, mean, population
/// std), its standard error `sqrt(var / N)` (the pooled population variance: within-step
/// plus between-step spread), and `N`.
pub(crate) fn pooled(steps: &[(f64, f64, f64)]) -> (f64, f64, f64) {
    let n: f64 = steps.iter().map(|s| s.0).sum();
    if n <= 0.0 {
        return (0.0, 0.0, 0.0);
    }
    let mean = steps.iter().map(|s| s.0 * s.1).sum::<f64>() / n;
    let var = steps
        .iter()
        .map(|s| s.0 * (s.2 * s.2 + (s.1 - mean).powi(2)))
        .sum::<f64>()
        / n;
    (mean, (var / n).sqrt(), n)
}

/// `b - a` for two rates measured on `na` and `nb` episodes, and its standard error
/// `sqrt(a (1 - a) / na + b (1 - b) / nb)`: the Wald standard error of a difference of two
/// independent binomial proportions (Agresti, *Categorical Data Analysis*, the comparison of
/// two proportions). `None` without episodes.
pub(crate) fn rate_diff(a: f64, na: f64, b: f64, nb: f64) -> Option<(f64, f64)> {
    (na > 0.0 && nb > 0.0).then(|| (b - a, (a * (1.0 - a) / na + b * (1.0 - b) / nb).sqrt()))
}

fn fmt(v: &Value) -> String {
    match v.as_f64() {
        Some(x) => format!("{x:.3}"),
        None => "n/a".into(),
    }
}

/// `b - a` stratified by task, and its standard error: per task `t`, `a` succeeded `ka_t` times
/// in `na_t` episodes and `b` `kb_t` in `nb_t`; the difference is `sum_t w_t (kb_t/nb_t -
/// ka_t/na_t)` with `w_t = (na_t + nb_t) / (Na + Nb)`, its variance `sum_t w_t^2 (pa_t (1 -
/// pa_t) / na_t + pb_t (1 - pb_t) / nb_t)` (the stratified difference of proportions, e.g.
/// Cochran, *Sampling Techniques*, stratified random sampling). Eval gives every task the same
/// episodes per checkpoint, so between-task spread is not sampling error on these tasks; the
/// unstratified [`rate_diff`] counts it. `None` when a task has no episodes on one side.
pub(crate) fn stratified_diff(tasks: &[(f64, f64, f64, f64)]) -> Option<(f64, f64)> {
    let total: f64 = tasks.iter().map(|t| t.0 + t.2).sum();
    if tasks.is_empty() || tasks.iter().any(|t| t.0 <= 0.0 || t.2 <= 0.0) {
        return None;
    }
    let (mut d, mut var) = (0.0, 0.0);
    for &(na, ka, nb, kb) in tasks {
        let (w, pa, pb) = ((na + nb) / total, ka / na, kb / nb);
        d += w * (pb - pa);
        var += w * w * (pa * (1.0 - pa) / na + pb * (1.0 - pb) / nb);
    }
    Some((d, var.sqrt()))
}

/// `b - a` over paired episodes and its standard error clustered by task, with the episodes
/// `b` gained and lost. `pairs[i] = (task, a_i, b_i)`: episode `i` of a task on each side drew
/// the same sampling seeds (eval runs both checkpoints with one seed; the generator's first
/// turn is then identical wherever its weights are). The difference is `d = mean_i (b_i -
/// a_i)`; its variance `T / (T - 1) * sum_t (sum_{i in t} (x_i - d))^2 / N^2` over the `T`
/// tasks and `N` pairs, the cluster-robust (CR1) estimator (Cameron and Miller, "A
/// Practitioner's Guide to Cluster-Robust Inference", J. Human Resources 50(2), 2015): the
/// episodes of one task are correlated, so the tasks are the independent units, and the error
/// speaks of new tasks like these rather than of these tasks (compare [`stratified_diff`]).
/// With equal episodes per task it is the standard error of the per-task mean differences.
/// Returns `(d, se, gained, lost)`, `se` `None` with one task (no spread between tasks to
/// measure); `None` without pairs.
pub(crate) fn paired_diff(
    pairs: &[(&str, bool, bool)],
) -> Option<(f64, Option<f64>, usize, usize)> {
    let mut by_task: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for &(t, a, b) in pairs {
        by_task
            .entry(t)
            .or_default()
            .push(f64::from(u8::from(b)) - f64::from(u8::from(a)));
    }
    let (n, k) = (pairs.len() as f64, by_task.len() as f64);
    if pairs.is_empty() {
        return None;
    }
    let d = by_task.values().flatten().sum::<f64>() / n;
    let ss: f64 = by_task
        .values()
        .map(|x| x.iter().map(|v| v - d).sum::<f64>().powi(2))
        .sum();
    let gained = pairs.iter().filter(|p| p.2 && !p.1).count();
    let lost = pairs.iter().filter(|p| p.1 && !p.2).count();
    let se = (k >= 2.0).then(|| (k / (k - 1.0) * ss).sqrt() / n);
    Some((d, se, gained, lost))
}

/// What an episode's first turn (the generator's answer) came to.
pub(crate) fn first_turn_outcome(c: &crate::reward::RewardComponents) -> &'static str {
    if c.correct == Some(true) {
        "passed"
    } else if c.compiled {
        "compiled, failed"
    } else if c.has_code {
        "compile error"
    } else {
        "no code"
    }
}

/// The report's table of episodes by their first turn's outcome and, for each, the fraction
/// that ended correct (what the optimizer's turns made of that start): one row per
/// `(checkpoint, split)` in the order first seen, a cell `n (p)` per outcome of
/// [`first_turn_outcome`] (`-` where none). Items: `(checkpoint, split, outcome, ended
/// correct)`. Empty without items.
pub(crate) fn first_turn_table(items: &[(&str, &str, &str, bool)]) -> String {
    const OUTCOMES: [&str; 4] = ["passed", "compiled, failed", "compile error", "no code"];
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for (ck, split, _, _) in items {
        if !keys.contains(&(*ck, *split)) {
            keys.push((ck, split));
        }
    }
    if keys.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "| checkpoint | split | {} |\n|---|---|---|---|---|---|\n",
        OUTCOMES.map(|o| format!("first turn {o}")).join(" | ")
    );
    for (ck, split) in keys {
        let cells: Vec<String> = OUTCOMES
            .iter()
            .map(|o| {
                let ended: Vec<bool> = items
                    .iter()
                    .filter(|i| (i.0, i.1, i.2) == (ck, split, *o))
                    .map(|i| i.3)
                    .collect();
                match ended.len() {
                    0 => "-".to_string(),
                    n => format!(
                        "{n} ({:.2})",
                        ended.iter().filter(|x| **x).count() as f64 / n as f64
                    ),
                }
            })
            .collect();
        md.push_str(&format!("| {ck} | {split} | {} |\n", cells.join(" | ")));
    }
    md
}

/// `report.md` and its plots.
fn report(
    dir: &std::path::Path,
    sums: &[Value],
    rows: &[Row],
    metrics: &Table,
    mode: &str,
    device: &str,
) -> Result<(), String> {
    use crate::plot::{Series, histogram, line_chart};
    let steps = metrics.req_ints("step").map_err(|e| e.to_string())?;
    let mr = metrics
        .req_floats("mean_reward")
        .map_err(|e| e.to_string())?;
    let sd = metrics
        .req_floats("reward_std")
        .map_err(|e| e.to_string())?;
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
    for r in rows {
        let e = tiers.entry((r.ck, r.ep.tier)).or_default();
        e.0 += 1.0;
        e.1 += f64::from(u8::from(r.ep.best_components().compiled));
        e.2 += f64::from(u8::from(r.ep.best_components().correct == Some(true)));
    }
    let full = mode == "full";
    let mut series = Vec::new();
    for ck in ["sft", "rl"] {
        let of = |k: usize| -> Vec<(f64, f64)> {
            tiers
                .iter()
                .filter(|((c, _), _)| *c == ck)
                .map(|((_, t), v)| (*t as f64, if k == 1 { v.1 / v.0 } else { v.2 / v.0 }))
                .collect()
        };
        series.push(Series::new(format!("{ck} compile rate"), of(1)));
        if full {
            series.push(Series::new(format!("{ck} pass rate"), of(2)));
        }
    }
    line_chart(
        &dir.join("per_tier.png"),
        &format!("eval: rates per tier, best turn of each episode ({mode})"),
        "tier",
        "rate",
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
    let groups = [sp("sft"), sp("rl")];
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
    md.push_str("| checkpoint | split | episodes | compile (1 turn) | pass (1 turn) | compile | pass | fast_1 | fast_1.5 | fast_2 | geomean vs naive | geomean vs torch | hold-out regressions | mean reward | flagged |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for s in sums {
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
        // Paired by seed: episode i of a task drew the same sampling seeds on both sides.
        let paired = |f: &dyn Fn(&Row) -> bool| {
            let side = |ck: &str| -> BTreeMap<&str, Vec<bool>> {
                let mut m: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
                for r in rows.iter().filter(|r| r.split == split && r.ck == ck) {
                    m.entry(r.ep.task_id.as_str()).or_default().push(f(r));
                }
                m
            };
            let (a, b) = (side("sft"), side("rl"));
            let mut pairs = Vec::new();
            for (t, xa) in &a {
                let xb = b.get(t).filter(|xb| xb.len() == xa.len())?;
                pairs.extend(xa.iter().zip(xb).map(|(&x, &y)| (*t, x, y)));
            }
            (a.len() == b.len()).then_some(())?;
            paired_diff(&pairs)
        };
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
    // What the loop made of each kind of start (full mode: "ended correct" needs tests).
    if mode == "full" {
        let items: Vec<(&str, &str, &str, bool)> = rows
            .iter()
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
    fn rate_difference_and_its_standard_error_by_hand() {
        // 0.5 of 100 vs 0.6 of 50: sqrt(0.25 / 100 + 0.24 / 50) = sqrt(0.0073).
        let (d, se) = rate_diff(0.5, 100.0, 0.6, 50.0).unwrap();
        assert!((d - 0.1).abs() < 1e-12);
        assert!((se - 0.0073f64.sqrt()).abs() < 1e-12, "{se}");
        // 18 -> 26 passes of 136 episodes each (0.132 -> 0.191) is 1.3 standard errors.
        let (d, se) = rate_diff(18.0 / 136.0, 136.0, 26.0 / 136.0, 136.0).unwrap();
        assert!((d / se - 1.32).abs() < 0.01, "{}", d / se);
        assert_eq!(rate_diff(0.5, 0.0, 0.5, 10.0), None);
    }

    #[test]
    fn stratified_difference_by_hand() {
        // Task 1: 0 of 4 vs 2 of 4; task 2: 4 of 4 vs 4 of 4. Weights 1/2 each:
        // d = 0.5 * 0.5 + 0 = 0.25; var = 0.25 * (0 + 0.25 / 4) + 0 = 0.015625.
        let (d, se) = stratified_diff(&[(4.0, 0.0, 4.0, 2.0), (4.0, 4.0, 4.0, 4.0)]).unwrap();
        assert!((d - 0.25).abs() < 1e-12);
        assert!((se - 0.125).abs() < 1e-12, "{se}");
        // Unstratified, the same counts (4 of 8 vs 6 of 8) have a larger error: the spread
        // between the tasks counts as noise there.
        let (d2, se2) = rate_diff(0.5, 8.0, 0.75, 8.0).unwrap();
        assert!((d2 - d).abs() < 1e-12 && se2 > se);
        // Unequal sizes weigh by episodes: (2 + 2) and (6 + 6) of 16.
        let (d, _) = stratified_diff(&[(2.0, 0.0, 2.0, 2.0), (6.0, 3.0, 6.0, 3.0)]).unwrap();
        assert!((d - 0.25).abs() < 1e-12);
        assert_eq!(stratified_diff(&[(4.0, 1.0, 0.0, 0.0)]), None);
        assert_eq!(stratified_diff(&[]), None);
    }

    #[test]
    fn paired_difference_by_hand() {
        // Task a: pairs (0,1), (0,1), (1,1), (1,0): +1, +1, 0, -1; task b: (0,0), (1,1), (0,1),
        // (0,1): 0, 0, +1, +1. N = 8, d = 3/8. Per task the deviations sum to 1 - 4d = -0.5
        // and 2 - 4d = 0.5; CR1 variance 2/1 * (0.25 + 0.25) / 64 = 1/64, se 0.125, which is
        // the standard error of the per-task means 0.25 and 0.5 (sd 0.1768 / sqrt 2).
        let p = [
            ("a", false, true),
            ("a", false, true),
            ("a", true, true),
            ("a", true, false),
            ("b", false, false),
            ("b", true, true),
            ("b", false, true),
            ("b", false, true),
        ];
        let (d, se, gained, lost) = paired_diff(&p).unwrap();
        assert!((d - 0.375).abs() < 1e-12, "{d}");
        assert!((se.unwrap() - 0.125).abs() < 1e-12, "{se:?}");
        assert_eq!((gained, lost), (4, 1));
        // Identical sides: no difference and no spread.
        let same: Vec<_> = p.iter().map(|&(t, a, _)| (t, a, a)).collect();
        assert_eq!(paired_diff(&same), Some((0.0, Some(0.0), 0, 0)));
        // One task: the difference and the counts, no spread between tasks to measure.
        assert_eq!(paired_diff(&p[..4]), Some((0.25, None, 2, 1)));
        assert_eq!(paired_diff(&[]), None);
    }

    #[test]
    fn first_turn_table_by_hand() {
        use crate::reward::RewardComponents;
        let c = |has_code, compiled, correct| RewardComponents {
            has_code,
            compiled,
            correct,
            ..Default::default()
        };
        assert_eq!(first_turn_outcome(&c(true, true, Some(true))), "passed");
        assert_eq!(
            first_turn_outcome(&c(true, true, Some(false))),
            "compiled, failed"
        );
        assert_eq!(first_turn_outcome(&c(true, false, None)), "compile error");
        assert_eq!(first_turn_outcome(&c(false, false, None)), "no code");
        let items = [
            ("sft", "test", "compile error", false),
            ("sft", "test", "compile error", true),
            ("sft", "test", "passed", true),
            ("rl", "test", "compiled, failed", false),
            ("sft", "test", "compile error", false),
        ];
        let t = first_turn_table(&items);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].contains("first turn compiled, failed"), "{t}");
        assert_eq!(lines[2], "| sft | test | 1 (1.00) | - | 3 (0.33) | - |");
        assert_eq!(lines[3], "| rl | test | - | 1 (0.00) | - | - |");
        assert_eq!(first_turn_table(&[]), "");
    }

    #[test]
    fn pooled_steps_equal_the_pooled_episodes() {
        // Episodes {0, 1} and {1, 1, 1, 0}: 4 of 6 are 1.
        let steps = [(2.0, 0.5, 0.5), (4.0, 0.75, (0.75f64 * 0.25).sqrt())];
        let (m, se, n) = pooled(&steps);
        assert_eq!(n, 6.0);
        assert!((m - 4.0 / 6.0).abs() < 1e-12);
        let var = 4.0 / 6.0 * (2.0 / 6.0);
        assert!((se - (var / 6.0f64).sqrt()).abs() < 1e-12, "{se}");
        assert_eq!(pooled(&[]), (0.0, 0.0, 0.0));
    }
}
