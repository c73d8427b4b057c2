//! The sandboxed runner (`cudarl-pipe-runner`): the only process in which a native candidate's
//! code runs. The judge (the GPU worker, `cudarl-pipe-worker`) owns inputs, their pristine copies,
//! the reference, the comparisons and the clock; the runner gets one candidate shared object and
//! one device arena (a CUDA IPC memory handle), and can only launch the candidate on buffers
//! inside the arena when told to. Windows (tests and timing alike) are ordered on the GPU by two
//! interprocess events the judge created ([`Arena::go`], [`Arena::done`]): the runner's stream
//! waits on `go` before its launches and records `done` after them. No word the judge reads or
//! waits on lies in memory the runner maps. Everything it says is "done"; every number in a
//! verdict comes from the judge (docs/architecture.md, "The judge and the runner").
//!
//! Protocol: JSON lines on a socket the runner has as file descriptor 3, requests from the judge
//! ([`Request`]), replies from the runner ([`Reply`]). The runner's stdout and stderr are the
//! candidate's output: captured, truncated, never parsed ([`RunnerProcess::output`]).
//!
//! Life of a runner: spawn (hardening, Landlock for the staging directory it will load from,
//! CUDA initialized with eager module loading, the shared CUDA runtime preloaded) ->
//! [`Reply::Ready`] -> [`Request::Load`] (opens the arena and the events, installs the seccomp
//! allow-list, `dlopen`s the candidate: its constructors run inside the sandbox) ->
//! [`Reply::Loaded`] -> any number of [`Request::Run`] / [`Request::Sync`] -> exit. A runner
//! serves one candidate (or one baseline) and is never reused.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Environment variables a runner inherits (everything else is cleared).
pub const KEPT_ENV: &[&str] = &[
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDARL_SANDBOX_LOG",
    "CUDARL_ALLOW_UNCONFINED",
];

/// Bytes of candidate output (stdout and stderr, each) kept: the last this many.
pub const OUTPUT_KEEP: usize = 4096;

/// A request from the judge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Load the candidate.
    Load(Load),
    /// Enqueue one window on the legacy default stream (tests and timing alike): the poison
    /// kernel ([`Run::poison`]), a wait on the `go` event, the candidate once per rep, a record
    /// of the `done` event; answered with [`Reply::Armed`] as soon as everything is enqueued
    /// (nothing waits on the GPU).
    Run(Run),
    /// Call the candidate once per rep on the legacy default stream, synchronize the whole
    /// context and answer [`Reply::Launched`] (the profile pass: no events).
    Launch(Run),
    /// Synchronize the whole context (work the candidate left on any stream) and answer
    /// [`Reply::Synced`].
    Sync,
    /// Exit.
    Exit,
}

/// [`Request::Load`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Load {
    /// The candidate's shared object, inside the runner's staging directory.
    pub so: PathBuf,
    /// The device arena every buffer lives in, with the GPU; `None` on a machine without one
    /// (the runner only loads the candidate).
    pub arena: Option<Arena>,
}

/// Bytes at the start of the arena reserved for the fallback window words; buffers start after
/// them.
pub const CONTROL_BYTES: u64 = 512;
/// Arena offset of the fallback `go` word (u32): the judge's stream writes a window's number to
/// it when the window starts (only where the window events could not be opened).
pub const GO_OFFSET: u64 = 0;
/// Arena offset of the fallback `done` word (u32): the runner's stream writes the window's
/// number to it after the window's launches.
pub const DONE_OFFSET: u64 = 256;

pub use crate::profile::NOOP_KERNEL;

/// Name of the runner's shared-memory poison kernel: before every window it fills the dynamic
/// shared memory of every SM (one block per SM at the device's opt-in maximum, 227 KiB on an
/// H200) with the window's 32-bit pattern, so nothing an earlier launch left there reaches a
/// later one.
pub const POISON_KERNEL: &str = "cudarl_poison";

