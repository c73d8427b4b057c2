//! The judge: the GPU worker's side of a native candidate's verdict. It owns the inputs, their
//! pristine copies, the reference, the comparisons and the clock; the candidate's code runs only
//! in a sandboxed runner process (`cudarl-pipe-runner`, see [`cudarl_cuda::runner`]) that sees one
//! device arena (a CUDA IPC allocation) and two interprocess events, and can only launch the
//! candidate on buffers inside the arena when told to (docs/architecture.md, "The judge and
//! the runner").
//!
//! **Windows** are the same for tests and timing: a block of `k` sets at a drawn place of the
//! arena ([`PLACE_UNIT`]), called in a drawn order; the runner's stream poisons every SM's shared
//! memory with a drawn pattern, waits on the judge's `go` event, launches, and records `done`.
//!
//! **Tests** (every train and hold-out shape): one window of a set per public and hidden seed,
//! then one of the two cache probes at the same place ([`Judge::test_shape`]). Every set is
//! checked: guards, input mutation, unwritten and non-finite outputs, and the reference
//! (evaluated in float64 on the GPU from the pristine copies, after the candidate ran). A fault,
//! a hang, a crash or a denied system call in the runner ends the tests with `cuda_error`,
//! `timeout`, `crash` or `sandbox_violation`; the judge itself goes on.
//!
//! **Timing**: `[wait gate >= a] [L2 flush] [samples] [start] [record go] [wait gate >= b]`,
//! then, once the runner has enqueued its side and answered, `[wait done] [stop] [samples]` on
//! the judge's stream ([`Judge::window`]; the gate is a host word of the judge's). Each window's
//! time, less the window's fixed cost (the GPU switching to the runner's context and back: the
//! least of five empty windows in the same run), divided by `k`, is one sample. After each
//! window the runner synchronizes its whole context; sampled output chunks copied right at the
//! stop event must equal the same chunks after that (`work_after_stop`), every set's outputs are
//! checked for the poison, and up to [`VERIFY_SETS`] sets drawn by the judge are compared with the
//! reference in every window (`timed_output_mismatch`); outputs written before the window started
//! are `work_before_start`. Inputs are fresh in every window, so results cached by pointer or
//! fingerprint, or work done ahead, are wrong; the candidate sees neither the repetition count
//! nor which launches are warm-up, tests or verified.
//! A timing-only job (batched timing: the tests ran in another worker) first launches the
//! candidate once in a test window ([`Judge::first_launch`]), so its first-use work is not held
//! behind a gate.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, sys};
use cudarl_cuda::expr::Expr;
use cudarl_cuda::gpu::{BenchSpec, GpuInfo, RunJob, RunResult, ShapeCase, TestResult, Timing};
use cudarl_cuda::profile::{Ncu, ProfileOutcome, parse_raw_csv};
use cudarl_cuda::runner::{
    Answer, CONTROL_BYTES, DONE_OFFSET, GO_OFFSET, Load, Rep, Reply, Request, Run, RunnerProcess,
    runner_failed, to_hex,
};
use cudarl_cuda::task::{ArgKind, TaskSpec, eval_formula};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Tensor};

use crate::error::{JudgeError, cu};
use crate::eval;
use crate::inputs::{Elem, gen_input, mix64, scalar_values};

const GUARD_ELEMS: i64 = 4096;
/// Alignment of buffers inside a set, bytes.
const ALIGN: u64 = 512;
/// Unit of a block's drawn place in the arena, bytes (the CUDA allocation alignment): every
/// buffer is at least this aligned, and its address modulo larger powers of two is drawn.
const PLACE_UNIT: u64 = 256;
/// Sets of a timed window compared with the reference (all of them when the window has fewer),
/// drawn by the judge (nothing in a call tells the candidate which): a candidate that skips the work of a share `g` of a
/// window's launches escapes that window's comparison with probability `(1 - g)^8` (under 0.004
/// for `g` = 1/2), and every window is compared.
const VERIFY_SETS: usize = 8;
/// Share of the elements of each input a cache probe redraws (at least one): the probe's inputs
/// equal an earlier test's everywhere else, at that test's pointer.
const PROBE_SHARE: f64 = 1.0 / 64.0;
/// Runners kept started ahead of time (CUDA initialization takes about 0.4 s): at least this
/// many, and as many as a job says will follow it ([`RunJob::upcoming`]), up to [`MAX_WARM`].
const WARM_RUNNERS: usize = 2;
/// Most runners kept started ahead of time (each holds a CUDA context, about 0.5 GB of device
/// memory).
const MAX_WARM: usize = 8;
/// Chunks of every output argument per window, each in a set drawn at random, copied aside just
/// before the window starts (they must still hold the poison: nothing may compute them ahead of
/// the clock), at the stop event and after the runner's synchronize (they must not change:
/// work after the stop); and their size, bytes. Work done ahead of or after the clock on a
/// share `f` of the outputs escapes one window with probability `(1 - f)^16`.
const EARLY_CHUNKS: usize = 16;
const EARLY_CHUNK_BYTES: u64 = 4096;
/// How long the gate waits for the runner to enqueue a window before it opens anyway.
const ARM_WAIT: Duration = Duration::from_secs(2);
/// Empty windows measured to calibrate the window's fixed cost (their least time is taken).
const CALIBRATION_WINDOWS: usize = 5;
/// The buffer the pageable copy rate is measured on, bytes (see [`Judge::transfer_ms`]).
const TRANSFER_PROBE_BYTES: u64 = 64 << 20;

/// Why a job stopped early.
#[derive(Debug)]
enum Fail {
    /// The candidate's context hit a CUDA error (launch or synchronize).
    Cuda(String),
    /// No answer within the wall-clock limit; the runner was killed.
    Timeout,
    /// The runner died (crash), with its status.
    Died(String),
    /// The runner was denied a system call.
    Violation(String),
    /// Loading the candidate failed.
    Load(String),
    /// A failure of the judge itself (libtorch, the driver on the judge's side).
    Judge(String),
    /// A timed launch misbehaved: (hack flag, detail).
    Timing(String, String),
}

impl Fail {
    /// Puts this failure in its field of `res`.
    fn record(self, res: &mut RunResult) {
        match self {
            Fail::Cuda(e) => res.cuda_error = Some(e),
            Fail::Timeout => res.failure = Some((
                "timeout".into(),
                "the candidate did not finish within the wall-clock limit; its runner was killed"
                    .into(),
            )),
            Fail::Died(m) => res.failure = Some(("crash".into(), m)),
            Fail::Violation(m) => res.failure = Some(("sandbox_violation".into(), m)),
            Fail::Load(m) => res.load_error = Some(m),
            Fail::Judge(m) => res.judge_error = Some(m),
            Fail::Timing(flag, detail) => res.failure = Some((flag, detail)),
        }
    }
}

/// Room a block's place is drawn in beyond the largest block, bytes: as much again as the
/// block, at most this, and never less than the job's largest set (see [`arena_bytes`]).
/// 2^20 places of [`PLACE_UNIT`] bytes for any block of 256 MiB or more.
const PLACE_ROOM: u64 = 256 << 20;
/// Granule an arena's size is rounded up to, bytes. An arena is allocated again only when a job
/// needs more, or when it holds more than [`SHRINK_FACTOR`] times what the job needs and over
/// [`SHRINK_ABOVE`] bytes, so a worker holds about what its current jobs need: each judge keeps
/// two arenas, and `vector_add` at 2^26 elements (four tested sets of 768 MiB and a room of one
/// set) comes to about 3.8 GiB, computed, where a power-of-two size with the room doubled held
/// 8 GiB (judge trace of `benchmarks/results/main_job_h100_2026-12-05_judge_arenas_out_of_memory.json`).
const ARENA_GRANULE: u64 = 64 << 20;
/// An arena holding more than this many times a job's need is allocated again at the job's size.
const SHRINK_FACTOR: u64 = 4;
/// Arenas at most this large are never shrunk (reallocating costs more than it frees); they
/// still grow when a job needs more.
const SHRINK_ABOVE: u64 = 1 << 30;

/// Bytes of a job's arena: the largest block of tested sets (the seeds of a shape, at least the
/// two of the cache probes) or the timing sets on `bench_shape`, whichever is larger, plus the
/// room a block's place is drawn in: as much again, at most [`PLACE_ROOM`], and at least the
/// largest set. With that room the places a set of any window can take form one range (set `j`
/// of a block lies in `[j s, j s + room]`, and these meet when `room >= s`), so where a set sits
/// does not tell a test window from a timed one.
///
/// # Errors
/// A shape the task spec cannot lay out.
fn arena_bytes(job: &RunJob, bench_shape: Option<&ShapeCase>) -> Result<u64, JudgeError> {
    let (mut bytes, mut largest_set) = (0u64, 0u64);
    let tested = job.seeds.len().max(2) as u64;
    for s in &job.shapes {
        let set = set_layout(&job.task, &s.sizes)?.1;
        largest_set = largest_set.max(set);
        bytes = bytes.max(tested * set);
    }
    if let (Some(b), Some(shape)) = (&job.bench, bench_shape)
        && let Ok((_, set)) = set_layout(&job.task, &shape.sizes)
    {
        largest_set = largest_set.max(set);
        bytes = bytes.max(set * max_sets(b, set) as u64);
    }
    Ok(CONTROL_BYTES + bytes + bytes.min(PLACE_ROOM).max(largest_set))
}

/// The size to allocate for an arena that must hold `need` bytes and holds `held` now: `None`
/// keeps the one held (it is large enough and not [`SHRINK_FACTOR`] times too large above
/// [`SHRINK_ABOVE`]), else `need` rounded up to [`ARENA_GRANULE`].
fn arena_size(held: u64, need: u64) -> Option<u64> {
    let oversized = held > SHRINK_ABOVE && held > SHRINK_FACTOR.saturating_mul(need);
    (held < need || oversized).then(|| need.div_ceil(ARENA_GRANULE).max(1) * ARENA_GRANULE)
}

/// The failure an [`Reply::Armed`] with a nonzero `rc` stands for: the runner's own (it could not
/// order or poison the window: the judge's side) or the candidate's launch error.
fn armed_fail(rc: i32) -> Fail {
    if runner_failed(rc) {
        Fail::Judge(format!("the runner could not order the window (rc {rc})"))
    } else {
        Fail::Cuda(format!("launch returned cudaError {rc}"))
    }
}

/// The words of a [`Fail`] for a profile pass's status.
fn fail_words(f: Fail) -> String {
    match f {
        Fail::Cuda(e) | Fail::Died(e) | Fail::Violation(e) | Fail::Load(e) | Fail::Judge(e) => e,
        Fail::Timeout => "no answer within the wall-clock limit".into(),
        Fail::Timing(flag, detail) => format!("{flag}: {detail}"),
    }
}

/// The first character boundary of `s` at or after byte `i` (`s.len()` past the end).
fn boundary_at(s: &str, i: usize) -> usize {
    (i..s.len())
        .find(|&j| s.is_char_boundary(j))
        .unwrap_or(s.len())
}

/// Wall-clock limit of each step of a profile pass (`ncu` replays every kernel once per group
/// of counters).
const PROFILE_WALL: Duration = Duration::from_secs(180);

impl From<JudgeError> for Fail {
    fn from(e: JudgeError) -> Fail {
        Fail::Judge(e.to_string())
    }
}

impl From<tch::TchError> for Fail {
    fn from(e: tch::TchError) -> Fail {
        Fail::from(JudgeError::from(e))
    }
}

impl From<cudarc::driver::DriverError> for Fail {
    fn from(e: cudarc::driver::DriverError) -> Fail {
        Fail::from(JudgeError::from(e))
    }
}

fn answer_fail(a: Answer) -> Fail {
    match a {
        Answer::Timeout => Fail::Timeout,
        Answer::Died(m) if m.starts_with("sandbox violation") => Fail::Violation(m),
        Answer::Died(m) => Fail::Died(m),
        Answer::Reply(Reply::InitError { message }) => {
            Fail::Judge(format!("runner cannot start: {message}"))
        }
        Answer::Reply(Reply::LoadError { message }) => Fail::Load(message),
        Answer::Reply(r) => Fail::Died(format!("the runner answered out of turn: {r:?}")),
    }
}

