//! Implementations of the CLI verbs.

pub mod bench;
pub mod bench_decode;
pub mod bench_harness;
pub mod bench_torch_build;
pub mod check;
pub mod optimize;
pub mod runs;
pub mod serve;
pub mod serve_bench;
pub mod sql;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::util::display::{ArrayFormatter, FormatOptions};
use cudarl_core::engine::NodeStatus;
use cudarl_core::pipeline::discover_root;
use cudarl_core::{Engine, EngineError, NodeRecord, Pipeline, RunOptions, StageError, Store};
use cudarl_stages::Registry;

use crate::report::CliReporter;
use crate::{Cli, Command, DagFmt};

/// An error with its exit code.
#[derive(Debug)]
pub struct CliError {
    /// Exit code (1 or 2).
    pub code: i32,
    /// Message.
    pub message: String,
}

impl CliError {
    pub fn usage(m: impl Into<String>) -> Self {
        CliError {
            code: 2,
            message: m.into(),
        }
    }
    /// Exit code 1 with `m`'s message (a component's typed error or text).
    pub fn failed(m: impl std::fmt::Display) -> Self {
        CliError {
            code: 1,
            message: m.to_string(),
        }
    }
}

impl From<EngineError> for CliError {
    fn from(e: EngineError) -> Self {
        CliError {
            code: e.exit_code(),
            message: e.to_string(),
        }
    }
}

impl From<StageError> for CliError {
    fn from(e: StageError) -> Self {
        CliError {
            code: if e.is_bad_input() { 2 } else { 1 },
            message: e.to_string(),
        }
    }
}

impl From<cudarl_rl::RlError> for CliError {
    fn from(e: cudarl_rl::RlError) -> Self {
        CliError {
            code: if matches!(e, cudarl_rl::RlError::BadInput { .. }) {
                2
            } else {
                1
            },
            message: e.to_string(),
        }
    }
}

/// Paths resolved from the global options.
pub struct Ctx {
    pub root: PathBuf,
    pub pipeline_path: PathBuf,
    pub pipeline_display: String,
    pub store: PathBuf,
    pub lock: Option<PathBuf>,
    /// The settings the pipeline loads with (see [`Settings`]).
    pub settings: Settings,
    /// Where the settings came from when not from the command line (a remembered run's, or the
    /// `cpu` profile for want of a GPU): said on stderr the first time the pipeline loads.
    settings_note: Option<String>,
    noted: std::sync::atomic::AtomicBool,
    /// `--shared-cache` URL.
    pub shared_cache: Option<String>,
    /// `--run NAME`: the name `run` remembers its settings under, or the remembered run whose
    /// settings a verb that reads the store uses.
    pub run_name: Option<String>,
}

pub use runs::Settings;

/// Whether run `r` built every default target `defaults`: each is one of its targets or
/// upstream of one in `graph` (the pipeline as its file draws it, loaded only when a record
/// does not name every default target itself); with no default targets, whether it built every
/// node.
fn covers<'a>(
    r: &runs::RunRecord,
    defaults: &[String],
    graph: &dyn Fn() -> Option<&'a Pipeline>,
) -> bool {
    if defaults.is_empty() {
        return r.targets.is_empty();
    }
    if defaults.iter().all(|d| r.targets.contains(d)) {
        return true;
    }
    let Some(p) = graph() else {
        return false;
    };
    let Ok(built) = p.closure(&r.targets) else {
        return false;
    };
    defaults
        .iter()
        .all(|d| p.index_of(d).is_some_and(|i| built.contains(&i)))
}

/// Whether verb `c` only reads the store (and builds what it reads), so that it reuses the
/// settings of a remembered `run` ([`runs`]).
fn reads_store(c: &Command) -> bool {
    !matches!(c, Command::Run { .. } | Command::Bench { .. })
}

impl Ctx {
    /// The same context, its settings note already said (for work that outlives the verb's
    /// borrow, such as `serve`'s `POST /v1/optimize`).
    pub fn to_owned_quiet(&self) -> Ctx {
        Ctx {
            root: self.root.clone(),
            pipeline_path: self.pipeline_path.clone(),
            pipeline_display: self.pipeline_display.clone(),
            store: self.store.clone(),
            lock: self.lock.clone(),
            settings: self.settings.clone(),
            settings_note: self.settings_note.clone(),
            noted: std::sync::atomic::AtomicBool::new(true),
            shared_cache: self.shared_cache.clone(),
            run_name: self.run_name.clone(),
        }
    }

    fn from_cli(cli: &Cli) -> Result<Ctx, CliError> {
        let root = match &cli.root {
            Some(r) => r.clone(),
            None => {
                let cwd = std::env::current_dir()
                    .map_err(|e| CliError::failed(format!("current directory: {e}")))?;
                discover_root(&cwd).ok_or_else(|| {
                    CliError::usage("not inside a cudarl-pipe project (no `pipelines/` folder here or above); use --root DIR")
                })?
            }
        };
        let (pipeline_path, pipeline_display) = match &cli.pipeline {
            Some(p) => (p.clone(), p.display().to_string()),
            None => (
                root.join("pipelines/default.toml"),
                "pipelines/default.toml".to_string(),
            ),
        };
        let store = cli.store.clone().unwrap_or_else(|| root.join("artifacts"));
        let (settings, settings_note) =
            Self::resolve_settings(cli, &pipeline_path, &pipeline_display, &store)?;
        Ok(Ctx {
            root,
            pipeline_path,
            pipeline_display,
            store,
            lock: cli.lock.clone(),
            settings,
            settings_note,
            noted: Default::default(),
            shared_cache: cli.shared_cache.clone(),
            run_name: cli.run_name.clone(),
        })
    }

