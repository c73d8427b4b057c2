//! `cudarl-pipe check`: one kernel through the harness.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use cudarl_cuda::verdict::{FullOptions, check_full, hidden_salt, hidden_seeds};
use cudarl_cuda::worker::WorkerPool;
use cudarl_cuda::{Compiler, Nvcc, Rules, check_compile_only, load_tasks};

use super::{CliError, Ctx};

/// Check modes.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Mode {
    /// Full on a GPU, compile-only without one.
    Auto,
    /// Static checks and compile only.
    Compile,
    /// Also run and time on the GPU (fails without one).
    Full,
}

/// How [`check_kb`] judges: timing, the run's wall-clock limit (s), and where to write a
/// native candidate's `ModelNew` wrapper.
struct KbCheck<'a> {
    bench: bool,
    timeout: u64,
    model_new: Option<&'a std::path::Path>,
    /// Screen `ModelNew` files with the allow-list (`check --without-allowlist` turns it off).
    allowlist: bool,
}

/// A KernelBench problem (`kb/L1/19_ReLU`) with torch-format candidates, or native ones
/// defining the launcher `kb-specs` derived ([`torchfmt::build_kb_native`]), judged in turn by
/// one worker pool: its recorded tests come from the `testgen` node, the signature from
/// `kb-specs` (built first if needed).
fn check_kb(
    ctx: &Ctx,
    task_id: &str,
    srcs: &[String],
    abi: Option<&str>,
    compiler: &Compiler,
    gpu: Option<cudarl_cuda::gpu::GpuInfo>,
    opts: &KbCheck,
) -> Result<Vec<cudarl_cuda::Verdict>, CliError> {
    use cudarl_cuda::torchfmt::{self, Format};
    let formats: Vec<Format> = srcs.iter().map(|s| torchfmt::detect(s, abi)).collect();
    let native = formats.contains(&Format::Native);
    if native && formats.iter().any(|f| *f != Format::Native) {
        return Err(CliError::usage(format!(
            "`{task_id}`: give native candidates (`extern \"C\" void launch(...)` as `kb-specs` declares it) or torch-format ones, not both in one check"
        )));
    }
    if opts.model_new.is_some() && (!native || srcs.len() != 1) {
        return Err(CliError::usage(
            "--model-new wraps one native candidate (`extern \"C\" void launch(...)`): give exactly one such --source",
        ));
    }
    let reporter = std::sync::Arc::new(crate::report::CliReporter::detect(false));
    let engine = ctx.engine(reporter.clone(), 0)?;
    let problem = kb_problem(&engine, task_id, gpu.is_some(), native)?;
    let kb = KbRun {
        ctx,
        engine: &engine,
        reporter: &reporter,
        task_id,
        compiler,
    };
    let built = kb.build(srcs, &formats, opts)?;
    let Some(g) = gpu else {
        return Ok(built.into_iter().map(|(v, _)| v).collect());
    };
    Ok(kb.judge(built, &problem, g, opts))
}

