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
//! | `adapter` (`sft-train` with `lora`) | as `checkpoint`: `adapter_model.safetensors`, `adapter_config.json` (PEFT's layout) |
//! | `plots` | as `checkpoint`: `loss_curve.png` (training and evaluation loss per step) |
//! | `metrics` | one row per optimizer step: [`cudarl_tables::train::TrainMetricsRow`] |
//! | `corpus` (`tokenizer`, `pretrain`) | one row per document: [`cudarl_tables::train::CorpusRow`] |
//!
//! The corpus holds the `train` split alone (the `splits` table, [`crate::splits`]): the task
//! kernels of the `train` families and the reference code of the KernelBench `train` problems.
//! The hold-out (`test` families and problems) and the KernelBench `val` problems never reach
//! it, nor do the `rl` families, which RL is to practise as operations the agents have not
//! memorized.

use std::collections::BTreeMap;
use std::path::Path;

use cudarl_core::{
    InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext, StageError,
};
use cudarl_data::Table;
use cudarl_protocol::{Device, Job, LoraConfig, RandomInit, StepMetrics, TrainConfig};
use cudarl_tables::TableRow;
use cudarl_tables::train::{CorpusRow, TrainMetricsRow};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::common::{
    CHECKPOINT, Placement, checkpoint_files, data_err, ingest_dir, is_checkpoint_dir, materialize,
    params_json, resolve_device, rl_err, run_job, write_chats, write_rows,
};

/// `configs/model/<name>.toml`: `[model]` (architecture, `cudarl_protocol::ModelSpec`),
/// `[tokenizer] vocab_size`, `[pretrain]` and `[sft]` (`cudarl_protocol::TrainConfig`).
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

/// Where `sft-train` starts when `model` names a `configs/model` file (see [`Params::init`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Init {
    /// `pretrain`'s checkpoint.
    Pretrain,
    /// A fresh seeded initialization of the file's architecture.
    Random,
}

