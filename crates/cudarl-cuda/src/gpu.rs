//! Running a compiled candidate on the GPU: buffers allocated by the harness (cudarc), fresh
//! inputs per seed, poisoned outputs with guard regions, input-mutation and out-of-bounds
//! checks, the reference computed after the candidate, and CUDA-event timing with a
//! device-wide synchronize before the stop event and an L2 flush before every repetition.
//!
//! libcuda is loaded at run time (cudarc `dynamic-loading`), so this builds and links on
//! machines without CUDA; [`probe`] says whether a GPU is usable.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
use serde::{Deserialize, Serialize};

use crate::reference;
use crate::task::{ArgKind, TaskSpec, eval_formula};

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

fn info(ctx: &Arc<CudaContext>) -> Result<GpuInfo, String> {
    let e = |x: cudarc::driver::DriverError| x.to_string();
    let (maj, min) = ctx.compute_capability().map_err(e)?;
    let a = |k| ctx.attribute(k).map_err(e);
    let mut ver = 0i32;
    // SAFETY: plain driver query.
    unsafe { sys::cuDriverGetVersion(&mut ver) };
    Ok(GpuInfo {
        name: ctx.name().map_err(e)?,
        arch: format!("sm_{maj}{min}"),
        sms: a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        sm_clock_khz: a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?,
        mem_clock_khz: a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?,
        l2_bytes: a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        driver_version: ver,
        total_mem_bytes: ctx.total_mem().map_err(e)?,
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
    /// At least this many timed repetitions.
    pub min_reps: usize,
    /// At most this many.
    pub max_reps: usize,
    /// Stop once the coefficient of variation (std/mean) is below this...
    pub target_cv: f64,
    /// ...or once this much time was spent timing, ms.
    pub budget_ms: f64,
    /// Flush L2 before each repetition.
    pub flush_l2: bool,
}

impl Default for BenchSpec {
    fn default() -> Self {
        BenchSpec {
            shape_index: 0,
            warmup: 5,
            min_reps: 30,
            max_reps: 300,
            target_cv: 0.01,
            budget_ms: 2000.0,
            flush_l2: true,
        }
    }
}

/// A job for a worker: run the shared object at `so_path` for `task` on every shape × seed,
/// then time it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunJob {
    /// Shared object built by [`crate::Compiler`].
    pub so_path: String,
    /// Task spec.
    pub task: TaskSpec,
    /// Shapes to test.
    pub shapes: Vec<ShapeCase>,
    /// Input seeds (public and hidden).
    pub seeds: Vec<u64>,
    /// Timing, if wanted.
    pub bench: Option<BenchSpec>,
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
    /// Host-to-device copy of the buffers from pageable host memory, ms (measured separately,
    /// not in the kernel time).
    pub h2d_ms: f64,
    /// Device-to-host copy of the buffers to pageable host memory, ms.
    pub d2h_ms: f64,
    /// Sizes timed.
    pub sizes: BTreeMap<String, i64>,
}

/// What a worker returns for a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Per-test results.
    pub tests: Vec<TestResult>,
    /// Timing, if asked and all tests passed.
    pub timing: Option<Timing>,
    /// A CUDA error (launch or sync), e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`; the context is
    /// unusable afterwards and the worker exits.
    pub cuda_error: Option<String>,
    /// Loading the shared object failed.
    pub load_error: Option<String>,
    /// The GPU.
    pub gpu: Option<GpuInfo>,
}

const POISON: u32 = 0x7FBA_DBAD; // a NaN payload no arithmetic produces
const GUARD: u32 = 0x7FC0_FFEE;
const GUARD_ELEMS: usize = 4096;

