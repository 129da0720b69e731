//! `ebpf-profile`: a profiler for a jitmap host that runs outside it. An eBPF
//! program on every CPU's cpu-clock tick takes the host's user stack and
//! resolves each frame in the kernel through the host's descriptor
//! (`docs/descriptor.md`), in a bounded number of reads; user space names the
//! native frames and writes the agent's outputs (report, folded stacks,
//! flamegraph, pprof).
//!
//! Built only with the `ebpf` feature (the program is compiled with clang).
//! Loading it needs root, or `CAP_BPF` and `CAP_PERFMON`; reading the host's
//! descriptor needs ptrace permission.
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use std::time::Duration;
//! use jitmap_cli::ebpf::{self, Options};
//!
//! let options = Options {
//!     pid: 1234,
//!     hz: 1000,
//!     duration: Duration::from_secs(5),
//!     samples: None,
//!     native_rows: Some(ebpf::native::DEFAULT_ROWS_CAP),
//!     dotnet: true,
//! };
//! let run = ebpf::run(&options, &AtomicBool::new(false), &mut || {})?;
//! print!("{}", run.report(10));
//! # Ok::<(), jitmap_cli::ebpf::EbpfError>(())
//! ```

pub mod aggregate;
pub mod event;
pub mod native;
pub mod program;

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use jitmap::agent::Profile;
use jitmap::remote::dotnet::names::MethodNames;
use jitmap::remote::dotnet::{self, Runtime};
use jitmap::remote::{self, Descriptor, ProcessMemory, RemoteError, RemoteReader};

use aggregate::{Aggregator, Counts, DotnetPlacement, Placement};
use event::{DecodeError, Identity, Sample};
use program::{Config, KernelStats, Loaded, RunTime};

/// What to profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// The host's process id.
    pub pid: i32,
    /// Samples per second of CPU time, per CPU (1 to 100,000).
    pub hz: u32,
    /// How long to profile (up to an hour); sooner if the host exits.
    pub duration: Duration,
    /// Stop once this many samples have arrived (within `duration`): a
    /// profile that needs a number of samples gets them however busy the
    /// machine is.
    pub samples: Option<u64>,
    /// Step native frames by their objects' `.eh_frame` rows, loaded into
    /// the kernel for every object the host maps, at most this many rows
    /// (16 bytes each); `None`: by the frame pointer only.
    pub native_rows: Option<u32>,
    /// Resolve a CoreCLR's managed frames through its own code maps (when
    /// the process runs one); `false`: they step as native code.
    pub dotnet: bool,
}

/// Why a profile could not be taken. Every one is a bad input or a missing
/// privilege: `jitmap profile` exits with status 2.
#[derive(Debug)]
pub enum EbpfError {
    /// An option is out of range.
    Options(String),
    /// No process has this id.
    NoProcess(i32),
    /// The process links no jitmap (no descriptor) and runs no CoreCLR, or
    /// its descriptor is not one this reader knows.
    NotAHost {
        /// The process.
        pid: i32,
        /// What the reader found.
        reason: RemoteError,
    },
    /// A privilege is missing: reading the host's memory (ptrace), or loading
    /// and attaching BPF programs (root, or CAP_BPF and CAP_PERFMON).
    Privileges(String),
    /// The host's memory could not be read for another reason.
    Unreadable(RemoteError),
    /// The descriptor's layout does not fit the program's fixed buffers.
    Layout(&'static str),
    /// The kernel refused the program or an attachment for another reason.
    Bpf(String),
    /// The program sent a record this side cannot decode.
    Decode(DecodeError),
    /// Writing the outputs failed.
    Io(std::io::Error),
    /// The overhead measurement could not build its demo host.
    Demo(jitmap_demo::demo::DemoError),
}

impl fmt::Display for EbpfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Options(what) => write!(f, "{what}"),
            Self::NoProcess(pid) => write!(f, "no process {pid}"),
            Self::NotAHost { pid, reason } => {
                write!(
                    f,
                    "process {pid} is neither a jitmap host nor a .NET process: {reason}"
                )
            }
            Self::Privileges(what) => write!(f, "missing privileges: {what}"),
            Self::Unreadable(e) => write!(f, "cannot read the host: {e}"),
            Self::Layout(what) => write!(
                f,
                "the host's descriptor has a layout the eBPF program cannot read: {what}"
            ),
            Self::Bpf(what) => write!(f, "BPF: {what}"),
            Self::Decode(e) => write!(f, "a sample from the kernel: {e}"),
            Self::Io(e) => write!(f, "writing the outputs: {e}"),
            Self::Demo(e) => write!(f, "the demo host: {e}"),
        }
    }
}

impl std::error::Error for EbpfError {}

impl From<DecodeError> for EbpfError {
    fn from(e: DecodeError) -> Self {
        Self::Decode(e)
    }
}

impl From<jitmap_demo::demo::DemoError> for EbpfError {
    fn from(e: jitmap_demo::demo::DemoError) -> Self {
        Self::Demo(e)
    }
}

impl From<std::io::Error> for EbpfError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// The first OS error number in `e`'s chain of sources.
fn errno_in(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(code) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
        {
            return Some(code);
        }
        next = e.source();
    }
    None
}

