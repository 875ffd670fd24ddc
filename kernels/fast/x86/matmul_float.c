/* x86/matmul_float.c: the x86 twins of kernels/matmul.c's scalar reference (matmul_scalar_rows) for f32
 * and bf16 weights: AVX2+FMA, with AVX-512 tiles and panels, vdpbf16ps and AMX-BF16 where the
 * build has them. Each computes the rows [r0, r1) of out for all n tokens, bf16 widened to fp32
 * in registers and every sum fp32. Prefill: tiles of RT weight rows x TT tokens in RT*TT vector
 * accumulators (each weight vector used TT times, each activation vector RT times), or packed
 * panels of 16 rows. Decode (n == 1) reads each weight once, as one stream where it can. The
 * chunk kernels that fast/matmul.c's plan names (rows_f32_n1, rows_bf16_n1(_zmm), rows_bf16_n1_plain,
 * rows_f32_nn, rows_bf16_nn, rows_bf16_dot, rows_bf16_split) follow the tiles they loop over. */
#include "../matmul_shared.h"

#if defined(KERNELS_AVX2)

/* Tokens per tile_float: a 4 x 4 tile needs 16 accumulators + 4 activations + 1 weight, which fits
 * in the 32 vector registers of an AVX-512 build (also for ymm code) but not in AVX2's 16, where
 * gcc spills in the inner loop; there 4 x 3 fits (docs/design.md#prefill-tiles). Where the panels
 * are on, the tiles take the prompts below plan_product's thresholds and the rows after a
 * chunk's last whole panel; with AVX-512 on Zen 4 (panels off) all of f32 and bf16 prefill. */
#if defined(__AVX512F__)
#define TILE_TOKENS 4
#else
#define TILE_TOKENS 3
#endif

ALWAYS_INLINE __m256 ldw(const void* w, size_t i, WeightType type) {
    if (type == WEIGHT_F32) return _mm256_loadu_ps((const float*)w + i);
    __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)w + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE float ldw1(const void* w, size_t i, WeightType type) {
    return type == WEIGHT_F32 ? ((const float*)w)[i] : bf16_to_f32(((const uint16_t*)w)[i]);
}

#if defined(KERNELS_AVX512)
/* tile_float on 512-bit vectors: twice the products per FMA of the ymm tile. Only the lanes in
 * mask k are loaded (the rest are zero), so a row whose width is not a multiple of 16 needs no
 * scalar tail. */
ALWAYS_INLINE __m512 ldw_zmm(const void* w, size_t i, WeightType type, __mmask16 k) {
    if (type == WEIGHT_F32) return _mm512_maskz_loadu_ps(k, (const float*)w + i);
    const __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t*)w + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE void tile_float_zmm_step(__m512 acc[4][4], const float* x, const void* wr, WeightType type, int C, int t,
                                       int c, __mmask16 k, int RT, int TT) {
    __m512 xv[4];
#pragma GCC unroll 4
    for (int j = 0; j < TT; j++) {
        xv[j] = _mm512_maskz_loadu_ps(k, x + (size_t)(t + j) * C + c);
        __asm__("" : "+v"(xv[j])); /* in a register, not folded into each FMA (see tile_float_ymm) */
    }
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++) {
        __m512 w = ldw_zmm(wr, (size_t)i * C + c, type, k);
        __asm__("" : "+v"(w));
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) acc[i][j] = _mm512_fmadd_ps(w, xv[j], acc[i][j]);
    }
}

