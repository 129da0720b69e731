//! Patching code that another thread is running: a call is retargeted back
//! and forth under a caller, and the caller never lands anywhere but on one
//! of the two targets. The two displacements differ in two bytes with an
//! unchanged one between them, so a patch written byte run by byte run
//! passes through a third displacement; code there counts the tear.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use jitmap::{CodeHeap, CodeInfo, Domain, HeapConfig, JitKind, MemoryMode};

/// What each target returns; a mixed displacement's returns `TORN`.
const FIRST: u32 = 1;
const SECOND: u32 = 2;
const TORN: u32 = 0xDEAD;

/// The caller's code, the offset of the bytes the patch rewrites, and the
/// bytes for each target.
struct Caller {
    code: Vec<u8>,
    at: usize,
    first: [u8; 4],
    second: [u8; 4],
}

/// Where a displacement of the caller at `caller` lands, and a target's
/// code returning `value`.
struct Isa {
    caller: fn() -> Caller,
    /// The four displacements' landing points, relative to the caller's
    /// start: the two targets, then the two mixes.
    landings: [(isize, u32); 4],
    target: fn(u32) -> Vec<u8>,
    /// Bytes of landing block below the caller that hold the targets.
    landing_len: usize,
}

/// x86-64: `push rax; call rel32; pop rcx; ret`, the displacement at 2..6
/// (inside the aligned word 0..8), the call ending at 6. Displacements
/// 0xFFFD_0010 and 0xFFFE_0020 differ in their bytes 0 and 2; the mixes
/// 0xFFFE_0010 and 0xFFFD_0020 lead to code returning `TORN`.
#[cfg(target_arch = "x86_64")]
fn isa() -> Isa {
    let rel = |d: u32| 6 + d as i32 as isize;
    Isa {
        caller: || Caller {
            code: vec![0x50, 0xE8, 0x10, 0x00, 0xFD, 0xFF, 0x59, 0xC3],
            at: 2,
            first: 0xFFFD_0010u32.to_le_bytes(),
            second: 0xFFFE_0020u32.to_le_bytes(),
        },
        landings: [
            (rel(0xFFFD_0010), FIRST),
            (rel(0xFFFE_0020), SECOND),
            (rel(0xFFFE_0010), TORN),
            (rel(0xFFFD_0020), TORN),
        ],
        // mov eax, imm32; ret
        target: |value| {
            let mut t = vec![0xB8];
            t.extend_from_slice(&value.to_le_bytes());
            t.push(0xC3);
            t
        },
        landing_len: 0x4_0000,
    }
}

/// aarch64: `stp x29, x30, [sp, #-16]!; mov x29, sp; bl; ldp x29, x30,
/// [sp], #16; ret`, the `bl` at 8. Its offsets 0x3FE_0004 and 0x3FF_0008
/// (instructions, 26-bit two's complement) differ in the word's bytes 0
/// and 2; the mixes 0x3FF_0004 and 0x3FE_0008 lead to code returning
/// `TORN`.
#[cfg(target_arch = "aarch64")]
fn isa() -> Isa {
    fn bl(imm26: u32) -> [u8; 4] {
        (0x9400_0000u32 | imm26).to_le_bytes()
    }
    // Bytes from the caller's start to where `bl imm26` lands.
    let rel = |imm26: u32| 8 + 4 * (((imm26 << 6) as i32) >> 6) as isize;
    Isa {
        caller: || {
            let mut code = Vec::new();
            for w in [0xA9BF_7BFDu32, 0x9100_03FD, 0, 0xA8C1_7BFD, 0xD65F_03C0] {
                code.extend_from_slice(&w.to_le_bytes());
            }
            code[8..12].copy_from_slice(&bl(0x3FE_0004));
            Caller {
                code,
                at: 8,
                first: bl(0x3FE_0004),
                second: bl(0x3FF_0008),
            }
        },
        landings: [
            (rel(0x3FE_0004), FIRST),
            (rel(0x3FF_0008), SECOND),
            (rel(0x3FF_0004), TORN),
            (rel(0x3FE_0008), TORN),
        ],
        // movz w0, #value; ret
        target: |value| {
            let mut t = (0x5280_0000u32 | (value << 5)).to_le_bytes().to_vec();
            t.extend_from_slice(&0xD65F_03C0u32.to_le_bytes());
            t
        },
        landing_len: 0x9_0000,
    }
}

