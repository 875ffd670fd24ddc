/* rope.c: rotary position embedding with rotate-half ("NeoX") pairing (QWEN3.md 2.4): element i
 * pairs with element i + head_dim/2, not with i + 1 as in llama2.c's (2i, 2i+1) pairs (QWEN3.md 7
 * item 3). The angles' cos and sin come from tables that model.c (rope_tables) computes once per
 * position at load, with theta = config's rope_theta.
 *
 * The twins round as the reference does: each product rounded, then the difference or sum, no
 * fused multiply-add (gcc with the Makefile's -std=c11 does not fuse the reference's either; a
 * compiler that does differs by one rounding, within tests/test_kernels.c's 1e-6). RoPE is a few
 * thousand operations per token, so an fma would save nothing measurable. */
#include "kernels.h"
#include "simd_math.h"

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

#if defined(KERNELS_AVX2)
void rope(float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float* v = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + 8 <= half; i += 8) {
            __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
            __m256 c = _mm256_loadu_ps(cos_t + i), s = _mm256_loadu_ps(sin_t + i);
            _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
            _mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
        }
        for (; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos_t[i] - b * sin_t[i];
            v[i + half] = b * cos_t[i] + a * sin_t[i];
        }
    }
}
#elif defined(KERNELS_NEON)
void rope(float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float* v = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + 4 <= half; i += 4) {
            float32x4_t a = vld1q_f32(v + i), b = vld1q_f32(v + i + half);
            float32x4_t c = vld1q_f32(cos_t + i), s = vld1q_f32(sin_t + i);
            vst1q_f32(v + i, vsubq_f32(vmulq_f32(a, c), vmulq_f32(b, s)));
            vst1q_f32(v + i + half, vaddq_f32(vmulq_f32(b, c), vmulq_f32(a, s)));
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
