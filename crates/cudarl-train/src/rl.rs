//! The clipped-ratio policy loss with a KL penalty to the frozen reference policy, averaged over
//! the agent's own tokens (the advantages come from the caller: `cudarl_rl::credit`).
//!
//! Sources: GRPO, Shao et al., "DeepSeekMath", arXiv:2402.03300 (group-normalized advantages,
//! KL to the reference in the loss, k3 estimator); PPO, Schulman et al., arXiv:1707.06347
//! (clipped ratio, epsilon 0.2); GAE, Schulman et al., arXiv:1506.02438; the k3 KL estimator,
//! J. Schulman, "Approximating KL Divergence" (2020); token-level averaging over all tokens of
//! the batch, Yu et al., "DAPO", arXiv:2503.14476.

use serde::{Deserialize, Serialize};
use tch::{Kind, TchError, Tensor};

pub use cudarl_protocol::PgConfig;
pub use cudarl_protocol::rl::KL_CLAMP;

/// The loss and what it is made of (detached scalars).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PgStats {
    /// Total loss.
    pub loss: f64,
    /// Clipped-surrogate part.
    pub pg_loss: f64,
    /// Mean k3 KL estimate to the reference per token.
    pub kl: f64,
    /// Fraction of tokens whose ratio was clipped.
    pub clip_frac: f64,
    /// Tokens in the loss.
    pub tokens: f64,
    /// The largest per-token `|ref_logp - logp|` (nats; 0 without a reference).
    pub max_log_ratio: f64,
}

/// [`clipped_pg_loss`]'s result: the clipped surrogate and the weighted KL penalty apart
/// (scalar tensors; [`cap_auxiliary`] combines their gradients), and the stats.
pub struct PgLoss {
    /// `mean_tokens[ -min(rho A, clip(rho, 1-eps, 1+eps) A) ]`.
    pub pg: Tensor,
    /// `beta * mean_tokens[KL_k3]` (0 without a reference).
    pub kl: Tensor,
    /// Detached scalars.
    pub stats: PgStats,
}

impl PgLoss {
    /// The loss `pg + kl`.
    pub fn total(&self) -> Tensor {
        &self.pg + &self.kl
    }
}

/// The ratio `rho = exp(logp - old_logp)` and PPO's two surrogates `rho A` and
/// `clip(rho, 1 - eps, 1 + eps) A`, each `[b, T]` (`adv` `[b]` broadcast over the tokens).
fn surrogates(
    logp: &Tensor,
    old_logp: &Tensor,
    adv: &Tensor,
    clip: f64,
) -> (Tensor, Tensor, Tensor) {
    let a = adv.unsqueeze(-1);
    let ratio = (logp - old_logp).exp();
    let s1 = &ratio * &a;
    let s2 = ratio.clamp(1.0 - clip, 1.0 + clip) * &a;
    (ratio, s1, s2)
}

/// The clipped-ratio policy loss with a KL penalty, averaged over every real token of the batch:
/// `L = mean_tokens[ -min(rho A, clip(rho, 1-eps, 1+eps) A) + beta * KL_k3 ]` with
/// `rho = exp(logp - old_logp)` and `KL_k3 = min(exp(d) - d - 1, KL_CLAMP)`,
/// `d = clamp(ref - logp, -20, 20)` ([`KL_CLAMP`]), its two terms apart ([`PgLoss`]).
///
/// Shapes: `logp`, `old_logp`, `ref_logp`, `mask` `[b, T]` (float32; `mask` 1 on the agent's own
/// tokens), `adv` `[b]` (one advantage per completion, broadcast over its tokens).
pub fn clipped_pg_loss(
    logp: &Tensor,
    old_logp: &Tensor,
    ref_logp: Option<&Tensor>,
    adv: &Tensor,
    mask: &Tensor,
    cfg: &PgConfig,
) -> PgLoss {
    let n = mask.sum(Kind::Float).clamp_min(1.0);
    let (ratio, s1, s2) = surrogates(logp, old_logp, adv, cfg.clip);
    let pg = -(s1.minimum(&s2) * mask).sum(Kind::Float) / &n;
    let (kl, max_log_ratio) = match ref_logp {
        Some(r) => {
            let raw = r - logp;
            let max = tch::no_grad(|| (raw.abs() * mask).max().double_value(&[]));
            let d = raw.clamp(-20.0, 20.0);
            let k3 = (d.exp() - &d - 1.0).clamp(-KL_CLAMP, KL_CLAMP);
            ((k3 * mask).sum(Kind::Float) / &n, max)
        }
        None => (Tensor::zeros([], (Kind::Float, logp.device())), 0.0),
    };
    let kl_term = &kl * cfg.kl_coef;
    let loss = &pg + &kl_term;
    let clipped = tch::no_grad(|| {
        (ratio
            .gt(1.0 + cfg.clip)
            .logical_or(&ratio.lt(1.0 - cfg.clip))
            .to_kind(Kind::Float)
            * mask)
            .sum(Kind::Float)
            / &n
    });
    let stats = PgStats {
        loss: loss.double_value(&[]),
        pg_loss: pg.double_value(&[]),
        kl: kl.double_value(&[]),
        clip_frac: clipped.double_value(&[]),
        tokens: n.double_value(&[]),
        max_log_ratio,
    };
    PgLoss {
        pg,
        kl: kl_term,
        stats,
    }
}