    /// The settings of this invocation: `--profile` (`none`: no profile) and `--set` as given;
    /// for a verb that reads the store given neither, those of the remembered run `--run NAME`,
    /// else of the last run that built the pipeline's default targets (said on stderr, with the
    /// other remembered runs); otherwise profile `cpu` where the pipeline file defines it and no
    /// GPU is found (said on stderr). A pipeline file that cannot be read is left for the verb
    /// to report.
    ///
    /// # Errors
    /// `--run` with `--profile` or `--set` on a verb that reads the store, an unknown run, a
    /// run record that does not parse (exit 2).
    fn resolve_settings(
        cli: &Cli,
        pipeline_path: &Path,
        display: &str,
        store: &Path,
    ) -> Result<(Settings, Option<String>), CliError> {
        if let Some(n) = &cli.run_name {
            runs::check_name(n)?;
        }
        let reads = reads_store(&cli.command);
        // A reading verb told `--run NAME` takes that run's profile over `CUDARL_PROFILE`'s.
        let profile = cli
            .profile
            .clone()
            .filter(|_| !(reads && cli.run_name.is_some() && cli.profile_from_env));
        let given = Settings {
            profile: profile.clone().filter(|p| p != "none"),
            sets: cli.sets.clone(),
        };
        let Ok(file) = cudarl_core::pipeline::read_pipeline_file(pipeline_path, display) else {
            return Ok((given, None));
        };
        if (profile.is_some() || !cli.sets.is_empty()) && reads && cli.run_name.is_some() {
            return Err(CliError::usage(
                "--run NAME reads with that run's settings: give it without --profile and --set",
            ));
        }
        if profile.is_some() {
            return Ok((given, None));
        }
        // `--set` alone goes on top of the machine's profile, below.
        let mut other_runs = String::new();
        if reads && cli.sets.is_empty() {
            let runs = runs::list(store, &file.name)?;
            if let Some(n) = &cli.run_name {
                let r = runs::find(&runs, n, &file.name, store)?;
                let note = format!(
                    "note: the settings of run `{n}` ({}): {}",
                    r.targets.join(", "),
                    r.settings.flags()
                );
                return Ok((r.settings.clone(), Some(note)));
            }
            let loaded = std::cell::OnceCell::new();
            let graph = || {
                loaded
                    .get_or_init(|| {
                        Pipeline::load(pipeline_path, display, None, &[], &Registry).ok()
                    })
                    .as_ref()
            };
            let main = runs.iter().find(|r| covers(r, &file.targets, &graph));
            let others: Vec<&runs::RunRecord> = runs
                .iter()
                .filter(|r| main.is_none_or(|m| m.name != r.name))
                .collect();
            if let Some(m) = main {
                let rest = runs::named(&others);
                let note = format!(
                    "note: the settings of run `{}`, the last that built the default targets: {}{}",
                    m.name,
                    m.settings.flags(),
                    if rest.is_empty() {
                        String::new()
                    } else {
                        format!("; other runs: {rest}")
                    }
                );
                return Ok((m.settings.clone(), Some(note)));
            }
            if !others.is_empty() {
                other_runs = format!(
                    "no run of the default targets on this store yet; other runs: {}; ",
                    runs::named(&others)
                );
            }
        }
        let profile = (file.profiles.contains_key("cpu") && !cudarl_cuda::gpu::present())
            .then(|| "cpu".to_string());
        let note = if profile.is_some() {
            Some(format!(
                "note: {other_runs}no GPU found: profile `cpu` of {display} (--profile none for the full-size settings)"
            ))
        } else {
            (!other_runs.is_empty()).then(|| format!("note: {other_runs}the file's own settings"))
        };
        Ok((
            Settings {
                profile,
                sets: cli.sets.clone(),
            },
            note,
        ))
    }

