//! seccomp-bpf filters (x86-64 system-call numbers), built with `seccompiler`.
//!
//! A [`Profile`] compiles to a few stacked filters; the kernel takes the strictest answer of all
//! of them (kill > trap > errno > allow), so one filter decides what is allowed at all and the
//! others turn some allowed calls into a plain error:
//!
//! - [`Profile::Runner`] (the native kernel runner once CUDA is initialized): an **allow-list**.
//!   Memory, `ioctl` (the driver), futexes, polling, clocks, signals to itself, threads
//!   (`clone` with `CLONE_THREAD`), reading files. Anything else traps: `execve`, processes,
//!   sockets, `ptrace`, `process_vm_*`, `setsid`, mounts, `io_uring`, `bpf`, ... Opening a file
//!   for writing fails with `EACCES`; `clone3` fails with `ENOSYS` (its flags sit in memory a
//!   filter cannot read; glibc then falls back to `clone`, whose flags it can).
//! - [`Profile::Compiler`] (nvcc and the host compiler it runs): a **deny-list** of calls that
//!   reach outside the process tree (sockets, `ptrace`, `process_vm_*`, mounts, namespaces,
//!   `setsid`/`setpgid`, kernel modules, `bpf`, `perf_event_open`, `io_uring`, keyrings, clock
//!   setting). Processes are allowed: nvcc runs cicc, ptxas and gcc.
//! - [`Profile::Interpreter`] (Python reading or running a candidate file): the compiler's
//!   deny-list plus no new processes (`fork`, `vfork`, `clone` without `CLONE_THREAD`).
//!
//! **Signals.** Landlock's signal scope ([`crate::fs::Scopes`], Linux 6.12+) keeps every
//! sandboxed process from signalling anything outside its own domain; these filters are the
//! second line, for older kernels, and bound what a process may signal inside its domain too:
//!
//! - Runner: `kill` and `tgkill` to its own pid only (abort, `raise`, thread cancellation), and
//!   with [`FilterOptions::write_opens`] (a profile pass) also `kill` with signal 0 to any pid
//!   (a liveness probe: no signal is sent). `tkill`, `rt_sigqueueinfo`, `rt_tgsigqueueinfo` and
//!   `pidfd_send_signal` trap.
//! - Interpreter: `kill`, `tgkill`, `rt_sigqueueinfo` and `rt_tgsigqueueinfo` to its own pid
//!   only; other targets fail with `EPERM` (the kernel's own answer for a process one may not
//!   signal, so a program's fallbacks work). `tkill` and `pidfd_send_signal` trap (glibc raises
//!   with `tgkill`; nothing here holds a pidfd).
//! - Compiler: as the interpreter, and `kill` also to its own process group (0 or `-pid`) when
//!   it leads one ([`FilterOptions::own_group`]; the judge starts nvcc with `setpgid` at spawn,
//!   and the group holds only nvcc and its descendants, which cannot leave it: `setpgid` and
//!   `setsid` trap). nvcc's children (cicc, ptxas, gcc) inherit the filter, whose pid is nvcc's:
//!   a child signals the group, not itself by pid (its `abort` then ends it by the
//!   `hlt` fallback, a `SIGSEGV`, instead of `SIGABRT`), and whom it may signal by pid inside
//!   the group is left to Landlock.
//! - With [`FilterOptions::installed_in_forks`] (the filters are handed to the torch runners'
//!   zygote, whose forked runners install them) the pid-bound rules are left out: the pids are
//!   not known here, and each runner installs its own (`signal_filter` in
//!   python/cudarl_worker.py). `tkill` and `pidfd_send_signal` still trap.

use std::collections::BTreeMap;

pub use seccompiler::BpfProgram;
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};
use serde::{Deserialize, Serialize};

use crate::SandboxError;

/// Which filter set a process gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// The native kernel runner after CUDA initialization: an allow-list.
    Runner,
    /// A toolchain (nvcc, gcc): a deny-list; processes allowed.
    Compiler,
    /// An interpreter running candidate code: a deny-list; no new processes.
    Interpreter,
}

/// Settings of a filter set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterOptions {
    /// The sandboxed process's pid: the signal calls may target it alone.
    pub self_pid: i32,
    /// The process leads its own process group (its pgid is `self_pid`: started with `setpgid`
    /// at spawn). [`Profile::Compiler`] then may also `kill` the group (0 or `-self_pid`), which
    /// holds only it and its descendants.
    pub own_group: bool,
    /// The filters are installed by processes the program forks, not by `self_pid`
    /// ([`Profile::Compiler`] and [`Profile::Interpreter`]: the torch runners' zygote hands them
    /// to each runner it forks): the pid-bound signal rules are left out, and each such process
    /// limits its signals itself (`signal_filter` in python/cudarl_worker.py).
    pub installed_in_forks: bool,
    /// Log denied calls to the kernel's audit log and let them run, instead of trapping
    /// (`SECCOMP_RET_LOG`; for finding what a toolkit needs: `dmesg | grep type=1326`).
    pub log_only: bool,
    /// Sockets a profiler's injected collector opened before the filter ([`Profile::Runner`]
    /// only): send, receive and socket options on exactly these descriptors are allowed
    /// ([`PROFILER_SOCKET_CALLS`]), nothing else of sockets. Empty outside a profile pass.
    pub profiler_fds: Vec<i32>,
    /// Opening files for writing is left to Landlock ([`Profile::Runner`] only; a profile pass,
    /// whose collector opens `ncu`'s interprocess lock file at every profiled kernel). Off: such
    /// opens fail with `EACCES` whatever Landlock allows.
    pub write_opens: bool,
}

