//! The RL trainer (`rl-serve` job): its settings, the requests the pipeline sends on its stdin
//! (one JSON object per line) and the replies it prints (one per line; a streamed `generate`
//! prints its `partial` replies first).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::chat::{ChatMessage, Role};
use crate::job::{Device, Finish, LoraConfig, Precision};

/// Settings of the clipped policy loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgConfig {
    /// Ratio clip epsilon (PPO, Schulman et al., arXiv:1707.06347: 0.2).
    pub clip: f64,
    /// Weight of the KL penalty to the reference policy (GRPO, Shao et al.,
    /// arXiv:2402.03300: 0.04).
    pub kl_coef: f64,
    /// The ceiling on the auxiliary terms' gradient (the KL penalty and PPO-ptx) as a multiple
    /// of the policy gradient's norm, per minibatch step (`cudarl_train::rl::cap_auxiliary`);
    /// absent: the terms are summed into one loss, unscaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aux_grad_cap: Option<f64>,
}

impl Default for PgConfig {
    fn default() -> Self {
        PgConfig {
            clip: 0.2,
            kl_coef: 0.04,
            aux_grad_cap: None,
        }
    }
}

/// The policy-gradient algorithm of an RL run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// GRPO: advantages normalized within groups of episodes of the same task (Shao et al.,
    /// arXiv:2402.03300); no critic.
    #[default]
    Grpo,
    /// PPO with a learned value function and GAE advantages (Schulman et al.,
    /// arXiv:1707.06347, arXiv:1506.02438).
    Ppo,
}

impl Algorithm {
    /// `grpo` or `ppo`.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Grpo => "grpo",
            Algorithm::Ppo => "ppo",
        }
    }
}

/// PPO-ptx (Ouyang et al. 2022, arXiv:2203.02155, section 3.5: the RL objective plus `gamma`
/// times the log-likelihood of the pretraining distribution). Here the distribution is each
/// agent's own SFT data: every minibatch step adds `coef` times the mean masked next-token
/// cross-entropy (nats per assistant token) of the next `batch` SFT conversations of that
/// agent, taken in a `seed`-shuffled order and cycled. Measured (H100): the generator's
/// first-update k3 KL 1.03 -> 0.006 nats per token and its hold-out first turns unchanged from
/// SFT's (`benchmarks/results/rl_ptx_h100_2026-11-24_main_job.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ptx {
    /// Weight of the SFT cross-entropy in each minibatch's loss (InstructGPT's `gamma`).
    pub coef: f64,
    /// SFT conversations per minibatch step.
    pub batch: usize,
    /// The generator's SFT conversations: JSON lines, each a list of [`ChatMessage`]s.
    pub generator: PathBuf,
    /// The optimizer's.
    pub optimizer: PathBuf,
    /// Longer conversations are cut to this many tokens.
    #[serde(default = "d_ptx_len")]
    pub max_len: usize,
    /// Shuffling seed of the SFT order.
    #[serde(default)]
    pub seed: u64,
}

fn d_ptx_len() -> usize {
    1024
}

fn d_epochs() -> usize {
    1
}

fn d_value_lr() -> f64 {
    1e-3
}

/// Spinning Up's margin over `target_kl` before an update stops (see [`RlServe::target_kl`]).
pub const TARGET_KL_MARGIN: f64 = 1.5;

/// Bound of the per-token k3 KL estimate (nats), and of the log-ratio inside it (20): VERL's
/// `low_var_kl` (`verl/trainer/ppo/core_algos.py`, `kl_penalty`). Unbounded, a few tokens the
/// policy moved far from the reference reached 44 to 11,243 nats each in one update, and their
/// gradients dominated the minibatch.
pub const KL_CLAMP: f64 = 10.0;