fn d_model() -> String {
    "tiny".into()
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
    /// key, so the two never share outputs). `sft-train` also takes a Hugging Face checkpoint
    /// directory, named by a path with a `/` (relative to the project root, or absolute; e.g.
    /// `./models/Qwen2.5-Coder-1.5B-Instruct`): its `config.json`, weights
    /// (`model.safetensors`, or `model.safetensors.index.json` and the shards it lists),
    /// `tokenizer.json` and `tokenizer_config.json` (whose chat template must be ChatML) are
    /// the stage's `base` input in place of `pretrain`'s checkpoint, so neither `tokenizer` nor
    /// `pretrain` runs; `settings` then names the training settings.
    #[serde(default = "d_model")]
    pub model: String,
    /// `sft-train` with a checkpoint directory as `model`: the `configs/model/<settings>.toml`
    /// whose `[sft]` section trains it (e.g. `qwen2.5-coder-1.5b`). Required then, refused
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<String>,
    /// `sft-train` with a `configs/model` name: `random` starts from a fresh seeded
    /// initialization of that file's `[model]` architecture with its `[tokenizer] vocab_size`
    /// rows of embedding (at least the tokenizer's), in place of `pretrain`'s checkpoint, so
    /// `pretrain` does not run; the `tokenizer` stage's tokenizer is used. For measuring what a
    /// published size costs (`configs/model/qwen2.5-coder-*.toml`): random weights cost what
    /// trained ones cost. `pretrain` (or absent, left out of the key): `pretrain`'s checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<Init>,
    /// `sft-train`: train LoRA adapters of the frozen base (held in the compute dtype, bf16
    /// on a GPU) instead of every weight, e.g. `{ r = 16, alpha = 32 }`
    /// (`cudarl_protocol::LoraConfig`: `r`, `alpha`, `target_modules`, all seven projections
    /// when absent). The `checkpoint` output is the base with the adapters merged (what later
    /// stages load); the `adapter` output holds them in PEFT's layout
    /// (`adapter_model.safetensors`, `adapter_config.json`) for `peft.PeftModel.from_pretrained`
    /// on the base. Absent: full fine-tuning, and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
    /// `auto` (the GPU when there is one), `cpu` or `cuda` (pretrain, sft-train).
    #[serde(default)]
    pub device: Device,
    /// `generator` or `optimizer` (sft-train): which agent, for the row's label.
    #[serde(default = "d_agent")]
    pub agent: String,
    /// `pretrain` only: this many synthetic conversations added to the corpus, each a
    /// generator prompt for an elementwise expression answered by a kernel that carries it
    /// ([`cudarl_rl::families::copy_documents`]; never a task's expression, hold-out included).
    /// 0 (when the key is absent; `pipelines/default.toml` sets 3000) adds none and leaves the
    /// stage's key as it was before the parameter existed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub copy_documents: usize,
    /// `pretrain` only: the seed of those documents' expressions.
    #[serde(default = "d_copy_seed", skip_serializing_if = "is_copy_seed")]
    pub copy_seed: u64,
    /// `pretrain` and `sft-train`: the training seed (example order and libtorch's draws: the
    /// initialization, dropout), in place of the model file's `seed`; one SFT draw of a
    /// comparison over draws (`--set pretrain.seed=1 --set sft-train.seed=1 --set
    /// sft-train-optimizer.seed=1`). Absent: the model file's, and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// `pretrain` and `sft-train`: the peak learning rate in place of the model file's (e.g. a
    /// gentler fine-tune from a trained checkpoint: `collab-sft`). Absent: the file's, and left
    /// out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// `pretrain` and `sft-train`: passes over the data in place of the model file's `epochs`.
    /// Absent: the file's, and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<usize>,
    /// `pretrain` and `sft-train`: at most this many optimizer steps, in place of the model
    /// file's `max_steps` (e.g. the CPU profile's shorter optimizer SFT). Absent: the file's,
    /// and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
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

impl Kind {
    /// Every model stage.
    pub const ALL: [Kind; 3] = [Kind::Tokenizer, Kind::Pretrain, Kind::SftTrain];

    /// The stage kind, as pipeline files name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Tokenizer => "tokenizer",
            Kind::Pretrain => "pretrain",
            Kind::SftTrain => "sft-train",
        }
    }
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
    pub fn from_table(kind: Kind, t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        if kind != Kind::Pretrain
            && (params.copy_documents > 0 || params.copy_seed != d_copy_seed())
        {
            return Err("copy_documents and copy_seed are `pretrain` parameters".into());
        }
        if kind == Kind::Tokenizer
            && (params.seed.is_some()
                || params.lr.is_some()
                || params.epochs.is_some()
                || params.max_steps.is_some())
        {
            return Err(
                "seed, lr, epochs and max_steps are `pretrain` and `sft-train` parameters".into(),
            );
        }
        if params.lr.is_some_and(|l| !(l > 0.0 && l.is_finite())) {
            return Err("lr must be a positive number".into());
        }
        if params.epochs == Some(0) {
            return Err("epochs must be at least 1".into());
        }
        if params.max_steps == Some(0) {
            return Err("max_steps must be at least 1".into());
        }
        if !["generator", "optimizer"].contains(&params.agent.as_str()) {
            return Err(format!("agent `{}`: use generator or optimizer", params.agent).into());
        }
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
                && !n.starts_with('.')
        };
        if params.init.is_some() && kind != Kind::SftTrain {
            return Err("init is a `sft-train` parameter".into());
        }
        match &params.lora {
            Some(_) if kind != Kind::SftTrain => {
                return Err("lora is a `sft-train` parameter".into());
            }
            Some(l) => l.check()?,
            None => {}
        }
        if params.init == Some(Init::Random) && is_checkpoint_dir(&params.model) {
            return Err(format!(
                "init = \"random\" initializes a configs/model architecture; model `{}` is a \
                 checkpoint directory, which brings its own weights",
                params.model
            )
            .into());
        }
        match (is_checkpoint_dir(&params.model), &params.settings) {
            (true, _) if kind != Kind::SftTrain => {
                return Err(format!(
                    "model `{}`: a checkpoint directory is a `sft-train` model; `{}` builds the \
                     project's own model from configs/model/<name>.toml",
                    params.model,
                    kind.as_str()
                )
                .into());
            }
            (true, None) => {
                return Err(format!(
                    "model `{}` is a checkpoint directory: name its training settings with \
                     `settings = \"<name>\"` (the `[sft]` section of configs/model/<name>.toml, \
                     e.g. qwen2.5-coder-1.5b)",
                    params.model
                )
                .into());
            }
            (true, Some(st)) if !name_ok(st) => {
                return Err(format!(
                    "settings `{st}`: a name of configs/model/<name>.toml (letters, digits, ., - and _)"
                ).into());
            }
            (false, Some(_)) => {
                return Err(
                    "settings goes with a checkpoint directory as `model`; a configs/model name \
                     carries its own"
                        .into(),
                );
            }
            (false, None) if !name_ok(&params.model) => {
                return Err(format!(
                    "model `{}`: a name of configs/model/<name>.toml (letters, digits, ., - and _), \
                     or a checkpoint directory (a path with a `/`)",
                    params.model
                ).into());
            }
            _ => {}
        }
        Ok(ModelStage { kind, params })
    }

    fn config_rel(&self) -> String {
        format!("configs/model/{}.toml", self.model_name())
    }

    /// The model config's name, `auto` resolved (see [`Params::model`]); `settings` for a
    /// checkpoint directory.
    fn model_name(&self) -> &str {
        if let Some(s) = &self.params.settings {
            return s;
        }
        match self.params.model.as_str() {
            "auto" if self.resolved_device() == "cuda" => "small",
            "auto" => "tiny",
            m => m,
        }
    }

    /// The device the trainer will use: `cpu` or `cuda`.
    fn resolved_device(&self) -> &'static str {
        resolve_device(self.params.device)
    }

    /// The same as the trainer job's device.
    fn job_device(&self) -> Device {
        match self.resolved_device() {
            "cuda" => Device::Cuda,
            _ => Device::Cpu,
        }
    }
}

