//! `rl-train`: multi-turn RL of the generator and the optimizer (docs/architecture.md, "Training"),
//! starting from the SFT checkpoints, on the task families' train split or (`task_pool`) on the
//! families sft-data reserved for RL (its `rl` split, `rl_generated`: never in SFT data, so RL
//! practises operations the agents have not memorized, as the hold-out families ask).
//!
//! Each step draws `tasks_per_step` tasks from the open tiers, runs `group_size` episodes per
//! task ([`crate::episode::run_episodes`]: generator -> tester -> optimizer -> tester ..., up to
//! `max_turns`), credits every turn (`0.3 r_t + 0.7 * 0.9^(turns left) R`, from the reward
//! config), and updates each agent on its own turns with GRPO: advantages normalized within the
//! group of the same task (generator turns) or the same task and turn (optimizer turns), the
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
//! | `metrics` | step, tier (int64: highest open), episodes (int64), mean_reward, reward_std (float64: final reward per episode), compile_rate, pass_rate (float64, pass rate null in compile-only mode; of each episode's best turn), first_turn_compile_rate (float64), speedup (float64, nullable: geometric mean vs naive of correct finals), turns_used (float64), kl, entropy (float64: generator), optimizer_kl (float64), gen_seconds, harness_seconds, update_seconds (float64), harness_ms_per_candidate, compile_overlap, harness_compile_seconds, harness_gpu_seconds, harness_sass_seconds (float64), signal_groups, optimizer_signal_groups (float64: share of the agent's GRPO groups whose turn credits, or with `generator_credit = "own"` the generator's own turn rewards, are not all equal), value_loss, optimizer_value_loss (float64, PPO only), max_approx_kl, optimizer_max_approx_kl (float64: nats per token), skipped_minibatches, optimizer_skipped_minibatches (int64: left by `target_kl`), update_steps, optimizer_update_steps (int64: AdamW steps of the update), ptx_loss, optimizer_ptx_loss (float64, nullable: PPO-ptx's SFT cross-entropy, nats per token, `ptx_coef`), algorithm (utf8), control_reward, control_compile_rate, control_pass_rate, control_seconds (float64, nullable: the frozen references on the step's tasks and seeds, `control = true`), reward_by_tier_json, mode, device (utf8) |
//! | `turns` | step, episode, turn (int64), task_id (utf8), tier (int64), role (utf8), tokens (int64), text (utf8: the answer), code (utf8, nullable), failure (utf8, nullable), feedback (utf8), reward, credit, advantage (float64), components_json (utf8: every reward component) |
//! | `tiers` | tier (int64), opened_at_step (int64: 0 = from the start), compile_rate, pass_rate (float64, nullable: the rates that opened it) |
//! | `generator`, `optimizer` | file, digest, bytes: the RL checkpoints |
//! | `plots` | file, digest, bytes: `reward_curve.png`, `rates.png` |

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{InputDecl, OutputDecl, ResolveContext, Stage, StageContext, StageError};
use cudarl_cuda::task::TaskSpec;
use cudarl_cuda::worker::WorkerPool;
use cudarl_cuda::{Nvcc, Rules};
use cudarl_curriculum::credit::{group_advantages, signal_share};
use cudarl_curriculum::prompts::{GENERATOR_SYSTEM, OPTIMIZER_SYSTEM};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::{data_err, params_json, write_output};
use crate::episode::{Episode, EpisodeSettings, Role, run_episodes};
use crate::reward::RewardConfig;
use crate::rollout::{Harness, Sampling, TrainerClient, find_cuobjdump};
use crate::train_stages::{CHECKPOINT, ingest_dir, materialize};

fn f64s(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::Float64, nullable)
}

/// Schema of `metrics`.
pub static METRICS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("step", DataType::Int64, false),
        Field::new("tier", DataType::Int64, false),
        Field::new("episodes", DataType::Int64, false),
        f64s("mean_reward", false),
        f64s("reward_std", false),
        f64s("compile_rate", false),
        f64s("pass_rate", true),
        f64s("first_turn_compile_rate", false),
        f64s("speedup", true),
        f64s("turns_used", false),
        f64s("kl", false),
        f64s("entropy", false),
        f64s("optimizer_kl", false),
        f64s("gen_seconds", false),
        f64s("harness_seconds", false),
        f64s("update_seconds", false),
        f64s("harness_ms_per_candidate", false),
        f64s("compile_overlap", false),
        // The harness seconds by phase (rollout::HarnessPhases).
        f64s("harness_compile_seconds", false),
        f64s("harness_gpu_seconds", false),
        f64s("harness_sass_seconds", false),
        // Share of GRPO groups whose values (turn credits; the generator's own rewards with
        // `generator_credit = "own"`) differ at all (the rest give no gradient).
        f64s("signal_groups", false),
        f64s("optimizer_signal_groups", false),
        f64s("value_loss", true),
        f64s("optimizer_value_loss", true),
        // The update's largest approximate KL from the generating policy (nats per token) and
        // the minibatches `target_kl` left unstepped, per agent.
        f64s("max_approx_kl", false),
        f64s("optimizer_max_approx_kl", false),
        Field::new("skipped_minibatches", DataType::Int64, false),
        Field::new("optimizer_skipped_minibatches", DataType::Int64, false),
        // AdamW steps each agent's update took (`epochs` x minibatches, less those skipped).
        Field::new("update_steps", DataType::Int64, false),
        Field::new("optimizer_update_steps", DataType::Int64, false),
        // PPO-ptx (`ptx_coef`): each agent's mean SFT cross-entropy (nats per assistant token)
        // over the update's minibatch steps; null without it.
        f64s("ptx_loss", true),
        f64s("optimizer_ptx_loss", true),
        Field::new("algorithm", DataType::Utf8, false),
        // `control`: the frozen reference policy's episodes on this step's tasks with this
        // step's sampling seeds (mean final reward; compile and pass rates of each episode's
        // best turn); null without `control`.
        f64s("control_reward", true),
        f64s("control_compile_rate", true),
        f64s("control_pass_rate", true),
        // Wall seconds of the control's rollout (generation and harness; not in the others).
        f64s("control_seconds", true),
        // {"<tier>": mean final reward of this step's episodes of that tier}: the reward curve
        // per tier, not confounded by the mix shifting when a tier opens.
        Field::new("reward_by_tier_json", DataType::Utf8, false),
        Field::new("mode", DataType::Utf8, false),
        Field::new("device", DataType::Utf8, false),
    ]))
});

/// Schema of `turns`.
pub static TURNS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("step", DataType::Int64, false),
        Field::new("episode", DataType::Int64, false),
        Field::new("turn", DataType::Int64, false),
        Field::new("task_id", DataType::Utf8, false),
        Field::new("tier", DataType::Int64, false),
        Field::new("role", DataType::Utf8, false),
        Field::new("tokens", DataType::Int64, false),
        Field::new("text", DataType::Utf8, false),
        Field::new("code", DataType::Utf8, true),
        Field::new("failure", DataType::Utf8, true),
        Field::new("feedback", DataType::Utf8, false),
        f64s("reward", false),
        f64s("credit", false),
        f64s("advantage", false),
        f64s("value", true),
        Field::new("components_json", DataType::Utf8, false),
    ]))
});

