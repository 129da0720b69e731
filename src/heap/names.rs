//! A heap's method names, packed together: a name costs its bytes rounded up
//! to 8, not an allocation each (a one-letter `String` takes a 32-byte
//! chunk of the system allocator). Names of up to [`MAX_PACKED`] bytes are
//! carved from chunks the arena owns and, once their method is reclaimed,
//! kept on a free list by size for the next name of that size; longer names
//! are allocated on their own.
//!
//! Readers in this process and others read a name through the raw pointer
//! its header holds while the writer carves other names from the same chunk:
//! the arena never makes a reference to a chunk's bytes, only writes through
//! raw pointers to bytes no header names.

use std::alloc::{Layout, alloc, dealloc};
use std::ptr::NonNull;

/// Names up to this long are packed; longer ones are allocated alone.
pub(crate) const MAX_PACKED: usize = 256;
/// Bytes names are rounded up to: one size class per multiple.
const GRAIN: usize = 8;
/// The first chunk's bytes; each next one is twice as large, up to
/// [`LARGEST_CHUNK`], so a heap of a few methods takes little.
const FIRST_CHUNK: usize = 512;
const LARGEST_CHUNK: usize = 64 << 10;

/// A name's bytes in the arena (or dangling for the empty name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Name {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
}

/// The names of one heap; serialized by the heap lock.
pub(crate) struct NameArena {
    chunks: Vec<(NonNull<u8>, Layout)>,
    /// Bytes not yet carved from the last chunk.
    bump: usize,
    /// Freed slots by size class (`len.div_ceil(GRAIN) - 1`).
    free: Vec<Vec<NonNull<u8>>>,
}

// SAFETY: the arena owns its chunks; every access happens under the heap
// lock, and readers only read bytes of names whose headers they can reach.
unsafe impl Send for NameArena {}

impl Default for NameArena {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            bump: 0,
            free: (0..MAX_PACKED / GRAIN).map(|_| Vec::new()).collect(),
        }
    }
}

impl NameArena {
    /// A copy of `name`, valid until [`NameArena::free`] is given it back.
    pub(crate) fn insert(&mut self, name: &str) -> Name {
        let len = name.len();
        let ptr = match len {
            0 => NonNull::dangling(),
            1..=MAX_PACKED => self.slot(len),
            _ => {
                let layout = Layout::array::<u8>(len).expect("a str's length fits a layout");
                // SAFETY: the layout is not zero-sized (len > MAX_PACKED).
                NonNull::new(unsafe { alloc(layout) })
                    .unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
            }
        };
        // SAFETY: `ptr` has room for `len` bytes that no header names yet
        // (a fresh slot or allocation); the source is a distinct `str`.
        unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), ptr.as_ptr(), len) };
        Name { ptr, len }
    }

    /// Gives a name's bytes back.
    ///
    /// # Safety
    /// `name` came from this arena's [`NameArena::insert`], is given back
    /// once, and no reader can reach it any more (its header was reclaimed).
    pub(crate) unsafe fn free(&mut self, name: Name) {
        match name.len {
            0 => {}
            1..=MAX_PACKED => self.free[class(name.len)].push(name.ptr),
            len => {
                let layout = Layout::array::<u8>(len).expect("as in insert");
                // SAFETY: allocated by `insert` with this layout (the same
                // length), given back once (the caller's contract).
                unsafe { dealloc(name.ptr.as_ptr(), layout) }
            }
        }
    }

    /// A slot of `len`'s size class: a freed one, or carved from the last
    /// chunk (a new chunk when it has too little left; the rest of the old
    /// one is left unused).
    fn slot(&mut self, len: usize) -> NonNull<u8> {
        let class = class(len);
        if let Some(ptr) = self.free[class].pop() {
            return ptr;
        }
        let size = (class + 1) * GRAIN;
        if self.bump < size {
            let bytes = self
                .chunks
                .last()
                .map_or(FIRST_CHUNK, |(_, l)| (l.size() * 2).min(LARGEST_CHUNK));
            let layout = Layout::from_size_align(bytes, GRAIN).expect("a small power of two");
            // SAFETY: the layout is not zero-sized.
            let chunk = NonNull::new(unsafe { alloc(layout) })
                .unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
            self.chunks.push((chunk, layout));
            self.bump = bytes;
        }
        let (chunk, layout) = self.chunks.last().expect("a chunk was just made");
        let at = layout.size() - self.bump;
        self.bump -= size;
        // SAFETY: `at + size` is within the chunk (`bump` counted it).
        unsafe { chunk.add(at) }
    }
}