/// Settings of the RL trainer process (the `rl-serve` job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlServe {
    /// The generator's starting checkpoint (Hugging Face directory with `tokenizer.json`).
    pub generator: PathBuf,
    /// The optimizer's starting checkpoint.
    pub optimizer: PathBuf,
    /// The generator's system prompt.
    pub generator_system: String,
    /// The optimizer's system prompt.
    pub optimizer_system: String,
    /// Where the agents run.
    pub device: Device,
    /// Compute dtype.
    #[serde(default)]
    pub precision: Precision,
    /// AdamW learning rate (both agents, or the optimizer alone with `generator_lr`).
    pub lr: f64,
    /// The generator's AdamW learning rate (absent: `lr`).
    #[serde(default)]
    pub generator_lr: Option<f64>,
    /// Loss settings.
    pub pg: PgConfig,
    /// Completions per optimizer step.
    pub minibatch: usize,
    /// `grpo` (group-normalized advantages from the caller, no critic) or `ppo` (a value head
    /// per agent; the caller computes GAE advantages from its estimates).
    #[serde(default)]
    pub algorithm: Algorithm,
    /// Optimizer steps of linear learning-rate warmup per agent.
    #[serde(default)]
    pub warmup: usize,
    /// AdamW learning rate of PPO's value heads.
    #[serde(default = "d_value_lr")]
    pub value_lr: f64,
    /// Early stop of an update (absent: every minibatch steps): before each minibatch's step
    /// the approximate KL from the policy that generated the completions to the current one,
    /// `mean_tokens(old_logp - logp)` (nats per token), is measured, and once it passes
    /// [`TARGET_KL_MARGIN`] `* target_kl` the update's remaining minibatches are skipped
    /// (OpenAI Spinning Up's PPO, Achiam 2018; Stable-Baselines3's `target_kl`). The first
    /// minibatch always steps.
    #[serde(default)]
    pub target_kl: Option<f64>,
    /// Passes over an update's minibatches (GRPO's mu iterations, Shao et al. 2024,
    /// Algorithm 1; PPO's epochs, Schulman et al. 2017). The old log-probabilities of the ratio
    /// are those of the policy that sampled the completions, computed once before the first
    /// pass; `target_kl` is checked before every minibatch of every pass. 0 counts as 1.
    #[serde(default = "d_epochs")]
    pub epochs: usize,
    /// PPO-ptx (absent: off).
    #[serde(default)]
    pub ptx: Option<Ptx>,
    /// Train LoRA adapters instead of every weight (absent: full fine-tuning). Each agent's
    /// base is loaded once in the compute dtype (bf16 on a GPU) and frozen; when `generator`
    /// and `optimizer` are the same directory both agents share one base. The KL reference is
    /// the base with the adapters off (no copy). `save` writes each agent merged, and its
    /// adapters in PEFT's layout to `<agent>_adapter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
    /// Activation checkpointing in updates (Chen et al. 2016): the policy's forward pass and
    /// PPO-ptx's keep each layer's input only, and the layers run forward again during
    /// backward, once per backward pass (two with `pg.aux_grad_cap`). The LM head runs over
    /// chunks of completion positions either way. A GRPO update at Qwen2.5-Coder 7B with LoRA:
    /// 22% slower, peak allocation 33.6 instead of 60.2 GiB
    /// (`benchmarks/results/model_scale_h200_2026-11-30.json`, `grpo_update`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gradient_checkpointing: bool,
    /// The agents only sample (`eval`, `collab-data`, `optimize`): each checkpoint is loaded
    /// in the compute dtype, frozen, and decoded from its own weights
    /// (`cudarl_train::Qwen2::freeze_for_sampling`), with no AdamW state, no separate reference
    /// (reference samples come from the agent itself, the same weights) and no LoRA adapters
    /// (`lora` is ignored: the checkpoints are merged); `update` is refused. At Qwen2.5-Coder
    /// 7B the trainer then holds each agent's 15.2 GB once, where a trainable agent holds 30.5
    /// GB of float32 weights, 61 GB of AdamW moments and a 15.2 GB decoder copy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sample_only: bool,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The text after which constrained decoding writes a launcher declaration's parameters
/// (`Request::Generate`'s `launchers`): every launcher the harness builds is declared
/// `extern "C" void launch(...)` (docs/architecture.md, "The task language").
pub const LAUNCHER_TRIGGER: &str = "void launch(";

