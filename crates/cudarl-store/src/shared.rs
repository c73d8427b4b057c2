//! A cache shared by several machines, on an `object_store` backend: row-level memo entries
//! and shard records of sharded stages (docs/architecture.md, "Sharding").
//!
//! Layout under the cache URL:
//!
//! ```text
//! memo/<namespace>/<aa>/<key>              one row's result (first writer wins)
//! shards/<node>/<key>/<i>-of-<n>.json      one finished shard of a node's cache key
//! ```
//!
//! Every write is a conditional create (`PutMode::Create`): an entry is written once, by the
//! first machine that finishes it, and never overwritten, so N machines racing on the same
//! key store one value. Backends: a local or network-mounted directory (`/path`, `file:///path`)
//! in every build; `s3://bucket/prefix` and `gs://bucket/prefix` in a build with the `cloud`
//! feature (credentials from the usual `AWS_*` / `GOOGLE_*` environment variables).

use std::future::Future;
use std::sync::{Arc, OnceLock};

use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::{Result, StoreError};

/// A shared cache opened from a URL. Cheap to clone (the backend is behind an `Arc`).
#[derive(Clone)]
pub struct SharedCache {
    backend: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    url: String,
}

impl std::fmt::Debug for SharedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCache")
            .field("url", &self.url)
            .finish()
    }
}

/// Runs `fut` to completion on the cache's own tokio runtime. From inside another runtime
/// (e.g. the HTTP service's blocking threads) it runs on a scoped helper thread, because a
/// runtime cannot be blocked on from within one.
fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let rt = RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cudarl-shared-cache")
            .enable_all()
            .build()
            .expect("cannot start the shared cache's tokio runtime")
    });
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| {
            s.spawn(|| rt.block_on(fut))
                .join()
                .expect("shared cache thread panicked")
        })
    } else {
        rt.block_on(fut)
    }
}

impl SharedCache {
    /// Opens the cache at `url`: a directory path (created if missing), `file:///abs/path`,
    /// or, with the `cloud` feature, `s3://bucket/prefix` / `gs://bucket/prefix`.
    ///
    /// # Errors
    /// [`StoreError::BadCacheUrl`] for an unparsable URL, a scheme this build does not support,
    /// or a directory that cannot be created.
    pub fn open(url: &str) -> Result<SharedCache> {
        let bad = |message: String| StoreError::BadCacheUrl {
            url: url.to_string(),
            message,
        };
        let parsed = if url.contains("://") {
            url::Url::parse(url).map_err(|e| bad(e.to_string()))?
        } else {
            let p = std::path::Path::new(url);
            std::fs::create_dir_all(p).map_err(|e| bad(format!("create directory: {e}")))?;
            let abs = std::fs::canonicalize(p).map_err(|e| bad(e.to_string()))?;
            url::Url::from_directory_path(&abs)
                .map_err(|_| bad("not an absolute directory path".into()))?
        };
        if parsed.scheme() == "file" {
            let dir = parsed
                .to_file_path()
                .map_err(|_| bad("not a local path".into()))?;
            std::fs::create_dir_all(&dir).map_err(|e| bad(format!("create directory: {e}")))?;
        }
        let (backend, prefix) = object_store::parse_url_opts(
            &parsed,
            std::env::vars().map(|(k, v)| (k.to_ascii_lowercase(), v)),
        )
            .map_err(|e| match parsed.scheme() {
                "s3" | "s3a" | "gs" if !cfg!(feature = "cloud") => bad(format!(
                    "{e}; this build reads local paths only: build with `--features cudarl-store/cloud` for S3 and GCS"
                )),
                _ => bad(e.to_string()),
            })?;
        Ok(SharedCache {
            backend: Arc::from(backend),
            prefix,
            url: url.to_string(),
        })
    }

