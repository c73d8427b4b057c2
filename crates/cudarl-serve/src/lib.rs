//! The kernel-evaluation service behind `cudarl-pipe serve`: the harness over HTTP, for
//! rollouts that run elsewhere (VERL's agent loop and reward function on a Ray cluster, see
//! `python/cudarl_verl/`).
//!
//! Endpoints (described in OpenAPI 3.1 at `GET /openapi.json`, the file `openapi.json` beside
//! this crate's sources):
//! - `POST /v1/evaluate` {task_id, source, abi?, seeds?, mode?, deadline_s?} -> the verdict
//!   JSON of `cudarl-pipe check --json` ([`cudarl_cuda::Verdict`]) plus `reward`: the shaped
//!   reward's components under the served reward config (what `rl-train` stores per turn), and
//!   `feedback`: the tester's words on it, as `rl-train`'s episodes show the optimizer
//!   (compile errors with lines, the failing shape, resource findings).
//! - `POST /v1/evaluate/batch` {candidates: [{id?, task_id, source, abi?, seeds?, mode?,
//!   deadline_s?}, ...], deadline_s?} -> `application/x-ndjson`: one line per candidate as its
//!   answer is ready, `{index, id?, status, verdict | error, cache?}` (`verdict` as
//!   `/v1/evaluate` answers, `status` what `/v1/evaluate` would have answered it), for a
//!   trainer that scores a whole step's rollouts at once ([`BatchRequest`]).
//! - `GET /v1/tasks`, `GET /v1/tasks/{id}` (prompt, signature, shapes).
//! - `POST /v1/optimize` {problem | problem_id, name?, level?, samples?, turns?} -> what
//!   `cudarl-pipe optimize --json` prints, with the kept kernel's `code`, `model_new` and
//!   `verdict` (null when none was kept): the trained agents on one problem, one request at a
//!   time.
//!
//! Tasks: the pipeline's task families, and KernelBench problems (`kb/L1/19_ReLU`) with the
//! native launcher `kb-specs` derived: a native candidate is built like any native kernel and,
//! in full mode, run by the Python worker against `testgen`'s recorded tests and timed against
//! torch eager on the first GPU ([`cudarl_cuda::torchfmt::run`], as `cudarl-pipe check --task
//! kb/...`). Torch-format KernelBench candidates (a `ModelNew` file or a SakanaAI-style
//! extension) are judged the same way after their torch-extension build
//! ([`cudarl_cuda::torchfmt::build`], tens of seconds of nvcc each, on a compile thread; a
//! request whose deadline passes first gets 504 while the build lands in the store's cache).
//! - `GET /healthz`, `GET /metrics` (Prometheus text: queue depth, latency histogram, verdict
//!   and response counts).
//!
//! Admission: at most `queue` requests are in the service at once (waiting or running; a batch
//! is one request, its candidates judged side by side under the same build and GPU limits as
//! everyone's); one more is answered 429 at once (backpressure, never an unbounded queue).
//! Each request has a deadline (504 when it passes; the build goes on in the background and
//! lands in the caches).
//! nvcc runs on up to `compile_workers` blocking threads (all cores by default); full tests go
//! to the GPUs' testers (`serve --gpu-testers`, [`cudarl_cuda::worker::DEFAULT_GPU_WORKERS`] per
//! GPU by default), one candidate each: a GPU's testers run tests side by side and each timing
//! has the GPU alone. Verdicts are cached in memory by the
//! BLAKE3 hash of (task, abi, mode, seeds, source); compiled objects are cached in the store
//! by nvcc's own key, so a repeated source never recompiles. An optional bearer token guards
//! `/v1/*`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cudarl_cuda::task::TaskSpec;
use cudarl_cuda::verdict::{Baselines, FullOptions, check_full, hidden_seeds};
use cudarl_cuda::worker::WorkerPool;
use cudarl_cuda::{Compiler, Rules, Verdict, check_compile_only};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The OpenAPI description served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// A task the service evaluates against: its spec and its naive kernel (the speedup baseline).
#[derive(Debug, Clone)]
pub struct ServedTask {
    /// The task.
    pub spec: TaskSpec,
    /// Its naive kernel's source, when known.
    pub naive: Option<String>,
}

/// A KernelBench problem the service judges native candidates for.
#[derive(Debug, Clone)]
pub struct ServedProblem {
    /// The problem: id, PyTorch source, recorded tests (empty on a compile-only service),
    /// tolerance.
    pub problem: cudarl_cuda::torchfmt::KbProblem,
    /// Its native launcher and buffers (`kb-specs`).
    pub native: cudarl_cuda::native_abi::KbNative,
    /// KernelBench level.
    pub level: i64,
    /// Curriculum tier 0..3 of its ops (`configs/curriculum/op_categories.toml`).
    pub tier: i64,
    /// Problem name (`19_ReLU`).
    pub name: String,
}

impl ServedProblem {
    /// The task view of the problem: the generator's prompt
    /// ([`cudarl_curriculum::prompts::module_description`]) and the launcher.
    fn view(&self) -> TaskView {
        use cudarl_curriculum::prompts;
        let description = prompts::module_description(&self.problem.code);
        let dtype = prompts::signature_dtype(&self.native.signature);
        let v = prompts::TaskView {
            tier: self.tier,
            description: &description,
            dtype,
            signature: &self.native.signature,
            shapes: &[],
        };
        let prompt = vec![
            json!({"role": "system", "content": prompts::GENERATOR_SYSTEM}),
            json!({"role": "user", "content": prompts::task_prompt(&v, 0, 0)}),
        ];
        TaskView {
            id: self.problem.id.clone(),
            tier: self.tier,
            description,
            dtype: dtype.into(),
            signature: self.native.signature.clone(),
            train_shapes: vec![],
            prompt,
        }
    }
}

