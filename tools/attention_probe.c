/* Decode attention of the Qwen3-0.6B shape (28 layers x 8 kv heads = 224 groups of 2 queries,
 * head_dim 128) over two layouts of the KV cache, with the caches flushed before each pass as the
 * matmuls between two layers flush them in decode: the layout of the twelfth session (each kv
 * head's positions in one region of the context's length, 4 KB pages) and the engine's blocks of
 * KV_BLOCK_LEN positions in 2 MB pages (model.c, "The KV cache"). Both go through the engine's
 * attention_group. Rounds alternate between the layouts; medians are printed. One thread. Build and
 * run from the repository root:
 *
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -march=native -I. -o build/attention_probe tools/attention_probe.c \
 *       $(ls *.c | grep -v '^run.c$') -lm -lpthread && build/attention_probe [rounds]
 *
 * Findings on the 2-core development VM: docs/notes-kernels.md, "Thirteenth session". */
#include "kernels.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define GROUPS (28 * 8)
#define D 128
#define NQ 2
#define CTX 4096

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 7;
    const size_t bytes = (size_t)GROUPS * CTX * D * sizeof(float);
    /* regions: [group][CTX][D] in 4 KB pages; blocks: [CTX / B][group][B][D] in 2 MB pages */
    float *rk = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    float *rv = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    float *bk = alloc_huge_anonymous(bytes), *bv = alloc_huge_anonymous(bytes);
    const size_t flush_bytes = (size_t)128 << 20;
    unsigned char* flush = malloc(flush_bytes);
    float *q = malloc((size_t)GROUPS * NQ * D * sizeof(float)), *out = malloc((size_t)GROUPS * NQ * D * sizeof(float));
    float* att = malloc((size_t)NQ * CTX * sizeof(float));
    if (rk == MAP_FAILED || rv == MAP_FAILED || !bk || !bv || !flush || !q || !out || !att || rounds < 1 || rounds > 99) {
        fprintf(stderr, "attention_probe: out of memory (or rounds not in 1..99)\n");
        return 1;
    }
#ifdef MADV_NOHUGEPAGE
    madvise(rk, bytes, MADV_NOHUGEPAGE);
    madvise(rv, bytes, MADV_NOHUGEPAGE);
#endif
    /* The regions' pages mapped as the twelfth session's engine did: 32 positions at a time, one
     * MADV_POPULATE_WRITE per region (where the call exists), keys then values. */
    for (size_t p0 = 0; p0 < CTX; p0 += 32)
        for (int which = 0; which < 2; which++)
            for (size_t g = 0; g < GROUPS; g++)
                madvise((which ? rv : rk) + (g * CTX + p0) * D, 32 * D * sizeof(float), 23 /* MADV_POPULATE_WRITE */);
    for (size_t i = 0; i < bytes / sizeof(float); i++) {
        rk[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
        rv[i] = (float)((i * 40503u) % 2001) * 1e-3f - 1.0f;
    }
    for (size_t g = 0; g < GROUPS; g++) /* the same rows in blocks */
        for (size_t p = 0; p < CTX; p++) {
            size_t at = ((p / KV_BLOCK_LEN * GROUPS + g) * KV_BLOCK_LEN + p % KV_BLOCK_LEN) * D;
            memcpy(bk + at, rk + (g * CTX + p) * D, D * sizeof(float));
            memcpy(bv + at, rv + (g * CTX + p) * D, D * sizeof(float));
        }
    memset(flush, 1, flush_bytes);
    for (int i = 0; i < GROUPS * NQ * D; i++) q[i] = (float)(i % 17) * 0.1f - 0.8f;
    const int npos[] = {64, 256, 1024};
    printf("decode attention, %d groups of %d queries, head_dim %d, 1 thread: ms per token, median of %d "
           "alternating rounds [min..max]\n", GROUPS, NQ, D, rounds);
    volatile unsigned sink = 0;
    for (int k = 0; k < 3; k++) {
        const int n = npos[k];
        double t[2][99];
        for (int r = 0; r < rounds; r++)
            for (int i = 0; i < 2; i++) {
                const int layout = r % 2 ? 1 - i : i;
                unsigned s = 0;
                for (size_t b = 0; b < flush_bytes; b += 64) s += flush[b];
                sink += s;
                double t0 = now_s();
                for (int g = 0; g < GROUPS; g++) {
                    KVRows rows = layout == 0
                        ? (KVRows){rk + (size_t)g * CTX * D, rv + (size_t)g * CTX * D, D, CTX, 0}
                        : (KVRows){bk + (size_t)g * KV_BLOCK_LEN * D, bv + (size_t)g * KV_BLOCK_LEN * D, D, KV_BLOCK_LEN,
                                   (size_t)GROUPS * KV_BLOCK_LEN * D};
                    attention_group(out + (size_t)g * NQ * D, q + (size_t)g * NQ * D, NQ, &rows, n, D, 0.0884f, att);
                }
                t[layout][r] = (now_s() - t0) * 1e3;
            }
        const double mb = 2.0 * GROUPS * n * D * sizeof(float) / 1e6;
        for (int layout = 0; layout < 2; layout++) {
            qsort(t[layout], (size_t)rounds, sizeof(double), cmp_double);
            const double med = t[layout][rounds / 2];
            printf("  %4d positions, %-32s %6.3f ms [%.3f..%.3f]  %5.1f GB/s of keys and values\n", n,
                   layout == 0 ? "regions in 4 KB pages:" : "blocks of 128 in 2 MB pages:", med, t[layout][0],
                   t[layout][rounds - 1], mb / med);
        }
    }
    return sink == 12345 ? 2 : 0; /* keeps the flush reads */
}
