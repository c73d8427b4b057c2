//! Jobs of `cudarl-pipe-train JOB.json` and the events a job prints: one JSON object per line
//! on stdout, [`Event`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::chat::ChatMessage;

/// Where a model runs: `auto` (CUDA when libtorch sees a GPU), `cpu` or `cuda`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// CUDA when libtorch sees a GPU, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// The first CUDA device (an error without one).
    Cuda,
}

impl Device {
    /// `auto`, `cpu` or `cuda`.
    pub fn as_str(self) -> &'static str {
        match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The dtype activations and matrix products are computed in; parameters and AdamW state stay
/// float32 in every case (mixed precision as in `torch.autocast`, Micikevicius et al. 2018).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// bf16 on a CUDA device, float32 on the CPU.
    #[default]
    Auto,
    /// float32 everywhere.
    F32,
    /// bf16 (also on the CPU, where it is slow; for tests).
    Bf16,
}

/// A decode path of the trainer's generation, as `cudarl-pipe bench decode` names it (what
/// each does: `cudarl_train::DecodePath`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum DecodePathName {
    /// A static KV cache with each step replayed as a CUDA graph (the default path).
    Graphs,
    /// The static KV cache, one kernel at a time.
    Static,
    /// The cache grown by concatenation every step.
    Dynamic,
}

impl DecodePathName {
    /// Every path, the default first.
    pub const ALL: [DecodePathName; 3] = [Self::Graphs, Self::Static, Self::Dynamic];

    /// Its name in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Graphs => "graphs",
            Self::Static => "static",
            Self::Dynamic => "dynamic",
        }
    }
}

/// The dtype parameters are kept and updated in during pretraining and SFT, with what each
/// costs in memory per parameter (weights, gradient, AdamW moments, compensation). Measured at
/// Qwen2.5-Coder 1.5B and 7B on an H200: `benchmarks/results/model_scale_h200_2026-11-29.json`
/// (`bf16_weights`) and, for [`Weights::Bf16`], `model_scale_h200_2026-11-30.json`
/// (`bf16_moments`: 7B at 1.23x `transformers`' tokens/s and 73.8 GiB against its 75.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Weights {
    /// float32 master weights and gradients (compute per [`Precision`]), float32 moments: 16
    /// bytes a parameter.
    #[default]
    F32,
    /// bf16 weights and gradients, float32 moments, each update computed in float32 and
    /// rounded to bf16 stochastically (unbiased: an update smaller than half a bf16 ulp still
    /// moves the weight in expectation; Gupta et al. 2015, "Deep Learning with Limited
    /// Numerical Precision"): 12 bytes a parameter.
    Bf16Stochastic,
    /// bf16 weights and gradients, float32 moments, and a bf16 compensation buffer that
    /// carries what each rounded update lost into the next one (Kahan summation, Kahan 1965;
    /// as in Zamirai et al. 2020, "Revisiting BFloat16 Training"): 14 bytes a parameter.
    Bf16Kahan,
    /// bf16 weights, gradients and AdamW moments, each step computed in float32 and the new
    /// weights and moments rounded to bf16 stochastically: 8 bytes a parameter, what
    /// `torch.optim.AdamW` holds for a bf16 model (which rounds its moments to nearest).
    Bf16,
}

impl Weights {
    /// The name in `configs/model/*.toml` and on the command line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Weights::F32 => "f32",
            Weights::Bf16Stochastic => "bf16-stochastic",
            Weights::Bf16Kahan => "bf16-kahan",
            Weights::Bf16 => "bf16",
        }
    }
}

