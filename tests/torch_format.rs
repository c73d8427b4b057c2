//! KernelBench recorded tests (`testgen`), the Python worker's protocol, and torch-format
//! candidates (`check --task kb/...`) on CPU: real processes, real torch, real nvcc, real
//! safetensors files in the store.

mod common;

use std::process::Command;

use common::{Project, repo_root, stderr, stdout};
use cudarl_cuda::pyworker::PyWorker;
use serde_json::{Value, json};

fn have_python(p: &Project, o: &std::process::Output) -> bool {
    let _ = p;
    if o.status.code() != Some(0) && std::env::var("CUDARL_REQUIRE_PYTHON").is_err() {
        eprintln!("SKIPPED: no Python with torch: {}", stderr(o));
        return false;
    }
    true
}

fn python() -> std::path::PathBuf {
    cudarl_cuda::pyworker::python(&repo_root())
}

#[test]
fn testgen_records_reference_tensors_as_safetensors_blobs() {
    let p = Project::new();
    let o = p.run(&["run", "testgen", "--set", "testgen.limit=2", "--json"]);
    if !have_python(&p, &o) {
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let show_with = |out: &str, limit: &str| -> Vec<Value> {
        let o = p.run(&[
            "show", "testgen", "--output", out, "--json", "--head", "100", "--set", limit,
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let show = |out: &str| show_with(out, "testgen.limit=2");
    let probs = show("kb_testgen");
    assert_eq!(probs.len(), 4, "2 per level: {probs:?}");
    let tests = show("kb_tests");
    // 2 public + 2 hidden seeds per problem, distributions cycled.
    assert_eq!(tests.len(), 16, "{tests:?}");
    let mm: Vec<&Value> = tests
        .iter()
        .filter(|t| t["problem_id"] == "kb/L1/1_Square_matrix_multiplication_")
        .collect();
    let splits: Vec<&str> = mm.iter().map(|t| t["split"].as_str().unwrap()).collect();
    assert_eq!(splits, ["public", "public", "hidden", "hidden"]);
    let dists: Vec<&str> = mm.iter().map(|t| t["dist"].as_str().unwrap()).collect();
    assert_eq!(dists, ["native", "signed", "scaled", "special"]);
    assert!(
        mm[2]["seed"].as_i64().unwrap() > 1,
        "hidden seeds are not 0, 1"
    );
    // Test sizes are the problem's halved (N = 2048 -> a few hundred) and fit the budget.
    let sq = probs
        .iter()
        .find(|r| r["problem_id"] == "kb/L1/1_Square_matrix_multiplication_")
        .unwrap();
    let sizes: Value = serde_json::from_str(sq["test_sizes_json"].as_str().unwrap()).unwrap();
    let n = sizes["N"].as_i64().unwrap();
    assert!((64..2048).contains(&n), "{sizes}");
    assert!(sq["test_bytes"].as_i64().unwrap() <= 1 << 20);
    assert!(sq["full_bytes"].as_i64().unwrap() > sq["test_bytes"].as_i64().unwrap());
    // The blobs are real safetensors: output = input.0 @ input.1 (f32), native inputs are
    // torch.rand's [0, 1), `signed` ones are not.
    let blob = |t: &Value| {
        let d = t["blob"].as_str().unwrap();
        p.store().join("cas").join(&d[..2]).join(d)
    };
    for (t, signed) in [(mm[0], false), (mm[1], true)] {
        let path = blob(t);
        assert!(path.is_file(), "{}", path.display());
        let code = format!(
            "from safetensors.torch import load_file\nimport torch\nt = load_file({:?})\n\
             a, b, c = t['input.0'], t['input.1'], t['output.0']\n\
             assert torch.allclose(a.double() @ b.double(), c.double(), rtol=1e-4, atol=1e-3)\n\
             print(float(a.min()))",
            path.display().to_string()
        );
        let o = Command::new(python()).args(["-c", &code]).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let min: f64 = stdout(&o).trim().parse().unwrap();
        assert_eq!(min < 0.0, signed, "min {min}");
    }
    // gc keeps the blobs the kb_tests rows name.
    let o = p.run(&["gc"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(blob(mm[3]).is_file(), "gc removed a recorded test");
    // A larger limit runs only the new problems (row memo): same rows for the old ones.
    let o = p.run(&["run", "testgen", "--set", "testgen.limit=3", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let tests3 = show_with("kb_tests", "testgen.limit=3");
    assert_eq!(tests3.len(), 24);
    for t in &tests {
        assert!(tests3.contains(t), "row changed: {t}");
    }
}

#[test]
fn python_worker_protocol_and_error_paths() {
    let mut w = match PyWorker::start(&repo_root()) {
        Ok(w) => w,
        Err(e) => {
            assert!(
                std::env::var("CUDARL_REQUIRE_PYTHON").is_err(),
                "no worker: {e}"
            );
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    assert_eq!(w.hello["hello"], true);
    let problem = "import torch\nimport torch.nn as nn\n\
        class Model(nn.Module):\n    def forward(self, x):\n        return torch.softmax(x, dim=-1)\n\
        batch = 256\ndim = 65536\n\
        def get_inputs():\n    return [torch.rand(batch, dim)]\n\
        def get_init_inputs():\n    return []\n";
    // plan: 256 x 65536 x 4 B x 2 (in + out) = 128 MiB, halved until <= 1 MiB.
    let a = w
        .call(
            &json!({"op": "plan", "problem_id": "t/softmax", "code": problem,
            "dims": ["batch", "dim"], "budget_bytes": 1 << 20}),
        )
        .unwrap();
    assert_eq!(a["ok"], true, "{a}");
    assert_eq!(a["full_bytes"], 256 * 65536 * 4 * 2);
    assert!(a["bytes"].as_i64().unwrap() <= 1 << 20, "{a}");
    assert_eq!(a["fits"], true);
    assert!(a["constrained"].is_null());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    let a = w
        .call(
            &json!({"op": "testgen", "problem_id": "t/softmax", "code": problem,
            "sizes": {"batch": 4, "dim": 8}, "seed": 3, "dist": "special", "path": path}),
        )
        .unwrap();
    assert_eq!(a["ok"], true, "{a}");
    assert_eq!(a["finite"], true);
    let names: Vec<&str> = a["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["input.0", "output.0"]);
    assert_eq!(a["tensors"][1]["shape"], json!([4, 8]));
    assert!(path.is_file());
    // A reference that raises: ok=false, the error names the line in the problem file.
    let bad = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        \
        raise ValueError('boom')\ndef get_inputs():\n    return [torch.rand(2)]\n";
    let a = w
        .call(
            &json!({"op": "testgen", "problem_id": "t/bad", "code": bad, "sizes": {},
            "seed": 0, "dist": "native", "path": dir.path().join("b.safetensors")}),
        )
        .unwrap();
    assert_eq!(a["ok"], false);
    let e = a["error"].as_str().unwrap();
    assert!(
        e.contains("ValueError: boom") && e.contains("line 4"),
        "{e}"
    );
    // A constrained generator is detected (redrawing would change the problem).
    let kl = problem.replace(
        "torch.rand(batch, dim)",
        "torch.rand(batch, dim).softmax(dim=-1)",
    );
    let a = w
        .call(
            &json!({"op": "plan", "problem_id": "t/kl", "code": kl, "dims": [],
            "budget_bytes": 1_i64 << 40}),
        )
        .unwrap();
    assert_eq!(a["constrained"], "get_inputs applies softmax()", "{a}");
    // The long-lived worker never executes a candidate file: extraction is a sandboxed process.
    let a = w
        .call(&json!({"op": "extract_inline", "code": "import os"}))
        .unwrap();
    assert_eq!(a["ok"], false, "{a}");
    let src =
        std::fs::read_to_string(repo_root().join("tests/kernels/kb/relu_model_new.py")).unwrap();
    let a = match cudarl_cuda::pyworker::extract_inline(
        &repo_root(),
        &src,
        std::time::Duration::from_secs(120),
    )
    .unwrap()
    {
        cudarl_cuda::pyworker::Extracted::Answer(a) => a,
        other => panic!("{other:?}"),
    };
    assert_eq!(a["ok"], true, "{a}");
    assert_eq!(a["calls"][0]["name"], "relu_ext");
    assert_eq!(
        a["calls"][0]["functions"],
        json!({"relu_forward": "relu_forward"})
    );
    assert_eq!(a["calls"][0]["extra_cuda_cflags"], json!(["-O3"]));
    // Unknown op and the explicit error path; the worker goes on after both.
    let a = w.call(&json!({"op": "nope"})).unwrap();
    assert_eq!(a["ok"], false);
    let a = w.call(&json!({"op": "raise", "message": "x"})).unwrap();
    assert_eq!(a["error"], "RuntimeError: x");
    let a = w.call(&json!({"op": "build_env"})).unwrap();
    assert_eq!(a["ok"], true, "{a}");
}

/// The import-time escapes (`tests/kernels/kb/escape_<case>.py`) and the failure each gets from
/// the interpreter sandbox when the allow-list is off.
const ESCAPES: [(&str, &str); 8] = [
    ("torch_os", "sandbox_violation"),
    ("torch_ctypes", "sandbox_violation"),
    ("cpp_extension_subprocess", "sandbox_violation"),
    ("import_math_os", "sandbox_violation"),
    ("builtins_import", "sandbox_violation"),
    ("posix", "sandbox_violation"),
    ("socket", "sandbox_violation"),
    ("write_file", "load_error"),
];

/// The `forward` attacks (`tests/kernels/kb/forward_<case>.py`).
const FORWARD_CASES: [&str; 8] = [
    "torch_ctypes",
    "write_file",
    "gc_expected",
    "forged_answer",
    "patch_compare",
    "token_relu",
    "getattr_aten",
    "device_assert",
];

fn check_kb(p: &Project, source: &str) -> (i32, Value) {
    check_kb_file(p, &repo_root().join("tests/kernels/kb").join(source))
}

/// The ModelNew file of an escape case: its payload (`tests/kernels/kb/escape_<case>.py`)
/// followed by the honest ReLU of `relu_model_new.py` from its `cuda_src` on, written into the
/// project.
fn escape_candidate(p: &Project, case: &str) -> std::path::PathBuf {
    let kb = repo_root().join("tests/kernels/kb");
    let payload = std::fs::read_to_string(kb.join(format!("escape_{case}.py"))).unwrap();
    let honest = std::fs::read_to_string(kb.join("relu_model_new.py")).unwrap();
    let body = &honest[honest
        .find("cuda_src = ")
        .expect("relu_model_new.py has cuda_src")..];
    let path = p.path(&format!("escape_{case}.py"));
    std::fs::write(&path, format!("{payload}\n{body}")).unwrap();
    path
}

fn check_kb_file(p: &Project, src: &std::path::Path) -> (i32, Value) {
    check_kb_files(p, &[src], &[]).remove(0)
}

/// [`check_kb_file`] with `--without-allowlist`: what stands behind the `ModelNew` allow-list.
fn check_behind_allowlist(p: &Project, src: &std::path::Path) -> (i32, Value) {
    check_kb_files(p, &[src], &["--without-allowlist"]).remove(0)
}

/// One compile-only `check` of kb/L1/19_ReLU with every file of `srcs` (one worker for all):
/// each verdict, with the run's exit code.
fn check_kb_files(p: &Project, srcs: &[&std::path::Path], extra: &[&str]) -> Vec<(i32, Value)> {
    let mut args = vec![
        "check",
        "--task",
        "kb/L1/19_ReLU",
        "--mode",
        "compile",
        "--json",
    ];
    for s in srcs {
        args.extend(["--source", s.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    let o = p.run(&args);
    let v: Vec<(i32, Value)> = stdout(&o)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{e}: {} {}", stdout(&o), stderr(&o)));
            (o.status.code().unwrap(), v)
        })
        .collect();
    assert_eq!(v.len(), srcs.len(), "{} {}", stdout(&o), stderr(&o));
    v
}

/// Whether a static rule rejected the candidate of verdict `v`.
fn rejected_by_rules(v: &Value) -> bool {
    v["static_flags"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["action"] == "reject")
}

#[test]
fn torch_format_static_rejects() {
    let p = Project::new();
    let o = p.run(&["run", "kb-specs"]);
    if !have_python(&p, &o) {
        return;
    }
    for (file, rule) in [
        ("inherits_model.py", "py-inherits-model"),
        ("try_fallback.py", "py-try-fallback"),
        ("torch_only.py", "no-kernel"),
    ] {
        let (code, v) = check_kb(&p, file);
        assert_eq!(code, 1, "{file}: {v}");
        assert_eq!(v["abi"], "torch");
        assert_eq!(v["compiled"], false);
        assert_eq!(v["failure"], "static_reject", "{file}: {v}");
        assert!(
            v["failure_detail"].as_str().unwrap().starts_with(rule),
            "{file}: {v}"
        );
    }
}

/// `ModelNew` files that reach the host at import (the payload runs while the file is executed
/// to record its `load_inline` calls, on a machine without a GPU too), judged without the
/// allow-list that refuses them all (`modelnew_allowlist_refuses_attacks_and_admits_honest_files`):
/// every one slips past the Python source rules, and every one is stopped by the interpreter
/// sandbox. None of the marker files its payload would create ever appears.
#[test]
fn modelnew_files_that_escape_at_import_are_stopped_by_the_sandbox() {
    let p = Project::new();
    let o = p.run(&["run", "kb-specs"]);
    if !have_python(&p, &o) {
        return;
    }
    for (case, failure) in ESCAPES {
        let marker = std::path::PathBuf::from(format!("/tmp/cudarl-escape-{case}"));
        let _ = std::fs::remove_file(&marker);
        let (code, v) = check_behind_allowlist(&p, &escape_candidate(&p, case));
        assert_eq!(code, 1, "{case}: {v}");
        assert_eq!(v["failure"], failure, "{case}: {v}");
        assert!(
            !rejected_by_rules(&v),
            "{case}: the source rules must not be what stops it: {v}"
        );
        if failure == "sandbox_violation" {
            assert_eq!(v["hack_flags"], json!(["sandbox_violation"]), "{case}: {v}");
        }
        assert!(!marker.exists(), "{case}: the payload ran on the host");
    }
}

/// The `forward` cases (`tests/kernels/kb/forward_<case>.py`, put in place of
/// `relu_model_new.py`'s forward): attacks on the judge and torch ops standing in for the kernel,
/// all of which act only when `forward` runs. Judged without the allow-list (which refuses every
/// one), each passes the source rules, the sandboxed extraction and the build, so only the
/// runner's sandbox and the judge can stop it (the gated GPU tests); no payload runs here.
#[test]
fn forward_cases_pass_the_source_rules_extraction_and_build() {
    let p = Project::new();
    let o = p.run(&["run", "kb-specs"]);
    if !have_python(&p, &o) {
        return;
    }
    for case in FORWARD_CASES {
        let marker = std::path::PathBuf::from(format!("/tmp/cudarl-forward-{case}"));
        let _ = std::fs::remove_file(&marker);
        let (code, v) = check_behind_allowlist(&p, &common::forward_candidate(&p, case));
        assert_eq!(code, 0, "{case}: {v}");
        assert_eq!(v["compiled"], true, "{case}: {v}");
        assert_eq!(v["failure"], Value::Null, "{case}: {v}");
        assert!(!rejected_by_rules(&v), "{case}: {v}");
        assert!(!marker.exists(), "{case}: the payload ran at extraction");
    }
}

/// The `ModelNew` allow-list (`python/cudarl_screen.py`), before any of a file runs: every case
/// of `tests/kernels/kb/allowlist/` (`refused_*.py`, and the variants of the ReLU `ModelNew` in
/// `relu_variants.toml`), every import-time escape and every `forward` attack is refused
/// statically, by the allow-list on its own too (nothing is extracted or built), and the
/// honest files (`allowlist/honest_*.py`, the ReLU `ModelNew` and the files whose fault only a
/// run shows) are admitted: the screen, run as its own process, finds nothing in them.
#[test]
fn modelnew_allowlist_refuses_attacks_and_admits_honest_files() {
    let p = Project::new();
    let o = p.run(&["run", "kb-specs"]);
    if !have_python(&p, &o) {
        return;
    }
    let dir = repo_root().join("tests/kernels/kb/allowlist");
    let files = walk(&dir);
    let mut refused: Vec<std::path::PathBuf> = files
        .iter()
        .filter(|f| {
            f.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("refused_")
        })
        .cloned()
        .collect();
    let variants: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.join("relu_variants.toml")).unwrap()).unwrap();
    for (case, v) in &variants {
        refused.push(relu_variant(&p, case, v.as_table().unwrap()));
    }
    assert!(refused.len() >= 45, "{refused:?}");
    for (case, _) in ESCAPES {
        refused.push(escape_candidate(&p, case));
    }
    for case in FORWARD_CASES {
        refused.push(common::forward_candidate(&p, case));
    }
    let srcs: Vec<&std::path::Path> = refused.iter().map(|f| f.as_path()).collect();
    for (f, (code, v)) in refused.iter().zip(check_kb_files(&p, &srcs, &[])) {
        assert_eq!(code, 1, "{}: {v}", f.display());
        assert_eq!(v["failure"], "static_reject", "{}: {v}", f.display());
        assert_eq!(v["compiled"], false, "{}: {v}", f.display());
        // A deny-list rule may name it first; the allow-list refuses it on its own too.
        let by = v["failure_detail"].as_str().unwrap();
        assert!(by.starts_with("py-"), "{}: {v}", f.display());
        assert_ne!(screen(f), "[]", "{}", f.display());
    }
    let kb = repo_root().join("tests/kernels/kb");
    let honest: Vec<std::path::PathBuf> = files
        .iter()
        .filter(|f| {
            f.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("honest_")
        })
        .cloned()
        .chain(["relu_model_new.py", "inplace_relu.py", "half_written.py"].map(|f| kb.join(f)))
        .collect();
    assert!(honest.len() >= 6, "{honest:?}");
    for f in &honest {
        assert_eq!(screen(f), "[]", "{}", f.display());
    }
}

/// A variant of `relu_model_new.py` from `tests/kernels/kb/allowlist/relu_variants.toml` (its
/// header says what each key changes), written into the project.
fn relu_variant(p: &Project, case: &str, v: &toml::Table) -> std::path::PathBuf {
    const CALL: &str = "        return relu_ext.relu_forward(x)\n";
    const INIT: &str = "        super().__init__()\n";
    const IMPORTS: &str = "from torch.utils.cpp_extension import load_inline\n";
    const CLASS: &str = "\n\nclass ModelNew";
    let honest =
        std::fs::read_to_string(repo_root().join("tests/kernels/kb/relu_model_new.py")).unwrap();
    let mut src = honest.split_once('\n').map_or("", |(_, r)| r).to_string();
    let indented = |text: &str| -> String {
        text.lines()
            .filter(|l| !l.is_empty())
            .map(|l| format!("        {l}\n"))
            .collect()
    };
    let mut put = |at: &str, with: String| {
        assert!(src.contains(at), "{case}: relu_model_new.py has no `{at}`");
        src = src.replacen(at, &with, 1);
    };
    let get = |k: &str| v.get(k).and_then(toml::Value::as_str);
    if let Some(body) = get("forward") {
        put(CALL, indented(body));
    }
    if let Some(init) = get("init") {
        put(INIT, format!("{INIT}{}", indented(init)));
    }
    if let Some(imports) = get("imports") {
        put(IMPORTS, format!("{IMPORTS}{imports}\n"));
    }
    if let Some(module) = get("module") {
        put(CLASS, format!("\n{module}\n{CLASS}"));
    }
    if let Some(r) = v.get("replace").and_then(toml::Value::as_array) {
        let (old, new) = (r[0].as_str().unwrap(), r[1].as_str().unwrap());
        put(old, new.to_string());
    }
    let what = get("what").unwrap_or(case);
    let path = p.path(&format!("relu_variant_{case}.py"));
    std::fs::write(
        &path,
        format!("# KernelBench kb/L1/19_ReLU: relu_model_new.py with {what}.\n{src}"),
    )
    .unwrap();
    path
}

/// The allow-list's findings on `file` as the screen prints them (JSON), from its own process.
fn screen(file: &std::path::Path) -> String {
    let o = Command::new(python())
        .arg(repo_root().join("python/cudarl_screen.py"))
        .stdin(std::fs::File::open(file).unwrap())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}: {}", file.display(), stderr(&o));
    stdout(&o).trim().to_string()
}

#[test]
fn torch_format_candidates_build_with_nvcc() {
    // One extension that does not build (the error names its line), one ModelNew that does, and
    // one extension whose torch imports are refused (about a minute of CPU each: torch's
    // headers).
    let p = Project::new();
    let o = p.run(&["run", "kb-specs"]);
    if !have_python(&p, &o) {
        return;
    }
    let (code, v) = check_kb(&p, "does_not_build.cu");
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["failure"], "compile_error", "{v}");
    let d = v["failure_detail"].as_str().unwrap();
    assert!(d.contains("line 6") && d.contains("undefined_name"), "{d}");
    let (code, v) = check_kb(&p, "relu_model_new.py");
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["compiled"], true, "{v}");
    assert_eq!(v["executed"], false);
    assert_eq!(v["mode"], "compile-only");
    assert!(
        v["resources"][0]["kernel"]
            .as_str()
            .unwrap()
            .contains("relu_kernel"),
        "{v}"
    );
    // Built once: the second check is a cache hit.
    let (_, v) = check_kb(&p, "relu_model_new.py");
    assert_eq!(v["cache_hit"], true, "{v}");
    // An extension whose ATen op does the work is refused from what it imports.
    let (code, v) = check_kb(&p, "extension_torch_op.cu");
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["failure"], "static_reject", "{v}");
    let d = v["failure_detail"].as_str().unwrap();
    assert!(
        d.starts_with("extension-symbol") && d.contains("`at::_ops::relu::call`"),
        "{d}"
    );
}

const ARCHIVE_COMPILE: &str = "validate-archive.mode=\"compile\"";

#[test]
fn archive_kernels_without_a_gpu_stop_after_static_checks_and_say_so() {
    // 3 SakanaAI and 3 CUDA-L1 kernels (the test project's `validate-archive.archive_limit`).
    let p = Project::new();
    let o = p.run(&["run", "validate-archive", "--set", ARCHIVE_COMPILE]);
    if !have_python(&p, &o) {
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = |out: &str| -> Vec<Value> {
        let o = p.run(&[
            "show",
            "validate-archive",
            "--output",
            out,
            "--json",
            "--head",
            "100",
            "--set",
            ARCHIVE_COMPILE,
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    // Only the archives' kernels: the task kernels are `validate`'s.
    let archive: Vec<Value> = rows("validations");
    assert_eq!(archive.len(), 6, "{archive:?}");
    for r in &archive {
        assert_eq!(r["executed"], false, "{r}");
        assert!(r["correct"].is_null(), "{r}");
        assert_eq!(r["role"], "archive");
        let f = r["failure"].as_str().unwrap();
        assert!(
            ["build_skipped", "static_reject", "load_error", "bind_error"].contains(&f),
            "{r}"
        );
        assert!(r["claimed_correct"].is_boolean() || r["claimed_correct"].is_null());
    }
    // The agreement table compares only what we know: skipped builds are not verdicts, static
    // rejects are (incorrect).
    let ag = rows("agreement");
    let skipped: Vec<&Value> = ag
        .iter()
        .filter(|a| {
            a["our_reason"]
                .as_str()
                .is_some_and(|s| s.starts_with("build_skipped"))
        })
        .collect();
    assert!(!skipped.is_empty(), "{ag:?}");
    for a in &ag {
        let rejected = a["our_reason"]
            .as_str()
            .is_some_and(|s| s.starts_with("static_reject"));
        if rejected {
            assert_eq!(a["our_correct"], false, "{a}");
        } else {
            assert!(a["our_correct"].is_null() && a["agree"].is_null(), "{a}");
        }
    }
}

/// KernelBench problems as native tasks on a machine without a GPU: every honest kernel of
/// `tests/kernels/kb_native/` (named by its level-1 problem) builds against the launcher
/// `kb-specs` derived for its problem, as a native compile-only verdict with that signature; the
/// same kernel for a problem whose launcher differs does not build (the shim declares the
/// problem's `launch`); an unknown problem is refused with exit code 2. `--model-new` writes a
/// native kernel's `ModelNew` wrapper, which builds as a torch-format candidate.
#[test]
fn kernelbench_problems_take_native_kernels_built_against_their_kb_specs_launcher() {
    let p = Project::new();
    let o = p.run(&["run", "kb-specs"]);
    if !have_python(&p, &o) {
        return;
    }
    let check = |task: &str, src: &std::path::Path| -> (i32, Value) {
        let o = p.run(&[
            "check",
            "--task",
            task,
            "--source",
            src.to_str().unwrap(),
            "--mode",
            "compile",
            "--json",
        ]);
        let v = serde_json::from_str(&stdout(&o)).unwrap_or(Value::Null);
        (o.status.code().unwrap(), v)
    };
    let dir = repo_root().join("tests/kernels/kb_native");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|f| f.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    assert!(files.len() >= 12, "{files:?}");
    for f in &files {
        let task = format!("kb/L1/{}", f.file_stem().unwrap().to_str().unwrap());
        let (_, v) = check(&task, f);
        assert_eq!(v["abi"], "native", "{task}: {v}");
        assert_eq!(v["compiled"], true, "{task}: {v}");
        assert_eq!(v["mode"], "compile-only", "{task}: {v}");
        let sig = v["signature"].as_str().unwrap();
        assert!(
            sig.starts_with("extern \"C\" void launch(const float* in0")
                && sig.ends_with("cudaStream_t stream)"),
            "{task}: {sig}"
        );
    }
    // Progress while it builds (plain lines: stderr is not a terminal here).
    let o = p.run(&[
        "check",
        "--task",
        "kb/L1/19_ReLU",
        "--source",
        dir.join("19_ReLU.cu").to_str().unwrap(),
        "--mode",
        "compile",
    ]);
    assert!(
        stderr(&o).contains("progress kb/L1/19_ReLU candidates built (nvcc): done, 1 items in "),
        "{}",
        stderr(&o)
    );
    // `--model-new` writes the kernel as a KernelBench `ModelNew` that builds it at import;
    // the torch-format path records that build and compiles it (split into a `torch/types.h`
    // unit and a binding unit).
    let relu = dir.join("19_ReLU.cu");
    let wrapper = p.path("relu_model_new.py");
    let o = p.run(&[
        "check",
        "--task",
        "kb/L1/19_ReLU",
        "--source",
        relu.to_str().unwrap(),
        "--mode",
        "compile",
        "--model-new",
        wrapper.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&wrapper).unwrap();
    assert!(
        text.contains("\n_EXT = load_inline(") && text.contains("class ModelNew(nn.Module)"),
        "{text}"
    );
    let (code, v) = check("kb/L1/19_ReLU", &wrapper);
    assert_eq!(
        (code, v["abi"].as_str(), v["compiled"].as_bool()),
        (0, Some("torch"), Some(true)),
        "{v}"
    );
    // It wraps one native candidate only.
    let o = p.run(&[
        "check",
        "--task",
        "kb/L1/19_ReLU",
        "--source",
        wrapper.to_str().unwrap(),
        "--mode",
        "compile",
        "--model-new",
        p.path("again.py").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--model-new"), "{}", stderr(&o));
    // ReLU's launcher (in0, out, batch_size, dim) is not the sum reduction's (4 sizes).
    let (_, v) = check("kb/L1/47_Sum_reduction_over_a_dimension", &relu);
    assert_eq!(v["compiled"], false, "{v}");
    assert_eq!(v["failure"], "compile_error", "{v}");
    let o = p.run(&[
        "check",
        "--task",
        "kb/L1/0_No_such_problem",
        "--source",
        relu.to_str().unwrap(),
        "--mode",
        "compile",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("unknown KernelBench problem"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_model_new_wrapper_passes_inputs_parameters_outputs_and_sizes_read_from_shapes_to_launch() {
    // A launcher with a tensor and a number input, a parameter (`fc.weight` in the reference's
    // state dict) and one output; the sizes come from the shapes the wrapper is called with,
    // not from the problem's values, and literal extents (kb-specs writes them as strings,
    // "1") stay literal.
    let abi = cudarl_cuda::native_abi::KbNative::from_row(
        r#"extern "C" void launch(const float* in0, float in1, const float* fc_weight, float* out, int64_t batch, int64_t dim, int64_t out_f, cudaStream_t stream)"#,
        &json!({
            "inputs": [
                {"name": "in0", "shape": [16, 32], "dims": ["batch", "dim"], "dtype": "f32"},
                {"name": "in1", "scalar": "0.5"}
            ],
            "params": [{"name": "fc_weight", "state_name": "fc.weight", "shape": [8, 32, 3],
                        "dims": ["out_f", "dim", "3"], "dtype": "f32"}],
            "outputs": [{"name": "out", "shape": [16, 8, 1], "dims": ["batch", "out_f", "1"], "dtype": "f32"}]
        })
        .to_string(),
        r#"{"batch": 16, "dim": 32, "out_f": 8}"#,
    )
    .unwrap();
    let source = "// the kernel, with \"quotes\" and {kernel} in it\nextern \"C\" void launch();\n";
    let text = abi.model_new("kb/L1/0_linear_scale", source, "A note.");
    assert!(text.starts_with("\"\"\"A note."), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model_new.py");
    std::fs::write(&file, &text).unwrap();
    // It passes the ModelNew allow-list, as `check` screens it.
    assert_eq!(screen(&file), "[]", "{text}");
    // The wrapper's own logic on the CPU, its load_inline build replaced by a recorder; the
    // build happens at import (the torch-format judge records import-time load_inline calls).
    let script = r#"
import importlib.util, json, sys
import torch
import torch.utils.cpp_extension as ce
class Recorder:
    def cudarl_run(self, t, s, z):
        self.got = (t, s, z)
        t[-1].fill_(7.0)
r = Recorder()
calls = []
def load_inline(**kw):
    calls.append({"name": kw["name"], "functions": kw["functions"]})
    return r
ce.load_inline = load_inline
spec = importlib.util.spec_from_file_location("m", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
assert len(calls) == 1 and calls[0]["functions"] == ["cudarl_run"], calls
net = m.ModelNew()
state = {k: list(v.shape) for k, v in net.state_dict().items()}
y = net(torch.ones(4, 32), 0.5)
t, s, z = r.got
print(json.dumps({"state": state, "sizes": z, "scalars": s, "shapes": [list(x.shape) for x in t],
                  "out": list(y.shape), "value": y[0, 0].item(), "kernel": m.KERNEL, "binding": m.BINDING,
                  "headers": m.HEADERS}))
"#;
    let Some(py) = common::python() else {
        eprintln!("SKIPPED: no Python with torch");
        return;
    };
    let o = Command::new(py)
        .args(["-c", script])
        .arg(&file)
        .output()
        .unwrap();
    if o.status.code() != Some(0) && std::env::var("CUDARL_REQUIRE_PYTHON").is_err() {
        eprintln!("SKIPPED: no Python with torch: {}", stderr(&o));
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{}\n{text}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["state"], json!({"fc.weight": [8, 32, 3]}));
    assert_eq!(
        v["sizes"],
        json!([4, 32, 8]),
        "batch from the input, out_f from the parameter"
    );
    assert_eq!(v["scalars"], json!([0.5]));
    assert_eq!(v["shapes"], json!([[4, 32], [8, 32, 3], [4, 8, 1]]));
    assert_eq!(
        (v["out"].clone(), v["value"].clone()),
        (json!([4, 8, 1]), json!(7.0))
    );
    assert_eq!(v["kernel"], source, "the kernel verbatim");
    let binding = v["binding"].as_str().unwrap();
    assert!(
        binding.contains("launch((const float*)cudarl_t[0].data_ptr(), (float)cudarl_s[0], (const float*)cudarl_t[1].data_ptr(), (float*)cudarl_t[2].data_ptr(), cudarl_z[0], cudarl_z[1], cudarl_z[2], at::cuda::getCurrentCUDAStream())"),
        "{binding}"
    );
    // Torch's headers come before the kernel, whose macros cannot break them.
    assert!(
        v["headers"]
            .as_str()
            .unwrap()
            .contains("#include <torch/extension.h>")
    );
}

/// A SakanaAI-style extension builds as a torch-free kernel unit and a host unit with the
/// precompiled torch header (built once into the store and reused by the next extension); the
/// module imports in Python with its binding; a source that does not compile ends with the
/// one-unit build's diagnostics. Real nvcc, GCC, torch's headers and Python.
#[test]
fn torch_extensions_build_as_kernel_and_host_units_with_one_precompiled_header() {
    use cudarl_cuda::pyworker::TorchEnv;
    use cudarl_cuda::torchfmt::TORCH_BUILD_TIMEOUT;
    let root = repo_root();
    let Some(nvcc) = cudarl_cuda::Nvcc::discover_or_skip(&root) else {
        return;
    };
    let mut py = match PyWorker::start(&root) {
        Ok(p) => p,
        Err(e) if std::env::var("CUDARL_REQUIRE_PYTHON").is_err() => {
            eprintln!("SKIPPED: no Python with torch: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let env = TorchEnv::query(&mut py).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = cudarl_store::Store::open(dir.path().join("store")).unwrap();
    let compiler = cudarl_cuda::Compiler {
        nvcc,
        arch: "sm_90".into(),
        timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
        store: Some(store.clone()),
    };
    let relu = r#"#include <torch/extension.h>
#define CHECK_INPUT(x) TORCH_CHECK(x.is_cuda(), #x " must be a CUDA tensor")
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
torch::Tensor forward(torch::Tensor x) {
    CHECK_INPUT(x);
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward, "ReLU (CUDA)"); }
"#;
    let build = |src: &str, module: &str| {
        let split = cudarl_cuda::torchsplit::split_extension(src);
        compiler
            .compile_torch_ext(src, split.as_ref(), module, &env, &[], TORCH_BUILD_TIMEOUT)
            .unwrap()
    };
    let out = build(relu, "cudarl_test_relu");
    assert!(out.compiled, "{}", out.log);
    assert_eq!(out.layout, "kernel-host", "{}", out.log);
    assert!(
        out.resources
            .iter()
            .any(|r| r.kernel.contains("relu_kernel")),
        "{:?}",
        out.resources
    );
    let pch: Vec<std::path::PathBuf> = walk(&store.root().join("derived/pch"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "gch"))
        .collect();
    assert_eq!(pch.len(), 1, "{pch:?}");
    let made = std::fs::metadata(&pch[0]).unwrap().modified().unwrap();
    // The module loads in Python with its binding.
    let so = dir.path().join("cudarl_test_relu.so");
    std::fs::copy(store.blob_path(out.so_hash.as_ref().unwrap()), &so).unwrap();
    let o = Command::new(python())
        .args([
            "-c",
            "import sys, torch; sys.path.insert(0, sys.argv[1]); import cudarl_test_relu as m; print(m.forward.__doc__)",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("forward(arg0: torch.Tensor) -> torch.Tensor")
            && stdout(&o).contains("ReLU (CUDA)"),
        "{}",
        stdout(&o)
    );
    // Another extension reuses the header.
    let out = build(
        &relu.replace("ReLU (CUDA)", "ReLU, again"),
        "cudarl_test_relu2",
    );
    assert!(out.compiled && out.layout == "kernel-host", "{}", out.log);
    assert_eq!(
        std::fs::metadata(&pch[0]).unwrap().modified().unwrap(),
        made
    );
    // A source that does not compile: the one-unit build's error, on the source's own line.
    let broken = relu.replace("return y;", "return undefined_name;");
    let out = build(&broken, "cudarl_test_broken");
    assert!(!out.compiled);
    assert_eq!(out.layout, "one-unit");
    assert!(
        out.diagnostics
            .iter()
            .any(|d| d.line == Some(12) && d.message.contains("undefined_name")),
        "{:?}",
        out.diagnostics
    );
}

fn walk(d: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
