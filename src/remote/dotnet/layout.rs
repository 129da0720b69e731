//! The one table of CoreCLR offsets: where each structure the user-space
//! readers ([`super::DotnetReader`], [`super::names`]) and the eBPF
//! profiler's program read keeps its fields, per runtime version. A
//! version whose layout is not here is refused, never guessed. What every
//! version since 7 shares is not in the table: the range map's five levels
//! of 256 entries over 128 KiB chunks, bit 0 of its entries and fragment
//! links (a collectible section), and the v1 nibble map's encoding, which
//! jitmap's own maps use too.
//!
//! The .NET 8.0.x entry is `dotnet/runtime` at v8.0.4 on 64-bit Linux
//! (`src/coreclr/vm/codeman.h`, `method.hpp`, `methodtable.h`, `ceeload.h`,
//! release builds), checked against a live 8.0.4 runtime by the cli's
//! `dotnet` tests. A patch level that moved a field would be one more entry
//! with a longer version prefix: the longest prefix that matches wins.

/// Where the fields of one runtime version lie, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DotnetLayout {
    /// The versions this entry describes: a prefix of `libcoreclr.so`'s
    /// version string (`8.0.` for every 8.0.x).
    pub versions: &'static str,
    /// `RangeSectionFragment`: its size, then its next link (tagged: bit 0
    /// flags a collectible section), range begin and end, and section.
    pub fragment_bytes: usize,
    /// Offset of the next fragment's (tagged) address.
    pub fragment_next: usize,
    /// Offset of the fragment's first address.
    pub fragment_begin: usize,
    /// Offset of one past the fragment's last address.
    pub fragment_end: usize,
    /// Offset of the fragment's `RangeSection`.
    pub fragment_section: usize,
    /// `RangeSection`: its size and fields.
    pub section_bytes: usize,
    /// Offset of the section's first address.
    pub section_low: usize,
    /// Offset of one past its last address.
    pub section_high: usize,
    /// Offset of its `RangeSectionFlags` (u32).
    pub section_flags: usize,
    /// Offset of its ReadyToRun `Module`.
    pub section_module: usize,
    /// Offset of its code heap's `HeapList`.
    pub section_heap_list: usize,
    /// Offset of its `CodeRangeMapRangeList`.
    pub section_range_list: usize,
    /// `CodeRangeMapRangeList::_rangeListType`: the `StubCodeBlockKind`
    /// (u32) of every stub in the list.
    pub range_list_type: usize,
    /// `RANGE_SECTION_CODEHEAP`.
    pub flag_code_heap: u32,
    /// `RANGE_SECTION_RANGELIST`.
    pub flag_range_list: u32,
    /// `RANGE_SECTION_COLLECTIBLE`: the section's code belongs to a
    /// collectible assembly, whose code and `MethodDesc`s are freed when it
    /// unloads and may be reused by the next one at the same addresses.
    pub flag_collectible: u32,
    /// `HeapList`: its size and fields.
    pub heap_list_bytes: usize,
    /// Offset of the heap's first code address.
    pub heap_start: usize,
    /// Offset of the heap's end.
    pub heap_end: usize,
    /// Offset of the base nibble-map offsets count from.
    pub heap_map_base: usize,
    /// Offset of the address of the heap's nibble map (`pHdrMap`).
    pub heap_header_map: usize,
    /// The word before each code start is a `RealCodeHeader` pointer, or a
    /// stub block's kind up to this value.
    pub stub_code_block_last: u64,
    /// `RealCodeHeader::phdrMDesc`.
    pub real_header_method_desc: usize,
    /// `RealCodeHeader::nUnwindInfos` (u32), followed by the method's
    /// `RUNTIME_FUNCTION`s (begin, end and unwind data: u32 offsets from
    /// the code heap's base), the main body's first.
    pub real_header_unwind_infos: usize,
    /// `MethodDesc`: the token's low bits (u16, masked), its chunk index
    /// (u8) and its flags (u16, low three bits the classification).
    pub desc_token_remainder: usize,
    /// Offset of the `MethodDesc`'s index in its chunk.
    pub desc_chunk_index: usize,
    /// Offset of the `MethodDesc`'s flags.
    pub desc_flags: usize,
    /// Bytes of a `MethodDesc` read.
    pub desc_bytes: usize,
    /// The chunk index's unit.
    pub desc_alignment: u64,
    /// `MethodDescChunk`: its size (it ends where its first desc begins),
    /// its `MethodTable` and the token's high bits (u16, masked).
    pub chunk_bytes: usize,
    /// Offset of the chunk's `MethodTable`.
    pub chunk_method_table: usize,
    /// Offset of the chunk's token range.
    pub chunk_token_range: usize,
    /// `MethodTable::m_pModule`.
    pub method_table_module: u64,
    /// `Module::m_pSimpleName` (x86-64).
    pub module_simple_name: u64,
}

