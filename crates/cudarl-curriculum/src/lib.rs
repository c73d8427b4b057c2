//! cudarl-curriculum: op features of reference code, tiers 0-3, deterministic splits, the
//! hold-out draw and the gates that open the next tier (docs/architecture.md, "Tiers and gates").

pub mod holdout;
pub mod ops;
pub mod prompts;
pub mod rename;
pub mod sample;
pub mod split;
pub mod tiers;

pub use ops::extract_op_features;
pub use split::{Split, assign, stratified, unit_hash};
pub use tiers::{Categories, CategoryError, MAX_TIER, TierDecision};

/// Gate thresholds to open the next tier: compile rate and pass rate on the current tier must
/// exceed these (docs/architecture.md, "Tiers and gates": compile rate > 0.9 and pass rate > 0.75).
pub const DEFAULT_MIN_COMPILE_RATE: f64 = 0.9;
/// See [`DEFAULT_MIN_COMPILE_RATE`].
pub const DEFAULT_MIN_PASS_RATE: f64 = 0.75;
