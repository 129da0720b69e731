//! An assembly's ECMA-335 metadata, read from its PE file: enough to name a
//! method from its `MethodDef` row, `Namespace.Type+Nested::Method`, the
//! form the runtime's own perf map uses (signatures and generic arguments
//! aside).
//!
//! The reader is bounded: every offset is checked against the bytes it
//! indexes, a nested type's chain of enclosing types is followed at most
//! [`MAX_NESTING`] deep, and a bad file is an error, never a panic. It reads
//! the compressed table stream (`#~`) of an assembly on disk. The
//! uncompressed one (`#-`, with its `Ptr` indirection tables) is what
//! edit-and-continue and dynamic modules write; its `Ptr` tables are
//! refused, since a row's method list would then not be its methods.

use std::collections::HashMap;

use object::read::pe::{ImageNtHeaders, PeFile32, PeFile64};

use super::super::RemoteError;

/// The table numbers (ECMA-335 II.22) this reader uses by name.
const TYPE_DEF: usize = 0x02;
const FIELD: usize = 0x04;
const METHOD_PTR: usize = 0x05;
const METHOD_DEF: usize = 0x06;
const PARAM: usize = 0x08;
const FIELD_PTR: usize = 0x03;
const NESTED_CLASS: usize = 0x29;
/// Tables laid out before the ones this reader needs (0x00 to 0x29).
const TABLES_READ: usize = NESTED_CLASS + 1;

/// How deep a nested type's enclosing types are followed.
pub const MAX_NESTING: usize = 64;

