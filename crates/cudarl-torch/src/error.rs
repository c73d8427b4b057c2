//! The judge's own errors: what failed on the judge's side of a verdict (never the candidate's
//! fault; a job's answer carries one as `judge_error`, see `cudarl_cuda::gpu::RunResult`).

use cudarc::driver::sys;

/// Why the judge could not do its part of a job.
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    /// libtorch failed (out of memory, a shape or dtype it refuses), with libtorch's message.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    /// The CUDA driver failed through cudarc (context, events, copies).
    #[error(transparent)]
    Driver(#[from] cudarc::driver::DriverError),
    /// A raw driver call (`call`, e.g. `cuIpcGetMemHandle`) returned `code`.
    #[error("{call}: {code:?}")]
    Call {
        /// The driver function.
        call: &'static str,
        /// What it returned.
        code: sys::CUresult,
    },
    /// A shape formula of the task has no value for the sizes ([`cudarl_cuda::task::eval_formula`]).
    #[error(transparent)]
    Formula(#[from] cudarl_cuda::task::FormulaError),
    /// The task cannot be judged as its spec is written: an output without a reference or with
    /// one that does not parse, an element type the runner does not support, a shape larger
    /// than the arena it was laid out for.
    #[error("{0}")]
    Task(String),
    /// The machine cannot judge: no GPU driver, or the judge's stream did not resume after a
    /// window.
    #[error("{0}")]
    Machine(String),
}

/// `Ok` where the driver call returned `CUDA_SUCCESS`, else [`JudgeError::Call`].
///
/// # Errors
/// Any other result code.
pub(crate) fn cu(code: sys::CUresult, call: &'static str) -> Result<(), JudgeError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(JudgeError::Call { call, code })
    }
}
