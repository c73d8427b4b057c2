//! [`Harness`], the kernel harness as the episodes' [`Tester`]: compile-only without a GPU;
//! with one, full tests and timing through the GPU worker pools, and the SASS the reward's
//! bonuses read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use cudarl_cuda::task::TaskSpec;
use cudarl_cuda::verdict::{Baselines, FullOptions, check_full, hidden_seeds};
use cudarl_cuda::worker::{WorkerPool, drain_on};
use cudarl_cuda::{Compiler, Rules, Verdict, check_compile_only};
use cudarl_store::{Digest, Store};
use rayon::prelude::*;

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
    /// Baseline timings per task.
    pub baselines: std::sync::Mutex<Baselines>,
    /// `cuobjdump` for SASS, when found.
    pub cuobjdump: Option<PathBuf>,
    /// `cuobjdump -sass` output by shared-object digest (`None`: it failed), filled by
    /// prefetches while the batch still decodes and by [`Tester::test_many`]; the same kernel
    /// sampled twice is disassembled once.
    pub sass_cache: SassCache,
    /// Seconds in the harness.
    pub seconds: f64,
    /// Candidates judged.
    pub candidates: usize,
    /// Where [`Harness::seconds`] went.
    pub phases: HarnessPhases,
    /// Background builds started by [`Tester::prefetch`], by (task id, code): the compile-only
    /// verdict arrives on the channel.
    pub prefetched: BTreeMap<(String, String), Receiver<Result<Verdict, String>>>,
    /// Candidates whose build was started by a prefetch (overlapping generation).
    pub prefetch_hits: usize,
    /// The Nsight Compute profile pass after each correct candidate's timing
    /// ([`FullOptions::profile`]).
    pub profile: bool,
}

/// SASS text by shared-object digest, shared with background prefetches.
pub type SassCache = std::sync::Arc<std::sync::Mutex<BTreeMap<Digest, Option<String>>>>;

/// Wall-clock seconds of [`Harness::test_many`] by phase: `compile`, then `gpu` and `sass`
/// side by side (the harness's seconds are about compile + max(gpu, sass)).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HarnessPhases {
    /// Static checks and nvcc not already done by a prefetch (all cores), plus waiting for
    /// prefetched builds still running (a prefetch disassembles its build before it answers).
    pub compile: f64,
    /// GPU worker jobs (tests on every pool at once, timing alone under the GPU lock).
    pub gpu: f64,
    /// `cuobjdump -sass` of each compiled candidate a prefetch had not disassembled (the
    /// reward's SASS bonuses), on the rayon pool while the GPU workers test.
    pub sass: f64,
}

