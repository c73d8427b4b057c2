//! cudarl-stages: one module per pipeline stage, and the registry that builds them from
//! pipeline files.

pub mod common;
pub mod curriculum;
pub mod episode;
pub mod eval;
pub mod families;
pub mod ingest_cuda_l1;
pub mod ingest_kernelbench;
pub mod ingest_sakana;
pub mod kb_specs;
pub mod plot;
pub mod repair;
pub mod reward;
pub mod rl_train;
pub mod rollout;
pub mod sft_data;
pub mod sft_eval;
pub mod synth_tasks;
pub mod testgen;
pub mod train_stages;
pub mod validate;
pub mod verl;
/// Where `cudarl-pipe serve` listens by default (and where the VERL backend's rollouts look for
/// it unless `serve_url` says otherwise).
pub const SERVE_BIND: &str = "127.0.0.1:8000";
pub mod verl_launch;

use cudarl_core::{Stage, StageFactory};

/// Builds every stage kind of cudarl-pipe.
#[derive(Debug, Default, Clone, Copy)]
pub struct Registry;

impl StageFactory for Registry {
    fn kinds(&self) -> Vec<&'static str> {
        vec![
            "curriculum",
            "eval",
            "ingest-cuda-l1",
            "ingest-kernelbench",
            "ingest-sakana",
            "kb-specs",
            "pretrain",
            "rl-train",
            "sft-data",
            "sft-eval",
            "sft-repairs",
            "sft-train",
            "synth-tasks",
            "testgen",
            "tokenizer",
            "validate",
        ]
    }

    fn build(
        &self,
        kind: &str,
        _node: &str,
        params: toml::Table,
    ) -> Result<Box<dyn Stage>, String> {
        Ok(match kind {
            "ingest-kernelbench" => {
                Box::new(ingest_kernelbench::IngestKernelBench::from_table(params)?)
            }
            "ingest-sakana" => Box::new(ingest_sakana::IngestSakana::from_table(params)?),
            "ingest-cuda-l1" => Box::new(ingest_cuda_l1::IngestCudaL1::from_table(params)?),
            "curriculum" => Box::new(curriculum::Curriculum::from_table(params)?),
            "synth-tasks" => Box::new(synth_tasks::SynthTasks::from_table(params)?),
            "kb-specs" => Box::new(kb_specs::KbSpecs::from_table(params)?),
            "sft-data" => Box::new(sft_data::SftData::from_table(params)?),
            "sft-repairs" => Box::new(sft_data::SftRepairs::from_table(params)?),
            "sft-eval" => Box::new(sft_eval::SftEval::from_table(params)?),
            "rl-train" => match params.get("backend").and_then(|b| b.as_str()) {
                Some("verl") => Box::new(verl_launch::VerlLaunch::from_table(params)?),
                Some("tch") | None => {
                    let mut params = params;
                    params.remove("backend");
                    Box::new(rl_train::RlTrain::from_table(params)?)
                }
                Some(b) => return Err(format!("backend `{b}`: expected `tch` or `verl`")),
            },
            "eval" => Box::new(eval::Eval::from_table(params)?),
            "tokenizer" => Box::new(train_stages::ModelStage::from_table(
                train_stages::Kind::Tokenizer,
                params,
            )?),
            "pretrain" => Box::new(train_stages::ModelStage::from_table(
                train_stages::Kind::Pretrain,
                params,
            )?),
            "sft-train" => Box::new(train_stages::ModelStage::from_table(
                train_stages::Kind::SftTrain,
                params,
            )?),
            "testgen" => Box::new(testgen::Testgen::from_table(params)?),
            "validate" => Box::new(validate::Validate::from_table(params)?),
            other => return Err(format!("unknown stage `{other}`")),
        })
    }
}