impl EbpfError {
    /// A BPF failure while `doing`: a missing privilege if the kernel said
    /// EPERM or EACCES, else the kernel's error (the verifier's log included).
    fn bpf(doing: &str, e: &(dyn std::error::Error + 'static)) -> Self {
        match errno_in(e) {
            Some(libc::EPERM | libc::EACCES) => Self::Privileges(format!(
                "{doing}: {e} (loading and attaching BPF programs needs root, \
                 or CAP_BPF and CAP_PERFMON)"
            )),
            _ => {
                let mut what = format!("{doing}: {e}");
                let mut source = e.source();
                while let Some(s) = source {
                    what.push_str(&format!(": {s}"));
                    source = s.source();
                }
                Self::Bpf(what)
            }
        }
    }

    /// A failure to find or read the host's descriptor.
    fn remote(pid: i32, e: RemoteError) -> Self {
        match e {
            RemoteError::Proc {
                errno: libc::ENOENT | libc::ESRCH,
                ..
            }
            | RemoteError::Unreadable {
                errno: libc::ESRCH, ..
            } => Self::NoProcess(pid),
            RemoteError::Unreadable {
                errno: libc::EPERM | libc::EACCES,
                ..
            }
            | RemoteError::Proc {
                errno: libc::EPERM | libc::EACCES,
                ..
            } => Self::Privileges(crate::inspect::unreadable(pid, &e)),
            RemoteError::SymbolNotFound { .. }
            | RemoteError::DescriptorNotFound { .. }
            | RemoteError::BadDescriptor { .. } => Self::NotAHost { pid, reason: e },
            other => Self::Unreadable(other),
        }
    }
}

/// What the profiler found of .NET in the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DotnetStatus {
    /// No CoreCLR in the process.
    Absent,
    /// CoreCLR of a version whose layout is known: its frames are resolved.
    On(Runtime),
    /// CoreCLR found, its frames not resolved as asked (`Options::dotnet`).
    Off {
        /// The version found.
        version: String,
    },
    /// CoreCLR found but not read (its memory or its maps could not be
    /// read: a runtime not started, a missing privilege; or its layout
    /// does not fit the program): its frames are not resolved. With jitmap
    /// in the process the rest of the profile is taken; without, the
    /// profile is refused with the reason.
    Unreadable {
        /// Why.
        reason: String,
    },
    /// CoreCLR of a version whose layout is not known: its frames are not
    /// resolved (they step as native code), the rest of the profile is.
    Refused {
        /// The version found.
        version: String,
    },
}

impl fmt::Display for DotnetStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Absent => write!(f, "no CoreCLR in the process"),
            Self::Unreadable { reason } => write!(
                f,
                "CoreCLR found but not read ({reason}): its managed frames are not resolved"
            ),
            Self::Off { version } => write!(
                f,
                "CoreCLR {version}: its managed frames are not resolved (--dotnet off)"
            ),
            Self::On(r) => write!(
                f,
                "CoreCLR {} (layout {}x): managed frames resolved by its range map and \
                 nibble maps",
                r.version, r.layout.versions
            ),
            Self::Refused { version } => write!(
                f,
                "CoreCLR {version} is not a version this profiler knows the layout of \
                 (known: {}): its managed frames are not resolved",
                dotnet::layout::LAYOUTS
                    .iter()
                    .map(|l| format!("{}x", l.versions))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// A finished eBPF profile.
#[derive(Debug)]
pub struct EbpfRun {
    /// The host.
    pub pid: i32,
    /// The sampling rate asked for.
    pub hz: u32,
    /// The profile in the agent's form.
    pub profile: Profile,
    /// The JIT method placements the samples named.
    pub placements: Vec<Placement>,
    /// Counts over the decoded samples.
    pub counts: Counts,
    /// The program's own counters.
    pub kernel: KernelStats,
    /// The kernel's accounting of the program (every process's ticks).
    pub run_time: RunTime,
    /// Whether the host exited before the duration was up.
    pub host_exited: bool,
    /// Whether the caller stopped the profile before the duration was up.
    pub stopped: bool,
    /// Whether the profile ended because `Options::samples` had arrived.
    pub reached_samples: bool,
    /// Wall time before sampling began: finding the target, loading and
    /// verifying the program, loading the native rows.
    pub setup: Duration,
    /// Wall time after sampling ended: the last samples drained, native
    /// frames and .NET methods named, the stacks built.
    pub settle: Duration,
    /// The native rows loaded for the kernel's walk, if it used them.
    pub native: Option<native::NativeStats>,
    /// What was found of .NET.
    pub dotnet: DotnetStatus,
    /// The CoreCLR methods the samples named.
    pub dotnet_placements: Vec<DotnetPlacement>,
}

/// What [`configure`] found: the program's configuration, the .NET
/// runtime's status, and the jitmap host's descriptor reader.
type Configured = (Config, DotnetStatus, Option<RemoteReader<ProcessMemory>>);

/// Checks the options, finds the host's descriptor or its CoreCLR (or
/// both), and builds the program's configuration.
/// The host's descriptor reader comes back too (none for a .NET process
/// without jitmap): the profile reads its stub kinds' names through it.
fn configure(options: &Options) -> Result<Configured, EbpfError> {
    if !(1..=100_000).contains(&options.hz) {
        return Err(EbpfError::Options(format!(
            "--hz must be in 1..=100000, not {}",
            options.hz
        )));
    }
    if options.duration.is_zero() || options.duration > Duration::from_secs(3600) {
        return Err(EbpfError::Options("--seconds must be in (0, 3600]".into()));
    }
    let pid = options.pid;
    if pid <= 0 || !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(EbpfError::NoProcess(pid));
    }
    let memory = ProcessMemory::new(pid);
    let found = test_version(dotnet::find_runtime(pid, &memory));
    let dotnet = match &found {
        Ok(Runtime { version, .. }) | Err(RemoteError::UnsupportedRuntime { version })
            if !options.dotnet =>
        {
            DotnetStatus::Off {
                version: version.clone(),
            }
        }
        // Not asked for: whatever else was found of a runtime is not read.
        Err(_) if !options.dotnet => DotnetStatus::Absent,
        Ok(runtime) => DotnetStatus::On(runtime.clone()),
        Err(RemoteError::UnsupportedRuntime { version }) => DotnetStatus::Refused {
            version: version.clone(),
        },
        // No libcoreclr.so mapped (or it exports no g_dacTable).
        Err(RemoteError::SymbolNotFound { .. }) => DotnetStatus::Absent,
        Err(e) => DotnetStatus::Unreadable {
            reason: e.to_string(),
        },
    };
    let (config, reader) = match remote::process::find_descriptor(pid) {
        Ok(descriptor) => {
            let reader =
                RemoteReader::new(memory, descriptor).map_err(|e| EbpfError::remote(pid, e))?;
            let managers = descriptor + std::mem::offset_of!(Descriptor, managers) as u64;
            let frameless = descriptor + std::mem::offset_of!(Descriptor, frameless) as u64;
            let config = Config::new(pid as u32, managers, frameless, reader.layout())?;
            (config, Some(reader))
        }
        // Neither jitmap nor a CoreCLR that could be read: the reason the
        // runtime could not be read, when it is there (a missing privilege,
        // say), else the descriptor's.
        Err(e) if dotnet == DotnetStatus::Absent => return Err(EbpfError::remote(pid, e)),
        Err(e) if matches!(dotnet, DotnetStatus::Unreadable { .. }) => {
            return Err(EbpfError::remote(pid, found.err().unwrap_or(e)));
        }
        // A .NET process without jitmap: its managed frames are the ones
        // to resolve (a version refused, or --dotnet off, is said in the
        // report).
        Err(RemoteError::SymbolNotFound { .. } | RemoteError::DescriptorNotFound { .. }) => {
            (Config::without_jitmap(pid as u32), None)
        }
        Err(e) => return Err(EbpfError::remote(pid, e)),
    };
    // A layout the program's buffers cannot hold refuses the .NET frames,
    // not the profile.
    let (config, dotnet) = match dotnet {
        DotnetStatus::On(runtime) => {
            match config.with_dotnet(runtime.code_range_map, runtime.layout) {
                Ok(with) => (with, DotnetStatus::On(runtime)),
                Err(e) => (
                    config,
                    DotnetStatus::Unreadable {
                        reason: e.to_string(),
                    },
                ),
            }
        }
        other => (config, other),
    };
    Ok((config, dotnet, reader))
}

