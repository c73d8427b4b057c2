//! `cudarl-pipe check`: one kernel through the harness.

use std::path::Path;
use std::time::Duration;

use clap::ValueEnum;
use cudarl_cuda::verdict::{Baselines, FullOptions, check_full, hidden_salt, hidden_seeds};
use cudarl_cuda::worker::WorkerPool;
use cudarl_cuda::{Compiler, Nvcc, Rules, check_compile_only, load_tasks};

use super::{CliError, Ctx};

/// Check modes.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Mode {
    /// Full on a GPU, compile-only without one.
    Auto,
    /// Static checks and compile only.
    Compile,
    /// Also run and time on the GPU (fails without one).
    Full,
}

/// Runs `check`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    ctx: &Ctx,
    task_id: &str,
    source: &Path,
    mode: Mode,
    arch: Option<String>,
    bench: bool,
    timeout: u64,
    json: bool,
) -> Result<i32, CliError> {
    let tasks =
        load_tasks(&ctx.root.join("datasets/tasks")).map_err(|e| CliError::usage(e.to_string()))?;
    let task = tasks.iter().find(|t| t.spec.id == task_id).ok_or_else(|| {
        CliError::usage(format!(
            "unknown task `{task_id}` (tasks: {})",
            tasks
                .iter()
                .map(|t| t.spec.id.clone())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let src = std::fs::read_to_string(source)
        .map_err(|e| CliError::usage(format!("{}: {e}", source.display())))?;
    let nvcc = Nvcc::discover(&ctx.root).map_err(|e| CliError::failed(e.to_string()))?;
    let gpu = if mode == Mode::Compile {
        None
    } else {
        cudarl_cuda::gpu::probe()
    };
    if mode == Mode::Full && gpu.is_none() {
        return Err(CliError::failed(
            "--mode full needs a GPU; none is usable here (use --mode compile)",
        ));
    }
    let arch = arch
        .or_else(|| gpu.as_ref().map(|g| g.arch.clone()))
        .unwrap_or_else(|| "sm_90".into());
    let store =
        cudarl_core::Store::open(&ctx.store).map_err(|e| CliError::failed(e.to_string()))?;
    let _g = store
        .gc_guard_shared()
        .map_err(|e| CliError::failed(e.to_string()))?;
    let compiler = Compiler {
        nvcc,
        arch,
        timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
        store: Some(store),
    };
    let rules = Rules::builtin();
    let v = if gpu.is_some() {
        let mut pool = WorkerPool::new(cudarl_cuda::worker::worker_exe(), vec![]);
        let salt = compiler
            .store
            .as_ref()
            .map(hidden_salt)
            .transpose()
            .map_err(|e| CliError::failed(e.to_string()))?
            .unwrap_or_default();
        let opts = FullOptions {
            public_seeds: vec![0, 1],
            hidden_seeds: hidden_seeds(&salt, task_id, &src, 2),
            wall: Duration::from_secs(timeout),
            bench,
        };
        let naive = task.naive_source().ok();
        check_full(
            &task.spec,
            &src,
            naive.as_deref(),
            &rules,
            &compiler,
            &mut pool,
            &opts,
            &mut Baselines::new(),
        )
        .map_err(|e| CliError::failed(e.to_string()))?
    } else {
        check_compile_only(&task.spec, &src, &rules, &compiler)
            .map_err(|e| CliError::failed(e.to_string()))?
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).expect("verdict serializes")
        );
    } else {
        println!(
            "task {} ({} mode, {} on nvcc {})",
            v.task_id, v.mode, v.arch, v.nvcc_version
        );
        for f in &v.static_flags {
            println!(
                "  static {:?} {} (line {}): {}",
                f.action, f.rule, f.line, f.message
            );
        }
        println!(
            "  compiled: {}{}",
            v.compiled,
            if v.cache_hit { " (cache hit)" } else { "" }
        );
        for d in v
            .diagnostics
            .iter()
            .filter(|d| d.severity != "warning")
            .take(10)
        {
            println!(
                "  {} {}:{}: {}",
                d.severity,
                d.file.as_deref().unwrap_or("-"),
                d.line.unwrap_or(0),
                d.message
            );
        }
        for r in &v.resources {
            println!(
                "  {}: {} registers, {} B smem, {} B stack, {} B spill stores",
                r.kernel, r.registers, r.shared_mem_bytes, r.stack_frame_bytes, r.spill_store_bytes
            );
        }
        if !v.executed {
            println!("  executed: false (no GPU: correctness and speed are not checked)");
        } else {
            println!(
                "  correct: {} ({} tests, max abs err {:.2e})",
                v.correct.unwrap_or(false),
                v.tests.len(),
                v.max_abs_err.unwrap_or(0.0)
            );
            if let Some(t) = &v.timing {
                println!(
                    "  time: median {:.4} ms (p10 {:.4}, p90 {:.4}, cv {:.3}, {} reps)",
                    t.median_ms, t.p10_ms, t.p90_ms, t.cv, t.reps
                );
            }
            if let Some(s) = v.speedup_vs_naive {
                println!("  speedup vs naive: {s:.2}x");
            }
            if let Some(f) = v.dram_fraction_of_peak {
                println!("  DRAM bandwidth: {:.0}% of peak", f * 100.0);
            }
        }
        if let Some(f) = &v.failure {
            println!(
                "  FAILED: {f}{}",
                v.failure_detail
                    .as_ref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            );
        }
        for h in &v.hack_flags {
            println!("  hack flag: {h}");
        }
    }
    let pass = v.failure.is_none() && (v.compiled && (!v.executed || v.correct == Some(true)));
    Ok(if pass { 0 } else { 1 })
}
