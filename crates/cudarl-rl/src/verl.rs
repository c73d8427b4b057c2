//! Export of the RL curriculum in VERL's dataset layouts (volcengine/verl's `RLHFDataset` and
//! multi-turn SFT dataset), so the same tasks train on a Ray cluster through VERL when one GPU
//! is not enough.
//!
//! RL files (`rl_train.parquet`, `rl_test.parquet`), one row per task family, the columns
//! VERL's RL loader reads:
//! - `data_source` (utf8): `cudarl-pipe/tier{N}`, what VERL groups validation metrics by;
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
//! `export curriculum --format verl` writes the RL files, `export sft-data --format verl` the SFT
//! files, `export rl-train --format verl` all four.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int64Array, ListBuilder, StringArray, StringBuilder, StructArray, StructBuilder,
};
use arrow::datatypes::{DataType, Field, Fields, Schema};
use cudarl_cuda::task::TaskSpec;
use cudarl_curriculum::prompts::ChatMessage;
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

fn write(path: &Path, cols: Vec<(&str, ArrayRef)>) -> Result<(), String> {
    let schema = Arc::new(Schema::new(
        cols.iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), false))
            .collect::<Vec<_>>(),
    ));
    let b =
        batch(&schema, cols.into_iter().map(|(_, a)| a).collect()).map_err(|e| e.to_string())?;
    write_parquet(path, &b).map_err(|e| format!("{}: {e}", path.display()))
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
) -> Result<Vec<PathBuf>, String> {
    let held = crate::tasks::holdout_ids(sft_generator).map_err(|e| e.to_string())?;
    let mut written = export_rl(tasks, &held, dir, max_turns)?;
    written.extend(export_sft(sft_generator, dir)?);
    Ok(written)
}

/// The hold-out families (`test` split) of the `curriculum` node's `curriculum` table: the
/// task ids of its `synthetic` rows (`problem_id` `synth/<task>`) with split `test`.
///
/// # Errors
/// The table cannot be read or lacks `problem_id`, `source` or `split` (file and field named).
pub fn curriculum_holdout(curriculum: &Path) -> Result<BTreeSet<String>, String> {
    let t = Table::read(curriculum, "curriculum").map_err(|e| e.to_string())?;
    let (id, src, split) = (
        t.req_strings("problem_id").map_err(|e| e.to_string())?,
        t.req_strings("source").map_err(|e| e.to_string())?,
        t.req_strings("split").map_err(|e| e.to_string())?,
    );
    Ok((0..t.rows())
        .filter(|&i| src.get(i) == Some("synthetic") && split.get(i) == Some("test"))
        .filter_map(|i| Some(id.get(i)?.strip_prefix("synth/")?.to_string()))
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
) -> Result<Vec<PathBuf>, String> {
    let specs = crate::tasks::read_specs(tasks).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    // RL: one row per family, by split.
    // Both files always (an empty test set is still a file VERL can be pointed at).
    let mut by_split: BTreeMap<&str, Vec<TaskSpec>> = [("train", vec![]), ("test", vec![])].into();
    for spec in specs {
        let split = if held.contains(&spec.id) {
            "test"
        } else {
            "train"
        };
        by_split.entry(split).or_default().push(spec);
    }
    for (split, specs) in &by_split {
        let n = specs.len();
        let prompts: Vec<Vec<ChatMessage>> = specs
            .iter()
            .map(crate::episode::generator_conversation)
            .collect();
        let task_ids: Vec<String> = specs.iter().map(|t| t.id.clone()).collect();
        let tiers: Vec<i64> = specs.iter().map(|t| t.tier).collect();
        let path = dir.join(format!("rl_{split}.parquet"));
        write(
            &path,
            vec![
                (
                    "data_source",
                    s(tiers
                        .iter()
                        .map(|t| format!("cudarl-pipe/tier{t}"))
                        .collect()),
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
pub fn export_sft(sft_generator: &Path, dir: &Path) -> Result<Vec<PathBuf>, String> {
    let g = Table::read(sft_generator, "sft_generator").map_err(|e| e.to_string())?;
    let (gt, gs, gm) = (
        g.req_strings("task_id").map_err(|e| e.to_string())?,
        g.req_strings("split").map_err(|e| e.to_string())?,
        g.req_strings("messages_json").map_err(|e| e.to_string())?,
    );
    let gtier = g.req_ints("tier").map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
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
                    format!(
                        "{}: field messages_json, row {i}: {e}",
                        sft_generator.display()
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
