//! W^X done right: an unpredictable writable alias, a flip mode with no alias at
//! all, and patching of published code with the cache and cross-core handling.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use jitmap_testkit::arch;

use jitmap::{CodeHeap, CodeInfo, CodeRef, Domain, HeapConfig, HeapError, JitKind, MemoryMode};

fn heap(mode: MemoryMode) -> CodeHeap {
    CodeHeap::new(
        HeapConfig {
            span: 1 << 20,
            mode,
            ..HeapConfig::default()
        },
        &Domain::new(2),
    )
    .unwrap()
}

/// A function that returns `value`, for this architecture.
fn returns(heap: &CodeHeap, value: u32) -> CodeRef {
    let code = arch::returns(value as u16);
    let mut r = heap.reserve(code.len() as u64).unwrap();
    r.code_mut().copy_from_slice(&code);
    r.publish(CodeInfo::new(u64::from(value), "ret", JitKind::Optimized))
        .unwrap()
}

fn call(addr: usize) -> u32 {
    // SAFETY: `addr` is a published C function taking nothing and returning
    // a 32-bit value; the caller keeps its heap alive.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(addr) };
    f()
}

/// The permissions `/proc/self/maps` shows for the page holding `addr`.
/// The modes that patch published code and run it again, on this target.
fn patch_modes() -> Vec<MemoryMode> {
    arch::rewrite_modes()
        .iter()
        .copied()
        .filter(|&m| m != MemoryMode::FlipOnPublish)
        .collect()
}

fn permissions(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let (range, rest) = line.split_once(' ').unwrap();
        let (lo, hi) = range.split_once('-').unwrap();
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).unwrap(),
            usize::from_str_radix(hi, 16).unwrap(),
        );
        if (lo..hi).contains(&addr) {
            return rest[..4].to_owned();
        }
    }
    panic!("{addr:#x} is not mapped");
}

#[test]
fn the_writable_view_is_not_at_a_predictable_address() {
    let heaps: Vec<CodeHeap> = (0..8).map(|_| heap(MemoryMode::WriteXorExecute)).collect();
    let mut deltas = Vec::new();
    for h in &heaps {
        let code = returns(h, 1);
        let write = h.write_address(code).unwrap();
        assert_eq!(permissions(code.start()), "r-xs");
        assert_eq!(permissions(write), "rw-s");
        let delta = write.abs_diff(code.start());
        assert!(delta > 1 << 32, "alias {delta:#x} bytes from the code");
        deltas.push(write.wrapping_sub(code.start()));
    }
    deltas.sort();
    deltas.dedup();
    assert_eq!(deltas.len(), 8, "every alias at its own offset");
    let rwx = heap(MemoryMode::Rwx);
    let code = returns(&rwx, 1);
    assert_eq!(rwx.write_address(code), Ok(code.start()));
}

#[test]
fn flip_mode_pages_are_writable_until_published_then_executable() {
    let h = heap(MemoryMode::FlipOnPublish);
    let nine = arch::returns(9);
    let mut r = h.reserve(nine.len() as u64).unwrap();
    let at = r.address();
    assert_eq!(permissions(at), "rw-p");
    r.code_mut().copy_from_slice(&nine);
    let code = r
        .publish(CodeInfo::new(9, "nine", JitKind::Optimized))
        .unwrap();
    assert_eq!(permissions(at), "r-xp");
    assert_eq!(call(code.start()), 9);
    // Its neighbour, on its own page, is still writable while reserved.
    let next = h.reserve(6).unwrap();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    assert_eq!(next.address() / page, at / page + 1);
    assert_eq!(permissions(next.address()), "rw-p");
    drop(next);
    assert_eq!(
        h.patch(code, |b| arch::set_returned(b, 10)),
        Err(HeapError::NotPatchable { start: at })
    );
    assert_eq!(
        h.write_address(code),
        Err(HeapError::NotPatchable { start: at })
    );
    // Lookups work from the executable pages.
    let reader = h.domain().register().unwrap();
    {
        let g = reader.pin().unwrap();
        let last = nine.len() - 1;
        let b = h.find(&g, at + last).unwrap().unwrap();
        assert_eq!(
            (b.start(), b.offset() as usize, b.size() as usize),
            (at, last, nine.len())
        );
    }
    // Reuse flips the pages back.
    h.free(code).unwrap();
    h.try_reclaim();
    let again = h.reserve(6).unwrap();
    assert_eq!(again.address(), at);
    assert_eq!(permissions(at), "rw-p");
}

