/* tests/test_kv_cache.c: forward() maps the KV cache pages a chunk writes before it writes them
 * (populate_kv_cache in model.c: MADV_POPULATE_WRITE over whole blocks of kv_block_len positions
 * instead of a page fault per 4 KB), and no further: the blocks of positions never reached stay
 * unmapped. Runs the shipped model (models/tinystories.bin, 4 layers x 3 kv heads, head_dim 48),
 * and asks mincore() which pages are resident. A block of 128 fp32 positions is 294,912 bytes (72
 * pages of 4 KB); fp16 and q8 blocks are 512 positions, 589,824 bytes (144 pages) in fp16 and
 * 331,776 (rows of 48 int8 and 3 half scales, 81 pages) in q8. The model's own context (256) is
 * one such block, so the crossings run on a copy of the file whose header gives a context of
 * 1,536 positions (the weights do not depend on it): every cache type then crosses a block, and
 * the shipped model itself is the case of a context shorter than one block. The cases load one
 * after another in this process, so they also show that a cache is not made of pages an earlier
 * model's cache wrote (alloc_huge_anonymous maps fresh memory; malloc's heap would reuse them).
 * Blocks fit in one 2 MB page, which the engine asks for, so the test turns transparent huge
 * pages off for itself (PR_SET_THP_DISABLE) and looks at 4 KB pages. Where the kernel has no
 * MADV_POPULATE_WRITE (Linux before 5.14, other systems) the engine falls back to page faults;
 * that is reported and the page checks are skipped, as where the call succeeds and maps nothing. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "model.h"

#include "tests/check.h"

/* 1 if every page holding bytes [a, b) is resident, 0 if none is, -1 if some are. */
static int resident(const void* a, const void* b) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)a & ~(page - 1), hi = ((uintptr_t)b + page - 1) & ~(page - 1);
    unsigned char vec[256];
    size_t n = (hi - lo) / page;
    if (n == 0 || n > sizeof vec || mincore((void*)lo, hi - lo, vec) != 0) return -2;
    size_t in = 0;
    for (size_t i = 0; i < n; i++) in += vec[i] & 1;
    return in == n ? 1 : in == 0 ? 0 : -1;
}

#define MODEL_PATH "models/tinystories.bin"
#define LONG_CONTEXT 1536 /* 12 fp32 blocks, 3 of fp16 and q8 */

static const char* const KV_NAME[] = {"fp32", "fp16", "q8"};

/* One decode step at position p. */
static void check_decode(Transformer* t, const int* token, int p) {
    if (forward(t, token, 1, p, NULL) == NULL) {
        char what[64];
        snprintf(what, sizeof what, "forward at position %d", p);
        check(0, what);
    }
}

/* 0 where madvise(MADV_POPULATE_WRITE) succeeds and maps nothing (qemu-user takes it as a hint it may
 * ignore): the engine's calls then tell the page checks nothing, and they are skipped. */
static int page_checks = 1;
static int populate_write_maps(void) {
#ifdef MADV_POPULATE_WRITE
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char* p = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;
    const int ignored = madvise(p, page, MADV_POPULATE_WRITE) == 0 && resident(p, p + page) == 0;
    munmap(p, page);
    return !ignored;
#else
    return 1;
#endif
}

/* Block b of both caches: resident (want 1) or not (want 0), every page of it. Not resident means
 * from the block's first whole page on: a q8 block is not a whole number of pages, and the page
 * it shares with the block before is mapped with that one. */
static void check_block(const Transformer* t, int b, int want, const char* when) {
    if (!page_checks) return;
    const Config* c = &t->config;
    const int bl = kv_block_len(t->state.kv_type);
    const size_t block = (size_t)c->n_layers * c->n_kv_heads * (size_t)bl * t->state.kv_row * kv_elem_bytes(&t->state);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int ok = 1;
    for (int which = 0; which < 2; which++) {
        const char* cache = which ? t->state.value_cache : t->state.key_cache;
        const char* start = cache + b * block;
        if (!want) start = (const char*)(((uintptr_t)start + page - 1) & ~(uintptr_t)(page - 1));
        ok &= resident(start, cache + (b + 1) * block) == want;
    }
    char what[160];
    snprintf(what, sizeof what, "%s: block %d (positions %d..%d) of both %s caches %s", when, b, b * bl,
             (b + 1) * bl - 1, KV_NAME[t->state.kv_type], want ? "mapped" : "not mapped");
    check(ok, what);
}