/// Settings of the service.
pub struct Config {
    /// The task families, by id.
    pub tasks: Vec<ServedTask>,
    /// KernelBench problems with a native launcher (may be empty).
    pub kernelbench: Vec<ServedProblem>,
    /// The GPU KernelBench candidates run on (the first; none: compile-only for them).
    pub gpu: Option<cudarl_cuda::gpu::GpuInfo>,
    /// The project root (the Python worker script and interpreter for KernelBench runs).
    pub root: std::path::PathBuf,
    /// nvcc, the target architecture, the store's compile cache.
    pub compiler: Compiler,
    /// The testers of each GPU (empty: compile-only service). A GPU's testers run candidates'
    /// tests side by side while each timing has the GPU alone
    /// ([`cudarl_cuda::worker::GpuLock`], as `validate`'s testers do), and share the GPU's
    /// baseline timings.
    pub gpus: Vec<Vec<Tester>>,
    /// Hidden-seed salt (the store's; hidden seeds are derived per task and source).
    pub salt: Vec<u8>,
    /// Most requests in the service at once (waiting or running); one more gets 429.
    pub queue: usize,
    /// Most nvcc builds at once.
    pub compile_workers: usize,
    /// Longest time one request may take (a request's own `deadline_s` can only shorten it).
    pub deadline: Duration,
    /// Wall-clock limit per GPU job step (hangs are killed).
    pub gpu_wall: Duration,
    /// Largest request body, bytes (413 above).
    pub max_body_bytes: usize,
    /// Bearer token required on `/v1/*` (none: open).
    pub token: Option<String>,
    /// Verdicts kept in the result cache (oldest dropped first).
    pub cache_entries: usize,
    /// The reward config (`configs/reward/<name>.toml`): each verdict also gets its shaped
    /// reward under `reward` (the components `rl-train` stores per turn), so a remote trainer
    /// scores exactly as `rl-train` does.
    pub reward: cudarl_rl::reward::RewardConfig,
    /// What answers `POST /v1/optimize` (the CLI's `optimize` on this store); none: 503.
    pub optimizer: Option<Optimizer>,
}

/// `POST /v1/optimize` body: one of `problem` (a KernelBench-format PyTorch source: a `Model`
/// with `get_inputs`) and `problem_id` (`kb/L1/19_ReLU`), as `cudarl-pipe optimize PROBLEM`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizeRequest {
    /// A KernelBench-format PyTorch source.
    #[serde(default)]
    pub problem: Option<String>,
    /// A KernelBench problem id.
    #[serde(default)]
    pub problem_id: Option<String>,
    /// The file name a source is filed under (KernelBench's `<N>_<name>`; default `0_problem`).
    #[serde(default)]
    pub name: Option<String>,
    /// The KernelBench level a source is filed under (default 1).
    #[serde(default)]
    pub level: Option<i64>,
    /// Episodes (default: the pipeline's `optimize.samples`).
    #[serde(default)]
    pub samples: Option<usize>,
    /// Turns per episode (default: the pipeline's `optimize.max_turns`).
    #[serde(default)]
    pub turns: Option<usize>,
}

/// Runs the trained agents on one problem (blocking; minutes): the answer's JSON, or an HTTP
/// status and message (422 for a problem that is not one).
pub type Optimizer =
    Arc<dyn Fn(OptimizeRequest) -> Result<Value, (u16, String)> + Send + Sync + 'static>;

/// `POST /v1/evaluate` body, and one candidate of a [`BatchRequest`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluateRequest {
    /// The client's name for the candidate, echoed in its line of a batch answer (not part of
    /// the verdict or its cache key; `/v1/evaluate` answers without it).
    #[serde(default)]
    pub id: Option<String>,
    /// Task id (`GET /v1/tasks`).
    pub task_id: String,
    /// The candidate's CUDA source (native ABI: `extern "C" void launch(...)`).
    pub source: String,
    /// `native` (the default; the only ABI the service's tasks use).
    #[serde(default)]
    pub abi: Option<String>,
    /// Public seeds of the tests (default `[0, 1]`, as `check`); hidden seeds are added.
    #[serde(default)]
    pub seeds: Option<Vec<u64>>,
    /// `compile` or `full` (default: full with a GPU, compile without).
    #[serde(default)]
    pub mode: Option<String>,
    /// Seconds this request may take (capped by the server's deadline; in a batch, from the
    /// batch's start, instead of the batch's `deadline_s`).
    #[serde(default)]
    pub deadline_s: Option<f64>,
}

/// Most candidates in one [`BatchRequest`].
pub const MAX_BATCH: usize = 1024;

/// `POST /v1/evaluate/batch` body: 1 to [`MAX_BATCH`] candidates, judged side by side as one
/// admitted request, at most the compile threads plus the GPU testers of them in flight at once.
/// They run whether or not the client reads; a client that hangs up stops those not yet started.
/// Identical candidates (the same task, mode, seeds and source) are judged once, under the first
/// one's deadline, and each gets its line. The answer streams one JSON line per candidate, in the
/// order they finish (cached verdicts and request errors first): `index` (its place in
/// `candidates`), `id` (when given), `status` (the HTTP status `/v1/evaluate` would have answered
/// it: 200, 404, 422, 500 or 504) and `verdict` (status 200; `cache: "hit"` when from the verdict
/// cache) or `error`. The whole request is refused only as a body (400, 413, 415, 422: not 1 to
/// [`MAX_BATCH`] candidates, or one of them malformed), by the token (401) or by a full queue (429
/// with Retry-After).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// The candidates, each as `POST /v1/evaluate` takes one.
    pub candidates: Vec<EvaluateRequest>,
    /// Seconds each candidate may take from the batch's start, unless it gives its own (capped
    /// by the server's deadline).
    #[serde(default)]
    pub deadline_s: Option<f64>,
}

