//! `testgen`: recorded tests for KernelBench problems. The Python worker
//! (`python/cudarl_worker.py`) runs each covered problem's reference `Model` per seed and writes
//! inputs, parameters (state dict) and outputs as a safetensors blob into the store; the rows
//! name the blob, its tensors (name, shape, dtype), the seed, whether the seed is public or
//! hidden, and the input distribution.
//!
//! Test sizes: KernelBench's own sizes reach gigabytes per problem (median about 1 GB for L1 and
//! L2 here), too much to record per seed. The worker's `plan` halves the problem's size
//! constants (largest first, on the meta device, then checked by a real run) until one test
//! fits `budget_bytes`; the full sizes stay for timing, where `validate` runs the reference live
//! on the GPU. Problems that cannot be brought under `16 x budget_bytes` are listed with the
//! reason.
//!
//! Input distributions (KernelBench's `rand_mix` idea): seed `k` of a problem draws its float
//! inputs from `distributions[k % len]` (`native` = the problem's own `get_inputs()`, `signed`,
//! `scaled`, `special`; see the worker's `redraw`). Problems whose `get_inputs` constrains its
//! values (softmax, abs, triu, ...) keep `native` on every seed, and so does any seed whose
//! redrawn inputs make the reference non-finite; both are marked in `kb_testgen.rand_mix_note`.
//!
//! Row memo: each (problem code, sizes, seed, distribution, worker, torch) runs once; a re-run
//! after data growth runs only new rows.

use std::collections::BTreeMap;

use cudarl_core::{Digest, InputDecl, OutputDecl, ParamsError, Stage, StageContext, StageError};
use cudarl_data::Table;
use cudarl_tables::TableRow;
use cudarl_tables::kb_specs::{KbTestRow, KbTestgenRow};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::{data_err, write_output};
use cudarl_cuda::pyworker::{PyWorker, python_versions};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "testgen";

/// Version of the recorded-test semantics (row memo key and code version).
pub const TESTGEN_VERSION: u32 = 1;

fn d_levels() -> Vec<i64> {
    vec![1, 2]
}
fn d_two() -> usize {
    2
}
fn d_budget() -> u64 {
    1 << 20
}
fn d_dists() -> Vec<String> {
    ["native", "signed", "scaled", "special"]
        .map(String::from)
        .to_vec()
}
fn d_device() -> String {
    "cpu".into()
}

/// Params of `testgen`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// KernelBench levels.
    #[serde(default = "d_levels")]
    pub levels: Vec<i64>,
    /// Public seeds per problem (0, 1, ...).
    #[serde(default = "d_two")]
    pub public_seeds: usize,
    /// Hidden seeds per problem (from the store's secret salt).
    #[serde(default = "d_two")]
    pub hidden_seeds: usize,
    /// Byte budget of one test's tensors (inputs + parameters + outputs).
    #[serde(default = "d_budget")]
    pub budget_bytes: u64,
    /// Input distributions, cycled over a problem's seeds (public first, then hidden).
    #[serde(default = "d_dists")]
    pub distributions: Vec<String>,
    /// Where references run: `cpu` (default: deterministic and the same on every machine) or
    /// `cuda`.
    #[serde(default = "d_device")]
    pub device: String,
    /// Only the first N covered problems of each level (quick runs and tests).
    #[serde(default)]
    pub limit: Option<usize>,
    /// CPU threads of the reference runs (`torch.set_num_threads`); 0: torch's default (one per
    /// core). One by default: the recorded outputs do not depend on the machine's core count,
    /// and no OpenMP threads spin on the cores `validate`'s nvcc builds use beside it (with one
    /// per core on a 16-core H200 host, testgen took 245 s beside validate against 36 s alone,
    /// and validate 257 s against about 210 s: benchmarks/results/main_job_h200_2026-11-28_kernelbench_eval.json).
    #[serde(default = "d_threads")]
    pub threads: usize,
}

fn d_threads() -> usize {
    1
}