/// Optimization settings of pretraining and SFT (the `[pretrain]` and `[sft]` tables of
/// `configs/model/*.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Passes over the training set.
    pub epochs: usize,
    /// Sequences per step.
    pub batch_size: usize,
    /// Longer sequences are cut to this many tokens.
    pub max_len: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Warmup steps (linear from 0 to `lr`); a fraction of the total when < 1.
    pub warmup: f64,
    /// The cosine decays to `min_lr_ratio * lr` at the last step.
    pub min_lr_ratio: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW betas.
    pub betas: (f64, f64),
    /// Global L2 norm the gradients are clipped to.
    pub grad_clip: f64,
    /// Evaluate every this many steps (and at the end); 0 = only at the end.
    pub eval_every: usize,
    /// Shuffling seed (and libtorch's).
    pub seed: u64,
    /// Stop after this many steps (the schedule spans them); `None` = all epochs.
    pub max_steps: Option<usize>,
    /// Compute dtype.
    pub precision: Precision,
    /// Batch examples of similar length together (`transformers`' `group_by_length`, its
    /// `LengthGroupedSampler`): a batch is right-padded to its longest example, and random
    /// batches of `make run`'s CPU SFT conversations spend 43-45% of their tokens on padding.
    /// The same examples and steps per epoch either way. Off by default: measured on the H100,
    /// the generator's SFT 43.2 s grouped vs 40.7 s not and the optimizer's 64.4 s vs 72.8 s,
    /// about 5% of the two together, and on 2 CPU cores 13.4 s vs 15.2 s and 9.4 s vs 9.7 s;
    /// the SFT draw trained grouped was within the range of the others (hold-out pass 0.309,
    /// compile 0.890; `benchmarks/results/rl_ptx_h100_2026-11-24_coef_sweep.json`).
    pub group_by_length: bool,
    /// Activation checkpointing: keep each layer's input only and run the layers' forward
    /// again during backward (`cudarl_train::Qwen2::checkpointed_backward`), trading one more
    /// forward pass for the activations of all layers but one. Off by default. A Qwen2.5-Coder
    /// 1.5B step of 8 x 1024 tokens on an H200: 28.1 GiB peak instead of 49.8, 17% slower
    /// (`benchmarks/results/model_scale_h200_2026-11-29.json`, `with_gradient_checkpointing`).
    pub gradient_checkpointing: bool,
    /// The parameters' dtype and how AdamW rounds into it ([`Weights`]); with a bf16 kind
    /// the compute is bf16 whatever `precision` says.
    pub weights: Weights,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 2,
            batch_size: 8,
            max_len: 1024,
            lr: 1e-3,
            warmup: 0.05,
            min_lr_ratio: 0.1,
            weight_decay: 0.1,
            betas: (0.9, 0.95),
            grad_clip: 1.0,
            eval_every: 50,
            seed: 0,
            max_steps: None,
            precision: Precision::Auto,
            group_by_length: false,
            gradient_checkpointing: false,
            weights: Weights::F32,
        }
    }
}

/// Architecture of a model the pipeline trains itself (`[model]` of `configs/model/*.toml`);
/// the vocabulary size comes from the tokenizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Model width.
    pub hidden_size: i64,
    /// SwiGLU inner width.
    pub intermediate_size: i64,
    /// Decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads.
    pub num_attention_heads: i64,
    /// Key/value heads.
    pub num_key_value_heads: i64,
    /// Longest sequence.
    pub max_position_embeddings: i64,
    /// LM head tied to the embedding.
    #[serde(default = "yes")]
    pub tie_word_embeddings: bool,
    /// RoPE base.
    #[serde(default = "theta")]
    pub rope_theta: f64,
}

/// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
/// arXiv:2106.09685) as PEFT applies it: each target projection `W` `[out, in]` gains
/// `x A^T B^T * alpha / r` with `A` `[r, in]` (uniform in +-1/sqrt(in), PEFT's
/// `kaiming_uniform_(a=sqrt(5))`) and `B` `[out, r]` (zeros), no dropout, no bias; the base
/// weights are frozen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// Rank `r`.
    pub r: usize,
    /// `alpha`: the update is scaled by `alpha / r`.
    pub alpha: f64,
    /// The adapted projections by module name (`q_proj`, `k_proj`, `v_proj`, `o_proj`,
    /// `gate_proj`, `up_proj`, `down_proj`). Absent: all seven.
    #[serde(default = "all_projections")]
    pub target_modules: Vec<String>,
}

