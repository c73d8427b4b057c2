//! `kb-specs`: native task signatures for KernelBench problems, derived by the Python worker
//! (`python/cudarl_worker.py`, op `signature`) from each problem's own `get_init_inputs()`,
//! `Model` and `get_inputs()` run on torch's meta device (shapes and dtypes only), with the
//! coverage per level and the reason for every problem left out.
//!
//! The worker is a real `python3` process with torch, found as `$CUDARL_PYTHON`, else
//! `<root>/.venv/bin/python`, else `python3` on `PATH`. Each problem's answer is memoized by
//! (code, python and torch versions), so a re-run after data growth runs only new problems.
//!
//! Its tables are [`cudarl_tables::kb_specs::KbSpecRow`] and
//! [`cudarl_tables::kb_specs::CoverageRow`]; readers take the native ABIs through
//! [`crate::kb_judge::native_abis`].

use std::collections::BTreeMap;

use arrow::record_batch::RecordBatch;
use cudarl_core::Digest;
use cudarl_core::{InputDecl, OutputDecl, ParamsError, Stage, StageContext, StageError};
use cudarl_data::Table;
use cudarl_tables::TableRow;
use cudarl_tables::kb_specs::{CoverageRow, KbSpecRow};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::common::{data_err, write_output};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "kb-specs";

fn d_levels() -> Vec<i64> {
    vec![1, 2]
}

/// Params of `kb-specs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// KernelBench levels to derive signatures for.
    #[serde(default = "d_levels")]
    pub levels: Vec<i64>,
}

/// The stage.
#[derive(Debug)]
pub struct KbSpecs {
    params: Params,
}

impl KbSpecs {
    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        Ok(KbSpecs {
            params: crate::common::parse_params(t)?,
        })
    }
}

use cudarl_cuda::pyworker::{PyWorker, python_versions};

use cudarl_cuda::task::c_type;

/// The native signature for a worker answer (inputs, parameters, outputs, then sizes).
pub fn native_signature(ans: &Value) -> Option<String> {
    let mut params = Vec::new();
    let list = |k: &str| ans[k].as_array().cloned().unwrap_or_default();
    for b in list("inputs").iter().chain(list("params").iter()) {
        let name = b["name"].as_str()?;
        if b.get("scalar").is_some() {
            params.push(format!("float {name}"));
        } else {
            params.push(format!("const {}* {name}", c_type(b["dtype"].as_str()?)?));
        }
    }
    for b in list("outputs") {
        params.push(format!(
            "{}* {}",
            c_type(b["dtype"].as_str()?)?,
            b["name"].as_str()?
        ));
    }
    if let Some(sizes) = ans["sizes"].as_object() {
        for k in sizes.keys() {
            params.push(format!("int64_t {k}"));
        }
    }
    params.push("cudaStream_t stream".into());
    Some(format!("extern \"C\" void launch({})", params.join(", ")))
}

