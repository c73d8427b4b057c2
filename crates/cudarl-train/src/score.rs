//! Scoring sampled completions for a policy-gradient update in bounded memory: the LM head
//! and its log-softmax run over chunks of completion positions, so the `[b, T, V]` logits of
//! a minibatch (2.5 GB in float32 for 8 x 512 tokens at a 152k vocabulary, and as much again
//! for their log-softmax and its gradient) never exist at once, and with activation
//! checkpointing the layers keep only their inputs. The loss's gradient with respect to the
//! per-token log-probabilities (a `[b, T]` tensor) is backpropagated through the head chunk by
//! chunk, then through the layers once: the two-stage backward of chunked cross-entropy
//! (`train::chunked_loss`) for a loss of the log-probabilities. Where that loss is a sum of
//! per-token terms (the clipped ratio and the k3 KL, whose gradients
//! `crate::rl::clipped_pg_grads` gives in closed form), one pass of the head scores and
//! differentiates each chunk ([`Scored::backward_fused`]); otherwise [`Scored::log_probs`] and
//! [`Scored::backward`] run the head once each.
//! Measured in `benchmarks/results/model_scale_h200_2026-11-30.json` (`grpo_update`).

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

    /// Leaves the completion tokens `spans[i] = (start, len)` of row `i` out of [`Scored::mask`]
    /// (tokens constrained decoding wrote, which the policy did not draw). Rows past `spans`'
    /// length and `None` spans keep every token.
    pub fn exclude(&mut self, spans: &[Option<(usize, usize)>]) {
        if spans.iter().all(Option::is_none) {
            return;
        }
        let (b, t) = self.mask.size2().expect("the mask is [b, T]");
        let mut keep = vec![1.0f32; (b * t) as usize];
        for (i, span) in spans.iter().enumerate().take(b as usize) {
            if let Some((start, len)) = *span {
                let row = i * t as usize;
                let end = (start + len).min(t as usize);
                keep[row + start.min(end)..row + end].fill(0.0);
            }
        }
        let keep = Tensor::from_slice(&keep)
            .view([b, t])
            .to_device(self.mask.device());
        self.mask = &self.mask * keep;
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
        Ok((logp, entropy, self.state_of(&flat)))
    }

    /// The hidden state `[b, h]` (float32, no graph) at each prompt's last token: what PPO's
    /// value head reads (as [`Scored::log_probs`] returns it).
    pub fn state(&self, model: &Qwen2) -> Tensor {
        self.state_of(&self.hidden(model))
    }

    /// [`Scored::state`] read from the flat hidden states `[b * w, h]`.
    fn state_of(&self, flat: &Tensor) -> Tensor {
        tch::no_grad(|| flat.index_select(0, &self.last).to_kind(Kind::Float))
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

    /// One pass of the head over the chunks that scores and differentiates at once: per chunk
    /// the log-probabilities with their graph, `grads` of them, and the first gradient's
    /// backward through the head into its parameters and `leaf` (`[b, w, h]`). Returns the
    /// log-probabilities and the other gradients.
    fn head_fused(
        &self,
        model: &Qwen2,
        leaf: &Tensor,
        grads: &SlotGrads<'_>,
    ) -> Result<Fused, ModelError> {
        let flat = leaf.reshape([-1, leaf.size()[2]]);
        let shape = self.mask.size();
        let mask = self.mask.reshape([-1]);
        let logp = mask.zeros_like();
        let mut rest: Vec<Vec<Tensor>> = Vec::new();
        for (start, len) in self.chunks() {
            let lp = self
                .chunk_log_softmax(model, &flat, start, len)
                .gather(-1, &self.tgt.narrow(0, start, len), false)
                .squeeze_dim(-1);
            let m = mask.narrow(0, start, len);
            tch::no_grad(|| logp.narrow(0, start, len).f_copy_(&(lp.detach() * &m)))?;
            let mut gs = grads(&logp.view(shape.as_slice()))?
                .into_iter()
                .map(|g| g.reshape([-1]).narrow(0, start, len) * &m);
            let first = gs.next().ok_or_else(|| {
                ModelError::Generate("a scoring pass's gradient function returned none".into())
            })?;
            (lp * first).sum(Kind::Float).f_backward()?;
            for (i, g) in gs.enumerate() {
                match rest.get_mut(i) {
                    Some(parts) => parts.push(g),
                    None => rest.push(vec![g]),
                }
            }
        }
        let rest = rest
            .iter()
            .map(|parts| Ok(Tensor::f_cat(parts, 0)?.view(shape.as_slice())))
            .collect::<Result<_, ModelError>>()?;
        Ok(Fused {
            logp: logp.view(shape.as_slice()),
            rest,
        })
    }

    /// Runs `head` (which backpropagates a loss into the leaf it gets: the normed hidden
    /// states `[b, w, h]`) and then the layers' backward. With `params`, the layers' gradients
    /// are returned (with the `.grad` they accumulated taken out, [`crate::rl::take_grads`])
    /// and the graph kept; without, they accumulate into `.grad` and the graph is freed.
    fn through_layers(
        &self,
        model: &Qwen2,
        params: Option<&[Tensor]>,
        head: &mut dyn FnMut(&Tensor) -> Result<(), ModelError>,
    ) -> Result<Option<Vec<Option<Tensor>>>, ModelError> {
        match (&self.trunk, params) {
            (Trunk::Graph(h), None) => {
                let leaf = h.detach().set_requires_grad(true);
                head(&leaf)?;
                (h * leaf.grad()).sum(Kind::Float).f_backward()?;
                Ok(None)
            }
            (Trunk::Graph(h), Some(params)) => {
                let leaf = h.detach().set_requires_grad(true);
                head(&leaf)?;
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
                Ok(Some(out))
            }
            (Trunk::Checkpointed(ck), params) => {
                model.backward_from_checkpoints(ck, head)?;
                Ok(params.map(crate::rl::take_grads))
            }
        }
    }

    /// Accumulates into the parameters' `.grad` the gradient of `sum(logp * dlogp)`, `dlogp`
    /// `[b, T]` (float32: a loss's gradient with respect to [`Scored::log_probs`]' `logp`).
    /// Takes `self`: the graph is freed.
    ///
    /// # Errors
    /// libtorch errors; a `Scored` made under `no_grad` without checkpointing has no graph.
    pub fn backward(self, model: &Qwen2, dlogp: &Tensor) -> Result<(), ModelError> {
        self.through_layers(model, None, &mut |leaf| {
            self.head_backward(model, leaf, dlogp)
        })?;
        Ok(())
    }

    /// Scores and differentiates in one pass of the head (where [`Scored::log_probs`] then
    /// [`Scored::backward`] run it twice): accumulates into the parameters' `.grad` the
    /// gradient of `sum(logp * g)` for the first gradient `g` `grads` returns, and returns the
    /// log-probabilities `[b, T]` (float32, 0 on padding, no graph) with the other gradients
    /// `[b, T]`. Takes `self`: the graph is freed.
    ///
    /// # Errors
    /// libtorch errors; `grads` returns none or errs; no graph (as [`Scored::backward`]).
    pub fn backward_fused(self, model: &Qwen2, grads: &SlotGrads<'_>) -> Result<Fused, ModelError> {
        let mut out = None;
        self.through_layers(model, None, &mut |leaf| {
            out = Some(self.head_fused(model, leaf, grads)?);
            Ok(())
        })?;
        out.ok_or_else(|| ModelError::Generate("the scoring pass ran no head".into()))
    }

    /// [`Scored::backward_fused`], keeping what a later [`Scored::backward`] needs: the
    /// gradient of the first loss with respect to each of `params` (the trained parameters;
    /// `None` where it does not reach one), with the log-probabilities and the other
    /// gradients. The parameters' `.grad` must be zero or undefined on entry, and is so on
    /// return.
    ///
    /// # Errors
    /// As [`Scored::backward_fused`].
    pub fn gradients_fused(
        &self,
        model: &Qwen2,
        grads: &SlotGrads<'_>,
        params: &[Tensor],
    ) -> Result<(Vec<Option<Tensor>>, Fused), ModelError> {
        let mut out = None;
        let g = self.through_layers(model, Some(params), &mut |leaf| {
            out = Some(self.head_fused(model, leaf, grads)?);
            Ok(())
        })?;
        match (g, out) {
            (Some(g), Some(f)) => Ok((g, f)),
            _ => Err(ModelError::Generate("the scoring pass ran no head".into())),
        }
    }
}