fn write_metrics(
    ctx: &StageContext<'_>,
    steps: &[StepMetrics],
    device: &str,
) -> Result<(), StageError> {
    let rows: Vec<TrainMetricsRow> = steps
        .iter()
        .map(|s| TrainMetricsRow {
            step: s.step as i64,
            epoch: s.epoch as i64,
            loss: s.loss,
            lr: s.lr,
            grad_norm: s.grad_norm,
            tokens: s.tokens as i64,
            tokens_per_s: s.tokens_per_s,
            eval_loss: s.eval_loss,
            device: device.into(),
        })
        .collect();
    write_rows(
        ctx,
        TrainMetricsRow::NAME,
        &TrainMetricsRow::schema(),
        &rows,
    )
}

fn write_loss_plot(
    ctx: &mut StageContext<'_>,
    steps: &[StepMetrics],
    device: &str,
    what: &str,
    dir: &Path,
) -> Result<(), StageError> {
    use cudarl_data::plot::{Series, line_chart};
    let pts = |f: &dyn Fn(&StepMetrics) -> Option<f64>| -> Vec<(f64, f64)> {
        steps
            .iter()
            .filter_map(|s| Some((s.step as f64, f(s)?)))
            .collect()
    };
    std::fs::create_dir_all(dir).map_err(|e| StageError::Failed(e.to_string()))?;
    let mut series = vec![Series::new("train loss", pts(&|s| Some(s.loss)))];
    let ev = pts(&|s| s.eval_loss);
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
    .map_err(StageError::failed)?;
    ingest_dir(ctx, dir, "plots")
}

