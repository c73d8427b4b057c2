//! cudarl-torch: everything in cudarl-pipe that needs libtorch (through tch), kept out of the
//! `cudarl-pipe` binary so its commands start in milliseconds (loading libtorch takes 0.35 s).
//!
//! - [`eval`]: reference expressions ([`cudarl_cuda::expr`]) evaluated with libtorch, with
//!   tolerance magnitudes.
//! - [`compare`]: the judge's one-pass comparison of an output with its reference (a CUDA
//!   kernel).
//! - [`error`]: the judge's own errors ([`error::JudgeError`]).
//! - [`inputs`]: fresh seeded inputs, element types and poison patterns.
//! - [`judge`]: the judge of a compiled candidate that runs in a sandboxed runner process
//!   (tests, checks, timing windows, the torch baseline).
//! - [`worker`]: the sandboxed worker's loop (binary `cudarl-pipe-worker`).

pub mod compare;
pub mod error;
pub mod eval;
pub mod inputs;
pub mod judge;
pub mod worker;
