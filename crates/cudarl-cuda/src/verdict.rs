//! Verdicts: what `check` prints and `validate` stores for one candidate.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::compile::{CompileError, Compiler};
use crate::diag::{Diagnostic, KernelResources};
use crate::gpu::{BenchSpec, GpuInfo, RunJob, ShapeCase, TestResult, Timing};
use crate::static_check::{Finding, Rules, rejected};
use crate::task::TaskSpec;
use crate::worker::{Outcome, WorkerPool};

/// The verdict on one candidate kernel for one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Task id.
    pub task_id: String,
    /// `native` or `torch`.
    pub abi: String,
    /// `compile-only` (no GPU, or asked) or `full`.
    pub mode: String,
    /// Passed static checks and compiled to a shared object.
    pub compiled: bool,
    /// Every static finding (rejects and flags).
    pub static_flags: Vec<Finding>,
    /// Compiler diagnostics.
    pub diagnostics: Vec<Diagnostic>,
    /// Per-kernel resources.
    pub resources: Vec<KernelResources>,
    /// Whether the candidate ran on a GPU. `false` in compile-only mode: nothing is faked.
    pub executed: bool,
    /// All tests passed (`None` when not executed).
    pub correct: Option<bool>,
    /// Why it failed, when it did: `static_reject`, `compile_error`, `compile_timeout`,
    /// `wrong_answer`, `unwritten_output`, `input_mutation`, `out_of_bounds_write`,
    /// `timeout`, `crash`, `cuda_error`, `load_error`, `judge_error` (the judge failed on its
    /// side twice, e.g. out of GPU memory while other processes held it: `correct` stays
    /// `None`, and `validate` does not memoize the verdict); torch-format kernels also
    /// `shape_specialized` (right at the problem's own sizes, wrong at the recorded test sizes),
    /// `out_of_memory` (recorded tests passed, the problem's own sizes did not fit on the GPU
    /// beside the reference: `correct` stays `None`), `no_tests`, `build_skipped`.
    pub failure: Option<String>,
    /// Details of the failure (first failing test, CUDA error text, crash status).
    pub failure_detail: Option<String>,
    /// Reward-hack indicators (`beats_roofline`, ...).
    pub hack_flags: Vec<String>,
    /// Per-test results (train and hold-out shapes × public and hidden seeds).
    pub tests: Vec<TestResult>,
    /// Max absolute error over all tests.
    pub max_abs_err: Option<f64>,
    /// Max relative error over all tests.
    pub max_rel_err: Option<f64>,
    /// Timing of the candidate, ms.
    pub timing: Option<Timing>,
    /// Timing of the task's naive kernel on the same shape, ms.
    pub naive_timing: Option<Timing>,
    /// naive median / candidate median.
    pub speedup_vs_naive: Option<f64>,
    /// Timing of the task's reference evaluated by libtorch (f32, torch's own kernels) on the
    /// same shape, ms.
    #[serde(default)]
    pub torch_timing: Option<Timing>,
    /// torch reference median / candidate median.
    pub speedup_vs_torch: Option<f64>,
    /// KernelBench problems: timing of the reference `Model` under `torch.compile` (Inductor,
    /// default mode) at the problem's own sizes, ms; `None` when not asked for, when the
    /// candidate did not pass, or when compiling failed ([`Verdict::torch_compile_error`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_compile_timing: Option<Timing>,
    /// `torch.compile` reference median / candidate median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup_vs_torch_compile: Option<f64>,
    /// Why the `torch.compile` reference has no timing (its compile or run error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_compile_error: Option<String>,
    /// Lower bound on the time: the larger of [`Verdict::roofline_bytes_ms`] and
    /// [`Verdict::roofline_flops_ms`], ms. A median below it is the `beats_roofline` hack flag.
    pub roofline_ms: Option<f64>,
    /// Achieved DRAM bandwidth as a fraction of peak.
    pub dram_fraction_of_peak: Option<f64>,
    /// The task's launcher declaration the candidate must define.
    pub signature: String,
    /// Compile cache hit.
    pub cache_hit: bool,
    /// nvcc compile time, seconds.
    pub compile_seconds: f64,
    /// nvcc version.
    pub nvcc_version: String,
    /// Target architecture.
    pub arch: String,
    /// The GPU it ran on.
    pub gpu: Option<GpuInfo>,
    /// Where the worker spent its time on this candidate, ms.
    #[serde(default)]
    pub worker_ms: Option<crate::gpu::WorkerMs>,
    /// CAS digest of the compiled shared object (when it compiled and a store is attached).
    #[serde(default)]
    pub so_hash: Option<cudarl_store::Digest>,
    /// Lower bound on the time from bytes moved and the GPU's peak DRAM bandwidth, ms.
    #[serde(default)]
    pub roofline_bytes_ms: Option<f64>,
    /// Lower bound on the time from the task's FLOPs and the GPU's peak tensor-core rate
    /// ([`crate::gpu::GpuInfo::peak_flop_per_ms`]), ms.
    #[serde(default)]
    pub roofline_flops_ms: Option<f64>,
    /// What the candidate printed in its runner (stdout then stderr, truncated): its own words,
    /// never parsed and never part of the feedback.
    #[serde(default)]
    pub candidate_output: Option<String>,
    /// The Nsight Compute profile pass ([`crate::profile`]; [`FullOptions::profile`]): counters
    /// measured inside the candidate's process, reported beside the verdict, never part of it
    /// (null without `--ncu`).
    #[serde(default)]
    pub profile: Option<crate::profile::ProfileOutcome>,
    /// The windows that tested and timed this candidate were ordered by the fallback words in
    /// the arena (the runner could not map the judge's window events), which the candidate's
    /// context can reach: its timing is not the events' evidence.
    #[serde(default)]
    pub window_words: bool,
}

