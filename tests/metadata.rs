//! What a heap allocates per method, counted by a global allocator: at most
//! 96 bytes for a method published with `CodeInfo::new(id, name, kind)`
//! alone (beyond its name's bytes), and nothing that grows while methods
//! come and go.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use jitmap::heap::BlockKind;
use jitmap::{CodeHeap, CodeInfo, CodeRef, Domain, HeapConfig, JitKind};

/// Counts the bytes each thread has allocated and not freed.
struct Counting;

thread_local! {
    /// This thread's live bytes. Per thread, so that the harness's other
    /// tests do not count; const-initialized, so the allocator reading it
    /// allocates nothing.
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is per thread.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.with(|l| l.set(l.get() + layout.size() as isize));
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.with(|l| l.set(l.get() - layout.size() as isize));
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.with(|l| l.set(l.get() + new_size as isize - layout.size() as isize));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> isize {
    LIVE.with(Cell::get)
}

fn heap(span: u64) -> CodeHeap {
    CodeHeap::new(
        HeapConfig {
            span,
            huge_pages: false,
            ..HeapConfig::default()
        },
        &Domain::new(1),
    )
    .unwrap()
}

fn publish(heap: &CodeHeap, id: u64, name: &str) -> CodeRef {
    let mut r = heap.reserve(64).unwrap();
    r.code_mut()[0] = 0xC3;
    r.publish(CodeInfo::new(id, name, JitKind::Baseline))
        .unwrap()
}

/// The measure: methods of 64 bytes with a one-letter name and
/// nothing else. Every method is then found with its id, name and tier, so
/// the saving lost no field.
#[test]
fn a_plain_method_costs_at_most_96_bytes() {
    const METHODS: u64 = 20_000;
    let heap = heap(4 << 20);
    let before = live_bytes();
    let codes: Vec<CodeRef> = (0..METHODS).map(|id| publish(&heap, id, "m")).collect();
    let codes_bytes = (codes.capacity() * size_of::<CodeRef>()) as isize;
    let per_method = (live_bytes() - before - codes_bytes) as f64 / METHODS as f64;
    assert!(per_method <= 96.0, "{per_method} B per method");
    let domain = heap.domain().clone();
    let reader = domain.register().unwrap();
    let guard = reader.pin().unwrap();
    for (id, code) in codes.iter().enumerate() {
        let block = heap.find(&guard, code.start() + 63).unwrap().unwrap();
        let BlockKind::Method(header) = block.kind() else {
            panic!("{code:?} is not a method");
        };
        assert_eq!(
            (
                block.start(),
                block.offset(),
                header.method_id(),
                header.name(),
                header.kind(),
                header.code_size()
            ),
            (code.start(), 63, id as u64, "m", JitKind::Baseline, 64)
        );
    }
}

/// Methods come and go, a thousand live at a time, with names of 1 to 300
/// bytes: once every name length has been seen live, the heap's allocations
/// stop growing (names and headers are reused after their grace period).
/// What is live swings with the mix of names (long ones are allocated on
/// their own), so the peaks of two later thirds are compared.
#[test]
fn churn_reuses_headers_and_names() {
    const LIVE: usize = 1_000;
    const ROUNDS: u64 = 60_000;
    let heap = heap(4 << 20);
    let name = |id: u64| "n".repeat(1 + (id % 300) as usize);
    let mut ring: Vec<CodeRef> = Vec::with_capacity(LIVE);
    let mut peaks = [0isize; 3];
    for id in 0..ROUNDS {
        if ring.len() == LIVE {
            heap.free(ring.remove(0)).unwrap();
        }
        ring.push(publish(&heap, id, &name(id)));
        let third = (id * 3 / ROUNDS) as usize;
        peaks[third] = peaks[third].max(live_bytes());
    }
    assert!(peaks[2] <= peaks[1], "peaks grew: {peaks:?}");
    let domain = heap.domain().clone();
    let reader = domain.register().unwrap();
    let guard = reader.pin().unwrap();
    for (code, id) in ring.iter().zip(ROUNDS - LIVE as u64..) {
        let BlockKind::Method(header) = heap.find(&guard, code.start()).unwrap().unwrap().kind()
        else {
            panic!("{code:?} is not a method");
        };
        assert_eq!((header.method_id(), header.name()), (id, name(id).as_str()));
    }
}
