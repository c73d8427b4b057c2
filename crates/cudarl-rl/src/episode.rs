//! Multi-turn episodes (docs/architecture.md, "Training"): the generator writes a kernel for a
//! task, the tester (the harness: static rules, nvcc, tests and timing on a GPU) turns the verdict
//! into feedback text, the optimizer revises, the tester again, up to `max_turns`, stopping early
//! at the reward config's stop condition ([`RewardConfig::stops`]: by default, the first turn
//! whose kernel passes every test and is at least as fast as the naive kernel).
//!
//! Per episode the conversation state keeps a compilation cache (an identical resubmission is
//! not rebuilt and is called out), the performance trajectory, the failed attempts and the
//! optimization strategies already tried, and the optimizer is told which ones not to repeat.
//!
//! Policies are behind [`Policy`] (the trainer process during RL, fixed answers in tests), the
//! harness behind [`Tester`].

use std::collections::BTreeMap;

use cudarl_cuda::Verdict;
use cudarl_cuda::task::TaskSpec;
use cudarl_curriculum::prompts::{self, ChatMessage, TaskView};
use cudarl_lex::c::strip_comments_and_strings as strip_c;
use cudarl_protocol::Role;
use cudarl_tables::turns::TurnColumns;
use serde::{Deserialize, Serialize};

use crate::RlError;
use crate::credit::turn_credits;
use crate::reward::{RewardComponents, RewardConfig, score};

/// One sampled answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The trainer's id of the completion (for the update), if any.
    pub id: Option<u64>,
    /// The text.
    pub text: String,
    /// Generated tokens.
    pub tokens: usize,
    /// PPO: the critic's value estimate of the conversation's state (reward units).
    pub value: Option<f64>,
}

/// What one agent is asked at once: a conversation per episode, and each one's launcher
/// declaration.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The agent that answers.
    pub role: Role,
    /// One conversation per episode, in order.
    pub conversations: &'a [Vec<ChatMessage>],
    /// `launchers[i]`: the launcher declaration conversation `i` asks for (its task's
    /// signature, `extern "C" void launch(...)`), which a policy may hold its answer to (the
    /// trainer's constrained decoding, [`crate::trainer::Sampling::constrain_launcher`]). As
    /// many as `conversations`.
    pub launchers: &'a [String],
}

/// Something that answers conversations.
pub trait Policy {
    /// One answer per conversation of `ask`, in order, calling `on_finish(i, text)` once answer
    /// `i` is known (a streaming policy calls it while the others are still being generated, so
    /// their kernels compile meanwhile).
    ///
    /// # Errors
    /// Whatever the policy fails with, in words.
    fn answer(
        &mut self,
        ask: Ask<'_>,
        on_finish: &mut dyn FnMut(usize, &str),
    ) -> Result<Vec<Answer>, RlError>;

    /// Seconds spent generating so far, by the generator's own clock (0 for a policy that
    /// does not keep one): what a rollout subtracts from its wall time to get the judges'.
    fn generation_seconds(&self) -> f64 {
        0.0
    }
}

/// A task an episode runs on: its id, its tier, and how the prompts show it. Synthetic task
/// families ([`TaskSpec`]) and KernelBench problems with a native launcher
/// ([`crate::kernelbench::KbTask`]) are episode tasks.
pub trait EpisodeTask {
    /// The task's id (an episode's `task_id`).
    fn id(&self) -> &str;
    /// Its curriculum tier (0..3).
    fn tier(&self) -> i64;
    /// What the prompts show: the description, element type, launcher and example shapes.
    fn text(&self) -> TaskText;
}

/// A task as the prompts show it (owned; [`TaskText::view`] borrows it as a
/// [`TaskView`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskText {
    /// Tier 0..3.
    pub tier: i64,
    /// What `launch` computes.
    pub description: String,
    /// Element type (`f32`, `f16`, `bf16`).
    pub dtype: String,
    /// The exact launcher declaration.
    pub signature: String,
    /// Example shapes (JSON objects of sizes), possibly none.
    pub shapes: Vec<String>,
}

impl TaskText {
    /// The text of a task given as a KernelBench-style PyTorch module `source` (its `Model`,
    /// constants and `get_inputs`): the description read from the module, and no example
    /// shapes (the module's constants are one).
    pub fn of_module(tier: i64, source: &str, dtype: String, signature: String) -> TaskText {
        TaskText {
            tier,
            description: prompts::module_description(source),
            dtype,
            signature,
            shapes: vec![],
        }
    }

    /// The prompt view of this text.
    pub fn view(&self) -> TaskView<'_> {
        TaskView {
            tier: self.tier,
            description: &self.description,
            dtype: &self.dtype,
            signature: &self.signature,
            shapes: &self.shapes,
        }
    }
}

impl EpisodeTask for TaskSpec {
    fn id(&self) -> &str {
        &self.id
    }
    fn tier(&self) -> i64 {
        self.tier
    }
    /// The task in the task language: its KernelBench-style module
    /// ([`TaskSpec::problem_source`]), the launcher, and no example shapes (the module's
    /// constants are one).
    fn text(&self) -> TaskText {
        TaskText::of_module(
            self.tier,
            &self.problem_source(),
            self.dtype.clone(),
            self.signature(),
        )
    }
}

