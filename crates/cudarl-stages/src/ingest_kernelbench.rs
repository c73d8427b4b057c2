//! `ingest-kernelbench`: KernelBench problems into `problems` (docs/architecture.md, "The default
//! pipeline").

use cudarl_core::{
    ExternalFiles, InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext,
    StageError,
};
use cudarl_curriculum::extract_op_features;
use cudarl_data::kernelbench::{
    ProblemRow, RawProblem, list_checkout, problems_batch, read_checkout, read_parquet,
};
use cudarl_data::schemas::PROBLEMS;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::common::{HubParams, data_err, display_path, rooted, single_file, write_output};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "ingest-kernelbench";

/// Where problems come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KbSource {
    /// `datasets/kernelbench/problems.parquet` (or `path`).
    Bundled,
    /// A KernelBench checkout at `path` (`KernelBench/level{1..4}/*.py`).
    Checkout,
    /// The hub dataset `ScalingIntelligence/KernelBench` (see `hub`).
    Hub,
}

fn default_hub() -> HubParams {
    HubParams {
        repo: "ScalingIntelligence/KernelBench".into(),
        revision: "main".into(),
        files: (1..=4)
            .map(|l| format!("data/level_{l}-00000-of-00001.parquet"))
            .collect(),
        cache_dir: None,
        offline: false,
        endpoint: None,
    }
}

fn all_levels() -> Vec<i64> {
    vec![1, 2, 3, 4]
}

/// Params of `ingest-kernelbench`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Source kind.
    #[serde(default = "bundled")]
    pub source: KbSource,
    /// File (bundled) or checkout directory; relative to the project root. Not in the key:
    /// the content of what it points to is.
    #[serde(default, skip_serializing)]
    pub path: Option<String>,
    /// Hub dataset settings (source = "hub").
    #[serde(default = "default_hub")]
    pub hub: HubParams,
    /// Levels to keep.
    #[serde(default = "all_levels")]
    pub levels: Vec<i64>,
}

fn bundled() -> KbSource {
    KbSource::Bundled
}

/// The stage.
#[derive(Debug)]
pub struct IngestKernelBench {
    params: Params,
}

impl IngestKernelBench {
    /// Default bundled path.
    pub const BUNDLED: &'static str = "datasets/kernelbench/problems.parquet";

    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t)?;
        if params.source == KbSource::Checkout && params.path.is_none() {
            return Err(
                "source = \"checkout\" needs `path` (a KernelBench checkout directory)".into(),
            );
        }
        Ok(IngestKernelBench { params })
    }
}

impl Stage for IngestKernelBench {
    stage_identity!(KIND, 1, hub if |p: &Params| p.source == KbSource::Hub);
    fn inputs(&self) -> Vec<InputDecl> {
        vec![InputDecl::external("source")]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![OutputDecl::table("problems", PROBLEMS.clone())]
    }
    fn resolve_external(
        &self,
        _input: &str,
        ctx: &ResolveContext,
    ) -> Result<ExternalFiles, StageError> {
        match self.params.source {
            KbSource::Bundled => single_file(
                &ctx.root,
                self.params.path.as_deref().unwrap_or(Self::BUNDLED),
                "bundled KernelBench problems",
            ),
            KbSource::Checkout => {
                let p = self.params.path.as_deref().expect("checked in from_table");
                let files = list_checkout(&rooted(&ctx.root, p)).map_err(data_err)?;
                Ok(ExternalFiles {
                    source: "KernelBench checkout".into(),
                    files,
                })
            }
            KbSource::Hub => self.params.hub.resolve(&ctx.root),
        }
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let ext = ctx.input_files("source")?.clone();
        let (raw, kind): (Vec<RawProblem>, &str) = match self.params.source {
            KbSource::Bundled => {
                let path = &ext.files[0].1;
                (
                    read_parquet(path, &display_path(ctx.root(), path)).map_err(data_err)?,
                    "bundled",
                )
            }
            KbSource::Checkout => {
                let root = rooted(ctx.root(), self.params.path.as_deref().unwrap_or("."));
                let commit = cudarl_core::engine::read_git_commit(&root);
                (
                    read_checkout(
                        &ext.files,
                        Some("ScalingIntelligence/KernelBench"),
                        commit.as_deref(),
                    )
                    .map_err(data_err)?,
                    "checkout",
                )
            }
            KbSource::Hub => {
                let mut all = Vec::new();
                for (name, path) in &ext.files {
                    let mut v =
                        read_parquet(path, &display_path(ctx.root(), path)).map_err(data_err)?;
                    for p in &mut v {
                        p.source_repo
                            .get_or_insert_with(|| format!("hf:{}", self.params.hub.repo));
                        p.source_commit.get_or_insert_with(|| {
                            cudarl_data::hub::snapshot_commit(path)
                                .unwrap_or_else(|| self.params.hub.revision.clone())
                        });
                        p.source_path.get_or_insert_with(|| name.clone());
                    }
                    all.extend(v);
                }
                (all, "hub")
            }
        };
        let raw: Vec<RawProblem> = raw
            .into_iter()
            .filter(|p| self.params.levels.contains(&p.level))
            .collect();
        let rows: Vec<ProblemRow> = raw
            .into_par_iter()
            .map(|r| ProblemRow {
                op_features: extract_op_features(&r.code),
                raw: r,
                source_kind: kind.to_string(),
            })
            .collect();
        let no_ops = rows.iter().filter(|r| r.op_features.is_empty()).count();
        if no_ops > 0 {
            ctx.warn(format!(
                "{no_ops} problems have no recognized torch ops in their reference"
            ));
        }
        let display = ext.files.first().map(|f| f.0.clone()).unwrap_or_default();
        let batch = problems_batch(rows, &display).map_err(data_err)?;
        write_output(ctx, "problems", &batch)
    }
}
