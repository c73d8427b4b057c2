//! `optimize`: the trained agents as a tool (docs/architecture.md, "Optimizing a problem"). For
//! every KernelBench-format problem of its `kb_problems` input (normally the one `cudarl-pipe
//! optimize PROBLEM` wrote: a PyTorch `Model` with `get_inputs`, or a KernelBench problem by id),
//! with the native launcher `kb-specs` derived and, on a GPU, the tests `testgen` recorded, it
//! runs the RL generator and optimizer with the rule-based tester for `samples` episodes of up to
//! `max_turns` turns ([`cudarl_rl::episode::run_episodes`] with [`cudarl_rl::kb_judge::KbJudge`]: the
//! recorded tests, the problem's own sizes, timing against torch eager and `torch.compile`) and
//! keeps the best verified kernel: correct, no hack flag, the fastest against torch eager.
//! Without a GPU nothing runs: the best candidate that compiled is kept as `compiled`, never as
//! verified.
//!
//! | table | columns |
//! |---|---|
//! | `result` | problem_id, status (utf8: `verified` (correct on the GPU), `compiled` (built, not run or not correct), `none`), episode, turn (int64, nullable: where the kept kernel came from), code, model_new (utf8, nullable: the kernel and a KernelBench `ModelNew` wrapper, [`cudarl_cuda::native_abi::KbNative::model_new`]), speedup_vs_torch, speedup_vs_torch_compile (float64, nullable), verdict_json (utf8, nullable), episodes, candidates (int64: turns with code), mode, device (utf8) |
//! | `turns` | one row per turn: [`cudarl_tables::turns::OptimizeTurnRow`] |
//! | `kernel` | file, digest, bytes: `<name>.cu`, `<name>_model_new.py`, `<name>_verdict.json` of each problem with a kept kernel |

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{
    InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext, StageError,
};
use cudarl_rl::episode::{EpisodeSettings, run_episodes};
use cudarl_rl::kernelbench::KbTask;
use cudarl_tables::TableRow;
use cudarl_tables::turns::OptimizeTurnRow;
use serde::{Deserialize, Serialize};

use crate::common::{CHECKPOINT, ingest_dir, resolve_device, write_rows};
use crate::rl_params::StageParams;
use crate::rl_params::harness;
use cudarl_rl::kb_judge::KbJudge;

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "optimize";

/// Parameters (`[stages.optimize]`): the sampling, turns, reward, mode and device of `rl-train`
/// plus these.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Episodes per problem (each up to `max_turns` turns: the generator's kernel, then the
    /// optimizer's revisions with the tester's feedback).
    #[serde(default = "d_samples")]
    pub samples: usize,
    /// Sampling, turns, reward, mode, device (as `rl-train`; the update settings are unused).
    #[serde(flatten)]
    pub rl: crate::rl_params::Params,
}

fn d_samples() -> usize {
    4
}

/// Schema of `result`.
pub static RESULT: LazyLock<SchemaRef> = LazyLock::new(|| {
    let f = |n: &str, t: DataType, null: bool| Field::new(n, t, null);
    Arc::new(Schema::new(vec![
        f("problem_id", DataType::Utf8, false),
        f("status", DataType::Utf8, false),
        f("episode", DataType::Int64, true),
        f("turn", DataType::Int64, true),
        f("code", DataType::Utf8, true),
        f("model_new", DataType::Utf8, true),
        f("speedup_vs_torch", DataType::Float64, true),
        f("speedup_vs_torch_compile", DataType::Float64, true),
        f("verdict_json", DataType::Utf8, true),
        f("episodes", DataType::Int64, false),
        f("candidates", DataType::Int64, false),
        f("mode", DataType::Utf8, false),
        f("device", DataType::Utf8, false),
    ]))
});

/// One row of `result`.
#[derive(Debug, Serialize)]
struct ResultRow {
    problem_id: String,
    status: &'static str,
    episode: Option<i64>,
    turn: Option<i64>,
    code: Option<String>,
    model_new: Option<String>,
    speedup_vs_torch: Option<f64>,
    speedup_vs_torch_compile: Option<f64>,
    verdict_json: Option<String>,
    episodes: i64,
    candidates: i64,
    mode: &'static str,
    device: &'static str,
}

/// The `optimize` stage.
#[derive(Debug)]
pub struct Optimize {
    params: Params,
}

impl Optimize {
    /// From the pipeline's table.
    ///
    /// # Errors
    /// Unknown keys or values, and what `rl-train`'s checks refuse.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        params.rl.check()?;
        if params.samples == 0 {
            return Err("samples must be at least 1".into());
        }
        Ok(Optimize { params })
    }
}