    /// Remembers this `run` of `targets` (empty: the pipeline's default targets) under `--run
    /// NAME` or [`runs::default_name`], for the verbs that read the store.
    ///
    /// # Errors
    /// The store cannot be written (exit 1).
    pub fn remember_run(&self, pipeline: &Pipeline, targets: &[String]) -> Result<(), CliError> {
        let store = self.open_store()?;
        let built = pipeline.targets_or_default(targets).to_vec();
        let record = runs::RunRecord {
            name: self
                .run_name
                .clone()
                .unwrap_or_else(|| runs::default_name(&built)),
            targets: built,
            settings: self.settings.clone(),
            finished_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        runs::remember(&store, &pipeline.name, &record)
    }

    /// The store, created if missing, with the `--shared-cache` attached when given.
    ///
    /// # Errors
    /// The store cannot be created (exit 1); the shared cache URL is unusable (exit 2).
    pub fn open_store(&self) -> Result<Store, CliError> {
        let store = Store::open(&self.store).map_err(|e| CliError::failed(e.to_string()))?;
        self.with_shared_cache(store)
    }

    /// The store for a verb that only reads it (`status`, `explain`, `show`, `export` without
    /// `--build`, `run --dry-run`, `sql`) or only removes from it (`gc`): nothing is created.
    ///
    /// # Errors
    /// No store at the path (exit 2, the path named); the shared cache URL is unusable (exit 2).
    pub fn open_store_to_read(&self) -> Result<Store, CliError> {
        let store = Store::open_existing(&self.store).ok_or_else(|| {
            CliError::usage(format!(
                "no store at {}: `cudarl-pipe run` makes one there, or give the store with --store",
                self.store.display()
            ))
        })?;
        self.with_shared_cache(store)
    }

    /// `store` with the `--shared-cache` attached when given.
    fn with_shared_cache(&self, store: Store) -> Result<Store, CliError> {
        match &self.shared_cache {
            Some(url) => {
                let cache = cudarl_core::SharedCache::open(url)
                    .map_err(|e| CliError::usage(format!("--shared-cache: {e}")))?;
                Ok(store.with_shared(cache))
            }
            None => Ok(store),
        }
    }

    pub fn pipeline(&self) -> Result<Pipeline, CliError> {
        if let Some(n) = &self.settings_note
            && !self.noted.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            eprintln!("{n}");
        }
        Ok(Pipeline::load(
            &self.pipeline_path,
            &self.pipeline_display,
            self.settings.profile.as_deref(),
            &self.settings.sets,
            &Registry,
        )?)
    }

    pub fn engine(
        &self,
        reporter: Arc<dyn cudarl_core::Reporter>,
        jobs: usize,
    ) -> Result<Engine, CliError> {
        self.engine_with(reporter, jobs, &[])
    }

    /// [`Ctx::engine`] for a verb that only reads the store ([`Ctx::open_store_to_read`]).
    ///
    /// # Errors
    /// As [`Ctx::open_store_to_read`]; a pipeline file that does not load.
    pub fn engine_to_read(
        &self,
        reporter: Arc<dyn cudarl_core::Reporter>,
        jobs: usize,
    ) -> Result<Engine, CliError> {
        let pipeline = self.pipeline()?;
        let store = self.open_store_to_read()?;
        Ok(self.engine_on(store, pipeline, reporter, jobs).reading())
    }

    /// The lock file of `pipeline` on this invocation's store: `--lock` when given; else, for
    /// the project's own store (`<root>/artifacts`), the project's tracked `cudarl.lock`
    /// (`cudarl.<name>.lock` for another pipeline file); for any other store, the same name
    /// inside that store, so a run on a scratch store leaves the project's lock alone.
    fn lock_path(&self, pipeline: &Pipeline) -> PathBuf {
        if let Some(l) = &self.lock {
            return l.clone();
        }
        let name = if pipeline.name == "default" {
            "cudarl.lock".to_string()
        } else {
            format!("cudarl.{}.lock", pipeline.name)
        };
        if same_place(&self.store, &self.root.join("artifacts")) {
            self.root.join(name)
        } else {
            self.store.join(name)
        }
    }

    /// An engine of `pipeline` on `store`.
    fn engine_on(
        &self,
        store: Store,
        pipeline: Pipeline,
        reporter: Arc<dyn cudarl_core::Reporter>,
        jobs: usize,
    ) -> Engine {
        let lock = self.lock_path(&pipeline);
        Engine::new(store, pipeline, self.root.clone(), lock, reporter, jobs)
    }

    /// [`Ctx::engine`] with `extra` `NODE.KEY=VALUE` overrides after this invocation's (not
    /// remembered as settings).
    pub fn engine_with(
        &self,
        reporter: Arc<dyn cudarl_core::Reporter>,
        jobs: usize,
        extra: &[String],
    ) -> Result<Engine, CliError> {
        let pipeline = if extra.is_empty() {
            self.pipeline()?
        } else {
            let _ = self.pipeline()?;
            let mut sets = self.settings.sets.clone();
            sets.extend(extra.iter().cloned());
            Pipeline::load(
                &self.pipeline_path,
                &self.pipeline_display,
                self.settings.profile.as_deref(),
                &sets,
                &Registry,
            )?
        };
        let store = self.open_store()?;
        Ok(self.engine_on(store, pipeline, reporter, jobs))
    }
}

/// Whether paths `a` and `b` name one place: compared with symbolic links and `..` resolved
/// (for a path not created yet, its nearest existing ancestor resolved, the rest appended).
fn same_place(a: &Path, b: &Path) -> bool {
    fn resolved(p: &Path) -> PathBuf {
        let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut rest = Vec::new();
        let mut at = p.as_path();
        loop {
            if let Ok(c) = std::fs::canonicalize(at) {
                return rest.iter().rev().fold(c, |acc: PathBuf, r| acc.join(r));
            }
            match (at.parent(), at.file_name()) {
                (Some(up), Some(name)) => {
                    rest.push(name.to_os_string());
                    at = up;
                }
                _ => return p,
            }
        }
    }
    resolved(a) == resolved(b)
}

