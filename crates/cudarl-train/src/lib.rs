//! Models and training for cudarl-pipe (DESIGN.md section 6): a Qwen2-architecture decoder in
//! tch that loads and saves the Hugging Face layout, and batched generation with a KV cache
//! and per-token log-probabilities.

pub mod config;
pub mod generate;
pub mod model;

pub use config::Qwen2Config;
pub use generate::{Finish, Generation, SampleParams, generate};
pub use model::{KvCache, Qwen2};

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
    /// Bad generation parameters.
    #[error("generate: {0}")]
    Generate(String),
    /// libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}
