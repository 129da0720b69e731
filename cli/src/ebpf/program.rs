//! The eBPF program's user-space side: its configuration, loading and
//! attaching it with aya, draining its ring buffer, and reading its counters.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventLinkId, PerfEventScope, SamplePolicy, perf_sw_ids};
use aya::programs::{PerfEvent, PerfTypeId};
use aya::{Ebpf, EbpfLoader};
use jitmap::remote::Layout;
use jitmap::remote::dotnet::layout::DotnetLayout;

use super::EbpfError;
use super::native::{NativeStats, NativeTables, take_maps};

/// The compiled program (`bpf/profile.bpf.c`, built by `build.rs`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profile.bpf.o"));

/// The program's name in its object.
const PROGRAM: &str = "jitmap_profile";
/// Largest fragment the program reads (`FRAGMENT_CAP`).
const FRAGMENT_CAP: usize = 128;
/// Bytes of a code header the program reads (`HEADER_CAP`).
const HEADER_CAP: usize = 64;
/// Bytes of an image table entry the program reads (`ENTRY_CAP`): the
/// entry's size must be this.
const ENTRY_CAP: usize = 32;
/// Largest CoreCLR structure the program reads (`DN_CAP`).
const DN_CAP: usize = 64;

/// `struct config` of the program: the target and the descriptor's layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Address of the descriptor's managers array in the target.
    pub managers: u64,
    /// Address of the descriptor's `frameless` array in the target: each
    /// manager's frameless stub kinds.
    pub frameless: u64,
    /// The target's process id (its thread-group id).
    pub tgid: u32,
    root_seq: u32,
    fragment_size: u32,
    fragment_begin: u32,
    fragment_end: u32,
    fragment_next: u32,
    fragment_tag: u32,
    tag_heap: u32,
    tag_image: u32,
    heap_words: u32,
    heap_ends: u32,
    heap_word_count: u32,
    heap_version: u32,
    heap_seq: u32,
    heap_id: u32,
    prefix_bytes: u32,
    prefix_size: u32,
    prefix_slot: u32,
    max_stub_kind: u32,
    header_method_id: u32,
    header_code_size: u32,
    header_name_ptr: u32,
    header_name_len: u32,
    header_rows_ptr: u32,
    header_rows_len: u32,
    image_table: u32,
    image_count: u32,
    image_entry_size: u32,
    entry_begin: u32,
    entry_end: u32,
    entry_delta: u32,
    entry_name_len: u32,
    entry_method_id: u32,
    entry_name_ptr: u32,
    /// 0: the program takes the stack but resolves nothing and sends no
    /// frames (a floor for the overhead measurement).
    resolve: u32,
    /// 1: native frames step by their objects' rows (`native.rs`).
    native: u32,
    /// CoreCLR's `g_codeRangeMap` in the target, or 0 (no .NET frames).
    dotnet_map: u64,
    dotnet: DotnetConfig,
}

/// The CoreCLR fields the program reads (`dn_*` of `struct config`), from
/// the runtime's entry in `jitmap::remote::dotnet::layout`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct DotnetConfig {
    fragment_bytes: u32,
    fragment_next: u32,
    fragment_begin: u32,
    fragment_end: u32,
    fragment_section: u32,
    section_bytes: u32,
    section_flags: u32,
    section_module: u32,
    section_heap_list: u32,
    section_range_list: u32,
    flag_code_heap: u32,
    flag_range_list: u32,
    heap_list_bytes: u32,
    heap_end: u32,
    heap_map_base: u32,
    heap_header_map: u32,
    stub_last: u32,
    header_method_desc: u32,
    header_unwind_infos: u32,
    flag_collectible: u32,
    desc_token_remainder: u32,
    desc_chunk_index: u32,
    desc_alignment: u32,
    chunk_bytes: u32,
    chunk_method_table: u32,
    chunk_token_range: u32,
    method_table_module: u32,
    module_simple_name: u32,
}

