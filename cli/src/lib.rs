//! The `jitmap` command's library half: what a user points at a real JIT
//! host, from outside its process.
//!
//! - [`inspect`]: resolve addresses and list the live methods of a running
//!   jitmap host, or of a .NET 8 runtime, through bounded remote reads;
//! - `ebpf` (feature `ebpf`): a profiler that resolves every frame in the
//!   kernel; its C program, `src/ebpf/profile.bpf.c`, sits beside its loader;
//! - [`jitdump`]: a jitdump file checked the way perf reads it, as text.
//!
//! The option types and exit codes it shares with `jitmap-sim` are the
//! `jitmap-args` crate's.

#[cfg(feature = "ebpf")]
pub mod ebpf;
pub mod inspect;
pub mod jitdump;
