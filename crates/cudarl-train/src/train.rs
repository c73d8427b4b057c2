//! Causal-LM training with a loss mask (pretraining: every token; SFT: assistant tokens only):
//! AdamW (Loshchilov and Hutter, ICLR 2019), linear warmup then cosine decay to
//! `min_lr_ratio * lr` (SGDR, Loshchilov and Hutter, ICLR 2017), global gradient-norm clipping,
//! periodic evaluation loss.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use cudarl_protocol::Weights;

use crate::ModelError;
use crate::model::Qwen2;
use crate::tokenizer::{ChatMessage, ChatTokenizer};

/// One training sequence: token ids and, per token, whether predicting it counts in the loss.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Example {
    /// Token ids.
    pub ids: Vec<i64>,
    /// Per token: trained on (the target of the previous position).
    pub mask: Vec<bool>,
}

pub use cudarl_protocol::{Precision, StepMetrics, TrainConfig};

/// The compute dtype of a [`Precision`] on a device.
pub trait ComputeKind {
    /// The compute dtype on `device` (`None` = the parameters' float32): bf16 on CUDA for
    /// `auto` and `bf16`, bf16 on the CPU only for `bf16`.
    fn compute_kind(self, device: tch::Device) -> Option<Kind>;
}

impl ComputeKind for Precision {
    fn compute_kind(self, device: tch::Device) -> Option<Kind> {
        match (self, device) {
            (Precision::F32, _) | (Precision::Auto, tch::Device::Cpu) => None,
            _ => Some(Kind::BFloat16),
        }
    }
}

/// Learning rate at `step` (1-based) of `total`: linear warmup, then cosine to
/// `min_lr_ratio * lr`.
pub fn lr_at(cfg: &TrainConfig, step: usize, total: usize) -> f64 {
    let warm = if cfg.warmup < 1.0 {
        (cfg.warmup * total as f64).ceil()
    } else {
        cfg.warmup
    }
    .max(1.0);
    let s = step as f64;
    if s <= warm {
        return cfg.lr * s / warm;
    }
    let progress = ((s - warm) / (total as f64 - warm).max(1.0)).min(1.0);
    let min = cfg.lr * cfg.min_lr_ratio;
    min + 0.5 * (cfg.lr - min) * (1.0 + (std::f64::consts::PI * progress).cos())
}

/// Right-padded batch: ids `[b, t]`, loss mask `[b, t - 1]` (float), and the token count.
fn batch(examples: &[&Example], max_len: usize, dev: tch::Device) -> (Tensor, Tensor, usize) {
    let t = examples
        .iter()
        .map(|e| e.ids.len().min(max_len))
        .max()
        .unwrap_or(1)
        .max(2);
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    let mut n = 0;
    for e in examples {
        let l = e.ids.len().min(max_len);
        n += l;
        ids.extend_from_slice(&e.ids[..l]);
        ids.extend(std::iter::repeat_n(0, t - l));
        // The loss of position i predicts token i + 1.
        for i in 1..t {
            mask.push(if i < l && e.mask[i] { 1.0f32 } else { 0.0 });
        }
    }
    let b = examples.len() as i64;
    (
        Tensor::from_slice(&ids).view([b, t as i64]).to_device(dev),
        Tensor::from_slice(&mask)
            .view([b, t as i64 - 1])
            .to_device(dev),
        n,
    )
}

/// Chat conversations as training examples: each rendered with the chat template
/// ([`ChatTokenizer::render`]), trained on its assistant turns only (SFT's and PPO-ptx's data).
///
/// # Errors
/// Tokenizer errors.
pub fn chat_examples<R: AsRef<[ChatMessage]> + Sync>(
    tok: &ChatTokenizer,
    rows: &[R],
) -> Result<Vec<Example>, ModelError> {
    use rayon::prelude::*;
    // On all cores: about 1.2M tokens per second on one core, and sft-train renders
    // about 5M tokens before its first step.
    rows.par_iter()
        .map(|msgs| {
            let (ids, mask) = tok.render(msgs.as_ref(), false)?;
            Ok(Example { ids, mask })
        })
        .collect()
}

