//! Names for a CoreCLR 8 `MethodDesc`, read from outside the process:
//! the `MethodDesc` and its chunk give the method's `MethodDef` token and
//! its `MethodTable`, whose `Module` points (by its simple name) into the
//! assembly's PE file as the process maps it; that file's metadata
//! ([`super::metadata`]) names the token. The result is the runtime's own
//! perf-map form, `[Assembly] Namespace.Type+Nested::Method`, without the
//! return type, the signature and generic arguments.
//!
//! The offsets come from the runtime's entry in [`super::layout::LAYOUTS`]
//! (.NET 8.0.x on x86-64 Linux), checked against a live runtime. In a process of another architecture (aarch64, whose `Module`
//! differs) a name is refused rather than guessed; the reader's own
//! architecture does not matter.
//!
//! A [`MethodNames`] remembers what it read until [`MethodNames::forget`]:
//! it names one snapshot of a process. A `MethodDesc` or `Module` freed with
//! its collectible assembly may be reused at the same address for another
//! method, so a long-lived namer must forget between snapshots.

use std::collections::HashMap;
use std::rc::Rc;

use super::super::RemoteError;
use super::super::checks::{read_at, read_u16_at as u16_at};
use super::super::memory::Memory;
use super::super::process::{Mapping, read_mapped};
use super::layout::DotnetLayout;
use super::metadata::Metadata;

/// Bits of the token in the `MethodDesc` (the rest are in its chunk).
const TOKEN_REMAINDER_BITS: u32 = 12;
const TOKEN_REMAINDER_MASK: u16 = 0x0FFF;
const TOKEN_RANGE_MASK: u16 = 0x0FFF;

/// What names a method of a collectible assembly, as an eBPF program reads
/// it while the method runs: its metadata row and a hash of its module's
/// simple name ([`name_hash`]). Such an assembly's code, `MethodDesc`s and
/// `Module` are freed when it unloads, and the next assembly loaded may
/// get the very same addresses; a name read later is the sampled method's
/// only if it was read with the same identity ([`MethodNames::name_if`]).
///
/// ```
/// use jitmap::remote::dotnet::names::{MethodIdentity, name_hash};
///
/// // The MethodDesc's u16 (flag bits above the token's 12 ignored), then
/// // the chunk's, as the program packs them.
/// let hash = name_hash(0x7000, b"Contoso.PluginA\0");
/// let id = MethodIdentity::from_raw(0x8003 | 0x1000_0000, hash);
/// assert_eq!(id.rid, 3);
/// assert_ne!(hash, name_hash(0x7000, b"Contoso.PluginB\0"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MethodIdentity {
    /// The method's row in its module's `MethodDef` table.
    pub rid: u32,
    /// [`name_hash`] of its module's simple name.
    pub name_hash: u64,
}

/// Bytes at a module's simple name an identity covers: [`NAME_BYTES`], or,
/// when those cannot be read (the name ends just before an unmapped
/// page), up to the end of the name's page.
pub fn name_window(name: u64) -> usize {
    (4096 - (name % 4096) as usize).min(NAME_BYTES)
}

/// Bytes at a module's simple name an identity hashes: the name, and
/// whatever follows it up to there (the image's next strings, which do not
/// change while it is loaded).
pub const NAME_BYTES: usize = 32;

/// The multiplier of [`name_hash`] (2^64 over the golden ratio, odd).
pub const NAME_HASH_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// The hash of a module's simple name in a [`MethodIdentity`]: its address
/// times [`NAME_HASH_MULTIPLIER`], then for each little-endian word of the
/// bytes read there (at most [`NAME_BYTES`], zeros after), XOR the word
/// and multiply again; the high half is XORed into the low. Multiplying
/// between words keeps a change of address from cancelling a change of
/// name. The eBPF program computes the same.
pub fn name_hash(name: u64, bytes: &[u8]) -> u64 {
    let mut window = [0u8; NAME_BYTES];
    let n = bytes.len().min(NAME_BYTES);
    window[..n].copy_from_slice(&bytes[..n]);
    let hash =
        window
            .chunks_exact(8)
            .fold(name.wrapping_mul(NAME_HASH_MULTIPLIER), |hash, word| {
                let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
                (hash ^ word).wrapping_mul(NAME_HASH_MULTIPLIER)
            });
    hash ^ hash >> 32
}

