/* Why q8 decode read memory slower than a plain streaming read, and what the row-block layout
 * changed: one thread, a q8 matrix far larger than the caches (258,048 x 1024, groups of 64:
 * 264 MB of weights + 16.5 MB of scales), and loops that add one piece of the q8 matrix-vector
 * work at a time over the version-1 layout (all int8 rows, then all scales: two streams), then the
 * engine's kernel over the same matrix in row blocks (model.h: one stream). Rounds alternate
 * between the loops and the medians are printed, so a machine that changes speed moves all of
 * them alike. x86-64 with AVX2 only (the probe loops use intrinsics; the engine's kernel is called
 * through its API). Build and run from the repository root:
 *
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -march=native -I. -o build/q8_read_probe tools/q8_read_probe.c \
 *       $(ls *.c | grep -v '^run.c$') -lm -lpthread && build/q8_read_probe [rounds]
 *
 * Findings on the 2-core development VM: docs/notes-kernels.md, "Fourth session" and "Fifth
 * session". */
#include "kernels.h"
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define ROWS (3072 * 28 * 3)
#define COLS 1024
#define GS 64
#define GROUPS (COLS / GS)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum { STREAM, LOADS, CONVERT, ROW_SCALE, ENGINE, N_LOOPS };
static const char* const loop_name[N_LOOPS] = {
    "streaming read (no rows)",
    "rows: weight and activation loads",
    "+ fp32 convert, fma by x_scale[g]",
    "+ fma by w_scale[row][g] x x_scale[g]",
    "the engine's q8 matmul (row blocks)",
};

/* One pass of loop `kind` over the weights; returns something derived from every load so that
 * the compiler keeps them. */
static float probe(int kind, const int8_t* w, const float* w_scale, const int8_t* xq,
                   const float* x_scale) {
    __m256i any = _mm256_setzero_si256();
    __m256 total = _mm256_setzero_ps();
    if (kind == STREAM) {
        for (size_t i = 0; i < (size_t)ROWS * COLS; i += 64)
            any = _mm256_or_si256(any, _mm256_or_si256(_mm256_load_si256((const __m256i*)(w + i)),
                                                       _mm256_load_si256((const __m256i*)(w + i + 32))));
        return (float)_mm256_extract_epi32(any, 0);
    }
    for (int r = 0; r < ROWS; r++) {
        const int8_t* row = w + (size_t)r * COLS;
        for (int g = 0; g < GROUPS; g++) {
            const int c = g * GS;
            __m256i v0 = _mm256_or_si256(_mm256_load_si256((const __m256i*)(row + c)),
                                         _mm256_loadu_si256((const __m256i*)(xq + c)));
            __m256i v1 = _mm256_or_si256(_mm256_load_si256((const __m256i*)(row + c + 32)),
                                         _mm256_loadu_si256((const __m256i*)(xq + c + 32)));
            __m256i sum = _mm256_add_epi32(v0, v1);
            if (kind == LOADS) {
                any = _mm256_or_si256(any, sum);
            } else {
                float scale = kind == CONVERT ? x_scale[g] : w_scale[(size_t)r * GROUPS + g] * x_scale[g];
                total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(scale), total);
            }
        }
    }
    return (float)_mm256_extract_epi32(any, 0) + _mm256_cvtss_f32(total);
}

static int by_value(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

int main(int argc, char** argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (rounds < 1 || rounds > 99) rounds = 5;
    const size_t bytes = (size_t)ROWS * COLS, huge = (size_t)2 << 20;
    int8_t* w = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
    float* w_scale = malloc(sizeof(float) * ROWS * GROUPS);
    float* out = malloc(sizeof(float) * ROWS);
    double* gbps = malloc(sizeof(double) * N_LOOPS * rounds);
    if (!w || !w_scale || !out || !gbps) {
        fprintf(stderr, "q8_read_probe: out of memory\n");
        return 1;
    }
    madvise(w, (bytes + huge - 1) / huge * huge, MADV_HUGEPAGE);  /* as the engine's mapping */
    for (size_t i = 0; i < bytes; i++) w[i] = (int8_t)((i * 7 + 3) % 61 - 30);
    for (int i = 0; i < ROWS * GROUPS; i++) w_scale[i] = 0.01f;
    int8_t xq[COLS];
    float x_scale[GROUPS], x[COLS];
    for (int i = 0; i < COLS; i++) xq[i] = (int8_t)(i % 13 - 6), x[i] = (float)(i % 7) * 0.1f - 0.3f;
    for (int g = 0; g < GROUPS; g++) x_scale[g] = 0.02f;

    /* the same matrix in the row blocks of model.h, for the engine's kernel */
    const size_t bb = quant_block_bytes(WEIGHT_Q8, COLS, GS), blocked_bytes = (size_t)ROWS / 4 * bb;
    char* blocks = aligned_alloc(huge, (blocked_bytes + huge - 1) / huge * huge);
    if (!blocks) {
        fprintf(stderr, "q8_read_probe: out of memory\n");
        return 1;
    }
    madvise(blocks, (blocked_bytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
    for (int r = 0; r < ROWS; r++) {
        char* b = blocks + (size_t)(r / 4) * bb;
        for (int g = 0; g < GROUPS; g++) { /* float16 scales (version 5), then the values */
            const uint16_t h = float_to_half(w_scale[(size_t)r * GROUPS + g]);
            memcpy(b + ((size_t)(r % 4) * GROUPS + g) * sizeof h, &h, sizeof h);
            memcpy(b + (size_t)8 * GROUPS + ((size_t)g * 4 + r % 4) * GS, w + (size_t)r * COLS + (size_t)g * GS, GS);
        }
    }

    kernels_init(1, 1, COLS);
    const Matrix m = {WEIGHT_Q8, ROWS, COLS, GS, blocks};
    volatile float sink = 0;
    for (int r = -1; r < rounds; r++) {  /* round -1 warms up */
        for (int k = 0; k < N_LOOPS; k++) {
            double t0 = now_s();
            if (k == ENGINE) {
                matmul(out, x, &m, 1);
                sink += out[ROWS / 2];
            } else {
                sink += probe(k, w, w_scale, xq, x_scale);
            }
            if (r >= 0) gbps[k * rounds + r] = bytes / (now_s() - t0) / 1e9;
        }
    }
    printf("q8 matrix %d x %d (groups of %d), 1 thread, GB/s of weights, median of %d alternating rounds [min..max]\n",
           ROWS, COLS, GS, rounds);
    for (int k = 0; k < N_LOOPS; k++) {
        double* g = gbps + k * rounds;
        qsort(g, rounds, sizeof(double), by_value);
        printf("  %-40s %5.1f  [%.1f..%.1f]\n", loop_name[k], g[rounds / 2], g[0], g[rounds - 1]);
    }
    kernels_free();
    free(w), free(w_scale), free(blocks), free(out), free(gbps);
    return sink == 12345.f;
}