/// A test seam, in debug builds only: `JITMAP_TEST_CORECLR_VERSION` stands
/// for the version string of the runtime found, so that the refusal of an
/// unknown version can be tested on the one runtime the tests have.
fn test_version(found: Result<Runtime, RemoteError>) -> Result<Runtime, RemoteError> {
    let seam = cfg!(debug_assertions)
        .then(|| std::env::var("JITMAP_TEST_CORECLR_VERSION").ok())
        .flatten();
    match (found, seam) {
        (Ok(runtime), Some(version)) => match dotnet::layout::layout_for(&version) {
            Some(layout) => Ok(Runtime {
                version,
                layout,
                ..runtime
            }),
            None => Err(RemoteError::UnsupportedRuntime { version }),
        },
        (found, _) => found,
    }
}

/// How often the runtime's range sections are read again: a placement,
/// module or stub list whose section went is closed at most this long
/// after.
const SECTIONS_EVERY: Duration = Duration::from_millis(250);

/// What the profile knows of a live CoreCLR: a namer for its methods, and
/// its range sections, read again every [`SECTIONS_EVERY`] so that names
/// read before a collectible assembly unloaded are not given to what
/// reuses its `MethodDesc`s and code.
struct DotnetNames {
    reader: dotnet::DotnetReader<ProcessMemory>,
    namer: MethodNames<ProcessMemory>,
    /// Each range section's address and bounds, in order.
    sections: Vec<(u64, u64, u64)>,
    read_at: Instant,
}

impl DotnetNames {
    fn new(pid: i32, runtime: &Runtime) -> Self {
        let mut names = Self {
            namer: MethodNames::new(pid, ProcessMemory::new(pid), runtime.layout),
            reader: dotnet::DotnetReader::new(ProcessMemory::new(pid), runtime),
            sections: Vec::new(),
            read_at: Instant::now(),
        };
        names.sections = names.read_sections().unwrap_or_default();
        names
    }

    /// The runtime's range sections (the `RangeSection`'s address, begin,
    /// end), in order: a heap reserved again at the same addresses has a
    /// new `RangeSection`.
    fn read_sections(&self) -> Option<Vec<(u64, u64, u64)>> {
        let sections = self.reader.sections().ok()?;
        let mut out: Vec<_> = sections
            .iter()
            .map(|s| (s.address, s.begin, s.end))
            .collect();
        out.sort_unstable();
        Some(out)
    }

