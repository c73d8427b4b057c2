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
use std::path::{Path, PathBuf};
use std::process::Command;

use cudarl_core::{
    ExternalFiles, InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext,
    StageError,
};
use serde::{Deserialize, Serialize};

use crate::common::{params_json, rl_err};

/// The verl version the agent loop and the generated overrides are written against.
pub const VERL_VERSION: &str = "0.9.1";

/// The agent loop's files under `python/` (the `agent` external input).
const AGENT_FILES: [&str; 4] = [
    "cudarl_verl/__init__.py",
    "cudarl_verl/agent_loop.py",
    "cudarl_verl/agent_loop.yaml",
    "cudarl_verl/reward.py",
];

fn d_backend() -> String {
    "verl".into()
}
fn d_model() -> String {
    "Qwen/Qwen2.5-Coder-7B-Instruct".into()
}
fn d_steps() -> usize {
    4
}
fn d_turns() -> usize {
    3
}
fn d_tokens() -> usize {
    768
}
fn d_prompt_tokens() -> usize {
    2048
}
fn d_lr() -> f64 {
    1e-6
}
fn d_gpus() -> usize {
    8
}
fn d_nodes() -> usize {
    1
}
fn d_rollout() -> String {
    "vllm".into()
}
fn d_serve() -> String {
    format!("http://{}", cudarl_rl::SERVE_BIND)
}