/// The SplitMix64 finalizer (Steele, Lea, Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014), used as a counter-based generator: element `i` of a buffer is a
/// pure function of (seed, argument, i), so inputs are generated in parallel and reproducibly.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Inputs for `seed`: signed values uniform in [-s, s) whose scale s depends on the seed (1, 100,
/// 0.01), so a kernel cannot lean on one range or sign. Generated in parallel.
pub fn gen_input(len: usize, seed: u64, arg_index: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let base = mix64(seed ^ mix64(arg_index as u64 + 1));
    let scale = [1.0f32, 100.0, 0.01][(seed % 3) as usize];
    (0..len)
        .into_par_iter()
        .map(|i| {
            let r = mix64(base ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
            ((r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

type Entry = unsafe extern "C" fn(
    *const *mut std::ffi::c_void,
    *const i64,
    *const f32,
    sys::CUstream,
) -> i32;

/// Runs jobs in one CUDA context (lives in a worker process).
pub struct Runner {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: GpuInfo,
    l2_scratch: Option<CudaSlice<u8>>,
}

fn derr(e: cudarc::driver::DriverError) -> String {
    e.to_string()
}

impl Runner {
    /// Creates a context on device 0 and a stream for candidates.
    ///
    /// # Errors
    /// No GPU or driver failure.
    pub fn new() -> Result<Runner, String> {
        // SAFETY: dlopen probe.
        if !unsafe { sys::is_culib_present() } {
            return Err("libcuda not found: no GPU driver on this machine".into());
        }
        let ctx = CudaContext::new(0).map_err(derr)?;
        // The harness synchronizes explicitly; no implicit event tracking on raw pointers.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(derr)?;
        let info = info(&ctx)?;
        Ok(Runner {
            ctx,
            stream,
            info,
            l2_scratch: None,
        })
    }

    /// The GPU.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    fn upload(&self, data: &[f32]) -> Result<CudaSlice<f32>, String> {
        self.stream.clone_htod(data).map_err(derr)
    }

    fn ptr(&self, s: &CudaSlice<f32>) -> sys::CUdeviceptr {
        let (p, _g) = s.device_ptr(&self.stream);
        p
    }

    /// Runs one job. A CUDA error is reported in the result; callers must drop the runner
    /// (the process) after one.
    pub fn run(&mut self, job: &RunJob) -> RunResult {
        self.run_with_heartbeat(job, &mut || {})
    }

    /// Like [`Runner::run`], calling `heartbeat` before each GPU step (buffer set-up, launch
    /// and synchronize, timing), so the parent's wall-clock limit applies per step, not to the
    /// whole job (large shapes spend seconds on host-side inputs and references).
    pub fn run_with_heartbeat(&mut self, job: &RunJob, heartbeat: &mut dyn FnMut()) -> RunResult {
        let mut res = RunResult {
            tests: vec![],
            timing: None,
            cuda_error: None,
            load_error: None,
            gpu: Some(self.info.clone()),
        };
        // SAFETY: loading a shared object built by the harness from a statically checked source;
        // its constructors run here, inside the sandboxed worker.
        let lib = match unsafe { libloading::Library::new(&job.so_path) } {
            Ok(l) => l,
            Err(e) => {
                res.load_error = Some(e.to_string());
                return res;
            }
        };
        let entry: libloading::Symbol<Entry> = match unsafe { lib.get(b"cudarl_entry") } {
            Ok(s) => s,
            Err(e) => {
                res.load_error = Some(e.to_string());
                return res;
            }
        };
        for shape in &job.shapes {
            for &seed in &job.seeds {
                heartbeat();
                match self.test_one(&job.task, &entry, shape, seed, heartbeat) {
                    Ok(t) => res.tests.push(t),
                    Err(e) => {
                        res.cuda_error = Some(e);
                        return res;
                    }
                }
            }
        }
        if let Some(b) = &job.bench
            && res.tests.iter().all(|t| t.passed)
        {
            match self.time(
                &job.task,
                &entry,
                &job.shapes[b.shape_index.min(job.shapes.len() - 1)],
                b,
            ) {
                Ok(t) => res.timing = Some(t),
                Err(e) => res.cuda_error = Some(e),
            }
        }
        res
    }

    fn buffers(
        &self,
        task: &TaskSpec,
        sizes: &BTreeMap<String, i64>,
        seed: u64,
    ) -> Result<Bufs, String> {
        let mut b = Bufs::default();
        let mut upload = std::time::Duration::ZERO;
        for (ai, a) in task.args.iter().enumerate() {
            match a.kind {
                ArgKind::Input | ArgKind::Output => {
                    let n = eval_formula(&a.shape.join("*"), sizes)? as usize;
                    let mut host = if a.kind == ArgKind::Input {
                        gen_input(n, seed, ai)
                    } else {
                        vec![f32::from_bits(POISON); n]
                    };
                    host.extend(std::iter::repeat_n(f32::from_bits(GUARD), GUARD_ELEMS));
                    let t0 = Instant::now();
                    let dev = self.upload(&host)?;
                    self.stream.synchronize().map_err(derr)?;
                    upload += t0.elapsed();
                    b.args.push((a.kind, n, host, dev));
                }
                _ => {}
            }
        }
        b.sizes = task.sizes.iter().map(|s| sizes[s]).collect();
        b.upload_ms = upload.as_secs_f64() * 1e3;
        Ok(b)
    }

    fn launch(&self, entry: &Entry, b: &Bufs) -> Result<(), String> {
        let ptrs: Vec<*mut std::ffi::c_void> = b
            .args
            .iter()
            .map(|(_, _, _, d)| self.ptr(d) as *mut _)
            .collect();
        let scalars: Vec<f32> = vec![];
        // SAFETY: the entry point's signature is fixed by the generated shim.
        let rc = unsafe {
            entry(
                ptrs.as_ptr(),
                b.sizes.as_ptr(),
                scalars.as_ptr(),
                self.stream.cu_stream(),
            )
        };
        if rc != 0 {
            return Err(format!("launch returned cudaError {rc}"));
        }
        Ok(())
    }

    fn test_one(
        &self,
        task: &TaskSpec,
        entry: &Entry,
        shape: &ShapeCase,
        seed: u64,
        heartbeat: &mut dyn FnMut(),
    ) -> Result<TestResult, String> {
        let b = self.buffers(task, &shape.sizes, seed)?;
        heartbeat();
        self.launch(entry, &b)?;
        // The whole device, not one stream: work the candidate put elsewhere is waited for.
        self.ctx.synchronize().map_err(derr)?;
        let mut t = TestResult {
            split: shape.split.clone(),
            sizes: shape.sizes.clone(),
            seed,
            passed: false,
            max_abs_err: 0.0,
            max_rel_err: 0.0,
            unwritten: 0,
            non_finite: 0,
            input_mutated: false,
            out_of_bounds_write: false,
            message: None,
        };
        let mut inputs: Vec<&[f32]> = Vec::new();
        let mut outputs: Vec<Vec<f32>> = Vec::new();
        for (kind, n, host, dev) in &b.args {
            let got = self.stream.clone_dtoh(dev).map_err(derr)?;
            if got[*n..].iter().any(|v| v.to_bits() != GUARD) {
                t.out_of_bounds_write = true;
            }
            match kind {
                ArgKind::Input => {
                    if got[..*n]
                        .iter()
                        .zip(&host[..*n])
                        .any(|(a, b)| a.to_bits() != b.to_bits())
                    {
                        t.input_mutated = true;
                    }
                    inputs.push(&host[..*n]);
                }
                _ => outputs.push(got[..*n].to_vec()),
            }
        }
        // Reference after the candidate, in f64 on the host.
        let reference = reference::compute(task, &shape.sizes, &inputs)?;
        let (atol, rtol) = (task.atol, task.rtol);
        let mut bad = 0u64;
        for (out, refo) in outputs.iter().zip(&reference) {
            use rayon::prelude::*;
            // (unwritten, non-finite, outside tolerance, max abs, max rel), reduced in parallel.
            let z = (0u64, 0u64, 0u64, 0f64, 0f64);
            let (u, nf, b, ma, mr) = out
                .par_iter()
                .zip(refo.values.par_iter())
                .zip(refo.magnitudes.par_iter())
                .fold(
                    || z,
                    |mut acc, ((o, r), m)| {
                        if o.to_bits() == POISON {
                            acc.0 += 1;
                        } else if !o.is_finite() {
                            acc.1 += 1;
                        } else {
                            let d = (*o as f64 - r).abs();
                            acc.3 = acc.3.max(d);
                            acc.4 = acc.4.max(d / r.abs().max(1e-12));
                            if d > atol + rtol * m {
                                acc.2 += 1;
                            }
                        }
                        acc
                    },
                )
                .reduce(
                    || z,
                    |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2, a.3.max(b.3), a.4.max(b.4)),
                );
            t.unwritten += u;
            t.non_finite += nf;
            bad += b;
            t.max_abs_err = t.max_abs_err.max(ma);
            t.max_rel_err = t.max_rel_err.max(mr);
        }
        t.message = if t.out_of_bounds_write {
            Some("wrote past the end of a buffer".into())
        } else if t.input_mutated {
            Some("modified an input buffer".into())
        } else if t.unwritten > 0 {
            Some(format!(
                "{} output elements were never written",
                t.unwritten
            ))
        } else if t.non_finite > 0 {
            Some(format!(
                "{} output elements are NaN or infinite",
                t.non_finite
            ))
        } else if bad > 0 {
            Some(format!(
                "{bad} elements outside tolerance (max abs err {:.3e})",
                t.max_abs_err
            ))
        } else {
            None
        };
        t.passed = t.message.is_none();
        Ok(t)
    }

    fn time(
        &mut self,
        task: &TaskSpec,
        entry: &Entry,
        shape: &ShapeCase,
        b: &BenchSpec,
    ) -> Result<Timing, String> {
        let bufs = self.buffers(task, &shape.sizes, 0x5EED)?;
        self.ctx.synchronize().map_err(derr)?;
        let h2d_ms = bufs.upload_ms;
        if b.flush_l2 && self.l2_scratch.is_none() {
            let n = (self.info.l2_bytes.max(1 << 20) as usize) * 2;
            self.l2_scratch = Some(self.stream.alloc_zeros::<u8>(n).map_err(derr)?);
        }
        let start = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(derr)?;
        let stop = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(derr)?;
        for _ in 0..b.warmup {
            self.launch(entry, &bufs)?;
        }
        self.ctx.synchronize().map_err(derr)?;
        let mut times = Vec::new();
        let budget = Instant::now();
        loop {
            if let Some(s) = self.l2_scratch.as_mut() {
                self.stream.memset_zeros(s).map_err(derr)?;
            }
            start.record(&self.stream).map_err(derr)?;
            self.launch(entry, &bufs)?;
            // Synchronize the whole device before the stop event, so work on other streams counts.
            self.ctx.synchronize().map_err(derr)?;
            stop.record(&self.stream).map_err(derr)?;
            times.push(start.elapsed_ms(&stop).map_err(derr)? as f64);
            let n = times.len();
            if n >= b.max_reps {
                break;
            }
            if n >= b.min_reps {
                let (m, s) = mean_std(&times);
                if s / m < b.target_cv || budget.elapsed().as_secs_f64() * 1e3 > b.budget_ms {
                    break;
                }
            }
        }
        let t1 = Instant::now();
        for (_, _, _, d) in &bufs.args {
            let _ = self.stream.clone_dtoh(d).map_err(derr)?;
        }
        let d2h_ms = t1.elapsed().as_secs_f64() * 1e3;
        let (mean, std) = mean_std(&times);
        let mut sorted = times.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize];
        Ok(Timing {
            median_ms: q(0.5),
            p10_ms: q(0.1),
            p90_ms: q(0.9),
            mean_ms: mean,
            cv: std / mean,
            reps: times.len(),
            h2d_ms,
            d2h_ms,
            sizes: shape.sizes.clone(),
        })
    }
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n.max(1.0);
    (m, var.sqrt())
}

#[derive(Default)]
struct Bufs {
    args: Vec<(ArgKind, usize, Vec<f32>, CudaSlice<f32>)>,
    sizes: Vec<i64>,
    upload_ms: f64,
}
