//! `collab-data`: the SFT agents' multi-turn episodes on the families RL may practise, the turns
//! the harness verified kept as SFT examples (rejection-sampling fine-tuning: STaR, Zelikman et
//! al. 2022; expert iteration), for `collab-sft` and `collab-sft-optimizer` (the `sft-train`
//! stage from the SFT checkpoints on these tables; docs/architecture.md, "Training").
//!
//! `samples` episodes per family of `task_pool` (as `rl-train`'s: sft-data's `rl` split when it
//! reserved one, else `train`; never the hold-out), generator -> tester -> optimizer -> tester
//! ..., up to `max_turns`, sampled at `temperature`. Kept ([`cudarl_rl::collab::select`]): a
//! generator turn that passed; an optimizer turn that repaired the kernel it was given or sped
//! it up by `min_speedup` or more; at most `per_task` distinct kernels per family and agent,
//! the highest rewards first. Compile-only machines keep compiled turns and compile repairs,
//! and say so (`validated`, `mode`). Beside them, a `replay` share of sft-data's `train` rows
//! (seeded) and all its `val` rows, so the fine-tune keeps the SFT data's formats.
//!
//! | table | columns |
//! |---|---|
//! | `sft_generator`, `sft_optimizer` | sft-data's schemas; kept turns have `kernel_id` `collab:<blake3 of the code, 16 hex>`, `validated` `correct` or `compile-only`, `split` `train`; the optimizer's `base_kernel_id` names the kernel it was given the same way, `kind` `collab:repair` or `collab:speedup`, `speedup` the measured ratio to the given kernel (speed-ups) |
//! | `collected` | agent (utf8), episodes, turns, kept, correct, repairs, speedups, replayed (int64), pass_rate (float64, nullable: episodes whose best turn passed; null in compile-only mode), compile_rate (float64), mode, device (utf8) |

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{InputDecl, OutputDecl, ParamsError, Stage, StageContext, StageError};
use cudarl_cuda::task::TaskSpec;
use cudarl_curriculum::prompts::ChatMessage;
use cudarl_curriculum::sample::order;
use cudarl_data::Table;
use cudarl_protocol::Role;
use cudarl_rl::collab::{Kept, Kind, Selection, select};
use cudarl_rl::episode::{EpisodeSettings, run_episodes};
use cudarl_rl::sft::SftRows;
use serde::{Deserialize, Serialize};

use cudarl_tables::TableRow;

use crate::common::{data_err, resolve_device, write_rows, write_sft_tables};
use crate::rl_params::StageParams;
use crate::rl_params::{harness, load_tasks};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "collab-data";

/// Schema of `collected`.
pub static COLLECTED: LazyLock<SchemaRef> = LazyLock::new(|| {
    let i = |n: &str| Field::new(n, DataType::Int64, false);
    Arc::new(Schema::new(vec![
        Field::new("agent", DataType::Utf8, false),
        i("episodes"),
        i("turns"),
        i("kept"),
        i("correct"),
        i("repairs"),
        i("speedups"),
        i("replayed"),
        Field::new("pass_rate", DataType::Float64, true),
        Field::new("compile_rate", DataType::Float64, false),
        Field::new("mode", DataType::Utf8, false),
        Field::new("device", DataType::Utf8, false),
    ]))
});

fn d_samples() -> usize {
    4
}
fn d_per_task() -> usize {
    2
}
fn d_min_speedup() -> f64 {
    1.1
}
fn d_replay() -> f64 {
    0.1
}
fn d_batch() -> usize {
    64
}

