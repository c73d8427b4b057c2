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

/// `check` knows every task `serve` knows: a generated family of `synth-tasks` takes its own
/// naive kernel and prints its launcher; a wrong launcher is named in the user's file and line
/// with the declaration expected.
#[test]
fn check_knows_the_generated_families_and_names_the_users_file() {
    if !nvcc_available() {
        return;
    }
    let p = Project::new();
    let kernels = |extra: &[&str]| {
        let mut args = vec!["show", "synth-tasks", "--output", "task_kernels", "--json"];
        args.extend(["--head", "1000"]);
        args.extend(extra);
        p.run(&args)
    };
    let o = kernels(&[]);
    assert_eq!(o.status.code(), Some(2), "not built yet: {}", stderr(&o));
    // Two generated families, remembered as run `gen` for the verbs that read them.
    let o = p.run(&[
        "run",
        "synth-tasks",
        "--set",
        "synth-tasks.generate={ elementwise = 2, row_reduce = 0, seed = 3 }",
        "--run",
        "gen",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = kernels(&["--run", "gen"]);
    let (id, code) = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| {
            r["role"] == "naive"
                && r["task_id"]
                    .as_str()
                    .is_some_and(|t| !["vector_add", "row_sum"].contains(&t))
        })
        .map(|r| {
            (
                r["task_id"].as_str().unwrap().to_string(),
                r["code"].as_str().unwrap().to_string(),
            )
        })
        .unwrap_or_else(|| panic!("no generated family: {} {}", stdout(&o), stderr(&o)));
    let src = p.path("naive.cu");
    std::fs::write(&src, &code).unwrap();
    let (c, v) = check(&p, &id, &src, &["--run", "gen"]);
    assert_eq!((c, &v["compiled"]), (0, &serde_json::json!(true)), "{v}");
    assert_eq!(v["task_id"], id.as_str(), "{v}");
    let o = p.run(&["check", "--task", &id, "--signature", "--run", "gen"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let decl = stdout(&o).lines().next().unwrap_or_default().to_string();
    assert!(
        decl.starts_with("extern \"C\" void launch(") && decl.ends_with(";"),
        "{decl}"
    );
    // The family's launcher with its size parameters' type changed.
    let wrong: String = code
        .lines()
        .map(|l| {
            if l.starts_with("extern \"C\" void launch(") {
                l.replace("int64_t", "int")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        wrong.contains("launch(") && wrong != code.trim_end(),
        "the launcher has an int64_t to change: {code}"
    );
    std::fs::write(&src, &wrong).unwrap();
    let (c, v) = check(&p, &id, &src, &["--run", "gen"]);
    assert_eq!(c, 1, "{v}");
    let diag = v["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| {
            d["message"]
                .as_str()
                .is_some_and(|m| m.contains("launcher signature"))
        })
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(diag["file"], src.to_str().unwrap(), "{v}");
    assert!(diag["line"].as_u64().is_some_and(|l| l > 0), "{v}");
    assert!(
        diag["message"]
            .as_str()
            .unwrap()
            .contains(decl.trim_end_matches(';')),
        "{v}"
    );
    // An id no task has: the nearest one named (exit 2).
    let near = &id[..id.len() - 1];
    let o = p.run(&["check", "--task", near, "--signature", "--run", "gen"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("did you mean `"), "{}", stderr(&o));
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
            // Everything else compiles; the GPU run decides (scripts/gpu/harness_checks.sh).
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
        "vectr_add",
        "--source",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown task `vectr_add`; did you mean `vector_add`?"),
        "{}",
        stderr(&o)
    );
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
    // The `ModelNew` wrapper of every covered problem (`check --model-new`) passes the
    // ModelNew allow-list, whatever its parameters' state-dict names.
    let dir = tempfile::tempdir().unwrap();
    let mut wrappers = 0;
    for s in specs.iter().filter(|s| s["covered"] == true) {
        let abi = cudarl_cuda::native_abi::KbNative::from_row(
            s["signature"].as_str().unwrap(),
            s["buffers_json"].as_str().unwrap(),
            s["sizes_json"].as_str().unwrap(),
        )
        .unwrap();
        let id = s["problem_id"].as_str().unwrap();
        let text = abi.model_new(id, "extern \"C\" void launch();\n", "A wrapper.");
        std::fs::write(dir.path().join(format!("w{wrappers}.py")), text).unwrap();
        wrappers += 1;
    }
    assert!(wrappers >= 150, "{wrappers}");
    let root = common::repo_root();
    let o = std::process::Command::new(cudarl_cuda::pyworker::python(&root))
        .args([
            "-c",
            "import glob, json, sys; sys.path.insert(0, sys.argv[1]); import cudarl_screen as s; \
             print(json.dumps({f: s.screen(open(f).read()) for f in sorted(glob.glob(sys.argv[2] + '/*.py'))}))",
        ])
        .arg(root.join("python"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let found: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(found.len(), wrappers);
    let refused: Vec<_> = found
        .iter()
        .filter(|(_, f)| f.as_array().is_some_and(|a| !a.is_empty()))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
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

/// The launcher's shim for a kernel of `tests/kernels/kb_native/`, from the kernel's own
/// `launch` declaration (the one `kb-specs` derives for its problem): pointers from `buffers`,
/// floats from `scalars`, integers from `sizes`, then the stream.
fn shim_from_launcher(src: &str) -> String {
    let start = src.find("extern \"C\" void launch(").expect("a launcher");
    let sig = &src[start..=start + src[start..].find(')').unwrap()];
    let params = &sig[sig.find('(').unwrap() + 1..sig.len() - 1];
    let (mut b, mut s, mut f) = (0, 0, 0);
    let call: Vec<String> = params
        .split(',')
        .map(|p| {
            let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
            let ty = p[..p.rfind(' ').unwrap()].to_string();
            if ty.contains("cudaStream_t") {
                "stream".to_string()
            } else if ty.contains('*') {
                b += 1;
                format!("({ty})buffers[{}]", b - 1)
            } else if ty.contains("float") || ty.contains("double") {
                f += 1;
                format!("scalars[{}]", f - 1)
            } else {
                s += 1;
                format!("sizes[{}]", s - 1)
            }
        })
        .collect();
    cudarl_cuda::task::entry_shim("", sig, &call)
}

/// Measures the object checks (`crates/cudarl-cuda/src/inspect.rs`) on honest code: every kernel
/// of `tests/kernels/honest/` and `tests/kernels/kb_native/`, every task kernel of
/// `datasets/tasks/`, and the naive and fast kernels of every 4th of the 450 operator families
/// the default pipeline generates (seed 0), each built the way the harness builds a native
/// candidate (source + shim in one file, [`cudarl_cuda::Compiler::flags`], the shared runtime,
/// the kept host object). Writes `object_byte_scan_false_positives_cpu_<date>.json` (every
/// system-call or clock-read encoding at any byte offset of the code, and which a linear
/// disassembly decodes; the same scan over the linked library's code for comparison) and `object_exports_honest_cpu_<date>.json` (every symbol the objects
/// define, and which the export rule refuses) to `$CUDARL_MEASURE_DIR`. By hand:
/// `CUDARL_MEASURE_DIR=benchmarks/results cargo nextest run -p cudarl-cli --test check
/// --run-ignored only object_checks_on_honest_kernels` (about 10 minutes on 2 cores).
#[test]
#[ignore]
fn object_checks_on_honest_kernels() {
    use std::collections::{BTreeMap, BTreeSet};
    let out_dir = std::path::PathBuf::from(
        std::env::var("CUDARL_MEASURE_DIR").expect("set CUDARL_MEASURE_DIR to the results folder"),
    );
    let root = repo_root();
    let nvcc = cudarl_cuda::Nvcc::discover(&root).unwrap();
    let cudart = nvcc.cudart().unwrap();
    let compiler = cudarl_cuda::Compiler {
        nvcc: nvcc.clone(),
        arch: "sm_90".into(),
        timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
        store: None,
    };
    let rules = cudarl_cuda::Rules::builtin();
    // (set, name, source, shim)
    let mut units: Vec<(String, String, String, String)> = Vec::new();
    let tasks = cudarl_cuda::load_tasks(&root.join("datasets/tasks")).unwrap();
    for dir in ["honest", "kb_native"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join("tests/kernels").join(dir))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "cu"))
            .collect();
        files.sort();
        for p in files {
            let src = std::fs::read_to_string(&p).unwrap();
            let name = p.file_stem().unwrap().to_str().unwrap().to_string();
            let shim = if dir == "honest" {
                let task = name.split("__").next().unwrap();
                tasks
                    .iter()
                    .find(|t| t.spec.id == task)
                    .unwrap()
                    .spec
                    .shim()
            } else {
                shim_from_launcher(&src)
            };
            units.push((dir.into(), name, src, shim));
        }
    }
    for t in &tasks {
        let shim = t.spec.shim();
        units.push((
            "task_kernels".into(),
            format!("{}/{}", t.spec.id, t.spec.naive),
            t.naive_source().unwrap(),
            shim.clone(),
        ));
        for (f, src) in t.optimized_sources().unwrap() {
            units.push((
                "task_kernels".into(),
                format!("{}/{f}", t.spec.id),
                src,
                shim.clone(),
            ));
        }
    }
    let families = cudarl_rl::operators::generate(450, 0, &BTreeSet::new());
    let drawn = families.len();
    for fam in families.iter().step_by(4) {
        let shim = fam.spec.shim();
        units.push((
            "generated_operators".into(),
            format!("{}/naive", fam.spec.id),
            fam.naive.clone(),
            shim.clone(),
        ));
        for (f, src) in &fam.optimized {
            units.push((
                "generated_operators".into(),
                format!("{}/{f}", fam.spec.id),
                src.clone(),
                shim.clone(),
            ));
        }
    }
    // (the host object, the linked library when the link succeeded)
    type Built = Result<(Vec<u8>, Option<Vec<u8>>), String>;
    let build = |src: &str, shim: &str| -> Built {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join(cudarl_cuda::inspect::SOURCE_NAME),
            format!("{src}\n{shim}"),
        )
        .unwrap();
        std::fs::create_dir_all(d.path().join("keep")).unwrap();
        let mut args = compiler.flags();
        args.extend([
            "-Xlinker".into(),
            cudart.display().to_string(),
            "-o".into(),
            "kernel.so".into(),
            cudarl_cuda::inspect::SOURCE_NAME.into(),
        ]);
        let o = std::process::Command::new(&nvcc.path)
            .args(&args)
            .current_dir(d.path())
            .output()
            .unwrap();
        let obj = std::fs::read(d.path().join("keep/kernel.o"))
            .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&o.stderr)))?;
        Ok((obj, std::fs::read(d.path().join("kernel.so")).ok()))
    };
    let results: Vec<(usize, Built)> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let units = &units;
                let build = &build;
                sc.spawn(move || {
                    (w..units.len())
                        .step_by(2)
                        .map(|i| (i, build(&units[i].2, &units[i].3)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all
    });
    let mut files = Vec::new();
    let mut sets: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let (mut objects, mut with_hits, mut with_hidden, mut refused) = (0, 0, 0, 0);
    let (mut libraries, mut libraries_with_hits, mut libraries_with_hidden) = (0, 0, 0);
    let mut export_names: BTreeMap<String, (usize, bool, &'static str, &'static str)> =
        BTreeMap::new();
    let mut export_rows = Vec::new();
    let mut failed = Vec::new();
    for (i, o) in results {
        let (set, name, _, _) = &units[i];
        let e = sets
            .entry(set.clone())
            .or_insert_with(|| serde_json::json!({"objects": 0, "with_hits": 0, "with_hidden_hits": 0, "refused_by_object_checks": 0}));
        let (bytes, library) = match o {
            Ok(b) => b,
            Err(err) => {
                failed.push(serde_json::json!({"set": set, "name": name, "error": err.chars().take(400).collect::<String>()}));
                continue;
            }
        };
        objects += 1;
        let hits = cudarl_cuda::inspect::code_hits(&bytes).unwrap();
        let findings = cudarl_cuda::inspect::object(&bytes, rules.object_rules()).unwrap();
        let exports = cudarl_cuda::inspect::exports(&bytes, rules.object_rules()).unwrap();
        let hidden = hits.iter().filter(|h| !h.decoded).count();
        // The same scan over the linked library's code (its PLT, the C runtime's start files and
        // the link-time values of the object's relocation fields), for comparison.
        let library_hits = library
            .as_deref()
            .map(|l| cudarl_cuda::inspect::code_hits(l).unwrap())
            .unwrap_or_default();
        if library.is_some() {
            libraries += 1;
            libraries_with_hits += usize::from(!library_hits.is_empty());
            libraries_with_hidden += usize::from(library_hits.iter().any(|h| !h.decoded));
        }
        e["objects"] = (e["objects"].as_u64().unwrap() + 1).into();
        if !hits.is_empty() {
            with_hits += 1;
            e["with_hits"] = (e["with_hits"].as_u64().unwrap() + 1).into();
        }
        if hidden > 0 {
            with_hidden += 1;
            e["with_hidden_hits"] = (e["with_hidden_hits"].as_u64().unwrap() + 1).into();
        }
        if !findings.is_empty() {
            refused += 1;
            e["refused_by_object_checks"] =
                (e["refused_by_object_checks"].as_u64().unwrap() + 1).into();
        }
        for x in &exports {
            let row = export_names.entry(x.name.clone()).or_insert((
                0,
                x.allowed,
                x.binding,
                x.visibility,
            ));
            row.0 += 1;
        }
        export_rows.push(serde_json::json!({
            "set": set, "name": name,
            "exports": exports.iter().map(|x| &x.name).collect::<Vec<_>>(),
            "refused": exports.iter().filter(|x| !x.allowed).map(|x| &x.name).collect::<Vec<_>>(),
        }));
        files.push(serde_json::json!({
            "set": set, "name": name, "hits": hits, "linked_library_hits": library_hits,
            "object_findings": findings.iter().map(|f| serde_json::json!({"rule": f.rule, "matched": f.matched})).collect::<Vec<_>>(),
        }));
    }
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .unwrap();
    let date = String::from_utf8_lossy(&date.stdout).trim().to_string();
    let host_cc = std::process::Command::new("g++")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    let setup = serde_json::json!({
        "nvcc": nvcc.version, "host_compiler": host_cc, "arch": compiler.arch,
        "flags": compiler.flags(),
        "sources": "tests/kernels/honest/*.cu, tests/kernels/kb_native/*.cu (shim from the kernel's launcher), datasets/tasks/*/ naive and optimized kernels, and the naive and fast kernels of every 4th operator family of cudarl_rl::operators::generate(450, seed 0) (the default pipeline's synth-tasks)",
        "operator_families_drawn": drawn,
        "build": "source + the task's shim in one kernel.cu, nvcc with Compiler::flags() and the shared runtime, the kept keep/kernel.o (the harness's native build outside its sandbox)",
    });
    let scan = serde_json::json!({
        "benchmark": "object-byte-scan-false-positives",
        "what": "every byte offset of every code section of honest host objects scanned for the encodings of syscall (0f 05), sysenter (0f 34), int 0x80 (cd 80), rdtsc (0f 31) and rdtscp (0f 01 f9); `decoded`: a linear disassembly from the section's start decodes that instruction there; a hit that is not decoded is one a check of the linear disassembly misses; the byte scan refuses every hit",
        "setup": setup,
        "objects": objects,
        "objects_with_any_hit": with_hits,
        "objects_with_hidden_hits": with_hidden,
        "false_positive_rate": if objects > 0 { with_hits as f64 / objects as f64 } else { 0.0 },
        "objects_refused_by_any_object_check": refused,
        "linked_libraries_scanned": libraries,
        "linked_libraries_with_any_hit": libraries_with_hits,
        "linked_libraries_with_hidden_hits": libraries_with_hidden,
        "by_set": sets,
        "build_failures": failed,
        "files": files,
    });
    let exports = serde_json::json!({
        "benchmark": "object-exports-honest",
        "what": "every defined non-local symbol of honest host objects (nm --defined-only -g), how many objects define it, its binding and visibility, and whether the export rule (object-export) allows it",
        "setup": setup,
        "objects": objects,
        "objects_with_refused_exports": export_rows.iter().filter(|r| !r["refused"].as_array().unwrap().is_empty()).count(),
        "names": export_names.iter().map(|(n, (c, a, b, v))| serde_json::json!({"name": n, "objects": c, "allowed": a, "binding": b, "visibility": v})).collect::<Vec<_>>(),
        "files": export_rows,
    });
    std::fs::create_dir_all(&out_dir).unwrap();
    for (name, v) in [
        ("object_byte_scan_false_positives", &scan),
        ("object_exports_honest", &exports),
    ] {
        std::fs::write(
            out_dir.join(format!("{name}_cpu_{date}.json")),
            serde_json::to_string_pretty(v).unwrap() + "\n",
        )
        .unwrap();
    }
    println!(
        "{objects} objects, {with_hits} with a hit, {with_hidden} with a hidden hit, {refused} refused, {} build failures",
        failed.len()
    );
}

/// `check --signature` prints the launcher a candidate must define and the task's sizes, for a
/// hand-written task (its train shapes) and a KernelBench problem (its own sizes from
/// `kb-specs`); an unknown task gets the nearest name (exit 2); neither `--source` nor
/// `--signature` is a usage error (exit 2).
#[test]
fn check_prints_a_tasks_launcher_and_its_sizes() {
    let p = Project::new();
    let o = p.run(&["check", "--task", "vector_add", "--signature"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some(
            "extern \"C\" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);"
        ),
        "{out}"
    );
    assert!(
        lines
            .next()
            .is_some_and(|l| l.starts_with("// sizes: {\"n\":")),
        "{out}"
    );
    let o = p.run(&["check", "--task", "vector_add", "--signature", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["task_id"], "vector_add", "{v}");
    assert!(v["sizes"][0]["n"].as_i64().is_some_and(|n| n > 0), "{v}");

    let o = p.run(&["check", "--task", "vectr_add", "--signature"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("did you mean `vector_add`?"),
        "{}",
        stderr(&o)
    );
    let o = p.run(&["check", "--task", "vector_add"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    if python().is_none() {
        eprintln!("SKIPPED the KernelBench half: no .venv (run `make setup`)");
        return;
    }
    let o = p.run(&["check", "--task", "kb/L1/19_ReLU", "--signature", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["signature"],
        "extern \"C\" void launch(const float* in0, float* out, int64_t batch_size, int64_t dim, cudaStream_t stream)",
        "{v}"
    );
    assert!(
        v["sizes"][0]["batch_size"].as_i64().is_some_and(|n| n > 0),
        "{v}"
    );
}
