//! Process-level limits of a sandboxed process: rlimits, `no_new_privs`, death with the parent,
//! no core dumps, not dumpable (no `/proc/<pid>/mem` or ptrace by other processes of the user).

use serde::{Deserialize, Serialize};

use crate::SandboxError;

/// Resource limits (`setrlimit(2)`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU seconds (RLIMIT_CPU).
    pub cpu_seconds: u64,
    /// Address space, GiB (RLIMIT_AS). The CUDA driver reserves virtual address space far
    /// beyond physical memory, so this bound is large.
    pub address_space_gib: u64,
    /// Largest file the process may write, bytes (RLIMIT_FSIZE).
    pub file_size_bytes: u64,
    /// Open files (RLIMIT_NOFILE).
    pub open_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_seconds: 3600,
            address_space_gib: 4096,
            file_size_bytes: 1 << 20,
            open_files: 1024,
        }
    }
}

fn set_limit(res: libc::__rlimit_resource_t, v: u64) {
    let r = libc::rlimit {
        rlim_cur: v,
        rlim_max: v,
    };
    // SAFETY: setrlimit on the current process with a valid struct.
    unsafe {
        libc::setrlimit(res, &r);
    }
}

/// Applies `limits` to the current process, and no core dumps (RLIMIT_CORE 0).
pub fn apply_limits(l: &Limits) {
    set_limit(libc::RLIMIT_CORE, 0);
    set_limit(libc::RLIMIT_CPU, l.cpu_seconds);
    set_limit(libc::RLIMIT_AS, l.address_space_gib.saturating_mul(1 << 30));
    set_limit(libc::RLIMIT_FSIZE, l.file_size_bytes);
    set_limit(libc::RLIMIT_NOFILE, l.open_files);
}

fn prctl(op: libc::c_int, arg: libc::c_ulong, what: &str) -> Result<(), SandboxError> {
    // SAFETY: prctl with integer arguments on the current process.
    if unsafe { libc::prctl(op, arg, 0, 0, 0) } != 0 {
        return Err(SandboxError::Process(format!(
            "prctl({what}): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// `PR_SET_NO_NEW_PRIVS`: no set-uid or file-capability gains across `execve` (required by
/// unprivileged seccomp and Landlock).
///
/// # Errors
/// The prctl failed.
pub fn no_new_privs() -> Result<(), SandboxError> {
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")
}

/// Hardens the calling process: `limits`, `no_new_privs`, `SIGKILL` when the parent dies
/// (`PR_SET_PDEATHSIG`; if the parent is already gone, the process exits), not dumpable.
///
/// # Errors
/// A prctl failed.
pub fn harden(limits: &Limits) -> Result<(), SandboxError> {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGKILL as libc::c_ulong,
        "PR_SET_PDEATHSIG",
    )?;
    // SAFETY: as above.
    if unsafe { libc::getppid() } != parent {
        // The parent died before the death signal was armed.
        // SAFETY: leaves at once.
        unsafe { libc::_exit(1) };
    }
    no_new_privs()?;
    prctl(libc::PR_SET_DUMPABLE, 0, "PR_SET_DUMPABLE")?;
    apply_limits(limits);
    Ok(())
}
