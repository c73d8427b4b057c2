//! The stages' side of the KernelBench judge ([`cudarl_rl::kb_judge::KbJudge`]): built from a
//! stage's inputs (`kb_problems`, `kb_specs`, `kb_tests`, `kb_curriculum`).

use std::collections::BTreeMap;
use std::time::Duration;

use cudarl_core::{StageContext, StageError};
use cudarl_cuda::Compiler;
use cudarl_cuda::native_abi::KbNative;
use cudarl_rl::kb_judge::KbJudge;
use cudarl_rl::kernelbench::KbTask;

/// The KernelBench judge of the stage's inputs `kb_problems`, `kb_specs` and, on a GPU,
/// `kb_tests` ([`kb_inputs`]): `h`'s compiler, the GPU when `h` runs full tests, the launchers
/// `kb-specs` derived, and `timeout_s` per worker step but at least a minute (a KernelBench run
/// is the recorded tests, the problem's own sizes and timing in one step).
///
/// # Errors
/// An input table cannot be read or lacks a column (file and field named).
pub fn from_inputs(
    ctx: &StageContext<'_>,
    h: &cudarl_rl::harness::Harness,
    timeout_s: u64,
) -> Result<KbJudge, StageError> {
    from_compiler(ctx, h.compiler.clone(), h.mode() == "full", timeout_s)
}

/// [`from_inputs`] with `compiler`, on the GPU when `gpu` (and one is found).
///
/// # Errors
/// As [`from_inputs`].
pub fn from_compiler(
    ctx: &StageContext<'_>,
    compiler: Compiler,
    gpu: bool,
    timeout_s: u64,
) -> Result<KbJudge, StageError> {
    let gpu = gpu.then(cudarl_cuda::gpu::probe).flatten();
    let problems = cudarl_rl::kernelbench::load_kb_problems(
        ctx.input_path("kb_problems")?,
        gpu.is_some()
            .then(|| ctx.input_path("kb_tests"))
            .transpose()?,
        ctx.store(),
    )
    .map_err(crate::common::rl_err)?;
    let abis: BTreeMap<String, KbNative> =
        cudarl_rl::kernelbench::native_abis(ctx.input_path("kb_specs")?)
            .map_err(crate::common::rl_err)?
            .into_iter()
            .filter_map(|(id, a)| Some((id, a.ok()?)))
            .collect();
    Ok(KbJudge::new(
        compiler,
        abis,
        problems,
        gpu,
        (ctx.root(), cudarl_cuda::worker::DEFAULT_GPU_WORKERS),
        Duration::from_secs(timeout_s.max(60)),
    ))
}

/// The curriculum's KernelBench problems of `split` (`train`, `val`, `test`) that the judge
/// [`from_inputs`] makes can judge ([`KbJudge::judges`]), in the curriculum's order, with that
/// judge; the curriculum is the input `kb_curriculum`.
///
/// # Errors
/// An input table cannot be read or lacks a column (file and field named).
pub fn curriculum_split(
    ctx: &StageContext<'_>,
    h: &cudarl_rl::harness::Harness,
    split: &str,
    timeout_s: u64,
) -> Result<(Vec<KbTask>, KbJudge), StageError> {
    let judge = from_inputs(ctx, h, timeout_s)?;
    let tasks = cudarl_rl::kernelbench::curriculum_tasks(
        ctx.input_path("kb_curriculum")?,
        ctx.input_path("kb_problems")?,
    )
    .map_err(crate::common::rl_err)?
    .into_iter()
    .filter(|(s, t)| s == split && judge.judges(&t.id))
    .map(|(_, t)| t)
    .collect();
    Ok((tasks, judge))
}

/// The inputs [`curriculum_split`] reads: the curriculum, the KernelBench problems, their native
/// launchers and their recorded tests.
pub fn kb_inputs() -> Vec<cudarl_core::InputDecl> {
    use cudarl_core::InputDecl;
    vec![
        InputDecl::node("kb_curriculum", "curriculum", "curriculum"),
        InputDecl::node("kb_problems", "ingest-kernelbench", "problems"),
        InputDecl::node("kb_specs", "kb-specs", "kb_specs"),
        InputDecl::node("kb_tests", "testgen", "kb_tests"),
    ]
}
