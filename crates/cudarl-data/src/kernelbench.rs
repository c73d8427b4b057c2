//! KernelBench problems: readers for the bundled Parquet snapshot, a KernelBench checkout
//! (`KernelBench/level{1..4}/*.py`) and the hub dataset's Parquet files, and the `problems`
//! table builder.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Builder, ListBuilder, RecordBatch, StringBuilder};

use crate::error::{DataError, Result};
use crate::kernels::{blake3_hex, normalize_code};
use crate::parquet_io::{Table, batch};
use crate::schemas::PROBLEMS;

/// A problem as read from a source, before feature extraction.
#[derive(Debug, Clone, PartialEq)]
pub struct RawProblem {
    /// KernelBench level (1..4).
    pub level: i64,
    /// Problem number within the level.
    pub number: i64,
    /// File stem, e.g. `19_ReLU`.
    pub name: String,
    /// Reference module source.
    pub code: String,
    /// Provenance: repository.
    pub source_repo: Option<String>,
    /// Provenance: commit.
    pub source_commit: Option<String>,
    /// Provenance: path in the repository.
    pub source_path: Option<String>,
}

impl RawProblem {
    /// The stable id `kb/L{level}/{name}`.
    pub fn problem_id(&self) -> String {
        problem_id(self.level, &self.name)
    }
}

/// The stable problem id `kb/L{level}/{name}` (e.g. `kb/L1/19_ReLU`).
pub fn problem_id(level: i64, name: &str) -> String {
    format!("kb/L{level}/{name}")
}

/// Reads problems from a Parquet file with columns `level`, `problem_id` (int), `name`,
/// `code` and optional `source_repo`, `source_commit`, `source_path` (the bundled snapshot's
/// schema and the hub dataset's, which lacks the provenance columns).
///
/// # Errors
/// Unreadable file, missing or mistyped column, null in a required column.
pub fn read_parquet(path: &Path, display: &str) -> Result<Vec<RawProblem>> {
    let t = Table::read(path, display)?;
    let level = t.req_ints("level")?;
    let num = t.req_ints("problem_id")?;
    let name = t.req_strings("name")?;
    let code = t.req_strings("code")?;
    let repo = t.strings("source_repo")?;
    let commit = t.strings("source_commit")?;
    let spath = t.strings("source_path")?;
    let mut out = Vec::with_capacity(t.rows());
    for i in 0..t.rows() {
        let req = |v: Option<i64>, f: &str| {
            v.ok_or_else(|| DataError::bad(display, Some(f), format!("null in row {i}")))
        };
        let level = req(level.get(i), "level")?;
        if !(1..=4).contains(&level) {
            return Err(DataError::bad(
                display,
                Some("level"),
                format!("row {i}: level {level} is not in 1..4"),
            ));
        }
        out.push(RawProblem {
            level,
            number: req(num.get(i), "problem_id")?,
            name: name
                .get(i)
                .ok_or_else(|| DataError::bad(display, Some("name"), format!("null in row {i}")))?
                .to_string(),
            code: code
                .get(i)
                .ok_or_else(|| DataError::bad(display, Some("code"), format!("null in row {i}")))?
                .to_string(),
            source_repo: repo.as_ref().and_then(|c| c.get(i)).map(str::to_string),
            source_commit: commit.as_ref().and_then(|c| c.get(i)).map(str::to_string),
            source_path: spath.as_ref().and_then(|c| c.get(i)).map(str::to_string),
        });
    }
    Ok(out)
}

/// Lists the problem files of a KernelBench checkout: `dir` may be the repository root
/// (holding `KernelBench/`) or the `KernelBench/` folder itself. Returns (relative name like
/// `level1/19_ReLU.py`, path), sorted.
///
/// # Errors
/// [`DataError::Source`] if no `level{N}` folder is found.
pub fn list_checkout(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let base = if dir.join("KernelBench").is_dir() {
        dir.join("KernelBench")
    } else {
        dir.to_path_buf()
    };
    let mut out = Vec::new();
    for level in 1..=4 {
        let ld = base.join(format!("level{level}"));
        let Ok(rd) = std::fs::read_dir(&ld) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Some(fname) = p.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if fname.ends_with(".py") && fname.chars().next().is_some_and(|c| c.is_ascii_digit()) {
                out.push((format!("level{level}/{fname}"), p.clone()));
            }
        }
    }
    if out.is_empty() {
        return Err(DataError::Source {
            source_desc: dir.display().to_string(),
            message: "no KernelBench/level{1..4}/<N>_<name>.py files found".into(),
        });
    }
    out.sort();
    Ok(out)
}

