//! The `Stage` trait: what a pipeline stage declares and how it runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::SchemaRef;
use cudarl_store::{Digest, Memo, Store, StoreError};

use crate::report::{ProgressSink, Reporter};

/// Where a named input of a stage comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSource {
    /// An output of another node of the pipeline.
    Node {
        /// Upstream node name.
        node: String,
        /// Output name on that node.
        output: String,
    },
    /// Files outside the store, resolved by [`Stage::resolve_external`] each time the key is
    /// computed (their content hashes enter the key).
    External,
}

/// A named input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputDecl {
    /// Input name, unique within the stage.
    pub name: String,
    /// Where it comes from.
    pub source: InputSource,
}

impl InputDecl {
    /// An input wired to `node.output`.
    pub fn node(name: &str, node: &str, output: &str) -> Self {
        InputDecl {
            name: name.to_string(),
            source: InputSource::Node {
                node: node.to_string(),
                output: output.to_string(),
            },
        }
    }

    /// An external input.
    pub fn external(name: &str) -> Self {
        InputDecl {
            name: name.to_string(),
            source: InputSource::External,
        }
    }
}

/// What kind of artifact an output is.
#[derive(Debug, Clone)]
pub enum OutputKind {
    /// A Parquet file with exactly this Arrow schema (checked after the stage runs).
    Table(SchemaRef),
    /// An opaque file (safetensors, JSON, PNG, Markdown...), with its file extension.
    File {
        /// Extension used when exporting, without the dot (e.g. `safetensors`).
        extension: String,
    },
}

/// A named output.
#[derive(Debug, Clone)]
pub struct OutputDecl {
    /// Output name, unique within the stage.
    pub name: String,
    /// Table schema or file kind.
    pub kind: OutputKind,
}

impl OutputDecl {
    /// A Parquet table output.
    pub fn table(name: &str, schema: SchemaRef) -> Self {
        OutputDecl {
            name: name.to_string(),
            kind: OutputKind::Table(schema),
        }
    }

    /// An opaque file output with extension `extension` (no dot).
    pub fn file(name: &str, extension: &str) -> Self {
        OutputDecl {
            name: name.to_string(),
            kind: OutputKind::File {
                extension: extension.to_string(),
            },
        }
    }

    /// The file name this output gets in exports and in the stage's scratch directory.
    pub fn file_name(&self) -> String {
        match &self.kind {
            OutputKind::Table(_) => format!("{}.parquet", self.name),
            OutputKind::File { extension } => format!("{}.{extension}", self.name),
        }
    }
}

/// External files of one input, resolved for this run.
#[derive(Debug, Clone)]
pub struct ExternalFiles {
    /// Human description (enters the preimage; must not contain absolute paths).
    pub source: String,
    /// (relative name, path on disk), sorted by name. Only the relative name enters the key.
    pub files: Vec<(String, PathBuf)>,
}

/// Context for resolving external inputs.
#[derive(Debug, Clone)]
pub struct ResolveContext {
    /// The project root (relative paths in pipeline files resolve against it).
    pub root: PathBuf,
    /// The store (for store-scoped environment such as the hidden-seed salt).
    pub store: Store,
    /// The verb only reads the store ([`crate::Engine::reading`]): read its state, draw none
    /// (no new salt; what is not drawn yet goes into the key as such).
    pub read_only: bool,
}

/// Errors a stage (or its configuration) reports. The CLI maps [`StageError::BadInput`] and
/// [`StageError::Config`] to exit code 2, [`StageError::Interrupted`] to 130 and everything else
/// to 1.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// Input data is malformed: unreadable Parquet, wrong schema, missing column, bad value.
    #[error("bad input: {file}{}: {message}", field.as_ref().map(|f| format!(": field `{f}`")).unwrap_or_default())]
    BadInput {
        /// The file (relative where possible) that is wrong.
        file: String,
        /// The column or field that is wrong, when one is.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// Bad configuration: unknown param, wrong param type, missing source.
    #[error("bad config: {file}{}: {message}", field.as_ref().map(|f| format!(": field `{f}`")).unwrap_or_default())]
    Config {
        /// The pipeline or config file.
        file: String,
        /// The offending key (e.g. `stages.curriculum.seed`).
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// The stage failed for another reason.
    #[error("{0}")]
    Failed(String),
    /// The stage stopped early because a stop was requested ([`crate::interrupt`]); the
    /// message says what was kept (e.g. the progress a rerun continues from). Exit code 130.
    #[error("interrupted: {0}")]
    Interrupted(String),
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl StageError {
    /// Shorthand for [`StageError::BadInput`].
    pub fn bad_input(
        file: impl Into<String>,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        StageError::BadInput {
            file: file.into(),
            field: field.map(str::to_string),
            message: message.into(),
        }
    }

    /// [`StageError::Failed`] with `e`'s message: a component's error (the judge's, the Python
    /// worker's, a parse error) that is neither bad input nor an interrupt.
    pub fn failed(e: impl std::fmt::Display) -> Self {
        StageError::Failed(e.to_string())
    }

    /// Whether this is the user's input or configuration (exit code 2) rather than a failure.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            StageError::BadInput { .. } | StageError::Config { .. }
        )
    }
}

