//! `cudarl-pipe serve`: the kernel-evaluation service ([`cudarl_serve`]) over the pipeline's
//! task families (the `synth-tasks` node, built first if needed).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cudarl_cuda::verdict::hidden_salt;
use cudarl_cuda::worker::WorkerPool;
use cudarl_cuda::{Compiler, Nvcc};
use cudarl_serve::Config;

use super::check::Mode;
use super::{CliError, Ctx};

/// Settings of `serve` from the command line.
#[derive(Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port; the bound address is printed).
    pub bind: SocketAddr,
    /// Most requests in the service at once.
    pub queue: usize,
    /// Per-request deadline, seconds.
    pub deadline_s: f64,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Bearer token for `/v1/*`.
    pub token: Option<String>,
    /// `auto` (GPU tests when there is a GPU) or `compile`.
    pub mode: Mode,
    /// Concurrent nvcc builds (default: the CPU cores).
    pub compile_workers: Option<usize>,
    /// nvcc target (default: the GPU's, or sm_90).
    pub arch: Option<String>,
    /// Wall-clock limit per GPU job step, seconds.
    pub timeout: u64,
    /// Verdicts kept in the result cache.
    pub cache_entries: usize,
    /// `configs/reward/<reward>.toml`.
    pub reward: String,
}

/// Runs the service until SIGINT/SIGTERM.
pub fn run(ctx: &Ctx, a: ServeArgs) -> Result<i32, CliError> {
    if a.mode == Mode::Full {
        return Err(CliError::usage(
            "serve: --mode is auto or compile (requests choose full or compile)",
        ));
    }
    let reporter = Arc::new(crate::report::CliReporter::detect(false));
    let engine = ctx.engine(reporter, 0)?;
    let summary = engine.run(
        &["synth-tasks".to_string()],
        &cudarl_core::RunOptions::default(),
    )?;
    if summary.exit_code() != 0 {
        return Err(CliError::failed(
            "building `synth-tasks` failed; see `cudarl-pipe run synth-tasks`",
        ));
    }
    let out = |name: &str| -> Result<std::path::PathBuf, CliError> {
        let m = engine.fresh_manifest("synth-tasks")?;
        let rec = m
            .outputs
            .get(name)
            .ok_or_else(|| CliError::failed(format!("`synth-tasks` has no output `{name}`")))?;
        Ok(engine.store().blob_path(&rec.hash))
    };
    let tasks = cudarl_serve::load_served_tasks(&out("tasks")?, &out("task_kernels")?)
        .map_err(CliError::failed)?;
    let rel = format!("configs/reward/{}.toml", a.reward);
    let reward = cudarl_stages::reward::RewardConfig::load(&ctx.root.join(&rel), &rel)
        .map_err(CliError::usage)?;
    let nvcc = Nvcc::discover(&ctx.root).map_err(|e| CliError::failed(e.to_string()))?;
    let gpu = (a.mode != Mode::Compile)
        .then(cudarl_cuda::gpu::probe)
        .flatten();
    let n_gpus = if gpu.is_some() {
        cudarl_cuda::gpu::device_count()
    } else {
        0
    };
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
        compiler: Compiler {
            nvcc,
            arch,
            timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
            store: Some(store),
        },
        gpus: (0..n_gpus)
            .map(|i| WorkerPool::new(cudarl_cuda::worker::worker_exe(), vec![]).on_gpu(i))
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
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::failed(format!("tokio runtime: {e}")))?;
    let n_tasks = cfg.tasks.len();
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
