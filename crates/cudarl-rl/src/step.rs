//! One RL step after its episodes ran: the GRPO groups (or PPO's GAE targets), the advantages,
//! one update per agent in the trainer, and the step's metrics; plus the curriculum gate and
//! the rates it reads.
//!
//! GRPO (Shao et al., arXiv:2402.03300): generator turns are grouped by task slot (the
//! `group_size` episodes of one drawn task), optimizer turns by task slot and turn; each group's
//! values (turn credits, or with [`GeneratorCredit::Own`] the generator's own turn rewards) are
//! normalized with a floor under the group's standard deviation ([`crate::credit::group_advantages`]).
//! PPO (Schulman et al., arXiv:1707.06347): GAE over each episode's turns with the critics'
//! values ([`ppo_targets`]), whitened per agent, the value targets sent with the samples.

use std::collections::BTreeMap;
use std::time::Instant;

use cudarl_protocol::{Algorithm, Role, Sample, UpdateStats};
use serde::{Deserialize, Serialize};

use crate::RlError;
use crate::credit::{
    CreditMode, CreditWeights, gae, group_advantages, improvement_advantages, signal_share,
};
use crate::episode::Episode;
use crate::stats::{geomean, mean_std, whiten};
use crate::trainer::TrainerClient;

/// What a generator turn is credited with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GeneratorCredit {
    /// The turn credit ([`crate::credit::turn_credits`]): by default its reward plus the
    /// discounted rewards of the optimizer's revisions after it.
    #[default]
    Episode,
    /// Its own turn's reward `r_0`: the tester's verdict on the kernel the generator wrote.
    Own,
}

/// How an update turns episodes into advantages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpdateSettings {
    /// GRPO or PPO.
    pub algorithm: Algorithm,
    /// Episodes per drawn task: consecutive episodes `group_size * k ..` share task slot `k`.
    pub group_size: usize,
    /// GRPO: floor under a group's reward standard deviation (0 = plain GRPO).
    pub std_floor: f64,
    /// GRPO: what a generator turn is credited with.
    pub generator_credit: GeneratorCredit,
    /// The turn credit's weights (PPO's per-turn rewards use them too).
    pub credit: CreditWeights,
    /// PPO: GAE's discount per turn.
    pub gamma: f64,
    /// PPO: GAE's lambda.
    pub gae_lambda: f64,
    /// GRPO: completions with advantage 0 stay out of the update.
    pub signal_only: bool,
}

/// What one step's update did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepUpdate {
    /// The advantage each (episode, turn) was trained with (0 for a turn without a kept
    /// completion is not listed).
    pub advantages: BTreeMap<(usize, usize), f64>,
    /// The generator's update.
    pub generator: UpdateStats,
    /// The optimizer's update.
    pub optimizer: UpdateStats,
    /// Share of the generator's GRPO groups whose values differ at all (the rest give no
    /// gradient).
    pub signal_groups: f64,
    /// The same for the optimizer.
    pub optimizer_signal_groups: f64,
    /// Wall seconds of both updates.
    pub seconds: f64,
}

/// One agent's turns of a step: (episode, turn, completion id), their values and GRPO groups.
#[derive(Debug, Default)]
struct AgentTurns {
    keys: Vec<(usize, usize, Option<u64>)>,
    values: Vec<f64>,
    groups: Vec<usize>,
    /// The reward of the kernel each turn was given (optimizer turns; 0 without one).
    baselines: Vec<f64>,
}