/// Something that judges kernels for tasks of type `T`: the harness (task families), the
/// KernelBench judge (problems).
pub trait Tester<T: ?Sized = TaskSpec> {
    /// The verdict on `code` for `task` and, when available, the SASS of its shared object.
    ///
    /// # Errors
    /// Harness failures (not candidate failures), in words.
    fn test(&mut self, task: &T, code: &str) -> Result<(Verdict, Option<String>), RlError>;
    /// Judges many (task, code) pairs; the default calls [`Tester::test`] in order. The
    /// harness overrides it to compile on every core while the GPU runs.
    ///
    /// # Errors
    /// As [`Tester::test`].
    fn test_many(
        &mut self,
        items: &[(&T, &str)],
    ) -> Result<Vec<(Verdict, Option<String>)>, RlError> {
        items.iter().map(|(t, c)| self.test(t, c)).collect()
    }
    /// A hint that `code` for `task` will be tested soon: the harness starts compiling it in
    /// the background (the later test waits for that build instead of starting its own). The
    /// default does nothing.
    fn prefetch(&mut self, _task: &T, _code: &str) {}
}

/// Optimization strategies recognized in a kernel's code (comments and strings stripped).
pub fn strategies(code: &str) -> Vec<&'static str> {
    let s = strip_c(code);
    let c: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    let mut v = Vec::new();
    let has = |p: &str| c.contains(p);
    if has("__shared__") {
        v.push("shared-memory tiling");
    }
    if has("__shfl_") {
        v.push("warp shuffles");
    }
    if ["float4", "float2", "__half2", "__nv_bfloat162", "int4"]
        .iter()
        .any(|t| has(t))
    {
        v.push("vectorized access");
    }
    if has("#pragmaunroll") {
        v.push("loop unrolling");
    }
    if has("+=blockDim.x*gridDim.x") || has("+=gridDim.x*blockDim.x") {
        v.push("grid-stride loop");
    }
    if has("wmma::") || has("mma.sync") {
        v.push("tensor cores");
    }
    if has("__ldg(") || has("const__restrict__") {
        v.push("read-only cache");
    }
    v
}

/// One turn, as stored in the per-turn table (and in `rl-train`'s saved progress).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Turn {
    /// 0-based turn.
    pub turn: usize,
    /// Who wrote it.
    pub role: Role,
    /// The trainer's completion id.
    #[serde(skip)]
    pub completion: Option<u64>,
    /// Generated tokens.
    pub tokens: usize,
    /// The answer as generated.
    pub text: String,
    /// The extracted code.
    pub code: Option<String>,
    /// The harness's failure class (`no_code` when there was no code block).
    pub failure: Option<String>,
    /// The tester's feedback.
    pub feedback: String,
    /// Every reward component.
    pub reward: RewardComponents,
    /// Credit assigned for training.
    pub credit: f64,
    /// PPO: the critic's value estimate before the turn.
    pub value: Option<f64>,
    /// The conversation the turn answered (system and user messages): with `text` as the
    /// assistant's message, an SFT example of the turn (`collab-data`). Not saved with a run's
    /// progress.
    #[serde(skip)]
    pub prompt: Vec<ChatMessage>,
}

impl Turn {
    /// This turn as the columns of a `turns` table, for a task `task_id` on `tier`, trained
    /// with `advantage` (0 where nothing trains).
    pub fn columns(&self, task_id: &str, tier: i64, advantage: f64) -> TurnColumns {
        TurnColumns {
            turn: self.turn as i64,
            task_id: task_id.to_string(),
            tier,
            role: self.role.as_str().to_string(),
            tokens: self.tokens as i64,
            text: self.text.clone(),
            code: self.code.clone(),
            failure: self.failure.clone(),
            feedback: self.feedback.clone(),
            reward: self.reward.reward,
            credit: self.credit,
            advantage,
            value: self.value,
            components_json: serde_json::to_string(&self.reward).expect("components serialize"),
        }
    }
}

/// One episode's state.
#[derive(Debug, Clone, Serialize)]
pub struct Episode {
    /// The task.
    pub task_id: String,
    /// Its tier.
    pub tier: i64,
    /// Turns taken.
    pub turns: Vec<Turn>,
    /// Compilation cache: code hash -> index of the turn that first submitted it.
    #[serde(skip)]
    pub seen: BTreeMap<[u8; 32], usize>,
    /// Performance trajectory: (turn, speedup vs naive) of the correct turns.
    pub trajectory: Vec<(usize, f64)>,
    /// Failed attempts: (turn, failure class).
    pub failed: Vec<(usize, String)>,
    /// Strategies tried so far.
    pub tried: Vec<String>,
    /// Finished (reward passed the stop threshold or the turn limit reached).
    pub done: bool,
}

impl Episode {
    fn new<T: EpisodeTask + ?Sized>(task: &T) -> Episode {
        Episode {
            task_id: task.id().to_string(),
            tier: task.tier(),
            turns: vec![],
            seen: BTreeMap::new(),
            trajectory: vec![],
            failed: vec![],
            tried: vec![],
            done: false,
        }
    }

    /// The episode's result: its best turn (highest reward; on equal rewards a correct kernel,
    /// then a compiled one, then one with code; the earliest on full ties). The tester
    /// verified every turn, so what an episode hands back is its best verified kernel, not
    /// whatever the last revision was (a revision that breaks a correct kernel does not undo
    /// it; it earns its own low immediate reward instead). Under the gated reward every
    /// failing turn scores 0: without the tie-break an episode whose first turn failed to
    /// compile and whose revision compiled (still wrong) handed back the compile error, and
    /// the multi-turn compile rate was the first turn's.
    pub fn best_turn(&self) -> Option<&Turn> {
        let key = |t: &Turn| (t.reward.honest_pass(), t.reward.compiled, t.reward.has_code);
        self.turns.iter().reduce(|a, b| {
            let order = b.reward.reward.total_cmp(&a.reward.reward);
            if order.then_with(|| key(b).cmp(&key(a))).is_gt() {
                b
            } else {
                a
            }
        })
    }