/// The gradients `[b, T]` (float32) of [`clipped_pg_loss`]'s two terms, `pg` and `kl`, with
/// respect to `logp`, in closed form: no autograd graph and no device-to-host read. Per real
/// token, with `n` the number of real tokens:
/// `d pg / d logp = -A rho / n` where the unclipped surrogate is the smaller one or `rho` lies
/// inside `[1 - eps, 1 + eps]`, 0 elsewhere; `d kl / d logp = beta (1 - exp(d)) / n` where
/// neither the clamp of `d = ref - logp` to `[-20, 20]` nor [`KL_CLAMP`] is active, 0
/// elsewhere (0 without a reference). These are the gradients autograd takes through
/// `clipped_pg_loss` (ties of its `minimum` split evenly, as libtorch's backward does). A
/// slot's gradient depends on that slot's log-probability alone, which
/// [`crate::score::Scored::backward_fused`] relies on. Shapes as in [`clipped_pg_loss`].
pub fn clipped_pg_grads(
    logp: &Tensor,
    old_logp: &Tensor,
    ref_logp: Option<&Tensor>,
    adv: &Tensor,
    mask: &Tensor,
    cfg: &PgConfig,
) -> (Tensor, Tensor) {
    tch::no_grad(|| {
        let weight = mask / mask.sum(Kind::Float).clamp_min(1.0);
        let (ratio, s1, s2) = surrogates(logp, old_logp, adv, cfg.clip);
        let inside = ratio
            .ge(1.0 - cfg.clip)
            .logical_and(&ratio.le(1.0 + cfg.clip));
        let active = s1.lt_tensor(&s2).logical_or(&inside);
        let d_pg = -(s1 * active.to_kind(Kind::Float)) * &weight;
        let d_kl = match ref_logp {
            Some(r) => {
                let raw = r - logp;
                let d = raw.clamp(-20.0, 20.0);
                let e = d.exp();
                let k3 = &e - &d - 1.0;
                let live = raw
                    .abs()
                    .le(20.0)
                    .logical_and(&k3.abs().le(KL_CLAMP))
                    .to_kind(Kind::Float);
                (1.0 - e) * live * weight * cfg.kl_coef
            }
            None => logp.zeros_like(),
        };
        (d_pg, d_kl)
    })
}

/// How [`cap_auxiliary`] combined the two gradients of one minibatch step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AuxCap {
    /// `||g_aux|| / max(||g_pg||, 1e-12)` before scaling (global L2 norms over every trained
    /// parameter).
    pub ratio: f64,
    /// The factor `g_aux` was multiplied by: `min(1, cap * ||g_pg|| / ||g_aux||)`.
    pub scale: f64,
}

/// Each of `params`' gradient, copied out (`None` where it has none), with `.grad` zeroed.
pub fn take_grads(params: &[Tensor]) -> Vec<Option<Tensor>> {
    tch::no_grad(|| {
        params
            .iter()
            .map(|p| {
                let mut g = p.grad();
                g.defined().then(|| {
                    let out = g.copy();
                    let _ = g.zero_();
                    out
                })
            })
            .collect()
    })
}