/// Socket calls allowed on [`FilterOptions::profiler_fds`]: Nsight Compute's collector, injected
/// into the runner at CUDA initialization, reports each profiled kernel's counters to the `ncu`
/// process over a socket it connected before the filter was installed.
pub const PROFILER_SOCKET_CALLS: &[(i64, &str)] = &[
    (libc::SYS_sendto, "sendto"),
    (libc::SYS_recvfrom, "recvfrom"),
    (libc::SYS_sendmsg, "sendmsg"),
    (libc::SYS_recvmsg, "recvmsg"),
    (libc::SYS_shutdown, "shutdown"),
    (libc::SYS_getsockname, "getsockname"),
    (libc::SYS_getpeername, "getpeername"),
    (libc::SYS_setsockopt, "setsockopt"),
    (libc::SYS_getsockopt, "getsockopt"),
];

/// System calls the runner may make once CUDA is up (x86-64 numbers, with their names).
const RUNNER_ALLOWED: &[(i64, &str)] = &[
    (libc::SYS_read, "read"),
    (libc::SYS_write, "write"),
    (libc::SYS_readv, "readv"),
    (libc::SYS_writev, "writev"),
    (libc::SYS_pread64, "pread64"),
    (libc::SYS_close, "close"),
    (libc::SYS_fstat, "fstat"),
    (libc::SYS_stat, "stat"),
    (libc::SYS_lstat, "lstat"),
    (libc::SYS_newfstatat, "newfstatat"),
    (libc::SYS_statx, "statx"),
    (libc::SYS_lseek, "lseek"),
    (libc::SYS_mmap, "mmap"),
    (libc::SYS_munmap, "munmap"),
    (libc::SYS_mprotect, "mprotect"),
    (libc::SYS_mremap, "mremap"),
    (libc::SYS_madvise, "madvise"),
    (libc::SYS_mincore, "mincore"),
    (libc::SYS_mlock, "mlock"),
    (libc::SYS_munlock, "munlock"),
    (libc::SYS_brk, "brk"),
    (libc::SYS_ioctl, "ioctl"),
    (libc::SYS_futex, "futex"),
    (libc::SYS_sched_yield, "sched_yield"),
    (libc::SYS_nanosleep, "nanosleep"),
    (libc::SYS_clock_nanosleep, "clock_nanosleep"),
    (libc::SYS_clock_gettime, "clock_gettime"),
    (libc::SYS_clock_getres, "clock_getres"),
    (libc::SYS_gettimeofday, "gettimeofday"),
    (libc::SYS_getpid, "getpid"),
    (libc::SYS_gettid, "gettid"),
    (libc::SYS_getppid, "getppid"),
    (libc::SYS_getuid, "getuid"),
    (libc::SYS_geteuid, "geteuid"),
    (libc::SYS_getgid, "getgid"),
    (libc::SYS_getegid, "getegid"),
    (libc::SYS_rt_sigaction, "rt_sigaction"),
    (libc::SYS_rt_sigprocmask, "rt_sigprocmask"),
    (libc::SYS_rt_sigreturn, "rt_sigreturn"),
    (libc::SYS_sigaltstack, "sigaltstack"),
    (libc::SYS_restart_syscall, "restart_syscall"),
    (libc::SYS_exit, "exit"),
    (libc::SYS_exit_group, "exit_group"),
    (libc::SYS_set_robust_list, "set_robust_list"),
    (libc::SYS_get_robust_list, "get_robust_list"),
    (libc::SYS_rseq, "rseq"),
    (libc::SYS_set_tid_address, "set_tid_address"),
    (libc::SYS_poll, "poll"),
    (libc::SYS_ppoll, "ppoll"),
    (libc::SYS_select, "select"),
    (libc::SYS_pselect6, "pselect6"),
    (libc::SYS_epoll_create1, "epoll_create1"),
    (libc::SYS_epoll_ctl, "epoll_ctl"),
    (libc::SYS_epoll_wait, "epoll_wait"),
    (libc::SYS_epoll_pwait, "epoll_pwait"),
    (libc::SYS_eventfd2, "eventfd2"),
    (libc::SYS_pipe2, "pipe2"),
    (libc::SYS_dup, "dup"),
    (libc::SYS_dup3, "dup3"),
    (libc::SYS_fcntl, "fcntl"),
    (libc::SYS_openat, "openat"),
    (libc::SYS_open, "open"),
    (libc::SYS_access, "access"),
    (libc::SYS_faccessat, "faccessat"),
    (libc::SYS_faccessat2, "faccessat2"),
    (libc::SYS_readlink, "readlink"),
    (libc::SYS_readlinkat, "readlinkat"),
    (libc::SYS_getcwd, "getcwd"),
    (libc::SYS_getdents64, "getdents64"),
    (libc::SYS_uname, "uname"),
    (libc::SYS_sched_getaffinity, "sched_getaffinity"),
    (libc::SYS_sched_getparam, "sched_getparam"),
    (libc::SYS_sched_getscheduler, "sched_getscheduler"),
    (libc::SYS_getrandom, "getrandom"),
    (libc::SYS_sysinfo, "sysinfo"),
    (libc::SYS_membarrier, "membarrier"),
    (libc::SYS_getrusage, "getrusage"),
    (libc::SYS_times, "times"),
    (libc::SYS_memfd_create, "memfd_create"),
    (libc::SYS_get_mempolicy, "get_mempolicy"),
    (libc::SYS_mbind, "mbind"),
    (libc::SYS_msync, "msync"),
    (libc::SYS_ftruncate, "ftruncate"),
    (libc::SYS_clone3, "clone3"),
];