impl MethodIdentity {
    /// From the raw `MethodDesc` token bits (low 16) and its chunk's (high
    /// 16), and the name's hash.
    pub fn from_raw(token_bits: u32, name_hash: u64) -> Self {
        let remainder = (token_bits as u16) & TOKEN_REMAINDER_MASK;
        let range = ((token_bits >> 16) as u16) & TOKEN_RANGE_MASK;
        Self {
            rid: (u32::from(range) << TOKEN_REMAINDER_BITS) | u32::from(remainder),
            name_hash,
        }
    }
}
/// The largest assembly file read for its metadata.
const MAX_ASSEMBLY_BYTES: u64 = 512 << 20;
/// `MethodClassification` values that carry no `MethodDef` of their own.
const CLASSIFICATION_MASK: u16 = 0x7;
const MC_ARRAY: u16 = 4;
const MC_DYNAMIC: u16 = 7;
/// Longest simple name read.
const MAX_SIMPLE_NAME: usize = 1024;

/// A method's name, or why it has none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MethodName {
    /// Named from its assembly's metadata.
    Named {
        /// The assembly's simple name (`System.Private.CoreLib`).
        assembly: String,
        /// `Namespace.Type+Nested::Method`.
        method: String,
    },
    /// A dynamic method (`DynamicMethod`, LINQ expression trees, IL
    /// stubs), which has no metadata row of its own.
    Dynamic {
        /// Its `MethodDesc`.
        method_desc: u64,
    },
    /// An array type's accessor (`Get`, `Set`, `Address`, `.ctor`), which
    /// the runtime makes without metadata.
    ArrayAccessor,
    /// Its module maps no file this reader could read: a dynamic module
    /// (Reflection.Emit), whose metadata lives on the runtime's heap, or an
    /// assembly loaded from bytes.
    NoFile {
        /// The assembly's simple name.
        assembly: String,
        /// The method's `MethodDef` token.
        token: u32,
        /// Its `MethodDesc`.
        method_desc: u64,
    },
}

impl std::fmt::Display for MethodName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Named { assembly, method } => write!(f, "[{assembly}] {method}"),
            Self::Dynamic { method_desc } => write!(f, "[.NET dynamic] {method_desc:#x}"),
            Self::ArrayAccessor => f.write_str("[.NET array accessor]"),
            Self::NoFile {
                assembly,
                token,
                method_desc,
            } => write!(
                f,
                "[.NET dynamic] {method_desc:#x} (token {token:#010x} of {assembly})"
            ),
        }
    }
}

/// One module's assembly: its name and its file's metadata.
struct Assembly {
    name: String,
    metadata: Option<Rc<Metadata>>,
}

/// Names `MethodDesc`s of one process, caching each desc's name, each
/// module's assembly and each file's metadata.
///
/// ```no_run
/// use jitmap::remote::ProcessMemory;
/// use jitmap::remote::dotnet::{find_runtime, names::MethodNames};
/// let pid = 4242; // a process running .NET 8
/// let memory = ProcessMemory::new(pid);
/// let runtime = find_runtime(pid, &memory)?;
/// let mut names = MethodNames::new(pid, memory, runtime.layout);
/// let method_desc = 0x7f00_1234_5678; // from `DotnetReader::resolve`
/// println!("{}", names.name(method_desc)?);
/// # Ok::<(), jitmap::remote::RemoteError>(())
/// ```
pub struct MethodNames<M> {
    pid: i32,
    memory: M,
    layout: &'static DotnetLayout,
    names: HashMap<u64, MethodName>,
    modules: HashMap<u64, Rc<Assembly>>,
    /// By (device, inode).
    files: HashMap<(u64, u64), Option<Rc<Metadata>>>,
    maps: Vec<Mapping>,
    /// Whether the process runs x86-64 code, once read.
    x86_64: Option<bool>,
}

impl<M: Memory> MethodNames<M> {
    /// A namer for process `pid`, reading its memory through `memory` by
    /// its runtime's `layout`.
    pub fn new(pid: i32, memory: M, layout: &'static DotnetLayout) -> Self {
        Self {
            pid,
            memory,
            layout,
            names: HashMap::new(),
            modules: HashMap::new(),
            files: HashMap::new(),
            maps: Vec::new(),
            x86_64: None,
        }
    }