/// Mean masked next-token cross-entropy of `examples` and the number of trained tokens.
///
/// # Errors
/// libtorch errors.
pub fn loss_of(
    model: &Qwen2,
    examples: &[&Example],
    max_len: usize,
) -> Result<(Tensor, usize), ModelError> {
    let (ids, mask, _) = batch(examples, max_len, model.device());
    let t = ids.size()[1];
    let inp = ids.narrow(1, 0, t - 1);
    let tgt = ids.narrow(1, 1, t - 1);
    let logits = model.forward(&inp, None, None, None)?;
    let logp = logits
        .log_softmax(-1, Kind::Float)
        .gather(-1, &tgt.unsqueeze(-1), false)
        .squeeze_dim(-1);
    let n = mask.sum(Kind::Float).double_value(&[]);
    let loss = -(logp * &mask).sum(Kind::Float) / n.max(1.0);
    Ok((loss, n as usize))
}

/// Bytes of float32 logits one chunk of [`chunked_loss`] holds at a time (512 MiB: 883 of a
/// 152k vocabulary's positions, every position of a batch at the small models' 8k).
pub const CE_CHUNK_BYTES: i64 = 512 << 20;

/// Positions whose float32 logits fit in `bytes` (at least 1): the rows of one chunk of
/// [`chunked_loss`] and of [`crate::score::Scored`].
pub fn logit_rows(model: &Qwen2, bytes: i64) -> i64 {
    (bytes / (model.config.vocab_size * 4).max(1)).max(1)
}

/// How [`chunked_loss`] runs.
#[derive(Debug, Clone, Copy)]
pub struct LossPass {
    /// Bytes of float32 logits one chunk holds ([`CE_CHUNK_BYTES`] by default).
    pub chunk_bytes: i64,
    /// Accumulate the loss's gradients into the parameters.
    pub backward: bool,
    /// With `backward`: activation checkpointing ([`Qwen2::checkpointed_backward`]).
    pub checkpoint: bool,
    /// With `backward`: the factor on the accumulated gradients (PPO-ptx's coefficient; 1.0
    /// for the loss itself). The returned loss is not scaled.
    pub grad_scale: f64,
}

/// [`loss_of`] with the LM head and the cross-entropy run over chunks of at most
/// `pass.chunk_bytes` of float32 logits, so the `[b, t, V]` logits (5 GB for 8 x 1024 tokens at
/// a 152k vocabulary, and as much again for their log-softmax and its gradient) never exist at
/// once. With `pass.backward`, the gradients of the returned loss are accumulated into the
/// parameters' `.grad` the way `loss.backward()` would: each chunk's loss is backpropagated
/// into the LM head and a detached copy of the final hidden states, then the layers get that
/// copy's gradient in one pass (the two-stage backward of chunked cross-entropy, as Liger
/// Kernel's fused linear cross-entropy computes it; `linkedin/Liger-Kernel`), layer by layer
/// with `pass.checkpoint`. Returns the loss value (nats per trained token) and the number of
/// trained tokens. Peak GPU memory of an SFT step of 8 x 1024 tokens at Qwen2.5-Coder 0.5B and
/// 1.5B: 21.3 and 49.8 GiB, from 35.4 and 68.1 GiB with whole logits
/// (`benchmarks/results/model_scale_h200_2026-11-29.json`).
///
/// # Errors
/// libtorch errors.
pub fn chunked_loss(
    model: &Qwen2,
    examples: &[&Example],
    max_len: usize,
    pass: LossPass,
) -> Result<(f64, usize), ModelError> {
    let (ids, mask, _) = batch(examples, max_len, model.device());
    let t = ids.size()[1];
    let inp = ids.narrow(1, 0, t - 1);
    let tgt = ids.narrow(1, 1, t - 1).reshape([-1, 1]);
    let mask = mask.reshape([-1]);
    let n = mask.sum(Kind::Float).double_value(&[]).max(1.0);
    // The summed loss of the normed hidden states `x` [b, t - 1, h], chunk by chunk.
    let head_loss = |x: &Tensor, backward: bool| -> Result<f64, ModelError> {
        let flat = x.reshape([-1, x.size()[2]]);
        let rows = tgt.size()[0];
        let step = logit_rows(model, pass.chunk_bytes).min(rows.max(1));
        let mut total = 0.0;
        for start in (0..rows).step_by(step as usize) {
            let len = step.min(rows - start);
            let logp = model
                .head(&flat.narrow(0, start, len))
                .log_softmax(-1, Kind::Float)
                .gather(-1, &tgt.narrow(0, start, len), false)
                .squeeze_dim(-1);
            let part = -(logp * mask.narrow(0, start, len)).sum(Kind::Float) / n;
            if backward {
                (&part * pass.grad_scale).f_backward()?;
            }
            total += part.double_value(&[]);
        }
        Ok(total)
    };
    let one_chunk = logit_rows(model, pass.chunk_bytes) >= tgt.size()[0];
    let total = match (pass.backward, pass.checkpoint) {
        (false, _) => head_loss(&model.hidden(&inp, None, None, None)?, false)?,
        // Logits that fit one chunk: one backward pass through the whole graph (the plain
        // loss), not two.
        (true, false) if one_chunk => head_loss(&model.hidden(&inp, None, None, None)?, true)?,
        (true, false) => {
            let x = model.hidden(&inp, None, None, None)?;
            let leaf = x.detach().set_requires_grad(true);
            let total = head_loss(&leaf, true)?;
            // d(total)/dx is the leaf's gradient; `sum(x * g)` has exactly that gradient.
            (x * leaf.grad()).sum(Kind::Float).f_backward()?;
            total
        }
        (true, true) => {
            let mut total = 0.0;
            model.checkpointed_backward(&inp, &mut |leaf| {
                total = head_loss(leaf, true)?;
                Ok(())
            })?;
            total
        }
    };
    Ok((total, n as usize))
}