ALWAYS_INLINE void tile_float_zmm(float* out, const float* x, const Matrix* W, WeightType type, int r, int t, int RT,
                                  int TT, const char* next) {
    const int C = W->cols, R = W->rows, C16 = C & ~15;
    const void* wr = row_ptr(W, r);
    const size_t next_step = type == WEIGHT_F32 ? 256 : 128; /* 4 rows x 16 columns per step */
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) acc[i][j] = _mm512_setzero_ps();
    for (int c = 0; c < C16; c += 16) {
        if (next) next = prefetch_next_rows(next, next_step);
        tile_float_zmm_step(acc, x, wr, type, C, t, c, (__mmask16)0xFFFF, RT, TT);
    }
    if (C16 < C) tile_float_zmm_step(acc, x, wr, type, C, t, C16, (__mmask16)((1u << (C - C16)) - 1), RT, TT);
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) out[(size_t)(t + j) * R + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

/* f32 and bf16 prefill on 512-bit vectors from repacked weights (the GEMM kernels' way): a chunk's
 * rows are transposed, 16 at a time, into panels where column c of the 16 rows is one vector (bf16
 * widened to fp32 on the way); each such vector meets a token's x[c], broadcast from memory, in
 * one FMA. A tile of 12 tokens x 32 rows keeps 24 accumulators: 2 loads and 12 broadcasts per 24
 * FMAs and no horizontal sum, where tile_float_zmm loads 2 vectors per 4 FMAs and ends with 16.
 * Each output is one fp32 sum over the columns in order, one FMA per column (the scalar
 * reference's order, fused). docs/design.md#prefill-panels */
#define FLOAT_TILE_TOKENS 12

/* Rows [r, r + 16) as a panel: column c at panel + 16 * c. */
ALWAYS_INLINE void float_pack_panel(float* panel, const Matrix* W, WeightType type, int r) {
    const int C = W->cols, C16 = C & ~15;
    const void* wr = row_ptr(W, r);
    for (int c = 0; c < C16; c += 16) {
        __m512i v[16];
        for (int n = 0; n < 16; n++)
            v[n] = _mm512_castps_si512(ldw_zmm(wr, (size_t)n * C + c, type, (__mmask16)0xFFFF));
        transpose16_epi32(v);
        for (int k = 0; k < 16; k++) _mm512_storeu_si512((void*)(panel + (size_t)(c + k) * 16), v[k]);
    }
    for (int c = C16; c < C; c++)
        for (int n = 0; n < 16; n++) panel[(size_t)c * 16 + n] = ldw1(wr, (size_t)n * C + c, type);
}

/* out rows [r, r + 16 * RP) (RP panels: 1 or 2) x TT tokens, over the K vectors of each panel
 * (64 bytes each: a column of f32, or a column pair of bf16 for rows_bf16_packed). Token j's
 * operand for vector k is the 4 bytes at xt + j * xstride + 4 * k, broadcast: its x[k] as fp32
 * for an FMA, or (dot, --bf16-activations) its bf16 pair k for a vdpbf16ps. */
ALWAYS_INLINE void tile_packed(float* out, const char* xt, size_t xstride, const void* panels, int K, int R, int r,
                               int TT, int RP, int dot) {
    const uint32_t* p0 = panels;
    const uint32_t* p1 = p0 + (size_t)16 * K;
    __m512 acc[FLOAT_TILE_TOKENS][2];
#pragma GCC unroll 12
    for (int j = 0; j < TT; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        const __m512i w0 = _mm512_loadu_si512((const void*)(p0 + (size_t)16 * k));
        const __m512i w1 = RP > 1 ? _mm512_loadu_si512((const void*)(p1 + (size_t)16 * k)) : w0;
#pragma GCC unroll 12
        for (int j = 0; j < TT; j++) {
            const char* xk = xt + (size_t)j * xstride + (size_t)4 * k;
#if defined(KERNELS_AMX_BF16)
            if (dot) {
                int32_t pair;
                memcpy(&pair, xk, sizeof pair);
                const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
                acc[j][0] = _mm512_dpbf16_ps(acc[j][0], (__m512bh)w0, xv);
                if (RP > 1) acc[j][1] = _mm512_dpbf16_ps(acc[j][1], (__m512bh)w1, xv);
                continue;
            }
#endif
            float xf; /* as a float, so that gcc folds the broadcast into the FMA ({1to16}) */
            memcpy(&xf, xk, sizeof xf);
            const __m512 xv = _mm512_set1_ps(xf);
            acc[j][0] = _mm512_fmadd_ps(_mm512_castsi512_ps(w0), xv, acc[j][0]);
            if (RP > 1) acc[j][1] = _mm512_fmadd_ps(_mm512_castsi512_ps(w1), xv, acc[j][1]);
        }
    }
#pragma GCC unroll 12
    for (int j = 0; j < TT; j++) {
        _mm512_storeu_ps(out + (size_t)j * R + r, acc[j][0]);
        if (RP > 1) _mm512_storeu_ps(out + (size_t)j * R + r + 16, acc[j][1]);
    }
}

/* Every one of n tokens (token t's operands from x + t * xstride, its outputs at out + t * R)
 * through RP panels (constant) from row r: tiles of 12 tokens, then of 4 and 1. */
ALWAYS_INLINE void panel_token_tiles(float* out, const char* x, size_t xstride, const uint32_t* pp, int K, int R, int r,
                                     int n, int RP, int dot) {
    int t = 0;
    for (; t + FLOAT_TILE_TOKENS <= n; t += FLOAT_TILE_TOKENS)
        tile_packed(out + (size_t)t * R, x + t * xstride, xstride, pp, K, R, r, FLOAT_TILE_TOKENS, RP, dot);
    for (; t + 4 <= n; t += 4) tile_packed(out + (size_t)t * R, x + t * xstride, xstride, pp, K, R, r, 4, RP, dot);
    for (; t < n; t++) tile_packed(out + (size_t)t * R, x + t * xstride, xstride, pp, K, R, r, 1, RP, dot);
}

/* The np packed panels from row r0 (a panel: 16 * K words), two at a time (one where an odd one
 * is left), for all n tokens. dot: a constant at each caller. */
ALWAYS_INLINE void panel_tiles(float* out, const char* x, size_t xstride, const uint32_t* packed, int K, int R, int r0,
                               int n, int np, int dot) {
    for (int p = 0; p < np; p += 2) {
        const uint32_t* pp = packed + (size_t)p * 16 * K;
        if (p + 2 <= np) panel_token_tiles(out, x, xstride, pp, K, R, r0 + 16 * p, n, 2, dot);
        else panel_token_tiles(out, x, xstride, pp, K, R, r0 + 16 * p, n, 1, dot);
    }
}

/* Rows [r0, r0 + 16 * np) (np <= FLOAT_MAX_PANELS) for all n tokens: packed into the thread's
 * scratch, then panel_tiles. */
ALWAYS_INLINE void rows_float_packed(float* out, const float* x, const Matrix* W, WeightType type, int n, int r0,
                                     int np, float* packed) {
    const int C = W->cols;
    for (int p = 0; p < np; p++) float_pack_panel(packed + (size_t)p * 16 * C, W, type, r0 + 16 * p);
    panel_tiles(out, (const char*)x, (size_t)C * sizeof(float), (const uint32_t*)(const void*)packed, C, W->rows, r0,
                n, np, 0);
}
#else /* AVX2: the 256-bit tile_float and panels */
/* Rows r .. r+RT-1 x tokens t .. t+TT-1 on 256-bit vectors, each accumulator over 8 columns, the
 * last C % 8 columns added in scalar. The activation and weight vectors of a step are pinned in
 * registers by an empty asm: gcc otherwise folds each load into every FMA that uses it (16 loads
 * per step instead of 8), which is slower (docs/design.md#prefill-tiles). next: NULL, or f32/bf16
 * weights to bring into L2 at the pace this tile reads its own (4 rows x 8 columns per step: one
 * 64-byte line of bf16, two of f32; rows_float_nn). */
ALWAYS_INLINE void tile_float_ymm(float* out, const float* x, const Matrix* W, WeightType type, int r, int t, int RT,
                                  int TT, const char* next) {
    const int C = W->cols, R = W->rows, C8 = C & ~7;
    const void* wr = row_ptr(W, r);
    const size_t next_step = type == WEIGHT_F32 ? 128 : 64;
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) acc[i][j] = _mm256_setzero_ps();
    for (int c = 0; c < C8; c += 8) {
        if (next) next = prefetch_next_rows(next, next_step);
        __m256 xv[4];
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) {
            xv[j] = _mm256_loadu_ps(x + (size_t)(t + j) * C + c);
            __asm__("" : "+v"(xv[j]));
        }
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) {
            __m256 w = ldw(wr, (size_t)i * C + c, type);
            __asm__("" : "+v"(w));
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) acc[i][j] = _mm256_fmadd_ps(w, xv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) {
            float s = hsum256(acc[i][j]);
            for (int c = C8; c < C; c++) s += ldw1(wr, (size_t)i * C + c, type) * x[(size_t)(t + j) * C + c];
            out[(size_t)(t + j) * R + r + i] = s;
        }
}

