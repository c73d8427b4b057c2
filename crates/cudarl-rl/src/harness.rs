//! [`Harness`], the kernel harness as the episodes' [`Tester`]: compile-only without a GPU;
//! with one, full tests and timing through the GPU worker pools, and the SASS the reward's
//! bonuses read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use cudarl_cuda::compile::CompileError;
use cudarl_cuda::gpu::BenchSpec;
use cudarl_cuda::schedule::{GpuJob, Marks, Scheduler, Step};
use cudarl_cuda::task::TaskSpec;
use cudarl_cuda::verdict::{Baselines, FullOptions, hidden_seeds};
use cudarl_cuda::worker::WorkerPool;
use cudarl_cuda::{Compiler, Rules, Verdict, check_compile_only};
use cudarl_store::{Digest, Store};

use crate::RlError;
use crate::episode::Tester;

/// The harness as a tester.
pub struct Harness {
    /// nvcc settings and the store.
    pub compiler: Compiler,
    /// Static rules.
    pub rules: Rules,
    /// GPU worker pools on the one GPU (empty: compile-only): each tests one candidate at a
    /// time, concurrently, while timing runs alone ([`cudarl_cuda::worker::GpuLock`]).
    pub pools: Vec<WorkerPool>,
    /// Hidden-seed salt.
    pub salt: Vec<u8>,
    /// Public seeds.
    pub public_seeds: Vec<u64>,
    /// Hidden seeds per candidate.
    pub hidden: usize,
    /// Wall-clock limit per GPU job.
    pub wall: Duration,
    /// Naive kernel per task id (the speedup baseline).
    pub naive: std::collections::BTreeMap<String, String>,
    /// Baseline timings per task (shared by harnesses that judge against the same baselines,
    /// e.g. `eval`'s checkpoints).
    pub baselines: std::sync::Arc<std::sync::Mutex<Baselines>>,
    /// `cuobjdump` for SASS, when found.
    pub cuobjdump: Option<PathBuf>,
    /// `cuobjdump -sass` output by shared-object digest (`None`: it failed), filled by
    /// [`Tester::test_many`] for the builds whose SASS can change their reward
    /// ([`crate::reward::sass_decides`]); the same kernel sampled twice is disassembled once.
    pub sass_cache: SassCache,
    /// Every verdict of the run by (task id, BLAKE3 of the code): a candidate sampled again,
    /// in a later step or another group, is answered from it without a rebuild, a GPU run or a
    /// disassembly (its hidden seeds are a function of the same code, so its tests would be the
    /// same; its timing is the first measurement's). Over 100 steps of the default rl-train,
    /// half the candidates were answered so, 0.68 over steps 61-80
    /// (`benchmarks/results/rl_resume_100_steps_h200_2026-11-27.json`).
    pub judged: BTreeMap<(String, [u8; 32]), Verdict>,
    /// Seconds in the harness.
    pub seconds: f64,
    /// Candidates judged, [`Harness::reused`] included.
    pub candidates: usize,
    /// Candidates answered from [`Harness::judged`].
    pub reused: usize,
    /// Where [`Harness::seconds`] went.
    pub phases: HarnessPhases,
    /// Background builds started by [`Tester::prefetch`], by (task id, code): the compile-only
    /// verdict arrives on the channel.
    pub prefetched: BTreeMap<(String, String), Build>,
    /// Candidates whose build was started by a prefetch (overlapping generation).
    pub prefetch_hits: usize,
    /// The Nsight Compute profile pass after each correct candidate's timing
    /// ([`FullOptions::profile`]).
    pub profile: bool,
    /// How correct candidates, the naive kernels and the torch references are timed
    /// ([`FullOptions::timing`]; default [`BenchSpec::default`], a 100 ms budget per kernel).
    pub timing: BenchSpec,
}

/// A build a prefetch started: its compile-only verdict arrives on the channel.
pub type Build = Receiver<Result<Verdict, CompileError>>;

/// SASS text by shared-object digest, shared with the disassembly jobs.
pub type SassCache = std::sync::Arc<std::sync::Mutex<BTreeMap<Digest, Option<String>>>>;

