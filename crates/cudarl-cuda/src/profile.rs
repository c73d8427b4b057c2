//! The optional profile pass: a candidate's kernels measured by Nsight Compute (`ncu`) on one
//! launch the judge checks, after its tests and timing (docs/architecture.md, "Profile pass").
//!
//! The judge starts a second runner for the candidate under `ncu --clock-control none` (the
//! GPU's clocks are left as they are, as for the judge's timing); `ncu` replays each kernel of
//! that one launch to read its counters and writes them as CSV to a file only the judge reads.
//! The runner stays sandboxed: its filter additionally allows send/receive on the sockets the
//! collector `ncu` injects at CUDA initialization opened before the candidate was loaded
//! (`cudarl_sandbox::FilterOptions::profiler_fds`).
//!
//! Trust: the collector runs inside the candidate's process, so a hostile candidate can reach
//! its memory and its socket. The counters are therefore reported beside the verdict and usable
//! as shaping terms of the reward (`configs/reward/*.toml`, weights 0 by default), never as the
//! verdict itself: correctness, timing and speedups stay the judge's, and a profile that
//! contradicts itself (a fraction outside [0, 1], no kernel, a duration that is not positive) is
//! dropped with the reason in [`ProfileOutcome::status`].

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Name of the runner's own empty kernel: what calibration windows run, and what a profile
/// pass leaves out of a candidate's counters.
pub const NOOP_KERNEL: &str = "cudarl_noop";

/// Nsight Compute metrics read per kernel (names as in `ncu --query-metrics`, Nsight Compute
/// 2025.x).
pub const METRICS: &[&str] = &[
    DURATION,
    ACHIEVED_OCCUPANCY,
    DRAM_THROUGHPUT,
    THREADS_PER_INSTRUCTION,
];

/// Kernel duration, nanoseconds (`--print-units base`).
const DURATION: &str = "gpu__time_duration.sum";
/// Achieved occupancy: active warps per active cycle as a percentage of the SM's maximum.
const ACHIEVED_OCCUPANCY: &str = "sm__warps_active.avg.pct_of_peak_sustained_active";
/// DRAM throughput as a percentage of the device's peak over the kernel's elapsed cycles.
const DRAM_THROUGHPUT: &str = "dram__throughput.avg.pct_of_peak_sustained_elapsed";
/// Active threads per executed warp instruction (0-32): 32 x warp execution efficiency.
const THREADS_PER_INSTRUCTION: &str = "smsp__thread_inst_executed_per_inst_executed.ratio";

/// Counters of one launch of a candidate (all its kernels; fractions averaged with each
/// kernel's duration as its weight).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelProfile {
    /// Kernels the launch ran.
    pub kernels: u32,
    /// Their summed duration under the profiler, ms (serialized, replayed: not the timing).
    pub duration_ms: f64,
    /// Achieved occupancy, fraction of the SM's warp slots (0-1).
    pub achieved_occupancy: f64,
    /// DRAM throughput, fraction of the device's peak (0-1).
    pub dram_throughput: f64,
    /// Warp execution efficiency: active threads per executed warp instruction / 32 (0-1).
    pub warp_execution_efficiency: f64,
}

/// What the profile pass gave: counters, or why there are none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileOutcome {
    /// `measured (ncu <version>)`, `absent: ...` (no `ncu` on this machine, no GPU) or
    /// `failed: ...` (the pass ran and gave nothing usable).
    pub status: String,
    /// The counters, when measured.
    pub metrics: Option<KernelProfile>,
}

impl ProfileOutcome {
    /// No counters, and why.
    pub fn without(status: impl Into<String>) -> ProfileOutcome {
        ProfileOutcome {
            status: status.into(),
            metrics: None,
        }
    }
}

/// An Nsight Compute command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ncu {
    /// The `ncu` executable.
    pub path: PathBuf,
}

impl Ncu {
    /// `$CUDARL_NCU`, else `ncu` on `PATH`, else `/usr/local/cuda/bin/ncu`; `None` when none is
    /// an executable file.
    pub fn find() -> Option<Ncu> {
        if let Some(p) = std::env::var_os("CUDARL_NCU") {
            let p = PathBuf::from(p);
            return p.is_file().then_some(Ncu { path: p });
        }
        crate::nvcc::on_path("ncu")
            .into_iter()
            .chain([PathBuf::from("/usr/local/cuda/bin/ncu")])
            .find(|p| p.is_file())
            .map(|path| Ncu { path })
    }

    /// Arguments before the profiled program: every kernel of the target process, the clocks
    /// left alone, [`METRICS`] as raw CSV in base units, written to `log`.
    pub fn args(&self, log: &Path) -> Vec<String> {
        vec![
            "--clock-control".into(),
            "none".into(),
            "--target-processes".into(),
            "all".into(),
            "--metrics".into(),
            METRICS.join(","),
            "--csv".into(),
            "--page".into(),
            "raw".into(),
            "--print-units".into(),
            "base".into(),
            "--log-file".into(),
            log.display().to_string(),
        ]
    }
}

fn number(field: &str) -> Option<f64> {
    let t: String = field.chars().filter(|c| *c != ',').collect();
    t.trim().parse().ok()
}

