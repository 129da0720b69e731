//! How a `JitmapModule` is made: the target, the manager and heap its code
//! goes to, and the symbols its code may call. Shaped like cranelift-jit's
//! `JITBuilder`, so that a port changes a constructor.

use std::collections::HashMap;

use cranelift_codegen::ir::LibCall;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use jitmap::{ExecutionManager, HeapConfig};

use crate::JitError;

/// A symbol lookup the host adds ([`JitmapBuilder::symbol_lookup_fn`]).
pub(crate) type SymbolLookup = Box<dyn Fn(&str) -> Option<*const u8> + Send>;

/// A libcall's symbol name.
pub(crate) type LibcallNames = Box<dyn Fn(LibCall) -> String + Send + Sync>;

/// Builds a [`crate::JitmapModule`].
///
/// ```
/// use jitmap::ExecutionManager;
/// use jitmap_cranelift::{JitmapBuilder, JitmapModule};
///
/// let manager = ExecutionManager::new(8);
/// let builder = JitmapBuilder::new(&manager, cranelift_module::default_libcall_names())?;
/// let module = JitmapModule::new(builder)?;
/// assert_eq!(module.heap().manager().heaps().len(), 1);
/// # Ok::<(), jitmap_cranelift::JitError>(())
/// ```
pub struct JitmapBuilder {
    pub(crate) isa: OwnedTargetIsa,
    pub(crate) manager: ExecutionManager,
    pub(crate) heap: HeapConfig,
    pub(crate) symbols: HashMap<String, usize>,
    pub(crate) lookups: Vec<SymbolLookup>,
    pub(crate) libcall_names: LibcallNames,
}

impl JitmapBuilder {
    /// The host's ISA with Cranelift's default flags, and what the module
    /// needs: `preserve_frame_pointers` (so the agent's frame-pointer walk
    /// sees every Cranelift frame), `unwind_info`, no PIC, and libcalls
    /// called through absolute addresses.
    pub fn new(manager: &ExecutionManager, libcall_names: LibcallNames) -> Result<Self, JitError> {
        Self::with_flags(manager, &[], libcall_names)
    }

    /// [`JitmapBuilder::new`] with Cranelift `flags` set after the module's
    /// own, so a host may override any, `preserve_frame_pointers` included:
    /// without frame pointers the agent's frame-pointer walk cannot step
    /// over a Cranelift frame, so a sample in one loses its callers (the
    /// system unwinder still walks them, from the registered `.eh_frame`).
    pub fn with_flags(
        manager: &ExecutionManager,
        flags: &[(&str, &str)],
        libcall_names: LibcallNames,
    ) -> Result<Self, JitError> {
        let mut builder = settings::builder();
        let own = [
            ("preserve_frame_pointers", "true"),
            ("unwind_info", "true"),
            ("is_pic", "false"),
            ("use_colocated_libcalls", "false"),
        ];
        for (name, value) in own.iter().chain(flags) {
            builder
                .set(name, value)
                .map_err(|e| JitError::from(cranelift_module::ModuleError::from(e)))?;
        }
        let isa = cranelift_native::builder()
            .map_err(|_| JitError::UnsupportedArch)?
            .finish(settings::Flags::new(builder))
            .map_err(|e| JitError::from(cranelift_module::ModuleError::from(e)))?;
        Ok(Self::with_isa(manager, isa, libcall_names))
    }

    /// A builder for `isa`, as it is.
    pub fn with_isa(
        manager: &ExecutionManager,
        isa: OwnedTargetIsa,
        libcall_names: LibcallNames,
    ) -> Self {
        Self {
            isa,
            manager: manager.clone(),
            heap: HeapConfig {
                span: 64 << 20,
                align: 32,
                register_unwind: true,
                ..HeapConfig::default()
            },
            symbols: HashMap::new(),
            lookups: Vec::new(),
            libcall_names,
        }
    }

    /// The code heap's configuration. Defaults: 64 MiB, 32-byte alignment,
    /// RWX, the map version's default, and every function's `.eh_frame`
    /// registered with the system unwinder. The span may be at most 2 GiB.
    pub fn heap_config(&mut self, config: HeapConfig) -> &mut Self {
        self.heap = config;
        self
    }

    /// Defines `name` as `ptr` for the module's code: host functions and data
    /// that declared-but-imported symbols resolve to. A later definition of
    /// the same name wins.
    pub fn symbol(&mut self, name: impl Into<String>, ptr: *const u8) -> &mut Self {
        self.symbols.insert(name.into(), ptr.addr());
        self
    }

    /// [`JitmapBuilder::symbol`] for each pair.
    pub fn symbols<K: Into<String>>(
        &mut self,
        symbols: impl IntoIterator<Item = (K, *const u8)>,
    ) -> &mut Self {
        for (name, ptr) in symbols {
            self.symbol(name, ptr);
        }
        self
    }

    /// Adds a lookup tried, last added first, for a name the symbol table
    /// does not hold, before `dlsym`.
    pub fn symbol_lookup_fn(&mut self, lookup: SymbolLookup) -> &mut Self {
        self.lookups.push(lookup);
        self
    }
}