/// Every projection of a Qwen2 layer, the default LoRA targets.
pub const LORA_PROJECTIONS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

fn all_projections() -> Vec<String> {
    LORA_PROJECTIONS.iter().map(|s| s.to_string()).collect()
}

impl LoraConfig {
    /// A rank of 0, a non-positive or non-finite alpha, no targets or an unknown one, named.
    ///
    /// # Errors
    /// The message names the field.
    pub fn check(&self) -> Result<(), String> {
        if self.r == 0 {
            return Err("lora.r must be at least 1".into());
        }
        if !(self.alpha > 0.0 && self.alpha.is_finite()) {
            return Err("lora.alpha must be a positive number".into());
        }
        if self.target_modules.is_empty() {
            return Err("lora.target_modules is empty".into());
        }
        if let Some(t) = self
            .target_modules
            .iter()
            .find(|t| !LORA_PROJECTIONS.contains(&t.as_str()))
        {
            return Err(format!(
                "lora.target_modules: `{t}` is not one of {}",
                LORA_PROJECTIONS.join(", ")
            ));
        }
        Ok(())
    }
}

/// A fresh model for [`Job::Sft`]: an architecture and its embedding rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomInit {
    /// Architecture.
    pub model: ModelSpec,
    /// Embedding and LM-head rows: at least the tokenizer's vocabulary (a published
    /// configuration's, e.g. Qwen2.5's 151,936, above a smaller tokenizer's: the rows cost what
    /// they cost in the published model).
    pub vocab_size: usize,
}

fn yes() -> bool {
    true
}

fn theta() -> f64 {
    10_000.0
}

/// One pretraining document (a line of a `pretrain` job's corpus): a JSON string (code, a
/// problem's source) or a JSON list of chat messages, tokenized exactly as SFT and RL render a
/// conversation (the ChatML template), so the text a model is pretrained on and the prompts it
/// is later asked share their tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Document {
    /// Plain text.
    Text(String),
    /// A conversation.
    Chat(Vec<ChatMessage>),
}

