//! Reporting a denied system call: a `SIGSYS` handler (installed before the filters) writes
//! `{"violation":{"syscall":N}}` and a newline to the report descriptor and ends the process
//! with [`crate::VIOLATION_EXIT`]. The handler uses only `write` and `_exit` (async-signal-safe).
//! A candidate that replaces the handler only stops the report: the denied call still did not
//! run.

use std::sync::atomic::{AtomicI32, Ordering};

use crate::SandboxError;

static REPORT_FD: AtomicI32 = AtomicI32::new(-1);

/// Offset of `si_syscall` in x86-64 `siginfo_t` (`si_signo`, `si_errno`, `si_code`, padding,
/// then `_sigsys { void *_call_addr; int _syscall; unsigned int _arch; }`).
const SI_SYSCALL_OFFSET: usize = 24;

extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler; _sigsys is the
    // active member for SIGSYS.
    let nr = unsafe { *(info as *const u8).add(SI_SYSCALL_OFFSET).cast::<i32>() };
    let mut buf = [0u8; 64];
    let head = b"{\"violation\":{\"syscall\":";
    buf[..head.len()].copy_from_slice(head);
    let mut n = head.len();
    let mut digits = [0u8; 12];
    let mut k = 0;
    let mut v = nr.unsigned_abs();
    loop {
        digits[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while k > 0 {
        k -= 1;
        buf[n] = digits[k];
        n += 1;
    }
    for &b in b"}}\n" {
        buf[n] = b;
        n += 1;
    }
    let fd = REPORT_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) of a stack buffer; async-signal-safe.
        unsafe { libc::write(fd, buf.as_ptr().cast(), n) };
    }
    // SAFETY: leaves the process at once; async-signal-safe.
    unsafe { libc::_exit(crate::VIOLATION_EXIT) };
}

/// Installs the `SIGSYS` reporter writing to `fd`.
///
/// # Errors
/// `sigaction` failed.
pub fn install_reporter(fd: i32) -> Result<(), SandboxError> {
    REPORT_FD.store(fd, Ordering::Relaxed);
    // SAFETY: a zeroed sigaction with a valid SA_SIGINFO handler and an empty mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigsys as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) != 0 {
            return Err(SandboxError::Process(format!(
                "sigaction(SIGSYS): {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// Reads a reporter line: the system call number of `{"violation":{"syscall":N}}`.
pub fn parse_violation(line: &str) -> Option<i64> {
    let rest = line.trim().strip_prefix("{\"violation\":{\"syscall\":")?;
    rest.strip_suffix("}}")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denied_call_is_reported_by_number() {
        let mut fds = [0i32; 2];
        // SAFETY: a pipe for the report.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only installs the sandbox and makes a denied call.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            install_reporter(fds[1]).unwrap();
            let f = crate::syscalls::filters(
                crate::Profile::Runner,
                &crate::FilterOptions {
                    // SAFETY: no preconditions.
                    self_pid: unsafe { libc::getpid() },
                    ..Default::default()
                },
            )
            .unwrap();
            crate::syscalls::install(&f, false).unwrap();
            // SAFETY: trapped before it runs.
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            // SAFETY: not reached.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: closes the parent's copy of the write end.
        unsafe { libc::close(fds[1]) };
        let mut st = 0;
        // SAFETY: waits for the child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert_eq!(libc::WEXITSTATUS(st), crate::VIOLATION_EXIT);
        let mut buf = [0u8; 128];
        // SAFETY: reads the report.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        let line = String::from_utf8_lossy(&buf[..n as usize]).to_string();
        assert_eq!(parse_violation(&line), Some(libc::SYS_socket), "{line}");
        assert_eq!(crate::syscalls::name(libc::SYS_socket), "socket");
    }
}