    /// Reward components of the first turn (single-turn results; default when no turn).
    pub fn first_components(&self) -> RewardComponents {
        self.turns
            .first()
            .map(|t| t.reward.clone())
            .unwrap_or_default()
    }

    /// Reward components of the best turn (the episode's result; default when no turn).
    pub fn best_components(&self) -> RewardComponents {
        self.best_turn()
            .map(|t| t.reward.clone())
            .unwrap_or_default()
    }

    /// Whether any turn's verdict carried a hack flag.
    pub fn flagged(&self) -> bool {
        self.turns.iter().any(|t| !t.reward.hack_flags.is_empty())
    }

    /// The final reward `R` of the turn credit: the best turn's reward (0 without turns).
    pub fn final_reward(&self) -> f64 {
        self.best_turn().map_or(0.0, |t| t.reward.reward)
    }

    /// The last code submitted (for the optimizer's prompt).
    fn last_code(&self) -> Option<&str> {
        self.turns.iter().rev().find_map(|t| t.code.as_deref())
    }
}

/// The generator's conversation for `task` (the RL prompt: the first intro and closing).
pub fn generator_conversation(task: &TaskSpec) -> Vec<ChatMessage> {
    generator_conversation_phrased(task, 0, 0)
}

/// The generator's conversation for `task` with phrasing variant `intro` / `closing` (indices
/// modulo [`prompts::INTROS`] / [`prompts::CLOSINGS`]): system prompt, then the task prompt
/// (the task's module and its launcher, [`EpisodeTask::text`]).
pub fn generator_conversation_phrased(
    task: &TaskSpec,
    intro: usize,
    closing: usize,
) -> Vec<ChatMessage> {
    generator_messages(&task.text().view(), intro, closing)
}

/// The generator's conversation for a task shown as `view`: system prompt, then the task prompt
/// with phrasing variant `intro` / `closing`.
pub fn generator_messages(view: &TaskView<'_>, intro: usize, closing: usize) -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", prompts::GENERATOR_SYSTEM),
        ChatMessage::new("user", prompts::task_prompt(view, intro, closing)),
    ]
}

/// The tester's feedback on a validated kernel, from its `validations` row `v` (column name ->
/// value): compiled, the tests passed, the median time (ms) with the speedup over the PyTorch
/// reference and the fraction of peak DRAM bandwidth when it ran on a GPU, and its registers,
/// shared memory and spills. Missing numbers read as 0.
pub fn validation_feedback(v: &BTreeMap<&str, serde_json::Value>) -> String {
    use serde_json::Value;
    let num = |k: &str| v.get(k).and_then(Value::as_f64);
    let int = |k: &str| v.get(k).and_then(Value::as_i64);
    let mut lines = vec!["compiled: yes".to_string()];
    match (v.get("executed").and_then(Value::as_bool), num("median_ms")) {
        (Some(true), Some(ms)) => {
            lines.push(format!(
                "tests: {}/{} passed (train and hold-out shapes, public and hidden seeds)",
                int("tests_passed").unwrap_or(0),
                int("tests").unwrap_or(0)
            ));
            let mut t = format!("median time: {ms:.4} ms");
            if let Some(s) = num("speedup_vs_torch") {
                t.push_str(&format!(", {s:.2}x the PyTorch reference"));
            }
            if let Some(d) = num("dram_fraction_of_peak") {
                t.push_str(&format!(", {:.0}% of peak DRAM bandwidth", d * 100.0));
            }
            lines.push(t);
        }
        _ => lines.push("not run: compile-only (no GPU on the validating machine)".into()),
    }
    lines.push(format!(
        "resources: {} registers/thread, {} B shared memory/block, {} B spilled",
        int("registers").unwrap_or(0),
        int("shared_mem_bytes").unwrap_or(0),
        int("spill_bytes").unwrap_or(0)
    ));
    lines.join("\n")
}

/// The tester's feedback on one verdict for a task of `tier`, in words: what failed and where (compile errors with
/// their lines, the failing test's split, shape and error; hidden seeds are not shown), or the
/// timing and resource findings (spills, register pressure, shared memory, uncoalesced access).
pub fn feedback(
    tier: i64,
    code: Option<&str>,
    verdict: Option<&Verdict>,
    public_seeds: &[u64],
) -> String {
    let (Some(code), Some(v)) = (code, verdict) else {
        return "No code block found. Answer with one ```cuda code block holding the whole .cu file (kernels and the extern \"C\" launcher).".into();
    };
    let mut out = outcome_lines(v, public_seeds);
    for f in &v.hack_flags {
        out.push(format!(
            "Flagged as a reward hack ({f}): {}. A flagged kernel earns no reward.",
            cudarl_cuda::verdict::hack_flag_reason(f)
        ));
    }
    if v.compiled {
        out.extend(resource_lines(tier, code, v));
    }
    out.join("\n")
}

