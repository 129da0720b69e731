//! `stress`: writer threads reserve, write, publish, abort and free code while
//! reader threads look up addresses and check every answer against a shadow model.
//!
//! Each shadow entry describes one writer-owned block through a seqlock: the state
//! word is `generation << 1 | live`. A reader pins first, takes a consistent
//! snapshot of a live entry, looks up an address inside it, and reads the state
//! again. Unchanged state means the block was live for the whole lookup, so the
//! answer must be exact; otherwise it must be that block or none. Pinning first
//! guarantees the block's memory cannot be reused while the reader checks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::thread;
use std::time::{Duration, Instant};

use jitmap::heap::{BlockKind, CodeRef, HeapConfig, MemoryMode};
use jitmap::{CodeHeap, CodeInfo, Domain, MapVersion};

use jitmap_testkit::rng::Rng;
use jitmap_testkit::workload::method_size;

/// Stress parameters.
#[derive(Clone, Copy, Debug)]
pub struct StressConfig {
    /// Nibble-map version.
    pub version: MapVersion,
    /// W^X double mapping instead of one RWX mapping.
    pub wx: bool,
    /// Writer threads.
    pub writers: usize,
    /// Reader threads.
    pub readers: usize,
    /// How long to run.
    pub duration: Duration,
    /// Seed for the workload.
    pub seed: u64,
}

/// What a stress run counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StressReport {
    /// Lookups made.
    pub lookups: u64,
    /// Lookups of a block that was live throughout, checked for an exact answer.
    pub exact: u64,
    /// Answers that contradicted the shadow model.
    pub wrong: u64,
    /// Blocks published.
    pub publishes: u64,
    /// Reservations aborted.
    pub aborts: u64,
    /// Blocks freed.
    pub frees: u64,
    /// Extent bytes reclaimed after grace periods.
    pub reclaimed: u64,
}

const ENTRIES_PER_WRITER: usize = 256;
const HEAP_SPAN: u64 = 512 << 20;

#[derive(Default)]
struct Entry {
    state: AtomicU64,
    start: AtomicU64,
    size: AtomicU64,
    method: AtomicU64,
}

#[derive(Default)]
struct Counters {
    lookups: AtomicU64,
    exact: AtomicU64,
    wrong: AtomicU64,
    publishes: AtomicU64,
    aborts: AtomicU64,
    frees: AtomicU64,
}

/// Runs a stress test and returns its counts.
pub fn run(config: StressConfig) -> Result<StressReport, jitmap::HeapError> {
    let domain = Domain::new(config.readers + config.writers + 2);
    let heap = CodeHeap::new(
        HeapConfig {
            span: HEAP_SPAN,
            version: config.version,
            mode: if config.wx {
                MemoryMode::WriteXorExecute
            } else {
                MemoryMode::Rwx
            },
            ..HeapConfig::default()
        },
        &domain,
    )?;
    let entries: Vec<Entry> = (0..config.writers.max(1) * ENTRIES_PER_WRITER)
        .map(|_| Entry::default())
        .collect();
    let counters = Counters::default();
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + config.duration;
    let next_method = AtomicU64::new(1);

    thread::scope(|s| {
        for w in 0..config.writers.max(1) {
            let own = &entries[w * ENTRIES_PER_WRITER..(w + 1) * ENTRIES_PER_WRITER];
            let (heap, counters, next_method) = (&heap, &counters, &next_method);
            let seed = config.seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9);
            s.spawn(move || writer(heap, own, counters, next_method, seed, deadline));
        }
        for r in 0..config.readers.max(1) {
            let (heap, entries, counters, stop) = (&heap, &entries, &counters, &stop);
            let domain = Arc::clone(&domain);
            let seed = config.seed ^ (r as u64 + 1).wrapping_mul(0xC2B2_AE35);
            s.spawn(move || reader(heap, &domain, entries, counters, stop, seed));
        }
        while Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        // Writers stop on the deadline themselves; readers on this flag.
        thread::sleep(Duration::from_millis(1));
        // Relaxed: a stop flag; readers exit at their next check, no data rides on it.
        stop.store(true, Ordering::Relaxed);
    });
    heap.try_reclaim();
    Ok(StressReport {
        lookups: counters.lookups.into_inner(),
        exact: counters.exact.into_inner(),
        wrong: counters.wrong.into_inner(),
        publishes: counters.publishes.into_inner(),
        aborts: counters.aborts.into_inner(),
        frees: counters.frees.into_inner(),
        reclaimed: heap.stats().reclaimed_bytes,
    })
}