    /// The name of the method whose `MethodDesc` is at `method_desc`. An
    /// error is memory that could not be read or does not hold what a
    /// `MethodDesc` should.
    pub fn name(&mut self, method_desc: u64) -> Result<MethodName, RemoteError> {
        if let Some(name) = self.names.get(&method_desc) {
            return Ok(name.clone());
        }
        let name = self.read_name(method_desc)?;
        self.names.insert(method_desc, name.clone());
        Ok(name)
    }

    /// Forgets every `MethodDesc` and `Module` read, and the process's
    /// mappings, keeping the parsed metadata of each file (by device and
    /// inode): after it, a `MethodDesc` or `Module` address that the
    /// runtime freed and reused is read anew, and found in the mapping that
    /// holds it now. (A file deleted and its inode reused by another
    /// assembly within one run would keep the first one's metadata.)
    pub fn forget(&mut self) {
        self.names.clear();
        self.modules.clear();
        // A module's name may now lie in a mapping made since.
        self.maps.clear();
    }

    /// The simple name of `module`'s assembly (`System.Private.CoreLib`),
    /// read once.
    pub fn assembly_name(&mut self, module: u64) -> Result<String, RemoteError> {
        Ok(self.assembly(module)?.name.clone())
    }

    /// The name of the method at `method_desc` if it has `identity` both
    /// before and after its name is read, else `None`: the name of a
    /// collectible assembly's method, whose `MethodDesc` and `Module` the
    /// next assembly may reuse. The name and the assembly are read afresh,
    /// not from what this pass read before (which may be the other
    /// assembly's, at the same addresses).
    pub fn name_if(
        &mut self,
        method_desc: u64,
        identity: MethodIdentity,
    ) -> Result<Option<MethodName>, RemoteError> {
        let (now, module) = self.identity_and_module(method_desc)?;
        if now != identity {
            return Ok(None);
        }
        self.names.remove(&method_desc);
        self.modules.remove(&module);
        // The module's image may be mapped where another's was when the
        // mappings were read: read them again.
        self.maps.clear();
        let name = self.read_name(method_desc)?;
        // Not kept: a later lookup of the address this pass reads it anew.
        self.names.remove(&method_desc);
        self.modules.remove(&module);
        Ok((self.identity_and_module(method_desc)?.0 == identity).then_some(name))
    }

    /// The identity of the method at `method_desc` now (see
    /// [`MethodIdentity`]), as the eBPF program reads it, and its module.
    fn identity_and_module(
        &mut self,
        method_desc: u64,
    ) -> Result<(MethodIdentity, u64), RemoteError> {
        let (rid, method_table) = self.row_and_table(method_desc)?;
        let module =
            self.read_pointer(method_table.wrapping_add(self.layout.method_table_module))?;
        let name = self.read_pointer(module.wrapping_add(self.layout.module_simple_name))?;
        let mut bytes = [0u8; NAME_BYTES];
        if self.memory.read(name, &mut bytes).is_err() {
            bytes = [0; NAME_BYTES];
            let window = name_window(name);
            self.memory.read(name, &mut bytes[..window])?;
        }
        let identity = MethodIdentity {
            rid,
            name_hash: name_hash(name, &bytes),
        };
        Ok((identity, module))
    }

    /// The metadata row of the method at `method_desc` and its
    /// `MethodTable`, from the desc and its chunk.
    fn row_and_table(&self, method_desc: u64) -> Result<(u32, u64), RemoteError> {
        let desc = self.desc(method_desc)?;
        self.row_and_table_of(method_desc, &desc)
    }

    /// The `MethodDesc`'s bytes.
    fn desc(&self, method_desc: u64) -> Result<Vec<u8>, RemoteError> {
        let mut desc = vec![0u8; self.layout.desc_bytes];
        self.memory.read(method_desc, &mut desc)?;
        Ok(desc)
    }