/// Parameters (`[stages.collab-data]`): these, plus `rl-train`'s sampling, turn, harness and
/// task-pool settings (the update settings are unused).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Episodes per family.
    #[serde(default = "d_samples")]
    pub samples: usize,
    /// Families at most (a seeded draw from the pool); absent: every family of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tasks: Option<usize>,
    /// Kept turns per family and agent at most (distinct kernels, highest reward first).
    #[serde(default = "d_per_task")]
    pub per_task: usize,
    /// An optimizer turn counts as a speed-up at this ratio to the kernel it was given.
    #[serde(default = "d_min_speedup")]
    pub min_speedup: f64,
    /// Share of sft-data's `train` rows (per agent, seeded) replayed beside the kept turns.
    #[serde(default = "d_replay")]
    pub replay: f64,
    /// Episodes run at once (one batched generation and one harness call per turn).
    #[serde(default = "d_batch")]
    pub batch: usize,
    /// Sampling, turns, reward, mode, device, seed and `task_pool`, as `rl-train`.
    #[serde(flatten)]
    pub rl: crate::rl_params::Params,
}

/// The `collab-data` stage.
#[derive(Debug)]
pub struct CollabData {
    params: Params,
}

impl CollabData {
    /// From the pipeline's table.
    ///
    /// # Errors
    /// Unknown keys, `samples`, `per_task` or `batch` 0, `min_speedup` not above 0, `replay`
    /// outside [0, 1].
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        let bad = [
            (params.samples == 0, "samples must be at least 1"),
            (params.per_task == 0, "per_task must be at least 1"),
            (params.batch == 0, "batch must be at least 1"),
            (
                !(params.min_speedup > 0.0 && params.min_speedup.is_finite()),
                "min_speedup must be a ratio above 0",
            ),
            (
                !(0.0..=1.0).contains(&params.replay),
                "replay must be a share in [0, 1]",
            ),
        ];
        if let Some((_, m)) = bad.iter().find(|(b, _)| *b) {
            return Err((*m).into());
        }
        Ok(CollabData { params })
    }
}

/// One row of `collected`.
#[derive(Debug, Serialize)]
struct CollectedRow {
    agent: &'static str,
    episodes: i64,
    turns: i64,
    kept: i64,
    correct: i64,
    repairs: i64,
    speedups: i64,
    replayed: i64,
    pass_rate: Option<f64>,
    compile_rate: f64,
    mode: &'static str,
    device: &'static str,
}

/// `collab:<16 hex of blake3>`: a kept kernel's id.
fn kernel_id(code: &str) -> String {
    format!("collab:{}", &blake3::hash(code.as_bytes()).to_hex()[..16])
}

/// Appends to `rows` the `val` rows of sft-data's table `path` and a seeded `share` of its
/// `train` rows; returns how many `train` rows. The optimizer's table (`optimizer`) carries its
/// base kernel, speedup and kind.
fn replay(
    rows: &mut SftRows,
    path: &std::path::Path,
    optimizer: bool,
    share: f64,
    seed: u64,
) -> Result<usize, StageError> {
    let t = Table::read(path, "sft-data").map_err(data_err)?;
    let s = |n: &str| t.req_strings(n).map_err(data_err);
    let (task, split, kernel, validated, msgs) = (
        s("task_id")?,
        s("split")?,
        s("kernel_id")?,
        s("validated")?,
        s("messages_json")?,
    );
    let tier = t.req_ints("tier").map_err(data_err)?;
    let (base, kind) = if optimizer {
        (Some(s("base_kernel_id")?), Some(s("kind")?))
    } else {
        (None, None)
    };
    let speedup = if optimizer {
        t.floats("speedup").map_err(data_err)?
    } else {
        None
    };
    let train: Vec<usize> = (0..t.rows())
        .filter(|&r| split.get(r) == Some("train"))
        .collect();
    let n = (share * train.len() as f64).round() as usize;
    let mut pick: Vec<usize> = order(train.len(), seed)
        .into_iter()
        .take(n)
        .map(|i| train[i])
        .collect();
    pick.sort_unstable();
    pick.extend((0..t.rows()).filter(|&r| split.get(r) == Some("val")));
    for r in pick {
        let m: Vec<ChatMessage> =
            serde_json::from_str(msgs.get(r).unwrap_or("[]")).map_err(|e| {
                StageError::bad_input(
                    path.display().to_string(),
                    Some("messages_json"),
                    e.to_string(),
                )
            })?;
        rows.add(
            (task.get(r).unwrap_or_default(), tier.get(r).unwrap_or(0)),
            |_| split.get(r).unwrap_or_default().to_string(),
            (
                kernel.get(r).unwrap_or_default(),
                validated.get(r).unwrap_or_default(),
            ),
            m,
            (
                base.as_ref().and_then(|b| b.get(r)).unwrap_or_default(),
                speedup.as_ref().and_then(|x| x.get(r)),
                kind.as_ref().and_then(|k| k.get(r)).unwrap_or_default(),
            ),
        );
    }
    Ok(n)
}

