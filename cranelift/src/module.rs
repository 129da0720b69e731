//! `JitmapModule`: a `cranelift_module::Module` whose functions live in a
//! jitmap code heap, each callable through a trampoline and a call cell, so
//! that one function can be redefined or freed while the others, and the
//! threads running it, go on.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;

use cranelift_codegen::ir::{self, LibCall};
use cranelift_codegen::isa::unwind::UnwindInfo;
use cranelift_codegen::isa::{OwnedTargetIsa, TargetIsa};
use cranelift_codegen::{Context, settings};
use cranelift_control::ControlPlane;
use cranelift_module::{
    DataDescription, DataId, FuncId, Init, Linkage, Module, ModuleDeclarations, ModuleError,
    ModuleReloc, ModuleRelocTarget, ModuleResult,
};
use jitmap::heap::{DebugEntry, EhFrame, StubKind};
use jitmap::{
    CallCell, CodeAddress, CodeInfo, CodeRef, ExecutionManager, JitKind, ManagerError, OwnedHeap,
    Reservation, StubKindName,
};

use crate::builder::{JitmapBuilder, LibcallNames, SymbolLookup};
use crate::data::DataMemory;
use crate::{JitError, reloc, stub, tiers, unwind};

/// The stub kind of the module's trampolines, as lookups report them. The
/// module names it ([`STUB_OWNER`], "trampoline") and declares it frameless to
/// its manager ([`jitmap::ExecutionManager::declare_frameless_stub`]), so a
/// host that shares the manager should not use kind 1 for its own stubs:
/// a module made on a manager that named kind 1 otherwise fails with
/// [`jitmap::ManagerError::StubKindNamed`].
pub const TRAMPOLINE: StubKind = match StubKind::new(1) {
    Some(kind) => kind,
    None => unreachable!(),
};

/// The owner the module's stub kind is named with
/// ([`jitmap::ExecutionManager::name_stub_kind`]): listings and profiles show
/// its trampolines as `trampoline (jitmap-cranelift)`.
pub const STUB_OWNER: &str = "jitmap-cranelift";

/// The largest heap span: calls between the module's functions use 32-bit
/// displacements.
const MAX_SPAN: u64 = 2 << 30;

/// A function compiled and waiting for `finalize_definitions`.
struct Compiled {
    bytes: Vec<u8>,
    relocs: Vec<ModuleReloc>,
    unwind: Option<UnwindInfo>,
    /// Source rows: offset in the code, line (the source location's bits).
    rows: Vec<(u32, u32)>,
    /// Baseline or optimized: the optimization level it was compiled at.
    kind: JitKind,
    /// The start's alignment the code needs (its constant pool's, or what
    /// `define_function_bytes` was given); the heap's own may be larger.
    align: u64,
}

/// What the module keeps per declared function.
struct Function {
    /// The current entry: the live version, or `stub::undefined_function`.
    /// Boxed, so the trampoline's absolute address of it stays valid. A
    /// [`CodeAddress`] cell: only the trampoline jumps through it.
    cell: Box<CallCell<CodeAddress>>,
    /// The trampoline callers reach the function at (definable functions).
    trampoline: Option<CodeRef>,
    /// The version the cell points at.
    live: Option<CodeRef>,
    /// A definition compiled since the last finalize.
    pending: Option<Compiled>,
    /// The file the function's source locations are lines of.
    source_file: Option<Arc<str>>,
    /// The method id its versions are published with (default: the FuncId).
    method_id: u64,
    /// The signature of its first definition, which a redefinition keeps
    /// (callers reach every version through the same trampoline). Set by a
    /// definition, cleared when the function is freed.
    signature: Option<ir::Signature>,
}

/// A data object: its memory (ordinary memory, never the code heap) and the
/// relocations still to write into it.
struct Data {
    memory: DataMemory,
    relocs: Vec<ModuleReloc>,
}

/// A Cranelift module on a jitmap heap. Made by [`JitmapModule::new`]; used
/// like cranelift-jit's `JITModule` (declare, define, `finalize_definitions`,
/// `get_finalized_function`), plus [`JitmapModule::redefine_function`] and
/// [`JitmapModule::free_function`]. See the crate docs for an example.
pub struct JitmapModule {
    /// What functions are compiled with now ([`JitmapModule::set_opt_level`]).
    isa: OwnedTargetIsa,
    /// The builder's ISA and the ones made from it at other levels.
    levels: Vec<OwnedTargetIsa>,
    declarations: ModuleDeclarations,
    heap: OwnedHeap,
    /// The heap's default alignment: no function starts on less.
    heap_align: u64,
    symbols: HashMap<String, usize>,
    lookups: Vec<SymbolLookup>,
    libcall_names: LibcallNames,
    functions: Vec<Function>,
    data: Vec<Option<Data>>,
    pending_functions: Vec<FuncId>,
    pending_data: Vec<DataId>,
}