    /// [`MethodNames::row_and_table`] of a desc already read (`desc`).
    fn row_and_table_of(&self, method_desc: u64, desc: &[u8]) -> Result<(u32, u64), RemoteError> {
        let l = self.layout;
        let remainder = u16_at(desc, l.desc_token_remainder) & TOKEN_REMAINDER_MASK;
        let chunk = method_desc
            .checked_sub(
                u64::from(desc[l.desc_chunk_index]) * l.desc_alignment + l.chunk_bytes as u64,
            )
            .ok_or(RemoteError::Corrupt {
                what: "MethodDesc chunk index",
                addr: method_desc,
            })?;
        let mut chunk_bytes = vec![0u8; l.chunk_bytes];
        self.memory.read(chunk, &mut chunk_bytes)?;
        let range = u16_at(&chunk_bytes, l.chunk_token_range) & TOKEN_RANGE_MASK;
        let rid = (u32::from(range) << TOKEN_REMAINDER_BITS) | u32::from(remainder);
        Ok((rid, read_at(&chunk_bytes, l.chunk_method_table)))
    }

    fn read_name(&mut self, method_desc: u64) -> Result<MethodName, RemoteError> {
        if !self.target_is_x86_64()? {
            return Err(RemoteError::UnsupportedRuntime {
                version: "8.0.x off x86-64 (its Module layout is not checked here)".into(),
            });
        }
        let l = self.layout;
        let desc = self.desc(method_desc)?;
        match u16_at(&desc, l.desc_flags) & CLASSIFICATION_MASK {
            MC_DYNAMIC => return Ok(MethodName::Dynamic { method_desc }),
            MC_ARRAY => return Ok(MethodName::ArrayAccessor),
            _ => {}
        }
        let (rid, method_table) = self.row_and_table_of(method_desc, &desc)?;
        let module = self.read_pointer(method_table.wrapping_add(l.method_table_module))?;
        let assembly = self.assembly(module)?;
        let token = 0x0600_0000 | rid;
        Ok(match &assembly.metadata {
            Some(metadata) => MethodName::Named {
                assembly: assembly.name.clone(),
                method: metadata.method_name(rid)?,
            },
            None => MethodName::NoFile {
                assembly: assembly.name.clone(),
                token,
                method_desc,
            },
        })
    }

    /// Whether the process runs x86-64 code (its executable's ELF
    /// machine): the layout this namer knows is that target's, whatever
    /// the reader runs on.
    fn target_is_x86_64(&mut self) -> Result<bool, RemoteError> {
        if let Some(known) = self.x86_64 {
            return Ok(known);
        }
        use std::io::Read;
        const EM_X86_64: u16 = 62;
        let mut header = [0u8; 20];
        std::fs::File::open(format!("/proc/{}/exe", self.pid))
            .and_then(|mut exe| exe.read_exact(&mut header))
            .map_err(|e| RemoteError::Proc {
                pid: self.pid,
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            })?;
        let known =
            &header[..4] == b"\x7fELF" && u16::from_le_bytes([header[18], header[19]]) == EM_X86_64;
        self.x86_64 = Some(known);
        Ok(known)
    }

    fn read_pointer(&self, at: u64) -> Result<u64, RemoteError> {
        let mut word = [0u8; 8];
        self.memory.read(at, &mut word)?;
        Ok(u64::from_le_bytes(word))
    }

    /// The assembly of `module`, read once.
    fn assembly(&mut self, module: u64) -> Result<Rc<Assembly>, RemoteError> {
        if let Some(assembly) = self.modules.get(&module) {
            return Ok(Rc::clone(assembly));
        }
        let simple_name = self.read_pointer(module.wrapping_add(self.layout.module_simple_name))?;
        let name = self.read_c_string(simple_name)?;
        let metadata = match self.mapping_holding(simple_name)? {
            Some(mapping) => self.metadata_of(&mapping),
            None => None,
        };
        let assembly = Rc::new(Assembly { name, metadata });
        self.modules.insert(module, Rc::clone(&assembly));
        Ok(assembly)
    }

    /// The file mapping that holds `address`, reading the process's maps
    /// again when the ones read before do not hold it.
    fn mapping_holding(&mut self, address: u64) -> Result<Option<Mapping>, RemoteError> {
        let find = |maps: &[Mapping]| {
            maps.iter()
                .find(|m| (m.start..m.end).contains(&address))
                .cloned()
        };
        if let Some(m) = find(&self.maps) {
            return Ok(Some(m));
        }
        self.maps = super::super::process::mappings(self.pid)?;
        Ok(find(&self.maps))
    }

