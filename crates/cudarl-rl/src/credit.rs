//! Credit assignment of multi-turn RL without tensors (shared by the `rl-train` stage and the
//! trainer): group-normalized advantages (GRPO, Shao et al., "DeepSeekMath", arXiv:2402.03300),
//! turn credit (docs/architecture.md, "Reward and turn credit"), generalized advantage estimation
//! (Schulman et al., arXiv:1506.02438).

use serde::{Deserialize, Serialize};

/// Group-normalized advantages: `A_i = (r_i - mean_g) / max(std_g, std_floor)` over the samples
/// of the same group `g` (`groups[i]`), with the population standard deviation. A group whose
/// rewards are all equal gets zero advantages (no signal), not a division by zero.
///
/// `std_floor` (0 = plain GRPO, Shao et al.) bounds the amplification of a group whose rewards
/// differ only by measurement noise: two correct kernels a few percent apart in timed speedup
/// would otherwise get advantages of +-1, as large as a pass next to a failure. Liu et al.
/// ("Understanding R1-Zero-Like Training", arXiv:2503.20783) drop the division altogether for
/// a related bias; a floor keeps GRPO's scale for groups with real spread.
pub fn group_advantages(rewards: &[f64], groups: &[usize], std_floor: f64) -> Vec<f64> {
    assert_eq!(rewards.len(), groups.len(), "one group id per reward");
    let mut stats: std::collections::BTreeMap<usize, (f64, f64, f64)> = Default::default();
    for (&r, &g) in rewards.iter().zip(groups) {
        let e = stats.entry(g).or_default();
        e.0 += 1.0;
        e.1 += r;
        e.2 += r * r;
    }
    rewards
        .iter()
        .zip(groups)
        .map(|(&r, g)| {
            let (n, s, s2) = stats[g];
            let mean = s / n;
            let sd = (s2 / n - mean * mean).max(0.0).sqrt();
            if sd < 1e-12 {
                0.0
            } else {
                (r - mean) / sd.max(std_floor)
            }
        })
        .collect()
}

/// The share of groups whose rewards are not all equal (population std above `min_std`): the
/// groups that carry a GRPO signal at all. 0 for no groups.
pub fn signal_share(rewards: &[f64], groups: &[usize], min_std: f64) -> f64 {
    let mut by: std::collections::BTreeMap<usize, Vec<f64>> = Default::default();
    for (&r, &g) in rewards.iter().zip(groups) {
        by.entry(g).or_default().push(r);
    }
    if by.is_empty() {
        return 0.0;
    }
    let with = by
        .values()
        .filter(|v| {
            let m = v.iter().sum::<f64>() / v.len() as f64;
            (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64).sqrt() > min_std
        })
        .count();
    with as f64 / by.len() as f64
}

/// Credit of each turn of an episode whose turns earned `rewards` `r_0..r_{T-1}`
/// (docs/architecture.md, "Reward and turn credit"):
///
/// - [`CreditMode::ReturnsToGo`] (default): `c_t = sum_{k >= t} gamma^(k-t) r_k`, the turn's
///   reward and the discounted rewards of the turns after it (Kevin-32B's multi-turn credit,
///   "sum" with `gamma = 0.4`; Baronio et al., Cognition, 2025). A turn is credited with what
///   it and what followed it earned, never with an earlier turn's result.
/// - [`CreditMode::Seed`]: `c_t = immediate * r_t + final * gamma^(T-1-t) * r_{T-1}`, the final
///   turn's reward discounted by the turns still to come (the founding design's formula:
///   0.3, 0.7, 0.9).
pub fn turn_credits(rewards: &[f64], w: &CreditWeights) -> Vec<f64> {
    let t = rewards.len();
    match w.mode {
        CreditMode::ReturnsToGo => {
            let mut c = vec![0.0; t];
            let mut next = 0.0;
            for i in (0..t).rev() {
                next = rewards[i] + w.gamma * next;
                c[i] = next;
            }
            c
        }
        CreditMode::Seed => {
            let last = rewards.last().copied().unwrap_or(0.0);
            rewards
                .iter()
                .enumerate()
                .map(|(i, &r)| w.immediate * r + w.final_ * w.gamma.powi((t - 1 - i) as i32) * last)
                .collect()
        }
    }
}

