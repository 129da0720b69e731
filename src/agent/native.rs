//! The loaded objects' unwind tables, for native frames.
//!
//! The collector lists the process's objects with `dl_iterate_phdr`, copies
//! each one's `.eh_frame` (found through its `PT_GNU_EH_FRAME` header) and
//! evaluates every FDE into [`Rule`] rows: one row per address where a
//! function's rule changes, sorted, with an end row after each function. A
//! native frame's rule is then a bucket read and a search among the few
//! rows of its 256 bytes in the handler ([`super::row_index`]): no DWARF is
//! parsed or evaluated there, in a release build or a debug one. An
//! object's rows keep their addresses, so nothing the handler reads belongs
//! to the object: one unloaded by `dlclose` while a handler runs takes
//! nothing from under it. Its rows go when the next table replaces this one
//! and the grace period of every handler pinned before then has passed.
//!
//! A table is rebuilt when the loader's counts of loads and unloads
//! (`dlpi_adds`, `dlpi_subs`) change, on the collector's next pass; the
//! objects that stayed are shared with the previous table, not evaluated
//! again. Until then, a pc in a new object ends the stack as
//! [`StackEnd::NoUnwindInfo`]. A pc in an object loaded where an unloaded
//! one was is still found in the old one's rows: the handler cannot ask the
//! loader whether its table is current, so each sample carries the loader
//! counts its native rows were made at, and the collector cuts the stack at
//! the first frame those rows stepped unless the loader was unchanged at
//! the sample's time (`Collector::collect`).

use std::sync::Arc;

use gimli::{BaseAddresses, EhFrameHdr, LittleEndian, Pointer};

use crate::agent::loader;
use crate::agent::row_index::RowIndex;
use crate::manager::ManagerGuard;
use crate::swap::Swap;
use crate::{Domain, ExecutionManager};

use crate::unwind::eh_frame::{Row, evaluate};
use crate::unwind::{Rule, StackEnd};

/// One loaded object's rules.
pub(crate) struct Module {
    name: String,
    /// The object's load bias (`dlpi_addr`).
    base: usize,
    /// Where its `.eh_frame_hdr` is mapped (tells a reloaded object apart).
    hdr_addr: usize,
    /// The rows' addresses, sorted: the rule `rules[i]` holds from
    /// `addrs[i]` to the next address. Apart from the rules, so that a
    /// lookup reads addresses only until it has its row.
    addrs: Box<[usize]>,
    rules: Box<[Result<Rule, StackEnd>]>,
    /// Where each 256 bytes of code start among `addrs`.
    index: RowIndex,
}

impl Module {
    /// The rule at `at`, an address in this object's code.
    #[inline]
    fn rule(&self, at: usize) -> Result<Rule, StackEnd> {
        let i = self.index.count_at_or_below(&self.addrs, at);
        i.checked_sub(1)
            .map_or(Err(StackEnd::NoUnwindInfo), |i| self.rules[i])
    }

    /// Evaluates the object's `.eh_frame`, `frame`, mapped at `frame_addr`.
    fn evaluate(
        name: String,
        base: usize,
        hdr_addr: usize,
        frame_addr: usize,
        frame: &[u8],
    ) -> Self {
        let mut rows = evaluate(frame, frame_addr);
        add_plt_entry_rules(&mut rows, &name, base);
        let addrs: Box<[usize]> = rows.iter().map(|r| r.addr).collect();
        Self {
            name,
            base,
            hdr_addr,
            index: RowIndex::new(&addrs),
            addrs,
            rules: rows.iter().map(|r| r.rule).collect(),
        }
    }
}

/// Gives the object's PLT entries that no FDE covers the entry rule
/// ([`crate::unwind::plt_entry_rule_ranges`], read from the object's file:
/// sections are not in memory). A range any row already starts in, or
/// whose start has a rule, is left as it is.
fn add_plt_entry_rules(rows: &mut Vec<Row>, name: &str, base: usize) {
    let path = if name.is_empty() {
        "/proc/self/exe"
    } else {
        name
    };
    let Ok(file) = std::fs::File::open(path) else {
        return;
    };
    let ranges = crate::unwind::plt_entry_rule_ranges(&object::ReadCache::new(file));
    for (vaddr, size) in ranges {
        let lo = base.wrapping_add(vaddr as usize);
        let hi = lo.wrapping_add(size as usize);
        let i = rows.partition_point(|r| r.addr <= lo);
        let uncovered = i == 0 || rows[i - 1].rule == Err(StackEnd::NoUnwindInfo);
        if !uncovered || rows.get(i).is_some_and(|r| r.addr < hi) {
            continue;
        }
        let end = rows.get(i).is_some_and(|r| r.addr == hi);
        rows.insert(
            i,
            Row {
                addr: lo,
                rule: Ok(Rule::AT_ENTRY),
            },
        );
        if !end {
            rows.insert(
                i + 1,
                Row {
                    addr: hi,
                    rule: Err(StackEnd::NoUnwindInfo),
                },
            );
        }
    }
}