/// Wall-clock seconds of [`Harness::test_many`] by phase. The phases overlap
/// ([`cudarl_cuda::schedule`]): the GPU testers take each candidate as soon as it is built (a
/// build a prefetch started, as it lands) and `cuobjdump` runs beside them on the builds whose
/// verdict needs it, so the harness's seconds are max(compile, the start of the first GPU job +
/// gpu, sass): in the main job's first RL step on an H200, compile 5.9 s and gpu 6.3 s in 8.6 s
/// (`benchmarks/results/main_job_h200_2026-11-27_streamed_prefetch.json`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HarnessPhases {
    /// From the start until the last build was done: prefetched builds still running, static
    /// checks and nvcc for the rest (all cores).
    pub compile: f64,
    /// From the start of the first GPU job to the end of the last (tests on every pool at
    /// once, timing alone under the GPU lock).
    pub gpu: f64,
    /// From the start until the last `cuobjdump -sass` answered (the reward's SASS bonuses, for
    /// the builds whose verdict leaves them open), on the rayon pool as the verdicts arrive; 0
    /// when no build needed its SASS.
    pub sass: f64,
}

/// What a [`Harness`] did between two points: take [`Harness::mark`] before a batch of episodes
/// and [`Harness::since`] after it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HarnessUse {
    /// Candidates judged.
    pub candidates: usize,
    /// Of those, candidates answered from a verdict earlier in the run ([`Harness::judged`]).
    pub reused: usize,
    /// Of those, builds a prefetch had started while the batch still decoded.
    pub prefetch_hits: usize,
    /// Wall-clock seconds in the harness.
    pub seconds: f64,
    /// Those seconds by phase.
    pub phases: HarnessPhases,
}

impl HarnessUse {
    /// The columns rl-train's `metrics` and eval's `summary` share: `harness_seconds` and
    /// `harness_{compile,gpu,sass}_seconds` (float64, s).
    pub fn seconds_json(&self) -> serde_json::Map<String, serde_json::Value> {
        [
            ("harness_seconds", self.seconds),
            ("harness_compile_seconds", self.phases.compile),
            ("harness_gpu_seconds", self.phases.gpu),
            ("harness_sass_seconds", self.phases.sass),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect()
    }
}

impl Harness {
    /// A harness compiling with `compiler`: with `gpu`, full tests on
    /// [`cudarl_cuda::worker::DEFAULT_GPU_WORKERS`] tester pools (one public seed, one hidden
    /// seed drawn with the store's hidden-test salt), else compile-only. `wall` bounds each GPU
    /// job; `naive` holds the speedup baseline per task id.
    ///
    /// # Errors
    /// The hidden-test salt cannot be read or written in the compiler's store (GPU only).
    pub fn new(
        compiler: Compiler,
        gpu: bool,
        wall: Duration,
        naive: BTreeMap<String, String>,
    ) -> Result<Harness, RlError> {
        let cuobjdump = find_cuobjdump(&compiler.nvcc.path);
        let (pools, salt) = match (gpu, &compiler.store) {
            (true, Some(store)) => (
                WorkerPool::testers(cudarl_cuda::worker::DEFAULT_GPU_WORKERS),
                cudarl_cuda::verdict::hidden_salt(store)
                    .map_err(|e| RlError::Failed(e.to_string()))?,
            ),
            (true, None) => {
                return Err(RlError::Failed(
                    "a GPU harness needs a store (the hidden-test salt)".into(),
                ));
            }
            (false, _) => (Vec::new(), Vec::new()),
        };
        Ok(Harness {
            compiler,
            rules: Rules::builtin(),
            pools,
            salt,
            public_seeds: vec![0],
            hidden: 1,
            wall,
            naive,
            baselines: Default::default(),
            cuobjdump,
            sass_cache: Default::default(),
            judged: Default::default(),
            seconds: 0.0,
            candidates: 0,
            reused: 0,
            phases: Default::default(),
            prefetched: Default::default(),
            prefetch_hits: 0,
            profile: false,
            timing: BenchSpec::default(),
        })
    }

    /// `full` when the harness tests on a GPU, else `compile-only` (the `mode` of verdicts).
    pub fn mode(&self) -> &'static str {
        if self.pools.is_empty() {
            "compile-only"
        } else {
            "full"
        }
    }

