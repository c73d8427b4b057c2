//! The KernelBench judge of `eval` ([`KbJudge`]): native candidates for the curriculum's
//! KernelBench problems ([`cudarl_rl::kernelbench::KbTask`]) built against the launcher
//! `kb-specs` derived ([`cudarl_cuda::torchfmt::build_kb_native`], no torch headers: about a
//! second of nvcc, on every core at once), then, with a GPU, run by the sandboxed Python worker
//! against `testgen`'s recorded tests (public and hidden seeds at test sizes) and at the problem's
//! own sizes, timed against the reference `Model` in torch eager
//! ([`cudarl_cuda::torchfmt::run`]): the judge `check --task kb/...` and `serve` use.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cudarl_cuda::torchfmt::{KbNative, KbProblem, TorchRunOptions};
use cudarl_cuda::worker::WorkerPool;
use cudarl_cuda::{Compiler, Rules, Verdict};
use cudarl_rl::episode::Tester;
use cudarl_rl::kernelbench::KbTask;
use rayon::prelude::*;

/// What judging cost so far: candidates judged (builds, not answers from the cache) and
/// seconds (wall) of the builds and of the GPU runs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KbJudgeUse {
    /// Candidates built.
    pub candidates: usize,
    /// Seconds building (all cores at once).
    pub compile_seconds: f64,
    /// Seconds of the GPU runs (tests and timing, one candidate at a time).
    pub gpu_seconds: f64,
}

/// Judges native candidates for KernelBench problems (see the module docs).
pub struct KbJudge {
    compiler: Compiler,
    rules: Rules,
    abis: BTreeMap<String, KbNative>,
    problems: BTreeMap<String, KbProblem>,
    /// The GPU and its worker pool; `None`: compile-only verdicts.
    gpu: Option<(cudarl_cuda::gpu::GpuInfo, WorkerPool)>,
    opts: TorchRunOptions,
    /// Verdicts by (problem id, BLAKE3 of the code): a candidate sampled again is answered from
    /// here.
    judged: BTreeMap<(String, [u8; 32]), Verdict>,
    /// What judging cost so far.
    pub used: KbJudgeUse,
}

impl KbJudge {
    /// A judge for `problems` with launchers `abis` (problem id -> ABI). With `gpu`, the worker
    /// pool runs candidates against the problems' recorded tests under `wall` per worker step,
    /// timed against torch eager; without, verdicts are compile-only.
    pub fn new(
        compiler: Compiler,
        abis: BTreeMap<String, KbNative>,
        problems: BTreeMap<String, KbProblem>,
        gpu: Option<cudarl_cuda::gpu::GpuInfo>,
        root: &std::path::Path,
        wall: Duration,
    ) -> KbJudge {
        KbJudge {
            compiler,
            rules: Rules::builtin(),
            abis,
            problems,
            gpu: gpu.map(|g| (g, cudarl_cuda::pyworker::pool(root))),
            opts: TorchRunOptions {
                wall,
                bench: Some(cudarl_cuda::gpu::BenchSpec::default()),
                torch_compile: true,
                root: root.to_path_buf(),
            },
            judged: BTreeMap::new(),
            used: KbJudgeUse::default(),
        }
    }
}

impl Tester<KbTask> for KbJudge {
    fn test(&mut self, task: &KbTask, code: &str) -> Result<(Verdict, Option<String>), String> {
        Ok(self.test_many(&[(task, code)])?.remove(0))
    }

    fn test_many(
        &mut self,
        items: &[(&KbTask, &str)],
    ) -> Result<Vec<(Verdict, Option<String>)>, String> {
        let keys: Vec<(String, [u8; 32])> = items
            .iter()
            .map(|(t, c)| (t.id.clone(), *blake3::hash(c.as_bytes()).as_bytes()))
            .collect();
        let fresh: Vec<usize> = (0..items.len())
            .filter(|&i| !self.judged.contains_key(&keys[i]))
            .collect();
        let t0 = Instant::now();
        let (compiler, rules, abis) = (&self.compiler, &self.rules, &self.abis);
        let built: Vec<Result<(Verdict, Option<serde_json::Value>), String>> = fresh
            .par_iter()
            .map(|&i| {
                let (task, code) = items[i];
                let abi = abis
                    .get(&task.id)
                    .ok_or_else(|| format!("`{}` has no native launcher in kb-specs", task.id))?;
                cudarl_cuda::torchfmt::build_kb_native(&task.id, code, abi, rules, compiler)
                    .map_err(|e| e.to_string())
            })
            .collect();
        self.used.compile_seconds += t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for (&i, b) in fresh.iter().zip(built) {
            let (v, cand) = b?;
            self.used.candidates += 1;
            let v = match (cand, &mut self.gpu, self.problems.get(&items[i].0.id)) {
                (Some(cand), Some((g, pool)), Some(p)) if !p.tests.is_empty() => {
                    cudarl_cuda::torchfmt::run(v, &cand, p, pool, &self.opts, Some(g.clone()))
                }
                _ => v,
            };
            self.judged.insert(keys[i].clone(), v);
        }
        self.used.gpu_seconds += t1.elapsed().as_secs_f64();
        Ok(keys
            .iter()
            .map(|k| (self.judged[k].clone(), None))
            .collect())
    }
}
