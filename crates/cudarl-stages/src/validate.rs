//! `validate`: every kernel of a kernels table through the harness, with the row-level memo
//! (a kernel already validated under the same spec, harness version and environment is not run
//! again), into `validations`.
//!
//! On a machine without a GPU the verdicts are compile-only (`executed = false`) and the
//! environment in the key says so, so a GPU run later never reuses them.

use std::time::Duration;

use cudarl_core::{
    Digest, InputDecl, OutputDecl, ParamsError, RunPart, Stage, StageContext, StageError,
};
use cudarl_cuda::schedule::{GpuJob, ScheduleTimes, Scheduler, Step};
use cudarl_cuda::verdict::{Baselines, FullOptions, Verdict, hidden_salt, hidden_seeds, speedups};
use cudarl_cuda::worker::WorkerPool;
use cudarl_cuda::{Compiler, Nvcc, Rules, TaskSpec, check_compile_only};
use cudarl_data::Table;
use cudarl_rl::verdict_rows::{KernelMeta, agreement, fails_unrun, their_reason, validations};
use cudarl_tables::TableRow;
use cudarl_tables::validate::{AgreementRow, ValidationRow};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::common::{data_err, rl_err, write_output};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "validate";

/// Version of the verdict semantics; part of every row's memo key. 5: candidates run in the
/// sandboxed runner and are timed by the judge in windows of fresh inputs; builds are inspected
/// (preprocessed text, object, PTX); FLOP roofline; verdicts carry the candidate's output.
/// 6: half of the timed windows, chosen after they ran, compared with the reference (every
/// window checked for poison); host<->device copy times from a per-worker copy rate.
/// 7: references with a number in `maximum` / `minimum` evaluate (they failed as `cuda_error`).
/// 8: builds limited in CPU time per compiler process (a wall-clock backstop beside it); a
/// build stopped by a limit is not memoized; the object may import `exit` (nvcc's host stubs
/// of `__device__` functions) and the source may not name it.
/// 9: tests run in the windows that time (blocks at drawn places, drawn call orders, shared
/// memory poisoned before every window) with two cache probes per shape; up to eight sets of
/// every timed window compared with the reference; windows ordered by interprocess events; no
/// new executable memory in the runner once the candidate is loaded.
/// 10: an f32 output with a contraction is compared with `rtol` at most f32's rounding bound
/// `(8 sqrt(K) + 256) 2^-24` (`TaskSpec::rtol_for`).
/// 11: the linked library's code scanned for system-call and clock-read encodings
/// (`inspect::linked`); half-precision arithmetic in an f32 task's PTX rejects it
/// (`half-precision-math`).
/// 12: a failure on the judge's side (its own driver or libtorch error, out of GPU memory
/// included, or its worker died) runs the job again on a fresh worker; one that repeats is
/// `judge_error` (correctness not known, not memoized) instead of `cuda_error` or `crash`.
/// 13: a launcher without the task's signature is one error at the candidate's `launch` naming
/// the declaration the task expects (nvcc's errors on the shim's lines before).
pub const HARNESS_VERSION: u32 = 13;

pub use crate::common::Mode;

pub use cudarl_cuda::schedule::TimingMode;

fn d_timing() -> TimingMode {
    TimingMode::InTester
}

fn d_mode() -> Mode {
    Mode::Auto
}
fn d_timeout() -> u64 {
    20
}
fn d_two() -> usize {
    2
}
fn d_true() -> bool {
    true
}