/// A request to the RL trainer (tagged by `op`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Sample one completion per conversation from `agent`, answered by [`Reply::Generated`].
    /// The completions' tokens are kept under their `id` for a later `update`.
    Generate {
        /// Which agent.
        agent: Role,
        /// The conversations (the agent's system prompt is added).
        conversations: Vec<Vec<ChatMessage>>,
        /// Most new tokens per completion.
        max_new_tokens: usize,
        /// Softmax temperature (the update's ratio uses the same scaled distribution).
        temperature: f64,
        /// Nucleus mass.
        top_p: f64,
        /// Sampling seed.
        seed: i64,
        /// Also send each completion as soon as it is finished ([`Reply::Partial`]).
        #[serde(default)]
        stream: bool,
        /// Sample from the agent's frozen reference (its starting checkpoint) instead of the
        /// policy: such completions are not kept (no `id`) and cannot be trained on.
        #[serde(default)]
        reference: bool,
        /// Constrained decoding of each conversation's launcher declaration (empty: none; an
        /// empty string: none for that conversation): once a completion's text first contains
        /// [`LAUNCHER_TRIGGER`], the rest of the declaration through its closing `)` is written
        /// by the sampler, not drawn, and those tokens take no part in an update (their
        /// positions are masked out of the policy-gradient, KL and entropy terms). A
        /// declaration without the trigger is not constrained.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        launchers: Vec<String>,
    },
    /// One update of `agent` on kept completions, answered by [`Reply::Updated`]; every kept
    /// completion of that agent is dropped after.
    Update {
        /// Which agent.
        agent: Role,
        /// The completions and their advantages.
        samples: Vec<Sample>,
    },
    /// Write both agents in the Hugging Face layout to `dir/generator` and `dir/optimizer`
    /// (with LoRA also their adapters, PEFT's layout, to `dir/generator_adapter` and
    /// `dir/optimizer_adapter`), answered by [`Reply::Saved`].
    Save {
        /// Output directory.
        dir: PathBuf,
    },
    /// Write everything continuing the training needs to `dir`: both agents' float32 weights,
    /// AdamW moments and step counts, the critics' (PPO) and the PPO-ptx positions, answered
    /// by [`Reply::Saved`] (docs/architecture.md, "Resuming").
    #[serde(rename = "save_state")]
    SaveState {
        /// Output directory (created).
        dir: PathBuf,
    },
    /// Read what `save_state` wrote for the same job into the running agents, answered by
    /// [`Reply::Saved`].
    #[serde(rename = "load_state")]
    LoadState {
        /// The directory `save_state` wrote.
        dir: PathBuf,
    },
    /// End the process (no reply).
    Quit,
}

/// One kept completion with its advantage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    /// The completion's id from [`Completion::id`].
    pub id: u64,
    /// Its advantage (GRPO: group-normalized turn credit; PPO: whitened GAE).
    pub advantage: f64,
    /// PPO's value target (GAE advantage + the value estimate at generation time).
    #[serde(default, rename = "return", skip_serializing_if = "Option::is_none")]
    pub ret: Option<f64>,
}

/// One sampled completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Completion {
    /// The id to update on (absent for reference samples).
    pub id: Option<u64>,
    /// The decoded completion, without `<|im_end|>`.
    pub text: String,
    /// New tokens (those constrained decoding wrote included).
    pub tokens: usize,
    /// Why it ended.
    pub finish: Finish,
    /// Mean log-probability per drawn token under the sampling distribution (nats; the tokens
    /// constrained decoding wrote left out).
    pub mean_log_prob: f64,
    /// PPO: the value head's estimate of the prompt's state (reward units).
    pub value: Option<f64>,
    /// Tokens of the launcher declaration written by constrained decoding (0: none, and left
    /// out of the JSON; see `Request::Generate`'s `launchers`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub forced_tokens: usize,
}

/// The trainer's GPU memory over one request, from libtorch's caching allocator (bytes; as
/// `torch.cuda.memory_allocated`, `max_memory_allocated` and `max_memory_reserved` after
/// `reset_peak_memory_stats` at the request's start). The process's total (nvidia-smi) is the
/// reserved bytes plus the CUDA context's few hundred MiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuMemory {
    /// Held by tensors when the request ended.
    pub allocated: u64,
    /// The most held by tensors at once during the request.
    pub peak_allocated: u64,
    /// The most the allocator held from the driver during the request (tensors and its cache).
    pub peak_reserved: u64,
}

/// The answer to a `generate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generated {
    /// One completion per conversation, in order.
    pub completions: Vec<Completion>,
    /// Wall seconds of the request.
    pub seconds: f64,
    /// GPU memory during the request (absent on a CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory: Option<GpuMemory>,
}

