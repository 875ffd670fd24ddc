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

#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
void swiglu(float* gate, const float* up, int n) {
    const fvec one = fv_set1(1.0f);
    int i = 0;
    for (; i + FV_LANES <= n; i += FV_LANES) {
        fvec g = fv_load(gate + i);
        fvec s = fv_div(g, fv_add(one, fv_exp(fv_neg(g))));
        fv_store(gate + i, fv_mul(s, fv_load(up + i)));
    }
    for (; i < n; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
#else
void swiglu(float* gate, const float* up, int n) { swiglu_scalar(gate, up, n); }
#endif
