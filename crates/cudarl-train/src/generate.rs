//! Batched sampling with temperature and nucleus (top-p) truncation (Holtzman et al., "The
//! Curious Case of Neural Text Degeneration", ICLR 2020), with a KV cache, returning token ids
//! and per-token log-probabilities (the policy's `generate_with_log_probs`).

use tch::{Device, Kind, Tensor};

use crate::ModelError;
use crate::model::{KvCache, Qwen2, StaticKv};

/// How to sample.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleParams {
    /// Most new tokens per sequence.
    pub max_new_tokens: usize,
    /// Softmax temperature; `0` = greedy (argmax).
    pub temperature: f64,
    /// Nucleus mass in `(0, 1]`: sample among the most likely tokens whose probabilities sum to
    /// at least `top_p`; `1` = the full distribution.
    pub top_p: f64,
    /// Seed of libtorch's generator for this call (`None`: continue the global stream).
    pub seed: Option<i64>,
    /// Use the KV cache (one new token per step after the prompt) or recompute the whole
    /// sequence every step (slow; for checking the cache).
    pub use_cache: bool,
    /// Bytes one chunk of rows of the prompts' forward pass may take (attention scores and
    /// logits, estimated; at least one row per chunk); see [`PREFILL_BYTES`], the default.
    pub prefill_bytes: i64,
    /// How decode steps run (with `use_cache`).
    pub decode: DecodePath,
}

/// How the decode steps after the prompts' forward pass run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodePath {
    /// A preallocated KV cache, grouped-query attention as two batched matrix products
    /// ([`Qwen2::forward_static`]), sampling on the device, and on a GPU each step replayed as a
    /// CUDA graph per batch size and attention length (`crate::decode`); tokens are read back
    /// every [`crate::decode::SYNC_EVERY`] steps.
    #[default]
    Graphs,
    /// [`DecodePath::Graphs`] without the graphs: the same steps launched one kernel at a time.
    Static,
    /// The cache grown by concatenation every step and libtorch's
    /// `scaled_dot_product_attention` with the key mask (its math kernel under grouped-query
    /// attention), tokens read back every step: the path before [`DecodePath::Graphs`], kept
    /// for comparison (`cudarl-pipe bench decode`).
    Dynamic,
}

impl Default for SampleParams {
    fn default() -> Self {
        SampleParams {
            max_new_tokens: 256,
            temperature: 1.0,
            top_p: 1.0,
            seed: None,
            use_cache: true,
            prefill_bytes: PREFILL_BYTES,
            decode: DecodePath::Graphs,
        }
    }
}

pub use cudarl_protocol::Finish;

/// The result for each prompt, in order.
#[derive(Debug, Clone)]
pub struct Generation {
    /// New token ids (without the prompt).
    pub tokens: Vec<Vec<i64>>,
    /// Log-probability of each new token under the temperature-scaled distribution the token
    /// was drawn from, before top-p truncation (the behaviour policy's log pi for PPO/GRPO
    /// ratios); with `temperature = 0`, under the unscaled distribution.
    pub log_probs: Vec<Vec<f32>>,
    /// Why each sequence ended.
    pub finish: Vec<Finish>,
}

/// Samples continuations of `prompts` (token ids; different lengths are left-padded).
/// `eos` ends a sequence; `stop(i, new_tokens)` is asked after every token of sequence `i`
/// (e.g. "does the decoded text contain a stop string").
///
/// # Errors
/// Empty prompt, bad parameters, libtorch errors.
pub fn generate(
    model: &Qwen2,
    prompts: &[Vec<i64>],
    params: &SampleParams,
    eos: &[i64],
    stop: &mut dyn FnMut(usize, &[i64]) -> bool,
) -> Result<Generation, ModelError> {
    generate_streaming(model, prompts, params, eos, stop, &mut |_, _| {})
}

