//! `curriculum`: tiers 0-3 and tier gates over KernelBench problems and the synthetic task
//! families, with their splits (drawn by the `splits` stage, [`crate::splits`]), archive-kernel
//! statistics, the task families' signatures, train and hold-out shapes, and the kernels our
//! harness validated (`validated_kernels`: correct on every seed and shape, with measured
//! speedups; empty without a GPU).

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, ListBuilder, StringBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{
    ExternalFiles, InputDecl, OutputDecl, ResolveContext, Stage, StageContext, StageError,
};
use cudarl_curriculum::{
    DEFAULT_MIN_COMPILE_RATE, DEFAULT_MIN_PASS_RATE, MAX_TIER, Split, TierDecision,
};
use cudarl_data::Table;
use serde::{Deserialize, Serialize};

use crate::common::{data_err, params_json, single_file, write_output};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "curriculum";

fn list_of_str() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)))
}

/// `curriculum`: one row per problem.
///
/// | column | type | meaning |
/// |---|---|---|
/// | problem_id | utf8 | `kb/L{level}/{name}` |
/// | source | utf8 | `kernelbench` or `synthetic` (`problem_id` = `synth/<task>`) |
/// | level | int64, nullable | KernelBench level |
/// | name | utf8 | problem name |
/// | tier | int64 | 0 elementwise, 1 reduction/data movement, 2 tiled/normalizing, 3 fused |
/// | tier_reason | utf8 | why this tier |
/// | op_features | `list<utf8>` | ops from the reference |
/// | op_categories | `list<utf8>` | categories of those ops |
/// | unknown_ops | `list<utf8>` | ops with no category (tiered conservatively) |
/// | split | utf8 | the `splits` table's: `train`, `val` or `test`; synthetic families `train`, `rl` (kept out of SFT and pretraining for `rl-train`) or `test` (the hold-out families) |
/// | archive_kernels | int64 | kernels for this problem in the ingested archives |
/// | archive_claimed_correct | int64 | of those, claimed correct by their archive |
/// | archive_best_claimed_speedup | float64, nullable | best claimed speedup vs PyTorch eager among claimed-correct kernels with a `__global__` kernel (ratio; not yet validated by us) |
/// | archive_reference_drift | bool | some archive kernel was written against a different reference than `problems.code` |
/// | signature | utf8, nullable | the native launcher of a synthetic task, or of a KernelBench problem covered by `kb-specs` |
/// | train_shapes, holdout_shapes | utf8, nullable | JSON lists of size maps (synthetic tasks: hold-out shapes are never shown in prompts) |
/// | validated_kernels | int64 | kernels of this problem our harness ran and found correct on every seed and shape |
/// | best_validated_speedup | float64, nullable | best measured speedup among them: vs the naive kernel (synthetic tasks), vs torch eager (KernelBench problems) |
pub static CURRICULUM: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("problem_id", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("level", DataType::Int64, true),
        Field::new("name", DataType::Utf8, false),
        Field::new("tier", DataType::Int64, false),
        Field::new("tier_reason", DataType::Utf8, false),
        Field::new("op_features", list_of_str(), false),
        Field::new("op_categories", list_of_str(), false),
        Field::new("unknown_ops", list_of_str(), false),
        Field::new("split", DataType::Utf8, false),
        Field::new("archive_kernels", DataType::Int64, false),
        Field::new("archive_claimed_correct", DataType::Int64, false),
        Field::new("archive_best_claimed_speedup", DataType::Float64, true),
        Field::new("archive_reference_drift", DataType::Boolean, false),
        Field::new("signature", DataType::Utf8, true),
        Field::new("train_shapes", DataType::Utf8, true),
        Field::new("holdout_shapes", DataType::Utf8, true),
        Field::new("validated_kernels", DataType::Int64, false),
        Field::new("best_validated_speedup", DataType::Float64, true),
    ]))
});

/// `gates`: one row per tier: the thresholds that open the next tier, and problem counts.
///
/// | column | type | meaning |
/// |---|---|---|
/// | tier | int64 | 0..3 |
/// | min_compile_rate | float64 | compile rate on this tier must exceed this to open tier+1 |
/// | min_pass_rate | float64 | pass rate on this tier must exceed this to open tier+1 |
/// | problems, train, val, test | int64 | problem counts |
pub static GATES: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("tier", DataType::Int64, false),
        Field::new("min_compile_rate", DataType::Float64, false),
        Field::new("min_pass_rate", DataType::Float64, false),
        Field::new("problems", DataType::Int64, false),
        Field::new("train", DataType::Int64, false),
        Field::new("val", DataType::Int64, false),
        Field::new("test", DataType::Int64, false),
    ]))
});

