//! Jobs of the trainer process (`cudarl-pipe-train JOB.json`): the pipeline's `tokenizer`,
//! `pretrain` and `sft-train` stages write a job, run the process (libtorch stays out of the
//! `cudarl-pipe` binary, and a crash or an out-of-memory kill ends the job, not the pipeline),
//! and ingest what it wrote into the store.
//!
//! Output of every job: files under `out` and one [`Event`] per line on stdout (the job types
//! and events are `cudarl_protocol`'s).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use tch::{Device, Tensor};

use crate::tokenizer::{ChatMessage, ChatTokenizer, train_bpe};
use crate::train::{ComputeKind, Example, TrainConfig, train_lm};
use crate::{ModelError, Qwen2, Qwen2Config};

/// The Qwen2 config of a [`ModelSpec`].
pub trait ModelConfig {
    /// The Qwen2 config of this architecture with `vocab_size` tokens.
    fn config(&self, vocab_size: i64) -> Qwen2Config;
}

impl ModelConfig for ModelSpec {
    fn config(&self, vocab_size: i64) -> Qwen2Config {
        let mut cfg = Qwen2Config::new(
            vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.max_position_embeddings,
            self.tie_word_embeddings,
        );
        cfg.rope_theta = Some(self.rope_theta);
        cfg
    }
}

pub use cudarl_protocol::{Document, Event, Job, ModelSpec};
use cudarl_protocol::{LoraConfig, RandomInit};

/// Most rows of one `sample` job's generate call (prompts x samples); bounds the KV cache
/// (`small`, 2k tokens a row: 256 rows hold about 2 GiB of bf16 keys and values).
pub const SAMPLE_BATCH: usize = 256;

/// The libtorch device of a job's [`cudarl_protocol::Device`].
///
/// # Errors
/// `cuda` without a GPU.
pub fn device(d: cudarl_protocol::Device) -> Result<Device, ModelError> {
    match d {
        cudarl_protocol::Device::Cpu => Ok(Device::Cpu),
        cudarl_protocol::Device::Auto => Ok(Device::cuda_if_available()),
        cudarl_protocol::Device::Cuda if tch::Cuda::is_available() => Ok(Device::Cuda(0)),
        cudarl_protocol::Device::Cuda => Err(ModelError::Generate(
            "device = \"cuda\" but libtorch sees no GPU".into(),
        )),
    }
}

/// JSON values, one per non-empty line of `path`.
///
/// # Errors
/// I/O (the path named) or a line that is not a `T` (path and 1-based line named).
pub(crate) fn read_lines<T: serde::de::DeserializeOwned>(
    path: &PathBuf,
) -> Result<Vec<T>, ModelError> {
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

fn emit(e: &Event) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{}", serde_json::to_string(e).expect("event serializes"));
    let _ = o.flush();
}

fn step_event(m: &crate::train::StepMetrics) {
    emit(&Event::Step(m.clone()));
}

/// The `done` event of a job: its summary, key by key.
fn done(v: serde_json::Value) {
    let summary: BTreeMap<String, serde_json::Value> = match v {
        serde_json::Value::Object(m) => m.into_iter().collect(),
        _ => BTreeMap::new(),
    };
    emit(&Event::Done(summary));
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
        } => train_tokenizer(corpus, *vocab_size, out)?,
        Job::Pretrain {
            tokenizer,
            model,
            corpus,
            train,
            device: dev,
            out,
        } => pretrain((tokenizer, model), corpus, train, device(*dev)?, out)?,
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
            let params = sample_params(*max_new_tokens, *temperature, *top_p, *seed);
            sample(model, (prompts, *n), &params, device(*dev)?, out)?
        }
        Job::Sft {
            base,
            init,
            lora,
            data,
            eval_data,
            train,
            device: dev,
            out,
        } => sft(
            (base, init.as_ref()),
            lora.as_ref(),
            (data, eval_data),
            train,
            device(*dev)?,
            out,
        )?,
        Job::RlServe(j) => crate::rl_serve::serve(j)?,
        Job::Bench {
            model,
            vocab_size,
            batch_size,
            seq_len,
            steps,
            warmup_steps,
            gen_batches,
            prompt_len,
            gen_tokens,
            precision,
            gradient_checkpointing,
            weights,
            lora,
            device: dev,
        } => done(bench(
            model,
            *vocab_size,
            (*batch_size, *seq_len, *steps, *warmup_steps),
            gen_batches,
            (*prompt_len, *gen_tokens),
            (*precision, *gradient_checkpointing, *weights, lora.as_ref()),
            device(*dev)?,
        )?),
        Job::BenchDecode {
            model,
            vocab_size,
            batches,
            prompt_len,
            gen_tokens,
            reps,
            paths,
            precision,
            device: dev,
            save_to,
        } => done(crate::bench_decode::bench_decode(
            model,
            *vocab_size,
            (batches, paths),
            (*prompt_len, *gen_tokens, *reps),
            *precision,
            device(*dev)?,
            save_to,
        )?),
    }
    Ok(())
}

