//! The static-cache decoder of [`crate::generate`] ([`DecodePath::Graphs`] and
//! [`DecodePath::Static`]): the prompts' forward pass fills a preallocated KV cache, then every
//! decode step is one [`Qwen2::forward_static`] plus sampling on the device, writing its token
//! and log-probability into device buffers; the host reads them back every [`SYNC_EVERY`] steps.
//! On a GPU each step is captured once per (batch size, attention length, sampling parameters)
//! as a CUDA graph and replayed (one launch instead of about 400 kernel launches for `small`).
//!
//! The decoder belongs to its model (`Qwen2::decoder`) and is kept between calls: the weights
//! it runs, one set of buffers per batch size, and the graphs. A model whose weights are
//! fused in place in the compute dtype ([`Qwen2::fuse_in_place`]: one that only samples,
//! [`Qwen2::freeze_for_sampling`], or LoRA agents on a fused frozen base) is decoded from
//! those weights, its adapters stacked beside them ([`Qwen2::decoding_weights`]); any other
//! (a float32 master) from the decoder's own copy in the compute dtype with the adapters
//! merged in. The copy or the stacked adapters are written again in place when libtorch's
//! version counters say the model's weights or adapters changed, so graphs stay valid after
//! an optimizer step. Batch sizes are rounded up to a power of two (extra rows decode a dummy token,
//! ignored) and attention lengths to a multiple of [`LEN_BUCKET`] (keys past a row's last
//! token are masked), so a run captures few graphs. Measured: `cudarl-pipe bench decode`
//! (`benchmarks/results/decode_*.json`).

use std::collections::{BTreeMap, HashMap};

use tch::{Device, Kind, Tensor};

use crate::cuda_graph::{self, CudaGraph, GraphPool};
use crate::generate::{DecodePath, Padded, Rows, SampleParams, prefill_chunks, sample, to_host};
use crate::model::{FusedWeights, StaticKv};
use crate::{ModelError, Qwen2};

/// Decode steps between reads of the new tokens to the host (stop checks, `on_finish`). A
/// batch whose rows all ended runs at most this many steps too many.
pub const SYNC_EVERY: usize = 16;

/// Attention lengths are rounded up to a multiple of this (one graph per bucket).
pub const LEN_BUCKET: i64 = 256;

/// `x` rounded up to a multiple of `m` (both positive).
fn round_up(x: i64, m: i64) -> i64 {
    (x + m - 1) / m * m
}

/// The state of one batch size on the device.
#[derive(Debug)]
struct Buffers {
    kv: StaticKv,
    /// The last token of each row `[B, 1]` (int64): the next step's input.
    tok: Tensor,
    /// Its RoPE position `[B, 1]` (int64).
    pos: Tensor,
    /// The cache column it is written to `[1]` (int64).
    cur: Tensor,
    /// The index of the token the next step samples `[1]` (int64).
    step: Tensor,
    /// Which cache columns each row attends to `[B, cap]` (bool).
    valid: Tensor,
    /// Sampled tokens `[B, cap]` (int64) and log-probabilities `[B, cap]` (float32) by index.
    hist_tok: Tensor,
    hist_lp: Tensor,
}

impl Buffers {
    fn new(model: &Qwen2, b: i64, cap: i64) -> Buffers {
        let dev = model.device();
        let i64s = |shape: &[i64]| Tensor::zeros(shape, (Kind::Int64, dev));
        Buffers {
            kv: model.static_kv(b, cap),
            tok: i64s(&[b, 1]),
            pos: i64s(&[b, 1]),
            cur: i64s(&[1]),
            step: i64s(&[1]),
            valid: Tensor::zeros([b, cap], (Kind::Bool, dev)),
            hist_tok: i64s(&[b, cap]),
            hist_lp: Tensor::zeros([b, cap], (Kind::Float, dev)),
        }
    }

