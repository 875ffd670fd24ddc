/* simd_math.h: the SIMD helpers of the kernel files; the reference build (KERNELS_SCALAR) sees none
 * of it. */
#ifndef SIMD_MATH_H
#define SIMD_MATH_H
#if !defined(KERNELS_SCALAR)

/* Private to the kernel files (not part of the kernels.h interface): the instruction-set macros,
 * horizontal sums, a vector exp, the 8 x 8 and (AVX-512) 16 x 16 transposes, and two families of
 * fp32 vector operations over which a kernel is written once for every instruction set:
 *
 *   fvec, FV_LANES, fv_*   the fixed-width vector: 8 lanes (ymm) on x86, in AVX-512 builds too
 *                          (docs/design.md#instruction-sets), 4 (a q register) on NEON;
 *   wvec, WV_LANES, wv_*   the widest vector: 16 lanes (zmm) with AVX-512, else fvec itself.
 *
 *   load, store, set1        unaligned loads and stores; every lane x
 *   broadcast(p)             every lane *p (from memory: an FMA takes it as its operand)
 *   add, sub, mul, div, max  lane by lane, each rounded as the instruction does
 *   fma(a, b, c)             a * b + c, rounded once
 *   exp                      exp256 / exp128 in each lane (wv_: exp256's steps on 16 lanes)
 *   if_less(a, b, x, y)      x in the lanes where a < b, else y (a NaN compares false)
 *   transpose(r)             r[LANES] in place: r[j] becomes column j of what came in
 *   load_half                LANES halves widened exactly; where KERNELS_KV_F16 (wv_: AVX-512 always)
 *   load_i8, set1_half       LANES int8 widened exactly; one half in every lane (the q8 KV cache)
 *   wp_*, dot_pairs          (AVX-512 BF16) 16 lanes of bf16 pairs, vdpbf16ps: prefill attention
 *   wb_*, from_i32, set4x4_half, hsum4_store, halves_4x8_t, block_sums4_store, half_pairs,
 *   set1_pair, hmax, store_i16
 *                            (AVX-512 VNNI) 64 bytes, vpdpbusd and vpdpwssd: decode attention
 *                            over a q8 cache
 *   qb_*, fv_dot_i8, fv_set2x4_half, wv_hsum4_store
 *                            (AVX2 without AVX-512) 32 bytes, vpmaddubsw: the same
 *   fv_ only: neg            0 - x on x86, -x on NEON (they differ in the sign of a zero or a NaN)
 *             hsum, hmax     the sum, the maximum of the lanes (hsum: hsum256's order on x86)
 *             store_half     rounded to the nearest half; where KERNELS_KV_F16
 *
 * Each is one instruction or a fixed sequence, always inlined: a kernel written over them compiles
 * to the intrinsics it would name itself, so it rounds as they do. */

#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h" /* ALWAYS_INLINE, half_to_float */

/* The vector exp's constants, one set for its three forms (exp256, AVX-512's wv_exp, which gives
 * exp256's bits lane for lane, and NEON's exp128): x held to [EXP_LO, EXP_HI], n = round(x log2 e),
 * r = x - n ln 2 (ln 2 in two parts), e^x = 2^n (1 + r + r^2 p(r)) with p of degree 5 (Cephes'
 * expf). */
#define EXP_HI 88.3762626647949f
#define EXP_LO (-87.3365478515625f)
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
#define EXP_P0 1.9875691500E-4f
#define EXP_P1 1.3981999507E-3f
#define EXP_P2 8.3334519073E-3f
#define EXP_P3 4.1665795894E-2f
#define EXP_P4 1.6666665459E-1f
#define EXP_P5 5.0000001201E-1f

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KERNELS_AVX2 1
/* With AVX-512 (F, BW, VL) x86/matmul_float.c adds 512-bit prefill tiles and panels (f32, bf16)
 * and bf16 decode on zmm, x86/matmul_int8.c 16-row q8 / q4 panels (with VNNI), and fast/attention.c
 * prefill's 16 query lanes and (with VNNI) decode over fp16 and q8 caches; everything else stays
 * on the AVX2 twins. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define KERNELS_AVX512 1
#endif
/* With AVX-512 BF16 as well, prefill can multiply bf16 weights by bf16-rounded activations
 * (vdpbf16ps) when asked to: kernels_set_bf16_activations. */
