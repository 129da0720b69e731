//! `scale`: what jitmap costs per method as a runtime grows, measured over
//! the public API. One heap per size, methods of 64 bytes published with
//! `CodeInfo::new(id, "m", Baseline)` alone, then random exact finds at
//! addresses inside them. Beside them, in the same run, the same finds in a
//! `BTreeMap<start, id>` and a sorted `Vec<(start, end)>` (what a runtime
//! would otherwise keep), and a floor: the same random walk over the same
//! address table, without a lookup.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use jitmap::{CodeHeap, CodeInfo, ExecutionManager, HeapConfig, JitKind};
use jitmap_testkit::rng::Rng;

use crate::fixture::BoxError;
use crate::tiered::resident_bytes;

/// Methods per run of the full table.
pub const SIZES: [usize; 3] = [10_000, 100_000, 1_000_000];
/// Code bytes each method asks for.
pub const METHOD_BYTES: u64 = 64;
/// Finds per timed pass.
pub const FINDS: usize = 2_000_000;
/// Timed passes per structure, interleaved; the median is reported.
pub const PASSES: usize = 5;
/// Heaps the publishes are timed into; the median is reported.
pub const PUBLISH_ROUNDS: usize = 5;

/// One size's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Methods published.
    pub methods: usize,
    /// Mean ns per publish (reserve, write one byte, publish), the median
    /// of [`PUBLISH_ROUNDS`] heaps.
    pub publish_ns: f64,
    /// Heap-allocator bytes in use after the publishes, over before, per
    /// method ([`heap_in_use`]), with the header chunks the heap mapped
    /// itself: the metadata jitmap allocates.
    pub malloc_per_method: f64,
    /// Resident bytes after over before, per method: metadata, code pages
    /// and map pages.
    pub rss_per_method: f64,
    /// Median ns per step of the floor's walk.
    pub floor_ns: f64,
    /// Median ns per exact find through the manager (pinned once a pass),
    /// reading the method's start and id.
    pub find_ns: f64,
    /// Mean ns per insert into the `BTreeMap<start, id>`, in publish order.
    pub btree_insert_ns: f64,
    /// Heap-allocator bytes of the `BTreeMap` grown by those inserts, per
    /// method.
    pub btree_malloc_per_method: f64,
    /// Median ns per find in the `BTreeMap<start, id>` (start and id),
    /// built from the sorted starts at once (full nodes).
    pub btree_ns: f64,
    /// Median ns per find in the sorted `Vec`.
    pub sorted_vec_ns: f64,
    /// Finds that answered another start than the method's (must be 0).
    pub wrong: u64,
}

/// Bytes the allocator has handed out and not had back: glibc's
/// `mallinfo2`, over every arena, chunks it mapped on their own included.
/// This crate's unit tests take turns: the figures of one that reads
/// [`heap_in_use`] would take in another's allocations and frees (and the
/// agent runs one at a time).
#[cfg(test)]
pub(crate) fn measuring() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let m = unsafe { libc::mallinfo2() };
    m.uordblks + m.hblkhd
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// ns per step of `f` over `addrs`.
fn timed(addrs: &[usize], mut f: impl FnMut(usize) -> usize) -> f64 {
    let t = Instant::now();
    let mut sum = 0usize;
    for &a in addrs {
        sum = sum.wrapping_add(f(black_box(a)));
    }
    black_box(sum);
    t.elapsed().as_nanos() as f64 / addrs.len() as f64
}

/// Touches `mib` MiB of fresh memory, advised for huge pages, and gives it
/// back. In a virtual machine the first touch of guest memory the host has
/// not backed yet costs the host's page faults (here about 4 ms per 2 MiB);
/// the kernel then hands the same, backed, pages to the heaps measured
/// next, so that their publishes time jitmap rather than the host.
pub fn warm(mib: usize) -> Result<(), BoxError> {
    if mib == 0 {
        return Ok(());
    }
    let len = mib << 20;
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: the range is our mapping; advice does not change its contents.
    unsafe { libc::madvise(at, len, libc::MADV_HUGEPAGE) };
    for page in (0..len).step_by(4096) {
        // SAFETY: inside the writable mapping made above.
        unsafe { at.cast::<u8>().add(page).write_volatile(1) };
    }
    // SAFETY: unmaps exactly the mapping made above, no longer used.
    unsafe { libc::munmap(at, len) };
    Ok(())
}

