//! Harness tests with the real nvcc (from `make setup`'s wheel, CUDARL_NVCC, CUDA_HOME or PATH).

use std::path::{Path, PathBuf};
use std::time::Duration;

use cudarl_cuda::static_check::Action;
use cudarl_cuda::{Compiler, Nvcc, Rules, check_compile_only, load_tasks};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn nvcc() -> Option<Nvcc> {
    Nvcc::discover_or_skip(&repo_root())
}

/// The bundled task `id` of `datasets/tasks`.
fn bundled_task(id: &str) -> cudarl_cuda::Task {
    bundled_tasks()
        .into_iter()
        .find(|t| t.spec.id == id)
        .unwrap()
}

/// The `vector_add` task's spec, from the bundled tasks.
fn vector_add() -> cudarl_cuda::TaskSpec {
    bundled_task("vector_add").spec
}

fn compiler(store: &cudarl_store::Store) -> Option<Compiler> {
    Some(Compiler {
        nvcc: nvcc()?,
        arch: "sm_90".into(),
        timeout: Duration::from_secs(60),
        store: Some(store.clone()),
    })
}

/// A store in a fresh temporary folder and the real-nvcc compiler caching into it; `None`
/// (the test skips) where no nvcc is found. The folder lives as long as the returned guard.
fn compiler_with_store() -> Option<(tempfile::TempDir, cudarl_store::Store, Compiler)> {
    let d = tempfile::tempdir().unwrap();
    let store = cudarl_store::Store::open(d.path()).unwrap();
    let c = compiler(&store)?;
    Some((d, store, c))
}

/// The bundled tasks of `datasets/tasks`.
fn bundled_tasks() -> Vec<cudarl_cuda::Task> {
    load_tasks(&repo_root().join("datasets/tasks")).unwrap()
}

/// A compiler whose "nvcc" is the shell `script` written into `dir` (with a real nvcc's version
/// string and an empty shared runtime to link against), limited to `timeout`, caching nothing.
fn stand_in_compiler(dir: &Path, script: &str, timeout: Duration) -> Compiler {
    use std::os::unix::fs::PermissionsExt;
    let fake = dir.join("nvcc");
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    Compiler {
        nvcc: Nvcc {
            path: fake,
            version: "13.0.88".into(),
            // The build links against the shared runtime, looked up before nvcc runs.
            lib_dirs: vec![fake_cudart(dir)],
        },
        arch: "sm_90".into(),
        timeout,
        store: None,
    }
}

/// Asserts that every `(rule id, source)` case trips its rule in `check`'s findings.
fn assert_each_trips(
    cases: &[(&str, String)],
    check: impl Fn(&str) -> Vec<cudarl_cuda::static_check::Finding>,
) {
    for (id, src) in cases {
        let f = check(src);
        assert!(
            f.iter().any(|x| &x.rule == id),
            "`{id}` did not trip on:\n{src}\nfindings: {f:?}"
        );
    }
}

#[test]
fn task_specs_load_and_are_consistent() {
    let tasks = bundled_tasks();
    let ids: Vec<&str> = tasks.iter().map(|t| t.spec.id.as_str()).collect();
    for want in [
        "vector_add",
        "scalar_multiply",
        "relu",
        "gelu",
        "axpy",
        "sum",
        "max",
        "row_sum",
        "row_max",
        "transpose",
        "matmul",
        "softmax",
        "layernorm",
        "bias_gelu",
        "matmul_bias_relu",
        "add_layernorm",
        "gelu_bf16",
        "softmax_f16",
        "matmul_f16",
    ] {
        assert!(ids.contains(&want), "missing family {want}: {ids:?}");
    }
    let by_id = |id: &str| &tasks.iter().find(|t| t.spec.id == id).unwrap().spec;
    // Every tier has families.
    for tier in 0..=3 {
        assert!(tasks.iter().any(|t| t.spec.tier == tier), "no tier {tier}");
    }
    let va = by_id("vector_add");
    assert_eq!(
        va.signature(),
        r#"extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream)"#
    );
    assert_eq!(
        by_id("row_sum").signature(),
        r#"extern "C" void launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream)"#
    );
    assert_eq!(
        by_id("axpy").signature(),
        r#"extern "C" void launch(const float* x, const float* y, float* out, float alpha, int64_t n, cudaStream_t stream)"#
    );
    // Half-precision families: typed pointers, the header in the shim, 2 bytes per element,
    // and per-task input ranges (f16 matmul keeps k v^2 within f16's 65504).
    let mh = by_id("matmul_f16");
    assert_eq!(
        mh.signature(),
        r#"extern "C" void launch(const __half* a, const __half* b, __half* out, int64_t m, int64_t n, int64_t k, cudaStream_t stream)"#
    );
    assert!(mh.shim().contains("#include <cuda_fp16.h>"));
    assert!(by_id("gelu_bf16").shim().contains("#include <cuda_bf16.h>"));
    assert!(!va.shim().contains("cuda_fp16"));
    assert_eq!(
        (0..4).map(|s| mh.input_scale(s)).collect::<Vec<_>>(),
        [1.0, 4.0, 0.01, 1.0]
    );
    assert_eq!(va.input_scale(1), 100.0);
    let big = &mh.train_shapes[2];
    assert!(big["k"] as f64 * 4.0 * 4.0 <= 65504.0);
    // matmul: a (m x k), b (k x n), out (m x n); 2mnk FLOPs.
    let mm = by_id("matmul");
    let s = std::collections::BTreeMap::from([
        ("m".to_string(), 2i64),
        ("n".to_string(), 3),
        ("k".to_string(), 5),
    ]);
    assert_eq!(mm.bytes_for(&s).unwrap(), 4 * (2 * 5 + 5 * 3 + 2 * 3));
    assert_eq!(mm.flops_for(&s).unwrap(), 2 * 2 * 3 * 5);
    // byte and FLOP counts by hand: vector_add reads a, b and writes out (3 * 4 bytes per element).
    let s = va.train_shapes[1].clone();
    assert_eq!(va.bytes_for(&s).unwrap(), 12 * 1_048_576);
    assert_eq!(va.flops_for(&s).unwrap(), 1_048_576);
    let rs = by_id("row_sum");
    let s = rs.holdout_shapes[1].clone();
    assert_eq!(rs.bytes_for(&s).unwrap(), 4 * 1000 * 999 + 4 * 1000);
    for t in &tasks {
        assert!(
            t.naive_source()
                .unwrap()
                .contains("extern \"C\" void launch(")
        );
        assert!(!t.optimized_sources().unwrap().is_empty());
        assert!(
            t.spec
                .holdout_shapes
                .iter()
                .all(|h| !t.spec.train_shapes.contains(h)),
            "hold-out shapes are unseen"
        );
    }
}

