/* arm/matmul_float.c: the NEON twins of kernels/matmul.c's scalar reference (matmul_scalar_rows) for f32
 * and bf16 weights, in the shape of x86/matmul_float.c's 256-bit tiles: tiles of 4 rows x 4
 * tokens, bf16 widened to fp32 in registers, every sum fp32. Checked for correctness under
 * qemu-aarch64 only: no tuning or prefetch distance is chosen here, because none could be measured
 * (docs/design.md#arm64). The loops over row and token tiles are x86/matmul_float.c's without
 * its packed panels. */
#include "../matmul_shared.h"

#if defined(KERNELS_NEON)

#define TILE_TOKENS 4 /* 32 NEON registers: 16 accumulators + 8 weights + 2 activations */

/* Eight weights of one row as two fp32 vectors. bf16 is the top half of an fp32 (QWEN3.md 2.6),
 * so widening each u16 with a shift by 16 is the exact conversion, done in registers. */
ALWAYS_INLINE void ldw8(const void* w, size_t i, WeightType type, float32x4_t* lo, float32x4_t* hi) {
    if (type == WEIGHT_F32) {
        *lo = vld1q_f32((const float*)w + i);
        *hi = vld1q_f32((const float*)w + i + 4);
    } else {
        uint16x8_t h = vld1q_u16((const uint16_t*)w + i);
        *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    }
}

ALWAYS_INLINE float ldw1(const void* w, size_t i, WeightType type) {
    return type == WEIGHT_F32 ? ((const float*)w)[i] : bf16_to_f32(((const uint16_t*)w)[i]);
}

/* Tile of RT rows x TT tokens over the columns [c0, c1) (c1 - c0 a multiple of 8), added into
 * acc (not reduced); weight (row i of the tile, column c) is element i * rs + (c - c0) of wb.
 * Both halves of each 8-column step go into the same accumulator so that a 4 x 4 tile needs 16
 * accumulators + 8 weight + 2 activation registers: it fits in the 32 NEON registers without
 * spilling. */
ALWAYS_INLINE void tile_float_acc(float32x4_t acc[4][4], const float* x, const void* wb, size_t rs, WeightType type,
                                  int C, int t, int c0, int c1, int RT, int TT) {
    for (int c = c0; c < c1; c += 8) {
        float32x4_t wl[4], wh[4];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) ldw8(wb, (size_t)i * rs + (size_t)(c - c0), type, &wl[i], &wh[i]);
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) {
            const float* xj = x + (size_t)(t + j) * C + c;
            float32x4_t xl = vld1q_f32(xj), xh = vld1q_f32(xj + 4);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                acc[i][j] = vfmaq_f32(acc[i][j], wl[i], xl);
                acc[i][j] = vfmaq_f32(acc[i][j], wh[i], xh);
            }
        }
    }
}

/* next: the AVX2 twin's L2 prefetch of the next rows, not used here (not measured on arm64). */
ALWAYS_INLINE void tile_float(float* out, const float* x, const Matrix* W, WeightType type, int r, int t, int RT,
                              int TT, const void* next) {
    const int C = W->cols, R = W->rows;
    float32x4_t acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) acc[i][j] = vdupq_n_f32(0.0f);
    const int C8 = C & ~7;
    const void* wr = row_ptr(W, r);
    tile_float_acc(acc, x, wr, (size_t)C, type, C, t, 0, C8, RT, TT);
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) {
            float s = vaddvq_f32(acc[i][j]);
            for (int c = C8; c < C; c++)
                s += ldw1(wr, (size_t)i * C + c, type) * x[(size_t)(t + j) * C + c];
            out[(size_t)(t + j) * R + r + i] = s;
        }
}

/* Matrix-vector (n == 1): 4 rows at a time, each with two accumulators (one per half of the
 * 8-column step) so consecutive FMAs of a row do not wait on each other; the weights are
 * streamed once and the activation vectors are shared by the 4 rows. */
ALWAYS_INLINE void rows_float_n1(float* out, const float* x, const Matrix* W, WeightType type, int r0, int r1) {
    const int C = W->cols;
    const int C8 = C & ~7;
    int r = r0;
    for (; r + 4 <= r1; r += 4) {
        float32x4_t a[4][2];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = vdupq_n_f32(0.0f);
        for (int c = 0; c < C8; c += 8) {
            float32x4_t x0 = vld1q_f32(x + c), x1 = vld1q_f32(x + c + 4);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                float32x4_t lo, hi;
                ldw8(W->data, (size_t)(r + i) * C + c, type, &lo, &hi);
                a[i][0] = vfmaq_f32(a[i][0], lo, x0);
                a[i][1] = vfmaq_f32(a[i][1], hi, x1);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            float s = vaddvq_f32(vaddq_f32(a[i][0], a[i][1]));
            for (int c = C8; c < C; c++) s += ldw1(W->data, (size_t)(r + i) * C + c, type) * x[c];
            out[r + i] = s;
        }
    }
    for (; r < r1; r++) tile_float(out, x, W, type, r, 0, 1, 1, NULL);
}

/* Decode: the four-row kernel for f32 (the AVX2 twin's one row at a time is measured on x86 only)
 * and bf16. */
void rows_f32_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    rows_float_n1(out, pr->x, W, WEIGHT_F32, r0, r1);
}
void rows_bf16_n1_plain(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    rows_float_n1(out, pr->x, W, WEIGHT_BF16, r0, r1);
}

/* Token-blocked matrix-matrix product for rows [r0, r1): the activation block (tb tokens) stays in
 * L2 while every weight tile of the chunk is used against it. */
ALWAYS_INLINE void rows_float_nn(float* out, const float* x, const Matrix* W, WeightType type, int n, int r0, int r1) {
    const int C = W->cols;
    const int tb = token_block((size_t)C * sizeof(float));
    for (int t0 = 0; t0 < n; t0 += tb) {
        int t1 = t0 + tb < n ? t0 + tb : n;
        int r = r0;
        for (; r + 4 <= r1; r += 4) {
            /* While the first token block's first tile reads these 4 rows from memory, it brings
             * the next 4 into L2, so that their read overlaps this tile's arithmetic; a few tokens
             * (below the panels) are otherwise memory-latency-bound on the first pass and compute-
             * bound on the others (docs/design.md#short-prompt-prefetch). */
            const void* next = t0 == 0 && r + 8 <= W->rows ? row_ptr(W, r + 4) : NULL;
            int t = t0;
            for (; t + TILE_TOKENS <= t1; t += TILE_TOKENS, next = NULL)
                tile_float(out, x, W, type, r, t, 4, TILE_TOKENS, next);
            for (; t < t1; t++, next = NULL) tile_float(out, x, W, type, r, t, 4, 1, next);
        }
        for (; r < r1; r++) {
            int t = t0;
            for (; t + 4 <= t1; t += 4) tile_float(out, x, W, type, r, t, 1, 4, NULL);
            for (; t < t1; t++) tile_float(out, x, W, type, r, t, 1, 1, NULL);
        }
    }
}

/* Prefill. */
void rows_f32_nn(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    rows_float_nn(out, pr->x, W, WEIGHT_F32, pr->n, r0, r1);
}
void rows_bf16_nn(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    rows_float_nn(out, pr->x, W, WEIGHT_BF16, pr->n, r0, r1);
}
#endif /* KERNELS_NEON */
