/* x86/matmul_int8.c: the x86 twins of kernels/matmul.c's scalar reference (matmul_scalar_rows) for q8 and
 * q4 weights: AVX2, with VNNI and 512-bit panels where the build has them. The activations are
 * quantised to int8 per group once per product (quantize_rows); the int8 products of a group are
 * summed exactly in int32, and each group's sum is scaled by (weight scale x activation scale)
 * into fp32 accumulators. With AMX, prefill's whole tiles of 16 rows go to x86/matmul_amx.c. The
 * chunk kernels that fast/matmul.c's plan names (rows_qi_n1, rows_q4_n1, rows_qi) follow their
 * tiles. */
#include "../matmul_shared.h"

#if defined(KERNELS_AVX2)

/* q8 prefill tiles (tile_qi): 4 tokens, so that a row's four sums share one scaling step; 4 rows
 * where there are 32 vector registers, 2 in AVX2's 16 (16 int32 sums alone would fill them and
 * spill). docs/design.md#prefill-tiles. The panels' tiles (tile_qi_packed) take QP_TOKENS tokens:
 * 8 with 32 registers, 4 with 16. */
#define Q8_TILE_TOKENS 4
#if defined(__AVX512F__)
#define Q8_TILE_ROWS 4
#define QP_TOKENS 8
#else
#define Q8_TILE_ROWS 2
#define QP_TOKENS 4
#endif

/* Eight float16 scales as floats (scale1 for one). */
ALWAYS_INLINE __m256 scales8(const void* b) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b));
#else
    float f[8];
    for (int i = 0; i < 8; i++) {
        uint16_t h;
        memcpy(&h, (const char*)b + 2 * i, 2);
        f[i] = half_to_float(h);
    }
    return _mm256_loadu_ps(f);
#endif
}

/* out[k] = the float of h[k], k < n <= 8: eight at a time where there are eight. */
ALWAYS_INLINE void scales_upto8(float out[8], const uint16_t* h, int n) {
    if (n == 8)
        _mm256_storeu_ps(out, scales8(h));
    else
        for (int k = 0; k < n; k++) out[k] = scale1(h[k]);
}

/* q8: the G scales of rows r .. r+RT-1 (one row block) as floats, row r + i's at out + i * G.
 * Prefill converts a row block's scales once for all its token tiles: converting them inside the
 * tile makes gcc spill more of it (docs/design.md#checkpoint-layout). */
ALWAYS_INLINE void q8_scales_float(float* out, const Matrix* W, int r, int RT) {
    const int G = W->cols / W->group_size;
    const uint16_t* sc = quant_scales(W, r);
    for (int i = 0; i < RT; i++)
        for (int g = 0; g < G; g += 8)
            scales_upto8(out + (size_t)i * G + g, sc + (size_t)i * G + g, G - g < 8 ? G - g : 8);
}

/* Quantises token rows [t0, t1) of x (width C) to int8 per group of gs (a multiple of 32):
 * s = max|x| / 127, q = round(x / s). Also stores, per group, -128 times the sums of q that land
 * in each of the 8 int32 lanes of the dot product (lane k: the columns c with c % 32 in
 * 4k .. 4k+3), the start of the accumulator (qi_acc0 below), and, when xgsum is not NULL (q4
 * weights, the q8 panels with VNNI), -128 times the sum of all the group's q there (tile_q4,
 * tile_qi_packed). */
void quantize_rows(int8_t* xq, float* xs, int32_t* xsum, int32_t* xgsum, const float* x, int C, int gs, int t0,
                   int t1) {
    const int G = C / gs;
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int t = t0; t < t1; t++) {
        for (int g = 0; g < G; g++) {
            const float* v = x + (size_t)t * C + (size_t)g * gs;
            __m256 m = _mm256_setzero_ps();
            for (int c = 0; c < gs; c += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(signbit, _mm256_loadu_ps(v + c)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            float s = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            xs[(size_t)t * G + g] = s;
            __m256 vi = _mm256_set1_ps(inv);
            int8_t* q = xq + (size_t)t * C + (size_t)g * gs;
            __m256i sum = _mm256_setzero_si256();
            for (int c = 0; c < gs; c += 32) {
                __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c), vi));
                __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c + 8), vi));
                __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c + 16), vi));
                __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c + 24), vi));
                __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(d, e));
                p = _mm256_permutevar8x32_epi32(p, perm);
                _mm256_storeu_si256((__m256i*)(q + c), p);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16));
            }
            _mm256_storeu_si256((__m256i*)(xsum + ((size_t)t * G + g) * 8),
                                _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 7)));
            if (xgsum) {
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
                xgsum[(size_t)t * G + g] = -128 * _mm_cvtsi128_si32(s4);
            }
        }
    }
}

