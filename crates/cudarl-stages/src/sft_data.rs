//! `sft-data`: chat-format SFT tables for the two agents, from the synthetic task families and
//! their validated kernels, in the prompt format RL uses (`cudarl_curriculum::prompts`).
//!
//! - `sft_generator`: task prompt -> a kernel of that task that `validate` found correct (on a
//!   GPU) or compiled (compile-only machines; `validated` says which). Templated variants
//!   (opening and closing phrasings, which train shapes are shown and in what order, whether
//!   the answer has a lead-in line) give about `per_family` distinct examples per family.
//! - `sft_optimizer`: task prompt + a slower kernel + the tester's feedback for it -> a faster
//!   kernel of the same task, for every validated (naive, optimized) pair; `speedup` is the
//!   measured ratio (null on compile-only machines, `measured = false`).
//!
//! The families' splits come from the `curriculum`, which copies the `splits` stage's (its
//! `holdout_tasks`, `holdout_generated`, `rl_generated`; [`crate::splits`]): `test` families are the
//! hold-out (never trained on: the generator's rates on them after SFT are the baseline RL must
//! beat), its `rl` families are kept out of SFT too (`rl-train` practises on them, so RL learns
//! to write kernels for operations the agents have not memorized, the skill the hold-out
//! families measure); of the rest, `val_fraction` of the examples (by content hash) are `val`.
//!
//! The tables' columns are [`cudarl_tables::sft::SftGeneratorRow`] and
//! [`cudarl_tables::sft::SftOptimizerRow`]. An optimizer row's `kind` is `optimize`, or for a
//! repair example (`repairs_per_base`; [`cudarl_rl::repair`]) `repair:<breakage>`: a task kernel
//! broken on purpose (`missing_semicolon`, `undeclared_identifier`, `missing_brace`) with
//! nvcc's real diagnostics as the tester's feedback, or `repair:no_code` (the answer had no
//! code block), -> the correct kernel; `base_kernel_id` is then `<kernel_id>#<breakage>`.
//!
//! The broken kernels come from `sft-repairs` ([`SftRepairs`]), which breaks and compiles every
//! task kernel without waiting for `validate` (it needs no verdicts), so its nvcc work runs
//! beside `validate`'s; `sft-data` keeps the repairs of the kernels that validated.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, BooleanArray, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{InputDecl, OutputDecl, ParamsError, Stage, StageContext, StageError};
use cudarl_curriculum::prompts::{
    self, CLOSINGS, ChatMessage, GENERATOR_SYSTEM, INTROS, OPTIMIZER_SYSTEM, TaskView,
};
use cudarl_curriculum::rename::Namer;
use cudarl_curriculum::sample::{hash_fraction, order, shape_variants};
use cudarl_data::Table;
use cudarl_tables::TableRow;
use cudarl_tables::archive::ArchiveNativeRow;
use cudarl_tables::sft::{SftGeneratorRow, SftOptimizerRow};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::common::{SftRows, data_err, rl_err, write_output, write_sft_tables};

/// The stage kind of [`SftData`], as pipeline files name it.
pub const KIND: &str = "sft-data";
/// The stage kind of [`SftRepairs`].
pub const REPAIRS_KIND: &str = "sft-repairs";

fn d_per_family() -> usize {
    1000
}
fn d_per_pair() -> usize {
    INTROS.len() * CLOSINGS.len()
}
fn d_val() -> f64 {
    0.05
}
fn d_repairs() -> usize {
    8
}

/// Parameters (`[stages.sft-data]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Generator examples per task family (at most; fewer when the templates run out).
    #[serde(default = "d_per_family")]
    pub per_family: usize,
    /// Optimizer examples per (slower, faster) kernel pair: prompt phrasings taken in a seeded
    /// order, at most `INTROS x CLOSINGS` (24, the default).
    #[serde(default = "d_per_pair")]
    pub optimizer_per_pair: usize,
    /// Repair examples per broken kernel (prompt phrasings, seeded order): every validated
    /// task kernel's breakage from `sft-repairs` that nvcc rejected, with its real diagnostics,
    /// plus one "no code block" case per family. `0`: none, and `sft-repairs` is not an input
    /// (not built for this stage).
    #[serde(default = "d_repairs")]
    pub repairs_per_base: usize,
    /// Fraction of the other examples in `val`.
    #[serde(default = "d_val")]
    pub val_fraction: f64,
    /// Seed of the order in which template variants are taken.
    #[serde(default)]
    pub seed: u64,
    /// Also learn from the archives' kernels for the curriculum's KernelBench train problems
    /// that `archive-native` put in the native ABI and judged: generator examples (KernelBench
    /// prompts, `per_family` per problem) and optimizer examples from each measured kernel to
    /// the problem's fastest, where that is at least 1.1x faster (GPU only).
    #[serde(default)]
    pub archive: bool,
    /// Half of each task's generator examples with the launcher's sizes renamed
    /// ([`cudarl_curriculum::rename`]: the same new names in the module, the declaration, the
    /// example shapes and the kernel), so the model copies the sizes the prompt names instead of
    /// recalling a memorized kernel's. The task kernels only, not the archives'. Absent: off,
    /// and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename_sizes: Option<bool>,
}

