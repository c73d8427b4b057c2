//! `sft-eval`: the generator after SFT, on the hold-out families (the `test` split of
//! `sft-data`, never trained on): `samples` completions per task of the RL prompt
//! (`cudarl_curriculum::prompts::task_prompt(.., 0, 0)`), the code block extracted and put
//! through the harness's static rules and nvcc. The compile rate is the baseline RL must beat.
//! Compile-only on every machine for now (`mode` says so); pass rates come with `eval`.
//!
//! Outputs: `samples` ([`cudarl_tables::sft_eval::SftSampleRow`]), one row per completion, and
//! `sft_eval` ([`cudarl_tables::sft_eval::SftEvalRow`]), the compile rate per task.

use std::collections::BTreeMap;

use cudarl_core::{
    InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext, StageError,
};
use cudarl_cuda::{Nvcc, Rules, TaskSpec, check_compile_only};
use cudarl_curriculum::prompts;
use cudarl_protocol::{Device, Job, SampleLine};
use cudarl_rl::episode::generator_conversation;
use cudarl_rl::tasks;
use cudarl_tables::TableRow;
use cudarl_tables::sft_eval::{SftEvalRow, SftSampleRow};
use serde::{Deserialize, Serialize};

use crate::common::run_job;
use crate::common::{resolve_device, rl_err, write_rows};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "sft-eval";

fn d_samples() -> usize {
    8
}
fn d_tokens() -> usize {
    512
}
fn d_temp() -> f64 {
    0.7
}
fn d_top_p() -> f64 {
    0.95
}

/// Parameters (`[stages.sft-eval]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// A Hugging Face checkpoint directory (a path with a `/`) sampled in place of
    /// `sft-train`'s checkpoint, with its own tokenizer and chat template; its files enter the
    /// key, its path does not. Absent: `sft-train`'s checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Samples per task.
    #[serde(default = "d_samples")]
    pub samples: usize,
    /// Most new tokens per sample.
    #[serde(default = "d_tokens")]
    pub max_new_tokens: usize,
    /// Sampling temperature.
    #[serde(default = "d_temp")]
    pub temperature: f64,
    /// Nucleus mass.
    #[serde(default = "d_top_p")]
    pub top_p: f64,
    /// Sampling seed.
    #[serde(default)]
    pub seed: i64,
    /// `auto`, `cpu` or `cuda`.
    #[serde(default)]
    pub device: Device,
}

/// The `sft-eval` stage.
#[derive(Debug)]
pub struct SftEval {
    params: Params,
}

impl SftEval {
    /// From the pipeline's table.
    ///
    /// # Errors
    /// Unknown keys, a `model` that is not a path.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        if let Some(m) = &params.model
            && !crate::common::is_checkpoint_dir(m)
        {
            return Err(format!(
                "model `{m}`: a Hugging Face checkpoint directory, named by a path with a `/`"
            )
            .into());
        }
        Ok(SftEval { params })
    }

    fn device(&self) -> &'static str {
        resolve_device(self.params.device)
    }
}