/// The feedback lines on the verdict's outcome: the static reject, the compile errors, the
/// failing test, or that every test passed with the timing (public seeds in `public_seeds`).
fn outcome_lines(v: &Verdict, public_seeds: &[u64]) -> Vec<String> {
    match v.failure.as_deref() {
        Some("static_reject") => vec![format!(
            "Rejected before compiling: {}.",
            v.failure_detail.clone().unwrap_or_default()
        )],
        Some("compile_error") | Some("compile_timeout") => compile_error_lines(v),
        Some(f) => vec![test_failure_line(v, f, public_seeds)],
        None if v.mode == "full" => vec![passed_line(v)],
        None => vec![
            "Compiled (compile-only: no GPU on this machine, so the tests did not run).".into(),
        ],
    }
}

/// The feedback lines on a failed build: the first five compiler errors with their lines, else
/// the first five lines of the failure's detail.
fn compile_error_lines(v: &Verdict) -> Vec<String> {
    let mut out = vec!["Compilation failed:".to_string()];
    let errs: Vec<String> = v
        .diagnostics
        .iter()
        .filter(|d| d.severity.contains("error"))
        .take(5)
        .map(|d| match d.line {
            Some(l) => format!("  line {l}: error: {}", d.message),
            None => format!("  error: {}", d.message),
        })
        .collect();
    if errs.is_empty() {
        out.push(format!(
            "  {}",
            v.failure_detail
                .clone()
                .unwrap_or_default()
                .lines()
                .take(5)
                .collect::<Vec<_>>()
                .join("\n  ")
        ));
    } else {
        out.extend(errs);
    }
    out
}

/// The feedback line on a kernel that compiled but failed with `failure`: how many tests
/// failed and the first failing test's split, shape and error (its seed only when it is one of
/// `public_seeds`), else the failure's detail.
fn test_failure_line(v: &Verdict, failure: &str, public_seeds: &[u64]) -> String {
    let t = v.tests.iter().find(|t| !t.passed);
    let which = t.map(|t| {
        let seed = if public_seeds.contains(&t.seed) {
            format!("seed {}", t.seed)
        } else {
            "a hidden seed".into()
        };
        format!(
            " on the {} shape {} ({seed}): {}",
            t.split,
            serde_json::to_string(&t.sizes).unwrap_or_default(),
            t.message.clone().unwrap_or_default()
        )
    });
    let n_fail = v.tests.iter().filter(|t| !t.passed).count();
    match which {
        Some(w) => format!(
            "Compiled, but {n_fail} of {} tests failed ({failure}){w}.",
            v.tests.len()
        ),
        None => format!(
            "Compiled, but it failed: {failure}: {}.",
            v.failure_detail.clone().unwrap_or_default()
        ),
    }
}

/// The feedback line on a kernel that passed every test: the median time (ms) and the speedups
/// over the naive kernel and PyTorch and the fraction of peak DRAM bandwidth, where measured.
fn passed_line(v: &Verdict) -> String {
    let mut s = format!(
        "All {} tests passed (train and hold-out shapes, public and hidden seeds).",
        v.tests.len()
    );
    if let Some(t) = &v.timing {
        s.push_str(&format!(" Median time {:.4} ms", t.median_ms));
        if let Some(x) = v.speedup_vs_naive {
            s.push_str(&format!(", {x:.2}x the naive kernel"));
        }
        if let Some(x) = v.speedup_vs_torch {
            s.push_str(&format!(", {x:.2}x PyTorch"));
        }
        if let Some(f) = v.dram_fraction_of_peak {
            s.push_str(&format!(", {:.0}% of peak DRAM bandwidth", 100.0 * f));
        }
        s.push('.');
    }
    s
}

/// The feedback lines on a compiled kernel's resources: register spills, register pressure
/// (over 128 per thread), static shared memory over 48 KiB per block, and for tiers 0 and 1
/// global accesses in `code` that may be uncoalesced.
fn resource_lines(tier: i64, code: &str, v: &Verdict) -> Vec<String> {
    let mut out = Vec::new();
    for r in &v.resources {
        let name = r.kernel.as_str();
        if r.spill_store_bytes > 0 || r.spill_load_bytes > 0 {
            out.push(format!(
                "Kernel {name} spills registers ({} bytes stores, {} bytes loads): reduce live values.",
                r.spill_store_bytes, r.spill_load_bytes
            ));
        }
        if r.registers > 128 {
            out.push(format!(
                "Kernel {name} uses {} registers per thread: occupancy is limited to {} warps per SM.",
                r.registers,
                (65536 / (r.registers.max(1) * 32)).min(64)
            ));
        }
        if r.shared_mem_bytes > 49152 {
            out.push(format!(
                "Kernel {name} uses {} bytes of static shared memory per block (over 48 KiB).",
                r.shared_mem_bytes
            ));
        }
    }
    let (_, coalesced) = crate::reward::source_features(code);
    if !coalesced && tier <= 1 {
        out.push("Global accesses may be uncoalesced: index with blockIdx.x * blockDim.x + threadIdx.x so neighbouring threads touch neighbouring addresses.".into());
    }
    out
}

/// Settings of a batch of episodes.
#[derive(Debug, Clone)]
pub struct EpisodeSettings {
    /// Most turns per episode (generator turn included).
    pub max_turns: usize,
    /// Public seeds (shown in feedback).
    pub public_seeds: Vec<u64>,
}

