//! AdamW whose state can be saved and loaded, so an RL run resumes with the moments it had
//! (docs/architecture.md, "Resuming"). The update is libtorch's `torch::optim::AdamW`
//! (`torch/csrc/api/src/optim/adamw.cpp`, after Loshchilov and Hutter 2019, "Decoupled Weight
//! Decay Regularization"), which tch's `nn::AdamW` runs but whose state tch does not expose:
//!
//! ```text
//! p   <- p * (1 - lr * wd)
//! m   <- b1 * m + (1 - b1) * g
//! v   <- b2 * v + (1 - b2) * g^2
//! p   <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//! ```
//!
//! with `t` counted per parameter (a parameter without a gradient is skipped and keeps its
//! count), no AMSGrad. The moments are float32 whatever the parameter's dtype, or bf16
//! ([`AdamW::with_rounding`]: computed in float32 and stored rounded stochastically). A
//! bf16 parameter takes the step computed in float32 and rounded back by [`Rounding`]: to
//! nearest (an update under half a bf16 ulp, 2^-9 relative, is lost), stochastically, or with a
//! Kahan compensation buffer.

use std::path::Path;

use tch::{Kind, Tensor, nn};

use crate::ModelError;

/// AdamW hyperparameters (libtorch's defaults: 0.9, 0.999, 1e-8, 0.01).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay (per unit of learning rate).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// How a parameter of a dtype narrower than float32 (bf16) takes its float32 update; a
/// float32 parameter is updated exactly in every mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rounding {
    /// Round to nearest even (`Tensor::to_kind`).
    #[default]
    Nearest,
    /// Round up with probability equal to the distance from the value below, so the rounded
    /// weight equals the exact one in expectation (Gupta et al. 2015): add 16 uniformly
    /// random low bits to the float32 pattern, then truncate to bf16.
    Stochastic,
    /// Keep what rounding lost in a compensation buffer of the parameter's dtype and add it to
    /// the next update (Kahan 1965).
    Kahan,
}

impl From<cudarl_protocol::Weights> for Rounding {
    fn from(w: cudarl_protocol::Weights) -> Rounding {
        match w {
            cudarl_protocol::Weights::F32 => Rounding::Nearest,
            cudarl_protocol::Weights::Bf16Stochastic | cudarl_protocol::Weights::Bf16 => {
                Rounding::Stochastic
            }
            cudarl_protocol::Weights::Bf16Kahan => Rounding::Kahan,
        }
    }
}

/// Writes `x` (float32, overwritten) into `dst` (bf16) rounded stochastically: the 16 low
/// bits of each float32 pattern plus a uniform draw in [0, 2^16) from libtorch's generator
/// (`tch::manual_seed`), then cut (bf16 is float32's upper 16 bits, so the copy is exact). One
/// temporary: the random bits.
pub fn round_stochastic_into(x: &Tensor, dst: &mut Tensor) {
    let mut bits = x.view_dtype(Kind::Int);
    let noise = Tensor::randint_low(0, 1 << 16, bits.size(), (Kind::Int, bits.device()));
    let _ = bits.g_add_(&noise).bitwise_and_(-65536i64);
    dst.copy_(x);
}

/// One parameter's state.
struct Slot {
    name: String,
    param: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// [`Rounding::Kahan`] on a narrow parameter: the part of past updates rounding lost.
    comp: Option<Tensor>,
    step: i64,
}

/// AdamW over the trainable variables of a [`nn::VarStore`] (in name order), with float32
/// moments of each parameter's shape on its device.
pub struct AdamW {
    cfg: AdamWConfig,
    rounding: Rounding,
    lr: f64,
    slots: Vec<Slot>,
    /// Calls of [`AdamW::step`].
    calls: usize,
    /// Step bf16 parameters with [`Rounding::Stochastic`] or [`Rounding::Kahan`], and float32
    /// parameters with float32 moments, with the fused kernel where it runs
    /// ([`crate::fused_adamw`]).
    fused: bool,
}

impl AdamW {
    /// AdamW at learning rate `lr` over `vs`'s variables that require gradients, rounding
    /// to nearest.
    pub fn new(vs: &nn::VarStore, cfg: AdamWConfig, lr: f64) -> AdamW {
        Self::with_rounding(vs, cfg, lr, Rounding::Nearest, Kind::Float)
    }