/// A pipeline stage. Implementations are pure functions of their params and inputs: the same
/// key must produce the same output bytes (tables sorted, no timestamps, seeds from params).
pub trait Stage: Send + Sync {
    /// Stage kind, e.g. `ingest-sakana`.
    fn kind(&self) -> &str;
    /// Code version: bump on any change that changes output bytes.
    fn code_version(&self) -> u32;
    /// Typed params, serialized with defaults filled in (the canonical params of the key).
    fn params(&self) -> serde_json::Value;
    /// Named inputs.
    fn inputs(&self) -> Vec<InputDecl>;
    /// Named outputs.
    fn outputs(&self) -> Vec<OutputDecl>;
    /// Declared environment the outputs depend on (e.g. `nvcc` version), resolved now.
    ///
    /// # Errors
    /// A required tool is absent.
    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        let _ = ctx;
        Ok(BTreeMap::new())
    }
    /// Resolves an [`InputSource::External`] input to files.
    ///
    /// # Errors
    /// The source is missing or unreadable ([`StageError::BadInput`] or [`StageError::Config`]).
    fn resolve_external(
        &self,
        input: &str,
        ctx: &ResolveContext,
    ) -> Result<ExternalFiles, StageError> {
        let _ = ctx;
        Err(StageError::Failed(format!(
            "stage `{}` declares external input `{input}` but does not resolve it",
            self.kind()
        )))
    }
    /// Runs the stage: read inputs from `ctx`, write every declared output to
    /// [`StageContext::output_path`].
    ///
    /// # Errors
    /// Bad input data or any failure. A kernel that fails to compile is data, not an error.
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError>;
    /// Whether the stage processes rows independently through the row memo and honours
    /// [`StageContext::part`], so `run NODE --shard i/N` and `run NODE --merge` apply to it.
    fn shardable(&self) -> bool {
        false
    }
}

/// Which rows of a shardable stage one run computes (docs/architecture.md, "Sharding").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunPart {
    /// Every row, and publish the outputs (a normal run).
    #[default]
    Whole,
    /// Only the rows this shard owns ([`RunPart::owns`]), into the row memo; no outputs are
    /// published (the table is incomplete), the engine records the node as `shard`.
    Shard {
        /// This shard, `0..count`.
        index: u32,
        /// Number of shards.
        count: u32,
    },
    /// Assemble the outputs from rows the shards memoized; a row without a memo entry is an
    /// error (nothing is computed), so an incomplete set of shards cannot pass as a whole run.
    Merge,
}

/// A shard that is not `i/N` with `0 <= i < N` (the text as given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}`: expected i/N with 0 <= i < N, e.g. 0/4")]
pub struct ShardError(pub String);

impl RunPart {
    /// Parses `i/N` (`0 <= i < N`).
    ///
    /// # Errors
    /// [`ShardError`]: not of that form.
    pub fn parse_shard(s: &str) -> Result<RunPart, ShardError> {
        let bad = || ShardError(s.to_string());
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(RunPart::Shard { index, count })
    }

    /// Whether this part computes the row with key `row`: a shard owns the rows whose key,
    /// read as a little-endian u64 from its first 8 bytes, is `index` modulo `count` (keys are
    /// BLAKE3 digests, so shards get near-equal shares and every machine agrees on the split).
    pub fn owns(&self, row: &Digest) -> bool {
        match *self {
            RunPart::Shard { index, count } => {
                let v = u64::from_le_bytes(row.0[..8].try_into().expect("8 bytes"));
                v % u64::from(count) == u64::from(index)
            }
            RunPart::Whole | RunPart::Merge => true,
        }
    }