/// Calls a profile pass's collector makes once the filter is in ([`FilterOptions::write_opens`]):
/// file calls on `ncu`'s interprocess lock (where they may act is Landlock's write list) and its
/// own timers (`timerfd_*`). Found with the filter in log mode (`CUDARL_SANDBOX_LOG=1`, audit
/// records of type 1326) under Nsight Compute 2025.3.1.
pub const PROFILER_CALLS: &[(i64, &str)] = &[
    (libc::SYS_timerfd_create, "timerfd_create"),
    (libc::SYS_timerfd_settime, "timerfd_settime"),
    (libc::SYS_timerfd_gettime, "timerfd_gettime"),
    (libc::SYS_unlink, "unlink"),
    (libc::SYS_unlinkat, "unlinkat"),
    (libc::SYS_mkdir, "mkdir"),
    (libc::SYS_mkdirat, "mkdirat"),
    (libc::SYS_rename, "rename"),
    (libc::SYS_renameat, "renameat"),
    (libc::SYS_renameat2, "renameat2"),
    (libc::SYS_symlink, "symlink"),
    (libc::SYS_symlinkat, "symlinkat"),
    (libc::SYS_link, "link"),
    (libc::SYS_linkat, "linkat"),
    (libc::SYS_rmdir, "rmdir"),
    (libc::SYS_flock, "flock"),
    (libc::SYS_fsync, "fsync"),
    (libc::SYS_fdatasync, "fdatasync"),
    (libc::SYS_fchmod, "fchmod"),
    (libc::SYS_utimensat, "utimensat"),
    (libc::SYS_utimes, "utimes"),
    (libc::SYS_utime, "utime"),
    (libc::SYS_futimesat, "futimesat"),
];

/// Calls that reach outside a toolchain's or interpreter's own process tree.
const OUTSIDE: &[(i64, &str)] = &[
    (libc::SYS_ptrace, "ptrace"),
    (libc::SYS_process_vm_readv, "process_vm_readv"),
    (libc::SYS_process_vm_writev, "process_vm_writev"),
    (libc::SYS_socket, "socket"),
    (libc::SYS_socketpair, "socketpair"),
    (libc::SYS_connect, "connect"),
    (libc::SYS_bind, "bind"),
    (libc::SYS_listen, "listen"),
    (libc::SYS_accept, "accept"),
    (libc::SYS_accept4, "accept4"),
    (libc::SYS_mount, "mount"),
    (libc::SYS_umount2, "umount2"),
    (libc::SYS_pivot_root, "pivot_root"),
    (libc::SYS_chroot, "chroot"),
    (libc::SYS_unshare, "unshare"),
    (libc::SYS_setns, "setns"),
    (libc::SYS_setsid, "setsid"),
    (libc::SYS_setpgid, "setpgid"),
    (libc::SYS_kexec_load, "kexec_load"),
    (libc::SYS_kexec_file_load, "kexec_file_load"),
    (libc::SYS_init_module, "init_module"),
    (libc::SYS_finit_module, "finit_module"),
    (libc::SYS_delete_module, "delete_module"),
    (libc::SYS_bpf, "bpf"),
    (libc::SYS_perf_event_open, "perf_event_open"),
    (libc::SYS_userfaultfd, "userfaultfd"),
    (libc::SYS_io_uring_setup, "io_uring_setup"),
    (libc::SYS_io_uring_enter, "io_uring_enter"),
    (libc::SYS_io_uring_register, "io_uring_register"),
    (libc::SYS_keyctl, "keyctl"),
    (libc::SYS_add_key, "add_key"),
    (libc::SYS_request_key, "request_key"),
    (libc::SYS_acct, "acct"),
    (libc::SYS_swapon, "swapon"),
    (libc::SYS_swapoff, "swapoff"),
    (libc::SYS_reboot, "reboot"),
    (libc::SYS_settimeofday, "settimeofday"),
    (libc::SYS_clock_settime, "clock_settime"),
    (libc::SYS_clock_adjtime, "clock_adjtime"),
    (libc::SYS_adjtimex, "adjtimex"),
    (libc::SYS_open_by_handle_at, "open_by_handle_at"),
    (libc::SYS_name_to_handle_at, "name_to_handle_at"),
    (libc::SYS_iopl, "iopl"),
    (libc::SYS_ioperm, "ioperm"),
    (libc::SYS_fanotify_init, "fanotify_init"),
    (libc::SYS_quotactl, "quotactl"),
    (libc::SYS_syslog, "syslog"),
    (libc::SYS_vhangup, "vhangup"),
    (libc::SYS_pidfd_getfd, "pidfd_getfd"),
    (libc::SYS_pidfd_open, "pidfd_open"),
    (libc::SYS_kcmp, "kcmp"),
    (libc::SYS_move_mount, "move_mount"),
    (libc::SYS_fsopen, "fsopen"),
    (libc::SYS_fsmount, "fsmount"),
    (libc::SYS_fsconfig, "fsconfig"),
    (libc::SYS_fspick, "fspick"),
    (libc::SYS_open_tree, "open_tree"),
];