    /// Names what the samples met that has no name yet. Every
    /// [`SECTIONS_EVERY`] the range sections are read first: when one went,
    /// the placements in it are closed and module and stub-list names
    /// start a new generation.
    fn name(&mut self, agg: &mut Aggregator) {
        if self.read_at.elapsed() >= SECTIONS_EVERY {
            self.read_at = Instant::now();
            if let Some(now) = self.read_sections() {
                let gone: Vec<(u64, u64, u64)> = self
                    .sections
                    .iter()
                    .filter(|s| now.binary_search(s).is_err())
                    .copied()
                    .collect();
                if !gone.is_empty() {
                    agg.close_dotnet(|start| gone.iter().any(|&(_, b, e)| b <= start && start < e));
                    agg.forget_modules();
                }
                self.sections = now;
            }
        }
        let aggregate::Unnamed {
            methods,
            modules,
            stub_lists,
        } = agg.take_unnamed();
        if methods.is_empty() && modules.is_empty() && stub_lists.is_empty() {
            return;
        }
        // What was read in an earlier pass may have been freed and reused
        // since (only the files' metadata is kept).
        self.namer.forget();
        let freed =
            |md: u64| format!("[.NET method {md:#x}: its code was freed before it was named]");
        for (i, md, start, identity) in methods {
            // The name is read now, the sample was taken before: it is the
            // sampled method's only if the runtime's maps still place that
            // MethodDesc at that start (the code was not freed and reused)
            // and, in a collectible assembly's code (where the next
            // assembly may reuse both addresses), the MethodDesc still has
            // the identity the program read while the method ran.
            let name = match self.reader.resolve(start) {
                Ok(dotnet::DotnetResolution::Method {
                    start: s,
                    method_desc,
                    ..
                }) if s == start && method_desc == md => match identity {
                    None => self
                        .namer
                        .name(md)
                        .map_or_else(|e| format!("[.NET method {md:#x}: {e}]"), |n| n.to_string()),
                    Some(Identity::Read(then)) => match self.namer.name_if(md, then) {
                        Ok(Some(name)) => name.to_string(),
                        Ok(None) => freed(md),
                        Err(e) => format!("[.NET method {md:#x}: {e}]"),
                    },
                    Some(Identity::Unreadable) => format!(
                        "[.NET method {md:#x}: its identity could not be read while it ran]"
                    ),
                },
                Ok(_) => freed(md),
                Err(e) => format!("[.NET method {md:#x}: not named: {e}]"),
            };
            agg.name_method(i, name);
        }
        for module in modules {
            if let Ok(name) = self.namer.assembly_name(module) {
                agg.name_module(module, name);
            }
        }
        for list in stub_lists {
            if let Ok(kind) = self.reader.range_list_kind(list) {
                agg.name_stub_list(list, u64::from(kind));
            }
        }
    }
}

/// Reads the names the host gave its stub kinds into `agg`, if the host
/// links jitmap. A failed read (the host exiting) keeps the names read
/// before.
fn name_stub_kinds(descriptor: Option<&RemoteReader<ProcessMemory>>, agg: &mut Aggregator) {
    if let Some(Ok(managers)) = descriptor.map(RemoteReader::stub_names) {
        agg.name_stub_kinds(&managers);
    }
}

/// Profiles the host for `options.duration`, or until it exits, or until
/// `stop` is set (a SIGINT handler may set it), or until `options.samples`
/// have arrived. `attached` is called once the program samples the host.
pub fn run(
    options: &Options,
    stop: &AtomicBool,
    attached: &mut dyn FnMut(),
) -> Result<EbpfRun, EbpfError> {
    let began = Instant::now();
    let (config, dotnet, descriptor) = configure(options)?;
    let config = config.with_native(options.native_rows.is_some());
    let mut namer = match &dotnet {
        DotnetStatus::On(runtime) => Some(DotnetNames::new(options.pid, runtime)),
        _ => None,
    };
    let mut loaded = Loaded::start(config, options.hz, options.native_rows.unwrap_or(0))?;
    attached();
    let setup = began.elapsed();
    let started = Instant::now();
    let deadline = started + options.duration;
    let mut agg = Aggregator::new();
    name_stub_kinds(descriptor.as_ref(), &mut agg);
    let decode = |agg: &mut Aggregator, loaded: &mut Loaded| -> Result<(), EbpfError> {
        let mut error = None;
        loaded.drain(|record| match Sample::decode(record) {
            Ok(sample) => agg.add(&sample),
            Err(e) => error = Some(e),
        });
        error.map_or(Ok(()), |e| Err(e.into()))
    };
    let alive = || host_alive(options.pid);
    // Native frames are named while the host lives (its mappings are read
    // from /proc), every quarter second, and once more at the end.
    let mut names = NativeNames::new(options.pid);
    let mut named_at = Instant::now();
    // The native rows follow the host's mappings (dlopen, dlclose) every
    // tenth of a second, and at the next pass after a walk met stale rows
    // (an object mapped that the tables do not hold yet); in between, the
    // kernel's check of each object's bytes keeps stale rows from being
    // used, and the candidates (objects unmapped since) are tried.
    let mut mapped_at = Instant::now();
    let mut stale_rows_seen = 0;
    let mut host_exited = false;
    let mut stopped = false;
    let mut reached_samples = false;
    while Instant::now() < deadline {
        // Relaxed: a flag; nothing else is published through it.
        if stop.load(Ordering::Relaxed) {
            stopped = true;
            break;
        }
        loaded.wait(Duration::from_millis(20).min(deadline - Instant::now()));
        decode(&mut agg, &mut loaded)?;
        // .NET methods are named on the spot: their code may be freed (a
        // dynamic method collected, an assembly unloaded) and reused.
        if let Some(namer) = &mut namer {
            namer.name(&mut agg);
        }
        if options
            .samples
            .is_some_and(|goal| agg.counts().samples >= goal)
        {
            reached_samples = true;
            break;
        }
        if !alive() {
            host_exited = true;
            break;
        }
        let stale_rows = agg.counts().stale_rows;
        if mapped_at.elapsed() >= Duration::from_millis(100) || stale_rows > stale_rows_seen {
            loaded.refresh_native();
            mapped_at = Instant::now();
            stale_rows_seen = stale_rows;
        }
        if named_at.elapsed() >= Duration::from_millis(250) {
            names.add(&agg.native_addresses());
            name_stub_kinds(descriptor.as_ref(), &mut agg);
            named_at = Instant::now();
        }
    }
    let duration = started.elapsed();
    let ended = Instant::now();
    loaded.detach()?;
    // A run of the program that began before the detach may still be
    // writing its sample after the first drain: drain until every sample the
    // kernel counted and sent has arrived, or for at most a second.
    let settled = Instant::now() + Duration::from_secs(1);
    let kernel = loop {
        decode(&mut agg, &mut loaded)?;
        let kernel = loaded.stats()?;
        let sent = kernel
            .samples
            .saturating_sub(kernel.unreadable + kernel.lost);
        let c = agg.counts();
        if c.samples + c.stale_samples + c.empty_samples >= sent || Instant::now() >= settled {
            break kernel;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let run_time = loaded.run_time()?;
    if !host_exited {
        names.add(&agg.native_addresses());
        name_stub_kinds(descriptor.as_ref(), &mut agg);
    }
    // What came in the last drains (if the process exited, each says it
    // could not be named).
    if let Some(namer) = &mut namer {
        namer.name(&mut agg);
    }
    let dotnet_placements = agg.dotnet_placements();
    let (stacks, placements, counts) = agg.finish(|addr, is_return| names.name(addr, is_return));
    Ok(EbpfRun {
        pid: options.pid,
        hz: options.hz,
        profile: aggregate::profile(stacks, &counts, duration),
        placements,
        counts,
        kernel,
        run_time,
        host_exited,
        stopped,
        reached_samples,
        setup,
        settle: ended.elapsed(),
        native: loaded.native().cloned(),
        dotnet,
        dotnet_placements,
    })
}

/// Whether process `pid` still runs: it exists and is not a zombie (a child
/// of someone who has not reaped it yet).
fn host_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // pid (comm) state ...: the comm may hold spaces and parentheses.
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| !matches!(state, 'Z' | 'X' | 'x'))
    })
}

