// SPDX-License-Identifier: MIT OR Apache-2.0
//
// jitmap's eBPF profiler: a perf_event program, run on every CPU's cpu-clock
// tick, that takes the target process's user stack and resolves every frame
// in the kernel through the host's jitmap descriptor (docs/descriptor.md),
// in a bounded number of reads, then sends the sample to user space through a
// ring buffer.
//
// A sample taken in user mode is walked here, from its registers: a JIT
// method with unwind rows (its .eh_frame, evaluated by the host when it was
// published) steps by the row at its pc, so JIT code that keeps no frame
// pointer is walked through. A native frame in an object whose rows user
// space loaded (each mapped object's .eh_frame, evaluated the same way, in
// NATIVE_ROWS) steps by its row too, after a check that the object mapped
// there is still the one the rows are of. Every other frame steps by the
// frame pointer, as the kernel's own walk does. A sample taken in the
// kernel is walked the same way from the user registers the kernel saved
// when the thread entered it; only without them (or for the overhead
// floor) does it take the kernel's walk of the user stack (bpf_get_stack).
//
// Every loop has a constant bound; every pointer read from the target is
// checked (non-null, aligned, below 2^47) before it is followed, and every read
// may fail, which ends that frame's lookup. An answer is sent as a method only
// when the range map's and the heap's change sequences read the same even
// value before and after the lookup; otherwise the frame is marked stale.
//
// No libbpf headers: the few helpers are declared by number (they are stable
// kernel ABI), so clang is the only build dependency.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef short s16;
typedef int s32;
typedef long long s64;

#define SEC(name) __attribute__((section(name), used))
#define INLINE static inline __attribute__((always_inline))

// Helper numbers from include/uapi/linux/bpf.h.
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*bpf_get_stack)(void *ctx, void *buf, u32 size, u64 flags) = (void *)67;
static long (*bpf_probe_read_user)(void *dst, u32 size, const void *ptr) = (void *)112;
static long (*bpf_probe_read_kernel)(void *dst, u32 size, const void *ptr) = (void *)113;
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, u64 size, u64 flags) = (void *)130;
static u64 (*bpf_ringbuf_query)(void *ringbuf, u64 flags) = (void *)134;
static void *(*bpf_get_current_task_btf)(void) = (void *)158;
static void *(*bpf_task_pt_regs)(void *task) = (void *)175;
static long (*bpf_loop)(u32 nr_loops, void *callback_fn, void *callback_ctx, u64 flags) = (void *)181;

#define BPF_F_USER_STACK (1ULL << 8)
#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2
#define BPF_RB_AVAIL_DATA 0
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_F_MMAPABLE (1U << 10)
#define BPF_MAP_TYPE_RINGBUF 27

// Shared with user space (sim/src/ebpf/event.rs mirrors these).
#define MAX_FRAMES 64
#define NAME_CAP 256
// Name bytes one sample carries at most; a name that does not fit is cut.
#define NAMES_BYTES 4096
#define MAX_MANAGERS 8
#define LEVELS_BELOW_TOP 4
#define MAX_FRAGMENTS 32
#define FRAGMENT_CAP 128
#define HEADER_CAP 64
// An image's function table entry, as read (user space checks the size).
#define ENTRY_CAP 32
// A binary search of an image's table: at most 2^24 functions.
#define IMAGE_STEPS 25
#define MAX_IMAGE_FUNCTIONS (1 << 24)
// v1: the covering word and at most 255 before it (the agent's handler
// budget, 64 KiB of code), in chunks of 32 words.
#define V1_CHUNK_WORDS 32
#define V1_CHUNKS 8
#define V1_MAX_WORDS 256

#define USER_LIMIT (1ULL << 47)
#define RING_BYTES (8 << 20)

// pt_regs (x86-64) as 8-byte words.
#define REGS_WORDS 21
#define REG_BP 4
#define REG_IP 16
#define REG_CS 17
#define REG_SP 19

// A method's unwind row (jitmap::remote::UnwindRow, docs/descriptor.md).
struct unwind_row {
	u32 offset;
	s32 cfa;
	s16 ra;
	s16 fp;
	u8 kind;
	u8 base;
	u8 fp_rule;
	u8 has_ra;
};

#define ROW_NONE 0
#define ROW_RULE 1
#define ROW_UNSUPPORTED 2
#define BASE_FP 1
#define FP_AT 1
#define FP_LOST 2
// A method's rows are searched in at most ROW_STEPS reads: 2^16 rows.
#define MAX_ROWS (1 << 16)
#define ROW_STEPS 17

// Native objects' rows (user space writes them; cli/src/ebpf/native.rs).
// The ranges are sorted by start and searched in at most RANGE_STEPS reads;
// an object's rows in at most OBJECT_ROW_STEPS.
#define MAX_RANGES 1024
#define RANGE_STEPS 11
// Ranges that may hold one pc, tried backwards from the last that starts
// at or before it: the mapped object's, and candidates' (unmapped objects
// kept with their rows, whose ranges may overlap the mapped ones).
#define CANDIDATE_STEPS 8
#define MAX_OBJECT_ROWS (1 << 22)
#define OBJECT_ROW_STEPS 23
#define CHECK_BYTES 16
// CoreCLR: the largest fragment, range section or heap list read, and the
// fragments followed in one chunk's list.
#define DN_CAP 64
// jitmap::remote::dotnet::names's NAME_HASH_MULTIPLIER.
#define NAME_HASH_MULTIPLIER 0x9E3779B97F4A7C15ULL
#define DN_FRAGMENTS 32
#define DN_SECTIONS 4
// An UNWIND_INFO read: its 4-byte header and at most DN_UNWIND_CODES codes.
#define DN_UNWIND_CODES 16
#define DN_UNWIND_BYTES 40

// A CoreCLR range section as a sample caches it.
struct dn_section {
	u64 begin;
	u64 end;
	u64 kind;      // FRAME_DOTNET_METHOD (a code heap), _STUBS or _IMAGE
	u64 id;        // the heap list, range list or Module
	u64 map_base;  // a code heap's: what nibble-map offsets count from,
	u64 heap_end;  // its end,
	u64 header_map; // and its nibble map
	u64 collectible; // a code heap's: its code may be freed and reused
};

// One executable mapping of an object with rows: [start, end), the object's
// load bias (a row's offset is pc - bias), its rows at NATIVE_ROWS[first ..
// first + count), and CHECK_BYTES that the object holds at check_addr (its
// build id): a frame steps by these rows only if the target's memory there
// still reads the same, so rows are never applied to an object mapped where
// an unloaded one was before user space saw the change.
struct native_range {
	u64 start;
	u64 end;
	u64 bias;
	u64 check_addr;
	u32 first;
	u32 count;
	u8 check[CHECK_BYTES];
};

// The tables' state: `seq` is odd while user space rewrites them (a
// sample that used rows while it changed is dropped as stale); `ranges`
// entries of NATIVE_RANGES are in use.
struct native_state {
	u64 seq;
	u64 ranges;
};

enum frame_kind {
	FRAME_NATIVE = 0,
	FRAME_METHOD = 1,
	FRAME_STUB = 2,
	FRAME_IMAGE = 3,
	FRAME_NOTHING = 4,
	FRAME_TOO_FAR = 5,
	FRAME_STALE = 6,
	FRAME_ERROR = 7,
	// Internal: find_section found the section (never sent).
	SECTION_FOUND = 8,
	// CoreCLR's code (CONFIG.dotnet_map): a method (start; id: its
	// MethodDesc; heap_id: its real code header), a stub block of a code
	// heap (start; id: its StubCodeBlockKind), a stub range (start: the
	// section's begin; id: its range list), a ReadyToRun image (start: the
	// section's begin; id: its Module), or a code heap address whose start
	// lies beyond the capped scan.
	FRAME_DOTNET_METHOD = 9,
	FRAME_DOTNET_STUB = 10,
	FRAME_DOTNET_STUBS = 11,
	FRAME_DOTNET_IMAGE = 12,
	FRAME_DOTNET_TOO_FAR = 13,
};

struct frame {
	u64 ip;        // as sampled: the pc, then return addresses
	u64 start;     // the block's or image function's first byte, or the image's begin
	u64 id;        // method id, or stub kind
	u64 heap_id;   // the heap's id, or the image's begin
	u64 size;      // code size, or the image's size (a .NET method's: see pad1)
	u32 name_len;  // the name's full length in bytes
	u16 reads;     // reads this frame's lookup made
	u8 kind;       // enum frame_kind
	u8 found;      // FRAME_IMAGE: 1 if a function of the image holds ip;
	               // FRAME_DOTNET_METHOD: 1 if pad1 and size hold its
	               // identity, 2 if it could not be read
	u16 name_off;  // where its name starts in the sample's name area
	u16 name_copied; // name bytes copied there (at most NAME_CAP)
	u32 pad1;      // FRAME_DOTNET_METHOD with found: its token's bits
};

struct event_header {
	u32 tid;
	u32 frames;
	u32 reads;     // reads for the sample as a whole (managers, range-map sequences)
	u32 flags;     // SAMPLE_STALE: a range map changed during the sample;
	               // SAMPLE_FRAMELESS_LEAF: see jitmap_profile
	u32 names;     // bytes of the name area, after the frames
	u32 pad;
};