/// A job of `cudarl-pipe-train JOB.json` (tagged by `kind`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Job {
    /// Train a byte-level BPE on `corpus` (JSON lines of strings): `out/tokenizer.json`.
    Tokenizer {
        /// JSON lines, one string each.
        corpus: PathBuf,
        /// Vocabulary size including special tokens.
        vocab_size: usize,
        /// Output directory.
        out: PathBuf,
    },
    /// Causal-LM pretraining of a fresh model on `corpus` (JSON lines, each a [`Document`],
    /// each followed by `<|endoftext|>`, all tokens trained): `out/model/` in the Hugging Face
    /// layout.
    Pretrain {
        /// `tokenizer.json`.
        tokenizer: PathBuf,
        /// Architecture.
        model: ModelSpec,
        /// JSON lines, one [`Document`] each.
        corpus: PathBuf,
        /// Optimization.
        train: TrainConfig,
        /// Where it runs.
        device: Device,
        /// Output directory.
        out: PathBuf,
    },
    /// Samples completions of chat prompts (JSON lines of message lists; each rendered with
    /// the generation prompt) from `model`: `n` per prompt, until `<|im_end|>` or
    /// `max_new_tokens`; writes `out` (JSON lines, each a [`SampleLine`]).
    Sample {
        /// Model directory (with `tokenizer.json`).
        model: PathBuf,
        /// JSON lines of message lists.
        prompts: PathBuf,
        /// Samples per prompt.
        n: usize,
        /// Most new tokens per sample.
        max_new_tokens: usize,
        /// Softmax temperature (0 = greedy).
        temperature: f64,
        /// Nucleus mass.
        top_p: f64,
        /// Sampling seed.
        seed: i64,
        /// Where it runs.
        device: Device,
        /// Output JSON lines file.
        out: PathBuf,
    },
    /// Supervised fine-tuning of `base` (a Hugging Face directory with `tokenizer.json`) on
    /// chat examples (JSON lines of message lists), loss on assistant tokens only:
    /// `out/model/`.
    Sft {
        /// Base model directory; with `init`, a directory holding only the tokenizer.
        base: PathBuf,
        /// Start from a fresh seeded initialization (`train.seed`) of this architecture in
        /// place of `base`'s weights. Absent: `base`'s weights.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        init: Option<RandomInit>,
        /// Train LoRA adapters of the frozen base instead of every weight: `out/model/` holds
        /// the base with the adapters merged, `out/adapter/` the adapters in PEFT's layout
        /// (`adapter_model.safetensors`, `adapter_config.json`). Absent: full fine-tuning.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lora: Option<LoraConfig>,
        /// JSON lines of message lists.
        data: PathBuf,
        /// Held-out examples for the evaluation loss (same format).
        eval_data: PathBuf,
        /// Optimization.
        train: TrainConfig,
        /// Where it runs.
        device: Device,
        /// Output directory.
        out: PathBuf,
    },
    /// The RL trainer: holds both agents and answers [`crate::Request`]s on stdin.
    RlServe(crate::rl::RlServe),
    /// Throughput on random tokens: `steps` training steps (forward, backward, clipping,
    /// AdamW; after `warmup_steps` untimed ones) of a fresh model at `batch_size x seq_len`,
    /// then greedy generation of `gen_tokens` tokens after a `prompt_len`-token prompt at each
    /// batch size of `gen_batches` (KV cache, no early stop). Prints one `done` event:
    /// `train_tokens_per_s`, `generate` (per batch size: `tokens_per_s` = new tokens of all
    /// rows per second), `peak_memory_bytes` on CUDA.
    Bench {
        /// Architecture.
        model: ModelSpec,
        /// Vocabulary size.
        vocab_size: i64,
        /// Sequences per training step.
        batch_size: usize,
        /// Tokens per sequence.
        seq_len: usize,
        /// Timed training steps.
        steps: usize,
        /// Untimed training steps first (allocator and kernel warm-up).
        warmup_steps: usize,
        /// Batch sizes of the generation measurement.
        gen_batches: Vec<usize>,
        /// Prompt tokens per row.
        prompt_len: usize,
        /// New tokens per row.
        gen_tokens: usize,
        /// Compute dtype.
        #[serde(default)]
        precision: Precision,
        /// Activation checkpointing ([`TrainConfig::gradient_checkpointing`]).
        #[serde(default)]
        gradient_checkpointing: bool,
        /// The parameters' dtype and rounding ([`TrainConfig::weights`]).
        #[serde(default)]
        weights: Weights,
        /// Train LoRA adapters of a frozen base in the compute dtype instead of every weight
        /// (merged before the generation measurement). Absent: full fine-tuning.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lora: Option<LoraConfig>,
        /// Where it runs.
        device: Device,
    },
    /// Decode throughput on random weights and tokens (`cudarl-pipe bench decode`): a fresh
    /// model in the precision's compute dtype, sampling from its own weights (as a `sample`
    /// job holds a checkpoint), saved to `save_to` in the Hugging Face layout (so
    /// `python/bench_decode.py` decodes the same weights), then at each batch size of
    /// `batches` and for each decode path of `paths`,
    /// greedy generation of `gen_tokens` tokens after a `prompt_len`-token prompt (no early
    /// stop): one untimed run, then `reps` timed runs of the prompt's forward pass alone
    /// (one new token) and of the whole generation. Prints one `done` event with one record per
    /// batch size and path.
    BenchDecode {
        /// Architecture.
        model: ModelSpec,
        /// Vocabulary size.
        vocab_size: i64,
        /// Batch sizes.
        batches: Vec<usize>,
        /// Prompt tokens per row.
        prompt_len: usize,
        /// New tokens per row.
        gen_tokens: usize,
        /// Timed repetitions (the median is reported).
        reps: usize,
        /// The decode paths measured, in order (absent or empty: every path).
        #[serde(default)]
        paths: Vec<DecodePathName>,
        /// Compute dtype.
        #[serde(default)]
        precision: Precision,
        /// Where it runs.
        device: Device,
        /// Where the model is saved.
        save_to: PathBuf,
    },
}