/// Names of native addresses of one process, from its mapped files' debug
/// info where they have it, else their symbol tables (a return address is
/// named one byte back, in its call). A name is the frame's chain, innermost
/// first: the helpers inlined at the address, each marked
/// [`INLINED`](jitmap::agent::INLINED), then the function that ran; the
/// agent names native frames the same way.
struct NativeNames {
    pid: i32,
    symbolizer: blazesym::symbolize::Symbolizer,
    /// Every address asked about; `None` for one no symbol covers.
    names: std::collections::HashMap<(u64, bool), Option<Vec<String>>>,
    /// Each mapped file's executable segments (file offset, address, size)
    /// and named PLT entries, read when an address in it is first named.
    plt: std::collections::HashMap<String, Option<PltTable>>,
    /// Whether each mapped file is an ELF object.
    elf: std::collections::HashMap<String, bool>,
}

/// An object's executable segments (file offset, address in the object,
/// file size) and its named PLT entries.
type PltTable = (Vec<(u64, u64, u64)>, Vec<jitmap::unwind::PltStub>);

/// The PLT entries of the object at `path` in process `pid`, if it reads.
fn plt_table(pid: i32, path: &str) -> Option<PltTable> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    // Of a large object, only its headers, PLT and dynamic tables are read.
    let file = std::fs::File::open(format!("/proc/{pid}/root{path}"))
        .or_else(|_| std::fs::File::open(path))
        .ok()?;
    let data = object::ReadCache::new(file);
    let elf = ElfFile64::<object::LittleEndian, _>::parse(&data).ok()?;
    let endian = object::LittleEndian;
    let segments = elf
        .elf_program_headers()
        .iter()
        .filter(|p| {
            p.p_type(endian) == object::elf::PT_LOAD && p.p_flags(endian) & object::elf::PF_X != 0
        })
        .map(|p| (p.p_offset(endian), p.p_vaddr(endian), p.p_filesz(endian)))
        .collect();
    Some((segments, jitmap::unwind::plt_stubs(&data)))
}

impl NativeNames {
    fn new(pid: i32) -> Self {
        Self {
            pid,
            // Inlined functions come from DWARF's line and inlining records.
            symbolizer: blazesym::symbolize::Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .build(),
            names: Default::default(),
            plt: Default::default(),
            elf: Default::default(),
        }
    }

    /// The PLT entry `addr` is in (`puts@plt`), by the process's mappings
    /// and its objects' files: no symbol covers a PLT entry.
    fn plt_name(&mut self, maps: &[jitmap::remote::process::Mapping], addr: u64) -> Option<String> {
        let m = maps.iter().find(|m| m.start <= addr && addr < m.end)?;
        let pid = self.pid;
        let (segments, stubs) = self
            .plt
            .entry(m.path.clone())
            .or_insert_with(|| plt_table(pid, &m.path))
            .as_ref()?;
        let offset = addr - m.start + m.offset;
        let &(off, vaddr, _) = segments
            .iter()
            .find(|&&(off, _, size)| off <= offset && offset < off + size)?;
        let stub = jitmap::unwind::plt_stub_at(stubs, offset - off + vaddr)?;
        Some(stub.name.clone())
    }

    /// Whether `addr` is in a mapping of an ELF file (or the vDSO), by its
    /// first bytes, read once per file.
    fn in_elf(&mut self, maps: &[jitmap::remote::process::Mapping], addr: u64) -> bool {
        use std::io::Read;
        let Some(m) = maps.iter().find(|m| m.start <= addr && addr < m.end) else {
            return false;
        };
        if m.path == "[vdso]" {
            return true;
        }
        let pid = self.pid;
        // The very file mapped (`map_files`: also one deleted or replaced
        // since), else its path in the process's root.
        *self.elf.entry(m.path.clone()).or_insert_with(|| {
            let mut magic = [0u8; 4];
            std::fs::File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
                .or_else(|_| std::fs::File::open(format!("/proc/{pid}/root{}", m.path)))
                .and_then(|mut f| f.read_exact(&mut magic))
                .is_ok_and(|()| &magic == b"\x7fELF")
        })
    }

