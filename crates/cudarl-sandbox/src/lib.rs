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
//!   (a build directory). The store, the hidden-seed salt and `$HOME` are never among them. The
//!   same Landlock domain scopes signals (Linux 6.12+): a sandboxed process signals nothing
//!   outside it, neither the judge, the pipeline nor another sandbox of the same user.
//! - [`syscalls`]: seccomp-bpf filters (built with `seccompiler`): an allow-list for the native
//!   kernel runner after CUDA initialization, and deny-lists for toolchains and interpreters (no
//!   sockets, ptrace, `process_vm_*`, mounts, namespaces, `setsid`, io_uring, BPF, ...; no new
//!   processes for interpreters). Every profile limits the signal calls to the process itself
//!   (the compiler also to its own process group), the second line where Landlock cannot scope
//!   signals.
//! - [`process`]: rlimits, `no_new_privs`, death with the parent, no core dumps.
//!
//! [`confine`] applies the three in order for a process that reads or runs candidate code
//! from its start (`cudarl-pipe-runner exec`: nvcc, the Python extraction, the torch runners'
//! zygote). A denied system call raises `SIGSYS`; [`report`] turns it into one line on the
//! report descriptor naming the call, then the process exits with [`VIOLATION_EXIT`].

#[cfg(test)]
mod child;
pub mod fs;
pub mod process;
pub mod report;
pub mod syscalls;

pub use fs::Scopes;
pub use fs::{FsPolicy, FsStatus};
pub use process::{Limits, harden};
pub use syscalls::{BpfProgram, FilterOptions, Profile};

/// Exit status of a sandboxed process that made a denied system call and reported it.
pub const VIOLATION_EXIT: i32 = 86;

/// How [`confine`] goes about what the kernel cannot do and who installs the filters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConfineOptions {
    /// Go on when the kernel enforces no Landlock rule (`CUDARL_ALLOW_UNCONFINED=1`).
    pub allow_unenforced: bool,
    /// Log denied calls and let them run ([`FilterOptions::log_only`], `CUDARL_SANDBOX_LOG=1`).
    pub log_only: bool,
    /// Return the filters instead of installing them: the program installs them in the
    /// processes it forks ([`FilterOptions::installed_in_forks`]; the torch runners' zygote).
    pub hand_over: bool,
}

/// What [`confine`] did.
#[derive(Debug, Clone)]
pub struct Confined {
    /// How far Landlock holds, signal scoping included.
    pub fs: FsStatus,
    /// The filters, with [`ConfineOptions::hand_over`] (not installed); empty otherwise.
    pub handed: Vec<BpfProgram>,
}

/// Confines the calling process for `profile` ([`Profile::Compiler`] or
/// [`Profile::Interpreter`]), before it runs anything untrusted and while it has one thread:
/// [`harden`] with `limits`, `policy`'s Landlock rules and scopes, then the profile's seccomp
/// filters for this process (its pid, and its process group when it leads one:
/// [`FilterOptions::own_group`]), installed unless handed over. Everything holds across `exec`.
///
/// # Errors
/// Any step failed ([`SandboxError`]); the process must then not run the program.
pub fn confine(
    profile: Profile,
    policy: &FsPolicy,
    limits: &Limits,
    opts: ConfineOptions,
) -> Result<Confined, SandboxError> {
    harden(limits)?;
    let fs = policy.restrict(opts.allow_unenforced)?;
    // SAFETY: getpid and getpgid(0) have no preconditions.
    let (pid, pgid) = unsafe { (libc::getpid(), libc::getpgid(0)) };
    let filters = syscalls::filters(
        profile,
        &FilterOptions {
            self_pid: pid,
            own_group: pgid == pid,
            installed_in_forks: opts.hand_over,
            log_only: opts.log_only,
            ..Default::default()
        },
    )?;
    if opts.hand_over {
        return Ok(Confined {
            fs,
            handed: filters,
        });
    }
    syscalls::install(&filters, false)?;
    Ok(Confined {
        fs,
        handed: Vec::new(),
    })
}

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
