//! Installing a test's SIGPROF handler, shared by the signal tests.

/// Installs `handler` for SIGPROF (with `SA_RESTART`), replacing any other.
///
/// # Safety
/// `handler` must be async-signal-safe: it runs between any two instructions of
/// the thread it interrupts.
pub unsafe fn install_sigprof(handler: extern "C" fn(libc::c_int)) {
    // SAFETY: a zeroed sigaction is a valid starting value; the handler's safety is
    // the caller's contract.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as *const () as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGPROF, &action, std::ptr::null_mut()),
            0
        );
    }
}
