/*
 * Misuse, as a C host could commit it: every status code is reached at
 * least once (JITMAP_STATUS_INTERNAL aside: it reports a bug in jitmap,
 * never a misuse), and after each refusal the state is checked to be what
 * it was. Prints the statuses reached; exits 1 on any surprise.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitmap.h"

#define STATUSES (JITMAP_STATUS_STUB_KIND_NAMED + 1)

static int reached[STATUSES];
static int failures;

/* Checks that `got` is `want`; records it as reached. */
static void expect_at(jitmap_status got, jitmap_status want, const char *what, int line) {
    if ((unsigned)got < STATUSES) {
        reached[got] = 1;
    }
    if (got != want) {
        const char *m = jitmap_last_error_message();
        fprintf(stderr, "misuse.c:%d: %s gave %s, expected %s (%s)\n", line, what,
                jitmap_status_name(got), jitmap_status_name(want), m ? m : "");
        failures++;
    }
}
#define EXPECT(call, want) expect_at((call), (want), #call, __LINE__)
#define OK(call) EXPECT(call, JITMAP_STATUS_OK)

static void check_at(int ok, const char *what, int line) {
    if (!ok) {
        fprintf(stderr, "misuse.c:%d: %s\n", line, what);
        failures++;
    }
}
#define CHECK(cond) check_at((cond), #cond, __LINE__)

static jitmap_code publish_ret(jitmap_heap *heap, uint64_t id) {
    jitmap_reservation *r;
    uint8_t *w;
    OK(jitmap_heap_reserve(heap, 16, 0, &r, &w));
    memset(w, 0xC3, 16);
    jitmap_code_info info = {.method_id = id, .name = "f", .kind = JITMAP_JIT_BASELINE};
    jitmap_code code;
    OK(jitmap_reservation_publish(r, &info, &code));
    return code;
}

static size_t live_count(jitmap_manager *m) {
    size_t n = 0;
    jitmap_status s = jitmap_manager_live_blocks(m, NULL, 0, &n);
    CHECK(s == (n ? JITMAP_STATUS_BUFFER_TOO_SMALL : JITMAP_STATUS_OK));
    return n;
}

/* The method id a lookup finds at `ip`, or 0. */
static uint64_t find_id(jitmap_reader *reader, uintptr_t ip) {
    jitmap_guard g;
    OK(jitmap_pin(reader, &g));
    jitmap_block b;
    uint64_t id = jitmap_guard_find(&g, ip, &b) == JITMAP_STATUS_OK ? b.method_id : 0;
    OK(jitmap_unpin(&g));
    return id;
}

/* Fills the handle table with counters; how many it made. */
enum { MAX_HANDLES = 1 << 16 };
static size_t fill_handle_table(jitmap_counters **many) {
    size_t made = 0;
    jitmap_status s;
    while ((s = jitmap_counters_create(1, 1, &many[made])) == JITMAP_STATUS_OK) {
        made++;
    }
    EXPECT(s, JITMAP_STATUS_TOO_MANY_HANDLES);
    CHECK(made > MAX_HANDLES - 32 && made < MAX_HANDLES);
    return made;
}

/* Destroys the counters `many[keep..made]`. */
static void empty_handle_table(jitmap_counters **many, size_t made, size_t keep) {
    while (made > keep) {
        OK(jitmap_counters_destroy(many[--made]));
    }
}

static jitmap_reader *main_reader;
static jitmap_executor *main_executor;

static void *other_thread(void *arg) {
    (void)arg;
    EXPECT(jitmap_reader_destroy(main_reader), JITMAP_STATUS_WRONG_THREAD);
    EXPECT(jitmap_executor_quiescent(main_executor), JITMAP_STATUS_WRONG_THREAD);
    jitmap_guard g;
    EXPECT(jitmap_pin(main_reader, &g), JITMAP_STATUS_WRONG_THREAD);
    return NULL;
}

enum { CROWD = 1030 };
static jitmap_agent *crowd_agent;
static pthread_barrier_t attached_all;
static jitmap_status crowd_status[CROWD];

static void *crowd_member(void *arg) {
    size_t i = (size_t)arg;
    jitmap_thread *t = NULL;
    crowd_status[i] = jitmap_agent_attach(crowd_agent, &t);
    pthread_barrier_wait(&attached_all);
    if (crowd_status[i] == JITMAP_STATUS_OK) {
        OK(jitmap_thread_detach(t));
    }
    return NULL;
}

