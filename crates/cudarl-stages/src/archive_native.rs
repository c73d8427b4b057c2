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
//! `archive_native`, one row per archive kernel of those problems:
//!
//! | column | type | meaning |
//! |---|---|---|
//! | kernel_id | utf8 | the archive row's kernel id |
//! | source | utf8 | `sakana` or `cuda-l1` |
//! | problem_id, split | utf8 | the KernelBench problem and its curriculum split |
//! | tier | int64 | its curriculum tier |
//! | converted | bool | the native ABI was derived mechanically |
//! | reason | utf8, nullable | why not, or why the judge failed it |
//! | code | utf8, nullable | the native candidate |
//! | compiled | bool | it built against the launcher |
//! | correct | bool, nullable | it passed the recorded tests (null: compile-only) |
//! | median_ms | float64, nullable | its median time at the problem's own sizes (ms) |
//! | speedup_vs_torch | float64, nullable | torch eager median / its median |
//! | validated | utf8 | `correct`, `compile-only` (built; no GPU) or `failed` |
//! | feedback | utf8, nullable | the tester's words on it, as RL's optimizer reads them ([`cudarl_rl::episode::feedback`]) |
//! | description, signature | utf8 | the problem as the agents' prompts show it ([`KbTask`]'s text) |
//!
//! `summary`: per source, the rows, converted, compiled and correct counts.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{
    InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext, StageError,
};
use cudarl_data::Table;
use cudarl_rl::episode::Tester;
use cudarl_rl::kernelbench::KbTask;
use serde::{Deserialize, Serialize};

use crate::common::Mode;
use crate::common::{data_err, params_json, write_rows};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "archive-native";

/// Schema of `archive_native`.
pub static ARCHIVE_NATIVE: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("kernel_id", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("problem_id", DataType::Utf8, false),
        Field::new("split", DataType::Utf8, false),
        Field::new("tier", DataType::Int64, false),
        Field::new("converted", DataType::Boolean, false),
        Field::new("reason", DataType::Utf8, true),
        Field::new("code", DataType::Utf8, true),
        Field::new("compiled", DataType::Boolean, false),
        Field::new("correct", DataType::Boolean, true),
        Field::new("median_ms", DataType::Float64, true),
        Field::new("speedup_vs_torch", DataType::Float64, true),
        Field::new("validated", DataType::Utf8, false),
        Field::new("feedback", DataType::Utf8, true),
        Field::new("description", DataType::Utf8, false),
        Field::new("signature", DataType::Utf8, false),
    ]))
});

/// Schema of `summary`.
pub static SUMMARY: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("source", DataType::Utf8, false),
        Field::new("rows", DataType::Int64, false),
        Field::new("converted", DataType::Int64, false),
        Field::new("compiled", DataType::Int64, false),
        Field::new("correct", DataType::Int64, false),
    ]))
});

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

/// One row of `archive_native`.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// See the module table.
    pub kernel_id: String,
    /// See the module table.
    pub source: String,
    /// See the module table.
    pub problem_id: String,
    /// See the module table.
    pub split: String,
    /// See the module table.
    pub tier: i64,
    /// See the module table.
    pub converted: bool,
    /// See the module table.
    pub reason: Option<String>,
    /// See the module table.
    pub code: Option<String>,
    /// See the module table.
    pub compiled: bool,
    /// See the module table.
    pub correct: Option<bool>,
    /// See the module table.
    pub median_ms: Option<f64>,
    /// See the module table.
    pub speedup_vs_torch: Option<f64>,
    /// See the module table.
    pub validated: String,
    /// See the module table.
    pub feedback: Option<String>,
    /// See the module table.
    pub description: String,
    /// See the module table.
    pub signature: String,
}

#[derive(Serialize)]
struct SummaryRow {
    source: String,
    rows: i64,
    converted: i64,
    compiled: i64,
    correct: i64,
}

impl Stage for ArchiveNative {
    fn kind(&self) -> &str {
        KIND
    }
    fn code_version(&self) -> u32 {
        1
    }
    fn params(&self) -> serde_json::Value {
        params_json(&self.params)
    }
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
            OutputDecl::table("archive_native", ARCHIVE_NATIVE.clone()),
            OutputDecl::table("summary", SUMMARY.clone()),
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
        let mut rows: Vec<Row> = Vec::new();
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
                rows.push(Row {
                    kernel_id: kid.get(i).unwrap_or("").to_string(),
                    source: source.to_string(),
                    problem_id: task.id.clone(),
                    split: split.clone(),
                    tier: task.tier,
                    converted: got.is_ok(),
                    reason: got.as_ref().err().cloned(),
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
            rows[*r].judged(code, &v);
        }
        let mut sums: BTreeMap<&str, SummaryRow> = BTreeMap::new();
        for r in &rows {
            let s = sums.entry(r.source.as_str()).or_insert_with(|| SummaryRow {
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
        write_rows(ctx, "archive_native", &ARCHIVE_NATIVE, &rows)?;
        write_rows(
            ctx,
            "summary",
            &SUMMARY,
            &sums.into_values().collect::<Vec<_>>(),
        )
    }
}

impl Row {
    /// This row with the judge's verdict `v` on its converted kernel `code`: the tester's
    /// feedback, compiled, correct, timing, and `validated` (`correct`, `compile-only` or
    /// `failed`, with the failure as the reason).
    fn judged(&mut self, code: &str, v: &cudarl_cuda::Verdict) {
        self.feedback = Some(cudarl_rl::episode::feedback(
            self.tier,
            Some(code),
            Some(v),
            &[0, 1],
        ));
        self.compiled = v.compiled;
        self.correct = v.correct;
        self.median_ms = v.timing.as_ref().map(|t| t.median_ms);
        self.speedup_vs_torch = v.speedup_vs_torch;
        self.validated = match (v.compiled, v.correct) {
            (true, Some(true)) => "correct",
            (true, None) => "compile-only",
            _ => "failed",
        }
        .into();
        if self.validated == "failed" {
            self.reason = Some(
                v.failure
                    .clone()
                    .unwrap_or_else(|| "did not compile".to_string()),
            );
        }
    }
}
