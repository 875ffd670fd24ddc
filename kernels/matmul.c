/* matmul.c: y = W x for f32, bf16, q8 and q4 weights, the scalar reference (the layouts: model.h,
 * THE CHECKPOINT FILE), and the embedding-row lookup. The SIMD twins are fast/x86/ and fast/arm/ (matmul_float.c: f32
 * and bf16; matmul_int8.c: q8 and q4 x int8 activations), chosen by fast/matmul.c's plan. */
#include "kernels/kernels.h"

/* q and scale of a quantised weight: w = scale * q (q4 stores q + 8; model.h draws the layouts). */
static inline int quant_q(const Matrix* W, int r, int c) {
    return W->type == WEIGHT_Q4 ? q4_value(W, r, c)
                                : (int)(int8_t)quant_group(W, r, c / W->group_size)[c % W->group_size];
}

static inline float quant_scale(const Matrix* W, int r, int g) {
    return W->type == WEIGHT_Q4 ? q4_scale(W, r, g) : half_to_float(quant_scales(W, r)[g]);
}

/* W[r][c] as a float (dequantised). */
static inline float weight_at(const Matrix* W, int r, int c) {
    if (W->type == WEIGHT_F32) return ((const float*)W->data)[(size_t)r * W->cols + c];
    if (W->type == WEIGHT_BF16) return bf16_to_f32(((const uint16_t*)W->data)[(size_t)r * W->cols + c]);
    return quant_scale(W, r, c / W->group_size) * (float)quant_q(W, r, c);
}

void matmul_scalar_rows(float* out, const float* x, const Matrix* W, int n, int r0, int r1) {
    const int C = W->cols, R = W->rows;
    for (int t = 0; t < n; t++) {
        const float* xt = x + (size_t)t * C;
        float* ot = out + (size_t)t * R;
        for (int r = r0; r < r1; r++) {
            float s = 0.0f;
            if (W->type == WEIGHT_F32 || W->type == WEIGHT_BF16) {
                for (int c = 0; c < C; c++) s += weight_at(W, r, c) * xt[c];
            } else {
                /* sum_c (s_g q_c) x_c with s_g taken out of each group's sum: the dequantised
                 * product, in the order the SIMD twins add (a group, then its scale). */
                const int gs = W->group_size;
                for (int g = 0; g < C / gs; g++) {
                    float sg = 0.0f;
                    for (int c = g * gs; c < g * gs + gs; c++) sg += (float)quant_q(W, r, c) * xt[c];
                    s += sg * quant_scale(W, r, g);
                }
            }
            ot[r] = s;
        }
    }
}

void matmul_scalar(float* out, const float* x, const Matrix* W, int n) {
    matmul_scalar_rows(out, x, W, n, 0, W->rows);
}

void matrix_row(float* out, const Matrix* W, int row) {
    for (int c = 0; c < W->cols; c++) out[c] = weight_at(W, row, c);
}
