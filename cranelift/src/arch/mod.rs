//! What the module emits and patches per architecture, one file each:
//! - `TRAMPOLINE_LEN` and `trampoline(cell)`: the frameless stub every
//!   definable function is called through, which jumps to the address in its
//!   call cell with every argument register and the return address untouched;
//! - `VENEER_LEN`: the room reserved after a function's code for each
//!   relocation that may need a veneer (0 where every call reaches);
//! - `patch(kind, site)`: writes one relocation of this architecture's own
//!   kinds (the absolute ones are common, in `reloc`), or refuses it.
//!
//! A third architecture (riscv64, say) is one more file here: its trampoline
//! (`auipc`/`ld`/`jr` through a literal) and its relocation kinds.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::*;

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;

/// One relocation to write: where, and the value it resolves to.
pub(crate) struct Site<'a> {
    /// The whole reservation: the function's code, then its veneer room.
    pub(crate) code: &'a mut [u8],
    /// The relocated field's offset in `code`.
    pub(crate) offset: usize,
    /// The field's final address.
    pub(crate) at: i64,
    /// The target's address plus the addend.
    pub(crate) what: i64,
    /// The next free veneer's offset in `code` (advanced by each one used).
    #[cfg_attr(target_arch = "x86_64", expect(dead_code, reason = "no veneers"))]
    pub(crate) veneer: &'a mut usize,
    /// The reservation's final address.
    #[cfg_attr(target_arch = "x86_64", expect(dead_code, reason = "no veneers"))]
    pub(crate) base: i64,
}

impl Site<'_> {
    /// Copies `bytes` into the code at `offset`, if they fit.
    pub(crate) fn write(&mut self, offset: usize, bytes: &[u8]) -> Option<()> {
        self.code
            .get_mut(offset..offset.checked_add(bytes.len())?)?
            .copy_from_slice(bytes);
        Some(())
    }

    /// The 32-bit little-endian word at `offset`.
    #[cfg_attr(
        target_arch = "x86_64",
        expect(dead_code, reason = "aarch64 patches words")
    )]
    pub(crate) fn word(&self, offset: usize) -> Option<u32> {
        let bytes = self.code.get(offset..offset.checked_add(4)?)?;
        Some(u32::from_le_bytes(bytes.try_into().ok()?))
    }
}