    /// One decode step (see the module docs); issues device work only, so it can be captured.
    fn step(
        &mut self,
        (model, fused): (&Qwen2, &FusedWeights),
        len: i64,
        params: &SampleParams,
    ) -> Result<(), ModelError> {
        let _ = self.valid.f_index_fill_(1, &self.cur, 1i64)?;
        let b = self.tok.size()[0];
        // 0 where attended, -inf elsewhere: log of the mask as float.
        let bias = self
            .valid
            .narrow(1, 0, len)
            .to_kind(Kind::Float)
            .log()
            .view([b, 1, 1, len]);
        let (t, p, c) = (&self.tok, &self.pos, &self.cur);
        let logits = model.forward_static(t, p, c, &bias, (fused, &mut self.kv), len)?;
        let (next, lp) = sample(&logits, params)?;
        let _ = self.hist_tok.f_index_copy_(1, &self.step, &next)?;
        let _ = self.hist_lp.f_index_copy_(1, &self.step, &lp)?;
        self.tok.f_copy_(&next)?;
        let _ = self.pos.f_add_scalar_(1)?;
        let _ = self.cur.f_add_scalar_(1)?;
        let _ = self.step.f_add_scalar_(1)?;
        Ok(())
    }
}

/// Graphs are keyed by batch size, attention length and the sampling parameters baked in.
type GraphKey = (i64, i64, u64, u64);

/// See the module docs.
pub(crate) struct Decoder {
    /// The weights copy; `None`: the master's own weights, fused in place.
    model: Option<Qwen2>,
    /// The decoding weights' fused projections ([`Qwen2::fuse_in_place`]: views of them are
    /// the decoding model's own weights) and, decoding a LoRA master's own base, its stacked
    /// adapters.
    fused: FusedWeights,
    /// The master weights' [`weights_stamp`] when `model` or the stacked adapters were last
    /// written.
    stamp: Option<(i64, usize)>,
    sets: BTreeMap<i64, Buffers>,
    graphs: HashMap<GraphKey, CudaGraph>,
    pool: Option<GraphPool>,
}

impl Decoder {
    /// A decoder of `master`'s own fused weights and adapters where it has them
    /// ([`Qwen2::decoding_weights`]), else of a copy in the compute dtype.
    fn new(master: &Qwen2) -> Result<Decoder, ModelError> {
        if let Some(fused) = master.decoding_weights() {
            return Ok(Self::over(fused, None));
        }
        let mut model = Qwen2::new_in(
            master.config.clone(),
            master.device(),
            master.compute_kind(),
        )?;
        model.fuse_in_place();
        let fused = model
            .decoding_weights()
            .expect("fused in the compute dtype");
        Ok(Self::over(fused, Some(model)))
    }

    /// A decoder of the weights behind `fused`: `model`'s, or with `None` its master's.
    fn over(fused: FusedWeights, model: Option<Qwen2>) -> Decoder {
        Decoder {
            model,
            fused,
            stamp: None,
            sets: BTreeMap::new(),
            graphs: HashMap::new(),
            pool: None,
        }
    }

    /// Whether it runs a copy of its master's weights (else the master's own).
    #[cfg(test)]
    pub(crate) fn holds_a_copy(&self) -> bool {
        self.model.is_some()
    }

    /// The model whose weights this decoder runs: its copy, else `master`.
    fn weights<'a>(&'a self, master: &'a Qwen2) -> &'a Qwen2 {
        self.model.as_ref().unwrap_or(master)
    }

    /// Buffers for batch size `b` with at least `need` columns (new ones drop that batch
    /// size's graphs, which point at the old ones). Once no graph is left the pool goes too:
    /// libtorch releases a pool whose last graph is freed, and a capture into its id then fails
    /// (`create_or_incref_pool`'s `use_count > 0` assertion, seen on an H200 when a resumed
    /// `rl-train` with `control` regrew its only batch size's buffers).
    fn buffers(&mut self, master: &Qwen2, b: i64, need: i64) -> &mut Buffers {
        if self.sets.get(&b).is_none_or(|s| s.kv.capacity() < need) {
            let cap = round_up(need, LEN_BUCKET);
            self.graphs.retain(|k, _| k.0 != b);
            if self.graphs.is_empty() {
                self.pool = None;
            }
            let bufs = Buffers::new(self.weights(master), b, cap);
            self.sets.insert(b, bufs);
        }
        self.sets.get_mut(&b).expect("inserted above")
    }