/// Runs a verb; returns the exit code.
pub fn dispatch(cli: Cli) -> Result<i32, CliError> {
    let ctx = Ctx::from_cli(&cli)?;
    match cli.command {
        Command::Run {
            targets,
            jobs,
            dry_run,
            force,
            shard,
            merge,
            json,
        } => {
            let part = match (shard, merge) {
                (Some(p), _) => p,
                (None, true) => cudarl_core::RunPart::Merge,
                (None, false) => cudarl_core::RunPart::Whole,
            };
            let opts = RunOptions {
                force,
                dry_run,
                part,
                keep_lock_file: false,
            };
            run(&ctx, &targets, jobs.unwrap_or(0), opts, json)
        }
        Command::Status {
            targets,
            json,
            exit_code,
            verify,
        } => status(&ctx, &targets, json, (exit_code, verify)),
        Command::Explain { node, json } => explain(&ctx, &node, json),
        Command::Dag { format } => {
            let p = ctx.pipeline()?;
            let f = match format {
                DagFmt::Text => cudarl_core::dag::DagFormat::Text,
                DagFmt::Dot => cudarl_core::dag::DagFormat::Dot,
                DagFmt::Mermaid => cudarl_core::dag::DagFormat::Mermaid,
                DagFmt::Json => cudarl_core::dag::DagFormat::Json,
            };
            print!("{}", cudarl_core::dag::render(&p, f));
            Ok(0)
        }
        Command::Show {
            node,
            output,
            head,
            json,
        } => show(&ctx, &node, output.as_deref(), head, json),
        Command::Export {
            node,
            to,
            output,
            build,
            format: crate::ExportFmt::Verl,
        } => export_verl(&ctx, &node, &to, output.is_some(), build),
        Command::Export {
            node,
            to,
            output,
            build,
            ..
        } => export(&ctx, &node, &to, output.as_deref(), build),
        Command::Gc {
            keep_last,
            dry_run,
            json,
        } => gc(&ctx, keep_last, dry_run, json),
        Command::Bench { which } => bench::run(&ctx, which),
        Command::Optimize {
            problem,
            out,
            samples,
            turns,
            level,
            json,
        } => optimize::run(&ctx, &problem, &out, (samples, turns, level), json),
        Command::Serve(args) => serve::run(&ctx, args),
        Command::Sql {
            query,
            json,
            parquet,
        } => sql::run(&ctx, &query, json, parquet.as_deref()),
        Command::Check {
            task,
            json,
            signature: true,
            ..
        } => check::signature(&ctx, &task, json),
        Command::Check {
            task,
            source,
            abi,
            mode,
            arch,
            no_bench,
            ncu,
            timeout,
            json,
            model_new,
            without_allowlist,
            signature: false,
        } => check::run(
            &ctx,
            &task,
            &source,
            abi.as_deref(),
            mode,
            arch,
            (!no_bench, ncu),
            timeout,
            (json, model_new.as_deref(), !without_allowlist),
        ),
    }
}

fn human_record(r: &NodeRecord) -> String {
    let outs: Vec<String> = r
        .outputs
        .iter()
        .map(|(n, o)| match o.rows {
            Some(rows) => format!("{n}: {rows} rows {}", &o.hash[..12]),
            None => format!("{n}: {} bytes {}", o.bytes, &o.hash[..12]),
        })
        .collect();
    let seconds = match (r.status, r.estimated_seconds) {
        (NodeStatus::WouldRun, Some(e)) => format!("~{e:.0}s"),
        (NodeStatus::WouldRun, None) => "n/a".to_string(),
        _ => format!("{:.2}s", r.seconds),
    };
    let mut s = format!(
        "{:>9}  {:<22} {seconds:>8}  {}",
        r.status.as_str(),
        r.node,
        outs.join(", ")
    );
    if matches!(r.status, NodeStatus::Ran | NodeStatus::WouldRun) && !r.reasons.is_empty() {
        s.push_str(&format!("\n{:>11}because {}", "", r.reasons.join("; ")));
    }
    if !r.stats.is_empty() {
        let stats: Vec<String> = r.stats.iter().map(|(k, v)| format!("{k} {v}")).collect();
        s.push_str(&format!("\n{:>11}{}", "", stats.join(", ")));
    }
    if let Some(e) = &r.error {
        s.push_str(&format!("\n{:>11}error: {e}", ""));
    }
    s
}

fn run(
    ctx: &Ctx,
    targets: &[String],
    jobs: usize,
    opts: RunOptions,
    json: bool,
) -> Result<i32, CliError> {
    let reporter = Arc::new(CliReporter::detect(json));
    let engine = if opts.dry_run {
        ctx.engine_to_read(reporter, jobs)?
    } else {
        ctx.engine(reporter, jobs)?
    };
    // SIGINT/SIGTERM: no further node starts, rl-train saves after its step in flight; a
    // second signal ends the process at once (exit 130).
    if !opts.dry_run
        && let Err(e) = cudarl_core::interrupt::install()
    {
        eprintln!("warning: no SIGINT/SIGTERM handlers ({e}): an interrupt ends the run at once");
    }
    // A shard or merge names its stage: no default targets for it.
    let targets = match opts.part {
        cudarl_core::RunPart::Whole => engine.pipeline().targets_or_default(targets),
        _ => targets,
    };
    let summary = engine.run(targets, &opts)?;
    // What the verbs that read the store build on next; a run stopped by bad input (exit 2)
    // leaves the store as it was. Not being able to record it does not undo the run.
    let remembered = (!opts.dry_run && summary.exit_code() != 2)
        .then(|| ctx.remember_run(engine.pipeline(), targets))
        .transpose();
    for r in &summary.records {
        if json {
            json_line(r);
        } else {
            println!("{}", human_record(r));
        }
    }
    if opts.dry_run && !json {
        println!("{}", dry_run_summary(&summary.records));
    }
    if let Err(e) = remembered {
        eprintln!(
            "warning: this run's settings were not remembered for the reading verbs: {}",
            e.message
        );
    }
    let code = summary.exit_code();
    if code == cudarl_core::interrupt::EXIT_CODE {
        eprintln!(
            "interrupted: nodes that finished are stored, the rest did not start or stopped early; run again to continue"
        );
    }
    Ok(code)
}