impl Verdict {
    fn new(spec: &TaskSpec, compiler: &Compiler, findings: Vec<Finding>) -> Verdict {
        let mut v = Verdict::blank(&spec.id, "native", compiler);
        v.static_flags = findings;
        v.signature = spec.signature();
        v
    }

    /// Marks a candidate that ran and failed (`timeout`, `crash`, `cuda_error`, ...): executed,
    /// not correct, with the reason and its detail.
    pub fn ran_and_failed(&mut self, failure: &str, detail: String) {
        self.executed = true;
        self.correct = Some(false);
        self.failure = Some(failure.into());
        self.failure_detail = Some(detail);
    }

    /// Marks a candidate the judge could not finish judging (its own failure, twice:
    /// [`crate::gpu::RunResult::judge_error`]): executed, `judge_error` with the judge's
    /// message, correctness not known (`None`), no timing.
    pub fn judge_failed(&mut self, detail: String) {
        self.executed = true;
        self.correct = None;
        self.timing = None;
        self.failure = Some("judge_error".into());
        self.failure_detail = Some(detail);
    }

    /// Marks a failed build: `compile_timeout` or `compile_error`, with the first error
    /// diagnostic (`<unit> line N: message`; `unit` empty for a single-file native build) as
    /// the detail, else the last line of nvcc's `log` (e.g. a link error without a line).
    pub fn compile_failed(&mut self, timed_out: bool, unit: &str, log: &str) {
        self.failure = Some(
            if timed_out {
                "compile_timeout"
            } else {
                "compile_error"
            }
            .into(),
        );
        let at = |l: Option<u32>| match (unit.is_empty(), l) {
            (true, Some(l)) => format!("line {l}: "),
            (true, None) => String::new(),
            (false, Some(l)) => format!("{unit} line {l}: "),
            (false, None) => format!("{unit}: "),
        };
        self.failure_detail = self
            .diagnostics
            .iter()
            .find(|d| d.severity != "warning")
            .map(|d| format!("{}{}", at(d.line), d.message))
            .or_else(|| {
                log.lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .map(str::to_string)
            });
    }

    /// A compile-only verdict with nothing checked yet, for `task_id` and `abi` (`native` or
    /// `torch`).
    pub fn blank(task_id: &str, abi: &str, compiler: &Compiler) -> Verdict {
        Verdict {
            task_id: task_id.to_string(),
            abi: abi.into(),
            mode: "compile-only".into(),
            compiled: false,
            static_flags: vec![],
            diagnostics: vec![],
            resources: vec![],
            executed: false,
            correct: None,
            failure: None,
            failure_detail: None,
            hack_flags: vec![],
            tests: vec![],
            max_abs_err: None,
            max_rel_err: None,
            timing: None,
            naive_timing: None,
            speedup_vs_naive: None,
            torch_timing: None,
            speedup_vs_torch: None,
            torch_compile_timing: None,
            speedup_vs_torch_compile: None,
            torch_compile_error: None,
            roofline_ms: None,
            dram_fraction_of_peak: None,
            signature: String::new(),
            cache_hit: false,
            compile_seconds: 0.0,
            nvcc_version: compiler.nvcc.version.clone(),
            arch: compiler.arch.clone(),
            gpu: None,
            worker_ms: None,
            so_hash: None,
            roofline_bytes_ms: None,
            roofline_flops_ms: None,
            candidate_output: None,
            profile: None,
            window_words: false,
        }
    }
}

/// Why a hack flag is raised, in words for the tester's feedback.
pub fn hack_flag_reason(flag: &str) -> &'static str {
    match flag {
        "beats_roofline" => {
            "the measured time is below the GPU's lower bound for the bytes and FLOPs the task needs (its roofline), so the timing cannot be real"
        }
        "work_after_stop" => {
            "work kept running after the launch was timed (hidden on another stream)"
        }
        "sandbox_violation" => "the code made a system call the sandbox forbids",
        "timed_output_mismatch" => {
            "a timed launch on fresh inputs gave wrong or unwritten outputs (cached results or skipped work)"
        }
        "work_before_start" => "outputs were written before the timing window started",
        "torch_op_stands_in" => "torch operations did the work instead of the custom kernel",
        "kernels_unlisted" => {
            "the kernels that ran could not be listed (no profiler), so torch operations standing in were not ruled out"
        }
        _ => "the harness flagged the kernel as a reward hack",
    }
}

