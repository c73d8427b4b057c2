//! Helpers shared by stages: error mapping, path resolution, params, writing typed rows,
//! checkpoints in the store, the models' device, trainer jobs, KernelBench problems with their
//! recorded tests.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use arrow::array::{Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{Digest, ExternalFiles, StageContext, StageError};
use cudarl_data::hub::HubDataset;
use cudarl_data::{DataError, Table};
use cudarl_protocol::Device;
use serde::{Deserialize, Serialize};

/// Maps a data-layer error to a stage error (bad input and unreachable sources exit with 2).
pub fn data_err(e: DataError) -> StageError {
    match e {
        DataError::BadInput {
            file,
            field,
            message,
        } => StageError::BadInput {
            file,
            field,
            message,
        },
        DataError::Source {
            source_desc,
            message,
        } => StageError::BadInput {
            file: source_desc,
            field: None,
            message,
        },
        DataError::Write { file, message } => {
            StageError::Failed(format!("write {file}: {message}"))
        }
    }
}

/// A path as shown in messages: relative to the project root when inside it.
pub fn display_path(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// Resolves a path from a pipeline file against the project root.
pub fn rooted(root: &Path, p: &str) -> PathBuf {
    let pb = PathBuf::from(p);
    if pb.is_absolute() { pb } else { root.join(pb) }
}

/// One existing file as an external input; the key sees only its file name.
///
/// # Errors
/// [`StageError::BadInput`] if the file does not exist.
pub fn single_file(root: &Path, p: &str, source: &str) -> Result<ExternalFiles, StageError> {
    let path = rooted(root, p);
    if !path.is_file() {
        return Err(StageError::bad_input(p, None, "file not found"));
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("input")
        .to_string();
    Ok(ExternalFiles {
        source: source.to_string(),
        files: vec![(name, path)],
    })
}

/// Hub params of an ingest stage. Only `repo`, `revision` and `files` enter the cache key;
/// where the cache lives and whether the network is used do not change the data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HubParams {
    /// `owner/name` of the dataset.
    pub repo: String,
    /// Branch, tag or commit.
    #[serde(default = "main_rev")]
    pub revision: String,
    /// Files to read, as paths inside the repository.
    pub files: Vec<String>,
    /// Hub cache directory (default: `HF_HUB_CACHE`, `$HF_HOME/hub`, `~/.cache/huggingface/hub`).
    #[serde(default, skip_serializing)]
    pub cache_dir: Option<String>,
    /// Never use the network (also `HF_HUB_OFFLINE=1`).
    #[serde(default, skip_serializing)]
    pub offline: bool,
    /// Hub endpoint (default `HF_ENDPOINT` or `https://huggingface.co`).
    #[serde(default, skip_serializing)]
    pub endpoint: Option<String>,
}

fn main_rev() -> String {
    "main".to_string()
}

impl HubParams {
    /// Resolves the files through the hub cache (downloading unless offline).
    ///
    /// # Errors
    /// [`StageError::BadInput`] naming the file that cannot be had.
    pub fn resolve(&self, root: &Path) -> Result<ExternalFiles, StageError> {
        let ds = HubDataset {
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            cache_dir: self.cache_dir.as_deref().map(|d| rooted(root, d)),
            offline: self.offline,
            endpoint: self.endpoint.clone(),
        };
        let files = ds.resolve(&self.files).map_err(data_err)?;
        Ok(ExternalFiles {
            source: ds.describe(),
            files,
        })
    }
}

/// Parses a stage's params table with unknown keys rejected.
///
/// # Errors
/// The deserializer's message (names the unknown or mistyped field).
pub fn parse_params<P: serde::de::DeserializeOwned>(
    t: toml::Table,
) -> Result<P, cudarl_core::ParamsError> {
    toml::Value::Table(t)
        .try_into::<P>()
        .map_err(|e| cudarl_core::ParamsError(e.to_string().trim_end().to_string()))
}

/// Serializes params for the cache key. A `model` that names a checkpoint directory
/// ([`is_checkpoint_dir`]) is keyed as `"checkpoint directory"`: where the directory lies is not
/// part of the key, its files are (the stage's external input, [`checkpoint_files`]).
pub fn params_json<P: Serialize>(p: &P) -> serde_json::Value {
    let mut v = serde_json::to_value(p).expect("params serialize");
    if let Some(m) = v.get_mut("model")
        && m.as_str().is_some_and(is_checkpoint_dir)
    {
        *m = serde_json::Value::from("checkpoint directory");
    }
    v
}

pub use cudarl_rl::params::is_checkpoint_dir;

/// The files of a Hugging Face checkpoint directory a stage reads, by name: `config.json`,
/// `tokenizer.json`, `tokenizer_config.json` and `generation_config.json` when present, and the
/// weights: `model.safetensors`, or `model.safetensors.index.json` and every shard its
/// `weight_map` names. Other files (a README, `.gitattributes`) are not read and do not enter
/// the key.
///
/// # Errors
/// [`StageError::BadInput`] naming the directory or file: no directory, a required file
/// missing, an unreadable index.
pub fn checkpoint_files(root: &Path, dir: &str) -> Result<ExternalFiles, StageError> {
    let path = rooted(root, dir);
    if !path.is_dir() {
        return Err(StageError::bad_input(
            dir,
            Some("model"),
            "no such checkpoint directory",
        ));
    }
    let mut names: Vec<String> = Vec::new();
    for (f, required) in [
        ("config.json", true),
        ("tokenizer.json", true),
        ("tokenizer_config.json", false),
        ("generation_config.json", false),
    ] {
        if path.join(f).is_file() {
            names.push(f.into());
        } else if required {
            return Err(StageError::bad_input(
                format!("{dir}/{f}"),
                None,
                "missing: a Hugging Face checkpoint has config.json, tokenizer.json and \
                 safetensors weights",
            ));
        }
    }
    let index = "model.safetensors.index.json";
    if path.join(index).is_file() {
        let rel = format!("{dir}/{index}");
        let text = std::fs::read_to_string(path.join(index))
            .map_err(|e| StageError::bad_input(&rel, None, e.to_string()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| StageError::bad_input(&rel, None, e.to_string()))?;
        let map = v
            .get("weight_map")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| StageError::bad_input(&rel, Some("weight_map"), "not an object"))?;
        let mut shards: Vec<String> = map
            .values()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect();
        shards.sort();
        shards.dedup();
        for sh in &shards {
            if sh.contains('/') || !path.join(sh).is_file() {
                return Err(StageError::bad_input(
                    &rel,
                    Some("weight_map"),
                    format!("shard `{sh}` is not a file of the directory"),
                ));
            }
        }
        names.push(index.into());
        names.extend(shards);
    } else if path.join("model.safetensors").is_file() {
        names.push("model.safetensors".into());
    } else {
        return Err(StageError::bad_input(
            format!("{dir}/model.safetensors"),
            None,
            "missing (and no model.safetensors.index.json): the weights in safetensors",
        ));
    }
    names.sort();
    Ok(ExternalFiles {
        source: "Hugging Face checkpoint directory".into(),
        files: names
            .into_iter()
            .map(|n| (n.clone(), path.join(n)))
            .collect(),
    })
}

/// A model input as a directory the trainer loads: a Hugging Face checkpoint directory (an
/// external input, [`checkpoint_files`]) is read where it lies; a `checkpoint` table of the
/// store is copied into `dest` first ([`materialize`]).
///
/// # Errors
/// An unknown input, a malformed table or a missing blob.
pub fn checkpoint_dir(
    ctx: &cudarl_core::StageContext<'_>,
    input: &str,
    dest: &Path,
) -> Result<PathBuf, StageError> {
    if let Ok(ext) = ctx.input_files(input) {
        let first = ext.files.first().ok_or_else(|| {
            StageError::Failed(format!("input `{input}`: an empty checkpoint directory"))
        })?;
        return Ok(first
            .1
            .parent()
            .expect("a file of the directory")
            .to_path_buf());
    }
    materialize(ctx.store(), ctx.input_path(input)?, dest, Placement::Linked)?;
    Ok(dest.to_path_buf())
}

/// A model checkpoint input named `name`: the output `output` of node `node`, or, where
/// `model` names a checkpoint directory, an external input that [`checkpoint_files`] resolves.
pub fn checkpoint_input(
    name: &str,
    (node, output): (&str, &str),
    model: Option<&str>,
) -> cudarl_core::InputDecl {
    match model {
        Some(m) if is_checkpoint_dir(m) => cudarl_core::InputDecl::external(name),
        _ => cudarl_core::InputDecl::node(name, node, output),
    }
}

/// Writes a batch to the stage's output path, mapping errors.
///
/// # Errors
/// Write failures.
pub fn write_output(
    ctx: &cudarl_core::StageContext<'_>,
    name: &str,
    batch: &arrow::array::RecordBatch,
) -> Result<(), StageError> {
    cudarl_data::write_parquet(&ctx.output_path(name), batch).map_err(data_err)
}

/// Inputs of an archive-ingest stage: its external `source` and the `problems` table it joins to.
pub fn kernel_ingest_inputs() -> Vec<cudarl_core::InputDecl> {
    vec![
        cudarl_core::InputDecl::external("source"),
        cudarl_core::InputDecl::node("problems", "ingest-kernelbench", "problems"),
    ]
}

/// Output of an archive-ingest stage: the normalized `kernels` table.
pub fn kernel_ingest_outputs() -> Vec<cudarl_core::OutputDecl> {
    vec![cudarl_core::OutputDecl::table(
        "kernels",
        cudarl_data::schemas::KERNELS.clone(),
    )]
}

/// Params JSON for the key, without the `hub` table unless the source is the hub.
pub fn params_json_hub<P: Serialize>(p: &P, uses_hub: bool) -> serde_json::Value {
    let mut v = params_json(p);
    if !uses_hub && let Some(o) = v.as_object_mut() {
        o.remove("hub");
    }
    v
}

/// The harness's nvcc for a stage: discovered from the project root (the venv's wheel, then
/// `PATH`), SASS for `sm_90` (Hopper: H100, H200; PTX from a newer nvcc does not
/// load on its driver), the default compile timeout, results cached in the stage's store.
///
/// # Errors
/// No nvcc (the message says where it looked).
pub fn store_compiler(
    ctx: &cudarl_core::StageContext<'_>,
) -> Result<cudarl_cuda::Compiler, StageError> {
    let nvcc =
        cudarl_cuda::Nvcc::discover(ctx.root()).map_err(|e| StageError::Failed(e.to_string()))?;
    Ok(cudarl_cuda::Compiler {
        nvcc,
        arch: "sm_90".into(),
        timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
        store: Some(ctx.store().clone()),
    })
}

/// Schema of `checkpoint` / `tokenizer`.
pub static CHECKPOINT: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("file", DataType::Utf8, false),
        Field::new("digest", DataType::Utf8, false),
        Field::new("bytes", DataType::Int64, false),
    ]))
});