#[test]
fn bad_task_specs_are_named() {
    let d = tempfile::tempdir().unwrap();
    let src =
        std::fs::read_to_string(repo_root().join("datasets/tasks/vector_add/task.toml")).unwrap();
    // The error loading the spec with `bad` replaced by `worse`.
    let load_error = |bad: &str, worse: &str| {
        std::fs::write(d.path().join("task.toml"), src.replace(bad, worse)).unwrap();
        cudarl_cuda::TaskSpec::load(d.path())
            .unwrap_err()
            .to_string()
    };
    let e = load_error("bytes = \"12*n\"", "bytes = \"12*m\"");
    assert!(
        e.contains("task.toml") && e.contains("unknown size `m`"),
        "{e}"
    );
    // Unknown fields, dtypes, input scales and references (syntax, names, one per output) are
    // checked when the spec loads.
    for (bad, worse, want) in [
        ("tier = 0", "tier = 0\ncolour = 1", "unknown field `colour`"),
        (
            "dtype = \"f32\"",
            "dtype = \"f64\"",
            "dtype `f64` is not one of f32, f16, bf16",
        ),
        (
            "dtype = \"f32\"",
            "dtype = \"f32\"\ninput_scales = []",
            "input_scales: give one or more positive, finite values",
        ),
        (
            "dtype = \"f32\"",
            "dtype = \"f32\"\ninput_scales = [1.0, -2.0]",
            "input_scales: give one or more positive, finite values",
        ),
        (
            "out = \"a + b\"",
            "out = \"a + c\"",
            "reference.out: `c` is not an input or scalar argument",
        ),
        (
            "out = \"a + b\"",
            "out = \"a +\"",
            "reference.out: unexpected end of expression",
        ),
        (
            "out = \"a + b\"",
            "other = \"a\"",
            "reference: no expression for output `out`",
        ),
    ] {
        let e = load_error(bad, worse);
        assert!(e.contains(want), "{e}");
    }
}

