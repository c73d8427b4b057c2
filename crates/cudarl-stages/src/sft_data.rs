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
//! beside `validate`'s; `sft-data` keeps the repairs of the kernels that validated. The examples
//! themselves are built by [`cudarl_rl::sft`]; this stage reads and writes the tables.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, BooleanArray, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{InputDecl, OutputDecl, ParamsError, Stage, StageContext, StageError};
use cudarl_curriculum::prompts;
use cudarl_data::Table;
use cudarl_rl::sft::{
    Settings, SftRows, TaskExamples, archive_examples, kept_out, repairs, validated_kernels,
    validation_rows,
};
use cudarl_tables::TableRow;
use cudarl_tables::archive::ArchiveNativeRow;
use cudarl_tables::sft::{SftGeneratorRow, SftOptimizerRow};
use serde::{Deserialize, Serialize};

use crate::common::{data_err, rl_err, write_output, write_sft_tables};

/// The stage kind of [`SftData`], as pipeline files name it.
pub const KIND: &str = "sft-data";
/// The stage kind of [`SftRepairs`].
pub const REPAIRS_KIND: &str = "sft-repairs";

/// The `sft-data` stage.
#[derive(Debug)]
pub struct SftData {
    params: Settings,
}

impl SftData {
    /// From the pipeline's table.
    ///
    /// # Errors
    /// Unknown or mistyped keys ([`Settings`]), `val_fraction` out of range
    /// ([`Settings::check`]).
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Settings = crate::common::parse_params(t)?;
        params.check()?;
        Ok(SftData { params })
    }
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
        let val = validation_rows(&vt).map_err(data_err)?;
        let by_task = validated_kernels(&kt, &val).map_err(data_err)?;
        let repairs = if p.repairs_per_base > 0 {
            let rt = Table::read(ctx.input_path("repairs")?, "repairs").map_err(data_err)?;
            let specs = cudarl_rl::tasks::specs_by_id(ctx.input_path("tasks")?).map_err(rl_err)?;
            repairs(&specs, &rt, &by_task).map_err(data_err)?
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
                settings: p,
                id: t,
                tier: tr,
                description: &d,
                dtype: dt,
                signature: sg,
                kept_out: kept_out(&splits, t).map_err(data_err)?,
                shapes: vec![],
                renamable: p.rename_sizes == Some(true),
            };
            let repairs = repairs.get(t).map_or(&[][..], Vec::as_slice);
            task.examples((&mut gen_rows, &mut opt_rows), kerns, repairs);
        }
        if p.archive {
            let (g, o) = (gen_rows.len(), opt_rows.len());
            let rows: Vec<ArchiveNativeRow> =
                cudarl_tables::read(ctx.input_path("archive")?, ArchiveNativeRow::NAME)
                    .map_err(data_err)?;
            let by_source = archive_examples(p, &rows, &mut gen_rows, &mut opt_rows);
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