/// [`generate`] that calls `on_finish(i, tokens)` as soon as row `i` is finished (end of
/// sequence or `stop`; rows cut by `max_new_tokens` at the end), while the other rows are
/// still decoding: a caller can compile finished kernels while the batch runs on
/// (`rl-train` overlaps nvcc with generation this way).
///
/// # Errors
/// As [`generate`].
pub fn generate_streaming(
    model: &Qwen2,
    prompts: &[Vec<i64>],
    params: &SampleParams,
    eos: &[i64],
    stop: &mut dyn FnMut(usize, &[i64]) -> bool,
    on_finish: &mut dyn FnMut(usize, &[i64]),
) -> Result<Generation, ModelError> {
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(ModelError::Generate("every prompt needs a token".into()));
    }
    if !(params.top_p > 0.0 && params.top_p <= 1.0) || params.temperature < 0.0 {
        return Err(ModelError::Generate(format!(
            "temperature {} must be >= 0 and top_p {} in (0, 1]",
            params.temperature, params.top_p
        )));
    }
    let _guard = tch::no_grad_guard();
    if let Some(s) = params.seed {
        tch::manual_seed(s);
    }
    let mut rows = Rows::new(prompts.len(), eos, stop, on_finish);
    if params.max_new_tokens > 0 {
        if params.use_cache && params.decode != DecodePath::Dynamic {
            crate::decode::generate_static(model, prompts, params, &mut rows)?;
        } else {
            generate_dynamic(model, prompts, params, &mut rows)?;
        }
    }
    Ok(rows.finish())
}

/// The tokens of a batch as they come back to the host, and the callers' checks on them.
pub(crate) struct Rows<'a> {
    out: Generation,
    done: Vec<bool>,
    eos: &'a [i64],
    stop: &'a mut dyn FnMut(usize, &[i64]) -> bool,
    on_finish: &'a mut dyn FnMut(usize, &[i64]),
}

impl<'a> Rows<'a> {
    fn new(
        b: usize,
        eos: &'a [i64],
        stop: &'a mut dyn FnMut(usize, &[i64]) -> bool,
        on_finish: &'a mut dyn FnMut(usize, &[i64]),
    ) -> Rows<'a> {
        Rows {
            out: Generation {
                tokens: vec![Vec::new(); b],
                log_probs: vec![Vec::new(); b],
                finish: vec![Finish::Length; b],
            },
            done: vec![false; b],
            eos,
            stop,
            on_finish,
        }
    }

    /// The next token of row `i` and its log-probability (ignored once the row is done).
    pub(crate) fn push(&mut self, i: usize, tok: i64, lp: f32) {
        if self.done[i] {
            return;
        }
        self.out.tokens[i].push(tok);
        self.out.log_probs[i].push(lp);
        if self.eos.contains(&tok) {
            self.out.finish[i] = Finish::Eos;
        } else if (self.stop)(i, &self.out.tokens[i]) {
            self.out.finish[i] = Finish::Stop;
        } else {
            return;
        }
        self.done[i] = true;
        (self.on_finish)(i, &self.out.tokens[i]);
    }

    /// Every row has ended.
    pub(crate) fn all_done(&self) -> bool {
        self.done.iter().all(|d| *d)
    }

    /// The generation; rows still open end by length (`on_finish` called for them).
    fn finish(self) -> Generation {
        for i in (0..self.done.len()).filter(|&i| !self.done[i]) {
            (self.on_finish)(i, &self.out.tokens[i]);
        }
        self.out
    }
}

/// Left-padded prompts on the device.
pub(crate) struct Padded {
    /// Token ids `[b, w]` (int64; 0 on the padding).
    pub ids: Tensor,
    /// Which positions hold real tokens `[b, w]` (bool).
    pub mask: Tensor,
    /// RoPE positions `[b, w]` (int64): real tokens count from 0, the padding is 0.
    pub pos: Tensor,
    /// Each row's next position `[b, 1]` (int64).
    pub next_pos: Tensor,
    /// Whether any row is padded.
    pub padded: bool,
}

impl Padded {
    pub(crate) fn new(prompts: &[Vec<i64>], dev: Device) -> Padded {
        let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
        // Left padding: [pad.., prompt]; pad id 0 never attended to.
        let mut ids: Vec<i64> = Vec::with_capacity(prompts.len() * width);
        let mut valid: Vec<bool> = Vec::with_capacity(prompts.len() * width);
        for p in prompts {
            ids.extend(std::iter::repeat_n(0, width - p.len()));
            ids.extend_from_slice(p);
            valid.extend(std::iter::repeat_n(false, width - p.len()));
            valid.extend(std::iter::repeat_n(true, p.len()));
        }
        let shape = [prompts.len() as i64, width as i64];
        let mask = Tensor::from_slice(&valid).view(shape).to_device(dev);
        // RoPE positions count real tokens only: cumsum(mask) - 1 (0 on the padding); each new
        // token is one past the row's last.
        let pos = (mask.to_kind(Kind::Int64).cumsum(1, Kind::Int64) - 1).clamp_min(0);
        let next_pos = pos.narrow(1, width as i64 - 1, 1) + 1;
        Padded {
            ids: Tensor::from_slice(&ids).view(shape).to_device(dev),
            mask,
            pos,
            next_pos,
            padded: prompts.iter().any(|p| p.len() != width),
        }
    }
}