/// Schema of `tiers`.
pub static TIERS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("tier", DataType::Int64, false),
        Field::new("opened_at_step", DataType::Int64, false),
        f64s("compile_rate", true),
        f64s("pass_rate", true),
    ]))
});

fn d_steps() -> usize {
    20
}
pub(crate) fn d_tasks() -> usize {
    4
}
pub(crate) fn d_group() -> usize {
    4
}
fn d_turns() -> usize {
    5
}
fn d_tokens() -> usize {
    512
}
pub(crate) fn d_one() -> f64 {
    1.0
}
fn d_lr() -> f64 {
    1e-5
}
pub(crate) fn d_kl() -> f64 {
    0.04
}
pub(crate) fn d_clip() -> f64 {
    0.2
}
fn d_mb() -> usize {
    8
}
fn d_lambda() -> f64 {
    0.95
}
fn d_value_lr() -> f64 {
    1e-3
}
fn d_reward() -> String {
    "default".into()
}
fn d_algo() -> String {
    "grpo".into()
}
fn d_auto() -> String {
    "auto".into()
}
fn d_compile_gate() -> f64 {
    cudarl_curriculum::DEFAULT_MIN_COMPILE_RATE
}
fn d_pass_gate() -> f64 {
    cudarl_curriculum::DEFAULT_MIN_PASS_RATE
}
fn d_window() -> usize {
    2
}
fn d_std_floor() -> f64 {
    0.1
}
fn d_timeout() -> u64 {
    10
}

/// Parameters (`[stages.rl-train]`; `eval` shares the sampling and harness ones).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// RL steps.
    #[serde(default = "d_steps")]
    pub steps: usize,
    /// Tasks per step.
    #[serde(default = "d_tasks")]
    pub tasks_per_step: usize,
    /// Episodes per task (the GRPO group).
    #[serde(default = "d_group")]
    pub group_size: usize,
    /// Most turns per episode.
    #[serde(default = "d_turns")]
    pub max_turns: usize,
    /// Most new tokens per turn.
    #[serde(default = "d_tokens")]
    pub max_new_tokens: usize,
    /// Sampling temperature (the loss uses the same scaled distribution).
    #[serde(default = "d_one")]
    pub temperature: f64,
    /// Nucleus mass.
    #[serde(default = "d_one")]
    pub top_p: f64,
    /// AdamW learning rate of both agents (of the optimizer alone with `generator_lr`).
    #[serde(default = "d_lr")]
    pub lr: f64,
    /// The generator's learning rate when it differs from `lr` (absent: `lr`, and left out of
    /// the stage's key; 0 trains the optimizer alone). Measured (H100, two SFT draws, paired by
    /// sampling seed): at 0 the hold-out multi-turn compile rate did not fall in any of four
    /// runs (+0.000 to +0.015) and the pass rate moved -0.033 to +0.026, inside one standard
    /// error (`benchmarks/results/rl_optimizer_alone_h100_2026-11-25.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator_lr: Option<f64>,
    /// KL penalty weight.
    #[serde(default = "d_kl")]
    pub kl_coef: f64,
    /// Early stop of each agent's update once the approximate KL from the generating policy
    /// passes 1.5 x this (nats per token; Spinning Up PPO's rule, `cudarl_train::rl_serve::
    /// RlServe::target_kl`). Absent: every minibatch steps, and left out of the stage's key.
    /// Measured at 0.02 (H100, 64-episode steps): it never stopped an update, the largest
    /// approximate KL within one was 0.0013 nats per token
    /// (`benchmarks/results/rl_group_size_h100_2026-11-24.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_kl: Option<f64>,
    /// Passes over each update's minibatches (GRPO's mu iterations, Shao et al. 2024; PPO's
    /// epochs), the ratio always against the sampling policy
    /// (`cudarl_train::rl_serve::RlServe::epochs`). Absent: 1, and left out of the key;
    /// `pipelines/default.toml` sets 4. Measured (H100, 64-episode steps, minibatch 32): RL's
    /// mean reward minus its frozen control's over steps 2-5 was -0.018 +- 0.008 with one pass
    /// and +0.017 +- 0.009 with four on the same SFT draw
    /// (`benchmarks/results/rl_epochs_h100_2026-11-24.json`), +0.013 and +0.019 on two more
    /// (`benchmarks/results/rl_fresh_warmup_h100_2026-11-24.json`), and -0.025 to +0.000 in
    /// four later runs (`benchmarks/results/rl_ptx_h100_2026-11-24_*.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<usize>,
    /// What a generator turn is credited with: `episode` (absent: the turn credit
    /// `0.3 r_0 + 0.7 gamma^(T-1) R` of `docs/architecture.md`, "Reward and turn credit", R
    /// the episode's best turn, so mostly the optimizer's repair) or `own` (its own turn's
    /// reward `r_0`: the tester's verdict on the kernel the generator wrote). GRPO only. The
    /// `turns` table's `credit` stays the turn credit; its `advantage` is what the update used.
    /// Absent: `episode`, left out of the key. Measured (H100): `own` -0.020 +- 0.008 against
    /// the frozen control, hold-out pass -0.074 +- 0.036
    /// (`benchmarks/results/rl_epochs_h100_2026-11-24.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator_credit: Option<String>,
    /// Ratio clip.
    #[serde(default = "d_clip")]
    pub clip: f64,
    /// Completions per optimizer step.
    #[serde(default = "d_mb")]
    pub minibatch: usize,
    /// `grpo` (group-normalized advantages) or `ppo` (a value head per agent, GAE).
    #[serde(default = "d_algo")]
    pub algorithm: String,
    /// Optimizer steps of linear learning-rate warmup per agent.
    #[serde(default)]
    pub warmup: usize,
    /// PPO: discount per turn in GAE (the issue: 1.0).
    #[serde(default = "d_one")]
    pub gamma: f64,
    /// PPO: GAE's lambda (0.95).
    #[serde(default = "d_lambda")]
    pub gae_lambda: f64,
    /// PPO: AdamW learning rate of the value heads.
    #[serde(default = "d_value_lr")]
    pub value_lr: f64,
    /// `configs/reward/<reward>.toml`.
    #[serde(default = "d_reward")]
    pub reward: String,
    /// `auto` (full tests on a GPU, compile-only without) or `compile`.
    #[serde(default = "d_auto")]
    pub mode: String,
    /// `auto`, `cpu` or `cuda` for the models.
    #[serde(default = "d_auto")]
    pub device: String,
    /// Gate: compile rate on the current tier.
    #[serde(default = "d_compile_gate")]
    pub min_compile_rate: f64,
    /// Gate: pass rate on the current tier.
    #[serde(default = "d_pass_gate")]
    pub min_pass_rate: f64,
    /// Steps the gate looks back over.
    #[serde(default = "d_window")]
    pub gate_window: usize,
    /// Seconds per GPU job.
    #[serde(default = "d_timeout")]
    pub timeout_s: u64,
    /// Seed (task draws and sampling).
    #[serde(default)]
    pub seed: u64,
    /// GRPO: the floor under a group's reward std when normalizing advantages
    /// ([`group_advantages`]; 0 = plain GRPO).
    #[serde(default = "d_std_floor")]
    pub std_floor: f64,
    /// The families RL draws from: `auto` (sft-data's `rl` split when it reserved one, else
    /// `train`), `train` (the families SFT trained on), `rl`, `both`, or `fresh`: elementwise
    /// families generated for this run ([`fresh_families`]), `tasks_per_step` new ones every
    /// step, none of them a task of `synth-tasks` (hold-out included), so nothing RL practises
    /// can be recalled, only copied from its description. Measured (H100): `fresh` +0.005 and
    /// -0.014 against the frozen control, hold-out pass -0.118 and -0.074 against SFT
    /// (`benchmarks/results/rl_fresh_warmup_h100_2026-11-24.json`), so not the default.
    #[serde(default = "d_auto")]
    pub task_pool: String,
    /// Also run, each step, the frozen reference policies (the SFT checkpoints) on the step's
    /// tasks with the step's sampling seeds, untrained (`control_*` metrics; the eval report
    /// gives RL minus control per step). A step's tasks come from `seed` alone, so a reward
    /// curve mixes learning with the tasks' difficulty: measured (H100), a frozen policy's
    /// first-vs-last-three-steps rise +0.076 +- 0.030 against RL's +0.096 +- 0.030
    /// (`benchmarks/results/main_job_h100_2026-11-24_frozen_control.json`). Costs a second
    /// rollout per step. Absent: off, and left out of the stage's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<bool>,
    /// PPO-ptx's weight (absent or 0: off; absent is left out of the key;
    /// `cudarl_train::rl_serve::Ptx`, Ouyang et al. 2022): each agent's every
    /// minibatch step adds this times the mean cross-entropy of `ptx_batch` of its own SFT
    /// conversations (`sft-data`'s train split of `sft_generator` / `sft_optimizer`), so RL
    /// moves the policy away from SFT only where its rewards ask; `pipelines/default.toml`
    /// sets 1.0. Measured (H100, one SFT draw, paired with `ptx_coef = 0`): the generator's
    /// first update's k3 KL 1.03 -> 0.006 nats per token, its hold-out first turns unchanged
    /// from SFT's, hold-out pass RL - SFT +0.022 against -0.037 without it
    /// (`benchmarks/results/rl_ptx_h100_2026-11-24_main_job.json`); on two more draws -0.029 and
    /// -0.059 (`benchmarks/results/rl_ptx_h100_2026-11-24_coef_sweep.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx_coef: Option<f64>,
    /// PPO-ptx: SFT conversations per minibatch step (absent: 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx_batch: Option<usize>,
}