#if defined(KERNELS_AVX512) && defined(__AVX512BF16__)
#define KERNELS_BF16_DOT 1
#endif
/* With AVX-512 VNNI as well, decode attention over a q8 cache multiplies the int8 keys by an
 * int8-quantised query (vpdpbusd, 64 products per instruction): fast/attention.c's q8_scores. */
#if defined(KERNELS_AVX512) && defined(__AVX512VNNI__)
#define KERNELS_Q8_DOT 1
#define KERNELS_Q8_DOT_MAX_DIM 256 /* head_dims up to this take it; a longer one widens its keys */
#endif
/* With AVX2 alone (and F16C, for the scales) the same, 32 products per vpmaddubsw: the qb_ helpers. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(KERNELS_AVX512)
#define KERNELS_Q8_DOT 1
#define KERNELS_Q8_DOT_MAX_DIM 256
#endif
/* The fp16 KV cache (`--kv-cache f16`) is widened in registers with F16C's vcvtph2ps, which every
 * AVX2 CPU we know of has but -mavx2 does not imply; without it, fp16 attention takes the scalar
 * reference. */
#if defined(__F16C__)
#define KERNELS_KV_F16 1
#endif
/* With AMX (tile registers and their int8 product, Intel Sapphire Rapids and later) on Linux, q8
 * and q4 prefill multiply tiles of 16 tokens x 16 rows x 64 (q4: 32) columns per instruction,
 * where the kernel grants the tile state (x86/matmul_amx.c, amx_request; kernels_amx() says
 * whether it did). gcc spells the macros __AMX_TILE__, __AMX_INT8__; clang __AMXTILE__, __AMXINT8__. */
#if defined(KERNELS_AVX512) && defined(__linux__) && \
    ((defined(__AMX_TILE__) && defined(__AMX_INT8__)) || (defined(__AMXTILE__) && defined(__AMXINT8__)))
#define KERNELS_AMX 1
#endif
/* With AMX-BF16 too, bf16 prefill multiplies tiles of 16 tokens x 16 rows x 32 columns of bf16
 * into fp32 tiles: the activations rounded to bf16 (`--bf16-activations`,
 * x86/matmul_float.c rows_bf16_packed) or, by default, split into three bf16 parts (rows_bf16_split). */
#if defined(KERNELS_AMX) && defined(KERNELS_BF16_DOT) && (defined(__AMX_BF16__) || defined(__AMXBF16__))
#define KERNELS_AMX_BF16 1
#endif

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x, relative error about 2e-7 on [-87, 88]; 0 below -87.3, +inf-ish clamp above 88.7. */
static inline __m256 exp256(__m256 x) {
    const __m256 hi = _mm256_set1_ps(EXP_HI);
    const __m256 lo = _mm256_set1_ps(EXP_LO);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, res);
}

/* 8 rows of 8 four-byte words (floats, or q8's groups of 4 values), in place: r[j] becomes the
 * column j of what came in (the AVX2 panels: f32/bf16 here, q8 in q8_pack_panel). */