/// Params of `validate`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Run mode.
    #[serde(default = "d_mode")]
    pub mode: Mode,
    /// Wall-clock limit per candidate run, seconds.
    #[serde(default = "d_timeout")]
    pub timeout_s: u64,
    /// Public seeds per shape.
    #[serde(default = "d_two")]
    pub public_seeds: usize,
    /// Hidden seeds per shape.
    #[serde(default = "d_two")]
    pub hidden_seeds: usize,
    /// Time candidates.
    #[serde(default = "d_true")]
    pub bench: bool,
    /// Validate the task kernels (`synth-tasks`: native ABI, what SFT and RL learn from).
    #[serde(default = "d_true")]
    pub tasks: bool,
    /// Validate the archives' torch-format kernels (SakanaAI sample, CUDA-L1; needs
    /// `kb-specs`/`testgen`). The default pipeline gives them their own node,
    /// `validate-archive`, so the main job (`rl-train`, `eval`) does not wait for them.
    #[serde(default)]
    pub archive: bool,
    /// CUDA-L1 rows of these GPUs (the archive has one kernel per problem and GPU).
    #[serde(default = "d_l1_gpus")]
    pub cuda_l1_gpus: Vec<String>,
    /// Build torch-format kernels on a machine without a GPU too (about a minute of CPU each:
    /// off by default; their verdicts then stop after the static checks).
    #[serde(default)]
    pub torch_builds_without_gpu: bool,
    /// At most this many archive kernels per source (quick runs and tests).
    #[serde(default)]
    pub archive_limit: Option<usize>,
    /// GPU worker processes testing task kernels concurrently on the one GPU; timing still runs
    /// alone ([`cudarl_cuda::worker::GpuLock`]). Not part of a verdict's memo key.
    #[serde(default = "d_gpu_workers")]
    pub gpu_workers: usize,
    /// Where candidates are timed. Measured (H200, `bench validate`, 57 kernels): see
    /// `benchmarks/results/harness_isolation_cost_h200_2026-11-26.json`. Not part of a
    /// verdict's memo key.
    #[serde(default = "d_timing")]
    pub timing: TimingMode,
    /// With `timing = "batched"`: candidates timed per exclusive hold of the GPU: the testers hand every candidate whose
    /// tests passed to one timing worker, which waits for this many (or the last ones), then
    /// takes the GPU alone once and times them one after another
    /// ([`cudarl_cuda::verdict::time_batch`]); 1 takes the GPU alone once per candidate. Each
    /// hold first waits for the tests in flight to finish. Measured (H100): validate 98.5 s at
    /// 32 against 118.9 s at 1, the same medians within 0.996-1.006
    /// (`benchmarks/results/validate_batched_timing_h100_2026-11-24.json`). Not part of a
    /// verdict's memo key.
    #[serde(default = "d_timing_batch")]
    pub timing_batch: usize,
    /// Milliseconds of timing per task kernel ([`cudarl_cuda::gpu::BenchSpec::budget_ms`]: the
    /// timing stops at the budget or at the target spread, with at least 5 repetitions);
    /// `rl-train` times its candidates with 30.
    /// Absent: the harness's 100, and left out of the key and of the verdicts' memo keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing_budget_ms: Option<f64>,
}

fn d_gpu_workers() -> usize {
    cudarl_cuda::worker::DEFAULT_GPU_WORKERS
}

fn d_timing_batch() -> usize {
    32
}

fn d_l1_gpus() -> Vec<String> {
    vec!["h100".into()]
}

/// The stage.
#[derive(Debug)]
pub struct Validate {
    params: Params,
}

impl Validate {
    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        if !params.tasks && !params.archive {
            return Err("`tasks` and `archive` are both false: nothing to validate".into());
        }
        if let Some(ms) = params.timing_budget_ms
            && !(ms.is_finite() && ms > 0.0)
        {
            return Err(format!(
                "timing_budget_ms must be a positive number of milliseconds, not {ms}"
            )
            .into());
        }
        Ok(Validate { params })
    }

    /// The params a verdict depends on (the row memo keys): not which kernels this node
    /// validates (`tasks`, `archive`, `archive_limit`, `cuda_l1_gpus`), so splitting or
    /// limiting the kernel set reuses every verdict already computed.
    fn verdict_params(&self) -> String {
        let p = &self.params;
        let mut key = serde_json::json!({
            "mode": p.mode, "timeout_s": p.timeout_s, "public_seeds": p.public_seeds,
            "hidden_seeds": p.hidden_seeds, "bench": p.bench,
            "torch_builds_without_gpu": p.torch_builds_without_gpu,
        });
        if let Some(ms) = p.timing_budget_ms {
            key["timing_budget_ms"] = ms.into();
        }
        key.to_string()
    }

    fn gpu(&self) -> Option<cudarl_cuda::gpu::GpuInfo> {
        match self.params.mode {
            Mode::Compile => None,
            Mode::Auto => cudarl_cuda::gpu::probe(),
        }
    }
}

