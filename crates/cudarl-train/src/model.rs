//! A decoder-only transformer of the Qwen2 architecture in tch: token embedding, `L` layers of
//! [RMSNorm -> grouped-query self-attention with RoPE -> residual, RMSNorm -> SwiGLU MLP ->
//! residual], a final RMSNorm and the LM head (tied to the embedding or not). Parameter names,
//! shapes and the arithmetic follow `transformers`' `modeling_qwen2.py` (Qwen2 technical report,
//! arXiv:2407.10671), so Hugging Face checkpoints load as they are; parity with `transformers`
//! is tested (`tests/qwen2_parity.rs`).
//!
//! Shapes: `b` batch, `t` new tokens, `p` cached tokens, `h` hidden size, `nh`/`nkv` query and
//! key/value heads, `d` head dim, `V` vocabulary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use crate::ModelError;
use crate::config::Qwen2Config;
use cudarl_protocol::{LORA_PROJECTIONS, LoraConfig};

/// RMSNorm (Zhang and Sennrich, 2019) as Qwen2 computes it: in float32, then scaled by the
/// weight in the input's dtype.
#[derive(Debug)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn new(vs: nn::Path, h: i64, eps: f64) -> RmsNorm {
        RmsNorm {
            weight: vs.var("weight", &[h], nn::Init::Const(1.0)),
            eps,
        }
    }
    /// A second handle on the same weight (no copy).
    fn share(&self) -> RmsNorm {
        RmsNorm {
            weight: self.weight.shallow_clone(),
            eps: self.eps,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let xf = x.to_kind(Kind::Float);
        let var = xf.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let y = xf * (var + self.eps).rsqrt();
        at_kind(&self.weight, kind) * y.to_kind(kind)
    }
}

impl RmsNorm {
    /// The same normalization as one libtorch op (`at::rms_norm`, one fused kernel on CUDA
    /// instead of eight): statistics in float32, the weight applied before the result is
    /// rounded to `x`'s dtype (one rounding where [`RmsNorm::forward`] has two). For decoding.
    fn forward_fused(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let h = self.weight.size()[0];
        Ok(x.f_rms_norm([h], Some(at_kind(&self.weight, x.kind())), self.eps)?)
    }
}

/// `t` in `kind`: the tensor itself when it already is (no copy), else a cast that gradients
/// flow through (autocast-style use of float32 master weights in a bf16 forward).
fn at_kind(t: &Tensor, kind: Kind) -> Tensor {
    if t.kind() == kind {
        t.shallow_clone()
    } else {
        t.to_kind(kind)
    }
}

/// `x W^T + b` in `x`'s dtype (the weights cast to it when they differ).
fn lin(l: &nn::Linear, x: &Tensor) -> Tensor {
    let k = x.kind();
    if l.ws.kind() == k {
        return l.forward(x);
    }
    x.linear(&l.ws.to_kind(k), l.bs.as_ref().map(|b| b.to_kind(k)))
}

#[derive(Debug)]
struct Layer {
    q: nn::Linear,
    k: nn::Linear,
    v: nn::Linear,
    o: nn::Linear,
    gate: nn::Linear,
    up: nn::Linear,
    down: nn::Linear,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
    /// LoRA adapters of the projections, in [`LORA_PROJECTIONS`] order.
    lora: [Option<Lora>; 7],
}

impl Layer {
    /// Projection `i` of [`LORA_PROJECTIONS`].
    fn linear(&self, i: usize) -> &nn::Linear {
        match i {
            0 => &self.q,
            1 => &self.k,
            2 => &self.v,
            3 => &self.o,
            4 => &self.gate,
            5 => &self.up,
            _ => &self.down,
        }
    }

    /// [`Layer::linear`], mutable.
    fn linear_mut(&mut self, i: usize) -> &mut nn::Linear {
        match i {
            0 => &mut self.q,
            1 => &mut self.k,
            2 => &mut self.v,
            3 => &mut self.o,
            4 => &mut self.gate,
            5 => &mut self.up,
            _ => &mut self.down,
        }
    }

    /// Projection `i` of `x` in `x`'s dtype, its LoRA adapter's update added.
    fn proj(&self, i: usize, x: &Tensor) -> Tensor {
        let y = lin(self.linear(i), x);
        match &self.lora[i] {
            None => y,
            Some(a) => y + a.forward(x),
        }
    }
}

/// One projection's LoRA adapter: `A` `[r, in]`, `B` `[out, r]`, `scale` = alpha / r.
#[derive(Debug)]
struct Lora {
    a: Tensor,
    b: Tensor,
    scale: f64,
}

impl Lora {
    /// `x A^T B^T * scale` in `x`'s dtype.
    fn forward(&self, x: &Tensor) -> Tensor {
        let k = x.kind();
        x.linear::<Tensor>(&at_kind(&self.a, k), None)
            .linear::<Tensor>(&at_kind(&self.b, k), None)
            * self.scale
    }

    /// The weight update `B A * scale` `[out, in]`, computed in float32 (detached).
    fn delta(&self) -> Tensor {
        tch::no_grad(|| {
            self.b
                .to_kind(Kind::Float)
                .matmul(&self.a.to_kind(Kind::Float))
                * self.scale
        })
    }

    /// `w` `[out, in]` with this adapter merged in: `w + B A * scale` in float32, rounded to
    /// `w`'s dtype (PEFT's `merge_and_unload`). One float32 copy of `w` at a time.
    fn merged(&self, w: &Tensor) -> Tensor {
        tch::no_grad(|| (w.to_kind(Kind::Float) + self.delta()).to_kind(w.kind()))
    }
}

/// The token embedding table `[V, h]` (`model.embed_tokens.weight`).
#[derive(Debug)]
struct Embedding {
    ws: Tensor,
}

impl Embedding {
    /// Rows of `ws` for `ids` (int64, any shape) -> `[..., h]` in the table's dtype.
    fn forward(&self, ids: &Tensor) -> Tensor {
        Tensor::embedding(&self.ws, ids, -1, false, false)
    }
}

/// The Hugging Face name of layer `li`'s projection `i` of [`LORA_PROJECTIONS`], without the
/// `.weight` / `.bias` suffix (`model.layers.3.self_attn.q_proj`).
fn projection_name(li: usize, i: usize) -> String {
    let block = if i < 4 { "self_attn" } else { "mlp" };
    format!("model.layers.{li}.{block}.{}", LORA_PROJECTIONS[i])
}

/// A second handle on `l`'s tensors (no copy).
fn share_linear(l: &nn::Linear) -> nn::Linear {
    nn::Linear {
        ws: l.ws.shallow_clone(),
        bs: l.bs.as_ref().map(Tensor::shallow_clone),
    }
}

/// Keys and values of the tokens seen so far, per layer: `[b, nkv, p, d]` each.
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    /// Where a prefill writes each layer's keys and values as soon as the layer computed
    /// them, instead of keeping them ([`StaticKv::prefill_into`]): handles on a static
    /// cache's buffers and the first row.
    into: Option<(Vec<(Tensor, Tensor)>, i64)>,
}

