//! The trainer process `cudarl-pipe-train` seen from the pipeline (docs/architecture.md, "The
//! trainer protocol"): one-shot jobs ([`run_job`]) and the long-lived RL trainer
//! ([`TrainerClient`]), which is also the [`Policy`] episodes sample from. The wire types are
//! `cudarl_protocol`'s; an answer that does not parse as one is an error, never a default.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use cudarl_protocol::{Event, Generated, Job, Reply, Request, RlServe, Role, Sample, UpdateStats};

use crate::RlError;
use crate::episode::{Answer, Ask, Policy};

/// The trainer binary: `$CUDARL_TRAINER`, else `cudarl-pipe-train` beside the running binary.
pub fn trainer_exe() -> PathBuf {
    cudarl_cuda::sibling_exe("CUDARL_TRAINER", "cudarl-pipe-train")
}

/// How a one-shot job failed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The trainer refused the job's input (exit code 2): the message, without the job
    /// file's temporary path.
    #[error("{0}")]
    BadInput(String),
    /// It could not start, failed otherwise, or printed a line that is not an [`Event`].
    #[error("{0}")]
    Failed(String),
    /// The caller asked to stop (its `stop` answered true): the trainer was ended.
    #[error("interrupted: the trainer was stopped")]
    Interrupted,
}

/// The trainer on job file `job`: its own process group, so a terminal's Ctrl-C reaches the CLI
/// alone, which stops the run at a safe point (the `stop` of [`run_job_with`]) and ends the trainer;
/// and `PR_SET_PDEATHSIG` (SIGKILL), so a CLI that dies at once (a second Ctrl-C, a kill)
/// leaves no trainer behind.
fn trainer_command(exe: &Path, job: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg(job).process_group(0);
    // SAFETY: prctl is async-signal-safe; the child dies with the thread that started it.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// Runs `job` to completion (written to `dir/job.json`); its events in order.
///
/// # Errors
/// As [`run_job_with`].
pub fn run_job(job: &Job, dir: &Path) -> Result<Vec<Event>, JobError> {
    run_job_with(job, dir, &mut |_| {}, &|| false)
}

/// Runs `job` to completion (written to `dir/job.json`, the trainer's stderr to
/// `dir/trainer.log`), calling `on_event` with each event as the trainer prints it (a step's
/// metrics as the step ends); its events in order. Asks `stop` every 100 ms (the CLI passes
/// its interrupt flag) and ends the trainer when it answers true.
///
/// # Errors
/// [`JobError::BadInput`] when the trainer exits with 2 (bad data, a bad model file, a field
/// the job cannot have), [`JobError::Interrupted`] after `stop`, [`JobError::Failed`]
/// otherwise, with the tail of its stderr.
pub fn run_job_with(
    job: &Job,
    dir: &Path,
    on_event: &mut dyn FnMut(&Event),
    stop: &dyn Fn() -> bool,
) -> Result<Vec<Event>, JobError> {
    use std::io::BufRead;
    use std::sync::mpsc::{RecvTimeoutError, channel};
    let failed = |e: String| JobError::Failed(e);
    let jp = dir.join("job.json");
    let text = serde_json::to_string(job).expect("a job serializes");
    std::fs::write(&jp, text).map_err(|e| failed(format!("{}: {e}", jp.display())))?;
    let log = dir.join("trainer.log");
    let err = std::fs::File::create(&log).map_err(|e| failed(format!("{}: {e}", log.display())))?;
    let exe = trainer_exe();
    let mut child = trainer_command(&exe, &jp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .map_err(|e| {
            failed(format!(
                "cannot run the trainer `{}` (set CUDARL_TRAINER, or build it: make build): {e}",
                exe.display()
            ))
        })?;
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(l) = line else { break };
            if !l.trim().is_empty() && tx.send(l).is_err() {
                break;
            }
        }
    });
    let (mut events, mut bad) = (Vec::new(), None);
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(100)) {
            Ok(l) => match serde_json::from_str::<Event>(&l) {
                Ok(e) => {
                    on_event(&e);
                    events.push(e);
                }
                Err(e) => {
                    bad.get_or_insert(format!("trainer printed `{l}`: {e}"));
                }
            },
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if stop() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(JobError::Interrupted);
        }
    }
    let status = child.wait().map_err(|e| failed(e.to_string()))?;
    let _ = reader.join();
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let tail = last_lines(&stderr, 5);
    match status.code() {
        Some(0) => {}
        Some(2) => {
            return Err(JobError::BadInput(
                tail.replace(&format!("error: {}: ", jp.display()), ""),
            ));
        }
        _ => return Err(failed(format!("trainer failed ({status}): {tail}"))),
    }
    match bad {
        Some(b) => Err(failed(b)),
        None => Ok(events),
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().rev().take(n).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Sampling settings of a [`TrainerClient`].
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// Most new tokens per answer.
    pub max_new_tokens: usize,
    /// Temperature.
    pub temperature: f64,
    /// Nucleus mass.
    pub top_p: f64,
    /// First seed (incremented per `generate`).
    pub seed: i64,
    /// Constrained decoding of the launcher declaration each conversation asks for
    /// (`Request::Generate`'s `launchers`).
    pub constrain_launcher: bool,
}