/* The q8 dot product of 32 weights and 32 int8 activations: qi_load once per weight vector,
 * qi_acc0 once per group and token (the accumulator's start), qi_dot per weight vector and token.
 * Each 32-bit lane adds the products of 4 neighbouring columns; the lanes are summed at the
 * group's end. Both x86 instructions multiply an unsigned byte by a signed one:
 *  - VNNI (vpdpbusd; Q8_VNNI, matmul_shared.h): the weight as w + 128 (w XOR 0x80), so a lane
 *    sums w x + 128 x and starts at -128 times its columns' sum of x (quantize_rows). Each lane
 *    ends with exactly the plain path's int32, so both give the same bits after the fp32 steps;
 *    one correction for the whole group in lane 0 would give the same total, but through larger
 *    lanes that the fp32 steps round differently (docs/design.md#int8-activations).
 *  - plain AVX2 (vpmaddubsw, which saturates pairs at int16): |w| times x with w's sign, pairs of
 *    at most 2 * 128 * 127 < 32768, then vpmaddwd by 1 into int32.
 * q4 has its own kernel, tile_q4 below. */
#if defined(Q8_VNNI)
/* acc + per 32-bit lane the sum of its 4 products of an unsigned byte of a by a signed byte of x. */
ALWAYS_INLINE __m256i dpbusd(__m256i acc, __m256i a, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__GNUC__)
    /* Where both encodings exist, gcc 12 emits the VEX one ({vex} vpdpbusd, ymm0-15 only) for
     * either intrinsic and then shuffles values between ymm0-15, ymm16-31 and the stack. As inline
     * asm with "v" operands the register allocator may use all 32 registers. */
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(x));
    return acc;
#else
    return _mm256_dpbusd_avx_epi32(acc, a, x);
#endif
}
#endif

typedef struct {
    __m256i a, w; /* VNNI: a = w + 128 (w unused); plain: a = |w|, w for its sign */
} QW;

/* The 32 weights of a row group from column c (a multiple of 32) on; wrow is the row's group. */
ALWAYS_INLINE QW qi_load(const uint8_t* wrow, int c) {
    QW p;
    const __m256i w = _mm256_loadu_si256((const __m256i*)(wrow + c));
#if defined(Q8_VNNI)
    p.a = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
#else
    p.a = _mm256_abs_epi8(w);
#endif
    p.w = w;
    return p;
}

/* xsum8: the group's 8 lane corrections from quantize_rows (-128 x each lane's sum of q_x). */
ALWAYS_INLINE __m256i qi_acc0(const int32_t* xsum8) {
#if defined(Q8_VNNI)
    return _mm256_loadu_si256((const __m256i*)xsum8);
#else
    return _mm256_setzero_si256();
#endif
}

ALWAYS_INLINE __m256i qi_dot(__m256i acc, QW p, __m256i x) {
#if defined(Q8_VNNI)
    return dpbusd(acc, p.a, x);
#else
    __m256i s = _mm256_maddubs_epi16(p.a, _mm256_sign_epi8(x, p.w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s, _mm256_set1_epi16(1)));
#endif
}

/* Rows r .. r+RT-1 (RT 1, 2 or 4, within one row block) x tokens t .. t+TT-1 (TT 1 or 4), 32
 * columns per step. With four tokens, a row's four int32 sums are reduced at a group's end to
 * their two halves (vphaddd), converted and scaled into the row's fp32 total, whose halves
 * are added at the end: one conversion, multiply and fma per four outputs, where per output that
 * scaling would cost about as much as the group's int8 products on AVX2 without VNNI. One token
 * (a token block's tail) keeps a total per output, scaled lane by lane and summed at the end, as
 * rows_qi_n1 does. Which of the two an output gets depends only on its token's place in the token
 * block, never on the row split, so the thread count cannot change a result (test_kernels checks
 * it bitwise). ws: the rows' scales as floats (q8_scales_float), row r + i's at ws + i * G.
 * next: NULL, or the next row block, brought into L2 a G-th of it per group (rows_qi). */
