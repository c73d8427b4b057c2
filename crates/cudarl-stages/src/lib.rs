//! cudarl-stages: one module per pipeline stage, and the registry that builds them from
//! pipeline files.

/// A stage's identity in its `impl Stage`: `kind` (`$kind`), `code_version` (`$version`, moved
/// on every change of the outputs' meaning) and `params` (the stage's `params` field as the
/// cache key reads it, [`common::params_json`]).
macro_rules! stage_identity {
    ($kind:expr, $version:expr) => {
        fn kind(&self) -> &str {
            $kind
        }
        fn code_version(&self) -> u32 {
            $version
        }
        fn params(&self) -> serde_json::Value {
            crate::common::params_json(&self.params)
        }
    };
    // An ingest stage whose `hub` params are keyed only when `$uses_hub` holds
    // ([`common::params_json_hub`]).
    ($kind:expr, $version:expr, hub if $uses_hub:expr) => {
        fn kind(&self) -> &str {
            $kind
        }
        fn code_version(&self) -> u32 {
            $version
        }
        fn params(&self) -> serde_json::Value {
            let uses_hub = $uses_hub;
            crate::common::params_json_hub(&self.params, uses_hub(&self.params))
        }
    };
}

/// `resolve_external` of a stage whose one external input is the Python worker script
/// ([`cudarl_cuda::pyworker::SCRIPT`], keyed by its bytes).
macro_rules! worker_script_external {
    () => {
        fn resolve_external(
            &self,
            _input: &str,
            ctx: &cudarl_core::ResolveContext,
        ) -> Result<cudarl_core::ExternalFiles, cudarl_core::StageError> {
            crate::common::single_file(&ctx.root, cudarl_cuda::pyworker::SCRIPT, "worker")
        }
    };
}

/// `resolve_external` and `environment` of a stage that samples the checkpoints named
/// `$generator` and `$optimizer` with the RL settings in its `params.rl`
/// ([`rl_params::StageParams::resolve_external`], [`rl_params::StageParams::environment`]).
macro_rules! rl_checkpoints_external {
    ($generator:literal, $optimizer:literal) => {
        fn resolve_external(
            &self,
            input: &str,
            ctx: &cudarl_core::ResolveContext,
        ) -> Result<cudarl_core::ExternalFiles, cudarl_core::StageError> {
            $crate::rl_params::StageParams::resolve_external(
                &self.params.rl,
                input,
                [$generator, $optimizer],
                ctx,
            )
        }
        fn environment(
            &self,
            ctx: &cudarl_core::ResolveContext,
        ) -> Result<std::collections::BTreeMap<String, String>, cudarl_core::StageError> {
            $crate::rl_params::StageParams::environment(&self.params.rl, ctx)
        }
    };
}

pub mod archive_native;
pub mod collab_data;
pub mod common;
pub mod curriculum;
pub mod eval;
pub mod ingest_cuda_l1;
pub mod ingest_kernelbench;
pub mod ingest_sakana;
pub mod kb_judge;
pub mod kb_specs;
pub mod optimize;
pub mod rl_params;
pub mod rl_progress;
pub mod rl_train;
pub mod sft_data;
pub mod sft_eval;
pub mod splits;
pub mod synth_tasks;
pub mod testgen;
pub mod train_stages;
pub mod validate;
pub mod verl_launch;

use cudarl_core::{ParamsError, Stage, StageFactory};

/// Builds one stage from its pipeline table.
type Build = fn(toml::Table) -> Result<Box<dyn Stage>, ParamsError>;

fn boxed<S: Stage + 'static>(s: Result<S, ParamsError>) -> Result<Box<dyn Stage>, ParamsError> {
    Ok(Box::new(s?))
}

