//! jitdump: byte-exact records, the writer's files read back by our validator and
//! by an independent parser (linux-perf-data), and every validator violation.
#![cfg(target_endian = "little")]

use std::path::PathBuf;
use std::sync::Arc;

mod common;

use jitmap::CodeInfo;
use jitmap::events::CodeListener;
use jitmap::heap::{DebugEntry, EhFrame, JitKind};
use jitmap::perf::check::{Body, DebugRow, Violation, check};
use jitmap::perf::jitdump::{
    encode_close, encode_debug_info, encode_header, encode_load_prefix, encode_move,
    encode_unwinding_info,
};
use jitmap::perf::{JitDump, PerfMap, PerfMode};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("jitmap-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn header_bytes() {
    let h = encode_header(0x1234, 0x1122_3344_5566_7788);
    // EM_AARCH64 (183) or EM_X86_64 (62).
    let machine = if cfg!(target_arch = "aarch64") {
        0xb7
    } else {
        0x3e
    };
    assert_eq!(
        hex(&h),
        format!(
            "4454694a\
         01000000\
         28000000\
         {machine:02x}000000\
         00000000\
         34120000\
         8877665544332211\
         0000000000000000"
        )
    );
}

#[test]
fn load_record_bytes() {
    let p = encode_load_prefix(0x10, 7, 8, 0x7f00_0000_1000, 3, 5, "f\0g");
    assert_eq!(
        hex(&p),
        "00000000\
         3f000000\
         1000000000000000\
         07000000\
         08000000\
         0010000000 7f0000"
            .replace(' ', "")
            + "00100000007f0000"
            + "0300000000000000"
            + "0500000000000000"
            + "663f6700"
    );
    // 16 (header) + 40 (fields) + 4 (name + NUL) + 3 (code) = 63 = 0x3f: no padding.
    assert_eq!(p.len() + 3, 0x3f);
}

#[test]
fn move_record_bytes() {
    let m = encode_move(0x20, 1, 2, 0x1000, 0x2000, 0x30, 9);
    assert_eq!(
        hex(&m),
        "01000000400000002000000000000000\
         0100000002000000\
         0020000000000000\
         0010000000000000\
         0020000000000000\
         3000000000000000\
         0900000000000000"
    );
}

#[test]
fn debug_info_record_bytes() {
    let rows = [
        DebugEntry {
            offset: 0,
            line: 3,
            column: 1,
            file: "a.rs".into(),
        },
        DebugEntry {
            offset: 8,
            line: 4,
            column: 2,
            file: "a.rs".into(),
        },
    ];
    let d = encode_debug_info(0x30, 0x4000, &rows);
    assert_eq!(
        hex(&d),
        "02000000\
         4a000000\
         3000000000000000\
         0040000000000000\
         0200000000000000\
         0040000000000000030000000100000061 2e727300"
            .replace(' ', "")
            + "0840000000000000040000000200000061"
            + "2e727300"
    );
}

#[test]
fn unwinding_record_bytes() {
    let eh = EhFrame {
        frame: vec![0xAA; 5].into_boxed_slice(),
        header: vec![0xBB; 2].into_boxed_slice(),
    };
    let u = encode_unwinding_info(0x40, &eh);
    assert_eq!(
        hex(&u),
        "04000000\
         30000000\
         4000000000000000\
         0700000000000000\
         0200000000000000\
         0000000000000000\
         aaaaaaaaaa\
         bbbb\
         00"
    );
    assert_eq!(u.len() % 8, 0);
}

#[test]
fn close_record_bytes() {
    assert_eq!(hex(&encode_close(0x50)), "03000000100000005000000000000000");
}