/// An executable segment, and the module whose tables cover it.
#[derive(Clone, Copy)]
struct Segment {
    lo: usize,
    hi: usize,
    module: usize,
}

/// Every loaded object's tables, as of one `dl_iterate_phdr` pass.
pub(crate) struct ModuleTable {
    /// The loader's (loads, unloads) counts when the table was built.
    loader: (u64, u64),
    /// Sorted by `lo`, not overlapping.
    segments: Vec<Segment>,
    modules: Vec<Arc<Module>>,
}

impl ModuleTable {
    /// Lists the loaded objects and evaluates their tables; objects
    /// `previous` already holds are shared, not evaluated again.
    pub(crate) fn load(previous: Option<&ModuleTable>) -> ModuleTable {
        let mut loader = (0, 0);
        let mut found = Vec::new();
        loader::each_object(|info, headers| {
            loader = (info.dlpi_adds, info.dlpi_subs);
            // SAFETY: inside the loader's callback, which keeps the
            // object's segments mapped.
            found.extend(unsafe { find(previous, info, headers) });
            false
        });
        // Evaluated outside the callback: the loader's lock is held there.
        let mut table = ModuleTable {
            loader,
            segments: Vec::new(),
            modules: Vec::new(),
        };
        for (found, segments) in found {
            let module = match found {
                Found::Kept(module) => module,
                Found::Copied(c) => Arc::new(Module::evaluate(
                    c.name,
                    c.base,
                    c.hdr_addr,
                    c.frame_addr,
                    &c.frame,
                )),
            };
            let index = table.modules.len();
            table.modules.push(module);
            table
                .segments
                .extend(segments.into_iter().map(|(lo, hi)| Segment {
                    lo,
                    hi,
                    module: index,
                }));
        }
        table.segments.sort_by_key(|s| s.lo);
        table
    }

    /// The rule at `at` (a pc, or a return address minus one).
    pub(crate) fn rule(&self, at: usize) -> Result<Rule, StackEnd> {
        let i = self.segments.partition_point(|s| s.lo <= at);
        let segment = i
            .checked_sub(1)
            .map(|i| self.segments[i])
            .filter(|s| at < s.hi)
            .ok_or(StackEnd::NoUnwindInfo)?;
        self.modules[segment.module].rule(at)
    }

    /// The loader's counts of loads and unloads when the table was made.
    pub(crate) fn loader(&self) -> (u64, u64) {
        self.loader
    }

    /// A table of no objects, as if made at loader counts `loader`.
    #[cfg(test)]
    pub(crate) fn empty(loader: (u64, u64)) -> Self {
        Self {
            loader,
            segments: Vec::new(),
            modules: Vec::new(),
        }
    }

    /// The objects the table covers: name (empty for the main program) and
    /// load bias.
    #[cfg(test)]
    pub(crate) fn objects(&self) -> impl Iterator<Item = (&str, usize)> {
        self.modules.iter().map(|m| (m.name.as_str(), m.base))
    }
}

/// An object the pass found.
enum Found {
    /// Already evaluated in the previous table.
    Kept(Arc<Module>),
    /// Its `.eh_frame`, copied to be evaluated.
    Copied(Copied),
}

/// An object's `.eh_frame`, copied out of the object.
struct Copied {
    name: String,
    base: usize,
    hdr_addr: usize,
    frame_addr: usize,
    frame: Box<[u8]>,
}

/// The object `info` describes, with its executable segments, if it has
/// unwind tables: shared with `previous` if that holds it, else copied.
///
/// # Safety
/// Called inside the loader's callback, with its `info` and headers.
unsafe fn find(
    previous: Option<&ModuleTable>,
    info: &libc::dl_phdr_info,
    headers: &[libc::Elf64_Phdr],
) -> Option<(Found, Vec<(usize, usize)>)> {
    let (base, name) = loader::object(info);
    let eh = headers.iter().find(|h| h.p_type == libc::PT_GNU_EH_FRAME)?;
    let hdr_addr = base + eh.p_vaddr as usize;
    let loads: Vec<(usize, usize, bool)> = headers
        .iter()
        .filter(|h| h.p_type == libc::PT_LOAD)
        .map(|h| {
            let lo = base + h.p_vaddr as usize;
            (lo, lo + h.p_memsz as usize, h.p_flags & libc::PF_X != 0)
        })
        .collect();
    let kept = previous.and_then(|t| {
        t.modules
            .iter()
            .find(|m| m.base == base && m.hdr_addr == hdr_addr && m.name == name)
    });
    let found = match kept {
        Some(m) => Found::Kept(Arc::clone(m)),
        // SAFETY: the segments are mapped for the callback's duration.
        None => {
            Found::Copied(unsafe { copy_frame(name, base, hdr_addr, eh.p_memsz as usize, &loads) }?)
        }
    };
    let segments = loads
        .iter()
        .filter(|(_, _, exec)| *exec)
        .map(|&(lo, hi, _)| (lo, hi))
        .collect();
    Some((found, segments))
}

