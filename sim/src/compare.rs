//! `compare`: every structure measured side by side in one process, so ratios are
//! taken under the same machine conditions. Medians of repeated timed batches,
//! interleaved across the structures of each table.

use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::heap::JitKind;

use crate::fixture::{
    self, BoxError, Finder, Fixture, ManyHeaps, Structure, Visitor, realistic_sizes,
};
use jitmap_testkit::rng::Rng;

/// Method sizes for `tail_of_method`.
pub const TAIL_SIZES: [u64; 8] = [
    64,
    256,
    1 << 10,
    4 << 10,
    64 << 10,
    1 << 20,
    16 << 20,
    64 << 20,
];
/// Methods in the `random_ip` heap.
pub const RANDOM_METHODS: usize = 100_000;

/// Methods per heap, and heaps, in `many_heaps`.
pub const MANY_HEAPS: (usize, usize) = (1000, 16);

/// Everything one run measured.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// `(structure, method size, median ns)` for a lookup of a method's last byte,
    /// the method sitting among the `random_ip` fixture's methods.
    pub tail: Vec<(Structure, u64, f64)>,
    /// `(structure, median ns)` for code addresses weighted by bytes.
    pub random: Vec<(Structure, f64)>,
    /// `(structure, median ns)` for a uniformly picked method, then offset.
    pub random_method: Vec<(Structure, f64)>,
    /// `(name, median ns)` for addresses over [`MANY_HEAPS`] heaps.
    pub many_heaps: Vec<(&'static str, f64)>,
    /// Map footprint of the `random_ip` heap.
    pub memory: Memory,
    /// Reader throughput under contention.
    pub concurrent: Vec<Concurrent>,
}

/// Map footprint of a heap.
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    /// Heap span.
    pub span: u64,
    /// Bytes of code published.
    pub code: u64,
    /// Map bytes reserved (start map span / 64, end map span / 32).
    pub map_reserved: u64,
    /// Map bytes resident (both maps).
    pub map_resident: u64,
}

/// One concurrency configuration.
#[derive(Clone, Copy, Debug)]
pub struct Concurrent {
    /// Reader threads.
    pub readers: usize,
    /// Whether a writer churned publish and free meanwhile.
    pub writer: bool,
    /// Lookups per second, all readers together.
    pub lookups_per_sec: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Batch length, batch count and the warm-up before each batch of one
/// measurement.
#[derive(Clone, Copy)]
struct Timing {
    target: Duration,
    samples: usize,
    warm: Duration,
}

impl Timing {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                target: Duration::from_millis(1),
                samples: 5,
                warm: Duration::from_micros(500),
            }
        } else {
            Self {
                target: Duration::from_millis(10),
                samples: 21,
                warm: Duration::from_millis(5),
            }
        }
    }
}

/// ns per lookup over one timed batch of `iters` lookups of `addresses`
/// (cycled), in a loop monomorphized for the finder.
fn batch<F: Finder>(finder: &F, addresses: &[usize], iters: usize) -> f64 {
    let mask = addresses.len() - 1;
    let t = Instant::now();
    for i in 0..iters {
        black_box(finder.find(black_box(addresses[i & mask])));
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

/// One timed batch (see [`batch`]) after `timing.warm` of untimed lookups of
/// the same finder over the same addresses, so that the batch runs as its
/// own finder leaves the machine, not as the structure timed before it did.
///
/// A throwaway program over this fixture (medians of 21 batches of 2^20
/// `random_ip` lookups by `heap`, two runs each) measured 6.49–7.13 ns per
/// lookup when a `v1` batch (a megabyte of map words per lookup) ran just
/// before, and 4.99–5.21 ns when it did not. 2^16 untimed lookups first
/// left 5.50–7.85 against 4.91–5.04; 2^20 (about 5 ms) left 4.97–5.09
/// against 4.99–5.05. A 20 ms sleep before the batch slowed it to 6.6–7.0
/// either way: what lingers is the last milliseconds of work, not only the
/// caches, so the warm-up is a duration, not a count.
fn timed<F: Finder>(finder: &F, addresses: &[usize], iters: usize, timing: Timing) -> f64 {
    warm(finder, addresses, iters.min(1024), timing.warm);
    batch(finder, addresses, iters)
}

/// The untimed lookups of [`timed`], in rounds of `round` until `time` has
/// passed. Out of line, so that the timed loop compiles as it would alone:
/// inlined, its loop took registers from the timed loop, which then moved
/// five of them around every call.
#[inline(never)]
fn warm<F: Finder>(finder: &F, addresses: &[usize], round: usize, time: Duration) {
    let mask = addresses.len() - 1;
    let t = Instant::now();
    let mut i = 0;
    while t.elapsed() < time {
        for _ in 0..round {
            black_box(finder.find(black_box(addresses[i & mask])));
            i += 1;
        }
    }
}

/// The batch length for one finder: doubled until a batch takes the target.
fn calibrate<F: Finder>(finder: &F, addresses: &[usize], timing: Timing) -> usize {
    let target = timing.target.as_nanos() as f64;
    let mut iters = 1;
    while batch(finder, addresses, iters) * (iters as f64) < target && iters < 1 << 30 {
        iters *= 2;
    }
    iters
}

/// A fixture structure's batch length (see [`calibrate`]).
struct Calibrate<'a> {
    addresses: &'a [usize],
    timing: Timing,
}

impl Visitor for Calibrate<'_> {
    type Output = usize;

    fn visit<F: Finder>(self, finder: F) -> usize {
        calibrate(&finder, self.addresses, self.timing)
    }
}