/// The `tokenizer` job (see [`Job::Tokenizer`]): a BPE of `vocab_size` tokens trained on
/// `corpus`, written to `out/tokenizer.json`.
///
/// # Errors
/// Unreadable corpus, I/O, tokenizer training.
fn train_tokenizer(corpus: &PathBuf, vocab_size: usize, out: &Path) -> Result<(), ModelError> {
    let texts: Vec<String> = read_lines(corpus)?;
    std::fs::create_dir_all(out).map_err(|e| ModelError::Io(out.display().to_string(), e))?;
    train_bpe(&texts, vocab_size, &out.join("tokenizer.json"))?;
    let t = ChatTokenizer::load(&out.join("tokenizer.json"))?;
    done(serde_json::json!({"vocab_size": t.vocab_size(), "texts": texts.len()}));
    Ok(())
}

/// The `pretrain` job (see [`Job::Pretrain`]): a fresh `model` with the `tokenizer` file's
/// vocabulary trained on `corpus` on `dev`, saved under `out`.
///
/// # Errors
/// Bad inputs (named), libtorch errors.
fn pretrain(
    (tokenizer, model): (&PathBuf, &ModelSpec),
    corpus: &PathBuf,
    train: &TrainConfig,
    dev: Device,
    out: &Path,
) -> Result<(), ModelError> {
    let tok = ChatTokenizer::load(tokenizer)?;
    let eos = tok.eos.ok_or_else(|| {
        ModelError::Tokenizer(format!("{}: no <|endoftext|> token", tokenizer.display()))
    })?;
    let docs: Vec<Document> = read_lines(corpus)?;
    let (tr, ev) = lm_windows(&tok, &docs, eos, train.max_len)?;
    tch::manual_seed(train.seed as i64);
    let mut cfg = model.config(tok.vocab_size() as i64);
    cfg.eos_token_id = Some(tok.im_end.into());
    let mut m = Qwen2::new(cfg, dev)?;
    m.set_compute_kind(train.precision.compute_kind(dev));
    let steps = train_lm(&mut m, &tr, &ev, train, &mut step_event)?;
    save(&m, (&tok, tokenizer), out)?;
    done(serde_json::json!({"device": format!("{dev:?}"),
        "compute_dtype": format!("{:?}", m.compute_kind()),
        "parameters": m.config.num_parameters(), "train_windows": tr.len(),
        "eval_windows": ev.len(), "steps": steps.len()}));
    Ok(())
}

/// The `sample` job (see [`Job::Sample`]): `n` completions of each prompt of the `prompts`
/// file from the model directory `model` with `params` (the seed of the first batch; each
/// later batch of [`SAMPLE_BATCH`] rows adds its index), written to `out` as JSON lines.
///
/// # Errors
/// Bad inputs (named), libtorch errors, I/O.
fn sample(
    model: &Path,
    (prompts, n): (&PathBuf, usize),
    params: &crate::SampleParams,
    dev: Device,
    out: &Path,
) -> Result<(), ModelError> {
    let tok = ChatTokenizer::load_dir(model)?;
    // Loaded in the compute dtype and decoded from its own weights (no float32 master,
    // no decoder copy).
    let kind = crate::train::Precision::Auto.compute_kind(dev);
    let m = Qwen2::load_for_sampling(model, dev, kind.unwrap_or(tch::Kind::Float))?;
    let rows: Vec<Vec<ChatMessage>> = read_lines(prompts)?;
    let mut lines = Vec::new();
    let mut eos = vec![tok.im_end];
    eos.extend(tok.eos);
    let t0 = std::time::Instant::now();
    let mut new_tokens = 0usize;
    // Every prompt's `n` samples in as few batches as fit (`SAMPLE_BATCH` rows): decoding
    // costs per step, nearly whatever the batch, so one batch of 16 x 8 rows takes about
    // the time of one prompt's 8 (16 per-prompt batches took 140 s of sft-eval's 141 s
    // on the H100, 2026-11-23).
    let mut all: Vec<(usize, usize, Vec<i64>)> = Vec::new();
    for (pi, msgs) in rows.iter().enumerate() {
        let (ids, _) = tok.render(msgs, true)?;
        for si in 0..n.max(1) {
            all.push((pi, si, ids.clone()));
        }
    }
    for (ci, chunk) in all.chunks(SAMPLE_BATCH).enumerate() {
        let params = crate::SampleParams {
            seed: params.seed.map(|s| s + ci as i64),
            ..params.clone()
        };
        new_tokens += sample_batch((&m, dev), &tok, chunk, (&params, &eos), &mut lines)?;
    }
    std::fs::write(out, lines.join("\n") + "\n")
        .map_err(|e| ModelError::Io(out.display().to_string(), e))?;
    let secs = t0.elapsed().as_secs_f64();
    done(serde_json::json!({"device": format!("{dev:?}"),
        "samples": lines.len(), "new_tokens": new_tokens,
        "tokens_per_s": new_tokens as f64 / secs.max(1e-9)}));
    Ok(())
}

