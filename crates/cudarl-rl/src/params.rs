//! `rl-train`'s parameters (`[stages.rl-train]`; `eval`, `collab-data` and `optimize` flatten
//! them into their own): sampling, update, harness and curriculum settings, their defaults, the
//! checks serde cannot make, and the trainer settings and sampling state they give.

use std::path::Path;

use cudarl_curriculum::prompts::{GENERATOR_SYSTEM, OPTIMIZER_SYSTEM};
use cudarl_protocol::{Algorithm, Device, PgConfig, Ptx, RlServe};
use serde::{Deserialize, Serialize};

use crate::reward::RewardConfig;
use crate::step::{GeneratorCredit, UpdateSettings};
use crate::tasks::TaskPool;
use crate::trainer::Sampling;

/// Whether a `model` parameter names a Hugging Face checkpoint directory (a path: it has a `/`)
/// rather than a `configs/model` file.
pub fn is_checkpoint_dir(model: &str) -> bool {
    model.contains('/')
}

fn d_steps() -> usize {
    20
}
/// `tasks_per_step` when absent.
pub fn d_tasks() -> usize {
    4
}
/// `group_size` when absent.
pub fn d_group() -> usize {
    4
}
fn d_turns() -> usize {
    5
}
fn d_tokens() -> usize {
    512
}
/// `temperature` and `top_p` when absent (and other settings whose default is 1).
pub fn d_one() -> f64 {
    1.0
}
fn d_lr() -> f64 {
    1e-5
}
/// `kl_coef` when absent.
pub fn d_kl() -> f64 {
    0.04
}
/// `clip` when absent (PPO, Schulman et al. 2017).
pub fn d_clip() -> f64 {
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

/// `checkpoint_every` when absent: a save of the `small` model's state (both agents' float32
/// weights and AdamW moments, 26.7M parameters x 12 bytes x 2, about 0.64 GB) took about 0.8 s
/// on an H200, every 5 steps of about 14 s (`benchmarks/results/rl_resume_h200_2026-11-26.json`).
pub const DEFAULT_CHECKPOINT_EVERY: usize = 5;

/// Whether the harness runs tests: `auto` (full tests and timing on a GPU, compile-only
/// without one) or `compile` (compile-only everywhere).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Full on a GPU, compile-only without.
    #[default]
    Auto,
    /// Compile-only.
    Compile,
}