/// Mean loss over `examples` in batches, without gradients.
///
/// # Errors
/// libtorch errors.
pub fn evaluate(model: &Qwen2, examples: &[Example], cfg: &TrainConfig) -> Result<f64, ModelError> {
    let _g = tch::no_grad_guard();
    let (mut total, mut count) = (0.0, 0usize);
    for chunk in examples.chunks(cfg.batch_size.max(1)) {
        let refs: Vec<&Example> = chunk.iter().collect();
        let pass = LossPass {
            chunk_bytes: CE_CHUNK_BYTES,
            backward: false,
            checkpoint: false,
            grad_scale: 1.0,
        };
        let (l, n) = chunked_loss(model, &refs, cfg.max_len, pass)?;
        total += l * n as f64;
        count += n;
    }
    Ok(total / count.max(1) as f64)
}

/// Trains `model` on `train` for `cfg.epochs` epochs (shuffled per epoch with `cfg.seed`),
/// calling `on_step` after every step; returns every step's metrics.
///
/// # Errors
/// Empty training set, libtorch errors.
pub fn train_lm(
    model: &mut Qwen2,
    train: &[Example],
    eval: &[Example],
    cfg: &TrainConfig,
    on_step: &mut dyn FnMut(&StepMetrics),
) -> Result<Vec<StepMetrics>, ModelError> {
    if train.is_empty() {
        return Err(ModelError::Generate("no training examples".into()));
    }
    tch::manual_seed(cfg.seed as i64);
    let bs = cfg.batch_size.max(1);
    let steps_per_epoch = train.len().div_ceil(bs);
    let total = (steps_per_epoch * cfg.epochs.max(1)).min(cfg.max_steps.unwrap_or(usize::MAX));
    let mut opt = optimizer(model, cfg);
    let params = model.trainable().trainable_variables();
    let mut out = Vec::new();
    let mut step = 0;
    let lens: Vec<usize> = train.iter().map(|e| e.ids.len().min(cfg.max_len)).collect();
    for epoch in 0..cfg.epochs.max(1) {
        let seed = cfg.seed.wrapping_add(epoch as u64);
        for chunk in epoch_batches(&lens, bs, seed, cfg.group_by_length) {
            if step == total {
                break;
            }
            step += 1;
            let t0 = Instant::now();
            let refs: Vec<&Example> = chunk.iter().map(|&i| &train[i]).collect();
            let all_tokens: usize = refs.iter().map(|e| e.ids.len().min(cfg.max_len)).sum();
            let lr = lr_at(cfg, step, total);
            opt.set_lr(lr);
            // The GPU, shared, for this step (the harness's timing waits between steps).
            let gpu = crate::GpuShare::hold(model.vs.device())?;
            opt.zero_grad();
            let pass = LossPass {
                chunk_bytes: CE_CHUNK_BYTES,
                backward: true,
                checkpoint: cfg.gradient_checkpointing,
                grad_scale: 1.0,
            };
            let (loss, n) = chunked_loss(model, &refs, cfg.max_len, pass)?;
            let grad_norm = clip_grad_norm(&params, cfg.grad_clip);
            opt.step();
            let eval_now = (cfg.eval_every > 0 && step % cfg.eval_every == 0) || step == total;
            let eval_loss = if eval_now && !eval.is_empty() {
                Some(evaluate(model, eval, cfg)?)
            } else {
                None
            };
            drop(gpu);
            let m = StepMetrics {
                step,
                epoch,
                loss,
                lr,
                grad_norm,
                tokens: n,
                tokens_per_s: all_tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9),
                eval_loss,
            };
            on_step(&m);
            out.push(m);
        }
    }
    Ok(out)
}

