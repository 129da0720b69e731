//! The names of a loaded object's PLT entries: `puts@plt` for the stub a
//! call to `puts` goes through, as perf and objdump name them. No symbol
//! covers a PLT entry, so a profiler that names frames by symbols alone
//! shows a PLT sample as a bare address, or as the function before it.
//!
//! An entry's name is its GOT slot's: the entry's jump reads the slot (the
//! architecture's module decodes which), and the dynamic relocation that
//! fills the slot names the symbol. The sections are those GNU ld and lld
//! write: `.plt` (lazy binding), `.plt.sec` (the jumps, with indirect-branch
//! tracking) and `.plt.got` (functions whose address is also taken).

use std::collections::HashMap;

use object::read::elf::{ElfFile64, ElfSection64};
use object::{
    LittleEndian, Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, ReadRef, RelocationTarget,
};

use crate::arch::{PLT_ENTRY, PLT_ENTRY_RULE_SECTIONS, PLT_HEADER, plt_entry_size, plt_slot};

/// One named PLT entry of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PltStub {
    /// Its address in the object (before the load bias).
    pub addr: u64,
    /// Its size in bytes.
    pub len: u64,
    /// The function it jumps to, with `@plt`: `puts@plt`.
    pub name: String,
}

/// The named PLT entries of `elf`, an ELF object's bytes, sorted by
/// address. An entry whose slot an `IRELATIVE` relocation fills (an ifunc
/// the object calls itself) is named for the ifunc whose resolver the
/// relocation runs. Entries whose slot no relocation fills (the lazy PLT's
/// first entry) are left out; so is everything in an object that does not
/// parse.
///
/// ```
/// // Not an ELF file: no entries.
/// assert!(jitmap::unwind::plt_stubs(&b"not an object"[..]).is_empty());
/// ```
///
/// `elf` may be the bytes, or a [`object::ReadCache`] over the file, which
/// reads only the headers, the PLT sections and the dynamic tables.
pub fn plt_stubs<'data, R: ReadRef<'data>>(elf: R) -> Vec<PltStub> {
    let Ok(file) = ElfFile64::<LittleEndian, R>::parse(elf) else {
        return Vec::new();
    };
    let (Some(relocations), Some(symbols)) =
        (file.dynamic_relocations(), file.dynamic_symbol_table())
    else {
        return Vec::new();
    };
    // An IRELATIVE slot (an ifunc the object calls itself, such as libc's
    // memset) names no symbol: its addend is the resolver, which the ifunc's
    // own symbol names; failing that, objdump's `*ABS*+0x...`.
    // Of aliases (index and strchr), the public name: [`preferred`].
    let mut ifuncs: HashMap<u64, &str> = HashMap::new();
    for symbol in symbols.symbols() {
        if symbol.elf_symbol().st_type() != object::elf::STT_GNU_IFUNC {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        let kept = ifuncs.entry(symbol.address()).or_insert(name);
        if preferred(name) < preferred(kept) {
            *kept = name;
        }
    }
    let slots: HashMap<u64, String> = relocations
        .filter_map(|(slot, relocation)| {
            let name = match relocation.target() {
                RelocationTarget::Symbol(index) => {
                    symbols.symbol_by_index(index).ok()?.name().ok()?.to_owned()
                }
                RelocationTarget::Absolute => {
                    let resolver = u64::try_from(relocation.addend()).ok()?;
                    ifuncs
                        .get(&resolver)
                        .map_or_else(|| format!("*ABS*+{resolver:#x}"), |n| (*n).to_owned())
                }
                _ => return None,
            };
            (!name.is_empty()).then_some((slot, name))
        })
        .collect();
    let mut stubs = Vec::new();
    for section in file.sections() {
        if !matches!(section.name(), Ok(".plt" | ".plt.sec" | ".plt.got")) {
            continue;
        }
        let Ok(bytes) = section.data() else {
            continue;
        };
        // Entries follow the lazy PLT's header (PLT0, which no slot names).
        let skip = if section.name() == Ok(".plt") {
            PLT_HEADER
        } else {
            0
        };
        let Some(entries) = bytes.get(skip as usize..) else {
            continue;
        };
        let entry = plt_entry_size(entries).unwrap_or_else(|| entry_size(&section));
        for (i, code) in entries.chunks_exact(entry as usize).enumerate() {
            // Wrapping: a damaged object may put a section anywhere.
            let addr = section
                .address()
                .wrapping_add(skip)
                .wrapping_add(i as u64 * entry);
            if let Some(name) = plt_slot(code, addr).and_then(|slot| slots.get(&slot)) {
                stubs.push(PltStub {
                    addr,
                    len: entry,
                    name: format!("{name}@plt"),
                });
            }
        }
    }
    stubs.sort_by_key(|s| s.addr);
    stubs
}

/// How one of several names for one function ranks (lowest first): the
/// fewest leading underscores (`mempcpy` before `__mempcpy`), then the
/// longest (`strchr` before its old alias `index`), then by bytes.
///
/// ```
/// use jitmap::unwind::preferred;
/// assert!(preferred("mempcpy") < preferred("__mempcpy"));
/// assert!(preferred("strchr") < preferred("index"));
/// ```
pub fn preferred(name: &str) -> (usize, std::cmp::Reverse<usize>, &str) {
    let underscores = name.len() - name.trim_start_matches('_').len();
    (underscores, std::cmp::Reverse(name.len()), name)
}

/// The section's entry size (`sh_entsize`), or the architecture's PLT
/// entry where the linker left it 0 or unlikely.
fn entry_size<'data, R: ReadRef<'data>>(section: &ElfSection64<'data, '_, LittleEndian, R>) -> u64 {
    let size = section.elf_section_header().sh_entsize.get(LittleEndian);
    if (4..=64).contains(&size) {
        size
    } else {
        PLT_ENTRY
    }
}

/// The stub holding `addr`, an address in the object, in `stubs` (sorted,
/// as [`plt_stubs`] returns them).
///
/// ```
/// use jitmap::unwind::{PltStub, plt_stub_at};
/// let stubs = [PltStub { addr: 0x1030, len: 16, name: "puts@plt".into() }];
/// assert_eq!(plt_stub_at(&stubs, 0x103f).map(|s| s.name.as_str()), Some("puts@plt"));
/// assert_eq!(plt_stub_at(&stubs, 0x1040), None);
/// ```
pub fn plt_stub_at(stubs: &[PltStub], addr: u64) -> Option<&PltStub> {
    let i = stubs.partition_point(|s| s.addr <= addr).checked_sub(1)?;
    stubs.get(i).filter(|s| addr - s.addr < s.len)
}

/// The ranges (address in the object, size) of `elf`'s PLT entries that no
/// FDE may describe and that change no register a step reads, so that a
/// walker steps them by the entry rule: the architecture's
/// `PLT_ENTRY_RULE_SECTIONS`, less the bytes at their start that do.
///
/// ```
/// assert!(jitmap::unwind::plt_entry_rule_ranges(&b"not an object"[..]).is_empty());
/// ```
pub fn plt_entry_rule_ranges<'data, R: ReadRef<'data>>(elf: R) -> Vec<(u64, u64)> {
    let Ok(file) = ElfFile64::<LittleEndian, R>::parse(elf) else {
        return Vec::new();
    };
    PLT_ENTRY_RULE_SECTIONS
        .iter()
        .filter_map(|&(name, skip)| {
            let section = file.section_by_name(name)?;
            let size = section.size().checked_sub(skip).filter(|&n| n > 0)?;
            Some((section.address().checked_add(skip)?, size))
        })
        .collect()
}