/// A task as `GET /v1/tasks/{id}` describes it.
#[derive(Debug, Clone, Serialize)]
struct TaskView {
    id: String,
    tier: i64,
    description: String,
    dtype: String,
    signature: String,
    train_shapes: Vec<BTreeMap<String, i64>>,
    prompt: Vec<Value>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlagLabel {
    flag: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    code: String,
}

struct Metrics {
    registry: Registry,
    queue_depth: Gauge,
    latency: Histogram,
    verdicts: Family<OutcomeLabel, Counter>,
    flagged: Family<FlagLabel, Counter>,
    responses: Family<StatusLabel, Counter>,
    batch_lines: Family<StatusLabel, Counter>,
    cache_hits: Counter,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("cudarl_serve");
        let queue_depth = Gauge::default();
        // 10 ms .. ~164 s, doubling.
        let latency = Histogram::new(exponential_buckets(0.01, 2.0, 15));
        let verdicts = Family::<OutcomeLabel, Counter>::default();
        let flagged = Family::<FlagLabel, Counter>::default();
        let responses = Family::<StatusLabel, Counter>::default();
        let batch_lines = Family::<StatusLabel, Counter>::default();
        let cache_hits = Counter::default();
        registry.register(
            "queue_depth",
            "Evaluate requests in the service (waiting or running)",
            queue_depth.clone(),
        );
        registry.register(
            "evaluate_seconds",
            "Latency of answered evaluate requests, seconds",
            latency.clone(),
        );
        registry.register(
            "verdicts",
            "Verdicts by outcome: pass, compiled (compile-only), or the failure class",
            verdicts.clone(),
        );
        registry.register(
            "flagged_verdicts",
            "Verdicts with a hack flag, by flag (a flagged verdict earns reward 0)",
            flagged.clone(),
        );
        registry.register(
            "responses",
            "Evaluate responses by HTTP status",
            responses.clone(),
        );
        registry.register(
            "batch_lines",
            "Candidates of batch requests answered, by the status of their line",
            batch_lines.clone(),
        );
        registry.register(
            "cache_hits",
            "Evaluate requests answered from the verdict cache",
            cache_hits.clone(),
        );
        Metrics {
            registry,
            queue_depth,
            latency,
            verdicts,
            flagged,
            responses,
            batch_lines,
            cache_hits,
        }
    }

    /// Counts a batch line of `status`.
    fn batch_line(&self, status: StatusCode) {
        self.batch_lines
            .get_or_create(&StatusLabel {
                code: status.as_u16().to_string(),
            })
            .inc();
    }
}

/// One tester of a GPU: a native judge and a KernelBench judge, both pinned to the GPU
/// ([`WorkerPool::on_gpu`]); their processes start with their first candidate.
pub struct Tester {
    /// The native judge (`cudarl-pipe-worker`, [`WorkerPool::judge`]).
    pub native: WorkerPool,
    /// The Python judge of KernelBench candidates ([`cudarl_cuda::torchfmt::pool`]).
    pub kernelbench: WorkerPool,
}

/// One tester of a GPU, and the GPU's naive-kernel and libtorch timings (shared by the GPU's
/// testers).
struct GpuSlot {
    tester: Tester,
    baselines: Arc<std::sync::Mutex<Baselines>>,
}

struct Inner {
    tasks: BTreeMap<String, ServedTask>,
    kernelbench: BTreeMap<String, Arc<ServedProblem>>,
    gpu_info: Option<cudarl_cuda::gpu::GpuInfo>,
    root: std::path::PathBuf,
    /// A Python worker for torch-format candidates (torch's build environment, the `ModelNew`
    /// extraction) and the environment it reported, started on first use.
    torch_py: Mutex<
        Option<(
            cudarl_cuda::pyworker::PyWorker,
            cudarl_cuda::pyworker::TorchEnv,
        )>,
    >,
    compiler: Compiler,
    rules: Rules,
    /// Every GPU's testers, interleaved (the first of each GPU, then the second, ...), so
    /// round-robin picks spread candidates over the GPUs.
    gpus: Vec<Arc<Mutex<GpuSlot>>>,
    /// The GPUs the service judges on (0: compile-only).
    n_gpus: usize,
    gpu_free: Arc<Semaphore>,
    next_gpu: AtomicUsize,
    salt: Vec<u8>,
    admission: Arc<Semaphore>,
    queue: usize,
    compile: Arc<Semaphore>,
    /// Most candidates of one batch in flight at once (building, waiting for a GPU tester or on
    /// it): the compile threads plus the GPU testers, enough to keep both busy, so a request
    /// arriving during a batch waits behind at most that many of its candidates.
    batch_window: usize,
    deadline: Duration,
    gpu_wall: Duration,
    token: Option<String>,
    cache: Mutex<VerdictCache>,
    cache_entries: usize,
    reward: cudarl_rl::reward::RewardConfig,
    metrics: Metrics,
    optimizer: Option<Optimizer>,
    /// One `optimize` at a time (each builds pipeline nodes and uses the GPU for minutes).
    optimizing: Arc<Semaphore>,
}

type Shared = Arc<Inner>;

/// Verdicts by request key, and the keys oldest first (for eviction).
type VerdictCache = (
    HashMap<[u8; 32], Value>,
    std::collections::VecDeque<[u8; 32]>,
);

/// An error answer: `{"error": message}` with a status.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

