//! Storage for nibble-map words.
//!
//! The lookup algorithms read words through [`WordRead`] only, so the same code can
//! run over in-process atomics, loom atomics, or (later) another process's memory.
//! Writers additionally need [`WordStore`].

use crate::sync::{AtomicU32, Ordering};

/// Read-only access to a sequence of 32-bit map words.
pub trait WordRead {
    /// Number of words.
    fn word_count(&self) -> usize;
    /// Loads word `index` (which must be `< word_count()`; out of range reads 0).
    ///
    /// In-process implementations load with Acquire: a reader that sees a start
    /// nibble or pointer must also see the code header written before it.
    fn load(&self, index: usize) -> u32;
}

/// Read-write access; writes are serialized by the owner of the map.
pub trait WordStore: WordRead {
    /// Stores `value` into word `index` with Release, so everything the writer did
    /// before (code bytes, header slot) is visible to a reader that sees `value`.
    fn store(&self, index: usize, value: u32);
}

/// Words in a heap-allocated slice of facade atomics. Used for small maps and
/// under loom, where atomics must be loom's own objects.
pub struct VecWords {
    words: Box<[AtomicU32]>,
}

impl VecWords {
    /// `count` zeroed words.
    pub fn new(count: usize) -> Self {
        Self {
            words: (0..count).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

impl WordRead for VecWords {
    #[inline]
    fn word_count(&self) -> usize {
        self.words.len()
    }

    #[inline]
    fn load(&self, index: usize) -> u32 {
        // Acquire: pairs with the Release store that published the word.
        self.words
            .get(index)
            .map_or(0, |w| w.load(Ordering::Acquire))
    }
}

impl WordStore for VecWords {
    fn store(&self, index: usize, value: u32) {
        if let Some(w) = self.words.get(index) {
            // Release: publishes the writer's earlier stores with the word.
            let order = if crate::sync::defect!(RelaxedPublish) {
                Ordering::Relaxed
            } else {
                Ordering::Release
            };
            w.store(value, order);
        }
    }
}

#[cfg(not(loom))]
pub use mmap::{MmapWords, RawWords};

#[cfg(not(loom))]
mod mmap {
    use super::{WordRead, WordStore};
    use crate::mapping::AnonMap;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Words in an anonymous private mapping. The kernel hands out zeroed pages on
    /// first touch, so a map for a 4 GiB heap costs memory only where code was
    /// published (or read, which maps the shared zero page).
    pub struct MmapWords {
        map: AnonMap,
        count: usize,
    }

    // SAFETY: the mapping is only accessed through `AtomicU32` references, which are
    // themselves `Sync`; the `AnonMap` handle is only used to unmap on drop.
    unsafe impl Send for MmapWords {}
    // SAFETY: as above; all shared access is atomic.
    unsafe impl Sync for MmapWords {}

    impl MmapWords {
        /// `count` zeroed words; maps of 2 MiB or more are advised for huge pages.
        pub fn new(count: usize) -> std::io::Result<Self> {
            Self::with_huge_pages(count, true)
        }

        /// `count` zeroed words; with `huge`, maps of 2 MiB or more are aligned and
        /// advised for huge pages (fewer TLB misses, 2 MiB commit granularity).
        pub fn with_huge_pages(count: usize, huge: bool) -> std::io::Result<Self> {
            let map = AnonMap::new(
                count.max(1) * size_of::<u32>(),
                region::Protection::READ_WRITE,
                huge,
            )?;
            Ok(Self { map, count })
        }

        /// Bytes of the mapping resident in memory: what the map actually costs.
        /// Pages never touched cost nothing.
        pub fn resident_bytes(&self) -> std::io::Result<usize> {
            self.map.resident_bytes()
        }

        /// The address of word 0.
        pub(crate) fn base(&self) -> *const AtomicU32 {
            self.map.base().as_ptr().cast()
        }

        #[inline]
        fn word(&self, index: usize) -> Option<&AtomicU32> {
            if index >= self.count {
                return None;
            }
            let base = self.map.base().cast::<AtomicU32>();
            // SAFETY: `index < count`, the mapping holds `count` words, is page-aligned
            // (so 4-byte aligned), zero-initialized, lives as long as `self`, and is
            // only ever accessed atomically.
            Some(unsafe { base.add(index).as_ref() })
        }
    }

    /// A copyable view of an [`MmapWords`], for hot lookup paths that would
    /// otherwise chase a pointer to the storage first.
    #[derive(Clone, Copy, Debug)]
    pub struct RawWords {
        base: *const AtomicU32,
        count: usize,
    }

    // SAFETY: the view only performs atomic loads on memory that its creator keeps
    // alive (the contract of `RawWords::from_raw_parts`).
    unsafe impl Send for RawWords {}
    // SAFETY: as above.
    unsafe impl Sync for RawWords {}

    impl RawWords {
        /// A view of `count` words at `base`.
        ///
        /// # Safety
        /// `base` must be the address of `count` words of a live [`MmapWords`] that
        /// outlives every use of the view.
        #[inline]
        pub(crate) unsafe fn from_raw_parts(base: *const AtomicU32, count: usize) -> Self {
            Self { base, count }
        }
    }

    impl WordRead for RawWords {
        #[inline]
        fn word_count(&self) -> usize {
            self.count
        }

        #[inline]
        fn load(&self, index: usize) -> u32 {
            if index >= self.count {
                return 0;
            }
            // SAFETY: `index < count` words of a live, aligned, zero-initialized
            // mapping (guaranteed by the creator of the view); atomic access only.
            // Acquire: pairs with the Release store that published the word.
            unsafe { (*self.base.add(index)).load(Ordering::Acquire) }
        }
    }

    impl WordRead for MmapWords {
        #[inline]
        fn word_count(&self) -> usize {
            self.count
        }

        /// Through the same load as [`RawWords`], not through `word`: its
        /// `Option` of a reference cost a null test of the mapping's base on
        /// every load once inlined into a lookup.
        #[inline]
        fn load(&self, index: usize) -> u32 {
            // SAFETY: `base` and `count` are this live mapping's, and the view
            // lives only for this call.
            unsafe { RawWords::from_raw_parts(self.base(), self.count) }.load(index)
        }
    }

    impl WordStore for MmapWords {
        fn store(&self, index: usize, value: u32) {
            if let Some(w) = self.word(index) {
                // Release: publishes the writer's earlier stores with the word.
                w.store(value, Ordering::Release);
            }
        }
    }
}
