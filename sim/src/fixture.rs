//! Benchmark fixtures: the same methods held by every structure a user might pick
//! for IP → method lookup, so they can be measured side by side.
//!
//! - `floor`: the least a v2 lookup can do: one Acquire load of the map word
//!   covering the address, the pointer test and the decode, in a function that
//!   is not inlined. Not exact (it does not even look at the previous word).
//! - `v2`, `v1`: the raw nibble-map lookups (map base = heap base); not exact.
//! - `heap`: `CodeHeap::find`, exact from the start and end maps.
//! - `manager`: the full `ExecutionManager::find`: range map, then `heap`.
//! - `btree_rwlock`: `RwLock<BTreeMap<start, end>>`, as wasmtime's registry and
//!   cranelift-jit do it.
//! - `sorted_vec`: a sorted `Vec<(start, end)>` with binary search, the sorted-array
//!   alternative to a constant-time map.
//!
//! Each structure is measured through [`Fixture::visit`], which hands a
//! concrete [`Finder`] to a generic visitor: the timed loop is monomorphized
//! per structure, with no dispatch and no handle to resolve inside it.

use std::collections::BTreeMap;

use jitmap::heap::JitKind;
use jitmap::map_words::{MmapWords, WordRead};
use jitmap::nibble::encoding::{decode_pointer, is_pointer, start_at_or_before, word_index};
use jitmap::{
    CodeHeap, CodeInfo, ExecutionManager, Guard, HeapConfig, ManagerGuard, MapVersion, MapWriter,
    NibbleMap, OwnedHeap,
};
use parking_lot::RwLock;

use jitmap_testkit::rng::Rng;

/// Any error a fixture or a measurement run can meet.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A lookup structure, for one timed loop.
pub trait Finder {
    /// The start of the block containing `addr`, if the structure knows one.
    fn find(&self, addr: usize) -> Option<usize>;
}

/// Something to do with a structure's [`Finder`], generic over its type.
pub trait Visitor {
    /// What the visit returns.
    type Output;
    /// Runs with the structure's finder.
    fn visit<F: Finder>(self, finder: F) -> Self::Output;
}

/// The minimal v2 read (see the module docs).
#[inline(never)]
pub fn floor_find(words: &MmapWords, offset: u64) -> Option<u64> {
    let index = word_index(offset);
    if index >= words.word_count() {
        return None;
    }
    let word = words.load(index);
    if is_pointer(word) {
        Some(u64::from(decode_pointer(word)))
    } else {
        start_at_or_before(word, index, offset)
    }
}

struct Floor<'a> {
    words: &'a MmapWords,
    base: usize,
}

impl Finder for Floor<'_> {
    #[inline(always)]
    fn find(&self, addr: usize) -> Option<usize> {
        floor_find(self.words, addr.wrapping_sub(self.base) as u64).map(|s| self.base + s as usize)
    }
}

struct Map<'a> {
    map: &'a NibbleMap<MmapWords>,
    base: usize,
}

impl Finder for Map<'_> {
    #[inline(always)]
    fn find(&self, addr: usize) -> Option<usize> {
        self.map
            .find(addr.wrapping_sub(self.base) as u64)
            .map(|s| self.base + s as usize)
    }
}

struct Heap<'a> {
    heap: &'a CodeHeap,
    guard: &'a Guard<'a>,
}

impl Finder for Heap<'_> {
    #[inline(always)]
    fn find(&self, addr: usize) -> Option<usize> {
        self.heap
            .find(self.guard, addr)
            .ok()
            .flatten()
            .map(|b| b.start())
    }
}

struct Manager<'a> {
    guard: &'a ManagerGuard<'a>,
}

impl Finder for Manager<'_> {
    #[inline(always)]
    fn find(&self, addr: usize) -> Option<usize> {
        self.guard.find(addr).map(|b| b.start())
    }
}

struct BTree<'a>(&'a RwLock<BTreeMap<usize, usize>>);

impl Finder for BTree<'_> {
    #[inline(always)]
    fn find(&self, addr: usize) -> Option<usize> {
        self.0
            .read()
            .range(..=addr)
            .next_back()
            .filter(|&(_, &end)| addr < end)
            .map(|(&start, _)| start)
    }
}

struct Sorted<'a>(&'a [(usize, usize)]);

impl Finder for Sorted<'_> {
    #[inline(always)]
    fn find(&self, addr: usize) -> Option<usize> {
        let i = self.0.partition_point(|&(start, _)| start <= addr);
        i.checked_sub(1)
            .map(|i| self.0[i])
            .filter(|&(_, end)| addr < end)
            .map(|(start, _)| start)
    }
}

