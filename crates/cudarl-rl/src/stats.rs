//! Statistics of RL and its evaluation: means and population standard deviations, whitened
//! advantages, pooled step means, and the RL - SFT comparisons of `eval`'s report (Wald,
//! stratified by task, paired by sampling seed with errors clustered by task).

use std::collections::BTreeMap;

use crate::reward::RewardComponents;

/// Advantages whitened over the batch: `(a - mean) / (std + 1e-6)` (PPO's usual
/// normalization); one sample gets 0.
pub fn whiten(a: &[f64]) -> Vec<f64> {
    let (m, sd) = mean_std(a);
    if a.len() < 2 {
        return vec![0.0; a.len()];
    }
    a.iter().map(|x| (x - m) / (sd + 1e-6)).collect()
}

/// Mean and population standard deviation.
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64;
    (m, var.sqrt())
}

/// The mean over the episodes of several steps given each step's (episodes, mean, population
/// std), its standard error `sqrt(var / N)` (the pooled population variance: within-step
/// plus between-step spread), and `N`.
pub fn pooled(steps: &[(f64, f64, f64)]) -> (f64, f64, f64) {
    let n: f64 = steps.iter().map(|s| s.0).sum();
    if n <= 0.0 {
        return (0.0, 0.0, 0.0);
    }
    let mean = steps.iter().map(|s| s.0 * s.1).sum::<f64>() / n;
    let var = steps
        .iter()
        .map(|s| s.0 * (s.2 * s.2 + (s.1 - mean).powi(2)))
        .sum::<f64>()
        / n;
    (mean, (var / n).sqrt(), n)
}

/// `b - a` for two rates measured on `na` and `nb` episodes, and its standard error
/// `sqrt(a (1 - a) / na + b (1 - b) / nb)`: the Wald standard error of a difference of two
/// independent binomial proportions (Agresti, *Categorical Data Analysis*, the comparison of
/// two proportions). `None` without episodes.
pub fn rate_diff(a: f64, na: f64, b: f64, nb: f64) -> Option<(f64, f64)> {
    (na > 0.0 && nb > 0.0).then(|| (b - a, (a * (1.0 - a) / na + b * (1.0 - b) / nb).sqrt()))
}

/// `b - a` stratified by task, and its standard error: per task `t`, `a` succeeded `ka_t` times
/// in `na_t` episodes and `b` `kb_t` in `nb_t`; the difference is `sum_t w_t (kb_t/nb_t -
/// ka_t/na_t)` with `w_t = (na_t + nb_t) / (Na + Nb)`, its variance `sum_t w_t^2 (pa_t (1 -
/// pa_t) / na_t + pb_t (1 - pb_t) / nb_t)` (the stratified difference of proportions, e.g.
/// Cochran, *Sampling Techniques*, stratified random sampling). Eval gives every task the same
/// episodes per checkpoint, so between-task spread is not sampling error on these tasks; the
/// unstratified [`rate_diff`] counts it. `None` when a task has no episodes on one side.
pub fn stratified_diff(tasks: &[(f64, f64, f64, f64)]) -> Option<(f64, f64)> {
    let total: f64 = tasks.iter().map(|t| t.0 + t.2).sum();
    if tasks.is_empty() || tasks.iter().any(|t| t.0 <= 0.0 || t.2 <= 0.0) {
        return None;
    }
    let (mut d, mut var) = (0.0, 0.0);
    for &(na, ka, nb, kb) in tasks {
        let (w, pa, pb) = ((na + nb) / total, ka / na, kb / nb);
        d += w * (pb - pa);
        var += w * w * (pa * (1.0 - pa) / na + pb * (1.0 - pb) / nb);
    }
    Some((d, var.sqrt()))
}