/// Calls that start processes or programs, or signal other processes (named for reports; the
/// runner allows none of them, or only towards itself).
const PROCESSES: &[(i64, &str)] = &[
    (libc::SYS_execve, "execve"),
    (libc::SYS_execveat, "execveat"),
    (libc::SYS_fork, "fork"),
    (libc::SYS_vfork, "vfork"),
    (libc::SYS_clone, "clone"),
    (libc::SYS_kill, "kill"),
    (libc::SYS_tgkill, "tgkill"),
    (libc::SYS_tkill, "tkill"),
    (libc::SYS_rt_sigqueueinfo, "rt_sigqueueinfo"),
    (libc::SYS_rt_tgsigqueueinfo, "rt_tgsigqueueinfo"),
    (libc::SYS_pidfd_send_signal, "pidfd_send_signal"),
    (libc::SYS_prctl, "prctl"),
    (libc::SYS_prlimit64, "prlimit64"),
];

/// The name of x86-64 system call `nr` when it is one the filters mention, else `syscall <nr>`.
pub fn name(nr: i64) -> String {
    RUNNER_ALLOWED
        .iter()
        .chain(PROFILER_SOCKET_CALLS)
        .chain(PROFILER_CALLS)
        .chain(OUTSIDE)
        .chain(PROCESSES)
        .find(|(n, _)| *n == nr)
        .map_or_else(|| format!("syscall {nr}"), |(_, s)| (*s).to_string())
}

fn err(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Seccomp(e.to_string())
}

fn cond(
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    v: u64,
) -> Result<SeccompCondition, SandboxError> {
    SeccompCondition::new(arg, len, op, v).map_err(err)
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SandboxError> {
    SeccompRule::new(conds).map_err(err)
}

/// `arg & bit == bit`.
fn has_bit(arg: u8, bit: u64) -> Result<SeccompCondition, SandboxError> {
    cond(
        arg,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(bit),
        bit,
    )
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    on_match: SeccompAction,
) -> Result<BpfProgram, SandboxError> {
    let f = SeccompFilter::new(rules, mismatch, on_match, TargetArch::x86_64).map_err(err)?;
    f.try_into().map_err(err)
}

/// Opening for writing (`O_WRONLY`, `O_RDWR`, `O_CREAT`, `O_TRUNC`, `O_APPEND`) fails with
/// `EACCES` unless `write_opens`; `clone3` with `ENOSYS`.
fn errno_filters(write_opens: bool) -> Result<Vec<BpfProgram>, SandboxError> {
    let write_bits = [
        libc::O_WRONLY,
        libc::O_RDWR,
        libc::O_CREAT,
        libc::O_TRUNC,
        libc::O_APPEND,
    ];
    let write_rules = |arg: u8| -> Result<Vec<SeccompRule>, SandboxError> {
        write_bits
            .iter()
            .map(|&b| rule(vec![has_bit(arg, b as u64)?]))
            .collect()
    };
    let mut out = vec![clone3_filter()?, owner_filter()?];
    if !write_opens {
        let mut open = BTreeMap::new();
        open.insert(libc::SYS_openat, write_rules(2)?);
        open.insert(libc::SYS_open, write_rules(1)?);
        open.insert(libc::SYS_creat, vec![]);
        out.push(compile(
            open,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EACCES as u32),
        )?);
    }
    Ok(out)
}

/// `clone3` fails with `ENOSYS` (its flags sit in memory a filter cannot read; glibc then
/// falls back to `clone`).
fn clone3_filter() -> Result<BpfProgram, SandboxError> {
    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, vec![]);
    compile(
        clone3,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )
}

