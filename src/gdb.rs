//! The GDB JIT interface: each method of a heap that opts in
//! ([`crate::HeapConfig::gdb_jit`]) is announced to an attached debugger as a small
//! in-memory ELF object naming it, so a breakpoint on it, or `bt` through it,
//! shows its name.
//!
//! The interface is two symbols that gdb looks up: `__jit_debug_descriptor`, a
//! list of in-memory object files, and `__jit_debug_register_code`, a function on
//! which gdb breaks to read the change. A process holds one of each: another
//! JIT library that defines them too (LLVM's, wasmtime's) cannot be linked in.
//!
//! Each object carries a `.text` section without contents at the method's
//! address and one function symbol covering the method; when the method has
//! debug rows, also DWARF (a compile unit, a subprogram and a line table, built
//! with gimli), so gdb shows file and line inside JIT code.

use std::ptr;

use gimli::write::{
    Address, AttributeValue, DwarfUnit, EndianVec, LineProgram, LineString, Sections,
};
use gimli::{Encoding, Format, LineEncoding, LittleEndian};
use object::elf;
use object::write::elf::{FileHeader, SectionHeader, Sym, Writer};

use crate::info::DebugEntry;

use parking_lot::Mutex;

/// One object in the debugger's list.
#[repr(C)]
struct JitCodeEntry {
    next: *mut JitCodeEntry,
    prev: *mut JitCodeEntry,
    symfile_addr: *const u8,
    symfile_size: u64,
}

/// The list gdb reads, with what changed last.
#[repr(C)]
pub struct JitDescriptor {
    version: u32,
    action_flag: u32,
    relevant_entry: *mut JitCodeEntry,
    first_entry: *mut JitCodeEntry,
}

const JIT_NOACTION: u32 = 0;
const JIT_REGISTER_FN: u32 = 1;
const JIT_UNREGISTER_FN: u32 = 2;

/// The descriptor gdb finds by name. Written only under [`LOCK`].
// SAFETY: the GDB JIT interface fixes this name; no other item of this crate
// exports it, and the module docs say a process can hold only one.
#[unsafe(no_mangle)]
#[used]
pub static mut __jit_debug_descriptor: JitDescriptor = JitDescriptor {
    version: 1,
    action_flag: JIT_NOACTION,
    relevant_entry: ptr::null_mut(),
    first_entry: ptr::null_mut(),
};

/// gdb puts a breakpoint here and reads the descriptor when it is hit.
// SAFETY: as for `__jit_debug_descriptor`: a name the interface fixes, exported once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn __jit_debug_register_code() {
    // An empty asm block: a side effect the compiler must keep, so the calls to
    // this function (and the function itself) are never optimized away.
    // SAFETY: the block contains no instructions.
    unsafe { std::arch::asm!("", options(nostack, preserves_flags)) };
}

/// Serializes every change to the descriptor's list.
static LOCK: Mutex<()> = parking_lot::const_mutex(());

/// A method announced to debuggers; withdrawn when this value drops.
pub(crate) struct GdbRegistration {
    entry: Box<JitCodeEntry>,
    _object: Box<[u8]>,
}

// SAFETY: the entry and object are only touched under `LOCK` (and read by a
// debugger while the process is stopped).
unsafe impl Send for GdbRegistration {}
// SAFETY: as above.
unsafe impl Sync for GdbRegistration {}

impl GdbRegistration {
    /// Announces `name` at `[addr, addr + size)`, with its debug rows.
    pub(crate) fn new(name: &str, addr: u64, size: u64, rows: &[DebugEntry]) -> Self {
        let object =
            elf_object(name, addr, size, &dwarf(name, addr, size, rows)).into_boxed_slice();
        let mut entry = Box::new(JitCodeEntry {
            next: ptr::null_mut(),
            prev: ptr::null_mut(),
            symfile_addr: object.as_ptr(),
            symfile_size: object.len() as u64,
        });
        let _lock = LOCK.lock();
        let descriptor = &raw mut __jit_debug_descriptor;
        // SAFETY: the descriptor and every linked entry are only changed under
        // `LOCK`, which we hold; linked entries are boxed and unlinked before
        // they are freed.
        unsafe {
            entry.next = (*descriptor).first_entry;
            let entry_ptr: *mut JitCodeEntry = &mut *entry;
            if !entry.next.is_null() {
                (*entry.next).prev = entry_ptr;
            }
            (*descriptor).first_entry = entry_ptr;
            (*descriptor).relevant_entry = entry_ptr;
            (*descriptor).action_flag = JIT_REGISTER_FN;
            __jit_debug_register_code();
            (*descriptor).action_flag = JIT_NOACTION;
        }
        Self {
            entry,
            _object: object,
        }
    }
}

