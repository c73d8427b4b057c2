//! The worker pool with real processes: a stand-in worker (a shell script speaking the same
//! line protocol) that answers, crashes mid-job (SIGKILL) or hangs, so replacement and the
//! wall-clock limit are tested on machines without a GPU.

use std::time::{Duration, Instant};

use cudarl_cuda::gpu::{RunJob, RunResult};
use cudarl_cuda::worker::{Outcome, WorkerPool};

const SCRIPT: &str = r#"
while read -r line; do
  case "$line" in
    *'"so_path":"crash"'*) kill -9 $$ ;;
    *'"so_path":"hang"'*) echo '{"heartbeat":true}'; sleep 60 ;;
    *) echo '{"heartbeat":true}'; echo "{\"tests\":[],\"timing\":null,\"cuda_error\":null,\"load_error\":null,\"gpu\":{\"name\":\"stand-in pid $$\",\"arch\":\"sm_90\",\"sms\":1,\"sm_clock_khz\":1,\"mem_clock_khz\":1,\"l2_bytes\":1,\"driver_version\":1,\"total_mem_bytes\":1,\"mem_bus_bits\":1}}" ;;
  esac
done
"#;

fn job(so: &str) -> RunJob {
    let spec = cudarl_cuda::TaskSpec::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets/tasks/vector_add"),
    )
    .unwrap();
    RunJob {
        so_path: Some(so.into()),
        task: spec,
        shapes: vec![],
        seeds: vec![0],
        bench: None,
        torch_baseline: false,
        cudart: None,
        wall_s: None,
        upcoming: 0,
    }
}

fn pid_of(o: &Outcome) -> String {
    match o {
        Outcome::Done(r) => {
            let r: &RunResult = r;
            r.gpu.as_ref().unwrap().name.clone()
        }
        other => panic!("expected an answer, got {other:?}"),
    }
}

#[test]
fn crashed_and_hung_workers_are_replaced() {
    let mut pool = WorkerPool::new("sh".into(), vec!["-c".into(), SCRIPT.into()]);
    let wall = Duration::from_secs(5);
    let a = pid_of(&pool.run(&job("ok"), wall));
    let b = pid_of(&pool.run(&job("ok"), wall));
    assert_eq!(a, b, "a healthy worker is reused");
    assert_eq!(pool.spawned, 1);

    // Killed mid-job (SIGKILL, as the OOM killer or a crash would): the job gets `crash`
    // naming the signal, and the next job runs on a new worker.
    match pool.run(&job("crash"), wall) {
        Outcome::Crash(m) => assert!(m.contains("signal: 9"), "{m}"),
        other => panic!("expected a crash, got {other:?}"),
    }
    let c = pid_of(&pool.run(&job("ok"), wall));
    assert_ne!(c, a, "replaced");
    assert_eq!(pool.spawned, 2);

    // Hung after a heartbeat: killed at the per-step limit, then replaced.
    let t0 = Instant::now();
    assert_eq!(
        pool.run(&job("hang"), Duration::from_millis(500)),
        Outcome::Timeout
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "killed at the limit, not after the sleep"
    );
    let d = pid_of(&pool.run(&job("ok"), wall));
    assert_ne!(d, c);
    assert_eq!(pool.spawned, 3);
}
