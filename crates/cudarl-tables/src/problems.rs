//! `problems` (stage `ingest-kernelbench`): one row per KernelBench problem. The schema is
//! `cudarl_data::schemas::PROBLEMS`, which ingestion writes column by column; [`ProblemRow`]
//! traces to the same schema (its test holds them together).

use serde::{Deserialize, Serialize};

/// One row of `problems`.
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemRow {
    /// `kb/L{level}/{name}`.
    pub problem_id: String,
    /// KernelBench level.
    pub level: i64,
    /// Problem number within the level.
    pub number: i64,
    /// File stem.
    pub name: String,
    /// The reference module's source.
    pub code: String,
    /// BLAKE3 hex of `code`.
    pub code_hash: String,
    /// Torch ops of the reference.
    pub op_features: Vec<String>,
    /// `bundled`, `checkout` or `hub`.
    pub source_kind: String,
    /// Provenance: repository.
    pub source_repo: Option<String>,
    /// Provenance: commit.
    pub source_commit: Option<String>,
    /// Provenance: path.
    pub source_path: Option<String>,
}

crate::table_row!(ProblemRow, "problems");