/// The RL trainer process (`cudarl-pipe-train` with an `rl-serve` job): [`Request`]s on its
/// stdin, [`Reply`]s on its stdout; its stderr goes to a log file whose tail is quoted if it
/// dies.
pub struct TrainerClient {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    log: PathBuf,
    /// Sampling settings.
    pub sampling: Sampling,
    /// Seconds spent generating (sum of the trainer's own timings).
    pub gen_seconds: f64,
}

impl TrainerClient {
    /// Starts the trainer on `job` (written to `dir/rl-serve.json`) and waits until it has
    /// loaded both agents.
    ///
    /// # Errors
    /// The trainer cannot start or fails while loading (its message; a bad checkpoint).
    pub fn start(job: &RlServe, dir: &Path, sampling: Sampling) -> Result<TrainerClient, RlError> {
        let jp = dir.join("rl-serve.json");
        let text = serde_json::to_string(&Job::RlServe(job.clone())).expect("a job serializes");
        std::fs::write(&jp, text).map_err(|e| RlError::Failed(e.to_string()))?;
        let log = dir.join("trainer.log");
        let err = std::fs::File::create(&log).map_err(|e| RlError::Failed(e.to_string()))?;
        let exe = trainer_exe();
        let mut cmd = trainer_command(&exe, &jp);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(err);
        let mut child = cmd
            .spawn()
            .map_err(|e| RlError::Failed(format!("start {}: {e}", exe.display())))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut c = TrainerClient {
            child,
            stdin,
            stdout,
            log,
            sampling,
            gen_seconds: 0.0,
        };
        match c.read()? {
            Reply::Ready => Ok(c),
            other => Err(RlError::Failed(format!(
                "trainer: expected `ready`, got {other:?}"
            ))),
        }
    }

    fn died(&mut self) -> RlError {
        let _ = self.child.wait();
        let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
        RlError::Failed(format!("trainer process ended: {}", last_lines(&tail, 5)))
    }

