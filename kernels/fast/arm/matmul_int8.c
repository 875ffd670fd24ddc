/* arm/matmul_int8.c: the NEON twins of kernels/matmul.c's scalar reference (matmul_scalar_rows) for q8 and
 * q4 weights, in the shape of x86/matmul_int8.c at half the vector width: the same int32 per
 * (row, group) and the same fp32 steps after it. Checked for correctness under qemu-aarch64 only
 * (no arm64 hardware to tune them on). The loops over row and token tiles are x86/matmul_int8.c's
 * without AMX and the packed panels. */
#include "../matmul_shared.h"

#if defined(KERNELS_NEON)

#define Q8_TILE_TOKENS 4
#define Q8_TILE_ROWS 4

/* q8: the G scales of rows r .. r+RT-1 (one row block) as floats, row r + i's at out + i * G (as
 * the AVX2 twin's, for the shared rows_qi). */
ALWAYS_INLINE void q8_scales_float(float* out, const Matrix* W, int r, int RT) {
    const int G = W->cols / W->group_size;
    const uint16_t* sc = quant_scales(W, r);
    for (int i = 0; i < RT; i++)
        for (int g = 0; g < G; g++) out[(size_t)i * G + g] = scale1(sc[(size_t)i * G + g]);
}

/* Quantises token rows [t0, t1) of x (width C) to int8 per group of gs (a multiple of 16; the
 * driver only comes here for multiples of 32) as the AVX2 twin does: s = max|x| / 127, q = x *
 * (127 / max|x|) rounded to nearest even (vcvtnq_s32_f32, as _mm256_cvtps_epi32 under the default
 * MXCSR), so both targets quantise alike. xsum and xgsum are not written: they serve the AVX2 twin's
 * unsigned x signed products, and SDOT multiplies signed by signed. */
void quantize_rows(int8_t* xq, float* xs, int32_t* xsum, int32_t* xgsum, const float* x, int C, int gs, int t0,
                   int t1) {
    const int G = C / gs;
    for (int t = t0; t < t1; t++) {
        for (int g = 0; g < G; g++) {
            const float* v = x + (size_t)t * C + (size_t)g * gs;
            float32x4_t m = vdupq_n_f32(0.0f);
            for (int c = 0; c < gs; c += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(v + c)));
            float amax = vmaxvq_f32(m);
            float s = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            xs[(size_t)t * G + g] = s;
            int8_t* q = xq + (size_t)t * C + (size_t)g * gs;
            for (int c = 0; c < gs; c += 16) {
                int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(v + c), inv));
                int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(v + c + 4), inv));
                int32x4_t d = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(v + c + 8), inv));
                int32x4_t e = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(v + c + 12), inv));
                /* saturating narrows, like the AVX2 packs: |x * inv| can round a hair above 127 */
                int16x8_t lo = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
                int16x8_t hi = vcombine_s16(vqmovn_s32(d), vqmovn_s32(e));
                vst1q_s8(q + c, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
            }
        }
    }
}

/* The 16 q8 weights of a row group from column c (a multiple of 16) on; wrow is the row's group. */
ALWAYS_INLINE int8x16_t qi_load(const uint8_t* wrow, int c) {
    return vld1q_s8((const int8_t*)wrow + c);
}

/* acc[k] += sum of the 4 int8 products of lanes 4k..4k+3. */
ALWAYS_INLINE int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t x) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, x);
#else
    /* Without SDOT (plain armv8-a): int16 products, added in adjacent pairs (two products of
     * |w| <= 128 and |x| <= 127 sum to at most 32512: no int16 overflow), then pairs of pairs
     * into int32, so each lane holds its own 4 bytes as with SDOT (tile_q4's lanes are rows). */
    const int16x8_t pairs = vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)), vmull_high_s8(w, x));
    return vpadalq_s16(acc, pairs);
#endif
}

/* The int32 partial sums of a group are reduced across lanes with pairwise adds into one vector
 * per row (lanes = tokens), or for a single token into one vector whose lanes are the rows: then
 * 16 group accumulators + 4 weights + 1 activation + 4 totals fit in the 32 registers, where
 * keeping 16 fp32 totals as well would spill. Each output's arithmetic is the same whatever the
 * tile shape (fma of float(isum) by ws * xs in its own lane), so the thread split cannot change
 * a result (tests/test_kernels.c checks 1 thread == 2 threads bitwise). next: the AVX2 twin's L2
 * prefetch of the next row block, not used here (not measured on arm64). */
