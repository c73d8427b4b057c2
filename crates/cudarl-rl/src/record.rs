//! What an RL run keeps of each step: its `metrics` row ([`metrics_row`]), its turns
//! ([`StepTurn`], the `turns` table and the plots), the run's state between steps
//! ([`RunState`], saved with the trainer's for a resume), and the training plots
//! ([`training_plots`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cudarl_data::plot::{PlotError, Series, line_chart};
use cudarl_protocol::Algorithm;
use cudarl_tables::rl::RlMetricsRow;
use cudarl_tables::turns::RlTurnRow;
use serde::{Deserialize, Serialize};

use crate::episode::{Episode, Turn};
use crate::harness::HarnessUse;
use crate::params::Params;
use crate::step::{Curriculum, EpisodeStats, Gate, StepUpdate};

/// What a step measured, for its [`RlMetricsRow`] ([`metrics_row`]).
pub struct StepRecord<'a> {
    /// The step (from 1).
    pub step: usize,
    /// The highest open tier.
    pub tier: i64,
    /// The step's episodes.
    pub episodes: &'a [Episode],
    /// What the update did.
    pub update: &'a StepUpdate,
    /// What the harness did (candidates, seconds by phase).
    pub harness: HarnessUse,
    /// Seconds the trainer spent generating.
    pub gen_seconds: f64,
}

/// The `metrics` row of step record `r` under `p`, in `mode` (`full` or `compile-only`) on
/// `device`; the control columns are left empty (the caller fills them when `control` ran).
pub fn metrics_row(
    r: &StepRecord<'_>,
    p: &Params,
    mode: &'static str,
    device: &'static str,
) -> RlMetricsRow {
    let e = EpisodeStats::of(r.episodes);
    let (g, o) = (&r.update.generator, &r.update.optimizer);
    let cands = r.harness.candidates.max(1) as f64;
    let ppo = p.algorithm == Algorithm::Ppo;
    let ptx = p.ptx().is_some();
    let cap = p.aux_grad_cap().is_some();
    RlMetricsRow {
        step: r.step as i64,
        tier: r.tier,
        episodes: r.episodes.len() as i64,
        mean_reward: e.mean_reward,
        reward_std: e.reward_std,
        compile_rate: e.compile_rate,
        pass_rate: e.pass_rate,
        first_turn_compile_rate: e.first_turn_compile_rate,
        speedup: e.speedup,
        turns_used: e.turns_used,
        kl: g.kl,
        entropy: g.entropy,
        optimizer_kl: o.kl,
        gen_seconds: r.gen_seconds,
        harness_seconds: r.harness.seconds,
        update_seconds: r.update.seconds,
        harness_ms_per_candidate: 1000.0 * r.harness.seconds / cands,
        compile_overlap: r.harness.prefetch_hits as f64 / cands,
        harness_compile_seconds: r.harness.phases.compile,
        harness_gpu_seconds: r.harness.phases.gpu,
        harness_sass_seconds: r.harness.phases.sass,
        verdict_reuse: r.harness.reused as f64 / cands,
        signal_groups: r.update.signal_groups,
        optimizer_signal_groups: r.update.optimizer_signal_groups,
        value_loss: ppo.then_some(g.value_loss),
        optimizer_value_loss: ppo.then_some(o.value_loss),
        max_approx_kl: g.max_approx_kl,
        optimizer_max_approx_kl: o.max_approx_kl,
        max_ref_log_ratio: g.max_ref_log_ratio,
        optimizer_max_ref_log_ratio: o.max_ref_log_ratio,
        aux_scale: cap.then_some(g.aux_scale),
        optimizer_aux_scale: cap.then_some(o.aux_scale),
        max_aux_grad_ratio: cap.then_some(g.max_aux_grad_ratio),
        optimizer_max_aux_grad_ratio: cap.then_some(o.max_aux_grad_ratio),
        skipped_minibatches: g.skipped_minibatches as i64,
        optimizer_skipped_minibatches: o.skipped_minibatches as i64,
        update_steps: g.steps as i64,
        optimizer_update_steps: o.steps as i64,
        ptx_loss: ptx.then_some(g.ptx_loss),
        optimizer_ptx_loss: ptx.then_some(o.ptx_loss),
        algorithm: p.algorithm.as_str().to_string(),
        reward_by_tier_json: e.reward_by_tier_json,
        mode: mode.to_string(),
        device: device.to_string(),
        ..Default::default()
    }
}

/// A turn of a step, kept for the `turns` table and the plots (saved with a run's progress).
#[derive(Debug, Serialize, Deserialize)]
pub struct StepTurn {
    /// The step (from 1).
    pub step: usize,
    /// The episode's index in its step.
    pub episode: usize,
    /// The family or problem.
    pub task_id: String,
    /// Its tier.
    pub tier: i64,
    /// The turn's advantage in the update (0 when not trained).
    pub advantage: f64,
    /// The turn, without its prompt.
    pub turn: Turn,
}

