//! The Python worker (`python/cudarl_worker.py`) as a real process on CPU torch: protocol,
//! native signatures on the meta device, and its error paths (a reference that raises, a
//! problem that does not run, a request it does not know), after each of which it goes on.

use std::path::PathBuf;

use cudarl_cuda::pyworker::PyWorker;
use cudarl_stages::kb_specs::native_signature;
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn worker() -> Option<PyWorker> {
    match PyWorker::start(&root()) {
        Ok(w) => Some(w),
        Err(e) if std::env::var("CUDARL_REQUIRE_PYTHON").is_err() => {
            eprintln!("SKIPPED: no Python with torch: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

const RELU: &str = r#"
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)

batch_size = 4096
dim = 393216

def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]

def get_init_inputs():
    return []
"#;

const LINEAR: &str = r#"
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
    def forward(self, x):
        return torch.relu(self.fc(x)).cuda()

batch = 128
in_features = 1024
out_features = 512

def get_inputs():
    return [torch.randn(batch, in_features).cuda()]

def get_init_inputs():
    return [in_features, out_features]
"#;

#[test]
fn signatures_from_the_meta_device_and_error_paths() {
    let Some(mut w) = worker() else { return };
    assert_eq!(w.hello["hello"], Value::Bool(true));
    assert!(
        w.hello["torch"].as_str().unwrap().starts_with("2."),
        "{}",
        w.hello
    );

    // Full KernelBench sizes (4096 x 393216 floats = 6 GiB) cost nothing on the meta device.
    let a = w
        .call(&json!({"op": "signature", "problem_id": "relu", "code": RELU}))
        .unwrap();
    assert_eq!(a["ok"], Value::Bool(true), "{a}");
    assert_eq!(a["inputs"][0]["shape"], json!([4096, 393216]));
    assert_eq!(a["inputs"][0]["dims"], json!(["batch_size", "dim"]));
    assert_eq!(a["outputs"][0]["dtype"], "f32");
    assert_eq!(
        native_signature(&a).unwrap(),
        r#"extern "C" void launch(const float* in0, float* out, int64_t batch_size, int64_t dim, cudaStream_t stream)"#
    );

    // Parameters come from the state dict, `.cuda()` is harmless, init inputs are used.
    let a = w
        .call(&json!({"op": "signature", "problem_id": "linear", "code": LINEAR}))
        .unwrap();
    assert_eq!(a["ok"], Value::Bool(true), "{a}");
    assert_eq!(a["params"][0]["name"], "fc_weight");
    assert_eq!(a["params"][0]["shape"], json!([512, 1024]));
    assert_eq!(a["outputs"][0]["shape"], json!([128, 512]));
    assert_eq!(
        native_signature(&a).unwrap(),
        r#"extern "C" void launch(const float* in0, const float* fc_weight, const float* fc_bias, float* out, int64_t batch, int64_t in_features, int64_t out_features, cudaStream_t stream)"#
    );

    // A reference that raises: an answer with the error and the problem's line; the worker goes on.
    let bad = RELU.replace("return torch.relu(x)", "raise ValueError('boom')");
    let a = w
        .call(&json!({"op": "signature", "problem_id": "bad", "code": bad}))
        .unwrap();
    assert_eq!(a["ok"], Value::Bool(false));
    let e = a["error"].as_str().unwrap();
    assert!(
        e.contains("ValueError: boom") && e.contains("(line 9)"),
        "{e}"
    );
    let a = w
        .call(&json!({"op": "raise", "message": "on purpose"}))
        .unwrap();
    assert_eq!(a["error"], "RuntimeError: on purpose");
    let a = w.call(&json!({"op": "nope"})).unwrap();
    assert!(a["error"].as_str().unwrap().contains("unknown op"), "{a}");
    // A syntax error in the problem.
    let a = w
        .call(&json!({"op": "signature", "problem_id": "syn", "code": "def ("}))
        .unwrap();
    assert!(
        a["error"].as_str().unwrap().starts_with("SyntaxError"),
        "{a}"
    );
    // Non-tensor outputs are excluded with a reason, not an error.
    let tup = RELU.replace("return torch.relu(x)", "return 'text'");
    let a = w
        .call(&json!({"op": "signature", "problem_id": "tup", "code": tup}))
        .unwrap();
    assert_eq!(a["ok"], Value::Bool(true));
    assert_eq!(a["excluded"], "output 0 is a str, not a tensor");
    // Still alive.
    let a = w
        .call(&json!({"op": "signature", "problem_id": "relu", "code": RELU}))
        .unwrap();
    assert_eq!(a["ok"], Value::Bool(true));
}

#[test]
fn a_missing_interpreter_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    // No python/cudarl_worker.py under this root: the worker cannot start, and says why.
    let e = match PyWorker::start(d.path()) {
        Ok(_) => panic!("started without a script"),
        Err(e) => e,
    };
    assert!(e.0.contains("did not start"), "{e}");
}

/// KernelBench's HingeLoss shape: `predictions` is `(batch_size, *input_shape)` and `targets`
/// `(batch_size,)` broadcast against its last dim, so neither constant can be halved alone and
/// one of them is a tuple element; the second planning pass halves them together.
#[test]
fn test_sizes_halve_tuple_elements_and_tied_constants_together() {
    let Some(mut w) = worker() else { return };
    let hinge = r#"
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))

