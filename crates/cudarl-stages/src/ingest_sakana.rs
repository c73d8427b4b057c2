//! `ingest-sakana`: the SakanaAI AI-CUDA-Engineer-Archive into `kernels`.

use cudarl_core::{
    ExternalFiles, InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext,
    StageError,
};
use cudarl_data::kernelbench::ProblemIndex;
use cudarl_data::kernels::kernels_batch;
use cudarl_data::sakana::{SakanaFile, ingest};
use serde::{Deserialize, Serialize};

use crate::common::{HubParams, data_err, rooted, write_output};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "ingest-sakana";

/// Where the archive comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SakanaSource {
    /// The bundled 102-row sample (or `path`).
    Bundled,
    /// Local `level_{1,2,3}.parquet` files in the directory `path`.
    Files,
    /// The hub dataset (see `hub`).
    Hub,
}

fn default_hub() -> HubParams {
    HubParams {
        repo: "SakanaAI/AI-CUDA-Engineer-Archive".into(),
        revision: "main".into(),
        files: (1..=3).map(|l| format!("level_{l}.parquet")).collect(),
        cache_dir: None,
        offline: false,
        endpoint: None,
    }
}

/// Params of `ingest-sakana`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Source kind.
    #[serde(default = "bundled")]
    pub source: SakanaSource,
    /// Bundled file or directory of `level_*.parquet`; relative to the project root; not in the key.
    #[serde(default, skip_serializing)]
    pub path: Option<String>,
    /// Hub settings (source = "hub").
    #[serde(default = "default_hub")]
    pub hub: HubParams,
    /// Fail on an unparseable `NCU_Profile` instead of nulling it with a warning.
    #[serde(default)]
    pub strict_ncu: bool,
}

fn bundled() -> SakanaSource {
    SakanaSource::Bundled
}

/// The stage.
#[derive(Debug)]
pub struct IngestSakana {
    params: Params,
}

impl IngestSakana {
    /// Default bundled path.
    pub const BUNDLED: &'static str =
        "datasets/sakana_ai_cuda_engineer_archive_sample/sample.parquet";

    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        if params.source == SakanaSource::Files && params.path.is_none() {
            return Err(
                "source = \"files\" needs `path` (a directory with level_*.parquet)".into(),
            );
        }
        Ok(IngestSakana { params })
    }
}

impl Stage for IngestSakana {
    stage_identity!(KIND, 1, hub if |p: &Params| p.source == SakanaSource::Hub);
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
        match self.params.source {
            SakanaSource::Bundled => crate::common::single_file(
                &ctx.root,
                self.params.path.as_deref().unwrap_or(Self::BUNDLED),
                "bundled SakanaAI archive sample",
            ),
            SakanaSource::Files => {
                let p = self.params.path.as_deref().expect("checked");
                let dir = rooted(&ctx.root, p);
                let mut files = Vec::new();
                let rd = std::fs::read_dir(&dir).map_err(|e| {
                    StageError::bad_input(p, None, format!("cannot list directory: {e}"))
                })?;
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().to_string();
                    if name.starts_with("level_") && name.ends_with(".parquet") {
                        files.push((name, e.path()));
                    }
                }
                files.sort();
                if files.is_empty() {
                    return Err(StageError::bad_input(
                        p,
                        None,
                        "no level_*.parquet files in this directory",
                    ));
                }
                Ok(ExternalFiles {
                    source: "local SakanaAI archive files".into(),
                    files,
                })
            }
            SakanaSource::Hub => self.params.hub.resolve(&ctx.root),
        }
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let problems =
            ProblemIndex::read(ctx.input_path("problems")?, "problems").map_err(data_err)?;
        let ext = ctx.input_files("source")?.clone();
        let provenance = match self.params.source {
            SakanaSource::Hub => {
                format!("hf:{}@{}", self.params.hub.repo, self.params.hub.revision)
            }
            _ => "SakanaAI/AI-CUDA-Engineer-Archive".to_string(),
        };
        let files: Vec<SakanaFile> = ext
            .files
            .iter()
            .map(|(name, path)| SakanaFile {
                split: match self.params.source {
                    SakanaSource::Bundled => "sample".to_string(),
                    _ => name
                        .trim_end_matches(".parquet")
                        .rsplit('/')
                        .next()
                        .unwrap_or(name)
                        .to_string(),
                },
                display: crate::common::display_path(ctx.root(), path),
                name: name.clone(),
                path: path.clone(),
                provenance: provenance.clone(),
            })
            .collect();
        let got = ingest(&files, &problems, self.params.strict_ncu).map_err(data_err)?;
        for w in got.warnings {
            ctx.warn(w);
        }
        let batch = kernels_batch(&got.rows).map_err(data_err)?;
        write_output(ctx, "kernels", &batch)
    }
}
