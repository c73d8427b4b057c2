//! Manifests: what the action cache stores for each (node, key).

use std::collections::BTreeMap;

use cudarl_store::Digest;
use serde::{Deserialize, Serialize};

use crate::key::Preimage;

/// Version of the manifest layout.
pub const MANIFEST_FORMAT: u32 = 1;

/// One output of a node as recorded in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputRecord {
    /// BLAKE3 content hash of the output file (its CAS address).
    pub hash: Digest,
    /// Rows, for table outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// File size in bytes.
    pub bytes: u64,
    /// Hash of the table's Arrow schema (field names, types, nullability), for tables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_hash: Option<String>,
    /// File name used on export (`<name>.parquet`, `<name>.safetensors`, ...).
    pub file_name: String,
}

/// The action-cache entry of one completed node run. Written last, after every blob it names
/// is in the CAS, so its presence means the outputs are complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// Node name.
    pub node: String,
    /// Cache key (hex).
    pub key: String,
    /// The full preimage of the key (what `explain` diffs).
    pub preimage: Preimage,
    /// Outputs by name.
    pub outputs: BTreeMap<String, OutputRecord>,
    /// Warnings the stage reported.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Store blobs the outputs' rows point to (recorded test tensors, compiled shared objects),
    /// kept by `gc` as long as this manifest is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub referenced_blobs: Vec<Digest>,
    /// Wall time of the stage run, seconds.
    pub seconds: f64,
    /// When the run finished (Unix time, milliseconds). Not part of the key.
    pub finished_unix_ms: u64,
    /// Git commit of the project checkout, if it is one.
    #[serde(default)]
    pub git_commit: Option<String>,
    /// cudarl-pipe version that produced it.
    pub tool_version: String,
}