/// Every static rule has a kernel that trips it, and the project's honest kernels trip no
/// rejecting rule. A rule added to the TOML without a case here fails this test.
#[test]
fn every_static_rule_trips_and_honest_kernels_pass() {
    let rules = Rules::builtin();
    let body = |extra: &str| {
        format!(
            "#include <cuda_runtime.h>\n#include <stdint.h>\n__global__ void k(const float* a, float* o, int64_t n) {{ int64_t i = threadIdx.x; if (i < n) o[i] = a[i]; }}\n\
             extern \"C\" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {{\n{extra}\n  k<<<1, 32, 0, stream>>>(a, out, n);\n}}\n"
        )
    };
    let cases: Vec<(&str, String)> = vec![
        ("process-spawn", body("  system(\"rm -rf /\");")),
        ("process-exit", body("  if (n == 0) exit(0);")),
        ("exit-reference", body("  void (*volatile stop)(int) = std::exit;")),
        ("file-io", body("  FILE* f = fopen(\"/tmp/ref.bin\", \"rb\");")),
        ("socket-io", body("  int s = socket(2, 1, 0);")),
        ("dynamic-loading", body("  void* h = dlopen(\"libtorch.so\", 1);")),
        ("environment", body("  const char* p = getenv(\"CUDARL_SEED\");")),
        ("timer-asm", "__global__ void t(long long* o) { long long c; asm volatile(\"mov.u64 %0, %%clock64;\" : \"=l\"(c)); *o = c; }".to_string()),
        ("timer-read", "__global__ void t(long long* o) { *o = clock64(); }".to_string()),
        ("device-state", body("  cudaDeviceReset();")),
        ("other-stream", body("  cudaStream_t s2; cudaStreamCreate(&s2);")),
        ("launch-without-stream", body("  k<<<(n + 255) / 256, 256>>>(a, out, n);")),
        ("sync-in-launcher", body("  cudaDeviceSynchronize();")),
        ("host-transfer", body("  cudaMemcpy(out, a, 4, cudaMemcpyDeviceToDevice);")),
        ("device-alloc", body("  float* tmp; cudaMalloc(&tmp, 4 * n);")),
        ("async-copy", body("  cudaMemsetAsync(out, 0, 4 * n, stream);")),
        ("static-state", body("  static bool done = false;")),
        ("inline-ptx", "__device__ int lane() { int l; asm(\"mov.u32 %0, %%laneid;\" : \"=r\"(l)); return l; }".to_string()),
        ("include", format!("#include <unistd.h>\n{}", body(""))),
    ];
    // Python (`ModelNew`) rules and the torch-format C++ rule.
    let py = |body: &str| {
        format!(
            "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n{body}\n\
             class ModelNew(nn.Module):\n    def forward(self, x):\n        return ext.f(x)\n"
        )
    };
    let py_cases: Vec<(&str, String)> = vec![
        ("py-forbidden-import", py("import time")),
        ("py-dynamic-code", py("f = eval('ext.f')")),
        ("py-torch-compile", py("g = torch.compile(lambda x: x)")),
        (
            "py-file-io",
            py("data = open('/tmp/expected.pt', 'rb').read()"),
        ),
        (
            "py-inherits-model",
            "class Model(nn.Module):\n    pass\nclass ModelNew(Model):\n    pass\n".to_string(),
        ),
        (
            "py-try-fallback",
            py("try:\n    ext = load_inline(name='e')\nexcept Exception:\n    ext = None"),
        ),
        ("py-stream-or-timer", py("s = torch.cuda.Stream()")),
        (
            "py-patch-torch",
            py("torch.backends.cudnn.benchmark = True"),
        ),
        ("py-torch-op", py("y = torch.matmul(a, b)")),
        (
            "py-profiler",
            py("torch.autograd.profiler._disable_profiler_legacy()"),
        ),
    ];
    let torch_cases: Vec<(&str, String)> = vec![
        (
            "torch-op-in-extension",
            "#include <torch/extension.h>\ntorch::Tensor forward(torch::Tensor a, torch::Tensor b) { return torch::matmul(a, b); }\n".to_string(),
        ),
        (
            "profiler-in-extension",
            "#include <torch/extension.h>\ntorch::Tensor forward(torch::Tensor a) { torch::autograd::profiler::disableProfiler(); return a; }\n".to_string(),
        ),
    ];
    assert_each_trips(&py_cases, |src| rules.check_python(src));
    assert_each_trips(&torch_cases, |src| rules.check(src, "torch"));
    // Python: mentions in comments and strings (the CUDA source) trip nothing, and neither does
    // a method named `compile` (`re.compile`).
    let quiet = py(
        "# import os; torch.cuda.Stream()\nsrc = '''exit(1); open(\"f\")'''\nr = re_mod.compile('x')",
    );
    assert!(
        rules.check_python(&quiet).is_empty(),
        "{:?}",
        rules.check_python(&quiet)
    );
    let mut ids: Vec<&str> = rules.ids();
    ids.push("include");
    for id in &ids {
        assert!(
            cases
                .iter()
                .chain(&py_cases)
                .chain(&torch_cases)
                .any(|(c, _)| c == id),
            "rule `{id}` has no tripping kernel in this test"
        );
    }
    assert_each_trips(&cases, |src| rules.check(src, "native"));
    // Mentions in comments and strings do not trip anything.
    let quiet = body(
        "  // system(\"x\"); fopen(...)\n  /* exit(1); clock64() */\n  const char* msg = \"socket( dlopen( getenv(\";",
    );
    assert!(
        rules
            .check(&quiet, "native")
            .iter()
            .all(|f| f.rule == "inline-ptx" || f.action == Action::Flag),
        "{:?}",
        rules.check(&quiet, "native")
    );
    assert!(
        rules.check(&quiet, "native").is_empty(),
        "{:?}",
        rules.check(&quiet, "native")
    );
    // Honest kernels: no findings at all.
    for t in bundled_tasks() {
        let mut srcs = vec![("naive".to_string(), t.naive_source().unwrap())];
        srcs.extend(t.optimized_sources().unwrap());
        for (name, s) in srcs {
            let f = rules.check(&s, "native");
            assert!(f.is_empty(), "{}/{name} tripped {f:?}", t.spec.id);
        }
    }
    // The finding names the line.
    let f = rules.check(&body("  system(\"x\");"), "native");
    assert_eq!(f[0].line, 5, "{f:?}");
}

