//! KernelBench problems as episode tasks: a problem of the curriculum with the native launcher
//! `kb-specs` derived ([`KbTask`]), shown to the agents as its PyTorch source and the launcher to
//! define ([`cudarl_curriculum::prompts::module_description`]). `eval` runs the agents on
//! the curriculum's KernelBench `test` problems; `export curriculum --format verl` writes its
//! `train` and `test` problems as RL rows.

use std::collections::BTreeMap;
use std::path::Path;

use cudarl_curriculum::prompts;

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
    use cudarl_tables::curriculum::CurriculumRow;
    use cudarl_tables::problems::ProblemRow;
    let rows = cudarl_tables::read::<CurriculumRow>(curriculum, "curriculum")
        .map_err(|e| e.to_string())?;
    let problems_rows =
        cudarl_tables::read::<ProblemRow>(problems, "problems").map_err(|e| e.to_string())?;
    let code: BTreeMap<&str, &str> = problems_rows
        .iter()
        .map(|p| (p.problem_id.as_str(), p.code.as_str()))
        .collect();
    let mut out = Vec::new();
    for r in rows {
        if r.source != "kernelbench" || (covered && r.signature.is_none()) {
            continue;
        }
        let id = r.problem_id.as_str();
        let src = code.get(id).ok_or_else(|| {
            format!(
                "{}: problem_id `{id}` of the curriculum is not in this table",
                problems.display()
            )
        })?;
        let task = KbTask {
            id: id.to_string(),
            tier: r.tier,
            level: r.level.unwrap_or(0),
            name: r.name.clone(),
            code: src.to_string(),
            signature: r.signature.clone().unwrap_or_default(),
        };
        out.push((r.split, task));
    }
    Ok(out)
}