impl Stage for CollabData {
    stage_identity!(KIND, 1);
    fn inputs(&self) -> Vec<InputDecl> {
        let mut v = crate::rl_params::task_inputs();
        v.push(InputDecl::node(
            "optimizer_data",
            "sft-data",
            "sft_optimizer",
        ));
        v.extend(self.params.rl.agent_inputs([
            ("generator", "sft-train", "checkpoint"),
            ("optimizer", "sft-train-optimizer", "checkpoint"),
        ]));
        v
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table(
                "sft_generator",
                cudarl_tables::sft::SftGeneratorRow::schema(),
            ),
            OutputDecl::table(
                "sft_optimizer",
                cudarl_tables::sft::SftOptimizerRow::schema(),
            ),
            OutputDecl::table("collected", COLLECTED.clone()),
        ]
    }
    rl_checkpoints_external!("generator", "optimizer");
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let p = &self.params;
        let cfg = p.rl.reward_config(ctx)?;
        let ts = load_tasks(ctx)?;
        let mut pool = ts.pool(p.rl.task_pool);
        if pool.is_empty() {
            return Err(StageError::bad_input(
                "tasks",
                Some("task_id"),
                format!("no `{}` families to collect on", p.rl.task_pool.as_str()),
            ));
        }
        if let Some(n) = p.max_tasks {
            let o = order(pool.len(), p.rl.seed);
            let mut pick: Vec<usize> = o.into_iter().take(n).collect();
            pick.sort_unstable();
            pool = pick.into_iter().map(|i| pool[i]).collect();
        }
        let device = resolve_device(p.rl.device);
        let mut h = harness(ctx, &p.rl, ts.naive.clone())?;
        let mode = h.mode();
        let tmp = ctx.store().temp_dir()?;
        let dir = tmp.path();
        let mut tc =
            p.rl.start_trainer(ctx, ("generator", "optimizer"), dir, (None, true))?;
        let settings = EpisodeSettings {
            max_turns: p.rl.max_turns,
            public_seeds: h.public_seeds.clone(),
        };
        let all: Vec<&TaskSpec> = pool
            .iter()
            .flat_map(|t| std::iter::repeat_n(*t, p.samples))
            .collect();
        let bar = ctx.progress("episodes", Some(all.len() as u64));
        let mut episodes = Vec::with_capacity(all.len());
        for chunk in all.chunks(p.batch) {
            let eps = run_episodes(chunk, &mut tc, &mut h, &cfg, &settings)
                .map_err(crate::common::rl_err)?;
            bar.inc(chunk.len() as u64);
            episodes.extend(eps);
        }
        tc.quit();
        let kept = select(
            &episodes,
            &Selection {
                per_task: p.per_task,
                min_speedup: p.min_speedup,
            },
        );
        let validated = if mode == "full" {
            "correct"
        } else {
            "compile-only"
        };
        let (mut gens, mut opt) = (SftRows::default(), SftRows::default());
        for k in &kept {
            let (rows, kind) = match k.role {
                Role::Generator => (&mut gens, String::new()),
                Role::Optimizer => (&mut opt, format!("collab:{}", k.kind.as_str())),
            };
            let base = k.given.as_deref().map(kernel_id).unwrap_or_default();
            rows.add(
                (&k.task_id, k.tier),
                |_| "train".to_string(),
                (&kernel_id(&k.code), validated),
                k.messages.clone(),
                (&base, k.speedup, &kind),
            );
        }
        let (kept_gen, kept_opt) = (gens.len(), opt.len());
        let seed = p.rl.seed ^ 0x00C0_11AB;
        let rg = replay(&mut gens, ctx.input_path("data")?, false, p.replay, seed)?;
        let ro = replay(
            &mut opt,
            ctx.input_path("optimizer_data")?,
            true,
            p.replay,
            seed,
        )?;
        for (agent, n, r) in [("generator", kept_gen, rg), ("optimizer", kept_opt, ro)] {
            if n + r == 0 {
                return Err(StageError::Failed(format!(
                    "collab-data: no {agent} examples: nothing kept and `replay` gives no sft-data rows"
                )));
            }
            if n == 0 {
                ctx.warn(format!(
                    "kept no {agent} turns of {} episodes: collab-sft fine-tunes the {agent} on {r} replayed sft-data rows alone",
                    episodes.len()
                ));
            }
        }
        write_sft_tables(ctx, gens, &opt)?;
        let rows = collected_rows(
            &episodes,
            &kept,
            [(kept_gen, rg), (kept_opt, ro)],
            (mode, device),
        );
        ctx.stat("kept_generator", kept_gen as u64);
        ctx.stat("kept_optimizer", kept_opt as u64);
        write_rows(ctx, "collected", &COLLECTED, &rows)
    }
}

