//! The agent's signal-handler stack walk over arbitrary stacks: arbitrary
//! registers and stack words (some pointing into the stack, into JIT methods
//! whose `.eh_frame` is built from arbitrary call-frame instructions, or into
//! this process's native code), walked by unwind rows or by frame pointers.
//!
//! The stack is mapped between two inaccessible pages, so a read past its
//! bounds crashes the target; the words below the stack pointer hold marks
//! that no frame may be built from. Each walk records at most `max_depth`
//! frames, starts at the pc, takes every later frame from a word of the
//! stack, and ends for exactly one counted reason.
#![no_main]

use std::cell::RefCell;
use std::collections::HashSet;

use arbitrary::Arbitrary;
use jitmap::agent::fuzzing::walk;
use jitmap::heap::EhFrame;
use jitmap::{CodeInfo, CodeRef, ExecutionManager, JitKind, OwnedHeap};
use libfuzzer_sys::fuzz_target;

#[path = "common/cfi.rs"]
mod cfi;
#[path = "common/heap.rs"]
mod heap;
use cfi::{Instruction, build};
use heap::small_heap;

/// Stack bytes between the guard pages.
const STACK: usize = 2 * 4096;
/// The top bits of a word read below the stack pointer.
const MARK: usize = 0xBAD0 << 48;

#[derive(Arbitrary, Debug)]
struct Input {
    methods: Vec<Method>,
    /// Where the stack pointer is, in words from the stack's low end.
    sp: u16,
    pc: Word,
    fp: Word,
    words: Vec<Word>,
    max_depth: u8,
    mixed: bool,
}

/// A JIT method: its code and the CFI of its one FDE.
#[derive(Arbitrary, Debug)]
struct Method {
    code: Vec<u8>,
    cie: Vec<Instruction>,
    fde: Vec<(u16, Instruction)>,
}

/// A register or stack word.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Word {
    /// Into the stack, `n` bytes up from the stack pointer (any alignment).
    Stack(u16),
    /// Into method `m` at `offset`.
    Jit {
        m: u8,
        offset: u16,
    },
    /// Into this process's own code (libc's `getpid` here).
    Native(u16),
    Raw(u64),
}

/// A fake thread stack: `STACK` bytes between two `PROT_NONE` pages.
struct Mapping {
    lo: usize,
}

impl Mapping {
    fn new() -> Self {
        // SAFETY: an anonymous private mapping; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK + 2 * 4096,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let lo = base as usize + 4096;
        // SAFETY: the middle pages of the mapping just made.
        let done =
            unsafe { libc::mprotect(lo as *mut _, STACK, libc::PROT_READ | libc::PROT_WRITE) };
        assert_eq!(done, 0);
        Self { lo }
    }

    fn words(&mut self) -> &mut [usize] {
        // SAFETY: `STACK` readable and writable bytes at `lo`, used by this
        // thread only (the mapping is thread-local), and never freed.
        unsafe { std::slice::from_raw_parts_mut(self.lo as *mut usize, STACK / 8) }
    }
}

struct World {
    manager: ExecutionManager,
    heap: OwnedHeap,
    stack: Mapping,
}

thread_local! {
    static WORLD: RefCell<Option<World>> = const { RefCell::new(None) };
}

fuzz_target!(|input: Input| {
    WORLD.with(|cell| {
        let mut cell = cell.borrow_mut();
        let world = cell.get_or_insert_with(|| {
            let (manager, heap) = small_heap();
            World {
                manager,
                heap,
                stack: Mapping::new(),
            }
        });
        run(world, &input);
    });
});

fn run(world: &mut World, input: &Input) {
    let mut methods: Vec<CodeRef> = Vec::new();
    for (i, m) in input.methods.iter().take(4).enumerate() {
        let size = m.code.len().clamp(1, 512);
        let Ok(mut r) = world.heap.reserve(size as u64) else {
            break;
        };
        r.code_mut().fill(0xCC);
        r.code_mut()[..m.code.len().min(size)].copy_from_slice(&m.code[..m.code.len().min(size)]);
        let len = u16::try_from(size).unwrap_or(u16::MAX);
        let eh_frame = build(r.address() as u64, len, &m.cie, &m.fde).map(|frame| EhFrame {
            frame: frame.into_boxed_slice(),
            header: Box::new([]),
        });
        let info = CodeInfo {
            eh_frame,
            ..CodeInfo::new(i as u64, "fuzzed", JitKind::Optimized)
        };
        // A refusal is a typed error and leaves the heap unchanged.
        if let Ok(code) = r.publish(info) {
            methods.push(code);
        }
    }
    let lo = world.stack.lo;
    let sp_index = usize::from(input.sp) % (STACK / 8);
    let sp = lo + 8 * sp_index;
    let native = libc::getpid as *const () as usize;
    let resolve = |w: Word| match w {
        Word::Stack(n) => sp + usize::from(n) % (STACK - 8 * sp_index).max(1),
        Word::Jit { m, offset } => methods
            .get(usize::from(m) % methods.len().max(1))
            .map_or(usize::from(offset), |c| {
                c.start() + usize::from(offset) % c.size() as usize
            }),
        Word::Native(n) => native + usize::from(n % 64),
        Word::Raw(x) => x as usize,
    };
    let words = world.stack.words();
    let mut values = HashSet::new();
    for (i, slot) in words.iter_mut().enumerate() {
        *slot = if i < sp_index {
            MARK | i
        } else {
            let w = input
                .words
                .get(i - sp_index)
                .copied()
                .unwrap_or(Word::Raw(0));
            let value = resolve(w);
            values.insert(value);
            value
        };
    }
    let pc = resolve(input.pc);
    let fp = resolve(input.fp);
    let max_depth = usize::from(input.max_depth % 64) + 1;
    // SAFETY: `[lo, lo + STACK)` is mapped readable for the whole call.
    let walked = unsafe {
        walk(
            &world.manager,
            (pc, sp, fp),
            (lo, lo + STACK),
            max_depth,
            input.mixed,
        )
    }
    .expect("a reader slot")
    .expect("the stack pointer is on the stack");
    assert_eq!(walked.end.total(), 1, "{walked:?}");
    assert!(
        !walked.frames.is_empty() && walked.frames.len() <= max_depth,
        "{walked:?}"
    );
    if walked.end.depth_limit == 1 {
        assert_eq!(walked.frames.len(), max_depth, "{walked:?}");
    }
    assert_eq!(walked.frames[0], pc);
    for &ra in &walked.frames[1..] {
        // A word below the stack pointer is a mark, never in `values`.
        assert!(
            values.contains(&ra),
            "a return address from no stack word at or above sp: {ra:#x} in {walked:?}"
        );
    }
    for code in methods {
        world
            .heap
            .free(code)
            .expect("a method just published frees");
    }
}
