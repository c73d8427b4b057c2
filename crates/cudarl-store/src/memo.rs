//! Row-level memo: per-row results keyed by a row key, so a stage that processes items
//! independently redoes only new or changed rows (DESIGN.md section 2).

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
}

impl Memo {
    pub(crate) fn open(store: Store, dir: PathBuf) -> Result<Memo> {
        fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
        Ok(Memo { store, dir })
    }

    /// Directory of this namespace.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &Digest) -> PathBuf {
        let hex = key.to_hex();
        self.dir.join(&hex[..2]).join(hex)
    }

    /// The stored value for `key`, if any.
    ///
    /// # Errors
    /// I/O errors other than "not found".
    pub fn get(&self, key: &Digest) -> Result<Option<Vec<u8>>> {
        let p = self.path(key);
        match fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("read", &p)(e)),
        }
    }

    /// Whether `key` has a value.
    pub fn contains(&self, key: &Digest) -> bool {
        self.path(key).is_file()
    }

    /// Stores `value` under `key` unless the key already has a value. Returns `true` if this
    /// call wrote the entry. Publication is atomic (temp file, fsync, hard link without clobber).
    ///
    /// # Errors
    /// I/O errors writing the entry.
    pub fn put(&self, key: &Digest, value: &[u8]) -> Result<bool> {
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
}