impl Stage for KbSpecs {
    stage_identity!(KIND, 1);
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            InputDecl::node("problems", "ingest-kernelbench", "problems"),
            InputDecl::external("worker"),
        ]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("kb_specs", KbSpecRow::schema()),
            OutputDecl::table("coverage", CoverageRow::schema()),
        ]
    }
    worker_script_external!();
    fn environment(
        &self,
        ctx: &cudarl_core::ResolveContext,
    ) -> Result<BTreeMap<String, String>, StageError> {
        // The torch version decides what runs on the meta device.
        let v = python_versions(&ctx.root).map_err(StageError::failed)?;
        Ok(BTreeMap::from([("python torch".to_string(), v)]))
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let t = Table::read(ctx.input_path("problems")?, "problems").map_err(data_err)?;
        let ids = t.req_strings("problem_id").map_err(data_err)?;
        let levels = t.req_ints("level").map_err(data_err)?;
        let codes = t.req_strings("code").map_err(data_err)?;
        let worker_src =
            cudarl_cuda::pyworker::script_source(ctx.root()).map_err(StageError::failed)?;
        let memo = ctx.memo("kb-specs-v2")?;
        let mut worker: Option<PyWorker> = None;
        let mut rows: Vec<(String, i64, Value)> = Vec::new();
        let selected: Vec<usize> = (0..t.rows())
            .filter(|&i| {
                levels
                    .get(i)
                    .is_some_and(|l| self.params.levels.contains(&l))
            })
            .collect();
        let progress = ctx.progress("problems", Some(selected.len() as u64));
        for i in selected {
            let (Some(id), Some(code)) = (ids.get(i), codes.get(i)) else {
                continue;
            };
            let level: i64 = levels.get(i).unwrap_or(0);
            let mut h = blake3::Hasher::new_derive_key("cudarl-pipe kb-specs row v1");
            h.update(&worker_src);
            h.update(id.as_bytes());
            h.update(&[0]);
            h.update(code.as_bytes());
            let key = Digest(*h.finalize().as_bytes());
            let ans = match memo.get(&key)? {
                Some(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
                None => {
                    if worker.is_none() {
                        worker = Some(PyWorker::start(ctx.root()).map_err(StageError::failed)?);
                    }
                    let w = worker.as_mut().expect("started");
                    let a = w
                        .call(
                            &serde_json::json!({"op": "signature", "problem_id": id, "code": code}),
                        )
                        .map_err(StageError::failed)?;
                    memo.put(&key, a.to_string().as_bytes())?;
                    a
                }
            };
            rows.push((id.to_string(), level, ans));
            progress.inc(1);
        }
        progress.finish();
        let (batch, cov) = specs_batch(&rows)?;
        write_output(ctx, "kb_specs", &batch)?;
        for (l, (n, c)) in &cov {
            let f = *c as f64 / (*n).max(1) as f64;
            if let Some(g) = coverage_goal(*l)
                && f < g
            {
                ctx.warn(format!(
                    "KernelBench level {l}: {c} of {n} problems have a native signature ({:.0}%, goal {:.0}%)",
                    f * 100.0,
                    g * 100.0
                ));
            }
        }
        write_output(ctx, "coverage", &coverage_batch(&cov)?)
    }
}

/// Per KernelBench level: (problems, problems with a native signature).
type Coverage = BTreeMap<i64, (i64, i64)>;

/// The share of a KernelBench level's problems that should get a native signature (levels 1
/// and 2; none for the others); `run` warns below it.
fn coverage_goal(level: i64) -> Option<f64> {
    match level {
        1 => Some(0.8),
        2 => Some(0.6),
        _ => None,
    }
}

/// The `kb_specs` table of the worker's answers `rows` (problem id, level, answer), and the
/// coverage per level.
///
/// # Errors
/// The rows do not fit the schema.
fn specs_batch(rows: &[(String, i64, Value)]) -> Result<(RecordBatch, Coverage), StageError> {
    let mut cov = Coverage::new();
    let mut out = Vec::with_capacity(rows.len());
    for (id, level, a) in rows {
        let sig = if a["ok"] == Value::Bool(true) && a["excluded"].is_null() {
            native_signature(a)
        } else {
            None
        };
        let reason = match sig {
            Some(_) => None,
            None => Some(
                a["excluded"]
                    .as_str()
                    .or(a["error"].as_str())
                    .unwrap_or("no signature")
                    .to_string(),
            ),
        };
        let c = cov.entry(*level).or_default();
        c.0 += 1;
        c.1 += sig.is_some() as i64;
        out.push(KbSpecRow {
            problem_id: id.clone(),
            level: *level,
            covered: sig.is_some(),
            excluded_reason: reason,
            signature: sig,
            sizes_json: a["sizes"].to_string(),
            buffers_json: serde_json::json!({"inputs": a["inputs"], "params": a["params"], "outputs": a["outputs"]})
                .to_string(),
            constants_json: a["constants"].to_string(),
        });
    }
    Ok((cudarl_tables::to_batch(&out).map_err(data_err)?, cov))
}

/// The `coverage` table: per level, problems, covered problems, their share and the goal.
///
/// # Errors
/// The rows do not fit the schema.
fn coverage_batch(cov: &Coverage) -> Result<RecordBatch, StageError> {
    let rows: Vec<CoverageRow> = cov
        .iter()
        .map(|(&level, &(problems, covered))| CoverageRow {
            level,
            problems,
            covered,
            fraction: covered as f64 / problems.max(1) as f64,
            goal: coverage_goal(level),
        })
        .collect();
    cudarl_tables::to_batch(&rows).map_err(data_err)
}
