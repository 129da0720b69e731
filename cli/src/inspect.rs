//! `inspect`: resolves addresses in another jitmap host, and lists its heaps and
//! live methods, through the descriptor and `process_vm_readv`; with `--dotnet`,
//! the same for a live CoreCLR 8 process through the runtime's own maps.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use jitmap::remote::dotnet::names::MethodNames;
use jitmap::remote::dotnet::{
    self, DotnetReader, DotnetResolution, DotnetSection, DotnetSectionKind, Runtime,
};
use jitmap::remote::{
    self, ProcessMemory, RemoteError, RemoteReader, RemoteSection, Resolution, SectionKind, Unknown,
};

/// What an inspection prints, and whether it resolved everything asked.
pub trait Report {
    /// Whether every asked address resolved (exit status 0 if so, else 1).
    fn all_resolved(&self) -> bool;
    /// The text report.
    fn text(&self) -> String;
    /// The report as one JSON object.
    fn json(&self) -> serde_json::Value;
}

/// What `inspect` found.
#[derive(Debug)]
pub struct Inspection {
    /// The process.
    pub pid: i32,
    /// The descriptor's address in it.
    pub descriptor: u64,
    /// Each asked address and what it is.
    pub answers: Vec<(u64, Resolution)>,
    /// With `--list`: each section and its live blocks.
    pub listing: Option<Vec<(RemoteSection, Vec<Resolution>)>>,
    /// Nanoseconds per lookup of the asked addresses (mean), 0 with none
    /// (and the text report then gives none).
    pub ns_per_lookup: f64,
    /// Milliseconds the listing took.
    pub list_ms: f64,
    /// Reads per lookup, over the asked addresses and the listing's lookups.
    pub stats: remote::ReadStats,
}

impl Report for Inspection {
    /// Whether every asked address named a method, stub or image.
    fn all_resolved(&self) -> bool {
        self.answers.iter().all(|(_, r)| {
            matches!(
                r,
                Resolution::Method(_) | Resolution::Stub { .. } | Resolution::Image { .. }
            )
        })
    }

    fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "process {} descriptor {:#x}",
            self.pid, self.descriptor
        );
        for (ip, r) in &self.answers {
            let _ = writeln!(out, "{ip:#x} {}", describe(r));
        }
        if let Some(listing) = &self.listing {
            for (section, blocks) in listing {
                let kind = match section.kind {
                    SectionKind::Heap { id, version } => format!("heap {id} (v{version})"),
                    SectionKind::Image => "image".to_string(),
                };
                let _ = writeln!(
                    out,
                    "{kind} {:#x}..{:#x} blocks={}",
                    section.begin,
                    section.end,
                    blocks.len()
                );
                for b in blocks {
                    let _ = writeln!(out, "  {}", describe(b));
                }
            }
            let _ = writeln!(out, "listed in {:.2} ms", self.list_ms);
        }
        let _ = write!(
            out,
            "lookups={} reads/lookup mean={:.2} max={} retries={}",
            self.stats.lookups,
            self.stats.mean_reads(),
            self.stats.max_reads,
            self.stats.retries,
        );
        // Timed over the asked addresses only: with none (`--list`), no time.
        if !self.answers.is_empty() {
            let _ = write!(out, " ns/lookup={:.0}", self.ns_per_lookup);
        }
        out.push('\n');
        out
    }

    fn json(&self) -> serde_json::Value {
        let listing = self.listing.as_ref().map(|listing| {
            listing
                .iter()
                .map(|(section, blocks)| {
                    let (kind, id, version) = match section.kind {
                        SectionKind::Heap { id, version } => ("heap", Some(id), Some(version)),
                        SectionKind::Image => ("image", None, None),
                    };
                    serde_json::json!({
                        "kind": kind,
                        "id": id,
                        "version": version,
                        "begin": section.begin,
                        "end": section.end,
                        "blocks": blocks.iter().map(resolution_json).collect::<Vec<_>>(),
                    })
                })
                .collect::<Vec<_>>()
        });
        serde_json::json!({
            "pid": self.pid,
            "descriptor": self.descriptor,
            "answers": answers_json(&self.answers, resolution_json),
            "sections": listing,
            "lookups": self.stats.lookups,
            "reads_mean": self.stats.mean_reads(),
            "reads_max": self.stats.max_reads,
            "retries": self.stats.retries,
            "ns_per_lookup": self.ns_per_lookup,
            "list_ms": self.list_ms,
        })
    }
}

