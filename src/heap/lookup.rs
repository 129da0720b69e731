//! The read side of a heap in one copyable value: what `CodeHeap::find` and the
//! execution manager's heap sections use, so a lookup chases no pointer to the
//! heap or its map before reading the map word itself.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use super::alloc::PREFIX;
use super::end_words::RawEnds;
use super::header::CodeHeader;
use super::{BlockKind, MAX_STUB_KIND, StubKind};
use crate::map_words::{MmapWords, RawWords, WordRead};
use crate::nibble::{Capped, MapVersion, find_v1_capped, find_v2_with};

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

/// Where out-of-process readers find a [`HeapLookup`]'s fields (byte offsets).
pub(crate) struct LookupLayout {
    pub(crate) words: usize,
    pub(crate) ends: usize,
    pub(crate) word_count: usize,
    pub(crate) version: usize,
}

/// The layout of [`HeapLookup`], for the descriptor.
pub(crate) const LOOKUP_LAYOUT: LookupLayout = LookupLayout {
    words: std::mem::offset_of!(HeapLookup, words),
    // `RawEnds` is a transparent pointer.
    ends: std::mem::offset_of!(HeapLookup, ends),
    word_count: std::mem::offset_of!(HeapLookup, word_count),
    version: std::mem::offset_of!(HeapLookup, version),
};

/// Start-map words, end map and map version of one heap, in 24 bytes; the
/// code base is the caller's (the heap's, or its range section's begin). The
/// span is implied: a map word covers 256 bytes, and a heap's span is a whole
/// number of pages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeapLookup {
    words: *const AtomicU32,
    ends: RawEnds,
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
    /// `words` and `ends` must be the maps of one heap, and the view may only
    /// be used while that heap is alive.
    pub(crate) unsafe fn new(words: &MmapWords, ends: RawEnds, version: MapVersion) -> Self {
        Self {
            words: words.base(),
            ends,
            // Spans are under 4 GiB, so under 2^24 words.
            word_count: words.word_count() as u32,
            version,
        }
    }

    /// The block containing `ip` in the heap whose executable view starts at
    /// `base`, exactly, from the maps alone: the start map
    /// names the start, and unless a v2 pointer word proves `ip` inside, the end
    /// map says whether the block ends before `ip` (one more word in v2). Code
    /// memory is not read.
    ///
    /// # Safety
    /// `base` is the executable base of the heap this view was taken from, that
    /// heap must stay alive for `'a`, and the caller
    /// must hold a guard pinned in the heap's domain for `'a`: that keeps freed
    /// headers and prefixes from being reclaimed while the answer is in use.
    #[inline(always)]
    pub(crate) unsafe fn find<'a>(&self, base: usize, ip: usize) -> Option<Hit<'a>> {
        // SAFETY: this function's contract; an unlimited walk is never too far.
        unsafe { self.find_capped(base, ip, usize::MAX) }.unwrap_or(None)
    }

    /// [`HeapLookup::find`] reading at most `v1_words` start-map words in a v1
    /// heap (and as many end words): `Err(TooFar)` when the start lies further
    /// back. A v2 heap reads at most two start words and one end word whatever
    /// the cap.
    ///
    /// Both versions hand back only the block's start, and the hit is built
    /// here, once. When each branch that found a start built its own hit, the
    /// execution manager merged the five-word hits of the four inlined v2
    /// branches and of the out-of-line v1 walk through the stack: 16 moves
    /// per lookup.
    ///
    /// # Safety
    /// As for [`HeapLookup::find`].
    #[inline(always)]
    pub(crate) unsafe fn find_capped<'a>(
        &self,
        base: usize,
        ip: usize,
        v1_words: usize,
    ) -> Result<Option<Hit<'a>>, TooFar> {
        let offset = ip.wrapping_sub(base) as u64;
        let start = match self.version {
            // SAFETY: this function's contract.
            MapVersion::V2 => unsafe { self.start_v2(offset) },
            // SAFETY: as above.
            MapVersion::V1 => unsafe { self.start_v1(offset, v1_words) }?,
        };
        // No test of `start` against `PREFIX`: only the heap's allocator
        // writes the map, and it places every start at least `PREFIX` bytes
        // into its extent (`alloc::place`, checked by its test
        // `every_start_leaves_room_for_its_prefix_in_its_extent`). Readers of
        // another process's memory, which may be anything, keep the test.
        // SAFETY: the map named `start` for `offset`; the rest is this
        // function's contract.
        Ok(start.map(|start| unsafe { self.hit(base, offset, start) }))
    }

    /// The v2 lookup's start, inlined into every caller: the start map names
    /// a start from `offset`'s word or the word before (or a pointer word
    /// proves `offset` inside), and unless proved, `offset`'s end word says
    /// whether the block ended before `offset`, without a loop: its end bits,
    /// and for a start in the word before, the bit that says whether the
    /// block runs on from that word.
    ///
    /// # Safety
    /// As for [`HeapLookup::find`], and the heap's map is v2.
    #[inline(always)]
    unsafe fn start_v2(&self, offset: u64) -> Option<u64> {
        // SAFETY: `words` and `word_count` describe the live map of a live heap
        // (this function's contract). Offsets past the span fall past the last
        // word, where the lookup answers none.
        let words = unsafe { RawWords::from_raw_parts(self.words, self.word_count as usize) };
        // Inlined always: left to the heuristics, a binary with several
        // callers (the simulator's) outlined it on the two previous-word
        // branches, where it dispatched on `origin` a second time.
        find_v2_with(
            &words,
            offset,
            #[inline(always)]
            // SAFETY: the map named `start` for `offset`, from the word
            // `origin` says; the rest is this function's contract.
            |start, origin| (!unsafe { self.ends.ended(offset, start, origin) }).then_some(start),
        )
    }

    /// The v1 lookup's start: a walk back over at most `v1_words` start-map
    /// words, then the end words from the start forward. Out of line: the
    /// walk is a loop, and a v1 heap is the slow path.
    ///
    /// # Safety
    /// As for [`HeapLookup::find`], and the heap's map is v1.
    #[inline(never)]
    unsafe fn start_v1(&self, offset: u64, v1_words: usize) -> Result<Option<u64>, TooFar> {
        // SAFETY: as in `start_v2`.
        let words = unsafe { RawWords::from_raw_parts(self.words, self.word_count as usize) };
        let start = match find_v1_capped(&words, offset, v1_words) {
            Capped::Found(start) => start,
            Capped::Nothing => return Ok(None),
            Capped::TooFar => return Err(TooFar),
        };
        // SAFETY: `start <= offset`, inside the span of the live heap (the map
        // named `start` for `offset`).
        Ok((!unsafe { self.ends.ends_between(start, offset) }).then_some(start))
    }

    /// The hit for the block at `start`, which the map named for `offset`.
    ///
    /// # Safety
    /// `start` is a start this heap's map named; otherwise as for
    /// [`HeapLookup::find`].
    #[inline(always)]
    unsafe fn hit<'a>(&self, base: usize, offset: u64, start: u64) -> Hit<'a> {
        Hit {
            start: base + start as usize,
            offset: offset - start,
            ends: self.ends,
            heap_offset: start,
            // SAFETY: the map holds only starts placed by the allocator, and the
            // heap (which owns the mapping) outlives `'a` by the callers' contract.
            prefix: unsafe { prefix_at(base, start) },
        }
    }
}

