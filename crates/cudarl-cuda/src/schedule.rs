//! The harness scheduler (docs/architecture.md, "The harness scheduler"): static checks and
//! nvcc on every core feed the GPU tester pools, each testing one candidate at a time, so the
//! GPU runs while the rest still build; a candidate whose tests passed is timed in its tester's
//! runner or handed to one timing pool that times them in batches. `validate`, RL rollouts and
//! `eval` judge their candidates through it; `serve` judges one request at a time with the same
//! steps ([`check_compile_only`](crate::check_compile_only), [`check_full`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::compile::CompileError;
use crate::verdict::{
    Baselines, FullOptions, PendingTiming, Tested, Verdict, check_full, check_tests, time_batch,
};
use crate::worker::{WorkerPool, stream_to};
use crate::{Compiler, Rules, TaskSpec};

/// Where a candidate whose tests passed is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimingMode {
    /// In its tester's runner, right after its tests, once the tester holds the GPU alone
    /// ([`check_full`]): one runner per candidate.
    InTester,
    /// By one timing pool in batches, each batch under one exclusive hold ([`time_batch`]): a
    /// second runner per candidate.
    Batched,
}

/// What becomes of one candidate after its compile step ([`Scheduler::run`]).
// One candidate's hand-off at a time: the size of a verdict is not worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Step<'a> {
    /// Nothing for this run (a row another shard owns, or one a merge lacks).
    Skip,
    /// Its verdict is final without the GPU (memoized, a static reject, a compile error, or no
    /// GPU at all).
    Done(Verdict),
    /// Compiled: to be tested on a GPU tester, then timed.
    Gpu(GpuJob<'a>),
}

/// A compiled candidate for the GPU: the arguments of [`check_full`] / [`check_tests`].
pub struct GpuJob<'a> {
    /// Its task.
    pub spec: &'a TaskSpec,
    /// Its source.
    pub code: &'a str,
    /// The task's naive kernel (the speedup baseline), when known.
    pub naive: Option<&'a str>,
    /// Seeds, limits and what to measure.
    pub opts: FullOptions,
}

/// Where a [`Scheduler::run`]'s time went, in milliseconds summed over the threads that spent
/// it, plus the wall-clock points the phases ended at.
#[derive(Debug, Default)]
pub struct ScheduleTimes {
    /// In the compile steps (static checks, nvcc, the caller's lookups), summed over cores.
    pub compile_ms: AtomicU64,
    /// In the testers' jobs (tests, and timing when it runs in the tester), summed.
    pub test_ms: AtomicU64,
    /// Testers waiting for the next compiled candidate, summed.
    pub test_wait_ms: AtomicU64,
    /// The timing pool's batches (exclusive holds, their waits for the testers in flight, the
    /// naive kernels' builds).
    pub timer_ms: AtomicU64,
    /// When the last compile step ended and when the first GPU job started.
    pub marks: Mutex<Marks>,
}

/// Wall-clock points of a [`Scheduler::run`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Marks {
    /// The end of the last compile step.
    pub compiled: Option<Instant>,
    /// The start of the first GPU job.
    pub first_gpu: Option<Instant>,
}

impl ScheduleTimes {
    fn add(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_millis() as u64, Relaxed);
    }
    fn marks(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The wall-clock points so far.
    pub fn snapshot(&self) -> Marks {
        *self.marks()
    }
}

/// A [`Scheduler::run`] failure: the harness's own (compile setup, store) or the caller's
/// (from its `compile` or `done` step).
#[derive(Debug)]
pub enum ScheduleError<E> {
    /// The harness failed (not the candidate: candidate failures are in its verdict).
    Harness(CompileError),
    /// The caller's step failed.
    Caller(E),
}

impl<E> ScheduleError<E> {
    /// The caller's error type, with harness failures turned into it by `harness`.
    pub fn into_caller(self, harness: impl FnOnce(CompileError) -> E) -> E {
        match self {
            ScheduleError::Harness(e) => harness(e),
            ScheduleError::Caller(e) => e,
        }
    }
}