/* A minimal .eh_frame for code at `start` of `size` bytes: one CIE (CFA =
 * rsp + 8, return address at CFA - 8) and one FDE, then the terminator. */
static size_t eh_frame(uint8_t *out, uint64_t start, uint64_t size) {
    size_t i = 0;
    const uint8_t cie[] = {
        20, 0, 0, 0,       /* length */
        0, 0, 0, 0,        /* CIE id */
        1,                 /* version */
        'z', 'R', 0,       /* augmentation */
        1,                 /* code alignment */
        0x78,              /* data alignment -8 */
        16,                /* return address register */
        1, 0x00,           /* augmentation data: FDE pointers absolute, 8 bytes */
        0x0c, 7, 8,        /* DW_CFA_def_cfa rsp, 8 */
        0x90, 1,           /* DW_CFA_offset r16, cfa-8 */
        0, 0,              /* padding */
    };
    memcpy(out, cie, sizeof cie);
    i += sizeof cie;
    uint32_t fde_len = 4 + 8 + 8 + 1 + 3;
    memcpy(out + i, &fde_len, 4);
    uint32_t cie_pointer = (uint32_t)(i + 4);
    memcpy(out + i + 4, &cie_pointer, 4);
    memcpy(out + i + 8, &start, 8);
    memcpy(out + i + 16, &size, 8);
    memset(out + i + 24, 0, 4); /* augmentation data length 0, padding */
    i += 4 + fde_len;
    memset(out + i, 0, 4);
    return i + 4;
}

