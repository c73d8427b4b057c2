//! GPU tests of the harness, gated: `#[ignore]`d, so CPU CI lists them as skipped; on a machine
//! with a GPU run them with `CUDARL_GPU=1 cargo test --test gpu -- --include-ignored` (the GPU
//! machine runs the carried test binary, see scripts/gpu/checks.sh).
//!
//! - every task's naive and optimized kernels pass on every train and hold-out shape and every
//!   public and hidden seed; optimized beats naive; torch baselines are measured;
//! - timing the same kernel twice agrees within 2% (median);
//! - the Nsight Compute profile pass measures occupancy, DRAM throughput and warp efficiency of
//!   a candidate inside its sandboxed runner (or says `absent` without `ncu`);
//! - `validate` with four GPU workers testing at once gives the verdicts one worker gives, and
//!   timings that agree with its (timing runs alone);
//! - every reward hack in `tests/kernels/hacks/` is rejected with the expected reason inside one
//!   `validate` run, and the run goes on (an honest kernel after them still passes);
//! - every unusual honest kernel of `tests/kernels/honest/` (clusters, cooperative groups,
//!   programmatic dependent launch, `cp.async`, inline PTX, static host state) is correct and
//!   unflagged.
//! - a native KernelBench candidate passes the recorded tests and is timed against torch eager
//!   and `torch.compile`;
//! - decoding with CUDA graphs gives the tokens and log-probabilities of the same steps run
//!   without graphs, log-probabilities of sampled tokens equal to the training path's, and is
//!   faster than the dynamic-cache decode.

mod common;

use common::{Project, stdout};
use serde_json::Value;

fn gpu_enabled(test: &str) -> bool {
    if std::env::var("CUDARL_GPU").as_deref() != Ok("1") {
        eprintln!("SKIPPED {test}: GPU test (set CUDARL_GPU=1 on a machine with a GPU)");
        return false;
    }
    assert!(
        cudarl_cuda::gpu::probe().is_some(),
        "CUDARL_GPU=1 but no usable GPU"
    );
    true
}

fn check(p: &Project, task: &str, src: &std::path::Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "check",
        "--task",
        task,
        "--source",
        src.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = p.run(&args);
    // One JSON line per verdict: one verdict as it is, several as an array.
    let mut v: Vec<Value> = stdout(&o)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{task} {}: {e}\n{}", src.display(), common::stderr(&o)))
        })
        .collect();
    match v.len() {
        0 => panic!(
            "{task} {}: no verdict\n{}",
            src.display(),
            common::stderr(&o)
        ),
        1 => v.remove(0),
        _ => Value::Array(v),
    }
}

/// `check` of torch-format `srcs` for `kb/L1/19_ReLU`, judged in turn by one worker, with the
/// recorded tests of the first 19 L1 problems: one verdict, or an array for several sources.
fn check_relu(p: &Project, srcs: &[&std::path::Path]) -> Value {
    let mut extra: Vec<&str> = vec!["--set", "testgen.limit=19"];
    for s in &srcs[1..] {
        extra.extend(["--source", s.to_str().unwrap()]);
    }
    check(p, "kb/L1/19_ReLU", srcs[0], &extra)
}

/// [`check_relu`] with `--without-allowlist`: for `ModelNew` files the allow-list refuses, to
/// test what stands behind it (the runner's sandbox, the judge in another process, the
/// kernels-ran check).
fn check_relu_behind_allowlist(p: &Project, srcs: &[&std::path::Path]) -> Value {
    let mut extra: Vec<&str> = vec!["--set", "testgen.limit=19", "--without-allowlist"];
    for s in &srcs[1..] {
        extra.extend(["--source", s.to_str().unwrap()]);
    }
    check(p, "kb/L1/19_ReLU", srcs[0], &extra)
}

fn median(v: &Value) -> f64 {
    v["timing"]["median_ms"].as_f64().expect("timed")
}