ALWAYS_INLINE void tile_qi(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum, const Matrix* W,
                           const float* ws_r, int r, int t, int RT, int TT, const char* next) {
    const int C = W->cols, R = W->rows, gs = W->group_size, G = C / gs;
    const size_t gb = (size_t)gs;
    float32x4_t tot[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) tot[i] = vdupq_n_f32(0.0f);
    for (int g = 0; g < G; g++) {
        int32x4_t acc[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[i][j] = vdupq_n_s32(0);
        const uint8_t* wg = quant_group(W, r, g); /* row r + i at wg + i * gb */
        for (int c = g * gs; c < g * gs + gs; c += 16) {
            int8x16_t wv[4];
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) wv[i] = qi_load(wg + (size_t)i * gb, c - g * gs);
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) {
                int8x16_t xv = vld1q_s8(xq + (size_t)(t + j) * C + c);
#pragma GCC unroll 4
                for (int i = 0; i < RT; i++) acc[i][j] = dot16(acc[i][j], wv[i], xv);
            }
        }
        if (TT == 1) {
            float ws[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) ws[i] = ws_r[(size_t)i * G + g];
            int32x4_t s = vpaddq_s32(vpaddq_s32(acc[0][0], acc[1][0]), vpaddq_s32(acc[2][0], acc[3][0]));
            tot[0] = vfmaq_f32(tot[0], vcvtq_f32_s32(s), vmulq_n_f32(vld1q_f32(ws), xsc[(size_t)t * G + g]));
        } else {
            float xa[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) xa[j] = xsc[(size_t)(t + j) * G + g];
            float32x4_t xsv = vld1q_f32(xa);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                int32x4_t s = vpaddq_s32(vpaddq_s32(acc[i][0], acc[i][1]), vpaddq_s32(acc[i][2], acc[i][3]));
                tot[i] = vfmaq_f32(tot[i], vcvtq_f32_s32(s), vmulq_n_f32(xsv, ws_r[(size_t)i * G + g]));
            }
        }
    }
    float o[4];
    if (TT == 1) {
        vst1q_f32(o, tot[0]);
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) out[(size_t)t * R + r + i] = o[i];
    } else {
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) {
            vst1q_f32(o, tot[i]);
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) out[(size_t)(t + j) * R + r + i] = o[j];
        }
    }
}

/* The q8 matrix-vector product: tile_qi's own TT == 1 path, which also reads a row block
 * front to back (the AVX2 twin's written-out kernel and its prefetch distance are measured on
 * x86 only). */
void rows_qi_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const int8_t* xq = pr->xq;
    const float* xsc = pr->xs;
    const int32_t* xsum = pr->xsum;
    float* ws = mt->scales;
    for (int r = r0; r < r1;) {
        const int RT = r + 4 <= r1 ? 4 : 1;
        q8_scales_float(ws, W, r, RT);
        tile_qi(out, xq, xsc, xsum, W, ws, r, 0, RT, 1, NULL);
        r += RT;
    }
}

/* q4 (kernels.h's row lanes): the AVX2 twin's scheme at half the width. Each 16-byte half of a
 * quarter holds 4 rows, one per 32-bit lane, so a block's 8 rows take two accumulators; the
 * nibbles minus 8 are q itself, which dot16 (SDOT, or its widening fallback) multiplies by the
 * token's 4 activations of those columns in every lane. The same int32 per (row, group) as the
 * AVX2 twin, and the same fp32 steps after it. One token at a time (correctness only: no arm64
 * hardware to tune a token tile on). */
