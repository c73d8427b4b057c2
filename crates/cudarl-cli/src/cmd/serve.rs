//! `cudarl-pipe serve`: the kernel-evaluation service ([`cudarl_serve`]) over the pipeline's
//! task families (the `synth-tasks` node) and the KernelBench problems with a native launcher
//! (`kb-specs`, and `testgen` with a GPU), built first if needed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cudarl_cuda::verdict::hidden_salt;
use cudarl_cuda::worker::WorkerPool;
use cudarl_cuda::{Compiler, Nvcc};
use cudarl_serve::{Config, Tester};

use super::check::Mode;
use super::{CliError, Ctx};

/// Settings of `serve` from the command line.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = cudarl_rl::SERVE_BIND)]
    pub bind: SocketAddr,
    /// Most requests in the service at once (waiting or running); one more gets 429.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Per-request deadline, seconds (504 after it).
    #[arg(long, default_value_t = 300.0)]
    pub deadline_s: f64,
    /// Largest request body, bytes (413 above).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Bearer token required on /v1/* (default: none).
    #[arg(long, env = "CUDARL_SERVE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// `auto`: GPU tests when there is a GPU; `compile`: compile-only service.
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    pub mode: Mode,
    /// Concurrent nvcc builds (default: the CPU cores).
    #[arg(long)]
    pub compile_workers: Option<usize>,
    /// Target architecture for nvcc (default: the GPU's, or sm_90 without a GPU).
    #[arg(long)]
    pub arch: Option<String>,
    /// Wall-clock limit per GPU job step, seconds (hangs are killed).
    #[arg(long, default_value_t = 20)]
    pub timeout: u64,
    /// Verdicts kept in the in-memory result cache.
    #[arg(long, default_value_t = 10_000)]
    pub cache_entries: usize,
    /// The GPUs to judge on, by CUDA device index (`0,2`; default: every visible GPU).
    #[arg(long, value_delimiter = ',', value_name = "INDEX,...")]
    pub gpus: Option<Vec<usize>>,
    /// Testers per GPU: worker processes that run candidates' tests side by side while each
    /// timing has the GPU alone (four gave 1.14x the verdicts/s of one and 0.81x its p50
    /// latency at 16 clients: benchmarks/results/verdict_speed_h100_2026-12-06.json).
    #[arg(long, default_value_t = cudarl_cuda::worker::DEFAULT_GPU_WORKERS, value_name = "N")]
    pub gpu_testers: usize,
    /// Reward config scoring each verdict (`configs/reward/<NAME>.toml`).
    #[arg(long, default_value = "default", value_name = "NAME")]
    pub reward: String,
}

/// The CUDA device indices `serve` judges on: `picked` (checked against the devices this
/// machine shows), or every visible GPU; none without a GPU (`has_gpu` false: none found, or
/// `--mode compile`).
///
/// # Errors
/// Usage (exit 2): `--gpus` names a device the machine does not show, or is given where there
/// is no GPU to judge on; `--gpu-testers 0`.
fn pick_gpus(
    has_gpu: bool,
    picked: Option<Vec<usize>>,
    testers: usize,
) -> Result<Vec<usize>, CliError> {
    if testers == 0 {
        return Err(CliError::usage("--gpu-testers: at least 1 tester per GPU"));
    }
    let visible = if has_gpu {
        cudarl_cuda::gpu::device_count()
    } else {
        0
    };
    let Some(mut picked) = picked else {
        return Ok((0..visible).collect());
    };
    if let Some(bad) = picked.iter().find(|&&i| i >= visible) {
        return Err(CliError::usage(if visible == 0 {
            format!("--gpus {bad}: no GPU to judge on (none found, or `--mode compile`)")
        } else {
            format!(
                "--gpus: no GPU {bad} (this machine shows {visible}: 0 to {})",
                visible - 1
            )
        }));
    }
    picked.sort_unstable();
    picked.dedup();
    Ok(picked)
}

