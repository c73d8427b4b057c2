//! Compiling a native candidate: candidate + generated shim in one translation unit, built by
//! nvcc with SASS for one architecture, in a fresh temp dir, with a time limit (CPU time, so a
//! loaded machine does not turn a slow build into a failed one; see [`Compiler::timeout`]), inside the
//! compiler sandbox (`cudarl-pipe-runner exec --profile compiler`: Landlock lets nvcc read only
//! the toolkit, the system headers and libraries, and write only its build directory; seccomp
//! denies sockets, ptrace and the like), so an `#include` of another file fails to open and no
//! byte of it reaches the diagnostics. One nvcc run builds the shared object against the
//! *shared* CUDA runtime (the static one imports `open`, `dlopen`, `socket` and more on its own,
//! and the runner preloads the shared one before its sandbox), keeping the object, the PTX and
//! the preprocessed texts; then the checks of [`crate::inspect`] on what was built, and a
//! rejecting finding discards the shared object (one nvcc run, not a compile and a link: 0.04 s
//! less of a 0.85 s build on a 2-core machine, paired). Diagnostics
//! and `-Xptxas -v` resources are parsed into typed fields; results are cached in the store by
//! BLAKE3(source, shim, flags, nvcc version, arch, rules); a build that hit a time limit is not
//! cached (the next compile tries again).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cudarl_store::{Digest, Store};
use serde::{Deserialize, Serialize};

use crate::diag::{Diagnostic, KernelResources, parse_diagnostics, parse_resources};
use crate::nvcc::Nvcc;
use crate::static_check::Rules;

/// Default compile time limit: 30 CPU seconds per compiler process ([`Compiler::timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The wall-clock backstop of a compile, as a multiple of its CPU-time limit: it stops a build
/// that waits without computing; one that computes meets the CPU-time limit first on any machine
/// with a core for it, however loaded.
pub const WALL_FACTOR: u32 = 4;

/// Key-derivation context of the compile cache (v2: sandboxed two-step builds with object
/// inspection and the shared CUDA runtime; v3: CPU-time limits, builds stopped by a limit not
/// cached; v4: one nvcc run to the shared object; v5: object checks by section prefix and byte,
/// exported names, tensor-core precision in the PTX; v6: the linked library scanned, half-precision arithmetic flagged;
/// v7: a library hit a second, padded link moves away is stored from that link).
pub const CACHE_CONTEXT: &str = "cudarl-pipe compile cache v7";

/// The object nvcc keeps beside the other intermediate files of a native build.
const OBJECT: &str = "keep/kernel.o";

/// The library [`Compiler::scan_linked`] links again when the first link put a refused
/// encoding into the code.
const RELINKED: &str = "kernel_relinked.so";

/// The padding objects of [`Compiler::scan_linked`]'s second link, by name and size in bytes of
/// `int3` (`0xcc`) in `.text`: the first goes before the build's object, the second after it
/// (more than a page, so sections that start on a page of their own move too). Multiples of 64
/// with no alignment of their own, so the object's code moves by exactly 320 bytes and keeps
/// its alignment: distances between its own sections do not change.
const PADDING: [(&str, u32); 2] = [("pad_before", 320), ("pad_after", 4160)];

/// Result of one compile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileOutput {
    /// Whether a shared object was produced.
    pub compiled: bool,
    /// The compile hit its time limit (and was killed): a compiler process used its CPU
    /// seconds, or the whole build its wall-clock backstop.
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
    /// Findings on what was built ([`crate::inspect`]): the preprocessed source, the host
    /// object, the PTX. A rejecting finding stops the build before the link (`compiled` false).
    #[serde(default)]
    pub findings: Vec<crate::static_check::Finding>,
    /// How a torch extension was built: `kernel-host`, `split` or `one-unit`
    /// ([`Compiler::compile_torch_ext`]); empty for native kernels.
    #[serde(default)]
    pub layout: String,
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
    /// CPU-time limit of each compiler process of a build (nvcc, cudafe++, cicc, ptxas, the
    /// host compiler; RLIMIT_CPU, whole seconds, at least 1), so a verdict does not depend on
    /// how loaded the machine is; the whole build also stops after [`WALL_FACTOR`] times it of
    /// wall-clock time.
    pub timeout: Duration,
    /// Store for the compile cache and shared objects; `None` disables caching.
    pub store: Option<Store>,
}

/// A flag of the link only (libraries, their folders, `-shared`), left out of object builds.
fn is_link_flag(f: &str) -> bool {
    f.starts_with("-l") || f.starts_with("-L") || f == "-shared"
}

