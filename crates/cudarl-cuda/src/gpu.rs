//! The GPU side of the harness as data: the GPU's description and [`probe`], and the job and
//! result types of the worker protocol. The runner itself (libtorch buffers, checks, timing)
//! lives in the `cudarl-torch` crate's worker binary, so `cudarl-pipe` does not load libtorch
//! (0.35 s per start) for commands that never touch the GPU.
//!
//! libcuda is loaded at run time (cudarc `dynamic-loading`), so this builds and links on
//! machines without CUDA; [`probe`] says whether a GPU is usable.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, sys};
use serde::{Deserialize, Serialize};

use crate::task::TaskSpec;

/// The GPU and the environment timings depend on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability as `sm_XY`.
    pub arch: String,
    /// Streaming multiprocessors.
    pub sms: i32,
    /// SM clock, kHz (`CU_DEVICE_ATTRIBUTE_CLOCK_RATE`).
    pub sm_clock_khz: i32,
    /// Memory clock, kHz.
    pub mem_clock_khz: i32,
    /// L2 size, bytes.
    pub l2_bytes: i32,
    /// Driver version (`cuDriverGetVersion`, e.g. 13000).
    pub driver_version: i32,
    /// Total memory, bytes.
    pub total_mem_bytes: usize,
    /// Memory bus width, bits.
    pub mem_bus_bits: i32,
}

impl GpuInfo {
    /// Theoretical peak DRAM bandwidth, bytes per ms: 2 (double data rate) x memory clock x bus
    /// width / 8 (the standard formula from the device attributes; e.g. H100 SXM: 2 x 2619 MHz x
    /// 5120 bit / 8 = 3.35 TB/s).
    pub fn peak_bytes_per_ms(&self) -> f64 {
        2.0 * self.mem_clock_khz as f64 * 1e3 * (self.mem_bus_bits as f64 / 8.0) / 1e3
    }
}

impl GpuInfo {
    /// Peak dense tensor-core rate in FLOP per ms (FP16/BF16 inputs, the highest dense rate a
    /// kernel of any task dtype can reach): SMs x SM clock x FLOP per clock per SM, with 4096
    /// FLOP/clk/SM on sm_90 (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022: 989.4
    /// TFLOP/s dense BF16 on 132 SMs at 1.83 GHz), 2048 on sm_8x (A100 whitepaper, 2020: 312
    /// TFLOP/s on 108 SMs at 1.41 GHz), 8192 from sm_100, 1024 before sm_80. An upper bound on
    /// what any kernel can do, used for the FLOP roofline (`roofline_flops_ms`), so an honest
    /// kernel is never flagged.
    pub fn peak_flop_per_ms(&self) -> f64 {
        let major: u32 = self
            .arch
            .trim_start_matches("sm_")
            .chars()
            .next()
            .and_then(|c| c.to_digit(10))
            .unwrap_or(0);
        let arch_num: u32 = self.arch.trim_start_matches("sm_").parse().unwrap_or(0);
        let per_clk = if arch_num >= 100 {
            8192.0
        } else if major == 9 {
            4096.0
        } else if major == 8 {
            2048.0
        } else {
            1024.0
        };
        self.sms as f64 * self.sm_clock_khz as f64 * 1e3 * per_clk / 1e3
    }
}

/// Whether libcuda loads and a device exists; the device's info if so. Probed once per process.
pub fn probe() -> Option<GpuInfo> {
    static PROBE: std::sync::OnceLock<Option<GpuInfo>> = std::sync::OnceLock::new();
    PROBE.get_or_init(probe_uncached).clone()
}

fn probe_uncached() -> Option<GpuInfo> {
    // SAFETY: only tries to dlopen libcuda.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    if cudarc::driver::result::init().is_err() {
        return None;
    }
    if CudaContext::device_count().ok()? < 1 {
        return None;
    }
    let ctx = CudaContext::new(0).ok()?;
    info(&ctx).ok()
}

