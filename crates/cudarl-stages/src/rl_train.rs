//! `rl-train`: multi-turn RL of the generator and the optimizer (docs/architecture.md, "Training"),
//! starting from the SFT checkpoints, on the task families' train split or (`task_pool`) on the
//! families sft-data reserved for RL (its `rl` split, `rl_generated`: never in SFT data, so RL
//! practises operations the agents have not memorized, as the hold-out families ask). With
//! `kernelbench_share`, that share of each step's tasks are the curriculum's KernelBench `train`
//! problems that have a native launcher, drawn among the open tiers like the families and judged
//! by [`cudarl_rl::kb_judge::KbJudge`] (recorded tests, the problem's own sizes, speed against torch
//! eager); the hold-out stays the curriculum's `test` split, which `eval` runs.
//!
//! Each step draws `tasks_per_step` tasks from the open tiers, runs `group_size` episodes per
//! task ([`cudarl_rl::episode::run_episodes`]: generator -> tester -> optimizer -> tester ..., up to
//! `max_turns`), credits every turn (returns-to-go by default, from the reward config's
//! `[credit]`; [`cudarl_rl::credit::turn_credits`]), and updates each agent on its own turns
//! with GRPO: generator advantages normalized within the group of the same task, optimizer
//! turns against the kernel they revise (or, with `mode = "seed"`, by task and turn), the
//! group std floored at `std_floor` so timing noise between equally correct kernels is not
//! amplified into full-size advantages, the clipped ratio and the KL penalty to the SFT
//! policy, in the trainer process (`cudarl_train::rl_serve`).
//!
//! Curriculum: training starts at tier 0; tier `k + 1` opens when, over the last
//! `gate_window` steps (a full window since tier `k` opened), the episodes on tier `k` reach
//! compile rate > `min_compile_rate` and pass rate > `min_pass_rate` (the `curriculum` stage's
//! gates; compile-only machines cannot measure pass rates, so there tiers open on the compile
//! rate alone, and the rows say so).
//!
//! | table | columns |
//! |---|---|
//! | `metrics` | one row per step: [`cudarl_tables::rl::RlMetricsRow`] |
//! | `turns` | one row per turn: [`cudarl_tables::turns::RlTurnRow`] |
//! | `tiers` | one row per tier opened: [`cudarl_tables::rl::RlTierRow`] |
//! | `generator`, `optimizer` | file, digest, bytes: the RL checkpoints (with `lora`, merged) |
//! | `generator_adapter`, `optimizer_adapter` (with `lora`) | as `generator`: `adapter_model.safetensors`, `adapter_config.json` (PEFT's layout) |
//! | `plots` | file, digest, bytes: `reward_curve.png`, `rates.png` |

use std::collections::BTreeMap;

use cudarl_core::{
    InputDecl, OutputDecl, ParamsError, ProgressSink, ResolveContext, Stage, StageContext,
    StageError,
};
use cudarl_cuda::task::TaskSpec;
use cudarl_protocol::Ptx;
use cudarl_rl::episode::EpisodeSettings;
use cudarl_rl::harness::Harness;
use cudarl_rl::kernelbench::KbTask;
use cudarl_rl::record::{RunState, StepRecord, StepTurn, metrics_row, step_turns, training_plots};
use cudarl_rl::run::{Bars, Counter, DrawSettings, control, draw, rollout};
use cudarl_rl::step::update;
use cudarl_rl::tasks::{TaskPool, fresh_families};
use cudarl_tables::TableRow;
use cudarl_tables::rl::{RlMetricsRow, RlTierRow};
use cudarl_tables::turns::RlTurnRow;

use crate::common::{CHECKPOINT, ingest_dir, resolve_device, rl_err, write_rows};
use crate::rl_params::StageParams;
use crate::rl_params::{DEFAULT_CHECKPOINT_EVERY, Params, harness, load_tasks};
use crate::rl_progress::Checkpoints;
use cudarl_rl::kb_judge::KbJudge;

/// The stage kind, as pipeline files name it (also `verl_launch`'s, its other backend).
pub const KIND: &str = "rl-train";

/// The `rl-train` stage.
#[derive(Debug)]
pub struct RlTrain {
    params: Params,
}

