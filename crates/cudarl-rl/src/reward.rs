//! The gated, shaped reward of one turn (docs/architecture.md, "Reward and turn credit"), as
//! configured data (`configs/reward/<name>.toml`, [`RewardConfig`]), with every component kept
//! ([`RewardComponents`]) so the per-turn table can explain each number.
//!
//! Full mode (a GPU ran the tests): 0 unless the kernel compiles and passes every test (train
//! and hold-out shapes, public and hidden seeds); then
//! `w_pass * pass_rate + w_speedup * norm_speedup - w_reg * register_pressure
//!  - w_smem * smem_overuse + w_shfl * 1{warp shuffle} + w_coal * 1{coalesced}`,
//! plus `w_timeout` (negative) for a kernel that hung, gate or not, and `w_compiled` for a
//! kernel that passed the static checks and compiled, gate or not (0 in the default config:
//! a partial credit that gives GRPO a signal in groups where no candidate passes yet, as in
//! `configs/reward/compile.toml`).
//!
//! `norm_speedup = clamp(log2(speedup vs naive) / log2(cap), 0, 1)`: 1 at `cap` x the naive
//! kernel, 0 at or below it. A KernelBench problem (`kb/...`) has no naive kernel: there the
//! speedup is against the reference `Model` in torch eager, KernelBench's baseline.
//!
//! Compile-only mode (no GPU: CPU machines): nothing ran, so the gate is "compiles" and the
//! reward is `compile_only.compiled` plus the same resource and source terms; rows say
//! `mode = compile-only`.
//!
//! The bonuses are decided from the candidate's code (comments and strings stripped) and, when
//! `cuobjdump` can read the compiled shared object and its SASS can change them
//! ([`sass_decides`]), from its SASS: warp shuffle needs a
//! `__shfl*_sync` call in the source and, with SASS, a `SHFL` instruction; coalesced access
//! needs the canonical thread index (`blockIdx.x * blockDim.x + threadIdx.x`) or vector types
//! (`float4`, `__half2`, ...) in the source, or with SASS 64/128-bit global loads
//! (`LDG.E.64`/`LDG.E.128`), and no global index scaled by a stride on `threadIdx.x`.
//! Never from the prompt.

use crate::RlError;
use std::path::Path;

use cudarl_cuda::Verdict;
use cudarl_lex::c::strip_comments_and_strings as strip_c;
use serde::{Deserialize, Serialize};

/// `configs/reward/<name>.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardConfig {
    /// Weights of the terms.
    pub weights: Weights,
    /// Speedup normalization.
    pub speedup: SpeedupNorm,
    /// Resource limits above which the penalties grow.
    pub limits: Limits,
    /// Compile-only mode.
    pub compile_only: CompileOnly,
    /// Turn credit (`cudarl_train::rl::turn_credits`): immediate, final, gamma.
    pub credit: crate::credit::CreditWeights,
    /// An episode stops at its first turn whose kernel passes every test (full mode, no hack
    /// flag) and is at least this many times as fast as the task's naive kernel
    /// ([`RewardConfig::stops`]); absent: this rule is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_speedup: Option<f64>,
    /// An episode stops once a turn's reward exceeds this; absent: this rule is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_above: Option<f64>,
    /// What a verdict with a hack flag (`beats_roofline`, `work_after_stop`,
    /// `sandbox_violation`, `timed_output_mismatch`, `work_before_start`, ...) earns.
    #[serde(default)]
    pub on_hack_flag: OnHackFlag,
}

/// [`RewardConfig::on_hack_flag`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnHackFlag {
    /// The reward is 0, every term and credit included (the default).
    #[default]
    Zero,
    /// The flag is recorded and the reward computed as if it were not there (for measuring
    /// what a flag would have earned; never for training).
    Ignore,
}

