//! `splits` (stage `splits`): what is held out, one row per KernelBench problem and per task
//! family (docs/architecture.md, "Splits").

use cudarl_curriculum::Split;
use cudarl_data::DataError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// One row of `splits`.
///
/// | column | type | meaning |
/// |---|---|---|
/// | item_id | utf8 | `kb/L{level}/{name}` (a KernelBench problem, as `problems.problem_id`) or `synth/<task_id>` |
/// | source | utf8 | `kernelbench` or `synthetic` |
/// | level | int64, nullable | KernelBench level; null for families |
/// | group | utf8 | the unit that shares a split: the problem id itself, or the family's template group (its task id when it has none) |
/// | split | utf8 | `train`, `val` or `test` (KernelBench); `train`, `rl` or `test` (families) |
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitRow {
    /// `kb/L{level}/{name}` or `synth/<task_id>`.
    pub item_id: String,
    /// `kernelbench` or `synthetic`.
    pub source: String,
    /// KernelBench level (`None` for families).
    pub level: Option<i64>,
    /// The unit that shares a split.
    pub group: String,
    /// `train`, `val`, `rl` or `test`.
    pub split: String,
}

crate::table_row!(SplitRow, "splits");

/// A `splits` table as its readers use it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitMap {
    /// KernelBench problem id -> its split.
    pub kernelbench: BTreeMap<String, Split>,
    /// Task id (without `synth/`) -> `train`, `rl` or `test`.
    pub families: BTreeMap<String, String>,
}

impl SplitMap {
    /// Reads a `splits` table (`path`, named `name` in errors).
    ///
    /// # Errors
    /// The table cannot be read, a column is missing or mistyped, a row has a null field, an
    /// unknown source, an item id without its source's prefix, or a split its source does not
    /// have ([`DataError::BadInput`], file and field named).
    pub fn read(path: &Path, name: &str) -> Result<SplitMap, DataError> {
        SplitMap::from_rows(crate::read::<SplitRow>(path, name)?, name)
    }

    /// The map of `rows` (named `name` in errors), checked as [`SplitMap::read`] checks them.
    ///
    /// # Errors
    /// As [`SplitMap::read`].
    pub fn from_rows(rows: Vec<SplitRow>, name: &str) -> Result<SplitMap, DataError> {
        let bad = |field: &str, msg: String| DataError::bad(name, Some(field), msg);
        let mut out = SplitMap::default();
        for r in rows {
            let (id, sp) = (r.item_id, r.split.as_str());
            match r.source.as_str() {
                "kernelbench" => {
                    let s = match sp {
                        "train" => Split::Train,
                        "val" => Split::Val,
                        "test" => Split::Test,
                        _ => {
                            return Err(bad(
                                "split",
                                format!("{id}: split `{sp}` (expected train, val or test)"),
                            ));
                        }
                    };
                    out.kernelbench.insert(id, s);
                }
                "synthetic" => {
                    let Some(task) = id.strip_prefix("synth/") else {
                        return Err(bad(
                            "item_id",
                            format!("`{id}`: a synthetic item is `synth/<task_id>`"),
                        ));
                    };
                    if !["train", "rl", "test"].contains(&sp) {
                        return Err(bad(
                            "split",
                            format!("{id}: split `{sp}` (expected train, rl or test)"),
                        ));
                    }
                    out.families.insert(task.to_string(), sp.to_string());
                }
                src => {
                    return Err(bad(
                        "source",
                        format!("{id}: source `{src}` (expected kernelbench or synthetic)"),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// The split of task family `task`.
    ///
    /// # Errors
    /// The family has no row (the `splits` table was drawn from other tasks;
    /// [`DataError::BadInput`]).
    pub fn family(&self, task: &str) -> Result<&str, DataError> {
        self.families.get(task).map(String::as_str).ok_or_else(|| {
            DataError::bad(
                "splits",
                Some("item_id"),
                format!("no row synth/{task} for task family {task}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_splits_table_with_a_wrong_split_is_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("splits.parquet");
        let row = |source: &str, item: &str, split: &str| SplitRow {
            item_id: item.into(),
            source: source.into(),
            level: None,
            group: item.into(),
            split: split.into(),
        };
        crate::write(&path, &[row("synthetic", "synth/row_sum", "val")]).unwrap();
        let e = SplitMap::read(&path, "splits").unwrap_err();
        let DataError::BadInput { field, message, .. } = e else {
            panic!("{e}")
        };
        assert_eq!(field.as_deref(), Some("split"));
        assert!(message.contains("synth/row_sum"), "{message}");
        crate::write(&path, &[row("kernelbench", "kb/L1/1_x", "rl")]).unwrap();
        assert!(SplitMap::read(&path, "splits").is_err());
        crate::write(&path, &[row("synthetic", "row_sum", "rl")]).unwrap();
        let e = SplitMap::read(&path, "splits").unwrap_err().to_string();
        assert!(
            e.contains("`row_sum`: a synthetic item is `synth/<task_id>`"),
            "{e}"
        );
        crate::write(&path, &[row("synthetic", "synth/a", "rl")]).unwrap();
        let m = SplitMap::read(&path, "splits").unwrap();
        assert_eq!(m.family("a").unwrap(), "rl");
        assert!(m.family("b").is_err());
    }
}