ALWAYS_INLINE void tile_qi(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum, const Matrix* W,
                           const float* ws, int r, int t, int RT, int TT, const char* next) {
    const int C = W->cols, R = W->rows, gs = W->group_size, G = C / gs;
    const size_t gb = (size_t)gs;
    const size_t next_bytes = quant_block_bytes(W->type, C, gs), next_step = (next_bytes + (size_t)G - 1) / (size_t)G;
    __m256 tot[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) tot[i] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        const size_t next_at = (size_t)g * next_step; /* the next block's g-th slice */
        if (next && next_at < next_bytes)
            prefetch_next_rows(next + next_at, next_bytes - next_at < next_step ? next_bytes - next_at : next_step);
        const uint8_t* wg = quant_group(W, r, g); /* row r + i at wg + i * gb */
        __m256i acc[4][4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i a0 = j < TT ? qi_acc0(xsum + ((size_t)(t + j) * G + g) * 8) : _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) acc[i][j] = i < RT ? a0 : _mm256_setzero_si256();
        }
        for (int c = 0; c < gs; c += 32) {
            QW wv[4];
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) wv[i] = qi_load(wg + (size_t)i * gb, c);
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) {
                const int8_t* xj = xq + (size_t)(t + j) * C + (size_t)g * gs;
                __m256i xv = _mm256_loadu_si256((const __m256i*)(xj + c));
#pragma GCC unroll 4
                for (int i = 0; i < RT; i++) acc[i][j] = qi_dot(acc[i][j], wv[i], xv);
            }
        }
        if (TT == 4) {
            const __m128 x4 = _mm_setr_ps(xsc[(size_t)t * G + g], xsc[(size_t)(t + 1) * G + g],
                                          xsc[(size_t)(t + 2) * G + g], xsc[(size_t)(t + 3) * G + g]);
            const __m256 xs = _mm256_set_m128(x4, x4);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                /* lane j < 4: token j's lanes 0-3 added, lane 4 + j its lanes 4-7 (exact in any order) */
                const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[i][0], acc[i][1]),
                                                    _mm256_hadd_epi32(acc[i][2], acc[i][3]));
                tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(_mm256_set1_ps(ws[(size_t)i * G + g]), xs), tot[i]);
            }
        } else {
            const __m256 xs = _mm256_set1_ps(xsc[(size_t)t * G + g]);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++)
                tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][0]), _mm256_mul_ps(_mm256_set1_ps(ws[(size_t)i * G + g]), xs), tot[i]);
        }
    }
    if (TT == 4) {
        float o[4];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) {
            _mm_storeu_ps(o, _mm_add_ps(_mm256_castps256_ps128(tot[i]), _mm256_extractf128_ps(tot[i], 1)));
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) out[(size_t)(t + j) * R + r + i] = o[j];
        }
    } else {
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) out[(size_t)t * R + r + i] = hsum256(tot[i]);
    }
}

/* One 32-column step of rows_qi_n1: the activation vector shared by the four rows of a block,
 * row i's group at wg + i * gb. */
ALWAYS_INLINE void qi_step4(__m256i a[4], const uint8_t* wg, size_t gb, int c, __m256i xv) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) a[i] = qi_dot(a[i], qi_load(wg + (size_t)i * gb, c), xv);
}

/* q8 matrix-vector product (decode): one row block at a time, front to back (its scales,
 * then per group the four rows' values), so the weights are one sequential stream; each group
 * step asks for the bytes pf ahead (the plan: matmul.c, measure_prefetch). A layout with the
 * scales apart from the rows would be a second stream, which costs far more than its 1/16 of the
 * bytes (docs/design.md#checkpoint-layout). */