/// The problems of `path` (an `ingest-kernelbench` `problems` table) `judge` can judge, as
/// tasks with their launchers and the curriculum's tier (`cats`, as the `curriculum` stage
/// decides it), and the reason of each one it cannot.
fn problems(
    path: &std::path::Path,
    judge: &KbJudge,
    cats: &cudarl_curriculum::tiers::Categories,
) -> Result<(Vec<KbTask>, Vec<String>), StageError> {
    let (mut tasks, mut left) = (Vec::new(), Vec::new());
    let rows = cudarl_tables::read::<cudarl_tables::problems::ProblemRow>(path, "problems")
        .map_err(crate::common::data_err)?;
    for r in rows {
        let (Some(abi), Some(problem)) = (judge.abi(&r.problem_id), judge.problem(&r.problem_id))
        else {
            left.push(format!(
                "`{}`: kb-specs derived no native launcher",
                r.problem_id
            ));
            continue;
        };
        if !judge.judges(&r.problem_id) {
            left.push(format!("`{}`: testgen recorded no tests", r.problem_id));
            continue;
        }
        tasks.push(KbTask {
            tier: cats.decide(Some(r.level), &r.op_features).tier,
            level: r.level,
            name: r.name,
            code: problem.code.clone(),
            signature: abi.signature.clone(),
            id: r.problem_id,
        });
    }
    Ok((tasks, left))
}

/// The kept kernel among `eps` (one problem's episodes, in order): the fastest verified turn
/// against torch eager (ties: the earliest), else the first turn that compiled; with its status
/// and episode.
fn keep(
    eps: &[cudarl_rl::episode::Episode],
) -> Option<(&'static str, usize, &cudarl_rl::episode::Turn)> {
    let turns = || {
        eps.iter()
            .enumerate()
            .flat_map(|(e, ep)| ep.turns.iter().map(move |t| (e, t)))
            .filter(|(_, t)| t.code.is_some())
    };
    let verified = turns()
        .filter(|(_, t)| {
            t.reward.mode == "full"
                && t.reward.correct == Some(true)
                && t.reward.hack_flags.is_empty()
        })
        .fold(
            None,
            |best: Option<(usize, &cudarl_rl::episode::Turn)>, (e, t)| {
                let s = |t: &cudarl_rl::episode::Turn| t.reward.speedup_vs_torch.unwrap_or(0.0);
                match best {
                    Some((_, b)) if s(b) >= s(t) => best,
                    _ => Some((e, t)),
                }
            },
        );
    verified.map(|(e, t)| ("verified", e, t)).or_else(|| {
        turns()
            .find(|(_, t)| t.reward.compiled && t.reward.hack_flags.is_empty())
            .map(|(e, t)| ("compiled", e, t))
    })
}

