//! `bench torch-build`: cold torch-extension builds of the bundled SakanaAI archive sample's
//! kernels (SakanaAI-style `.cu` extensions, the format `validate-archive` and torch-format
//! checks build), each built as one translation unit with `torch/extension.h` (the baseline)
//! and as the harness builds it ([`cudarl_cuda::Compiler::compile_torch_ext`]: the
//! kernel/host layout with the precompiled torch header, else the `torch/types.h` split, else
//! one unit), in the same run, with no compile cache. The precompiled header is built (or
//! found) first and its cost reported apart. Reports the median wall seconds per build of
//! each, their ratio, the layout each build used, and whether each kernel built (or failed)
//! the same way both times.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use cudarl_cuda::pyworker::TorchEnv;
use cudarl_cuda::static_check::Rules;
use cudarl_cuda::torchfmt::{self, Format, Prepared};
use cudarl_cuda::{Compiler, Nvcc};
use serde_json::json;

use super::{CliError, Ctx};
use crate::cmd::bench::{finish, machine, median};

/// Runs the benchmark on `kernels` distinct archive kernels (taken from levels 1, 2 and 3 in
/// turn), `jobs` builds at a time (each split build runs two compiler processes).
///
/// # Errors
/// No nvcc, no Python with torch (the build environment), an unreadable sample, a harness
/// failure.
pub fn run(ctx: &Ctx, kernels: usize, jobs: usize, out: Option<PathBuf>) -> Result<i32, CliError> {
    let by_level = sample_by_level(ctx)?;
    let preps = prepare_in_turn(&by_level, kernels)?;
    let mut py = cudarl_cuda::pyworker::PyWorker::start(&ctx.root).map_err(CliError::failed)?;
    let env = TorchEnv::query(&mut py).map_err(CliError::failed)?;
    let compiler = compiler(ctx)?;
    let t_pch = Instant::now();
    let pch = compiler
        .torch_host_pch(&env, &[], torchfmt::TORCH_BUILD_TIMEOUT)
        .map_err(CliError::failed)?;
    let pch_s = t_pch.elapsed().as_secs_f64();
    let (results, wall) = build_all(&preps, &compiler, &env, jobs);
    let Paired {
        rows,
        one,
        two,
        agree,
        layouts,
    } = Paired::of(results)?;
    let (m1, m2) = (median(one), median(two));
    let result = json!({
        "benchmark": "torch-build",
        "kernels": rows.len(),
        "jobs": jobs,
        "one_unit_median_s": m1,
        "harness_median_s": m2,
        "speedup": if m2 > 0.0 { m1 / m2 } else { 0.0 },
        "same_build_result": agree,
        "layouts": layouts,
        "pch_build_s": pch_s,
        "pch": pch.map(|p| p.display().to_string()),
        "wall_s": wall,
        "nvcc": compiler.nvcc.version,
        "torch": env.torch,
        "machine": machine(),
        "builds": rows,
    });
    eprintln!(
        "torch-extension build, median of {} kernels: one unit {m1:.1} s, harness {m2:.1} s ({:.2}x; layouts {}); same result {agree}/{}; precompiled header {pch_s:.1} s",
        result["kernels"],
        result["speedup"].as_f64().unwrap_or(0.0),
        result["layouts"],
        result["kernels"]
    );
    finish(result, out)
}

/// The bundled archive sample's distinct torch-extension kernels (`PYBIND11_MODULE`) by level,
/// in the sample's order.
///
/// # Errors
/// An unreadable sample, or one without the `CUDA_Code` and `Level_ID` columns.
fn sample_by_level(ctx: &Ctx) -> Result<BTreeMap<i64, Vec<String>>, CliError> {
    let path = ctx
        .root
        .join(cudarl_stages::ingest_sakana::IngestSakana::BUNDLED);
    let t =
        cudarl_data::Table::read(&path, &path.display().to_string()).map_err(CliError::failed)?;
    let (code, level) = (
        t.req_strings("CUDA_Code").map_err(CliError::failed)?,
        t.req_ints("Level_ID").map_err(CliError::failed)?,
    );
    let mut by_level: BTreeMap<i64, Vec<String>> = Default::default();
    let mut seen = std::collections::HashSet::new();
    for i in 0..t.rows() {
        if let (Some(c), Some(l)) = (code.get(i), level.get(i))
            && c.contains("PYBIND11_MODULE")
            && seen.insert(c.to_string())
        {
            by_level.entry(l).or_default().push(c.to_string());
        }
    }
    Ok(by_level)
}