#[test]
fn compile_success_resources_and_cache_hit_without_nvcc() {
    let Some((_d, _store, c)) = compiler_with_store() else {
        return;
    };
    let rs = &bundled_task("row_sum");
    let src = rs.optimized_sources().unwrap()[0].1.clone();
    let v = check_compile_only(&rs.spec, &src, &Rules::builtin(), &c).unwrap();
    assert!(v.compiled, "{v:?}");
    assert!(
        !v.executed && v.correct.is_none(),
        "compile-only never claims correctness"
    );
    assert_eq!(v.mode, "compile-only");
    assert!(!v.cache_hit);
    let k = v
        .resources
        .iter()
        .find(|r| r.kernel.contains("row_sum_shfl"))
        .expect("kernel resources");
    assert!(k.registers > 0 && k.registers < 255, "{k:?}");
    assert_eq!(k.shared_mem_bytes, 32 * 4, "partial[32] floats");
    assert_eq!(k.spill_store_bytes, 0);

    // A cache hit returns the same result and never runs nvcc: point the compiler at a
    // nonexistent nvcc with the same version.
    let mut c2 = c.clone();
    c2.nvcc.path = PathBuf::from("/nonexistent/nvcc");
    let t0 = std::time::Instant::now();
    let v2 = check_compile_only(&rs.spec, &src, &Rules::builtin(), &c2).unwrap();
    let hit_time = t0.elapsed();
    assert!(v2.cache_hit);
    assert_eq!(
        (v2.compiled, &v2.diagnostics, &v2.resources),
        (v.compiled, &v.diagnostics, &v.resources)
    );
    assert!(
        hit_time < Duration::from_millis(200),
        "cache hit took {hit_time:?}"
    );
    // A different arch is a different key: a miss, which needs nvcc.
    let mut c3 = c2.clone();
    c3.arch = "sm_80".into();
    assert!(
        c3.compile(&src, &rs.spec.shim(), &Rules::builtin())
            .is_err(),
        "a miss must try to run nvcc"
    );
}

#[test]
fn compile_errors_have_candidate_line_numbers() {
    let Some((_d, _store, c)) = compiler_with_store() else {
        return;
    };
    let va = &vector_add();
    let src = "#include <cuda_runtime.h>\n#include <stdint.h>\n\n__global__ void k(float* o) {\n    o[0] = undefined_thing;\n}\n";
    let v = check_compile_only(va, src, &Rules::builtin(), &c).unwrap();
    assert!(!v.compiled);
    assert_eq!(v.failure.as_deref(), Some("compile_error"));
    let e = v
        .diagnostics
        .iter()
        .find(|d| d.severity == "error")
        .expect("an error");
    assert_eq!(
        (e.file.as_deref(), e.line),
        (Some("kernel.cu"), Some(5)),
        "{e:?}"
    );
    assert!(e.message.contains("undefined_thing"), "{e:?}");

    // A candidate without `launch` compiles but must not link into a usable shared object.
    let no_launch = "#include <cuda_runtime.h>\n__global__ void k(float* o) { o[0] = 1.0f; }\n";
    let v = check_compile_only(va, no_launch, &Rules::builtin(), &c).unwrap();
    assert!(!v.compiled, "{v:?}");
    assert!(
        v.diagnostics
            .iter()
            .any(|d| d.tool == "ld" && d.message.contains("launch")),
        "{:?}",
        v.diagnostics
    );

    // Wrong signature: launch with int n instead of int64_t compiles only if the types match.
    let wrong = "#include <cuda_runtime.h>\nextern \"C\" void launch(const float* a, const float* b, float* out, cudaStream_t stream) {}\n";
    let v = check_compile_only(va, wrong, &Rules::builtin(), &c).unwrap();
    assert!(
        !v.compiled,
        "a launcher with another signature must not compile"
    );
    // ...and the error is the candidate's: at its `launch`, with the declaration the task
    // expects, once (not nvcc's errors on the lines of the shim the file does not show).
    let errors: Vec<_> = v
        .diagnostics
        .iter()
        .filter(|d| d.severity == "error")
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        (errors[0].file.as_deref(), errors[0].line),
        (Some("kernel.cu"), Some(2)),
        "{errors:?}"
    );
    assert!(
        errors[0]
            .message
            .contains(&format!("declare it exactly as `{}`", va.signature())),
        "{errors:?}"
    );

    // A truncated candidate (its last function never closed) leaves the shim inside that
    // function: nvcc's errors there are not a signature mismatch and stay as nvcc said them.
    let truncated = "#include <cuda_runtime.h>\n#include <stdint.h>\nextern \"C\" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {\n    (void)a;\n";
    let v = check_compile_only(va, truncated, &Rules::builtin(), &c).unwrap();
    assert!(!v.compiled);
    assert!(
        v.diagnostics
            .iter()
            .all(|d| !d.message.contains("launcher signature")),
        "{:?}",
        v.diagnostics
    );

    // Static rejects never reach nvcc.
    let evil = "#include <cstdlib>\nextern \"C\" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t s) { system(\"id\"); }\n";
    let v = check_compile_only(va, evil, &Rules::builtin(), &c).unwrap();
    assert_eq!(v.failure.as_deref(), Some("static_reject"));
    assert!(v.diagnostics.is_empty() && !v.compiled);
}