impl Stage for Optimize {
    // 2: the tester's feedback on a launcher without the task's signature names the expected
    // declaration.
    stage_identity!(KIND, 2);
    fn inputs(&self) -> Vec<InputDecl> {
        let mut v = vec![
            InputDecl::external("reward"),
            InputDecl::external("op_categories"),
            InputDecl::node("kb_problems", "ingest-kernelbench", "problems"),
            InputDecl::node("kb_specs", "kb-specs", "kb_specs"),
            InputDecl::node("kb_tests", "testgen", "kb_tests"),
        ];
        v.extend(self.params.rl.agent_inputs([
            ("generator", "rl-train", "generator"),
            ("optimizer", "rl-train", "optimizer"),
        ]));
        v
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("result", RESULT.clone()),
            OutputDecl::table(OptimizeTurnRow::NAME, OptimizeTurnRow::schema()),
            OutputDecl::table("kernel", CHECKPOINT.clone()),
        ]
    }
    fn resolve_external(
        &self,
        input: &str,
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        match input {
            "op_categories" => crate::common::single_file(
                &ctx.root,
                cudarl_curriculum::tiers::OP_CATEGORIES,
                "op categories",
            ),
            _ => self
                .params
                .rl
                .resolve_external(input, ["generator", "optimizer"], ctx),
        }
    }
    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        self.params.rl.environment(ctx)
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let p = &self.params;
        let cfg = p.rl.reward_config(ctx)?;
        let device = resolve_device(p.rl.device);
        let h = harness(ctx, &p.rl, BTreeMap::new())?;
        let mode = h.mode();
        let mut judge = crate::kb_judge::from_inputs(ctx, &h, p.rl.timeout_s)?;
        let path = ctx.input_path("kb_problems")?.to_path_buf();
        let cats = crate::common::load_categories(ctx, cudarl_curriculum::tiers::OP_CATEGORIES)?;
        let (tasks, left) = problems(&path, &judge, &cats)?;
        if tasks.is_empty() {
            return Err(StageError::bad_input(
                path.display().to_string(),
                Some("problem_id"),
                format!("no problem can be optimized: {}", left.join("; ")),
            ));
        }
        let tmp = ctx.store().temp_dir()?;
        let mut tc =
            p.rl.start_trainer(ctx, ("generator", "optimizer"), tmp.path(), (None, true))?;
        let settings = EpisodeSettings {
            max_turns: p.rl.max_turns,
            public_seeds: h.public_seeds.clone(),
        };
        let many: Vec<&KbTask> = tasks
            .iter()
            .flat_map(|t| std::iter::repeat_n(t, p.samples))
            .collect();
        let bar = ctx.progress("episodes", Some(many.len() as u64));
        let eps = run_episodes(&many, &mut tc, &mut judge, &cfg, &settings)
            .map_err(crate::common::rl_err)?;
        bar.inc(eps.len() as u64);
        bar.finish();
        tc.quit();
        let (mut results, mut turns) = (Vec::new(), Vec::new());
        let files = tmp.path().join("kernel");
        std::fs::create_dir_all(&files).map_err(|e| StageError::Failed(e.to_string()))?;
        for (k, task) in tasks.iter().enumerate() {
            let mine = &eps[k * p.samples..(k + 1) * p.samples];
            for (e, ep) in mine.iter().enumerate() {
                turns.extend(ep.turns.iter().map(|t| OptimizeTurnRow {
                    problem_id: task.id.clone(),
                    episode: e as i64,
                    turn: t.columns(&ep.task_id, ep.tier, 0.0),
                }));
            }
            let candidates = mine
                .iter()
                .flat_map(|ep| &ep.turns)
                .filter(|t| t.code.is_some())
                .count() as i64;
            let mut row = ResultRow {
                problem_id: task.id.clone(),
                status: "none",
                episode: None,
                turn: None,
                code: None,
                model_new: None,
                speedup_vs_torch: None,
                speedup_vs_torch_compile: None,
                verdict_json: None,
                episodes: mine.len() as i64,
                candidates,
                mode,
                device,
            };
            if let Some((status, e, t)) = keep(mine) {
                let code = t.code.clone().unwrap_or_default();
                let verdict = judge.verdict(&task.id, &code);
                let note = match (status, verdict) {
                    ("verified", Some(v)) => format!(
                        "Verified by cudarl-pipe optimize on {}: correct on testgen's recorded tests and at the problem's own sizes; {:.2}x torch eager{}.",
                        v.gpu.as_ref().map_or("a GPU", |g| g.name.as_str()),
                        v.speedup_vs_torch.unwrap_or(0.0),
                        v.speedup_vs_torch_compile
                            .map_or(String::new(), |s| format!(", {s:.2}x torch.compile"))
                    ),
                    ("verified", None) => "Verified by cudarl-pipe optimize.".to_string(),
                    _ => format!(
                        "NOT verified: cudarl-pipe optimize built this kernel ({mode}) but it did not pass on a GPU."
                    ),
                };
                row.model_new = judge
                    .abi(&task.id)
                    .map(|a| a.model_new(&task.id, &code, &note));
                row.status = status;
                row.episode = Some(e as i64);
                row.turn = Some(t.turn as i64);
                row.speedup_vs_torch = t.reward.speedup_vs_torch;
                row.speedup_vs_torch_compile = t.reward.speedup_vs_torch_compile;
                row.verdict_json = verdict.and_then(|v| serde_json::to_string(v).ok());
                let write = |name: String, text: &str| {
                    std::fs::write(files.join(name), text)
                        .map_err(|e| StageError::Failed(e.to_string()))
                };
                write(format!("{}.cu", task.name), &code)?;
                if let Some(m) = &row.model_new {
                    write(format!("{}_model_new.py", task.name), m)?;
                }
                if let Some(v) = &row.verdict_json {
                    write(format!("{}_verdict.json", task.name), v)?;
                }
                row.code = Some(code);
            }
            results.push(row);
        }
        write_rows(ctx, "result", &RESULT, &results)?;
        write_rows(
            ctx,
            OptimizeTurnRow::NAME,
            &OptimizeTurnRow::schema(),
            &turns,
        )?;
        ingest_dir(ctx, &files, "kernel")
    }
}
