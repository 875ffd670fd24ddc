/* attention.c: softmax and the attention of one query head over the KV cache (QWEN3.md 2.2 step 7). */
#include <math.h>

#include "kernels.h"
#include "simd_math.h"

void softmax_scalar(float* x, int n) {
    if (n <= 0) return;
    float m = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > m) m = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void attention_head_scalar(float* out, const float* q, const float* keys, const float* values,
                           int stride, int n_pos, int head_dim, float scale, float* att) {
    for (int t = 0; t < n_pos; t++) {
        const float* k = keys + (size_t)t * stride;
        float s = 0.0f;
        for (int i = 0; i < head_dim; i++) s += q[i] * k[i];
        att[t] = s * scale;
    }
    softmax_scalar(att, n_pos);
    for (int i = 0; i < head_dim; i++) out[i] = 0.0f;
    for (int t = 0; t < n_pos; t++) {
        const float* v = values + (size_t)t * stride;
        float a = att[t];
        for (int i = 0; i < head_dim; i++) out[i] += a * v[i];
    }
}

#if defined(KERNELS_AVX2)
void softmax(float* x, int n) {
    if (n <= 0) return;
    int i = 0;
    __m256 vm = _mm256_set1_ps(x[0]);
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float m = _mm_cvtss_f32(m4);
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    vm = _mm256_set1_ps(m);
    __m256 vs = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        vs = _mm256_add_ps(vs, e);
    }
    float sum = hsum256(vs);
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    __m256 vi = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vi));
    for (; i < n; i++) x[i] *= inv;
}

void attention_head(float* out, const float* q, const float* keys, const float* values,
                    int stride, int n_pos, int head_dim, float scale, float* att) {
    if ((head_dim & 31) != 0) {
        attention_head_scalar(out, q, keys, values, stride, n_pos, head_dim, scale, att);
        return;
    }
    for (int t = 0; t < n_pos; t++) {
        const float* k = keys + (size_t)t * stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int i = 0; i < head_dim; i += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k + i + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 16), _mm256_loadu_ps(k + i + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 24), _mm256_loadu_ps(k + i + 24), a3);
        }
        att[t] = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) * scale;
    }
    softmax(att, n_pos);
    /* out = sum_t att[t] v_t, 32 outputs at a time in registers */
    for (int i = 0; i < head_dim; i += 32) {
        __m256 o0 = _mm256_setzero_ps(), o1 = _mm256_setzero_ps();
        __m256 o2 = _mm256_setzero_ps(), o3 = _mm256_setzero_ps();
        for (int t = 0; t < n_pos; t++) {
            const float* v = values + (size_t)t * stride + i;
            __m256 a = _mm256_broadcast_ss(att + t);
            o0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v), o0);
            o1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 8), o1);
            o2 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 16), o2);
            o3 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 24), o3);
        }
        _mm256_storeu_ps(out + i, o0);
        _mm256_storeu_ps(out + i + 8, o1);
        _mm256_storeu_ps(out + i + 16, o2);
        _mm256_storeu_ps(out + i + 24, o3);
    }
}
#elif defined(KERNELS_NEON)
void softmax(float* x, int n) {
    if (n <= 0) return;
    int i = 0;
    float32x4_t vm = vdupq_n_f32(x[0]);
    for (; i + 4 <= n; i += 4) vm = vmaxq_f32(vm, vld1q_f32(x + i));
    float m = vmaxvq_f32(vm);
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    float32x4_t vmm = vdupq_n_f32(m), vs = vdupq_n_f32(0.0f);
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t e = exp128(vsubq_f32(vld1q_f32(x + i), vmm));
        vst1q_f32(x + i, e);
        vs = vaddq_f32(vs, e);
    }
    float sum = vaddvq_f32(vs);
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (i = 0; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_n_f32(vld1q_f32(x + i), inv));
    for (; i < n; i++) x[i] *= inv;
}

void attention_head(float* out, const float* q, const float* keys, const float* values,
                    int stride, int n_pos, int head_dim, float scale, float* att) {
    if ((head_dim & 15) != 0) {
        attention_head_scalar(out, q, keys, values, stride, n_pos, head_dim, scale, att);
        return;
    }
    for (int t = 0; t < n_pos; t++) {
        const float* k = keys + (size_t)t * stride;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < head_dim; i += 16) {
            a0 = vfmaq_f32(a0, vld1q_f32(q + i), vld1q_f32(k + i));
            a1 = vfmaq_f32(a1, vld1q_f32(q + i + 4), vld1q_f32(k + i + 4));
            a2 = vfmaq_f32(a2, vld1q_f32(q + i + 8), vld1q_f32(k + i + 8));
            a3 = vfmaq_f32(a3, vld1q_f32(q + i + 12), vld1q_f32(k + i + 12));
        }
        att[t] = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3))) * scale;
    }
    softmax(att, n_pos);
    for (int i = 0; i < head_dim; i += 16) {
        float32x4_t o0 = vdupq_n_f32(0.0f), o1 = o0, o2 = o0, o3 = o0;
        for (int t = 0; t < n_pos; t++) {
            const float* v = values + (size_t)t * stride + i;
            float a = att[t];
            o0 = vfmaq_n_f32(o0, vld1q_f32(v), a);
            o1 = vfmaq_n_f32(o1, vld1q_f32(v + 4), a);
            o2 = vfmaq_n_f32(o2, vld1q_f32(v + 8), a);
            o3 = vfmaq_n_f32(o3, vld1q_f32(v + 12), a);
        }
        vst1q_f32(out + i, o0);
        vst1q_f32(out + i + 4, o1);
        vst1q_f32(out + i + 8, o2);
        vst1q_f32(out + i + 12, o3);
    }
}
#else
void softmax(float* x, int n) { softmax_scalar(x, n); }
void attention_head(float* out, const float* q, const float* keys, const float* values,
                    int stride, int n_pos, int head_dim, float scale, float* att) {
    attention_head_scalar(out, q, keys, values, stride, n_pos, head_dim, scale, att);
}
#endif
