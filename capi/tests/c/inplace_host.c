/* A C JIT's life cycle of one method, as such JITs write it: reserve an
 * upper bound, emit, publish only what was emitted (the tail goes back to
 * the heap), then rewrite a constant and a jump target in place through
 * the block's write address and make each visible, and at the end free the
 * method by the address it runs at. Reader threads look up every byte
 * around the method throughout and check each answer. Prints one line of
 * counts; `wrong` must be 0. JIT_HOST_MODE=wx (the default) or rwx. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "check.h"

#define BOUND 4096 /* the reservation: an upper bound on the method */
#define READERS 2
#define REWRITES 2000

typedef uint32_t (*method_fn)(void);

static jitmap_manager *manager;
static atomic_int stop;
static atomic_ulong lookups, wrong;
/* The method as readers must see it: its start and size (0 while it is
 * not published). The main thread changes the heap and these under a
 * sequence count, odd meanwhile; a reader counts a pass only if the count
 * was even and unchanged across it. */
static atomic_uintptr_t method_start;
static atomic_ulong method_size, sequence;

static jitmap_code publish_exact(jitmap_heap *heap, const uint8_t *code, size_t len,
                                 uint64_t id, const char *name) {
    jitmap_reservation *r;
    uint8_t *write;
    CHECK(jitmap_heap_reserve(heap, len, 0, &r, &write));
    memcpy(write, code, len);
    jitmap_code_info info = {.method_id = id, .name = name, .kind = JITMAP_JIT_OPTIMIZED};
    jitmap_code out;
    CHECK(jitmap_reservation_publish(r, &info, &out));
    return out;
}

/* Looks up every byte of the reservation's span and a little around it:
 * inside the method's code, the method at the right offset; past it (the
 * tail given back), never the method. */
static void *reader_main(void *arg) {
    uintptr_t from = (uintptr_t)arg;
    jitmap_reader *reader;
    CHECK(jitmap_reader_register(manager, &reader));
    while (!atomic_load(&stop)) {
        unsigned long seq = atomic_load(&sequence);
        uintptr_t start = atomic_load(&method_start);
        uint64_t size = atomic_load(&method_size);
        unsigned long bad = 0;
        jitmap_guard guard;
        CHECK(jitmap_pin(reader, &guard));
        for (uintptr_t ip = from - 64; ip < from + BOUND + 64; ip++) {
            jitmap_block b;
            int is_method = jitmap_guard_find(&guard, ip, &b) == JITMAP_STATUS_OK &&
                            b.method_id == 1;
            int inside = size != 0 && ip >= start && ip < start + size;
            if (is_method != inside || (inside && (b.start != start || b.offset != ip - start))) {
                bad++;
            }
        }
        CHECK(jitmap_unpin(&guard));
        atomic_fetch_add(&lookups, BOUND + 128);
        /* Counted only if the method did not change during the pass. */
        if (bad != 0 && atomic_load(&sequence) == seq && seq % 2 == 0) {
            atomic_fetch_add(&wrong, bad);
        }
    }
    CHECK(jitmap_reader_destroy(reader));
    return NULL;
}

static void begin_change(void) {
    atomic_fetch_add(&sequence, 1);
}

static void end_change(uintptr_t start, uint64_t size) {
    atomic_store(&method_start, start);
    atomic_store(&method_size, size);
    atomic_fetch_add(&sequence, 1);
}

