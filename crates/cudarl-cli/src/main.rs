//! `cudarl-pipe`: build the data, curriculum and models for CUDA-kernel RL as a DAG of
//! content-hashed, cached stages.
//!
//! Exit codes: 0 success, 1 a stage failed, 2 bad usage or bad input (docs/architecture.md, "The
//! command line").

mod cmd;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Command-line interface.
#[derive(Debug, Parser)]
#[command(
    name = "cudarl-pipe",
    version,
    about = "Data, curriculum and training pipeline for teaching LLMs to write fast, correct CUDA kernels",
    long_about = None,
    after_help = "Exit codes: 0 success, 1 a stage failed, 2 bad usage or bad input."
)]
pub struct Cli {
    /// Project root (default: the nearest ancestor of the current directory with a `pipelines/` folder).
    #[arg(long, global = true, env = "CUDARL_ROOT", value_name = "DIR")]
    root: Option<PathBuf>,
    /// Pipeline file (default: <root>/pipelines/default.toml).
    #[arg(long, global = true, value_name = "FILE")]
    pipeline: Option<PathBuf>,
    /// Store directory (default: <root>/artifacts).
    #[arg(long, global = true, env = "CUDARL_STORE", value_name = "DIR")]
    store: Option<PathBuf>,
    /// Cache shared by several machines for row-level results and shard records: a directory
    /// (local or network-mounted) or file:///path; s3://bucket/prefix and gs://bucket/prefix in
    /// a build with `--features cudarl-store/cloud`.
    #[arg(long, global = true, env = "CUDARL_SHARED_CACHE", value_name = "URL")]
    shared_cache: Option<String>,
    /// Lock file (default: cudarl.lock for the default pipeline, cudarl.<name>.lock otherwise,
    /// in <root> for the project's own store <root>/artifacts, inside the store for any other).
    #[arg(long, global = true, value_name = "FILE")]
    lock: Option<PathBuf>,
    /// Named overrides of the pipeline file (`[profiles.NAME]`), applied before `--set`; `none`:
    /// no profile. Default: `cpu` where the file defines it and no GPU is found (said on
    /// stderr). Verbs that read the store (status, explain, show, export, check, serve, gc, dag)
    /// given neither --profile nor --set use the settings of the last `run` that built the
    /// pipeline's default targets, or of the run named by --run.
    #[arg(long, global = true, env = "CUDARL_PROFILE", value_name = "NAME")]
    profile: Option<String>,
    /// A remembered run: on `run`, the name its settings are remembered under (default: its
    /// targets joined by `+`, e.g. `rl-train+eval`); on the verbs that read the store, the run
    /// whose settings they use (default: the last run that built the pipeline's default targets).
    /// `--run` wins over a profile from `CUDARL_PROFILE` on those verbs.
    #[arg(long = "run", global = true, value_name = "NAME")]
    run_name: Option<String>,
    /// Whether `profile` came from `CUDARL_PROFILE` rather than `--profile`.
    #[arg(skip)]
    profile_from_env: bool,
    /// Override a stage param: NODE.KEY=VALUE (VALUE is TOML; repeatable).
    #[arg(long = "set", global = true, value_name = "NODE.KEY=VALUE")]
    sets: Vec<String>,
    /// More log output (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

/// Graph output formats.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DagFmt {
    /// Plain text.
    Text,
    /// Graphviz dot.
    Dot,
    /// Mermaid flowchart.
    Mermaid,
    /// JSON.
    Json,
}

