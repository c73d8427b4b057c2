//! Export of the RL curriculum in VERL's dataset layouts (volcengine/verl's `RLHFDataset` and
//! multi-turn SFT dataset), so the same tasks train on a Ray cluster through VERL when one GPU
//! is not enough.
//!
//! RL files (`rl_train.parquet`, `rl_test.parquet`), one row per task family, the columns
//! VERL's RL loader reads:
//! - `data_source` (utf8): what VERL groups validation metrics by: `cudarl-pipe/tier{N}` for a
//!   task family, `kernelbench/level{L}` for a KernelBench problem;
//! - `prompt` (list<struct<role, content>>): the generator's chat messages (system + task);
//! - `ability` (utf8): `cuda`;
//! - `reward_model` (struct<style: utf8, ground_truth: utf8>): style `rule`, ground truth the
//!   task id (the kernel-evaluation service judges a candidate against it);
//! - `extra_info` (struct<split, index, task_id, tier, max_turns>): split name, row index,
//!   the task, its tier, the turn limit of the agent loop;
//! - `agent_name` (utf8): the agent loop to run (`cudarl_kernel_agent`).
//!
//! SFT files (`sft_train.parquet`, `sft_val.parquet`): the generator's SFT rows with VERL's
//! multi-turn `messages` column (list<struct<role, content>>) plus task id, tier and split;
//! the hold-out (`test`) families are not exported for SFT.
//!
//! Splits: a family is in `rl_test` when it is held out (the `test` split the curriculum gives
//! it and `sft-data` follows), so VERL's validation set is the same hold-out as `eval`'s.
//! `export curriculum --format verl` writes the RL files with the task families and the
//! KernelBench problems `kb-specs` gave a native signature (the curriculum's `train` and `test`
//! problems, with their tier; `serve` judges them), `export sft-data --format verl` the SFT
//! files, `export rl-train --format verl` all four with the families `rl-train` practises.

pub mod job;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int64Array, ListBuilder, StringArray, StringBuilder, StructArray, StructBuilder,
};
use arrow::datatypes::{DataType, Field, Fields, Schema};
use cudarl_curriculum::prompts::ChatMessage;

use crate::RlError;
use crate::episode::EpisodeTask;
use cudarl_data::Table;
use cudarl_data::parquet_io::{batch, write_parquet};

/// The agent loop VERL runs for these rows (`python/cudarl_verl/agent_loop.py` registers it).
pub const AGENT_NAME: &str = "cudarl_kernel_agent";

fn s(v: Vec<String>) -> ArrayRef {
    Arc::new(StringArray::from(v))
}

fn st(fields: Vec<(&str, ArrayRef)>) -> ArrayRef {
    Arc::new(StructArray::from(
        fields
            .into_iter()
            .map(|(n, a)| (Arc::new(Field::new(n, a.data_type().clone(), false)), a))
            .collect::<Vec<_>>(),
    ))
}

fn write(path: &Path, cols: Vec<(&str, ArrayRef)>) -> Result<(), RlError> {
    let schema = Arc::new(Schema::new(
        cols.iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), false))
            .collect::<Vec<_>>(),
    ));
    let b = batch(&schema, cols.into_iter().map(|(_, a)| a).collect())?;
    write_parquet(path, &b).map_err(|e| RlError::Failed(format!("{}: {e}", path.display())))
}

/// Writes all four VERL files into `dir` (what `rl-train` trains on: [`export_rl`] with the
/// hold-out of the `sft-data` node's `sft_generator` table, then [`export_sft`]); returns the
/// files written.
///
/// # Errors
/// As [`export_rl`] and [`export_sft`].
pub fn export(
    tasks: &Path,
    sft_generator: &Path,
    dir: &Path,
    max_turns: usize,
) -> Result<Vec<PathBuf>, RlError> {
    let held = crate::tasks::holdout_ids(sft_generator)?;
    let mut written = export_rl(tasks, &held, dir, max_turns)?;
    written.extend(export_sft(sft_generator, dir)?);
    Ok(written)
}

/// The hold-out families (`test` split) of the `curriculum` node's `curriculum` table: the
/// task ids of its `synthetic` rows (`problem_id` `synth/<task>`) with split `test`.
///
/// # Errors
/// The table cannot be read or lacks `problem_id`, `source` or `split` (file and field named).
pub fn curriculum_holdout(curriculum: &Path) -> Result<BTreeSet<String>, RlError> {
    let rows =
        cudarl_tables::read::<cudarl_tables::curriculum::CurriculumRow>(curriculum, "curriculum")?;
    Ok(rows
        .into_iter()
        .filter(|r| r.source == "synthetic" && r.split == "test")
        .filter_map(|r| Some(r.problem_id.strip_prefix("synth/")?.to_string()))
        .collect())
}

