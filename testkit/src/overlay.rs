//! A host that maps one large library over the addresses of many small ones
//! it has just unloaded, for the eBPF profiler's candidate ranges: it keeps
//! the small ones' rows after their `dlclose` (a sample taken before the
//! unmap may still need them), so their ranges start inside the large
//! one's. The kernel tries a bounded number of ranges back from a pc, so a
//! pc high in the large library must still reach its range past them.
//!
//! [`run`] loads [`SMALL`] small libraries and calls each, holds them while
//! a profiler attaches and sees them, unloads them all, then loads the
//! large one and runs `large_hot`, which lies past 256 KiB of padding in its
//! `.text` (so past the small ones' starts). Both are built
//! without frame pointers: only their rows step them. Every sample in
//! `large_hot` has the stack [`LARGE_STACK`], then [`DRIVER`], then the
//! host's own frames.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::demo::DemoError;
use crate::frameless::{build_shared_object, build_shared_object_with, load};

/// The host function that calls into the libraries.
pub const DRIVER: &str = "jitmap_testkit::overlay::drive";

/// The innermost frames of a sample in the large library's hot loop.
pub const LARGE_STACK: [&str; 2] = ["large_hot", "large_work"];

/// Small libraries loaded before the large one: together they span more
/// than it does (20 KiB apart on x86-64 Debian), so the loader puts it over
/// their addresses, where about 13 of their code ranges start inside its
/// code range; and no more than the profiler keeps as candidates (16).
pub const SMALL: usize = 16;

/// A small library: one short function.
const SMALL_C: &str = r#"
#include <stdint.h>
uint64_t small_work(uint64_t n) {
    uint64_t x = n;
    for (uint64_t i = 0; i < n; i++) x = x * 3 + i;
    return x;
}
"#;

/// The large library: 256 KiB of padding at the start of its `.text`, then
/// `large_hot`, which keeps a 256-byte array on its stack (a wrong row
/// steps to a wrong caller), under `large_work`. Built with
/// `-fno-toplevel-reorder`, so the padding comes first.
const LARGE_C: &str = r#"
#include <stdint.h>
__asm__(".text\n.balign 4096\nlarge_padding:\n.skip 262144, 0xcc\n");
__attribute__((noinline)) uint64_t large_hot(uint64_t n) {
    volatile uint64_t pad[32];
    uint64_t x = n;
    for (uint64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        pad[i & 31] = x;
    }
    return x + pad[3];
}
uint64_t large_work(uint64_t n) { return large_hot(n) ^ n; }
"#;

/// Steps of `large_hot` per call: a few milliseconds.
const STEPS: u64 = 3_000_000;

/// The libraries, built.
pub struct Libraries {
    small: Vec<PathBuf>,
    large: PathBuf,
}

/// Builds [`SMALL`] small libraries and the large one into `dir`.
pub fn build(dir: &Path) -> Result<Libraries, DemoError> {
    let small = (0..SMALL)
        .map(|i| build_shared_object(dir, &format!("overlay_small_{i}"), SMALL_C))
        .collect::<Result<_, _>>()?;
    let large =
        build_shared_object_with(dir, "overlay_large", LARGE_C, &["-fno-toplevel-reorder"])?;
    Ok(Libraries { small, large })
}

/// Loads `symbol` of `library` and calls it with `n`; the handle stays open.
fn call(library: &Path, symbol: &std::ffi::CStr, n: u64) -> Result<*mut libc::c_void, DemoError> {
    let (handle, f) = load(library, symbol)?;
    // SAFETY: both libraries' functions take and return a u64, and the
    // library stays loaded (its handle is open) during the call.
    let f: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(f) };
    std::hint::black_box(f(std::hint::black_box(n)));
    Ok(handle)
}

/// The executable mappings of this process whose path contains `part`:
/// (start, end), from `/proc/self/maps`.
fn code_ranges(part: &str) -> Result<Vec<(usize, usize)>, DemoError> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| DemoError::Setup(format!("/proc/self/maps: {e}")))?;
    Ok(maps
        .lines()
        .filter(|l| l.contains(part))
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let (range, perms) = (fields.next()?, fields.next()?);
            let (start, end) = range.split_once('-')?;
            (perms.as_bytes().get(2) == Some(&b'x')).then_some((
                usize::from_str_radix(start, 16).ok()?,
                usize::from_str_radix(end, 16).ok()?,
            ))
        })
        .collect())
}

/// Loads the small libraries, calls each, and holds them for `hold` (long
/// enough for a profiler that attaches meanwhile to see them mapped), then
/// unloads them, loads the large one, calls `overlaid` with how many of the
/// small ones' code ranges start inside the large one's code range, past
/// its start and at or below `large_hot` (the candidates a profiler's scan
/// back from a pc in `large_hot` meets before the large one's range), and
/// runs it until `duration` has passed since the start. Returns the large
/// one's calls.
#[inline(never)]
pub fn drive(
    libraries: &Libraries,
    hold: Duration,
    duration: Duration,
    loaded: impl FnOnce(),
    overlaid: impl FnOnce(usize),
) -> Result<u64, DemoError> {
    let deadline = Instant::now() + duration;
    let mut handles = Vec::with_capacity(SMALL);
    for library in &libraries.small {
        handles.push(call(library, c"small_work", 1000)?);
    }
    let small = code_ranges("liboverlay_small_")?;
    loaded();
    std::thread::sleep(hold);
    for handle in handles.into_iter().rev() {
        // SAFETY: a handle `load` opened, closed once; nothing of its
        // library is used after.
        unsafe { libc::dlclose(handle) };
    }
    let (handle, work) = load(&libraries.large, c"large_work")?;
    // SAFETY: the handle is open; a NUL-terminated name.
    let hot = unsafe { libc::dlsym(handle, c"large_hot".as_ptr()) } as usize;
    let large = code_ranges("liboverlay_large")?;
    overlaid(
        small
            .iter()
            .filter(|&&(start, _)| {
                large
                    .iter()
                    .any(|&(l_start, l_end)| l_start < start && start <= hot && hot < l_end)
            })
            .count(),
    );
    // SAFETY: `large_work` takes and returns a u64, and the library stays
    // loaded until the handle is closed below.
    let work: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(work) };
    let mut calls = 0;
    while Instant::now() < deadline {
        std::hint::black_box(work(std::hint::black_box(STEPS)));
        calls += 1;
    }
    // SAFETY: as above.
    unsafe { libc::dlclose(handle) };
    Ok(calls)
}

/// Builds the libraries in a fresh directory under the temp dir and runs
/// [`drive`], calling `ready` once the small libraries are loaded and
/// `overlaid` with their overlap; returns the large one's calls.
pub fn run(
    hold: Duration,
    duration: Duration,
    ready: impl FnOnce(),
    overlaid: impl FnOnce(usize),
) -> Result<u64, DemoError> {
    let dir = std::env::temp_dir().join(format!("jitmap-overlay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| DemoError::Setup(format!("{dir:?}: {e}")))?;
    let libraries = build(&dir)?;
    let calls = drive(&libraries, hold, duration, ready, overlaid);
    // A profiler reads a library's rows from its mapping while it is loaded.
    let _ = std::fs::remove_dir_all(&dir);
    calls
}