/// Weights of the reward terms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weights {
    /// Fraction of tests passed (1 when the gate holds).
    pub pass_rate: f64,
    /// Normalized speedup over the naive kernel.
    pub speedup: f64,
    /// Register pressure in [0, 1] (penalty: give it a negative weight).
    pub register_pressure: f64,
    /// Shared-memory overuse in [0, 1] (penalty).
    pub smem_overuse: f64,
    /// The kernel hung (penalty, applied with or without the gate).
    pub timeout: f64,
    /// Warp-shuffle use (bonus).
    pub warp_shuffle: f64,
    /// Coalesced global access (bonus).
    pub coalesced: f64,
    /// Full mode: passed the static checks and compiled, gate or not (partial credit; 0 when
    /// absent). Compile-only mode has its own `compile_only.compiled`.
    #[serde(default)]
    pub compiled: f64,
    /// Achieved occupancy (0-1) from the verdict's Nsight Compute profile pass
    /// (`cudarl_cuda::profile`), under the gate; 0 when absent (no term without a profile).
    /// Measured inside the candidate's process: a shaping term, kept small.
    #[serde(default)]
    pub occupancy: f64,
    /// DRAM throughput as a fraction of peak (0-1) from the profile pass, under the gate; 0
    /// when absent. As [`Weights::occupancy`].
    #[serde(default)]
    pub dram_throughput: f64,
}

/// `norm = clamp(log2(speedup) / log2(cap), 0, 1)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedupNorm {
    /// Speedup over the naive kernel that earns the full term.
    pub cap: f64,
}

/// Resource limits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Registers per thread without penalty; the penalty rises linearly to 1 at 255.
    pub registers_per_thread: f64,
    /// Static shared memory per block without penalty (bytes); 1 at twice this.
    pub smem_bytes_per_block: f64,
}

/// Compile-only mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompileOnly {
    /// Reward of a kernel that passes the static checks and compiles.
    pub compiled: f64,
}

impl RewardConfig {
    /// Reads and checks `path` (shown as `display` in errors).
    ///
    /// # Errors
    /// Unreadable file, bad TOML, unknown or missing keys, non-finite numbers, `cap <= 1`.
    pub fn load(path: &Path, display: &str) -> Result<RewardConfig, RlError> {
        let bad = |field: Option<&str>, m: String| RlError::bad_input(display, field, m);
        let text = std::fs::read_to_string(path).map_err(|e| bad(None, e.to_string()))?;
        let c: RewardConfig = toml::from_str(&text).map_err(|e| bad(None, e.to_string()))?;
        if c.speedup.cap.is_nan() || c.speedup.cap <= 1.0 {
            return Err(bad(Some("speedup.cap"), "must be > 1".into()));
        }
        if let Some(x) = c.stop_speedup
            && !(x.is_finite() && x > 0.0)
        {
            return Err(bad(Some("stop_speedup"), "must be > 0".into()));
        }
        let r = c.limits.registers_per_thread;
        if r.is_nan() || r <= 0.0 || r >= 255.0 {
            return Err(bad(
                Some("limits.registers_per_thread"),
                "must be in (0, 255)".into(),
            ));
        }
        Ok(c)
    }
}

impl RewardConfig {
    /// Whether an episode ends at a turn scored `r`: its kernel passed every test in full mode
    /// with a positive reward (no hack flag zeroed it) and a speedup of at least
    /// [`RewardConfig::stop_speedup`] over the naive kernel, or `r.reward` exceeds
    /// [`RewardConfig::stop_above`].
    pub fn stops(&self, r: &RewardComponents) -> bool {
        let fast = self.stop_speedup.is_some_and(|s| {
            r.mode == "full"
                && r.gate
                && r.correct == Some(true)
                && r.reward > 0.0
                && r.speedup.is_some_and(|x| x >= s)
        });
        fast || self.stop_above.is_some_and(|t| r.reward > t)
    }
}

