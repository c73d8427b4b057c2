//! The task tables, read in one place: `synth-tasks`' `tasks` (one [`TaskSpec`] per row, its
//! `spec_json`) and `task_kernels` (the naive and optimized kernels), and `sft-data`'s
//! `sft_generator` for the split each family is in; the [`TaskSet`] RL and eval draw from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cudarl_cuda::task::TaskSpec;
use cudarl_data::Table;
use serde::{Deserialize, Serialize};

use crate::RlError;

/// The task specs of a `tasks` table (its `spec_json` column), in row order.
///
/// # Errors
/// An unreadable table, a missing column, or a spec that does not parse (the file, the field
/// and the task named).
pub fn read_specs(path: &Path) -> Result<Vec<TaskSpec>, RlError> {
    cudarl_tables::read::<cudarl_tables::tasks::TaskRow>(path, "tasks")?
        .into_iter()
        .map(|r| {
            serde_json::from_str(&r.spec_json).map_err(|e| {
                RlError::bad_input(
                    path.display().to_string(),
                    Some("spec_json"),
                    format!("task `{}`: {e}", r.task_id),
                )
            })
        })
        .collect()
}

/// [`read_specs`] by task id.
///
/// # Errors
/// As [`read_specs`].
pub fn specs_by_id(path: &Path) -> Result<BTreeMap<String, TaskSpec>, RlError> {
    Ok(read_specs(path)?
        .into_iter()
        .map(|s| (s.id.clone(), s))
        .collect())
}

/// A row of a `task_kernels` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskKernel {
    /// BLAKE3 of the code.
    pub kernel_id: String,
    /// Its task.
    pub task_id: String,
    /// `naive` or `optimized`.
    pub role: String,
    /// The CUDA source.
    pub code: String,
}

/// The rows of a `task_kernels` table, in order.
///
/// # Errors
/// An unreadable table or a missing column (file and field named).
pub fn read_kernels(path: &Path) -> Result<Vec<TaskKernel>, RlError> {
    Ok(
        cudarl_tables::read::<cudarl_tables::tasks::TaskKernelRow>(path, "task_kernels")?
            .into_iter()
            .map(|r| TaskKernel {
                kernel_id: r.kernel_id,
                task_id: r.task_id,
                role: r.role,
                code: r.code,
            })
            .collect(),
    )
}

/// The naive kernel's source per task id (the speedup baseline), from a `task_kernels` table.
///
/// # Errors
/// As [`read_kernels`].
pub fn read_naive(path: &Path) -> Result<BTreeMap<String, String>, RlError> {
    Ok(read_kernels(path)?
        .into_iter()
        .filter(|k| k.role == "naive")
        .map(|k| (k.task_id, k.code))
        .collect())
}

/// The task families of an `sft_generator` table by the split of their rows (`train`, `val`,
/// `test`: the hold-out, `rl`: reserved for `rl-train`).
///
/// # Errors
/// An unreadable table or a missing column (file and field named).
pub fn family_splits(path: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, RlError> {
    let d = Table::read(path, "sft_generator")?;
    let (dt, ds) = (d.req_strings("task_id")?, d.req_strings("split")?);
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for i in 0..d.rows() {
        if let (Some(t), Some(sp)) = (dt.get(i), ds.get(i)) {
            out.entry(sp.to_string()).or_default().insert(t.to_string());
        }
    }
    Ok(out)
}

/// The hold-out families (the `test` split) of an `sft_generator` table.
///
/// # Errors
/// As [`family_splits`].
pub fn holdout_ids(path: &Path) -> Result<BTreeSet<String>, RlError> {
    Ok(family_splits(path)?.remove("test").unwrap_or_default())
}

/// The families `rl-train` draws from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskPool {
    /// `sft-data`'s `rl` split when it reserved one, else its train split.
    #[default]
    Auto,
    /// The families SFT trained on.
    Train,
    /// The families `sft-data` reserved for RL.
    Rl,
    /// Both.
    Both,
    /// Elementwise families generated for the run, new ones every step ([`fresh_families`]).
    Fresh,
}

impl TaskPool {
    /// `auto`, `train`, `rl`, `both` or `fresh`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskPool::Auto => "auto",
            TaskPool::Train => "train",
            TaskPool::Rl => "rl",
            TaskPool::Both => "both",
            TaskPool::Fresh => "fresh",
        }
    }
}