    /// The counters now, for a later [`Harness::since`].
    pub fn mark(&self) -> HarnessUse {
        HarnessUse {
            candidates: self.candidates,
            reused: self.reused,
            prefetch_hits: self.prefetch_hits,
            seconds: self.seconds,
            phases: self.phases,
        }
    }

    /// What the harness did since `m` (a [`Harness::mark`]).
    pub fn since(&self, m: &HarnessUse) -> HarnessUse {
        HarnessUse {
            candidates: self.candidates - m.candidates,
            reused: self.reused - m.reused,
            prefetch_hits: self.prefetch_hits - m.prefetch_hits,
            seconds: self.seconds - m.seconds,
            phases: HarnessPhases {
                compile: self.phases.compile - m.phases.compile,
                gpu: self.phases.gpu - m.phases.gpu,
                sass: self.phases.sass - m.phases.sass,
            },
        }
    }
}

/// `cuobjdump` beside nvcc, or on `PATH`.
pub fn find_cuobjdump(nvcc: &Path) -> Option<PathBuf> {
    let beside = nvcc.with_file_name("cuobjdump");
    if beside.is_file() {
        return Some(beside);
    }
    cudarl_cuda::nvcc::on_path("cuobjdump")
        .into_iter()
        .find(|f| f.is_file())
}

/// `cuobjdump -sass` of the shared object with digest `so` in the store (`None`: no
/// cuobjdump, no store, or cuobjdump failed), cached by digest. About 0.75 s per call on the
/// H100 machine's CPU, 0.5 s of CPU on a 2-core host (nvdisasm's start-up; a build is about 1 s).
fn sass_of(
    exe: Option<&Path>,
    store: Option<&Store>,
    cache: &SassCache,
    so: Digest,
) -> Option<String> {
    let (exe, store) = (exe?, store?);
    if let Some(s) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&so) {
        return s.clone();
    }
    let mut cmd = Command::new(exe);
    // cuobjdump runs nvdisasm, found on PATH or through NVDISASM_PATH: the one beside it first.
    if let Some(dir) = exe.parent().filter(|d| d.join("nvdisasm").is_file())
        && std::env::var_os("NVDISASM_PATH").is_none()
    {
        cmd.env("NVDISASM_PATH", dir);
    }
    let sass = cmd
        .arg("-sass")
        .arg(store.blob_path(&so))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(so, sass.clone());
    sass
}

/// The digest of a verdict's built shared object, when it compiled.
fn built(v: &Verdict) -> Option<Digest> {
    v.so_hash.filter(|_| v.compiled)
}

impl Tester for Harness {
    fn test(&mut self, task: &TaskSpec, code: &str) -> Result<(Verdict, Option<String>), RlError> {
        Ok(self.test_many(&[(task, code)])?.remove(0))
    }

    fn test_many(
        &mut self,
        items: &[(&TaskSpec, &str)],
    ) -> Result<Vec<(Verdict, Option<String>)>, RlError> {
        let t0 = Instant::now();
        let keys: Vec<(String, [u8; 32])> = items.iter().map(|(t, c)| judged_key(t, c)).collect();
        let fresh: Vec<usize> = (0..items.len())
            .filter(|&i| !self.judged.contains_key(&keys[i]))
            .collect();
        let fresh_items: Vec<(&TaskSpec, &str)> = fresh.iter().map(|&i| items[i]).collect();
        let mut out: Vec<Option<(Verdict, Option<String>)>> = vec![None; items.len()];
        for (i, r) in fresh.iter().zip(self.judge(&fresh_items)?) {
            self.judged.insert(keys[*i].clone(), r.0.clone());
            out[*i] = Some(r);
        }
        let reused = items.len() - fresh.len();
        let sass_cache = self.sass_cache.lock().unwrap_or_else(|e| e.into_inner());
        let out = out
            .into_iter()
            .zip(items)
            .zip(&keys)
            .map(|((r, (_, code)), k)| match r {
                Some(r) => r,
                None => {
                    let v = self.judged[k].clone();
                    let sass = built(&v)
                        .filter(|_| crate::reward::sass_decides(code, &v))
                        .and_then(|so| sass_cache.get(&so).cloned().flatten());
                    (v, sass)
                }
            })
            .collect();
        drop(sass_cache);
        self.reused += reused;
        self.candidates += items.len();
        self.seconds += t0.elapsed().as_secs_f64();
        Ok(out)
    }