/// One set of methods, held by every structure.
pub struct Fixture<'m> {
    manager: &'m ExecutionManager,
    heap: OwnedHeap,
    v1: MapWriter<MmapWords>,
    btree: RwLock<BTreeMap<usize, usize>>,
    sorted: Vec<(usize, usize)>,
    blocks: Vec<(usize, u64)>,
}

impl<'m> Fixture<'m> {
    /// Publishes methods of `sizes` (in order) in a new v2 heap of `manager`, and
    /// records the same blocks in a v1 map, a B-tree and a sorted vector.
    pub fn new(
        manager: &'m ExecutionManager,
        sizes: &[u64],
    ) -> Result<Self, jitmap::manager::ManagerError> {
        let code: u64 = sizes.iter().map(|s| s + 64).sum();
        let span = (code + (1 << 20)).next_multiple_of(1 << 20);
        let heap = manager.create_heap(HeapConfig {
            span,
            version: MapVersion::V2,
            ..HeapConfig::default()
        })?;
        let mut v1 = MapWriter::new(MapVersion::V1, heap.span()).map_err(|_| {
            jitmap::manager::ManagerError::Heap(jitmap::HeapError::BadSpan { span })
        })?;
        let mut blocks = Vec::with_capacity(sizes.len());
        for (id, &size) in sizes.iter().enumerate() {
            let r = heap
                .reserve(size)
                .map_err(jitmap::manager::ManagerError::Heap)?;
            let code = r
                .publish(CodeInfo::new(id as u64, "bench", JitKind::Baseline))
                .map_err(jitmap::manager::ManagerError::Heap)?;
            v1.set_allocated((code.start() - heap.base()) as u64, size)
                .map_err(|e| jitmap::manager::ManagerError::Heap(jitmap::HeapError::Map(e)))?;
            blocks.push((code.start(), size));
        }
        let sorted: Vec<(usize, usize)> =
            blocks.iter().map(|&(s, n)| (s, s + n as usize)).collect();
        Ok(Self {
            manager,
            btree: RwLock::new(sorted.iter().copied().collect()),
            sorted,
            heap,
            v1,
            blocks,
        })
    }

    /// The published blocks as `(start, size)`, in publish order.
    pub fn blocks(&self) -> &[(usize, u64)] {
        &self.blocks
    }

    /// The manager's heap.
    pub fn heap(&self) -> &OwnedHeap {
        &self.heap
    }

    /// The manager.
    pub fn manager(&self) -> &'m ExecutionManager {
        self.manager
    }

    /// Hands `structure`'s finder to `visitor`; `heap` and `manager` look up
    /// under `guard` (pinned for this fixture's manager).
    pub fn visit<V: Visitor>(
        &self,
        structure: Structure,
        guard: &ManagerGuard<'_>,
        visitor: V,
    ) -> V::Output {
        let base = self.heap.base();
        match structure {
            Structure::Floor => visitor.visit(Floor {
                words: self.heap.map().words(),
                base,
            }),
            Structure::V2 => visitor.visit(Map {
                map: self.heap.map(),
                base,
            }),
            Structure::V1 => visitor.visit(Map {
                map: self.v1.map(),
                base,
            }),
            Structure::Heap => visitor.visit(Heap {
                heap: self.heap.heap(),
                guard,
            }),
            Structure::Manager => visitor.visit(Manager { guard }),
            Structure::BTreeRwLock => visitor.visit(BTree(&self.btree)),
            Structure::SortedVec => visitor.visit(Sorted(&self.sorted)),
        }
    }

    /// One lookup with `structure` (dispatched; for checks, not for timing).
    pub fn lookup(
        &self,
        structure: Structure,
        guard: &ManagerGuard<'_>,
        addr: usize,
    ) -> Option<usize> {
        struct Once(usize);
        impl Visitor for Once {
            type Output = Option<usize>;
            fn visit<F: Finder>(self, finder: F) -> Option<usize> {
                finder.find(self.0)
            }
        }
        self.visit(structure, guard, Once(addr))
    }

    /// `count` addresses drawn uniformly from all code bytes (a sampling
    /// profiler's view: large methods get proportionally more hits).
    pub fn random_addresses(&self, rng: &mut Rng, count: usize) -> Vec<usize> {
        let mut ends = Vec::with_capacity(self.blocks.len());
        let mut total = 0u64;
        for &(_, size) in &self.blocks {
            total += size;
            ends.push(total);
        }
        (0..count)
            .map(|_| {
                let at = rng.below(total);
                let i = ends.partition_point(|&e| e <= at);
                let (start, size) = self.blocks[i];
                start + (at - (ends[i] - size)) as usize
            })
            .collect()
    }

    /// `count` addresses, each in a method picked uniformly, at an offset picked
    /// uniformly inside it (a stack walker's view: every frame is a method).
    pub fn random_method_addresses(&self, rng: &mut Rng, count: usize) -> Vec<usize> {
        (0..count)
            .map(|_| {
                let (start, size) = self.blocks[rng.below(self.blocks.len() as u64) as usize];
                start + rng.below(size) as usize
            })
            .collect()
    }

    /// Bytes of the heap's start and end maps resident in memory.
    pub fn map_resident_bytes(&self) -> std::io::Result<usize> {
        self.heap.map_resident_bytes()
    }
}