impl KvCache {
    /// Cached tokens `p` (0 when empty).
    pub fn len(&self) -> i64 {
        self.layers.first().map_or(0, |(k, _)| k.size()[2])
    }
    /// No tokens cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The caches of consecutive row blocks of one batch (same layers and length) as one,
    /// rows in order: keys and values `[b, kv_heads, p, head_dim]` concatenated on `b`.
    ///
    /// # Errors
    /// Caches with different layer counts; libtorch errors (different lengths).
    pub fn cat(parts: Vec<KvCache>) -> Result<KvCache, ModelError> {
        let Some(n) = parts.first().map(|p| p.layers.len()) else {
            return Ok(KvCache::default());
        };
        if parts.len() == 1 {
            return Ok(parts.into_iter().next().expect("one part"));
        }
        if parts.iter().any(|p| p.layers.len() != n) {
            return Err(ModelError::Generate(
                "KV caches with different layer counts".into(),
            ));
        }
        let layers = (0..n)
            .map(|l| {
                let ks: Vec<&Tensor> = parts.iter().map(|p| &p.layers[l].0).collect();
                let vs: Vec<&Tensor> = parts.iter().map(|p| &p.layers[l].1).collect();
                Ok((Tensor::f_cat(&ks, 0)?, Tensor::f_cat(&vs, 0)?))
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(KvCache { layers, into: None })
    }
}

/// Preallocated keys and values per layer, `[B, nkv, cap, d]` each in the compute dtype,
/// written in place one column per decode step ([`Qwen2::forward_static`]).
#[derive(Debug)]
pub struct StaticKv {
    layers: Vec<(Tensor, Tensor)>,
}

/// Every layer's projections concatenated for decoding ([`Qwen2::fuse_in_place`]), so a
/// decode step runs one matrix product where the layer has several: queries, keys and values
/// `[(nh + 2 nkv) d, h]` with their biases, and the MLP's gate and up projections `[2 i, h]`.
/// The model's own projections are views into these tensors, so a write into the model's
/// weights is a write into them (their addresses, which captured CUDA graphs hold, stay).
///
/// A decoder of a LoRA model over such a base ([`Qwen2::decoding_weights`]) also holds the
/// model's adapters stacked by the input they read ([`StackedLora`]), so a decode step adds
/// `x A^T B^T` per group without a merged copy of the base.
#[derive(Debug)]
pub struct FusedWeights {
    layers: Vec<FusedLayer>,
}

#[derive(Debug)]
struct FusedLayer {
    qkv_w: Tensor,
    qkv_b: Tensor,
    gate_up_w: Tensor,
    /// The adapters of the query/key/value, output, gate/up and down projections (the groups
    /// of [`LORA_GROUPS`]), `None` where no projection of a group is adapted.
    lora: [Option<StackedLora>; 4],
}

/// The projections of a layer grouped by the input they read and the fused weight they are
/// rows of, as indices of [`LORA_PROJECTIONS`]: queries, keys and values; the attention
/// output; gate and up; down.
const LORA_GROUPS: [&[usize]; 4] = [&[0, 1, 2], &[3], &[4, 5], &[6]];

/// The adapters of one group of projections that read the same input, in the compute dtype:
/// `a` `[n r, in]` (every adapted projection's `A`, stacked) and `b` `[out, n r]` (each one's
/// `B * alpha / r` in its own rows and columns, zeros elsewhere; `out` the group's fused
/// rows), so the group's update is `x a^T b^T`: two matrix products for up to three adapters.
#[derive(Debug)]
struct StackedLora {
    a: Tensor,
    b: Tensor,
    /// `(projection, its first row in b, its first column in b)`.
    parts: Vec<(usize, i64, i64)>,
}

impl StackedLora {
    /// Zeroed buffers for the adapters of `group` in `l` (`None` when none is adapted), in
    /// `kind`; [`StackedLora::copy_from`] fills them.
    fn new(l: &Layer, group: &[usize], kind: Kind) -> Option<StackedLora> {
        let mut parts = Vec::new();
        let (mut row, mut col) = (0i64, 0i64);
        let mut inp = 0i64;
        for &i in group {
            let (out, width) = l.linear(i).ws.size2().expect("a 2-d weight");
            inp = width;
            if let Some(a) = &l.lora[i] {
                parts.push((i, row, col));
                col += a.a.size()[0];
            }
            row += out;
        }
        if parts.is_empty() {
            return None;
        }
        let dev = l.linear(group[0]).ws.device();
        Some(StackedLora {
            a: Tensor::zeros([col, inp], (kind, dev)),
            b: Tensor::zeros([row, col], (kind, dev)),
            parts,
        })
    }

    /// Writes `l`'s adapters into the buffers (in place: captured graphs keep their addresses).
    fn copy_from(&mut self, l: &Layer) -> Result<(), ModelError> {
        let _g = tch::no_grad_guard();
        for &(i, row, col) in &self.parts {
            let a = l.lora[i]
                .as_ref()
                .expect("the adapters the buffers were made for");
            let (r, out) = (a.a.size()[0], a.b.size()[0]);
            self.a.narrow(0, col, r).f_copy_(&a.a)?;
            self.b
                .narrow(0, row, out)
                .narrow(1, col, r)
                .f_copy_(&(&a.b * a.scale))?;
        }
        Ok(())
    }
}

impl FusedLayer {
    fn new(l: &Layer) -> FusedLayer {
        fn bias(x: &nn::Linear) -> &Tensor {
            x.bs.as_ref().expect("q/k/v projections have biases")
        }
        FusedLayer {
            qkv_w: Tensor::cat(&[&l.q.ws, &l.k.ws, &l.v.ws], 0),
            qkv_b: Tensor::cat(&[bias(&l.q), bias(&l.k), bias(&l.v)], 0),
            gate_up_w: Tensor::cat(&[&l.gate.ws, &l.up.ws], 0),
            lora: Default::default(),
        }
    }

    /// `y` (group `g`'s projection of `x`, `[..., out]`, contiguous, no graph) plus the
    /// group's adapter update, added in place by the second matrix product (two kernels).
    fn with_lora(&self, g: usize, y: Tensor, x: &Tensor) -> Tensor {
        match &self.lora[g] {
            None => y,
            Some(s) => {
                let (inp, out) = (s.a.size()[1], s.b.size()[0]);
                let t = x.reshape([-1, inp]).mm(&s.a.tr());
                let _ = y.view([-1, out]).addmm_(&t, &s.b.tr());
                y
            }
        }
    }
}

impl FusedWeights {
    /// Second handles on the same fused tensors (no copy), without adapters.
    fn share(&self) -> FusedWeights {
        FusedWeights {
            layers: self
                .layers
                .iter()
                .map(|f| FusedLayer {
                    qkv_w: f.qkv_w.shallow_clone(),
                    qkv_b: f.qkv_b.shallow_clone(),
                    gate_up_w: f.gate_up_w.shallow_clone(),
                    lora: Default::default(),
                })
                .collect(),
        }
    }

    /// Copies `model`'s adapters into the stacked buffers ([`Qwen2::decoding_weights`] made
    /// them for this model); nothing without adapters.
    ///
    /// # Errors
    /// libtorch errors.
    pub(crate) fn copy_adapters_from(&mut self, model: &Qwen2) -> Result<(), ModelError> {
        for (f, l) in self.layers.iter_mut().zip(&model.layers) {
            for s in f.lora.iter_mut().flatten() {
                s.copy_from(l)?;
            }
        }
        Ok(())
    }
}

impl StaticKv {
    /// Positions per row (`cap`).
    pub fn capacity(&self) -> i64 {
        self.layers.first().map_or(0, |(k, _)| k.size()[2])
    }

    /// A cache for one prefill ([`Qwen2::hidden`] from position 0) of `b` rows and `w`
    /// tokens that writes each layer's keys and values `[b, nkv, w, d]` into rows
    /// `start..start + b`, columns `0..w` of these buffers as the layer computes them and
    /// keeps nothing: the prompts' cache is never held twice, nor all layers of it beside the
    /// buffers (at Qwen2.5-Coder 1.5B, 32 rows of 512 tokens: 0.44 GiB).
    pub(crate) fn prefill_into(&self, start: i64) -> KvCache {
        let layers = self.layers.iter();
        KvCache {
            layers: Vec::new(),
            into: Some((
                layers
                    .map(|(k, v)| (k.shallow_clone(), v.shallow_clone()))
                    .collect(),
                start,
            )),
        }
    }
}

/// What [`Qwen2::checkpointed_forward`] keeps of a forward pass for
/// [`Qwen2::backward_from_checkpoints`]: the input ids `[b, t]`, RoPE's cos and sin, each
/// layer's input `[b, t, h]` and the last layer's output (compute dtype, no graph).
pub struct Checkpoints {
    input_ids: Tensor,
    rope: (Tensor, Tensor),
    inputs: Vec<Tensor>,
    last: Tensor,
}

/// A Qwen2 model whose parameters live in a [`nn::VarStore`] under the Hugging Face names
/// (`model.layers.0.self_attn.q_proj.weight`, ...).
pub struct Qwen2 {
    /// The architecture.
    pub config: Qwen2Config,
    /// The parameters (trainable; `vs.trainable_variables()` for an optimizer).
    pub vs: nn::VarStore,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<nn::Linear>,
    inv_freq: Tensor,
    compute: Option<Kind>,
    /// The LoRA adapters' parameters ([`Qwen2::attach_lora`]), the trainable ones while they
    /// are attached.
    lora_vs: Option<nn::VarStore>,
    /// The fused projections the query/key/value and gate/up weights are views into, once
    /// [`Qwen2::fuse_in_place`] made them (shared by [`Qwen2::share`]).
    fused: Option<FusedWeights>,
    /// The static-cache decoder of [`crate::generate`], kept between calls (its weights copy,
    /// caches and captured CUDA graphs).
    pub(crate) decoder: std::sync::Mutex<Option<Box<crate::decode::Decoder>>>,
}

fn linear(vs: nn::Path, i: i64, o: i64, bias: bool) -> nn::Linear {
    nn::linear(
        vs,
        i,
        o,
        nn::LinearConfig {
            ws_init: nn::Init::Randn {
                mean: 0.0,
                stdev: 0.02,
            },
            bs_init: Some(nn::Init::Const(0.0)),
            bias,
        },
    )
}

// libtorch's global SDPA backend switches (`at::Context::setSDPUseCuDNN`, what Python's
// `torch.backends.cuda.enable_cudnn_sdp` calls), which tch 0.24 does not wrap: C++ methods of
// `at::Context` exported by `libtorch_cpu.so` (torch 2.11.0), called through their Itanium
// mangled names with the context as `this`.
unsafe extern "C" {
    #[link_name = "_ZN2at13globalContextEv"]
    fn at_global_context() -> *mut std::ffi::c_void;
    #[link_name = "_ZN2at7Context14setSDPUseCuDNNEb"]
    fn at_context_set_sdp_use_cudnn(ctx: *mut std::ffi::c_void, enabled: bool);
    #[link_name = "_ZNK2at7Context19userEnabledCuDNNSDPEv"]
    fn at_context_user_enabled_cudnn_sdp(ctx: *const std::ffi::c_void) -> bool;
}

/// Turns libtorch's cuDNN backend of `scaled_dot_product_attention` on or off for the process
/// (like `torch.backends.cuda.enable_cudnn_sdp`); returns whether it was on. Every [`Qwen2`]
/// turns it off when built ([`Qwen2::new`]): on an H100 with torch 2.11.0 that backend is
/// chosen first for bf16 attention and builds a cuDNN graph for every new key length, about
/// 12 ms of CPU per call. A decode step attends to one more key than the last, so every step
/// paid it: 55-85 ms per step instead of about 6 (measured in Python's profiler and in
/// `cudarl-train`'s decode, H100, `benchmarks/results/main_job_h100_2026-11-23_sdpa_off.json`).
/// Without it, libtorch picks flash or memory-efficient attention, which have no per-shape set-up.
pub fn set_cudnn_attention(enabled: bool) -> bool {
    // SAFETY: `globalContext()` returns a reference to libtorch's process-wide context, valid
    // for the life of the process; both methods only read or write a boolean member of it.
    unsafe {
        let ctx = at_global_context();
        let was = at_context_user_enabled_cudnn_sdp(ctx);
        at_context_set_sdp_use_cudnn(ctx, enabled);
        was
    }
}

/// `rotate_half` of the RoPE paper's implementation in `transformers`: `[x1, x2] -> [-x2, x1]`.
fn rotate_half(x: &Tensor) -> Tensor {
    let d = x.size()[x.dim() - 1];
    let x1 = x.narrow(-1, 0, d / 2);
    let x2 = x.narrow(-1, d / 2, d / 2);
    Tensor::cat(&[x2.neg(), x1], -1)
}

impl Qwen2 {
    /// A freshly initialized model (`transformers`' init: normal(0, 0.02) weights, zero biases,
    /// unit norms) in float32 on `device`; call [`Qwen2::set_kind`] for bf16.
    ///
    /// # Errors
    /// An inconsistent config.
    pub fn new(config: Qwen2Config, device: Device) -> Result<Qwen2, ModelError> {
        Self::new_in(config, device, Kind::Float)
    }

    /// [`Qwen2::new`] with the parameters created in `kind`, with no float32 copy first (a 7B
    /// model in bf16 allocates its 15.2 GB, not 30.5 GB and then 15.2 GB): what loading a
    /// checkpoint into bf16 and a decoder's weight copy use.
    ///
    /// # Errors
    /// An inconsistent config.
    pub fn new_in(config: Qwen2Config, device: Device, kind: Kind) -> Result<Qwen2, ModelError> {
        config.validate().map_err(|m| ModelError::Config {
            file: "config".into(),
            message: m,
        })?;
        set_cudnn_attention(false);
        let mut vs = nn::VarStore::new(device);
        vs.set_kind(kind);
        let c = &config;
        let (h, d) = (c.hidden_size, c.head_dim());
        let root = vs.root();
        let m = &root / "model";
        let embed = Embedding {
            ws: (&m / "embed_tokens").var(
                "weight",
                &[c.vocab_size, h],
                nn::Init::Randn {
                    mean: 0.0,
                    stdev: 0.02,
                },
            ),
        };
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let l = &m / "layers" / i;
                let a = &l / "self_attn";
                let f = &l / "mlp";
                Layer {
                    q: linear(&a / "q_proj", h, c.num_attention_heads * d, true),
                    k: linear(&a / "k_proj", h, c.num_key_value_heads * d, true),
                    v: linear(&a / "v_proj", h, c.num_key_value_heads * d, true),
                    o: linear(&a / "o_proj", c.num_attention_heads * d, h, false),
                    gate: linear(&f / "gate_proj", h, c.intermediate_size, false),
                    up: linear(&f / "up_proj", h, c.intermediate_size, false),
                    down: linear(&f / "down_proj", c.intermediate_size, h, false),
                    input_norm: RmsNorm::new(&l / "input_layernorm", h, c.rms_norm_eps),
                    post_norm: RmsNorm::new(&l / "post_attention_layernorm", h, c.rms_norm_eps),
                    lora: Default::default(),
                }
            })
            .collect();
        let norm = RmsNorm::new(&m / "norm", h, c.rms_norm_eps);
        let lm_head =
            (!c.tie_word_embeddings).then(|| linear(&root / "lm_head", h, c.vocab_size, false));
        // inv_freq[i] = 1 / base^(2i / d), float32 as transformers computes it.
        let exponents = Tensor::arange_start_step(0, d, 2, (Kind::Int64, device))
            .to_kind(Kind::Float)
            / d as f64;
        let inv_freq = Tensor::pow_scalar(c.rope_base(), &exponents).reciprocal();
        Ok(Qwen2 {
            config,
            vs,
            embed,
            layers,
            norm,
            lm_head,
            inv_freq,
            compute: None,
            lora_vs: None,
            fused: None,
            decoder: std::sync::Mutex::new(None),
        })
    }

