//! The local store of cudarl-pipe: a content-addressed blob store (CAS), an action cache of
//! manifests, a row-level memo, per-node locks, run logs and garbage collection.
//!
//! Layout under the store root (docs/architecture.md, "Stages, keys and the store"):
//!
//! ```text
//! cas/<aa>/<hash>            immutable blobs, named by their BLAKE3 digest (read-only files)
//! ac/<node>/<key>.json       action cache: one manifest per (node, cache key), written last
//! memo/<namespace>/<aa>/<k>  row-level memo entries (first writer wins)
//! tmp/                       scratch space; every publish is write-temp, fsync, rename
//! runs/<run-id>.jsonl        one event per node per run
//! runs/<run-id>/<node>/      a training stage's live metrics (metrics.jsonl, TensorBoard events)
//! locks/                     advisory file locks: one per node, plus the gc lock
//! derived/                   rebuildable derived files of other crates (precompiled headers)
//! ```
//!
//! Crash safety: a blob or manifest is visible only after a complete, fsynced temp file was
//! renamed into place, so a killed process leaves at most garbage in `tmp/`, never a
//! half-written artifact. Nothing here knows about stages or Parquet; `cudarl-core` builds the
//! DAG engine on top of these byte-level operations.

mod digest;
mod memo;
mod shared;

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use digest::{Digest, ParseDigestError};
pub use memo::Memo;
pub use shared::SharedCache;

/// Errors of store operations. Every variant names the path involved.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O operation on `path` failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("create", "read", "rename", ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A name used as a path component (node, namespace, key) is not allowed.
    #[error(
        "invalid {what} name {name:?}: use letters, digits, '-', '_' and '.', not starting with '.'"
    )]
    InvalidName {
        /// Which kind of name.
        what: &'static str,
        /// The rejected name.
        name: String,
    },
    /// A blob that a manifest references is absent from the CAS.
    #[error("blob {0} is missing from the store")]
    MissingBlob(Digest),
    /// The shared cache URL cannot be opened.
    #[error("shared cache {url}: {message}")]
    BadCacheUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// An operation on the shared cache failed.
    #[error("shared cache {url}: {op} {key}: {message}")]
    Shared {
        /// The cache URL.
        url: String,
        /// What was being done ("read", "write", "list", "stat").
        op: &'static str,
        /// The path under the cache.
        key: String,
        /// The backend's error.
        message: String,
    },
}

/// Result alias for store operations.
pub type Result<T> = std::result::Result<T, StoreError>;

pub(crate) fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Checks that `name` is safe as a single path component.
pub fn validate_name(what: &'static str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 200
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidName {
            what,
            name: name.to_string(),
        })
    }
}

/// A local store rooted at a directory (`artifacts/` by default).
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    /// The cache shared with other machines, if any (memo entries and shard records).
    shared: Option<SharedCache>,
}

/// One manifest file in the action cache.
#[derive(Debug, Clone)]
pub struct ActionEntry {
    /// Node name (directory under `ac/`).
    pub node: String,
    /// Cache key (file stem).
    pub key: String,
    /// Path of the manifest file.
    pub path: PathBuf,
    /// Modification time of the manifest (used only to order entries for gc and explain).
    pub modified: SystemTime,
}

/// What `gc` removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Manifests deleted from the action cache.
    pub actions_removed: usize,
    /// Blobs deleted from the CAS.
    pub blobs_removed: usize,
    /// Bytes of blobs deleted.
    pub bytes_freed: u64,
    /// Entries deleted from `tmp/` (left by killed processes).
    pub tmp_removed: usize,
    /// The manifests deleted, as `node/key`, sorted.
    pub manifests: Vec<String>,
}

/// An exclusive advisory lock on one node; released on drop.
#[derive(Debug)]
pub struct NodeLock {
    _file: File,
}

/// A shared (runs) or exclusive (gc) hold on the store's gc lock; released on drop.
#[derive(Debug)]
pub struct GcGuard {
    _file: File,
}

