/* simd_math.h: private helpers of the kernel files (not part of the kernels.h interface):
 * horizontal sums, a vector exp and the 8 x 8 and (AVX-512) 16 x 16 transposes. */
#ifndef SIMD_MATH_H
#define SIMD_MATH_H

#if !defined(KERNELS_SCALAR) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KERNELS_AVX2 1
/* With AVX-512 (F, BW, VL) x86/matmul_float.c adds 512-bit prefill tiles and panels (f32, bf16)
 * and bf16 decode on zmm, x86/matmul_int8.c 16-row q8 / q4 panels (with VNNI), and attention.c
 * prefill's 16 query lanes; everything else stays on the AVX2 twins. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define KERNELS_AVX512 1
#endif
/* With AVX-512 BF16 as well, prefill can multiply bf16 weights by bf16-rounded activations
 * (vdpbf16ps) when asked to: kernels_set_bf16_activations. */
#if defined(KERNELS_AVX512) && defined(__AVX512BF16__)
#define KERNELS_BF16_DOT 1
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
    const __m256 hi = _mm256_set1_ps(88.3762626647949f);
    const __m256 lo = _mm256_set1_ps(-87.3365478515625f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
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
#endif

#elif !defined(KERNELS_SCALAR) && defined(__ARM_NEON)
#include <arm_neon.h>
#define KERNELS_NEON 1
#define KERNELS_KV_F16 1 /* fcvtl: half -> fp32 in every arm64 NEON */

static inline float32x4_t exp128(float32x4_t x) {
    const float32x4_t hi = vdupq_n_f32(88.3762626647949f);
    const float32x4_t lo = vdupq_n_f32(-87.3365478515625f);
    uint32x4_t under = vcltq_f32(x, lo);
    x = vminq_f32(vmaxq_f32(x, lo), hi);
    float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500E-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507E-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073E-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894E-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459E-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201E-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    float32x4_t res = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(res), under));
}
#endif

#endif