impl Drop for GdbRegistration {
    fn drop(&mut self) {
        let _lock = LOCK.lock();
        let descriptor = &raw mut __jit_debug_descriptor;
        let entry: *mut JitCodeEntry = &mut *self.entry;
        // SAFETY: as in `new`; this entry is linked (by `new`) and is unlinked here,
        // once, under the lock.
        unsafe {
            let (prev, next) = ((*entry).prev, (*entry).next);
            if prev.is_null() {
                (*descriptor).first_entry = next;
            } else {
                (*prev).next = next;
            }
            if !next.is_null() {
                (*next).prev = prev;
            }
            (*descriptor).relevant_entry = entry;
            (*descriptor).action_flag = JIT_UNREGISTER_FN;
            __jit_debug_register_code();
            (*descriptor).action_flag = JIT_NOACTION;
        }
    }
}

/// A name gimli accepts in a line program: not empty, no NUL.
fn line_string(s: &str) -> LineString {
    let bytes: Vec<u8> = s.bytes().map(|b| if b == 0 { b'?' } else { b }).collect();
    LineString::String(if bytes.is_empty() {
        b"?".to_vec()
    } else {
        bytes
    })
}

/// DWARF sections (name, contents) for a method with debug rows; none without.
/// Addresses are absolute, so the object needs no relocations.
fn dwarf(name: &str, addr: u64, size: u64, rows: &[DebugEntry]) -> Vec<(&'static str, Vec<u8>)> {
    let Some(first) = rows.first() else {
        return Vec::new();
    };
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 4,
        address_size: 8,
    };
    let mut unit = DwarfUnit::new(encoding);
    let mut program = LineProgram::new(
        encoding,
        LineEncoding::default(),
        LineString::String(b"/".to_vec()),
        line_string(&first.file),
        None,
    );
    let directory = program.default_directory();
    program.begin_sequence(Some(Address::Constant(addr)));
    for row in rows {
        let file = program.add_file(line_string(&row.file), directory, None);
        let r = program.row();
        r.address_offset = u64::from(row.offset);
        r.file = file;
        r.line = u64::from(row.line);
        r.column = u64::from(row.column);
        program.generate_row();
    }
    program.end_sequence(size);
    unit.unit.line_program = program;
    let root = unit.unit.root();
    let name_id = unit.strings.add(name.as_bytes().to_vec());
    let file_id = unit.strings.add(first.file.as_bytes().to_vec());
    let cu = unit.unit.get_mut(root);
    cu.set(gimli::DW_AT_name, AttributeValue::StringRef(file_id));
    cu.set(
        gimli::DW_AT_low_pc,
        AttributeValue::Address(Address::Constant(addr)),
    );
    cu.set(gimli::DW_AT_high_pc, AttributeValue::Udata(size));
    let subprogram = unit.unit.add(root, gimli::DW_TAG_subprogram);
    let sp = unit.unit.get_mut(subprogram);
    sp.set(gimli::DW_AT_name, AttributeValue::StringRef(name_id));
    sp.set(gimli::DW_AT_external, AttributeValue::Flag(true));
    sp.set(
        gimli::DW_AT_low_pc,
        AttributeValue::Address(Address::Constant(addr)),
    );
    sp.set(gimli::DW_AT_high_pc, AttributeValue::Udata(size));
    let mut sections = Sections::new(EndianVec::new(LittleEndian));
    if unit.write(&mut sections).is_err() {
        // Only an inconsistent unit fails to write; the symbol alone still helps.
        return Vec::new();
    }
    let mut out = Vec::new();
    let _ = sections.for_each(|id, data| {
        if !data.slice().is_empty() {
            out.push((id.name(), data.slice().to_vec()));
        }
        Ok::<(), ()>(())
    });
    out
}

