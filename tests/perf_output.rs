//! Profiler output is per process: one jitdump and one perf map, shared by every
//! manager, and switched on from the environment by one call. Its own test
//! binary, because both are process-wide; the tests take a lock so they never
//! overlap.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use jitmap::perf::check::{Body, check};
use jitmap::perf::{PerfConfig, PerfError, PerfMode};
use jitmap::{CodeInfo, ExecutionManager, HeapConfig, JitKind, OwnedHeap};

static SERIAL: Mutex<()> = Mutex::new(());

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("jitmap-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn heap(m: &ExecutionManager) -> OwnedHeap {
    m.create_heap(HeapConfig {
        span: 1 << 20,
        ..HeapConfig::default()
    })
    .unwrap()
}

fn publish_n(heap: &OwnedHeap, first_id: u64, n: u64) -> Vec<usize> {
    let starts = (first_id..first_id + n)
        .map(|id| {
            let mut r = heap.reserve(16).unwrap();
            r.code_mut().fill(0xC3);
            r.publish(CodeInfo::new(id, format!("f{id}"), JitKind::Optimized))
                .unwrap()
                .start()
        })
        .collect();
    heap.listeners().flush();
    starts
}

// 4. A second install truncated the live jit-<pid>.dump while the first writer
// kept writing. Now a process has one writer per file, shared, or a typed error.
#[test]
fn two_managers_share_one_jitdump_and_a_third_directory_is_refused() {
    let _serial = SERIAL.lock().unwrap();
    let (a, b) = (temp_dir("perf-a"), temp_dir("perf-b"));
    let both = |dir: &PathBuf| PerfConfig {
        mode: PerfMode::Both,
        dir: dir.clone(),
    };
    let m1 = ExecutionManager::new(1);
    let m2 = ExecutionManager::new(1);
    let m3 = ExecutionManager::new(1);
    let out1 = both(&a).install(m1.listeners()).unwrap();
    let out2 = both(&a).install(m2.listeners()).unwrap();
    let (j1, j2) = (out1.jitdump.clone().unwrap(), out2.jitdump.clone().unwrap());
    assert!(Arc::ptr_eq(&j1, &j2));
    assert!(Arc::ptr_eq(
        out1.perf_map.as_ref().unwrap(),
        out2.perf_map.as_ref().unwrap()
    ));
    let path = j1.path().to_path_buf();
    match both(&b).install(m3.listeners()) {
        Err(PerfError::AlreadyOpen {
            existing,
            requested,
        }) => assert_eq!((existing, requested), (path.clone(), b.clone())),
        other => panic!("expected AlreadyOpen, got {other:?}"),
    }
    assert!(m3.listeners().is_empty(), "nothing registered on error");

    let (h1, h2) = (heap(&m1), heap(&m2));
    let mut starts = publish_n(&h1, 0, 50);
    starts.extend(publish_n(&h2, 100, 50));
    drop((out1, out2, j1, j2, h1, h2));
    drop((m1, m2)); // delivers what is queued; the last drop closes the dump

    let bytes = std::fs::read(&path).unwrap();
    let report = check(&bytes);
    assert_eq!(report.violations, vec![]);
    assert_eq!(report.clean_len, bytes.len());
    let loads: Vec<(u64, u64, String)> = report
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Body::Load {
                code_index,
                code_addr,
                name,
                ..
            } => Some((*code_index, *code_addr, name.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(loads.len(), 100);
    let indices: HashSet<u64> = loads.iter().map(|l| l.0).collect();
    assert_eq!(indices, (0..100).collect());
    let addrs: HashSet<u64> = loads.iter().map(|l| l.1).collect();
    assert_eq!(addrs, starts.iter().map(|&s| s as u64).collect());
    let map = std::fs::read_to_string(a.join(format!("perf-{}.map", std::process::id()))).unwrap();
    assert_eq!(map.lines().count(), 100);

    // Once every user is gone, the process may open its outputs elsewhere.
    let m4 = ExecutionManager::new(1);
    let out4 = both(&b).install(m4.listeners()).unwrap();
    assert_eq!(out4.jitdump.unwrap().path().parent(), Some(b.as_path()));
}

// 5. `JITMAP_PERF` did nothing in a library host. `PerfOutput::from_env` is the one call
// a host makes.
#[test]
fn perf_from_env_honours_the_variables() {
    let _serial = SERIAL.lock().unwrap();
    let dir = temp_dir("perf-env");
    // SAFETY: the lock above serializes the tests of this binary, and nothing
    // else in it reads the environment while the variables change.
    unsafe {
        std::env::set_var("JITMAP_PERF", "map");
        std::env::set_var("JITMAP_PERF_DIR", &dir);
    }
    let m = ExecutionManager::new(1);
    let out = jitmap::perf::PerfOutput::from_env(&m).unwrap();
    assert!(out.jitdump.is_none());
    let map = out.perf_map.clone().unwrap();
    assert_eq!(
        map.path(),
        dir.join(format!("perf-{}.map", std::process::id()))
    );
    let h = heap(&m);
    let starts = publish_n(&h, 7, 2);
    assert_eq!(
        std::fs::read_to_string(map.path()).unwrap(),
        format!("{:x} 10 f7\n{:x} 10 f8\n", starts[0], starts[1])
    );
    // SAFETY: as above.
    unsafe { std::env::set_var("JITMAP_PERF", "everything") };
    let m2 = ExecutionManager::new(1);
    assert!(matches!(
        jitmap::perf::PerfOutput::from_env(&m2),
        Err(PerfError::Config(_))
    ));
    // SAFETY: as above.
    unsafe {
        std::env::remove_var("JITMAP_PERF");
        std::env::remove_var("JITMAP_PERF_DIR");
    }
    let out = jitmap::perf::PerfOutput::from_env(&m2).unwrap();
    assert!(out.jitdump.is_none() && out.perf_map.is_none());
    drop((map, h));
}