int main(void) {
    /* Handles that are not handles. */
    jitmap_manager *m = NULL;
    EXPECT(jitmap_manager_create(8, NULL), JITMAP_STATUS_NULL_POINTER);
    EXPECT(jitmap_manager_create(0, &m), JITMAP_STATUS_BAD_ARGUMENT);
    CHECK(m == NULL);
    CHECK(jitmap_last_error_message() != NULL && strstr(jitmap_last_error_message(), "reader_slots"));
    EXPECT(jitmap_manager_destroy(NULL), JITMAP_STATUS_NULL_POINTER);
    EXPECT(jitmap_manager_destroy((jitmap_manager *)(uintptr_t)0x1234), JITMAP_STATUS_BAD_HANDLE);
    int on_stack;
    EXPECT(jitmap_manager_destroy((jitmap_manager *)&on_stack), JITMAP_STATUS_BAD_HANDLE);
    OK(jitmap_manager_create(8, &m));

    jitmap_heap_config config;
    jitmap_heap_config_default(&config);
    config.span = 1u << 20;
    jitmap_heap *heap;
    EXPECT(jitmap_heap_create((jitmap_manager *)(void *)&config, &config, &heap), JITMAP_STATUS_BAD_HANDLE);
    jitmap_heap_config bad = config;
    bad.mode = 7;
    EXPECT(jitmap_heap_create(m, &bad, &heap), JITMAP_STATUS_BAD_ARGUMENT);
    bad = config;
    bad.span = 0;
    EXPECT(jitmap_heap_create(m, &bad, &heap), JITMAP_STATUS_BAD_SPAN);
    bad = config;
    bad.unwind_room = 65537;
    EXPECT(jitmap_heap_create(m, &bad, &heap), JITMAP_STATUS_BAD_ARGUMENT);
    bad = config;
    bad.gdb_jit = 1;
    EXPECT(jitmap_heap_create(m, &bad, &heap), JITMAP_STATUS_GDB_JIT_UNAVAILABLE);
    OK(jitmap_heap_create(m, &config, &heap));
    EXPECT(jitmap_manager_destroy((jitmap_manager *)heap), JITMAP_STATUS_WRONG_HANDLE_KIND);
    EXPECT(jitmap_manager_destroy(m), JITMAP_STATUS_IN_USE);

    OK(jitmap_reader_register(m, &main_reader));
    OK(jitmap_executor_register(m, &main_executor));
    jitmap_code a = publish_ret(heap, 1);
    CHECK(find_id(main_reader, a.start) == 1);
    jitmap_guard g;
    OK(jitmap_pin(main_reader, &g));
    jitmap_block block;
    EXPECT(jitmap_guard_find(&g, 0x1000, &block), JITMAP_STATUS_NOT_FOUND);
    EXPECT(jitmap_guard_find(&g, a.start, NULL), JITMAP_STATUS_NULL_POINTER);
    EXPECT(jitmap_reader_destroy(main_reader), JITMAP_STATUS_IN_USE);
    OK(jitmap_unpin(&g));
    EXPECT(jitmap_unpin(&g), JITMAP_STATUS_DESTROYED);
    EXPECT(jitmap_guard_find(&g, a.start, &block), JITMAP_STATUS_DESTROYED);
    jitmap_guard garbage;
    memset(&garbage, 0x5A, sizeof garbage);
    EXPECT(jitmap_guard_find(&garbage, a.start, &block), JITMAP_STATUS_BAD_HANDLE);
    EXPECT(jitmap_unpin(&garbage), JITMAP_STATUS_BAD_HANDLE);

    pthread_t t;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    OK(jitmap_executor_quiescent(main_executor));
    CHECK(find_id(main_reader, a.start) == 1);

    /* A freed block's bytes wait for the executor's quiescent point, or
     * for it to go offline. */
    jitmap_code gone = publish_ret(heap, 3);
    OK(jitmap_heap_free(heap, gone));
    uint64_t reclaimed = 1;
    OK(jitmap_heap_try_reclaim(heap, &reclaimed));
    CHECK(reclaimed == 0);
    OK(jitmap_executor_offline(main_executor));
    OK(jitmap_heap_try_reclaim(heap, &reclaimed));
    CHECK(reclaimed > 0);
    OK(jitmap_executor_online(main_executor));

    /* A return address names its call's method: the byte before it. */
    OK(jitmap_pin(main_reader, &g));
    OK(jitmap_guard_find_return_address(&g, a.start + 1, &block));
    CHECK(block.method_id == 1 && block.offset == 0);
    EXPECT(jitmap_guard_find_return_address(&g, a.start, &block), JITMAP_STATUS_NOT_FOUND);
    OK(jitmap_unpin(&g));

    /* Reservations. */
    jitmap_reservation *r;
    EXPECT(jitmap_heap_reserve(heap, 0, 0, &r, NULL), JITMAP_STATUS_ZERO_SIZE);
    EXPECT(jitmap_heap_reserve(heap, 1ull << 40, 0, &r, NULL), JITMAP_STATUS_TOO_LARGE);
    EXPECT(jitmap_heap_reserve(heap, 16, 3, &r, NULL), JITMAP_STATUS_BAD_ALIGNMENT);
    jitmap_reservation *big;
    OK(jitmap_heap_reserve(heap, 700 << 10, 0, &big, NULL));
    EXPECT(jitmap_heap_reserve(heap, 700 << 10, 0, &r, NULL), JITMAP_STATUS_HEAP_FULL);
    EXPECT(jitmap_heap_destroy(heap), JITMAP_STATUS_IN_USE);
    OK(jitmap_reservation_abort(big));
    EXPECT(jitmap_reservation_abort(big), JITMAP_STATUS_DESTROYED);
    OK(jitmap_heap_reserve(heap, 700 << 10, 0, &big, NULL)); /* the space came back */
    OK(jitmap_reservation_abort(big));

    OK(jitmap_heap_reserve(heap, 16, 0, &r, NULL));
    uint8_t *w;
    uintptr_t address;
    OK(jitmap_reservation_code(r, &w, &address, NULL));
    memset(w, 0xC3, 16);
    uint8_t unwind_bytes[4] = {1, 2, 3, 4};
    jitmap_unwind_entry past_end = {.begin = 0, .end = 17, .data = unwind_bytes, .len = 4};
    jitmap_code_info info = {.method_id = 2, .name = "g", .kind = JITMAP_JIT_OPTIMIZED,
                             .unwind = &past_end, .unwind_count = 1};
    jitmap_code b;
    EXPECT(jitmap_reservation_publish(r, &info, &b), JITMAP_STATUS_BAD_CODE_INFO);
    size_t blocks_before = live_count(m);
    uint8_t rets[16];
    memset(rets, 0xC3, sizeof rets);
    EXPECT(jitmap_heap_publish(heap, rets, 16, 0, &info, &b), JITMAP_STATUS_BAD_CODE_INFO);
    EXPECT(jitmap_heap_publish(heap, NULL, 16, 0, &info, &b), JITMAP_STATUS_NULL_POINTER);
    CHECK(live_count(m) == blocks_before);
    info.unwind_count = 0;
    info.kind = 9;
    EXPECT(jitmap_reservation_publish(r, &info, &b), JITMAP_STATUS_BAD_ARGUMENT);
    info.kind = JITMAP_JIT_PRECOMPILED; /* images' alone */
    EXPECT(jitmap_reservation_publish(r, &info, &b), JITMAP_STATUS_BAD_ARGUMENT);
    info.kind = JITMAP_JIT_OPTIMIZED;
    info.name = "\xff\xfe";
    EXPECT(jitmap_reservation_publish(r, &info, &b), JITMAP_STATUS_BAD_ARGUMENT);
    info.name = "g";
    info.debug_count = 1; /* with debug == NULL */
    EXPECT(jitmap_reservation_publish(r, &info, &b), JITMAP_STATUS_NULL_POINTER);
    info.debug_count = 0;
    CHECK(find_id(main_reader, address) == 0); /* still unpublished */
    jitmap_unwind_entry whole = {.begin = 0, .end = 16, .data = unwind_bytes, .len = 4};
    uint8_t gc_bytes[3] = {7, 8, 9};
    jitmap_debug_row rows[2] = {{.offset = 0, .line = 10, .column = 2, .file = "a.c"},
                                {.offset = 8, .line = 11, .column = 3, .file = "a.c"}};
    info.unwind = &whole;
    info.unwind_count = 1;
    info.gc_info = gc_bytes;
    info.gc_info_len = 3;
    info.gc_version = 5;
    info.debug = rows;
    info.debug_count = 2;
    info.cold_offset = 12;
    OK(jitmap_reservation_publish(r, &info, &b)); /* the refusals left it pending */
    CHECK(find_id(main_reader, b.start) == 2 && b.start == address);
    jitmap_method_info mi;
    OK(jitmap_pin(main_reader, &g));
    OK(jitmap_guard_find_info(&g, b.start + 9, &mi));
    CHECK(mi.block.method_id == 2 && mi.block.offset == 9 && mi.unwind_len == 4 &&
          memcmp(mi.unwind, unwind_bytes, 4) == 0 && mi.gc_info_len == 3 &&
          memcmp(mi.gc_info, gc_bytes, 3) == 0 && mi.gc_version == 5 && mi.line == 11 &&
          mi.column == 3 && mi.file_len == 3 && mi.hot_size == 12 &&
          mi.cold_start == b.start + 12 && mi.cold_size == 4 && mi.is_funclet == 0);
    OK(jitmap_unpin(&g));
    info.unwind_count = 0;
    info.gc_info_len = 0;
    info.debug_count = 0;
    info.cold_offset = 0;
    EXPECT(jitmap_reservation_publish(r, &info, &b), JITMAP_STATUS_DESTROYED);

    /* Code handles. */
    size_t before = live_count(m);
    OK(jitmap_heap_free(heap, b));
    EXPECT(jitmap_heap_free(heap, b), JITMAP_STATUS_DOUBLE_FREE);
    CHECK(live_count(m) == before - 1);
    jitmap_code forged = a;
    forged.size += 16;
    EXPECT(jitmap_heap_free(heap, forged), JITMAP_STATUS_UNKNOWN_REF);
    forged = a;
    forged.generation += 1000;
    EXPECT(jitmap_heap_free(heap, forged), JITMAP_STATUS_UNKNOWN_REF);
    CHECK(find_id(main_reader, a.start) == 1);
    jitmap_code moved;
    OK(jitmap_heap_move(heap, a, &moved));
    EXPECT(jitmap_heap_free(heap, a), JITMAP_STATUS_MOVED);
    CHECK(find_id(main_reader, moved.start) == 1);
    jitmap_heap *other;
    OK(jitmap_heap_create(m, &config, &other));
    EXPECT(jitmap_heap_free(other, moved), JITMAP_STATUS_FOREIGN_REF);
    CHECK(find_id(main_reader, moved.start) == 1);
    EXPECT(jitmap_heap_patch(heap, moved, 10, unwind_bytes, 8), JITMAP_STATUS_BAD_ARGUMENT);
    uint8_t nop = 0x90;
    OK(jitmap_heap_patch(heap, moved, 0, &nop, 1));
    CHECK(*(const uint8_t *)moved.start == 0x90);
    /* In place: written through the write address, then made visible; a
     * range past the end, or the moved block's old handle, is refused. */
    uint8_t *in_place;
    OK(jitmap_heap_write_address(heap, moved, &in_place));
    in_place[0] = 0xC3;
    OK(jitmap_heap_make_visible(heap, moved, 0, 1));
    CHECK(*(const uint8_t *)moved.start == 0xC3);
    in_place[0] = 0x90;
    OK(jitmap_heap_make_visible(heap, moved, 0, moved.size));
    CHECK(*(const uint8_t *)moved.start == 0x90);
    EXPECT(jitmap_heap_make_visible(heap, moved, moved.size, 1), JITMAP_STATUS_BAD_ARGUMENT);
    EXPECT(jitmap_heap_make_visible(heap, moved, UINT64_MAX, 2), JITMAP_STATUS_BAD_ARGUMENT);
    EXPECT(jitmap_heap_make_visible(heap, a, 0, 1), JITMAP_STATUS_MOVED);
    EXPECT(jitmap_heap_write_address(heap, a, &in_place), JITMAP_STATUS_MOVED);
    EXPECT(jitmap_heap_make_visible(NULL, moved, 0, 1), JITMAP_STATUS_NULL_POINTER);
    /* By address: the live block's handle, exactly; none inside a block, at
     * a moved block's old start, or for another heap's code. */
    jitmap_code by_address = {0};
    OK(jitmap_heap_code_at(heap, moved.start, &by_address));
    CHECK(by_address.start == moved.start && by_address.size == moved.size &&
          by_address.heap_id == moved.heap_id && by_address.generation == moved.generation);
    jitmap_code untouched = by_address;
    EXPECT(jitmap_heap_code_at(heap, moved.start + 1, &by_address), JITMAP_STATUS_UNKNOWN_REF);
    EXPECT(jitmap_heap_code_at(heap, a.start, &by_address), JITMAP_STATUS_UNKNOWN_REF);
    EXPECT(jitmap_heap_code_at(other, moved.start, &by_address), JITMAP_STATUS_UNKNOWN_REF);
    EXPECT(jitmap_heap_code_at(heap, 0, &by_address), JITMAP_STATUS_UNKNOWN_REF);
    EXPECT(jitmap_heap_code_at(heap, moved.start, NULL), JITMAP_STATUS_NULL_POINTER);
    EXPECT(jitmap_heap_write_address(heap, moved, NULL), JITMAP_STATUS_NULL_POINTER);
    CHECK(memcmp(&untouched, &by_address, sizeof by_address) == 0);

    OK(jitmap_heap_reserve(heap, 16, 0, &r, NULL));
    EXPECT(jitmap_reservation_publish_stub(r, 0, &b), JITMAP_STATUS_BAD_STUB_KIND);
    EXPECT(jitmap_reservation_publish_stub(r, 16, &b), JITMAP_STATUS_BAD_STUB_KIND);
    jitmap_code stub;
    OK(jitmap_reservation_publish_stub(r, 3, &stub));
    /* Stub kinds' names: checked kind, strings, length; set once. */
    EXPECT(jitmap_manager_name_stub_kind(m, 0, "misuse", "thunk"), JITMAP_STATUS_BAD_STUB_KIND);
    EXPECT(jitmap_manager_name_stub_kind(m, 3, NULL, "thunk"), JITMAP_STATUS_NULL_POINTER);
    EXPECT(jitmap_manager_name_stub_kind(m, 3, "misuse", ""), JITMAP_STATUS_BAD_ARGUMENT);
    EXPECT(jitmap_manager_name_stub_kind(m, 3, "misuse", "\xff"), JITMAP_STATUS_BAD_ARGUMENT);
    EXPECT(jitmap_manager_name_stub_kind(m, 3, "an owner named at great length",
                                         "and a long name"),
           JITMAP_STATUS_BAD_ARGUMENT);
    CHECK(strstr(jitmap_last_error_message(), "45 bytes together, over 44") != NULL);
    OK(jitmap_manager_name_stub_kind(m, 3, "misuse", "thunk"));
    OK(jitmap_manager_name_stub_kind(m, 3, "misuse", "thunk"));
    EXPECT(jitmap_manager_name_stub_kind(m, 3, "misuse", "other"), JITMAP_STATUS_STUB_KIND_NAMED);
    CHECK(strstr(jitmap_last_error_message(), "stub kind 3 already has another name") != NULL);
    EXPECT(jitmap_manager_declare_frameless_stub(m, 16), JITMAP_STATUS_BAD_STUB_KIND);
    OK(jitmap_manager_declare_frameless_stub(m, 3));
    EXPECT(jitmap_heap_move(heap, stub, &b), JITMAP_STATUS_NOT_A_METHOD);
    CHECK(find_id(main_reader, stub.start) == 0); /* a stub is no method */
    size_t n = 0;
    jitmap_live_block blocks[8];
    EXPECT(jitmap_manager_live_blocks(m, blocks, 1, &n), JITMAP_STATUS_BUFFER_TOO_SMALL);
    CHECK(n == 2);
    OK(jitmap_manager_live_blocks(m, blocks, 8, &n));
    CHECK(n == 2 && (blocks[0].kind == JITMAP_LIVE_BLOCK_STUB || blocks[1].kind == JITMAP_LIVE_BLOCK_STUB));
    OK(jitmap_heap_free(heap, stub));
    OK(jitmap_heap_destroy(other));

    /* Flip mode cannot patch; a registered .eh_frame pins its method. */
    jitmap_heap_config flip = config;
    flip.mode = JITMAP_MEMORY_FLIP_ON_PUBLISH;
    jitmap_heap *flip_heap;
    OK(jitmap_heap_create(m, &flip, &flip_heap));
    jitmap_code f = publish_ret(flip_heap, 5);
    EXPECT(jitmap_heap_patch(flip_heap, f, 0, &nop, 1), JITMAP_STATUS_NOT_PATCHABLE);
    uint8_t *no_alias = NULL;
    EXPECT(jitmap_heap_write_address(flip_heap, f, &no_alias), JITMAP_STATUS_NOT_PATCHABLE);
    CHECK(no_alias == NULL);
    EXPECT(jitmap_heap_make_visible(flip_heap, f, 0, 1), JITMAP_STATUS_NOT_PATCHABLE);
    CHECK(*(const uint8_t *)f.start == 0xC3);
    OK(jitmap_heap_free(flip_heap, f));
    OK(jitmap_heap_destroy(flip_heap));
    jitmap_heap_config unwind = config;
    unwind.register_unwind = 1;
    jitmap_heap *unwind_heap;
    OK(jitmap_heap_create(m, &unwind, &unwind_heap));
    OK(jitmap_heap_reserve(unwind_heap, 16, 0, &r, NULL));
    OK(jitmap_reservation_code(r, &w, &address, NULL));
    memset(w, 0xC3, 16);
    /* An .eh_frame the system unwinder's registration refuses (a record
       length of 2): refused after the info was validated, and the
       reservation stays pending, its bytes as written. */
    uint8_t torn[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    info.eh_frame = torn;
    info.eh_frame_len = sizeof torn;
    info.method_id = 6;
    EXPECT(jitmap_reservation_publish(r, &info, &b), JITMAP_STATUS_BAD_CODE_INFO);
    CHECK(find_id(main_reader, address) == 0);
    CHECK(*(const uint8_t *)w == 0xC3);
    uint8_t frame[64];
    info.eh_frame = frame;
    info.eh_frame_len = eh_frame(frame, address, 16);
    OK(jitmap_reservation_publish(r, &info, &b));
    EXPECT(jitmap_heap_move(unwind_heap, b, &moved), JITMAP_STATUS_POSITION_DEPENDENT);
    CHECK(find_id(main_reader, b.start) == 6);
    OK(jitmap_heap_free(unwind_heap, b));
    OK(jitmap_heap_destroy(unwind_heap));

    /* Readers: slots run out; pins nest, up to a limit. */
    jitmap_manager *small;
    OK(jitmap_manager_create(1, &small));
    jitmap_reader *r1, *r2;
    OK(jitmap_reader_register(small, &r1));
    EXPECT(jitmap_reader_register(small, &r2), JITMAP_STATUS_NO_READER_SLOTS);
    enum { DEPTH = 65535 };
    jitmap_guard *guards = malloc(sizeof(jitmap_guard) * (DEPTH + 1));
    int pinned = 0;
    while (pinned <= DEPTH && jitmap_pin(r1, &guards[pinned]) == JITMAP_STATUS_OK) {
        pinned++;
    }
    CHECK(pinned == DEPTH);
    EXPECT(jitmap_pin(r1, &guards[DEPTH]), JITMAP_STATUS_PINS_TOO_DEEP);
    while (pinned > 0) {
        OK(jitmap_unpin(&guards[--pinned]));
    }
    free(guards);
    OK(jitmap_reader_destroy(r1));
    OK(jitmap_reader_register(small, &r2)); /* its slot came back */
    OK(jitmap_reader_destroy(r2));
    OK(jitmap_manager_destroy(small));
    EXPECT(jitmap_manager_destroy(small), JITMAP_STATUS_DESTROYED);
    EXPECT(jitmap_reader_register(small, &r2), JITMAP_STATUS_DESTROYED);

    /* Counters. */
    jitmap_counters *counters;
    EXPECT(jitmap_counters_create(0, 1, &counters), JITMAP_STATUS_BAD_COUNTER);
    OK(jitmap_counters_create(2, 2, &counters));
    const jitmap_counter_cell *cell;
    EXPECT(jitmap_counters_cell(counters, 2, &cell), JITMAP_STATUS_BAD_COUNTER);
    EXPECT(jitmap_counters_rearm(counters, 0, 5), JITMAP_STATUS_BAD_COUNTER);
    OK(jitmap_counters_cell(counters, 1, &cell));
    CHECK(jitmap_probe_count(cell) == 0 && jitmap_probe_count(cell) == 1);
    uint32_t crossed[2];
    OK(jitmap_counters_take_crossed(counters, crossed, 0, &n));
    CHECK(n == 0); /* no room: carried to the next take */
    OK(jitmap_counters_take_crossed(counters, crossed, 2, &n));
    CHECK(n == 1 && crossed[0] == 1);
    OK(jitmap_counters_rearm(counters, 1, 5));

    /* The handle table fills up. */
    jitmap_counters **many = malloc(sizeof(jitmap_counters *) * MAX_HANDLES);
    size_t made = fill_handle_table(many);
    empty_handle_table(many, made, 0);
    OK(jitmap_counters_destroy(counters));

    /* The agent. */
    jitmap_agent_config ac;
    jitmap_agent_config_default(&ac);
    jitmap_agent_config bad_ac = ac;
    bad_ac.hz = 0;
    jitmap_agent *agent;
    EXPECT(jitmap_agent_start(m, &bad_ac, &agent), JITMAP_STATUS_BAD_AGENT_CONFIG);
    bad_ac = ac;
    bad_ac.clock = 5;
    EXPECT(jitmap_agent_start(m, &bad_ac, &agent), JITMAP_STATUS_BAD_ARGUMENT);
    jitmap_agent_config_default(&bad_ac);
    bad_ac.unwind = 2;
    EXPECT(jitmap_agent_start(m, &bad_ac, &agent), JITMAP_STATUS_BAD_ARGUMENT);
    OK(jitmap_agent_start(m, &ac, &agent));
    jitmap_agent *second;
    EXPECT(jitmap_agent_start(m, &ac, &second), JITMAP_STATUS_AGENT_RUNNING);
    jitmap_thread *thread, *again;
    OK(jitmap_agent_attach(agent, &thread));
    EXPECT(jitmap_agent_attach(agent, &again), JITMAP_STATUS_ALREADY_ATTACHED);
    OK(jitmap_thread_detach(thread));
    EXPECT(jitmap_thread_detach(thread), JITMAP_STATUS_DESTROYED);
    jitmap_profile *profile;
    /* With the handle table full, a stop is refused before the agent is
       touched: it still runs and attaches; one free slot, and it stops. */
    made = fill_handle_table(many);
    EXPECT(jitmap_agent_stop(agent, &profile), JITMAP_STATUS_TOO_MANY_HANDLES);
    empty_handle_table(many, made, made - 1);
    made -= 1;
    OK(jitmap_agent_attach(agent, &thread));
    OK(jitmap_thread_detach(thread));
    OK(jitmap_agent_stop(agent, &profile));
    empty_handle_table(many, made, 0);
    free(many);
    EXPECT(jitmap_agent_stop(agent, &profile), JITMAP_STATUS_DESTROYED);
    EXPECT(jitmap_profile_write(profile, JITMAP_OUTPUT_FOLDED, "/nonexistent/dir/folded.txt"),
           JITMAP_STATUS_SYSTEM);
    CHECK(strstr(jitmap_last_error_message(), "/nonexistent/dir/folded.txt") != NULL);
    EXPECT(jitmap_profile_write(profile, 4, "/tmp/x"), JITMAP_STATUS_BAD_ARGUMENT);
    OK(jitmap_profile_destroy(profile));

    /* 1,024 threads attached at once, process-wide; the next is refused.
     * (MISUSE_NO_CROWD: under an emulator with fewer POSIX timers.) */
    if (!getenv("MISUSE_NO_CROWD")) {
        jitmap_manager *crowded;
        OK(jitmap_manager_create(CROWD + 8, &crowded));
        jitmap_agent_config light = ac;
        light.hz = 1;
        light.ring_capacity = 1;
        light.probe_capacity = 1;
        OK(jitmap_agent_start(crowded, &light, &crowd_agent));
        pthread_barrier_init(&attached_all, NULL, CROWD);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 << 10);
        pthread_t *crowd = malloc(sizeof(pthread_t) * CROWD);
        for (size_t i = 0; i < CROWD; i++) {
            pthread_create(&crowd[i], &attr, crowd_member, (void *)i);
        }
        size_t attached = 0, refused = 0;
        for (size_t i = 0; i < CROWD; i++) {
            pthread_join(crowd[i], NULL);
            if (crowd_status[i] == JITMAP_STATUS_OK) attached++;
            if (crowd_status[i] == JITMAP_STATUS_TOO_MANY_THREADS) refused++;
            if (crowd_status[i] != JITMAP_STATUS_OK) EXPECT(crowd_status[i], JITMAP_STATUS_TOO_MANY_THREADS);
        }
        CHECK(attached == 1024 && refused == CROWD - 1024);
        free(crowd);
        pthread_barrier_destroy(&attached_all);
        OK(jitmap_agent_stop(crowd_agent, &profile));
        OK(jitmap_profile_destroy(profile));
        OK(jitmap_manager_destroy(crowded));
    }

    /* Perf output: one directory per process. */
    const char *perf_dir = getenv("MISUSE_PERF_DIR");
    OK(jitmap_manager_perf(m, JITMAP_PERF_MAP, perf_dir ? perf_dir : "/tmp"));
    EXPECT(jitmap_manager_perf(m, JITMAP_PERF_MAP, "/"), JITMAP_STATUS_PERF_ALREADY_OPEN);
    EXPECT(jitmap_manager_perf(m, 0, "/tmp"), JITMAP_STATUS_BAD_ARGUMENT);
    jitmap_code mapped;
    jitmap_code_info named = {.method_id = 77, .name = "perf_named_method", .kind = JITMAP_JIT_OPTIMIZED};
    OK(jitmap_heap_publish(heap, rets, 16, 0, &named, &mapped));
    printf("perf %lx\n", (unsigned long)mapped.start);
    fflush(stdout);

    /* Teardown in order; each parent refused while a child lives. */
    OK(jitmap_heap_free(heap, moved));
    OK(jitmap_heap_free(heap, mapped));
    EXPECT(jitmap_manager_destroy(m), JITMAP_STATUS_IN_USE);
    OK(jitmap_executor_destroy(main_executor));
    OK(jitmap_reader_destroy(main_reader));
    OK(jitmap_heap_destroy(heap));
    EXPECT(jitmap_heap_destroy(heap), JITMAP_STATUS_DESTROYED);
    OK(jitmap_manager_destroy(m));

    printf("reached");
    int missing = 0;
    for (int i = 0; i < STATUSES; i++) {
        if (reached[i]) {
            printf(" %s", jitmap_status_name((uint32_t)i));
        } else if (i != JITMAP_STATUS_INTERNAL &&
                   !(i == JITMAP_STATUS_TOO_MANY_THREADS && getenv("MISUSE_NO_CROWD"))) {
            fprintf(stderr, "never reached: %s\n", jitmap_status_name((uint32_t)i));
            missing++;
        }
    }
    printf("\n");
    return failures == 0 && missing == 0 ? 0 : 1;
}
