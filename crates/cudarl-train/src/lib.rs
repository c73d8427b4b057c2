//! Models and training for cudarl-pipe (docs/architecture.md, "Training"): a Qwen2-architecture
//! decoder in tch that loads and saves the Hugging Face layout, and batched generation with a KV
//! cache and per-token log-probabilities, BPE tokenizers with the ChatML template, and causal-LM
//! training with a loss mask (pretraining and SFT).

pub mod adamw;
pub mod agent;
mod bench_decode;
pub mod config;
pub mod cuda_graph;
pub mod decode;
pub mod fused_adamw;
pub mod generate;
pub mod job;
pub mod model;
pub mod rl;
pub mod rl_serve;
pub mod score;
pub mod tokenizer;
pub mod train;

pub use agent::{Completion, Role, TrainableAgent};
pub use config::Qwen2Config;
pub use generate::{DecodePath, Finish, Generation, PREFILL_BYTES, SampleParams, generate};
pub use model::{KvCache, Qwen2, StaticKv, set_cudnn_attention};
pub use tokenizer::{ChatMessage, ChatTokenizer};
pub use train::{Example, Precision, StepMetrics, TrainConfig, train_lm};

/// This process's share of the GPU while it runs kernels there: the machine-wide lock of
/// [`cudarl_cuda::worker::GpuLock`] held shared (beside the harness's test workers and other
/// trainers) and dropped after a device synchronize, so the harness's timing, which holds it
/// alone, never overlaps this process's kernels. Taken per training step, per `serve` request
/// and per sampling batch: a stage that trains (`pretrain`) can run beside `validate`, and RL
/// runs beside each other, with every timing still alone on the GPU (a timing waits for the
/// step or request in flight). Holds nothing on the CPU.
#[derive(Debug)]
pub struct GpuShare {
    dev: tch::Device,
    _lock: Option<cudarl_cuda::worker::GpuLock>,
}

impl GpuShare {
    /// Waits for the GPU behind `dev` (lock id [`cudarl_cuda::worker::GpuLock::visible_id`];
    /// a waiting timer goes first) and holds it shared until dropped.
    ///
    /// # Errors
    /// [`ModelError::Io`] when the lock file cannot be opened or locked.
    pub fn hold(dev: tch::Device) -> Result<GpuShare, ModelError> {
        let lock = match dev {
            tch::Device::Cuda(_) => {
                let id = cudarl_cuda::worker::GpuLock::visible_id();
                Some(
                    cudarl_cuda::worker::GpuLock::acquire_shared(&id)
                        .map_err(|e| ModelError::Io(format!("GPU lock `{id}`"), e))?,
                )
            }
            _ => None,
        };
        Ok(GpuShare { dev, _lock: lock })
    }
}

impl Drop for GpuShare {
    fn drop(&mut self) {
        // Before the lock goes (fields drop after this): every kernel queued under it is done.
        if let tch::Device::Cuda(i) = self.dev {
            tch::Cuda::synchronize(i as i64);
        }
    }
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A bad `config.json` (file and what is wrong).
    #[error("{file}: {message}")]
    Config {
        /// The file.
        file: String,
        /// What is wrong, naming the key.
        message: String,
    },
    /// Missing, unexpected or misshapen weights (file and tensor).
    #[error("{file}: {message}")]
    Weights {
        /// The file.
        file: String,
        /// What is wrong, naming the tensor.
        message: String,
    },
    /// Reading or writing a file.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// Training, loading or using a tokenizer.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Bad generation parameters.
    #[error("generate: {0}")]
    Generate(String),
    /// libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// Tests that seed libtorch's global generator and draw from it take turns: `cargo test` runs
/// tests as threads of one process, and a draw in one thread moves another's seeded sequence.
#[cfg(test)]
pub(crate) static TORCH_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`TORCH_RNG`] (also after a test that held it panicked).
#[cfg(test)]
pub(crate) fn torch_rng() -> std::sync::MutexGuard<'static, ()> {
    TORCH_RNG.lock().unwrap_or_else(|e| e.into_inner())
}