#define SAMPLE_STALE 1
#define SAMPLE_FRAMELESS_LEAF 2
// The last frame sent is the top-of-stack word's lookup, not a frame of the
// stack (user space takes it off).
#define SAMPLE_TOP_PROBE 4
// The walk ended at the last frame: its pc is in an object whose rows are
// stale (the check bytes differ: another object is mapped there now).
#define SAMPLE_STALE_ROWS 8
// The walk ended at the last frame: its rows say its CFI has no rule this
// walk can apply (a DWARF expression, as in a PLT stub), or it is in a
// native object's code that no FDE covers.
#define SAMPLE_NO_RULE 16
// A native frame in no object with rows (one loaded since user space last
// looked, anonymous code) was stepped by the frame pointer, or the whole
// stack is the kernel's frame-pointer walk (a sample in the kernel without
// saved user registers): the frames past it are only as good as the frame
// pointer. Set only when native rows are on.
#define SAMPLE_UNKNOWN_CODE 32

// A sample as sent: the header, `frames` frames, then `names` bytes of names.
#define HEADER_BYTES 24
#define FRAME_BYTES 56
#define EVENT_BYTES (HEADER_BYTES + MAX_FRAMES * FRAME_BYTES + NAMES_BYTES)

// The descriptor's layout, checked by user space before loading
// (jitmap::remote::Layout), plus the target.
struct config {
	u64 managers;  // address of the descriptor's managers array
	u64 frameless; // address of its frameless array: each manager's frameless stub kinds
	u32 tgid;
	u32 root_seq;
	u32 fragment_size;
	u32 fragment_begin;
	u32 fragment_end;
	u32 fragment_next;
	u32 fragment_tag;
	u32 tag_heap;
	u32 tag_image;
	u32 heap_words;
	u32 heap_ends;
	u32 heap_word_count;
	u32 heap_version;
	u32 heap_seq;
	u32 heap_id;
	u32 prefix_bytes;
	u32 prefix_size;
	u32 prefix_slot;
	u32 max_stub_kind;
	u32 header_method_id;
	u32 header_code_size;
	u32 header_name_ptr;
	u32 header_name_len;
	u32 header_rows_ptr;
	u32 header_rows_len;
	u32 image_table;      // layout 3: an image's function table
	u32 image_count;
	u32 image_entry_size;
	u32 entry_begin;
	u32 entry_end;
	u32 entry_delta;
	u32 entry_name_len;
	u32 entry_method_id;
	u32 entry_name_ptr;
	u32 resolve;   // 0: take the stack but resolve nothing and send no frames
	               // (the overhead measurement's floor)
	u32 native;    // 1: step native frames by their objects' rows
	// CoreCLR (jitmap::remote::dotnet::layout, checked by user space):
	u64 dotnet_map;         // ExecutionManager::g_codeRangeMap, or 0: no .NET
	u32 dn_fragment_bytes;  // RangeSectionFragment
	u32 dn_fragment_next;
	u32 dn_fragment_begin;
	u32 dn_fragment_end;
	u32 dn_fragment_section;
	u32 dn_section_bytes;   // RangeSection
	u32 dn_section_flags;
	u32 dn_section_module;
	u32 dn_section_heap_list;
	u32 dn_section_range_list;
	u32 dn_flag_code_heap;
	u32 dn_flag_range_list;
	u32 dn_heap_list_bytes; // HeapList
	u32 dn_heap_end;
	u32 dn_heap_map_base;
	u32 dn_heap_header_map;
	u32 dn_stub_last;       // STUB_CODE_BLOCK_LAST
	u32 dn_header_method_desc; // RealCodeHeader::phdrMDesc
	u32 dn_header_unwind;   // RealCodeHeader::nUnwindInfos, then RUNTIME_FUNCTIONs
	u32 dn_flag_collectible; // RANGE_SECTION_COLLECTIBLE
	u32 dn_desc_token;      // MethodDesc: the token's low bits (u16)
	u32 dn_desc_chunk_index; // its index in its chunk (u8)
	u32 dn_desc_alignment;  // the index's unit
	u32 dn_chunk_bytes;     // MethodDescChunk, which ends where its descs begin
	u32 dn_chunk_method_table;
	u32 dn_chunk_token;     // the token's high bits (u16)
	u32 dn_method_table_module; // MethodTable::m_pModule
	u32 dn_module_simple_name;  // Module::m_pSimpleName
};

struct stats {
	u64 samples;       // target samples seen
	u64 lost;          // samples the ring buffer had no room for
	u64 frames;
	u64 reads;         // frame lookups' reads
	u64 max_reads;     // most reads of one frame
	u64 jit_frames;    // frames in a section (method, stub, image, nothing, too far)
	u64 jit_reads;
	u64 stale;         // frames whose heap changed during their lookup
	u64 stale_samples; // samples during which a range map changed
	u64 holes;         // start-map reads that found no page (read as zeros)
	u64 unreadable;    // samples not sent: the descriptor's managers could not be read
	u64 cost_ns;       // total time in the program for target samples (from the
	                   // tgid check to after the output)
	u64 max_cost_ns;
	u64 walked;        // samples whose stack this program walked from user registers
	u64 cfi_frames;    // frames stepped by their method's unwind rows
	u64 native_frames; // native frames stepped by their object's rows
	u64 native_stale;  // walks ended at an object whose rows are stale
	u64 native_busy;   // samples dropped: the rows were rewritten while they were used
	u64 native_unknown; // native frames in no object with rows, stepped by the frame pointer
};

// Per-CPU working memory: the sample being built and the lookup's buffers
// (the BPF stack is 512 bytes).
struct scratch {
	u8 ev[EVENT_BYTES];   // the sample being built, laid out as sent
	u8 names[NAMES_BYTES]; // the names, copied after the frames at the end
	u64 names_used;       // bytes of it used
	u64 ips[MAX_FRAMES];
	u64 roots[MAX_MANAGERS];
	u32 frameless[MAX_MANAGERS]; // each manager's frameless stub kinds (bit k: kind k)
	u64 hit_manager;             // the manager of the sample's last section hit
	u64 seqs[MAX_MANAGERS];  // each root's sequence before the first lookup
	u64 after[MAX_MANAGERS]; // the managers array after the last lookup
	u8 fragment[FRAGMENT_CAP];
	u8 section[FRAGMENT_CAP];  // the fragment of the sample's last section hit
	u64 hit_begin;             // ... and its bounds (empty: 0, 0)
	u64 hit_end;
	u8 header[HEADER_CAP];
	u8 entry[ENTRY_CAP];
	struct unwind_row row;  // the row at the frame's pc (walking only)
	u32 want_row;           // look the row up (walking)
	u32 row_native;         // s->row is a native object's
	u64 native_seq;         // NATIVE_STATE's seq at the sample's start
	u32 native_on;          // the rows may be used in this sample
	u32 native_used;        // ... and were
	u64 checked;            // the range last checked in this sample, plus 1
	u8 check[CHECK_BYTES];
	u32 words[V1_CHUNK_WORDS];
	u64 uregs[REGS_WORDS];  // the user registers of a sample taken in the kernel
	u64 start;
	u64 holes;   // start-map reads that found no page, this frame
	// The sample's last DN_SECTIONS CoreCLR range sections hit (a managed
	// stack moves between a few code heaps and stub ranges): each one's
	// bounds (empty: 0, 0), kind, and for a code heap its map; dn_next is
	// the slot the next hit replaces, dn_hit the slot of this frame's.
	struct dn_section dn[DN_SECTIONS];
	u64 dn_next;
	u64 dn_hit;
	u32 leaf;      // the frame being resolved is the innermost one
	u32 dn_entry;  // ... a CoreCLR frame that has pushed nothing
	u32 dn_row;    // ... a CoreCLR method in its prologue: s->row is its rule
	u64 dn_base;   // the code heap's base of the frame's method
	u8 dn_unwind[DN_UNWIND_BYTES]; // its UNWIND_INFO's header and codes
	u16 dn_reads;  // jitmap_dotnet_frame's answer: its reads,
	struct frame dn_frame; // and the frame's start, id and heap id
	u8 dn_buf[DN_CAP];
};

struct bpf_map_def {
	u32 type;
	u32 key_size;
	u32 value_size;
	u32 max_entries;
	u32 map_flags;
};

struct bpf_map_def SEC("maps") EVENTS = {
	.type = BPF_MAP_TYPE_RINGBUF,
	.max_entries = RING_BYTES,
};

struct bpf_map_def SEC("maps") SCRATCH = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = 4,
	.value_size = sizeof(struct scratch),
	.max_entries = 1,
};

// Written by user space through mmap (BPF_F_MMAPABLE); NATIVE_ROWS's size
// is set at load (the rows' cap).
struct bpf_map_def SEC("maps") NATIVE_STATE = {
	.type = BPF_MAP_TYPE_ARRAY,
	.key_size = 4,
	.value_size = sizeof(struct native_state),
	.max_entries = 1,
	.map_flags = BPF_F_MMAPABLE,
};