#[test]
fn compile_time_limit_is_cpu_time_so_a_build_that_waits_for_a_core_is_not_stopped() {
    // A stand-in "nvcc" that spends twice its 1 s limit waiting without computing (as a build
    // does on a loaded machine) and then fails: a compile error, not a timeout. A build that
    // computes past its limit is killed by RLIMIT_CPU (the real-nvcc test below).
    let d = tempfile::tempdir().unwrap();
    let c = stand_in_compiler(
        d.path(),
        "#!/bin/sh\nsleep 2\necho 'kernel.cu(1): error: stand-in'\nexit 1\n",
        Duration::from_secs(1),
    );
    let t0 = std::time::Instant::now();
    let out = c.compile("int x;", "", &Rules::builtin()).unwrap();
    assert!(t0.elapsed() >= Duration::from_secs(2), "ran to its end");
    assert!(!out.timed_out && !out.compiled, "{:?}", out.diagnostics);
}

#[test]
fn a_build_over_its_cpu_time_limit_is_killed_reported_and_not_cached() {
    // A preprocessor bomb (10^8 tokens): the host compiler's preprocessor computes until
    // RLIMIT_CPU stops it.
    let Some((_d, _store, mut c)) = compiler_with_store() else {
        return;
    };
    c.timeout = Duration::from_secs(1);
    let bomb = "#define A(x) x x x x x x x x x x\n#define B(x) A(A(A(A(x))))\n\
                #define C(x) B(B(x))\n__global__ void k(int* o) { int s = 0; C(s += 1;) o[0] = s; }\n";
    for attempt in 0..2 {
        let t0 = std::time::Instant::now();
        let out = c.compile(bomb, "", &Rules::builtin()).unwrap();
        assert!(out.timed_out && !out.compiled, "{}", out.log);
        assert!(!out.cache_hit, "attempt {attempt}: a timeout is not cached");
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "stopped by the CPU limit, not the wall backstop"
        );
        assert!(
            out.diagnostics
                .iter()
                .any(|d| d.message.contains("1 CPU seconds")),
            "{:?}",
            out.diagnostics
        );
    }
    // A kernel that builds is cached as before.
    let ok = "__global__ void k(int* o) { o[0] = 1; }";
    assert!(!c.compile(ok, "", &Rules::builtin()).unwrap().cache_hit);
    assert!(c.compile(ok, "", &Rules::builtin()).unwrap().cache_hit);
}

/// A folder holding an empty `libcudart.so` for a stand-in nvcc's build to link against.
fn fake_cudart(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::write(dir.join("libcudart.so"), b"").unwrap();
    dir.to_path_buf()
}

#[test]
fn compile_time_limit_kills_the_compiler() {
    // A stand-in "nvcc" that hangs, with a real nvcc's version string: the harness must kill
    // it (and its process group) at the limit and report a timeout.
    let d = tempfile::tempdir().unwrap();
    let c = stand_in_compiler(
        d.path(),
        "#!/bin/sh\nsleep 30 &\nsleep 30\n",
        Duration::from_millis(500),
    );
    let t0 = std::time::Instant::now();
    let out = c.compile("int x;", "", &Rules::builtin()).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "killed promptly");
    assert!(out.timed_out && !out.compiled);
    assert!(
        out.diagnostics
            .iter()
            .any(|d| d.message.contains("time limit")),
        "{:?}",
        out.diagnostics
    );
}

/// Every reward hack of `tests/kernels/hacks/` that is decidable without a GPU (`cpu = true` in
/// its `expected.toml`) gets its verdict from the compile-only path, caught by the check it
/// names: the source rules, the preprocessed text, the object or the PTX. No payload runs: the
/// cases that call `system` or `execl` would create files if they ran.
#[test]
fn hacks_decidable_on_the_cpu_get_their_verdicts() {
    let Some((_d, _store, c)) = compiler_with_store() else {
        return;
    };
    let hacks = repo_root().join("tests/kernels/hacks");
    let expected: toml::Table =
        toml::from_str(&std::fs::read_to_string(hacks.join("expected.toml")).unwrap()).unwrap();
    let files: Vec<String> = std::fs::read_dir(&hacks)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".cu")
                .map(String::from)
        })
        .collect();
    for f in &files {
        assert!(expected.contains_key(f), "{f}.cu has no expected verdict");
    }
    assert!(expected.len() >= 40, "{} cases", expected.len());
    let va = &vector_add();
    let rules = Rules::builtin();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (name, e) in &expected {
        if e.get("cpu").and_then(|v| v.as_bool()) != Some(true) {
            continue;
        }
        let src = std::fs::read_to_string(hacks.join(format!("{name}.cu"))).unwrap();
        let v = check_compile_only(va, &src, &rules, &c).unwrap();
        let want = e["failure"].as_str().unwrap();
        let rule = e.get("rule").and_then(|r| r.as_str());
        let caught = rule.is_none_or(|rule| {
            v.static_flags
                .iter()
                .any(|f| f.rule == rule && f.action == Action::Reject)
        });
        if v.failure.as_deref() != Some(want) || v.compiled || !caught {
            wrong.push(format!(
                "{name}: want {want} by {rule:?}, got {:?} ({:?}) flags {:?}",
                v.failure,
                v.failure_detail,
                v.static_flags.iter().map(|f| &f.rule).collect::<Vec<_>>()
            ));
        }
        checked += 1;
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(checked >= 30, "{checked} CPU cases");
    // The absolute-path include fails to open inside the compiler sandbox: nothing of the file
    // reaches the diagnostics.
    let src = std::fs::read_to_string(hacks.join("absolute_include_echo.cu")).unwrap();
    let v = check_compile_only(va, &src, &rules, &c).unwrap();
    let text = serde_json::to_string(&v).unwrap();
    assert!(!text.contains("root:x:0"), "{text}");
}