static inline void transpose8_ps(__m256 r[8]) {
    __m256 a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* per 128-bit half H: r_i[4H], r_i+1[4H], r_i[4H+1], r_i+1[4H+1] */
        a[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* the same for 4H+2, 4H+3 */
    }
    for (int q = 0; q < 8; q += 4) { /* b[q + k], half H: rows q .. q+3 of column 4H + k */
        b[q] = _mm256_shuffle_ps(a[q], a[q + 2], 0x44);
        b[q + 1] = _mm256_shuffle_ps(a[q], a[q + 2], 0xEE);
        b[q + 2] = _mm256_shuffle_ps(a[q + 1], a[q + 3], 0x44);
        b[q + 3] = _mm256_shuffle_ps(a[q + 1], a[q + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) { /* column k: the low halves of b[k] (rows 0-3) and b[4 + k] (4-7); 4 + k: the high */
        r[k] = _mm256_permute2f128_ps(b[k], b[4 + k], 0x20);
        r[4 + k] = _mm256_permute2f128_ps(b[k], b[4 + k], 0x31);
    }
}

typedef __m256 fvec;
#define FV_LANES 8
ALWAYS_INLINE fvec fv_load(const float* p) { return _mm256_loadu_ps(p); }
ALWAYS_INLINE void fv_store(float* p, fvec v) { _mm256_storeu_ps(p, v); }
ALWAYS_INLINE fvec fv_set1(float x) { return _mm256_set1_ps(x); }
ALWAYS_INLINE fvec fv_broadcast(const float* p) { return _mm256_broadcast_ss(p); }
ALWAYS_INLINE fvec fv_add(fvec a, fvec b) { return _mm256_add_ps(a, b); }
ALWAYS_INLINE fvec fv_sub(fvec a, fvec b) { return _mm256_sub_ps(a, b); }
ALWAYS_INLINE fvec fv_mul(fvec a, fvec b) { return _mm256_mul_ps(a, b); }
ALWAYS_INLINE fvec fv_div(fvec a, fvec b) { return _mm256_div_ps(a, b); }
ALWAYS_INLINE fvec fv_fma(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
ALWAYS_INLINE fvec fv_max(fvec a, fvec b) { return _mm256_max_ps(a, b); }
ALWAYS_INLINE fvec fv_neg(fvec x) { return _mm256_sub_ps(_mm256_setzero_ps(), x); }
ALWAYS_INLINE fvec fv_abs(fvec x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
ALWAYS_INLINE fvec fv_exp(fvec x) { return exp256(x); }
ALWAYS_INLINE fvec fv_if_less(fvec a, fvec b, fvec x, fvec y) {
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
}
ALWAYS_INLINE float fv_hsum(fvec v) { return hsum256(v); }
ALWAYS_INLINE float fv_hmax(fvec v) {
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}
ALWAYS_INLINE void fv_transpose(fvec r[FV_LANES]) { transpose8_ps(r); }
/* 8 int8 widened to fp32 exactly (the q8 KV cache), and one half in every lane (its scales). */
ALWAYS_INLINE fvec fv_load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
ALWAYS_INLINE fvec fv_set1_half(uint16_t h) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_set1_epi16((short)h));
#else
    return _mm256_set1_ps(half_to_float(h));
#endif
}
/* 8 values rounded to integers (nearest, ties to even, as rintf), clamped to ±127, stored as int8. */
ALWAYS_INLINE void fv_store_i8(int8_t* p, fvec v) {
    v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    const __m256i i = _mm256_cvtps_epi32(v);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64((__m128i*)p, _mm_packs_epi16(w, w));
}
#if defined(KERNELS_KV_F16)
/* F16C's vcvtph2ps, vcvtps2ph. */
ALWAYS_INLINE fvec fv_load_half(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
ALWAYS_INLINE void fv_store_half(uint16_t* p, fvec v) {
    _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#endif

#if defined(KERNELS_Q8_DOT) && !defined(KERNELS_AVX512)
/* qbytes: 32 int8 as 8 int32 lanes of 4, the operand of fv_dot_i8. */
typedef __m256i qbytes;
/* n bytes (32, or 16 with zeros above: nothing read past them). */
ALWAYS_INLINE qbytes qb_load(const void* p, int n) {
    return n == 32 ? _mm256_loadu_si256((const __m256i*)p) : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i*)p));
}
ALWAYS_INLINE qbytes qb_abs(qbytes x) { return _mm256_abs_epi8(x); }
/* Lane l: the sum of the four products of a's bytes and b's in lane l as a float, exact (a_abs is
 * |a|): vpmaddubsw multiplies |a| (unsigned) by b with a's sign, and with |a|, |b| <= 127 (a q8
 * row's values) its sums of two products stay below 2^15, so nothing saturates. */
ALWAYS_INLINE fvec fv_dot_i8(qbytes a_abs, qbytes a, qbytes b) {
    const __m256i pairs = _mm256_maddubs_epi16(a_abs, _mm256_sign_epi8(b, a));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
/* Halves p[0 .. n) (n 1 or 2) widened, p[g] in lanes 4g .. 4g + 3; zeros past them. */
ALWAYS_INLINE fvec fv_set2x4_half(const uint16_t* p, int n) {
    const uint32_t two = p[0] | (n > 1 ? (uint32_t)p[1] << 16 : 0);
    const __m128 s = _mm_cvtph_ps(_mm_cvtsi32_si128((int)two));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}
/* out[i] = scale x the sum of v[i]'s lanes for i < n (n <= 4): four sums in one tree of horizontal
 * adds, each in the same order whichever i it is and whatever n is. */
ALWAYS_INLINE void fv_hsum4_store(float* out, int n, fvec v0, fvec v1, fvec v2, fvec v3, float scale) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    const __m128 r = _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)), _mm_set1_ps(scale));
    float four[4];
    _mm_storeu_ps(four, r);
    for (int i = 0; i < n; i++) out[i] = four[i];
}
#endif