/// Whether libcuda loads and reports at least one device, without creating a context (cheaper
/// than [`probe`]: no device memory is taken).
pub fn present() -> bool {
    // SAFETY: only tries to dlopen libcuda.
    let lib = unsafe { cudarc::driver::sys::is_culib_present() };
    lib && cudarc::driver::result::init().is_ok()
        && CudaContext::device_count().is_ok_and(|n| n > 0)
}

/// How many CUDA devices this process sees (0 without libcuda or a driver).
pub fn device_count() -> usize {
    if probe().is_none() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

/// Loads `fatbin` (an nvcc fatbin a crate embeds) on device `ordinal`'s primary context, the one
/// libtorch uses, and makes that context current; returns the `CUfunction`s named `names`, in
/// order, and the context, as addresses.
///
/// # Errors
/// A driver call failed (its name and error in the message).
pub fn load_embedded_kernels<const N: usize>(
    fatbin: &[u8],
    ordinal: i32,
    names: &[&str; N],
) -> Result<([usize; N], usize), String> {
    use cudarc::driver::result;
    let err = |what: &str, e: result::DriverError| format!("{what}: {e:?}");
    // The fatbin 8-byte aligned, as cuModuleLoadData reads it.
    let mut image = vec![0u64; fatbin.len().div_ceil(8)];
    // SAFETY: `image` has at least `fatbin.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(fatbin.as_ptr(), image.as_mut_ptr().cast(), fatbin.len())
    };
    result::init().map_err(|e| err("cuInit", e))?;
    let dev = result::device::get(ordinal).map_err(|e| err("cuDeviceGet", e))?;
    // SAFETY: `dev` came from cuDeviceGet; the primary context is kept for the life of the
    // process (never released).
    unsafe {
        let ctx = result::primary_ctx::retain(dev).map_err(|e| err("retain", e))?;
        result::ctx::set_current(ctx).map_err(|e| err("cuCtxSetCurrent", e))?;
        let module = result::module::load_data(image.as_ptr().cast())
            .map_err(|e| err("cuModuleLoadData", e))?;
        let mut fs = [0usize; N];
        for (f, k) in fs.iter_mut().zip(names) {
            let name = std::ffi::CString::new(*k).map_err(|e| e.to_string())?;
            *f = result::module::get_function(module, name)
                .map_err(|e| err("cuModuleGetFunction", e))? as usize;
        }
        Ok((fs, ctx as usize))
    }
}

/// Reads the device's attributes.
///
/// # Errors
/// The driver's error for the first query that failed.
pub fn info(ctx: &Arc<CudaContext>) -> Result<GpuInfo, cudarc::driver::DriverError> {
    let (maj, min) = ctx.compute_capability()?;
    let a = |k| ctx.attribute(k);
    let mut ver = 0i32;
    // SAFETY: plain driver query.
    unsafe { sys::cuDriverGetVersion(&mut ver) };
    Ok(GpuInfo {
        name: ctx.name()?,
        arch: format!("sm_{maj}{min}"),
        sms: a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        sm_clock_khz: a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?,
        mem_clock_khz: a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?,
        l2_bytes: a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        driver_version: ver,
        total_mem_bytes: ctx.total_mem()?,
        mem_bus_bits: a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?,
    })
}

/// One shape to test, with its split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeCase {
    /// `train` or `holdout`.
    pub split: String,
    /// Size values.
    pub sizes: BTreeMap<String, i64>,
}

/// Timing settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchSpec {
    /// Index into `shapes` of the shape to time.
    pub shape_index: usize,
    /// Untimed launches first.
    pub warmup: usize,
    /// At least this many timed repetitions, unless they would overrun the time budget: a kernel
    /// slower than `budget_ms / min_reps` stops at the budget, with at least 5 repetitions.
    pub min_reps: usize,
    /// At most this many.
    pub max_reps: usize,
    /// Stop once the coefficient of variation (std/mean) is below this...
    pub target_cv: f64,
    /// ...or once this much time was spent timing, ms.
    pub budget_ms: f64,
    /// Flush L2 before each timing window (one window launches the candidate on several
    /// freshly drawn buffer sets back to back, so each launch reads inputs no launch touched
    /// since the flush).
    pub flush_l2: bool,
    /// Work to aim for in one timing window, ms: the window's fixed cost (the GPU switching to the
    /// runner's context and back, calibrated and subtracted) is amortized over this much work.
    #[serde(default = "default_window_ms")]
    pub window_ms: f64,
    /// At most this many buffer sets (launches) in one window.
    #[serde(default = "default_max_sets")]
    pub max_sets: usize,
    /// At most this many bytes of buffer sets in one window.
    #[serde(default = "default_max_set_bytes")]
    pub max_set_bytes: u64,
}

