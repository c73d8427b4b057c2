//! Models and training for cudarl-pipe (DESIGN.md section 6): a Qwen2-architecture decoder in
//! tch that loads and saves the Hugging Face layout, and batched generation with a KV cache
//! and per-token log-probabilities, BPE tokenizers with the ChatML template, and causal-LM
//! training with a loss mask (pretraining and SFT).

pub mod agent;
pub mod config;
pub mod generate;
pub mod job;
pub mod model;
pub mod rl;
pub mod rl_serve;
pub mod tokenizer;
pub mod train;

pub use agent::{Completion, Role, TrainableAgent};
pub use config::Qwen2Config;
pub use generate::{Finish, Generation, PREFILL_BYTES, SampleParams, generate};
pub use model::{KvCache, Qwen2, set_cudnn_attention};
pub use tokenizer::{ChatTokenizer, Message};
pub use train::{Example, Precision, StepMetrics, TrainConfig, train_lm};

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