fn writer(
    heap: &CodeHeap,
    own: &[Entry],
    counters: &Counters,
    next_method: &AtomicU64,
    seed: u64,
    deadline: Instant,
) {
    let mut rng = Rng::new(seed);
    let mut refs: Vec<Option<CodeRef>> = vec![None; own.len()];
    let mut ops = 0u64;
    while !ops.is_multiple_of(64) || Instant::now() < deadline {
        ops += 1;
        let i = rng.below(own.len() as u64) as usize;
        let entry = &own[i];
        // Relaxed: this writer is the only one that stores this entry's state.
        let state = entry.state.load(Ordering::Relaxed);
        if let Some(code) = refs[i].take() {
            // Release: readers that see "dead" also see everything before it; the
            // unpublish below comes after, so a reader that observes it sees "dead".
            entry.state.store(state + 1, Ordering::Release);
            free(heap, code, counters);
            continue;
        }
        let size = if rng.chance(3) {
            rng.range(64 << 10, 1 << 20)
        } else {
            method_size(&mut rng, 256 << 10)
        };
        let Ok(mut reservation) = heap.reserve(size) else {
            heap.try_reclaim();
            continue;
        };
        reservation.code_mut().fill(0xCC);
        if rng.chance(10) {
            reservation.abort();
            // Relaxed: statistics, summed after every thread has joined.
            counters.aborts.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // Relaxed: only uniqueness matters.
        let method = next_method.fetch_add(1, Ordering::Relaxed);
        let info = CodeInfo::new(
            method,
            format!("m{method}"),
            jitmap::heap::JitKind::Baseline,
        );
        let Ok(code) = reservation.publish(info) else {
            // A valid reservation must publish: a failure is a wrong answer.
            // Relaxed: statistics, summed after join.
            counters.wrong.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        // Seqlock write: the entry is dead (even state) while its fields change.
        // Release fence: a reader that sees these fields sees the dead state first.
        fence(Ordering::Release);
        // Relaxed: the seqlock fences and the state word order the fields.
        entry.start.store(code.start() as u64, Ordering::Relaxed);
        entry.size.store(size, Ordering::Relaxed);
        entry.method.store(method, Ordering::Relaxed);
        // Release: publishes the fields, and orders the publish before "live".
        entry.state.store(state + 1, Ordering::Release);
        refs[i] = Some(code);
        counters.publishes.fetch_add(1, Ordering::Relaxed);
    }
    for (entry, code) in own.iter().zip(refs) {
        if let Some(code) = code {
            // Release: as above.
            entry.state.fetch_add(1, Ordering::Release);
            free(heap, code, counters);
        }
    }
}

/// Frees a block the writer published; a refusal is a wrong answer.
fn free(heap: &CodeHeap, code: CodeRef, counters: &Counters) {
    // Relaxed: statistics, summed after join.
    match heap.free(code) {
        Ok(()) => counters.frees.fetch_add(1, Ordering::Relaxed),
        Err(_) => counters.wrong.fetch_add(1, Ordering::Relaxed),
    };
}

fn reader(
    heap: &CodeHeap,
    domain: &Arc<Domain>,
    entries: &[Entry],
    counters: &Counters,
    stop: &AtomicBool,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    // `run` sizes the domain with a slot per thread.
    let Ok(reader) = domain.register() else {
        // Relaxed: statistics, summed after join.
        counters.wrong.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let (mut lookups, mut exact, mut wrong) = (0u64, 0u64, 0u64);
    // Relaxed: a stop flag, as in `run`.
    while !stop.load(Ordering::Relaxed) {
        let Ok(guard) = reader.pin() else {
            wrong += 1;
            break;
        };
        let entry = &entries[rng.below(entries.len() as u64) as usize];
        // Acquire: pairs with the writer's Release store of this state.
        let s1 = entry.state.load(Ordering::Acquire);
        if s1 & 1 == 0 {
            continue;
        }
        // Relaxed: the seqlock (Acquire state load, Acquire fence, state re-check)
        // makes a consistent snapshot of these fields.
        let start = entry.start.load(Ordering::Relaxed);
        let size = entry.size.load(Ordering::Relaxed);
        let method = entry.method.load(Ordering::Relaxed);
        // Acquire fence, then Relaxed re-check: the seqlock's read side.
        fence(Ordering::Acquire);
        if entry.state.load(Ordering::Relaxed) != s1 {
            continue;
        }
        let addr = start + rng.below(size);
        let Ok(found) = heap.find(&guard, addr as usize) else {
            wrong += 1; // a refused lookup is a wrong answer
            continue;
        };
        // Acquire: if the lookup saw the unpublish, this load sees "dead".
        let s2 = entry.state.load(Ordering::Acquire);
        lookups += 1;
        let is_block = found.is_some_and(|b| {
            b.start() as u64 == start
                && b.offset() == addr - start
                && b.size() == size
                && matches!(b.kind(), BlockKind::Method(h) if h.method_id() == method && h.code_size() == size)
        });
        if s2 == s1 {
            exact += 1;
            wrong += u64::from(!is_block);
        } else {
            wrong += u64::from(found.is_some() && !is_block);
        }
    }
    // Relaxed: statistics, summed after join.
    counters.lookups.fetch_add(lookups, Ordering::Relaxed);
    counters.exact.fetch_add(exact, Ordering::Relaxed);
    counters.wrong.fetch_add(wrong, Ordering::Relaxed);
}