#if defined(KERNELS_AVX512)
/* 16 rows of 16 four-byte words, in place: r[j] becomes the column j of what came in. Three
 * rounds of interleaving (32-bit, 64-bit, 128-bit lanes), 64 shuffles. */
static inline void transpose16_epi32(__m512i r[16]) {
    __m512i b[16], c[16];
    for (int i = 0; i < 16; i += 2) {
        b[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);     /* per 128-bit lane L: r_i[4L], r_i+1[4L], r_i[4L+1], r_i+1[4L+1] */
        b[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]); /* the same for 4L+2, 4L+3 */
    }
    for (int q = 0; q < 16; q += 4) { /* c[q + k], lane L: rows q .. q+3 of column 4L + k */
        c[q] = _mm512_unpacklo_epi64(b[q], b[q + 2]);
        c[q + 1] = _mm512_unpackhi_epi64(b[q], b[q + 2]);
        c[q + 2] = _mm512_unpacklo_epi64(b[q + 1], b[q + 3]);
        c[q + 3] = _mm512_unpackhi_epi64(b[q + 1], b[q + 3]);
    }
    for (int k = 0; k < 4; k++) { /* column 4L + k: lane L of c[k], c[4+k], c[8+k], c[12+k] */
        const __m512i d0 = _mm512_shuffle_i32x4(c[k], c[4 + k], 0x44), d1 = _mm512_shuffle_i32x4(c[k], c[4 + k], 0xEE);
        const __m512i d2 = _mm512_shuffle_i32x4(c[8 + k], c[12 + k], 0x44), d3 = _mm512_shuffle_i32x4(c[8 + k], c[12 + k], 0xEE);
        r[k] = _mm512_shuffle_i32x4(d0, d2, 0x88);
        r[4 + k] = _mm512_shuffle_i32x4(d0, d2, 0xDD);
        r[8 + k] = _mm512_shuffle_i32x4(d1, d3, 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(d1, d3, 0xDD);
    }
}

