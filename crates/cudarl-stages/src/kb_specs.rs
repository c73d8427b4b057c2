//! `kb-specs`: native task signatures for KernelBench problems, derived by the Python worker
//! (`python/cudarl_worker.py`, op `signature`) from each problem's own `get_init_inputs()`,
//! `Model` and `get_inputs()` run on torch's meta device (shapes and dtypes only), with the
//! coverage per level and the reason for every problem left out.
//!
//! The worker is a real `python3` process with torch, found as `$CUDARL_PYTHON`, else
//! `<root>/.venv/bin/python`, else `python3` on `PATH`. Each problem's answer is memoized by
//! (code, python and torch versions), so a re-run after data growth runs only new problems.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use cudarl_core::Digest;
use cudarl_core::{InputDecl, OutputDecl, Stage, StageContext, StageError};
use cudarl_data::Table;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::common::{data_err, params_json, write_output};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "kb-specs";

/// `kb_specs`: one row per KernelBench problem of the selected levels.
///
/// | column | type | meaning |
/// |---|---|---|
/// | problem_id | utf8 | e.g. `kb/L1/19_ReLU` |
/// | level | int64 | 1..4 |
/// | covered | bool | a native signature exists |
/// | excluded_reason | utf8, nullable | why not (non-tensor inputs or outputs, dtype, the problem fails on the meta device, a missing module) |
/// | signature | utf8, nullable | `extern "C" void launch(...)`: inputs, parameters (state dict), outputs, sizes, stream |
/// | sizes_json | utf8 | named integer sizes used by the buffers (module constants), e.g. `{"batch_size":16}` |
/// | buffers_json | utf8 | inputs, params, outputs: name, shape, dims (size names or literals), dtype |
/// | constants_json | utf8 | every module-level integer constant |
pub static KB_SPECS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("problem_id", DataType::Utf8, false),
        Field::new("level", DataType::Int64, false),
        Field::new("covered", DataType::Boolean, false),
        Field::new("excluded_reason", DataType::Utf8, true),
        Field::new("signature", DataType::Utf8, true),
        Field::new("sizes_json", DataType::Utf8, false),
        Field::new("buffers_json", DataType::Utf8, false),
        Field::new("constants_json", DataType::Utf8, false),
    ]))
});