/// Sampling settings with the KV cache: at most `max_new_tokens` new tokens a row at
/// `temperature` and nucleus mass `top_p`, seeded with `seed` (a `sample` job's first batch, a
/// trainer's `generate` request).
pub(crate) fn sample_params(
    max_new_tokens: usize,
    temperature: f64,
    top_p: f64,
    seed: i64,
) -> crate::SampleParams {
    crate::SampleParams {
        max_new_tokens,
        temperature,
        top_p,
        seed: Some(seed),
        use_cache: true,
        ..Default::default()
    }
}

/// The `sft-train` job (see [`Job::Sft`]): `base` (or a fresh `init` of it) fine-tuned on the
/// `data` conversations, fully or with `lora` adapters, saved under `out`.
///
/// # Errors
/// Bad inputs (named), libtorch errors.
fn sft(
    (base, init): (&PathBuf, Option<&RandomInit>),
    lora: Option<&LoraConfig>,
    (data, eval_data): (&PathBuf, &PathBuf),
    train: &TrainConfig,
    dev: Device,
    out: &Path,
) -> Result<(), ModelError> {
    let tok = ChatTokenizer::load_dir(base)?;
    let mut m = sft_model(base, init, &tok, train, dev)?;
    with_lora(&mut m, train.precision.compute_kind(dev), lora)?;
    let enc = |rows: Vec<Vec<ChatMessage>>| crate::train::chat_examples(&tok, &rows);
    let tr = enc(read_lines(data)?)?;
    let ev = enc(read_lines(eval_data)?)?;
    let steps = train_lm(&mut m, &tr, &ev, train, &mut step_event)?;
    if let Some(l) = lora {
        m.save_lora(&out.join("adapter"), l)?;
        // Merged in float32, saved as full fine-tuning saves.
        m.set_kind(tch::Kind::Float);
        m.merge_lora()?;
    }
    save(&m, (&tok, &base.join("tokenizer.json")), out)?;
    done(serde_json::json!({"device": format!("{dev:?}"),
        "compute_dtype": format!("{:?}", m.compute_kind()),
        "train_examples": tr.len(), "eval_examples": ev.len(), "steps": steps.len()}));
    Ok(())
}

/// The model an `sft-train` job starts from: `base`'s weights in float32, or with `init` a
/// fresh initialization of that architecture seeded with `train.seed`.
///
/// # Errors
/// `init`'s vocabulary is smaller than `tok`'s; loading failed.
fn sft_model(
    base: &Path,
    init: Option<&RandomInit>,
    tok: &ChatTokenizer,
    train: &TrainConfig,
    dev: Device,
) -> Result<Qwen2, ModelError> {
    Ok(match init {
        None => Qwen2::load(base, dev, tch::Kind::Float)?,
        Some(init) => {
            if init.vocab_size < tok.vocab_size() {
                return Err(ModelError::Config {
                    file: base.join("tokenizer.json").display().to_string(),
                    message: format!(
                        "the model's vocab_size {} is below this tokenizer's {}",
                        init.vocab_size,
                        tok.vocab_size()
                    ),
                });
            }
            tch::manual_seed(train.seed as i64);
            let mut cfg = init.model.config(init.vocab_size as i64);
            cfg.eos_token_id = Some(tok.im_end.into());
            Qwen2::new(cfg, dev)?
        }
    })
}

