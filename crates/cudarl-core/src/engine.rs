//! The engine: computes keys, decides fresh/stale, runs stages in parallel, publishes outputs
//! to the store, writes manifests, the run log and the lock file.

use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use cudarl_store::{Digest, Store};
use rayon::prelude::*;
use serde::Serialize;

use crate::key::{InputFingerprint, InputOrigin, KEY_FORMAT, Preimage};
use crate::lockfile::{LockFile, LockNode, LockOutput};
use crate::manifest::{MANIFEST_FORMAT, Manifest, OutputRecord};
use crate::pipeline::{Node, Pipeline};
use crate::report::Reporter;
use crate::stage::{
    InputSource, OutputKind, ResolveContext, ResolvedInput, RunPart, StageContext, StageError,
};
use crate::stale::{DirtyReason, diff_preimages};
use crate::table::{inspect_parquet, schema_hash, schema_mismatch};

/// Status of a node in a `run` or `status` report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// `run`: the stage executed and its outputs were published.
    Ran,
    /// `run`: the outputs for this key were already in the store.
    Cached,
    /// `run`: the stage failed (or its inputs could not be resolved).
    Failed,
    /// `run`: not attempted because an upstream node failed.
    Skipped,
    /// `run --dry-run`: would execute.
    WouldRun,
    /// `status`: outputs for the current key are in the store.
    Fresh,
    /// `status`: ran before with another key (see reasons).
    Stale,
    /// `status`: never ran.
    Missing,
    /// `run --shard i/N`: this machine's rows are in the row memo; no outputs (see `--merge`).
    Shard,
}

impl NodeStatus {
    /// Lowercase name, as in JSON output.
    pub fn as_str(&self) -> &'static str {
        match self {
            NodeStatus::Ran => "ran",
            NodeStatus::Cached => "cached",
            NodeStatus::Failed => "failed",
            NodeStatus::Skipped => "skipped",
            NodeStatus::WouldRun => "would_run",
            NodeStatus::Fresh => "fresh",
            NodeStatus::Stale => "stale",
            NodeStatus::Missing => "missing",
            NodeStatus::Shard => "shard",
        }
    }
}

/// An output in a node report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutputSummary {
    /// Content hash (hex).
    pub hash: String,
    /// Rows (tables; null for other outputs).
    pub rows: Option<u64>,
    /// Bytes.
    pub bytes: u64,
}

/// What happened to (or the state of) one node.
#[derive(Debug, Clone, Serialize)]
pub struct NodeRecord {
    /// Node name.
    pub node: String,
    /// Stage kind.
    pub stage: String,
    /// Current cache key, when it could be computed.
    pub key: Option<String>,
    /// Status.
    pub status: NodeStatus,
    /// Seconds spent (stage run time for `ran`, lookup time otherwise).
    pub seconds: f64,
    /// For `would_run` (`run --dry-run`): the stage run time of the node's previous run (the
    /// lock file's record of it, else any stored), seconds; `None` when it never ran.
    pub estimated_seconds: Option<f64>,
    /// Outputs (for `ran`, `cached`, `fresh`).
    pub outputs: BTreeMap<String, OutputSummary>,
    /// Why it ran / why it is stale, one cause per entry.
    pub reasons: Vec<String>,
    /// Warnings reported by the stage.
    pub warnings: Vec<String>,
    /// Counters the stage reported ([`StageContext::stat`]), e.g. a shard's rows computed and
    /// rows found in the memo.
    pub stats: BTreeMap<String, serde_json::Value>,
    /// Error message for `failed`.
    pub error: Option<String>,
    /// Whether the failure is bad input or config (exit code 2) rather than a stage failure.
    #[serde(skip)]
    pub bad_input: bool,
    /// Whether the node stopped, or never started, because a stop was requested
    /// ([`crate::interrupt`]; exit code 130).
    pub interrupted: bool,
    #[serde(skip)]
    pub(crate) full_outputs: Option<BTreeMap<String, OutputRecord>>,
    #[serde(skip)]
    pub(crate) code_version: u32,
    #[serde(skip)]
    pub(crate) dirty: Vec<DirtyReason>,
}

impl NodeRecord {
    fn new(node: &str, stage: &str, code_version: u32, status: NodeStatus) -> Self {
        NodeRecord {
            node: node.to_string(),
            stage: stage.to_string(),
            key: None,
            status,
            seconds: 0.0,
            estimated_seconds: None,
            outputs: BTreeMap::new(),
            reasons: Vec::new(),
            warnings: Vec::new(),
            stats: BTreeMap::new(),
            error: None,
            bad_input: false,
            interrupted: false,
            full_outputs: None,
            code_version,
            dirty: Vec::new(),
        }
    }

