//! `eval`: the SFT and the RL checkpoints (and with `collab = true` the cross-agent fine-tuned
//! ones, `collab-sft`) on the same episodes: the hold-out families (the
//! `test` split of `sft-data`, never trained on) and, for per-tier rates, the train families;
//! every candidate is tested on the train and the hold-out shapes (full mode on a GPU). With
//! `kernelbench_samples`, also the curriculum's KernelBench `test` problems that have a native
//! launcher, per level ([`cudarl_rl::kb_judge::KbJudge`]: recorded tests and timing against torch
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
//! | `episodes` | one row per episode: [`cudarl_tables::eval::EvalEpisodeRow`] |
//! | `turns` | one row per turn: [`cudarl_tables::turns::EvalTurnRow`] (what each agent wrote and what the tester said) |
//! | `report` | file, digest, bytes: `report.md`, `reward_curve.png`, `per_tier.png`, `speedups.png` |

use std::collections::BTreeMap;

use cudarl_core::{InputDecl, OutputDecl, ParamsError, Stage, StageContext, StageError};
use cudarl_cuda::task::TaskSpec;
use cudarl_data::Table;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use cudarl_rl::episode::{EpisodeSettings, run_episodes};
use cudarl_rl::eval_tables::{Cost, CostBy, SUMMARY, summaries};
use cudarl_rl::report::{Metric, Row, report};

use cudarl_rl::kb_eval::KbSet;
use cudarl_rl::kernelbench::KbTask;
use cudarl_tables::TableRow;
use cudarl_tables::eval::EvalEpisodeRow;
use cudarl_tables::turns::EvalTurnRow;

use crate::common::{CHECKPOINT, data_err, ingest_dir, resolve_device, write_rows};
use crate::rl_params::StageParams;
use crate::rl_params::{harness, load_tasks};

