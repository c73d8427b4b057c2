//! Arrow schemas of the tables cudarl-pipe produces. Column names, types and nullability here
//! are the documented contract of the exported Parquet (read back by
//! `tests/python/check_export.py`).

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};

fn list_of(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", item, true)))
}

/// `problems`: one row per KernelBench problem.
///
/// | column | type | meaning |
/// |---|---|---|
/// | problem_id | utf8 | stable id `kb/L{level}/{name}`, e.g. `kb/L1/19_ReLU` |
/// | level | int64 | KernelBench level 1..4 |
/// | number | int64 | problem number within the level (file name prefix) |
/// | name | utf8 | file stem, e.g. `19_ReLU` |
/// | code | utf8 | the reference module (`class Model`, `get_inputs`, `get_init_inputs`) |
/// | code_hash | utf8 | BLAKE3 hex of `code` |
/// | op_features | `list<utf8>` | torch operations the reference uses, extracted statically (sorted, unique) |
/// | source_kind | utf8 | `bundled`, `checkout` or `hub` |
/// | source_repo, source_commit, source_path | utf8, nullable | provenance |
pub static PROBLEMS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("problem_id", DataType::Utf8, false),
        Field::new("level", DataType::Int64, false),
        Field::new("number", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("code", DataType::Utf8, false),
        Field::new("code_hash", DataType::Utf8, false),
        Field::new("op_features", list_of(DataType::Utf8), false),
        Field::new("source_kind", DataType::Utf8, false),
        Field::new("source_repo", DataType::Utf8, true),
        Field::new("source_commit", DataType::Utf8, true),
        Field::new("source_path", DataType::Utf8, true),
    ]))
});

/// NCU metrics of the SakanaAI archive that get typed columns: (archive metric name, column,
/// unit of the column). Byte-rate and time metrics are normalized to the column's unit
/// whatever SI prefix a row used; other units must match exactly or the column is null
/// (the raw value stays in `ncu_metrics`).
pub const NCU_TYPED: [(&str, &str, &str); 27] = [
    (
        "Executed Ipc Active",
        "ncu_executed_ipc_active",
        "inst/cycle",
    ),
    (
        "Executed Ipc Elapsed",
        "ncu_executed_ipc_elapsed",
        "inst/cycle",
    ),
    ("Issue Slots Busy", "ncu_issue_slots_busy_pct", "%"),
    ("Issued Ipc Active", "ncu_issued_ipc_active", "inst/cycle"),
    ("SM Busy", "ncu_sm_busy_pct", "%"),
    (
        "Memory Throughput",
        "ncu_memory_throughput_bytes_per_s",
        "byte/second",
    ),
    ("Mem Busy", "ncu_mem_busy_pct", "%"),
    ("Max Bandwidth", "ncu_max_bandwidth_pct", "%"),
    ("L1/TEX Hit Rate", "ncu_l1tex_hit_rate_pct", "%"),
    ("L2 Hit Rate", "ncu_l2_hit_rate_pct", "%"),
    ("Mem Pipes Busy", "ncu_mem_pipes_busy_pct", "%"),
    (
        "Warp Cycles Per Issued Instruction",
        "ncu_warp_cycles_per_issued_inst",
        "cycle",
    ),
    (
        "Warp Cycles Per Executed Instruction",
        "ncu_warp_cycles_per_executed_inst",
        "cycle",
    ),
    (
        "Avg. Active Threads Per Warp",
        "ncu_avg_active_threads_per_warp",
        "",
    ),
    (
        "Avg. Not Predicated Off Threads Per Warp",
        "ncu_avg_not_predicated_off_threads_per_warp",
        "",
    ),
    ("Max Active Clusters", "ncu_max_active_clusters", "cluster"),
    ("Max Cluster Size", "ncu_max_cluster_size", "block"),
    (
        "Overall GPU Occupancy",
        "ncu_overall_gpu_occupancy_pct",
        "%",
    ),
    ("Cluster Occupancy", "ncu_cluster_occupancy_pct", "%"),
    ("Block Limit SM", "ncu_block_limit_sm", "block"),
    (
        "Block Limit Registers",
        "ncu_block_limit_registers",
        "block",
    ),
    (
        "Block Limit Shared Mem",
        "ncu_block_limit_shared_mem",
        "block",
    ),
    ("Block Limit Warps", "ncu_block_limit_warps", "block"),
    (
        "Theoretical Active Warps per SM",
        "ncu_theoretical_active_warps_per_sm",
        "warp",
    ),
    (
        "Theoretical Occupancy",
        "ncu_theoretical_occupancy_pct",
        "%",
    ),
    ("Achieved Occupancy", "ncu_achieved_occupancy_pct", "%"),
    (
        "Achieved Active Warps Per SM",
        "ncu_achieved_active_warps_per_sm",
        "warp",
    ),
];