/// The corpus: the task kernels of the `train` families and the reference code of the
/// KernelBench `train` problems (strings; the `splits` input says which), then `extra`
/// conversations (lists of messages), as JSON lines (the trainer's `Document`) in `path`, and
/// the same documents as the `corpus` output. Returns the number of documents.
///
/// # Errors
/// The (`id_col`, `code`) pairs of input `input`'s table `table`, rows with both set.
///
/// # Errors
/// The table cannot be read or lacks a column (file and field named).
fn id_code(
    ctx: &StageContext<'_>,
    input: &str,
    table: &str,
    id_col: &str,
) -> Result<Vec<(String, String)>, StageError> {
    let t = Table::read(ctx.input_path(input)?, table).map_err(data_err)?;
    let (id, code) = (
        t.req_strings(id_col).map_err(data_err)?,
        t.req_strings("code").map_err(data_err)?,
    );
    Ok((0..t.rows())
        .filter_map(|r| Some((id.get(r)?.to_string(), code.get(r)?.to_string())))
        .collect())
}

/// A table cannot be read or lacks a column, a task kernel's family has no row in `splits`
/// (file and field named), or the file cannot be written.
fn write_corpus(
    ctx: &StageContext<'_>,
    path: &Path,
    extra: &[Vec<cudarl_curriculum::prompts::ChatMessage>],
) -> Result<usize, StageError> {
    let splits = cudarl_tables::splits::SplitMap::read(ctx.input_path("splits")?, "splits")
        .map_err(crate::common::data_err)?;
    let mut rows = Vec::new();
    for (t, c) in id_code(ctx, "kernels", "task_kernels", "task_id")? {
        if splits.family(&t).map_err(crate::common::data_err)? == "train" {
            rows.push(CorpusRow {
                kind: "task_kernel".into(),
                item_id: Some(format!("synth/{t}")),
                line: serde_json::to_string(&c).expect("json"),
            });
        }
    }
    for (p, c) in id_code(ctx, "problems", "problems", "problem_id")? {
        // `test` and `val` problems, and those of levels `splits` leaves out, stay out.
        if splits.kernelbench.get(&p) == Some(&cudarl_curriculum::Split::Train) {
            rows.push(CorpusRow {
                kind: "kernelbench".into(),
                item_id: Some(p),
                line: serde_json::to_string(&c).expect("json"),
            });
        }
    }
    rows.extend(extra.iter().map(|d| CorpusRow {
        kind: "copy_document".into(),
        item_id: None,
        line: serde_json::to_string(d).expect("json"),
    }));
    let text: String = rows.iter().map(|r| format!("{}\n", r.line)).collect();
    std::fs::write(path, text).map_err(|e| StageError::Failed(e.to_string()))?;
    write_rows(ctx, CorpusRow::NAME, &CorpusRow::schema(), &rows)?;
    Ok(rows.len())
}

