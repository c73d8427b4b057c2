//! A VERL job for the RL curriculum (`rl-train` with `backend = "verl"`; docs/architecture.md,
//! "Scale-out"): its params, the Hydra overrides of `verl.trainer.main_ppo` they map to, a
//! content-addressed job directory (VERL's RL Parquet, the agent loop, `overrides.txt`), the
//! check of the overrides against the installed verl's own `ppo_trainer` config, and the launch
//! (`python -m verl.trainer.main_ppo` here, or `ray job submit` to a remote cluster).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// The verl version the agent loop and the generated overrides are written against.
pub const VERL_VERSION: &str = "0.9.1";

/// The agent loop's files under `python/` (the stage's `agent` external input).
pub const AGENT_FILES: [&str; 4] = [
    "cudarl_verl/__init__.py",
    "cudarl_verl/agent_loop.py",
    "cudarl_verl/agent_loop.yaml",
    "cudarl_verl/reward.py",
];

/// Why a VERL job could not be written, checked or run.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// VERL's config rejects the overrides (unknown key, wrong type); the message holds the
    /// last lines of its error.
    #[error("{0}")]
    Rejected(String),
    /// A file, Python, the agent loop's import or the job itself failed (named).
    #[error("{0}")]
    Failed(String),
}

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
    format!("http://{}", crate::SERVE_BIND)
}

/// Params of `rl-train` with `backend = "verl"`. The names shared with the tch backend mean the
/// same thing; each maps to one VERL key (see [`Params::overrides`]).
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
    #[serde(default = "crate::params::d_tasks")]
    pub tasks_per_step: usize,
    /// Episodes per task: the GRPO group (`actor_rollout_ref.rollout.n`).
    #[serde(default = "crate::params::d_group")]
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
    #[serde(default = "crate::params::d_one")]
    pub temperature: f64,
    /// Actor learning rate (`actor_rollout_ref.actor.optim.lr`).
    #[serde(default = "d_lr")]
    pub lr: f64,
    /// KL coefficient to the reference policy (`actor_rollout_ref.actor.kl_loss_coef`, with
    /// `use_kl_loss`, as GRPO in DeepSeekMath, arXiv:2402.03300).
    #[serde(default = "crate::params::d_kl")]
    pub kl_coef: f64,
    /// PPO clip ratio (`actor_rollout_ref.actor.clip_ratio`).
    #[serde(default = "crate::params::d_clip")]
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

impl Params {
    /// Checks the backend and the sizes that must be at least 1.
    ///
    /// # Errors
    /// A backend other than `verl`, or a zero size (named).
    pub fn check(&self) -> Result<(), String> {
        if self.backend != "verl" {
            return Err(format!("backend `{}`: expected `verl`", self.backend));
        }
        for (name, v) in [
            ("steps", self.steps),
            ("tasks_per_step", self.tasks_per_step),
            ("group_size", self.group_size),
            ("max_turns", self.max_turns),
            ("gpus_per_node", self.gpus_per_node),
            ("nodes", self.nodes),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        Ok(())
    }

    /// The Hydra overrides of `verl.trainer.main_ppo`, paths relative to the job directory
    /// (the working directory of the job, here or on the cluster).
    pub fn overrides(&self) -> Vec<String> {
        let p = self;
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
        if let Some(a) = self.ray_address.as_deref().filter(|a| !is_dashboard(a)) {
            v.push(format!("+ray_kwargs.ray_init.address={a}"));
        }
        v.extend(self.overrides.iter().cloned());
        v
    }

    /// The launch command (program, arguments), run in the job directory.
    pub fn command(&self, python: &Path, overrides: &[String]) -> Vec<String> {
        let mut c: Vec<String> = match self.ray_address.as_deref() {
            Some(a) if is_dashboard(a) => {
                let env = serde_json::json!({"env_vars": {
                    "CUDARL_SERVE_URL": self.serve_url, "PYTHONPATH": "."}});
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

fn io(p: &Path) -> impl Fn(std::io::Error) -> JobError + '_ {
    move |e| JobError::Failed(format!("{}: {e}", p.display()))
}

/// Writes the job directory, content-addressed under the store (`verl-jobs/<16 hex digits of
/// a BLAKE3 keyed hash of every file>`), so a re-run reuses it and two configurations never
/// share one: VERL's RL Parquet from `scratch`, the agent's files and `overrides.txt`.
///
/// # Errors
/// A file cannot be read or written (named).
pub fn write_job_dir(
    store_root: &Path,
    scratch: &Path,
    agent: &[(String, PathBuf)],
    overrides_text: &str,
) -> Result<PathBuf, JobError> {
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
/// [`JobError::Rejected`] when VERL rejects the overrides; [`JobError::Failed`]
/// when Python does not start or the agent loop does not import.
pub fn check_with_verl(
    python: &Path,
    job_dir: &Path,
    overrides: &[String],
) -> Result<Vec<u8>, JobError> {
    let py = |args: &[String]| -> Result<std::process::Output, JobError> {
        Command::new(python)
            .args(args)
            .current_dir(job_dir)
            .env("PYTHONPATH", job_dir)
            .env("HYDRA_FULL_ERROR", "0")
            .output()
            .map_err(|e| JobError::Failed(format!("{}: {e}", python.display())))
    };
    // Compose against verl's own config: unknown keys and type errors fail here.
    let mut args: Vec<String> = ["-m", "verl.trainer.main_ppo", "--cfg", "job"]
        .map(String::from)
        .to_vec();
    args.extend(overrides.iter().cloned());
    let o = py(&args)?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        return Err(JobError::Rejected(format!(
            "VERL's config (verl.trainer.main_ppo, ppo_trainer) rejects the overrides:\n{}",
            tail(&err, 6)
        )));
    }
    let config = o.stdout;
    // The agent loop must import against this verl (the cluster runs the same files).
    let o = py(&[
        "-c".into(),
        "import cudarl_verl.agent_loop as a; print(a.AGENT_NAME)".into(),
    ])?;
    if !o.status.success() {
        return Err(JobError::Failed(format!(
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
/// [`JobError::Failed`] when the job does not start or fails (with its log's last lines).
pub fn launch(
    command: &[String],
    job_dir: &Path,
    serve_url: &str,
    job: &mut serde_json::Value,
) -> Result<(), JobError> {
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
        .map_err(|e| JobError::Failed(format!("{}: {e}", command[0])))?;
    job["exit_code"] = serde_json::json!(status.code());
    job["log"] = serde_json::json!(log.display().to_string());
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        return Err(JobError::Failed(format!(
            "the VERL job failed ({status}); log {}:\n{}",
            log.display(),
            tail(&text, 10)
        )));
    }
    Ok(())
}

/// A command line for humans (arguments with shell metacharacters single-quoted).
pub fn shell_words(c: &[String]) -> String {
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
