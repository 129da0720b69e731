/*
 * The agent profiling a C host's JIT code: three JIT leaves with the same
 * body (a count-down loop inside a frame-pointer frame) run for 1, 2 and 4
 * units of work each round, so their shares of CPU time are 1:2:4. Each
 * leaf calls the entry probe and the call-counting probe itself, as tier-0
 * code does: plain C functions, called by address from JIT code. The agent samples the thread; at the end the four outputs are
 * written to the directory given as the first argument. Runs 3 s.
 *
 * Prints "samples S periods P dropped D crossed C"; the test reads the folded stacks.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arch.h"
#include "check.h"

typedef uint32_t (*leaf_fn)(uint32_t iterations);

/* A leaf that calls both probes itself, as tier-0 code does, then counts
 * down `iterations` inside a frame of `frame` bytes (arch.h). */
static size_t leaf_code(uint8_t *out, uint32_t id, uint32_t frame,
                        const jitmap_probe_context *context, const jitmap_counter_cell *cell) {
    return arch_leaf_code(out, id, frame, (uint64_t)(uintptr_t)context,
                          (uint64_t)(uintptr_t)&jitmap_probe_enter, (uint64_t)(uintptr_t)cell,
                          (uint64_t)(uintptr_t)&jitmap_probe_count);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* The CPU time this thread has run: what its wall-clock timer can sample
 * (a timer that fires while the thread waits for a CPU is delivered once,
 * when it runs again). */
static double thread_cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: agent_host OUT_DIR\n");
        return 2;
    }
    jitmap_manager *manager;
    CHECK(jitmap_manager_create(8, &manager));
    jitmap_heap_config config;
    jitmap_heap_config_default(&config);
    config.span = 1u << 20;
    jitmap_heap *heap;
    CHECK(jitmap_heap_create(manager, &config, &heap));

    jitmap_agent_config agent_config;
    jitmap_agent_config_default(&agent_config);
    /* Wall-clock timers are high-resolution: 1,000 samples a second even
     * where the kernel's tick would limit CPU-time timers. */
    agent_config.clock = JITMAP_CLOCK_WALL;
    jitmap_agent *agent;
    CHECK(jitmap_agent_start(manager, &agent_config, &agent));
    jitmap_thread *thread;
    CHECK(jitmap_agent_attach(agent, &thread));
    const jitmap_probe_context *context;
    CHECK(jitmap_thread_probe_context(thread, &context));

    /* Each leaf's counter crosses at its 100th call; the loop below runs
     * at least that many rounds whatever the machine's speed. */
    enum { CROSS_AT = 100 };
    jitmap_counters *counters;
    CHECK(jitmap_counters_create(3, CROSS_AT, &counters));
    const jitmap_counter_cell *cells[3];
    for (uint32_t i = 0; i < 3; i++) {
        CHECK(jitmap_counters_cell(counters, i, &cells[i]));
    }

    const char *names[3] = {"leaf_1x", "leaf_2x", "leaf_4x"};
    leaf_fn leaves[3];
    jitmap_code codes[3];
    for (uint32_t i = 0; i < 3; i++) {
        uint8_t code[128];
        /* leaf_2x's frame is 80 bytes, the others' 32: on aarch64 the
         * record is at the bottom of each, as GCC puts it. */
        size_t size = leaf_code(code, i + 1, i == 1 ? 80 : 32, context, cells[i]);
        jitmap_reservation *r;
        uint8_t *write;
        CHECK(jitmap_heap_reserve(heap, size, 0, &r, &write));
        memcpy(write, code, size);
        jitmap_code_info info = {.method_id = i + 1, .name = names[i], .kind = JITMAP_JIT_OPTIMIZED};
        CHECK(jitmap_reservation_publish(r, &info, &codes[i]));
        leaves[i] = (leaf_fn)codes[i].start;
    }

    /* Each round's unit of work is drawn from 100,000 to 299,999 (mean
     * 200,000): rounds of one fixed length alias with the 1 ms sampling
     * period and put whole runs of samples in one leaf (leaf_1x took 7% to
     * 37% of them with a fixed unit, against 14.3%). */
    uint64_t rng = 0x9E3779B97F4A7C15u;
    unsigned long wrong = 0, calls = 0;
    /* Three seconds of this thread's CPU (three on an idle machine, longer
     * on a busy one), at most two minutes; looked at every 64 rounds (the
     * clock is a system call, where pending signals land), and never
     * fewer than CROSS_AT rounds (under qemu-user on a loaded machine,
     * three seconds once gave 831). */
    double cpu_end = thread_cpu_s() + 3.0, cap = now_s() + 120.0;
    for (unsigned long round = 1;
         round <= CROSS_AT || round % 64 != 0 || (thread_cpu_s() < cpu_end && now_s() < cap);
         round++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        uint32_t unit = 100000 + (uint32_t)(rng % 200000);
        for (uint32_t i = 0; i < 3; i++) {
            if (leaves[i](unit << i) != i + 1) {
                wrong++;
            }
            calls++;
        }
    }
    uint32_t crossed[3];
    size_t crossed_count;
    CHECK(jitmap_counters_take_crossed(counters, crossed, 3, &crossed_count));

    CHECK(jitmap_thread_detach(thread));
    jitmap_profile *profile;
    CHECK(jitmap_agent_stop(agent, &profile));
    const char *files[4] = {"report.txt", "folded.txt", "flamegraph.svg", "profile.pb.gz"};
    const jitmap_output formats[4] = {JITMAP_OUTPUT_REPORT, JITMAP_OUTPUT_FOLDED,
                                      JITMAP_OUTPUT_FLAMEGRAPH, JITMAP_OUTPUT_PPROF};
    for (int f = 0; f < 4; f++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], files[f]);
        CHECK(jitmap_profile_write(profile, formats[f], path));
    }
    uint64_t samples, dropped, periods, coalesced;
    CHECK(jitmap_profile_samples(profile, &samples, &dropped));
    CHECK(jitmap_profile_periods(profile, &periods, &coalesced));
    if (periods != samples + coalesced) {
        fprintf(stderr, "periods %llu != samples %llu + coalesced %llu\n",
                (unsigned long long)periods, (unsigned long long)samples,
                (unsigned long long)coalesced);
        return 1;
    }
    /* Each dropped sample stood for one period or more; none gave up
     * (every leaf's load event came). */
    uint64_t dropped_periods, gave_up;
    CHECK(jitmap_profile_losses(profile, &dropped_periods, &gave_up));
    if (dropped_periods < dropped || gave_up != 0) {
        fprintf(stderr, "dropped %llu samples standing for %llu periods; %llu gave up\n",
                (unsigned long long)dropped, (unsigned long long)dropped_periods,
                (unsigned long long)gave_up);
        return 1;
    }
    /* The agent measured its own cost: handlers and collector both ran. */
    uint64_t handler_ns, collector_ns;
    CHECK(jitmap_profile_agent_cpu(profile, &handler_ns, &collector_ns));
    if (handler_ns == 0 || collector_ns == 0) {
        fprintf(stderr, "agent cpu: handlers %llu ns, collector %llu ns\n",
                (unsigned long long)handler_ns, (unsigned long long)collector_ns);
        return 1;
    }
    CHECK(jitmap_profile_destroy(profile));
    CHECK(jitmap_counters_destroy(counters));
    for (int i = 0; i < 3; i++) {
        CHECK(jitmap_heap_free(heap, codes[i]));
    }
    CHECK(jitmap_heap_destroy(heap));
    CHECK(jitmap_manager_destroy(manager));
    printf("samples %llu periods %llu dropped %llu crossed %zu calls %lu wrong %lu\n",
           (unsigned long long)samples, (unsigned long long)periods, (unsigned long long)dropped,
           crossed_count, calls, wrong);
    return wrong == 0 ? 0 : 1;
}