/// Runs the service until SIGINT/SIGTERM.
pub fn run(ctx: &Ctx, a: ServeArgs) -> Result<i32, CliError> {
    if a.mode == Mode::Full {
        return Err(CliError::usage(
            "serve: --mode is auto or compile (requests choose full or compile)",
        ));
    }
    let gpu = (a.mode != Mode::Compile)
        .then(cudarl_cuda::gpu::probe)
        .flatten();
    let gpus = pick_gpus(gpu.is_some(), a.gpus.clone(), a.gpu_testers)?;
    let engine = ctx.engine(Arc::new(crate::report::CliReporter::detect(false)), 0)?;
    super::build(&engine, "synth-tasks")?;
    let tasks = cudarl_serve::load_served_tasks(
        &super::output_blob(&engine, "synth-tasks", "tasks")?,
        &super::output_blob(&engine, "synth-tasks", "task_kernels")?,
    )?;
    // KernelBench problems with a native launcher; without them (no Python with torch for
    // `kb-specs`), the task families alone, and the reason on stderr.
    let kernelbench = kernelbench(ctx, &engine, gpu.is_some()).unwrap_or_else(|e| {
        eprintln!("note: KernelBench problems are not served: {}", e.message);
        Vec::new()
    });
    let rel = format!("configs/reward/{}.toml", a.reward);
    let reward = cudarl_rl::reward::RewardConfig::load(&ctx.root.join(&rel), &rel)
        .map_err(|e| CliError::usage(e.to_string()))?;
    let nvcc = Nvcc::discover(&ctx.root).map_err(|e| CliError::failed(e.to_string()))?;
    let n_gpus = gpus.len();
    let store = engine.store().clone();
    let salt = if n_gpus > 0 {
        hidden_salt(&store).map_err(|e| CliError::failed(e.to_string()))?
    } else {
        Vec::new()
    };
    let arch = a
        .arch
        .clone()
        .or_else(|| gpu.as_ref().map(|g| g.arch.clone()))
        .unwrap_or_else(|| "sm_90".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cfg = Config {
        tasks,
        kernelbench,
        gpu: gpu.clone(),
        root: ctx.root.clone(),
        compiler: Compiler {
            nvcc,
            arch,
            timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
            store: Some(store),
        },
        gpus: gpus
            .iter()
            .map(|&i| {
                (0..a.gpu_testers)
                    .map(|_| Tester {
                        native: WorkerPool::judge().on_gpu(i),
                        kernelbench: cudarl_cuda::torchfmt::pool(&ctx.root).on_gpu(i),
                    })
                    .collect()
            })
            .collect(),
        salt,
        queue: a.queue,
        compile_workers: a.compile_workers.unwrap_or(cores),
        deadline: Duration::from_secs_f64(a.deadline_s.max(0.001)),
        gpu_wall: Duration::from_secs(a.timeout),
        max_body_bytes: a.max_body_bytes,
        token: a.token,
        cache_entries: a.cache_entries,
        reward,
        optimizer: Some({
            let ctx = Arc::new(ctx.to_owned_quiet());
            Arc::new(move |req| super::optimize::answer(&ctx, req))
        }),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::failed(format!("tokio runtime: {e}")))?;
    let n_tasks = cfg.tasks.len() + cfg.kernelbench.len();
    rt.block_on(cudarl_serve::serve(a.bind, cfg, |addr| {
        use std::io::Write;
        let mut o = std::io::stdout().lock();
        let _ = writeln!(
            o,
            "listening on http://{addr} ({n_tasks} tasks, {n_gpus} GPUs, {} mode)",
            if n_gpus > 0 { "full" } else { "compile-only" }
        );
        let _ = o.flush();
    }))
    .map_err(|e| CliError::usage(format!("serve on {}: {e}", a.bind)))?;
    Ok(0)
}

/// The KernelBench problems `kb-specs` gave a native launcher, for the service: their source,
/// launcher, level, tier (`configs/curriculum/op_categories.toml`, as `curriculum` decides it)
/// and, with a GPU, `testgen`'s recorded tests (the nodes built first if needed).
fn kernelbench(
    ctx: &Ctx,
    engine: &cudarl_core::Engine,
    gpu: bool,
) -> Result<Vec<cudarl_serve::ServedProblem>, CliError> {
    use cudarl_curriculum::tiers::OP_CATEGORIES;
    super::build(engine, if gpu { "testgen" } else { "kb-specs" })?;
    let out = |node: &str, name: &str| super::output_blob(engine, node, name);
    let problems = out("ingest-kernelbench", "problems")?;
    let tests = gpu.then(|| out("testgen", "kb_tests")).transpose()?;
    let mut kb =
        cudarl_rl::kernelbench::load_kb_problems(&problems, tests.as_deref(), engine.store())?;
    let mut abis = cudarl_rl::kernelbench::native_abis(&out("kb-specs", "kb_specs")?)?;
    let cat_path = ctx.root.join(OP_CATEGORIES);
    let text = std::fs::read_to_string(&cat_path)
        .map_err(|e| CliError::failed(format!("{}: {e}", cat_path.display())))?;
    let cats = cudarl_curriculum::Categories::parse(&text, OP_CATEGORIES)
        .map_err(|e| CliError::failed(e.message))?;
    Ok(
        cudarl_tables::read::<cudarl_tables::problems::ProblemRow>(&problems, "problems")
            .map_err(|e| CliError::failed(e.to_string()))?
            .into_iter()
            .filter_map(|row| {
                let native = abis.remove(&row.problem_id)?.ok()?;
                let problem = kb.remove(&row.problem_id)?;
                Some(cudarl_serve::ServedProblem {
                    tier: cats.decide(Some(row.level), &row.op_features).tier,
                    problem,
                    native,
                    level: row.level,
                    name: row.name,
                })
            })
            .collect(),
    )
}