/// The optimizer's conversation for the next turn of `e` on `task`: its last kernel and the
/// tester's feedback, with the strategies already tried and the best speedup so far.
fn optimizer_conversation<T: EpisodeTask + ?Sized>(task: &T, e: &Episode) -> Vec<ChatMessage> {
    let text = task.text();
    let last = e.turns.last().expect("a previous turn");
    let mut fb = last.feedback.clone();
    if !e.tried.is_empty() {
        fb.push_str(&format!(
            "\nStrategies already tried: {}. Try a different one.",
            e.tried.join(", ")
        ));
    }
    if let Some(&(t, x)) = e.trajectory.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
        fb.push_str(&format!(
            "\nBest so far: turn {}, {x:.2}x the naive kernel.",
            t + 1
        ));
    }
    let current = e.last_code().unwrap_or("");
    vec![
        ChatMessage::new("system", prompts::OPTIMIZER_SYSTEM),
        ChatMessage::new(
            "user",
            prompts::optimizer_prompt(&text.view(), current, &fb, 0, 0),
        ),
    ]
}

/// Runs one episode per entry of `tasks` (repeat a task for a group) to completion, all turns
/// batched: every active episode's turn goes to the policy in one call and to the tester in
/// one call. Credits are filled in with the config's turn credit.
///
/// # Errors
/// Policy or harness failures.
pub fn run_episodes<T: EpisodeTask + ?Sized>(
    tasks: &[&T],
    policy: &mut dyn Policy,
    tester: &mut dyn Tester<T>,
    cfg: &RewardConfig,
    s: &EpisodeSettings,
) -> Result<Vec<Episode>, RlError> {
    let mut eps: Vec<Episode> = tasks.iter().map(|t| Episode::new(*t)).collect();
    for turn in 0..s.max_turns.max(1) {
        let active: Vec<usize> = (0..eps.len()).filter(|&i| !eps[i].done).collect();
        if active.is_empty() {
            break;
        }
        let role = if turn == 0 {
            Role::Generator
        } else {
            Role::Optimizer
        };
        let round = Round {
            tasks,
            active: &active,
            turn,
            role,
            cfg,
            s,
        };
        round.run(policy, tester, &mut eps)?;
    }
    assign_credits(&mut eps, cfg);
    Ok(eps)
}

/// One turn of a batch of episodes: the tasks, the indices of the episodes still running, the
/// turn (0-based), who answers it, the reward config and the settings.
struct Round<'a, T: ?Sized> {
    /// The task of each episode.
    tasks: &'a [&'a T],
    /// Indices of the episodes not done, in order.
    active: &'a [usize],
    /// The turn, 0-based.
    turn: usize,
    /// Who answers: the generator on turn 0, the optimizer after.
    role: Role,
    /// The reward config (scores, stop condition).
    cfg: &'a RewardConfig,
    /// The batch's settings.
    s: &'a EpisodeSettings,
}

/// What the tester made of one turn's candidates, by position among the active episodes.
struct Judged {
    /// Position -> the earlier turn of its episode that submitted the same code.
    repeat: BTreeMap<usize, usize>,
    /// Position -> the verdict and SASS of its candidate, where it was tested.
    verdicts: BTreeMap<usize, (Verdict, Option<String>)>,
}

/// A turn's answer as scored: its reward components, the tester's feedback and the failure class.
struct Assessed {
    /// Every reward component.
    reward: RewardComponents,
    /// The tester's feedback.
    feedback: String,
    /// The failure class (`no_code` without code).
    failure: Option<String>,
}

/// BLAKE3 of a kernel's code (the key of [`Episode::seen`]).
fn code_hash(code: &str) -> [u8; 32] {
    *blake3::hash(code.as_bytes()).as_bytes()
}