/// The last line of `run --dry-run`: how many nodes would run and their seconds by their
/// previous runs, e.g. `would run 3 of 12 nodes: about 420 s by their previous runs (1 never
/// ran: not counted)`.
fn dry_run_summary(records: &[NodeRecord]) -> String {
    let would: Vec<&NodeRecord> = records
        .iter()
        .filter(|r| r.status == NodeStatus::WouldRun)
        .collect();
    let known: f64 = would.iter().filter_map(|r| r.estimated_seconds).sum();
    let never = would
        .iter()
        .filter(|r| r.estimated_seconds.is_none())
        .count();
    let mut s = format!(
        "would run {} of {} nodes: about {known:.0} s by their previous runs",
        would.len(),
        records.len()
    );
    if never > 0 {
        s.push_str(&format!(" ({never} never ran: not counted)"));
    }
    s
}

/// `status`: a line per node (FRESH with its key, else why), then a one-line count; with
/// `exit_code`, exit 1 when a node the targets need (given none: the pipeline's default
/// targets, every node listed) is not fresh; with `verify`, the fresh nodes'
/// stored files re-hashed ([`changed_blobs`]), each that changed named, and exit 1 if any did.
fn status(
    ctx: &Ctx,
    targets: &[String],
    json: bool,
    (exit_code, verify): (bool, bool),
) -> Result<i32, CliError> {
    let engine = ctx.engine_to_read(Arc::new(cudarl_core::NullReporter), 1)?;
    let recs = engine.status(targets)?;
    for r in &recs {
        if json {
            json_line(r);
        } else {
            let cause = match r.status {
                NodeStatus::Fresh => {
                    format!("key {}", r.key.as_deref().map(|k| &k[..12]).unwrap_or("?"))
                }
                _ => r.reasons.join("; "),
            };
            println!(
                "{:<8} {:<22} {}",
                r.status.as_str().to_uppercase(),
                r.node,
                cause
            );
        }
    }
    let count = |s: NodeStatus| recs.iter().filter(|r| r.status == s).count();
    let fresh = count(NodeStatus::Fresh);
    // Given no target, every node is listed and the exit code is about what the default
    // targets need.
    let pipeline = engine.pipeline();
    let needed: Vec<String> = pipeline
        .closure(pipeline.targets_or_default(targets))?
        .into_iter()
        .map(|i| pipeline.node_at(i).name.clone())
        .collect();
    let not_fresh = recs
        .iter()
        .filter(|r| r.status != NodeStatus::Fresh && needed.contains(&r.node))
        .count();
    if !json {
        let mut line = format!(
            "{fresh} of {} nodes fresh, {} stale, {} missing",
            recs.len(),
            count(NodeStatus::Stale),
            count(NodeStatus::Missing)
        );
        if targets.is_empty() && !pipeline.targets.is_empty() {
            line.push_str(&format!(
                "; the default targets ({}) {}",
                pipeline.targets.join(", "),
                match not_fresh {
                    0 => "are fresh".to_string(),
                    n if ctx.settings == Settings::default() => {
                        format!("need {n} node(s) built: `cudarl-pipe run`")
                    }
                    n => format!(
                        "need {n} node(s) built: `cudarl-pipe run {}`",
                        ctx.settings.flags()
                    ),
                }
            ));
        }
        println!("{line}");
    }
    let changed = if verify {
        changed_blobs(engine.store(), &recs)
    } else {
        vec![]
    };
    for c in &changed {
        eprintln!("CHANGED  {c}");
    }
    if verify {
        eprintln!(
            "verify: {} stored file(s) changed since they were written{}",
            changed.len(),
            if changed.is_empty() {
                ""
            } else {
                "; `cudarl-pipe run --force NODE` rebuilds a node"
            }
        );
    }
    Ok(i32::from(
        (exit_code && not_fresh > 0) || !changed.is_empty(),
    ))
}