int main(void) {
    CHECK(jitmap_manager_create(8, &manager));
    jitmap_heap_config config;
    jitmap_heap_config_default(&config);
    config.span = 1u << 20;
    const char *mode = getenv("JIT_HOST_MODE");
    config.mode = mode && strcmp(mode, "rwx") == 0 ? JITMAP_MEMORY_RWX
                                                   : JITMAP_MEMORY_WRITE_XOR_EXECUTE;
    jitmap_heap *heap;
    CHECK(jitmap_heap_create(manager, &config, &heap));

    /* Two jump targets: add 1000, add 2000. */
    uint8_t code[64];
    jitmap_code targets[2];
    for (uint32_t t = 0; t < 2; t++) {
        size_t n = arch_add_ret(code, 1000 * (t + 1));
        targets[t] = publish_exact(heap, code, n, 10 + t, t ? "add_2000" : "add_1000");
    }

    /* Reserve an upper bound, emit, publish what was emitted. */
    jitmap_reservation *r;
    uint8_t *write;
    uintptr_t at;
    CHECK(jitmap_heap_reserve(heap, BOUND, 0, &r, &write));
    CHECK(jitmap_reservation_code(r, NULL, &at, NULL));
    memset(write, 0xCC, BOUND);
    size_t emitted = arch_const_jump(write, at, 7, targets[0].start);
    unsigned long refused = 0;
    refused += jitmap_reservation_shrink(r, 0) == JITMAP_STATUS_BAD_ARGUMENT;
    refused += jitmap_reservation_shrink(r, BOUND + 1) == JITMAP_STATUS_BAD_ARGUMENT;
    CHECK(jitmap_reservation_shrink(r, emitted));
    uint64_t len;
    CHECK(jitmap_reservation_code(r, NULL, NULL, &len));
    if (len != emitted) atomic_fetch_add(&wrong, 1);
    jitmap_code_info info = {.method_id = 1, .name = "constant_then_jump",
                             .kind = JITMAP_JIT_OPTIMIZED};
    jitmap_code method;
    begin_change();
    CHECK(jitmap_reservation_publish(r, &info, &method));
    if (method.start != at || method.size != emitted) atomic_fetch_add(&wrong, 1);
    end_change(method.start, method.size);

    pthread_t readers[READERS];
    for (int i = 0; i < READERS; i++) {
        pthread_create(&readers[i], NULL, reader_main, (void *)at);
    }

    /* The space given back takes the next block, inside the old bound. */
    size_t n = arch_add_ret(code, 3);
    jitmap_code next = publish_exact(heap, code, n, 2, "in_the_tail");
    unsigned long in_tail = next.start > at && next.start < at + BOUND;

    /* Rewrites in place: the write address, then make_visible. */
    uint8_t *live;
    CHECK(jitmap_heap_write_address(heap, method, &live));
    unsigned long calls = 0, jumps = 0;
    int target = 0;
    for (uint32_t i = 0; i < REWRITES; i++) {
        uint64_t offset, bytes;
        uint32_t value = i * 3 + 1;
        arch_set_const(live, value, &offset, &bytes);
        CHECK(jitmap_heap_make_visible(heap, method, offset, bytes));
        if (i % 2 == 0) {
            target = 1 - target;
            arch_set_jump(live, method.start, targets[target].start, &offset, &bytes);
            CHECK(jitmap_heap_make_visible(heap, method, offset, bytes));
            jumps++;
        }
        uint32_t got = ((method_fn)method.start)();
        if (got != value + 1000u * (uint32_t)(target + 1)) {
            fprintf(stderr, "rewrite %u: got %u\n", i, got);
            atomic_fetch_add(&wrong, 1);
        }
        calls++;
    }

    /* Free by the address it runs at; then no block starts there. */
    jitmap_code by_address;
    CHECK(jitmap_heap_code_at(heap, method.start, &by_address));
    if (by_address.generation != method.generation) atomic_fetch_add(&wrong, 1);
    begin_change();
    CHECK(jitmap_heap_free(heap, by_address));
    end_change(0, 0);
    refused += jitmap_heap_code_at(heap, method.start, &by_address) == JITMAP_STATUS_UNKNOWN_REF;
    refused += jitmap_heap_code_at(heap, method.start + 1, &by_address) ==
               JITMAP_STATUS_UNKNOWN_REF;

    /* A few passes over the freed method, then stop. */
    unsigned long seen = atomic_load(&lookups);
    while (atomic_load(&lookups) < seen + 4 * READERS * (BOUND + 128)) {
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < READERS; i++) {
        pthread_join(readers[i], NULL);
    }
    CHECK(jitmap_heap_free(heap, next));
    for (int t = 0; t < 2; t++) {
        CHECK(jitmap_heap_free(heap, targets[t]));
    }
    CHECK(jitmap_heap_destroy(heap));
    CHECK(jitmap_manager_destroy(manager));
    printf("calls %lu jumps %lu lookups %lu refused %lu in_tail %lu wrong %lu\n", calls, jumps,
           atomic_load(&lookups), refused, in_tail, atomic_load(&wrong));
    return 0;
}
