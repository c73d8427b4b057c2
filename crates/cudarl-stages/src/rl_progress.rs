//! `rl-train`'s saving and resuming ([`cudarl_rl::progress`] holds the entries and their
//! layout): when to save, what was saved last, and the seconds spent saving.

use std::path::PathBuf;
use std::time::Instant;

use cudarl_core::{StageContext, StageError};
use cudarl_rl::progress::{LENGTH_PARAMS, NAMESPACE, Progress};
use cudarl_rl::trainer::TrainerClient;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::common::rl_err;

/// The progress of the run `ctx` executes; `None` for a context without a cache key (built by
/// hand, outside the engine).
///
/// # Errors
/// The memo namespace cannot be opened.
fn open_progress(ctx: &StageContext<'_>) -> Result<Option<Progress>, StageError> {
    let Some(run) = ctx.key_without(&LENGTH_PARAMS) else {
        return Ok(None);
    };
    Ok(Some(Progress::new(ctx.memo(NAMESPACE)?, run)))
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
            _ => open_progress(ctx)?,
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
        let (stage, turns): (S, Vec<T>) = (
            saved.stage().map_err(rl_err)?,
            saved.turns().map_err(rl_err)?,
        );
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
        let dir = pr
            .save(
                step,
                tmp.path(),
                stage,
                (prev_step + 1, &turns[from..]),
                prev_dir,
            )
            .map_err(rl_err)?;
        self.last = Some((step, dir, turns.len()));
        self.seconds += t0.elapsed().as_secs_f64();
        cudarl_core::fault_point(ctx.node(), "after-checkpoint");
        Ok(())
    }
}