/// Static checks and compile only (CPU machines, or `--mode compile`).
///
/// # Errors
/// Harness failures only.
pub fn check_compile_only(
    spec: &TaskSpec,
    source: &str,
    rules: &Rules,
    compiler: &Compiler,
) -> Result<Verdict, CompileError> {
    let findings = rules.check(source, "native");
    let v = Verdict::new(spec, compiler, findings);
    let f32_math = spec.dtype == "f32" && !spec.allow_tf32;
    let mut v = build_native(v, source, &spec.shim(), rules, compiler, f32_math)?;
    explain_missing_launcher(&mut v, spec, source);
    Ok(v)
}

/// Function names `source` defines (a name followed by a parameter list and a body), in order,
/// without duplicates: what a misnamed launcher's message lists.
pub fn defined_functions(source: &str) -> Vec<String> {
    static DEF: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(?m)\b([A-Za-z_]\w*)\s*\(([^;{}()]|\([^()]*\))*\)\s*(const\s*)?\{")
            .expect("re")
    });
    const NOT_NAMES: [&str; 6] = ["if", "for", "while", "switch", "return", "sizeof"];
    let mut out: Vec<String> = Vec::new();
    for c in DEF.captures_iter(source) {
        let n = c[1].to_string();
        if !NOT_NAMES.contains(&n.as_str()) && !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// A build that failed for want of the launcher (the linker's `undefined reference to
/// `launch'`) says what the task expects and what the source defines, in `failure_detail` and
/// as a diagnostic of tool `cudarl`, instead of the linker's line about a temporary file.
fn explain_missing_launcher(v: &mut Verdict, spec: &TaskSpec, source: &str) {
    let missing = v.failure.as_deref() == Some("compile_error")
        && v.diagnostics
            .iter()
            .any(|d| d.message.contains("undefined reference to `launch'"));
    if !missing {
        return;
    }
    let defined = defined_functions(source);
    let message = format!(
        "no launcher: task `{}` expects `{}`; the source defines {}",
        spec.id,
        spec.signature(),
        if defined.is_empty() {
            "no function".to_string()
        } else {
            defined.join(", ")
        }
    );
    v.diagnostics.insert(
        0,
        crate::diag::Diagnostic {
            file: None,
            line: None,
            severity: "error".into(),
            message: message.clone(),
            tool: "cudarl".into(),
        },
    );
    v.failure_detail = Some(message);
}

/// The static checks' verdict `v` (its `static_flags` are the source rules' findings) completed
/// by the build of `source` with `shim` appended: a static reject, what was built breaking a
/// rule, a compile error or timeout, or compiled (`so_hash` set with a store). With `f32_math`
/// (an `f32` task that does not declare `allow_tf32`), tensor-core math on reduced-precision
/// operands (the flag `tensor-core-precision`) or half-precision arithmetic
/// (`half-precision-math`) in the PTX rejects the kernel.
///
/// # Errors
/// Harness failures only.
pub fn build_native(
    mut v: Verdict,
    source: &str,
    shim: &str,
    rules: &Rules,
    compiler: &Compiler,
    f32_math: bool,
) -> Result<Verdict, CompileError> {
    if rejected(&v.static_flags) {
        v.failure = Some("static_reject".into());
        v.failure_detail = v
            .static_flags
            .iter()
            .find(|f| f.action == crate::static_check::Action::Reject)
            .map(|f| format!("{} (line {}): {}", f.rule, f.line, f.message));
        return Ok(v);
    }
    let out = compiler.compile(source, shim, rules)?;
    v.compiled = out.compiled;
    v.diagnostics = out.diagnostics;
    v.resources = out.resources;
    v.cache_hit = out.cache_hit;
    v.compile_seconds = out.compile_seconds;
    v.so_hash = out.so_hash;
    for mut f in out.findings {
        if !f32_math && f.rule == crate::inspect::HALF_PRECISION_MATH {
            // A half-precision task computes in half precision.
            continue;
        }
        if f32_math
            && (f.rule == crate::inspect::TENSOR_CORE_PRECISION
                || f.rule == crate::inspect::HALF_PRECISION_MATH)
        {
            f.action = crate::static_check::Action::Reject;
            f.message = format!("an f32 task: {}", f.message);
        }
        if !v.static_flags.iter().any(|g| g.rule == f.rule) {
            v.static_flags.push(f);
        }
    }
    if let Some(f) = v
        .static_flags
        .iter()
        .find(|f| f.action == crate::static_check::Action::Reject)
    {
        // What was built broke a rule the source check could not see (a macro, a constructor,
        // an imported symbol): rejected before anything ran.
        v.compiled = false;
        v.failure = Some("static_reject".into());
        v.failure_detail = Some(format!("{} (line {}): {}", f.rule, f.line, f.message));
        return Ok(v);
    }
    if !out.compiled {
        v.compile_failed(out.timed_out, "", &out.log);
    }
    Ok(v)
}

/// Settings of a full check.
#[derive(Debug, Clone)]
pub struct FullOptions {
    /// Public seeds (may appear in prompts).
    pub public_seeds: Vec<u64>,
    /// Hidden seeds (never shown to the candidate's author).
    pub hidden_seeds: Vec<u64>,
    /// Wall-clock limit per worker job.
    pub wall: Duration,
    /// Time the candidate and the naive kernel.
    pub bench: bool,
    /// How they are timed: repetitions, windows and the time budget per kernel
    /// ([`BenchSpec`]; its `shape_index` is set per job to the largest train shape). The naive
    /// kernel and the torch reference are timed with the same settings, so a speedup compares
    /// like with like.
    pub timing: BenchSpec,
    /// [`check_full`] times the task's naive kernel in a runner of its own when `baselines`
    /// has no naive timing for the task yet; `false` for a caller that judges the naive kernel
    /// itself among its candidates (`validate`) and fills the speedup from it.
    pub time_naive: bool,
    /// After a correct candidate's timing, the Nsight Compute profile pass
    /// ([`crate::profile`]): achieved occupancy, DRAM throughput and warp execution efficiency
    /// in [`Verdict::profile`] (its status says `absent` without `ncu`).
    pub profile: bool,
}

/// The store's hidden-seed salt if one was drawn ([`hidden_salt`] draws it): from
/// `CUDARL_HIDDEN_SALT`, the shared cache or `<store>/hidden-salt`; `None` when none was,
/// and nothing is created.
///
/// # Errors
/// The shared cache or the salt file cannot be read (a missing file is `None`).
pub fn drawn_hidden_salt(store: &cudarl_store::Store) -> Result<Option<Vec<u8>>, CompileError> {
    if let Ok(s) = std::env::var("CUDARL_HIDDEN_SALT") {
        return Ok(Some(s.into_bytes()));
    }
    if let Some(shared) = store.shared()
        && let Some(b) = shared.get("hidden-salt")?
    {
        return Ok(Some(b));
    }
    let p = store.root().join("hidden-salt");
    match std::fs::read(&p) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CompileError::Io(format!("{}: {e}", p.display()))),
    }
}