/// The `sft-data` stage.
#[derive(Debug)]
pub struct SftData {
    params: Params,
}

impl SftData {
    /// From the pipeline's table.
    ///
    /// # Errors
    /// Unknown or mistyped keys.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        if !(0.0..1.0).contains(&params.val_fraction) {
            return Err("val_fraction must be in [0, 1)".into());
        }
        Ok(SftData { params })
    }
}

/// A validated kernel of a task.
#[derive(Debug, Clone)]
struct Kern {
    id: String,
    role: String,
    code: String,
    validated: &'static str,
    median_ms: Option<f64>,
    feedback: String,
}

impl Stage for SftData {
    // Code versions:
    // 3: repairs from `sft-repairs` (the breakage rotates over all of a task's kernels).
    // 4: the families' splits from the curriculum.
    // 5: every task stated as its KernelBench-style module (the task language).
    stage_identity!(KIND, 5);
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            InputDecl::node("tasks", "synth-tasks", "tasks"),
            InputDecl::node("kernels", "synth-tasks", "task_kernels"),
            InputDecl::node("validations", "validate", "validations"),
            InputDecl::node("curriculum", "curriculum", "curriculum"),
        ]
        .into_iter()
        // No repair examples: `sft-repairs` (a compile of every task kernel) is not built.
        .chain(
            (self.params.repairs_per_base > 0)
                .then(|| InputDecl::node("repairs", "sft-repairs", "repairs")),
        )
        .chain(
            self.params
                .archive
                .then(|| InputDecl::node("archive", "archive-native", "archive_native")),
        )
        .collect()
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("sft_generator", SftGeneratorRow::schema()),
            OutputDecl::table("sft_optimizer", SftOptimizerRow::schema()),
        ]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let p = &self.params;
        let tasks = Table::read(ctx.input_path("tasks")?, "tasks").map_err(data_err)?;
        let kt = Table::read(ctx.input_path("kernels")?, "task_kernels").map_err(data_err)?;
        let vt = Table::read(ctx.input_path("validations")?, "validations").map_err(data_err)?;
        let val = validation_rows(&vt)?;
        let by_task = validated_kernels(&kt, &val)?;
        let repairs = if p.repairs_per_base > 0 {
            let rt = Table::read(ctx.input_path("repairs")?, "repairs").map_err(data_err)?;
            self.repairs(ctx.input_path("tasks")?, &rt, &by_task)?
        } else {
            BTreeMap::new()
        };
        let splits = family_splits(ctx.input_path("curriculum")?)?;
        let (mut gen_rows, mut opt_rows) = (SftRows::default(), SftRows::default());
        let tid = tasks.req_strings("task_id").map_err(data_err)?;
        let tier = tasks.req_ints("tier").map_err(data_err)?;
        let problem = tasks.req_strings("problem").map_err(data_err)?;
        let dtype = tasks.req_strings("dtype").map_err(data_err)?;
        let sig = tasks.req_strings("signature").map_err(data_err)?;
        for i in 0..tasks.rows() {
            let (Some(t), Some(tr), Some(pr), Some(dt), Some(sg)) = (
                tid.get(i),
                tier.get(i),
                problem.get(i),
                dtype.get(i),
                sig.get(i),
            ) else {
                continue;
            };
            let d = prompts::module_description(pr);
            let Some(kerns) = by_task.get(t) else {
                continue;
            };
            let task = TaskExamples {
                stage: self,
                id: t,
                tier: tr,
                description: &d,
                dtype: dt,
                signature: sg,
                kept_out: kept_out(&splits, t)?,
                shapes: vec![],
                renamable: p.rename_sizes == Some(true),
            };
            task.generator(&mut gen_rows, kerns);
            // Optimizer: each naive -> optimized pair, faster when measured.
            for base in kerns.iter().filter(|k| k.role == "naive") {
                for better in kerns.iter().filter(|k| k.role != "naive") {
                    let speedup = match (base.median_ms, better.median_ms) {
                        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                        _ => None,
                    };
                    if speedup.is_some_and(|s| s <= 1.0) {
                        continue;
                    }
                    task.optimizer(
                        &mut opt_rows,
                        (&better.id, p.optimizer_per_pair),
                        (&base.code, &base.feedback),
                        better,
                        (&base.id, speedup, "optimize".into()),
                    );
                }
            }
            // Optimizer repairs: a broken kernel and the tester's words on it -> the correct one.
            for r in repairs.get(t).into_iter().flatten() {
                task.optimizer(
                    &mut opt_rows,
                    (&r.base_id, p.repairs_per_base),
                    (&r.broken, &r.feedback),
                    &r.target,
                    (&r.base_id, None, format!("repair:{}", r.kind)),
                );
            }
        }
        if p.archive {
            let (g, o) = (gen_rows.len(), opt_rows.len());
            let by_source = self.archive_examples(ctx, &mut gen_rows, &mut opt_rows)?;
            ctx.note(&format!(
                "KernelBench examples from the archives: {} generator, {} optimizer ({})",
                gen_rows.len() - g,
                opt_rows.len() - o,
                by_source
            ));
        }
        write_sft_tables(ctx, gen_rows, &opt_rows)
    }
}

