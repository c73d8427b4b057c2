//! cudarl-data: Arrow/Parquet schemas, deterministic Parquet I/O, ingestion of KernelBench,
//! the SakanaAI AI-CUDA-Engineer-Archive and CUDA-L1, hf-hub downloads, export, and the PNG
//! charts of training and evaluation ([`plot`]).

pub mod cuda_l1;
pub mod error;
pub mod export;
pub mod hub;
pub mod kernelbench;
pub mod kernels;
pub mod parquet_io;
pub mod plot;
pub mod pyrepr;
pub mod sakana;
pub mod schemas;

pub use error::{DataError, Result};
pub use parquet_io::{Table, write_parquet};
