//! Cache keys: BLAKE3 over a domain-separated canonical encoding of a node's full preimage.
//!
//! key = BLAKE3-derive_key(context = [`KEY_CONTEXT`], canonical_json(preimage)).
//!
//! The preimage holds the stage kind, its code version, its canonical params, the content hash
//! of every input (sorted by name) and the declared environment. Never mtimes, absolute paths,
//! run ids or temp dirs (docs/architecture.md, "Stages, keys and the store"). The golden tests
//! below pin the encoding: a change that moves those hashes invalidates every cache and must come
//! with a bump of [`KEY_FORMAT`].

use std::collections::BTreeMap;

use cudarl_store::Digest;
use serde::{Deserialize, Serialize};

use crate::canonical::to_canonical_json;

/// Version of the preimage layout; part of every preimage.
pub const KEY_FORMAT: u32 = 1;

/// BLAKE3 key-derivation context string (domain separation from every other BLAKE3 use).
pub const KEY_CONTEXT: &str = "cudarl-pipe 2026-11-22 stage cache key v1";

/// Where an input's content came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InputOrigin {
    /// An output of an upstream node.
    Node {
        /// Upstream node name.
        node: String,
        /// Output name on that node.
        output: String,
    },
    /// Files outside the store (bundled dataset, checkout, hub download), by relative name.
    External {
        /// Human description of the source (e.g. `bundled datasets/kernelbench/problems.parquet`).
        source: String,
        /// Content hash of each file, by a relative name (never an absolute path).
        files: BTreeMap<String, Digest>,
    },
}

/// One input in a preimage: its content hash and origin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFingerprint {
    /// Content hash: the upstream output's blob digest, or for external inputs the BLAKE3 of
    /// the canonical JSON of the `files` map.
    pub hash: Digest,
    /// Where it came from.
    pub origin: InputOrigin,
}

impl InputFingerprint {
    /// Fingerprint of a set of external files; `hash` is derived from the `files` map.
    pub fn external(source: impl Into<String>, files: BTreeMap<String, Digest>) -> Self {
        let v = serde_json::to_value(&files).expect("map of digests serializes");
        let hash = Digest::of_bytes(to_canonical_json(&v).as_bytes());
        InputFingerprint {
            hash,
            origin: InputOrigin::External {
                source: source.into(),
                files,
            },
        }
    }
}

/// Everything a node's output depends on. Its canonical encoding is hashed into the key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preimage {
    /// [`KEY_FORMAT`] at the time the key was computed.
    pub format: u32,
    /// Stage kind (e.g. `ingest-sakana`).
    pub stage: String,
    /// The stage's code version (bumped on semantic change).
    pub code_version: u32,
    /// Canonical params (typed params serialized with defaults filled in).
    pub params: serde_json::Value,
    /// Inputs by name.
    pub inputs: BTreeMap<String, InputFingerprint>,
    /// Declared environment (e.g. `nvcc` version, GPU arch), by name.
    pub env: BTreeMap<String, String>,
}