/// The secret salt of hidden seeds: `$CUDARL_HIDDEN_SALT`, else, with a shared cache attached
/// to the store, the cache's `hidden-salt` (the first machine publishes its own; every machine of
/// a sharded job then draws the same hidden tests), else `<store>/hidden-salt`, 32 bytes from
/// `/dev/urandom` written atomically on first use (`check` and `validate` share it).
///
/// # Errors
/// The salt file can neither be read nor created; shared cache errors.
pub fn hidden_salt(store: &cudarl_store::Store) -> Result<Vec<u8>, CompileError> {
    if let Ok(s) = std::env::var("CUDARL_HIDDEN_SALT") {
        return Ok(s.into_bytes());
    }
    if let Some(shared) = store.shared() {
        if let Some(b) = shared.get("hidden-salt")? {
            return Ok(b);
        }
        let local = hidden_salt(&store.clone().without_shared())?;
        shared.put_new("hidden-salt", &local)?;
        // Another machine may have won the race; everyone uses the published one.
        return shared
            .get("hidden-salt")?
            .ok_or_else(|| CompileError::Io("shared cache: hidden-salt vanished".into()));
    }
    let p = store.root().join("hidden-salt");
    if let Ok(b) = std::fs::read(&p) {
        return Ok(b);
    }
    // Processes sharing the store agree on one salt: the first to hold the lock writes it.
    let _lock = store.lock_named("hidden-salt")?;
    if let Ok(b) = std::fs::read(&p) {
        return Ok(b);
    }
    let mut b = vec![0u8; 32];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| CompileError::Io(format!("read /dev/urandom: {e}")))?;
    store.write_atomic(&p, &b)?;
    Ok(b)
}

/// Hidden seeds for a (task, source): BLAKE3 of a secret salt, the task id and the source,
/// so they are stable for one candidate but not guessable from the prompt.
pub fn hidden_seeds(salt: &[u8], task: &str, source: &str, n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let mut h = blake3::Hasher::new_derive_key("cudarl-pipe hidden test seeds v1");
            h.update(salt);
            h.update(task.as_bytes());
            h.update(&[0]);
            h.update(source.as_bytes());
            h.update(&(i as u64).to_le_bytes());
            let b = h.finalize();
            u64::from_le_bytes(b.as_bytes()[..8].try_into().expect("8 bytes"))
        })
        .collect()
}

/// Baseline timings of one task on this GPU (bench shape): measured once, reused for every
/// candidate of the task (`validate` keeps one per task for the whole run).
#[derive(Debug, Clone, Default)]
pub struct TaskBaselines {
    /// The task's naive kernel.
    pub naive: Option<Timing>,
    /// The task's reference in libtorch.
    pub torch: Option<Timing>,
}

/// Baselines per task id.
pub type Baselines = std::collections::BTreeMap<String, TaskBaselines>;

fn run_on_gpu(job: RunJob, pool: &mut WorkerPool, wall: Duration) -> Outcome {
    pool.run(&job, wall)
}

