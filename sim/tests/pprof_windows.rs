//! The pprof endpoint in process: two windows taken one after the other,
//! with the workload switched between them, each hold only their own
//! window's functions; and sequential one-second profiles leak nothing
//! (the allocator's bytes in use and the process's threads are where they
//! were).

use std::io::Read;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use flate2::read::GzDecoder;
use jitmap::agent::export::proto;
use jitmap::agent::{Agent, AgentConfig, Clock};
use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind};
use jitmap_sim::scale::heap_in_use;
use jitmap_testkit::demo::Demo;
use jitmap_testkit::spin;
use prost::Message;

fn get(host: &str, path: &str) -> (u16, Vec<u8>) {
    jitmap_testkit::e2e::http_get(host, path)
}

/// The function names of a gzipped pprof profile with samples.
fn sampled_names(body: &[u8]) -> Vec<String> {
    let mut bytes = Vec::new();
    GzDecoder::new(body).read_to_end(&mut bytes).unwrap();
    let p = proto::Profile::decode(&bytes[..]).unwrap();
    let mut names: Vec<String> = p
        .function
        .iter()
        .map(|f| p.string_table[f.name as usize].clone())
        .collect();
    names.sort();
    names
}

/// A `/proc/self/status` field, in its unit.
fn proc_status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn windows_hold_their_own_samples_and_requests_leak_nothing() {
    if !jitmap_testkit::e2e::runs_x86_64() {
        return;
    }
    let manager = ExecutionManager::new(8);
    let demo = Demo::publish(&manager).unwrap();
    let heap = manager
        .create_heap(HeapConfig {
            span: 1 << 20,
            ..HeapConfig::default()
        })
        .unwrap();
    let spins: Vec<extern "C" fn() -> u32> = (0..2)
        .map(|id| {
            let code = spin::function_code(id);
            let mut r = heap.reserve(code.len() as u64).unwrap();
            r.code_mut().copy_from_slice(&code);
            let name = spin::function_name(id);
            let code = r
                .publish(CodeInfo::new(100 + u64::from(id), name, JitKind::Optimized))
                .unwrap();
            // SAFETY: a complete function that takes nothing, returns a u32.
            unsafe { code.entry() }
        })
        .collect();
    let agent = Agent::start(
        &manager,
        AgentConfig {
            hz: 1000,
            clock: Clock::Wall,
            ..AgentConfig::default()
        },
    )
    .unwrap();
    let address = agent
        .serve("127.0.0.1:0".parse().unwrap())
        .unwrap()
        .to_string();
    assert_eq!(
        agent
            .serve("127.0.0.1:0".parse().unwrap())
            .err()
            .map(|e| e.to_string()),
        Some("the pprof endpoint: already serving".to_owned())
    );
    assert!(matches!(
        agent.serve("0.0.0.0:0".parse().unwrap()),
        Err(jitmap::agent::AgentError::NotLoopback { .. })
    ));

    // 0: the demo's leaves; 1: the spin functions; 2: stop.
    let phase = Arc::new(AtomicU8::new(0));
    std::thread::scope(|s| {
        // A failed assertion below unwinds through this guard, which stops
        // the worker: the scope joins it, so the test fails instead of
        // hanging.
        let stop_worker = StopWorker(&phase);
        let worker = s.spawn(|| {
            let attached = agent.attach_current_thread().unwrap();
            // Relaxed: a phase flag; no data rides on it.
            loop {
                match phase.load(Ordering::Relaxed) {
                    0 => {
                        std::hint::black_box(demo.run(1, 10_000));
                    }
                    1 => {
                        for f in &spins {
                            std::hint::black_box(f());
                        }
                    }
                    _ => break,
                }
            }
            drop(attached);
        });
        std::thread::sleep(Duration::from_millis(200));
        let (status, first) = get(&address, "/debug/pprof/profile?seconds=1");
        assert_eq!(status, 200);
        // Relaxed: the phase flag.
        phase.store(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(200));
        let (status, second) = get(&address, "/debug/pprof/profile?seconds=1");
        assert_eq!(status, 200);
        let (first, second) = (sampled_names(&first), sampled_names(&second));
        assert!(first.iter().any(|n| n == "leaf_4x"), "{first:?}");
        assert!(
            !first.iter().any(|n| n.starts_with("jitmap_spin")),
            "{first:?}"
        );
        assert!(second.iter().any(|n| n == "jitmap_spin_0"), "{second:?}");
        assert!(!second.iter().any(|n| n.starts_with("leaf_")), "{second:?}");

        // One-second profiles, one after the other: after eight to warm up
        // (the agent's tables take in the rarer stacks; about 20 KiB, most
        // of it in the first eight), the bytes in use and the threads stay
        // where they were. The allocator's count is exact where resident
        // memory moves by pages: a window that kept 2 KiB would show in 16
        // windows as 32 KiB, the bound.
        for _ in 0..8 {
            assert_eq!(get(&address, "/debug/pprof/profile?seconds=1").0, 200);
        }
        let (bytes, threads) = (heap_in_use(), settled_threads(None));
        for _ in 0..WINDOWS {
            assert_eq!(get(&address, "/debug/pprof/profile?seconds=1").0, 200);
        }
        let (bytes_after, threads_after) = (heap_in_use(), settled_threads(Some(threads)));
        assert_eq!(threads_after, threads, "threads left behind");
        assert!(
            bytes_after < bytes + 32 * 1024,
            "bytes in use grew from {bytes} to {bytes_after} over {WINDOWS} profiles"
        );
        println!("{WINDOWS} profiles: bytes in use {bytes} -> {bytes_after}, threads {threads}");
        drop(stop_worker);
        worker.join().unwrap();
    });
    // Stopping the agent stops the server and joins its threads, which
    // close the port (waited for, to be safe on a loaded machine).
    agent.stop();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(&address).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "{address} still accepts connections 5 s after the agent stopped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sets the phase to "stop" when dropped, on success or while unwinding.
struct StopWorker<'a>(&'a AtomicU8);

impl Drop for StopWorker<'_> {
    fn drop(&mut self) {
        // Relaxed: the phase flag.
        self.0.store(2, Ordering::Relaxed);
    }
}

/// The process's thread count once it holds still: a profile's thread
/// answers before it exits, so right after a response it may still be
/// there. Waits (up to 5 s) for `expected` if given, else for two equal
/// readings 100 ms apart.
fn settled_threads(expected: Option<u64>) -> u64 {
    let mut last = proc_status("Threads:");
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let now = proc_status("Threads:");
        if Some(now) == expected || (expected.is_none() && now == last) {
            return now;
        }
        last = now;
    }
    last
}

/// Profiles taken one after the other for the leak check.
const WINDOWS: usize = 16;