/// The minimum measured speedup of an archive optimizer pair (timing noise is not a lesson).
const ARCHIVE_MIN_SPEEDUP: f64 = 1.1;

impl SftData {
    /// The archive kernels' examples (see [`Params::archive`]) added to `gen` and `opt`; says
    /// how many kernels of each source they use.
    ///
    /// # Errors
    /// The `archive_native` table cannot be read or lacks a column (file and field named).
    fn archive_examples(
        &self,
        ctx: &StageContext<'_>,
        gen_rows: &mut SftRows,
        opt_rows: &mut SftRows,
    ) -> Result<String, StageError> {
        let rows: Vec<ArchiveNativeRow> =
            cudarl_tables::read(ctx.input_path("archive")?, ArchiveNativeRow::NAME)
                .map_err(data_err)?;
        // Problem -> (tier, split, description, signature, kernels).
        type Problem<'a> = (i64, &'a str, &'a str, &'a str, Vec<Kern>);
        let mut problems: BTreeMap<&str, Problem<'_>> = BTreeMap::new();
        let mut used: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &rows {
            let v = match r.validated.as_str() {
                "correct" => "correct",
                "compile-only" => "compile-only",
                _ => continue,
            };
            let Some(c) = &r.code else {
                continue;
            };
            *used.entry(r.source.as_str()).or_default() += 1;
            let e = problems
                .entry(&r.problem_id)
                .or_insert_with(|| (r.tier, &r.split, &r.description, &r.signature, Vec::new()));
            e.4.push(Kern {
                id: r.kernel_id.clone(),
                role: "archive".into(),
                code: c.clone(),
                validated: v,
                median_ms: r.median_ms,
                feedback: r.feedback.clone().unwrap_or_default(),
            });
        }
        for (id, (tier, split, description, signature, kerns)) in &problems {
            let task = TaskExamples {
                stage: self,
                id,
                tier: *tier,
                description,
                dtype: prompts::signature_dtype(signature),
                signature,
                kept_out: match *split {
                    "train" => None,
                    "val" => Some("val"),
                    _ => Some("test"),
                },
                shapes: vec![],
                renamable: false,
            };
            task.generator(gen_rows, kerns);
            // Each measured kernel -> the fastest one, where that is at least 1.1x faster.
            let fastest = kerns
                .iter()
                .filter(|k| k.median_ms.is_some_and(|m| m > 0.0))
                .min_by(|a, b| {
                    a.median_ms
                        .partial_cmp(&b.median_ms)
                        .unwrap_or(Ordering::Equal)
                });
            for base in kerns {
                let Some(best) = fastest else { break };
                let Some(s) = base.median_ms.zip(best.median_ms).map(|(a, b)| a / b) else {
                    continue;
                };
                if s < ARCHIVE_MIN_SPEEDUP || !s.is_finite() {
                    continue;
                }
                task.optimizer(
                    opt_rows,
                    (&best.id, self.params.optimizer_per_pair),
                    (&base.code, &base.feedback),
                    best,
                    (&base.id, Some(s), "optimize".into()),
                );
            }
        }
        Ok(used
            .iter()
            .map(|(s, n)| format!("{n} {s} kernels"))
            .collect::<Vec<_>>()
            .join(", "))
    }
}