/// Parameters (`[stages.rl-train]`; `eval` shares the sampling and harness ones).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// A Hugging Face checkpoint directory (a path with a `/`, relative to the project root or
    /// absolute; its files as `cudarl_stages::common::checkpoint_files` lists them) both agents start
    /// from, in place of the DAG's checkpoints: `rl-train`'s SFT generator and optimizer,
    /// `eval`'s SFT pair (the baseline RL is compared with, so `eval` then compares RL with the
    /// checkpoint it started from), `collab-data`'s SFT pair, `optimize`'s RL pair. Its
    /// tokenizer and chat template are used; its files enter the key, its path does not. The
    /// stages those checkpoints come from do not run. Absent: the DAG's checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
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
    /// passes 1.5 x this (nats per token; Spinning Up PPO's rule, [`RlServe::target_kl`]).
    /// Absent: every minibatch steps, and left out of the stage's key. Measured at 0.02 (H100,
    /// 64-episode steps): it never stopped an update, the largest approximate KL within one was
    /// 0.0013 nats per token (`benchmarks/results/rl_group_size_h100_2026-11-24.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_kl: Option<f64>,
    /// Passes over each update's minibatches (GRPO's mu iterations, Shao et al. 2024; PPO's
    /// epochs), the ratio always against the sampling policy ([`RlServe::epochs`]). Absent: 1,
    /// and left out of the key; `pipelines/default.toml` sets 4. Measured (H100, 64-episode
    /// steps, minibatch 32): RL's mean reward minus its frozen control's over steps 2-5 was
    /// -0.018 +- 0.008 with one pass and +0.017 +- 0.009 with four on the same SFT draw
    /// (`benchmarks/results/rl_epochs_h100_2026-11-24.json`), +0.013 and +0.019 on two more
    /// (`benchmarks/results/rl_fresh_warmup_h100_2026-11-24.json`), and -0.025 to +0.000 in
    /// four later runs (`benchmarks/results/rl_ptx_h100_2026-11-24_*.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<usize>,
    /// What a generator turn is credited with ([`GeneratorCredit`]): `episode` (absent: the
    /// turn credit of `docs/architecture.md`, "Reward and turn credit", which adds the later
    /// turns' discounted rewards) or `own` (its own turn's reward `r_0`). GRPO only. The
    /// `turns` table's `credit` stays the turn credit; its `advantage` is what the update used.
    /// Absent: `episode`, left out of the key. Measured (H100, with the earlier credit
    /// `0.3 r_0 + 0.7 * 0.9^(T-1) R`, R the episode's best turn): `own` -0.020 +- 0.008 against
    /// the frozen control, hold-out pass -0.074 +- 0.036
    /// (`benchmarks/results/rl_epochs_h100_2026-11-24.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator_credit: Option<GeneratorCredit>,
    /// Ratio clip.
    #[serde(default = "d_clip")]
    pub clip: f64,
    /// Completions per optimizer step.
    #[serde(default = "d_mb")]
    pub minibatch: usize,
    /// `grpo` (group-normalized advantages) or `ppo` (a value head per agent, GAE).
    #[serde(default)]
    pub algorithm: Algorithm,
    /// Optimizer steps of linear learning-rate warmup per agent.
    #[serde(default)]
    pub warmup: usize,
    /// PPO: discount per turn in GAE (1.0).
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
    #[serde(default)]
    pub mode: Mode,
    /// The Nsight Compute profile pass after each correct candidate's timing
    /// (`cudarl_cuda::profile`): achieved occupancy and DRAM throughput for the reward's
    /// `occupancy` and `dram_throughput` terms (`reward = "profiled"`). One more runner per
    /// correct candidate, under `ncu`: 1.3-1.5 s each on an H200
    /// (benchmarks/results/profile_pass_h200_2026-11-26.json).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub profile: bool,
    /// `auto`, `cpu` or `cuda` for the models.
    #[serde(default)]
    pub device: Device,
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
    /// Time spent timing each correct candidate (and each task's naive kernel and torch
    /// reference), ms: [`cudarl_cuda::gpu::BenchSpec::budget_ms`]; timing stops earlier once the
    /// per-launch times vary by less than 2%. The GPU times one kernel at a time, so this
    /// bounds the GPU phase of a step. Absent: the harness's 100 ms, left out of the key;
    /// `pipelines/default.toml` gives `rl-train` 30 (the reward's speedup term is a log over a
    /// factor of 8, so a few per cent of timing noise moves it by less than 0.01). With it, the
    /// SASS read only where it can change a reward, GPU tests starting on the first build that
    /// lands and repeats answered from their verdicts, a 64-episode step took 6.7 s on average
    /// over 100 steps on an H200
    /// (`benchmarks/results/rl_resume_100_steps_h200_2026-11-27.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing_budget_ms: Option<f64>,
    /// Seed (task draws and sampling).
    #[serde(default)]
    pub seed: u64,
    /// GRPO: the floor under a group's reward std when normalizing advantages
    /// ([`crate::credit::group_advantages`]; 0 = plain GRPO).
    #[serde(default = "d_std_floor")]
    pub std_floor: f64,
    /// The families RL draws from ([`TaskPool`]): `auto` (sft-data's `rl` split when it
    /// reserved one, else `train`), `train`, `rl`, `both`, or `fresh`: elementwise families
    /// generated for this run ([`crate::tasks::fresh_families`]), `tasks_per_step` new ones
    /// every step, none of them a task of `synth-tasks` (hold-out included). Measured (H100):
    /// `fresh` +0.005 and -0.014 against the frozen control, hold-out pass -0.118 and -0.074
    /// against SFT (`benchmarks/results/rl_fresh_warmup_h100_2026-11-24.json`), so not the
    /// default.
    #[serde(default)]
    pub task_pool: TaskPool,
    /// Also run, each step, the frozen reference policies (the SFT checkpoints) on the step's
    /// tasks with the step's sampling seeds, untrained (`control_*` metrics; the eval report
    /// gives RL minus control per step). A step's tasks come from `seed` alone, so a reward
    /// curve mixes learning with the tasks' difficulty: measured (H100), a frozen policy's
    /// first-vs-last-three-steps rise +0.076 +- 0.030 against RL's +0.096 +- 0.030
    /// (`benchmarks/results/main_job_h100_2026-11-24_frozen_control.json`). Costs a second
    /// rollout per step. Absent: off, and left out of the stage's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<bool>,
    /// PPO-ptx's weight (absent or 0: off; absent is left out of the key; [`Ptx`], Ouyang et
    /// al. 2022): each agent's every minibatch step adds this times the mean cross-entropy of
    /// `ptx_batch` of its own SFT conversations (`sft-data`'s train split of `sft_generator` /
    /// `sft_optimizer`), so RL moves the policy away from SFT only where its rewards ask;
    /// `pipelines/default.toml` sets 1.0. Measured (H100, one SFT draw, paired with `ptx_coef =
    /// 0`): the generator's first update's k3 KL 1.03 -> 0.006 nats per token, its hold-out
    /// first turns unchanged from SFT's, hold-out pass RL - SFT +0.022 against -0.037 without
    /// it (`benchmarks/results/rl_ptx_h100_2026-11-24_main_job.json`); on two more draws -0.029
    /// and -0.059 (`benchmarks/results/rl_ptx_h100_2026-11-24_coef_sweep.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx_coef: Option<f64>,
    /// GRPO: leave completions whose advantage is 0 out of the update (absent: true, and left
    /// out of the key; docs/architecture.md, "Reward and turn credit"). `false` trains on every
    /// completion, as before, their tokens in the token mean, the KL and PPO-ptx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_only: Option<bool>,
    /// Save the run's state every this many steps and at its last step, and continue from the
    /// latest saved step (`cudarl_stages::rl_progress`; docs/architecture.md, "Resuming"). 0: save
    /// nothing and start from step 1. Absent: [`DEFAULT_CHECKPOINT_EVERY`], and left out of
    /// the key; never part of the progress key, like `steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<usize>,
    /// The ceiling on the KL and PPO-ptx terms' gradient as a multiple of the policy
    /// gradient's norm, per minibatch step (`cudarl_train::rl::cap_auxiliary`): with a
    /// ceiling at most 1 a step never lowers the policy-gradient objective to first order,
    /// however large the k3 KL or the SFT cross-entropy get. Absent: 1.0, and left out of the
    /// key; 0: off (the terms summed into one loss, unscaled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aux_grad_cap: Option<f64>,
    /// Constrained decoding of the launcher declaration: once an answer writes
    /// `void launch(`, the trainer writes the rest of the task's declaration through its `)`
    /// and the model decodes on from there; those tokens are masked out of updates
    /// (`cudarl_protocol::rl::LAUNCHER_TRIGGER`, docs/architecture.md, "Constrained
    /// launcher"). Applies to both agents, the frozen control and every stage that samples
    /// with these settings (`eval`, `collab-data`, `optimize`). Absent: off, and left out of
    /// the key. Measured (H100, the main job's SFT and RL checkpoints, greedy KernelBench
    /// episodes paired by problem): first turns failing on the launcher's signature 38 -> 0 of
    /// 100, failing on undefined names 12 -> 54; KernelBench level 1 compile 0.36 -> 0.28 (SFT)
    /// and 0.32 -> 0.32 (RL), 11 episodes compiled only without it and 6 only with it (exact
    /// McNemar p = 0.33); `eval` 231 s unconstrained, 290 s constrained (one run each)
    /// (`benchmarks/results/constrained_launcher_h100_2026-12-06.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constrain_launcher: Option<bool>,
    /// PPO-ptx: SFT conversations per minibatch step (absent: 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx_batch: Option<usize>,
    /// `rl-train`: the share of each step's tasks drawn from the curriculum's KernelBench
    /// `train` problems that have a native launcher (and, on a GPU, recorded tests), among the
    /// open tiers like the task families; each such task is judged by
    /// [`crate::kb_judge::KbJudge`] (recorded tests, the problem's own sizes, speed against
    /// torch eager). Absent or 0: task families only, and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernelbench_share: Option<f64>,
    /// Train LoRA adapters of a frozen base instead of every weight, e.g. `{ r = 16, alpha =
    /// 32 }` (`cudarl_protocol::LoraConfig`: `r`, `alpha`, `target_modules`, all seven
    /// projections when absent; [`RlServe::lora`]). The base is held once in the compute dtype
    /// (bf16 on a GPU) and is also the KL reference (adapters off); with `model` both agents
    /// share it. `rl-train`'s `generator` and `optimizer` outputs are the merged checkpoints,
    /// and `generator_adapter` / `optimizer_adapter` hold the adapters in PEFT's layout. Stages
    /// that only sample (`eval`, `collab-data`, `optimize`) load each checkpoint once in the
    /// compute dtype whatever this says ([`RlServe::sample_only`]). Absent: full fine-tuning,
    /// and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<cudarl_protocol::LoraConfig>,
    /// Activation checkpointing in the RL update ([`RlServe::gradient_checkpointing`]): the
    /// policy and PPO-ptx passes keep each layer's input only and run the layers forward again
    /// during backward: 13-22% slower updates, and at 7B with LoRA minibatches of 4 and a
    /// PPO-ptx batch of 8 fit (`benchmarks/results/model_scale_h200_2026-11-30.json`). Absent:
    /// off, and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient_checkpointing: Option<bool>,
}