impl JitmapModule {
    /// A module whose code goes to a new heap of the builder's manager.
    pub fn new(builder: JitmapBuilder) -> Result<Self, JitError> {
        if builder.heap.span > MAX_SPAN {
            return Err(JitError::HeapTooLarge {
                span: builder.heap.span,
            });
        }
        let heap_align = builder.heap.align;
        // Listings and profiles name the trampolines. Checked before the
        // heap is made, so that a refusal changes nothing; naming again
        // with the same name is nothing, so a manager shared by several
        // modules is named once.
        let trampoline = StubKindName::new(STUB_OWNER, "trampoline")?;
        if builder
            .manager
            .stub_kind_name(TRAMPOLINE)
            .is_some_and(|name| name != trampoline)
        {
            return Err(ManagerError::StubKindNamed { kind: TRAMPOLINE }.into());
        }
        let heap = builder.manager.create_heap(builder.heap)?;
        builder.manager.name_stub_kind(TRAMPOLINE, trampoline)?;
        // The trampolines jump on without a frame: a walker that catches a
        // thread in one finds its caller's return address on top of the stack.
        builder.manager.declare_frameless_stub(TRAMPOLINE);
        Ok(Self {
            heap_align,
            levels: vec![builder.isa.clone()],
            isa: builder.isa,
            declarations: ModuleDeclarations::default(),
            heap,
            symbols: builder.symbols,
            lookups: builder.lookups,
            libcall_names: builder.libcall_names,
            functions: Vec::new(),
            data: Vec::new(),
            pending_functions: Vec::new(),
            pending_data: Vec::new(),
        })
    }

    /// The heap the module's code lives in.
    pub fn heap(&self) -> &OwnedHeap {
        &self.heap
    }

    /// The manager of the module's heap: register executors and readers
    /// with it, and hand it to the agent.
    pub fn manager(&self) -> &ExecutionManager {
        self.heap.manager()
    }

    /// Defines `name` as `ptr` for relocations finalized from now on (see
    /// [`JitmapBuilder::symbol`]).
    pub fn symbol(&mut self, name: impl Into<String>, ptr: *const u8) {
        self.symbols.insert(name.into(), ptr.addr());
    }

    /// Says that the source locations of `func`'s instructions
    /// (`FunctionBuilder::set_srcloc`) are line numbers of `file`: its code
    /// then carries debug rows, which jitdump, perf and gdb show.
    pub fn set_source_file(&mut self, func: FuncId, file: &str) -> Result<(), JitError> {
        self.function_mut(func)?.source_file = Some(file.into());
        Ok(())
    }

    /// The address callers reach `func` at: its trampoline, which stays valid
    /// across redefinitions and frees (a call to a freed or never defined
    /// function ends the process with a message). For an import, the symbol
    /// it resolves to; null if it resolves to nothing.
    pub fn get_finalized_function(&self, func: FuncId) -> *const u8 {
        match self.functions.get(func.as_u32() as usize) {
            Some(Function {
                trampoline: Some(t),
                ..
            }) => std::ptr::without_provenance(t.start()),
            Some(_) => {
                let name = &self.declarations.get_function_decl(func).name;
                let address = name.as_deref().and_then(|n| self.lookup_symbol(n));
                std::ptr::without_provenance(address.unwrap_or(0))
            }
            None => std::ptr::null(),
        }
    }

    /// The address a relocation target resolves to, as cranelift-jit's
    /// `get_address` answers it: a function of this module, its trampoline
    /// (a function offset, its live version's start plus the offset); a
    /// data object, its memory; anything else, its symbol. Where
    /// cranelift-jit panics (a name no symbol resolves), this is null.
    pub fn get_address(&self, name: &ModuleRelocTarget) -> *const u8 {
        let address = match *name {
            ModuleRelocTarget::FunctionOffset(func, offset) => self
                .function_code(func)
                .map(|code| code.start() + offset as usize),
            _ => self.resolve(name, None).ok(),
        };
        std::ptr::without_provenance(address.unwrap_or(0))
    }

    /// Frees the module's code and data, as cranelift-jit's `free_memory`
    /// does, by dropping the module: its heap and every function and data
    /// object go, and their memory is reused once every reader has unpinned
    /// and every executor has passed a quiescent point.
    ///
    /// # Safety
    /// cranelift-jit's contract, kept so that a port's call compiles as it
    /// is: no function pointer from this module is called afterwards (a
    /// call then reaches unmapped or reused memory). Threads still inside
    /// the module's code when it is freed are safe here, where they are not
    /// on cranelift-jit, provided they are registered executors.
    ///
    /// ```
    /// use cranelift_module::default_libcall_names;
    /// use jitmap_cranelift::{JitmapBuilder, JitmapModule};
    ///
    /// let manager = jitmap::ExecutionManager::new(2);
    /// let module = JitmapModule::new(JitmapBuilder::new(&manager, default_libcall_names())?)?;
    /// // SAFETY: nothing from the module is called afterwards.
    /// unsafe { module.free_memory() };
    /// assert_eq!(manager.heaps().len(), 0);
    /// # Ok::<(), jitmap_cranelift::JitError>(())
    /// ```
    pub unsafe fn free_memory(self) {
        drop(self);
    }