/// Asked addresses and their answers as JSON objects, each with its `ip`.
fn answers_json<R>(
    answers: &[(u64, R)],
    to_json: impl Fn(&R) -> serde_json::Value,
) -> Vec<serde_json::Value> {
    answers
        .iter()
        .map(|(ip, r)| {
            let mut v = to_json(r);
            v["ip"] = serde_json::json!(ip);
            v
        })
        .collect()
}

/// One line for an answer.
pub fn describe(r: &Resolution) -> String {
    match r {
        Resolution::Method(m) => format!(
            "{} (method {}) start {:#x} +{:#x} size {} heap {}",
            m.name, m.method_id, m.start, m.offset, m.size, m.heap_id
        ),
        Resolution::Stub {
            start,
            offset,
            size,
            kind,
            heap_id,
            name,
        } => {
            let what = match name {
                Some(name) => format!("stub kind {kind}: {name}"),
                None => format!("stub kind {kind} (unnamed)"),
            };
            format!("{what} start {start:#x} +{offset:#x} size {size} heap {heap_id}")
        }
        Resolution::Image {
            begin,
            end,
            offset,
            method: Some(m),
        } => format!(
            "{} (image method {}) start {:#x} +{:#x} size {} in image {begin:#x}..{end:#x} +{offset:#x}",
            m.name, m.method_id, m.start, m.offset, m.size
        ),
        Resolution::Image {
            begin,
            end,
            offset,
            method: None,
        } => format!("image {begin:#x}..{end:#x} +{offset:#x}"),
        Resolution::Nothing => "nothing".to_string(),
        Resolution::Unknown(Unknown::Changing) => "unknown (the host kept changing)".to_string(),
        Resolution::Unknown(Unknown::TooFar) => "unknown (v1 start too far back)".to_string(),
    }
}

/// An answer as JSON, with a `kind` of method, stub, image, nothing or unknown.
pub fn resolution_json(r: &Resolution) -> serde_json::Value {
    match r {
        Resolution::Method(m) => serde_json::json!({
            "kind": "method", "method_id": m.method_id, "name": m.name,
            "start": m.start, "offset": m.offset, "size": m.size, "heap": m.heap_id,
            "unwind_rows": m.rows.len(),
        }),
        Resolution::Stub {
            start,
            offset,
            size,
            kind,
            heap_id,
            name,
        } => serde_json::json!({
            "kind": "stub", "stub_kind": kind, "start": start, "offset": offset,
            "size": size, "heap": heap_id,
            "stub_name": name.as_ref().map(|n| n.name()),
            "stub_owner": name.as_ref().map(|n| n.owner()),
        }),
        Resolution::Image {
            begin,
            end,
            offset,
            method,
        } => {
            let mut answer = serde_json::json!({
                "kind": "image", "begin": begin, "end": end, "offset": offset,
            });
            if let Some(m) = method {
                answer["method_id"] = m.method_id.into();
                answer["name"] = m.name.clone().into();
                answer["start"] = m.start.into();
                answer["method_offset"] = m.offset.into();
                answer["size"] = m.size.into();
            }
            answer
        }
        Resolution::Nothing => serde_json::json!({ "kind": "nothing" }),
        Resolution::Unknown(why) => serde_json::json!({
            "kind": "unknown",
            "why": match why { Unknown::Changing => "changing", Unknown::TooFar => "too_far" },
        }),
    }
}

/// Reads process `pid`: resolves `ips` and, with `list`, lists its sections
/// and their live blocks.
pub fn run(pid: i32, ips: &[u64], list: bool) -> Result<Inspection, RemoteError> {
    let descriptor = remote::process::find_descriptor(pid)?;
    let reader = RemoteReader::new(ProcessMemory::new(pid), descriptor)?;
    let began = Instant::now();
    let answers = ips
        .iter()
        .map(|&ip| reader.resolve(ip).map(|r| (ip, r)))
        .collect::<Result<Vec<_>, _>>()?;
    let ns_per_lookup = if ips.is_empty() {
        0.0
    } else {
        began.elapsed().as_nanos() as f64 / ips.len() as f64
    };
    let began = Instant::now();
    let listing = if list {
        let sections = reader.sections()?;
        Some(
            sections
                .into_iter()
                .map(|s| reader.blocks(&s).map(|b| (s, b)))
                .collect::<Result<Vec<_>, _>>()?,
        )
    } else {
        None
    };
    Ok(Inspection {
        pid,
        descriptor,
        answers,
        listing,
        ns_per_lookup,
        list_ms: began.elapsed().as_secs_f64() * 1e3,
        stats: reader.stats(),
    })
}