    fn prefetch(&mut self, task: &TaskSpec, code: &str) {
        let key = (task.id.clone(), code.to_string());
        if self.prefetched.contains_key(&key) || self.judged.contains_key(&judged_key(task, code)) {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (t, c) = (task.clone(), code.to_string());
        let (rules, compiler) = (self.rules.clone(), self.compiler.clone());
        background().spawn(move || {
            let v = check_compile_only(&t, &c, &rules, &compiler);
            let _ = tx.send(v);
        });
        self.prefetched.insert(key, rx);
    }
}

/// The pool background builds and disassemblies run on, one thread per core this process may
/// use. Not the caller's rayon pool: the harness waits for these jobs on a thread that may be
/// that pool's only one (a stage run with `-j 1`, or pinned to one core), where jobs queued
/// behind the waiting thread would never run.
fn background() -> &'static rayon::ThreadPool {
    static POOL: std::sync::LazyLock<rayon::ThreadPool> = std::sync::LazyLock::new(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("cudarl-build-{i}"))
            .build()
            .expect("the background build pool starts")
    });
    &POOL
}

/// The key of [`Harness::judged`].
fn judged_key(task: &TaskSpec, code: &str) -> (String, [u8; 32]) {
    (task.id.clone(), *blake3::hash(code.as_bytes()).as_bytes())
}

impl Harness {
    /// Judges `items` (none of them in [`Harness::judged`]): builds (those a prefetch started
    /// as they land), GPU tests and timing through the scheduler, and the SASS of the builds
    /// whose reward needs it. Adds to [`Harness::phases`] and [`Harness::prefetch_hits`].
    fn judge(
        &mut self,
        items: &[(&TaskSpec, &str)],
    ) -> Result<Vec<(Verdict, Option<String>)>, RlError> {
        let t0 = Instant::now();
        // Builds a prefetch started are taken as they land: their compile steps wait on threads
        // of their own (a rayon thread blocked on a build queued behind it could deadlock the
        // pool), so the GPU testers start on the first build done, not the last.
        let (waits, waiting) = self.take_prefetched(items);
        let Harness {
            pools,
            public_seeds,
            salt,
            hidden,
            wall,
            naive,
            rules,
            compiler,
            baselines,
            cuobjdump,
            sass_cache,
            phases,
            profile,
            timing,
            ..
        } = self;
        let gpu = !pools.is_empty();
        let sched = Scheduler::new(rules, compiler, baselines.as_ref());
        // SASS for the reward's bonuses, only of builds whose SASS can change the reward
        // ([`crate::reward::sass_decides`]: the gate passed and the source leaves the bonus
        // open), once their verdict is known: a rayon job per such build, on every core while
        // the GPU testers go on. The jobs never wait inside the pool (a pool thread blocked on
        // a channel could starve the builds that feed it); their answers are gathered on this
        // thread once the scheduler is done.
        let (stx, srx) = channel::<(usize, Option<String>, Instant)>();
        let disassemble = |i: usize, v: &Verdict| {
            let Some(so) = built(v).filter(|_| crate::reward::sass_decides(items[i].1, v)) else {
                return;
            };
            let (exe, store, cache) = (
                cuobjdump.clone(),
                compiler.store.clone(),
                sass_cache.clone(),
            );
            let tx = stx.clone();
            background().spawn(move || {
                let sass = sass_of(exe.as_deref(), store.as_ref(), &cache, so);
                let _ = tx.send((i, sass, Instant::now()));
            });
        };
        let compile = |i: usize| -> Result<Step<'_>, CompileError> {
            let (t, c) = items[i];
            let landed = waiting[i]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .and_then(|rx| rx.recv().ok());
            let v = match landed {
                Some(v) => v?,
                None => check_compile_only(t, c, rules, compiler)?,
            };
            if !(v.compiled && gpu) {
                disassemble(i, &v);
                return Ok(Step::Done(v));
            }
            Ok(Step::Gpu(GpuJob {
                spec: t,
                code: c,
                naive: naive.get(&t.id).map(String::as_str),
                opts: FullOptions {
                    public_seeds: public_seeds.clone(),
                    hidden_seeds: hidden_seeds(salt, &t.id, c, *hidden),
                    wall: *wall,
                    bench: true,
                    timing: timing.clone(),
                    time_naive: true,
                    profile: *profile,
                },
            }))
        };
        let judged = sched
            .run(pools, items.len(), &waits, compile, |i, v| {
                disassemble(i, v);
                Ok(())
            })
            .map_err(|e| e.into_caller(|h| h));
        drop(stx);
        let (sass, sass_s) = gather_sass(srx, t0);
        let end = Instant::now();
        let marks = sched.times.snapshot();
        phases.add(&marks, t0, end, sass_s);
        let judged = judged.map_err(|e| RlError::Failed(e.to_string()))?;
        in_item_order(judged, &sass, items.len())
    }

    /// Takes the builds a prefetch started for `items` out of [`Harness::prefetched`] and
    /// counts them in [`Harness::prefetch_hits`]: the indices of the items that have one, and
    /// each item's build (if any) for its compile step to take.
    fn take_prefetched(
        &mut self,
        items: &[(&TaskSpec, &str)],
    ) -> (Vec<usize>, Vec<Mutex<Option<Build>>>) {
        let builds: Vec<Option<Build>> = items
            .iter()
            .map(|(t, c)| self.prefetched.remove(&(t.id.clone(), c.to_string())))
            .collect();
        let waits: Vec<usize> = (0..items.len()).filter(|&i| builds[i].is_some()).collect();
        let waiting: Vec<Mutex<Option<Build>>> = builds.into_iter().map(Mutex::new).collect();
        self.prefetch_hits += waits.len();
        (waits, waiting)
    }
}