impl Stage for Validate {
    stage_identity!(KIND, HARNESS_VERSION);
    fn inputs(&self) -> Vec<InputDecl> {
        let mut v = Vec::new();
        if self.params.tasks {
            v.extend([
                InputDecl::node("tasks", "synth-tasks", "tasks"),
                InputDecl::node("kernels", "synth-tasks", "task_kernels"),
            ]);
        }
        if self.params.archive {
            v.extend([
                InputDecl::node("sakana", "ingest-sakana", "kernels"),
                InputDecl::node("cuda_l1", "ingest-cuda-l1", "kernels"),
                InputDecl::node("problems", "ingest-kernelbench", "problems"),
                InputDecl::node("kb_tests", "testgen", "kb_tests"),
                InputDecl::external("worker"),
            ]);
        }
        v
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("validations", ValidationRow::schema()),
            OutputDecl::table(AgreementRow::NAME, AgreementRow::schema()),
        ]
    }
    worker_script_external!();
    fn environment(
        &self,
        ctx: &cudarl_core::ResolveContext,
    ) -> Result<std::collections::BTreeMap<String, String>, StageError> {
        let nvcc = Nvcc::discover(&ctx.root).map_err(|e| StageError::Failed(e.to_string()))?;
        let gpu = self.gpu();
        let mut env = std::collections::BTreeMap::new();
        env.insert("nvcc".into(), nvcc.version);
        env.insert(
            "arch".into(),
            gpu.as_ref()
                .map(|g| g.arch.clone())
                .unwrap_or_else(|| "sm_90".into()),
        );
        env.insert(
            "gpu".into(),
            gpu.map(|g| g.name)
                .unwrap_or_else(|| "none (compile-only)".into()),
        );
        if self.params.archive {
            env.insert(
                "python torch".into(),
                cudarl_cuda::pyworker::python_versions(&ctx.root).map_err(StageError::failed)?,
            );
        }
        Ok(env)
    }
    fn shardable(&self) -> bool {
        true
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let rows_of = PartRows::new(ctx.part(), ctx.node());
        let gpu = self.gpu();
        let compiler = compiler_for(ctx, gpu.as_ref())?;
        let rules = Rules::builtin();
        let (specs, rows) = if self.params.tasks {
            read_task_rows(ctx)?
        } else {
            Default::default()
        };
        let memo = ctx.memo("validate-v1")?;
        let salt = match gpu {
            Some(_) => hidden_salt(ctx.store()).map_err(|e| StageError::Failed(e.to_string()))?,
            None => Vec::new(),
        };
        let env_key = env_key(&compiler, gpu.as_ref(), &salt);
        let progress = ctx.progress("kernels", Some(rows.len() as u64));
        let baselines = std::sync::Mutex::new(Baselines::new());
        let mut sched = Scheduler::new(&rules, &compiler, &baselines);
        sched.timing = self.params.timing;
        sched.batch = self.params.timing_batch;
        let phase = TaskKernels {
            params: &self.params,
            rows: &rows,
            specs: &specs,
            memo: &memo,
            rows_of: &rows_of,
            progress: progress.as_ref(),
            salt: &salt,
            env_key: env_key.clone(),
            verdict_params: self.verdict_params(),
            // The naive kernel of each task, from the kernels table (the speedup baseline).
            naive: rows
                .iter()
                .filter(|r| r.role == "naive")
                .map(|r| (r.task_id.as_str(), r.code.as_str()))
                .collect(),
            rules: &rules,
            compiler: &compiler,
            gpu: gpu.is_some(),
            unrated: std::sync::Mutex::new(Vec::new()),
        };
        // `gpu_workers` testers test concurrently (timing runs alone); none without a GPU.
        let mut testers = match gpu {
            Some(_) => WorkerPool::testers(self.params.gpu_workers),
            None => Vec::new(),
        };
        let mut verdicts: Vec<Option<Verdict>> = vec![None; rows.len()];
        let judged = sched
            .run(
                &mut testers,
                rows.len(),
                &[],
                |i| phase.compile(i),
                |i, v| phase.done(i, &phase.key(&rows[i]), v),
            )
            .map_err(|e| e.into_caller(|h| StageError::Failed(format!("harness failure: {h}"))))?;
        for (i, v) in judged {
            verdicts[i] = Some(v);
        }
        let unrated = phase
            .unrated
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        rate_late(&rows, &mut verdicts, &unrated, &memo)?;
        progress.finish();
        let archive = if self.params.archive {
            Some(self.archive(ctx, &compiler, gpu.clone(), &env_key, &rows_of)?)
        } else {
            None
        };
        if !rows_of.finish(
            ctx,
            &sched.times,
            rows.len() + archive.as_ref().map_or(0, |a| a.0.len()),
        )? {
            // A shard: its rows are memoized; the table is assembled by `--merge`.
            return Ok(());
        }
        write_tables(ctx, &rows, verdicts, archive)
    }
}

/// nvcc (found from the project root) building for `gpu`'s arch, or sm_90 without a GPU, with
/// the default time limit and the store's compile cache.
///
/// # Errors
/// No usable nvcc.
fn compiler_for(
    ctx: &StageContext<'_>,
    gpu: Option<&cudarl_cuda::gpu::GpuInfo>,
) -> Result<Compiler, StageError> {
    let nvcc = Nvcc::discover(ctx.root()).map_err(|e| StageError::Failed(e.to_string()))?;
    Ok(Compiler {
        nvcc,
        arch: gpu
            .map(|g| g.arch.clone())
            .unwrap_or_else(|| "sm_90".into()),
        timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
        store: Some(ctx.store().clone()),
    })
}