    /// The metadata of the PE file `m` maps (the very file, read through
    /// [`read_mapped`]), parsed once per file; `None` when it cannot be
    /// read, is larger than [`MAX_ASSEMBLY_BYTES`], or is not an assembly.
    fn metadata_of(&mut self, m: &Mapping) -> Option<Rc<Metadata>> {
        let pid = self.pid;
        self.files
            .entry(m.file)
            .or_insert_with(|| {
                let bytes = read_mapped(pid, m, MAX_ASSEMBLY_BYTES)?;
                Metadata::from_pe(&bytes).ok().map(Rc::new)
            })
            .clone()
    }

    /// A NUL-terminated string of at most [`MAX_SIMPLE_NAME`] bytes.
    fn read_c_string(&self, at: u64) -> Result<String, RemoteError> {
        let mut out = Vec::new();
        let mut piece = [0u8; 64];
        while out.len() < MAX_SIMPLE_NAME {
            let addr = at.wrapping_add(out.len() as u64);
            // Up to the next 64-byte boundary, so that a read never crosses
            // a page the string does not reach.
            let len = 64 - (addr % 64) as usize;
            self.memory.read(addr, &mut piece[..len])?;
            match piece[..len].iter().position(|&b| b == 0) {
                Some(end) => {
                    out.extend_from_slice(&piece[..end]);
                    return Ok(String::from_utf8_lossy(&out).into_owned());
                }
                None => out.extend_from_slice(&piece[..len]),
            }
        }
        Err(RemoteError::Corrupt {
            what: "a module's simple name is too long",
            addr: at,
        })
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::remote::MemoryImage;
    use crate::remote::dotnet::layout::net8;

    const CHUNK: u64 = 0x10000;
    const METHOD_TABLE: u64 = 0x20000;
    const MODULE: u64 = 0x30000;

    /// A fake runtime: one chunk (token range 0x123, its `MethodTable`) with
    /// three descs at chunk indexes 0, 1 and 2 of classifications `flags`,
    /// each with token remainder 0x456 under set flag bits; the table's
    /// module, whose simple name lies in this test's own executable mapping
    /// (a file, but not an assembly). Returns the image and the descs.
    fn fake(flags: [u16; 3]) -> (MemoryImage, [u64; 3]) {
        let l = net8();
        let (chunk_bytes, desc_bytes) = (l.chunk_bytes, l.desc_bytes);
        let simple_name = l.module_simple_name as usize;
        let pid = std::process::id() as i32;
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        let mapping = crate::remote::process::mappings(pid)
            .unwrap()
            .into_iter()
            .find(|m| m.offset == 0 && std::path::Path::new(&m.path) == exe)
            .unwrap();
        let name_at = mapping.start + 0x40;
        let mut image = MemoryImage::new();
        let mut chunk = vec![0u8; chunk_bytes + 3 * desc_bytes];
        chunk[..8].copy_from_slice(&METHOD_TABLE.to_le_bytes());
        chunk[l.chunk_token_range..l.chunk_token_range + 2]
            .copy_from_slice(&0xF123u16.to_le_bytes());
        let mut descs = [0; 3];
        for (index, flags) in flags.into_iter().enumerate() {
            let at = chunk_bytes + index * desc_bytes;
            chunk[at..at + 2].copy_from_slice(&0xF456u16.to_le_bytes());
            chunk[at + l.desc_chunk_index] = index as u8;
            chunk[at + l.desc_flags..at + l.desc_flags + 2]
                .copy_from_slice(&(0x40 | flags).to_le_bytes());
            descs[index] = CHUNK + at as u64;
        }
        image.insert(CHUNK, chunk).unwrap();
        let mut table = vec![0u8; 0x20];
        table[0x18..].copy_from_slice(&MODULE.to_le_bytes());
        image.insert(METHOD_TABLE, table).unwrap();
        let mut module = vec![0u8; simple_name + 8];
        module[simple_name..].copy_from_slice(&name_at.to_le_bytes());
        image.insert(MODULE, module).unwrap();
        let mut name = b"Fake.Assembly\0".to_vec();
        name.resize(128, 0xAA);
        image.insert(name_at, name).unwrap();
        (image, descs)
    }

    #[test]
    fn a_desc_is_decoded_to_its_token_module_and_assembly() {
        let (image, descs) = fake([0, MC_DYNAMIC, MC_ARRAY]);
        let mut names = MethodNames::new(std::process::id() as i32, image, net8());
        let expected = MethodName::NoFile {
            assembly: "Fake.Assembly".into(),
            token: 0x0612_3456,
            method_desc: descs[0],
        };
        assert_eq!(names.name(descs[0]).unwrap(), expected);
        assert_eq!(
            expected.to_string(),
            format!(
                "[.NET dynamic] {:#x} (token 0x06123456 of Fake.Assembly)",
                descs[0]
            )
        );
        assert_eq!(
            names.name(descs[1]).unwrap(),
            MethodName::Dynamic {
                method_desc: descs[1]
            }
        );
        assert_eq!(names.name(descs[2]).unwrap(), MethodName::ArrayAccessor);
        // Memory that holds no desc is an error, and nothing is cached.
        assert!(matches!(
            names.name(0x50000),
            Err(RemoteError::Unreadable { addr: 0x50000, .. })
        ));
        assert!(!names.names.contains_key(&0x50000));
    }

    /// The next assembly at the same addresses: the desc's row is the same,
    /// its module's name another. A name is given only with the identity
    /// read while the method ran, and read afresh, not from what the pass
    /// read before.
    #[test]
    fn a_reused_desc_is_named_only_with_its_identity_and_afresh() {
        let (image, descs) = fake([0, 0, 0]);
        let mut names = MethodNames::new(std::process::id() as i32, image, net8());
        let (a, _) = names.identity_and_module(descs[0]).unwrap();
        let named = |assembly: &str| MethodName::NoFile {
            assembly: assembly.into(),
            token: 0x0612_3456,
            method_desc: descs[0],
        };
        assert_eq!(names.name(descs[0]).unwrap(), named("Fake.Assembly"));
        let name_at = names
            .read_pointer(MODULE + net8().module_simple_name)
            .unwrap();
        names.memory.write(name_at, b"Fake.Assemblz\0").unwrap();
        let (b, _) = names.identity_and_module(descs[0]).unwrap();
        assert_eq!((a.rid, b.rid), (0x123456 & 0xFF_FFFF, 0x123456 & 0xFF_FFFF));
        assert_ne!(a, b);
        assert_eq!(names.name_if(descs[0], a).unwrap(), None);
        assert_eq!(
            names.name_if(descs[0], b).unwrap(),
            Some(named("Fake.Assemblz"))
        );
    }

    /// Names that differ in one byte, at addresses that differ too, or
    /// near the end of a page, hash apart; the window stops at the page's
    /// end.
    #[test]
    fn name_hashes_differ_where_names_or_addresses_do() {
        assert_eq!(name_window(0x7000), 32);
        assert_eq!(name_window(0x7FF8), 8);
        let at = 0x7FFF_0FF8;
        assert_ne!(
            name_hash(at, b"Jitmap.UnloadA\0"),
            name_hash(at, b"Jitmap.UnloadB\0")
        );
        // A change of address does not cancel a change of name.
        let other = at ^ 0x3_0000_0000;
        assert_ne!(name_hash(at, b"PlugA.X\0"), name_hash(other, b"PlugB.X\0"));
        assert_ne!(name_hash(at, b"Same\0"), name_hash(other, b"Same\0"));
        // Bytes past NAME_BYTES do not count; missing ones are zeros.
        let long = [b'x'; 40];
        assert_eq!(name_hash(at, &long), name_hash(at, &long[..32]));
        assert_eq!(name_hash(at, b"ab"), name_hash(at, b"ab\0\0"));
    }

    #[test]
    fn a_desc_whose_chunk_is_unreadable_is_an_error() {
        let (mut image, descs) = fake([0, 0, 0]);
        // Chunk index 200: the chunk would start 1,600 bytes before the desc,
        // outside every range.
        image
            .write(descs[2] + net8().desc_chunk_index as u64, &[200])
            .unwrap();
        let mut names = MethodNames::new(std::process::id() as i32, image, net8());
        assert!(matches!(
            names.name(descs[2]),
            Err(RemoteError::Unreadable { .. })
        ));
    }
}