/// One row of VERL's RL files: a task its agent loop runs and the kernel-evaluation service
/// judges (`reward_model.ground_truth` = `task_id`).
#[derive(Debug, Clone, PartialEq)]
pub struct RlTask {
    /// The task id: a family (`vector_add`) or a KernelBench problem (`kb/L1/19_ReLU`).
    pub task_id: String,
    /// Curriculum tier 0..3.
    pub tier: i64,
    /// What VERL groups validation metrics by: `cudarl-pipe/tier{N}` for the task families,
    /// `kernelbench/level{L}` for KernelBench problems (KernelBench reports per level).
    pub data_source: String,
    /// The generator's chat messages (system + task).
    pub prompt: Vec<ChatMessage>,
}

/// The task families of the `synth-tasks` node's `tasks` table as RL rows: `(split, row)`, split
/// `test` for those in `held`, else `train`.
///
/// # Errors
/// An unreadable table or bad task spec (file and field named).
pub fn family_rows(
    tasks: &Path,
    held: &BTreeSet<String>,
) -> Result<Vec<(String, RlTask)>, RlError> {
    let specs = crate::tasks::read_specs(tasks)?;
    Ok(specs
        .iter()
        .map(|spec| {
            let split = if held.contains(&spec.id) {
                "test"
            } else {
                "train"
            };
            let row = RlTask {
                task_id: spec.id.clone(),
                tier: spec.tier,
                data_source: format!("cudarl-pipe/tier{}", spec.tier),
                prompt: crate::episode::generator_conversation(spec),
            };
            (split.to_string(), row)
        })
        .collect())
}

/// The KernelBench problems of the `curriculum` node's `curriculum` table that have a native
/// signature (`kb-specs` covered them) as RL rows, `(split, row)`: the curriculum's `train`
/// problems as `train`, its `test` problems as `test`; its `val` problems are in neither (kept
/// for model selection). The prompt shows the problem's PyTorch source from the
/// `ingest-kernelbench` node's `problems` table
/// ([`cudarl_curriculum::prompts::module_description`]) and the launcher to define.
///
/// # Errors
/// A table cannot be read or lacks a column (file and field named); a covered problem missing
/// from `problems`.
pub fn kernelbench_rows(
    curriculum: &Path,
    problems: &Path,
) -> Result<Vec<(String, RlTask)>, RlError> {
    Ok(crate::kernelbench::curriculum_tasks(curriculum, problems)?
        .into_iter()
        .filter(|(split, _)| split == "train" || split == "test")
        .map(|(split, t)| {
            let row = RlTask {
                task_id: t.id.clone(),
                tier: t.tier,
                data_source: format!("kernelbench/level{}", t.level),
                prompt: crate::episode::generator_messages(&t.text().view(), 0, 0),
            };
            (split, row)
        })
        .collect())
}

/// Writes `rl_train.parquet` and `rl_test.parquet` into `dir`, one row per task family of the
/// `synth-tasks` node's `tasks` table, those in `held` as `test`; returns the files written.
///
/// # Errors
/// An unreadable table or bad task spec (file and field named), write errors.
pub fn export_rl(
    tasks: &Path,
    held: &BTreeSet<String>,
    dir: &Path,
    max_turns: usize,
) -> Result<Vec<PathBuf>, RlError> {
    write_rl(family_rows(tasks, held)?, dir, max_turns)
}

/// Writes `rl_train.parquet` and `rl_test.parquet` into `dir` for the whole curriculum: the task
/// families ([`family_rows`], hold-out by [`curriculum_holdout`]) and the KernelBench problems
/// with a native signature ([`kernelbench_rows`]), families first; returns the files written.
///
/// # Errors
/// As [`family_rows`], [`kernelbench_rows`] and [`curriculum_holdout`].
pub fn export_curriculum_rl(
    tasks: &Path,
    curriculum: &Path,
    problems: &Path,
    dir: &Path,
    max_turns: usize,
) -> Result<Vec<PathBuf>, RlError> {
    let held = curriculum_holdout(curriculum)?;
    let mut rows = family_rows(tasks, &held)?;
    rows.extend(kernelbench_rows(curriculum, problems)?);
    write_rl(rows, dir, max_turns)
}

