/* norm.c: RMSNorm (QWEN3.md 2.1). Scalar reference first, then the SIMD twins. */
#include <math.h>

#include "kernels.h"

#if !defined(KERNELS_SCALAR) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NORM_AVX2 1
#elif !defined(KERNELS_SCALAR) && defined(__ARM_NEON)
#include <arm_neon.h>
#define NORM_NEON 1
#endif

void rmsnorm_scalar(float* out, const float* x, const float* w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

#if defined(NORM_AVX2)
void rmsnorm(float* out, const float* x, const float* w, int n, float eps) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 v0 = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
    }
    a0 = _mm256_add_ps(a0, a1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float ss = _mm_cvtss_f32(s);
    for (; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    __m256 vi = _mm256_set1_ps(inv);
    i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), vi)));
    for (; i < n; i++) out[i] = w[i] * (x[i] * inv);
}
#elif defined(NORM_NEON)
void rmsnorm(float* out, const float* x, const float* w, int n, float eps) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t v0 = vld1q_f32(x + i), v1 = vld1q_f32(x + i + 4);
        a0 = vfmaq_f32(a0, v0, v0);
        a1 = vfmaq_f32(a1, v1, v1);
    }
    float ss = vaddvq_f32(vaddq_f32(a0, a1));
    for (; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(out + i, vmulq_f32(vld1q_f32(w + i), vmulq_n_f32(vld1q_f32(x + i), inv)));
    for (; i < n; i++) out[i] = w[i] * (x[i] * inv);
}
#else
void rmsnorm(float* out, const float* x, const float* w, int n, float eps) {
    rmsnorm_scalar(out, x, w, n, eps);
}
#endif