    /// A frozen copy whose parameters are in the compute dtype, for decoding a model trained
    /// with mixed precision: the mixed forward casts every float32 weight to bf16 at every
    /// decode step (about 60 extra kernel launches per token for `small`); the copy holds
    /// the same bf16 values once, so its logits are identical. `None` when the parameters are
    /// already in the compute dtype (nothing to save). Costs one model's memory in the compute
    /// dtype (`small`: 54 MB).
    ///
    /// # Errors
    /// libtorch errors.
    pub fn inference_copy(&self) -> Result<Option<Qwen2>, ModelError> {
        if self.compute.is_none() {
            return Ok(None);
        }
        let _g = tch::no_grad_guard();
        let mut m = Qwen2::new_in(self.config.clone(), self.device(), self.compute_kind())?;
        m.copy_merged_from(self)?;
        m.vs.freeze();
        Ok(Some(m))
    }

    /// The device the parameters are on.
    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// Casts every parameter (`Kind::BFloat16` on GPU, `Kind::Float` on CPU).
    pub fn set_kind(&mut self, kind: Kind) {
        self.vs.set_kind(kind);
    }

    /// The parameters' dtype.
    pub fn kind(&self) -> Kind {
        self.embed.ws.kind()
    }

    /// Mixed precision like `torch.autocast`: activations and matrix products in `kind`
    /// (`Kind::BFloat16` on a GPU) while the parameters keep their own dtype (float32 master
    /// weights that the optimizer updates; gradients flow through the casts). RMSNorm
    /// statistics, RoPE angles and the returned logits stay float32. `None` = compute in the
    /// parameters' dtype (the default; what the parity test checks).
    pub fn set_compute_kind(&mut self, kind: Option<Kind>) {
        self.compute = kind.filter(|k| *k != self.kind());
    }

    /// The dtype of activations: the compute kind, else the parameters'.
    pub fn compute_kind(&self) -> Kind {
        self.compute.unwrap_or_else(|| self.kind())
    }