/// An append-only JSON-lines event log for one run (`runs/<run-id>.jsonl`).
#[derive(Debug)]
pub struct RunLog {
    path: PathBuf,
    file: std::sync::Mutex<File>,
}

impl RunLog {
    /// Appends one line (the caller passes one JSON object without a newline) and flushes it.
    ///
    /// # Errors
    /// I/O errors writing the log file.
    pub fn append(&self, line: &str) -> Result<()> {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.write_all(line.as_bytes())
            .and_then(|_| f.write_all(b"\n"))
            .and_then(|_| f.flush())
            .map_err(io_err("append", &self.path))
    }

    /// Path of the log file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

const DIRS: [&str; 6] = ["cas", "ac", "memo", "tmp", "runs", "locks"];

impl Store {
    /// Opens (creating if needed) a store at `root`.
    ///
    /// # Errors
    /// I/O errors creating the layout directories.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store> {
        let root = root.into();
        for d in DIRS {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(io_err("create directory", &p))?;
        }
        Ok(Store { root, shared: None })
    }

    /// Opens an existing store without creating anything; `None` if `root` holds no store.
    pub fn open_existing(root: impl Into<PathBuf>) -> Option<Store> {
        let root = root.into();
        if DIRS.iter().all(|d| root.join(d).is_dir()) {
            Some(Store { root, shared: None })
        } else {
            None
        }
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// This store with a cache shared by several machines: memo entries are read through it
    /// (and copied into the local memo) and written to both, so N machines that run shards of
    /// a stage see each other's rows (docs/architecture.md, "Sharding").
    pub fn with_shared(mut self, cache: SharedCache) -> Store {
        self.shared = Some(cache);
        self
    }

    /// This store without its shared cache (local files only).
    pub fn without_shared(mut self) -> Store {
        self.shared = None;
        self
    }

    /// The shared cache, if one was attached with [`Store::with_shared`].
    pub fn shared(&self) -> Option<&SharedCache> {
        self.shared.as_ref()
    }

    // ----- CAS -------------------------------------------------------------------------

    /// Path where the blob with digest `d` lives (whether or not it exists).
    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        let hex = d.to_hex();
        self.root.join("cas").join(&hex[..2]).join(hex)
    }

    /// Whether the blob exists in the CAS.
    pub fn has_blob(&self, d: &Digest) -> bool {
        self.blob_path(d).is_file()
    }

    /// Stores `bytes` and returns their digest. Idempotent.
    ///
    /// # Errors
    /// I/O errors writing the temp file or renaming it into place.
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<Digest> {
        let d = Digest::of_bytes(bytes);
        if self.has_blob(&d) {
            return Ok(d);
        }
        let tmp = self.temp_file()?;
        {
            let mut f = tmp.as_file();
            f.write_all(bytes).map_err(io_err("write", tmp.path()))?;
        }
        self.publish_blob(tmp, d)?;
        Ok(d)
    }

    /// Copies the file at `src` into the CAS and returns its digest. `src` is left in place.
    ///
    /// # Errors
    /// I/O errors reading `src` or writing the blob.
    pub fn put_file(&self, src: &Path) -> Result<Digest> {
        let d = Digest::of_file(src).map_err(io_err("read", src))?;
        if self.has_blob(&d) {
            return Ok(d);
        }
        let tmp = self.temp_file()?;
        fs::copy(src, tmp.path()).map_err(io_err("copy", src))?;
        self.publish_blob(tmp, d)?;
        Ok(d)
    }

