//! Native frames' names, resolved by the collector while it drains the
//! rings, so that code in an object unloaded later is still named.
//!
//! A name is the chain of functions at the address, innermost first: the
//! helpers the compiler inlined there, each marked ` (inlined)` as perf
//! marks them, then the function that ran. Addresses in the objects loaded
//! when the agent started are resolved only when a profile is named (those
//! objects stay loaded, and reading their debug info is what naming costs);
//! addresses in objects loaded later at once. Without debug info the chain is
//! the symbol alone; without a symbol, the address in hex. An address in a
//! PLT entry, which no symbol covers, is named for the function the entry
//! jumps to, `puts@plt` (from the object's file, [`crate::unwind::plt_stubs`]).
//!
//! The resolver (`backtrace`) reads each object's symbols and DWARF once
//! and caches them, with the list of objects it saw. An address in an object
//! loaded since is named by `dladdr` (its dynamic symbol, no inlining) until
//! the resolver's cache is rebuilt, which happens when an object it holds
//! is unloaded (its addresses may be reused), or when an object loaded since
//! has stayed a second: rebuilding re-reads every object's debug info, so a
//! host that loads and unloads objects briefly does not pay for it each
//! time. A name is kept until the object holding its address is unloaded.
//! The cache outlives the agent: a later agent in the process keeps it as
//! long as no object was loaded or unloaded since it was last cleared.

use rustc_hash::FxHashMap;
use std::ffi::CStr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::loader::{self, Object, object_of, objects};
use crate::unwind::{PltStub, plt_stub_at, plt_stubs};

/// What marks an inlined frame's name.
pub const INLINED: &str = " (inlined)";

/// The names the collector has resolved.
pub(crate) struct NativeNames {
    /// The loader's (loads, unloads) counts the names hold for.
    loader: (u64, u64),
    /// The objects loaded when the agent started. The names of their
    /// addresses are resolved when the profile is named, not while the host
    /// runs: they stay loaded (the loader cannot unload what a program
    /// linked), and reading their debug info is the costly part of naming.
    initial: Vec<Object>,
    /// The objects the resolver's cache was built over.
    resolver_objects: Vec<Object>,
    /// Objects loaded since, with when they were first seen.
    newer: Vec<(Object, Instant)>,
    /// (address, is a return address) → (chain, the object holding it).
    by_addr: FxHashMap<(usize, bool), (usize, Option<Object>)>,
    /// Chains resolved now, by their names, for sharing a number.
    ids: FxHashMap<Vec<String>, usize>,
    chains: Vec<Chain>,
    /// Each object's named PLT entries, read from its file when an address
    /// in it is first named.
    plt: FxHashMap<Object, Vec<PltStub>>,
}

/// A native frame's names, innermost first; `later` holds the address to
/// resolve, and its object, while it waits (its names are then the frame's
/// address in hex).
struct Chain {
    names: Vec<String>,
    later: Option<(usize, Object)>,
}

/// When the agent last cleared the resolver's cache, as the loader's
/// (loads, unloads) counts. A cache built since holds for the objects loaded
/// at that moment; while the counts stay the same, those are the objects
/// loaded now, and the cache is kept: a later agent in the process then
/// names its native frames without re-reading every object's debug info.
struct ResolverCache {
    cleared_at: Option<(u64, u64)>,
}

impl ResolverCache {
    /// Makes the cache hold for the objects loaded when the loader's counts
    /// were `counts` (read before this call): calls `clear` unless the last
    /// clear was at the same counts. Returns whether it cleared.
    fn refresh(&mut self, counts: (u64, u64), clear: impl FnOnce()) -> bool {
        if self.cleared_at == Some(counts) {
            return false;
        }
        clear();
        self.cleared_at = Some(counts);
        true
    }
}

/// The process's one resolver cache (`backtrace`'s is global).
static RESOLVER: Mutex<ResolverCache> = Mutex::new(ResolverCache { cleared_at: None });

/// [`ResolverCache::refresh`] on the process's cache.
fn refresh_resolver(counts: (u64, u64)) {
    RESOLVER
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .refresh(counts, backtrace::clear_symbol_cache);
}

