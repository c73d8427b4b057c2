//! `curriculum`: tiers 0-3 and tier gates over KernelBench problems and the synthetic task
//! families, with their splits (drawn by the `splits` stage, [`crate::splits`]), archive-kernel
//! statistics, the task families' signatures, train and hold-out shapes, and the kernels our
//! harness validated (`validated_kernels`: correct on every seed and shape, with measured
//! speedups; empty without a GPU).

use std::collections::BTreeMap;

use cudarl_core::{
    ExternalFiles, InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext,
    StageError,
};
use cudarl_curriculum::{
    DEFAULT_MIN_COMPILE_RATE, DEFAULT_MIN_PASS_RATE, MAX_TIER, Split, TierDecision,
};
use cudarl_data::Table;
use cudarl_tables::TableRow;
use cudarl_tables::curriculum::{CurriculumRow, GateRow, ValidatedKernelRow};
use serde::{Deserialize, Serialize};

use crate::common::{data_err, single_file, write_output};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "curriculum";

fn d_compile() -> f64 {
    DEFAULT_MIN_COMPILE_RATE
}
fn d_pass() -> f64 {
    DEFAULT_MIN_PASS_RATE
}

/// Params of `curriculum`. The splits (and the KernelBench levels) are the `splits` stage's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Gate: compile rate on a tier must exceed this to open the next (docs/architecture.md, "Tiers
    /// and gates": 0.9).
    #[serde(default = "d_compile")]
    pub min_compile_rate: f64,
    /// Gate: pass rate on a tier must exceed this to open the next (docs/architecture.md, "Tiers
    /// and gates": 0.75).
    #[serde(default = "d_pass")]
    pub min_pass_rate: f64,
    /// Op category file, relative to the project root; its content is an input.
    #[serde(default, skip_serializing)]
    pub op_categories: Option<String>,
    /// Also read `validate-archive`'s verdicts of the archives' torch-format kernels (about a
    /// minute of nvcc per kernel): `validated_kernels` and `best_validated_speedup` then count
    /// them. Off in the main job, whose closure this would put them in; `make curriculum` sets it.
    #[serde(default)]
    pub archive: bool,
}

/// The stage.
#[derive(Debug)]
pub struct Curriculum {
    params: Params,
}

impl Curriculum {
    /// Default op category file.
    pub const OP_CATEGORIES: &'static str = cudarl_curriculum::tiers::OP_CATEGORIES;

    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params (the split params, `seed`, `train_fraction`, `val_fraction`,
    /// `levels`, `holdout_tasks`, `holdout_generated` and `rl_generated`, are `splits`').
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        Ok(Curriculum {
            params: crate::common::parse_params(t)?,
        })
    }
}

#[derive(Default)]
struct ArchiveStats {
    kernels: i64,
    claimed_correct: i64,
    best: Option<f64>,
    drift: bool,
}

fn add_kernels(
    path: &std::path::Path,
    name: &str,
    stats: &mut BTreeMap<String, ArchiveStats>,
) -> Result<(), StageError> {
    let t = Table::read(path, name).map_err(data_err)?;
    let pid = t.req_strings("problem_id").map_err(data_err)?;
    let ok = t.req_bools("claimed_correct").map_err(data_err)?;
    let sp = t.req_floats("claimed_speedup_native").map_err(data_err)?;
    let cu = t.req_bools("has_cuda_kernel").map_err(data_err)?;
    let m = t.req_bools("reference_matches_problem").map_err(data_err)?;
    for i in 0..t.rows() {
        let Some(p) = pid.get(i) else { continue };
        let s = stats.entry(p.to_string()).or_default();
        s.kernels += 1;
        if ok.get(i) == Some(true) {
            s.claimed_correct += 1;
            if cu.get(i) == Some(true)
                && let Some(v) = sp.get(i).filter(|v| v.is_finite())
            {
                s.best = Some(s.best.map_or(v, |b: f64| b.max(v)));
            }
        }
        if m.get(i) == Some(false) {
            s.drift = true;
        }
    }
    Ok(())
}