void rows_qi_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const int8_t* xq = pr->xq;
    const float* xsc = pr->xs;
    const int32_t* xsum = pr->xsum;
    const int C = W->cols, gs = W->group_size, G = C / gs;
    const size_t bb = quant_block_bytes(WEIGHT_Q8, C, gs), gb = (size_t)gs;
    const size_t pf = mt->prefetch->q8 ? (size_t)mt->prefetch->q8 : bb;
    int r = r0; /* a multiple of 4: the driver's chunks are */
    for (; r + 4 <= r1; r += 4) {
        const uint16_t* s0 = quant_scales(W, r);
        const uint8_t* wg = quant_group(W, r, 0);
        for (int o = 0; o < (int)(4 * sizeof(uint16_t)) * G; o += 64) _mm_prefetch((const char*)s0 + pf + o, _MM_HINT_T0);
        __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
        for (int g = 0; g < G; g++, wg += 4 * gb) {
            for (int o = 0; o < (int)(4 * gb); o += 64) _mm_prefetch((const char*)wg + pf + o, _MM_HINT_T0);
            __m256i a[4];
            const int8_t* xg = xq + (size_t)g * gs;
            a[0] = a[1] = a[2] = a[3] = qi_acc0(xsum + (size_t)g * 8);
#pragma GCC unroll 4
            for (int c = 0; c < gs; c += 32) qi_step4(a, wg, gb, c, _mm256_loadu_si256((const __m256i*)(xg + c)));
            const float xs = xsc[g]; /* each row's (weight scale x activation scale) */
            t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[0]), _mm256_set1_ps(scale1(s0[g]) * xs), t0);
            t1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[1]), _mm256_set1_ps(scale1(s0[(size_t)G + g]) * xs), t1);
            t2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[2]), _mm256_set1_ps(scale1(s0[(size_t)2 * G + g]) * xs), t2);
            t3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[3]), _mm256_set1_ps(scale1(s0[(size_t)3 * G + g]) * xs), t3);
        }
        out[r] = hsum256(t0);
        out[r + 1] = hsum256(t1);
        out[r + 2] = hsum256(t2);
        out[r + 3] = hsum256(t3);
    }
    for (; r < r1; r++) {
        float* ws = mt->scales;
        q8_scales_float(ws, W, r, 1);
        tile_qi(out, xq, xsc, xsum, W, ws, r, 0, 1, 1, NULL);
    }
}

/* q8 prefill from packed panels, as q4's row lanes: a panel holds QP_ROWS rows with each 32-bit
 * lane one row's 4 values of columns c .. c+3, so a token's 4 activations of those columns,
 * broadcast to every lane, meet all the panel's rows in one qi_dot, and each group ends with one
 * int32 sum per row (lane) and token: no horizontal step (tile_qi's vphaddd), just a convert,
 * multiply and fma per QP_ROWS outputs (docs/design.md#prefill-panels).
 * With VNNI the panel holds each weight as w + 128 (XOR 0x80 when packing), so each lane starts
 * the group at -128 times the token's sum over the group (quantize_rows' xgsum) and ends at
 * tile_qi's exact int32, scaled once per group as AMX does (float(s) x weight scale, then x
 * activation scale, fused into the total). Panels are packed per chunk (<= 64 rows) into the
 * thread's float-panel scratch.
 * With 512-bit VNNI a panel is 16 rows, one zmm (the vpdpbusd rate of two ymm, half the
 * instructions and broadcasts); tiles of 16 rows x 8 tokens keep 8 sums and 8 totals in
 * registers and load one weight vector per 8 products. Elsewhere 8 rows, one ymm. */