    /// Moves a file that the caller wrote inside this store's `tmp/` into the CAS (no copy).
    /// Falls back to a copy when `src` is elsewhere.
    ///
    /// # Errors
    /// I/O errors hashing, syncing or renaming the file.
    pub fn ingest_file(&self, src: &Path) -> Result<Digest> {
        if !src.starts_with(self.root.join("tmp")) {
            return self.put_file(src);
        }
        let d = Digest::of_file(src).map_err(io_err("read", src))?;
        if self.has_blob(&d) {
            let _ = fs::remove_file(src);
            return Ok(d);
        }
        File::open(src)
            .and_then(|f| f.sync_all())
            .map_err(io_err("fsync", src))?;
        let dst = self.blob_path(&d);
        self.rename_into_place(src, &dst)?;
        Ok(d)
    }

    fn publish_blob(&self, tmp: tempfile::NamedTempFile, d: Digest) -> Result<()> {
        tmp.as_file()
            .sync_all()
            .map_err(io_err("fsync", tmp.path()))?;
        let dst = self.blob_path(&d);
        let (_, tmp_path) = tmp.keep().map_err(|e| StoreError::Io {
            op: "keep temp file",
            path: e.file.path().to_path_buf(),
            source: e.error,
        })?;
        self.rename_into_place(&tmp_path, &dst)
    }

    fn rename_into_place(&self, src: &Path, dst: &Path) -> Result<()> {
        let parent = dst.parent().expect("blob path has a parent");
        fs::create_dir_all(parent).map_err(io_err("create directory", parent))?;
        // Blobs are immutable: make them read-only so an exported path can't be edited in place.
        if let Ok(meta) = fs::metadata(src) {
            let mut perm = meta.permissions();
            perm.set_readonly(true);
            let _ = fs::set_permissions(src, perm);
        }
        fs::rename(src, dst).map_err(io_err("rename into CAS", dst))?;
        sync_dir(parent);
        Ok(())
    }