/// The KernelBench problem `task_id` with what a check needs of it, its recorded tests when
/// `on_gpu` (the `testgen` node, built first if needed); a compile-only check needs only the
/// problem's code (and a native one the `kb-specs` signature, built too).
///
/// # Errors
/// An unknown problem id (usage), a problem without recorded tests on a GPU, a failed build.
fn kb_problem(
    engine: &cudarl_core::Engine,
    task_id: &str,
    on_gpu: bool,
    native: bool,
) -> Result<cudarl_cuda::torchfmt::KbProblem, CliError> {
    let target = match (on_gpu, native) {
        (true, _) => "testgen",
        (false, true) => "kb-specs",
        (false, false) => "ingest-kernelbench",
    };
    super::build(engine, target)?;
    let out = |node: &str, name: &str| super::output_blob(engine, node, name);
    let mut problems = cudarl_rl::kernelbench::load_kb_problems(
        &out("ingest-kernelbench", "problems")?,
        on_gpu
            .then(|| out("testgen", "kb_tests"))
            .transpose()?
            .as_deref(),
        engine.store(),
    )
    .map_err(|e| CliError::failed(e.to_string()))?;
    let Some(problem) = problems.remove(task_id) else {
        return Err(CliError::usage(format!(
            "unknown KernelBench problem `{task_id}`{} (e.g. {})",
            cudarl_core::suggest::did_you_mean(task_id, problems.keys().map(String::as_str)),
            problems
                .keys()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    if on_gpu && problem.tests.is_empty() {
        return Err(CliError::failed(format!(
            "`{task_id}` has no recorded tests (see `cudarl-pipe show testgen`)"
        )));
    }
    Ok(problem)
}

/// One KernelBench check's context: the engine whose store holds the problem's tables, the
/// progress reporter, the problem id and the compiler.
struct KbRun<'a> {
    ctx: &'a Ctx,
    engine: &'a cudarl_core::Engine,
    reporter: &'a crate::report::CliReporter,
    task_id: &'a str,
    compiler: &'a Compiler,
}

/// A built candidate: its verdict so far, and what a GPU run needs when the build passed.
type KbBuilt = (cudarl_cuda::Verdict, Option<serde_json::Value>);

impl KbRun<'_> {
    /// Builds every candidate of `srcs` (of `formats`, all native or all torch-format), writing
    /// a native one's `ModelNew` wrapper where `opts.model_new` asks.
    fn build(
        &self,
        srcs: &[String],
        formats: &[cudarl_cuda::torchfmt::Format],
        opts: &KbCheck,
    ) -> Result<Vec<KbBuilt>, CliError> {
        use cudarl_cuda::torchfmt::{self, Format};
        let task_id = self.task_id;
        let native = formats.contains(&Format::Native);
        let mut rules = Rules::builtin();
        rules.python_allowlist &= opts.allowlist;
        let mut built = Vec::new();
        // Builds take about a second each (native) or about a minute (a torch extension), a GPU
        // run tens of seconds: progress with the elapsed time (lines when stderr is not a
        // terminal).
        let label = if native {
            "candidates built (nvcc)"
        } else {
            "candidates built (torch extensions, about a minute each)"
        };
        let bar =
            cudarl_core::Reporter::progress(self.reporter, task_id, label, Some(srcs.len() as u64));
        if native {
            let abi = kb_native(self.engine, task_id)?;
            if let Some(path) = opts.model_new {
                let note =
                    "A native kernel checked by `cudarl-pipe check`, as a KernelBench ModelNew.";
                std::fs::write(path, abi.model_new(task_id, &srcs[0], note)).map_err(|e| {
                    CliError::failed(format!("--model-new: write {}: {e}", path.display()))
                })?;
            }
            for src in srcs {
                built.push(
                    torchfmt::build_kb_native(task_id, src, &abi, &rules, self.compiler)
                        .map_err(|e| CliError::failed(e.to_string()))?,
                );
                bar.inc(1);
            }
        } else {
            let mut py =
                cudarl_cuda::pyworker::PyWorker::start(&self.ctx.root).map_err(CliError::failed)?;
            let env = cudarl_cuda::pyworker::TorchEnv::query(&mut py).map_err(CliError::failed)?;
            for (src, format) in srcs.iter().zip(formats) {
                let prep = torchfmt::prepare(src, *format, &rules, Some(&mut py))
                    .map_err(CliError::failed)?;
                built.push(
                    torchfmt::build(task_id, &prep, &rules, self.compiler, Some(&env))
                        .map_err(|e| CliError::failed(e.to_string()))?,
                );
                bar.inc(1);
            }
        }
        bar.finish();
        Ok(built)
    }

    /// Runs every built candidate on the GPU `g` against `problem`'s recorded tests, its own
    /// sizes and (with `opts.bench`) its timing against torch eager and `torch.compile`.
    fn judge(
        &self,
        built: Vec<KbBuilt>,
        problem: &cudarl_cuda::torchfmt::KbProblem,
        g: cudarl_cuda::gpu::GpuInfo,
        opts: &KbCheck,
    ) -> Vec<cudarl_cuda::Verdict> {
        use cudarl_cuda::torchfmt;
        let mut pool = torchfmt::pool(&self.ctx.root);
        let run = torchfmt::TorchRunOptions {
            wall: Duration::from_secs(opts.timeout),
            bench: opts.bench.then(cudarl_cuda::gpu::BenchSpec::default),
            torch_compile: opts.bench,
            root: self.ctx.root.clone(),
            store: self.compiler.store.clone(),
            profile: true,
            full_size_after_failure: true,
        };
        let bar = cudarl_core::Reporter::progress(
            self.reporter,
            self.task_id,
            "candidates judged (recorded tests, own sizes, timing)",
            Some(built.len() as u64),
        );
        let verdicts = built
            .into_iter()
            .map(|(v, cand)| {
                let v = match cand {
                    Some(cand) => {
                        torchfmt::run(v, &cand, problem, &mut pool, &run, Some(g.clone()))
                    }
                    None => v,
                };
                bar.inc(1);
                v
            })
            .collect();
        bar.finish();
        verdicts
    }
}

/// The compiler (nvcc, the GPU's arch or `arch`, the store's compile cache), the GPU if `mode`
/// wants one and there is one, and a shared gc guard on the store (gc waits while it lives).
fn harness(
    ctx: &Ctx,
    mode: Mode,
    arch: Option<String>,
) -> Result<
    (
        Compiler,
        Option<cudarl_cuda::gpu::GpuInfo>,
        cudarl_core::GcGuard,
    ),
    CliError,
> {
    let nvcc = Nvcc::discover(&ctx.root).map_err(|e| CliError::failed(e.to_string()))?;
    let gpu = if mode == Mode::Compile {
        None
    } else {
        cudarl_cuda::gpu::probe()
    };
    if mode == Mode::Full && gpu.is_none() {
        return Err(CliError::usage(
            "--mode full needs a GPU; none is usable here (use --mode compile)",
        ));
    }
    let arch = arch
        .or_else(|| gpu.as_ref().map(|g| g.arch.clone()))
        .unwrap_or_else(|| "sm_90".into());
    let store = ctx.open_store()?;
    let guard = store
        .gc_guard_shared()
        .map_err(|e| CliError::failed(e.to_string()))?;
    Ok((
        Compiler {
            nvcc,
            arch,
            timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
            store: Some(store),
        },
        gpu,
        guard,
    ))
}

/// The text of a candidate source: the file at `path`, or standard input for `-`.
///
/// # Errors
/// Unreadable, empty (only whitespace), or not text (not UTF-8, or NUL bytes): one line naming
/// the file (exit 2).
fn read_source(path: &std::path::Path) -> Result<String, CliError> {
    use std::io::Read;
    let name = if path.as_os_str() == "-" {
        "standard input".to_string()
    } else {
        path.display().to_string()
    };
    let mut bytes = Vec::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut bytes).map(|_| ())
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut bytes).map(|_| ()))
    };
    read.map_err(|e| CliError::usage(format!("{name}: {e}")))?;
    let text = String::from_utf8(bytes)
        .ok()
        .filter(|t| !t.contains('\0'))
        .ok_or_else(|| {
            CliError::usage(format!(
                "{name}: not a source file (binary: invalid UTF-8 or NUL bytes); give CUDA C++ or Python text"
            ))
        })?;
    if text.trim().is_empty() {
        return Err(CliError::usage(format!(
            "{name}: empty source; give the kernel's CUDA C++ (or a `ModelNew` Python file for a KernelBench problem)"
        )));
    }
    Ok(text)
}