fn default_window_ms() -> f64 {
    2.0
}

fn default_max_sets() -> usize {
    16
}

fn default_max_set_bytes() -> u64 {
    3 << 30
}

impl Default for BenchSpec {
    fn default() -> Self {
        BenchSpec {
            shape_index: 0,
            warmup: 3,
            min_reps: 30,
            max_reps: 300,
            target_cv: 0.02,
            budget_ms: 100.0,
            flush_l2: true,
            window_ms: default_window_ms(),
            max_sets: default_max_sets(),
            max_set_bytes: default_max_set_bytes(),
        }
    }
}

/// A job for a worker: run the shared object at `so_path` for `task` on every shape × seed,
/// then time it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunJob {
    /// Shared object built by [`crate::Compiler`]; `None` for a job that only times the
    /// torch baseline.
    pub so_path: Option<String>,
    /// Task spec.
    pub task: TaskSpec,
    /// Shapes to test.
    pub shapes: Vec<ShapeCase>,
    /// Input seeds (public and hidden).
    pub seeds: Vec<u64>,
    /// Timing, if wanted.
    pub bench: Option<BenchSpec>,
    /// Also time the task's reference in libtorch on the bench shape (`speedup_vs_torch`).
    #[serde(default)]
    pub torch_baseline: bool,
    /// The shared CUDA runtime the shared object links (`libcudart.so.N`): the runner preloads
    /// it before its sandbox.
    #[serde(default)]
    pub cudart: Option<String>,
    /// The caller's wall-clock limit per step, seconds: the judge gives its runner a little less
    /// for one answer, so a hang is the runner's timeout and the judge answers.
    #[serde(default)]
    pub wall_s: Option<f64>,
    /// Jobs the caller will send right after this one (e.g. the rest of a timing batch): the
    /// worker keeps that many sandboxed runners started ahead of time (bounded), so their CUDA
    /// initialization overlaps this job instead of delaying the next.
    #[serde(default)]
    pub upcoming: usize,
    /// Tests under a shared hold of the GPU, then times (`bench`, and `torch_baseline` when
    /// asked) in the same runner once the GPU is held alone: the worker asks its parent with an
    /// `{"exclusive":true}` line after the tests pass and waits for a `go` line on its stdin
    /// ([`crate::worker`]). One runner per candidate instead of one for its tests and one for
    /// its timing.
    #[serde(default)]
    pub exclusive_timing: bool,
    /// After a timed candidate's timing, the profile pass ([`crate::profile`]): one more runner
    /// under Nsight Compute, one checked launch on the bench shape.
    #[serde(default)]
    pub profile: bool,
}

impl RunJob {
    /// A job for `task` that asks for nothing yet: no shared object, shapes, seeds or timing,
    /// no wall-clock limit, nothing upcoming and every option off; callers set what they need
    /// (`RunJob { seeds: vec![0], ..RunJob::for_task(task) }`).
    pub fn for_task(task: TaskSpec) -> RunJob {
        RunJob {
            so_path: None,
            task,
            shapes: vec![],
            seeds: vec![],
            bench: None,
            torch_baseline: false,
            cudart: None,
            wall_s: None,
            upcoming: 0,
            exclusive_timing: false,
            profile: false,
        }
    }
}

/// Result of one (shape, seed) test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestResult {
    /// `train` or `holdout`.
    pub split: String,
    /// Sizes.
    pub sizes: BTreeMap<String, i64>,
    /// Seed.
    pub seed: u64,
    /// Within tolerance everywhere, every output written, inputs untouched, no OOB write.
    pub passed: bool,
    /// Max |out - ref|.
    pub max_abs_err: f64,
    /// Max |out - ref| / max(|ref|, 1e-12).
    pub max_rel_err: f64,
    /// Output elements left with the poison value.
    pub unwritten: u64,
    /// Output elements that are NaN or infinite.
    pub non_finite: u64,
    /// An input buffer changed.
    pub input_mutated: bool,
    /// A guard region after a buffer changed.
    pub out_of_bounds_write: bool,
    /// First failure, in words.
    pub message: Option<String>,
}