    /// AdamW whose updates of bf16 parameters round by `rounding` ([`Rounding::Kahan`] holds
    /// one buffer of the parameter's shape and dtype per narrow parameter), with moments of
    /// dtype `moments`: float32 (8 bytes a parameter), or bf16 (4 bytes; computed in float32
    /// each step and stored rounded stochastically: to nearest, `v <- 0.999 v + ...` would
    /// never decay, a change of 1e-3 relative being under half a bf16 ulp).
    pub fn with_rounding(
        vs: &nn::VarStore,
        cfg: AdamWConfig,
        lr: f64,
        rounding: Rounding,
        moments: Kind,
    ) -> AdamW {
        let mut vars: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let slots = vars
            .into_iter()
            .map(|(name, param)| Slot {
                exp_avg: Tensor::zeros(param.size(), (moments, param.device())),
                exp_avg_sq: Tensor::zeros(param.size(), (moments, param.device())),
                comp: (rounding == Rounding::Kahan && param.kind() != Kind::Float)
                    .then(|| param.zeros_like()),
                name,
                param,
                step: 0,
            })
            .collect();
        AdamW {
            cfg,
            rounding,
            lr,
            slots,
            calls: 0,
            fused: true,
        }
    }

    /// Whether bf16 parameters with [`Rounding::Stochastic`] or [`Rounding::Kahan`], and
    /// float32 parameters with float32 moments, take the fused kernel's step ([`crate::fused_adamw::step`]) where it
    /// runs (on by default); off, every step is libtorch ops. The moments and float32 weights
    /// agree to float32 rounding either way; the stochastic rounding's draws differ.
    pub fn set_fused(&mut self, on: bool) {
        self.fused = on;
    }

    /// Steps taken ([`AdamW::step`] calls, saved and loaded with the state).
    pub fn steps(&self) -> usize {
        self.calls
    }

    /// Sets the learning rate of later steps.
    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// Drops every parameter's gradient ([`crate::cuda_graph::reset_grad`], PyTorch's
    /// `zero_grad(set_to_none=True)`): the next backward pass allocates it anew, so the
    /// gradients' memory is free during the forward pass before it, and a parameter that pass
    /// does not reach takes no step.
    pub fn zero_grad(&mut self) {
        for s in &mut self.slots {
            crate::cuda_graph::reset_grad(&mut s.param);
        }
    }

