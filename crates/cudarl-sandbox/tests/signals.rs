//! Whom a sandboxed process may signal, with real processes of the same user.
//!
//! Each case forks a parent (outside any sandbox, catching `SIGTERM`) that forks the child under
//! test; the test itself starts a sibling, a real `sleep`. The child sets up its sandbox through
//! the crate's entry points ([`cudarl_sandbox::confine`] as `cudarl-pipe-runner exec` does, or
//! one layer alone: [`FsPolicy::restrict`], or the seccomp filters), then sends `SIGTERM` to its
//! parent and to the sibling. Every case has a control: the same calls from an unsandboxed child
//! do signal both, so a sandboxed case that fails to signal them shows the sandbox at work.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cudarl_sandbox::{ConfineOptions, FilterOptions, FsPolicy, Limits, Profile, Scopes, syscalls};

#[path = "../src/child.rs"]
mod child;
use child::{in_child, wait};

/// A signal call aimed at one process.
#[derive(Debug, Clone, Copy)]
enum Call {
    Kill,
    Tgkill,
    Tkill,
    Sigqueue,
    TgSigqueue,
    /// `pidfd_send_signal` on the target's `/proc/<pid>` directory, opened before the sandbox.
    Pidfd,
    /// A pipe made to signal its owner when it is readable: `fcntl` `F_SETOWN` (the target),
    /// `F_SETSIG` (`SIGTERM`), `O_ASYNC`, then a byte written to it.
    Owner,
}

/// A queued signal's information: `SI_QUEUE`, as `sigqueue(3)` sends it (the kernel refuses a
/// non-negative code towards another process whatever the sandbox).
fn queued() -> libc::siginfo_t {
    // SAFETY: siginfo_t is plain data; zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    info.si_signo = libc::SIGTERM;
    info.si_code = libc::SI_QUEUE;
    info
}

/// What `call` names its target by: the pid, or for [`Call::Pidfd`] a descriptor of its
/// `/proc/<pid>` directory (opened now, before the sandbox).
fn target(call: Call, pid: i32) -> i32 {
    match call {
        Call::Pidfd => {
            let p = std::ffi::CString::new(format!("/proc/{pid}")).unwrap();
            // SAFETY: a valid path; the descriptor lives until the process ends.
            unsafe { libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) }
        }
        _ => pid,
    }
}

/// Sends `SIGTERM` to `pid` (for [`Call::Pidfd`], a [`target`] descriptor) with `call`: 0, or
/// the errno.
fn send(call: Call, pid: i32) -> i32 {
    if let Call::Owner = call {
        return owner_signal(pid);
    }
    let info = queued();
    let (p, t) = (pid as libc::c_long, libc::SIGTERM as libc::c_long);
    // SAFETY: plain system calls with integer arguments and a valid siginfo pointer.
    let r = unsafe {
        match call {
            Call::Kill => libc::kill(pid, libc::SIGTERM) as libc::c_long,
            Call::Tgkill => libc::syscall(libc::SYS_tgkill, p, p, t),
            Call::Tkill => libc::syscall(libc::SYS_tkill, p, t),
            Call::Sigqueue => libc::syscall(libc::SYS_rt_sigqueueinfo, p, t, &info),
            Call::TgSigqueue => libc::syscall(libc::SYS_rt_tgsigqueueinfo, p, p, t, &info),
            Call::Pidfd => libc::syscall(
                libc::SYS_pidfd_send_signal,
                p,
                t,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_long,
            ),
            Call::Owner => unreachable!("sent above"),
        }
    };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// [`Call::Owner`] towards `pid`: 0 once the byte is written, or the errno of the first call
/// refused.
fn owner_signal(pid: i32) -> i32 {
    let err = || std::io::Error::last_os_error().raw_os_error().unwrap_or(-1);
    let mut fds = [0; 2];
    // SAFETY: plain system calls on descriptors this process made.
    unsafe {
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return err();
        }
        // F_SETOWN, F_SETSIG (<asm-generic/fcntl.h>)
        if libc::fcntl(fds[0], 8, pid) != 0 || libc::fcntl(fds[0], 10, libc::SIGTERM) != 0 {
            return err();
        }
        if libc::fcntl(fds[0], libc::F_SETFL, libc::O_ASYNC | libc::O_NONBLOCK) != 0
            || libc::write(fds[1], b"x".as_ptr().cast(), 1) != 1
        {
            return err();
        }
    }
    0
}