/// [`Reply::Armed`]'s `rc` when the window's wait on `go` could not be enqueued (the runner's
/// own failures are negative; a candidate's return value is a `cudaError_t`).
pub const GO_FAILED: i32 = -2;
/// [`Reply::Armed`]'s `rc` when a calibration window's empty kernel failed to launch.
pub const NOOP_FAILED: i32 = -3;
/// [`Reply::Armed`]'s `rc` when the poison kernel failed to launch.
pub const POISON_FAILED: i32 = -4;
/// [`Reply::Armed`]'s `rc` when the record of `done` (or the write of the fallback word)
/// failed: the judge's wait would see an earlier window's.
pub const DONE_FAILED: i32 = -5;

/// Whether an `rc` of [`Reply::Armed`] is one of the runner's own failures.
pub fn runner_failed(rc: i32) -> bool {
    [GO_FAILED, NOOP_FAILED, POISON_FAILED, DONE_FAILED].contains(&rc)
}

/// A device allocation shared with the runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arena {
    /// `cuIpcGetMemHandle` (hex, 64 bytes).
    pub handle: String,
    /// Size, bytes.
    pub bytes: u64,
    /// `cuIpcGetEventHandle` of the window's `go` event (hex, 64 bytes): the judge records it
    /// when a window starts; the runner's stream waits on it before the window's launches.
    /// Empty (with `done`) when the judge could not create the events: the fallback words.
    pub go: String,
    /// `cuIpcGetEventHandle` of the `done` event (hex, 64 bytes): the runner's stream records it
    /// after the window's launches; the judge's stream waits on it before its stop event.
    pub done: String,
}

/// [`Request::Run`] and [`Request::Launch`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    /// The window's number (the value of the fallback words; 0 for [`Request::Launch`]).
    pub window: u32,
    /// The launches, in order. A window without launches runs the runner's own empty kernel
    /// instead (calibration: the GPU switches to the runner's context as for a candidate).
    pub reps: Vec<Rep>,
    /// The 32-bit pattern the poison kernel ([`POISON_KERNEL`]) writes into every SM's shared
    /// memory before the window's wait on `go`; `None`: no poison.
    #[serde(default)]
    pub poison: Option<u32>,
}

/// One call of the candidate's entry point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rep {
    /// Byte offset of each buffer argument in the arena, in argument order.
    pub buffers: Vec<u64>,
    /// The task's sizes, in `sizes` order.
    pub sizes: Vec<i64>,
    /// Scalar arguments, in argument order.
    pub scalars: Vec<f32>,
}

/// A reply from the runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// Initialized and waiting for [`Request::Load`].
    Ready {
        /// A CUDA context is up.
        gpu: bool,
        /// Landlock enforced the staging directory's confinement.
        confined: bool,
    },
    /// Start-up failed (no driver, no device, ...).
    InitError {
        /// Why.
        message: String,
    },
    /// The candidate is loaded (inside the seccomp sandbox).
    Loaded {
        /// The window events are open. `false`: the driver could not map them in this sandbox,
        /// and windows are ordered by the two words at the start of the arena instead
        /// ([`GO_OFFSET`], [`DONE_OFFSET`]), which the candidate can reach.
        events: bool,
    },
    /// `dlopen`/`dlsym` or the IPC handles failed.
    LoadError {
        /// Why.
        message: String,
    },
    /// A window is enqueued.
    Armed {
        /// The first nonzero value the entry point returned (`cudaGetLastError` after a
        /// launch), 0 if none.
        rc: i32,
    },
    /// The launches of [`Request::Launch`] finished.
    Launched {
        /// As in [`Reply::Armed`].
        rc: i32,
        /// The CUDA error the synchronize returned, if any (the context is then unusable).
        error: Option<String>,
    },
    /// The context synchronized.
    Synced {
        /// The CUDA error it returned, if any (the context is then unusable).
        error: Option<String>,
    },
    /// A denied system call (written by the runner's `SIGSYS` handler).
    Violation {
        /// x86-64 system-call number.
        syscall: i64,
    },
}