impl DotnetConfig {
    /// The program's view of `l`; refuses a layout whose structures or
    /// fields do not fit the program's `DN_CAP`-byte buffer.
    fn new(l: &DotnetLayout) -> Result<Self, EbpfError> {
        // The program reads each structure whole (a MethodDesc as 8 bytes).
        let sizes = [
            l.fragment_bytes,
            l.section_bytes,
            l.heap_list_bytes,
            l.chunk_bytes,
        ];
        if !sizes.iter().all(|&size| size <= DN_CAP)
            || l.desc_bytes > 8
            || !l
                .fields()
                .iter()
                .all(|&(off, width, size)| fits(off, width, size))
            || !fits(l.real_header_method_desc, 8, 1 << 12)
            || !fits(l.real_header_unwind_infos, 4, 1 << 12)
            || !(1..=64).contains(&l.desc_alignment)
            || l.method_table_module >= 1 << 12
            || l.module_simple_name >= 1 << 12
            || l.stub_code_block_last > 0xFF
        {
            return Err(EbpfError::Layout("CoreCLR layout"));
        }
        let u = |v: usize| v as u32; // every value is below 2^12, checked above
        Ok(Self {
            fragment_bytes: u(l.fragment_bytes),
            fragment_next: u(l.fragment_next),
            fragment_begin: u(l.fragment_begin),
            fragment_end: u(l.fragment_end),
            fragment_section: u(l.fragment_section),
            section_bytes: u(l.section_bytes),
            section_flags: u(l.section_flags),
            section_module: u(l.section_module),
            section_heap_list: u(l.section_heap_list),
            section_range_list: u(l.section_range_list),
            flag_code_heap: l.flag_code_heap,
            flag_range_list: l.flag_range_list,
            heap_list_bytes: u(l.heap_list_bytes),
            heap_end: u(l.heap_end),
            heap_map_base: u(l.heap_map_base),
            heap_header_map: u(l.heap_header_map),
            stub_last: l.stub_code_block_last as u32,
            header_method_desc: u(l.real_header_method_desc),
            header_unwind_infos: u(l.real_header_unwind_infos),
            flag_collectible: l.flag_collectible,
            desc_token_remainder: u(l.desc_token_remainder),
            desc_chunk_index: u(l.desc_chunk_index),
            desc_alignment: l.desc_alignment as u32,
            chunk_bytes: u(l.chunk_bytes),
            chunk_method_table: u(l.chunk_method_table),
            chunk_token_range: u(l.chunk_token_range),
            method_table_module: l.method_table_module as u32,
            module_simple_name: l.module_simple_name as u32,
        })
    }
}

// SAFETY: `Config` is `#[repr(C)]`, `Copy`, made only of integers, with no
// padding (two u64, 36 u32, one u64, then 28 u32: every u64 at a multiple
// of 8, and the size a multiple of 8), so every bit pattern is valid and
// its bytes are all initialized.
unsafe impl aya::Pod for Config {}

/// Whether `off` leaves room for a `width`-byte value aligned to `width`
/// inside a `cap`-byte buffer.
fn fits(off: usize, width: usize, cap: usize) -> bool {
    off.is_multiple_of(width) && off + width <= cap
}