/// Leaves `g_pg + s * g_aux` in each parameter's gradient, with `g_pg` the gradient of the
/// policy-gradient loss (`gp`, one per parameter of `params`, `None` where the loss does not
/// reach it: [`take_grads`] after its backward), `g_aux` that of the auxiliary terms (the KL
/// penalty and PPO-ptx's cross-entropy, already weighted), which `.grad` holds on entry, and
/// `s = min(1, cap * ||g_pg|| / ||g_aux||)` over the global L2 norms. With `cap <= 1`,
/// `<g_pg, g_pg + s g_aux> >= (1 - cap) ||g_pg||^2 >= 0`: a step along the sum never lowers
/// the policy-gradient objective to first order, however large the KL or SFT terms are (the
/// norm balancing of multi-task training, Chen et al., "GradNorm", arXiv:1711.02257, reduced to a
/// ceiling).
///
/// # Errors
/// libtorch errors.
pub fn cap_auxiliary(
    gp: &[Option<Tensor>],
    params: &[Tensor],
    cap: f64,
) -> Result<AuxCap, TchError> {
    // One device-to-host read per norm, not one per parameter.
    let norm = |gs: &mut dyn Iterator<Item = Tensor>| -> f64 {
        let sq: Vec<Tensor> = gs
            .map(|g| g.to_kind(Kind::Float).square().sum(Kind::Float))
            .collect();
        if sq.is_empty() {
            return 0.0;
        }
        Tensor::stack(&sq, 0)
            .sum(Kind::Float)
            .sqrt()
            .double_value(&[])
    };
    let (np, na) = tch::no_grad(|| {
        (
            norm(&mut gp.iter().flatten().map(|g| g.shallow_clone())),
            norm(&mut params.iter().map(|p| p.grad()).filter(|g| g.defined())),
        )
    });
    let ratio = na / np.max(1e-12);
    let scale = if na > cap * np { cap * np / na } else { 1.0 };
    // A parameter the auxiliary terms did not reach and that has no `.grad` yet gets its
    // policy gradient through a backward of `<p, g_pg>`.
    let mut surrogate: Option<Tensor> = None;
    for (p, a) in params.iter().zip(gp) {
        let mut g = p.grad();
        if g.defined() {
            tch::no_grad(|| {
                let _ = g.f_mul_(&Tensor::from(scale))?;
                if let Some(a) = a {
                    let _ = g.f_add_(a)?;
                }
                Ok::<_, TchError>(())
            })?;
        } else if let Some(a) = a {
            let term = (p * a.detach()).sum(Kind::Float);
            surrogate = Some(match surrogate {
                Some(s) => s + term,
                None => term,
            });
        }
    }
    if let Some(s) = surrogate {
        s.f_backward()?;
    }
    Ok(AuxCap { ratio, scale })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipped_loss_on_a_fixed_batch() {
        // Two completions, three token slots; the second has two real tokens.
        let mask = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 1.0, 1.0, 0.0]).view([2, 3]);
        let old = Tensor::from_slice(&[-1.0f32, -1.0, -1.0, -2.0, -2.0, 0.0]).view([2, 3]);
        // Ratios exp(0.5) = 1.6487 (clipped at 1.2 for A > 0), 1, exp(-0.5) = 0.6065 (clipped
        // at 0.8 for A < 0 only when that is the smaller objective).
        let new = Tensor::from_slice(&[-0.5f32, -1.0, -1.5, -2.5, -2.0, 0.0]).view([2, 3]);
        let adv = Tensor::from_slice(&[1.0f32, -1.0]);
        let cfg = PgConfig {
            clip: 0.2,
            kl_coef: 0.0,
            aux_grad_cap: None,
        };
        let l = clipped_pg_loss(&new, &old, None, &adv, &mask, &cfg);
        let (loss, st) = (l.total(), l.stats);
        // Row 0 (A = 1): min(1.6487, 1.2) = 1.2; min(1, 1) = 1; min(0.6065, 0.6065) = 0.6065.
        // Row 1 (A = -1): min(-0.6065, -0.8) = -0.8; min(-1, -1) = -1.
        let want = -(1.2 + 1.0 + (-0.5f64).exp() - 0.8 - 1.0) / 5.0;
        assert!((st.pg_loss - want).abs() < 1e-6, "{} vs {want}", st.pg_loss);
        assert!((loss.double_value(&[]) - want).abs() < 1e-6);
        // Ratios outside [0.8, 1.2]: 1.6487, 0.6065 (row 0), 0.6065 (row 1): 3 of 5 tokens.
        assert!((st.clip_frac - 0.6).abs() < 1e-6, "{}", st.clip_frac);
        assert_eq!(st.tokens, 5.0);
        // KL to a reference equal to the policy is 0; to another one it is positive.
        let cfg = PgConfig {
            clip: 0.2,
            kl_coef: 0.1,
            aux_grad_cap: None,
        };
        let same = clipped_pg_loss(&new, &old, Some(&new), &adv, &mask, &cfg).stats;
        assert!(same.kl.abs() < 1e-7);
        let other = clipped_pg_loss(&new, &old, Some(&old), &adv, &mask, &cfg).stats;
        // k3 with d = ref - new: row 0 d = -0.5, 0, 0.5; row 1 d = 0.5, 0.
        let k3 = |d: f64| d.exp() - d - 1.0;
        let kl = (k3(-0.5) + k3(0.5) + k3(0.5)) / 5.0;
        assert!((other.kl - kl).abs() < 1e-6, "{} vs {kl}", other.kl);
        assert!((other.loss - (want + 0.1 * kl)).abs() < 1e-6);
        assert!((other.max_log_ratio - 0.5).abs() < 1e-6, "{other:?}");
        // A reference 30 nats above the policy on one token: k3 would be e^30, about 1e13;
        // it counts KL_CLAMP, and the largest log-ratio says how far the token went.
        let far = Tensor::from_slice(&[30.0f32, 0.0, 0.0, 0.0, 0.0, 0.0]).view([2, 3]);
        let clamped = clipped_pg_loss(&new, &old, Some(&(&new + &far)), &adv, &mask, &cfg).stats;
        assert!(clamped.kl <= KL_CLAMP / 5.0 + 1e-6, "{clamped:?}");
        assert!((clamped.max_log_ratio - 30.0).abs() < 1e-4, "{clamped:?}");
    }

    #[test]
    fn the_closed_form_gradients_are_autograds_through_the_loss() {
        let _rng = crate::torch_rng();
        tch::manual_seed(11);
        let cpu = (Kind::Float, tch::Device::Cpu);
        // Log-ratios to the sampling policy of up to +-0.6 (so that many ratios are clipped),
        // a reference up to 30 nats away (the clamps of d and of k3), a padded tail.
        let logp = Tensor::rand([4, 64], cpu) * -5.0;
        let old = &logp + (Tensor::rand([4, 64], cpu) - 0.5) * 1.2;
        let refp = &logp + (Tensor::rand([4, 64], cpu) - 0.5) * 8.0;
        let _ = refp.narrow(1, 0, 3).g_add_scalar_(30.0);
        let _ = refp.narrow(1, 3, 3).g_add_scalar_(-25.0);
        let mask = Tensor::ones([4, 64], cpu);
        let _ = mask.narrow(1, 50, 14).narrow(0, 1, 2).fill_(0.0);
        let adv = Tensor::from_slice(&[1.5f32, -0.7, 0.0, -2.0]);
        let cfg = PgConfig {
            clip: 0.2,
            kl_coef: 0.3,
            aux_grad_cap: None,
        };
        for reference in [Some(&refp), None] {
            let leaf = logp.detach().set_requires_grad(true);
            let l = clipped_pg_loss(&leaf, &old, reference, &adv, &mask, &cfg);
            let d = |t: &Tensor| Tensor::run_backward(&[t], &[&leaf], true, false).remove(0);
            // Without a reference the KL term is a constant 0, with no graph.
            let want_kl = match reference {
                Some(_) => d(&l.kl),
                None => logp.zeros_like(),
            };
            let want_pg = d(&l.pg);
            let (got_pg, got_kl) = clipped_pg_grads(&logp, &old, reference, &adv, &mask, &cfg);
            let err = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
            assert!(
                err(&got_pg, &want_pg) < 1e-7,
                "pg: {}",
                err(&got_pg, &want_pg)
            );
            assert!(
                err(&got_kl, &want_kl) < 1e-7,
                "kl: {}",
                err(&got_kl, &want_kl)
            );
            assert!(l.stats.clip_frac > 0.1, "{:?}", l.stats);
            assert!(want_pg.abs().sum(Kind::Float).double_value(&[]) > 0.0);
            if reference.is_some() {
                // Both clamps are hit, and not every gradient is cut.
                let zero = want_kl.eq(0.0).logical_and(&mask.gt(0.0));
                let cut = zero.sum(Kind::Int64).int64_value(&[]);
                assert!((6..200).contains(&cut), "{cut} slots without a KL gradient");
            }
        }
    }

    #[test]
    fn gradient_pushes_up_positive_advantage_tokens() {
        let logits = Tensor::zeros([1, 4], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let logp = logits.log_softmax(-1, Kind::Float).narrow(1, 0, 2); // tokens 0 and 1
        let old = logp.detach();
        let mask = Tensor::ones([1, 2], (Kind::Float, tch::Device::Cpu));
        let loss = clipped_pg_loss(
            &logp,
            &old,
            None,
            &Tensor::from_slice(&[1.0f32]),
            &mask,
            &PgConfig::default(),
        )
        .total();
        loss.backward();
        let g = Vec::<f32>::try_from(logits.grad().view([-1])).unwrap();
        // Descending the loss raises the logits of the sampled tokens and lowers the others.
        assert!(
            g[0] < 0.0 && g[1] < 0.0 && g[2] > 0.0 && g[3] > 0.0,
            "{g:?}"
        );
    }

    /// Logits `[1, 4]` as the only parameter; the policy gradient raises token 0 (advantage 1),
    /// a KL term 1000x stronger pulls toward a reference on token 1.
    fn opposed_losses(logits: &Tensor) -> (Tensor, Tensor) {
        let logp = logits.log_softmax(-1, Kind::Float);
        let mask = Tensor::ones([1, 1], (Kind::Float, tch::Device::Cpu));
        let lp0 = logp.narrow(1, 0, 1);
        let pg = clipped_pg_loss(
            &lp0,
            &lp0.detach(),
            None,
            &Tensor::from_slice(&[1.0f32]),
            &mask,
            &PgConfig::default(),
        )
        .pg;
        let reference = Tensor::from_slice(&[-6.0f32, -0.01, -6.0, -6.0]).view([1, 4]);
        let kl = (logp.exp() * (&logp - reference)).sum(Kind::Float) * 1000.0;
        (pg, kl)
    }

    fn grad_of(logits: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(logits.grad().view([-1])).unwrap()
    }

    /// The gradient of `pg` apart, that of `aux` accumulated, and the two combined by
    /// [`cap_auxiliary`] with a ceiling of 1.
    fn capped_step(pg: &Tensor, aux: &Tensor, params: &[Tensor]) -> AuxCap {
        let gp: Vec<Option<Tensor>> = Tensor::run_backward(&[pg], params, true, false)
            .into_iter()
            .map(|g| g.defined().then_some(g))
            .collect();
        aux.backward();
        cap_auxiliary(&gp, params, 1.0).unwrap()
    }

    #[test]
    fn a_capped_auxiliary_gradient_cannot_outweigh_the_policy_gradient() {
        let mut logits =
            Tensor::zeros([1, 4], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let params = [logits.shallow_clone()];
        // The policy gradient alone.
        let (pg, _) = opposed_losses(&logits);
        pg.backward();
        let gp = grad_of(&logits);
        let dot = |g: &[f32]| g.iter().zip(&gp).map(|(a, b)| a * b).sum::<f32>();
        // Summed as before, the KL term's gradient turns the step against the policy gradient.
        logits.zero_grad();
        let (pg, kl) = opposed_losses(&logits);
        (pg + kl).backward();
        let summed = grad_of(&logits);
        assert!(dot(&summed) < 0.0, "{summed:?} vs {gp:?}");
        // Capped at 1: scaled down to the policy gradient's norm, the step still raises the
        // advantaged token's log-probability.
        logits.zero_grad();
        let (pg, kl) = opposed_losses(&logits);
        let c = capped_step(&pg, &kl, &params);
        let capped = grad_of(&logits);
        assert!(c.ratio > 100.0, "{c:?}");
        assert!((c.scale - 1.0 / c.ratio).abs() < 1e-9, "{c:?}");
        assert!(dot(&capped) >= 0.0, "{capped:?} vs {gp:?}");
        let stepped = tch::no_grad(|| &logits - Tensor::from_slice(&capped).view([1, 4]));
        let p0 = stepped.softmax(-1, Kind::Float).double_value(&[0, 0]);
        assert!(p0 >= 0.25 - 1e-6, "token 0 fell to {p0}");
        // A weak auxiliary term passes unscaled: the gradient is the plain sum.
        logits.zero_grad();
        let (pg, kl) = opposed_losses(&logits);
        let c = capped_step(&pg, &(kl * 1e-6), &params);
        assert_eq!(c.scale, 1.0);
        assert!(c.ratio < 1.0, "{c:?}");
        let weak = grad_of(&logits);
        logits.zero_grad();
        let (pg, kl) = opposed_losses(&logits);
        (pg + kl * 1e-6).backward();
        let plain = grad_of(&logits);
        for (a, b) in weak.iter().zip(&plain) {
            assert!((a - b).abs() < 1e-6, "{weak:?} vs {plain:?}");
        }
    }
}
