//! `cudarl-pipe bench decode`: the trainer's decode throughput per batch size and decode path
//! (a `bench-decode` trainer job), against `transformers` on the same weights with its static
//! cache and `torch.compile(mode="reduce-overhead")` (`python/bench_decode.py`), in one run.
//! The result has one row per batch size: `tokens_per_s` (CUDA graphs, the default path),
//! `baseline_tokens_per_s` (the previous dynamic-cache path), `transformers_tokens_per_s`, the
//! ratios, the prompts' forward pass (`prefill_tokens_per_s`) of each, and the CUDA graphs
//! path's and `transformers`' peak GPU memory at that batch size (libtorch's allocator, GiB).

use std::path::Path;

use cudarl_protocol::DecodePathName;

use super::bench::{finish_fields, last_json, model_file};
use super::{CliError, Ctx};

/// What to measure.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// `configs/model/<model>.toml`.
    #[arg(long, default_value = "small")]
    pub model: String,
    /// Batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,64,256")]
    pub batches: Vec<usize>,
    /// Prompt tokens per row.
    #[arg(long, default_value_t = 512)]
    pub prompt_len: usize,
    /// New tokens per row.
    #[arg(long, default_value_t = 256)]
    pub gen_tokens: usize,
    /// Timed repetitions (medians).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// `auto`, `cpu` or `cuda`.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Leave out the `transformers` baseline.
    #[arg(long)]
    pub no_transformers: bool,
    /// The trainer's decode paths to measure (`graphs`, `static`, `dynamic`; default all). One
    /// path alone makes the process's peak memory that path's.
    #[arg(long, value_delimiter = ',')]
    pub paths: Vec<String>,
}

/// The record of `batch` and `path` in a job's or script's `records`.
fn record<'a>(v: &'a serde_json::Value, batch: usize, path: &str) -> &'a serde_json::Value {
    v["records"]
        .as_array()
        .and_then(|rs| {
            rs.iter().find(|r| {
                r["batch"].as_u64() == Some(batch as u64)
                    && r["path"].as_str().is_some_and(|p| p.starts_with(path))
            })
        })
        .unwrap_or(&serde_json::Value::Null)
}

/// Runs the benchmark; the JSON result.
///
/// # Errors
/// A bad model name (usage), the trainer or the baseline script failing.
pub fn run(ctx: &Ctx, a: &Args) -> Result<serde_json::Value, CliError> {
    let mf = model_file(ctx, &a.model)?;
    let paths = a
        .paths
        .iter()
        .map(|p| {
            DecodePathName::ALL
                .into_iter()
                .find(|n| n.as_str() == p)
                .ok_or_else(|| {
                    CliError::usage(format!(
                        "--paths: unknown decode path `{p}` (graphs, static or dynamic)"
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dir = tempfile::tempdir().map_err(|e| CliError::failed(e.to_string()))?;
    let job = serde_json::json!({
        "kind": "bench-decode", "model": mf.model, "vocab_size": mf.tokenizer.vocab_size,
        "batches": a.batches, "prompt_len": a.prompt_len, "gen_tokens": a.gen_tokens,
        "reps": a.reps, "paths": paths, "device": a.device, "save_to": dir.path().join("model"),
    });
    let jp = dir.path().join("job.json");
    std::fs::write(&jp, job.to_string()).map_err(|e| CliError::failed(e.to_string()))?;
    let ours = last_json(&cudarl_rl::trainer::trainer_exe(), &[&jp])?;
    let hf = if !a.no_transformers {
        let script = ctx.root.join("python/bench_decode.py");
        last_json(
            &cudarl_cuda::pyworker::python(&ctx.root),
            &[Path::new(&script), &jp],
        )?
    } else {
        serde_json::Value::Null
    };
    let ratio = |x: &serde_json::Value, y: &serde_json::Value| {
        x.as_f64().zip(y.as_f64()).map(|(x, y)| x / y)
    };
    let rows: Vec<serde_json::Value> = a
        .batches
        .iter()
        .map(|&b| {
            let (g, s, d) = (
                record(&ours, b, "graphs"),
                record(&ours, b, "static"),
                record(&ours, b, "dynamic"),
            );
            let t = record(&hf, b, "transformers");
            serde_json::json!({
                "batch": b,
                "tokens_per_s": g["tokens_per_s"],
                "baseline_tokens_per_s": d["tokens_per_s"],
                "transformers_tokens_per_s": t["tokens_per_s"],
                "static_no_graphs_tokens_per_s": s["tokens_per_s"],
                "speedup_vs_baseline": ratio(&g["tokens_per_s"], &d["tokens_per_s"]),
                "speedup_vs_transformers": ratio(&g["tokens_per_s"], &t["tokens_per_s"]),
                "step_ms": g["step_ms"], "baseline_step_ms": d["step_ms"],
                "transformers_step_ms": t["step_ms"],
                "prefill_tokens_per_s": g["prefill_tokens_per_s"],
                "baseline_prefill_tokens_per_s": d["prefill_tokens_per_s"],
                "transformers_prefill_tokens_per_s": t["prefill_tokens_per_s"],
                "peak_allocated_gib": g["peak_allocated_gib"],
                "peak_reserved_gib": g["peak_reserved_gib"],
                "transformers_peak_allocated_gib": t["peak_allocated_gib"],
                "transformers_peak_reserved_gib": t["peak_reserved_gib"],
            })
        })
        .collect();
    Ok(finish_fields(serde_json::json!({
        "bench": "decode", "model": a.model, "job": job, "rows": rows,
        "ours": ours, "transformers": hf,
    })))
}