/// Up to `kernels` kernels of `by_level` prepared as torch extensions, taking the levels in
/// turn; a kernel the static checks reject (nothing to build) is passed over.
///
/// # Errors
/// Preparing a kernel failed.
fn prepare_in_turn(
    by_level: &BTreeMap<i64, Vec<String>>,
    kernels: usize,
) -> Result<Vec<Prepared>, CliError> {
    let rules = Rules::builtin();
    let mut preps = Vec::new();
    for k in 0.. {
        if preps.len() >= kernels || by_level.values().all(|v| v.len() <= k) {
            break;
        }
        for v in by_level.values() {
            if let Some(c) = v.get(k).filter(|_| preps.len() < kernels) {
                let p = torchfmt::prepare(c, Format::Extension, &rules, None)
                    .map_err(CliError::failed)?;
                if !p.units.is_empty() {
                    preps.push(p);
                }
            }
        }
    }
    Ok(preps)
}

/// The compiler the builds use: the discovered nvcc for this machine's GPU architecture
/// (`sm_90` without a GPU), no timeout beyond the default and no compile cache.
///
/// # Errors
/// No nvcc.
fn compiler(ctx: &Ctx) -> Result<Compiler, CliError> {
    let nvcc = Nvcc::discover(&ctx.root).map_err(CliError::failed)?;
    Ok(Compiler {
        nvcc,
        arch: cudarl_cuda::gpu::probe()
            .map(|g| g.arch)
            .unwrap_or_else(|| "sm_90".into()),
        timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
        store: None,
    })
}

/// One build's outcome: wall seconds, whether it compiled, and the layout it used.
type BuildOutcome = (f64, bool, String);

/// One finished build: the kernel's index in the prepared kernels, whether it was the harness
/// build, and its outcome.
type Built = (usize, bool, Result<BuildOutcome, CliError>);

/// Builds `prep`'s first unit as the harness does (`split`) or as one unit: (wall s, compiled,
/// layout); nothing to build is (0, false, "").
///
/// # Errors
/// The build could not run.
fn build_one(
    prep: &Prepared,
    compiler: &Compiler,
    env: &TorchEnv,
    split: bool,
) -> Result<BuildOutcome, CliError> {
    let Some(u) = prep.units.first() else {
        return Ok((0.0, false, String::new()));
    };
    let s = u.split.as_ref().filter(|_| split);
    let t0 = Instant::now();
    let o = compiler
        .compile_torch_ext(
            &u.text,
            s,
            &u.module,
            env,
            &u.extra,
            torchfmt::TORCH_BUILD_TIMEOUT,
        )
        .map_err(CliError::failed)?;
    Ok((t0.elapsed().as_secs_f64(), o.compiled, o.layout))
}

/// Builds every kernel of `preps` both ways, `jobs` builds at a time (the first way alternates
/// between kernels): (kernel, split?, outcome) in the order they finished, and the wall
/// seconds of all the builds.
fn build_all(
    preps: &[Prepared],
    compiler: &Compiler,
    env: &TorchEnv,
    jobs: usize,
) -> (Vec<Built>, f64) {
    let work: Vec<(usize, bool)> = (0..preps.len())
        .flat_map(|i| [(i, i % 2 == 0), (i, i % 2 != 0)])
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    let t_all = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..jobs.max(1) {
            sc.spawn(|| {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(&(i, split)) = work.get(k) else {
                        break;
                    };
                    let r = build_one(&preps[i], compiler, env, split);
                    results.lock().expect("lock").push((i, split, r));
                }
            });
        }
    });
    let wall = t_all.elapsed().as_secs_f64();
    (results.into_inner().expect("lock"), wall)
}

/// Both builds of each kernel side by side: a JSON row per kernel, the one-unit and the
/// harness build's wall seconds, how many kernels built (or failed) the same way both times,
/// and the kernels per harness layout.
struct Paired {
    /// Per kernel: its index, both wall times, the layout and whether each build compiled.
    rows: Vec<serde_json::Value>,
    /// One-unit build seconds, per kernel.
    one: Vec<f64>,
    /// Harness build seconds, per kernel.
    two: Vec<f64>,
    /// Kernels whose two builds agreed on compiling.
    agree: usize,
    /// Kernels per harness layout.
    layouts: BTreeMap<String, usize>,
}

impl Paired {
    /// Pairs `results` (kernel, split?, outcome) by kernel.
    ///
    /// # Errors
    /// The first build that could not run, in kernel order.
    fn of(mut results: Vec<Built>) -> Result<Paired, CliError> {
        let mut p = Paired {
            rows: Vec::new(),
            one: Vec::new(),
            two: Vec::new(),
            agree: 0,
            layouts: BTreeMap::new(),
        };
        results.sort_by_key(|(i, s, _)| (*i, *s));
        let mut it = results.into_iter();
        while let (Some((i, _, a)), Some((_, _, b))) = (it.next(), it.next()) {
            let ((sa, ca, _), (sb, cb, layout)) = (a?, b?);
            p.one.push(sa);
            p.two.push(sb);
            p.agree += usize::from(ca == cb);
            *p.layouts.entry(layout.clone()).or_insert(0usize) += 1;
            p.rows.push(
                json!({"kernel": i, "one_unit_s": sa, "harness_s": sb, "layout": layout,
                "compiled_one_unit": ca, "compiled_harness": cb}),
            );
        }
        Ok(p)
    }
}