/// One task's SFT examples: its row of the `tasks` table and the stage's parameters.
struct TaskExamples<'a> {
    stage: &'a SftData,
    id: &'a str,
    tier: i64,
    description: &'a str,
    dtype: &'a str,
    signature: &'a str,
    /// The hold-out split this task is kept for, if any.
    kept_out: Option<&'static str>,
    /// Its training shapes (JSON objects of sizes).
    shapes: Vec<String>,
    /// Its generator examples may have their sizes renamed ([`Params::rename_sizes`]).
    renamable: bool,
}

impl TaskExamples<'_> {
    /// The task as prompts show it, with `shapes`.
    fn view<'s>(&'s self, shapes: &'s [String]) -> TaskView<'s> {
        TaskView {
            tier: self.tier,
            description: self.description,
            dtype: self.dtype,
            signature: self.signature,
            shapes,
        }
    }

    /// An example answered by `k`; `opt`: the optimizer table's base, speedup and kind.
    fn push(
        &self,
        rows: &mut SftRows,
        k: &Kern,
        m: Vec<ChatMessage>,
        opt: (&str, Option<f64>, &str),
    ) {
        rows.add(
            (self.id, self.tier),
            |id| self.stage.split_of(id, self.kept_out),
            (&k.id, k.validated),
            m,
            opt,
        );
    }

    /// Generator examples: every (intro, closing, shapes, kernel, lead-in, names) combination,
    /// in an order seeded by the task, `per_family` of them; `names` 1 renames the sizes (when
    /// the task is [`TaskExamples::renamable`]).
    fn generator(&self, rows: &mut SftRows, kerns: &[Kern]) {
        let p = &self.stage.params;
        let variants = shape_variants(&self.shapes);
        let seed = p.seed ^ blake3::hash(self.id.as_bytes()).as_bytes()[0] as u64;
        let texts: Vec<&str> = std::iter::once(self.description)
            .chain(kerns.iter().map(|k| k.code.as_str()))
            .collect();
        // Read once per task; without a renaming, no variant repeats the plain examples.
        let namer = if self.renamable {
            Namer::new(self.signature, &texts)
        } else {
            None
        };
        let names = if namer.is_some() { 2 } else { 1 };
        let n = INTROS.len() * CLOSINGS.len() * variants.len() * kerns.len() * 2 * names;
        for c in order(n, seed).into_iter().take(p.per_family) {
            let (intro, r) = (c % INTROS.len(), c / INTROS.len());
            let (closing, r) = (r % CLOSINGS.len(), r / CLOSINGS.len());
            let (sv, r) = (r % variants.len(), r / variants.len());
            let (ki, r) = (r % kerns.len(), r / kerns.len());
            let (lead, renamed) = (r % 2, r / 2);
            let k = &kerns[ki];
            let rename = namer
                .as_ref()
                .filter(|_| renamed == 1)
                .map(|n| n.draw(seed ^ c as u64));
            let (description, signature, shapes, code) = match &rename {
                Some(r) => (
                    r.python(self.description),
                    r.c(self.signature),
                    variants[sv].iter().map(|s| r.shapes_json(s)).collect(),
                    r.c(&k.code),
                ),
                None => (
                    self.description.to_string(),
                    self.signature.to_string(),
                    variants[sv].clone(),
                    k.code.clone(),
                ),
            };
            let view = TaskView {
                description: &description,
                signature: &signature,
                ..self.view(&shapes)
            };
            let answer = if lead == 1 {
                format!("Here is the kernel:\n\n{}", prompts::fenced(&code))
            } else {
                prompts::fenced(&code)
            };
            let m = vec![
                ChatMessage::new("system", GENERATOR_SYSTEM),
                ChatMessage::new("user", prompts::task_prompt(&view, intro, closing)),
                ChatMessage::new("assistant", answer),
            ];
            self.push(rows, k, m, ("", None, ""));
        }
    }

    /// Optimizer examples: the task, a kernel (`current`) and the tester's words on it (`fb`)
    /// -> `target`, in `n` prompt phrasings taken in an order seeded by `seed_key`.
    fn optimizer(
        &self,
        rows: &mut SftRows,
        (seed_key, n): (&str, usize),
        (current, fb): (&str, &str),
        target: &Kern,
        (base_id, speedup, kind): (&str, Option<f64>, String),
    ) {
        let view = self.view(&self.shapes);
        let seed = self.stage.params.seed ^ blake3::hash(seed_key.as_bytes()).as_bytes()[0] as u64;
        for c in order(INTROS.len() * CLOSINGS.len(), seed)
            .into_iter()
            .take(n)
        {
            let (intro, closing) = (c % INTROS.len(), c / INTROS.len());
            let m = vec![
                ChatMessage::new("system", OPTIMIZER_SYSTEM),
                ChatMessage::new(
                    "user",
                    prompts::optimizer_prompt(&view, current, fb, intro, closing),
                ),
                ChatMessage::new("assistant", prompts::fenced(&target.code)),
            ];
            self.push(rows, target, m, (base_id, speedup, &kind));
        }
    }
}