#if defined(Q8_VNNI) && defined(KERNELS_AVX512)
typedef __m512i QPi;
typedef __m512 QPf;
typedef __m512i QPw;
ALWAYS_INLINE QPw qp_load(const int8_t* p) { return _mm512_loadu_si512((const void*)p); }
ALWAYS_INLINE QPi qp_set1(int32_t v) { return _mm512_set1_epi32(v); }
ALWAYS_INLINE QPi qp_dot(QPi acc, QPw w, QPi x) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x)); /* why asm: dpbusd above */
    return acc;
}
ALWAYS_INLINE QPf qp_zero(void) { return _mm512_setzero_ps(); }
ALWAYS_INLINE QPf qp_scale(QPf tot, QPi s, const float* ws, float xs) {
    return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_loadu_ps(ws)), _mm512_set1_ps(xs), tot);
}
ALWAYS_INLINE void qp_store(float* out, QPf v) { _mm512_storeu_ps(out, v); }
#else
typedef __m256i QPi;
typedef __m256 QPf;
typedef QW QPw;
ALWAYS_INLINE QPw qp_load(const int8_t* p) {
    QW w;
    w.w = _mm256_loadu_si256((const __m256i*)p);
#if defined(Q8_VNNI)
    w.a = w.w; /* already w + 128 */
#else
    w.a = _mm256_abs_epi8(w.w);
#endif
    return w;
}
ALWAYS_INLINE QPi qp_set1(int32_t v) { return _mm256_set1_epi32(v); }
ALWAYS_INLINE QPi qp_dot(QPi acc, QPw w, QPi x) { return qi_dot(acc, w, x); }
ALWAYS_INLINE QPf qp_zero(void) { return _mm256_setzero_ps(); }
ALWAYS_INLINE QPf qp_scale(QPf tot, QPi s, const float* ws, float xs) {
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_loadu_ps(ws)), _mm256_set1_ps(xs), tot);
}
ALWAYS_INLINE void qp_store(float* out, QPf v) { _mm256_storeu_ps(out, v); }
#endif

/* Rows [r, r + QP_ROWS) as a panel: columns c .. c+3 (c a multiple of 4) at panel + QP_ROWS * c,
 * lane i row r + i's (with VNNI as w + 128); row r + i's scale of group g as a float at
 * ps[QP_ROWS * g + i]. Each 8 rows are one 8 x 8 transpose of 4-byte words per 32 columns. */
static void q8_pack_panel(int8_t* panel, float* ps, const Matrix* W, int r) {
    const int gs = W->group_size, G = W->cols / gs;
#if defined(Q8_VNNI)
    const __m256i flip = _mm256_set1_epi8((char)0x80);
#else
    const __m256i flip = _mm256_setzero_si256();
#endif
    for (int g = 0; g < G; g++) {
        for (int c = 0; c < gs; c += 32)
            for (int h = 0; h < QP_ROWS; h += 8) {
                __m256 v[8];
                for (int i = 0; i < 8; i++)
                    v[i] = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i*)(quant_group(W, r + h + i, g) + c)));
                transpose8_ps(v);
                for (int k = 0; k < 8; k++)
                    _mm256_storeu_si256((__m256i*)(panel + (size_t)QP_ROWS * ((size_t)g * gs + c + 4 * k) + 4 * h),
                                        _mm256_xor_si256(_mm256_castps_si256(v[k]), flip));
            }
        for (int i = 0; i < QP_ROWS; i++) ps[(size_t)QP_ROWS * g + i] = scale1(quant_scales(W, r + i)[g]);
    }
}

#if defined(Q8_VNNI)
/* q4 rows [r, r + QP_ROWS) (QP_ROWS / 8 row blocks) as a panel of q8's layout: quarter v of a
 * block's group is already 8 rows x 4 columns per lane (columns 4v .. 4v+3 in the low nibbles,
 * 16+4v .. 16+4v+3 in the high ones), so the nibbles need only be widened to bytes, stored as
 * q + 128 = nibble + 120 like q8's weights. The scales are the block's 8 per group. */
static void q4_pack_panel(int8_t* panel, float* ps, const Matrix* W, int r) {
    const int G = W->cols / Q4_GROUP;
    const __m256i m = _mm256_set1_epi8(15), off = _mm256_set1_epi8(120);
    for (int g = 0; g < G; g++)
        for (int h = 0; h < QP_ROWS; h += 8) {
            const uint8_t* b = q4_group(W, r + h, g);
            _mm256_storeu_ps(ps + (size_t)QP_ROWS * g + h, scales8(b));
            for (int v = 0; v < 4; v++) {
                const __m256i q = _mm256_loadu_si256((const __m256i*)(b + Q4_BLOCK_ROWS * sizeof(uint16_t) + 32 * v));
                const __m256i lo = _mm256_add_epi8(_mm256_and_si256(q, m), off);
                const __m256i hi = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 4), m), off);
                int8_t* p = panel + (size_t)QP_ROWS * ((size_t)g * Q4_GROUP + 4 * v) + 4 * h;
                _mm256_storeu_si256((__m256i*)p, lo);
                _mm256_storeu_si256((__m256i*)(p + QP_ROWS * 16), hi);
            }
        }
}
#endif