/// Metrics of one optimizer step of pretraining or SFT.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepMetrics {
    /// 1-based step.
    pub step: usize,
    /// 0-based epoch.
    pub epoch: usize,
    /// Mean cross-entropy (nats per trained token) of this step's batch.
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Gradient L2 norm before clipping.
    pub grad_norm: f64,
    /// Trained tokens in the batch.
    pub tokens: usize,
    /// All tokens (trained or not) processed per second in this step.
    pub tokens_per_s: f64,
    /// Mean loss on the evaluation set, at evaluation steps.
    pub eval_loss: Option<f64>,
}

/// One line a job prints on stdout (tagged by `event`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// An optimizer step finished.
    Step(StepMetrics),
    /// The job finished: a summary for the log (device, sizes, counts; the `bench` job's
    /// measurements), keys by job kind.
    Done(BTreeMap<String, serde_json::Value>),
}

/// Why a sampled sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Finish {
    /// Produced an end-of-sequence token (kept as the last token).
    Eos,
    /// The caller's stop check fired (a stop string appeared).
    Stop,
    /// Reached `max_new_tokens`.
    Length,
}

impl Finish {
    /// `Eos`, `Stop` or `Length`.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Eos => "Eos",
            Finish::Stop => "Stop",
            Finish::Length => "Length",
        }
    }
}

/// One line of a `sample` job's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleLine {
    /// 0-based line of the prompts file.
    pub prompt: usize,
    /// 0-based sample of that prompt.
    pub sample: usize,
    /// The decoded completion, without `<|im_end|>`.
    pub text: String,
    /// New tokens.
    pub tokens: usize,
    /// Why it ended.
    pub finish: Finish,
    /// Mean log-probability per new token under the sampling distribution (nats).
    pub mean_log_prob: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_unknown_step_fields_are_refused() {
        let step = Event::Step(StepMetrics {
            step: 1,
            epoch: 0,
            loss: 2.5,
            lr: 1e-3,
            grad_norm: 0.5,
            tokens: 10,
            tokens_per_s: 100.0,
            eval_loss: None,
        });
        let line = serde_json::to_string(&step).unwrap();
        assert!(line.starts_with(r#"{"event":"step","step":1"#), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), step);
        let done: Event = serde_json::from_str(r#"{"event": "done", "steps": 3}"#).unwrap();
        assert_eq!(
            done,
            Event::Done(BTreeMap::from([("steps".into(), 3.into())]))
        );
        let bad = r#"{"event": "step", "step": 1, "epoch": 0, "loss": 1, "lr": 1, "grad_norm": 1,
            "tokens": 1, "tokens_per_s": 1, "eval_loss": null, "lossy": 2}"#;
        assert!(serde_json::from_str::<Event>(bad).is_err());
    }

    #[test]
    fn a_job_names_its_kind_and_refuses_unknown_keys() {
        let j: Job = serde_json::from_str(
            r#"{"kind": "tokenizer", "corpus": "c.jsonl", "vocab_size": 512, "out": "o"}"#,
        )
        .unwrap();
        assert!(matches!(
            j,
            Job::Tokenizer {
                vocab_size: 512,
                ..
            }
        ));
        let e = serde_json::from_str::<Job>(
            r#"{"kind": "tokenizer", "corpus": "c", "vocab_size": 1, "out": "o", "x": 1}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown field `x`"), "{e}");
        let e = serde_json::from_str::<TrainConfig>(r#"{"learning_rate": 1}"#).unwrap_err();
        assert!(
            e.to_string().contains("unknown field `learning_rate`"),
            "{e}"
        );
    }
}