/// `validated_kernels`: one row per kernel the harness ran and found correct on every train and
/// hold-out shape and every public and hidden seed (empty without a GPU: compile-only verdicts
/// validate nothing).
///
/// | column | type | meaning |
/// |---|---|---|
/// | kernel_id | utf8 | BLAKE3 of the code |
/// | problem_id | utf8 | curriculum row (`synth/<task>`) |
/// | role | utf8 | `naive` or `optimized` |
/// | tests | int64 | shapes x seeds run (all passed) |
/// | median_ms | float64 | candidate median |
/// | speedup_vs_naive, speedup_vs_torch | float64, nullable | measured ratios |
/// | gpu | utf8 | the GPU |
pub static VALIDATED_KERNELS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("kernel_id", DataType::Utf8, false),
        Field::new("problem_id", DataType::Utf8, false),
        Field::new("role", DataType::Utf8, false),
        Field::new("tests", DataType::Int64, false),
        Field::new("median_ms", DataType::Float64, false),
        Field::new("speedup_vs_naive", DataType::Float64, true),
        Field::new("speedup_vs_torch", DataType::Float64, true),
        Field::new("gpu", DataType::Utf8, false),
    ]))
});

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
    pub fn from_table(t: toml::Table) -> Result<Self, String> {
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
    fn kind(&self) -> &str {
        KIND
    }
    fn code_version(&self) -> u32 {
        // 5: synthetic families split into train / rl / test (the hold-out), read by sft-data;
        // the archive's verdicts only with `archive`.
        // 6: the splits are the `splits` stage's (KernelBench stratified by level, families by
        // group).
        6
    }
    fn params(&self) -> serde_json::Value {
        params_json(&self.params)
    }
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
            OutputDecl::table("curriculum", CURRICULUM.clone()),
            OutputDecl::table("gates", GATES.clone()),
            OutputDecl::table("validated_kernels", VALIDATED_KERNELS.clone()),
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

        let mut b = Columns::new();
        let validated = read_validated(ctx)?;
        // Native signatures of the covered KernelBench problems.
        let kb_sig: BTreeMap<String, String> = {
            let st = Table::read(ctx.input_path("kb_specs")?, "kb_specs").map_err(data_err)?;
            let (sid, ssig) = (
                st.req_strings("problem_id").map_err(data_err)?,
                st.req_strings("signature").map_err(data_err)?,
            );
            (0..st.rows())
                .filter_map(|i| Some((sid.get(i)?.to_string(), ssig.get(i)?.to_string())))
                .collect()
        };
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
            b.kernelbench((id, lv, nm), (feats, &d, split), st, kb_sig.get(id), &mine);
        }
        let tt = Table::read(ctx.input_path("tasks")?, "tasks").map_err(data_err)?;
        b.synthetic(&tt, &validated, &mut counts, &splits)?;
        if !stats.is_empty() {
            ctx.warn(format!(
                "{} archive problem ids are not in the curriculum (other levels or unknown)",
                stats.len()
            ));
        }
        let schema = CURRICULUM.clone();
        let cols = b.finish(&schema);
        let batch = cudarl_data::parquet_io::batch(&schema, cols).map_err(data_err)?;
        write_output(ctx, "curriculum", &batch)?;

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
        let tiers: Vec<i64> = (0..=MAX_TIER).collect();
        let gcols: Vec<ArrayRef> = vec![
            Arc::new(arrow::array::Int64Array::from(tiers.clone())),
            Arc::new(arrow::array::Float64Array::from(vec![
                self.params
                    .min_compile_rate;
                tiers.len()
            ])),
            Arc::new(arrow::array::Float64Array::from(vec![
                self.params
                    .min_pass_rate;
                tiers.len()
            ])),
            Arc::new(arrow::array::Int64Array::from(
                counts.iter().map(|c| c.iter().sum()).collect::<Vec<i64>>(),
            )),
            Arc::new(arrow::array::Int64Array::from(
                counts.iter().map(|c| c[0]).collect::<Vec<i64>>(),
            )),
            Arc::new(arrow::array::Int64Array::from(
                counts.iter().map(|c| c[1]).collect::<Vec<i64>>(),
            )),
            Arc::new(arrow::array::Int64Array::from(
                counts.iter().map(|c| c[2]).collect::<Vec<i64>>(),
            )),
        ];
        cudarl_data::parquet_io::batch(&GATES.clone(), gcols).map_err(data_err)
    }
}

