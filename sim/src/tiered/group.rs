//! A group of methods in one heap (the iced backend) or one module (the
//! cranelift backend), with its indirection cells and counters.

use std::sync::atomic::{AtomicBool, Ordering};

use jitmap::agent::CallCounters;
use jitmap::{CallCell, CodeRef, ExecutionManager, HeapConfig, MemoryMode, OwnedHeap};
use parking_lot::Mutex;

use super::clif::ClifGroup;
use super::shape::Method;
use super::{Backend, RunConfig, RunError};
use jitmap_testkit::rng::Rng;

/// A method's signature: the context in, its value out (see `shape`).
pub(super) type Entry = extern "C" fn(u64) -> u64;

/// What a method's cell holds until its first compilation: never called,
/// because executors call a root only when its whole chain is
/// [`Group::ready`]. (Whether a cell still holds it is not asked of the
/// pointer: an optimized build may give a small function a copy per
/// codegen unit, each at its own address.)
extern "C" fn not_compiled(_context: u64) -> u64 {
    u64::MAX
}

/// Where a group's code lives.
pub(super) enum Code {
    /// Hand-assembled methods in a heap of their own.
    Iced(OwnedHeap),
    /// A Cranelift module (its own heap inside).
    Cranelift(Box<ClifGroup>),
}

impl Code {
    /// The heap the group's code is in.
    pub(super) fn heap(&self) -> &OwnedHeap {
        match self {
            Self::Iced(heap) => heap,
            Self::Cranelift(group) => group.module.heap(),
        }
    }
}

/// A group of methods in one heap: the permanent group, or a loaded one that
/// is later unloaded with its heap (or module).
pub(super) struct Group {
    pub(super) id: u32,
    /// `None` once unloaded.
    pub(super) code: Mutex<Option<Code>>,
    pub(super) methods: Vec<Method>,
    /// Roots: methods no other method calls.
    pub(super) roots: Vec<usize>,
    /// Each method's entry for executors ([`not_compiled`] until compiled):
    /// its current code (iced), or its trampoline (cranelift).
    pub(super) cells: Box<[CallCell<Entry>]>,
    /// Whether each method's cell holds compiled code.
    compiled: Box<[AtomicBool]>,
    pub(super) counters: CallCounters,
    /// Each method's current code: ref, version id, tier.
    pub(super) current: Mutex<Vec<Option<(CodeRef, u64, u8)>>>,
    /// The shadow model's ids of its trampolines (cranelift).
    pub(super) stubs: Mutex<Vec<u64>>,
    pub(super) alive: AtomicBool,
}

/// Methods call the next one in chains of this length.
pub(super) const CHAIN: usize = 4;

/// The bytes of a group's heap for `methods` methods, `large` of them with
/// fillers of up to 3 MiB, on `page`-byte pages. Flip mode gives every
/// block pages of its own (a method and its trampoline, and the version a
/// tier-up replaces until it is reclaimed): four pages a method, 64 KiB of
/// them on a 64 KiB-page kernel. Cranelift's methods and their trampolines
/// take the 16 MiB of room.
fn heap_span(mode: MemoryMode, methods: usize, large: usize, page: u64) -> u64 {
    let per_method = if mode == MemoryMode::FlipOnPublish {
        4 * page
    } else {
        1024
    };
    (16 << 20) + large as u64 * (3 << 20) + methods as u64 * per_method
}

/// The kernel's page size.
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).unwrap_or(4096)
}

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
        let heap = HeapConfig {
            span: heap_span(config.mode, methods, large, page_size()),
            version: config.version,
            mode: config.mode,
            ..HeapConfig::default()
        };
        let code = match config.backend {
            Backend::Iced => Code::Iced(manager.create_heap(heap)?),
            Backend::Cranelift => Code::Cranelift(Box::new(ClifGroup::new(
                manager,
                HeapConfig {
                    align: 32,
                    register_unwind: true,
                    ..heap
                },
                id,
                methods,
            )?)),
        };
        // Leaf arithmetic is Cranelift's: the iced methods have none.
        let steps = |rng: &mut Rng| match config.backend {
            Backend::Iced => 0,
            Backend::Cranelift => rng.below(25) as u8,
        };
        let mut list: Vec<Method> = (0..methods)
            .map(|i| Method {
                work: 1000 + rng.below(4000) as u32,
                callee: (i % CHAIN != CHAIN - 1 && i + 1 < methods).then_some(i + 1),
                value: 0,
                filler: match config.backend {
                    _ if i >= large => 0,
                    Backend::Iced => (1 << 20) + rng.below(1 << 20) as usize,
                    // Cranelift compiles a megabyte of code in a few hundred
                    // milliseconds: a little over one megabyte.
                    Backend::Cranelift => (1 << 20) + rng.below(1 << 17) as usize,
                },
                mix: rng.next_u64(),
                steps: steps(rng),
            })
            .collect();
        for i in (0..methods).rev() {
            let callee = list[i].callee.map_or(0, |c| list[c].value);
            list[i].value = list[i].compute(i, callee);
        }
        Ok(Self {
            id,
            code: Mutex::new(Some(code)),
            roots: (0..methods).step_by(CHAIN).collect(),
            cells: (0..methods)
                .map(|_| CallCell::new(not_compiled as Entry))
                .collect(),
            compiled: (0..methods).map(|_| AtomicBool::new(false)).collect(),
            counters: CallCounters::new(methods as u32, threshold)?,
            current: Mutex::new(vec![None; methods]),
            stubs: Mutex::new(Vec::new()),
            methods: list,
            alive: AtomicBool::new(true),
        })
    }
}

impl Group {
    /// Sets method `m`'s cell to `entry` and marks it compiled.
    pub(super) fn set_entry(&self, m: usize, entry: Entry) {
        self.cells[m].set(entry);
        // Release: a thread that sees the mark sees the cell's new entry.
        self.compiled[m].store(true, Ordering::Release);
    }

    /// Whether method `m`'s cell holds compiled code.
    pub(super) fn is_compiled(&self, m: usize) -> bool {
        // Acquire: pairs with `set_entry`'s Release.
        self.compiled[m].load(Ordering::Acquire)
    }

    /// Whether every method on `root`'s chain is compiled: only then may an
    /// executor call it.
    pub(super) fn ready(&self, root: usize) -> bool {
        let mut m = Some(root);
        while let Some(i) = m {
            if !self.is_compiled(i) {
                return false;
            }
            m = self.methods[i].callee;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Issue 67, item 8: flip-mode heaps were sized at 4 × 4096 bytes a method, and a
    // 16 or 64 KiB-page kernel ran out of them (`run --flip` ended in
    // `HeapFull`).
    #[test]
    fn flip_mode_heaps_take_four_pages_a_method_whatever_the_page() {
        let base = 16 << 20;
        for page in [4096, 16 << 10, 64 << 10] {
            assert_eq!(
                heap_span(MemoryMode::FlipOnPublish, 1000, 2, page),
                base + 2 * (3 << 20) + 1000 * 4 * page
            );
            assert_eq!(
                heap_span(MemoryMode::WriteXorExecute, 1000, 2, page),
                base + 2 * (3 << 20) + 1000 * 1024
            );
        }
        assert_eq!(page_size(), region_page());
    }

    /// This machine's page size, as the kernel's auxiliary vector says.
    fn region_page() -> u64 {
        // SAFETY: getauxval has no preconditions.
        unsafe { libc::getauxval(libc::AT_PAGESZ) }
    }
}