/* The AVX-512 panels on AVX2's 16 ymm registers: the same panels of 16 rows, and a tile of 6
 * tokens x 16 rows in 12 accumulators, 2 weight vectors and 1 broadcast (the BLAS kernels' 6 x 16
 * shape): per column 2 loads and 6 broadcasts for 12 FMAs, where the 4 x 3 tile_float loads 7
 * vectors per 12 FMAs and ends with 12 horizontal sums. Each output is one fp32 sum over the
 * columns in order, one FMA per column, so the bits are those of the AVX-512 panels. */
#define FLOAT_TILE_TOKENS 6

/* Rows [r, r + 16) as a panel: column c at panel + 16 * c. */
ALWAYS_INLINE void float_pack_panel(float* panel, const Matrix* W, WeightType type, int r) {
    const int C = W->cols, C8 = C & ~7;
    const void* wr = row_ptr(W, r);
    for (int c = 0; c < C8; c += 8)
        for (int h = 0; h < 16; h += 8) {
            __m256 v[8];
            for (int k = 0; k < 8; k++) v[k] = ldw(wr, (size_t)(h + k) * C + c, type);
            transpose8_ps(v);
            for (int k = 0; k < 8; k++) _mm256_storeu_ps(panel + (size_t)(c + k) * 16 + h, v[k]);
        }
    for (int c = C8; c < C; c++)
        for (int k = 0; k < 16; k++) panel[(size_t)c * 16 + k] = ldw1(wr, (size_t)k * C + c, type);
}

/* out rows [r, r + 16) x TT tokens (token j's x at x + j * C, its outputs at out + j * R). */
ALWAYS_INLINE void tile_packed(float* out, const float* x, const float* panel, int C, int R, int r, int TT) {
    __m256 acc[FLOAT_TILE_TOKENS][2];
#pragma GCC unroll 6
    for (int j = 0; j < TT; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int c = 0; c < C; c++) {
        const __m256 w0 = _mm256_loadu_ps(panel + (size_t)16 * c), w1 = _mm256_loadu_ps(panel + (size_t)16 * c + 8);
#pragma GCC unroll 6
        for (int j = 0; j < TT; j++) {
            const __m256 xv = _mm256_broadcast_ss(x + (size_t)j * C + c);
            acc[j][0] = _mm256_fmadd_ps(w0, xv, acc[j][0]);
            acc[j][1] = _mm256_fmadd_ps(w1, xv, acc[j][1]);
        }
    }
#pragma GCC unroll 6
    for (int j = 0; j < TT; j++) {
        _mm256_storeu_ps(out + (size_t)j * R + r, acc[j][0]);
        _mm256_storeu_ps(out + (size_t)j * R + r + 8, acc[j][1]);
    }
}

/* Rows [r0, r0 + 16 * np) (np <= FLOAT_MAX_PANELS) for all n tokens: packed into the thread's
 * scratch, then per block of tokens (a multiple of 6 that stays in L2, as rows_float_nn's) every
 * panel meets the block's tokens, 6 at a time, then 4, then 1. */
ALWAYS_INLINE void rows_float_packed(float* out, const float* x, const Matrix* W, WeightType type, int n, int r0,
                                     int np, float* packed) {
    const int C = W->cols, R = W->rows;
    for (int p = 0; p < np; p++) float_pack_panel(packed + (size_t)p * 16 * C, W, type, r0 + 16 * p);
    int tb = token_block((size_t)C * sizeof(float)) / FLOAT_TILE_TOKENS * FLOAT_TILE_TOKENS;
    if (tb < FLOAT_TILE_TOKENS) tb = FLOAT_TILE_TOKENS;
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        for (int p = 0; p < np; p++) {
            const float* pp = packed + (size_t)p * 16 * C;
            const int r = r0 + 16 * p;
            int t = t0;
            for (; t + FLOAT_TILE_TOKENS <= t1; t += FLOAT_TILE_TOKENS)
                tile_packed(out + (size_t)t * R, x + (size_t)t * C, pp, C, R, r, FLOAT_TILE_TOKENS);
            for (; t + 4 <= t1; t += 4) tile_packed(out + (size_t)t * R, x + (size_t)t * C, pp, C, R, r, 4);
            for (; t < t1; t++) tile_packed(out + (size_t)t * R, x + (size_t)t * C, pp, C, R, r, 1);
        }
    }
}
#endif