/// `auto` / `cpu` / `cuda` as the trainer will resolve it: `auto` is `cuda` when the driver
/// reports a GPU.
pub(crate) fn resolve_device(device: Device) -> &'static str {
    match device {
        Device::Cpu => "cpu",
        Device::Cuda => "cuda",
        _ if cudarl_cuda::gpu::probe().is_some() => "cuda",
        _ => "cpu",
    }
}

/// Writes `rows` (typed, one struct per row with the columns of `schema`) as the stage's
/// output `name`.
///
/// # Errors
/// A row does not fit the schema, or the write fails.
pub fn write_rows<T: Serialize>(
    ctx: &StageContext<'_>,
    name: &str,
    schema: &SchemaRef,
    rows: &[T],
) -> Result<(), StageError> {
    let b = cudarl_data::parquet_io::rows_batch(schema, rows).map_err(data_err)?;
    write_output(ctx, name, &b)
}

/// Puts every file under `dir` into the store; the `checkpoint` table rows, sorted by path.
pub fn ingest_dir(ctx: &mut StageContext<'_>, dir: &Path, name: &str) -> Result<(), StageError> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| StageError::Failed(e.to_string()))? {
        let p = e.map_err(|e| StageError::Failed(e.to_string()))?.path();
        if p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    let (mut f, mut d, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for p in files {
        let digest = ctx.store().ingest_file(&p)?;
        ctx.reference_blob(digest);
        f.push(
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
        );
        d.push(digest.to_hex());
        b.push(std::fs::metadata(ctx.store().blob_path(&digest)).map_or(0, |m| m.len() as i64));
    }
    let batch = cudarl_data::parquet_io::batch(
        &CHECKPOINT.clone(),
        vec![
            Arc::new(StringArray::from(f)),
            Arc::new(StringArray::from(d)),
            Arc::new(Int64Array::from(b)),
        ],
    )
    .map_err(data_err)?;
    write_output(ctx, name, &batch)
}

/// How [`materialize`] places a stored file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A hard link where the store's file system allows, else a copy: for readers inside the
    /// pipeline that never write (a 1.5B checkpoint's 6 GB is not copied).
    Linked,
    /// A copy, mode `rw-r--r--` ([`cudarl_data::export::copy_out`]): for files handed to the
    /// user (`export`, `optimize --out`), whose edits must not reach the store's blob.
    Copied,
}