/// The router with every endpoint (for [`serve`] and in-process use).
pub fn router(cfg: Config) -> Router {
    let max_body = cfg.max_body_bytes;
    let n_gpus = cfg.gpus.iter().filter(|t| !t.is_empty()).count();
    let gpus = interleave(cfg.gpus);
    let batch_window = cfg.compile_workers.max(1) + gpus.len().max(1);
    let inner = Inner {
        tasks: cfg
            .tasks
            .into_iter()
            .map(|t| (t.spec.id.clone(), t))
            .collect(),
        kernelbench: cfg
            .kernelbench
            .into_iter()
            .map(|p| (p.problem.id.clone(), Arc::new(p)))
            .collect(),
        gpu_info: cfg.gpu,
        root: cfg.root,
        torch_py: Mutex::new(None),
        compiler: cfg.compiler,
        rules: Rules::builtin(),
        gpu_free: Arc::new(Semaphore::new(gpus.len())),
        gpus,
        n_gpus,
        next_gpu: AtomicUsize::new(0),
        salt: cfg.salt,
        admission: Arc::new(Semaphore::new(cfg.queue.max(1))),
        queue: cfg.queue.max(1),
        compile: Arc::new(Semaphore::new(cfg.compile_workers.max(1))),
        batch_window,
        deadline: cfg.deadline,
        gpu_wall: cfg.gpu_wall,
        token: cfg.token,
        cache: Mutex::new(Default::default()),
        cache_entries: cfg.cache_entries,
        reward: cfg.reward,
        metrics: Metrics::new(),
        optimizer: cfg.optimizer,
        optimizing: Arc::new(Semaphore::new(1)),
    };
    let state: Shared = Arc::new(inner);
    let evaluate_route = limited(post(evaluate), &state, max_body);
    let batch_route = limited(post(evaluate_batch), &state, max_body);
    Router::new()
        .route("/v1/evaluate", evaluate_route)
        .route("/v1/evaluate/batch", batch_route)
        .route(
            "/v1/optimize",
            post(optimize).layer::<_, std::convert::Infallible>(
                tower_http::limit::RequestBodyLimitLayer::new(max_body),
            ),
        )
        .route("/v1/tasks", get(tasks))
        .route("/v1/tasks/{*id}", get(task))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .with_state(state)
}

/// The testers of every GPU as slots, the first tester of each GPU, then the second, ...; a
/// GPU's testers share one baseline table.
fn interleave(gpus: Vec<Vec<Tester>>) -> Vec<Arc<Mutex<GpuSlot>>> {
    let mut per_gpu: Vec<_> = gpus
        .into_iter()
        .map(|testers| {
            let baselines = Arc::new(std::sync::Mutex::new(Baselines::default()));
            testers.into_iter().map(move |tester| GpuSlot {
                tester,
                baselines: baselines.clone(),
            })
        })
        .collect();
    let mut slots = Vec::new();
    loop {
        let round: Vec<_> = per_gpu.iter_mut().filter_map(Iterator::next).collect();
        if round.is_empty() {
            return slots;
        }
        slots.extend(round.into_iter().map(|g| Arc::new(Mutex::new(g))));
    }
}

/// `route` with the body limit (413 from the Content-Length alone, before reading a byte, or
/// once a chunked body passes it; axum's own 2 MB default is replaced by it) and, outermost,
/// every answer counted by status (the limit's 413 too).
fn limited(
    route: axum::routing::MethodRouter<Shared>,
    state: &Shared,
    max_body: usize,
) -> axum::routing::MethodRouter<Shared> {
    route
        .layer::<_, std::convert::Infallible>(tower_http::limit::RequestBodyLimitLayer::new(
            max_body,
        ))
        .layer::<_, std::convert::Infallible>(DefaultBodyLimit::disable())
        .layer::<_, std::convert::Infallible>(axum::middleware::from_fn_with_state(
            state.clone(),
            count_status,
        ))
}

/// Serves `cfg` on `addr` until SIGINT or SIGTERM. Calls `on_listen` with the bound address
/// first (port 0 picks a free port).
///
/// # Errors
/// The address cannot be bound, or the server fails.
pub async fn serve(
    addr: SocketAddr,
    cfg: Config,
    on_listen: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    on_listen(listener.local_addr()?);
    axum::serve(listener, router(cfg))
        .with_graceful_shutdown(shutdown())
        .await
}

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// `POST /v1/optimize`: the trained generator and optimizer with the tester on one problem, as
/// `cudarl-pipe optimize --json` (one at a time; a second request waits).
async fn optimize(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Result<Json<OptimizeRequest>, JsonRejection>,
) -> Response {
    let req = match accepted(&s, &headers, body) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    if req.problem.is_some() == req.problem_id.is_some() {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "give one of `problem` (a KernelBench-format PyTorch source) and `problem_id` (kb/L1/19_ReLU)",
        );
    }
    let Some(f) = s.optimizer.clone() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this server does not optimize (started without the pipeline)",
        );
    };
    let Ok(_one) = s.optimizing.clone().acquire_owned().await else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    };
    match tokio::task::spawn_blocking(move || f(req)).await {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err((code, m))) => error(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            m,
        ),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("optimize failed: {e}"),
        ),
    }
}

fn authorized(s: &Inner, headers: &HeaderMap) -> bool {
    let Some(tok) = &s.token else { return true };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| {
            // Constant-time over the token's length.
            let (a, b) = (given.as_bytes(), tok.as_bytes());
            a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
        })
}

/// The body of an authorized call, or the answer refusing it: 401 without the token, else the
/// JSON rejection's status and text (400 for bad syntax, 415 for another content type, 422 for
/// JSON that is not a `T`).
fn accepted<T>(
    s: &Inner,
    headers: &HeaderMap,
    body: Result<Json<T>, JsonRejection>,
) -> Result<T, Box<Response>> {
    if !authorized(s, headers) {
        return Err(Box::new(unauthorized()));
    }
    body.map(|Json(r)| r)
        .map_err(|e| Box::new(error(e.status(), e.body_text())))
}

fn unauthorized() -> Response {
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        "missing or wrong bearer token (Authorization: Bearer <token>)",
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// Frees its admission slot and updates the queue-depth gauge when dropped (also when the
/// request's future is dropped: a client that hangs up does not leak a slot).
struct Admitted {
    _permit: OwnedSemaphorePermit,
    state: Shared,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let s = &self.state;
        // The permit is released after this runs: count it as gone already.
        let in_use = s.queue - s.admission.available_permits() - 1;
        s.metrics.queue_depth.set(in_use as i64);
    }
}

async fn evaluate(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Result<Json<EvaluateRequest>, JsonRejection>,
) -> Response {
    let t0 = Instant::now();
    let resp = evaluate_inner(&s, &headers, body).await;
    if resp.status() == StatusCode::OK {
        s.metrics.latency.observe(t0.elapsed().as_secs_f64());
    }
    resp
}