    fn read(&mut self) -> Result<Reply, RlError> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) | Err(_) => return Err(self.died()),
            Ok(_) => {}
        }
        match serde_json::from_str(&line) {
            Ok(Reply::Error(e)) => Err(RlError::Failed(format!("trainer: {e}"))),
            Ok(r) => Ok(r),
            Err(e) => Err(RlError::Failed(format!(
                "trainer answered `{}`: {e}",
                line.trim_end()
            ))),
        }
    }

    /// Sends one request; hands each `partial` reply to `on_partial` as it arrives and
    /// returns the final reply.
    fn send(
        &mut self,
        req: &Request,
        on_partial: &mut dyn FnMut(usize, &str),
    ) -> Result<Reply, RlError> {
        let line = serde_json::to_string(req).expect("a request serializes");
        if writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .is_err()
        {
            return Err(self.died());
        }
        loop {
            match self.read()? {
                Reply::Partial { index, text } => on_partial(index, &text),
                r => return Ok(r),
            }
        }
    }

    /// Samples one completion per conversation from `agent` with the next seed.
    ///
    /// # Errors
    /// The trainer reported an error, died, or answered something else.
    pub fn generate(
        &mut self,
        ask: Ask<'_>,
        on_finish: &mut dyn FnMut(usize, &str),
    ) -> Result<Generated, RlError> {
        let s = next_seed(&mut self.sampling);
        self.sample(ask, &s, false, on_finish)
    }

    /// One completion per conversation from `agent`'s policy, or with `reference` from its
    /// frozen reference, with sampling `s`.
    fn sample(
        &mut self,
        ask: Ask<'_>,
        s: &Sampling,
        reference: bool,
        on_finish: &mut dyn FnMut(usize, &str),
    ) -> Result<Generated, RlError> {
        let launchers = if s.constrain_launcher {
            ask.launchers.to_vec()
        } else {
            Vec::new()
        };
        let req = Request::Generate {
            launchers,
            agent: ask.role,
            conversations: ask.conversations.to_vec(),
            max_new_tokens: s.max_new_tokens,
            temperature: s.temperature,
            top_p: s.top_p,
            seed: s.seed,
            stream: true,
            reference,
        };
        match self.send(&req, on_finish)? {
            Reply::Generated(g) => {
                self.gen_seconds += g.seconds;
                Ok(g)
            }
            other => Err(unexpected("generated", &other)),
        }
    }

    /// The frozen references of both agents as a [`Policy`] with its own sampling state
    /// `sampling` (its seed advancing per generation as the policy's does): `rl-train`'s frozen
    /// control, which answers the same tasks with the same seeds as the policy without moving
    /// the policy's sampling (with constrained decoding, the draws of the second pass depend on
    /// which rows reach it, in each apart). Its answers have no id and cannot be trained on.
    pub fn frozen(&mut self, sampling: Sampling) -> FrozenReference<'_> {
        FrozenReference {
            trainer: self,
            sampling,
        }
    }

    /// One update of `agent` on kept completions.
    ///
    /// # Errors
    /// The trainer reported an error (an unknown id, a PPO sample without its return), died,
    /// or answered something else.
    pub fn update(&mut self, agent: Role, samples: Vec<Sample>) -> Result<UpdateStats, RlError> {
        match self.send(&Request::Update { agent, samples }, &mut |_, _| {})? {
            Reply::Updated(st) => Ok(st),
            other => Err(unexpected("updated", &other)),
        }
    }

    /// Writes both agents to `dir/generator` and `dir/optimizer`.
    ///
    /// # Errors
    /// The trainer reported an error, died, or answered something else.
    pub fn save(&mut self, dir: &Path) -> Result<(), RlError> {
        self.state_request(Request::Save {
            dir: dir.to_path_buf(),
        })
    }

    /// Writes the trainer's training state to `dir` (`save_state`).
    ///
    /// # Errors
    /// The trainer's error (a file it could not write) or a dead process.
    pub fn save_state(&mut self, dir: &Path) -> Result<(), RlError> {
        self.state_request(Request::SaveState {
            dir: dir.to_path_buf(),
        })
    }

    /// Loads a training state [`TrainerClient::save_state`] wrote for the same job.
    ///
    /// # Errors
    /// The trainer's error (a missing or misshapen file, named) or a dead process.
    pub fn load_state(&mut self, dir: &Path) -> Result<(), RlError> {
        self.state_request(Request::LoadState {
            dir: dir.to_path_buf(),
        })
    }

    fn state_request(&mut self, req: Request) -> Result<(), RlError> {
        match self.send(&req, &mut |_, _| {})? {
            Reply::Saved { .. } => Ok(()),
            other => Err(unexpected("saved", &other)),
        }
    }

    /// Ends the process.
    pub fn quit(mut self) {
        let line = serde_json::to_string(&Request::Quit).expect("a request serializes");
        let _ = writeln!(self.stdin, "{line}");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

impl Drop for TrainerClient {
    /// A client dropped without [`TrainerClient::quit`] (a failed or interrupted stage) ends
    /// its trainer and reaps it.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn unexpected(want: &str, got: &Reply) -> RlError {
    RlError::Failed(format!("trainer: expected `{want}`, got {got:?}"))
}

impl Policy for TrainerClient {
    fn answer(
        &mut self,
        ask: Ask<'_>,
        on_finish: &mut dyn FnMut(usize, &str),
    ) -> Result<Vec<Answer>, RlError> {
        Ok(answers(self.generate(ask, on_finish)?))
    }

    fn generation_seconds(&self) -> f64 {
        self.gen_seconds
    }
}

/// The frozen references of a trainer's agents with their own sampling state
/// ([`TrainerClient::frozen`]).
pub struct FrozenReference<'a> {
    trainer: &'a mut TrainerClient,
    /// Its sampling state: the next seed is `sampling.seed`.
    pub sampling: Sampling,
}

impl Policy for FrozenReference<'_> {
    fn answer(
        &mut self,
        ask: Ask<'_>,
        on_finish: &mut dyn FnMut(usize, &str),
    ) -> Result<Vec<Answer>, RlError> {
        let s = next_seed(&mut self.sampling);
        let g = self.trainer.sample(ask, &s, true, on_finish)?;
        Ok(answers(g))
    }

    fn generation_seconds(&self) -> f64 {
        self.trainer.gen_seconds
    }
}

/// The sampling settings of the next generation from state `s`, whose seed moves on by one.
fn next_seed(s: &mut Sampling) -> Sampling {
    let now = s.clone();
    s.seed += 1;
    now
}

fn answers(g: Generated) -> Vec<Answer> {
    g.completions
        .into_iter()
        .map(|c| Answer {
            id: c.id,
            text: c.text,
            tokens: c.tokens,
            value: c.value,
        })
        .collect()
}
