/* test_matrix.h: random inputs and weight matrices in every format, written from model.h's
 * description of the layouts (not with the kernels.h helpers the kernels use, so that a wrong
 * helper shows up as wrong results), for the kernel and op tests. */
#ifndef TESTS_TEST_MATRIX_H
#define TESTS_TEST_MATRIX_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    return (uint16_t)((v.u + 0x7FFF + ((v.u >> 16) & 1)) >> 16);
}

typedef struct {
    Matrix M;
    void* data;
    int8_t* q;     /* q8, q4: the integer values, row-major (data holds them in row blocks) */
    float* scales; /* q8, q4: the scales, row-major [rows][cols / gs] */
    float* deq;    /* dequantised weights, row-major fp32 */
} TestMatrix;

/* A float in float16's normal range, its mantissa cut to float16's 10 bits (so exactly a half). */
static float f16_exact(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u &= ~(uint32_t)0x1FFF;
    memcpy(&f, &u, 4);
    return f;
}

/* The float16 bits of such a float. */
static uint16_t f16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u >> 16 & 0x8000u) | (((u >> 23 & 255) - 127 + 15) << 10) | (u >> 13 & 0x3FFu));
}

static TestMatrix make_matrix(WeightType type, int rows, int cols, int gs) {
    TestMatrix t;
    memset(&t, 0, sizeof t);
    size_t nel = (size_t)rows * cols;
    t.deq = malloc(nel * sizeof(float));
    t.M.type = type;
    t.M.rows = rows;
    t.M.cols = cols;
    if (type == WEIGHT_F32) {
        float* d = malloc(nel * sizeof(float));
        for (size_t i = 0; i < nel; i++) d[i] = t.deq[i] = frand();
        t.data = d;
    } else if (type == WEIGHT_BF16) {
        uint16_t* d = malloc(nel * sizeof(uint16_t));
        for (size_t i = 0; i < nel; i++) {
            d[i] = f32_to_bf16(frand());
            t.deq[i] = bf16_to_f32(d[i]);
        }
        t.data = d;
    } else {
        const int qmax = type == WEIGHT_Q4 ? 7 : 127; /* q8: -128 .. 127, q4: -8 .. 7 */
        int8_t* d = malloc(nel);
        size_t ng = nel / gs;
        t.scales = malloc(ng * sizeof(float));
        for (size_t g = 0; g < ng; g++) {
            float s = (0.5f + 0.5f * fabsf(frand())) / (float)qmax;
            s = f16_exact(s); /* q8 and q4 store float16 scales */
            t.scales[g] = s;
            for (int c = 0; c < gs; c++) {
                int q = (int)lrintf(frand() * (float)qmax);
                if (c == 0 && g % 3 == 0) q = -qmax - 1; /* the value outside [-qmax, qmax] */
                d[g * gs + c] = (int8_t)q;
                t.deq[g * gs + c] = s * (float)q;
            }
        }
        t.q = d;
        /* the row blocks of model.h, written from the layout's description (not with the
         * kernels.h helpers the kernels use, so a wrong helper shows up as wrong results) */
        const int G = cols / gs;
        uint8_t* b;
        if (type == WEIGHT_Q8) {
            const int blocks = (rows + 3) / 4;
            const size_t bb = 4 * (size_t)gs * G + (size_t)8 * G; /* 4 rows' G float16 scales, then values */
            b = calloc((size_t)blocks, bb);
            for (int r = 0; r < rows; r++) {
                uint8_t* blk = b + (size_t)(r / 4) * bb;
                for (int g = 0; g < G; g++) {
                    const uint16_t h = f16_bits(t.scales[(size_t)r * G + g]);
                    memcpy(blk + ((size_t)(r % 4) * G + g) * sizeof h, &h, sizeof h);
                    memcpy(blk + (size_t)8 * G + ((size_t)g * 4 + r % 4) * gs, d + (size_t)r * cols + (size_t)g * gs, gs);
                }
            }
        } else { /* q4: blocks of 8 rows; per group 8 scales, then byte 32v + 4i + k holds row i's
                  * columns 4v + k (low nibble) and 16 + 4v + k (high), each as q + 8 */
            const int blocks = (rows + 7) / 8; /* the padding rows are computed, never stored */
            b = calloc((size_t)blocks * G, 144);
            for (int r = 0; r < rows; r++)
                for (int g = 0; g < G; g++) {
                    uint8_t* grp = b + ((size_t)(r / 8) * G + g) * 144;
                    const int8_t* src = d + (size_t)r * cols + (size_t)g * 32;
                    const uint16_t h = f16_bits(t.scales[(size_t)r * G + g]);
                    memcpy(grp + (r % 8) * sizeof h, &h, sizeof h);
                    for (int v = 0; v < 4; v++)
                        for (int k = 0; k < 4; k++)
                            grp[16 + 32 * v + 4 * (r % 8) + k] =
                                (uint8_t)((src[4 * v + k] + 8) | (src[16 + 4 * v + k] + 8) << 4);
                }
        }
        t.data = b;
        t.M.group_size = gs;
    }
    t.M.data = t.data;
    return t;
}

static void free_matrix(TestMatrix* t) {
    free(t->data);
    free(t->q);
    free(t->scales);
    free(t->deq);
}

static const char* tname(WeightType t) {
    return t == WEIGHT_F32 ? "f32" : t == WEIGHT_BF16 ? "bf16" : t == WEIGHT_Q8 ? "q8" : "q4";
}


/* Tolerance of an output of a matmul against the reference:
 *   f32/bf16: 2e-5 * sum|w x| (fp32 reassociation; a missing or doubled column is about
 *             sum|w x| / cols >= 3e-4 of it at these sizes, so it is caught);
 *   q8, q4:   the same plus the exact bound of int8 activation quantisation: each activation is
 *             off by at most half its group's step s_x = max|x| / 127, so the error is at most
 *             sum_g s_w[g] * s_x[g] / 2 * sum_{c in g} |q_w[c]| (times 1.001 for fp32 rounding). */
static double matmul_tolerance(const TestMatrix* t, const float* xt, int r, double* abssum, double* exact) {
    const int cols = t->M.cols, gs = t->M.group_size;
    double qbound = 0;
    *abssum = *exact = 0;
    for (int c = 0; c < cols; c++) {
        double p = (double)t->deq[(size_t)r * cols + c] * xt[c];
        *abssum += fabs(p);
        *exact += p;
    }
    if (t->M.type == WEIGHT_Q8 || t->M.type == WEIGHT_Q4) {
        const int8_t* q = t->q + (size_t)r * cols;
        for (int g = 0; g < cols / gs; g++) {
            double amax = 0, qs = 0;
            for (int c = g * gs; c < g * gs + gs; c++) {
                if (fabs(xt[c]) > amax) amax = fabs(xt[c]);
                qs += abs(q[c]);
            }
            qbound += t->scales[(size_t)r * (cols / gs) + g] * (amax / 127.0) / 2.0 * qs;
        }
    }
    return 2e-5 * *abssum + qbound * 1.001 + 1e-6;
}

#endif