/// Reads problems from checkout files listed by [`list_checkout`].
///
/// # Errors
/// Unreadable file or a file name without a leading problem number.
pub fn read_checkout(
    files: &[(String, PathBuf)],
    repo: Option<&str>,
    commit: Option<&str>,
) -> Result<Vec<RawProblem>> {
    let mut out = Vec::new();
    for (rel, path) in files {
        let (ldir, fname) = rel
            .split_once('/')
            .expect("relative names are levelN/file.py");
        let level: i64 = ldir.trim_start_matches("level").parse().expect("levelN");
        let stem = fname.trim_end_matches(".py");
        let number: i64 = stem
            .split('_')
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                DataError::bad(
                    rel.clone(),
                    None,
                    "file name must start with the problem number",
                )
            })?;
        let code = std::fs::read_to_string(path)
            .map_err(|e| DataError::bad(rel.clone(), None, format!("cannot read: {e}")))?;
        out.push(RawProblem {
            level,
            number,
            name: stem.to_string(),
            code,
            source_repo: repo.map(str::to_string),
            source_commit: commit.map(str::to_string),
            source_path: Some(format!("KernelBench/{rel}")),
        });
    }
    Ok(out)
}

/// One row of the `problems` table.
#[derive(Debug, Clone, PartialEq)]
pub struct ProblemRow {
    /// The raw problem.
    pub raw: RawProblem,
    /// Extracted op features (sorted, unique).
    pub op_features: Vec<String>,
    /// `bundled`, `checkout` or `hub`.
    pub source_kind: String,
}

/// Sorts rows by (level, number, name), rejects duplicate ids, and builds the batch.
///
/// # Errors
/// Duplicate `problem_id` (naming it and `display`).
pub fn problems_batch(mut rows: Vec<ProblemRow>, display: &str) -> Result<RecordBatch> {
    rows.sort_by(|a, b| {
        (a.raw.level, a.raw.number, &a.raw.name).cmp(&(b.raw.level, b.raw.number, &b.raw.name))
    });
    for w in rows.windows(2) {
        if w[0].raw.problem_id() == w[1].raw.problem_id() {
            return Err(DataError::bad(
                display,
                Some("name"),
                format!("duplicate problem {}", w[0].raw.problem_id()),
            ));
        }
    }
    let n = rows.len();
    let s = |f: &dyn Fn(&ProblemRow) -> Option<String>| -> ArrayRef {
        let mut b = StringBuilder::with_capacity(n, n * 32);
        for r in &rows {
            b.append_option(f(r));
        }
        Arc::new(b.finish())
    };
    let i = |f: &dyn Fn(&ProblemRow) -> i64| -> ArrayRef {
        let mut b = Int64Builder::with_capacity(n);
        for r in &rows {
            b.append_value(f(r));
        }
        Arc::new(b.finish())
    };
    let mut feats = ListBuilder::new(StringBuilder::new());
    for r in &rows {
        for f in &r.op_features {
            feats.values().append_value(f);
        }
        feats.append(true);
    }
    let feats: ArrayRef = Arc::new(feats.finish());
    let schema = PROBLEMS.clone();
    let feats = arrow::compute::cast(&feats, schema.field(6).data_type()).expect("list cast");
    batch(
        &schema,
        vec![
            s(&|r| Some(r.raw.problem_id())),
            i(&|r| r.raw.level),
            i(&|r| r.raw.number),
            s(&|r| Some(r.raw.name.clone())),
            s(&|r| Some(r.raw.code.clone())),
            s(&|r| Some(blake3_hex(&r.raw.code))),
            feats,
            s(&|r| Some(r.source_kind.clone())),
            s(&|r| r.raw.source_repo.clone()),
            s(&|r| r.raw.source_commit.clone()),
            s(&|r| r.raw.source_path.clone()),
        ],
    )
}

/// Lookup of problems for joining archive kernels: by id and by (level, number), with the
/// normalized reference code to detect reference drift.
#[derive(Debug, Clone, Default)]
pub struct ProblemIndex {
    by_id: HashMap<String, String>,
    by_num: BTreeMap<(i64, i64), String>,
}

impl ProblemIndex {
    /// Reads a `problems` table.
    ///
    /// # Errors
    /// Unreadable file or wrong schema.
    pub fn read(path: &Path, display: &str) -> Result<ProblemIndex> {
        let t = Table::read(path, display)?;
        let id = t.req_strings("problem_id")?;
        let level = t.req_ints("level")?;
        let number = t.req_ints("number")?;
        let code = t.req_strings("code")?;
        let mut idx = ProblemIndex::default();
        for i in 0..t.rows() {
            let (Some(id), Some(l), Some(n), Some(c)) =
                (id.get(i), level.get(i), number.get(i), code.get(i))
            else {
                continue;
            };
            idx.by_id.insert(id.to_string(), normalize_code(c));
            idx.by_num.insert((l, n), id.to_string());
        }
        Ok(idx)
    }

    /// Whether a problem id exists.
    pub fn contains(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    /// Problem id for (level, number).
    pub fn id_for(&self, level: i64, number: i64) -> Option<&str> {
        self.by_num.get(&(level, number)).map(String::as_str)
    }

    /// Whether `reference` equals the problem's code (whitespace-normalized); `None` if the
    /// problem is unknown.
    pub fn reference_matches(&self, id: &str, reference: &str) -> Option<bool> {
        self.by_id.get(id).map(|c| *c == normalize_code(reference))
    }

    /// Number of problems.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}
