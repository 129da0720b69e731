//! Finding a symbol in another process: its mappings in `/proc/PID/maps`, the
//! ELF files behind them, their dynamic (then full) symbol tables, and each
//! file's load bias.

use std::collections::BTreeMap;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

use super::RemoteError;

/// The name the descriptor is exported under.
pub const DESCRIPTOR_SYMBOL: &str = "jitmap_descriptor";

/// The ELF section that holds the descriptor alone, which a stripped host
/// keeps: `strip` removes the symbol tables but not the section headers.
pub const DESCRIPTOR_SECTION: &str = "jitmap.descriptor";

/// One file-backed mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// Whether its code may run (`x` in its permissions).
    pub executable: bool,
    /// The file's device (major in the high 32 bits, minor in the low) and
    /// inode: which file it is, whatever path it was opened by.
    pub file: (u64, u64),
    /// The file's path (`[vdso]` for the vDSO, from
    /// [`parse_executable_maps`]).
    pub path: String,
}

/// The file-backed mappings of process `pid`, in address order.
pub fn mappings(pid: i32) -> Result<Vec<Mapping>, RemoteError> {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| RemoteError::Proc {
            pid,
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        })?;
    Ok(parse_maps(&text))
}

/// Parses the text of `/proc/PID/maps`, keeping mappings of absolute paths.
///
/// ```
/// use jitmap::remote::process::parse_maps;
/// let maps = "7f00-7f10 r-xp 00001000 fd:01 77 /lib/libx.so\n7f20-7f30 rw-p 00000000 00:00 0 \n";
/// let m = &parse_maps(maps)[..];
/// assert_eq!((m.len(), m[0].start, m[0].offset, m[0].executable), (1, 0x7f00, 0x1000, true));
/// assert_eq!(m[0].file, ((0xfd << 32) | 1, 77));
/// ```
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(parse_line)
        .filter(|m| m.path.starts_with('/'))
        .collect()
}

/// The executable mappings an unwinder can read the code of: those of files,
/// and the vDSO (path `[vdso]`, read from the process's memory).
/// Anonymous code (a JIT's) is not listed.
///
/// ```
/// use jitmap::remote::process::parse_executable_maps;
/// let maps = "\
/// 1000-2000 r--p 00000000 fd:01 9 /bin/host
/// 2000-3000 r-xp 00001000 fd:01 9 /bin/host
/// 4000-5000 rwxp 00000000 00:00 0
/// 6000-8000 r-xp 00000000 00:00 0 [vdso]
/// 9000-8000 r-xp 00000000 fd:01 9 /bin/reversed
/// ";
/// let paths: Vec<_> = parse_executable_maps(maps).into_iter().map(|m| (m.start, m.path)).collect();
/// assert_eq!(paths, [(0x2000, "/bin/host".to_owned()), (0x6000, "[vdso]".to_owned())]);
/// ```
pub fn parse_executable_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(parse_line)
        .filter(|m| m.executable && (m.path.starts_with('/') || m.path == "[vdso]"))
        .collect()
}

/// One line of `/proc/PID/maps`: `start-end perms offset major:minor inode
/// [path]`; `None` for a line that is not one, or whose range is empty or
/// reversed.
fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode = fields.next()?.parse().ok()?;
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let (start, end) = (hex(start)?, hex(end)?);
    if end <= start {
        return None;
    }
    Some(Mapping {
        start,
        end,
        offset: hex(offset)?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        file: ((hex(major)? << 32) | hex(minor)?, inode),
        path: fields.collect::<Vec<_>>().join(" "),
    })
}

/// The address of `symbol` in process `pid`: the first mapped ELF file that
/// defines it (dynamic symbols first, then the full symbol table), plus that
/// file's load bias.
///
/// ```
/// use jitmap::remote::process::{DESCRIPTOR_SYMBOL, find_symbol};
/// let pid = std::process::id() as i32;
/// // This test binary links jitmap, so it defines the descriptor.
/// assert_eq!(find_symbol(pid, DESCRIPTOR_SYMBOL)?, jitmap::remote::descriptor_address());
/// # Ok::<(), jitmap::remote::RemoteError>(())
/// ```
pub fn find_symbol(pid: i32, symbol: &'static str) -> Result<u64, RemoteError> {
    find_symbol_in(pid, |_| true, symbol).map(|(addr, _)| addr)
}

/// [`find_symbol`] in the mapped files whose path `wanted` accepts; also
/// returns the path of the file that defines it.
pub fn find_symbol_in(
    pid: i32,
    wanted: impl Fn(&str) -> bool,
    symbol: &'static str,
) -> Result<(u64, String), RemoteError> {
    find_symbol_file(pid, wanted, symbol).map(|f| (f.symbol, f.path))
}

