//! A group of methods in one heap, with its indirection cells and counters.

use std::sync::atomic::AtomicBool;

use jitmap::agent::CallCounters;
use jitmap::heap::MemoryMode;
use jitmap::{CallCell, CodeRef, ExecutionManager, FnPtr, HeapConfig, OwnedHeap};
use parking_lot::Mutex;

use super::codegen::triangle;
use super::{RunConfig, RunError};
use jitmap_testkit::rng::Rng;

/// A method's signature: the context in, its value out (see `codegen`).
pub(super) type Entry = extern "C" fn(u64) -> u64;

/// What a method's cell holds until its first compilation: never called,
/// because executors call a root only when its whole chain is compiled.
pub(super) extern "C" fn not_compiled(_context: u64) -> u64 {
    u64::MAX
}

/// Whether `cell` holds a compiled method.
pub(super) fn compiled(cell: &CallCell<Entry>) -> bool {
    cell.get().address() != (not_compiled as Entry).address()
}

/// One method of a group.
#[derive(Clone, Copy, Debug)]
pub(super) struct Method {
    pub(super) work: u32,
    pub(super) callee: Option<usize>,
    /// What a call returns.
    pub(super) value: u64,
    /// Filler bytes in tier 0 (large methods).
    pub(super) filler: usize,
}

/// A group of methods in one heap: the permanent group, or a loaded one that
/// is later unloaded with its heap.
pub(super) struct Group {
    pub(super) id: u32,
    pub(super) heap: Mutex<Option<OwnedHeap>>,
    pub(super) methods: Vec<Method>,
    /// Roots: methods no other method calls.
    pub(super) roots: Vec<usize>,
    /// Each method's current entry ([`not_compiled`] until compiled).
    pub(super) cells: Box<[CallCell<Entry>]>,
    pub(super) counters: CallCounters,
    /// Each method's current code: ref, version id, tier.
    pub(super) current: Mutex<Vec<Option<(CodeRef, u64, u8)>>>,
    pub(super) alive: AtomicBool,
}

/// Methods call the next one in chains of this length.
pub(super) const CHAIN: usize = 4;

impl Group {
    pub(super) fn new(
        id: u32,
        manager: &ExecutionManager,
        config: &RunConfig,
        methods: usize,
        large: usize,
        threshold: u32,
        rng: &mut Rng,
    ) -> Result<Self, RunError> {
        let filler_total: u64 = (large as u64) * (3 << 20);
        let heap = manager.create_heap(HeapConfig {
            span: (16 << 20) + filler_total + methods as u64 * 512,
            version: config.version,
            mode: if config.wx {
                MemoryMode::WriteXorExecute
            } else {
                MemoryMode::Rwx
            },
            ..HeapConfig::default()
        })?;
        let mut list: Vec<Method> = (0..methods)
            .map(|i| Method {
                work: 1000 + rng.below(4000) as u32,
                callee: (i % CHAIN != CHAIN - 1 && i + 1 < methods).then_some(i + 1),
                value: 0,
                filler: if i < large {
                    (1 << 20) + rng.below(1 << 20) as usize
                } else {
                    0
                },
            })
            .collect();
        for i in (0..methods).rev() {
            let callee = list[i].callee.map_or(0, |c| list[c].value);
            list[i].value = triangle(list[i].work) + i as u64 + callee;
        }
        Ok(Self {
            id,
            heap: Mutex::new(Some(heap)),
            roots: (0..methods).step_by(CHAIN).collect(),
            cells: (0..methods)
                .map(|_| CallCell::new(not_compiled as Entry))
                .collect(),
            counters: CallCounters::new(methods as u32, threshold)?,
            current: Mutex::new(vec![None; methods]),
            methods: list,
            alive: AtomicBool::new(true),
        })
    }
}