    /// Logits `[b, t, V]` (float32) for `input_ids` `[b, t]` (int64).
    ///
    /// - `positions` `[b, t]` (int64): RoPE positions; `None` = `p..p+t` for every row.
    /// - `mask` `[b, p + t]` (bool): which key positions hold real tokens (left padding is
    ///   `false`); `None` = all. Attention is causal on top of it.
    /// - `cache`: keys and values of earlier tokens; extended with these `t` tokens.
    ///
    /// # Errors
    /// libtorch errors (shape mismatches, out of memory).
    pub fn forward(
        &self,
        input_ids: &Tensor,
        positions: Option<&Tensor>,
        mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        let x = self.hidden(input_ids, positions, mask, cache)?;
        Ok(self.head(&x))
    }

    /// The last layer's normed hidden states `[b, t, h]` (the compute dtype): what the LM head
    /// reads, and what PPO's value head reads; the arguments as [`Qwen2::forward`]'s.
    ///
    /// # Errors
    /// As [`Qwen2::forward`].
    pub fn hidden(
        &self,
        input_ids: &Tensor,
        positions: Option<&Tensor>,
        mask: Option<&Tensor>,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        let dev = self.device();
        let (b, t) = input_ids.size2()?;
        let past = cache.as_ref().map_or(0, |k| k.len());
        let total = past + t;
        let positions = match positions {
            Some(p) => p.shallow_clone(),
            None => Tensor::arange_start(past, total, (Kind::Int64, dev))
                .unsqueeze(0)
                .expand([b, t], false),
        };
        let kind = self.compute_kind();
        let (cos, sin) = self.rope(&positions);
        // The attention mask [b, 1, t, total] (true = attend), or plain causal attention.
        let attn_mask = if mask.is_none() && past == 0 {
            None
        } else {
            let q_abs = Tensor::arange_start(past, total, (Kind::Int64, dev)).view([t, 1]);
            let k_abs = Tensor::arange(total, (Kind::Int64, dev)).view([1, total]);
            let causal = k_abs.le_tensor(&q_abs).view([1, 1, t, total]);
            Some(match mask {
                Some(m) => {
                    let valid = m.to_kind(Kind::Bool).view([b, 1, 1, total]);
                    // A padded query still attends to itself: no row is fully masked (NaN).
                    let own = k_abs.eq_tensor(&q_abs).view([1, 1, t, total]);
                    causal.logical_and(&valid.logical_or(&own))
                }
                None => causal.expand([b, 1, t, total], false),
            })
        };
        let mut x = at_kind(&self.embed.forward(input_ids), kind);
        for li in 0..self.layers.len() {
            x = self.layer(
                li,
                &x,
                (&cos, &sin),
                attn_mask.as_ref(),
                cache.as_deref_mut(),
            )?;
        }
        Ok(self.norm.forward(&x))
    }

    /// Decoder layer `li` on `x` `[b, t, h]` (the compute dtype): attention with RoPE's `rope`
    /// (`[b, 1, t, d]` each) under `attn_mask` (`[b, 1, t, total]`, `None` = causal), the
    /// layer's keys and values appended to `cache`, then the MLP, both with their residuals.
    fn layer(
        &self,
        li: usize,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        attn_mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let l = &self.layers[li];
        let (b, t, _) = x.size3()?;
        let hx = l.input_norm.forward(x);
        let (q, mut k, mut v) = self.qkv(l, &hx, rope)?;
        if let Some(KvCache {
            into: Some((bufs, start)),
            ..
        }) = &cache
        {
            let (bk, bv) = &bufs[li];
            bk.narrow(0, *start, b).narrow(2, 0, t).f_copy_(&k)?;
            bv.narrow(0, *start, b).narrow(2, 0, t).f_copy_(&v)?;
        } else if let Some(cache) = cache {
            if let Some((pk, pv)) = cache.layers.get(li) {
                k = Tensor::cat(&[pk, &k], 2);
                v = Tensor::cat(&[pv, &v], 2);
            }
            let entry = (k.shallow_clone(), v.shallow_clone());
            if li < cache.layers.len() {
                cache.layers[li] = entry;
            } else {
                cache.layers.push(entry);
            }
        }
        let a = Tensor::f_scaled_dot_product_attention(
            &q,
            &k,
            &v,
            attn_mask,
            0.0,
            attn_mask.is_none(),
            None,
            c.num_key_value_heads != c.num_attention_heads,
        )?;
        let a = a
            .transpose(1, 2)
            .contiguous()
            .view([b, t, c.num_attention_heads * c.head_dim()]);
        Ok(Self::attention_out_and_mlp(l, x, &a))
    }

    /// The gradients of a scalar loss of the final normed hidden states, accumulated into the
    /// parameters' `.grad` with activation checkpointing (Chen et al., "Training Deep Nets
    /// with Sublinear Memory Cost", 2016): [`Qwen2::checkpointed_forward`], then
    /// [`Qwen2::backward_from_checkpoints`] with `head_backward`. One more forward pass of the
    /// layers; the activations of one layer at a time. `input_ids` `[b, t]` (int64), causal
    /// attention, no cache.
    ///
    /// # Errors
    /// libtorch errors, and `head_backward`'s.
    pub fn checkpointed_backward(
        &self,
        input_ids: &Tensor,
        head_backward: &mut dyn FnMut(&Tensor) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let ck = self.checkpointed_forward(input_ids)?;
        self.backward_from_checkpoints(&ck, head_backward)
    }

    /// The layers run forward without a graph on `input_ids` `[b, t]` (int64; causal
    /// attention, no cache), keeping only each layer's input `[b, t, h]` (compute dtype) and
    /// the last layer's output: `b * t * h * (layers + 1)` activations, 0.5 GiB in bf16 for
    /// 4 x 640 tokens at Qwen2.5-Coder 7B's 28 layers of 3,584.
    ///
    /// # Errors
    /// libtorch errors.
    pub fn checkpointed_forward(&self, input_ids: &Tensor) -> Result<Checkpoints, ModelError> {
        let _g = tch::no_grad_guard();
        let (b, t) = input_ids.size2()?;
        let positions = Tensor::arange(t, (Kind::Int64, self.device()))
            .unsqueeze(0)
            .expand([b, t], false);
        let rope = self.rope(&positions);
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut x = at_kind(&self.embed.forward(input_ids), self.compute_kind());
        for li in 0..self.layers.len() {
            let y = self.layer(li, &x, (&rope.0, &rope.1), None, None)?;
            inputs.push(std::mem::replace(&mut x, y));
        }
        Ok(Checkpoints {
            input_ids: input_ids.shallow_clone(),
            rope,
            inputs,
            last: x,
        })
    }

    /// The final normed hidden states `[b, t, h]` (compute dtype, no graph) of a
    /// [`Qwen2::checkpointed_forward`]: what [`Qwen2::hidden`] returns for the same ids.
    pub fn checkpointed_hidden(&self, ck: &Checkpoints) -> Tensor {
        tch::no_grad(|| self.norm.forward(&ck.last))
    }

    /// Accumulates into the parameters' `.grad` the gradients of a scalar loss of the final
    /// normed hidden states of `ck`: `head_backward` gets those states as a leaf `[b, t, h]`
    /// and must backpropagate the loss into it; then each layer, last first, runs forward
    /// again from its kept input with its graph and backward from the gradient of its
    /// output. `ck` is left as it was, so one forward can serve several backward passes.
    ///
    /// # Errors
    /// libtorch errors, and `head_backward`'s.
    pub fn backward_from_checkpoints(
        &self,
        ck: &Checkpoints,
        head_backward: &mut dyn FnMut(&Tensor) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let (cos, sin) = (&ck.rope.0, &ck.rope.1);
        let last = ck.last.detach().set_requires_grad(true);
        let normed = self.norm.forward(&last);
        let leaf = normed.detach().set_requires_grad(true);
        head_backward(&leaf)?;
        (normed * leaf.grad()).sum(Kind::Float).f_backward()?;
        let mut g = last.grad();
        for (li, xi) in ck.inputs.iter().enumerate().rev() {
            let xi = xi.detach().set_requires_grad(true);
            let y = self.layer(li, &xi, (cos, sin), None, None)?;
            (y * &g).sum(Kind::Float).f_backward()?;
            g = xi.grad();
        }
        // A frozen embedding (LoRA) takes no gradient.
        let x0 = at_kind(&self.embed.forward(&ck.input_ids), self.compute_kind());
        if x0.requires_grad() {
            (x0 * g).sum(Kind::Float).f_backward()?;
        }
        Ok(())
    }

