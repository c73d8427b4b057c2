//! KernelBench problems as episode tasks: a problem of the curriculum with the native launcher
//! `kb-specs` derived ([`KbTask`]), shown to the agents as its PyTorch source and the launcher to
//! define ([`cudarl_curriculum::prompts::module_description`]). `eval` runs the agents on
//! the curriculum's KernelBench `test` problems; `export curriculum --format verl` writes its
//! `train` and `test` problems as RL rows.

use std::collections::BTreeMap;
use std::path::Path;

use cudarl_cuda::native_abi::KbNative;
use cudarl_cuda::torchfmt::{KbProblem, RecordedTest, tolerance};
use cudarl_curriculum::prompts;

use crate::RlError;
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
        TaskText::of_module(
            self.tier,
            &self.code,
            prompts::signature_dtype(&self.signature).to_string(),
            self.signature.clone(),
        )
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
) -> Result<Vec<(String, KbTask)>, RlError> {
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
) -> Result<Vec<(String, KbTask)>, RlError> {
    curriculum_rows(curriculum, problems, false)
}

/// The rows of [`curriculum_tasks`] (`covered`: those with a signature) or of
/// [`curriculum_problems`].
fn curriculum_rows(
    curriculum: &Path,
    problems: &Path,
    covered: bool,
) -> Result<Vec<(String, KbTask)>, RlError> {
    use cudarl_tables::curriculum::CurriculumRow;
    use cudarl_tables::problems::ProblemRow;
    let rows = cudarl_tables::read::<CurriculumRow>(curriculum, "curriculum")?;
    let problems_rows = cudarl_tables::read::<ProblemRow>(problems, "problems")?;
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
            RlError::bad_input(
                problems.display().to_string(),
                Some("problem_id"),
                format!("`{id}` of the curriculum is not in this table"),
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

/// KernelBench problems with their recorded tests, from a `problems` table
/// (`ingest-kernelbench`) and, if given, a `kb_tests` table (`testgen`; test files are store
/// blobs). Without it the problems have no tests (compile-only checks need none). Tolerance per
/// problem from the dtype of its first output ([`cudarl_cuda::torchfmt::tolerance`]).
///
/// # Errors
/// Unreadable tables, missing columns or a `blob` that is not a digest (bad input naming the
/// file and column).
pub fn load_kb_problems(
    problems: &Path,
    kb_tests: Option<&Path>,
    store: &cudarl_store::Store,
) -> Result<BTreeMap<String, KbProblem>, RlError> {
    let mut out: BTreeMap<String, KbProblem> =
        cudarl_tables::read::<cudarl_tables::problems::ProblemRow>(problems, "problems")?
            .into_iter()
            .map(|r| {
                let p = KbProblem {
                    id: r.problem_id.clone(),
                    code: r.code,
                    tests: vec![],
                    tol: tolerance("f32"),
                };
                (r.problem_id, p)
            })
            .collect();
    let Some(kb_tests) = kb_tests else {
        return Ok(out);
    };
    for t in cudarl_tables::read::<cudarl_tables::kb_specs::KbTestRow>(kb_tests, "kb_tests")? {
        let d: cudarl_store::Digest = t.blob.parse().map_err(|_| {
            RlError::bad_input(
                "kb_tests",
                Some("blob"),
                format!("`{}` is not a digest", t.blob),
            )
        })?;
        let Some(prob) = out.get_mut(&t.problem_id) else {
            continue;
        };
        if prob.tests.is_empty()
            && let Some(dt) = serde_json::from_str::<serde_json::Value>(&t.tensors_json)
                .ok()
                .and_then(|v| {
                    v.as_array()?
                        .iter()
                        .find(|x| x["name"].as_str().is_some_and(|n| n.starts_with("output.")))
                        .and_then(|x| x["dtype"].as_str().map(str::to_string))
                })
        {
            prob.tol = tolerance(&dt);
        }
        prob.tests.push(RecordedTest {
            path: store.blob_path(&d),
            seed: t.seed as u64,
            split: t.split,
            dist: t.dist,
        });
    }
    Ok(out)
}

/// Every problem of a `kb_specs` table (`path`, [`cudarl_tables::kb_specs::KbSpecRow`]): its
/// native ABI, or why it has none (its `excluded_reason`).
///
/// # Errors
/// The table cannot be read, lacks a column, or a JSON column does not parse (naming the file
/// and the column).
pub fn native_abis(path: &Path) -> Result<BTreeMap<String, Result<KbNative, String>>, RlError> {
    let rows = cudarl_tables::read::<cudarl_tables::kb_specs::KbSpecRow>(path, "kb_specs")?;
    let mut out = BTreeMap::new();
    for r in rows {
        let abi = match &r.signature {
            None => Err(format!(
                "`{}` has no native signature: {}",
                r.problem_id,
                r.excluded_reason.as_deref().unwrap_or("no signature")
            )),
            Some(signature) => Ok(
                KbNative::from_row(signature, &r.buffers_json, &r.sizes_json)
                    .map_err(|e| RlError::bad_input(path.display().to_string(), None, e.0))?,
            ),
        };
        out.insert(r.problem_id, abi);
    }
    Ok(out)
}

/// The native ABI of KernelBench problem `problem_id` from a `kb_specs` table (`path`):
/// `Ok(Ok(abi))`, or `Ok(Err(why))` for a problem without a native signature (its
/// `excluded_reason`) or not in the table.
///
/// # Errors
/// As [`native_abis`].
pub fn native_abi(path: &Path, problem_id: &str) -> Result<Result<KbNative, String>, RlError> {
    Ok(native_abis(path)?
        .remove(problem_id)
        .unwrap_or_else(|| Err(format!("`{problem_id}` is not in kb-specs' levels"))))
}
