//! Registers the compiled code of [wasmtime] modules and components with a
//! jitmap [`ExecutionManager`], so that everything standing on its range
//! map names WebAssembly guest functions: the in-process agent (its report,
//! folded stacks, flame graph and pprof endpoint), the perf map, and, from
//! another process, `jitmap inspect` and the eBPF profiler.
//!
//! jitmap does not compile this code. wasmtime does; each module's `.text`
//! is loaded as a jitmap *image* whose methods are the module's functions,
//! named `module::function` (`module::wasm-function[N]` where the name
//! section has none; a module with no name is `wasm`). The gaps between
//! functions hold wasmtime's trampolines and are named
//! `module::[trampolines]`, so that no address of the text is left
//! unattributed. wasmtime keeps frame pointers in its code, which is how the
//! agent's handler walks through guest frames.
//!
//! ```
//! use jitmap::ExecutionManager;
//! use wasmtime::{Engine, Module};
//!
//! let manager = ExecutionManager::new(4);
//! let engine = Engine::default();
//! let module = Module::new(
//!     &engine,
//!     r#"(module $demo (func $leaf (export "leaf") (result i32) i32.const 7))"#,
//! )?;
//! let registration = jitmap_wasmtime::register(&manager, &module)?;
//! let leaf = module.functions().next().unwrap();
//! let address = module.text().as_ptr() as usize + leaf.offset;
//! assert_eq!(registration.name_at(address), Some("demo::leaf"));
//! drop(registration); // unloads the image; the clone goes after the grace period
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [wasmtime]: https://docs.rs/wasmtime

pub mod demo;

/// The guide's wasmtime chapter, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide/wasmtime.md")]
pub struct GuideWasmtime;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use jitmap::ExecutionManager;
use jitmap::image::{ImageFunction, ImageInfo, ImageMethod, ImageSection};
use jitmap::manager::ManagerError;
use wasmtime::component::Component;
use wasmtime::{Module, ModuleFunction};

/// Why a registration failed. Nothing is registered when one does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegisterError {
    /// The module's code is already registered with this manager (the same
    /// module, or a clone of it, registered twice).
    AlreadyRegistered {
        /// The code's first address.
        base: usize,
    },
    /// The module has no compiled code (an empty module).
    NoCode,
    /// The manager refused the image for another reason.
    Manager(ManagerError),
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyRegistered { base } => {
                write!(f, "the code at {base:#x} is already registered")
            }
            Self::NoCode => f.write_str("the module has no compiled code"),
            Self::Manager(e) => write!(f, "the manager refused the module's code: {e}"),
        }
    }
}

impl std::error::Error for RegisterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Manager(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ManagerError> for RegisterError {
    fn from(e: ManagerError) -> Self {
        match e {
            ManagerError::Range(jitmap::range::RangeError::Overlap { begin, .. }) => {
                Self::AlreadyRegistered { base: begin }
            }
            other => Self::Manager(other),
        }
    }
}

/// What keeps registered code mapped: a clone of the module or component.
type Owner = Box<dyn Send>;

/// A module's or component's code, registered with a manager. Dropping it
/// unloads the image, and releases its clone of the module only after the
/// manager's grace period: a handler that found the image just before the
/// unload still names its frames, and the addresses are not reused by
/// another module's code meanwhile.
pub struct Registration {
    manager: ExecutionManager,
    base: usize,
    image: std::sync::Arc<ImageSection>,
    owner: Option<Owner>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("base", &format_args!("{:#x}", self.base))
            .field("size", &self.image.info().size)
            .field("methods", &self.image.info().methods.len())
            .finish()
    }
}

impl Registration {
    /// The first address of the registered code (the module's `.text`).
    pub fn base(&self) -> usize {
        self.base
    }

    /// Bytes of code registered.
    pub fn size(&self) -> usize {
        self.image.info().size
    }

    /// The methods registered: each with its method id and name, in address
    /// order.
    pub fn methods(&self) -> impl Iterator<Item = &ImageMethod> {
        self.image.info().methods.iter()
    }

    /// The name of the function (or trampolines) at `address`, as profiles
    /// show it; `None` outside the registered code.
    pub fn name_at(&self, address: usize) -> Option<&str> {
        let rel = address.checked_sub(self.base)?;
        Some(self.image.method_at(rel as u64)?.name.as_str())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Only this registration unloads its base, so it is loaded; an error
        // would mean another image replaced it, which the range map refuses.
        let _ = self.manager.unload_image(self.base);
        if let Some(owner) = self.owner.take() {
            self.manager.retire(owner);
        }
    }
}

