/* tests/test_kv_cache.c: forward() maps the KV cache pages a chunk writes before it writes them
 * (populate_kv_cache in model.c: one MADV_POPULATE_WRITE call per kv head region instead of a page
 * fault per 4 KB), up to the chunk's end rounded up to 32 positions, and no further: the pages of
 * positions never reached stay unmapped. Runs the shipped model (models/tinystories.bin, 4 layers x
 * 3 kv heads, head_dim 48, so 192 bytes per position and region) and asks mincore() which pages are
 * resident. Where the kernel has no MADV_POPULATE_WRITE (Linux before 5.14, other systems) the
 * engine falls back to page faults; that is reported and the page checks are skipped. */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model.h"

static int passed = 0, failed = 0;

static void check(int ok, const char* what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL: %s\n", what);
    }
}

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

/* Every kv head region of both caches: positions [0, mapped) resident, [unmapped, seq_len - 32)
 * not (the last page of a region also holds the start of the next one, which is mapped). */
static void check_regions(const Transformer* t, int mapped, int unmapped, const char* when) {
    const Config* c = &t->config;
    const size_t d = (size_t)c->head_dim, region = (size_t)c->seq_len * d;
    const float* caches[2] = {t->state.key_cache, t->state.value_cache};
    int ok_mapped = 1, ok_unmapped = 1;
    for (int which = 0; which < 2; which++)
        for (size_t i = 0; i < (size_t)c->n_layers * c->n_kv_heads; i++) {
            const float* r = caches[which] + i * region;
            ok_mapped &= resident(r, r + (size_t)mapped * d) == 1;
            ok_unmapped &= resident(r + (size_t)unmapped * d, r + region - 32 * d) == 0;
        }
    char what[160];
    snprintf(what, sizeof what, "%s: positions 0..%d of every kv head region are mapped", when, mapped - 1);
    check(ok_mapped, what);
    snprintf(what, sizeof what, "%s: the pages of positions %d..%d are not", when, unmapped, c->seq_len - 33);
    check(ok_unmapped, what);
}

int main(void) {
    Transformer t;
    char err[256];
    if (transformer_load(&t, "models/tinystories.bin", 256, err, sizeof err) != 0) {
        printf("FAIL: %s\n", err);
        return 1;
    }
    int tokens[40];
    for (int i = 0; i < 40; i++) tokens[i] = 100 + i;
    check(forward(&t, tokens, 40, 0, NULL) != NULL, "forward of a 40-token prompt");
    if (t.state.kv_populated == t.config.seq_len) {
        printf("skipped: MADV_POPULATE_WRITE is not available here; the cache is mapped by page faults\n");
    } else {
        check(t.state.kv_populated == 64, "after a 40-token prompt the cache is populated to position 64");
        check_regions(&t, 64, 128, "after the prompt");
        for (int p = 40; p < 70; p++) forward(&t, &tokens[p % 40], 1, p, NULL); /* decode to position 69 */
        check(t.state.kv_populated == 96, "after decoding to position 69 the cache is populated to position 96");
        check_regions(&t, 96, 128, "after decoding");
    }
    transformer_free(&t);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