/// Publishes `methods` methods of [`METHOD_BYTES`] into `heap`; their
/// starts go into `starts`. Returns the mean ns per publish.
fn publish_all(heap: &CodeHeap, methods: usize, starts: &mut Vec<usize>) -> Result<f64, BoxError> {
    let t = Instant::now();
    for id in 0..methods as u64 {
        let mut r = heap.reserve(METHOD_BYTES)?;
        r.code_mut()[0] = 0xC3;
        let code = r.publish(CodeInfo::new(id, "m", JitKind::Baseline))?;
        starts.push(code.start());
    }
    Ok(t.elapsed().as_nanos() as f64 / methods as f64)
}

/// Measures one size: `methods` published, `finds` random finds per pass.
/// The publishes are timed into [`PUBLISH_ROUNDS`] fresh heaps, the median
/// reported (a round of 10,000 takes a few milliseconds, which one
/// preemption on a shared machine doubles); the bytes are counted around
/// the first.
/// With `huge_pages` off, the heap is made with [`HeapConfig::huge_pages`]
/// false: no 2 MiB page faults in the publishes, page walks in the finds.
pub fn measure(methods: usize, finds: usize, huge_pages: bool) -> Result<Row, BoxError> {
    let manager = ExecutionManager::new(4);
    let config = HeapConfig {
        span: (methods as u64 * 2 * (METHOD_BYTES + 16))
            .next_power_of_two()
            .max(1 << 20),
        huge_pages,
        ..HeapConfig::default()
    };
    let heap = manager.create_heap(config)?;
    let mut starts = Vec::with_capacity(methods);
    let (malloc0, rss0) = (heap_in_use(), resident_bytes());
    let mut publish = vec![publish_all(&heap, methods, &mut starts)?];
    // The heap's huge-page chunks of headers are mapped, not allocated.
    let (malloc1, rss1) = (heap_in_use() + heap.header_mapped_bytes(), resident_bytes());
    let mut scratch = Vec::with_capacity(methods);
    for _ in 1..PUBLISH_ROUNDS {
        let round = manager.create_heap(config)?;
        scratch.clear();
        publish.push(publish_all(&round, methods, &mut scratch)?);
    }
    drop(scratch);
    let publish_ns = median(publish);
    // A B-tree grown one insert at a time, as a runtime would grow it, for
    // its insert time and bytes; the finds use one built from the sorted
    // starts at once, with full nodes: the faster of the two to search.
    let before_btree = heap_in_use();
    let t = Instant::now();
    let mut grown: BTreeMap<usize, u64> = BTreeMap::new();
    for (i, &s) in starts.iter().enumerate() {
        grown.insert(black_box(s), i as u64);
    }
    let btree_insert_ns = t.elapsed().as_nanos() as f64 / methods as f64;
    let btree_malloc = heap_in_use() as f64 - before_btree as f64;
    drop(grown);
    let btree: BTreeMap<usize, u64> = starts
        .iter()
        .enumerate()
        .map(|(i, &s)| (s, i as u64))
        .collect();
    let mut sorted: Vec<(usize, usize)> = starts
        .iter()
        .map(|&s| (s, s + METHOD_BYTES as usize))
        .collect();
    sorted.sort_unstable();
    let mut rng = Rng::new(0x5ca1e + methods as u64);
    let addrs: Vec<usize> = (0..finds)
        .map(|_| starts[rng.below(methods as u64) as usize] + rng.below(METHOD_BYTES) as usize)
        .collect();
    let reader = manager.register_reader()?;
    let mut wrong = 0u64;
    let [mut floor, mut find, mut tree, mut vec] = [(); 4].map(|_| Vec::with_capacity(PASSES));
    for _ in 0..PASSES {
        floor.push(timed(&addrs, |a| a));
        let guard = manager.pin(&reader)?;
        // The method's start and id: the id is read from its header.
        find.push(timed(&addrs, |a| {
            guard
                .find(a)
                .map_or(0, |b| b.start() ^ b.method_id() as usize)
        }));
        drop(guard);
        tree.push(timed(&addrs, |a| {
            btree
                .range(..=a)
                .next_back()
                .filter(|(s, _)| a < *s + METHOD_BYTES as usize)
                .map_or(0, |(s, id)| *s ^ *id as usize)
        }));
        vec.push(timed(&addrs, |a| {
            let i = sorted.partition_point(|&(s, _)| s <= a);
            match i.checked_sub(1).map(|i| sorted[i]) {
                Some((s, e)) if a < e => s,
                _ => 0,
            }
        }));
    }
    // Exactness, once, outside the timed passes: the manager's answer
    // against the B-tree's.
    let guard = manager.pin(&reader)?;
    for &a in &addrs {
        let found = guard.find(a).map(|b| b.start());
        let start = btree.range(..=a).next_back().map(|(s, _)| *s);
        if found != start {
            wrong += 1;
        }
    }
    drop(guard);
    Ok(Row {
        methods,
        publish_ns,
        malloc_per_method: (malloc1 as f64 - malloc0 as f64) / methods as f64,
        rss_per_method: (rss1 as f64 - rss0 as f64) / methods as f64,
        floor_ns: median(floor),
        btree_insert_ns,
        btree_malloc_per_method: btree_malloc / methods as f64,
        find_ns: median(find),
        btree_ns: median(tree),
        sorted_vec_ns: median(vec),
        wrong,
    })
}