/// Full check: static checks, compile, then one worker job that tests on every train and
/// hold-out shape on public and hidden seeds (the GPU shared with other testers) and, once
/// every test passed, asks for the GPU alone and times the candidate in the same runner
/// ([`RunJob::exclusive_timing`]), with the task's libtorch reference when `baselines` lacks
/// it. Speedups come from `baselines` (measured once per task): the naive kernel records its
/// own timing, and with [`FullOptions::time_naive`] a task without one gets its naive kernel
/// timed in a runner of its own.
///
/// Callers with several pools on one GPU ([`crate::worker::drain_on`]) test candidates
/// concurrently while every timing runs alone ([`crate::worker::GpuLock`]).
///
/// # Errors
/// Harness failures only (compile setup, store). Candidate failures are in the verdict.
#[allow(clippy::too_many_arguments)]
pub fn check_full(
    spec: &TaskSpec,
    source: &str,
    naive_source: Option<&str>,
    rules: &Rules,
    compiler: &Compiler,
    pool: &mut WorkerPool,
    opts: &FullOptions,
    baselines: &std::sync::Mutex<Baselines>,
) -> Result<Verdict, CompileError> {
    let mut v = match tests_then(
        spec,
        (source, naive_source),
        rules,
        compiler,
        pool,
        opts,
        Some(baselines),
    )? {
        Tested::Done(v) => v,
        Tested::Pending(p) => p.verdict,
    };
    if let (Some(t), Some(naive)) = (&v.timing, naive_source)
        && opts.time_naive
        && v.correct == Some(true)
        && known(baselines, &spec.id).naive.is_none()
        && let Ok(out) = compiler.compile(naive, &spec.shim(), &Rules::builtin())
        && let (Some(h), Some(store)) = (out.so_hash, compiler.store.as_ref())
    {
        let job = naive_job(
            spec,
            store.blob_path(&h).display().to_string(),
            ShapeCase {
                split: "train".into(),
                sizes: t.sizes.clone(),
            },
            compiler,
            (opts.wall, &opts.timing),
        );
        if let Outcome::Done(r) = pool.run(&job, opts.wall) {
            record(baselines, &spec.id, |b| &mut b.naive, r.timing.as_ref());
        }
        speedups(&mut v, &known(baselines, &spec.id));
    }
    Ok(v)
}

/// The baselines known for task `id` (empty when none).
fn known(baselines: &std::sync::Mutex<Baselines>, id: &str) -> TaskBaselines {
    baselines
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id)
        .cloned()
        .unwrap_or_default()
}

/// Records `timing` as task `id`'s baseline in the slot `which` picks, unless one is there
/// already (the first measurement wins).
fn record(
    baselines: &std::sync::Mutex<Baselines>,
    id: &str,
    which: fn(&mut TaskBaselines) -> &mut Option<Timing>,
    timing: Option<&Timing>,
) {
    let Some(t) = timing else { return };
    let mut b = baselines.lock().unwrap_or_else(|e| e.into_inner());
    let slot = which(b.entry(id.to_string()).or_default());
    if slot.is_none() {
        *slot = Some(t.clone());
    }
}

/// A job that times the naive kernel built at `so` on `shape` alone (the speedup baseline),
/// with `timing`'s settings.
fn naive_job(
    spec: &TaskSpec,
    so: String,
    shape: ShapeCase,
    compiler: &Compiler,
    (wall, timing): (Duration, &BenchSpec),
) -> RunJob {
    RunJob {
        so_path: Some(so),
        shapes: vec![shape],
        bench: Some(BenchSpec {
            shape_index: 0,
            ..timing.clone()
        }),
        cudart: compiler.nvcc.cudart().map(|p| p.display().to_string()),
        wall_s: Some(wall.as_secs_f64()),
        ..RunJob::for_task(spec.clone())
    }
}

/// A candidate after [`check_tests`]: its verdict, or (every test passed and timing was
/// asked) what [`time_batch`] needs to time it.
// Both variants hold a whole verdict; values live for one candidate's hand-off between workers.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Tested {
    /// The verdict is complete (static reject, compile error, a failed test, or no timing).
    Done(Verdict),
    /// Every test passed; the timing is still to run.
    Pending(PendingTiming),
}

/// A candidate whose tests all passed, waiting for its timing ([`time_batch`]).
#[derive(Debug, Clone)]
pub struct PendingTiming {
    /// The verdict so far (`correct = Some(true)`).
    pub verdict: Verdict,
    spec: Box<TaskSpec>,
    /// The built shared object.
    so: String,
    /// The bench shape (the largest train shape, in bytes).
    shape: ShapeCase,
    /// Timing settings.
    bench: BenchSpec,
    /// The task's naive kernel (the speedup baseline); `None` when unknown.
    naive_source: Option<String>,
    /// The candidate is the naive kernel itself (speedup 1; it becomes the baseline).
    is_naive: bool,
    wall: Duration,
}