/// A column's kind, from which its width follows (II.24.2.6).
#[derive(Clone, Copy)]
enum Column {
    /// A fixed width in bytes.
    Fixed(usize),
    /// An index into the `#Strings`, `#GUID` or `#Blob` heap.
    Strings,
    Guid,
    Blob,
    /// An index into one table.
    Table(usize),
    /// A coded index: the tables it may name (their count sets the tag bits).
    Coded(&'static [usize]),
}

use Column::{Blob, Coded, Fixed, Guid, Strings};

// The coded indexes of II.24.2.6, as lists of tables; an unused tag is a
// table that has no rows here (0x3F is beyond every real table).
const TYPE_DEF_OR_REF: &[usize] = &[0x02, 0x01, 0x1B];
const HAS_CONSTANT: &[usize] = &[0x04, 0x08, 0x17];
const HAS_CUSTOM_ATTRIBUTE: &[usize] = &[
    0x06, 0x04, 0x01, 0x02, 0x08, 0x09, 0x0A, 0x00, 0x0E, 0x17, 0x14, 0x11, 0x1A, 0x1B, 0x20, 0x23,
    0x26, 0x27, 0x28, 0x2A, 0x2C, 0x2B,
];
const HAS_FIELD_MARSHAL: &[usize] = &[0x04, 0x08];
const HAS_DECL_SECURITY: &[usize] = &[0x02, 0x06, 0x20];
const MEMBER_REF_PARENT: &[usize] = &[0x02, 0x01, 0x1A, 0x06, 0x1B];
const HAS_SEMANTICS: &[usize] = &[0x14, 0x17];
const METHOD_DEF_OR_REF: &[usize] = &[0x06, 0x0A];
const MEMBER_FORWARDED: &[usize] = &[0x04, 0x06];
const IMPLEMENTATION: &[usize] = &[0x26, 0x23, 0x27];
const CUSTOM_ATTRIBUTE_TYPE: &[usize] = &[0x3F, 0x3F, 0x06, 0x0A, 0x3F];
const RESOLUTION_SCOPE: &[usize] = &[0x00, 0x1A, 0x23, 0x01];

/// The columns of tables 0x00 to 0x29, in order (II.22).
const SCHEMA: [&[Column]; TABLES_READ] = [
    // 0x00 Module
    &[Fixed(2), Strings, Guid, Guid, Guid],
    // 0x01 TypeRef
    &[Coded(RESOLUTION_SCOPE), Strings, Strings],
    // 0x02 TypeDef: flags, name, namespace, extends, field list, method list
    &[
        Fixed(4),
        Strings,
        Strings,
        Coded(TYPE_DEF_OR_REF),
        Column::Table(FIELD),
        Column::Table(METHOD_DEF),
    ],
    // 0x03 FieldPtr
    &[Column::Table(FIELD)],
    // 0x04 Field
    &[Fixed(2), Strings, Blob],
    // 0x05 MethodPtr
    &[Column::Table(METHOD_DEF)],
    // 0x06 MethodDef: RVA, impl flags, flags, name, signature, param list
    &[
        Fixed(4),
        Fixed(2),
        Fixed(2),
        Strings,
        Blob,
        Column::Table(PARAM),
    ],
    // 0x07 ParamPtr
    &[Column::Table(PARAM)],
    // 0x08 Param
    &[Fixed(2), Fixed(2), Strings],
    // 0x09 InterfaceImpl
    &[Column::Table(TYPE_DEF), Coded(TYPE_DEF_OR_REF)],
    // 0x0A MemberRef
    &[Coded(MEMBER_REF_PARENT), Strings, Blob],
    // 0x0B Constant
    &[Fixed(2), Coded(HAS_CONSTANT), Blob],
    // 0x0C CustomAttribute
    &[
        Coded(HAS_CUSTOM_ATTRIBUTE),
        Coded(CUSTOM_ATTRIBUTE_TYPE),
        Blob,
    ],
    // 0x0D FieldMarshal
    &[Coded(HAS_FIELD_MARSHAL), Blob],
    // 0x0E DeclSecurity
    &[Fixed(2), Coded(HAS_DECL_SECURITY), Blob],
    // 0x0F ClassLayout
    &[Fixed(2), Fixed(4), Column::Table(TYPE_DEF)],
    // 0x10 FieldLayout
    &[Fixed(4), Column::Table(FIELD)],
    // 0x11 StandAloneSig
    &[Blob],
    // 0x12 EventMap
    &[Column::Table(TYPE_DEF), Column::Table(0x14)],
    // 0x13 EventPtr
    &[Column::Table(0x14)],
    // 0x14 Event
    &[Fixed(2), Strings, Coded(TYPE_DEF_OR_REF)],
    // 0x15 PropertyMap
    &[Column::Table(TYPE_DEF), Column::Table(0x17)],
    // 0x16 PropertyPtr
    &[Column::Table(0x17)],
    // 0x17 Property
    &[Fixed(2), Strings, Blob],
    // 0x18 MethodSemantics
    &[Fixed(2), Column::Table(METHOD_DEF), Coded(HAS_SEMANTICS)],
    // 0x19 MethodImpl
    &[
        Column::Table(TYPE_DEF),
        Coded(METHOD_DEF_OR_REF),
        Coded(METHOD_DEF_OR_REF),
    ],
    // 0x1A ModuleRef
    &[Strings],
    // 0x1B TypeSpec
    &[Blob],
    // 0x1C ImplMap
    &[
        Fixed(2),
        Coded(MEMBER_FORWARDED),
        Strings,
        Column::Table(0x1A),
    ],
    // 0x1D FieldRVA
    &[Fixed(4), Column::Table(FIELD)],
    // 0x1E ENCLog
    &[Fixed(4), Fixed(4)],
    // 0x1F ENCMap
    &[Fixed(4)],
    // 0x20 Assembly
    &[Fixed(4), Fixed(8), Fixed(4), Blob, Strings, Strings],
    // 0x21 AssemblyProcessor
    &[Fixed(4)],
    // 0x22 AssemblyOS
    &[Fixed(12)],
    // 0x23 AssemblyRef
    &[Fixed(8), Fixed(4), Blob, Strings, Strings, Blob],
    // 0x24 AssemblyRefProcessor
    &[Fixed(4), Column::Table(0x23)],
    // 0x25 AssemblyRefOS
    &[Fixed(12), Column::Table(0x23)],
    // 0x26 File
    &[Fixed(4), Strings, Blob],
    // 0x27 ExportedType
    &[Fixed(4), Fixed(4), Strings, Strings, Coded(IMPLEMENTATION)],
    // 0x28 ManifestResource
    &[Fixed(4), Fixed(4), Strings, Coded(IMPLEMENTATION)],
    // 0x29 NestedClass: nested, enclosing
    &[Column::Table(TYPE_DEF), Column::Table(TYPE_DEF)],
];

fn bad(what: &'static str) -> RemoteError {
    RemoteError::BadMetadata { what }
}

/// The `N` bytes at `at`, or an error when they do not fit: every
/// little-endian read of the reader goes through here, never a panic.
fn bytes_at<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], RemoteError> {
    let end = at.checked_add(N).ok_or(bad("offset"))?;
    b.get(at..end)
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or(bad("truncated"))
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, RemoteError> {
    bytes_at(b, at).map(u16::from_le_bytes)
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, RemoteError> {
    bytes_at(b, at).map(u32::from_le_bytes)
}

/// The most columns a table of [`SCHEMA`] has.
const MAX_COLUMNS: usize = 6;

/// One table's place in the table stream.
#[derive(Clone, Copy, Default)]
struct Table {
    rows: u32,
    /// Offset of its first row in the table stream.
    at: usize,
    /// Bytes a row.
    row: usize,
    /// Each column's offset in a row, and its width.
    columns: [(usize, usize); MAX_COLUMNS],
}

/// The parsed metadata of one assembly, owning its bytes.
pub struct Metadata {
    tables_stream: Vec<u8>,
    strings: Vec<u8>,
    tables: [Table; TABLES_READ],
    /// The enclosing type of each nested type, by TypeDef row.
    enclosing: HashMap<u32, u32>,
}

impl std::fmt::Debug for Metadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metadata")
            .field("type_defs", &self.tables[TYPE_DEF].rows)
            .field("method_defs", &self.tables[METHOD_DEF].rows)
            .finish()
    }
}