impl Params {
    /// PPO-ptx's weight when it is on (`ptx_coef` set and above 0).
    pub(crate) fn ptx(&self) -> Option<f64> {
        self.ptx_coef.filter(|c| *c > 0.0)
    }

    /// `configs/reward/<reward>.toml`, the external input `reward` of `rl-train` and `eval`.
    pub(crate) fn reward_external(
        &self,
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        crate::common::single_file(&ctx.root, &self.reward_rel(), "reward config")
    }

    fn reward_rel(&self) -> String {
        format!("configs/reward/{}.toml", self.reward)
    }

    /// The reward config (a bad one is named, exit 2).
    pub(crate) fn reward_config(&self, ctx: &StageContext<'_>) -> Result<RewardConfig, StageError> {
        let rel = self.reward_rel();
        RewardConfig::load(&ctx.input_files("reward")?.files[0].1, &rel)
            .map_err(|m| StageError::bad_input(&rel, None, m))
    }

    /// What the results of `rl-train` and `eval` depend on beyond their inputs: nvcc, the
    /// models' device, and whether a GPU runs the tests.
    pub(crate) fn environment(
        &self,
        ctx: &ResolveContext,
    ) -> Result<BTreeMap<String, String>, StageError> {
        let nvcc = Nvcc::discover(&ctx.root).map_err(|e| StageError::Failed(e.to_string()))?;
        Ok(BTreeMap::from([
            ("nvcc".to_string(), nvcc.version),
            (
                "device".to_string(),
                crate::train_stages::resolve_device(&self.device).to_string(),
            ),
            ("mode".to_string(), env_mode(&self.mode).to_string()),
        ]))
    }
}

/// The tasks of the synthetic families, split as the SFT data split them (`train`, `rl`,
/// `test`), and their naive kernels.
pub(crate) struct TaskSet {
    /// Families SFT trained on (neither held out nor reserved for RL).
    pub train: Vec<TaskSpec>,
    /// Families sft-data reserved for RL (its `rl` split): never in SFT data.
    pub rl: Vec<TaskSpec>,
    /// Hold-out families (the `test` split).
    pub test: Vec<TaskSpec>,
    pub naive: BTreeMap<String, String>,
}

impl TaskSet {
    /// The families `task_pool` names (see [`Params::task_pool`]).
    pub(crate) fn pool(&self, task_pool: &str) -> Vec<&TaskSpec> {
        match task_pool {
            "train" => self.train.iter().collect(),
            "rl" => self.rl.iter().collect(),
            "both" => self.train.iter().chain(&self.rl).collect(),
            _ if self.rl.is_empty() => self.train.iter().collect(),
            _ => self.rl.iter().collect(),
        }
    }
}

/// Salt of the ChaCha8 seed of [`fresh_families`] (so they are not `synth-tasks`' draws).
const FRESH_SALT: u64 = 0xF2E5_4EA5;

/// `n` tier-0 elementwise families generated for one `rl-train` run (`task_pool = "fresh"`;
/// [`crate::families::generate`] with seed `seed ^ FRESH_SALT`), ids `fresh_ew_000`, ...,
/// none equal (up to commuted operands) to the reference of any task in `ts`, train, `rl` and
/// hold-out alike; their naive kernels join `ts.naive` (the harness times against them).
/// Deterministic in (`ts`, `n`, `seed`). Fewer than `n` come back only when the expression
/// space is exhausted.
pub(crate) fn fresh_families(ts: &mut TaskSet, n: usize, seed: u64) -> Vec<TaskSpec> {
    let exclude: std::collections::BTreeSet<String> = ts
        .train
        .iter()
        .chain(&ts.rl)
        .chain(&ts.test)
        .flat_map(|t| t.reference.values().cloned())
        .collect();
    let gp = crate::families::GenerateParams {
        elementwise: n,
        row_reduce: 0,
        seed: seed ^ FRESH_SALT,
    };
    crate::families::generate(&gp, &exclude)
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let mut spec = f.spec;
            spec.id = format!("fresh_ew_{i:03}");
            ts.naive.insert(spec.id.clone(), f.naive);
            spec
        })
        .collect()
}

