//! `cudarl-pipe check` as a real process with the real nvcc. Without a GPU every verdict is
//! compile-only and says so (`executed = false`).

mod common;

use common::*;

fn nvcc_available() -> bool {
    let ok = cudarl_cuda::Nvcc::discover(&repo_root()).is_ok();
    if !ok {
        assert!(
            std::env::var("CUDARL_REQUIRE_NVCC").is_err(),
            "CUDARL_REQUIRE_NVCC is set but nvcc was not found"
        );
        eprintln!("SKIPPED: no nvcc (run `make setup`)");
    }
    ok
}

fn check(
    p: &Project,
    task: &str,
    src: &std::path::Path,
    extra: &[&str],
) -> (i32, serde_json::Value) {
    let mut args = vec![
        "check",
        "--task",
        task,
        "--source",
        src.to_str().unwrap(),
        "--json",
        "--mode",
        "compile",
    ];
    args.extend(extra);
    let o = p
        .cmd(&args)
        .env(
            "CUDARL_NVCC",
            cudarl_cuda::Nvcc::discover(&repo_root()).unwrap().path,
        )
        .output()
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&o)));
    (o.status.code().unwrap(), v)
}

#[test]
fn check_compile_only_verdicts() {
    if !nvcc_available() {
        return;
    }
    let p = Project::new();
    let root = repo_root();
    let (c, v) = check(
        &p,
        "vector_add",
        &root.join("datasets/tasks/vector_add/vec4.cu"),
        &[],
    );
    assert_eq!(c, 0, "{v}");
    assert_eq!(v["compiled"], true);
    assert_eq!(v["executed"], false);
    assert_eq!(v["correct"], serde_json::Value::Null);
    assert_eq!(v["mode"], "compile-only");
    assert_eq!(v["arch"], "sm_90");
    assert!(v["resources"][0]["registers"].as_u64().unwrap() > 0);
    assert_eq!(
        v["signature"],
        r#"extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream)"#
    );
    // Second time: compile cache hit, same resources.
    let (_, v2) = check(
        &p,
        "vector_add",
        &root.join("datasets/tasks/vector_add/vec4.cu"),
        &[],
    );
    assert_eq!(v2["cache_hit"], true);
    assert_eq!(v2["resources"], v["resources"]);

    // Static rejects from the hack corpus, with the expected reason.
    let expected: toml::Table = toml::from_str(
        &std::fs::read_to_string(root.join("tests/kernels/hacks/expected.toml")).unwrap(),
    )
    .unwrap();
    for (name, e) in &expected {
        let src = root.join(format!("tests/kernels/hacks/{name}.cu"));
        let (c, v) = check(&p, "vector_add", &src, &[]);
        if e["failure"].as_str() == Some("static_reject") {
            assert_eq!(
                (c, v["failure"].as_str()),
                (1, Some("static_reject")),
                "{name}: {v}"
            );
            assert!(
                v["failure_detail"].as_str().unwrap().contains("stream"),
                "{name}: {v}"
            );
        } else {
            // Everything else compiles; the GPU run decides (scripts/gpu_checks.sh).
            assert_eq!((c, v["compiled"].as_bool()), (0, Some(true)), "{name}: {v}");
        }
    }

    // A compile error: exit 1, failure compile_error, the line of the candidate.
    let bad = p.path("bad.cu");
    std::fs::write(&bad, "#include <cuda_runtime.h>\n#include <stdint.h>\nextern \"C\" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {\n  oops;\n}\n").unwrap();
    let (c, v) = check(&p, "vector_add", &bad, &[]);
    assert_eq!(c, 1);
    assert_eq!(v["failure"], "compile_error");
    assert_eq!(v["diagnostics"][0]["line"], 4);

    // Bad usage: unknown task or missing file, exit 2.
    let o = p.run(&["check", "--task", "nope", "--source", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown task `nope`"), "{}", stderr(&o));
    let o = p.run(&[
        "check",
        "--task",
        "vector_add",
        "--source",
        "/no/such/file.cu",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn worker_without_gpu_reports_and_exits() {
    // The hidden worker subcommand: on a machine without a driver it answers with a clear error
    // instead of hanging or crashing.
    if cudarl_cuda::gpu::probe().is_some() {
        eprintln!("SKIPPED: a GPU is present");
        return;
    }
    let p = Project::new();
    let o = p
        .cmd(&["worker"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert!(
        v["cuda_error"]
            .as_str()
            .unwrap()
            .contains("worker cannot start"),
        "{v}"
    );
}