/// How the runner ended, or what it answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A reply.
    Reply(Reply),
    /// No reply within the limit; the runner was killed.
    Timeout,
    /// The runner died; with its status and a note (e.g. the system call it was denied).
    Died(String),
}

/// A running `cudarl-pipe-runner`.
pub struct RunnerProcess {
    child: Child,
    ctl: UnixStream,
    replies: Receiver<String>,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The staging directory the runner may read (its candidate goes here); removed on drop.
    pub dir: tempfile::TempDir,
    /// When it was started.
    pub started: Instant,
}

fn keep_tail(buf: &Arc<Mutex<Vec<u8>>>, mut r: impl Read + Send + 'static) {
    let buf = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            let mut b = buf.lock().unwrap_or_else(|e| e.into_inner());
            b.extend_from_slice(&chunk[..n]);
            if b.len() > 2 * OUTPUT_KEEP {
                let cut = b.len() - OUTPUT_KEEP;
                b.drain(..cut);
            }
        }
    });
}

/// The runner binary: `$CUDARL_RUNNER`, else `cudarl-pipe-runner` beside the running executable
/// (see [`crate::sibling_exe`]), else on `PATH`.
pub fn runner_exe() -> PathBuf {
    crate::sibling_exe("CUDARL_RUNNER", "cudarl-pipe-runner")
}

impl RunnerProcess {
    /// Starts a runner: `gpu` initializes CUDA, `cudart` is the shared CUDA runtime to preload
    /// (the library candidates link), `read` more read-only paths (the CUDA driver's and
    /// runtime's directories). The staging directory is created here.
    ///
    /// # Errors
    /// The runner cannot be started (missing binary, no temp dir).
    pub fn spawn(
        gpu: bool,
        cudart: Option<&Path>,
        read: &[PathBuf],
    ) -> std::io::Result<RunnerProcess> {
        Self::start(gpu, cudart, read, None)
    }

    /// Starts a GPU runner under Nsight Compute for a profile pass ([`crate::profile`]): `ncu`
    /// is the process this handle waits for and kills; it writes its CSV to `log` and keeps its
    /// own files in `home` (its `$HOME` and `$TMPDIR`), outside the runner's view but for the
    /// lock directory `home/nvidia/nsight_compute`, which the runner may write.
    ///
    /// # Errors
    /// As [`RunnerProcess::spawn`], or `ncu` cannot be started.
    pub fn spawn_profiled(
        cudart: Option<&Path>,
        ncu: &crate::profile::Ncu,
        log: &Path,
        home: &Path,
    ) -> std::io::Result<RunnerProcess> {
        Self::start(true, cudart, &[], Some((ncu, log, home)))
    }

