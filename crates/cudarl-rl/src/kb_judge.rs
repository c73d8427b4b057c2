//! The KernelBench judge of `eval`, `rl-train`, `optimize`, `check` and `serve` ([`KbJudge`]): native candidates for the curriculum's
//! KernelBench problems ([`crate::kernelbench::KbTask`]) built against the launcher
//! `kb-specs` derived ([`cudarl_cuda::torchfmt::build_kb_native`], no torch headers: about a
//! second of nvcc, on every core at once), then, with a GPU, run by the sandboxed Python worker
//! against `testgen`'s recorded tests (public and hidden seeds at test sizes) and at the problem's
//! own sizes, timed against the reference `Model` in torch eager
//! ([`cudarl_cuda::torchfmt::run`]): the judge `check --task kb/...` and `serve` use. The stages build it from their inputs
//! (`crates/cudarl-stages/src/kb_judge.rs`).
//!
//! On the GPU a candidate is judged in two passes. The first runs the tests only, on
//! `gpu_workers` Python workers side by side sharing the GPU ([`cudarl_cuda::worker::GpuLock`],
//! shared), each build handed to the first free worker as it lands
//! ([`cudarl_cuda::worker::stream_to`]); most candidates end there, since starting a sandboxed
//! runner (interpreter, torch, CUDA) costs seconds of CPU each, and one wrong at its recorded tests
//! skips the problem's own sizes (`TorchRunOptions::full_size_after_failure`, so its failure is
//! `wrong_answer`, never `shape_specialized`). A candidate that passed is run
//! again from the start with timing, on one worker holding the GPU alone: its verdict is that
//! second run's, so a candidate that passes once and fails when timed is not correct.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cudarl_cuda::native_abi::KbNative;
use cudarl_cuda::torchfmt::{KbProblem, TorchRunOptions};
use cudarl_cuda::worker::WorkerPool;
use cudarl_cuda::{Compiler, Rules, Verdict};
use rayon::prelude::*;

use crate::RlError;
use crate::episode::Tester;
use crate::kernelbench::KbTask;

/// What judging cost so far: candidates judged (builds, not answers from the cache) and
/// seconds (wall) of the builds and of the GPU runs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KbJudgeUse {
    /// Candidates built.
    pub candidates: usize,
    /// Seconds building (all cores at once): wall until the last build of each batch landed.
    pub compile_seconds: f64,
    /// Seconds of the GPU runs (tests on every worker, then timing one candidate at a time):
    /// wall from each batch's first GPU run to its end, overlapping `compile_seconds`.
    pub gpu_seconds: f64,
}

/// Judges native candidates for KernelBench problems (see the module docs).
pub struct KbJudge {
    parts: Parts,
    /// The GPU and its Python worker pools (the first also times, and keeps each problem's
    /// `torch.compile` timing); `None`: compile-only verdicts.
    gpu: Option<(cudarl_cuda::gpu::GpuInfo, Vec<WorkerPool>)>,
    /// Verdicts by (problem id, BLAKE3 of the code): a candidate sampled again is answered from
    /// here.
    judged: BTreeMap<(String, [u8; 32]), Verdict>,
    /// What judging cost so far.
    pub used: KbJudgeUse,
}

/// What judging reads, shared by the build threads and the GPU workers' threads.
struct Parts {
    compiler: Compiler,
    rules: Rules,
    abis: BTreeMap<String, KbNative>,
    problems: BTreeMap<String, KbProblem>,
    opts: TorchRunOptions,
}

/// A build verdict and, when it compiled, the candidate the Python judge loads, for
/// `items[index]`.
type Built = (usize, Verdict, Option<serde_json::Value>);

