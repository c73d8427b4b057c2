//! cudarl-sandbox: what a process that runs or reads candidate code may do.
//!
//! Candidate code is hostile (docs/architecture.md, "The judge and the runner"): a kernel's host
//! launcher, its constructors, a `ModelNew` file and the preprocessor directives nvcc reads are
//! all written by a model that is rewarded for fooling the judge. Three layers confine the
//! processes that touch it:
//!
//! - [`fs`]: Landlock rules, applied before the process does anything else, so every thread it
//!   later starts inherits them: read-only paths (system libraries, the toolkit, the one
//!   candidate file), executables, device files (the GPU), and at most one writable directory
//!   (a build directory). The store, the hidden-seed salt and `$HOME` are never among them.
//! - [`syscalls`]: seccomp-bpf filters (built with `seccompiler`): an allow-list for the native
//!   kernel runner after CUDA initialization, and deny-lists for toolchains and interpreters (no
//!   sockets, ptrace, `process_vm_*`, mounts, namespaces, `setsid`, io_uring, BPF, ...; no new
//!   processes for interpreters).
//! - [`process`]: rlimits, `no_new_privs`, death with the parent, no core dumps.
//!
//! A denied system call raises `SIGSYS`; [`report`] turns it into one line on the report
//! descriptor naming the call, then the process exits with [`VIOLATION_EXIT`].

pub mod fs;
pub mod process;
pub mod report;
pub mod syscalls;

pub use fs::{FsPolicy, FsStatus};
pub use process::{Limits, harden};
pub use syscalls::{FilterOptions, Profile};

/// Exit status of a sandboxed process that made a denied system call and reported it.
pub const VIOLATION_EXIT: i32 = 86;

/// Errors setting up a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The kernel does not enforce Landlock (older than 5.13, or Landlock not in the LSM list).
    #[error(
        "Landlock is not enforced by this kernel ({0}); the candidate sandbox needs Linux 5.13+ with Landlock enabled (set CUDARL_ALLOW_UNCONFINED=1 to run without file-system confinement, not recommended)"
    )]
    LandlockUnavailable(String),
    /// A Landlock call failed.
    #[error("Landlock: {0}")]
    Landlock(String),
    /// Building or installing a seccomp filter failed.
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// A process-level setting failed (prctl, setrlimit, sigaction).
    #[error("{0}")]
    Process(String),
}
