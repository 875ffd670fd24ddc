/* ops_reference.c: the model's operations as the scalar references compute them, one thread, in
 * the plainest order: every op is one loop around a kernel of kernels.h, row by row (split_exact).
 * `make SCALAR=1` builds the whole program on these; the fast ops (fast/ops_fast.c) are checked
 * against them. */
#include <stdlib.h>

#include "kernels/ops.h"

static void matmul_reference(const Ops* o, float* const* outs, const float* x, const Matrix* const* Ws, int n_mats,
                             int n) {
    for (int m = 0; m < n_mats; m++) matmul_scalar(outs[m], x, Ws[m], n);
}

static void matmul_segments_reference(const Ops* o, float* out, const float* x, const Matrix* const* Ws, const int* ns,
                                      int n_mats) {
    for (int m = 0, row = 0; m < n_mats; row += ns[m++])
        matmul_scalar(out + (size_t)row * Ws[m]->rows, x + (size_t)row * Ws[m]->cols, Ws[m], ns[m]);
}

static void rmsnorm_reference(const Ops* o, const NormSite* at, float* out, const float* x, const float* w, int n,
                              float eps) {
    for (size_t v = 0; v < (size_t)at->rows * (size_t)at->per_row; v++)
        rmsnorm_scalar(out + v * (size_t)n, x + v * (size_t)n, w, n, eps);
}

static void rope_reference(const Ops* o, float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t) {
    rope_scalar(x, n_heads, head_dim, cos_t, sin_t);
}

static void swiglu_reference(const Ops* o, float* gate, const float* up, int n) { swiglu_scalar(gate, up, n); }

/* Each query head of each row on its own: scores, softmax, the weighted sum of the values
 * (kernels.h, attention_group_scalar), with o->ctx as the row of scores. */
static void attention_reference(const Ops* o, const AttentionCall* a) {
    const int group = a->n_heads / a->n_kv_heads, d = a->head_dim;
    for (int r = 0; r < a->rows; r++)
        for (int h = 0; h < a->n_heads; h++) {
            const size_t at = ((size_t)r * a->n_heads + (size_t)h) * d;
            const KVRows kv = attention_kv_head(a, h / group);
            attention_group_scalar(a->out + at, a->q + at, 1, &kv, a->p0 + r + 1, d, a->scale, o->ctx);
        }
}

static void parallel_for_reference(const Ops* o, int n, void (*fn)(void* ctx, int i, int thread), void* ctx) {
    for (int i = 0; i < n; i++) fn(ctx, i, 0);
}

static int threads_reference(const Ops* o) { return 1; }
static int set_threads_reference(const Ops* o, int n) { return 1; }

static void free_reference(Ops* o) { free(o->ctx); free(o); }

Ops* ops_reference_new(const OpsSpec* spec) {
    Ops* o = malloc(sizeof *o);
    float* scores = calloc(spec->max_pos > 0 ? (size_t)spec->max_pos : 1, sizeof(float));
    if (!o || !scores) {
        free(o);
        free(scores);
        return NULL;
    }
    *o = (Ops){matmul_reference, matmul_segments_reference, rmsnorm_reference, rope_reference, swiglu_reference, attention_reference,
               parallel_for_reference, threads_reference, set_threads_reference, free_reference,
               .ctx = scores, .name = "reference", .prefetch = "none", .split_exact = 1};
    return o;
}

#if defined(KERNELS_SCALAR)
Ops* ops_new(const OpsSpec* spec) { return ops_reference_new(spec); }
#endif