/// Advantages of optimizer turns against the state each one revises: `v_i / max(sd, floor)`
/// with `v_i = credit_i - baseline_i`, `baseline_i` the reward of the kernel the turn was given
/// (a function of the state alone, so an unbiased baseline; Williams 1992) and `sd` the
/// population standard deviation of all `v` (a scale, not a mean: the sign of an advantage is
/// the sign of the turn's improvement). A revision that breaks a passing kernel gets a negative
/// advantage whatever the other episodes did; a repair of a failing one a positive advantage.
/// A turn that changed nothing gets 0.
pub fn improvement_advantages(credits: &[f64], baselines: &[f64], floor: f64) -> Vec<f64> {
    assert_eq!(credits.len(), baselines.len(), "one baseline per credit");
    let v: Vec<f64> = credits.iter().zip(baselines).map(|(c, b)| c - b).collect();
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let sd = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n).sqrt();
    let scale = sd.max(floor).max(1e-12);
    v.iter()
        .map(|x| if x.abs() < 1e-12 { 0.0 } else { x / scale })
        .collect()
}

/// How [`turn_credits`] credits a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CreditMode {
    /// The turn's reward plus the discounted rewards of later turns; optimizer turns are judged
    /// against the kernel they revise ([`improvement_advantages`]).
    #[default]
    ReturnsToGo,
    /// The founding design's `immediate * r_t + final * gamma^(turns left) * r_final`,
    /// optimizer turns group-normalized by task and turn.
    Seed,
}

/// Weights of [`turn_credits`] (`[credit]` in `configs/reward/*.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreditWeights {
    /// Returns-to-go (default) or the seed formula.
    #[serde(default)]
    pub mode: CreditMode,
    /// Seed: weight of the turn's own reward.
    pub immediate: f64,
    /// Seed: weight of the final turn's reward.
    #[serde(rename = "final")]
    pub final_: f64,
    /// Discount per turn (returns-to-go: 0.4; seed: 0.9).
    pub gamma: f64,
}

impl Default for CreditWeights {
    fn default() -> Self {
        CreditWeights {
            mode: CreditMode::ReturnsToGo,
            immediate: 0.3,
            final_: 0.7,
            gamma: 0.4,
        }
    }
}

