//! What `rl-train`, `eval`, `collab-data` and `optimize` share on the stage side: the RL
//! parameters ([`cudarl_rl::params::Params`]) with what a stage adds to them ([`StageParams`]:
//! external inputs, the reward config, the environment, the trainer), the harness they start,
//! the task set they read, and the typed rows of their `turns` tables.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cudarl_core::{ResolveContext, StageContext, StageError};
use cudarl_cuda::Nvcc;
use cudarl_protocol::{Ptx, RlServe};
use cudarl_rl::harness::Harness;
use cudarl_rl::reward::RewardConfig;
use cudarl_rl::tasks::TaskSet;
use cudarl_rl::trainer::TrainerClient;

use crate::common::rl_err;

pub use cudarl_rl::params::{DEFAULT_CHECKPOINT_EVERY, Mode, Params};

/// What the stages add to [`Params`]: their external inputs, the reward config read from the
/// store, the environment their keys depend on, and the trainer started on their checkpoints.
pub(crate) trait StageParams {
    /// The external inputs of the stages these parameters drive: the agents' checkpoint
    /// inputs `agents` (the `model` directory, when set) and `reward`
    /// (`configs/reward/<reward>.toml`).
    fn resolve_external(
        &self,
        input: &str,
        agents: [&str; 2],
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError>;

    /// The agents' checkpoint inputs: `(name, node, output)` for the generator and the
    /// optimizer, or the `model` directory in their place.
    fn agent_inputs(&self, agents: [(&str, &str, &str); 2]) -> [cudarl_core::InputDecl; 2];

    /// The reward config (a bad one is named, exit 2).
    fn reward_config(&self, ctx: &StageContext<'_>) -> Result<RewardConfig, StageError>;

    /// What the results of `rl-train` and `eval` depend on beyond their inputs: nvcc, the
    /// models' device, and whether a GPU runs the tests.
    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError>;

    /// Materializes the generator and optimizer checkpoint tables `gen_input` and `opt_input`
    /// under `dir` and starts the RL trainer on them, to train, or with `sample_only` to
    /// sample only ([`RlServe::sample_only`]).
    fn start_trainer(
        &self,
        ctx: &StageContext<'_>,
        inputs: (&str, &str),
        dir: &Path,
        ptx_and_sample_only: (Option<Ptx>, bool),
    ) -> Result<TrainerClient, StageError>;
}

impl StageParams for Params {
    fn resolve_external(
        &self,
        input: &str,
        agents: [&str; 2],
        ctx: &ResolveContext,
    ) -> Result<cudarl_core::ExternalFiles, StageError> {
        match &self.model {
            Some(m) if agents.contains(&input) => crate::common::checkpoint_files(&ctx.root, m),
            _ => crate::common::single_file(&ctx.root, &self.reward_rel(), "reward config"),
        }
    }

    fn agent_inputs(&self, agents: [(&str, &str, &str); 2]) -> [cudarl_core::InputDecl; 2] {
        agents.map(|(name, node, output)| {
            crate::common::checkpoint_input(name, (node, output), self.model.as_deref())
        })
    }

    fn reward_config(&self, ctx: &StageContext<'_>) -> Result<RewardConfig, StageError> {
        let rel = self.reward_rel();
        RewardConfig::load(&ctx.input_files("reward")?.files[0].1, &rel).map_err(rl_err)
    }

    fn environment(&self, ctx: &ResolveContext) -> Result<BTreeMap<String, String>, StageError> {
        let nvcc = Nvcc::discover(&ctx.root).map_err(|e| StageError::Failed(e.to_string()))?;
        Ok(BTreeMap::from([
            ("nvcc".to_string(), nvcc.version),
            (
                "device".to_string(),
                crate::common::resolve_device(self.device).to_string(),
            ),
            ("mode".to_string(), env_mode(self.mode).to_string()),
        ]))
    }

    fn start_trainer(
        &self,
        ctx: &StageContext<'_>,
        (gen_input, opt_input): (&str, &str),
        dir: &Path,
        (ptx, sample_only): (Option<Ptx>, bool),
    ) -> Result<TrainerClient, StageError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StageError::Failed(format!("{}: {e}", dir.display())))?;
        let g = crate::common::checkpoint_dir(ctx, gen_input, &dir.join("gen"))?;
        let o = crate::common::checkpoint_dir(ctx, opt_input, &dir.join("opt"))?;
        let job = RlServe {
            sample_only,
            ..self.serve_job(&g, &o, ptx)
        };
        TrainerClient::start(&job, dir, self.sampling()).map_err(rl_err)
    }
}

/// The harness for `mode`: full on a GPU unless [`Mode::Compile`].
pub(crate) fn harness(
    ctx: &StageContext<'_>,
    p: &Params,
    naive: BTreeMap<String, String>,
) -> Result<Harness, StageError> {
    let compiler = crate::common::store_compiler(ctx)?;
    let gpu = p.mode != Mode::Compile && cudarl_cuda::gpu::probe().is_some();
    let mut h = Harness::new(compiler, gpu, Duration::from_secs(p.timeout_s), naive)
        .map_err(StageError::failed)?;
    h.profile = p.profile;
    if let Some(ms) = p.timing_budget_ms {
        h.timing.budget_ms = ms;
    }
    Ok(h)
}

/// The `mode` environment entry: `full` when a GPU will run the tests.
pub(crate) fn env_mode(mode: Mode) -> &'static str {
    if mode != Mode::Compile && cudarl_cuda::gpu::probe().is_some() {
        "full"
    } else {
        "compile-only"
    }
}

/// The inputs [`Params::reward_config`] and [`load_tasks`] read: `reward` (external),
/// `tasks` and `kernels` (synth-tasks), `data` (sft-data's `sft_generator`), `splits`
/// (the `splits` table); `rl-train`, `eval` and `collab-data` declare them first.
pub(crate) fn task_inputs() -> Vec<cudarl_core::InputDecl> {
    use cudarl_core::InputDecl;
    vec![
        InputDecl::external("reward"),
        InputDecl::node("tasks", "synth-tasks", "tasks"),
        InputDecl::node("kernels", "synth-tasks", "task_kernels"),
        InputDecl::node("data", "sft-data", "sft_generator"),
        InputDecl::node("splits", "splits", "splits"),
    ]
}

/// The task set of the inputs `tasks`, `kernels` (synth-tasks) and `data` (sft-data's
/// `sft_generator`), each family in the split the `splits` table gives it
/// ([`TaskSet::follow_splits`]).
///
/// # Errors
/// A table cannot be read, or a family has no row in `splits` (file and field named).
pub(crate) fn load_tasks(ctx: &StageContext<'_>) -> Result<TaskSet, StageError> {
    let ts = TaskSet::load(
        ctx.input_path("tasks")?,
        ctx.input_path("kernels")?,
        ctx.input_path("data")?,
    )
    .map_err(rl_err)?;
    let splits = cudarl_tables::splits::SplitMap::read(ctx.input_path("splits")?, "splits")
        .map_err(crate::common::data_err)?;
    ts.follow_splits(&splits).map_err(crate::common::data_err)
}