/// A native-ABI task as `serve` knows it: its spec and its naive kernel's source (the timing
/// baseline), when known.
struct NativeTask {
    spec: cudarl_cuda::TaskSpec,
    naive: Option<String>,
}

/// The task `task_id` of the native ABI: a hand-written task (a folder of `datasets/tasks/`,
/// read as is), else a generated family of the `synth-tasks` node (built first if needed), as
/// `serve` knows them.
///
/// # Errors
/// No task has that id (exit 2, with the nearest id and how many there are); the task folders
/// or the node's tables do not load.
fn native_task(ctx: &Ctx, task_id: &str) -> Result<NativeTask, CliError> {
    let tasks =
        load_tasks(&ctx.root.join("datasets/tasks")).map_err(|e| CliError::usage(e.to_string()))?;
    if let Some(t) = tasks.iter().find(|t| t.spec.id == task_id) {
        return Ok(NativeTask {
            naive: t.naive_source().ok(),
            spec: t.spec.clone(),
        });
    }
    let engine = ctx.engine(std::sync::Arc::new(cudarl_core::NullReporter), 0)?;
    super::build(&engine, "synth-tasks")?;
    let served = cudarl_serve::load_served_tasks(
        &super::output_blob(&engine, "synth-tasks", "tasks")?,
        &super::output_blob(&engine, "synth-tasks", "task_kernels")?,
    )?;
    let ids: Vec<&str> = served.iter().map(|t| t.spec.id.as_str()).collect();
    let unknown = CliError::usage(format!(
        "unknown task `{task_id}`{} ({} tasks: the folders of datasets/tasks/ and the generated families, `cudarl-pipe show synth-tasks --output tasks` lists them; KernelBench problems are kb/L<level>/<name>)",
        cudarl_core::suggest::did_you_mean(task_id, ids.iter().copied()),
        ids.len()
    ));
    served
        .into_iter()
        .find(|t| t.spec.id == task_id)
        .map(|t| NativeTask {
            spec: t.spec,
            naive: t.naive,
        })
        .ok_or(unknown)
}