/// What one `update` did (means over its minibatch steps; `tokens` summed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateStats {
    /// Total loss.
    pub loss: f64,
    /// Clipped-surrogate part.
    pub pg_loss: f64,
    /// k3 KL to the reference, per token (nats).
    pub kl: f64,
    /// Fraction of clipped tokens.
    pub clip_frac: f64,
    /// Mean per-token entropy of the policy (nats) before the update.
    pub entropy: f64,
    /// Tokens trained on.
    pub tokens: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Completions trained on.
    pub samples: usize,
    /// PPO's value loss `0.5 (V - return)^2` (0 with GRPO).
    pub value_loss: f64,
    /// The largest approximate KL (nats per token, `mean(old_logp - logp)`) from the
    /// generating policy to the current one, measured before a minibatch's step.
    pub max_approx_kl: f64,
    /// The largest per-token `|log pi_ref - log pi|` (nats) of the update's minibatch steps:
    /// how far the policy moved from its reference on its most moved token (the k3 term
    /// counts at most [`KL_CLAMP`] per token).
    #[serde(default)]
    pub max_ref_log_ratio: f64,
    /// With `aux_grad_cap`: the mean factor the auxiliary gradient was scaled by over the
    /// minibatch steps (1: never capped; 0 without the cap or auxiliary terms).
    #[serde(default)]
    pub aux_scale: f64,
    /// With `aux_grad_cap`: the largest `||g_aux|| / ||g_pg||` of the minibatch steps, before
    /// scaling (0 without the cap or auxiliary terms).
    #[serde(default)]
    pub max_aux_grad_ratio: f64,
    /// Minibatch steps (over all `epochs` passes) left undone because `max_approx_kl` passed
    /// [`TARGET_KL_MARGIN`] `* target_kl` (0 without one).
    pub skipped_minibatches: usize,
    /// AdamW steps taken (at most `epochs` x minibatches).
    pub steps: usize,
    /// PPO-ptx: mean SFT cross-entropy (nats per assistant token) of the minibatches that
    /// stepped, before their step (0 when off).
    pub ptx_loss: f64,
    /// Wall seconds of the request.
    pub seconds: f64,
    /// GPU memory during the request (absent on a CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory: Option<GpuMemory>,
}

/// One line the RL trainer prints (externally tagged: `{"generated": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Reply {
    /// Both agents are loaded; requests may come.
    Ready,
    /// A streamed completion of the `generate` in progress.
    Partial {
        /// Its conversation's index.
        index: usize,
        /// The decoded completion.
        text: String,
    },
    /// The answer to `generate`.
    Generated(Generated),
    /// The answer to `update`.
    Updated(UpdateStats),
    /// The answer to `save`, `save_state` and `load_state`.
    Saved {
        /// Wall seconds of the request.
        seconds: f64,
    },
    /// The request failed (a bad request, an unknown id, a libtorch error); the process goes
    /// on.
    Error(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_and_refuse_unknown_fields() {
        let r = Request::Update {
            agent: Role::Optimizer,
            samples: vec![Sample {
                id: 3,
                advantage: -0.5,
                ret: None,
            }],
        };
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(
            line,
            r#"{"op":"update","agent":"optimizer","samples":[{"id":3,"advantage":-0.5}]}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r);
        assert!(
            serde_json::from_str::<Request>(r#"{"op": "save", "dir": "d", "now": 1}"#).is_err()
        );
        let st = Request::SaveState { dir: "d".into() };
        let line = serde_json::to_string(&st).unwrap();
        assert_eq!(line, r#"{"op":"save_state","dir":"d"}"#);
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), st);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"load_state","dir":"d"}"#).unwrap(),
            Request::LoadState { dir: "d".into() }
        );
        let g = Reply::Generated(Generated {
            completions: vec![Completion {
                id: Some(0),
                text: "x".into(),
                tokens: 1,
                finish: Finish::Eos,
                mean_log_prob: -0.1,
                value: None,
                forced_tokens: 2,
            }],
            seconds: 0.5,
            gpu_memory: Some(GpuMemory {
                allocated: 1,
                peak_allocated: 3,
                peak_reserved: 4,
            }),
        });
        let line = serde_json::to_string(&g).unwrap();
        assert!(
            line.starts_with(r#"{"generated":{"completions":[{"id":0"#),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<Reply>(&line).unwrap(), g);
        // A completion nothing was written into has no `forced_tokens` in the JSON.
        let free = Completion {
            forced_tokens: 0,
            ..match &g {
                Reply::Generated(x) => x.completions[0].clone(),
                _ => unreachable!(),
            }
        };
        let line = serde_json::to_string(&free).unwrap();
        assert!(!line.contains("forced_tokens"), "{line}");
        assert_eq!(serde_json::from_str::<Completion>(&line).unwrap(), free);
        assert_eq!(serde_json::to_string(&Reply::Ready).unwrap(), r#""ready""#);
        let e = serde_json::from_str::<Reply>(r#"{"updated": {"loss": 1, "lost": 2}}"#);
        assert!(e.is_err(), "an unknown field is refused");
    }
}