    fn with_outputs(mut self, outs: BTreeMap<String, OutputRecord>) -> Self {
        self.outputs = outs
            .iter()
            .map(|(k, o)| {
                (
                    k.clone(),
                    OutputSummary {
                        hash: o.hash.to_hex(),
                        rows: o.rows,
                        bytes: o.bytes,
                    },
                )
            })
            .collect();
        self.full_outputs = Some(outs);
        self
    }

    fn with_dirty(mut self, dirty: Vec<DirtyReason>) -> Self {
        self.reasons = dirty.iter().map(|d| d.to_string()).collect();
        self.dirty = dirty;
        self
    }

    /// Structured reasons (for `explain --json`).
    pub fn dirty_reasons(&self) -> &[DirtyReason] {
        &self.dirty
    }

    /// Full output records with CAS digests, when known.
    pub fn output_records(&self) -> Option<&BTreeMap<String, OutputRecord>> {
        self.full_outputs.as_ref()
    }
}

/// Result of a `run`.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The run id (also the name of `runs/<id>.jsonl`).
    pub run_id: String,
    /// One record per selected node, in topological order.
    pub records: Vec<NodeRecord>,
}

impl RunSummary {
    /// 0 if every node ran or was cached, 130 if a stop was requested and a node stopped or
    /// never started for it, 2 if a failure was bad input or config, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        if self.records.iter().any(|r| r.interrupted) {
            return crate::interrupt::EXIT_CODE;
        }
        let failed: Vec<&NodeRecord> = self
            .records
            .iter()
            .filter(|r| r.status == NodeStatus::Failed)
            .collect();
        if failed.is_empty() {
            0
        } else if failed.iter().any(|r| r.bad_input) {
            2
        } else {
            1
        }
    }

    /// Record of one node.
    pub fn record(&self, node: &str) -> Option<&NodeRecord> {
        self.records.iter().find(|r| r.node == node)
    }
}

/// Options of a `run`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Nodes to re-run even when cached.
    pub force: Vec<String>,
    /// Compute keys and report what would run, without running or writing anything.
    pub dry_run: bool,
    /// Which rows the targets compute (`--shard i/N`, `--merge`); their ancestors always run
    /// whole. Only [`crate::Stage::shardable`] targets accept anything but [`RunPart::Whole`].
    pub part: RunPart,
    /// Leave the lock file as it is (verbs that build a node to read it, such as `export`,
    /// record no lineage in the checkout).
    pub keep_lock_file: bool,
}

/// Errors of the engine itself (not of a stage).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Bad configuration or unknown node.
    #[error(transparent)]
    Stage(#[from] StageError),
    /// Store failure.
    #[error(transparent)]
    Store(#[from] cudarl_store::StoreError),
    /// Lock file failure.
    #[error(transparent)]
    Lock(#[from] crate::lockfile::LockFileError),
}

impl EngineError {
    /// Exit code: 2 for bad config or input, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            EngineError::Stage(e) if e.is_bad_input() => 2,
            EngineError::Lock(crate::lockfile::LockFileError::Parse { .. }) => 2,
            _ => 1,
        }
    }
}

/// The DAG engine over one pipeline and one store.
pub struct Engine {
    store: Store,
    pipeline: Pipeline,
    root: PathBuf,
    lock_path: PathBuf,
    reporter: Arc<dyn Reporter>,
    jobs: usize,
    git_commit: OnceLock<Option<String>>,
    /// Set by [`Engine::reading`]: stages' environments read store state and draw none.
    read_only: bool,
}

/// Environment variable for fault injection in crash-safety tests: `NODE:POINT` makes the
/// engine print `CUDARL_FAULT_PAUSED NODE POINT` on stderr and sleep for 10 minutes at that
/// point, so a test can SIGKILL the process there. Points: `before-run`, `after-run`
/// (outputs written to scratch, nothing published), `before-manifest` (blobs in the CAS, no
/// manifest yet).
pub const FAULT_ENV: &str = "CUDARL_FAULT";