/// The AdamW of [`train_lm`] over [`Qwen2::trainable`] (the LoRA adapters when attached):
/// [`crate::adamw::AdamW`] over float32 master weights, or, for bf16 weights
/// ([`TrainConfig::weights`]), rounding each update by [`crate::adamw::Rounding`] (the model
/// cast to bf16 first, compute in bf16). On a GPU each parameter's step is one fused kernel
/// ([`crate::fused_adamw`]) where libtorch's own AdamW runs about eleven elementwise kernels.
fn optimizer(model: &mut Qwen2, cfg: &TrainConfig) -> crate::adamw::AdamW {
    let a = crate::adamw::AdamWConfig {
        beta1: cfg.betas.0,
        beta2: cfg.betas.1,
        eps: 1e-8,
        weight_decay: cfg.weight_decay,
    };
    if cfg.weights != Weights::F32 {
        model.set_kind(Kind::BFloat16);
        model.set_compute_kind(None);
    }
    let moments = match cfg.weights {
        Weights::Bf16 => Kind::BFloat16,
        _ => Kind::Float,
    };
    // float32 weights round nothing (`Weights::F32` is `Rounding::Nearest`).
    crate::adamw::AdamW::with_rounding(model.trainable(), a, cfg.lr, cfg.weights.into(), moments)
}

/// Scales the gradients of `params` so their global L2 norm is at most `max_norm` (as
/// `torch.nn.utils.clip_grad_norm_`); returns the norm before clipping.
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> f64 {
    tch::no_grad(|| {
        let norms: Vec<Tensor> = params
            .iter()
            .map(|p| p.grad())
            .filter(Tensor::defined)
            .map(|g| g.norm())
            .collect();
        if norms.is_empty() {
            return 0.0;
        }
        let total = Tensor::stack(&norms, 0).norm().double_value(&[]);
        if total > max_norm {
            for p in params {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.g_mul_scalar_(max_norm / (total + 1e-6));
                }
            }
        }
        total
    })
}

/// Batches per megabatch of [`TrainConfig::group_by_length`] (`transformers`'
/// `get_length_grouped_indices` uses 50).
pub const MEGABATCH: usize = 50;