struct bpf_map_def SEC("maps") NATIVE_RANGES = {
	.type = BPF_MAP_TYPE_ARRAY,
	.key_size = 4,
	.value_size = sizeof(struct native_range),
	.max_entries = MAX_RANGES,
	.map_flags = BPF_F_MMAPABLE,
};

struct bpf_map_def SEC("maps") NATIVE_ROWS = {
	.type = BPF_MAP_TYPE_ARRAY,
	.key_size = 4,
	.value_size = sizeof(struct unwind_row),
	.max_entries = 1,
	.map_flags = BPF_F_MMAPABLE,
};

struct bpf_map_def SEC("maps") STATS = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = 4,
	.value_size = sizeof(struct stats),
	.max_entries = 1,
};

volatile const struct config CONFIG = {};

INLINE int bad_ptr(u64 p, u64 align)
{
	return p == 0 || (p & (align - 1)) != 0 || p >= USER_LIMIT;
}

INLINE int read_u64(u64 *out, u64 addr, u16 *reads)
{
	*reads += 1;
	return bpf_probe_read_user(out, 8, (const void *)addr);
}

// A u64 field of a buffer at an offset user space checked; the mask keeps the
// verifier's bounds (the offset is below the buffer size minus 8).
INLINE u64 field64(const u8 *buf, u32 off, u32 cap)
{
	return *(const u64 *)(buf + (off & (cap - 8) & ~7u));
}

INLINE u32 field32(const u8 *buf, u32 off, u32 cap)
{
	return *(const u32 *)(buf + (off & (cap - 4) & ~3u));
}

// 1 if x != 0, without a branch.
INLINE u64 nonzero(u32 x)
{
	return ((u64)x + 0xFFFFFFFFULL) >> 32;
}

// Index of the lowest non-zero nibble of x (x != 0).
INLINE u32 low_nibble(u32 x)
{
	u32 p = x & (0u - x);
	return (u32)(nonzero(p & 0xF0F0F0F0u) | (nonzero(p & 0xFF00FF00u) << 1) |
		     (nonzero(p & 0xFFFF0000u) << 2));
}

// The last start in word `w` (index `i`); w != 0.
INLINE u64 last_start_in(u32 w, u64 i)
{
	u32 skip = low_nibble(w);
	u32 nibble = (w >> (4 * skip)) & 0xF;
	return i * 256 + (u64)(7 - skip) * 32 + (u64)(nibble - 1) * 4;
}

// The last start in word `w` (index `i`) at or before `offset`, or ~0.
INLINE u64 start_at_or_before(u32 w, u64 i, u64 offset)
{
	u32 bucket = (offset >> 5) & 7;
	u32 upto = w >> (28 - 4 * bucket);
	u32 own = upto & 0xF;
	if (own != 0 && (u64)(own - 1) * 4 <= (offset & 31))
		return i * 256 + (u64)bucket * 32 + (u64)(own - 1) * 4;
	u32 earlier = upto >> 4;
	if (earlier == 0)
		return ~0ULL;
	u32 skip = low_nibble(earlier);
	u32 nibble = (earlier >> (4 * skip)) & 0xF;
	return i * 256 + (u64)(bucket - 1 - skip) * 32 + (u64)(nibble - 1) * 4;
}

// Reads `size` bytes of start-map words. A page of the start map that was
// never written may have no page behind it yet, and this program cannot
// fault one in: such a read fails, and the words are read as what the page
// would hold, zeros. (A page swapped out would hide its starts the same way;
// the lookup then finds an earlier start or none, and the prefix's size check
// answers "in no block" - never a wrong method.) Counted in s->holes.
INLINE void read_words(struct scratch *s, void *dst, u32 size, u64 addr, u16 *reads)
{
	*reads += 1;
	if (bpf_probe_read_user(dst, size, (const void *)addr)) {
		__builtin_memset(dst, 0, size);
		s->holes += 1;
	}
}

#define NO_START (~0ULL)
#define START_TOO_FAR (~1ULL)

// v1: the covering word, then back at most V1_MAX_WORDS - 1 words, read in
// chunks of V1_CHUNK_WORDS. Every read has a constant size and every word a
// constant index in the chunk, so no value with a tracked range crosses an
// iteration and the verifier's work stays linear in the cap. (A chunk near
// the map's start is read from word 0: the map is page-aligned and at least
// a page, so those bytes are mapped.)
INLINE u64 find_v1(struct scratch *s, u64 words, u64 offset, u16 *reads)
{
	u64 index = offset >> 8;
	u32 w = 0;
	read_words(s, &w, 4, words + 4 * index, reads);
	u64 start = start_at_or_before(w, index, offset);
	if (start != NO_START)
		return start;
	u64 lowest = index > V1_MAX_WORDS - 1 ? index - (V1_MAX_WORDS - 1) : 0;
	u64 hi = index; // words below `hi` remain
#pragma clang loop unroll(disable)
	for (int c = 0; c < V1_CHUNKS; c++) {
		if (hi <= lowest)
			break;
		// lo = hi >= V1_CHUNK_WORDS ? hi - V1_CHUNK_WORDS : 0, without a branch.
		u64 d = hi - V1_CHUNK_WORDS;
		u64 lo = d & ((d >> 63) - 1);
		read_words(s, s->words, sizeof(s->words), words + 4 * lo, reads);
#pragma clang loop unroll(disable)
		for (int j = V1_CHUNK_WORDS - 1; j >= 0; j--) {
			u64 at = lo + j;
			// Word `at` counts if lowest <= at < hi: a mask, not a branch,
			// so no comparison here lets the verifier split (or pin) the
			// scan's bounds. Word indices are below 2^24.
			u64 in = ((at - hi) >> 63) & (((lowest - at - 1) >> 63));
			u32 wj = s->words[j] & (u32)(0 - in);
			if (wj != 0)
				return last_start_in(wj, at);
		}
		hi = lo;
	}
	return lowest == 0 ? NO_START : START_TOO_FAR;
}

// v2: at most two words.
INLINE u64 find_v2(struct scratch *s, u64 words, u64 offset, u16 *reads)
{
	u64 index = offset >> 8;
	u32 w = 0;
	read_words(s, &w, 4, words + 4 * index, reads);
	if ((w & 0xF) > 8)
		return (u64)((w & ~0xFu) + (((w & 0xF) - 9) << 2));
	u64 start = start_at_or_before(w, index, offset);
	if (start != NO_START || index == 0)
		return start;
	read_words(s, &w, 4, words + 4 * (index - 1), reads);
	if ((w & 0xF) > 8)
		return (u64)((w & ~0xFu) + (((w & 0xF) - 9) << 2));
	if (w == 0)
		return NO_START;
	return last_start_in(w, index - 1);
}

// The row of a method's `count` rows at `rows` that covers code offset
// `off`, into s->row: a binary search, one read per step, then the row.
// Before the first row there is no rule (ROW_NONE, as without rows). Returns
// nonzero if a read fails or the rows are not sane.
INLINE int find_row(struct scratch *s, u64 rows, u64 count, u64 off, u16 *reads)
{
	s->row.kind = ROW_NONE;
	if (count == 0)
		return 0;
	if (count > MAX_ROWS || bad_ptr(rows, 4))
		return 1;
	// The last row whose offset is at most `off`: rows[lo] after the search.
	u64 lo = 0, hi = count;
#pragma clang loop unroll(disable)
	for (int k = 0; k < ROW_STEPS; k++) {
		if (hi - lo <= 1)
			break;
		u64 mid = (lo + hi) / 2;
		u32 at = 0;
		*reads += 1;
		if (bpf_probe_read_user(&at, 4, (const void *)(rows + 16 * mid)))
			return 1;
		if (at <= off)
			lo = mid;
		else
			hi = mid;
	}
	*reads += 1;
	if (bpf_probe_read_user(&s->row, sizeof(s->row), (const void *)(rows + 16 * lo)))
		return 1;
	if (s->row.offset > off)
		s->row.kind = ROW_NONE;
	return 0;
}

// Resolves one heap frame from the fragment in s->section: the start map, the
// prefix, the header and the name (and, walking, the method's unwind row at
// the pc), then the heap's sequence again: the row is read inside the
// bracket too. Returns the frame kind; the root's sequence is checked by the
// caller.
// Copies a name of `len` bytes at `name` to the sample's name area, cut at
// NAME_CAP bytes; once the area has less than NAME_CAP bytes left, names are
// left out (the frame says so: nothing copied of a non-empty name). Returns
// 1 when the name cannot be read.
INLINE int copy_name(struct scratch *s, struct frame *f, u64 name, u64 len, u16 *reads)
{
	f->name_len = len > 0xFFFFFFFFULL ? 0xFFFFFFFFu : (u32)len;
	u64 used = s->names_used;
	u64 copy = len < NAME_CAP ? len : NAME_CAP;
	if (used > NAMES_BYTES - NAME_CAP)
		copy = 0;
	if (copy > 0) {
		if (name == 0 || name >= USER_LIMIT)
			return 1;
		*reads += 1;
		if (bpf_probe_read_user(s->names + used, (u32)copy, (const void *)name))
			return 1;
	}
	f->name_off = (u16)used;
	f->name_copied = (u16)copy;
	s->names_used = used + copy;
	return 0;
}