typedef __m512 wvec;
#define WV_LANES 16
ALWAYS_INLINE wvec wv_load(const float* p) { return _mm512_loadu_ps(p); }
ALWAYS_INLINE void wv_store(float* p, wvec v) { _mm512_storeu_ps(p, v); }
ALWAYS_INLINE wvec wv_set1(float x) { return _mm512_set1_ps(x); }
ALWAYS_INLINE wvec wv_broadcast(const float* p) { return _mm512_set1_ps(*p); }
ALWAYS_INLINE wvec wv_add(wvec a, wvec b) { return _mm512_add_ps(a, b); }
ALWAYS_INLINE wvec wv_sub(wvec a, wvec b) { return _mm512_sub_ps(a, b); }
ALWAYS_INLINE wvec wv_mul(wvec a, wvec b) { return _mm512_mul_ps(a, b); }
ALWAYS_INLINE wvec wv_div(wvec a, wvec b) { return _mm512_div_ps(a, b); }
ALWAYS_INLINE wvec wv_fma(wvec a, wvec b, wvec c) { return _mm512_fmadd_ps(a, b, c); }
ALWAYS_INLINE wvec wv_max(wvec a, wvec b) { return _mm512_max_ps(a, b); }
/* exp256's steps on 16 lanes: lane for lane the bits of fv_exp. */
ALWAYS_INLINE wvec wv_exp(wvec x) {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(e));
}
ALWAYS_INLINE wvec wv_if_less(wvec a, wvec b, wvec x, wvec y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
}
ALWAYS_INLINE void wv_transpose(wvec r[WV_LANES]) {
    __m512i t[WV_LANES];
    for (int k = 0; k < WV_LANES; k++) t[k] = _mm512_castps_si512(r[k]);
    transpose16_epi32(t);
    for (int k = 0; k < WV_LANES; k++) r[k] = _mm512_castsi512_ps(t[k]);
}
ALWAYS_INLINE wvec wv_load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
ALWAYS_INLINE wvec wv_set1_half(uint16_t h) { return _mm512_cvtph_ps(_mm256_set1_epi16((short)h)); }
/* vcvtph2ps on zmm is AVX-512F's own: no F16C needed. */
ALWAYS_INLINE wvec wv_load_half(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }

#if defined(KERNELS_Q8_DOT)
/* wbytes: 64 bytes as 16 int32 lanes of 4, vpdpbusd's operand. */
typedef __m512i wbytes;
/* The bytes where mask has a bit, zeros elsewhere (nothing read there). */
ALWAYS_INLINE wbytes wb_load(const void* p, uint64_t mask) { return _mm512_maskz_loadu_epi8(mask, p); }
ALWAYS_INLINE wbytes wb_set1(uint8_t b) { return _mm512_set1_epi8((char)b); }
ALWAYS_INLINE wbytes wb_xor(wbytes a, wbytes b) { return _mm512_xor_si512(a, b); }
ALWAYS_INLINE wbytes wb_neg(wbytes x) { return _mm512_sub_epi32(_mm512_setzero_si512(), x); } /* per int32 lane */
/* Lane l: acc + the four products of u's bytes (unsigned) and s's (signed) in lane l, exact. */
ALWAYS_INLINE wbytes wb_dot(wbytes acc, wbytes u, wbytes s) { return _mm512_dpbusd_epi32(acc, u, s); }
ALWAYS_INLINE wvec wv_from_i32(wbytes x) { return _mm512_cvtepi32_ps(x); }
/* Halves p[0 .. n) (n <= 4) widened, p[g] in lanes 4g .. 4g + 3; zeros in the lanes past them. */
ALWAYS_INLINE wvec wv_set4x4_half(const uint16_t* p, int n) {
    const wvec s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1), p));
    return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), s);
}
/* The int32 lanes of four rows' vectors transposed within each 128-bit block: lane 4b + r of r[c]
 * was lane 4b + c of r[r]. */
ALWAYS_INLINE void wb_transpose4(wbytes r[4]) {
    const wbytes t0 = _mm512_unpacklo_epi32(r[0], r[1]), t1 = _mm512_unpackhi_epi32(r[0], r[1]);
    const wbytes t2 = _mm512_unpacklo_epi32(r[2], r[3]), t3 = _mm512_unpackhi_epi32(r[2], r[3]);
    r[0] = _mm512_unpacklo_epi64(t0, t2), r[1] = _mm512_unpackhi_epi64(t0, t2);
    r[2] = _mm512_unpacklo_epi64(t1, t3), r[3] = _mm512_unpackhi_epi64(t1, t3);
}
/* Lane c of each 128-bit block of x in all four lanes of that block. */
ALWAYS_INLINE wbytes wb_block_lane(wbytes x, int c) {
    const __m512i base = _mm512_set_epi32(12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0);
    return _mm512_permutexvar_epi32(_mm512_add_epi32(base, _mm512_set1_epi32(c)), x);
}
/* The sum of each 128-bit block's four int32 lanes, in all four. */
ALWAYS_INLINE wbytes wb_block_sums(wbytes x) {
    x = _mm512_add_epi32(x, _mm512_shuffle_epi32(x, _MM_PERM_BADC));
    return _mm512_add_epi32(x, _mm512_shuffle_epi32(x, _MM_PERM_CDAB));
}
/* Eight halves of each of four rows (p[r][0 .. 8)) widened and transposed: lane 4g + r of out[s] is
 * p[r][4s + g]. */