/// `b - a` over paired episodes and its standard error clustered by task, with the episodes
/// `b` gained and lost. `pairs[i] = (task, a_i, b_i)`: episode `i` of a task on each side drew
/// the same sampling seeds (eval runs both checkpoints with one seed; the generator's first
/// turn is then identical wherever its weights are). The difference is `d = mean_i (b_i -
/// a_i)`; its variance `T / (T - 1) * sum_t (sum_{i in t} (x_i - d))^2 / N^2` over the `T`
/// tasks and `N` pairs, the cluster-robust (CR1) estimator (Cameron and Miller, "A
/// Practitioner's Guide to Cluster-Robust Inference", J. Human Resources 50(2), 2015): the
/// episodes of one task are correlated, so the tasks are the independent units, and the error
/// speaks of new tasks like these rather than of these tasks (compare [`stratified_diff`]).
/// With equal episodes per task it is the standard error of the per-task mean differences.
/// Returns `(d, se, gained, lost)`, `se` `None` with one task (no spread between tasks to
/// measure); `None` without pairs.
pub fn paired_diff(pairs: &[(&str, bool, bool)]) -> Option<(f64, Option<f64>, usize, usize)> {
    let mut by_task: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for &(t, a, b) in pairs {
        by_task
            .entry(t)
            .or_default()
            .push(f64::from(u8::from(b)) - f64::from(u8::from(a)));
    }
    let (n, k) = (pairs.len() as f64, by_task.len() as f64);
    if pairs.is_empty() {
        return None;
    }
    let d = by_task.values().flatten().sum::<f64>() / n;
    let ss: f64 = by_task
        .values()
        .map(|x| x.iter().map(|v| v - d).sum::<f64>().powi(2))
        .sum();
    let gained = pairs.iter().filter(|p| p.2 && !p.1).count();
    let lost = pairs.iter().filter(|p| p.1 && !p.2).count();
    let se = (k >= 2.0).then(|| (k / (k - 1.0) * ss).sqrt() / n);
    Some((d, se, gained, lost))
}

/// The mean of paired differences with its standard error: one difference per unit (e.g. per
/// KernelBench problem, checkpoint B's pass rate on it minus checkpoint A's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanDiff {
    /// `mean_i d_i`.
    pub mean: f64,
    /// `s / sqrt(n)`, `s` the sample standard deviation of the `d_i` (`n - 1` in its
    /// denominator): the denominator of the paired t statistic, with `n - 1` degrees of freedom
    /// (Student, "The probable error of a mean", Biometrika 6(1), 1908). `None` with one unit.
    pub se: Option<f64>,
    /// The units `n`.
    pub n: usize,
}

impl MeanDiff {
    /// Of the per-unit differences `d`; `None` when `d` is empty.
    pub fn of(d: &[f64]) -> Option<MeanDiff> {
        let n = d.len();
        if n == 0 {
            return None;
        }
        // The population deviation over sqrt(n - 1) is the sample deviation over sqrt(n).
        let (mean, sd) = mean_std(d);
        let se = (n >= 2).then(|| sd / ((n - 1) as f64).sqrt());
        Some(MeanDiff { mean, se, n })
    }

    /// The degrees of freedom of the paired t statistic, `n - 1`.
    pub fn df(&self) -> usize {
        self.n.saturating_sub(1)
    }
}

/// What an episode's first turn (the generator's answer) came to.
pub fn first_turn_outcome(c: &RewardComponents) -> &'static str {
    if c.correct == Some(true) {
        "passed"
    } else if c.compiled {
        "compiled, failed"
    } else if c.has_code {
        "compile error"
    } else {
        "no code"
    }
}

/// The report's table of episodes by their first turn's outcome and, for each, the fraction
/// that ended correct (what the optimizer's turns made of that start): one row per
/// `(checkpoint, split)` in the order first seen, a cell `n (p)` per outcome of
/// [`first_turn_outcome`] (`-` where none). Items: `(checkpoint, split, outcome, ended
/// correct)`. Empty without items.
pub fn first_turn_table(items: &[(&str, &str, &str, bool)]) -> String {
    const OUTCOMES: [&str; 4] = ["passed", "compiled, failed", "compile error", "no code"];
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for (ck, split, _, _) in items {
        if !keys.contains(&(*ck, *split)) {
            keys.push((ck, split));
        }
    }
    if keys.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "| checkpoint | split | {} |\n|---|---|---|---|---|---|\n",
        OUTCOMES.map(|o| format!("first turn {o}")).join(" | ")
    );
    for (ck, split) in keys {
        let cells: Vec<String> = OUTCOMES
            .iter()
            .map(|o| {
                let ended: Vec<bool> = items
                    .iter()
                    .filter(|i| (i.0, i.1, i.2) == (ck, split, *o))
                    .map(|i| i.3)
                    .collect();
                match ended.len() {
                    0 => "-".to_string(),
                    n => format!(
                        "{n} ({:.2})",
                        ended.iter().filter(|x| **x).count() as f64 / n as f64
                    ),
                }
            })
            .collect();
        md.push_str(&format!("| {ck} | {split} | {} |\n", cells.join(" | ")));
    }
    md
}