/// A structure under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Structure {
    /// The minimal v2 read.
    Floor,
    /// Nibble map v2.
    V2,
    /// Nibble map v1.
    V1,
    /// `CodeHeap::find`.
    Heap,
    /// `ExecutionManager::find`.
    Manager,
    /// `RwLock<BTreeMap>`.
    BTreeRwLock,
    /// Sorted vector.
    SortedVec,
}

impl Structure {
    /// All structures, in report order.
    pub const ALL: [Structure; 7] = [
        Self::Floor,
        Self::V2,
        Self::V1,
        Self::Heap,
        Self::Manager,
        Self::BTreeRwLock,
        Self::SortedVec,
    ];

    /// The report name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Floor => "floor",
            Self::V2 => "v2",
            Self::V1 => "v1",
            Self::Heap => "heap",
            Self::Manager => "manager",
            Self::BTreeRwLock => "btree_rwlock",
            Self::SortedVec => "sorted_vec",
        }
    }

    /// Whether its answer is exact (an address past a block's end finds nothing).
    pub fn is_exact(self) -> bool {
        matches!(
            self,
            Self::Heap | Self::Manager | Self::BTreeRwLock | Self::SortedVec
        )
    }
}

/// A realistic mix of `count` method sizes (see [`jitmap_testkit::workload::method_size`]).
pub fn realistic_sizes(count: usize, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|_| jitmap_testkit::workload::method_size(&mut rng, 256 << 10))
        .collect()
}

/// Many heaps under one manager, and the same ranges in a `BTreeMap`: what the
/// range map is for.
pub struct ManyHeaps {
    /// The manager holding every heap.
    pub manager: ExecutionManager,
    /// The heaps, in creation order.
    pub heaps: Vec<OwnedHeap>,
    /// Heap start → (end, index), as a host without a range map would keep it.
    pub ranges: BTreeMap<usize, (usize, usize)>,
    /// Methods per heap as `(start, size)`.
    pub blocks: Vec<Vec<(usize, u64)>>,
}

impl ManyHeaps {
    /// `heaps` heaps of 1 MiB, each holding `methods` methods of realistic sizes.
    pub fn new(heaps: usize, methods: usize, seed: u64) -> Result<Self, BoxError> {
        let manager = ExecutionManager::new(8);
        let mut rng = Rng::new(seed);
        let mut owned = Vec::new();
        let mut blocks = Vec::new();
        for _ in 0..heaps {
            let heap = manager.create_heap(HeapConfig {
                span: 1 << 20,
                huge_pages: false,
                ..HeapConfig::default()
            })?;
            let mut list = Vec::new();
            for id in 0..methods {
                let size = jitmap_testkit::workload::method_size(&mut rng, 8 << 10);
                let code = heap.reserve(size)?.publish(CodeInfo::new(
                    id as u64,
                    "m",
                    JitKind::Baseline,
                ))?;
                list.push((code.start(), size));
            }
            blocks.push(list);
            owned.push(heap);
        }
        let ranges = owned
            .iter()
            .enumerate()
            .map(|(i, h)| (h.base(), (h.base() + h.span() as usize, i)))
            .collect();
        Ok(Self {
            manager,
            heaps: owned,
            ranges,
            blocks,
        })
    }

    /// `count` addresses: a heap, a method in it and an offset, each uniform.
    pub fn addresses(&self, rng: &mut Rng, count: usize) -> Vec<usize> {
        (0..count)
            .map(|_| {
                let list = &self.blocks[rng.below(self.blocks.len() as u64) as usize];
                let (start, size) = list[rng.below(list.len() as u64) as usize];
                start + rng.below(size) as usize
            })
            .collect()
    }

    /// The heap holding `addr` and `addr`'s offset in it, found outside any
    /// timed loop (for the floor, which reads one word of that heap's map).
    pub fn locate(&self, addr: usize) -> Option<(&MmapWords, u64)> {
        let (&base, &(end, i)) = self.ranges.range(..=addr).next_back()?;
        (addr < end).then(|| (self.heaps[i].map().words(), (addr - base) as u64))
    }
}
