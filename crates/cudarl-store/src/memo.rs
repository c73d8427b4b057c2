//! Row-level memo: per-row results keyed by a row key, so a stage that processes items
//! independently redoes only new or changed rows (docs/architecture.md, "Stages, keys and the
//! store").

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::{Digest, Result, Store, io_err, sync_dir};

/// One memo namespace (`memo/<namespace>/`). Entries are immutable: the first writer of a key
/// wins and later writers of the same key are no-ops, so concurrent or sharded workers never
/// write an entry twice.
#[derive(Debug, Clone)]
pub struct Memo {
    store: Store,
    dir: PathBuf,
    namespace: String,
}

impl Memo {
    pub(crate) fn open(store: Store, dir: PathBuf, namespace: &str) -> Result<Memo> {
        fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
        Ok(Memo {
            store,
            dir,
            namespace: namespace.to_string(),
        })
    }

    /// Path of `key`'s entry in the shared cache.
    fn shared_path(&self, key: &Digest) -> String {
        let hex = key.to_hex();
        format!("memo/{}/{}/{hex}", self.namespace, &hex[..2])
    }

    /// Directory of this namespace.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &Digest) -> PathBuf {
        let hex = key.to_hex();
        self.dir.join(&hex[..2]).join(hex)
    }

    /// The stored value for `key`, if any: the local entry, else the shared cache's (which is
    /// then copied into the local memo).
    ///
    /// # Errors
    /// I/O errors other than "not found"; shared cache errors.
    pub fn get(&self, key: &Digest) -> Result<Option<Vec<u8>>> {
        let p = self.path(key);
        match fs::read(&p) {
            Ok(b) => {
                // A row computed here before the shared cache was attached is published to it,
                // so the machine that merges finds it.
                if let Some(shared) = self.store.shared() {
                    let sp = self.shared_path(key);
                    if !shared.contains(&sp)? {
                        shared.put_new(&sp, &b)?;
                    }
                }
                return Ok(Some(b));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("read", &p)(e)),
        }
        let Some(shared) = self.store.shared() else {
            return Ok(None);
        };
        let v = shared.get(&self.shared_path(key))?;
        if let Some(b) = &v {
            self.put_local(key, b)?;
        }
        Ok(v)
    }

    /// Whether `key` has a value, locally or in the shared cache (a shared cache that cannot
    /// be reached counts as "no").
    pub fn contains(&self, key: &Digest) -> bool {
        self.path(key).is_file()
            || self
                .store
                .shared()
                .is_some_and(|s| s.contains(&self.shared_path(key)).unwrap_or(false))
    }

    /// Stores `value` under `key` unless the key already has a value. Returns `true` if this
    /// call wrote the entry (with a shared cache: if it wrote the shared entry, so exactly one
    /// of N racing machines gets `true`). Publication is atomic (temp file, fsync, hard link
    /// without clobber locally; a conditional create in the shared cache).
    ///
    /// # Errors
    /// I/O errors writing the entry; shared cache errors.
    pub fn put(&self, key: &Digest, value: &[u8]) -> Result<bool> {
        match self.store.shared() {
            // The shared entry decides; the local copy follows the winner (a loser's value is
            // never kept: `get` copies the shared one down).
            Some(shared) => {
                let wrote = shared.put_new(&self.shared_path(key), value)?;
                if wrote {
                    self.put_local(key, value)?;
                }
                Ok(wrote)
            }
            None => self.put_local(key, value),
        }
    }

    fn put_local(&self, key: &Digest, value: &[u8]) -> Result<bool> {
        let dst = self.path(key);
        if dst.is_file() {
            return Ok(false);
        }
        let parent = dst.parent().expect("memo path has parent");
        fs::create_dir_all(parent).map_err(io_err("create directory", parent))?;
        let tmp_root = self.store.root().join("tmp");
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!("{}-memo-", std::process::id()))
            .tempfile_in(&tmp_root)
            .map_err(io_err("create temp file", &tmp_root))?;
        tmp.write_all(value)
            .and_then(|_| tmp.as_file().sync_all())
            .map_err(io_err("write", tmp.path()))?;
        // hard_link fails if dst exists: first writer wins, never overwritten.
        let wrote = match fs::hard_link(tmp.path(), &dst) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(io_err("link", &dst)(e)),
        };
        sync_dir(parent);
        Ok(wrote)
    }

    /// Path of `key`'s directory entry, if it has one ([`Memo::put_dir`]).
    pub fn dir_entry(&self, key: &Digest) -> Option<PathBuf> {
        let p = self.path(key);
        p.is_dir().then_some(p)
    }

    /// Stores the directory `src` under `key` unless the key already has an entry, by renaming
    /// it into place (atomic: a reader sees the whole directory or nothing). `src` must be on
    /// the store's filesystem (a [`Store::temp_dir`] is); it is consumed when this returns
    /// `true` and left where it is otherwise. Directory entries are local to this store: a
    /// shared cache does not carry them (they hold training state of hundreds of MB).
    ///
    /// # Errors
    /// I/O errors creating the shard directory or renaming (other than "the key exists").
    pub fn put_dir(&self, key: &Digest, src: &Path) -> Result<bool> {
        let dst = self.path(key);
        if dst.exists() {
            return Ok(false);
        }
        let parent = dst.parent().expect("memo path has parent");
        fs::create_dir_all(parent).map_err(io_err("create directory", parent))?;
        sync_tree(src);
        // rename(2) onto an existing non-empty directory fails: the first writer wins.
        match fs::rename(src, &dst) {
            Ok(()) => {}
            Err(_) if dst.exists() => return Ok(false),
            Err(e) => return Err(io_err("rename into", &dst)(e)),
        }
        sync_dir(parent);
        Ok(true)
    }

    /// Deletes `key`'s entry, a value or a directory (absent: nothing to do).
    ///
    /// # Errors
    /// I/O errors deleting it.
    pub fn remove(&self, key: &Digest) -> Result<()> {
        let p = self.path(key);
        let r = if p.is_dir() {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        };
        match r {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", &p)(e)),
            _ => Ok(()),
        }
    }

    /// Number of entries in the namespace.
    ///
    /// # Errors
    /// I/O errors listing directories.
    pub fn len(&self) -> Result<usize> {
        let mut n = 0;
        for shard in crate::read_dir_sorted(&self.dir)? {
            n += crate::read_dir_sorted(&shard)?.len();
        }
        Ok(n)
    }

    /// Whether the namespace has no entries.
    ///
    /// # Errors
    /// I/O errors listing directories.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }
}

