//! `rl-train` with `backend = "verl"`: the same curriculum trained by VERL on a Ray cluster
//! (for models one GPU cannot hold; `docs/architecture.md`, "Scale-out").
//!
//! The stage writes VERL's RL Parquet (`rl_train`, `rl_test`: the layout of `export --format
//! verl`), a job directory (the Parquet files, `cudarl_verl/` with the multi-turn agent loop
//! and the reward function, `overrides.txt`), composes the Hydra overrides against the
//! installed verl's own `ppo_trainer` config (`python -m verl.trainer.main_ppo --cfg job`:
//! an unknown or mistyped key fails here, exit 2, not on the cluster), checks that the agent
//! loop imports, and, with `launch = true`, starts the job: `python -m verl.trainer.main_ppo`
//! on this machine (Ray started locally, or joined with `ray_address = "ray://..."` /
//! `"host:port"`), or `ray job submit --address http://head:8265 --working-dir <job dir>` for a
//! remote cluster. Rollouts get compile/test/time feedback and rewards from `cudarl-pipe serve`
//! at `serve_url`.
//!
//! Pinned: verl 0.9.1 (`requirements-dev.txt`); the installed version is part of the cache key.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use cudarl_core::{
    ExternalFiles, InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext,
    StageError,
};
use cudarl_rl::verl::job::{
    AGENT_FILES, JobError, Params, VERL_VERSION, check_with_verl, launch, shell_words,
    write_job_dir,
};

use crate::common::{params_json, rl_err};

/// The stage.
#[derive(Debug)]
pub struct VerlLaunch {
    params: Params,
}

impl VerlLaunch {
    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params, zero sizes.
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: Params = crate::common::parse_params(t).map_err(|e| {
            format!(
                "{e} (the VERL backend has its own params and no local checkpoints for `eval`: use pipelines/verl.toml, `cudarl-pipe run rl-train --pipeline pipelines/verl.toml`)"
            )
        })?;
        params.check()?;
        Ok(VerlLaunch { params })
    }
}

fn io(p: &Path) -> impl Fn(std::io::Error) -> StageError + '_ {
    move |e| StageError::Failed(format!("{}: {e}", p.display()))
}

/// A job's failure as the stage's: rejected overrides are bad config naming `overrides`.
fn job_err(e: JobError) -> StageError {
    match e {
        JobError::Rejected(message) => StageError::Config {
            file: "rl-train".into(),
            field: Some("overrides".into()),
            message,
        },
        JobError::Failed(m) => StageError::Failed(m),
    }
}

impl Stage for VerlLaunch {
    fn kind(&self) -> &str {
        // It stands in for `rl-train` (`pipelines/verl.toml`): the same kind, so the nodes
        // downstream of `rl-train` take its checkpoints.
        "rl-train"
    }
    fn code_version(&self) -> u32 {
        // 2: the hold-out of `rl_test` is also the `splits` table's (a family sft-data wrote no
        // row for is no longer in `rl_train`).
        2
    }
    fn params(&self) -> serde_json::Value {
        params_json(&self.params)
    }
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            InputDecl::node("tasks", "synth-tasks", "tasks"),
            InputDecl::node("sft", "sft-data", "sft_generator"),
            InputDecl::node("splits", "splits", "splits"),
            InputDecl::external("agent"),
        ]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::file("rl_train", "parquet"),
            OutputDecl::file("rl_test", "parquet"),
            OutputDecl::file("overrides", "txt"),
            OutputDecl::file("config", "yaml"),
            OutputDecl::file("job", "json"),
        ]
    }
    fn resolve_external(
        &self,
        _input: &str,
        ctx: &ResolveContext,
    ) -> Result<ExternalFiles, StageError> {
        let mut files = Vec::new();
        for f in AGENT_FILES {
            let p = ctx.root.join("python").join(f);
            if !p.is_file() {
                return Err(StageError::bad_input(
                    format!("python/{f}"),
                    None,
                    "file not found (the VERL agent loop)",
                ));
            }
            files.push((f.to_string(), p));
        }
        Ok(ExternalFiles {
            source: "python/cudarl_verl".into(),
            files,
        })
    }
    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        let python = cudarl_cuda::pyworker::python(&ctx.root);
        let o = Command::new(&python)
            .args([
                "-c",
                "import importlib.metadata as m; print(m.version('verl'))",
            ])
            .output()
            .map_err(|e| StageError::Failed(format!("{}: {e}", python.display())))?;
        if !o.status.success() {
            return Err(StageError::Config {
                file: "rl-train".into(),
                field: Some("backend".into()),
                message: format!(
                    "backend `verl` needs verl in {} (`pip install verl=={VERL_VERSION}`, as `make setup` does)",
                    python.display()
                ),
            });
        }
        let version = String::from_utf8_lossy(&o.stdout).trim().to_string();
        Ok([("verl".to_string(), version)].into())
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let out_dir = ctx
            .output_path("rl_train")
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        // VERL's RL Parquet, as `export --format verl` writes it, the hold-out the `splits`
        // table's `test` families (sft-data's `test` rows name only families it has rows for).
        let scratch = out_dir.join("export");
        let splits = cudarl_tables::splits::SplitMap::read(ctx.input_path("splits")?, "splits")
            .map_err(crate::common::data_err)?;
        let mut held = cudarl_rl::tasks::holdout_ids(ctx.input_path("sft")?).map_err(rl_err)?;
        held.extend(
            splits
                .families
                .iter()
                .filter(|(_, s)| *s == "test")
                .map(|(t, _)| t.clone()),
        );
        cudarl_rl::verl::export_rl(
            ctx.input_path("tasks")?,
            &held,
            &scratch,
            self.params.max_turns,
        )
        .map_err(crate::common::rl_err)?;
        cudarl_rl::verl::export_sft(ctx.input_path("sft")?, &scratch)
            .map_err(crate::common::rl_err)?;
        let overrides = self.params.overrides();
        let overrides_text = overrides.join("\n") + "\n";
        let agent = ctx.input_files("agent")?.clone();
        let job_dir = write_job_dir(ctx.store().root(), &scratch, &agent.files, &overrides_text)
            .map_err(job_err)?;
        let python = cudarl_cuda::pyworker::python(ctx.root());
        let config = check_with_verl(&python, &job_dir, &overrides).map_err(job_err)?;
        let command = self.params.command(&python, &overrides);
        let mut job = serde_json::json!({
            "verl": VERL_VERSION,
            "job_dir": job_dir.display().to_string(),
            "command": command,
            "serve_url": self.params.serve_url,
            "launched": self.params.launch,
        });
        if self.params.launch {
            launch(&command, &job_dir, &self.params.serve_url, &mut job).map_err(job_err)?;
        } else {
            ctx.warn(format!(
                "VERL job written, not launched (launch = false): cd {} && {}",
                job_dir.display(),
                shell_words(&command)
            ));
        }
        for (name, from) in [
            ("rl_train", scratch.join("rl_train.parquet")),
            ("rl_test", scratch.join("rl_test.parquet")),
        ] {
            std::fs::rename(&from, ctx.output_path(name)).map_err(io(&from))?;
        }
        let _ = std::fs::remove_dir_all(&scratch);
        let w = |name: &str, bytes: &[u8]| -> Result<(), StageError> {
            let p = ctx.output_path(name);
            std::fs::write(&p, bytes).map_err(io(&p))
        };
        w("overrides", overrides_text.as_bytes())?;
        w("config", &config)?;
        w(
            "job",
            &serde_json::to_vec_pretty(&job).expect("job json serializes"),
        )
    }
}