#[test]
fn published_code_is_patched_while_another_thread_runs_it() {
    // Patching is refused in flip mode; its modes here are the ones that
    // may run rewritten bytes on this target (`arch::rewrite_modes`).
    for mode in patch_modes() {
        let h = Arc::new(heap(mode));
        let code = returns(&h, 1);
        let patched = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let after = Arc::new(AtomicU64::new(0));
        let runner = {
            let (patched, stop, after) = (patched.clone(), stop.clone(), after.clone());
            let start = code.start();
            std::thread::spawn(move || {
                // Acquire: pairs with the Release store of `stop`.
                while !stop.load(Ordering::Acquire) {
                    // Acquire: pairs with the Release store after `patch` returned.
                    let was_patched = patched.load(Ordering::Acquire);
                    let r = call(start);
                    assert!(r == 1 || r == 2, "torn code returned {r}");
                    if was_patched {
                        assert_eq!(r, 2, "stale code ran after the patch returned");
                        // Relaxed: a progress counter; the test thread only polls it.
                        after.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(10));
        h.patch(code, |bytes| arch::set_returned(bytes, 2)).unwrap();
        // Release: orders the completed patch before the runner's Acquire load.
        patched.store(true, Ordering::Release);
        // Relaxed: as in the runner.
        while after.load(Ordering::Relaxed) < 1000 {
            std::thread::yield_now();
        }
        // Release: pairs with the runner's Acquire load of `stop`.
        stop.store(true, Ordering::Release);
        runner.join().unwrap();
        assert_eq!(call(code.start()), 2);
        // A freed block can no longer be patched, and nothing is written.
        h.free(code).unwrap();
        assert_eq!(
            h.patch(code, |b| arch::set_returned(b, 3)),
            Err(HeapError::DoubleFree {
                start: code.start()
            })
        );
    }
}

/// A patch closure that calls back into its heap (a lookup of live blocks, a
/// patch of another block, a free of its own block) finishes: the closure
/// runs with no lock held. The free wins, so the outer patch writes nothing
/// and says why. A deadlock fails the test instead of hanging it.
#[test]
fn a_patch_closure_may_call_back_into_its_heap() {
    // Patching is refused in flip mode; its modes here are the ones that
    // may run rewritten bytes on this target (`arch::rewrite_modes`).
    for mode in patch_modes() {
        let h = Arc::new(heap(mode));
        let (first, second) = (returns(&h, 1), returns(&h, 2));
        let (done, finished) = std::sync::mpsc::channel();
        let worker = Arc::clone(&h);
        std::thread::spawn(move || {
            let nested = worker.patch(first, |bytes| {
                assert_eq!(worker.live_blocks().len(), 2);
                worker.patch(second, |b| arch::set_returned(b, 20)).unwrap();
                arch::set_returned(bytes, 10);
            });
            let freed = worker.patch(second, |bytes| {
                worker.free(second).unwrap();
                arch::set_returned(bytes, 30);
            });
            done.send((nested, freed)).unwrap();
        });
        let (nested, freed) = finished
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a patch closure that calls into its heap deadlocked");
        assert_eq!(nested, Ok(()));
        assert_eq!(
            freed,
            Err(HeapError::DoubleFree {
                start: second.start()
            })
        );
        assert_eq!(call(first.start()), 10);
        assert_eq!(h.live_blocks().len(), 1);
    }
}

/// A patch closure that panics after changing bytes leaves the live code as
/// it was (it only ever edits a copy), and the heap stays usable.
#[test]
fn a_panicking_patch_closure_changes_nothing() {
    // Patching is refused in flip mode; its modes here are the ones that
    // may run rewritten bytes on this target (`arch::rewrite_modes`).
    for mode in patch_modes() {
        let h = heap(mode);
        let code = returns(&h, 7);
        // SAFETY: the block is live; its six bytes are readable code.
        let live = || unsafe { std::slice::from_raw_parts(code.start() as *const u8, 6) }.to_vec();
        let before = live();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            h.patch(code, |bytes| {
                arch::set_returned(bytes, 99);
                panic!("the host's patch failed halfway");
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(live(), before);
        assert_eq!(call(code.start()), 7);
        h.patch(code, |bytes| arch::set_returned(bytes, 8)).unwrap();
        assert_eq!(call(code.start()), 8);
    }
}

/// Code rewritten in place through the write address, as a C JIT rewrites
/// a constant, is made visible by `make_visible`; an unchanged patch makes
/// its block coherent too (it used to return at once, with no cache
/// maintenance and no cross-core sync). Each counts one core sync; a
/// refused call changes nothing and syncs nothing.
#[test]
fn code_written_in_place_is_made_visible_and_an_unchanged_patch_still_syncs() {
    for mode in patch_modes() {
        let h = heap(mode);
        let code = returns(&h, 7);
        let syncs = || h.stats().core_syncs;
        let start = syncs();
        h.patch(code, |_| {}).unwrap();
        assert_eq!(syncs(), start + 1, "{mode:?}: an unchanged patch");
        // Rewritten in place through the write address, after the old code
        // ran: the function's bytes, its constant changed.
        assert_eq!(call(code.start()), 7, "{mode:?}");
        let mut bytes = arch::returns(7);
        arch::set_returned(&mut bytes, 42);
        let write = h.write_address(code).unwrap() as *mut u8;
        // SAFETY: the block is live and `bytes.len()` long; nothing else
        // writes it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), write, bytes.len()) };
        h.make_visible(code, 0..code.size()).unwrap();
        assert_eq!(syncs(), start + 2);
        assert_eq!(call(code.start()), 42, "{mode:?}");
        // Refused: past the end, reversed, a freed block.
        let size = code.size();
        assert_eq!(
            h.make_visible(code, size..size + 1),
            Err(HeapError::OutsideBlock {
                start: code.start(),
                begin: size,
                end: size + 1,
                size,
            })
        );
        assert!(matches!(
            h.make_visible(code, std::ops::Range { start: 3, end: 2 }),
            Err(HeapError::OutsideBlock {
                begin: 3,
                end: 2,
                ..
            })
        ));
        h.free(code).unwrap();
        assert!(matches!(
            h.make_visible(code, 0..1),
            Err(HeapError::DoubleFree { .. })
        ));
        assert_eq!(syncs(), start + 2);
    }
    // Flip mode has no writable alias.
    let h = heap(MemoryMode::FlipOnPublish);
    let code = returns(&h, 7);
    assert_eq!(
        h.write_address(code),
        Err(HeapError::NotPatchable {
            start: code.start()
        })
    );
    assert_eq!(
        h.make_visible(code, 0..1),
        Err(HeapError::NotPatchable {
            start: code.start()
        })
    );
    assert_eq!(h.stats().core_syncs, 0);
}

/// What the child process of the membarrier tests refuses: an
/// `EINVAL` for the expedited commands only, as a kernel before 4.16 does,
/// or an `EPERM` for every membarrier, as a seccomp policy may.
const REFUSE: &str = "JITMAP_TEST_REFUSE_MEMBARRIER";

/// A seccomp filter on every thread of this process that makes `membarrier`
/// fail with `errno`: for every command, or only for those in `commands`.
/// Returns the errno of a kernel (or emulator) that cannot filter.
fn refuse_membarrier(commands: &[u32], errno: u32) -> Result<(), i32> {
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7;
    let ld = |k: u32| libc::sock_filter {
        code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let ret = |k: u32| libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let n = commands.len() as u8;
    // Between the call's test and the allow: the command tests, or a jump
    // to the refusal.
    let tests = if n > 0 { 1 + n } else { 1 };
    // seccomp_data: the call's number at 0, the architecture at 4, the low
    // half of the first argument at 16 (little-endian).
    let mut program = vec![
        ld(4),
        jeq(AUDIT_ARCH, 0, 2 + tests),
        ld(0),
        jeq(libc::SYS_membarrier as u32, 0, tests),
    ];
    if n > 0 {
        program.push(ld(16));
        for (i, &command) in commands.iter().enumerate() {
            // Equal: to the refusal, past the other tests and the allow.
            program.push(jeq(command, n - i as u8, 0));
        }
    } else {
        program.push(libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JA) as u16,
            jt: 0,
            jf: 0,
            k: 1,
        });
    }
    program.push(ret(libc::SECCOMP_RET_ALLOW));
    program.push(ret(libc::SECCOMP_RET_ERRNO | errno));
    let filter = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: prctl and seccomp with valid arguments; `filter` points at
    // `program`, alive across the call, which copies it.
    let rc = unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            -1
        } else {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_TSYNC,
                &filter as *const libc::sock_fprog,
            ) as i32
        }
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// Issue 67, item 5: a kernel that refuses the core-serializing membarrier
/// (before 4.16 on arm64, as on Amazon Linux 2's 4.14; or a seccomp
/// policy) used to fail every patch, and on aarch64 every publish into
/// reused space, for the life of the process: the refused registration was
/// kept. Now aarch64 falls back to the plain expedited membarrier (every
/// return to user space synchronizes there); x86-64, where a `sysret` does
/// not serialize, refuses the patch with the errno and changes nothing;
/// and with no membarrier at all both refuse. Each case runs in a child
/// process of this test binary, under a seccomp filter. (The choice itself
/// is unit-tested for both architectures on any host:
/// `the_core_sync_falls_back_where_returns_synchronize`.)
#[test]
fn a_kernel_without_core_serializing_membarriers_gets_a_fallback_or_a_refusal() {
    const EXPEDITED: [u32; 2] = [1 << 5, 1 << 6];
    match std::env::var(REFUSE).as_deref() {
        Ok("expedited") => {
            if let Err(errno) = refuse_membarrier(&EXPEDITED, libc::EINVAL as u32) {
                println!("seccomp refused: errno {errno}");
                return;
            }
            let aarch64 = cfg!(target_arch = "aarch64");
            assert_eq!(
                jitmap::heap::core_sync(),
                if aarch64 {
                    Ok(jitmap::heap::CoreSync::PrivateExpedited)
                } else {
                    Err(HeapError::Memory {
                        errno: libc::EINVAL,
                    })
                }
            );
            for mode in patch_modes() {
                let h = heap(mode);
                let code = returns(&h, 7);
                let published = h.stats().core_syncs;
                let patched = h.patch(code, |bytes| arch::set_returned(bytes, 42));
                if aarch64 {
                    assert_eq!(patched, Ok(()), "{mode:?}");
                    assert_eq!(call(code.start()), 42, "{mode:?}");
                    assert_eq!(h.stats().core_syncs, published + 1, "{mode:?}");
                } else {
                    assert_eq!(
                        patched,
                        Err(HeapError::Memory {
                            errno: libc::EINVAL
                        }),
                        "{mode:?}"
                    );
                    assert_eq!(call(code.start()), 7, "{mode:?}");
                    assert_eq!(h.stats().core_syncs, published, "{mode:?}");
                }
            }
            println!("expedited refused: checked");
        }
        Ok("all") => {
            if let Err(errno) = refuse_membarrier(&[], libc::EPERM as u32) {
                println!("seccomp refused: errno {errno}");
                return;
            }
            assert_eq!(
                jitmap::heap::core_sync(),
                Err(HeapError::Memory { errno: libc::EPERM })
            );
            // (On aarch64 these modes' publishes sync cores too, and are
            // refused the same way.)
            let modes = if cfg!(target_arch = "x86_64") {
                patch_modes()
            } else {
                Vec::new()
            };
            for mode in modes {
                let h = heap(mode);
                let code = returns(&h, 7);
                assert_eq!(
                    h.patch(code, |bytes| arch::set_returned(bytes, 42)),
                    Err(HeapError::Memory { errno: libc::EPERM }),
                    "{mode:?}"
                );
                assert_eq!(call(code.start()), 7, "{mode:?}");
                assert_eq!(h.stats().core_syncs, 0, "{mode:?}");
            }
            println!("no membarrier: refused");
        }
        _ => {
            for (case, expected) in [
                ("expedited", "expedited refused: checked"),
                ("all", "no membarrier: refused"),
            ] {
                let out = std::process::Command::new(std::env::current_exe().unwrap())
                    .args([
                        "--exact",
                        "a_kernel_without_core_serializing_membarriers_gets_a_fallback_or_a_refusal",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env(REFUSE, case)
                    .output()
                    .unwrap();
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(out.status.success(), "{case}: {stdout}\n{stderr}");
                // qemu-user cannot filter its guest's system calls (it
                // refuses seccomp); everywhere else the case must have run.
                if cfg!(target_arch = "aarch64") && stdout.contains("seccomp refused") {
                    continue;
                }
                assert!(stdout.contains(expected), "{case}: {stdout}\n{stderr}");
            }
        }
    }
}

/// Issue 67, item 9: aarch64 skipped the cross-core sync for fresh bytes, on the
/// argument that a caller's Acquire load orders its instruction fetch; it
/// orders data only. Fresh bytes that were executable before they were
/// written (the RWX and W^X views are committed so) now sync like reused
/// ones; flip mode's fresh pages were never executable and do not.
#[test]
fn fresh_code_syncs_cores_where_the_architecture_asks() {
    for &mode in arch::rewrite_modes() {
        let h = heap(mode);
        let code = returns(&h, 7);
        let expected =
            u64::from(cfg!(target_arch = "aarch64") && mode != MemoryMode::FlipOnPublish);
        assert_eq!(h.stats().core_syncs, expected, "{mode:?}");
        assert_eq!(call(code.start()), 7, "{mode:?}");
    }
}
