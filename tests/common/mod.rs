//! Test helpers: a throwaway copy of the project (pipelines, configs, datasets) and the real
//! `cudarl-pipe` binary run as a child process.
#![allow(dead_code)]

pub mod server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root: `$CUDARL_TEST_REPO` (test binaries carried to a GPU host), else
/// two levels above the cli crate.
pub fn repo_root() -> PathBuf {
    if let Some(r) = std::env::var_os("CUDARL_TEST_REPO") {
        return PathBuf::from(r).canonicalize().unwrap();
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        let d = dst.join(e.file_name());
        if p.is_dir() {
            copy_dir(&p, &d);
        } else {
            std::fs::copy(&p, &d).unwrap();
            let mut perm = std::fs::metadata(&d).unwrap().permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perm.set_readonly(false);
            std::fs::set_permissions(&d, perm).unwrap();
        }
    }
}

/// The `cudarl-pipe` binary under test: `$CUDARL_BIN`, else the one cargo built.
pub fn bin() -> PathBuf {
    std::env::var_os("CUDARL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cudarl-pipe")))
}

/// A temporary project: a copy of `pipelines/`, `configs/` and `datasets/`.
pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    /// A copy with two task families (vector_add, row_sum) and no generated ones, so stages
    /// downstream of `validate` compile four kernels, not every family's.
    pub fn new() -> Project {
        let p = Project::full();
        let tasks = p.path("datasets/tasks");
        for e in std::fs::read_dir(&tasks).unwrap().flatten() {
            let keep = ["vector_add", "row_sum"].contains(&e.file_name().to_str().unwrap_or(""));
            if e.path().is_dir() && !keep {
                std::fs::remove_dir_all(e.path()).unwrap();
            }
        }
        // And no generated families (tests that want them set `synth-tasks.generate`), in
        // every pipeline file.
        for f in ["default.toml", "verl.toml"] {
            let pl = p.path("pipelines").join(f);
            let text = std::fs::read_to_string(&pl).unwrap();
            let kept: Vec<&str> = text
                .lines()
                .filter(|l| !l.starts_with("generate = "))
                .collect();
            assert!(kept.len() < text.lines().count(), "{f} has a generate line");
            std::fs::write(&pl, kept.join("\n") + "\n").unwrap();
        }
        p
    }

    /// A copy with every task family. Its pipeline records tests for the first 2 KernelBench
    /// problems of each level (`testgen.limit`) and validates 3 archive kernels per source
    /// (`validate-archive.archive_limit`; torch-format builds are skipped without a GPU anyway), so
    /// tests that build `curriculum` stay quick; `--set` lifts either. (The same for the VERL
    /// pipeline, `pipelines/verl.toml`.)
    pub fn full() -> Project {
        let dir = tempfile::tempdir().unwrap();
        let root = repo_root();
        for d in ["pipelines", "configs", "datasets", "python", "examples"] {
            copy_dir(&root.join(d), &dir.path().join(d));
        }
        for f in ["default.toml", "verl.toml"] {
            let pl = dir.path().join("pipelines").join(f);
            let text = std::fs::read_to_string(&pl)
                .unwrap()
                .replace("[stages.testgen]\n", "[stages.testgen]\nlimit = 2\n")
                .replace(
                    "[stages.validate-archive]\n",
                    "[stages.validate-archive]\narchive_limit = 3\n",
                )
                // What the `cpu` profile turns off (these copies run without it): the archives'
                // kernels in SFT and KernelBench problems in RL (tests that want them set them).
                .replace("\narchive = true ", "\narchive = false ")
                .replace("\nkernelbench_share = 0.25 ", "\nkernelbench_share = 0.0 ");
            std::fs::write(&pl, text).unwrap();
        }
        Project { dir }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn store(&self) -> PathBuf {
        self.path("artifacts")
    }

    /// A command for the real binary (`$CUDARL_BIN` or cargo's), run in the project root.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.current_dir(self.root())
            .args(args)
            .env_remove("CUDARL_FAULT")
            .env_remove("CUDARL_ROOT")
            .env_remove("CUDARL_STORE")
            // The pipeline file's sizes as written: no `cpu` profile picked for want of a GPU
            // (tests of profiles remove this).
            .env("CUDARL_PROFILE", "none");
        // The copy has no .venv: hand it the repository's nvcc (for `validate`).
        if std::env::var_os("CUDARL_NVCC").is_none()
            && let Ok(n) = cudarl_cuda::Nvcc::discover(&repo_root())
        {
            c.env("CUDARL_NVCC", n.path);
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Runs and parses `--json` lines into (node -> object).
    pub fn run_json(
        &self,
        args: &[&str],
    ) -> (i32, std::collections::BTreeMap<String, serde_json::Value>) {
        let mut a: Vec<&str> = args.to_vec();
        a.push("--json");
        let o = self.run(&a);
        (o.status.code().unwrap_or(-1), records(&o))
    }

    /// Every file under the store (relative path -> BLAKE3 of its bytes), for "store
    /// untouched" checks.
    pub fn store_snapshot(&self) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        fn walk(base: &Path, d: &Path, out: &mut std::collections::BTreeMap<String, String>) {
            let Ok(rd) = std::fs::read_dir(d) else { return };
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(base, &p, out);
                } else {
                    let rel = p.strip_prefix(base).unwrap().display().to_string();
                    // Lock files and run logs are bookkeeping, not store content.
                    if rel.starts_with("locks/") || rel.starts_with("runs/") {
                        continue;
                    }
                    out.insert(
                        rel,
                        blake3::hash(&std::fs::read(&p).unwrap())
                            .to_hex()
                            .to_string(),
                    );
                }
            }
        }
        walk(&self.store(), &self.store(), &mut out);
        out
    }
}

