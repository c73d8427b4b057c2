//! The stages' side of the KernelBench judge ([`cudarl_rl::kb_judge::KbJudge`]): built from a
//! stage's inputs (`kb_problems`, `kb_specs`, `kb_tests`, `kb_curriculum`), and the native
//! launchers of a `kb_specs` table.

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
    let problems = crate::common::load_kb_problems(
        ctx.input_path("kb_problems")?,
        gpu.is_some()
            .then(|| ctx.input_path("kb_tests"))
            .transpose()?,
        ctx.store(),
    )?;
    let abis: BTreeMap<String, KbNative> = native_abis(ctx.input_path("kb_specs")?)?
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
    .map_err(StageError::Failed)?
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

/// The native ABI of KernelBench problem `problem_id` from a `kb_specs` table (`path`):
/// `Ok(Ok(abi))`, or `Ok(Err(why))` for a problem without a native signature (its
/// `excluded_reason`) or not in the table.
///
/// # Errors
/// As [`native_abis`].
pub fn native_abi(
    path: &std::path::Path,
    problem_id: &str,
) -> Result<Result<KbNative, String>, StageError> {
    Ok(native_abis(path)?
        .remove(problem_id)
        .unwrap_or_else(|| Err(format!("`{problem_id}` is not in kb-specs' levels"))))
}

/// Every problem of a `kb_specs` table (`path`, [`cudarl_tables::kb_specs::KbSpecRow`]): its
/// native ABI, or why it has none (its `excluded_reason`).
///
/// # Errors
/// The table cannot be read, lacks a column, or a JSON column does not parse (naming the file
/// and the column; exit 2).
pub fn native_abis(
    path: &std::path::Path,
) -> Result<BTreeMap<String, Result<KbNative, String>>, StageError> {
    let rows = cudarl_tables::read::<cudarl_tables::kb_specs::KbSpecRow>(path, "kb_specs")
        .map_err(crate::common::data_err)?;
    let mut out = BTreeMap::new();
    for r in rows {
        let abi = match &r.signature {
            None => Err(format!(
                "`{}` has no native signature: {}",
                r.problem_id,
                r.excluded_reason.as_deref().unwrap_or("no signature")
            )),
            Some(signature) => Ok(
                KbNative::from_row(signature, &r.buffers_json, &r.sizes_json)
                    .map_err(|e| StageError::bad_input(path.display().to_string(), None, e))?,
            ),
        };
        out.insert(r.problem_id, abi);
    }
    Ok(out)
}
