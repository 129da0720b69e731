//! `compare`: every structure measured side by side in one process, so ratios are
//! taken under the same machine conditions. Medians of repeated timed batches.

use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jitmap::ExecutionManager;
use jitmap::heap::JitKind;

use crate::fixture::{BoxError, Fixture, Structure, realistic_sizes};
use crate::rng::Rng;

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

/// Everything one run measured.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// `(structure, method size, median ns)` for a lookup of a method's last byte.
    pub tail: Vec<(Structure, u64, f64)>,
    /// `(structure, median ns)` for uniformly random addresses in 100k methods.
    pub random: Vec<(Structure, f64)>,
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
    /// Map bytes reserved (span / 64).
    pub map_reserved: u64,
    /// Map bytes resident.
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

/// Median ns per call of `f`, over timed batches of a calibrated length.
fn measure(quick: bool, mut f: impl FnMut(usize)) -> f64 {
    let (target, samples) = if quick {
        (Duration::from_millis(2), 7)
    } else {
        (Duration::from_millis(10), 21)
    };
    let mut batch = |iters: usize| {
        let t = Instant::now();
        for i in 0..iters {
            f(i);
        }
        t.elapsed()
    };
    let mut iters = 1;
    while batch(iters) < target && iters < 1 << 30 {
        iters *= 2;
    }
    median(
        (0..samples)
            .map(|_| batch(iters).as_nanos() as f64 / iters as f64)
            .collect(),
    )
}

/// Runs every measurement. `quick` shortens batches and the concurrency runs.
pub fn run(quick: bool) -> Result<Report, BoxError> {
    let mut report = Report::default();
    for &size in &TAIL_SIZES {
        let manager = ExecutionManager::new(4);
        let fixture = Fixture::new(&manager, &[size])?;
        let reader = manager.register()?;
        let guard = reader.pin()?;
        let (start, _) = fixture.blocks()[0];
        let tail = start + size as usize - 1;
        for s in Structure::ALL {
            if fixture.lookup(s, &guard, tail) != Some(start) {
                return Err(format!("{} does not find the method at {tail:#x}", s.name()).into());
            }
            let ns = measure(quick, |_| {
                black_box(fixture.lookup(s, &guard, black_box(tail)));
            });
            report.tail.push((s, size, ns));
        }
    }

    let manager = ExecutionManager::new(4);
    let fixture = Fixture::new(&manager, &realistic_sizes(RANDOM_METHODS, 17))?;
    let addresses = fixture.random_addresses(&mut Rng::new(23), 1 << 16);
    {
        let reader = manager.register()?;
        let guard = reader.pin()?;
        for s in Structure::ALL {
            let ns = measure(quick, |i| {
                black_box(fixture.lookup(s, &guard, addresses[i & 0xFFFF]));
            });
            report.random.push((s, ns));
        }
    }
    let span = fixture.heap().span();
    report.memory = Memory {
        span,
        code: fixture.blocks().iter().map(|b| b.1).sum(),
        map_reserved: span / 64,
        map_resident: fixture.map_resident_bytes().unwrap_or(0) as u64,
    };
    let duration = Duration::from_millis(if quick { 400 } else { 2000 });
    for (readers, writer) in [(1, false), (2, false), (1, true), (2, true)] {
        report.concurrent.push(Concurrent {
            readers,
            writer,
            lookups_per_sec: throughput(&fixture, &addresses, readers, writer, duration),
        });
    }
    Ok(report)
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
                let Ok(reader) = fixture.manager().register() else {
                    return;
                };
                let mut i = r * 7919;
                let mut count = 0u64;
                // Relaxed: a stop flag; no data rides on it.
                while !stop.load(Ordering::Relaxed) {
                    let Ok(guard) = reader.pin() else { return };
                    for _ in 0..256 {
                        i = (i + 1) & (addresses.len() - 1);
                        black_box(fixture.lookup(Structure::Manager, &guard, addresses[i]));
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

    fn tail_ns(&self, s: Structure, size: u64) -> f64 {
        self.tail
            .iter()
            .find(|r| r.0 == s && r.1 == size)
            .map_or(f64::NAN, |r| r.2)
    }

    fn throughput(&self, readers: usize, writer: bool) -> f64 {
        self.concurrent
            .iter()
            .find(|c| c.readers == readers && c.writer == writer)
            .map_or(f64::NAN, |c| c.lookups_per_sec)
    }

    /// The ratios users compare by, named as in the JSON output.
    pub fn ratios(&self) -> Vec<(String, f64)> {
        let v2 = self.random_ns(Structure::V2);
        let mut out: Vec<(String, f64)> = [
            Structure::V1,
            Structure::BTreeRwLock,
            Structure::SortedVec,
            Structure::Manager,
        ]
        .iter()
        .map(|&s| (format!("{}/v2", s.name()), self.random_ns(s) / v2))
        .collect();
        for size in [1 << 10, 64 << 10, 1 << 20] {
            let r = self.tail_ns(Structure::V1, size) / self.tail_ns(Structure::V2, size);
            out.push((
                format!("v1/v2@tail_{}", size_label(size).replace(' ', "")),
                r,
            ));
        }
        let flat = self.tail_ns(Structure::V2, 64 << 20) / self.tail_ns(Structure::V2, 64);
        out.push(("v2_tail_64MiB/64B".into(), flat));
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

    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let names: Vec<&str> = Structure::ALL.iter().map(|s| s.name()).collect();
        let _ = writeln!(
            t,
            "tail_of_method: median ns per lookup of a method's last byte"
        );
        let _ = writeln!(
            t,
            "{:>8} {}",
            "size",
            names.iter().map(|n| format!("{n:>13}")).collect::<String>()
        );
        for &size in &TAIL_SIZES {
            let row: String = Structure::ALL
                .iter()
                .map(|&s| format!("{:>13.2}", self.tail_ns(s, size)))
                .collect();
            let _ = writeln!(t, "{:>8} {row}", size_label(size));
        }
        let _ = writeln!(
            t,
            "\nrandom_ip: {RANDOM_METHODS} methods, uniformly random code addresses, median ns per lookup"
        );
        for &s in &Structure::ALL {
            let _ = writeln!(t, "{:>13} {:>8.2}", s.name(), self.random_ns(s));
        }
        let _ = writeln!(t, "\nratios");
        for (name, r) in self.ratios() {
            let _ = writeln!(t, "{name:>24} {r:>8.2}");
        }
        let m = self.memory;
        let _ = writeln!(
            t,
            "\nmap memory: span {} MiB, code {:.1} MiB, map reserved {} bytes (span/64), resident {} bytes = {:.0} bytes per MiB of code",
            m.span >> 20,
            m.code as f64 / (1 << 20) as f64,
            m.map_reserved,
            m.map_resident,
            m.map_resident as f64 / (m.code as f64 / (1 << 20) as f64)
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

    /// One JSON object: `tail_of_method`, `random_ip`, `ratios`, `memory`, `concurrent`.
    pub fn json(&self) -> String {
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
        let random: Vec<String> = self
            .random
            .iter()
            .map(|(s, ns)| format!("{{\"structure\":\"{}\",\"ns\":{ns:.3}}}", s.name()))
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
            "{{\"tail_of_method\":[{}],\"random_ip\":[{}],\"ratios\":{{{}}},\"memory\":{{\"span\":{},\"code\":{},\"map_reserved\":{},\"map_resident\":{}}},\"concurrent\":[{}]}}",
            tail.join(","),
            random.join(","),
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
        let colors = [RED, BLUE, GREEN, MAGENTA, BLACK];
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
