//! `jitmap jitdump-check`'s text: a jitdump file's header, records and
//! violations as [`jitmap::perf::check`] finds them, one line each.

use std::fmt::Write as _;

use jitmap::perf::check::{Body, Report};

/// The report as text: a `header` line, a `record` line per record, a
/// `violation` line per violation, and a closing `records=… violations=…
/// clean_bytes=…` line.
///
/// ```
/// let text = jitmap_cli::jitdump::render(&jitmap::perf::check::check(b""));
/// assert!(text.ends_with("records=0 violations=1 clean_bytes=0\n"), "{text}");
/// ```
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    if let Some(h) = &report.header {
        let _ = writeln!(
            out,
            "header version={} size={} elf_mach={} pid={} timestamp={} flags={:#x}",
            h.version, h.total_size, h.elf_mach, h.pid, h.timestamp, h.flags
        );
    }
    for r in &report.records {
        let _ = writeln!(
            out,
            "record offset={} size={} timestamp={} {}",
            r.offset,
            r.size,
            r.timestamp,
            body(&r.body)
        );
    }
    for v in &report.violations {
        let _ = writeln!(out, "violation {v}");
    }
    let _ = writeln!(
        out,
        "records={} violations={} clean_bytes={}",
        report.records.len(),
        report.violations.len(),
        report.clean_len
    );
    out
}

/// One record's body, after its offset, size and timestamp.
fn body(body: &Body) -> String {
    match body {
        Body::Load {
            tid,
            code_addr,
            code_size,
            code_index,
            name,
            ..
        } => format!(
            "load tid={tid} addr={code_addr:#x} size={code_size} index={code_index} name={name}"
        ),
        Body::Move {
            old_addr,
            new_addr,
            code_size,
            code_index,
            ..
        } => format!("move {old_addr:#x} -> {new_addr:#x} size={code_size} index={code_index}"),
        Body::DebugInfo { code_addr, rows } => {
            format!("debug-info addr={code_addr:#x} rows={}", rows.len())
        }
        Body::UnwindingInfo {
            eh_frame,
            eh_frame_hdr,
            mapped_size,
        } => format!(
            "unwinding-info eh_frame={} eh_frame_hdr={} mapped={mapped_size}",
            eh_frame.len(),
            eh_frame_hdr.len()
        ),
        Body::Close => "close".to_owned(),
        Body::Unknown { id } => format!("unknown id={id}"),
    }
}
