//! Progress-reporter traits: the engine and stages report through these; the CLI implements
//! them with indicatif bars on a terminal, plain log lines otherwise, or nothing for `--json`.

use crate::engine::NodeRecord;

/// Receives engine events. All methods have no-op defaults.
pub trait Reporter: Send + Sync {
    /// A node starts running (not called for cached nodes).
    fn node_started(&self, node: &str, stage: &str) {
        let _ = (node, stage);
    }
    /// A node waits for a lock held by another process.
    fn node_waiting(&self, node: &str, why: &str) {
        let _ = (node, why);
    }
    /// A node finished: ran, cached, failed or skipped.
    fn node_finished(&self, record: &NodeRecord) {
        let _ = record;
    }
    /// A stage says what it is doing in a way the user should see once (e.g. resuming from
    /// saved progress); not a warning and not stored.
    fn node_note(&self, node: &str, message: &str) {
        let _ = (node, message);
    }
    /// A stage reported a warning.
    fn warning(&self, node: &str, message: &str) {
        let _ = (node, message);
    }
    /// A progress sink for a long loop inside a stage.
    fn progress(&self, node: &str, label: &str, total: Option<u64>) -> Box<dyn ProgressSink> {
        let _ = (node, label, total);
        Box::new(NoProgress)
    }
}

/// Progress of one loop (items done out of an optional total).
pub trait ProgressSink: Send + Sync {
    /// `n` more items are done.
    fn inc(&self, n: u64);
    /// Sets or changes the total.
    fn set_total(&self, total: u64) {
        let _ = total;
    }
    /// The loop ended.
    fn finish(&self) {}
}

/// A sink that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl ProgressSink for NoProgress {
    fn inc(&self, _n: u64) {}
}

/// A reporter that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullReporter;

impl Reporter for NullReporter {}
