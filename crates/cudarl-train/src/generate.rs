//! Batched sampling with temperature and nucleus (top-p) truncation (Holtzman et al., "The
//! Curious Case of Neural Text Degeneration", ICLR 2020), with a KV cache, returning token ids
//! and per-token log-probabilities (the policy's `generate_with_log_probs`).

use tch::{Device, Kind, Tensor};

use crate::ModelError;
use crate::model::{KvCache, Qwen2};

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
}

impl Default for SampleParams {
    fn default() -> Self {
        SampleParams {
            max_new_tokens: 256,
            temperature: 1.0,
            top_p: 1.0,
            seed: None,
            use_cache: true,
        }
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// Produced an end-of-sequence token (kept as the last token).
    Eos,
    /// The caller's stop check fired (a stop string appeared).
    Stop,
    /// Reached `max_new_tokens`.
    Length,
}

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
    let dev = model.device();
    let b = prompts.len();
    let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
    // Left padding: [pad.., prompt]; pad id 0 never attended to.
    let mut ids: Vec<Vec<i64>> = prompts
        .iter()
        .map(|p| {
            let mut v = vec![0; width - p.len()];
            v.extend_from_slice(p);
            v
        })
        .collect();
    let mut valid: Vec<Vec<bool>> = prompts
        .iter()
        .map(|p| {
            let mut v = vec![false; width - p.len()];
            v.extend(std::iter::repeat_n(true, p.len()));
            v
        })
        .collect();
    let mut out = Generation {
        tokens: vec![Vec::new(); b],
        log_probs: vec![Vec::new(); b],
        finish: vec![Finish::Length; b],
    };
    let mut done = vec![false; b];
    let mut cache = KvCache::default();
    let to_t = |rows: &[Vec<i64>]| -> Tensor {
        let flat: Vec<i64> = rows.iter().flatten().copied().collect();
        Tensor::from_slice(&flat)
            .view([rows.len() as i64, -1])
            .to_device(dev)
    };
    let mask_t = |rows: &[Vec<bool>]| -> Tensor {
        let flat: Vec<bool> = rows.iter().flatten().copied().collect();
        Tensor::from_slice(&flat)
            .view([rows.len() as i64, -1])
            .to_device(dev)
    };
    let padded = prompts.iter().any(|p| p.len() != width);
    for step in 0..params.max_new_tokens {
        let mask = mask_t(&valid);
        // RoPE positions count real tokens only: cumsum(mask) - 1 (0 on the padding).
        let pos_all = (mask.to_kind(Kind::Int64).cumsum(1, Kind::Int64) - 1).clamp_min(0);
        let logits = if params.use_cache {
            let (inp, pos) = if step == 0 {
                (to_t(&ids), pos_all)
            } else {
                let last: Vec<Vec<i64>> = ids.iter().map(|r| vec![*r.last().unwrap()]).collect();
                let n = pos_all.size()[1];
                (to_t(&last), pos_all.narrow(1, n - 1, 1))
            };
            model.forward(&inp, Some(&pos), padded.then_some(&mask), Some(&mut cache))?
        } else {
            model.forward(&to_t(&ids), Some(&pos_all), padded.then_some(&mask), None)?
        };
        let t = logits.size()[1];
        let last = logits.narrow(1, t - 1, 1).squeeze_dim(1); // [b, V] float32
        let (next, logp) = sample(&last, params)?;
        for i in 0..b {
            let (tok, lp) = (next[i], logp[i]);
            // Finished rows keep feeding a token (ignored) so the batch stays rectangular.
            ids[i].push(if done[i] { 0 } else { tok });
            valid[i].push(true);
            if done[i] {
                continue;
            }
            out.tokens[i].push(tok);
            out.log_probs[i].push(lp);
            if eos.contains(&tok) {
                done[i] = true;
                out.finish[i] = Finish::Eos;
            } else if stop(i, &out.tokens[i]) {
                done[i] = true;
                out.finish[i] = Finish::Stop;
            }
            if done[i] {
                on_finish(i, &out.tokens[i]);
            }
        }
        if done.iter().all(|d| *d) {
            break;
        }
    }
    for i in (0..b).filter(|&i| !done[i]) {
        on_finish(i, &out.tokens[i]);
    }
    Ok(out)
}

/// One token per row of `logits` `[b, V]` and its log-probability (see
/// [`Generation::log_probs`]).
fn sample(logits: &Tensor, p: &SampleParams) -> Result<(Vec<i64>, Vec<f32>), ModelError> {
    let (tok, logp) = if p.temperature == 0.0 {
        let logp = logits.log_softmax(-1, Kind::Float);
        (logits.argmax(-1, true), logp)
    } else {
        let logp = (logits / p.temperature).log_softmax(-1, Kind::Float);
        let probs = logp.exp();
        let probs = if p.top_p < 1.0 {
            let (sorted, idx) = probs.sort(-1, true);
            let before = sorted.cumsum(-1, Kind::Float) - &sorted; // mass of better tokens
            let keep = before.lt(p.top_p); // the first token is always kept (before = 0)
            let kept = sorted * keep.to_kind(Kind::Float);
            Tensor::zeros_like(&probs).scatter(-1, &idx, &kept)
        } else {
            probs
        };
        (probs.multinomial(1, false), logp)
    };
    let lp = logp.gather(-1, &tok, false);
    let to_vec = |t: Tensor| -> Result<Vec<f64>, ModelError> {
        Ok(Vec::<f64>::try_from(
            t.to_device(Device::Cpu).to_kind(Kind::Double).view([-1]),
        )?)
    };
    let toks = to_vec(tok)?.into_iter().map(|v| v as i64).collect();
    let lps = to_vec(lp)?.into_iter().map(|v| v as f32).collect();
    Ok((toks, lps))
}