/// `coverage`: per level, problems, covered, fraction and the goal (80% of level 1, 60% of level
/// 2).
pub static COVERAGE: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("level", DataType::Int64, false),
        Field::new("problems", DataType::Int64, false),
        Field::new("covered", DataType::Int64, false),
        Field::new("fraction", DataType::Float64, false),
        Field::new("goal", DataType::Float64, true),
    ]))
});

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
    pub fn from_table(t: toml::Table) -> Result<Self, String> {
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

/// The native ABI of KernelBench problem `problem_id` from a `kb_specs` table (`path`):
/// `Ok(Ok(abi))`, or `Ok(Err(why))` for a problem without a native signature (its
/// `excluded_reason`) or not in the table.
///
/// # Errors
/// As [`native_abis`].
pub fn native_abi(
    path: &std::path::Path,
    problem_id: &str,
) -> Result<Result<cudarl_cuda::native_abi::KbNative, String>, StageError> {
    Ok(native_abis(path)?
        .remove(problem_id)
        .unwrap_or_else(|| Err(format!("`{problem_id}` is not in kb-specs' levels"))))
}

/// Every problem of a `kb_specs` table (`path`): its native ABI, or why it has none (its
/// `excluded_reason`).
///
/// # Errors
/// The table cannot be read, lacks a column, or a JSON column does not parse (naming the file
/// and the column).
pub fn native_abis(
    path: &std::path::Path,
) -> Result<BTreeMap<String, Result<cudarl_cuda::native_abi::KbNative, String>>, StageError> {
    let t = Table::read(path, "kb_specs").map_err(data_err)?;
    let ids = t.req_strings("problem_id").map_err(data_err)?;
    let sig = t.req_strings("signature").map_err(data_err)?;
    let why = t.req_strings("excluded_reason").map_err(data_err)?;
    let sizes = t.req_strings("sizes_json").map_err(data_err)?;
    let bufs = t.req_strings("buffers_json").map_err(data_err)?;
    let mut out = BTreeMap::new();
    for i in 0..t.rows() {
        let Some(id) = ids.get(i) else { continue };
        let abi = match sig.get(i) {
            None => Err(format!(
                "`{id}` has no native signature: {}",
                why.get(i).unwrap_or("no signature")
            )),
            Some(signature) => Ok(cudarl_cuda::native_abi::KbNative::from_row(
                signature,
                bufs.get(i).unwrap_or("{}"),
                sizes.get(i).unwrap_or("{}"),
            )
            .map_err(|e| StageError::bad_input(path.display().to_string(), None, e))?),
        };
        out.insert(id.to_string(), abi);
    }
    Ok(out)
}

impl Stage for KbSpecs {
    fn kind(&self) -> &str {
        KIND
    }
    fn code_version(&self) -> u32 {
        1
    }
    fn params(&self) -> Value {
        params_json(&self.params)
    }
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            InputDecl::node("problems", "ingest-kernelbench", "problems"),
            InputDecl::external("worker"),
        ]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("kb_specs", KB_SPECS.clone()),
            OutputDecl::table("coverage", COVERAGE.clone()),
        ]
    }
    fn resolve_external(
        &self,
        _input: &str,
        ctx: &cudarl_core::ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        crate::common::single_file(&ctx.root, cudarl_cuda::pyworker::SCRIPT, "worker")
    }
    fn environment(
        &self,
        ctx: &cudarl_core::ResolveContext,
    ) -> Result<BTreeMap<String, String>, StageError> {
        // The torch version decides what runs on the meta device.
        let v = python_versions(&ctx.root).map_err(StageError::Failed)?;
        Ok(BTreeMap::from([("python torch".to_string(), v)]))
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let t = Table::read(ctx.input_path("problems")?, "problems").map_err(data_err)?;
        let ids = t.req_strings("problem_id").map_err(data_err)?;
        let levels = t.req_ints("level").map_err(data_err)?;
        let codes = t.req_strings("code").map_err(data_err)?;
        let worker_src =
            cudarl_cuda::pyworker::script_source(ctx.root()).map_err(StageError::Failed)?;
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
                        worker = Some(PyWorker::start(ctx.root()).map_err(StageError::Failed)?);
                    }
                    let w = worker.as_mut().expect("started");
                    let a = w
                        .call(
                            &serde_json::json!({"op": "signature", "problem_id": id, "code": code}),
                        )
                        .map_err(StageError::Failed)?;
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
/// The columns do not match the schema.
fn specs_batch(rows: &[(String, i64, Value)]) -> Result<(RecordBatch, Coverage), StageError> {
    let mut cov = Coverage::new();
    let mut cols: [Vec<Option<String>>; 5] = Default::default();
    let (mut pid, mut lvl, mut covered) = (Vec::new(), Vec::new(), Vec::new());
    for (id, level, a) in rows {
        let sig = if a["ok"] == Value::Bool(true) && a["excluded"].is_null() {
            native_signature(a)
        } else {
            None
        };
        let reason = if sig.is_some() {
            None
        } else {
            Some(
                a["excluded"]
                    .as_str()
                    .or(a["error"].as_str())
                    .unwrap_or("no signature")
                    .to_string(),
            )
        };
        let c = cov.entry(*level).or_default();
        c.0 += 1;
        c.1 += sig.is_some() as i64;
        pid.push(id.clone());
        lvl.push(*level);
        covered.push(sig.is_some());
        cols[0].push(reason);
        cols[1].push(sig);
        cols[2].push(Some(a["sizes"].to_string()));
        cols[3].push(Some(
            serde_json::json!({"inputs": a["inputs"], "params": a["params"], "outputs": a["outputs"]})
                .to_string(),
        ));
        cols[4].push(Some(a["constants"].to_string()));
    }
    let s = |v: &Vec<Option<String>>| -> ArrayRef { Arc::new(StringArray::from(v.clone())) };
    let batch = cudarl_data::parquet_io::batch(
        &KB_SPECS.clone(),
        vec![
            Arc::new(StringArray::from(pid)),
            Arc::new(Int64Array::from(lvl)),
            Arc::new(BooleanArray::from(covered)),
            s(&cols[0]),
            s(&cols[1]),
            s(&cols[2]),
            s(&cols[3]),
            s(&cols[4]),
        ],
    )
    .map_err(data_err)?;
    Ok((batch, cov))
}

/// The `coverage` table: per level, problems, covered problems, their share and the goal.
///
/// # Errors
/// The columns do not match the schema.
fn coverage_batch(cov: &Coverage) -> Result<RecordBatch, StageError> {
    cudarl_data::parquet_io::batch(
        &COVERAGE.clone(),
        vec![
            Arc::new(Int64Array::from(cov.keys().copied().collect::<Vec<_>>())),
            Arc::new(Int64Array::from(
                cov.values().map(|v| v.0).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                cov.values().map(|v| v.1).collect::<Vec<_>>(),
            )),
            Arc::new(Float64Array::from(
                cov.values()
                    .map(|v| v.1 as f64 / v.0.max(1) as f64)
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Float64Array::from(
                cov.keys().map(|l| coverage_goal(*l)).collect::<Vec<_>>(),
            )),
        ],
    )
    .map_err(data_err)
}