/// Generalized advantage estimation over one episode: `delta_t = r_t + gamma V_{t+1} - V_t`
/// (`V_T = 0`), `A_t = sum_l (gamma lambda)^l delta_{t+l}`; returns the advantages and the
/// value targets `A_t + V_t`.
pub fn gae(rewards: &[f64], values: &[f64], gamma: f64, lambda: f64) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(rewards.len(), values.len(), "one value per reward");
    let n = rewards.len();
    let mut adv = vec![0.0; n];
    let mut next_adv = 0.0;
    for t in (0..n).rev() {
        let next_v = if t + 1 < n { values[t + 1] } else { 0.0 };
        let delta = rewards[t] + gamma * next_v - values[t];
        next_adv = delta + gamma * lambda * next_adv;
        adv[t] = next_adv;
    }
    let ret = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    (adv, ret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_advantages_by_hand() {
        // Group 0: rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> +1, -1, -1, +1.
        // Group 1: all equal -> 0.
        let a = group_advantages(&[1.0, 0.0, 0.0, 1.0, 0.3, 0.3], &[0, 0, 0, 0, 1, 1], 0.0);
        assert_eq!(a, vec![1.0, -1.0, -1.0, 1.0, 0.0, 0.0]);
        // Rewards 0, 0.5, 1: mean 0.5, std sqrt(1/6) = 0.40825 -> -1.2247, 0, 1.2247.
        let a = group_advantages(&[0.0, 0.5, 1.0], &[7, 7, 7], 0.0);
        assert!((a[0] + 1.224_744_871).abs() < 1e-6 && a[1].abs() < 1e-12);
        // A floor of 0.1 leaves a group with std 0.5 alone and damps timing noise: rewards
        // 0.60, 0.62 (std 0.01) -> -0.1, +0.1 instead of -1, +1.
        let a = group_advantages(&[1.0, 0.0, 0.60, 0.62], &[0, 0, 1, 1], 0.1);
        let want = [1.0, -1.0, -0.1, 0.1];
        for (x, w) in a.iter().zip(want) {
            assert!((x - w).abs() < 1e-9, "{a:?}");
        }
        // Signal share: group 0 (std 0.5) and group 1 (std 0.01) differ, group 2 does not;
        // with min_std 0.05 only group 0 counts.
        let (r, g) = ([1.0, 0.0, 0.60, 0.62, 0.3, 0.3], [0, 0, 1, 1, 2, 2]);
        assert!((signal_share(&r, &g, 0.0) - 2.0 / 3.0).abs() < 1e-12);
        assert!((signal_share(&r, &g, 0.05) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(signal_share(&[], &[], 0.0), 0.0);
    }

    #[test]
    fn turn_credits_by_hand() {
        let seed = CreditWeights {
            mode: CreditMode::Seed,
            gamma: 0.9,
            ..Default::default()
        };
        // Seed, rewards 0, 0.2, 0.9 (the last one final):
        // c0 = 0.3*0 + 0.7*0.81*0.9 = 0.5103; c1 = 0.06 + 0.7*0.9*0.9 = 0.627; c2 = 0.27 + 0.63 = 0.9.
        let c = turn_credits(&[0.0, 0.2, 0.9], &seed);
        for (x, w) in c.iter().zip([0.5103, 0.627, 0.9]) {
            assert!((x - w).abs() < 1e-12, "{c:?}");
        }
        // The seed's R is the final turn's reward, not the best: a broken revision of a
        // passing kernel leaves the earlier turns 0.7 * 0.9^k * 0.
        let c = turn_credits(&[0.8, 0.0], &seed);
        assert!((c[0] - 0.24).abs() < 1e-12 && c[1].abs() < 1e-12, "{c:?}");
        // Returns-to-go, gamma 0.4: c2 = 0.9; c1 = 0.2 + 0.36 = 0.56; c0 = 0 + 0.224 = 0.224.
        let c = turn_credits(&[0.0, 0.2, 0.9], &CreditWeights::default());
        for (x, w) in c.iter().zip([0.224, 0.56, 0.9]) {
            assert!((x - w).abs() < 1e-12, "{c:?}");
        }
    }

    #[test]
    fn an_optimizer_turn_that_breaks_a_passing_kernel_gets_a_negative_advantage() {
        let w = CreditWeights::default();
        // Four episodes of one task, turn 1 is the optimizer's (the last turn):
        // a: passing 0.8 -> broken 0     b: failing 0 -> repaired 0.6
        // c: failing 0 -> still failing 0 d: passing 0.8 -> faster 0.9
        let eps = [[0.8, 0.0], [0.0, 0.6], [0.0, 0.0], [0.8, 0.9]];
        let credits: Vec<f64> = eps.iter().map(|r| turn_credits(r, &w)[1]).collect();
        let baselines: Vec<f64> = eps.iter().map(|r| r[0]).collect();
        let a = improvement_advantages(&credits, &baselines, 0.1);
        assert!(a[0] < 0.0, "breaking a passing kernel: {a:?}");
        assert!(a[1] > 0.0, "repairing a failing kernel: {a:?}");
        assert_eq!(a[2], 0.0, "no change, no signal: {a:?}");
        assert!(a[3] > 0.0 && a[3] < a[1], "a small speed-up: {a:?}");
        // Judged against the state it revised, not against the other episodes: in a group
        // where the others failed for good, breaking a passing kernel is still negative.
        let a = improvement_advantages(&[0.5, 0.0, 0.0, 0.0], &[0.0, 0.8, 0.0, 0.0], 0.1);
        assert!(a[1] < 0.0 && a[0] > 0.0, "{a:?}");
    }

    #[test]
    fn gae_by_hand() {
        // gamma 1, lambda 0.95; rewards 0, 0, 1; values 0.5, 0.6, 0.7.
        // deltas: 0 + 0.6 - 0.5 = 0.1; 0 + 0.7 - 0.6 = 0.1; 1 - 0.7 = 0.3.
        // A2 = 0.3; A1 = 0.1 + 0.95*0.3 = 0.385; A0 = 0.1 + 0.95*0.385 = 0.46575.
        let (a, r) = gae(&[0.0, 0.0, 1.0], &[0.5, 0.6, 0.7], 1.0, 0.95);
        let want = [0.46575, 0.385, 0.3];
        for (x, w) in a.iter().zip(want) {
            assert!((x - w).abs() < 1e-12, "{a:?}");
        }
        // With lambda 1 and gamma 1 the targets are the returns-to-go: 1, 1, 1.
        let (_, r1) = gae(&[0.0, 0.0, 1.0], &[0.5, 0.6, 0.7], 1.0, 1.0);
        assert!(r1.iter().all(|x| (x - 1.0).abs() < 1e-12), "{r1:?}");
        assert!((r[2] - 1.0).abs() < 1e-12);
    }
}