/// Counts every response of `/v1/evaluate` by status.
async fn count_status(
    State(s): State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let resp = next.run(req).await;
    s.metrics
        .responses
        .get_or_create(&StatusLabel {
            code: resp.status().as_u16().to_string(),
        })
        .inc();
    resp
}

async fn evaluate_inner(
    s: &Shared,
    headers: &HeaderMap,
    body: Result<Json<EvaluateRequest>, JsonRejection>,
) -> Response {
    let req = match accepted(s, headers, body) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let deadline = deadline_of(s, req.deadline_s, s.deadline);
    let judging = match prepare(s, req) {
        Prepared::Done(status, v, hit) => {
            if hit {
                s.metrics.cache_hits.inc();
            }
            return respond(status, v, hit);
        }
        Prepared::Judge(j) => j,
    };
    let Some(admitted) = admit(s) else {
        return busy(s);
    };
    let started = tokio::time::Instant::now();
    let (status, v) = run_judging(s.clone(), *judging, (started, deadline), admitted).await;
    respond(status, v, false)
}

/// `POST /v1/evaluate/batch` ([`BatchRequest`]): the candidates' answers as NDJSON lines,
/// request errors and cached verdicts first, then each judged one as it finishes. The batch is
/// admitted as one request when any candidate needs judging.
async fn evaluate_batch(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Result<Json<BatchRequest>, JsonRejection>,
) -> Response {
    use futures_util::StreamExt;
    let batch = match accepted(&s, &headers, body) {
        Ok(b) => b,
        Err(refused) => return *refused,
    };
    let n = batch.candidates.len();
    if n == 0 || n > MAX_BATCH {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("candidates: give 1 to {MAX_BATCH} candidates, not {n}"),
        );
    }
    let started = tokio::time::Instant::now();
    let batch_deadline = deadline_of(&s, batch.deadline_s, s.deadline);
    let mut ready = Vec::new();
    // Identical candidates (one cache key: task, mode, seeds, source) are judged once, under the
    // first one's deadline, and each gets its line.
    type Group = (Vec<(usize, Option<String>)>, Box<Judging>, Duration);
    let mut judgings: Vec<Group> = Vec::new();
    for (index, mut req) in batch.candidates.into_iter().enumerate() {
        let id = req.id.take();
        let deadline = deadline_of(&s, req.deadline_s, batch_deadline);
        match prepare(&s, req) {
            Prepared::Done(status, v, hit) => {
                ready.push((batch_line(index, id, status, v, hit), status, hit))
            }
            Prepared::Judge(j) => match judgings.iter_mut().find(|g: &&mut Group| g.1.key == j.key)
            {
                Some(same) => same.0.push((index, id)),
                None => judgings.push((vec![(index, id)], j, deadline)),
            },
        }
    }
    // Every candidate's task sends its line here; the answer streams them in arrival order.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut tasks = tokio::task::JoinSet::new();
    if !judgings.is_empty() {
        let Some(admitted) = admit(&s) else {
            return busy(&s);
        };
        let window = Arc::new(Semaphore::new(s.batch_window));
        for (asked, j, deadline) in judgings {
            let (s, admitted, window, tx) =
                (s.clone(), admitted.clone(), window.clone(), tx.clone());
            tasks.spawn(async move {
                let Ok(_in_flight) = window.acquire_owned().await else {
                    return;
                };
                let (status, v) = run_judging(s.clone(), *j, (started, deadline), admitted).await;
                for (index, id) in asked {
                    s.metrics.batch_line(status);
                    let _ = tx.send(batch_line(index, id, status, v.clone(), false));
                }
            });
        }
    }
    drop(tx);
    // Cache hits count once they are answered (not in a batch refused with 429).
    let ready: Vec<String> = ready
        .into_iter()
        .map(|(line, status, hit)| {
            if hit {
                s.metrics.cache_hits.inc();
            }
            s.metrics.batch_line(status);
            line
        })
        .collect();
    // The tasks live as long as the answer: a client that hangs up aborts the candidates not
    // yet started (a build already running goes on into the caches, holding the admission
    // slot, as for `/v1/evaluate`). They run whether or not the client reads.
    let judged = futures_util::stream::unfold((rx, tasks), |(mut rx, tasks)| async move {
        rx.recv().await.map(|line| (line, (rx, tasks)))
    });
    let lines = futures_util::stream::iter(ready)
        .chain(judged)
        .map(Ok::<_, std::convert::Infallible>);
    let mut r = axum::body::Body::from_stream(lines).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

/// One line of a batch answer: the candidate's `index` and `id`, the `status` `/v1/evaluate`
/// would have answered, and `verdict` (200, `cache: "hit"` when `hit`) or `error`.
fn batch_line(index: usize, id: Option<String>, status: StatusCode, v: Value, hit: bool) -> String {
    let mut line = json!({"index": index, "status": status.as_u16()});
    if let Some(id) = id {
        line["id"] = id.into();
    }
    if status == StatusCode::OK {
        line["verdict"] = v;
        if hit {
            line["cache"] = "hit".into();
        }
    } else {
        line["error"] = v["error"].clone();
    }
    let mut text = line.to_string();
    text.push('\n');
    text
}

/// A candidate's way to its answer: known before any work, or through the judge.
enum Prepared {
    /// The answer's status and JSON body (`{"error": ...}` unless 200), and whether it is a
    /// cached verdict.
    Done(StatusCode, Value, bool),
    /// To judge.
    Judge(Box<Judging>),
}

/// A request to judge: its task, source, public seeds, full tests or compile-only, and its key
/// in the verdict cache.
struct Judging {
    task: Served,
    source: String,
    seeds: Vec<u64>,
    full: bool,
    key: [u8; 32],
}

