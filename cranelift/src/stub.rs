//! The trampoline every function of the module is called through, and what
//! its call cell holds when the function has no live definition.
//!
//! Callers (other functions of the module, data that holds a function's
//! address, and the host through `get_finalized_function`) reach a function
//! at its trampoline, which jumps through the function's call cell:
//!
//! The trampoline's bytes are the architecture's (`crate::arch`).
//! Redefining a function is one Release store to its cell; the trampoline
//! itself never changes, so no caller is patched.

/// The cell entry of a function with no live version: [`undefined_function`].
pub(crate) fn trap() -> jitmap::CodeAddress {
    jitmap::CodeAddress::new(undefined_function as *const () as usize)
}

/// Where a call cell points while its function is freed or not yet defined:
/// calling such a function is a documented error, and it ends the process
/// with a message rather than run bytes that may have been reused. It takes
/// whatever arguments the caller passed and ignores them.
pub(crate) extern "C" fn undefined_function() -> ! {
    // Signal-safe enough for its purpose: one write(2) and abort(3).
    const MESSAGE: &[u8] =
        b"jitmap-cranelift: a call reached a function that was freed or never defined\n";
    // SAFETY: writes a static buffer to stderr; the result does not matter.
    unsafe { libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len()) };
    std::process::abort()
}