/// The rows as a table, with each find's cost over the floor.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "methods    publish ns  malloc B/method  RSS B/method  floor ns  find ns  find-floor  BTreeMap insert ns  BTreeMap B/method  BTreeMap ns  sorted Vec ns  wrong\n",
    );
    for r in rows {
        out += &format!(
            "{:>9}  {:>10.0}  {:>15.0}  {:>12.0}  {:>8.1}  {:>7.1}  {:>10.1}  {:>18.0}  {:>17.0}  {:>11.1}  {:>13.1}  {:>5}\n",
            r.methods,
            r.publish_ns,
            r.malloc_per_method,
            r.rss_per_method,
            r.floor_ns,
            r.find_ns,
            r.find_ns - r.floor_ns,
            r.btree_insert_ns,
            r.btree_malloc_per_method,
            r.btree_ns,
            r.sorted_vec_ns,
            r.wrong
        );
    }
    out
}

/// The rows as JSON: one object per size, the [`Row`] fields by name.
pub fn json(rows: &[Row]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                serde_json::json!({
                    "methods": r.methods,
                    "publish_ns": r.publish_ns,
                    "malloc_bytes_per_method": r.malloc_per_method,
                    "rss_bytes_per_method": r.rss_per_method,
                    "floor_ns": r.floor_ns,
                    "find_ns": r.find_ns,
                    "btree_insert_ns": r.btree_insert_ns,
                    "btree_malloc_bytes_per_method": r.btree_malloc_per_method,
                    "btree_ns": r.btree_ns,
                    "sorted_vec_ns": r.sorted_vec_ns,
                    "wrong": r.wrong,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_find_agrees_with_the_btree_and_the_metadata_is_counted() {
        let _turn = measuring();
        let rows: Vec<Row> = (0..3)
            .map(|_| measure(2_000, 20_000, true).unwrap())
            .collect();
        for row in &rows {
            assert_eq!((row.methods, row.wrong), (2_000, 0));
        }
        // Each publish takes a header and its name's bytes. (The allocator's
        // count is the process's: a thread an earlier test left behind may
        // free beside the count, which then reads low; the best of three
        // stands. The exact bound is `tests/metadata.rs`'s, counted per
        // thread.)
        let most = rows
            .iter()
            .map(|r| r.malloc_per_method)
            .fold(f64::MIN, f64::max);
        assert!(most >= 1.0, "{rows:?}");
    }
}