/// The sibling: a real process of the same user outside every sandbox.
struct Sibling(Child);

impl Sibling {
    fn start() -> Sibling {
        Sibling(
            Command::new("sleep")
                .arg("60")
                .spawn()
                .expect("start sleep"),
        )
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// Still running a while after the attempts (long enough for a delivered `SIGTERM` to end
    /// it).
    fn alive(&mut self) -> bool {
        std::thread::sleep(Duration::from_millis(150));
        self.0.try_wait().unwrap().is_none()
    }

    /// The signal that ended it, waiting up to 5 s; `None` if it still runs.
    fn ended_by(&mut self) -> Option<i32> {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Some(st) = self.0.try_wait().unwrap() {
                return st.signal();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Sibling {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

static PARENT_GOT_TERM: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    PARENT_GOT_TERM.store(true, Ordering::SeqCst);
}

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Exit status: what its attempts got ([`Attempts`]).
    Exit(i32),
    /// Killed by this signal (`SIGSYS`: a trapped call).
    Signal(i32),
}

/// The child's exit status when its sandbox could not be set up.
const SETUP_FAILED: i32 = 63;

/// What the two attempts got, as the child's exit status: `4 * parent + sibling`, each 0 for
/// `EPERM`, 1 for success, 2 for another error (so status 0: both refused with `EPERM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Attempts {
    parent: i32,
    sibling: i32,
}

const SENT: Attempts = Attempts {
    parent: 1,
    sibling: 1,
};

fn code(errno: i32) -> i32 {
    match errno {
        0 => 1,
        libc::EPERM => 0,
        _ => 2,
    }
}

/// What a case saw: how the child ended and whether its parent got `SIGTERM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    child: End,
    parent_signalled: bool,
}

impl Seen {
    fn attempts(&self) -> Option<Attempts> {
        match self.child {
            End::Exit(c) if c != SETUP_FAILED => Some(Attempts {
                parent: c / 4,
                sibling: c % 4,
            }),
            _ => None,
        }
    }
}

/// Forks the parent, which forks the child; the child runs `setup` (its sandbox; false: it
/// failed), then `call` at its parent and at `sibling`.
fn case(sibling: i32, call: Call, setup: &dyn Fn() -> bool) -> Seen {
    // SAFETY: the forked processes only set up sandboxes, make system calls and `_exit`.
    let parent = unsafe { libc::fork() };
    assert!(parent >= 0);
    if parent == 0 {
        // SAFETY: a handler that only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_term as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
        }
        // SAFETY: as above.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: getppid has no preconditions.
            let targets = [
                target(call, unsafe { libc::getppid() }),
                target(call, sibling),
            ];
            if targets.iter().any(|&t| t < 0) || !setup() {
                // SAFETY: leaves the forked child.
                unsafe { libc::_exit(SETUP_FAILED) };
            }
            let p = code(send(call, targets[0]));
            let s = code(send(call, targets[1]));
            // SAFETY: leaves the forked child.
            unsafe { libc::_exit(4 * p + s) };
        }
        let st = wait(child);
        let end = if libc::WIFSIGNALED(st) {
            64 | libc::WTERMSIG(st)
        } else {
            libc::WEXITSTATUS(st)
        };
        let got = if PARENT_GOT_TERM.load(Ordering::SeqCst) {
            128
        } else {
            0
        };
        // SAFETY: leaves the forked parent.
        unsafe { libc::_exit(got | end) };
    }
    let st = wait(parent);
    assert!(libc::WIFEXITED(st), "the parent died: {st:#x}");
    let c = libc::WEXITSTATUS(st);
    Seen {
        child: if c & 64 != 0 {
            End::Signal(c & 63)
        } else {
            End::Exit(c & 63)
        },
        parent_signalled: c & 128 != 0,
    }
}

