//! An RL run's saved progress (docs/architecture.md, "Resuming"): every `checkpoint_every`
//! steps and at its last step a run writes its whole state into the store's memo namespace
//! `rl-train-progress`, under a key made of the node's cache key without [`LENGTH_PARAMS`] and
//! the step. A run finds the latest saved step at or below its own `steps` and continues from
//! there, so a killed run loses at most `checkpoint_every - 1` steps and a run with more
//! `steps` continues a shorter one. Only the latest entry of a run is kept.
//!
//! One entry is a directory, renamed into place whole ([`cudarl_store::Memo::put_dir`]):
//!
//! | path | what |
//! |---|---|
//! | `trainer/` | the trainer's `save_state`: per agent one file with its float32 weights, AdamW moments and step counts, PPO's critics likewise, PPO-ptx positions |
//! | `stage.json` | the step, the task-draw and sampling seeds, the curriculum, the metrics rows |
//! | `turns/<first>-<last>.json` | the turns of steps `first..=last`, one file per save (earlier files are hard links of the previous entry's) |

use std::path::{Path, PathBuf};

use cudarl_store::{Digest, Memo};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::RlError;

/// The memo namespace of the entries.
pub const NAMESPACE: &str = "rl-train-progress";

/// Params that only say how long a run is or how often it saves: runs differing only in these
/// share their progress.
pub const LENGTH_PARAMS: [&str; 2] = ["steps", "checkpoint_every"];

/// The saved progress of one run (its params without [`LENGTH_PARAMS`]).
pub struct Progress {
    memo: Memo,
    run: String,
}

/// A saved step found for resuming.
pub struct Saved {
    /// The last step it holds.
    pub step: usize,
    /// Its directory.
    pub dir: PathBuf,
}

fn failed(what: &str, path: &Path, e: impl std::fmt::Display) -> RlError {
    RlError::Failed(format!("{what} {}: {e}", path.display()))
}

impl Progress {
    /// The saved progress of the run `run` (the node's cache key without [`LENGTH_PARAMS`]) in
    /// `memo` (the store's [`NAMESPACE`] namespace).
    pub fn new(memo: Memo, run: String) -> Progress {
        Progress { memo, run }
    }

    fn key(&self, step: usize) -> Digest {
        Digest::of_bytes(format!("{}/{step}", self.run).as_bytes())
    }

    /// The latest saved step at or below `steps`.
    pub fn latest(&self, steps: usize) -> Option<Saved> {
        (1..=steps).rev().find_map(|step| {
            self.memo
                .dir_entry(&self.key(step))
                .map(|dir| Saved { step, dir })
        })
    }

    /// Publishes `dir` (a store temp directory the caller filled with `trainer/`) as the entry
    /// of `step`: writes `stage.json`, links the turn files of `previous` and writes
    /// `new_turns` as `turns/<first>-<step>.json`, renames it into place, then deletes the
    /// run's earlier entries. Returns the entry's directory.
    ///
    /// # Errors
    /// I/O errors (named); the store is left with the earlier entry when one occurs.
    pub fn save<S: Serialize, T: Serialize>(
        &self,
        step: usize,
        dir: &Path,
        stage: &S,
        (first, new_turns): (usize, &[T]),
        previous: Option<&Path>,
    ) -> Result<PathBuf, RlError> {
        write_json(&dir.join("stage.json"), stage)?;
        let turns = dir.join("turns");
        std::fs::create_dir_all(&turns).map_err(|e| failed("create", &turns, e))?;
        if let Some(prev) = previous {
            for f in turn_files(&prev.join("turns"))? {
                let to = turns.join(f.file_name().expect("a file"));
                std::fs::hard_link(&f, &to).map_err(|e| failed("link", &to, e))?;
            }
        }
        if first <= step {
            write_json(
                &turns.join(format!("{first:06}-{step:06}.json")),
                &new_turns,
            )?;
        }
        let key = self.key(step);
        self.memo.put_dir(&key, dir)?;
        for s in 1..step {
            self.memo.remove(&self.key(s))?;
        }
        self.memo
            .dir_entry(&key)
            .ok_or_else(|| failed("no entry after saving", dir, step))
    }
}

/// The turn files of an entry, in step order.
fn turn_files(dir: &Path) -> Result<Vec<PathBuf>, RlError> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| failed("list", dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    Ok(v)
}

fn write_json<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<(), RlError> {
    let f = std::fs::File::create(path).map_err(|e| failed("create", path, e))?;
    let mut w = std::io::BufWriter::new(f);
    serde_json::to_writer(&mut w, value).map_err(|e| failed("write", path, e))?;
    std::io::Write::flush(&mut w).map_err(|e| failed("write", path, e))
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, RlError> {
    let f = std::fs::File::open(path).map_err(|e| failed("read", path, e))?;
    serde_json::from_reader(std::io::BufReader::new(f)).map_err(|e| failed("parse", path, e))
}

impl Saved {
    /// Its `stage.json`.
    ///
    /// # Errors
    /// A missing or unparsable file (named).
    pub fn stage<S: DeserializeOwned>(&self) -> Result<S, RlError> {
        read_json(&self.dir.join("stage.json"))
    }

    /// Every turn it holds, in step order.
    ///
    /// # Errors
    /// A missing or unparsable file (named).
    pub fn turns<T: DeserializeOwned>(&self) -> Result<Vec<T>, RlError> {
        let mut all = Vec::new();
        for f in turn_files(&self.dir.join("turns"))? {
            all.extend(read_json::<Vec<T>>(&f)?);
        }
        Ok(all)
    }
}
