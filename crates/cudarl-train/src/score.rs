//! Scoring sampled completions for a policy-gradient update in bounded memory: the LM head
//! and its log-softmax run over chunks of completion positions, so the `[b, T, V]` logits of
//! a minibatch (2.5 GB in float32 for 8 x 512 tokens at a 152k vocabulary, and as much again
//! for their log-softmax and its gradient) never exist at once, and with activation
//! checkpointing the layers keep only their inputs. A loss of the per-token log-probabilities
//! is differentiated with respect to those log-probabilities first (a `[b, T]` tensor), then
//! backpropagated through the head chunk by chunk and through the layers once: the two-stage
//! backward of chunked cross-entropy (`train::chunked_loss`) for any loss of the
//! log-probabilities (the clipped ratio, the k3 KL). One GRPO update of 32 x 512 tokens at
//! Qwen2.5-Coder 7B with LoRA: 2.93 s at `transformers`' speed, the update's peak allocation
//! 60.2 GiB (33.6 GiB checkpointed) where whole logits took the process to 74.9 GiB
//! (`benchmarks/results/model_scale_h200_2026-11-30.json`, `grpo_update`).

use tch::{Kind, Tensor};

use crate::ModelError;
use crate::model::{Checkpoints, Qwen2};

/// How [`Scored`] runs a minibatch.
#[derive(Debug, Clone, Copy)]
pub struct ScorePass {
    /// Bytes of float32 logits one chunk of the LM head holds
    /// ([`crate::train::CE_CHUNK_BYTES`] by default).
    pub chunk_bytes: i64,
    /// Activation checkpointing ([`Qwen2::checkpointed_forward`]): the forward keeps each
    /// layer's input only, and every backward pass runs the layers forward again.
    pub checkpoint: bool,
}

impl Default for ScorePass {
    fn default() -> Self {
        ScorePass {
            chunk_bytes: crate::train::CE_CHUNK_BYTES,
            checkpoint: false,
        }
    }
}

/// What the forward pass kept for the backward passes.
enum Trunk {
    /// The final normed hidden states `[b, w, h]` with their graph (none under `no_grad`).
    Graph(Tensor),
    /// Each layer's input, no graph.
    Checkpointed(Checkpoints),
}

/// A minibatch of (prompt, completion) pairs after one forward pass of a model: rows
/// `[prompt, completion, pad..]` of width `w` (right padding; causal attention keeps pads out
/// of the real tokens' states), scored under the model's logits divided by the sampling
/// temperature. `T` is the longest completion.
pub struct Scored {
    trunk: Trunk,
    /// `[b * T]` (int64): the flat index `row * w + position` of the hidden state that
    /// predicts each completion slot (completion token `j` is predicted at `len(prompt) - 1 + j`).
    rows: Tensor,
    /// `[b * T, 1]` (int64): each slot's token (0 on padding).
    tgt: Tensor,
    /// `[b]` (int64): the flat index of each prompt's last token.
    last: Tensor,
    /// `[b, T]` (float32): 1 on real completion tokens.
    pub mask: Tensor,
    temperature: f64,
    chunk_rows: i64,
}