/// The same call from an unsandboxed child signals both its parent and the sibling.
fn control(call: Call) {
    let mut sib = Sibling::start();
    let seen = case(sib.pid(), call, &|| true);
    assert_eq!(seen.attempts(), Some(SENT), "{call:?}: {seen:?}");
    assert!(seen.parent_signalled, "{call:?}: {seen:?}");
    assert_eq!(sib.ended_by(), Some(libc::SIGTERM), "{call:?}");
}

/// `call` from a child set up by `setup` reaches neither its parent nor the sibling; returns
/// how the child ended.
fn denied(call: Call, setup: &dyn Fn() -> bool) -> End {
    let mut sib = Sibling::start();
    let seen = case(sib.pid(), call, setup);
    assert_ne!(
        seen.child,
        End::Exit(SETUP_FAILED),
        "{call:?}: set-up failed"
    );
    assert!(
        !seen.parent_signalled,
        "{call:?} reached the parent: {seen:?}"
    );
    assert!(sib.alive(), "{call:?} reached the sibling: {seen:?}");
    seen.child
}

/// The Landlock ABI of the running kernel (0: none).
fn landlock_abi() -> i64 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with no attributes.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    v.max(0)
}

/// `cudarl-pipe-runner exec`'s set-up for `profile` with nothing on the file system.
fn confined(profile: Profile) -> impl Fn() -> bool {
    move || {
        cudarl_sandbox::confine(
            profile,
            &FsPolicy::default(),
            &Limits::default(),
            ConfineOptions::default(),
        )
        .is_ok()
    }
}

/// The seccomp filters of `profile` alone (no Landlock), for this process.
fn filtered(profile: Profile, write_opens: bool) -> impl Fn() -> bool {
    move || {
        let opts = FilterOptions {
            // SAFETY: getpid has no preconditions.
            self_pid: unsafe { libc::getpid() },
            write_opens,
            ..Default::default()
        };
        syscalls::filters(profile, &opts).is_ok_and(|f| syscalls::install(&f, false).is_ok())
    }
}

/// Landlock alone with `scopes` (nothing on the file system, no seccomp); false unless the
/// kernel scoped signals as asked.
fn scoped(scopes: Scopes) -> impl Fn() -> bool {
    move || {
        let p = FsPolicy {
            scopes,
            ..Default::default()
        };
        p.restrict(false)
            .is_ok_and(|s| s.enforced && s.signals_scoped == scopes.signals)
    }
}

const POSIX_CALLS: [Call; 4] = [Call::Kill, Call::Tgkill, Call::Sigqueue, Call::TgSigqueue];

#[test]
fn unsandboxed_children_do_signal_their_parent_and_a_sibling() {
    for call in POSIX_CALLS {
        control(call);
    }
    control(Call::Tkill);
    control(Call::Pidfd);
    control(Call::Owner);
}

#[test]
fn compiler_and_interpreter_processes_signal_neither_their_parent_nor_a_sibling() {
    for profile in [Profile::Compiler, Profile::Interpreter] {
        for call in POSIX_CALLS {
            // Landlock and seccomp together, as the exec wrapper sets them up.
            let end = denied(call, &confined(profile));
            assert_eq!(end, End::Exit(0), "{profile:?} {call:?}: EPERM both");
            // seccomp alone (a kernel without Landlock ABI 6): the same.
            let end = denied(call, &filtered(profile, false));
            assert_eq!(
                end,
                End::Exit(0),
                "{profile:?} {call:?} (seccomp): EPERM both"
            );
        }
        // A descriptor's owner signal: the fcntl commands that name one get EPERM.
        let end = denied(Call::Owner, &confined(profile));
        assert_eq!(end, End::Exit(0), "{profile:?} owner: EPERM both");
        let end = denied(Call::Owner, &filtered(profile, false));
        assert_eq!(end, End::Exit(0), "{profile:?} owner (seccomp): EPERM both");
        // Calls nothing in these processes needs trap.
        for call in [Call::Tkill, Call::Pidfd] {
            let end = denied(call, &confined(profile));
            assert_eq!(end, End::Signal(libc::SIGSYS), "{profile:?} {call:?}");
        }
    }
}