/// The stored files of the fresh nodes of `recs` whose bytes no longer hash to their address
/// (or that are gone): every output and every blob the node's manifest references (a
/// checkpoint's weights and configs, recorded test tensors, compiled objects), each hashed once;
/// one `node what path` line each.
fn changed_blobs(store: &Store, recs: &[NodeRecord]) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut changed = Vec::new();
    let mut check = |node: &str, what: &str, d: cudarl_core::Digest| {
        if !seen.insert(d.to_hex()) {
            return;
        }
        let path = store.blob_path(&d);
        match cudarl_core::Digest::of_file(&path) {
            Ok(got) if got == d => {}
            Ok(_) => changed.push(format!("{node} {what} {}", path.display())),
            Err(e) => changed.push(format!("{node} {what} {} ({e})", path.display())),
        }
    };
    for r in recs.iter().filter(|r| r.status == NodeStatus::Fresh) {
        for (name, out) in &r.outputs {
            if let Ok(d) = cudarl_core::Digest::from_hex(&out.hash) {
                check(&r.node, name, d);
            }
        }
        let manifest = (r.key.as_deref())
            .and_then(|k| store.read_action(&r.node, k).ok().flatten())
            .and_then(|b| serde_json::from_slice::<cudarl_core::manifest::Manifest>(&b).ok());
        for d in manifest.map(|m| m.referenced_blobs).unwrap_or_default() {
            let what = format!("referenced blob {}", d.short(12));
            check(&r.node, &what, d);
        }
    }
    changed
}

fn explain(ctx: &Ctx, node: &str, json: bool) -> Result<i32, CliError> {
    let engine = ctx.engine_to_read(Arc::new(cudarl_core::NullReporter), 1)?;
    let recs = engine.explain(node)?;
    if json {
        for r in &recs {
            json_line(&serde_json::json!({
                "node": r.node, "status": r.status, "key": r.key, "reasons": r.reasons,
                "causes": r.dirty_reasons(),
            }));
        }
        return Ok(0);
    }
    let by_name: std::collections::HashMap<&str, &NodeRecord> =
        recs.iter().map(|r| (r.node.as_str(), r)).collect();
    fn print_node(
        name: &str,
        by: &std::collections::HashMap<&str, &NodeRecord>,
        depth: usize,
        seen: &mut Vec<String>,
    ) {
        let Some(r) = by.get(name) else { return };
        let pad = "  ".repeat(depth);
        let key = r
            .key
            .as_deref()
            .map(|k| format!(" (key {})", &k[..12]))
            .unwrap_or_default();
        println!("{pad}{} is {}{key}", r.node, r.status.as_str());
        if r.status == NodeStatus::Fresh {
            return;
        }
        for (i, reason) in r.reasons.iter().enumerate() {
            println!("{pad}  - {reason}");
            if let Some(cudarl_core::DirtyReason::UpstreamStale { node }) = r.dirty_reasons().get(i)
                && !seen.contains(node)
            {
                seen.push(node.clone());
                print_node(node, by, depth + 2, seen);
            }
        }
    }
    print_node(node, &by_name, 0, &mut Vec::new());
    Ok(0)
}

fn pick_output<'a>(
    m: &'a cudarl_core::Manifest,
    output: Option<&str>,
) -> Result<Vec<(&'a String, &'a cudarl_core::OutputRecord)>, CliError> {
    match output {
        Some(o) => m
            .outputs
            .get_key_value(o)
            .map(|kv| vec![kv])
            .ok_or_else(|| {
                CliError::usage(format!(
                    "node `{}` has no output `{o}` (outputs: {})",
                    m.node,
                    m.outputs.keys().cloned().collect::<Vec<_>>().join(", ")
                ))
            }),
        None => Ok(m.outputs.iter().collect()),
    }
}