/// What a torch-extension build reads: torch's include and library folders.
fn env_reads(env: &crate::pyworker::TorchEnv) -> Vec<PathBuf> {
    env.include_dirs
        .iter()
        .chain(&env.library_dirs)
        .map(PathBuf::from)
        .collect()
}

/// One translation unit of a split torch-extension build: its file name and text, and the
/// flags of the build it leaves out or adds.
struct SplitUnit {
    file: &'static str,
    text: String,
    drop: Vec<String>,
    add: Vec<String>,
}

impl SplitUnit {
    fn new(file: &'static str, text: String) -> SplitUnit {
        SplitUnit {
            file,
            text,
            drop: vec![],
            add: vec![],
        }
    }
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
        let mut f = self.compile_flags();
        f.extend(Self::link_flags());
        f
    }

    /// SASS for `arch`, C++17, position-independent host code, ptxas resource report, line
    /// info, intermediate files kept in `keep/` (object, PTX, preprocessed texts).
    fn compile_flags(&self) -> Vec<String> {
        let num = self.arch.trim_start_matches("sm_");
        [
            format!("-gencode=arch=compute_{num},code=sm_{num}"),
            "-std=c++17".into(),
            "-Xcompiler".into(),
            "-fPIC".into(),
            "-Xptxas".into(),
            "-v".into(),
            "-lineinfo".into(),
            "--keep".into(),
            "--keep-dir".into(),
            "keep".into(),
        ]
        .to_vec()
    }

    /// A shared object against the shared CUDA runtime (passed to the linker by path, see
    /// [`Nvcc::cudart`]); undefined symbols (e.g. no `launch`) fail the link.
    fn link_flags() -> Vec<String> {
        ["-shared", "-cudart", "none", "-Xlinker", "--no-undefined"]
            .map(String::from)
            .to_vec()
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

    /// The cache key of (source, shim) with this compiler's flags, nvcc version and arch, and
    /// the rules the build was inspected with.
    pub fn cache_key(&self, source: &str, shim: &str, rules: &Rules) -> Digest {
        let v = serde_json::json!({
            "source": source, "shim": shim, "flags": self.flags(),
            "nvcc": self.nvcc.version, "arch": self.arch, "rules": rules.digest,
        });
        Digest(blake3::derive_key(
            CACHE_CONTEXT,
            serde_json::to_string(&v).expect("json").as_bytes(),
        ))
    }

    /// Compiles `source` followed by `shim` (see the module docs), inspecting what was built
    /// with `rules`. Uses the cache when a store is attached: a hit returns the stored result
    /// (same diagnostics, resources and findings) without running nvcc.
    ///
    /// # Errors
    /// Only failures of the harness (temp dir, spawn, store, a missing runner binary); compile
    /// errors and rejecting findings are data.
    pub fn compile(
        &self,
        source: &str,
        shim: &str,
        rules: &Rules,
    ) -> Result<CompileOutput, CompileError> {
        let mut out = self.cached(self.cache_key(source, shim, rules), || {
            self.build_native(&format!("{source}\n{shim}"), rules)
        })?;
        crate::task::explain_launcher_errors(&mut out.diagnostics, source, shim);
        Ok(out)
    }

    /// The native build: one nvcc run to the shared object, keeping its intermediate files,
    /// then the inspection of what was built (a rejecting finding discards the shared object).
    fn build_native(&self, text: &str, rules: &Rules) -> Result<CompileOutput, CompileError> {
        let io = |e: std::io::Error| CompileError::Io(e.to_string());
        let dir = self.build_dir()?;
        std::fs::write(dir.path().join(crate::inspect::SOURCE_NAME), text).map_err(io)?;
        std::fs::create_dir_all(dir.path().join("keep")).map_err(io)?;
        let t0 = Instant::now();
        let cudart = self.nvcc.cudart().ok_or_else(|| {
            CompileError::Io(format!(
                "no shared CUDA runtime (libcudart.so) beside {}",
                self.nvcc.path.display()
            ))
        })?;
        let mut args = self.flags();
        args.extend([
            "-Xlinker".into(),
            cudart.display().to_string(),
            "-o".into(),
            "kernel.so".into(),
            crate::inspect::SOURCE_NAME.into(),
        ]);
        let run = self.run_sandboxed(dir.path(), &args, &[], self.timeout)?;
        let mut out = self.output_of(&run, t0);
        if dir.path().join(OBJECT).is_file() {
            out.findings = self.inspect(dir.path(), rules);
            if crate::static_check::rejected(&out.findings) {
                out.compiled = false;
                return Ok(out);
            }
        }
        let so = dir.path().join("kernel.so");
        out.compiled = run.ok && so.is_file();
        if out.compiled {
            // The link wrote the relocation fields: the library's code is scanned as the
            // object's was.
            out.findings.extend(self.scan_linked(dir.path(), &cudart)?);
            if crate::static_check::rejected(&out.findings) {
                out.compiled = false;
                return Ok(out);
            }
        }
        out.so_hash = match (&self.store, out.compiled) {
            (Some(s), true) => Some(s.ingest_file(&so)?),
            _ => None,
        };
        out.compile_seconds = t0.elapsed().as_secs_f64();
        out.seconds = out.compile_seconds;
        Ok(out)
    }

    /// [`crate::inspect::linked`] on the build's `kernel.so`. The object's own code scanned
    /// clean ([`Compiler::inspect`]), so a refused encoding found here is one the link made: in
    /// the values it wrote into relocation fields (a RIP-relative displacement of `0x50f` holds
    /// the bytes of `syscall`), the C runtime's start files or the PLT. Before it rejects, the
    /// same object is linked once more between two padding objects ([`PADDING`]), which move
    /// its code by at least 320 bytes against every section outside it: each displacement from
    /// its code to another output section changes by at least 256, out of the range of the
    /// byte pair it held. When that library scans clean it replaces the first, and the hit was
    /// a layout accident (one honest naive kernel in 938 on an H100 host,
    /// `benchmarks/results/main_job_pooling_h100_2026-12-07.json`). A hit the candidate placed
    /// itself, in its own bytes or in a displacement between two of its own code sections
    /// (which padding outside the object does not change), is in both libraries and rejects.
    ///
    /// # Errors
    /// Only failures of the harness (writing the padding sources, spawning nvcc).
    fn scan_linked(
        &self,
        dir: &Path,
        cudart: &Path,
    ) -> Result<Vec<crate::static_check::Finding>, CompileError> {
        let scan = |path: &Path| match std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| crate::inspect::linked(&b).map_err(|e| e.to_string()))
        {
            Ok(v) => v,
            Err(e) => vec![unreadable("linked library", e)],
        };
        let so = dir.join("kernel.so");
        let first = scan(&so);
        let by_layout = first.iter().all(|f| f.rule == "object-instruction");
        if !crate::static_check::rejected(&first) || !by_layout {
            return Ok(first);
        }
        let relinked = dir.join(RELINKED);
        if !self.relink_padded(dir, cudart)? {
            return Ok(first);
        }
        let second = scan(&relinked);
        if crate::static_check::rejected(&second) {
            return Ok(first);
        }
        std::fs::rename(&relinked, &so).map_err(|e| CompileError::Io(e.to_string()))?;
        Ok(second)
    }

    /// Links the build's object again into [`RELINKED`], between the two [`PADDING`] objects
    /// (compiled from one-line sources in the build directory, in the compiler's sandbox);
    /// whether both steps succeeded.
    fn relink_padded(&self, dir: &Path, cudart: &Path) -> Result<bool, CompileError> {
        let mut sources = vec!["-Xcompiler".to_string(), "-fPIC".into(), "-c".into()];
        for (name, bytes) in PADDING {
            let text = format!("__asm__(\".text\\n.fill {bytes}, 1, 0xcc\\n\");\n");
            std::fs::write(dir.join(format!("{name}.cpp")), text)
                .map_err(|e| CompileError::Io(e.to_string()))?;
            sources.push(format!("{name}.cpp"));
        }
        if !self.run_sandboxed(dir, &sources, &[], self.timeout)?.ok {
            return Ok(false);
        }
        let num = self.arch.trim_start_matches("sm_");
        let mut args = vec![format!("-gencode=arch=compute_{num},code=sm_{num}")];
        args.extend(Self::link_flags());
        args.extend([
            "-Xlinker".into(),
            cudart.display().to_string(),
            "-o".into(),
            RELINKED.into(),
            format!("{}.o", PADDING[0].0),
            OBJECT.into(),
            format!("{}.o", PADDING[1].0),
        ]);
        let run = self.run_sandboxed(dir, &args, &[], self.timeout)?;
        Ok(run.ok && dir.join(RELINKED).is_file())
    }

    /// [`crate::inspect`]'s findings on a build directory: the preprocessed host and device
    /// texts, the object, the PTX. A missing intermediate file is itself a finding.
    fn inspect(&self, dir: &Path, rules: &Rules) -> Vec<crate::static_check::Finding> {
        let keep = dir.join("keep");
        let read = |name: &str| std::fs::read_to_string(keep.join(name)).unwrap_or_default();
        let (host, device) = (read("kernel.cpp4.ii"), read("kernel.cpp1.ii"));
        let mut f =
            crate::inspect::preprocessed(rules, &[&host, &device], "native", &self.include_roots());
        match std::fs::read(dir.join(OBJECT)) {
            Ok(b) => match crate::inspect::object(&b, rules.object_rules()) {
                Ok(v) => f.extend(v),
                Err(e) => f.push(unreadable("object", e)),
            },
            Err(e) => f.push(unreadable("object", e.to_string())),
        }
        if host.is_empty() || device.is_empty() {
            f.push(unreadable("preprocessed text", "nvcc kept none"));
        }
        match std::fs::read_to_string(keep.join("kernel.ptx")) {
            Ok(p) => f.extend(crate::inspect::ptx(&p)),
            Err(e) => f.push(unreadable("PTX", e.to_string())),
        }
        f
    }

    /// Directories a header may come from: the toolkit and the host compiler's system include
    /// directories.
    fn include_roots(&self) -> Vec<String> {
        let mut roots: Vec<String> = self
            .nvcc
            .toolkit_roots()
            .into_iter()
            .map(|p| p.display().to_string())
            .collect();
        roots.extend(
            [
                "/usr/include",
                "/usr/lib/gcc",
                "/usr/local/include",
                "/usr/lib/llvm",
            ]
            .map(String::from),
        );
        roots
    }

    fn build_dir(&self) -> Result<tempfile::TempDir, CompileError> {
        match &self.store {
            Some(s) => Ok(s.temp_dir()?),
            None => tempfile::tempdir().map_err(|e| CompileError::Io(e.to_string())),
        }
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
        // A time limit is partly the machine's doing (its load, its speed): try again next time.
        if let Some(m) = memo.as_ref().filter(|_| !out.timed_out) {
            m.put(&key, &serde_json::to_vec(&out).expect("json"))?;
        }
        out.seconds = t0.elapsed().as_secs_f64();
        Ok(out)
    }

    /// nvcc's flags for a torch extension named `module` (see [`Compiler::compile_torch_ext`]).
    fn torch_ext_flags(
        &self,
        module: &str,
        env: &crate::pyworker::TorchEnv,
        extra: &[String],
    ) -> Vec<String> {
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
        flags
    }

    /// Builds (once; later calls find it) the precompiled torch header that kernel/host
    /// builds of extensions with `extra` flags include ([`crate::torchsplit::HOST_PCH_HEADER`]),
    /// so its cost can be paid and measured apart from the builds. `None` when it cannot be
    /// precompiled (host units then parse the header).
    ///
    /// # Errors
    /// Harness failures only.
    pub fn torch_host_pch(
        &self,
        env: &crate::pyworker::TorchEnv,
        extra: &[String],
        timeout: Duration,
    ) -> Result<Option<PathBuf>, CompileError> {
        let flags = self.host_flags(
            &self.torch_ext_flags("cudarl_pch", env, extra),
            "cudarl_pch",
        );
        self.host_pch(&flags, &env_reads(env), timeout)
    }

    /// `flags` of an extension named `module` as the host unit of a kernel/host build takes
    /// them: no link flags, no `-DTORCH_EXTENSION_NAME` (the unit defines it, so one
    /// precompiled header serves every module: GCC rejects one made under another value).
    fn host_flags(&self, flags: &[String], module: &str) -> Vec<String> {
        let name_flag = format!("-DTORCH_EXTENSION_NAME={module}");
        flags
            .iter()
            .filter(|f| **f != name_flag && !is_link_flag(f))
            .cloned()
            .collect()
    }

    /// Compiles a torch extension (`text`, one translation unit: a SakanaAI-style `.cu` with
    /// `PYBIND11_MODULE`, or a `load_inline` call's sources joined by
    /// [`crate::torchfmt`]) into a Python extension module named `module`, with torch's
    /// headers and libraries from `env` and torch's own nvcc defines
    /// (`torch.utils.cpp_extension`: `-D__CUDA_NO_HALF_OPERATORS__` ...,
    /// `--expt-relaxed-constexpr`). Cached like [`Compiler::compile`]; `timeout` replaces the
    /// compiler's (torch's headers make one build about a minute of CPU).
    ///
    /// With `split` ([`crate::torchsplit`]) the extension is built in parallel units and
    /// linked: its kernel/host layout where it has one (a torch-free CUDA unit and a host unit
    /// with the precompiled torch header, [`Compiler::torch_host_pch`]), else the CUDA unit
    /// (`torch/types.h`) and the binding unit (`torch/extension.h`). When a unit fails to
    /// compile, `text` is built as one unit instead, so the result (compiled or not,
    /// diagnostics) is the one-unit build's whenever a split does not build. The output's
    /// `layout` says which build it is.
    ///
    /// # Errors
    /// Harness failures only.
    pub fn compile_torch_ext(
        &self,
        text: &str,
        split: Option<&crate::torchsplit::TorchSplit>,
        module: &str,
        env: &crate::pyworker::TorchEnv,
        extra: &[String],
        timeout: Duration,
    ) -> Result<CompileOutput, CompileError> {
        let flags = self.torch_ext_flags(module, env, extra);
        let v = serde_json::json!({
            "source": text, "split": split, "flags": flags, "nvcc": self.nvcc.version,
            "arch": self.arch, "torch": env.torch,
        });
        let key = Digest(blake3::derive_key(
            CACHE_CONTEXT,
            serde_json::to_string(&v).expect("json").as_bytes(),
        ));
        let reads = env_reads(env);
        self.cached(key, || {
            let io = |e: std::io::Error| CompileError::Io(e.to_string());
            let t0 = Instant::now();
            // The kernel/host layout where there is one; a failure there goes to one unit
            // (most often the candidate itself does not compile, and one unit says where).
            match split {
                Some(s) if s.kernel_host.is_some() => {
                    let kh = s.kernel_host.as_ref().expect("checked");
                    if let Some(out) =
                        self.torch_ext_kernel_host(kh, module, &flags, &reads, timeout, t0)?
                    {
                        return Ok(out);
                    }
                }
                Some(s) => {
                    let units = [
                        SplitUnit::new("cuda.cu", s.cuda.clone()),
                        SplitUnit::new("bind.cpp", s.bind.clone()),
                    ];
                    if let Some(out) =
                        self.torch_ext_units(&units, &flags, &reads, timeout, t0, "split")?
                    {
                        return Ok(out);
                    }
                }
                None => {}
            }
            let dir = self.build_dir()?;
            std::fs::write(dir.path().join("kernel.cu"), text).map_err(io)?;
            let mut args = flags.clone();
            args.extend(["-o".into(), "kernel.so".into(), "kernel.cu".into()]);
            let run = self.run_sandboxed(dir.path(), &args, &reads, timeout)?;
            let mut out = self.extension_output(&run, t0, &flags, &dir.path().join("kernel.so"))?;
            out.layout = "one-unit".into();
            Ok(out)
        })
    }

    /// The [`CompileOutput`] of a torch-extension build that ended with `run`: compiled when
    /// it succeeded and left `so`, which then goes into the store.
    fn extension_output(
        &self,
        run: &NvccRun,
        t0: Instant,
        flags: &[String],
        so: &Path,
    ) -> Result<CompileOutput, CompileError> {
        let mut out = self.output_of(run, t0);
        out.flags = flags.to_vec();
        out.compiled = run.ok && so.is_file();
        out.so_hash = match (&self.store, out.compiled) {
            (Some(s), true) => Some(s.ingest_file(so)?),
            _ => None,
        };
        Ok(out)
    }

    /// The split builds of [`Compiler::compile_torch_ext`]: `units` (file name, text, extra
    /// flags) compiled to objects by sandboxed nvcc processes at once, then linked with
    /// `flags`' libraries. `None` when a unit or the link failed other than by its time limit
    /// (the caller builds one unit); a time limit is the result (the one-unit build costs more).
    #[allow(clippy::too_many_arguments)]
    fn torch_ext_units(
        &self,
        units: &[SplitUnit],
        flags: &[String],
        reads: &[PathBuf],
        timeout: Duration,
        t0: Instant,
        layout: &str,
    ) -> Result<Option<CompileOutput>, CompileError> {
        let io = |e: std::io::Error| CompileError::Io(e.to_string());
        let dir = self.build_dir()?;
        let mut objects = Vec::new();
        let mut jobs = Vec::new();
        for u in units {
            std::fs::write(dir.path().join(u.file), &u.text).map_err(io)?;
            let obj = format!("{}.o", u.file.rsplit_once('.').map_or(u.file, |f| f.0));
            let mut a: Vec<String> = flags
                .iter()
                .filter(|f| !is_link_flag(f) && !u.drop.contains(f))
                .cloned()
                .collect();
            a.extend(u.add.iter().cloned());
            a.extend(["-c".into(), "-o".into(), obj.clone(), u.file.to_string()]);
            objects.push(obj);
            jobs.push(a);
        }
        let mut runs = std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .iter()
                .map(|a| s.spawn(|| self.run_sandboxed(dir.path(), a, reads, timeout)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("nvcc thread"))
                .collect::<Result<Vec<_>, _>>()
        })?;
        if runs.iter().all(|r| r.ok) {
            let mut a: Vec<String> = flags
                .iter()
                .filter(|f| {
                    is_link_flag(f)
                        || f.starts_with("-gencode")
                        || f.starts_with("-Xcompiler")
                        || f.as_str() == "-fPIC"
                })
                .cloned()
                .collect();
            a.extend(["-o".into(), "kernel.so".into()]);
            a.extend(objects);
            runs.push(self.run_sandboxed(dir.path(), &a, reads, timeout)?);
        }
        let timed_out = runs.iter().any(|r| r.timed_out);
        let ok = runs.len() == units.len() + 1 && runs.iter().all(|r| r.ok);
        if !ok && !timed_out {
            return Ok(None);
        }
        let run = NvccRun {
            ok,
            timed_out,
            log: runs
                .iter()
                .map(|r| r.log.as_str())
                .collect::<Vec<_>>()
                .join(""),
        };
        let mut out = self.extension_output(&run, t0, flags, &dir.path().join("kernel.so"))?;
        out.layout = layout.to_string();
        Ok(Some(out))
    }

    /// The kernel/host build of [`Compiler::compile_torch_ext`]
    /// ([`crate::torchsplit::KernelHostSplit`]): `kernels.cu` without torch's headers and
    /// `host.cpp` with the precompiled [`crate::torchsplit::HOST_PCH_HEADER`]
    /// ([`Compiler::host_pch`]; parsed as text when it cannot be precompiled), compiled at once
    /// and linked.
    #[allow(clippy::too_many_arguments)]
    fn torch_ext_kernel_host(
        &self,
        kh: &crate::torchsplit::KernelHostSplit,
        module: &str,
        flags: &[String],
        reads: &[PathBuf],
        timeout: Duration,
        t0: Instant,
    ) -> Result<Option<CompileOutput>, CompileError> {
        let name_flag = format!("-DTORCH_EXTENSION_NAME={module}");
        let host_flags = self.host_flags(flags, module);
        let mut reads = reads.to_vec();
        let mut host_extra = vec![];
        let mut host = format!("#define TORCH_EXTENSION_NAME {module}\n");
        match self.host_pch(&host_flags, &reads, timeout)? {
            Some(header) => {
                host_extra.extend([
                    "-Xcompiler".into(),
                    format!("-include,{},-Winvalid-pch", header.display()),
                ]);
                reads.push(header.parent().map(Path::to_path_buf).unwrap_or_default());
            }
            None => host.push_str(crate::torchsplit::HOST_PCH_HEADER),
        }
        host.push_str(&kh.host);
        self.torch_ext_units(
            &[
                SplitUnit::new("kernels.cu", kh.kernels.clone()),
                SplitUnit {
                    drop: vec![name_flag],
                    add: host_extra,
                    ..SplitUnit::new("host.cpp", host)
                },
            ],
            flags,
            &reads,
            timeout,
            t0,
            "kernel-host",
        )
    }

    /// The precompiled [`crate::torchsplit::HOST_PCH_HEADER`] for host units compiled with
    /// `host_flags`: the header's path, with its `.gch` beside it. Built once per (flags,
    /// nvcc, header) under the store (`derived/pch/<key>/`, or the system temp folder
    /// without a store), by one build at a time, published by rename; about 600 MB and 30 s
    /// of one core with torch 2.11 and GCC 12. `None` when it cannot be built (recorded, so
    /// it is not tried again, unless it ran out of time) or its path cannot be passed to the
    /// host compiler. GCC checks a precompiled header against the compiler and flags that
    /// use it and reads the header as text when they differ.
    fn host_pch(
        &self,
        host_flags: &[String],
        reads: &[PathBuf],
        timeout: Duration,
    ) -> Result<Option<PathBuf>, CompileError> {
        static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let io = |e: std::io::Error| CompileError::Io(e.to_string());
        let v = serde_json::json!({
            "header": crate::torchsplit::HOST_PCH_HEADER, "flags": host_flags,
            "nvcc": self.nvcc.version, "path": self.nvcc.path,
        });
        let key = blake3::derive_key(
            CACHE_CONTEXT,
            serde_json::to_string(&v).expect("json").as_bytes(),
        );
        let key: String = key.iter().take(16).map(|b| format!("{b:02x}")).collect();
        let dir = match &self.store {
            Some(s) => s.root().join("derived/pch").join(&key),
            None => std::env::temp_dir().join("cudarl-pch").join(&key),
        };
        let header = dir.join("torch_ext_host.h");
        if header.to_string_lossy().contains(',') {
            return Ok(None);
        }
        let failed = dir.join("failed");
        let ready = || header.is_file() && dir.join("torch_ext_host.h.gch").is_file();
        if ready() {
            return Ok(Some(header));
        }
        if failed.is_file() {
            return Ok(None);
        }
        let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        let _lock = match &self.store {
            Some(s) => Some(s.lock_named(&format!("pch-{key}"))?),
            None => None,
        };
        if ready() {
            return Ok(Some(header));
        }
        std::fs::create_dir_all(&dir).map_err(io)?;
        let build = self.build_dir()?;
        std::fs::write(
            build.path().join("torch_ext_host_h.cpp"),
            crate::torchsplit::HOST_PCH_HEADER,
        )
        .map_err(io)?;
        let mut args = host_flags.to_vec();
        args.extend([
            "-Xcompiler".into(),
            "-x,c++-header".into(),
            "-c".into(),
            "-o".into(),
            "torch_ext_host.h.gch".into(),
            "torch_ext_host_h.cpp".into(),
        ]);
        let run = self.run_sandboxed_sized(build.path(), &args, reads, timeout, Some(4096))?;
        let gch = build.path().join("torch_ext_host.h.gch");
        if !run.ok || !gch.is_file() {
            tracing::warn!(log = %truncate(run.log, 2048), "the torch host header did not precompile; host units parse it");
            // A time limit is the machine's load as much as the header's: try again next time.
            if !run.timed_out {
                std::fs::write(&failed, b"").map_err(io)?;
            }
            return Ok(None);
        }
        // Published .gch first: a header without its .gch is read as text, never the reverse.
        let publish = |from: &Path, to: &Path| -> std::io::Result<()> {
            if std::fs::rename(from, to).is_err() {
                let tmp = to.with_extension("partial");
                std::fs::copy(from, &tmp)?;
                std::fs::rename(&tmp, to)?;
            }
            Ok(())
        };
        publish(&gch, &dir.join("torch_ext_host.h.gch")).map_err(io)?;
        let h = build.path().join("torch_ext_host.h");
        std::fs::write(&h, crate::torchsplit::HOST_PCH_HEADER).map_err(io)?;
        publish(&h, &header).map_err(io)?;
        Ok(Some(header))
    }

    /// Runs nvcc with `args` in `dir` inside the compiler sandbox, each of its processes limited
    /// to `timeout` of CPU time (whole seconds, at least 1), the whole process group killed after
    /// [`WALL_FACTOR`] times `timeout` of wall-clock time.
    fn run_sandboxed(
        &self,
        dir: &Path,
        args: &[String],
        extra_reads: &[PathBuf],
        timeout: Duration,
    ) -> Result<NvccRun, CompileError> {
        self.run_sandboxed_sized(dir, args, extra_reads, timeout, None)
    }

    /// [`Compiler::run_sandboxed`] with the largest file the compiler may write, MiB (the
    /// sandbox's default without one; the precompiled torch header is about 600 MB).
    fn run_sandboxed_sized(
        &self,
        dir: &Path,
        args: &[String],
        extra_reads: &[PathBuf],
        timeout: Duration,
        file_size_mib: Option<u64>,
    ) -> Result<NvccRun, CompileError> {
        let io = |e: std::io::Error| CompileError::Io(e.to_string());
        if !self.nvcc.path.is_file() {
            return Err(CompileError::Io(format!(
                "nvcc not found at {}",
                self.nvcc.path.display()
            )));
        }
        let runner = crate::runner::runner_exe();
        let mut cmd = Command::new(&runner);
        let cpu_seconds = timeout.as_secs_f64().ceil().max(1.0) as u64;
        cmd.args(["exec", "--profile", "compiler", "--cpu-seconds"])
            .arg(cpu_seconds.to_string());
        if let Some(m) = file_size_mib {
            cmd.arg("--file-size-mib").arg(m.to_string());
        }
        for r in self.nvcc.toolkit_roots() {
            cmd.arg("--read").arg(&r).arg("--exec").arg(&r);
        }
        for r in [
            "/usr/include",
            "/usr/local/include",
            "/usr/share/gcc",
            "/etc/alternatives",
        ] {
            cmd.arg("--read").arg(r);
        }
        for r in extra_reads {
            cmd.arg("--read").arg(r);
        }
        for x in [
            "/usr/bin",
            "/bin",
            "/usr/lib/gcc",
            "/usr/libexec",
            "/usr/local/bin",
        ] {
            cmd.arg("--exec").arg(x);
        }
        cmd.arg("--write").arg(dir).arg("--device").arg("/dev/null");
        cmd.arg("--").arg(&self.nvcc.path).args(args);
        for l in &self.nvcc.lib_dirs {
            cmd.arg(format!("-L{}", l.display()));
        }
        cmd.env_clear();
        for k in ["PATH", "CUDARL_SANDBOX_LOG", "CUDARL_ALLOW_UNCONFINED"] {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        cmd.env("TMPDIR", dir)
            .env("HOME", dir)
            .env("LC_ALL", "C")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let t0 = Instant::now();
        let mut child = cmd.spawn().map_err(|e| {
            CompileError::Io(format!(
                "start the compiler sandbox {}: {e} (build it with `make build`, or set CUDARL_RUNNER)",
                runner.display()
            ))
        })?;
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
            if t0.elapsed() > timeout * WALL_FACTOR {
                timed_out = true;
                // Kill nvcc and its children (cicc, ptxas, gcc): the whole process group.
                // SAFETY: signals the process group this function started.
                unsafe {
                    libc::kill(-(child.id() as i32), libc::SIGKILL);
                }
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut log = format!(
            "{}{}",
            out_reader.join().unwrap_or_default(),
            err_reader.join().unwrap_or_default()
        );
        if let Some(st) = status {
            use std::os::unix::process::ExitStatusExt;
            if st.code() == Some(125) || st.signal() == Some(libc::SIGSYS) {
                log.push_str("\nharness: the compiler sandbox stopped nvcc (a denied system call or a sandbox set-up failure)\n");
            }
            timed_out |= !st.success() && cpu_limit_hit(st.signal(), &log);
        }
        Ok(NvccRun {
            ok: status.is_some_and(|s| s.success()),
            timed_out,
            log,
        })
    }

    /// A [`CompileOutput`] from one nvcc run (not yet compiled; no shared object).
    fn output_of(&self, run: &NvccRun, t0: Instant) -> CompileOutput {
        let mut diagnostics = parse_diagnostics(&run.log);
        if run.timed_out {
            diagnostics.push(timeout_diagnostic(self.timeout));
        }
        CompileOutput {
            compiled: false,
            timed_out: run.timed_out,
            diagnostics,
            resources: parse_resources(&run.log),
            log: truncate(run.log.clone(), 16 * 1024),
            so_hash: None,
            compile_seconds: t0.elapsed().as_secs_f64(),
            cache_hit: false,
            seconds: t0.elapsed().as_secs_f64(),
            nvcc_version: self.nvcc.version.clone(),
            arch: self.arch.clone(),
            flags: self.flags(),
            findings: vec![],
            layout: String::new(),
        }
    }
}

/// Whether a failed build was stopped by RLIMIT_CPU: nvcc itself killed by SIGXCPU or SIGKILL
/// (the soft and the hard limit), or nvcc's or gcc's report of a child killed so (`'cicc' died
/// due to signal 9 (Kill signal)`, `Killed signal terminated program cc1plus`).
fn cpu_limit_hit(signal: Option<i32>, log: &str) -> bool {
    matches!(signal, Some(libc::SIGXCPU | libc::SIGKILL))
        || [
            "died due to signal 9",
            "died due to signal 24",
            "Killed signal terminated program",
            "CPU time limit exceeded signal terminated program",
        ]
        .iter()
        .any(|m| log.contains(m))
}

/// One sandboxed nvcc run.
struct NvccRun {
    ok: bool,
    timed_out: bool,
    log: String,
}

fn timeout_diagnostic(timeout: Duration) -> Diagnostic {
    Diagnostic {
        file: None,
        line: None,
        severity: "fatal".into(),
        message: format!(
            "compile exceeded its time limit ({:.0} CPU seconds a compiler process, {:.0} s of wall-clock time) and was killed",
            timeout.as_secs_f64().ceil().max(1.0),
            (timeout * WALL_FACTOR).as_secs_f64()
        ),
        tool: "harness".into(),
    }
}

fn unreadable(what: &str, why: impl std::fmt::Display) -> crate::static_check::Finding {
    crate::static_check::Finding {
        rule: "object-unreadable".into(),
        action: crate::static_check::Action::Reject,
        line: 0,
        matched: what.into(),
        message: format!("the build's {what} could not be inspected: {why}"),
    }
}