// The function of an image holding `ip`: a binary search of the image's
// table (sorted by begin) in at most IMAGE_STEPS reads of an entry's begin,
// then the entry and its method's name. An image is never changed while it
// is loaded, and its table is freed only after its fragment is unlinked:
// the sample's range-map sequences cover these reads.
INLINE u8 resolve_image(struct scratch *s, struct frame *f, u64 ip, u64 begin, u64 end, u16 *reads)
{
	const u8 *frag = s->section;
	u64 table = field64(frag, CONFIG.image_table, FRAGMENT_CAP);
	u64 count = field64(frag, CONFIG.image_count, FRAGMENT_CAP);
	u64 size = CONFIG.image_entry_size;
	f->start = begin;
	f->size = end - begin;
	f->heap_id = begin;  // an image frame's image, found or not
	if (count == 0)
		return FRAME_IMAGE;
	if (bad_ptr(table, 8) || count > MAX_IMAGE_FUNCTIONS || size > ENTRY_CAP)
		return FRAME_ERROR;
	u64 rel = ip - begin;
	u64 lo = 0, hi = count;
	for (int k = 0; k < IMAGE_STEPS; k++) {
		if (hi - lo <= 1)
			break;
		u64 mid = lo + (hi - lo) / 2;
		u32 b = 0;
		*reads += 1;
		if (bpf_probe_read_user(&b, 4, (const void *)(table + mid * size + CONFIG.entry_begin)))
			return FRAME_ERROR;
		if (b <= rel)
			lo = mid;
		else
			hi = mid;
	}
	if (hi - lo > 1)
		return FRAME_ERROR;
	*reads += 1;
	if (bpf_probe_read_user(s->entry, ENTRY_CAP, (const void *)(table + lo * size)))
		return FRAME_ERROR;
	u64 fb = field32(s->entry, CONFIG.entry_begin, ENTRY_CAP);
	u64 fe = field32(s->entry, CONFIG.entry_end, ENTRY_CAP);
	if (fb >= fe || fe > end - begin)
		return FRAME_ERROR;
	if (rel < fb || rel >= fe)
		return FRAME_IMAGE;
	f->found = 1;
	f->start = begin + fb;
	f->size = fe - fb;
	f->id = field64(s->entry, CONFIG.entry_method_id, ENTRY_CAP);
	if (copy_name(s, f, field64(s->entry, CONFIG.entry_name_ptr, ENTRY_CAP),
		      field32(s->entry, CONFIG.entry_name_len, ENTRY_CAP), reads))
		return FRAME_ERROR;
	return FRAME_IMAGE;
}

INLINE u8 resolve_heap(struct scratch *s, struct frame *f, u64 ip, u64 begin, u64 end, u16 *reads)
{
	const u8 *frag = s->section;
	u64 words = field64(frag, CONFIG.heap_words, FRAGMENT_CAP);
	u64 ends = field64(frag, CONFIG.heap_ends, FRAGMENT_CAP);
	u64 count = field32(frag, CONFIG.heap_word_count, FRAGMENT_CAP);
	u8 version = frag[CONFIG.heap_version & (FRAGMENT_CAP - 1)];
	if (bad_ptr(words, 4096) || bad_ptr(ends, 4096) || count > (1 << 24) ||
	    count * 256 > end - begin + 256 || (version != 1 && version != 2))
		return FRAME_ERROR;
	u64 trailer = ends + 8 * count;
	u64 pair[2] = {0, 0};
	*reads += 1;
	if (bpf_probe_read_user(pair, 16, (const void *)trailer))
		return FRAME_ERROR;
	u64 hseq = CONFIG.heap_seq == 0 ? pair[0] : pair[1];
	u64 again = 0;
	f->heap_id = CONFIG.heap_id == 0 ? pair[0] : pair[1];
	if (hseq & 1)
		return FRAME_STALE;
	u64 offset = ip - begin;
	if ((offset >> 8) >= count)
		return FRAME_ERROR;
	// The start goes through the scratch map and back: a value loaded from a
	// map is unknown to the verifier, so comparing it with the sentinels
	// below cannot mark the scan's values precise, which would keep the
	// verifier from pruning the scan's paths (and multiply them).
	s->start = version == 2 ? find_v2(s, words, offset, reads) : find_v1(s, words, offset, reads);
	u64 start = *(volatile u64 *)&s->start;
	u8 kind = FRAME_NOTHING;
	if (start == START_TOO_FAR) {
		kind = FRAME_TOO_FAR;
		goto confirm;
	}
	if (start == NO_START || start < CONFIG.prefix_bytes || start > offset)
		goto confirm;
	u64 prefix[2] = {0, 0};
	*reads += 1;
	if (bpf_probe_read_user(prefix, 16, (const void *)(begin + start - 16)))
		return FRAME_ERROR;
	u64 size = CONFIG.prefix_size == 0 ? prefix[0] : prefix[1];
	u64 slot = CONFIG.prefix_slot == 0 ? prefix[0] : prefix[1];
	if (size == 0 || start + size > end - begin)
		return FRAME_ERROR;
	if (offset - start >= size)
		goto confirm;
	f->start = begin + start;
	f->size = size;
	if (slot == 0)
		return FRAME_ERROR;
	if (slot <= CONFIG.max_stub_kind) {
		f->id = slot;
		kind = FRAME_STUB;
		goto confirm;
	}
	if (bad_ptr(slot, 8))
		return FRAME_ERROR;
	*reads += 1;
	if (bpf_probe_read_user(s->header, HEADER_CAP, (const void *)slot))
		return FRAME_ERROR;
	f->id = field64(s->header, CONFIG.header_method_id, HEADER_CAP);
	if (field64(s->header, CONFIG.header_code_size, HEADER_CAP) != size)
		return FRAME_ERROR;
	if (s->want_row && find_row(s, field64(s->header, CONFIG.header_rows_ptr, HEADER_CAP),
				    field64(s->header, CONFIG.header_rows_len, HEADER_CAP),
				    offset - start, reads))
		return FRAME_ERROR;
	if (copy_name(s, f, field64(s->header, CONFIG.header_name_ptr, HEADER_CAP),
		      field64(s->header, CONFIG.header_name_len, HEADER_CAP), reads))
		return FRAME_ERROR;
	kind = FRAME_METHOD;
confirm:
	if (read_u64(&again, trailer + CONFIG.heap_seq, reads))
		return FRAME_ERROR;
	if (again != hseq)
		return FRAME_STALE;
	return kind;
}

// Finds the section of `ip` through every registered range map: on a hit the
// fragment is copied to s->section. The range maps' sequences bracket the whole
// sample (read before its first lookup and after its last), not each frame.
INLINE u8 find_section(struct scratch *s, u64 ip, u64 *begin, u64 *end, u16 *reads)
{
	for (int m = 0; m < MAX_MANAGERS; m++) {
		u64 root = s->roots[m];
		if (bad_ptr(root, 4096))
			continue;
		u64 entry = 0;
		u64 level = root;
		for (int depth = LEVELS_BELOW_TOP; depth >= 0; depth--) {
			if (read_u64(&entry, level + 8 * ((ip >> (17 + 8 * depth)) & 255), reads))
				return FRAME_ERROR;
			if (entry == 0)
				break;
			if (depth > 0) {
				if (bad_ptr(entry, 4096))
					return FRAME_ERROR;
				level = entry;
			}
		}
		// `entry` is now the first fragment of ip's 128 KiB chunk, or 0.
		u64 frag = entry;
		for (int k = 0; k < MAX_FRAGMENTS; k++) {
			if (frag == 0)
				break;
			if (bad_ptr(frag, 64))
				return FRAME_ERROR;
			u32 size = CONFIG.fragment_size;
			if (size > FRAGMENT_CAP)
				return FRAME_ERROR;
			*reads += 1;
			if (bpf_probe_read_user(s->fragment, size, (const void *)frag))
				return FRAME_ERROR;
			u64 b = field64(s->fragment, CONFIG.fragment_begin, FRAGMENT_CAP);
			u64 e = field64(s->fragment, CONFIG.fragment_end, FRAGMENT_CAP);
			if (b <= ip && ip < e) {
				__builtin_memcpy(s->section, s->fragment, FRAGMENT_CAP);
				s->hit_begin = b;
				s->hit_end = e;
				s->hit_manager = m;
				*begin = b;
				*end = e;
				return SECTION_FOUND;
			}
			frag = field64(s->fragment, CONFIG.fragment_next, FRAGMENT_CAP);
		}
		if (frag != 0)
			return FRAME_ERROR; // a longer list than any host builds
	}
	return FRAME_NATIVE;
}

// A method's leaf frame at its `ret` or its first instruction: only the
// return address is on the stack there, whatever its rows say (Cranelift's
// CFI does not describe its epilogue: at `ret` it still places the CFA by
// rbp, which already holds the caller's frame pointer).
INLINE int at_entry_or_ret(struct frame *f, u64 ip, u16 *reads)
{
	if (ip == f->start)
		return 1;
	u8 insn = 0;
	*reads += 1;
	return !bpf_probe_read_user(&insn, 1, (const void *)ip) && insn == 0xC3;
}

