//! Anonymous reservations for the code heap and map words, optionally aligned to
//! the kernel's huge-page size and advised for transparent huge pages: lookups
//! of random addresses are bound by memory latency, and one TLB entry per huge
//! page (2 MiB on 4 KiB pages) removes most page walks from them.

use std::io;
use std::ptr::NonNull;
use std::sync::OnceLock;

/// The size of a transparent huge page here: the kernel's
/// `hpage_pmd_size`, or what one page-table page of 8-byte entries maps
/// ([`pmd_size`]). 2 MiB on 4 KiB pages, 32 MiB on 16 KiB, 512 MiB on
/// 64 KiB (aarch64 kernels come in all three).
pub(crate) fn huge_page() -> usize {
    static SIZE: OnceLock<usize> = OnceLock::new();
    *SIZE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .filter(|&size: &usize| size.is_power_of_two())
            .unwrap_or_else(|| pmd_size(region::page::size()))
    })
}

/// What one page-table page maps at the level above pages, for `page`-byte
/// pages: `page / 8` entries of `page` bytes.
pub(crate) const fn pmd_size(page: usize) -> usize {
    page / 8 * page
}

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
    /// a [`huge_page`], the start is aligned to one and the range advised
    /// `MADV_HUGEPAGE` (the kernel may still use small pages).
    pub(crate) fn new(len: usize, protection: region::Protection, huge: bool) -> io::Result<Self> {
        // (The kernel's size is read only for a mapping that may use it.)
        let huge_page = if huge { huge_page() } else { 0 };
        let huge = huge && len >= huge_page;
        let slack = if huge { huge_page } else { 0 };
        let alloc = region::alloc(len.max(1) + slack, protection).map_err(io::Error::other)?;
        let raw = alloc.as_ptr::<u8>() as usize;
        let aligned = if huge {
            raw.next_multiple_of(huge_page)
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

#[cfg(test)]
mod tests {
    use super::*;

    // Issue 67, item 8: the huge page was 2 MiB whatever the page size.
    #[test]
    fn the_huge_page_follows_the_page_size() {
        assert_eq!(pmd_size(4 << 10), 2 << 20);
        assert_eq!(pmd_size(16 << 10), 32 << 20);
        assert_eq!(pmd_size(64 << 10), 512 << 20);
        assert_eq!(huge_page(), pmd_size(region::page::size()));
    }
}