    /// A defined data object's address and size, or null and 0.
    pub fn get_finalized_data(&self, data: DataId) -> (*const u8, usize) {
        match self.data.get(data.as_u32() as usize) {
            Some(Some(d)) => (d.memory.as_ptr(), d.memory.len()),
            _ => (std::ptr::null(), 0),
        }
    }

    /// The live version of `func` (its current code), if it has one.
    pub fn function_code(&self, func: FuncId) -> Option<CodeRef> {
        self.functions.get(func.as_u32() as usize)?.live
    }

    /// Compiles the functions defined or redefined from now on at `level`,
    /// every other flag unchanged: a tiered JIT defines a function at
    /// `none` for a fast first version, then redefines it at `speed` once
    /// it runs hot. Each version is published as [`JitKind::Baseline`]
    /// (`none`) or [`JitKind::Optimized`], which lookups and profiles
    /// report. [`Module::isa`] answers the current level's ISA.
    ///
    /// ```
    /// use cranelift_codegen::settings::OptLevel;
    /// use cranelift_module::Module;
    /// use jitmap_cranelift::{JitmapBuilder, JitmapModule};
    ///
    /// let manager = jitmap::ExecutionManager::new(8);
    /// let builder = JitmapBuilder::new(&manager, cranelift_module::default_libcall_names())?;
    /// let mut module = JitmapModule::new(builder)?;
    /// module.set_opt_level(OptLevel::Speed)?;
    /// assert_eq!(module.isa().flags().opt_level(), OptLevel::Speed);
    /// # Ok::<(), jitmap_cranelift::JitError>(())
    /// ```
    pub fn set_opt_level(&mut self, level: settings::OptLevel) -> Result<(), JitError> {
        if let Some(isa) = self.levels.iter().find(|i| i.flags().opt_level() == level) {
            self.isa = isa.clone();
            return Ok(());
        }
        let isa = tiers::at_level(&*self.levels[0], level)?;
        self.levels.push(isa.clone());
        self.isa = isa;
        Ok(())
    }

    /// Publishes `func`'s versions finalized from now on with `id` as their
    /// method id, the one lookups, samples, perf maps and jitdump report: the
    /// host's own handle of the method (a descriptor's address, a version
    /// counter) in place of the default, the function's `FuncId`.
    pub fn set_method_id(&mut self, func: FuncId, id: u64) -> Result<(), JitError> {
        self.check_definable(func)?;
        self.functions[func.as_u32() as usize].method_id = id;
        Ok(())
    }

    /// Drops the definition of `func` compiled since the last finalize, and
    /// nothing else: its live version, if it has one, stays live and called.
    /// What a host does when `finalize_definitions` refused (an unknown
    /// symbol, a full heap) and it gives up on this compilation. With no
    /// pending definition it is [`JitError::NotDefined`] and changes nothing.
    pub fn cancel_definition(&mut self, func: FuncId) -> Result<(), JitError> {
        self.check_definable(func)?;
        let f = &mut self.functions[func.as_u32() as usize];
        if f.pending.take().is_none() {
            return Err(JitError::NotDefined(self.name_of(func)));
        }
        if f.live.is_none() {
            // Undefined again: a new first definition sets the signature.
            f.signature = None;
        }
        self.pending_functions.retain(|&p| p != func);
        Ok(())
    }