/// One buffer argument: its place in the arena (a view: data then guard) and, for inputs, a
/// pristine copy in the judge's own memory.
struct Buf {
    kind: ArgKind,
    elem: Elem,
    name: String,
    n: i64,
    dims: Vec<i64>,
    whole: Tensor,
    offset: u64,
    pristine: Option<Tensor>,
}

/// One set of buffers of a shape, at a base offset of the arena.
struct Bufs {
    args: Vec<Buf>,
    sizes: Vec<i64>,
    scalars: Vec<(String, f64)>,
}

impl Bufs {
    fn env_tensors(&self, kind: Kind) -> Result<Vec<(String, Tensor)>, JudgeError> {
        self.args
            .iter()
            .filter_map(|b| Some((b, b.pristine.as_ref()?)))
            .map(|(b, p)| {
                Ok((
                    b.name.clone(),
                    p.f_to_kind(kind)
                        .and_then(|t| t.f_reshape(b.dims.as_slice()))?,
                ))
            })
            .collect()
    }

    fn rep(&self) -> Rep {
        Rep {
            buffers: self.args.iter().map(|a| a.offset).collect(),
            sizes: self.sizes.clone(),
            scalars: self.scalars.iter().map(|(_, v)| *v as f32).collect(),
        }
    }

    fn outputs(&self) -> impl Iterator<Item = &Buf> {
        self.args.iter().filter(|a| a.kind == ArgKind::Output)
    }
}

/// One buffer argument (input or output) of a set at arena offset `base`: its index among the
/// task's arguments, its dims and element count for `sizes`, and its byte offset.
struct BufArg<'t> {
    index: usize,
    arg: &'t cudarl_cuda::task::Arg,
    dims: Vec<i64>,
    n: i64,
    offset: u64,
}

/// The buffer arguments of one set at arena offset `base`, in argument order ([`set_layout`]).
fn buffer_args<'t>(
    task: &'t TaskSpec,
    sizes: &BTreeMap<String, i64>,
    base: u64,
) -> Result<Vec<BufArg<'t>>, JudgeError> {
    let (offs, _) = set_layout(task, sizes)?;
    let mut out = Vec::new();
    for (index, arg) in task.args.iter().enumerate() {
        if !matches!(arg.kind, ArgKind::Input | ArgKind::Output) {
            continue;
        }
        let dims = arg
            .shape
            .iter()
            .map(|d| eval_formula(d, sizes))
            .collect::<Result<Vec<i64>, _>>()?;
        out.push(BufArg {
            index,
            arg,
            n: dims.iter().product(),
            dims,
            offset: base + offs[out.len()],
        });
    }
    Ok(out)
}

/// Byte sizes of one set's buffers (data and guard), aligned, for `sizes`.
fn set_layout(
    task: &TaskSpec,
    sizes: &BTreeMap<String, i64>,
) -> Result<(Vec<u64>, u64), JudgeError> {
    let elem = Elem::of(&task.dtype)?;
    let mut offs = Vec::new();
    let mut at = 0u64;
    for a in &task.args {
        if !matches!(a.kind, ArgKind::Input | ArgKind::Output) {
            continue;
        }
        let n: i64 = a
            .shape
            .iter()
            .map(|d| eval_formula(d, sizes))
            .product::<Result<i64, _>>()?;
        offs.push(at);
        at += ((n + GUARD_ELEMS) * elem.size) as u64;
        at = at.div_ceil(ALIGN) * ALIGN;
    }
    Ok((offs, at))
}

fn parse_references(task: &TaskSpec) -> Result<Vec<Expr>, JudgeError> {
    task.args
        .iter()
        .filter(|a| a.kind == ArgKind::Output)
        .map(|a| {
            let src = task
                .reference
                .get(&a.name)
                .ok_or_else(|| JudgeError::Task(format!("no reference for output `{}`", a.name)))?;
            cudarl_cuda::expr::parse(src)
                .map_err(|m| JudgeError::Task(format!("reference `{}`: {m}", a.name)))
        })
        .collect()
}

/// Each output's reference value, (with `with_magnitude`) magnitude, and longest contraction
/// ([`eval::Env::contraction`]).
type References = Vec<(Tensor, Option<Tensor>, i64)>;

fn reference_outputs(
    refs: &[Expr],
    tensors: &[(String, Tensor)],
    scalars: &[(String, f64)],
    with_magnitude: bool,
) -> Result<References, JudgeError> {
    refs.iter()
        .map(|e| {
            let env = eval::Env::new(
                tensors.iter().map(|(n, t)| (n.clone(), t)).collect(),
                scalars.iter().cloned().collect(),
            );
            let (v, m) = eval::eval(e, &env, with_magnitude)?;
            Ok((v, m, env.contraction()))
        })
        .collect()
}

/// The statistics of one output buffer `a` against its float64 reference `r` (magnitudes `m`,
/// the longest contraction `contraction`), as 0-dim float64 tensors on the GPU: unwritten
/// elements (still the poison), non-finite ones, elements outside the tolerance
/// ([`eval::tolerance`]), the largest absolute error and the largest relative error
/// (`|got - r| / max(|r|, 1e-12)`, non-finite elements at 0). One pass of the comparison kernel
/// ([`crate::compare::stats`]) where the build has it; else libtorch ops, in place on one float64
/// copy of the output: at a bench shape each float64 temporary is eight bytes an element, and
/// the caching allocator keeps a judge's peak.
///
/// # Errors
/// The reference's element count differs from the buffer's (a task spec error), or libtorch
/// failed.
fn compare_output(
    task: &TaskSpec,
    a: &Buf,
    r: Tensor,
    m: Tensor,
    contraction: i64,
) -> Result<[Tensor; 5], JudgeError> {
    let e = |r: Result<Tensor, tch::TchError>| r.map_err(JudgeError::from);
    let r = e(r.f_reshape([-1]))?;
    if r.size()[0] != a.n {
        return Err(JudgeError::Task(format!(
            "task spec error: the reference for `{}` has {} elements, the buffer {}",
            a.name,
            r.size()[0],
            a.n
        )));
    }
    let m = e(m.f_reshape([-1]))?;
    let bits = e(a.whole.f_narrow(0, 0, a.n))?;
    crate::compare::output_stats(
        &bits,
        &a.elem,
        (r, m),
        eval::tolerance_terms(task, contraction),
    )
}

/// One drawn input set of the torch baseline: the inputs (named, shaped) and the scalars.
type DrawnSet = (Vec<(String, Tensor)>, Vec<(String, f64)>);

/// How [`Judge::fill`] draws a set's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inputs {
    /// From the test's seed ([`gen_input`]).
    Seed,
    /// A cache probe: the seed's inputs with a share ([`PROBE_SHARE`], at least one element) of
    /// each input redrawn at places drawn from the seed.
    Probe,
}

/// `x` (the `n` elements of input `ai` drawn from `seed`) with a share [`PROBE_SHARE`] of its
/// elements, at least one, replaced by fresh draws of the same distribution.
fn probe_of(
    x: &Tensor,
    n: i64,
    seed: u64,
    ai: usize,
    scale: f64,
    kind: Kind,
    dev: Device,
) -> Result<Tensor, JudgeError> {
    if n == 0 {
        return Ok(x.shallow_clone());
    }
    let other = mix64(seed ^ 0x70f1_5eed_cace_0b5e);
    let fresh = gen_input(n, other, ai, scale, kind, dev)?;
    // gen_input seeded torch's generator from (other, ai): the places come from it too.
    let redraw = Tensor::f_rand([n], (Kind::Float, dev)).and_then(|u| u.f_lt(PROBE_SHARE))?;
    let one = (mix64(other ^ ai as u64) % n.max(1) as u64) as i64;
    let _ = redraw.f_narrow(0, one, 1).and_then(|mut t| t.f_fill_(1))?;
    fresh.f_where_self(&redraw, x).map_err(JudgeError::from)
}

/// The cross-process machinery: two arenas (window words, then buffers) used by turns, and the
/// gate. A job's runner is killed without waiting when the job ends and reaped when its arena's
/// turn comes again, so the driver's teardown of its context (about 0.1-0.2 s on an H200)
/// overlaps the next job instead of delaying it, and nothing a dying runner still runs can
/// touch the arena the next job uses.
struct Ipc {
    arenas: [ArenaSlot; 2],
    /// The arena of the current job.
    cur: usize,
    gate_host: *mut u32,
    gate_dev: sys::CUdeviceptr,
    gate: u32,
    /// Windows numbered (the fallback words' values).
    window: u32,
    /// The current job's runner could not open the window events: windows are ordered by the
    /// words at [`GO_OFFSET`] and [`DONE_OFFSET`] of the arena.
    words: bool,
}

/// One device allocation shared with runners.
#[derive(Default)]
struct ArenaSlot {
    ptr: sys::CUdeviceptr,
    bytes: u64,
    /// `cuIpcGetMemHandle`, hex.
    handle: String,
    /// The runner of the last job on this arena, killed and not reaped yet.
    retired: Option<RunnerProcess>,
    /// The current job's window events (`go`, `done`), fresh for every job.
    events: Option<WindowEvents>,
}

/// The two interprocess events of one job's windows (`CU_EVENT_INTERPROCESS`, no timing): the
/// judge records `go` when a window starts; the runner's stream waits on it, launches, and
/// records `done`, which the judge's stream waits on before its stop event. Destroyed with the
/// job's arena turn, after its runner is reaped.
struct WindowEvents {
    go: sys::CUevent,
    done: sys::CUevent,
    /// `cuIpcGetEventHandle` of each, hex.
    handles: (String, String),
}

impl WindowEvents {
    fn new() -> Result<WindowEvents, JudgeError> {
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
            | sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32;
        // SAFETY: event creation in the current context and handles of the events created.
        unsafe {
            let one = || -> Result<(sys::CUevent, String), JudgeError> {
                let mut e = std::ptr::null_mut();
                cu(
                    sys::cuEventCreate(&mut e, flags),
                    "cuEventCreate(interprocess)",
                )?;
                let mut h: sys::CUipcEventHandle = std::mem::zeroed();
                if let Err(m) = cu(sys::cuIpcGetEventHandle(&mut h, e), "cuIpcGetEventHandle") {
                    sys::cuEventDestroy_v2(e);
                    return Err(m);
                }
                Ok((e, to_hex(&h.reserved.map(|c| c as u8))))
            };
            let (go, hg) = one()?;
            let (done, hd) = match one() {
                Ok(d) => d,
                Err(m) => {
                    sys::cuEventDestroy_v2(go);
                    return Err(m);
                }
            };
            Ok(WindowEvents {
                go,
                done,
                handles: (hg, hd),
            })
        }
    }
}

impl Drop for WindowEvents {
    fn drop(&mut self) {
        // SAFETY: events this judge created; destruction is deferred past pending work.
        unsafe {
            sys::cuEventDestroy_v2(self.go);
            sys::cuEventDestroy_v2(self.done);
        }
    }
}

impl Ipc {
    fn arena(&self) -> &ArenaSlot {
        &self.arenas[self.cur]
    }
}

impl ArenaSlot {
    fn events(&self) -> Result<&WindowEvents, JudgeError> {
        self.events
            .as_ref()
            .ok_or_else(|| JudgeError::Machine("no window events".into()))
    }
}

/// Host time spent in the steps of timing windows, ms: drawing and poisoning the sets, enqueuing
/// the gated window, the runner arming it, the GPU reaching the stop event, the runner's
/// synchronize, and the checks of the outputs.
#[derive(Debug, Default, Clone, Copy)]
struct WindowSteps {
    windows: usize,
    fill: f64,
    enqueue: f64,
    arm: f64,
    run: f64,
    sync: f64,
    check: f64,
}

/// A started runner waiting for its candidate, with the runtime it preloaded.
struct Warm {
    cudart: Option<PathBuf>,
    process: RunnerProcess,
}