    /// One decode step of batch size `b` attending to `len` columns: a graph replay when one
    /// was captured, else run directly and, where graphs are on, captured for the next time.
    fn step(
        &mut self,
        master: &Qwen2,
        b: i64,
        len: i64,
        params: &SampleParams,
    ) -> Result<(), ModelError> {
        let key = (b, len, params.temperature.to_bits(), params.top_p.to_bits());
        if let Some(g) = self.graphs.get_mut(&key) {
            return g.replay();
        }
        let Decoder {
            model,
            fused,
            sets,
            pool,
            ..
        } = self;
        let model = model.as_ref().unwrap_or(master);
        let weights = (model, &*fused);
        let bufs = sets.get_mut(&b).expect("buffers before steps");
        // The first step of a shape runs directly: it is real work, and it initializes what
        // must not be created during a capture (cuBLAS workspaces).
        bufs.step(weights, len, params)?;
        let graphs = params.decode == DecodePath::Graphs && cuda_graph::available();
        if let (true, Device::Cuda(d)) = (graphs, model.device()) {
            let pool = match pool {
                Some(p) => *p,
                None => *pool.insert(GraphPool::new()?),
            };
            let (g, ()) = CudaGraph::capture(d, pool, || bufs.step(weights, len, params))?;
            self.graphs.insert(key, g);
        }
        Ok(())
    }
}

/// A stamp of `model`'s weights and LoRA adapters that changes whenever one changes: the sum
/// of libtorch's version counters (each in-place write increases one) and of the storage addresses. `-1`
/// first when versions cannot be read (then the weights are always copied).
fn weights_stamp(model: &Qwen2) -> (i64, usize) {
    let vars = model.all_variables();
    let mut v = 0i64;
    let mut ptrs = 0usize;
    for t in &vars {
        let x = cuda_graph::tensor_version(t);
        if x < 0 {
            return (-1, 0);
        }
        v = v.wrapping_add(x);
        ptrs = ptrs.wrapping_add(t.data_ptr() as usize);
    }
    (v, ptrs)
}