impl Metadata {
    /// The metadata of the PE file `pe` (PE32 or PE32+), from its CLI
    /// header's metadata directory.
    ///
    /// ```
    /// use jitmap::remote::dotnet::metadata::Metadata;
    /// assert!(Metadata::from_pe(b"not a PE file").is_err());
    /// ```
    pub fn from_pe(pe: &[u8]) -> Result<Self, RemoteError> {
        let root = match object::FileKind::parse(pe) {
            Ok(object::FileKind::Pe32) => metadata_of::<object::pe::ImageNtHeaders32>(
                &PeFile32::parse(pe).map_err(|_| bad("PE32 headers"))?,
                pe,
            )?,
            Ok(object::FileKind::Pe64) => metadata_of::<object::pe::ImageNtHeaders64>(
                &PeFile64::parse(pe).map_err(|_| bad("PE32+ headers"))?,
                pe,
            )?,
            _ => return Err(bad("not a PE file")),
        };
        Self::parse(root)
    }

    /// Parses a metadata root (`BSJB`) and its `#~` and `#Strings` streams:
    /// the bytes a PE file's CLI header points at.
    ///
    /// ```
    /// use jitmap::remote::RemoteError;
    /// use jitmap::remote::dotnet::metadata::Metadata;
    /// assert_eq!(
    ///     Metadata::parse(b"BSJB").unwrap_err(),
    ///     RemoteError::BadMetadata { what: "truncated" }
    /// );
    /// ```
    pub fn parse(root: &[u8]) -> Result<Self, RemoteError> {
        if u32_at(root, 0)? != 0x424A_5342 {
            return Err(bad("no BSJB signature"));
        }
        let version_len = u32_at(root, 12)? as usize;
        let mut at = 16usize
            .checked_add(version_len.next_multiple_of(4))
            .ok_or(bad("version length"))?;
        let streams = u16_at(root, at + 2)?;
        at += 4;
        let (mut tables_stream, mut strings) = (None, None);
        let mut minimal_delta = false;
        for _ in 0..streams {
            let offset = u32_at(root, at)? as usize;
            let size = u32_at(root, at + 4)? as usize;
            let name_at = at + 8;
            let name_len = root
                .get(name_at..)
                .and_then(|s| s.iter().take(32).position(|&b| b == 0))
                .ok_or(bad("stream name"))?;
            let name = &root[name_at..name_at + name_len];
            let body = root
                .get(offset..offset.checked_add(size).ok_or(bad("stream size"))?)
                .ok_or(bad("stream beyond the metadata"))?;
            match name {
                b"#~" | b"#-" => tables_stream = Some(body),
                b"#Strings" => strings = Some(body),
                // A minimal delta's columns are all four bytes wide.
                b"#JTD" => minimal_delta = true,
                _ => {}
            }
            at = name_at + (name_len + 1).next_multiple_of(4);
        }
        if minimal_delta {
            return Err(bad("a minimal delta (#JTD)"));
        }
        let tables_stream = tables_stream.ok_or(bad("no table stream"))?;
        let strings = strings.ok_or(bad("no #Strings heap"))?;
        Self::with_streams(tables_stream.to_vec(), strings.to_vec())
    }

