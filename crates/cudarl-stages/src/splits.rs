//! `splits`: which KernelBench problems and which synthetic task families are held out, drawn
//! once, upstream of everything that trains (docs/architecture.md, "Splits").
//!
//! It reads only `ingest-kernelbench`'s `problems` and `synth-tasks`' `tasks` (no verdicts), so
//! `tokenizer` and `pretrain`, which run beside `validate`, can leave the hold-out out of their
//! corpus; `curriculum` copies these splits into its `split` column, which `sft-data`, `eval` and
//! `archive-native` follow.
//!
//! - KernelBench problems: drawn at random by `seed`, stratified by level
//!   ([`cudarl_curriculum::split::stratified`]): within each level the first
//!   `round(n * test_fraction)` problems in the order of `unit_hash(problem_id, seed)` are
//!   `test`, the next `round(n * val_fraction)` `val`, the rest `train`.
//! - Task families: split by group, the template instance a generated family was drawn from
//!   (`TaskSpec::group`, else the task id), so every family of a group has the group's split: a
//!   group with a family named in `holdout_tasks` is `test`; a generated group (ids
//!   `gen_*`) is `test` when `hash_fraction(group) < holdout_generated`, `rl` when it is below
//!   `holdout_generated + rl_generated`, else `train`; other families are `train`.
//!
//! Its table, `splits`, is [`cudarl_tables::splits::SplitRow`]; readers use
//! [`cudarl_tables::splits::SplitMap`].

use std::collections::BTreeSet;

use cudarl_core::{InputDecl, OutputDecl, ParamsError, Stage, StageContext, StageError};
use cudarl_cuda::task::TaskSpec;
use cudarl_tables::TableRow;
use cudarl_tables::problems::ProblemRow;
use cudarl_tables::splits::SplitRow;
use serde::{Deserialize, Serialize};

use crate::common::{data_err, rl_err, write_rows};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "splits";

fn d_test() -> f64 {
    0.25
}
fn d_val() -> f64 {
    0.1
}
fn d_levels() -> Vec<i64> {
    vec![1, 2, 3]
}
fn d_holdout() -> Vec<String> {
    vec!["scalar_multiply".into(), "row_max".into()]
}

/// Params of `splits` (`[stages.splits]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// The seed of the KernelBench draw.
    #[serde(default)]
    pub seed: u64,
    /// Share of each level's KernelBench problems in `test` (rounded to a count per level).
    #[serde(default = "d_test")]
    pub test_fraction: f64,
    /// Share of each level's KernelBench problems in `val`; the rest is `train`.
    #[serde(default = "d_val")]
    pub val_fraction: f64,
    /// KernelBench levels split, and so in the curriculum (level 4 needs `transformers` and
    /// model downloads); problems of other levels have no row.
    #[serde(default = "d_levels")]
    pub levels: Vec<i64>,
    /// Task families in `test` (the hold-out families), with every family of their group.
    #[serde(default = "d_holdout")]
    pub holdout_tasks: Vec<String>,
    /// Share of the generated families' groups (ids `gen_*`, `synth-tasks`' `generate`) also
    /// in `test`, by the BLAKE3 hash of the group (`cudarl_curriculum::sample::hash_fraction`:
    /// stable as families are added).
    #[serde(default)]
    pub holdout_generated: f64,
    /// Share of the generated families' groups in `rl`: kept out of SFT and pretraining,
    /// practised by `rl-train` (hash in `[holdout_generated, holdout_generated +
    /// rl_generated)`, so the hold-out does not move when this changes).
    #[serde(default)]
    pub rl_generated: f64,
}

/// The stage.
#[derive(Debug)]
pub struct Splits {
    params: Params,
}

