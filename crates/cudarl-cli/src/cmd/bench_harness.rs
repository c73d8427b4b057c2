//! `bench harness`: the RL harness ([`cudarl_rl::harness::Harness`], what rollouts and `eval`
//! judge with) on one batch of distinct kernel sources, streamed through the harness scheduler
//! ([`cudarl_cuda::schedule`]: each build goes to a GPU tester as soon as it is done) against the
//! same batch built first and tested after (every build started as a prefetch and waited for
//! before the first GPU job), each on sources no earlier round compiled. Measured on an H200
//! with 32 candidates: 6.2 s streamed against 9.7 s built first
//! (`benchmarks/results/harness_scheduler_h200_2026-11-26.json`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cudarl_core::Store;
use cudarl_cuda::{Compiler, Nvcc, TaskSpec};
use cudarl_rl::episode::Tester;
use cudarl_rl::harness::Harness;
use serde_json::json;

use super::{CliError, Ctx};
use crate::cmd::bench::{finish, machine};

/// One batch through the harness: `(wall s, correct, the harness's phases)`.
fn one_batch(
    h: &mut Harness,
    items: &[(TaskSpec, String)],
    compile_first: bool,
) -> Result<(f64, usize, serde_json::Value), CliError> {
    let refs: Vec<(&TaskSpec, &str)> = items.iter().map(|(t, c)| (t, c.as_str())).collect();
    let mark = h.mark();
    let t0 = Instant::now();
    if compile_first {
        for (t, c) in &refs {
            h.prefetch(t, c);
        }
    }
    let verdicts = h.test_many(&refs)?;
    let wall = t0.elapsed().as_secs_f64();
    let used = h.since(&mark);
    let correct = verdicts
        .iter()
        .filter(|(v, _)| v.correct == Some(true))
        .count();
    Ok((wall, correct, json!(used.seconds_json())))
}

/// Runs the benchmark: `rounds` pairs of batches of `kernels` candidates (the task families'
/// naive and optimized kernels in turn, each with a comment naming its round so nvcc builds
/// every one), streamed and compile-first alternating, after one warm-up batch.
///
/// # Errors
/// No nvcc, an unreadable task family, a harness failure.
pub fn run(
    ctx: &Ctx,
    kernels: usize,
    rounds: usize,
    out: Option<std::path::PathBuf>,
) -> Result<i32, CliError> {
    let fail = |e: String| CliError::failed(e);
    let tasks = cudarl_cuda::load_tasks(&ctx.root.join("datasets/tasks"))
        .map_err(|e| fail(e.to_string()))?;
    let mut pool: Vec<(TaskSpec, String)> = Vec::new();
    let mut naive = BTreeMap::new();
    for t in &tasks {
        let n = t.naive_source().map_err(|e| fail(e.to_string()))?;
        naive.insert(t.spec.id.clone(), n.clone());
        pool.push((t.spec.clone(), n));
        for (_, s) in t.optimized_sources().map_err(|e| fail(e.to_string()))? {
            pool.push((t.spec.clone(), s));
        }
    }
    if pool.is_empty() {
        return Err(fail("no task families under datasets/tasks".into()));
    }
    let batch = |tag: &str, n: usize| -> Vec<(TaskSpec, String)> {
        (0..n)
            .map(|i| {
                let (t, s) = &pool[i % pool.len()];
                (t.clone(), format!("{s}\n// bench harness {tag} {i}\n"))
            })
            .collect()
    };
    let tmp = tempfile::tempdir().map_err(|e| fail(e.to_string()))?;
    let store = Store::open(tmp.path().join("store")).map_err(|e| fail(e.to_string()))?;
    let nvcc = Nvcc::discover(&ctx.root).map_err(|e| fail(e.to_string()))?;
    let gpu = cudarl_cuda::gpu::probe();
    let compiler = Compiler {
        nvcc,
        arch: gpu
            .as_ref()
            .map(|g| g.arch.clone())
            .unwrap_or_else(|| "sm_90".into()),
        timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
        store: Some(store),
    };
    let mut h = Harness::new(compiler, gpu.is_some(), Duration::from_secs(60), naive)?;
    one_batch(&mut h, &batch("warm-up", pool.len().min(kernels)), false)?;
    let (mut streamed, mut first) = (Vec::new(), Vec::new());
    let mut runs = Vec::new();
    for r in 0..rounds.max(1) {
        // Alternate which goes first, so neither always meets a warmer machine.
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for compile_first in order {
            let tag = format!("{}{r}", if compile_first { "first" } else { "streamed" });
            let (s, correct, phases) = one_batch(&mut h, &batch(&tag, kernels), compile_first)?;
            runs.push(
                json!({"round": r, "compile_first": compile_first, "seconds": s,
                "correct": correct, "phases": phases}),
            );
            if compile_first {
                first.push(s)
            } else {
                streamed.push(s)
            }
        }
    }
    let (ms, mf) = (
        crate::cmd::bench::median(streamed),
        crate::cmd::bench::median(first),
    );
    finish(
        json!({
            "bench": "harness",
            "what": "RL harness test_many on one batch of distinct kernel sources: streamed (each build tested as soon as it is done) vs compile-first (every build done before the first GPU job)",
            "kernels": kernels,
            "rounds": rounds.max(1),
            "gpu": gpu.map(|g| g.name).unwrap_or_else(|| "none (compile-only)".into()),
            "machine": machine(),
            "median_streamed_s": ms,
            "median_compile_first_s": mf,
            "speedup_vs_compile_first": mf / ms,
            "runs": runs,
        }),
        out,
    )
}