    fn with_streams(tables_stream: Vec<u8>, strings: Vec<u8>) -> Result<Self, RemoteError> {
        let t = &tables_stream;
        let heap_sizes = *t.get(6).ok_or(bad("truncated"))?;
        let valid = u64::from(u32_at(t, 8)?) | (u64::from(u32_at(t, 12)?) << 32);
        let mut rows = [0u32; 64];
        let mut at = 24;
        for (table, count) in rows.iter_mut().enumerate() {
            if valid & (1 << table) != 0 {
                *count = u32_at(t, at)?;
                at += 4;
            }
        }
        // An uncompressed stream may carry four bytes of extra data.
        if heap_sizes & 0x40 != 0 {
            at += 4;
        }
        if rows[FIELD_PTR] != 0 || rows[METHOD_PTR] != 0 {
            return Err(bad("Ptr tables (an uncompressed stream)"));
        }
        let heap = |bit: u8| if heap_sizes & bit != 0 { 4 } else { 2 };
        let table_index = |table: usize| {
            if rows.get(table).copied().unwrap_or(0) < 1 << 16 {
                2
            } else {
                4
            }
        };
        let width = |column: &Column| match *column {
            Fixed(n) => n,
            Strings => heap(0x01),
            Guid => heap(0x02),
            Blob => heap(0x04),
            Column::Table(table) => table_index(table),
            Coded(tables) => {
                let tag_bits = usize::BITS - (tables.len() - 1).leading_zeros();
                let most = tables
                    .iter()
                    .map(|&t| rows.get(t).copied().unwrap_or(0))
                    .max()
                    .unwrap_or(0);
                if u64::from(most) < 1 << (16 - tag_bits) {
                    2
                } else {
                    4
                }
            }
        };
        let mut tables = [Table::default(); TABLES_READ];
        for (n, schema) in SCHEMA.iter().enumerate() {
            let mut columns = [(0, 0); MAX_COLUMNS];
            let mut row = 0;
            for (column, kind) in columns.iter_mut().zip(schema.iter()) {
                *column = (row, width(kind));
                row += column.1;
            }
            tables[n] = Table {
                rows: rows[n],
                at,
                row,
                columns,
            };
            at = (rows[n] as usize)
                .checked_mul(row)
                .and_then(|size| at.checked_add(size))
                .ok_or(bad("table size"))?;
        }
        // Every table read must lie inside the stream.
        if at > t.len() {
            return Err(bad("tables beyond their stream"));
        }
        let mut metadata = Self {
            tables,
            enclosing: HashMap::new(),
            tables_stream,
            strings,
        };
        for row in 1..=metadata.tables[NESTED_CLASS].rows {
            let nested = metadata.index(NESTED_CLASS, row, 0)?;
            let enclosing = metadata.index(NESTED_CLASS, row, 1)?;
            metadata.enclosing.insert(nested, enclosing);
        }
        Ok(metadata)
    }