impl Stage for Curriculum {
    // Code versions:
    // 5: synthetic families split into train / rl / test (the hold-out), read by sft-data;
    // the archive's verdicts only with `archive`.
    // 6: the splits are the `splits` stage's (KernelBench stratified by level, families by
    // group).
    stage_identity!(KIND, 6);
    fn inputs(&self) -> Vec<InputDecl> {
        let mut v = vec![
            InputDecl::node("problems", "ingest-kernelbench", "problems"),
            InputDecl::node("splits", "splits", "splits"),
            InputDecl::node("sakana_kernels", "ingest-sakana", "kernels"),
            InputDecl::node("cuda_l1_kernels", "ingest-cuda-l1", "kernels"),
            InputDecl::node("tasks", "synth-tasks", "tasks"),
            InputDecl::node("validations", "validate", "validations"),
        ];
        if self.params.archive {
            v.push(InputDecl::node(
                "archive_validations",
                "validate-archive",
                "validations",
            ));
        }
        v.push(InputDecl::node("kb_specs", "kb-specs", "kb_specs"));
        v.push(InputDecl::external("op_categories"));
        v
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("curriculum", CurriculumRow::schema()),
            OutputDecl::table("gates", GateRow::schema()),
            OutputDecl::table("validated_kernels", ValidatedKernelRow::schema()),
        ]
    }
    fn resolve_external(
        &self,
        _input: &str,
        ctx: &ResolveContext,
    ) -> Result<ExternalFiles, StageError> {
        single_file(
            &ctx.root,
            self.params
                .op_categories
                .as_deref()
                .unwrap_or(Self::OP_CATEGORIES),
            "op categories",
        )
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let cat_name = self
            .params
            .op_categories
            .clone()
            .unwrap_or_else(|| Self::OP_CATEGORIES.into());
        let cats = crate::common::load_categories(ctx, &cat_name)?;

        let mut stats = BTreeMap::new();
        for input in ["sakana_kernels", "cuda_l1_kernels"] {
            if ctx.has_input(input) {
                let p = ctx.input_path(input)?.to_path_buf();
                add_kernels(&p, input, &mut stats)?;
            }
        }

        let mut b: Vec<CurriculumRow> = Vec::new();
        let validated = read_validated(ctx)?;
        // Native signatures of the covered KernelBench problems.
        let kb_sig: BTreeMap<String, String> = cudarl_tables::read::<
            cudarl_tables::kb_specs::KbSpecRow,
        >(ctx.input_path("kb_specs")?, "kb_specs")
        .map_err(data_err)?
        .into_iter()
        .filter_map(|r| Some((r.problem_id, r.signature?)))
        .collect();
        let problems = cudarl_tables::read::<cudarl_tables::problems::ProblemRow>(
            ctx.input_path("problems")?,
            "problems",
        )
        .map_err(data_err)?;
        let splits = cudarl_tables::splits::SplitMap::read(ctx.input_path("splits")?, "splits")
            .map_err(crate::common::data_err)?;
        let mut counts = [[0i64; 3]; (MAX_TIER + 1) as usize];
        for cudarl_tables::problems::ProblemRow {
            problem_id: id,
            level: lv,
            name: nm,
            op_features: feats,
            ..
        } in &problems
        {
            let (id, lv, nm) = (id.as_str(), *lv, nm.as_str());
            // Problems of the levels `splits` leaves out have no row.
            let Some(&split) = splits.kernelbench.get(id) else {
                continue;
            };
            let d = cats.decide(Some(lv), feats);
            counts[d.tier as usize][split as usize] += 1;
            let st = stats.remove(id).unwrap_or_default();
            let mine: Vec<&ValidatedRow> = validated.iter().filter(|v| v.task_id == id).collect();
            b.push(kernelbench_row(
                (id, lv, nm),
                (feats, &d, split),
                st,
                kb_sig.get(id),
                &mine,
            ));
        }
        let tasks =
            cudarl_tables::read::<cudarl_tables::tasks::TaskRow>(ctx.input_path("tasks")?, "tasks")
                .map_err(data_err)?;
        b.extend(synthetic_rows(&tasks, &validated, &mut counts, &splits)?);
        if !stats.is_empty() {
            ctx.warn(format!(
                "{} archive problem ids are not in the curriculum (other levels or unknown)",
                stats.len()
            ));
        }
        write_output(
            ctx,
            "curriculum",
            &cudarl_tables::to_batch(&b).map_err(data_err)?,
        )?;

        let gates = self.gates(&counts)?;
        write_output(ctx, "gates", &gates)?;

        let vk = validated_batch(&validated)?;
        if validated.is_empty() {
            ctx.warn(
                "validated_kernels is empty: no kernel was run on a GPU (compile-only validations)",
            );
        }
        write_output(ctx, "validated_kernels", &vk)
    }
}