impl Scored {
    /// Runs `model` forward on `items` (prompt, completion token ids), keeping what
    /// [`Scored::backward`] needs: the graph, or with `pass.checkpoint` the layers' inputs.
    /// Under `tch::no_grad` with `pass.checkpoint` off it keeps the hidden states only.
    ///
    /// # Errors
    /// libtorch errors (out of memory named by libtorch).
    pub fn new(
        model: &Qwen2,
        items: &[(&[i64], &[i64])],
        temperature: f64,
        pass: ScorePass,
    ) -> Result<Scored, ModelError> {
        let dev = model.device();
        let width = items
            .iter()
            .map(|(p, c)| p.len() + c.len())
            .max()
            .unwrap_or(1);
        let tmax = items.iter().map(|(_, c)| c.len()).max().unwrap_or(1).max(1);
        let b = items.len() as i64;
        let (mut ids, mut rows, mut tgt, mut mask, mut last) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, (p, c)) in items.iter().enumerate() {
            let base = (i * width) as i64;
            let mut row = p.to_vec();
            row.extend_from_slice(c);
            row.resize(width, 0);
            ids.extend(row);
            for j in 0..tmax {
                rows.push(base + (p.len() - 1 + j.min(c.len().saturating_sub(1))) as i64);
                tgt.push(c.get(j).copied().unwrap_or(0));
                mask.push(if j < c.len() { 1.0f32 } else { 0.0 });
            }
            last.push(base + p.len() as i64 - 1);
        }
        let on = |v: &[i64]| Tensor::from_slice(v).to_device(dev);
        let ids = on(&ids).view([b, width as i64]);
        let trunk = if pass.checkpoint {
            Trunk::Checkpointed(model.checkpointed_forward(&ids)?)
        } else {
            Trunk::Graph(model.hidden(&ids, None, None, None)?)
        };
        Ok(Scored {
            trunk,
            rows: on(&rows),
            tgt: on(&tgt).view([-1, 1]),
            last: on(&last),
            mask: Tensor::from_slice(&mask)
                .view([b, tmax as i64])
                .to_device(dev),
            temperature,
            chunk_rows: crate::train::logit_rows(model, pass.chunk_bytes),
        })
    }

    /// The final normed hidden states `[b * w, h]` (with the graph on the `Graph` trunk).
    fn hidden(&self, model: &Qwen2) -> Tensor {
        let h = match &self.trunk {
            Trunk::Graph(h) => h.shallow_clone(),
            Trunk::Checkpointed(ck) => model.checkpointed_hidden(ck),
        };
        let width = h.size()[2];
        h.reshape([-1, width])
    }

    /// Log-softmax `[len, V]` (float32) of the tempered logits of slots `start..start + len`
    /// read from the flat hidden states `flat` `[b * w, h]`.
    fn chunk_log_softmax(&self, model: &Qwen2, flat: &Tensor, start: i64, len: i64) -> Tensor {
        let at = model.head(&flat.index_select(0, &self.rows.narrow(0, start, len)));
        let at = if self.temperature > 0.0 {
            at / self.temperature
        } else {
            at
        };
        at.log_softmax(-1, Kind::Float)
    }

    /// The chunks `(start, len)` of the `b * T` slots.
    fn chunks(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        let n = self.rows.size()[0];
        (0..n)
            .step_by(self.chunk_rows as usize)
            .map(move |s| (s, self.chunk_rows.min(n - s)))
    }

    /// Without gradients: the log-probability `[b, T]` of each completion token (float32, 0 on
    /// padding), with `entropy` the entropy `[b, T]` of each slot's distribution (float32, 0
    /// on padding; three more passes over each chunk's logits), and the state `[b, h]`
    /// (float32): the hidden state at each prompt's last token, what PPO's value head reads.
    ///
    /// # Errors
    /// libtorch errors.
    pub fn log_probs(
        &self,
        model: &Qwen2,
        entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>, Tensor), ModelError> {
        let _g = tch::no_grad_guard();
        let flat = self.hidden(model);
        let (mut lp, mut ent) = (Vec::new(), Vec::new());
        for (start, len) in self.chunks() {
            let ls = self.chunk_log_softmax(model, &flat, start, len);
            lp.push(ls.f_gather(-1, &self.tgt.narrow(0, start, len), false)?);
            if entropy {
                ent.push(-(ls.exp() * &ls).sum_dim_intlist(-1, false, Kind::Float));
            }
        }
        let shape = self.mask.size();
        let logp = Tensor::f_cat(&lp, 0)?.view(shape.as_slice()) * &self.mask;
        let entropy = match entropy {
            true => Some(Tensor::f_cat(&ent, 0)?.view(shape.as_slice()) * &self.mask),
            false => None,
        };
        let state = flat.index_select(0, &self.last).to_kind(Kind::Float);
        Ok((logp, entropy, state))
    }

    /// Backpropagates `sum(logp * dlogp)` through the head, chunk by chunk, into the head's
    /// parameters and `leaf` (the normed hidden states `[b, w, h]`, a leaf).
    fn head_backward(
        &self,
        model: &Qwen2,
        leaf: &Tensor,
        dlogp: &Tensor,
    ) -> Result<(), ModelError> {
        let flat = leaf.reshape([-1, leaf.size()[2]]);
        let g = (dlogp * &self.mask).reshape([-1]);
        for (start, len) in self.chunks() {
            let lp = self
                .chunk_log_softmax(model, &flat, start, len)
                .gather(-1, &self.tgt.narrow(0, start, len), false)
                .squeeze_dim(-1);
            (lp * g.narrow(0, start, len))
                .sum(Kind::Float)
                .f_backward()?;
        }
        Ok(())
    }

    /// Accumulates into the parameters' `.grad` the gradient of `sum(logp * dlogp)`, `dlogp`
    /// `[b, T]` (float32: a loss's gradient with respect to [`Scored::log_probs`]' `logp`).
    /// Takes `self`: the graph is freed.
    ///
    /// # Errors
    /// libtorch errors; a `Scored` made under `no_grad` without checkpointing has no graph.
    pub fn backward(self, model: &Qwen2, dlogp: &Tensor) -> Result<(), ModelError> {
        match &self.trunk {
            Trunk::Graph(h) => {
                let leaf = h.detach().set_requires_grad(true);
                self.head_backward(model, &leaf, dlogp)?;
                (h * leaf.grad()).sum(Kind::Float).f_backward()?;
            }
            Trunk::Checkpointed(ck) => model.backward_from_checkpoints(ck, &mut |leaf| {
                self.head_backward(model, leaf, dlogp)
            })?,
        }
        Ok(())
    }

    /// The gradient of `sum(logp * dlogp)` with respect to each of `params` (the trained
    /// parameters; `None` where it does not reach one), keeping what a later
    /// [`Scored::backward`] needs. The parameters' `.grad` must be zero on entry, and is zero
    /// on return.
    ///
    /// # Errors
    /// libtorch errors.
    pub fn gradients(
        &self,
        model: &Qwen2,
        dlogp: &Tensor,
        params: &[Tensor],
    ) -> Result<Vec<Option<Tensor>>, ModelError> {
        match &self.trunk {
            Trunk::Graph(h) => {
                let leaf = h.detach().set_requires_grad(true);
                self.head_backward(model, &leaf, dlogp)?;
                let through = (h * leaf.grad()).sum(Kind::Float);
                let layers = Tensor::f_run_backward(&[through], params, true, false)?;
                let mut out = crate::rl::take_grads(params);
                for (o, l) in out.iter_mut().zip(layers) {
                    if l.defined() {
                        *o = Some(match o.take() {
                            Some(g) => g + l,
                            None => l,
                        });
                    }
                }
                Ok(out)
            }
            Trunk::Checkpointed(ck) => {
                model.backward_from_checkpoints(ck, &mut |leaf| {
                    self.head_backward(model, leaf, dlogp)
                })?;
                Ok(crate::rl::take_grads(params))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::{PgConfig, clipped_pg_loss};

    /// The plain computation: whole `[b, T, V]` logits of every completion slot, gathered
    /// from the hidden states with their graph; log-probabilities `[b, T]` and entropies.
    fn whole(m: &Qwen2, items: &[(&[i64], &[i64])], temp: f64) -> (Tensor, Tensor, Tensor) {
        let width = items.iter().map(|(p, c)| p.len() + c.len()).max().unwrap();
        let tmax = items.iter().map(|(_, c)| c.len()).max().unwrap();
        let b = items.len() as i64;
        let mut ids = Vec::new();
        let mut logps = Vec::new();
        let mut ents = Vec::new();
        for (p, c) in items {
            let mut row = p.to_vec();
            row.extend_from_slice(c);
            row.resize(width, 0);
            ids.extend(row);
        }
        let ids = Tensor::from_slice(&ids).view([b, width as i64]);
        let hidden = m.hidden(&ids, None, None, None).unwrap();
        let mut mask = Vec::new();
        for (i, (p, c)) in items.iter().enumerate() {
            let logits = m.head(&hidden.get(i as i64)) / temp;
            let ls = logits.log_softmax(-1, Kind::Float);
            for j in 0..tmax {
                let real = j < c.len();
                mask.push(if real { 1.0f32 } else { 0.0 });
                if real {
                    let at = ls.get((p.len() - 1 + j) as i64);
                    logps.push(at.get(c[j]));
                    ents.push(tch::no_grad(|| -(at.exp() * &at).sum(Kind::Float)));
                } else {
                    logps.push(Tensor::zeros([], (Kind::Float, m.device())));
                    ents.push(Tensor::zeros([], (Kind::Float, m.device())));
                }
            }
        }
        let shape = [b, tmax as i64];
        (
            Tensor::stack(&logps, 0).view(shape),
            Tensor::stack(&ents, 0).view(shape),
            Tensor::from_slice(&mask).view(shape),
        )
    }

    #[test]
    fn chunked_and_checkpointed_scoring_gives_the_whole_logits_values_and_gradients() {
        let _rng = crate::torch_rng();
        for tied in [true, false] {
            tch::manual_seed(5);
            let cfg = crate::config::Qwen2Config::new(50, 16, 32, 2, 4, 2, 64, tied);
            let m = Qwen2::new(cfg, tch::Device::Cpu).unwrap();
            let (p0, c0) = (vec![1i64, 7, 9, 3], vec![4i64, 4, 11]);
            let (p1, c1) = (vec![2i64, 8], vec![5i64, 6, 13, 21, 34]);
            let (p2, c2) = (vec![3i64, 1, 4, 1, 5, 9], vec![2i64]);
            let items: Vec<(&[i64], &[i64])> = vec![(&p0, &c0), (&p1, &c1), (&p2, &c2)];
            let temp = 0.7;
            let params = m.vs.trainable_variables();
            // A clipped-ratio loss and a k3 KL of the log-probabilities, against fixed old and
            // reference values around them.
            let losses = |logp: &Tensor, mask: &Tensor| {
                let shift = Tensor::from_slice(&[0.3f32, -0.2, 0.1, 0.05, -0.4])
                    .repeat([3])
                    .narrow(0, 0, 15)
                    .view([3, 5]);
                let fixed = tch::no_grad(|| (logp + &shift) * mask);
                let refp = tch::no_grad(|| (logp - &shift * 2.0) * mask);
                let adv = Tensor::from_slice(&[1.0f32, -0.5, 2.0]);
                let cfg = PgConfig {
                    clip: 0.1,
                    kl_coef: 0.5,
                    aux_grad_cap: None,
                };
                let l = clipped_pg_loss(logp, &fixed, Some(&refp), &adv, mask, &cfg);
                (l.pg, l.kl)
            };
            let (lp, ent, mask) = whole(&m, &items, temp);
            let (pg, kl) = losses(&lp, &mask);
            let want_pg = Tensor::run_backward(&[&pg], &params, true, false);
            let want_kl = Tensor::run_backward(&[&kl], &params, false, false);
            // 4 slots a chunk (4 chunks over 15 slots, one short), with and without activation
            // checkpointing; and every slot in one chunk.
            let four = 4 * 50 * 4;
            for (chunk_bytes, checkpoint) in [(four, false), (four, true), (1 << 20, false)] {
                let what = format!("tied {tied}, chunk {chunk_bytes}, checkpoint {checkpoint}");
                let pass = ScorePass {
                    chunk_bytes,
                    checkpoint,
                };
                let sc = Scored::new(&m, &items, temp, pass).unwrap();
                let (logp, entropy, state) = sc.log_probs(&m, true).unwrap();
                let entropy = entropy.unwrap();
                assert!(sc.log_probs(&m, false).unwrap().1.is_none());
                assert_eq!(state.size(), [3, 16]);
                let close = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
                assert_eq!(close(&sc.mask, &mask), 0.0, "{what}");
                assert!(close(&logp, &lp) < 1e-5, "{what}");
                assert!(close(&entropy, &ent) < 1e-5, "{what}");
                assert!(entropy.sum(Kind::Float).double_value(&[]) > 1.0, "{what}");
                let leaf = logp.detach().set_requires_grad(true);
                let (pg, kl) = losses(&leaf, &sc.mask);
                let d = |l: &Tensor| Tensor::run_backward(&[l], &[&leaf], true, false).remove(0);
                let (d_pg, d_kl) = (d(&pg), d(&kl));
                for p in &params {
                    let mut g = p.grad();
                    if g.defined() {
                        let _ = g.zero_();
                    }
                }
                let got_pg = sc.gradients(&m, &d_pg, &params).unwrap();
                for p in &params {
                    let g = p.grad();
                    assert!(
                        !g.defined() || g.abs().max().double_value(&[]) == 0.0,
                        "{what}"
                    );
                }
                sc.backward(&m, &d_kl).unwrap();
                for (i, p) in params.iter().enumerate() {
                    let g = got_pg[i]
                        .as_ref()
                        .expect("the policy gradient reaches every weight");
                    let (w, wk) = (&want_pg[i], &want_kl[i]);
                    assert!(w.abs().max().double_value(&[]) > 0.0, "{what}");
                    assert!(
                        close(g, w) < 1e-5,
                        "{what}: policy gradient of parameter {i}"
                    );
                    assert!(
                        close(&p.grad(), wk) < 1e-5,
                        "{what}: KL gradient of parameter {i}"
                    );
                }
            }
        }
    }
}
