//! Compiling a native candidate: candidate + generated shim in one translation unit, built by
//! nvcc into a shared object with SASS for one architecture, in a fresh temp dir, with a time
//! limit; diagnostics and `-Xptxas -v` resources parsed into typed fields; results cached in
//! the store by BLAKE3(source, shim, flags, nvcc version, arch).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cudarl_store::{Digest, Store};
use serde::{Deserialize, Serialize};

use crate::diag::{Diagnostic, KernelResources, parse_diagnostics, parse_resources};
use crate::nvcc::Nvcc;

/// Default compile time limit (issue: 30 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Key-derivation context of the compile cache.
pub const CACHE_CONTEXT: &str = "cudarl-pipe 2026-11-22 compile cache v1";

/// Result of one compile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileOutput {
    /// Whether a shared object was produced.
    pub compiled: bool,
    /// The compile hit its time limit (and was killed).
    pub timed_out: bool,
    /// Parsed diagnostics (errors and warnings).
    pub diagnostics: Vec<Diagnostic>,
    /// Per-kernel resources from ptxas.
    pub resources: Vec<KernelResources>,
    /// nvcc's output, truncated to 16 KiB.
    pub log: String,
    /// Digest of the shared object in the CAS (when compiled and a store is attached).
    pub so_hash: Option<Digest>,
    /// Wall time of the nvcc run, seconds (of the original compile on a cache hit).
    pub compile_seconds: f64,
    /// This result came from the cache.
    pub cache_hit: bool,
    /// Wall time of this call, seconds.
    pub seconds: f64,
    /// nvcc version.
    pub nvcc_version: String,
    /// Target architecture, e.g. `sm_90`.
    pub arch: String,
    /// Flags passed to nvcc (besides input, output and -L).
    pub flags: Vec<String>,
}

/// Errors of the compiler itself (a candidate that fails to compile is not an error).
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Setting up the job failed (temp dir, spawning nvcc).
    #[error("compile job: {0}")]
    Io(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] cudarl_store::StoreError),
}

/// Compiles candidates for one nvcc and architecture.
#[derive(Debug, Clone)]
pub struct Compiler {
    /// The nvcc to use.
    pub nvcc: Nvcc,
    /// Target, e.g. `sm_90`.
    pub arch: String,
    /// Time limit per compile.
    pub timeout: Duration,
    /// Store for the compile cache and shared objects; `None` disables caching.
    pub store: Option<Store>,
}

fn truncate(mut s: String, n: usize) -> String {
    if s.len() > n {
        let mut cut = n;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("\n[... truncated]");
    }
    s
}

impl Compiler {
    /// nvcc flags for `arch`: SASS only for that architecture, a shared object.
    ///
    /// No `-O3`: nvcc's `-O` sets the *host* compiler's level (device code is optimized by
    /// cicc and ptxas at their default -O3 either way; nvcc docs, "--optimize"), and the host
    /// side of a candidate is a launcher of a few lines; dropping it saves about 10% of a cold
    /// compile (measured here: 0.96 s -> 0.85 s for vector_add/vec4).
    pub fn flags(&self) -> Vec<String> {
        let mut f = self.shared_object_flags();
        // A shared object with undefined symbols (e.g. no `launch`) must fail at link time.
        f.extend(["-Xlinker".into(), "--no-undefined".into()]);
        f
    }

    /// SASS for `arch` only, C++17, a position-independent shared object, ptxas resource
    /// report, line info: what native and torch-extension builds share.
    fn shared_object_flags(&self) -> Vec<String> {
        let num = self.arch.trim_start_matches("sm_");
        vec![
            format!("-gencode=arch=compute_{num},code=sm_{num}"),
            "-std=c++17".into(),
            "-shared".into(),
            "-Xcompiler".into(),
            "-fPIC".into(),
            "-Xptxas".into(),
            "-v".into(),
            "-lineinfo".into(),
        ]
    }

    /// The cache key of (source, shim) with this compiler's flags, nvcc version and arch.
    pub fn cache_key(&self, source: &str, shim: &str) -> Digest {
        let v = serde_json::json!({
            "source": source, "shim": shim, "flags": self.flags(),
            "nvcc": self.nvcc.version, "arch": self.arch,
        });
        Digest(blake3::derive_key(
            CACHE_CONTEXT,
            serde_json::to_string(&v).expect("json").as_bytes(),
        ))
    }

    /// Compiles `source` followed by `shim`. Uses the cache when a store is attached: a hit
    /// returns the stored result (same diagnostics and resources) without running nvcc.
    ///
    /// # Errors
    /// Only failures of the harness (temp dir, spawn, store); compile errors are data.
    pub fn compile(&self, source: &str, shim: &str) -> Result<CompileOutput, CompileError> {
        self.cached(self.cache_key(source, shim), || {
            self.run_nvcc(&format!("{source}\n{shim}"), self.flags(), self.timeout)
        })
    }

    /// The compile cache around `build`: a stored result for `key` whose shared object is still
    /// in the store is returned as a hit (same diagnostics and resources, `seconds` of this
    /// call); otherwise `build` runs and its result is stored.
    fn cached(
        &self,
        key: Digest,
        build: impl FnOnce() -> Result<CompileOutput, CompileError>,
    ) -> Result<CompileOutput, CompileError> {
        let t0 = Instant::now();
        let memo = match &self.store {
            Some(s) => Some(s.memo("compile-v1")?),
            None => None,
        };
        if let Some(m) = &memo
            && let Some(bytes) = m.get(&key)?
            && let Ok(mut out) = serde_json::from_slice::<CompileOutput>(&bytes)
            && out
                .so_hash
                .is_none_or(|h| self.store.as_ref().is_some_and(|s| s.has_blob(&h)))
        {
            out.cache_hit = true;
            out.seconds = t0.elapsed().as_secs_f64();
            return Ok(out);
        }
        let mut out = build()?;
        if let Some(m) = &memo {
            m.put(&key, &serde_json::to_vec(&out).expect("json"))?;
        }
        out.seconds = t0.elapsed().as_secs_f64();
        Ok(out)
    }