/// The environment part of every row key: harness version, nvcc version, arch, GPU name, and on
/// a GPU the hidden-seed salt's digest (run verdicts depend on the hidden seeds, so rows of a
/// shared cache drawn with another salt are not reused).
fn env_key(compiler: &Compiler, gpu: Option<&cudarl_cuda::gpu::GpuInfo>, salt: &[u8]) -> String {
    format!(
        "{}|{}|{}|{}{}",
        HARNESS_VERSION,
        compiler.nvcc.version,
        compiler.arch,
        gpu.map(|g| g.name.as_str()).unwrap_or("none"),
        if salt.is_empty() {
            String::new()
        } else {
            format!("|salt {}", &blake3::hash(salt).to_hex()[..12])
        }
    )
}

/// Speedups of the candidates timed before their task's naive kernel (`unrated`: row index and
/// row key), from the naive kernels' own verdicts among `verdicts`; each is memoized now.
///
/// # Errors
/// The memo could not be written.
fn rate_late(
    rows: &[Row],
    verdicts: &mut [Option<Verdict>],
    unrated: &[(usize, Digest)],
    memo: &cudarl_core::Memo,
) -> Result<(), StageError> {
    let naive_timing: std::collections::BTreeMap<&str, cudarl_cuda::gpu::Timing> = rows
        .iter()
        .zip(verdicts.iter())
        .filter(|(r, _)| r.role == "naive")
        .filter_map(|(r, v)| {
            let v = v.as_ref().filter(|v| v.correct == Some(true))?;
            Some((r.task_id.as_str(), v.timing.clone()?))
        })
        .collect();
    for &(i, key) in unrated {
        if let Some(v) = verdicts[i].as_mut() {
            let base = cudarl_cuda::verdict::TaskBaselines {
                naive: naive_timing.get(rows[i].task_id.as_str()).cloned(),
                torch: v.torch_timing.clone(),
            };
            speedups(v, &base);
            memo.put(&key, &serde_json::to_vec(v).expect("verdict json"))?;
        }
    }
    Ok(())
}

/// Writes `validations` and `agreement`: the task kernels' verdicts (`verdicts`, one per row of
/// `rows`), then the archive's (`archive`), with a warning when some are compile-only.
///
/// # Errors
/// A batch does not match its schema, or the store write failed.
fn write_tables(
    ctx: &mut StageContext<'_>,
    rows: &[Row],
    verdicts: Vec<Option<Verdict>>,
    archive: Option<(Vec<KernelMeta>, Vec<Option<Verdict>>)>,
) -> Result<(), StageError> {
    let mut verdicts: Vec<Verdict> = verdicts
        .into_iter()
        .map(|v| v.expect("every row"))
        .collect();
    let compile_only = verdicts
        .iter()
        .filter(|v| !v.executed && !fails_unrun(v))
        .count();
    if compile_only > 0 {
        ctx.warn(format!("{compile_only} of {} verdicts are compile-only (no GPU, or nothing the harness can run): correctness and speed not checked", verdicts.len()));
    }
    let slow = verdicts.iter().filter(|v| timed_out(v)).count();
    if slow > 0 {
        ctx.warn(format!("{slow} of {} builds hit their time limit (not memoized: the next run builds them again)", verdicts.len()));
    }
    let unjudged = verdicts.iter().filter(|v| judge_failed(v)).count();
    if unjudged > 0 {
        ctx.warn(format!("{unjudged} of {} kernels were not judged: the judge failed on its side twice (`judge_error`, e.g. out of GPU memory beside other processes; not memoized: the next run judges them again)", verdicts.len()));
    }
    let mut ids: Vec<KernelMeta> = rows
        .iter()
        .map(|r| KernelMeta::task_kernel(&r.kernel_id, &r.role))
        .collect();
    if let Some((m, v)) = archive {
        ids.extend(m);
        verdicts.extend(v.into_iter().map(|v| v.expect("every archive row")));
    }
    let batch = cudarl_tables::to_batch(&validations(&ids, &verdicts)).map_err(data_err)?;
    write_output(ctx, "validations", &batch)?;
    let batch = cudarl_tables::to_batch(&agreement(&ids, &verdicts)).map_err(data_err)?;
    write_output(ctx, "agreement", &batch)
}

/// The task kernels' part of a `validate` run: what every row's compile, test and timing step
/// reads, shared by the compile workers and the GPU threads.
struct TaskKernels<'a> {
    params: &'a Params,
    rows: &'a [Row],
    specs: &'a std::collections::BTreeMap<String, TaskSpec>,
    memo: &'a cudarl_core::Memo,
    rows_of: &'a PartRows,
    progress: &'a dyn cudarl_core::ProgressSink,
    salt: &'a [u8],
    env_key: String,
    verdict_params: String,
    naive: std::collections::BTreeMap<&'a str, &'a str>,
    rules: &'a Rules,
    compiler: &'a Compiler,
    /// A GPU tests the compiled rows (else every verdict is compile-only).
    gpu: bool,
    /// Timed in a tester before its task's naive kernel: memoized once the naive kernel's
    /// timing gives its speedup (after the GPU phase).
    unrated: std::sync::Mutex<Vec<(usize, Digest)>>,
}

