//! The trainer's side of `cudarl-pipe bench decode` ([`cudarl_protocol::Job::BenchDecode`]):
//! prefill and decode throughput of [`crate::generate`] per batch size and [`DecodePath`].

use std::time::Instant;

use cudarl_protocol::DecodePathName;
use tch::{Device, Tensor};

use crate::generate::{DecodePath, SampleParams, generate};
use crate::job::{ModelConfig, sync};
use crate::train::ComputeKind;
use crate::{ModelError, Qwen2};

/// What one batch size and path measured: the prompts' forward pass and the decode steps,
/// timed apart (median of `reps` each; decode = whole generation minus the forward pass).
#[derive(Debug, serde::Serialize)]
struct Record {
    batch: usize,
    path: &'static str,
    prompt_len: usize,
    new_tokens_per_row: usize,
    prefill_seconds: f64,
    prefill_tokens_per_s: f64,
    decode_seconds: f64,
    /// New tokens of all rows after the first, per second of decoding.
    tokens_per_s: f64,
    /// One decode step (ms).
    step_ms: f64,
    /// libtorch's allocator over this path's runs at this batch size, from its state after
    /// the last (GiB; `torch.cuda.max_memory_allocated` / `max_memory_reserved`; absent on
    /// a CPU).
    peak_allocated_gib: Option<f64>,
    peak_reserved_gib: Option<f64>,
}

/// Bytes as GiB.
fn gib(b: u64) -> f64 {
    b as f64 / f64::from(1u32 << 30)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `b` prompts of uniformly random tokens below `vocab`, row `i` of `len(i)` tokens.
fn random_prompts(vocab: i64, b: usize, len: impl Fn(usize) -> usize) -> Vec<Vec<i64>> {
    (0..b)
        .map(|i| {
            let t = Tensor::randint(vocab, [len(i) as i64], (tch::Kind::Int64, Device::Cpu));
            Vec::<i64>::try_from(t).unwrap_or_default()
        })
        .collect()
}

/// The job (see [`cudarl_protocol::Job::BenchDecode`]).
///
/// # Errors
/// libtorch, generation or save errors.
pub(crate) fn bench_decode(
    spec: &cudarl_protocol::ModelSpec,
    vocab: i64,
    (batches, paths): (&[usize], &[DecodePathName]),
    (prompt_len, gen_tokens, reps): (usize, usize, usize),
    precision: crate::train::Precision,
    dev: Device,
    save_to: &std::path::Path,
) -> Result<serde_json::Value, ModelError> {
    tch::manual_seed(0);
    // In the compute dtype and decoding from its own weights, as `transformers` holds it.
    let kind = precision.compute_kind(dev).unwrap_or(tch::Kind::Float);
    let mut m = Qwen2::new_in(spec.config(vocab), dev, kind)?;
    m.save(save_to)?;
    m.freeze_for_sampling()?;
    let gen_tokens = gen_tokens.max(2);
    let mut records = Vec::new();
    for &b in batches {
        let prompts = random_prompts(vocab, b, |_| prompt_len.max(1));
        let paths = if paths.is_empty() {
            &DecodePathName::ALL[..]
        } else {
            paths
        };
        for &name in paths {
            let path = match name {
                DecodePathName::Graphs => DecodePath::Graphs,
                DecodePathName::Static => DecodePath::Static,
                DecodePathName::Dynamic => DecodePath::Dynamic,
            };
            let run = |n: usize| -> Result<f64, ModelError> {
                let p = SampleParams {
                    max_new_tokens: n,
                    temperature: 0.0,
                    seed: Some(0),
                    decode: path,
                    ..Default::default()
                };
                sync(dev);
                let t0 = Instant::now();
                let g = generate(&m, &prompts, &p, &[], &mut |_, _| false)?;
                sync(dev);
                debug_assert!(g.tokens.iter().all(|t| t.len() == n));
                Ok(t0.elapsed().as_secs_f64())
            };
            crate::cuda_graph::gpu_memory(dev, true);
            run(gen_tokens)?;
            let mut pre = Vec::new();
            let mut all = Vec::new();
            for _ in 0..reps.max(1) {
                pre.push(run(1)?);
                all.push(run(gen_tokens)?);
            }
            let (pre, all) = (median(pre), median(all));
            let decode = (all - pre).max(1e-9);
            let steps = (gen_tokens - 1) as f64;
            let mem = crate::cuda_graph::gpu_memory(dev, false);
            records.push(Record {
                batch: b,
                path: name.as_str(),
                prompt_len,
                new_tokens_per_row: gen_tokens,
                prefill_seconds: pre,
                prefill_tokens_per_s: (b * prompt_len) as f64 / pre,
                decode_seconds: decode,
                tokens_per_s: b as f64 * steps / decode,
                step_ms: decode / steps * 1e3,
                peak_allocated_gib: mem.map(|m| gib(m.peak_allocated)),
                peak_reserved_gib: mem.map(|m| gib(m.peak_reserved)),
            });
        }
    }
    let checks = batches
        .iter()
        .map(|&b| agreement(&m, vocab, b, (prompt_len, gen_tokens.min(64)), paths))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(serde_json::json!({
        "impl": "cudarl-train (tch)", "checks": checks, "device": format!("{dev:?}"),
        "compute_dtype": format!("{:?}", m.compute_kind()),
        "parameters": m.config.num_parameters(),
        "weights_gib": gib(m.all_variables().iter().map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64).sum()),
        "cuda_graphs": crate::cuda_graph::available(),
        "records": records,
    }))
}