impl<T: EpisodeTask + ?Sized> Round<'_, T> {
    /// Runs the turn on `eps`: the active episodes' conversations to the policy, their new
    /// kernels to the tester, and each answer scored and recorded in its episode.
    fn run(
        &self,
        policy: &mut dyn Policy,
        tester: &mut dyn Tester<T>,
        eps: &mut [Episode],
    ) -> Result<(), RlError> {
        let mut convs = self.conversations(eps);
        let answers = self.answer(policy, tester, eps, &convs)?;
        let codes: Vec<Option<String>> = answers
            .iter()
            .map(|a| prompts::extract_code(&a.text))
            .collect();
        let judged = self.judge(tester, eps, &codes)?;
        for (k, &i) in self.active.iter().enumerate() {
            let code = codes[k].clone();
            let e = &mut eps[i];
            let x = self.assess(self.tasks[i], e, code.as_deref(), &judged, k);
            self.record(e, &answers[k], code, std::mem::take(&mut convs[k]), x);
        }
        Ok(())
    }

    /// The conversation of each active episode: the generator's on the first turn, the
    /// optimizer's after.
    fn conversations(&self, eps: &[Episode]) -> Vec<Vec<ChatMessage>> {
        self.active
            .iter()
            .map(|&i| {
                if self.turn == 0 {
                    generator_messages(&self.tasks[i].text().view(), 0, 0)
                } else {
                    optimizer_conversation(self.tasks[i], &eps[i])
                }
            })
            .collect()
    }

    /// The policy's answers to `convs`, one per active episode; each new kernel goes to the
    /// tester's compiler as soon as its answer is finished.
    fn answer(
        &self,
        policy: &mut dyn Policy,
        tester: &mut dyn Tester<T>,
        eps: &[Episode],
        convs: &[Vec<ChatMessage>],
    ) -> Result<Vec<Answer>, RlError> {
        let (tasks, active) = (self.tasks, self.active);
        // Kernels go to the harness's compiler as soon as each answer is finished.
        // (Not code the episode already submitted: that is answered from its earlier turn.)
        let launchers: Vec<String> = active.iter().map(|&i| tasks[i].text().signature).collect();
        let ask = Ask {
            role: self.role,
            conversations: convs,
            launchers: &launchers,
        };
        let answers = policy.answer(ask, &mut |k, text| {
            if let (Some(&i), Some(c)) = (active.get(k), prompts::extract_code(text))
                && !eps[i].seen.contains_key(&code_hash(&c))
            {
                tester.prefetch(tasks[i], &c);
            }
        })?;
        if answers.len() != active.len() {
            return Err(RlError::Failed(format!(
                "policy answered {} of {} conversations",
                answers.len(),
                active.len()
            )));
        }
        Ok(answers)
    }

    /// Tests the code of `codes` (one per active episode) that its episode has not submitted
    /// before; the rest are repeats of an earlier turn.
    fn judge(
        &self,
        tester: &mut dyn Tester<T>,
        eps: &[Episode],
        codes: &[Option<String>],
    ) -> Result<Judged, RlError> {
        // Only code not seen before in its episode goes to the harness.
        let mut to_test: Vec<(usize, &T, &str)> = Vec::new();
        let mut repeat: BTreeMap<usize, usize> = BTreeMap::new();
        for (k, &i) in self.active.iter().enumerate() {
            if let Some(c) = &codes[k] {
                match eps[i].seen.get(&code_hash(c)) {
                    Some(&prev) => {
                        repeat.insert(k, prev);
                    }
                    None => to_test.push((k, self.tasks[i], c.as_str())),
                }
            }
        }
        let verdicts = test_once(tester, &to_test)?;
        Ok(Judged { repeat, verdicts })
    }

    /// Scores the answer of position `k` (episode `e` on `task`, its code `code`): a repeat
    /// takes its earlier turn's reward and feedback, a new kernel is scored from its verdict
    /// and entered in the episode's compilation cache.
    fn assess(
        &self,
        task: &T,
        e: &mut Episode,
        code: Option<&str>,
        judged: &Judged,
        k: usize,
    ) -> Assessed {
        if let Some(&prev) = judged.repeat.get(&k) {
            let p = &e.turns[prev];
            return Assessed {
                reward: p.reward.clone(),
                feedback: format!(
                    "This kernel is identical to your attempt in turn {} (not rebuilt). {}",
                    prev + 1,
                    p.feedback
                ),
                failure: p.failure.clone(),
            };
        }
        let vd = judged.verdicts.get(&k);
        let reward = score(
            self.cfg,
            code,
            vd.map(|x| &x.0),
            vd.and_then(|x| x.1.as_deref()),
        );
        let fb = feedback(task.tier(), code, vd.map(|x| &x.0), &self.s.public_seeds);
        let failure = match (code, vd) {
            (None, _) => Some("no_code".to_string()),
            (_, Some((v, _))) => v.failure.clone(),
            _ => None,
        };
        if let Some(c) = code {
            e.seen.insert(code_hash(c), self.turn);
        }
        Assessed {
            reward,
            feedback: fb,
            failure,
        }
    }

    /// Records answer `a` (its code `code`, the conversation `prompt` it answered, scored as
    /// `scored`) as the turn of `e`: its failure, speedup and strategies, and whether the episode is
    /// done.
    fn record(
        &self,
        e: &mut Episode,
        a: &Answer,
        code: Option<String>,
        prompt: Vec<ChatMessage>,
        scored: Assessed,
    ) {
        let turn = self.turn;
        let Assessed {
            reward,
            feedback: fb,
            failure,
        } = scored;
        if let Some(f) = &failure {
            e.failed.push((turn, f.clone()));
        }
        if reward.gate
            && let Some(x) = reward.speedup
        {
            e.trajectory.push((turn, x));
        }
        if let Some(c) = &code {
            for st in strategies(c) {
                if !e.tried.iter().any(|t| t == st) {
                    e.tried.push(st.to_string());
                }
            }
        }
        let stop = self.cfg.stops(&reward);
        e.turns.push(Turn {
            turn,
            role: self.role,
            completion: a.id,
            tokens: a.tokens,
            text: a.text.clone(),
            code,
            failure,
            feedback: fb,
            reward,
            credit: 0.0,
            value: a.value,
            prompt,
        });
        if stop || turn + 1 >= self.s.max_turns {
            e.done = true;
        }
    }
}

/// Judges `to_test` (position, task, code): identical candidates for the same task (a group's
/// episodes often agree) are judged once and the verdict shared; the verdicts by position.
fn test_once<T: EpisodeTask + ?Sized>(
    tester: &mut dyn Tester<T>,
    to_test: &[(usize, &T, &str)],
) -> Result<BTreeMap<usize, (Verdict, Option<String>)>, RlError> {
    let mut unique: Vec<(&T, &str)> = Vec::new();
    let mut first: BTreeMap<(&str, [u8; 32]), usize> = BTreeMap::new();
    let slots: Vec<usize> = to_test
        .iter()
        .map(|(_, t, c)| {
            let key = (t.id(), code_hash(c));
            *first.entry(key).or_insert_with(|| {
                unique.push((*t, *c));
                unique.len() - 1
            })
        })
        .collect();
    let results = tester.test_many(&unique)?;
    let mut verdicts: BTreeMap<usize, (Verdict, Option<String>)> = BTreeMap::new();
    for ((k, _, _), slot) in to_test.iter().zip(&slots) {
        if let Some(r) = results.get(*slot) {
            verdicts.insert(*k, r.clone());
        }
    }
    Ok(verdicts)
}