/// Crash-test hook: when `CUDARL_FAULT` is `<node>:<point>`, prints `CUDARL_FAULT_PAUSED` to
/// stderr and pauses for 600 s, or until a stop is requested ([`crate::interrupt`]), so a test
/// can kill or interrupt the process exactly there (the engine's points: `before-run`,
/// `after-run`, `before-manifest`; stages add their own, e.g. `validate`'s `after-row`,
/// `rl-train`'s `before-step` and `after-checkpoint`).
pub fn fault_point(node: &str, point: &str) {
    if let Ok(spec) = std::env::var(FAULT_ENV)
        && spec == format!("{node}:{point}")
    {
        eprintln!("CUDARL_FAULT_PAUSED {node} {point}");
        let t0 = Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(600) && !crate::interrupt::requested() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Reads the commit of a git checkout at `root` without running git (HEAD, loose or packed ref).
pub fn read_git_commit(root: &Path) -> Option<String> {
    let git = root.join(".git");
    let head = std::fs::read_to_string(git.join("HEAD")).ok()?;
    let head = head.trim();
    if let Some(r) = head.strip_prefix("ref: ") {
        if let Ok(c) = std::fs::read_to_string(git.join(r)) {
            return Some(c.trim().to_string());
        }
        let packed = std::fs::read_to_string(git.join("packed-refs")).ok()?;
        packed
            .lines()
            .find_map(|l| l.strip_suffix(r).map(|c| c.trim().to_string()))
    } else {
        Some(head.to_string())
    }
}

struct Prepared {
    preimage: Preimage,
    inputs: BTreeMap<String, ResolvedInput>,
}

impl Engine {
    /// Creates an engine. `jobs` = 0 means one per CPU core.
    pub fn new(
        store: Store,
        pipeline: Pipeline,
        root: PathBuf,
        lock_path: PathBuf,
        reporter: Arc<dyn Reporter>,
        jobs: usize,
    ) -> Engine {
        let jobs = if jobs == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            jobs
        };
        Engine {
            store,
            pipeline,
            root,
            lock_path,
            reporter,
            jobs,
            git_commit: OnceLock::new(),
            read_only: false,
        }
    }

    /// This engine for a verb that only reads the store (`status`, `explain`, `show`, ...):
    /// the stages' environments see [`ResolveContext::read_only`] and create nothing in the
    /// store (a key that needs state not drawn yet says so, and its node is not fresh).
    pub fn reading(mut self) -> Engine {
        self.read_only = true;
        self
    }

    /// The pipeline.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Lock file path.
    pub fn lock_path(&self) -> &Path {
        &self.lock_path
    }

    fn prepare(
        &self,
        idx: usize,
        upstream: &HashMap<String, BTreeMap<String, OutputRecord>>,
    ) -> Result<Prepared, StageError> {
        let node = self.pipeline.node_at(idx);
        let ctx = ResolveContext {
            root: self.root.clone(),
            store: self.store.clone(),
            read_only: self.read_only,
        };
        let mut inputs = BTreeMap::new();
        let mut fps = BTreeMap::new();
        for decl in &node.inputs {
            match &decl.source {
                InputSource::Node { node: up, output } => {
                    let rec = upstream
                        .get(up)
                        .and_then(|outs| outs.get(output))
                        .ok_or_else(|| {
                            StageError::Failed(format!(
                                "upstream output {up}.{output} is not available"
                            ))
                        })?;
                    inputs.insert(
                        decl.name.clone(),
                        ResolvedInput::Blob(self.store.blob_path(&rec.hash)),
                    );
                    fps.insert(
                        decl.name.clone(),
                        InputFingerprint {
                            hash: rec.hash,
                            origin: InputOrigin::Node {
                                node: up.clone(),
                                output: output.clone(),
                            },
                        },
                    );
                }
                InputSource::External => {
                    let ext = node.stage.resolve_external(&decl.name, &ctx)?;
                    let hashed: Result<Vec<(String, Digest)>, StageError> = ext
                        .files
                        .par_iter()
                        .map(|(rel, path)| {
                            Digest::of_file(path)
                                .map(|d| (rel.clone(), d))
                                .map_err(|e| {
                                    StageError::bad_input(
                                        path.display().to_string(),
                                        None,
                                        format!("cannot read: {e}"),
                                    )
                                })
                        })
                        .collect();
                    let files: BTreeMap<String, Digest> = hashed?.into_iter().collect();
                    fps.insert(
                        decl.name.clone(),
                        InputFingerprint::external(ext.source.clone(), files),
                    );
                    inputs.insert(decl.name.clone(), ResolvedInput::External(ext));
                }
            }
        }
        let preimage = Preimage {
            format: KEY_FORMAT,
            stage: node.stage.kind().to_string(),
            code_version: node.stage.code_version(),
            params: node.stage.params(),
            inputs: fps,
            env: node.stage.environment(&ctx)?,
        };
        Ok(Prepared { preimage, inputs })
    }

    /// Loads the manifest for (node, key) if it exists, parses, and all its blobs are present.
    /// Returns the manifest or the reason it cannot be used.
    fn usable_manifest(&self, idx: usize, key: &str) -> Result<Manifest, Option<DirtyReason>> {
        let node = self.pipeline.node_at(idx);
        let bytes = match self.store.read_action(&node.name, key) {
            Ok(Some(b)) => b,
            _ => return Err(None),
        };
        let m: Manifest = match serde_json::from_slice(&bytes) {
            Ok(m) => m,
            Err(_) => return Err(None),
        };
        for o in &node.outputs {
            match m.outputs.get(&o.name) {
                Some(rec) if self.store.has_blob(&rec.hash) => {}
                _ => {
                    return Err(Some(DirtyReason::OutputMissing {
                        output: o.name.clone(),
                    }));
                }
            }
        }
        Ok(m)
    }

    /// The preimage this node had when it last completed: the lock file's key, else the newest
    /// manifest of the node in the store.
    fn previous_manifest(&self, node: &str, lock: &LockFile) -> Option<Manifest> {
        if let Some(ln) = lock.nodes.get(node)
            && let Ok(Some(b)) = self.store.read_action(node, &ln.key)
            && let Ok(m) = serde_json::from_slice::<Manifest>(&b)
        {
            return Some(m);
        }
        let entries = self.store.list_actions(Some(node)).ok()?;
        entries.iter().find_map(|e| {
            std::fs::read(&e.path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
        })
    }

    fn why_dirty(&self, node: &str, current: &Preimage, lock: &LockFile) -> Vec<DirtyReason> {
        match self.previous_manifest(node, lock) {
            None => vec![DirtyReason::NeverRan],
            Some(m) => {
                let d = diff_preimages(&m.preimage, current);
                if d.is_empty() {
                    // Same preimage as before but not usable: its outputs went missing.
                    vec![DirtyReason::OutputMissing {
                        output: "(one or more)".into(),
                    }]
                } else {
                    d
                }
            }
        }
    }

    /// Status of the targets and their ancestors (no targets: all nodes), in topological order.
    /// Reads only: never runs a stage or writes to the store.
    ///
    /// # Errors
    /// Unknown target, unreadable lock file.
    pub fn status(&self, targets: &[String]) -> Result<Vec<NodeRecord>, EngineError> {
        let order = self.pipeline.closure(targets)?;
        let lock = LockFile::read(&self.lock_path)?;
        let mut known: HashMap<String, BTreeMap<String, OutputRecord>> = HashMap::new();
        let mut out = Vec::new();
        for idx in order {
            let t0 = Instant::now();
            let node = self.pipeline.node_at(idx);
            let kind = node.stage.kind();
            let cv = node.stage.code_version();
            let stale_up: Vec<String> = self
                .pipeline
                .upstream(idx)
                .into_iter()
                .map(|u| self.pipeline.node_at(u).name.clone())
                .filter(|n| !known.contains_key(n))
                .collect();
            let has_history = self.previous_manifest(&node.name, &lock).is_some();
            if !stale_up.is_empty() {
                let status = if has_history {
                    NodeStatus::Stale
                } else {
                    NodeStatus::Missing
                };
                let mut dirty: Vec<DirtyReason> = stale_up
                    .into_iter()
                    .map(|n| DirtyReason::UpstreamStale { node: n })
                    .collect();
                if !has_history {
                    dirty.insert(0, DirtyReason::NeverRan);
                }
                let mut r = NodeRecord::new(&node.name, kind, cv, status).with_dirty(dirty);
                r.seconds = t0.elapsed().as_secs_f64();
                out.push(r);
                continue;
            }
            let prep = match self.prepare(idx, &known) {
                Ok(p) => p,
                Err(e) => {
                    let mut r = NodeRecord::new(
                        &node.name,
                        kind,
                        cv,
                        if has_history {
                            NodeStatus::Stale
                        } else {
                            NodeStatus::Missing
                        },
                    );
                    r.bad_input = e.is_bad_input();
                    r.error = Some(e.to_string());
                    r.reasons = vec![format!("cannot compute key: {e}")];
                    out.push(r);
                    continue;
                }
            };
            let key = prep.preimage.key();
            let mut r = match self.usable_manifest(idx, &key) {
                Ok(m) => {
                    known.insert(node.name.clone(), m.outputs.clone());
                    NodeRecord::new(&node.name, kind, cv, NodeStatus::Fresh).with_outputs(m.outputs)
                }
                Err(missing) => {
                    let mut dirty = self.why_dirty(&node.name, &prep.preimage, &lock);
                    if let Some(m) = missing {
                        dirty = vec![m];
                    }
                    let status = if dirty == vec![DirtyReason::NeverRan] {
                        NodeStatus::Missing
                    } else {
                        NodeStatus::Stale
                    };
                    NodeRecord::new(&node.name, kind, cv, status).with_dirty(dirty)
                }
            };
            r.key = Some(key);
            r.seconds = t0.elapsed().as_secs_f64();
            out.push(r);
        }
        Ok(out)
    }

    /// Runs the targets (no targets: every node) and their ancestors. Independent nodes run in
    /// parallel on `jobs` threads. Failed nodes make their dependents `skipped`; other branches
    /// go on.
    ///
    /// # Errors
    /// Unknown target, store or lock-file failures. Stage failures are records, not errors.
    pub fn run(&self, targets: &[String], opts: &RunOptions) -> Result<RunSummary, EngineError> {
        for f in &opts.force {
            if self.pipeline.index_of(f).is_none() {
                return Err(StageError::Config {
                    file: "--force".into(),
                    field: Some(f.clone()),
                    message: format!(
                        "unknown node (nodes: {})",
                        self.pipeline.node_names().join(", ")
                    ),
                }
                .into());
            }
        }
        if opts.part != RunPart::Whole {
            let flag = match opts.part {
                RunPart::Merge => "--merge",
                _ => "--shard",
            };
            let config = |message: String| StageError::Config {
                file: flag.into(),
                field: None,
                message,
            };
            if targets.is_empty() {
                return Err(config(
                    "name the stage to shard, e.g. `run validate --shard 0/4`".into(),
                )
                .into());
            }
            for t in targets {
                let idx = self.pipeline.index_of(t).ok_or_else(|| {
                    let names = self.pipeline.node_names();
                    config(format!(
                        "unknown node `{t}`{} (nodes: {})",
                        crate::suggest::did_you_mean(t, names.iter().map(String::as_str)),
                        names.join(", ")
                    ))
                })?;
                let node = self.pipeline.node_at(idx);
                if !node.stage.shardable() {
                    return Err(config(format!(
                        "node `{t}` (stage {}) does not process rows independently; shardable stages: validate",
                        node.stage.kind()
                    ))
                    .into());
                }
            }
        }
        let order = self.pipeline.closure(targets)?;
        let lock = LockFile::read(&self.lock_path)?;
        let _gc = self.store.gc_guard_shared()?;
        let run_id = format!(
            "{}-{}",
            chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ"),
            std::process::id()
        );
        let log = if opts.dry_run {
            None
        } else {
            Some(self.store.run_log(&run_id)?)
        };

        let selected: Vec<bool> = {
            let mut v = vec![false; self.pipeline.len()];
            for &i in &order {
                v[i] = true;
            }
            v
        };
        let pending: Vec<AtomicUsize> = (0..self.pipeline.len())
            .map(|i| {
                AtomicUsize::new(if selected[i] {
                    self.pipeline.upstream(i).len()
                } else {
                    0
                })
            })
            .collect();
        let results: Mutex<HashMap<usize, NodeRecord>> = Mutex::new(HashMap::new());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.jobs)
            .build()
            .map_err(|e| StageError::Failed(format!("cannot start thread pool: {e}")))?;

        let state = SchedState {
            pending: &pending,
            results: &results,
            selected: &selected,
            lock: &lock,
            opts,
            log: log.as_ref(),
            targets,
            run_id: &run_id,
        };
        pool.scope(|s| {
            for &i in &order {
                if pending[i].load(Ordering::SeqCst) == 0 {
                    self.spawn_node(s, i, &state);
                }
            }
        });

        let mut map = results.into_inner().unwrap_or_else(|e| e.into_inner());
        let records: Vec<NodeRecord> = order.iter().filter_map(|i| map.remove(i)).collect();
        if !opts.dry_run && !opts.keep_lock_file {
            self.update_lock(&records)?;
        }
        Ok(RunSummary { run_id, records })
    }

    fn spawn_node<'s>(&'s self, s: &rayon::Scope<'s>, idx: usize, st: &'s SchedState<'s>) {
        s.spawn(move |s| {
            let rec = self.process_node(idx, st);
            if let Some(log) = st.log
                && let Ok(line) = serde_json::to_string(&rec)
            {
                let _ = log.append(&line);
            }
            self.reporter.node_finished(&rec);
            st.results
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(idx, rec);
            for d in self.pipeline.downstream(idx) {
                if st.selected[d] && st.pending[d].fetch_sub(1, Ordering::SeqCst) == 1 {
                    self.spawn_node(s, d, st);
                }
            }
        });
    }

    fn process_node(&self, idx: usize, st: &SchedState<'_>) -> NodeRecord {
        let t0 = Instant::now();
        let node = self.pipeline.node_at(idx);
        let kind = node.stage.kind().to_string();
        let cv = node.stage.code_version();
        // Upstream outputs (all upstream nodes are finished when this runs).
        let upstream = match self.upstream_outputs(idx, st) {
            Ok(u) => u,
            Err(un) => {
                let mut r = upstream_incomplete(&node.name, (&kind, cv), &un, st.opts);
                if st.opts.dry_run {
                    r.estimated_seconds = self
                        .previous_manifest(&node.name, st.lock)
                        .map(|m| m.seconds);
                }
                return r;
            }
        };
        let prep = match self.prepare(idx, &upstream) {
            Ok(p) => p,
            Err(e) => {
                let mut r = NodeRecord::new(&node.name, &kind, cv, NodeStatus::Failed);
                r.bad_input = e.is_bad_input();
                r.error = Some(e.to_string());
                r.seconds = t0.elapsed().as_secs_f64();
                return r;
            }
        };
        let key = prep.preimage.key();
        let forced = st.opts.force.iter().any(|f| f == &node.name);
        let cached = |key: &str| -> Option<NodeRecord> {
            if forced {
                return None;
            }
            let m = self.usable_manifest(idx, key).ok()?;
            let mut r =
                NodeRecord::new(&node.name, &kind, cv, NodeStatus::Cached).with_outputs(m.outputs);
            r.key = Some(key.to_string());
            r.seconds = t0.elapsed().as_secs_f64();
            Some(r)
        };
        if let Some(r) = cached(&key) {
            return r;
        }
        let dirty = if forced {
            vec![DirtyReason::Forced]
        } else {
            self.why_dirty(&node.name, &prep.preimage, st.lock)
        };
        if st.opts.dry_run {
            let mut r =
                NodeRecord::new(&node.name, &kind, cv, NodeStatus::WouldRun).with_dirty(dirty);
            r.key = Some(key);
            r.estimated_seconds = self
                .previous_manifest(&node.name, st.lock)
                .map(|m| m.seconds);
            return r;
        }
        if crate::interrupt::requested() {
            let mut r =
                NodeRecord::new(&node.name, &kind, cv, NodeStatus::Skipped).with_dirty(dirty);
            r.key = Some(key);
            r.error = Some("not started: interrupted".into());
            r.interrupted = true;
            return r;
        }
        // Take the node lock; another process may have produced the key meanwhile.
        let _lock = match self.store.lock_node(&node.name, || {
            self.reporter.node_waiting(
                &node.name,
                "another cudarl-pipe process holds this node's lock",
            )
        }) {
            Ok(l) => l,
            Err(e) => {
                let mut r = NodeRecord::new(&node.name, &kind, cv, NodeStatus::Failed);
                r.error = Some(e.to_string());
                return r;
            }
        };
        if let Some(r) = cached(&key) {
            return r;
        }
        let part = if st.targets.iter().any(|t| t == &node.name) {
            st.opts.part
        } else {
            RunPart::Whole
        };
        let mut rec = match self.execute(idx, &key, prep, part, st.run_id) {
            Ok(r) => r,
            Err((e, warnings)) => execute_failed(&node.name, (&kind, cv), e, warnings),
        };
        rec = rec.with_dirty(dirty);
        rec.key = Some(key);
        rec
    }

    /// The full outputs of node `idx`'s upstream nodes by name, from the finished records; the
    /// name of the first upstream node without outputs (not run, failed or skipped) instead.
    fn upstream_outputs(
        &self,
        idx: usize,
        st: &SchedState<'_>,
    ) -> Result<HashMap<String, BTreeMap<String, OutputRecord>>, String> {
        let mut upstream = HashMap::new();
        let res = st.results.lock().unwrap_or_else(|e| e.into_inner());
        for u in self.pipeline.upstream(idx) {
            let un = &self.pipeline.node_at(u).name;
            match res.get(&u).and_then(|r| r.full_outputs.clone()) {
                Some(o) => {
                    upstream.insert(un.clone(), o);
                }
                None => return Err(un.clone()),
            }
        }
        Ok(upstream)
    }

    fn execute(
        &self,
        idx: usize,
        key: &str,
        prep: Prepared,
        part: RunPart,
        run_id: &str,
    ) -> Result<NodeRecord, (StageError, Vec<String>)> {
        let node = self.pipeline.node_at(idx);
        let tmp = self.store.temp_dir().map_err(|e| (e.into(), vec![]))?;
        self.reporter.node_started(&node.name, node.stage.kind());
        let mut ctx = StageContext::new(
            &node.name,
            prep.inputs,
            tmp.path().to_path_buf(),
            node.outputs.clone(),
            &self.store,
            self.reporter.clone(),
            &self.root,
        )
        .with_part(part)
        .with_preimage(prep.preimage.clone())
        .with_run(run_id);
        fault_point(&node.name, "before-run");
        let t0 = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| node.stage.run(&mut ctx)));
        let ran = StageRun {
            seconds: t0.elapsed().as_secs_f64(),
            warnings: ctx.warnings.clone(),
            stats: ctx.stats.clone(),
        };
        let referenced_blobs: Vec<Digest> = ctx.referenced.iter().copied().collect();
        match result {
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                return Err((
                    StageError::Failed(format!("stage panicked: {msg}")),
                    ran.warnings,
                ));
            }
            Ok(Err(e)) => return Err((e, ran.warnings)),
            Ok(Ok(())) => {}
        }
        if let RunPart::Shard { .. } = part {
            return self.finish_shard(node, key, part, ran);
        }
        fault_point(&node.name, "after-run");
        let outputs = self.ingest_outputs(node, tmp.path(), &ran.warnings)?;
        fault_point(&node.name, "before-manifest");
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            node: node.name.clone(),
            key: key.to_string(),
            preimage: prep.preimage,
            outputs: outputs.clone(),
            warnings: ran.warnings.clone(),
            referenced_blobs,
            seconds: ran.seconds,
            finished_unix_ms: now_ms(),
            git_commit: self
                .git_commit
                .get_or_init(|| read_git_commit(&self.root))
                .clone(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let bytes = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
        self.store
            .write_action(&node.name, key, &bytes)
            .map_err(|e| (e.into(), ran.warnings.clone()))?;
        Ok(ran.record(node, NodeStatus::Ran).with_outputs(outputs))
    }

    /// The record of a shard of `node` that ran (`part`, its rows in the memo), after writing
    /// the shared store's record that this shard finished `key` (once: a re-run of a finished
    /// shard leaves the first record).
    fn finish_shard(
        &self,
        node: &Node,
        key: &str,
        part: RunPart,
        ran: StageRun,
    ) -> Result<NodeRecord, (StageError, Vec<String>)> {
        if let Some(shared) = self.store.shared() {
            let record = serde_json::json!({
                "node": node.name,
                "key": key,
                "shard": part.label(),
                "seconds": ran.seconds,
                "finished_unix_ms": now_ms(),
                "host": std::env::var("HOSTNAME").unwrap_or_default(),
                "stats": ran.stats,
            });
            let rel = format!("shards/{}/{key}/{}.json", node.name, part.label());
            shared
                .put_new(&rel, &serde_json::to_vec_pretty(&record).expect("json"))
                .map_err(|e| (e.into(), ran.warnings.clone()))?;
        }
        Ok(ran.record(node, NodeStatus::Shard))
    }

    /// Checks the outputs `node` wrote into `dir` against its declarations and ingests them
    /// into the store; errors carry the stage's `warnings`.
    fn ingest_outputs(
        &self,
        node: &Node,
        dir: &Path,
        warnings: &[String],
    ) -> Result<BTreeMap<String, OutputRecord>, (StageError, Vec<String>)> {
        let failed = |m: String| (StageError::Failed(m), warnings.to_vec());
        let mut outputs = BTreeMap::new();
        for decl in &node.outputs {
            let path = dir.join(decl.file_name());
            let meta = std::fs::metadata(&path)
                .map_err(|_| failed(format!("stage did not write its output `{}`", decl.name)))?;
            let (rows, sh) = match &decl.kind {
                OutputKind::Table(expected) => {
                    let (rows, actual) = inspect_parquet(&path)
                        .map_err(|m| failed(format!("output `{}`: {m}", decl.name)))?;
                    if let Some(d) = schema_mismatch(expected, &actual) {
                        return Err(failed(format!(
                            "output `{}` does not match its declared schema: {d}",
                            decl.name
                        )));
                    }
                    (Some(rows), Some(schema_hash(expected)))
                }
                OutputKind::File { .. } => (None, None),
            };
            let hash = self
                .store
                .ingest_file(&path)
                .map_err(|e| (e.into(), warnings.to_vec()))?;
            outputs.insert(
                decl.name.clone(),
                OutputRecord {
                    hash,
                    rows,
                    bytes: meta.len(),
                    schema_hash: sh,
                    file_name: decl.file_name(),
                },
            );
        }
        Ok(outputs)
    }

    fn update_lock(&self, records: &[NodeRecord]) -> Result<(), EngineError> {
        let _guard = self.store.lock_named("lockfile")?;
        let mut lock = LockFile::read(&self.lock_path)?;
        let before = lock.clone();
        for r in records {
            if !matches!(r.status, NodeStatus::Ran | NodeStatus::Cached) {
                continue;
            }
            let (Some(key), Some(outs)) = (&r.key, &r.full_outputs) else {
                continue;
            };
            lock.nodes.insert(
                r.node.clone(),
                LockNode {
                    stage: r.stage.clone(),
                    code_version: r.code_version,
                    key: key.clone(),
                    outputs: outs
                        .iter()
                        .map(|(k, o)| {
                            (
                                k.clone(),
                                LockOutput {
                                    hash: o.hash.to_hex(),
                                    rows: o.rows,
                                },
                            )
                        })
                        .collect(),
                },
            );
        }
        // Drop entries of nodes no longer in the pipeline.
        lock.nodes
            .retain(|n, _| self.pipeline.index_of(n).is_some());
        if lock != before {
            self.store
                .write_atomic(&self.lock_path, lock.to_toml().as_bytes())?;
        }
        Ok(())
    }

    /// Why `node` is stale (or that it is fresh), including the causes of stale upstream nodes.
    ///
    /// # Errors
    /// Unknown node or unreadable lock file.
    pub fn explain(&self, node: &str) -> Result<Vec<NodeRecord>, EngineError> {
        let recs = self.status(&[node.to_string()])?;
        Ok(recs)
    }

    /// The manifest behind a fresh node (for `show` and `export`).
    ///
    /// # Errors
    /// Unknown node, or the node is not fresh (message says to run it).
    pub fn fresh_manifest(&self, node: &str) -> Result<Manifest, EngineError> {
        let recs = self.status(&[node.to_string()])?;
        let r = recs
            .iter()
            .find(|r| r.node == node)
            .expect("closure contains the target");
        if r.status != NodeStatus::Fresh {
            return Err(StageError::Failed(format!(
                "node `{node}` is {}: run `cudarl-pipe run {node}` first ({})",
                r.status.as_str(),
                r.reasons.join("; ")
            ))
            .into());
        }
        let key = r.key.clone().expect("fresh has key");
        let bytes = self
            .store
            .read_action(node, &key)?
            .ok_or_else(|| StageError::Failed(format!("manifest of `{node}` vanished")))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| StageError::Failed(format!("corrupt manifest of `{node}`: {e}")).into())
    }

    /// Manifests to keep in gc: those named by the lock file and the newest `keep_last` of each
    /// node. Returns the (node, key) pairs and the blobs they reference.
    ///
    /// # Errors
    /// Store or lock file failures.
    pub fn gc_roots(&self, keep_last: usize) -> Result<GcRoots, EngineError> {
        let lock = LockFile::read(&self.lock_path)?;
        let mut keep = std::collections::HashSet::new();
        for (n, ln) in &lock.nodes {
            keep.insert((n.clone(), ln.key.clone()));
        }
        let mut per_node: HashMap<String, usize> = HashMap::new();
        for e in self.store.list_actions(None)? {
            let c = per_node.entry(e.node.clone()).or_default();
            if *c < keep_last {
                keep.insert((e.node.clone(), e.key.clone()));
                *c += 1;
            }
        }
        let mut blobs = std::collections::HashSet::new();
        for (n, k) in &keep {
            if let Some(b) = self.store.read_action(n, k)?
                && let Ok(m) = serde_json::from_slice::<Manifest>(&b)
            {
                blobs.extend(m.outputs.values().map(|o| o.hash));
                blobs.extend(m.referenced_blobs.iter().copied());
            }
        }
        Ok((keep, blobs))
    }
}