/// The native launcher `kb-specs` derived for KernelBench problem `task_id` (the node must be
/// built).
///
/// # Errors
/// The table cannot be read (exit 1); the problem has no native launcher or is not in it
/// (exit 2, with the reason).
fn kb_native(
    engine: &cudarl_core::Engine,
    task_id: &str,
) -> Result<cudarl_cuda::native_abi::KbNative, CliError> {
    let specs = super::output_blob(engine, "kb-specs", "kb_specs")?;
    cudarl_rl::kernelbench::native_abi(&specs, task_id)
        .map_err(|e| CliError::failed(e.to_string()))?
        .map_err(CliError::usage)
}

/// `check --task T --signature`: the launcher declaration a candidate of `task_id` must define,
/// then the task's sizes: a hand-written task's train shapes, or a KernelBench problem's own
/// sizes from `kb-specs` (built first if needed). With `json`, one object `{task_id,
/// signature, sizes}` (`sizes`: a list of name -> value objects).
///
/// # Errors
/// An unknown task (exit 2, with the nearest name), a KernelBench problem without a native
/// launcher (exit 2, with the reason), a failed `kb-specs` build.
pub fn signature(ctx: &Ctx, task_id: &str, json: bool) -> Result<i32, CliError> {
    let (signature, sizes) = if task_id.starts_with("kb/") {
        let engine = ctx.engine(std::sync::Arc::new(cudarl_core::NullReporter), 0)?;
        super::build(&engine, "kb-specs")?;
        let abi = kb_native(&engine, task_id)?;
        let own: serde_json::Map<String, serde_json::Value> = (abi.sizes.iter())
            .zip(&abi.size_values)
            .map(|(n, v)| (n.clone(), (*v).into()))
            .collect();
        (abi.signature, vec![serde_json::Value::Object(own)])
    } else {
        let task = native_task(ctx, task_id)?;
        let shapes = (task.spec.train_shapes.iter())
            .map(|s| serde_json::to_value(s).expect("sizes serialize"))
            .collect();
        (task.spec.signature(), shapes)
    };
    if json {
        super::json_line(&serde_json::json!({
            "task_id": task_id, "signature": signature, "sizes": sizes,
        }));
    } else {
        println!("{signature};");
        for s in &sizes {
            println!("// sizes: {s}");
        }
    }
    Ok(0)
}

