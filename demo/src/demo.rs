//! The agent's demo host: real x86-64 JIT functions, assembled with
//! `iced-x86`, that call each other through indirection cells.
//!
//! `top` loops over `middle`, which calls `leaf_1x`, `leaf_2x` and `leaf_4x`.
//! The leaves run the same loop with iteration counts in the ratio 1:2:4, so a
//! correct profiler gives them 1/7, 2/7 and 4/7 of the samples. The base count
//! is read from a cell that the host changes on every call: a fixed period
//! would phase-lock with a periodic sampler and bias the shares. Every function
//! keeps a frame pointer, and each returns a value the host can predict, so a
//! wrong answer shows.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, dword_ptr, ecx, qword_ptr, r12, rax, rbp, rbx, rcx, rdi, rsp,
};
use jitmap::heap::DebugEntry;
use jitmap::manager::ManagerError;
use jitmap::{
    CallCell, CodeInfo, CodeRef, ExecutionManager, HeapConfig, HeapError, JitKind, OwnedHeap,
};

/// The leaves' names, in the order of their work (1, 2 and 4 units).
pub const LEAVES: [&str; 3] = ["leaf_1x", "leaf_2x", "leaf_4x"];
/// The function that calls the leaves.
pub const MIDDLE: &str = "middle";
/// The function that loops over `middle`.
pub const TOP: &str = "top";
/// The native function that calls `top`: the outermost frame the agent names.
pub const NATIVE_CALLER: &str = "jitmap_demo::demo::call_top";

/// Why the demo could not be built.
#[derive(Debug)]
pub enum DemoError {
    /// Assembling failed.
    Assemble(IcedError),
    /// The heap refused.
    Heap(HeapError),
    /// The manager refused.
    Manager(ManagerError),
    /// The Cranelift module refused.
    #[cfg(feature = "cranelift")]
    Cranelift(jitmap_cranelift::JitError),
    /// Building or loading a native part of a demo failed (the C compiler,
    /// `dlopen`).
    Setup(String),
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Assemble(e) => write!(f, "assembling the demo: {e}"),
            Self::Heap(e) => write!(f, "publishing the demo: {e}"),
            Self::Manager(e) => write!(f, "creating the demo heap: {e}"),
            Self::Setup(reason) => write!(f, "setting up the demo: {reason}"),
            #[cfg(feature = "cranelift")]
            Self::Cranelift(e) => write!(f, "compiling the demo with Cranelift: {e}"),
        }
    }
}

impl std::error::Error for DemoError {}

impl From<IcedError> for DemoError {
    fn from(e: IcedError) -> Self {
        Self::Assemble(e)
    }
}

impl From<HeapError> for DemoError {
    fn from(e: HeapError) -> Self {
        Self::Heap(e)
    }
}

impl From<ManagerError> for DemoError {
    fn from(e: ManagerError) -> Self {
        Self::Manager(e)
    }
}

#[cfg(feature = "cranelift")]
impl From<jitmap_cranelift::JitError> for DemoError {
    fn from(e: jitmap_cranelift::JitError) -> Self {
        Self::Cranelift(e)
    }
}

/// What compiles the demo's five functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DemoBackend {
    /// Assembled by hand with iced-x86 ([`Demo`]).
    #[default]
    Iced,
    /// Compiled by Cranelift into a `jitmap-cranelift` module
    /// ([`crate::demo_cranelift::CraneliftDemo`]).
    #[cfg(feature = "cranelift")]
    Cranelift,
}

impl std::str::FromStr for DemoBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "iced" => Ok(Self::Iced),
            #[cfg(feature = "cranelift")]
            "cranelift" => Ok(Self::Cranelift),
            _ => Err(format!(
                "unknown backend {s:?}; the backends are: cranelift, iced"
            )),
        }
    }
}

/// The demo, published by one backend.
#[derive(Debug)]
pub enum PublishedDemo {
    /// Hand-assembled.
    Iced(Demo),
    /// Compiled by Cranelift.
    #[cfg(feature = "cranelift")]
    Cranelift(Box<crate::demo_cranelift::CraneliftDemo>),
}

impl PublishedDemo {
    /// Publishes the demo in `manager` with `backend`.
    pub fn publish(manager: &ExecutionManager, backend: DemoBackend) -> Result<Self, DemoError> {
        Ok(match backend {
            DemoBackend::Iced => Self::Iced(Demo::publish(manager)?),
            #[cfg(feature = "cranelift")]
            DemoBackend::Cranelift => Self::Cranelift(Box::new(
                crate::demo_cranelift::CraneliftDemo::publish(manager)?,
            )),
        })
    }

