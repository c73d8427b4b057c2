//! `cudarl-pipe optimize PROBLEM`: the trained agents as a tool. The problem (a KernelBench-format
//! PyTorch file, or a KernelBench problem id) is written as a one-problem KernelBench checkout
//! under the store, the pipeline's `optimize` node is built on it (`optimize-problem` ->
//! `optimize-specs` -> `optimize-tests` -> `optimize`, `crates/cudarl-stages/src/optimize.rs`),
//! and the kernel it kept is copied out with its `ModelNew` wrapper and verdict. `serve`'s
//! `POST /v1/optimize` runs the same ([`answer`]) and returns them inline.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarl_data::Table;
use serde::Serialize;

use super::{CliError, Ctx, output_blob};
use crate::report::CliReporter;

/// What `optimize` prints with `--json` (one line; docs/json.md).
#[derive(Debug, Serialize)]
struct Summary {
    /// `kb/L<level>/<name>`.
    problem_id: String,
    /// `verified` (correct on the GPU), `compiled` (built, not verified), `none`.
    status: String,
    /// Speedup of the kept kernel against torch eager and `torch.compile` (verified only).
    speedup_vs_torch: Option<f64>,
    speedup_vs_torch_compile: Option<f64>,
    /// Episodes run and the candidates (turns with code) they judged.
    episodes: i64,
    candidates: i64,
    /// `full` (GPU) or `compile-only`.
    mode: String,
    /// The folder the kernel, its `ModelNew` wrapper and verdict were written to (null: none).
    dir: Option<PathBuf>,
}

/// The problem's source, level and file stem (`<N>_<name>`: KernelBench's file naming).
fn problem_source(ctx: &Ctx, problem: &str, level: i64) -> Result<(String, i64, String), CliError> {
    if let Some(rest) = problem.strip_prefix("kb/L")
        && !Path::new(problem).exists()
    {
        let (l, name) = rest.split_once('/').ok_or_else(|| {
            CliError::usage(format!(
                "`{problem}`: a problem id reads kb/L<level>/<name>"
            ))
        })?;
        let l: i64 = l
            .parse()
            .map_err(|_| CliError::usage(format!("`{problem}`: level `{l}` is not a number")))?;
        let engine = ctx.engine(Arc::new(CliReporter::detect(false)), 0)?;
        super::build(&engine, "ingest-kernelbench")?;
        let problems = cudarl_rl::kernelbench::load_kb_problems(
            &output_blob(&engine, "ingest-kernelbench", "problems")?,
            None,
            engine.store(),
        )
        .map_err(|e| CliError::failed(e.to_string()))?;
        let p = problems
            .get(problem)
            .ok_or_else(|| CliError::usage(format!("unknown KernelBench problem `{problem}`")))?;
        return Ok((p.code.clone(), l, name.to_string()));
    }
    let path = Path::new(problem);
    let code = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("{problem}: cannot read: {e}")))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("problem");
    let name = problem_name(&code, problem, stem)?;
    Ok((code, level, name))
}

/// The KernelBench file name (`<N>_<name>`) of the source `code` named `stem` (`display` in
/// errors): characters other than ASCII letters and digits become `_`; a stem without a
/// leading number is problem number 0.
///
/// # Errors
/// `code` is not a KernelBench-format problem (no `class Model` or `get_inputs`).
fn problem_name(code: &str, display: &str, stem: &str) -> Result<String, CliError> {
    if !code.contains("class Model") || !code.contains("def get_inputs") {
        return Err(CliError::usage(format!(
            "{display}: not a KernelBench-format problem: it needs `class Model` (a torch.nn.Module) and `get_inputs()`"
        )));
    }
    let stem: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    // KernelBench files are `<number>_<name>.py`; another file is problem number 0.
    let numbered = stem.split_once('_').is_some_and(|(n, rest)| {
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && !rest.is_empty()
    });
    Ok(if numbered { stem } else { format!("0_{stem}") })
}

/// One problem optimized: what `--json` prints, and the kept kernel's source, `ModelNew` wrapper
/// and verdict (none when nothing was kept).
struct Outcome {
    summary: Summary,
    code: Option<String>,
    model_new: Option<String>,
    verdict: Option<serde_json::Value>,
}

/// `POST /v1/optimize` of `serve` ([`cudarl_serve::OptimizeRequest`]): as `optimize --json`,
/// with the kept kernel's `code`, `model_new` and `verdict`, and `dir` null (nothing is written
/// outside the store). A problem that is not one is 422.
///
/// # Errors
/// (HTTP status, message): 422 for bad input, 500 when a stage failed.
pub fn answer(
    ctx: &Ctx,
    req: cudarl_serve::OptimizeRequest,
) -> Result<serde_json::Value, (u16, String)> {
    let err = |e: CliError| (if e.code == 2 { 422 } else { 500 }, e.message);
    let level = req.level.unwrap_or(1);
    let (code, level, name) = match (&req.problem, &req.problem_id) {
        (_, Some(id)) => problem_source(ctx, id, level).map_err(err)?,
        (Some(text), None) => {
            let stem = req.name.as_deref().unwrap_or("problem");
            let name = problem_name(text, "problem", stem).map_err(err)?;
            (text.clone(), level, name)
        }
        (None, None) => return Err((422, "no problem given".into())),
    };
    let o =
        optimize_source(ctx, (&code, level, &name), (req.samples, req.turns), None).map_err(err)?;
    let mut v = serde_json::to_value(&o.summary).expect("json");
    v["code"] = o.code.into();
    v["model_new"] = o.model_new.into();
    v["verdict"] = o.verdict.unwrap_or(serde_json::Value::Null);
    Ok(v)
}

