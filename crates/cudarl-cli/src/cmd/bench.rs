//! `cudarl-pipe bench`: speed goals measured as ratios against a baseline in the same run.
//!
//! - `bench noop`: wall time of a fully cached `cudarl-pipe run curriculum` process, against
//!   the process floor (`cudarl-pipe --version`), median of N runs each.
//! - `bench ingest-sakana`: `ingest-sakana` on a full-size (30,615-row) table in the archive's
//!   19-column schema, built by replicating the bundled sample with varied code, against the
//!   baseline of reading and rewriting the same files with the same Parquet writer.
//! - `bench train-throughput`: training tokens/s (forward, backward, clipping, AdamW; bf16
//!   autocast on a GPU) and generation tokens/s of the Qwen2 model of `cudarl-train` against
//!   the same architecture, batch and recipe in PyTorch eager (`transformers`,
//!   `python/bench_transformers.py`), in one run on the same device.
//! - `bench torch-build`: cold torch-extension builds as one unit against the harness's
//!   build (the kernel/host layout with a precompiled torch header, [`cudarl_cuda::torchsplit`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use clap::Subcommand;
use cudarl_core::{Engine, NodeStatus, Pipeline, RunOptions, Store};
use cudarl_stages::Registry;

use super::{CliError, Ctx};

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Cached no-op `run curriculum` vs process start-up (`--version`).
    Noop {
        /// Timed repetitions of each command.
        #[arg(long, default_value_t = 15)]
        reps: usize,
        /// Also write the result as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// `ingest-sakana` on a full-size archive table vs plain read + rewrite of the same files.
    IngestSakana {
        /// Rows of the synthetic full-size table (the real archive has 30,615).
        #[arg(long, default_value_t = 30_615)]
        rows: usize,
        /// Timed repetitions.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Also write the result as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Throughput of the `validate` stage (compile + all tests + timing) on `--kernels` distinct
    /// kernel sources (the task families' naive and optimized kernels, each variant a distinct
    /// source, so every one is compiled by nvcc; the pipeline's generated families are left out),
    /// on a cold store, against the per-kernel cost of one cold `validate` of a single kernel
    /// per family in the same run; and the same kernels on one GPU worker instead of
    /// `validate.gpu_workers` (`speedup_vs_one_worker`), and timed by one timing worker in
    /// batches (`validate.timing = "batched"`, a second runner per candidate) instead of in each
    /// tester's runner (`speedup_vs_batched_timing`).
    Validate {
        /// Distinct kernel sources to validate.
        #[arg(long, default_value_t = 200)]
        kernels: usize,
        /// Also write the result as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The RL harness (rollouts, `eval`) on one batch of `--kernels` distinct kernel sources:
    /// streamed through the harness scheduler (each build tested as soon as it is done) vs the
    /// same batch built first and tested after (`speedup_vs_compile_first`), `--rounds` pairs.
    Harness {
        /// Candidates per batch.
        #[arg(long, default_value_t = 64)]
        kernels: usize,
        /// Pairs of batches (streamed, compile-first).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Also write the result as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Cold torch-extension builds of the archive sample's kernels: one translation unit with
    /// `torch/extension.h` against the harness's build (a torch-free kernel unit and a host
    /// unit with the precompiled torch header, compiled in parallel; the `torch/types.h` split
    /// or one unit where the source needs them), per-build median seconds and their ratio, in
    /// one run.
    TorchBuild {
        /// Distinct archive kernels (levels 1, 2 and 3 in turn).
        #[arg(long, default_value_t = 6)]
        kernels: usize,
        /// Builds at a time.
        #[arg(long, default_value_t = 2)]
        jobs: usize,
        /// Also write the result as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Load test of `serve` on loopback: `--clients` concurrent clients for `--seconds`, each
    /// sending distinct kernels (the task families' naive and optimized kernels with a unique
    /// comment, so every request compiles and, on a GPU, runs); throughput, p50/p99 latency,
    /// lost or duplicated results (every request id must come back exactly once, and the
    /// server's verdict count must equal the 200s received). Then the HTTP path's overhead:
    /// the same compiled kernel through `check` (a process per call) vs through the warm
    /// service, each `--overhead-reps` times.
    Serve {
        /// Concurrent clients.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Seconds of load.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// The service's queue (admission) size.
        #[arg(long, default_value_t = 256)]
        queue: usize,
        /// Repetitions of the overhead comparison.
        #[arg(long, default_value_t = 10)]
        overhead_reps: usize,
        /// `auto` or `compile`.
        #[arg(long, default_value = "auto")]
        mode: String,
        /// Then this many distinct candidates as one `POST /v1/evaluate/batch` (0: none):
        /// seconds to its first and last answer line.
        #[arg(long, default_value_t = 0)]
        batch: usize,
        /// `serve --gpu-testers` of the measured service, then of baselines given the same load
        /// (`4,1`: four testers per GPU, against one), each reported as a ratio.
        #[arg(long, value_delimiter = ',', default_value = "4", value_name = "N,...")]
        gpu_testers: Vec<usize>,
        /// Also write the result as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Decode throughput of the trainer's generation per batch size, prompts' forward pass and
    /// decode steps apart: CUDA graphs over a static cache (the default path), the same without
    /// graphs, and the previous dynamic-cache path, against `transformers` on the same weights
    /// with its static cache and `torch.compile(mode="reduce-overhead")`, in one run.
    Decode {
        #[command(flatten)]
        args: crate::cmd::bench_decode::Args,
        /// Also write the result as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Training and generation throughput of cudarl-train's Qwen2 vs `transformers` eager.
    TrainThroughput {
        /// `configs/model/<model>.toml` (architecture and tokenizer vocabulary size).
        #[arg(long, default_value = "small")]
        model: String,
        /// Sequences per training step.
        #[arg(long, default_value_t = 16)]
        batch_size: usize,
        /// Tokens per sequence.
        #[arg(long, default_value_t = 1024)]
        seq_len: usize,
        /// Timed training steps (after 5 untimed ones).
        #[arg(long, default_value_t = 30)]
        steps: usize,
        /// Batch sizes of the generation measurement.
        #[arg(long, value_delimiter = ',', default_value = "1,32")]
        gen_batches: Vec<usize>,
        /// New tokens per row in the generation measurement (after a 128-token prompt).
        #[arg(long, default_value_t = 128)]
        gen_tokens: usize,
        /// Activation checkpointing on both sides (ours: `gradient_checkpointing` of the
        /// `[sft]` settings; transformers: `gradient_checkpointing_enable()`).
        #[arg(long)]
        gradient_checkpointing: bool,
        /// The parameters' dtype and AdamW's rounding: `f32` (float32 master weights),
        /// `bf16-stochastic`, `bf16-kahan` or `bf16` (`cudarl_protocol::Weights`); transformers'
        /// side keeps float32 master weights for `f32` and holds the model in bf16 with
        /// torch's AdamW (bf16 moments, round to nearest) otherwise.
        #[arg(long, default_value = "f32", value_parser = ["f32", "bf16-stochastic", "bf16-kahan", "bf16"])]
        weights: String,
        /// LoRA of rank R on all seven projections of every layer, the base frozen in the
        /// compute dtype (ours: `sft-train`'s `lora`; transformers': PEFT's
        /// `get_peft_model` on the bf16 model). Absent: full fine-tuning.
        #[arg(long, value_name = "R")]
        lora_r: Option<usize>,
        /// LoRA's alpha (the update scaled by alpha / r).
        #[arg(long, default_value_t = 32.0)]
        lora_alpha: f64,
        /// `auto`, `cpu` or `cuda`.
        #[arg(long, default_value = "auto")]
        device: String,
        /// Also write the result as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub(crate) fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    serde_json::json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "date": chrono_like_now(),
    })
}

fn chrono_like_now() -> String {
    let out = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%dT%H:%M:%SZ")
        .output();
    out.ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// `result` (an object) with `machine` (CPU, cores, date), `gpu` (the first GPU's name from
/// `nvidia-smi`, or `none`) and `commit` (`$CUDARL_COMMIT`, else `git rev-parse HEAD`, else
/// `unknown`) added.
pub(crate) fn finish_fields(mut result: serde_json::Value) -> serde_json::Value {
    let out = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string()
            })
            .filter(|s| !s.is_empty())
    };
    let gpu = out("nvidia-smi", &["--query-gpu=name", "--format=csv,noheader"]);
    let commit = std::env::var("CUDARL_COMMIT")
        .ok()
        .or_else(|| out("git", &["rev-parse", "HEAD"]));
    if let Some(o) = result.as_object_mut() {
        o.insert("machine".into(), machine());
        o.insert("gpu".into(), gpu.unwrap_or_else(|| "none".into()).into());
        o.insert(
            "commit".into(),
            commit.unwrap_or_else(|| "unknown".into()).into(),
        );
    }
    result
}

pub(crate) fn finish(result: serde_json::Value, out: Option<PathBuf>) -> Result<i32, CliError> {
    let text = serde_json::to_string_pretty(&result).expect("json") + "\n";
    if let Some(p) = out {
        if let Some(d) = p.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        std::fs::write(&p, &text)
            .map_err(|e| CliError::failed(format!("write {}: {e}", p.display())))?;
    }
    print!("{text}");
    Ok(0)
}

/// Runs a benchmark.
pub fn run(ctx: &Ctx, which: BenchCmd) -> Result<i32, CliError> {
    match which {
        BenchCmd::Noop { reps, out } => noop(ctx, reps, out),
        BenchCmd::IngestSakana { rows, reps, out } => ingest_sakana(ctx, rows, reps, out),
        BenchCmd::Validate { kernels, out } => validate(ctx, kernels, out),
        BenchCmd::Harness {
            kernels,
            rounds,
            out,
        } => crate::cmd::bench_harness::run(ctx, kernels, rounds, out),
        BenchCmd::TorchBuild { kernels, jobs, out } => {
            crate::cmd::bench_torch_build::run(ctx, kernels, jobs, out)
        }
        BenchCmd::Serve {
            clients,
            seconds,
            queue,
            overhead_reps,
            mode,
            batch,
            gpu_testers,
            out,
        } => crate::cmd::serve_bench::run(
            ctx,
            &crate::cmd::serve_bench::Load {
                clients,
                seconds,
                queue,
                overhead_reps,
                mode,
                batch,
                gpu_testers,
            },
        )
        .and_then(|r| finish(r, out)),
        BenchCmd::Decode { args, out } => {
            crate::cmd::bench_decode::run(ctx, &args).and_then(|r| finish(r, out))
        }
        BenchCmd::TrainThroughput {
            model,
            batch_size,
            seq_len,
            steps,
            gen_batches,
            gen_tokens,
            gradient_checkpointing,
            weights,
            lora_r,
            lora_alpha,
            device,
            out,
        } => {
            let lora = lora_r.map(|r| serde_json::json!({"r": r, "alpha": lora_alpha}));
            let job = train_job(
                ctx,
                &model,
                (batch_size, seq_len, steps),
                gen_batches,
                (gen_tokens, gradient_checkpointing, &weights, lora),
                &device,
            )?;
            train_throughput(ctx, &job, out)
        }
    }
}

fn time_cmd(exe: &Path, args: &[String]) -> Result<f64, CliError> {
    let t0 = Instant::now();
    let st = Command::new(exe)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| CliError::failed(format!("spawn: {e}")))?;
    if !st.success() {
        return Err(CliError::failed(format!(
            "`{}` failed with {st}",
            args.join(" ")
        )));
    }
    Ok(t0.elapsed().as_secs_f64())
}

fn noop(ctx: &Ctx, reps: usize, out: Option<PathBuf>) -> Result<i32, CliError> {
    let exe = std::env::current_exe().map_err(|e| CliError::failed(e.to_string()))?;
    let mut args = vec![
        "--root".to_string(),
        ctx.root.display().to_string(),
        "--store".to_string(),
        ctx.store.display().to_string(),
        "--pipeline".to_string(),
        ctx.pipeline_path.display().to_string(),
    ];
    args.push("--profile".into());
    args.push(
        ctx.settings
            .profile
            .clone()
            .unwrap_or_else(|| "none".into()),
    );
    for s in &ctx.settings.sets {
        args.push("--set".into());
        args.push(s.clone());
    }
    let mut run_args = args.clone();
    run_args.extend(["run".to_string(), "curriculum".to_string()]);
    // Warm: build everything once (untimed), then every timed run must be all-cached.
    time_cmd(&exe, &run_args)?;
    let check = Command::new(&exe)
        .args(&run_args)
        .arg("--json")
        .output()
        .map_err(|e| CliError::failed(e.to_string()))?;
    let all_cached = String::from_utf8_lossy(&check.stdout)
        .lines()
        .all(|l| l.contains("\"status\":\"cached\""));
    if !all_cached {
        return Err(CliError::failed(
            "second run was not fully cached; cannot benchmark a no-op run",
        ));
    }
    let base: Vec<f64> = (0..reps)
        .map(|_| time_cmd(&exe, &["--version".to_string()]))
        .collect::<Result<_, _>>()?;
    let noop: Vec<f64> = (0..reps)
        .map(|_| time_cmd(&exe, &run_args))
        .collect::<Result<_, _>>()?;
    let (b, n) = (median(base), median(noop));
    finish(
        serde_json::json!({
            "bench": "noop-run-curriculum",
            "machine": machine(),
            "reps": reps,
            "baseline": "cudarl-pipe --version (process start-up)",
            "baseline_median_s": b,
            "noop_run_median_s": n,
            "ratio_vs_baseline": n / b,
            "goal_s": 0.3,
            "meets_goal": n <= 0.3,
        }),
        out,
    )
}

/// Builds `rows` rows in the archive's 19-column schema from the bundled sample, split like the
/// real archive into level_1 (39.7%), level_2 (42.3%), level_3 (18.0%) files, with the code
/// varied per row so every kernel id is distinct.
fn synth_archive(sample: &Path, dir: &Path, rows: usize) -> Result<Vec<PathBuf>, CliError> {
    let t = cudarl_data::Table::read(sample, "sample.parquet")
        .map_err(|e| CliError::failed(e.to_string()))?;
    let n = t.rows();
    let splits = [
        ("level_1.parquet", rows * 12_157 / 30_615),
        ("level_2.parquet", rows * 12_938 / 30_615),
    ];
    let third = rows - splits[0].1 - splits[1].1;
    let mut files = Vec::new();
    let mut start = 0usize;
    for (name, count) in [splits[0], splits[1], ("level_3.parquet", third)] {
        let idx: Vec<usize> = (start..start + count).map(|i| i % n).collect();
        let take =
            arrow::array::UInt32Array::from(idx.iter().map(|&i| i as u32).collect::<Vec<_>>());
        let mut fields = Vec::new();
        let mut cols: Vec<ArrayRef> = Vec::new();
        for (ci, f) in t.schema.fields().iter().enumerate() {
            let c = arrow::compute::take(t.batch.column(ci).as_ref(), &take, None)
                .map_err(|e| CliError::failed(e.to_string()))?;
            let c: ArrayRef = if f.name() == "CUDA_Code" {
                let s = c.as_any().downcast_ref::<StringArray>().expect("utf8");
                Arc::new(StringArray::from_iter(s.iter().enumerate().map(
                    |(k, v)| v.map(|v| format!("{v}\n// variant {}\n", start + k)),
                )))
            } else if f.name() == "__index_level_0__" {
                Arc::new(Int64Array::from_iter_values(
                    (start..start + count).map(|v| v as i64),
                ))
            } else {
                c
            };
            fields.push(f.as_ref().clone());
            cols.push(c);
            if f.name() == "PyTorch_Code_Module" {
                // The full archive has PyTorch_Code_Functional right after the module code.
                fields.push(Field::new("PyTorch_Code_Functional", DataType::Utf8, true));
                cols.push(cols.last().expect("module col").clone());
            }
            if f.name() == "NCU_Profile" {
                fields.push(Field::new("Torch_Profile", DataType::Utf8, true));
                cols.push(Arc::new(StringArray::from(vec![
                    Some(
                        "{'aten::matmul': {'cuda_time_us': 12.5}}"
                    );
                    count
                ])));
            }
        }
        let schema = Arc::new(Schema::new(fields));
        let b = RecordBatch::try_new(schema, cols).map_err(|e| CliError::failed(e.to_string()))?;
        let p = dir.join(name);
        cudarl_data::write_parquet(&p, &b).map_err(|e| CliError::failed(e.to_string()))?;
        files.push(p);
        start += count;
    }
    Ok(files)
}

fn ingest_sakana(
    ctx: &Ctx,
    rows: usize,
    reps: usize,
    out: Option<PathBuf>,
) -> Result<i32, CliError> {
    let tmp = std::env::temp_dir().join(format!("cudarl-bench-{}", std::process::id()));
    let archive = tmp.join("archive");
    std::fs::create_dir_all(&archive).map_err(|e| CliError::failed(e.to_string()))?;
    let sample = ctx
        .root
        .join("datasets/sakana_ai_cuda_engineer_archive_sample/sample.parquet");
    let files = synth_archive(&sample, &archive, rows)?;
    let bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();

    // Baseline: read and rewrite the same files with the same writer.
    let mut base = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        for f in &files {
            let t =
                cudarl_data::Table::read(f, "x").map_err(|e| CliError::failed(e.to_string()))?;
            cudarl_data::write_parquet(&tmp.join("copy.parquet"), &t.batch)
                .map_err(|e| CliError::failed(e.to_string()))?;
        }
        base.push(t0.elapsed().as_secs_f64());
    }

    let pipeline_text = format!(
        "[stages.ingest-kernelbench]\npath = {:?}\n\n[stages.ingest-sakana]\nsource = \"files\"\npath = {:?}\n",
        ctx.root
            .join("datasets/kernelbench/problems.parquet")
            .display()
            .to_string(),
        archive.display().to_string()
    );
    let pfile = tmp.join("bench.toml");
    std::fs::write(&pfile, pipeline_text).map_err(|e| CliError::failed(e.to_string()))?;
    let pipeline = Pipeline::load(&pfile, "bench.toml", None, &[], &Registry)?;
    let store = Store::open(tmp.join("store")).map_err(|e| CliError::failed(e.to_string()))?;
    let engine = Engine::new(
        store,
        pipeline,
        ctx.root.clone(),
        tmp.join("bench.lock"),
        Arc::new(cudarl_core::NullReporter),
        0,
    );
    let first = engine.run(&["ingest-kernelbench".to_string()], &RunOptions::default())?;
    if first.exit_code() != 0 {
        return Err(CliError::failed(
            "ingest-kernelbench failed in the benchmark",
        ));
    }
    let mut times = Vec::new();
    let mut out_rows = 0;
    for _ in 0..reps {
        let t0 = Instant::now();
        let s = engine.run(
            &["ingest-sakana".to_string()],
            &RunOptions {
                force: vec!["ingest-sakana".into()],
                ..Default::default()
            },
        )?;
        times.push(t0.elapsed().as_secs_f64());
        let r = s.record("ingest-sakana").expect("node ran");
        if r.status != NodeStatus::Ran {
            return Err(CliError::failed(format!(
                "ingest-sakana {}: {:?}",
                r.status.as_str(),
                r.error
            )));
        }
        out_rows = r.outputs.get("kernels").and_then(|o| o.rows).unwrap_or(0);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let (b, n) = (median(base), median(times));
    finish(
        serde_json::json!({
            "bench": "ingest-sakana-full-size",
            "machine": machine(),
            "input_rows": rows,
            "input_bytes": bytes,
            "output_rows": out_rows,
            "reps": reps,
            "baseline": "read + rewrite the same Parquet files (same writer settings)",
            "baseline_median_s": b,
            "ingest_median_s": n,
            "ratio_vs_baseline": n / b,
            "rows_per_s": rows as f64 / n,
            "goal_s": 3.0,
            "meets_goal": n <= 3.0,
        }),
        out,
    )
}

/// A copy of the project's pipelines, configs and task families under `dir`, each task listing
/// `per_task` variants of its kernels (distinct sources: a variant comment) as optimized kernels.
fn variant_project(ctx: &Ctx, dir: &Path, per_task: usize) -> Result<usize, CliError> {
    let e = |m: std::io::Error| CliError::failed(m.to_string());
    let copy_tree = |from: &Path, to: &Path| -> Result<(), CliError> {
        let st = Command::new("cp")
            .arg("-r")
            .arg(from)
            .arg(to)
            .status()
            .map_err(e)?;
        if st.success() {
            Ok(())
        } else {
            Err(CliError::failed(format!("cp -r {}", from.display())))
        }
    };
    std::fs::create_dir_all(dir).map_err(e)?;
    copy_tree(&ctx.root.join("pipelines"), &dir.join("pipelines"))?;
    copy_tree(&ctx.root.join("configs"), &dir.join("configs"))?;
    std::fs::create_dir_all(dir.join("datasets")).map_err(e)?;
    copy_tree(
        &ctx.root.join("datasets/tasks"),
        &dir.join("datasets/tasks"),
    )?;
    let tasks = cudarl_cuda::load_tasks(&dir.join("datasets/tasks"))
        .map_err(|x| CliError::failed(x.to_string()))?;
    let mut total = 0;
    for t in tasks {
        let mut sources = vec![
            t.naive_source()
                .map_err(|x| CliError::failed(x.to_string()))?,
        ];
        for (_, src) in t
            .optimized_sources()
            .map_err(|x| CliError::failed(x.to_string()))?
        {
            sources.push(src);
        }
        let mut names = Vec::new();
        for i in 0..per_task {
            let name = format!("bench_variant_{i}.cu");
            let src = &sources[i % sources.len()];
            std::fs::write(t.dir.join(&name), format!("{src}\n// bench variant {i}\n"))
                .map_err(e)?;
            names.push(name);
        }
        let toml_path = t.dir.join("task.toml");
        let mut doc: toml::Table = toml::from_str(&std::fs::read_to_string(&toml_path).map_err(e)?)
            .map_err(|x| CliError::failed(x.to_string()))?;
        doc.insert(
            "optimized".into(),
            toml::Value::Array(names.into_iter().map(toml::Value::String).collect()),
        );
        std::fs::write(&toml_path, toml::to_string(&doc).expect("toml")).map_err(e)?;
        total += per_task + 1;
    }
    Ok(total)
}

/// What `show validate --json` printed of a store's `validations`, counted.
#[derive(Default)]
struct ValidationSummary {
    /// Rows that ran on a GPU.
    executed: usize,
    /// Rows judged correct.
    correct: usize,
    /// Rows whose candidate compiled.
    compiled: usize,
    /// Worker time by phase (`runner`, `tests`, `timing`, `torch`), seconds summed over rows.
    phase: std::collections::BTreeMap<&'static str, f64>,
    /// Rows not judged correct, by failure and detail (first 100 characters).
    failures: std::collections::BTreeMap<String, usize>,
}

impl ValidationSummary {
    /// Counts the JSON lines of `rows` (one `validations` row each).
    fn of(rows: &str) -> Self {
        let mut s = Self::default();
        for l in rows.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
            s.executed += v["executed"].as_bool().unwrap_or(false) as usize;
            s.correct += v["correct"].as_bool().unwrap_or(false) as usize;
            s.compiled += v["compiled"].as_bool().unwrap_or(false) as usize;
            let verdict: serde_json::Value =
                serde_json::from_str(v["verdict_json"].as_str().unwrap_or("{}"))
                    .unwrap_or_default();
            if v["correct"].as_bool() != Some(true) {
                let why = format!(
                    "{}: {}",
                    verdict["failure"].as_str().unwrap_or("wrong output"),
                    verdict["failure_detail"].as_str().unwrap_or_default()
                );
                *s.failures
                    .entry(why.chars().take(100).collect())
                    .or_default() += 1;
            }
            for k in ["runner", "tests", "timing", "torch"] {
                *s.phase.entry(k).or_default() +=
                    verdict["worker_ms"][k].as_f64().unwrap_or(0.0) / 1e3;
            }
        }
        s
    }
}

/// The `validations` rows of the project at `root` (its store `root/store`, run with `sets`),
/// as `show validate --json` prints them.
///
/// # Errors
/// `show` failed to start or exited non-zero (its stderr in the message).
fn show_validations(exe: &Path, root: &Path, sets: &[String]) -> Result<String, CliError> {
    let rows = Command::new(exe)
        .args(["--root", &root.display().to_string(), "--store"])
        .arg(root.join("store"))
        .args([
            "show",
            "validate",
            "--output",
            "validations",
            "--json",
            "--head",
            "100000",
        ])
        .args(sets)
        .output()
        .map_err(|e| CliError::failed(e.to_string()))?;
    if !rows.status.success() {
        return Err(CliError::failed(format!(
            "show validate: {}",
            String::from_utf8_lossy(&rows.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&rows.stdout).into_owned())
}

fn validate(ctx: &Ctx, kernels: usize, out: Option<PathBuf>) -> Result<i32, CliError> {
    let exe = std::env::current_exe().map_err(|e| CliError::failed(e.to_string()))?;
    // The copies live outside the project: hand them the project's nvcc (e.g. the .venv wheel).
    let nvcc =
        cudarl_cuda::Nvcc::discover(&ctx.root).map_err(|e| CliError::failed(e.to_string()))?;
    // SAFETY: set before any thread of this process reads the environment.
    unsafe { std::env::set_var("CUDARL_NVCC", &nvcc.path) };
    let tmp = tempfile::tempdir().map_err(|e| CliError::failed(e.to_string()))?;
    let ntasks = cudarl_cuda::load_tasks(&ctx.root.join("datasets/tasks"))
        .map_err(|x| CliError::failed(x.to_string()))?
        .len()
        .max(1);
    // Baseline: one kernel per task (its naive one), cold store.
    let small = tmp.path().join("small");
    let n_small = variant_project(ctx, &small, 0)?;
    // The hand-written families' kernels only, not the pipeline's generated families (`show`
    // needs the same values to find the run).
    let sets = |workers: Option<usize>, batched: bool| -> Vec<String> {
        let mut a = Vec::new();
        for k in ["elementwise", "row_reduce", "operators"] {
            a.extend(["--set".into(), format!("synth-tasks.generate.{k}=0")]);
        }
        if let Some(n) = workers {
            a.extend(["--set".into(), format!("validate.gpu_workers={n}")]);
        }
        if batched {
            a.extend(["--set".into(), "validate.timing=\"batched\"".into()]);
        }
        a
    };
    let run_with = |root: &Path,
                    store: &Path,
                    workers: Option<usize>,
                    batched: bool|
     -> Result<f64, CliError> {
        let mut args = vec![
            "--root".into(),
            root.display().to_string(),
            "--store".into(),
            store.display().to_string(),
            "run".into(),
            "validate".into(),
        ];
        args.extend(sets(workers, batched));
        time_cmd(&exe, &args)
    };
    let small_s = run_with(&small, &small.join("store"), None, false)?;
    let big = tmp.path().join("big");
    let n_big = variant_project(ctx, &big, kernels.div_ceil(ntasks))?;
    // The same kernels on one GPU worker (cold store too): what concurrent testing buys.
    let workers = cudarl_cuda::worker::DEFAULT_GPU_WORKERS;
    let one_s = run_with(&big, &big.join("store-one-worker"), Some(1), false)?;
    // Timed in batches by a timing worker (cold store): what timing in the testers buys.
    let batched_s = run_with(&big, &big.join("store-batched"), Some(workers), true)?;
    let big_s = run_with(&big, &big.join("store"), Some(workers), false)?;
    let rows = show_validations(&exe, &big, &sets(Some(workers), false))?;
    let ValidationSummary {
        executed,
        correct,
        compiled,
        phase,
        failures,
    } = ValidationSummary::of(&rows);
    let gpu = cudarl_cuda::gpu::probe();
    let per_h = n_big as f64 / big_s * 3600.0;
    finish(
        serde_json::json!({
            "bench": "validate-throughput",
            "machine": machine(),
            "gpu": gpu,
            "mode": if gpu.is_some() { "full (compile + tests + timing)" } else { "compile-only (no GPU)" },
            "kernels": n_big,
            "compiled": compiled,
            "executed": executed,
            "correct": correct,
            "not_correct_by_reason": failures,
            "wall_s": big_s,
            "seconds_by_phase": {
                "worker: runner start and load": phase.get("runner"),
                "worker: tests": phase.get("tests"),
                "worker: timing": phase.get("timing"),
                "worker: torch baselines": phase.get("torch"),
            },
            "kernels_per_hour": per_h,
            "baseline": "cold `run validate` of one naive kernel per task (start-up, worker, first compiles)",
            "baseline_kernels": n_small,
            "baseline_wall_s": small_s,
            "baseline_s_per_kernel": small_s / n_small as f64,
            "s_per_kernel": big_s / n_big as f64,
            "ratio_vs_baseline_per_kernel": (small_s / n_small as f64) / (big_s / n_big as f64),
            "gpu_workers": workers,
            "one_worker_wall_s": one_s,
            // Without a GPU there are no GPU workers: both runs are the same compile-only work.
            "speedup_vs_one_worker": gpu.is_some().then(|| one_s / big_s),
            "batched_timing_wall_s": batched_s,
            "speedup_vs_batched_timing": gpu.is_some().then(|| batched_s / big_s),
            "goal_kernels_per_hour": 20000,
            "meets_goal": per_h >= 20000.0,
        }),
        out,
    )
}

/// The trainer's `bench` job for `configs/model/<model>.toml`.
///
/// # Errors
/// A missing or malformed file (named), as a usage error.
pub(crate) fn model_file(
    ctx: &Ctx,
    model: &str,
) -> Result<cudarl_stages::train_stages::ModelFile, CliError> {
    let rel = format!("configs/model/{model}.toml");
    let text = std::fs::read_to_string(ctx.root.join(&rel))
        .map_err(|e| CliError::usage(format!("{rel}: {e}")))?;
    toml::from_str(&text).map_err(|e| CliError::usage(format!("{rel}: {e}")))
}

fn train_job(
    ctx: &Ctx,
    model: &str,
    (batch_size, seq_len, steps): (usize, usize, usize),
    gen_batches: Vec<usize>,
    (gen_tokens, gradient_checkpointing, weights, lora): (
        usize,
        bool,
        &str,
        Option<serde_json::Value>,
    ),
    device: &str,
) -> Result<serde_json::Value, CliError> {
    let mf = model_file(ctx, model)?;
    let mut job = serde_json::json!({
        "kind": "bench", "model": mf.model, "vocab_size": mf.tokenizer.vocab_size,
        "batch_size": batch_size, "seq_len": seq_len, "steps": steps, "warmup_steps": 5,
        "gen_batches": gen_batches, "prompt_len": 128, "gen_tokens": gen_tokens,
        "gradient_checkpointing": gradient_checkpointing, "weights": weights, "device": device,
    });
    if let Some(l) = lora {
        job["lora"] = l;
    }
    Ok(job)
}

/// The last line of `exe args`' stdout that parses as JSON (the result of a trainer job or a
/// baseline script).
///
/// # Errors
/// The process failed to start or exited non-zero (its stderr quoted), or printed no JSON.
pub(crate) fn last_json(exe: &Path, args: &[&Path]) -> Result<serde_json::Value, CliError> {
    let o = Command::new(exe)
        .args(args)
        .output()
        .map_err(|e| CliError::failed(format!("{}: {e}", exe.display())))?;
    if !o.status.success() {
        return Err(CliError::failed(format!(
            "{} failed ({}): {}",
            exe.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| CliError::failed(format!("{}: no JSON result", exe.display())))
}

fn train_throughput(
    ctx: &Ctx,
    job: &serde_json::Value,
    out: Option<PathBuf>,
) -> Result<i32, CliError> {
    let dir = tempfile::tempdir().map_err(|e| CliError::failed(e.to_string()))?;
    let jp = dir.path().join("bench.json");
    std::fs::write(&jp, job.to_string()).map_err(|e| CliError::failed(e.to_string()))?;
    let ours = last_json(&cudarl_rl::trainer::trainer_exe(), &[&jp])?;
    let script = ctx.root.join("python/bench_transformers.py");
    let base = last_json(&cudarl_cuda::pyworker::python(&ctx.root), &[&script, &jp])?;
    let ratio = |a: &serde_json::Value, b: &serde_json::Value| {
        a.as_f64().zip(b.as_f64()).map(|(a, b)| a / b)
    };
    let mut gen_ratio = serde_json::Map::new();
    if let Some(g) = ours["generate"].as_object() {
        for (b, v) in g {
            gen_ratio.insert(
                b.clone(),
                serde_json::json!(ratio(
                    &v["tokens_per_s"],
                    &base["generate"][b]["tokens_per_s"]
                )),
            );
        }
    }
    finish(
        serde_json::json!({
            "bench": "train-throughput", "machine": machine(), "job": job,
            "ours": ours, "baseline": base,
            "train_ratio": ratio(&ours["train_tokens_per_s"], &base["train_tokens_per_s"]),
            "generate_ratio": gen_ratio,
        }),
        out,
    )
}