    /// Calls `top(rounds)` with the leaves at `base` (see [`Demo::run`]).
    pub fn run(&self, rounds: u64, base: u32) -> u64 {
        match self {
            Self::Iced(demo) => demo.run(rounds, base),
            #[cfg(feature = "cranelift")]
            Self::Cranelift(demo) => demo.run(rounds, base),
        }
    }
}

/// A leaf's and `middle`'s signature: nothing in, their sum out.
type Leaf = extern "C" fn() -> u64;

/// The published demo.
pub struct Demo {
    heap: OwnedHeap,
    /// The call cells JIT callers load their callee from (`call [cell]`), so a
    /// host could swap an implementation with one store: the three leaves,
    /// then `middle`.
    cells: Box<[CallCell<Leaf>; 4]>,
    /// The base iteration count the leaves read.
    work: Box<AtomicUsize>,
    /// `top`, called by the host.
    top: extern "C" fn(u64) -> u64,
    code: Vec<(String, CodeRef)>,
}

impl fmt::Debug for Demo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Demo")
            .field("code", &self.code)
            .finish_non_exhaustive()
    }
}

/// Sum of 1..=n: what a leaf of `n` iterations returns.
fn triangle(n: u64) -> u64 {
    n * (n + 1) / 2
}

impl Demo {
    /// Publishes the five functions in a new heap of `manager`.
    pub fn publish(manager: &ExecutionManager) -> Result<Self, DemoError> {
        let heap = manager.create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })?;
        let work = Box::new(AtomicUsize::new(0));
        let work_cell = std::ptr::from_ref(&*work).addr() as u64;
        let mut code = Vec::new();
        let mut entries = Vec::new();
        for (i, name) in LEAVES.iter().enumerate() {
            let r = publish(&heap, name, 1 + i as u64, |a| leaf(a, work_cell, i as u32))?;
            // SAFETY: `leaf` assembles a complete C function taking nothing
            // and returning a u64.
            entries.push(unsafe { r.entry::<Leaf>() });
            code.push((name.to_string(), r));
        }
        // The cells stay where this box puts them: JIT code holds their
        // addresses. `middle`'s cell is set once `middle` is published.
        let cells = Box::new([0, 1, 2, 0].map(|i| CallCell::new(entries[i])));
        let leaf_addresses = [0, 1, 2].map(|i| cells[i].address() as u64);
        let r = publish(&heap, MIDDLE, 4, |a| middle(a, leaf_addresses))?;
        // SAFETY: `middle` assembles a function of the leaves' signature.
        cells[3].set(unsafe { r.entry::<Leaf>() });
        code.push((MIDDLE.to_string(), r));
        let middle_cell = cells[3].address() as u64;
        let r = publish(&heap, TOP, 5, |a| top(a, middle_cell))?;
        // SAFETY: `top` assembles a complete C function taking one u64 and
        // returning one.
        let top = unsafe { r.entry() };
        code.push((TOP.to_string(), r));
        Ok(Self {
            heap,
            cells,
            work,
            top,
            code,
        })
    }

    /// Each function's name and where it is.
    pub fn functions(&self) -> &[(String, CodeRef)] {
        &self.code
    }

    /// The heap the demo lives in.
    pub fn heap(&self) -> &OwnedHeap {
        &self.heap
    }

    /// What `run(rounds, base)` returns when the right code ran.
    pub fn expected(rounds: u64, base: u32) -> u64 {
        let b = u64::from(base);
        rounds * (triangle(b) + triangle(2 * b) + triangle(4 * b))
    }

    /// Calls `top(rounds)`: `rounds` calls of `middle`, each calling the three
    /// leaves, which run `base`, `2 * base` and `4 * base` iterations (`base`
    /// at most 2^29). Returns what the JIT code computed.
    pub fn run(&self, rounds: u64, base: u32) -> u64 {
        // Relaxed: read by JIT code on this same thread.
        self.work
            .store(base.min(1 << 29) as usize, Ordering::Relaxed);
        // Keep the cells alive and unmoved while the code reads them.
        let _cells = &self.cells;
        // The functions and cells `top` reaches stay published and alive as
        // long as `self`.
        call_top(self.top, rounds)
    }
}

/// The native caller of `top`, kept out of line so that it is a real frame.
#[inline(never)]
pub fn call_top(top: extern "C" fn(u64) -> u64, rounds: u64) -> u64 {
    let result = top(std::hint::black_box(rounds));
    // Work after the call keeps it from being a tail call.
    std::hint::black_box(result)
}