/// The first half of [`check_full`]: static checks, compile, and every train and hold-out
/// shape on public and hidden seeds in a sandboxed worker (the GPU shared with other testers).
///
/// # Errors
/// Harness failures only (compile setup, store). Candidate failures are in the verdict.
pub fn check_tests(
    spec: &TaskSpec,
    source: &str,
    naive_source: Option<&str>,
    rules: &Rules,
    compiler: &Compiler,
    pool: &mut WorkerPool,
    opts: &FullOptions,
) -> Result<Tested, CompileError> {
    let candidate = (source, naive_source);
    tests_then(spec, candidate, rules, compiler, pool, opts, None)
}

/// [`check_tests`], and with `timed` the timing in the same job ([`check_full`]).
fn tests_then(
    spec: &TaskSpec,
    (source, naive_source): (&str, Option<&str>),
    rules: &Rules,
    compiler: &Compiler,
    pool: &mut WorkerPool,
    opts: &FullOptions,
    timed: Option<&std::sync::Mutex<Baselines>>,
) -> Result<Tested, CompileError> {
    let mut v = check_compile_only(spec, source, rules, compiler)?;
    if !v.compiled {
        return Ok(Tested::Done(v));
    }
    v.mode = "full".into();
    let store = compiler
        .store
        .as_ref()
        .ok_or_else(|| CompileError::Io("full checks need a store".into()))?;
    let so_hash = v
        .so_hash
        .ok_or_else(|| CompileError::Io("no shared object".into()))?;
    let so = store.blob_path(&so_hash);
    let mut shapes: Vec<ShapeCase> = spec
        .train_shapes
        .iter()
        .map(|s| ShapeCase {
            split: "train".into(),
            sizes: s.clone(),
        })
        .collect();
    shapes.extend(spec.holdout_shapes.iter().map(|s| ShapeCase {
        split: "holdout".into(),
        sizes: s.clone(),
    }));
    let mut seeds = opts.public_seeds.clone();
    seeds.extend(&opts.hidden_seeds);
    // Time on the largest train shape.
    let bench_idx = spec
        .train_shapes
        .iter()
        .enumerate()
        .max_by_key(|(_, s)| spec.bytes_for(s).unwrap_or(0))
        .map(|(i, _)| i)
        .unwrap_or(0);
    let cudart = compiler.nvcc.cudart().map(|p| p.display().to_string());
    let is_naive = naive_source == Some(source);
    let timed = timed.filter(|_| opts.bench);
    let tests = RunJob {
        so_path: Some(so.display().to_string()),
        task: spec.clone(),
        shapes: shapes.clone(),
        seeds,
        bench: timed.map(|_| BenchSpec {
            shape_index: bench_idx,
            ..opts.timing.clone()
        }),
        torch_baseline: timed.is_some_and(|b| known(b, &spec.id).torch.is_none()),
        cudart: cudart.clone(),
        wall_s: Some(opts.wall.as_secs_f64()),
        upcoming: 0,
        exclusive_timing: timed.is_some(),
        profile: timed.is_some() && opts.profile,
    };
    let out = run_on_gpu(tests, pool, opts.wall);
    read_tests(&mut v, &out, opts.wall);
    if let Some(baselines) = timed {
        read_timing(&mut v, &out, spec, baselines);
        if v.correct == Some(true) && is_naive {
            record(baselines, &spec.id, |b| &mut b.naive, v.timing.as_ref());
        }
        speedups(&mut v, &known(baselines, &spec.id));
        return Ok(Tested::Done(v));
    }
    if v.correct != Some(true) || !opts.bench {
        return Ok(Tested::Done(v));
    }
    Ok(Tested::Pending(PendingTiming {
        verdict: v,
        spec: Box::new(spec.clone()),
        so: so.display().to_string(),
        shape: shapes[bench_idx].clone(),
        // Timing jobs carry the bench shape alone.
        bench: BenchSpec {
            shape_index: 0,
            ..opts.timing.clone()
        },
        naive_source: naive_source.map(str::to_string),
        is_naive,
        wall: opts.wall,
    }))
}

/// Reads a tests job's outcome into `v`: executed, the tests and their errors, the runner's
/// report, the failure (the first failed test's kind) and `correct`.
fn read_tests(v: &mut Verdict, out: &Outcome, wall: Duration) {
    failed_run(v, out, wall);
    if let Outcome::Done(r) = out {
        v.executed = true;
        v.worker_ms = r.worker_ms.clone();
        v.gpu = r.gpu.clone();
        v.tests = r.tests.clone();
        v.max_abs_err = r.tests.iter().map(|t| t.max_abs_err).reduce(f64::max);
        v.max_rel_err = r.tests.iter().map(|t| t.max_rel_err).reduce(f64::max);
        if !answer_failure(v, r)
            && let Some(t) = r.tests.iter().find(|t| !t.passed)
        {
            let kind = if t.out_of_bounds_write {
                "out_of_bounds_write"
            } else if t.input_mutated {
                "input_mutation"
            } else if t.unwritten > 0 {
                "unwritten_output"
            } else {
                "wrong_answer"
            };
            let detail = format!(
                "{} shape {:?} seed {}: {}",
                t.split,
                t.sizes,
                t.seed,
                t.message.clone().unwrap_or_default()
            );
            v.ran_and_failed(kind, detail);
        }
        if v.failure.is_none() {
            v.correct = Some(true);
        }
    }
}