impl Curriculum {
    /// The `gates` table: per tier, the compile and pass rates a stage must reach and the
    /// curriculum rows per split (`counts[tier]` = [train, val, test]).
    ///
    /// # Errors
    /// The batch does not match the schema (a bug).
    fn gates(&self, counts: &[[i64; 3]]) -> Result<arrow::record_batch::RecordBatch, StageError> {
        let rows: Vec<GateRow> = (0..=MAX_TIER)
            .zip(counts)
            .map(|(tier, c)| GateRow {
                tier,
                min_compile_rate: self.params.min_compile_rate,
                min_pass_rate: self.params.min_pass_rate,
                problems: c.iter().sum(),
                train: c[0],
                val: c[1],
                test: c[2],
            })
            .collect();
        cudarl_tables::to_batch(&rows).map_err(data_err)
    }
}

/// The `validated_kernels` table: every validation that counts, by synthetic task.
///
/// # Errors
/// The batch does not match the schema (a bug).
fn validated_batch(
    validated: &[ValidatedRow],
) -> Result<arrow::record_batch::RecordBatch, StageError> {
    let rows: Vec<ValidatedKernelRow> = validated
        .iter()
        .map(|v| ValidatedKernelRow {
            kernel_id: v.kernel_id.clone(),
            problem_id: format!("synth/{}", v.task_id),
            role: v.role.clone(),
            tests: v.tests,
            median_ms: v.median_ms,
            speedup_vs_naive: v.speedup_vs_naive,
            speedup_vs_torch: v.speedup_vs_torch,
            gpu: v.gpu.clone(),
        })
        .collect();
    cudarl_tables::to_batch(&rows).map_err(data_err)
}

/// The `curriculum` row of one KernelBench problem: (id, level, name), its op features with
/// the tier decided from them and its split, what the archives say of it (`st`), its native
/// signature (covered problems only) and its kernels validated on a GPU (`mine`; the best
/// `speedup_vs_torch` among them).
fn kernelbench_row(
    (id, lv, nm): (&str, i64, &str),
    (feats, d, split): (&[String], &TierDecision, Split),
    st: ArchiveStats,
    sig: Option<&String>,
    mine: &[&ValidatedRow],
) -> CurriculumRow {
    CurriculumRow {
        problem_id: id.to_string(),
        source: "kernelbench".into(),
        level: Some(lv),
        name: nm.to_string(),
        tier: d.tier,
        tier_reason: d.reason.clone(),
        op_features: feats.to_vec(),
        op_categories: d.categories.clone(),
        unknown_ops: d.unknown_ops.clone(),
        split: split.as_str().to_string(),
        archive_kernels: st.kernels,
        archive_claimed_correct: st.claimed_correct,
        archive_best_claimed_speedup: st.best,
        archive_reference_drift: st.drift,
        signature: sig.cloned(),
        train_shapes: None,
        holdout_shapes: None,
        validated_kernels: mine.len() as i64,
        best_validated_speedup: mine
            .iter()
            .filter_map(|v| v.speedup_vs_torch)
            .reduce(f64::max),
    }
}