/// Struct type of one raw NCU metric (`ncu_metrics` items).
pub fn ncu_metric_struct() -> DataType {
    DataType::Struct(Fields::from(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("unit", DataType::Utf8, true),
        Field::new("avg_value", DataType::Float64, true),
        Field::new("variance", DataType::Float64, true),
        Field::new("n", DataType::Int64, true),
    ]))
}

/// Struct type of one NCU rule (`ncu_rules` items).
pub fn ncu_rule_struct() -> DataType {
    DataType::Struct(Fields::from(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("type", DataType::Utf8, true),
        Field::new("description", DataType::Utf8, true),
    ]))
}

/// `kernels`: one row per kernel from a public archive (SakanaAI, CUDA-L1), normalized.
///
/// | column | type | meaning |
/// |---|---|---|
/// | kernel_id | utf8 | BLAKE3 hex of `code` (the same code in two rows has the same id) |
/// | row_id | utf8 | unique row id: `sakana/{split}/{row}` or `cuda-l1/{gpu}/L{level}/{task}` |
/// | source | utf8 | `sakana` or `cuda-l1` |
/// | problem_id | utf8, nullable | join key to `problems` (`kb/L{level}/{name}`); null if unknown |
/// | level, task_id | int64 | KernelBench level and problem number |
/// | op_name | utf8, nullable | KernelBench file stem |
/// | kernel_name | utf8, nullable | archive's kernel name |
/// | abi | utf8 | `torch` for both archives (docs/architecture.md, "Kernel formats") |
/// | format | utf8 | `torch-extension` (`PYBIND11_MODULE` + `forward`) or `kernelbench-modelnew` |
/// | has_cuda_kernel | bool | the code defines a `__global__` function |
/// | code | utf8 | the kernel source |
/// | reference_code | utf8, nullable | the PyTorch reference the archive used |
/// | reference_matches_problem | bool, nullable | reference equals the `problems` code (whitespace-normalized); null if no problem |
/// | claimed_correct | bool, nullable | the archive's correctness verdict |
/// | claimed_speedup_native | float64, nullable | archive speedup vs PyTorch eager (ratio) |
/// | claimed_speedup_compile | float64, nullable | archive speedup vs torch.compile (ratio) |
/// | claimed_runtime_ms, torch_native_ms, torch_compile_ms | float64, nullable | archive timings, ms |
/// | claimed_max_diff | float64, nullable | archive max abs difference vs reference |
/// | error | utf8, nullable | archive's build/run error text |
/// | gpu | utf8, nullable | GPU the archive timed on, when known |
/// | clang_tidy_warnings | int64, nullable | `warning:` lines in the archive's clang-tidy output |
/// | ncu_* | float64, nullable | typed NCU metrics, see [`NCU_TYPED`] |
/// | ncu_metrics | `list<struct>`, nullable | every NCU metric as in the archive (name, unit, avg, variance, n) |
/// | ncu_rules | `list<struct>`, nullable | NCU rule results (name, type, description) |
/// | provenance | utf8 | dataset, revision, file and row the kernel came from |
pub static KERNELS: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut f = vec![
        Field::new("kernel_id", DataType::Utf8, false),
        Field::new("row_id", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("problem_id", DataType::Utf8, true),
        Field::new("level", DataType::Int64, false),
        Field::new("task_id", DataType::Int64, false),
        Field::new("op_name", DataType::Utf8, true),
        Field::new("kernel_name", DataType::Utf8, true),
        Field::new("abi", DataType::Utf8, false),
        Field::new("format", DataType::Utf8, false),
        Field::new("has_cuda_kernel", DataType::Boolean, false),
        Field::new("code", DataType::Utf8, false),
        Field::new("reference_code", DataType::Utf8, true),
        Field::new("reference_matches_problem", DataType::Boolean, true),
        Field::new("claimed_correct", DataType::Boolean, true),
        Field::new("claimed_speedup_native", DataType::Float64, true),
        Field::new("claimed_speedup_compile", DataType::Float64, true),
        Field::new("claimed_runtime_ms", DataType::Float64, true),
        Field::new("torch_native_ms", DataType::Float64, true),
        Field::new("torch_compile_ms", DataType::Float64, true),
        Field::new("claimed_max_diff", DataType::Float64, true),
        Field::new("error", DataType::Utf8, true),
        Field::new("gpu", DataType::Utf8, true),
        Field::new("clang_tidy_warnings", DataType::Int64, true),
    ];
    for (_, col, _) in NCU_TYPED {
        f.push(Field::new(col, DataType::Float64, true));
    }
    f.push(Field::new(
        "ncu_metrics",
        list_of(ncu_metric_struct()),
        true,
    ));
    f.push(Field::new("ncu_rules", list_of(ncu_rule_struct()), true));
    f.push(Field::new("provenance", DataType::Utf8, false));
    Arc::new(Schema::new(f))
});