/// Every component of one turn's reward.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RewardComponents {
    /// `full` or `compile-only`.
    pub mode: String,
    /// The answer had a code block.
    pub has_code: bool,
    /// Passed the static checks and compiled.
    pub compiled: bool,
    /// All tests passed (`None` when nothing ran).
    pub correct: Option<bool>,
    /// The gate held (full: compiled and correct; compile-only: compiled).
    pub gate: bool,
    /// Fraction of tests passed.
    pub pass_rate: f64,
    /// Speedup over the naive kernel (full mode, correct).
    pub speedup: Option<f64>,
    /// Normalized speedup in [0, 1].
    pub norm_speedup: f64,
    /// Register pressure in [0, 1].
    pub register_pressure: f64,
    /// Shared-memory overuse in [0, 1].
    pub smem_overuse: f64,
    /// The kernel hung.
    pub timeout: bool,
    /// Warp-shuffle use (source, and SASS when read).
    pub warp_shuffle: bool,
    /// Coalesced access (source, and SASS when read).
    pub coalesced: bool,
    /// The SASS was read for the bonuses.
    pub sass: bool,
    /// Speedup over the PyTorch reference (informational; not in the reward).
    pub speedup_vs_torch: Option<f64>,
    /// KernelBench problems: speedup over the reference under `torch.compile` (informational;
    /// not in the reward).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup_vs_torch_compile: Option<f64>,
    /// Every train-shape test passed (`None` when nothing ran).
    pub train_shapes_passed: Option<bool>,
    /// Every hold-out-shape test passed (`None` when nothing ran).
    pub holdout_shapes_passed: Option<bool>,
    /// The verdict's hack flags; with `on_hack_flag = "zero"` any of them makes the reward 0.
    #[serde(default)]
    pub hack_flags: Vec<String>,
    /// Achieved occupancy (0-1) from the profile pass, when it measured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub achieved_occupancy: Option<f64>,
    /// DRAM throughput, fraction of peak (0-1), from the profile pass, when it measured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dram_throughput: Option<f64>,
    /// The reward.
    pub reward: f64,
}

impl RewardComponents {
    /// Correct and without a hack flag: what counts as a pass in rates, fast_p and the choice
    /// of an episode's best turn (a flagged kernel is counted apart, see [`Self::hack_flags`]).
    pub fn honest_pass(&self) -> bool {
        self.correct == Some(true) && self.hack_flags.is_empty()
    }
}

/// Source-level evidence of warp shuffles and coalesced access: `(shuffle, coalesced)`.
pub fn source_features(code: &str) -> (bool, bool) {
    let s = strip_c(code);
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    let shfl = compact.contains("__shfl_sync(")
        || compact.contains("__shfl_down_sync(")
        || compact.contains("__shfl_xor_sync(")
        || compact.contains("__shfl_up_sync(");
    let canonical = compact.contains("blockIdx.x*blockDim.x+threadIdx.x")
        || compact.contains("threadIdx.x+blockIdx.x*blockDim.x")
        || compact.contains("blockDim.x*blockIdx.x+threadIdx.x");
    let vector = [
        "float4",
        "float2",
        "__half2",
        "__nv_bfloat162",
        "int4",
        "uint4",
    ]
    .iter()
    .any(|t| compact.contains(t));
    // A thread index scaled by a stride makes neighbouring threads touch far-apart addresses.
    let strided = compact.contains("threadIdx.x*") && !compact.contains("threadIdx.x*sizeof");
    (shfl, (canonical || vector) && !strided)
}

/// Whether the SASS of `verdict`'s build can change the bonuses [`score`] gives `code`: the
/// gate can pass (compiled; in full mode also correct) with no hack flag, and the source leaves
/// something for the SASS to decide (a `__shfl*_sync` call, whose `SHFL` the SASS must confirm,
/// or code that is not coalesced by its source alone and whose index is not strided, which
/// 64/128-bit global loads in the SASS would make coalesced). For every other candidate
/// [`score`] gives the same reward with or without the SASS, so the harness disassembles only
/// these (a `cuobjdump -sass` costs about 0.5 to 0.75 s of CPU, as much as half a build): the
/// RL harness's compile phase fell from 9.4 to 4.9 s a step in the main job on an H200
/// (`benchmarks/results/main_job_h200_2026-11-27_sass_on_demand.json`).
pub fn sass_decides(code: &str, verdict: &Verdict) -> bool {
    let gate = verdict.compiled
        && (verdict.mode != "full" || verdict.correct == Some(true))
        && verdict.hack_flags.is_empty();
    if !gate {
        return false;
    }
    let (shfl, coal) = source_features(code);
    shfl || (!coal && s_coal_not_strided(code))
}

