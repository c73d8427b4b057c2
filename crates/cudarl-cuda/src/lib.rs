//! cudarl-cuda: the kernel harness (docs/architecture.md, "The judge and the runner").
//!
//! This crate builds without a GPU or CUDA toolkit: compiling needs only `nvcc` (found at run
//! time, see [`nvcc`]), and on a machine without a GPU every verdict is compile-only
//! (`executed = false`), never faked.
//!
//! - [`nvcc`]: discovery and version.
//! - [`compile`]: candidate + shim -> shared object (SASS for one arch), time limit,
//!   diagnostics, resources, compile cache.
//! - [`static_check`]: data-driven safety rules run before compiling.
//! - [`inspect`]: checks on what was built (preprocessed text, host object, PTX).
//! - [`extension_object`]: what a built torch extension imports from torch.
//! - [`profile`]: the optional Nsight Compute profile pass.
//! - [`standin`]: torch ops standing in for a torch-format kernel, from the kernels that ran.
//! - [`runner`]: the sandboxed runner process a candidate runs in, and its protocol.
//! - [`expr`]: reference expressions (task data) evaluated with libtorch.
//! - [`task`]: task specs (signature, sizes, shapes, tolerances, byte/FLOP counts).
//! - [`verdict`]: the verdict of `check` and `validate`.
//! - [`schedule`]: compile on every core, test on the GPU testers, time in the tester or in
//!   batches: how `validate`, RL rollouts and `eval` judge many candidates.
//! - [`torchfmt`]: torch-format candidates (KernelBench `ModelNew`, SakanaAI extensions).
//! - [`pyworker`]: the Python worker process (`python/cudarl_worker.py`).

pub mod compile;
pub mod diag;
pub mod expr;
pub mod extension_object;
pub mod gpu;
pub mod inspect;
pub mod native_abi;
pub mod nvcc;
pub mod profile;
pub mod pyworker;
pub mod runner;
pub mod schedule;
pub mod standin;
pub mod static_check;
pub mod task;
pub mod torchfmt;
pub mod torchsplit;
pub mod verdict;
pub mod worker;

pub use compile::{CompileOutput, Compiler};
pub use nvcc::Nvcc;
pub use static_check::Rules;
pub use task::{Task, TaskSpec, load_tasks};
pub use verdict::{Verdict, check_compile_only};

/// A companion binary of `cudarl-pipe`: `$env` if set, else `name` beside the running
/// executable (or one level up, for test binaries in `target/<profile>/deps/`), else `name`
/// on `PATH`.
pub fn sibling_exe(env: &str, name: &str) -> std::path::PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return std::path::PathBuf::from(p);
    }
    if let Ok(me) = std::env::current_exe() {
        for dir in me.ancestors().skip(1).take(2) {
            let p = dir.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    std::path::PathBuf::from(name)
}