/// Runs `check` on every file of `sources` in turn (one worker pool for all): each verdict is
/// printed (with `--json`, one JSON line per verdict); the exit code is 0 when all pass, else 1.
#[allow(clippy::too_many_arguments)]
pub fn run(
    ctx: &Ctx,
    task_id: &str,
    sources: &[PathBuf],
    abi: Option<&str>,
    mode: Mode,
    arch: Option<String>,
    (bench, profile): (bool, bool),
    timeout: u64,
    (json, model_new, allowlist): (bool, Option<&std::path::Path>, bool),
) -> Result<i32, CliError> {
    let srcs = sources
        .iter()
        .map(|p| read_source(p))
        .collect::<Result<Vec<_>, _>>()?;
    let verdicts = if task_id.starts_with("kb/") {
        let (compiler, gpu, _gc) = harness(ctx, mode, arch)?;
        let opts = KbCheck {
            bench,
            timeout,
            model_new,
            allowlist,
        };
        check_kb(ctx, task_id, &srcs, abi, &compiler, gpu, &opts)?
    } else if model_new.is_some() {
        return Err(CliError::usage(format!(
            "--model-new: `{task_id}` is not a KernelBench problem (a `ModelNew` file wraps a kb/... problem's native kernel)"
        )));
    } else {
        check_native(
            ctx,
            task_id,
            &srcs,
            abi,
            (mode, arch),
            (bench, profile),
            timeout,
        )?
    };
    // The harness compiles a copy named `kernel.cu`: diagnostics name the user's file.
    let verdicts: Vec<cudarl_cuda::Verdict> = verdicts
        .into_iter()
        .zip(sources)
        .map(|(mut v, path)| {
            for d in &mut v.diagnostics {
                if d.file.as_deref() == Some(cudarl_cuda::inspect::SOURCE_NAME) {
                    d.file = Some(match path.to_str() {
                        Some("-") => "<stdin>".to_string(),
                        _ => path.display().to_string(),
                    });
                }
            }
            v
        })
        .collect();
    if json && verdicts.len() > 1 {
        verdicts.iter().for_each(super::json_line);
        return Ok(i32::from(!verdicts.iter().all(passed)));
    }
    Ok(verdicts
        .iter()
        .map(|v| print_verdict(v, json))
        .max()
        .unwrap_or(0))
}

/// Native-ABI candidates `srcs` for the synthetic task `task_id`, judged in turn by one worker
/// pool (compile-only without a GPU).
fn check_native(
    ctx: &Ctx,
    task_id: &str,
    srcs: &[String],
    abi: Option<&str>,
    (mode, arch): (Mode, Option<String>),
    (bench, profile): (bool, bool),
    timeout: u64,
) -> Result<Vec<cudarl_cuda::Verdict>, CliError> {
    if abi == Some("torch") {
        return Err(CliError::usage(format!(
            "`{task_id}` is a synthetic task: its candidates use the native ABI (`extern \"C\" void launch(...)`)"
        )));
    }
    let task = native_task(ctx, task_id)?;
    let (compiler, gpu, _gc) = harness(ctx, mode, arch)?;
    let rules = Rules::builtin();
    if gpu.is_none() {
        return srcs
            .iter()
            .map(|src| {
                check_compile_only(&task.spec, src, &rules, &compiler)
                    .map_err(|e| CliError::failed(e.to_string()))
            })
            .collect();
    }
    let mut pool = WorkerPool::judge();
    let salt = compiler
        .store
        .as_ref()
        .map(hidden_salt)
        .transpose()
        .map_err(|e| CliError::failed(e.to_string()))?
        .unwrap_or_default();
    let naive = task.naive;
    srcs.iter()
        .map(|src| {
            let opts = FullOptions {
                public_seeds: vec![0, 1],
                hidden_seeds: hidden_seeds(&salt, task_id, src, 2),
                wall: Duration::from_secs(timeout),
                bench,
                timing: cudarl_cuda::gpu::BenchSpec::default(),
                time_naive: true,
                profile,
            };
            check_full(
                &task.spec,
                src,
                naive.as_deref(),
                &rules,
                &compiler,
                &mut pool,
                &opts,
                &Default::default(),
            )
            .map_err(|e| CliError::failed(e.to_string()))
        })
        .collect()
}

