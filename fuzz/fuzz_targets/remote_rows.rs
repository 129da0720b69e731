//! The out-of-process reader on descriptor layout 2, over this process's
//! own heap: methods with unwind rows evaluated from arbitrary call-frame
//! instructions, read through a memory view in which the input may alter
//! any byte of a method's prefix, code header, name or rows.
//!
//! Unaltered, every method resolves exactly as in process, rows included.
//! Altered, every answer is a typed error, another resolution, or a method
//! whose rows are sorted, inside it and of defined kinds; the reads stay
//! within the reader's bound.
#![no_main]

use std::cell::RefCell;

use arbitrary::Arbitrary;
use jitmap::heap::EhFrame;
use jitmap::remote::{
    self, Memory, ProcessMemory, RemoteError, RemoteReader, Resolution, UnwindRow,
};
use jitmap::{CodeInfo, CodeRef, ExecutionManager, JitKind, OwnedHeap};
use libfuzzer_sys::fuzz_target;

#[path = "common/cfi.rs"]
mod cfi;
#[path = "common/heap.rs"]
mod heap;
use cfi::{Instruction, build};
use heap::small_heap;

#[derive(Arbitrary, Debug)]
struct Input {
    methods: Vec<Method>,
    changes: Vec<Change>,
}

#[derive(Arbitrary, Debug)]
struct Method {
    size: u16,
    cie: Vec<Instruction>,
    fde: Vec<(u16, Instruction)>,
}

/// One byte of what the reader reads for method `m`, replaced.
#[derive(Arbitrary, Debug)]
struct Change {
    m: u8,
    place: Place,
    at: u16,
    value: u8,
}

#[derive(Arbitrary, Debug)]
enum Place {
    Prefix,
    Header,
    Name,
    Rows,
}

/// This process's memory with some bytes replaced.
struct Altered {
    inner: ProcessMemory,
    bytes: Vec<(u64, u8)>,
}

impl Memory for Altered {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        self.inner.read(addr, buf)?;
        for &(at, value) in &self.bytes {
            if let Some(i) = at.checked_sub(addr).filter(|&i| i < buf.len() as u64) {
                buf[i as usize] = value;
            }
        }
        Ok(())
    }
}

thread_local! {
    static HEAP: RefCell<Option<(ExecutionManager, OwnedHeap)>> = const { RefCell::new(None) };
}

/// Where the reader finds method `code`'s parts: its prefix, its header,
/// its name and its rows.
struct Parts {
    prefix: u64,
    header: u64,
    name: u64,
    rows: u64,
    rows_len: usize,
}

fn parts(manager: &ExecutionManager, code: &CodeRef) -> Parts {
    let reader = manager.register_reader().expect("a reader slot");
    let guard = manager.pin(&reader).expect("a pin");
    let block = guard.find(code.start()).expect("a live method");
    let prefix = code.start() as u64 - 16;
    let me = ProcessMemory::new(std::process::id() as i32);
    let mut at = [0u8; 4];
    me.read(
        remote::descriptor_address() + std::mem::offset_of!(remote::Descriptor, prefix_slot) as u64,
        &mut at,
    )
    .expect("our descriptor is readable");
    let mut slot = [0u8; 8];
    me.read(prefix + u64::from(u32::from_ne_bytes(at)), &mut slot)
        .expect("the prefix is readable");
    Parts {
        prefix,
        header: u64::from_ne_bytes(slot),
        name: block.name().map_or(0, |n| n.as_ptr() as u64),
        rows: block.unwind_rows().as_ptr() as u64,
        rows_len: block.unwind_rows().len(),
    }
}

fn rows_are_sane(rows: &[UnwindRow], size: u64) -> bool {
    rows.iter().all(|r| {
        u64::from(r.offset) < size
            && r.kind <= UnwindRow::UNSUPPORTED
            && r.base <= UnwindRow::BASE_FP
            && r.fp_rule <= UnwindRow::FP_LOST
            && r.has_ra <= UnwindRow::RA_LINK
    }) && rows.windows(2).all(|w| w[0].offset < w[1].offset)
}

fuzz_target!(|input: Input| {
    HEAP.with(|cell| {
        let mut cell = cell.borrow_mut();
        let (manager, heap) = cell.get_or_insert_with(small_heap);
        let mut codes = Vec::new();
        for (i, m) in input.methods.iter().take(8).enumerate() {
            let size = u64::from(m.size % 1024) + 1;
            let mut r = heap.reserve(size).expect("the heap has room");
            r.code_mut().fill(0xCC);
            let eh_frame =
                build(r.address() as u64, size as u16, &m.cie, &m.fde).map(|frame| EhFrame {
                    frame: frame.into_boxed_slice(),
                    header: Box::new([]),
                });
            let info = CodeInfo {
                eh_frame,
                ..CodeInfo::new(i as u64, format!("method{i}"), JitKind::Optimized)
            };
            // A refusal is a typed error and leaves the heap unchanged.
            if let Ok(code) = r.publish(info) {
                codes.push(code);
            }
        }
        let me = std::process::id() as i32;
        let descriptor = remote::descriptor_address();
        // Unaltered: as in process, rows included.
        let reader = RemoteReader::new(ProcessMemory::new(me), descriptor).expect("our descriptor");
        for (i, code) in codes.iter().enumerate() {
            let ip = code.start() as u64 + code.size() / 2;
            let Ok(Resolution::Method(m)) = reader.resolve(ip) else {
                panic!("method {i} at {ip:#x} not found");
            };
            let p = parts(manager, code);
            // SAFETY: the rows of a live method, which this thread keeps.
            let want =
                unsafe { std::slice::from_raw_parts(p.rows as *const UnwindRow, p.rows_len) };
            assert_eq!(
                (m.method_id, m.name.as_str(), m.size, m.rows.as_slice()),
                (i as u64, format!("method{i}").as_str(), code.size(), want)
            );
        }
        // Altered.
        if !codes.is_empty() {
            let mut bytes = Vec::new();
            for c in input.changes.iter().take(8) {
                let code = &codes[usize::from(c.m) % codes.len()];
                let p = parts(manager, code);
                let at = u64::from(c.at);
                let addr = match c.place {
                    Place::Prefix => p.prefix + at % 16,
                    Place::Header => p.header + at % 256,
                    Place::Name => p.name + at % 8,
                    Place::Rows => p.rows + at % (16 * p.rows_len.max(1) as u64),
                };
                bytes.push((addr, c.value));
            }
            let altered = Altered {
                inner: ProcessMemory::new(me),
                bytes,
            };
            let reader = RemoteReader::new(altered, descriptor).expect("our descriptor");
            for code in &codes {
                let ip = code.start() as u64 + code.size() / 2;
                if let Ok(Resolution::Method(m)) = reader.resolve(ip) {
                    assert!(m.start <= ip && ip < m.start + m.size, "{m:?} for {ip:#x}");
                    assert!(rows_are_sane(&m.rows, m.size), "{m:?}");
                }
            }
            // Managers, levels, fragments, a v2 walk of two start and two end
            // words, prefix, header, name and rows, twice for the sequences,
            // over at most four attempts.
            assert!(reader.stats().max_reads <= 4 * 48, "{:?}", reader.stats());
        }
        for code in codes {
            heap.free(code).expect("a method just published frees");
        }
    });
});