/// The static-cache decode of `prompts` into `rows` (see the module docs).
///
/// # Errors
/// libtorch and CUDA-graph errors.
pub(crate) fn generate_static(
    master: &Qwen2,
    prompts: &[Vec<i64>],
    params: &SampleParams,
    rows: &mut Rows<'_>,
) -> Result<(), ModelError> {
    let mut slot = master.decoder.lock().unwrap_or_else(|e| e.into_inner());
    if slot
        .as_ref()
        .is_none_or(|d| d.weights(master).kind() != master.compute_kind())
    {
        *slot = Some(Box::new(Decoder::new(master)?));
    }
    let dec = slot.as_mut().expect("set above");
    let stamp = weights_stamp(master);
    if stamp.0 < 0 || dec.stamp != Some(stamp) {
        match &mut dec.model {
            Some(copy) => copy.copy_merged_from(master)?,
            None => dec.fused.copy_adapters_from(master)?,
        }
        dec.stamp = Some(stamp);
    }
    // Seeded again after the decoder's construction, whose random init draws from the same
    // generator: a seeded batch samples the same whether this model had a decoder yet or not
    // (a resumed RL run's first batch is its straight run's).
    if let Some(s) = params.seed {
        tch::manual_seed(s);
    }
    let b = prompts.len();
    let bb = b.next_power_of_two() as i64;
    let p = Padded::new(prompts, master.device());
    let w = p.ids.size()[1];
    let max_new = params.max_new_tokens as i64;
    dec.buffers(master, bb, w + max_new);
    // The prefill writes each layer's keys and values straight into the static buffers.
    let bufs = dec.sets.get_mut(&bb).expect("made above");
    let m = dec.model.as_ref().unwrap_or(master);
    let logits = prefill_chunks(m, &p, params, Some(&bufs.kv))?
        .0
        .squeeze_dim(1);
    let (t0, lp0) = sample(&logits, params)?;
    drop(logits);
    let rows_of = |t: &Tensor| t.narrow(0, 0, b as i64);
    let _ = bufs.valid.f_fill_(0i64)?;
    rows_of(&bufs.valid).narrow(1, 0, w).f_copy_(&p.mask)?;
    let _ = bufs.tok.f_fill_(0i64)?;
    rows_of(&bufs.tok).f_copy_(&t0)?;
    let _ = bufs.pos.f_fill_(0i64)?;
    rows_of(&bufs.pos).f_copy_(&p.next_pos)?;
    let _ = bufs.cur.f_fill_(w)?;
    let _ = bufs.step.f_fill_(1i64)?;
    rows_of(&bufs.hist_tok).narrow(1, 0, 1).f_copy_(&t0)?;
    rows_of(&bufs.hist_lp).narrow(1, 0, 1).f_copy_(&lp0)?;
    // Tokens 0..read are on the host; token s comes from step s (token 0 from the prefill).
    let mut read = 0i64;
    for s in 0..max_new {
        if s > 0 {
            // Step s writes the cache column of token s-1, w + s - 1, and attends to it.
            let len = round_up(w + s, LEN_BUCKET);
            dec.step(master, bb, len, params)?;
        }
        if (s + 1) % SYNC_EVERY as i64 == 0 || s + 1 == max_new {
            let bufs = dec.sets.get(&bb).expect("buffers");
            let n = s + 1 - read;
            let (toks, lps) = to_host(
                &rows_of(&bufs.hist_tok).narrow(1, read, n),
                &rows_of(&bufs.hist_lp).narrow(1, read, n),
            )?;
            for i in 0..b {
                for j in 0..n as usize {
                    let k = i * n as usize + j;
                    rows.push(i, toks[k], lps[k]);
                }
            }
            read = s + 1;
            if rows.all_done() {
                break;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{SampleParams, generate};
    use crate::job::ModelConfig;

    /// A decoder whose only batch size outgrows its buffers drops every graph of its pool, and
    /// the next capture must go into a fresh pool. Gated: `CUDARL_GPU=1` on a GPU machine.
    #[test]
    fn graphs_are_captured_again_after_the_only_batch_size_outgrew_its_buffers() {
        if std::env::var("CUDARL_GPU").as_deref() != Ok("1") {
            eprintln!("SKIPPED graphs_are_captured_again...: GPU test (set CUDARL_GPU=1)");
            return;
        }
        assert!(cuda_graph::available(), "built without CUDA graphs");
        // Seeding and sampling reset the generator CPU tests draw from.
        let _rng = crate::torch_rng();
        let spec = cudarl_protocol::ModelSpec {
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 2048,
            tie_word_embeddings: true,
            rope_theta: 10_000.0,
        };
        tch::manual_seed(0);
        let m = Qwen2::new(spec.config(100), Device::Cuda(0)).unwrap();
        let prompts = vec![vec![1i64, 2, 3, 4]; 2];
        // 16, then 600 new tokens (past the first buffers' 256 columns), then 16 again.
        for n in [16, 600, 16] {
            let p = SampleParams {
                max_new_tokens: n,
                temperature: 1.0,
                seed: Some(0),
                decode: DecodePath::Graphs,
                ..Default::default()
            };
            let g = generate(&m, &prompts, &p, &[], &mut |_, _| false).unwrap();
            assert!(g.tokens.iter().all(|t| t.len() == n), "{n}");
        }
        let dec = m.decoder.lock().unwrap();
        let dec = dec.as_ref().expect("a decoder");
        assert!(!dec.graphs.is_empty(), "the longer decode was captured");
    }
}