/// Params of `rl-train` with `backend = "verl"`. The names shared with the tch backend mean the
/// same thing; each maps to one VERL key (see [`VerlLaunch::overrides`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// `"verl"`.
    #[serde(default = "d_backend")]
    pub backend: String,
    /// Hugging Face model id or path on the cluster (`actor_rollout_ref.model.path`).
    #[serde(default = "d_model")]
    pub model: String,
    /// Optimizer steps (`trainer.total_training_steps`).
    #[serde(default = "d_steps")]
    pub steps: usize,
    /// Tasks per step (`data.train_batch_size`).
    #[serde(default = "cudarl_rl::params::d_tasks")]
    pub tasks_per_step: usize,
    /// Episodes per task: the GRPO group (`actor_rollout_ref.rollout.n`).
    #[serde(default = "cudarl_rl::params::d_group")]
    pub group_size: usize,
    /// Policy turns per episode (`extra_info.max_turns` and
    /// `actor_rollout_ref.rollout.multi_turn.max_assistant_turns`).
    #[serde(default = "d_turns")]
    pub max_turns: usize,
    /// New tokens per turn; the response budget is `max_turns` of them plus 512 tokens of
    /// tester feedback per revision (`data.max_response_length`).
    #[serde(default = "d_tokens")]
    pub max_new_tokens: usize,
    /// Prompt budget in tokens (`data.max_prompt_length`).
    #[serde(default = "d_prompt_tokens")]
    pub max_prompt_tokens: usize,
    /// Sampling temperature (`actor_rollout_ref.rollout.temperature`).
    #[serde(default = "cudarl_rl::params::d_one")]
    pub temperature: f64,
    /// Actor learning rate (`actor_rollout_ref.actor.optim.lr`).
    #[serde(default = "d_lr")]
    pub lr: f64,
    /// KL coefficient to the reference policy (`actor_rollout_ref.actor.kl_loss_coef`, with
    /// `use_kl_loss`, as GRPO in DeepSeekMath, arXiv:2402.03300).
    #[serde(default = "cudarl_rl::params::d_kl")]
    pub kl_coef: f64,
    /// PPO clip ratio (`actor_rollout_ref.actor.clip_ratio`).
    #[serde(default = "cudarl_rl::params::d_clip")]
    pub clip: f64,
    /// GPUs per node (`trainer.n_gpus_per_node`).
    #[serde(default = "d_gpus")]
    pub gpus_per_node: usize,
    /// Nodes (`trainer.nnodes`).
    #[serde(default = "d_nodes")]
    pub nodes: usize,
    /// Rollout engine (`actor_rollout_ref.rollout.name`: vllm or sglang).
    #[serde(default = "d_rollout")]
    pub rollout: String,
    /// Ray: none (main_ppo starts Ray here), `ray://host:10001` or `host:6379` (joined from
    /// this machine), or `http://head:8265` (the job is submitted with `ray job submit`).
    #[serde(default)]
    pub ray_address: Option<String>,
    /// The kernel-evaluation service the rollouts call (`CUDARL_SERVE_URL` of the job).
    #[serde(default = "d_serve")]
    pub serve_url: String,
    /// Start the job (false: write, compose and check only).
    #[serde(default)]
    pub launch: bool,
    /// More Hydra overrides, appended last (they win).
    #[serde(default)]
    pub overrides: Vec<String>,
}

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
        if params.backend != "verl" {
            return Err(format!("backend `{}`: expected `verl`", params.backend).into());
        }
        for (name, v) in [
            ("steps", params.steps),
            ("tasks_per_step", params.tasks_per_step),
            ("group_size", params.group_size),
            ("max_turns", params.max_turns),
            ("gpus_per_node", params.gpus_per_node),
            ("nodes", params.nodes),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1").into());
            }
        }
        Ok(VerlLaunch { params })
    }

    /// The Hydra overrides of `verl.trainer.main_ppo`, paths relative to the job directory
    /// (the working directory of the job, here or on the cluster).
    pub fn overrides(&self) -> Vec<String> {
        let p = &self.params;
        let response = p.max_new_tokens * p.max_turns + 512 * (p.max_turns - 1);
        let mut v: Vec<String> = [
            ("algorithm.adv_estimator", "grpo".to_string()),
            ("data.train_files", "rl_train.parquet".into()),
            ("data.val_files", "rl_test.parquet".into()),
            ("data.prompt_key", "prompt".into()),
            ("data.train_batch_size", p.tasks_per_step.to_string()),
            ("data.max_prompt_length", p.max_prompt_tokens.to_string()),
            ("data.max_response_length", response.to_string()),
            ("data.return_raw_chat", "true".into()),
            ("actor_rollout_ref.model.path", p.model.clone()),
            ("actor_rollout_ref.actor.optim.lr", format!("{:e}", p.lr)),
            (
                "actor_rollout_ref.actor.ppo_mini_batch_size",
                p.tasks_per_step.to_string(),
            ),
            ("actor_rollout_ref.actor.use_kl_loss", "true".into()),
            (
                "actor_rollout_ref.actor.kl_loss_coef",
                p.kl_coef.to_string(),
            ),
            ("actor_rollout_ref.actor.clip_ratio", p.clip.to_string()),
            ("actor_rollout_ref.rollout.name", p.rollout.clone()),
            ("actor_rollout_ref.rollout.n", p.group_size.to_string()),
            (
                "actor_rollout_ref.rollout.temperature",
                p.temperature.to_string(),
            ),
            (
                "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
                p.max_turns.to_string(),
            ),
            (
                "actor_rollout_ref.rollout.agent.agent_loop_config_path",
                "cudarl_verl/agent_loop.yaml".into(),
            ),
            (
                "actor_rollout_ref.rollout.agent.default_agent_loop",
                "cudarl_kernel_agent".into(),
            ),
            (
                "reward.custom_reward_function.path",
                "cudarl_verl/reward.py".into(),
            ),
            ("reward.custom_reward_function.name", "compute_score".into()),
            ("trainer.total_training_steps", p.steps.to_string()),
            ("trainer.n_gpus_per_node", p.gpus_per_node.to_string()),
            ("trainer.nnodes", p.nodes.to_string()),
            ("trainer.project_name", "cudarl-pipe".into()),
            ("trainer.experiment_name", "rl-train-verl".into()),
            ("trainer.logger", "[console]".into()),
        ]
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
        if let Some(a) = self
            .params
            .ray_address
            .as_deref()
            .filter(|a| !is_dashboard(a))
        {
            v.push(format!("+ray_kwargs.ray_init.address={a}"));
        }
        v.extend(self.params.overrides.iter().cloned());
        v
    }

    /// The launch command (program, arguments), run in the job directory.
    fn command(&self, python: &Path, overrides: &[String]) -> Vec<String> {
        let mut c: Vec<String> = match self.params.ray_address.as_deref() {
            Some(a) if is_dashboard(a) => {
                let env = serde_json::json!({"env_vars": {
                    "CUDARL_SERVE_URL": self.params.serve_url, "PYTHONPATH": "."}});
                [
                    "ray",
                    "job",
                    "submit",
                    "--address",
                    a,
                    "--working-dir",
                    ".",
                    "--runtime-env-json",
                    &env.to_string(),
                    "--",
                    "python",
                ]
                .map(String::from)
                .to_vec()
            }
            _ => vec![python.display().to_string()],
        };
        c.extend(["-m".into(), "verl.trainer.main_ppo".into()]);
        c.extend(overrides.iter().cloned());
        c
    }
}

/// A Ray dashboard (job submission) address rather than a cluster address.
fn is_dashboard(a: &str) -> bool {
    a.starts_with("http://") || a.starts_with("https://")
}

