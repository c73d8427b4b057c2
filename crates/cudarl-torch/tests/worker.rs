//! The worker binary as a real process. (Being an integration test of this crate also makes
//! `cargo test --workspace` build `cudarl-pipe-worker`, which `cudarl-pipe` finds beside itself.)

use std::process::{Command, Stdio};

#[test]
fn worker_without_gpu_reports_and_exits() {
    // On a machine without a driver the worker answers with a clear error instead of hanging or
    // crashing, and exits with 3 (its context is unusable).
    if cudarl_cuda::gpu::probe().is_some() {
        eprintln!("SKIPPED: a GPU is present");
        return;
    }
    let o = Command::new(env!("CARGO_BIN_EXE_cudarl-pipe-worker"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    let line = String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    // The judge's own failure, not the candidate's.
    assert!(
        v["judge_error"]
            .as_str()
            .unwrap()
            .contains("worker cannot start"),
        "{v}"
    );
    assert!(v["cuda_error"].is_null(), "{v}");
}

#[test]
fn worker_is_found_beside_the_test_binaries() {
    let exe = cudarl_cuda::worker::worker_exe();
    assert!(exe.is_file(), "{}", exe.display());
    assert_eq!(
        exe.canonicalize().unwrap(),
        std::path::Path::new(env!("CARGO_BIN_EXE_cudarl-pipe-worker"))
            .canonicalize()
            .unwrap()
    );
}