    /// One update of every parameter that has a gradient.
    pub fn step(&mut self) {
        let AdamWConfig {
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.cfg;
        let lr = self.lr;
        let rounding = self.rounding;
        self.calls += 1;
        tch::no_grad(|| {
            for s in &mut self.slots {
                let g = s.param.grad();
                if !g.defined() {
                    continue;
                }
                s.step += 1;
                let bc1 = 1.0 - beta1.powi(s.step as i32);
                let bc2 = 1.0 - beta2.powi(s.step as i32);
                let narrow = s.param.kind() == Kind::BFloat16;
                let wide = s.param.kind() == Kind::Float && s.exp_avg.kind() == Kind::Float;
                let kahan = narrow && rounding == Rounding::Kahan && s.comp.is_some();
                if self.fused && ((narrow && rounding == Rounding::Stochastic) || wide || kahan) {
                    // The seed from libtorch's CPU generator (`tch::manual_seed` fixes it); a
                    // float32 step rounds nothing and draws none.
                    let seed = if narrow && !kahan {
                        Tensor::randint(i64::MAX, [1], (Kind::Int64, tch::Device::Cpu))
                            .int64_value(&[0]) as u64
                    } else {
                        0
                    };
                    let scalars = crate::fused_adamw::StepScalars::new(&self.cfg, lr, s.step, seed);
                    let (m, v) = (&s.exp_avg, &s.exp_avg_sq);
                    let c = s.comp.as_ref().filter(|_| kahan);
                    if crate::fused_adamw::step(&s.param, &g, m, v, c, &scalars) {
                        continue;
                    }
                }
                let g = g.to_kind(Kind::Float);
                // The moments in float32: the state itself, or float32 copies of bf16 state
                // (rounded back into it after the update has used them).
                let narrow_moments = s.exp_avg.kind() != Kind::Float;
                let (mut m, mut v) = if narrow_moments {
                    (
                        s.exp_avg.to_kind(Kind::Float),
                        s.exp_avg_sq.to_kind(Kind::Float),
                    )
                } else {
                    (s.exp_avg.shallow_clone(), s.exp_avg_sq.shallow_clone())
                };
                let _ = m.lerp_(&g, 1.0 - beta1);
                let _ = v.g_mul_scalar_(beta2);
                let _ = v.addcmul_(&g, &(&g * (1.0 - beta2)));
                let mut store_moments = |m: Tensor, v: Tensor| {
                    if narrow_moments {
                        round_stochastic_into(&m, &mut s.exp_avg);
                        round_stochastic_into(&v, &mut s.exp_avg_sq);
                    }
                };
                if s.param.kind() == Kind::Float {
                    let denom = (v.sqrt() / bc2.sqrt()) + eps;
                    let update = (&m / denom) * (lr / bc1);
                    if weight_decay != 0.0 {
                        let _ = s.param.g_mul_scalar_(1.0 - lr * weight_decay);
                    }
                    let _ = s.param.g_sub_(&update);
                    store_moments(m, v);
                    continue;
                }
                // A narrow parameter: the exact new value in float32 (in place, four
                // temporaries of the parameter's size: the gradient, the denominator, the
                // old and the new value), then rounded. x - lr/bc1 * m / d = x + m / (d * -bc1/lr).
                let mut denom = v.sqrt();
                let _ = denom
                    .g_div_scalar_(bc2.sqrt())
                    .g_add_scalar_(eps)
                    .g_mul_scalar_(-bc1 / lr);
                let old = s.param.to_kind(Kind::Float);
                let mut exact = &old * (1.0 - lr * weight_decay);
                let _ = exact.addcdiv_(&m, &denom);
                drop(denom);
                store_moments(m, v);
                match (rounding, &mut s.comp) {
                    (Rounding::Kahan, Some(c)) => {
                        // wanted = the step plus what earlier roundings lost.
                        let _ = exact.g_sub_(&old).g_add_(&c.to_kind(Kind::Float));
                        let r = (&old + &exact).to_kind(s.param.kind());
                        c.copy_(&(exact - (r.to_kind(Kind::Float) - &old)));
                        s.param.copy_(&r);
                    }
                    (Rounding::Stochastic, _) if s.param.kind() == Kind::BFloat16 => {
                        round_stochastic_into(&exact, &mut s.param);
                    }
                    _ => s.param.copy_(&exact),
                }
            }
        });
    }

    /// Writes what continuing the training needs to `path` (safetensors): the parameters it
    /// trains (`param.<name>`, their own dtype), the moments (`exp_avg.<name>`,
    /// `exp_avg_sq.<name>`), the Kahan buffers (`kahan.<name>`, [`Rounding::Kahan`]), each parameter's step count (`step`, int64 `[n]` in name order)
    /// and the steps taken (`calls`, int64 `[1]`).
    ///
    /// # Errors
    /// [`ModelError::Weights`] naming the file when libtorch cannot write it.
    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let mut named: Vec<(String, Tensor)> = Vec::with_capacity(3 * self.slots.len() + 2);
        for s in &self.slots {
            named.push((format!("param.{}", s.name), s.param.detach()));
            named.push((format!("exp_avg.{}", s.name), s.exp_avg.shallow_clone()));
            named.push((
                format!("exp_avg_sq.{}", s.name),
                s.exp_avg_sq.shallow_clone(),
            ));
            if let Some(c) = &s.comp {
                named.push((format!("kahan.{}", s.name), c.shallow_clone()));
            }
        }
        let steps: Vec<i64> = self.slots.iter().map(|s| s.step).collect();
        named.push(("step".into(), Tensor::from_slice(&steps)));
        named.push(("calls".into(), Tensor::from_slice(&[self.calls as i64])));
        Tensor::write_safetensors(&named, path).map_err(|e| weights(path, e.to_string()))
    }