impl HarnessPhases {
    /// Adds one batch that started at `t0` and ended at `end`: compile until the last build
    /// was done and gpu from the first GPU job (both from `marks`), and `sass_s` seconds.
    fn add(&mut self, marks: &Marks, t0: Instant, end: Instant, sass_s: f64) {
        self.compile += marks
            .compiled
            .map_or(0.0, |m| m.duration_since(t0).as_secs_f64());
        self.gpu += marks
            .first_gpu
            .map_or(0.0, |f| end.duration_since(f).as_secs_f64());
        self.sass += sass_s;
    }
}

/// The disassembly jobs' answers on `srx` (item, SASS, when it answered): the SASS by item,
/// and the seconds from `t0` until the last answer (0 without any).
fn gather_sass(
    srx: Receiver<(usize, Option<String>, Instant)>,
    t0: Instant,
) -> (BTreeMap<usize, Option<String>>, f64) {
    // Every job holds a sender until it has answered: the channel ends with the last one.
    let (mut sass, mut sass_s) = (BTreeMap::new(), 0.0f64);
    for (i, text, at) in srx {
        sass.insert(i, text);
        sass_s = sass_s.max(at.duration_since(t0).as_secs_f64());
    }
    (sass, sass_s)
}

/// The verdicts of `judged` (item index, verdict) for `n` items in item order, each with its
/// SASS from `sass`.
///
/// # Errors
/// An item without a verdict.
fn in_item_order(
    judged: Vec<(usize, Verdict)>,
    sass: &BTreeMap<usize, Option<String>>,
    n: usize,
) -> Result<Vec<(Verdict, Option<String>)>, RlError> {
    let mut verdicts: Vec<Option<Verdict>> = vec![None; n];
    for (i, v) in judged {
        verdicts[i] = Some(v);
    }
    verdicts
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let v = v.ok_or_else(|| {
                RlError::Failed(format!("the harness gave candidate {i} no verdict"))
            })?;
            Ok((v, sass.get(&i).cloned().flatten()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_streams_to_the_testers_disassembles_only_where_the_reward_needs_it_and_reuses_repeats()
     {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let Some(nvcc) = cudarl_cuda::Nvcc::discover_or_skip(&root) else {
            return;
        };
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let compiler = Compiler {
            nvcc,
            arch: "sm_90".into(),
            timeout: cudarl_cuda::compile::DEFAULT_TIMEOUT,
            store: Some(store),
        };
        let mut h =
            Harness::new(compiler, false, Duration::from_secs(30), Default::default()).unwrap();
        // Two testers on stand-in workers: the GPU path without a GPU.
        let worker = root.join("tests/workers/answers_at_once.sh");
        h.pools = (0..2)
            .map(|_| WorkerPool::new("sh".into(), vec![worker.display().to_string()]))
            .collect();
        let task = TaskSpec::load(&root.join("datasets/tasks/vector_add")).unwrap();
        let naive =
            std::fs::read_to_string(root.join("datasets/tasks/vector_add/naive.cu")).unwrap();
        // Even variants as written (coalesced by their source: no SASS can change their
        // reward); odd ones with a warp shuffle, which only the SASS can confirm.
        let shuffled = naive.replace(
            "out[i] = a[i] + b[i];",
            "float s = a[i] + __shfl_down_sync(0xffffffffu, a[i], 1); out[i] = s - __shfl_down_sync(0xffffffffu, a[i], 1) + b[i];",
        );
        assert_ne!(
            shuffled, naive,
            "the naive kernel's body changed: update this test"
        );
        let codes: Vec<String> = (0..8)
            .map(|i| {
                let base = if i % 2 == 0 { &naive } else { &shuffled };
                format!("{base}\n// variant {i}\n")
            })
            .collect();
        let has_cuobjdump = h.cuobjdump.is_some();
        if !has_cuobjdump {
            eprintln!("SASS not checked: no cuobjdump beside nvcc or on PATH");
        }
        // A watchdog: a scheduler that deadlocks fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let sent = codes.clone();
        // Judged from the only thread of a rayon pool, as a stage run with `-j 1` or pinned to
        // one core judges: the background builds must not queue behind it.
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        std::thread::spawn(move || {
            one.install(|| {
                // Some builds started as prefetches (as while a batch decodes), the rest cold.
                for c in &sent[..3] {
                    h.prefetch(&task, c);
                }
                let items: Vec<(&TaskSpec, &str)> =
                    sent.iter().map(|c| (&task, c.as_str())).collect();
                let first = h.test_many(&items);
                let (hits, phases) = (h.prefetch_hits, h.phases);
                // The same candidates again (a later step): answered from the run's verdicts, with
                // testers that would fail any job and no build prefetched.
                h.pools = vec![WorkerPool::new("false".into(), vec![])];
                for c in &sent {
                    h.prefetch(&task, c);
                }
                let prefetched = h.prefetched.len();
                let again = h.test_many(&items);
                let reuse = (h.reused, h.candidates, prefetched, h.phases == phases);
                let _ = tx.send((first, again, hits, reuse, h.sass_cache));
            })
        });
        let (out, again, hits, reuse, cache) = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("test_many answered within 300 s");
        let out = out.unwrap();
        assert_eq!(out.len(), 8);
        assert_eq!(hits, 3, "the prefetched builds were used");
        assert_eq!(
            again.unwrap(),
            out,
            "a candidate judged earlier in the run gets the same verdict and SASS"
        );
        assert_eq!(
            reuse,
            (8, 16, 0, true),
            "(reused, candidates, builds prefetched, phases unchanged) on the second batch"
        );
        for (k, (v, sass)) in out.iter().enumerate() {
            assert!(v.compiled, "{v:?}");
            assert_eq!(v.mode, "full", "tested by a GPU tester: {v:?}");
            let needs = crate::reward::sass_decides(&codes[k], v);
            assert_eq!(needs, k % 2 == 1, "variant {k}: {v:?}");
            if !needs {
                assert!(sass.is_none(), "variant {k} was disassembled for nothing");
            } else if has_cuobjdump {
                let s = sass
                    .as_deref()
                    .expect("SASS of a build whose reward needs it");
                assert!(s.contains("SHFL"), "{s}");
            }
        }
        // Exactly the builds that needed it went through cuobjdump (the cache holds one entry
        // per disassembled build; equal builds share one).
        let needed: std::collections::BTreeSet<Digest> = out
            .iter()
            .enumerate()
            .filter(|(k, (v, _))| crate::reward::sass_decides(&codes[*k], v))
            .filter_map(|(_, (v, _))| v.so_hash)
            .collect();
        let disassembled: std::collections::BTreeSet<Digest> =
            cache.lock().unwrap().keys().copied().collect();
        if has_cuobjdump {
            assert_eq!(disassembled, needed);
        } else {
            assert!(disassembled.is_empty());
        }
    }
}