/// One timed batch of a fixture structure (see [`batch`]).
struct Batch<'a> {
    addresses: &'a [usize],
    iters: usize,
    timing: Timing,
}

impl Visitor for Batch<'_> {
    type Output = f64;

    fn visit<F: Finder>(self, finder: F) -> f64 {
        timed(&finder, self.addresses, self.iters, self.timing)
    }
}

/// Median ns per lookup of each address set for every structure, one list
/// per set. The batches are interleaved: each round times one batch of every
/// structure on every set in turn, so a slow spell of a shared machine lands
/// on all of them, and the ratios the report is for (between structures, and
/// between sets, such as v2 at 64 MiB against v2 at 64 B) hold through it.
fn measure_all(
    fixture: &Fixture<'_>,
    guard: &jitmap::ManagerGuard<'_>,
    sets: &[&[usize]],
    timing: Timing,
) -> Vec<Vec<(Structure, f64)>> {
    let iters: Vec<[usize; Structure::ALL.len()]> = sets
        .iter()
        .map(|&addresses| {
            Structure::ALL.map(|s| fixture.visit(s, guard, Calibrate { addresses, timing }))
        })
        .collect();
    let mut ns: Vec<[Vec<f64>; Structure::ALL.len()]> = sets
        .iter()
        .map(|_| Structure::ALL.map(|_| Vec::with_capacity(timing.samples)))
        .collect();
    for _ in 0..timing.samples {
        for ((&addresses, iters), ns) in sets.iter().zip(&iters).zip(&mut ns) {
            for ((s, &iters), ns) in Structure::ALL.iter().zip(iters).zip(ns) {
                ns.push(fixture.visit(
                    *s,
                    guard,
                    Batch {
                        addresses,
                        iters,
                        timing,
                    },
                ));
            }
        }
    }
    ns.into_iter()
        .map(|ns| Structure::ALL.into_iter().zip(ns.map(median)).collect())
        .collect()
}

/// A closure as a finder (for the many-heaps structures, which are not
/// fixture finders).
struct Closure<G>(G);

impl<G: Fn(usize) -> Option<usize>> Finder for Closure<G> {
    #[inline(always)]
    fn find(&self, addr: usize) -> Option<usize> {
        (self.0)(addr)
    }
}

/// The sizes of the shared fixture: 100,000 realistic methods with the
/// `tail_of_method` methods among them, and where those sit.
pub fn shared_sizes() -> (Vec<u64>, Vec<usize>) {
    let mut sizes = realistic_sizes(RANDOM_METHODS, 17);
    let mut at = Vec::new();
    for (k, &size) in TAIL_SIZES.iter().enumerate() {
        let i = (k + 1) * RANDOM_METHODS / (TAIL_SIZES.len() + 1) + k;
        sizes.insert(i, size);
        at.push(i);
    }
    (sizes, at)
}