impl Default for NativeNames {
    /// Makes the resolver's cache hold for the objects loaded now: it may
    /// have been built earlier in the process, over other objects.
    fn default() -> Self {
        // Counted before the list is read: a load in between makes the
        // first pass follow the loader (and the next start clear).
        let counts = loader::counts();
        refresh_resolver(counts);
        let initial = objects();
        Self {
            loader: counts,
            resolver_objects: initial.clone(),
            initial,
            newer: Vec::new(),
            by_addr: FxHashMap::default(),
            ids: FxHashMap::default(),
            chains: Vec::new(),
            plt: FxHashMap::default(),
        }
    }
}

impl NativeNames {
    /// Follows the loader's loads and unloads (see the module's text), given
    /// its counts now ([`loader::counts`]). Called before each pass names its
    /// samples.
    pub(crate) fn follow_loader(&mut self, now: (u64, u64)) {
        // With an object loaded since the cache was built, passes go on
        // looking until it has stayed a second.
        if now == self.loader && self.newer.is_empty() {
            return;
        }
        self.loader = now;
        let current = objects();
        // Names of addresses in unloaded objects, and addresses that were in
        // no object, may no longer hold.
        self.by_addr
            .retain(|_, (_, object)| object.as_ref().is_some_and(|o| current.contains(o)));
        self.newer.retain(|(o, _)| current.contains(o));
        self.plt.retain(|o, _| current.contains(o));
        for o in &current {
            if !self.resolver_objects.contains(o) && !self.newer.iter().any(|(n, _)| n == o) {
                self.newer.push((o.clone(), Instant::now()));
            }
        }
        let lost = self.resolver_objects.iter().any(|o| !current.contains(o));
        let settled = self
            .newer
            .iter()
            .any(|(_, seen)| seen.elapsed() >= Duration::from_secs(1));
        if lost || settled {
            // At `now`: the objects listed above may be newer, and then the
            // next start clears again.
            refresh_resolver(now);
            self.resolver_objects = current;
            self.newer.clear();
            // What was named by its dynamic symbol gets its full chain.
            self.by_addr.clear();
        }
    }

    /// The chain at `addr` (a return address if `is_return`: resolved at
    /// `addr - 1`), by its number. An address in an object loaded since the
    /// agent started is resolved now, while the object is surely loaded;
    /// others when the profile is named ([`NativeNames::resolve_waiting`]).
    pub(crate) fn id(&mut self, addr: usize, is_return: bool) -> usize {
        if let Some(&(id, _)) = self.by_addr.get(&(addr, is_return)) {
            return id;
        }
        let at = if is_return {
            addr.saturating_sub(1)
        } else {
            addr
        };
        let object = object_of(at);
        let id = match &object {
            Some(o) if self.initial.contains(o) => {
                self.chains.push(Chain {
                    names: vec![format!("{addr:#x}")],
                    later: Some((at, o.clone())),
                });
                self.chains.len() - 1
            }
            _ => {
                let plt = object.as_ref().and_then(|o| self.plt_name(o, at));
                let names = match &object {
                    _ if plt.is_some() => plt,
                    Some(o) if self.resolver_objects.contains(o) => {
                        resolve(at).or_else(|| dynamic_symbol(at))
                    }
                    _ => dynamic_symbol(at),
                }
                .unwrap_or_else(|| vec![format!("{addr:#x}")]);
                let next = self.chains.len();
                let id = *self.ids.entry(names.clone()).or_insert(next);
                if id == next {
                    self.chains.push(Chain { names, later: None });
                }
                id
            }
        };
        self.by_addr.insert((addr, is_return), (id, object));
        id
    }

    /// The name of the PLT entry at `at` in `object` (`puts@plt`), if it is
    /// in one: no symbol covers a PLT entry.
    fn plt_name(&mut self, object: &Object, at: usize) -> Option<Vec<String>> {
        let stubs = self.plt.entry(object.clone()).or_insert_with(|| {
            let path = if object.1.is_empty() {
                "/proc/self/exe"
            } else {
                &object.1
            };
            // Of a large executable, only its headers, PLT and dynamic
            // tables are read.
            std::fs::File::open(path).map_or_else(
                |_| Vec::new(),
                |file| plt_stubs(&object::ReadCache::new(file)),
            )
        });
        let stub = plt_stub_at(stubs, at.wrapping_sub(object.0) as u64)?;
        let name = stub.name.strip_suffix("@plt").unwrap_or(&stub.name);
        let demangled = format!("{:#}", backtrace::SymbolName::new(name.as_bytes()));
        Some(vec![format!("{demangled}@plt")])
    }