/// The `collected` rows, one per agent: the episodes and turns collected, the turns kept
/// (`kept`; per agent `[(kept, replayed)]` for the generator then the optimizer) by kind, the
/// sft-data rows replayed beside them, and the episodes' rates.
fn collected_rows(
    episodes: &[cudarl_rl::episode::Episode],
    kept: &[Kept],
    [(kept_gen, rg), (kept_opt, ro)]: [(usize, usize); 2],
    (mode, device): (&'static str, &'static str),
) -> Vec<CollectedRow> {
    let eps: Vec<&cudarl_rl::episode::Episode> = episodes.iter().collect();
    let (compile_rate, pass_rate) = cudarl_rl::step::rates(&eps);
    let count = |role: Role, kind: Kind| {
        kept.iter()
            .filter(|k| k.role == role && k.kind == kind)
            .count() as i64
    };
    let turns = |role: Role| {
        episodes
            .iter()
            .flat_map(|e| &e.turns)
            .filter(|t| t.role == role)
            .count() as i64
    };
    [
        (Role::Generator, "generator", kept_gen, rg),
        (Role::Optimizer, "optimizer", kept_opt, ro),
    ]
    .into_iter()
    .map(|(role, agent, n, r)| CollectedRow {
        agent,
        episodes: episodes.len() as i64,
        turns: turns(role),
        kept: n as i64,
        correct: count(role, Kind::Correct),
        repairs: count(role, Kind::Repair),
        speedups: count(role, Kind::Speedup),
        replayed: r as i64,
        pass_rate,
        compile_rate,
        mode,
        device,
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::params_json;

    #[test]
    fn bad_params_are_named() {
        let t = |s: &str| toml::from_str::<toml::Table>(s).unwrap();
        for (bad, says) in [
            ("samples = 0", "samples must be at least 1"),
            ("per_task = 0", "per_task must be at least 1"),
            ("min_speedup = 0.0", "min_speedup must be a ratio above 0"),
            ("replay = 1.5", "replay must be a share in [0, 1]"),
            ("sample = 2", "unknown field `sample`"),
        ] {
            let e = CollabData::from_table(t(bad)).unwrap_err().0;
            assert!(e.contains(says), "{bad}: {e}");
        }
        let p = CollabData::from_table(t("max_turns = 3")).unwrap().params;
        assert_eq!(params_json(&p)["max_turns"], 3);
        assert!(params_json(&p).get("max_tasks").is_none());
    }
}