/// Runs every measurement. `quick` shortens batches and the concurrency runs.
pub fn run(quick: bool) -> Result<Report, BoxError> {
    let timing = Timing::new(quick);
    let mut report = Report::default();
    let manager = ExecutionManager::new(4);
    let (sizes, tail_at) = shared_sizes();
    let fixture = Fixture::new(&manager, &sizes)?;
    let reader = manager.register_reader()?;
    let by_bytes = fixture.random_addresses(&mut Rng::new(23), 1 << 16);
    {
        let guard = manager.pin(&reader)?;
        let mut tails = Vec::new();
        for (&size, &i) in TAIL_SIZES.iter().zip(&tail_at) {
            let (start, _) = fixture.blocks()[i];
            let tail = start + size as usize - 1;
            for s in Structure::ALL {
                // The floor reads one word and may not reach the start.
                if s != Structure::Floor && fixture.lookup(s, &guard, tail) != Some(start) {
                    return Err(
                        format!("{} does not find the method at {tail:#x}", s.name()).into(),
                    );
                }
            }
            tails.push([tail]);
        }
        let sets: Vec<&[usize]> = tails.iter().map(|t| &t[..]).collect();
        for (&size, row) in TAIL_SIZES
            .iter()
            .zip(measure_all(&fixture, &guard, &sets, timing))
        {
            report
                .tail
                .extend(row.into_iter().map(|(s, ns)| (s, size, ns)));
        }
        let by_method = fixture.random_method_addresses(&mut Rng::new(31), 1 << 16);
        let mut random = measure_all(&fixture, &guard, &[&by_bytes, &by_method], timing);
        report.random_method = random.pop().unwrap_or_default();
        report.random = random.pop().unwrap_or_default();
    }
    let span = fixture.heap().span();
    report.memory = Memory {
        span,
        code: fixture.blocks().iter().map(|b| b.1).sum(),
        map_reserved: fixture.heap().map_reserved_bytes() as u64,
        map_resident: fixture.map_resident_bytes().unwrap_or(0) as u64,
    };
    // Rounds of every configuration in turn, as for the lookups: a slow spell
    // of the machine lands on all four, not on one.
    let (rounds, duration) = if quick {
        (5, Duration::from_millis(60))
    } else {
        (21, Duration::from_millis(100))
    };
    let configs = [(1, false), (2, false), (1, true), (2, true)];
    let mut rates = configs.map(|_| Vec::with_capacity(rounds));
    for _ in 0..rounds {
        for (&(readers, writer), rates) in configs.iter().zip(&mut rates) {
            rates.push(throughput(&fixture, &by_bytes, readers, writer, duration));
        }
    }
    for ((readers, writer), rates) in configs.into_iter().zip(rates) {
        report.concurrent.push(Concurrent {
            readers,
            writer,
            lookups_per_sec: median(rates),
        });
    }
    drop(fixture);
    report.many_heaps = many_heaps(timing)?;
    Ok(report)
}

/// `many_heaps`: random addresses over [`MANY_HEAPS`] heaps.
fn many_heaps(timing: Timing) -> Result<Vec<(&'static str, f64)>, BoxError> {
    let (heaps, methods) = MANY_HEAPS;
    let many = ManyHeaps::new(heaps, methods, 41)?;
    let addresses = many.addresses(&mut Rng::new(43), 1 << 16);
    let located: Vec<(&jitmap::map_words::MmapWords, u64)> = addresses
        .iter()
        .map(|&a| many.locate(a).ok_or("an address outside every heap"))
        .collect::<Result<_, _>>()?;
    let reader = many.manager.register_reader()?;
    let guard = many.manager.pin(&reader)?;
    let indices: Vec<usize> = (0..addresses.len()).collect();
    let floor = Closure(|i: usize| {
        let (words, offset) = located[i];
        fixture::floor_find(words, offset).map(|s| s as usize)
    });
    let btree = Closure(|a: usize| {
        many.ranges
            .range(..=a)
            .next_back()
            .filter(|(_, (end, _))| a < *end)
            .map(|(_, &(_, i))| i)
    });
    let range_map = Closure(|a: usize| guard.section(a).map(|s| s.begin()));
    let manager = Closure(|a: usize| guard.find(a).map(|b| b.start()));
    // Interleaved rounds, as in `measure_all`.
    let iters = [
        calibrate(&floor, &indices, timing),
        calibrate(&btree, &addresses, timing),
        calibrate(&range_map, &addresses, timing),
        calibrate(&manager, &addresses, timing),
    ];
    let mut ns: [Vec<f64>; 4] = Default::default();
    for _ in 0..timing.samples {
        ns[0].push(timed(&floor, &indices, iters[0], timing));
        ns[1].push(timed(&btree, &addresses, iters[1], timing));
        ns[2].push(timed(&range_map, &addresses, iters[2], timing));
        ns[3].push(timed(&manager, &addresses, iters[3], timing));
    }
    Ok(["floor", "btree_ranges", "range_map", "manager"]
        .into_iter()
        .zip(ns.map(median))
        .collect())
}

