//! The Python worker (`python/cudarl_worker.py`): a real `python3` process with torch, spoken
//! to in JSON lines. Used for KernelBench signatures and tests (`kb-specs`, `testgen`) and for
//! extracting and building torch-format candidates; the GPU runs of torch-format candidates go
//! through [`crate::worker::WorkerPool`] with the same script (`--limits`), so a hang or crash
//! there is contained like the native worker's.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::Value;

/// The worker script, relative to the project root.
pub const SCRIPT: &str = "python/cudarl_worker.py";

/// The worker script's bytes (part of every row-memo key of the stages that use it).
///
/// # Errors
/// The script cannot be read (message names it).
pub fn script_source(root: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(root.join(SCRIPT)).map_err(|e| format!("{SCRIPT}: {e}"))
}

/// A [`crate::worker::WorkerPool`] of sandboxed Python workers (`--limits`) for GPU jobs
/// (`run_torch`): the same wall-clock limit, hang and crash handling as native candidates.
pub fn pool(root: &Path) -> crate::worker::WorkerPool {
    crate::worker::WorkerPool::new(
        python(root),
        vec![root.join(SCRIPT).display().to_string(), "--limits".into()],
    )
}

/// The Python interpreter for workers: `$CUDARL_PYTHON`, `<root>/.venv/bin/python`, `python3`.
pub fn python(root: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("CUDARL_PYTHON") {
        return PathBuf::from(p);
    }
    let v = root.join(".venv/bin/python");
    if v.is_file() {
        return v;
    }
    PathBuf::from("python3")
}

/// `"<python> <torch>"` versions of the worker's interpreter, read once per process from the
/// package metadata (importing torch would cost seconds on every key computation: `status`, a
/// cached `run`).
///
/// # Errors
/// The interpreter does not run or has no torch (the message says `make setup`).
pub fn python_versions(root: &Path) -> Result<String, String> {
    static VERSIONS: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    let py = python(root);
    VERSIONS
        .get_or_init(|| {
            let o = Command::new(&py)
                .args([
                    "-c",
                    "import sys, importlib.metadata as m; print(sys.version.split()[0], m.version('torch'))",
                ])
                .output()
                .map_err(|e| format!("{}: {e}", py.display()))?;
            if !o.status.success() {
                return Err(format!(
                    "{} has no torch (run `make setup`): {}",
                    py.display(),
                    String::from_utf8_lossy(&o.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                ));
            }
            Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
        })
        .clone()
}

/// A running Python worker (`python/cudarl_worker.py`): requests and answers are JSON lines.
pub struct PyWorker {
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
    pub fn start(root: &Path) -> Result<PyWorker, String> {
        let py = python(root);
        let script = root.join(SCRIPT);
        let mut child = Command::new(&py)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start {} {}: {e}", py.display(), script.display()))?;
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
            Some(Ok(l)) => {
                serde_json::from_str::<Value>(&l).map_err(|e| format!("worker hello: {e}: {l}"))?
            }
            _ => {
                let _ = child.wait();
                std::thread::sleep(std::time::Duration::from_millis(50));
                let t = tail.lock().unwrap_or_else(|e| e.into_inner()).clone();
                return Err(format!(
                    "the Python worker ({}) did not start: {}",
                    py.display(),
                    t.lines().last().unwrap_or("no output")
                ));
            }
        };
        Ok(PyWorker {
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
    pub fn call(&mut self, req: &Value) -> Result<Value, String> {
        writeln!(self.stdin, "{req}").map_err(|e| format!("worker stdin: {e}"))?;
        self.stdin
            .flush()
            .map_err(|e| format!("worker stdin: {e}"))?;
        match self.stdout.next() {
            Some(Ok(l)) => serde_json::from_str(&l).map_err(|e| format!("worker answer: {e}: {l}")),
            _ => Err("the Python worker exited without answering".into()),
        }
    }
}

impl Drop for PyWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
