//! The Python worker (`python/cudarl_worker.py`): a real `python3` process with torch, spoken
//! to in JSON lines. Used for KernelBench signatures and tests (`kb-specs`, `testgen`) and for
//! extracting and building torch-format candidates; the GPU runs of torch-format candidates go
//! through a [`crate::worker::WorkerPool`] of the same script (`--limits`,
//! [`crate::torchfmt::pool`]), so a hang or crash there is contained like the native worker's.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Why the Python side could not do its part: the interpreter would not start, is not the
/// one the pipeline needs, a pipe failed, or the worker answered outside its protocol. The
/// message names the interpreter or the answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PythonError(pub String);

/// The worker script, relative to the project root.
pub const SCRIPT: &str = "python/cudarl_worker.py";

/// The worker script's bytes (part of every row-memo key of the stages that use it).
///
/// # Errors
/// The script cannot be read ([`PythonError`] names it).
pub fn script_source(root: &Path) -> Result<Vec<u8>, PythonError> {
    std::fs::read(root.join(SCRIPT)).map_err(|e| PythonError(format!("{SCRIPT}: {e}")))
}

/// Torch's build environment, from the Python worker's `build_env`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TorchEnv {
    /// `-isystem` directories (torch's and Python's headers).
    pub include_dirs: Vec<String>,
    /// `-L` directories (torch's libraries).
    pub library_dirs: Vec<String>,
    /// `_GLIBCXX_USE_CXX11_ABI` of the torch build.
    pub cxx11_abi: bool,
    /// torch version.
    pub torch: String,
}

impl TorchEnv {
    /// Asks the worker.
    ///
    /// # Errors
    /// The worker failed or answered something else.
    pub fn query(py: &mut PyWorker) -> Result<TorchEnv, PythonError> {
        let a = py.call(&json!({"op": "build_env"}))?;
        serde_json::from_value(a.clone())
            .map_err(|e| PythonError(format!("build_env answer {a}: {e}")))
    }
}

/// The Python interpreter for workers: `$CUDARL_PYTHON`, `<root>/.venv/bin/python`,
/// `$VIRTUAL_ENV/bin/python`, else `python3` on `PATH`.
pub fn python(root: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("CUDARL_PYTHON") {
        return PathBuf::from(p);
    }
    let venvs = std::iter::once(root.join(".venv"))
        .chain(std::env::var_os("VIRTUAL_ENV").map(PathBuf::from));
    for v in venvs {
        let p = v.join("bin/python");
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from("python3")
}

/// `"<python> <torch>"` versions of the worker's interpreter, read once per process from the
/// package metadata (importing torch would cost seconds on every key computation: `status`, a
/// cached `run`).
///
/// # Errors
/// The interpreter does not run or has no torch (the message says `make setup`).
pub fn python_versions(root: &Path) -> Result<String, PythonError> {
    static VERSIONS: std::sync::OnceLock<Result<String, PythonError>> = std::sync::OnceLock::new();
    let py = python(root);
    VERSIONS
        .get_or_init(|| {
            let o = Command::new(&py)
                .args([
                    "-c",
                    "import sys, importlib.metadata as m; print(sys.version.split()[0], m.version('torch'))",
                ])
                .output()
                .map_err(|e| PythonError(format!("{}: {e}", py.display())))?;
            if !o.status.success() {
                return Err(PythonError(format!(
                    "{} has no torch (run `make setup`): {}",
                    py.display(),
                    String::from_utf8_lossy(&o.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                )));
            }
            Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
        })
        .clone()
}

/// A running Python worker (`python/cudarl_worker.py`): requests and answers are JSON lines.
pub struct PyWorker {
    /// The project root it was started from (the sandboxed extraction runs the same script).
    pub root: PathBuf,
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::Lines<BufReader<std::process::ChildStdout>>,
    /// The worker's hello: python and torch versions.
    pub hello: Value,
}

impl PyWorker {
    /// Starts the worker under `root` and reads its hello line.
    ///
    /// # Errors
    /// The interpreter or torch is missing, or the hello is not JSON (the message carries the
    /// worker's stderr).
    pub fn start(root: &Path) -> Result<PyWorker, PythonError> {
        let py = python(root);
        let script = root.join(SCRIPT);
        let mut child = Command::new(&py)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                PythonError(format!("start {} {}: {e}", py.display(), script.display()))
            })?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        // stderr is drained in the background (warnings from problems), kept for errors.
        let mut stderr = child.stderr.take().expect("piped");
        let tail = Arc::new(std::sync::Mutex::new(String::new()));
        let t2 = tail.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
            *t2.lock().unwrap_or_else(|e| e.into_inner()) = s;
        });
        let hello = match stdout.next() {
            Some(Ok(l)) => serde_json::from_str::<Value>(&l)
                .map_err(|e| PythonError(format!("worker hello: {e}: {l}")))?,
            _ => {
                let _ = child.wait();
                std::thread::sleep(std::time::Duration::from_millis(50));
                let t = tail.lock().unwrap_or_else(|e| e.into_inner()).clone();
                return Err(PythonError(format!(
                    "the Python worker ({}) did not start: {}",
                    py.display(),
                    t.lines().last().unwrap_or("no output")
                )));
            }
        };
        Ok(PyWorker {
            root: root.to_path_buf(),
            child,
            stdin,
            stdout,
            hello,
        })
    }

    /// Sends one request and reads its answer.
    ///
    /// # Errors
    /// The worker died (its answer is missing) or answered something that is not JSON.
    pub fn call(&mut self, req: &Value) -> Result<Value, PythonError> {
        writeln!(self.stdin, "{req}").map_err(|e| PythonError(format!("worker stdin: {e}")))?;
        self.stdin
            .flush()
            .map_err(|e| PythonError(format!("worker stdin: {e}")))?;
        match self.stdout.next() {
            Some(Ok(l)) => serde_json::from_str(&l)
                .map_err(|e| PythonError(format!("worker answer: {e}: {l}"))),
            _ => Err(PythonError(
                "the Python worker exited without answering".into(),
            )),
        }
    }
}