    /// RoPE's cos and sin `[b, 1, t, d]` for `positions` `[b, t]` (int64): angles in float32,
    /// then the activations' dtype, as `transformers` computes them.
    fn rope(&self, positions: &Tensor) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * self.inv_freq.view([1, 1, -1]);
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        let kind = self.compute_kind();
        (
            emb.cos().to_kind(kind).unsqueeze(1),
            emb.sin().to_kind(kind).unsqueeze(1),
        )
    }

    /// Queries `[b, nh, t, d]` and keys and values `[b, nkv, t, d]` of the normed hidden states
    /// `hx` `[b, t, h]`, RoPE applied to queries and keys.
    fn qkv(
        &self,
        l: &Layer,
        hx: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
    ) -> Result<(Tensor, Tensor, Tensor), ModelError> {
        let c = &self.config;
        let d = c.head_dim();
        let (b, t, _) = hx.size3()?;
        let heads = |i: usize, n: i64| l.proj(i, hx).view([b, t, n, d]).transpose(1, 2);
        let q = heads(0, c.num_attention_heads);
        let k = heads(1, c.num_key_value_heads);
        let v = heads(2, c.num_key_value_heads);
        let q = &q * cos + rotate_half(&q) * sin;
        let k = &k * cos + rotate_half(&k) * sin;
        Ok((q, k, v))
    }

    /// The rest of a layer after attention: `x + o(a)`, then the SwiGLU MLP with its residual
    /// (`a` `[b, t, nh * d]`, `x` `[b, t, h]`).
    fn attention_out_and_mlp(l: &Layer, x: &Tensor, a: &Tensor) -> Tensor {
        // Out of place: `x` is saved for backward by the norm before it (no `+=`).
        let x = x + l.proj(3, a);
        let hx = l.post_norm.forward(&x);
        let mut gate = l.proj(4, &hx);
        let up = l.proj(5, &hx);
        let act = if gate.requires_grad() || up.requires_grad() {
            gate.silu() * up
        } else {
            // Without a graph (a prefill), in place: two `[b, t, i]` tensors at a time, not
            // four.
            let _ = gate.silu_();
            let _ = gate.g_mul_(&up);
            drop(up);
            gate
        };
        drop(hx);
        &x + l.proj(6, &act)
    }

    /// Float32 logits `[..., V]` of final normed hidden states `x` `[..., h]`.
    pub fn head(&self, x: &Tensor) -> Tensor {
        let logits = match &self.lm_head {
            Some(h) => lin(h, x),
            None => x.matmul(&at_kind(&self.embed.ws, x.kind()).tr()),
        };
        logits.to_kind(Kind::Float)
    }

    /// One decode step against a preallocated cache: float32 logits `[B, V]` of the next token
    /// of every row, given each row's last token `tok` `[B, 1]` (int64) at RoPE position `pos`
    /// `[B, 1]` (int64). Its key and value are written into `kv` at column `cur` (`[1]` int64,
    /// on the device), and attention reads columns `0..len` (a host number, `cur < len`)
    /// with `bias` `[B, 1, 1, len]` (float32: 0 where a key is attended, -inf where not). The
    /// projections are read from `fused` ([`Qwen2::fuse_in_place`] of this model, or
    /// [`Qwen2::decoding_weights`] with its adapters), the norms, output and down projections
    /// from the model.
    ///
    /// Attention is two batched matrix products and a float32 softmax, queries grouped by
    /// their key-value head (`[B, nkv, nh / nkv, d]`), so no key or value is repeated and no
    /// fused kernel is needed: libtorch's `scaled_dot_product_attention` with a mask and
    /// grouped-query heads runs its math kernel (6.3 of a 7.8 ms step at batch 64, `small`,
    /// H200). Every shape depends only on `B` and `len`, and nothing is read back to the host,
    /// so the step can be captured in a CUDA graph.
    ///
    /// # Errors
    /// libtorch errors (shapes, `cur` out of range).
    pub fn forward_static(
        &self,
        tok: &Tensor,
        pos: &Tensor,
        cur: &Tensor,
        bias: &Tensor,
        (fused, kv): (&FusedWeights, &mut StaticKv),
        len: i64,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let (b, _) = tok.size2()?;
        let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim());
        let kind = self.compute_kind();
        let (cos, sin) = self.rope(pos);
        let scale = 1.0 / (d as f64).sqrt();
        let mut x = at_kind(&self.embed.forward(tok), kind);
        let (qd, kd) = (nh * d, nkv * d);
        let heads = |t: Tensor, n: i64| t.view([b, 1, n, d]).transpose(1, 2);
        for ((l, f), (kc, vc)) in self
            .layers
            .iter()
            .zip(&fused.layers)
            .zip(kv.layers.iter_mut())
        {
            let hx = l.input_norm.forward_fused(&x)?;
            let qkv = f.with_lora(0, hx.linear(&f.qkv_w, Some(&f.qkv_b)), &hx);
            // RoPE on queries and keys at once.
            let qk = heads(qkv.narrow(-1, 0, qd + kd), nh + nkv);
            let qk = &qk * &cos + rotate_half(&qk) * &sin;
            let q = qk.narrow(1, 0, nh);
            let k = qk.narrow(1, nh, nkv);
            let v = heads(qkv.narrow(-1, qd + kd, kd), nkv);
            let _ = kc.f_index_copy_(2, cur, &k)?;
            let _ = vc.f_index_copy_(2, cur, &v)?;
            let keys = kc.narrow(2, 0, len);
            let values = vc.narrow(2, 0, len);
            let scores = q
                .reshape([b, nkv, nh / nkv, d])
                .matmul(&keys.transpose(-1, -2))
                .to_kind(Kind::Float)
                * scale
                + bias;
            let p = scores.softmax(-1, Kind::Float).to_kind(kind);
            let a = p.matmul(&values).reshape([b, 1, nh * d]);
            let x1 = &x + f.with_lora(1, lin(&l.o, &a), &a);
            let hx = l.post_norm.forward_fused(&x1)?;
            let gu = f.with_lora(2, hx.linear::<Tensor>(&f.gate_up_w, None), &hx);
            let i = f.gate_up_w.size()[0] / 2;
            let m = gu.narrow(-1, 0, i).silu() * gu.narrow(-1, i, i);
            x = &x1 + f.with_lora(3, lin(&l.down, &m), &m);
        }
        let x = self.norm.forward_fused(&x)?;
        Ok(self.head(&x).squeeze_dim(1))
    }

    /// A zeroed [`StaticKv`] for `b` rows and `cap` positions in the compute dtype.
    pub fn static_kv(&self, b: i64, cap: i64) -> StaticKv {
        let c = &self.config;
        let shape = [b, c.num_key_value_heads, cap, c.head_dim()];
        let opts = (self.compute_kind(), self.device());
        StaticKv {
            layers: (0..c.num_hidden_layers)
                .map(|_| (Tensor::zeros(shape, opts), Tensor::zeros(shape, opts)))
                .collect(),
        }
    }

    /// Fuses the projection weights [`Qwen2::forward_static`] reads and makes them this
    /// model's own: each layer's query, key, value, gate and up projections (weights and
    /// biases) are re-pointed, in the layers and in the var store, at views into the fused
    /// tensors ([`FusedWeights`]), and their separate copies are freed, so the model holds each
    /// weight once (7B in bf16: 15.2 GB, not 23.7 GB with the fused copies beside it). Writes
    /// into those weights ([`Qwen2::copy_merged_from`], `vs.copy`) then land in the fused
    /// tensors, and [`Qwen2::share`]s made afterwards read them too. The model is frozen first
    /// (a fused tensor made from weights that require gradients would keep them alive through
    /// its autograd node, a leaf's AccumulateGrad holding the leaf), and the var store keeps no
    /// trainable variables: for a model that only samples, or the frozen base of LoRA agents,
    /// whose decoders then run this base with their adapters ([`Qwen2::decoding_weights`])
    /// instead of a merged copy. Nothing when already fused.
    ///
    /// # Panics
    /// With LoRA adapters attached (fuse the base, then attach adapters to its shares).
    pub fn fuse_in_place(&mut self) {
        assert!(
            self.lora_vs.is_none(),
            "fuse the base before attaching LoRA adapters"
        );
        if self.fused.is_some() {
            return;
        }
        let _g = tch::no_grad_guard();
        self.vs.freeze();
        let mut fused = FusedWeights { layers: Vec::new() };
        let c = &self.config;
        let (nq, nkv) = (
            c.num_attention_heads * c.head_dim(),
            c.num_key_value_heads * c.head_dim(),
        );
        let inter = c.intermediate_size;
        let mut vars = self.vs.variables_.lock().unwrap_or_else(|e| e.into_inner());
        vars.trainable_variables.clear();
        // One layer at a time: each layer's separate copies are freed before the next layer's
        // fused tensors are made, so at most one layer's projections exist twice.
        for (li, l) in self.layers.iter_mut().enumerate() {
            let f = FusedLayer::new(l);
            // (projection index in LORA_PROJECTIONS, its weight rows, its bias rows)
            let views = [
                (0, f.qkv_w.narrow(0, 0, nq), Some(f.qkv_b.narrow(0, 0, nq))),
                (
                    1,
                    f.qkv_w.narrow(0, nq, nkv),
                    Some(f.qkv_b.narrow(0, nq, nkv)),
                ),
                (
                    2,
                    f.qkv_w.narrow(0, nq + nkv, nkv),
                    Some(f.qkv_b.narrow(0, nq + nkv, nkv)),
                ),
                (4, f.gate_up_w.narrow(0, 0, inter), None),
                (5, f.gate_up_w.narrow(0, inter, inter), None),
            ];
            for (i, w, b) in views {
                let name = projection_name(li, i);
                vars.named_variables
                    .insert(format!("{name}.weight"), w.shallow_clone());
                if let Some(b) = &b {
                    vars.named_variables
                        .insert(format!("{name}.bias"), b.shallow_clone());
                }
                let lin = l.linear_mut(i);
                lin.ws = w;
                if b.is_some() {
                    lin.bs = b;
                }
            }
            fused.layers.push(f);
        }
        drop(vars);
        self.fused = Some(fused);
    }

    /// What a static decoder of this model runs without a copy of the weights: the fused base
    /// ([`Qwen2::fuse_in_place`]) and, with LoRA adapters attached, buffers for them stacked
    /// per group of projections in the compute dtype (filled by
    /// [`FusedWeights::copy_adapters_from`]; at Qwen2.5-Coder 7B with r = 16 on all seven
    /// projections, 80 MB beside the 14.2 GiB a merged copy would take). `None` when the
    /// weights are not fused or the model computes in another dtype than its parameters' (a
    /// float32 master decodes from a bf16 copy).
    pub(crate) fn decoding_weights(&self) -> Option<FusedWeights> {
        let base = self.fused.as_ref()?;
        if self.compute_kind() != self.kind() {
            return None;
        }
        let mut f = base.share();
        for (fl, l) in f.layers.iter_mut().zip(&self.layers) {
            for (slot, group) in fl.lora.iter_mut().zip(LORA_GROUPS) {
                *slot = StackedLora::new(l, group, self.kind());
            }
        }
        Some(f)
    }

    /// Makes this model one that only samples ([`crate::generate`]): LoRA adapters merged,
    /// parameters converted to the compute dtype and frozen, and the query/key/value and
    /// gate/up projections fused in place ([`Qwen2::fuse_in_place`]), so the static decoder
    /// runs these weights instead of keeping a copy of its own (7B in bf16: the model's 15.2 GB
    /// once, not a float32 master and a bf16 copy, 45.7 GB). Its forward pass and
    /// [`Qwen2::save`] are unchanged; training it afterwards is not supported.
    ///
    /// # Errors
    /// libtorch errors (the LoRA merge).
    pub fn freeze_for_sampling(&mut self) -> Result<(), ModelError> {
        self.merge_lora()?;
        let kind = self.compute_kind();
        if kind != self.kind() {
            self.set_kind(kind);
        }
        self.compute = None;
        self.fuse_in_place();
        // A decoder made before holds a copy.
        *self.decoder.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    /// [`Qwen2::load`] in `kind` (the compute dtype), then [`Qwen2::freeze_for_sampling`]: a
    /// checkpoint that is only sampled from, its weights held once.
    ///
    /// # Errors
    /// As [`Qwen2::load`].
    pub fn load_for_sampling(dir: &Path, device: Device, kind: Kind) -> Result<Qwen2, ModelError> {
        let mut m = Qwen2::load(dir, device, kind)?;
        m.freeze_for_sampling()?;
        Ok(m)
    }

    /// Loads a Hugging Face directory: `config.json` and `model.safetensors`, or the shards
    /// listed in `model.safetensors.index.json`. Weights are converted to `kind` on `device`.
    ///
    /// # Errors
    /// [`ModelError::Config`] for a bad config; [`ModelError::Weights`] naming the file and the
    /// tensor for a missing, unexpected or wrongly shaped weight.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Qwen2, ModelError> {
        let config = Qwen2Config::load(&dir.join("config.json"))?;
        let model = Qwen2::new_in(config, device, kind)?;
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<std::path::PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index)
                .map_err(|e| ModelError::Io(index.display().to_string(), e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Weights {
                    file: index.display().to_string(),
                    message: e.to_string(),
                })?;
            let map = v["weight_map"]
                .as_object()
                .ok_or_else(|| ModelError::Weights {
                    file: index.display().to_string(),
                    message: "no `weight_map` object".into(),
                })?;
            let set: BTreeSet<String> = map
                .values()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect();
            set.into_iter().map(|f| dir.join(f)).collect()
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut vars = model.vs.variables();
        let mut loaded = BTreeSet::new();
        let _guard = tch::no_grad_guard();
        for f in &files {
            let bad = |m: String| ModelError::Weights {
                file: f.display().to_string(),
                message: m,
            };
            let tensors = Tensor::read_safetensors(f).map_err(|e| bad(e.to_string()))?;
            for (name, t) in tensors {
                match vars.get_mut(&name) {
                    Some(v) => {
                        if v.size() != t.size() {
                            return Err(bad(format!(
                                "`{name}` has shape {:?}, the config implies {:?}",
                                t.size(),
                                v.size()
                            )));
                        }
                        v.f_copy_(&t).map_err(|e| bad(format!("`{name}`: {e}")))?;
                        loaded.insert(name);
                    }
                    // Tied checkpoints may still carry the head; it is the embedding.
                    None if name == "lm_head.weight" && model.config.tie_word_embeddings => {}
                    None => return Err(bad(format!("unexpected tensor `{name}`"))),
                }
            }
        }
        let missing: Vec<&String> = vars.keys().filter(|k| !loaded.contains(*k)).collect();
        if !missing.is_empty() {
            return Err(ModelError::Weights {
                file: dir.display().to_string(),
                message: format!(
                    "{} weights missing, e.g. `{}`",
                    missing.len(),
                    missing.iter().min().map_or("", |s| s.as_str())
                ),
            });
        }
        Ok(model)
    }

    /// Attaches LoRA adapters ([`LoraConfig`]) to every layer's target projections and freezes
    /// the base: [`Qwen2::trainable`] is then the adapters' float32 parameters, named as PEFT
    /// names them (`model.layers.{i}.self_attn.q_proj.lora_A.weight` `[r, in]`,
    /// `...lora_B.weight` `[out, r]`). The forward adds `x A^T B^T * alpha / r` to each.
    ///
    /// # Errors
    /// An invalid config (named field); adapters already attached.
    pub fn attach_lora(&mut self, cfg: &LoraConfig) -> Result<(), ModelError> {
        let bad = |m: String| ModelError::Config {
            file: "lora".into(),
            message: m,
        };
        cfg.check().map_err(bad)?;
        if self.lora_vs.is_some() {
            return Err(bad("LoRA adapters are already attached".into()));
        }
        let vs = nn::VarStore::new(self.device());
        let root = vs.root();
        let (r, scale) = (cfg.r as i64, cfg.alpha / cfg.r as f64);
        for (li, layer) in self.layers.iter_mut().enumerate() {
            for (i, name) in LORA_PROJECTIONS.iter().enumerate() {
                if !cfg.target_modules.iter().any(|t| t == name) {
                    continue;
                }
                let (out, inp) = layer.linear(i).ws.size2()?;
                let p = projection_name(li, i)
                    .split('.')
                    .fold(root.clone(), |p, part| &p / part);
                let bound = 1.0 / (inp as f64).sqrt();
                let a = (&p / "lora_A").var(
                    "weight",
                    &[r, inp],
                    nn::Init::Uniform {
                        lo: -bound,
                        up: bound,
                    },
                );
                let b = (&p / "lora_B").var("weight", &[out, r], nn::Init::Const(0.0));
                layer.lora[i] = Some(Lora { a, b, scale });
            }
        }
        self.vs.freeze();
        self.lora_vs = Some(vs);
        Ok(())
    }

    /// The parameters an optimizer trains: the LoRA adapters' while attached, else every
    /// parameter.
    pub fn trainable(&self) -> &nn::VarStore {
        self.lora_vs.as_ref().unwrap_or(&self.vs)
    }

    /// A second model over the same parameter storage, with no copy: the same
    /// [`nn::VarStore`] (frozen by this call, for both) and handles on the same tensors, no
    /// adapters and no compute dtype. What LoRA agents that start from one checkpoint share:
    /// each attaches its own adapters to a share ([`Qwen2::attach_lora`]), and the base itself,
    /// adapters off, is their frozen KL reference (7B: one 15.2 GB bf16 base for both agents
    /// and both references instead of four models).
    ///
    /// # Errors
    /// This model has adapters attached (they are not shared).
    pub fn share(&self) -> Result<Qwen2, ModelError> {
        if self.lora_vs.is_some() {
            return Err(ModelError::Config {
                file: "lora".into(),
                message: "a model with LoRA adapters attached cannot be shared".into(),
            });
        }
        let mut vs = nn::VarStore::new(self.device());
        vs.variables_ = self.vs.variables_.clone();
        vs.freeze();
        let layers = self
            .layers
            .iter()
            .map(|l| Layer {
                q: share_linear(&l.q),
                k: share_linear(&l.k),
                v: share_linear(&l.v),
                o: share_linear(&l.o),
                gate: share_linear(&l.gate),
                up: share_linear(&l.up),
                down: share_linear(&l.down),
                input_norm: l.input_norm.share(),
                post_norm: l.post_norm.share(),
                lora: Default::default(),
            })
            .collect();
        Ok(Qwen2 {
            config: self.config.clone(),
            vs,
            embed: Embedding {
                ws: self.embed.ws.shallow_clone(),
            },
            layers,
            norm: self.norm.share(),
            lm_head: self.lm_head.as_ref().map(share_linear),
            inv_freq: self.inv_freq.shallow_clone(),
            compute: None,
            lora_vs: None,
            fused: self.fused.as_ref().map(FusedWeights::share),
            decoder: std::sync::Mutex::new(None),
        })
    }

    /// The attached adapters by the Hugging Face name of the weight each adapts
    /// (`model.layers.{i}.self_attn.q_proj.weight`, ...); empty without adapters. Their
    /// float32 updates are computed one at a time where they are merged ([`Lora::delta`]):
    /// all at once they would be four bytes a base parameter (28 GB at 7B).
    fn adapters(&self) -> BTreeMap<String, &Lora> {
        let mut out = BTreeMap::new();
        for (li, layer) in self.layers.iter().enumerate() {
            for i in 0..LORA_PROJECTIONS.len() {
                if let Some(a) = &layer.lora[i] {
                    out.insert(format!("{}.weight", projection_name(li, i)), a);
                }
            }
        }
        out
    }

    /// Copies `src`'s weights into this model's (same architecture; converted to this model's
    /// dtype), each adapted weight with `src`'s adapter merged (`W + B A * alpha / r` in
    /// float32, then rounded): what a decoder or an inference copy of a LoRA model holds.
    ///
    /// # Errors
    /// Different architectures; libtorch errors.
    pub fn copy_merged_from(&mut self, src: &Qwen2) -> Result<(), ModelError> {
        let _g = tch::no_grad_guard();
        let from = src.vs.variables();
        let adapters = src.adapters();
        // Each weight written once: merged where an adapter adapts it, else copied.
        for (name, mut w) in self.vs.variables() {
            let s = from.get(&name).ok_or_else(|| {
                ModelError::Generate(format!("copy_merged_from: no `{name}` in the source"))
            })?;
            match adapters.get(&name) {
                Some(a) => w.f_copy_(&a.merged(s))?,
                None => w.f_copy_(s)?,
            };
        }
        Ok(())
    }

    /// Every tensor the model's outputs depend on: the parameters, then the adapters'.
    pub(crate) fn all_variables(&self) -> Vec<Tensor> {
        let mut v: Vec<Tensor> = self.vs.variables().into_values().collect();
        if let Some(l) = &self.lora_vs {
            v.extend(l.variables().into_values());
        }
        v
    }

    /// Adds each adapter's `B A * alpha / r` (computed in float32) into its base weight, in
    /// the weight's dtype, drops the adapters and unfreezes the base. Nothing without
    /// adapters.
    ///
    /// # Errors
    /// libtorch errors.
    pub fn merge_lora(&mut self) -> Result<(), ModelError> {
        if self.lora_vs.take().is_none() {
            return Ok(());
        }
        let _g = tch::no_grad_guard();
        for layer in &mut self.layers {
            for i in 0..LORA_PROJECTIONS.len() {
                if let Some(a) = layer.lora[i].take() {
                    let mut w = layer.linear(i).ws.shallow_clone();
                    w.f_copy_(&a.merged(&w))?;
                }
            }
        }
        self.vs.unfreeze();
        Ok(())
    }

    /// Writes the attached adapters in PEFT's layout to `dir`: `adapter_model.safetensors`
    /// (`base_model.model.<name>`, float32) and `adapter_config.json` (`peft_type` `LORA`,
    /// `r`, `lora_alpha`, `target_modules`, no dropout or bias), which
    /// `peft.PeftModel.from_pretrained(base, dir)` loads onto the base checkpoint.
    ///
    /// # Errors
    /// No adapters attached; I/O and libtorch errors.
    pub fn save_lora(&self, dir: &Path, cfg: &LoraConfig) -> Result<(), ModelError> {
        let vs = self.lora_vs.as_ref().ok_or_else(|| ModelError::Config {
            file: dir.display().to_string(),
            message: "no LoRA adapters attached".into(),
        })?;
        std::fs::create_dir_all(dir).map_err(|e| ModelError::Io(dir.display().to_string(), e))?;
        let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
        let named: Vec<(String, Tensor)> = vars
            .into_iter()
            .map(|(n, t)| {
                (
                    format!("base_model.model.{n}"),
                    t.to_device(Device::Cpu).contiguous(),
                )
            })
            .collect();
        let path = dir.join("adapter_model.safetensors");
        Tensor::write_safetensors(&named, &path).map_err(|e| ModelError::Weights {
            file: path.display().to_string(),
            message: e.to_string(),
        })?;
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": cfg.r,
            "lora_alpha": cfg.alpha,
            "target_modules": cfg.target_modules,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "base_model_name_or_path": null,
        });
        let path = dir.join("adapter_config.json");
        let text = serde_json::to_string_pretty(&config).expect("json");
        std::fs::write(&path, text + "\n")
            .map_err(|e| ModelError::Io(path.display().to_string(), e))
    }

    /// Saves in the Hugging Face layout: `config.json` (with `dtype`) and one
    /// `model.safetensors` holding every parameter under its Hugging Face name, in the
    /// parameters' dtype. With adapters attached, each adapted weight is saved merged
    /// (`W + B A * alpha / r` in float32, rounded to `W`'s dtype, as PEFT's `merge_and_unload`
    /// does), the model itself unchanged.
    ///
    /// # Errors
    /// I/O and libtorch errors.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        std::fs::create_dir_all(dir).map_err(|e| ModelError::Io(dir.display().to_string(), e))?;
        let mut config = self.config.clone();
        let dtype = match self.kind() {
            Kind::BFloat16 => "bfloat16",
            Kind::Half => "float16",
            _ => "float32",
        };
        config.extra.insert("dtype".into(), dtype.into());
        config.extra.insert("torch_dtype".into(), dtype.into());
        config.save(&dir.join("config.json"))?;
        let vars: BTreeMap<String, Tensor> = self.vs.variables().into_iter().collect();
        let adapters = self.adapters();
        let named: Vec<(String, Tensor)> = vars
            .into_iter()
            .map(|(n, t)| {
                let t = match adapters.get(&n) {
                    Some(a) => a.merged(&t),
                    None => t,
                };
                (n, t.to_device(Device::Cpu).contiguous())
            })
            .collect();
        let path = dir.join("model.safetensors");
        Tensor::write_safetensors(&named, &path).map_err(|e| ModelError::Weights {
            file: path.display().to_string(),
            message: e.to_string(),
        })
    }
}