/// SASS-level evidence: `(shuffle instruction, 64/128-bit global loads)`.
pub fn sass_features(sass: &str) -> (bool, bool) {
    (
        sass.contains("SHFL"),
        sass.contains("LDG.E.128") || sass.contains("LDG.E.64") || sass.contains("LDG.E.ENL2.256"),
    )
}

/// Scores one turn: `code` is the extracted code block (`None`: the answer had none),
/// `verdict` the harness's verdict on it, `sass` the disassembly of its shared object when
/// available.
pub fn score(
    cfg: &RewardConfig,
    code: Option<&str>,
    verdict: Option<&Verdict>,
    sass: Option<&str>,
) -> RewardComponents {
    let mut c = RewardComponents {
        mode: verdict
            .map_or("compile-only", |v| v.mode.as_str())
            .to_string(),
        has_code: code.is_some(),
        ..Default::default()
    };
    let (Some(code), Some(v)) = (code, verdict) else {
        return c;
    };
    c.compiled = v.compiled;
    c.correct = v.correct;
    c.timeout = v.failure.as_deref() == Some("timeout");
    c.speedup_vs_torch = v.speedup_vs_torch.filter(|_| v.correct == Some(true));
    c.speedup_vs_torch_compile = v
        .speedup_vs_torch_compile
        .filter(|_| v.correct == Some(true));
    let split_ok = |split: &str| {
        let t: Vec<bool> = v
            .tests
            .iter()
            .filter(|t| t.split == split)
            .map(|t| t.passed)
            .collect();
        (!t.is_empty()).then(|| t.iter().all(|x| *x))
    };
    c.train_shapes_passed = split_ok("train");
    c.holdout_shapes_passed = split_ok("holdout");
    if !v.tests.is_empty() {
        c.pass_rate = v.tests.iter().filter(|t| t.passed).count() as f64 / v.tests.len() as f64;
    }
    let regs = v
        .resources
        .iter()
        .map(|r| r.registers as f64)
        .fold(0.0, f64::max);
    c.register_pressure = ((regs - cfg.limits.registers_per_thread)
        / (255.0 - cfg.limits.registers_per_thread))
        .clamp(0.0, 1.0);
    let smem = v
        .resources
        .iter()
        .map(|r| r.shared_mem_bytes as f64)
        .fold(0.0, f64::max);
    c.smem_overuse = ((smem - cfg.limits.smem_bytes_per_block) / cfg.limits.smem_bytes_per_block)
        .clamp(0.0, 1.0);
    let (s_shfl, s_coal) = source_features(code);
    let (shfl, coal) = match sass {
        Some(s) => {
            c.sass = true;
            let (a, b) = sass_features(s);
            (s_shfl && a, s_coal || (b && s_coal_not_strided(code)))
        }
        None => (s_shfl, s_coal),
    };
    c.warp_shuffle = shfl;
    c.coalesced = coal;
    let w = &cfg.weights;
    let shaped_extras = w.register_pressure * c.register_pressure
        + w.smem_overuse * c.smem_overuse
        + w.warp_shuffle * f64::from(u8::from(c.warp_shuffle))
        + w.coalesced * f64::from(u8::from(c.coalesced));
    let full = v.mode == "full";
    c.gate = if full {
        v.compiled && v.correct == Some(true)
    } else {
        v.compiled
    };
    if c.gate {
        if full {
            c.speedup = v.speedup_vs_naive;
            // A KernelBench problem has no naive kernel: its speed term is the speedup against
            // the reference in torch eager, KernelBench's baseline (Ouyang et al. 2025,
            // arXiv:2502.10517).
            let kb = v.task_id.starts_with("kb/");
            let baseline = v.speedup_vs_naive.or(c.speedup_vs_torch.filter(|_| kb));
            c.norm_speedup = baseline.map_or(0.0, |s| {
                (s.max(1e-9).log2() / cfg.speedup.cap.log2()).clamp(0.0, 1.0)
            });
            let measured = v.profile.as_ref().and_then(|p| p.metrics.as_ref());
            c.achieved_occupancy = measured.map(|m| m.achieved_occupancy.clamp(0.0, 1.0));
            c.dram_throughput = measured.map(|m| m.dram_throughput.clamp(0.0, 1.0));
            let profiled = w.occupancy * c.achieved_occupancy.unwrap_or(0.0)
                + w.dram_throughput * c.dram_throughput.unwrap_or(0.0);
            c.reward =
                w.pass_rate * c.pass_rate + w.speedup * c.norm_speedup + shaped_extras + profiled;
        } else {
            c.reward = cfg.compile_only.compiled + shaped_extras;
        }
    }
    if full && c.compiled {
        c.reward += w.compiled;
    }
    if c.timeout {
        c.reward += w.timeout;
    }
    c.hack_flags = v.hack_flags.clone();
    if !c.hack_flags.is_empty() && cfg.on_hack_flag == OnHackFlag::Zero {
        c.gate = false;
        c.reward = 0.0;
    }
    c
}