    /// Reads a whole blob into memory.
    ///
    /// # Errors
    /// [`StoreError::MissingBlob`] if absent, I/O errors otherwise.
    pub fn read_blob(&self, d: &Digest) -> Result<Vec<u8>> {
        let p = self.blob_path(d);
        match fs::read(&p) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(StoreError::MissingBlob(*d)),
            Err(e) => Err(io_err("read", &p)(e)),
        }
    }

    /// Re-hashes a blob and reports whether its content still matches its name.
    ///
    /// # Errors
    /// I/O errors reading the blob.
    pub fn verify_blob(&self, d: &Digest) -> Result<bool> {
        let p = self.blob_path(d);
        Ok(Digest::of_file(&p).map_err(io_err("read", &p))? == *d)
    }

    /// Every blob digest present in the CAS (unordered).
    ///
    /// # Errors
    /// I/O errors listing directories.
    pub fn list_blobs(&self) -> Result<Vec<Digest>> {
        let mut out = Vec::new();
        let cas = self.root.join("cas");
        for shard in read_dir_sorted(&cas)? {
            if !shard.is_dir() {
                continue;
            }
            for f in read_dir_sorted(&shard)? {
                if let Some(d) = f
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.parse().ok())
                {
                    out.push(d);
                }
            }
        }
        Ok(out)
    }

    // ----- temp space ------------------------------------------------------------------

    /// A fresh directory under `tmp/` (removed on drop unless kept).
    ///
    /// # Errors
    /// I/O errors creating the directory.
    pub fn temp_dir(&self) -> Result<tempfile::TempDir> {
        let tmp = self.root.join("tmp");
        tempfile::Builder::new()
            .prefix(&format!("{}-", std::process::id()))
            .tempdir_in(&tmp)
            .map_err(io_err("create temp dir", &tmp))
    }

    fn temp_file(&self) -> Result<tempfile::NamedTempFile> {
        let tmp = self.root.join("tmp");
        tempfile::Builder::new()
            .prefix(&format!("{}-", std::process::id()))
            .tempfile_in(&tmp)
            .map_err(io_err("create temp file", &tmp))
    }

    /// Writes `bytes` to `path` atomically: temp file in `tmp/`, fsync, rename, fsync dir.
    /// A reader sees either the old file or the complete new one.
    ///
    /// # Errors
    /// I/O errors at any step.
    pub fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        let parent = path.parent().expect("target has a parent directory");
        fs::create_dir_all(parent).map_err(io_err("create directory", parent))?;
        let tmp = self.temp_file()?;
        tmp.as_file()
            .write_all(bytes)
            .and_then(|_| tmp.as_file().sync_all())
            .map_err(io_err("write", tmp.path()))?;
        tmp.persist(path).map_err(|e| StoreError::Io {
            op: "rename",
            path: path.to_path_buf(),
            source: e.error,
        })?;
        sync_dir(parent);
        Ok(())
    }

    // ----- action cache ----------------------------------------------------------------

    /// Path of the manifest for (`node`, `key`).
    pub fn action_path(&self, node: &str, key: &str) -> PathBuf {
        self.root.join("ac").join(node).join(format!("{key}.json"))
    }

    /// Reads the manifest bytes for (`node`, `key`), `None` if absent.
    ///
    /// # Errors
    /// Invalid names, or I/O errors other than "not found".
    pub fn read_action(&self, node: &str, key: &str) -> Result<Option<Vec<u8>>> {
        validate_name("node", node)?;
        validate_name("key", key)?;
        let p = self.action_path(node, key);
        match fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("read", &p)(e)),
        }
    }

    /// Publishes a manifest atomically. Call this last, after every blob it names is in the CAS.
    ///
    /// # Errors
    /// Invalid names or I/O errors.
    pub fn write_action(&self, node: &str, key: &str, bytes: &[u8]) -> Result<()> {
        validate_name("node", node)?;
        validate_name("key", key)?;
        self.write_atomic(&self.action_path(node, key), bytes)
    }

    /// Deletes one manifest (missing is fine).
    ///
    /// # Errors
    /// I/O errors other than "not found".
    pub fn remove_action(&self, node: &str, key: &str) -> Result<()> {
        let p = self.action_path(node, key);
        match fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove", &p)(e)),
        }
    }

    /// Lists manifests, for one node or all nodes, newest first.
    ///
    /// # Errors
    /// I/O errors listing directories.
    pub fn list_actions(&self, node: Option<&str>) -> Result<Vec<ActionEntry>> {
        let ac = self.root.join("ac");
        let nodes: Vec<PathBuf> = match node {
            Some(n) => vec![ac.join(n)],
            None => read_dir_sorted(&ac)?,
        };
        let mut out = Vec::new();
        for nd in nodes {
            if !nd.is_dir() {
                continue;
            }
            let node_name = nd
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_string();
            for f in read_dir_sorted(&nd)? {
                let Some(stem) = f
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(".json"))
                else {
                    continue;
                };
                let modified = fs::metadata(&f)
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                out.push(ActionEntry {
                    node: node_name.clone(),
                    key: stem.to_string(),
                    path: f.clone(),
                    modified,
                });
            }
        }
        out.sort_by(|a, b| b.modified.cmp(&a.modified).then(a.key.cmp(&b.key)));
        Ok(out)
    }

    // ----- locks -----------------------------------------------------------------------

    /// Takes the exclusive lock of `node`, blocking while another process holds it.
    /// `on_wait` is called once if the lock is busy, before blocking (to tell the user).
    ///
    /// # Errors
    /// Invalid name or I/O errors on the lock file.
    pub fn lock_node(&self, node: &str, on_wait: impl FnOnce()) -> Result<NodeLock> {
        validate_name("node", node)?;
        let file = self.lock_file(&format!("node-{node}.lock"))?;
        let p = self.root.join("locks").join(format!("node-{node}.lock"));
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                on_wait();
                file.lock().map_err(io_err("lock", &p))?;
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_err("lock", &p)(e)),
        }
        Ok(NodeLock { _file: file })
    }

    /// A shared hold on the gc lock: every process that writes to the store holds one, so
    /// `gc` (which needs it exclusively) never deletes blobs of a run in flight.
    ///
    /// # Errors
    /// I/O errors on the lock file.
    pub fn gc_guard_shared(&self) -> Result<GcGuard> {
        let file = self.lock_file("gc.lock")?;
        let p = self.root.join("locks/gc.lock");
        file.lock_shared().map_err(io_err("lock", &p))?;
        Ok(GcGuard { _file: file })
    }

    /// The exclusive hold on the gc lock; blocks until no run holds it shared.
    ///
    /// # Errors
    /// I/O errors on the lock file.
    pub fn gc_guard_exclusive(&self) -> Result<GcGuard> {
        let file = self.lock_file("gc.lock")?;
        let p = self.root.join("locks/gc.lock");
        file.lock().map_err(io_err("lock", &p))?;
        Ok(GcGuard { _file: file })
    }

    /// An exclusive lock on an arbitrary named resource (e.g. the lock file), released on drop.
    ///
    /// # Errors
    /// Invalid name or I/O errors.
    pub fn lock_named(&self, name: &str) -> Result<NodeLock> {
        validate_name("lock", name)?;
        let file = self.lock_file(&format!("{name}.lock"))?;
        let p = self.root.join("locks").join(format!("{name}.lock"));
        file.lock().map_err(io_err("lock", &p))?;
        Ok(NodeLock { _file: file })
    }

    fn lock_file(&self, name: &str) -> Result<File> {
        let p = self.root.join("locks").join(name);
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .read(true)
            .open(&p)
            .map_err(io_err("open lock", &p))
    }

    // ----- memo and logs ---------------------------------------------------------------

    /// The row-level memo for one namespace (e.g. `validate-v1`).
    ///
    /// # Errors
    /// Invalid namespace name or I/O errors creating its directory.
    pub fn memo(&self, namespace: &str) -> Result<Memo> {
        validate_name("memo namespace", namespace)?;
        Memo::open(
            self.clone(),
            self.root.join("memo").join(namespace),
            namespace,
        )
    }

    /// Creates the event log `runs/<run_id>.jsonl`.
    ///
    /// # Errors
    /// Invalid name or I/O errors.
    pub fn run_log(&self, run_id: &str) -> Result<RunLog> {
        validate_name("run id", run_id)?;
        let path = self.root.join("runs").join(format!("{run_id}.jsonl"));
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err("create", &path))?;
        Ok(RunLog {
            path,
            file: std::sync::Mutex::new(file),
        })
    }

    // ----- gc --------------------------------------------------------------------------

    /// Deletes manifests not in `keep_actions` (pairs of node and key), blobs not in
    /// `keep_blobs`, and everything in `tmp/`; with `dry_run`, deletes nothing and reports what
    /// it would delete. Call it while holding [`Store::gc_guard_exclusive`], so no run is
    /// writing.
    ///
    /// # Errors
    /// I/O errors listing or deleting.
    pub fn gc(
        &self,
        keep_actions: &HashSet<(String, String)>,
        keep_blobs: &HashSet<Digest>,
        dry_run: bool,
    ) -> Result<GcReport> {
        let remove = |p: &Path, dir: bool| -> Result<()> {
            if dry_run {
                return Ok(());
            }
            let r = if dir {
                fs::remove_dir_all(p)
            } else {
                fs::remove_file(p)
            };
            r.map_err(io_err("remove", p))
        };
        let mut report = GcReport::default();
        for a in self.list_actions(None)? {
            if !keep_actions.contains(&(a.node.clone(), a.key.clone())) {
                remove(&a.path, false)?;
                report.actions_removed += 1;
                report.manifests.push(format!("{}/{}", a.node, a.key));
            }
        }
        report.manifests.sort();
        for d in self.list_blobs()? {
            if !keep_blobs.contains(&d) {
                let p = self.blob_path(&d);
                let len = fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
                remove(&p, false)?;
                report.blobs_removed += 1;
                report.bytes_freed += len;
            }
        }
        let tmp = self.root.join("tmp");
        for e in read_dir_sorted(&tmp)? {
            remove(&e, e.is_dir())?;
            report.tmp_removed += 1;
        }
        Ok(report)
    }
}