/* next: NULL, or the next 4 rows, brought into L2 as this tile goes (rows_float_nn). */
ALWAYS_INLINE void tile_float(float* out, const float* x, const Matrix* W, WeightType type, int r, int t, int RT,
                              int TT, const void* next) {
#if defined(KERNELS_AVX512)
    tile_float_zmm(out, x, W, type, r, t, RT, TT, next);
#else
    tile_float_ymm(out, x, W, type, r, t, RT, TT, next);
#endif
}

/* bf16 decode from x as it is, for cols % 16 != 0 or rows wider than the thread's scratch row
 * (rows_bf16_n1 takes the rest): 4 rows at a time, each with two accumulators so the FMA chains
 * overlap. No Qwen3 width takes it, so it has no prefetch plan. */
void rows_bf16_n1_plain(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const WeightType type = WEIGHT_BF16;
    const float* x = pr->x;
    const int C = W->cols;
    const int C16 = C & ~15;
    int r = r0;
    for (; r + 4 <= r1; r += 4) {
        __m256 a[4][2];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
        for (int c = 0; c < C16; c += 16) {
            __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
            __asm__("" : "+v"(x0), "+v"(x1));
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                a[i][0] = _mm256_fmadd_ps(ldw(W->data, (size_t)(r + i) * C + c, type), x0, a[i][0]);
                a[i][1] = _mm256_fmadd_ps(ldw(W->data, (size_t)(r + i) * C + c + 8, type), x1, a[i][1]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            int c = C16;
            if (c + 8 <= C) {
                a[i][0] = _mm256_fmadd_ps(ldw(W->data, (size_t)(r + i) * C + c, type),
                                          _mm256_loadu_ps(x + c), a[i][0]);
                c += 8;
            }
            float s = hsum256(_mm256_add_ps(a[i][0], a[i][1]));
            for (; c < C; c++) s += ldw1(W->data, (size_t)(r + i) * C + c, type) * x[c];
            out[r + i] = s;
        }
    }
    for (; r < r1; r++) tile_float(out, x, W, type, r, 0, 1, 1, NULL);
}

/* bf16 matrix-vector product without widening instructions: a 32-byte load holds 16 bf16, and
 * 32-bit lane k holds elements 2k (low half) and 2k+1 (high half), so `lane << 16` is element 2k
 * as an fp32 and `lane & 0xFFFF0000` is element 2k+1. The activation row is de-interleaved once
 * per call (span 16: per 16 columns, the 8 even ones then the 8 odd ones), so each 16 weights cost
 * one load, a shift, an and and two FMAs. Needs cols % 16 == 0. One row at a time, one sequential
 * stream, as rows_f32_n1. 64 columns per step into 8 accumulators, not 32 into 4: fewer loop
 * instructions per byte let the core keep more loads in flight. docs/design.md#decode-stream */
void deinterleave(float* xp, const float* x, int C, int span) {
    const int h = span / 2;
    for (int c = 0; c < C; c += span)
        for (int k = 0; k < h; k++) {
            xp[c + k] = x[c + 2 * k];
            xp[c + h + k] = x[c + 2 * k + 1];
        }
}

ALWAYS_INLINE void bf16_step16(__m256* a, __m256* b, const uint16_t* w, const float* xp) {
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256i v = _mm256_loadu_si256((const __m256i*)w);
    *a = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), _mm256_load_ps(xp), *a);
    *b = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hi)), _mm256_load_ps(xp + 8), *b);
}

/* With prefetch (a constant at each call), each 128 bytes of a row ask for the two lines pf bytes
 * ahead (the plan's bf16 distance: matmul.c, choose_prefetch and measure_prefetch). */
ALWAYS_INLINE void rows_bf16_n1_pf(float* out, const float* xp, const Matrix* W, int r0, int r1, const int prefetch,
                                   int pf) {
    const int C = W->cols;
    for (int r = r0; r < r1; r++) {
        const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        int c = 0;
        for (; c + 64 <= C; c += 64) {
            if (prefetch) {
                _mm_prefetch((const char*)(w + c) + pf, _MM_HINT_T0);
                _mm_prefetch((const char*)(w + c) + pf + 64, _MM_HINT_T0);
            }
            bf16_step16(&a0, &b0, w + c, xp + c);
            bf16_step16(&a1, &b1, w + c + 16, xp + c + 16);
            bf16_step16(&a2, &b2, w + c + 32, xp + c + 32);
            bf16_step16(&a3, &b3, w + c + 48, xp + c + 48);
        }
        for (; c < C; c += 16) bf16_step16(&a0, &b0, w + c, xp + c);
        __m256 s01 = _mm256_add_ps(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1));
        __m256 s23 = _mm256_add_ps(_mm256_add_ps(a2, b2), _mm256_add_ps(a3, b3));
        out[r] = hsum256(_mm256_add_ps(s01, s23));
    }
}

#if defined(KERNELS_AVX512)
/* rows_bf16_n1 on 512-bit vectors: a 64-byte load is 32 bf16, the activation row de-interleaved
 * per 32 columns (16 even, then 16 odd), and 128 columns per step into 8 accumulators: half the
 * instructions per weight byte of the ymm kernel, so the core keeps more loads in flight. The
 * plan's bf16_zmm distance (matmul.c, measure_prefetch) says how far ahead it prefetches, if at all
 * (docs/design.md#decode-stream). Needs cols % 32 == 0. */
