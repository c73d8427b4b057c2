//! Rejection sampling for cross-agent fine-tuning (`collab-data`, docs/architecture.md,
//! "Training"): which turns of the SFT agents' multi-turn episodes become SFT examples.
//! Rejection-sampling fine-tuning in the manner of STaR (Zelikman et al. 2022) and expert
//! iteration: keep what the harness verified, fine-tune on it.
//!
//! - A generator turn is kept when its kernel passed (honest: no hack flag).
//! - An optimizer turn is kept when it repaired the kernel it was given (that turn failed, this
//!   one passed) or sped it up (both passed, this one at least `min_speedup` times the given
//!   kernel's speedup over the naive kernel).
//!
//! Without a GPU (compile-only verdicts, `correct` unknown) "passed" reads "compiled": a
//! generator turn that compiled, an optimizer turn that compiled where the kernel it was given
//! did not. The rows say which (`mode`).

use std::collections::{BTreeMap, BTreeSet};

use cudarl_curriculum::prompts::ChatMessage;

use crate::episode::{Episode, Turn};
use crate::reward::RewardComponents;
use cudarl_protocol::Role;

/// Why a turn was kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A generator turn that passed.
    Correct,
    /// An optimizer turn that passed where the kernel it was given failed.
    Repair,
    /// An optimizer turn faster than the correct kernel it was given.
    Speedup,
}

impl Kind {
    /// The name in the tables (`sft_optimizer.kind` is `collab:<name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Correct => "correct",
            Kind::Repair => "repair",
            Kind::Speedup => "speedup",
        }
    }
}

/// A kept turn: an SFT example of its agent.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The task.
    pub task_id: String,
    /// Its tier.
    pub tier: i64,
    /// The agent that wrote it.
    pub role: Role,
    /// Why it was kept.
    pub kind: Kind,
    /// The conversation: the turn's prompt and its answer as the assistant's message.
    pub messages: Vec<ChatMessage>,
    /// The turn's kernel source.
    pub code: String,
    /// The kernel it was given (optimizer turns).
    pub given: Option<String>,
    /// Speedup over the given kernel (speed-ups; both timed against the same naive kernel).
    pub speedup: Option<f64>,
    /// The turn's reward.
    pub reward: f64,
}

/// Settings of [`select`].
#[derive(Debug, Clone, Copy)]
pub struct Selection {
    /// Kept turns per task and agent at most (the highest rewards; one per distinct kernel).
    pub per_task: usize,
    /// An optimizer turn is a speed-up at this ratio to the kernel it was given or above.
    pub min_speedup: f64,
}

/// Whether a verdict counts as passed: correct and unflagged, or in compile-only mode compiled
/// and unflagged.
fn passed(r: &RewardComponents) -> bool {
    match r.correct {
        Some(_) => r.honest_pass(),
        None => r.compiled && r.hack_flags.is_empty(),
    }
}

/// Why turn `t` is worth keeping, if it is, with its speedup over the kernel it was `given`
/// (speed-ups).
fn verdict(t: &Turn, given: Option<&Turn>, min_speedup: f64) -> Option<(Kind, Option<f64>)> {
    if t.code.is_none() || !passed(&t.reward) {
        return None;
    }
    let Some(given) = given else {
        return (t.role == Role::Generator).then_some((Kind::Correct, None));
    };
    if !passed(&given.reward) {
        return Some((Kind::Repair, None));
    }
    let (Some(a), Some(b)) = (t.reward.speedup, given.reward.speedup) else {
        return None;
    };
    (b > 0.0 && a / b >= min_speedup).then_some((Kind::Speedup, Some(a / b)))
}