    /// Drops the definition of `data` made since the last finalize, so that
    /// it may be defined again: what a host does when `finalize_definitions`
    /// refused one of its relocations (one that falls outside the object,
    /// say). A data object already finalized, or never defined, is
    /// [`JitError::NotDefined`], and nothing changes.
    ///
    /// ```
    /// use cranelift_module::{DataDescription, Linkage, Module, default_libcall_names};
    /// use jitmap_cranelift::{JitError, JitmapBuilder, JitmapModule};
    ///
    /// let manager = jitmap::ExecutionManager::new(2);
    /// let mut module = JitmapModule::new(JitmapBuilder::new(&manager, default_libcall_names())?)?;
    /// let data = module.declare_data("table", Linkage::Local, false, false)?;
    /// let mut description = DataDescription::new();
    /// description.define_zeroinit(8);
    /// module.define_data(data, &description)?;
    /// module.cancel_data(data)?;
    /// assert!(matches!(module.cancel_data(data), Err(JitError::NotDefined(_))));
    /// module.define_data(data, &description)?; // defined afresh
    /// module.finalize_definitions()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel_data(&mut self, data: DataId) -> Result<(), JitError> {
        if !self.pending_data.contains(&data) {
            let name = match self.data.get(data.as_u32() as usize) {
                Some(_) => self
                    .declarations
                    .get_data_decl(data)
                    .linkage_name(data)
                    .into_owned(),
                None => return Err(ModuleError::Undeclared(format!("{data}")).into()),
            };
            return Err(JitError::NotDefined(name));
        }
        self.pending_data.retain(|&p| p != data);
        self.data[data.as_u32() as usize] = None;
        Ok(())
    }

    /// Refuses to free a version of `func` for a host that never registered
    /// an executor: nothing would keep its bytes from reuse while a thread
    /// it never declared still runs them. A host that registered executors
    /// and has dropped them all may free: every thread it declared as
    /// running the module's code has finished.
    fn check_executors(&self, func: FuncId) -> Result<(), JitError> {
        if self.manager().domain().executors_ever() == 0 {
            return Err(JitError::NoExecutor(self.name_of(func)));
        }
        Ok(())
    }

    /// Compiles a new body for `func`, which has a definition (finalized or
    /// pending) of the same signature as this body (that definition's body's,
    /// not necessarily the declaration's). `finalize_definitions` publishes it,
    /// switches the function's call cell to it with one Release store, and
    /// frees the old version: its bytes are reused once every executor has
    /// passed a quiescent point, so a thread still running it finishes there.
    /// Compiling takes no heap lock.
    pub fn redefine_function(&mut self, func: FuncId, ctx: &mut Context) -> Result<(), JitError> {
        self.check_definable(func)?;
        let name = self.name_of(func);
        let f = &self.functions[func.as_u32() as usize];
        if f.live.is_none() && f.pending.is_none() {
            return Err(JitError::NotDefined(name));
        }
        let replaces = f.live.is_some();
        self.check_signature(func, &ctx.func.signature)?;
        if replaces {
            self.check_executors(func)?;
        }
        let compiled = self.compile(func, ctx, &mut ControlPlane::default())?;
        let f = &mut self.functions[func.as_u32() as usize];
        if f.pending.replace(compiled).is_none() {
            self.pending_functions.push(func);
        }
        Ok(())
    }

    /// Frees `func`'s live version (and drops a pending definition): its
    /// cell points at the trap from now on, and its bytes are reused once
    /// every executor has passed a quiescent point. The function may be
    /// defined again. Freeing a function with no definition is
    /// [`JitError::NotDefined`], and changes nothing.
    pub fn free_function(&mut self, func: FuncId) -> Result<(), JitError> {
        self.check_definable(func)?;
        let name = self.name_of(func);
        let f = &self.functions[func.as_u32() as usize];
        if f.live.is_none() && f.pending.is_none() {
            return Err(JitError::NotDefined(name));
        }
        if f.live.is_some() {
            self.check_executors(func)?;
        }
        let f = &mut self.functions[func.as_u32() as usize];
        f.signature = None;
        if f.pending.take().is_some() {
            self.pending_functions.retain(|&p| p != func);
        }
        if let Some(live) = f.live.take() {
            // `set` is a Release store: callers that load the trap no longer
            // enter the old code.
            f.cell.set(stub::trap());
            self.heap.free(live)?;
        }
        Ok(())
    }

    /// Publishes every function and data object defined since the last
    /// call: each function is reserved in the heap, written, relocated at its
    /// final address and only then published, with its name, its unwind
    /// table (registered with the system unwinder) and its source rows; then
    /// its call cell switches to it and a version it replaces is freed. On an
    /// error (an unknown symbol, a full heap) nothing is published and every
    /// definition stays pending, so the host may fix the cause (for example
    /// with [`JitmapModule::symbol`]) and call it again.
    ///
    /// Answers Cranelift's `ModuleResult`, as cranelift-jit's does, so that a
    /// front end's `?` converts it as before; a refusal that is not
    /// Cranelift's own is `ModuleError::Backend`, from which
    /// `JitError::from` takes the [`JitError`] back out.
    /// [`JitmapModule::finalize_jit`] answers the `JitError` directly.
    #[expect(clippy::result_large_err, reason = "cranelift-jit's own signature")]
    pub fn finalize_definitions(&mut self) -> ModuleResult<()> {
        Ok(self.finalize_jit()?)
    }

    /// [`JitmapModule::finalize_definitions`], answering a [`JitError`].
    ///
    /// ```
    /// use cranelift_module::{Linkage, Module, default_libcall_names};
    /// use jitmap_cranelift::{JitError, JitmapBuilder, JitmapModule};
    ///
    /// let manager = jitmap::ExecutionManager::new(2);
    /// let mut module = JitmapModule::new(JitmapBuilder::new(&manager, default_libcall_names())?)?;
    /// let missing = module.declare_function("jitmap_doc_missing", Linkage::Import, &module.make_signature())?;
    /// let f = module.declare_function("f", Linkage::Local, &module.make_signature())?;
    /// let mut ctx = module.make_context();
    /// let mut fctx = cranelift_frontend::FunctionBuilderContext::new();
    /// let mut b = cranelift_frontend::FunctionBuilder::new(&mut ctx.func, &mut fctx);
    /// let block = b.create_block();
    /// b.switch_to_block(block);
    /// let callee = module.declare_func_in_func(missing, b.func);
    /// cranelift_codegen::ir::InstBuilder::call(b.ins(), callee, &[]);
    /// cranelift_codegen::ir::InstBuilder::return_(b.ins(), &[]);
    /// b.seal_all_blocks();
    /// b.finalize(module.target_config());
    /// module.define_function(f, &mut ctx)?;
    /// assert!(matches!(module.finalize_jit(), Err(JitError::UnknownSymbol(n)) if n == "jitmap_doc_missing"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn finalize_jit(&mut self) -> Result<(), JitError> {
        // A redefinition frees the version it replaces.
        for &func in &self.pending_functions {
            if self.functions[func.as_u32() as usize].live.is_some() {
                self.check_executors(func)?;
            }
        }
        // Every data object is relocated, into a copy, before any code is
        // published: a refused relocation then leaves nothing behind.
        let mut data_bytes = Vec::with_capacity(self.pending_data.len());
        for &data in &self.pending_data {
            let d = self.data[data.as_u32() as usize]
                .as_ref()
                .ok_or_else(|| JitError::from(ModuleError::Undeclared(format!("{data}"))))?;
            let mut bytes = d.memory.bytes();
            let end = bytes.len();
            reloc::apply(&mut bytes, d.memory.as_ptr().addr(), end, &d.relocs, |t| {
                self.resolve(t, None)
            })?;
            data_bytes.push(bytes);
        }
        let mut reserved: Vec<(FuncId, Reservation<'_>)> = Vec::new();
        for &func in &self.pending_functions {
            let f = &self.functions[func.as_u32() as usize];
            let compiled = f
                .pending
                .as_ref()
                .ok_or_else(|| JitError::NotDefined(self.name_of(func)))?;
            let align = compiled.align.max(self.heap_align);
            let size = (compiled.bytes.len() + reloc::veneer_room(&compiled.relocs)).max(1) as u64;
            reserved.push((func, self.heap.reserve_aligned(size, align)?));
        }
        let mut infos = Vec::with_capacity(reserved.len());
        for (func, r) in &mut reserved {
            let f = &self.functions[func.as_u32() as usize];
            let Some(compiled) = f.pending.as_ref() else {
                continue;
            };
            let base = r.address();
            let code = r.code_mut();
            code[..compiled.bytes.len()].copy_from_slice(&compiled.bytes);
            reloc::apply(
                code,
                base,
                compiled.bytes.len(),
                &compiled.relocs,
                |target| self.resolve(target, Some((*func, base))),
            )?;
            infos.push(self.code_info(*func, f, compiled, base));
        }
        let mut published = Vec::with_capacity(reserved.len());
        for ((func, r), info) in reserved.into_iter().zip(infos) {
            match r.publish(info) {
                Ok(code) => published.push((func, code)),
                Err(e) => {
                    // Not yet reachable from any cell: withdraw this batch.
                    for (_, code) in published {
                        self.heap.free(code)?;
                    }
                    return Err(e.into());
                }
            }
        }
        // Nothing below refuses: the definitions leave the pending lists.
        for (data, bytes) in std::mem::take(&mut self.pending_data)
            .into_iter()
            .zip(data_bytes)
        {
            if let Some(d) = &self.data[data.as_u32() as usize] {
                d.memory.write(&bytes);
            }
        }
        self.pending_functions.clear();
        for (func, code) in published {
            let f = &mut self.functions[func.as_u32() as usize];
            f.pending = None;
            // `set` is a Release store: the version was published (written, relocated, made
            // executable) before a caller that loads its address jumps to it.
            f.cell.set(CodeAddress::new(code.start()));
            if let Some(old) = f.live.replace(code) {
                self.heap.free(old)?;
            }
        }
        Ok(())
    }

    /// `func`'s entry in `functions`, if it was declared.
    #[expect(clippy::result_large_err, reason = "the Module trait's own error type")]
    fn function_mut(&mut self, func: FuncId) -> ModuleResult<&mut Function> {
        self.functions
            .get_mut(func.as_u32() as usize)
            .ok_or_else(|| ModuleError::Undeclared(format!("{func}")))
    }

    /// The function's linkage name.
    fn name_of(&self, func: FuncId) -> String {
        self.declarations
            .get_function_decl(func)
            .linkage_name(func)
            .into_owned()
    }

    /// Refuses an undeclared function and an import.
    #[expect(clippy::result_large_err, reason = "the Module trait's own error type")]
    fn check_definable(&self, func: FuncId) -> ModuleResult<()> {
        if func.as_u32() as usize >= self.functions.len() {
            return Err(ModuleError::Undeclared(format!("{func}")));
        }
        let decl = self.declarations.get_function_decl(func);
        if !decl.linkage.is_definable() {
            return Err(ModuleError::InvalidImportDefinition(self.name_of(func)));
        }
        Ok(())
    }

    /// Refuses a redefinition whose signature is not its first definition's.
    /// (A first definition may differ from the declaration, as cranelift-jit
    /// allows: a front end may declare a function before it has inferred its
    /// return type.)
    #[expect(clippy::result_large_err, reason = "the Module trait's own error type")]
    fn check_signature(&self, func: FuncId, signature: &ir::Signature) -> ModuleResult<()> {
        let defined = self.functions[func.as_u32() as usize].signature.as_ref();
        if let Some(defined) = defined
            && defined != signature
        {
            return Err(ModuleError::IncompatibleSignature(
                self.name_of(func),
                defined.clone(),
                signature.clone(),
            ));
        }
        Ok(())
    }

    /// Compiles `ctx` (no lock held) into what `finalize_definitions` needs.
    #[expect(clippy::result_large_err, reason = "the Module trait's own error type")]
    fn compile(
        &self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
    ) -> ModuleResult<Compiled> {
        ctx.compile(&*self.isa, ctrl_plane)?;
        let compiled = ctx
            .compiled_code()
            .ok_or_else(|| ModuleError::Backend(anyhow::anyhow!("no code after compiling")))?;
        let func = &ctx.func;
        let relocs = compiled
            .buffer
            .relocs()
            .iter()
            .map(|r| ModuleReloc::from_mach_reloc(r, func, id))
            .collect();
        let rows = compiled
            .buffer
            .get_srclocs_sorted()
            .iter()
            .filter(|s| !s.loc.is_default())
            .map(|s| (s.start, s.loc.bits()))
            .collect();
        Ok(Compiled {
            bytes: compiled.code_buffer().to_vec(),
            relocs,
            unwind: compiled.create_unwind_info(&*self.isa)?,
            rows,
            kind: kind_of(&*self.isa),
            align: u64::from(compiled.buffer.alignment)
                .max(u64::from(self.isa.function_alignment().minimum)),
        })
    }

    /// The `CodeInfo` a function's version is published with.
    fn code_info(&self, func: FuncId, f: &Function, compiled: &Compiled, base: usize) -> CodeInfo {
        let mut info = CodeInfo::new(f.method_id, self.name_of(func), compiled.kind);
        if let Some(file) = &f.source_file {
            let mut rows: Vec<DebugEntry> = Vec::new();
            for &(offset, line) in &compiled.rows {
                if rows.last().is_none_or(|r| r.line != line)
                    && offset < compiled.bytes.len() as u32
                {
                    rows.push(DebugEntry {
                        offset,
                        line,
                        column: 0,
                        file: Arc::clone(file),
                    });
                }
            }
            info.debug = rows;
        }
        info.eh_frame = compiled
            .unwind
            .as_ref()
            .and_then(|u| unwind::eh_frame(&*self.isa, u, base))
            .map(|frame| EhFrame {
                frame,
                header: Box::new([]),
            });
        info
    }

    /// The address a relocation target resolves to. `this` is the function
    /// being relocated and its final address, for offsets into itself.
    fn resolve(
        &self,
        target: &ModuleRelocTarget,
        this: Option<(FuncId, usize)>,
    ) -> Result<usize, JitError> {
        match *target {
            ModuleRelocTarget::User {
                namespace: 0,
                index,
            } => {
                let func = FuncId::from_u32(index);
                let decl = self.declarations.get_function_decl(func);
                match self.functions.get(index as usize) {
                    Some(f) if f.live.is_some() || f.pending.is_some() => f
                        .trampoline
                        .map(|t| t.start())
                        .ok_or_else(|| JitError::Undefined(self.name_of(func))),
                    // Declared definable and not defined: as on cranelift-jit,
                    // a symbol of its name, or null for a preemptible one.
                    _ if decl.linkage.is_definable() => {
                        match decl.name.as_deref().and_then(|n| self.lookup_symbol(n)) {
                            Some(address) => Ok(address),
                            None if decl.linkage == Linkage::Preemptible => Ok(0),
                            None => Err(JitError::Undefined(self.name_of(func))),
                        }
                    }
                    _ => self.import(decl.name.as_deref(), func.to_string()),
                }
            }
            ModuleRelocTarget::User { index, .. } => {
                let data = DataId::from_u32(index);
                match self.data.get(index as usize) {
                    Some(Some(d)) => Ok(d.memory.as_ptr().addr()),
                    _ => {
                        let decl = self.declarations.get_data_decl(data);
                        self.import(decl.name.as_deref(), data.to_string())
                    }
                }
            }
            ModuleRelocTarget::LibCall(libcall) => {
                let name = self.libcall_name(libcall);
                self.lookup_symbol(&name)
                    .ok_or(JitError::UnknownSymbol(name))
            }
            ModuleRelocTarget::FunctionOffset(_, offset) => match this {
                Some((_, base)) => Ok(base + offset as usize),
                None => Err(JitError::UnknownSymbol(format!("{target:?}"))),
            },
            ModuleRelocTarget::KnownSymbol(_) => {
                Err(JitError::UnknownSymbol(format!("{target:?}")))
            }
        }
    }

    /// An import's address, by its name.
    fn import(&self, name: Option<&str>, id: String) -> Result<usize, JitError> {
        let name = name.ok_or(JitError::UnknownSymbol(id))?;
        self.lookup_symbol(name)
            .ok_or_else(|| JitError::UnknownSymbol(name.to_owned()))
    }

    /// The symbol table, then the host's lookups (last added first), then
    /// `dlsym` over the process.
    fn lookup_symbol(&self, name: &str) -> Option<usize> {
        if let Some(&address) = self.symbols.get(name) {
            return Some(address);
        }
        if let Some(ptr) = self.lookups.iter().rev().find_map(|lookup| lookup(name)) {
            return Some(ptr.addr());
        }
        let name = CString::new(name).ok()?;
        // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches the process.
        let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        (!address.is_null()).then(|| address.addr())
    }

    fn libcall_name(&self, libcall: LibCall) -> String {
        (self.libcall_names)(libcall)
    }

    /// Keeps `functions` in step with a declaration: a newly declared
    /// function gets its cell (pointing at the trap), and one that can be
    /// defined here gets its trampoline, whether it was declared definable
    /// or first as an import and then upgraded (a front end that translates
    /// a body before it declares the function does that: a recursive call
    /// declares the function's own name as an import).
    #[expect(clippy::result_large_err, reason = "the Module trait's own error type")]
    fn add_function(&mut self, func: FuncId) -> ModuleResult<()> {
        let index = func.as_u32() as usize;
        if index >= self.functions.len() {
            self.functions.push(Function {
                cell: Box::new(CallCell::new(stub::trap())),
                trampoline: None,
                live: None,
                pending: None,
                source_file: None,
                method_id: u64::from(func.as_u32()),
                signature: None,
            });
        }
        let definable = self
            .declarations
            .get_function_decl(func)
            .linkage
            .is_definable();
        if definable && self.functions[index].trampoline.is_none() {
            let code = crate::arch::trampoline(self.functions[index].cell.address());
            let allocation = |e: jitmap::HeapError| ModuleError::Allocation {
                err: std::io::Error::other(e),
            };
            let mut r = self.heap.reserve(code.len() as u64).map_err(allocation)?;
            r.code_mut().copy_from_slice(&code);
            self.functions[index].trampoline =
                Some(r.publish_stub(TRAMPOLINE).map_err(allocation)?);
        }
        Ok(())
    }

    fn add_data(&mut self, data: DataId) {
        let index = data.as_u32() as usize;
        if index >= self.data.len() {
            self.data.resize_with(index + 1, || None);
        }
    }
}