/// `fcntl` commands (`F_SETOWN`, `F_SETSIG`, `F_SETOWN_EX`) and `ioctl` requests (`FIOSETOWN`,
/// `SIOCSPGRP`) that name a process the kernel signals when a descriptor is ready: a signal to
/// any process, past every pid rule. They get `EPERM` in every profile (Landlock's signal scope,
/// Linux 6.12, covers them too).
fn owner_filter() -> Result<BpfProgram, SandboxError> {
    let arg1 = |v: u64| -> Result<SeccompRule, SandboxError> {
        rule(vec![cond(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v)?])
    };
    let mut rules = BTreeMap::new();
    rules.insert(
        libc::SYS_fcntl,
        // F_SETOWN, F_SETSIG, F_SETOWN_EX (<asm-generic/fcntl.h>)
        vec![arg1(8)?, arg1(10)?, arg1(15)?],
    );
    // FIOSETOWN, SIOCSPGRP (<asm-generic/sockios.h>)
    rules.insert(libc::SYS_ioctl, vec![arg1(0x8901)?, arg1(0x8902)?]);
    compile(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )
}

/// Signal calls the deny-list profiles trap: `tkill` names a thread by its id alone (glibc
/// raises with `tgkill`), `pidfd_send_signal` a process by a pidfd or a `/proc/<pid>` directory
/// (no sandboxed program here signals itself that way).
const SIGNALS_DENIED: &[i64] = &[libc::SYS_tkill, libc::SYS_pidfd_send_signal];

/// The pid-bound signal rules of [`Profile::Compiler`] and [`Profile::Interpreter`]: `kill`,
/// `tgkill`, `rt_sigqueueinfo` and `rt_tgsigqueueinfo` to a process other than `self_pid` (for
/// the compiler with `own_group`, also other than its group: 0 or `-self_pid`) get `EPERM`, or
/// are logged with `log_only`.
fn signal_filter(profile: Profile, opts: &FilterOptions) -> Result<BpfProgram, SandboxError> {
    let pid = |v: i32| v as u32 as u64;
    let not = |v: i32| cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, pid(v));
    let mut kill_others = vec![not(opts.self_pid)?];
    if profile == Profile::Compiler && opts.own_group {
        kill_others.push(not(0)?);
        kill_others.push(not(-opts.self_pid)?);
    }
    let mut rules = BTreeMap::new();
    rules.insert(libc::SYS_kill, vec![rule(kill_others)?]);
    for nr in [
        libc::SYS_tgkill,
        libc::SYS_rt_sigqueueinfo,
        libc::SYS_rt_tgsigqueueinfo,
    ] {
        rules.insert(nr, vec![rule(vec![not(opts.self_pid)?])?]);
    }
    let denied = if opts.log_only {
        SeccompAction::Log
    } else {
        SeccompAction::Errno(libc::EPERM as u32)
    };
    compile(rules, SeccompAction::Allow, denied)
}

/// The filters of `profile`, in the order they must be installed ([`install`]): the one that
/// denies most comes last, since installing a filter itself takes `prctl` and `seccomp`.
///
/// # Errors
/// [`SandboxError::Seccomp`] if a filter does not compile (a bug, not an input error).
pub fn filters(profile: Profile, opts: &FilterOptions) -> Result<Vec<BpfProgram>, SandboxError> {
    let denied = if opts.log_only {
        SeccompAction::Log
    } else {
        SeccompAction::Trap
    };
    match profile {
        Profile::Runner => {
            let allow = runner_allowed(opts)?;
            // The allow-list goes last: installing a filter takes prctl and seccomp calls it denies.
            let mut out = errno_filters(opts.write_opens)?;
            out.push(compile(allow, denied, SeccompAction::Allow)?);
            Ok(out)
        }
        Profile::Compiler | Profile::Interpreter => deny_list_filters(profile, opts, denied),
    }
}

