/* x86-64 (System V) code for the C test hosts. */
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

/* The interrupted pc, from a signal handler's context (glibc names the
 * context's registers under _GNU_SOURCE only). */
#ifdef _GNU_SOURCE
static inline uintptr_t arch_context_pc(void *context) {
    return (uintptr_t)((ucontext_t *)context)->uc_mcontext.gregs[REG_RIP];
}
#endif

static inline size_t arch_put(uint8_t *out, size_t i, const void *bytes, size_t n) {
    memcpy(out + i, bytes, n);
    return i + n;
}

/* mov eax, id; mov ecx, n; 1: dec ecx; jnz 1b; ret; then int3 up to `size`. */
static inline size_t arch_method_code(uint8_t *out, uint32_t id, uint32_t n, size_t size) {
    const uint8_t loop[] = {0xFF, 0xC9, 0x75, 0xFC, 0xC3}; /* dec ecx; jnz -4; ret */
    size_t i = 0;
    out[i++] = 0xB8;
    i = arch_put(out, i, &id, 4);
    out[i++] = 0xB9;
    i = arch_put(out, i, &n, 4);
    i = arch_put(out, i, loop, sizeof loop);
    memset(out + i, 0xCC, size - i);
    return size;
}

/* Whether `start` begins a method of arch_method_code, and its id. */
static inline int arch_method_id(const uint8_t *start, uint32_t *id) {
    memcpy(id, start + 1, 4);
    return start[0] == 0xB8;
}

/* A leaf that calls enter(context, id) and count(cell), then counts down
 * its argument inside a frame-pointer frame and returns id:
 *   push rbp; mov rbp, rsp; push rdi; sub rsp, 8
 *   mov rdi, context; mov esi, id; mov rax, enter; call rax
 *   mov rdi, cell; mov rax, count; call rax
 *   add rsp, 8; pop rcx; 1: dec ecx; jnz 1b; mov eax, id; pop rbp; ret */
static inline size_t arch_leaf_code(uint8_t *out, uint32_t id, uint32_t frame_bytes,
                                    uint64_t context, uint64_t enter, uint64_t cell,
                                    uint64_t count) {
    /* push rbp puts the record at the top of every x86-64 frame: its size
     * changes nothing a walk reads. */
    (void)frame_bytes;
    const uint8_t frame[] = {0x55, 0x48, 0x89, 0xE5, 0x57, 0x48, 0x83, 0xEC, 0x08};
    const uint8_t mov_rdi[] = {0x48, 0xBF}, mov_esi = 0xBE, mov_rax[] = {0x48, 0xB8};
    const uint8_t call_rax[] = {0xFF, 0xD0};
    const uint8_t loop[] = {0x48, 0x83, 0xC4, 0x08, 0x59, 0xFF, 0xC9, 0x75, 0xFC, 0xB8};
    const uint8_t epilogue[] = {0x5D, 0xC3};
    size_t i = arch_put(out, 0, frame, sizeof frame);
    i = arch_put(out, i, mov_rdi, 2);
    i = arch_put(out, i, &context, 8);
    i = arch_put(out, i, &mov_esi, 1);
    i = arch_put(out, i, &id, 4);
    i = arch_put(out, i, mov_rax, 2);
    i = arch_put(out, i, &enter, 8);
    i = arch_put(out, i, call_rax, 2);
    i = arch_put(out, i, mov_rdi, 2);
    i = arch_put(out, i, &cell, 8);
    i = arch_put(out, i, mov_rax, 2);
    i = arch_put(out, i, &count, 8);
    i = arch_put(out, i, call_rax, 2);
    i = arch_put(out, i, loop, sizeof loop);
    i = arch_put(out, i, &id, 4);
    return arch_put(out, i, epilogue, sizeof epilogue);
}

/* What a JIT rewrites in finished code: a constant and a jump target.
 * mov eax, value; jmp rel32 target (code that runs at `at`). */
#define ARCH_CONST_JUMP_LEN 10
static inline size_t arch_const_jump(uint8_t *out, uintptr_t at, uint32_t value,
                                     uintptr_t target) {
    int32_t rel = (int32_t)(target - (at + ARCH_CONST_JUMP_LEN));
    out[0] = 0xB8;
    memcpy(out + 1, &value, 4);
    out[5] = 0xE9;
    memcpy(out + 6, &rel, 4);
    return ARCH_CONST_JUMP_LEN;
}

/* The constant's bytes in arch_const_jump's code, rewritten in place:
 * (offset, length) for make_visible. */
static inline void arch_set_const(uint8_t *code, uint32_t value, uint64_t *offset,
                                  uint64_t *len) {
    memcpy(code + 1, &value, 4);
    *offset = 1;
    *len = 4;
}

/* The jump's target, rewritten in place. */
static inline void arch_set_jump(uint8_t *code, uintptr_t at, uintptr_t target,
                                 uint64_t *offset, uint64_t *len) {
    int32_t rel = (int32_t)(target - (at + ARCH_CONST_JUMP_LEN));
    memcpy(code + 6, &rel, 4);
    *offset = 6;
    *len = 4;
}

/* add eax, n; ret. */
static inline size_t arch_add_ret(uint8_t *out, uint32_t n) {
    out[0] = 0x05;
    memcpy(out + 1, &n, 4);
    out[5] = 0xC3;
    return 6;
}