    /// Names the addresses not asked about yet. If the process is gone, they
    /// stay unnamed (shown in hex).
    fn add(&mut self, addrs: &[(u64, bool)]) {
        use blazesym::symbolize::source::{Process, Source};
        use blazesym::symbolize::{Input, Symbolized};
        let new: Vec<(u64, bool)> = addrs
            .iter()
            .filter(|k| !self.names.contains_key(k))
            .copied()
            .collect();
        if new.is_empty() {
            return;
        }
        let at = |&(a, is_return): &(u64, bool)| if is_return { a.saturating_sub(1) } else { a };
        // PLT entries first: the symbolizer would give them no name, or the
        // function before them.
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid))
            .map(|text| jitmap::remote::process::parse_executable_maps(&text))
            .unwrap_or_default();
        let mut new = new;
        new.retain(|key| match self.plt_name(&maps, at(key)) {
            Some(name) => {
                self.names.insert(*key, Some(vec![name]));
                false
            }
            None => true,
        });
        // Only addresses in ELF objects go to the symbolizer: one in a
        // file of another kind (a .NET assembly, the runtime's
        // `memfd:doublemapper` code) fails its whole batch.
        new.retain(|key| {
            let elf = self.in_elf(&maps, at(key));
            if !elf {
                self.names.insert(*key, None);
            }
            elf
        });
        if new.is_empty() {
            return;
        }
        let lookups: Vec<u64> = new.iter().map(at).collect();
        let mut process = Process::new(blazesym::Pid::from(self.pid as u32));
        // JIT frames are named by the kernel; native code by its files.
        process.debug_syms = true;
        process.perf_map = false;
        let source = Source::Process(process);
        // One address the symbolizer cannot take (in a mapping of a file
        // that is no ELF object: a .NET assembly, the runtime's
        // `memfd:doublemapper` code) fails the whole batch: then each is
        // asked alone, and only those fail.
        let symbols = match self.symbolizer.symbolize(&source, Input::AbsAddr(&lookups)) {
            Ok(symbols) => symbols,
            Err(_) => lookups
                .iter()
                .map(|&a| {
                    self.symbolizer
                        .symbolize_single(&source, Input::AbsAddr(a))
                        .unwrap_or(Symbolized::Unknown(
                            blazesym::symbolize::Reason::Unsupported,
                        ))
                })
                .collect(),
        };
        for (key, symbol) in new.into_iter().zip(symbols) {
            let name = match symbol {
                Symbolized::Sym(sym) => Some(chain(&sym)),
                Symbolized::Unknown(_) => None,
            };
            self.names.insert(key, name);
        }
    }

    /// The frames of a native address, innermost first, or the address in
    /// hex.
    fn name(&self, addr: u64, is_return: bool) -> Vec<String> {
        match self.names.get(&(addr, is_return)) {
            Some(Some(chain)) => chain.clone(),
            _ => vec![format!("{addr:#x}")],
        }
    }
}

/// A symbol's frames, innermost first: blazesym lists the inlined calls
/// outermost first, after the function that holds them.
fn chain(sym: &blazesym::symbolize::Sym<'_>) -> Vec<String> {
    sym.inlined
        .iter()
        .rev()
        .map(|f| format!("{}{}", f.name, jitmap::agent::INLINED))
        .chain(std::iter::once(sym.name.to_string()))
        .collect()
}

impl EbpfRun {
    /// Mean reads per frame lookup, and per lookup of a frame in a JIT section.
    pub fn mean_reads(&self) -> (f64, f64) {
        let per = |reads: u64, n: u64| reads as f64 / n.max(1) as f64;
        (
            per(self.counts.reads, self.counts.frames()),
            per(self.counts.jit_reads, self.counts.jit_frames()),
        )
    }

    /// Mean ns in the program per sample of the host (its own clock).
    pub fn ns_per_sample(&self) -> f64 {
        self.kernel.cost_ns as f64 / self.kernel.samples.max(1) as f64
    }

    /// The text report: the eBPF counters, then the agent's tables.
    pub fn report(&self, top: usize) -> String {
        let (c, k, p) = (&self.counts, &self.kernel, &self.profile);
        let (mean, jit_mean) = self.mean_reads();
        let mut out = format!(
            "jitmap profile of process {} at {} Hz for {:.2} s{} \
             (and {:.2} s before: the program loaded and verified, the native rows read; \
             {:.2} s after: the last samples drained and named)\n\
             .NET: {}\n\
             samples: {} in the profile; {} stale (dropped), {} without a user stack, \
             {} lost (ring full), {} unattributed; {} in a frameless native leaf \
             whose JIT caller the kernel's walk skipped\n\
             walks: {} from the sample's registers, {} frames stepped by their method's \
             unwind rows, {} native frames by their object's rows; {} walks ended at an \
             object whose rows were stale, {} at a frame without a rule they can apply, \
             {} stepped by the frame pointer through code in no object with rows, \
             {} samples dropped as the rows changed\n\
             {}\
             frames: {} ({} native, {} methods, {} stubs, {} images, {} in no block, \
             {} too far, {} stale, {} unreadable)\n\
             reads per frame: mean {:.2}, max {}; in a JIT section: mean {:.2}, max {}\n\
             kernel: {:.0} ns per sample (max {} ns) by the program's clock; \
             {} runs, {:.0} ns per run by bpf_prog_info (every process's ticks); \
             the verifier processed {} instructions\n",
            self.pid,
            self.hz,
            p.duration.as_secs_f64(),
            match (self.host_exited, self.stopped, self.reached_samples) {
                (true, _, _) => " (the host exited)",
                (_, true, _) => " (stopped)",
                (_, _, true) => " (the samples asked for arrived)",
                _ => "",
            },
            self.setup.as_secs_f64(),
            self.settle.as_secs_f64(),
            self.dotnet,
            c.samples,
            c.stale_samples,
            c.empty_samples,
            k.lost,
            c.unattributed,
            c.frameless_leaf,
            k.walked,
            k.cfi_frames,
            k.native_frames,
            k.native_stale,
            c.no_rule,
            c.unknown_code,
            k.native_busy,
            self.native_line(),
            c.frames(),
            c.native,
            c.methods,
            c.stubs,
            c.images,
            c.nothing,
            c.too_far,
            c.stale,
            c.errors,
            mean,
            c.max_reads,
            jit_mean,
            c.max_jit_reads,
            self.ns_per_sample(),
            k.max_cost_ns,
            self.run_time.runs,
            self.run_time.ns as f64 / self.run_time.runs.max(1) as f64,
            self.run_time
                .verified_insns
                .map_or_else(|| "an unknown number of".to_owned(), |n| n.to_string()),
        );
        out.push_str(&p.top_tables(top));
        out
    }