/// What a version compiled by `isa` is published as.
fn kind_of(isa: &dyn TargetIsa) -> JitKind {
    match isa.flags().opt_level() {
        settings::OptLevel::None => JitKind::Baseline,
        _ => JitKind::Optimized,
    }
}

impl Drop for JitmapModule {
    /// The heap goes with its code (unmapped once executors have left it);
    /// the call cells its trampolines jump through and the data objects its
    /// code reads are retired to the manager, so a thread still running in
    /// the module when it drops finishes there.
    fn drop(&mut self) {
        let cells: Vec<Box<CallCell<CodeAddress>>> =
            self.functions.drain(..).map(|f| f.cell).collect();
        let data: Vec<DataMemory> = self.data.drain(..).flatten().map(|d| d.memory).collect();
        self.heap.manager().retire((cells, data));
    }
}

impl Module for JitmapModule {
    fn isa(&self) -> &dyn TargetIsa {
        &*self.isa
    }

    fn declarations(&self) -> &ModuleDeclarations {
        &self.declarations
    }

    fn declare_function(
        &mut self,
        name: &str,
        linkage: Linkage,
        signature: &ir::Signature,
    ) -> ModuleResult<FuncId> {
        let (id, _) = self
            .declarations
            .declare_function(name, linkage, signature)?;
        self.add_function(id)?;
        Ok(id)
    }

