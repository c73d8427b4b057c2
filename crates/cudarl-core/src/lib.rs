//! cudarl-core: the content-hashed DAG engine of cudarl-pipe (docs/architecture.md, "Stages, keys
//! and the store").
//!
//! - [`stage`]: the [`Stage`] trait (name, code version, typed params, named inputs and
//!   outputs with Arrow schemas, declared environment).
//! - [`key`]: cache keys, BLAKE3 over a canonical, domain-separated encoding of the preimage.
//! - [`pipeline`]: pipeline TOML files, `--set` overrides, the petgraph DAG.
//! - [`engine`]: fresh/stale decisions, parallel execution (rayon, `-j N`), early cutoff,
//!   publishing to the store, manifests, run logs and `cudarl.lock`.
//! - [`stale`]: why a node is stale, one cause per line.
//! - [`report`]: progress-reporter traits implemented by the CLI.
//!
//! No polars, no CUDA, no torch here.

pub mod canonical;
pub mod dag;
pub mod engine;
pub mod interrupt;
pub mod key;
pub mod lockfile;
pub mod manifest;
pub mod metrics_log;
pub mod pipeline;
pub mod report;
pub mod stage;
pub mod stale;
pub mod suggest;
pub mod table;

pub use cudarl_store::{Digest, GcGuard, Memo, SharedCache, Store, StoreError};
pub use engine::{
    Engine, EngineError, NodeRecord, NodeStatus, RunOptions, RunSummary, fault_point,
};
pub use key::{InputFingerprint, InputOrigin, Preimage};
pub use manifest::{Manifest, OutputRecord};
pub use pipeline::{ParamsError, Pipeline, StageFactory};
pub use report::{NoProgress, NullReporter, ProgressSink, Reporter};
pub use stage::{
    ExternalFiles, InputDecl, InputSource, OutputDecl, OutputKind, ResolveContext, ResolvedInput,
    RunPart, ShardError, Stage, StageContext, StageError,
};
pub use stale::DirtyReason;