    /// Resolves every address still waiting: before a profile is named.
    pub(crate) fn resolve_waiting(&mut self) {
        for i in 0..self.chains.len() {
            if let Some((at, object)) = self.chains[i].later.take()
                && let Some(names) = self
                    .plt_name(&object, at)
                    .or_else(|| resolve(at))
                    .or_else(|| dynamic_symbol(at))
            {
                self.chains[i].names = names;
            }
        }
    }

    /// The chain numbered `id`, innermost first.
    pub(crate) fn chain(&self, id: usize) -> &[String] {
        &self.chains[id].names
    }
}

/// The functions at `at`, innermost first, the inlined ones marked, from
/// the resolver.
fn resolve(at: usize) -> Option<Vec<String>> {
    let mut names = Vec::new();
    // The resolver takes every address for a return address and looks one
    // byte before it: given `at + 1`, it names `at` (a leaf at a function's
    // first byte is that function's, not the one before it).
    backtrace::resolve(at.wrapping_add(1) as *mut std::ffi::c_void, |symbol| {
        if let Some(n) = symbol.name() {
            names.push(format!("{n:#}"));
        }
    });
    // The resolver reports the inlined frames innermost first and the
    // function that ran last.
    let last = names.len().checked_sub(1)?;
    for name in &mut names[..last] {
        name.push_str(INLINED);
    }
    Some(names)
}

/// The dynamic symbol at `at`, from the loader.
fn dynamic_symbol(at: usize) -> Option<Vec<String>> {
    // SAFETY: an all-zero Dl_info is valid storage for dladdr to fill.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: any address may be asked about; `info` is writable.
    if unsafe { libc::dladdr(at as *const libc::c_void, &mut info) } == 0
        || info.dli_sname.is_null()
    {
        return None;
    }
    // SAFETY: a NUL-terminated name owned by the loaded object, read while
    // it is loaded (the loader keeps it until dlclose, which this thread does
    // not call).
    let name = unsafe { CStr::from_ptr(info.dli_sname) }.to_string_lossy();
    let demangled = format!("{:#}", backtrace::SymbolName::new(name.as_bytes()));
    Some(vec![demangled])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn outer() -> usize {
        outer as *const () as usize
    }

    #[test]
    fn a_function_is_named_and_an_address_outside_code_is_hex() {
        let mut names = NativeNames::default();
        let id = names.id(outer() + 1, false);
        // In this test binary, loaded before: named when asked to.
        assert_eq!(names.chain(id), [format!("{:#x}", outer() + 1)]);
        names.resolve_waiting();
        let chain = names.chain(id);
        assert!(
            chain.last().unwrap().ends_with("symbols::tests::outer"),
            "{chain:?}"
        );
        // Resolved once: the same address gives the same number.
        assert_eq!(names.id(outer() + 1, false), id);
        // A leaf at the function's first byte is that function's. (On the
        // old code the resolver looked one byte before it: the function
        // before, or nothing.)
        let entry = names.id(outer(), false);
        names.resolve_waiting();
        let chain = names.chain(entry);
        assert!(
            chain.last().unwrap().ends_with("symbols::tests::outer"),
            "{chain:?}"
        );
        let nowhere = names.id(0x10, false);
        assert_eq!(names.chain(nowhere), ["0x10"]);
    }

    #[test]
    fn the_resolver_cache_is_cleared_only_when_the_loader_counts_changed() {
        let mut cache = ResolverCache { cleared_at: None };
        let mut clears = 0;
        assert!(cache.refresh((5, 1), || clears += 1));
        assert!(!cache.refresh((5, 1), || clears += 1));
        assert!(cache.refresh((6, 1), || clears += 1));
        assert!(cache.refresh((6, 2), || clears += 1));
        assert!(!cache.refresh((6, 2), || clears += 1));
        assert_eq!(clears, 3);
    }

    #[test]
    fn an_object_loaded_since_joins_the_resolver_after_a_second_with_no_loader_change() {
        let mut names = NativeNames::default();
        let object = names.resolver_objects.pop().unwrap();
        names
            .newer
            .push((object.clone(), Instant::now() - Duration::from_secs(2)));
        // Passes go on looking, though the loader counts did not change.
        names.follow_loader(names.loader);
        assert!(names.newer.is_empty());
        assert!(names.resolver_objects.contains(&object));
    }
}
