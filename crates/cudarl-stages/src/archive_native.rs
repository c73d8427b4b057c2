//! `archive-native`: the archives' kernels (SakanaAI, CUDA-L1) for the curriculum's KernelBench
//! problems, put in each problem's native ABI mechanically ([`cudarl_cuda::native_abi`]) and
//! judged like any native candidate by the KernelBench judge ([`crate::kb_judge`]): built against
//! the launcher `kb-specs` derived, then, on a GPU, run against `testgen`'s recorded tests and
//! timed against torch eager. `sft-data` (with `archive = true`) turns the ones that passed into
//! generator examples and (slower, faster) pairs of the same problem into optimizer examples.
//!
//! Only problems of the curriculum's `splits` (default: `train`) are converted, so the
//! KernelBench test problems `eval` measures are never trained on.
//!
//! Outputs: `archive_native`, one row per archive kernel of those problems
//! ([`cudarl_tables::archive::ArchiveNativeRow`]), and `summary`, the counts per source
//! ([`cudarl_tables::archive::ArchiveSummaryRow`]).

use std::collections::BTreeMap;

use cudarl_core::{
    InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext, StageError,
};
use cudarl_data::Table;
use cudarl_rl::episode::Tester;
use cudarl_rl::kernelbench::KbTask;
use cudarl_tables::TableRow;
use cudarl_tables::archive::{ArchiveNativeRow, ArchiveSummaryRow};
use serde::{Deserialize, Serialize};

use crate::common::Mode;
use crate::common::{data_err, write_rows};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "archive-native";

fn d_splits() -> Vec<String> {
    vec!["train".into()]
}
fn d_timeout() -> u64 {
    60
}

/// Params of `archive-native`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// The curriculum splits whose KernelBench problems are converted.
    #[serde(default = "d_splits")]
    pub splits: Vec<String>,
    /// `auto`: full tests on a GPU, compile-only without one; `compile`: compile-only.
    #[serde(default)]
    pub mode: Mode,
    /// Wall-clock limit of one GPU worker step (s; at least 60).
    #[serde(default = "d_timeout")]
    pub timeout_s: u64,
    /// At most this many kernels per source (the first, in the table's order); absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// The stage.
#[derive(Debug)]
pub struct ArchiveNative {
    params: Params,
}

impl ArchiveNative {
    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        Ok(ArchiveNative {
            params: crate::common::parse_params(t)?,
        })
    }

    fn gpu(&self) -> bool {
        self.params.mode != Mode::Compile && cudarl_cuda::gpu::probe().is_some()
    }
}

