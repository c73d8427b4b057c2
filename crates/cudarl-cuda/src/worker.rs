//! Sandboxed GPU workers: candidates run in separate processes (the `cudarl-pipe-worker`
//! binary installed beside `cudarl-pipe`, see [`worker_exe`]) that hold the CUDA context. The parent enforces a wall-clock limit per
//! job; a worker that hangs is killed, one that crashes or hits a CUDA error (which poisons its
//! context) is replaced, and the job gets `timeout` / `crash` / `cuda_error` while the run goes
//! on. A job the judge could not finish through no fault of the candidate's (its worker died,
//! or the judge ran out of GPU memory) runs once more on a fresh worker before that outcome
//! stands (`WorkerPool::run`). Workers run with rlimits: no core dumps, bounded CPU time, no file writes beyond 1 MiB,
//! bounded open files, and a (large) address-space bound.
//!
//! Protocol: one JSON [`crate::gpu::RunJob`] per line on the worker's stdin; on its stdout,
//! `{"heartbeat":true}` lines before each GPU step, then one JSON [`crate::gpu::RunResult`].
//! The wall-clock limit applies between two lines, i.e. to each step. A job with
//! `exclusive_timing` writes `{"exclusive":true}` once its tests passed and waits for a `go`
//! line: the parent then holds the GPU alone for the rest of the job (the timing).
//!
//! Timing runs alone on its GPU, machine-wide: a job that times (a [`RunJob`] with `bench` or
//! `torch_baseline`, from its `{"exclusive":true}` line on with `exclusive_timing`, and every
//! [`WorkerPool::run_line`] job) holds an exclusive lock on its GPU
//! ([`GpuLock`]) while it runs, so two cudarl-pipe processes on one GPU (two validation shards,
//! `serve` beside a `validate`) take turns instead of timing each other's kernels. Measured on an
//! H100 before the lock: two concurrent shards on one GPU flagged 22 of 166 kernels
//! `work_after_stop` and reported speedups up to 9x lower than a run alone
//! (benchmarks/results/shard_validate_h100_2026-11-22.json). Jobs that only test (correctness
//! does not depend on what else runs) hold the lock shared, so several pools on one GPU test
//! candidates concurrently ([`drain_on`]); within a process a waiting timer goes first (a
//! writer-preferring [`std::sync::RwLock`] per GPU in front of the flock), and across processes
//! too (a turnstile lock file: a waiting timer holds it, and a new shared holder must pass it).
//! Every other GPU user holds the lock shared while its GPU work runs: the trainer per training
//! step, per `serve` request and per sampling batch (`GpuShare` in crates/cudarl-train), so a
//! stage that trains (`pretrain`) can run beside `validate`, and RL runs beside each other,
//! without a timing ever overlapping their kernels.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

use crate::gpu::{RunJob, RunResult};

/// A machine-wide advisory lock (flock(2)) on one GPU, exclusive (timing) or shared (tests),
/// released on drop. The lock file is `<dir>/cudarl-gpu-<id>.lock` with `dir` = `$CUDARL_GPU_LOCK_DIR` or the system temp
/// directory, and `id` the device's physical id ([`physical_gpu`]): processes that use the same
/// device share one lock, however each one's `CUDA_VISIBLE_DEVICES` numbers it.
#[derive(Debug)]
pub struct GpuLock {
    // Dropped first: the flock goes before the in-process gate lets the next thread in.
    _file: std::fs::File,
    _gate: Gate,
    /// The GPU's lock id.
    id: String,
    /// Held alone (timing), not shared.
    exclusive: bool,
}

/// The in-process half of a [`GpuLock`]: a guard on the GPU's writer-preferring gate.
#[derive(Debug)]
enum Gate {
    None,
    Shared {
        _held: std::sync::RwLockReadGuard<'static, ()>,
    },
    Exclusive {
        _held: std::sync::RwLockWriteGuard<'static, ()>,
    },
}

/// One gate per lock id for the whole process (leaked: a handful of GPUs).
fn gate(id: &str) -> &'static std::sync::RwLock<()> {
    static GATES: std::sync::Mutex<
        std::collections::BTreeMap<String, &'static std::sync::RwLock<()>>,
    > = std::sync::Mutex::new(std::collections::BTreeMap::new());
    let mut g = GATES.lock().unwrap_or_else(|e| e.into_inner());
    g.entry(id.to_string())
        .or_insert_with(|| Box::leak(Box::new(std::sync::RwLock::new(()))))
}

impl GpuLock {
    fn path(id: &str) -> PathBuf {
        let dir = std::env::var_os("CUDARL_GPU_LOCK_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let id: String = id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        dir.join(format!("cudarl-gpu-{id}.lock"))
    }

    /// The file of the machine-wide lock under which one worker at a time checks a torch-format
    /// candidate at its problem's own sizes (`full_size_lock` in the worker script): beside the
    /// GPU `id`'s lock, `cudarl-gpu-<id>-full-size.lock`.
    pub fn full_size_path(id: &str) -> PathBuf {
        Self::path(&format!("{id}-full-size"))
    }

    fn open(id: &str) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(Self::path(id))
    }

    /// Waits for the GPU `id` alone and holds it until dropped.
    ///
    /// # Errors
    /// The lock file cannot be opened or locked.
    pub fn acquire(id: &str) -> std::io::Result<GpuLock> {
        Self::acquire_mode(id, true)
    }

    /// Waits for the GPU `id` beside other shared holders (no exclusive one) and holds it until
    /// dropped.
    ///
    /// # Errors
    /// The lock file cannot be opened or locked.
    pub fn acquire_shared(id: &str) -> std::io::Result<GpuLock> {
        Self::acquire_mode(id, false)
    }