/// Timing statistics, ms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Median.
    pub median_ms: f64,
    /// 10th percentile.
    pub p10_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// Mean.
    pub mean_ms: f64,
    /// Coefficient of variation (std / mean).
    pub cv: f64,
    /// Timed repetitions.
    pub reps: usize,
    /// Host-to-device copy of the buffers from pageable host memory, ms (not in the kernel
    /// time): their bytes at the copy rate each worker process measures once on a 64 MiB
    /// buffer.
    pub h2d_ms: f64,
    /// Device-to-host copy of the buffers to pageable host memory, ms.
    pub d2h_ms: f64,
    /// Sizes timed.
    pub sizes: BTreeMap<String, i64>,
    /// Median from the start event until the device-wide synchronize returned and a final
    /// event ran (includes the host's wake-up latency, about 10-30 us).
    #[serde(default)]
    pub synced_median_ms: f64,
    /// Outputs still changed after the stop event (sampled chunks copied at the stop differ
    /// from the same chunks once the runner's context is synchronized): the statistics are then
    /// the synchronized times, and the verdict carries the `work_after_stop` hack flag.
    #[serde(default)]
    pub work_after_stop: bool,
    /// Buffer sets (launches) per timing window.
    #[serde(default)]
    pub sets: usize,
    /// Timing windows measured (warm-up excluded).
    #[serde(default)]
    pub windows: usize,
    /// The window's fixed cost subtracted from each window, ms: the GPU switching to the
    /// runner's context and back (and for torch-format candidates the judge's input copy and L2
    /// flush), the least of the empty windows in the same run (0 for the torch baseline, which
    /// runs in the judge's own context).
    #[serde(default)]
    pub overhead_ms: f64,
    /// Timed buffer sets whose outputs were compared with the reference: up to eight sets,
    /// drawn by the judge, in every timed window (all of a window's sets when it has fewer);
    /// every window's outputs are checked for poison left. Torch-format timing: one per timed
    /// window.
    #[serde(default)]
    pub verified_sets: usize,
}