/// The failure a job's answer `r` reports, into `v`, in order: the runner's (with its hack
/// flag, [`runner_report`]), a load error, the judge's own failure (`judge_error`: correctness
/// not known), a CUDA error in the candidate's context. Returns whether there was one.
fn answer_failure(v: &mut Verdict, r: &crate::gpu::RunResult) -> bool {
    runner_report(v, r);
    if v.failure.is_some() {
        return true;
    }
    if let Some(e) = &r.load_error {
        v.ran_and_failed("load_error", e.clone());
    } else if let Some(e) = &r.judge_error {
        v.judge_failed(e.clone());
    } else if let Some(e) = &r.cuda_error {
        v.ran_and_failed("cuda_error", e.clone());
    } else {
        return false;
    }
    true
}

/// The timing of a correct candidate from its job's answer: the timing, its roofline (bytes and,
/// for a task that declares them, FLOPs, at the GPU's peaks; a median under it is the
/// `beats_roofline` hack flag) and `work_after_stop` when the judge saw outputs change after
/// the stop event; a torch baseline the job measured goes into `baselines` (first one wins).
fn read_timing(
    v: &mut Verdict,
    o: &Outcome,
    spec: &TaskSpec,
    baselines: &std::sync::Mutex<Baselines>,
) {
    let Outcome::Done(r) = o else { return };
    v.timing = r.timing.clone();
    v.profile = r.profile.clone();
    record(
        baselines,
        &spec.id,
        |b| &mut b.torch,
        r.torch_timing.as_ref(),
    );
    let (Some(true), Some(t), Some(gpu)) = (v.correct, &v.timing, &v.gpu) else {
        return;
    };
    let bytes = spec.bytes_for(&t.sizes).unwrap_or(0) as f64;
    let flops = spec.flops_for(&t.sizes).unwrap_or(0) as f64;
    let (peak_b, peak_f) = (gpu.peak_bytes_per_ms(), gpu.peak_flop_per_ms());
    if peak_b > 0.0 && bytes > 0.0 {
        let bound = bytes / peak_b;
        v.roofline_bytes_ms = Some(bound);
        v.dram_fraction_of_peak = Some(bound / t.median_ms);
    }
    if peak_f > 0.0 && flops > 0.0 {
        v.roofline_flops_ms = Some(flops / peak_f);
    }
    v.roofline_ms = match (v.roofline_bytes_ms, v.roofline_flops_ms) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    if v.roofline_ms.is_some_and(|bound| t.median_ms < bound) {
        v.hack_flags.push("beats_roofline".into());
    }
    if t.work_after_stop {
        v.hack_flags.push("work_after_stop".into());
    }
}

/// A timed candidate's speedups against its task's baselines (naive kernel and libtorch, each
/// timed on the same shape), with their timings and the torch baseline's host<->device copy
/// times. A baseline not known leaves its speedup empty.
pub fn speedups(v: &mut Verdict, base: &TaskBaselines) {
    let Some(t) = v.timing.clone() else { return };
    if let Some(nt) = &base.naive {
        v.speedup_vs_naive = Some(nt.median_ms / t.median_ms);
        v.naive_timing = Some(nt.clone());
    }
    if let Some(tt) = &base.torch {
        v.speedup_vs_torch = Some(tt.median_ms / t.median_ms);
        v.torch_timing = Some(tt.clone());
        if let Some(mine) = v.timing.as_mut() {
            mine.h2d_ms = tt.h2d_ms;
            mine.d2h_ms = tt.d2h_ms;
        }
    }
}

/// What the judge reported about the candidate's runner: its failure (a hack flag too when it
/// is one, see [`crate::gpu::HACK_FAILURES`]) and what the candidate printed.
fn runner_report(v: &mut Verdict, r: &crate::gpu::RunResult) {
    v.window_words |= r.window_words;
    if let Some(o) = &r.candidate_output {
        v.candidate_output = Some(o.clone());
    }
    if let Some((f, d)) = &r.failure {
        v.ran_and_failed(f, d.clone());
        if crate::gpu::HACK_FAILURES.contains(&f.as_str()) && !v.hack_flags.contains(f) {
            v.hack_flags.push(f.clone());
        }
    }
}

/// A job that ran and did not finish, or took its worker down: executed, not correct.
fn failed_run(v: &mut Verdict, o: &Outcome, wall: Duration) {
    match o {
        Outcome::Timeout => v.ran_and_failed(
            "timeout",
            format!(
                "no answer within {:.0} s; the worker was killed",
                wall.as_secs_f64()
            ),
        ),
        Outcome::Crash(m) => v.ran_and_failed("crash", m.clone()),
        Outcome::Done(_) => {}
    }
}