impl RlTrain {
    /// From the pipeline's table.
    ///
    /// # Errors
    /// Unknown keys or values (an algorithm other than `grpo` or `ppo`, a `generator_credit`
    /// other than `episode` or `own`, an unknown `task_pool`, `mode` or `device`) and what
    /// [`Params::check`] refuses.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        params.check()?;
        Ok(RlTrain { params })
    }

    /// PPO-ptx's settings with each agent's SFT conversations written under `dir` (`None`
    /// when off).
    fn ptx(
        &self,
        ctx: &StageContext<'_>,
        dir: &std::path::Path,
    ) -> Result<Option<Ptx>, StageError> {
        let p = &self.params;
        let Some(coef) = p.ptx() else {
            return Ok(None);
        };
        let mut paths = Vec::new();
        for (input, agent) in [("data", "generator"), ("optimizer_data", "optimizer")] {
            let path = dir.join(format!("ptx_{agent}.jsonl"));
            let table = ctx.input_path(input)?.to_path_buf();
            if crate::common::write_chats(&table, &["train"], &path)? == 0 {
                return Err(StageError::bad_input(
                    table.display().to_string(),
                    Some("split"),
                    "ptx_coef: no `train` rows",
                ));
            }
            paths.push(path);
        }
        let optimizer = paths.pop().expect("two agents");
        let generator = paths.pop().expect("two agents");
        Ok(Some(Ptx {
            coef,
            batch: p.ptx_batch.unwrap_or(8),
            generator,
            optimizer,
            max_len: 1024,
            seed: p.seed,
        }))
    }
}

/// A step's metrics `row` to the log (tracing) and to the node's live metrics file `live`.
fn report_step(
    node: &str,
    live: &mut Option<cudarl_core::metrics_log::MetricsLog>,
    row: &RlMetricsRow,
) {
    tracing::info!(
        node,
        step = row.step,
        tier = row.tier,
        mean_reward = row.mean_reward,
        pass_rate = ?row.pass_rate,
        kl = row.kl,
        "rl step"
    );
    if let (Some(l), Ok(v)) = (live, serde_json::to_value(row)) {
        // A view of the run: a failed write loses lines there, not the run.
        let _ = l.log(row.step, &v);
    }
}

/// A progress bar as the counter a rollout moves.
struct Sink<'a>(&'a dyn ProgressSink);

impl Counter for Sink<'_> {
    fn inc(&self, n: u64) {
        self.0.inc(n);
    }
}

/// With `kernelbench_share`, the curriculum's KernelBench `train` problems that have a native
/// launcher and their judge (speed against torch eager alone: the reward's speed term); else
/// none.
///
/// # Errors
/// No such problem (bad input naming the curriculum's `split`), or an input table is unreadable.
fn kernelbench_tasks(
    ctx: &StageContext<'_>,
    p: &Params,
    h: &Harness,
) -> Result<(Vec<KbTask>, Option<KbJudge>), StageError> {
    if p.kernelbench_share().is_none() {
        return Ok((Vec::new(), None));
    }
    let (tasks, judge) = crate::kb_judge::curriculum_split(ctx, h, "train", p.timeout_s)?;
    if tasks.is_empty() {
        return Err(StageError::bad_input(
            ctx.input_path("kb_curriculum")?.display().to_string(),
            Some("split"),
            "kernelbench_share: no KernelBench `train` problem has a native launcher",
        ));
    }
    Ok((tasks, Some(judge.without_torch_compile())))
}

