//! What the module's own calls can refuse. The `Module` trait's methods keep
//! Cranelift's `ModuleError`; `finalize_definitions`, `redefine_function` and
//! `free_function` answer this type, which converts from both layers with `?`.

use std::fmt;

use cranelift_codegen::binemit::Reloc;
use cranelift_module::ModuleError;
use jitmap::HeapError;
use jitmap::manager::ManagerError;

/// A refused call; the module is unchanged and stays usable.
#[derive(Debug)]
#[non_exhaustive]
pub enum JitError {
    /// Cranelift refused (compilation, an undeclared id, an incompatible
    /// signature, a duplicate definition). Boxed: Cranelift's error is large.
    Module(Box<ModuleError>),
    /// The code heap refused (full, a bad size).
    Heap(HeapError),
    /// The manager refused the heap.
    Manager(ManagerError),
    /// A relocation names a symbol that no definition, host symbol or
    /// `dlsym` provides.
    UnknownSymbol(String),
    /// A relocation names a function of this module that has no definition.
    Undefined(String),
    /// `free_function` or `redefine_function` of a function that has no
    /// definition (never defined, or freed already), or `cancel_data` of a
    /// data object with no definition since the last finalize.
    NotDefined(String),
    /// `redefine_function`, `free_function`, or a `finalize_definitions`
    /// that would free a replaced version, while no thread is registered
    /// as an executor with the module's manager: nothing would keep the
    /// freed bytes from reuse while a thread still runs them. Register
    /// every thread that runs the module's code
    /// (`module.manager().register_executor()`) and declare its quiescent
    /// points; the module is unchanged.
    NoExecutor(String),
    /// A relocation this module does not apply (or one whose target is out
    /// of its reach).
    Relocation {
        /// The relocation's kind.
        kind: Reloc,
        /// What it refers to.
        target: String,
    },
    /// The module's code heap must span at most 2 GiB, so that every call
    /// between its functions reaches with a 32-bit displacement.
    HeapTooLarge {
        /// The span asked for.
        span: u64,
    },
    /// The host is not x86-64 (the trampolines and relocations are x86-64's).
    UnsupportedArch,
}

impl fmt::Display for JitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Module(e) => write!(f, "{e}"),
            Self::Heap(e) => write!(f, "{e}"),
            Self::Manager(e) => write!(f, "{e}"),
            Self::UnknownSymbol(name) => write!(f, "no definition of symbol {name}"),
            Self::Undefined(name) => write!(f, "function {name} is declared but not defined"),
            Self::NotDefined(name) => write!(f, "{name} has no definition to drop or replace"),
            Self::NoExecutor(name) => write!(
                f,
                "freeing a version of {name} needs an executor: register every thread that runs the module's code with `manager.register_executor()` and declare its quiescent points"
            ),
            Self::Relocation { kind, target } => {
                write!(f, "cannot apply a {kind:?} relocation to {target}")
            }
            Self::HeapTooLarge { span } => {
                write!(f, "a heap of {span} bytes is over the module's 2 GiB limit")
            }
            Self::UnsupportedArch => f.write_str("jitmap-cranelift emits x86-64 code only"),
        }
    }
}

/// Each wrapper shows its inner error's message, so its source is the inner
/// error's own source.
impl std::error::Error for JitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Module(e) => e.source(),
            Self::Heap(e) => e.source(),
            Self::Manager(e) => e.source(),
            _ => None,
        }
    }
}

impl From<ModuleError> for JitError {
    fn from(e: ModuleError) -> Self {
        Self::Module(Box::new(e))
    }
}

impl From<HeapError> for JitError {
    fn from(e: HeapError) -> Self {
        Self::Heap(e)
    }
}

impl From<ManagerError> for JitError {
    fn from(e: ManagerError) -> Self {
        Self::Manager(e)
    }
}