/// Updates both agents on `eps` (one step's episodes, in task-slot order).
///
/// # Errors
/// The trainer failed (its message).
pub fn update(
    tc: &mut TrainerClient,
    eps: &[Episode],
    s: &UpdateSettings,
) -> Result<StepUpdate, RlError> {
    let (mut gen_t, mut opt) = (AgentTurns::default(), AgentTurns::default());
    for (ei, e) in eps.iter().enumerate() {
        let slot = ei / s.group_size.max(1);
        for (i, t) in e.turns.iter().enumerate() {
            match t.role {
                Role::Generator => {
                    gen_t.keys.push((ei, t.turn, t.completion));
                    gen_t.values.push(match s.generator_credit {
                        GeneratorCredit::Own => t.reward.reward,
                        GeneratorCredit::Episode => t.credit,
                    });
                    gen_t.groups.push(slot);
                }
                Role::Optimizer => {
                    opt.keys.push((ei, t.turn, t.completion));
                    opt.values.push(t.credit);
                    opt.groups.push(slot * 64 + t.turn);
                    // The optimizer revises the last kernel submitted before its turn.
                    let given = e.turns[..i].iter().rev().find(|x| x.code.is_some());
                    opt.baselines.push(given.map_or(0.0, |x| x.reward.reward));
                }
            }
        }
    }
    let (gen_a, opt_a, gen_ret, opt_ret) = match s.algorithm {
        Algorithm::Ppo => {
            let t = ppo_targets(eps, &s.credit, s.gamma, s.gae_lambda);
            let by = |r: Role| -> (Vec<f64>, Vec<f64>) {
                eps.iter()
                    .zip(&t)
                    .flat_map(|(e, v)| e.turns.iter().zip(v).filter(move |(x, _)| x.role == r))
                    .map(|(_, x)| *x)
                    .unzip()
            };
            let ((ga, gr), (oa, or)) = (by(Role::Generator), by(Role::Optimizer));
            (whiten(&ga), whiten(&oa), gr, or)
        }
        Algorithm::Grpo => (
            group_advantages(&gen_t.values, &gen_t.groups, s.std_floor),
            match s.credit.mode {
                CreditMode::ReturnsToGo => {
                    improvement_advantages(&opt.values, &opt.baselines, s.std_floor)
                }
                CreditMode::Seed => group_advantages(&opt.values, &opt.groups, s.std_floor),
            },
            vec![],
            vec![],
        ),
    };
    let t0 = Instant::now();
    let optimizer_signal_groups = match (s.algorithm, s.credit.mode) {
        // Each optimizer turn is its own comparison: the share that changed its kernel's reward.
        (Algorithm::Grpo, CreditMode::ReturnsToGo) => {
            opt_a.iter().filter(|a| **a != 0.0).count() as f64 / opt_a.len().max(1) as f64
        }
        _ => signal_share(&opt.values, &opt.groups, 1e-9),
    };
    let mut out = StepUpdate {
        signal_groups: signal_share(&gen_t.values, &gen_t.groups, 1e-9),
        optimizer_signal_groups,
        ..Default::default()
    };
    let drop_zero = s.algorithm == Algorithm::Grpo && s.signal_only;
    for (agent, turns, a, ret) in [
        (Role::Generator, &gen_t, &gen_a, &gen_ret),
        (Role::Optimizer, &opt, &opt_a, &opt_ret),
    ] {
        let mut samples = Vec::new();
        for (k, ((ei, t, id), a)) in turns.keys.iter().zip(a).enumerate() {
            out.advantages.insert((*ei, *t), *a);
            // GRPO trains on signal only: a completion with advantage 0 (its group's values
            // all equal, or a revision that changed nothing) adds no policy gradient, and its
            // tokens in the token mean, the KL and PPO-ptx would only dilute those that do
            // (DAPO's dynamic sampling, Yu et al., arXiv:2503.14476).
            if drop_zero && *a == 0.0 {
                continue;
            }
            if let Some(id) = id {
                samples.push(Sample {
                    id: *id,
                    advantage: *a,
                    ret: ret.get(k).copied(),
                });
            }
        }
        let st = tc.update(agent, samples)?;
        match agent {
            Role::Generator => out.generator = st,
            Role::Optimizer => out.optimizer = st,
        }
    }
    out.seconds = t0.elapsed().as_secs_f64();
    Ok(out)
}