impl Params {
    /// The seeds of one problem's tests: `public_seeds` public ones (0, 1, ...), then
    /// `hidden_seeds` drawn with the store's salt for problem `pid` (kept below 2^63).
    fn seeds(&self, salt: &[u8], pid: &str) -> Vec<(u64, &'static str)> {
        let mut seeds: Vec<(u64, &'static str)> = (0..self.public_seeds as u64)
            .map(|s| (s, "public"))
            .collect();
        seeds.extend(
            cudarl_cuda::verdict::hidden_seeds(salt, pid, "testgen", self.hidden_seeds)
                .into_iter()
                .map(|s| (s & (i64::MAX as u64), "hidden")),
        );
        seeds
    }
}

/// The stage.
#[derive(Debug)]
pub struct Testgen {
    params: Params,
}

impl Testgen {
    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params, an unknown distribution or device.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        for d in &params.distributions {
            if !["native", "signed", "scaled", "special"].contains(&d.as_str()) {
                return Err(format!(
                    "distributions: unknown `{d}` (native, signed, scaled, special)"
                )
                .into());
            }
        }
        if params.distributions.is_empty() {
            return Err("distributions: empty".into());
        }
        if !["cpu", "cuda"].contains(&params.device.as_str()) {
            return Err(format!("device: `{}` is not cpu or cuda", params.device).into());
        }
        Ok(Testgen { params })
    }
}

/// The worker's answer for one test, memoized.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Recorded {
    blob: Option<Digest>,
    tensors: Value,
    bytes: u64,
    ms: f64,
    finite: bool,
    error: Option<String>,
}