/// Manager lookups per second by `readers` threads for `duration`, optionally
/// while a writer publishes and frees 256-byte methods in the same heap.
pub fn throughput(
    fixture: &Fixture<'_>,
    addresses: &[usize],
    readers: usize,
    writer: bool,
    duration: Duration,
) -> f64 {
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for r in 0..readers {
            let (stop, total) = (&stop, &total);
            s.spawn(move || {
                let Ok(reader) = fixture.manager().register_reader() else {
                    return;
                };
                // Each reader walks the addresses with its own odd stride (a
                // full cycle of the power-of-two length): the same working set
                // in an unrelated order, so no reader fetches lines just ahead
                // of another and the readers scale no better than they would.
                // None walks them in order (stride 1), which would let the
                // prefetcher serve one reader's address reads and not the others'.
                let stride = 1 + 2 * (r + 1) * 20_011;
                let mut i = r * 7919;
                let mut count = 0u64;
                // Relaxed: a stop flag; no data rides on it.
                while !stop.load(Ordering::Relaxed) {
                    let Ok(guard) = fixture.manager().pin(&reader) else {
                        return;
                    };
                    for _ in 0..256 {
                        i = (i + stride) & (addresses.len() - 1);
                        black_box(guard.find(addresses[i]).map(|b| b.start()));
                    }
                    count += 256;
                }
                // Relaxed: summed after the scope joins.
                total.fetch_add(count, Ordering::Relaxed);
            });
        }
        if writer {
            let stop = &stop;
            s.spawn(move || {
                let heap = fixture.heap();
                // Relaxed: as above.
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(r) = heap.reserve(256)
                        && let Ok(code) =
                            r.publish(jitmap::CodeInfo::new(0, "churn", JitKind::Baseline))
                    {
                        let _ = heap.free(code);
                    }
                }
            });
        }
        std::thread::sleep(duration);
        // Relaxed: as above.
        stop.store(true, Ordering::Relaxed);
    });
    // Relaxed: the scope has joined every thread.
    total.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// A method size as reports print it: `64 B`, `4 KiB`, `16 MiB`.