/// Puts the files a table naming store blobs (`file`, `digest`: a checkpoint, a tokenizer, a
/// kernel) names into `dir`, placed as `how` says; returns their names, in table order.
///
/// # Errors
/// A malformed table or a missing blob.
pub fn materialize(
    store: &cudarl_core::Store,
    table: &Path,
    dir: &Path,
    how: Placement,
) -> Result<Vec<String>, StageError> {
    let t = Table::read(table, "checkpoint").map_err(data_err)?;
    let files = t.req_strings("file").map_err(data_err)?;
    let digests = t.req_strings("digest").map_err(data_err)?;
    std::fs::create_dir_all(dir).map_err(|e| StageError::Failed(e.to_string()))?;
    let mut placed = Vec::new();
    for i in 0..t.rows() {
        let (Some(f), Some(d)) = (files.get(i), digests.get(i)) else {
            continue;
        };
        let digest = Digest::from_hex(d).map_err(|e| {
            StageError::bad_input(table.display().to_string(), Some("digest"), e.to_string())
        })?;
        let (src, dst) = (store.blob_path(&digest), dir.join(f));
        let failed = |e: &dyn std::fmt::Display| {
            StageError::Failed(format!("checkpoint file `{f}` ({d}): {e}"))
        };
        match how {
            Placement::Copied => {
                cudarl_data::export::copy_out(&src, dir, f).map_err(|e| failed(&e))?;
            }
            Placement::Linked => {
                if std::fs::hard_link(&src, &dst).is_err() {
                    std::fs::copy(&src, &dst).map_err(|e| failed(&e))?;
                }
            }
        }
        placed.push(f.to_string());
    }
    Ok(placed)
}