/// Geometric mean of positive values (each floored at 1e-9); `None` for none.
pub fn geomean(v: &[f64]) -> Option<f64> {
    (!v.is_empty())
        .then(|| (v.iter().map(|x| x.max(1e-9).ln()).sum::<f64>() / v.len() as f64).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_difference_and_its_standard_error_by_hand() {
        // 0.5 of 100 vs 0.6 of 50: sqrt(0.25 / 100 + 0.24 / 50) = sqrt(0.0073).
        let (d, se) = rate_diff(0.5, 100.0, 0.6, 50.0).unwrap();
        assert!((d - 0.1).abs() < 1e-12);
        assert!((se - 0.0073f64.sqrt()).abs() < 1e-12, "{se}");
        // 18 -> 26 passes of 136 episodes each (0.132 -> 0.191) is 1.3 standard errors.
        let (d, se) = rate_diff(18.0 / 136.0, 136.0, 26.0 / 136.0, 136.0).unwrap();
        assert!((d / se - 1.32).abs() < 0.01, "{}", d / se);
        assert_eq!(rate_diff(0.5, 0.0, 0.5, 10.0), None);
    }

    #[test]
    fn stratified_difference_by_hand() {
        // Task 1: 0 of 4 vs 2 of 4; task 2: 4 of 4 vs 4 of 4. Weights 1/2 each:
        // d = 0.5 * 0.5 + 0 = 0.25; var = 0.25 * (0 + 0.25 / 4) + 0 = 0.015625.
        let (d, se) = stratified_diff(&[(4.0, 0.0, 4.0, 2.0), (4.0, 4.0, 4.0, 4.0)]).unwrap();
        assert!((d - 0.25).abs() < 1e-12);
        assert!((se - 0.125).abs() < 1e-12, "{se}");
        // Unstratified, the same counts (4 of 8 vs 6 of 8) have a larger error: the spread
        // between the tasks counts as noise there.
        let (d2, se2) = rate_diff(0.5, 8.0, 0.75, 8.0).unwrap();
        assert!((d2 - d).abs() < 1e-12 && se2 > se);
        // Unequal sizes weigh by episodes: (2 + 2) and (6 + 6) of 16.
        let (d, _) = stratified_diff(&[(2.0, 0.0, 2.0, 2.0), (6.0, 3.0, 6.0, 3.0)]).unwrap();
        assert!((d - 0.25).abs() < 1e-12);
        assert_eq!(stratified_diff(&[(4.0, 1.0, 0.0, 0.0)]), None);
        assert_eq!(stratified_diff(&[]), None);
    }

    #[test]
    fn paired_difference_by_hand() {
        // Task a: pairs (0,1), (0,1), (1,1), (1,0): +1, +1, 0, -1; task b: (0,0), (1,1), (0,1),
        // (0,1): 0, 0, +1, +1. N = 8, d = 3/8. Per task the deviations sum to 1 - 4d = -0.5
        // and 2 - 4d = 0.5; CR1 variance 2/1 * (0.25 + 0.25) / 64 = 1/64, se 0.125, which is
        // the standard error of the per-task means 0.25 and 0.5 (sd 0.1768 / sqrt 2).
        let p = [
            ("a", false, true),
            ("a", false, true),
            ("a", true, true),
            ("a", true, false),
            ("b", false, false),
            ("b", true, true),
            ("b", false, true),
            ("b", false, true),
        ];
        let (d, se, gained, lost) = paired_diff(&p).unwrap();
        assert!((d - 0.375).abs() < 1e-12, "{d}");
        assert!((se.unwrap() - 0.125).abs() < 1e-12, "{se:?}");
        assert_eq!((gained, lost), (4, 1));
        // Identical sides: no difference and no spread.
        let same: Vec<_> = p.iter().map(|&(t, a, _)| (t, a, a)).collect();
        assert_eq!(paired_diff(&same), Some((0.0, Some(0.0), 0, 0)));
        // One task: the difference and the counts, no spread between tasks to measure.
        assert_eq!(paired_diff(&p[..4]), Some((0.25, None, 2, 1)));
        assert_eq!(paired_diff(&[]), None);
    }

    #[test]
    fn mean_of_paired_differences_by_hand() {
        // d = 1, 0, 0.5, 0.5: mean 0.5, squared deviations 0.25 + 0.25, s^2 = 0.5 / 3,
        // se = sqrt(s^2 / 4) = sqrt(1 / 24), df 3.
        let m = MeanDiff::of(&[1.0, 0.0, 0.5, 0.5]).unwrap();
        assert_eq!((m.mean, m.n, m.df()), (0.5, 4, 3));
        assert!(
            (m.se.unwrap() - (1.0f64 / 24.0).sqrt()).abs() < 1e-12,
            "{m:?}"
        );
        // The per-task means of `paired_difference_by_hand` (0.25 and 0.5, four episodes
        // each): the same standard error as the clustered one, 0.125.
        let t = MeanDiff::of(&[0.25, 0.5]).unwrap();
        assert!((t.se.unwrap() - 0.125).abs() < 1e-12, "{t:?}");
        // One unit: no spread to measure; none: nothing.
        assert_eq!(
            MeanDiff::of(&[-0.25]),
            Some(MeanDiff {
                mean: -0.25,
                se: None,
                n: 1
            })
        );
        assert_eq!(MeanDiff::of(&[]), None);
    }

    #[test]
    fn first_turn_table_by_hand() {
        let c = |has_code, compiled, correct| RewardComponents {
            has_code,
            compiled,
            correct,
            ..Default::default()
        };
        assert_eq!(first_turn_outcome(&c(true, true, Some(true))), "passed");
        assert_eq!(
            first_turn_outcome(&c(true, true, Some(false))),
            "compiled, failed"
        );
        assert_eq!(first_turn_outcome(&c(true, false, None)), "compile error");
        assert_eq!(first_turn_outcome(&c(false, false, None)), "no code");
        let items = [
            ("sft", "test", "compile error", false),
            ("sft", "test", "compile error", true),
            ("sft", "test", "passed", true),
            ("rl", "test", "compiled, failed", false),
            ("sft", "test", "compile error", false),
        ];
        let t = first_turn_table(&items);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].contains("first turn compiled, failed"), "{t}");
        assert_eq!(lines[2], "| sft | test | 1 (1.00) | - | 3 (0.33) | - |");
        assert_eq!(lines[3], "| rl | test | - | 1 (0.00) | - | - |");
        assert_eq!(first_turn_table(&[]), "");
    }

    #[test]
    fn pooled_steps_equal_the_pooled_episodes() {
        // Episodes {0, 1} and {1, 1, 1, 0}: 4 of 6 are 1.
        let steps = [(2.0, 0.5, 0.5), (4.0, 0.75, (0.75f64 * 0.25).sqrt())];
        let (m, se, n) = pooled(&steps);
        assert_eq!(n, 6.0);
        assert!((m - 4.0 / 6.0).abs() < 1e-12);
        let var = 4.0 / 6.0 * (2.0 / 6.0);
        assert!((se - (var / 6.0f64).sqrt()).abs() < 1e-12, "{se}");
        assert_eq!(pooled(&[]), (0.0, 0.0, 0.0));
    }

    #[test]
    fn whitened_advantages_have_zero_mean_and_unit_spread() {
        let w = whiten(&[1.0, 3.0]);
        assert!(
            (w[0] + 1.0).abs() < 1e-5 && (w[1] - 1.0).abs() < 1e-5,
            "{w:?}"
        );
        assert_eq!(whiten(&[2.0]), vec![0.0]);
        assert_eq!(geomean(&[2.0, 8.0]), Some(4.0));
        assert_eq!(geomean(&[]), None);
    }
}