impl Splits {
    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params, fractions out of range.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        let (te, va) = (params.test_fraction, params.val_fraction);
        if !(0.0..=1.0).contains(&te) || !(0.0..=1.0).contains(&va) || te + va > 1.0 {
            return Err(format!(
                "test_fraction ({te}) and val_fraction ({va}) must be in [0, 1] and sum to at most 1"
            ).into());
        }
        if !(0.0..1.0).contains(&params.holdout_generated) {
            return Err("holdout_generated must be in [0, 1)".into());
        }
        if params.rl_generated < 0.0 || params.holdout_generated + params.rl_generated >= 1.0 {
            return Err(
                "rl_generated must be >= 0, with holdout_generated + rl_generated < 1".into(),
            );
        }
        Ok(Splits { params })
    }

    /// The rows of the KernelBench problems (`(problem_id, level)`, in order) of the split's
    /// levels, drawn stratified by level.
    pub fn kernelbench(&self, problems: &[(String, i64)]) -> Vec<SplitRow> {
        let p = &self.params;
        let kept: Vec<(&str, i64)> = problems
            .iter()
            .filter(|(_, lv)| p.levels.contains(lv))
            .map(|(id, lv)| (id.as_str(), *lv))
            .collect();
        let drawn =
            cudarl_curriculum::split::stratified(&kept, p.seed, p.test_fraction, p.val_fraction);
        kept.iter()
            .zip(drawn)
            .map(|((id, lv), s)| SplitRow {
                item_id: id.to_string(),
                source: "kernelbench".into(),
                level: Some(*lv),
                group: id.to_string(),
                split: s.as_str().into(),
            })
            .collect()
    }

    /// The rows of the task families of `specs`, in order, split by group (see the module).
    pub fn families(&self, specs: &[TaskSpec]) -> Vec<SplitRow> {
        let p = &self.params;
        let group = |s: &TaskSpec| s.group.clone().unwrap_or_else(|| s.id.clone());
        let held: BTreeSet<String> = specs
            .iter()
            .filter(|s| p.holdout_tasks.contains(&s.id))
            .map(group)
            .collect();
        specs
            .iter()
            .map(|s| {
                let g = group(s);
                let generated = s.id.starts_with(cudarl_rl::families::PREFIX);
                let u = cudarl_curriculum::sample::hash_fraction(&g);
                let split = if held.contains(&g) || (generated && u < p.holdout_generated) {
                    "test"
                } else if generated && u < p.holdout_generated + p.rl_generated {
                    "rl"
                } else {
                    "train"
                };
                SplitRow {
                    item_id: format!("synth/{}", s.id),
                    source: "synthetic".into(),
                    level: None,
                    group: g,
                    split: split.into(),
                }
            })
            .collect()
    }
}