impl KbJudge {
    /// A judge for `problems` with launchers `abis` (problem id -> ABI). With `gpu`,
    /// `gpu_workers` Python workers (at least one) run candidates against the problems' recorded
    /// tests under `wall` per worker step, and the correct ones are timed against torch eager and
    /// `torch.compile`; without, verdicts are compile-only.
    pub fn new(
        compiler: Compiler,
        abis: BTreeMap<String, KbNative>,
        problems: BTreeMap<String, KbProblem>,
        gpu: Option<cudarl_cuda::gpu::GpuInfo>,
        (root, gpu_workers): (&std::path::Path, usize),
        wall: Duration,
    ) -> KbJudge {
        let store = compiler.store.clone();
        KbJudge {
            parts: Parts {
                compiler,
                rules: Rules::builtin(),
                abis,
                problems,
                opts: TorchRunOptions {
                    wall,
                    bench: Some(cudarl_cuda::gpu::BenchSpec::default()),
                    torch_compile: true,
                    root: root.to_path_buf(),
                    store,
                    profile: true,
                    full_size_after_failure: true,
                },
            },
            gpu: gpu.map(|g| {
                let pools = (0..gpu_workers.max(1))
                    .map(|_| cudarl_cuda::torchfmt::pool(root))
                    .collect();
                (g, pools)
            }),
            judged: BTreeMap::new(),
            used: KbJudgeUse::default(),
        }
    }
}

impl Parts {
    /// Builds `items[i]` against its launcher.
    fn build(&self, items: &[(&KbTask, &str)], i: usize) -> Result<Built, RlError> {
        let (task, code) = items[i];
        let abi = self.abis.get(&task.id).ok_or_else(|| {
            RlError::Failed(format!("`{}` has no native launcher in kb-specs", task.id))
        })?;
        let (v, cand) = cudarl_cuda::torchfmt::build_kb_native(
            &task.id,
            code,
            abi,
            &self.rules,
            &self.compiler,
        )
        .map_err(|e| RlError::Failed(e.to_string()))?;
        Ok((i, v, cand))
    }

    /// The two GPU passes of the module docs over `items[i]`, `i` in `fresh`: builds streamed to
    /// the first free worker of `pools` for the tests, then the correct ones timed one at a time
    /// on the first pool. Adds to `used`: `compile_seconds` until the last build landed,
    /// `gpu_seconds` from the first GPU run to the end (the two overlap).
    fn judge_on_gpu(
        &self,
        items: &[(&KbTask, &str)],
        fresh: &[usize],
        (g, pools): (&cudarl_cuda::gpu::GpuInfo, &mut [WorkerPool]),
        used: &mut KbJudgeUse,
    ) -> Result<Vec<(usize, Verdict)>, RlError> {
        use std::sync::Mutex;
        let t0 = Instant::now();
        let (built_at, gpu_from) = (Mutex::new(0.0f64), Mutex::new(None::<f64>));
        let tests_only = TorchRunOptions {
            bench: None,
            profile: false,
            // A candidate wrong at its recorded tests is not run at its own sizes.
            full_size_after_failure: false,
            ..self.opts.clone()
        };
        let first = cudarl_cuda::worker::stream_to(
            pools,
            fresh.len(),
            &[],
            |k| {
                let b = self.build(items, fresh[k]);
                let mut at = built_at.lock().unwrap_or_else(|e| e.into_inner());
                *at = at.max(t0.elapsed().as_secs_f64());
                b.map(Some)
            },
            |pool, (i, v, cand): Built| {
                let problem = self.problems.get(&items[i].0.id);
                let (Some(cand), Some(p)) = (cand, problem.filter(|p| !p.tests.is_empty())) else {
                    return Ok((i, v, None));
                };
                gpu_from
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(t0.elapsed().as_secs_f64());
                let tested = cudarl_cuda::torchfmt::run(
                    v.clone(),
                    &cand,
                    p,
                    pool,
                    &tests_only,
                    Some(g.clone()),
                );
                // A correct candidate is judged again, timed: its build verdict goes with it.
                Ok::<_, RlError>(if tested.correct == Some(true) {
                    (i, v, Some(cand))
                } else {
                    (i, tested, None)
                })
            },
        )?;
        let mut out = Vec::with_capacity(first.len());
        for (i, v, again) in first {
            let v = match (again, self.problems.get(&items[i].0.id)) {
                (Some(cand), Some(p)) => cudarl_cuda::torchfmt::run(
                    v,
                    &cand,
                    p,
                    &mut pools[0],
                    &self.opts,
                    Some(g.clone()),
                ),
                _ => v,
            };
            out.push((i, v));
        }
        used.compile_seconds += *built_at.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(from) = *gpu_from.lock().unwrap_or_else(|e| e.into_inner()) {
            used.gpu_seconds += t0.elapsed().as_secs_f64() - from;
        }
        Ok(out)
    }
}