/// The rules of [`Profile::Runner`]'s allow-list: [`RUNNER_ALLOWED`], and with arguments
/// `clone` of threads, signals to itself, some `prctl` options, `seccomp` adding a filter and
/// `prlimit64` reading; with `write_opens`, [`PROFILER_CALLS`] and signal 0 to any process;
/// [`PROFILER_SOCKET_CALLS`] on the profiler's own sockets.
fn runner_allowed(opts: &FilterOptions) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SandboxError> {
    let me = opts.self_pid as u64;
    let mut allow: BTreeMap<i64, Vec<SeccompRule>> =
        RUNNER_ALLOWED.iter().map(|(n, _)| (*n, vec![])).collect();
    // Threads, not processes.
    allow.insert(
        libc::SYS_clone,
        vec![rule(vec![has_bit(0, libc::CLONE_THREAD as u64)?])?],
    );
    // Signals to itself only (abort, thread cancellation).
    let to_me = |arg: u8| cond(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, me);
    allow.insert(libc::SYS_kill, vec![rule(vec![to_me(0)?])?]);
    allow.insert(libc::SYS_tgkill, vec![rule(vec![to_me(0)?])?]);
    // Thread names and the loader's mapping names, nothing else of prctl.
    let pr = |v: u64| -> Result<SeccompRule, SandboxError> {
        rule(vec![cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v)?])
    };
    allow.insert(
        libc::SYS_prctl,
        vec![
            pr(libc::PR_SET_NAME as u64)?,
            pr(libc::PR_GET_NAME as u64)?,
            pr(libc::PR_GET_DUMPABLE as u64)?,
            pr(libc::PR_SET_NO_NEW_PRIVS as u64)?,
            pr(0x5356_4d41)?, // PR_SET_VMA (glibc names anonymous mappings)
        ],
    );
    // More filters ([`exec_filter`], once the candidate is loaded): they only restrict.
    allow.insert(
        libc::SYS_seccomp,
        vec![rule(vec![cond(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            1, // SECCOMP_SET_MODE_FILTER
        )?])?],
    );
    // Reading limits, not setting them.
    allow.insert(
        libc::SYS_prlimit64,
        vec![rule(vec![cond(
            2,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::Eq,
            0,
        )?])?],
    );
    if opts.write_opens {
        allow.extend(PROFILER_CALLS.iter().map(|(n, _)| (*n, vec![])));
        // Whether a lock's holder still lives: signal 0 to any process (no signal is
        // sent).
        allow.insert(
            libc::SYS_kill,
            vec![
                rule(vec![to_me(0)?])?,
                rule(vec![cond(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, 0)?])?,
            ],
        );
    }
    // A profiler's own sockets, by descriptor.
    if !opts.profiler_fds.is_empty() {
        let on_fd = |fd: i32| -> Result<SeccompRule, SandboxError> {
            rule(vec![cond(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                fd as u32 as u64,
            )?])
        };
        for (nr, _) in PROFILER_SOCKET_CALLS {
            let rules = opts
                .profiler_fds
                .iter()
                .map(|&fd| on_fd(fd))
                .collect::<Result<Vec<_>, _>>()?;
            allow.insert(*nr, rules);
        }
    }
    Ok(allow)
}

/// The filters of the deny-list profiles ([`Profile::Compiler`], [`Profile::Interpreter`]) in
/// install order, the deny-list (calls to `denied`) last.
fn deny_list_filters(
    profile: Profile,
    opts: &FilterOptions,
    denied: SeccompAction,
) -> Result<Vec<BpfProgram>, SandboxError> {
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
        OUTSIDE.iter().map(|(n, _)| (*n, vec![])).collect();
    deny.extend(SIGNALS_DENIED.iter().map(|n| (*n, vec![])));
    if profile == Profile::Interpreter {
        deny.insert(libc::SYS_fork, vec![]);
        deny.insert(libc::SYS_vfork, vec![]);
        deny.insert(
            libc::SYS_clone,
            vec![rule(vec![cond(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
                0,
            )?])?],
        );
    }
    let mut out = Vec::new();
    if profile == Profile::Interpreter {
        out.push(clone3_filter()?);
    }
    out.push(owner_filter()?);
    if !opts.installed_in_forks {
        out.push(signal_filter(profile, opts)?);
    }
    out.push(compile(deny, SeccompAction::Allow, denied)?);
    Ok(out)
}

/// The runner's last filter, installed once the candidate is loaded (its code mapped): no new
/// executable memory, i.e. `mmap`, `mprotect` and `pkey_mprotect` with `PROT_EXEC` in their
/// protection argument are denied (`SIGSYS`, reported like every denied call; logged with
/// `log_only`), and so is `seccomp` (no filter after this one). Code a candidate writes at run
/// time, or a library it maps later, cannot run.
///
/// # Errors
/// [`SandboxError::Seccomp`] if the filter does not compile (a bug, not an input error).
pub fn exec_filter(opts: &FilterOptions) -> Result<BpfProgram, SandboxError> {
    let denied = if opts.log_only {
        SeccompAction::Log
    } else {
        SeccompAction::Trap
    };
    let exec = || rule(vec![has_bit(2, libc::PROT_EXEC as u64)?]);
    let mut rules = BTreeMap::new();
    for nr in [libc::SYS_mmap, libc::SYS_mprotect, libc::SYS_pkey_mprotect] {
        rules.insert(nr, vec![exec()?]);
    }
    // The last filter: nothing may add one after it (a filter answering chosen calls with
    // success would fake them).
    rules.insert(libc::SYS_seccomp, vec![]);
    compile(rules, SeccompAction::Allow, denied)
}

/// `filters` as bytes, for a program that installs them itself (`seccomp(2)` with
/// `SECCOMP_SET_MODE_FILTER`, in this order): per filter a little-endian `u32` count of
/// instructions, then the instructions as the kernel's `struct sock_filter` (8 bytes each:
/// `u16` code, `u8` jt, `u8` jf, `u32` k, little-endian). Read by `install_handed_filters` in
/// `python/cudarl_worker.py`.
pub fn to_bytes(filters: &[BpfProgram]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in filters {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        for i in f {
            out.extend_from_slice(&i.code.to_le_bytes());
            out.extend_from_slice(&[i.jt, i.jf]);
            out.extend_from_slice(&i.k.to_le_bytes());
        }
    }
    out
}