impl Stage for Splits {
    stage_identity!(KIND, 1);
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            InputDecl::node("problems", "ingest-kernelbench", "problems"),
            InputDecl::node("tasks", "synth-tasks", "tasks"),
        ]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![OutputDecl::table("splits", SplitRow::schema())]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let problems: Vec<(String, i64)> =
            cudarl_tables::read::<ProblemRow>(ctx.input_path("problems")?, "problems")
                .map_err(data_err)?
                .into_iter()
                .map(|r| (r.problem_id, r.level))
                .collect();
        let specs = cudarl_rl::tasks::read_specs(ctx.input_path("tasks")?).map_err(rl_err)?;
        let unknown: Vec<&str> = self
            .params
            .holdout_tasks
            .iter()
            .filter(|h| !specs.iter().any(|s| &s.id == *h))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            ctx.warn(format!(
                "holdout_tasks names no task family of `tasks`: {}",
                unknown.join(", ")
            ));
        }
        let mut rows = self.kernelbench(&problems);
        rows.extend(self.families(&specs));
        let count = |src: &str, split: &str| {
            rows.iter()
                .filter(|r| r.source == src && r.split == split)
                .count()
        };
        ctx.note(&format!(
            "KernelBench: {} train, {} val, {} test; task families: {} train, {} rl, {} test",
            count("kernelbench", "train"),
            count("kernelbench", "val"),
            count("kernelbench", "test"),
            count("synthetic", "train"),
            count("synthetic", "rl"),
            count("synthetic", "test"),
        ));
        write_rows(ctx, "splits", &SplitRow::schema(), &rows)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use cudarl_data::Table;

    use super::*;

    fn stage(extra: &str) -> Result<Splits, String> {
        Splits::from_table(toml::from_str(extra).unwrap()).map_err(|e| e.0)
    }

    fn spec(id: &str, group: Option<&str>) -> TaskSpec {
        let mut s: TaskSpec = toml::from_str(&format!(
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
        .unwrap();
        s.group = group.map(str::to_string);
        s
    }

    fn split_of<'a>(rows: &'a [SplitRow], task: &str) -> &'a str {
        let id = format!("synth/{task}");
        &rows.iter().find(|r| r.item_id == id).unwrap().split
    }

    #[test]
    fn families_split_into_train_rl_and_test_by_name_and_group_hash() {
        let c = stage("holdout_tasks = [\"row_max\"]\nholdout_generated = 0.3\nrl_generated = 0.4")
            .unwrap();
        let prefix = cudarl_rl::families::PREFIX;
        let mut specs = vec![spec("row_max", None), spec("row_sum", None)];
        specs.extend((0..400).map(|i| spec(&format!("{prefix}{i}"), None)));
        let rows = c.families(&specs);
        assert_eq!(split_of(&rows, "row_max"), "test");
        // Hand-written families other than the named ones always train.
        assert_eq!(split_of(&rows, "row_sum"), "train");
        // Without a group, a family is its own group, hashed by its id (the splits drawn before
        // families had groups).
        let mut n = BTreeMap::new();
        for s in &specs[2..] {
            let u = cudarl_curriculum::sample::hash_fraction(&s.id);
            let want = if u < 0.3 {
                "test"
            } else if u < 0.7 {
                "rl"
            } else {
                "train"
            };
            assert_eq!(split_of(&rows, &s.id), want, "{} at {u}", s.id);
            *n.entry(want).or_insert(0) += 1;
        }
        assert_eq!(n.len(), 3, "{n:?}");
        // A larger RL share leaves the hold-out families where they were.
        let wider = stage("holdout_generated = 0.3\nrl_generated = 0.6")
            .unwrap()
            .families(&specs);
        for s in &specs[2..] {
            assert_eq!(
                split_of(&rows, &s.id) == "test",
                split_of(&wider, &s.id) == "test"
            );
        }
    }

    #[test]
    fn every_family_of_a_group_shares_its_split_and_no_holdout_group_trains() {
        let c = stage("holdout_tasks = []\nholdout_generated = 0.3\nrl_generated = 0.3").unwrap();
        let prefix = cudarl_rl::families::PREFIX;
        // 60 groups of 5 generated families each.
        let specs: Vec<TaskSpec> = (0..300)
            .map(|i| {
                spec(
                    &format!("{prefix}ew_{i:03}"),
                    Some(&format!("ew:g{}", i % 60)),
                )
            })
            .collect();
        let rows = c.families(&specs);
        let mut by_group: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for r in &rows {
            by_group.entry(&r.group).or_default().insert(&r.split);
        }
        assert_eq!(by_group.len(), 60);
        assert!(by_group.values().all(|s| s.len() == 1), "{by_group:?}");
        for (g, s) in &by_group {
            let u = cudarl_curriculum::sample::hash_fraction(g);
            let want = if u < 0.3 {
                "test"
            } else if u < 0.6 {
                "rl"
            } else {
                "train"
            };
            assert_eq!(s.first().copied(), Some(want), "{g} at {u}");
        }
        let splits: BTreeSet<&str> = rows.iter().map(|r| r.split.as_str()).collect();
        assert_eq!(splits.len(), 3, "{splits:?}");
        // Naming one family holds out its whole group.
        let named = stage("holdout_tasks = [\"gen_ew_007\"]").unwrap();
        let rows = named.families(&specs);
        for r in &rows {
            assert_eq!(r.split == "test", r.group == "ew:g7", "{r:?}");
        }
        assert_eq!(rows.iter().filter(|r| r.split == "test").count(), 5);
    }

    /// The bundled KernelBench problems, as `ingest-kernelbench` names them.
    fn bundled() -> Vec<(String, i64)> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../datasets/kernelbench/problems.parquet");
        let t = Table::read(&path, "problems").unwrap();
        let (lv, name) = (t.req_ints("level").unwrap(), t.req_strings("name").unwrap());
        (0..t.rows())
            .map(|i| {
                let l = lv.get(i).unwrap();
                (
                    cudarl_data::kernelbench::problem_id(l, name.get(i).unwrap()),
                    l,
                )
            })
            .collect()
    }

    #[test]
    fn golden_kernelbench_holdout_of_the_bundled_problems() {
        // Pinned so a split never changes silently (it would move test problems into train).
        // Computed independently: per level, ids sorted by
        // int.from_bytes(blake3(struct.pack("<Q", 0) + id).digest()[:8], "big") / 2**64, the
        // first floor(n * 0.25 + 0.5) test, the next floor(n * 0.1 + 0.5) val.
        let rows = stage("").unwrap().kernelbench(&bundled());
        let names = |lv: i64, split: &str| -> Vec<String> {
            let mut v: Vec<String> = rows
                .iter()
                .filter(|r| r.level == Some(lv) && r.split == split)
                .map(|r| r.item_id.rsplit('/').next().unwrap().to_string())
                .collect();
            v.sort();
            v
        };
        let sorted = |v: &[&str]| {
            let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
            v.sort();
            v
        };
        assert_eq!(names(1, "test"), sorted(&GOLDEN_L1_TEST));
        assert_eq!(names(1, "val"), sorted(&GOLDEN_L1_VAL));
        assert_eq!(names(3, "test"), sorted(&GOLDEN_L3_TEST));
        // 100, 100 and 50 problems: 25 / 10 / 65, 25 / 10 / 65, 13 / 5 / 32; level 4 has none.
        for (lv, t, v, tr) in [(1, 25, 10, 65), (2, 25, 10, 65), (3, 13, 5, 32)] {
            assert_eq!(
                (
                    names(lv, "test").len(),
                    names(lv, "val").len(),
                    names(lv, "train").len()
                ),
                (t, v, tr),
                "level {lv}"
            );
        }
        assert!(rows.iter().all(|r| r.level != Some(4)));
        assert!(rows.iter().all(|r| r.group == r.item_id));
    }

    const GOLDEN_L1_TEST: [&str; 25] = [
        "89_cumsum",
        "3_Batched_matrix_multiplication",
        "81_conv_transposed_2D_asymmetric_input_square_kernel___dilated____padded____strided__",
        "86_conv_depthwise_separable_2D",
        "42_Max_Pooling_2D",
        "2_Standard_matrix_multiplication_",
        "47_Sum_reduction_over_a_dimension",
        "51_Argmax_over_a_dimension",
        "63_conv_standard_2D__square_input__square_kernel",
        "20_LeakyReLU",
        "11_4D_tensor_matrix_multiplication",
        "84_conv_depthwise_2D_asymmetric_input_square_kernel",
        "98_KLDivLoss",
        "92_cumsum_exclusive",
        "40_LayerNorm",
        "67_conv_standard_1D",
        "65_conv_transposed_2D__square_input__asymmetric_kernel",
        "14_Matmul_for_upper_triangular_matrices",
        "55_conv_standard_2D__asymmetric_input__square_kernel",
        "66_conv_standard_3D__asymmetric_input__asymmetric_kernel",
        "90_cumprod",
        "17_Matmul_with_transposed_B",
        "29_Softplus",
        "45_Average_Pooling_2D",
        "82_conv_depthwise_2D_square_input_square_kernel",
    ];

    const GOLDEN_L1_VAL: [&str; 10] = [
        "88_MinGPTNewGelu",
        "62_conv_standard_2D__square_input__asymmetric_kernel",
        "71_conv_transposed_2D__asymmetric_input__square_kernel",
        "16_Matmul_with_transposed_A",
        "37_FrobeniusNorm_",
        "77_conv_transposed_3D_square_input_square_kernel___padded____dilated____strided__",
        "76_conv_standard_1D_dilated_strided__",
        "60_conv_standard_3D__square_input__asymmetric_kernel",
        "10_3D_tensor_matrix_multiplication",
        "15_Matmul_for_lower_triangular_matrices",
    ];

    const GOLDEN_L3_TEST: [&str; 13] = [
        "50_ReLUSelfAttention",
        "8_ResNetBasicBlock",
        "47_NetVladNoGhostClusters",
        "34_VanillaRNNHidden",
        "21_EfficientNetMBConv",
        "4_LeNet5",
        "44_MiniGPTBlock",
        "39_GRU",
        "28_VisionTransformer",
        "40_GRUHidden",
        "45_UNetSoftmax",
        "48_Mamba2ReturnY",
        "41_GRUBidirectional",
    ];

    #[test]
    fn split_fractions_out_of_range_are_refused() {
        assert!(stage("holdout_generated = 1.0").is_err());
        assert!(stage("holdout_generated = 0.5\nrl_generated = 0.5").is_err());
        assert!(stage("rl_generated = -0.1").is_err());
        assert!(stage("holdout_generated = 0.5\nrl_generated = 0.4").is_ok());
        let e = stage("test_fraction = 0.95").unwrap_err();
        assert!(e.contains("test_fraction"), "{e}");
        assert!(
            stage("train_fraction = 0.8").is_err(),
            "the old key is refused"
        );
    }

    #[test]
    fn rl_task_sets_follow_the_splits_table_for_families_without_sft_rows() {
        use cudarl_rl::tasks::TaskSet;
        // row_sum had no validated kernel, so sft_generator (and TaskSet::load) knew it not.
        let ts = TaskSet {
            train: vec![spec("row_sum", None), spec("gen_ew_000", None)],
            rl: vec![],
            test: vec![spec("row_max", None)],
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
        let out = crate::rl_params::follow_splits(ts.clone(), &map).unwrap();
        let ids = |v: &[TaskSpec]| v.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&out.test), ["row_sum", "row_max"]);
        assert_eq!(ids(&out.rl), ["gen_ew_000"]);
        assert!(out.train.is_empty());
        map.families.remove("row_max");
        let e = crate::rl_params::follow_splits(ts, &map).unwrap_err();
        assert!(
            e.is_bad_input() && e.to_string().contains("synth/row_max"),
            "{e}"
        );
    }
}
