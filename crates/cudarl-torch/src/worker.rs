//! The worker process: answers [`RunJob`]s from stdin with [`RunResult`]s on stdout (the
//! protocol is documented in [`cudarl_cuda::worker`]).

use std::io::{BufRead, Write};

use cudarl_cuda::gpu::{RunJob, RunResult};
use cudarl_cuda::worker::{Limits, apply_limits};

use crate::judge::Judge;

/// The worker's main loop: apply limits, create the CUDA context, answer jobs. Returns the
/// process exit code: 0 at end of input, 3 after a CUDA error (the context is unusable).
pub fn worker_main(limits: &Limits) -> i32 {
    // `CUDARL_JUDGE_TRACE=FILE`: every step of every job, with timestamps, appended to FILE
    // (the worker's own stdout is the answer channel and its stderr is only kept on a crash).
    // The judge is the project's own code, so a trace may outgrow the file size limit.
    let trace = std::env::var_os("CUDARL_JUDGE_TRACE");
    let mut limits = limits.clone();
    if trace.is_some() {
        limits.file_size_bytes = limits.file_size_bytes.max(1 << 30);
    }
    apply_limits(&limits);
    if let Some(path) = trace
        && let Ok(f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(f))
            .try_init();
    }
    // Every trace line names the worker process (several workers append to one file).
    let _span = tracing::debug_span!("worker", pid = std::process::id()).entered();
    let mut judge = match Judge::new() {
        Ok(r) => r,
        Err(e) => {
            let r = RunResult {
                tests: vec![],
                timing: None,
                torch_timing: None,
                cuda_error: None,
                load_error: None,
                judge_error: Some(format!("worker cannot start: {e}")),
                gpu: None,
                worker_ms: None,
                failure: None,
                candidate_output: None,
                profile: None,
                window_words: false,
            };
            println!("{}", serde_json::to_string(&r).expect("json"));
            return 3;
        }
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut lines = stdin.lock().lines();
    while let Some(line) = lines.next() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let job: RunJob = match serde_json::from_str(&line) {
            Ok(j) => j,
            Err(e) => {
                eprintln!("worker: bad job: {e}");
                return 2;
            }
        };
        let res = judge.run_with_heartbeat(
            &job,
            &mut || {
                let mut o = std::io::stdout();
                let _ = writeln!(o, "{{\"heartbeat\":true}}");
                let _ = o.flush();
            },
            // The GPU alone for the timing: ask the parent, wait for its `go`.
            &mut || {
                let mut o = std::io::stdout();
                let _ = writeln!(o, "{{\"exclusive\":true}}");
                let _ = o.flush();
                matches!(lines.next(), Some(Ok(l)) if l.trim() == "go")
            },
        );
        if let Some(w) = &res.worker_ms {
            tracing::debug!(
                runner = w.runner,
                tests = w.tests,
                timing = w.timing,
                torch = w.torch,
                failure = ?res.failure,
                cuda_error = ?res.cuda_error,
                load_error = ?res.load_error,
                "job: done"
            );
        }
        // The judge's own failure (its context, its memory), or a stream waiting for a runner
        // that died mid-window, leaves this process unusable; the candidate's own errors do not.
        let poisoned = judge.stuck || res.judge_error.is_some();
        let _ = writeln!(out, "{}", serde_json::to_string(&res).expect("json"));
        let _ = out.flush();
        if poisoned {
            return 3;
        }
        judge.refill();
    }
    0
}