/// Documents joined with `<|endoftext|>` (`eos`) and cut into windows of `max_len` tokens (at
/// least 2); every 20th window is held out for the evaluation loss: (train, eval).
///
/// # Errors
/// A document the tokenizer cannot encode.
fn lm_windows(
    tok: &ChatTokenizer,
    docs: &[Document],
    eos: i64,
    max_len: usize,
) -> Result<(Vec<Example>, Vec<Example>), ModelError> {
    let mut stream = Vec::new();
    for d in docs {
        match d {
            Document::Text(t) => stream.extend(tok.encode(t)?),
            Document::Chat(m) => stream.extend(tok.render(m, false)?.0),
        }
        stream.push(eos);
    }
    let windows = stream
        .chunks(max_len.max(2))
        .filter(|c| c.len() >= 2)
        .map(|c| Example {
            ids: c.to_vec(),
            mask: vec![true; c.len()],
        });
    let (ev, tr): (Vec<_>, Vec<_>) = windows.enumerate().partition(|(i, _)| i % 20 == 19);
    Ok((
        tr.into_iter().map(|(_, e)| e).collect(),
        ev.into_iter().map(|(_, e)| e).collect(),
    ))
}

/// Samples one batch of prompts (`chunk`: prompt index, sample index, prompt tokens) with
/// `params` until an `eos` token, under a share of the GPU of `dev`; appends one
/// [`cudarl_protocol::SampleLine`] JSON line per row to `lines` and returns the new tokens.
///
/// # Errors
/// Generation or decoding failed.
fn sample_batch(
    (m, dev): (&Qwen2, Device),
    tok: &ChatTokenizer,
    chunk: &[(usize, usize, Vec<i64>)],
    (params, eos): (&crate::SampleParams, &[i64]),
    lines: &mut Vec<String>,
) -> Result<usize, ModelError> {
    let batch: Vec<Vec<i64>> = chunk.iter().map(|(_, _, ids)| ids.clone()).collect();
    let gpu = crate::GpuShare::hold(dev)?;
    let g = crate::generate(m, &batch, params, eos, &mut |_, _| false)?;
    drop(gpu);
    let mut new_tokens = 0;
    for (k, toks) in g.tokens.iter().enumerate() {
        let (pi, si, _) = chunk[k];
        new_tokens += toks.len();
        let lp = &g.log_probs[k];
        let line = cudarl_protocol::SampleLine {
            prompt: pi,
            sample: si,
            text: tok.decode(toks)?,
            tokens: toks.len(),
            finish: g.finish[k],
            mean_log_prob: lp.iter().map(|x| f64::from(*x)).sum::<f64>() / lp.len().max(1) as f64,
        };
        lines.push(serde_json::to_string(&line).expect("sample line serializes"));
    }
    Ok(new_tokens)
}