#[test]
fn landlock_alone_scopes_signals_to_the_domain() {
    let abi = landlock_abi();
    if abi < 6 {
        eprintln!("SKIPPED: Landlock ABI {abi}: signal scoping needs ABI 6 (Linux 6.12)");
        return;
    }
    for call in POSIX_CALLS.into_iter().chain([Call::Tkill, Call::Pidfd]) {
        let end = denied(call, &scoped(Scopes::default()));
        assert_eq!(end, End::Exit(0), "{call:?}: EPERM both");
    }
    // A descriptor's owner signal is set up but never delivered outside the domain.
    denied(Call::Owner, &scoped(Scopes::default()));
    // Without the scope the same domain lets the signals through.
    let mut sib = Sibling::start();
    let off = Scopes {
        signals: false,
        abstract_unix_sockets: true,
    };
    let seen = case(sib.pid(), Call::Kill, &scoped(off));
    assert_eq!(seen.attempts(), Some(SENT), "{seen:?}");
    assert_eq!(sib.ended_by(), Some(libc::SIGTERM));
}

#[test]
fn the_runner_signals_only_itself_and_a_profile_pass_only_probes() {
    for write_opens in [false, true] {
        for call in POSIX_CALLS.into_iter().chain([Call::Tkill]) {
            let end = denied(call, &filtered(Profile::Runner, write_opens));
            assert_eq!(end, End::Signal(libc::SIGSYS), "{call:?} {write_opens}");
        }
        let end = denied(Call::Owner, &filtered(Profile::Runner, write_opens));
        assert_eq!(end, End::Exit(0), "owner {write_opens}: EPERM both");
    }
    // A profile pass's liveness probe (signal 0) goes anywhere and sends nothing.
    let mut sib = Sibling::start();
    let pid = sib.pid();
    let (code, _) = in_child(move || {
        if !filtered(Profile::Runner, true)() {
            return SETUP_FAILED;
        }
        // SAFETY: signal 0: only a permission and existence check.
        unsafe { libc::kill(pid, 0) }
    });
    assert_eq!(code, 0);
    assert!(sib.alive());
}

static GOT_USR1: AtomicBool = AtomicBool::new(false);

extern "C" fn on_usr1(_: libc::c_int) {
    GOT_USR1.store(true, Ordering::SeqCst);
}

fn catch(sig: libc::c_int, h: extern "C" fn(libc::c_int)) {
    // SAFETY: a handler that only stores to an atomic.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = h as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

#[test]
fn a_sandboxed_process_still_signals_itself_and_aborts_as_usual() {
    for profile in [Profile::Compiler, Profile::Interpreter] {
        let (code, sig) = in_child(move || {
            catch(libc::SIGUSR1, on_usr1);
            if !confined(profile)() {
                return SETUP_FAILED;
            }
            // raise(3) is tgkill(getpid(), gettid(), sig).
            // SAFETY: a caught signal.
            if unsafe { libc::raise(libc::SIGUSR1) } != 0 || !GOT_USR1.swap(false, Ordering::SeqCst)
            {
                return 1;
            }
            // SAFETY: as above.
            if unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) } != 0
                || !GOT_USR1.load(Ordering::SeqCst)
            {
                return 2;
            }
            // SAFETY: ends the process with SIGABRT (raise, then the default action).
            unsafe { libc::abort() }
        });
        assert_eq!((code, sig), (-1, libc::SIGABRT), "{profile:?}");
    }
}

static GOT_TERM: AtomicBool = AtomicBool::new(false);

extern "C" fn on_own_term(_: libc::c_int) {
    GOT_TERM.store(true, Ordering::SeqCst);
}

