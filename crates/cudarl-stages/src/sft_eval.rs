//! `sft-eval`: the generator after SFT, on the hold-out families (the `test` split of
//! `sft-data`, never trained on): `samples` completions per task of the RL prompt
//! (`cudarl_curriculum::prompts::task_prompt(.., 0, 0)`), the code block extracted and put
//! through the harness's static rules and nvcc. The compile rate is the baseline RL must beat.
//! Compile-only on every machine for now (`mode` says so); pass rates come with `eval`.
//!
//! | table | columns |
//! |---|---|
//! | `samples` | task_id (utf8), sample (int64), text (utf8: the completion), code (utf8, nullable: the extracted block), tokens (int64), finish (utf8: Eos, Length), compiled (bool), failure (utf8, nullable: `no_code`, `static_reject`, `compile_error`, ...), detail (utf8, nullable) |
//! | `sft_eval` | task_id (utf8), tier (int64), samples, with_code, compiled (int64), compile_rate (float64), mode (utf8), device (utf8) |

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow::array::{BooleanArray, Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{InputDecl, OutputDecl, ResolveContext, Stage, StageContext, StageError};
use cudarl_cuda::{Nvcc, Rules, TaskSpec, check_compile_only};
use cudarl_curriculum::prompts::{self, ChatMessage, GENERATOR_SYSTEM, TaskView};
use cudarl_data::Table;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::{data_err, params_json, write_output};
use crate::train_stages::{materialize, run_trainer};

/// Schema of `samples`.
pub static SAMPLES: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("task_id", DataType::Utf8, false),
        Field::new("sample", DataType::Int64, false),
        Field::new("text", DataType::Utf8, false),
        Field::new("code", DataType::Utf8, true),
        Field::new("tokens", DataType::Int64, false),
        Field::new("finish", DataType::Utf8, false),
        Field::new("compiled", DataType::Boolean, false),
        Field::new("failure", DataType::Utf8, true),
        Field::new("detail", DataType::Utf8, true),
    ]))
});

/// Schema of `sft_eval`.
pub static SFT_EVAL: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("task_id", DataType::Utf8, false),
        Field::new("tier", DataType::Int64, false),
        Field::new("samples", DataType::Int64, false),
        Field::new("with_code", DataType::Int64, false),
        Field::new("compiled", DataType::Int64, false),
        Field::new("compile_rate", DataType::Float64, false),
        Field::new("mode", DataType::Utf8, false),
        Field::new("device", DataType::Utf8, false),
    ]))
});

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
fn d_device() -> String {
    "auto".into()
}

/// Parameters (`[stages.sft-eval]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
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
    #[serde(default = "d_device")]
    pub device: String,
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
    /// Unknown keys.
    pub fn from_table(t: toml::Table) -> Result<Self, String> {
        Ok(SftEval {
            params: crate::common::parse_params(t)?,
        })
    }

    fn device(&self) -> &'static str {
        crate::train_stages::resolve_device(&self.params.device)
    }
}