    fn acquire_mode(id: &str, exclusive: bool) -> std::io::Result<GpuLock> {
        let g = gate(id);
        let gate = if exclusive {
            Gate::Exclusive {
                _held: g.write().unwrap_or_else(|e| e.into_inner()),
            }
        } else {
            Gate::Shared {
                _held: g.read().unwrap_or_else(|e| e.into_inner()),
            }
        };
        Ok(GpuLock {
            _file: Self::lock_files(id, exclusive)?,
            _gate: gate,
            id: id.to_string(),
            exclusive,
        })
    }

    /// The machine-wide half: flock(2) on the lock file, writer-preferring across processes.
    /// flock alone lets new shared holders in while an exclusive one waits, so two processes
    /// whose shared holds overlap (two trainers generating) could starve a timer. A turnstile
    /// file fixes that: a timer takes the turnstile, then waits for the lock and lets the
    /// turnstile go once it has it; a shared holder passes the turnstile (takes it and lets it
    /// go at once) before taking the lock, so it queues behind a waiting timer.
    fn lock_files(id: &str, exclusive: bool) -> std::io::Result<std::fs::File> {
        use std::os::fd::AsRawFd;
        let flock = |f: &std::fs::File, op: i32| -> std::io::Result<()> {
            // SAFETY: flock on a file descriptor the caller owns.
            if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        let turnstile = Self::open(&format!("{id}-turnstile"))?;
        flock(&turnstile, libc::LOCK_EX)?;
        if !exclusive {
            drop(turnstile);
            let f = Self::open(id)?;
            flock(&f, libc::LOCK_SH)?;
            return Ok(f);
        }
        let f = Self::open(id)?;
        flock(&f, libc::LOCK_EX)?;
        drop(turnstile);
        Ok(f)
    }

    /// The lock id of the GPU this process uses as CUDA device 0, [`physical_gpu`]`(0)` (the id
    /// unpinned [`WorkerPool`]s use for their workers).
    pub fn visible_id() -> String {
        physical_gpu(0)
    }

    /// The lock if the GPU `id` is free now, `None` if another holder has it.
    ///
    /// # Errors
    /// The lock file cannot be opened.
    pub fn try_acquire(id: &str) -> std::io::Result<Option<GpuLock>> {
        use std::os::fd::AsRawFd;
        let f = Self::open(id)?;
        // SAFETY: flock on a file descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Ok(None);
        }
        Ok(Some(GpuLock {
            _file: f,
            _gate: Gate::None,
            id: id.to_string(),
            exclusive: true,
        }))
    }
}

/// The physical id of this process's CUDA device `index`: the `index`th entry of
/// `CUDA_VISIBLE_DEVICES` (an index or a UUID) when it is set, else `index`. A child pinned with
/// [`WorkerPool::on_gpu`]`(index)` sees this device as its device 0, and every process using the
/// device takes the same [`GpuLock`].
pub fn physical_gpu(index: usize) -> String {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .nth(index)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| index.to_string()),
        _ => index.to_string(),
    }
}

/// GPU worker processes a stage runs on one GPU by default (`validate`, and the harness of
/// `rl-train` and `eval`): they test candidates concurrently while timing runs alone. Four
/// hide the host-side work of the tests (input generation, launches, the libtorch reference,
/// comparisons); see benchmarks/results/bench_validate_*.json for the measured ratio.
pub const DEFAULT_GPU_WORKERS: usize = 4;

/// Worker resource limits (the judge process's; candidates run in the runner, see
/// [`crate::runner`]).
pub use cudarl_sandbox::Limits;
/// Applies [`Limits`] to the current process (called at the start of the worker).
pub use cudarl_sandbox::process::apply_limits;

/// The worker binary: `$CUDARL_WORKER`, else `cudarl-pipe-worker` beside the running
/// executable (cargo puts both in `target/<profile>/`), else `cudarl-pipe-worker` on `PATH`.
pub fn worker_exe() -> PathBuf {
    crate::sibling_exe("CUDARL_WORKER", "cudarl-pipe-worker")
}

/// Why a worker or a runner's place could not be set up: a scratch folder, a copy or a process
/// that could not be made (path and OS error named), or the Python zygote that would not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SetupError(pub String);

impl From<crate::pyworker::PythonError> for SetupError {
    fn from(e: crate::pyworker::PythonError) -> SetupError {
        SetupError(e.0)
    }
}

/// Where one pool's torch-format runners live: a folder (under `store`'s `tmp/` when given)
/// holding each runner's scratch directory, the spec of the zygote that forks the runners
/// (`--torch-zygote` in the worker script, inside the interpreter sandbox with the GPU, writing
/// only this folder: [`crate::pyworker::sandboxed_python`]), and the paths beside the folder
/// (`outside`: the entries of every directory above it except the one leading to it), from
/// which a forked runner's own Landlock layer is made so that it sees its own scratch directory
/// and none of the others'.
pub struct RunnerRoot {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) zygote: serde_json::Value,
    pub(crate) outside: Vec<String>,
}

