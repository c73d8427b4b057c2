//! The model stages: `tokenizer` (byte-level BPE on the corpus of kernels and references),
//! `pretrain` (the default small Qwen2-architecture model, causal LM on that corpus) and
//! `sft-train` (supervised fine-tuning of an agent on `sft-data`). Each writes a job for the
//! trainer process `cudarl-pipe-train` (crate `cudarl-train`; libtorch stays out of
//! `cudarl-pipe`), runs it, and puts what it wrote into the store: model files as blobs named
//! by a `checkpoint` table, per-step metrics as a table.
//!
//! Sizes and optimization settings come from `configs/model/<model>.toml` (`tiny` for CPU
//! tests and CPU-only machines, `small` for one GPU), an input of every model stage.
//!
//! | table | columns |
//! |---|---|
//! | `checkpoint` (and `tokenizer`) | file (utf8: path in the Hugging Face directory), digest (utf8: blake3 of the bytes, a store blob), bytes (int64) |
//! | `plots` | as `checkpoint`: `loss_curve.png` (training and evaluation loss per step) |
//! | `metrics` | step, epoch (int64), loss (float64: nats per trained token), lr, grad_norm (float64), tokens (int64: trained tokens), tokens_per_s (float64: all tokens), eval_loss (float64, nullable), device (utf8) |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{Digest, InputDecl, OutputDecl, ResolveContext, Stage, StageContext, StageError};
use cudarl_data::Table;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::{data_err, params_json, write_output};

/// Schema of `checkpoint` / `tokenizer`.
pub static CHECKPOINT: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("file", DataType::Utf8, false),
        Field::new("digest", DataType::Utf8, false),
        Field::new("bytes", DataType::Int64, false),
    ]))
});

/// Schema of `metrics`.
pub static METRICS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("step", DataType::Int64, false),
        Field::new("epoch", DataType::Int64, false),
        Field::new("loss", DataType::Float64, false),
        Field::new("lr", DataType::Float64, false),
        Field::new("grad_norm", DataType::Float64, false),
        Field::new("tokens", DataType::Int64, false),
        Field::new("tokens_per_s", DataType::Float64, false),
        Field::new("eval_loss", DataType::Float64, true),
        Field::new("device", DataType::Utf8, false),
    ]))
});

/// `configs/model/<name>.toml`: `[model]` (architecture, `cudarl_train::job::ModelSpec`),
/// `[tokenizer] vocab_size`, `[pretrain]` and `[sft]` (`cudarl_train::train::TrainConfig`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    /// Architecture.
    pub model: Value,
    /// Tokenizer settings.
    pub tokenizer: TokenizerSettings,
    /// Pretraining settings.
    pub pretrain: Value,
    /// SFT settings.
    pub sft: Value,
}

/// `[tokenizer]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerSettings {
    /// Vocabulary size including special tokens.
    pub vocab_size: usize,
}

fn d_model() -> String {
    "tiny".into()
}
fn d_device() -> String {
    "auto".into()
}
fn d_agent() -> String {
    "generator".into()
}

/// Parameters of the model stages.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// `configs/model/<model>.toml`; `auto`: `small` when the stage's device resolves to a GPU
    /// (`device`: `auto` with a GPU, or `cuda`), else `tiny` (the file read is an input of the
    /// key, so the two never share outputs).
    #[serde(default = "d_model")]
    pub model: String,
    /// `auto` (the GPU when there is one), `cpu` or `cuda` (pretrain, sft-train).
    #[serde(default = "d_device")]
    pub device: String,
    /// `generator` or `optimizer` (sft-train): which agent, for the row's label.
    #[serde(default = "d_agent")]
    pub agent: String,
    /// `pretrain` only: this many synthetic conversations added to the corpus, each a
    /// generator prompt for an elementwise expression answered by a kernel that carries it
    /// ([`crate::families::copy_documents`]; never a task's expression, hold-out included).
    /// 0 (when the key is absent; `pipelines/default.toml` sets 3000) adds none and leaves the
    /// stage's key as it was before the parameter existed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub copy_documents: usize,
    /// `pretrain` only: the seed of those documents' expressions.
    #[serde(default = "d_copy_seed", skip_serializing_if = "is_copy_seed")]
    pub copy_seed: u64,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
fn d_copy_seed() -> u64 {
    1
}
fn is_copy_seed(s: &u64) -> bool {
    *s == d_copy_seed()
}

/// Which model stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// BPE tokenizer.
    Tokenizer,
    /// Pretraining.
    Pretrain,
    /// Supervised fine-tuning.
    SftTrain,
}

/// A model stage.
#[derive(Debug)]
pub struct ModelStage {
    kind: Kind,
    params: Params,
}