    /// Rows in the `MethodDef` table: the methods [`Metadata::method_name`]
    /// names are 1 to this.
    ///
    /// ```
    /// use jitmap::remote::dotnet::metadata::Metadata;
    /// # fn f(metadata: &Metadata) {
    /// for row in 1..=metadata.method_defs() {
    ///     println!("{:?}", metadata.method_name(row));
    /// }
    /// # }
    /// ```
    pub fn method_defs(&self) -> u32 {
        self.tables[METHOD_DEF].rows
    }

    /// Where column `column` of row `row` (1-based) of `table` starts, and
    /// its width.
    fn cell(&self, table: usize, row: u32, column: usize) -> Result<(usize, usize), RemoteError> {
        let t = self.tables[table];
        if row == 0 || row > t.rows {
            return Err(bad("row out of range"));
        }
        let (offset, width) = t.columns[column];
        Ok((t.at + (row as usize - 1) * t.row + offset, width))
    }

    /// An index or string-heap offset: a 2- or 4-byte cell.
    fn index(&self, table: usize, row: u32, column: usize) -> Result<u32, RemoteError> {
        let (at, width) = self.cell(table, row, column)?;
        if width == 2 {
            Ok(u32::from(u16_at(&self.tables_stream, at)?))
        } else {
            u32_at(&self.tables_stream, at)
        }
    }

    /// The string at `offset` in the `#Strings` heap.
    fn string(&self, offset: u32) -> Result<&str, RemoteError> {
        let tail = self
            .strings
            .get(offset as usize..)
            .ok_or(bad("string offset"))?;
        let len = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or(bad("unterminated string"))?;
        std::str::from_utf8(&tail[..len]).map_err(|_| bad("string not UTF-8"))
    }

    /// The type that declares method `row`: the last `TypeDef` whose method
    /// list starts at or before it (the lists are in order, II.22.37).
    fn owner(&self, method: u32) -> Result<u32, RemoteError> {
        let (mut lo, mut hi) = (1u32, self.tables[TYPE_DEF].rows);
        if hi == 0 {
            return Err(bad("no TypeDef rows"));
        }
        // The last row whose method list is <= method.
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.index(TYPE_DEF, mid, 5)? <= method {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        if self.index(TYPE_DEF, lo, 5)? > method {
            return Err(bad("method before every type's list"));
        }
        Ok(lo)
    }

    /// Whether TypeDef `row`'s visibility is a nested one
    /// (`tdNestedPublic` and above): only then does the runtime name it
    /// after an enclosing type.
    fn is_nested(&self, row: u32) -> Result<bool, RemoteError> {
        const VISIBILITY_MASK: u32 = 0x7;
        const NESTED_PUBLIC: u32 = 0x2;
        let (at, _) = self.cell(TYPE_DEF, row, 0)?;
        Ok(u32_at(&self.tables_stream, at)? & VISIBILITY_MASK >= NESTED_PUBLIC)
    }

    /// A type's name as the runtime writes it: `Namespace.Name`, and
    /// `Enclosing+Namespace.Name` for a nested type (whose namespace is
    /// usually empty). The characters the runtime escapes in a type name
    /// (`+ , [ ] & * \`) are escaped with `\` as it does.
    ///
    /// ```
    /// use jitmap::remote::dotnet::metadata::Metadata;
    /// // Read from an assembly's PE file; row 1 is the `<Module>` type.
    /// # fn f(metadata: &Metadata) -> Result<(), jitmap::remote::RemoteError> {
    /// assert_eq!(metadata.type_name(1)?, "<Module>");
    /// # Ok(()) }
    /// ```
    pub fn type_name(&self, row: u32) -> Result<String, RemoteError> {
        let mut chain = vec![row];
        let mut inner = row;
        while self.is_nested(inner)? {
            let Some(&outer) = self.enclosing.get(&inner) else {
                break;
            };
            if chain.len() > MAX_NESTING || chain.contains(&outer) {
                return Err(bad("nesting too deep or circular"));
            }
            chain.push(outer);
            inner = outer;
        }
        let mut name = String::new();
        for (n, &t) in chain.iter().rev().enumerate() {
            if n > 0 {
                name.push('+');
            }
            let namespace = self.string(self.index(TYPE_DEF, t, 2)?)?;
            if !namespace.is_empty() {
                escape_into(&mut name, namespace);
                name.push('.');
            }
            escape_into(&mut name, self.string(self.index(TYPE_DEF, t, 1)?)?);
        }
        Ok(name)
    }

    /// Method `row`'s name as `Namespace.Type+Nested::Method`.
    ///
    /// ```no_run
    /// use jitmap::remote::dotnet::metadata::Metadata;
    /// let pe = std::fs::read("System.Private.CoreLib.dll")?;
    /// let metadata = Metadata::from_pe(&pe)?;
    /// println!("{}", metadata.method_name(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn method_name(&self, row: u32) -> Result<String, RemoteError> {
        let method = self.string(self.index(METHOD_DEF, row, 3)?)?;
        let owner = self.owner(row)?;
        Ok(format!("{}::{method}", self.type_name(owner)?))
    }
}