/// One epoch's batches of example indices (`lens[i]`: example `i`'s tokens after truncation):
/// the permutation `shuffled(n, seed)` cut into batches of `bs`; with `group`, each run of
/// [`MEGABATCH`] batches of it sorted by length (longest first) before it is cut, then the
/// batches put in an order shuffled by `seed`. Every index appears once; `n.div_ceil(bs)`
/// batches either way, all of `bs` but possibly one.
pub fn epoch_batches(lens: &[usize], bs: usize, seed: u64, group: bool) -> Vec<Vec<usize>> {
    let bs = bs.max(1);
    let order = shuffled(lens.len(), seed);
    if !group {
        return order.chunks(bs).map(<[usize]>::to_vec).collect();
    }
    let mut batches: Vec<Vec<usize>> = Vec::with_capacity(lens.len().div_ceil(bs));
    for mega in order.chunks(bs * MEGABATCH) {
        let mut m = mega.to_vec();
        m.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
        batches.extend(m.chunks(bs).map(<[usize]>::to_vec));
    }
    let perm = shuffled(batches.len(), seed ^ 0x9e37_79b9_7f4a_7c15);
    perm.into_iter()
        .map(|k| std::mem::take(&mut batches[k]))
        .collect()
}

/// A permutation of `0..n` from a SplitMix64 stream seeded with `seed` (Fisher-Yates).
pub(crate) fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_by_hand() {
        let cfg = TrainConfig {
            lr: 1.0,
            warmup: 10.0,
            min_lr_ratio: 0.1,
            ..Default::default()
        };
        assert_eq!(lr_at(&cfg, 5, 110), 0.5);
        assert_eq!(lr_at(&cfg, 10, 110), 1.0);
        // Halfway through the decay: min + (max - min) / 2.
        assert!((lr_at(&cfg, 60, 110) - 0.55).abs() < 1e-12);
        assert!((lr_at(&cfg, 110, 110) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn chunked_cross_entropy_gives_the_full_losses_value_and_gradients() {
        let _rng = crate::torch_rng();
        for tied in [true, false] {
            tch::manual_seed(3);
            let cfg = crate::config::Qwen2Config::new(50, 16, 32, 2, 4, 2, 64, tied);
            let m = Qwen2::new(cfg, tch::Device::Cpu).unwrap();
            let ex: Vec<Example> = (0..3)
                .map(|r| Example {
                    ids: (0..9 + r).map(|i| (i * 7 + r * 3) % 50).collect(),
                    mask: (0..9 + r).map(|i| i % 3 != 0).collect(),
                })
                .collect();
            let refs: Vec<&Example> = ex.iter().collect();
            let vars = m.vs.trainable_variables();
            let grads = || -> Vec<Tensor> { vars.iter().map(|v| v.grad().copy()).collect() };
            let zero = || {
                for v in &vars {
                    let mut g = v.grad();
                    if g.defined() {
                        let _ = g.zero_();
                    }
                }
            };
            let (full, n) = loss_of(&m, &refs, 16).unwrap();
            full.backward();
            let want = grads();
            // 3 positions a chunk: 10 chunks, one of them short, over 29 positions, with and
            // without activation checkpointing (there with the gradient scaled by 0.25); and
            // every position in one chunk.
            for (chunk_bytes, checkpoint, grad_scale) in
                [(600, false, 1.0), (600, true, 0.25), (1 << 20, false, 1.0)]
            {
                zero();
                let pass = LossPass {
                    chunk_bytes,
                    backward: true,
                    checkpoint,
                    grad_scale,
                };
                let (part, n2) = chunked_loss(&m, &refs, 16, pass).unwrap();
                assert_eq!(n, n2);
                assert!((full.double_value(&[]) - part).abs() < 1e-6, "tied {tied}");
                for (w, g) in want.iter().zip(grads()) {
                    let diff = (w * grad_scale - &g).abs().max().double_value(&[]);
                    let what = format!("tied {tied}, checkpoint {checkpoint}: {diff}");
                    assert!(
                        diff < 1e-6 && w.abs().max().double_value(&[]) > 0.0,
                        "{what}"
                    );
                }
            }
            let pass = LossPass {
                chunk_bytes: 1 << 20,
                backward: false,
                checkpoint: false,
                grad_scale: 1.0,
            };
            let (nograd, _) = chunked_loss(&m, &refs, 16, pass).unwrap();
            assert!((nograd - full.double_value(&[])).abs() < 1e-6);
        }
    }

    #[test]
    fn bf16_weights_train_the_model_in_bf16_as_far_as_float32_master_weights() {
        let _rng = crate::torch_rng();
        // Four repeated examples, 60 steps of SFT from the same random model: the final loss
        // with bf16 weights (either rounding) within 15% of float32 master weights' and far
        // below the start.
        let ex: Vec<Example> = (0..4)
            .map(|r| Example {
                ids: (0..12).map(|i| (i * 5 + r) % 40).collect(),
                mask: vec![true; 12],
            })
            .collect();
        let run = |weights: cudarl_protocol::Weights| -> (f64, f64, Kind) {
            tch::manual_seed(5);
            let cfg = crate::config::Qwen2Config::new(40, 16, 32, 2, 4, 2, 64, true);
            let mut m = Qwen2::new(cfg, tch::Device::Cpu).unwrap();
            let tc = TrainConfig {
                epochs: 60,
                batch_size: 4,
                max_len: 12,
                lr: 1e-2,
                warmup: 1.0,
                min_lr_ratio: 1.0,
                eval_every: 0,
                precision: Precision::F32,
                weights,
                ..Default::default()
            };
            let steps = train_lm(&mut m, &ex, &[], &tc, &mut |_| {}).unwrap();
            (steps[0].loss, steps.last().unwrap().loss, m.kind())
        };
        let (first, f32_last, k) = run(Weights::F32);
        assert_eq!(k, Kind::Float);
        assert!(f32_last < 0.5 * first, "{first} -> {f32_last}");
        for w in [Weights::Bf16Stochastic, Weights::Bf16Kahan, Weights::Bf16] {
            let (_, last, k) = run(w);
            assert_eq!(k, Kind::BFloat16, "{w:?}");
            assert!(
                (last - f32_last).abs() < 0.15 * f32_last.max(0.1),
                "{w:?}: {last} vs float32 {f32_last}"
            );
        }
    }

    #[test]
    fn shuffle_is_a_seeded_permutation() {
        let a = shuffled(100, 3);
        let mut s = a.clone();
        s.sort();
        assert_eq!(s, (0..100).collect::<Vec<_>>());
        assert_eq!(a, shuffled(100, 3));
        assert_ne!(a, shuffled(100, 4));
    }

    #[test]
    fn length_grouped_batches_cover_every_example_once_with_less_padding() {
        // Lengths like the SFT conversations': 600 to 2,048 tokens.
        let lens: Vec<usize> = (0..1003).map(|i| 600 + (i * 7919) % 1449).collect();
        let padded = |bs: &[Vec<usize>]| -> usize {
            bs.iter()
                .map(|b| b.len() * b.iter().map(|&i| lens[i]).max().unwrap())
                .sum()
        };
        let plain = epoch_batches(&lens, 16, 7, false);
        let flat: Vec<usize> = plain.concat();
        assert_eq!(
            flat,
            shuffled(lens.len(), 7),
            "ungrouped: the shuffled order, cut"
        );
        let grouped = epoch_batches(&lens, 16, 7, true);
        assert_eq!(grouped.len(), lens.len().div_ceil(16));
        assert_eq!(grouped.iter().filter(|b| b.len() != 16).count(), 1);
        let mut all = grouped.concat();
        all.sort();
        assert_eq!(
            all,
            (0..lens.len()).collect::<Vec<_>>(),
            "each example once"
        );
        let real: usize = lens.iter().sum();
        let (p, g) = (padded(&plain), padded(&grouped));
        assert!(
            (real as f64 / g as f64) > 0.97 && (real as f64 / p as f64) < 0.7,
            "tokens used: grouped {:.3}, random {:.3}",
            real as f64 / g as f64,
            real as f64 / p as f64
        );
        assert_eq!(grouped, epoch_batches(&lens, 16, 7, true), "seeded");
        assert_ne!(grouped, epoch_batches(&lens, 16, 8, true));
        // Long and short batches are spread over the epoch, not sorted.
        let maxes: Vec<usize> = grouped
            .iter()
            .map(|b| b.iter().map(|&i| lens[i]).max().unwrap())
            .collect();
        assert!(maxes.windows(2).any(|w| w[0] < w[1]) && maxes.windows(2).any(|w| w[0] > w[1]));
    }
}