    /// The report's line on the native rows.
    fn native_line(&self) -> String {
        let Some(n) = &self.native else {
            return "native rows: off (native frames step by the frame pointer)\n".to_owned();
        };
        let mut line = format!(
            "native rows: {} objects, {} ranges, {} rows, {:.1} MiB of a {:.1} MiB cap \
             (most: {}), loaded in {:.0} ms, {} refreshes; {} unmapped objects kept as \
             candidates ({} rows)",
            n.objects(),
            n.ranges,
            n.rows(),
            n.bytes() as f64 / 1048576.0,
            f64::from(n.cap) * 16.0 / 1048576.0,
            n.per_object
                .iter()
                .take(3)
                .map(|(p, r)| format!("{p} {r}"))
                .collect::<Vec<_>>()
                .join(", "),
            n.load_time.as_secs_f64() * 1000.0,
            n.refreshes,
            n.candidates,
            n.candidate_rows,
        );
        // One entry per file and reason (the runtime maps its JIT code in
        // many views of one file).
        let mut left_out: Vec<(&str, native::LeftOut, usize)> = Vec::new();
        for (path, why) in &n.left_out {
            match left_out.iter_mut().find(|(p, w, _)| p == path && w == why) {
                Some(entry) => entry.2 += 1,
                None => left_out.push((path, *why, 1)),
            }
        }
        for (path, why, count) in left_out {
            let times = if count > 1 {
                format!(" ({count} mappings)")
            } else {
                String::new()
            };
            line.push_str(&format!("; left out {path}{times}: {why:?}"));
        }
        line.push('\n');
        line
    }

    /// The run as one JSON object.
    pub fn json(&self) -> serde_json::Value {
        let (c, k) = (&self.counts, &self.kernel);
        let (mean, jit_mean) = self.mean_reads();
        let methods = jitmap_demo::output::methods_json(&self.profile);
        let placements: Vec<_> = self
            .placements
            .iter()
            .map(|p| {
                serde_json::json!({
                    "heap_id": p.heap_id,
                    "method_id": p.method_id,
                    "start": p.start,
                    "size": p.size,
                    "name": p.name,
                    "label": p.label,
                    "truncated": p.truncated,
                    "lowest": p.lookups.0,
                    "highest": p.lookups.1,
                    "frames": p.frames,
                })
            })
            .collect();
        let mut out = serde_json::json!({
            "pid": self.pid,
            "hz": self.hz,
            "seconds": self.profile.duration.as_secs_f64(),
            "host_exited": self.host_exited,
            "stopped": self.stopped,
            "reached_samples": self.reached_samples,
            "samples": c.samples,
            "stale_samples": c.stale_samples,
            "empty_samples": c.empty_samples,
            "lost": k.lost,
            "unattributed": c.unattributed,
            "frameless_leaf": c.frameless_leaf,
            "stale_rows": c.stale_rows,
            "no_rule": c.no_rule,
            "unknown_code": c.unknown_code,
            "native": self.native.as_ref().map(|n| serde_json::json!({
                "objects": n.objects(),
                "ranges": n.ranges,
                "rows": n.rows(),
                "bytes": n.bytes(),
                "cap_rows": n.cap,
                "per_object": n.per_object.iter().map(|(p, r)| serde_json::json!({"path": p, "rows": r, "bytes": r * 16})).collect::<Vec<_>>(),
                "left_out": n.left_out.iter().map(|(p, w)| format!("{p}: {w:?}")).collect::<Vec<_>>(),
                "candidates": n.candidates,
                "candidate_rows": n.candidate_rows,
                "refreshes": n.refreshes,
                "load_ms": n.load_time.as_secs_f64() * 1000.0,
            })),
            "frames": {
                "all": c.frames(), "native": c.native, "methods": c.methods,
                "stubs": c.stubs, "images": c.images, "nothing": c.nothing,
                "too_far": c.too_far, "stale": c.stale, "errors": c.errors,
            },
            "reads_per_frame": { "mean": mean, "max": c.max_reads },
            "reads_per_jit_frame": { "mean": jit_mean, "max": c.max_jit_reads },
            "kernel": {
                "samples": k.samples,
                "frames": k.frames,
                "reads": k.reads,
                "max_reads": k.max_reads,
                "jit_frames": k.jit_frames,
                "jit_reads": k.jit_reads,
                "stale_frames": k.stale,
                "stale_samples": k.stale_samples,
                "map_holes": k.holes,
                "unreadable_samples": k.unreadable,
                "walked_samples": k.walked,
                "cfi_frames": k.cfi_frames,
                "native_frames": k.native_frames,
                "native_stale": k.native_stale,
                "native_busy": k.native_busy,
                "native_unknown": k.native_unknown,
                "ns_per_sample": self.ns_per_sample(),
                "max_ns": k.max_cost_ns,
                "prog_runs": self.run_time.runs,
                "prog_ns": self.run_time.ns,
                "verified_insns": self.run_time.verified_insns,
            },
            "methods": methods,
            "placements": placements,
            "dotnet": {
                "status": self.dotnet.to_string(),
                "version": match &self.dotnet {
                    DotnetStatus::On(r) => Some(r.version.clone()),
                    DotnetStatus::Refused { version } | DotnetStatus::Off { version } => {
                        Some(version.clone())
                    }
                    DotnetStatus::Absent | DotnetStatus::Unreadable { .. } => None,
                },
                "methods": self.dotnet_placements.iter().map(|p| serde_json::json!({
                    "method_desc": p.method_desc,
                    "start": p.start,
                    "name": p.name,
                    "lowest": p.lookups.0,
                    "highest": p.lookups.1,
                    "frames": p.frames,
                })).collect::<Vec<_>>(),
            },
        });
        // Outside the macro, which would pass its recursion limit.
        out["setup_seconds"] = self.setup.as_secs_f64().into();
        out["settle_seconds"] = self.settle.as_secs_f64().into();
        out
    }