/// The harness scheduler: what every candidate's compile, test and timing step shares.
pub struct Scheduler<'a> {
    /// Static rules (the tests re-check the build they reuse from the compile cache).
    pub rules: &'a Rules,
    /// nvcc and the compile cache.
    pub compiler: &'a Compiler,
    /// Baseline timings per task, measured once and shared by every candidate of a task.
    pub baselines: &'a Mutex<Baselines>,
    /// Where candidates whose tests passed are timed: in their tester, or with
    /// [`TimingMode::Batched`] in a timing pool [`Scheduler::run`] starts, `batch` candidates
    /// per exclusive hold. The stages set it from their params and read it nowhere else.
    pub timing: TimingMode,
    /// Candidates per exclusive hold with [`TimingMode::Batched`] (at least 1).
    pub batch: usize,
    /// Where the time went.
    pub times: ScheduleTimes,
}

type Pending = (usize, PendingTiming);

impl<'a> Scheduler<'a> {
    /// A scheduler timing in the testers ([`TimingMode::InTester`]).
    pub fn new(
        rules: &'a Rules,
        compiler: &'a Compiler,
        baselines: &'a Mutex<Baselines>,
    ) -> Scheduler<'a> {
        Scheduler {
            rules,
            compiler,
            baselines,
            timing: TimingMode::InTester,
            batch: 1,
            times: ScheduleTimes::default(),
        }
    }

    /// Judges candidates `0..n`: `compile(i)` on every core (rayon) says what becomes of
    /// candidate `i` ([`Step`]); for the candidates in `waits`, whose `compile` waits for a
    /// build already running (started while their batch still decoded), on a thread each
    /// outside the rayon pool, in the order their builds land ([`stream_to`]). Compiled ones go
    /// to the first free tester (one thread per pool in `testers`) as soon as they are built, and are timed in the tester or, with
    /// [`TimingMode::Batched`], in batches in a worker pool the scheduler starts for the run. `done(i, verdict)` is
    /// called for every verdict the GPU produced, on the thread that finished it, before
    /// `run` returns. Returns every verdict, [`Step::Done`] ones included, as `(i, verdict)` in
    /// completion order. Without testers every step must be [`Step::Done`] or [`Step::Skip`].
    ///
    /// # Errors
    /// The first failure of a step or of the harness; the testers stop taking candidates and
    /// finish the ones they hold.
    pub fn run<'j, E, C, D>(
        &self,
        testers: &mut [WorkerPool],
        n: usize,
        waits: &[usize],
        compile: C,
        done: D,
    ) -> Result<Vec<(usize, Verdict)>, ScheduleError<E>>
    where
        E: Send,
        C: Fn(usize) -> Result<Step<'j>, E> + Sync,
        D: Fn(usize, &Verdict) -> Result<(), E> + Sync,
    {
        let finals = Mutex::new(Vec::new());
        let produce = |i: usize| -> Result<Option<(usize, GpuJob<'j>)>, ScheduleError<E>> {
            let t0 = Instant::now();
            let step = compile(i).map_err(ScheduleError::Caller)?;
            ScheduleTimes::add(&self.times.compile_ms, t0);
            let now = Instant::now();
            let mut m = self.times.marks();
            m.compiled = Some(m.compiled.map_or(now, |c| c.max(now)));
            drop(m);
            match step {
                Step::Skip => Ok(None),
                Step::Done(v) => {
                    finals
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((i, v));
                    Ok(None)
                }
                Step::Gpu(job) => Ok(Some((i, job))),
            }
        };
        if testers.is_empty() {
            // No tester: a candidate compiled for the GPU is the caller's mistake.
            stream_to(&mut [()], n, waits, produce, |_, _: (usize, GpuJob<'j>)| {
                Err::<(), _>(ScheduleError::Harness(CompileError::Io(
                    "a compiled candidate for the GPU, and no GPU tester".into(),
                )))
            })?;
            return Ok(finals.into_inner().unwrap_or_else(|e| e.into_inner()));
        }
        // The one place the timing mode is read: with `Batched` the scheduler times in a worker
        // pool of its own, which lives as long as this run.
        let mut own_timer = (self.timing == TimingMode::Batched).then(WorkerPool::judge);
        let timer = own_timer.as_mut();
        let batched = timer.is_some();
        let (ttx, trx) = channel::<Pending>();
        let mut slots: Vec<(&mut WorkerPool, Instant)> =
            testers.iter_mut().map(|p| (p, Instant::now())).collect();
        let (tested, timed) = std::thread::scope(|sc| {
            let timer = timer.map(|pool| {
                let done = &done;
                sc.spawn(move || self.time_batches(pool, trx, done))
            });
            let tested = stream_to(&mut slots, n, waits, produce, |slot, (i, job)| {
                self.test(slot, i, job, batched, &ttx, &done)
            });
            drop(ttx);
            (tested, timer.map(|h| h.join()))
        });
        let mut out = finals.into_inner().unwrap_or_else(|e| e.into_inner());
        out.extend(tested?.into_iter().flatten());
        match timed {
            Some(Ok(t)) => out.extend(t?),
            Some(Err(p)) => std::panic::resume_unwind(p),
            None => {}
        }
        Ok(out)
    }

    /// One compiled candidate on a tester: tested (and timed there, or handed to the timing
    /// pool when `batched`).
    fn test<E>(
        &self,
        (pool, idle): &mut (&mut WorkerPool, Instant),
        i: usize,
        job: GpuJob<'_>,
        batched: bool,
        timer: &Sender<Pending>,
        done: &(impl Fn(usize, &Verdict) -> Result<(), E> + Sync),
    ) -> Result<Option<(usize, Verdict)>, ScheduleError<E>> {
        ScheduleTimes::add(&self.times.test_wait_ms, *idle);
        let t0 = Instant::now();
        self.times.marks().first_gpu.get_or_insert(t0);
        let GpuJob {
            spec,
            code,
            naive,
            opts,
        } = job;
        let (rules, compiler) = (self.rules, self.compiler);
        let tested = if batched {
            check_tests(spec, code, naive, rules, compiler, pool, &opts)
        } else {
            check_full(
                spec,
                code,
                naive,
                rules,
                compiler,
                pool,
                &opts,
                self.baselines,
            )
            .map(Tested::Done)
        }
        .map_err(ScheduleError::Harness)?;
        ScheduleTimes::add(&self.times.test_ms, t0);
        *idle = Instant::now();
        match tested {
            Tested::Done(v) => {
                done(i, &v).map_err(ScheduleError::Caller)?;
                Ok(Some((i, v)))
            }
            Tested::Pending(p) => {
                // A closed channel means the timing pool failed; its error is returned.
                let _ = timer.send((i, p));
                Ok(None)
            }
        }
    }

    /// The timing pool: batches of [`Scheduler::batch`] candidates, each under one exclusive
    /// hold ([`time_batch`]).
    fn time_batches<E>(
        &self,
        pool: &mut WorkerPool,
        rx: Receiver<Pending>,
        done: &(impl Fn(usize, &Verdict) -> Result<(), E> + Sync),
    ) -> Result<Vec<(usize, Verdict)>, ScheduleError<E>> {
        let batch_size = self.batch.max(1);
        let mut out = Vec::new();
        let mut queue: Vec<Pending> = Vec::new();
        let mut open = true;
        while open || !queue.is_empty() {
            while open && queue.len() < batch_size {
                match rx.recv() {
                    Ok(t) => queue.push(t),
                    Err(_) => open = false,
                }
            }
            let t0 = Instant::now();
            let (ids, pending): (Vec<usize>, Vec<PendingTiming>) =
                std::mem::take(&mut queue).into_iter().unzip();
            let timed = time_batch(pending, self.compiler, pool, self.baselines);
            ScheduleTimes::add(&self.times.timer_ms, t0);
            for (i, v) in ids.into_iter().zip(timed) {
                done(i, &v).map_err(ScheduleError::Caller)?;
                out.push((i, v));
            }
        }
        Ok(out)
    }
}