/// Validation rows by kernel id, as JSON values of the columns the examples use.
///
/// # Errors
/// A required column of `validations` is missing or has the wrong type (named).
fn validation_rows(
    vt: &Table,
) -> Result<BTreeMap<String, BTreeMap<&'static str, Value>>, StageError> {
    let mut val: BTreeMap<String, BTreeMap<&'static str, Value>> = BTreeMap::new();
    let kid = vt.req_strings("kernel_id").map_err(data_err)?;
    let compiled = vt.req_bools("compiled").map_err(data_err)?;
    let executed = vt.req_bools("executed").map_err(data_err)?;
    let correct = vt.bools("correct").map_err(data_err)?;
    let fcols = [
        "median_ms",
        "speedup_vs_torch",
        "dram_fraction_of_peak",
        "speedup_vs_naive",
    ];
    let icols = [
        "tests",
        "tests_passed",
        "registers",
        "shared_mem_bytes",
        "spill_bytes",
    ];
    let fs: Vec<_> = fcols
        .iter()
        .map(|c| vt.floats(c).map_err(data_err))
        .collect::<Result<_, _>>()?;
    let is: Vec<_> = icols
        .iter()
        .map(|c| vt.ints(c).map_err(data_err))
        .collect::<Result<_, _>>()?;
    for i in 0..vt.rows() {
        let Some(k) = kid.get(i) else { continue };
        let mut m: BTreeMap<&str, Value> = BTreeMap::new();
        m.insert("compiled", compiled.get(i).unwrap_or(false).into());
        m.insert("executed", executed.get(i).unwrap_or(false).into());
        m.insert(
            "correct",
            correct
                .as_ref()
                .and_then(|c| c.get(i))
                .map_or(Value::Null, Value::from),
        );
        for (c, col) in fcols.iter().zip(&fs) {
            if let Some(v) = col.as_ref().and_then(|c| c.get(i)) {
                m.insert(c, v.into());
            }
        }
        for (c, col) in icols.iter().zip(&is) {
            if let Some(v) = col.as_ref().and_then(|c| c.get(i)) {
                m.insert(c, v.into());
            }
        }
        val.insert(k.to_string(), m);
    }
    Ok(val)
}

/// Kernels per task that validated (correct on a GPU, or compiled compile-only), with their
/// validation in `val`.
///
/// # Errors
/// A required column of `task_kernels` is missing or has the wrong type (named).
fn validated_kernels(
    kt: &Table,
    val: &BTreeMap<String, BTreeMap<&'static str, Value>>,
) -> Result<BTreeMap<String, Vec<Kern>>, StageError> {
    let mut by_task: BTreeMap<String, Vec<Kern>> = BTreeMap::new();
    let kid = kt.req_strings("kernel_id").map_err(data_err)?;
    let task = kt.req_strings("task_id").map_err(data_err)?;
    let role = kt.req_strings("role").map_err(data_err)?;
    let code = kt.req_strings("code").map_err(data_err)?;
    for i in 0..kt.rows() {
        let (Some(k), Some(t), Some(r), Some(c)) =
            (kid.get(i), task.get(i), role.get(i), code.get(i))
        else {
            continue;
        };
        let Some(v) = val.get(k) else { continue };
        let validated = match (
            v["compiled"].as_bool(),
            v["executed"].as_bool(),
            v["correct"].as_bool(),
        ) {
            (_, Some(true), Some(true)) => "correct",
            (Some(true), Some(false), _) => "compile-only",
            _ => continue,
        };
        by_task.entry(t.to_string()).or_default().push(Kern {
            id: k.to_string(),
            role: r.to_string(),
            code: c.to_string(),
            validated,
            median_ms: v.get("median_ms").and_then(Value::as_f64),
            feedback: cudarl_rl::episode::validation_feedback(v),
        });
    }
    Ok(by_task)
}