/// The `validated_kernels` table: every validation that counts, by synthetic task.
///
/// # Errors
/// The batch does not match the schema (a bug).
fn validated_batch(
    validated: &[ValidatedRow],
) -> Result<arrow::record_batch::RecordBatch, StageError> {
    use arrow::array::{Float64Array, Int64Array, StringArray};
    cudarl_data::parquet_io::batch(
        &VALIDATED_KERNELS.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(
                validated.iter().map(|v| v.kernel_id.clone()),
            )),
            Arc::new(StringArray::from_iter_values(
                validated.iter().map(|v| format!("synth/{}", v.task_id)),
            )),
            Arc::new(StringArray::from_iter_values(
                validated.iter().map(|v| v.role.clone()),
            )),
            Arc::new(Int64Array::from_iter_values(
                validated.iter().map(|v| v.tests),
            )),
            Arc::new(Float64Array::from_iter_values(
                validated.iter().map(|v| v.median_ms),
            )),
            Arc::new(Float64Array::from(
                validated
                    .iter()
                    .map(|v| v.speedup_vs_naive)
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Float64Array::from(
                validated
                    .iter()
                    .map(|v| v.speedup_vs_torch)
                    .collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from_iter_values(
                validated.iter().map(|v| v.gpu.clone()),
            )),
        ],
    )
    .map_err(data_err)
}

/// The `curriculum` table's columns, one builder per column in schema order.
struct Columns {
    id: StringBuilder,
    src: StringBuilder,
    level: Int64Builder,
    name: StringBuilder,
    tier: Int64Builder,
    reason: StringBuilder,
    feats: ListBuilder<StringBuilder>,
    cats: ListBuilder<StringBuilder>,
    unknown: ListBuilder<StringBuilder>,
    split: StringBuilder,
    ak: Int64Builder,
    acc: Int64Builder,
    best: Float64Builder,
    drift: BooleanBuilder,
    sig: StringBuilder,
    train: StringBuilder,
    hold: StringBuilder,
    nval: Int64Builder,
    bestv: Float64Builder,
}

impl Columns {
    fn new() -> Columns {
        Columns {
            id: StringBuilder::new(),
            src: StringBuilder::new(),
            level: Int64Builder::new(),
            name: StringBuilder::new(),
            tier: Int64Builder::new(),
            reason: StringBuilder::new(),
            feats: ListBuilder::new(StringBuilder::new()),
            cats: ListBuilder::new(StringBuilder::new()),
            unknown: ListBuilder::new(StringBuilder::new()),
            split: StringBuilder::new(),
            ak: Int64Builder::new(),
            acc: Int64Builder::new(),
            best: Float64Builder::new(),
            drift: BooleanBuilder::new(),
            sig: StringBuilder::new(),
            train: StringBuilder::new(),
            hold: StringBuilder::new(),
            nval: Int64Builder::new(),
            bestv: Float64Builder::new(),
        }
    }

    /// Appends one KernelBench problem: (id, level, name), its op features with the tier
    /// decided from them and its split, what the archives say of it (`st`), its native
    /// signature (covered problems only) and its kernels validated on a GPU (`mine`; the best
    /// `speedup_vs_torch` among them).
    fn kernelbench(
        &mut self,
        (id, lv, nm): (&str, i64, &str),
        (feats, d, split): (&[String], &TierDecision, Split),
        st: ArchiveStats,
        sig: Option<&String>,
        mine: &[&ValidatedRow],
    ) {
        self.id.append_value(id);
        self.src.append_value("kernelbench");
        self.level.append_value(lv);
        self.name.append_value(nm);
        self.tier.append_value(d.tier);
        self.reason.append_value(&d.reason);
        for f in feats {
            self.feats.values().append_value(f);
        }
        self.feats.append(true);
        for c in &d.categories {
            self.cats.values().append_value(c);
        }
        self.cats.append(true);
        for u in &d.unknown_ops {
            self.unknown.values().append_value(u);
        }
        self.unknown.append(true);
        self.split.append_value(split.as_str());
        self.ak.append_value(st.kernels);
        self.acc.append_value(st.claimed_correct);
        self.best.append_option(st.best);
        self.drift.append_value(st.drift);
        self.sig.append_option(sig);
        self.train.append_null();
        self.hold.append_null();
        self.nval.append_value(mine.len() as i64);
        self.bestv.append_option(
            mine.iter()
                .filter_map(|v| v.speedup_vs_torch)
                .reduce(f64::max),
        );
    }

