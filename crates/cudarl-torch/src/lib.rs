//! cudarl-torch: everything in cudarl-pipe that needs libtorch (through tch), kept out of the
//! `cudarl-pipe` binary so its commands start in milliseconds (loading libtorch takes 0.35 s).
//!
//! - [`eval`]: reference expressions ([`cudarl_cuda::expr`]) evaluated with libtorch, with
//!   tolerance magnitudes.
//! - [`runner`]: runs a compiled candidate on the GPU (tests, checks, timing, torch baseline).
//! - [`worker`]: the sandboxed worker's loop (binary `cudarl-pipe-worker`).

pub mod eval;
pub mod runner;
pub mod worker;