/// Device memory, bytes, a checkpoint needs for eval's checkpoints to run at once on a GPU (two
/// need twice this, three with `collab` three times). Two at once, each with its trainer, four
/// GPU testers and their runners, took the whole 79 GiB of an H100 80GB and a trainer ran out of
/// memory (`benchmarks/results/main_job_h100_2026-12-05_eval_out_of_memory.json`): about 40 GiB
/// each, so two fit an H200 (141 GB).
pub const AT_ONCE_GPU_BYTES_PER_CHECKPOINT: usize = 60 << 30;

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "eval";

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
    /// by [`cudarl_rl::kb_judge::KbJudge`]; the summary gains a row per checkpoint and level (split
    /// `kernelbench/level{L}`) and per level and op coverage (`.../novel_ops`, `.../seen_ops`).
    /// Also the episodes per problem on the KernelBench `train` problems `rl-train` practised
    /// (`kernelbench/practised`). Absent or 0: none, and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernelbench_samples: Option<usize>,
    /// The sampling temperature of the KernelBench episodes (every turn); `0` decodes greedily,
    /// as KernelBench's single-sample script does (`scripts/generate_and_eval_single_sample.py`,
    /// `temperature = 0.0`), so one episode per problem says what the model writes. Absent:
    /// the task families' `temperature`, and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernelbench_temperature: Option<f64>,
    /// Sampling, turns, reward, mode, device (as `rl-train`; the update settings are unused).
    #[serde(flatten)]
    pub rl: crate::rl_params::Params,
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
    /// Unknown keys; a `kernelbench_temperature` below 0 or not finite.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        if let Some(t) = params.kernelbench_temperature
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(ParamsError(format!(
                "kernelbench_temperature must be a number >= 0 (0: greedy), not {t}"
            )));
        }
        Ok(Eval { params })
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
        .map_err(crate::common::rl_err)?;
        Ok(Some(KbSet::new(all, judge, ts, practised)))
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
    /// On a GPU with [`AT_ONCE_GPU_BYTES_PER_CHECKPOINT`] per checkpoint (`at_once`) the
    /// checkpoints run at once, each with its own trainer, harness and KernelBench judge (`sets`,
    /// one per checkpoint in [`Self::checkpoints`] order): one's harness works while another
    /// generates. Timing stays alone on the GPU (the judges' exclusive hold against the trainers'
    /// shared one, [`cudarl_cuda::worker::GpuLock`]), and each checkpoint samples with the same
    /// seeds as it would alone. Elsewhere they run one after another on the one set in `sets`, up
    /// to the first that fails: on the CPU, two trainers' thread pools on the same cores slow each
    /// other down many times over; on a smaller GPU two sets do not fit.
    fn episodes(
        &self,
        ctx: &StageContext<'_>,
        (sets, at_once): (&mut [(cudarl_rl::harness::Harness, Option<KbSet>)], bool),
        cfg: &cudarl_rl::reward::RewardConfig,
        splits: &[(&'static str, Vec<&TaskSpec>)],
        dir: &std::path::Path,
    ) -> Result<(Vec<Row>, CostBy), StageError> {
        let p = &self.params;
        let kb_n = sets[0].1.as_ref().map_or(0, |k| {
            k.by_split.iter().map(|l| l.1.len()).sum::<usize>() * self.kernelbench()
        });
        let per_ck: usize = splits
            .iter()
            .map(|(_, t)| t.len() * p.samples.max(1))
            .sum::<usize>()
            + kb_n;
        let cks = self.checkpoints();
        let bar = ctx.progress("episodes", Some((per_ck * cks.len()) as u64));
        let bar = &*bar;
        let done: Vec<Result<(Vec<Row>, CostBy), StageError>> = if !at_once {
            // One after another, up to the first that fails (the next trainer does not start).
            let (h, kb) = &mut sets[0];
            let mut done = Vec::new();
            for &ck in &cks {
                let r =
                    self.checkpoint_episodes(ctx, ck, (h, kb.as_mut()), (cfg, splits), dir, bar);
                let failed = r.is_err();
                done.push(r);
                if failed {
                    break;
                }
            }
            done
        } else {
            std::thread::scope(|sc| {
                let handles: Vec<_> = cks
                    .iter()
                    .zip(sets.iter_mut())
                    .map(|(&ck, (h, kb))| {
                        sc.spawn(move || {
                            self.checkpoint_episodes(
                                ctx,
                                ck,
                                (h, kb.as_mut()),
                                (cfg, splits),
                                dir,
                                bar,
                            )
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|t| {
                        t.join().unwrap_or_else(|_| {
                            Err(StageError::Failed(
                                "an eval checkpoint's thread panicked".into(),
                            ))
                        })
                    })
                    .collect()
            })
        };
        bar.finish();
        let (mut rows, mut cost) = (Vec::new(), BTreeMap::new());
        for d in done {
            let (r, c) = d?;
            rows.extend(r);
            cost.extend(c);
        }
        Ok((rows, cost))
    }

    /// One checkpoint's episodes (`ck`: name, generator and optimizer inputs) on `splits` and
    /// then on the KernelBench problems of `kb`, one batch of episodes per split, and what each
    /// split cost.
    fn checkpoint_episodes(
        &self,
        ctx: &StageContext<'_>,
        (ck, gi, oi): (&'static str, &'static str, &'static str),
        (h, kb): (&mut cudarl_rl::harness::Harness, Option<&mut KbSet>),
        (cfg, splits): (
            &cudarl_rl::reward::RewardConfig,
            &[(&'static str, Vec<&TaskSpec>)],
        ),
        dir: &std::path::Path,
        bar: &dyn cudarl_core::report::ProgressSink,
    ) -> Result<(Vec<Row>, CostBy), StageError> {
        let p = &self.params;
        let settings = EpisodeSettings {
            max_turns: p.rl.max_turns,
            public_seeds: h.public_seeds.clone(),
        };
        let (mut rows, mut cost) = (Vec::new(), BTreeMap::new());
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
                run_episodes(&many, &mut tc, h, cfg, &settings).map_err(crate::common::rl_err)?;
            let used = h.since(&m0);
            let c = Cost {
                gen_seconds: tc.gen_seconds - g0,
                harness: used,
            };
            cost.insert((ck, *split), c);
            bar.inc(eps.len() as u64);
            rows.extend(eps.into_iter().map(|ep| Row { ck, split, ep }));
        }
        if let Some(kb) = kb {
            if let Some(t) = p.kernelbench_temperature {
                tc.sampling.temperature = t;
            }
            for (split, tasks) in &kb.by_split {
                let many: Vec<&KbTask> = tasks
                    .iter()
                    .flat_map(|t| std::iter::repeat_n(t, self.kernelbench()))
                    .collect();
                let (g0, u0) = (tc.gen_seconds, kb.judge.used);
                let t0 = std::time::Instant::now();
                let eps = run_episodes(&many, &mut tc, &mut kb.judge, cfg, &settings)
                    .map_err(crate::common::rl_err)?;
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
        Ok((rows, cost))
    }
}

impl Stage for Eval {
    // Code versions:
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
    // 20: the tester's feedback on a launcher without the task's signature names the expected
    // declaration.
    stage_identity!(KIND, 20);
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
            OutputDecl::table(EvalEpisodeRow::NAME, EvalEpisodeRow::schema()),
            OutputDecl::table(EvalTurnRow::NAME, EvalTurnRow::schema()),
            OutputDecl::table("report", CHECKPOINT.clone()),
        ]
    }
    rl_checkpoints_external!("sft_generator", "sft_optimizer");
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let p = &self.params;
        let cfg = p.rl.reward_config(ctx)?;
        let ts = load_tasks(ctx)?;
        let device = resolve_device(p.rl.device);
        // One harness and KernelBench judge per checkpoint where they run at once (a GPU with
        // room for them), else one for all: a candidate both checkpoints wrote is then judged
        // once.
        let need = AT_ONCE_GPU_BYTES_PER_CHECKPOINT * self.checkpoints().len();
        let at_once = device == "cuda"
            && cudarl_cuda::gpu::probe().is_some_and(|g| g.total_mem_bytes >= need);
        let mut sets: Vec<cudarl_rl::harness::Harness> = Vec::new();
        for _ in 0..if at_once { self.checkpoints().len() } else { 1 } {
            let mut h = harness(ctx, &p.rl, ts.naive.clone())?;
            // A kernel both checkpoints wrote is disassembled once, and both are timed against
            // the same naive and torch baselines.
            if let Some(first) = sets.first() {
                h.sass_cache = first.sass_cache.clone();
                h.baselines = first.baselines.clone();
            }
            sets.push(h);
        }
        let mode = sets[0].mode();
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
        let mut sets = sets
            .into_iter()
            .map(|h| Ok((self.kernelbench_set(ctx, &h, &ts, &practised)?, h)))
            .map(|r: Result<_, StageError>| r.map(|(kb, h)| (h, kb)))
            .collect::<Result<Vec<_>, StageError>>()?;
        let (rows, cost) = self.episodes(ctx, (&mut sets, at_once), &cfg, &splits, dir)?;
        let kb = sets.swap_remove(0).1;
        let cks: Vec<&'static str> = self.checkpoints().iter().map(|c| c.0).collect();
        let names: Vec<&'static str> = splits.iter().map(|s| s.0).collect();
        let sums = summaries(&rows, &cost, &cks, &names, kb.as_ref(), mode, device);
        write_rows(ctx, "summary", &SUMMARY, &sums)?;
        write_episodes(ctx, &rows)?;
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
        .map_err(crate::common::rl_err)?;
        ingest_dir(ctx, &rd, "report")
    }
}

/// The `episodes` and `turns` tables of `rows` (every checkpoint's episodes, in order).
///
/// # Errors
/// A row does not fit its schema, or the store write failed.
fn write_episodes(ctx: &StageContext<'_>, rows: &[Row]) -> Result<(), StageError> {
    let episodes: Vec<EvalEpisodeRow> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| r.episode_row(i))
        .collect();
    write_rows(
        ctx,
        EvalEpisodeRow::NAME,
        &EvalEpisodeRow::schema(),
        &episodes,
    )?;
    let turns: Vec<EvalTurnRow> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.turn_rows(i))
        .collect();
    write_rows(ctx, EvalTurnRow::NAME, &EvalTurnRow::schema(), &turns)
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
