//! File-system confinement and IPC scoping with Landlock (Linux 5.13+; `landlock` crate).
//!
//! Every access right Landlock knows on the running kernel is handled (denied unless a rule
//! grants it), up to ABI 5 (which adds `ioctl` on device files): a sandboxed process reads,
//! writes and executes only what its [`FsPolicy`] lists. Rules apply to the calling thread and
//! to threads and processes it starts afterwards (across `exec` too), so confinement comes
//! first, before CUDA starts its helper threads or a wrapper `exec`s a toolchain.
//!
//! The same domain is scoped ([`Scopes`], Landlock ABI 6, Linux 6.12+): a confined process may
//! signal only processes of its own domain (itself, its threads, the processes it started and
//! their children, and processes confined inside them), never the judge, the pipeline or a
//! sibling sandbox of the same user; and, where [`Scopes::abstract_unix_sockets`] is set, it
//! connects to no abstract Unix socket bound outside the domain. The kernel enforces this in
//! the `kill`, `tgkill`, `tkill`, `rt_*sigqueueinfo` and `pidfd_send_signal` paths alike and for
//! `SIGIO`/`SIGURG` owners (`fcntl(F_SETOWN)`); signals the kernel sends itself (`SIGCHLD` to
//! the parent, the death signal) are not affected. Older kernels enforce the file rules without
//! the scopes (best effort, as for file rights newer than the kernel): [`FsStatus`] says which
//! held, and the seccomp filters ([`crate::syscalls`]) are the second line there.

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, LandlockStatus, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};
use serde::{Deserialize, Serialize};

use crate::SandboxError;

/// The highest Landlock ABI whose access rights are handled (5: Linux 6.10, `ioctl` on devices).
const TARGET_ABI: ABI = ABI::V5;

/// The Landlock ABI that scopes signals and abstract Unix sockets (6: Linux 6.12).
const SCOPE_ABI: ABI = ABI::V6;

/// What a confined process may not reach outside its Landlock domain (Landlock ABI 6, Linux
/// 6.12+; nothing on older kernels, which [`FsStatus`] reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scopes {
    /// Signals only to processes of the domain (`LANDLOCK_SCOPE_SIGNAL`).
    pub signals: bool,
    /// No connecting or sending to abstract Unix sockets bound outside the domain
    /// (`LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`). Pathname sockets and socket pairs are not
    /// affected.
    pub abstract_unix_sockets: bool,
}

impl Default for Scopes {
    /// Both scopes.
    fn default() -> Self {
        Scopes {
            signals: true,
            abstract_unix_sockets: true,
        }
    }
}

impl Scopes {
    fn flags(self) -> BitFlags<Scope> {
        let mut f = BitFlags::EMPTY;
        if self.signals {
            f |= Scope::Signal;
        }
        if self.abstract_unix_sockets {
            f |= Scope::AbstractUnixSocket;
        }
        f
    }
}

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
    /// IPC scopes of the domain (default: signals and abstract Unix sockets).
    #[serde(default)]
    pub scopes: Scopes,
}

/// How far the kernel enforced a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsStatus {
    /// Landlock restricted the process (fully, or with the rights of an older ABI).
    pub enforced: bool,
    /// Every requested right and scope is enforced.
    pub fully: bool,
    /// The Landlock ABI used (the kernel's, up to the newest the `landlock` crate knows; 0:
    /// none).
    #[serde(default)]
    pub abi: u32,
    /// Signals are scoped to the domain (requested, and Landlock ABI 6: Linux 6.12+). When
    /// false, the seccomp filters alone limit whom the process may signal.
    #[serde(default)]
    pub signals_scoped: bool,
    /// Abstract Unix sockets are scoped to the domain (requested, and Landlock ABI 6).
    #[serde(default)]
    pub abstract_unix_sockets_scoped: bool,
}

impl FsStatus {
    /// One line for a log: `landlock abi 6: files, signals, abstract unix sockets`, or
    /// `landlock not enforced`.
    pub fn summary(&self) -> String {
        if !self.enforced {
            return "landlock not enforced".into();
        }
        let mut parts = vec!["files"];
        if self.signals_scoped {
            parts.push("signals");
        }
        if self.abstract_unix_sockets_scoped {
            parts.push("abstract unix sockets");
        }
        format!("landlock abi {}: {}", self.abi, parts.join(", "))
    }
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

    /// Applies the policy and its [`Scopes`] to the calling thread and everything it starts
    /// afterwards (and sets `no_new_privs`, which Landlock requires). Call it while the process
    /// has one thread: threads started before stay outside the domain.
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
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(all)
            .map_err(e)?;
        let scopes = self.scopes.flags();
        if !scopes.is_empty() {
            // Best effort: dropped on kernels without ABI 6 (the status says so).
            ruleset = ruleset.scope(scopes).map_err(e)?;
        }
        let status = ruleset
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
        let abi = match status.landlock {
            LandlockStatus::Available { effective_abi, .. } => effective_abi,
            _ => ABI::Unsupported,
        };
        let enforced = status.ruleset != RulesetStatus::NotEnforced;
        let scoped = enforced && abi >= SCOPE_ABI;
        let s = FsStatus {
            enforced,
            fully: status.ruleset == RulesetStatus::FullyEnforced,
            abi: if enforced { abi as u32 } else { 0 },
            signals_scoped: scoped && self.scopes.signals,
            abstract_unix_sockets_scoped: scoped && self.scopes.abstract_unix_sockets,
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
    use crate::child::in_child;

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
        let (code, _) = in_child(move || {
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
