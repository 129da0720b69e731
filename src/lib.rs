#![doc = include_str!("../README.md")]

#[cfg(loom)]
pub mod defect;
pub mod epoch;
#[cfg(not(loom))]
pub mod events;
#[cfg(not(loom))]
pub mod heap;
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
pub mod sync;
pub mod words;

pub use epoch::{Domain, EpochError, ForeignGuard, Guard, Reader};
#[cfg(not(loom))]
pub use heap::{CodeHeap, CodeRef, HeapConfig, HeapError, MemoryMode, Reservation};
#[cfg(not(loom))]
pub use info::{CodeInfo, JitKind};
#[cfg(not(loom))]
pub use manager::{CodeBlock, ExecutionManager, HeapSection, Lookup, ManagedHeap};
pub use nibble::{MapError, MapVersion, MapWriter, NibbleMap};