/// A relocatable ELF object with a contentless `.text` section at `addr`, one
/// global function symbol `name` covering it, and the given `dwarf` sections.
fn elf_object(name: &str, addr: u64, size: u64, dwarf: &[(&'static str, Vec<u8>)]) -> Vec<u8> {
    let mut buffer = Vec::new();
    let mut w = Writer::new(object::Endianness::Little, true, &mut buffer);
    w.reserve_file_header();
    w.reserve_null_section_index();
    let text_name = w.add_section_name(b".text");
    let text = w.reserve_section_index();
    let debug: Vec<_> = dwarf
        .iter()
        .map(|(section, data)| {
            let name = w.add_section_name(section.as_bytes());
            (name, w.reserve_section_index(), data)
        })
        .collect();
    let offsets: Vec<usize> = debug
        .iter()
        .map(|(_, _, data)| w.reserve(data.len(), 1))
        .collect();
    let symbol_name = w.add_string(name.as_bytes());
    w.reserve_null_symbol_index();
    w.reserve_symbol_index(Some(text));
    w.reserve_symtab_section_index();
    w.reserve_symtab();
    w.reserve_strtab_section_index();
    w.reserve_strtab();
    w.reserve_shstrtab_section_index();
    w.reserve_shstrtab();
    w.reserve_section_headers();
    let machine = crate::arch::ELF_MACHINE;
    // Writing into a Vec cannot fail; the header's fields are all in range.
    let _ = w.write_file_header(&FileHeader {
        os_abi: elf::ELFOSABI_NONE,
        abi_version: 0,
        e_type: elf::ET_REL,
        e_machine: machine,
        e_entry: 0,
        e_flags: 0,
    });
    for (_, _, data) in &debug {
        w.write(data);
    }
    w.write_null_symbol();
    w.write_symbol(&Sym {
        name: Some(symbol_name),
        section: Some(text),
        st_info: (elf::STB_GLOBAL << 4) | elf::STT_FUNC,
        st_other: elf::STV_DEFAULT,
        st_shndx: 0,
        // Relative to `.text`, as in any relocatable object; gdb places the
        // section at its `sh_addr`.
        st_value: 0,
        st_size: size,
    });
    w.write_strtab();
    w.write_shstrtab();
    w.write_null_section_header();
    w.write_section_header(&SectionHeader {
        name: Some(text_name),
        sh_type: elf::SHT_NOBITS,
        sh_flags: u64::from(elf::SHF_ALLOC | elf::SHF_EXECINSTR),
        sh_addr: addr,
        sh_offset: 0,
        sh_size: size,
        sh_link: 0,
        sh_info: 0,
        sh_addralign: 1,
        sh_entsize: 0,
    });
    for ((name, _, data), offset) in debug.iter().zip(offsets) {
        w.write_section_header(&SectionHeader {
            name: Some(*name),
            sh_type: elf::SHT_PROGBITS,
            sh_flags: 0,
            sh_addr: 0,
            sh_offset: offset as u64,
            sh_size: data.len() as u64,
            sh_link: 0,
            sh_info: 0,
            sh_addralign: 1,
            sh_entsize: 0,
        });
    }
    w.write_symtab_section_header(1);
    w.write_strtab_section_header();
    w.write_shstrtab_section_header();
    buffer
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSection, ObjectSymbol};

    use super::*;

    #[test]
    fn the_object_names_the_method_at_its_address() {
        let bytes = elf_object("tier1::answer", 0x7f00_1234_0010, 0x40, &[]);
        let file = object::File::parse(&*bytes).unwrap();
        let text = file.section_by_name(".text").unwrap();
        assert_eq!((text.address(), text.size()), (0x7f00_1234_0010, 0x40));
        let symbols: Vec<_> = file
            .symbols()
            .map(|s| (s.name().unwrap().to_owned(), s.address(), s.size()))
            .collect();
        // Relative to `.text`, which sits at the method's address.
        assert_eq!(symbols, vec![("tier1::answer".to_owned(), 0, 0x40)]);
    }
}