impl Stage for RlTrain {
    // Code versions:
    // 7: an episode's best turn breaks reward ties by correct, compiled, has code.
    // 8: metrics gain max_approx_kl and skipped_minibatches per agent.
    // 9: metrics gain the control columns.
    // 10: metrics gain control_seconds, update_steps, optimizer_update_steps.
    // 11: metrics gain ptx_loss, optimizer_ptx_loss.
    // 12: a verdict with a hack flag earns reward 0 (`on_hack_flag`), and the tester's
    // feedback names the flag.
    // 13: the agents' AdamW is `cudarl_train::adamw` (saveable state); runs resume.
    // 14: returns-to-go credit, optimizer turns against the kernel they revise, zero
    // advantages out of the update, k3 clamped; metrics gain max_ref_log_ratio per agent.
    // 15: the KL and PPO-ptx gradient capped at the policy gradient's norm
    // (`aux_grad_cap`); metrics gain the aux columns.
    // 16: checkpoints carry `tokenizer_config.json` and `generation_config.json`.
    // 17: the tester's feedback on a launcher without the task's signature names the expected
    // declaration.
    stage_identity!(KIND, 17);
    fn inputs(&self) -> Vec<InputDecl> {
        let mut v = crate::rl_params::task_inputs();
        v.extend(self.params.agent_inputs([
            ("generator", "sft-train", "checkpoint"),
            ("optimizer", "sft-train-optimizer", "checkpoint"),
        ]));
        if self.params.kernelbench_share().is_some() {
            v.extend(crate::kb_judge::kb_inputs());
        }
        if self.params.ptx().is_some() {
            // PPO-ptx's optimizer conversations (the generator's are `data`).
            v.push(InputDecl::node(
                "optimizer_data",
                "sft-data",
                "sft_optimizer",
            ));
        }
        v
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        let mut v = vec![
            OutputDecl::table(RlMetricsRow::NAME, RlMetricsRow::schema()),
            OutputDecl::table(RlTurnRow::NAME, RlTurnRow::schema()),
            OutputDecl::table(RlTierRow::NAME, RlTierRow::schema()),
            OutputDecl::table("generator", CHECKPOINT.clone()),
            OutputDecl::table("optimizer", CHECKPOINT.clone()),
            OutputDecl::table("plots", CHECKPOINT.clone()),
        ];
        if self.params.lora.is_some() {
            v.push(OutputDecl::table("generator_adapter", CHECKPOINT.clone()));
            v.push(OutputDecl::table("optimizer_adapter", CHECKPOINT.clone()));
        }
        v
    }
    fn resolve_external(
        &self,
        input: &str,
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        self.params
            .resolve_external(input, ["generator", "optimizer"], ctx)
    }
    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        self.params.environment(ctx)
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let p = &self.params;
        let cfg = p.reward_config(ctx)?;
        let mut ts = load_tasks(ctx)?;
        let fresh = (p.task_pool == TaskPool::Fresh)
            .then(|| fresh_families(&mut ts, p.steps * p.tasks_per_step.max(1), p.seed));
        let families = match &fresh {
            Some(f) => f.iter().collect(),
            None => ts.pool(p.task_pool),
        };
        if families.is_empty() {
            return Err(StageError::bad_input(
                "tasks",
                Some("task_id"),
                format!("no `{}` families to train on", p.task_pool.as_str()),
            ));
        }
        let device = resolve_device(p.device);
        let mut h = harness(ctx, p, ts.naive.clone())?;
        let mode = h.mode();
        let (kb_tasks, mut kb_judge) = kernelbench_tasks(ctx, p, &h)?;
        let tmp = ctx.store().temp_dir()?;
        let dir = tmp.path();
        let ptx = self.ptx(ctx, dir)?;
        let mut tc = p.start_trainer(ctx, ("generator", "optimizer"), dir, (ptx, false))?;
        let settings = EpisodeSettings {
            max_turns: p.max_turns,
            public_seeds: h.public_seeds.clone(),
        };
        let upd = p.update_settings(&cfg);
        let tiers = families
            .iter()
            .map(|t| t.tier)
            .chain(kb_tasks.iter().map(|t| t.tier));
        let mut st = RunState::new(p, tiers, tc.sampling.seed);
        let mut turns: Vec<StepTurn> = Vec::new();
        let every = p.checkpoint_every.unwrap_or(DEFAULT_CHECKPOINT_EVERY);
        let mut ck = Checkpoints::open(ctx, every)?;
        if let Some((saved, t)) = ck.resume(ctx, &mut tc, p.steps)? {
            (st, turns) = (saved, t);
            tc.sampling.seed = st.seed;
        }
        let bar = ctx.progress("steps", Some(p.steps as u64));
        bar.inc(st.step as u64);
        // Nested under the steps: episodes (all steps) and candidates judged (count and rate).
        let per_step = (p.tasks_per_step * p.group_size) as u64;
        let ep_bar = ctx.progress("episodes", Some(p.steps as u64 * per_step));
        ep_bar.inc(st.step as u64 * per_step);
        let cand_bar = ctx.progress("candidates judged", None);
        let (ep_count, cand_count) = (Sink(&*ep_bar), Sink(&*cand_bar));
        let bars = Bars {
            episodes: &ep_count,
            candidates: &cand_count,
        };
        let mut live = ctx.metrics_log();
        for step in st.step + 1..=p.steps {
            cudarl_core::fault_point(ctx.node(), "before-step");
            let cur = &mut st.curriculum;
            let pool: Vec<&TaskSpec> = families
                .iter()
                .copied()
                .filter(|t| t.tier <= cur.tier)
                .collect();
            let kb_pool: Vec<&KbTask> = kb_tasks.iter().filter(|t| t.tier <= cur.tier).collect();
            let share = p.kernelbench_share().map(|s| (s, kb_pool.as_slice()));
            let ds = DrawSettings {
                tasks_per_step: p.tasks_per_step,
                group_size: p.group_size,
            };
            let (tasks, problems) = draw(ds, &pool, share, (step, fresh.is_some()), &mut st.rng);
            let (g0, sampling0) = (tc.gen_seconds, tc.sampling.clone());
            let (eps, harness) = rollout(
                &mut tc,
                (&mut h, kb_judge.as_mut()),
                (&tasks, &problems),
                (&cfg, &settings),
                bars,
            )
            .map_err(rl_err)?;
            let up = update(&mut tc, &eps, &upd).map_err(rl_err)?;
            let rec = StepRecord {
                step,
                tier: cur.tier,
                episodes: &eps,
                update: &up,
                harness,
                gen_seconds: tc.gen_seconds - g0,
            };
            let mut row = metrics_row(&rec, p, mode, device);
            if p.control == Some(true) {
                let c = control(
                    &mut tc,
                    sampling0,
                    (&mut h, kb_judge.as_mut()),
                    (&tasks, &problems),
                    (&cfg, &settings),
                )
                .map_err(rl_err)?;
                row.control_reward = Some(c.reward);
                row.control_compile_rate = Some(c.compile_rate);
                row.control_pass_rate = c.pass_rate;
                row.control_seconds = Some(c.seconds);
            }
            report_step(ctx.node(), &mut live, &row);
            st.rows.push(row);
            turns.extend(step_turns(step, &eps, &up));
            cur.record(step, &eps);
            (st.step, st.seed) = (step, tc.sampling.seed);
            ck.after_step(ctx, &mut tc, (step, p.steps), &st, &turns)?;
            bar.inc(1);
        }
        for b in [&ep_bar, &cand_bar, &bar] {
            b.finish();
        }
        ctx.stat("checkpoint_seconds", ck.seconds);
        let ck = dir.join("rl");
        tc.save(&ck).map_err(rl_err)?;
        tc.quit();
        write_outputs(ctx, p, (dir, &ck), st, &turns, (mode, device))
    }
}