#[cfg(test)]
mod cudnn_attention_tests {
    use super::*;

    #[test]
    fn building_a_model_turns_cudnn_attention_off_and_the_switch_reports_the_old_state() {
        // A model's initialization draws from the generator seeded tests use.
        let _rng = crate::torch_rng();
        // libtorch's own flag (on by default in torch 2.11.0), read back through its getter.
        set_cudnn_attention(true);
        assert!(set_cudnn_attention(true), "the flag did not stick");
        let cfg = Qwen2Config::new(64, 16, 32, 1, 2, 1, 32, true);
        let _m = Qwen2::new(cfg, Device::Cpu).unwrap();
        assert!(
            !set_cudnn_attention(false),
            "Qwen2::new left cuDNN attention on"
        );
    }
}

#[cfg(test)]
mod lora_merge_tests {
    use super::*;

    #[test]
    fn a_merged_copy_computes_what_the_adapted_model_does() {
        let _rng = crate::torch_rng();
        tch::manual_seed(9);
        let cfg = Qwen2Config::new(64, 16, 32, 2, 4, 2, 32, true);
        let mut m = Qwen2::new(cfg.clone(), Device::Cpu).unwrap();
        let lora = cudarl_protocol::LoraConfig {
            r: 4,
            alpha: 8.0,
            target_modules: vec!["q_proj".into(), "up_proj".into(), "down_proj".into()],
        };
        m.attach_lora(&lora).unwrap();
        // B starts at zero: give the adapters an effect.
        tch::no_grad(|| {
            for (name, mut v) in m.trainable().variables() {
                if name.contains("lora_B") {
                    v.copy_(&(Tensor::randn(v.size(), (Kind::Float, Device::Cpu)) * 0.5));
                }
            }
        });
        let ids = Tensor::from_slice(&[3i64, 9, 27, 17, 51, 5]).view([1, 6]);
        let logits = |x: &Qwen2| tch::no_grad(|| x.forward(&ids, None, None, None).unwrap());
        let adapted = logits(&m);
        let mut copy = Qwen2::new(cfg, Device::Cpu).unwrap();
        let before = (logits(&copy) - &adapted).abs().max().double_value(&[]);
        copy.copy_merged_from(&m).unwrap();
        let after = (logits(&copy) - &adapted).abs().max().double_value(&[]);
        assert!(before > 1e-2, "a fresh model differs: {before}");
        assert!(after < 1e-5, "the merged copy differs by {after}");
        // The base is what it was: the copy took the merge, not the source.
        m.lora_vs = None;
        for l in &mut m.layers {
            l.lora = Default::default();
        }
        let base = (logits(&m) - &adapted).abs().max().double_value(&[]);
        assert!(base > 1e-3, "the adapters had an effect: {base}");
    }
}