/// Registers `module`'s compiled code with `manager` (see the crate
/// documentation for the names). The registration holds a clone of the
/// module; drop it to unregister.
///
/// ```
/// # use jitmap::ExecutionManager;
/// # use wasmtime::{Engine, Module};
/// # let manager = ExecutionManager::new(4);
/// # let module = Module::new(&Engine::default(), "(module (func (export \"f\")))")?;
/// let registration = jitmap_wasmtime::register(&manager, &module)?;
/// assert_eq!(
///     jitmap_wasmtime::register(&manager, &module).unwrap_err(),
///     jitmap_wasmtime::RegisterError::AlreadyRegistered { base: registration.base() },
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn register(
    manager: &ExecutionManager,
    module: &Module,
) -> Result<Registration, RegisterError> {
    let prefix = module.name().unwrap_or("wasm");
    let functions = module
        .functions()
        .map(|f| (name_of(prefix, None, &f), f.offset, f.len));
    register_text(
        manager,
        module.text(),
        prefix,
        functions.collect(),
        Box::new(module.clone()),
    )
}

/// Registers the code of every core module inside `component`, like
/// [`register`]. A component's functions are named
/// `component::function`, or `component::module[M]::wasm-function[N]`
/// where the name section has none (`M` is the core module's static index).
///
/// ```
/// # use jitmap::ExecutionManager;
/// # use wasmtime::{Config, Engine, component::Component};
/// let engine = Engine::new(Config::new().wasm_component_model(true))?;
/// let component = Component::new(
///     &engine,
///     r#"(component (core module (func $inner (export "inner") (result i32) i32.const 1)))"#,
/// )?;
/// # let manager = ExecutionManager::new(4);
/// let registration = jitmap_wasmtime::register_component(&manager, &component, "plugin")?;
/// assert_eq!(registration.methods().next().unwrap().name, "plugin::inner");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn register_component(
    manager: &ExecutionManager,
    component: &Component,
    name: &str,
) -> Result<Registration, RegisterError> {
    let functions = component
        .functions()
        .map(|f| (name_of(name, Some(f.module.as_u32()), &f), f.offset, f.len));
    register_text(
        manager,
        component.text(),
        name,
        functions.collect(),
        Box::new(component.clone()),
    )
}

/// `prefix::name`, or `prefix::[module[M]::]wasm-function[N]`.
fn name_of(prefix: &str, module: Option<u32>, f: &ModuleFunction) -> String {
    match (&f.name, module) {
        (Some(name), _) => format!("{prefix}::{name}"),
        (None, None) => format!("{prefix}::wasm-function[{}]", f.index.as_u32()),
        (None, Some(m)) => format!("{prefix}::module[{m}]::wasm-function[{}]", f.index.as_u32()),
    }
}

/// Registrations made so far in this process: the high half of each method
/// id, so that no two registrations share one.
static REGISTRATIONS: AtomicU64 = AtomicU64::new(1);

/// The image of `text`: one method per function (sorted by offset), and one
/// named `prefix::[trampolines]` per gap between them.
fn image_info(
    text: &[u8],
    prefix: &str,
    mut functions: Vec<(String, usize, usize)>,
    serial: u64,
) -> ImageInfo {
    functions.sort_by_key(|&(_, offset, _)| offset);
    let mut info = ImageInfo {
        base: text.as_ptr() as usize,
        size: text.len(),
        ..ImageInfo::default()
    };
    let mut push = |name: String, begin: usize, end: usize| {
        let id = serial << 32 | info.methods.len() as u64;
        info.functions.push(ImageFunction {
            begin: begin as u32,
            end: end as u32,
            unwind: Box::new([]),
        });
        info.methods.push(ImageMethod {
            entry: begin as u32,
            method_id: id,
            gc: None,
            debug: Vec::new(),
            name,
        });
    };
    let mut at = 0;
    for (name, offset, len) in functions {
        if len == 0 || offset < at || offset + len > text.len() {
            continue;
        }
        if offset > at {
            push(format!("{prefix}::[trampolines]"), at, offset);
        }
        push(name, offset, offset + len);
        at = offset + len;
    }
    if at < text.len() {
        push(format!("{prefix}::[trampolines]"), at, text.len());
    }
    info
}

fn register_text(
    manager: &ExecutionManager,
    text: &[u8],
    prefix: &str,
    functions: Vec<(String, usize, usize)>,
    owner: Owner,
) -> Result<Registration, RegisterError> {
    if text.is_empty() {
        return Err(RegisterError::NoCode);
    }
    // Relaxed: a unique number is all it gives.
    let serial = REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
    let info = image_info(text, prefix, functions, serial);
    let image = manager.load_image_section(info)?;
    Ok(Registration {
        manager: manager.clone(),
        base: image.base(),
        image,
        owner: Some(owner),
    })
}