/// 10^6 patches natively; under qemu-user (aarch64 here), where each patch
/// retranslates the caller, 10^5.
const PATCHES: u64 = if cfg!(target_arch = "x86_64") {
    1_000_000
} else {
    100_000
};

#[test]
fn a_call_patched_under_its_caller_never_lands_between_its_targets() {
    let isa = isa();
    // W^X natively; qemu-user misses code written through a second mapping
    // of a page it translated, so RWX there.
    let mode = if cfg!(target_arch = "x86_64") {
        MemoryMode::WriteXorExecute
    } else {
        MemoryMode::Rwx
    };
    let heap = CodeHeap::new(
        HeapConfig {
            span: 4 << 20,
            mode,
            ..HeapConfig::default()
        },
        &Domain::new(2),
    )
    .unwrap();
    // The landing block first, the caller just above it: every landing
    // point is below the caller, inside the landing block.
    let mut landing = heap.reserve(isa.landing_len as u64).unwrap();
    let caller_code = (isa.caller)();
    let mut caller = heap.reserve(caller_code.code.len() as u64).unwrap();
    let landing_start = landing.code_mut().as_ptr() as isize;
    let caller_start = caller.code_mut().as_ptr() as isize;
    let bytes = landing.code_mut();
    // Traps everywhere but at the four landing points: a call that lands
    // anywhere else stops the test.
    jitmap_testkit::arch::trap_fill(bytes);
    for (rel, value) in isa.landings {
        let target = (isa.target)(value);
        let at = usize::try_from(caller_start + rel - landing_start)
            .ok()
            .filter(|&at| at + target.len() <= bytes.len())
            .expect("the caller was not placed just above its landing block");
        bytes[at..at + target.len()].copy_from_slice(&target);
    }
    caller.code_mut().copy_from_slice(&caller_code.code);
    let landing = landing
        .publish(CodeInfo::new(1, "landing", JitKind::Optimized))
        .unwrap();
    let code = caller
        .publish(CodeInfo::new(2, "patched_caller", JitKind::Optimized))
        .unwrap();
    // SAFETY: the bytes are a complete function taking nothing and
    // returning a u32 in the platform's C convention, in a live block.
    let call: extern "C" fn() -> u32 = unsafe { code.entry() };
    assert_eq!(call(), FIRST);
    let stop = AtomicBool::new(false);
    let counts: [AtomicU64; 3] = Default::default();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut local = [0u64; 3];
            // Relaxed: a flag polled; the counts are read after the join.
            while !stop.load(Ordering::Relaxed) {
                match call() {
                    FIRST => local[0] += 1,
                    SECOND => local[1] += 1,
                    _ => local[2] += 1,
                }
            }
            for (c, n) in counts.iter().zip(local) {
                // Relaxed: read after the scope joins this thread.
                c.store(n, Ordering::Relaxed);
            }
        });
        for i in 0..PATCHES {
            let target = if i % 2 == 0 {
                caller_code.second
            } else {
                caller_code.first
            };
            let at = caller_code.at;
            heap.patch(code, |b| b[at..at + 4].copy_from_slice(&target))
                .unwrap();
        }
        // Relaxed: the caller only polls it.
        stop.store(true, Ordering::Relaxed);
    });
    let [first, second, torn] = counts.map(AtomicU64::into_inner);
    println!(
        "{PATCHES} patches: {first} calls to the first target, {second} to the second, {torn} torn"
    );
    assert_eq!(torn, 0, "calls that landed between the two targets");
    assert!(first > 0 && second > 0, "{first} {second}");
    // The last patch put the first target back.
    assert_eq!(call(), FIRST);
    heap.free(code).unwrap();
    heap.free(landing).unwrap();
}
