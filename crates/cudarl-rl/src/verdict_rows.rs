//! A kernel's verdict as the `validate` stage records it: its `validations` row
//! ([`ValidationRow`]) and, for an archive kernel (SakanaAI's, CUDA-L1's), the archive's claims
//! beside the harness's verdict ([`AgreementRow`]).

use cudarl_cuda::diag::KernelResources;
use cudarl_cuda::verdict::Verdict;
use cudarl_tables::validate::{AgreementRow, ValidationRow};

/// What a `validations` row says besides the verdict.
#[derive(Debug, Clone)]
pub struct KernelMeta {
    /// The kernel's id (from its input table).
    pub kernel_id: String,
    /// Its role (`naive`, `optimized`, ... for a task kernel; `archive`).
    pub role: String,
    /// `synth` (a task kernel), `sakana` or `cuda-l1`.
    pub source: String,
    /// An archive kernel's claim that it is correct.
    pub claimed_correct: Option<bool>,
    /// An archive kernel's claimed speedup over torch eager.
    pub claimed_speedup: Option<f64>,
    /// What the archive says failed ([`their_reason`] of its error text).
    pub their_error: Option<String>,
}

impl KernelMeta {
    /// A task kernel's (`source` `synth`, no claims).
    pub fn task_kernel(kernel_id: &str, role: &str) -> KernelMeta {
        KernelMeta {
            kernel_id: kernel_id.to_string(),
            role: role.to_string(),
            source: "synth".into(),
            claimed_correct: None,
            claimed_speedup: None,
            their_error: None,
        }
    }
}

/// A candidate that cannot work, found without running it: rejected by the static checks, does
/// not build (error or time limit) or does not load.
pub fn fails_unrun(v: &Verdict) -> bool {
    matches!(
        v.failure.as_deref(),
        Some("static_reject" | "compile_error" | "compile_timeout" | "load_error")
    )
}

/// The line of an archive's error text that says what failed (the build log before it is
/// noise): the last line mentioning an error, else the last non-empty line.
pub fn their_reason(e: &str) -> Option<String> {
    let lines: Vec<&str> = e.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let pick = lines
        .iter()
        .rev()
        .find(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("error")
                || l.contains("mismatch")
                || l.contains("failed")
                || l.contains("incorrect")
        })
        .or(lines.last())?;
    let mut s = pick.to_string();
    s.truncate(300);
    Some(s)
}

/// Our verdict on a kernel's correctness: an executed one's as run; a candidate that cannot
/// work (rejected, does not build, does not load; [`fails_unrun`]) is incorrect; one the
/// harness could not run (no GPU, no tests, an argument it cannot bind) is unknown (`None`).
pub fn our_correct(v: &Verdict) -> Option<bool> {
    if v.executed {
        v.correct
    } else if fails_unrun(v) {
        Some(false)
    } else {
        None
    }
}

/// `agreement`'s rows: the archive kernels of `ids` (those whose source is not `synth`) beside
/// their verdicts `vs` (one per entry of `ids`), in order; `our_reason` is the verdict's
/// failure and detail, cut to at most 300 bytes at a character boundary.
pub fn agreement(ids: &[KernelMeta], vs: &[Verdict]) -> Vec<AgreementRow> {
    ids.iter()
        .zip(vs)
        .filter(|(m, _)| m.source != "synth")
        .map(|(m, v)| AgreementRow {
            kernel_id: m.kernel_id.clone(),
            task_id: v.task_id.clone(),
            source: m.source.clone(),
            claimed_correct: m.claimed_correct,
            our_correct: our_correct(v),
            agree: m.claimed_correct.zip(our_correct(v)).map(|(a, b)| a == b),
            our_reason: v.failure.as_ref().map(|f| {
                let s = format!("{f}: {}", v.failure_detail.as_deref().unwrap_or(""));
                let end = (0..=s.len().min(300))
                    .rev()
                    .find(|&i| s.is_char_boundary(i))
                    .unwrap_or(0);
                s[..end].to_string()
            }),
            their_reason: m.their_error.clone(),
            claimed_speedup: m.claimed_speedup,
            our_speedup_vs_torch: v.speedup_vs_torch,
        })
        .collect()
}

/// `validations`' rows: the kernels of `ids` with their verdicts `vs` (one per entry of `ids`),
/// in order. A row's `verdict_json` leaves out what describes the run rather than the kernel
/// (nvcc wall time, compile cache hit, the shared object's digest); `registers`,
/// `shared_mem_bytes` and `spill_bytes` are the maxima over the candidate's kernels.
pub fn validations(ids: &[KernelMeta], vs: &[Verdict]) -> Vec<ValidationRow> {
    let vs: Vec<Verdict> = vs
        .iter()
        .map(|v| {
            let mut v = v.clone();
            v.compile_seconds = 0.0;
            v.cache_hit = false;
            v.so_hash = None;
            v
        })
        .collect();
    let max_res = |v: &Verdict, f: fn(&KernelResources) -> u32| {
        v.resources.iter().map(f).max().map(i64::from)
    };
    ids.iter()
        .zip(&vs)
        .map(|(m, v)| ValidationRow {
            kernel_id: m.kernel_id.clone(),
            task_id: v.task_id.clone(),
            role: m.role.clone(),
            mode: v.mode.clone(),
            compiled: v.compiled,
            executed: v.executed,
            correct: v.correct,
            failure: v.failure.clone(),
            failure_detail: v.failure_detail.clone(),
            static_flags: v.static_flags.iter().map(|f| f.rule.clone()).collect(),
            hack_flags: v.hack_flags.clone(),
            registers: max_res(v, |r| r.registers),
            shared_mem_bytes: max_res(v, |r| r.shared_mem_bytes),
            spill_bytes: max_res(v, |r| r.spill_store_bytes + r.spill_load_bytes),
            tests: v.tests.len() as i64,
            tests_passed: v.tests.iter().filter(|t| t.passed).count() as i64,
            max_abs_err: v.max_abs_err,
            max_rel_err: v.max_rel_err,
            median_ms: v.timing.as_ref().map(|t| t.median_ms),
            p10_ms: v.timing.as_ref().map(|t| t.p10_ms),
            p90_ms: v.timing.as_ref().map(|t| t.p90_ms),
            cv: v.timing.as_ref().map(|t| t.cv),
            speedup_vs_naive: v.speedup_vs_naive,
            torch_median_ms: v.torch_timing.as_ref().map(|t| t.median_ms),
            speedup_vs_torch: v.speedup_vs_torch,
            dram_fraction_of_peak: v.dram_fraction_of_peak,
            gpu: v.gpu.as_ref().map(|g| g.name.clone()),
            nvcc: v.nvcc_version.clone(),
            arch: v.arch.clone(),
            verdict_json: serde_json::to_string(v).expect("verdict json"),
            source: m.source.clone(),
            claimed_correct: m.claimed_correct,
            claimed_speedup: m.claimed_speedup,
        })
        .collect()
}
