//! Jobs of the trainer process (`cudarl-pipe-train JOB.json`): the pipeline's `tokenizer`,
//! `pretrain` and `sft-train` stages write a job, run the process (libtorch stays out of the
//! `cudarl-pipe` binary, and a crash or an out-of-memory kill ends the job, not the pipeline),
//! and ingest what it wrote into the store.
//!
//! Output of every job: files under `out` and one JSON line per event on stdout
//! (`{"event": "step", ...StepMetrics}`, `{"event": "done", ...}`).

use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tch::Device;

use crate::tokenizer::{ChatTokenizer, Message, train_bpe};
use crate::train::{Example, TrainConfig, train_lm};
use crate::{ModelError, Qwen2, Qwen2Config};

/// Architecture of a model the pipeline trains itself (`configs/model/*.toml`); the
/// vocabulary size comes from the tokenizer.
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

fn yes() -> bool {
    true
}
fn theta() -> f64 {
    10_000.0
}

/// A job.
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
    /// Causal-LM pretraining of a fresh model on `corpus` (JSON lines of strings, each
    /// followed by `<|endoftext|>`, all tokens trained): `out/model/` in the Hugging Face layout.
    Pretrain {
        /// `tokenizer.json`.
        tokenizer: PathBuf,
        /// Architecture.
        model: ModelSpec,
        /// JSON lines, one string each.
        corpus: PathBuf,
        /// Optimization.
        train: TrainConfig,
        /// `auto` (CUDA when libtorch sees a GPU), `cpu` or `cuda`.
        device: String,
        /// Output directory.
        out: PathBuf,
    },
    /// Samples completions of chat prompts (JSON lines of message lists; each rendered with
    /// the generation prompt) from `model`: `n` per prompt, until `<|im_end|>` or
    /// `max_new_tokens`; writes `out` (JSON lines: prompt, sample, text, tokens, finish, mean
    /// log-probability).
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
        /// `auto`, `cpu` or `cuda`.
        device: String,
        /// Output JSON lines file.
        out: PathBuf,
    },
    /// Supervised fine-tuning of `base` (a Hugging Face directory with `tokenizer.json`) on
    /// chat examples (JSON lines of message lists), loss on assistant tokens only:
    /// `out/model/`.
    Sft {
        /// Base model directory.
        base: PathBuf,
        /// JSON lines: `[{"role": ..., "content": ...}, ...]`.
        data: PathBuf,
        /// Held-out examples for the evaluation loss (same format).
        eval_data: PathBuf,
        /// Optimization.
        train: TrainConfig,
        /// `auto`, `cpu` or `cuda`.
        device: String,
        /// Output directory.
        out: PathBuf,
    },
}

/// The device for `auto`/`cpu`/`cuda`.
///
/// # Errors
/// `cuda` without a GPU, or another name.
pub fn device(name: &str) -> Result<Device, ModelError> {
    match name {
        "cpu" => Ok(Device::Cpu),
        "auto" => Ok(Device::cuda_if_available()),
        "cuda" if tch::Cuda::is_available() => Ok(Device::Cuda(0)),
        "cuda" => Err(ModelError::Generate(
            "device = \"cuda\" but libtorch sees no GPU".into(),
        )),
        d => Err(ModelError::Generate(format!(
            "device `{d}`: use auto, cpu or cuda"
        ))),
    }
}

fn read_lines<T: serde::de::DeserializeOwned>(path: &PathBuf) -> Result<Vec<T>, ModelError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| ModelError::Io(path.display().to_string(), e))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| {
                ModelError::Generate(format!("{} line {}: {e}", path.display(), i + 1))
            })
        })
        .collect()
}

fn emit(v: serde_json::Value) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

fn step_event(m: &crate::train::StepMetrics) {
    let mut v = serde_json::to_value(m).expect("metrics serialize");
    v["event"] = "step".into();
    emit(v);
}