/* out rows [r, r + QP_ROWS) x tokens t .. t+TT-1 (TT <= QP_TOKENS) from one panel. */
ALWAYS_INLINE void tile_qi_packed(float* out, const int8_t* xq, const float* xsc, const int32_t* xgsum,
                                  const int8_t* panel, const float* ps, const Matrix* W, int r, int t, int TT) {
    const int C = W->cols, R = W->rows, gs = W->group_size, G = C / gs;
    QPf tot[QP_TOKENS];
#pragma GCC unroll 8
    for (int j = 0; j < TT; j++) tot[j] = qp_zero();
    for (int g = 0; g < G; g++) {
        const int8_t* pg = panel + (size_t)QP_ROWS * g * gs;
        const int8_t* xg = xq + (size_t)t * C + (size_t)g * gs;
        QPi s[QP_TOKENS];
#pragma GCC unroll 8
        for (int j = 0; j < TT; j++)
#if defined(Q8_VNNI)
            s[j] = qp_set1(xgsum[(size_t)(t + j) * G + g]);
#else
            s[j] = qp_set1(0);
#endif
#pragma GCC unroll 4
        for (int c = 0; c < gs; c += 4) {
            const QPw wv = qp_load(pg + QP_ROWS * c);
#pragma GCC unroll 8
            for (int j = 0; j < TT; j++) {
                int32_t x4; /* token j's columns c .. c+3 */
                memcpy(&x4, xg + (size_t)j * C + c, sizeof x4);
                s[j] = qp_dot(s[j], wv, qp_set1(x4));
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < TT; j++)
            tot[j] = qp_scale(tot[j], s[j], ps + (size_t)QP_ROWS * g, xsc[(size_t)(t + j) * G + g]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < TT; j++) qp_store(out + (size_t)(t + j) * R + r, tot[j]);
}

/* Whole panels of QP_ROWS rows from r0 (a multiple of QP_ROWS: the driver's chunks are) x all n
 * tokens, at most 64 rows per packing; per block of tokens (token_block) each panel meets the
 * block's tokens QP_TOKENS at a time, then 4, then 1. Returns the first row not done (the rest:
 * tile_qi's or tile_q4's tiles). */
static int rows_qi_packed(const MatmulThread* mt, float* out, const int8_t* xq, const float* xsc, const int32_t* xgsum,
                          const Matrix* W, int n, int r0, int r1) {
    const int C = W->cols, G = C / W->group_size;
    const int max_panels = FLOAT_MAX_PANELS * FLOAT_PANEL_ROWS / QP_ROWS;
    int8_t* panels = mt->qi_pack; /* max_panels * QP_ROWS * C bytes, then the scales (qi_pack_bytes) */
    float* ps = (float*)(void*)(panels + (size_t)max_panels * QP_ROWS * C);
    const int tb = token_block((size_t)C);
    while (r1 - r0 >= QP_ROWS) {
        const int np = (r1 - r0) / QP_ROWS < max_panels ? (r1 - r0) / QP_ROWS : max_panels;
        for (int p = 0; p < np; p++) {
            int8_t* panel = panels + (size_t)p * QP_ROWS * C;
            float* scales = ps + (size_t)p * QP_ROWS * G;
#if defined(Q8_VNNI)
            if (W->type == WEIGHT_Q4) {
                q4_pack_panel(panel, scales, W, r0 + QP_ROWS * p);
                continue;
            }
#endif
            q8_pack_panel(panel, scales, W, r0 + QP_ROWS * p);
        }
        for (int t0 = 0; t0 < n; t0 += tb) {
            const int t1 = t0 + tb < n ? t0 + tb : n;
            for (int p = 0; p < np; p++) {
                const int8_t* pp = panels + (size_t)p * QP_ROWS * C;
                const float* pps = ps + (size_t)p * QP_ROWS * G;
                const int r = r0 + QP_ROWS * p;
                int t = t0;
                for (; t + QP_TOKENS <= t1; t += QP_TOKENS)
                    tile_qi_packed(out, xq, xsc, xgsum, pp, pps, W, r, t, QP_TOKENS);
                for (; t + 4 <= t1; t += 4) tile_qi_packed(out, xq, xsc, xgsum, pp, pps, W, r, t, 4);
                for (; t < t1; t++) tile_qi_packed(out, xq, xsc, xgsum, pp, pps, W, r, t, 1);
            }
        }
        r0 += QP_ROWS * np;
    }
    return r0;
}

/* q4 (kernels.h's row lanes, groups of 32): a kernel of its own for decode and prefill. A block
 * of 8 rows stores each group as 8 scales and four 32-byte quarters; in quarter v the 32-bit
 * lane i holds row i's columns 4v .. 4v+3 in its low nibbles and 16+4v .. 16+4v+3 in its high
 * ones. So masking (low) or shifting and masking (high) gives 8 rows x 4 columns, which the
 * token's 4 activations of those columns, broadcast, meet in one vpmaddubsw (or vpdpbusd): a
 * group ends with one row per lane and no horizontal step (rows side by side would need three
 * per 4 groups, and spilled registers in gcc's build). docs/design.md#checkpoint-layout
 *
 * q4_group_sums: s[j] += the 8 rows' sums over one group of (q + 8) x for tokens j < TT, lane i = row i.
 * w: the group's 128 bytes of values; x + j * C: token j's 32 activations of the group. Without
 * VNNI the sums stay int16 until the group's end: a lane of vpmaddubsw is at most
 * 2 * 15 * 128 = 3840 in magnitude, the 8 of a group 30720 < 32768. Both paths give the same
 * int32. */
ALWAYS_INLINE void q4_group_sums(__m256i s[], const uint8_t* w, const int8_t* x, size_t C, int TT) {
    const __m256i m = _mm256_set1_epi8(15);
#if !defined(Q8_VNNI)
    __m256i s16[4];
#pragma GCC unroll 4
    for (int j = 0; j < TT; j++) s16[j] = _mm256_setzero_si256();
#endif
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m256i b = _mm256_loadu_si256((const __m256i*)(w + 32 * v));
        const __m256i lo = _mm256_and_si256(b, m), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) {
            int32_t xl, xh; /* columns 4v .. 4v+3 and 16+4v .. 16+4v+3 */
            memcpy(&xl, x + j * C + 4 * v, 4);
            memcpy(&xh, x + j * C + 16 + 4 * v, 4);
#if defined(Q8_VNNI)
            s[j] = dpbusd(dpbusd(s[j], lo, _mm256_set1_epi32(xl)), hi, _mm256_set1_epi32(xh));
#else
            s16[j] = _mm256_add_epi16(s16[j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
            s16[j] = _mm256_add_epi16(s16[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
#endif
        }
    }
#if !defined(Q8_VNNI)
#pragma GCC unroll 4
    for (int j = 0; j < TT; j++) s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(s16[j], _mm256_set1_epi16(1)));
#endif
}

/* The block of rows r .. r+7 (computed whole: the last block is padded with zero rows; rows past
 * R are not stored) x tokens t .. t+TT-1 (TT <= 4). Per group and token: the sums of (q + 8) x,
 * corrected to q x with xgsum / 16 (-8 times the group's sum of x, quantize_rows), converted, and
 * scaled into fp32 totals, one row per lane, as AMX scales its tiles (float(s) x the 8 rows'
 * weight scales, then fused with x the activation scale), so q4 prefill has the same bits with
 * AMX on and off. pf: bytes ahead to prefetch into L1 as the block is read, 0 for none. */
ALWAYS_INLINE void tile_q4(float* out, const int8_t* xq, const float* xsc, const int32_t* xgsum, const Matrix* W, int r,
                           int t, int TT, int pf) {
    const int C = W->cols, R = W->rows, G = C / Q4_GROUP;
    const uint8_t* b = q4_group(W, r, 0);
    __m256 tot[4];
#pragma GCC unroll 4
    for (int j = 0; j < TT; j++) tot[j] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++, b += Q4_GROUP_BYTES) {
        if (pf && !(g & 1)) /* two groups: 288 bytes, 4.5 lines (unrolled: gcc otherwise keeps a loop) */
#pragma GCC unroll 5
            for (int o = 0; o < 2 * (int)Q4_GROUP_BYTES; o += 64) _mm_prefetch((const char*)b + pf + o, _MM_HINT_T0);
        __m256i s[4];
        /* the lane's start, -8 x the sum (xgsum / 16), by a vector shift: cheaper than a division in
         * a general register (docs/design.md#prefill-panels) */
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++)
            s[j] = _mm256_srai_epi32(_mm256_set1_epi32(xgsum[(size_t)(t + j) * G + g]), 4);
        q4_group_sums(s, b + Q4_BLOCK_ROWS * sizeof(uint16_t), xq + ((size_t)t * G + g) * Q4_GROUP, (size_t)C, TT);
        const __m256 ws = scales8(b); /* the group's 8 rows' scales */
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++)
            tot[j] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[j]), ws),
                                     _mm256_set1_ps(xsc[(size_t)(t + j) * G + g]), tot[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < TT; j++) {
        if (r + Q4_BLOCK_ROWS <= R) {
            _mm256_storeu_ps(out + (size_t)(t + j) * R + r, tot[j]);
        } else {
            float o[8];
            _mm256_storeu_ps(o, tot[j]);
            for (int i = 0; r + i < R; i++) out[(size_t)(t + j) * R + r + i] = o[i];
        }
    }
}