/// Writes `rows` by split into `rl_train.parquet` and `rl_test.parquet` (both always: an empty
/// test set is still a file VERL can be pointed at).
fn write_rl(
    rows: Vec<(String, RlTask)>,
    dir: &Path,
    max_turns: usize,
) -> Result<Vec<PathBuf>, RlError> {
    std::fs::create_dir_all(dir).map_err(|e| RlError::Failed(format!("{}: {e}", dir.display())))?;
    let mut by_split: BTreeMap<String, Vec<RlTask>> =
        [("train".to_string(), vec![]), ("test".to_string(), vec![])].into();
    for (split, row) in rows {
        by_split.entry(split).or_default().push(row);
    }
    let mut written = Vec::new();
    for (split, rows) in &by_split {
        let n = rows.len();
        let prompts: Vec<Vec<ChatMessage>> = rows.iter().map(|r| r.prompt.clone()).collect();
        let task_ids: Vec<String> = rows.iter().map(|r| r.task_id.clone()).collect();
        let tiers: Vec<i64> = rows.iter().map(|r| r.tier).collect();
        let path = dir.join(format!("rl_{split}.parquet"));
        write(
            &path,
            vec![
                (
                    "data_source",
                    s(rows.iter().map(|r| r.data_source.clone()).collect()),
                ),
                ("prompt", messages_array(&prompts)),
                ("ability", s(vec!["cuda".into(); n])),
                (
                    "reward_model",
                    st(vec![
                        ("style", s(vec!["rule".into(); n])),
                        ("ground_truth", s(task_ids.clone())),
                    ]),
                ),
                (
                    "extra_info",
                    st(vec![
                        ("split", s(vec![split.to_string(); n])),
                        ("index", Arc::new(Int64Array::from_iter_values(0..n as i64))),
                        ("task_id", s(task_ids)),
                        ("tier", Arc::new(Int64Array::from(tiers))),
                        (
                            "max_turns",
                            Arc::new(Int64Array::from(vec![max_turns as i64; n])),
                        ),
                    ]),
                ),
                ("agent_name", s(vec![AGENT_NAME.into(); n])),
            ],
        )?;
        written.push(path);
    }
    Ok(written)
}

/// Writes `sft_train.parquet` and `sft_val.parquet` into `dir` from the `sft-data` node's
/// `sft_generator` table (the hold-out families are in neither); returns the files written.
///
/// # Errors
/// An unreadable table or a missing column (file and field named), bad `messages_json`, write
/// errors.
pub fn export_sft(sft_generator: &Path, dir: &Path) -> Result<Vec<PathBuf>, RlError> {
    let g = Table::read(sft_generator, "sft_generator")?;
    let (gt, gs, gm) = (
        g.req_strings("task_id")?,
        g.req_strings("split")?,
        g.req_strings("messages_json")?,
    );
    let gtier = g.req_ints("tier")?;
    std::fs::create_dir_all(dir).map_err(|e| RlError::Failed(format!("{}: {e}", dir.display())))?;
    let mut written = Vec::new();
    // SFT: the generator's rows with their `messages`, train and val (never the hold-out).
    for split in ["train", "val"] {
        let rows: Vec<usize> = (0..g.rows())
            .filter(|&i| gs.get(i) == Some(split))
            .collect();
        let msgs: Vec<Vec<ChatMessage>> = rows
            .iter()
            .map(|&i| {
                serde_json::from_str(gm.get(i).unwrap_or("[]")).map_err(|e| {
                    RlError::bad_input(
                        sft_generator.display().to_string(),
                        Some("messages_json"),
                        format!("row {i}: {e}"),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        let path = dir.join(format!("sft_{split}.parquet"));
        write(
            &path,
            vec![
                ("messages", messages_array(&msgs)),
                (
                    "task_id",
                    s(rows
                        .iter()
                        .map(|&i| gt.get(i).unwrap_or_default().to_string())
                        .collect()),
                ),
                (
                    "tier",
                    Arc::new(Int64Array::from(
                        rows.iter()
                            .map(|&i| gtier.get(i).unwrap_or(0))
                            .collect::<Vec<_>>(),
                    )),
                ),
                ("split", s(vec![split.to_string(); rows.len()])),
            ],
        )?;
        written.push(path);
    }
    Ok(written)
}

fn message_fields() -> Fields {
    Fields::from(vec![
        Field::new("role", DataType::Utf8, false),
        Field::new("content", DataType::Utf8, false),
    ])
}

/// Chat conversations as a `list<struct<role: utf8, content: utf8>>` column (the `messages`
/// layout of Hugging Face chat datasets, which VERL's SFT and RL loaders read).
pub fn messages_array(conversations: &[Vec<ChatMessage>]) -> ArrayRef {
    let mut lb = ListBuilder::new(StructBuilder::from_fields(message_fields(), 0)).with_field(
        Arc::new(Field::new("item", DataType::Struct(message_fields()), true)),
    );
    for msgs in conversations {
        let sb = lb.values();
        for m in msgs {
            sb.field_builder::<StringBuilder>(0)
                .expect("role")
                .append_value(&m.role);
            sb.field_builder::<StringBuilder>(1)
                .expect("content")
                .append_value(&m.content);
            sb.append(true);
        }
        lb.append(true);
    }
    Arc::new(lb.finish())
}

/// The Arrow type of a [`messages_array`] column.
pub fn messages_type() -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(message_fields()),
        true,
    )))
}