#[cfg(test)]
mod fused_lora_tests {
    use super::*;
    use crate::generate::{DecodePath, SampleParams, generate};

    /// Gives every adapter's B random values (B starts at zero: no effect).
    fn perturb(m: &Qwen2, seed: i64) {
        tch::manual_seed(seed);
        tch::no_grad(|| {
            for (name, mut v) in m.trainable().variables() {
                if name.contains("lora_B") {
                    v.copy_(&(Tensor::randn(v.size(), (Kind::Float, Device::Cpu)) * 0.5));
                }
            }
        });
    }

    #[test]
    fn lora_agents_decode_from_their_fused_base_with_their_adapters_as_the_dynamic_path_does() {
        let _rng = crate::torch_rng();
        tch::manual_seed(5);
        let cfg = Qwen2Config::new(64, 16, 32, 2, 4, 2, 32, true);
        let mut base = Qwen2::new(cfg, Device::Cpu).unwrap();
        base.fuse_in_place();
        let lora = |targets: &[&str]| cudarl_protocol::LoraConfig {
            r: 4,
            alpha: 8.0,
            target_modules: targets.iter().map(|t| t.to_string()).collect(),
        };
        // Every group adapted in one agent; only some projections of a group in the other.
        let mut a = base.share().unwrap();
        a.attach_lora(&lora(&LORA_PROJECTIONS)).unwrap();
        let mut b = base.share().unwrap();
        b.attach_lora(&lora(&["k_proj", "up_proj"])).unwrap();
        let prompts = vec![vec![3i64, 9, 27], vec![17, 51, 5, 8, 2]];
        let params = |decode| SampleParams {
            max_new_tokens: 12,
            temperature: 1.0,
            seed: Some(3),
            decode,
            ..Default::default()
        };
        let (fixed, dynamic) = (params(DecodePath::Graphs), params(DecodePath::Dynamic));
        let g = |x: &Qwen2, p: &SampleParams| generate(x, &prompts, p, &[], &mut |_, _| false);
        let reference = g(&base, &fixed).unwrap();
        for (seed, m) in [(1, &a), (2, &b)] {
            // Twice: the second time after an update of the adapters in place, which the
            // decoder must pick up (an optimizer step between rollouts).
            for round in 0..2 {
                perturb(m, seed + 10 * round);
                let (x, y) = (g(m, &fixed).unwrap(), g(m, &dynamic).unwrap());
                assert_eq!(x.tokens, y.tokens, "agent {seed} round {round}");
                for (r, s) in x.log_probs.iter().zip(&y.log_probs) {
                    for (u, v) in r.iter().zip(s) {
                        assert!((u - v).abs() < 1e-4, "agent {seed} round {round}: {u} {v}");
                    }
                }
                let moved = x
                    .log_probs
                    .iter()
                    .flatten()
                    .zip(reference.log_probs.iter().flatten());
                let moved = moved.map(|(u, v)| (u - v).abs()).fold(0f32, f32::max);
                assert!(
                    moved > 1e-3,
                    "agent {seed}: the adapters had no effect ({moved})"
                );
            }
            let d = m.decoder.lock().unwrap();
            assert!(!d.as_ref().expect("a decoder").holds_a_copy());
        }
        // The base and its other shares are untouched: the reference decodes as before.
        let again = g(&base, &fixed).unwrap();
        assert_eq!(again.tokens, reference.tokens);
        assert_eq!(again.log_probs, reference.log_probs);
    }
}