impl Stage for ArchiveNative {
    stage_identity!(KIND, 1);
    fn inputs(&self) -> Vec<InputDecl> {
        let mut v = vec![
            InputDecl::node("sakana", "ingest-sakana", "kernels"),
            InputDecl::node("cuda_l1", "ingest-cuda-l1", "kernels"),
        ];
        v.extend(crate::kb_judge::kb_inputs());
        v
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table(ArchiveNativeRow::NAME, ArchiveNativeRow::schema()),
            OutputDecl::table(ArchiveSummaryRow::NAME, ArchiveSummaryRow::schema()),
        ]
    }
    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        let nvcc = cudarl_cuda::nvcc::Nvcc::discover(&ctx.root)
            .map_err(|e| StageError::Failed(e.to_string()))?;
        let gpu = self.gpu().then(cudarl_cuda::gpu::probe).flatten();
        Ok(BTreeMap::from([
            ("nvcc".to_string(), nvcc.version),
            (
                "conversion".to_string(),
                cudarl_cuda::native_abi::VERSION.to_string(),
            ),
            (
                "gpu".to_string(),
                gpu.map_or_else(|| "none (compile-only)".to_string(), |g| g.name),
            ),
        ]))
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let compiler = crate::common::store_compiler(ctx)?;
        // sft-data orders a problem's kernels by their time: torch eager is the only baseline
        // asked for (no Inductor compile per problem).
        let mut judge =
            crate::kb_judge::from_compiler(ctx, compiler, self.gpu(), self.params.timeout_s)?
                .without_torch_compile();
        let tasks: BTreeMap<String, (String, KbTask)> = cudarl_rl::kernelbench::curriculum_tasks(
            ctx.input_path("kb_curriculum")?,
            ctx.input_path("kb_problems")?,
        )
        .map_err(crate::common::rl_err)?
        .into_iter()
        .filter(|(s, t)| self.params.splits.contains(s) && judge.judges(&t.id))
        .map(|(s, t)| (t.id.clone(), (s, t)))
        .collect();
        let mut rows: Vec<ArchiveNativeRow> = Vec::new();
        let mut items: Vec<(usize, String)> = Vec::new();
        for (input, source) in [("sakana", "sakana"), ("cuda_l1", "cuda-l1")] {
            let path = ctx.input_path(input)?;
            let t = Table::read(path, &format!("{input}.kernels")).map_err(data_err)?;
            let (kid, pid, code, cuda) = (
                t.req_strings("kernel_id").map_err(data_err)?,
                t.strings("problem_id").map_err(data_err)?,
                t.req_strings("code").map_err(data_err)?,
                t.req_bools("has_cuda_kernel").map_err(data_err)?,
            );
            let mut taken = 0usize;
            for i in 0..t.rows() {
                // PyTorch-level rewrites without a CUDA kernel have nothing to convert.
                if cuda.get(i) != Some(true) || self.params.limit.is_some_and(|l| taken >= l) {
                    continue;
                }
                let Some((split, task)) = pid
                    .as_ref()
                    .and_then(|p| p.get(i))
                    .and_then(|p| tasks.get(p))
                else {
                    continue;
                };
                taken += 1;
                let abi = judge.abi(&task.id).ok_or_else(|| {
                    StageError::Failed(format!("`{}` has no native launcher", task.id))
                })?;
                let consts = cudarl_cuda::native_abi::problem_constants(&task.code);
                let got =
                    cudarl_cuda::native_abi::to_native(code.get(i).unwrap_or(""), abi, &consts);
                if let Ok(c) = &got {
                    items.push((rows.len(), c.clone()));
                }
                rows.push(ArchiveNativeRow {
                    kernel_id: kid.get(i).unwrap_or("").to_string(),
                    source: source.to_string(),
                    problem_id: task.id.clone(),
                    split: split.clone(),
                    tier: task.tier,
                    converted: got.is_ok(),
                    reason: got.as_ref().err().map(ToString::to_string),
                    code: got.ok(),
                    compiled: false,
                    correct: None,
                    median_ms: None,
                    speedup_vs_torch: None,
                    validated: "failed".into(),
                    feedback: None,
                    description: cudarl_curriculum::prompts::module_description(&task.code),
                    signature: task.signature.clone(),
                });
            }
        }
        let batch: Vec<(&KbTask, &str)> = items
            .iter()
            .map(|(r, c)| (&tasks[&rows[*r].problem_id].1, c.as_str()))
            .collect();
        let verdicts = judge.test_many(&batch).map_err(crate::common::rl_err)?;
        for ((r, code), (v, _)) in items.iter().zip(verdicts) {
            judged(&mut rows[*r], code, &v);
        }
        let mut sums: BTreeMap<&str, ArchiveSummaryRow> = BTreeMap::new();
        for r in &rows {
            let s = sums
                .entry(r.source.as_str())
                .or_insert_with(|| ArchiveSummaryRow {
                    source: r.source.clone(),
                    rows: 0,
                    converted: 0,
                    compiled: 0,
                    correct: 0,
                });
            s.rows += 1;
            s.converted += i64::from(r.converted);
            s.compiled += i64::from(r.compiled);
            s.correct += i64::from(r.correct == Some(true));
        }
        for s in sums.values() {
            ctx.note(&format!(
                "{}: {} kernels, {} converted, {} compiled, {} correct",
                s.source, s.rows, s.converted, s.compiled, s.correct
            ));
        }
        write_rows(
            ctx,
            ArchiveNativeRow::NAME,
            &ArchiveNativeRow::schema(),
            &rows,
        )?;
        write_rows(
            ctx,
            ArchiveSummaryRow::NAME,
            &ArchiveSummaryRow::schema(),
            &sums.into_values().collect::<Vec<_>>(),
        )
    }
}

/// This row with the judge's verdict `v` on its converted kernel `code`: the tester's
/// feedback, compiled, correct, timing, and `validated` (`correct`, `compile-only` or
/// `failed`, with the failure as the reason).
fn judged(row: &mut ArchiveNativeRow, code: &str, v: &cudarl_cuda::Verdict) {
    row.feedback = Some(cudarl_rl::episode::feedback(
        row.tier,
        Some(code),
        Some(v),
        &[0, 1],
    ));
    row.compiled = v.compiled;
    row.correct = v.correct;
    row.median_ms = v.timing.as_ref().map(|t| t.median_ms);
    row.speedup_vs_torch = v.speedup_vs_torch;
    row.validated = match (v.compiled, v.correct) {
        (true, Some(true)) => "correct",
        (true, None) => "compile-only",
        _ => "failed",
    }
    .into();
    if row.validated == "failed" {
        row.reason = Some(
            v.failure
                .clone()
                .unwrap_or_else(|| "did not compile".to_string()),
        );
    }
}