/// [`DecodePath::Dynamic`], and the uncached decode (`use_cache = false`).
fn generate_dynamic(
    model: &Qwen2,
    prompts: &[Vec<i64>],
    params: &SampleParams,
    rows: &mut Rows<'_>,
) -> Result<(), ModelError> {
    // Decode a mixed-precision model with its weights cast once, not at every step.
    let copy = model.inference_copy()?;
    let model = copy.as_ref().unwrap_or(model);
    let dev = model.device();
    let b = prompts.len();
    let p = Padded::new(prompts, dev);
    let mut cache = KvCache::default();
    // The key mask [b, p] grows by a column of `true` per step, on the device.
    let mut mask = p.mask.shallow_clone();
    let mut next_pos = p.next_pos.shallow_clone();
    let new_col = Tensor::ones([b as i64, 1], (Kind::Bool, dev));
    // The previous step's tokens [b, 1] on the device (finished rows keep feeding theirs,
    // ignored, so the batch stays rectangular).
    let mut last_tok: Option<Tensor> = None;
    let mut all_ids = p.ids.shallow_clone();
    for _ in 0..params.max_new_tokens {
        let logits = match (&last_tok, params.use_cache) {
            (None, true) => prefill(model, &p, params, &mut cache)?,
            (Some(t), true) => {
                mask = Tensor::cat(&[&mask, &new_col], 1);
                let pos = next_pos.shallow_clone();
                next_pos = &next_pos + 1;
                model.forward(t, Some(&pos), p.padded.then_some(&mask), Some(&mut cache))?
            }
            (_, false) => {
                if let Some(t) = &last_tok {
                    mask = Tensor::cat(&[&mask, &new_col], 1);
                    all_ids = Tensor::cat(&[&all_ids, t], 1);
                }
                let pos = (mask.to_kind(Kind::Int64).cumsum(1, Kind::Int64) - 1).clamp_min(0);
                model.forward(&all_ids, Some(&pos), p.padded.then_some(&mask), None)?
            }
        };
        let t = logits.size()[1];
        let last = logits.narrow(1, t - 1, 1).squeeze_dim(1); // [b, V] float32
        let (tok_t, lp_t) = sample(&last, params)?;
        let (next, logp) = to_host(&tok_t, &lp_t)?;
        last_tok = Some(tok_t);
        for i in 0..b {
            rows.push(i, next[i], logp[i]);
        }
        if rows.all_done() {
            break;
        }
    }
    Ok(())
}

/// Bytes one prefill chunk may take for its attention scores and logits by default (2 GiB;
/// see `prefill`).
pub const PREFILL_BYTES: i64 = 2 << 30;

/// The prompts' forward pass, filling `cache`; returns the last position's logits `[b, 1, V]`
/// (float32; the LM head runs on that position only: at a 152k vocabulary the whole prompt's
/// logits would be `w * 608 KB` a row). In chunks of rows: one pass over the whole batch holds
/// `b * heads * w^2` attention scores (where the masked attention falls back to the math
/// kernel) and the layers' activations, `b * w * intermediate` wide in the MLP; rows are
/// independent, so chunks of at most `params.prefill_bytes` give the same cache and logits.
/// Prefill tokens/s at Qwen2.5-Coder 0.5B and 1.5B, batch 32 and 128, 0.92-1.14x
/// `transformers`' (`benchmarks/results/model_scale_h200_2026-11-29.json`).
pub(crate) fn prefill(
    model: &Qwen2,
    p: &Padded,
    params: &SampleParams,
    cache: &mut KvCache,
) -> Result<Tensor, ModelError> {
    let (logits, parts) = prefill_chunks(model, p, params, None)?;
    *cache = KvCache::cat(parts)?;
    Ok(logits)
}