/// The turns of `episodes` worth fine-tuning on, per task and agent at most `per_task`
/// (highest reward first, one per distinct kernel), in task order then agent then rank.
pub fn select(episodes: &[Episode], s: &Selection) -> Vec<Kept> {
    let mut by: BTreeMap<(String, u8), Vec<Kept>> = BTreeMap::new();
    for e in episodes {
        for (k, t) in e.turns.iter().enumerate() {
            // The kernel it was given: the last earlier turn with code (the optimizer's prompt).
            let given = e.turns[..k].iter().rev().find(|g| g.code.is_some());
            let Some((kind, speedup)) = verdict(t, given, s.min_speedup) else {
                continue;
            };
            let code = t.code.clone().expect("a kept turn has code");
            let given = given.and_then(|g| g.code.clone());
            let mut messages = t.prompt.clone();
            messages.push(ChatMessage::new("assistant", t.text.clone()));
            let agent = u8::from(t.role != Role::Generator);
            by.entry((e.task_id.clone(), agent))
                .or_default()
                .push(Kept {
                    task_id: e.task_id.clone(),
                    tier: e.tier,
                    role: t.role,
                    kind,
                    messages,
                    code,
                    given,
                    speedup,
                    reward: t.reward.reward,
                });
        }
    }
    let mut out = Vec::new();
    for (_, mut v) in by {
        v.sort_by(|a, b| b.reward.total_cmp(&a.reward));
        let mut seen = BTreeSet::new();
        out.extend(
            v.into_iter()
                .filter(|k| seen.insert(*blake3::hash(k.code.as_bytes()).as_bytes()))
                .take(s.per_task),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::episode::{EpisodeSettings, Policy, Tester, run_episodes};
    use crate::reward::RewardConfig;
    use cudarl_cuda::TaskSpec;
    use cudarl_cuda::verdict::Verdict;
    use std::path::Path;

    /// Answers in order with fixed texts.
    struct Scripted(Vec<String>);

    impl Policy for Scripted {
        fn answer(
            &mut self,
            ask: crate::episode::Ask<'_>,
            on_finish: &mut dyn FnMut(usize, &str),
        ) -> Result<Vec<crate::episode::Answer>, crate::RlError> {
            let c = ask.conversations;
            Ok((0..c.len())
                .map(|i| {
                    let text = self.0.remove(0);
                    on_finish(i, &text);
                    crate::episode::Answer {
                        id: None,
                        text,
                        tokens: 1,
                        value: None,
                    }
                })
                .collect())
        }
    }

    /// Judges a kernel by its marker: `// wrong` fails its tests, `// fast X` passes at X times
    /// the naive kernel; `flagged` anywhere passes with a hack flag.
    struct Marked;

    impl Tester for Marked {
        fn test(
            &mut self,
            _t: &TaskSpec,
            code: &str,
        ) -> Result<(Verdict, Option<String>), crate::RlError> {
            let ok = !code.contains("// wrong");
            let mut v = crate::reward::tests::verdict("full", true, Some(ok));
            v.tests = crate::reward::tests::tests(4, if ok { 4 } else { 0 });
            if !ok {
                v.failure = Some("wrong_output".into());
            }
            if code.contains("flagged") {
                v.hack_flags = vec!["too_fast".into()];
            }
            v.speedup_vs_naive = code
                .split("// fast ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next()?.parse().ok());
            Ok((v, None))
        }
    }

    #[test]
    fn keeps_correct_generator_turns_repairs_and_speedups_and_rejects_breakage() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let task = TaskSpec::load(&root.join("datasets/tasks/vector_add")).unwrap();
        // Episodes never stop early here: a turn limit of 3 and no stop rule.
        let mut cfg = RewardConfig::load(
            &root.join("configs/reward/default.toml"),
            "configs/reward/default.toml",
        )
        .unwrap();
        (cfg.stop_speedup, cfg.stop_above) = (None, None);
        let k = |m: &str| {
            cudarl_curriculum::prompts::fenced(&format!("__global__ void k() {{}} // {m}\n"))
        };
        // Episode 0: wrong -> repaired (fast 1.0) -> sped up (fast 2.0).
        // Episode 1: correct (fast 1.0) -> broken -> flagged.
        // Episode 2: correct (fast 1.0) -> barely faster (1.05) -> no code.
        let turn0 = [k("wrong"), k("fast 1.0 a"), k("fast 1.0 b")];
        let turn1 = [k("fast 1.0 c"), k("wrong x"), k("fast 1.05")];
        let turn2 = [
            k("fast 2.0"),
            k("fast 3.0 flagged"),
            "no code here".to_string(),
        ];
        let answers = turn0.into_iter().chain(turn1).chain(turn2).collect();
        let s = EpisodeSettings {
            max_turns: 3,
            public_seeds: vec![0],
        };
        let eps = run_episodes(
            &[&task, &task, &task],
            &mut Scripted(answers),
            &mut Marked,
            &cfg,
            &s,
        )
        .unwrap();
        let kept = select(
            &eps,
            &Selection {
                per_task: 8,
                min_speedup: 1.1,
            },
        );
        let got: Vec<(Role, Kind, Option<f64>)> =
            kept.iter().map(|k| (k.role, k.kind, k.speedup)).collect();
        assert_eq!(
            got,
            vec![
                (Role::Generator, Kind::Correct, None),
                (Role::Generator, Kind::Correct, None),
                (Role::Optimizer, Kind::Speedup, Some(2.0)),
                (Role::Optimizer, Kind::Repair, None),
            ],
            "{:#?}",
            kept.iter().map(|k| (&k.code, &k.given)).collect::<Vec<_>>()
        );
        // The repair's kernel was given the broken one; every example is the turn's own
        // conversation closed by its answer.
        let repair = kept.iter().find(|k| k.kind == Kind::Repair).unwrap();
        assert!(repair.given.as_deref().unwrap().contains("// wrong"));
        for k in &kept {
            let roles: Vec<&str> = k.messages.iter().map(|m| m.role.as_str()).collect();
            assert_eq!(roles, ["system", "user", "assistant"]);
            assert!(k.messages[2].content.contains(&k.code));
        }
        // One per task and agent: the highest reward (the 2.0x speed-up over the repair).
        let one = select(
            &eps,
            &Selection {
                per_task: 1,
                min_speedup: 1.1,
            },
        );
        let opt: Vec<Kind> = one
            .iter()
            .filter(|k| k.role == Role::Optimizer)
            .map(|k| k.kind)
            .collect();
        assert_eq!(opt, [Kind::Speedup]);
        assert_eq!(one.len(), 2);
    }
}
