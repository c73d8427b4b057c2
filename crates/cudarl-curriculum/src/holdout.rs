//! The hold-out draw: which KernelBench problems and which task families are held out
//! (docs/architecture.md, "Splits"). The `splits` stage draws it once, upstream of everything
//! that trains, and writes it as its `splits` table.
//!
//! - KernelBench problems: drawn at random by `seed`, stratified by level ([`stratified`]):
//!   within each level the first `round(n * test_fraction)` problems in the order of
//!   `unit_hash(problem_id, seed)` are `test`, the next `round(n * val_fraction)` `val`, the rest
//!   `train`.
//! - Task families: split by group, the template instance a generated family was drawn from
//!   (the family's group, else its task id), so every family of a group has the group's split: a
//!   group with a family named in `holdout_tasks` is `test`; a generated group is `test` when
//!   `hash_fraction(group) < holdout_generated`, `rl` when it is below `holdout_generated +
//!   rl_generated`, else `train`; other families are `train`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::sample::hash_fraction;
use crate::split::{Split, stratified};

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

/// What is held out and how it is drawn (the `splits` stage's params, `[stages.splits]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldOut {
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
    /// in `test`, by the BLAKE3 hash of the group ([`hash_fraction`]: stable as families are
    /// added).
    #[serde(default)]
    pub holdout_generated: f64,
    /// Share of the generated families' groups in `rl`: kept out of SFT and pretraining,
    /// practised by `rl-train` (hash in `[holdout_generated, holdout_generated +
    /// rl_generated)`, so the hold-out does not move when this changes).
    #[serde(default)]
    pub rl_generated: f64,
}

/// A task family as the draw sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family<'a> {
    /// Its task id.
    pub id: &'a str,
    /// The template instance it was drawn from (`TaskSpec::group`); `None`: its own group, by
    /// its id.
    pub group: Option<&'a str>,
    /// Whether it is generated (`synth-tasks`' `generate`, ids `gen_*`), and so may be drawn
    /// into `test` or `rl` by the hash of its group.
    pub generated: bool,
}

/// The split of a task family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FamilySplit {
    /// Trained on (SFT, pretraining, RL).
    Train,
    /// Kept out of SFT and pretraining, practised by RL.
    Rl,
    /// Held out (eval only).
    Test,
}

impl FamilySplit {
    /// Lowercase name, as the `splits` table writes it: `train`, `rl` or `test`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FamilySplit::Train => "train",
            FamilySplit::Rl => "rl",
            FamilySplit::Test => "test",
        }
    }
}

impl HoldOut {
    /// Checks the fractions.
    ///
    /// # Errors
    /// A message naming the offending fields: `test_fraction` or `val_fraction` outside
    /// [0, 1] or summing past 1, `holdout_generated` outside [0, 1), `rl_generated` negative or
    /// `holdout_generated + rl_generated` at least 1.
    pub fn check(&self) -> Result<(), String> {
        let (te, va) = (self.test_fraction, self.val_fraction);
        if !(0.0..=1.0).contains(&te) || !(0.0..=1.0).contains(&va) || te + va > 1.0 {
            return Err(format!(
                "test_fraction ({te}) and val_fraction ({va}) must be in [0, 1] and sum to at most 1"
            ));
        }
        if !(0.0..1.0).contains(&self.holdout_generated) {
            return Err("holdout_generated must be in [0, 1)".into());
        }
        if self.rl_generated < 0.0 || self.holdout_generated + self.rl_generated >= 1.0 {
            return Err(
                "rl_generated must be >= 0, with holdout_generated + rl_generated < 1".into(),
            );
        }
        Ok(())
    }