/// Copies an object's `.eh_frame`, found through its `.eh_frame_hdr`.
///
/// # Safety
/// `hdr_addr..+hdr_len` and every segment in `loads` are mapped.
unsafe fn copy_frame(
    name: String,
    base: usize,
    hdr_addr: usize,
    hdr_len: usize,
    loads: &[(usize, usize, bool)],
) -> Option<Copied> {
    // SAFETY: the PT_GNU_EH_FRAME segment is mapped (the caller's contract).
    let hdr = unsafe { std::slice::from_raw_parts(hdr_addr as *const u8, hdr_len) };
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_addr as u64);
    let parsed = EhFrameHdr::new(hdr, LittleEndian)
        .parse(&bases, size_of::<usize>() as u8)
        .ok()?;
    let Pointer::Direct(frame_addr) = parsed.eh_frame_ptr() else {
        return None;
    };
    let frame_addr = frame_addr as usize;
    // `.eh_frame` has no size of its own in memory: it runs to its zero
    // terminator, inside the segment that holds it.
    let &(_, segment_end, _) = loads
        .iter()
        .find(|(lo, hi, _)| (*lo..*hi).contains(&frame_addr))?;
    // SAFETY: inside a mapped PT_LOAD segment (the caller's contract).
    let rest =
        unsafe { std::slice::from_raw_parts(frame_addr as *const u8, segment_end - frame_addr) };
    Some(Copied {
        name,
        base,
        hdr_addr,
        frame_addr,
        frame: rest[..records_len(rest)].into(),
    })
}

/// The length of the chain of CIE/FDE records at the start of `bytes`, up to
/// and including a zero terminator; a record running past `bytes` ends it.
fn records_len(bytes: &[u8]) -> usize {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let mut at = 0;
    while let Some(length) = word(at) {
        let next = match length {
            0 => return at + 4,
            // A 64-bit length follows; `.eh_frame` does not use it in practice.
            0xffff_ffff => return at,
            n => at + 4 + n as usize,
        };
        if next > bytes.len() {
            return at;
        }
        at = next;
    }
    at
}

/// Where the handlers find the current table. The collector replaces it.
pub(crate) struct ModuleSlot(Swap<ModuleTable>);

impl ModuleSlot {
    /// A slot holding a fresh table, read under guards of `domain` (the
    /// manager's, which the handlers pin).
    pub(crate) fn loaded(domain: Arc<Domain>) -> Self {
        Self(Swap::new(ModuleTable::load(None), domain))
    }

    /// The table, for as long as `guard` is pinned; `None` under a guard of
    /// another manager.
    #[inline]
    pub(crate) fn get<'g>(&self, guard: &'g ManagerGuard<'_>) -> Option<&'g ModuleTable> {
        self.0.get(guard.epoch_guard()).ok()
    }

    /// Rebuilds the table if the loader's counts (`loader`, from
    /// [`loader::counts`]) say objects were loaded or unloaded since it was
    /// built. The old table is retired through `manager`, whose guards the
    /// handlers pin.
    pub(crate) fn refresh(&self, manager: &ExecutionManager, loader: (u64, u64)) {
        let replaced = self
            .0
            .update(|old| (old.loader != loader).then(|| ModuleTable::load(Some(old))));
        if let Some(old) = replaced {
            manager.retire(old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_covers_this_function_and_libc() {
        let started = std::time::Instant::now();
        let table = ModuleTable::load(None);
        let rows: usize = table.modules.iter().map(|m| m.addrs.len()).sum();
        println!("{rows} rows in {:?}", started.elapsed());
        let here = the_table_covers_this_function_and_libc as *const () as usize;
        let rule = table.rule(here).unwrap();
        // At a function's entry: the return address is where the call left
        // it, the word below the CFA or the link register.
        let expected = if crate::arch::RETURN_ADDRESS_IN_LINK_REGISTER {
            crate::unwind::Ra::Link
        } else {
            crate::unwind::Ra::At(-8)
        };
        assert_eq!(rule.ra, expected);
        let getpid = libc::getpid as *const () as usize;
        assert!(table.rule(getpid).is_ok());
        assert!(table.objects().any(|(name, _)| name.contains("libc.so")));
        assert_eq!(table.rule(8), Err(StackEnd::NoUnwindInfo));
        assert_eq!(table.loader, loader::counts());
    }

    #[test]
    fn records_len_stops_at_the_terminator_or_the_data() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&4u32.to_le_bytes());
        bytes.extend_from_slice(&[1, 2, 3, 4]);
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&[9; 8]);
        assert_eq!(records_len(&bytes), 12);
        assert_eq!(records_len(&bytes[..10]), 8);
        let runs_past = [100u8, 0, 0, 0, 1];
        assert_eq!(records_len(&runs_past), 0);
    }
}
