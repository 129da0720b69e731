//! A `cranelift_module::Module` whose functions live in jitmap code heaps:
//! what a Cranelift user adds in place of `cranelift-jit` to free or redefine
//! one function while threads run it, and to have every function looked up
//! exactly, profiled and unwound.
//!
//! - **Porting** from cranelift-jit changes the constructor:
//!   `JITBuilder::new(libcalls)` becomes `JitmapBuilder::new(&manager,
//!   libcalls)`, `JITModule::new(builder)` becomes `JitmapModule::new(builder)?`.
//!   Declare, define, `finalize_definitions` (answering `ModuleResult`),
//!   `get_finalized_function`, `get_address` and `free_memory` work as
//!   there, with every linkage upgrade cranelift-jit accepts (a function
//!   declared first as an import, then defined) and a body whose signature
//!   differs from its declaration. The guide lists each intended difference.
//! - **Every thread that runs the module's code is an executor.** A
//!   redefinition or a free gives the old version's bytes back once every
//!   registered executor has passed a quiescent point; a thread that is not
//!   registered is not waited for. So each such thread calls
//!   `module.manager().register_executor()` once and
//!   [`jitmap::Executor::quiescent`] between its calls into the module (or
//!   goes `offline` while it runs none). For a host that never registered
//!   an executor, [`JitmapModule::redefine_function`],
//!   [`JitmapModule::free_function`] and a finalize that would free a
//!   version refuse with [`JitError::NoExecutor`]; once its executors have
//!   all been dropped (its threads finished), they go through. A port that
//!   only defines (as cranelift-jit does) needs none.
//! - **Calls go through one indirection per function.** Every definable
//!   function has a trampoline in the heap (`jmp [cell]`), and callers (the
//!   module's code, data that holds function addresses, and the host) reach
//!   it there. [`JitmapModule::redefine_function`] publishes a new version
//!   and switches the cell with one Release store: nothing is patched, frames
//!   still running the old version finish in it, and the old version is
//!   freed like any jitmap block, its bytes reused only after every executor
//!   has passed a quiescent point. [`JitmapModule::free_function`] points the
//!   cell at a trap: calling a freed function ends the process with a
//!   message, never runs reused bytes.
//! - **Code becomes callable one way**: reserve → write → relocate → publish,
//!   in `finalize_definitions`. Compiling takes no heap lock. Data objects
//!   live in ordinary memory, never in the code heap.
//! - **What jitmap adds to each function**: a `CodeInfo` with its declared
//!   name, its `.eh_frame` from Cranelift's own unwind information
//!   (registered with the system unwinder, so a panic unwinds through
//!   Cranelift frames; carried into jitdump), source rows where the host
//!   gives source locations ([`JitmapModule::set_source_file`]), perf map and
//!   jitdump records when the manager has perf output on, and the GDB JIT
//!   interface when the heap asks for it (feature `gdb-jit`). Frame pointers
//!   are kept by default, so the agent's walk sees every Cranelift frame.
//!
//! x86-64 and aarch64: the trampolines and the relocations of each are in
//! one file per architecture; on aarch64, a call farther than a branch
//! reaches goes through a veneer after the function's code.
//!
//! ```
//! # {
//! use cranelift_codegen::ir::{AbiParam, InstBuilder, types};
//! use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
//! use cranelift_module::{Linkage, Module, default_libcall_names};
//! use jitmap::ExecutionManager;
//! use jitmap_cranelift::{JitmapBuilder, JitmapModule};
//!
//! let manager = ExecutionManager::new(8);
//! let mut module = JitmapModule::new(JitmapBuilder::new(&manager, default_libcall_names())?)?;
//! let mut sig = module.make_signature();
//! sig.returns.push(AbiParam::new(types::I64));
//! let answer = module.declare_function("answer", Linkage::Export, &sig)?;
//!
//! // A body that returns `value`.
//! let body = |module: &JitmapModule, value: i64| {
//!     let mut ctx = module.make_context();
//!     ctx.func.signature = sig.clone();
//!     let mut fctx = FunctionBuilderContext::new();
//!     let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
//!     let block = b.create_block();
//!     b.switch_to_block(block);
//!     let v = b.ins().iconst(types::I64, value);
//!     b.ins().return_(&[v]);
//!     b.seal_all_blocks();
//!     b.finalize(module.target_config());
//!     ctx
//! };
//!
//! // Define and call.
//! module.define_function(answer, &mut body(&module, 41))?;
//! module.finalize_definitions()?;
//! // SAFETY: `answer` was defined with the signature `fn() -> i64`.
//! let f: extern "C" fn() -> i64 = unsafe { std::mem::transmute(module.get_finalized_function(answer)) };
//! assert_eq!(f(), 41);
//!
//! // Redefine: the same pointer now reaches the new version. The thread
//! // that calls the module's code is its executor.
//! let executor = module.manager().register_executor()?;
//! module.redefine_function(answer, &mut body(&module, 42))?;
//! module.finalize_definitions()?;
//! assert_eq!(f(), 42);
//!
//! // Free: the code goes back to the heap once executors allow it.
//! executor.quiescent(); // no frame of the module's code on this thread
//! module.free_function(answer)?;
//! assert!(module.function_code(answer).is_none());
//! assert!(module.free_function(answer).is_err()); // twice is a typed error
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod arch;
mod builder;
mod data;
mod error;
mod module;
mod reloc;
mod stub;
mod tiers;
mod unwind;

/// The guide's Cranelift chapter, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide/cranelift.md")]
pub struct GuideCranelift;

pub use builder::JitmapBuilder;
pub use error::JitError;
pub use module::{JitmapModule, STUB_OWNER, TRAMPOLINE};

/// The size in bytes of the trampoline every definable function is called
/// through (a stub block of kind [`TRAMPOLINE`]).
pub const TRAMPOLINE_BYTES: usize = arch::TRAMPOLINE_LEN;
