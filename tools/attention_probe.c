/* Decode attention of the Qwen3-0.6B shape (28 layers x 8 kv heads = 224 groups of 2 queries,
 * head_dim 128) over the engine's KV cache layout (model.c "The KV cache": blocks of KV_BLOCK_LEN
 * positions of fp32 elements, or of twice as many fp16 ones with `--kv-cache f16`, in 2 MB pages;
 * PROBE_F16_BLOCK=N at compile time gives the fp16 cache blocks of N positions instead), the same
 * numbers in both (values exactly representable as halves), with the caches flushed before each pass as
 * the matmuls between two layers flush them in decode. Both go through the engine's
 * attention_group. Rounds alternate between the two; medians are printed. One thread. Build and run
 * from the repository root:
 *
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -march=native -I. -o build/attention_probe tools/attention_probe.c \
 *       $(ls *.c | grep -v '^run.c$') -lm -lpthread && build/attention_probe [rounds]
 *
 * Findings on the 2-core development VMs: docs/notes-kernels.md, "Thirteenth session" (the blocked
 * layout against the earlier one, with this file's version of then) and "Twentieth session" (fp16). */
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
#ifndef PROBE_F16_BLOCK
#define PROBE_F16_BLOCK (2 * KV_BLOCK_LEN)
#endif

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
    const size_t n_elems = (size_t)GROUPS * CTX * D;
    /* [CTX / B][group][B][D], as model.c's kv_offset with 28 layers x 8 kv heads as 224 groups */
    float *k32 = alloc_huge_anonymous(n_elems * sizeof(float)), *v32 = alloc_huge_anonymous(n_elems * sizeof(float));
    uint16_t *k16 = alloc_huge_anonymous(n_elems * sizeof(uint16_t));
    uint16_t *v16 = alloc_huge_anonymous(n_elems * sizeof(uint16_t));
    const size_t flush_bytes = (size_t)128 << 20;
    unsigned char* flush = malloc(flush_bytes);
    float *q = malloc((size_t)GROUPS * NQ * D * sizeof(float)), *out = malloc((size_t)GROUPS * NQ * D * sizeof(float));
    float* att = malloc((size_t)NQ * CTX * sizeof(float));
    if (!k32 || !v32 || !k16 || !v16 || !flush || !q || !out || !att || rounds < 1 || rounds > 99) {
        fprintf(stderr, "attention_probe: out of memory (or rounds not in 1..99)\n");
        return 1;
    }
    /* [CTX / B][group][B][D] with B = KV_BLOCK_LEN (fp32) or PROBE_F16_BLOCK (fp16), position p of
     * group g filled with the same number in both */
    for (size_t g = 0; g < GROUPS; g++)
        for (size_t p = 0; p < CTX; p++)
            for (size_t i = 0; i < D; i++) {
                const size_t src = (g * CTX + p) * D + i;
                const size_t a32 = ((p / KV_BLOCK_LEN * GROUPS + g) * KV_BLOCK_LEN + p % KV_BLOCK_LEN) * D + i;
                const size_t a16 = ((p / PROBE_F16_BLOCK * GROUPS + g) * PROBE_F16_BLOCK + p % PROBE_F16_BLOCK) * D + i;
                k16[a16] = float_to_half((float)((src * 2654435761u) % 2001) * 1e-3f - 1.0f);
                v16[a16] = float_to_half((float)((src * 40503u) % 2001) * 1e-3f - 1.0f);
                k32[a32] = half_to_float(k16[a16]);
                v32[a32] = half_to_float(v16[a16]);
            }
    memset(flush, 1, flush_bytes);
    for (int i = 0; i < GROUPS * NQ * D; i++) q[i] = (float)(i % 17) * 0.1f - 0.8f;
    const int npos[] = {64, 256, 1024, 4096};
    printf("decode attention, %d groups of %d queries, head_dim %d, 1 thread: ms per token, median of %d "
           "alternating rounds [min..max]\n", GROUPS, NQ, D, rounds);
    volatile unsigned sink = 0;
    for (int k = 0; k < 4; k++) {
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
                    const int bl = layout == 0 ? KV_BLOCK_LEN : PROBE_F16_BLOCK;
                    const size_t at = (size_t)g * bl * D, block = (size_t)GROUPS * bl * D;
                    KVRows rows = layout == 0 ? (KVRows){k32 + at, v32 + at, D, bl, block, 0}
                                              : (KVRows){k16 + at, v16 + at, D, bl, block, 1};
                    attention_group(out + (size_t)g * NQ * D, q + (size_t)g * NQ * D, NQ, &rows, n, D, 0.0884f, att);
                }
                t[layout][r] = (now_s() - t0) * 1e3;
            }
        for (int layout = 0; layout < 2; layout++) {
            const double mb = 2.0 * GROUPS * n * D * (layout == 0 ? 4 : 2) / 1e6;
            qsort(t[layout], (size_t)rounds, sizeof(double), cmp_double);
            const double med = t[layout][rounds / 2];
            printf("  %4d positions, %-32s %6.3f ms [%.3f..%.3f]  %5.1f GB/s of keys and values\n", n,
                   layout == 0 ? "fp32 cache:" : "fp16 cache:", med, t[layout][0],
                   t[layout][rounds - 1], mb / med);
        }
    }
    return sink == 12345 ? 2 : 0; /* keeps the flush reads */
}