impl TaskKernels<'_> {
    /// A row's memo key: the environment, the task's spec (but not which other kernels it
    /// lists), the code and the verdict's params.
    fn key(&self, r: &Row) -> Digest {
        let mut spec = self.specs.get(&r.task_id).cloned();
        if let Some(s) = spec.as_mut() {
            s.optimized.clear();
        }
        let spec = serde_json::to_string(&spec).unwrap_or_default();
        let mut h = blake3::Hasher::new_derive_key("cudarl-pipe validate row v1");
        for part in [self.env_key.as_str(), &spec, &r.code, &self.verdict_params] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        Digest(*h.finalize().as_bytes())
    }

    /// Row `i`'s compile step ([`Step`]): skipped when another shard owns it (or a merge
    /// lacks it), its memoized verdict, else static checks and nvcc, and the GPU's tests for a
    /// build that compiled when there is a GPU.
    fn compile(&self, i: usize) -> Result<Step<'_>, StageError> {
        let r = &self.rows[i];
        let key = self.key(r);
        if !self.rows_of.part.owns(&key) {
            return Ok(Step::Skip);
        }
        self.rows_of.owned();
        if let Some(b) = self.memo.get(&key)?
            && let Ok(v) = serde_json::from_slice::<Verdict>(&b)
        {
            self.rows_of.found_in_memo();
            self.progress.inc(1);
            return Ok(Step::Done(v));
        }
        if self.rows_of.part == RunPart::Merge {
            self.rows_of.missing(&r.kernel_id);
            return Ok(Step::Skip);
        }
        let spec = self.specs.get(&r.task_id).ok_or_else(|| {
            StageError::bad_input(
                "kernels",
                Some("task_id"),
                format!("unknown task `{}`", r.task_id),
            )
        })?;
        let v = check_compile_only(spec, &r.code, self.rules, self.compiler)
            .map_err(|e| StageError::Failed(format!("harness failure while compiling: {e}")))?;
        if !(v.compiled && self.gpu) {
            // Static rejects and compile errors need no GPU.
            self.done(i, &key, &v)?;
            return Ok(Step::Done(v));
        }
        Ok(Step::Gpu(GpuJob {
            spec,
            code: &r.code,
            naive: self.naive.get(r.task_id.as_str()).copied(),
            opts: FullOptions {
                public_seeds: (0..self.params.public_seeds as u64).collect(),
                hidden_seeds: hidden_seeds(
                    self.salt,
                    &r.task_id,
                    &r.code,
                    self.params.hidden_seeds,
                ),
                wall: Duration::from_secs(self.params.timeout_s),
                bench: self.params.bench,
                timing: cudarl_cuda::gpu::BenchSpec {
                    budget_ms: self
                        .params
                        .timing_budget_ms
                        .unwrap_or(cudarl_cuda::gpu::BenchSpec::default().budget_ms),
                    ..Default::default()
                },
                // The naive kernels are rows here: their own timings give the speedups.
                time_naive: false,
                profile: false,
            },
        }))
    }

    /// A tested row finished here (memo, stats, progress).
    fn done(&self, i: usize, key: &Digest, v: &Verdict) -> Result<(), StageError> {
        self.rows_of.worker(v);
        if v.timing.is_some()
            && v.speedup_vs_naive.is_none()
            && self.naive.contains_key(self.rows[i].task_id.as_str())
        {
            self.unrated
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((i, *key));
        } else if !timed_out(v) && !judge_failed(v) {
            self.memo
                .put(key, &serde_json::to_vec(v).expect("verdict json"))?;
        }
        self.rows_of.computed();
        self.progress.inc(1);
        Ok(())
    }
}

/// A verdict whose build hit its time limit: not memoized, like the compile cache's entry
/// ([`cudarl_cuda::compile`]), so the next run builds it again.
fn timed_out(v: &Verdict) -> bool {
    v.failure.as_deref() == Some("compile_timeout")
}

/// A verdict the judge could not finish (`judge_error`): not memoized, so the next run judges
/// the kernel again.
fn judge_failed(v: &Verdict) -> bool {
    v.failure.as_deref() == Some("judge_error")
}

type Row = cudarl_rl::tasks::TaskKernel;

/// The task specs (`tasks.spec_json` by `task_id`) and the task kernels.
///
/// # Errors
/// Unreadable tables, missing columns or a spec that does not parse (naming the file, the
/// column and the task).
#[allow(clippy::type_complexity)]
fn read_task_rows(
    ctx: &StageContext<'_>,
) -> Result<(std::collections::BTreeMap<String, TaskSpec>, Vec<Row>), StageError> {
    let specs = cudarl_rl::tasks::specs_by_id(ctx.input_path("tasks")?).map_err(rl_err)?;
    let rows = cudarl_rl::tasks::read_kernels(ctx.input_path("kernels")?).map_err(rl_err)?;
    Ok((specs, rows))
}