    /// The URL the cache was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn path(&self, rel: &str) -> ObjPath {
        let mut p = self.prefix.clone();
        for part in rel.split('/').filter(|s| !s.is_empty()) {
            p = p.clone().join(part);
        }
        p
    }

    fn err(&self, op: &'static str, rel: &str, e: object_store::Error) -> StoreError {
        StoreError::Shared {
            url: self.url.clone(),
            op,
            key: rel.to_string(),
            message: e.to_string(),
        }
    }

    /// The bytes at `rel` (a `/`-separated path under the cache), if present.
    ///
    /// # Errors
    /// Backend errors other than "not found".
    pub fn get(&self, rel: &str) -> Result<Option<Vec<u8>>> {
        let p = self.path(rel);
        block_on(async {
            match self.backend.get(&p).await {
                Ok(r) => r
                    .bytes()
                    .await
                    .map(|b| Some(b.to_vec()))
                    .map_err(|e| self.err("read", rel, e)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(self.err("read", rel, e)),
            }
        })
    }

    /// Whether `rel` exists.
    ///
    /// # Errors
    /// Backend errors other than "not found".
    pub fn contains(&self, rel: &str) -> Result<bool> {
        let p = self.path(rel);
        block_on(async {
            match self.backend.head(&p).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(self.err("stat", rel, e)),
            }
        })
    }

    /// Writes `bytes` at `rel` unless something is there already (a conditional create, so
    /// concurrent writers on several machines store one value). Returns `true` if this call
    /// wrote it.
    ///
    /// # Errors
    /// Backend errors other than "already exists".
    pub fn put_new(&self, rel: &str, bytes: &[u8]) -> Result<bool> {
        let p = self.path(rel);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        block_on(async {
            match self
                .backend
                .put_opts(&p, PutPayload::from(bytes.to_vec()), opts)
                .await
            {
                Ok(_) => Ok(true),
                Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
                Err(e) => Err(self.err("write", rel, e)),
            }
        })
    }

    /// Names (last path component) of the entries directly under `rel`, sorted.
    ///
    /// # Errors
    /// Backend errors.
    pub fn list(&self, rel: &str) -> Result<Vec<String>> {
        let p = self.path(rel);
        block_on(async {
            match self.backend.list_with_delimiter(Some(&p)).await {
                Ok(r) => {
                    let mut v: Vec<String> = r
                        .objects
                        .iter()
                        .filter_map(|o| o.location.filename().map(str::to_string))
                        .collect();
                    v.sort();
                    Ok(v)
                }
                Err(object_store::Error::NotFound { .. }) => Ok(Vec::new()),
                Err(e) => Err(self.err("list", rel, e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditional_create_and_listing_on_a_local_directory() {
        let dir = tempfile::tempdir().unwrap();
        let c = SharedCache::open(dir.path().join("cache").to_str().unwrap()).unwrap();
        assert_eq!(c.get("memo/ns/ab/k").unwrap(), None);
        assert!(!c.contains("memo/ns/ab/k").unwrap());
        assert!(c.put_new("memo/ns/ab/k", b"first").unwrap());
        assert!(!c.put_new("memo/ns/ab/k", b"second").unwrap());
        assert_eq!(c.get("memo/ns/ab/k").unwrap().unwrap(), b"first");
        assert!(c.contains("memo/ns/ab/k").unwrap());
        assert!(c.put_new("shards/n/key/1-of-2.json", b"{}").unwrap());
        assert!(c.put_new("shards/n/key/0-of-2.json", b"{}").unwrap());
        assert_eq!(
            c.list("shards/n/key").unwrap(),
            vec!["0-of-2.json".to_string(), "1-of-2.json".to_string()]
        );
        assert_eq!(c.list("shards/none").unwrap(), Vec::<String>::new());
        // The entry is a plain file under the directory (what a second machine mounts).
        let f = dir.path().join("cache/memo/ns/ab/k");
        assert_eq!(std::fs::read(f).unwrap(), b"first");
        // Same cache through a file:// URL.
        let url = format!("file://{}", dir.path().join("cache").display());
        let c2 = SharedCache::open(&url).unwrap();
        assert_eq!(c2.get("memo/ns/ab/k").unwrap().unwrap(), b"first");
    }

    #[test]
    fn unsupported_schemes_are_named() {
        let e = SharedCache::open("ftp://host/x").unwrap_err().to_string();
        assert!(e.contains("ftp://host/x"), "{e}");
        if !cfg!(feature = "cloud") {
            let e = SharedCache::open("s3://bucket/prefix")
                .unwrap_err()
                .to_string();
            assert!(e.contains("--features cudarl-store/cloud"), "{e}");
        }
    }
}
