/* tests/test_kv_cache.c: forward() maps the KV cache pages a chunk writes before it writes them
 * (populate_kv_cache in model.c: MADV_POPULATE_WRITE over whole blocks of kv_block_len positions
 * instead of a page fault per 4 KB), and no further: the blocks of positions never reached stay
 * unmapped. Runs the shipped model (models/tinystories.bin, 4 layers x 3 kv heads, head_dim 48:
 * a block of 128 positions is 294,912 bytes, 72 pages of 4 KB, and its context of 256 positions
 * is two blocks) and asks mincore() which pages are resident; with `--kv-cache f16` or `q8` a
 * block is 512 positions, so the context is one block of 256 positions: 147,456 bytes (36 pages)
 * in fp16, 165,888 bytes (rows of 48 int8 and 3 half scales, 40.5 pages) in q8.
 * Both blocks fit in one 2 MB page,
 * which the engine asks for, so the test turns transparent huge pages off for itself
 * (PR_SET_THP_DISABLE) and looks at 4 KB pages. Where the kernel has no MADV_POPULATE_WRITE
 * (Linux before 5.14, other systems) the engine falls back to page faults; that is reported and
 * the page checks are skipped. */
#include <stdint.h>
#include <stdio.h>
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

static const char* const KV_NAME[] = {"fp32", "fp16", "q8"};

/* Block b of both caches: resident (want 1) or not (want 0), every page of it. Not resident means
 * from the block's first whole page on: a q8 block is not a whole number of pages, and the page
 * it shares with the block before is mapped with that one. */
static void check_block(const Transformer* t, int b, int want, const char* when) {
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

/* Returns 0 where MADV_POPULATE_WRITE is missing (the page checks skipped), else 1. */
static int run_case(KVType kv_type) {
    Transformer t;
    char err[256];
    const TransformerOptions opt = {.ctx = 256, .kv_type = kv_type};
    if (transformer_load(&t, "models/tinystories.bin", &opt, err, sizeof err) != 0) {
        check(0, err);
        return 1;
    }
    int supported = 1;
    char what[96];
    snprintf(what, sizeof what, "the cache is %s%s", KV_NAME[kv_type], kv_type ? " as asked" : " by default");
    check(t.state.kv_type == kv_type, what);
    const int bl = kv_block_len(kv_type);
    check(bl == (kv_type == KV_F32 ? 128 : 512), "blocks of 128 positions, 512 for fp16 and q8");
    check(t.config.seq_len == 256, "the shipped model's context is 256 positions");
    int tokens[40];
    for (int i = 0; i < 40; i++) tokens[i] = 100 + i;
    check(forward(&t, tokens, 40, 0, NULL) != NULL, "forward of a 40-token prompt");
    if (bl >= t.config.seq_len) { /* fp16, q8: the context is the first 256 positions of one block */
        check(t.state.kv_populated == t.config.seq_len, "after a 40-token prompt the whole context is populated");
        check_block(&t, 0, 1, "after the prompt");
    } else if (t.state.kv_populated == t.config.seq_len) {
        printf("skipped: MADV_POPULATE_WRITE is not available here; the cache is mapped by page faults\n");
        supported = 0;
    } else {
        check(t.state.kv_populated == bl, "after a 40-token prompt the cache is populated to position 128");
        check_block(&t, 0, 1, "after the prompt");
        check_block(&t, 1, 0, "after the prompt");
        for (int p = 40; p < 140; p++) forward(&t, &tokens[p % 40], 1, p, NULL); /* decode to position 139 */
        check(t.state.kv_populated == 2 * bl, "after decoding to position 139 the cache is populated to 256");
        check_block(&t, 1, 1, "after decoding");
    }
    transformer_free(&t);
    return supported;
}

int main(void) {
#ifdef PR_SET_THP_DISABLE
    prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
#endif
    if (run_case(KV_F32)) { /* without MADV_POPULATE_WRITE the other cases have nothing to tell */
        run_case(KV_F16);
        run_case(KV_Q8);
    }
    return checks_done();
}