/// The `--json` node records of a run's stdout, by node name.
pub fn records(o: &Output) -> std::collections::BTreeMap<String, serde_json::Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("bad json line {line:?}: {e}"));
            (v["node"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

pub fn status_of(m: &std::collections::BTreeMap<String, serde_json::Value>, node: &str) -> String {
    m.get(node)
        .unwrap_or_else(|| panic!("no record for {node}: {m:?}"))["status"]
        .as_str()
        .unwrap()
        .to_string()
}

pub fn out_hash(
    m: &std::collections::BTreeMap<String, serde_json::Value>,
    node: &str,
    output: &str,
) -> String {
    m[node]["outputs"][output]["hash"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Runs `cmd` with `input` on its standard input; its output, both streams captured.
pub fn output_with_stdin(mut cmd: Command, input: &str) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// The Python with the test tools (`$CUDARL_PYTHON`, else the repository's `.venv`); `None`
/// (the caller prints that it skipped) unless `CUDARL_REQUIRE_PYTHON` is set, which makes a
/// missing Python a failure.
#[allow(dead_code)]
pub fn python() -> Option<String> {
    let p = std::env::var("CUDARL_PYTHON").ok().or_else(|| {
        let v = repo_root().join(".venv/bin/python");
        v.exists().then(|| v.display().to_string())
    });
    assert!(
        p.is_some() || std::env::var("CUDARL_REQUIRE_PYTHON").is_err(),
        "CUDARL_REQUIRE_PYTHON set but no python"
    );
    p
}

/// A `ModelNew` for `kb/L1/19_ReLU` whose `forward` body is `tests/kernels/kb/forward_<case>.py`
/// (its leading comment lines head the file), the rest `relu_model_new.py`'s (the honest CUDA
/// ReLU extension, built and loaded as before), written into the project.
pub fn forward_candidate(p: &Project, case: &str) -> PathBuf {
    const CALL: &str = "        return relu_ext.relu_forward(x)\n";
    let kb = repo_root().join("tests/kernels/kb");
    let case_src = std::fs::read_to_string(kb.join(format!("forward_{case}.py"))).unwrap();
    let honest = std::fs::read_to_string(kb.join("relu_model_new.py")).unwrap();
    assert!(honest.contains(CALL), "relu_model_new.py's forward changed");
    let (mut head, mut body) = (String::new(), String::new());
    for l in case_src.lines() {
        if body.is_empty() && l.starts_with('#') {
            head.push_str(l);
            head.push('\n');
        } else if !l.is_empty() {
            body.push_str(&format!("        {l}\n"));
        }
    }
    let rest = honest.split_once('\n').map_or("", |(_, r)| r);
    let path = p.path(&format!("forward_{case}.py"));
    std::fs::write(&path, format!("{head}{}", rest.replace(CALL, &body))).unwrap();
    path
}

/// Runs the binary with `args` and the fault `fault` (`NODE:POINT`, `CUDARL_FAULT`), waits until
/// it pauses there, sends it `signal` and waits for it to end (SIGKILL: a crash or the end of a
/// command's time, no destructors; SIGTERM or SIGINT: a stop request). Returns its whole stderr
/// and its exit code (128 + the signal when a signal ended it). Panics when it never pauses.
pub fn stop_at_fault(p: &Project, args: &[&str], fault: &str, signal: i32) -> (String, i32) {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    let mut child = p
        .cmd(args)
        .env("CUDARL_FAULT", fault)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let paused = format!("CUDARL_FAULT_PAUSED {}", fault.replacen(':', " ", 1));
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let at = line.starts_with(&paused);
        said.push(line);
        if at {
            break;
        }
    }
    assert!(
        said.last().is_some_and(|l| l.starts_with(&paused)),
        "never paused at {fault}:\n{}",
        said.join("\n")
    );
    // SAFETY: signals the child this function started.
    unsafe {
        libc::kill(child.id() as i32, signal);
    }
    said.extend(lines.map_while(Result::ok));
    let status = child.wait().unwrap();
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    (said.join("\n"), code)
}