/// PPO's per-turn (advantage, value target) for each episode: rewards `r_t = immediate * R_t`
/// plus `final * R` on the last turn (the turn credit's weights, `docs/architecture.md`,
/// "Reward and turn credit"; `R_t` the turn's reward, `R` the episode's final reward), values
/// from the critics at generation time (0 where missing), then GAE (Schulman et al.,
/// arXiv:1506.02438) with `gamma` per turn and `lambda`; target = advantage + value.
pub fn ppo_targets(
    eps: &[Episode],
    w: &CreditWeights,
    gamma: f64,
    lambda: f64,
) -> Vec<Vec<(f64, f64)>> {
    eps.iter()
        .map(|e| {
            let n = e.turns.len();
            let r: Vec<f64> = e
                .turns
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    w.immediate * t.reward.reward
                        + if i + 1 == n {
                            w.final_ * e.final_reward()
                        } else {
                            0.0
                        }
                })
                .collect();
            let v: Vec<f64> = e.turns.iter().map(|t| t.value.unwrap_or(0.0)).collect();
            let (a, ret) = gae(&r, &v, gamma, lambda);
            a.into_iter().zip(ret).collect()
        })
        .collect()
}

/// Rates of the best turns of `eps`: (compile rate, pass rate or `None` when nothing ran).
pub fn rates(eps: &[&Episode]) -> (f64, Option<f64>) {
    let outcomes: Vec<Outcome> = eps.iter().map(|e| Outcome::of(0, e)).collect();
    outcome_rates(&outcomes)
}

/// What a step's episodes came to (the episode columns of `rl-train`'s `metrics`).
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeStats {
    /// Mean final reward per episode.
    pub mean_reward: f64,
    /// Its population standard deviation.
    pub reward_std: f64,
    /// Compile rate of the best turns.
    pub compile_rate: f64,
    /// Pass rate of the best turns (`None` in compile-only mode).
    pub pass_rate: Option<f64>,
    /// Compile rate of the first turns.
    pub first_turn_compile_rate: f64,
    /// Geometric-mean speedup over the naive kernel of the correct best turns.
    pub speedup: Option<f64>,
    /// Mean turns per episode.
    pub turns_used: f64,
    /// `{"<tier>": mean final reward of the tier's episodes}` as JSON.
    pub reward_by_tier_json: String,
}

impl EpisodeStats {
    /// Of `eps`.
    pub fn of(eps: &[Episode]) -> EpisodeStats {
        let n = eps.len().max(1) as f64;
        let finals: Vec<f64> = eps.iter().map(Episode::final_reward).collect();
        let (mean_reward, reward_std) = mean_std(&finals);
        let mut per_tier: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
        for (e, r) in eps.iter().zip(&finals) {
            per_tier.entry(e.tier).or_default().push(*r);
        }
        let by_tier: serde_json::Map<String, serde_json::Value> = per_tier
            .iter()
            .map(|(t, v)| (t.to_string(), serde_json::json!(mean_std(v).0)))
            .collect();
        let (compile_rate, pass_rate) = rates(&eps.iter().collect::<Vec<_>>());
        let first = eps
            .iter()
            .filter(|e| e.turns.first().is_some_and(|t| t.reward.compiled))
            .count() as f64;
        let sp: Vec<f64> = eps
            .iter()
            .filter_map(|e| {
                let b = e.best_components();
                b.speedup.filter(|_| b.gate)
            })
            .collect();
        EpisodeStats {
            mean_reward,
            reward_std,
            compile_rate,
            pass_rate,
            first_turn_compile_rate: first / n,
            speedup: geomean(&sp),
            turns_used: eps.iter().map(|e| e.turns.len() as f64).sum::<f64>() / n,
            reward_by_tier_json: serde_json::Value::Object(by_tier).to_string(),
        }
    }
}

/// The curriculum gate: tier `k + 1` opens when, over the last `window` steps (a full window
/// since tier `k` opened), the episodes on tier `k` reach a compile rate above
/// `min_compile_rate` and a pass rate above `min_pass_rate` (docs/architecture.md, "Tiers and
/// gates": 0.9 and 0.75); without a GPU the pass rate is unknown and the compile rate decides.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Gate {
    /// Steps the gate looks back over.
    pub window: usize,
    /// Compile rate to exceed.
    pub min_compile_rate: f64,
    /// Pass rate to exceed.
    pub min_pass_rate: f64,
}

impl Gate {
    /// Whether the current tier, open for `steps_since_open` steps, with these rates, opens the
    /// next.
    pub fn passes(&self, steps_since_open: usize, compile: f64, pass: Option<f64>) -> bool {
        steps_since_open >= self.window.max(1)
            && compile > self.min_compile_rate
            && pass.is_none_or(|x| x > self.min_pass_rate)
    }
}