impl DotnetLayout {
    /// Every field a reader reads in a structure it reads whole: (offset,
    /// width, the structure's size), for readers to check against the
    /// buffers they read into.
    pub fn fields(&self) -> [(usize, usize, usize); 19] {
        let l = self;
        [
            (l.fragment_next, 8, l.fragment_bytes),
            (l.fragment_begin, 8, l.fragment_bytes),
            (l.fragment_end, 8, l.fragment_bytes),
            (l.fragment_section, 8, l.fragment_bytes),
            (l.section_low, 8, l.section_bytes),
            (l.section_high, 8, l.section_bytes),
            (l.section_flags, 4, l.section_bytes),
            (l.section_module, 8, l.section_bytes),
            (l.section_heap_list, 8, l.section_bytes),
            (l.section_range_list, 8, l.section_bytes),
            (l.heap_start, 8, l.heap_list_bytes),
            (l.heap_end, 8, l.heap_list_bytes),
            (l.heap_map_base, 8, l.heap_list_bytes),
            (l.heap_header_map, 8, l.heap_list_bytes),
            (l.desc_token_remainder, 2, l.desc_bytes),
            (l.desc_chunk_index, 1, l.desc_bytes),
            (l.desc_flags, 2, l.desc_bytes),
            (l.chunk_method_table, 8, l.chunk_bytes),
            (l.chunk_token_range, 2, l.chunk_bytes),
        ]
    }
}

/// Every layout known, one entry per set of versions that share it.
pub const LAYOUTS: &[DotnetLayout] = &[DotnetLayout {
    versions: "8.0.",
    fragment_bytes: 32,
    fragment_next: 0,
    fragment_begin: 8,
    fragment_end: 16,
    fragment_section: 24,
    section_bytes: 0x38,
    section_low: 0x0,
    section_high: 0x8,
    section_flags: 0x10,
    section_module: 0x20,
    section_heap_list: 0x28,
    section_range_list: 0x30,
    range_list_type: 0x120,
    flag_code_heap: 0x2,
    flag_range_list: 0x4,
    flag_collectible: 0x1,
    heap_list_bytes: 0x30,
    heap_start: 0x10,
    heap_end: 0x18,
    heap_map_base: 0x20,
    heap_header_map: 0x28,
    stub_code_block_last: 0xF,
    real_header_method_desc: 0x18,
    real_header_unwind_infos: 0x20,
    desc_token_remainder: 0x0,
    desc_chunk_index: 0x2,
    desc_flags: 0x6,
    desc_bytes: 0x8,
    desc_alignment: 0x8,
    chunk_bytes: 0x18,
    chunk_method_table: 0x0,
    chunk_token_range: 0x12,
    method_table_module: 0x18,
    module_simple_name: 0x108,
}];

/// The layout of runtime `version` (`libcoreclr.so`'s version string), if
/// one is known: the entry with the longest matching prefix.
///
/// ```
/// use jitmap::remote::dotnet::layout::layout_for;
/// assert_eq!(layout_for("8.0.424.16909").map(|l| l.versions), Some("8.0."));
/// assert_eq!(layout_for("9.0.100.1"), None);
/// ```
pub fn layout_for(version: &str) -> Option<&'static DotnetLayout> {
    LAYOUTS
        .iter()
        .filter(|l| version.starts_with(l.versions))
        .max_by_key(|l| l.versions.len())
}

/// The .NET 8.0.x layout, for the readers' tests.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn net8() -> &'static DotnetLayout {
    &LAYOUTS[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of every entry lies inside the structure the readers
    /// read for it, so that no reader indexes past what it read.
    #[test]
    fn every_field_lies_inside_its_structure() {
        for l in LAYOUTS {
            for (i, (off, width, size)) in l.fields().into_iter().enumerate() {
                assert!(off + width <= size, "{}: field {i} at {off:#x}", l.versions);
            }
        }
    }
}
