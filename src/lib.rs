//! An executable code heap for JIT compilers and language runtimes, with exact,
//! lock-free, signal-safe lookup from an instruction pointer to its method.
//!
//! jitmap owns the memory JIT code lives in. A host reserves space, writes code,
//! publishes it with its metadata, and frees, moves or aborts it. Any thread, a
//! signal handler included, turns an address into its method: start, offset,
//! funclet, hot and cold parts, unwind, debug and GC info. Lookups go through the
//! .NET runtime's nibble maps, bit-exact with its encoding: version 2 reads at
//! most two map words; version 1 walks back over the method, so its cost grows
//! with the method's size. A [`range::RangeSectionMap`] routes any address to its
//! heap or precompiled image.
//!
//! # A host in one screen
//!
//! ```
//! use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
//!
//! let manager = ExecutionManager::new(64); // 64 reader slots
//! let heap = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
//!
//! // Compile: reserve, write, publish. Until publish, no reader can see the code.
//! #[cfg(target_arch = "x86_64")]
//! let bytes = [0xB8, 0x2A, 0, 0, 0, 0xC3]; // mov eax, 42; ret
//! #[cfg(target_arch = "aarch64")]
//! let bytes = [0x40, 0x05, 0x80, 0x52, 0xC0, 0x03, 0x5F, 0xD6]; // mov w0, #42; ret
//! let mut r = heap.reserve(bytes.len() as u64)?;
//! r.code_mut().copy_from_slice(&bytes);
//! let code = r.publish(CodeInfo::new(7, "answer", JitKind::Optimized))?;
//!
//! // Look up: register a reader once per thread (outside any signal handler),
//! // then pin and find. No lock, no allocation, no system call.
//! let reader = manager.register_reader()?;
//! let guard = manager.pin(&reader)?;
//! let block = guard.find(code.start() + 3).expect("inside the method");
//! assert_eq!((block.method_id(), block.start(), block.offset()), (7, code.start(), 3));
//! assert!(guard.find(code.start() + bytes.len()).is_none()); // exact: past the end is nothing
//! drop(guard);
//!
//! // Free unpublishes at once; the bytes are reused after every reader has unpinned.
//! heap.free(code)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What a guard protects
//!
//! A [`Guard`] protects *lookups*: while it is held, nothing a lookup under it
//! could have reached (a block's header, its prefix words, a removed heap's range
//! fragments, the heap's mapping) is reclaimed. Guards nest, including from a
//! signal handler that interrupts another lookup on the same thread.
//!
//! A guard does not protect *execution*. A method that another thread is
//! running, or will return into, is protected by that thread being an
//! [`Executor`]: executors declare quiescent points (between top-level calls into
//! JIT code, or by going offline while parked), and freed bytes, like a dropped
//! heap's mapping, are reused only after every online executor has passed one.
//!
//! ```
//! use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
//!
//! let manager = ExecutionManager::new(8);
//! let heap = manager.create_heap(HeapConfig { span: 1 << 20, ..HeapConfig::default() })?;
//! let executor = manager.register_executor()?; // on each thread that runs JIT code
//! let mut r = heap.reserve(1)?;
//! r.code_mut()[0] = 0xC3;
//! let old_tier = r.publish(CodeInfo::new(1, "f", JitKind::Baseline))?;
//! // ... the host swaps its call cell to a new tier, then frees the old one:
//! heap.free(old_tier)?;
//! assert_eq!(heap.try_reclaim(), 0); // the executor may still be inside it
//! executor.quiescent(); // back in the host, between calls
//! assert!(heap.try_reclaim() > 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Layers
//!
//! - [`nibble`]: the maps alone, [`NibbleMap`] and its single writer
//!   [`MapWriter`], over any word storage ([`map_words`]).
//! - [`heap`]: [`CodeHeap`], one heap without the manager.
//! - [`epoch`]: [`Domain`], [`Reader`] and [`Guard`], the grace periods.
//! - [`range`] and [`image`]: the range-section map and precompiled images.
//! - [`manager`]: [`ExecutionManager`], one lookup for everything.
//! - [`events`] and [`perf`]: code events, jitdump files and perf maps.
//! - [`agent`]: the sampling profiler and the probes JIT code calls.
//! - [`remote`]: the descriptor, and lookups from other processes.
//!
//! Every misuse is a typed error that leaves the state unchanged; the layer
//! errors convert into each other with `?`.
//!
//! # Platforms
//!
//! Linux on x86-64 and aarch64. x86-64 is tested natively, aarch64 under
//! qemu-user (the README's platform table says what that cannot show). What
//! differs by architecture lives in one private module per instruction set;
//! other targets are refused at compile time.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

#[cfg(not(target_os = "linux"))]
compile_error!("jitmap supports Linux only (x86-64 and aarch64)");
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("jitmap supports x86-64 and aarch64 only");

#[cfg(not(loom))]
pub mod agent;
#[cfg(not(loom))]
mod arch;
pub mod call;
/// The agent's call counters alone, for the loom models (see `agent::counters`).
#[cfg(loom)]
#[path = "agent/counters.rs"]
pub mod counters;
#[cfg(loom)]
pub mod defect;
/// The end map's words alone, for the loom models (see `heap::end_words`).
#[cfg(loom)]
#[path = "heap/end_words.rs"]
pub mod end_words;
pub mod epoch;
#[cfg(not(loom))]
pub mod events;
#[cfg(not(loom))]
#[cfg(feature = "gdb-jit")]
mod gdb;
#[cfg(not(loom))]
pub mod heap;
mod hex;
#[cfg(not(loom))]
pub mod image;
#[cfg(not(loom))]
pub mod info;
#[cfg(not(loom))]
pub mod manager;
#[cfg(not(loom))]
mod mapping;
pub mod nibble;
#[cfg(not(loom))]
pub mod perf;
pub mod range;
#[cfg(loom)]
#[path = "agent/registry.rs"]
pub mod registry;
#[cfg(not(loom))]
pub mod remote;
// The change sequence and the atomics facade: internal, but the loom models
// reach the sequence.
#[cfg(loom)]
pub mod change_seq;
#[cfg(not(loom))]
mod change_seq;
pub mod map_words;
#[cfg(loom)]
pub mod swap;
#[cfg(not(loom))]
mod swap;
mod sync;
#[cfg(test)]
mod test_rng;
#[cfg(not(loom))]
pub mod unwind;

#[cfg(not(loom))]
pub use call::{CallCell, CodeAddress, FnPtr};
pub use epoch::{Domain, EpochError, Executor, ForeignGuard, Guard, Reader};
#[cfg(not(loom))]
pub use heap::{
    CodeHeap, CodeRef, HeapConfig, HeapError, MAX_UNWIND_ROOM, MemoryMode, PublishRefused,
    Reservation,
};
#[cfg(not(loom))]
pub use info::{CodeInfo, JitKind};
#[cfg(not(loom))]
pub use manager::{
    CodeBlock, ExecutionManager, HeapSection, Lookup, ManagerError, ManagerGuard, OwnedHeap,
    StubKindName,
};
pub use nibble::{MapError, MapVersion, MapWriter, NibbleMap};

/// The README's examples, run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's Rust chapters, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/heap.md")]
pub struct GuideHeap;

/// The agent's chapter uses the flame graph, pprof and endpoint features.
#[cfg(all(doctest, feature = "export", feature = "serve"))]
#[doc = include_str!("../docs/guide/agent.md")]
pub struct GuideAgent;