ALWAYS_INLINE void bf16_step32(__m512* a, __m512* b, const uint16_t* w, const float* xp) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    const __m512i v = _mm512_loadu_si512((const void*)w);
    *a = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_load_ps(xp), *a);
    *b = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hi)), _mm512_load_ps(xp + 16), *b);
}

ALWAYS_INLINE void rows_bf16_n1_zmm_pf(float* out, const float* xp, const Matrix* W, int r0, int r1, int prefetch,
                                       int pf) {
    const int C = W->cols;
    for (int r = r0; r < r1; r++) {
        const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
        __m512 a0 = _mm512_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        int c = 0;
        for (; c + 128 <= C; c += 128) {
            if (prefetch)
                for (int o = 0; o < 256; o += 64) _mm_prefetch((const char*)(w + c) + pf + o, _MM_HINT_T0);
            bf16_step32(&a0, &b0, w + c, xp + c);
            bf16_step32(&a1, &b1, w + c + 32, xp + c + 32);
            bf16_step32(&a2, &b2, w + c + 64, xp + c + 64);
            bf16_step32(&a3, &b3, w + c + 96, xp + c + 96);
        }
        for (; c < C; c += 32) bf16_step32(&a0, &b0, w + c, xp + c);
        __m512 s01 = _mm512_add_ps(_mm512_add_ps(a0, b0), _mm512_add_ps(a1, b1));
        __m512 s23 = _mm512_add_ps(_mm512_add_ps(a2, b2), _mm512_add_ps(a3, b3));
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(s01, s23));
    }
}

/* The plan's bf16_zmm distance as a constant-folded branch, as in rows_bf16_n1 (below). */
void rows_bf16_n1_zmm(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const PrefetchPlan* plan = mt->prefetch;
    if (plan->bf16_zmm) rows_bf16_n1_zmm_pf(out, mt->xp, W, r0, r1, 1, plan->bf16_zmm);
    else rows_bf16_n1_zmm_pf(out, mt->xp, W, r0, r1, 0, 0);
}
#endif

/* bf16 decode from the de-interleaved row in mt->xp (16 columns a step; on zmm 32). The plan's
 * distance as a constant-folded branch: the copy without prefetch has no prefetch instruction in
 * its loop. */
void rows_bf16_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const PrefetchPlan* plan = mt->prefetch;
    if (plan->bf16) rows_bf16_n1_pf(out, mt->xp, W, r0, r1, 1, plan->bf16);
    else rows_bf16_n1_pf(out, mt->xp, W, r0, r1, 0, 0);
}

/* f32 matrix-vector product, one row at a time with four accumulators. An f32 row of the 0.6B
 * shape is 4 KB, a page: reading four rows side by side (to share the activation loads) makes four
 * streams that each start on a page the hardware prefetcher has not seen, while one row after the
 * other is a single sequential stream (docs/design.md#decode-stream). bf16 does the same
 * (rows_bf16_n1); q8 reads row blocks (rows_qi_n1). */
void rows_f32_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const float* x = pr->x;
    const int C = W->cols;
    const float* wd = (const float*)W->data;
    for (int r = r0; r < r1; r++) {
        const float* w = wd + (size_t)r * C;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int c = 0;
        for (; c + 32 <= C; c += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(x + c), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c + 16), _mm256_loadu_ps(x + c + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c + 24), _mm256_loadu_ps(x + c + 24), a3);
        }
        float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (; c < C; c++) s += w[c] * x[c];
        out[r] = s;
    }
}

/* Token-blocked matrix-matrix product for rows [r0, r1): the activation block (tb tokens) stays in
 * L2 while every weight tile of the chunk is used against it. Where the plan says (packed), whole
 * panels of 16 rows first (from a multiple of 16: the driver's chunks are). */