impl ModelStage {
    /// From the pipeline's table.
    ///
    /// # Errors
    /// Unknown keys, a bad device or agent name.
    pub fn from_table(kind: Kind, t: toml::Table) -> Result<Self, String> {
        let params: Params = crate::common::parse_params(t)?;
        if !["auto", "cpu", "cuda"].contains(&params.device.as_str()) {
            return Err(format!("device `{}`: use auto, cpu or cuda", params.device));
        }
        if kind != Kind::Pretrain
            && (params.copy_documents > 0 || params.copy_seed != d_copy_seed())
        {
            return Err("copy_documents and copy_seed are `pretrain` parameters".into());
        }
        if !["generator", "optimizer"].contains(&params.agent.as_str()) {
            return Err(format!(
                "agent `{}`: use generator or optimizer",
                params.agent
            ));
        }
        if params.model.is_empty()
            || !params
                .model
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "model `{}`: a name of configs/model/<name>.toml (letters, digits, - and _)",
                params.model
            ));
        }
        Ok(ModelStage { kind, params })
    }

    fn config_rel(&self) -> String {
        format!("configs/model/{}.toml", self.model_name())
    }

    /// The model config's name, `auto` resolved (see [`Params::model`]).
    fn model_name(&self) -> &str {
        match self.params.model.as_str() {
            "auto" if self.resolved_device() == "cuda" => "small",
            "auto" => "tiny",
            m => m,
        }
    }

    /// The device the trainer will use: `cpu` or `cuda`.
    fn resolved_device(&self) -> &'static str {
        resolve_device(&self.params.device)
    }
}

/// `auto` / `cpu` / `cuda` as the trainer will resolve it: `auto` is `cuda` when the driver
/// reports a GPU.
pub(crate) fn resolve_device(name: &str) -> &'static str {
    match name {
        "cpu" => "cpu",
        "cuda" => "cuda",
        _ if cudarl_cuda::gpu::probe().is_some() => "cuda",
        _ => "cpu",
    }
}

/// The trainer binary: `$CUDARL_TRAINER`, else `cudarl-pipe-train` beside `cudarl-pipe`.
pub fn trainer_exe() -> PathBuf {
    cudarl_cuda::worker::sibling_exe("CUDARL_TRAINER", "cudarl-pipe-train")
}

