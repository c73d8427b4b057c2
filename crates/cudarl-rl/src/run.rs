//! One RL step's parts between the draw and the update: which tasks a step practises
//! ([`draw`]), the episodes of the policy on them ([`rollout`]), and the frozen control on the
//! same tasks and sampling seeds ([`control`]). `rl-train` runs them in its loop
//! (docs/architecture.md, "Training").

use std::time::Instant;

use cudarl_cuda::Verdict;
use cudarl_cuda::task::TaskSpec;

use crate::RlError;
use crate::episode::{Episode, EpisodeSettings, Policy, Tester, run_episodes};
use crate::harness::{Harness, HarnessUse};
use crate::kb_judge::KbJudge;
use crate::kernelbench::KbTask;
use crate::reward::RewardConfig;
use crate::step::{rates, splitmix};
use crate::trainer::{Sampling, TrainerClient};

/// Something that counts work done (a progress bar).
pub trait Counter {
    /// `n` more items are done.
    fn inc(&self, n: u64);
}

/// A counter that counts nothing.
pub struct NoCount;

impl Counter for NoCount {
    fn inc(&self, _: u64) {}
}

/// The counters a rollout moves: episodes finished, candidates judged.
#[derive(Clone, Copy)]
pub struct Bars<'a> {
    /// Episodes finished.
    pub episodes: &'a dyn Counter,
    /// Candidates judged.
    pub candidates: &'a dyn Counter,
}

/// No counters (the frozen control's rollouts).
pub const NO_BARS: Bars<'static> = Bars {
    episodes: &NoCount,
    candidates: &NoCount,
};

/// A tester that counts the candidates it judges.
struct Counted<'a, T: ?Sized> {
    inner: &'a mut dyn Tester<T>,
    bar: &'a dyn Counter,
}

impl<T: ?Sized> Tester<T> for Counted<'_, T> {
    fn test(&mut self, task: &T, code: &str) -> Result<(Verdict, Option<String>), RlError> {
        let r = self.inner.test(task, code);
        self.bar.inc(1);
        r
    }
    fn test_many(
        &mut self,
        items: &[(&T, &str)],
    ) -> Result<Vec<(Verdict, Option<String>)>, RlError> {
        let r = self.inner.test_many(items);
        self.bar.inc(items.len() as u64);
        r
    }
    fn prefetch(&mut self, task: &T, code: &str) {
        self.inner.prefetch(task, code);
    }
}

/// How a step draws its tasks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawSettings {
    /// Tasks per step (at least 1).
    pub tasks_per_step: usize,
    /// Episodes per task: the GRPO group.
    pub group_size: usize,
}

/// The step's tasks: `tasks_per_step` drawn from `pool` (fresh families in order, else a
/// seeded draw), each repeated `group_size` times; with `kb = (share, problems)`, each task is
/// instead a KernelBench problem from `problems` with probability `share` (a seeded draw; none
/// when `problems` is empty). Without `kb` the draw consumes `rng` exactly as before KernelBench
/// tasks existed, so runs without them repeat.
pub fn draw<'a, 'k>(
    p: DrawSettings,
    pool: &[&'a TaskSpec],
    kb: Option<(f64, &[&'k KbTask])>,
    (step, fresh): (usize, bool),
    rng: &mut u64,
) -> (Vec<&'a TaskSpec>, Vec<&'k KbTask>) {
    let per_step = p.tasks_per_step.max(1);
    let (mut families, mut problems) = (Vec::new(), Vec::new());
    for k in 0..per_step {
        if let Some((share, kbs)) = kb.filter(|(_, kbs)| !kbs.is_empty())
            && ((splitmix(rng) >> 11) as f64 / (1u64 << 53) as f64) < share
        {
            let t = kbs[(splitmix(rng) % kbs.len() as u64) as usize];
            problems.extend(std::iter::repeat_n(t, p.group_size));
            continue;
        }
        if pool.is_empty() {
            continue;
        }
        let t = if fresh {
            pool[((step - 1) * per_step + k) % pool.len()]
        } else {
            pool[(splitmix(rng) % pool.len() as u64) as usize]
        };
        families.extend(std::iter::repeat_n(t, p.group_size));
    }
    (families, problems)
}

/// Episodes of `policy` on the step's family `tasks` judged by `h`, then on its KernelBench
/// `problems` judged by `kb` (the sampling seeds run on across both), and the harness's use by
/// both (the KernelBench judge's seconds: its wall time less the policy's generation in it,
/// [`Policy::generation_seconds`]).
///
/// # Errors
/// The policy or a tester failed (its message).
pub fn rollout(
    policy: &mut dyn Policy,
    (h, kb): (&mut Harness, Option<&mut KbJudge>),
    (tasks, problems): (&[&TaskSpec], &[&KbTask]),
    (cfg, settings): (&RewardConfig, &EpisodeSettings),
    bars: Bars<'_>,
) -> Result<(Vec<Episode>, HarnessUse), RlError> {
    let m0 = h.mark();
    let mut eps = if tasks.is_empty() {
        Vec::new()
    } else {
        let mut t = Counted {
            inner: &mut *h,
            bar: bars.candidates,
        };
        run_episodes(tasks, policy, &mut t, cfg, settings)?
    };
    bars.episodes.inc(eps.len() as u64);
    let mut used = h.since(&m0);
    if let (false, Some(kb)) = (problems.is_empty(), kb) {
        let (u0, g0, t0) = (kb.used, policy.generation_seconds(), Instant::now());
        let mut t = Counted {
            inner: &mut *kb,
            bar: bars.candidates,
        };
        let more = run_episodes(problems, policy, &mut t, cfg, settings)?;
        bars.episodes.inc(more.len() as u64);
        eps.extend(more);
        let u = kb.used;
        used.candidates += u.candidates - u0.candidates;
        used.seconds += (t0.elapsed().as_secs_f64() - (policy.generation_seconds() - g0)).max(0.0);
        used.phases.compile += u.compile_seconds - u0.compile_seconds;
        used.phases.gpu += u.gpu_seconds - u0.gpu_seconds;
    }
    Ok((eps, used))
}

/// What the frozen control scored on a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControlOutcome {
    /// Mean final reward of its episodes.
    pub reward: f64,
    /// Compile rate of their best turns.
    pub compile_rate: f64,
    /// Pass rate (`None` without tests: compile-only).
    pub pass_rate: Option<f64>,
    /// Wall seconds it took.
    pub seconds: f64,
}

/// The frozen references on the step's tasks with sampling `sampling` (its seed the one the
/// policy started the step from: the same tasks and sampling seeds, no training). It samples
/// with a state of its own ([`TrainerClient::frozen`]), so the policy's seed sequence goes on
/// as without it.
///
/// # Errors
/// As [`rollout`].
pub fn control(
    tc: &mut TrainerClient,
    sampling: Sampling,
    testers: (&mut Harness, Option<&mut KbJudge>),
    tasks: (&[&TaskSpec], &[&KbTask]),
    run: (&RewardConfig, &EpisodeSettings),
) -> Result<ControlOutcome, RlError> {
    let t0 = Instant::now();
    let mut frozen = tc.frozen(sampling);
    let (ctl, _) = rollout(&mut frozen, testers, tasks, run, NO_BARS)?;
    let finals: Vec<f64> = ctl.iter().map(Episode::final_reward).collect();
    let (compile_rate, pass_rate) = rates(&ctl.iter().collect::<Vec<_>>());
    Ok(ControlOutcome {
        reward: crate::stats::mean_std(&finals).0,
        compile_rate,
        pass_rate,
        seconds: t0.elapsed().as_secs_f64(),
    })
}