/// nvcc, started in its own process group, stops its children through the group; signalling a
/// child by pid is refused (the filter knows nvcc's pid only).
#[test]
fn the_compiler_signals_its_own_process_group() {
    let sleep_exe = ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("sleep");
    let (code, sig) = in_child(move || {
        // SAFETY: a new process group led by this child, as the judge spawns nvcc.
        if unsafe { libc::setpgid(0, 0) } != 0 {
            return SETUP_FAILED;
        }
        catch(libc::SIGTERM, on_own_term);
        let mut read = FsPolicy::system_libraries();
        read.push("/etc".into());
        let mut exec: Vec<std::path::PathBuf> = vec!["/usr/bin".into(), "/bin".into()];
        exec.extend(FsPolicy::dynamic_loader());
        let policy = FsPolicy {
            read,
            exec,
            devices: vec!["/dev/null".into()],
            ..Default::default()
        };
        if cudarl_sandbox::confine(
            Profile::Compiler,
            &policy,
            &Limits::default(),
            ConfineOptions::default(),
        )
        .is_err()
        {
            return SETUP_FAILED;
        }
        let Ok(mut sleep) = Command::new(sleep_exe).arg("60").spawn() else {
            return 3;
        };
        if send(Call::Kill, sleep.id() as i32) != libc::EPERM {
            return 4;
        }
        // SAFETY: getpid has no preconditions; -pid is this process's group.
        if unsafe { libc::kill(-libc::getpid(), libc::SIGTERM) } != 0 {
            return 5;
        }
        match sleep.wait() {
            Ok(st) if st.signal() == Some(libc::SIGTERM) => {}
            _ => return 6,
        }
        if !GOT_TERM.load(Ordering::SeqCst) {
            return 7;
        }
        // kill(0, ...) is the group too.
        // SAFETY: a caught signal to this process's group (itself alone now).
        if unsafe { libc::kill(0, libc::SIGTERM) } != 0 {
            return 8;
        }
        0
    });
    assert_eq!((code, sig), (0, 0));
}

/// An interpreter leads its own group too (the judge spawns it so), yet may not name it: its
/// signals go to its pid only.
#[test]
fn the_interpreter_may_not_signal_its_group() {
    let (code, sig) = in_child(|| {
        // SAFETY: as above.
        if unsafe { libc::setpgid(0, 0) } != 0 {
            return SETUP_FAILED;
        }
        catch(libc::SIGTERM, on_own_term);
        if !confined(Profile::Interpreter)() {
            return SETUP_FAILED;
        }
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        if send(Call::Kill, 0) != libc::EPERM || send(Call::Kill, -me) != libc::EPERM {
            return 1;
        }
        if GOT_TERM.load(Ordering::SeqCst) {
            return 2;
        }
        0
    });
    assert_eq!((code, sig), (0, 0));
}

/// An abstract Unix socket bound outside the domain: connecting fails with `EPERM` under the
/// scope (Landlock alone: the deny-lists trap `socket` anyway), and works without it.
#[test]
fn the_abstract_socket_scope_keeps_a_process_from_connecting_outside() {
    let abi = landlock_abi();
    if abi < 6 {
        eprintln!("SKIPPED: Landlock ABI {abi}: socket scoping needs ABI 6 (Linux 6.12)");
        return;
    }
    let name = format!("cudarl-sandbox-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .expect("abstract address");
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind");
    for (scope, expected) in [(true, libc::EPERM), (false, 0)] {
        let addr = addr.clone();
        let (code, sig) = in_child(move || {
            let p = FsPolicy {
                scopes: Scopes {
                    signals: true,
                    abstract_unix_sockets: scope,
                },
                ..Default::default()
            };
            match p.restrict(false) {
                Ok(s) if s.abstract_unix_sockets_scoped == scope => {}
                _ => return SETUP_FAILED,
            }
            match std::os::unix::net::UnixStream::connect_addr(&addr) {
                Ok(_) => 0,
                Err(e) => e.raw_os_error().unwrap_or(-1),
            }
        });
        assert_eq!((code, sig), (expected, 0), "scope {scope}");
    }
    drop(listener);
}

#[test]
fn the_status_says_whether_signals_are_scoped() {
    let abi = landlock_abi();
    let (code, _) = in_child(move || {
        let Ok(s) = FsPolicy::default().restrict(true) else {
            return SETUP_FAILED;
        };
        let expect = s.enforced && abi >= 6;
        let line = s.summary();
        if s.signals_scoped != expect
            || s.abstract_unix_sockets_scoped != expect
            || line.contains("signals") != expect
        {
            return 1;
        }
        0
    });
    assert_eq!(code, 0);
}
