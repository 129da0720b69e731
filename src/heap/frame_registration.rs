//! Registering methods' `.eh_frame` with the process's unwinder (libgcc's
//! `__register_frame`), so that Rust panics, C++ exceptions and backtraces
//! unwind through JIT frames.

use crate::info::InfoError;

unsafe extern "C" {
    /// libgcc: registers an `.eh_frame` section (CIEs and FDEs up to a zero
    /// terminator) found at `begin`, which must stay valid until deregistered.
    fn __register_frame(begin: *const u8);
    /// libgcc: removes a registration made with the same pointer.
    fn __deregister_frame(begin: *const u8);
}

/// A registered `.eh_frame`: a terminated copy of the method's section, handed
/// to the unwinder until this value drops (when the method's header is
/// reclaimed, after every executor has left the code).
pub(crate) struct FrameRegistration {
    section: Box<[u8]>,
}

// SAFETY: the section is immutable once registered; registration and
// deregistration are thread-safe in libgcc.
unsafe impl Send for FrameRegistration {}
// SAFETY: as above.
unsafe impl Sync for FrameRegistration {}

impl FrameRegistration {
    /// Checks that `frame` is a chain of 32-bit-length records inside its bounds
    /// (the unwinder walks it without bounds), then registers a copy ending in
    /// the zero terminator the unwinder stops at.
    pub(crate) fn new(frame: &[u8]) -> Result<Self, InfoError> {
        let mut at = 0usize;
        while at < frame.len() {
            let bad = InfoError::BadEhFrame { offset: at as u32 };
            let len = frame
                .get(at..at + 4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or(bad)?;
            if len == 0 {
                break;
            }
            // 0xffffffff introduces a 64-bit length, which `.eh_frame` never uses.
            if len == u32::MAX || len < 4 {
                return Err(bad);
            }
            at = at
                .checked_add(4 + len as usize)
                .filter(|&end| end <= frame.len())
                .ok_or(bad)?;
        }
        if at == 0 {
            return Err(InfoError::BadEhFrame { offset: 0 });
        }
        let mut section = Vec::with_capacity(at + 4);
        section.extend_from_slice(&frame[..at]);
        section.extend_from_slice(&[0; 4]);
        let section = section.into_boxed_slice();
        // SAFETY: `section` is a bounds-checked chain of records ending in a zero
        // terminator, and it lives (unmoved, in its box) until `drop` deregisters it.
        unsafe { __register_frame(section.as_ptr()) };
        Ok(Self { section })
    }
}

impl Drop for FrameRegistration {
    fn drop(&mut self) {
        // SAFETY: the same pointer `new` registered; the section is still alive.
        unsafe { __deregister_frame(self.section.as_ptr()) };
    }
}