impl Stage for SftEval {
    fn kind(&self) -> &str {
        "sft-eval"
    }
    fn code_version(&self) -> u32 {
        // 3: builds are inspected after compiling (preprocessed text, object, PTX).
        3
    }
    fn params(&self) -> Value {
        params_json(&self.params)
    }
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            InputDecl::node("model", "sft-train", "checkpoint"),
            InputDecl::node("data", "sft-data", "sft_generator"),
            InputDecl::node("tasks", "synth-tasks", "tasks"),
        ]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("samples", SAMPLES.clone()),
            OutputDecl::table("sft_eval", SFT_EVAL.clone()),
        ]
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
        let d = Table::read(ctx.input_path("data")?, "sft_generator").map_err(data_err)?;
        let (dt, ds) = (
            d.req_strings("task_id").map_err(data_err)?,
            d.req_strings("split").map_err(data_err)?,
        );
        let held: std::collections::BTreeSet<String> = (0..d.rows())
            .filter(|&i| ds.get(i) == Some("test"))
            .filter_map(|i| dt.get(i).map(str::to_string))
            .collect();
        let tt = Table::read(ctx.input_path("tasks")?, "tasks").map_err(data_err)?;
        let tid = tt.req_strings("task_id").map_err(data_err)?;
        let js = tt.req_strings("spec_json").map_err(data_err)?;
        let mut specs: Vec<TaskSpec> = Vec::new();
        for i in 0..tt.rows() {
            if let (Some(id), Some(j)) = (tid.get(i), js.get(i))
                && held.contains(id)
            {
                specs.push(serde_json::from_str(j).map_err(|e| {
                    StageError::bad_input("tasks", Some("spec_json"), e.to_string())
                })?);
            }
        }
        let tmp = ctx.store().temp_dir()?;
        let dir = tmp.path();
        let model = dir.join("model");
        materialize(ctx.store(), ctx.input_path("model")?, &model)?;
        let prompts_path = dir.join("prompts.jsonl");
        let mut lines = Vec::new();
        for s in &specs {
            let shapes: Vec<String> = s
                .train_shapes
                .iter()
                .map(|m| serde_json::to_string(m).expect("json"))
                .collect();
            let sig = s.signature();
            let view = TaskView {
                tier: s.tier,
                description: &s.description,
                dtype: &s.dtype,
                signature: &sig,
                shapes: &shapes,
            };
            let msgs = vec![
                ChatMessage::new("system", GENERATOR_SYSTEM),
                ChatMessage::new("user", prompts::task_prompt(&view, 0, 0)),
            ];
            lines.push(serde_json::to_string(&msgs).expect("json"));
        }
        std::fs::write(&prompts_path, lines.join("\n") + "\n")
            .map_err(|e| StageError::Failed(e.to_string()))?;
        let out = dir.join("samples.jsonl");
        let device = self.device();
        let job = json!({"kind": "sample", "model": model, "prompts": prompts_path,
            "n": p.samples, "max_new_tokens": p.max_new_tokens, "temperature": p.temperature,
            "top_p": p.top_p, "seed": p.seed, "device": device, "out": out});
        run_trainer(&job, dir, "pipelines (stages.sft-eval)", "sft-eval")?;
        let text = std::fs::read_to_string(&out).map_err(|e| StageError::Failed(e.to_string()))?;
        let compiler = crate::common::store_compiler(ctx)?;
        let rules = Rules::builtin();
        let mut cols: (Vec<String>, Vec<i64>, Vec<String>, Vec<Option<String>>) =
            (vec![], vec![], vec![], vec![]);
        let (mut toks, mut fin, mut comp, mut fail, mut det) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut per: BTreeMap<String, (i64, i64, i64, i64)> = BTreeMap::new();
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value =
                serde_json::from_str(l).map_err(|e| StageError::Failed(e.to_string()))?;
            let spec = &specs[v["prompt"].as_u64().unwrap_or(0) as usize];
            let completion = v["text"].as_str().unwrap_or_default().to_string();
            let code = prompts::extract_code(&completion);
            let (ok, failure, detail) = match &code {
                None => (false, Some("no_code".to_string()), None),
                Some(c) => {
                    let vd = check_compile_only(spec, c, &rules, &compiler)
                        .map_err(|e| StageError::Failed(e.to_string()))?;
                    (vd.compiled, vd.failure, vd.failure_detail)
                }
            };
            let e = per.entry(spec.id.clone()).or_insert((spec.tier, 0, 0, 0));
            e.1 += 1;
            e.2 += i64::from(code.is_some());
            e.3 += i64::from(ok);
            cols.0.push(spec.id.clone());
            cols.1.push(v["sample"].as_i64().unwrap_or(0));
            cols.2.push(completion);
            cols.3.push(code);
            toks.push(v["tokens"].as_i64().unwrap_or(0));
            fin.push(v["finish"].as_str().unwrap_or_default().to_string());
            comp.push(ok);
            fail.push(failure);
            det.push(detail.map(|d| d.chars().take(2000).collect::<String>()));
        }
        let b = cudarl_data::parquet_io::batch(
            &SAMPLES.clone(),
            vec![
                Arc::new(StringArray::from(cols.0)),
                Arc::new(Int64Array::from(cols.1)),
                Arc::new(StringArray::from(cols.2)),
                Arc::new(StringArray::from(cols.3)),
                Arc::new(Int64Array::from(toks)),
                Arc::new(StringArray::from(fin)),
                Arc::new(BooleanArray::from(comp)),
                Arc::new(StringArray::from(fail)),
                Arc::new(StringArray::from(det)),
            ],
        )
        .map_err(data_err)?;
        write_output(ctx, "samples", &b)?;
        let ids: Vec<String> = per.keys().cloned().collect();
        let v: Vec<&(i64, i64, i64, i64)> = per.values().collect();
        let b = cudarl_data::parquet_io::batch(
            &SFT_EVAL.clone(),
            vec![
                Arc::new(StringArray::from(ids)),
                Arc::new(Int64Array::from(v.iter().map(|x| x.0).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(v.iter().map(|x| x.1).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(v.iter().map(|x| x.2).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(v.iter().map(|x| x.3).collect::<Vec<_>>())),
                Arc::new(Float64Array::from(
                    v.iter()
                        .map(|x| x.3 as f64 / x.1.max(1) as f64)
                        .collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(vec!["compile-only"; v.len()])),
                Arc::new(StringArray::from(vec![device; v.len()])),
            ],
        )
        .map_err(data_err)?;
        write_output(ctx, "sft_eval", &b)?;
        Ok(())
    }
}