/// One recorded test: (problem, seed, split, distribution, sizes JSON, the worker's record).
type TestRow = (String, u64, &'static str, String, String, Recorded);

fn key_of(parts: &[&[u8]]) -> Digest {
    let mut h = blake3::Hasher::new_derive_key("cudarl-pipe testgen row v1");
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    Digest(*h.finalize().as_bytes())
}

/// The test sizes of problem `pid` (`code`, size dimensions `dims`) under `budget_bytes`, as the
/// Python worker plans them (`ok`, `sizes`, `bytes`, `full_bytes`, `constrained`, `error`):
/// from the memo, else asked now and memoized.
///
/// # Errors
/// The worker failed, or the memo could not be read or written.
fn plan_sizes(
    call: &mut dyn FnMut(Value) -> Result<Value, StageError>,
    memo: &cudarl_core::Memo,
    (worker_src, versions): (&[u8], &str),
    (pid, code, dims): (&str, &str, &[String]),
    budget_bytes: u64,
) -> Result<Value, StageError> {
    let plan_key = key_of(&[
        b"plan",
        worker_src,
        versions.as_bytes(),
        code.as_bytes(),
        dims.join(",").as_bytes(),
        &budget_bytes.to_le_bytes(),
    ]);
    Ok(match memo.get(&plan_key)? {
        Some(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
        None => {
            let a = call(json!({"op": "plan", "problem_id": pid, "code": code,
                "dims": dims, "budget_bytes": budget_bytes}))?;
            memo.put(&plan_key, a.to_string().as_bytes())?;
            a
        }
    })
}

/// Why a problem gets no tests from its `plan` ([`plan_sizes`]), if it does not: the worker
/// found no sizes, or the smallest it found take more than 16 x `budget_bytes`.
fn excluded_by_plan(plan: &Value, budget_bytes: u64) -> Option<String> {
    if plan["ok"] != Value::Bool(true) {
        return Some(format!(
            "test sizes: {}",
            plan["error"].as_str().unwrap_or("the worker failed")
        ));
    }
    let test_bytes = plan["bytes"].as_i64().unwrap_or(0);
    (test_bytes as u64 > 16 * budget_bytes).then(|| {
        format!(
            "no test sizes under 16 x {budget_bytes} bytes (smallest found: {test_bytes} bytes; its sizes are not reducible through module constants)"
        )
    })
}

/// The worker's record of one test (problem `pid`'s `code` on `sizes`, `seed`, inputs drawn
/// from `dist`, reference run on `device`): from the memo when its blob is still in the store,
/// else recorded now (the tensors ingested into the store) and memoized.
///
/// # Errors
/// The worker failed, or the store or memo could not be written.
fn record_test(
    call: &mut dyn FnMut(Value) -> Result<Value, StageError>,
    (memo, store, tmp): (&cudarl_core::Memo, &cudarl_core::Store, &std::path::Path),
    (worker_src, versions, device): (&[u8], &str, &str),
    (pid, code, sizes, sizes_s): (&str, &str, &Value, &str),
    seed: u64,
    dist: &str,
) -> Result<Recorded, StageError> {
    let key = key_of(&[
        b"test",
        worker_src,
        versions.as_bytes(),
        code.as_bytes(),
        sizes_s.as_bytes(),
        &seed.to_le_bytes(),
        dist.as_bytes(),
        device.as_bytes(),
    ]);
    let cached = memo
        .get(&key)?
        .and_then(|b| serde_json::from_slice::<Recorded>(&b).ok())
        .filter(|r| r.blob.is_none_or(|d| store.has_blob(&d)));
    let rec = match cached {
        Some(r) => r,
        None => {
            let path = tmp.join("test.safetensors");
            let a = call(json!({"op": "testgen", "problem_id": pid, "code": code,
                    "sizes": sizes, "seed": seed, "dist": dist, "path": path,
                    "device": device}))?;
            let ok = a["ok"] == Value::Bool(true);
            let (blob, bytes) = if ok {
                let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                (Some(store.ingest_file(&path)?), bytes)
            } else {
                (None, 0)
            };
            let r = Recorded {
                blob,
                tensors: a["tensors"].clone(),
                bytes,
                ms: a["ms"].as_f64().unwrap_or(0.0),
                finite: a["finite"].as_bool().unwrap_or(false),
                error: a["error"].as_str().map(str::to_string),
            };
            memo.put(&key, &serde_json::to_vec(&r).expect("json"))?;
            r
        }
    };
    Ok(rec)
}

impl Stage for Testgen {
    stage_identity!(KIND, TESTGEN_VERSION);
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            InputDecl::node("problems", "ingest-kernelbench", "problems"),
            InputDecl::node("specs", "kb-specs", "kb_specs"),
            InputDecl::external("worker"),
        ]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("kb_tests", KbTestRow::schema()),
            OutputDecl::table(KbTestgenRow::NAME, KbTestgenRow::schema()),
        ]
    }
    worker_script_external!();
    fn environment(
        &self,
        ctx: &cudarl_core::ResolveContext,
    ) -> Result<BTreeMap<String, String>, StageError> {
        let mut env = BTreeMap::from([(
            "python torch".to_string(),
            python_versions(&ctx.root).map_err(StageError::failed)?,
        )]);
        if self.params.hidden_seeds > 0 {
            // Hidden seeds come from the store's secret salt: another salt, other tests. A
            // verb that only reads the store draws none.
            let salt = if ctx.read_only {
                cudarl_cuda::verdict::drawn_hidden_salt(&ctx.store)
            } else {
                cudarl_cuda::verdict::hidden_salt(&ctx.store).map(Some)
            }
            .map_err(|e| StageError::Failed(e.to_string()))?;
            env.insert(
                "hidden salt".into(),
                salt.map_or("not drawn yet".into(), |s| {
                    blake3::hash(&s).to_hex()[..12].to_string()
                }),
            );
        }
        Ok(env)
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let p = &self.params;
        let problem_rows = cudarl_tables::read::<cudarl_tables::problems::ProblemRow>(
            ctx.input_path("problems")?,
            "problems",
        )
        .map_err(data_err)?;
        let code_of: BTreeMap<&str, &str> = problem_rows
            .iter()
            .map(|r| (r.problem_id.as_str(), r.code.as_str()))
            .collect();
        let st = Table::read(ctx.input_path("specs")?, "kb_specs").map_err(data_err)?;
        let selected = selected_specs(&st, p)?;
        let worker_src =
            cudarl_cuda::pyworker::script_source(ctx.root()).map_err(StageError::failed)?;
        // The memo keys hold the interpreter, torch and the threads the references run with.
        let versions = format!(
            "{} threads={}",
            python_versions(ctx.root()).map_err(StageError::failed)?,
            p.threads
        );
        let salt = if p.hidden_seeds > 0 {
            cudarl_cuda::verdict::hidden_salt(ctx.store())
                .map_err(|e| StageError::Failed(e.to_string()))?
        } else {
            Vec::new()
        };
        let memo = ctx.memo("testgen-v1")?;
        let store = ctx.store().clone();
        let tmp = store.temp_dir()?;
        let mut worker: Option<PyWorker> = None;
        let mut call = |req: Value| -> Result<Value, StageError> {
            if worker.is_none() {
                worker = Some(start_worker(ctx.root(), p.threads)?);
            }
            worker
                .as_mut()
                .expect("started")
                .call(&req)
                .map_err(StageError::failed)
        };
        let progress = ctx.progress("problems", Some(selected.len() as u64));
        let mut tests: Vec<TestRow> = Vec::new();
        let mut problems: Vec<KbTestgenRow> = Vec::new();
        let mut referenced = Vec::new();
        for (pid, level, dims) in &selected {
            let Some(code) = code_of.get(pid.as_str()) else {
                return Err(StageError::bad_input(
                    "kb_specs",
                    Some("problem_id"),
                    format!("`{pid}` is not in the problems table"),
                ));
            };
            let plan = plan_sizes(
                &mut call,
                &memo,
                (&worker_src, &versions),
                (pid, code, dims),
                p.budget_bytes,
            )?;
            let sizes = plan["sizes"].clone();
            let sizes_s = if sizes.is_object() {
                sizes.to_string()
            } else {
                "{}".into()
            };
            let test_bytes = plan["bytes"].as_i64().unwrap_or(0);
            let full_bytes = plan["full_bytes"].as_i64().unwrap_or(0);
            let row = |status: &str, reason: Option<String>, note: Option<String>, n: usize| {
                KbTestgenRow {
                    problem_id: pid.to_string(),
                    level: *level,
                    status: status.into(),
                    reason,
                    test_sizes_json: sizes_s.clone(),
                    test_bytes,
                    full_bytes,
                    rand_mix_note: note,
                    tests: n as i64,
                }
            };
            if let Some(why) = excluded_by_plan(&plan, p.budget_bytes) {
                problems.push(row("excluded", Some(why), None, 0));
                progress.inc(1);
                continue;
            }
            let constrained = plan["constrained"].as_str().map(str::to_string);
            let mut notes: Vec<String> = constrained
                .iter()
                .map(|c| format!("{c}: every seed keeps the native distribution"))
                .collect();
            let seeded = record_seeds(
                &mut call,
                (&memo, &store, tmp.path()),
                (&worker_src, &versions, &p.device),
                (pid, code, &sizes, &sizes_s),
                &p.seeds(&salt, pid),
                constrained.is_none().then_some(p.distributions.as_slice()),
            )?;
            referenced.extend(seeded.blobs);
            notes.extend(seeded.notes);
            if let Some(f) = seeded.failure {
                problems.push(row("excluded", Some(f), None, 0));
            } else {
                let note = (!notes.is_empty()).then(|| notes.join("; "));
                problems.push(row("recorded", None, note, seeded.tests.len()));
                tests.extend(seeded.tests);
            }
            progress.inc(1);
        }
        progress.finish();
        for d in referenced {
            ctx.reference_blob(d);
        }
        write_tables(ctx, &tests, &problems, &p.device)
    }
}