/// A capped v1 lookup's start lies further back than its cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TooFar;

/// A start the map named for an address, with the block's prefix.
#[derive(Clone, Copy)]
pub(crate) struct Hit<'a> {
    /// Address of the first code byte.
    pub(crate) start: usize,
    /// Offset of the address from `start`.
    pub(crate) offset: u64,
    /// The heap's end map, and `start` as an offset into the heap.
    ends: RawEnds,
    heap_offset: u64,
    /// The two words before the code (read only on demand).
    pub(crate) prefix: &'a BlockPrefix,
}

impl<'a> Hit<'a> {
    /// Whether the block is a stub, from the end map (no code read).
    #[inline]
    pub(crate) fn is_stub(self) -> bool {
        // SAFETY: the start map named this start in the live heap (`find`).
        unsafe { self.ends.is_stub(self.heap_offset) }
    }

    /// The code size, from the block's prefix.
    #[inline]
    pub(crate) fn size(self) -> u64 {
        // Relaxed: the Acquire load of the map word that named this start already
        // ordered the publish-time prefix stores before this read.
        self.prefix.size.load(Ordering::Relaxed) as u64
    }

    /// Method (with its header) or stub (with its kind), from the prefix's slot.
    #[inline]
    pub(crate) fn kind(self) -> BlockKind<'a> {
        match self.slot() {
            slot if slot <= usize::from(MAX_STUB_KIND) => BlockKind::Stub(StubKind(slot as u8)),
            // SAFETY: slots above 15 hold a header pointer.
            _ => BlockKind::Method(unsafe { self.header() }),
        }
    }

    /// The header slot.
    #[inline]
    pub(crate) fn slot(self) -> usize {
        // Relaxed: as in `size`.
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
