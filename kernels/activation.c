/* activation.c: SwiGLU's gate, gate[i] = silu(gate[i]) * up[i] (QWEN3.md 2.2 step 2.11). */
#include <math.h>

#include "kernels.h"
#include "simd_math.h"

void swiglu_scalar(float* gate, const float* up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

#if defined(KERNELS_AVX2)
void swiglu(float* gate, const float* up, int n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
#elif defined(KERNELS_NEON)
void swiglu(float* gate, const float* up, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t g = vld1q_f32(gate + i);
        float32x4_t e = exp128(vnegq_f32(g));
        float32x4_t s = vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e));
        vst1q_f32(gate + i, vmulq_f32(s, vld1q_f32(up + i)));
    }
    for (; i < n; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
#else
void swiglu(float* gate, const float* up, int n) { swiglu_scalar(gate, up, n); }
#endif