/// The second half of [`check_full`] for many candidates at once: times each on its bench
/// shape, with the task's naive kernel and libtorch reference measured once per task into
/// `baselines` (the naive kernel built before the GPU is taken), all on `pool` while it holds
/// the GPU alone once for the whole batch ([`WorkerPool::lock_gpu`]). One exclusive hold per
/// batch instead of one per candidate: each hold first waits for the other testers' jobs in
/// flight to finish, which in `validate` on an H100 cost about as much as the timings
/// themselves (`benchmarks/results/validate_batched_timing_h100_2026-11-24.json`). Returns the
/// verdicts in `batch`'s order; a timeout or crash marks its candidate (executed, not correct) and
/// the batch goes on.
pub fn time_batch(
    batch: Vec<PendingTiming>,
    compiler: &Compiler,
    pool: &mut WorkerPool,
    baselines: &std::sync::Mutex<Baselines>,
) -> Vec<Verdict> {
    let base = |id: &str| known(baselines, id);
    let cudart = compiler.nvcc.cudart().map(|p| p.display().to_string());
    // The naive kernels to time for tasks without a naive baseline whose naive kernel is not in
    // the batch itself, built now so no nvcc runs while the GPU is held.
    let mut naive_so = std::collections::BTreeMap::<String, String>::new();
    for p in &batch {
        let id = &p.spec.id;
        if p.is_naive
            || naive_so.contains_key(id)
            || base(id).naive.is_some()
            || batch.iter().any(|q| q.is_naive && &q.spec.id == id)
        {
            continue;
        }
        if let Some(src) = &p.naive_source
            && let Ok(out) = compiler.compile(src, &p.spec.shim(), &Rules::builtin())
            && let (Some(h), Some(store)) = (out.so_hash, compiler.store.as_ref())
        {
            naive_so.insert(id.clone(), store.blob_path(&h).display().to_string());
        }
    }
    // Naive kernels first: they are their tasks' baselines.
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by_key(|&i| !batch[i].is_naive);
    let held = if batch.is_empty() {
        None
    } else {
        Some(pool.lock_gpu())
    };
    let mut out: Vec<Option<Verdict>> = vec![None; batch.len()];
    let n = order.len();
    for (k, i) in order.into_iter().enumerate() {
        let p = &batch[i];
        let mut v = p.verdict.clone();
        let run = |pool: &mut WorkerPool, job: RunJob| match &held {
            Some(Ok(l)) => pool.run_holding(&job, p.wall, l),
            Some(Err(e)) => Outcome::Crash(format!("GPU lock: {e}")),
            None => unreachable!("a non-empty batch holds the GPU"),
        };
        let timing = RunJob {
            so_path: Some(p.so.clone()),
            task: (*p.spec).clone(),
            shapes: vec![p.shape.clone()],
            seeds: vec![],
            bench: Some(p.bench.clone()),
            torch_baseline: base(&p.spec.id).torch.is_none(),
            cudart: cudart.clone(),
            wall_s: Some(p.wall.as_secs_f64()),
            // The rest of the batch (and a naive baseline per task at most).
            upcoming: n - 1 - k + naive_so.len(),
            exclusive_timing: false,
            profile: false,
        };
        let o = run(pool, timing);
        failed_run(&mut v, &o, p.wall);
        if let Outcome::Done(r) = &o {
            if let (Some(w), Some(t)) = (v.worker_ms.as_mut(), &r.worker_ms) {
                w.runner += t.runner;
                w.timing = t.timing;
                w.torch = t.torch;
                w.transfer = t.transfer;
            }
            answer_failure(&mut v, r);
        }
        read_timing(&mut v, &o, &p.spec, baselines);
        if v.correct == Some(true) && v.timing.is_some() {
            // The naive kernel on the same shape (itself: speedup 1), measured once per task.
            if p.is_naive {
                record(baselines, &p.spec.id, |b| &mut b.naive, v.timing.as_ref());
            } else if base(&p.spec.id).naive.is_none()
                && let Some(so) = naive_so.get(&p.spec.id)
            {
                let job = RunJob {
                    upcoming: n - 1 - k,
                    ..naive_job(
                        &p.spec,
                        so.clone(),
                        p.shape.clone(),
                        compiler,
                        (p.wall, &p.bench),
                    )
                };
                if let Outcome::Done(r) = run(pool, job) {
                    record(baselines, &p.spec.id, |b| &mut b.naive, r.timing.as_ref());
                }
            }
            speedups(&mut v, &base(&p.spec.id));
        }
        out[i] = Some(v);
    }
    out.into_iter()
        .map(|v| v.expect("every candidate timed"))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn defined_functions_are_the_names_with_a_body() {
        let src = "#include <x>\n__global__ void k(const float* a, float* o, int64_t n) {\n  if (n) { o[0] = a[0]; }\n  for (int i = 0; i < n; ++i) {}\n}\n\
                   static __device__ inline float sq(float x) { return x * x; }\n\
                   extern \"C\" void launch2(const float* a, float* o, int64_t n, cudaStream_t s) {\n  k<<<1, 1, 0, s>>>(a, o, n);\n}\n\
                   void declared_only(int);\n";
        assert_eq!(super::defined_functions(src), ["k", "sq", "launch2"]);
    }
}
