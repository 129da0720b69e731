//! The structs and enums C sees: configurations, what a host says about a
//! method, what a lookup answers. Enum-valued fields are `uint32_t` in the
//! structs (a C enum variable can hold any int, and a Rust enum cannot), and
//! are checked on every call.
#![allow(non_camel_case_types)]

use std::ffi::c_char;

/// The compiler tier that produced a method (`jitmap_code_info.kind`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum jitmap_jit_kind {
    /// Quick, unoptimized code (tier 0).
    JITMAP_JIT_BASELINE = 0,
    /// Optimized code (tier 1).
    JITMAP_JIT_OPTIMIZED = 1,
    /// Code with profiling instrumentation.
    JITMAP_JIT_INSTRUMENTED = 2,
    /// A precompiled image's method: lookups may answer it; a host does not
    /// publish it.
    JITMAP_JIT_PRECOMPILED = 3,
}

/// How a heap maps its memory (`jitmap_heap_config.mode`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum jitmap_memory_mode {
    /// One read-write-execute mapping.
    JITMAP_MEMORY_RWX = 0,
    /// Two views of one memory: read-write for writers, at an unrelated
    /// address, and read-execute for running. Published code can be patched.
    JITMAP_MEMORY_WRITE_XOR_EXECUTE = 1,
    /// One mapping whose block pages turn read-execute at publish: no
    /// writable alias at all, so published code cannot be patched.
    JITMAP_MEMORY_FLIP_ON_PUBLISH = 2,
}

/// Which perf outputs to write (`jitmap_manager_perf`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum jitmap_perf_mode {
    /// `jit-<pid>.dump`, for `perf inject --jit`.
    JITMAP_PERF_JITDUMP = 1,
    /// `perf-<pid>.map`.
    JITMAP_PERF_MAP = 2,
    /// Both.
    JITMAP_PERF_BOTH = 3,
}

/// The agent's timer clock (`jitmap_agent_config.clock`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum jitmap_clock {
    /// CPU time of each thread: idle threads are not sampled.
    JITMAP_CLOCK_CPU = 0,
    /// Wall-clock time.
    JITMAP_CLOCK_WALL = 1,
}

/// How the agent's handler walks stacks (`jitmap_agent_config.unwind`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum jitmap_unwind {
    /// Each frame stepped by a rule: a JIT method's `.eh_frame`, else its
    /// frame pointer; a native frame by its object's `.eh_frame`. Frames
    /// built without frame pointers keep their callers. The default.
    JITMAP_UNWIND_MIXED = 0,
    /// Saved frame pointers only: cheaper, exact only where every frame
    /// keeps one.
    JITMAP_UNWIND_FRAME_POINTER = 1,
}

/// A profile's output formats (`jitmap_profile_write`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum jitmap_output {
    /// The text report: totals and the top methods.
    JITMAP_OUTPUT_REPORT = 0,
    /// Folded stacks, one `frame;frame;frame count` line per stack.
    JITMAP_OUTPUT_FOLDED = 1,
    /// An SVG flame graph.
    JITMAP_OUTPUT_FLAMEGRAPH = 2,
    /// Gzipped pprof, for `go tool pprof`.
    JITMAP_OUTPUT_PPROF = 3,
}

/// How to build a heap. Start from `jitmap_heap_config_default`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct jitmap_heap_config {
    /// Bytes to reserve (rounded up to pages): more than 0, under 4 GiB.
    pub span: u64,
    /// Nibble-map version: 1 (linear lookups) or 2 (at most two map reads).
    pub map_version: u32,
    /// A `jitmap_memory_mode`.
    pub mode: u32,
    /// Default code alignment: a power of two from 8 to the page size.
    pub align: u64,
    /// 1: back the heap with transparent huge pages where allowed; or 0.
    pub huge_pages: u8,
    /// 1: register each method's `.eh_frame` with the system unwinder at
    /// publish (such a method cannot move); or 0.
    pub register_unwind: u8,
    /// 1: announce methods to debuggers through the GDB JIT interface (a
    /// build without the `gdb-jit` feature refuses it with
    /// `JITMAP_STATUS_GDB_JIT_UNAVAILABLE`); or 0.
    pub gdb_jit: u8,
    /// Bytes kept free after each block's code, at most 65536 (0 by
    /// default): where `perf inject --jit` maps a method's unwinding tables,
    /// so that `perf record --call-graph dwarf` unwinds through JIT frames.
    pub unwind_room: u32,
}