ALWAYS_INLINE void rows_float_nn(const MatmulThread* mt, float* out, const float* x, const Matrix* W, WeightType type,
                                int n, int packed, int r0, int r1) {
    if (packed) {
        for (int np; (np = row_tiles_next(r0, r1, FLOAT_MAX_PANELS)) > 0; r0 += np * FLOAT_PANEL_ROWS)
            rows_float_packed(out, x, W, type, n, r0, np, mt->panels);
    }
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

void rows_f32_nn(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    rows_float_nn(mt, out, pr->x, W, WEIGHT_F32, pr->n, pr->plan.float_packed, r0, r1);
}
void rows_bf16_nn(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    rows_float_nn(mt, out, pr->x, W, WEIGHT_BF16, pr->n, pr->plan.float_packed, r0, r1);
}

#if defined(KERNELS_BF16_DOT)
/* Prefill with bf16 weights and bf16 activations (kernels_set_bf16_activations): vdpbf16ps
 * multiplies 32 pairs of bf16 and adds them into 16 fp32 lanes, twice the products per
 * instruction of widening the weights to fp32 for FMAs. The activations are rounded to bf16
 * (nearest even) once per matmul (bf16_round_rows, or bf16_block_rows), which is what llama.cpp
 * does with bf16 weights and what a Hugging Face model run in bfloat16 does between its layers;
 * the products of two bf16 are exact in fp32, the sums are fp32
 * (docs/design.md#bf16-activations). A tile: rows r .. r+RT-1 x tokens t .. t+TT-1, the last
 * columns loaded under a mask (zeros beyond C). */
ALWAYS_INLINE void tile_bf16_dot(float* out, const uint16_t* xb, const Matrix* W, int r, int t, int RT, int TT) {
    const int C = W->cols, R = W->rows;
    const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) acc[i][j] = _mm512_setzero_ps();
    for (int c = 0; c < C; c += 32) {
        const __mmask32 m = C - c >= 32 ? 0xFFFFFFFFu : (1u << (C - c)) - 1;
        __m512i wv[4], xv[4];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) wv[i] = _mm512_maskz_loadu_epi16(m, w + (size_t)i * C + c);
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) xv[j] = _mm512_maskz_loadu_epi16(m, xb + (size_t)(t + j) * C + c);
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)wv[i], (__m512bh)xv[j]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) out[(size_t)(t + j) * R + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

#if defined(KERNELS_AMX_BF16)
/* Rows [r, r + 16) as AMX-BF16's panel (C a multiple of 32): each 32-bit lane one row's pair of
 * bf16 weights (columns 2k, 2k + 1), so vector k, at panel + 16 * k, is the 16 rows' pair k,
 * transposed straight from the rows (no widening). The tokens after the last whole AMX tile meet
 * it in panel_tiles' vdpbf16ps tiles: a token's pair k broadcast to every lane, one vdpbf16ps
 * adds both products into each row's fp32 lane. */
static void bf16_pack_panel(uint32_t* panel, const Matrix* W, int r) {
    const int C = W->cols;
    const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
    for (int c = 0; c < C; c += 32) {
        __m512i v[16];
        for (int n = 0; n < 16; n++) v[n] = _mm512_loadu_si512((const void*)(w + (size_t)n * C + c));
        transpose16_epi32(v);
        for (int k = 0; k < 16; k++) _mm512_storeu_si512((void*)(panel + (size_t)(c / 2 + k) * 16), v[k]);
    }
}

/* The panels are AMX-BF16's B layout already: TDPBF16PS adds the products of A (16 tokens x 32
 * bf16 columns, straight from the activations) and B (16 pair-rows x 16 output rows: 16 panel
 * vectors, 1 KB) into C (16 tokens x 16 rows of fp32), which stays in its tile over all the
 * columns (no per-group scales, unlike q8's) and is stored once, into out. Activations of `parts`
 * bf16 parts (1: --bf16-activations; 3: fp32 activations split by bf16_split_rows), token t's
 * part q at xt + (t * parts + q) * C: each part's A tile meets the same B tile, into the same C.
 * two (a constant at each call): the panel at b0 and the next share each A tile and keep two
 * products in flight. rows: tokens in this tile; under 16, the A tile's other rows must be
 * readable (zeros) and C goes through c_tile, whose first rows are copied. */
ALWAYS_INLINE void amx_bf16_panels(float* out, size_t os, const uint16_t* xt, size_t xs, int parts, const uint32_t* b0,
                                   int C, int two, int rows) {
    const uint32_t* b1 = b0 + (size_t)8 * C;
    _tile_zero(4);
    if (two) _tile_zero(5);
    for (int s = 0; s < C / 32; s++) {
        _tile_loadd(2, b0 + (size_t)256 * s, 64);
        if (two) _tile_loadd(3, b1 + (size_t)256 * s, 64);
        _tile_loadd(0, xt + 32 * s, xs);
        _tile_dpbf16ps(4, 0, 2);
        if (two) _tile_dpbf16ps(5, 0, 3);
        if (parts == 3) {
            _tile_loadd(1, xt + C + 32 * s, xs);
            _tile_dpbf16ps(4, 1, 2);
            if (two) _tile_dpbf16ps(5, 1, 3);
            _tile_loadd(6, xt + 2 * C + 32 * s, xs);
            _tile_dpbf16ps(4, 6, 2);
            if (two) _tile_dpbf16ps(5, 6, 3);
        }
    }
    if (rows == AMX_ROWS) {
        _tile_stored(4, out, os);
        if (two) _tile_stored(5, out + 16, os);
        return;
    }
    float c_tile[2][AMX_ROWS * 16];
    _tile_stored(4, c_tile[0], 64);
    if (two) _tile_stored(5, c_tile[1], 64);
    for (int i = 0; i < rows; i++) {
        memcpy(out + (size_t)i * (os / sizeof(float)), c_tile[0] + 16 * i, 16 * sizeof(float));
        if (two) memcpy(out + (size_t)i * (os / sizeof(float)) + 16, c_tile[1] + 16 * i, 16 * sizeof(float));
    }
}

/* Tokens [0, n) x the np panels from row r0, into out (R floats per token). parts: a constant. */
ALWAYS_INLINE void amx_bf16_rows(float* out, const uint16_t* xb, int parts, const uint32_t* packed, int C, int R,
                                 int r0, int np, int n) {
    const size_t xs = (size_t)parts * C * sizeof(uint16_t), os = (size_t)R * sizeof(float);
    __asm__ volatile("" ::: "memory"); /* the packing's stores before the tile loads read them */
    amx_configure(64, AMX_ROWS);   /* A 16 x 64 bytes, B 16 x 64, C 16 x 64: q8's shapes */
    for (int t = 0; t < n; t += AMX_ROWS) {
        const uint16_t* xt = xb + (size_t)t * parts * C;
        float* ot = out + (size_t)t * R + r0;
        const int rows = n - t < AMX_ROWS ? n - t : AMX_ROWS;
        int p = 0;
        for (; p + 2 <= np; p += 2) amx_bf16_panels(ot + 16 * p, os, xt, xs, parts, packed + (size_t)p * 8 * C, C, 1, rows);
        if (p < np) amx_bf16_panels(ot + 16 * p, os, xt, xs, parts, packed + (size_t)p * 8 * C, C, 0, rows);
    }
    _tile_release();
}

/* Rows [r0, r0 + 16 * np) (np <= FLOAT_MAX_PANELS) for all n tokens, packed into the thread's
 * float-panel scratch (a bf16 panel is half a float one): whole tiles of 16 tokens on AMX, the
 * last tokens on the panel tiles. */
static void rows_bf16_packed(const MatmulThread* mt, float* out, const uint16_t* xb, const Matrix* W, int n, int r0,
                             int np) {
    const int C = W->cols, R = W->rows;
    uint32_t* packed = (uint32_t*)(void*)mt->panels;
    for (int p = 0; p < np; p++) bf16_pack_panel(packed + (size_t)p * 8 * C, W, r0 + 16 * p);
    const int t = n / AMX_ROWS * AMX_ROWS;
    amx_bf16_rows(out, xb, 1, packed, C, R, r0, np, t);
    panel_tiles(out + (size_t)t * R, (const char*)(xb + (size_t)t * C), (size_t)C * sizeof(uint16_t), packed, C / 2,
                R, r0, n - t, np, 1);
}
#endif

/* Tokens [t0, t1) of x (width C, a multiple of 32; t0 a multiple of 16) rounded to bf16 as
 * bf16_round_rows does, into blocks of 16 tokens: pair k (columns 2k, 2k + 1) of the block's 16
 * tokens is one vector, at xt + (b * C / 2 + k) * 16 words for block b; tokens from n on are
 * zeros. rows_bf16_blocked reads them. */
void bf16_block_rows(uint32_t* xt, const float* x, int C, int n, int t0, int t1) {
    for (int b = t0 / 16; b * 16 < t1; b++)
        for (int c = 0; c < C; c += 32) {
            __m512i v[16];
            for (int i = 0; i < 16; i++) {
                const float* xr = x + (size_t)(b * 16 + i) * C + c;
                v[i] = b * 16 + i < n ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + 16), _mm512_loadu_ps(xr))
                                      : _mm512_setzero_si512();
            }
            transpose16_epi32(v);
            for (int k = 0; k < 16; k++)
                _mm512_storeu_si512((void*)(xt + ((size_t)b * (C / 2) + c / 2 + k) * 16), v[k]);
        }
}