impl Stage for ModelStage {
    fn kind(&self) -> &str {
        self.kind.as_str()
    }
    fn code_version(&self) -> u32 {
        // 3: `copy_documents` are conversations in the prompt format.
        // 4: checkpoints carry `tokenizer_config.json` (the chat template) and
        // `generation_config.json`.
        // 5 (`tokenizer`, `pretrain`): the corpus is the `train` split's alone (the hold-out,
        // the KernelBench `val` problems and the `rl` families left out), and an output.
        // 6 (`pretrain`): copy documents are operator families stated as modules, none of a
        // task's group.
        match self.kind {
            Kind::Tokenizer => 5,
            Kind::Pretrain => 6,
            Kind::SftTrain => 4,
        }
    }
    fn params(&self) -> Value {
        // A checkpoint directory is keyed by its files (`base`), not where it lies.
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
                v.push(InputDecl::node("splits", "splits", "splits"));
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
                v.push(InputDecl::node("splits", "splits", "splits"));
            }
            Kind::SftTrain if is_checkpoint_dir(&self.params.model) => {
                v.push(InputDecl::external("base"));
                v.push(InputDecl::node("data", "sft-data", "sft_generator"));
            }
            Kind::SftTrain if self.params.init == Some(Init::Random) => {
                v.push(InputDecl::node("tokenizer", "tokenizer", "tokenizer"));
                v.push(InputDecl::node("data", "sft-data", "sft_generator"));
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
            Kind::Tokenizer => vec![
                OutputDecl::table("tokenizer", CHECKPOINT.clone()),
                OutputDecl::table(CorpusRow::NAME, CorpusRow::schema()),
            ],
            _ => {
                let mut v = vec![
                    OutputDecl::table("checkpoint", CHECKPOINT.clone()),
                    OutputDecl::table(TrainMetricsRow::NAME, TrainMetricsRow::schema()),
                    OutputDecl::table("plots", CHECKPOINT.clone()),
                ];
                if self.kind == Kind::Pretrain {
                    v.push(OutputDecl::table(CorpusRow::NAME, CorpusRow::schema()));
                }
                if self.params.lora.is_some() {
                    v.push(OutputDecl::table("adapter", CHECKPOINT.clone()));
                }
                v
            }
        }
    }
    fn resolve_external(
        &self,
        input: &str,
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        match input {
            "base" => checkpoint_files(&ctx.root, &self.params.model),
            _ => crate::common::single_file(&ctx.root, &self.config_rel(), "model config"),
        }
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
        let section = |name: &str, v: &Value| -> Result<TrainConfig, StageError> {
            let mut c: TrainConfig = serde_json::from_value(v.clone())
                .map_err(|e| StageError::bad_input(&rel, Some(name), e.to_string()))?;
            if let Some(s) = self.params.seed {
                c.seed = s;
            }
            if let Some(l) = self.params.lr {
                c.lr = l;
            }
            if let Some(e) = self.params.epochs {
                c.epochs = e;
            }
            if let Some(m) = self.params.max_steps {
                c.max_steps = Some(m);
            }
            Ok(c)
        };
        let tmp = ctx.store().temp_dir()?;
        let dir = tmp.path();
        let out = dir.join("out");
        let device = self.resolved_device();
        match self.kind {
            Kind::Tokenizer => {
                let corpus = dir.join("corpus.jsonl");
                write_corpus(ctx, &corpus, &[])?;
                let job = Job::Tokenizer {
                    corpus,
                    vocab_size: mf.tokenizer.vocab_size,
                    out: out.clone(),
                };
                run_job(&job, dir, &rel, "tokenizer", None)?;
                ingest_dir(ctx, &out, "tokenizer")?;
            }
            Kind::Pretrain => {
                let corpus = dir.join("corpus.jsonl");
                let extra = copy_corpus(ctx, self.params.copy_documents, self.params.copy_seed)?;
                write_corpus(ctx, &corpus, &extra)?;
                let tk = tokenizer_dir(ctx, dir)?;
                let job = Job::Pretrain {
                    tokenizer: tk.join("tokenizer.json"),
                    model: serde_json::from_value(mf.model.clone())
                        .map_err(|e| StageError::bad_input(&rel, Some("model"), e.to_string()))?,
                    corpus,
                    train: section("pretrain", &mf.pretrain)?,
                    device: self.job_device(),
                    out: out.clone(),
                };
                let ev = run_job(&job, dir, &rel, "pretrain", Some(ctx))?;
                ingest_dir(ctx, &out.join("model"), "checkpoint")?;
                write_metrics(ctx, &ev, device)?;
                write_loss_plot(ctx, &ev, device, "pretraining", &dir.join("plots"))?;
            }
            Kind::SftTrain => {
                let random = self.params.init == Some(Init::Random);
                let base = if random {
                    tokenizer_dir(ctx, dir)?
                } else {
                    crate::common::checkpoint_dir(ctx, "base", &dir.join("base"))?
                };
                let init = if random {
                    Some(RandomInit {
                        model: serde_json::from_value(mf.model.clone()).map_err(|e| {
                            StageError::bad_input(&rel, Some("model"), e.to_string())
                        })?,
                        vocab_size: mf.tokenizer.vocab_size,
                    })
                } else {
                    None
                };
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
                let job = Job::Sft {
                    base,
                    init,
                    lora: self.params.lora.clone(),
                    data: tr,
                    eval_data: ev,
                    train: section("sft", &mf.sft)?,
                    device: self.job_device(),
                    out: out.clone(),
                };
                let events = run_job(&job, dir, &rel, "sft", Some(ctx))?;
                ingest_dir(ctx, &out.join("model"), "checkpoint")?;
                if self.params.lora.is_some() {
                    ingest_dir(ctx, &out.join("adapter"), "adapter")?;
                }
                write_metrics(ctx, &events, device)?;
                let what = format!("SFT of the {}", self.params.agent);
                write_loss_plot(ctx, &events, device, &what, &dir.join("plots"))?;
            }
        }
        Ok(())
    }
}

