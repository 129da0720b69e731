/*
 * A JIT host in C: it writes machine code (arch.h) for METHODS methods into a jitmap
 * heap, runs them on EXECUTORS threads through a table of call cells, and
 * tiers them up on the main thread: each tier-up reserves, writes and
 * publishes a new version, swaps the cell and frees the old version while
 * executors may still be running it (they declare quiescent points between
 * calls). A SIGPROF timer interrupts every thread; the handler looks up the
 * interrupted address through its thread's reader and checks the answer
 * against the code itself: every version starts by loading its id into the
 * return register, so the bytes at the found start must name the found method.
 *
 * Prints one line of counts; exits 1 on any wrong answer.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>

#include "arch.h"
#include "check.h"

#define METHODS 64
#define EXECUTORS 2
#define RUN_MS 2000


typedef uint32_t (*method_fn)(void);

static jitmap_manager *manager;
static jitmap_heap *heap;
static _Atomic(method_fn) cells[METHODS];
static jitmap_code live[METHODS];
static atomic_int stop;

/* Per thread: the reader its signal handler pins. Initial-exec TLS in the
 * executable: no lazy allocation on first touch in the handler. */
static __thread jitmap_reader *thread_reader;

static atomic_ulong samples, unregistered, found, not_found, wrong, calls, bad_results;

/* Method `id`'s code, `tier` 0 or 1: returns id after counting down n
 * (arch.h), then traps up to a size that differs per tier. */
static size_t method_code(uint8_t *out, uint32_t id, int tier) {
    size_t size = tier == 0 ? 48 + (id % 5) * 16 : 200 + (id % 7) * 40;
    uint32_t n = tier == 0 ? 40000 : 15000;
    return arch_method_code(out, id, n, size);
}

/* Tier 0 is written in place through a reservation; tier 1 is assembled
 * into a buffer and published in one call. */
static jitmap_code publish(uint32_t id, int tier) {
    uint8_t code[512];
    size_t size = method_code(code, id, tier);
    char name[32];
    snprintf(name, sizeof name, "method_%u_tier%d", id, tier);
    jitmap_debug_row row = {.offset = 0, .line = id + 1, .column = 1, .file = "jit_host.c"};
    jitmap_code_info info = {
        .method_id = id,
        .name = name,
        .kind = tier == 0 ? JITMAP_JIT_BASELINE : JITMAP_JIT_OPTIMIZED,
        .debug = &row,
        .debug_count = 1,
    };
    jitmap_code published;
    if (tier == 1) {
        CHECK(jitmap_heap_publish(heap, code, size, 0, &info, &published));
        if (published.size != size) {
            fprintf(stderr, "published %llu bytes of %zu\n", (unsigned long long)published.size, size);
            exit(2);
        }
        return published;
    }
    jitmap_reservation *r;
    uint8_t *write;
    CHECK(jitmap_heap_reserve(heap, size, 0, &r, &write));
    uintptr_t address;
    uint64_t len;
    CHECK(jitmap_reservation_code(r, NULL, &address, &len));
    if (len != size) {
        fprintf(stderr, "reservation of %zu bytes has %llu\n", size, (unsigned long long)len);
        exit(2);
    }
    memcpy(write, code, size);
    CHECK(jitmap_reservation_publish(r, &info, &published));
    if (published.start != address || published.size != size) {
        fprintf(stderr, "published at %#lx (%llu bytes), reserved at %#lx\n",
                (unsigned long)published.start, (unsigned long long)published.size,
                (unsigned long)address);
        exit(2);
    }
    return published;
}

static void on_sigprof(int sig, siginfo_t *si, void *context) {
    (void)sig;
    (void)si;
    uintptr_t ip = arch_context_pc(context);
    atomic_fetch_add(&samples, 1);
    if (thread_reader == NULL) {
        atomic_fetch_add(&unregistered, 1);
        return;
    }
    jitmap_guard guard;
    if (jitmap_pin(thread_reader, &guard) != JITMAP_STATUS_OK) {
        atomic_fetch_add(&wrong, 1);
        return;
    }
    jitmap_method_info info;
    jitmap_status s = jitmap_guard_find_info(&guard, ip, &info);
    const jitmap_block block = info.block;
    if (s == JITMAP_STATUS_OK) {
        atomic_fetch_add(&found, 1);
        /* The code names itself: its id is loaded by its first instructions.
         * The bytes cannot be reused while the guard is pinned. */
        const uint8_t *start = (const uint8_t *)block.start;
        uint32_t id;
        int is_method = arch_method_id(start, &id);
        uint64_t size = info.hot_size + info.cold_size;
        int ok = is_method && id == block.method_id && block.offset == ip - block.start &&
                 block.offset < size && info.line == block.method_id + 1 &&
                 info.file_len == 10 && memcmp(info.file, "jit_host.c", 10) == 0 &&
                 info.funclet_start == block.start && !info.is_funclet &&
                 block.name_len >= 8 && memcmp(block.name, "method_", 7) == 0;
        if (!ok) {
            atomic_fetch_add(&wrong, 1);
        }
    } else if (s == JITMAP_STATUS_NOT_FOUND) {
        /* Native code, or a version freed while this thread still runs it. */
        atomic_fetch_add(&not_found, 1);
    } else {
        atomic_fetch_add(&wrong, 1);
    }
    if (jitmap_unpin(&guard) != JITMAP_STATUS_OK) {
        atomic_fetch_add(&wrong, 1);
    }
}