impl Params {
    /// The checks serde cannot make.
    ///
    /// # Errors
    /// A bad `lora` (named field), a `model` that is not a path, `gamma` or `gae_lambda` outside [0, 1], `std_floor` outside [0, 1], a GRPO group under 2,
    /// `generator_credit = "own"` with PPO, `epochs` 0, a negative `ptx_coef` or `aux_grad_cap`,
    /// `ptx_batch` 0, `kernelbench_share` outside [0, 1], a
    /// `target_kl` or `timing_budget_ms` not above 0.
    pub fn check(&self) -> Result<(), String> {
        if let Some(l) = &self.lora {
            l.check()?;
        }
        if let Some(m) = &self.model
            && !is_checkpoint_dir(m)
        {
            return Err(format!(
                "model `{m}`: a Hugging Face checkpoint directory, named by a path with a `/` \
                 (e.g. ./models/Qwen2.5-Coder-1.5B-Instruct)"
            ));
        }
        let unit = 0.0..=1.0;
        let grpo = self.algorithm == Algorithm::Grpo;
        let bad = [
            (
                !unit.contains(&self.gamma) || !unit.contains(&self.gae_lambda),
                "gamma and gae_lambda must be in [0, 1]",
            ),
            (
                !unit.contains(&self.std_floor),
                "std_floor must be in [0, 1]",
            ),
            (
                grpo && self.group_size < 2,
                "group_size must be at least 2 (GRPO normalizes within a group)",
            ),
            (
                !grpo && self.generator_credit == Some(GeneratorCredit::Own),
                "generator_credit `own` is for GRPO (PPO's GAE runs over the episode's turns)",
            ),
            (self.epochs == Some(0), "epochs must be at least 1"),
            (
                self.ptx_coef.is_some_and(|c| !(c >= 0.0 && c.is_finite())),
                "ptx_coef must be a number >= 0",
            ),
            (
                self.aux_grad_cap
                    .is_some_and(|c| !(c >= 0.0 && c.is_finite())),
                "aux_grad_cap must be a number >= 0",
            ),
            (self.ptx_batch == Some(0), "ptx_batch must be at least 1"),
            (
                self.kernelbench_share.is_some_and(|x| !unit.contains(&x)),
                "kernelbench_share must be in [0, 1]",
            ),
            (
                self.target_kl.is_some_and(|t| !(t > 0.0 && t.is_finite())),
                "target_kl must be a positive number of nats per token",
            ),
            (
                self.timing_budget_ms
                    .is_some_and(|t| !(t > 0.0 && t.is_finite())),
                "timing_budget_ms must be a positive number of milliseconds",
            ),
        ];
        match bad.iter().find(|(b, _)| *b) {
            Some((_, m)) => Err((*m).to_string()),
            None => Ok(()),
        }
    }

