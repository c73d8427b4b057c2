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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use cudarl_cuda::task::TaskSpec;
    use cudarl_curriculum::holdout::{Family, FamilySplit, HoldOut};
    use cudarl_data::Table;

    use super::*;

    /// The bundled task families (`datasets/tasks` and the generated families of
    /// `pipelines/default.toml`) and KernelBench problems (`datasets/kernelbench`), split as
    /// that pipeline's `splits` stage splits them: the task set and the KernelBench problems
    /// `(split, problem)`.
    fn bundled() -> (crate::tasks::TaskSet, Vec<(String, KbTask)>) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let pipeline: toml::Table =
            toml::from_str(&std::fs::read_to_string(root.join("pipelines/default.toml")).unwrap())
                .unwrap();
        let stage = |name: &str| pipeline["stages"][name].as_table().unwrap().clone();
        let tasks = cudarl_cuda::task::load_tasks(&root.join("datasets/tasks")).unwrap();
        let mut specs: Vec<TaskSpec> = tasks.iter().map(|t| t.spec.clone()).collect();
        let exclude = specs
            .iter()
            .flat_map(|s| s.reference.values().cloned())
            .collect();
        let generate: crate::families::GenerateParams =
            stage("synth-tasks")["generate"].clone().try_into().unwrap();
        let generated = crate::families::generate(&generate, &exclude);
        specs.extend(generated.into_iter().map(|f| f.spec));
        let holdout: HoldOut = stage("splits").try_into().unwrap();
        let families: Vec<Family<'_>> = specs
            .iter()
            .map(|s| Family {
                id: &s.id,
                group: s.group.as_deref(),
                generated: s.id.starts_with(crate::families::PREFIX),
            })
            .collect();
        let drawn = holdout.families(&families);
        let mut ts = crate::tasks::TaskSet::default();
        for ((_, split), spec) in drawn.into_iter().zip(specs) {
            match split {
                FamilySplit::Test => ts.test.push(spec),
                FamilySplit::Rl => ts.rl.push(spec),
                FamilySplit::Train => ts.train.push(spec),
            }
        }
        let kb = Table::read(
            &root.join("datasets/kernelbench/problems.parquet"),
            "problems",
        )
        .unwrap();
        let (level, name, code) = (
            kb.req_ints("level").unwrap(),
            kb.req_strings("name").unwrap(),
            kb.req_strings("code").unwrap(),
        );
        let problems: Vec<KbTask> = (0..kb.rows())
            .map(|i| KbTask {
                id: format!("kb/L{}/{}", level.get(i).unwrap(), name.get(i).unwrap()),
                tier: 0,
                level: level.get(i).unwrap(),
                name: name.get(i).unwrap().into(),
                code: code.get(i).unwrap().into(),
                signature: String::new(),
            })
            .collect();
        let ids: Vec<(String, i64)> = problems.iter().map(|p| (p.id.clone(), p.level)).collect();
        let drawn: BTreeMap<String, String> = holdout
            .kernelbench(&ids)
            .into_iter()
            .map(|(id, _, split)| (id.to_string(), split.as_str().to_string()))
            .collect();
        let kb = problems
            .into_iter()
            .filter_map(|p| Some((drawn.get(&p.id)?.clone(), p)))
            .collect();
        (ts, kb)
    }

    #[test]
    fn hold_out_problems_with_an_op_no_training_task_uses_are_novel_on_the_bundled_data() {
        let (ts, kb) = bundled();
        let cov = training_ops(&ts, &kb);
        let test = |id: &str| -> &KbTask {
            kb.iter()
                .find(|(s, t)| s == "test" && t.id == id)
                .map(|(_, t)| t)
                .unwrap_or_else(|| panic!("{id} is no hold-out problem"))
        };
        let novel = |id: &str| cov.novel(&test(id).code);
        // Ops no family and no KernelBench `train` problem uses.
        assert_eq!(novel("kb/L1/51_Argmax_over_a_dimension"), ["argmax"]);
        // Covered since the families have a cumprod.
        assert_eq!(novel("kb/L1/90_cumprod"), Vec::<String>::new());
        assert_eq!(
            novel("kb/L2/8_Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum"),
            ["adaptiveavgpool3d"]
        );
        // One vocabulary for both sides: the families' modules cover a problem that writes
        // its ops otherwise (`nn.Linear`, `torch.sigmoid`, `torch.sum`, `x - y`, ...).
        let families_only = training_ops(&ts, &[]);
        for id in [
            "kb/L1/20_LeakyReLU",
            "kb/L1/40_LayerNorm",
            "kb/L2/9_Matmul_Subtract_Multiply_ReLU",
            "kb/L2/56_Matmul_Sigmoid_Sum",
        ] {
            assert_eq!(
                families_only.novel(&test(id).code),
                Vec::<String>::new(),
                "{id}"
            );
        }
        // Families and KernelBench `train` problems both cover 2-D convolutions.
        let conv = &test("kb/L1/63_conv_standard_2D__square_input__square_kernel").code;
        assert_eq!(families_only.novel(conv), Vec::<String>::new());
        assert_eq!(cov.novel(conv), Vec::<String>::new());
        // Hold-out families and `val` and `test` problems are not training tasks: with them
        // counted, fewer hold-out problems would be novel, never more.
        let mut all = ts.clone();
        all.train.append(&mut all.test.clone());
        let everything: Vec<(String, KbTask)> = kb
            .iter()
            .map(|(_, t)| ("train".to_string(), t.clone()))
            .collect();
        let wide = training_ops(&all, &everything);
        assert!(cov.seen().is_subset(wide.seen()));
        assert!(
            wide.novel(&test("kb/L1/51_Argmax_over_a_dimension").code)
                .is_empty()
        );
        // The levels `kb-specs` gives launchers (1 and 2) have novel and seen problems: 2 of
        // level 1's 25 (triu, argmax; the exclusive cumulative sum families use `narrow`), 2 of
        // level 2's 25 (docs/architecture.md says so).
        assert!(
            cov.novel(&test("kb/L1/92_cumsum_exclusive").code)
                .is_empty(),
            "{:?}",
            cov.novel(&test("kb/L1/92_cumsum_exclusive").code)
        );
        for (level, want) in [(1, 2), (2, 2)] {
            let held: Vec<&KbTask> = kb
                .iter()
                .filter(|(s, t)| s == "test" && t.level == level)
                .map(|(_, t)| t)
                .collect();
            let n = held
                .iter()
                .filter(|t| !cov.novel(&t.code).is_empty())
                .count();
            assert_eq!((n, held.len()), (want, 25), "level {level}");
        }
    }
}