/// Ends every episode and fills in each turn's credit from the episode's immediate rewards
/// (the config's turn credit).
fn assign_credits(eps: &mut [Episode], cfg: &RewardConfig) {
    let w = cfg.credit;
    for e in eps {
        e.done = true;
        let imm: Vec<f64> = e.turns.iter().map(|t| t.reward.reward).collect();
        for (t, c) in e.turns.iter_mut().zip(turn_credits(&imm, &w)) {
            t.credit = c;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::Path;

    /// Answers with fixed texts, in order, and records the conversations it saw.
    struct Scripted {
        answers: Vec<String>,
        seen: Vec<(Role, Vec<ChatMessage>, String)>,
    }

    impl Policy for Scripted {
        fn answer(
            &mut self,
            ask: Ask<'_>,
            on_finish: &mut dyn FnMut(usize, &str),
        ) -> Result<Vec<Answer>, RlError> {
            let (role, c, launchers) = (ask.role, ask.conversations, ask.launchers);
            assert_eq!(launchers.len(), c.len(), "a launcher per conversation");
            let seen = c
                .iter()
                .zip(launchers)
                .map(|(m, l)| (role, m.clone(), l.clone()));
            self.seen.extend(seen);
            Ok((0..c.len())
                .map(|i| {
                    let text = self.answers.remove(0);
                    on_finish(i, &text);
                    Answer {
                        id: None,
                        text,
                        tokens: 1,
                        value: None,
                    }
                })
                .collect())
        }
    }

    /// Judges every candidate correct in full mode at the speedup named in its source
    /// (`// speedup 1.5`), counting the candidates it was asked to judge.
    struct Counting {
        judged: Vec<String>,
    }

    impl Tester for Counting {
        fn test(
            &mut self,
            _t: &TaskSpec,
            code: &str,
        ) -> Result<(Verdict, Option<String>), RlError> {
            self.judged.push(code.to_string());
            let x: f64 = code
                .split("// speedup ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next()?.parse().ok())
                .unwrap_or(1.0);
            let mut v = crate::reward::tests::verdict("full", true, Some(true));
            v.tests = crate::reward::tests::tests(4, 4);
            v.speedup_vs_naive = Some(x);
            Ok((v, None))
        }
    }

    #[test]
    fn identical_candidates_of_a_group_are_judged_once_and_a_fast_correct_kernel_ends_the_episode()
    {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let task = cudarl_cuda::TaskSpec::load(&root.join("datasets/tasks/vector_add")).unwrap();
        let cfg = RewardConfig::load(
            &root.join("configs/reward/default.toml"),
            "configs/reward/default.toml",
        )
        .unwrap();
        assert_eq!(cfg.stop_speedup, Some(1.0));
        let kernel =
            |x: f64| prompts::fenced(&format!("__global__ void k() {{}} // speedup {x}\n"));
        // Four episodes of one task: turn 1 gives three the same slow kernel (0.5x) and one a
        // kernel at 1.5x; turn 2 gives the three slow ones the same 2x kernel.
        let mut policy = Scripted {
            answers: vec![kernel(0.5), kernel(0.5), kernel(1.5), kernel(0.5)]
                .into_iter()
                .chain(std::iter::repeat_n(kernel(2.0), 3))
                .collect(),
            seen: vec![],
        };
        let mut tester = Counting { judged: vec![] };
        let s = EpisodeSettings {
            max_turns: 3,
            public_seeds: vec![0],
        };
        let tasks = vec![&task; 4];
        let eps = run_episodes(&tasks, &mut policy, &mut tester, &cfg, &s).unwrap();
        // Judged: the slow kernel once, the 1.5x one once, the 2x one once.
        assert_eq!(tester.judged.len(), 3, "{:?}", tester.judged);
        // The 1.5x episode ended at turn 1, the others at turn 2 (2x >= 1x), not at the limit.
        let turns: Vec<usize> = eps.iter().map(|e| e.turns.len()).collect();
        assert_eq!(turns, vec![2, 2, 1, 2]);
        // The shared verdict scored each episode alike.
        assert_eq!(eps[0].turns[0].reward, eps[1].turns[0].reward);
        assert!(policy.answers.is_empty());
    }

    #[test]
    fn scripted_episode_walks_from_compile_error_to_success_with_feedback() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let Some(nvcc) = cudarl_cuda::Nvcc::discover_or_skip(&root) else {
            return;
        };
        let task = cudarl_cuda::TaskSpec::load(&root.join("datasets/tasks/vector_add")).unwrap();
        let good =
            std::fs::read_to_string(root.join("datasets/tasks/vector_add/naive.cu")).unwrap();
        let broken = good.replacen(';', "", 1);
        let mut policy = Scripted {
            answers: vec![
                format!("Here:\n{}", prompts::fenced(&broken)),
                "I think it is fine.".into(),
                prompts::fenced(&good),
            ],
            seen: vec![],
        };
        let mut harness = crate::harness::Harness::new(
            cudarl_cuda::Compiler {
                nvcc,
                arch: "sm_90".into(),
                timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
                store: None,
            },
            false,
            std::time::Duration::from_secs(5),
            Default::default(),
        )
        .unwrap();
        let cfg = RewardConfig::load(
            &root.join("configs/reward/default.toml"),
            "configs/reward/default.toml",
        )
        .unwrap();
        let s = EpisodeSettings {
            max_turns: 3,
            public_seeds: vec![0],
        };
        let eps = run_episodes(&[&task], &mut policy, &mut harness, &cfg, &s).unwrap();
        let e = &eps[0];
        // Compile error -> no code -> fixed: compiled (compile-only: 0.5 + 0.05 coalesced);
        // Compile-only verdicts never meet the stop condition, so the turn limit (3) ends it.
        assert_eq!(
            e.turns.len(),
            3,
            "{:?}",
            e.turns.iter().map(|t| &t.failure).collect::<Vec<_>>()
        );
        assert_eq!(e.turns[0].role, Role::Generator);
        assert_eq!(e.turns[0].failure.as_deref(), Some("compile_error"));
        assert!(
            e.turns[0].feedback.starts_with("Compilation failed:"),
            "{}",
            e.turns[0].feedback
        );
        assert!(
            e.turns[0].feedback.contains("line "),
            "{}",
            e.turns[0].feedback
        );
        assert_eq!(e.turns[1].failure.as_deref(), Some("no_code"));
        assert!(e.turns[1].feedback.starts_with("No code block found"));
        assert_eq!(e.turns[2].role, Role::Optimizer);
        assert!(e.turns[2].reward.compiled && e.turns[2].failure.is_none());
        assert!(
            e.turns[2].feedback.contains("compile-only"),
            "{}",
            e.turns[2].feedback
        );
        assert!((e.turns[2].reward.reward - 0.55).abs() < 1e-12);
        // The optimizer saw the tester's compile errors and the broken kernel in its prompt.
        let (role, conv, launcher) = &policy.seen[1];
        assert_eq!(*role, Role::Optimizer);
        // Every turn's request named the task's launcher, which constrained decoding holds to.
        let declared = task.text().signature;
        assert!(declared.contains(cudarl_protocol::rl::LAUNCHER_TRIGGER));
        assert!(policy.seen.iter().all(|(_, _, l)| *l == declared) && *launcher == declared);
        let user = &conv[1].content;
        assert!(user.contains("Compilation failed:") && user.contains(broken.trim_end()));
        // The best turn is the fixed one; credits are the returns-to-go of rewards (0, 0, 0.55)
        // with gamma 0.4 (configs/reward/default.toml): 0.16 * 0.55, 0.4 * 0.55, 0.55.
        assert!((e.final_reward() - 0.55).abs() < 1e-12);
        let want = [0.16 * 0.55, 0.4 * 0.55, 0.55];
        for (t, w) in e.turns.iter().zip(want) {
            assert!((t.credit - w).abs() < 1e-12, "{} vs {w}", t.credit);
        }
        assert_eq!(
            harness.candidates, 2,
            "the no-code turn never reaches the harness"
        );
        // Both kernels were handed to the compiler as soon as their answers were known, and
        // the tests waited for those builds instead of starting their own.
        assert_eq!(harness.prefetch_hits, 2);
        assert!(harness.prefetched.is_empty());
        // PPO's targets for this episode by hand: rewards 0.3 r_t (+ 0.7 R on the last turn),
        // no critic values (0): r = (0, 0, 0.3*0.55 + 0.7*0.55 = 0.55); gamma 1, lambda 0.95:
        // A2 = 0.55, A1 = 0.95 * 0.55, A0 = 0.95^2 * 0.55; targets = A (values 0).
        let t = crate::step::ppo_targets(&eps, &cfg.credit, 1.0, 0.95);
        let want = [0.9025 * 0.55, 0.95 * 0.55, 0.55];
        for ((a, r), w) in t[0].iter().zip(want) {
            assert!((a - w).abs() < 1e-12 && (r - w).abs() < 1e-12, "{:?}", t[0]);
        }
        // With values (0.2, 0.4, 0.5): deltas 0 + 0.4 - 0.2 = 0.2, 0 + 0.5 - 0.4 = 0.1,
        // 0.55 - 0.5 = 0.05; A2 = 0.05, A1 = 0.1 + 0.0475 = 0.1475, A0 = 0.2 + 0.95 * 0.1475.
        let mut e2 = eps[0].clone();
        for (t, v) in e2.turns.iter_mut().zip([0.2, 0.4, 0.5]) {
            t.value = Some(v);
        }
        let t = crate::step::ppo_targets(&[e2], &cfg.credit, 1.0, 0.95);
        let want = [(0.340_125, 0.540_125), (0.1475, 0.5475), (0.05, 0.55)];
        for ((a, r), (wa, wr)) in t[0].iter().zip(want) {
            assert!((a - wa).abs() < 1e-9 && (r - wr).abs() < 1e-9, "{:?}", t[0]);
        }
        // On equal rewards the episode hands back a compiled kernel over a compile error or
        // no code (the fixed turn, even with its reward zeroed), the earliest on full ties.
        let mut e3 = eps[0].clone();
        e3.turns[2].reward.reward = 0.0;
        assert_eq!(e3.best_turn().unwrap().turn, 2);
        assert!(e3.best_components().compiled);
        e3.turns[2].reward.compiled = false;
        // Turns 0 and 2 now both wrote code that did not compile: the earlier; turn 1 had none.
        assert_eq!(e3.best_turn().unwrap().turn, 0);
        e3.turns[2].reward.has_code = false;
        e3.turns[0].reward.has_code = false;
        assert_eq!(e3.best_turn().unwrap().turn, 0, "the earliest on full ties");
    }
}
