//! SIGINT and SIGTERM as a request to stop at the next safe point.
//!
//! After [`install`], the first SIGINT or SIGTERM only sets a flag: the engine starts no further
//! node ([`crate::Engine::run`] records them `skipped`), and a long stage that can stop between
//! units of work asks [`requested`] there (`rl-train` saves its progress after the step in
//! flight and ends with [`crate::StageError::Interrupted`]); the run then exits with
//! [`EXIT_CODE`]. A second signal ends the process at once with the same code, as a user who
//! presses Ctrl-C twice expects. Nothing a stage writes is published before its manifest, so
//! either way the store stays consistent (docs/architecture.md, "Interrupts").

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The exit code of an interrupted run: 128 + SIGINT, the shell's convention.
pub const EXIT_CODE: i32 = 130;

fn flag() -> &'static Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Installs the handlers for SIGINT and SIGTERM once; later calls return the first call's
/// outcome (a second set of handlers would make the first signal end the process).
///
/// # Errors
/// The handlers cannot be registered.
pub fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                // Registered first, so it sees the flag as the previous signal left it: set
                // means this is the second signal.
                signal_hook::flag::register_conditional_shutdown(
                    sig,
                    EXIT_CODE,
                    Arc::clone(flag()),
                )
                .map_err(|e| e.to_string())?;
                signal_hook::flag::register(sig, Arc::clone(flag())).map_err(|e| e.to_string())?;
            }
            Ok(())
        })
        .clone()
        .map_err(io::Error::other)
}

/// Whether a stop was requested (a signal since [`install`]).
pub fn requested() -> bool {
    flag().load(Ordering::SeqCst)
}
