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

#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
void rope(float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float* v = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + FV_LANES <= half; i += FV_LANES) {
            fvec a = fv_load(v + i), b = fv_load(v + i + half);
            fvec c = fv_load(cos_t + i), s = fv_load(sin_t + i);
            fv_store(v + i, fv_sub(fv_mul(a, c), fv_mul(b, s)));
            fv_store(v + i + half, fv_add(fv_mul(b, c), fv_mul(a, s)));
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
