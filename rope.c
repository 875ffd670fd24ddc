/* rope.c: rotary position embedding with rotate-half ("NeoX") pairing (QWEN3.md 2.4):
 * element i pairs with element i + head_dim/2, never with i+1. */
#include "kernels.h"

#if !defined(KERNELS_SCALAR) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ROPE_AVX2 1
#elif !defined(KERNELS_SCALAR) && defined(__ARM_NEON)
#include <arm_neon.h>
#define ROPE_NEON 1
#endif

void rope_scalar(float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float* v = x + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            float c = cos_t[i], s = sin_t[i];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

#if defined(ROPE_AVX2)
void rope(float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float* v = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + 8 <= half; i += 8) {
            __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
            __m256 c = _mm256_loadu_ps(cos_t + i), s = _mm256_loadu_ps(sin_t + i);
            /* a*c - b*s and b*c + a*s, rounded like the reference (product, then fma) */
            _mm256_storeu_ps(v + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
            _mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
        }
        for (; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos_t[i] - b * sin_t[i];
            v[i + half] = b * cos_t[i] + a * sin_t[i];
        }
    }
}
#elif defined(ROPE_NEON)
void rope(float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float* v = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + 4 <= half; i += 4) {
            float32x4_t a = vld1q_f32(v + i), b = vld1q_f32(v + i + half);
            float32x4_t c = vld1q_f32(cos_t + i), s = vld1q_f32(sin_t + i);
            vst1q_f32(v + i, vfmsq_f32(vmulq_f32(a, c), b, s));
            vst1q_f32(v + i + half, vfmaq_f32(vmulq_f32(b, c), a, s));
        }
        for (; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos_t[i] - b * sin_t[i];
            v[i + half] = b * cos_t[i] + a * sin_t[i];
        }
    }
}
#else
void rope(float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t) {
    rope_scalar(x, n_heads, head_dim, cos_t, sin_t);
}
#endif
