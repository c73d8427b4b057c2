//! `cudarl.lock`: the current key and output hashes of every node, in sorted TOML, so the data
//! lineage of a checkout is reviewable in git.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Version of the lock file layout.
pub const LOCK_FORMAT: u32 = 1;

/// One output in the lock file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockOutput {
    /// Content hash (hex).
    pub hash: String,
    /// Rows, for tables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
}

/// One node in the lock file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockNode {
    /// Stage kind.
    pub stage: String,
    /// Code version of the stage.
    pub code_version: u32,
    /// Cache key (hex).
    pub key: String,
    /// Outputs by name.
    pub outputs: BTreeMap<String, LockOutput>,
}

/// The whole lock file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockFile {
    /// [`LOCK_FORMAT`].
    pub version: u32,
    /// Nodes by name (sorted).
    #[serde(default)]
    pub nodes: BTreeMap<String, LockNode>,
}

impl Default for LockFile {
    fn default() -> Self {
        LockFile {
            version: LOCK_FORMAT,
            nodes: BTreeMap::new(),
        }
    }
}

/// Errors reading the lock file.
#[derive(Debug, thiserror::Error)]
pub enum LockFileError {
    /// The file could not be read.
    #[error("read {path}: {source}")]
    Io {
        /// Lock file path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid lock file.
    #[error("{path}: not a valid lock file: {message}")]
    Parse {
        /// Lock file path.
        path: String,
        /// Parser message (with line and column).
        message: String,
    },
}

const HEADER: &str = "# cudarl.lock: written by `cudarl-pipe run`; records the cache key and output content\n# hashes of every node (the data lineage). Review it in git; do not edit by hand.\n";

impl LockFile {
    /// Reads a lock file; a missing file is an empty lock.
    ///
    /// # Errors
    /// Unreadable or malformed file.
    pub fn read(path: &Path) -> Result<LockFile, LockFileError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LockFile::default()),
            Err(e) => {
                return Err(LockFileError::Io {
                    path: path.display().to_string(),
                    source: e,
                });
            }
        };
        toml::from_str(&text).map_err(|e| LockFileError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// The TOML text (header comment + sorted tables).
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).expect("lock file serializes");
        format!("{HEADER}{body}")
    }
}