impl Config {
    /// The program's view of a host: `managers` and `frameless` are the
    /// addresses of its descriptor's managers array and frameless kinds,
    /// `layout` the layout its reader checked. Refuses a layout the
    /// program's fixed-size buffers cannot hold.
    pub fn new(
        tgid: u32,
        managers: u64,
        frameless: u64,
        layout: &Layout,
    ) -> Result<Self, EbpfError> {
        let bad = |what| Err(EbpfError::Layout(what));
        let l = layout;
        if l.fragment_size > FRAGMENT_CAP || l.root_seq >= 1 << 20 || !l.root_seq.is_multiple_of(8)
        {
            return bad("fragment size or root sequence offset");
        }
        let in_fragment = [
            (l.fragment_begin, 8),
            (l.fragment_end, 8),
            (l.fragment_next, 8),
            (l.fragment_tag, 8),
            (l.heap_words, 8),
            (l.heap_ends, 8),
            (l.heap_word_count, 4),
            (l.heap_version, 1),
        ];
        if !in_fragment
            .iter()
            .all(|&(off, width)| fits(off, width, l.fragment_size))
            || l.heap_base != l.fragment_begin
        {
            return bad("fragment offsets");
        }
        let in_16 = [l.heap_seq, l.heap_id, l.prefix_size, l.prefix_slot];
        if !in_16.iter().all(|&off| off == 0 || off == 8) || l.prefix_bytes != 16 {
            return bad("trailer or prefix offsets");
        }
        let in_header = [
            l.header_method_id,
            l.header_code_size,
            l.header_name_ptr,
            l.header_name_len,
            l.header_rows_ptr,
            l.header_rows_len,
        ];
        if !in_header.iter().all(|&off| fits(off, 8, HEADER_CAP)) {
            return bad("header offsets");
        }
        if !fits(l.image_table, 8, l.fragment_size) || !fits(l.image_count, 8, l.fragment_size) {
            return bad("image fragment offsets");
        }
        let in_entry = [
            (l.entry_begin, 4),
            (l.entry_end, 4),
            (l.entry_delta, 4),
            (l.entry_name_len, 4),
            (l.entry_method_id, 8),
            (l.entry_name_ptr, 8),
        ];
        if l.image_entry_size != ENTRY_CAP
            || !in_entry
                .iter()
                .all(|&(off, width)| fits(off, width, ENTRY_CAP))
        {
            return bad("image table entry offsets");
        }
        let u = |v: usize| v as u32; // every value is below 2^20, checked above
        Ok(Self {
            managers,
            frameless,
            tgid,
            root_seq: l.root_seq as u32,
            fragment_size: u(l.fragment_size),
            fragment_begin: u(l.fragment_begin),
            fragment_end: u(l.fragment_end),
            fragment_next: u(l.fragment_next),
            fragment_tag: u(l.fragment_tag),
            tag_heap: l.tag_heap as u32,
            tag_image: l.tag_image as u32,
            heap_words: u(l.heap_words),
            heap_ends: u(l.heap_ends),
            heap_word_count: u(l.heap_word_count),
            heap_version: u(l.heap_version),
            heap_seq: u(l.heap_seq),
            heap_id: u(l.heap_id),
            prefix_bytes: l.prefix_bytes as u32,
            prefix_size: u(l.prefix_size),
            prefix_slot: u(l.prefix_slot),
            max_stub_kind: l.max_stub_kind as u32,
            header_method_id: u(l.header_method_id),
            header_code_size: u(l.header_code_size),
            header_name_ptr: u(l.header_name_ptr),
            header_name_len: u(l.header_name_len),
            header_rows_ptr: u(l.header_rows_ptr),
            header_rows_len: u(l.header_rows_len),
            image_table: u(l.image_table),
            image_count: u(l.image_count),
            image_entry_size: u(l.image_entry_size),
            entry_begin: u(l.entry_begin),
            entry_end: u(l.entry_end),
            entry_delta: u(l.entry_delta),
            entry_name_len: u(l.entry_name_len),
            entry_method_id: u(l.entry_method_id),
            entry_name_ptr: u(l.entry_name_ptr),
            resolve: 1,
            native: 0,
            dotnet_map: 0,
            dotnet: DotnetConfig::default(),
        })
    }

    /// The program's view of a process without jitmap: no managers, so
    /// that only CoreCLR's frames (see [`Config::with_dotnet`]) resolve.
    pub fn without_jitmap(tgid: u32) -> Self {
        Self {
            tgid,
            resolve: 1,
            ..Self::default()
        }
    }
}

impl Config {
    /// The same configuration for another process.
    pub fn with_tgid(self, tgid: u32) -> Self {
        Self { tgid, ..self }
    }

    /// The same configuration, taking stacks but resolving no frames.
    pub fn stack_only(self) -> Self {
        Self { resolve: 0, ..self }
    }

    /// The same configuration, resolving CoreCLR's frames too: `map` is
    /// the runtime's `g_codeRangeMap`, `layout` its version's layout.
    /// Refuses a layout the program's buffers cannot hold.
    pub fn with_dotnet(self, map: u64, layout: &DotnetLayout) -> Result<Self, EbpfError> {
        Ok(Self {
            dotnet_map: map,
            dotnet: DotnetConfig::new(layout)?,
            ..self
        })
    }

    /// The same configuration, stepping native frames by their objects'
    /// rows or not.
    pub fn with_native(self, on: bool) -> Self {
        Self {
            native: u32::from(on),
            ..self
        }
    }
}

