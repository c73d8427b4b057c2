//! `kb_specs` and `coverage` (stage `kb-specs`): each KernelBench problem's native launcher,
//! derived by the Python worker from the problem's own module on torch's meta device, and the
//! share of each level that has one; `kb_tests` (stage `testgen`): the problems' recorded tests,
//! and `kb_testgen`: what `testgen` recorded per problem.

use serde::{Deserialize, Serialize};

/// One row of `kb_specs`: one KernelBench problem of the selected levels.
///
/// | column | type | meaning |
/// |---|---|---|
/// | problem_id | utf8 | e.g. `kb/L1/19_ReLU` |
/// | level | int64 | 1..4 |
/// | covered | bool | a native signature exists |
/// | excluded_reason | utf8, nullable | why not (non-tensor inputs or outputs, dtype, the problem fails on the meta device, a missing module) |
/// | signature | utf8, nullable | `extern "C" void launch(...)`: inputs, parameters (state dict), outputs, sizes, stream |
/// | sizes_json | utf8 | named integer sizes used by the buffers (module constants), e.g. `{"batch_size":16}` |
/// | buffers_json | utf8 | inputs, params, outputs: name, shape, dims (size names or literals), dtype |
/// | constants_json | utf8 | every module-level integer constant |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KbSpecRow {
    /// Problem id.
    pub problem_id: String,
    /// KernelBench level.
    pub level: i64,
    /// Whether a native signature exists.
    pub covered: bool,
    /// Why there is none.
    pub excluded_reason: Option<String>,
    /// The launcher's declaration.
    pub signature: Option<String>,
    /// Named sizes (JSON object of integers).
    pub sizes_json: String,
    /// Inputs, params and outputs (JSON).
    pub buffers_json: String,
    /// Module-level integer constants (JSON object).
    pub constants_json: String,
}

crate::table_row!(KbSpecRow, "kb_specs");

/// One row of `coverage`: per level, the problems, those with a native signature, their share
/// and the goal (80% of level 1, 60% of level 2; none for other levels).
///
/// | column | type | meaning |
/// |---|---|---|
/// | level | int64 | KernelBench level |
/// | problems | int64 | problems of the level |
/// | covered | int64 | of them with a native signature |
/// | fraction | float64 | covered / problems |
/// | goal | float64, nullable | the share `kb-specs` warns below |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoverageRow {
    /// KernelBench level.
    pub level: i64,
    /// Problems.
    pub problems: i64,
    /// Problems with a native signature.
    pub covered: i64,
    /// `covered / problems`.
    pub fraction: f64,
    /// The goal.
    pub goal: Option<f64>,
}

crate::table_row!(CoverageRow, "coverage");

/// One row of `kb_tests` (stage `testgen`): a recorded test of a KernelBench problem, its
/// tensors a safetensors blob in the store.
///
/// | column | type | meaning |
/// |---|---|---|
/// | problem_id | utf8 | e.g. `kb/L1/19_ReLU` |
/// | seed | int64 | the seed of `get_init_inputs`, `Model` and `get_inputs` (hidden seeds are BLAKE3 of the store's secret salt, as u63) |
/// | split | utf8 | `public` or `hidden` |
/// | dist | utf8 | input distribution: `native`, `signed`, `scaled`, `special` |
/// | sizes_json | utf8 | the size constants overridden for this test (`{}`: the problem's own) |
/// | blob | utf8 | BLAKE3 hex of the safetensors file in the store (`input.<i>`, `param.<name>`, `output.<i>`; metadata: scalars, init inputs) |
/// | tensors_json | utf8 | `[{"name", "shape", "dtype"}]` of the file |
/// | bytes | int64 | size of the safetensors file, bytes |
/// | device | utf8 | where the reference ran (`cpu` or `cuda`) |
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KbTestRow {
    /// Problem id.
    pub problem_id: String,
    /// The seed.
    pub seed: i64,
    /// `public` or `hidden`.
    pub split: String,
    /// Input distribution.
    pub dist: String,
    /// Size constants overridden (JSON object).
    pub sizes_json: String,
    /// BLAKE3 hex of the safetensors blob.
    pub blob: String,
    /// The file's tensors (JSON).
    pub tensors_json: String,
    /// The file's size, bytes.
    pub bytes: i64,
    /// `cpu` or `cuda`.
    pub device: String,
}

crate::table_row!(KbTestRow, "kb_tests");

/// One row of `kb_testgen`: a covered problem and what `testgen` recorded for it.
///
/// | column | type | meaning |
/// |---|---|---|
/// | problem_id | utf8 | the KernelBench problem |
/// | level | int64 | its level |
/// | status | utf8 | `recorded` or `excluded` |
/// | reason | utf8, nullable | why excluded (over budget, the reference raised, non-finite reference) |
/// | test_sizes_json | utf8 | size constants of the tests (halved from the problem's) |
/// | test_bytes, full_bytes | int64 | bytes of one test's tensors at test sizes / at the problem's sizes |
/// | rand_mix_note | utf8, nullable | why some or all seeds keep the native distribution |
/// | tests | int64 | recorded tests |
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KbTestgenRow {
    /// The problem.
    pub problem_id: String,
    /// Its level.
    pub level: i64,
    /// `recorded` or `excluded`.
    pub status: String,
    /// Why excluded.
    pub reason: Option<String>,
    /// Size constants of the tests, JSON.
    pub test_sizes_json: String,
    /// Bytes of one test's tensors at test sizes.
    pub test_bytes: i64,
    /// Bytes at the problem's own sizes.
    pub full_bytes: i64,
    /// Why some seeds keep the native distribution.
    pub rand_mix_note: Option<String>,
    /// Recorded tests.
    pub tests: i64,
}

crate::table_row!(KbTestgenRow, "kb_testgen");