/// Honest kernels written in unusual ways still compile and pass every check: grid-stride loops
/// with `__ldg`, cooperative groups, templates and macros, dynamic shared memory, two kernels
/// in sequence on the stream, C++14 digit separators, printf in the launcher.
#[test]
fn unusual_honest_kernels_pass_the_checks() {
    let Some((_d, _store, c)) = compiler_with_store() else {
        return;
    };
    let dir = repo_root().join("tests/kernels/honest");
    let tasks = bundled_tasks();
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let p = e.path();
        let Some(name) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".cu"))
        else {
            continue;
        };
        let task = name.split("__").next().unwrap();
        let spec = &tasks.iter().find(|t| t.spec.id == task).unwrap().spec;
        let src = std::fs::read_to_string(&p).unwrap();
        let v = check_compile_only(spec, &src, &Rules::builtin(), &c).unwrap();
        assert!(v.compiled && v.failure.is_none(), "{name}: {v:?}");
        assert!(
            v.static_flags.iter().all(|f| f.action == Action::Flag),
            "{name}: {:?}",
            v.static_flags
        );
        n += 1;
    }
    assert!(n >= 7, "{n} honest kernels");
}

#[test]
fn own_kernels_are_read_from_the_built_object() {
    let Some((_d, store, c)) = compiler_with_store() else {
        return;
    };
    let rs = &bundled_task("row_sum");
    // A templated kernel in a namespace and one named by a macro, launched from host code so
    // their stubs are emitted.
    let extra = r#"
namespace ns {
template <typename T> __global__ void scale_kernel(T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * (T)2;
}
}
#define KERNEL(name) __global__ void name(float* y) { y[threadIdx.x] = 0.0f; }
KERNEL(zero_from_macro)
void extra_launches(float* y, int n, cudaStream_t s) {
    ns::scale_kernel<float><<<(n + 255) / 256, 256, 0, s>>>(y, n);
    zero_from_macro<<<1, 32, 0, s>>>(y);
}
"#;
    let src = format!("{}\n{extra}", rs.optimized_sources().unwrap()[0].1);
    let out = c.compile(&src, &rs.spec.shim(), &Rules::builtin()).unwrap();
    assert!(out.compiled, "{}", out.log);
    let so = store.blob_path(&out.so_hash.unwrap());
    let own = cudarl_cuda::standin::own_kernels(&std::fs::read(so).unwrap()).unwrap();
    for k in ["ns::scale_kernel", "zero_from_macro"] {
        assert!(own.contains(k), "{k} not in {own:?}");
    }
    assert!(
        own.iter().any(|k| k.contains("row_sum")),
        "the task's kernel: {own:?}"
    );
}