/// Chat examples of an SFT table (`messages_json`) for `split`, as JSON lines; returns how
/// many.
///
/// # Errors
/// The table cannot be read or lacks `messages_json` / `split` (named), or `path` cannot be
/// written.
pub fn write_chats(table: &Path, split: &[&str], path: &Path) -> Result<usize, StageError> {
    let t = Table::read(table, "sft").map_err(data_err)?;
    let m = t.req_strings("messages_json").map_err(data_err)?;
    let s = t.req_strings("split").map_err(data_err)?;
    let lines: Vec<&str> = (0..t.rows())
        .filter(|&r| s.get(r).is_some_and(|x| split.contains(&x)))
        .filter_map(|r| m.get(r))
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").map_err(|e| StageError::Failed(e.to_string()))?;
    Ok(lines.len())
}

/// An RL-domain error as a stage error: bad input stays bad input (exit 2, naming its file
/// and field), the rest fails the node.
pub(crate) fn rl_err(e: cudarl_rl::RlError) -> StageError {
    match e {
        cudarl_rl::RlError::BadInput {
            file,
            field,
            message,
        } => StageError::BadInput {
            file,
            field,
            message,
        },
        cudarl_rl::RlError::Failed(m) => StageError::Failed(m),
        cudarl_rl::RlError::Store(e) => StageError::Store(e),
    }
}