/// What gc keeps: (node, key) pairs of manifests and the blob digests they reference.
pub type GcRoots = (
    std::collections::HashSet<(String, String)>,
    std::collections::HashSet<Digest>,
);

/// What a stage's run left for its node's record: its wall time (seconds), its warnings and
/// its counters.
struct StageRun {
    seconds: f64,
    warnings: Vec<String>,
    stats: BTreeMap<String, serde_json::Value>,
}

impl StageRun {
    /// The record of `node` with `status` and this run's time, warnings and counters.
    fn record(self, node: &Node, status: NodeStatus) -> NodeRecord {
        let mut r = NodeRecord::new(
            &node.name,
            node.stage.kind(),
            node.stage.code_version(),
            status,
        );
        r.seconds = self.seconds;
        r.warnings = self.warnings;
        r.stats = self.stats;
        r
    }
}

/// The record of node `name` (stage `kind`, code version `cv`) whose upstream node `un` did
/// not complete: `would-run` on a dry run, else `skipped` (interrupted after a stop request).
fn upstream_incomplete(
    name: &str,
    (kind, cv): (&str, u32),
    un: &str,
    opts: &RunOptions,
) -> NodeRecord {
    let status = if opts.dry_run {
        NodeStatus::WouldRun
    } else {
        NodeStatus::Skipped
    };
    let mut r =
        NodeRecord::new(name, kind, cv, status).with_dirty(vec![DirtyReason::UpstreamStale {
            node: un.to_string(),
        }]);
    if !opts.dry_run {
        // After a stop request an upstream node did not run for it.
        r.interrupted = crate::interrupt::requested();
        r.error = Some(if r.interrupted {
            "not started: interrupted".into()
        } else {
            format!("upstream `{un}` did not complete")
        });
    }
    r
}

/// The `failed` record of node `name` (stage `kind`, code version `cv`) whose stage failed
/// with `e`, after `warnings`.
fn execute_failed(
    name: &str,
    (kind, cv): (&str, u32),
    e: StageError,
    warnings: Vec<String>,
) -> NodeRecord {
    let mut r = NodeRecord::new(name, kind, cv, NodeStatus::Failed);
    r.bad_input = e.is_bad_input();
    // A stage that failed after a stop was requested most likely failed of it
    // (a terminal's Ctrl-C also reaches the processes it started).
    r.interrupted = matches!(e, StageError::Interrupted(_)) || crate::interrupt::requested();
    r.error = Some(e.to_string());
    r.warnings = warnings;
    r
}

struct SchedState<'a> {
    pending: &'a [AtomicUsize],
    results: &'a Mutex<HashMap<usize, NodeRecord>>,
    selected: &'a [bool],
    lock: &'a LockFile,
    opts: &'a RunOptions,
    log: Option<&'a cudarl_store::RunLog>,
    targets: &'a [String],
    run_id: &'a str,
}