/// A Python worker in `root` whose reference runs use `threads` CPU threads. The memo keys name
/// the thread count: a worker that did not take it must not record under them.
///
/// # Errors
/// The worker cannot start or did not set the threads.
fn start_worker(root: &std::path::Path, threads: usize) -> Result<PyWorker, StageError> {
    let mut w = PyWorker::start(root).map_err(StageError::failed)?;
    let a = w
        .call(&json!({"op": "threads", "n": threads}))
        .map_err(StageError::failed)?;
    if a["ok"] != Value::Bool(true) {
        return Err(StageError::Failed(format!(
            "the Python worker did not set {threads} CPU threads: {}",
            a["error"]
        )));
    }
    Ok(w)
}

/// One planned problem's tests, one per seed (`record_seeds`).
struct Seeded {
    /// The recorded tests (none when `failure` is set).
    tests: Vec<TestRow>,
    /// The store blobs the records reference (also those of an excluded problem: their memo
    /// entries point at them).
    blobs: Vec<Digest>,
    /// Seeds whose distribution made the reference non-finite and fell back to `native`.
    notes: Vec<String>,
    /// Why the problem is excluded: the reference raised, or its output is not finite.
    failure: Option<String>,
}

/// Records problem `pid`'s test for every seed of `seeds` at `sizes`, with the input
/// distributions `dists` in turn (`None`: a constrained problem, `native` for every seed); a
/// distribution that makes the reference non-finite falls back to `native` for that seed. The
/// first seed whose reference raises or stays non-finite excludes the problem.
///
/// # Errors
/// The worker or the store failed.
fn record_seeds(
    call: &mut dyn FnMut(Value) -> Result<Value, StageError>,
    at: (&cudarl_core::Memo, &cudarl_core::Store, &std::path::Path),
    env: (&[u8], &str, &str),
    (pid, code, sizes, sizes_s): (&str, &str, &Value, &str),
    seeds: &[(u64, &'static str)],
    dists: Option<&[String]>,
) -> Result<Seeded, StageError> {
    let mut out = Seeded {
        tests: vec![],
        blobs: vec![],
        notes: vec![],
        failure: None,
    };
    for (k, (seed, split)) in seeds.iter().enumerate() {
        let mut dist = dists.map_or("native".to_string(), |d| d[k % d.len()].clone());
        let rec = loop {
            let rec = record_test(call, at, env, (pid, code, sizes, sizes_s), *seed, &dist)?;
            if dist != "native" && rec.error.is_none() && !rec.finite {
                out.notes.push(format!(
                    "seed {seed}: `{dist}` inputs make the reference non-finite; native used"
                ));
                dist = "native".into();
                continue;
            }
            break rec;
        };
        if let Some(e) = &rec.error {
            out.failure = Some(format!("the reference raised: {e}"));
            break;
        }
        if !rec.finite {
            out.failure = Some(format!(
                "the reference output is not finite (seed {seed}, {dist})"
            ));
            break;
        }
        if let Some(d) = rec.blob {
            out.blobs.push(d);
        }
        out.tests.push((
            pid.to_string(),
            *seed,
            split,
            dist,
            sizes_s.to_string(),
            rec,
        ));
    }
    if out.failure.is_some() {
        out.tests.clear();
    }
    Ok(out)
}

/// The covered problems of `st` (the `kb_specs` table) at the levels asked, at most `limit`
/// per level: (problem id, level, the names of its size dimensions).
///
/// # Errors
/// A required column of `kb_specs` is missing or has the wrong type (named).
fn selected_specs(st: &Table, p: &Params) -> Result<Vec<(String, i64, Vec<String>)>, StageError> {
    let sid = st.req_strings("problem_id").map_err(data_err)?;
    let slevel = st.req_ints("level").map_err(data_err)?;
    let scov = st.req_bools("covered").map_err(data_err)?;
    let ssizes = st.req_strings("sizes_json").map_err(data_err)?;
    let mut selected: Vec<(String, i64, Vec<String>)> = Vec::new();
    let mut per_level: BTreeMap<i64, usize> = BTreeMap::new();
    for i in 0..st.rows() {
        let (Some(id), Some(level)) = (sid.get(i), slevel.get(i)) else {
            continue;
        };
        if !scov.get(i).unwrap_or(false) || !p.levels.contains(&level) {
            continue;
        }
        let n = per_level.entry(level).or_default();
        if p.limit.is_some_and(|l| *n >= l) {
            continue;
        }
        *n += 1;
        let dims: Vec<String> = ssizes
            .get(i)
            .and_then(|s| serde_json::from_str::<BTreeMap<String, Value>>(s).ok())
            .map(|m| m.into_keys().collect())
            .unwrap_or_default();
        selected.push((id.to_string(), level, dims));
    }
    Ok(selected)
}

/// Writes `kb_tests` (one row per recorded test) and `kb_testgen` (one row per problem: status,
/// reason, sizes, bytes, note, tests recorded), with a warning when problems got no tests.
///
/// # Errors
/// A batch does not match its schema, or the store write failed.
fn write_tables(
    ctx: &mut StageContext<'_>,
    tests: &[TestRow],
    problems: &[KbTestgenRow],
    device: &str,
) -> Result<(), StageError> {
    let excluded = problems.iter().filter(|r| r.status == "excluded").count();
    if excluded > 0 {
        ctx.warn(format!(
            "{excluded} of {} covered problems have no recorded tests (see kb_testgen.reason)",
            problems.len()
        ));
    }
    let rows: Vec<KbTestRow> = tests
        .iter()
        .map(|t| KbTestRow {
            problem_id: t.0.clone(),
            seed: t.1 as i64,
            split: t.2.to_string(),
            dist: t.3.clone(),
            sizes_json: t.4.clone(),
            blob: t.5.blob.map(|d| d.to_string()).unwrap_or_default(),
            tensors_json: t.5.tensors.to_string(),
            bytes: t.5.bytes as i64,
            device: device.to_string(),
        })
        .collect();
    write_output(
        ctx,
        "kb_tests",
        &cudarl_tables::to_batch(&rows).map_err(data_err)?,
    )?;
    write_output(
        ctx,
        KbTestgenRow::NAME,
        &cudarl_tables::to_batch(problems).map_err(data_err)?,
    )
}
