//! Benchmark fixtures: the same methods held by every structure a user might pick
//! for IP → method lookup, so they can be measured side by side.
//!
//! - `v2`, `v1`: raw nibble-map lookups (map base = heap base).
//! - `manager`: the full `ExecutionManager::find`.
//! - `btree_rwlock`: `RwLock<BTreeMap<start, end>>`, as wasmtime's registry and
//!   cranelift-jit do it.
//! - `sorted_vec`: a sorted `Vec<(start, end)>` with binary search, the sorted-array
//!   alternative to a constant-time map.

use std::collections::BTreeMap;

use jitmap::heap::JitKind;
use jitmap::words::MmapWords;
use jitmap::{CodeInfo, ExecutionManager, Guard, HeapConfig, ManagedHeap, MapVersion, MapWriter};
use parking_lot::RwLock;

use crate::rng::Rng;

/// Any error a fixture or a measurement run can meet.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One set of methods, held by every structure.
pub struct Fixture<'m> {
    manager: &'m ExecutionManager,
    heap: ManagedHeap<'m>,
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
        let code: u64 = sizes.iter().map(|s| s + 48).sum();
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

    /// The published blocks as `(start, size)`.
    pub fn blocks(&self) -> &[(usize, u64)] {
        &self.blocks
    }

    /// The manager's heap.
    pub fn heap(&self) -> &ManagedHeap<'m> {
        &self.heap
    }

    /// The manager.
    pub fn manager(&self) -> &'m ExecutionManager {
        self.manager
    }

    /// The start of the block containing `addr` according to `structure`;
    /// `manager` needs `guard`.
    #[inline]
    pub fn lookup(&self, structure: Structure, guard: &Guard<'_>, addr: usize) -> Option<usize> {
        let base = self.heap.base();
        match structure {
            Structure::V2 => self
                .heap
                .map()
                .find(addr.wrapping_sub(base) as u64)
                .map(|s| base + s as usize),
            Structure::V1 => self
                .v1
                .map()
                .find(addr.wrapping_sub(base) as u64)
                .map(|s| base + s as usize),
            Structure::Manager => self
                .manager
                .find(guard, addr)
                .ok()
                .flatten()
                .map(|b| b.start()),
            Structure::BTreeRwLock => self
                .btree
                .read()
                .range(..=addr)
                .next_back()
                .filter(|&(_, &end)| addr < end)
                .map(|(&start, _)| start),
            Structure::SortedVec => {
                let i = self.sorted.partition_point(|&(start, _)| start <= addr);
                i.checked_sub(1)
                    .map(|i| self.sorted[i])
                    .filter(|&(_, end)| addr < end)
                    .map(|(start, _)| start)
            }
        }
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

    /// Bytes of v2 map words resident in memory.
    pub fn map_resident_bytes(&self) -> std::io::Result<usize> {
        self.heap.map().words().resident_bytes()
    }
}

/// A structure under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Structure {
    /// Nibble map v2.
    V2,
    /// Nibble map v1.
    V1,
    /// `ExecutionManager::find`.
    Manager,
    /// `RwLock<BTreeMap>`.
    BTreeRwLock,
    /// Sorted vector.
    SortedVec,
}

impl Structure {
    /// All structures, in report order.
    pub const ALL: [Structure; 5] = [
        Self::V2,
        Self::V1,
        Self::Manager,
        Self::BTreeRwLock,
        Self::SortedVec,
    ];

    /// The report name.
    pub fn name(self) -> &'static str {
        match self {
            Self::V2 => "v2",
            Self::V1 => "v1",
            Self::Manager => "manager",
            Self::BTreeRwLock => "btree_rwlock",
            Self::SortedVec => "sorted_vec",
        }
    }
}

/// A realistic mix of `count` method sizes (see [`crate::workload::method_size`]).
pub fn realistic_sizes(count: usize, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|_| crate::workload::method_size(&mut rng, 256 << 10))
        .collect()
}
