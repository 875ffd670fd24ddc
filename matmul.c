/* matmul.c: y = W x for f32, bf16 and q8 weights, the embedding-row lookup, and the parallel
 * driver. The scalar reference comes first; the SIMD twins follow. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd_math.h"

/* ---------------------------------------------------------------------------------------------
 * Scalar reference
 * ------------------------------------------------------------------------------------------- */

static void matmul_rows_scalar(float* out, const float* x, const Matrix* W, int n, int r0, int r1) {
    const int C = W->cols, R = W->rows;
    for (int t = 0; t < n; t++) {
        const float* xt = x + (size_t)t * C;
        float* ot = out + (size_t)t * R;
        for (int r = r0; r < r1; r++) {
            float s = 0.0f;
            if (W->type == WEIGHT_F32) {
                const float* w = (const float*)W->data + (size_t)r * C;
                for (int c = 0; c < C; c++) s += w[c] * xt[c];
            } else if (W->type == WEIGHT_BF16) {
                const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
                for (int c = 0; c < C; c++) s += bf16_to_f32(w[c]) * xt[c];
            } else {
                const int8_t* w = (const int8_t*)W->data + (size_t)r * C;
                const int gs = W->group_size;
                const float* sc = W->scales + (size_t)r * (C / gs);
                for (int g = 0; g < C / gs; g++) {
                    float sg = 0.0f;
                    for (int c = g * gs; c < g * gs + gs; c++) sg += (float)w[c] * xt[c];
                    s += sg * sc[g];
                }
            }
            ot[r] = s;
        }
    }
}

void matmul_scalar(float* out, const float* x, const Matrix* W, int n) {
    matmul_rows_scalar(out, x, W, n, 0, W->rows);
}

void matrix_row(float* out, const Matrix* W, int row) {
    const int C = W->cols;
    if (W->type == WEIGHT_F32) {
        memcpy(out, (const float*)W->data + (size_t)row * C, (size_t)C * sizeof(float));
    } else if (W->type == WEIGHT_BF16) {
        const uint16_t* w = (const uint16_t*)W->data + (size_t)row * C;
        for (int c = 0; c < C; c++) out[c] = bf16_to_f32(w[c]);
    } else {
        const int8_t* w = (const int8_t*)W->data + (size_t)row * C;
        const int gs = W->group_size;
        const float* sc = W->scales + (size_t)row * (C / gs);
        for (int c = 0; c < C; c++) out[c] = sc[c / gs] * (float)w[c];
    }
}

/* ---------------------------------------------------------------------------------------------
 * Scratch
 * ------------------------------------------------------------------------------------------- */

static int8_t* xq_buf;     /* [max_batch * max_cols] quantised activations */
static float* xs_buf;      /* [max_batch * max_cols / 8] their scales */
static size_t xq_cap;

int matmul_scratch_init(int max_batch, int max_cols) {
    matmul_scratch_free();
    if (max_batch < 1) max_batch = 1;
    if (max_cols < 1) max_cols = 1;
    xq_cap = (size_t)max_batch * (size_t)max_cols;
    xq_buf = aligned_alloc(64, (xq_cap + 63) / 64 * 64);
    xs_buf = aligned_alloc(64, ((xq_cap / 8 + 1) * sizeof(float) + 63) / 64 * 64);
    if (!xq_buf || !xs_buf) {
        matmul_scratch_free();
        return -1;
    }
    return 0;
}

void matmul_scratch_free(void) {
    free(xq_buf);
    free(xs_buf);
    xq_buf = NULL;
    xs_buf = NULL;
    xq_cap = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Parallel driver
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    float* out;
    const float* x;
    const Matrix* W;
    int n, chunk, n_items;
} MatmulJob;

static void matmul_item(void* ctx, int i) {
    const MatmulJob* j = ctx;
    int r0 = i * j->chunk, r1 = r0 + j->chunk;
    if (r1 > j->W->rows) r1 = j->W->rows;
    matmul_rows_scalar(j->out, j->x, j->W, j->n, r0, r1);
}

void matmul(float* out, const float* x, const Matrix* W, int n) {
    int nt = kernels_threads();
    int chunk = (W->rows + nt * 8 - 1) / (nt * 8);
    chunk = (chunk + 7) & ~7;
    if (chunk < 8) chunk = 8;
    MatmulJob j = {out, x, W, n, chunk, (W->rows + chunk - 1) / chunk};
    parallel_for(j.n_items, matmul_item, &j);
}