impl StepTurn {
    /// This turn as a row of `rl-train`'s `turns`.
    pub fn row(&self) -> RlTurnRow {
        RlTurnRow {
            step: self.step as i64,
            episode: self.episode as i64,
            turn: self.turn.columns(&self.task_id, self.tier, self.advantage),
        }
    }
}

/// The turns of step `step`'s episodes `eps`, each with its advantage in `up` and without its
/// prompt (the `turns` table does not keep it).
pub fn step_turns(step: usize, eps: &[Episode], up: &StepUpdate) -> Vec<StepTurn> {
    let mut out = Vec::new();
    for (ei, e) in eps.iter().enumerate() {
        out.extend(e.turns.iter().map(|t| StepTurn {
            step,
            episode: ei,
            task_id: e.task_id.clone(),
            tier: e.tier,
            advantage: up.advantages.get(&(ei, t.turn)).copied().unwrap_or(0.0),
            turn: Turn {
                prompt: Vec::new(),
                ..t.clone()
            },
        }));
    }
    out
}

/// An RL run's state between steps, saved with the trainer's state: enough for step `step + 1`
/// to run as it would have in the straight run.
#[derive(Debug, Serialize, Deserialize)]
pub struct RunState {
    /// The last step done.
    pub step: usize,
    /// The task draw's SplitMix64 state.
    pub rng: u64,
    /// The next sampling seed.
    pub seed: i64,
    /// The curriculum gate and the tiers it opened.
    pub curriculum: Curriculum,
    /// The `metrics` rows so far.
    pub rows: Vec<RlMetricsRow>,
}

impl RunState {
    /// A run before its first step: the draw seeded from `p.seed`, sampling from `seed`, the
    /// curriculum gate of `p` over the tiers of the tasks it draws from (`tiers`).
    pub fn new(p: &Params, tiers: impl Iterator<Item = i64> + Clone, seed: i64) -> RunState {
        let gate = Gate {
            window: p.gate_window,
            min_compile_rate: p.min_compile_rate,
            min_pass_rate: p.min_pass_rate,
        };
        let (lo, hi) = (tiers.clone().min(), tiers.max());
        RunState {
            step: 0,
            rng: p.seed ^ 0x005E_ED0F_C0DA,
            seed,
            curriculum: Curriculum::new(gate, lo.unwrap_or(0), hi.unwrap_or(0)),
            rows: Vec::new(),
        }
    }
}

/// `reward_curve.png` (mean final reward per step with a +-1 std band as two lines) and
/// `rates.png` (best-turn compile and pass rates per step and tier) under `dir`, from a run's
/// `rows` and `turns`, titled with its `mode` and `device`.
///
/// # Errors
/// A chart cannot be drawn or written.
pub fn training_plots(
    rows: &[RlMetricsRow],
    turns: &[StepTurn],
    mode: &str,
    device: &str,
    dir: &Path,
) -> Result<(), PlotError> {
    let pts = |f: &dyn Fn(&RlMetricsRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter().map(|r| (r.step as f64, f(r))).collect()
    };
    line_chart(
        &dir.join("reward_curve.png"),
        &format!("rl-train: mean episode reward per step ({mode}, {device})"),
        "RL step",
        "final reward",
        &[
            Series::new("mean", pts(&|r| r.mean_reward)),
            Series::new("mean + std", pts(&|r| r.mean_reward + r.reward_std)),
            Series::new("mean - std", pts(&|r| r.mean_reward - r.reward_std)),
        ],
    )?;
    // Per tier: best-turn compile and pass rates of that tier's episodes per step.
    let mut per: BTreeMap<(i64, usize), (f64, f64, f64, bool)> = BTreeMap::new();
    let mut best: BTreeMap<(usize, usize), &StepTurn> = BTreeMap::new();
    for r in turns {
        let e = best.entry((r.step, r.episode)).or_insert(r);
        if r.turn.reward.reward > e.turn.reward.reward {
            *e = r;
        }
    }
    for r in best.values() {
        let e = per.entry((r.tier, r.step)).or_default();
        e.0 += 1.0;
        e.1 += f64::from(u8::from(r.turn.reward.compiled));
        e.2 += f64::from(u8::from(r.turn.reward.correct == Some(true)));
        e.3 |= r.turn.reward.mode == "full";
    }
    let tiers: BTreeSet<i64> = per.keys().map(|k| k.0).collect();
    let mut series = Vec::new();
    for tier in tiers {
        let of = |k: usize| -> Vec<(f64, f64)> {
            per.iter()
                .filter(|((t, _), v)| *t == tier && (k == 1 || v.3))
                .map(|((_, s), v)| (*s as f64, if k == 1 { v.1 / v.0 } else { v.2 / v.0 }))
                .collect()
        };
        series.push(Series::new(format!("tier {tier} compile rate"), of(1)));
        let pass = of(2);
        if !pass.is_empty() {
            series.push(Series::new(format!("tier {tier} pass rate"), pass));
        }
    }
    line_chart(
        &dir.join("rates.png"),
        &format!("rl-train: compile and pass rates per tier, best turn ({mode})"),
        "RL step",
        "rate",
        &series,
    )
}
