//! SIGTERM after `interrupt::install` (in a test binary of its own: the flag is process-wide).

use cudarl_core::interrupt;

#[test]
fn the_first_signal_only_requests_a_stop_even_after_a_second_install() {
    interrupt::install().unwrap();
    // A second set of handlers would see the first signal as the second and end the process.
    interrupt::install().unwrap();
    assert!(!interrupt::requested());
    signal_hook::low_level::raise(signal_hook::consts::SIGTERM).unwrap();
    assert!(
        interrupt::requested(),
        "the signal set the flag and the process lives on"
    );
}