pub(crate) fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list", dir)(e)),
    };
    let mut v: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    v.sort();
    Ok(v)
}

/// fsyncs a directory so a rename inside it is durable (best effort: some filesystems refuse).
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(f) = File::open(dir) {
        let _ = f.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_and_read_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let d = s.put_bytes(b"hello").unwrap();
        assert_eq!(d, Digest::of_bytes(b"hello"));
        assert_eq!(s.read_blob(&d).unwrap(), b"hello");
        assert!(s.verify_blob(&d).unwrap());
        // idempotent
        assert_eq!(s.put_bytes(b"hello").unwrap(), d);
        assert_eq!(s.list_blobs().unwrap(), vec![d]);
        // read-only blob
        assert!(
            fs::metadata(s.blob_path(&d))
                .unwrap()
                .permissions()
                .readonly()
        );
        let missing = Digest::of_bytes(b"nope");
        assert!(matches!(
            s.read_blob(&missing),
            Err(StoreError::MissingBlob(_))
        ));
    }

    #[test]
    fn ingest_moves_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let t = s.temp_dir().unwrap();
        let f = t.path().join("out.bin");
        fs::write(&f, b"data").unwrap();
        let d = s.ingest_file(&f).unwrap();
        assert!(!f.exists());
        assert_eq!(s.read_blob(&d).unwrap(), b"data");
    }

    #[test]
    fn actions_round_trip_and_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        assert!(s.read_action("n1", "k1").unwrap().is_none());
        s.write_action("n1", "k1", b"{}").unwrap();
        assert_eq!(s.read_action("n1", "k1").unwrap().unwrap(), b"{}");
        let l = s.list_actions(Some("n1")).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].key, "k1");
        assert!(s.write_action("../evil", "k", b"").is_err());
        assert!(s.read_action("n1", "a/b").is_err());
    }

    #[test]
    fn gc_keeps_only_what_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let keep = s.put_bytes(b"keep").unwrap();
        let drop = s.put_bytes(b"drop").unwrap();
        s.write_action("n", "k1", b"1").unwrap();
        s.write_action("n", "k2", b"2").unwrap();
        let t = s.temp_dir().unwrap().keep();
        fs::write(t.join("junk"), b"x").unwrap();
        let _g = s.gc_guard_exclusive().unwrap();
        let keep_actions = [("n".to_string(), "k1".to_string())].into_iter().collect();
        let keep_blobs = [keep].into_iter().collect();
        // A dry run reports the same and deletes nothing.
        let dry = s.gc(&keep_actions, &keep_blobs, true).unwrap();
        assert!(s.has_blob(&drop) && s.read_action("n", "k2").unwrap().is_some());
        assert!(t.join("junk").exists());
        let r = s.gc(&keep_actions, &keep_blobs, false).unwrap();
        assert_eq!(dry, r);
        assert_eq!(r.manifests, ["n/k2"]);
        assert_eq!(r.actions_removed, 1);
        assert_eq!(r.blobs_removed, 1);
        assert_eq!(r.tmp_removed, 1);
        assert!(s.has_blob(&keep));
        assert!(!s.has_blob(&drop));
        assert!(s.read_action("n", "k1").unwrap().is_some());
        assert!(s.read_action("n", "k2").unwrap().is_none());
    }

    #[test]
    fn node_lock_is_exclusive_across_handles() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let held = s.lock_node("n", || {}).unwrap();
        let s2 = s.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            let mut waited = false;
            let _l = s2.lock_node("n", || waited = true).unwrap();
            tx.send(waited).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(rx.try_recv().is_err(), "second locker must block");
        drop(held);
        assert!(rx.recv().unwrap(), "second locker saw the lock busy");
        h.join().unwrap();
    }
}