/// Every stage kind and its builder, sorted by kind.
const STAGES: [(&str, Build); 20] = [
    (archive_native::KIND, |p| {
        boxed(archive_native::ArchiveNative::from_table(p))
    }),
    (collab_data::KIND, |p| {
        boxed(collab_data::CollabData::from_table(p))
    }),
    (curriculum::KIND, |p| {
        boxed(curriculum::Curriculum::from_table(p))
    }),
    (eval::KIND, |p| boxed(eval::Eval::from_table(p))),
    (ingest_cuda_l1::KIND, |p| {
        boxed(ingest_cuda_l1::IngestCudaL1::from_table(p))
    }),
    (ingest_kernelbench::KIND, |p| {
        boxed(ingest_kernelbench::IngestKernelBench::from_table(p))
    }),
    (ingest_sakana::KIND, |p| {
        boxed(ingest_sakana::IngestSakana::from_table(p))
    }),
    (kb_specs::KIND, |p| boxed(kb_specs::KbSpecs::from_table(p))),
    (optimize::KIND, |p| boxed(optimize::Optimize::from_table(p))),
    (train_stages::Kind::Pretrain.as_str(), |p| {
        model(train_stages::Kind::Pretrain, p)
    }),
    (rl_train::KIND, rl_train_backend),
    (sft_data::KIND, |p| boxed(sft_data::SftData::from_table(p))),
    (sft_eval::KIND, |p| boxed(sft_eval::SftEval::from_table(p))),
    (sft_data::REPAIRS_KIND, |p| {
        boxed(sft_data::SftRepairs::from_table(p))
    }),
    (train_stages::Kind::SftTrain.as_str(), |p| {
        model(train_stages::Kind::SftTrain, p)
    }),
    (splits::KIND, |p| boxed(splits::Splits::from_table(p))),
    (synth_tasks::KIND, |p| {
        boxed(synth_tasks::SynthTasks::from_table(p))
    }),
    (testgen::KIND, |p| boxed(testgen::Testgen::from_table(p))),
    (train_stages::Kind::Tokenizer.as_str(), |p| {
        model(train_stages::Kind::Tokenizer, p)
    }),
    (validate::KIND, |p| boxed(validate::Validate::from_table(p))),
];

fn model(kind: train_stages::Kind, p: toml::Table) -> Result<Box<dyn Stage>, ParamsError> {
    boxed(train_stages::ModelStage::from_table(kind, p))
}

/// `rl-train` on its `backend`: `tch` (absent; this process trains) or `verl` (a VERL job).
fn rl_train_backend(mut p: toml::Table) -> Result<Box<dyn Stage>, ParamsError> {
    match p.get("backend").and_then(|b| b.as_str()) {
        Some("verl") => boxed(verl_launch::VerlLaunch::from_table(p)),
        Some("tch") | None => {
            p.remove("backend");
            boxed(rl_train::RlTrain::from_table(p))
        }
        Some(b) => Err(format!("backend `{b}`: expected `tch` or `verl`").into()),
    }
}

/// Builds every stage kind of cudarl-pipe.
#[derive(Debug, Default, Clone, Copy)]
pub struct Registry;

impl StageFactory for Registry {
    fn kinds(&self) -> Vec<&'static str> {
        STAGES.iter().map(|s| s.0).collect()
    }

    fn build(
        &self,
        kind: &str,
        _node: &str,
        params: toml::Table,
    ) -> Result<Box<dyn Stage>, ParamsError> {
        match STAGES.iter().find(|s| s.0 == kind) {
            Some((_, build)) => build(params),
            None => Err(format!("unknown stage `{kind}`").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_reports_the_kind_it_is_registered_under() {
        for (kind, build) in STAGES {
            let stage = build(toml::Table::new()).unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(stage.kind(), kind);
        }
        assert!(
            STAGES.windows(2).all(|w| w[0].0 < w[1].0),
            "sorted, no duplicates"
        );
        for k in train_stages::Kind::ALL {
            assert!(STAGES.iter().any(|s| s.0 == k.as_str()), "{}", k.as_str());
        }
        let verl: toml::Table = toml::from_str("backend = \"verl\"").unwrap();
        let stage = rl_train_backend(verl).unwrap();
        assert_eq!(
            stage.kind(),
            rl_train::KIND,
            "the VERL launcher stands in for rl-train"
        );
    }
}