/// Where the worker's interpreter lives: what the interpreter sandbox must let it read and
/// execute.
#[derive(Debug, Clone, serde::Deserialize)]
struct PythonPaths {
    prefix: PathBuf,
    base: PathBuf,
    exec_prefix: PathBuf,
    base_exec: PathBuf,
    exe: PathBuf,
    /// `sys.executable`: the absolute path the interpreter was started as (a venv's own
    /// `bin/python`, so its site-packages apply), for a sandbox with no `PATH` to search.
    invoked: PathBuf,
    site: Vec<PathBuf>,
}

fn python_paths(root: &Path) -> Result<PythonPaths, PythonError> {
    static PATHS: std::sync::OnceLock<Result<PythonPaths, PythonError>> =
        std::sync::OnceLock::new();
    let py = python(root);
    PATHS
        .get_or_init(|| {
            let o = Command::new(&py)
                .args([
                    "-c",
                    "import sys, os, site, json; print(json.dumps({'prefix': sys.prefix, 'base': sys.base_prefix, 'exec_prefix': sys.exec_prefix, 'base_exec': sys.base_exec_prefix, 'exe': os.path.realpath(sys.executable), 'invoked': sys.executable, 'site': site.getsitepackages()}))",
                ])
                .output()
                .map_err(|e| PythonError(format!("{}: {e}", py.display())))?;
            serde_json::from_slice(&o.stdout)
                .map_err(|e| PythonError(format!("{}: its paths: {e}", py.display())))
        })
        .clone()
}

/// What the sandboxed extraction of a `ModelNew` file gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Extracted {
    /// The worker's answer (`ok`, `error`, `calls`).
    Answer(Value),
    /// The candidate's code made a system call the sandbox forbids (the process was killed).
    Violation(String),
    /// It did not finish within the limit.
    Timeout,
}

/// A Python process of the worker script inside the interpreter sandbox
/// (`cudarl-pipe-runner exec --profile interpreter`): its command line and its whole environment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SandboxedPython {
    /// The sandbox wrapper, its policy, `--`, the interpreter, the script and its mode.
    pub argv: Vec<String>,
    /// The environment (nothing else is inherited): `HOME` and `TMPDIR` the scratch directory,
    /// and the sandbox's and the loader's settings when set.
    pub env: Vec<(String, String)>,
}