/// Export formats.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ExportFmt {
    /// The tables as Parquet, with a JSON sidecar describing them.
    Parquet,
    /// The RL curriculum in VERL's layouts (node `curriculum`, `sft-data` or `rl-train`):
    /// `rl_train.parquet`/`rl_test.parquet` (prompt, data_source, reward_model, extra_info,
    /// agent_name) and `sft_train.parquet`/`sft_val.parquet` (messages), under `<to>/verl/`.
    Verl,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build TARGETs (default: the pipeline's default targets, `[pipeline] targets`, else every
    /// node) and everything they need; cached nodes are reused.
    Run {
        /// Nodes to build.
        targets: Vec<String>,
        /// Parallel jobs (independent nodes and in-stage work); default: one per core.
        #[arg(short = 'j', long, value_name = "N")]
        jobs: Option<usize>,
        /// Show what would run and why, without running.
        #[arg(long)]
        dry_run: bool,
        /// Re-run NODE even if cached (repeatable).
        #[arg(long, value_name = "NODE")]
        force: Vec<String>,
        /// Compute only shard i of N of the targets' rows (row-wise stages: validate) into the
        /// row memo (use --shared-cache to pool N machines); `--merge` then assembles the table.
        #[arg(long, value_name = "i/N", value_parser = cudarl_core::RunPart::parse_shard)]
        shard: Option<cudarl_core::RunPart>,
        /// Assemble the targets' outputs from the rows the shards memoized; fails, naming
        /// them, if any row is missing (nothing is computed).
        #[arg(long, conflicts_with = "shard")]
        merge: bool,
        /// One JSON object per node on stdout (JSON Lines; docs/json.md).
        #[arg(long)]
        json: bool,
    },
    /// FRESH / STALE / MISSING for each node, with a one-line cause.
    Status {
        /// Nodes to report (default: all).
        targets: Vec<String>,
        /// One JSON object per node on stdout (JSON Lines; docs/json.md).
        #[arg(long)]
        json: bool,
        /// Exit 1 when a node the targets need is not fresh (given no target: the pipeline's
        /// default targets), as `git diff --exit-code`; else 0.
        #[arg(long)]
        exit_code: bool,
        /// Re-hash the stored files of every fresh node reported (its outputs, and the files
        /// a table of them names by digest, e.g. a checkpoint's) and name any whose bytes no
        /// longer match their hash (exit 1 then).
        #[arg(long)]
        verify: bool,
    },
    /// Why NODE is stale: one line per cause (params, inputs, code version, environment).
    Explain {
        /// The node.
        node: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Print the pipeline's DAG.
    Dag {
        /// Output format.
        #[arg(long, value_enum, default_value_t = DagFmt::Text)]
        format: DagFmt,
    },
    /// Print the schema and first rows of a node's table output.
    Show {
        /// The node.
        node: String,
        /// Which output (default: the first).
        #[arg(long)]
        output: Option<String>,
        /// Rows to print.
        #[arg(long, default_value_t = 10)]
        head: usize,
        /// Rows as JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Copy a node's outputs out of the store (builds the node first if needed).
    Export {
        /// The node.
        node: String,
        /// Destination directory.
        #[arg(long, value_name = "DIR")]
        to: PathBuf,
        /// Format.
        #[arg(long, value_enum, default_value_t = ExportFmt::Parquet)]
        format: ExportFmt,
        /// Only this output.
        #[arg(long)]
        output: Option<String>,
        /// Build the node (and what it needs) first when it is not fresh; without it, a node
        /// that is not fresh is named with the reason and nothing is written (exit 2).
        #[arg(long)]
        build: bool,
    },
    /// Delete manifests and blobs no longer needed: keeps what the lock file names and the newest
    /// N manifests of each node.
    Gc {
        /// Manifests to keep per node besides the lock file's.
        #[arg(long, default_value_t = 1, value_name = "N")]
        keep_last: usize,
        /// Say what would be deleted (counts, bytes, the manifests as NODE/KEY) and delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Compile, statically check, test and time one kernel for a task.
    Check {
        /// Task id: any task `serve` knows: a hand-written task (a folder of `datasets/tasks/`,
        /// e.g. `vector_add`), a generated family of `synth-tasks`, or a KernelBench problem
        /// (`kb/L1/19_ReLU`).
        #[arg(long)]
        task: String,
        /// The kernel source: native ABI (`extern "C" void launch(...)`) for synthetic tasks;
        /// for KernelBench problems a `ModelNew` Python file or a SakanaAI-style `.cu` extension
        /// (`PYBIND11_MODULE` + `forward`). Repeat it to judge several candidates in turn,
        /// with one worker (`--json` then prints a verdict per line). `-` reads standard input.
        #[arg(long, value_name = "FILE", required_unless_present = "signature")]
        source: Vec<PathBuf>,
        /// Print the launcher a candidate of the task must define and the task's sizes (a
        /// hand-written task's train shapes; a KernelBench problem's own sizes, from `kb-specs`)
        /// instead of checking a source.
        #[arg(long, conflicts_with = "source")]
        signature: bool,
        /// The candidate's ABI (default: detected from the source).
        #[arg(long, value_parser = ["native", "torch"])]
        abi: Option<String>,
        /// `auto` runs on the GPU when one is present, else compile-only.
        #[arg(long, value_enum, default_value_t = cmd::check::Mode::Auto)]
        mode: cmd::check::Mode,
        /// Target architecture for nvcc (default: the GPU's, or sm_90 without a GPU).
        #[arg(long)]
        arch: Option<String>,
        /// Skip timing.
        #[arg(long)]
        no_bench: bool,
        /// After the timing of a correct native candidate, profile one launch with Nsight
        /// Compute (`ncu`): achieved occupancy, DRAM throughput and warp execution efficiency in
        /// the verdict's `profile` (its status says `absent` without `ncu`).
        #[arg(long, conflicts_with = "no_bench")]
        ncu: bool,
        /// Wall-clock limit for running the candidate, seconds.
        #[arg(long, default_value_t = 20)]
        timeout: u64,
        /// The verdict as one line of JSON on stdout, one per `--source` (docs/json.md).
        #[arg(long)]
        json: bool,
        /// For one native candidate of a KernelBench problem: also write it as a KernelBench
        /// `ModelNew` file (the kernel built with `load_inline`, sizes read from the inputs'
        /// shapes, parameters under the reference's state-dict names) to FILE.
        #[arg(long, value_name = "FILE")]
        model_new: Option<PathBuf>,
        /// Judge `ModelNew` files without the allow-list that screens them before any of their
        /// code runs (`[python] allowlist` of configs/harness/static_rules.toml), to test what
        /// stands behind it: the interpreter sandbox, the runner and the kernels-ran check.
        #[arg(long)]
        without_allowlist: bool,
    },
    /// Optimize one problem with the trained agents: PROBLEM is a KernelBench-format PyTorch
    /// file (a `Model` with `get_inputs`) or a KernelBench problem id (`kb/L1/19_ReLU`). Its
    /// native launcher and tests are derived as for KernelBench problems (nodes
    /// `optimize-problem`, `optimize-specs`, `optimize-tests`), then the RL generator and
    /// optimizer write and revise kernels with the tester (node `optimize`) and the best verified
    /// one is written to DIR/<name>/ (`<name>.cu`, `<name>_model_new.py`, `<name>_verdict.json`).
    /// Exit 0 when a kernel was verified on the GPU, 1 when none was (compile-only without a GPU).
    Optimize {
        /// The problem: a file, or a KernelBench problem id.
        problem: String,
        /// Where the kept kernel goes (DIR/<name>/).
        #[arg(long, value_name = "DIR", default_value = "optimized")]
        out: PathBuf,
        /// Episodes (default: `optimize.samples` of the pipeline).
        #[arg(long)]
        samples: Option<usize>,
        /// Turns per episode: the generator's kernel, then the optimizer's revisions (default:
        /// `optimize.max_turns`).
        #[arg(long)]
        turns: Option<usize>,
        /// The KernelBench level a file is filed under (its problem id is `kb/L<level>/<name>`).
        #[arg(long, default_value_t = 1)]
        level: i64,
        /// The result as one line of JSON on stdout (docs/json.md).
        #[arg(long)]
        json: bool,
    },
    /// SQL over the tables of every node built under the current settings, named
    /// `node.table` (e.g. `SELECT tier, avg(pass) FROM eval.episodes GROUP BY tier`), with
    /// polars; prints a table, or JSON Lines (`--json`), or writes Parquet (`--parquet`). Needs a
    /// build with the `sql` feature.
    Sql {
        /// The query.
        query: String,
        /// The result as JSON Lines (one object per row, nulls kept).
        #[arg(long, conflicts_with = "parquet")]
        json: bool,
        /// Write the result to this Parquet file instead of printing it.
        #[arg(long, value_name = "FILE")]
        parquet: Option<PathBuf>,
    },
    /// The kernel-evaluation HTTP service: POST /v1/evaluate (the verdict JSON of `check`),
    /// GET /v1/tasks, /v1/tasks/{id}, /healthz, /metrics, /openapi.json. Prints
    /// `listening on http://ADDR` when ready; stops on SIGINT/SIGTERM.
    Serve(cmd::serve::ServeArgs),
    /// Benchmarks (ratios against a baseline measured in the same run).
    Bench {
        #[command(subcommand)]
        which: cmd::bench::BenchCmd,
    },
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`cudarl-pipe show ... | head`), like other Unix tools.
    // SAFETY: resetting a signal disposition at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    use clap::{CommandFactory, FromArgMatches};
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|m| Ok((Cli::from_arg_matches(&m)?, m)));
    let cli = match parsed {
        Ok((mut c, m)) => {
            c.profile_from_env =
                m.value_source("profile") == Some(clap::parser::ValueSource::EnvVariable);
            c
        }
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let filter = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CUDARL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: piped logs stay greppable (`step=1`).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .init();
    match cmd::dispatch(cli) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code as u8)
        }
    }
}