/// A mapped ELF file found by a symbol it defines ([`find_symbol_file`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolFile {
    /// The symbol's address in the process.
    pub symbol: u64,
    /// The file's path, as the process's mappings give it.
    pub path: String,
    /// The addresses it occupies once loaded, its zero-filled data
    /// (`.bss`) included: from its first page to the end of its last
    /// loaded segment in memory; `None` for a file without segments, or
    /// whose segments' ends do not fit.
    pub extent: Option<(u64, u64)>,
    /// Its bytes, read once through [`read_mapped`].
    pub bytes: Vec<u8>,
}

/// [`find_symbol_in`], with what else the file holds: where it lies once
/// loaded, and its bytes (the very file mapped), so that a caller that
/// needs more of it (a version string, say) does not read it again.
///
/// ```
/// use jitmap::remote::process::find_symbol_file;
/// let pid = std::process::id() as i32;
/// let f = find_symbol_file(pid, |_| true, "getpid")?;
/// assert_eq!(f.symbol, libc::getpid as usize as u64);
/// let (lo, hi) = f.extent.unwrap();
/// assert!(lo <= f.symbol && f.symbol < hi);
/// assert_eq!(&f.bytes[..4], b"\x7fELF");
/// # Ok::<(), jitmap::remote::RemoteError>(())
/// ```
pub fn find_symbol_file(
    pid: i32,
    wanted: impl Fn(&str) -> bool,
    symbol: &'static str,
) -> Result<SymbolFile, RemoteError> {
    find_in_files(pid, wanted, |elf| symbol_value(elf, symbol))
        .ok_or(RemoteError::SymbolNotFound { pid, symbol })?
}

/// The first mapped ELF file (of those whose path `wanted` accepts) in
/// which `value` finds an address (a file's virtual address, before its
/// load bias): that address in the process, with the file. `None` when no
/// file gives one.
fn find_in_files(
    pid: i32,
    wanted: impl Fn(&str) -> bool,
    value: impl Fn(&object::File<'_>) -> Option<u64>,
) -> Option<Result<SymbolFile, RemoteError>> {
    let maps = match mappings(pid) {
        Ok(maps) => maps,
        Err(e) => return Some(Err(e)),
    };
    // Each file's mapping of offset 0 is its first loaded page.
    let mut files: BTreeMap<&str, &Mapping> = BTreeMap::new();
    for m in maps.iter().filter(|m| m.offset == 0 && wanted(&m.path)) {
        files.entry(&m.path).or_insert(m);
    }
    files.into_iter().find_map(|(path, m)| {
        let bytes = read_mapped(pid, m, MAX_ELF_BYTES)?;
        let elf = object::File::parse(&*bytes).ok()?;
        let bias = load_bias(&elf, m.start)?;
        let symbol = value(&elf)?.checked_add(bias)?;
        // Where it lies once loaded, when that can be said: a file
        // without it is still the one that defines the symbol.
        let extent = elf
            .segments()
            .map(|s| s.address().checked_add(s.size()))
            .try_fold(None, |top: Option<u64>, end| Some(top.max(Some(end?))))
            .flatten()
            .and_then(|end| Some((m.start, end.checked_add(bias)?)));
        Some(Ok(SymbolFile {
            symbol,
            path: path.to_string(),
            extent,
            bytes,
        }))
    })
}

/// The largest ELF file [`find_descriptor`] and [`find_symbol`] read.
const MAX_ELF_BYTES: u64 = 1 << 30;

/// The bytes of the file mapping `m` of process `pid` maps, when it is at
/// most `limit` bytes long: read through `/proc/PID/map_files`, which opens
/// the very file mapped (in the process's mount namespace, and even if it
/// was deleted or replaced since), or, where that link cannot be followed,
/// through the mapping's path when the file there is the one mapped (same
/// device and inode). `None` when neither can be read.
///
/// The file is read, not mapped: it belongs to another process's user, and
/// a mapping of a file rewritten during the read would be undefined
/// behaviour (Rust assumes the bytes behind a shared slice do not change),
/// not only a SIGBUS.
///
/// ```
/// use jitmap::remote::process::{mappings, read_mapped};
/// let pid = std::process::id() as i32;
/// let exe = std::fs::canonicalize("/proc/self/exe")?;
/// let m = mappings(pid)?
///     .into_iter()
///     .find(|m| m.offset == 0 && std::path::Path::new(&m.path) == exe)
///     .unwrap();
/// let bytes = read_mapped(pid, &m, 1 << 40).unwrap();
/// assert_eq!(&bytes[..4], b"\x7fELF");
/// // Longer than the limit: not read.
/// assert_eq!(read_mapped(pid, &m, 16), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read_mapped(pid: i32, m: &Mapping, limit: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let link = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    let file = std::fs::File::open(&link).ok().or_else(|| {
        let file = std::fs::File::open(&m.path).ok()?;
        let meta = file.metadata().ok()?;
        let dev = meta.dev();
        let id = (
            (u64::from(libc::major(dev)) << 32) | u64::from(libc::minor(dev)),
            meta.ino(),
        );
        (id == m.file).then_some(file)
    })?;
    let len = file.metadata().ok()?.len();
    if len > limit {
        return None;
    }
    let mut data = Vec::with_capacity(len as usize);
    file.take(limit).read_to_end(&mut data).ok()?;
    Some(data)
}