#[test]
fn the_scheduler_tests_each_build_while_later_ones_still_compile() {
    use cudarl_cuda::schedule::{GpuJob, Scheduler, Step};
    use cudarl_cuda::verdict::FullOptions;
    use cudarl_cuda::worker::WorkerPool;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let Some((_d, _store, c)) = compiler_with_store() else {
        return;
    };
    let va = &bundled_task("vector_add");
    let naive = va.naive_source().unwrap();
    let sources: Vec<String> = (0..4)
        .map(|i| format!("{naive}\n// variant {i}\n"))
        .collect();
    let (rules, baselines) = (Rules::builtin(), Default::default());
    let sched = Scheduler::new(&rules, &c, &baselines);
    let opts = FullOptions {
        public_seeds: vec![0],
        hidden_seeds: vec![],
        wall: Duration::from_secs(30),
        bench: false,
        timing: cudarl_cuda::gpu::BenchSpec::default(),
        time_naive: false,
        profile: false,
    };
    // The last build is slow: the testers must not wait for it to start the others.
    let compile = |i: usize| -> Result<Step<'_>, String> {
        let v = check_compile_only(&va.spec, &sources[i], &rules, &c).map_err(|e| e.to_string())?;
        assert!(v.compiled, "{v:?}");
        if i == 3 {
            std::thread::sleep(Duration::from_secs(3));
        }
        Ok(Step::Gpu(GpuJob {
            spec: &va.spec,
            code: &sources[i],
            naive: None,
            opts: opts.clone(),
        }))
    };
    let done = AtomicUsize::new(0);
    let mut testers: Vec<WorkerPool> = (0..2)
        .map(|_| {
            let worker = repo_root().join("tests/workers/answers_at_once.sh");
            WorkerPool::new("sh".into(), vec![worker.display().to_string()])
        })
        .collect();
    let verdicts = sched
        .run(&mut testers, sources.len(), &[], compile, |_, v| {
            assert_eq!(v.mode, "full", "{v:?}");
            done.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .map_err(|e| e.into_caller(|h| h.to_string()))
        .unwrap();
    let mut ids: Vec<usize> = verdicts.iter().map(|(i, _)| *i).collect();
    ids.sort();
    assert_eq!(ids, vec![0, 1, 2, 3], "one verdict per candidate");
    assert_eq!(
        done.load(Ordering::Relaxed),
        4,
        "done is called per GPU verdict"
    );
    let marks = sched.times.snapshot();
    let (first_gpu, compiled) = (marks.first_gpu.unwrap(), marks.compiled.unwrap());
    assert!(
        compiled.duration_since(first_gpu) > Duration::from_secs(1),
        "the first GPU job started while the slow build still ran"
    );

    // Without testers, final verdicts come back and a compiled candidate for the GPU is the
    // harness's error.
    let none = sched
        .run(
            &mut [],
            2,
            &[],
            |i| -> Result<Step<'_>, String> {
                Ok(if i == 0 {
                    Step::Skip
                } else {
                    Step::Done(cudarl_cuda::Verdict::blank("t", "native", &c))
                })
            },
            |_, _| Ok(()),
        )
        .map_err(|e| e.into_caller(|h| h.to_string()))
        .unwrap();
    assert_eq!(none.len(), 1);
    let err = sched
        .run(
            &mut [],
            1,
            &[],
            |_| -> Result<Step<'_>, String> {
                Ok(Step::Gpu(GpuJob {
                    spec: &va.spec,
                    code: &sources[0],
                    naive: None,
                    opts: opts.clone(),
                }))
            },
            |_, _| Ok(()),
        )
        .map_err(|e| e.into_caller(|h| h.to_string()))
        .unwrap_err();
    assert!(err.contains("no GPU tester"), "{err}");
}

#[test]
fn a_device_helper_function_builds_and_a_pointer_to_exit_does_not() {
    // nvcc's host code for a non-inline `__device__` function is a stub calling `exit`, so the
    // object imports it: an honest kernel with such a helper must still pass the inspection.
    // A candidate that names `exit` itself (here a pointer to it, which no `exit(` pattern sees)
    // is refused by the source rule on its own lines.
    let Some((_d, _store, c)) = compiler_with_store() else {
        return;
    };
    let va = &vector_add();
    let launcher = "extern \"C\" void launch(const float* a, const float* b, float* out, int64_t n, \
                    cudaStream_t stream) {\n  k<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);\n}\n";
    let honest = format!(
        "#include <cuda_runtime.h>\n#include <stdint.h>\n__device__ float add(float x, float y) {{ return x + y; }}\n\
         __global__ void k(const float* a, const float* b, float* o, int64_t n) {{\n\
         int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;\n  if (i < n) o[i] = add(a[i], b[i]);\n}}\n{launcher}"
    );
    let v = check_compile_only(va, &honest, &Rules::builtin(), &c).unwrap();
    assert!(v.compiled && v.failure.is_none(), "{v:?}");
    let hostile = honest.replace(
        "k<<<",
        "void (*volatile stop)(int) = exit;\n  if (n < 0) stop(0);\n  k<<<",
    );
    let v = check_compile_only(va, &hostile, &Rules::builtin(), &c).unwrap();
    assert_eq!(v.failure.as_deref(), Some("static_reject"), "{v:?}");
    assert!(
        v.failure_detail
            .as_deref()
            .unwrap_or("")
            .starts_with("exit-reference"),
        "{v:?}"
    );
}

/// The shim appended to a candidate is out of reach of the candidate's macros: with
/// `cudaGetLastError()` defined away and `cudarl_entry` renamed by `#define`, the built object
/// still defines `cudarl_entry` and calls the runtime's `cudaGetLastError`.
#[test]
fn the_shim_is_out_of_reach_of_the_candidates_macros() {
    use object::{Object, ObjectSymbol};
    let Some((_d, store, c)) = compiler_with_store() else {
        return;
    };
    let va = &vector_add();
    let hijack = std::fs::read_to_string(
        repo_root().join("tests/kernels/hacks/shim_macro_hijack.cu"),
    )
    .unwrap()
    .replace(
        "#define cudaGetLastError() cudaSuccess",
        "#define cudaGetLastError() cudaSuccess\n#define cudarl_entry cudarl_entry_elsewhere",
    );
    assert!(hijack.contains("#define cudarl_entry"));
    let v = check_compile_only(va, &hijack, &Rules::builtin(), &c).unwrap();
    assert!(v.compiled && v.failure.is_none(), "{v:?}");
    let so = std::fs::read(store.blob_path(&v.so_hash.expect("built"))).unwrap();
    let file = object::File::parse(&*so).unwrap();
    let names = |undefined: bool| -> Vec<String> {
        file.dynamic_symbols()
            .filter(|s| s.is_undefined() == undefined)
            .filter_map(|s| {
                s.name()
                    .ok()
                    .map(|n| n.split('@').next().unwrap().to_string())
            })
            .collect()
    };
    assert!(
        names(false).iter().any(|n| n == "cudarl_entry"),
        "{:?}",
        names(false)
    );
    assert!(
        !names(false).iter().any(|n| n == "cudarl_entry_elsewhere"),
        "{:?}",
        names(false)
    );
    assert!(
        names(true).iter().any(|n| n == "cudaGetLastError"),
        "{:?}",
        names(true)
    );
}

