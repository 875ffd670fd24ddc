/* ops_fast.c: the model's operations on the SIMD twins and a thread pool (fast.h). Each op hands
 * its work to the pool once: the products are matmul.c's driver itself, attention goes as (rows,
 * kv head) tasks, RMSNorm and SwiGLU as contiguous spans when a prefill chunk makes them long
 * enough to share. Every op gives the same bits at any thread count. */
#include <math.h>
#include <stdlib.h>

#include "kernels/ops.h"
#include "kernels/fast/fast.h"

/* Below this many values (a decoded token's norms and gate) the calling thread does the work: a
 * dispatch costs a few microseconds (docs/design.md#elementwise). */
#define ELEMENTWISE_PARALLEL (32 * 1024)

/* Weights below this size are left on the default prefetch plan: decode finds much of them in the
 * caches, and the load stays instant for small models (the tests' among them). */
#define MEASURE_MIN_BYTES ((size_t)64 << 20)

typedef struct {
    Kernels* k;
    float* att;          /* [max threads, att_floats] each attention task's scratch */
    size_t att_floats;
} Fast;

Kernels* ops_kernels(const Ops* o) { return ((const Fast*)o->ctx)->k; }

/* ---- RMSNorm and SwiGLU: spans of whole vectors, or of 64 values, per thread ---- */

typedef struct {
    float* out;
    const float* x;
    const float* w;
    int n;
    float eps;
} NormSpan;

static void rmsnorm_span(void* ctx, int v0, int v1) {
    const NormSpan* j = ctx;
    for (int v = v0; v < v1; v++) rmsnorm(j->out + (size_t)v * j->n, j->x + (size_t)v * j->n, j->w, j->n, j->eps);
}

static void rmsnorm_fast(const Ops* o, const NormSite* at, float* out, const float* x, const float* w, int n, float eps) {
    const int vectors = at->rows * at->per_row;
    NormSpan j = {out, x, w, n, eps};
    if ((long long)vectors * n < ELEMENTWISE_PARALLEL) rmsnorm_span(&j, 0, vectors);
    else parallel_spans(ops_kernels(o), vectors, 1, rmsnorm_span, &j);
}

static void rope_fast(const Ops* o, float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t) {
    rope(x, n_heads, head_dim, cos_t, sin_t);
}

typedef struct {
    float* gate;
    const float* up;
} SwigluSpan;

/* Spans start at multiples of 64 values, so every value goes through the same code (vector body
 * or scalar tail) as in one call over all n. */
static void swiglu_span(void* ctx, int i0, int i1) {
    const SwigluSpan* j = ctx;
    swiglu(j->gate + i0, j->up + i0, i1 - i0);
}

static void swiglu_fast(const Ops* o, float* gate, const float* up, int n) {
    SwigluSpan j = {gate, up};
    if (n < ELEMENTWISE_PARALLEL) swiglu(gate, up, n);
    else parallel_spans(ops_kernels(o), n, 64, swiglu_span, &j);
}

/* ---- Attention: the kv heads of a batch over the threads (attention.c: attention_task) ---- */

static void attention_fast(const Ops* o, const AttentionCall* a) {
    const Fast* f = o->ctx;
    AttentionJob job = {a, f->att, f->att_floats, kernels_threads(f->k)};
    parallel_for(f->k, job.n_tasks, attention_task, &job);
}

/* ---- For the tools ---- */

static void parallel_for_fast(const Ops* o, int n, void (*fn)(void* ctx, int i, int thread), void* ctx) {
    parallel_for(ops_kernels(o), n, fn, ctx);
}

static int threads_fast(const Ops* o) { return kernels_threads(ops_kernels(o)); }

static int set_threads_fast(const Ops* o, int n) { return kernels_set_threads(ops_kernels(o), n); }

static void free_fast(Ops* o) {
    Fast* f = o->ctx;
    if (f) {
        kernels_free(f->k);
        free(f->att);
        free(f);
    }
    free(o);
}

Ops* ops_new(const OpsSpec* spec) {
    Ops* o = calloc(1, sizeof *o);
    Fast* f = calloc(1, sizeof *f);
    if (!o || !f) {
        free(o);
        free(f);
        return NULL;
    }
    *o = (Ops){matmul, matmul_segments, rmsnorm_fast, rope_fast, swiglu_fast, attention_fast, parallel_for_fast, threads_fast,
               set_threads_fast, free_fast, .ctx = f};
    f->k = kernels_new(spec->threads, spec->max_batch, spec->max_cols);
    const int group = spec->n_kv_heads > 0 ? spec->n_heads / spec->n_kv_heads : 1;
    f->att_floats = attention_rows_scratch(group, ATTENTION_BLOCK_ROWS, spec->max_pos, spec->head_dim);
    if (f->k) f->att = calloc((size_t)kernels_threads(f->k) * f->att_floats, sizeof(float));
    if (!f->k || !f->att) {
        free_fast(o);
        return NULL;
    }
    o->name = kernels_simd_name(f->k);
    if (spec->weights && spec->weights_bytes >= MEASURE_MIN_BYTES) measure_prefetch(o, spec);
    o->prefetch = kernels_prefetch_plan(f->k);
    o->bf16_activations = kernels_set_bf16_activations(f->k, spec->bf16_activations);
    o->float_panels = kernels_float_panels(f->k);
    return o;
}