    fn start(
        gpu: bool,
        cudart: Option<&Path>,
        read: &[PathBuf],
        profiler: Option<(&crate::profile::Ncu, &Path, &Path)>,
    ) -> std::io::Result<RunnerProcess> {
        let dir = tempfile::Builder::new()
            .prefix("cudarl-runner-")
            .tempdir()?;
        let (judge_end, runner_end) = UnixStream::pair()?;
        let mut cmd = match profiler {
            Some((ncu, log, _)) => {
                let mut c = Command::new(&ncu.path);
                c.args(ncu.args(log)).arg(runner_exe());
                c
            }
            None => Command::new(runner_exe()),
        };
        cmd.arg("native").arg("--dir").arg(dir.path());
        if gpu {
            cmd.arg("--gpu");
        }
        if profiler.is_some() {
            cmd.arg("--profiled");
        }
        if let Some(c) = cudart {
            cmd.arg("--cudart").arg(c);
        }
        for r in read {
            cmd.arg("--read").arg(r);
        }
        // Paths a driver installed elsewhere needs (colon-separated), from the environment.
        for (var, flag) in [
            ("CUDARL_RUNNER_READ", "--read"),
            ("CUDARL_RUNNER_WRITE", "--write"),
        ] {
            if let Some(v) = std::env::var_os(var) {
                for p in std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()) {
                    cmd.arg(flag).arg(p);
                }
            }
        }
        // Eager module loading: a lazy load at the first launch would synchronize the context
        // while the judge holds the stream back.
        // A clean environment: the candidate reads nothing of the judge's (no salt, no paths
        // into the store), only what the dynamic loader and the driver need.
        cmd.env_clear();
        for k in KEPT_ENV {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        // No JIT cache on disk (the runner writes no files). One hardware queue per context: the
        // driver creates and destroys contexts one process at a time, and with the default 8
        // queues each runner costs 2-3x more of that serialized time (H200, 8 runners started
        // at once: ready after 0.44 s instead of 0.97 s, reaped after 0.18 s instead of 0.48 s;
        // benchmarks/results/runner_start_cost_h200_2026-11-26.json). Work a candidate
        // puts on other streams then shares the queue of the timed stream, so it is timed too.
        if let Some((_, _, home)) = profiler {
            // ncu's interprocess lock lives under `$TMPDIR/nvidia/nsight_compute`: a directory
            // of the profile pass's own, the one place the profiled runner may write.
            std::fs::create_dir_all(home.join("nvidia").join("nsight_compute"))?;
            cmd.env("HOME", home).env("TMPDIR", home);
        }
        cmd.env("CUDA_MODULE_LOADING", "EAGER")
            .env("CUDA_CACHE_DISABLE", "1")
            .env("CUDA_DEVICE_MAX_CONNECTIONS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let fd: OwnedFd = runner_end.into();
        let raw = fd.as_raw_fd();
        // SAFETY: dup2 onto fd 3 in the child before exec; async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(raw, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        drop(fd);
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        keep_tail(&stdout, child.stdout.take().expect("piped"));
        keep_tail(&stderr, child.stderr.take().expect("piped"));
        let (tx, rx) = channel();
        let reader = judge_end.try_clone()?;
        std::thread::spawn(move || {
            for l in BufReader::new(reader).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(RunnerProcess {
            child,
            ctl: judge_end,
            replies: rx,
            stdout,
            stderr,
            dir,
            started: Instant::now(),
        })
    }

    /// Waits up to `wall` for the process to exit (after [`Request::Exit`]); `false` if it did
    /// not.
    pub fn wait_exit(&mut self, wall: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < wall {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Sends a request.
    ///
    /// # Errors
    /// The runner's end is closed (it died).
    pub fn send(&mut self, r: &Request) -> std::io::Result<()> {
        let line = serde_json::to_string(r).expect("request serializes");
        writeln!(self.ctl, "{line}")?;
        self.ctl.flush()
    }

    /// Waits up to `wait` for the next reply; `None` if none came yet (the runner keeps running).
    pub fn try_recv(&mut self, wait: Duration) -> Option<Answer> {
        match self.replies.recv_timeout(wait) {
            Ok(l) => Some(self.answer_of(l)),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Answer::Died(self.status())),
        }
    }

    /// Waits up to `wall` for the next reply. A line that is not a [`Reply`] (the candidate can
    /// write to the socket too) counts as a dead runner; so does a closed socket.
    pub fn recv(&mut self, wall: Duration) -> Answer {
        match self.replies.recv_timeout(wall) {
            Ok(l) => self.answer_of(l),
            Err(RecvTimeoutError::Timeout) => {
                self.kill();
                Answer::Timeout
            }
            Err(RecvTimeoutError::Disconnected) => Answer::Died(self.status()),
        }
    }

    fn answer_of(&mut self, l: String) -> Answer {
        match serde_json::from_str::<Reply>(&l) {
            Ok(Reply::Violation { syscall }) => {
                self.kill();
                Answer::Died(format!(
                    "sandbox violation: denied system call `{}` ({syscall})",
                    cudarl_sandbox::syscalls::name(syscall)
                ))
            }
            Ok(r) => Answer::Reply(r),
            Err(_) => {
                self.kill();
                Answer::Died(format!(
                    "the runner sent an unreadable line ({} bytes)",
                    l.len()
                ))
            }
        }
    }

    /// Sends `r` and waits for its reply.
    pub fn call(&mut self, r: &Request, wall: Duration) -> Answer {
        if self.send(r).is_err() {
            return Answer::Died(self.status());
        }
        self.recv(wall)
    }

    /// The exit status, once the runner ended (waits for it), with the violation it reported.
    fn status(&mut self) -> String {
        let st = self.child.wait();
        match st {
            Ok(s) if s.code() == Some(cudarl_sandbox::VIOLATION_EXIT) => {
                "sandbox violation: the runner made a denied system call".into()
            }
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                match s.signal() {
                    Some(libc::SIGSYS) => {
                        "sandbox violation: the runner was killed by SIGSYS (a denied system call)"
                            .into()
                    }
                    Some(sig) => format!("the runner died (signal {sig})"),
                    None => format!("the runner exited ({s})"),
                }
            }
            Err(e) => format!("the runner is gone ({e})"),
        }
    }

    /// Kills the runner and its process group and waits until the runner is gone (its CUDA
    /// context destroyed with it).
    pub fn kill(&mut self) {
        self.signal_kill();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGKILL to the runner's process group without waiting; the runner is reaped by
    /// [`RunnerProcess::kill`] or on drop (until then its pid is not reused).
    pub fn signal_kill(&mut self) {
        // SAFETY: signals the runner's own process group (it is the group leader, not reaped).
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
    }

    /// The candidate's output so far: stdout and stderr, each its last [`OUTPUT_KEEP`] bytes,
    /// lossily decoded.
    pub fn output(&self) -> String {
        let tail = |b: &Arc<Mutex<Vec<u8>>>| {
            let b = b.lock().unwrap_or_else(|e| e.into_inner());
            let s = &b[b.len().saturating_sub(OUTPUT_KEEP)..];
            String::from_utf8_lossy(s).into_owned()
        };
        let (o, e) = (tail(&self.stdout), tail(&self.stderr));
        match (o.is_empty(), e.is_empty()) {
            (true, true) => String::new(),
            (false, true) => o,
            (true, false) => e,
            (false, false) => format!("{o}\n{e}"),
        }
    }

    /// The runner's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        let _ = self.send(&Request::Exit);
        self.kill();
    }
}

/// Hex of `bytes` (IPC handles on the protocol).
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of hex `s`, `None` if it is not hex of even length.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The control socket the runner finds on file descriptor 3, as a plain file: reads and writes
/// are `read(2)`/`write(2)`, the calls the runner's seccomp allow-list has (`send`/`recv` on
/// a socket are not on it).
///
/// # Safety
/// Fd 3 must be the control socket the judge passed.
pub unsafe fn control_socket() -> std::fs::File {
    // SAFETY: per the caller's contract.
    unsafe { std::fs::File::from_raw_fd(3) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_lines_round_trip_and_reject_unknown_fields() {
        let r = Request::Run(Run {
            window: 1,
            reps: vec![Rep {
                buffers: vec![0, 4096],
                sizes: vec![1024],
                scalars: vec![0.5],
            }],
            poison: Some(0xdead_beef),
        });
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        assert_eq!(
            serde_json::to_string(&Reply::Armed { rc: 0 }).unwrap(),
            r#"{"armed":{"rc":0}}"#
        );
        assert!(serde_json::from_str::<Reply>(r#"{"armed":{"rc":0,"ms":1.0}}"#).is_err());
        // The SIGSYS reporter's line is a reply.
        assert_eq!(
            serde_json::from_str::<Reply>(r#"{"violation":{"syscall":59}}"#).unwrap(),
            Reply::Violation { syscall: 59 }
        );
        assert_eq!(
            from_hex(&to_hex(&[0, 1, 254, 255])).unwrap(),
            vec![0, 1, 254, 255]
        );
        assert!(from_hex("abc").is_none() && from_hex("zz").is_none());
    }
}