/// The tasks of the synthetic families, split as the SFT data split them, and their naive
/// kernels.
#[derive(Debug, Clone, Default)]
pub struct TaskSet {
    /// Families SFT trained on (neither held out nor reserved for RL).
    pub train: Vec<TaskSpec>,
    /// Families sft-data reserved for RL (its `rl` split): never in SFT data.
    pub rl: Vec<TaskSpec>,
    /// Hold-out families (the `test` split).
    pub test: Vec<TaskSpec>,
    /// Naive kernel per task id.
    pub naive: BTreeMap<String, String>,
}

impl TaskSet {
    /// From a `tasks` table, its `task_kernels` and an `sft_generator` table.
    ///
    /// # Errors
    /// As [`read_specs`], [`read_naive`] and [`family_splits`].
    pub fn load(tasks: &Path, kernels: &Path, sft_generator: &Path) -> Result<TaskSet, RlError> {
        let mut splits = family_splits(sft_generator)?;
        let held = splits.remove("test").unwrap_or_default();
        let reserved = splits.remove("rl").unwrap_or_default();
        let mut ts = TaskSet {
            naive: read_naive(kernels)?,
            ..Default::default()
        };
        for s in read_specs(tasks)? {
            if held.contains(&s.id) {
                ts.test.push(s);
            } else if reserved.contains(&s.id) {
                ts.rl.push(s);
            } else {
                ts.train.push(s);
            }
        }
        Ok(ts)
    }

    /// The task set with each family in its `splits` split (`test`, `rl`, else `train`).
    /// `sft_generator` names only the families it has rows for, so a family none of whose
    /// kernels validated would otherwise count as `train` in [`TaskSet::load`]: a hold-out family
    /// among the families RL practises. Each split keeps the order of `self` (its `train`, then
    /// `rl`, then `test` families).
    ///
    /// # Errors
    /// A family has no row in `splits` ([`cudarl_data::DataError::BadInput`], as
    /// [`cudarl_tables::splits::SplitMap::family`]).
    pub fn follow_splits(
        self,
        splits: &cudarl_tables::splits::SplitMap,
    ) -> Result<TaskSet, cudarl_data::DataError> {
        let mut out = TaskSet {
            naive: self.naive,
            ..TaskSet::default()
        };
        for s in self.train.into_iter().chain(self.rl).chain(self.test) {
            match splits.family(&s.id)? {
                "test" => out.test.push(s),
                "rl" => out.rl.push(s),
                _ => out.train.push(s),
            }
        }
        Ok(out)
    }

    /// The families `pool` names (`fresh`: none here, see [`fresh_families`]).
    pub fn pool(&self, pool: TaskPool) -> Vec<&TaskSpec> {
        match pool {
            TaskPool::Train => self.train.iter().collect(),
            TaskPool::Rl => self.rl.iter().collect(),
            TaskPool::Both => self.train.iter().chain(&self.rl).collect(),
            TaskPool::Fresh => Vec::new(),
            TaskPool::Auto if self.rl.is_empty() => self.train.iter().collect(),
            TaskPool::Auto => self.rl.iter().collect(),
        }
    }
}

/// Salt of the ChaCha8 seed of [`fresh_families`] (so they are not `synth-tasks`' draws).
pub const FRESH_SALT: u64 = 0xF2E5_4EA5;