/// Installs `filters` (after setting `no_new_privs`), on every thread of the process
/// (`SECCOMP_FILTER_FLAG_TSYNC`) when `all_threads`, else on the calling thread (and threads it
/// starts later).
///
/// # Errors
/// [`SandboxError::Seccomp`] when the kernel refuses a filter.
pub fn install(filters: &[BpfProgram], all_threads: bool) -> Result<(), SandboxError> {
    crate::process::no_new_privs()?;
    for f in filters {
        let r = if all_threads {
            seccompiler::apply_filter_all_threads(f)
        } else {
            seccompiler::apply_filter(f)
        };
        r.map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::child::in_child;

    fn opts() -> FilterOptions {
        FilterOptions {
            // SAFETY: getpid has no preconditions.
            self_pid: unsafe { libc::getpid() },
            ..Default::default()
        }
    }

    #[test]
    fn the_runner_profile_traps_exec_and_fails_write_opens() {
        // exec traps: the child dies of SIGSYS.
        let (_, sig) = in_child(|| {
            let f = filters(Profile::Runner, &opts()).unwrap();
            install(&f, false).unwrap();
            let sh = c"/bin/true";
            let argv = [sh.as_ptr(), std::ptr::null()];
            // SAFETY: a valid path and argv.
            unsafe { libc::execv(sh.as_ptr(), argv.as_ptr()) };
            3
        });
        assert_eq!(sig, libc::SIGSYS);
        // A socket traps too.
        let (_, sig) = in_child(|| {
            install(&filters(Profile::Runner, &opts()).unwrap(), false).unwrap();
            // SAFETY: plain syscall.
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            3
        });
        assert_eq!(sig, libc::SIGSYS);
        // Reading works, opening for writing is EACCES, the process goes on.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        std::fs::write(&p, "1").unwrap();
        let (code, sig) = in_child(move || {
            install(&filters(Profile::Runner, &opts()).unwrap(), false).unwrap();
            if std::fs::read(&p).is_err() {
                return 4;
            }
            match std::fs::OpenOptions::new().append(true).open(&p) {
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => 0,
                _ => 5,
            }
        });
        assert_eq!((code, sig), (0, 0));
    }

    #[test]
    fn after_the_runner_profile_the_exec_filter_can_be_added_and_denies_executable_memory() {
        // Installed behind the runner's allow-list, as the runner does once the candidate is
        // loaded; writable memory still maps, executable memory traps.
        let (code, sig) = in_child(|| {
            install(&filters(Profile::Runner, &opts()).unwrap(), false).unwrap();
            if install(&[exec_filter(&opts()).unwrap()], false).is_err() {
                return 5;
            }
            let (rw, len) = (libc::PROT_READ | libc::PROT_WRITE, 4096);
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            // SAFETY: an anonymous private page.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), len, rw, flags, -1, 0) };
            if p == libc::MAP_FAILED {
                return 6;
            }
            // SAFETY: the page mapped above; trapped.
            unsafe { libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC) };
            7
        });
        assert_eq!((code, sig), (-1, libc::SIGSYS));
        let (code, sig) = in_child(|| {
            install(&[exec_filter(&opts()).unwrap()], false).unwrap();
            let prot = libc::PROT_READ | libc::PROT_EXEC;
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            // SAFETY: an anonymous private page; trapped.
            unsafe { libc::mmap(std::ptr::null_mut(), 4096, prot, flags, -1, 0) };
            8
        });
        assert_eq!((code, sig), (-1, libc::SIGSYS));
    }

    #[test]
    fn threads_are_allowed_processes_are_not() {
        let (code, sig) = in_child(|| {
            install(&filters(Profile::Runner, &opts()).unwrap(), false).unwrap();
            let t = std::thread::spawn(|| 7);
            if t.join().ok() != Some(7) {
                return 6;
            }
            // SAFETY: plain fork; the filter traps it.
            unsafe { libc::fork() };
            8
        });
        assert_eq!((code, sig), (-1, libc::SIGSYS));
    }

    #[test]
    fn the_interpreter_profile_allows_threads_but_no_processes_or_sockets() {
        let (code, sig) = in_child(|| {
            install(&filters(Profile::Interpreter, &opts()).unwrap(), false).unwrap();
            if std::thread::spawn(|| 1).join().ok() != Some(1) {
                return 6;
            }
            // SAFETY: plain syscall; trapped.
            unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
            9
        });
        assert_eq!((code, sig), (-1, libc::SIGSYS));
        let (code, sig) = in_child(|| {
            install(&filters(Profile::Interpreter, &opts()).unwrap(), false).unwrap();
            // std's Command uses clone3/clone(CLONE_VM|CLONE_VFORK) or fork: none is a thread.
            match std::process::Command::new("/bin/true").status() {
                Ok(_) => 10,
                Err(_) => 11,
            }
        });
        assert_eq!(sig, libc::SIGSYS, "code {code}");
    }

    #[test]
    fn the_compiler_profile_runs_processes_but_no_sockets() {
        let (code, sig) = in_child(|| {
            install(&filters(Profile::Compiler, &opts()).unwrap(), false).unwrap();
            match std::process::Command::new("/bin/true").status() {
                Ok(s) if s.success() => {}
                _ => return 12,
            }
            // SAFETY: plain syscall; trapped.
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
            13
        });
        assert_eq!((code, sig), (-1, libc::SIGSYS));
    }

    #[test]
    fn a_profiler_socket_is_usable_and_no_other_socket_is() {
        let (code, sig) = in_child(|| {
            let mut profiler = [0i32; 2];
            let mut other = [0i32; 2];
            // SAFETY: out-arrays of two descriptors.
            unsafe {
                libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, profiler.as_mut_ptr());
                libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, other.as_mut_ptr());
            }
            let o = FilterOptions {
                profiler_fds: vec![profiler[0]],
                ..opts()
            };
            install(&filters(Profile::Runner, &o).unwrap(), false).unwrap();
            let msg = b"metrics";
            // SAFETY: a valid buffer on a connected socket.
            let sent = unsafe {
                libc::sendto(
                    profiler[0],
                    msg.as_ptr().cast(),
                    msg.len(),
                    0,
                    std::ptr::null(),
                    0,
                )
            };
            let mut buf = [0u8; 16];
            // SAFETY: as above, the other end of the profiler's pair (plain read is allowed).
            let got = unsafe { libc::read(profiler[1], buf.as_mut_ptr().cast(), buf.len()) };
            if sent != msg.len() as isize || got != sent {
                return 20;
            }
            // SAFETY: as above, on a socket that is not the profiler's: trapped.
            unsafe {
                libc::sendto(
                    other[0],
                    msg.as_ptr().cast(),
                    msg.len(),
                    0,
                    std::ptr::null(),
                    0,
                )
            };
            21
        });
        assert_eq!((code, sig), (-1, libc::SIGSYS));
    }

    #[test]
    fn a_profile_pass_may_open_for_writing_and_remove_its_lock_and_still_not_exec() {
        let d = tempfile::tempdir().unwrap();
        let lock = d.path().join("lock");
        let (code, sig) = in_child(move || {
            let o = FilterOptions {
                write_opens: true,
                ..opts()
            };
            install(&filters(Profile::Runner, &o).unwrap(), false).unwrap();
            if std::fs::File::create(&lock).is_err() || std::fs::remove_file(&lock).is_err() {
                return 30;
            }
            let sh = c"/bin/true";
            let argv = [sh.as_ptr(), std::ptr::null()];
            // SAFETY: a valid path and argv; trapped.
            unsafe { libc::execv(sh.as_ptr(), argv.as_ptr()) };
            31
        });
        assert_eq!((code, sig), (-1, libc::SIGSYS));
    }

    static GOT_USR1: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    extern "C" fn on_usr1(_: libc::c_int) {
        GOT_USR1.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Filters handed to the torch zygote carry the zygote's pid; the runners it forks install
    /// them: their signals to themselves must still work (the pid-bound rules are each
    /// runner's own), and `tkill` still traps.
    #[test]
    fn filters_installed_in_forks_leave_the_pid_bound_signal_rules_out() {
        let handed = |installed_in_forks| FilterOptions {
            // SAFETY: getpid has no preconditions; this is the pid of the test process, not of
            // the child that installs the filters.
            self_pid: unsafe { libc::getpid() },
            installed_in_forks,
            ..Default::default()
        };
        assert_eq!(
            filters(Profile::Interpreter, &handed(true)).unwrap().len(),
            3
        );
        assert_eq!(
            filters(Profile::Interpreter, &handed(false)).unwrap().len(),
            4
        );
        for (installed_in_forks, expected) in [(true, 0), (false, libc::EPERM)] {
            let o = handed(installed_in_forks);
            let (code, sig) = in_child(move || {
                // SAFETY: a handler that only stores to an atomic.
                unsafe { libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t) };
                install(&filters(Profile::Interpreter, &o).unwrap(), false).unwrap();
                // SAFETY: a caught signal to this process.
                if unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) } == 0 {
                    return 0;
                }
                std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
            });
            assert_eq!((code, sig), (expected, 0), "{installed_in_forks}");
        }
        let (_, sig) = in_child(|| {
            install(
                &filters(Profile::Interpreter, &handed(true)).unwrap(),
                false,
            )
            .unwrap();
            // SAFETY: tkill to this thread; trapped.
            unsafe { libc::syscall(libc::SYS_tkill, libc::gettid(), libc::SIGUSR1) };
            40
        });
        assert_eq!(sig, libc::SIGSYS);
    }

    #[test]
    fn names_of_denied_calls() {
        assert_eq!(name(libc::SYS_execve), "execve");
        assert_eq!(name(libc::SYS_socket), "socket");
        assert_eq!(name(100_000), "syscall 100000");
    }
}
