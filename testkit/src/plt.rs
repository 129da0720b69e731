//! A native helper whose hot loop calls through a PLT: samples land in the
//! PLT entry, whose CFI is the linker's DWARF expression (x86-64's lazy
//! `.plt`) or a plain FDE (`.plt.sec`, `.plt.got`).
//!
//! `libplt_target.so` holds `plt_target`, a few instructions; the helper,
//! `libplt_helper.so`, is linked against it with lazy binding, so its calls
//! go through the `plt_target@plt` entry. A sample there must keep its
//! callers: the helper, then the JIT code that called it ([`PLT_STACK`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use jitmap::{ExecutionManager, HeapConfig, OwnedHeap};

use crate::demo::DemoError;
use crate::frameless::{JitCaller, build_shared_object, build_shared_object_with, calls_for, load};

/// The innermost frames of a sample in the PLT entry, leaf first, under a
/// JIT caller named `plt_caller` ([`PltCaller`]).
pub const PLT_STACK: [&str; 3] = ["plt_target@plt", "plt_helper", "plt_caller"];

/// The called library: one short function, so that much of the helper's
/// time is spent in the PLT entry that reaches it.
const TARGET_C: &str = r#"
#include <stdint.h>
uint64_t plt_target(uint64_t x) { return x * 6364136223846793005ull + 1; }
"#;

/// The helper: calls `plt_target` `n` times, through its PLT entry.
const HELPER_C: &str = r#"
#include <stdint.h>
uint64_t plt_target(uint64_t x);
uint64_t plt_helper(uint64_t n) {
    uint64_t x = 1;
    for (uint64_t i = 0; i < n; i++) x = plt_target(x);
    return x;
}
"#;

/// Builds both libraries into `dir`; returns the helper's path (load it,
/// and call `plt_helper(n)`; it finds the target by its run path).
pub fn build(dir: &Path) -> Result<PathBuf, DemoError> {
    build_shared_object(dir, "plt_target", TARGET_C)?;
    let search = format!("-L{}", dir.display());
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    build_shared_object_with(
        dir,
        "plt_helper",
        HELPER_C,
        &[
            "-fplt",
            "-Wl,-z,lazy",
            "-Wl,--no-as-needed",
            &search,
            &rpath,
            "-lplt_target",
        ],
    )
}

/// The helper, loaded, under a JIT caller named `plt_caller`.
pub struct PltCaller(JitCaller);

impl PltCaller {
    /// Builds the libraries into `dir`, loads the helper (it stays loaded
    /// for the process's life) and publishes `plt_caller` into `heap`.
    pub fn build(heap: &OwnedHeap, dir: &Path) -> Result<Self, DemoError> {
        let helper = build(dir)?;
        let (_handle, helper) = load(&helper, c"plt_helper")?;
        Ok(Self(JitCaller::publish(heap, "plt_caller", helper)?))
    }

    /// Calls `plt_caller(n)`: `n` calls of `plt_target` through its PLT
    /// entry, from [`JitCaller::call`] (the host's frame under
    /// [`PLT_STACK`]).
    pub fn call(&self, n: u64) -> u64 {
        self.0.call(n)
    }
}

/// `jitmap-host plt`'s workload: builds the libraries in a temporary
/// directory, calls `ready`, then calls through the PLT from
/// [`JitCaller::call`] for `duration`. Returns the calls made.
pub fn run(
    manager: &ExecutionManager,
    duration: Duration,
    ready: impl FnOnce(),
) -> Result<u64, DemoError> {
    let heap = manager.create_heap(HeapConfig {
        span: 1 << 16,
        ..HeapConfig::default()
    })?;
    let dir = std::env::temp_dir().join(format!("jitmap-plt-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| DemoError::Setup(format!("{dir:?}: {e}")))?;
    let caller = PltCaller::build(&heap, &dir)?;
    ready();
    Ok(calls_for(duration, || {
        caller.call(100_000);
    }))
}