/// The rows one run computes ([`RunPart`]) and what became of them: found in the row memo
/// (local or shared), computed here, or, in a merge, missing. Counters are atomics because
/// the compile workers and the GPU threads update them concurrently.
struct PartRows {
    part: RunPart,
    node: String,
    owned: std::sync::atomic::AtomicUsize,
    from_memo: std::sync::atomic::AtomicUsize,
    computed: std::sync::atomic::AtomicUsize,
    missing: std::sync::Mutex<Vec<String>>,
    /// Milliseconds inside the GPU workers by phase ([`cudarl_cuda::gpu::WorkerMs`]), summed:
    /// waiting for a started runner and loading the candidate in it, tests, timing the
    /// candidate, timing the torch baseline, and of that the
    /// host<->device copies (measured once per worker process and buffer sizes).
    worker_ms: [std::sync::atomic::AtomicU64; 5],
}

impl PartRows {
    fn new(part: RunPart, node: &str) -> Self {
        PartRows {
            part,
            node: node.to_string(),
            owned: Default::default(),
            from_memo: Default::default(),
            computed: Default::default(),
            missing: Default::default(),
            worker_ms: Default::default(),
        }
    }
    /// Adds a computed verdict's worker phases.
    fn worker(&self, v: &Verdict) {
        if let Some(w) = &v.worker_ms {
            for (c, ms) in self
                .worker_ms
                .iter()
                .zip([w.runner, w.tests, w.timing, w.torch, w.transfer])
            {
                c.fetch_add(ms.round() as u64, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
    fn owned(&self) {
        self.owned
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn found_in_memo(&self) {
        self.from_memo
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    /// A row computed and memoized; the `after-row` crash point follows its memo entry.
    fn computed(&self) {
        self.computed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        cudarl_core::fault_point(&self.node, "after-row");
    }
    fn missing(&self, kernel_id: &str) {
        self.missing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(kernel_id.to_string());
    }

    /// Reports the counters as node stats; `Ok(false)` for a shard (no table to write).
    ///
    /// # Errors
    /// A merge with rows no shard memoized (naming how many and the first kernel ids).
    fn finish(
        &self,
        ctx: &mut StageContext<'_>,
        times: &ScheduleTimes,
        rows: usize,
    ) -> Result<bool, StageError> {
        use std::sync::atomic::Ordering::Relaxed;
        ctx.stat("rows", rows as u64);
        ctx.stat("rows_owned", self.owned.load(Relaxed) as u64);
        ctx.stat("rows_from_memo", self.from_memo.load(Relaxed) as u64);
        ctx.stat("rows_computed", self.computed.load(Relaxed) as u64);
        // The scheduler's times ([`ScheduleTimes`]): compile steps (memo lookups, static checks,
        // nvcc) and tester jobs summed over threads, testers waiting for a build, the timing
        // pool's batches.
        ctx.stat("compile_ms_summed", times.compile_ms.load(Relaxed));
        ctx.stat("gpu_ms", times.test_ms.load(Relaxed));
        ctx.stat("gpu_wait_ms", times.test_wait_ms.load(Relaxed));
        ctx.stat("timer_ms", times.timer_ms.load(Relaxed));
        for (name, c) in ["runner", "tests", "timing", "torch", "transfer"]
            .iter()
            .zip(&self.worker_ms)
        {
            ctx.stat(&format!("worker_{name}_ms"), c.load(Relaxed));
        }
        let mut missing = self
            .missing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if !missing.is_empty() {
            missing.sort();
            let n = missing.len();
            missing.truncate(5);
            return Err(StageError::Failed(format!(
                "merge: {n} of {rows} rows have no verdict in the row memo{} (first: {}); run the shards that own them again (`run {} --shard i/N`), then merge",
                ctx.store()
                    .shared()
                    .map(|s| format!(" or the shared cache {}", s.url()))
                    .unwrap_or_default(),
                missing.join(", "),
                self.node,
            )));
        }
        Ok(!matches!(self.part, RunPart::Shard { .. }))
    }
}

impl Validate {
    /// The archive kernels to validate: SakanaAI's and CUDA-L1's rows (CUDA-L1's only for the
    /// GPUs in `cuda_l1_gpus`), at most `archive_limit` per source.
    ///
    /// # Errors
    /// A required column of an archive table is missing or has the wrong type (named).
    fn archive_items(&self, ctx: &StageContext<'_>) -> Result<Vec<Arch>, StageError> {
        let mut items: Vec<Arch> = Vec::new();
        for (input, source) in [("sakana", "sakana"), ("cuda_l1", "cuda-l1")] {
            let t = Table::read(ctx.input_path(input)?, input).map_err(data_err)?;
            let kid = t.req_strings("kernel_id").map_err(data_err)?;
            let pid = t.req_strings("problem_id").map_err(data_err)?;
            let code = t.req_strings("code").map_err(data_err)?;
            let fmt = t.req_strings("format").map_err(data_err)?;
            let ok = t.req_bools("claimed_correct").map_err(data_err)?;
            let sp = t.req_floats("claimed_speedup_native").map_err(data_err)?;
            let err = t.req_strings("error").map_err(data_err)?;
            let gpu_col = t.req_strings("gpu").map_err(data_err)?;
            let mut n = 0;
            for i in 0..t.rows() {
                let (Some(k), Some(p), Some(c)) = (kid.get(i), pid.get(i), code.get(i)) else {
                    continue;
                };
                if source == "cuda-l1"
                    && !gpu_col
                        .get(i)
                        .is_some_and(|g| self.params.cuda_l1_gpus.iter().any(|x| x == g))
                {
                    continue;
                }
                if self.params.archive_limit.is_some_and(|l| n >= l) {
                    break;
                }
                n += 1;
                let _ = fmt.get(i);
                items.push(Arch {
                    meta: KernelMeta {
                        kernel_id: k.to_string(),
                        role: "archive".into(),
                        source: source.into(),
                        claimed_correct: ok.get(i),
                        claimed_speedup: sp.get(i),
                        their_error: err.get(i).and_then(their_reason),
                    },
                    task: p.to_string(),
                    code: c.to_string(),
                });
            }
        }
        Ok(items)
    }

    /// The archives' torch-format kernels: static checks and extraction (one Python worker),
    /// builds on every core (content-hash cached), then one GPU job at a time through the
    /// Python worker pool against the recorded tests of `testgen`.
    fn archive(
        &self,
        ctx: &mut StageContext<'_>,
        compiler: &Compiler,
        gpu: Option<cudarl_cuda::gpu::GpuInfo>,
        env_key: &str,
        rows_of: &PartRows,
    ) -> Result<(Vec<KernelMeta>, Vec<Option<Verdict>>), StageError> {
        use cudarl_cuda::torchfmt::{self, Format};
        let problems = cudarl_rl::kernelbench::load_kb_problems(
            ctx.input_path("problems")?,
            Some(ctx.input_path("kb_tests")?),
            ctx.store(),
        )
        .map_err(rl_err)?;
        let items = self.archive_items(ctx)?;
        let worker_src =
            cudarl_cuda::pyworker::script_source(ctx.root()).map_err(StageError::failed)?;
        let memo = ctx.memo("validate-torch-v1")?;
        let verdict_params = self.verdict_params();
        let row_key = |a: &Arch| {
            let p = problems.get(&a.task);
            archive_row_key(
                a,
                p,
                [env_key.as_bytes(), &worker_src, verdict_params.as_bytes()],
            )
        };
        let rules = Rules::builtin();
        let mut out: Vec<Option<Verdict>> = vec![None; items.len()];
        let mut py: Option<cudarl_cuda::pyworker::PyWorker> = None;
        let mut preps: Vec<Option<torchfmt::Prepared>> = vec![None; items.len()];
        let progress = ctx.progress("archive kernels", Some(items.len() as u64));
        for (i, a) in items.iter().enumerate() {
            let key = row_key(a);
            if !rows_of.part.owns(&key) {
                continue;
            }
            rows_of.owned();
            if let Some(b) = memo.get(&key)?
                && let Ok(v) = serde_json::from_slice::<Verdict>(&b)
            {
                out[i] = Some(v);
                rows_of.found_in_memo();
                progress.inc(1);
                continue;
            }
            if rows_of.part == RunPart::Merge {
                rows_of.missing(&a.meta.kernel_id);
                continue;
            }
            let format = torchfmt::detect(&a.code, Some("torch"));
            if format == Format::ModelNew && py.is_none() {
                py = Some(
                    cudarl_cuda::pyworker::PyWorker::start(ctx.root())
                        .map_err(StageError::failed)?,
                );
            }
            let p = torchfmt::prepare(&a.code, format, &rules, py.as_mut())
                .map_err(StageError::failed)?;
            preps[i] = Some(p);
        }
        let build_all = gpu.is_some() || self.params.torch_builds_without_gpu;
        let needed = build_all
            && preps
                .iter()
                .any(|p| p.as_ref().is_some_and(|p| p.reject.is_none()));
        let env = torch_env(ctx.root(), py, needed)?;
        let built = build_archive(&items, &preps, (&rules, compiler), env.as_ref())?;
        let mut pool = gpu
            .as_ref()
            .map(|_| cudarl_cuda::torchfmt::pool(ctx.root()));
        let opts = torchfmt::TorchRunOptions {
            wall: Duration::from_secs(self.params.timeout_s.max(60)),
            bench: self.params.bench.then(cudarl_cuda::gpu::BenchSpec::default),
            // The archive's claims are against torch eager; a compile per problem would add
            // minutes to a run of every archive kernel.
            torch_compile: false,
            root: ctx.root().to_path_buf(),
            store: Some(ctx.store().clone()),
            profile: true,
            full_size_after_failure: true,
        };
        for (i, b) in built.into_iter().enumerate() {
            let Some((mut v, cand)) = b else { continue };
            if let (Some(pool), Some(cand)) = (pool.as_mut(), cand) {
                match problems.get(&items[i].task) {
                    Some(p) if !p.tests.is_empty() => {
                        v = torchfmt::run(v, &cand, p, pool, &opts, gpu.clone());
                    }
                    _ => {
                        v.failure = Some("no_tests".into());
                        v.failure_detail = Some(format!(
                            "`{}` has no recorded tests (not covered by kb-specs/testgen levels)",
                            items[i].task
                        ));
                    }
                }
            }
            if !timed_out(&v) {
                memo.put(
                    &row_key(&items[i]),
                    &serde_json::to_vec(&v).expect("verdict json"),
                )?;
            }
            rows_of.computed();
            out[i] = Some(v);
            progress.inc(1);
        }
        progress.finish();
        for v in out.iter().flatten() {
            if let Some(h) = v.so_hash {
                ctx.reference_blob(h);
            }
        }
        Ok((items.into_iter().map(|a| a.meta).collect(), out))
    }
}

/// The row-memo key of archive kernel `a` against its problem `p` (its code and recorded
/// tests), under `[environment key, worker script, verdict params]`.
fn archive_row_key(
    a: &Arch,
    p: Option<&cudarl_cuda::torchfmt::KbProblem>,
    [env_key, worker_src, verdict_params]: [&[u8]; 3],
) -> Digest {
    let mut h = blake3::Hasher::new_derive_key("cudarl-pipe validate torch row v1");
    let tests = p.map(test_digests).unwrap_or_default();
    let pcode = p.map(|p| p.code.as_str()).unwrap_or("");
    for part in [
        env_key,
        worker_src,
        pcode.as_bytes(),
        tests.as_bytes(),
        a.code.as_bytes(),
        verdict_params,
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    Digest(*h.finalize().as_bytes())
}

/// Torch's build environment for the archives' extensions when `needed`, asked of the Python
/// worker `py` (started in `root` when there is none yet), which ends here.
///
/// # Errors
/// The worker cannot start or answers something else.
fn torch_env(
    root: &std::path::Path,
    py: Option<cudarl_cuda::pyworker::PyWorker>,
    needed: bool,
) -> Result<Option<cudarl_cuda::pyworker::TorchEnv>, StageError> {
    if !needed {
        return Ok(None);
    }
    let mut py = match py {
        Some(py) => py,
        None => cudarl_cuda::pyworker::PyWorker::start(root).map_err(StageError::failed)?,
    };
    cudarl_cuda::pyworker::TorchEnv::query(&mut py)
        .map(Some)
        .map_err(StageError::failed)
}

/// A built archive kernel: its verdict so far and, when it built, the candidate the GPU runs.
type Built = (Verdict, Option<Value>);

/// The archive kernels prepared in `preps` (`None`: skipped), built on every core against
/// `env`; each a verdict and, for one that built, the candidate the GPU runs.
///
/// # Errors
/// The harness failed (not a kernel's build: that is its verdict).
fn build_archive(
    items: &[Arch],
    preps: &[Option<cudarl_cuda::torchfmt::Prepared>],
    (rules, compiler): (&Rules, &Compiler),
    env: Option<&cudarl_cuda::pyworker::TorchEnv>,
) -> Result<Vec<Option<Built>>, StageError> {
    preps
        .par_iter()
        .enumerate()
        .map(|(i, p)| -> Result<_, String> {
            let Some(p) = p else { return Ok(None) };
            cudarl_cuda::torchfmt::build(&items[i].task, p, rules, compiler, env)
                .map(Some)
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()
        .map_err(|e| StageError::Failed(format!("harness failure while building: {e}")))
}

/// An archive kernel to validate: its row's identity and claims, its problem, its code.
struct Arch {
    meta: KernelMeta,
    task: String,
    code: String,
}

/// The digests of problem `p`'s recorded tests (their CAS file names), comma-separated: not
/// their paths, since a row's key must not depend on where this machine's store lives, or
/// shards on other machines would split the rows differently and never share them.
fn test_digests(p: &cudarl_cuda::torchfmt::KbProblem) -> String {
    p.tests
        .iter()
        .map(|t| {
            t.path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(",")
}
