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
    LittleEndian, Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationTarget,
};

use crate::arch::{PLT_ENTRY, plt_slot};

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
/// address. Entries whose slot no relocation names (the lazy PLT's first
/// entry, `IRELATIVE` slots) are left out; so is everything in an object
/// that does not parse.
///
/// ```
/// // Not an ELF file: no entries.
/// assert!(jitmap::unwind::plt_stubs(b"not an object").is_empty());
/// ```
pub fn plt_stubs(elf: &[u8]) -> Vec<PltStub> {
    let Ok(file) = ElfFile64::<LittleEndian>::parse(elf) else {
        return Vec::new();
    };
    let (Some(relocations), Some(symbols)) =
        (file.dynamic_relocations(), file.dynamic_symbol_table())
    else {
        return Vec::new();
    };
    let slots: HashMap<u64, String> = relocations
        .filter_map(|(slot, relocation)| {
            let RelocationTarget::Symbol(index) = relocation.target() else {
                return None;
            };
            let name = symbols.symbol_by_index(index).ok()?.name().ok()?;
            (!name.is_empty()).then(|| (slot, name.to_owned()))
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
        let entry = entry_size(&section);
        for (i, code) in bytes.chunks_exact(entry as usize).enumerate() {
            let addr = section.address() + i as u64 * entry;
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

/// The section's entry size (`sh_entsize`), or the architecture's PLT
/// entry where the linker left it 0 or unlikely.
fn entry_size(section: &ElfSection64<'_, '_, LittleEndian>) -> u64 {
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
