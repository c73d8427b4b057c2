//! cudarl-rl: multi-turn RL of the generator and the optimizer as a library, without stages
//! (docs/architecture.md, "Training"). The `rl-train` and `eval` stages and the evaluation
//! service are built on it.
//!
//! - [`episode`]: one episode (generator -> tester -> optimizer -> tester ...) and the
//!   tester's feedback; [`reward`]: the gated, shaped reward of a turn; [`repair`]: broken
//!   kernels for the optimizer's repair examples; [`sft`]: the agents' SFT examples;
//! - [`credit`]: turn credit, group-normalized advantages (GRPO), GAE (PPO);
//! - [`trainer`]: the trainer process (`cudarl-pipe-train`): one-shot jobs and the RL trainer
//!   as the episodes' policy; [`harness`]: the kernel harness as their tester;
//! - [`families`] and [`operators`]: generated task families; [`tasks`]: the task tables, read in one place;
//! - [`step`]: one RL step (groups, advantages, updates, the step's metrics);
//! - [`stats`]: means, standard errors and the RL - SFT comparisons of `eval`; [`report`]: its
//!   report; [`eval_tables`]: its `summary`, `episodes` and `turns` rows;
//! - [`verl`]: the curriculum in VERL's dataset layouts (`export --format verl`, `verl-launch`);
//! - [`verdict_rows`]: a kernel's verdict as `validate`'s `validations` and `agreement` rows.

pub mod collab;
pub mod credit;
pub mod episode;
pub mod eval_tables;
pub mod families;
pub mod harness;
pub mod kb_eval;
pub mod kb_judge;
pub mod kernelbench;
pub mod operators;
pub mod params;
pub mod progress;
pub mod record;
pub mod repair;
pub mod report;
pub mod reward;
pub mod run;
pub mod sft;
pub mod stats;
pub mod step;
pub mod tasks;
pub mod trainer;
pub mod verdict_rows;
pub mod verl;

pub use cudarl_protocol::{ChatMessage, Role};

/// Where `cudarl-pipe serve` listens by default (and where the VERL backend's rollouts look for
/// it unless `serve_url` says otherwise).
pub const SERVE_BIND: &str = "127.0.0.1:8000";

/// Errors of this crate. A kernel that fails is data (a verdict, a reward), never an error.
#[derive(Debug, thiserror::Error)]
pub enum RlError {
    /// An input table or config is malformed (file and field named).
    #[error("{file}{}: {message}", field.as_ref().map(|f| format!(": field `{f}`")).unwrap_or_default())]
    BadInput {
        /// The file (or input) that is wrong.
        file: String,
        /// The column or field that is wrong, when one is.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// The trainer, the harness or the file system failed.
    #[error("{0}")]
    Failed(String),
    /// A store operation failed (the memo a run's progress is saved in).
    #[error(transparent)]
    Store(#[from] cudarl_store::StoreError),
}

impl From<cudarl_data::plot::PlotError> for RlError {
    fn from(e: cudarl_data::plot::PlotError) -> RlError {
        RlError::Failed(e.to_string())
    }
}

impl RlError {
    /// Shorthand for [`RlError::BadInput`].
    pub fn bad_input(
        file: impl Into<String>,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        RlError::BadInput {
            file: file.into(),
            field: field.map(str::to_string),
            message: message.into(),
        }
    }
}

impl From<cudarl_data::DataError> for RlError {
    fn from(e: cudarl_data::DataError) -> Self {
        match e {
            cudarl_data::DataError::BadInput {
                file,
                field,
                message,
            } => RlError::BadInput {
                file,
                field,
                message,
            },
            cudarl_data::DataError::Source {
                source_desc,
                message,
            } => RlError::BadInput {
                file: source_desc,
                field: None,
                message,
            },
            other => RlError::Failed(other.to_string()),
        }
    }
}