    fn declare_anonymous_function(&mut self, signature: &ir::Signature) -> ModuleResult<FuncId> {
        let id = self.declarations.declare_anonymous_function(signature)?;
        self.add_function(id)?;
        Ok(id)
    }

    fn declare_data(
        &mut self,
        name: &str,
        linkage: Linkage,
        writable: bool,
        tls: bool,
    ) -> ModuleResult<DataId> {
        if tls {
            return Err(ModuleError::Backend(anyhow::anyhow!(
                "thread-local data is not supported"
            )));
        }
        let (id, _) = self
            .declarations
            .declare_data(name, linkage, writable, tls)?;
        self.add_data(id);
        Ok(id)
    }

    fn declare_anonymous_data(&mut self, writable: bool, tls: bool) -> ModuleResult<DataId> {
        if tls {
            return Err(ModuleError::Backend(anyhow::anyhow!(
                "thread-local data is not supported"
            )));
        }
        let id = self.declarations.declare_anonymous_data(writable, tls)?;
        self.add_data(id);
        Ok(id)
    }

    /// Data lives in ordinary memory, which may lie further than 2 GiB from
    /// the code: its address is always loaded whole (an absolute relocation).
    fn declare_data_in_func(&self, data: DataId, func: &mut ir::Function) -> ir::GlobalValue {
        let decl = self.declarations.get_data_decl(data);
        let name = func.declare_imported_user_function(ir::UserExternalName {
            namespace: 1,
            index: data.as_u32(),
        });
        func.create_global_value(ir::GlobalValueData::Symbol {
            name: ir::ExternalName::user(name),
            offset: ir::immediates::Imm64::new(0),
            colocated: false,
            tls: decl.tls,
        })
    }