/// Wall time a worker spent on one job, by phase, ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerMs {
    /// Every (shape, seed) test: inputs, launch, reference, comparisons.
    pub tests: f64,
    /// Timing the candidate (calibration, warm-up and timing windows, their fresh inputs and
    /// verification; no transfers).
    pub timing: f64,
    /// Timing the torch baseline, when asked (`transfer` included).
    pub torch: f64,
    /// Of `torch`: measuring the host<->device copy rate for `h2d_ms` / `d2h_ms` (once per
    /// worker process, 0 after).
    #[serde(default)]
    pub transfer: f64,
    /// Waiting for a sandboxed runner to be ready (CUDA initialized; usually started ahead of
    /// time) and, for a native run, loading the candidate in it (a torch-format run reports
    /// `load` apart; a timed one also waits here for the next run's runner to be up before
    /// its first timing window).
    #[serde(default)]
    pub runner: f64,
    /// The profile pass ([`RunJob::profile`]): starting `ncu` and its runner, the profiled
    /// launch (`ncu` replays each kernel once per group of counters) and reading its CSV. A
    /// torch-format run: the kernels one forward ran, the candidate's (and the reference's
    /// unless stored).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub profile: f64,
    /// A torch-format run: measuring the GPU's switch between the judge's and the runner's
    /// contexts before timing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub switch: f64,
    /// A torch-format run: loading the candidate in its runner.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub load: f64,
    /// A torch-format run: the problem's own sizes (fresh inputs, the reference, the candidate).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub full_size: f64,
    /// A torch-format run: waiting for the machine's full-size lock before `full_size` (one
    /// worker at a time checks a problem at its own sizes).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub full_size_wait: f64,
    /// A torch-format run: the reference under `torch.compile` (compiling and timing it the
    /// first time on a worker, unless stored).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub torch_compile: f64,
    /// A torch-format run: the whole run in the worker, from the request to the answer.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub total: f64,
    /// A torch-format run, of `timing`: the empty windows that measure the fixed cost, before
    /// and after the timed ones.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timing_calibrate: f64,
    /// Of `timing`: drawing each window's fresh inputs and poisoning its outputs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timing_inputs: f64,
    /// Of `timing`: the windows themselves (the handshake with the runner, the candidate's
    /// launch, the samples at the stop event).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timing_windows: f64,
    /// Of `timing`: the reference `Model` on each timed window's inputs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timing_reference: f64,
    /// Of `timing`: comparing each timed window's outputs with the reference and its inputs
    /// with the judge's copies.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timing_checks: f64,
    /// Of `timing`: ending the runner after the timed windows, until its process is reaped
    /// (the fixed cost is measured again after it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timing_end: f64,
    /// Of `timing_windows`: waiting for the runner to say it enqueued its launch, before each
    /// window starts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timing_ready: f64,
    /// Of `full_size`, over its seeds: building the reference `Model` and drawing fresh inputs
    /// on the GPU.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub full_size_draw: f64,
    /// Of `full_size`: the reference's forward.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub full_size_reference: f64,
    /// Of `full_size`: the arena with the inputs and parameters (fresh, or the previous seed's
    /// zeroed and refilled) that the runner maps.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub full_size_bind: f64,
    /// Of `full_size`: poisoning the outputs and the candidate's run in its runner.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub full_size_run: f64,
    /// Of `full_size`: comparing the outputs with the reference's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub full_size_compare: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// Runner failures that are reward hacks: the verdict carries them as hack flags too.
pub const HACK_FAILURES: [&str; 3] = [
    "sandbox_violation",
    "timed_output_mismatch",
    "work_before_start",
];

/// What a worker returns for a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Per-test results.
    pub tests: Vec<TestResult>,
    /// Timing, if asked and all tests passed.
    pub timing: Option<Timing>,
    /// Timing of the task's reference evaluated by libtorch (f32) on the bench shape, if asked.
    #[serde(default)]
    pub torch_timing: Option<Timing>,
    /// A CUDA error (launch or sync), e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`; the context is
    /// unusable afterwards and the worker exits.
    pub cuda_error: Option<String>,
    /// Loading the shared object failed.
    pub load_error: Option<String>,
    /// The judge itself failed on this job: libtorch or the CUDA driver on the judge's side
    /// (out of GPU memory included, e.g. when other processes hold the GPU's memory), or the
    /// task's libtorch reference timing. Nothing is known about the candidate; the worker exits
    /// after answering, and [`crate::worker::WorkerPool::run`] runs the job once more on a
    /// fresh worker with the GPU alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_error: Option<String>,
    /// The GPU.
    pub gpu: Option<GpuInfo>,
    /// Time by phase.
    #[serde(default)]
    pub worker_ms: Option<WorkerMs>,
    /// How the candidate failed in its runner, with the detail: `timeout` (no answer within the
    /// wall-clock limit), `crash` (the runner died), `sandbox_violation` (a denied system call),
    /// `timed_output_mismatch` (a timed launch's outputs were wrong or unwritten on fresh
    /// inputs), `work_before_start` (outputs written before the timing window started). The
    /// last three are reward hacks ([`HACK_FAILURES`]).
    #[serde(default)]
    pub failure: Option<(String, String)>,
    /// What the candidate printed (stdout then stderr, the last 4 KiB of each): its own words,
    /// never parsed.
    #[serde(default)]
    pub candidate_output: Option<String>,
    /// The profile pass, when [`RunJob::profile`] asked for it and the candidate was timed.
    #[serde(default)]
    pub profile: Option<crate::profile::ProfileOutcome>,
    /// The candidate's runner could not map the window events, so its windows were ordered by
    /// the arena's fallback words, which lie in memory the candidate's context maps
    /// ([`Verdict::window_words`](crate::Verdict::window_words)).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub window_words: bool,
}