/// `struct stats` of the program, summed over CPUs (maxima are maxima).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Samples of the target the program handled.
    pub samples: u64,
    /// Samples the ring buffer had no room for.
    pub lost: u64,
    /// Frames looked up.
    pub frames: u64,
    /// Reads made by frame lookups.
    pub reads: u64,
    /// Most reads of one frame's lookup.
    pub max_reads: u64,
    /// Frames inside a range section (a heap or an image).
    pub jit_frames: u64,
    /// Reads made by those frames' lookups.
    pub jit_reads: u64,
    /// Frames whose heap changed during their lookup.
    pub stale: u64,
    /// Samples during which a range map changed (sent without frames).
    pub stale_samples: u64,
    /// Start-map reads that found no page behind them (never written), read
    /// as the zeros such a page holds.
    pub holes: u64,
    /// Samples not sent because the descriptor's managers could not be read.
    pub unreadable: u64,
    /// Time in the program for the target's samples, in ns.
    pub cost_ns: u64,
    /// The longest of them, in ns.
    pub max_cost_ns: u64,
    /// Samples whose stack the program walked from their user registers
    /// (the sample's own, or for one taken in the kernel, those saved when
    /// the thread entered it); the others take the kernel's frame-pointer
    /// walk.
    pub walked: u64,
    /// Frames stepped by their method's unwind rows.
    pub cfi_frames: u64,
    /// Native frames stepped by their object's rows.
    pub native_frames: u64,
    /// Walks ended at a frame whose object's rows were stale (another
    /// object is mapped there now).
    pub native_stale: u64,
    /// Samples dropped because the native rows were rewritten while they
    /// were used.
    pub native_busy: u64,
    /// Native frames in no object with rows (loaded since the last
    /// refresh, or anonymous code), stepped by the frame pointer.
    pub native_unknown: u64,
}

// SAFETY: `#[repr(C)]`, `Copy`, nineteen u64 and no padding: any bits are valid.
unsafe impl aya::Pod for KernelStats {}

/// The kernel's own accounting of the program (`bpf_prog_info`), over every
/// CPU's ticks, the other processes' included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunTime {
    /// Times the program ran.
    pub runs: u64,
    /// Total time in it, in ns.
    pub ns: u64,
    /// Instructions the verifier processed to accept it (kernels from 5.16).
    pub verified_insns: Option<u32>,
}

/// The loaded program, attached to a cpu-clock event on every online CPU.
pub struct Loaded {
    bpf: Ebpf,
    ring: RingBuf<MapData>,
    links: Vec<PerfEventLinkId>,
    /// The target's native rows, when the configuration steps by them;
    /// else the maps they would be in, kept open for the program (which
    /// is loaded after this is made).
    native: Result<NativeTables, [MapData; 3]>,
    /// Keeps the kernel's run-time statistics on while the program runs.
    _stats: Option<OwnedFd>,
}

impl Loaded {
    /// Loads the program for `config` (the verifier checks it here), loads
    /// the target's native rows (at most `rows_cap`) if the configuration
    /// steps by them, and attaches it to a cpu-clock event on every online
    /// CPU, every `1/hz` s of CPU time.
    pub fn start(config: Config, hz: u32, rows_cap: u32) -> Result<Self, EbpfError> {
        raise_memlock();
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        // A map of no entries cannot be made: without native rows, one.
        let rows_cap = if config.native == 0 {
            1
        } else {
            rows_cap.max(1)
        };
        let mut bpf = EbpfLoader::new()
            .set_global("CONFIG", &config, true)
            .set_max_entries("NATIVE_ROWS", rows_cap)
            .load(OBJECT)
            .map_err(|e| EbpfError::bpf("loading the program's maps", &e))?;
        let maps = take_maps(&mut bpf)?;
        let native = if config.native != 0 {
            Ok(NativeTables::new(config.tgid as i32, maps, rows_cap)?)
        } else {
            Err(maps)
        };
        let ring = bpf
            .take_map("EVENTS")
            .ok_or(EbpfError::Bpf("the object has no EVENTS map".into()))?;
        let ring = RingBuf::try_from(ring).map_err(|e| EbpfError::bpf("the ring buffer", &e))?;
        let program = perf_event(&mut bpf)?;
        program
            .load()
            .map_err(|e| EbpfError::bpf("verifying and loading the program", &e))?;
        let cpus =
            aya::util::online_cpus().map_err(|(what, e)| EbpfError::Bpf(format!("{what}: {e}")))?;
        let period = 1_000_000_000 / u64::from(hz.max(1));
        let mut links = Vec::with_capacity(cpus.len());
        for cpu in cpus {
            let link = program
                .attach(
                    PerfTypeId::Software,
                    perf_sw_ids::PERF_COUNT_SW_CPU_CLOCK as u64,
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Period(period),
                    false,
                )
                .map_err(|e| EbpfError::bpf("attaching to a cpu-clock event", &e))?;
            links.push(link);
        }
        Ok(Self {
            bpf,
            ring,
            links,
            native,
            _stats: stats,
        })
    }