/// What `req` comes to before any work: a 404 or 422 ([`check_request`]), a cached verdict, or
/// a judging.
fn prepare(s: &Inner, req: EvaluateRequest) -> Prepared {
    let (task, full, seeds) = match check_request(s, &req) {
        Ok(c) => c,
        Err((status, message)) => return Prepared::Done(status, json!({"error": message}), false),
    };
    let key = cache_key(&req.task_id, full, &seeds, &req.source);
    if let Some(v) = cached(s, &key) {
        return Prepared::Done(StatusCode::OK, v, true);
    }
    Prepared::Judge(Box::new(Judging {
        task,
        source: req.source,
        seeds,
        full,
        key,
    }))
}

/// `own` seconds (when positive and finite) capped by the server's deadline, else `fallback`.
fn deadline_of(s: &Inner, own: Option<f64>, fallback: Duration) -> Duration {
    own.filter(|d| d.is_finite() && *d > 0.0)
        .map_or(fallback, |d| s.deadline.min(Duration::from_secs_f64(d)))
}

/// Judges `j` within `deadline` of `started`: 200 with the verdict ([`answer`]: counted and
/// cached), 504 when the deadline passed first (a build already started goes on and lands in the
/// caches; none starts past the deadline), or 500 with the service's own failure.
async fn run_judging(
    s: Shared,
    j: Judging,
    (started, deadline): (tokio::time::Instant, Duration),
    admitted: Arc<Admitted>,
) -> (StatusCode, Value) {
    let Judging {
        task,
        source,
        seeds,
        full,
        key,
    } = j;
    let late = || {
        (
            StatusCode::GATEWAY_TIMEOUT,
            json!({"error": format!(
                "deadline of {:.1} s passed (the build goes on and is cached)",
                deadline.as_secs_f64()
            )}),
        )
    };
    if started.elapsed() >= deadline {
        return late();
    }
    let tier = task.tier();
    let job = judge(
        s.clone(),
        task,
        source.clone(),
        seeds.clone(),
        full,
        admitted,
    );
    match tokio::time::timeout_at(started + deadline, job).await {
        Err(_) => late(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, json!({"error": e.0})),
        Ok(Ok(v)) => (StatusCode::OK, answer(&s, &v, key, (&source, tier, &seeds))),
    }
}

/// A JSON answer with `status`; marked `x-cache: hit` when `hit`.
fn respond(status: StatusCode, v: Value, hit: bool) -> Response {
    let mut r = (status, Json(v)).into_response();
    if hit {
        r.headers_mut()
            .insert("x-cache", HeaderValue::from_static("hit"));
    }
    r
}