/// `symbol`'s value in an ELF file (dynamic symbols first), or `None` when
/// the file does not define it.
fn symbol_value(elf: &object::File<'_>, symbol: &str) -> Option<u64> {
    let found = elf
        .dynamic_symbols()
        .chain(elf.symbols())
        .find(|s| s.is_definition() && s.name() == Ok(symbol))?;
    Some(found.address())
}

/// The descriptor's address in an ELF file: its symbol's value, or, in a
/// file stripped of its symbol tables, the start of [`DESCRIPTOR_SECTION`]
/// (of any size from 16 bytes: the reader checks the layout it finds).
fn descriptor_value(elf: &object::File<'_>) -> Option<u64> {
    symbol_value(elf, DESCRIPTOR_SYMBOL).or_else(|| {
        let section = elf.section_by_name(DESCRIPTOR_SECTION)?;
        // Room for the magic and the layout version at least: a descriptor
        // of another layout is found, and the reader says what differs.
        (section.size() >= 16).then(|| section.address())
    })
}

/// What to add to the file's virtual addresses, given where its first page is
/// mapped.
fn load_bias(elf: &object::File<'_>, first: u64) -> Option<u64> {
    let bias = match elf.kind() {
        object::ObjectKind::Dynamic => {
            // The segment loaded from file offset 0, page-aligned down.
            let low = elf
                .segments()
                .filter(|s| s.file_range().0 == 0)
                .map(|s| s.address())
                .min()?;
            first.checked_sub(low & !0xFFF)?
        }
        _ => 0,
    };
    Some(bias)
}

/// The address of the jitmap descriptor in process `pid`: its symbol in the
/// first mapped ELF file that defines it, or, in a host stripped of its
/// symbol tables, its section ([`DESCRIPTOR_SECTION`]).
///
/// ```
/// use jitmap::remote::process::find_descriptor;
/// let pid = std::process::id() as i32;
/// assert_eq!(find_descriptor(pid)?, jitmap::remote::descriptor_address());
/// # Ok::<(), jitmap::remote::RemoteError>(())
/// ```
pub fn find_descriptor(pid: i32) -> Result<u64, RemoteError> {
    find_in_files(pid, |_| true, descriptor_value)
        .ok_or(RemoteError::DescriptorNotFound { pid })?
        .map(|f| f.symbol)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::write::{Object as Writer, StandardSegment};
    use object::{Architecture, BinaryFormat, Endianness, SectionKind};

    /// An ELF object with a `jitmap.descriptor` section of `size` bytes and
    /// no symbol naming it: a stripped host's, of this layout or another.
    fn object_with_section(size: usize) -> Vec<u8> {
        let mut obj = Writer::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
        let id = obj.add_section(
            obj.segment_name(StandardSegment::Data).to_vec(),
            DESCRIPTOR_SECTION.as_bytes().to_vec(),
            SectionKind::Data,
        );
        obj.append_section_data(id, &vec![0u8; size], 8);
        obj.write().unwrap()
    }

    #[test]
    fn a_descriptor_section_of_any_layout_is_found_and_a_shorter_one_is_not() {
        for (size, found) in [
            (size_of::<super::super::Descriptor>(), true),
            (24, true),
            (15, false),
        ] {
            let data = object_with_section(size);
            let elf = object::File::parse(&*data).unwrap();
            let section = elf.section_by_name(DESCRIPTOR_SECTION).unwrap();
            assert_eq!(
                descriptor_value(&elf),
                found.then(|| section.address()),
                "{size} bytes"
            );
        }
    }
}