    /// Reads what [`AdamW::save`] wrote for the same variables, the parameters copied into the
    /// live tensors (so their version counters move and a decoder's copy follows).
    ///
    /// # Errors
    /// [`ModelError::Weights`] naming the file and the tensor when one is missing or has
    /// another shape, or the file cannot be read.
    pub fn load(&mut self, path: &Path) -> Result<(), ModelError> {
        let read = Tensor::read_safetensors(path).map_err(|e| weights(path, e.to_string()))?;
        let mut by: std::collections::HashMap<String, Tensor> = read.into_iter().collect();
        let steps = by
            .remove("step")
            .ok_or_else(|| weights(path, "no tensor `step`".into()))?;
        let steps = Vec::<i64>::try_from(&steps).map_err(|e| weights(path, e.to_string()))?;
        let calls = by
            .remove("calls")
            .and_then(|t| Vec::<i64>::try_from(&t).ok())
            .and_then(|v| v.first().copied())
            .ok_or_else(|| weights(path, "no int64 tensor `calls`".into()))?;
        if steps.len() != self.slots.len() {
            return Err(weights(
                path,
                format!(
                    "`step` has {} entries for {} parameters",
                    steps.len(),
                    self.slots.len()
                ),
            ));
        }
        tch::no_grad(|| -> Result<(), ModelError> {
            for (s, step) in self.slots.iter_mut().zip(steps) {
                let mut parts = vec![
                    ("param", &mut s.param),
                    ("exp_avg", &mut s.exp_avg),
                    ("exp_avg_sq", &mut s.exp_avg_sq),
                ];
                if let Some(c) = &mut s.comp {
                    parts.push(("kahan", c));
                }
                for (which, dst) in parts {
                    let key = format!("{which}.{}", s.name);
                    let src = by
                        .remove(&key)
                        .ok_or_else(|| weights(path, format!("no tensor `{key}`")))?;
                    if src.size() != dst.size() {
                        return Err(weights(
                            path,
                            format!("`{key}` has shape {:?}, not {:?}", src.size(), dst.size()),
                        ));
                    }
                    dst.copy_(&src);
                }
                s.step = step;
            }
            self.calls = calls as usize;
            Ok(())
        })
    }
}

