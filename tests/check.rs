//! `cudarl-pipe check` as a real process with the real nvcc. Without a GPU every verdict is
//! compile-only and says so (`executed = false`).

mod common;

use common::*;

fn nvcc_available() -> bool {
    cudarl_cuda::Nvcc::discover_or_skip(&repo_root()).is_some()
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
    // JSON Lines: one verdict per source; several come back as an array.
    let mut v: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: `{l}` {}", stderr(&o))))
        .collect();
    let v = match v.len() {
        1 => v.remove(0),
        0 => panic!("no verdict: {}", stderr(&o)),
        _ => serde_json::Value::Array(v),
    };
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
        if e.get("cpu").and_then(|x| x.as_bool()) == Some(true) {
            // Decided here, by the rule it names (the preprocessed text, the object, the PTX).
            assert_eq!(
                (c, v["failure"].as_str()),
                (1, e["failure"].as_str()),
                "{name}: {v}"
            );
            if let Some(rule) = e.get("rule").and_then(|r| r.as_str()) {
                assert!(
                    v["failure_detail"].as_str().unwrap().starts_with(rule),
                    "{name}: want {rule}: {v}"
                );
            }
        } else {
            // Everything else compiles; the GPU run decides (scripts/gpu_harness_checks.sh).
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

    // Several sources, judged in turn: a verdict per line in order, exit 1 when any fails.
    let vec4 = root.join("datasets/tasks/vector_add/vec4.cu");
    let (c, v) = check(
        &p,
        "vector_add",
        &vec4,
        &["--source", bad.to_str().unwrap()],
    );
    assert_eq!(c, 1, "{v}");
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(
        (&v[0]["compiled"], &v[0]["failure"]),
        (&true.into(), &serde_json::Value::Null)
    );
    assert_eq!(v[1]["failure"], "compile_error", "{v}");

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
fn validate_stage_with_row_memo() {
    if !nvcc_available() {
        return;
    }
    let p = Project::new();
    // `validate` is the synthetic task kernels (the archives' are `validate-archive`, tested in
    // torch_format.rs).
    let pl = p.path("pipelines/default.toml");
    // Plus three generated families: 2 elementwise with two kernels each, 1 row reduction with
    // three (naive and two fast layouts).
    let text = std::fs::read_to_string(&pl).unwrap().replace(
        "[stages.synth-tasks]\n",
        "[stages.synth-tasks]\ngenerate = { elementwise = 2, row_reduce = 1, seed = 3 }\n",
    );
    std::fs::write(&pl, text).unwrap();
    let nvcc = cudarl_cuda::Nvcc::discover(&repo_root()).unwrap().path;
    let run = |args: &[&str]| {
        let mut a: Vec<&str> = args.to_vec();
        a.push("--json");
        let o = p.cmd(&a).env("CUDARL_NVCC", &nvcc).output().unwrap();
        (o.status.code().unwrap(), records(&o), stderr(&o))
    };
    let (c, m, err) = run(&["run", "validate", "--set", "validate.mode=\"compile\""]);
    assert_eq!(c, 0, "{err}");
    assert_eq!(status_of(&m, "validate"), "ran");
    assert_eq!(m["synth-tasks"]["outputs"]["tasks"]["rows"], 2 + 3);
    let kernels: usize = cudarl_cuda::load_tasks(&p.path("datasets/tasks"))
        .unwrap()
        .iter()
        .map(|t| 1 + t.spec.optimized.len())
        .sum::<usize>()
        + 2 * 2
        + 3;
    assert_eq!(
        m["validate"]["outputs"]["validations"]["rows"], kernels,
        "every task's naive and optimized kernels"
    );
    assert!(
        m["validate"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("compile-only")
    );
    let h1 = out_hash(&m, "validate", "validations");
    // The table says compile-only honestly.
    let o = p
        .cmd(&[
            "show",
            "validate",
            "--json",
            "--head",
            "10",
            "--set",
            "validate.mode=\"compile\"",
        ])
        .env("CUDARL_NVCC", &nvcc)
        .output()
        .unwrap();
    for l in stdout(&o).lines() {
        let r: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(r["compiled"], true, "{r}");
        assert_eq!(r["executed"], false, "{r}");
        assert!(r["correct"].is_null(), "{r}");
        assert!(r["registers"].as_i64().unwrap() > 0, "{r}");
    }
    // Forced re-run: every row comes from the row memo; same bytes.
    let t0 = std::time::Instant::now();
    let (c, m, _) = run(&[
        "run",
        "validate",
        "--set",
        "validate.mode=\"compile\"",
        "--force",
        "validate",
    ]);
    assert_eq!(c, 0);
    assert_eq!(out_hash(&m, "validate", "validations"), h1);
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "memo hits need no nvcc: {:?}",
        t0.elapsed()
    );
    // Adding a kernel validates only that kernel: one new memo entry.
    let memo_dir = p.store().join("memo/validate-v1");
    let count = |d: &std::path::Path| walk_count(d);
    let before = count(&memo_dir);
    std::fs::copy(
        p.path("datasets/tasks/vector_add/vec4.cu"),
        p.path("datasets/tasks/vector_add/vec4_copy.cu"),
    )
    .unwrap();
    let f = p.path("datasets/tasks/vector_add/task.toml");
    let t = std::fs::read_to_string(&f).unwrap().replace(
        "optimized = [\"vec4.cu\"]",
        "optimized = [\"vec4.cu\", \"vec4_copy.cu\"]",
    );
    std::fs::write(&f, t).unwrap();
    std::fs::write(
        p.path("datasets/tasks/vector_add/vec4_copy.cu"),
        std::fs::read_to_string(p.path("datasets/tasks/vector_add/vec4.cu")).unwrap()
            + "\n// a variant\n",
    )
    .unwrap();
    let (c, m, _) = run(&["run", "validate", "--set", "validate.mode=\"compile\""]);
    assert_eq!(c, 0);
    assert_eq!(
        m["validate"]["outputs"]["validations"]["rows"],
        kernels + 1,
        "{m:?}"
    );
    assert_eq!(count(&memo_dir), before + 1);
}

fn walk_count(d: &std::path::Path) -> usize {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                n += walk_count(&e.path());
            } else {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn kb_specs_stage_derives_native_signatures_with_coverage() {
    // The Python worker on CPU torch, through the real binary; coverage goals 80% of level 1, 60% of level 2.
    let p = Project::new();
    let o = p.run(&["run", "kb-specs", "--json"]);
    if o.status.code() != Some(0) && std::env::var("CUDARL_REQUIRE_PYTHON").is_err() {
        eprintln!("SKIPPED: no Python with torch: {}", stderr(&o));
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let show = |out: &str| -> Vec<serde_json::Value> {
        let o = p.run(&[
            "show", "kb-specs", "--output", out, "--json", "--head", "1000",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let cov = show("coverage");
    assert_eq!(cov.len(), 2, "levels 1 and 2");
    for c in &cov {
        let f = c["fraction"].as_f64().unwrap();
        assert!(f >= c["goal"].as_f64().unwrap(), "{c}");
    }
    let specs = show("kb_specs");
    assert_eq!(specs.len(), 200);
    let relu = specs
        .iter()
        .find(|s| s["problem_id"] == "kb/L1/19_ReLU")
        .unwrap();
    assert_eq!(
        relu["signature"],
        r#"extern "C" void launch(const float* in0, float* out, int64_t batch_size, int64_t dim, cudaStream_t stream)"#
    );
    // Constants of equal value (`batch_size = dim = 8192`) are told apart: the launcher gets
    // both sizes, as the recorded tests halve them separately.
    let gelu = specs
        .iter()
        .find(|s| s["problem_id"] == "kb/L1/88_MinGPTNewGelu")
        .unwrap();
    assert_eq!(
        gelu["signature"],
        r#"extern "C" void launch(const float* in0, float* out, int64_t batch_size, int64_t dim, cudaStream_t stream)"#
    );
    // Every problem left out says why.
    for s in specs.iter().filter(|s| s["covered"] == false) {
        assert!(
            s["excluded_reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{s}"
        );
    }
    // Re-running is a cache hit; a new store run reuses nothing but gives the same bytes.
    let o = p.run(&["run", "kb-specs", "--json"]);
    assert!(
        stdout(&o).contains("\"status\":\"cached\""),
        "{}",
        stdout(&o)
    );
}

/// nvcc found from the environment a copy of the project runs in: the wheel of `$VIRTUAL_ENV`
/// (the original's `scripts/env.sh`) when the copy has no `.venv`; when nothing is found, the
/// error names every place looked at.
#[test]
fn nvcc_is_found_through_virtual_env_and_a_miss_names_every_place_looked_at() {
    let venv = repo_root().join(".venv");
    let Ok(n) = cudarl_cuda::Nvcc::discover(&repo_root()) else {
        eprintln!("SKIPPED nvcc_is_found_through_virtual_env: no nvcc");
        return;
    };
    if !n.path.starts_with(&venv) || std::path::Path::new("/usr/bin/nvcc").exists() {
        eprintln!("SKIPPED nvcc_is_found_through_virtual_env: nvcc is not the .venv wheel here");
        return;
    }
    let p = Project::new();
    let src = repo_root().join("datasets/tasks/vector_add/vec4.cu");
    let args = [
        "check",
        "--task",
        "vector_add",
        "--source",
        src.to_str().unwrap(),
        "--json",
        "--mode",
        "compile",
    ];
    let bare = || {
        let mut c = p.cmd(&args);
        c.env_remove("CUDARL_NVCC")
            .env_remove("CUDA_HOME")
            .env_remove("VIRTUAL_ENV")
            .env("PATH", "/usr/bin:/bin");
        c
    };
    let o = bare().env("VIRTUAL_ENV", &venv).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["compiled"], true, "{v}");
    let o = bare().output().unwrap();
    assert_ne!(o.status.code(), Some(0));
    let e = stderr(&o);
    for looked in [
        "$CUDARL_NVCC unset",
        "$CUDA_HOME unset",
        "no nvcc on PATH",
        "no nvidia-cuda-nvcc wheel in",
    ] {
        assert!(e.contains(looked), "{looked}: {e}");
    }
    assert!(e.contains(p.root().join(".venv").to_str().unwrap()), "{e}");
}

/// What `check` says about sources that are not a kernel it can build: a misnamed launcher names
/// the expected signature and the functions the source defines; an empty or binary file gets one
/// line (exit 2); `--source -` reads standard input.
#[test]
fn check_explains_misnamed_launchers_empty_and_binary_sources_and_reads_stdin() {
    if !nvcc_available() {
        return;
    }
    let p = Project::new();
    let good =
        std::fs::read_to_string(repo_root().join("datasets/tasks/vector_add/vec4.cu")).unwrap();
    let misnamed = p.path("misnamed.cu");
    std::fs::write(
        &misnamed,
        good.replace("void launch(", "void launch_kernel("),
    )
    .unwrap();
    let (c, v) = check(&p, "vector_add", &misnamed, &[]);
    assert_eq!(c, 1, "{v}");
    let detail = v["failure_detail"].as_str().unwrap();
    assert!(
        detail.contains("expects `extern \"C\" void launch(const float* a")
            && detail.contains("launch_kernel")
            && !detail.contains("cudafe1"),
        "{detail}"
    );
    // `check` of `src` on vector_add, compile-only, its text report.
    let check_text = |src: &std::path::Path| {
        p.cmd(&[
            "check",
            "--task",
            "vector_add",
            "--source",
            src.to_str().unwrap(),
            "--mode",
            "compile",
        ])
        .output()
        .unwrap()
    };
    for (name, bytes, says) in [
        ("empty.cu", b"  \n".to_vec(), "empty source"),
        (
            "blob.cu",
            vec![0x7f, b'E', b'L', b'F', 0, 0, 0xff],
            "not a source file",
        ),
    ] {
        std::fs::write(p.path(name), &bytes).unwrap();
        let o = check_text(&p.path(name));
        assert_eq!(o.status.code(), Some(2), "{name}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(name) && e.contains(says), "{name}: {e}");
        assert_eq!(
            e.lines().filter(|l| l.starts_with("error")).count(),
            1,
            "{e}"
        );
    }
    let o = output_with_stdin(
        p.cmd(&[
            "check",
            "--task",
            "vector_add",
            "--source",
            "-",
            "--mode",
            "compile",
            "--json",
        ]),
        &good,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["compiled"], true, "{v}");
    // The text report names kernels as written, not mangled.
    let o = check_text(&repo_root().join("datasets/tasks/vector_add/vec4.cu"));
    let out = stdout(&o);
    assert!(
        out.contains("vector_add_vec4(float const*") && !out.contains("_Z15"),
        "{out}"
    );
}