fn info(id: u64, name: &str, eh: bool) -> CodeInfo {
    CodeInfo {
        debug: vec![
            DebugEntry {
                offset: 0,
                line: 10,
                column: 1,
                file: "/src/m.rs".into(),
            },
            DebugEntry {
                offset: 4,
                line: 11,
                column: 7,
                file: "/src/m.rs".into(),
            },
        ],
        eh_frame: eh.then(|| EhFrame {
            frame: vec![1, 2, 3, 4, 5, 6, 7, 8, 9].into(),
            header: vec![0xE0, 0xE1, 0xE2].into(),
        }),
        ..CodeInfo::new(id, name, JitKind::Optimized)
    }
}

/// The process has one jitdump writer at a time; the tests that open one
/// take turns.
static ONE_WRITER: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// The same for the perf map.
static ONE_MAP: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn writer_file_reads_back_exactly() {
    let _one = ONE_WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("jitdump-writer");
    let (_domain, heap) = common::small_heap(2);
    let dump = JitDump::open(&dir).unwrap();
    let path = dump.path().to_owned();
    assert_eq!(path, dir.join(format!("jit-{}.dump", std::process::id())));
    heap.listeners()
        .add(Arc::clone(&dump) as Arc<dyn CodeListener>)
        .unwrap();

    let publish = |id, name: &str, bytes: &[u8], eh| {
        let mut r = heap.reserve(bytes.len() as u64).unwrap();
        r.code_mut().copy_from_slice(bytes);
        r.publish(info(id, name, eh)).unwrap()
    };
    let a = publish(1, "alpha", &[0x90, 0x90, 0x90, 0x90, 0xC3], true);
    let b = publish(2, "beta", &[0xCC; 9], false);
    let moved = heap.move_block(a).unwrap();
    heap.free(b).unwrap();
    heap.listeners().flush();
    heap.listeners()
        .remove(&(Arc::clone(&dump) as Arc<dyn CodeListener>));
    assert_eq!(dump.errors(), 0);
    drop(dump);

    let bytes = std::fs::read(&path).unwrap();
    let report = check(&bytes);
    assert_eq!(report.violations, vec![]);
    assert_eq!(report.clean_len, bytes.len());
    let h = report.header.unwrap();
    assert_eq!(
        (h.version, h.total_size, h.elf_mach, h.pid),
        (
            1,
            40,
            jitmap::perf::jitdump::elf_machine(),
            std::process::id()
        )
    );
    let bodies: Vec<&Body> = report.records.iter().map(|r| &r.body).collect();
    assert_eq!(bodies.len(), 7, "{bodies:#?}");
    let rows = |start: usize| {
        vec![
            DebugRow {
                addr: start as u64,
                line: 10,
                column: 1,
                file: "/src/m.rs".into(),
            },
            DebugRow {
                addr: start as u64 + 4,
                line: 11,
                column: 7,
                file: "/src/m.rs".into(),
            },
        ]
    };
    assert_eq!(
        *bodies[0],
        Body::DebugInfo {
            code_addr: a.start() as u64,
            rows: rows(a.start())
        }
    );
    assert_eq!(
        *bodies[1],
        Body::UnwindingInfo {
            eh_frame: vec![1, 2, 3, 4, 5, 6, 7, 8, 9],
            eh_frame_hdr: vec![0xE0, 0xE1, 0xE2],
            mapped_size: 0
        }
    );
    let tid = jitmap::perf::jitdump::current_tid();
    let pid = std::process::id();
    assert_eq!(
        *bodies[2],
        Body::Load {
            pid,
            tid,
            vma: a.start() as u64,
            code_addr: a.start() as u64,
            code_size: 5,
            code_index: 0,
            name: "alpha".into(),
            code: vec![0x90, 0x90, 0x90, 0x90, 0xC3]
        }
    );
    assert_eq!(
        *bodies[3],
        Body::DebugInfo {
            code_addr: b.start() as u64,
            rows: rows(b.start())
        }
    );
    assert!(
        matches!(bodies[4], Body::Load { code_index: 1, name, code, .. } if name == "beta" && code == &vec![0xCC; 9])
    );
    assert_eq!(
        *bodies[5],
        Body::Move {
            pid,
            tid,
            vma: moved.start() as u64,
            old_addr: a.start() as u64,
            new_addr: moved.start() as u64,
            code_size: 5,
            code_index: 0
        }
    );
    assert_eq!(*bodies[6], Body::Close);
    // Timestamps never go backwards, and a load's is taken before it returns.
    assert!(
        report
            .records
            .windows(2)
            .all(|w| w[0].timestamp <= w[1].timestamp)
    );

    // An independent parser agrees on names, addresses, code bytes and lines.
    let mut reader =
        linux_perf_data::jitdump::JitDumpReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    // linux-perf-data does not check the version; we do.
    assert_eq!(reader.header().version, 1);
    let mut loads = Vec::new();
    let mut lines = Vec::new();
    let mut unwind = Vec::new();
    while let Some(raw) = reader.next_record().unwrap() {
        let size = raw.record_size as usize;
        match raw.parse().unwrap() {
            linux_perf_data::jitdump::JitDumpRecord::CodeLoad(l) => {
                let name = l.function_name.as_slice().to_vec();
                let code = l.code_bytes.as_slice().to_vec();
                // It tolerates padding; we assert there is none.
                assert_eq!(size, 16 + 40 + name.len() + 1 + code.len());
                loads.push((
                    String::from_utf8(name).unwrap(),
                    l.code_addr,
                    code,
                    l.code_index,
                ));
            }
            linux_perf_data::jitdump::JitDumpRecord::CodeDebugInfo(d) => {
                lines.push(
                    d.entries
                        .iter()
                        .map(|e| (e.code_addr, e.line, e.column))
                        .collect::<Vec<_>>(),
                );
            }
            linux_perf_data::jitdump::JitDumpRecord::CodeUnwindingInfo(u) => {
                // It labels the halves in reverse: its "eh_frame_hdr" is the first
                // eh_frame_hdr_size bytes, which perf (and we) treat as .eh_frame's start.
                let mut all = u.eh_frame_hdr.as_slice().to_vec();
                all.extend_from_slice(&u.eh_frame.as_slice());
                unwind.push((all, u.mapped_size));
            }
            _ => {}
        }
    }
    assert_eq!(
        loads,
        vec![
            (
                "alpha".into(),
                a.start() as u64,
                vec![0x90, 0x90, 0x90, 0x90, 0xC3],
                0
            ),
            ("beta".into(), b.start() as u64, vec![0xCC; 9], 1),
        ]
    );
    let a0 = a.start() as u64;
    let b0 = b.start() as u64;
    assert_eq!(
        lines,
        vec![
            vec![(a0, 10, 1), (a0 + 4, 11, 7)],
            vec![(b0, 10, 1), (b0 + 4, 11, 7)]
        ]
    );
    assert_eq!(
        unwind,
        vec![(vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 0xE0, 0xE1, 0xE2], 0)]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The unwinding tables of `(code address, code size, unwinding record)`
/// triples in a dump, in file order, read by linux-perf-data: each method's
/// start, size and the `mapped_size` perf maps after its code.
fn unwinding_of(path: &std::path::Path) -> Vec<(u64, u64, u64)> {
    let mut reader =
        linux_perf_data::jitdump::JitDumpReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut mapped = Vec::new();
    let mut out = Vec::new();
    while let Some(raw) = reader.next_record().unwrap() {
        match raw.parse().unwrap() {
            // The unwinding record comes before its method's load record.
            linux_perf_data::jitdump::JitDumpRecord::CodeUnwindingInfo(u) => {
                mapped.push(u.mapped_size);
            }
            linux_perf_data::jitdump::JitDumpRecord::CodeLoad(l) => {
                out.push((
                    l.code_addr,
                    l.code_bytes.len() as u64,
                    mapped.pop().unwrap(),
                ));
            }
            _ => {}
        }
    }
    out
}

/// perf maps a method's unwinding tables right after its code: the jitdump
/// asks for that only where no other method's code can be, so perf never
/// takes a method's first bytes for another's tables.
#[test]
fn unwinding_tables_are_mapped_only_where_they_fit() {
    let _one = ONE_WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("jitdump-room");
    let dump = JitDump::open(&dir).unwrap();
    let path = dump.path().to_owned();
    let rows = jitmap_testkit::frameless::FRAME_POINTER_CFI;
    let mut results = Vec::new();
    for room in [0, 256] {
        let domain = jitmap::epoch::Domain::new(2);
        let heap = jitmap::CodeHeap::new(
            jitmap::HeapConfig {
                span: 1 << 20,
                unwind_room: room,
                ..jitmap::HeapConfig::default()
            },
            &domain,
        )
        .unwrap();
        heap.listeners()
            .add(Arc::clone(&dump) as Arc<dyn CodeListener>)
            .unwrap();
        // Three 18-byte methods with frame-pointer CFI, one after another.
        let mut code = Vec::new();
        for id in 1..=3 {
            let mut r = heap.reserve(18).unwrap();
            r.code_mut().fill(0x90);
            let eh = EhFrame {
                frame: jitmap_testkit::frameless::eh_frame(r.address(), 18, rows),
                header: Box::new([]),
            };
            code.push(
                r.publish(CodeInfo {
                    eh_frame: Some(eh),
                    ..CodeInfo::new(id, "m", JitKind::Optimized)
                })
                .unwrap(),
            );
        }
        heap.listeners().flush();
        heap.listeners()
            .remove(&(Arc::clone(&dump) as Arc<dyn CodeListener>));
        results.push(code.iter().map(|c| c.start() as u64).collect::<Vec<_>>());
    }
    assert_eq!(dump.errors(), 0);
    // Without room no method's tables are mapped; with 256 bytes all are.
    assert_eq!(dump.unmapped_tables(), 3);
    drop(dump);
    let records = unwinding_of(&path);
    assert_eq!(records.len(), 6);
    // The rewritten tables: one CIE and one FDE with four rows, then the
    // header with its one-entry search table.
    let tables = 0x60;
    let expected: Vec<_> = results
        .iter()
        .zip([0, tables])
        .flat_map(|(starts, mapped)| starts.iter().map(move |&s| (s, 18, mapped)))
        .collect();
    assert_eq!(records, expected);
    // Where mapped, perf's mapping (code, padding to 8, tables) ends before
    // the next method's code.
    for pair in results[1].windows(2) {
        assert!(pair[0] + 24 + tables <= pair[1], "{pair:x?}");
    }
    // Without room, the same mapping would have reached the next method.
    assert!(
        results[0][0] + 24 + tables > results[0][1],
        "{:x?}",
        results[0]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn file_with(records: &[Vec<u8>], version: u32) -> Vec<u8> {
    let mut f = encode_header(1, 2).to_vec();
    f[4..8].copy_from_slice(&version.to_ne_bytes());
    for r in records {
        f.extend_from_slice(r);
    }
    f
}

fn load(name: &str, code: &[u8]) -> Vec<u8> {
    let mut r = encode_load_prefix(5, 1, 1, 0x1000, code.len() as u64, 0, name);
    r.extend_from_slice(code);
    r
}

#[test]
fn validator_reports_each_violation() {
    let ok = load("f", &[0xC3]);
    assert_eq!(
        check(&file_with(std::slice::from_ref(&ok), 1)).violations,
        vec![]
    );
    assert_eq!(
        check(&file_with(std::slice::from_ref(&ok), 2)).violations,
        vec![Violation::BadVersion { version: 2 }]
    );
    assert_eq!(
        check(&[0; 10]).violations,
        vec![Violation::ShortHeader { len: 10 }]
    );
    let mut swapped = file_with(&[], 1);
    swapped[0..4].copy_from_slice(&0x4A69_5444u32.to_be_bytes());
    assert_eq!(
        check(&swapped).violations,
        vec![Violation::BadMagic { magic: 0x4454_694A }]
    );
    let mut big_header = file_with(&[], 1);
    big_header[8..12].copy_from_slice(&48u32.to_ne_bytes());
    big_header.extend_from_slice(&[0; 8]);
    assert_eq!(
        check(&big_header).violations,
        vec![Violation::BadHeaderSize { size: 48 }]
    );

    let mut padded = ok.clone();
    padded.extend_from_slice(&[0, 0, 0]);
    let len = padded.len() as u32;
    padded[4..8].copy_from_slice(&len.to_ne_bytes());
    assert_eq!(
        check(&file_with(&[padded], 1)).violations,
        vec![Violation::LoadPadding {
            offset: 40,
            extra: 3
        }]
    );

    let truncated = file_with(&[ok.clone(), ok[..30].to_vec()], 1);
    let r = check(&truncated);
    assert_eq!(
        r.violations,
        vec![Violation::TruncatedTail {
            offset: 40 + ok.len(),
            size: ok.len() as u32,
            available: 30
        }]
    );
    assert_eq!((r.records.len(), r.clean_len), (1, 40 + ok.len()));

    let mut tiny = encode_close(1);
    tiny[4..8].copy_from_slice(&8u32.to_ne_bytes());
    assert_eq!(
        check(&file_with(&[tiny], 1)).violations,
        vec![Violation::RecordTooSmall {
            offset: 40,
            size: 8
        }]
    );

    let rows = [
        DebugEntry {
            offset: 8,
            line: 1,
            column: 0,
            file: "x".into(),
        },
        DebugEntry {
            offset: 4,
            line: 2,
            column: 0,
            file: "x".into(),
        },
    ];
    let unsorted = encode_debug_info(1, 0x1000, &rows);
    assert_eq!(
        check(&file_with(&[unsorted], 1)).violations,
        vec![Violation::UnsortedDebug { offset: 40 }]
    );

    let mut unknown = encode_close(1);
    unknown[0..4].copy_from_slice(&9u32.to_ne_bytes());
    assert_eq!(
        check(&file_with(&[unknown], 1)).violations,
        vec![Violation::UnknownRecord { offset: 40, id: 9 }]
    );

    let mut long_close = encode_close(1);
    long_close.extend_from_slice(&[0; 8]);
    long_close[4..8].copy_from_slice(&24u32.to_ne_bytes());
    assert_eq!(
        check(&file_with(&[long_close], 1)).violations,
        vec![Violation::BadCloseSize {
            offset: 40,
            size: 24
        }]
    );

    let mut no_nul = load("abc", &[]);
    no_nul.pop();
    let len = no_nul.len() as u32;
    no_nul[4..8].copy_from_slice(&len.to_ne_bytes());
    assert_eq!(
        check(&file_with(&[no_nul], 1)).violations,
        vec![Violation::Malformed {
            offset: 40,
            what: "unterminated function name"
        }]
    );
}

#[test]
fn perf_map_lines_match_published_blocks() {
    let _one = ONE_MAP.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("perf-map");
    let (_domain, heap) = common::small_heap(2);
    let map = PerfMap::open(&dir).unwrap();
    heap.listeners()
        .add(Arc::clone(&map) as Arc<dyn CodeListener>)
        .unwrap();
    let mut expected = String::new();
    let mut refs = Vec::new();
    for (i, name) in ["one", "two\nlines", "tab\there"].into_iter().enumerate() {
        let size = 16 + 100 * i as u64;
        let r = heap
            .reserve(size)
            .unwrap()
            .publish(CodeInfo::new(i as u64, name, JitKind::Baseline))
            .unwrap();
        expected += &format!(
            "{:x} {:x} {}\n",
            r.start(),
            size,
            name.replace(['\n', '\t'], " ")
        );
        refs.push(r);
    }
    let moved = heap.move_block(refs[0]).unwrap();
    expected += &format!("{:x} 10 one\n", moved.start());
    heap.free(refs[1]).unwrap();
    heap.listeners().flush();
    assert_eq!(std::fs::read_to_string(map.path()).unwrap(), expected);
    assert_eq!(map.errors(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn perf_modes_parse() {
    assert_eq!("jitdump".parse(), Ok(PerfMode::JitDump));
    assert_eq!("map".parse(), Ok(PerfMode::Map));
    assert_eq!("both".parse(), Ok(PerfMode::Both));
    assert_eq!("off".parse(), Ok(PerfMode::Off));
    assert!("JITDUMP".parse::<PerfMode>().is_err());
}

/// Set in the child of `a_dump_that_cannot_be_written_ends_at_its_last_whole_record`:
/// the directory its outputs go to.
const FULL_DISK_CHILD: &str = "JITMAP_TEST_FULL_DISK_DIR";
/// The child's file-size limit: what a full disk looks like to a writer.
const FILE_LIMIT: u64 = 64 * 1024;
/// Methods the child publishes (about 1.5 KB of jitdump and 0.4 KB of perf
/// map each: both outputs overflow the limit).
const FULL_DISK_METHODS: u64 = 200;

/// The child: publishes with both outputs under `RLIMIT_FSIZE`, then prints
/// what each wrote and lost.
fn full_disk_child(dir: &std::path::Path) {
    let limit = libc::rlimit {
        rlim_cur: FILE_LIMIT,
        rlim_max: FILE_LIMIT,
    };
    // SAFETY: a plain system call. SIGXFSZ keeps its default action (end
    // the process): the writers must not let a write past the limit raise it.
    unsafe {
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
    }
    let manager = jitmap::ExecutionManager::new(2);
    let output = jitmap::perf::PerfConfig {
        mode: PerfMode::Both,
        dir: dir.to_path_buf(),
    }
    .install(manager.listeners())
    .unwrap();
    let heap = manager.create_heap(jitmap::HeapConfig::default()).unwrap();
    let mut code = Vec::new();
    for i in 0..FULL_DISK_METHODS {
        let mut r = heap.reserve(1000).unwrap();
        r.code_mut().fill(0xC3);
        let name = format!("m{i:04}_{}", "x".repeat(400));
        code.push(
            r.publish(CodeInfo::new(i, name, JitKind::Optimized))
                .unwrap(),
        );
    }
    // Events reach the writers on the dispatcher thread: wait for all.
    manager.listeners().flush();
    let dump = output.jitdump.as_ref().unwrap();
    let map = output.perf_map.as_ref().unwrap();
    let errno = |f: Option<jitmap::perf::WriteFailure>| f.and_then(|f| f.errno).unwrap_or(0);
    println!(
        "dump {} lost {} errno {}",
        dump.path().display(),
        dump.lost(),
        errno(dump.failure())
    );
    println!(
        "map {} lost {} errno {}",
        map.path().display(),
        map.lost(),
        errno(map.failure())
    );
    for warning in output.warnings() {
        println!("warning {warning}");
    }
}

/// Writes past a file-size limit fail (part of a record may be written
/// first): each output stops there, cut back to its last whole record, and
/// reports exactly how much it lost and why.
#[test]
fn a_dump_that_cannot_be_written_ends_at_its_last_whole_record() {
    if let Some(dir) = std::env::var_os(FULL_DISK_CHILD) {
        full_disk_child(std::path::Path::new(&dir));
        return;
    }
    let dir = temp_dir("full-disk");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_dump_that_cannot_be_written_ends_at_its_last_whole_record",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FULL_DISK_CHILD, &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |what: &str| -> (PathBuf, u64, i32) {
        let l = stdout
            .lines()
            .find_map(|l| {
                l.find(&format!("{what} /"))
                    .map(|at| &l[at + what.len() + 1..])
            })
            .unwrap_or_else(|| panic!("no {what} line in {stdout}"));
        let f: Vec<&str> = l.split(' ').collect();
        (f[0].into(), f[2].parse().unwrap(), f[4].parse().unwrap())
    };

    let (path, lost, errno) = line("dump");
    let bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() as u64 <= FILE_LIMIT);
    let report = check(&bytes);
    assert_eq!(report.violations, vec![], "the dump does not validate");
    assert_eq!(
        report.clean_len,
        bytes.len(),
        "the dump ends in a torn record"
    );
    let loads = report
        .records
        .iter()
        .filter(|r| matches!(r.body, Body::Load { .. }))
        .count() as u64;
    assert!(loads > 0 && lost > 0, "{loads} loads, {lost} lost");
    assert_eq!(
        loads + lost,
        FULL_DISK_METHODS,
        "every method written or counted lost"
    );
    assert_eq!(errno, libc::EFBIG);

    let (path, lost, errno) = line("map");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.ends_with('\n'), "the map ends in a torn line");
    let lines = text.lines().count() as u64;
    assert!(lines > 0 && lost > 0, "{lines} lines, {lost} lost");
    assert_eq!(lines + lost, FULL_DISK_METHODS);
    assert_eq!(errno, libc::EFBIG);
    // The warnings a tool prints name both losses.
    let warnings: Vec<&str> = stdout.lines().filter(|l| l.contains("warning /")).collect();
    assert_eq!(warnings.len(), 2, "{stdout}");
    assert!(
        warnings[0].contains(&format!(
            "{} code events not written",
            FULL_DISK_METHODS - loads
        )),
        "{}",
        warnings[0]
    );
    assert!(warnings[0].contains("File too large"), "{}", warnings[0]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Records which image events arrive, in order.
#[derive(Default)]
struct ImageEvents(parking_lot::Mutex<Vec<(char, usize)>>);

impl CodeListener for ImageEvents {
    fn on_event(&self, event: &jitmap::events::CodeEvent) {
        use jitmap::events::CodeEvent;
        let seen = match event {
            CodeEvent::ImageLoad(l) => ('L', l.image.base()),
            CodeEvent::ImageUnload(u) => ('U', u.base),
            _ => return,
        };
        self.0.lock().push(seen);
    }
}

#[test]
fn perf_map_names_an_images_named_methods_and_listeners_see_its_load_and_unload() {
    use jitmap::ExecutionManager;
    use jitmap::image::{ImageFunction, ImageInfo, ImageMethod};
    let _one = ONE_MAP.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("perf-map-image");
    let manager = ExecutionManager::new(4);
    let map = PerfMap::open(&dir).unwrap();
    let events = Arc::new(ImageEvents::default());
    manager
        .listeners()
        .add(Arc::clone(&map) as Arc<dyn CodeListener>)
        .unwrap();
    manager
        .listeners()
        .add(Arc::clone(&events) as Arc<dyn CodeListener>)
        .unwrap();
    let f = |begin, end| ImageFunction {
        begin,
        end,
        unwind: Box::new([]),
    };
    let m = |entry, method_id, name: &str| ImageMethod {
        entry,
        method_id,
        gc: None,
        debug: vec![],
        name: name.to_owned(),
    };
    let base = 0x7100_0000_0000;
    // A main body with a funclet (its hot size counts both), an unnamed
    // method (no line), and a name with a newline (made a space).
    let info = ImageInfo {
        base,
        size: 0x1000,
        functions: vec![
            f(0x100, 0x140),
            f(0x140, 0x160),
            f(0x200, 0x210),
            f(0x300, 0x308),
        ],
        methods: vec![m(0x100, 1, "g::a"), m(0x200, 2, ""), m(0x300, 3, "g::b\nc")],
        ..ImageInfo::default()
    };
    assert_eq!(manager.load_image(info.clone()), Ok(base));
    // A second load at the same place is refused, and announced by no event.
    assert!(manager.load_image(info).is_err());
    assert_eq!(manager.images().len(), 1);
    manager.unload_image(base).unwrap();
    assert!(manager.images().is_empty());
    manager.listeners().flush();
    assert_eq!(
        std::fs::read_to_string(map.path()).unwrap(),
        format!("{:x} 60 g::a\n{:x} 8 g::b c\n", base + 0x100, base + 0x300)
    );
    assert_eq!(*events.0.lock(), [('L', base), ('U', base)]);
}