/// 429 with Retry-After: the queue is full.
fn busy(s: &Inner) -> Response {
    let mut r = error(
        StatusCode::TOO_MANY_REQUESTS,
        format!(
            "queue full ({} requests in the service); retry later",
            s.queue
        ),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// What an evaluate request asks for: its task, whether to run the full tests (else compile
/// only) and its public seeds.
///
/// # Errors
/// The status and message of the answer: an unknown task (404), an empty source or one with NUL
/// bytes, an ABI other than `native`, an unknown mode, `full` without a GPU, or not 1 to 16
/// seeds (422).
fn check_request(
    s: &Inner,
    req: &EvaluateRequest,
) -> Result<(Served, bool, Vec<u64>), (StatusCode, String)> {
    let task = match (s.tasks.get(&req.task_id), s.kernelbench.get(&req.task_id)) {
        (Some(t), _) => Some(Served::Family(Box::new(t.clone()))),
        (None, Some(p)) => Some(Served::Kb(p.clone())),
        _ => None,
    };
    let Some(task) = task else {
        let hint = if req.task_id.starts_with("kb/") {
            "served KernelBench problems are those with a native launcher from `kb-specs` (GET /v1/tasks lists them); `cudarl-pipe check` judges the others"
        } else {
            "GET /v1/tasks lists them"
        };
        return Err((
            StatusCode::NOT_FOUND,
            format!("unknown task `{}` ({hint})", req.task_id),
        ));
    };
    let unprocessable = |m: String| Err((StatusCode::UNPROCESSABLE_ENTITY, m));
    // As `cudarl-pipe check` refuses such a file (exit 2), before any compile.
    if req.source.trim().is_empty() || req.source.contains('\0') {
        return unprocessable(
            "source: empty or not text (NUL bytes); give the kernel's CUDA C++".into(),
        );
    }
    if let Some(abi) = req.abi.as_deref().filter(|a| *a != "native") {
        return unprocessable(format!(
            "abi `{abi}`: this service's tasks take native-ABI kernels (`native`)"
        ));
    }
    let full = match req.mode.as_deref() {
        None => !s.gpus.is_empty(),
        Some("compile") => false,
        Some("full") if s.gpus.is_empty() => {
            return unprocessable(
                "mode `full`: this server has no GPU (mode `compile` only)".into(),
            );
        }
        Some("full") => true,
        Some(m) => return unprocessable(format!("mode `{m}`: expected `compile` or `full`")),
    };
    let seeds = req.seeds.clone().unwrap_or_else(|| vec![0, 1]);
    if seeds.is_empty() || seeds.len() > 16 {
        return unprocessable("seeds: give 1 to 16 public seeds".into());
    }
    Ok((task, full, seeds))
}

/// The cached verdict of request `key`; `None` when not cached.
fn cached(s: &Inner, key: &[u8; 32]) -> Option<Value> {
    let cache = s.cache.lock().unwrap_or_else(|e| e.into_inner());
    cache.0.get(key).cloned()
}

/// An admission slot for one request, the queue-depth gauge updated; `None` when the queue is
/// full.
fn admit(s: &Shared) -> Option<Arc<Admitted>> {
    let permit = s.admission.clone().try_acquire_owned().ok()?;
    s.metrics
        .queue_depth
        .set((s.queue - s.admission.available_permits()) as i64);
    // Held by the blocking jobs too: a request whose deadline passed keeps its slot until its
    // build ends (the queue counts work, not connections).
    Some(Arc::new(Admitted {
        _permit: permit,
        state: s.clone(),
    }))
}

/// The answer to a judged request: verdict `v` with the shaped `reward` and the tester's
/// `feedback` on `source` (a task of `tier`, `public_seeds`), counted in the metrics and
/// cached under `key` (the oldest entries evicted past `cache_entries`).
fn answer(
    s: &Inner,
    v: &Verdict,
    key: [u8; 32],
    (source, tier, public_seeds): (&str, i64, &[u64]),
) -> Value {
    // `pass` (ran and correct), `compiled` (compile-only, no failure) or the failure.
    let outcome = v
        .failure
        .clone()
        .unwrap_or_else(|| if v.executed { "pass" } else { "compiled" }.into());
    s.metrics
        .verdicts
        .get_or_create(&OutcomeLabel { outcome })
        .inc();
    for flag in &v.hack_flags {
        s.metrics
            .flagged
            .get_or_create(&FlagLabel { flag: flag.clone() })
            .inc();
    }
    let mut value = serde_json::to_value(v).expect("verdict serializes");
    // SASS is not disassembled here: SASS-based bonuses read the source alone.
    let r = cudarl_rl::reward::score(&s.reward, Some(source), Some(v), None);
    value["reward"] = serde_json::to_value(&r).expect("reward serializes");
    value["feedback"] = json!(cudarl_rl::episode::feedback(
        tier,
        Some(source),
        Some(v),
        public_seeds
    ));
    let mut c = s.cache.lock().unwrap_or_else(|e| e.into_inner());
    if c.0.insert(key, value.clone()).is_none() {
        c.1.push_back(key);
        while c.1.len() > s.cache_entries {
            if let Some(old) = c.1.pop_front() {
                c.0.remove(&old);
            }
        }
    }
    value
}

/// BLAKE3 of the fields a verdict depends on (the service's compiler and GPU are fixed for
/// its lifetime).
fn cache_key(task: &str, full: bool, seeds: &[u64], source: &str) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for part in [task.as_bytes(), if full { b"full" } else { b"comp" }] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(&(seeds.len() as u64).to_le_bytes());
    for x in seeds {
        h.update(&x.to_le_bytes());
    }
    h.update(source.as_bytes());
    *h.finalize().as_bytes()
}

/// Why the service could not judge a candidate: its own failure (a compile or GPU thread that
/// did not run, the Python worker, a problem without recorded tests), answered 500. What the
/// candidate did wrong is a verdict, never this.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct JudgeFailure(String);

impl JudgeFailure {
    fn of(e: impl std::fmt::Display) -> JudgeFailure {
        JudgeFailure(e.to_string())
    }
}

impl From<cudarl_cuda::pyworker::PythonError> for JudgeFailure {
    fn from(e: cudarl_cuda::pyworker::PythonError) -> JudgeFailure {
        JudgeFailure(e.0)
    }
}

/// Compile on a blocking thread (one of `compile_workers`), then, for `full`, the tests and
/// timing on a free GPU.
async fn judge(
    s: Shared,
    task: Served,
    source: String,
    seeds: Vec<u64>,
    full: bool,
    admitted: Arc<Admitted>,
) -> Result<Verdict, JudgeFailure> {
    let task = match task {
        Served::Family(t) => t,
        Served::Kb(p) => return judge_kb(s, p, source, full, admitted).await,
    };
    let (s2, t, src) = (s.clone(), task.spec.clone(), source.clone());
    let v = held(&s.compile, admitted.clone(), move || {
        check_compile_only(&t, &src, &s2.rules, &s2.compiler).map_err(JudgeFailure::of)
    })
    .await?;
    if !full || !v.compiled {
        return Ok(v);
    }
    let gpus = s.gpu_free.clone();
    held(&gpus, admitted, move || {
        let mut slot = free_slot(&s);
        let slot = &mut *slot;
        let opts = FullOptions {
            public_seeds: seeds,
            hidden_seeds: hidden_seeds(&s.salt, &task.spec.id, &source, 2),
            wall: s.gpu_wall,
            bench: true,
            timing: cudarl_cuda::gpu::BenchSpec::default(),
            time_naive: true,
            profile: false,
        };
        check_full(
            &task.spec,
            &source,
            task.naive.as_deref(),
            &s.rules,
            &s.compiler,
            &mut slot.tester.native,
            &opts,
            &slot.baselines,
        )
        .map_err(JudgeFailure::of)
    })
    .await
}

/// A free tester of the GPUs, for the holder of a `gpu_free` permit (the semaphore counts free
/// slots, so one exists): the first unlocked one, starting round-robin.
fn free_slot(s: &Inner) -> std::sync::MutexGuard<'_, GpuSlot> {
    let n = s.gpus.len();
    let start = s.next_gpu.fetch_add(1, Ordering::Relaxed);
    (0..n)
        .find_map(|k| s.gpus[(start + k) % n].try_lock().ok())
        .unwrap_or_else(|| s.gpus[start % n].lock().unwrap_or_else(|e| e.into_inner()))
}

/// Runs `f` on a blocking thread once a permit of `sem` is free (`compile`: one of the
/// `compile_workers`; `gpu_free`: a GPU tester), holding the permit and the request's admission until
/// `f` returns, so a request past its deadline keeps its place until its work ends.
async fn held<T: Send + 'static>(
    sem: &Arc<Semaphore>,
    admitted: Arc<Admitted>,
    f: impl FnOnce() -> Result<T, JudgeFailure> + Send + 'static,
) -> Result<T, JudgeFailure> {
    let permit = sem
        .clone()
        .acquire_owned()
        .await
        .map_err(JudgeFailure::of)?;
    tokio::task::spawn_blocking(move || {
        let _held = (permit, admitted);
        f()
    })
    .await
    .map_err(JudgeFailure::of)?
}

/// A task the service judges.
#[derive(Clone)]
enum Served {
    Family(Box<ServedTask>),
    Kb(Arc<ServedProblem>),
}