fn weights(path: &Path, message: String) -> ModelError {
    ModelError::Weights {
        file: path.display().to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::OptimizerConfig;

    /// A small least-squares problem on one weight matrix.
    fn problem(seed: i64) -> (nn::VarStore, nn::Linear, Tensor, Tensor) {
        let _rng = crate::torch_rng();
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let lin = nn::linear(vs.root() / "lin", 6, 3, Default::default());
        let x = Tensor::randn([16, 6], (Kind::Float, tch::Device::Cpu));
        let y = Tensor::randn([16, 3], (Kind::Float, tch::Device::Cpu));
        (vs, lin, x, y)
    }

    fn loss(lin: &nn::Linear, x: &Tensor, y: &Tensor) -> Tensor {
        use tch::nn::Module;
        (lin.forward(x) - y).square().mean(Kind::Float)
    }

    fn weights_of(vs: &nn::VarStore) -> Vec<f32> {
        let mut v: Vec<_> = vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.iter()
            .flat_map(|(_, t)| Vec::<f32>::try_from(t.flatten(0, -1)).unwrap())
            .collect()
    }

    #[test]
    fn zero_grad_drops_the_gradients_and_a_parameter_no_loss_reaches_keeps_its_value() {
        let (vs, lin, x, y) = problem(4);
        let mut opt = AdamW::new(&vs, AdamWConfig::default(), 1e-2);
        loss(&lin, &x, &y).backward();
        opt.step();
        opt.zero_grad();
        for (name, t) in vs.variables() {
            assert!(!t.grad().defined(), "{name} still has a gradient");
        }
        // A loss of the weight alone: the bias has no gradient, so it takes no step (where a
        // zeroed gradient would still move it by its first moment and the weight decay).
        let bias = lin.bs.as_ref().unwrap().copy();
        let weight = lin.ws.copy();
        (x.matmul(&lin.ws.tr()) - &y)
            .square()
            .mean(Kind::Float)
            .backward();
        opt.step();
        assert!(lin.bs.as_ref().unwrap().equal(&bias), "the bias moved");
        assert!(!lin.ws.equal(&weight), "the weight did not move");
    }

    #[test]
    fn it_takes_libtorchs_adamw_steps() {
        let cfg = AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let (vs_a, lin_a, x, y) = problem(3);
        let (vs_b, lin_b, _, _) = problem(3);
        let mut ours = AdamW::new(&vs_a, cfg, 1e-2);
        let mut theirs = nn::AdamW {
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            wd: cfg.weight_decay,
            eps: cfg.eps,
            amsgrad: false,
        }
        .build(&vs_b, 1e-2)
        .unwrap();
        for _ in 0..20 {
            ours.zero_grad();
            loss(&lin_a, &x, &y).backward();
            ours.step();
            theirs.zero_grad();
            loss(&lin_b, &x, &y).backward();
            theirs.step();
        }
        let (a, b) = (weights_of(&vs_a), weights_of(&vs_b));
        let moved = a
            .iter()
            .zip(&weights_of(&problem(3).0))
            .any(|(p, q)| p != q);
        assert!(moved, "the steps moved the weights");
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() < 1e-5, "{p} vs libtorch {q}");
        }
    }

    #[test]
    fn bf16_steps_below_half_an_ulp_vanish_rounded_to_nearest_and_add_up_stochastically_or_with_kahan()
     {
        let _rng = crate::torch_rng();
        // 4096 weights at 1.0 in bf16 with a constant gradient of 1: every AdamW step is
        // exactly -lr (m / sqrt(v) = 1 after bias correction). 1e-4 is far under half the bf16
        // ulp below 1.0 (2^-9 = 0.00195), so to nearest each step rounds back to 1.0; in
        // float32, 400 steps reach 0.96.
        let cfg = AdamWConfig {
            weight_decay: 0.0,
            ..Default::default()
        };
        let run = |kind: Kind, rounding: Rounding| -> (f64, f64) {
            tch::manual_seed(11);
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let w = vs
                .root()
                .var("w", &[4096], nn::Init::Const(1.0))
                .set_requires_grad(true);
            let mut vs = vs;
            vs.set_kind(kind);
            let mut opt = AdamW::with_rounding(&vs, cfg, 1e-4, rounding, Kind::Float);
            for _ in 0..400 {
                opt.zero_grad();
                w.sum(Kind::Float).backward();
                opt.step();
            }
            assert_eq!(w.kind(), kind);
            let w = w.to_kind(Kind::Float);
            (
                w.mean(Kind::Float).double_value(&[]),
                (w - 0.96).abs().max().double_value(&[]),
            )
        };
        let (exact, _) = run(Kind::Float, Rounding::Nearest);
        assert!((exact - 0.96).abs() < 1e-5, "float32 {exact}");
        let (nearest, _) = run(Kind::BFloat16, Rounding::Nearest);
        assert_eq!(nearest, 1.0, "to nearest, no step lands");
        // Stochastic: each weight's path is random, the mean is the exact one.
        let (sr, _) = run(Kind::BFloat16, Rounding::Stochastic);
        assert!((sr - 0.96).abs() < 1e-3, "stochastic mean {sr}");
        // Kahan: every weight within one bf16 ulp of the exact value (2^-8 below 1.0).
        let (kahan, worst) = run(Kind::BFloat16, Rounding::Kahan);
        assert!(worst <= 0.0040, "kahan mean {kahan}, worst {worst}");
    }

    /// Whether a GPU test of the fused kernel runs (`CUDARL_GPU=1`; the build must embed the
    /// kernel then); prints the skip otherwise.
    fn fused_kernel_on_gpu(test: &str) -> bool {
        if std::env::var("CUDARL_GPU").as_deref() != Ok("1") {
            eprintln!("SKIPPED {test}...: GPU test (set CUDARL_GPU=1)");
            return false;
        }
        assert!(
            crate::fused_adamw::available(),
            "this build embeds the kernel"
        );
        true
    }

    /// Gated: `CUDARL_GPU=1` on a GPU machine.
    #[test]
    fn the_fused_bf16_step_computes_libtorchs_moments_and_rounds_stochastically() {
        if !fused_kernel_on_gpu("the_fused_bf16_step") {
            return;
        }
        let _rng = crate::torch_rng();
        tch::manual_seed(5);
        let dev = tch::Device::Cuda(0);
        // 5M elements: more than one pass of the kernel's grid (16,384 blocks of 256).
        let n = 5_000_011;
        let p = (Tensor::randn([n], (Kind::Float, dev)) * 0.05).to_kind(Kind::BFloat16);
        let g = (Tensor::randn([n], (Kind::Float, dev)) * 1e-3).to_kind(Kind::BFloat16);
        let m = Tensor::randn([n], (Kind::Float, dev)) * 1e-3;
        let v = Tensor::rand([n], (Kind::Float, dev)) * 1e-6;
        let (lr, b1, b2, eps, wd, t) = (1e-3f64, 0.9f64, 0.95f64, 1e-8f64, 0.01f64, 3);
        let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        // libtorch's ops, as `AdamW::step` runs them for a narrow parameter.
        let gf = g.to_kind(Kind::Float);
        let m_ref = m.lerp(&gf, 1.0 - b1);
        let v_ref = &v * b2 + &gf * (&gf * (1.0 - b2));
        let d = (v_ref.sqrt() / bc2.sqrt() + eps) * (-bc1 / lr);
        let upd = &m_ref / d;
        let exact = p.to_kind(Kind::Float) * (1.0 - lr * wd) + &upd;
        // What float32 rounding of the two terms may move the sum by (the kernel fuses the
        // multiply-add: one rounding where libtorch's ops take two).
        let slack = (p.to_kind(Kind::Float).abs() + upd.abs()) * 2f64.powi(-22);
        let version = crate::cuda_graph::tensor_version(&p);
        let cfg = AdamWConfig {
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: wd,
        };
        let scalars = crate::fused_adamw::StepScalars::new(&cfg, lr, t as i64, 17);
        assert!(crate::fused_adamw::step(&p, &g, &m, &v, None, &scalars));
        assert!(
            crate::cuda_graph::tensor_version(&p) > version,
            "version bumped"
        );
        let rel = |a: &Tensor, b: &Tensor| ((a - b).abs().max() / b.abs().max()).double_value(&[]);
        assert!(rel(&m, &m_ref) < 1e-6, "exp_avg {}", rel(&m, &m_ref));
        assert!(rel(&v, &v_ref) < 1e-6, "exp_avg_sq {}", rel(&v, &v_ref));
        // Each weight is the bf16 value just below or just above the exact one: within one
        // ulp (2^-7 relative at most) and the float32 rounding of its terms.
        let pf = p.to_kind(Kind::Float);
        let off = ((&pf - &exact).abs() - exact.abs() * 2f64.powi(-7) - slack).max();
        assert!(off.double_value(&[]) <= 1e-12, "off by more than an ulp");
        // Unbiased: 4M weights at 1.0 stepped by -1e-4 (a twentieth of the ulp below 1.0, which
        // rounding to nearest loses) land on 1 - 1e-4 on average.
        let n = 1 << 22;
        let p = Tensor::ones([n], (Kind::BFloat16, dev));
        let g = Tensor::ones([n], (Kind::BFloat16, dev));
        let (m, v) = (
            Tensor::zeros([n], (Kind::Float, dev)),
            Tensor::zeros([n], (Kind::Float, dev)),
        );
        let no_decay = AdamWConfig {
            weight_decay: 0.0,
            ..cfg
        };
        let first = crate::fused_adamw::StepScalars::new(&no_decay, 1e-4, 1, 17);
        assert!(crate::fused_adamw::step(&p, &g, &m, &v, None, &first));
        let mean = p.to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
        assert!((mean - (1.0 - 1e-4)).abs() < 3e-6, "stochastic mean {mean}");
        // `AdamW::step` takes the kernel for such a parameter: the same mean over 4M weights.
        let vs = nn::VarStore::new(dev);
        let mut w = vs
            .root()
            .var("w", &[n], nn::Init::Const(1.0))
            .set_requires_grad(true);
        let mut vs = vs;
        vs.set_kind(Kind::BFloat16);
        let cfg = AdamWConfig {
            weight_decay: 0.0,
            ..Default::default()
        };
        for fused in [true, false] {
            tch::no_grad(|| w.copy_(&Tensor::ones([n], (Kind::BFloat16, dev))));
            let mut opt = AdamW::with_rounding(&vs, cfg, 1e-4, Rounding::Stochastic, Kind::Float);
            opt.set_fused(fused);
            opt.zero_grad();
            w.sum(Kind::Float).backward();
            opt.step();
            let mean = w.to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
            assert!(
                (mean - (1.0 - 1e-4)).abs() < 3e-6,
                "fused {fused}: mean {mean}"
            );
        }
        // bf16 moments: the kernel takes them (one step of the parameters above), and they
        // decay in expectation as float32 moments do, fused or not.
        let (m, v) = (
            Tensor::zeros([n], (Kind::BFloat16, dev)),
            Tensor::zeros([n], (Kind::BFloat16, dev)),
        );
        let p = Tensor::ones([n], (Kind::BFloat16, dev));
        assert!(crate::fused_adamw::step(&p, &g, &m, &v, None, &first));
        let mean = p.to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
        assert!(
            (mean - (1.0 - 1e-4)).abs() < 3e-6,
            "bf16 moments: mean {mean}"
        );
        let mean_m = m.to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
        assert!((mean_m - 0.1).abs() < 1e-4, "bf16 exp_avg {mean_m}");
        for fused in [true, false] {
            let (mean, want) = bf16_second_moment_after_zero_gradients(dev, fused);
            assert!(
                (mean / want - 1.0).abs() < 0.01,
                "fused {fused}: mean v {mean}, float32 {want}"
            );
        }
    }

    /// Gated: `CUDARL_GPU=1` on a GPU machine.
    #[test]
    fn the_fused_float32_step_computes_what_libtorchs_ops_do() {
        if !fused_kernel_on_gpu("the_fused_float32_step") {
            return;
        }
        let _rng = crate::torch_rng();
        tch::manual_seed(6);
        let dev = tch::Device::Cuda(0);
        // Two float32 parameters (one more than a pass of the kernel's grid), three steps of
        // random gradients, fused and as libtorch ops from the same start.
        let cfg = AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.01,
        };
        let run = |fused: bool| -> Vec<Tensor> {
            tch::manual_seed(7);
            let vs = nn::VarStore::new(dev);
            let a = vs.root().var(
                "a",
                &[5_000_011],
                nn::Init::Randn {
                    mean: 0.0,
                    stdev: 0.05,
                },
            );
            let b = vs.root().var(
                "b",
                &[64, 33],
                nn::Init::Randn {
                    mean: 0.0,
                    stdev: 0.05,
                },
            );
            let mut opt = AdamW::new(&vs, cfg, 1e-3);
            opt.set_fused(fused);
            for k in 0..3 {
                opt.zero_grad();
                tch::manual_seed(100 + k);
                let ga = Tensor::randn(a.size(), (Kind::Float, dev)) * 1e-3;
                let gb = Tensor::randn(b.size(), (Kind::Float, dev)) * 1e-3;
                ((&a * ga).sum(Kind::Float) + (&b * gb).sum(Kind::Float)).backward();
                opt.step();
            }
            let mut out = vec![a.detach(), b.detach()];
            out.extend(
                opt.slots
                    .iter()
                    .flat_map(|s| [s.exp_avg.copy(), s.exp_avg_sq.copy()]),
            );
            out
        };
        let (fused, ops) = (run(true), run(false));
        for (i, (x, y)) in fused.iter().zip(&ops).enumerate() {
            let rel = ((x - y).abs().max() / y.abs().max()).double_value(&[]);
            assert!(rel < 1e-6, "tensor {i}: relative difference {rel}");
        }
        // The kernel did run: a float32 step leaves the weights as libtorch's to float32
        // rounding, not bit for bit (it fuses the multiply-add).
        let differs = (&fused[0] - &ops[0]).abs().max().double_value(&[]);
        assert!(differs > 0.0, "the fused step was not taken");
    }

    /// Gated: `CUDARL_GPU=1` on a GPU machine.
    #[test]
    fn the_fused_kahan_step_keeps_what_rounding_loses_as_the_ops_do() {
        if !fused_kernel_on_gpu("the_fused_kahan_step") {
            return;
        }
        let _rng = crate::torch_rng();
        let dev = tch::Device::Cuda(0);
        let cfg = AdamWConfig {
            weight_decay: 0.0,
            ..Default::default()
        };
        // 2^20 bf16 weights at 1.0, gradient 1: every step is exactly -lr, 1e-4 being far
        // under half an ulp (the CPU test above); `steps` steps, fused or as libtorch ops.
        let run = |fused: bool, random: bool, steps: usize| -> (Tensor, Tensor) {
            tch::manual_seed(3);
            let mut vs = nn::VarStore::new(dev);
            let w = vs
                .root()
                .var("w", &[1 << 20], nn::Init::Const(1.0))
                .set_requires_grad(true);
            vs.set_kind(Kind::BFloat16);
            let mut opt = AdamW::with_rounding(&vs, cfg, 1e-4, Rounding::Kahan, Kind::Float);
            opt.set_fused(fused);
            for k in 0..steps {
                opt.zero_grad();
                let g = if random {
                    tch::manual_seed(50 + k as i64);
                    Tensor::randn([1 << 20], (Kind::Float, dev))
                } else {
                    Tensor::ones([1 << 20], (Kind::Float, dev))
                };
                (&w * g).sum(Kind::Float).backward();
                opt.step();
            }
            let comp = opt.slots[0].comp.as_ref().expect("a Kahan buffer").copy();
            (w.detach().to_kind(Kind::Float), comp)
        };
        for fused in [true, false] {
            let (w, _) = run(fused, false, 400);
            let worst = (w - 0.96).abs().max().double_value(&[]);
            assert!(worst <= 0.0040, "fused {fused}: worst {worst}");
        }
        // Random gradients: the fused step's weights are the ops' but where float32 rounding
        // put the exact value on the other side of a bf16 rounding boundary (one ulp, rare).
        let (a, ca) = run(true, true, 5);
        let (b, cb) = run(false, true, 5);
        let differ = a.ne_tensor(&b).to_kind(Kind::Float).mean(Kind::Float);
        let differ = differ.double_value(&[]);
        assert!(differ < 1e-3, "{differ} of the weights differ");
        let ulp = b.abs() * 2f64.powi(-7);
        assert!(((&a - &b).abs() - ulp).max().double_value(&[]) <= 0.0);
        // Where the weights agree, so do the Kahan buffers, to a bf16 rounding of them.
        let same = a.eq_tensor(&b);
        let comp = (ca.to_kind(Kind::Float) - cb.to_kind(Kind::Float)).abs();
        let comp = comp.masked_select(&same).max().double_value(&[]);
        assert!(comp < 1e-4, "Kahan buffers differ by {comp}");
    }

    /// bf16 moments after one step of gradient 1 and `zero_steps` of gradient 0 on 2^16 bf16
    /// weights on `dev` (`fused`: the kernel where it runs): the mean second moment and the
    /// value float32 arithmetic gives, `(1 - b2) b2^zero_steps`.
    fn bf16_second_moment_after_zero_gradients(dev: tch::Device, fused: bool) -> (f64, f64) {
        let n = 1 << 16;
        let zero_steps = 200;
        let cfg = AdamWConfig {
            weight_decay: 0.0,
            ..Default::default()
        };
        let mut vs = nn::VarStore::new(dev);
        let w = vs
            .root()
            .var("w", &[n], nn::Init::Const(1.0))
            .set_requires_grad(true);
        vs.set_kind(Kind::BFloat16);
        let mut opt = AdamW::with_rounding(&vs, cfg, 1e-4, Rounding::Stochastic, Kind::BFloat16);
        opt.set_fused(fused);
        for k in 0..=zero_steps {
            opt.zero_grad();
            (w.sum(Kind::Float) * f64::from(u8::from(k == 0))).backward();
            opt.step();
        }
        let v = opt.slots[0].exp_avg_sq.shallow_clone();
        assert_eq!(v.kind(), Kind::BFloat16);
        let mean = v.to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
        (mean, (1.0 - cfg.beta2) * cfg.beta2.powi(zero_steps))
    }

    #[test]
    fn bf16_moments_rounded_stochastically_decay_as_float32_ones_do() {
        let _rng = crate::torch_rng();
        tch::manual_seed(2);
        // Each step multiplies v by 0.999, a change far under half a bf16 ulp (2^-8 relative):
        // rounded to nearest v would stay at 1e-3; the expected value after 200 steps is
        // 8.19e-4.
        let (mean, want) = bf16_second_moment_after_zero_gradients(tch::Device::Cpu, false);
        assert!(
            (mean / want - 1.0).abs() < 0.01,
            "mean v {mean}, float32 {want}"
        );
    }

    #[test]
    fn saved_moments_continue_a_run_as_if_never_stopped() {
        let cfg = AdamWConfig::default();
        let dir = tempfile::tempdir().unwrap();
        // Straight: 10 steps.
        let (vs, lin, x, y) = problem(5);
        let mut opt = AdamW::new(&vs, cfg, 5e-2);
        for k in 0..10 {
            opt.zero_grad();
            loss(&lin, &x, &y).backward();
            opt.step();
            if k == 4 {
                vs.save(dir.path().join("w.safetensors")).unwrap();
                opt.save(&dir.path().join("adamw.safetensors")).unwrap();
            }
        }
        // Stopped after 5, state saved, a fresh process's objects load it and take 5 more.
        let (vs2, lin2, _, _) = problem(99);
        let mut opt2 = AdamW::new(&vs2, cfg, 5e-2);
        opt2.load(&dir.path().join("adamw.safetensors")).unwrap();
        assert_eq!(opt2.steps(), 5);
        for _ in 5..10 {
            opt2.zero_grad();
            loss(&lin2, &x, &y).backward();
            opt2.step();
        }
        assert_eq!(weights_of(&vs), weights_of(&vs2));
        assert_eq!(opt2.steps(), 10);
        // Without the moments (fresh AdamW on the same weights) the run differs.
        let (mut vs3, lin3, _, _) = problem(99);
        vs3.load(dir.path().join("w.safetensors")).unwrap();
        let mut opt3 = AdamW::new(&vs3, cfg, 5e-2);
        for _ in 5..10 {
            opt3.zero_grad();
            loss(&lin3, &x, &y).backward();
            opt3.step();
        }
        assert_ne!(weights_of(&vs), weights_of(&vs3));
        // A state for other variables is refused with the file and the tensor named.
        let other = nn::VarStore::new(tch::Device::Cpu);
        let _ = nn::linear(other.root() / "other", 6, 3, Default::default());
        let e = AdamW::new(&other, cfg, 1e-3)
            .load(&dir.path().join("adamw.safetensors"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("adamw.safetensors") && e.contains("no tensor `param.other.bias`"),
            "{e}"
        );
    }
}
