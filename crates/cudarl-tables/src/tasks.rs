//! `tasks` and `task_kernels` (stage `synth-tasks`): the task families, hand-written and
//! generated, and their reference kernels.

use serde::{Deserialize, Serialize};

/// One row of `tasks`: a task family.
///
/// | column | type | meaning |
/// |---|---|---|
/// | task_id | utf8 | e.g. `vector_add` |
/// | tier | int64 | 0..3 |
/// | description | utf8 | what `launch` computes |
/// | dtype | utf8 | `f32`, `f16` or `bf16` |
/// | signature | utf8 | the exact `extern "C"` launcher declaration |
/// | train_shapes, holdout_shapes | utf8 | JSON lists of size maps |
/// | atol, rtol | float64 | tolerance (see datasets/tasks/README.md) |
/// | bytes, flops | utf8 | formulas over the sizes (bytes moved, FLOP) |
/// | spec_json | utf8 | the full spec (what the harness runs) |
/// | problem | utf8 | the task as a KernelBench-style problem (a PyTorch `Model`, its constants, `get_inputs`): what every prompt shows |
/// | group | utf8 | the template instance of a generated family (its op structure), else the task id; splits are drawn per group |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRow {
    /// Task id.
    pub task_id: String,
    /// Tier 0..3.
    pub tier: i64,
    /// What `launch` computes.
    pub description: String,
    /// Element type.
    pub dtype: String,
    /// The launcher's declaration.
    pub signature: String,
    /// Train shapes (JSON).
    pub train_shapes: String,
    /// Hold-out shapes (JSON).
    pub holdout_shapes: String,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
    /// Bytes moved (formula).
    pub bytes: String,
    /// FLOP (formula).
    pub flops: String,
    /// The full spec (JSON).
    pub spec_json: String,
    /// The task as a KernelBench-style problem.
    pub problem: String,
    /// The split group.
    pub group: String,
}

crate::table_row!(TaskRow, "tasks");

/// One row of `task_kernels`: a reference kernel of a task family.
///
/// | column | type | meaning |
/// |---|---|---|
/// | kernel_id | utf8 | BLAKE3 hex of `code` |
/// | task_id | utf8 | task |
/// | role | utf8 | `naive` or `optimized` |
/// | file | utf8 | file in the task folder |
/// | code | utf8 | source (native ABI) |
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskKernelRow {
    /// BLAKE3 hex of `code`.
    pub kernel_id: String,
    /// Its task.
    pub task_id: String,
    /// `naive` or `optimized`.
    pub role: String,
    /// File in the task folder.
    pub file: String,
    /// The CUDA source.
    pub code: String,
}

crate::table_row!(TaskKernelRow, "task_kernels");