/// The `curriculum` rows of the synthetic task families `tasks` (the `tasks` table): tier from
/// the spec, split from `splits` (`train`, `rl` or `test`; `rl` counts as train in `counts`),
/// hold-out shapes from the spec, the best speedup over naive among `validated`.
///
/// # Errors
/// A family has no row in `splits` (named).
fn synthetic_rows(
    tasks: &[cudarl_tables::tasks::TaskRow],
    validated: &[ValidatedRow],
    counts: &mut [[i64; 3]],
    splits: &cudarl_tables::splits::SplitMap,
) -> Result<Vec<CurriculumRow>, StageError> {
    let mut out = Vec::new();
    for t in tasks {
        let id = t.task_id.as_str();
        let tier = t.tier.clamp(0, MAX_TIER);
        let split = splits.family(id).map_err(data_err)?;
        counts[tier as usize][if split == "test" { 2 } else { 0 }] += 1;
        let mine: Vec<&ValidatedRow> = validated.iter().filter(|v| v.task_id == id).collect();
        out.push(CurriculumRow {
            problem_id: format!("synth/{id}"),
            source: "synthetic".into(),
            level: None,
            name: id.to_string(),
            tier,
            tier_reason: format!("task family tier (datasets/tasks/{id}/task.toml)"),
            op_features: Vec::new(),
            op_categories: Vec::new(),
            unknown_ops: Vec::new(),
            split: split.to_string(),
            archive_kernels: 0,
            archive_claimed_correct: 0,
            archive_best_claimed_speedup: None,
            archive_reference_drift: false,
            signature: Some(t.signature.clone()),
            train_shapes: Some(t.train_shapes.clone()),
            holdout_shapes: Some(t.holdout_shapes.clone()),
            validated_kernels: mine.len() as i64,
            best_validated_speedup: mine
                .iter()
                .filter_map(|v| v.speedup_vs_naive)
                .reduce(f64::max),
        });
    }
    Ok(out)
}

/// A validation that counts: executed, correct, every test passed, timed.
struct ValidatedRow {
    kernel_id: String,
    task_id: String,
    role: String,
    tests: i64,
    median_ms: f64,
    speedup_vs_naive: Option<f64>,
    speedup_vs_torch: Option<f64>,
    gpu: String,
}

/// The validated rows of the task kernels' and the archives' `validations` tables.
fn read_validated(ctx: &StageContext<'_>) -> Result<Vec<ValidatedRow>, StageError> {
    let mut out = Vec::new();
    for input in ["validations", "archive_validations"] {
        if ctx.has_input(input) {
            read_validated_table(ctx, input, &mut out)?;
        }
    }
    Ok(out)
}

fn read_validated_table(
    ctx: &StageContext<'_>,
    input: &str,
    out: &mut Vec<ValidatedRow>,
) -> Result<(), StageError> {
    let rows = cudarl_tables::read::<cudarl_tables::validate::ValidationRow>(
        ctx.input_path(input)?,
        input,
    )
    .map_err(data_err)?;
    for r in rows {
        let counts = r.executed && r.correct == Some(true) && r.tests > 0;
        let (true, Some(median_ms)) = (counts && r.tests_passed == r.tests, r.median_ms) else {
            continue;
        };
        out.push(ValidatedRow {
            kernel_id: r.kernel_id,
            task_id: r.task_id,
            role: r.role,
            tests: r.tests,
            median_ms,
            speedup_vs_naive: r.speedup_vs_naive,
            speedup_vs_torch: r.speedup_vs_torch,
            gpu: r.gpu.unwrap_or_default(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(extra: &str) -> Result<Curriculum, String> {
        Curriculum::from_table(toml::from_str(extra).unwrap()).map_err(|e| e.0)
    }

    #[test]
    fn the_split_params_are_the_splits_stages() {
        for key in [
            "seed = 7",
            "train_fraction = 0.8",
            "holdout_generated = 0.1",
        ] {
            let e = stage(key).unwrap_err();
            assert!(e.contains("unknown field"), "{key}: {e}");
        }
    }

    #[test]
    fn the_archives_verdicts_are_an_input_only_when_asked_for() {
        let names = |c: &Curriculum| -> Vec<String> {
            c.inputs().iter().map(|i| i.name.to_string()).collect()
        };
        assert!(!names(&stage("").unwrap()).contains(&"archive_validations".to_string()));
        assert!(
            names(&stage("archive = true").unwrap()).contains(&"archive_validations".to_string())
        );
    }
}