fn s_coal_not_strided(code: &str) -> bool {
    let s = strip_c(code);
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    !compact.contains("threadIdx.x*") || compact.contains("threadIdx.x*sizeof")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use cudarl_cuda::diag::KernelResources;
    use cudarl_cuda::gpu::TestResult;

    fn cfg() -> RewardConfig {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/reward/default.toml");
        RewardConfig::load(&p, "configs/reward/default.toml").unwrap()
    }

    pub(crate) fn verdict(mode: &str, compiled: bool, correct: Option<bool>) -> Verdict {
        let v: Verdict = serde_json::from_value(serde_json::json!({
            "task_id": "t", "abi": "native", "mode": mode, "compiled": compiled,
            "static_flags": [], "diagnostics": [], "resources": [], "executed": correct.is_some(),
            "correct": correct, "failure": null, "failure_detail": null, "hack_flags": [],
            "tests": [], "max_abs_err": null, "max_rel_err": null, "timing": null,
            "naive_timing": null, "speedup_vs_naive": null, "speedup_vs_torch": null,
            "roofline_ms": null, "dram_fraction_of_peak": null, "signature": "", "cache_hit": false,
            "compile_seconds": 0.0, "nvcc_version": "", "arch": "sm_90", "gpu": null
        }))
        .unwrap();
        v
    }

    pub(crate) fn tests(passed: usize, total: usize) -> Vec<TestResult> {
        (0..total)
            .map(|i| {
                serde_json::from_value(serde_json::json!({
                    "split": "train", "sizes": {"n": 1024}, "seed": i, "passed": i < passed,
                    "max_abs_err": 0.0, "max_rel_err": 0.0, "unwritten": 0, "non_finite": 0,
                    "input_mutated": false, "out_of_bounds_write": false, "message": null
                }))
                .unwrap()
            })
            .collect()
    }

    const PLAIN: &str = "__global__ void k(const float* a, float* o, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) o[i] = a[i]; }";
    const SHFL: &str = "__global__ void k(const float* a, float* o, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; float v = a[i]; v += __shfl_down_sync(0xffffffff, v, 16); o[i] = v; }";

    #[test]
    fn a_kernelbench_kernel_is_paid_for_its_speedup_against_torch_eager_only() {
        let c = cfg();
        let mut v = verdict("full", true, Some(true));
        v.tests = tests(4, 4);
        v.speedup_vs_torch = Some(2.0);
        // A task family's kernel without a naive timing gets no speed term from torch.
        let family = score(&c, Some(PLAIN), Some(&v), None);
        assert_eq!(family.norm_speedup, 0.0);
        // A KernelBench problem's: log2 2 / log2 8 = 1/3; `speedup` (vs naive) stays empty.
        v.task_id = "kb/L1/19_ReLU".into();
        let kb = score(&c, Some(PLAIN), Some(&v), None);
        assert!((kb.norm_speedup - 1.0 / 3.0).abs() < 1e-12, "{kb:?}");
        assert_eq!(kb.speedup, None);
        assert!((kb.reward - family.reward - 0.4 / 3.0).abs() < 1e-12);
        // Slower than torch eager: no speed term, still the pass term.
        v.speedup_vs_torch = Some(0.5);
        assert_eq!(score(&c, Some(PLAIN), Some(&v), None).norm_speedup, 0.0);
    }

    #[test]
    fn the_default_config_by_hand() {
        let c = cfg();
        assert_eq!(c.weights.pass_rate, 0.5);
        assert_eq!(c.weights.speedup, 0.4);
        assert_eq!(c.credit, crate::credit::CreditWeights::default());
        // Correct, 4x faster than naive with cap 8: norm = log2 4 / log2 8 = 2/3;
        // 0.5 * 1 + 0.4 * 2/3 + 0.05 (coalesced) = 0.81667.
        let mut v = verdict("full", true, Some(true));
        v.tests = tests(8, 8);
        v.speedup_vs_naive = Some(4.0);
        let r = score(&c, Some(PLAIN), Some(&v), None);
        assert!(r.gate && r.coalesced && !r.warp_shuffle);
        assert!(
            (r.reward - (0.5 + 0.4 * 2.0 / 3.0 + 0.05)).abs() < 1e-12,
            "{r:?}"
        );
        // Add warp shuffles and 160 registers: pressure (160-128)/(255-128) = 0.25197;
        // + 0.05 shuffle - 0.05 * 0.25197.
        let mut v2 = v.clone();
        v2.resources = vec![KernelResources {
            kernel: "k".into(),
            registers: 160,
            ..Default::default()
        }];
        let r2 = score(&c, Some(SHFL), Some(&v2), None);
        let p = 32.0 / 127.0;
        assert!((r2.register_pressure - p).abs() < 1e-12);
        assert!((r2.reward - (0.5 + 0.4 * 2.0 / 3.0 + 0.05 + 0.05 - 0.05 * p)).abs() < 1e-12);
        // SASS without a SHFL instruction takes the shuffle bonus away.
        let r3 = score(&c, Some(SHFL), Some(&v2), Some("LDG.E R2, [R2.64]"));
        assert!(r3.sass && !r3.warp_shuffle);
        // Slower than naive: no speedup term (clamped at 0), still the pass term.
        let mut slow = v.clone();
        slow.speedup_vs_naive = Some(0.5);
        assert!((score(&c, Some(PLAIN), Some(&slow), None).reward - 0.55).abs() < 1e-12);
    }

    /// Where [`sass_decides`] says no, every SASS gives the reward that no SASS gives; where it
    /// says yes, some SASS changes it (so skipping the disassembly there would change rewards).
    #[test]
    fn the_sass_is_read_only_where_it_can_change_the_reward() {
        let c = cfg();
        let gather = "__global__ void k(const float* a, const int* idx, float* o, int n) { int i = blockIdx.y * 7 + threadIdx.x; o[i] = a[idx[i]]; }";
        let strided = "__global__ void k(const float* a, float* o) { int i = threadIdx.x * 32; o[i] = a[i]; }";
        let vector =
            "__global__ void k(const float4* a, float4* o) { o[threadIdx.x] = a[threadIdx.x]; }";
        let mut correct = verdict("full", true, Some(true));
        correct.tests = tests(4, 4);
        correct.speedup_vs_naive = Some(2.0);
        let mut flagged = correct.clone();
        flagged.hack_flags = vec!["beats_roofline".into()];
        let verdicts = [
            correct,
            flagged,
            verdict("full", true, Some(false)),
            verdict("compile-only", true, None),
            verdict("compile-only", false, None),
        ];
        let sass = ["", "SHFL.DOWN", "LDG.E.128", "SHFL.BFLY LDG.E.64"];
        let mut decided = 0;
        for code in [PLAIN, SHFL, gather, strided, vector] {
            for v in &verdicts {
                let bare = score(&c, Some(code), Some(v), None).reward;
                let differs = sass
                    .iter()
                    .any(|s| score(&c, Some(code), Some(v), Some(s)).reward != bare);
                assert_eq!(
                    differs,
                    sass_decides(code, v),
                    "{code} with {} {:?}",
                    v.mode,
                    v.correct
                );
                decided += usize::from(differs);
            }
        }
        assert!(decided >= 4, "the cases reach both answers");
    }

    #[test]
    fn the_gate_holds_everything_at_zero() {
        let c = cfg();
        // Compiled, wrong on 3 of 8 tests: gated to 0 even with a speedup and the bonuses.
        let mut v = verdict("full", true, Some(false));
        v.tests = tests(5, 8);
        v.speedup_vs_naive = Some(8.0);
        let r = score(&c, Some(SHFL), Some(&v), None);
        assert!(!r.gate);
        assert_eq!(r.pass_rate, 5.0 / 8.0);
        assert_eq!(r.reward, 0.0);
        // A hang: the timeout penalty applies below the gate.
        let mut t = verdict("full", true, Some(false));
        t.failure = Some("timeout".into());
        assert_eq!(score(&c, Some(PLAIN), Some(&t), None).reward, -0.1);
        // No code block, a compile error: 0.
        assert_eq!(score(&c, None, None, None).reward, 0.0);
        let ce = verdict("compile-only", false, None);
        assert_eq!(score(&c, Some(PLAIN), Some(&ce), None).reward, 0.0);
        // Compile-only: compiled earns the compile-only reward plus the source terms.
        let co = verdict("compile-only", true, None);
        let r = score(&c, Some(PLAIN), Some(&co), None);
        assert_eq!(r.mode, "compile-only");
        assert!((r.reward - (0.5 + 0.05)).abs() < 1e-12);
    }

    #[test]
    fn profile_terms_count_under_the_gate_and_only_when_measured() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/reward/profiled.toml");
        let c = RewardConfig::load(&p, "configs/reward/profiled.toml").unwrap();
        assert_eq!(
            (c.weights.occupancy, c.weights.dram_throughput),
            (0.05, 0.05)
        );
        assert_eq!(cfg().weights.occupancy, 0.0, "off by default");
        let mut v = verdict("full", true, Some(true));
        v.tests = tests(8, 8);
        v.speedup_vs_naive = Some(1.0);
        let plain = score(&c, Some(PLAIN), Some(&v), None);
        assert_eq!(plain.achieved_occupancy, None);
        let measured = cudarl_cuda::profile::KernelProfile {
            kernels: 1,
            duration_ms: 0.2,
            achieved_occupancy: 0.6,
            dram_throughput: 0.8,
            warp_execution_efficiency: 1.0,
        };
        v.profile = Some(cudarl_cuda::profile::ProfileOutcome {
            status: "measured (ncu)".into(),
            metrics: Some(measured),
        });
        let r = score(&c, Some(PLAIN), Some(&v), None);
        assert_eq!(
            (r.achieved_occupancy, r.dram_throughput),
            (Some(0.6), Some(0.8))
        );
        assert!((r.reward - plain.reward - (0.05 * 0.6 + 0.05 * 0.8)).abs() < 1e-12);
        // Wrong answers and hack flags earn nothing of it.
        let mut wrong = v.clone();
        wrong.correct = Some(false);
        wrong.tests = tests(7, 8);
        assert_eq!(score(&c, Some(PLAIN), Some(&wrong), None).reward, 0.0);
        let mut flagged = v.clone();
        flagged.hack_flags = vec!["beats_roofline".into()];
        assert_eq!(score(&c, Some(PLAIN), Some(&flagged), None).reward, 0.0);
    }

    #[test]
    fn compile_credit_is_added_gate_or_not_in_full_mode_only() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/reward/compile.toml");
        let c = RewardConfig::load(&p, "configs/reward/compile.toml").unwrap();
        assert_eq!(c.weights.compiled, 0.1);
        assert_eq!(cfg().weights.compiled, 0.0, "off by default");
        // Compiled, wrong: 0.1 alone (the bonuses stay behind the gate).
        let mut wrong = verdict("full", true, Some(false));
        wrong.tests = tests(0, 8);
        assert_eq!(score(&c, Some(SHFL), Some(&wrong), None).reward, 0.1);
        // Correct, 2x: 0.1 + 0.5 + 0.4 * (1/3) + 0.05 (coalesced).
        let mut ok = verdict("full", true, Some(true));
        ok.tests = tests(8, 8);
        ok.speedup_vs_naive = Some(2.0);
        let r = score(&c, Some(PLAIN), Some(&ok), None);
        assert!(
            (r.reward - (0.1 + 0.5 + 0.4 / 3.0 + 0.05)).abs() < 1e-12,
            "{r:?}"
        );
        // Compiled and hung: 0.1 - 0.1. A compile error: 0.
        let mut t = verdict("full", true, Some(false));
        t.failure = Some("timeout".into());
        assert_eq!(score(&c, Some(PLAIN), Some(&t), None).reward, 0.0);
        let ce = verdict("full", false, None);
        assert_eq!(score(&c, Some(PLAIN), Some(&ce), None).reward, 0.0);
        // Compile-only mode keeps its own term: 0.5 + 0.05, not + 0.1.
        let co = verdict("compile-only", true, None);
        assert!((score(&c, Some(PLAIN), Some(&co), None).reward - 0.55).abs() < 1e-12);
    }

    #[test]
    fn a_hack_flag_zeroes_the_reward_unless_ignored() {
        let c = cfg();
        assert_eq!(c.on_hack_flag, OnHackFlag::Zero);
        // Correct and 8x faster than naive (the full speedup term), but flagged: 0.
        let mut v = verdict("full", true, Some(true));
        v.tests = tests(8, 8);
        v.speedup_vs_naive = Some(8.0);
        let honest = score(&c, Some(SHFL), Some(&v), None);
        assert!(honest.reward > 0.9, "{honest:?}");
        v.hack_flags = vec!["beats_roofline".into()];
        let r = score(&c, Some(SHFL), Some(&v), None);
        assert_eq!((r.reward, r.gate), (0.0, false), "{r:?}");
        assert_eq!(r.hack_flags, vec!["beats_roofline".to_string()]);
        // The compile credit goes too.
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/reward/compile.toml");
        let cc = RewardConfig::load(&p, "configs/reward/compile.toml").unwrap();
        assert_eq!(score(&cc, Some(SHFL), Some(&v), None).reward, 0.0);
        // `ignore` computes what the flag would have earned.
        let mut ig = c.clone();
        ig.on_hack_flag = OnHackFlag::Ignore;
        assert_eq!(score(&ig, Some(SHFL), Some(&v), None).reward, honest.reward);
    }

    #[test]
    fn strided_thread_index_is_not_coalesced() {
        assert!(source_features(PLAIN).1);
        let strided = "__global__ void k(float* o) { int i = threadIdx.x * 33; o[i] = 0; }";
        assert!(!source_features(strided).1);
        // Comments do not count.
        assert!(!source_features("// __shfl_down_sync(0, v, 1)\n__global__ void k() {}").0);
    }

    #[test]
    fn bad_config_is_named() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.toml");
        let good = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/reward/default.toml"),
        )
        .unwrap();
        std::fs::write(&p, good.replace("cap = 8.0", "cap = 1.0")).unwrap();
        let e = RewardConfig::load(&p, "configs/reward/x.toml").unwrap_err();
        let RlError::BadInput { file, field, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(
            (file.as_str(), field.as_deref()),
            ("configs/reward/x.toml", Some("speedup.cap")),
            "{e}"
        );
        std::fs::write(&p, good.replace("[weights]", "[weights]\nbogus = 1")).unwrap();
        let e = RewardConfig::load(&p, "configs/reward/x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
    }
}