ALWAYS_INLINE void wv_halves_4x8_t(const uint16_t* const p[4], wvec out[2]) {
    __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)p[0]));
    x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i*)p[1]), 1);
    x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i*)p[2]), 2);
    x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i*)p[3]), 3);
    x = _mm512_permutexvar_epi16(_mm512_set_epi16(31, 23, 15, 7, 30, 22, 14, 6, 29, 21, 13, 5, 28, 20, 12, 4, 27, 19,
                                                  11, 3, 26, 18, 10, 2, 25, 17, 9, 1, 24, 16, 8, 0),
                                 x);
    out[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(x));
    out[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x, 1));
}
/* out[r] = scale x the sum of v's lanes 4b + r over the four blocks b, for r < n (n <= 4): the same
 * order of additions for every r. */
ALWAYS_INLINE void wv_block_sums4_store(float* out, int n, wvec v, float scale) {
    const __m256 y = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 r = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
    _mm_mask_storeu_ps(out, (__mmask8)((1u << n) - 1), _mm_mul_ps(r, _mm_set1_ps(scale)));
}
/* out[i] = scale x the sum of v[i]'s lanes for i < n (n <= 4): four sums in one tree of horizontal
 * adds, each sum in the same order whichever i it is and whatever n is. */
ALWAYS_INLINE void wv_hsum4_store(float* out, int n, wvec v0, wvec v1, wvec v2, wvec v3, float scale) {
    const __m256 y0 = _mm256_add_ps(_mm512_castps512_ps256(v0), _mm512_extractf32x8_ps(v0, 1));
    const __m256 y1 = _mm256_add_ps(_mm512_castps512_ps256(v1), _mm512_extractf32x8_ps(v1, 1));
    const __m256 y2 = _mm256_add_ps(_mm512_castps512_ps256(v2), _mm512_extractf32x8_ps(v2, 1));
    const __m256 y3 = _mm256_add_ps(_mm512_castps512_ps256(v3), _mm512_extractf32x8_ps(v3, 1));
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(y0, y1), _mm256_hadd_ps(y2, y3));
    const __m128 r = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    _mm_mask_storeu_ps(out, (__mmask8)((1u << n) - 1), _mm_mul_ps(r, _mm_set1_ps(scale)));
}
/* Lane l: acc + the two products of a's int16 pair in lane l and the pair at p, exact: vpdpwssd
 * with p broadcast as its memory operand (gcc 12 does not fold the broadcast of the intrinsics). */
typedef int32_t __attribute__((may_alias)) int32_alias;
ALWAYS_INLINE wbytes wb_dot_words_at(wbytes acc, wbytes a, const int16_t* p) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const int32_alias*)p));
    return acc;
}
/* Two rows' 32 int8 values, widened to int16 and paired: lane i of out[k] holds (a[16k + i],
 * b[16k + i]) as two int16, a's in the low half. */