impl RunnerRoot {
    /// # Errors
    /// The folder cannot be made or listed, or the interpreter's paths cannot be read.
    pub(crate) fn new(
        root: &std::path::Path,
        store: Option<&cudarl_store::Store>,
    ) -> Result<RunnerRoot, SetupError> {
        // Under the store's `tmp/` where there is one (the system's temporary folder may be
        // mounted without exec, and the candidate's extensions load from here).
        let dir = match store {
            Some(s) => s.temp_dir().map_err(|e| SetupError(e.to_string()))?,
            None => tempfile::tempdir().map_err(|e| SetupError(format!("temp dir: {e}")))?,
        };
        let at = dir
            .path()
            .canonicalize()
            .map_err(|e| SetupError(format!("{}: {e}", dir.path().display())))?;
        let mut outside = Vec::new();
        for (up, next) in at.ancestors().skip(1).zip(at.ancestors()) {
            let rd =
                std::fs::read_dir(up).map_err(|e| SetupError(format!("{}: {e}", up.display())))?;
            for e in rd.flatten() {
                if Some(e.file_name().as_os_str()) != next.file_name() {
                    outside.push(e.path().display().to_string());
                }
            }
        }
        // Each runner writes its own `/proc/self/task` (the driver names its threads there),
        // which the wrapper would resolve to the zygote's: the zygote may write `/proc`, and
        // every runner narrows that to its own task directory (`landlock_beside`).
        let proc = [PathBuf::from("/proc")];
        let zygote = crate::pyworker::sandboxed_python(root, &at, &proc, true, "--torch-zygote")?;
        let zygote = serde_json::to_value(zygote).map_err(|e| SetupError(e.to_string()))?;
        Ok(RunnerRoot {
            dir,
            zygote,
            outside,
        })
    }
}

/// How a job ended, seen from the parent.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The worker answered.
    Done(Box<RunResult>),
    /// The wall-clock limit passed; the worker was killed.
    Timeout,
    /// The worker died without answering (signal or exit status), with its stderr tail.
    Crash(String),
}

/// Why a job's outcome says nothing about its candidate, if it does not: the judge reported a
/// failure of its own ([`RunResult::judge_error`]) or the worker (the judge's process; the
/// candidate runs in a runner of its own) died or answered something unreadable. `None` for
/// an answer, a timeout, and a GPU lock that could not be taken (retrying cannot help it).
fn judge_side(o: &Outcome) -> Option<&str> {
    match o {
        Outcome::Done(r) => r.judge_error.as_deref(),
        Outcome::Crash(m) if !m.starts_with("GPU lock") => Some(m),
        Outcome::Crash(_) | Outcome::Timeout => None,
    }
}

/// How a raw job line ended (see [`WorkerPool::run_line`]).
#[derive(Debug, Clone, PartialEq)]
pub enum RawOutcome {
    /// The worker's answer line.
    Done(String),
    /// The wall-clock limit passed; the worker was killed.
    Timeout,
    /// The worker died without answering, with its stderr tail.
    Crash(String),
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

/// How a job holds its GPU's [`GpuLock`].
#[derive(Debug, Clone, Copy)]
enum Hold {
    /// Beside other testers.
    Shared,
    /// Alone, taken for this job.
    Exclusive,
    /// Alone, taken by the caller ([`WorkerPool::run_holding`]).
    Held,
}

/// One worker process for one GPU, replaced on failure (`serve` keeps several per GPU, its
/// testers, each pinned with [`WorkerPool::on_gpu`]).
pub struct WorkerPool {
    exe: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    worker: Option<Worker>,
    /// Workers started so far (replacements included).
    pub spawned: usize,
    /// The sandboxed runner this pool's worker starts ahead for its next torch-format run
    /// ([`crate::torchfmt::run`]): its scratch directory (removed when dropped) and its spec
    /// (which says whether it starts CUPTI, `profile`).
    pub next_runner: Option<(tempfile::TempDir, serde_json::Value)>,
    /// The folder this pool's torch-format runners' scratch directories live in and the spec of
    /// the zygote that forks them ([`crate::torchfmt::RunnerRoot`]), made with the first run.
    pub runner_root: Option<RunnerRoot>,
}

/// libtorch's caching-allocator settings variable for CUDA (`PYTORCH_CUDA_ALLOC_CONF`).
pub const ALLOC_CONF_VAR: &str = "PYTORCH_CUDA_ALLOC_CONF";

/// The caching-allocator settings of a native judge process ([`WorkerPool::judge_allocator`]):
/// when an allocation finds no cached block and the process's libtorch holds over 8% of the
/// GPU's memory (its IPC arenas, allocated through the driver, not counted), libtorch gives its
/// oldest unused cached blocks back to the driver (`garbage_collection_threshold`, applied only
/// under a set `per_process_memory_fraction`, hence 0.99). The default allocator keeps each
/// process's peak: four judges ran one another out of GPU memory in `bench validate` on an H100
/// 80GB, and with these settings and the in-place comparison none did, the processes holding at
/// most 63,098 MiB together during the gated hack test (79,318 MiB before)
/// (`benchmarks/results/harness_cost_bench_validate_h100_2026-12-06.json`).
pub const JUDGE_ALLOC_CONF: &str =
    "per_process_memory_fraction:0.99,garbage_collection_threshold:0.08";

/// [`JUDGE_ALLOC_CONF`] unless the user set libtorch's allocator settings
/// (`PYTORCH_CUDA_ALLOC_CONF` or `PYTORCH_ALLOC_CONF`, looked up with `set`): theirs stand alone.
pub fn judge_alloc_conf(set: impl Fn(&str) -> bool) -> Option<&'static str> {
    (!set(ALLOC_CONF_VAR) && !set("PYTORCH_ALLOC_CONF")).then_some(JUDGE_ALLOC_CONF)
}

impl WorkerPool {
    /// A pool that starts `exe args...` as workers (normally `cudarl-pipe-worker`, see [`worker_exe`]).
    pub fn new(exe: PathBuf, args: Vec<String>) -> WorkerPool {
        WorkerPool {
            exe,
            args,
            env: Vec::new(),
            worker: None,
            spawned: 0,
            next_runner: None,
            runner_root: None,
        }
    }