// Reads `size` bytes (a CoreCLR structure's, at most DN_CAP: user space
// checked) into s->dn_buf.
INLINE int read_dn(struct scratch *s, u32 size, u64 addr, u16 *reads)
{
	if (size > DN_CAP || bad_ptr(addr, 8))
		return 1;
	*reads += 1;
	return bpf_probe_read_user(s->dn_buf, size, (const void *)addr);
}

// CoreCLR's range section of `ip` into the sample's cache (slot
// s->dn_next, which becomes s->dn_hit): the five levels of its
// RangeSectionMap (bit 0 of every entry and link flags a collectible
// section), at most DN_FRAGMENTS fragments of the chunk's list, the
// RangeSection, and for a code heap its HeapList. Returns FRAME_NATIVE (in
// no section), FRAME_ERROR, or SECTION_FOUND.
INLINE u8 find_dotnet_section(struct scratch *s, u64 ip, u16 *reads)
{
	u64 entry = 0;
	u64 level = CONFIG.dotnet_map;
	for (int depth = LEVELS_BELOW_TOP; depth >= 0; depth--) {
		if (read_u64(&entry, level + 8 * ((ip >> (17 + 8 * depth)) & 255), reads))
			return FRAME_ERROR;
		entry &= ~1ULL;
		if (entry == 0)
			return FRAME_NATIVE;
		if (depth > 0) {
			if (bad_ptr(entry, 8))
				return FRAME_ERROR;
			level = entry;
		}
	}
	u64 frag = entry, section = 0, b = 0, e = 0;
	for (int k = 0; k < DN_FRAGMENTS; k++) {
		if (read_dn(s, CONFIG.dn_fragment_bytes, frag, reads))
			return FRAME_ERROR;
		b = field64(s->dn_buf, CONFIG.dn_fragment_begin, DN_CAP);
		e = field64(s->dn_buf, CONFIG.dn_fragment_end, DN_CAP);
		if (b <= ip && ip < e) {
			section = field64(s->dn_buf, CONFIG.dn_fragment_section, DN_CAP);
			break;
		}
		frag = field64(s->dn_buf, CONFIG.dn_fragment_next, DN_CAP) & ~1ULL;
		if (frag == 0)
			return FRAME_NATIVE;
	}
	if (section == 0)
		return FRAME_ERROR; // a longer list than the cap
	if (read_dn(s, CONFIG.dn_section_bytes, section, reads))
		return FRAME_ERROR;
	u32 flags = field32(s->dn_buf, CONFIG.dn_section_flags, DN_CAP);
	u64 slot = s->dn_next & (DN_SECTIONS - 1);
	struct dn_section *c = &s->dn[slot];
	if (flags & CONFIG.dn_flag_range_list) {
		c->kind = FRAME_DOTNET_STUBS;
		c->id = field64(s->dn_buf, CONFIG.dn_section_range_list, DN_CAP);
	} else if (!(flags & CONFIG.dn_flag_code_heap)) {
		c->kind = FRAME_DOTNET_IMAGE;
		c->id = field64(s->dn_buf, CONFIG.dn_section_module, DN_CAP);
	} else {
		u64 heap_list = field64(s->dn_buf, CONFIG.dn_section_heap_list, DN_CAP);
		if (read_dn(s, CONFIG.dn_heap_list_bytes, heap_list, reads))
			return FRAME_ERROR;
		c->kind = FRAME_DOTNET_METHOD;
		c->id = heap_list;
		c->map_base = field64(s->dn_buf, CONFIG.dn_heap_map_base, DN_CAP);
		c->heap_end = field64(s->dn_buf, CONFIG.dn_heap_end, DN_CAP);
		c->header_map = field64(s->dn_buf, CONFIG.dn_heap_header_map, DN_CAP);
		c->collectible = (flags & CONFIG.dn_flag_collectible) != 0;
	}
	// Bounds last, once every read above succeeded: a slot whose heap list
	// could not be read was left as it was (it never held this section).
	c->begin = b;
	c->end = e;
	s->dn_hit = slot;
	s->dn_next = slot + 1;
	return SECTION_FOUND;
}

// What names a method of a collectible assembly, read while the sample is
// taken: its token's bits (the MethodDesc's low bits, its chunk's high
// bits) in the frame's pad1 (low 16 bits, then high 16), and in its size a
// hash of its module's simple name: its address and 32 bytes there (or up
// to the end of its page), as jitmap::remote::dotnet::names::name_hash
// mixes them; found = 1. Such an assembly's code, MethodDescs
// and Module are freed when it unloads, and the next one may get the same
// addresses: user space names the method only if it reads the same
// identity at its MethodDesc then (a method frame keeps its assembly alive
// while it runs, so what is read here is the method's own). Five reads,
// six at the end of a page.
// found = 2 when a read failed: the frame is still a method (its walk
// rules hold), but it is not named.
INLINE void method_identity(struct scratch *s, struct frame *f, u64 desc, u16 *reads)
{
	f->found = 2;
	if (read_dn(s, 8, desc, reads))
		return;
	u16 low = (u16)(field32(s->dn_buf, CONFIG.dn_desc_token & ~3u, DN_CAP) >>
			((CONFIG.dn_desc_token & 2) * 8));
	u64 index = s->dn_buf[CONFIG.dn_desc_chunk_index & 7];
	u64 chunk = desc - index * CONFIG.dn_desc_alignment - CONFIG.dn_chunk_bytes;
	if (bad_ptr(chunk, 8) || read_dn(s, CONFIG.dn_chunk_bytes, chunk, reads))
		return;
	u16 high = (u16)(field32(s->dn_buf, CONFIG.dn_chunk_token & ~3u, DN_CAP) >>
			 ((CONFIG.dn_chunk_token & 2) * 8));
	u64 table = field64(s->dn_buf, CONFIG.dn_chunk_method_table, DN_CAP);
	u64 module = 0, name = 0;
	if (bad_ptr(table, 8) || read_u64(&module, table + CONFIG.dn_method_table_module, reads) ||
	    bad_ptr(module, 8) || read_u64(&name, module + CONFIG.dn_module_simple_name, reads) ||
	    bad_ptr(name, 1))
		return;
	// The hash of jitmap::remote::dotnet::names::name_hash: 32 bytes at the
	// name, or, if those cannot be read, up to the end of its page.
	u64 *w = (u64 *)s->dn_buf;
	*reads += 1;
	if (bpf_probe_read_user(s->dn_buf, 32, (const void *)name)) {
		w[0] = 0;
		w[1] = 0;
		w[2] = 0;
		w[3] = 0;
		u32 n = 4096 - (u32)(name & 4095);
		if (n > 32)
			n = 32;
		*reads += 1;
		if (bpf_probe_read_user(s->dn_buf, n & 63, (const void *)name))
			return;
	}
	u64 h = name * NAME_HASH_MULTIPLIER;
	h = (h ^ w[0]) * NAME_HASH_MULTIPLIER;
	h = (h ^ w[1]) * NAME_HASH_MULTIPLIER;
	h = (h ^ w[2]) * NAME_HASH_MULTIPLIER;
	h = (h ^ w[3]) * NAME_HASH_MULTIPLIER;
	f->pad1 = (u32)low | (u32)high << 16;
	f->size = h ^ (h >> 32);
	f->found = 1;
}

// Resolves `ip` through CoreCLR's maps: its range section (cached for the
// sample), then in a code heap the v1 nibble map, scanned back at most
// V1_MAX_WORDS words (the same capped scan as a jitmap v1 heap's: a start
// beyond it is reported as too far, never as an earlier method), the word
// before the start (a stub block's kind, or the real code header), and the
// header's MethodDesc. The runtime publishes no sequence: user space names
// the MethodDesc and checks what it can (see jitmap::remote::dotnet).
INLINE u8 resolve_dotnet(struct scratch *s, struct frame *f, u64 ip, u16 *reads)
{
	u64 hit = DN_SECTIONS;
	for (int k = 0; k < DN_SECTIONS; k++) {
		if (s->dn[k].begin <= ip && ip < s->dn[k].end)
			hit = k;
	}
	if (hit == DN_SECTIONS) {
		u8 found = find_dotnet_section(s, ip, reads);
		if (found != SECTION_FOUND)
			return found;
		hit = s->dn_hit;
	}
	struct dn_section *c = &s->dn[hit & (DN_SECTIONS - 1)];
	f->start = c->begin;
	f->id = c->id;
	if (c->kind != FRAME_DOTNET_METHOD)
		return (u8)c->kind;
	u64 base = c->map_base, heap_end = c->heap_end, header_map = c->header_map;
	if (ip < base || ip >= heap_end || heap_end - base > (1ULL << 32) ||
	    bad_ptr(header_map, 4))
		return FRAME_NOTHING;
	// A nibble-map page this program cannot read is read as zeros
	// (read_words): a page never written, which holds zeros, is the case
	// that occurs. (One swapped out could hide a start; CoreCLR has no
	// prefix check to catch it, as a jitmap heap has. Counted in holes.)
	// Through the scratch map and back, as in resolve_heap: the verifier
	// then cannot mark the scan's values precise, and prunes its paths.
	s->start = find_v1(s, header_map, ip - base, reads);
	u64 start = *(volatile u64 *)&s->start;
	if (start == NO_START)
		return FRAME_NOTHING;
	if (start == START_TOO_FAR)
		return FRAME_DOTNET_TOO_FAR;
	start += base;
	s->dn_base = base;
	u64 header = 0;
	if (read_u64(&header, start - 8, reads))
		return FRAME_ERROR;
	f->start = start;
	if (header <= CONFIG.dn_stub_last) {
		f->id = header;
		return FRAME_DOTNET_STUB;
	}
	u64 desc = 0;
	if (bad_ptr(header, 8) || read_u64(&desc, header + CONFIG.dn_header_method_desc, reads) ||
	    bad_ptr(desc, 8))
		return FRAME_ERROR;
	f->heap_id = header;
	f->id = desc;
	if (c->collectible)
		method_identity(s, f, desc, reads);
	return FRAME_DOTNET_METHOD;
}