/// [`prefill`] returning each chunk's cache, or with `into` writing every layer's keys and
/// values straight into those buffers ([`StaticKv::prefill_into`]; then no chunk's cache is
/// returned).
///
/// # Errors
/// libtorch errors.
pub(crate) fn prefill_chunks(
    model: &Qwen2,
    p: &Padded,
    params: &SampleParams,
    into: Option<&StaticKv>,
) -> Result<(Tensor, Vec<KvCache>), ModelError> {
    let (b, w) = p.ids.size2()?;
    let c = &model.config;
    // float32 scores; the MLP's gate, up and product in at most 4-byte elements.
    let per_row = w * (w * c.num_attention_heads * 4 + c.intermediate_size * 12) + c.vocab_size * 4;
    let rows = (params.prefill_bytes / per_row.max(1)).clamp(1, b.max(1));
    let mut last = Vec::new();
    let mut parts = Vec::new();
    for start in (0..b).step_by(rows as usize) {
        let n = rows.min(b - start);
        let mut part = into.map_or_else(KvCache::default, |kv| kv.prefill_into(start));
        let m = p.mask.narrow(0, start, n);
        let x = model.hidden(
            &p.ids.narrow(0, start, n),
            Some(&p.pos.narrow(0, start, n)),
            p.padded.then_some(&m),
            Some(&mut part),
        )?;
        last.push(model.head(&x.narrow(1, w - 1, 1)));
        if into.is_none() {
            parts.push(part);
        }
    }
    Ok((Tensor::cat(&last, 0), parts))
}

/// One token per row of `logits` `[b, V]` (float32) and its log-probability (see
/// [`Generation::log_probs`]), both `[b, 1]` on the device (int64, float32), with no host
/// synchronization, so a CUDA graph can hold it. Sampling is the exponential race (the
/// Gumbel-max trick: `argmax(p / E)`, `E ~ Exp(1)` i.i.d., picks token `i` with probability
/// `p_i`), over the nucleus when `top_p < 1`; greedy (`temperature = 0`) is the argmax.
pub(crate) fn sample(logits: &Tensor, p: &SampleParams) -> Result<(Tensor, Tensor), ModelError> {
    if p.temperature == 0.0 {
        let logp = logits.f_log_softmax(-1, Kind::Float)?;
        let tok = logits.f_argmax(-1, true)?;
        let lp = logp.f_gather(-1, &tok, false)?;
        return Ok((tok, lp));
    }
    let logp = (logits / p.temperature).f_log_softmax(-1, Kind::Float)?;
    let probs = logp.exp();
    let tok = if p.top_p < 1.0 {
        let (sorted, idx) = probs.f_sort(-1, true)?;
        let before = sorted.cumsum(-1, Kind::Float) - &sorted; // mass of better tokens
        let keep = before.lt(p.top_p); // the first token is always kept (before = 0)
        let kept = sorted * keep.to_kind(Kind::Float);
        let mut race = kept.empty_like();
        let _ = race.f_exponential_(1.0)?;
        let j = (kept / race).f_argmax(-1, true)?;
        idx.f_gather(-1, &j, false)?
    } else {
        let mut race = probs.empty_like();
        let _ = race.f_exponential_(1.0)?;
        (&probs / race).f_argmax(-1, true)?
    };
    let lp = logp.f_gather(-1, &tok, false)?;
    Ok((tok, lp))
}

/// Tokens `[b, n]` (int64) and their log-probabilities `[b, n]` on the host, row-major, in one
/// device-to-host copy (float64 holds token ids below 2^53 exactly).
pub(crate) fn to_host(tok: &Tensor, lp: &Tensor) -> Result<(Vec<i64>, Vec<f32>), ModelError> {
    let both = Tensor::f_stack(&[tok.to_kind(Kind::Double), lp.to_kind(Kind::Double)], -1)?;
    let host = Vec::<f64>::try_from(both.to_device(Device::Cpu).contiguous().view([-1]))?;
    let toks = host.iter().step_by(2).map(|v| *v as i64).collect();
    let lps = host.iter().skip(1).step_by(2).map(|v| *v as f32).collect();
    Ok((toks, lps))
}