#[cfg(test)]
mod sampling_only_tests {
    use super::*;
    use crate::generate::{SampleParams, generate};

    #[test]
    fn a_model_frozen_for_sampling_decodes_from_its_own_weights_as_a_trainable_one_does() {
        let _rng = crate::torch_rng();
        tch::manual_seed(4);
        let cfg = Qwen2Config::new(64, 16, 32, 2, 4, 2, 32, true);
        let m = Qwen2::new(cfg, Device::Cpu).unwrap();
        let dir = tempfile::tempdir().unwrap();
        m.save(&dir.path().join("a")).unwrap();
        let frozen =
            Qwen2::load_for_sampling(&dir.path().join("a"), Device::Cpu, Kind::Float).unwrap();
        let prompts = vec![vec![3i64, 9, 27], vec![17, 51, 5, 8, 2]];
        let p = SampleParams {
            max_new_tokens: 12,
            temperature: 1.0,
            seed: Some(3),
            ..Default::default()
        };
        let g = |x: &Qwen2| generate(x, &prompts, &p, &[], &mut |_, _| false).unwrap();
        let (a, b) = (g(&m), g(&frozen));
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(a.log_probs, b.log_probs);
        // The trainable model's decoder holds a copy of the weights; the frozen one's none.
        let copy = |x: &Qwen2| {
            let d = x.decoder.lock().unwrap();
            d.as_ref().expect("a decoder").holds_a_copy()
        };
        assert!(copy(&m));
        assert!(!copy(&frozen));
        assert!(frozen.vs.trainable_variables().is_empty());
        // No weight carries an autograd graph: one would keep the unfused copies alive.
        for (name, t) in frozen.vs.variables() {
            assert!(!t.requires_grad(), "{name} requires grad");
        }
        // Fused in place, the weights still save and load as the same model.
        frozen.save(&dir.path().join("b")).unwrap();
        let back = Qwen2::load(&dir.path().join("b"), Device::Cpu, Kind::Float).unwrap();
        let ids = Tensor::from_slice(&[3i64, 9, 27, 17]).view([1, 4]);
        let logits = |x: &Qwen2| tch::no_grad(|| x.forward(&ids, None, None, None).unwrap());
        let diff = (logits(&back) - logits(&m)).abs().max().double_value(&[]);
        assert_eq!(diff, 0.0);
    }
}