ALWAYS_INLINE void wb_word_pairs2(const int8_t* a, const int8_t* b, wbytes out[2]) {
    const __m256i x = _mm256_loadu_si256((const __m256i*)a), y = _mm256_loadu_si256((const __m256i*)b);
    const __m256i lo = _mm256_unpacklo_epi8(x, y), hi = _mm256_unpackhi_epi8(x, y); /* per 16 values: 0-7, 8-15 */
    out[0] = _mm512_cvtepi8_epi16(_mm256_permute2x128_si256(lo, hi, 0x20));
    out[1] = _mm512_cvtepi8_epi16(_mm256_permute2x128_si256(lo, hi, 0x31));
}
/* Two rows' eight halves widened and interleaved: lanes (a[0], b[0], a[1], b[1], ...). */
ALWAYS_INLINE wvec wv_half_pairs(const uint16_t* a, const uint16_t* b) {
    const __m128i x = _mm_loadu_si128((const __m128i*)a), y = _mm_loadu_si128((const __m128i*)b);
    return _mm512_cvtph_ps(_mm256_set_m128i(_mm_unpackhi_epi16(x, y), _mm_unpacklo_epi16(x, y)));
}
/* p[0] and p[1] in alternate lanes: (p[0], p[1], p[0], p[1], ...). */
ALWAYS_INLINE wvec wv_set1_pair(const float* p) {
    double x;
    memcpy(&x, p, 8);
    return _mm512_castpd_ps(_mm512_set1_pd(x));
}
ALWAYS_INLINE float wv_hmax(wvec v) { return _mm512_reduce_max_ps(v); }
/* v's lanes rounded to integers (to nearest, ties to even) and stored as int16; |v| < 32767.5. */
ALWAYS_INLINE void wv_store_i16(int16_t* p, wvec v) {
    _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(v)));
}
#endif

#if defined(KERNELS_BF16_DOT)
/* wpair: 16 lanes of two bf16 each, vdpbf16ps's operand: lane l += a.lo * b.lo + a.hi * b.hi in
 * fp32. Rounding to bf16 is to nearest even (vcvtne*ps2bf16, as export.py's bf16). */
typedef __m512i wpair;
ALWAYS_INLINE wpair wp_load(const uint32_t* p) { return _mm512_loadu_si512(p); }
ALWAYS_INLINE void wp_store(uint32_t* p, wpair v) { _mm512_storeu_si512(p, v); }
ALWAYS_INLINE wpair wp_set1(uint32_t pair) { return _mm512_set1_epi32((int)pair); }
ALWAYS_INLINE wvec wv_dot_pairs(wvec acc, wpair a, wpair b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
/* Lane l = (bf16(lo[l]), bf16(hi[l])): vcvtne2ps2bf16 gives lo's 16 then hi's 16 words, one word
 * permutation interleaves them. */
ALWAYS_INLINE wpair wp_pack(wvec lo, wvec hi) {
    static const uint16_t interleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                            8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(interleave), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}
/* 16 values as bf16, in order: 8 pairs. */
ALWAYS_INLINE void wv_store_bf16(uint16_t* p, wvec v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }
#endif
#endif

#elif defined(__ARM_NEON)
#include <arm_neon.h>
#define KERNELS_NEON 1
#define KERNELS_KV_F16 1 /* fcvtl: half -> fp32 in every arm64 NEON */

static inline float32x4_t exp128(float32x4_t x) {
    const float32x4_t hi = vdupq_n_f32(EXP_HI);
    const float32x4_t lo = vdupq_n_f32(EXP_LO);
    uint32x4_t under = vcltq_f32(x, lo);
    x = vminq_f32(vmaxq_f32(x, lo), hi);
    float32x4_t n = vrndnq_f32(vmulq_n_f32(x, EXP_LOG2E));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(EXP_LN2_HI));
    r = vfmsq_f32(r, n, vdupq_n_f32(EXP_LN2_LO));
    float32x4_t p = vdupq_n_f32(EXP_P0);
    p = vfmaq_f32(vdupq_n_f32(EXP_P1), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P5), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    float32x4_t res = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(res), under));
}