    /// The KernelBench problems (`(problem_id, level)`, in order) of the drawn levels, each
    /// with its split, drawn stratified by level: `(problem_id, level, split)` in the order of
    /// `problems`, problems of other levels left out.
    pub fn kernelbench<'a>(&self, problems: &'a [(String, i64)]) -> Vec<(&'a str, i64, Split)> {
        let kept: Vec<(&str, i64)> = problems
            .iter()
            .filter(|(_, lv)| self.levels.contains(lv))
            .map(|(id, lv)| (id.as_str(), *lv))
            .collect();
        let drawn = stratified(&kept, self.seed, self.test_fraction, self.val_fraction);
        kept.into_iter()
            .zip(drawn)
            .map(|((id, lv), s)| (id, lv, s))
            .collect()
    }

    /// The group and split of each of `families`, in order, split by group (see the module).
    pub fn families(&self, families: &[Family<'_>]) -> Vec<(String, FamilySplit)> {
        let group = |f: &Family<'_>| f.group.unwrap_or(f.id).to_string();
        let held: BTreeSet<String> = families
            .iter()
            .filter(|f| self.holdout_tasks.iter().any(|h| h == f.id))
            .map(group)
            .collect();
        families
            .iter()
            .map(|f| {
                let g = group(f);
                let u = hash_fraction(&g);
                let split = if held.contains(&g) || (f.generated && u < self.holdout_generated) {
                    FamilySplit::Test
                } else if f.generated && u < self.holdout_generated + self.rl_generated {
                    FamilySplit::Rl
                } else {
                    FamilySplit::Train
                };
                (g, split)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use cudarl_data::Table;

    use super::*;

    fn holdout(extra: &str) -> Result<HoldOut, String> {
        let h: HoldOut = toml::from_str(extra).map_err(|e| e.to_string())?;
        h.check()?;
        Ok(h)
    }

    /// `(id, group)` pairs as families, generated when the id starts with `gen_`.
    fn families<'a>(specs: &'a [(String, Option<String>)]) -> Vec<Family<'a>> {
        specs
            .iter()
            .map(|(id, group)| Family {
                id,
                group: group.as_deref(),
                generated: id.starts_with("gen_"),
            })
            .collect()
    }

    fn split_of(
        specs: &[(String, Option<String>)],
        rows: &[(String, FamilySplit)],
        task: &str,
    ) -> FamilySplit {
        let i = specs.iter().position(|(id, _)| id == task).unwrap();
        rows[i].1
    }

    #[test]
    fn families_split_into_train_rl_and_test_by_name_and_group_hash() {
        let c =
            holdout("holdout_tasks = [\"row_max\"]\nholdout_generated = 0.3\nrl_generated = 0.4")
                .unwrap();
        let mut specs: Vec<(String, Option<String>)> =
            vec![("row_max".into(), None), ("row_sum".into(), None)];
        specs.extend((0..400).map(|i| (format!("gen_{i}"), None)));
        let fams = families(&specs);
        let rows = c.families(&fams);
        assert_eq!(split_of(&specs, &rows, "row_max"), FamilySplit::Test);
        // Hand-written families other than the named ones always train.
        assert_eq!(split_of(&specs, &rows, "row_sum"), FamilySplit::Train);
        // Without a group, a family is its own group, hashed by its id (the splits drawn before
        // families had groups).
        let mut n = BTreeMap::new();
        for (id, _) in &specs[2..] {
            let u = hash_fraction(id);
            let want = if u < 0.3 {
                FamilySplit::Test
            } else if u < 0.7 {
                FamilySplit::Rl
            } else {
                FamilySplit::Train
            };
            assert_eq!(split_of(&specs, &rows, id), want, "{id} at {u}");
            *n.entry(want).or_insert(0) += 1;
        }
        assert_eq!(n.len(), 3, "{n:?}");
        // A larger RL share leaves the hold-out families where they were.
        let wider = holdout("holdout_generated = 0.3\nrl_generated = 0.6")
            .unwrap()
            .families(&fams);
        for (id, _) in &specs[2..] {
            assert_eq!(
                split_of(&specs, &rows, id) == FamilySplit::Test,
                split_of(&specs, &wider, id) == FamilySplit::Test
            );
        }
    }

    #[test]
    fn every_family_of_a_group_shares_its_split_and_no_holdout_group_trains() {
        let c = holdout("holdout_tasks = []\nholdout_generated = 0.3\nrl_generated = 0.3").unwrap();
        // 60 groups of 5 generated families each.
        let specs: Vec<(String, Option<String>)> = (0..300)
            .map(|i| (format!("gen_ew_{i:03}"), Some(format!("ew:g{}", i % 60))))
            .collect();
        let fams = families(&specs);
        let rows = c.families(&fams);
        let mut by_group: BTreeMap<&str, BTreeSet<FamilySplit>> = BTreeMap::new();
        for (g, s) in &rows {
            by_group.entry(g).or_default().insert(*s);
        }
        assert_eq!(by_group.len(), 60);
        assert!(by_group.values().all(|s| s.len() == 1), "{by_group:?}");
        for (g, s) in &by_group {
            let u = hash_fraction(g);
            let want = if u < 0.3 {
                FamilySplit::Test
            } else if u < 0.6 {
                FamilySplit::Rl
            } else {
                FamilySplit::Train
            };
            assert_eq!(s.first().copied(), Some(want), "{g} at {u}");
        }
        let splits: BTreeSet<FamilySplit> = rows.iter().map(|r| r.1).collect();
        assert_eq!(splits.len(), 3, "{splits:?}");
        // Naming one family holds out its whole group.
        let named = holdout("holdout_tasks = [\"gen_ew_007\"]").unwrap();
        let rows = named.families(&fams);
        for (g, s) in &rows {
            assert_eq!(*s == FamilySplit::Test, g == "ew:g7", "{g}: {s:?}");
        }
        assert_eq!(rows.iter().filter(|r| r.1 == FamilySplit::Test).count(), 5);
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
        let problems = bundled();
        let rows = holdout("").unwrap().kernelbench(&problems);
        let names = |lv: i64, split: Split| -> Vec<String> {
            let mut v: Vec<String> = rows
                .iter()
                .filter(|r| r.1 == lv && r.2 == split)
                .map(|r| r.0.rsplit('/').next().unwrap().to_string())
                .collect();
            v.sort();
            v
        };
        let sorted = |v: &[&str]| {
            let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
            v.sort();
            v
        };
        assert_eq!(names(1, Split::Test), sorted(&GOLDEN_L1_TEST));
        assert_eq!(names(1, Split::Val), sorted(&GOLDEN_L1_VAL));
        assert_eq!(names(3, Split::Test), sorted(&GOLDEN_L3_TEST));
        // 100, 100 and 50 problems: 25 / 10 / 65, 25 / 10 / 65, 13 / 5 / 32; level 4 has none.
        for (lv, t, v, tr) in [(1, 25, 10, 65), (2, 25, 10, 65), (3, 13, 5, 32)] {
            assert_eq!(
                (
                    names(lv, Split::Test).len(),
                    names(lv, Split::Val).len(),
                    names(lv, Split::Train).len()
                ),
                (t, v, tr),
                "level {lv}"
            );
        }
        assert!(rows.iter().all(|r| r.1 != 4));
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
        assert!(holdout("holdout_generated = 1.0").is_err());
        assert!(holdout("holdout_generated = 0.5\nrl_generated = 0.5").is_err());
        assert!(holdout("rl_generated = -0.1").is_err());
        assert!(holdout("holdout_generated = 0.5\nrl_generated = 0.4").is_ok());
        let e = holdout("test_fraction = 0.95").unwrap_err();
        assert!(e.contains("test_fraction"), "{e}");
        assert!(
            holdout("train_fraction = 0.8").is_err(),
            "the old key is refused"
        );
    }
}
