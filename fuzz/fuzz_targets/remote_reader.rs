//! The out-of-process reader over random memory images: a valid descriptor
//! whose first manager root leads into pages built from the fuzz input (with
//! plausible pointers into those pages). Every lookup and listing must end in
//! an answer or a typed error, within bounded reads, and any method it names
//! must contain the address (a heap's method, or an image's function found
//! in its table).
#![no_main]

use arbitrary::Arbitrary;
use jitmap::remote::{
    self, MAX_NAME, Memory, MemoryImage, ProcessMemory, RemoteReader, Resolution,
};
use libfuzzer_sys::fuzz_target;

/// Where the fake pages live: page `k` is at `BASE + 4096 k`.
const BASE: u64 = 0x10_0000_0000;
const DESCRIPTOR: u64 = 0x1000;
/// A word whose top byte is this becomes a pointer into the fake pages.
const POINTER_TAG: u64 = 0xAA;

#[derive(Arbitrary, Debug)]
struct Input {
    root_page: u8,
    pages: Vec<(u8, Vec<u64>)>,
    ips: Vec<u32>,
}

fn page(k: u8) -> u64 {
    BASE + 4096 * u64::from(k % 64)
}

fuzz_target!(|input: Input| {
    let mut descriptor = vec![0u8; size_of::<remote::Descriptor>()];
    ProcessMemory::new(std::process::id() as i32)
        .read(remote::descriptor_address(), &mut descriptor)
        .unwrap();
    let managers = std::mem::offset_of!(remote::Descriptor, managers);
    descriptor[managers..managers + 8].copy_from_slice(&page(input.root_page).to_ne_bytes());
    descriptor[managers + 8..].fill(0);
    let mut image = MemoryImage::new();
    image.insert(DESCRIPTOR, descriptor).unwrap();
    for (k, words) in input.pages.iter().take(16) {
        let bytes: Vec<u8> = words
            .iter()
            .take(512)
            .flat_map(|&w| {
                let w = if w >> 56 == POINTER_TAG {
                    BASE + (w & 0x3_FFFF)
                } else {
                    w
                };
                w.to_ne_bytes()
            })
            .collect();
        // Overlapping or repeated pages are refused; that is fine.
        let _ = image.insert(page(*k), bytes);
    }
    let reader = RemoteReader::new(&image, DESCRIPTOR).unwrap();
    for &ip in input.ips.iter().take(16) {
        let ip = BASE + u64::from(ip % 0x4_0000);
        match reader.resolve(ip) {
            Ok(Resolution::Method(m)) => {
                assert!(m.start <= ip && ip < m.start + m.size, "{m:?} for {ip:#x}");
                assert!(m.name.len() <= 3 * MAX_NAME);
            }
            // An image's function, from its table (layout 3), holds the
            // address too.
            Ok(Resolution::Image {
                begin,
                end,
                offset,
                method,
            }) => {
                assert!(begin <= ip && ip < end && offset == ip - begin);
                if let Some(m) = method {
                    assert!(m.start <= ip && ip < m.start + m.size, "{m:?} for {ip:#x}");
                    assert!(m.name.len() <= 3 * MAX_NAME);
                }
            }
            _ => {}
        }
    }
    let _ = reader.sections();
    // One manager, four attempts: levels, 32 fragments, a capped v1 walk over
    // start and end words, and a few fixed reads each.
    assert!(
        reader.stats().max_reads <= 4 * (16 + 32 + 2 * 1025),
        "{:?}",
        reader.stats()
    );
});