/// The last `n` lines of `s`.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn io(p: &Path) -> impl Fn(std::io::Error) -> StageError + '_ {
    move |e| StageError::Failed(format!("{}: {e}", p.display()))
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
        let overrides = self.overrides();
        let overrides_text = overrides.join("\n") + "\n";
        let agent = ctx.input_files("agent")?.clone();
        let job_dir = write_job_dir(ctx.store().root(), &scratch, &agent.files, &overrides_text)?;
        let python = cudarl_cuda::pyworker::python(ctx.root());
        let config = check_with_verl(&python, &job_dir, &overrides)?;
        let command = self.command(&python, &overrides);
        let mut job = serde_json::json!({
            "verl": VERL_VERSION,
            "job_dir": job_dir.display().to_string(),
            "command": command,
            "serve_url": self.params.serve_url,
            "launched": self.params.launch,
        });
        if self.params.launch {
            launch(&command, &job_dir, &self.params.serve_url, &mut job)?;
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

/// Writes the job directory, content-addressed under the store (`verl-jobs/<16 hex digits of
/// a BLAKE3 keyed hash of every file>`), so a re-run reuses it and two configurations never
/// share one: VERL's RL Parquet from `scratch`, the agent's files and `overrides.txt`.
///
/// # Errors
/// A file cannot be read or written (named).
fn write_job_dir(
    store_root: &Path,
    scratch: &Path,
    agent: &[(String, PathBuf)],
    overrides_text: &str,
) -> Result<PathBuf, StageError> {
    // The job directory: content-addressed under the store, so a re-run reuses it and two
    // configurations never share one.
    let mut h = blake3::Hasher::new_derive_key("cudarl-pipe verl job v1");
    let mut parts: Vec<(String, Vec<u8>)> = Vec::new();
    for split in ["train", "test"] {
        let p = scratch.join(format!("rl_{split}.parquet"));
        parts.push((
            format!("rl_{split}.parquet"),
            std::fs::read(&p).map_err(io(&p))?,
        ));
    }
    for (name, p) in agent {
        parts.push((name.clone(), std::fs::read(p).map_err(io(p))?));
    }
    parts.push(("overrides.txt".into(), overrides_text.as_bytes().to_vec()));
    for (name, bytes) in &parts {
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    let job_dir: PathBuf = store_root
        .join("verl-jobs")
        .join(&h.finalize().to_hex()[..16]);
    for (name, bytes) in &parts {
        let p = job_dir.join(name);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).map_err(io(d))?;
        }
        std::fs::write(&p, bytes).map_err(io(&p))?;
    }
    Ok(job_dir)
}

/// Composes the overrides against VERL's own config (`python -m verl.trainer.main_ppo --cfg
/// job`: unknown keys and type errors fail here) and imports the agent loop against this VERL
/// (the cluster runs the same files); returns the composed config (YAML bytes).
///
/// # Errors
/// [`StageError::Config`] naming `overrides` when VERL rejects them; [`StageError::Failed`]
/// when Python does not start or the agent loop does not import.
fn check_with_verl(
    python: &Path,
    job_dir: &Path,
    overrides: &[String],
) -> Result<Vec<u8>, StageError> {
    let py = |args: &[String]| -> Result<std::process::Output, StageError> {
        Command::new(python)
            .args(args)
            .current_dir(job_dir)
            .env("PYTHONPATH", job_dir)
            .env("HYDRA_FULL_ERROR", "0")
            .output()
            .map_err(|e| StageError::Failed(format!("{}: {e}", python.display())))
    };
    // Compose against verl's own config: unknown keys and type errors fail here.
    let mut args: Vec<String> = ["-m", "verl.trainer.main_ppo", "--cfg", "job"]
        .map(String::from)
        .to_vec();
    args.extend(overrides.iter().cloned());
    let o = py(&args)?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        return Err(StageError::Config {
            file: "rl-train".into(),
            field: Some("overrides".into()),
            message: format!(
                "VERL's config (verl.trainer.main_ppo, ppo_trainer) rejects the overrides:\n{}",
                tail(&err, 6)
            ),
        });
    }
    let config = o.stdout;
    // The agent loop must import against this verl (the cluster runs the same files).
    let o = py(&[
        "-c".into(),
        "import cudarl_verl.agent_loop as a; print(a.AGENT_NAME)".into(),
    ])?;
    if !o.status.success() {
        return Err(StageError::Failed(format!(
            "the VERL agent loop does not import: {}",
            tail(&String::from_utf8_lossy(&o.stderr), 6)
        )));
    }
    Ok(config)
}

/// Runs the VERL job (`command`, in `job_dir`, its log in `job.log`) and records its exit code
/// and log in `job`.
///
/// # Errors
/// [`StageError::Failed`] when the job does not start or fails (with its log's last lines).
fn launch(
    command: &[String],
    job_dir: &Path,
    serve_url: &str,
    job: &mut serde_json::Value,
) -> Result<(), StageError> {
    let log = job_dir.join("job.log");
    let f = std::fs::File::create(&log).map_err(io(&log))?;
    let f2 = f.try_clone().map_err(io(&log))?;
    let status = Command::new(&command[0])
        .args(&command[1..])
        .current_dir(job_dir)
        .env("PYTHONPATH", job_dir)
        .env("CUDARL_SERVE_URL", serve_url)
        .stdout(f)
        .stderr(f2)
        .status()
        .map_err(|e| StageError::Failed(format!("{}: {e}", command[0])))?;
    job["exit_code"] = serde_json::json!(status.code());
    job["log"] = serde_json::json!(log.display().to_string());
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        return Err(StageError::Failed(format!(
            "the VERL job failed ({status}); log {}:\n{}",
            log.display(),
            tail(&text, 10)
        )));
    }
    Ok(())
}

/// A command line for humans (arguments with shell metacharacters single-quoted).
fn shell_words(c: &[String]) -> String {
    c.iter()
        .map(|a| {
            if a.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_./=:+,@".contains(ch))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