/// Runs `optimize` (see the module docs); the exit code is 0 when a kernel was verified.
pub fn run(
    ctx: &Ctx,
    problem: &str,
    out: &Path,
    (samples, turns, level): (Option<usize>, Option<usize>, i64),
    json: bool,
) -> Result<i32, CliError> {
    let (code, level, name) = problem_source(ctx, problem, level)?;
    let s = optimize_source(ctx, (&code, level, &name), (samples, turns), Some(out))?.summary;
    if json {
        super::json_line(&s);
    } else {
        let speed = |x: Option<f64>| x.map_or("n/a".to_string(), |x| format!("{x:.2}x"));
        let what = match s.status.as_str() {
            "verified" => format!(
                "verified: correct on the recorded tests and at the problem's own sizes; {} torch eager, {} torch.compile",
                speed(s.speedup_vs_torch),
                speed(s.speedup_vs_torch_compile)
            ),
            "compiled" if s.mode == "full" => {
                "no kernel passed the tests; the first that compiled is kept, NOT verified".into()
            }
            "compiled" => {
                "compile-only (no GPU): a kernel compiled against the launcher; nothing ran, so nothing is verified".into()
            }
            _ => "no kernel compiled against the launcher".into(),
        };
        println!(
            "{}: {what} ({} episodes, {} candidates)",
            s.problem_id, s.episodes, s.candidates
        );
        if let Some(d) = &s.dir {
            println!("written to {}", d.display());
        }
    }
    Ok(if s.status == "verified" { 0 } else { 1 })
}

/// Writes the one-problem checkout of (`code`, `level`, `name`) under the store, builds the
/// `optimize` node on it, and, with `out`, copies the kept kernel's files to `out/<name>/`.
///
/// # Errors
/// A level outside 1 to 4 (usage), a stage that failed, an unreadable result.
fn optimize_source(
    ctx: &Ctx,
    (code, level, name): (&str, i64, &str),
    (samples, turns): (Option<usize>, Option<usize>),
    out: Option<&Path>,
) -> Result<Outcome, CliError> {
    if !(1..=4).contains(&level) {
        return Err(CliError::usage(format!(
            "--level {level}: KernelBench levels are 1 to 4"
        )));
    }
    let id = format!("kb/L{level}/{name}");
    // A one-problem KernelBench checkout, named by the problem's content.
    let dir = ctx
        .store
        .join("optimize-problems")
        .join(&blake3::hash(code.as_bytes()).to_hex()[..16]);
    let file = dir.join(format!("level{level}")).join(format!("{name}.py"));
    if std::fs::read_to_string(&file).ok().as_deref() != Some(code) {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(file.parent().expect("has a parent"))
            .and_then(|_| std::fs::write(&file, code))
            .map_err(|e| CliError::failed(format!("{}: {e}", file.display())))?;
    }
    let mut extra = vec![format!(
        "optimize-problem.path={}",
        toml::Value::String(dir.display().to_string())
    )];
    if let Some(n) = samples {
        extra.push(format!("optimize.samples={n}"));
    }
    if let Some(n) = turns {
        extra.push(format!("optimize.max_turns={n}"));
    }
    let engine = ctx.engine_with(Arc::new(CliReporter::detect(false)), 0, &extra)?;
    let rc = super::run_or_report(&engine, &["optimize".to_string()])?;
    if rc != 0 {
        return Err(CliError {
            code: rc,
            message: "the `optimize` node did not build (see above)".into(),
        });
    }
    let t = Table::read(&output_blob(&engine, "optimize", "result")?, "result")
        .map_err(|e| CliError::failed(e.to_string()))?;
    let col = |c: &str| {
        t.req_strings(c)
            .map_err(|e| CliError::failed(e.to_string()))
    };
    let (ids, status, mode) = (col("problem_id")?, col("status")?, col("mode")?);
    let f64s = |c: &str| t.req_floats(c).map_err(|e| CliError::failed(e.to_string()));
    let (vs_torch, vs_compile) = (f64s("speedup_vs_torch")?, f64s("speedup_vs_torch_compile")?);
    let ints = |c: &str| t.req_ints(c).map_err(|e| CliError::failed(e.to_string()));
    let (episodes, candidates) = (ints("episodes")?, ints("candidates")?);
    let i = (0..t.rows())
        .find(|&i| ids.get(i) == Some(id.as_str()))
        .ok_or_else(|| CliError::failed(format!("`optimize` has no result for `{id}`")))?;
    let status = status.get(i).unwrap_or("none").to_string();
    let kept = status != "none";
    let dir = match out.filter(|_| kept) {
        Some(out) => {
            let d = out.join(name);
            cudarl_stages::common::materialize(
                engine.store(),
                &output_blob(&engine, "optimize", "kernel")?,
                &d,
                cudarl_stages::common::Placement::Copied,
            )?;
            Some(d)
        }
        None => None,
    };
    let text = |c: &str| -> Result<Option<String>, CliError> {
        Ok(t.strings(c)
            .map_err(|e| CliError::failed(e.to_string()))?
            .and_then(|col| col.get(i).map(String::from))
            .filter(|_| kept))
    };
    let (kernel, model_new) = (text("code")?, text("model_new")?);
    let verdict = text("verdict_json")?.and_then(|v| serde_json::from_str(&v).ok());
    Ok(Outcome {
        summary: Summary {
            problem_id: id,
            speedup_vs_torch: vs_torch.get(i),
            speedup_vs_torch_compile: vs_compile.get(i),
            episodes: episodes.get(i).unwrap_or(0),
            candidates: candidates.get(i).unwrap_or(0),
            mode: mode.get(i).unwrap_or("").to_string(),
            dir,
            status,
        },
        code: kernel,
        model_new,
        verdict,
    })
}