    /// `n` pools of `cudarl-pipe-worker` ([`worker_exe`]) for the visible GPU, to test
    /// candidates side by side with [`drain_on`] (normally [`DEFAULT_GPU_WORKERS`]; at least one).
    pub fn testers(n: usize) -> Vec<WorkerPool> {
        (0..n.max(1)).map(|_| WorkerPool::judge()).collect()
    }

    /// The GPU this pool's jobs run on, as the lock id of [`GpuLock`].
    pub(crate) fn gpu_id(&self) -> String {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == "CUDA_VISIBLE_DEVICES")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| physical_gpu(0))
    }

    /// The same pool with its workers pinned to this process's CUDA device `index`
    /// (`CUDA_VISIBLE_DEVICES` = [`physical_gpu`]`(index)`; the worker then sees that GPU as
    /// its device 0).
    pub fn on_gpu(mut self, index: usize) -> WorkerPool {
        self.env
            .push(("CUDA_VISIBLE_DEVICES".into(), physical_gpu(index)));
        self
    }

    /// A pool of native judges: `cudarl-pipe-worker` ([`worker_exe`]) with [`judge_alloc_conf`]'s
    /// allocator settings (not the Python worker's pool, which times torch's own kernels in its
    /// process).
    pub fn judge() -> WorkerPool {
        WorkerPool::new(worker_exe(), vec![]).judge_allocator()
    }

    /// The same pool with [`judge_alloc_conf`]'s allocator settings for its workers.
    pub fn judge_allocator(mut self) -> WorkerPool {
        let set = |k: &str| std::env::var_os(k).is_some() || self.env.iter().any(|(e, _)| e == k);
        if let Some(c) = judge_alloc_conf(set) {
            self.env.push((ALLOC_CONF_VAR.into(), c.into()));
        }
        self
    }

    fn spawn(&mut self) -> Result<Worker, SetupError> {
        let mut child = Command::new(&self.exe)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| SetupError(format!("spawn worker: {e}")))?;
        self.spawned += 1;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let tail = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let t2 = tail.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = t2.lock().unwrap_or_else(|e| e.into_inner());
                t.push_str(&String::from_utf8_lossy(&buf[..n]));
                if t.len() > 8192 {
                    let cut = t.len() - 4096;
                    let cut = (cut..t.len())
                        .find(|&i| t.is_char_boundary(i))
                        .unwrap_or(t.len());
                    *t = t[cut..].to_string();
                }
            }
        });
        Ok(Worker {
            child,
            stdin,
            lines: rx,
            stderr: tail,
        })
    }

    fn kill(&mut self) {
        if let Some(mut w) = self.worker.take() {
            // SAFETY: kill the worker's process group (it may have forked).
            unsafe {
                libc::kill(-(w.child.id() as i32), libc::SIGKILL);
            }
            let _ = w.child.wait();
        }
    }

    /// Runs one job with a wall-clock limit per step (between heartbeats). Never fails: a broken
    /// worker is an [`Outcome`]. A job that times (`bench` or `torch_baseline`) has the GPU to
    /// itself; one that only tests shares it with other testers ([`GpuLock`]). A job that
    /// failed on the judge's side (the judge's own error, e.g. out of GPU memory, or the worker
    /// died) runs once more on a fresh worker with the GPU alone, and that second outcome is
    /// returned.
    pub fn run(&mut self, job: &RunJob, wall: Duration) -> Outcome {
        let exclusive = (job.bench.is_some() || job.torch_baseline) && !job.exclusive_timing;
        self.run_job(
            job,
            wall,
            if exclusive {
                Hold::Exclusive
            } else {
                Hold::Shared
            },
        )
    }

    /// The GPU alone for this pool's jobs (its [`GpuLock`], exclusive), to run several timing
    /// jobs one after another with [`WorkerPool::run_holding`]: testers on the GPU drain once
    /// per hold instead of once per job.
    ///
    /// # Errors
    /// The lock file cannot be opened or locked.
    pub fn lock_gpu(&self) -> std::io::Result<GpuLock> {
        GpuLock::acquire(&self.gpu_id())
    }

    /// [`WorkerPool::run`] for a caller that already holds this pool's GPU alone (`held`, from
    /// [`WorkerPool::lock_gpu`]): no lock is taken. A `held` lock that is shared or for another
    /// GPU is a [`Outcome::Crash`] (the job does not run).
    pub fn run_holding(&mut self, job: &RunJob, wall: Duration, held: &GpuLock) -> Outcome {
        if !held.exclusive || held.id != self.gpu_id() {
            return Outcome::Crash(format!(
                "run_holding needs this pool's GPU ({}) held alone, got {} ({})",
                self.gpu_id(),
                held.id,
                if held.exclusive {
                    "exclusive"
                } else {
                    "shared"
                }
            ));
        }
        self.run_job(job, wall, Hold::Held)
    }

    /// One job, and once more when the first try failed on the judge's side
    /// ([`judge_side`]): on a fresh worker (the failed one exited or is killed, and with it
    /// whatever GPU memory it held) with the GPU alone (testers in flight drain first). Another
    /// process holding the GPU's memory (a trainer, another stage's workers) then fails a job
    /// only when the pressure lasts; a failure that repeats is the job's outcome.
    fn run_job(&mut self, job: &RunJob, wall: Duration, hold: Hold) -> Outcome {
        let first = self.run_job_once(job, wall, hold);
        let Some(why) = judge_side(&first) else {
            return first;
        };
        tracing::warn!(task = %job.task.id, why, "the judge failed on its side; running the job again on a fresh worker with the GPU alone");
        self.kill();
        let hold = match hold {
            Hold::Held => Hold::Held,
            Hold::Shared | Hold::Exclusive => Hold::Exclusive,
        };
        self.run_job_once(job, wall, hold)
    }

    fn run_job_once(&mut self, job: &RunJob, wall: Duration, hold: Hold) -> Outcome {
        let line = serde_json::to_string(job).expect("job serializes");
        match self.run_line_locked(&line, wall, hold) {
            RawOutcome::Done(l) => match serde_json::from_str::<RunResult>(&l) {
                Ok(r) => {
                    if r.cuda_error.is_some() || r.judge_error.is_some() {
                        // The context is poisoned; the worker exits by itself. Reap it.
                        self.kill();
                    }
                    Outcome::Done(Box::new(r))
                }
                Err(e) => {
                    self.kill();
                    Outcome::Crash(format!("worker sent an unreadable answer: {e}"))
                }
            },
            RawOutcome::Timeout => Outcome::Timeout,
            RawOutcome::Crash(c) => Outcome::Crash(c),
        }
    }

    /// Sends one JSON job line and returns the worker's answer line, with the same wall-clock
    /// limit per step and the same handling of hangs and crashes as [`WorkerPool::run`]. Lines
    /// starting with `{"heartbeat"` or `{"hello"` are not answers. Used for the Python worker
    /// (torch-format candidates), whose jobs are not [`RunJob`]s; such a job has the GPU to
    /// itself.
    pub fn run_line(&mut self, line: &str, wall: Duration) -> RawOutcome {
        self.run_line_locked(line, wall, Hold::Exclusive)
    }

    /// [`WorkerPool::run_line`] for a job that only tests (times nothing): it shares the GPU
    /// with other testers and waits only for timers ([`GpuLock::acquire_shared`]).
    pub fn run_line_shared(&mut self, line: &str, wall: Duration) -> RawOutcome {
        self.run_line_locked(line, wall, Hold::Shared)
    }

    fn run_line_locked(&mut self, line: &str, wall: Duration, hold: Hold) -> RawOutcome {
        // Machine-wide (held until the answer or the kill).
        let id = self.gpu_id();
        let lock = match hold {
            Hold::Exclusive => GpuLock::acquire(&id).map(Some),
            Hold::Shared => GpuLock::acquire_shared(&id).map(Some),
            Hold::Held => Ok(None),
        };
        let mut gpu = match lock {
            Ok(l) => l,
            Err(e) => return RawOutcome::Crash(format!("GPU lock: {e}")),
        };
        if self.worker.is_none() {
            match self.spawn() {
                Ok(w) => self.worker = Some(w),
                Err(e) => return RawOutcome::Crash(e.0),
            }
        }
        if let Err(o) = self.send(line) {
            return o;
        }
        let answer = loop {
            let w = self.worker.as_mut().expect("spawned");
            match w.lines.recv_timeout(wall) {
                Ok(l) if l.starts_with("{\"heartbeat\"") || l.starts_with("{\"hello\"") => continue,
                Ok(l) if l.starts_with("{\"exclusive\"") => {
                    // The job's tests passed and its timing wants the GPU alone: trade the shared
                    // hold for an exclusive one (released first: two testers upgrading at once
                    // would otherwise wait for each other), then let the worker go on.
                    if gpu.as_ref().is_some_and(|g| !g.exclusive) {
                        drop(gpu.take());
                        match GpuLock::acquire(&id) {
                            Ok(l) => gpu = Some(l),
                            Err(e) => {
                                self.kill();
                                return RawOutcome::Crash(format!("GPU lock: {e}"));
                            }
                        }
                    }
                    if let Err(o) = self.send("go") {
                        return o;
                    }
                }
                other => break other,
            }
        };
        match answer {
            Ok(l) => RawOutcome::Done(l),
            Err(RecvTimeoutError::Timeout) => {
                self.kill();
                RawOutcome::Timeout
            }
            Err(RecvTimeoutError::Disconnected) => match self.crashed() {
                Outcome::Crash(c) => RawOutcome::Crash(c),
                _ => RawOutcome::Crash("worker exited".into()),
            },
        }
    }

    /// Writes one line to the running worker; a worker that cannot take it has crashed.
    fn send(&mut self, line: &str) -> Result<(), RawOutcome> {
        let w = self.worker.as_mut().expect("spawned");
        if writeln!(w.stdin, "{line}")
            .and_then(|_| w.stdin.flush())
            .is_err()
        {
            return Err(match self.crashed() {
                Outcome::Crash(c) => RawOutcome::Crash(c),
                _ => RawOutcome::Crash("worker stdin closed".into()),
            });
        }
        Ok(())
    }

    /// Kills the current worker (the next job starts a fresh one).
    pub fn restart(&mut self) {
        self.kill();
    }

    fn crashed(&mut self) -> Outcome {
        let Some(mut w) = self.worker.take() else {
            return Outcome::Crash("no worker".into());
        };
        let status = w
            .child
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_else(|e| e.to_string());
        std::thread::sleep(Duration::from_millis(50));
        let tail = w.stderr.lock().map(|t| t.clone()).unwrap_or_default();
        let tail: String = tail
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join(" | ");
        Outcome::Crash(format!(
            "worker died ({status}){}",
            if tail.is_empty() {
                String::new()
            } else {
                format!(": {tail}")
            }
        ))
    }
}

