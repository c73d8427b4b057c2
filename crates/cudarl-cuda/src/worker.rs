//! Sandboxed GPU workers: candidates run in separate processes (the `cudarl-pipe-worker`
//! binary installed beside `cudarl-pipe`, see [`worker_exe`]) that hold the CUDA context. The parent enforces a wall-clock limit per
//! job; a worker that hangs is killed, one that crashes or hits a CUDA error (which poisons its
//! context) is replaced, and the job gets `timeout` / `crash` / `cuda_error` while the run goes
//! on. Workers run with rlimits: no core dumps, bounded CPU time, no file writes beyond 1 MiB,
//! bounded open files, and a (large) address-space bound.
//!
//! Protocol: one JSON [`crate::gpu::RunJob`] per line on the worker's stdin; on its stdout,
//! `{"heartbeat":true}` lines before each GPU step, then one JSON [`crate::gpu::RunResult`].
//! The wall-clock limit applies between two lines, i.e. to each step.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::gpu::{RunJob, RunResult};

/// Worker resource limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU seconds per worker process (RLIMIT_CPU).
    pub cpu_seconds: u64,
    /// Address space, GiB (RLIMIT_AS). The CUDA driver reserves virtual address space far
    /// beyond physical memory, so this bound is large.
    pub address_space_gib: u64,
    /// Largest file the worker may write, bytes (RLIMIT_FSIZE).
    pub file_size_bytes: u64,
    /// Open files (RLIMIT_NOFILE).
    pub open_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_seconds: 3600,
            address_space_gib: 4096,
            file_size_bytes: 1 << 20,
            open_files: 1024,
        }
    }
}

fn set_limit(res: libc::__rlimit_resource_t, v: u64) {
    let r = libc::rlimit {
        rlim_cur: v,
        rlim_max: v,
    };
    // SAFETY: setrlimit on the current process.
    unsafe {
        libc::setrlimit(res, &r);
    }
}

/// Applies `limits` to the current process (called at the start of the worker).
pub fn apply_limits(l: &Limits) {
    set_limit(libc::RLIMIT_CORE, 0);
    set_limit(libc::RLIMIT_CPU, l.cpu_seconds);
    set_limit(libc::RLIMIT_AS, l.address_space_gib.saturating_mul(1 << 30));
    set_limit(libc::RLIMIT_FSIZE, l.file_size_bytes);
    set_limit(libc::RLIMIT_NOFILE, l.open_files);
}

/// The worker binary: `$CUDARL_WORKER`, else `cudarl-pipe-worker` beside the running
/// executable (cargo puts both in `target/<profile>/`), else `cudarl-pipe-worker` on `PATH`.
pub fn worker_exe() -> PathBuf {
    sibling_exe("CUDARL_WORKER", "cudarl-pipe-worker")
}

/// A companion binary of `cudarl-pipe`: `$env` if set, else `name` beside the running
/// executable (or one level up, for test binaries in `target/<profile>/deps/`), else `name`
/// on `PATH`.
pub fn sibling_exe(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    if let Ok(me) = std::env::current_exe() {
        for dir in me.ancestors().skip(1).take(2) {
            let p = dir.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    PathBuf::from(name)
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

/// One worker process for one GPU, replaced on failure (a server keeps one pool per GPU, each
/// pinned with [`WorkerPool::on_gpu`]).
pub struct WorkerPool {
    exe: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    worker: Option<Worker>,
    /// Workers started so far (replacements included).
    pub spawned: usize,
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
        }
    }

    /// The same pool with its workers pinned to GPU `index` (`CUDA_VISIBLE_DEVICES`; the
    /// worker then sees that GPU as device 0).
    pub fn on_gpu(mut self, index: usize) -> WorkerPool {
        self.env
            .push(("CUDA_VISIBLE_DEVICES".into(), index.to_string()));
        self
    }

    fn spawn(&mut self) -> Result<Worker, String> {
        let mut child = Command::new(&self.exe)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("spawn worker: {e}"))?;
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
    /// worker is an [`Outcome`].
    pub fn run(&mut self, job: &RunJob, wall: Duration) -> Outcome {
        let line = serde_json::to_string(job).expect("job serializes");
        match self.run_line(&line, wall) {
            RawOutcome::Done(l) => match serde_json::from_str::<RunResult>(&l) {
                Ok(r) => {
                    if r.cuda_error.is_some() {
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
    /// (torch-format candidates), whose jobs are not [`RunJob`]s.
    pub fn run_line(&mut self, line: &str, wall: Duration) -> RawOutcome {
        if self.worker.is_none() {
            match self.spawn() {
                Ok(w) => self.worker = Some(w),
                Err(e) => return RawOutcome::Crash(e),
            }
        }
        let w = self.worker.as_mut().expect("spawned");
        if writeln!(w.stdin, "{line}")
            .and_then(|_| w.stdin.flush())
            .is_err()
        {
            return match self.crashed() {
                Outcome::Crash(c) => RawOutcome::Crash(c),
                _ => RawOutcome::Crash("worker stdin closed".into()),
            };
        }
        let answer = loop {
            match w.lines.recv_timeout(wall) {
                Ok(l) if l.starts_with("{\"heartbeat\"") || l.starts_with("{\"hello\"") => continue,
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

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.kill();
    }
}