pub(crate) fn load_tasks(ctx: &StageContext<'_>) -> Result<TaskSet, StageError> {
    let data = ctx.input_path("data")?;
    let mut splits = crate::sft_data::family_splits(data)?;
    let held = splits.remove("test").unwrap_or_default();
    let reserved = splits.remove("rl").unwrap_or_default();
    let (mut ts, mut rl, mut train) = (vec![], vec![], vec![]);
    for s in crate::synth_tasks::read_specs(ctx.input_path("tasks")?)? {
        if held.contains(&s.id) {
            ts.push(s);
        } else if reserved.contains(&s.id) {
            rl.push(s);
        } else {
            train.push(s);
        }
    }
    let naive = crate::synth_tasks::read_naive(ctx.input_path("kernels")?)?;
    Ok(TaskSet {
        train,
        rl,
        test: ts,
        naive,
    })
}

/// The harness for these params: full on a GPU unless `mode = "compile"`.
pub(crate) fn harness(
    ctx: &StageContext<'_>,
    mode: &str,
    timeout_s: u64,
    naive: BTreeMap<String, String>,
) -> Result<Harness, StageError> {
    let compiler = crate::common::store_compiler(ctx)?;
    let cuobjdump = find_cuobjdump(&compiler.nvcc.path);
    let gpu = (mode != "compile").then(cudarl_cuda::gpu::probe).flatten();
    let salt = match gpu {
        Some(_) => cudarl_cuda::verdict::hidden_salt(ctx.store())
            .map_err(|e| StageError::Failed(e.to_string()))?,
        None => Vec::new(),
    };
    Ok(Harness {
        compiler,
        rules: Rules::builtin(),
        pools: match gpu {
            Some(_) => WorkerPool::testers(cudarl_cuda::worker::DEFAULT_GPU_WORKERS),
            None => Vec::new(),
        },
        salt,
        public_seeds: vec![0],
        hidden: 1,
        wall: Duration::from_secs(timeout_s),
        naive,
        baselines: Default::default(),
        cuobjdump,
        sass_cache: Default::default(),
        seconds: 0.0,
        candidates: 0,
        phases: Default::default(),
        prefetched: Default::default(),
        prefetch_hits: 0,
    })
}

/// The `mode` environment entry: `full` when a GPU will run the tests.
pub(crate) fn env_mode(mode: &str) -> &'static str {
    if mode != "compile" && cudarl_cuda::gpu::probe().is_some() {
        "full"
    } else {
        "compile-only"
    }
}

/// The rl-serve job for two checkpoints.
pub(crate) fn serve_job(
    gen_dir: &std::path::Path,
    opt_dir: &std::path::Path,
    device: &str,
    p: &Params,
) -> Value {
    json!({"kind": "rl-serve", "generator": gen_dir, "optimizer": opt_dir,
        "generator_system": GENERATOR_SYSTEM, "optimizer_system": OPTIMIZER_SYSTEM,
        "device": device, "lr": p.lr, "generator_lr": p.generator_lr,
        "pg": {"clip": p.clip, "kl_coef": p.kl_coef},
        "minibatch": p.minibatch, "algorithm": p.algorithm, "warmup": p.warmup,
        "value_lr": p.value_lr, "target_kl": p.target_kl, "epochs": p.epochs.unwrap_or(1)})
}

/// The `rl-train` stage.
#[derive(Debug)]
pub struct RlTrain {
    params: Params,
}

impl RlTrain {
    /// From the pipeline's table.
    ///
    /// # Errors
    /// Unknown keys, an algorithm other than `grpo` or `ppo`, a `target_kl` not above 0, `epochs`
    /// 0, a `generator_credit` other than `episode` or `own` (`own` with PPO), a negative
    /// `ptx_coef` or a `ptx_batch` of 0.
    pub fn from_table(t: toml::Table) -> Result<Self, String> {
        let params: Params = crate::common::parse_params(t)?;
        if params.algorithm != "grpo" && params.algorithm != "ppo" {
            return Err(format!(
                "algorithm `{}`: expected `grpo` or `ppo`",
                params.algorithm
            ));
        }
        if !(0.0..=1.0).contains(&params.gamma) || !(0.0..=1.0).contains(&params.gae_lambda) {
            return Err("gamma and gae_lambda must be in [0, 1]".into());
        }
        if !["auto", "train", "rl", "both", "fresh"].contains(&params.task_pool.as_str()) {
            return Err(format!(
                "task_pool `{}`: expected `auto`, `train`, `rl`, `both` or `fresh`",
                params.task_pool
            ));
        }
        if !(0.0..=1.0).contains(&params.std_floor) {
            return Err("std_floor must be in [0, 1]".into());
        }
        if params.algorithm == "grpo" && params.group_size < 2 {
            return Err("group_size must be at least 2 (GRPO normalizes within a group)".into());
        }
        match params.generator_credit.as_deref() {
            None | Some("episode") => {}
            Some("own") if params.algorithm == "grpo" => {}
            Some("own") => {
                return Err(
                    "generator_credit `own` is for GRPO (PPO's GAE runs over the episode's turns)"
                        .into(),
                );
            }
            Some(o) => {
                return Err(format!(
                    "generator_credit `{o}`: expected `episode` or `own`"
                ));
            }
        }
        if params.epochs == Some(0) {
            return Err("epochs must be at least 1".into());
        }
        if params
            .ptx_coef
            .is_some_and(|c| !(c >= 0.0 && c.is_finite()))
        {
            return Err("ptx_coef must be a number >= 0".into());
        }
        if params.ptx_batch == Some(0) {
            return Err("ptx_batch must be at least 1".into());
        }
        if params
            .target_kl
            .is_some_and(|t| !(t > 0.0 && t.is_finite()))
        {
            return Err("target_kl must be a positive number of nats per token".into());
        }
        Ok(RlTrain { params })
    }
}

/// PPO's per-turn (advantage, value target) for each episode: rewards `r_t = immediate * R_t`
/// plus `final * R` on the last turn (the turn credit's weights, `docs/architecture.md`, "Reward
/// and turn credit"; `R_t` the turn's reward, `R` the episode's final reward), values from the
/// critics at generation time (0 where missing), then GAE (Schulman et al., arXiv:1506.02438) with
/// `gamma` per turn and
/// `lambda`; target = advantage + value.
pub(crate) fn ppo_targets(
    eps: &[Episode],
    w: &cudarl_curriculum::credit::CreditWeights,
    gamma: f64,
    lambda: f64,
) -> Vec<Vec<(f64, f64)>> {
    eps.iter()
        .map(|e| {
            let n = e.turns.len();
            let r: Vec<f64> = e
                .turns
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    w.immediate * t.reward.reward
                        + if i + 1 == n {
                            w.final_ * e.final_reward()
                        } else {
                            0.0
                        }
                })
                .collect();
            let v: Vec<f64> = e.turns.iter().map(|t| t.value.unwrap_or(0.0)).collect();
            let (a, ret) = cudarl_curriculum::credit::gae(&r, &v, gamma, lambda);
            a.into_iter().zip(ret).collect()
        })
        .collect()
}

/// Advantages whitened over the batch: `(a - mean) / (std + 1e-6)` (PPO's usual
/// normalization); one sample gets 0.
pub(crate) fn whiten(a: &[f64]) -> Vec<f64> {
    let (m, sd) = mean_std(a);
    if a.len() < 2 {
        return vec![0.0; a.len()];
    }
    a.iter().map(|x| (x - m) / (sd + 1e-6)).collect()
}