impl Served {
    fn tier(&self) -> i64 {
        match self {
            Served::Family(t) => t.spec.tier,
            Served::Kb(p) => p.tier,
        }
    }
}

/// A native KernelBench candidate: built on a compile thread, then (`full`, with a GPU and
/// recorded tests) run by the Python worker pool on a free GPU slot: the recorded tests at test
/// sizes, then timing at the problem's own sizes against torch eager.
async fn judge_kb(
    s: Shared,
    p: Arc<ServedProblem>,
    source: String,
    full: bool,
    admitted: Arc<Admitted>,
) -> Result<Verdict, JudgeFailure> {
    use cudarl_cuda::torchfmt::{self, Format};
    let (s2, p2) = (s.clone(), p.clone());
    let (v, cand) = held(&s.compile, admitted.clone(), move || {
        let format = torchfmt::detect(&source, None);
        if format == Format::Native {
            return torchfmt::build_kb_native(
                &p2.problem.id,
                &source,
                &p2.native,
                &s2.rules,
                &s2.compiler,
            )
            .map_err(JudgeFailure::of);
        }
        // Torch format: one Python worker extracts `ModelNew` builds and knows torch's build
        // environment; the extension builds (tens of seconds each) run on this compile thread.
        let mut py = s2.torch_py.lock().unwrap_or_else(|e| e.into_inner());
        if py.is_none() {
            let mut w = cudarl_cuda::pyworker::PyWorker::start(&s2.root)?;
            let env = cudarl_cuda::pyworker::TorchEnv::query(&mut w)?;
            *py = Some((w, env));
        }
        let (w, env) = py.as_mut().expect("started");
        let env = env.clone();
        let prep = torchfmt::prepare(&source, format, &s2.rules, Some(w))?;
        drop(py);
        torchfmt::build(&p2.problem.id, &prep, &s2.rules, &s2.compiler, Some(&env))
            .map_err(JudgeFailure::of)
    })
    .await?;
    let (Some(cand), Some(gpu_info), true) = (cand, s.gpu_info.clone(), full) else {
        return Ok(v);
    };
    if p.problem.tests.is_empty() {
        return Err(JudgeFailure(format!(
            "`{}` has no recorded tests (see `cudarl-pipe show testgen`)",
            p.problem.id
        )));
    }
    let gpus = s.gpu_free.clone();
    held(&gpus, admitted, move || {
        let mut slot = free_slot(&s);
        let pool = &mut slot.tester.kernelbench;
        let opts = cudarl_cuda::torchfmt::TorchRunOptions {
            wall: s.gpu_wall,
            bench: Some(cudarl_cuda::gpu::BenchSpec::default()),
            torch_compile: true,
            root: s.root.clone(),
            store: s.compiler.store.clone(),
            profile: true,
            full_size_after_failure: true,
        };
        Ok(cudarl_cuda::torchfmt::run(
            v,
            &cand,
            &p.problem,
            pool,
            &opts,
            Some(gpu_info),
        ))
    })
    .await
}

fn view(t: &TaskSpec) -> TaskView {
    let prompt = cudarl_rl::episode::generator_conversation(t)
        .into_iter()
        .map(|m| json!({"role": m.role, "content": m.content}))
        .collect();
    TaskView {
        id: t.id.clone(),
        tier: t.tier,
        description: t.description.clone(),
        dtype: t.dtype.clone(),
        signature: t.signature(),
        train_shapes: t.train_shapes.clone(),
        prompt,
    }
}

async fn tasks(State(s): State<Shared>, headers: HeaderMap) -> Response {
    if !authorized(&s, &headers) {
        return unauthorized();
    }
    let list: Vec<Value> = s
        .tasks
        .values()
        .map(|t| json!({"id": t.spec.id, "tier": t.spec.tier, "description": t.spec.description}))
        .chain(s.kernelbench.values().map(|p| {
            json!({"id": p.problem.id, "tier": p.tier,
                "description": format!("KernelBench level {} problem `{}`", p.level, p.name)})
        }))
        .collect();
    Json(json!({"tasks": list})).into_response()
}

async fn task(State(s): State<Shared>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if !authorized(&s, &headers) {
        return unauthorized();
    }
    match (s.tasks.get(&id), s.kernelbench.get(&id)) {
        (Some(t), _) => Json(view(&t.spec)).into_response(),
        (None, Some(p)) => Json(p.view()).into_response(),
        _ => error(StatusCode::NOT_FOUND, format!("unknown task `{id}`")),
    }
}

async fn healthz(State(s): State<Shared>) -> Response {
    Json(
        json!({"ok": true, "tasks": s.tasks.len() + s.kernelbench.len(),
        "kernelbench": s.kernelbench.len(), "gpus": s.n_gpus, "gpu_testers": s.gpus.len(),
        "mode": if s.gpus.is_empty() { "compile-only" } else { "full" },
        "nvcc": s.compiler.nvcc.version, "arch": s.compiler.arch}),
    )
    .into_response()
}

async fn metrics(State(s): State<Shared>) -> Response {
    let mut buf = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut buf, &s.metrics.registry) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        buf,
    )
        .into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// The tasks of the `synth-tasks` node's outputs: `tasks` (its `spec_json` column) and
/// `task_kernels` (the `naive` rows), i.e. the hand-written and the generated families of the
/// pipeline, with the ids the exported curriculum uses.
///
/// # Errors
/// An unreadable table or a bad spec, naming the file and the field.
pub fn load_served_tasks(
    tasks: &std::path::Path,
    kernels: &std::path::Path,
) -> Result<Vec<ServedTask>, cudarl_rl::RlError> {
    let mut naive = cudarl_rl::tasks::read_naive(kernels)?;
    Ok(cudarl_rl::tasks::read_specs(tasks)?
        .into_iter()
        .map(|spec| ServedTask {
            naive: naive.remove(&spec.id),
            spec,
        })
        .collect())
}