/// Parses an address: `0x`-prefixed hex, or decimal.
pub fn parse_address(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("not an address: {text:?} (use 0x-prefixed hex or decimal)"))
}

/// An address range to resolve byte by byte: `START:LEN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    /// First address.
    pub start: u64,
    /// Bytes.
    pub len: u64,
}

/// Parses `START:LEN` (each 0x-prefixed hex or decimal; at most 16 MiB).
pub fn parse_range(text: &str) -> Result<ByteRange, String> {
    let (start, len) = text
        .split_once(':')
        .ok_or_else(|| format!("not a range: {text:?} (use START:LEN)"))?;
    let (start, len) = (parse_address(start)?, parse_address(len)?);
    if len == 0 || len > 16 << 20 || start.checked_add(len).is_none() {
        return Err(format!("range length must be 1..=16 MiB: {text:?}"));
    }
    Ok(ByteRange { start, len })
}

/// A stretch of bytes of a range that resolve alike (same answer but for the
/// offset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// First address.
    pub from: u64,
    /// One past the last.
    pub to: u64,
    /// What the first address resolved to.
    pub answer: DotnetResolution,
}

/// What `inspect --dotnet` found.
#[derive(Debug)]
pub struct DotnetInspection {
    /// The process.
    pub pid: i32,
    /// Its runtime.
    pub runtime: Runtime,
    /// Each asked address and what it is.
    pub answers: Vec<(u64, DotnetResolution)>,
    /// Each asked range and its runs.
    pub ranges: Vec<(ByteRange, Vec<Run>)>,
    /// With `--list`: each range section, and for code heaps each start with
    /// what it resolves to.
    pub listing: Option<Vec<(DotnetSection, Vec<DotnetResolution>)>>,
    /// Lookups made for addresses and ranges.
    pub lookups: u64,
    /// Memory reads they made.
    pub lookup_reads: u64,
    /// Nanoseconds per lookup (mean).
    pub ns_per_lookup: f64,
    /// Milliseconds the listing took.
    pub list_ms: f64,
    /// The name of each method answered, by `MethodDesc`: from its
    /// assembly's metadata, or why it has none.
    pub names: BTreeMap<u64, String>,
}

/// Whether two answers name the same thing (offsets aside).
fn same_target(a: &DotnetResolution, b: &DotnetResolution) -> bool {
    match (a, b) {
        (DotnetResolution::Method { start: s, .. }, DotnetResolution::Method { start: t, .. }) => {
            s == t
        }
        _ => a == b,
    }
}