/// A packed name's size class.
fn class(len: usize) -> usize {
    len.div_ceil(GRAIN) - 1
}

impl Drop for NameArena {
    fn drop(&mut self) {
        // Long names are the heap's to give back (with their headers); the
        // chunks are the arena's.
        for &(chunk, layout) in &self.chunks {
            // SAFETY: allocated in `slot` with this layout, freed once.
            unsafe { dealloc(chunk.as_ptr(), layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(name: Name) -> String {
        // SAFETY: a live name's bytes, copied from a `str`.
        let bytes = unsafe { std::slice::from_raw_parts(name.ptr.as_ptr(), name.len) };
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// Names of every size class and beyond, inserted, read, freed in a
    /// scrambled order and inserted again: each reads back as written, a
    /// freed slot is reused by the next name of its class, and no two live
    /// names overlap.
    #[test]
    fn names_round_trip_and_slots_are_reused_by_class() {
        let mut arena = NameArena::default();
        let texts: Vec<String> = (0..=300)
            .map(|n| (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect())
            .collect();
        let names: Vec<Name> = texts.iter().map(|t| arena.insert(t)).collect();
        for (name, text) in names.iter().zip(&texts) {
            assert_eq!(read(*name), *text);
        }
        let mut spans: Vec<(usize, usize)> = names
            .iter()
            .filter(|n| n.len > 0)
            .map(|n| (n.ptr.as_ptr() as usize, n.len))
            .collect();
        spans.sort_unstable();
        for pair in spans.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{pair:?} overlap");
        }
        let chunks = arena.chunks.len();
        for i in (0..names.len()).rev().step_by(2) {
            // SAFETY: each name is freed once and never read again.
            unsafe { arena.free(names[i]) };
        }
        // Same lengths again, in the opposite order (the free lists are
        // stacks): every packed one lands in the slot its length had, so no
        // chunk is added.
        let again: Vec<Name> = (0..names.len())
            .step_by(2)
            .map(|i| {
                let name = arena.insert(&texts[i]);
                assert_eq!(read(name), texts[i]);
                if (1..=MAX_PACKED).contains(&i) {
                    assert_eq!(name.ptr, names[i].ptr, "length {i}");
                }
                name
            })
            .collect();
        for name in again {
            // SAFETY: freed once, not read again.
            unsafe { arena.free(name) };
        }
        assert_eq!(arena.chunks.len(), chunks);
        for i in (0..names.len()).rev().skip(1).step_by(2) {
            // SAFETY: the other half, freed once.
            unsafe { arena.free(names[i]) };
        }
    }

    /// Chunks double from 512 bytes to 64 KiB and the names fill them:
    /// 625 names of 256 bytes take 160,000 bytes, in nine chunks: 512
    /// bytes, then 1 KiB doubling to 64 KiB, then another 64 KiB.
    #[test]
    fn chunks_grow_to_a_cap() {
        let mut arena = NameArena::default();
        let long = "x".repeat(MAX_PACKED);
        let names: Vec<Name> = (0..625).map(|_| arena.insert(&long)).collect();
        let sizes: Vec<usize> = arena.chunks.iter().map(|(_, l)| l.size()).collect();
        assert_eq!(
            sizes,
            [
                512,
                1 << 10,
                2 << 10,
                4 << 10,
                8 << 10,
                16 << 10,
                32 << 10,
                64 << 10,
                64 << 10
            ]
        );
        for name in names {
            // SAFETY: each freed once.
            unsafe { arena.free(name) };
        }
    }
}
