//! `ingest-cuda-l1`: the bundled CUDA-L1 snapshot into `kernels`.

use cudarl_core::{
    ExternalFiles, InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext,
    StageError,
};
use cudarl_data::kernelbench::ProblemIndex;
use cudarl_data::kernels::kernels_batch;
use serde::{Deserialize, Serialize};

use crate::common::{data_err, single_file, write_output};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "ingest-cuda-l1";

/// Params of `ingest-cuda-l1`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// The snapshot file, relative to the project root; not in the key.
    #[serde(default, skip_serializing)]
    pub path: Option<String>,
    /// Keep only these GPUs' files (`h100`, `h20`, `a100`, `l40`, `3090`); empty = all.
    #[serde(default)]
    pub gpus: Vec<String>,
}

/// The stage.
#[derive(Debug)]
pub struct IngestCudaL1 {
    params: Params,
}

impl IngestCudaL1 {
    /// Default bundled path.
    pub const BUNDLED: &'static str = "datasets/cuda_l1/kernels.parquet";

    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        Ok(IngestCudaL1 {
            params: crate::common::parse_params(t)?,
        })
    }
}

impl Stage for IngestCudaL1 {
    stage_identity!(KIND, 1);
    fn inputs(&self) -> Vec<InputDecl> {
        crate::common::kernel_ingest_inputs()
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        crate::common::kernel_ingest_outputs()
    }
    fn resolve_external(
        &self,
        _input: &str,
        ctx: &ResolveContext,
    ) -> Result<ExternalFiles, StageError> {
        single_file(
            &ctx.root,
            self.params.path.as_deref().unwrap_or(Self::BUNDLED),
            "bundled CUDA-L1 snapshot",
        )
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let problems =
            ProblemIndex::read(ctx.input_path("problems")?, "problems").map_err(data_err)?;
        let ext = ctx.input_files("source")?.clone();
        let path = &ext.files[0].1;
        let provenance = format!(
            "deepreinforce-ai/CUDA-L1@51e8356bf844101cab2aeeca4bdff47ebb1953b8 {}",
            ext.files[0].0
        );
        let mut got = cudarl_data::cuda_l1::ingest(
            path,
            &crate::common::display_path(ctx.root(), path),
            &provenance,
            &problems,
        )
        .map_err(data_err)?;
        if !self.params.gpus.is_empty() {
            got.rows
                .retain(|r| r.gpu.as_ref().is_some_and(|g| self.params.gpus.contains(g)));
        }
        for w in got.warnings {
            ctx.warn(w);
        }
        let batch = kernels_batch(&got.rows).map_err(data_err)?;
        write_output(ctx, "kernels", &batch)
    }
}