impl Tester<KbTask> for KbJudge {
    fn test(&mut self, task: &KbTask, code: &str) -> Result<(Verdict, Option<String>), RlError> {
        Ok(self.test_many(&[(task, code)])?.remove(0))
    }

    fn test_many(
        &mut self,
        items: &[(&KbTask, &str)],
    ) -> Result<Vec<(Verdict, Option<String>)>, RlError> {
        let keys: Vec<(String, [u8; 32])> = items
            .iter()
            .map(|(t, c)| (t.id.clone(), *blake3::hash(c.as_bytes()).as_bytes()))
            .collect();
        // Each code not judged before, once (the same code twice in one batch is judged once).
        let mut seen = std::collections::BTreeSet::new();
        let fresh: Vec<usize> = (0..items.len())
            .filter(|&i| !self.judged.contains_key(&keys[i]) && seen.insert(keys[i].clone()))
            .collect();
        let parts = &self.parts;
        let judged = match self.gpu.as_mut() {
            None => {
                let t0 = Instant::now();
                let built = fresh
                    .par_iter()
                    .map(|&i| parts.build(items, i).map(|(i, v, _)| (i, v)))
                    .collect::<Result<Vec<_>, RlError>>();
                self.used.compile_seconds += t0.elapsed().as_secs_f64();
                built
            }
            Some((g, pools)) => parts.judge_on_gpu(items, &fresh, (g, pools), &mut self.used),
        }?;
        self.used.candidates += judged.len();
        for (i, v) in judged {
            self.judged.insert(keys[i].clone(), v);
        }
        Ok(keys
            .iter()
            .map(|k| (self.judged[k].clone(), None))
            .collect())
    }
}

impl KbJudge {
    /// This judge without the `torch.compile` baseline (speed only against torch eager): no
    /// Inductor compile per problem, which costs seconds to a minute the first time a problem is
    /// timed on a GPU and torch (`rl-train`'s reward uses the eager speedup alone).
    pub fn without_torch_compile(mut self) -> KbJudge {
        self.parts.opts.torch_compile = false;
        self
    }

    /// Whether problem `id` can be judged: it has a native launcher and, on a GPU, recorded
    /// tests.
    pub fn judges(&self, id: &str) -> bool {
        self.parts.abis.contains_key(id)
            && (self.gpu.is_none()
                || self
                    .parts
                    .problems
                    .get(id)
                    .is_some_and(|p| !p.tests.is_empty()))
    }

    /// The native launcher of problem `id`.
    pub fn abi(&self, id: &str) -> Option<&KbNative> {
        self.parts.abis.get(id)
    }

    /// Problem `id`: its PyTorch source and, on a GPU, its recorded tests.
    pub fn problem(&self, id: &str) -> Option<&KbProblem> {
        self.parts.problems.get(id)
    }

    /// The verdict on `code` for problem `id`, if it was judged.
    pub fn verdict(&self, id: &str, code: &str) -> Option<&Verdict> {
        self.judged
            .get(&(id.to_string(), *blake3::hash(code.as_bytes()).as_bytes()))
    }
}
