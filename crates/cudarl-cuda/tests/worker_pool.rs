//! The worker pool with real processes: a stand-in worker (a shell script speaking the same
//! line protocol) that answers, crashes mid-job (SIGKILL) or hangs, so replacement and the
//! wall-clock limit are tested on machines without a GPU.

use std::time::{Duration, Instant};

use cudarl_cuda::gpu::{RunJob, RunResult};
use cudarl_cuda::worker::{GpuLock, Outcome, WorkerPool};

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
        seeds: vec![0],
        ..RunJob::for_task(spec)
    }
}

/// A pool whose workers run the stand-in `script` with `mark` as `$1`, on (lock id) GPU `gpu`.
fn stand_in(script: &str, mark: &std::path::Path, gpu: usize) -> WorkerPool {
    WorkerPool::new(
        "sh".into(),
        vec![
            "-c".into(),
            script.into(),
            "sh".into(),
            mark.display().to_string(),
        ],
    )
    .on_gpu(gpu)
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

    // Killed mid-job (SIGKILL, as the OOM killer or a crash would): the worker is the judge's
    // side, so the job runs once more on a fresh worker; killed again, it gets `crash` naming
    // the signal, and the next job runs on a new worker.
    match pool.run(&job("crash"), wall) {
        Outcome::Crash(m) => assert!(m.contains("signal: 9"), "{m}"),
        other => panic!("expected a crash, got {other:?}"),
    }
    assert_eq!(pool.spawned, 2, "the crashed job ran on two workers");
    let c = pid_of(&pool.run(&job("ok"), wall));
    assert_ne!(c, a, "replaced");
    assert_eq!(pool.spawned, 3);

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
    assert_eq!(
        pool.spawned, 4,
        "a timeout is the candidate's: not run again"
    );
}

/// A stand-in judge that fails on its own side (`judge_error`, then exits as the worker does):
/// `judge-once` only the first time (marker `$1.failed`), answering the second time after
/// marking `$1.retry` and waiting half a second; any other job every time.
const JUDGE: &str = r#"
answer() { echo "{\"tests\":[],\"timing\":null,\"cuda_error\":null,\"load_error\":null,$1\"gpu\":{\"name\":\"pid $$\",\"arch\":\"sm_90\",\"sms\":1,\"sm_clock_khz\":1,\"mem_clock_khz\":1,\"l2_bytes\":1,\"driver_version\":1,\"total_mem_bytes\":1,\"mem_bus_bits\":1}}"; }
while read -r line; do
  echo '{"heartbeat":true}'
  case "$line" in
    *'"so_path":"judge-once"'*)
      if [ -e "$1.failed" ]; then touch "$1.retry"; sleep 0.5; answer ''
      else touch "$1.failed"; answer '"judge_error":"cuMemAlloc (arena): CUDA_ERROR_OUT_OF_MEMORY",'; exit 3; fi ;;
    *) answer '"judge_error":"Internal torch error: CUDA out of memory",'; exit 3 ;;
  esac
done
"#;

#[test]
fn a_job_the_judge_failed_on_its_side_runs_once_more_on_a_fresh_worker_with_the_gpu_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("job");
    let gpu = 80_000 + (std::process::id() % 10_000) as usize;
    let id = gpu.to_string();
    let mut pool = stand_in(JUDGE, &mark, gpu);
    let wall = Duration::from_secs(10);
    // A tests-only job (the GPU shared) whose judge ran out of memory the first time.
    let run = std::thread::spawn(move || {
        let o = pool.run(&job("judge-once"), wall);
        (o, pool)
    });
    let retry = dir.path().join("job.retry");
    let t0 = Instant::now();
    while !retry.exists() {
        assert!(t0.elapsed() < wall, "the job was not run again");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The second try holds the GPU alone: a tester waits for its answer.
    let tester = std::thread::spawn({
        let id = id.clone();
        move || GpuLock::acquire_shared(&id).map(|_| Instant::now())
    });
    std::thread::sleep(Duration::from_millis(250));
    assert!(
        !tester.is_finished(),
        "a tester got in during the second try"
    );
    let (o, mut pool) = run.join().unwrap();
    match &o {
        Outcome::Done(r) => assert_eq!(r.judge_error, None, "{r:?}"),
        other => panic!("expected an answer, got {other:?}"),
    }
    let first = pid_of(&o);
    assert_eq!(pool.spawned, 2, "the second try ran on a fresh worker");
    tester.join().unwrap().unwrap();

    // A judge failure that repeats is the job's outcome: the healthy worker's try, then a
    // fresh one's.
    match pool.run(&job("judge-always"), wall) {
        Outcome::Done(r) => assert_eq!(
            r.judge_error.as_deref(),
            Some("Internal torch error: CUDA out of memory")
        ),
        other => panic!("expected the judge's error, got {other:?}"),
    }
    assert_eq!(pool.spawned, 3, "{first}: the second try on a fresh worker");
}

/// A stand-in for a job with `exclusive_timing`: "tests" (marker `$1.testing`), asks for the GPU
/// alone, waits for its parent's answer, "times" (marker `$1.timing`) and answers with what the
/// parent sent as the GPU's name.
const UPGRADE: &str = r#"
read -r line
echo '{"heartbeat":true}'
touch "$1.testing"; sleep 0.5
echo '{"exclusive":true}'
read -r go
touch "$1.timing"; sleep 1
echo "{\"tests\":[],\"timing\":null,\"cuda_error\":null,\"load_error\":null,\"gpu\":{\"name\":\"$go\",\"arch\":\"sm_90\",\"sms\":1,\"sm_clock_khz\":1,\"mem_clock_khz\":1,\"l2_bytes\":1,\"driver_version\":1,\"total_mem_bytes\":1,\"mem_bus_bits\":1}}"
"#;

#[test]
fn a_tester_holds_the_gpu_shared_for_tests_and_alone_for_its_timing() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("job");
    let gpu = 90_000 + (std::process::id() % 10_000) as usize;
    let id = gpu.to_string();
    let mut pool = stand_in(UPGRADE, &mark, gpu);
    let mut j = job("ok");
    j.bench = Some(cudarl_cuda::gpu::BenchSpec::default());
    j.exclusive_timing = true;
    let job = std::thread::spawn(move || pool.run(&j, Duration::from_secs(10)));
    let wait_for = |suffix: &str| {
        let p = dir.path().join(format!("job.{suffix}"));
        let t0 = Instant::now();
        while !p.exists() {
            assert!(t0.elapsed() < Duration::from_secs(10), "no {suffix} marker");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // Testing: the hold is shared, another tester gets in beside it at once.
    wait_for("testing");
    let t0 = Instant::now();
    drop(GpuLock::acquire_shared(&id).unwrap());
    assert!(
        t0.elapsed() < Duration::from_millis(400),
        "{:?}",
        t0.elapsed()
    );
    // Timing: the GPU is held alone; another tester waits until the answer.
    wait_for("timing");
    let tester = std::thread::spawn({
        let id = id.clone();
        move || GpuLock::acquire_shared(&id).map(|_| Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!tester.is_finished(), "a tester got in during a timing");
    let answered = job.join().unwrap();
    assert_eq!(pid_of(&answered), "go", "the worker was told to go on");
    tester.join().unwrap().unwrap();
    assert!(GpuLock::try_acquire(&id).unwrap().is_some(), "released");
}
