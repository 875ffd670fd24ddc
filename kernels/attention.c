/* attention.c: softmax and the attention of the query heads of one GQA group over their kv head's
 * cached keys and values (QWEN3.md 2.2 step 2.7, 2.5), the scalar reference; and the cache's row
 * stores (fp16, q8) with their twins. The fast build's attention is fast/attention.c. */
#include <math.h>
#include <stddef.h>

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

/* The reference, with the element type T a constant in each inlined copy: a test per element would
 * slow the fp32 reference, which models whose head_dim the SIMD kernels do not take run on. */
ALWAYS_INLINE void attention_group_ref(float* out, const float* q, int n_q, const KVRows* kv, int n_pos, int head_dim,
                                       float scale, float* att, KVType T) {
    for (int j = 0; j < n_q; j++) {
        const float* qj = q + (size_t)j * head_dim;
        float* oj = out + (size_t)j * head_dim;
        float* aj = att + (size_t)j * n_pos;
        for (int t = 0; t < n_pos; t++) {
            const size_t k = kv_row_offset(kv, t);
            float s = 0.0f;
            for (int i = 0; i < head_dim; i++) s += qj[i] * kv_value(kv->keys, k, i, head_dim, T);
            aj[t] = s * scale;
        }
        softmax_scalar(aj, n_pos);
        for (int i = 0; i < head_dim; i++) oj[i] = 0.0f;
        for (int t = 0; t < n_pos; t++) {
            const size_t v = kv_row_offset(kv, t);
            float a = aj[t];
            for (int i = 0; i < head_dim; i++) oj[i] += a * kv_value(kv->values, v, i, head_dim, T);
        }
    }
}

void attention_group_scalar(float* out, const float* q, int n_q, const KVRows* kv, int n_pos, int head_dim,
                            float scale, float* att) {
    if (kv->type == KV_F16)
        attention_group_ref(out, q, n_q, kv, n_pos, head_dim, scale, att, KV_F16);
    else if (kv->type == KV_Q8)
        attention_group_ref(out, q, n_q, kv, n_pos, head_dim, scale, att, KV_Q8);
    else
        attention_group_ref(out, q, n_q, kv, n_pos, head_dim, scale, att, KV_F32);
}

void kv_quantize_row_scalar(int8_t* row, const float* x, int d) {
    for (int g = 0; g < d; g += KV_Q8_GROUP) {
        float amax = 0.0f;
        for (int i = g; i < g + KV_Q8_GROUP; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        const uint16_t h = float_to_half(amax / 127.0f);
        const float s = half_to_float(h);
        for (int i = g; i < g + KV_Q8_GROUP; i++) {
            const float r = s > 0.0f ? rintf(x[i] / s) : 0.0f; /* to nearest, ties to even */
            /* into [-127, 127]; a NaN (from weights that are not numbers) to -127, as the twins' max gives */
            row[i] = (int8_t)(r >= -127.0f ? (r < 127.0f ? r : 127.0f) : -127.0f);
        }
        memcpy(row + kv_q8_scale_at(d, g), &h, sizeof h);
    }
}

/* The reference's steps FV_LANES values at a time where the build has vectors: the same bytes. */
void kv_quantize_row(int8_t* row, const float* x, int d) {
#if defined(FV_LANES)
    for (int g = 0; g < d; g += KV_Q8_GROUP) {
        fvec m = fv_set1(0.0f);
        for (int i = g; i < g + KV_Q8_GROUP; i += FV_LANES) m = fv_max(fv_abs(fv_load(x + i)), m);
        const uint16_t h = float_to_half(fv_hmax(m) / 127.0f);
        const fvec s = fv_set1(half_to_float(h));
        for (int i = g; i < g + KV_Q8_GROUP; i += FV_LANES)
            fv_store_i8(row + i, h ? fv_div(fv_load(x + i), s) : fv_set1(0.0f));
        memcpy(row + kv_q8_scale_at(d, g), &h, sizeof h);
    }
#else
    kv_quantize_row_scalar(row, x, d);
#endif
}

void float_to_half_row_scalar(uint16_t* out, const float* x, int n) {
    for (int i = 0; i < n; i++) out[i] = float_to_half(x[i]);
}

/* FV_LANES at a time where the build rounds to halves in registers (KERNELS_KV_F16), the rest (or
 * all, without it) by the reference. */
void float_to_half_row(uint16_t* out, const float* x, int n) {
    int i = 0;
#if defined(KERNELS_KV_F16)
    for (; i + FV_LANES <= n; i += FV_LANES) fv_store_half(out + i, fv_load(x + i));
#endif
    float_to_half_row_scalar(out + i, x + i, n - i);
}

void attention_rows_scalar(float* out, const float* q, size_t row_stride, int n_q, int n_rows, const KVRows* kv,
                           int first_n_pos, int head_dim, float scale, float* att) {
    for (int r = 0; r < n_rows; r++)
        attention_group_scalar(out + (size_t)r * row_stride, q + (size_t)r * row_stride, n_q, kv, first_n_pos + r,
                               head_dim, scale, att);
}

#if defined(KERNELS_SCALAR)
int attention_simd(int head_dim, KVType type) { return 0; }
#endif
