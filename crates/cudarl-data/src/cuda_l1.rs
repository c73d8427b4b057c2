//! CUDA-L1 optimized KernelBench kernels (`deepreinforce-ai/CUDA-L1`, MIT; bundled snapshot in
//! `datasets/cuda_l1/kernels.parquet`) into the `kernels` table.

use crate::error::{DataError, Result};
use crate::kernelbench::ProblemIndex;
use crate::kernels::{KernelRow, blake3_hex, detect_format};
use crate::parquet_io::Table;
use crate::sakana::Ingested;

/// Reads the CUDA-L1 snapshot. Rows with null `custom_code` (no faster kernel found) are
/// skipped; a row with a speedup claims correctness (CUDA-L1 only reports speedups of kernels
/// that passed its check).
///
/// `display` names the file in messages; `provenance` (dataset, revision, file name inside it)
/// goes into every row, followed by ` row N`. It must not depend on where the file lies locally,
/// since output bytes are keyed by content, not by path.
///
/// # Errors
/// Unreadable file, missing or mistyped required column, null identity field.
pub fn ingest(
    path: &std::path::Path,
    display: &str,
    provenance: &str,
    problems: &ProblemIndex,
) -> Result<Ingested> {
    let t = Table::read(path, display)?;
    let gpu = t.req_strings("gpu")?;
    let level = t.req_ints("level_id")?;
    let task = t.req_ints("task_id")?;
    let refc = t.req_strings("ref_code")?;
    let code = t.req_strings("custom_code")?;
    let sd = t.req_floats("score_default")?;
    let sc = t.floats("score_torch_compile_default")?;
    let mut out = Ingested::default();
    let (mut skipped, mut unknown) = (0usize, 0usize);
    for i in 0..t.rows() {
        let null = |field: &str| DataError::bad(display, Some(field), format!("null in row {i}"));
        let Some(c) = code.get(i) else {
            skipped += 1;
            continue;
        };
        let level = level.get(i).ok_or_else(|| null("level_id"))?;
        let task_id = task.get(i).ok_or_else(|| null("task_id"))?;
        let g = gpu.get(i).ok_or_else(|| null("gpu"))?;
        let pid = problems.id_for(level, task_id).map(str::to_string);
        if pid.is_none() {
            unknown += 1;
        }
        let reference = refc.get(i);
        let score = sd.get(i);
        out.rows.push(KernelRow {
            kernel_id: blake3_hex(c),
            row_id: format!("cuda-l1/{g}/L{level}/{task_id}"),
            source: "cuda-l1".into(),
            op_name: pid
                .as_deref()
                .and_then(|p| p.rsplit('/').next())
                .map(str::to_string),
            reference_matches_problem: match (&pid, reference) {
                (Some(p), Some(r)) => problems.reference_matches(p, r),
                _ => None,
            },
            problem_id: pid,
            level,
            task_id,
            kernel_name: None,
            abi: "torch".into(),
            format: detect_format(c).into(),
            has_cuda_kernel: c.contains("__global__"),
            code: c.to_string(),
            reference_code: reference.map(str::to_string),
            claimed_correct: score.map(|_| true),
            claimed_speedup_native: score,
            claimed_speedup_compile: sc.as_ref().and_then(|s| s.get(i)),
            gpu: Some(g.to_string()),
            provenance: format!("{provenance} row {i}"),
            ..Default::default()
        });
    }
    if skipped > 0 {
        let file = display.to_string();
        tracing::info!(%file, skipped, "rows without custom_code skipped");
    }
    if unknown > 0 {
        out.warnings.push(format!(
            "{display}: {unknown} rows name a (level, task) not in `problems`"
        ));
    }
    Ok(out)
}