/// The log-probabilities the training path gives `tokens` after `prompt` (one row, the whole
/// sequence in one forward pass of `m` as the policy loss computes it, logits / `temperature`).
fn training_log_probs(
    m: &Qwen2,
    prompt: &[i64],
    tokens: &[i64],
    temperature: f64,
) -> Result<Vec<f32>, ModelError> {
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(&tokens[..tokens.len() - 1]);
    let ids = Tensor::from_slice(&seq).view([1, -1]).to_device(m.device());
    let logits = m.forward(&ids, None, None, None)?;
    let lp = (logits.narrow(1, prompt.len() as i64 - 1, tokens.len() as i64) / temperature)
        .log_softmax(-1, tch::Kind::Float);
    let t = Tensor::from_slice(tokens)
        .view([1, -1, 1])
        .to_device(m.device());
    Ok(Vec::<f32>::try_from(
        lp.gather(-1, &t, false).view([-1]).to_device(Device::Cpu),
    )?)
}

/// Whether the paths agree at batch size `b` (`n` new tokens of random prompts of different
/// lengths): greedy tokens of [`DecodePath::Graphs`] against [`DecodePath::Static`] (the same
/// kernels: identical) and [`DecodePath::Dynamic`] (other attention kernels: rows may part at a
/// near tie), each where `paths` has it, and the log-probabilities of tokens sampled by the
/// graphs (temperature 1, top-p 0.95) against the training path's of the same tokens (first 4
/// rows).
fn agreement(
    m: &Qwen2,
    vocab: i64,
    b: usize,
    (prompt_len, n): (usize, usize),
    paths: &[DecodePathName],
) -> Result<serde_json::Value, ModelError> {
    let prompts = random_prompts(vocab, b, |i| (prompt_len.max(2) - i % 7).max(1));
    let run = |path: DecodePath, temperature: f64, top_p: f64| {
        let p = SampleParams {
            max_new_tokens: n,
            temperature,
            top_p,
            seed: Some(1),
            decode: path,
            ..Default::default()
        };
        generate(m, &prompts, &p, &[], &mut |_, _| false)
    };
    let g = run(DecodePath::Graphs, 0.0, 1.0)?;
    let measured = |p: DecodePathName| paths.is_empty() || paths.contains(&p);
    let s = measured(DecodePathName::Static)
        .then(|| run(DecodePath::Static, 0.0, 1.0))
        .transpose()?;
    let d = measured(DecodePathName::Dynamic)
        .then(|| run(DecodePath::Dynamic, 0.0, 1.0))
        .transpose()?;
    let same_rows = |x: &Option<crate::Generation>| {
        x.as_ref().map(|x| {
            g.tokens
                .iter()
                .zip(&x.tokens)
                .filter(|(a, b)| a == b)
                .count()
        })
    };
    let sampled = run(DecodePath::Graphs, 1.0, 0.95)?;
    let mut err = 0f32;
    for (i, p) in prompts.iter().enumerate().take(4) {
        let lp = training_log_probs(m, p, &sampled.tokens[i], 1.0)?;
        for (a, b) in lp.iter().zip(&sampled.log_probs[i]) {
            err = err.max((a - b).abs());
        }
    }
    Ok(serde_json::json!({
        "batch": b, "new_tokens": n,
        "greedy_rows_equal_static": same_rows(&s), "greedy_rows_equal_dynamic": same_rows(&d),
        "greedy_log_probs_equal_static": s.as_ref().map(|s| g.log_probs == s.log_probs),
        "sampled_max_log_prob_error_vs_training": err,
    }))
}