    fn define_function_with_control_plane(
        &mut self,
        func: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
    ) -> ModuleResult<()> {
        self.check_definable(func)?;
        self.add_function(func)?;
        let f = &self.functions[func.as_u32() as usize];
        if f.live.is_some() || f.pending.is_some() {
            return Err(ModuleError::DuplicateDefinition(self.name_of(func)));
        }
        let compiled = self.compile(func, ctx, ctrl_plane)?;
        let f = &mut self.functions[func.as_u32() as usize];
        f.pending = Some(compiled);
        f.signature = Some(ctx.func.signature.clone());
        self.pending_functions.push(func);
        Ok(())
    }

    fn define_function_bytes(
        &mut self,
        func: FuncId,
        alignment: u64,
        bytes: &[u8],
        relocs: &[ModuleReloc],
    ) -> ModuleResult<()> {
        self.check_definable(func)?;
        self.add_function(func)?;
        let f = &self.functions[func.as_u32() as usize];
        if f.live.is_some() || f.pending.is_some() {
            return Err(ModuleError::DuplicateDefinition(self.name_of(func)));
        }
        let declared = self.declarations.get_function_decl(func).signature.clone();
        let kind = kind_of(&*self.isa);
        let f = &mut self.functions[func.as_u32() as usize];
        f.signature = Some(declared);
        f.pending = Some(Compiled {
            bytes: bytes.to_vec(),
            relocs: relocs.to_vec(),
            unwind: None,
            rows: Vec::new(),
            kind,
            align: alignment,
        });
        self.pending_functions.push(func);
        Ok(())
    }