typedef float32x4_t fvec;
#define FV_LANES 4
ALWAYS_INLINE fvec fv_load(const float* p) { return vld1q_f32(p); }
ALWAYS_INLINE void fv_store(float* p, fvec v) { vst1q_f32(p, v); }
ALWAYS_INLINE fvec fv_set1(float x) { return vdupq_n_f32(x); }
ALWAYS_INLINE fvec fv_broadcast(const float* p) { return vld1q_dup_f32(p); }
ALWAYS_INLINE fvec fv_add(fvec a, fvec b) { return vaddq_f32(a, b); }
ALWAYS_INLINE fvec fv_sub(fvec a, fvec b) { return vsubq_f32(a, b); }
ALWAYS_INLINE fvec fv_mul(fvec a, fvec b) { return vmulq_f32(a, b); }
ALWAYS_INLINE fvec fv_div(fvec a, fvec b) { return vdivq_f32(a, b); }
ALWAYS_INLINE fvec fv_fma(fvec a, fvec b, fvec c) { return vfmaq_f32(c, a, b); }
/* vmaxnm: a NaN in a gives b, as x86's vmaxps does (a NaN in b gives a here, b there) */
ALWAYS_INLINE fvec fv_max(fvec a, fvec b) { return vmaxnmq_f32(a, b); }
ALWAYS_INLINE fvec fv_neg(fvec x) { return vnegq_f32(x); }
ALWAYS_INLINE fvec fv_abs(fvec x) { return vabsq_f32(x); }
ALWAYS_INLINE fvec fv_exp(fvec x) { return exp128(x); }
ALWAYS_INLINE fvec fv_if_less(fvec a, fvec b, fvec x, fvec y) { return vbslq_f32(vcltq_f32(a, b), x, y); }
ALWAYS_INLINE float fv_hsum(fvec v) { return vaddvq_f32(v); }
ALWAYS_INLINE float fv_hmax(fvec v) { return vmaxvq_f32(v); }
ALWAYS_INLINE void fv_transpose(fvec r[FV_LANES]) {
    const float32x4x2_t a = vtrnq_f32(r[0], r[1]), b = vtrnq_f32(r[2], r[3]);
    r[0] = vcombine_f32(vget_low_f32(a.val[0]), vget_low_f32(b.val[0]));
    r[1] = vcombine_f32(vget_low_f32(a.val[1]), vget_low_f32(b.val[1]));
    r[2] = vcombine_f32(vget_high_f32(a.val[0]), vget_high_f32(b.val[0]));
    r[3] = vcombine_f32(vget_high_f32(a.val[1]), vget_high_f32(b.val[1]));
}
/* 4 int8 widened to fp32 exactly; reads 8 bytes (a q8 cache row's values are followed by its scales). */
ALWAYS_INLINE fvec fv_load_i8(const int8_t* p) { return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vld1_s8(p))))); }
ALWAYS_INLINE fvec fv_set1_half(uint16_t h) { return vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))); }
/* 4 values rounded to integers (nearest, ties to even, as rintf), clamped to ±127, stored as int8. */
ALWAYS_INLINE void fv_store_i8(int8_t* p, fvec v) {
    /* vmaxnm: a NaN lane to -127, as x86's vmaxps gives */
    const int32x4_t i = vcvtq_s32_f32(vminq_f32(vmaxnmq_f32(vrndnq_f32(v), vdupq_n_f32(-127.0f)), vdupq_n_f32(127.0f)));
    const int16x4_t w = vmovn_s32(i);
    const int8x8_t b = vmovn_s16(vcombine_s16(w, w));
    const int32_t four = vget_lane_s32(vreinterpret_s32_s8(b), 0);
    memcpy(p, &four, sizeof four);
}
/* fcvtl, fcvtn. */
ALWAYS_INLINE fvec fv_load_half(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
ALWAYS_INLINE void fv_store_half(uint16_t* p, fvec v) { vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(v))); }
#endif

/* Without AVX-512 the widest vector is the fixed one. */
#if (defined(KERNELS_AVX2) && !defined(KERNELS_AVX512)) || defined(KERNELS_NEON)
typedef fvec wvec;
#define WV_LANES FV_LANES
#define wv_load fv_load
#define wv_store fv_store
#define wv_set1 fv_set1
#define wv_broadcast fv_broadcast
#define wv_add fv_add
#define wv_sub fv_sub
#define wv_mul fv_mul
#define wv_div fv_div
#define wv_fma fv_fma
#define wv_max fv_max
#define wv_exp fv_exp
#define wv_if_less fv_if_less
#define wv_transpose fv_transpose
#define wv_load_i8 fv_load_i8
#define wv_set1_half fv_set1_half
#define wv_hsum4_store fv_hsum4_store /* AVX2 alone: with KERNELS_Q8_DOT */
#if defined(KERNELS_KV_F16)
#define wv_load_half fv_load_half
#endif
#endif

#endif /* !KERNELS_SCALAR */
#endif