/// Whether `v` passes: compiled, and correct when it ran.
fn passed(v: &cudarl_cuda::Verdict) -> bool {
    v.failure.is_none() && (v.compiled && (!v.executed || v.correct == Some(true)))
}

/// Prints a verdict (text or JSON); returns the exit code (0 pass, 1 fail).
fn print_verdict(v: &cudarl_cuda::Verdict, json: bool) -> i32 {
    if json {
        super::json_line(v);
    } else {
        println!(
            "task {} ({} mode, {} on nvcc {})",
            v.task_id, v.mode, v.arch, v.nvcc_version
        );
        for f in &v.static_flags {
            println!(
                "  static {:?} {} (line {}): {}",
                f.action, f.rule, f.line, f.message
            );
        }
        println!(
            "  compiled: {}{}",
            v.compiled,
            if v.cache_hit { " (cache hit)" } else { "" }
        );
        for d in v
            .diagnostics
            .iter()
            .filter(|d| d.severity != "warning")
            .take(10)
        {
            let at = match (&d.file, d.line) {
                (Some(f), Some(l)) => format!(" {f}:{l}"),
                (Some(f), None) => format!(" {f}"),
                _ => String::new(),
            };
            println!("  {}{at}: {}", d.severity, d.message);
        }
        for r in &v.resources {
            println!(
                "  {}: {} registers, {} B smem, {} B stack, {} B spill stores",
                cudarl_cuda::diag::demangle(&r.kernel),
                r.registers,
                r.shared_mem_bytes,
                r.stack_frame_bytes,
                r.spill_store_bytes
            );
        }
        if !v.executed {
            println!("  executed: false (no GPU: correctness and speed are not checked)");
        } else {
            println!(
                "  correct: {} ({} tests, max abs err {:.2e})",
                v.correct.unwrap_or(false),
                v.tests.len(),
                v.max_abs_err.unwrap_or(0.0)
            );
            if let Some(t) = &v.timing {
                println!(
                    "  time: median {:.4} ms (p10 {:.4}, p90 {:.4}, cv {:.3}, {} reps)",
                    t.median_ms, t.p10_ms, t.p90_ms, t.cv, t.reps
                );
            }
            if let Some(s) = v.speedup_vs_naive {
                println!("  speedup vs naive: {s:.2}x");
            }
            if let Some(s) = v.speedup_vs_torch {
                println!("  speedup vs torch eager: {s:.2}x");
            }
            if let Some(s) = v.speedup_vs_torch_compile {
                println!("  speedup vs torch.compile: {s:.2}x");
            } else if let Some(e) = &v.torch_compile_error {
                println!("  speedup vs torch.compile: not timed ({e})");
            }
            if let Some(f) = v.dram_fraction_of_peak {
                println!("  DRAM bandwidth: {:.0}% of peak", f * 100.0);
            }
        }
        if let Some(f) = &v.failure {
            println!(
                "  FAILED: {f}{}",
                v.failure_detail
                    .as_ref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            );
        }
        for h in &v.hack_flags {
            println!("  hack flag: {h}");
        }
        if v.window_words {
            println!(
                "  windows: ordered by the arena's fallback words (the runner could not map the window events)"
            );
        }
    }
    i32::from(!passed(v))
}