static void tile_q4(float* out, const int8_t* xq, const float* xsc, const Matrix* W, int r, int t) {
    const int C = W->cols, R = W->rows, G = C / Q4_GROUP;
    const uint8_t* b = q4_group(W, r, 0);
    const int8_t* x = xq + (size_t)t * C;
    float32x4_t tot[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; /* rows 0-3, 4-7 */
    for (int g = 0; g < G; g++, b += Q4_GROUP_BYTES, x += Q4_GROUP) {
        const uint8_t* w = b + Q4_BLOCK_ROWS * sizeof(uint16_t);
        int32x4_t a[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int v = 0; v < 4; v++) {
            int32_t xl, xh; /* columns 4v .. 4v+3 and 16+4v .. 16+4v+3 */
            memcpy(&xl, x + 4 * v, 4);
            memcpy(&xh, x + 16 + 4 * v, 4);
            const int8x16_t xlv = vreinterpretq_s8_s32(vdupq_n_s32(xl)), xhv = vreinterpretq_s8_s32(vdupq_n_s32(xh));
            for (int h = 0; h < 2; h++) {
                const uint8x16_t q = vld1q_u8(w + 32 * v + 16 * h);
                const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vdupq_n_s8(8));
                const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
                a[h] = dot16(dot16(a[h], lo, xlv), hi, xhv);
            }
        }
        const float xs = xsc[(size_t)t * G + g];
        for (int h = 0; h < 2; h++)
            tot[h] = vfmaq_n_f32(tot[h],
                                 vmulq_f32(vcvtq_f32_s32(a[h]), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t*)b + 4 * h)))),
                                 xs);
    }
    float o[8];
    vst1q_f32(o, tot[0]);
    vst1q_f32(o + 4, tot[1]);
    for (int i = 0; i < Q4_BLOCK_ROWS && r + i < R; i++) out[(size_t)t * R + r + i] = o[i];
}

/* q4 decode, rows [r0, r1) (r0 a multiple of 8: the driver's chunks are): the row blocks in order. */
void rows_q4_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    for (int r = r0; r < r1; r += Q4_BLOCK_ROWS) tile_q4(out, pr->xq, pr->xs, W, r, 0);
}

/* q4 prefill: rows [r0, r1) for n tokens, a block of tokens at a time as rows_qi's q8 tiles. */
static void q4_prefill_tiles(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0,
                             int r1) {
    const int8_t* xq = pr->xq;
    const float* xsc = pr->xs;
    const int n = pr->n;
    const int tb = token_block((size_t)W->cols);
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        for (int r = r0; r < r1; r += Q4_BLOCK_ROWS)
            for (int t = t0; t < t1; t++) tile_q4(out, xq, xsc, W, r, t);
    }
}

/* A prompt's q8 or q4 weights x int8 activations for rows [r0, r1): tile_q4's tiles, or tile_qi's
 * with a block of tokens in L2 while every row tile of the chunk uses it. (One token goes straight
 * to rows_qi_n1 or rows_q4_n1.) */
void rows_qi(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const int8_t* xq = pr->xq;
    const float* xsc = pr->xs;
    const int32_t* xsum = pr->xsum;
    const int n = pr->n;
    if (W->type == WEIGHT_Q4) {
        q4_prefill_tiles(mt, pr, out, W, r0, r1);
        return;
    }
    /* q8: the rest in tiles of Q8_TILE_ROWS rows x Q8_TILE_TOKENS tokens */
    const int C = W->cols, G = C / W->group_size;
    const int tb = token_block((size_t)C);
    float* ws = mt->scales; /* the row block's scales as floats */
    for (int t0 = 0; t0 < n; t0 += tb) {
        int t1 = t0 + tb < n ? t0 + tb : n;
        int r = r0;
        for (; r + 4 <= r1; r += 4) {
            /* the first tile over this block brings the next one into L2, as in rows_float_nn
             * (docs/design.md#short-prompt-prefetch) */
            const char* next = t0 == 0 && r + 8 <= W->rows ? (const char*)quant_scales(W, r + 4) : NULL;
            q8_scales_float(ws, W, r, 4);
            int t = t0;
            for (; t + Q8_TILE_TOKENS <= t1; t += Q8_TILE_TOKENS)
                for (int h = 0; h < 4; h += Q8_TILE_ROWS, next = NULL)
                    tile_qi(out, xq, xsc, xsum, W, ws + (size_t)h * G, r + h, t, Q8_TILE_ROWS, Q8_TILE_TOKENS, next);
            for (; t < t1; t++, next = NULL) tile_qi(out, xq, xsc, xsum, W, ws, r, t, 4, 1, next);
        }
        for (; r < r1; r++) {
            q8_scales_float(ws, W, r, 1);
            int t = t0;
            for (; t + 4 <= t1; t += 4) tile_qi(out, xq, xsc, xsum, W, ws, r, t, 1, 4, NULL);
            for (; t < t1; t++) tile_qi(out, xq, xsc, xsum, W, ws, r, t, 1, 1, NULL);
        }
    }
}
#endif /* KERNELS_NEON */