/// The `tokenizer` input's files linked into `dir/tok` (for the trainer, which only reads
/// them); returns that folder.
///
/// # Errors
/// A malformed table or a missing blob.
fn tokenizer_dir(ctx: &StageContext<'_>, dir: &Path) -> Result<std::path::PathBuf, StageError> {
    let tk = dir.join("tok");
    materialize(
        ctx.store(),
        ctx.input_path("tokenizer")?,
        &tk,
        Placement::Linked,
    )?;
    Ok(tk)
}

/// `n` synthetic copy documents for pretraining, drawn by `seed` from operator families outside
/// every task's expressions and groups, the hold-out's included (the input `tasks`).
///
/// # Errors
/// The `tasks` table cannot be read.
fn copy_corpus(
    ctx: &StageContext<'_>,
    n: usize,
    seed: u64,
) -> Result<Vec<Vec<cudarl_curriculum::prompts::ChatMessage>>, StageError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let specs = cudarl_rl::tasks::read_specs(ctx.input_path("tasks")?).map_err(rl_err)?;
    let exclude = cudarl_rl::families::CopyExclusions {
        groups: specs.iter().filter_map(|s| s.group.clone()).collect(),
        references: specs
            .into_iter()
            .flat_map(|s| s.reference.into_values())
            .collect(),
    };
    Ok(cudarl_rl::families::copy_documents(n, seed, &exclude))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every model file of the project reads as the stages read it: `[model]` as the trainer's
    /// architecture, `[pretrain]` and `[sft]` as training settings, a vocabulary.
    #[test]
    fn every_model_file_parses_as_the_stages_read_it() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/model");
        let mut names = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("toml") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let mf: ModelFile =
                toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let spec: cudarl_protocol::ModelSpec = serde_json::from_value(mf.model.clone())
                .unwrap_or_else(|e| panic!("{}: [model]: {e}", p.display()));
            assert!(
                spec.hidden_size % spec.num_attention_heads == 0,
                "{}",
                p.display()
            );
            assert!(mf.tokenizer.vocab_size >= 256, "{}", p.display());
            for (name, v) in [("pretrain", &mf.pretrain), ("sft", &mf.sft)] {
                let c: TrainConfig = serde_json::from_value(v.clone())
                    .unwrap_or_else(|e| panic!("{}: [{name}]: {e}", p.display()));
                assert!(c.lr > 0.0 && c.batch_size > 0, "{}: [{name}]", p.display());
            }
            names.push(p.file_stem().unwrap().to_string_lossy().to_string());
        }
        names.sort();
        for want in [
            "cpu",
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-7b",
            "small",
            "tiny",
        ] {
            assert!(names.iter().any(|n| n == want), "{names:?}");
        }
    }
}