/// Runs the trainer on `job`; its JSON event lines. Exit code 2 (bad input) becomes a
/// [`StageError::BadInput`] naming `config`.
pub(crate) fn run_trainer(
    job: &Value,
    dir: &Path,
    config: &str,
    section: &str,
) -> Result<Vec<Value>, StageError> {
    let jp = dir.join("job.json");
    std::fs::write(&jp, job.to_string()).map_err(|e| StageError::Failed(e.to_string()))?;
    let exe = trainer_exe();
    let out = Command::new(&exe)
        .arg(&jp)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            StageError::Failed(format!(
                "cannot run the trainer `{}` (set CUDARL_TRAINER, or build it: make build): {e}",
                exe.display()
            ))
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = stderr
        .lines()
        .rev()
        .take(5)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    match out.status.code() {
        Some(0) => {}
        Some(2) => {
            // The job file is ours; what is wrong in it came from the config's section.
            let msg = tail.replace(&format!("error: {}: ", jp.display()), "");
            return Err(StageError::bad_input(config, Some(section), msg));
        }
        _ => {
            return Err(StageError::Failed(format!(
                "trainer failed ({}): {tail}",
                out.status
            )));
        }
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Puts every file under `dir` into the store; the `checkpoint` table rows, sorted by path.
pub(crate) fn ingest_dir(
    ctx: &mut StageContext<'_>,
    dir: &Path,
    name: &str,
) -> Result<(), StageError> {
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

/// Copies the files a `checkpoint` table names from the store into `dir`.
///
/// # Errors
/// A malformed table or a missing blob.
pub fn materialize(store: &cudarl_core::Store, table: &Path, dir: &Path) -> Result<(), StageError> {
    let t = Table::read(table, "checkpoint").map_err(data_err)?;
    let files = t.req_strings("file").map_err(data_err)?;
    let digests = t.req_strings("digest").map_err(data_err)?;
    std::fs::create_dir_all(dir).map_err(|e| StageError::Failed(e.to_string()))?;
    for i in 0..t.rows() {
        let (Some(f), Some(d)) = (files.get(i), digests.get(i)) else {
            continue;
        };
        let digest = Digest::from_hex(d)
            .map_err(|e| StageError::bad_input(table.display().to_string(), Some("digest"), e))?;
        std::fs::copy(store.blob_path(&digest), dir.join(f))
            .map_err(|e| StageError::Failed(format!("checkpoint file `{f}` ({d}): {e}")))?;
    }
    Ok(())
}

fn write_metrics(ctx: &StageContext<'_>, events: &[Value], device: &str) -> Result<(), StageError> {
    let steps: Vec<&Value> = events.iter().filter(|e| e["event"] == "step").collect();
    let i = |k: &str| -> ArrayRef {
        Arc::new(Int64Array::from(
            steps
                .iter()
                .map(|s| s[k].as_i64().unwrap_or(0))
                .collect::<Vec<_>>(),
        ))
    };
    let f = |k: &str| -> ArrayRef {
        Arc::new(Float64Array::from(
            steps
                .iter()
                .map(|s| s[k].as_f64().unwrap_or(f64::NAN))
                .collect::<Vec<_>>(),
        ))
    };
    let batch = cudarl_data::parquet_io::batch(
        &METRICS.clone(),
        vec![
            i("step"),
            i("epoch"),
            f("loss"),
            f("lr"),
            f("grad_norm"),
            i("tokens"),
            f("tokens_per_s"),
            Arc::new(Float64Array::from(
                steps
                    .iter()
                    .map(|s| s["eval_loss"].as_f64())
                    .collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(vec![device; steps.len()])),
        ],
    )
    .map_err(data_err)?;
    write_output(ctx, "metrics", &batch)
}

/// `plots`: `loss_curve.png` of the step events (training loss per step, evaluation loss at
/// the evaluation steps), titled with what was trained and on which device.
fn write_loss_plot(
    ctx: &mut StageContext<'_>,
    events: &[Value],
    device: &str,
    what: &str,
    dir: &Path,
) -> Result<(), StageError> {
    use crate::plot::{Series, line_chart};
    let steps: Vec<&Value> = events.iter().filter(|e| e["event"] == "step").collect();
    let pts = |k: &str| -> Vec<(f64, f64)> {
        steps
            .iter()
            .filter_map(|s| Some((s["step"].as_f64()?, s[k].as_f64()?)))
            .collect()
    };
    std::fs::create_dir_all(dir).map_err(|e| StageError::Failed(e.to_string()))?;
    let mut series = vec![Series::new("train loss", pts("loss"))];
    let ev = pts("eval_loss");
    if !ev.is_empty() {
        series.push(Series::new("eval loss", ev));
    }
    line_chart(
        &dir.join("loss_curve.png"),
        &format!("{what} ({device})"),
        "step",
        "cross-entropy (nats / token)",
        &series,
    )
    .map_err(StageError::Failed)?;
    ingest_dir(ctx, dir, "plots")
}

/// The corpus: every task kernel and every KernelBench reference (strings), then `extra`
/// conversations (lists of messages), as JSON lines (the trainer's `Document`).
fn write_corpus(
    ctx: &StageContext<'_>,
    path: &Path,
    extra: &[Vec<cudarl_curriculum::prompts::ChatMessage>],
) -> Result<usize, StageError> {
    let mut lines = Vec::new();
    for (input, name) in [("kernels", "task_kernels"), ("problems", "problems")] {
        let t = Table::read(ctx.input_path(input)?, name).map_err(data_err)?;
        let code = t.req_strings("code").map_err(data_err)?;
        for r in 0..t.rows() {
            if let Some(c) = code.get(r) {
                lines.push(serde_json::to_string(c).expect("json"));
            }
        }
    }
    lines.extend(
        extra
            .iter()
            .map(|d| serde_json::to_string(d).expect("json")),
    );
    std::fs::write(path, lines.join("\n") + "\n").map_err(|e| StageError::Failed(e.to_string()))?;
    Ok(lines.len())
}

/// Chat examples of an SFT table (`messages_json`) for `split`, as JSON lines; returns how
/// many.
///
/// # Errors
/// The table cannot be read or lacks `messages_json` / `split` (named), or `path` cannot be
/// written.
pub(crate) fn write_chats(table: &Path, split: &[&str], path: &Path) -> Result<usize, StageError> {
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

impl Stage for ModelStage {
    fn kind(&self) -> &str {
        match self.kind {
            Kind::Tokenizer => "tokenizer",
            Kind::Pretrain => "pretrain",
            Kind::SftTrain => "sft-train",
        }
    }
    fn code_version(&self) -> u32 {
        // 3: `copy_documents` are conversations in the prompt format.
        3
    }
    fn params(&self) -> Value {
        params_json(&self.params)
    }
    fn inputs(&self) -> Vec<InputDecl> {
        let mut v = vec![InputDecl::external("config")];
        match self.kind {
            Kind::Tokenizer => {
                v.push(InputDecl::node("kernels", "synth-tasks", "task_kernels"));
                v.push(InputDecl::node(
                    "problems",
                    "ingest-kernelbench",
                    "problems",
                ));
            }
            Kind::Pretrain => {
                v.push(InputDecl::node("tokenizer", "tokenizer", "tokenizer"));
                v.push(InputDecl::node("kernels", "synth-tasks", "task_kernels"));
                if self.params.copy_documents > 0 {
                    v.push(InputDecl::node("tasks", "synth-tasks", "tasks"));
                }
                v.push(InputDecl::node(
                    "problems",
                    "ingest-kernelbench",
                    "problems",
                ));
            }
            Kind::SftTrain => {
                v.push(InputDecl::node("base", "pretrain", "checkpoint"));
                v.push(InputDecl::node("data", "sft-data", "sft_generator"));
            }
        }
        v
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        match self.kind {
            Kind::Tokenizer => vec![OutputDecl::table("tokenizer", CHECKPOINT.clone())],
            _ => vec![
                OutputDecl::table("checkpoint", CHECKPOINT.clone()),
                OutputDecl::table("metrics", METRICS.clone()),
                OutputDecl::table("plots", CHECKPOINT.clone()),
            ],
        }
    }
    fn resolve_external(
        &self,
        _input: &str,
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        crate::common::single_file(&ctx.root, &self.config_rel(), "model config")
    }
    fn environment(&self, _ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        Ok(match self.kind {
            Kind::Tokenizer => BTreeMap::new(),
            _ => BTreeMap::from([("device".to_string(), self.resolved_device().to_string())]),
        })
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let rel = self.config_rel();
        let text = std::fs::read_to_string(ctx.input_files("config")?.files[0].1.clone())
            .map_err(|e| StageError::bad_input(&rel, None, e.to_string()))?;
        let mf: ModelFile =
            toml::from_str(&text).map_err(|e| StageError::bad_input(&rel, None, e.to_string()))?;
        let tmp = ctx.store().temp_dir()?;
        let dir = tmp.path();
        let out = dir.join("out");
        let device = self.resolved_device();
        match self.kind {
            Kind::Tokenizer => {
                let corpus = dir.join("corpus.jsonl");
                write_corpus(ctx, &corpus, &[])?;
                let job = json!({"kind": "tokenizer", "corpus": corpus,
                    "vocab_size": mf.tokenizer.vocab_size, "out": out});
                run_trainer(&job, dir, &rel, "tokenizer")?;
                ingest_dir(ctx, &out, "tokenizer")?;
            }
            Kind::Pretrain => {
                let corpus = dir.join("corpus.jsonl");
                let extra = match self.params.copy_documents {
                    0 => Vec::new(),
                    n => {
                        // Every task's expressions, the hold-out families' included.
                        let exclude = crate::synth_tasks::read_specs(ctx.input_path("tasks")?)?
                            .into_iter()
                            .flat_map(|s| s.reference.into_values())
                            .collect();
                        crate::families::copy_documents(n, self.params.copy_seed, &exclude)
                    }
                };
                write_corpus(ctx, &corpus, &extra)?;
                let tk = dir.join("tok");
                materialize(ctx.store(), ctx.input_path("tokenizer")?, &tk)?;
                let job = json!({"kind": "pretrain", "tokenizer": tk.join("tokenizer.json"),
                    "model": mf.model, "corpus": corpus, "train": mf.pretrain,
                    "device": device, "out": out});
                let ev = run_trainer(&job, dir, &rel, "pretrain")?;
                ingest_dir(ctx, &out.join("model"), "checkpoint")?;
                write_metrics(ctx, &ev, device)?;
                write_loss_plot(ctx, &ev, device, "pretraining", &dir.join("plots"))?;
            }
            Kind::SftTrain => {
                let base = dir.join("base");
                materialize(ctx.store(), ctx.input_path("base")?, &base)?;
                let data = ctx.input_path("data")?.to_path_buf();
                let (tr, ev) = (dir.join("train.jsonl"), dir.join("eval.jsonl"));
                let n = write_chats(&data, &["train"], &tr)?;
                write_chats(&data, &["val"], &ev)?;
                if n == 0 {
                    return Err(StageError::bad_input(
                        data.display().to_string(),
                        Some("split"),
                        "no `train` rows",
                    ));
                }
                let job = json!({"kind": "sft", "base": base, "data": tr, "eval_data": ev,
                    "train": mf.sft, "device": device, "out": out});
                let events = run_trainer(&job, dir, &rel, "sft")?;
                ingest_dir(ctx, &out.join("model"), "checkpoint")?;
                write_metrics(ctx, &events, device)?;
                let what = format!("SFT of the {}", self.params.agent);
                write_loss_plot(ctx, &events, device, &what, &dir.join("plots"))?;
            }
        }
        Ok(())
    }
}