/// The curriculum's split of each synthetic family (`synth/<task>` rows), by task id.
///
/// # Errors
/// The `curriculum` table cannot be read or lacks `problem_id`, `source` or `split` (named).
fn family_splits(path: &std::path::Path) -> Result<BTreeMap<String, String>, StageError> {
    let rows = cudarl_tables::read::<cudarl_tables::curriculum::CurriculumRow>(path, "curriculum")
        .map_err(data_err)?;
    Ok(rows
        .into_iter()
        .filter(|r| r.source == "synthetic")
        .filter_map(|r| Some((r.problem_id.strip_prefix("synth/")?.to_string(), r.split)))
        .collect())
}

/// `test` or `rl` for a task family the curriculum keeps out of SFT, else `None`.
///
/// # Errors
/// The family has no row in the curriculum, or a split other than `train`, `rl` or `test`.
fn kept_out(
    splits: &BTreeMap<String, String>,
    task: &str,
) -> Result<Option<&'static str>, StageError> {
    match splits.get(task).map(String::as_str) {
        Some("test") => Ok(Some("test")),
        Some("rl") => Ok(Some("rl")),
        Some("train") => Ok(None),
        Some(other) => Err(StageError::bad_input(
            "curriculum",
            Some("split"),
            format!("synth/{task}: split `{other}` (expected train, rl or test)"),
        )),
        None => Err(StageError::bad_input(
            "curriculum",
            Some("problem_id"),
            format!("no row synth/{task} for task family {task}"),
        )),
    }
}

/// One repair example's base: a broken kernel, the tester's feedback on it, the answer.
struct Repair {
    base_id: String,
    kind: &'static str,
    broken: String,
    feedback: String,
    target: Kern,
}

impl SftData {
    /// The split of example `id`: `reserved` when given (a family kept out), else `val` for a
    /// `val_fraction` of ids by hash, else `train`.
    fn split_of(&self, id: &str, reserved: Option<&'static str>) -> String {
        match reserved {
            Some(r) => r.into(),
            None if hash_fraction(id) < self.params.val_fraction => "val".into(),
            None => "train".into(),
        }
    }

    /// The repair bases of every task (see [`Params::repairs_per_base`]): each validated
    /// kernel's breakage from `sft-repairs` that nvcc really rejected, with its diagnostics;
    /// plus one "no code block" base per task whose answer is its fastest kernel.
    ///
    /// # Errors
    /// A task without a readable `spec_json`, a `repairs` table without its columns (file and
    /// field named).
    fn repairs(
        &self,
        tasks: &std::path::Path,
        rt: &Table,
        by_task: &BTreeMap<String, Vec<Kern>>,
    ) -> Result<BTreeMap<String, Vec<Repair>>, StageError> {
        let mut out: BTreeMap<String, Vec<Repair>> = BTreeMap::new();
        let specs = cudarl_rl::tasks::specs_by_id(tasks).map_err(rl_err)?;
        // Rejected breakages by kernel id: (kind, broken code, feedback).
        let mut broken: BTreeMap<&str, Vec<(&'static str, &str, &str)>> = BTreeMap::new();
        let (kid, kind) = (
            rt.req_strings("kernel_id").map_err(data_err)?,
            rt.req_strings("kind").map_err(data_err)?,
        );
        let (code, fb) = (
            rt.req_strings("broken").map_err(data_err)?,
            rt.req_strings("feedback").map_err(data_err)?,
        );
        let compiled = rt.req_bools("compiled").map_err(data_err)?;
        for i in 0..rt.rows() {
            // A breakage nvcc accepts teaches nothing about repairs.
            if compiled.get(i) != Some(false) {
                continue;
            }
            let (Some(k), Some(n), Some(c), Some(f)) =
                (kid.get(i), kind.get(i), code.get(i), fb.get(i))
            else {
                continue;
            };
            let Some(n) = cudarl_rl::repair::Breakage::ALL
                .iter()
                .map(|b| b.name())
                .find(|b| *b == n)
            else {
                return Err(StageError::bad_input(
                    "repairs",
                    Some("kind"),
                    format!("kernel `{k}`: unknown breakage `{n}`"),
                ));
            };
            broken.entry(k).or_default().push((n, c, f));
        }
        for (t, kerns) in by_task {
            let Some(spec) = specs.get(t) else { continue };
            for k in kerns {
                for (n, c, f) in broken.get(k.id.as_str()).into_iter().flatten() {
                    out.entry(t.clone()).or_default().push(Repair {
                        base_id: format!("{}#{n}", k.id),
                        kind: n,
                        feedback: f.to_string(),
                        broken: c.to_string(),
                        target: k.clone(),
                    });
                }
            }
            // No code block: the answer is the task's fastest kernel.
            let best = kerns
                .iter()
                .filter_map(|k| k.median_ms.map(|m| (m, k)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, k)| k)
                .or_else(|| kerns.iter().find(|k| k.role != "naive"))
                .or(kerns.first());
            if let Some(b) = best {
                out.entry(t.clone()).or_default().push(Repair {
                    base_id: format!("{}#no_code", b.id),
                    kind: "no_code",
                    broken: String::new(),
                    feedback: cudarl_rl::episode::feedback(spec.tier, None, None, &[]),
                    target: b.clone(),
                });
            }
        }
        Ok(out)
    }
}

/// A rayon pool (one thread per core) whose threads run at nice 19, the lowest CPU priority:
/// on Linux a thread's nice value is its own and the processes it starts (nvcc) inherit it.
///
/// # Errors
/// The pool cannot start.
fn background_pool() -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    rayon::ThreadPoolBuilder::new()
        .start_handler(|_| {
            // SAFETY: setpriority on the calling thread (who = 0); failure leaves nice 0.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, 0, 19);
            }
        })
        .build()
}

