//! The checks and decoding every remote read shares.

use super::RemoteError;

/// The u64 at `off` in `bytes` (0 if it does not fit; callers check offsets
/// against the struct size first).
pub(crate) fn read_at(bytes: &[u8], off: usize) -> u64 {
    bytes
        .get(off..off + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

/// The u32 at `off` in `bytes` (0 if it does not fit).
pub(crate) fn read_u32_at(bytes: &[u8], off: usize) -> u32 {
    bytes
        .get(off..off + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

/// The u16 at `off` in `bytes` (0 if it does not fit).
#[cfg(feature = "inspect")]
pub(crate) fn read_u16_at(bytes: &[u8], off: usize) -> u16 {
    bytes
        .get(off..off + 2)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u16::from_ne_bytes)
}

/// `addr` if it can point to an `align`-aligned object in the user half of the
/// address space.
pub(crate) fn check_ptr(addr: u64, align: u64, what: &'static str) -> Result<u64, RemoteError> {
    if addr == 0 || !addr.is_multiple_of(align) || addr >> 47 != 0 {
        return Err(RemoteError::Corrupt { what, addr });
    }
    Ok(addr)
}

/// Index into the range-map level at `depth` (0 = leaf) for `addr`: the same
/// layout as the .NET runtime's map.
pub(crate) fn index(addr: u64, depth: usize) -> u64 {
    crate::range::index(addr as usize, depth) as u64
}
