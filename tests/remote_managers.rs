//! The descriptor's manager entries, alone in their own process so that no other
//! test's managers take entries meanwhile.

use std::sync::atomic::Ordering;

use jitmap::ExecutionManager;
use jitmap::remote::{self, MAX_MANAGERS, ProcessMemory, RemoteReader};

fn entries() -> Vec<usize> {
    remote::jitmap_descriptor
        .managers
        .iter()
        // Relaxed: this thread made every change it reads.
        .map(|e| e.load(Ordering::Relaxed))
        .collect()
}

#[test]
fn managers_take_free_entries_and_give_them_back() {
    assert_eq!(entries(), vec![0; MAX_MANAGERS]);
    let mut managers: Vec<ExecutionManager> = (0..MAX_MANAGERS)
        .map(|_| ExecutionManager::new(1))
        .collect();
    let indices: Vec<Option<usize>> = managers.iter().map(|m| m.remote_index()).collect();
    assert_eq!(indices, (0..MAX_MANAGERS).map(Some).collect::<Vec<_>>());
    assert!(entries().iter().all(|&root| root != 0 && root % 4096 == 0));

    // A ninth manager works, but other processes cannot see it.
    let ninth = ExecutionManager::new(1);
    assert_eq!(ninth.remote_index(), None);

    let reader = RemoteReader::new(
        ProcessMemory::new(std::process::id() as i32),
        remote::descriptor_address(),
    )
    .unwrap();
    let roots: Vec<u64> = entries().iter().map(|&r| r as u64).collect();
    assert_eq!(reader.managers().unwrap(), roots);

    // Dropping one frees its entry, which the next manager takes.
    drop(managers.remove(3));
    assert_eq!(entries()[3], 0);
    assert_eq!(reader.managers().unwrap().len(), MAX_MANAGERS - 1);
    let next = ExecutionManager::new(1);
    assert_eq!(next.remote_index(), Some(3));

    drop(managers);
    drop(next);
    drop(ninth);
    assert_eq!(entries(), vec![0; MAX_MANAGERS]);
    assert_eq!(reader.managers().unwrap(), Vec::<u64>::new());
}