/// Assembles a function at its reserved address and publishes it.
fn publish(
    heap: &OwnedHeap,
    name: &str,
    method_id: u64,
    body: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>,
) -> Result<CodeRef, DemoError> {
    let mut a = CodeAssembler::new(64)?;
    body(&mut a)?;
    // Position-independent (relative branches, absolute cell addresses):
    // assembled once for its size, then at its real address.
    let size = a.assemble(0)?.len() as u64;
    let mut r = heap.reserve(size)?;
    let bytes = a.assemble(r.address() as u64)?;
    r.code_mut().copy_from_slice(&bytes);
    let info = CodeInfo {
        debug: vec![DebugEntry {
            offset: 0,
            line: 1,
            column: 1,
            file: "demo.jit".into(),
        }],
        ..CodeInfo::new(method_id, name, JitKind::Optimized)
    };
    Ok(r.publish(info)?)
}

/// `leaf()`: sum of 1..=n in a countdown loop, for n = the work cell << `shift`.
fn leaf(a: &mut CodeAssembler, work_cell: u64, shift: u32) -> Result<(), IcedError> {
    a.push(rbp)?;
    a.mov(rbp, rsp)?;
    a.mov(rcx, work_cell)?;
    a.mov(ecx, dword_ptr(rcx))?;
    a.shl(ecx, shift)?;
    a.xor(rax, rax)?;
    let mut top = a.create_label();
    a.set_label(&mut top)?;
    a.add(rax, rcx)?;
    a.dec(ecx)?;
    a.jnz(top)?;
    a.pop(rbp)?;
    a.ret()
}

/// `middle()`: the three leaves' results added up, each called through its cell.
fn middle(a: &mut CodeAssembler, cells: [u64; 3]) -> Result<(), IcedError> {
    a.push(rbp)?;
    a.mov(rbp, rsp)?;
    a.push(rbx)?;
    a.sub(rsp, 8)?; // keep calls 16-byte aligned
    a.xor(rbx, rbx)?;
    for cell in cells {
        a.mov(rax, cell)?;
        a.call(qword_ptr(rax))?;
        a.add(rbx, rax)?;
    }
    a.mov(rax, rbx)?;
    a.add(rsp, 8)?;
    a.pop(rbx)?;
    a.pop(rbp)?;
    a.ret()
}

/// `top(rounds)`: calls `middle` `rounds` times through its cell; returns the sum.
fn top(a: &mut CodeAssembler, middle_cell: u64) -> Result<(), IcedError> {
    a.push(rbp)?;
    a.mov(rbp, rsp)?;
    a.push(rbx)?;
    a.push(r12)?;
    a.mov(r12, rdi)?;
    a.xor(rbx, rbx)?;
    let mut done = a.create_label();
    a.test(r12, r12)?;
    a.jz(done)?;
    let mut again = a.create_label();
    a.set_label(&mut again)?;
    a.mov(rax, middle_cell)?;
    a.call(qword_ptr(rax))?;
    a.add(rbx, rax)?;
    a.dec(r12)?;
    a.jnz(again)?;
    a.set_label(&mut done)?;
    a.mov(rax, rbx)?;
    a.pop(r12)?;
    a.pop(rbx)?;
    a.pop(rbp)?;
    a.ret()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_computes_what_the_host_predicts() {
        if !cfg!(target_arch = "x86_64") {
            println!("skipped on aarch64: iced-x86 code");
            return;
        }
        let manager = ExecutionManager::new(4);
        let demo = Demo::publish(&manager).unwrap();
        assert_eq!(demo.run(0, 100), 0);
        assert_eq!(demo.run(3, 100), 3 * (5050 + 20100 + 80200));
        assert_eq!(Demo::expected(3, 100), 3 * (5050 + 20100 + 80200));
        assert_eq!(demo.run(1, 7), 28 + 105 + 406);
        let names: Vec<_> = demo.functions().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["leaf_1x", "leaf_2x", "leaf_4x", "middle", "top"]);
        // Each function starts with `push rbp; mov rbp, rsp`.
        for (_, r) in demo.functions() {
            // SAFETY: published code, readable for the demo's lifetime.
            let head = unsafe { std::slice::from_raw_parts(r.start() as *const u8, 4) };
            assert_eq!(head, [0x55, 0x48, 0x89, 0xE5]);
        }
    }
}