pub fn size_label(size: u64) -> String {
    match size {
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// Axis labels for the log scale's decimal ticks: 100 B, 1 kB, 10 kB, ...
fn decimal_label(x: f64) -> String {
    match x {
        x if x >= 1e6 => format!("{} MB", (x / 1e6).round()),
        x if x >= 1e3 => format!("{} kB", (x / 1e3).round()),
        x => format!("{} B", x.round()),
    }
}

impl Report {
    fn random_ns(&self, s: Structure) -> f64 {
        self.random
            .iter()
            .find(|r| r.0 == s)
            .map_or(f64::NAN, |r| r.1)
    }

    fn method_ns(&self, s: Structure) -> f64 {
        self.random_method
            .iter()
            .find(|r| r.0 == s)
            .map_or(f64::NAN, |r| r.1)
    }

    fn tail_ns(&self, s: Structure, size: u64) -> f64 {
        self.tail
            .iter()
            .find(|r| r.0 == s && r.1 == size)
            .map_or(f64::NAN, |r| r.2)
    }

    fn many_ns(&self, name: &str) -> f64 {
        self.many_heaps
            .iter()
            .find(|r| r.0 == name)
            .map_or(f64::NAN, |r| r.1)
    }

    fn throughput(&self, readers: usize, writer: bool) -> f64 {
        self.concurrent
            .iter()
            .find(|c| c.readers == readers && c.writer == writer)
            .map_or(f64::NAN, |c| c.lookups_per_sec)
    }

    /// The ratios users compare by, named as in the JSON output. Ratios hold
    /// across machines far better than ns.
    pub fn ratios(&self) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = Vec::new();
        for &size in &TAIL_SIZES {
            let floor = self.tail_ns(Structure::Floor, size);
            let label = size_label(size).replace(' ', "");
            for s in &Structure::ALL[1..] {
                out.push((
                    format!("tail_of_method/{label}/{}/floor", s.name()),
                    self.tail_ns(*s, size) / floor,
                ));
            }
        }
        out.push((
            "tail_of_method/v2@64MiB/v2@64B".into(),
            self.tail_ns(Structure::V2, 64 << 20) / self.tail_ns(Structure::V2, 64),
        ));
        for (section, ns) in [
            ("random_ip", Self::random_ns as fn(&Self, Structure) -> f64),
            ("random_method", Self::method_ns),
        ] {
            let floor = ns(self, Structure::Floor);
            for s in &Structure::ALL[1..] {
                out.push((
                    format!("{section}/{}/floor", s.name()),
                    ns(self, *s) / floor,
                ));
            }
            let heap = ns(self, Structure::Heap);
            for s in [
                Structure::SortedVec,
                Structure::BTreeRwLock,
                Structure::Manager,
            ] {
                out.push((format!("{section}/{}/heap", s.name()), ns(self, s) / heap));
            }
        }
        let floor = self.many_ns("floor");
        for (name, ns) in &self.many_heaps[1..] {
            out.push((format!("many_heaps/{name}/floor"), ns / floor));
        }
        out.push((
            "many_heaps/btree_ranges/range_map".into(),
            self.many_ns("btree_ranges") / self.many_ns("range_map"),
        ));
        // The names of earlier runs, kept for comparison.
        let v2 = self.random_ns(Structure::V2);
        for s in [
            Structure::V1,
            Structure::BTreeRwLock,
            Structure::SortedVec,
            Structure::Manager,
        ] {
            out.push((format!("{}/v2", s.name()), self.random_ns(s) / v2));
        }
        for size in [1 << 10, 64 << 10, 1 << 20] {
            let r = self.tail_ns(Structure::V1, size) / self.tail_ns(Structure::V2, size);
            out.push((
                format!("v1/v2@tail_{}", size_label(size).replace(' ', "")),
                r,
            ));
        }
        out.push((
            "v2_tail_64MiB/64B".into(),
            self.tail_ns(Structure::V2, 64 << 20) / self.tail_ns(Structure::V2, 64),
        ));
        out.push((
            "concurrent_2r/1r".into(),
            self.throughput(2, false) / self.throughput(1, false),
        ));
        out.push((
            "concurrent_1r_churn/1r".into(),
            self.throughput(1, true) / self.throughput(1, false),
        ));
        out.push((
            "concurrent_2r_churn/2r".into(),
            self.throughput(2, true) / self.throughput(2, false),
        ));
        out
    }

    /// A plain-text table: ns, and each figure over the section's floor.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let names: Vec<&str> = Structure::ALL.iter().map(|s| s.name()).collect();
        let header = names.iter().map(|n| format!("{n:>17}")).collect::<String>();
        let _ = writeln!(
            t,
            "tail_of_method: median ns per lookup of a method's last byte (the method among {RANDOM_METHODS}); (×floor)"
        );
        let _ = writeln!(t, "{:>8} {header}", "size");
        for &size in &TAIL_SIZES {
            let floor = self.tail_ns(Structure::Floor, size);
            let row: String = Structure::ALL
                .iter()
                .map(|&s| {
                    let ns = self.tail_ns(s, size);
                    format!("{:>17}", format!("{ns:.2} ({:.2})", ns / floor))
                })
                .collect();
            let _ = writeln!(t, "{:>8} {row}", size_label(size));
        }
        for (title, ns) in [
            (
                "random_ip: addresses weighted by bytes",
                Self::random_ns as fn(&Self, Structure) -> f64,
            ),
            (
                "random_method: a method picked uniformly, then an offset",
                Self::method_ns,
            ),
        ] {
            let _ = writeln!(
                t,
                "\n{title} ({RANDOM_METHODS} methods), median ns per lookup (×floor)"
            );
            let floor = ns(self, Structure::Floor);
            for &s in &Structure::ALL {
                let v = ns(self, s);
                let _ = writeln!(
                    t,
                    "{:>13} {:>8.2} ({:.2}){}",
                    s.name(),
                    v,
                    v / floor,
                    if s.is_exact() { "  exact" } else { "" }
                );
            }
        }
        let (heaps, methods) = MANY_HEAPS;
        let _ = writeln!(
            t,
            "\nmany_heaps: {heaps} heaps of {methods} methods, uniform heap, method, offset; median ns (×floor)"
        );
        let floor = self.many_ns("floor");
        for (name, ns) in &self.many_heaps {
            let _ = writeln!(t, "{name:>13} {ns:>8.2} ({:.2})", ns / floor);
        }
        let _ = writeln!(t, "\nratios");
        for (name, r) in self.ratios() {
            let _ = writeln!(t, "{name:>42} {r:>8.2}");
        }
        let m = self.memory;
        let mib = m.code as f64 / (1 << 20) as f64;
        let _ = writeln!(
            t,
            "\nmap memory (start and end maps): span {} MiB, code {:.1} MiB, reserved {} bytes (span/64 + span/32), resident {} bytes = {:.0} bytes per MiB of code",
            m.span >> 20,
            mib,
            m.map_reserved,
            m.map_resident,
            m.map_resident as f64 / mib
        );
        let _ = writeln!(t, "\nconcurrent: manager lookups per second");
        for c in &self.concurrent {
            let _ = writeln!(
                t,
                "{} reader(s){:>16} {:>14.0}",
                c.readers,
                if c.writer { ", writer churning" } else { "" },
                c.lookups_per_sec
            );
        }
        t
    }

    /// One JSON object: `tail_of_method`, `random_ip`, `random_method`,
    /// `many_heaps`, `ratios`, `memory`, `concurrent`.
    pub fn json(&self) -> String {
        let list = |rows: &[(Structure, f64)]| -> String {
            rows.iter()
                .map(|(s, ns)| format!("{{\"structure\":\"{}\",\"ns\":{ns:.3}}}", s.name()))
                .collect::<Vec<_>>()
                .join(",")
        };
        let tail: Vec<String> = self
            .tail
            .iter()
            .map(|(s, size, ns)| {
                format!(
                    "{{\"structure\":\"{}\",\"size\":{size},\"ns\":{ns:.3}}}",
                    s.name()
                )
            })
            .collect();
        let many: Vec<String> = self
            .many_heaps
            .iter()
            .map(|(name, ns)| format!("{{\"structure\":\"{name}\",\"ns\":{ns:.3}}}"))
            .collect();
        let ratios: Vec<String> = self
            .ratios()
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v:.3}"))
            .collect();
        let concurrent: Vec<String> = self
            .concurrent
            .iter()
            .map(|c| {
                format!(
                    "{{\"readers\":{},\"writer\":{},\"lookups_per_sec\":{:.0}}}",
                    c.readers, c.writer, c.lookups_per_sec
                )
            })
            .collect();
        let m = self.memory;
        format!(
            "{{\"tail_of_method\":[{}],\"random_ip\":[{}],\"random_method\":[{}],\"many_heaps\":[{}],\"ratios\":{{{}}},\"memory\":{{\"span\":{},\"code\":{},\"map_reserved\":{},\"map_resident\":{}}},\"concurrent\":[{}]}}",
            tail.join(","),
            list(&self.random),
            list(&self.random_method),
            many.join(","),
            ratios.join(","),
            m.span,
            m.code,
            m.map_reserved,
            m.map_resident,
            concurrent.join(",")
        )
    }

    /// Writes an SVG of lookup ns against method size, log-log, one line per
    /// structure.
    pub fn plot(&self, path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
        use plotters::prelude::*;
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let max_ns = self.tail.iter().map(|r| r.2).fold(1.0, f64::max) * 2.0;
        let mut chart = ChartBuilder::on(&root)
            .caption("Lookup at the last byte of one method", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (32f64..(128u64 << 20) as f64).log_scale(),
                (0.5f64..max_ns).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("method size (bytes)")
            .y_desc("median ns per lookup")
            .x_label_formatter(&|x| decimal_label(*x))
            .draw()?;
        let colors = [
            RGBColor(128, 128, 128),
            RED,
            BLUE,
            RGBColor(0, 160, 160),
            GREEN,
            MAGENTA,
            BLACK,
        ];
        for (&s, color) in Structure::ALL.iter().zip(colors) {
            let points: Vec<(f64, f64)> = TAIL_SIZES
                .iter()
                .map(|&size| (size as f64, self.tail_ns(s, size)))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(s.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Concurrent, Memory, Report, TAIL_SIZES};
    use crate::fixture::Structure;

    /// A report with known figures: tail ns = (structure index + 1) × (size
    /// index + 1); random ns = structure index + 1 (twice that for
    /// `random_method`).
    fn synthetic() -> Report {
        let mut r = Report::default();
        for (k, &size) in TAIL_SIZES.iter().enumerate() {
            for (j, &s) in Structure::ALL.iter().enumerate() {
                r.tail.push((s, size, ((j + 1) * (k + 1)) as f64));
            }
        }
        for (j, &s) in Structure::ALL.iter().enumerate() {
            r.random.push((s, (j + 1) as f64));
            r.random_method.push((s, 2.0 * (j + 1) as f64));
        }
        r.many_heaps = vec![
            ("floor", 1.0),
            ("btree_ranges", 3.0),
            ("range_map", 2.0),
            ("manager", 4.0),
        ];
        r.memory = Memory {
            span: 1 << 20,
            code: 1 << 19,
            map_reserved: 48 << 10,
            map_resident: 24 << 10,
        };
        for (readers, writer, rate) in [
            (1, false, 100.0),
            (2, false, 190.0),
            (1, true, 95.0),
            (2, true, 180.0),
        ] {
            r.concurrent.push(Concurrent {
                readers,
                writer,
                lookups_per_sec: rate,
            });
        }
        r
    }

    /// The JSON a run prints (quick or not: the keys come from the rows, not
    /// from the timing) has every section the issue names, and each ratio is
    /// the quotient of the rows it names.
    #[test]
    fn json_holds_every_section_and_each_ratio_is_its_rows_quotient() {
        // `scale`'s test reads the process's allocator figures: this crate's
        // unit tests take turns.
        let _turn = crate::scale::measuring();
        let json: serde_json::Value = serde_json::from_str(&synthetic().json()).unwrap();
        let sections: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected = vec![
            "concurrent",
            "many_heaps",
            "memory",
            "random_ip",
            "random_method",
            "ratios",
            "tail_of_method",
        ];
        let mut sorted = sections.clone();
        sorted.sort_unstable();
        expected.sort_unstable();
        assert_eq!(sorted, expected);
        let ratios = json["ratios"].as_object().unwrap();
        // 8 sizes × 6 structures over the floor, v2 at 64 MiB over 64 B, two
        // random sections × (6 over the floor + 3 over heap), 3 many-heaps rows
        // over the floor and one over the range map, 8 kept from earlier runs,
        // 3 concurrency ratios.
        assert_eq!(ratios.len(), 48 + 1 + 18 + 4 + 8 + 3);
        let ratio = |k: &str| ratios[k].as_f64().unwrap_or_else(|| panic!("no ratio {k}"));
        assert_eq!(ratio("tail_of_method/64B/heap/floor"), 4.0);
        assert_eq!(ratio("tail_of_method/64MiB/manager/floor"), 5.0);
        assert_eq!(ratio("tail_of_method/v2@64MiB/v2@64B"), 8.0);
        assert_eq!(ratio("random_ip/sorted_vec/heap"), 1.75);
        assert_eq!(ratio("random_method/btree_rwlock/heap"), 1.5);
        assert_eq!(ratio("random_method/manager/heap"), 1.25);
        assert_eq!(ratio("random_ip/heap/floor"), 4.0);
        assert_eq!(ratio("many_heaps/manager/floor"), 4.0);
        assert_eq!(ratio("many_heaps/btree_ranges/range_map"), 1.5);
        assert_eq!(ratio("concurrent_2r/1r"), 1.9);
        assert_eq!(ratio("concurrent_1r_churn/1r"), 0.95);
        let floor_rows: Vec<&str> = json["random_method"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["structure"].as_str().unwrap())
            .collect();
        assert_eq!(
            floor_rows,
            [
                "floor",
                "v2",
                "v1",
                "heap",
                "manager",
                "btree_rwlock",
                "sorted_vec"
            ]
        );
        assert_eq!(json["tail_of_method"].as_array().unwrap().len(), 8 * 7);
        assert_eq!(json["memory"]["map_resident"], 24 << 10);
    }
}
