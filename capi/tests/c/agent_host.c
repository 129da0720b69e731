/*
 * The agent profiling a C host's JIT code: three JIT leaves with the same
 * body (a count-down loop inside a frame-pointer frame) run for 1, 2 and 4
 * units of work each round, so their shares of CPU time are 1:2:4. Each
 * call goes through the entry probe and the call-counting probe, plain C
 * calls. The agent samples the thread; at the end the four outputs are
 * written to the directory given as the first argument. Runs 3 s.
 *
 * Prints "samples S dropped D crossed C"; the test reads the folded stacks.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"


typedef uint32_t (*leaf_fn)(uint32_t iterations);

/* push rbp; mov rbp, rsp; mov ecx, edi; 1: dec ecx; jnz 1b; mov eax, id;
 * pop rbp; ret */
static size_t leaf_code(uint8_t *out, uint32_t id) {
    const uint8_t prologue[] = {0x55, 0x48, 0x89, 0xE5, 0x89, 0xF9, 0xFF, 0xC9, 0x75, 0xFC, 0xB8};
    const uint8_t epilogue[] = {0x5D, 0xC3};
    size_t i = 0;
    memcpy(out, prologue, sizeof prologue);
    i += sizeof prologue;
    memcpy(out + i, &id, 4);
    i += 4;
    memcpy(out + i, epilogue, sizeof epilogue);
    return i + sizeof epilogue;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
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

    const char *names[3] = {"leaf_1x", "leaf_2x", "leaf_4x"};
    leaf_fn leaves[3];
    jitmap_code codes[3];
    for (uint32_t i = 0; i < 3; i++) {
        uint8_t code[32];
        size_t size = leaf_code(code, i + 1);
        jitmap_reservation *r;
        uint8_t *write;
        CHECK(jitmap_heap_reserve(heap, size, 0, &r, &write));
        memcpy(write, code, size);
        jitmap_code_info info = {.method_id = i + 1, .name = names[i], .kind = JITMAP_JIT_OPTIMIZED};
        CHECK(jitmap_reservation_publish(r, &info, &codes[i]));
        leaves[i] = (leaf_fn)codes[i].start;
    }

    jitmap_counters *counters;
    CHECK(jitmap_counters_create(3, 1000, &counters));
    const jitmap_counter_cell *cells[3];
    for (uint32_t i = 0; i < 3; i++) {
        CHECK(jitmap_counters_cell(counters, i, &cells[i]));
    }

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

    const uint32_t unit = 200000;
    unsigned long wrong = 0;
    double end = now_s() + 3.0;
    while (now_s() < end) {
        for (uint32_t i = 0; i < 3; i++) {
            jitmap_probe_enter(context, i + 1);
            jitmap_probe_count(cells[i]);
            if (leaves[i](unit << i) != i + 1) {
                wrong++;
            }
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
    uint64_t samples, dropped;
    CHECK(jitmap_profile_samples(profile, &samples, &dropped));
    CHECK(jitmap_profile_destroy(profile));
    CHECK(jitmap_counters_destroy(counters));
    for (int i = 0; i < 3; i++) {
        CHECK(jitmap_heap_free(heap, codes[i]));
    }
    CHECK(jitmap_heap_destroy(heap));
    CHECK(jitmap_manager_destroy(manager));
    printf("samples %llu dropped %llu crossed %zu wrong %lu\n", (unsigned long long)samples,
           (unsigned long long)dropped, crossed_count, wrong);
    return wrong == 0 ? 0 : 1;
}