/// The harness's scheduler: `produce(i)` for every `i < n` on every core (rayon: static checks
/// and nvcc), each `Some` item handed at once to the GPU side, where [`drain_on`] runs `consume`
/// on it in the first free slot, so the GPU works while nvcc builds the rest. The items in
/// `waits` are produced each on a thread of its own instead, outside the rayon pool: their
/// `produce` may block on work already running elsewhere (a build started while the batch still
/// decoded), and each is handed on as soon as it lands, in whatever order they land. Returns
/// `consume`'s results in completion order (carry an index in the item to place them).
///
/// # Errors
/// The first error of `consume` (the slots stop taking items; the remaining items are still
/// produced and dropped), else the first of `produce`.
pub fn stream_to<S, T, R, E, P, F>(
    slots: &mut [S],
    n: usize,
    waits: &[usize],
    produce: P,
    consume: F,
) -> Result<Vec<R>, E>
where
    S: Send,
    T: Send,
    R: Send,
    E: Send,
    P: Fn(usize) -> Result<Option<T>, E> + Sync,
    F: Fn(&mut S, T) -> Result<R, E> + Sync + Send,
{
    use rayon::prelude::*;
    let (tx, rx) = std::sync::mpsc::channel::<T>();
    let waiting: std::collections::BTreeSet<usize> =
        waits.iter().copied().filter(|&i| i < n).collect();
    let produce_to = |tx: &std::sync::mpsc::Sender<T>, i: usize| -> Result<(), E> {
        if let Some(t) = produce(i)? {
            // A closed channel means the consumer failed; its error is returned.
            let _ = tx.send(t);
        }
        Ok(())
    };
    let (produced, consumed) = std::thread::scope(|sc| {
        let h = sc.spawn(move || drain_on(slots, rx.into_iter(), consume));
        let waited: Vec<_> = waiting
            .iter()
            .map(|&i| {
                let tx = tx.clone();
                let produce_to = &produce_to;
                sc.spawn(move || produce_to(&tx, i))
            })
            .collect();
        let built = (0..n)
            .into_par_iter()
            .filter(|i| !waiting.contains(i))
            .try_for_each_with(tx, |tx, i| produce_to(tx, i));
        // The scope joins any thread left behind by the first error.
        let produced = waited
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .and(built);
        let consumed = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (produced, consumed)
    });
    let out = consumed?;
    produced?;
    Ok(out)
}

