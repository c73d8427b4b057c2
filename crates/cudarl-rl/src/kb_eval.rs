//! The KernelBench problems `eval` runs (docs/architecture.md, "The default pipeline"): the
//! curriculum's `test` problems per level, with the ops of each that no training task uses
//! (transfer to new operators, `crates/cudarl-curriculum/src/ops.rs`), and the `train` problems
//! `rl-train` practised.

use std::collections::{BTreeMap, BTreeSet};

use crate::kb_judge::KbJudge;
use crate::kernelbench::KbTask;
use crate::report::{LevelOps, PRACTISED};

/// The KernelBench problems `eval` runs by split, their judge, and the ops of the hold-out
/// problems that no training task uses.
pub struct KbSet {
    /// `kernelbench/level{L}` ([`kb_split`]): the curriculum's `test` problems with a native
    /// launcher, per level; then, when `rl-train` practised any, [`PRACTISED`]: the `train`
    /// problems it practised.
    pub by_split: Vec<(&'static str, Vec<KbTask>)>,
    /// Their judge.
    pub judge: KbJudge,
    /// Per hold-out problem id, its ops that no training task uses
    /// ([`cudarl_curriculum::ops::OpCoverage::novel`] over [`training_ops`]; empty: covered).
    pub novel: BTreeMap<String, Vec<String>>,
}

impl KbSet {
    /// The summary's splits: one per level, then [`PRACTISED`] when it has problems.
    pub fn splits(&self) -> Vec<&'static str> {
        self.by_split.iter().map(|l| l.0).collect()
    }

    /// Whether hold-out problem `id` uses an op no training task uses.
    pub fn is_novel(&self, id: &str) -> bool {
        self.novel.get(id).is_some_and(|o| !o.is_empty())
    }

    /// Per level, its problems against the training tasks' ops (the report's sentence on them).
    pub fn level_ops(&self) -> Vec<LevelOps<'_>> {
        self.by_split
            .iter()
            .filter(|(split, _)| *split != PRACTISED)
            .map(|(split, tasks)| LevelOps {
                split,
                problems: tasks.len(),
                novel: tasks
                    .iter()
                    .filter_map(|t| {
                        let ops = self.novel.get(&t.id)?;
                        (!ops.is_empty()).then_some((t.id.as_str(), ops.as_slice()))
                    })
                    .collect(),
            })
            .collect()
    }
}

/// The ops the training tasks cover, in [`cudarl_curriculum::ops::op_names`]' vocabulary: the
/// task families not held out (the `train` and `rl` splits of `ts`, each through its
/// KernelBench-style source, [`cudarl_cuda::task::TaskSpec::problem_source`]) and the curriculum's KernelBench
/// `train` problems of `kb` (`(split, problem)`, launcher or not: the pretraining corpus holds
/// their references, SFT and `rl-train` draw on those with one).
pub fn training_ops(
    ts: &crate::tasks::TaskSet,
    kb: &[(String, KbTask)],
) -> cudarl_curriculum::ops::OpCoverage {
    let families: Vec<String> = ts
        .train
        .iter()
        .chain(&ts.rl)
        .map(cudarl_cuda::task::TaskSpec::problem_source)
        .collect();
    let problems = kb
        .iter()
        .filter(|(split, _)| split == "train")
        .map(|(_, t)| t.code.as_str());
    cudarl_curriculum::ops::OpCoverage::of(families.iter().map(String::as_str).chain(problems))
}

/// The split name of KernelBench level `level` in `summary` and `episodes`.
pub fn kb_split(level: i64) -> &'static str {
    match level {
        1 => "kernelbench/level1",
        2 => "kernelbench/level2",
        3 => "kernelbench/level3",
        4 => "kernelbench/level4",
        _ => "kernelbench",
    }
}

impl KbSet {
    /// The set of `all` (`(split, problem)`, the curriculum's KernelBench problems) that `judge`
    /// judges and that have a native launcher: the `test` problems per level, each with its
    /// ops no training task uses ([`training_ops`] of `ts` and `all`), then the `train`
    /// problems among `practised` as [`PRACTISED`].
    pub fn new(
        all: Vec<(String, KbTask)>,
        judge: KbJudge,
        ts: &crate::tasks::TaskSet,
        practised: &BTreeSet<String>,
    ) -> KbSet {
        let coverage = training_ops(ts, &all);
        let (mut by_level, mut trained, mut novel) = (BTreeMap::new(), Vec::new(), BTreeMap::new());
        for (split, t) in all {
            if t.signature.is_empty() || !judge.judges(&t.id) {
                continue;
            }
            match split.as_str() {
                "test" => {
                    novel.insert(t.id.clone(), coverage.novel(&t.code));
                    by_level
                        .entry(kb_split(t.level))
                        .or_insert_with(Vec::new)
                        .push(t);
                }
                "train" if practised.contains(&t.id) => trained.push(t),
                _ => {}
            }
        }
        let mut by_split: Vec<(&'static str, Vec<KbTask>)> = by_level.into_iter().collect();
        if !trained.is_empty() {
            by_split.push((PRACTISED, trained));
        }
        KbSet {
            by_split,
            judge,
            novel,
        }
    }
}