/// A vector-add candidate whose launcher loads the address `target` with a `lea` right after a
/// marker (`movabs rdx, 0x1122334455667788`), beside the assembly `section` (which defines
/// `target`'s label).
fn lea_candidate(section: &str, target: &str) -> String {
    format!(
        r#"#include <cuda_runtime.h>
#include <stdint.h>
__global__ void add(const float* a, const float* b, float* out, int64_t n) {{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}}
asm("{section}");
extern "C" void launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {{
    long r;
    asm volatile("movabsq $0x1122334455667788, %%rdx\n\tleaq {target}(%%rip), %%rax" : "=a"(r) : : "rdx");
    (void)r;
    add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}}
"#
    )
}

/// The library `src` built into `store` (it must compile).
fn stored_library(
    (store, c): (&cudarl_store::Store, &Compiler),
    task: &cudarl_cuda::TaskSpec,
    src: &str,
) -> Vec<u8> {
    let v = check_compile_only(task, src, &Rules::builtin(), c).unwrap();
    assert!(v.compiled, "{:?} {:?}", v.failure_detail, v.static_flags);
    std::fs::read(store.blob_path(&v.so_hash.expect("a stored library"))).unwrap()
}

/// The displacement of the `lea` after [`lea_candidate`]'s marker in a linked library.
fn lea_displacement(library: &[u8]) -> u32 {
    let marker = [0x48, 0xba, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11];
    let at = library
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("the marker")
        + marker.len();
    assert_eq!(
        &library[at..at + 3],
        &[0x48, 0x8d, 0x05],
        "lea rax, [rip + disp32]"
    );
    u32::from_le_bytes(library[at + 3..at + 7].try_into().unwrap())
}

/// The bytes of a `syscall` that only the link writes: a `lea` to a label in another `.text.*`
/// section holds zeros in the object (its relocation field), and its displacement after the
/// link is the layout's, which the candidate steers with padding before the label. A first
/// build reads where the link put the label; a second, padded so the displacement's low bytes
/// are `0f 05`, is refused by the scan of the linked library (`object-instruction`), while the
/// object alone shows nothing. Linking again between padding objects does not move the label
/// against the `lea`: both are the candidate's.
#[test]
fn a_syscall_encoding_the_link_writes_is_refused() {
    let Some((_d, store, c)) = compiler_with_store() else {
        return;
    };
    let va = vector_add();
    let rules = Rules::builtin();
    let source = |pad: u32| {
        let section = format!(
            r#".section .text.far,\"ax\",@progbits\n.skip {pad}\nfar_label:\n\tret\n.text\n"#
        );
        lea_candidate(&section, "far_label")
    };
    let d0 = lea_displacement(&stored_library((&store, &c), &va, &source(0)));
    let pad = 0x050fu32.wrapping_sub(d0) & 0xffff;
    let v = check_compile_only(&va, &source(pad), &rules, &c).unwrap();
    let flag = v
        .static_flags
        .iter()
        .find(|f| f.rule == "object-instruction")
        .unwrap_or_else(|| panic!("not refused: {:?} {:?}", v.failure, v.static_flags));
    assert!(flag.message.contains("linked library"), "{}", flag.message);
    assert!(!v.compiled);
    assert_eq!(v.failure.as_deref(), Some("static_reject"));
}

/// The same bytes written by a layout accident: the `lea` reads a table in `.rodata`, another
/// output section, so the link's displacement is an accident of where the linker put the two
/// (an honest naive kernel met it on a GPU host,
/// `benchmarks/results/main_job_pooling_h100_2026-12-07.json`). The build is linked again
/// between padding objects, which move the code against `.rodata`; that library holds no
/// refused encoding and is the one stored.
#[test]
fn a_syscall_encoding_a_layout_accident_writes_is_linked_away() {
    let Some((_d, store, c)) = compiler_with_store() else {
        return;
    };
    let va = vector_add();
    let section = r".section .rodata\n.p2align 6\nlookup_table:\n.skip 70000\n.text\n";
    // The stored library of the build reading the table at `offset`.
    let library = |offset: u32| {
        let src = lea_candidate(section, &format!("lookup_table+{offset}"));
        stored_library((&store, &c), &va, &src)
    };
    let d0 = lea_displacement(&library(0));
    // The offset into the table that makes the first link's displacement end in `0f 05`.
    let offset = 0x050fu32.wrapping_sub(d0) & 0xffff;
    let bytes = library(offset);
    assert_ne!(
        lea_displacement(&bytes) & 0xffff,
        0x050f,
        "the stored library is the relinked one"
    );
    assert_eq!(
        cudarl_cuda::inspect::linked(&bytes).unwrap(),
        vec![],
        "the stored library holds no refused encoding"
    );
}