/* SIGPROF blocked or unblocked on the calling thread. A thread takes the
 * process's SIGPROF only while its reader is registered: it starts with the
 * signal blocked (main blocks it around pthread_create) and blocks it again
 * before it lets its reader go. */
static void sigprof_mask(int how) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPROF);
    pthread_sigmask(how, &set, NULL);
}

static void *executor_main(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    jitmap_executor *executor;
    CHECK(jitmap_reader_register(manager, &thread_reader));
    sigprof_mask(SIG_UNBLOCK);
    CHECK(jitmap_executor_register(manager, &executor));
    while (!atomic_load(&stop)) {
        uint32_t id = (uint32_t)(rand_r(&seed) % METHODS);
        method_fn f = atomic_load_explicit(&cells[id], memory_order_acquire);
        if (f() != id) {
            atomic_fetch_add(&bad_results, 1);
        }
        atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
        CHECK(jitmap_executor_quiescent(executor));
    }
    CHECK(jitmap_executor_destroy(executor));
    sigprof_mask(SIG_BLOCK);
    jitmap_reader *r = thread_reader;
    thread_reader = NULL;
    CHECK(jitmap_reader_destroy(r));
    return NULL;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(void) {
    CHECK(jitmap_manager_create(16, &manager));
    jitmap_heap_config config;
    jitmap_heap_config_default(&config);
    config.span = 4u << 20;
    const char *mode = getenv("JIT_HOST_MODE");
    if (mode && strcmp(mode, "wx") == 0) {
        config.mode = JITMAP_MEMORY_WRITE_XOR_EXECUTE;
    }
    if (mode && strcmp(mode, "flip") == 0) {
        config.mode = JITMAP_MEMORY_FLIP_ON_PUBLISH;
    }
    if (getenv("JIT_HOST_V1")) {
        config.map_version = 1;
    }
    CHECK(jitmap_heap_create(manager, &config, &heap));
    for (uint32_t id = 0; id < METHODS; id++) {
        live[id] = publish(id, 0);
        atomic_store(&cells[id], (method_fn)live[id].start);
    }

    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigprof;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGPROF, &action, NULL);
    struct itimerval timer = {{0, 500}, {0, 500}};
    CHECK(jitmap_reader_register(manager, &thread_reader));
    setitimer(ITIMER_PROF, &timer, NULL);

    pthread_t threads[EXECUTORS];
    sigprof_mask(SIG_BLOCK);
    for (uintptr_t t = 0; t < EXECUTORS; t++) {
        pthread_create(&threads[t], NULL, executor_main, (void *)(t + 1));
    }
    sigprof_mask(SIG_UNBLOCK);
    unsigned seed = 7;
    unsigned long tier_ups = 0, tier_downs = 0;
    int tier[METHODS] = {0};
    double end = now_ms() + RUN_MS;
    while (now_ms() < end) {
        uint32_t id = (uint32_t)(rand_r(&seed) % METHODS);
        int next = 1 - tier[id];
        jitmap_code old = live[id];
        live[id] = publish(id, next);
        atomic_store_explicit(&cells[id], (method_fn)live[id].start, memory_order_release);
        CHECK(jitmap_heap_free(heap, old));
        /* The old handle is spent: a second free is refused, by name. */
        if (jitmap_heap_free(heap, old) != JITMAP_STATUS_DOUBLE_FREE) {
            atomic_fetch_add(&wrong, 1);
        }
        tier[id] = next;
        if (next) tier_ups++; else tier_downs++;
        /* Leave the executors most of the CPU, so most samples land in
         * JIT code. */
        struct timespec pause = {0, 20000};
        nanosleep(&pause, NULL);
    }
    atomic_store(&stop, 1);
    for (int t = 0; t < EXECUTORS; t++) {
        pthread_join(threads[t], NULL);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    signal(SIGPROF, SIG_IGN);

    /* After the run, every live version is found at every byte, and the byte
     * past each is not this method. */
    jitmap_guard guard;
    CHECK(jitmap_pin(thread_reader, &guard));
    unsigned long exact = 0;
    for (uint32_t id = 0; id < METHODS; id++) {
        for (uint64_t off = 0; off < live[id].size; off++) {
            jitmap_block b;
            if (jitmap_guard_find(&guard, live[id].start + off, &b) == JITMAP_STATUS_OK &&
                b.method_id == id && b.start == live[id].start && b.offset == off) {
                exact++;
            } else {
                atomic_fetch_add(&wrong, 1);
            }
        }
        jitmap_block past;
        jitmap_status s = jitmap_guard_find(&guard, live[id].start + live[id].size, &past);
        if (s == JITMAP_STATUS_OK && past.start == live[id].start) {
            atomic_fetch_add(&wrong, 1);
        }
    }
    CHECK(jitmap_unpin(&guard));
    for (uint32_t id = 0; id < METHODS; id++) {
        CHECK(jitmap_heap_free(heap, live[id]));
    }
    CHECK(jitmap_reader_destroy(thread_reader));
    CHECK(jitmap_heap_destroy(heap));
    CHECK(jitmap_manager_destroy(manager));
    printf("tier_ups %lu tier_downs %lu calls %lu samples %lu unregistered %lu found %lu "
           "not_found %lu exact %lu wrong %lu bad_results %lu\n",
           tier_ups, tier_downs, atomic_load(&calls), atomic_load(&samples),
           atomic_load(&unregistered), atomic_load(&found), atomic_load(&not_found), exact,
           atomic_load(&wrong), atomic_load(&bad_results));
    return atomic_load(&wrong) == 0 && atomic_load(&bad_results) == 0 ? 0 : 1;
}
