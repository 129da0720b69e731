//! Anonymous reservations for the code heap and map words, optionally aligned to
//! 2 MiB and advised for transparent huge pages: lookups of random addresses are
//! bound by memory latency, and one TLB entry per 2 MiB instead of per 4 KiB
//! removes most page walks from them.

use std::io;
use std::ptr::NonNull;

/// The huge-page size transparent huge pages use on x86-64 and aarch64 (4 KiB base).
pub const HUGE_PAGE: usize = 2 << 20;

/// A private anonymous mapping; unmapped on drop.
pub(crate) struct AnonMap {
    /// The whole mapping (with any alignment slack); unmapped when dropped.
    _alloc: region::Allocation,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access to its contents
// is the owner's business (atomics or exclusive slices).
unsafe impl Send for AnonMap {}
// SAFETY: as above.
unsafe impl Sync for AnonMap {}

impl AnonMap {
    /// Reserves `len` bytes with `protection`. With `huge` and `len` of at least
    /// 2 MiB, the start is 2 MiB-aligned and the range advised `MADV_HUGEPAGE`
    /// (the kernel may still use small pages).
    pub(crate) fn new(len: usize, protection: region::Protection, huge: bool) -> io::Result<Self> {
        let huge = huge && len >= HUGE_PAGE;
        let slack = if huge { HUGE_PAGE } else { 0 };
        let alloc = region::alloc(len.max(1) + slack, protection).map_err(io::Error::other)?;
        let raw = alloc.as_ptr::<u8>() as usize;
        let aligned = if huge {
            raw.next_multiple_of(HUGE_PAGE)
        } else {
            raw
        };
        let base =
            NonNull::new(aligned as *mut u8).ok_or_else(|| io::Error::other("null mapping"))?;
        if huge {
            // SAFETY: `[base, base + len)` lies inside our own mapping; advice never
            // changes its contents.
            unsafe { libc::madvise(base.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        }
        Ok(Self {
            _alloc: alloc,
            base,
            len,
        })
    }

    /// First byte.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Bytes of `[base, base + len)` resident in memory.
    pub(crate) fn resident_bytes(&self) -> io::Result<usize> {
        let page = region::page::size();
        let mut pages = vec![0u8; self.len.div_ceil(page)];
        // SAFETY: the range is page-aligned and inside our mapping; `pages` holds one
        // byte per page, as mincore requires.
        let rc = unsafe { libc::mincore(self.base.as_ptr().cast(), self.len, pages.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(pages.iter().filter(|&&p| p & 1 != 0).count() * page)
    }
}