/// Mean and population standard deviation.
pub(crate) fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64;
    (m, var.sqrt())
}

/// SplitMix64 step.
fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The curriculum gate of the current tier: a full window of `gate_window` steps since the tier
/// opened (one step of 16 episodes is not evidence; with a 2-step window tier 1 used to open
/// after step 1), compile rate > `min_compile_rate` and pass rate > `min_pass_rate` (the pass
/// rate is `None` in compile-only mode: the compile rate alone decides).
pub(crate) fn gate_passes(
    steps_since_open: usize,
    p: &Params,
    compile: f64,
    pass: Option<f64>,
) -> bool {
    steps_since_open >= p.gate_window.max(1)
        && compile > p.min_compile_rate
        && pass.is_none_or(|x| x > p.min_pass_rate)
}

/// Rates of the best turns of `eps`: (compile rate, pass rate or `None` when nothing ran).
pub(crate) fn rates(eps: &[&Episode]) -> (f64, Option<f64>) {
    let n = eps.len().max(1) as f64;
    let last = |e: &&Episode| Some(e.best_components());
    let compiled = eps.iter().filter_map(last).filter(|r| r.compiled).count() as f64;
    let ran: Vec<bool> = eps
        .iter()
        .filter_map(last)
        .filter_map(|r| r.correct)
        .collect();
    let full = eps.iter().filter_map(last).any(|r| r.mode == "full");
    let pass = full.then(|| ran.iter().filter(|c| **c).count() as f64 / n);
    (compiled / n, pass)
}