impl Preimage {
    /// The canonical bytes that are hashed.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let v = serde_json::to_value(self).expect("preimage serializes");
        to_canonical_json(&v).into_bytes()
    }

    /// The cache key: 64 hex characters.
    pub fn key(&self) -> String {
        let h = blake3::derive_key(KEY_CONTEXT, &self.canonical_bytes());
        Digest(h).to_hex()
    }

    /// The key of this preimage without the params named in `params`: the same work up to
    /// those params, e.g. `rl-train`'s run without its `steps`, so a longer run finds a shorter
    /// run's progress (docs/architecture.md, "Resuming").
    pub fn key_without(&self, params: &[&str]) -> String {
        let mut p = self.clone();
        if let Some(m) = p.params.as_object_mut() {
            for k in params {
                m.remove(*k);
            }
        }
        p.key()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn d(c: char) -> Digest {
        c.to_string().repeat(64).parse().unwrap()
    }

    fn sample() -> Preimage {
        let mut files = BTreeMap::new();
        files.insert("problems.parquet".to_string(), d('a'));
        let mut inputs = BTreeMap::new();
        inputs.insert(
            "source".to_string(),
            InputFingerprint::external("bundled datasets/kernelbench", files),
        );
        inputs.insert(
            "kernels".to_string(),
            InputFingerprint {
                hash: d('b'),
                origin: InputOrigin::Node {
                    node: "ingest-sakana".into(),
                    output: "kernels".into(),
                },
            },
        );
        let mut env = BTreeMap::new();
        env.insert("nvcc".to_string(), "13.0.88".to_string());
        Preimage {
            format: KEY_FORMAT,
            stage: "curriculum".into(),
            code_version: 3,
            params: json!({"seed": 0, "fractions": {"train": 0.8, "val": 0.1}}),
            inputs,
            env,
        }
    }

    /// Golden encoding and hashes: if this fails, the key encoding changed. That invalidates
    /// every cache in every store; do it only on purpose, bump KEY_FORMAT and update the
    /// constants here.
    #[test]
    fn golden_key() {
        let p = sample();
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let expected = format!(
            concat!(
                r#"{{"code_version":3,"env":{{"nvcc":"13.0.88"}},"format":1,"inputs":{{"#,
                r#""kernels":{{"hash":"{b}","origin":{{"kind":"node","node":"ingest-sakana","output":"kernels"}}}},"#,
                r#""source":{{"hash":"{ext}","origin":{{"files":{{"problems.parquet":"{a}"}},"#,
                r#""kind":"external","source":"bundled datasets/kernelbench"}}}}}},"#,
                r#""params":{{"fractions":{{"train":0.8,"val":0.1}},"seed":0}},"stage":"curriculum"}}"#
            ),
            a = a,
            b = b,
            ext = GOLDEN_EXTERNAL_HASH
        );
        assert_eq!(String::from_utf8(p.canonical_bytes()).unwrap(), expected);
        assert_eq!(p.inputs["source"].hash.to_hex(), GOLDEN_EXTERNAL_HASH);
        assert_eq!(p.key(), GOLDEN_KEY);
    }

    const GOLDEN_EXTERNAL_HASH: &str =
        "f66f395832304a05f66dc161cd1d4fa2dac6d076112eb72fc8630749968b0819";
    // Both constants were computed independently in Python:
    // blake3.blake3(json.dumps(preimage, separators=(",", ":"), sort_keys=True).encode(),
    //               derive_key_context=KEY_CONTEXT).hexdigest()
    const GOLDEN_KEY: &str = "2c034240659557961188eb7d3101d15bf8ce82628ec46d3223e0d5849b2a85de";

    #[test]
    fn key_without_drops_only_the_named_params() {
        let mut a = sample();
        a.params = serde_json::json!({"seed": 1, "steps": 5});
        let mut b = a.clone();
        b.params["steps"] = 100.into();
        assert_ne!(a.key(), b.key());
        assert_eq!(a.key_without(&["steps"]), b.key_without(&["steps"]));
        assert_ne!(a.key_without(&["steps"]), a.key());
        b.params["seed"] = 2.into();
        assert_ne!(a.key_without(&["steps"]), b.key_without(&["steps"]));
    }

    #[test]
    fn key_changes_with_every_field() {
        let base = sample();
        let k0 = base.key();
        let mut p = base.clone();
        p.code_version = 4;
        assert_ne!(p.key(), k0);
        let mut p = base.clone();
        p.params = json!({"seed": 7, "fractions": {"train": 0.8, "val": 0.1}});
        assert_ne!(p.key(), k0);
        let mut p = base.clone();
        p.env.insert("gpu_arch".into(), "sm_90".into());
        assert_ne!(p.key(), k0);
        let mut p = base.clone();
        p.inputs.get_mut("kernels").unwrap().hash = Digest::of_bytes(b"other");
        assert_ne!(p.key(), k0);
        // Param key order is irrelevant.
        let mut p = base.clone();
        p.params =
            serde_json::from_str(r#"{"fractions":{"val":0.1,"train":0.8},"seed":0}"#).unwrap();
        assert_eq!(p.key(), k0);
    }
}
