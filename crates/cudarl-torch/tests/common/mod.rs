//! What the integration tests of the evaluator share.

use std::collections::BTreeSet;
use std::path::PathBuf;

use cudarl_cuda::task::{TaskSpec, load_tasks};

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every task of the default pipeline: the 450 operator families of seed 0
/// (`cudarl_rl::operators`), then the hand-written tasks of `datasets/tasks/`.
pub fn default_task_specs() -> Vec<TaskSpec> {
    let families = cudarl_rl::operators::generate(450, 0, &BTreeSet::new());
    let hand = load_tasks(&repo().join("datasets/tasks")).expect("tasks");
    families
        .into_iter()
        .map(|f| f.spec)
        .chain(hand.into_iter().map(|t| t.spec))
        .collect()
}