/// One region's unwind bytes, offsets from the code start. The first entry
/// starts at 0; entries are sorted and do not overlap.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct jitmap_unwind_entry {
    /// First byte covered.
    pub begin: u32,
    /// One past the last byte covered.
    pub end: u32,
    /// The unwind bytes (copied at publish).
    pub data: *const u8,
    /// Their length.
    pub len: usize,
}

/// One row of a method's code offset to source line mapping.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct jitmap_debug_row {
    /// Offset from the code start where the row begins.
    pub offset: u32,
    /// Source line, 1-based.
    pub line: u32,
    /// Source column, 1-based; 0 if unknown.
    pub column: u32,
    /// Source file, UTF-8, NUL-terminated (copied at publish).
    pub file: *const c_char,
}

/// What a host says about a method when it publishes it. Every pointer may
/// be NULL when its count is 0; everything is copied at publish.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct jitmap_code_info {
    /// The runtime's method identity, reported by lookups and profiles.
    pub method_id: u64,
    /// A name for profilers: UTF-8, NUL-terminated, not NULL.
    pub name: *const c_char,
    /// A `jitmap_jit_kind`.
    pub kind: u32,
    /// Where the cold part begins (the hot part's size); 0 for none.
    pub cold_offset: u32,
    /// Unwind entries: the main body, then one per funclet.
    pub unwind: *const jitmap_unwind_entry,
    /// How many.
    pub unwind_count: usize,
    /// Debug rows, sorted by offset.
    pub debug: *const jitmap_debug_row,
    /// How many.
    pub debug_count: usize,
    /// GC info bytes, opaque to jitmap.
    pub gc_info: *const u8,
    /// Their length; 0 for none.
    pub gc_info_len: usize,
    /// The GC info encoding's version.
    pub gc_version: u32,
    /// The method's `.eh_frame` section (for `register_unwind` heaps and
    /// perf's jitdump), built for the code's final address.
    pub eh_frame: *const u8,
    /// Its length; 0 for none.
    pub eh_frame_len: usize,
    /// Its `.eh_frame_hdr` index, if the host built one.
    pub eh_frame_hdr: *const u8,
    /// Its length.
    pub eh_frame_hdr_len: usize,
}

impl Default for jitmap_code_info {
    /// Method 0 with no name (publish refuses a NULL name), baseline, and
    /// nothing else: a start for struct updates.
    fn default() -> Self {
        Self {
            method_id: 0,
            name: std::ptr::null(),
            kind: jitmap_jit_kind::JITMAP_JIT_BASELINE as u32,
            cold_offset: 0,
            unwind: std::ptr::null(),
            unwind_count: 0,
            debug: std::ptr::null(),
            debug_count: 0,
            gc_info: std::ptr::null(),
            gc_info_len: 0,
            gc_version: 0,
            eh_frame: std::ptr::null(),
            eh_frame_len: 0,
            eh_frame_hdr: std::ptr::null(),
            eh_frame_hdr_len: 0,
        }
    }
}

/// A published block: what frees, moves and patches it. `start` and `size`
/// are for the host to read; pass the struct back unchanged. A block that
/// was freed, or a struct the host altered, is refused with a status
/// (`JITMAP_STATUS_DOUBLE_FREE`, `JITMAP_STATUS_UNKNOWN_REF`, ...).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct jitmap_code {
    /// Address of the first code byte: the entry.
    pub start: usize,
    /// Code size in bytes.
    pub size: u64,
    /// The heap's id.
    pub heap_id: u64,
    /// The block's generation in its heap.
    pub generation: u64,
}

