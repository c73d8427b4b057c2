//! The worker process: answers [`RunJob`]s from stdin with [`RunResult`]s on stdout (the
//! protocol is documented in [`cudarl_cuda::worker`]).

use std::io::{BufRead, Write};

use cudarl_cuda::gpu::{RunJob, RunResult};
use cudarl_cuda::worker::{Limits, apply_limits};

use crate::runner::Runner;

/// The worker's main loop: apply limits, create the CUDA context, answer jobs. Returns the
/// process exit code: 0 at end of input, 3 after a CUDA error (the context is unusable).
pub fn worker_main(limits: &Limits) -> i32 {
    apply_limits(limits);
    let mut runner = match Runner::new() {
        Ok(r) => r,
        Err(e) => {
            let r = RunResult {
                tests: vec![],
                timing: None,
                torch_timing: None,
                cuda_error: Some(format!("worker cannot start: {e}")),
                load_error: None,
                gpu: None,
                worker_ms: None,
            };
            println!("{}", serde_json::to_string(&r).expect("json"));
            return 3;
        }
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
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
        let res = runner.run_with_heartbeat(&job, &mut || {
            let mut o = std::io::stdout();
            let _ = writeln!(o, "{{\"heartbeat\":true}}");
            let _ = o.flush();
        });
        let poisoned = res.cuda_error.is_some();
        let _ = writeln!(out, "{}", serde_json::to_string(&res).expect("json"));
        let _ = out.flush();
        if poisoned {
            return 3;
        }
    }
    0
}
