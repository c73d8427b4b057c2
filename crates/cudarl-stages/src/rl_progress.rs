//! `rl-train`'s saved progress (docs/architecture.md, "Resuming"): every `checkpoint_every`
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
use std::time::Instant;

use cudarl_core::{Digest, Memo, StageContext, StageError};
use cudarl_rl::trainer::TrainerClient;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::common::rl_err;

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

fn failed(what: &str, path: &Path, e: impl std::fmt::Display) -> StageError {
    StageError::Failed(format!("{what} {}: {e}", path.display()))
}

impl Progress {
    /// The progress of the run `ctx` executes; `None` for a context without a cache key
    /// (built by hand, outside the engine).
    ///
    /// # Errors
    /// The memo namespace cannot be opened.
    pub fn open(ctx: &StageContext<'_>) -> Result<Option<Progress>, StageError> {
        let Some(run) = ctx.key_without(&LENGTH_PARAMS) else {
            return Ok(None);
        };
        Ok(Some(Progress {
            memo: ctx.memo(NAMESPACE)?,
            run,
        }))
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
    ) -> Result<PathBuf, StageError> {
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
fn turn_files(dir: &Path) -> Result<Vec<PathBuf>, StageError> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| failed("list", dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    Ok(v)
}

fn write_json<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<(), StageError> {
    let f = std::fs::File::create(path).map_err(|e| failed("create", path, e))?;
    let mut w = std::io::BufWriter::new(f);
    serde_json::to_writer(&mut w, value).map_err(|e| failed("write", path, e))?;
    std::io::Write::flush(&mut w).map_err(|e| failed("write", path, e))
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, StageError> {
    let f = std::fs::File::open(path).map_err(|e| failed("read", path, e))?;
    serde_json::from_reader(std::io::BufReader::new(f)).map_err(|e| failed("parse", path, e))
}

impl Saved {
    /// Its `stage.json`.
    ///
    /// # Errors
    /// A missing or unparsable file (named).
    pub fn stage<S: DeserializeOwned>(&self) -> Result<S, StageError> {
        read_json(&self.dir.join("stage.json"))
    }

    /// Every turn it holds, in step order.
    ///
    /// # Errors
    /// A missing or unparsable file (named).
    pub fn turns<T: DeserializeOwned>(&self) -> Result<Vec<T>, StageError> {
        let mut all = Vec::new();
        for f in turn_files(&self.dir.join("turns"))? {
            all.extend(read_json::<Vec<T>>(&f)?);
        }
        Ok(all)
    }
}

/// A run's saving and resuming as `rl-train` uses them: when to save, what was saved last (the
/// next entry links its turn files), and the seconds spent saving.
pub struct Checkpoints {
    progress: Option<Progress>,
    every: usize,
    /// (step, entry directory, turns it holds) of the last save or of the resumed entry.
    last: Option<(usize, PathBuf, usize)>,
    /// Wall seconds spent in saves (the trainer's `save_state` and the entry's files).
    pub seconds: f64,
}

impl Checkpoints {
    /// Saving every `every` steps (0: never, and nothing is resumed).
    ///
    /// # Errors
    /// The memo namespace cannot be opened.
    pub fn open(ctx: &StageContext<'_>, every: usize) -> Result<Checkpoints, StageError> {
        let progress = match every {
            0 => None,
            _ => Progress::open(ctx)?,
        };
        Ok(Checkpoints {
            progress,
            every,
            last: None,
            seconds: 0.0,
        })
    }

    /// Loads the latest saved step at or below `steps` into the trainer and returns the
    /// stage's state and turns, saying so to the user (`None`: nothing saved, start at step 1).
    ///
    /// # Errors
    /// A saved file that cannot be read (named), or the trainer refusing its state.
    pub fn resume<S: DeserializeOwned, T: DeserializeOwned>(
        &mut self,
        ctx: &mut StageContext<'_>,
        tc: &mut TrainerClient,
        steps: usize,
    ) -> Result<Option<(S, Vec<T>)>, StageError> {
        let Some(saved) = self.progress.as_ref().and_then(|p| p.latest(steps)) else {
            return Ok(None);
        };
        tc.load_state(&saved.dir.join("trainer")).map_err(rl_err)?;
        let (stage, turns): (S, Vec<T>) = (saved.stage()?, saved.turns()?);
        ctx.stat("resumed_from_step", saved.step);
        ctx.note(&format!(
            "resuming from saved step {} of {steps}",
            saved.step
        ));
        self.last = Some((saved.step, saved.dir, turns.len()));
        Ok(Some((stage, turns)))
    }

    /// After `step` of a run of `steps`: saves the trainer's and the stage's state when `step`
    /// is a multiple of `every` or the last one, or when a stop was requested
    /// ([`cudarl_core::interrupt`]), which then ends the stage.
    ///
    /// # Errors
    /// The trainer's or the store's errors (named); [`StageError::Interrupted`] after the save
    /// when a stop was requested and steps remain.
    pub fn after_step<S: Serialize, T: Serialize>(
        &mut self,
        ctx: &StageContext<'_>,
        tc: &mut TrainerClient,
        (step, steps): (usize, usize),
        stage: &S,
        turns: &[T],
    ) -> Result<(), StageError> {
        let stop = cudarl_core::interrupt::requested() && step < steps;
        if self.progress.is_some() && (stop || step % self.every == 0 || step == steps) {
            self.save(ctx, tc, step, stage, turns)?;
        }
        if stop {
            return Err(StageError::Interrupted(match &self.progress {
                Some(_) => format!(
                    "stopped after step {step} of {steps}; its progress is saved and a rerun continues from there"
                ),
                None => format!(
                    "stopped after step {step} of {steps}; nothing saved (checkpoint_every = 0)"
                ),
            }));
        }
        Ok(())
    }

    /// Saves the trainer's and the stage's state after `step` as the run's latest entry.
    fn save<S: Serialize, T: Serialize>(
        &mut self,
        ctx: &StageContext<'_>,
        tc: &mut TrainerClient,
        step: usize,
        stage: &S,
        turns: &[T],
    ) -> Result<(), StageError> {
        let Some(pr) = &self.progress else {
            return Ok(());
        };
        let t0 = Instant::now();
        let (prev_step, prev_dir, from) = match &self.last {
            Some((s, d, n)) => (*s, Some(d.as_path()), *n),
            None => (0, None, 0),
        };
        let tmp = ctx.store().temp_dir()?;
        tc.save_state(&tmp.path().join("trainer")).map_err(rl_err)?;
        let dir = pr.save(
            step,
            tmp.path(),
            stage,
            (prev_step + 1, &turns[from..]),
            prev_dir,
        )?;
        self.last = Some((step, dir, turns.len()));
        self.seconds += t0.elapsed().as_secs_f64();
        cudarl_core::fault_point(ctx.node(), "after-checkpoint");
        Ok(())
    }
}