/// Reads the CoreCLR 8 process `pid`: resolves `ips` and every byte of
/// `ranges`, and with `list` lists its range sections and code starts.
pub fn run_dotnet(
    pid: i32,
    ips: &[u64],
    ranges: &[ByteRange],
    list: bool,
) -> Result<DotnetInspection, RemoteError> {
    let memory = ProcessMemory::new(pid);
    let runtime = dotnet::find_runtime(pid, &memory)?;
    let reader = DotnetReader::new(memory, &runtime);
    let began = Instant::now();
    let answers = ips
        .iter()
        .map(|&ip| reader.resolve(ip).map(|r| (ip, r)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut lookups = ips.len() as u64;
    let mut runs_of = Vec::with_capacity(ranges.len());
    for &range in ranges {
        let mut runs: Vec<Run> = Vec::new();
        for ip in range.start..range.start + range.len {
            let answer = reader.resolve(ip)?;
            match runs.last_mut() {
                Some(run) if same_target(&run.answer, &answer) => run.to = ip + 1,
                _ => runs.push(Run {
                    from: ip,
                    to: ip + 1,
                    answer,
                }),
            }
        }
        lookups += range.len;
        runs_of.push((range, runs));
    }
    let lookup_reads = reader.reads();
    let ns_per_lookup = if lookups == 0 {
        0.0
    } else {
        began.elapsed().as_nanos() as f64 / lookups as f64
    };
    let began = Instant::now();
    let listing = if list {
        let mut listing = Vec::new();
        for section in reader.sections()? {
            let blocks = reader
                .starts(&section)?
                .into_iter()
                .map(|s| reader.resolve(s))
                .collect::<Result<Vec<_>, _>>()?;
            listing.push((section, blocks));
        }
        Some(listing)
    } else {
        None
    };
    let list_ms = began.elapsed().as_secs_f64() * 1e3;
    let mut namer = MethodNames::new(pid, ProcessMemory::new(pid), runtime.layout);
    let mut names = BTreeMap::new();
    let answered = answers
        .iter()
        .map(|(_, a)| a)
        .chain(
            runs_of
                .iter()
                .flat_map(|(_, runs)| runs.iter().map(|r| &r.answer)),
        )
        .chain(listing.iter().flatten().flat_map(|(_, blocks)| blocks));
    for answer in answered {
        if let DotnetResolution::Method { method_desc, .. } = *answer {
            names
                .entry(method_desc)
                .or_insert_with(|| match namer.name(method_desc) {
                    Ok(name) => name.to_string(),
                    Err(e) => format!("[.NET: {e}]"),
                });
        }
    }
    Ok(DotnetInspection {
        pid,
        runtime,
        answers,
        ranges: runs_of,
        listing,
        lookups,
        lookup_reads,
        ns_per_lookup,
        list_ms,
        names,
    })
}

impl Report for DotnetInspection {
    /// Whether every asked address and range byte named a method, stub or section.
    fn all_resolved(&self) -> bool {
        let resolved = |r: &DotnetResolution| {
            !matches!(r, DotnetResolution::Nothing | DotnetResolution::Unknown(_))
        };
        self.answers.iter().all(|(_, r)| resolved(r))
            && self
                .ranges
                .iter()
                .all(|(_, runs)| runs.iter().all(|run| resolved(&run.answer)))
    }

    fn text(&self) -> String {
        let mut out = String::new();
        let r = &self.runtime;
        let _ = writeln!(
            out,
            "process {} CoreCLR {} ({}) g_dacTable {:#x} code range map {:#x}",
            self.pid, r.version, r.coreclr, r.dac_table, r.code_range_map
        );
        for (ip, answer) in &self.answers {
            let _ = writeln!(out, "{ip:#x} {}", describe_dotnet(answer, &self.names));
        }
        for (range, runs) in &self.ranges {
            let _ = writeln!(out, "{:#x}:{:#x}", range.start, range.len);
            for run in runs {
                let _ = writeln!(
                    out,
                    "  {:#x}..{:#x} {}",
                    run.from,
                    run.to,
                    describe_dotnet(&run.answer, &self.names)
                );
            }
        }
        if let Some(listing) = &self.listing {
            for (section, blocks) in listing {
                let _ = writeln!(
                    out,
                    "{} {:#x}..{:#x} flags {:#x} blocks={}",
                    dotnet_kind(&section.kind),
                    section.begin,
                    section.end,
                    section.flags,
                    blocks.len()
                );
            }
            let _ = writeln!(out, "listed in {:.2} ms", self.list_ms);
        }
        let _ = write!(
            out,
            "lookups={} reads/lookup mean={:.2}",
            self.lookups,
            self.lookup_reads as f64 / self.lookups.max(1) as f64,
        );
        if self.lookups > 0 {
            let _ = write!(out, " ns/lookup={:.0}", self.ns_per_lookup);
        }
        out.push('\n');
        out
    }

    fn json(&self) -> serde_json::Value {
        let listing = self.listing.as_ref().map(|listing| {
            listing
                .iter()
                .map(|(section, blocks)| {
                    serde_json::json!({
                        "kind": dotnet_kind(&section.kind),
                        "range_section": section.address,
                        "begin": section.begin,
                        "end": section.end,
                        "flags": section.flags,
                        "blocks": blocks.iter().map(|b| dotnet_json(b, &self.names)).collect::<Vec<_>>(),
                    })
                })
                .collect::<Vec<_>>()
        });
        serde_json::json!({
            "pid": self.pid,
            "runtime": {
                "coreclr": self.runtime.coreclr,
                "version": self.runtime.version,
                "dac_table": self.runtime.dac_table,
                "code_range_map": self.runtime.code_range_map,
            },
            "answers": answers_json(&self.answers, |a| dotnet_json(a, &self.names)),
            "ranges": self.ranges.iter().map(|(range, runs)| serde_json::json!({
                "start": range.start,
                "len": range.len,
                "runs": runs.iter().map(|run| {
                    let mut v = dotnet_json(&run.answer, &self.names);
                    v["from"] = serde_json::json!(run.from);
                    v["to"] = serde_json::json!(run.to);
                    v
                }).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "sections": listing,
            "lookups": self.lookups,
            "reads_mean": self.lookup_reads as f64 / self.lookups.max(1) as f64,
            "ns_per_lookup": self.ns_per_lookup,
            "list_ms": self.list_ms,
        })
    }
}

fn dotnet_kind(kind: &DotnetSectionKind) -> &'static str {
    match kind {
        DotnetSectionKind::CodeHeap { .. } => "code_heap",
        DotnetSectionKind::RangeList { .. } => "range_list",
        DotnetSectionKind::ReadyToRun { .. } => "ready_to_run",
    }
}

/// One line for a .NET answer; a method's with its name from `names`.
pub fn describe_dotnet(r: &DotnetResolution, names: &BTreeMap<u64, String>) -> String {
    match r {
        DotnetResolution::Method {
            start,
            offset,
            code_header,
            method_desc,
        } => format!(
            "method desc {method_desc:#x} start {start:#x} +{offset:#x} header {code_header:#x} {}",
            names.get(method_desc).map_or("", String::as_str)
        ),
        DotnetResolution::StubBlock { start, kind } => {
            format!("stub block kind {kind} start {start:#x}")
        }
        DotnetResolution::Section(s) => {
            format!("{} {:#x}..{:#x}", dotnet_kind(&s.kind), s.begin, s.end)
        }
        DotnetResolution::Nothing => "nothing".to_string(),
        DotnetResolution::Unknown(_) => "unknown (v1 start too far back)".to_string(),
    }
}

/// A .NET answer as JSON, with a `kind` of method, stub_block, section,
/// nothing or unknown; a method's with its `name` from `names`.
pub fn dotnet_json(r: &DotnetResolution, names: &BTreeMap<u64, String>) -> serde_json::Value {
    match r {
        DotnetResolution::Method {
            start,
            offset,
            code_header,
            method_desc,
        } => serde_json::json!({
            "kind": "method", "start": start, "offset": offset,
            "code_header": code_header, "method_desc": method_desc,
            "name": names.get(method_desc),
        }),
        DotnetResolution::StubBlock { start, kind } => {
            serde_json::json!({ "kind": "stub_block", "start": start, "stub_kind": kind })
        }
        DotnetResolution::Section(s) => serde_json::json!({
            "kind": "section", "section": dotnet_kind(&s.kind), "begin": s.begin, "end": s.end,
        }),
        DotnetResolution::Nothing => serde_json::json!({ "kind": "nothing" }),
        DotnetResolution::Unknown(_) => serde_json::json!({ "kind": "unknown", "why": "too_far" }),
    }
}

/// What to tell the user when process `pid` could not be read, in the words
/// `jitmap profile` uses: no such process, or the missing privilege and how
/// to get it, else the reader's error.
///
/// ```
/// use jitmap::remote::RemoteError;
/// use jitmap_cli::inspect::unreadable;
/// let gone = RemoteError::Proc { pid: 7, errno: libc::ENOENT };
/// assert_eq!(unreadable(7, &gone), "no process 7");
/// let denied = RemoteError::Proc { pid: 1, errno: libc::EACCES };
/// assert!(unreadable(1, &denied).ends_with("(needs ptrace permission: the same user, or CAP_SYS_PTRACE)"));
/// ```
pub fn unreadable(pid: i32, e: &RemoteError) -> String {
    match e {
        RemoteError::Proc {
            errno: libc::ENOENT | libc::ESRCH,
            ..
        }
        | RemoteError::Unreadable {
            errno: libc::ESRCH, ..
        } => format!("no process {pid}"),
        RemoteError::Unreadable {
            errno: libc::EPERM | libc::EACCES,
            ..
        }
        | RemoteError::Proc {
            errno: libc::EPERM | libc::EACCES,
            ..
        } => format!(
            "reading process {pid}: {e} (needs ptrace permission: the same user, or CAP_SYS_PTRACE)"
        ),
        other => format!("process {pid}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stub's line says its kind's name and owner, or that it has none.
    #[test]
    fn a_stub_is_described_by_its_kinds_name() {
        let stub = |name| Resolution::Stub {
            heap_id: 3,
            start: 0x1000,
            offset: 4,
            size: 16,
            kind: 1,
            name,
        };
        let named = jitmap::StubKindName::new("jitmap-cranelift", "trampoline").unwrap();
        assert_eq!(
            describe(&stub(Some(named))),
            "stub kind 1: trampoline (jitmap-cranelift) start 0x1000 +0x4 size 16 heap 3"
        );
        assert_eq!(
            describe(&stub(None)),
            "stub kind 1 (unnamed) start 0x1000 +0x4 size 16 heap 3"
        );
    }
}
