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

/// Credit of each turn of an episode with immediate rewards `r_0..r_{T-1}` and final reward
/// `R`: `c_t = immediate * r_t + final * gamma^(T-1-t) * R` (docs/architecture.md, "Reward and
/// turn credit": 0.3, 0.7, 0.9: the final outcome counts most, discounted by the turns still to
/// come).
pub fn turn_credits(immediate_rewards: &[f64], final_reward: f64, w: &CreditWeights) -> Vec<f64> {
    let t = immediate_rewards.len();
    immediate_rewards
        .iter()
        .enumerate()
        .map(|(i, &r)| w.immediate * r + w.final_ * w.gamma.powi((t - 1 - i) as i32) * final_reward)
        .collect()
}

/// Weights of [`turn_credits`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreditWeights {
    /// Weight of the turn's own reward.
    pub immediate: f64,
    /// Weight of the episode's final reward.
    #[serde(rename = "final")]
    pub final_: f64,
    /// Discount per remaining turn.
    pub gamma: f64,
}

impl Default for CreditWeights {
    fn default() -> Self {
        CreditWeights {
            immediate: 0.3,
            final_: 0.7,
            gamma: 0.9,
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
        // Three turns, immediate 0, 0.2, 0.9, final 0.9:
        // c0 = 0.3*0 + 0.7*0.81*0.9 = 0.5103; c1 = 0.06 + 0.7*0.9*0.9 = 0.627; c2 = 0.27 + 0.63 = 0.9.
        let c = turn_credits(&[0.0, 0.2, 0.9], 0.9, &CreditWeights::default());
        let want = [0.5103, 0.627, 0.9];
        for (x, w) in c.iter().zip(want) {
            assert!((x - w).abs() < 1e-12, "{c:?}");
        }
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
