//! The trampoline every function of the module is called through, and what
//! its call cell holds when the function has no live definition.
//!
//! Callers (other functions of the module, data that holds a function's
//! address, and the host through `get_finalized_function`) reach a function
//! at its trampoline, which jumps through the function's call cell:
//!
//! ```text
//! movabs r11, <cell>     ; 49 BB imm64
//! jmp    qword ptr [r11] ; 41 FF 23
//! ```
//!
//! r11 is a scratch register in the System V ABI, never an argument, so the
//! jump passes every argument and the return address through untouched.
//! Redefining a function is one Release store to its cell; the trampoline
//! itself never changes, so no caller is patched.

/// The trampoline's size in bytes.
pub(crate) const LEN: usize = 13;

/// The trampoline that jumps through the cell at `cell`.
pub(crate) fn trampoline(cell: usize) -> [u8; LEN] {
    let mut code = [0u8; LEN];
    code[..2].copy_from_slice(&[0x49, 0xBB]);
    code[2..10].copy_from_slice(&(cell as u64).to_le_bytes());
    code[10..].copy_from_slice(&[0x41, 0xFF, 0x23]);
    code
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn the_trampoline_loads_the_cell_and_jumps_through_it() {
        let code = super::trampoline(0x1122_3344_5566_7788);
        assert_eq!(
            code,
            [
                0x49, 0xBB, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x41, 0xFF, 0x23
            ]
        );
    }
}