#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn task_kernels_pass_everywhere_and_optimized_beats_naive() {
    if !gpu_enabled("task_kernels_pass_everywhere_and_optimized_beats_naive") {
        return;
    }
    let p = Project::full();
    let tasks = cudarl_cuda::load_tasks(&p.path("datasets/tasks")).unwrap();
    assert!(tasks.len() >= 2);
    for t in &tasks {
        let naive = check(&p, &t.spec.id, &t.dir.join(&t.spec.naive), &[]);
        // Per shape: 2 public and 2 hidden seeds, then the 2 cache probes.
        let want_tests = (t.spec.train_shapes.len() + t.spec.holdout_shapes.len()) * 6;
        for (name, v) in std::iter::once(("naive".to_string(), naive.clone())).chain(
            t.spec
                .optimized
                .iter()
                .map(|f| (f.clone(), check(&p, &t.spec.id, &t.dir.join(f), &[]))),
        ) {
            let id = format!("{}/{name}", t.spec.id);
            assert_eq!(
                v["correct"],
                Value::Bool(true),
                "{id}: {}",
                v["failure_detail"]
            );
            let tests = v["tests"].as_array().unwrap();
            assert_eq!(tests.len(), want_tests, "{id}");
            assert!(
                tests.iter().all(|x| x["passed"] == Value::Bool(true)),
                "{id}"
            );
            assert!(tests.iter().any(|x| x["split"] == "holdout"), "{id}");
            assert!(v["speedup_vs_torch"].as_f64().unwrap() > 0.0, "{id}");
            assert!(
                v["hack_flags"].as_array().unwrap().is_empty(),
                "{id}: {}",
                v["hack_flags"]
            );
            if name != "naive" {
                let s = v["speedup_vs_naive"].as_f64().unwrap();
                assert!(
                    s > 1.0,
                    "{id}: optimized is not faster than naive ({s:.3}x)"
                );
            }
        }
    }
}

#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn timing_the_same_kernel_twice_agrees_within_two_percent() {
    if !gpu_enabled("timing_the_same_kernel_twice_agrees_within_two_percent") {
        return;
    }
    let p = Project::full();
    for t in cudarl_cuda::load_tasks(&p.path("datasets/tasks")).unwrap() {
        // One family per kind of kernel: memory-bound elementwise, reduction, compute-bound.
        if !["vector_add", "row_sum", "softmax", "matmul"].contains(&t.spec.id.as_str()) {
            continue;
        }
        let f = t.dir.join(&t.spec.optimized[0]);
        let a = median(&check(&p, &t.spec.id, &f, &[]));
        let b = median(&check(&p, &t.spec.id, &f, &[]));
        let d = (a - b).abs() / a.min(b);
        eprintln!("{}: {a:.5} ms vs {b:.5} ms ({:.2}%)", t.spec.id, d * 100.0);
        assert!(
            d <= 0.02,
            "{}: {a:.5} ms vs {b:.5} ms ({:.2}%)",
            t.spec.id,
            d * 100.0
        );
    }
}

#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn the_profile_pass_measures_counters_inside_the_sandbox() {
    if !gpu_enabled("the_profile_pass_measures_counters_inside_the_sandbox") {
        return;
    }
    let p = Project::full();
    let has_ncu = cudarl_cuda::profile::Ncu::find().is_some();
    for (task, file) in [("vector_add", "naive.cu"), ("matmul", "tiled_4x4.cu")] {
        let f = p.path(&format!("datasets/tasks/{task}/{file}"));
        let v = check(&p, task, &f, &["--ncu"]);
        assert_eq!(v["correct"], true, "{task}: {v}");
        let status = v["profile"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !has_ncu {
            assert!(status.starts_with("absent"), "{task}: {status}");
            continue;
        }
        assert!(status.starts_with("measured"), "{task}: {status}");
        let m = &v["profile"]["metrics"];
        eprintln!("{task} {file}: {m}");
        assert!(m["kernels"].as_u64().unwrap() >= 1, "{m}");
        for k in [
            "achieved_occupancy",
            "dram_throughput",
            "warp_execution_efficiency",
        ] {
            let x = m[k].as_f64().unwrap();
            assert!(x > 0.0 && x <= 1.0, "{task} {k} = {x}");
        }
    }
}

