//! A host that loads and unloads native libraries in a loop, for the
//! profilers' handling of `dlopen` and `dlclose`: [`run`] alternates two
//! libraries, built at run time without frame pointers, that export the
//! same two functions (`churn_work` calling `churn_inner`) with different
//! frames. The loader maps each where the other was unloaded, so an
//! unwinder that keeps one object's rows after its `dlclose` applies them
//! to the other's code, and steps to a wrong caller.
//!
//! Every sample in a library has the stack `churn_inner`, `churn_work`,
//! [`drive`], then the host's own frames.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::demo::DemoError;
use crate::frameless::{build_shared_object, load};

/// The host function that calls into the libraries.
pub const DRIVER: &str = "jitmap_testkit::dlopen_churn::drive";

/// Library A: `churn_inner` keeps a 256-byte array on its stack.
const LIBRARY_A: &str = r#"
#include <stdint.h>
__attribute__((noinline)) uint64_t churn_inner(uint64_t n) {
    volatile uint64_t pad[32];
    uint64_t x = n;
    for (uint64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        pad[i & 31] = x;
    }
    return x + pad[3];
}
uint64_t churn_work(uint64_t n) { return churn_inner(n) ^ n; }
"#;

/// Library B: `churn_inner` saves five callee-saved registers and keeps no
/// array.
const LIBRARY_B: &str = r#"
#include <stdint.h>
__attribute__((noinline)) uint64_t churn_inner(uint64_t n) {
    uint64_t x = n;
    for (uint64_t i = 0; i < n; i++) {
        x = x * 2862933555777941757ULL + 3037000493ULL;
        __asm__ volatile("" : "+r"(x) : : "rbx", "r12", "r13", "r14", "r15");
    }
    return x;
}
uint64_t churn_work(uint64_t n) { return churn_inner(n) + n; }
"#;

/// Steps of `churn_inner` per call: a few milliseconds.
const STEPS: u64 = 3_000_000;

/// Builds the two libraries into `dir`.
pub fn build(dir: &Path) -> Result<[PathBuf; 2], DemoError> {
    Ok([
        build_shared_object(dir, "churn_a", LIBRARY_A)?,
        build_shared_object(dir, "churn_b", LIBRARY_B)?,
    ])
}

/// Loads each library in turn, calls its `churn_work` once and unloads it,
/// for `duration`; returns the loads made.
#[inline(never)]
pub fn drive(libraries: &[PathBuf; 2], duration: Duration) -> Result<u64, DemoError> {
    let deadline = Instant::now() + duration;
    let mut loads = 0;
    while Instant::now() < deadline {
        for library in libraries {
            let (handle, work) = load(library, c"churn_work")?;
            // SAFETY: `churn_work` has this signature in both libraries,
            // and the library stays loaded until the call returns.
            let work: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(work) };
            std::hint::black_box(work(std::hint::black_box(STEPS)));
            // SAFETY: the handle `load` opened, closed once; nothing of the
            // library is used after.
            unsafe { libc::dlclose(handle) };
            loads += 1;
        }
    }
    Ok(loads)
}

/// Builds the libraries in a fresh directory under the temp dir and runs
/// [`drive`] for `duration`; returns the loads made.
pub fn run(duration: Duration) -> Result<u64, DemoError> {
    let dir = std::env::temp_dir().join(format!("jitmap-dlopen-churn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| DemoError::Setup(format!("{dir:?}: {e}")))?;
    let libraries = build(&dir)?;
    let loads = drive(&libraries, duration);
    // The files go; a profiler reads an unloaded library's rows and names
    // from the mapping while it is loaded.
    let _ = std::fs::remove_dir_all(&dir);
    loads
}