// The rule of an innermost managed method caught in its prologue, where
// its frame pointer is still its caller's (after `push rbp`, before `mov
// rbp, rsp` or `lea rbp, [rsp+N]`): from its unwind info, which the code
// header leads to. The .NET JIT describes its prologue's pushes and its
// stack allocation (Windows x64 UNWIND_CODEs, in reverse order), but not
// the frame pointer's set-up that follows: so up to 8 bytes past the
// prologue (the longest `lea rbp`) the rule is by the stack pointer, which
// the body does not move. Only the main body (the first RUNTIME_FUNCTION)
// and pushes and small allocations are read; anything else leaves the
// frame to its frame pointer. Returns 1 with the rule in s->row.
INLINE u32 prologue_row(struct scratch *s, u64 header, u64 ip, u16 *reads)
{
	u32 rf[4] = {0, 0, 0, 0}; // count, then begin, end, unwind data
	if (bad_ptr(header, 8))
		return 0;
	*reads += 1;
	if (bpf_probe_read_user(rf, sizeof(rf), (const void *)(header + CONFIG.dn_header_unwind)))
		return 0;
	u64 base = s->dn_base;
	if (rf[0] == 0 || ip < base + rf[1] || ip >= base + rf[2])
		return 0;
	u64 off = ip - (base + rf[1]);
	*reads += 1;
	if (bpf_probe_read_user(s->dn_unwind, sizeof(s->dn_unwind), (const void *)(base + rf[3])))
		return 0;
	u8 *u = s->dn_unwind;
	u32 prolog = u[1], count = u[2];
	if ((u[3] & 0xF) != 0 || count > DN_UNWIND_CODES || off >= prolog + 8)
		return 0;
	// Without a branch on any value a code holds (but to give up): taken
	// or not, each code would otherwise double the verifier's paths.
	u64 total = 0, rbp_at = NO_START;
	for (int k = DN_UNWIND_CODES - 1; k >= 0; k--) {
		u64 at = u[4 + 2 * k];
		u64 op = u[5 + 2 * k] & 0xF;
		u64 info = u[5 + 2 * k] >> 4;
		// This code exists (k < count), and its instruction has run
		// (it ends at or before off).
		u64 in = ((u64)k - count) >> 63;
		u64 ran = in & ((at - off - 1) >> 63);
		if (in && (op | 2) != 2) // not UWOP_PUSH_NONVOL (0) or _ALLOC_SMALL (2)
			return 0;
		// A push is 8 bytes; an allocation 8 * info + 8.
		u64 size = 8 + ((op >> 1) & 1) * 8 * info;
		// The push of rbp (register 5): the bytes pushed before it.
		u64 rbp = ran & (1 - nonzero((u32)(op | (info ^ 5))));
		u64 mask = 0 - rbp;
		rbp_at = (rbp_at & ~mask) | (total & mask);
		total += ran * size;
	}
	if (total > 4096)
		return 0;
	s->row.kind = ROW_RULE;
	s->row.base = 0;
	s->row.cfa = (s32)total + 8;
	s->row.ra = -8;
	s->row.has_ra = 1;
	s->row.fp_rule = rbp_at != NO_START ? FP_AT : 0;
	s->row.fp = rbp_at != NO_START ? (s16)(-16 - (s64)rbp_at) : 0;
	return 1;
}

// resolve_dotnet for the frame at `ip` (the innermost one if `leaf`), as a
// global function: the verifier checks it once, on its own, and not once
// for each state of the jitmap lookup that reaches it (inline, the .NET
// path took the program from about 660,000 verified instructions to about
// 960,000 of its 1 million). It finds its scratch itself and answers
// there: the frame's start, id, heap id and identity in s->dn_frame, its reads in
// s->dn_reads, and in s->dn_entry whether it has pushed nothing.
__attribute__((noinline)) int jitmap_dotnet_frame(u64 ip, u32 leaf)
{
	u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&SCRATCH, &zero);
	if (!s)
		return FRAME_ERROR;
	struct frame *f = &s->dn_frame;
	f->start = 0;
	f->id = 0;
	f->heap_id = 0;
	f->size = 0;
	f->pad1 = 0;
	f->found = 0;
	u16 reads = 0;
	u8 kind = resolve_dotnet(s, f, ip, &reads);
	// CoreCLR's stubs push nothing (a precode's or jump stub's indirect
	// jump), and a managed method at its first instruction or its `ret`
	// has only the return address on the stack: as the innermost frame,
	// each takes the entry rule. Managed frames otherwise step by the
	// frame pointer, which the .NET JIT sets up in every method on Linux.
	s->dn_entry = leaf && (kind == FRAME_DOTNET_STUB || kind == FRAME_DOTNET_STUBS ||
			       (kind == FRAME_DOTNET_METHOD && at_entry_or_ret(f, ip, &reads)));
	s->dn_row = leaf && kind == FRAME_DOTNET_METHOD && !s->dn_entry &&
		    prologue_row(s, f->heap_id, ip, &reads);
	s->dn_reads = reads;
	return kind;
}

// Resolves one address: its section, then (in a heap) its block. The
// sample's range-map sequences are checked by the caller.
INLINE u8 resolve(struct scratch *s, struct frame *f, u64 ip, u16 *reads)
{
	if (ip >> 57)
		return FRAME_NATIVE;
	u64 begin = s->hit_begin, end = s->hit_end;
	// Frames of one sample are mostly in one section: the last hit is kept
	// for the sample (the range maps cannot change under it unnoticed: their
	// sequences bracket the sample).
	if (!(begin <= ip && ip < end)) {
		u8 found = find_section(s, ip, &begin, &end, reads);
		if (found == FRAME_NATIVE && CONFIG.dotnet_map) {
			u8 kind = (u8)jitmap_dotnet_frame(ip, s->leaf);
			*reads += s->dn_reads;
			f->start = s->dn_frame.start;
			f->id = s->dn_frame.id;
			f->heap_id = s->dn_frame.heap_id;
			f->size = s->dn_frame.size;
			f->pad1 = s->dn_frame.pad1;
			f->found = s->dn_frame.found;
			return kind;
		}
		if (found != SECTION_FOUND)
			return found;
	}
	if (begin >= end || end - begin > (1ULL << 32))
		return FRAME_ERROR;
	u64 tag = field64(s->section, CONFIG.fragment_tag, FRAGMENT_CAP);
	if (tag == CONFIG.tag_heap)
		return resolve_heap(s, f, ip, begin, end, reads);
	if (tag != CONFIG.tag_image)
		return FRAME_ERROR;
	return resolve_image(s, f, ip, begin, end, reads);
}