/// A tier opening: (tier, step it opened at, the compile and pass rates that opened it).
pub type Opening = (i64, i64, Option<f64>, Option<f64>);

/// What the gate reads of one episode: its step, tier and best turn's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The RL step it ran in.
    pub step: usize,
    /// Its task's tier.
    pub tier: i64,
    /// The best turn compiled.
    pub compiled: bool,
    /// The best turn passed every test (`None` when nothing ran).
    pub correct: Option<bool>,
    /// Tests ran (full mode).
    pub full: bool,
}

impl Outcome {
    /// `e`'s outcome, in `step`.
    pub fn of(step: usize, e: &Episode) -> Outcome {
        let b = e.best_components();
        Outcome {
            step,
            tier: e.tier,
            compiled: b.compiled,
            correct: b.correct,
            full: b.mode == "full",
        }
    }
}

/// The tiers a run has opened and the outcomes the gate reads (those of the last `window`
/// steps); serializable, so a resumed run opens tiers as the straight run would.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curriculum {
    gate: Gate,
    max_tier: i64,
    /// The highest open tier.
    pub tier: i64,
    /// Every opening, the first at step 0.
    pub opened: Vec<Opening>,
    history: Vec<Outcome>,
}

impl Curriculum {
    /// Starting at `min_tier`, up to `max_tier`.
    pub fn new(gate: Gate, min_tier: i64, max_tier: i64) -> Curriculum {
        Curriculum {
            gate,
            max_tier,
            tier: min_tier,
            opened: vec![(min_tier, 0, None, None)],
            history: Vec::new(),
        }
    }

    /// Records `step`'s episodes and opens the next tier when the gate passes.
    pub fn record(&mut self, step: usize, eps: &[Episode]) {
        let window = self.gate.window.max(1);
        self.history.retain(|o| o.step + window > step);
        self.history
            .extend(eps.iter().map(|e| Outcome::of(step, e)));
        if self.tier >= self.max_tier {
            return;
        }
        let recent: Vec<Outcome> = self
            .history
            .iter()
            .filter(|o| o.step + self.gate.window > step && o.tier == self.tier)
            .copied()
            .collect();
        let (c, pass) = outcome_rates(&recent);
        let since = step - self.opened.last().map_or(0, |o| o.1 as usize);
        if !recent.is_empty() && self.gate.passes(since, c, pass) {
            self.tier += 1;
            self.opened.push((self.tier, step as i64, Some(c), pass));
        }
    }
}

/// (compile rate, pass rate or `None` when no test ran) of `outcomes`.
fn outcome_rates(outcomes: &[Outcome]) -> (f64, Option<f64>) {
    let n = outcomes.len().max(1) as f64;
    let compiled = outcomes.iter().filter(|o| o.compiled).count() as f64;
    let full = outcomes.iter().any(|o| o.full);
    let pass = full.then(|| outcomes.iter().filter(|o| o.correct == Some(true)).count() as f64 / n);
    (compiled / n, pass)
}

/// SplitMix64 (Steele, Lea and Flood 2014): the next value of the task draw's stream.
pub fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tier_gate_needs_a_full_window_and_both_rates() {
        let g = Gate {
            window: 2,
            min_compile_rate: 0.9,
            min_pass_rate: 0.75,
        };
        // Perfect rates after one step on the tier: not yet.
        assert!(!g.passes(1, 1.0, Some(1.0)));
        assert!(g.passes(2, 1.0, Some(1.0)));
        // Each rate must clear its bar (strictly).
        assert!(!g.passes(3, 0.9, Some(1.0)));
        assert!(!g.passes(3, 1.0, Some(0.75)));
        // Compile-only: no pass rate, the compile rate decides.
        assert!(g.passes(2, 0.95, None));
    }

    #[test]
    fn splitmix_matches_its_reference_values() {
        // The first outputs for seed 0 (Vigna's splitmix64.c).
        let mut s = 0u64;
        assert_eq!(splitmix(&mut s), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix(&mut s), 0x6E78_9E6A_A1B9_65F4);
    }
}