    /// `i-of-N` for shards (the shard record's file stem), `whole` / `merge` otherwise.
    pub fn label(&self) -> String {
        match self {
            RunPart::Shard { index, count } => format!("{index}-of-{count}"),
            RunPart::Whole => "whole".into(),
            RunPart::Merge => "merge".into(),
        }
    }
}

/// An input as seen by a running stage.
#[derive(Debug, Clone)]
pub enum ResolvedInput {
    /// An upstream output: one blob in the CAS.
    Blob(PathBuf),
    /// External files.
    External(ExternalFiles),
}

/// What a running stage gets: its inputs, where to write outputs, progress, memo, warnings.
pub struct StageContext<'a> {
    pub(crate) node: &'a str,
    pub(crate) inputs: BTreeMap<String, ResolvedInput>,
    pub(crate) out_dir: PathBuf,
    pub(crate) outputs: Vec<OutputDecl>,
    pub(crate) store: &'a Store,
    pub(crate) reporter: Arc<dyn Reporter>,
    pub(crate) root: &'a Path,
    pub(crate) warnings: Vec<String>,
    pub(crate) referenced: std::collections::BTreeSet<cudarl_store::Digest>,
    pub(crate) part: RunPart,
    pub(crate) stats: BTreeMap<String, serde_json::Value>,
    pub(crate) preimage: Option<crate::key::Preimage>,
    pub(crate) run_id: Option<String>,
}

impl<'a> StageContext<'a> {
    /// Builds a context by hand (for tests and for stages run outside the engine).
    pub fn new(
        node: &'a str,
        inputs: BTreeMap<String, ResolvedInput>,
        out_dir: PathBuf,
        outputs: Vec<OutputDecl>,
        store: &'a Store,
        reporter: Arc<dyn Reporter>,
        root: &'a Path,
    ) -> Self {
        StageContext {
            node,
            inputs,
            out_dir,
            outputs,
            store,
            reporter,
            root,
            warnings: Vec::new(),
            referenced: Default::default(),
            part: RunPart::Whole,
            stats: BTreeMap::new(),
            preimage: None,
            run_id: None,
        }
    }

    /// This context inside engine run `run_id` (the engine sets it; [`StageContext::metrics_log`]
    /// writes under it).
    pub fn with_run(mut self, run_id: &str) -> Self {
        self.run_id = Some(run_id.to_string());
        self
    }

    /// This node's live metrics files for this run, `<store>/runs/<run-id>/<node>/`
    /// ([`crate::metrics_log::MetricsLog`]), its path said once through the reporter; `None`
    /// outside an engine run or when the folder cannot be created (said as a warning: live
    /// metrics are a view, the run goes on without them).
    pub fn metrics_log(&self) -> Option<crate::metrics_log::MetricsLog> {
        let run = self.run_id.as_deref()?;
        let dir = self.store.root().join("runs").join(run).join(self.node);
        match crate::metrics_log::MetricsLog::create(&dir) {
            Ok(log) => {
                self.reporter.node_note(
                    self.node,
                    &format!(
                        "metrics as they happen: {} (metrics.jsonl; tensorboard --logdir {})",
                        dir.display(),
                        self.store.root().join("runs").display()
                    ),
                );
                Some(log)
            }
            Err(e) => {
                self.reporter.warning(
                    self.node,
                    &format!("no live metrics in {}: {e}", dir.display()),
                );
                None
            }
        }
    }

    /// This context running the action of `preimage` (the engine sets it; see
    /// [`StageContext::key_without`]).
    pub fn with_preimage(mut self, preimage: crate::key::Preimage) -> Self {
        self.preimage = Some(preimage);
        self
    }

    /// The node's cache key without the params named in `params`
    /// ([`crate::key::Preimage::key_without`]): a key for progress that runs differing only in
    /// those params share. `None` for a context built without a preimage.
    pub fn key_without(&self, params: &[&str]) -> Option<String> {
        self.preimage.as_ref().map(|p| p.key_without(params))
    }

    /// Records a counter for the node's report (`run --json` `stats`, and a shard's record in
    /// the shared cache), e.g. `rows_computed`.
    pub fn stat(&mut self, name: &str, value: impl Into<serde_json::Value>) {
        self.stats.insert(name.to_string(), value.into());
    }