// The native row at `pc` into s->row (s->row_native set), if `pc` is in an
// object user space loaded rows for: a binary search of the ranges, the
// object's check bytes (read once per range per sample), then a binary
// search of its rows (a pc no FDE covers gets a ROW_NONE row). Returns 0
// (a row, or no object: step by the frame pointer), or 1 when the object's
// check failed (the walk ends here).
INLINE int native_row(struct scratch *s, u64 pc, u16 *reads)
{
	u32 zero = 0;
	struct native_state *state = bpf_map_lookup_elem(&NATIVE_STATE, &zero);
	if (!state)
		return 0;
	u64 n = *(volatile u64 *)&state->ranges;
	if (n == 0 || n > MAX_RANGES)
		return 0;
	// The last range whose start is at most pc.
	u32 lo = 0, hi = (u32)n;
#pragma clang loop unroll(disable)
	for (int k = 0; k < RANGE_STEPS; k++) {
		if (hi - lo <= 1)
			break;
		u32 mid = lo + (hi - lo) / 2;
		struct native_range *r = bpf_map_lookup_elem(&NATIVE_RANGES, &mid);
		if (!r)
			return 0;
		if (r->start <= pc)
			lo = mid;
		else
			hi = mid;
	}
	// The ranges holding pc, from the last one that starts at or before it
	// backwards: the mapped object's first, then candidates (objects
	// unmapped since, kept with their rows), each tried by its check bytes.
	// The first that matches gives the rows; if every one that holds pc
	// fails its check, another object is mapped there than any the tables
	// know (stale rows). User space lets no more than CANDIDATE_STEPS - 1
	// candidates start inside a mapped range (native.rs, `table_of`), so
	// the mapped object's range is always within reach.
	struct native_range *r = 0;
	u32 mismatched = 0;
#pragma clang loop unroll(disable)
	for (int k = 0; k < CANDIDATE_STEPS; k++) {
		if (lo < (u32)k)
			break;
		u32 at = lo - (u32)k;
		struct native_range *c = bpf_map_lookup_elem(&NATIVE_RANGES, &at);
		if (!c)
			return 0;
		if (pc < c->start || pc >= c->end)
			continue;
		if (s->checked == (u64)at + 1) {
			r = c;
			break;
		}
		*reads += 1;
		if (bpf_probe_read_user(s->check, CHECK_BYTES, (const void *)c->check_addr) ||
		    *(u64 *)s->check != *(u64 *)c->check ||
		    *(u64 *)(s->check + 8) != *(u64 *)(c->check + 8)) {
			mismatched = 1;
			continue;
		}
		s->checked = (u64)at + 1;
		r = c;
		break;
	}
	if (!r)
		return mismatched;
	u64 rel = pc - r->bias;
	u64 first = r->first, count = r->count;
	if (rel >> 32 || count == 0 || count > MAX_OBJECT_ROWS)
		return 0;
	// The last row whose offset is at most rel.
	u32 a = 0, b = (u32)count;
#pragma clang loop unroll(disable)
	for (int k = 0; k < OBJECT_ROW_STEPS; k++) {
		if (b - a <= 1)
			break;
		u32 mid = a + (b - a) / 2;
		u32 at = (u32)first + mid;
		struct unwind_row *row = bpf_map_lookup_elem(&NATIVE_ROWS, &at);
		if (!row)
			return 0;
		if (row->offset <= rel)
			a = mid;
		else
			b = mid;
	}
	u32 at = (u32)first + a;
	struct unwind_row *row = bpf_map_lookup_elem(&NATIVE_ROWS, &at);
	if (!row)
		return 0;
	s->row = *row;
	// Before the object's first row: no rule, as between its functions.
	if (row->offset > rel)
		s->row.kind = ROW_NONE;
	s->row_native = 1;
	s->native_used = 1;
	return 0;
}

struct walk {
	struct scratch *s;
	struct stats *st;
	u32 first;    // index of the callback's first frame
	u32 counted;  // frames below this index are the stack's (the stats count these only)
	u32 walking;  // 1: each frame is the registers below, then stepped to its caller
	u32 frames;   // frames walked so far
	u64 ip;       // the walk's registers at the frame being resolved; bp is 0
	u64 sp;       // once a frame's rules say the caller's is lost
	u64 bp;
};

// The rule of a frame that has pushed nothing: the return address on top
// of the stack, the frame pointer the caller's.
INLINE void entry_rule(struct unwind_row *row)
{
	row->kind = ROW_RULE;
	row->base = 0;
	row->cfa = 8;
	row->ra = -8;
	row->fp_rule = 0;
	row->has_ra = 1;
}

// Steps the walk from frame `at` (of kind `kind`; s->row holds a method's
// row at its pc) to its caller: by the method's row when it has one, else by
// the frame pointer. Every read is checked; the stack must rise. Returns 1
// when the walk ends here.
INLINE long step(struct walk *w, struct frame *f, u8 kind, u64 at)
{
	struct scratch *s = w->s;
	u64 sp = w->sp, bp = w->bp;
	u64 cfa = 0, ra = 0, next_bp = bp;
	u16 reads = 0;
	struct event_header *h = (struct event_header *)s->ev;
	struct unwind_row row = s->row;
	int native = kind == FRAME_NATIVE && s->row_native;
	int ruled = kind == FRAME_METHOD || native;
	// A stub of a kind its manager declared frameless (a trampoline's
	// `jmp [cell]`), caught as the innermost frame, has pushed nothing:
	// the entry rule, not the frame pointer, which names the caller's
	// caller.
	int entry = kind == FRAME_STUB && at == 0 &&
		    ((s->frameless[s->hit_manager & (MAX_MANAGERS - 1)] >> (f->id & 31)) & 1);
	// A CoreCLR frame that has pushed nothing, or is in its prologue
	// (jitmap_dotnet_frame says which; the prologue's rule is in s->row).
	if (*(volatile u32 *)&s->dn_entry)
		entry = 1;
	if (*(volatile u32 *)&s->dn_row)
		ruled = 1;
	if (entry) {
		ruled = 1;
		entry_rule(&row);
	}
	// A native object's code that no FDE covers (its .init, say) ends the
	// walk as CFI no rule expresses does: its frame pointer may be any
	// value in a build without them, and the agent ends there too.
	if ((ruled && row.kind == ROW_UNSUPPORTED) || (native && row.kind == ROW_NONE)) {
		h->flags |= SAMPLE_NO_RULE;
		return 1;
	}
	if (ruled && row.kind == ROW_RULE) {
		// (A native object's CFI describes every instruction, its epilogues
		// included.)
		if (!native && !entry && at == 0 && at_entry_or_ret(f, w->ip, &reads))
			entry_rule(&row);
		if (!row.has_ra)
			return 1;
		cfa = (row.base == BASE_FP ? bp : sp) + (s64)row.cfa;
		if (bad_ptr(cfa, 8))
			return 1;
		reads += 1;
		if (bpf_probe_read_user(&ra, 8, (const void *)(cfa + (s64)row.ra)))
			return 1;
		if (row.fp_rule == FP_AT) {
			reads += 1;
			if (bpf_probe_read_user(&next_bp, 8, (const void *)(cfa + (s64)row.fp)))
				return 1;
		} else if (row.fp_rule == FP_LOST) {
			next_bp = 0;
		}
		if (native)
			w->st->native_frames += 1;
		else if (!entry)
			w->st->cfi_frames += 1;
	} else {
		if (bad_ptr(bp, 8) || bp < sp)
			return 1;
		u64 pair[2] = {0, 0};
		reads += 1;
		if (bpf_probe_read_user(pair, 16, (const void *)bp))
			return 1;
		next_bp = pair[0];
		ra = pair[1];
		cfa = bp + 16;
	}
	h->reads += reads;
	if (cfa <= sp || cfa >= USER_LIMIT || ra == 0)
		return 1;
	w->ip = ra;
	w->sp = cfa;
	w->bp = next_bp;
	return 0;
}

// One frame: walking, the frame at the walk's registers, resolved then
// stepped to its caller; otherwise s->ips[first + i], resolved.
static long frame_cb(u32 i, struct walk *w)
{
	struct scratch *s = w->s;
	struct stats *st = w->st;
	if (w->first + i >= MAX_FRAMES)
		return 1;
	// The mask, in assembly so that the compiler keeps it, bounds the
	// index for the verifier (a value the compiler derives again after the
	// check above would lose its bound).
	u64 at = w->first + i;
	asm volatile("%[at] &= 63" : [at] "+r"(at));
	if (w->walking)
		s->ips[at] = w->ip;
	struct frame *f = (struct frame *)(s->ev + HEADER_BYTES + (u64)at * FRAME_BYTES);
	u64 ip = s->ips[at];
	f->ip = ip;
	f->start = 0;
	f->id = 0;
	f->heap_id = 0;
	f->size = 0;
	f->name_len = 0;
	f->name_off = 0;
	f->name_copied = 0;
	f->found = 0;
	f->pad1 = 0;
	u16 reads = 0;
	s->holes = 0;
	s->want_row = w->walking;
	s->row.kind = ROW_NONE;
	s->row_native = 0;
	// A return address is looked up one byte back, in its call instruction.
	u64 pc = at == 0 ? ip : ip - 1;
	s->leaf = at == 0;
	s->dn_entry = 0;
	s->dn_row = 0;
	u8 kind = resolve(s, f, pc, &reads);
	f->kind = kind;
	int stale_rows = 0;
	if (w->walking && kind == FRAME_NATIVE && s->native_on)
		stale_rows = native_row(s, pc, &reads);
	f->reads = reads;
	if (at < w->counted) {
		st->frames += 1;
		st->reads += reads;
		if (reads > st->max_reads)
			st->max_reads = reads;
		if (kind != FRAME_NATIVE) {
			st->jit_frames += 1;
			st->jit_reads += reads;
		}
		if (kind == FRAME_STALE)
			st->stale += 1;
		st->holes += s->holes;
	}
	if (!w->walking)
		return 0;
	w->frames = (u32)at + 1;
	struct event_header *h = (struct event_header *)s->ev;
	if (stale_rows) {
		h->flags |= SAMPLE_STALE_ROWS;
		st->native_stale += 1;
		return 1;
	}
	if (kind == FRAME_NATIVE && s->native_on && !s->row_native) {
		h->flags |= SAMPLE_UNKNOWN_CODE;
		st->native_unknown += 1;
	}
	return step(w, f, kind, at);
}