/// What a [`Harness`] did between two points: take [`Harness::mark`] before a batch of episodes
/// and [`Harness::since`] after it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HarnessUse {
    /// Candidates judged.
    pub candidates: usize,
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
    ) -> Result<Harness, String> {
        let cuobjdump = find_cuobjdump(&compiler.nvcc.path);
        let (pools, salt) = match (gpu, &compiler.store) {
            (true, Some(store)) => (
                WorkerPool::testers(cudarl_cuda::worker::DEFAULT_GPU_WORKERS),
                cudarl_cuda::verdict::hidden_salt(store).map_err(|e| e.to_string())?,
            ),
            (true, None) => return Err("a GPU harness needs a store (the hidden-test salt)".into()),
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
            seconds: 0.0,
            candidates: 0,
            phases: Default::default(),
            prefetched: Default::default(),
            prefetch_hits: 0,
            profile: false,
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
            prefetch_hits: self.prefetch_hits,
            seconds: self.seconds,
            phases: self.phases,
        }
    }

    /// What the harness did since `m` (a [`Harness::mark`]).
    pub fn since(&self, m: &HarnessUse) -> HarnessUse {
        HarnessUse {
            candidates: self.candidates - m.candidates,
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

/// `cuobjdump -sass` of a compiled candidate's shared object in the store (`None`: not
/// compiled, no cuobjdump, no shared object, or cuobjdump failed). About 0.75 s per call on
/// the H100 machine's CPU.
fn sass_of(
    exe: Option<&Path>,
    store: Option<&Store>,
    cache: &SassCache,
    v: &Verdict,
) -> Option<String> {
    if !v.compiled {
        return None;
    }
    let (exe, h, store) = (exe?, v.so_hash?, store?);
    if let Some(s) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&h) {
        return s.clone();
    }
    let sass = Command::new(exe)
        .arg("-sass")
        .arg(store.blob_path(&h))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(h, sass.clone());
    sass
}

impl Tester for Harness {
    fn test(&mut self, task: &TaskSpec, code: &str) -> Result<(Verdict, Option<String>), String> {
        Ok(self.test_many(&[(task, code)])?.remove(0))
    }

    fn test_many(
        &mut self,
        items: &[(&TaskSpec, &str)],
    ) -> Result<Vec<(Verdict, Option<String>)>, String> {
        let t0 = Instant::now();
        // Static checks and nvcc on every core first (builds a prefetch started are waited
        // for); the GPU then runs the compiled ones (their builds are compile-cache hits).
        let waiting: Vec<Option<Receiver<Result<Verdict, String>>>> = items
            .iter()
            .map(|(t, c)| self.prefetched.remove(&(t.id.clone(), c.to_string())))
            .collect();
        self.prefetch_hits += waiting.iter().filter(|w| w.is_some()).count();
        // Waited for here, outside the pool: a pool thread blocked on a build still queued
        // behind it could deadlock the pool.
        let done: Vec<Option<Result<Verdict, String>>> = waiting
            .into_iter()
            .map(|w| w.and_then(|rx| rx.recv().ok()))
            .collect();
        let pre: Vec<Verdict> = items
            .par_iter()
            .zip(done)
            .map(|((t, c), d)| match d {
                Some(v) => v,
                None => {
                    check_compile_only(t, c, &self.rules, &self.compiler).map_err(|e| e.to_string())
                }
            })
            .collect::<Result<_, _>>()?;
        let t_gpu = Instant::now();
        self.phases.compile += t_gpu.duration_since(t0).as_secs_f64();
        let mut verdicts: Vec<Verdict> = pre;
        let on_gpu: Vec<usize> = (0..items.len())
            .filter(|&i| verdicts[i].compiled && !self.pools.is_empty())
            .collect();
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
            ..
        } = self;
        // SASS for the reward's bonuses (one cuobjdump process per compiled candidate not
        // disassembled yet, on every core; one after another they were most of the harness's
        // time: 135 of 146 s in an H100 eval of 180 candidates) while the GPU workers test:
        // the build is the same (compile cache), so its .so digest is known already.
        let (full, (sass, sass_s)) = std::thread::scope(|sc| {
            let pre = &verdicts;
            let (exe, store) = (cuobjdump.as_deref(), compiler.store.as_ref());
            let disassembly = sc.spawn(move || {
                let t = Instant::now();
                let sass: Vec<Option<String>> = pre
                    .par_iter()
                    .map(|v| sass_of(exe, store, sass_cache, v))
                    .collect();
                (sass, t.elapsed().as_secs_f64())
            });
            // Tests on every worker, each candidate that passed timed in its tester's runner once
            // that tester holds the GPU alone.
            let full = drain_on(pools, on_gpu.into_iter(), |pool, i| {
                let (t, c) = items[i];
                let opts = FullOptions {
                    public_seeds: public_seeds.clone(),
                    hidden_seeds: hidden_seeds(salt, &t.id, c, *hidden),
                    wall: *wall,
                    bench: true,
                    time_naive: true,
                    profile: *profile,
                };
                let naive = naive.get(&t.id).map(String::as_str);
                check_full(t, c, naive, rules, compiler, pool, &opts, baselines)
                    .map(|v| (i, v))
                    .map_err(|e| e.to_string())
            });
            phases.gpu += t_gpu.elapsed().as_secs_f64();
            let sass = disassembly
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            (full, sass)
        });
        for (i, v) in full? {
            verdicts[i] = v;
        }
        phases.sass += sass_s;
        let out: Vec<(Verdict, Option<String>)> = verdicts.into_iter().zip(sass).collect();
        self.seconds += t0.elapsed().as_secs_f64();
        self.candidates += items.len();
        Ok(out)
    }

    fn prefetch(&mut self, task: &TaskSpec, code: &str) {
        let key = (task.id.clone(), code.to_string());
        if self.prefetched.contains_key(&key) {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (t, c) = (task.clone(), code.to_string());
        let (rules, compiler) = (self.rules.clone(), self.compiler.clone());
        let (exe, cache) = (self.cuobjdump.clone(), self.sass_cache.clone());
        rayon::spawn(move || {
            let v = check_compile_only(&t, &c, &rules, &compiler).map_err(|e| e.to_string());
            // Its SASS too, while the batch still decodes.
            if let Ok(v) = &v {
                sass_of(exe.as_deref(), compiler.store.as_ref(), &cache, v);
            }
            let _ = tx.send(v);
        });
        self.prefetched.insert(key, rx);
    }
}