    /// The auxiliary-gradient ceiling when it is on (`aux_grad_cap` absent: 1.0; 0: off).
    pub fn aux_grad_cap(&self) -> Option<f64> {
        Some(self.aux_grad_cap.unwrap_or(1.0)).filter(|c| *c > 0.0)
    }

    /// PPO-ptx's weight when it is on (`ptx_coef` set and above 0).
    pub fn ptx(&self) -> Option<f64> {
        self.ptx_coef.filter(|c| *c > 0.0)
    }

    /// The share of KernelBench tasks when it is on (`kernelbench_share` set and above 0).
    pub fn kernelbench_share(&self) -> Option<f64> {
        self.kernelbench_share.filter(|s| *s > 0.0)
    }

    pub fn reward_rel(&self) -> String {
        format!("configs/reward/{}.toml", self.reward)
    }

    /// The sampling settings, seeds from `seed`.
    pub fn sampling(&self) -> Sampling {
        Sampling {
            max_new_tokens: self.max_new_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            seed: self.seed as i64,
            constrain_launcher: self.constrain_launcher.unwrap_or(false),
        }
    }

    /// How an update turns episodes into advantages, with the reward config's credit weights.
    pub fn update_settings(&self, cfg: &RewardConfig) -> UpdateSettings {
        UpdateSettings {
            algorithm: self.algorithm,
            group_size: self.group_size,
            std_floor: self.std_floor,
            generator_credit: self.generator_credit.unwrap_or_default(),
            credit: cfg.credit,
            gamma: self.gamma,
            gae_lambda: self.gae_lambda,
            signal_only: self.signal_only.unwrap_or(true),
        }
    }

    /// The RL trainer's settings for the two checkpoints in `gen` and `opt`.
    pub fn serve_job(&self, gen_dir: &Path, opt_dir: &Path, ptx: Option<Ptx>) -> RlServe {
        RlServe {
            generator: gen_dir.to_path_buf(),
            optimizer: opt_dir.to_path_buf(),
            generator_system: GENERATOR_SYSTEM.to_string(),
            optimizer_system: OPTIMIZER_SYSTEM.to_string(),
            device: self.device,
            precision: Default::default(),
            lr: self.lr,
            generator_lr: self.generator_lr,
            pg: PgConfig {
                clip: self.clip,
                kl_coef: self.kl_coef,
                aux_grad_cap: self.aux_grad_cap(),
            },
            minibatch: self.minibatch,
            algorithm: self.algorithm,
            warmup: self.warmup,
            value_lr: self.value_lr,
            target_kl: self.target_kl,
            epochs: self.epochs.unwrap_or(1),
            ptx,
            lora: self.lora.clone(),
            gradient_checkpointing: self.gradient_checkpointing.unwrap_or(false),
            sample_only: false,
        }
    }
}
