//! The read side of a heap in one copyable value: what `CodeHeap::find` and the
//! execution manager's heap sections use, so a lookup chases no pointer to the
//! heap or its map before reading the map word itself.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use super::alloc::PREFIX;
use super::header::CodeHeader;
use super::{BlockKind, HeapBlock, MAX_STUB_KIND};
use crate::nibble::{MapVersion, find_v1, find_v2_covered};
use crate::words::{MmapWords, RawWords, WordRead};

/// The two words before every code start: code size, then the header slot.
#[repr(C)]
pub(crate) struct BlockPrefix {
    pub(crate) size: AtomicUsize,
    pub(crate) slot: AtomicUsize,
}

/// The prefix of the block starting `start` bytes past `view`.
///
/// # Safety
/// `start` must be a code start placed by the heap's allocator (at least `PREFIX`
/// bytes into a committed extent, 8-aligned) in the mapping at `view`, and the
/// mapping must outlive `'a`.
#[inline]
pub(crate) unsafe fn prefix_at<'a>(view: usize, start: u64) -> &'a BlockPrefix {
    // SAFETY: per the contract above, the two words are committed, aligned and live
    // for `'a`; they are only accessed atomically.
    unsafe { &*((view + start as usize - PREFIX as usize) as *const BlockPrefix) }
}

/// Code base, map words and map version of one heap, in 24 bytes so that a
/// range-map fragment holding it fits one cache line. The span is implied: a map
/// word covers 256 bytes, and a heap's span is a whole number of pages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeapLookup {
    pub(crate) base: usize,
    words: *const AtomicU32,
    word_count: u32,
    version: MapVersion,
}

// SAFETY: the view only performs atomic loads on memory owned by its heap, which
// the holder keeps alive (see `HeapLookup::new`).
unsafe impl Send for HeapLookup {}
// SAFETY: as above.
unsafe impl Sync for HeapLookup {}

impl HeapLookup {
    /// A view of a heap's read side.
    ///
    /// # Safety
    /// `words` must be the map words of the heap whose executable view starts at
    /// `base`, and the view may only be used while that heap is alive.
    pub(crate) unsafe fn new(base: usize, words: &MmapWords, version: MapVersion) -> Self {
        Self {
            base,
            words: words.base(),
            // Spans are under 4 GiB, so under 2^24 words.
            word_count: words.word_count() as u32,
            version,
        }
    }

    /// The block the map names for `ip`, before its prefix is checked.
    ///
    /// # Safety
    /// The heap this view was taken from must stay alive for `'a`, and the caller
    /// must hold a guard pinned in the heap's domain for `'a`: that keeps freed
    /// headers and prefixes from being reclaimed while the answer is in use.
    #[inline]
    pub(crate) unsafe fn find<'a>(&self, ip: usize) -> Option<Hit<'a>> {
        let offset = ip.wrapping_sub(self.base) as u64;
        // SAFETY: `words` and `word_count` describe the live map of a live heap
        // (this function's contract). Offsets past the span fall past the last word,
        // where both lookups answer none.
        let words = unsafe { RawWords::from_raw_parts(self.words, self.word_count as usize) };
        let (start, covered) = match self.version {
            MapVersion::V1 => (find_v1(&words, offset)?, false),
            MapVersion::V2 => find_v2_covered(&words, offset)?,
        };
        if start < PREFIX {
            return None;
        }
        Some(Hit {
            start: self.base + start as usize,
            offset: offset - start,
            covered,
            // SAFETY: the map holds only starts placed by the allocator, and the
            // heap (which owns the mapping) outlives `'a` by this function's contract.
            prefix: unsafe { prefix_at(self.base, start) },
        })
    }
}

/// A start the map named for an address, with the block's prefix.
#[derive(Clone, Copy)]
pub(crate) struct Hit<'a> {
    /// Address of the first code byte.
    pub(crate) start: usize,
    /// Offset of the address from `start`.
    pub(crate) offset: u64,
    /// The map alone proves the address inside the block (a v2 pointer word).
    pub(crate) covered: bool,
    /// The two words before the code.
    pub(crate) prefix: &'a BlockPrefix,
}

impl<'a> Hit<'a> {
    /// The block, if the address is within its size; reads both prefix words.
    #[inline]
    pub(crate) fn block(self) -> Option<HeapBlock<'a>> {
        // Relaxed: the Acquire load of the map word that named this start already
        // ordered the publish-time prefix stores before this read.
        let size = self.prefix.size.load(Ordering::Relaxed) as u64;
        if self.offset >= size {
            return None;
        }
        let kind = match self.slot() {
            slot if slot <= usize::from(MAX_STUB_KIND) => BlockKind::Stub(slot as u8),
            // SAFETY: slots above 15 hold a header pointer.
            _ => BlockKind::Method(unsafe { self.header() }),
        };
        Some(HeapBlock {
            start: self.start,
            size,
            offset: self.offset,
            kind,
        })
    }

    /// The header slot.
    #[inline]
    pub(crate) fn slot(self) -> usize {
        // Relaxed: as in `block`.
        self.prefix.slot.load(Ordering::Relaxed)
    }

    /// The method's header.
    ///
    /// # Safety
    /// The block must be a method, not a stub (its slot holds a header pointer).
    #[inline]
    pub(crate) unsafe fn header(self) -> &'a CodeHeader {
        // SAFETY: the slot holds a header pointer written before the map published
        // the block (the caller's contract); the guard behind `'a` keeps the header
        // alive, because reclamation waits for every guard older than the unpublish.
        unsafe { &*(self.slot() as *const CodeHeader) }
    }
}