    /// Appends the synthetic task families of `tt` (the `tasks` table): tier from the spec,
    /// split from `splits` (`train`, `rl` or `test`; `rl` counts as train in `counts`), hold-out
    /// shapes from the spec, the best speedup over naive among `validated`.
    ///
    /// # Errors
    /// A required column of `tasks` is missing or has the wrong type, or a family has no row in
    /// `splits` (named).
    fn synthetic(
        &mut self,
        tt: &Table,
        validated: &[ValidatedRow],
        counts: &mut [[i64; 3]],
        splits: &cudarl_tables::splits::SplitMap,
    ) -> Result<(), StageError> {
        let (tid, ttier) = (
            tt.req_strings("task_id").map_err(data_err)?,
            tt.req_ints("tier").map_err(data_err)?,
        );
        let (tsig, ttrain, thold) = (
            tt.req_strings("signature").map_err(data_err)?,
            tt.req_strings("train_shapes").map_err(data_err)?,
            tt.req_strings("holdout_shapes").map_err(data_err)?,
        );
        for i in 0..tt.rows() {
            let (Some(id), Some(tier)) = (tid.get(i), ttier.get(i)) else {
                continue;
            };
            let tier = tier.clamp(0, MAX_TIER);
            let split = splits.family(id).map_err(data_err)?;
            counts[tier as usize][if split == "test" { 2 } else { 0 }] += 1;
            let mine: Vec<&ValidatedRow> = validated.iter().filter(|v| v.task_id == id).collect();
            self.id.append_value(format!("synth/{id}"));
            self.src.append_value("synthetic");
            self.level.append_null();
            self.name.append_value(id);
            self.tier.append_value(tier);
            self.reason
                .append_value(format!("task family tier (datasets/tasks/{id}/task.toml)"));
            self.feats.append(true);
            self.cats.append(true);
            self.unknown.append(true);
            self.split.append_value(split);
            self.ak.append_value(0);
            self.acc.append_value(0);
            self.best.append_null();
            self.drift.append_value(false);
            self.sig.append_option(tsig.get(i));
            self.train.append_option(ttrain.get(i));
            self.hold.append_option(thold.get(i));
            self.nval.append_value(mine.len() as i64);
            self.bestv.append_option(
                mine.iter()
                    .filter_map(|v| v.speedup_vs_naive)
                    .reduce(f64::max),
            );
        }
        Ok(())
    }

    /// The finished columns, list columns cast to `schema`'s types.
    fn finish(mut self, schema: &arrow::datatypes::Schema) -> Vec<ArrayRef> {
        let cast_list = |a: ArrayRef, i: usize| {
            arrow::compute::cast(&a, schema.field(i).data_type()).expect("list cast")
        };
        vec![
            Arc::new(self.id.finish()),
            Arc::new(self.src.finish()),
            Arc::new(self.level.finish()),
            Arc::new(self.name.finish()),
            Arc::new(self.tier.finish()),
            Arc::new(self.reason.finish()),
            cast_list(Arc::new(self.feats.finish()), 6),
            cast_list(Arc::new(self.cats.finish()), 7),
            cast_list(Arc::new(self.unknown.finish()), 8),
            Arc::new(self.split.finish()),
            Arc::new(self.ak.finish()),
            Arc::new(self.acc.finish()),
            Arc::new(self.best.finish()),
            Arc::new(self.drift.finish()),
            Arc::new(self.sig.finish()),
            Arc::new(self.train.finish()),
            Arc::new(self.hold.finish()),
            Arc::new(self.nval.finish()),
            Arc::new(self.bestv.finish()),
        ]
    }
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
    let t = Table::read(ctx.input_path(input)?, input).map_err(data_err)?;
    let s = |c: &str| t.req_strings(c).map_err(data_err);
    let (kid, task, role, gpu) = (s("kernel_id")?, s("task_id")?, s("role")?, s("gpu")?);
    let b = |c: &str| t.req_bools(c).map_err(data_err);
    let (executed, correct) = (b("executed")?, b("correct")?);
    let i = |c: &str| t.req_ints(c).map_err(data_err);
    let (tests, passed) = (i("tests")?, i("tests_passed")?);
    let f = |c: &str| t.req_floats(c).map_err(data_err);
    let (median, sn, st) = (
        f("median_ms")?,
        f("speedup_vs_naive")?,
        f("speedup_vs_torch")?,
    );
    for r in 0..t.rows() {
        let n = tests.get(r).unwrap_or(0);
        if executed.get(r) != Some(true)
            || correct.get(r) != Some(true)
            || n == 0
            || passed.get(r) != Some(n)
        {
            continue;
        }
        let (Some(k), Some(tk), Some(ro), Some(m)) =
            (kid.get(r), task.get(r), role.get(r), median.get(r))
        else {
            continue;
        };
        out.push(ValidatedRow {
            kernel_id: k.to_string(),
            task_id: tk.to_string(),
            role: ro.to_string(),
            tests: n,
            median_ms: m,
            speedup_vs_naive: sn.get(r),
            speedup_vs_torch: st.get(r),
            gpu: gpu.get(r).unwrap_or("").to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(extra: &str) -> Result<Curriculum, String> {
        Curriculum::from_table(toml::from_str(extra).unwrap())
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