/// Runs `job` in the trainer process; its step metrics. With `live` (the stage's context),
/// each step the trainer reports moves a `steps` progress bar and is written to the node's live
/// metrics files ([`StageContext::metrics_log`]) as it happens. A job the trainer refuses (exit
/// 2) becomes a [`StageError::BadInput`] naming `config` and its `section`; an interrupt ends
/// the trainer and becomes [`StageError::Interrupted`].
pub fn run_job(
    job: &cudarl_protocol::Job,
    dir: &Path,
    config: &str,
    section: &str,
    live: Option<&StageContext<'_>>,
) -> Result<Vec<cudarl_protocol::StepMetrics>, StageError> {
    use cudarl_protocol::Event;
    use cudarl_rl::trainer::JobError;
    let bar = live.map(|c| c.progress("steps", None));
    let mut log = live.and_then(|c| c.metrics_log());
    let mut on_event = |e: &Event| {
        if let Event::Step(m) = e {
            tracing::info!(
                node = live.map_or("", |c| c.node()),
                step = m.step,
                epoch = m.epoch,
                loss = m.loss,
                lr = m.lr,
                tokens_per_s = m.tokens_per_s,
                "{section} step"
            );
            if let Some(b) = &bar {
                b.inc(1);
            }
            if let (Some(l), Ok(row)) = (&mut log, serde_json::to_value(m)) {
                // A view of the run: a failed write loses lines there, not the run.
                let _ = l.log(m.step as i64, &row);
            }
        }
    };
    let events = cudarl_rl::trainer::run_job_with(
        job,
        dir,
        &mut on_event,
        &cudarl_core::interrupt::requested,
    );
    if let Some(b) = &bar {
        b.finish();
    }
    match events {
        Ok(events) => Ok(events
            .into_iter()
            .filter_map(|e| match e {
                Event::Step(m) => Some(m),
                Event::Done(_) => None,
            })
            .collect()),
        Err(JobError::BadInput(m)) => Err(StageError::bad_input(config, Some(section), m)),
        Err(JobError::Interrupted) => Err(StageError::Interrupted(format!(
            "{section}: the trainer was stopped; nothing of this node is stored"
        ))),
        Err(JobError::Failed(m)) => Err(StageError::Failed(m)),
    }
}

/// The op categories of the stage's external input `op_categories`, named `name` (its path in the
/// project) in errors.
///
/// # Errors
/// The file cannot be read or does not parse (exit 2, the file named).
pub fn load_categories(
    ctx: &StageContext<'_>,
    name: &str,
) -> Result<cudarl_curriculum::Categories, StageError> {
    let text = std::fs::read_to_string(ctx.input_path("op_categories")?)
        .map_err(|e| StageError::bad_input(name, None, format!("cannot read: {e}")))?;
    cudarl_curriculum::Categories::parse(&text, name)
        .map_err(|e| StageError::bad_input(name, None, e.message))
}

/// Writes `sft_generator` (`gen_rows`) and `sft_optimizer` (`opt_rows`, with their base kernel,
/// speedup, whether it was measured, and kind).
///
/// # Errors
/// A row does not fit its schema, or the store write failed.
pub fn write_sft_tables(
    ctx: &mut StageContext<'_>,
    gen_rows: cudarl_rl::sft::SftRows,
    opt_rows: &cudarl_rl::sft::SftRows,
) -> Result<(), StageError> {
    let gens = gen_rows.into_generator_rows();
    write_output(
        ctx,
        "sft_generator",
        &cudarl_tables::to_batch(&gens).map_err(data_err)?,
    )?;
    write_output(
        ctx,
        "sft_optimizer",
        &cudarl_tables::to_batch(opt_rows.rows()).map_err(data_err)?,
    )
}

/// How `validate` and `archive-native` judge kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Full on a GPU, compile-only without one.
    #[default]
    Auto,
    /// Compile-only everywhere.
    Compile,
}