impl From<jitmap::CodeRef> for jitmap_code {
    fn from(code: jitmap::CodeRef) -> Self {
        let [heap_id, start, size, generation] = code.to_raw();
        Self {
            start: start as usize,
            size,
            heap_id,
            generation,
        }
    }
}

impl From<jitmap_code> for jitmap::CodeRef {
    fn from(code: jitmap_code) -> Self {
        jitmap::CodeRef::from_raw([code.heap_id, code.start as u64, code.size, code.generation])
    }
}

/// What `jitmap_guard_find` found: the method and where in it. The name
/// points into the method's header and stays valid while the guard that
/// found it is pinned.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct jitmap_block {
    /// The method's id, as published.
    pub method_id: u64,
    /// The method's first code byte.
    pub start: usize,
    /// The address's offset from `start`.
    pub offset: u64,
    /// A `jitmap_jit_kind`.
    pub kind: u32,
    /// The name, UTF-8, not NUL-terminated.
    pub name: *const u8,
    /// Its length.
    pub name_len: usize,
}

/// What `jitmap_guard_find_info` found: the block and everything the host
/// published with it, at the address. Pointers point into the method's
/// header and stay valid while the guard that found them is pinned.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct jitmap_method_info {
    /// The method and the address's offset in it.
    pub block: jitmap_block,
    /// 1 if the address lies in a funclet; 0 in the main body.
    pub is_funclet: u32,
    /// Start of the funclet (or the main body) holding the address.
    pub funclet_start: usize,
    /// Bytes in the hot part.
    pub hot_size: u64,
    /// Address of the cold part; 0 if none.
    pub cold_start: usize,
    /// Bytes in the cold part; 0 if none.
    pub cold_size: u64,
    /// The unwind bytes of the region holding the address; NULL if none.
    pub unwind: *const u8,
    /// Their length.
    pub unwind_len: usize,
    /// The address the unwind bytes' offsets count from.
    pub unwind_base: usize,
    /// The source line of the address (its debug row); 0 if none.
    pub line: u32,
    /// The source column; 0 if unknown.
    pub column: u32,
    /// The source file, UTF-8, not NUL-terminated; NULL if none.
    pub file: *const u8,
    /// Its length.
    pub file_len: usize,
    /// GC info bytes; NULL if none.
    pub gc_info: *const u8,
    /// Their length.
    pub gc_info_len: usize,
    /// The GC info encoding's version.
    pub gc_version: u32,
}

/// A block in a listing (`jitmap_manager_live_blocks`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct jitmap_live_block {
    /// The block.
    pub code: jitmap_code,
    /// The method's id; 0 for a stub.
    pub method_id: u64,
    /// A `jitmap_jit_kind`; `JITMAP_LIVE_BLOCK_STUB` for a stub.
    pub kind: u32,
}

/// How to run the agent. Start from `jitmap_agent_config_default`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct jitmap_agent_config {
    /// Samples per second per thread, 1 to 10,000 (a period of at least
    /// 100 µs; see the guide on rates).
    pub hz: u32,
    /// A `jitmap_clock`.
    pub clock: u32,
    /// Frames per sample, 1 to 256.
    pub max_depth: u32,
    /// Samples each thread's ring holds between collections.
    pub ring_capacity: u32,
    /// Probe records each thread's ring holds.
    pub probe_capacity: u32,
    /// The signal the timers send (SIGPROF by default).
    pub signal: i32,
    /// The longest the collector waits between passes, in milliseconds
    /// (it passes sooner when a ring fills to its bell: a probe ring at
    /// half full, a sample ring between half and three quarters full).
    pub collect_every_ms: u32,
    /// A `jitmap_unwind`.
    pub unwind: u32,
}