/// `n` tier-0 elementwise families generated for one `rl-train` run (`task_pool = "fresh"`;
/// [`crate::families::generate`] with seed `seed ^ FRESH_SALT`), ids `fresh_ew_000`, ...,
/// none equal (up to commuted operands) to the reference of any task in `ts`, train, `rl` and
/// hold-out alike; their naive kernels join `ts.naive` (the harness times against them).
/// Deterministic in (`ts`, `n`, `seed`). Fewer than `n` come back only when the expression
/// space is exhausted.
pub fn fresh_families(ts: &mut TaskSet, n: usize, seed: u64) -> Vec<TaskSpec> {
    let exclude: BTreeSet<String> = ts
        .train
        .iter()
        .chain(&ts.rl)
        .chain(&ts.test)
        .flat_map(|t| t.reference.values().cloned())
        .collect();
    let gp = crate::families::GenerateParams {
        elementwise: n,
        row_reduce: 0,
        operators: 0,
        seed: seed ^ FRESH_SALT,
    };
    crate::families::generate(&gp, &exclude)
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let mut spec = f.spec;
            spec.id = format!("fresh_ew_{i:03}");
            ts.naive.insert(spec.id.clone(), f.naive);
            spec
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str) -> TaskSpec {
        toml::from_str(&format!(
            r#"id = "{id}"
tier = 0
description = "y = x"
dtype = "f32"
sizes = ["n"]
args = [{{ name = "x", kind = "input", shape = ["n"] }}, {{ name = "y", kind = "output", shape = ["n"] }}, {{ name = "n", kind = "size" }}]
train_shapes = [{{ n = 4 }}]
holdout_shapes = [{{ n = 5 }}]
atol = 0.0
rtol = 0.0
bytes = "8*n"
flops = "n"
reference = {{ y = "x" }}
naive = "naive.cu"
optimized = []
"#
        ))
        .unwrap()
    }

    #[test]
    fn task_sets_follow_the_splits_table_for_families_without_sft_rows() {
        // row_sum had no validated kernel, so sft_generator (and TaskSet::load) knew it not.
        let ts = TaskSet {
            train: vec![spec("row_sum"), spec("gen_ew_000")],
            rl: vec![],
            test: vec![spec("row_max")],
            naive: BTreeMap::new(),
        };
        let mut map = cudarl_tables::splits::SplitMap::default();
        for (t, s) in [
            ("row_sum", "test"),
            ("gen_ew_000", "rl"),
            ("row_max", "test"),
        ] {
            map.families.insert(t.into(), s.into());
        }
        let out = ts.clone().follow_splits(&map).unwrap();
        let ids = |v: &[TaskSpec]| v.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&out.test), ["row_sum", "row_max"]);
        assert_eq!(ids(&out.rl), ["gen_ew_000"]);
        assert!(out.train.is_empty());
        map.families.remove("row_max");
        let e = ts.follow_splits(&map).unwrap_err();
        assert!(
            matches!(e, cudarl_data::DataError::BadInput { .. })
                && e.to_string().contains("synth/row_max"),
            "{e}"
        );
    }

    #[test]
    fn fresh_families_are_new_distinct_and_reproducible() {
        // A task set whose train, rl and hold-out splits are generated families: the draw
        // `fresh_families(_, _, 0)` would make without its exclusion, so each of its first 40
        // families must be replaced.
        let made = crate::families::generate(
            &crate::families::GenerateParams {
                elementwise: 60,
                row_reduce: 0,
                operators: 0,
                seed: FRESH_SALT,
            },
            &Default::default(),
        );
        let specs: Vec<TaskSpec> = made.into_iter().map(|f| f.spec).collect();
        let set = || TaskSet {
            train: specs[..40].to_vec(),
            rl: specs[40..50].to_vec(),
            test: specs[50..].to_vec(),
            naive: BTreeMap::from([("vector_add".to_string(), "// naive".to_string())]),
        };
        let mut ts = set();
        let fresh = fresh_families(&mut ts, 40, 0);
        assert_eq!(fresh.len(), 40);
        let known: BTreeSet<String> = specs
            .iter()
            .map(|t| crate::families::canonical(&t.reference["out"]))
            .collect();
        let mut seen = BTreeSet::new();
        for (i, f) in fresh.iter().enumerate() {
            assert_eq!(f.id, format!("fresh_ew_{i:03}"));
            assert_eq!(f.tier, 0);
            let c = crate::families::canonical(&f.reference["out"]);
            assert!(!known.contains(&c), "{} repeats a task: {c}", f.id);
            assert!(seen.insert(c), "{} repeats a fresh family", f.id);
            assert!(ts.naive[&f.id].contains("__global__"), "{}", f.id);
        }
        assert_eq!(ts.naive.len(), 41, "the task set's own kernels stay");
        // The same inputs give the same families; another seed other ones.
        let again = fresh_families(&mut set(), 40, 0);
        let refs = |v: &[TaskSpec]| -> Vec<String> {
            v.iter().map(|t| t.reference["out"].clone()).collect()
        };
        assert_eq!(refs(&again), refs(&fresh));
        assert_ne!(refs(&fresh_families(&mut set(), 40, 1)), refs(&fresh));
    }

    #[test]
    fn a_spec_that_does_not_parse_is_named_with_its_task() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tasks.parquet");
        let s = |x: &str| x.to_string();
        let row = cudarl_tables::tasks::TaskRow {
            task_id: s("row_sum"),
            tier: 1,
            description: s("row sums"),
            dtype: s("f32"),
            signature: s("extern \"C\" void launch(cudaStream_t stream)"),
            train_shapes: s("[]"),
            holdout_shapes: s("[]"),
            atol: 1e-5,
            rtol: 1e-4,
            bytes: s("0"),
            flops: s("0"),
            spec_json: s("{\"id\": 3}"),
            problem: s(""),
            group: s("row_sum"),
        };
        cudarl_tables::write(&p, &[row]).unwrap();
        let e = read_specs(&p).unwrap_err().to_string();
        assert!(
            e.contains("tasks.parquet: field `spec_json`: task `row_sum`"),
            "{e}"
        );
    }
}