/// Runs `f` on every item of `jobs`, one thread per slot (normally one [`WorkerPool`] each, so
/// several workers test candidates on one GPU at once, see [`GpuLock`]); each thread takes the
/// next item when it is done with one. Returns the results in completion order (carry an index
/// in the item to place them). One slot is the plain sequential loop on this thread.
///
/// # Errors
/// The first error of `f`: the other threads stop taking items, and it is returned once they
/// have finished the ones they hold.
pub fn drain_on<S, T, R, E, I, F>(slots: &mut [S], jobs: I, f: F) -> Result<Vec<R>, E>
where
    S: Send,
    T: Send,
    R: Send,
    E: Send,
    I: Iterator<Item = T> + Send,
    F: Fn(&mut S, T) -> Result<R, E> + Sync,
{
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    if let [slot] = slots {
        return jobs.map(|t| f(slot, t)).collect();
    }
    let jobs = Mutex::new(jobs);
    let failed = AtomicBool::new(false);
    let next = || -> Option<T> {
        if failed.load(Ordering::Relaxed) {
            return None;
        }
        jobs.lock().unwrap_or_else(|e| e.into_inner()).next()
    };
    let parts: Vec<Result<Vec<R>, E>> = std::thread::scope(|sc| {
        let handles: Vec<_> = slots
            .iter_mut()
            .map(|slot| {
                let (f, next, failed) = (&f, &next, &failed);
                sc.spawn(move || {
                    let mut out = Vec::new();
                    while let Some(t) = next() {
                        match f(slot, t) {
                            Ok(r) => out.push(r),
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut all = Vec::new();
    for p in parts {
        all.extend(p?);
    }
    Ok(all)
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_per_gpu_across_open_files() {
        let id = format!("test-{}", std::process::id());
        let held = GpuLock::acquire(&id).unwrap();
        // A second open file description (as another process would have) cannot take it.
        assert!(GpuLock::try_acquire(&id).unwrap().is_none());
        // Another GPU is free.
        assert!(
            GpuLock::try_acquire(&format!("{id}-other"))
                .unwrap()
                .is_some()
        );
        // A waiter gets it once the holder is gone.
        let waiter = std::thread::spawn({
            let id = id.clone();
            move || GpuLock::acquire(&id).map(|_| ())
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !waiter.is_finished(),
            "the waiter blocks while the lock is held"
        );
        drop(held);
        waiter.join().unwrap().unwrap();
        assert!(GpuLock::try_acquire(&id).unwrap().is_some());
        let _ = std::fs::remove_file(GpuLock::path(&id));
        let _ = std::fs::remove_file(GpuLock::path(&format!("{id}-turnstile")));
        let _ = std::fs::remove_file(GpuLock::path(&format!("{id}-other")));
    }

    #[test]
    fn testers_share_the_gpu_and_a_timer_waits_for_them() {
        let id = format!("test-shared-{}", std::process::id());
        let a = GpuLock::acquire_shared(&id).unwrap();
        // Another tester gets in beside the first (another thread: the gate is per process).
        let b = std::thread::spawn({
            let id = id.clone();
            move || GpuLock::acquire_shared(&id).map(|_| ())
        });
        b.join().unwrap().unwrap();
        assert!(
            GpuLock::try_acquire(&id).unwrap().is_none(),
            "no exclusive holder beside a shared one"
        );
        let timer = std::thread::spawn({
            let id = id.clone();
            move || GpuLock::acquire(&id).map(|_| ())
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!timer.is_finished(), "the timer waits for the tester");
        drop(a);
        timer.join().unwrap().unwrap();
        let _ = std::fs::remove_file(GpuLock::path(&id));
        let _ = std::fs::remove_file(GpuLock::path(&format!("{id}-turnstile")));
    }

    #[test]
    fn a_waiting_timer_goes_before_new_shared_holders_of_other_processes() {
        // `lock_files` without the in-process gate: each thread opens its own files, as
        // separate processes would (flock locks belong to open file descriptions).
        let id = format!("test-turnstile-{}", std::process::id());
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let reader_a = GpuLock::lock_files(&id, false).unwrap();
        let spawn = |name: &'static str, exclusive: bool, hold_ms: u64| {
            let (id, order) = (id.clone(), order.clone());
            std::thread::spawn(move || {
                let f = GpuLock::lock_files(&id, exclusive).unwrap();
                order.lock().unwrap().push(name);
                std::thread::sleep(Duration::from_millis(hold_ms));
                drop(f);
            })
        };
        let timer = spawn("timer", true, 100);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !timer.is_finished(),
            "the timer waits for the shared holder"
        );
        // A new shared holder beside the first would starve the timer; it queues instead.
        let reader_b = spawn("reader_b", false, 0);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            order.lock().unwrap().is_empty(),
            "the second shared holder waits behind the timer: {:?}",
            order.lock().unwrap()
        );
        drop(reader_a);
        timer.join().unwrap();
        reader_b.join().unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["timer", "reader_b"]);
        let _ = std::fs::remove_file(GpuLock::path(&id));
        let _ = std::fs::remove_file(GpuLock::path(&format!("{id}-turnstile")));
    }

    #[test]
    fn stream_to_tests_what_is_produced_and_reports_the_first_error() {
        let mut slots = vec![0usize; 3];
        // Odd items need no GPU (like a compile error): they are not handed on.
        let mut got = stream_to(
            &mut slots,
            40,
            &[],
            |i| Ok::<_, String>((i % 2 == 0).then_some(i)),
            |n, i| {
                *n += 1;
                Ok(i * 10)
            },
        )
        .unwrap();
        got.sort();
        assert_eq!(got, (0..40).step_by(2).map(|i| i * 10).collect::<Vec<_>>());
        assert_eq!(slots.iter().sum::<usize>(), 20, "every item tested once");
        let e = stream_to(
            &mut slots,
            40,
            &[],
            |i| {
                if i == 7 {
                    Err(format!("build {i}"))
                } else {
                    Ok(Some(i))
                }
            },
            |_, i| Ok(i),
        );
        assert_eq!(e, Err("build 7".to_string()));
        let e = stream_to(
            &mut slots,
            40,
            &[],
            |i| Ok(Some(i)),
            |_, i| {
                if i == 3 {
                    Err(format!("test {i}"))
                } else {
                    Ok(i)
                }
            },
        );
        assert_eq!(e, Err("test 3".to_string()));
    }

    #[test]
    fn items_that_wait_on_the_pool_land_in_the_order_they_finish_without_a_deadlock() {
        // More waiting items than rayon threads, each waiting on a job queued in the same pool
        // (a build a prefetch started): produced on the pool, they could deadlock it.
        let n = 4 * rayon::current_num_threads() + 8;
        let waits: Vec<usize> = (0..n).filter(|i| i % 4 != 3).collect();
        let rxs: Vec<std::sync::Mutex<Option<std::sync::mpsc::Receiver<usize>>>> = (0..n)
            .map(|i| {
                let (tx, rx) = std::sync::mpsc::channel();
                rayon::spawn(move || {
                    // Item 0's build is the slowest: it must not hold the others back.
                    std::thread::sleep(Duration::from_millis(if i == 0 { 400 } else { 5 }));
                    let _ = tx.send(i);
                });
                std::sync::Mutex::new(Some(rx))
            })
            .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut one = [0usize];
            let got = stream_to(
                &mut one,
                n,
                &waits,
                |i| {
                    let rx = rxs[i].lock().unwrap().take().unwrap();
                    Ok::<_, String>(Some(rx.recv().unwrap()))
                },
                |_, i| Ok(i),
            );
            let _ = tx.send(got);
        });
        let got = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("no deadlock")
            .unwrap();
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        assert_eq!(
            got.last(),
            Some(&0),
            "the slowest build was handed on last: {got:?}"
        );
    }

    #[test]
    fn drain_on_runs_every_item_once_and_stops_at_an_error() {
        let mut slots = vec![0usize; 3];
        let mut got = drain_on(&mut slots, 0..50, |n, i| {
            *n += 1;
            std::thread::sleep(Duration::from_millis(1));
            Ok::<_, String>(i)
        })
        .unwrap();
        got.sort();
        assert_eq!(got, (0..50).collect::<Vec<_>>());
        assert_eq!(slots.iter().sum::<usize>(), 50);
        assert!(
            slots.iter().filter(|&&n| n > 0).count() >= 2,
            "work spread over the slots: {slots:?}"
        );
        let err = drain_on(&mut slots, 0..1000, |_, i| {
            std::thread::sleep(Duration::from_millis(1));
            if i == 7 {
                Err(format!("item {i}"))
            } else {
                Ok(i)
            }
        });
        assert_eq!(err.unwrap_err(), "item 7");
        let mut one = vec![()];
        assert_eq!(
            drain_on(&mut one, 0..3, |_, i| Ok::<_, ()>(i * 2)).unwrap(),
            vec![0, 2, 4]
        );
    }

    #[test]
    fn run_holding_runs_jobs_under_the_callers_exclusive_hold_only() {
        // A real process that answers every job line with an empty result.
        let answer = r#"while read l; do echo '{"tests":[]}'; done"#;
        let gpu = 90_000 + (std::process::id() as usize % 10_000);
        let mut pool =
            WorkerPool::new(PathBuf::from("/bin/sh"), vec!["-c".into(), answer.into()]).on_gpu(gpu);
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets/tasks");
        let task = crate::load_tasks(&dir)
            .unwrap()
            .into_iter()
            .find(|t| t.spec.id == "vector_add")
            .unwrap()
            .spec;
        let job = RunJob {
            bench: Some(Default::default()),
            ..RunJob::for_task(task)
        };
        let wall = Duration::from_secs(10);
        let id = gpu.to_string();
        // A shared hold, or one on another GPU, is refused before any worker starts.
        let shared = GpuLock::acquire_shared(&id).unwrap();
        match pool.run_holding(&job, wall, &shared) {
            Outcome::Crash(m) => assert!(m.contains("held alone"), "{m}"),
            o => panic!("ran under a shared hold: {o:?}"),
        }
        drop(shared);
        let other = GpuLock::acquire(&format!("{id}-other")).unwrap();
        assert!(matches!(
            pool.run_holding(&job, wall, &other),
            Outcome::Crash(_)
        ));
        drop(other);
        assert_eq!(pool.spawned, 0);
        // Under the pool's own exclusive hold: several jobs, and no tester gets in between.
        let held = pool.lock_gpu().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let tester = {
            let id = id.clone();
            std::thread::spawn(move || {
                let l = GpuLock::acquire_shared(&id).unwrap();
                tx.send(()).unwrap();
                drop(l);
            })
        };
        for _ in 0..3 {
            assert!(matches!(
                pool.run_holding(&job, wall, &held),
                Outcome::Done(_)
            ));
        }
        assert!(
            rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "a tester got the GPU during the hold"
        );
        drop(held);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the tester gets the GPU after the hold");
        tester.join().unwrap();
        assert_eq!(pool.spawned, 1, "one worker for the three jobs");
        for f in [
            id.clone(),
            format!("{id}-turnstile"),
            format!("{id}-other"),
            format!("{id}-other-turnstile"),
        ] {
            let _ = std::fs::remove_file(GpuLock::path(&f));
        }
    }

    #[test]
    fn a_judge_gets_the_allocator_settings_unless_the_user_set_some() {
        assert_eq!(judge_alloc_conf(|_| false), Some(JUDGE_ALLOC_CONF));
        for user in [ALLOC_CONF_VAR, "PYTORCH_ALLOC_CONF"] {
            assert_eq!(judge_alloc_conf(|k| k == user), None, "{user} set");
        }
        // A real worker process sees them: one that answers each line with its settings.
        let echo = r#"while read l; do echo "{\"conf\":\"$PYTORCH_CUDA_ALLOC_CONF\"}"; done"#;
        let gpu = 70_000 + (std::process::id() as usize % 10_000);
        let conf = |pool: WorkerPool| {
            let mut pool = pool.on_gpu(gpu);
            match pool.run_line("{}", Duration::from_secs(10)) {
                RawOutcome::Done(l) => {
                    serde_json::from_str::<serde_json::Value>(&l).unwrap()["conf"]
                        .as_str()
                        .unwrap()
                        .to_string()
                }
                o => panic!("the worker did not answer: {o:?}"),
            }
        };
        let sh = || WorkerPool::new(PathBuf::from("/bin/sh"), vec!["-c".into(), echo.into()]);
        let inherited = std::env::var(ALLOC_CONF_VAR).unwrap_or_default();
        assert_eq!(conf(sh()), inherited, "a pool that is not a judge's");
        let want =
            judge_alloc_conf(|k| std::env::var_os(k).is_some()).map_or(inherited, String::from);
        assert_eq!(conf(sh().judge_allocator()), want);
        let mut user = sh();
        user.env.push((
            "PYTORCH_ALLOC_CONF".into(),
            "expandable_segments:True".into(),
        ));
        assert_eq!(
            conf(user.judge_allocator()),
            std::env::var(ALLOC_CONF_VAR).unwrap_or_default(),
            "the user's PYTORCH_ALLOC_CONF stands alone"
        );
        for f in [gpu.to_string(), format!("{gpu}-turnstile")] {
            let _ = std::fs::remove_file(GpuLock::path(&f));
        }
    }

    #[test]
    fn pools_lock_the_gpu_they_are_pinned_to() {
        let p = WorkerPool::new(PathBuf::from("/bin/true"), vec![]);
        let pinned = WorkerPool::new(PathBuf::from("/bin/true"), vec![]).on_gpu(3);
        // Device 3 of this process, and device 0 for the unpinned pool and for a trainer
        // (`visible_id`): the physical ids, so every process using a device takes one lock.
        let physical: Vec<String> = match std::env::var("CUDA_VISIBLE_DEVICES") {
            Ok(v) if !v.trim().is_empty() => v.split(',').map(|s| s.trim().to_string()).collect(),
            _ => (0..4).map(|i| i.to_string()).collect(),
        };
        let nth = |i: usize| physical.get(i).cloned().unwrap_or_else(|| i.to_string());
        assert_eq!(pinned.gpu_id(), nth(3));
        assert_eq!(p.gpu_id(), nth(0));
        assert_eq!(GpuLock::visible_id(), nth(0));
        let pinned_0 = WorkerPool::new(PathBuf::from("/bin/true"), vec![]).on_gpu(0);
        assert_eq!(
            pinned_0.gpu_id(),
            p.gpu_id(),
            "serve's tester and validate's share a lock"
        );
        assert!(GpuLock::path("0,1").ends_with("cudarl-gpu-0_1.lock"));
    }
}