/// `run validate`, then its verdict rows (`show validate --output validations`) by kernel id;
/// `base` (e.g. `--store`, `--set`) goes to both commands.
fn validations(p: &Project, base: &[&str]) -> std::collections::BTreeMap<String, Value> {
    let o = p.run(&[base, &["run", "validate"]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let show = [
        "show",
        "validate",
        "--output",
        "validations",
        "--json",
        "--head",
        "100000",
    ];
    let o = p.run(&[base, &show[..]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["kernel_id"].as_str().unwrap().to_string(), v))
        .collect()
}

#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
/// `validate` with four testers and batched timing (the default: 32 candidates per exclusive
/// hold) against one worker timing each candidate in its own hold: the same verdicts, and the
/// same timings within noise.
fn four_gpu_workers_agree_with_one() {
    if !gpu_enabled("four_gpu_workers_agree_with_one") {
        return;
    }
    let p = Project::full();
    let run = |store: &str, workers: usize| {
        let set = format!("validate.gpu_workers={workers}");
        // One worker times in batches by a timing worker, four in their testers' runners.
        let batch = format!(
            "validate.timing=\"{}\"",
            if workers == 1 { "batched" } else { "in_tester" }
        );
        validations(
            &p,
            &[
                "--store",
                store,
                "--set",
                &set,
                "--set",
                &batch,
                "--set",
                "synth-tasks.generate.elementwise=24",
                "--set",
                "synth-tasks.generate.row_reduce=4",
                "--set",
                "synth-tasks.generate.operators=0",
            ],
        )
    };
    let (one, four) = (run("store-one", 1), run("store-four", 4));
    assert_eq!(
        one.keys().collect::<Vec<_>>(),
        four.keys().collect::<Vec<_>>()
    );
    assert!(one.len() >= 60, "{} kernels", one.len());
    let mut log_ratios = Vec::new();
    for (id, a) in &one {
        let b = &four[id];
        for k in ["compiled", "correct", "failure", "hack_flags"] {
            assert_eq!(a[k], b[k], "{id}: {k}");
        }
        let verdict = |v: &Value| -> Value {
            serde_json::from_str(v["verdict_json"].as_str().unwrap()).unwrap()
        };
        let (va, vb) = (verdict(a), verdict(b));
        assert!(
            va["hack_flags"].as_array().unwrap().is_empty(),
            "{id}: {}",
            va["hack_flags"]
        );
        if let (Some(x), Some(y)) = (
            va["timing"]["median_ms"].as_f64(),
            vb["timing"]["median_ms"].as_f64(),
        ) {
            log_ratios.push((y / x).ln());
            // Every timed kernel carries host<->device copy times (from the copy rate each
            // worker process measures once).
            for v in [&va, &vb] {
                for k in ["h2d_ms", "d2h_ms"] {
                    let ms = v["timing"][k].as_f64().unwrap_or(0.0);
                    assert!(ms > 0.0, "{id}: timing.{k} = {ms}");
                }
            }
        }
    }
    assert!(log_ratios.len() >= 50, "{} timed", log_ratios.len());
    // Every kernel timed alone either way (in its tester's runner, or by a timing worker): the
    // geometric mean of four-worker / one-worker medians stays within 3% of 1 (per kernel,
    // run-to-run noise of small kernels is larger).
    let g = (log_ratios.iter().sum::<f64>() / log_ratios.len() as f64).exp();
    eprintln!(
        "{} kernels timed; geometric mean ratio 4 workers / 1 = {g:.4}",
        log_ratios.len()
    );
    assert!((0.97..=1.03).contains(&g), "geometric mean ratio {g:.4}");
}

#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn every_hack_is_rejected_with_its_reason_and_the_run_goes_on() {
    if !gpu_enabled("every_hack_is_rejected_with_its_reason_and_the_run_goes_on") {
        return;
    }
    let p = Project::full();
    let hacks = common::repo_root().join("tests/kernels/hacks");
    let expected: toml::Table =
        toml::from_str(&std::fs::read_to_string(hacks.join("expected.toml")).unwrap()).unwrap();
    // vector_add lists every hack, then its honest kernel last.
    let dir = p.path("datasets/tasks/vector_add");
    let mut names: Vec<String> = expected.keys().map(|k| format!("{k}.cu")).collect();
    for n in &names {
        std::fs::copy(hacks.join(n), dir.join(n)).unwrap();
    }
    names.push("vec4.cu".into());
    let toml_path = dir.join("task.toml");
    let mut doc: toml::Table =
        toml::from_str(&std::fs::read_to_string(&toml_path).unwrap()).unwrap();
    doc.insert(
        "optimized".into(),
        toml::Value::Array(names.iter().cloned().map(toml::Value::String).collect()),
    );
    std::fs::write(&toml_path, toml::to_string(&doc).unwrap()).unwrap();
    // The task kernels (`validate`; the archives' are `validate-archive`'s) of the hand-written
    // tasks alone (no generated operator families: the hacks are all in vector_add).
    let only_written = ["--set", "synth-tasks.generate.operators=0"];
    let rows: Vec<Value> = validations(&p, &only_written).into_values().collect();
    assert!(rows.iter().all(|v| v["source"] == "synth"), "{rows:?}");
    let kernels = p.run(
        &[
            &only_written[..],
            &[
                "show",
                "synth-tasks",
                "--output",
                "task_kernels",
                "--json",
                "--head",
                "1000",
            ],
        ]
        .concat(),
    );
    let files: std::collections::BTreeMap<String, String> = stdout(&kernels)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| {
            (
                v["kernel_id"].as_str().unwrap().to_string(),
                v["file"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(rows.len(), files.len(), "one verdict per kernel");
    // Every case is judged before anything is asserted, so one run names all wrong verdicts.
    let mut seen = 0;
    let mut wrong = Vec::new();
    for r in &rows {
        let file = files
            .get(r["kernel_id"].as_str().unwrap())
            .cloned()
            .unwrap_or_default();
        let stem = file.trim_end_matches(".cu");
        if let Some(e) = expected.get(stem) {
            let want = e["failure"].as_str().unwrap();
            // Static rejects never ran (correct is null); everything else ran and failed.
            if r["failure"].as_str() != Some(want) || r["correct"] == Value::Bool(true) {
                wrong.push(format!(
                    "{stem}: want {want}, got failure {} correct {} flags {} {}",
                    r["failure"], r["correct"], r["hack_flags"], r["failure_detail"]
                ));
            }
            seen += 1;
        }
        if r["task_id"] == "vector_add" && file == "vec4.cu" && r["correct"] != Value::Bool(true) {
            wrong.push(format!("the run did not go on: {r}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong verdicts: {wrong:#?}",
        wrong.len()
    );
    let summary: Vec<String> = rows
        .iter()
        .filter(|r| r["task_id"] == "vector_add")
        .map(|r| {
            format!(
                "{:?} -> {:?}",
                files.get(r["kernel_id"].as_str().unwrap()),
                r["failure"].as_str()
            )
        })
        .collect();
    assert_eq!(
        seen,
        expected.len(),
        "every hack has a row: {} rows, {} kernels, vector_add: {summary:?}",
        rows.len(),
        files.len()
    );
}

#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn unusual_honest_kernels_are_correct_and_unflagged() {
    if !gpu_enabled("unusual_honest_kernels_are_correct_and_unflagged") {
        return;
    }
    let p = Project::full();
    let dir = common::repo_root().join("tests/kernels/honest");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|f| f.extension().is_some_and(|e| e == "cu"))
        .collect();
    files.sort();
    assert!(files.len() >= 13, "{files:?}");
    let mut wrong = Vec::new();
    for f in &files {
        let stem = f.file_stem().unwrap().to_str().unwrap();
        let task = stem.split("__").next().unwrap();
        let v = check(&p, task, f, &[]);
        let flags = v["hack_flags"].as_array().map_or(0, Vec::len);
        if v["correct"] != Value::Bool(true) || flags > 0 {
            wrong.push(format!(
                "{stem}: correct {} failure {} flags {} {}",
                v["correct"], v["failure"], v["hack_flags"], v["failure_detail"]
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn torch_format_modelnew_runs_against_recorded_tests_and_hacks_fail() {
    if !gpu_enabled("torch_format_modelnew_runs_against_recorded_tests_and_hacks_fail") {
        return;
    }
    let p = Project::new();
    let kb = common::repo_root().join("tests/kernels/kb");
    let v = check_relu(&p, &[&kb.join("relu_model_new.py")]);
    assert_eq!(v["mode"], "full", "{v}");
    assert_eq!(v["correct"], true, "{v}");
    let tests = v["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 4, "2 public + 2 hidden recorded seeds: {v}");
    assert!(tests.iter().any(|t| t["split"] == "hidden"));
    assert!(median(&v) > 0.0);
    assert!(v["speedup_vs_torch"].as_f64().unwrap() > 0.0, "{v}");
    let v = check_relu(&p, &[&kb.join("inplace_relu.py")]);
    assert_eq!(v["correct"], false, "{v}");
    assert_eq!(v["failure"], "input_mutation", "{v}");
    let v = check_relu(&p, &[&kb.join("half_written.py")]);
    assert_eq!(v["correct"], false, "{v}");
    assert!(
        ["unwritten_output", "wrong_answer"].contains(&v["failure"].as_str().unwrap()),
        "{v}"
    );
}

/// A native candidate for a KernelBench problem (the launcher `kb-specs` derived) passes the
/// recorded tests and is timed against the reference in torch eager and under `torch.compile`.
#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn kernelbench_native_kernel_is_timed_against_torch_eager_and_torch_compile() {
    if !gpu_enabled("kernelbench_native_kernel_is_timed_against_torch_eager_and_torch_compile") {
        return;
    }
    let p = Project::new();
    let src = common::repo_root().join("tests/kernels/kb_native/19_ReLU.cu");
    let v = check_relu(&p, &[&src]);
    assert_eq!(
        (&v["mode"], &v["correct"]),
        (&"full".into(), &true.into()),
        "{v}"
    );
    assert!(v["speedup_vs_torch"].as_f64().unwrap() > 0.0, "{v}");
    assert!(
        v["torch_compile_timing"]["median_ms"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert!(v["speedup_vs_torch_compile"].as_f64().unwrap() > 0.0, "{v}");
}

/// `ModelNew` files whose `forward` attacks the judge, judged without the allow-list that refuses
/// them all (`tests/torch_format.rs`), so they run in the sandboxed runner: a
/// shell command through `torch.ctypes`, a file written through `torch.os`, the expected outputs
/// sought among the interpreter's objects, a forged answer on stdout, the comparison replaced in
/// the runner's interpreter. Each gets the judge's verdict, and no marker file appears.
#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn torch_format_forward_attacks_meet_the_judge_in_another_process() {
    if !gpu_enabled("torch_format_forward_attacks_meet_the_judge_in_another_process") {
        return;
    }
    let p = Project::new();
    for (case, failure) in [
        ("torch_ctypes", "sandbox_violation"),
        ("write_file", "wrong_answer"),
        ("gc_expected", "wrong_answer"),
        ("forged_answer", "wrong_answer"),
        ("patch_compare", "wrong_answer"),
    ] {
        let marker = std::path::PathBuf::from(format!("/tmp/cudarl-forward-{case}"));
        let _ = std::fs::remove_file(&marker);
        let v = check_relu_behind_allowlist(&p, &[&common::forward_candidate(&p, case)]);
        assert_eq!(v["mode"], "full", "{case}: {v}");
        assert_eq!(v["correct"], false, "{case}: {v}");
        assert_eq!(v["failure"], failure, "{case}: {v}");
        assert!(!marker.exists(), "{case}: the payload reached the host");
    }
}

/// Torch ops standing in for the kernel, found from the kernels one forward ran (judged without
/// the allow-list, which refuses both attacks first): a token launch
/// of the honest extension beside plain `torch.relu`, and one beside
/// `getattr(torch.ops.aten, "relu")` (`forward_candidate`), are correct but
/// flagged `torch_op_stands_in`; the honest ReLU `ModelNew` is not flagged.
#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn torch_ops_standing_in_are_found_from_the_kernels_that_ran() {
    if !gpu_enabled("torch_ops_standing_in_are_found_from_the_kernels_that_ran") {
        return;
    }
    let p = Project::new();
    let kb = common::repo_root().join("tests/kernels/kb");
    for (file, flagged) in [
        ("relu_model_new", false),
        ("token_relu", true),
        ("getattr_aten", true),
    ] {
        let src = if flagged {
            common::forward_candidate(&p, file)
        } else {
            kb.join(format!("{file}.py"))
        };
        let v = check_relu_behind_allowlist(&p, &[&src]);
        assert_eq!(v["correct"], true, "{file}: {v}");
        let flags: Vec<&str> = v["hack_flags"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            flags.contains(&"torch_op_stands_in"),
            flagged,
            "{file}: {flags:?} {}",
            v["failure_detail"]
        );
    }
}

/// A CUDA fault in one candidate's runner (a device-side assert) is that candidate's
/// `cuda_error`; the judge's own context is intact, so the next candidate judged by the same
/// worker (`check` with two sources) is correct, not `crash`.
#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn a_fault_in_one_runner_leaves_the_next_candidate_to_the_same_judge() {
    if !gpu_enabled("a_fault_in_one_runner_leaves_the_next_candidate_to_the_same_judge") {
        return;
    }
    let p = Project::new();
    let honest = common::repo_root().join("tests/kernels/kb/relu_model_new.py");
    let faulting = common::forward_candidate(&p, "device_assert");
    let v = check_relu_behind_allowlist(&p, &[&faulting, &honest]);
    let v = v.as_array().unwrap_or_else(|| panic!("two verdicts: {v}"));
    assert_eq!(v.len(), 2);
    assert_eq!(v[0]["failure"], "cuda_error", "{}", v[0]);
    assert_eq!(v[1]["correct"], true, "{}", v[1]);
}

#[test]
#[ignore = "GPU test: CUDARL_GPU=1 ... --include-ignored on a GPU machine"]
fn decoding_with_cuda_graphs_matches_the_kernels_it_replays_and_the_training_log_probs() {
    if !gpu_enabled(
        "decoding_with_cuda_graphs_matches_the_kernels_it_replays_and_the_training_log_probs",
    ) {
        return;
    }
    let p = Project::full();
    let o = p.run(&[
        "bench",
        "decode",
        "--batches",
        "1,8,64",
        "--prompt-len",
        "64",
        "--gen-tokens",
        "40",
        "--reps",
        "1",
        "--no-transformers",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["ours"]["cuda_graphs"], true, "built without CUDA graphs");
    for c in v["ours"]["checks"].as_array().unwrap() {
        let b = c["batch"].as_u64().unwrap();
        // Replayed graphs run the kernels the uncaptured steps run: the same tokens and
        // log-probabilities, bit for bit.
        assert_eq!(c["greedy_rows_equal_static"].as_u64(), Some(b), "{c}");
        assert_eq!(c["greedy_log_probs_equal_static"], true, "{c}");
        // The sampled tokens' log-probabilities are the training path's, to bf16 rounding.
        let e = c["sampled_max_log_prob_error_vs_training"]
            .as_f64()
            .unwrap();
        assert!(e < 0.05, "{c}");
    }
    for r in v["rows"].as_array().unwrap() {
        let x = r["speedup_vs_baseline"].as_f64().unwrap();
        eprintln!("batch {}: {x:.2}x the dynamic-cache decode", r["batch"]);
        assert!(x > 1.0, "{r}");
    }
}
