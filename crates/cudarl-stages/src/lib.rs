//! cudarl-stages: one module per pipeline stage, and the registry that builds them from
//! pipeline files.

pub mod common;
pub mod curriculum;
pub mod ingest_cuda_l1;
pub mod ingest_kernelbench;
pub mod ingest_sakana;
pub mod kb_specs;
pub mod synth_tasks;
pub mod testgen;
pub mod validate;

use cudarl_core::{Stage, StageFactory};

/// Builds every stage kind of cudarl-pipe.
#[derive(Debug, Default, Clone, Copy)]
pub struct Registry;

impl StageFactory for Registry {
    fn kinds(&self) -> Vec<&'static str> {
        vec![
            "curriculum",
            "ingest-cuda-l1",
            "ingest-kernelbench",
            "ingest-sakana",
            "kb-specs",
            "synth-tasks",
            "testgen",
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
            "testgen" => Box::new(testgen::Testgen::from_table(params)?),
            "validate" => Box::new(validate::Validate::from_table(params)?),
            other => return Err(format!("unknown stage `{other}`")),
        })
    }
}