SEC("perf_event")
int jitmap_profile(void *ctx)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if ((u32)(pid_tgid >> 32) != CONFIG.tgid)
		return 0;
	u64 t0 = bpf_ktime_get_ns();
	u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&SCRATCH, &zero);
	struct stats *st = bpf_map_lookup_elem(&STATS, &zero);
	if (!s || !st)
		return 0;
	// Counted first: a sample user space receives is always counted here.
	st->samples += 1;
	// A user-mode sample has the user registers in its context (pt_regs);
	// one taken in the kernel (a system call, a fault) finds them where the
	// kernel saved them on entry (bpf_task_pt_regs). A sample without them
	// takes the kernel's frame-pointer walk of the user stack, and so does
	// the overhead floor, which resolves nothing.
	u64 *regs = ctx;
	u64 rip = regs[REG_IP], rsp = regs[REG_SP], rbp = regs[REG_BP];
	int user = (regs[REG_CS] & 3) == 3;
	if (!user && CONFIG.resolve) {
		void *saved = bpf_task_pt_regs(bpf_get_current_task_btf());
		if (saved && !bpf_probe_read_kernel(s->uregs, sizeof(s->uregs), saved) &&
		    (s->uregs[REG_CS] & 3) == 3) {
			rip = s->uregs[REG_IP];
			rsp = s->uregs[REG_SP];
			rbp = s->uregs[REG_BP];
			user = 1;
		}
	}
	int walk = user && CONFIG.resolve;
	u32 n = 0;
	if (!walk) {
		long got = bpf_get_stack(ctx, s->ips, sizeof(s->ips), BPF_F_USER_STACK);
		n = got > 0 ? (u32)((u64)got / 8) : 0;
		if (n > MAX_FRAMES)
			n = MAX_FRAMES;
	}
	struct event_header *h = (struct event_header *)s->ev;
	h->tid = (u32)pid_tgid;
	h->frames = 0;
	h->reads = 1;
	h->flags = 0;
	h->names = 0;
	h->pad = 0;
	s->names_used = 0;
	s->hit_begin = 0;
	s->hit_end = 0;
	__builtin_memset(s->dn, 0, sizeof(s->dn));
	s->dn_next = 0;
	s->checked = 0;
	s->native_used = 0;
	s->native_on = 0;
	s->native_seq = 0;
	// A sample that begins while user space rewrites the native rows is
	// dropped as stale (counted in native_busy): walked without them, its
	// native frames would step by the frame pointer with nothing to say so.
	struct native_state *native = 0;
	u32 busy = 0;
	if (CONFIG.native) {
		native = bpf_map_lookup_elem(&NATIVE_STATE, &zero);
		if (native) {
			s->native_seq = *(volatile u64 *)&native->seq;
			s->native_on = !(s->native_seq & 1);
			busy = s->native_seq & 1;
		}
	}
	// A process without jitmap (CoreCLR alone) has no managers.
	if (!CONFIG.managers) {
		__builtin_memset(s->roots, 0, sizeof(s->roots));
		__builtin_memset(s->after, 0, sizeof(s->after));
		__builtin_memset(s->frameless, 0, sizeof(s->frameless));
	} else if (bpf_probe_read_user(s->roots, sizeof(s->roots), (const void *)CONFIG.managers)) {
		st->unreadable += 1;
		return 0;
	} else {
		// The frameless kinds may change at any time; read once per
		// sample. Unreadable, none is frameless (every stub steps by its
		// frame pointer).
		h->reads += 1;
		if (bpf_probe_read_user(s->frameless, sizeof(s->frameless),
					(const void *)CONFIG.frameless))
			__builtin_memset(s->frameless, 0, sizeof(s->frameless));
	}
	// Each range map's sequence before the first lookup; the sample counts
	// only if all read the same even value after the last.
	u32 stale = busy;
	if (busy)
		st->native_busy += 1;
	for (int m = 0; m < MAX_MANAGERS; m++) {
		u64 root = s->roots[m];
		s->seqs[m] = 0;
		// A root that is no page address is no manager's (only corrupt
		// memory holds one): it is skipped here and in every lookup.
		if (bad_ptr(root, 4096))
			continue;
		h->reads += 1;
		if (bpf_probe_read_user(&s->seqs[m], 8, (const void *)(root + CONFIG.root_seq)) ||
		    (s->seqs[m] & 1))
			stale = 1;
	}
	if (!CONFIG.resolve)
		n = 0;
	struct walk w = {.s = s, .st = st};
	if (!stale && walk) {
		st->walked += 1;
		w.walking = 1;
		w.counted = MAX_FRAMES;
		w.ip = rip;
		w.sp = rsp;
		w.bp = rbp;
		bpf_loop(MAX_FRAMES, frame_cb, &w, 0);
		n = w.frames;
	} else if (!stale && n > 0) {
		w.counted = n;
		bpf_loop(n, frame_cb, &w, 0);
		if (CONFIG.native)
			h->flags |= SAMPLE_UNKNOWN_CODE;
	}
	// A native leaf without a frame pointer, called from JIT code, leaves
	// rbp pointing at its caller's frame: the frame-pointer step then skips
	// that caller. Such a leaf's return address is the word on top of the
	// user stack. When that word differs from the walk's first return
	// address, it is looked up too, as one more frame after the stack's
	// (sent with SAMPLE_TOP_PROBE); if it is a return address into a JIT
	// method, the sample is flagged, and user space counts it.
	u32 top = 0;
	u64 sp = rsp;
	if (user && !stale && n >= 2 && n < MAX_FRAMES && !bad_ptr(sp, 8)) {
		u64 word = 0;
		h->reads += 1;
		if (!bpf_probe_read_user(&word, 8, (const void *)sp) && word != s->ips[1]) {
			// The mask, in assembly so that the compiler keeps it,
			// bounds the index for the verifier.
			u64 slot = n;
			asm volatile("%[slot] &= 63" : [slot] "+r"(slot));
			s->ips[slot] = word;
			top = 1;
			w.walking = 0;
			w.first = n;
			w.counted = n;
			bpf_loop(1, frame_cb, &w, 0);
		}
	}
	h->frames = n + top;
	if (top)
		h->flags |= SAMPLE_TOP_PROBE;
	// Rows user space rewrote while this sample used them may have been
	// torn: the sample is dropped (x86-64 keeps loads in order, so the
	// seq read last is read after every row).
	if (s->native_used && native && *(volatile u64 *)&native->seq != s->native_seq) {
		stale = 1;
		st->native_busy += 1;
	}
	// A manager dropped during the sample clears its entry before freeing
	// its map (whose sequence it leaves odd): either shows here.
	if (!stale && CONFIG.managers) {
		h->reads += 1;
		if (bpf_probe_read_user(s->after, sizeof(s->after), (const void *)CONFIG.managers))
			stale = 1;
	}
	for (int m = 0; m < MAX_MANAGERS; m++) {
		u64 root = s->roots[m];
		u64 again = 0;
		if (stale)
			break;
		if (s->after[m] != root) {
			stale = 1;
			break;
		}
		if (bad_ptr(root, 4096))
			continue;
		h->reads += 1;
		if (bpf_probe_read_user(&again, 8, (const void *)(root + CONFIG.root_seq)) ||
		    again != s->seqs[m])
			stale = 1;
	}
	if (!stale && top) {
		u64 slot = n;
		asm volatile("%[slot] &= 63" : [slot] "+r"(slot));
		struct frame *leaf = (struct frame *)(s->ev + HEADER_BYTES);
		struct frame *caller = (struct frame *)(s->ev + HEADER_BYTES + slot * FRAME_BYTES);
		if (leaf->kind == FRAME_NATIVE && caller->kind == FRAME_METHOD)
			h->flags |= SAMPLE_FRAMELESS_LEAF;
	}
	if (stale) {
		h->flags = SAMPLE_STALE;
		h->frames = 0;
		s->names_used = 0;
		n = 0;
		top = 0;
		st->stale_samples += 1;
	}
	// The names follow the frames.
	u64 frames = n + top;
	if (frames > MAX_FRAMES)
		frames = MAX_FRAMES;
	u64 names_at = HEADER_BYTES + frames * FRAME_BYTES;
	u64 names = s->names_used;
	if (names > NAMES_BYTES)
		names = 0;
	if (names > 0 && bpf_probe_read_kernel(s->ev + names_at, (u32)names, s->names))
		names = 0;
	h->names = (u32)names;
	u64 size = names_at + names;
	// Wake the reader only when the ring is half full: a wakeup per sample
	// costs more than the whole lookup (an interrupt, a VM exit on guests);
	// the reader also drains on a short timer.
	u64 flags = bpf_ringbuf_query(&EVENTS, BPF_RB_AVAIL_DATA) > RING_BYTES / 2 ? BPF_RB_FORCE_WAKEUP
									: BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&EVENTS, s->ev, size, flags))
		st->lost += 1;
	// The whole sample's cost: the walk, every lookup and the output.
	u64 cost = bpf_ktime_get_ns() - t0;
	st->cost_ns += cost;
	if (cost > st->max_cost_ns)
		st->max_cost_ns = cost;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
