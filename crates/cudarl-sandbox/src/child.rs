//! Forked children for tests: a sandbox's layers restrict a process for good, so each case
//! runs in a child of its own. Shared by the crate's unit tests and `tests/signals.rs` (which
//! includes this file).

/// Waits for the child `pid` of this process (again after an interrupted wait): its wait
/// status.
///
/// # Panics
/// The wait fails other than by an interruption (`pid` is no child of this process).
pub fn wait(pid: i32) -> i32 {
    let mut st = 0;
    loop {
        // SAFETY: waits for a child of this process.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            return st;
        }
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINTR)
        );
    }
}

/// Runs `f` in a forked child: `(its exit status, 0)`, or `(-1, the signal that killed it)`.
///
/// # Panics
/// The fork fails.
pub fn in_child(f: impl FnOnce() -> i32) -> (i32, i32) {
    // SAFETY: the child runs `f` and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let c = f();
        // SAFETY: leaves the forked child.
        unsafe { libc::_exit(c) };
    }
    let st = wait(pid);
    if libc::WIFSIGNALED(st) {
        (-1, libc::WTERMSIG(st))
    } else {
        (libc::WEXITSTATUS(st), 0)
    }
}
