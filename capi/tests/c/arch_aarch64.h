/* aarch64 (AAPCS64) code for the C test hosts: little-endian words. */
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

/* The interrupted pc, from a signal handler's context (glibc names the
 * context's registers under _GNU_SOURCE only). */
#ifdef _GNU_SOURCE
static inline uintptr_t arch_context_pc(void *context) {
    return (uintptr_t)((ucontext_t *)context)->uc_mcontext.pc;
}
#endif

static inline size_t arch_word(uint8_t *out, size_t i, uint32_t word) {
    memcpy(out + i, &word, 4);
    return i + 4;
}

/* movz w<rd>, #lo; movk w<rd>, #hi, lsl 16 */
static inline size_t arch_mov32(uint8_t *out, size_t i, unsigned rd, uint32_t value) {
    i = arch_word(out, i, 0x52800000u | (value & 0xFFFFu) << 5 | rd);
    return arch_word(out, i, 0x72A00000u | (value >> 16) << 5 | rd);
}

/* ldr x<rt>, <literal at byte offset `literal`>, written at `i`. */
static inline size_t arch_ldr_literal(uint8_t *out, size_t i, unsigned rt, size_t literal) {
    return arch_word(out, i, 0x58000000u | (uint32_t)((literal - i) / 4) << 5 | rt);
}

#define ARCH_RET 0xD65F03C0u
#define ARCH_BRK 0xD4200000u
#define ARCH_SUBS_W9_1 0x71000529u /* subs w9, w9, #1 */
#define ARCH_BNE_BACK_1 0x54FFFFE1u /* b.ne to the previous instruction */

/* movz w0, #id; movk w0, #id >> 16, lsl 16; movz w9 / movk w9 n;
 * 1: subs w9, w9, #1; b.ne 1b; ret; then brk #0 up to `size`. */
static inline size_t arch_method_code(uint8_t *out, uint32_t id, uint32_t n, size_t size) {
    size_t i = arch_mov32(out, 0, 0, id);
    i = arch_mov32(out, i, 9, n);
    i = arch_word(out, i, ARCH_SUBS_W9_1);
    i = arch_word(out, i, ARCH_BNE_BACK_1);
    i = arch_word(out, i, ARCH_RET);
    for (; i + 4 <= size; i += 4) {
        arch_word(out, i, ARCH_BRK);
    }
    memset(out + i, 0, size - i);
    return size;
}

/* Whether `start` begins a method of arch_method_code, and its id. */
static inline int arch_method_id(const uint8_t *start, uint32_t *id) {
    uint32_t lo, hi;
    memcpy(&lo, start, 4);
    memcpy(&hi, start + 4, 4);
    *id = ((lo >> 5) & 0xFFFFu) | ((hi >> 5) & 0xFFFFu) << 16;
    return (lo & 0xFFE0001Fu) == 0x52800000u && (hi & 0xFFE0001Fu) == 0x72A00000u;
}

/* A leaf that calls enter(context, id) and count(cell), then counts down
 * its argument inside a frame of `frame` bytes (a multiple of 16, 32 to
 * 496: ldp's immediate) whose record is at its bottom, as GCC and Clang lay
 * one out:
 *   stp x29, x30, [sp, #-frame]!; mov x29, sp; str x0, [sp, #16]
 *   ldr x0, =context; mov w1, id; ldr x16, =enter; blr x16
 *   ldr x0, =cell; ldr x16, =count; blr x16
 *   ldr x9, [sp, #16]; 1: subs w9, w9, #1; b.ne 1b
 *   mov w0, id; ldp x29, x30, [sp], #frame; ret
 * then the four literals. */
static inline size_t arch_leaf_code(uint8_t *out, uint32_t id, uint32_t frame, uint64_t context,
                                    uint64_t enter, uint64_t cell, uint64_t count) {
    const size_t literals = 72; /* after the 18 instructions, 8-aligned */
    /* The frame in words, as stp's and ldp's signed 7-bit immediate. */
    const uint32_t words = (frame / 8) & 0x7Fu;
    size_t i = arch_word(out, 0, 0xA9807BFDu | ((0x80u - words) & 0x7Fu) << 15);
    i = arch_word(out, i, 0x910003FDu);
    i = arch_word(out, i, 0xF9000BE0u);
    i = arch_ldr_literal(out, i, 0, literals);
    i = arch_mov32(out, i, 1, id);
    i = arch_ldr_literal(out, i, 16, literals + 8);
    i = arch_word(out, i, 0xD63F0200u); /* blr x16 */
    i = arch_ldr_literal(out, i, 0, literals + 16);
    i = arch_ldr_literal(out, i, 16, literals + 24);
    i = arch_word(out, i, 0xD63F0200u);
    i = arch_word(out, i, 0xF9400BE9u); /* ldr x9, [sp, #16] */
    i = arch_word(out, i, ARCH_SUBS_W9_1);
    i = arch_word(out, i, ARCH_BNE_BACK_1);
    i = arch_mov32(out, i, 0, id);
    i = arch_word(out, i, 0xA8C07BFDu | words << 15); /* ldp x29, x30, [sp], #frame */
    i = arch_word(out, i, ARCH_RET);
    memcpy(out + i, &context, 8);
    memcpy(out + i + 8, &enter, 8);
    memcpy(out + i + 16, &cell, 8);
    memcpy(out + i + 24, &count, 8);
    return i + 32;
}

/* What a JIT rewrites in finished code: a constant and a jump target.
 * movz w0, #lo; movk w0, #hi, lsl 16; b target (code that runs at `at`). */
#define ARCH_CONST_JUMP_LEN 12
static inline uint32_t arch_branch(uintptr_t from, uintptr_t target) {
    return 0x14000000u | ((uint32_t)((int64_t)(target - from) >> 2) & 0x03FFFFFFu);
}

static inline size_t arch_const_jump(uint8_t *out, uintptr_t at, uint32_t value,
                                     uintptr_t target) {
    size_t i = arch_mov32(out, 0, 0, value);
    return arch_word(out, i, arch_branch(at + 8, target));
}

/* The constant's words in arch_const_jump's code, rewritten in place:
 * (offset, length) for make_visible. */
static inline void arch_set_const(uint8_t *code, uint32_t value, uint64_t *offset,
                                  uint64_t *len) {
    arch_mov32(code, 0, 0, value);
    *offset = 0;
    *len = 8;
}

/* The branch's target, rewritten in place. */
static inline void arch_set_jump(uint8_t *code, uintptr_t at, uintptr_t target,
                                 uint64_t *offset, uint64_t *len) {
    arch_word(code, 8, arch_branch(at + 8, target));
    *offset = 8;
    *len = 4;
}

/* add w0, w0, #n (n < 4096); ret. */
static inline size_t arch_add_ret(uint8_t *out, uint32_t n) {
    size_t i = arch_word(out, 0, 0x11000000u | (n & 0xFFFu) << 10);
    return arch_word(out, i, ARCH_RET);
}