/// Runs `job`.
///
/// # Errors
/// Bad inputs (named), libtorch errors.
pub fn run(job: &Job) -> Result<(), ModelError> {
    match job {
        Job::Tokenizer {
            corpus,
            vocab_size,
            out,
        } => {
            let texts: Vec<String> = read_lines(corpus)?;
            std::fs::create_dir_all(out)
                .map_err(|e| ModelError::Io(out.display().to_string(), e))?;
            train_bpe(&texts, *vocab_size, &out.join("tokenizer.json"))?;
            let t = ChatTokenizer::load(&out.join("tokenizer.json"))?;
            emit(
                serde_json::json!({"event": "done", "vocab_size": t.vocab_size(), "texts": texts.len()}),
            );
        }
        Job::Pretrain {
            tokenizer,
            model,
            corpus,
            train,
            device: dev,
            out,
        } => {
            let dev = device(dev)?;
            let tok = ChatTokenizer::load(tokenizer)?;
            let eos = tok.eos.ok_or_else(|| {
                ModelError::Tokenizer(format!("{}: no <|endoftext|> token", tokenizer.display()))
            })?;
            let texts: Vec<String> = read_lines(corpus)?;
            // Documents joined with <|endoftext|>, cut into max_len windows.
            let mut stream = Vec::new();
            for t in &texts {
                stream.extend(tok.encode(t)?);
                stream.push(eos);
            }
            let w = train.max_len.max(2);
            let windows: Vec<Example> = stream
                .chunks(w)
                .filter(|c| c.len() >= 2)
                .map(|c| Example {
                    ids: c.to_vec(),
                    mask: vec![true; c.len()],
                })
                .collect();
            // Every 20th window is held out for the evaluation loss.
            let (ev, tr): (Vec<_>, Vec<_>) = windows
                .into_iter()
                .enumerate()
                .partition(|(i, _)| i % 20 == 19);
            let tr: Vec<Example> = tr.into_iter().map(|(_, e)| e).collect();
            let ev: Vec<Example> = ev.into_iter().map(|(_, e)| e).collect();
            tch::manual_seed(train.seed as i64);
            let mut cfg = Qwen2Config::new(
                tok.vocab_size() as i64,
                model.hidden_size,
                model.intermediate_size,
                model.num_hidden_layers,
                model.num_attention_heads,
                model.num_key_value_heads,
                model.max_position_embeddings,
                model.tie_word_embeddings,
            );
            cfg.rope_theta = Some(model.rope_theta);
            cfg.eos_token_id = Some(tok.im_end.into());
            let mut m = Qwen2::new(cfg, dev)?;
            let steps = train_lm(&mut m, &tr, &ev, train, &mut step_event)?;
            save(&m, tokenizer, out)?;
            emit(
                serde_json::json!({"event": "done", "device": format!("{dev:?}"),
                "parameters": m.config.num_parameters(), "train_windows": tr.len(),
                "eval_windows": ev.len(), "steps": steps.len()}),
            );
        }
        Job::Sample {
            model,
            prompts,
            n,
            max_new_tokens,
            temperature,
            top_p,
            seed,
            device: dev,
            out,
        } => {
            let dev = device(dev)?;
            let tok = ChatTokenizer::load(&model.join("tokenizer.json"))?;
            let m = Qwen2::load(model, dev, tch::Kind::Float)?;
            let rows: Vec<Vec<Message>> = read_lines(prompts)?;
            let mut lines = Vec::new();
            let params = crate::SampleParams {
                max_new_tokens: *max_new_tokens,
                temperature: *temperature,
                top_p: *top_p,
                seed: Some(*seed),
                use_cache: true,
            };
            let mut eos = vec![tok.im_end];
            eos.extend(tok.eos);
            let t0 = std::time::Instant::now();
            let mut new_tokens = 0usize;
            for (pi, msgs) in rows.iter().enumerate() {
                let (ids, _) = tok.render(msgs, true)?;
                let batch = vec![ids; (*n).max(1)];
                let g = crate::generate(&m, &batch, &params, &eos, &mut |_, _| false)?;
                for (si, toks) in g.tokens.iter().enumerate() {
                    new_tokens += toks.len();
                    let lp = &g.log_probs[si];
                    lines.push(serde_json::json!({
                        "prompt": pi, "sample": si, "text": tok.decode(toks)?,
                        "tokens": toks.len(), "finish": format!("{:?}", g.finish[si]),
                        "mean_log_prob": lp.iter().map(|x| f64::from(*x)).sum::<f64>() / lp.len().max(1) as f64,
                    }).to_string());
                }
            }
            std::fs::write(out, lines.join("\n") + "\n")
                .map_err(|e| ModelError::Io(out.display().to_string(), e))?;
            let secs = t0.elapsed().as_secs_f64();
            emit(
                serde_json::json!({"event": "done", "device": format!("{dev:?}"),
                "samples": lines.len(), "new_tokens": new_tokens,
                "tokens_per_s": new_tokens as f64 / secs.max(1e-9)}),
            );
        }
        Job::Sft {
            base,
            data,
            eval_data,
            train,
            device: dev,
            out,
        } => {
            let dev = device(dev)?;
            let tp = base.join("tokenizer.json");
            let tok = ChatTokenizer::load(&tp)?;
            let mut m = Qwen2::load(base, dev, tch::Kind::Float)?;
            let enc = |rows: Vec<Vec<Message>>| -> Result<Vec<Example>, ModelError> {
                rows.iter()
                    .map(|msgs| {
                        let (ids, mask) = tok.render(msgs, false)?;
                        Ok(Example { ids, mask })
                    })
                    .collect()
            };
            let tr = enc(read_lines(data)?)?;
            let ev = enc(read_lines(eval_data)?)?;
            let steps = train_lm(&mut m, &tr, &ev, train, &mut step_event)?;
            save(&m, &tp, out)?;
            emit(
                serde_json::json!({"event": "done", "device": format!("{dev:?}"),
                "train_examples": tr.len(), "eval_examples": ev.len(), "steps": steps.len()}),
            );
        }
    }
    Ok(())
}

/// `out/model/`: the model in the Hugging Face layout with its `tokenizer.json`.
fn save(m: &Qwen2, tokenizer: &PathBuf, out: &std::path::Path) -> Result<(), ModelError> {
    let dir = out.join("model");
    m.save(&dir)?;
    std::fs::copy(tokenizer, dir.join("tokenizer.json"))
        .map_err(|e| ModelError::Io(tokenizer.display().to_string(), e))?;
    Ok(())
}
