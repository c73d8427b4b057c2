//! `cudarl-pipe bench serve`: a bounded load test of `serve` on loopback and the overhead of
//! the HTTP path against `check`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{CliError, Ctx};

/// Load-test settings.
#[derive(Debug, Clone)]
pub struct Load {
    /// Concurrent clients.
    pub clients: usize,
    /// Seconds of load.
    pub seconds: u64,
    /// The service's queue size.
    pub queue: usize,
    /// Repetitions of the overhead comparison.
    pub overhead_reps: usize,
    /// `auto` or `compile`.
    pub mode: String,
    /// Distinct candidates sent as one `POST /v1/evaluate/batch` after the load (0: none).
    pub batch: usize,
    /// `serve --gpu-testers` of the measured service, then of each baseline service: each
    /// baseline gets the same load (its own distinct sources, so no compile-cache hit) and the
    /// measured service's verdicts/s and p50 latency as ratios over it.
    pub gpu_testers: Vec<usize>,
}

/// The service as a child process; killed on drop.
struct Served {
    child: Child,
    base: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        // SAFETY: signalling our own child; SIGTERM lets it shut down its GPU workers.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

fn start(ctx: &Ctx, l: &Load, gpu_testers: usize) -> Result<Served, CliError> {
    let exe = std::env::current_exe().map_err(|e| CliError::failed(e.to_string()))?;
    let mut child = Command::new(exe)
        .arg("--root")
        .arg(&ctx.root)
        .arg("--store")
        .arg(&ctx.store)
        .args(["serve", "--bind", "127.0.0.1:0", "--mode", &l.mode])
        .args(["--queue", &l.queue.to_string()])
        .args(["--gpu-testers", &gpu_testers.to_string()])
        // A batch of a thousand kernels is a few MB of JSON.
        .args(["--max-body-bytes", &(64usize << 20).to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| CliError::failed(format!("start serve: {e}")))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .map_err(|e| CliError::failed(e.to_string()))?;
    let base = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .ok_or_else(|| CliError::failed(format!("serve did not start: `{line}`")))?
        .to_string();
    Ok(Served { child, base })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let k = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[k.min(sorted.len() - 1)]
}

/// One client's record: (request id, status, seconds, task id echoed in the verdict, task id
/// asked for, the verdict's `correct`).
type Record = (String, u16, f64, Option<String>, String, Option<bool>);

/// Runs the load test and the overhead comparison, then the load on each baseline service;
/// returns the result JSON.
///
/// # Errors
/// The task families cannot be read or a service does not start.
pub fn run(ctx: &Ctx, l: &Load) -> Result<Value, CliError> {
    let kernels = task_kernels(ctx)?;
    let agent = || {
        ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(600))
            .build()
    };
    let testers = l.gpu_testers.first().copied().unwrap_or(1);
    let served = start(ctx, l, testers)?;
    let health = get_json(&agent(), &format!("{}/healthz", served.base))?;
    let mut out = load(&served.base, &kernels, l, (0, testers), &agent)?;
    let batch = (l.batch > 0)
        .then(|| batch(&served.base, &kernels, l.batch, &agent))
        .transpose()?;
    let (serve_ms, check_ms) = overhead(ctx, l, &served.base, &kernels[0], &agent)?;
    let (s50, c50) = (percentile(&serve_ms, 50.0), percentile(&check_ms, 50.0));
    drop(served);
    let mut baselines = Vec::new();
    for (run, &n) in l.gpu_testers.iter().enumerate().skip(1) {
        let served = start(ctx, l, n)?;
        let mut b = load(&served.base, &kernels, l, (run, n), &agent)?;
        drop(served);
        b["measured_over_baseline"] = json!({
            "verdicts_per_second": out["verdicts_per_second"].as_f64().unwrap_or(f64::NAN)
                / b["verdicts_per_second"].as_f64().unwrap_or(f64::NAN),
            "latency_p50": out["latency_ms"]["p50"].as_f64().unwrap_or(f64::NAN)
                / b["latency_ms"]["p50"].as_f64().unwrap_or(f64::NAN),
        });
        baselines.push(b);
    }
    let extra = json!({
        "bench": "serve",
        "machine": super::bench::machine(),
        "service": health,
        "clients": l.clients,
        "seconds": l.seconds,
        "queue": l.queue,
        "batch": batch,
        "overhead": {"kernel": kernels[0].0, "reps": l.overhead_reps,
            "serve_ms_p50": s50, "check_ms_p50": c50, "check_over_serve": c50 / s50,
            "serve_ms": serve_ms, "check_ms": check_ms},
        "baselines": baselines,
    });
    if let (Some(o), Value::Object(e)) = (out.as_object_mut(), extra) {
        o.extend(e);
    }
    Ok(out)
}

/// `GET url` as JSON.
fn get_json(a: &ureq::Agent, url: &str) -> Result<Value, CliError> {
    a.get(url)
        .call()
        .map_err(|e| CliError::failed(e.to_string()))?
        .into_json()
        .map_err(|e| CliError::failed(e.to_string()))
}

/// `l.clients` clients sending distinct candidates (task kernels, each with a comment naming
/// the service's run and tester count, the client and its sequence number, so no two runs
/// share a source) to `POST /v1/evaluate` at `base`
/// for `l.seconds`: requests, 200s, 429s, lost and duplicated answers, correct verdicts,
/// verdicts/s, latency (ms), and the server's own verdict count, which must equal the 200s.
///
/// # Errors
/// `/metrics` cannot be read after the load.
fn load(
    base: &str,
    kernels: &[(String, String)],
    l: &Load,
    (run, testers): (usize, usize),
    agent: &dyn Fn() -> ureq::Agent,
) -> Result<Value, CliError> {
    let records: Arc<Mutex<Vec<Record>>> = Arc::default();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(l.seconds);
    std::thread::scope(|s| {
        for c in 0..l.clients {
            let records = records.clone();
            let a = agent();
            s.spawn(move || {
                let mut seq = 0usize;
                while Instant::now() < end {
                    let (task, code) = &kernels[(c * 7 + seq) % kernels.len()];
                    let id = format!("c{c}r{seq}");
                    let src = format!("// bench run {run} t{testers} {id}\n{code}");
                    let t = Instant::now();
                    let r = a
                        .post(&format!("{base}/v1/evaluate"))
                        .send_json(json!({"task_id": task, "source": src}));
                    let secs = t.elapsed().as_secs_f64();
                    let rec = match r {
                        Ok(resp) => {
                            let v: Value = resp.into_json().unwrap_or_default();
                            let echoed = v["task_id"].as_str().map(str::to_string);
                            (id, 200, secs, echoed, task.clone(), v["correct"].as_bool())
                        }
                        Err(ureq::Error::Status(code, _)) => {
                            (id, code, secs, None, task.clone(), None)
                        }
                        Err(_) => (id, 0, secs, None, task.clone(), None),
                    };
                    let busy = rec.1 == 429;
                    records.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
                    if busy {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    seq += 1;
                }
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let recs = std::mem::take(&mut *records.lock().unwrap_or_else(|e| e.into_inner()));
    let ok: Vec<&Record> = recs.iter().filter(|r| r.1 == 200).collect();
    let busy = recs.iter().filter(|r| r.1 == 429).count();
    let lost: Vec<&Record> = recs.iter().filter(|r| r.1 != 200 && r.1 != 429).collect();
    let mut ids: Vec<&str> = ok.iter().map(|r| r.0.as_str()).collect();
    ids.sort_unstable();
    let unique = {
        let mut u = ids.clone();
        u.dedup();
        u.len()
    };
    let wrong_task = ok
        .iter()
        .filter(|r| r.3.as_deref() != Some(r.4.as_str()))
        .count();
    let mut lat: Vec<f64> = ok.iter().map(|r| r.2 * 1000.0).collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    // The server's own count of verdicts: must equal the 200s received (no duplicates).
    let metrics = agent()
        .get(&format!("{base}/metrics"))
        .call()
        .map_err(|e| CliError::failed(e.to_string()))?
        .into_string()
        .map_err(|e| CliError::failed(e.to_string()))?;
    let server_verdicts: f64 = metrics
        .lines()
        .filter(|x| x.starts_with("cudarl_serve_verdicts_total"))
        .filter_map(|x| x.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    Ok(json!({
        "gpu_testers": testers,
        "wall_seconds": wall,
        "requests": recs.len(),
        "ok": ok.len(),
        "rejected_429": busy,
        "lost": lost.len(),
        "lost_statuses": lost.iter().map(|r| r.1).collect::<Vec<_>>(),
        "duplicated": ok.len() - unique,
        "wrong_task_in_verdict": wrong_task,
        // Every candidate is a task's own naive or optimized kernel: all correct on a GPU
        // (compile mode leaves `correct` unset).
        "correct": ok.iter().filter(|r| r.5 == Some(true)).count(),
        "server_verdicts": server_verdicts,
        "verdicts_per_second": ok.len() as f64 / wall,
        "latency_ms": {"p50": percentile(&lat, 50.0), "p90": percentile(&lat, 90.0),
            "p99": percentile(&lat, 99.0), "max": lat.last().copied()},
    }))
}

/// `n` distinct candidates (the task kernels in turn, each with a comment of its own) as one
/// `POST /v1/evaluate/batch` to the service at `base`: seconds to the answer's first and last
/// line, lines by status, and whether every candidate's id came back exactly once.
///
/// # Errors
/// The request fails as a whole, or a line of the answer is not JSON.
fn batch(
    base: &str,
    kernels: &[(String, String)],
    n: usize,
    agent: &dyn Fn() -> ureq::Agent,
) -> Result<Value, CliError> {
    let candidates: Vec<Value> = (0..n)
        .map(|i| {
            let (task, code) = &kernels[i % kernels.len()];
            json!({"id": format!("b{i}"), "task_id": task, "source": format!("// batch {i}\n{code}")})
        })
        .collect();
    let failed = |e: &dyn std::fmt::Display| CliError::failed(format!("batch of {n}: {e}"));
    let t = Instant::now();
    let resp = agent()
        .post(&format!("{base}/v1/evaluate/batch"))
        .send_json(json!({"candidates": candidates}))
        .map_err(|e| failed(&e))?;
    let mut first = None;
    let mut statuses: std::collections::BTreeMap<String, usize> = Default::default();
    let mut ids = std::collections::BTreeSet::new();
    let mut lines = 0;
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.map_err(|e| failed(&e))?;
        first.get_or_insert(t.elapsed().as_secs_f64());
        let v: Value = serde_json::from_str(&line).map_err(|e| failed(&e))?;
        *statuses.entry(v["status"].to_string()).or_default() += 1;
        ids.extend(v["id"].as_str().map(str::to_string));
        lines += 1;
    }
    Ok(json!({"candidates": n, "first_line_seconds": first,
        "seconds": t.elapsed().as_secs_f64(), "statuses": statuses,
        "answered_once": lines == n && ids.len() == n}))
}

/// Every task family's naive and optimized kernels under `datasets/tasks`, as (task id, code).
///
/// # Errors
/// The task folder cannot be read, or holds no kernel (usage error).
fn task_kernels(ctx: &Ctx) -> Result<Vec<(String, String)>, CliError> {
    let tasks = cudarl_cuda::load_tasks(&ctx.root.join("datasets/tasks"))
        .map_err(|e| CliError::usage(e.to_string()))?;
    let mut kernels: Vec<(String, String)> = Vec::new();
    for t in &tasks {
        if let Ok(n) = t.naive_source() {
            kernels.push((t.spec.id.clone(), n));
        }
        if let Ok(o) = t.optimized_sources() {
            kernels.extend(o.into_iter().map(|(_, c)| (t.spec.id.clone(), c)));
        }
    }
    if kernels.is_empty() {
        return Err(CliError::usage("no task kernels under datasets/tasks"));
    }
    Ok(kernels)
}

/// One compiled kernel through `check` (a process each) and through the warm service at `base`
/// (new public seeds each time: no verdict-cache hit, a compile-cache hit), `l.overhead_reps`
/// times each: (service ms, `check` ms), each sorted.
///
/// # Errors
/// A temporary file for the kernel cannot be written.
fn overhead(
    ctx: &Ctx,
    l: &Load,
    base: &str,
    (task, code): &(String, String),
    agent: &dyn Fn() -> ureq::Agent,
) -> Result<(Vec<f64>, Vec<f64>), CliError> {
    let dir = tempfile::tempdir().map_err(|e| CliError::failed(e.to_string()))?;
    let file = dir.path().join("k.cu");
    std::fs::write(&file, code).map_err(|e| CliError::failed(e.to_string()))?;
    let exe = std::env::current_exe().map_err(|e| CliError::failed(e.to_string()))?;
    let check_mode = if l.mode == "compile" {
        "compile"
    } else {
        "auto"
    };
    let a = agent();
    let post = |seed: u64| -> f64 {
        let t = Instant::now();
        let _ = a
            .post(&format!("{base}/v1/evaluate"))
            .send_json(json!({"task_id": task, "source": code, "seeds": [seed]}));
        t.elapsed().as_secs_f64() * 1000.0
    };
    post(10_000); // compiled and the naive baseline timed once
    let mut serve_ms = Vec::new();
    let mut check_ms = Vec::new();
    for i in 0..l.overhead_reps {
        serve_ms.push(post(10_001 + i as u64));
        let t = Instant::now();
        let _ = Command::new(&exe)
            .arg("--root")
            .arg(&ctx.root)
            .arg("--store")
            .arg(&ctx.store)
            .args(["check", "--task", task, "--mode", check_mode, "--json"])
            .arg("--source")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        check_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    serve_ms.sort_by(|a, b| a.total_cmp(b));
    check_ms.sort_by(|a, b| a.total_cmp(b));
    Ok((serve_ms, check_ms))
}