/// The worker script in `mode` (`--extract`, `--torch-zygote`) inside the interpreter sandbox:
/// it reads only the interpreter's own files, the worker script, `/proc` and `/sys` (with
/// `gpu`, also what the driver reads and the GPU's device files); it writes only to `scratch`
/// (its `HOME` and `TMPDIR`) and `writes`; once filtered, it starts no process and opens no
/// socket. With `gpu` the system-call filters are handed to the script (`--defer-filter`),
/// which installs them once CUDA is up and before the candidate loads (the zygote forks its
/// runners unfiltered, and each runner installs them); Landlock and the limits hold from the
/// start.
///
/// # Errors
/// The interpreter's paths cannot be read (it does not run).
pub fn sandboxed_python(
    root: &Path,
    scratch: &Path,
    writes: &[PathBuf],
    gpu: bool,
    mode: &str,
) -> Result<SandboxedPython, PythonError> {
    let paths = python_paths(root)?;
    let s = |p: &Path| p.display().to_string();
    let mut argv = vec![
        s(&crate::runner::runner_exe()),
        "exec".into(),
        "--profile".into(),
        "interpreter".into(),
    ];
    if gpu {
        // CUDA's initialization makes calls the filters trap: the runner installs them itself
        // once CUDA is up, before the candidate loads (`install_handed_filters`).
        argv.extend(["--gpu".into(), "--defer-filter".into()]);
    }
    let mut all: Vec<PathBuf> = vec![
        paths.prefix.clone(),
        paths.base.clone(),
        paths.exec_prefix.clone(),
        paths.base_exec.clone(),
        root.join(SCRIPT),
        PathBuf::from("/proc"),
        PathBuf::from("/sys"),
        PathBuf::from("/etc/localtime"),
    ];
    all.extend(paths.site.iter().cloned());
    for r in all {
        argv.extend(["--read".into(), s(&r)]);
    }
    argv.extend(["--exec".into(), s(&paths.exe)]);
    for d in ["/dev/null", "/dev/urandom"] {
        argv.extend(["--device".into(), d.into()]);
    }
    for w in std::iter::once(scratch).chain(writes.iter().map(PathBuf::as_path)) {
        argv.extend(["--write".into(), s(w)]);
    }
    argv.push("--".into());
    argv.extend([s(&paths.invoked), s(&root.join(SCRIPT)), mode.into()]);
    let mut env = vec![
        ("HOME".to_string(), s(scratch)),
        ("TMPDIR".to_string(), s(scratch)),
        // `getpass.getuser()` (torch's profiler imports reach it) reads these before the
        // password database, which the sandbox hides.
        ("USER".to_string(), "cudarl".to_string()),
        ("LOGNAME".to_string(), "cudarl".to_string()),
        ("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string()),
        ("OMP_NUM_THREADS".to_string(), "1".to_string()),
    ];
    for k in [
        "CUDARL_SANDBOX_LOG",
        "CUDARL_ALLOW_UNCONFINED",
        "LD_LIBRARY_PATH",
    ] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.to_string(), v));
        }
    }
    Ok(SandboxedPython { argv, env })
}

/// Executes a KernelBench `ModelNew` file with `load_inline` recorded (the worker script's
/// `--extract` mode) in a one-shot Python process inside the interpreter sandbox
/// (`cudarl-pipe-runner exec --profile interpreter`): it reads only the interpreter's own files,
/// the worker script, `/proc` and `/sys`; it writes only to a private scratch directory removed
/// afterwards (torch's import wants a temp dir); it starts no process and opens no socket.
/// The candidate's prints are its own (discarded); the answer comes on file descriptor 3.
///
/// # Errors
/// The sandbox or the interpreter cannot be started (a harness failure, not the candidate's).
pub fn extract_inline(
    root: &Path,
    code: &str,
    timeout: std::time::Duration,
) -> Result<Extracted, PythonError> {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    // A private, empty scratch directory is the only writable place (torch's import asks for a
    // usable temp dir); it is removed with this function's return.
    let scratch = tempfile::tempdir().map_err(|e| PythonError(format!("temp dir: {e}")))?;
    let sb = sandboxed_python(root, scratch.path(), &[], false, "--extract")?;
    let mut cmd = Command::new(&sb.argv[0]);
    cmd.args(&sb.argv[1..]);
    cmd.env_clear().envs(sb.env.iter().map(|(k, v)| (k, v)));
    let mut fds = [0i32; 2];
    // SAFETY: a pipe for the answer; both ends owned below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(PythonError(format!(
            "pipe: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: the descriptors were just created and are owned here.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let w = write_end.as_raw_fd();
    // SAFETY: dup2 in the child before exec; async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(w, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| PythonError(format!("start the interpreter sandbox: {e}")))?;
    drop(write_end);
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(code.as_bytes());
    }
    let mut stderr = child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut answer_reader = std::fs::File::from(read_end);
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = answer_reader.read_to_string(&mut s);
        s
    });
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| PythonError(e.to_string()))? {
            break Some(st);
        }
        if t0.elapsed() > timeout {
            // SAFETY: signals the process group this function started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let answer = reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    let Some(status) = status else {
        return Ok(Extracted::Timeout);
    };
    if status.signal() == Some(libc::SIGSYS) {
        return Ok(Extracted::Violation(
            "executing the ModelNew file made a system call the sandbox forbids (it was killed by SIGSYS)".into(),
        ));
    }
    if status.code() == Some(125) {
        return Err(PythonError(format!(
            "the interpreter sandbox could not be set up: {}",
            err.lines().last().unwrap_or("")
        )));
    }
    match answer.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(l) => serde_json::from_str(l)
            .map(Extracted::Answer)
            .map_err(|e| PythonError(format!("extraction answer: {e}"))),
        None => Ok(Extracted::Answer(serde_json::json!({
            "ok": false,
            "error": format!(
                "the interpreter exited ({status}) without an answer: {}",
                err.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ")
            ),
        }))),
    }
}

impl Drop for PyWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