/// Reads `ncu --csv --page raw` output (a header row naming the metrics, a row of units, one row
/// per profiled kernel; anything before the header, such as `==PROF==` lines, is skipped), leaving
/// out the runner's own kernel ([`crate::runner::NOOP_KERNEL`]).
///
/// # Errors
/// No header, a metric column missing, a value not a number, no kernel, or a value out of range
/// (a fraction outside [0, 1] or a duration that is not positive).
pub fn parse_raw_csv(text: &str) -> Result<KernelProfile, String> {
    let start = text
        .find("\"ID\",")
        .ok_or("no CSV header (\"ID\",...) in the ncu log")?;
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .from_reader(&text.as_bytes()[start..]);
    let header = rdr.headers().map_err(|e| format!("ncu CSV: {e}"))?.clone();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| format!("ncu CSV: no column {name}"))
    };
    let (name_col, dur, occ, dram, tpi) = (
        col("Kernel Name")?,
        col(DURATION)?,
        col(ACHIEVED_OCCUPANCY)?,
        col(DRAM_THROUGHPUT)?,
        col(THREADS_PER_INSTRUCTION)?,
    );
    let (mut n, mut total, mut w_occ, mut w_dram, mut w_tpi) = (0u32, 0.0, 0.0, 0.0, 0.0);
    for rec in rdr.records() {
        let rec = rec.map_err(|e| format!("ncu CSV: {e}"))?;
        let name = rec.get(name_col).unwrap_or("");
        // The units row, and the runner's own kernel.
        if name.is_empty() || name.starts_with(NOOP_KERNEL) {
            continue;
        }
        let get = |c: usize| {
            rec.get(c)
                .and_then(number)
                .ok_or_else(|| format!("ncu CSV: {} of {name} is not a number", &header[c]))
        };
        let d = get(dur)?;
        if d <= 0.0 {
            return Err(format!("ncu CSV: {name} has duration {d} ns"));
        }
        let (o, b, t) = (get(occ)? / 100.0, get(dram)? / 100.0, get(tpi)? / 32.0);
        for (v, what) in [
            (o, "occupancy"),
            (b, "DRAM throughput"),
            (t, "warp efficiency"),
        ] {
            if !(0.0..=1.0 + 1e-6).contains(&v) {
                return Err(format!("ncu CSV: {name} has {what} {v} (outside 0-1)"));
            }
        }
        n += 1;
        total += d;
        w_occ += o * d;
        w_dram += b * d;
        w_tpi += t * d;
    }
    if n == 0 {
        return Err("ncu CSV: no kernel of the candidate was profiled".into());
    }
    Ok(KernelProfile {
        kernels: n,
        duration_ms: total / 1e6,
        achieved_occupancy: w_occ / total,
        dram_throughput: w_dram / total,
        warp_execution_efficiency: w_tpi / total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv(rows: &[&str]) -> String {
        let mut s = String::from("==PROF== Connected to process 7\n");
        s.push_str(&format!(
            "\"ID\",\"Process ID\",\"Kernel Name\",\"{}\",\"{}\",\"{}\",\"{}\"\n",
            DURATION, ACHIEVED_OCCUPANCY, DRAM_THROUGHPUT, THREADS_PER_INSTRUCTION
        ));
        s.push_str("\"\",\"\",\"\",\"nsecond\",\"%\",\"%\",\"\"\n");
        for r in rows {
            s.push_str(r);
            s.push('\n');
        }
        s
    }

    #[test]
    fn kernels_are_weighted_by_duration_and_the_runners_own_is_left_out() {
        let text = csv(&[
            "\"0\",\"7\",\"cudarl_noop\",\"1,000\",\"1\",\"1\",\"1\"",
            "\"1\",\"7\",\"add_kernel(float const*, float*)\",\"3,000\",\"80\",\"90\",\"32\"",
            "\"2\",\"7\",\"tail<float, 4>\",\"1000\",\"40\",\"10\",\"16\"",
        ]);
        let p = parse_raw_csv(&text).unwrap();
        assert_eq!(p.kernels, 2);
        assert!((p.duration_ms - 0.004).abs() < 1e-12);
        assert!((p.achieved_occupancy - 0.7).abs() < 1e-9);
        assert!((p.dram_throughput - 0.7).abs() < 1e-9);
        assert!((p.warp_execution_efficiency - 0.875).abs() < 1e-9);
    }

    #[test]
    fn impossible_counters_and_empty_logs_are_errors() {
        let over = csv(&["\"1\",\"7\",\"k\",\"100\",\"150\",\"10\",\"32\""]);
        assert!(parse_raw_csv(&over).unwrap_err().contains("occupancy"));
        let none = csv(&["\"0\",\"7\",\"cudarl_noop\",\"100\",\"1\",\"1\",\"1\""]);
        assert!(parse_raw_csv(&none).unwrap_err().contains("no kernel"));
        assert!(
            parse_raw_csv("==PROF== nothing")
                .unwrap_err()
                .contains("header")
        );
        let missing = "\"ID\",\"Kernel Name\"\n\"1\",\"k\"\n";
        assert!(parse_raw_csv(missing).unwrap_err().contains(DURATION));
    }

    #[test]
    fn ncu_arguments_leave_the_clocks_alone_and_write_to_the_log() {
        let a = Ncu {
            path: "/x/ncu".into(),
        }
        .args(Path::new("/judge/p.csv"));
        let s = a.join(" ");
        assert!(s.contains("--clock-control none"), "{s}");
        assert!(s.ends_with("--log-file /judge/p.csv"), "{s}");
        assert!(s.contains(ACHIEVED_OCCUPANCY));
    }
}