impl Stage for RlTrain {
    fn kind(&self) -> &str {
        "rl-train"
    }
    fn code_version(&self) -> u32 {
        // 7: an episode's best turn breaks reward ties by correct, compiled, has code.
        // 8: metrics gain max_approx_kl and skipped_minibatches per agent.
        // 9: metrics gain the control columns.
        // 10: metrics gain control_seconds, update_steps, optimizer_update_steps.
        // 11: metrics gain ptx_loss, optimizer_ptx_loss.
        // 12: a verdict with a hack flag earns reward 0 (`on_hack_flag`), and the tester's
        // feedback names the flag.
        12
    }
    fn params(&self) -> Value {
        params_json(&self.params)
    }
    fn inputs(&self) -> Vec<InputDecl> {
        let mut v = vec![
            InputDecl::external("reward"),
            InputDecl::node("tasks", "synth-tasks", "tasks"),
            InputDecl::node("kernels", "synth-tasks", "task_kernels"),
            InputDecl::node("data", "sft-data", "sft_generator"),
            InputDecl::node("generator", "sft-train", "checkpoint"),
            InputDecl::node("optimizer", "sft-train-optimizer", "checkpoint"),
        ];
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
        vec![
            OutputDecl::table("metrics", METRICS.clone()),
            OutputDecl::table("turns", TURNS.clone()),
            OutputDecl::table("tiers", TIERS.clone()),
            OutputDecl::table("generator", CHECKPOINT.clone()),
            OutputDecl::table("optimizer", CHECKPOINT.clone()),
            OutputDecl::table("plots", CHECKPOINT.clone()),
        ]
    }
    fn resolve_external(
        &self,
        _input: &str,
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        self.params.reward_external(ctx)
    }
    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        self.params.environment(ctx)
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let p = &self.params;
        let cfg = p.reward_config(ctx)?;
        let mut ts = load_tasks(ctx)?;
        let per_step = p.tasks_per_step.max(1);
        let fresh =
            (p.task_pool == "fresh").then(|| fresh_families(&mut ts, p.steps * per_step, p.seed));
        let families = match &fresh {
            Some(f) => f.iter().collect(),
            None => ts.pool(&p.task_pool),
        };
        if families.is_empty() {
            return Err(StageError::bad_input(
                "tasks",
                Some("task_id"),
                format!("no `{}` families to train on", p.task_pool),
            ));
        }
        let device = crate::train_stages::resolve_device(&p.device);
        let mut h = harness(ctx, &p.mode, p.timeout_s, ts.naive.clone())?;
        let mode = if !h.pools.is_empty() {
            "full"
        } else {
            "compile-only"
        };
        let tmp = ctx.store().temp_dir()?;
        let dir = tmp.path();
        let (g, o) = (dir.join("gen"), dir.join("opt"));
        materialize(ctx.store(), ctx.input_path("generator")?, &g)?;
        materialize(ctx.store(), ctx.input_path("optimizer")?, &o)?;
        let mut job = serve_job(&g, &o, device, p);
        if let Some(coef) = p.ptx() {
            let mut ptx = json!({"coef": coef, "batch": p.ptx_batch.unwrap_or(8), "seed": p.seed});
            for (input, agent) in [("data", "generator"), ("optimizer_data", "optimizer")] {
                let path = dir.join(format!("ptx_{agent}.jsonl"));
                let table = ctx.input_path(input)?.to_path_buf();
                if crate::train_stages::write_chats(&table, &["train"], &path)? == 0 {
                    return Err(StageError::bad_input(
                        table.display().to_string(),
                        Some("split"),
                        "ptx_coef: no `train` rows",
                    ));
                }
                ptx[agent] = json!(path);
            }
            job["ptx"] = ptx;
        }
        let mut tc = TrainerClient::start(
            &job,
            dir,
            Sampling {
                max_new_tokens: p.max_new_tokens,
                temperature: p.temperature,
                top_p: p.top_p,
                seed: p.seed as i64,
            },
        )?;
        let settings = EpisodeSettings {
            max_turns: p.max_turns,
            public_seeds: h.public_seeds.clone(),
        };
        let max_tier = families.iter().map(|t| t.tier).max().unwrap_or(0);
        let mut tier = families.iter().map(|t| t.tier).min().unwrap_or(0);
        let mut opened: Vec<(i64, i64, Option<f64>, Option<f64>)> = vec![(tier, 0, None, None)];
        let mut history: Vec<(usize, Episode)> = Vec::new();
        let mut rows: Vec<Value> = Vec::new();
        let mut turn_rows: Vec<(usize, usize, crate::episode::Turn, String, i64, f64)> = Vec::new();
        let mut rng = p.seed ^ 0x005E_ED0F_C0DA;
        let own_credit = p.generator_credit.as_deref() == Some("own");
        let progress = ctx.progress("steps", Some(p.steps as u64));
        for step in 1..=p.steps {
            let pool: Vec<&TaskSpec> = families
                .iter()
                .copied()
                .filter(|t| t.tier <= tier)
                .collect();
            let mut chosen: Vec<&TaskSpec> = Vec::new();
            for k in 0..per_step {
                // Fresh: new families every step, in order; else a seeded draw.
                chosen.push(if fresh.is_some() {
                    pool[((step - 1) * per_step + k) % pool.len()]
                } else {
                    pool[(splitmix(&mut rng) % pool.len() as u64) as usize]
                });
            }
            let tasks: Vec<&TaskSpec> = chosen
                .iter()
                .flat_map(|t| std::iter::repeat_n(*t, p.group_size))
                .collect();
            let (g0, m0, seed0) = (tc.gen_seconds, h.mark(), tc.sampling.seed);
            let eps = run_episodes(&tasks, &mut tc, &mut h, &cfg, &settings)
                .map_err(StageError::Failed)?;
            // GRPO groups: generator turns by task slot; optimizer turns by (task slot, turn).
            let (mut gen_s, mut opt_s) = (Vec::new(), Vec::new());
            let (mut gen_r, mut gen_g, mut opt_r, mut opt_g) = (vec![], vec![], vec![], vec![]);
            for (ei, e) in eps.iter().enumerate() {
                let slot = ei / p.group_size;
                for t in &e.turns {
                    match t.role {
                        Role::Generator => {
                            gen_s.push((ei, t.turn, t.completion));
                            gen_r.push(if own_credit {
                                t.reward.reward
                            } else {
                                t.credit
                            });
                            gen_g.push(slot);
                        }
                        Role::Optimizer => {
                            opt_s.push((ei, t.turn, t.completion));
                            opt_r.push(t.credit);
                            opt_g.push(slot * 64 + t.turn);
                        }
                    }
                }
            }
            // PPO: GAE over each episode's turns with the critics' values, whitened per agent;
            // the value targets go with the samples. GRPO: group-normalized turn credits.
            let ppo = (p.algorithm == "ppo")
                .then(|| ppo_targets(&eps, &cfg.credit, p.gamma, p.gae_lambda));
            let (gen_a, opt_a, gen_ret, opt_ret) = match &ppo {
                Some(t) => {
                    let by = |r: Role| -> (Vec<f64>, Vec<f64>) {
                        eps.iter()
                            .zip(t)
                            .flat_map(|(e, v)| {
                                e.turns.iter().zip(v).filter(move |(x, _)| x.role == r)
                            })
                            .map(|(_, x)| *x)
                            .unzip()
                    };
                    let ((ga, gr), (oa, or)) = (by(Role::Generator), by(Role::Optimizer));
                    (whiten(&ga), whiten(&oa), gr, or)
                }
                None => (
                    group_advantages(&gen_r, &gen_g, p.std_floor),
                    group_advantages(&opt_r, &opt_g, p.std_floor),
                    vec![],
                    vec![],
                ),
            };
            let mut adv: BTreeMap<(usize, usize), f64> = BTreeMap::new();
            let t_up = Instant::now();
            let mut upd = |agent: Role,
                           s: &[(usize, usize, Option<u64>)],
                           a: &[f64],
                           ret: &[f64]|
             -> Result<Value, StageError> {
                let samples: Vec<Value> = s
                    .iter()
                    .zip(a)
                    .enumerate()
                    .filter_map(|(k, ((ei, t, id), a))| {
                        adv.insert((*ei, *t), *a);
                        id.map(|id| match ret.get(k) {
                            Some(r) => json!({"id": id, "advantage": a, "return": r}),
                            None => json!({"id": id, "advantage": a}),
                        })
                    })
                    .collect();
                tc.request(&json!({"op": "update", "agent": agent, "samples": samples}))
            };
            let gu = upd(Role::Generator, &gen_s, &gen_a, &gen_ret)?;
            let ou = upd(Role::Optimizer, &opt_s, &opt_a, &opt_ret)?;
            let update_seconds = t_up.elapsed().as_secs_f64();
            let finals: Vec<f64> = eps.iter().map(Episode::final_reward).collect();
            let (mr, sd) = mean_std(&finals);
            let mut per_tier: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
            for (e, r) in eps.iter().zip(&finals) {
                per_tier.entry(e.tier).or_default().push(*r);
            }
            let by_tier: serde_json::Map<String, Value> = per_tier
                .iter()
                .map(|(t, v)| (t.to_string(), json!(mean_std(v).0)))
                .collect();
            let refs: Vec<&Episode> = eps.iter().collect();
            let (cr, pr) = rates(&refs);
            let first_cr = eps
                .iter()
                .filter(|e| e.turns.first().is_some_and(|t| t.reward.compiled))
                .count() as f64
                / eps.len().max(1) as f64;
            let sp: Vec<f64> = eps
                .iter()
                .filter_map(|e| {
                    let b = e.best_components();
                    b.speedup.filter(|_| b.gate)
                })
                .collect();
            let geo = (!sp.is_empty()).then(|| {
                (sp.iter().map(|x| x.max(1e-9).ln()).sum::<f64>() / sp.len() as f64).exp()
            });
            let turns_used =
                eps.iter().map(|e| e.turns.len() as f64).sum::<f64>() / eps.len().max(1) as f64;
            let used = h.since(&m0);
            let cands = used.candidates.max(1) as f64;
            let mut row = json!({"step": step, "tier": tier, "episodes": eps.len(), "mean_reward": mr,
                "reward_std": sd, "compile_rate": cr, "pass_rate": pr, "first_turn_compile_rate": first_cr,
                "speedup": geo, "turns_used": turns_used, "kl": gu["kl"], "entropy": gu["entropy"],
                "optimizer_kl": ou["kl"], "gen_seconds": tc.gen_seconds - g0,
                "update_seconds": update_seconds,
                "harness_ms_per_candidate": 1000.0 * used.seconds / cands,
                "signal_groups": signal_share(&gen_r, &gen_g, 1e-9),
                "optimizer_signal_groups": signal_share(&opt_r, &opt_g, 1e-9),
                "compile_overlap": used.prefetch_hits as f64 / cands,
                "value_loss": ppo.as_ref().map(|_| &gu["value_loss"]),
                "optimizer_value_loss": ppo.as_ref().map(|_| &ou["value_loss"]),
                "max_approx_kl": gu["max_approx_kl"], "optimizer_max_approx_kl": ou["max_approx_kl"],
                "skipped_minibatches": gu["skipped_minibatches"],
                "optimizer_skipped_minibatches": ou["skipped_minibatches"],
                "update_steps": gu["steps"], "optimizer_update_steps": ou["steps"],
                "ptx_loss": p.ptx().map(|_| &gu["ptx_loss"]),
                "optimizer_ptx_loss": p.ptx().map(|_| &ou["ptx_loss"]),
                "algorithm": p.algorithm,
                "reward_by_tier_json": Value::Object(by_tier).to_string(),
                "mode": mode, "device": device});
            if let Value::Object(r) = &mut row {
                r.extend(used.seconds_json());
            }
            if p.control == Some(true) {
                // The same tasks and sampling seeds from the frozen references; the policy's
                // seed sequence goes on as without the control.
                let (seed1, t_ctl) = (tc.sampling.seed, Instant::now());
                (tc.sampling.seed, tc.reference) = (seed0, true);
                let ctl = run_episodes(&tasks, &mut tc, &mut h, &cfg, &settings);
                (tc.sampling.seed, tc.reference) = (seed1, false);
                let ctl = ctl.map_err(StageError::Failed)?;
                let finals: Vec<f64> = ctl.iter().map(Episode::final_reward).collect();
                let (c, pass) = rates(&ctl.iter().collect::<Vec<_>>());
                row["control_reward"] = json!(mean_std(&finals).0);
                row["control_compile_rate"] = json!(c);
                row["control_pass_rate"] = json!(pass);
                row["control_seconds"] = json!(t_ctl.elapsed().as_secs_f64());
            }
            rows.push(row);
            for (ei, e) in eps.iter().enumerate() {
                for t in &e.turns {
                    let a = adv.get(&(ei, t.turn)).copied().unwrap_or(0.0);
                    turn_rows.push((step, ei, t.clone(), e.task_id.clone(), e.tier, a));
                }
            }
            history.extend(eps.into_iter().map(|e| (step, e)));
            // The gate on the current tier over the last `gate_window` steps.
            if tier < max_tier {
                let recent: Vec<&Episode> = history
                    .iter()
                    .filter(|(s, e)| *s + p.gate_window > step && e.tier == tier)
                    .map(|(_, e)| e)
                    .collect();
                let (c, pass) = rates(&recent);
                let since = step - opened.last().map_or(0, |o| o.1 as usize);
                if !recent.is_empty() && gate_passes(since, p, c, pass) {
                    tier += 1;
                    opened.push((tier, step as i64, Some(c), pass));
                }
            }
            progress.inc(1);
        }
        let ck = dir.join("rl");
        tc.request(&json!({"op": "save", "dir": ck}))?;
        tc.quit();
        ingest_dir(ctx, &ck.join("generator"), "generator")?;
        ingest_dir(ctx, &ck.join("optimizer"), "optimizer")?;
        write_metrics(ctx, &rows)?;
        write_turns(ctx, &turn_rows)?;
        let b = cudarl_data::parquet_io::batch(
            &TIERS.clone(),
            vec![
                Arc::new(Int64Array::from(
                    opened.iter().map(|x| x.0).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(
                    opened.iter().map(|x| x.1).collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(
                    opened.iter().map(|x| x.2).collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(
                    opened.iter().map(|x| x.3).collect::<Vec<_>>(),
                )),
            ],
        )
        .map_err(data_err)?;
        write_output(ctx, "tiers", &b)?;
        let pd = dir.join("plots");
        std::fs::create_dir_all(&pd).map_err(|e| StageError::Failed(e.to_string()))?;
        plots(&rows, &turn_rows, mode, device, &pd).map_err(StageError::Failed)?;
        ingest_dir(ctx, &pd, "plots")
    }
}

fn col_f(rows: &[Value], k: &str) -> ArrayRef {
    Arc::new(Float64Array::from(
        rows.iter().map(|r| r[k].as_f64()).collect::<Vec<_>>(),
    ))
}

fn write_metrics(ctx: &StageContext<'_>, rows: &[Value]) -> Result<(), StageError> {
    let schema = METRICS.clone();
    let cols: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| -> ArrayRef {
            let k = f.name().as_str();
            match f.data_type() {
                DataType::Int64 => Arc::new(Int64Array::from(
                    rows.iter()
                        .map(|r| r[k].as_i64().unwrap_or(0))
                        .collect::<Vec<_>>(),
                )),
                DataType::Utf8 => Arc::new(StringArray::from(
                    rows.iter()
                        .map(|r| r[k].as_str().unwrap_or_default().to_string())
                        .collect::<Vec<_>>(),
                )),
                _ if f.is_nullable() => col_f(rows, k),
                _ => Arc::new(Float64Array::from(
                    rows.iter()
                        .map(|r| r[k].as_f64().unwrap_or(0.0))
                        .collect::<Vec<_>>(),
                )),
            }
        })
        .collect();
    let b = cudarl_data::parquet_io::batch(&schema, cols).map_err(data_err)?;
    write_output(ctx, "metrics", &b)
}

type TurnRow = (usize, usize, crate::episode::Turn, String, i64, f64);

/// One row of a turns table: (turn, task id, tier, advantage).
pub(crate) type TurnItem<'a> = (&'a crate::episode::Turn, &'a str, i64, f64);

/// The columns of a turns table after its leading key columns: turn, task_id, tier, role,
/// tokens, text, code, failure, feedback, reward, credit, advantage, value, components_json
/// (the tail of [`TURNS`]; `eval`'s `turns` has the same tail). Each item: (turn, task id,
/// tier, advantage).
pub(crate) fn turn_columns(t: &[TurnItem<'_>]) -> Vec<ArrayRef> {
    let s = |f: &dyn Fn(&crate::episode::Turn) -> Option<String>| -> ArrayRef {
        Arc::new(StringArray::from(
            t.iter().map(|r| f(r.0)).collect::<Vec<_>>(),
        ))
    };
    let x = |f: &dyn Fn(&TurnItem<'_>) -> Option<f64>| -> ArrayRef {
        Arc::new(Float64Array::from(t.iter().map(f).collect::<Vec<_>>()))
    };
    vec![
        Arc::new(Int64Array::from(
            t.iter().map(|r| r.0.turn as i64).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(t.iter().map(|r| r.1).collect::<Vec<_>>())),
        Arc::new(Int64Array::from(t.iter().map(|r| r.2).collect::<Vec<_>>())),
        s(&|u| Some(format!("{:?}", u.role).to_lowercase())),
        Arc::new(Int64Array::from(
            t.iter().map(|r| r.0.tokens as i64).collect::<Vec<_>>(),
        )),
        s(&|u| Some(u.text.clone())),
        s(&|u| u.code.clone()),
        s(&|u| u.failure.clone()),
        s(&|u| Some(u.feedback.clone())),
        x(&|r| Some(r.0.reward.reward)),
        x(&|r| Some(r.0.credit)),
        x(&|r| Some(r.3)),
        x(&|r| r.0.value),
        s(&|u| Some(serde_json::to_string(&u.reward).expect("json"))),
    ]
}

/// The fields of [`turn_columns`].
pub(crate) fn turn_fields() -> Vec<Field> {
    TURNS.fields()[2..]
        .iter()
        .map(|f| f.as_ref().clone())
        .collect()
}

fn write_turns(ctx: &StageContext<'_>, t: &[TurnRow]) -> Result<(), StageError> {
    let items: Vec<_> = t.iter().map(|r| (&r.2, r.3.as_str(), r.4, r.5)).collect();
    let mut cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(
            t.iter().map(|r| r.0 as i64).collect::<Vec<_>>(),
        )),
        Arc::new(Int64Array::from(
            t.iter().map(|r| r.1 as i64).collect::<Vec<_>>(),
        )),
    ];
    cols.extend(turn_columns(&items));
    let b = cudarl_data::parquet_io::batch(&TURNS.clone(), cols).map_err(data_err)?;
    write_output(ctx, "turns", &b)
}

/// `reward_curve.png` (mean final reward per step with a +-1 std band as two lines) and
/// `rates.png` (best-turn compile and pass rates per step and tier).
fn plots(
    rows: &[Value],
    turns: &[TurnRow],
    mode: &str,
    device: &str,
    dir: &std::path::Path,
) -> Result<(), String> {
    use crate::plot::{Series, line_chart};
    let pts = |f: &dyn Fn(&Value) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|r| Some((r["step"].as_f64()?, f(r)?)))
            .collect()
    };
    line_chart(
        &dir.join("reward_curve.png"),
        &format!("rl-train: mean episode reward per step ({mode}, {device})"),
        "RL step",
        "final reward",
        &[
            Series::new("mean", pts(&|r| r["mean_reward"].as_f64())),
            Series::new(
                "mean + std",
                pts(&|r| Some(r["mean_reward"].as_f64()? + r["reward_std"].as_f64()?)),
            ),
            Series::new(
                "mean - std",
                pts(&|r| Some(r["mean_reward"].as_f64()? - r["reward_std"].as_f64()?)),
            ),
        ],
    )?;
    // Per tier: best-turn compile and pass rates of that tier's episodes per step.
    let mut per: BTreeMap<(i64, usize), (f64, f64, f64, bool)> = BTreeMap::new();
    let mut last: BTreeMap<(usize, usize), &TurnRow> = BTreeMap::new();
    for r in turns {
        let e = last.entry((r.0, r.1)).or_insert(r);
        if r.2.reward.reward > e.2.reward.reward {
            *e = r;
        }
    }
    for r in last.values() {
        let e = per.entry((r.4, r.0)).or_default();
        e.0 += 1.0;
        e.1 += f64::from(u8::from(r.2.reward.compiled));
        e.2 += f64::from(u8::from(r.2.reward.correct == Some(true)));
        e.3 |= r.2.reward.mode == "full";
    }
    let tiers: BTreeSet<i64> = per.keys().map(|k| k.0).collect();
    let mut series = Vec::new();
    for tier in tiers {
        let of = |k: usize| -> Vec<(f64, f64)> {
            per.iter()
                .filter(|((t, _), v)| *t == tier && (k == 1 || v.3))
                .map(|((_, s), v)| (*s as f64, if k == 1 { v.1 / v.0 } else { v.2 / v.0 }))
                .collect()
        };
        series.push(Series::new(format!("tier {tier} compile rate"), of(1)));
        let pass = of(2);
        if !pass.is_empty() {
            series.push(Series::new(format!("tier {tier} pass rate"), pass));
        }
    }
    line_chart(
        &dir.join("rates.png"),
        &format!("rl-train: compile and pass rates per tier, best turn ({mode})"),
        "RL step",
        "rate",
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_trainer_keys_reach_the_trainer_and_leave_the_stage_key_alone_when_absent() {
        let t = |s: &str| toml::from_str::<toml::Table>(s).unwrap();
        let job = |p: &Params| serve_job(Path::new("g"), Path::new("o"), "cpu", p);
        use std::path::Path;
        let base = RlTrain::from_table(t("lr = 2e-5")).unwrap().params;
        for (key, set, value) in [
            // Absent: the trainer uses `lr` (cudarl_train::rl_serve::RlServe::agent_optims).
            ("generator_lr", "generator_lr = 5e-6", 5e-6),
            // Absent: every minibatch steps (cudarl_train::rl_serve::RlServe::target_kl).
            ("target_kl", "target_kl = 0.02", 0.02),
        ] {
            assert!(
                params_json(&base).get(key).is_none(),
                "{key}: key unchanged"
            );
            assert_eq!(job(&base)[key], Value::Null, "{key}");
            let on = RlTrain::from_table(t(&format!("lr = 2e-5\n{set}")))
                .unwrap()
                .params;
            assert_eq!(params_json(&on)[key], value);
            assert_eq!(job(&on)[key].as_f64(), Some(value));
            assert_eq!(job(&on)["lr"].as_f64(), Some(2e-5), "{key} leaves lr alone");
        }
        for bad in ["target_kl = 0.0", "target_kl = -0.1"] {
            let e = RlTrain::from_table(t(bad)).unwrap_err();
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
            let e = RlTrain::from_table(t(bad)).unwrap_err();
            assert!(e.contains(msg), "{bad}: {e}");
        }
    }

    #[test]
    fn fresh_families_are_new_distinct_and_reproducible() {
        // A task set whose train, rl and hold-out splits are generated families: the draw
        // `fresh_families(_, _, 0)` would make without its exclusion, so each of its first 40
        // families must be replaced.
        let made = crate::families::generate(
            &crate::families::GenerateParams {
                elementwise: 60,
                row_reduce: 0,
                seed: FRESH_SALT,
            },
            &Default::default(),
        );
        let specs: Vec<TaskSpec> = made.into_iter().map(|f| f.spec).collect();
        let set = || TaskSet {
            train: specs[..40].to_vec(),
            rl: specs[40..50].to_vec(),
            test: specs[50..].to_vec(),
            naive: BTreeMap::from([("vector_add".to_string(), "// naive".to_string())]),
        };
        let mut ts = set();
        let fresh = fresh_families(&mut ts, 40, 0);
        assert_eq!(fresh.len(), 40);
        let known: std::collections::BTreeSet<String> = specs
            .iter()
            .map(|t| crate::families::canonical(&t.reference["out"]))
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        for (i, f) in fresh.iter().enumerate() {
            assert_eq!(f.id, format!("fresh_ew_{i:03}"));
            assert_eq!(f.tier, 0);
            let c = crate::families::canonical(&f.reference["out"]);
            assert!(!known.contains(&c), "{} repeats a task: {c}", f.id);
            assert!(seen.insert(c), "{} repeats a fresh family", f.id);
            assert!(ts.naive[&f.id].contains("__global__"), "{}", f.id);
        }
        assert_eq!(ts.naive.len(), 41, "the task set's own kernels stay");
        // The same inputs give the same families; another seed other ones.
        let again = fresh_families(&mut set(), 40, 0);
        let refs = |v: &[TaskSpec]| -> Vec<String> {
            v.iter().map(|t| t.reference["out"].clone()).collect()
        };
        assert_eq!(refs(&again), refs(&fresh));
        assert_ne!(refs(&fresh_families(&mut set(), 40, 1)), refs(&fresh));
        let p = RlTrain::from_table(toml::from_str("task_pool = \"fresh\"").unwrap());
        assert!(p.is_ok());
        let e = RlTrain::from_table(toml::from_str("task_pool = \"new\"").unwrap()).unwrap_err();
        assert!(e.contains("`both` or `fresh`"), "{e}");
    }

    #[test]
    fn the_tier_gate_needs_a_full_window_and_both_rates() {
        // Defaults: window 2 steps, compile > 0.9, pass > 0.75.
        let p = RlTrain::from_table(toml::Table::new()).unwrap().params;
        assert_eq!(p.gate_window, 2);
        // Perfect rates after one step on the tier: not yet.
        assert!(!gate_passes(1, &p, 1.0, Some(1.0)));
        assert!(gate_passes(2, &p, 1.0, Some(1.0)));
        // Each rate must clear its bar (strictly).
        assert!(!gate_passes(3, &p, 0.9, Some(1.0)));
        assert!(!gate_passes(3, &p, 1.0, Some(0.75)));
        // Compile-only: no pass rate, the compile rate decides.
        assert!(gate_passes(2, &p, 0.95, None));
    }
}
