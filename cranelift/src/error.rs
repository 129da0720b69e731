//! What the module's own calls can refuse. The `Module` trait's methods keep
//! Cranelift's `ModuleError`, and so does `finalize_definitions`, as on
//! cranelift-jit; `finalize_jit`, `redefine_function` and `free_function` answer
//! this type, which converts from both layers with `?`. The two convert
//! into each other without loss: a `JitError` that is not Cranelift's own
//! travels as `ModuleError::Backend`, and comes back out whole.

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
    /// `redefine_function`, `free_function`, or a finalize that would free
    /// a replaced version, while no thread was ever registered as an
    /// executor with the module's manager: nothing would keep the freed
    /// bytes from reuse while a thread still runs them. Register every
    /// thread that runs the module's code
    /// (`module.manager().register_executor()`) and declare its quiescent
    /// points; the module is unchanged. (A host whose executors have all
    /// been dropped may free: no registered thread runs its code.)
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
    /// Cranelift has no backend for the host (`cranelift_native` refused it).
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
            Self::UnsupportedArch => f.write_str(
                "Cranelift has no backend for this host (jitmap-cranelift runs on x86-64 and aarch64)",
            ),
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
    /// Cranelift's error, or a `JitError` that travelled inside one.
    fn from(e: ModuleError) -> Self {
        match e {
            ModuleError::Backend(inner) => match inner.downcast::<JitError>() {
                Ok(jit) => jit,
                Err(other) => Self::Module(Box::new(ModuleError::Backend(other))),
            },
            e => Self::Module(Box::new(e)),
        }
    }
}

impl From<JitError> for ModuleError {
    /// Cranelift's own error as it was; any other as `ModuleError::Backend`,
    /// from which `JitError::from` takes it back out.
    ///
    /// ```
    /// use cranelift_module::ModuleError;
    /// use jitmap_cranelift::JitError;
    ///
    /// let e = ModuleError::from(JitError::NotDefined("f".into()));
    /// assert_eq!(e.to_string(), "Backend error: f has no definition to drop or replace");
    /// assert!(matches!(JitError::from(e), JitError::NotDefined(n) if n == "f"));
    /// ```
    fn from(e: JitError) -> Self {
        match e {
            JitError::Module(e) => *e,
            e => ModuleError::Backend(anyhow::Error::new(e)),
        }
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