/// Appends `part` with the characters the runtime escapes in type names
/// preceded by `\`.
fn escape_into(out: &mut String, part: &str) {
    for c in part.chars() {
        if matches!(c, '+' | ',' | '[' | ']' | '&' | '*' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// The metadata root's bytes in a parsed PE file.
fn metadata_of<'a, H: ImageNtHeaders>(
    file: &object::read::pe::PeFile<'a, H>,
    data: &'a [u8],
) -> Result<&'a [u8], RemoteError> {
    let sections = file.section_table();
    let cli = file
        .data_directory(object::pe::IMAGE_DIRECTORY_ENTRY_COM_DESCRIPTOR)
        .ok_or(bad("no CLI header (not a .NET assembly)"))?
        .data(data, &sections)
        .map_err(|_| bad("CLI header"))?;
    let rva = u32_at(cli, 8)?;
    let size = u32_at(cli, 12)? as usize;
    let bytes = sections.pe_data_at(data, rva).ok_or(bad("metadata RVA"))?;
    bytes.get(..size).ok_or(bad("metadata size"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metadata root with three types (`<Module>`, the public `Ns.Outer`
    /// and `N2.Inner`, nested in it) and `methods` methods: all but the last
    /// are `Outer`'s (`M1`, `M2`, then `Mk`), the last is `Inner`'s (`M3`
    /// when there are three). `wide_strings` sets the heap-size bit that
    /// makes string indexes four bytes wide; 65,536 methods or more make
    /// method indexes four bytes wide.
    fn sample_with(methods: u32, wide_strings: bool) -> Vec<u8> {
        let mut strings = b"\0<Module>\0Ns\0Outer\0N2\0Inner\0M1\0M2\0M3\0Mk\0".to_vec();
        while !strings.len().is_multiple_of(4) {
            strings.push(0);
        }
        let at = |s: &str| {
            let needle = [b"\0", s.as_bytes(), b"\0"].concat();
            strings
                .windows(needle.len())
                .position(|w| w == needle)
                .unwrap() as u32
                + 1
        };
        let string = |t: &mut Vec<u8>, s: &str| {
            let offset = if s.is_empty() { 0 } else { at(s) };
            if wide_strings {
                t.extend_from_slice(&offset.to_le_bytes());
            } else {
                t.extend_from_slice(&(offset as u16).to_le_bytes());
            }
        };
        let method_index = |t: &mut Vec<u8>, m: u32| {
            if methods >= 1 << 16 {
                t.extend_from_slice(&m.to_le_bytes());
            } else {
                t.extend_from_slice(&(m as u16).to_le_bytes());
            }
        };
        let mut t = Vec::new();
        t.extend_from_slice(&0u32.to_le_bytes());
        t.extend_from_slice(&[2, 0, u8::from(wide_strings), 1]);
        let valid: u64 = (1 << TYPE_DEF) | (1 << METHOD_DEF) | (1 << NESTED_CLASS);
        t.extend_from_slice(&valid.to_le_bytes());
        t.extend_from_slice(&0u64.to_le_bytes());
        for rows in [3u32, methods, 1] {
            t.extend_from_slice(&rows.to_le_bytes());
        }
        // TypeDef: flags, name, namespace, extends, field list, method list.
        let types = [
            (0u32, "<Module>", "", 1),
            (1, "Outer", "Ns", 1),
            (2, "Inner", "N2", methods),
        ];
        for (flags, name, namespace, first) in types {
            t.extend_from_slice(&flags.to_le_bytes());
            string(&mut t, name);
            string(&mut t, namespace);
            t.extend_from_slice(&[0, 0, 1, 0]);
            method_index(&mut t, first);
        }
        // MethodDef: RVA, impl flags, flags, name, signature, param list.
        for m in 1..=methods {
            t.extend_from_slice(&[0; 8]);
            let name = match m {
                _ if m == methods => "M3",
                1 => "M1",
                2 => "M2",
                _ => "Mk",
            };
            string(&mut t, name);
            t.extend_from_slice(&[0, 0, 1, 0]);
        }
        // NestedClass: Inner (3) in Outer (2).
        t.extend_from_slice(&[3, 0, 2, 0]);
        while !t.len().is_multiple_of(4) {
            t.push(0);
        }
        let mut root = Vec::new();
        root.extend_from_slice(b"BSJB");
        root.extend_from_slice(&[1, 0, 1, 0, 0, 0, 0, 0]);
        root.extend_from_slice(&12u32.to_le_bytes());
        root.extend_from_slice(b"v4.0.30319\0\0");
        root.extend_from_slice(&[0, 0, 2, 0]);
        let first = root.len() + 8 + 4 + 8 + 12;
        root.extend_from_slice(&(first as u32).to_le_bytes());
        root.extend_from_slice(&(t.len() as u32).to_le_bytes());
        root.extend_from_slice(b"#~\0\0");
        root.extend_from_slice(&((first + t.len()) as u32).to_le_bytes());
        root.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        root.extend_from_slice(b"#Strings\0\0\0\0");
        root.extend_from_slice(&t);
        root.extend_from_slice(&strings);
        root
    }

    fn sample() -> Vec<u8> {
        sample_with(3, false)
    }

    #[test]
    fn wide_string_and_method_indexes_are_read_at_their_width() {
        for (methods, wide) in [(3, true), (70_000, false), (70_000, true)] {
            let metadata = Metadata::parse(&sample_with(methods, wide)).unwrap();
            assert_eq!(metadata.method_defs(), methods);
            assert_eq!(metadata.method_name(1).unwrap(), "Ns.Outer::M1");
            assert_eq!(metadata.method_name(2).unwrap(), "Ns.Outer::M2");
            assert_eq!(
                metadata.method_name(methods).unwrap(),
                "Ns.Outer+N2.Inner::M3"
            );
            if methods > 3 {
                assert_eq!(metadata.method_name(methods - 1).unwrap(), "Ns.Outer::Mk");
            }
        }
    }

    #[test]
    fn a_type_name_escapes_what_the_runtime_escapes() {
        let mut out = String::new();
        escape_into(&mut out, "A,B+C[D]&E*F\\G<>c");
        assert_eq!(out, "A\\,B\\+C\\[D\\]\\&E\\*F\\\\G<>c");
    }

    #[test]
    fn a_minimal_delta_is_refused() {
        let mut root = sample();
        // Rename the #Strings stream's header to #JTD: no strings then, but
        // the delta is refused first.
        let at = root.windows(8).position(|w| w == b"#Strings").unwrap();
        root[at..at + 8].copy_from_slice(b"#JTD\0\0\0\0");
        assert_eq!(
            Metadata::parse(&root).unwrap_err(),
            RemoteError::BadMetadata {
                what: "a minimal delta (#JTD)"
            }
        );
    }

    /// Thousands of stream headers that each name the whole root are
    /// parsed in time linear in the root: each stream is copied once.
    #[test]
    fn repeated_stream_headers_are_copied_once() {
        let mut root = b"BSJB\x01\0\x01\0\0\0\0\0\x04\0\0\0v4.0\0\0".to_vec();
        let count = 65_535u16;
        root.extend_from_slice(&count.to_le_bytes());
        let body = 16 << 20;
        for _ in 0..count {
            root.extend_from_slice(&0u32.to_le_bytes());
            root.extend_from_slice(&(body as u32).to_le_bytes());
            root.extend_from_slice(b"#~\0\0");
        }
        root.resize(body, 0);
        let began = std::time::Instant::now();
        assert_eq!(
            Metadata::parse(&root).unwrap_err(),
            RemoteError::BadMetadata {
                what: "no #Strings heap"
            }
        );
        // A generous cap, not a timing: a copy per header would move a
        // terabyte, for many minutes.
        assert!(began.elapsed() < std::time::Duration::from_secs(60));
    }

    #[test]
    fn methods_are_named_by_their_owner_and_its_enclosing_types() {
        // The fuzz target's seed is this root (`JITMAP_BLESS=1` writes it).
        let seed = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/seeds/dotnet_metadata/three_methods"
        );
        if std::env::var_os("JITMAP_BLESS").is_some() {
            std::fs::write(seed, sample()).unwrap();
        }
        assert_eq!(sample(), std::fs::read(seed).unwrap());
        let metadata = Metadata::parse(&sample()).unwrap();
        assert_eq!(metadata.method_defs(), 3);
        assert_eq!(metadata.method_name(1).unwrap(), "Ns.Outer::M1");
        assert_eq!(metadata.method_name(2).unwrap(), "Ns.Outer::M2");
        assert_eq!(metadata.method_name(3).unwrap(), "Ns.Outer+N2.Inner::M3");
        assert_eq!(metadata.type_name(1).unwrap(), "<Module>");
        assert_eq!(
            metadata.method_name(0),
            Err(RemoteError::BadMetadata {
                what: "row out of range"
            })
        );
        assert!(metadata.method_name(4).is_err());
    }

    /// Each method of a damaged root is named `Type::Method` or refused.
    fn names_or_errors(m: &Metadata) {
        for row in 1..=m.method_defs().min(8) {
            if let Ok(name) = m.method_name(row) {
                assert!(name.contains("::"), "{name}");
            }
        }
    }

    /// Every prefix of a valid root, and every one-byte change of it, is
    /// an error or a root whose answers are errors or names: never a
    /// panic.
    #[test]
    fn damaged_metadata_is_an_error_never_a_panic() {
        let root = sample();
        for len in 0..root.len() {
            if let Ok(m) = Metadata::parse(&root[..len]) {
                names_or_errors(&m);
            }
        }
        for at in 0..root.len() {
            for value in [0u8, 1, 0x7F, 0xFF] {
                let mut bad = root.clone();
                bad[at] = value;
                if let Ok(m) = Metadata::parse(&bad) {
                    names_or_errors(&m);
                }
            }
        }
    }

    #[test]
    fn a_circular_nesting_is_refused() {
        let mut root = sample();
        // NestedClass's last cell (the enclosing type, 2) becomes 3: Inner
        // encloses itself.
        let row = root.windows(4).rposition(|w| w == [3, 0, 2, 0]).unwrap();
        root[row + 2] = 3;
        let metadata = Metadata::parse(&root).unwrap();
        assert_eq!(
            metadata.method_name(3),
            Err(RemoteError::BadMetadata {
                what: "nesting too deep or circular"
            })
        );
    }
}
