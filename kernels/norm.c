/* norm.c: RMSNorm (QWEN3.md 2.1), the one normalisation of Qwen3, used four ways by forward():
 * before attention, before the MLP, after the last layer (vectors of D = hidden_size values), and
 * as QK-Norm on every query and key head (vectors of head_dim values). Scalar reference first,
 * then the SIMD twins.
 *
 *     out[i] = w[i] * (x[i] * 1/sqrt(mean(x^2) + eps))
 *
 * Why it is written this way:
 *  - eps sits inside the square root (2.1 step 3), and comes from config.json's rms_norm_eps
 *    (1e-6 for Qwen3; llama2.c hard-codes 1e-5, QWEN3.md 7.4);
 *  - the parentheses are the reference's order: normalise first, then multiply by the weight
 *    (2.1 step 4); the weight is used as stored (not Gemma's 1 + w);
 *  - 1/sqrt is computed exactly once per vector (1.0f / sqrtf), not with an approximate rsqrt
 *    instruction: it is one operation per vector, so speed does not care, and the reference's
 *    bits do;
 *  - the twins sum the squares in a different order (several accumulators) with fused
 *    multiply-adds, so they agree with the reference to float rounding, not bit for bit
 *    (tests/test_kernels.c: 1e-5).
 * To watch the four uses on a real prompt: `./run MODEL --show-norms` (docs/rmsnorm.md). */
#include <math.h>

#include "kernels.h"
#include "simd_math.h"

void rmsnorm_scalar(float* out, const float* x, const float* w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

/* The backward pass (for the RMSNorm lab, `make norm-grad`; the engine itself only runs forward):
 * given dy = dL/dy for n_rows vectors, dx = dL/dx and the weight's gradient. With r = sqrt(mean(x^2)
 * + eps), x^ = x / r and g = w * dy (docs/rmsnorm.md derives it):
 *
 *     dx = (g - x^ * mean(g * x^)) / r          dw += dy * x^   (summed over the rows)
 *
 * The second term takes out of g its component along x^: at eps = 0 the norm cannot see x's
 * scale, so its gradient is orthogonal to x (x . dx = 0); eps leaves n * mean(g * x^) * eps /
 * (mean(x^2) + eps) of it. dx is written; dw is added to, so a caller zeroes it once. */
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int n_rows, int n,
                      float eps) {
    for (int r = 0; r < n_rows; r++) {
        const float* xr = x + (size_t)r * n;
        const float* dyr = dy + (size_t)r * n;
        float* dxr = dx + (size_t)r * n;
        float ss = 0.0f, gx = 0.0f;
        for (int i = 0; i < n; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss / (float)n + eps); /* 1 / r, as the forward computes it */
        for (int i = 0; i < n; i++) gx += w[i] * dyr[i] * (xr[i] * inv);
        const float mean_gx = gx / (float)n;
        for (int i = 0; i < n; i++) {
            const float xhat = xr[i] * inv;
            dxr[i] = (w[i] * dyr[i] - xhat * mean_gx) * inv;
            dw[i] += dyr[i] * xhat;
        }
    }
}

#if defined(KERNELS_AVX2)
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
    float ss = hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    __m256 vi = _mm256_set1_ps(inv);
    i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), vi)));
    for (; i < n; i++) out[i] = w[i] * (x[i] * inv);
}
#elif defined(KERNELS_NEON)
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
