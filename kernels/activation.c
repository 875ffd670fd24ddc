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

/* swiglu_span: the fastest twin compiled in, on one thread. swiglu() below splits long rows
 * (a prefill chunk's nb x F) over the kernel threads. */
#if defined(KERNELS_AVX2)
static void swiglu_span(float* gate, const float* up, int n) {
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
static void swiglu_span(float* gate, const float* up, int n) {
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
static void swiglu_span(float* gate, const float* up, int n) { swiglu_scalar(gate, up, n); }
#endif

/* Spans start at multiples of 64 values, so every value goes through the same code (vector body or
 * scalar tail) as in one call over all n: the bits do not depend on the thread count. */
#define SWIGLU_PARALLEL (32 * 1024) /* values; below this one thread is quicker than a dispatch */

typedef struct {
    float* gate;
    const float* up;
} Swiglu;

static void swiglu_part(void* ctx, int i0, int i1) {
    const Swiglu* j = ctx;
    swiglu_span(j->gate + i0, j->up + i0, i1 - i0);
}

void swiglu(Kernels* k, float* gate, const float* up, int n) {
    if (n < SWIGLU_PARALLEL) { /* little work (a decoded token): here, no dispatch */
        swiglu_span(gate, up, n);
        return;
    }
    Swiglu j = {gate, up};
    parallel_spans(k, n, 64, swiglu_part, &j);
}