    /// Writes `report.txt`, `stacks.folded`, `flamegraph.svg` and
    /// `profile.pb.gz` into `dir` (created if needed).
    pub fn write_outputs(&self, dir: &Path) -> std::io::Result<()> {
        jitmap_demo::output::write_profile(
            &self.profile,
            &self.report(20),
            &format!("jitmap ebpf-profile: process {}", self.pid),
            1_000_000_000 / u64::from(self.hz.max(1)),
            dir,
        )
    }
}

/// The program's cost on a host, as throughput ratios measured side by side.
#[derive(Clone, Debug, PartialEq)]
pub struct Overhead {
    /// The sampling rate.
    pub hz: u32,
    /// Demo throughput while profiled, over throughput with no program, per round.
    pub ratios: Vec<f64>,
    /// The same with the program taking each sample's stack but resolving
    /// nothing (what a profiler that only captures stacks pays).
    pub stack_only: Vec<f64>,
    /// The same with the program attached at the same rate but profiling no
    /// process (it returns after its process check: the cost of the ticks
    /// themselves).
    pub floor: Vec<f64>,
    /// Mean ns in the program per profiled sample, per round.
    pub ns_per_sample: Vec<f64>,
    /// Mean ns in the program per sample when it only takes the stack.
    pub stack_only_ns: Vec<f64>,
    /// Throughput ratios profiling with native frames stepped by the frame
    /// pointer only (no native rows), per round.
    pub no_native: Vec<f64>,
    /// Mean ns in the program per sample without native rows.
    pub no_native_ns: Vec<f64>,
}

/// Runs the demo on this thread for `slice` while a second thread drains the
/// ring buffer as `ebpf-profile` would; returns the demo's throughput and the
/// program's mean ns per sample.
fn measure(
    demo: &jitmap_demo::demo::Demo,
    config: Config,
    hz: u32,
    slice: Duration,
    rng: &mut jitmap_demo::rng::Rng,
) -> Result<(f64, f64), EbpfError> {
    let loaded = Loaded::start(config, hz, native::DEFAULT_ROWS_CAP)?;
    let stop = AtomicBool::new(false);
    let (throughput, loaded) = std::thread::scope(|s| {
        let drainer = s.spawn(|| {
            let mut loaded = loaded;
            let mut agg = Aggregator::new();
            // Relaxed: a stop flag; the join below orders everything else.
            while !stop.load(Ordering::Relaxed) {
                loaded.wait(Duration::from_millis(20));
                loaded.drain(|r| {
                    if let Ok(sample) = Sample::decode(r) {
                        agg.add(&sample);
                    }
                });
            }
            loaded
        });
        let throughput = jitmap_demo::output::throughput(demo, slice, rng);
        // Relaxed: as above.
        stop.store(true, Ordering::Relaxed);
        (throughput, drainer.join())
    });
    let loaded = loaded.map_err(|_| EbpfError::Bpf("the drain thread panicked".into()))?;
    let k = loaded.stats()?;
    Ok((throughput, k.cost_ns as f64 / k.samples.max(1) as f64))
}

/// Measures the program's cost on the demo host run by this process: `rounds`
/// rounds, each running the demo for `slice` with no program, then for each
/// rate with the program profiling no process (the floor), taking stacks
/// only, and profiling this process, side by side.
pub fn overhead(rates: &[u32], slice: Duration, rounds: usize) -> Result<Vec<Overhead>, EbpfError> {
    let manager = jitmap::ExecutionManager::new(16);
    let demo = jitmap_demo::demo::Demo::publish(&manager)?;
    let options = Options {
        pid: std::process::id() as i32,
        hz: rates.iter().copied().max().unwrap_or(1000),
        duration: slice,
        samples: None,
        native_rows: Some(native::DEFAULT_ROWS_CAP),
        dotnet: false,
    };
    let profiled = configure(&options)?.0.with_native(true);
    // No process has the largest id (pid_max is at most 2^22); 0 would be
    // the idle task.
    let nobody = profiled.with_tgid(u32::MAX);
    let mut rng = jitmap_demo::rng::Rng::new(11);
    let mut out: Vec<Overhead> = rates
        .iter()
        .map(|&hz| Overhead {
            hz,
            ratios: Vec::new(),
            stack_only: Vec::new(),
            floor: Vec::new(),
            ns_per_sample: Vec::new(),
            stack_only_ns: Vec::new(),
            no_native: Vec::new(),
            no_native_ns: Vec::new(),
        })
        .collect();
    for _ in 0..rounds {
        let base = jitmap_demo::output::throughput(&demo, slice, &mut rng);
        for row in &mut out {
            let (floor, _) = measure(&demo, nobody, row.hz, slice, &mut rng)?;
            row.floor.push(floor / base);
            let (stacks, ns) = measure(&demo, profiled.stack_only(), row.hz, slice, &mut rng)?;
            row.stack_only.push(stacks / base);
            row.stack_only_ns.push(ns);
            let (with, ns) = measure(&demo, profiled, row.hz, slice, &mut rng)?;
            row.ratios.push(with / base);
            row.ns_per_sample.push(ns);
            let no_native = profiled.with_native(false);
            let (with, ns) = measure(&demo, no_native, row.hz, slice, &mut rng)?;
            row.no_native.push(with / base);
            row.no_native_ns.push(ns);
        }
    }
    Ok(out)
}