/// Runs jobs in one CUDA context (lives in the worker process); see the module docs.
pub struct Judge {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: GpuInfo,
    l2_scratch: Option<Tensor>,
    dev: Device,
    /// Pageable host<->device copy cost (h2d, d2h; ms per byte) measured once in this process
    /// on a [`TRANSFER_PROBE_BYTES`] buffer (see [`Judge::transfer_ms`]).
    transfer_rate: Option<(f64, f64)>,
    transfer_spent_ms: f64,
    ipc: Option<Ipc>,
    warm: Vec<Warm>,
    /// The runtime and the number of runners [`Judge::refill`] keeps started.
    wanted: (Option<PathBuf>, usize),
    rng: rand::rngs::StdRng,
    /// Host time of the timing windows since the last timing run, ms, by step (see
    /// [`WindowSteps`]); traced at the end of each run.
    steps: WindowSteps,
    /// The judge's own stream waits on an event that will never come (the runner faulted in
    /// the middle of a window): the worker must exit after answering.
    pub stuck: bool,
}

impl Judge {
    /// Creates a context on device 0 and uses its legacy default stream (torch's too: inputs,
    /// flushes, events and the gate are ordered on the GPU without host synchronization).
    ///
    /// # Errors
    /// No GPU or driver failure.
    pub fn new() -> Result<Judge, JudgeError> {
        // SAFETY: dlopen probe.
        if !unsafe { sys::is_culib_present() } {
            return Err(JudgeError::Machine(
                "libcuda not found: no GPU driver on this machine".into(),
            ));
        }
        if !tch::Cuda::is_available() {
            return Err(JudgeError::Machine(
                "libtorch sees no CUDA device (CPU-only torch, or libtorch_cuda not linked)".into(),
            ));
        }
        let ctx = CudaContext::new(0)?;
        // SAFETY: the judge synchronizes explicitly; no implicit event tracking on raw pointers.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let info = cudarl_cuda::gpu::info(&ctx).map_err(|e| JudgeError::Machine(e.to_string()))?;
        Ok(Judge {
            ctx,
            stream,
            info,
            l2_scratch: None,
            transfer_rate: None,
            transfer_spent_ms: 0.0,
            dev: Device::Cuda(0),
            ipc: None,
            warm: Vec::new(),
            wanted: (None, 0),
            rng: rand::rngs::StdRng::from_os_rng(),
            steps: WindowSteps::default(),
            stuck: false,
        })
    }