    /// Brings the native rows up to the target's mappings if they changed
    /// (see `native.rs`); returns whether they were rewritten.
    pub fn refresh_native(&mut self) -> bool {
        self.native.as_mut().is_ok_and(NativeTables::refresh)
    }

    /// What the native rows hold, if the program steps by them.
    pub fn native(&self) -> Option<&NativeStats> {
        self.native.as_ref().ok().map(NativeTables::stats)
    }

    /// Waits up to `timeout`, or until the program wakes the reader (it does
    /// so only when the ring buffer is half full).
    pub fn wait(&self, timeout: Duration) {
        let mut pfd = libc::pollfd {
            fd: self.ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the ring buffer's open descriptor; poll
        // only writes its `revents`. An error or timeout just returns.
        unsafe { libc::poll(&mut pfd, 1, timeout.as_millis().min(60_000) as libc::c_int) };
    }

    /// Hands every record in the ring buffer to `f`; returns how many.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            f(&item);
            n += 1;
        }
        n
    }

    /// Stops sampling: detaches the program from every CPU's event, then
    /// gives runs already under way time to finish (they take microseconds).
    pub fn detach(&mut self) -> Result<(), EbpfError> {
        let program = perf_event(&mut self.bpf)?;
        for link in self.links.drain(..) {
            program
                .detach(link)
                .map_err(|e| EbpfError::bpf("detaching", &e))?;
        }
        std::thread::sleep(Duration::from_millis(20));
        Ok(())
    }

    /// The program's own counters, summed over CPUs.
    pub fn stats(&self) -> Result<KernelStats, EbpfError> {
        let map = self
            .bpf
            .map("STATS")
            .ok_or(EbpfError::Bpf("the object has no STATS map".into()))?;
        let array: PerCpuArray<_, KernelStats> =
            PerCpuArray::try_from(map).map_err(|e| EbpfError::bpf("the STATS map", &e))?;
        let per_cpu = array
            .get(&0, 0)
            .map_err(|e| EbpfError::bpf("reading STATS", &e))?;
        Ok(per_cpu
            .iter()
            .fold(KernelStats::default(), |a, c| KernelStats {
                samples: a.samples + c.samples,
                lost: a.lost + c.lost,
                frames: a.frames + c.frames,
                reads: a.reads + c.reads,
                max_reads: a.max_reads.max(c.max_reads),
                jit_frames: a.jit_frames + c.jit_frames,
                jit_reads: a.jit_reads + c.jit_reads,
                stale: a.stale + c.stale,
                stale_samples: a.stale_samples + c.stale_samples,
                holes: a.holes + c.holes,
                unreadable: a.unreadable + c.unreadable,
                cost_ns: a.cost_ns + c.cost_ns,
                max_cost_ns: a.max_cost_ns.max(c.max_cost_ns),
                walked: a.walked + c.walked,
                cfi_frames: a.cfi_frames + c.cfi_frames,
                native_frames: a.native_frames + c.native_frames,
                native_stale: a.native_stale + c.native_stale,
                native_busy: a.native_busy + c.native_busy,
                native_unknown: a.native_unknown + c.native_unknown,
            }))
    }

    /// The kernel's run-time accounting of the program (zero when statistics
    /// could not be turned on).
    pub fn run_time(&self) -> Result<RunTime, EbpfError> {
        let program = self.bpf.program(PROGRAM).ok_or_else(no_program)?;
        let info = program
            .info()
            .map_err(|e| EbpfError::bpf("reading the program's info", &e))?;
        Ok(RunTime {
            runs: info.run_count(),
            ns: info.run_time().as_nanos() as u64,
            verified_insns: info.verified_instruction_count(),
        })
    }
}

/// The object's program, as the perf-event program it is.
fn perf_event(bpf: &mut Ebpf) -> Result<&mut PerfEvent, EbpfError> {
    bpf.program_mut(PROGRAM)
        .ok_or_else(no_program)?
        .try_into()
        .map_err(|e| EbpfError::bpf("the program's type", &e))
}

fn no_program() -> EbpfError {
    EbpfError::Bpf(format!("the object has no program {PROGRAM}"))
}

/// Lifts RLIMIT_MEMLOCK for kernels that still charge BPF maps to it (before
/// 5.11); newer kernels charge the memory cgroup and ignore it. Best effort:
/// a failure shows up as a map-creation error.
fn raise_memlock() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads one valid rlimit; failure changes nothing.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}