/* q4 decode, rows [r0, r1) (r0 a multiple of 8: the driver's chunks are): the row blocks in order,
 * each prefetching the plan's distance ahead. */
void rows_q4_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    for (int r = r0; r < r1; r += Q4_BLOCK_ROWS) tile_q4(out, pr->xq, pr->xs, pr->xgsum, W, r, 0, 1, mt->prefetch->q4);
}

/* q4 prefill, the rows [r0, r1) that AMX or the panels did not take: a block of tokens stays in L2
 * (as rows_qi's q8 tiles) while each row block meets them 4 at a time. */
static void q4_prefill_tiles(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0,
                             int r1) {
    const int8_t* xq = pr->xq;
    const float* xsc = pr->xs;
    const int32_t* xgsum = pr->xgsum;
    const int n = pr->n;
    const int tb = token_block((size_t)W->cols);
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        for (int r = r0; r < r1; r += Q4_BLOCK_ROWS) {
            /* the first tile over this block prefetches the next one, a block ahead (as
             * rows_float_nn; docs/design.md#short-prompt-prefetch) */
            int pf = t0 == 0 && r + Q4_BLOCK_ROWS < W->rows ? (W->cols / Q4_GROUP) * (int)Q4_GROUP_BYTES : 0;
            int t = t0;
            for (; t + 4 <= t1; t += 4, pf = 0) tile_q4(out, xq, xsc, xgsum, W, r, t, 4, pf);
            for (; t < t1; t++, pf = 0) tile_q4(out, xq, xsc, xgsum, W, r, t, 1, pf);
        }
    }
}