/// The node's outputs after the last step: both agents' checkpoints from `ck` (and their LoRA
/// adapters), `metrics`, `turns`, `tiers` (when each tier opened, from `st`'s curriculum) and the
/// plots, drawn under `dir`.
///
/// # Errors
/// A table does not fit its schema, the plots cannot be drawn, or the store write failed.
fn write_outputs(
    ctx: &mut StageContext<'_>,
    p: &Params,
    (dir, ck): (&std::path::Path, &std::path::Path),
    st: RunState,
    turns: &[StepTurn],
    (mode, device): (&str, &str),
) -> Result<(), StageError> {
    let (rows, cur) = (st.rows, st.curriculum);
    for agent in ["generator", "optimizer"] {
        ingest_dir(ctx, &ck.join(agent), agent)?;
        if p.lora.is_some() {
            let a = format!("{agent}_adapter");
            ingest_dir(ctx, &ck.join(&a), &a)?;
        }
    }
    write_rows(ctx, RlMetricsRow::NAME, &RlMetricsRow::schema(), &rows)?;
    let turn_rows: Vec<RlTurnRow> = turns.iter().map(StepTurn::row).collect();
    write_rows(ctx, RlTurnRow::NAME, &RlTurnRow::schema(), &turn_rows)?;
    let tiers: Vec<RlTierRow> = cur
        .opened
        .iter()
        .map(|o| RlTierRow {
            tier: o.0,
            opened_at_step: o.1,
            compile_rate: o.2,
            pass_rate: o.3,
        })
        .collect();
    write_rows(ctx, RlTierRow::NAME, &RlTierRow::schema(), &tiers)?;
    let pd = dir.join("plots");
    std::fs::create_dir_all(&pd).map_err(|e| StageError::Failed(e.to_string()))?;
    training_plots(&rows, turns, mode, device, &pd).map_err(StageError::failed)?;
    ingest_dir(ctx, &pd, "plots")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::params_json;
    use cudarl_protocol::Device;

    #[test]
    fn optional_trainer_keys_reach_the_trainer_and_leave_the_stage_key_alone_when_absent() {
        let t = |s: &str| toml::from_str::<toml::Table>(s).unwrap();
        let job = |p: &Params| {
            serde_json::to_value(p.serve_job(Path::new("g"), Path::new("o"), None)).unwrap()
        };
        use std::path::Path;
        let base = RlTrain::from_table(t("lr = 2e-5")).unwrap().params;
        for (key, set, value) in [
            // Absent: the trainer uses `lr` (cudarl_train::rl_serve::agent_optims).
            ("generator_lr", "generator_lr = 5e-6", 5e-6),
            // Absent: every minibatch steps (RlServe::target_kl).
            ("target_kl", "target_kl = 0.02", 0.02),
        ] {
            assert!(
                params_json(&base).get(key).is_none(),
                "{key}: key unchanged"
            );
            assert_eq!(job(&base)[key], serde_json::Value::Null, "{key}");
            let on = RlTrain::from_table(t(&format!("lr = 2e-5\n{set}")))
                .unwrap()
                .params;
            assert_eq!(params_json(&on)[key], value);
            assert_eq!(job(&on)[key].as_f64(), Some(value));
            assert_eq!(job(&on)["lr"].as_f64(), Some(2e-5), "{key} leaves lr alone");
        }
        for bad in ["target_kl = 0.0", "target_kl = -0.1"] {
            let e = RlTrain::from_table(t(bad)).unwrap_err().0;
            assert!(e.contains("target_kl must be a positive"), "{bad}: {e}");
        }
        // PPO-ptx: on above 0 (and then rl-train reads sft-data's optimizer table too).
        let ptx = |s: &str| RlTrain::from_table(t(s)).unwrap();
        assert_eq!(ptx("ptx_coef = 0.5").params.ptx(), Some(0.5));
        assert_eq!(ptx("ptx_coef = 0.0").params.ptx(), None);
        assert_eq!(base.ptx(), None);
        let has_input = |r: &RlTrain| r.inputs().iter().any(|d| d.name == "optimizer_data");
        assert!(has_input(&ptx("ptx_coef = 0.5")));
        assert!(!has_input(&ptx("ptx_coef = 0.0")));
        for (bad, msg) in [
            ("ptx_coef = -1.0", "ptx_coef must be a number >= 0"),
            ("ptx_batch = 0", "ptx_batch must be at least 1"),
        ] {
            let e = RlTrain::from_table(t(bad)).unwrap_err().0;
            assert!(e.contains(msg), "{bad}: {e}");
        }
    }

    #[test]
    fn enum_params_keep_their_key_strings_and_refuse_unknown_values() {
        let t = |s: &str| toml::from_str::<toml::Table>(s).unwrap();
        let p = RlTrain::from_table(t(
            "algorithm = \"ppo\"\nmode = \"compile\"\ndevice = \"cpu\"\ntask_pool = \"fresh\"",
        ))
        .unwrap()
        .params;
        assert_eq!(p.device, Device::Cpu);
        let k = params_json(&p);
        for (key, v) in [
            ("algorithm", "ppo"),
            ("mode", "compile"),
            ("device", "cpu"),
            ("task_pool", "fresh"),
        ] {
            assert_eq!(k[key], v, "{key}");
        }
        let own = params_json(
            &RlTrain::from_table(t("generator_credit = \"own\""))
                .unwrap()
                .params,
        );
        assert_eq!(own["generator_credit"], "own");
        for (bad, says) in [
            ("task_pool = \"new\"", "unknown variant `new`"),
            ("mode = \"full\"", "unknown variant `full`"),
            ("device = \"tpu\"", "unknown variant `tpu`"),
            ("algorithm = \"a2c\"", "expected `grpo` or `ppo`"),
            ("generator_credit = \"mine\"", "expected `episode` or `own`"),
            (
                "algorithm = \"ppo\"\ngenerator_credit = \"own\"",
                "generator_credit `own` is for GRPO",
            ),
        ] {
            let e = RlTrain::from_table(t(bad)).unwrap_err().0;
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