/// fsyncs every file under `dir` and the directories themselves (best effort), so a directory
/// renamed into place is durable.
fn sync_tree(dir: &Path) {
    for p in crate::read_dir_sorted(dir).unwrap_or_default() {
        if p.is_dir() {
            sync_tree(&p);
        } else if let Ok(f) = fs::File::open(&p) {
            let _ = f.sync_all();
        }
    }
    sync_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_writer_wins() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let m = s.memo("validate-v1").unwrap();
        let k = Digest::of_bytes(b"row");
        assert!(m.get(&k).unwrap().is_none());
        assert!(m.put(&k, b"first").unwrap());
        assert!(!m.put(&k, b"second").unwrap());
        assert_eq!(m.get(&k).unwrap().unwrap(), b"first");
        assert_eq!(m.len().unwrap(), 1);
        assert!(s.memo("bad/name").is_err());
    }

    #[test]
    fn a_directory_entry_is_renamed_into_place_once_and_can_be_removed() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let m = s.memo("progress").unwrap();
        let k = Digest::of_bytes(b"run/5");
        let make = |text: &str| {
            let t = s.temp_dir().unwrap().keep();
            fs::create_dir_all(t.join("sub")).unwrap();
            fs::write(t.join("sub/state.json"), text).unwrap();
            t
        };
        assert!(m.dir_entry(&k).is_none());
        let first = make("first");
        assert!(m.put_dir(&k, &first).unwrap());
        assert!(!first.exists(), "moved, not copied");
        let second = make("second");
        assert!(!m.put_dir(&k, &second).unwrap());
        assert!(second.exists(), "a loser's directory stays with its caller");
        let e = m.dir_entry(&k).unwrap();
        assert_eq!(
            fs::read_to_string(e.join("sub/state.json")).unwrap(),
            "first"
        );
        // A value entry is not a directory entry.
        let v = Digest::of_bytes(b"row");
        m.put(&v, b"x").unwrap();
        assert!(m.dir_entry(&v).is_none());
        m.remove(&k).unwrap();
        m.remove(&v).unwrap();
        m.remove(&k).unwrap();
        assert!(m.dir_entry(&k).is_none() && m.get(&v).unwrap().is_none());
    }

    #[test]
    fn two_stores_share_rows_through_the_shared_cache() {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("shared");
        let cache = crate::SharedCache::open(url.to_str().unwrap()).unwrap();
        let a = Store::open(dir.path().join("a"))
            .unwrap()
            .with_shared(cache.clone());
        let b = Store::open(dir.path().join("b"))
            .unwrap()
            .with_shared(cache);
        let (ma, mb) = (a.memo("ns").unwrap(), b.memo("ns").unwrap());
        let k = Digest::of_bytes(b"row");
        assert!(!mb.contains(&k));
        assert!(ma.put(&k, b"from a").unwrap());
        // b sees a's row, copies it locally, and cannot overwrite it.
        assert!(mb.contains(&k));
        assert!(!mb.put(&k, b"from b").unwrap());
        assert_eq!(mb.get(&k).unwrap().unwrap(), b"from a");
        assert_eq!(mb.len().unwrap(), 1);
        let hex = k.to_hex();
        assert_eq!(
            std::fs::read(url.join("memo/ns").join(&hex[..2]).join(&hex)).unwrap(),
            b"from a"
        );
    }
}
