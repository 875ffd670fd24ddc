/* ops.h: the seam between the model and its kernels. forward() (model.c) reaches every piece of
 * arithmetic that costs time through one table of operations, and knows nothing of how they run:
 *
 *   the reference ops (ops_reference.c)  the scalar kernels, one thread, no scratch beyond a row of
 *                                        scores: what `make SCALAR=1` (`make ref`) builds the whole
 *                                        program on, and what tests/test_ops.c checks the others by;
 *   the fast ops (fast/ops_fast.c)       the SIMD twins on a thread pool, each product's kernel
 *                                        chosen by one plan (fast/matmul.c).
 *
 * A tool may put its own table in front of the model's: the RMSNorm lab replaces rmsnorm
 * (cli/norm_lab.c) and the --show-norms trace watches rmsnorm's and attention's inputs
 * (cli/norm_trace.c). Such a table starts as a copy of the one it wraps, so every op still gets
 * the implementation's state through o->ctx. */
#ifndef OPS_H
#define OPS_H

#include "kernels/kernels.h"

typedef struct Ops Ops;

/* Where forward() calls RMSNorm: rows and per_row size the call (rows x per_row vectors of n
 * values); use, name, layer and p0 are for the tools that watch or change one use
 * (cli/norm_trace.c, cli/norm_lab.c). */
typedef struct {
    int use;          /* 1 pre-attention, 2 QK-Norm, 3 pre-MLP, 4 final norm (model.c's four uses) */
    const char* name; /* "pre-attention", "QK-Norm q", "QK-Norm k", "pre-MLP", "final norm" */
    int layer;        /* -1: the final norm, after the last layer */
    int p0;           /* the position of the batch's first row */
    int rows;         /* batch rows; each holds per_row vectors (QK-Norm: the heads of q or k) */
    int per_row;
} NormSite;

/* One layer's causal attention over a batch of rows (QWEN3.md 2.2 step 2.7, 2.5): row r's query
 * heads (q + r * n_heads * head_dim) attend to positions 0 .. p0 + r of the cache; query head j
 * reads kv head j / (n_heads / n_kv_heads) (GQA: a group's heads are contiguous). */
typedef struct {
    float* out;           /* [rows, n_heads * head_dim] */
    const float* q;       /* [rows, n_heads * head_dim], after QK-Norm and RoPE */
    int rows, p0;
    int n_heads, n_kv_heads, head_dim;
    float scale;          /* 1 / sqrt(head_dim) */
    KVRows kv;            /* kv head 0 of this layer's keys and values */
    size_t kv_head_step;  /* elements from one kv head's rows to the next's, in every block */
    int layer;            /* for the trace */
} AttentionCall;

/* kv head h's cached rows of an AttentionCall. */
static inline KVRows attention_kv_head(const AttentionCall* a, int h) {
    const size_t at = (size_t)h * a->kv_head_step * kv_elem_size(a->kv.type);
    KVRows kv = a->kv;
    kv.keys = (const char*)a->kv.keys + at;
    kv.values = (const char*)a->kv.values + at;
    return kv;
}

/* What the ops are made for: the model's sizes bound every call. */
typedef struct {
    int threads;          /* the fast ops' threads, the caller's included; <= 0: one per CPU (max 256) */
    int max_batch;        /* rows of one call */
    int max_cols;         /* the widest matrix's columns */
    int n_heads, n_kv_heads, head_dim, max_pos; /* attention's scratch */
    int bf16_activations; /* --bf16-activations (fast/matmul.c), where the build has the instruction */
    /* The weights section, which decode reads once per token: the fast ops time their prefetch
     * distance on it (fast/matmul.c, measure_prefetch). weights NULL: not timed. */
    const void* weights;
    size_t weights_bytes;
    WeightType weight_type;
    int weight_cols, group_size; /* the width its matrices mostly have (dim), their group size */
} OpsSpec;

struct Ops {
    /* outs[m][t * Ws[m]->rows + r] = sum_c Ws[m][r][c] * x[t * cols + c], for m < n_mats, t < n:
     * y = W x for n input rows, for matrices that read the same x and have the same cols and
     * weight type (q/k/v, gate/up; one matrix elsewhere). */
    void (*matmul)(const Ops* o, float* const* outs, const float* x, const Matrix* const* Ws, int n_mats, int n);
    /* x's rows in segments, each through its own matrix (a mixture-of-experts layer's experts): the
     * ns[m] rows after the segments before go through Ws[m] into the same rows of out, as matmul of
     * Ws[m] alone would; the matrices have one shape. */
    void (*matmul_segments)(const Ops* o, float* out, const float* x, const Matrix* const* Ws, const int* ns,
                            int n_mats);
    /* RMSNorm of at->rows * at->per_row vectors of n values (kernels.h, rmsnorm); out may equal x. */
    void (*rmsnorm)(const Ops* o, const NormSite* at, float* out, const float* x, const float* w, int n, float eps);
    /* RoPE on n_heads head vectors of one position (kernels.h, rope). */
    void (*rope)(const Ops* o, float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t);
    /* gate[i] = silu(gate[i]) * up[i] (kernels.h, swiglu). */
    void (*swiglu)(const Ops* o, float* gate, const float* up, int n);
    void (*attention)(const Ops* o, const AttentionCall* a);

    /* For the tools (quantize, the bench): fn(ctx, i, thread) for i < n on the ops' threads
     * (thread < threads()); the reference runs them in order on the caller's. */
    void (*parallel_for)(const Ops* o, int n, void (*fn)(void* ctx, int i, int thread), void* ctx);
    int (*threads)(const Ops* o);
    int (*set_threads)(const Ops* o, int n); /* 1 .. the count made with; returns the count now */
    void (*free)(Ops* o);

    void* ctx;            /* the implementation's state */
    const char* name;     /* "reference", or the SIMD the fast ops use: "avx2+avx512", "neon", ... */
    const char* prefetch; /* decode's software prefetch plan (fast/matmul.c), "none" */
    int bf16_activations; /* 1: --bf16-activations is on */
    int float_panels;     /* 1: f32 and bf16 prefill may take packed panels (fast/matmul.c) */
    int split_exact;      /* 1: a row's bits do not depend on how the rows are split into calls (reference) */
};

/* The scalar references (ops_reference.c). NULL when out of memory. */
Ops* ops_reference_new(const OpsSpec* spec);

/* The build's ops: the fast ones, or in the reference build (make SCALAR=1) the reference. */
Ops* ops_new(const OpsSpec* spec);

static inline void ops_free(Ops* o) {
    if (o) o->free(o);
}

#endif