/* out rows [r, r + RT) (8, or 1) x the 16 * TV tokens from t (TV: 3 or 1 vectors of 16 tokens;
 * those from n on are not stored), with the activations in blocks (bf16_block_rows; xt: t's
 * block). Per column pair k, each vector of 16 tokens meets each row's pair k broadcast straight
 * from the checkpoint's row, so the weights are never repacked: 8 broadcasts and 3 loads per 24
 * vdpbf16ps. Each output is one fp32 sum over its column pairs in order. The lanes hold tokens,
 * so the outputs go out through a 16 x 16 transpose (8 rows of two vectors of tokens). */
ALWAYS_INLINE void tile_bf16_blocked(float* out, const uint32_t* xt, const uint16_t* w, int C, int R, int r, int t,
                                     int n, int RT, int TV) {
    const size_t bw = (size_t)C / 2 * 16; /* words per block of 16 tokens */
    __m512 acc[8][3];
#pragma GCC unroll 8
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 3
        for (int v = 0; v < TV; v++) acc[i][v] = _mm512_setzero_ps();
    for (int k = 0; k < C / 2; k++) {
        __m512i xv[3];
#pragma GCC unroll 3
        for (int v = 0; v < TV; v++) xv[v] = _mm512_loadu_si512((const void*)(xt + v * bw + (size_t)16 * k));
#pragma GCC unroll 8
        for (int i = 0; i < RT; i++) {
            int32_t pair;
            memcpy(&pair, w + (size_t)i * C + 2 * (size_t)k, sizeof pair);
            const __m512i wb = _mm512_set1_epi32(pair);
#pragma GCC unroll 3
            for (int v = 0; v < TV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)xv[v], (__m512bh)wb);
        }
    }
    if (RT == 1) {
        for (int v = 0; v < TV; v++) {
            float o[16];
            _mm512_storeu_ps(o, acc[0][v]);
            for (int l = 0; l < 16 && t + 16 * v + l < n; l++) out[(size_t)(t + 16 * v + l) * R + r] = o[l];
        }
        return;
    }
    for (int v = 0; v < TV; v += 2) {
        __m512i m[16]; /* rows 0-7 of vector v, then of vector v + 1 */
        for (int i = 0; i < 8; i++) {
            m[i] = _mm512_castps_si512(acc[i][v]);
            m[8 + i] = v + 1 < TV ? _mm512_castps_si512(acc[i][v + 1]) : _mm512_setzero_si512();
        }
        transpose16_epi32(m); /* m[l]: token t + 16v + l's 8 rows, then token t + 16(v + 1) + l's */
        for (int l = 0; l < 16; l++) { /* only a single vector (TV 1) can reach past n */
            const int ta = t + 16 * v + l;
            const __m512d o = _mm512_castsi512_pd(m[l]);
            if (ta < n) _mm256_storeu_ps(out + (size_t)ta * R + r, _mm256_castpd_ps(_mm512_castpd512_pd256(o)));
            if (v + 1 < TV)
                _mm256_storeu_ps(out + (size_t)(ta + 16) * R + r, _mm256_castpd_ps(_mm512_extractf64x4_pd(o, 1)));
        }
    }
}

/* Rows [r0, r1) x n tokens from the blocked activations: per block of 96 tokens (48 for rows over
 * 1,024 columns: the block and the chunk's rows stay in L2), tiles of 8 rows x 48 tokens, then x
 * 16, and the last rows one at a time. */