    /// This context running only `part` of the rows (for tests and stages run outside the
    /// engine; the engine sets it from `run --shard` / `--merge`).
    pub fn with_part(mut self, part: RunPart) -> Self {
        self.part = part;
        self
    }

    /// Which rows this run computes; only [`Stage::shardable`] stages see anything but
    /// [`RunPart::Whole`].
    pub fn part(&self) -> RunPart {
        self.part
    }

    /// The node name being run.
    pub fn node(&self) -> &str {
        self.node
    }

    /// Path of a single-file input (an upstream output, or an external input with one file).
    ///
    /// # Errors
    /// Unknown input name, or an external input with several files.
    pub fn input_path(&self, name: &str) -> Result<&Path, StageError> {
        match self.inputs.get(name) {
            Some(ResolvedInput::Blob(p)) => Ok(p),
            Some(ResolvedInput::External(ext)) if ext.files.len() == 1 => Ok(&ext.files[0].1),
            Some(ResolvedInput::External(ext)) => Err(StageError::Failed(format!(
                "input `{name}` has {} files; use input_files",
                ext.files.len()
            ))),
            None => Err(StageError::Failed(format!("no input named `{name}`"))),
        }
    }

    /// Files of an external input (relative name, path).
    ///
    /// # Errors
    /// Unknown input name or an input that is not external.
    pub fn input_files(&self, name: &str) -> Result<&ExternalFiles, StageError> {
        match self.inputs.get(name) {
            Some(ResolvedInput::External(ext)) => Ok(ext),
            Some(ResolvedInput::Blob(_)) => Err(StageError::Failed(format!(
                "input `{name}` is a node output, not external files"
            ))),
            None => Err(StageError::Failed(format!("no input named `{name}`"))),
        }
    }

    /// Whether an input with this name is wired.
    pub fn has_input(&self, name: &str) -> bool {
        self.inputs.contains_key(name)
    }

    /// Where to write the output `name` (in the node's scratch directory inside the store).
    ///
    /// # Panics
    /// If `name` is not a declared output (a bug in the stage).
    pub fn output_path(&self, name: &str) -> PathBuf {
        let decl = self
            .outputs
            .iter()
            .find(|o| o.name == name)
            .unwrap_or_else(|| panic!("stage wrote undeclared output `{name}`"));
        self.out_dir.join(decl.file_name())
    }

    /// The declared schema of a table output.
    ///
    /// # Panics
    /// If `name` is not a declared table output.
    pub fn output_schema(&self, name: &str) -> SchemaRef {
        match self
            .outputs
            .iter()
            .find(|o| o.name == name)
            .map(|o| &o.kind)
        {
            Some(OutputKind::Table(s)) => s.clone(),
            _ => panic!("`{name}` is not a declared table output"),
        }
    }

    /// Shows the user a line about this node's run (not a warning, not stored).
    pub fn note(&self, message: &str) {
        self.reporter.node_note(self.node, message);
    }

    /// Records a warning: shown to the user and stored in the manifest.
    pub fn warn(&mut self, message: impl Into<String>) {
        let m = message.into();
        self.reporter.warning(self.node, &m);
        self.warnings.push(m);
    }

    /// A progress sink for `total` items (a bar on a terminal, log lines otherwise).
    pub fn progress(&self, label: &str, total: Option<u64>) -> Box<dyn ProgressSink> {
        self.reporter.progress(self.node, label, total)
    }

    /// The row-level memo namespace `namespace` in the store.
    ///
    /// # Errors
    /// Invalid namespace name or I/O errors.
    pub fn memo(&self, namespace: &str) -> Result<Memo, StageError> {
        Ok(self.store.memo(namespace)?)
    }

    /// The store (for blobs a stage wants to reference from its tables).
    pub fn store(&self) -> &Store {
        self.store
    }

    /// Marks a store blob as referenced by this node's outputs (a digest in a table row): the
    /// manifest lists it and `gc` keeps it while the manifest lives.
    pub fn reference_blob(&mut self, d: cudarl_store::Digest) {
        self.referenced.insert(d);
    }

    /// The project root.
    pub fn root(&self) -> &Path {
        self.root
    }

    /// Warnings recorded so far.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}
