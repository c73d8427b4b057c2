//! KernelBench problems as episode tasks: a problem of the curriculum with the native launcher
//! `kb-specs` derived ([`KbTask`]), shown to the agents as its PyTorch source and the launcher to
//! define ([`cudarl_curriculum::prompts::module_description`]). `eval` runs the agents on
//! the curriculum's KernelBench `test` problems; `export curriculum --format verl` writes its
//! `train` and `test` problems as RL rows.

use std::collections::BTreeMap;
use std::path::Path;

use cudarl_curriculum::prompts;
use cudarl_data::Table;

use crate::episode::{EpisodeTask, TaskText};

/// One KernelBench problem as an episode task.
#[derive(Debug, Clone, PartialEq)]
pub struct KbTask {
    /// The problem id, e.g. `kb/L1/19_ReLU`.
    pub id: String,
    /// Its curriculum tier (0..3).
    pub tier: i64,
    /// Its KernelBench level (1, 2, ...).
    pub level: i64,
    /// Its name, e.g. `19_ReLU`.
    pub name: String,
    /// The problem's PyTorch source (`Model`, its constants and `get_inputs`).
    pub code: String,
    /// The native launcher `kb-specs` derived (`extern "C" void launch(...)`).
    pub signature: String,
}

impl EpisodeTask for KbTask {
    fn id(&self) -> &str {
        &self.id
    }
    fn tier(&self) -> i64 {
        self.tier
    }
    fn text(&self) -> TaskText {
        TaskText {
            tier: self.tier,
            description: prompts::module_description(&self.code),
            dtype: prompts::signature_dtype(&self.signature).to_string(),
            signature: self.signature.clone(),
            shapes: vec![],
        }
    }
}

/// The KernelBench problems of the `curriculum` node's `curriculum` table that have a native
/// signature (`kb-specs` covered them), `(split, task)` in the table's order, with the PyTorch
/// source from the `ingest-kernelbench` node's `problems` table. Splits are the curriculum's
/// (`train`, `val`, `test`).
///
/// # Errors
/// A table cannot be read or lacks a column (file and field named); a covered problem missing
/// from `problems`.
pub fn curriculum_tasks(
    curriculum: &Path,
    problems: &Path,
) -> Result<Vec<(String, KbTask)>, String> {
    curriculum_rows(curriculum, problems, true)
}

/// Every KernelBench problem of the curriculum, with a native signature or not (`signature`
/// empty where `kb-specs` gave none), as [`curriculum_tasks`]: the references the splits put
/// a problem's ops on either side of (`eval`'s op coverage).
///
/// # Errors
/// As [`curriculum_tasks`], for every problem.
pub fn curriculum_problems(
    curriculum: &Path,
    problems: &Path,
) -> Result<Vec<(String, KbTask)>, String> {
    curriculum_rows(curriculum, problems, false)
}

/// The rows of [`curriculum_tasks`] (`covered`: those with a signature) or of
/// [`curriculum_problems`].
fn curriculum_rows(
    curriculum: &Path,
    problems: &Path,
    covered: bool,
) -> Result<Vec<(String, KbTask)>, String> {
    let t = Table::read(curriculum, "curriculum").map_err(|e| e.to_string())?;
    let col = |c: &str| t.req_strings(c).map_err(|e| e.to_string());
    let (id, src, split, name, sig) = (
        col("problem_id")?,
        col("source")?,
        col("split")?,
        col("name")?,
        col("signature")?,
    );
    let tier = t.req_ints("tier").map_err(|e| e.to_string())?;
    let level = t.req_ints("level").map_err(|e| e.to_string())?;
    let p = Table::read(problems, "problems").map_err(|e| e.to_string())?;
    let (pid, pcode) = (
        p.req_strings("problem_id").map_err(|e| e.to_string())?,
        p.req_strings("code").map_err(|e| e.to_string())?,
    );
    let code: BTreeMap<&str, &str> = (0..p.rows())
        .filter_map(|i| Some((pid.get(i)?, pcode.get(i)?)))
        .collect();
    let mut out = Vec::new();
    for i in 0..t.rows() {
        let (Some("kernelbench"), Some(split), Some(id)) = (src.get(i), split.get(i), id.get(i))
        else {
            continue;
        };
        let sig = sig.get(i);
        if covered && sig.is_none() {
            continue;
        }
        let src = code.get(id).ok_or_else(|| {
            format!(
                "{}: problem_id `{id}` of the curriculum is not in this table",
                problems.display()
            )
        })?;
        let task = KbTask {
            id: id.to_string(),
            tier: tier.get(i).unwrap_or(0),
            level: level.get(i).unwrap_or(0),
            name: name.get(i).unwrap_or(id).to_string(),
            code: src.to_string(),
            signature: sig.unwrap_or_default().to_string(),
        };
        out.push((split.to_string(), task));
    }
    Ok(out)
}