/// Schema of `sft-repairs`' `repairs` table: one row per task kernel that a breakage applies to.
///
/// | column | type | meaning |
/// |---|---|---|
/// | task_id, kernel_id | utf8 | the kernel (from `task_kernels`) |
/// | kind | utf8 | the breakage ([`cudarl_rl::repair::Breakage::name`]), rotating over a task's kernels |
/// | broken | utf8 | the broken source |
/// | compiled | bool | nvcc accepted it anyway (`sft-data` skips such rows) |
/// | feedback | utf8 | the tester's feedback on it: nvcc's diagnostics with lines ([`cudarl_rl::episode::feedback`]) |
pub static REPAIRS: LazyLock<SchemaRef> = LazyLock::new(|| {
    let u = |n: &str| Field::new(n, DataType::Utf8, false);
    Arc::new(Schema::new(vec![
        u("task_id"),
        u("kernel_id"),
        u("kind"),
        u("broken"),
        Field::new("compiled", DataType::Boolean, false),
        u("feedback"),
    ]))
});

/// Parameters of `sft-repairs` (none).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairParams {}

/// The `sft-repairs` stage: every task kernel broken once (the kind rotating over a task's
/// kernels, seeded by the kernel id's blake3) and compiled (compile-only, all cores, the
/// store's compile cache) for nvcc's real diagnostics: the repair examples of `sft-data`. It
/// reads only `synth-tasks`, so it runs beside `validate`, whose nvcc work leaves cores idle
/// (H100 host: 1424 core-seconds over a 191 s stage, 16 cores); its compiles run at nice 19
/// so they take only those. Measured (H100, 2026-11-24): validate took 206 s beside it at
/// nice 0 and 211-217 s at nice 19 against 186-191 s alone, so what still slows validate is
/// not this stage's CPU share (pretrain shares the GPU with it at the same time).
#[derive(Debug)]
pub struct SftRepairs {
    params: RepairParams,
}

impl SftRepairs {
    /// From the pipeline's table.
    ///
    /// # Errors
    /// Unknown keys.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        Ok(SftRepairs {
            params: crate::common::parse_params(t)?,
        })
    }
}