/// Waits for the work queued on `dev` (nothing on the CPU), so a wall clock read after it
/// covers that work.
pub(crate) fn sync(dev: Device) {
    if let Device::Cuda(i) = dev {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Sets `m`'s compute dtype and, with `lora`, first casts the base (frozen from then on) to
/// that dtype (bf16 on a GPU), fuses it in place ([`Qwen2::fuse_in_place`]: sampling then
/// decodes from it with the adapters beside, no merged copy) and attaches float32 adapters
/// ([`Qwen2::attach_lora`]).
///
/// # Errors
/// An invalid LoRA config.
fn with_lora(
    m: &mut Qwen2,
    compute: Option<tch::Kind>,
    lora: Option<&cudarl_protocol::LoraConfig>,
) -> Result<(), ModelError> {
    if let Some(l) = lora {
        if let Some(k) = compute {
            m.set_kind(k);
        }
        m.fuse_in_place();
        m.attach_lora(l)?;
    }
    m.set_compute_kind(compute);
    Ok(())
}

/// The `bench` job (see [`Job::Bench`]).
fn bench(
    spec: &ModelSpec,
    vocab: i64,
    (bs, len, steps, warm): (usize, usize, usize, usize),
    gen_batches: &[usize],
    (prompt_len, gen_tokens): (usize, usize),
    (precision, gradient_checkpointing, weights, lora): (
        crate::train::Precision,
        bool,
        cudarl_protocol::Weights,
        Option<&cudarl_protocol::LoraConfig>,
    ),
    dev: Device,
) -> Result<serde_json::Value, ModelError> {
    tch::manual_seed(0);
    // A LoRA base is created in its compute dtype (bf16 on a GPU), as loading a checkpoint
    // into it does, so no float32 copy of the frozen base (30.5 GB at 7B) is in the peak.
    let mut m = match (lora, precision.compute_kind(dev)) {
        (Some(_), Some(k)) => Qwen2::new_in(spec.config(vocab), dev, k)?,
        _ => Qwen2::new(spec.config(vocab), dev)?,
    };
    with_lora(&mut m, precision.compute_kind(dev), lora)?;
    let random = |n: usize, len: usize| -> Vec<Example> {
        let t = Tensor::randint(
            vocab,
            [n as i64, len as i64],
            (tch::Kind::Int64, Device::Cpu),
        );
        (0..n as i64)
            .map(|i| Example {
                ids: Vec::<i64>::try_from(t.get(i)).unwrap_or_default(),
                mask: vec![true; len],
            })
            .collect()
    };
    let data = random(bs * (steps + warm), len);
    let cfg = TrainConfig {
        epochs: 1,
        batch_size: bs,
        max_len: len,
        eval_every: 0,
        max_steps: Some(steps + warm),
        warmup: 1.0,
        precision,
        gradient_checkpointing,
        weights,
        ..Default::default()
    };
    // Every step ends with a host read of the loss and gradient norm (a device sync), so the
    // wall clock between the warm-up's last step and the last step is the timed steps' time.
    let mut t_start = None;
    let mut last = std::time::Instant::now();
    train_lm(&mut m, &data, &[], &cfg, &mut |s| {
        last = std::time::Instant::now();
        if s.step == warm.max(1) {
            t_start = Some(last);
        }
    })?;
    let trainable: i64 = m
        .trainable()
        .trainable_variables()
        .iter()
        .map(Tensor::numel)
        .sum::<usize>() as i64;
    m.merge_lora()?;
    let timed = if warm == 0 { steps - 1 } else { steps };
    let secs = t_start.map_or(f64::NAN, |t| last.duration_since(t).as_secs_f64());
    let train_tps = (timed * bs * len) as f64 / secs;
    let mut gens = serde_json::Map::new();
    let params = crate::SampleParams {
        max_new_tokens: gen_tokens,
        temperature: 0.0,
        top_p: 1.0,
        seed: Some(0),
        use_cache: true,
        ..Default::default()
    };
    // A batch size of 0: no generation (the peak is training's alone).
    for &b in gen_batches.iter().filter(|b| **b > 0) {
        let prompts: Vec<Vec<i64>> = random(b, prompt_len).into_iter().map(|e| e.ids).collect();
        // One untimed short run, then the timed one.
        let short = crate::SampleParams {
            max_new_tokens: 4,
            ..params.clone()
        };
        crate::generate(&m, &prompts, &short, &[], &mut |_, _| false)?;
        sync(dev);
        let t0 = std::time::Instant::now();
        let g = crate::generate(&m, &prompts, &params, &[], &mut |_, _| false)?;
        sync(dev);
        let s = t0.elapsed().as_secs_f64();
        let n: usize = g.tokens.iter().map(Vec::len).sum();
        gens.insert(
            b.to_string(),
            serde_json::json!({"new_tokens": n, "seconds": s, "tokens_per_s": n as f64 / s}),
        );
    }
    Ok(serde_json::json!({
        "impl": "cudarl-train (tch)", "device": format!("{dev:?}"),
        "compute_dtype": format!("{:?}", m.compute_kind()), "weights": weights.as_str(),
        "parameters": m.config.num_parameters(), "trainable_parameters": trainable,
        "lora": lora, "batch_size": bs, "seq_len": len,
        "timed_steps": timed, "train_seconds": secs, "train_tokens_per_s": train_tps,
        "generate": gens,
    }))
}

/// `out/model/`: the model in the Hugging Face layout with its `tokenizer.json` (a copy of
/// `tokenizer`, `tok`'s file), `tokenizer_config.json` (the chat template) and
/// `generation_config.json`
/// ([`ChatTokenizer::write_hf_configs`]).
fn save(
    m: &Qwen2,
    (tok, tokenizer): (&ChatTokenizer, &std::path::Path),
    out: &std::path::Path,
) -> Result<(), ModelError> {
    let dir = out.join("model");
    m.save(&dir)?;
    std::fs::copy(tokenizer, dir.join("tokenizer.json"))
        .map_err(|e| ModelError::Io(tokenizer.display().to_string(), e))?;
    tok.write_hf_configs(&dir, m.config.max_position_embeddings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_lines_are_text_or_chats_and_anything_else_is_an_error() {
        let d: Document = serde_json::from_str(r#""__global__ void k() {}""#).unwrap();
        assert_eq!(d, Document::Text("__global__ void k() {}".into()));
        let d: Document = serde_json::from_str(
            r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"ok"}]"#,
        )
        .unwrap();
        assert_eq!(
            d,
            Document::Chat(vec![
                ChatMessage::new("user", "hi"),
                ChatMessage::new("assistant", "ok")
            ])
        );
        assert!(serde_json::from_str::<Document>(r#"{"text": "x"}"#).is_err());
        assert!(serde_json::from_str::<Document>(r#"[{"role":"user"}]"#).is_err());
    }
}