static void rows_bf16_blocked(float* out, const uint32_t* xt, const Matrix* W, int n, int r0, int r1) {
    const int C = W->cols, R = W->rows;
    const size_t bw = (size_t)C / 2 * 16;
    const int tb = token_block((size_t)C * sizeof(uint16_t)) >= 96 ? 96 : 48;
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        int r = r0;
        for (; r + 8 <= r1; r += 8) {
            const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
            int t = t0;
            for (; t + 48 <= t1; t += 48) tile_bf16_blocked(out, xt + (size_t)(t / 16) * bw, w, C, R, r, t, n, 8, 3);
            for (; t < t1; t += 16) tile_bf16_blocked(out, xt + (size_t)(t / 16) * bw, w, C, R, r, t, n, 8, 1);
        }
        for (; r < r1; r++) {
            const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
            for (int t = t0; t < t1; t += 16)
                tile_bf16_blocked(out, xt + (size_t)(t / 16) * bw, w, C, R, r, t, n, 1, 1);
        }
    }
}

/* Rows [r0, r1) x n tokens: where the plan says (bf16_blocked), the activations in blocks
 * (rows_bf16_blocked), or with AMX-BF16 whole panels of 16 rows (from a multiple of 16: the
 * driver's chunks are); the rest, and shorter prompts, in 4 x 4 tiles blocked as rows_float_nn
 * (a block of tokens stays in L2). */
void rows_bf16_dot(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const uint16_t* xb = pr->xb16;
    const int n = pr->n;
    if (pr->plan.bf16_blocked) {
        rows_bf16_blocked(out, (const uint32_t*)(const void*)xb, W, n, r0, r1);
        return;
    }
#if defined(KERNELS_AMX_BF16)
    if (pr->plan.bf16_packed) {
        for (int np; (np = row_tiles_next(r0, r1, FLOAT_MAX_PANELS)) > 0; r0 += np * FLOAT_PANEL_ROWS)
            rows_bf16_packed(mt, out, xb, W, n, r0, np);
    }
#endif
    const int tb = token_block((size_t)W->cols * sizeof(uint16_t));
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        int r = r0;
        for (; r + 4 <= r1; r += 4) {
            int t = t0;
            for (; t + 4 <= t1; t += 4) tile_bf16_dot(out, xb, W, r, t, 4, 4);
            for (; t < t1; t++) tile_bf16_dot(out, xb, W, r, t, 4, 1);
        }
        for (; r < r1; r++) {
            int t = t0;
            for (; t + 4 <= t1; t += 4) tile_bf16_dot(out, xb, W, r, t, 1, 4);
            for (; t < t1; t++) tile_bf16_dot(out, xb, W, r, t, 1, 1);
        }
    }
}

/* xb[i] = x[i] rounded to bf16, nearest even (vcvtne2ps2bf16; the scalar tail does the same). */
void bf16_round_rows(uint16_t* xb, const float* x, size_t count) {
    size_t i = 0;
    for (; i + 32 <= count; i += 32)
        _mm512_storeu_si512(xb + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
    for (; i < count; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        xb[i] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
}
#endif

#if defined(KERNELS_AMX_BF16)
/* bf16 weights with fp32 activations on AMX-BF16: each activation x split into three bf16,
 * x = h + m + l, h = bf16(x), m = bf16(x - h), l = x - h - m (each difference exact in fp32:
 * h keeps x's top 8 significant bits, m the next 8, l the last 8, so l is a bf16 exactly). The
 * three products with a bf16 weight are exact in fp32, so W x is summed in fp32 from the exact
 * products, as with the fp32 FMAs, in another order. TDPBF16PS reads denormal inputs as zero:
 * only an l below 2^-126 (x below about 2^-110) is lost (docs/design.md#amx-bf16). Token t's
 * parts at xs + 3 t C: h, m, l, C each (C a multiple of 16). */
void bf16_split_rows(uint16_t* xs, const float* x, int C, int t0, int t1) {
    for (int t = t0; t < t1; t++) {
        const float* xt = x + (size_t)t * C;
        uint16_t* h = xs + (size_t)t * 3 * C;
        for (int c = 0; c < C; c += 16) {
            const __m512 v = _mm512_loadu_ps(xt + c);
            const __m256i hb = (__m256i)_mm512_cvtneps_pbh(v);
            const __m512 r = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hb), 16)));
            const __m256i mb = (__m256i)_mm512_cvtneps_pbh(r);
            const __m512 l = _mm512_sub_ps(r, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(mb), 16)));
            _mm256_storeu_si256((__m256i*)(h + c), hb);
            _mm256_storeu_si256((__m256i*)(h + C + c), mb);
            _mm256_storeu_si256((__m256i*)(h + 2 * C + c), (__m256i)_mm512_cvtneps_pbh(l));
        }
    }
}

/* Rows [r0, r1) x n tokens from the split activations xs (bf16_split_rows, rows up to the next
 * multiple of 16 tokens readable): whole panels of 16 rows on AMX-BF16, the rows left (a matrix
 * whose rows are not a multiple of 16) as rows_float_nn from x. */
void rows_bf16_split(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const int C = W->cols, n = pr->n;
    const uint16_t* xs = pr->xb16;
    uint32_t* packed = (uint32_t*)(void*)mt->panels;
    for (int np; (np = row_tiles_next(r0, r1, FLOAT_MAX_PANELS)) > 0; r0 += np * FLOAT_PANEL_ROWS) {
        for (int p = 0; p < np; p++) bf16_pack_panel(packed + (size_t)p * 8 * C, W, r0 + 16 * p);
        amx_bf16_rows(out, xs, 3, packed, C, W->rows, r0, np, n);
    }
    if (r0 < r1) rows_float_nn(mt, out, pr->x, W, WEIGHT_BF16, n, pr->plan.float_packed, r0, r1);
}
#endif

#endif /* KERNELS_AVX2 */
