//! File-system confinement with Landlock (Linux 5.13+; `landlock` crate).
//!
//! Every access right Landlock knows on the running kernel is handled (denied unless a rule
//! grants it), up to ABI 5 (which adds `ioctl` on device files): a sandboxed process reads,
//! writes and executes only what its [`FsPolicy`] lists. Rules apply to the calling thread and
//! to threads and processes it starts afterwards, so confinement comes first, before CUDA starts
//! its helper threads or a wrapper `exec`s a toolchain.

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, path_beneath_rules,
};
use serde::{Deserialize, Serialize};

use crate::SandboxError;

/// The highest Landlock ABI whose access rights are handled (5: Linux 6.10, `ioctl` on devices).
const TARGET_ABI: ABI = ABI::V5;

/// What a confined process may reach on the file system. Paths that do not exist are skipped;
/// a directory grants its whole subtree, a file only itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsPolicy {
    /// Read files and list directories.
    pub read: Vec<PathBuf>,
    /// Read and execute (`execve`).
    pub exec: Vec<PathBuf>,
    /// Read, write, create, remove and truncate (a build directory).
    pub write: Vec<PathBuf>,
    /// Device files: read, write and `ioctl` (the GPU's `/dev/nvidia*`).
    pub devices: Vec<PathBuf>,
}

/// How far the kernel enforced a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsStatus {
    /// Landlock restricted the process (fully, or with the rights of an older ABI).
    pub enforced: bool,
    /// Every requested right is enforced.
    pub fully: bool,
}

impl FsPolicy {
    /// The system's shared libraries and the dynamic loader's cache: what any dynamically linked
    /// program needs to start (`/lib`, `/lib64`, `/usr/lib`, `/usr/lib64`, `/etc/ld.so.cache`).
    pub fn system_libraries() -> Vec<PathBuf> {
        [
            "/lib",
            "/lib64",
            "/usr/lib",
            "/usr/lib64",
            "/usr/local/lib",
            "/etc/ld.so.cache",
        ]
        .into_iter()
        .map(PathBuf::from)
        .collect()
    }

    /// The dynamic loader (the ELF interpreter the kernel opens for execution when a
    /// dynamically linked program is `exec`ed), as found and resolved: an `exec` policy needs it.
    pub fn dynamic_loader() -> Vec<PathBuf> {
        let mut v = Vec::new();
        for p in ["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-x86-64.so.2"] {
            let p = PathBuf::from(p);
            if p.exists() {
                if let Ok(c) = std::fs::canonicalize(&p)
                    && c != p
                {
                    v.push(c);
                }
                v.push(p);
            }
        }
        v
    }

    /// The GPU's device files (`/dev/nvidia*`, `/dev/dri` is not needed by CUDA) plus
    /// `/dev/null`, `/dev/zero` and `/dev/urandom`.
    pub fn gpu_devices() -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = ["/dev/null", "/dev/zero", "/dev/urandom"]
            .into_iter()
            .map(PathBuf::from)
            .collect();
        if let Ok(rd) = std::fs::read_dir("/dev") {
            let mut nv: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("nvidia"))
                })
                .collect();
            nv.sort();
            v.extend(nv);
        }
        v
    }

    /// Applies the policy to the calling thread and everything it starts afterwards (and sets
    /// `no_new_privs`, which Landlock requires).
    ///
    /// # Errors
    /// [`SandboxError::LandlockUnavailable`] when the kernel enforces nothing and
    /// `allow_unenforced` is false; [`SandboxError::Landlock`] when a Landlock call fails.
    pub fn restrict(&self, allow_unenforced: bool) -> Result<FsStatus, SandboxError> {
        let e = |x: landlock::RulesetError| SandboxError::Landlock(x.to_string());
        let all = AccessFs::from_all(TARGET_ABI);
        let read: BitFlags<AccessFs> = AccessFs::ReadFile | AccessFs::ReadDir;
        let exec = read | AccessFs::Execute;
        let write = AccessFs::from_all(TARGET_ABI) & !AccessFs::Execute;
        let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
        let status = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(all)
            .map_err(e)?
            .create()
            .map_err(e)?
            .add_rules(path_beneath_rules(&self.read, read))
            .map_err(e)?
            .add_rules(path_beneath_rules(&self.exec, exec))
            .map_err(e)?
            .add_rules(path_beneath_rules(&self.write, write))
            .map_err(e)?
            .add_rules(path_beneath_rules(&self.devices, device))
            .map_err(e)?
            .restrict_self()
            .map_err(e)?;
        let s = FsStatus {
            enforced: status.ruleset != RulesetStatus::NotEnforced,
            fully: status.ruleset == RulesetStatus::FullyEnforced,
        };
        if !s.enforced && !allow_unenforced {
            return Err(SandboxError::LandlockUnavailable(format!(
                "{:?}",
                status.landlock
            )));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a forked child (Landlock restricts the process for good) and returns its
    /// exit status.
    fn in_child(f: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child only runs `f` (file operations) and exits without returning.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = f();
            // SAFETY: leaves the forked child at once.
            unsafe { libc::_exit(code) };
        }
        let mut st = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        libc::WEXITSTATUS(st)
    }

    #[test]
    fn a_confined_process_reads_only_what_it_was_given() {
        let d = tempfile::tempdir().unwrap();
        let allowed = d.path().join("allowed");
        let secret = d.path().join("secret");
        let build = d.path().join("build");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::create_dir_all(&build).unwrap();
        std::fs::write(allowed.join("a.txt"), "ok").unwrap();
        std::fs::write(&secret, "salt").unwrap();
        let policy = FsPolicy {
            read: vec![allowed.clone()],
            write: vec![build.clone()],
            ..Default::default()
        };
        let code = in_child(move || {
            if policy.restrict(false).is_err() {
                return 10;
            }
            if std::fs::read_to_string(allowed.join("a.txt"))
                .ok()
                .as_deref()
                != Some("ok")
            {
                return 11;
            }
            if std::fs::read(&secret).is_ok() {
                return 12;
            }
            if std::fs::write(allowed.join("b.txt"), "x").is_ok() {
                return 13;
            }
            if std::fs::write(build.join("out.o"), "x").is_err() {
                return 14;
            }
            if std::fs::read_dir("/").is_ok() {
                return 15;
            }
            0
        });
        assert_eq!(code, 0, "child failed check {code}");
        assert!(!d.path().join("allowed/b.txt").exists());
    }
}