batch_size = 32768
input_shape = (32768,)

def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.randint(0, 2, (batch_size,)).float() * 2 - 1]

def get_init_inputs():
    return []
"#;
    let a = w
        .call(
            &json!({"op": "plan", "problem_id": "hinge", "code": hinge, "dims": [],
                      "budget_bytes": 1 << 20}),
        )
        .unwrap();
    assert_eq!(a["ok"], Value::Bool(true), "{a}");
    assert_eq!(a["fits"], Value::Bool(true), "{a}");
    let s = &a["sizes"];
    assert_eq!(s["batch_size"], s["input_shape.0"], "{a}");
    assert!(s["batch_size"].as_i64().unwrap() <= 512, "{a}");
    assert_eq!(a["full_bytes"], json!(4_295_098_372i64));
    // The planned sizes apply to the tuple: testgen records tensors of the planned shape.
    let b = s["batch_size"].as_i64().unwrap();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("t.safetensors");
    let t = w
        .call(
            &json!({"op": "testgen", "problem_id": "hinge", "code": hinge, "sizes": s,
                      "seed": 0, "path": path.to_str().unwrap()}),
        )
        .unwrap();
    assert_eq!(t["ok"], Value::Bool(true), "{t}");
    assert_eq!(t["tensors"][0]["name"], "input.0");
    assert_eq!(t["tensors"][0]["shape"], json!([b, b]), "{t}");
}

/// Runs a check script of `tests/python` with the worker's Python and asserts it printed
/// `expect`; skipped (printed) where that Python has no torch and CUDARL_REQUIRE_PYTHON is unset.
fn python_check(script: &str, expect: &str) {
    let py = cudarl_cuda::pyworker::python(&root());
    let o = std::process::Command::new(&py)
        .arg(root().join("tests/python").join(script))
        .output()
        .expect("python starts");
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    if text.contains("No module named 'torch'") && std::env::var("CUDARL_REQUIRE_PYTHON").is_err() {
        eprintln!("SKIPPED: no Python with torch at {}", py.display());
        return;
    }
    assert!(o.status.success(), "{text}");
    assert!(text.contains(expect), "{text}");
}

/// A timed window of the torch-format judge is compared in full first, then at drawn positions
/// that catch an output wrong at one element in 10^5 (`tests/python/check_timed_positions.py`).
#[test]
fn timed_windows_are_compared_at_drawn_positions_that_catch_rare_wrong_elements() {
    python_check("check_timed_positions.py", "timed positions: ok");
}

/// The judge's float32 comparison and rms give the float64 check's verdicts, also at the
/// tolerance's edge and on non-finite elements (`tests/python/check_compare.py`).
#[test]
fn float32_comparison_gives_the_float64_checks_verdicts() {
    python_check("check_compare.py", "compare: ok");
}

/// The judge learns a runner's end as soon as the zygote reports it, not a read slice later
/// (`tests/python/check_zygote_exit.py`).
#[test]
fn a_runners_exit_is_known_as_soon_as_the_zygote_reports_it() {
    python_check("check_zygote_exit.py", "zygote exits: ok");
}

/// A spare runner whose start failed beside the previous candidate's run is replaced, not handed
/// to the next candidate (`tests/python/check_spare_runner.py`).
#[test]
fn a_spare_runner_that_started_badly_is_replaced() {
    python_check("check_spare_runner.py", "spare runner: ok");
}