    /// Compiles a torch extension (one translation unit: a SakanaAI-style `.cu` with
    /// `PYBIND11_MODULE`, or a `load_inline` call's sources joined by
    /// [`crate::torchfmt`]) into a Python extension module named `module`, with torch's
    /// headers and libraries from `env` and torch's own nvcc defines
    /// (`torch.utils.cpp_extension`: `-D__CUDA_NO_HALF_OPERATORS__` ...,
    /// `--expt-relaxed-constexpr`). Cached like [`Compiler::compile`]; `timeout` replaces the
    /// compiler's (torch's headers make one build about a minute of CPU).
    ///
    /// # Errors
    /// Harness failures only.
    pub fn compile_torch_ext(
        &self,
        text: &str,
        module: &str,
        env: &crate::torchfmt::TorchEnv,
        extra: &[String],
        timeout: Duration,
    ) -> Result<CompileOutput, CompileError> {
        // Python extensions leave Python's symbols undefined: no `--no-undefined` here.
        let mut flags = self.shared_object_flags();
        flags.extend([
            "--expt-relaxed-constexpr".into(),
            "-D__CUDA_NO_HALF_OPERATORS__".into(),
            "-D__CUDA_NO_HALF_CONVERSIONS__".into(),
            "-D__CUDA_NO_BFLOAT16_CONVERSIONS__".into(),
            "-D__CUDA_NO_HALF2_OPERATORS__".into(),
            "-DTORCH_API_INCLUDE_EXTENSION_H".into(),
            format!("-DTORCH_EXTENSION_NAME={module}"),
            format!("-D_GLIBCXX_USE_CXX11_ABI={}", u8::from(env.cxx11_abi)),
        ]);
        for d in &env.include_dirs {
            flags.push("-isystem".into());
            flags.push(d.clone());
        }
        for d in &env.library_dirs {
            flags.push(format!("-L{d}"));
        }
        // No -lcudart: nvcc links its static runtime (the default), which shares the primary
        // context (and so streams and memory) with torch's shared one.
        for l in [
            "c10",
            "c10_cuda",
            "torch_cpu",
            "torch_cuda",
            "torch",
            "torch_python",
        ] {
            flags.push(format!("-l{l}"));
        }
        flags.extend(extra.iter().cloned());
        let v = serde_json::json!({
            "source": text, "flags": flags, "nvcc": self.nvcc.version, "arch": self.arch,
            "torch": env.torch,
        });
        let key = Digest(blake3::derive_key(
            CACHE_CONTEXT,
            serde_json::to_string(&v).expect("json").as_bytes(),
        ));
        self.cached(key, || self.run_nvcc(text, flags, timeout))
    }

    fn run_nvcc(
        &self,
        text: &str,
        flags: Vec<String>,
        timeout: Duration,
    ) -> Result<CompileOutput, CompileError> {
        let io = |e: std::io::Error| CompileError::Io(e.to_string());
        let dir = match &self.store {
            Some(s) => s.temp_dir()?,
            None => tempfile::tempdir().map_err(io)?,
        };
        let src = dir.path().join("kernel.cu");
        std::fs::write(&src, text).map_err(io)?;
        let so = dir.path().join("kernel.so");
        let mut cmd = Command::new(&self.nvcc.path);
        cmd.current_dir(dir.path())
            .args(&flags)
            .arg("-o")
            .arg("kernel.so")
            .arg("kernel.cu")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        for l in &self.nvcc.lib_dirs {
            cmd.arg(format!("-L{}", l.display()));
        }
        let t0 = Instant::now();
        let mut child = cmd.spawn().map_err(io)?;
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let out_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let mut timed_out = false;
        let status = loop {
            if let Some(st) = child.try_wait().map_err(io)? {
                break Some(st);
            }
            if t0.elapsed() > timeout {
                timed_out = true;
                // Kill nvcc and its children (cicc, ptxas, gcc): the whole process group.
                unsafe {
                    libc::kill(-(child.id() as i32), libc::SIGKILL);
                }
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let seconds = t0.elapsed().as_secs_f64();
        let log = format!(
            "{}{}",
            out_reader.join().unwrap_or_default(),
            err_reader.join().unwrap_or_default()
        );
        let compiled = status.is_some_and(|s| s.success()) && so.is_file();
        let so_hash = match (&self.store, compiled) {
            (Some(s), true) => Some(s.ingest_file(&so)?),
            _ => None,
        };
        let mut diagnostics = parse_diagnostics(&log);
        if timed_out {
            diagnostics.push(Diagnostic {
                file: None,
                line: None,
                severity: "fatal".into(),
                message: format!(
                    "compile exceeded the {:.0} s time limit and was killed",
                    timeout.as_secs_f64()
                ),
                tool: "harness".into(),
            });
        }
        Ok(CompileOutput {
            compiled,
            timed_out,
            diagnostics,
            resources: parse_resources(&log),
            log: truncate(log, 16 * 1024),
            so_hash,
            compile_seconds: seconds,
            cache_hit: false,
            seconds,
            nvcc_version: self.nvcc.version.clone(),
            arch: self.arch.clone(),
            flags,
        })
    }
}