    fn define_data(&mut self, data: DataId, description: &DataDescription) -> ModuleResult<()> {
        let index = data.as_u32() as usize;
        let Some(slot) = self.data.get(index) else {
            return Err(ModuleError::Undeclared(format!("{data}")));
        };
        let decl = self.declarations.get_data_decl(data);
        if !decl.linkage.is_definable() {
            return Err(ModuleError::InvalidImportDefinition(
                decl.linkage_name(data).into_owned(),
            ));
        }
        if slot.is_some() {
            return Err(ModuleError::DuplicateDefinition(
                decl.linkage_name(data).into_owned(),
            ));
        }
        let align = description
            .align
            .unwrap_or(if decl.writable { 8 } else { 1 });
        let memory = match &description.init {
            Init::Uninitialized => {
                return Err(ModuleError::Backend(anyhow::anyhow!(
                    "data object {} has no contents",
                    decl.linkage_name(data)
                )));
            }
            Init::Zeros { size } => DataMemory::zeroed(*size as u64, align),
            Init::Bytes { contents } => DataMemory::from_bytes(contents, align),
        }
        .ok_or_else(|| ModuleError::Allocation {
            err: std::io::Error::other("a data object's size and alignment do not fit"),
        })?;
        let relocs = description
            .all_relocs(cranelift_codegen::binemit::Reloc::Abs8)
            .collect();
        self.data[index] = Some(Data { memory, relocs });
        self.pending_data.push(data);
        Ok(())
    }
}