fn show(
    ctx: &Ctx,
    node: &str,
    output: Option<&str>,
    head: usize,
    json: bool,
) -> Result<i32, CliError> {
    let engine = ctx.engine_to_read(Arc::new(cudarl_core::NullReporter), 1)?;
    let m = engine.fresh_manifest(node)?;
    let outs = pick_output(&m, output)?;
    let (name, rec) = outs[0];
    if output.is_none() && outs.len() > 1 {
        eprintln!(
            "showing `{name}` (outputs: {}; choose with --output)",
            m.outputs.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let path = engine.store().blob_path(&rec.hash);
    if !rec.file_name.ends_with(".parquet") {
        println!(
            "{name}: {} bytes, hash {} (not a table)",
            rec.bytes, rec.hash
        );
        return Ok(0);
    }
    let t = cudarl_data::Table::read(&path, name).map_err(|e| CliError::failed(e.to_string()))?;
    let n = head.min(t.rows());
    let b = t.batch.slice(0, n);
    if json {
        // Every column in every row, nulls written as `null` (not left out).
        let mut w = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow::json::writer::LineDelimited>(std::io::stdout());
        w.write(&b).map_err(|e| CliError::failed(e.to_string()))?;
        w.finish().map_err(|e| CliError::failed(e.to_string()))?;
        return Ok(0);
    }
    println!(
        "{node}.{name}: {} rows, hash {}",
        t.rows(),
        &rec.hash.to_hex()[..16]
    );
    for f in t.schema.fields() {
        println!(
            "  {}: {}{}",
            f.name(),
            f.data_type(),
            if f.is_nullable() { " (nullable)" } else { "" }
        );
    }
    // Truncate long cells for display.
    let opts = FormatOptions::default().with_null("null");
    let mut header = Vec::new();
    let mut rows = vec![Vec::new(); n];
    for (ci, f) in t.schema.fields().iter().enumerate() {
        header.push(f.name().clone());
        let fmt = ArrayFormatter::try_new(b.column(ci).as_ref(), &opts)
            .map_err(|e| CliError::failed(e.to_string()))?;
        for (ri, row) in rows.iter_mut().enumerate() {
            let mut s = fmt.value(ri).to_string().replace('\n', "\\n");
            if s.chars().count() > 40 {
                s = s.chars().take(37).collect::<String>() + "...";
            }
            row.push(s);
        }
    }
    println!();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    println!("{}", line(&header));
    println!(
        "{}",
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("-+-")
    );
    for r in &rows {
        println!("{}", line(r));
    }
    Ok(0)
}

fn export(
    ctx: &Ctx,
    node: &str,
    to: &Path,
    output: Option<&str>,
    build: bool,
) -> Result<i32, CliError> {
    let reporter = Arc::new(CliReporter::detect(false));
    let engine = if build {
        ctx.engine(reporter, 0)?
    } else {
        ctx.engine_to_read(reporter, 0)?
    };
    let code = ready(ctx, &engine, &[node.to_string()], build)?;
    if code != 0 {
        return Ok(code);
    }
    let m = engine.fresh_manifest(node)?;
    let outs = pick_output(&m, output)?;
    // One folder per node: nodes whose outputs share a file name never overwrite each other.
    let dir = to.join(node);
    let failed = |e: &dyn std::fmt::Display| CliError::failed(e.to_string());
    let mut files = serde_json::Map::new();
    let mut on_disk: Vec<String> = Vec::new();
    for (name, rec) in outs {
        let src = engine.store().blob_path(&rec.hash);
        let dst =
            cudarl_data::export::copy_out(&src, &dir, &rec.file_name).map_err(|e| failed(&e))?;
        println!("{}", dst.display());
        on_disk.push(rec.file_name.clone());
        // A table naming store blobs (file, digest, bytes: checkpoints, plots) also gets its
        // files, under <to>/<node>/<output>/ (a Hugging Face model directory for checkpoints).
        if let Ok(t) = cudarl_data::Table::read(&src, name)
            && t.schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .eq(["file", "digest", "bytes"])
        {
            // Copies, never links: an edit of an exported file (a `save_pretrained` over a
            // checkpoint) must not reach the store's blob.
            let sub = dir.join(name);
            let placed = cudarl_stages::common::materialize(
                engine.store(),
                &src,
                &sub,
                cudarl_stages::common::Placement::Copied,
            )
            .map_err(|e| failed(&e))?;
            on_disk.extend(placed.into_iter().map(|f| format!("{name}/{f}")));
            println!("{}", sub.display());
        }
        files.insert(
            name.clone(),
            serde_json::json!({"file": rec.file_name, "hash": rec.hash, "rows": rec.rows, "bytes": rec.bytes, "schema_hash": rec.schema_hash}),
        );
    }
    let sidecar = serde_json::json!({
        "node": m.node, "key": m.key, "stage": m.preimage.stage, "code_version": m.preimage.code_version,
        "params": m.preimage.params, "outputs": files, "files": on_disk, "git_commit": m.git_commit,
        "tool_version": m.tool_version,
    });
    cudarl_data::export::write_file(
        &dir,
        "export.json",
        (serde_json::to_string_pretty(&sidecar).expect("json") + "\n").as_bytes(),
    )
    .map_err(|e| failed(&e))?;
    Ok(0)
}

/// How verbs that build nodes in order to read them (`export`, `check`, `serve`) run them:
/// like `run`, but recording no lineage in the checkout's lock file (only `run` does).
fn reading_run() -> RunOptions {
    RunOptions {
        keep_lock_file: true,
        ..RunOptions::default()
    }
}

/// Builds `target` (and what it needs); a failure says which command shows why.
pub(crate) fn build(engine: &Engine, target: &str) -> Result<(), CliError> {
    let summary = engine.run(&[target.to_string()], &reading_run())?;
    if summary.exit_code() != 0 {
        return Err(CliError::failed(format!(
            "building `{target}` failed; see `cudarl-pipe run {target}`"
        )));
    }
    Ok(())
}

/// The nodes a verb reads, `targets`, ready to read: built first with `--build` (the exit code of
/// that run), else checked fresh.
///
/// # Errors
/// Without `--build`, a target that is not fresh under these settings: each named with its
/// status and reasons, and the command that builds it (exit 2).
fn ready(ctx: &Ctx, engine: &Engine, targets: &[String], build: bool) -> Result<i32, CliError> {
    if build {
        return run_or_report(engine, targets);
    }
    let not_fresh: Vec<String> = engine
        .status(targets)?
        .iter()
        .filter(|r| targets.contains(&r.node) && r.status != NodeStatus::Fresh)
        .map(|r| {
            format!(
                "`{}` is {} ({})",
                r.node,
                r.status.as_str(),
                r.reasons.join("; ")
            )
        })
        .collect();
    if not_fresh.is_empty() {
        return Ok(0);
    }
    Err(CliError::usage(format!(
        "nothing exported: {}; build with `cudarl-pipe run {}` ({}), or add --build",
        not_fresh.join("; "),
        targets.join(" "),
        ctx.settings.flags()
    )))
}

/// Builds `targets` for a verb that then reads their outputs; on failure prints the failed
/// nodes to stderr and returns the run's exit code (0: all built).
pub(crate) fn run_or_report(engine: &Engine, targets: &[String]) -> Result<i32, CliError> {
    let summary = engine.run(targets, &reading_run())?;
    for r in summary
        .records
        .iter()
        .filter(|r| r.status == NodeStatus::Failed)
    {
        eprintln!("{}", human_record(r));
    }
    Ok(summary.exit_code())
}

/// The store path of output `name` of the fresh node `node`.
/// Prints `v` as one line of JSON on stdout: the one convention of every `--json` output
/// (JSON Lines, one object per record, every field present, null where there is no value;
/// docs/json.md).
pub(crate) fn json_line<T: serde::Serialize + ?Sized>(v: &T) {
    println!("{}", serde_json::to_string(v).expect("a record serializes"));
}

pub(crate) fn output_blob(engine: &Engine, node: &str, name: &str) -> Result<PathBuf, CliError> {
    let m = engine.fresh_manifest(node)?;
    let rec = m
        .outputs
        .get(name)
        .ok_or_else(|| CliError::failed(format!("`{node}` has no output `{name}`")))?;
    Ok(engine.store().blob_path(&rec.hash))
}

/// `export NODE --format verl`: the node's part of the RL curriculum in VERL's dataset layouts,
/// under `<to>/verl/`: `curriculum` the RL files (`rl_train`, `rl_test` by the curriculum's
/// splits: the task families and the KernelBench problems with a native signature), `sft-data` the SFT files (`sft_train`, `sft_val`), `rl-train` all four (what it
/// trains on).
fn export_verl(
    ctx: &Ctx,
    node: &str,
    to: &Path,
    output: bool,
    build: bool,
) -> Result<i32, CliError> {
    let targets: &[&str] = match node {
        "curriculum" => &["synth-tasks", "ingest-kernelbench", "curriculum"],
        "sft-data" => &["sft-data"],
        "rl-train" => &["synth-tasks", "sft-data"],
        _ => &[],
    };
    if targets.is_empty() || output {
        return Err(CliError::usage(format!(
            "--format verl exports the RL curriculum: give node `curriculum` (RL files), `sft-data` (SFT files) or `rl-train` (both) and no --output, not `{node}`"
        )));
    }
    let targets: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
    let reporter = Arc::new(CliReporter::detect(false));
    let engine = if build {
        ctx.engine(reporter, 0)?
    } else {
        ctx.engine_to_read(reporter, 0)?
    };
    let code = ready(ctx, &engine, &targets, build)?;
    if code != 0 {
        return Ok(code);
    }
    // The agent loop's turn limit: rl-train's (params with defaults applied).
    let max_turns = ctx
        .pipeline()?
        .node("rl-train")
        .and_then(|n| n.stage.params()["max_turns"].as_u64())
        .unwrap_or(3) as usize;
    let dir = to.join("verl");
    let files = match node {
        "curriculum" => cudarl_rl::verl::export_curriculum_rl(
            &output_blob(&engine, "synth-tasks", "tasks")?,
            &output_blob(&engine, "curriculum", "curriculum")?,
            &output_blob(&engine, "ingest-kernelbench", "problems")?,
            &dir,
            max_turns,
        ),
        "sft-data" => {
            cudarl_rl::verl::export_sft(&output_blob(&engine, "sft-data", "sft_generator")?, &dir)
        }
        _ => cudarl_rl::verl::export(
            &output_blob(&engine, "synth-tasks", "tasks")?,
            &output_blob(&engine, "sft-data", "sft_generator")?,
            &dir,
            max_turns,
        ),
    }?;
    cudarl_data::export::make_shareable(&dir).map_err(|e| CliError::failed(e.to_string()))?;
    for f in files {
        println!("{}", f.display());
    }
    Ok(0)
}

fn gc(ctx: &Ctx, keep_last: usize, dry_run: bool, json: bool) -> Result<i32, CliError> {
    let engine = ctx.engine_to_read(Arc::new(cudarl_core::NullReporter), 1)?;
    let store = engine.store();
    let _g = store
        .gc_guard_exclusive()
        .map_err(|e| CliError::failed(e.to_string()))?;
    let (keep, blobs) = engine.gc_roots(keep_last)?;
    let rep = store
        .gc(&keep, &blobs, dry_run)
        .map_err(|e| CliError::failed(e.to_string()))?;
    if json {
        json_line(
            &serde_json::json!({"dry_run": dry_run, "manifests_removed": rep.actions_removed, "blobs_removed": rep.blobs_removed,
                "bytes_freed": rep.bytes_freed, "tmp_removed": rep.tmp_removed, "manifests_kept": keep.len(), "blobs_kept": blobs.len(),
                "manifests": rep.manifests}),
        );
    } else {
        let verb = if dry_run { "would remove" } else { "removed" };
        for m in &rep.manifests {
            println!("gc: {verb} {m}");
        }
        println!(
            "gc: {verb} {} manifests, {} blobs ({:.1} MB), {} temp entries; kept {} manifests, {} blobs",
            rep.actions_removed,
            rep.blobs_removed,
            rep.bytes_freed as f64 / 1e6,
            rep.tmp_removed,
            keep.len(),
            blobs.len()
        );
    }
    Ok(0)
}