impl Stage for SftEval {
    // Code versions:
    // 3: builds are inspected after compiling (preprocessed text, object, PTX).
    // 4: a seeded batch samples the same whether the model had a decoder yet or not.
    stage_identity!(KIND, 4);
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            crate::common::checkpoint_input(
                "model",
                ("sft-train", "checkpoint"),
                self.params.model.as_deref(),
            ),
            InputDecl::node("data", "sft-data", "sft_generator"),
            InputDecl::node("tasks", "synth-tasks", "tasks"),
        ]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table(SftSampleRow::NAME, SftSampleRow::schema()),
            OutputDecl::table(SftEvalRow::NAME, SftEvalRow::schema()),
        ]
    }
    fn resolve_external(
        &self,
        _input: &str,
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        // The one external input: `model` as a checkpoint directory.
        let dir = self.params.model.as_deref().unwrap_or_default();
        crate::common::checkpoint_files(&ctx.root, dir)
    }
    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        let nvcc = Nvcc::discover(&ctx.root).map_err(|e| StageError::Failed(e.to_string()))?;
        Ok(BTreeMap::from([
            ("nvcc".to_string(), nvcc.version),
            ("device".to_string(), self.device().to_string()),
        ]))
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let p = &self.params;
        // The hold-out families: the `test` split of the SFT data.
        let held = tasks::holdout_ids(ctx.input_path("data")?).map_err(rl_err)?;
        let specs: Vec<TaskSpec> = tasks::read_specs(ctx.input_path("tasks")?)
            .map_err(rl_err)?
            .into_iter()
            .filter(|s| held.contains(&s.id))
            .collect();
        let tmp = ctx.store().temp_dir()?;
        let dir = tmp.path();
        let model = crate::common::checkpoint_dir(ctx, "model", &dir.join("model"))?;
        let prompts_path = dir.join("prompts.jsonl");
        let lines: Vec<String> = specs
            .iter()
            .map(|s| serde_json::to_string(&generator_conversation(s)).expect("json"))
            .collect();
        std::fs::write(&prompts_path, lines.join("\n") + "\n")
            .map_err(|e| StageError::Failed(e.to_string()))?;
        let out = dir.join("samples.jsonl");
        let device = self.device();
        let job = Job::Sample {
            model,
            prompts: prompts_path,
            n: p.samples,
            max_new_tokens: p.max_new_tokens,
            temperature: p.temperature,
            top_p: p.top_p,
            seed: p.seed,
            device: if device == "cuda" {
                Device::Cuda
            } else {
                Device::Cpu
            },
            out: out.clone(),
        };
        run_job(&job, dir, "pipelines (stages.sft-eval)", KIND, None)?;
        let text = std::fs::read_to_string(&out).map_err(|e| StageError::Failed(e.to_string()))?;
        let compiler = crate::common::store_compiler(ctx)?;
        let rules = Rules::builtin();
        let mut samples = Vec::new();
        let mut per: BTreeMap<String, SftEvalRow> = BTreeMap::new();
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: SampleLine = serde_json::from_str(l)
                .map_err(|e| StageError::Failed(format!("trainer sample `{l}`: {e}")))?;
            let spec = specs.get(v.prompt).ok_or_else(|| {
                StageError::Failed(format!(
                    "trainer sample of prompt {} of {}",
                    v.prompt,
                    specs.len()
                ))
            })?;
            let code = prompts::extract_code(&v.text);
            let (ok, failure, detail) = match &code {
                None => (false, Some("no_code".to_string()), None),
                Some(c) => {
                    let vd = check_compile_only(spec, c, &rules, &compiler)
                        .map_err(|e| StageError::Failed(e.to_string()))?;
                    (vd.compiled, vd.failure, vd.failure_detail)
                }
            };
            let e = per.entry(spec.id.clone()).or_insert(SftEvalRow {
                task_id: spec.id.clone(),
                tier: spec.tier,
                device: device.into(),
                mode: "compile-only".into(),
                ..Default::default()
            });
            e.samples += 1;
            e.with_code += i64::from(code.is_some());
            e.compiled += i64::from(ok);
            e.compile_rate = e.compiled as f64 / e.samples as f64;
            samples.push(SftSampleRow {
                task_id: spec.id.clone(),
                sample: v.sample as i64,
                text: v.text,
                code,
                tokens: v.tokens as i64,
                finish: v.finish.as_str().into(),
                compiled: ok,
                failure,
                detail: detail.map(|d| d.chars().take(2000).collect::<String>()),
            });
        }
        write_rows(ctx, SftSampleRow::NAME, &SftSampleRow::schema(), &samples)?;
        let rows: Vec<SftEvalRow> = per.into_values().collect();
        write_rows(ctx, SftEvalRow::NAME, &SftEvalRow::schema(), &rows)
    }
}