impl Stage for SftRepairs {
    // 2: a launcher without the task's signature is diagnosed at the kernel's `launch` with the
    // expected declaration.
    stage_identity!(REPAIRS_KIND, 2);
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            InputDecl::node("tasks", "synth-tasks", "tasks"),
            InputDecl::node("kernels", "synth-tasks", "task_kernels"),
        ]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![OutputDecl::table("repairs", REPAIRS.clone())]
    }
    fn environment(
        &self,
        ctx: &cudarl_core::ResolveContext,
    ) -> Result<BTreeMap<String, String>, StageError> {
        // The feedback is nvcc's own diagnostics: its version is part of the key.
        let nvcc = cudarl_cuda::Nvcc::discover(&ctx.root)
            .map_err(|e| StageError::Failed(e.to_string()))?;
        Ok(BTreeMap::from([("nvcc".to_string(), nvcc.version)]))
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        use rayon::prelude::*;
        let kt = Table::read(ctx.input_path("kernels")?, "task_kernels").map_err(data_err)?;
        let specs = cudarl_rl::tasks::specs_by_id(ctx.input_path("tasks")?).map_err(rl_err)?;
        let compiler = crate::common::store_compiler(ctx)?;
        let rules = cudarl_cuda::Rules::builtin();
        let kid = kt.req_strings("kernel_id").map_err(data_err)?;
        let task = kt.req_strings("task_id").map_err(data_err)?;
        let code = kt.req_strings("code").map_err(data_err)?;
        // (task, kernel id, broken code, breakage), the kind rotating over a task's kernels.
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        let mut todo: Vec<(&str, &str, String, cudarl_rl::repair::Breakage)> = Vec::new();
        for i in 0..kt.rows() {
            let (Some(k), Some(t), Some(c)) = (kid.get(i), task.get(i), code.get(i)) else {
                continue;
            };
            if !specs.contains_key(t) {
                continue;
            }
            let j = seen.entry(t).or_default();
            let h = blake3::hash(k.as_bytes());
            let pick = u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"));
            let first = (pick as usize).wrapping_add(*j);
            *j += 1;
            let broken = (0..cudarl_rl::repair::Breakage::ALL.len())
                .find_map(|v| cudarl_rl::repair::break_kernel(c, first + v, pick));
            if let Some((b, kind)) = broken {
                todo.push((t, k, b, kind));
            }
        }
        let progress = ctx.progress("repair kernels", Some(todo.len() as u64));
        // At the lowest CPU priority (nice 19, per thread on Linux, inherited by the nvcc
        // processes a thread starts): beside `validate` these compiles take only the cores
        // its own compiles leave idle (at nice 0 they slowed it by 15-20 s on the H100 host).
        let pool = background_pool()
            .map_err(|e| StageError::Failed(format!("cannot start thread pool: {e}")))?;
        let verdicts: Vec<cudarl_cuda::verdict::Verdict> = pool
            .install(|| {
                todo.par_iter()
                    .map(|(t, _, code, _)| {
                        let v =
                            cudarl_cuda::check_compile_only(&specs[*t], code, &rules, &compiler);
                        progress.inc(1);
                        v
                    })
                    .collect::<Result<_, _>>()
            })
            .map_err(|e| StageError::Failed(format!("harness failure: {e}")))?;
        progress.finish();
        let fb: Vec<String> = todo
            .iter()
            .zip(&verdicts)
            .map(|((t, _, c, _), v)| {
                cudarl_rl::episode::feedback(specs[*t].tier, Some(c), Some(v), &[0, 1])
            })
            .collect();
        let col = |f: &dyn Fn(usize) -> String| -> ArrayRef {
            Arc::new(StringArray::from(
                (0..todo.len()).map(f).collect::<Vec<_>>(),
            ))
        };
        let b = cudarl_data::parquet_io::batch(
            &REPAIRS.clone(),
            vec![
                col(&|i| todo[i].0.to_string()),
                col(&|i| todo[i].1.to_string()),
                col(&|i| todo[i].3.name().to_string()),
                col(&|i| todo[i].2.clone()),
                Arc::new(BooleanArray::from(
                    verdicts.iter().map(|v| v.compiled).collect::<Vec<_>>(),
                )),
                col(&|i| fb[i].clone()),
            ],
        )
        .map_err(data_err)?;
        write_output(ctx, "repairs", &b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repair_compiles_run_at_nice_19_and_their_processes_inherit_it() {
        // Field 19 of /proc/<pid>/stat is the nice value; the shell is a real child process.
        let nice_of_child = || {
            let o = std::process::Command::new("sh")
                .args(["-c", "cut -d' ' -f19 /proc/self/stat"])
                .output()
                .unwrap();
            String::from_utf8(o.stdout).unwrap().trim().to_string()
        };
        let outside = nice_of_child();
        let inside = background_pool().unwrap().install(nice_of_child);
        assert_eq!(inside, "19", "outside the pool: {outside}");
        assert_ne!(outside, "19", "the test itself must not run at nice 19");
    }
}