/* The shipped model with its header's context raised to positions, written to path. */
static int write_longer_context(const char* path, uint32_t positions) {
    FILE* in = fopen(MODEL_PATH, "rb");
    if (in == NULL) return -1;
    fseek(in, 0, SEEK_END);
    const size_t size = (size_t)ftell(in);
    rewind(in);
    unsigned char* bytes = malloc(size);
    int ok = bytes && fread(bytes, 1, size, in) == size && size >= sizeof(FileHeader);
    fclose(in);
    if (ok) {
        FileHeader h;
        memcpy(&h, bytes, sizeof h);
        h.max_seq_len = positions;
        memcpy(bytes, &h, sizeof h);
        FILE* out = fopen(path, "wb");
        ok = out && fwrite(bytes, 1, size, out) == size;
        if (out) ok &= fclose(out) == 0;
    }
    free(bytes);
    return ok ? 0 : -1;
}

/* One cache type in the model at path with a context of ctx positions: a 40-token prompt, then
 * decode to 12 positions past the first block where the context has a second one. Returns 0 where
 * MADV_POPULATE_WRITE is missing (the page checks skipped), else 1. */
static int run_case(const char* path, int ctx, KVType kv_type) {
    Transformer t;
    char err[256];
    const TransformerOptions opt = {.ctx = ctx, .kv_type = kv_type};
    if (transformer_load(&t, path, &opt, err, sizeof err) != 0) {
        check(0, err);
        return 1;
    }
    int supported = 1;
    char what[160];
    snprintf(what, sizeof what, "the cache is %s%s", KV_NAME[kv_type], kv_type ? " as asked" : " by default");
    check(t.state.kv_type == kv_type, what);
    const int bl = kv_block_len(kv_type);
    check(bl == (kv_type == KV_F32 ? 128 : 512), "blocks of 128 positions, 512 for fp16 and q8");
    snprintf(what, sizeof what, "a context of %d positions", ctx);
    check(t.config.seq_len == ctx, what);
    int tokens[40];
    for (int i = 0; i < 40; i++) tokens[i] = 100 + i;
    check(forward(&t, tokens, 40, 0, NULL) != NULL, "forward of a 40-token prompt");
    if (bl >= ctx) { /* the context is the first ctx positions of one block */
        check(t.state.kv_populated == ctx, "after a 40-token prompt the whole context is populated");
        check_block(&t, 0, 1, "after the prompt");
    } else if (t.state.kv_populated == ctx) {
        printf("skipped: MADV_POPULATE_WRITE is not available here; the cache is mapped by page faults\n");
        supported = 0;
    } else {
        snprintf(what, sizeof what, "after a 40-token prompt the cache is populated to position %d", bl);
        check(t.state.kv_populated == bl, what);
        check_block(&t, 0, 1, "after the prompt");
        check_block(&t, 1, 0, "after the prompt");
        const int last = bl + 11;
        for (int p = 40; p <= last; p++) check_decode(&t, &tokens[p % 40], p);
        snprintf(what, sizeof what, "after decoding to position %d the cache is populated to %d", last, 2 * bl);
        check(t.state.kv_populated == 2 * bl, what);
        check_block(&t, 1, 1, "after decoding");
        if (3 * bl <= ctx) check_block(&t, 2, 0, "after decoding");
    }
    transformer_free(&t);
    return supported;
}

int main(void) {
#ifdef PR_SET_THP_DISABLE
    prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
#endif
    const char* build = getenv("BUILD_DIR");
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/test_kv_cache.XXXXXX", build && *build ? build : "build");
    if (mkdtemp(dir) == NULL) {
        printf("FAIL: cannot make a temporary directory %s: %s\n", dir, strerror(errno));
        return 1;
    }
    snprintf(path, sizeof path, "%s/model.bin", dir);
    if (!(page_checks = populate_write_maps()))
        printf("skipped: the page checks: madvise(MADV_POPULATE_WRITE) succeeds here and maps nothing (qemu-user)\n");
    if (write_longer_context(path, LONG_CONTEXT) != 0) {
        check(0, "a copy of " MODEL_PATH " with a longer context written");
    } else if (run_case(path, LONG_CONTEXT, KV_F32)) { /* without MADV_POPULATE_WRITE the rest tells nothing */
        run_case(path, LONG_CONTEXT, KV_F16);
        run_case(path, LONG_CONTEXT, KV_Q8);
        run_case(MODEL_PATH, 256, KV_F16); /* the shipped model: its context within one block */
    }
    unlink(path);
    rmdir(dir);
    return checks_done();
}