/* A prompt's q8 or q4 weights x int8 activations for rows [r0, r1): AMX's whole tiles first, then
 * the packed panels, then the format's tiles for what is left: tile_q4's, or tile_qi's with a
 * block of tokens in L2 while every row tile of the chunk uses it. (One token goes straight to
 * rows_qi_n1 or rows_q4_n1.) */
void rows_qi(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const int8_t* xq = pr->xq;
    const float* xsc = pr->xs;
    const int32_t* xsum = pr->xsum;
    const int n = pr->n;
    int ra = r0; /* AMX did every token of rows [r0, ra) */
#if defined(KERNELS_AMX)
    if (pr->plan.amx) ra = amx_chunk(mt, out, xq, xsc, W, n, r0, r1);
#endif
    int rp = ra; /* the panels did every token of rows [ra, rp) */
    if (pr->plan.qi_packed) rp = rows_qi_packed(mt, out, xq, xsc, pr->xgsum, W, n, ra, r1);
    if (W->type == WEIGHT_Q4) {
        q4_prefill_tiles(mt, pr, out, W, rp, r1);
        return;
    }
    /* q8: the rest in tiles of Q8_TILE_ROWS rows x Q8_TILE_TOKENS tokens */
    const int C = W->cols, G = C / W->group_size;
    const int tb = token_block((size_t)C);
    float* ws = mt->scales; /* the row block's scales as floats */
    for (int t0 = 0; t0 < n; t0 += tb) {
        int t1 = t0 + tb < n ? t0 + tb : n;
        int r = rp;
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
#endif /* KERNELS_AVX2 */