    /// The GPU.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    fn sync(&self) -> Result<(), JudgeError> {
        self.ctx.synchronize().map_err(JudgeError::from)
    }

    /// Turns to the other arena for a new job: reaps the runner of the job that used it last,
    /// makes it hold at least `bytes` (a fresh allocation when it must grow or is far too large,
    /// see [`arena_size`]) and zeroes it
    /// (nothing of an earlier candidate's survives into this job's arena). Returns the
    /// cross-process machinery.
    fn ipc(&mut self, bytes: u64) -> Result<&mut Ipc, JudgeError> {
        self.ctx.bind_to_thread()?;
        if self.ipc.is_none() {
            // SAFETY: driver calls on the current (primary) context with valid out-pointers.
            unsafe {
                let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
                cu(
                    sys::cuMemHostAlloc(&mut p, 64, sys::CU_MEMHOSTALLOC_DEVICEMAP),
                    "cuMemHostAlloc",
                )?;
                let gate_host = p.cast::<u32>();
                std::ptr::write_volatile(gate_host, 0);
                let mut d = 0;
                cu(
                    sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0),
                    "cuMemHostGetDevicePointer",
                )?;
                self.ipc = Some(Ipc {
                    arenas: Default::default(),
                    cur: 0,
                    gate_host,
                    gate_dev: d,
                    gate: 0,
                    window: 0,
                    words: false,
                });
            }
        }
        let ipc = self.ipc.as_mut().expect("created");
        ipc.cur = 1 - ipc.cur;
        let slot = &mut ipc.arenas[ipc.cur];
        // Waits until the process is gone, and with it its context and everything it ran.
        let t = Instant::now();
        drop(slot.retired.take());
        drop(slot.events.take());
        tracing::debug!(reaped_ms = t.elapsed().as_secs_f64() * 1e3, "arena turned");
        // SAFETY: no runner maps this arena any more (reaped above); allocations in the current
        // context; the memset is ordered before the job's fills on the legacy stream.
        unsafe {
            if let Some(want) = arena_size(slot.bytes, bytes) {
                if slot.ptr != 0 {
                    sys::cuMemFree_v2(slot.ptr);
                    *slot = ArenaSlot::default();
                }
                let mut ptr = 0;
                cu(
                    sys::cuMemAlloc_v2(&mut ptr, want as usize),
                    "cuMemAlloc (arena)",
                )?;
                let mut h: sys::CUipcMemHandle = std::mem::zeroed();
                cu(sys::cuIpcGetMemHandle(&mut h, ptr), "cuIpcGetMemHandle")?;
                slot.ptr = ptr;
                slot.bytes = want;
                slot.handle = to_hex(&h.reserved.map(|c| c as u8));
            }
            cu(
                sys::cuMemsetD8Async(slot.ptr, 0, slot.bytes as usize, std::ptr::null_mut()),
                "cuMemsetD8Async (arena)",
            )?;
        }
        slot.events = match WindowEvents::new() {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::warn!(error = %e, "no window events; windows use the fallback words");
                None
            }
        };
        Ok(ipc)
    }

    /// A started runner for `cudart`: one started ahead of time if there is one, else a new one.
    /// Remembers how many the next jobs will want ([`WARM_RUNNERS`], or `upcoming`, the jobs the
    /// caller announced after this one, up to [`MAX_WARM`]) for [`Judge::refill`].
    fn take_runner(
        &mut self,
        cudart: Option<PathBuf>,
        upcoming: usize,
    ) -> Result<RunnerProcess, Fail> {
        self.warm.retain(|w| w.cudart == cudart);
        self.wanted = (cudart.clone(), upcoming.clamp(WARM_RUNNERS, MAX_WARM));
        // The one started first is the most likely to be ready.
        match (!self.warm.is_empty()).then(|| self.warm.remove(0)) {
            Some(w) => Ok(w.process),
            None => RunnerProcess::spawn(true, cudart.as_deref(), &[])
                .map_err(|e| Fail::Judge(format!("start the runner: {e}"))),
        }
    }

    /// Starts runners ahead of time until as many wait as the last job asked for (see
    /// `Judge::take_runner`). The worker calls it after answering a job, so the process
    /// starts overlap the caller's work between jobs; each runner then initializes CUDA on its
    /// own while the next jobs run.
    pub fn refill(&mut self) {
        let (cudart, n) = self.wanted.clone();
        while self.warm.len() < n {
            match RunnerProcess::spawn(true, cudart.as_deref(), &[]) {
                Ok(p) => self.warm.push(Warm {
                    cudart: cudart.clone(),
                    process: p,
                }),
                Err(_) => break,
            }
        }
    }

    /// Takes a started runner (see [`Judge::take_runner`]), waits for it and loads `so` in it.
    fn load(
        &mut self,
        so: &str,
        cudart: Option<PathBuf>,
        bytes: u64,
        upcoming: usize,
    ) -> Result<RunnerProcess, Fail> {
        let mut r = self.take_runner(cudart, upcoming)?;
        tracing::debug!(pid = r.id(), warm = self.warm.len(), "runner taken");
        self.load_in(&mut r, so, bytes)?;
        Ok(r)
    }

    /// Waits for the started runner `r`, then stages `so` in it and loads it on an arena of at
    /// least `bytes`.
    fn load_in(&mut self, r: &mut RunnerProcess, so: &str, bytes: u64) -> Result<(), Fail> {
        match r.recv(Duration::from_secs(120)) {
            Answer::Reply(Reply::Ready { gpu: true, .. }) => {}
            a => return Err(answer_fail(a)),
        }
        let staged = r.dir.path().join("kernel.so");
        std::fs::copy(so, &staged).map_err(|e| Fail::Judge(format!("stage {so}: {e}")))?;
        let ipc = self.ipc(bytes)?;
        let load = Load {
            so: staged,
            arena: Some(cudarl_cuda::runner::Arena {
                handle: ipc.arena().handle.clone(),
                bytes: ipc.arena().bytes,
                go: ipc
                    .arena()
                    .events
                    .as_ref()
                    .map_or_else(String::new, |e| e.handles.0.clone()),
                done: ipc
                    .arena()
                    .events
                    .as_ref()
                    .map_or_else(String::new, |e| e.handles.1.clone()),
            }),
        };
        tracing::debug!("runner ready; arena and load");
        match r.call(&Request::Load(load), Duration::from_secs(60)) {
            Answer::Reply(Reply::Loaded { events }) => {
                tracing::debug!(events, "runner loaded");
                if !events {
                    tracing::warn!(
                        "the runner could not map the window events; windows are ordered by the \
                         arena's fallback words"
                    );
                }
                if let Some(ipc) = self.ipc.as_mut() {
                    ipc.words = !events;
                }
                Ok(())
            }
            a => Err(answer_fail(a)),
        }
    }

    /// A view of the arena as `n` elements of `kind` at byte `offset`.
    fn view(&self, offset: u64, n: i64, kind: Kind) -> Result<Tensor, JudgeError> {
        self.arena_view(offset, &[n], &[1], kind)
    }

    /// A view of the arena at byte `offset` of elements of `kind` with `shape` and `strides`
    /// (in elements); the caller checks that the layout stays inside the arena.
    fn arena_view(
        &self,
        offset: u64,
        shape: &[i64],
        strides: &[i64],
        kind: Kind,
    ) -> Result<Tensor, JudgeError> {
        let ipc = self
            .ipc
            .as_ref()
            .ok_or_else(|| JudgeError::Machine("no arena".into()))?;
        // SAFETY: the arena is a device allocation of `ipc.bytes` in this context, and every
        // layout stays inside it (checked by the caller).
        unsafe {
            Tensor::f_from_blob(
                (ipc.arena().ptr + offset) as *const u8,
                shape,
                strides,
                kind,
                self.dev,
            )
        }
        .map_err(JudgeError::from)
    }

    /// Fills one buffer set at arena offset `base` for `sizes` and `seed`: inputs drawn fresh
    /// (a pristine copy kept in the judge's memory; [`Inputs::Probe`] redraws a share of them),
    /// outputs poisoned, guards filled. Only enqueues GPU work (no host synchronization).
    fn fill(
        &self,
        task: &TaskSpec,
        sizes: &BTreeMap<String, i64>,
        seed: u64,
        base: u64,
        inputs: Inputs,
    ) -> Result<Bufs, JudgeError> {
        let elem = Elem::of(&task.dtype)?;
        let mut args = Vec::new();
        for BufArg {
            index: ai,
            arg: a,
            dims,
            n,
            offset,
        } in buffer_args(task, sizes, base)?
        {
            let whole = self.view(offset, n + GUARD_ELEMS, elem.bits)?;
            let mut data = whole.f_narrow(0, 0, n)?;
            let mut guard = whole.f_narrow(0, n, GUARD_ELEMS)?;
            let _ = guard.f_fill_(elem.guard)?;
            let pristine = if a.kind == ArgKind::Input {
                let scale = task.input_scale(seed);
                let mut x = gen_input(n, seed, ai, scale, elem.float, self.dev)?;
                if inputs == Inputs::Probe {
                    x = probe_of(&x, n, seed, ai, scale, elem.float, self.dev)?;
                }
                data.f_copy_(&x.f_view_dtype(elem.bits)?)?;
                Some(x)
            } else {
                let _ = data.f_fill_(elem.poison)?;
                None
            };
            args.push(Buf {
                kind: a.kind,
                elem,
                name: a.name.clone(),
                n,
                dims,
                whole,
                offset,
                pristine,
            });
        }
        Ok(Bufs {
            args,
            sizes: task.sizes.iter().map(|s| sizes[s]).collect(),
            scalars: scalar_values(task, seed),
        })
    }

    /// A view of the arena as `k` rows of `n` elements of `kind`, row `j` at byte
    /// `offset + j * row_bytes` (the same buffer of `k` consecutive sets).
    fn strided(
        &self,
        offset: u64,
        k: usize,
        n: i64,
        row_bytes: u64,
        elem: &Elem,
        kind: Kind,
    ) -> Result<Tensor, JudgeError> {
        // Rows are whole elements apart (sets are ALIGN-aligned).
        let row_stride = (row_bytes / elem.size as u64) as i64;
        self.arena_view(offset, &[k as i64, n], &[row_stride, 1], kind)
    }

    /// Fills the `k` buffer sets of a timing window (`set_bytes` apart from arena offset
    /// `base`) from one fresh seed drawn by the judge: each input argument drawn for all sets
    /// at once (uniform in `[-s, s)`, `s` the task's input scale), every output poisoned and
    /// every guard filled, a handful of GPU operations whatever `k` is; the sets in `verify`
    /// keep a copy of their inputs for the comparison. Only enqueues GPU work.
    fn fill_sets(
        &mut self,
        task: &TaskSpec,
        sizes: &BTreeMap<String, i64>,
        (k, set_bytes): (usize, u64),
        base: u64,
        verify: &[usize],
    ) -> Result<Vec<Bufs>, JudgeError> {
        let elem = Elem::of(&task.dtype)?;
        let seed: u64 = self.rng.random();
        let mut sets: Vec<Vec<Buf>> = (0..k).map(|_| Vec::new()).collect();
        for BufArg {
            index: ai,
            arg: a,
            dims,
            n,
            offset,
        } in buffer_args(task, sizes, base)?
        {
            let guard_at = offset + (n * elem.size) as u64;
            let _ = self
                .strided(guard_at, k, GUARD_ELEMS, set_bytes, &elem, elem.bits)?
                .f_fill_(elem.guard)?;
            if a.kind == ArgKind::Input {
                tch::manual_seed(mix64(seed ^ mix64(ai as u64 + 1)) as i64);
                let scale = task.input_scale(seed);
                let _ = self
                    .strided(offset, k, n, set_bytes, &elem, elem.float)?
                    .f_uniform_(-scale, scale)?;
            } else {
                let _ = self
                    .strided(offset, k, n, set_bytes, &elem, elem.bits)?
                    .f_fill_(elem.poison)?;
            }
            for (j, set) in sets.iter_mut().enumerate() {
                let at = offset + j as u64 * set_bytes;
                let whole = self.view(at, n + GUARD_ELEMS, elem.bits)?;
                let pristine = if a.kind == ArgKind::Input && verify.contains(&j) {
                    let src = whole
                        .f_narrow(0, 0, n)
                        .and_then(|x| x.f_view_dtype(elem.float))?;
                    let mut x = src.f_empty_like()?;
                    x.f_copy_(&src)?;
                    Some(x)
                } else {
                    None
                };
                set.push(Buf {
                    kind: a.kind,
                    elem,
                    name: a.name.clone(),
                    n,
                    dims: dims.clone(),
                    whole,
                    offset: at,
                    pristine,
                });
            }
        }
        let scalars = scalar_values(task, seed);
        Ok(sets
            .into_iter()
            .map(|args| Bufs {
                args,
                sizes: task.sizes.iter().map(|s| sizes[s]).collect(),
                scalars: scalars.clone(),
            })
            .collect())
    }

    /// Runs one job. A CUDA error on the judge's side is reported in the result; after one, or
    /// with [`Judge::stuck`], the worker exits. `heartbeat` is called before each GPU step;
    /// `exclusive` is called once, between the tests and the timing of a job with
    /// [`RunJob::exclusive_timing`], and returns once the GPU is held alone (`false`: the parent
    /// refused, and the job answers without timing). A job whose runner could not map the window
    /// events says so ([`RunResult::window_words`]).
    pub fn run_with_heartbeat(
        &mut self,
        job: &RunJob,
        heartbeat: &mut dyn FnMut(),
        exclusive: &mut dyn FnMut() -> bool,
    ) -> RunResult {
        if let Some(ipc) = self.ipc.as_mut() {
            // Set again by this job's load.
            ipc.words = false;
        }
        let mut res = self.run_job(job, heartbeat, exclusive);
        res.window_words = self.ipc.as_ref().is_some_and(|i| i.words);
        res
    }

    /// [`Judge::run_with_heartbeat`] without the window-words report.
    fn run_job(
        &mut self,
        job: &RunJob,
        heartbeat: &mut dyn FnMut(),
        exclusive: &mut dyn FnMut() -> bool,
    ) -> RunResult {
        let mut res = RunResult {
            tests: vec![],
            timing: None,
            torch_timing: None,
            cuda_error: None,
            load_error: None,
            judge_error: None,
            gpu: Some(self.info.clone()),
            worker_ms: Some(Default::default()),
            failure: None,
            candidate_output: None,
            profile: None,
            window_words: false,
        };
        let bench_shape = job
            .bench
            .as_ref()
            .map(|b| job.shapes[b.shape_index.min(job.shapes.len().saturating_sub(1))].clone());
        // The torch baseline, timed with the GPU held alone: first, or after the tests once the
        // parent gave the GPU to this job alone (`exclusive_timing`).
        if job.torch_baseline
            && !job.exclusive_timing
            && !self.torch_baseline(job, bench_shape.as_ref(), &mut res, heartbeat)
        {
            return res;
        }
        let Some(so_path) = &job.so_path else {
            return res;
        };
        let Some(mut r) =
            self.load_and_test(job, so_path, bench_shape.as_ref(), &mut res, heartbeat)
        else {
            return res;
        };
        self.time_job(
            &mut r,
            job,
            bench_shape.as_ref(),
            &mut res,
            heartbeat,
            exclusive,
        );
        let profile = job.profile && res.timing.is_some();
        self.retire(r, &mut res);
        if profile && let Some(shape) = &bench_shape {
            heartbeat();
            let t0 = Instant::now();
            res.profile = Some(self.profile(job, so_path, shape));
            if let Some(w) = res.worker_ms.as_mut() {
                w.profile = ms_since(t0);
            }
        }
        res
    }

    /// Times the torch baseline of `job` on `bench_shape` into `res`, with its worker time and
    /// the time spent on transfers (ms); `false` when that failed (`res.judge_error`), `true`
    /// when it did not or the job has no bench.
    fn torch_baseline(
        &mut self,
        job: &RunJob,
        bench_shape: Option<&ShapeCase>,
        res: &mut RunResult,
        heartbeat: &mut dyn FnMut(),
    ) -> bool {
        let (Some(b), Some(shape)) = (&job.bench, bench_shape) else {
            return true;
        };
        heartbeat();
        let t0 = Instant::now();
        self.transfer_spent_ms = 0.0;
        let r = self.time_torch(&job.task, shape, b, heartbeat);
        if let Some(w) = res.worker_ms.as_mut() {
            w.torch = ms_since(t0);
            w.transfer = self.transfer_spent_ms;
        }
        match r {
            Ok(t) => res.torch_timing = Some(t),
            Err(e) => res.judge_error = Some(format!("torch baseline: {e}")),
        }
        res.judge_error.is_none()
    }

    /// Loads `job`'s candidate `so_path` in a runner, on an arena sized for the job's tests and
    /// `bench_shape`, and runs the tests of every shape into `res` until one fails (with the
    /// load and test times, ms); `None` when the arena or the load failed (recorded in `res`).
    fn load_and_test(
        &mut self,
        job: &RunJob,
        so_path: &str,
        bench_shape: Option<&ShapeCase>,
        res: &mut RunResult,
        heartbeat: &mut dyn FnMut(),
    ) -> Option<RunnerProcess> {
        let bytes = match arena_bytes(job, bench_shape) {
            Ok(b) => b,
            Err(e) => {
                res.cuda_error = Some(format!("task spec: {e}"));
                return None;
            }
        };
        let t_load = Instant::now();
        heartbeat();
        tracing::debug!(task = %job.task.id, bytes, bench = job.bench.is_some(), "job: load");
        let cudart = job.cudart.as_ref().map(PathBuf::from);
        let mut r = match self.load(so_path, cudart, bytes, job.upcoming) {
            Ok(r) => r,
            Err(f) => {
                f.record(res);
                return None;
            }
        };
        if let Some(w) = res.worker_ms.as_mut() {
            w.runner = ms_since(t_load);
        }
        let t_tests = Instant::now();
        for shape in &job.shapes {
            heartbeat();
            match self.test_shape(&mut r, &job.task, shape, &job.seeds, job_wall(job)) {
                Ok(t) => res.tests.extend(t),
                Err(f) => {
                    f.record(res);
                    break;
                }
            }
        }
        if let Some(w) = res.worker_ms.as_mut() {
            w.tests = ms_since(t_tests);
        }
        Some(r)
    }

    /// Times `job`'s candidate in runner `r` on `bench_shape` into `res` (with the timing's
    /// worker time, ms) when nothing failed and every test passed, once the GPU is held alone
    /// where the job asks for it ([`Judge::hold_gpu`]).
    fn time_job(
        &mut self,
        r: &mut RunnerProcess,
        job: &RunJob,
        bench_shape: Option<&ShapeCase>,
        res: &mut RunResult,
        heartbeat: &mut dyn FnMut(),
        exclusive: &mut dyn FnMut() -> bool,
    ) {
        let failed = res.cuda_error.is_some()
            || res.judge_error.is_some()
            || res.load_error.is_some()
            || res.failure.is_some();
        if !failed
            && let (Some(b), Some(shape)) = (&job.bench, bench_shape)
            && res.tests.iter().all(|t| t.passed)
            && self.hold_gpu(job, bench_shape, res, heartbeat, exclusive)
        {
            heartbeat();
            let t0 = Instant::now();
            // A timing-only job (batched timing: its tests ran in another worker's runner)
            // loaded the candidate in a runner that never launched it.
            let first_use = res.tests.is_empty();
            let timed = (|| {
                if first_use {
                    self.first_launch(r, &job.task, shape, job_wall(job))?;
                }
                self.time_remote(r, &job.task, shape, b, job_wall(job), heartbeat)
            })();
            match timed {
                Ok(t) => res.timing = Some(t),
                Err(f) => f.record(res),
            }
            if let Some(w) = res.worker_ms.as_mut() {
                w.timing = ms_since(t0);
            }
        }
    }

    /// With [`RunJob::exclusive_timing`], asks the parent for the GPU alone (`exclusive`), then
    /// times the torch baseline ([`Judge::torch_baseline`]) if the job wants one; `false` when
    /// the parent refused or the baseline failed, `true` otherwise.
    fn hold_gpu(
        &mut self,
        job: &RunJob,
        bench_shape: Option<&ShapeCase>,
        res: &mut RunResult,
        heartbeat: &mut dyn FnMut(),
        exclusive: &mut dyn FnMut() -> bool,
    ) -> bool {
        if !job.exclusive_timing {
            return true;
        }
        tracing::debug!("job: tests passed, asking for the GPU alone");
        if !exclusive() {
            return false;
        }
        tracing::debug!("job: GPU held alone");
        !job.torch_baseline || self.torch_baseline(job, bench_shape, res, heartbeat)
    }

    /// Ends the runner `r` of a finished job: asks it to exit, keeps what it printed in `res`,
    /// and kills it without waiting.
    fn retire(&mut self, mut r: RunnerProcess, res: &mut RunResult) {
        drop(r.send(&Request::Exit));
        // Give the runner's output readers a moment, then keep what it printed.
        std::thread::sleep(Duration::from_millis(2));
        let out = r.output();
        if !out.is_empty() {
            res.candidate_output = Some(out);
        }
        // Killed now, reaped when this arena's turn comes again (see [`Ipc`]).
        r.signal_kill();
        match self.ipc.as_mut() {
            Some(ipc) => ipc.arenas[ipc.cur].retired = Some(r),
            None => drop(r),
        }
    }

    /// The profile pass ([`cudarl_cuda::profile`]): `so` loaded in a runner started under `ncu`,
    /// one launch on fresh inputs of `shape` checked like a test, and the counters of its
    /// kernels from the CSV `ncu` wrote where only the judge reads.
    fn profile(&mut self, job: &RunJob, so: &str, shape: &ShapeCase) -> ProfileOutcome {
        let Some(ncu) = Ncu::find() else {
            return ProfileOutcome::without(
                "absent: no ncu on this machine ($CUDARL_NCU, PATH, /usr/local/cuda/bin)",
            );
        };
        let failed = |why: String| ProfileOutcome::without(format!("failed: {why}"));
        let Ok(bytes) = set_layout(&job.task, &shape.sizes).map(|(_, b)| CONTROL_BYTES + b) else {
            return failed("task spec".into());
        };
        let dir = match tempfile::Builder::new().prefix("cudarl-profile-").tempdir() {
            Ok(d) => d,
            Err(e) => return failed(format!("temp dir: {e}")),
        };
        let log = dir.path().join("ncu.csv");
        let cudart = job.cudart.as_ref().map(PathBuf::from);
        let mut r = match RunnerProcess::spawn_profiled(cudart.as_deref(), &ncu, &log, dir.path()) {
            Ok(r) => r,
            Err(e) => return failed(format!("start {}: {e}", ncu.path.display())),
        };
        // Any seed the tests did not use: the inputs are fresh.
        let seed = job
            .seeds
            .iter()
            .fold(0x9e37_79b9_7f4a_7c15u64, |a, s| a ^ s.rotate_left(17));
        let launch = self
            .load_in(&mut r, so, bytes)
            .and_then(|()| self.launch_one(&mut r, &job.task, shape, seed, PROFILE_WALL));
        drop(r.send(&Request::Exit));
        let exited = r.wait_exit(PROFILE_WALL);
        let output = r.output();
        drop(r);
        // What ncu wrote to its log (its errors go there too) and what the runner printed, for
        // a status that says why.
        let tail = || {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            let t = format!("{} {}", log.trim(), output.trim());
            let t = t.trim();
            format!(" ({})", &t[boundary_at(t, t.len().saturating_sub(600))..])
        };
        match launch {
            Ok(t) if t.passed => {}
            Ok(t) => {
                let why = t.message.unwrap_or_default();
                return failed(format!("the profiled launch failed its check: {why}"));
            }
            Err(f) => return failed(fail_words(f) + &tail()),
        }
        if !exited {
            return failed("ncu did not exit".to_string() + &tail());
        }
        let text = match std::fs::read_to_string(&log) {
            Ok(t) => t,
            Err(e) => return failed(format!("no ncu log: {e}{}", tail())),
        };
        match parse_raw_csv(&text) {
            Ok(m) => ProfileOutcome {
                status: "measured (ncu)".into(),
                metrics: Some(m),
            },
            Err(e) => {
                let head = &text[..boundary_at(&text, 400)];
                failed(format!("{e}; the log begins: {head}"))
            }
        }
    }

    /// One (shape, seed) launch through [`Request::Launch`], checked like a test: the profile
    /// pass's (a runner under `ncu`, no window events).
    fn launch_one(
        &mut self,
        r: &mut RunnerProcess,
        task: &TaskSpec,
        shape: &ShapeCase,
        seed: u64,
        wall: Duration,
    ) -> Result<TestResult, Fail> {
        let b = self.fill(task, &shape.sizes, seed, CONTROL_BYTES, Inputs::Seed)?;
        // The runner's context sees the inputs once the judge's stream is done with them.
        self.sync()?;
        match r.call(
            &Request::Launch(Run {
                window: 0,
                reps: vec![b.rep()],
                poison: None,
            }),
            wall,
        ) {
            Answer::Reply(Reply::Launched { error: Some(e), .. }) => return Err(Fail::Cuda(e)),
            Answer::Reply(Reply::Launched { rc, .. }) if rc != 0 => {
                return Err(Fail::Cuda(format!("launch returned cudaError {rc}")));
            }
            Answer::Reply(Reply::Launched { .. }) => {}
            a => return Err(answer_fail(a)),
        }
        Ok(self.check_sets(task, &[(&b, seed)], shape)?.remove(0))
    }

    /// One test window of one fresh set on `shape` in a runner that never launched the candidate,
    /// checked like a test: the candidate's module and the runtime's first-use work (which may
    /// synchronize the context) happen here, where no gate holds the judge's stream. In a timed
    /// window the runner's first launch would wait for that work behind the gate until
    /// [`ARM_WAIT`] let the window start: 123 of 256 batched timing jobs on an H100
    /// (`benchmarks/results/harness_cost_bench_validate_h100_2026-12-06.json`). A wrong result is
    /// `timed_output_mismatch`, as in a timed window.
    fn first_launch(
        &mut self,
        r: &mut RunnerProcess,
        task: &TaskSpec,
        shape: &ShapeCase,
        wall: Duration,
    ) -> Result<(), Fail> {
        let seed = self.rng.random();
        let t = self
            .test_sets(r, task, shape, (&[seed], 1), wall)?
            .2
            .remove(0);
        if t.passed {
            return Ok(());
        }
        Err(Fail::Timing(
            "timed_output_mismatch".into(),
            format!(
                "the first launch of the timing run (fresh inputs) gave wrong outputs: {}",
                t.message.unwrap_or_default()
            ),
        ))
    }

    /// One test window of a set per seed of `seeds` on `shape`, at a drawn place of the arena
    /// with room for `room` sets, every set checked ([`Judge::check_sets`]); returns the place,
    /// the bytes of one set and the results in seed order.
    fn test_sets(
        &mut self,
        r: &mut RunnerProcess,
        task: &TaskSpec,
        shape: &ShapeCase,
        (seeds, room): (&[u64], usize),
        wall: Duration,
    ) -> Result<(u64, u64, Vec<TestResult>), Fail> {
        let mut lap = Lap::new();
        let (_, set_bytes) = set_layout(task, &shape.sizes)?;
        let base = self.place(room, set_bytes)?;
        let sets = seeds
            .iter()
            .enumerate()
            .map(|(j, &seed)| {
                self.fill(
                    task,
                    &shape.sizes,
                    seed,
                    base + j as u64 * set_bytes,
                    Inputs::Seed,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let fill = lap.ms();
        self.test_window(r, &sets, wall)?;
        let window = lap.ms();
        let with: Vec<(&Bufs, u64)> = sets.iter().zip(seeds.iter().copied()).collect();
        let checked = self.check_sets(task, &with, shape)?;
        tracing::debug!(
            sets = seeds.len(),
            set_bytes,
            fill,
            window,
            check = lap.ms(),
            "tests: window"
        );
        Ok((base, set_bytes, checked))
    }

    /// The tests of one shape (see the module docs): a block of one set per seed at a drawn
    /// place of the arena, called in a drawn order in one window; then the cache probes, a
    /// block of two sets at the same place: the first seed's inputs with a share
    /// ([`PROBE_SHARE`]) of their elements redrawn, at the first seed's pointer (a result cached
    /// by pointer or by a cheap fingerprint of the inputs is wrong), and the first seed's inputs
    /// unchanged at a new pointer. Every set is checked like a test.
    fn test_shape(
        &mut self,
        r: &mut RunnerProcess,
        task: &TaskSpec,
        shape: &ShapeCase,
        seeds: &[u64],
        wall: Duration,
    ) -> Result<Vec<TestResult>, Fail> {
        let Some(&first) = seeds.first() else {
            return Ok(Vec::new());
        };
        // Room for the two probes at the same place.
        let (base, set_bytes, mut out) =
            self.test_sets(r, task, shape, (seeds, seeds.len().max(2)), wall)?;
        let mut lap = Lap::new();
        let probes = [
            self.fill(task, &shape.sizes, first, base, Inputs::Probe)?,
            self.fill(task, &shape.sizes, first, base + set_bytes, Inputs::Seed)?,
        ];
        let fill = lap.ms();
        self.test_window(r, &probes, wall)?;
        let window = lap.ms();
        let checked = self.check_sets(task, &[(&probes[0], first), (&probes[1], first)], shape)?;
        tracing::debug!(
            set_bytes,
            fill,
            window,
            check = lap.ms(),
            "tests: probe window"
        );
        let how = [
            "inputs equal to an earlier test's but for a few elements, at that test's pointer",
            "an earlier test's inputs at a new pointer",
        ];
        for (mut t, how) in checked.into_iter().zip(how) {
            t.message = t.message.map(|m| format!("{m} ({how})"));
            out.push(t);
        }
        Ok(out)
    }

    /// One test window: the judge records `go` on its stream after the sets' fills (no gate: the
    /// time of a test window is not kept), the runner poisons shared memory with a drawn
    /// pattern, waits on `go`, calls the candidate on `sets` in a drawn order and records `done`
    /// exactly as in a timed window; then the runner synchronizes its whole context.
    fn test_window(
        &mut self,
        r: &mut RunnerProcess,
        sets: &[Bufs],
        wall: Duration,
    ) -> Result<(), Fail> {
        let run = self.next_run(sets)?;
        self.signal_go(run.window)?;
        match r.call(&Request::Run(run), wall) {
            Answer::Reply(Reply::Armed { rc }) if rc != 0 => return Err(armed_fail(rc)),
            Answer::Reply(Reply::Armed { .. }) => {}
            a => return Err(answer_fail(a)),
        }
        match r.call(&Request::Sync, wall) {
            Answer::Reply(Reply::Synced { error: None }) => Ok(()),
            Answer::Reply(Reply::Synced { error: Some(e) }) => Err(Fail::Cuda(e)),
            a => Err(answer_fail(a)),
        }
    }

    /// A drawn place for a block of `k` sets `set_bytes` apart in the current arena: a byte
    /// offset past [`CONTROL_BYTES`], a multiple of [`PLACE_UNIT`], uniform over the places
    /// where the block fits.
    fn place(&mut self, k: usize, set_bytes: u64) -> Result<u64, JudgeError> {
        let cap = self
            .ipc
            .as_ref()
            .ok_or_else(|| JudgeError::Machine("no arena".into()))?
            .arena()
            .bytes;
        let need = CONTROL_BYTES + k as u64 * set_bytes;
        if need > cap {
            return Err(JudgeError::Task(format!(
                "a block of {need} bytes in an arena of {cap}"
            )));
        }
        Ok(CONTROL_BYTES + self.rng.random_range(0..=(cap - need) / PLACE_UNIT) * PLACE_UNIT)
    }

    /// The next window's request for `sets`: the next window number, the sets in a drawn order
    /// and a drawn poison pattern. Tests and timed windows both take theirs from here, so they
    /// are drawn alike.
    fn next_run(&mut self, sets: &[Bufs]) -> Result<Run, Fail> {
        let ipc = self
            .ipc
            .as_mut()
            .ok_or_else(|| Fail::Judge("no arena".into()))?;
        ipc.window = ipc.window.wrapping_add(1);
        let window = ipc.window;
        let order = self.order(sets.len());
        Ok(Run {
            window,
            reps: order.iter().map(|&j| sets[j].rep()).collect(),
            poison: Some(self.rng.random()),
        })
    }

    /// A drawn order of `k` calls.
    fn order(&mut self, k: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..k).collect();
        v.shuffle(&mut self.rng);
        v
    }

    /// Guards, input mutation, unwritten and non-finite outputs and the reference for each of
    /// `sets` (a set of `shape` and the seed its inputs were drawn from; their pristine inputs
    /// are in the judge's memory), reduced on the GPU and read back with one copy.
    fn check_sets(
        &self,
        task: &TaskSpec,
        sets: &[(&Bufs, u64)],
        shape: &ShapeCase,
    ) -> Result<Vec<TestResult>, JudgeError> {
        let e = |r: Result<Tensor, tch::TchError>| r.map_err(JudgeError::from);
        let refs = parse_references(task)?;
        let mut stats: Vec<Tensor> = Vec::new();
        for (b, _) in sets {
            for a in &b.args {
                let guard = e(a.whole.f_narrow(0, a.n, GUARD_ELEMS))?;
                stats.push(e(e(guard.f_ne(a.elem.guard))?.f_any())?.f_to_kind(Kind::Double)?);
                if let Some(p) = &a.pristine {
                    let now = e(a.whole.f_narrow(0, 0, a.n))?;
                    let orig = e(p.f_view_dtype(a.elem.bits))?;
                    stats.push(e(
                        e(e(now.f_ne_tensor(&orig))?.f_any())?.f_to_kind(Kind::Double)
                    )?);
                }
            }
            let env = b.env_tensors(Kind::Double)?;
            let want = reference_outputs(&refs, &env, &b.scalars, true)?;
            // The float64 inputs are not read again (a reference may still share one, as a
            // view); [`compare_output`] works in place.
            drop(env);
            for (a, (r, m, contraction)) in b.outputs().zip(want) {
                let m = m.ok_or_else(|| JudgeError::Machine("no magnitude".into()))?;
                stats.extend(compare_output(task, a, r, m, contraction)?);
            }
        }
        let flat: Vec<f64> =
            Vec::<f64>::try_from(e(e(Tensor::f_stack(&stats, 0))?.f_to_device(Device::Cpu))?)?;
        let mut it = flat.into_iter();
        let mut out = Vec::new();
        for (b, seed) in sets {
            let mut t = TestResult {
                split: shape.split.clone(),
                sizes: shape.sizes.clone(),
                seed: *seed,
                passed: false,
                max_abs_err: 0.0,
                max_rel_err: 0.0,
                unwritten: 0,
                non_finite: 0,
                input_mutated: false,
                out_of_bounds_write: false,
                message: None,
            };
            let mut bad = 0u64;
            for a in &b.args {
                if it.next().unwrap_or(0.0) != 0.0 {
                    t.out_of_bounds_write = true;
                }
                if a.pristine.is_some() && it.next().unwrap_or(0.0) != 0.0 {
                    t.input_mutated = true;
                }
            }
            for _ in b.outputs() {
                t.unwritten += it.next().unwrap_or(0.0) as u64;
                t.non_finite += it.next().unwrap_or(0.0) as u64;
                bad += it.next().unwrap_or(0.0) as u64;
                t.max_abs_err = t.max_abs_err.max(it.next().unwrap_or(0.0));
                t.max_rel_err = t.max_rel_err.max(it.next().unwrap_or(0.0));
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
            out.push(t);
        }
        Ok(out)
    }

    fn ensure_scratch(&mut self, b: &BenchSpec) -> Result<(), JudgeError> {
        if b.flush_l2 && self.l2_scratch.is_none() {
            let n = (self.info.l2_bytes.max(1 << 20) as i64) * 2 / 4; // int32 elements
            self.l2_scratch = Some(Tensor::f_zeros([n], (Kind::Int, self.dev))?);
        }
        Ok(())
    }

    /// Evicts L2 by reading twice its size (a read, not a memset: a memset would leave dirty
    /// lines whose write-back the timed kernel would pay for).
    fn flush(&self) -> Result<(), JudgeError> {
        if let Some(s) = &self.l2_scratch {
            let _ = s.f_sum(Kind::Int64)?;
        }
        Ok(())
    }

    fn event(&self) -> Result<CudaEvent, JudgeError> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(JudgeError::from)
    }

    /// Times the candidate in `r` on `shape` (see the module docs).
    fn time_remote(
        &mut self,
        r: &mut RunnerProcess,
        task: &TaskSpec,
        shape: &ShapeCase,
        b: &BenchSpec,
        wall: Duration,
        heartbeat: &mut dyn FnMut(),
    ) -> Result<Timing, Fail> {
        self.ensure_scratch(b)?;
        let (_, set_bytes) = set_layout(task, &shape.sizes)?;
        let (start, stop, after) = (self.event()?, self.event()?, self.event()?);
        // The tests (or `first_launch`) ran in this runner: the candidate's module and the
        // runtime's first-use work (which may synchronize the context) happened there, not
        // behind a gate.
        let events = (&start, &stop, &after);
        // The window's fixed cost: empty windows (no launch) in the same runner. Nothing of the
        // candidate's runs meanwhile: its code runs only inside its launches (the object checks
        // reject constructors and thread, signal and callback symbols), and the runner
        // synchronized its context after the last one.
        let mut empty = Vec::new();
        for _ in 0..CALIBRATION_WINDOWS {
            heartbeat();
            let w = self.window(r, task, shape, (0, set_bytes), events, wall)?;
            empty.push(w.ms);
        }
        // The least: other contexts on the GPU (runners starting or ending) only lengthen a
        // window, and an overestimate would shorten every sample (0.29 ms on an H200; one of
        // three windows at 0.46 ms made an elementwise kernel beat its roofline,
        // `benchmarks/results/judge_calibration_h200_2026-11-26.json`).
        let overhead = empty.iter().copied().fold(f64::INFINITY, f64::min);
        tracing::debug!(?empty, "calibration");
        // Warm-up with one set, which also estimates a launch. Warm-up windows are checked like
        // every other.
        heartbeat();
        let w = self.window(r, task, shape, (1, set_bytes), events, wall)?;
        let mut late = w.late;
        let est = (w.ms - overhead).max(1e-3);
        tracing::debug!(window = w.ms, est, "warm-up");
        let k = ((b.window_ms / est).ceil() as usize).clamp(1, max_sets(b, set_bytes));
        for _ in 0..b.warmup.saturating_sub(1).min(2) {
            heartbeat();
            late |= self
                .window(r, task, shape, (k, set_bytes), events, wall)?
                .late;
        }
        let mut verified = 0;
        let (times, synced) = sample_windows(b, k, heartbeat, || {
            let w = self.window(r, task, shape, (k, set_bytes), events, wall)?;
            late |= w.late;
            verified += w.verified;
            Ok::<_, Fail>((
                ((w.ms - overhead) / k as f64).max(0.0),
                ((w.synced_ms - overhead) / k as f64).max(0.0),
            ))
        })?;
        let mut t = stats((times, synced), late, (0.0, 0.0), shape);
        t.sets = k;
        t.windows = t.reps;
        t.reps *= k;
        t.overhead_ms = overhead;
        t.verified_sets = verified;
        tracing::debug!(steps = ?std::mem::take(&mut self.steps), "timing: window steps");
        Ok(t)
    }

    /// One gated window of `k` launches on sets `set_bytes` apart in a block at a drawn place,
    /// called in a drawn order (`k` = 0: an empty calibration window). Every window's outputs
    /// are checked for poison left and for writes before the start, and up to [`VERIFY_SETS`]
    /// sets, drawn by the judge, are compared with the reference ([`Judge::check_window`]).
    /// Returns its time and synchronized time, and whether sampled outputs changed after the
    /// stop event (work the candidate left running: `work_after_stop`). The sampled chunks
    /// ([`Samples`]) are copied right after the stop event on the judge's stream and compared
    /// with the same chunks once the runner has synchronized its whole context: a comparison
    /// of contents, not of clocks, so a host thread delayed by other load never looks like
    /// hidden work.
    ///
    /// The judge's stream: `[wait gate >= a] [L2 flush] [samples] [start] [record go]
    /// [wait gate >= b]`, then, once the runner has enqueued `[poison] [wait go] [k launches]
    /// [record done]` and answered, `[wait done] [stop] [samples]`, and the gate opens to `b`.
    /// The gate is a host word of the judge's (mapped into no other process).
    fn window(
        &mut self,
        r: &mut RunnerProcess,
        task: &TaskSpec,
        shape: &ShapeCase,
        (k, set_bytes): (usize, u64),
        (start, stop, after): (&CudaEvent, &CudaEvent, &CudaEvent),
        wall: Duration,
    ) -> Result<Window, Fail> {
        let gate = self.next_gate()?;
        let arena = self.ipc.as_ref().map_or(0, |i| i.arena().ptr);
        // Fresh inputs for every set, drawn before the gate (libtorch may synchronize in places
        // and must never wait on the held stream); the sets to compare keep their pristine
        // inputs. Sampled chunks of every output are copied aside after the gate, just before
        // `start`: they must still hold the poison then.
        let mut lap = Lap::new();
        let verify = {
            let mut all = self.order(k);
            all.truncate(VERIFY_SETS);
            all
        };
        let sets = if k > 0 {
            let base = self.place(k, set_bytes)?;
            self.fill_sets(task, &shape.sizes, (k, set_bytes), base, &verify)?
        } else {
            Vec::new()
        };
        let run = self.next_run(&sets)?;
        let w = run.window;
        let samples = Samples::draw(&mut self.rng, &sets, arena, self.dev)?;
        // The L2 flush behind the gate allocates (libtorch's reduction): once here first, so
        // the same request behind the gate finds its blocks cached. An allocation that missed
        // the cache could make the allocator free cached blocks, and a free waits for the whole
        // device, the held stream included: the judge would wait for itself.
        self.flush()?;
        self.steps.fill += lap.ms();
        if let Err(e) = self.enqueue_window(&gate, &samples, start, w) {
            gate.release(gate.b);
            return Err(Fail::from(e));
        }
        self.steps.enqueue += lap.ms();
        tracing::debug!(w, k, "window: enqueued, asking the runner");
        self.arm_window(r, run, &gate, &samples, stop, wall)?;
        self.steps.arm += lap.ms();
        self.wait_for_stop(r, w, stop, wall)?;
        self.steps.run += lap.ms();
        tracing::debug!(w, "window: stop reached");
        let mut win = self.sync_window(r, (start, stop, after), wall)?;
        self.steps.sync += lap.ms();
        self.steps.windows += 1;
        if k == 0 {
            return Ok(win);
        }
        samples.copy(2).map_err(Fail::from)?;
        (win.late, win.verified) =
            self.check_window(task, shape, (&sets, &verify), &samples, set_bytes)?;
        self.steps.check += lap.ms();
        Ok(win)
    }

    /// The gate of the next window: the judge's gate value advanced by 2, the window's stream
    /// waiting for the value before it (`a`) and then for the new one (`b`).
    fn next_gate(&mut self) -> Result<Gate, Fail> {
        let ipc = self
            .ipc
            .as_mut()
            .ok_or_else(|| Fail::Judge("no arena".into()))?;
        ipc.gate = ipc.gate.wrapping_add(2);
        Ok(Gate {
            dev: ipc.gate_dev,
            host: ipc.gate_host,
            a: ipc.gate.wrapping_sub(1),
            b: ipc.gate,
        })
    }

    /// Enqueues the judge's side of window `w` up to the gate it is held at: `[wait gate >= a]
    /// [L2 flush] [samples] [start] [record go] [wait gate >= b]`.
    fn enqueue_window(
        &self,
        gate: &Gate,
        samples: &Samples,
        start: &CudaEvent,
        w: u32,
    ) -> Result<(), JudgeError> {
        let null: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the gate is device-mapped host memory of this context; legacy stream.
        unsafe {
            cu(
                sys::cuStreamWaitValue32_v2(null, gate.dev, gate.a, 0 /* GEQ */),
                "cuStreamWaitValue32",
            )?
        };
        self.flush()?;
        samples.copy(0)?;
        start.record(&self.stream)?;
        self.signal_go(w)?;
        // SAFETY: the gate word, on the legacy stream.
        unsafe {
            cu(
                sys::cuStreamWaitValue32_v2(null, gate.dev, gate.b, 0 /* GEQ */),
                "cuStreamWaitValue32",
            )?;
        }
        Ok(())
    }

    /// Sends the window `run` to the runner and waits until it armed it, then enqueues `[wait
    /// done] [stop] [samples]`; the gate opens to `b` in every case (to `a` first when the runner
    /// does not answer within [`ARM_WAIT`]).
    fn arm_window(
        &self,
        r: &mut RunnerProcess,
        run: Run,
        gate: &Gate,
        samples: &Samples,
        stop: &CudaEvent,
        wall: Duration,
    ) -> Result<(), Fail> {
        let w = run.window;
        if r.send(&Request::Run(run)).is_err() {
            gate.release(gate.b);
            return Err(answer_fail(r.recv(Duration::from_secs(1))));
        }
        // A launcher that waits on its own stream (it is held behind `go`) would wait for good:
        // after a short while the window starts anyway, and that window counts the launcher's
        // host time.
        let answer = match r.try_recv(ARM_WAIT) {
            Some(x) => x,
            None => {
                gate.release(gate.a);
                r.recv(wall)
            }
        };
        tracing::debug!(?answer, "window: runner answered");
        match answer {
            Answer::Reply(Reply::Armed { rc }) if rc != 0 => {
                gate.release(gate.b);
                Err(armed_fail(rc))
            }
            Answer::Reply(Reply::Armed { .. }) => {
                let closed = (|| -> Result<(), JudgeError> {
                    // The runner recorded `done` before it answered: the wait is on that record.
                    self.wait_done(w)?;
                    stop.record(&self.stream)?;
                    samples.copy(1)
                })();
                gate.release(gate.b);
                closed.map_err(Fail::from)
            }
            x => {
                gate.release(gate.b);
                Err(answer_fail(x))
            }
        }
    }

    /// Once a window's stop is reached: the runner synchronizes its whole context, then the
    /// judge records `after`; the window's time (start to stop) and synchronized time (start to
    /// after), ms.
    fn sync_window(
        &self,
        r: &mut RunnerProcess,
        (start, stop, after): (&CudaEvent, &CudaEvent, &CudaEvent),
        wall: Duration,
    ) -> Result<Window, Fail> {
        // Everything the candidate started, on any stream, is finished before the checks.
        match r.call(&Request::Sync, wall) {
            Answer::Reply(Reply::Synced { error: None }) => {}
            Answer::Reply(Reply::Synced { error: Some(e) }) => return Err(Fail::Cuda(e)),
            x => return Err(answer_fail(x)),
        }
        after.record(&self.stream)?;
        after.synchronize()?;
        let t = start.elapsed_ms(stop)? as f64;
        let s = start.elapsed_ms(after)? as f64;
        Ok(Window {
            ms: t,
            synced_ms: s,
            late: false,
            verified: 0,
        })
    }

    /// Waits until the GPU reached `stop` of window `w`, with a deadline: a candidate that
    /// faults or hangs never records `done`, and the judge's stream would wait for good. Past
    /// `wall` the runner is asked for its error, killed, and the stream let past the window
    /// ([`Judge::unblock`]).
    fn wait_for_stop(
        &mut self,
        r: &mut RunnerProcess,
        w: u32,
        stop: &CudaEvent,
        wall: Duration,
    ) -> Result<(), Fail> {
        let t0 = Instant::now();
        loop {
            match stop.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(Fail::from(JudgeError::from(e))),
            }
            if t0.elapsed() > wall {
                let f = match r.call(&Request::Sync, Duration::from_secs(5)) {
                    Answer::Reply(Reply::Synced { error: Some(e) }) => Fail::Cuda(e),
                    _ => Fail::Timeout,
                };
                r.kill();
                self.unblock(w, stop);
                return Err(f);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// The checks of a window of `sets` once the runner synchronized: with one host
    /// synchronization, the sampled chunks still held the poison at the start
    /// (`work_before_start`) and no output element still holds it (`timed_output_mismatch`);
    /// then the sets in `verify` against the reference. Returns (sampled outputs changed after
    /// the stop, sets compared with the reference).
    fn check_window(
        &mut self,
        task: &TaskSpec,
        shape: &ShapeCase,
        (sets, verify): (&[Bufs], &[usize]),
        samples: &Samples,
        set_bytes: u64,
    ) -> Result<(bool, usize), Fail> {
        let k = sets.len();
        let elem = Elem::of(&task.dtype).map_err(Fail::from)?;
        let snap = |i: i64| {
            samples
                .snaps
                .f_select(0, i)
                .and_then(|x| x.f_view_dtype(elem.bits))
        };
        let mut counts = vec![
            snap(0)
                .and_then(|x| x.f_ne(elem.poison))
                .and_then(|x| x.f_sum(Kind::Int64))?,
            snap(1)
                .and_then(|x| x.f_ne_tensor(&snap(2)?))
                .and_then(|x| x.f_sum(Kind::Int64))?,
        ];
        // The sets are `set_bytes` apart from the block's first, whatever order they ran in.
        for o in sets[0].outputs() {
            counts.push(
                self.strided(o.offset, k, o.n, set_bytes, &elem, elem.bits)?
                    .f_eq(elem.poison)
                    .and_then(|x| x.f_sum(Kind::Int64))?,
            );
        }
        let counts =
            Vec::<i64>::try_from(Tensor::f_stack(&counts, 0).and_then(|x| x.f_to(Device::Cpu))?)?;
        if counts[0] > 0 {
            return Err(Fail::Timing(
                "work_before_start".into(),
                "outputs of a timed launch were written before the timing window started".into(),
            ));
        }
        let late = counts[1] > 0;
        let left: i64 = counts[2..].iter().sum();
        if left > 0 {
            return Err(Fail::Timing(
                "timed_output_mismatch".into(),
                format!("the timed launches left {left} output elements unwritten"),
            ));
        }
        let with: Vec<(&Bufs, u64)> = verify.iter().map(|&j| (&sets[j], 0)).collect();
        for tr in self.check_sets(task, &with, shape)? {
            if !tr.passed {
                return Err(Fail::Timing(
                    "timed_output_mismatch".into(),
                    format!(
                        "a timed launch (fresh inputs) gave wrong outputs: {}",
                        tr.message.unwrap_or_default()
                    ),
                ));
            }
        }
        Ok((late, with.len()))
    }

    /// Enqueues the start of window `w` for the runner on the legacy stream (see
    /// [`Judge::signal`]).
    fn signal_go(&self, w: u32) -> Result<(), JudgeError> {
        self.signal(std::ptr::null_mut(), false, w)
    }

    /// Enqueues on `stream` a record of the `go` event (`done`: of the `done` event), or, in the
    /// fallback words, the write of `w` to that word.
    fn signal(&self, stream: sys::CUstream, done: bool, w: u32) -> Result<(), JudgeError> {
        let ipc = self
            .ipc
            .as_ref()
            .ok_or_else(|| JudgeError::Machine("no arena".into()))?;
        // SAFETY: an event of this context, or a word of its arena, on a stream of this context.
        unsafe {
            if ipc.words {
                let at = ipc.arena().ptr + if done { DONE_OFFSET } else { GO_OFFSET };
                cu(
                    sys::cuStreamWriteValue32_v2(stream, at, w, 0),
                    "cuStreamWriteValue32",
                )
            } else {
                let ev = ipc.arena().events()?;
                cu(
                    sys::cuEventRecord(if done { ev.done } else { ev.go }, stream),
                    "cuEventRecord",
                )
            }
        }
    }

    /// Enqueues the legacy stream's wait for the runner's end of window `w`: on the `done`
    /// event (recorded by the runner before it answered), or on `done >= w` in the fallback
    /// words.
    fn wait_done(&self, w: u32) -> Result<(), JudgeError> {
        let ipc = self
            .ipc
            .as_ref()
            .ok_or_else(|| JudgeError::Machine("no arena".into()))?;
        let null: sys::CUstream = std::ptr::null_mut();
        // SAFETY: an event of this context, or a word of its arena, on the legacy stream.
        unsafe {
            if ipc.words {
                let done = ipc.arena().ptr + DONE_OFFSET;
                cu(
                    sys::cuStreamWaitValue32_v2(null, done, w, 0 /* GEQ */),
                    "cuStreamWaitValue32(done)",
                )
            } else {
                let done = ipc.arena().events()?.done;
                cu(
                    sys::cuStreamWaitEvent(null, done, 0),
                    "cuStreamWaitEvent(done)",
                )
            }
        }
    }

    /// Lets the judge's stream past window `w`, which the runner will never finish (it died,
    /// hung or faulted after recording `done`): records `done` (or writes `done := w`) itself
    /// on a stream of its own that the legacy stream does not wait for, then waits for `stop`.
    /// If the stream does not move on, the judge is [`Judge::stuck`] (its worker exits after
    /// answering).
    fn unblock(&mut self, w: u32, stop: &CudaEvent) {
        let ok = (|| -> Result<(), JudgeError> {
            let s = self.ctx.new_stream()?;
            self.signal(s.cu_stream(), true, w)?;
            s.synchronize()?;
            let t0 = Instant::now();
            while !stop.try_is_complete()? {
                if t0.elapsed() > Duration::from_secs(10) {
                    return Err(JudgeError::Machine(
                        "the judge's stream did not resume".into(),
                    ));
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            Ok(())
        })();
        if ok.is_err() {
            self.stuck = true;
        }
    }

    /// Host<->device copy times of buffers of `bytes` in all (pageable host memory), ms: (h2d,
    /// d2h), from the copy rate this process measured once on a [`TRANSFER_PROBE_BYTES`] buffer
    /// (a fresh pageable host allocation each way, as a caller's `tensor.cpu()` and back would
    /// do). Sets `transfer_spent_ms` (0 once the rate is known).
    fn transfer_ms(&mut self, bytes: u64) -> Result<(f64, f64), JudgeError> {
        self.transfer_spent_ms = 0.0;
        let (h2d, d2h) = match self.transfer_rate {
            Some(r) => r,
            None => {
                let spent = Instant::now();
                let probe =
                    Tensor::f_zeros([TRANSFER_PROBE_BYTES as i64], (Kind::Uint8, self.dev))?;
                self.sync()?;
                let t0 = Instant::now();
                let host = probe.f_to_device(Device::Cpu)?;
                let d2h = t0.elapsed().as_secs_f64() * 1e3;
                let t1 = Instant::now();
                let _back = host.f_to_device(self.dev)?;
                self.sync()?;
                let h2d = t1.elapsed().as_secs_f64() * 1e3;
                let r = (
                    h2d / TRANSFER_PROBE_BYTES as f64,
                    d2h / TRANSFER_PROBE_BYTES as f64,
                );
                self.transfer_rate = Some(r);
                self.transfer_spent_ms = spent.elapsed().as_secs_f64() * 1e3;
                r
            }
        };
        Ok((h2d * bytes as f64, d2h * bytes as f64))
    }

    /// Times the task's reference evaluated by libtorch in the task's dtype (torch's own
    /// kernels: the `speedup_vs_torch` baseline) the way candidates are timed: windows of `k`
    /// evaluations on `k` freshly drawn sets after an L2 flush, in the judge's own context (no
    /// window cost to subtract).
    fn time_torch(
        &mut self,
        task: &TaskSpec,
        shape: &ShapeCase,
        b: &BenchSpec,
        heartbeat: &mut dyn FnMut(),
    ) -> Result<Timing, JudgeError> {
        self.ensure_scratch(b)?;
        let elem = Elem::of(&task.dtype)?;
        let refs = parse_references(task)?;
        let (_, set_bytes) = set_layout(task, &shape.sizes)?;
        let draw = |me: &mut Judge| -> Result<DrawnSet, JudgeError> {
            let seed: u64 = me.rng.random();
            let mut env = Vec::new();
            for (ai, a) in task.args.iter().enumerate() {
                if a.kind != ArgKind::Input {
                    continue;
                }
                let dims = a
                    .shape
                    .iter()
                    .map(|d| eval_formula(d, &shape.sizes))
                    .collect::<Result<Vec<i64>, _>>()?;
                let n: i64 = dims.iter().product();
                let x = gen_input(n, seed, ai, task.input_scale(seed), elem.float, me.dev)?;
                env.push((a.name.clone(), x.f_reshape(dims.as_slice())?));
            }
            Ok((env, scalar_values(task, seed)))
        };
        // Transfer times of the buffers (inputs and outputs, as the candidate's).
        let bytes: u64 = buffer_args(task, &shape.sizes, 0)?
            .iter()
            .map(|b| (b.n * elem.size) as u64)
            .sum();
        let (h2d_ms, d2h_ms) = self.transfer_ms(bytes)?;
        let spent_ms = self.transfer_spent_ms;
        let (start, stop, after) = (self.event()?, self.event()?, self.event()?);
        let run = |me: &mut Judge, k: usize| -> Result<(f64, f64), JudgeError> {
            let sets: Vec<_> = (0..k).map(|_| draw(me)).collect::<Result<_, _>>()?;
            me.flush()?;
            start.record(&me.stream)?;
            for (env, scalars) in &sets {
                reference_outputs(&refs, env, scalars, false)?;
            }
            stop.record(&me.stream)?;
            me.sync()?;
            after.record(&me.stream)?;
            after.synchronize()?;
            Ok((
                start.elapsed_ms(&stop)? as f64,
                start.elapsed_ms(&after)? as f64,
            ))
        };
        heartbeat();
        tracing::debug!(task = %task.id, "torch baseline");
        let est = run(self, 1)?.0.max(1e-3);
        let k = ((b.window_ms / est).ceil() as usize).clamp(1, max_sets(b, set_bytes));
        for _ in 0..b.warmup.min(2) {
            run(self, k)?;
        }
        let (times, synced) = sample_windows(b, k, heartbeat, || {
            let (t, s) = run(self, k)?;
            Ok::<_, JudgeError>((t / k as f64, s / k as f64))
        })?;
        self.transfer_spent_ms = spent_ms;
        let mut t = stats((times, synced), false, (h2d_ms, d2h_ms), shape);
        t.sets = k;
        t.windows = t.reps;
        t.reps *= k;
        Ok(t)
    }
}

impl Drop for Judge {
    fn drop(&mut self) {
        self.warm.clear();
    }
}

/// The judge's limit for one runner answer: 90% of the caller's per-step limit (its heartbeats
/// reset it), so a hang ends as the runner's timeout and the judge still answers; 50 s when the
/// job does not say.
/// Sampled chunks of a window's outputs ([`EARLY_CHUNKS`] per output argument, each in a set
/// drawn at random) and a device buffer holding three copies of them: before the start, at the
/// stop, after the runner's synchronize.
struct Samples {
    chunks: Vec<(sys::CUdeviceptr, usize)>,
    bytes: usize,
    snaps: Tensor,
}

impl Samples {
    fn draw(
        rng: &mut rand::rngs::StdRng,
        sets: &[Bufs],
        arena: sys::CUdeviceptr,
        dev: Device,
    ) -> Result<Samples, JudgeError> {
        let mut chunks = Vec::new();
        if let Some(first) = sets.first() {
            for (i, o) in first.outputs().enumerate() {
                let bytes = (o.n * o.elem.size) as u64;
                for _ in 0..EARLY_CHUNKS {
                    let set = &sets[rng.random_range(0..sets.len())];
                    let o = set
                        .outputs()
                        .nth(i)
                        .expect("every set has the same outputs");
                    let len = EARLY_CHUNK_BYTES.min(bytes);
                    let at = rng.random_range(0..=(bytes - len) / 4) * 4;
                    chunks.push((arena + o.offset + at, len as usize));
                }
            }
        }
        let bytes = chunks.iter().map(|c| c.1).sum::<usize>().max(1);
        let snaps = Tensor::f_zeros([3, bytes as i64], (Kind::Uint8, dev))?;
        Ok(Samples {
            chunks,
            bytes,
            snaps,
        })
    }

    /// Enqueues copy `i` (0, 1 or 2) of every chunk on the legacy stream.
    fn copy(&self, i: usize) -> Result<(), JudgeError> {
        let mut at = self.snaps.data_ptr() as sys::CUdeviceptr + (i * self.bytes) as u64;
        for &(src, len) in &self.chunks {
            // SAFETY: device-to-device copies inside the arena and the snapshot buffer.
            unsafe {
                cu(
                    sys::cuMemcpyDtoDAsync_v2(at, src, len, std::ptr::null_mut()),
                    "cuMemcpyDtoDAsync",
                )?
            };
            at += len as u64;
        }
        Ok(())
    }
}

/// One timing window measured by [`Judge::window`].
struct Window {
    /// Start to stop event, ms.
    ms: f64,
    /// Start to the event recorded after the runner synchronized its context, ms.
    synced_ms: f64,
    /// Sampled output chunks changed after the stop event.
    late: bool,
    /// Sets of the window compared with the reference.
    verified: usize,
}

/// One window's gate: the judge's host word (`host`, mapped for the device at `dev`) and the
/// values the judge's stream waits for, `a` before the window starts and `b` past it.
struct Gate {
    dev: sys::CUdeviceptr,
    host: *mut u32,
    a: u32,
    b: u32,
}

impl Gate {
    /// Opens the gate to `g`: a volatile write of the host word, then a full fence.
    fn release(&self, g: u32) {
        // SAFETY: the gate word is pinned host memory owned by this judge.
        unsafe { std::ptr::write_volatile(self.host, g) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// Milliseconds between successive calls of [`Lap::ms`].
struct Lap(Instant);

impl Lap {
    fn new() -> Lap {
        Lap(Instant::now())
    }

    fn ms(&mut self) -> f64 {
        let now = Instant::now();
        let ms = (now - self.0).as_secs_f64() * 1e3;
        self.0 = now;
        ms
    }
}

/// Milliseconds since `t`.
fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn job_wall(job: &RunJob) -> Duration {
    Duration::from_secs_f64(job.wall_s.map_or(50.0, |w| (0.9 * w).max(1.0)))
}

/// Timed windows of `k` sets until the per-launch times settle: at least `window_counts`'
/// minimum and at most its maximum, stopping early once their coefficient of variation is under
/// `target_cv`, or after 3 once the time budget (`budget_ms`, at least 5 windows' worth) is
/// spent. `window` times one window: (per-launch ms, per-launch ms up to the device's
/// synchronization). The candidate's and the torch baseline's timing share this rule.
/// `heartbeat` is called before each window.
fn sample_windows<E>(
    b: &BenchSpec,
    k: usize,
    heartbeat: &mut dyn FnMut(),
    mut window: impl FnMut() -> Result<(f64, f64), E>,
) -> Result<(Vec<f64>, Vec<f64>), E> {
    let (min_w, max_w) = window_counts(b, k);
    let (mut times, mut synced) = (Vec::new(), Vec::new());
    let budget = Instant::now();
    loop {
        heartbeat();
        let (t, s) = window()?;
        times.push(t);
        synced.push(s);
        let n = times.len();
        if n >= max_w {
            return Ok((times, synced));
        }
        let over = budget.elapsed().as_secs_f64() * 1e3 > b.budget_ms.max(b.window_ms * 5.0);
        if n >= min_w || (n >= 3 && over) {
            let (m, sd) = mean_std(&times);
            if sd / m.max(1e-12) < b.target_cv || over {
                return Ok((times, synced));
            }
        }
    }
}

/// The most sets one window may use for sets of `set_bytes`.
fn max_sets(b: &BenchSpec, set_bytes: u64) -> usize {
    ((b.max_set_bytes / set_bytes.max(1)) as usize).clamp(1, b.max_sets.max(1))
}

/// (minimum, maximum) windows for `k` launches per window: at least `min_reps` launches over at
/// least 5 windows, at most `max_reps` launches.
fn window_counts(b: &BenchSpec, k: usize) -> (usize, usize) {
    let min_w = b.min_reps.div_ceil(k).max(5);
    (min_w, b.max_reps.div_ceil(k).max(min_w))
}

/// Median, p10, p90 of `v`.
fn quantiles(v: &[f64]) -> (f64, f64, f64) {
    let mut sorted = v.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize];
    (q(0.5), q(0.1), q(0.9))
}

/// The timing of windows (per-launch ms up to the stop event, and up to the device's
/// synchronization). With `after_stop` (outputs changed after the stop event, see
/// [`Judge::window`]) the synchronized times are the timing.
fn stats(
    (times, synced): (Vec<f64>, Vec<f64>),
    after_stop: bool,
    (h2d_ms, d2h_ms): (f64, f64),
    shape: &ShapeCase,
) -> Timing {
    let (median, p10, p90) = quantiles(&times);
    let (synced_median, _, _) = quantiles(&synced);
    let times = if after_stop { synced } else { times };
    let (mean, std) = mean_std(&times);
    let (median, p10, p90) = if after_stop {
        quantiles(&times)
    } else {
        (median, p10, p90)
    };
    Timing {
        synced_median_ms: synced_median,
        work_after_stop: after_stop,
        median_ms: median,
        p10_ms: p10,
        p90_ms: p90,
        mean_ms: mean,
        cv: std / mean.max(1e-12),
        reps: times.len(),
        h2d_ms,
        d2h_ms,
        sizes: shape.sizes.clone(),
        sets: 1,
        windows: times.len(),
        overhead_ms: 0.0,
        verified_sets: 0,
    }
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n.max(1.0);
    (m, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arena_grows_to_the_granule_and_shrinks_only_when_far_too_large() {
        const MIB: u64 = 1 << 20;
        // Grows: rounded up to the granule, never zero.
        assert_eq!(arena_size(0, 1), Some(ARENA_GRANULE));
        assert_eq!(arena_size(0, 65 * MIB), Some(128 * MIB));
        assert_eq!(arena_size(64 * MIB, 3300 * MIB), Some(3328 * MIB));
        // Kept: large enough, or small, or not four times too large.
        assert_eq!(arena_size(3328 * MIB, 3300 * MIB), None);
        assert_eq!(arena_size(1024 * MIB, MIB), None);
        assert_eq!(arena_size(3328 * MIB, 900 * MIB), None);
        // Shrunk: over 1 GiB and more than four times the need.
        assert_eq!(arena_size(3328 * MIB, 800 * MIB), Some(832 * MIB));
        assert_eq!(arena_size(3328 * MIB, MIB), Some(ARENA_GRANULE));
    }

    #[test]
    fn late_outputs_make_the_synchronized_times_the_timing() {
        let events = vec![3.48; 18];
        let mut synced = vec![3.49; 8];
        synced.extend(vec![7.72; 10]);
        let shape = ShapeCase {
            split: "train".into(),
            sizes: Default::default(),
        };
        // A host delayed by other load (synchronized times far behind) is not hidden work.
        let t = stats((events.clone(), synced.clone()), false, (0.0, 0.0), &shape);
        assert!(!t.work_after_stop);
        assert_eq!(t.median_ms, 3.48);
        assert_eq!(t.synced_median_ms, 7.72);
        let t = stats((events, synced), true, (0.0, 0.0), &shape);
        assert!(t.work_after_stop);
        assert_eq!(t.median_ms, 7.72);
    }

    #[test]
    fn quantiles_by_hand() {
        assert_eq!(quantiles(&[5.0, 1.0, 3.0, 2.0, 4.0]), (3.0, 1.0, 5.0));
    }

    #[test]
    fn window_sizes_follow_the_bench_spec() {
        let b = BenchSpec::default();
        // 768 MB sets (vector_add at 64M elements): 3 GiB / 768 MiB = 4 sets at most.
        assert_eq!(max_sets(&b, 768 << 20), 4);
        assert_eq!(max_sets(&b, 1 << 20), 16);
        assert_eq!(max_sets(&b, 8 << 30), 1);
        // 30..300 launches: 8 per window -> 5..38 windows.
        assert_eq!(window_counts(&b, 8), (5, 38));
        assert_eq!(window_counts(&b, 1), (30, 300));
    }

    #[test]
    fn set_layout_aligns_buffers_and_counts_guards() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets/tasks");
        let t = cudarl_cuda::load_tasks(&dir)
            .unwrap()
            .into_iter()
            .find(|t| t.spec.id == "vector_add")
            .unwrap()
            .spec;
        let sizes: BTreeMap<String, i64> = [("n".to_string(), 1000)].into();
        let (offs, total) = set_layout(&t, &sizes).unwrap();
        // (1000 + 4096) * 4 = 20384 bytes, aligned to 512 -> 20480 per buffer.
        assert_eq!(offs, vec![0, 20480, 40960]);
        assert_eq!(total, 61440);
    }
}