/// The gradients `[b, T]` (float32) of one or more losses with respect to the log-probabilities
/// `[b, T]` they are given, each loss a sum of per-slot terms: the gradient at a slot depends on
/// that slot's log-probability alone ([`crate::rl::clipped_pg_grads`]). The fused passes call it
/// once per chunk of the head, with the slots scored so far filled in and zeros elsewhere, and
/// read the chunk's own slots of what it returns.
pub type SlotGrads<'a> = dyn Fn(&Tensor) -> Result<Vec<Tensor>, ModelError> + 'a;

/// What a fused pass ([`Scored::backward_fused`]) returns besides the gradients.
pub struct Fused {
    /// `[b, T]` (float32): the log-probability of each completion token, 0 on padding, no
    /// graph (what [`Scored::log_probs`] returns).
    pub logp: Tensor,
    /// The gradients [`SlotGrads`] returned after the first, each `[b, T]` (float32), 0 on
    /// padding.
    pub rest: Vec<Tensor>,
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
            let (lp, ent, mask) = whole(&m, &items, temp);
            // A clipped-ratio loss and a k3 KL of the log-probabilities, against fixed old and
            // reference values around them.
            let shift = Tensor::from_slice(&[0.3f32, -0.2, 0.1, 0.05, -0.4])
                .repeat([3])
                .narrow(0, 0, 15)
                .view([3, 5]);
            let old = tch::no_grad(|| (&lp + &shift) * &mask);
            let refp = tch::no_grad(|| (&lp - &shift * 2.0) * &mask);
            let adv = Tensor::from_slice(&[1.0f32, -0.5, 2.0]);
            let cfg = PgConfig {
                clip: 0.1,
                kl_coef: 0.5,
                aux_grad_cap: None,
            };
            let losses = |logp: &Tensor| {
                let l = clipped_pg_loss(logp, &old, Some(&refp), &adv, &mask, &cfg);
                (l.pg, l.kl)
            };
            let (pg, kl) = losses(&lp);
            let want_pg = Tensor::run_backward(&[&pg], &params, true, false);
            let want_kl = Tensor::run_backward(&[&kl], &params, true, false);
            let want_sum = Tensor::run_backward(&[&(pg + kl)], &params, false, false);
            // The two gradients of the log-probabilities, by autograd through the loss.
            let slot_grads = |logp: &Tensor| -> Result<Vec<Tensor>, ModelError> {
                let leaf = logp.detach().set_requires_grad(true);
                let (pg, kl) = losses(&leaf);
                let d = |l: &Tensor| Tensor::run_backward(&[l], &[&leaf], true, false).remove(0);
                Ok(vec![d(&pg), d(&kl)])
            };
            let summed = |logp: &Tensor| -> Result<Vec<Tensor>, ModelError> {
                let g = slot_grads(logp)?;
                Ok(vec![&g[0] + &g[1]])
            };
            let close = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
            let clear = || {
                for p in &params {
                    crate::cuda_graph::reset_grad(&mut p.shallow_clone());
                }
            };
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
                assert_eq!(close(&sc.state(&m), &state), 0.0, "{what}");
                assert_eq!(close(&sc.mask, &mask), 0.0, "{what}");
                assert!(close(&logp, &lp) < 1e-5, "{what}");
                assert!(close(&entropy, &ent) < 1e-5, "{what}");
                assert!(entropy.sum(Kind::Float).double_value(&[]) > 1.0, "{what}");
                // The policy gradient apart in the fused pass, then the KL gradient it returned
                // through `backward`.
                clear();
                let (got_pg, fused) = sc.gradients_fused(&m, &slot_grads, &params).unwrap();
                assert!(close(&fused.logp, &lp) < 1e-5, "{what}");
                for p in &params {
                    let g = p.grad();
                    assert!(
                        !g.defined() || g.abs().max().double_value(&[]) == 0.0,
                        "{what}"
                    );
                }
                let [d_kl] = <[Tensor; 1]>::try_from(fused.rest).unwrap();
                let want_d_kl = slot_grads(&lp).unwrap().remove(1);
                assert!(close(&d_kl, &want_d_kl) < 1e-7, "{what}");
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
                // Both in one fused pass.
                clear();
                let sc = Scored::new(&m, &items, temp, pass).unwrap();
                let fused = sc.backward_fused(&m, &summed).unwrap();
                assert!(close(&fused.logp, &lp) < 1e-5, "{what}");
                assert!(fused.rest.is_empty());
                for (i, p) in params.iter().enumerate() {
                    assert!(
                        close(&p.grad(), &want_sum[i]) < 1e-5,
                        "{what}: summed gradient of parameter {i}"
                    );
                }
            }
        }
    }
}
