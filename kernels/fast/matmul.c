/* matmul.c: the fast products. The scratch and decode's prefetch plan of a kernel context; the
 * plan of each product (plan_product: which kernel, which copy of the activations, which paths,
 * rows per chunk, the split over the threads: every threshold is there); and the driver, which
 * prepares the activations once and hands the chunks of rows to the threads, each chunk straight
 * to the plan's kernel: x86/ or arm/, matmul_float.c (f32, bf16) and matmul_int8.c (q8, q4),
 * x86/matmul_amx.c (their prefill on AMX). The scalar reference they are checked against is
 * kernels/matmul.c. */
#include <stdatomic.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fast/matmul_shared.h"

/* ---- Scratch, plan and switches ---- */

/* One kernel context's scratch, plan and switches (fast.h: matmul_scratch_new). The
 * per-thread parts reach the SIMD twins through thread_view (matmul_shared.h, MatmulThread). */
struct MatmulScratch {
    float* xp_buf;         /* [max_threads * xp_stride] each thread's activation row (MatmulThread.xp) */
    int xp_cap, xp_stride; /* max_cols; max_cols rounded up to whole cache lines */
    float* scales_buf;     /* [max_threads * scales_stride] each thread's row-block scales (MatmulThread.scales) */
    int scales_stride;     /* xp_stride / 8 in whole cache lines */
    float* panel_buf;      /* [max_threads * FLOAT_MAX_PANELS * 16 * xp_stride] each thread's MatmulThread.panels (AVX2) */
    int8_t* qi_pack_buf;   /* [max_threads * qi_pack_bytes] each thread's q8/q4 panels (AVX2) */
    uint8_t* amx_wt_buf;   /* [max_threads * amx_thread_bytes] each thread's AMX scratch */
    /* The activations prepared once per product for every thread. */
    int8_t* xq_buf;        /* [max_batch * max_cols] quantised activations */
    float* xs_buf;         /* [max_batch * max_cols / 8] their scales */
    int32_t* xsum_buf;     /* [max_batch * max_cols / 4] 8 partial sums per group (AVX2 twin) */
    int32_t* xgsum_buf;    /* [max_batch * max_cols / 32] one sum per group (AVX2 twin, tile_q4) */
    size_t xq_cap;
    uint16_t* xb16_buf;    /* x rounded to bf16 (--bf16-activations), or with AMX-BF16 split in three */
    size_t split_cap;      /* AMX-BF16: tokens x columns that xb16_buf holds split (max_batch up to a multiple of 16) */
    int bf16_activations;
    int amx_granted;       /* amx_request's answer when the context was made */
    int amx_usable;        /* q8 and q4 prefill run on AMX tiles (kernels_set_amx) */
    int float_panels;      /* f32 and bf16 prefill may take packed panels (kernels_set_float_panels) */
    PrefetchPlan prefetch;
    int prefetch_fixed;    /* KERNELS_PREFETCH chose the plan: measure_prefetch leaves it */
    char prefetch_name[48];
};

/* Thread `thread`'s view of s for the twins. */
static inline MatmulThread thread_view(const MatmulScratch* s, int thread) {
    MatmulThread mt = {.xp = s->xp_buf + (size_t)thread * (size_t)s->xp_stride,
                       .scales = s->scales_buf + (size_t)thread * (size_t)s->scales_stride, .xp_stride = s->xp_stride};
#if defined(KERNELS_AVX2)
    mt.panels = s->panel_buf + (size_t)thread * FLOAT_MAX_PANELS * 16 * (size_t)s->xp_stride;
    mt.qi_pack = s->qi_pack_buf + (size_t)thread * qi_pack_bytes(s->xp_stride);
    mt.prefetch = &s->prefetch;
#endif
#if defined(KERNELS_AMX)
    if (s->amx_wt_buf) mt.amx_wt = s->amx_wt_buf + (size_t)thread * amx_thread_bytes(s->xp_stride);
#endif
    return mt;
}

/* Whether the CPU is an AMD Zen 4. Zen 3 and Zen 4 are both AMD family 19h, and gcc 12.2's
 * __builtin_cpu_is("znver3") cannot tell them apart (its libgcc calls every family-19h model with
 * VAES a znver3); AVX-512 is a difference every compiler can see: Zen 4 has it, Zen 3 does not
 * (tests/test_bench.py checks the defaults that follow from it). */
static int cpu_is_zen4(void) {
#if defined(KERNELS_AVX2) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_is("amdfam19h") && __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

/* What this build compiled in (simd_math.h), as constants the switches below test in plain C. */
#if defined(KERNELS_AVX2)
#define BUILD_AVX2 1 /* the packed panels and decode's software prefetch are AVX2 code */
#else
#define BUILD_AVX2 0
#endif
#if defined(KERNELS_AVX512)
#define BUILD_AVX512 1
#else
#define BUILD_AVX512 0
#endif
#if defined(KERNELS_BF16_DOT)
#define BUILD_BF16_DOT 1
#else
#define BUILD_BF16_DOT 0
#endif

/* The tuning switches KERNELS_FLOAT_PANELS, KERNELS_PREFETCH and KERNELS_AMX are read in every
 * build, so that a mistyped value is reported wherever it is set: 0 for the value a, 1 for b, -1
 * when unset, empty or (after a warning that ends in `otherwise`) anything else. */
static int env_choice(const char* name, const char* a, const char* b, const char* otherwise) {
    const char* e = getenv(name);
    if (!e || !*e) return -1;
    if (strcmp(e, a) == 0) return 0;
    if (strcmp(e, b) == 0) return 1;
    fprintf(stderr, "warning: %s=%s is not %s or %s; %s\n", name, e, a, b, otherwise);
    return -1;
}

/* Whether f32 and bf16 prefill take the packed panels (rows_float_packed) from their thresholds
 * on. Everywhere but in an AVX-512 build on Zen 4, where the 4 x 4 zmm tiles alone are faster at
 * every prompt length measured (docs/design.md#prefill-panels). KERNELS_FLOAT_PANELS=0 or 1
 * overrides the choice (for measuring on another CPU). */
static int choose_float_panels(void) {
    int on = env_choice("KERNELS_FLOAT_PANELS", "0", "1", "using the CPU's default");
    if (on < 0) on = !(BUILD_AVX512 && cpu_is_zen4());
    return BUILD_AVX2 && on;
}

int kernels_float_panels(const Kernels* k) { return kernels_scratch(k)->float_panels; }

int kernels_set_float_panels(Kernels* k, int on) {
    MatmulScratch* s = kernels_scratch(k);
    s->float_panels = BUILD_AVX2 && on;
    return s->float_panels;
}

/* How far ahead decode's matrix-vector products ask for their weights, all into L1, per core
 * (docs/design.md#decode-prefetch): until measure_prefetch times the model's own weights, or for
 * good where KERNELS_PREFETCH=near or mid says so:
 *  - near: q8 128 bytes, nothing else. Where a prefetch far ahead holds one of the core's few
 *    outstanding L1 misses for the whole trip to memory, near ones meet lines the hardware
 *    prefetcher is already bringing in.
 *  - mid: q8 1536, q4 2048, bf16 1024 (2048 in the AVX-512 kernel). f32 has none
 *    (docs/design.md#decode-prefetch says why). */
static PrefetchPlan choose_prefetch(int* fixed) {
    const int asked = env_choice("KERNELS_PREFETCH", "near", "mid", "using the default plan");
    const PrefetchPlan near = {"near", 128, 0, 0, 0}, mid = {"mid", 1536, 2048, 1024, 2048};
    *fixed = asked >= 0;
    if (!BUILD_AVX2) return (PrefetchPlan){"none", 0, 0, 0, 0}; /* only the AVX2 kernels prefetch */
    return asked == 0 ? near : mid;
}

const char* kernels_prefetch_plan(const Kernels* k) { return kernels_scratch(k)->prefetch.name; }

int kernels_amx(const Kernels* k) { return kernels_scratch(k)->amx_usable; }

int kernels_set_amx(Kernels* k, int on) {
    MatmulScratch* s = kernels_scratch(k);
    s->amx_usable = on && s->amx_granted;
    return s->amx_usable;
}

/* aligned_alloc wants a size that is a multiple of the alignment. */
static void* alloc_lines(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

/* What a context learns from the process (the CPU's model, the environment, Linux's grant of the
 * AMX tile state, the whole process's and asked for again harmlessly) is read anew here; none of
 * it changes while the process runs, so two contexts always agree on it. */
MatmulScratch* matmul_scratch_new(int max_threads, int max_batch, int max_cols) {
    MatmulScratch* s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->prefetch = choose_prefetch(&s->prefetch_fixed);
    s->float_panels = choose_float_panels();
    if (max_batch < 1) max_batch = 1;
    if (max_cols < 1) max_cols = 1;
    if (max_threads < 1) max_threads = 1;
    s->xq_cap = (size_t)max_batch * (size_t)max_cols;
    s->xq_buf = alloc_lines(s->xq_cap);
    s->xs_buf = alloc_lines((s->xq_cap / 8 + 1) * sizeof(float));
    s->xsum_buf = alloc_lines((s->xq_cap / 4 + 8) * sizeof(int32_t));
    s->xgsum_buf = alloc_lines((s->xq_cap / 32 + 8) * sizeof(int32_t));
    s->xp_cap = max_cols;
    s->xp_stride = (max_cols + 15) / 16 * 16; /* whole cache lines: no line is shared by two threads */
    s->xp_buf = alloc_lines((size_t)max_threads * (size_t)s->xp_stride * sizeof(float));
    s->scales_stride = (s->xp_stride / 8 + 15) / 16 * 16;
    s->scales_buf = alloc_lines((size_t)max_threads * (size_t)s->scales_stride * sizeof(float));
    int ok = s->xq_buf && s->xs_buf && s->xsum_buf && s->xgsum_buf && s->xp_buf && s->scales_buf;
#if defined(KERNELS_AVX2)
    s->panel_buf = alloc_lines((size_t)max_threads * FLOAT_MAX_PANELS * 16 * (size_t)s->xp_stride * sizeof(float));
    s->qi_pack_buf = alloc_lines((size_t)max_threads * qi_pack_bytes(s->xp_stride));
    ok = ok && s->panel_buf && s->qi_pack_buf;
#endif
    /* KERNELS_AMX=0 turns AMX off (for measuring and testing the path without it); read in every
     * build, so that a mistyped value is reported; granted only where the build has AMX kernels */
    const int amx_allowed = env_choice("KERNELS_AMX", "0", "1", "AMX stays on where the CPU has it") != 0;
#if defined(KERNELS_AMX)
    s->amx_usable = s->amx_granted = amx_allowed && amx_request();
    if (s->amx_usable) {
        s->amx_wt_buf = alloc_lines((size_t)max_threads * amx_thread_bytes(s->xp_stride));
        ok = ok && s->amx_wt_buf;
    }
#else
    s->amx_usable = s->amx_granted = amx_allowed && 0; /* this build has no AMX kernels to grant */
#endif
#if defined(KERNELS_BF16_DOT)
    size_t xb16_cap = s->xq_cap + (size_t)16 * (size_t)max_cols; /* bf16_block_rows: whole blocks of 16 tokens */
#if defined(KERNELS_AMX_BF16) /* bf16_split_rows: three parts, tokens up to a whole A tile */
    s->split_cap = (size_t)((max_batch + 15) / 16 * 16) * (size_t)max_cols; /* an A tile: 16 tokens */
    xb16_cap = 3 * s->split_cap;
#endif
    s->xb16_buf = alloc_lines(xb16_cap * sizeof(uint16_t));
    ok = ok && s->xb16_buf;
#endif
    if (!ok) {
        matmul_scratch_free(s);
        return NULL;
    }
    return s;
}

void matmul_scratch_free(MatmulScratch* s) {
    if (!s) return;
    free(s->xq_buf);
    free(s->xs_buf);
    free(s->xsum_buf);
    free(s->xgsum_buf);
    free(s->xp_buf);
    free(s->xb16_buf);
    free(s->panel_buf);
    free(s->qi_pack_buf);
    free(s->scales_buf);
    free(s->amx_wt_buf);
    free(s);
}

int kernels_set_bf16_activations(Kernels* k, int on) {
    MatmulScratch* s = kernels_scratch(k);
    s->bf16_activations = BUILD_BF16_DOT && on; /* stays 0 without the bf16 dot product */
    return s->bf16_activations;
}

/* ---- The plan: which kernel multiplies a product's rows, and how they split ---- */

/* A chunk of a quantised matrix whose group size is not a multiple of 32 (the int8 twins' step):
 * the scalar reference. */
static void rows_scalar(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    matmul_scalar_rows(out, pr->x, W, pr->n, r0, r1);
}

#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
/* Whether every matrix has Ws[0]'s type and columns, and with `group` its group size (kernels.h
 * asks the callers of matmul for the first two). */
static int uniform(const Matrix* const* Ws, int n_mats, int group) {
    for (int m = 1; m < n_mats; m++)
        if (Ws[m]->type != Ws[0]->type || Ws[m]->cols != Ws[0]->cols || (group && Ws[m]->group_size != Ws[0]->group_size))
            return 0;
    return 1;
}
#endif

/* The paths inside a prefill kernel, each from the number of tokens where it starts to pay
 * (docs/design.md#prefill-panels, #amx, #amx-bf16):
 *  - f32 and bf16 packed panels of 16 rows (rows_float_nn), where the context has them on: from
 *    24 / 40 tokens with AVX-512, 64 / 112 with AVX2. Below, the weights' one pass from memory
 *    bounds the product, and the tiles overlap it with their arithmetic while the packing's writes
 *    and second read cost more than the panels gain.
 *  - q8 panels (rows_qi_packed) from 24 tokens; q4 panels only with VNNI, since without it
 *    tile_q4's int16 sums (two instructions per 32 weights and token) beat the sign trick's four.
 *  - AMX tiles from 13 tokens for q8 (groups of a multiple of 64) and 32 for q4, whose nibbles the
 *    repacking widens; below that tile_qi / tile_q4 with their prefetch are quicker.
 *  - bf16 x bf16 activations: blocks of 16 tokens, or the AMX-BF16 panels, from 16 tokens on.
 * Every path needs the widest matrix's columns to fit the threads' scratch rows, and a panel or
 * tile needs a matrix of its rows at least: a flag says the path runs, as the bench prints it. */
static void plan_paths(ProductPlan* p, const MatmulScratch* s, const Matrix* W, int n) {
    const int fits = W->cols <= s->xp_cap;
#if defined(KERNELS_AVX512)
    const int float_min = W->type == WEIGHT_F32 ? 24 : 40;
#else
    const int float_min = W->type == WEIGHT_F32 ? 64 : 112;
#endif
#if defined(Q8_VNNI)
    const int q4_panels = W->type == WEIGHT_Q4;
#else
    const int q4_panels = 0;
#endif
    p->float_packed = s->float_panels && (W->type == WEIGHT_F32 || W->type == WEIGHT_BF16) && n >= float_min &&
                      W->rows >= 16 && fits; /* a panel: 16 rows */
    p->amx = s->amx_usable && W->rows >= 16 &&
             (W->type == WEIGHT_Q4 ? n >= 32 : W->type == WEIGHT_Q8 && W->group_size % 64 == 0 && n >= 13) && fits;
    /* AMX's whole tiles leave fewer than 16 rows: no room for a panel where panels are 16 rows */
    p->qi_packed = (W->type == WEIGHT_Q8 || q4_panels) && n >= 24 && W->rows >= QP_ROWS && fits &&
                   !(p->amx && QP_ROWS == 16);
    const int bf16_dot_tiles = W->type == WEIGHT_BF16 && n >= 16 && W->cols % 32 == 0 && fits;
#if defined(KERNELS_AMX_BF16)
    const int amx_bf16 = s->amx_usable;
#else
    const int amx_bf16 = 0;
#endif
    p->bf16_blocked = !amx_bf16 && bf16_dot_tiles;
    p->bf16_packed = amx_bf16 && bf16_dot_tiles && W->rows >= 16;
#if !defined(KERNELS_AVX2) /* the panels, AMX and the bf16 dot product are x86 code */
    p->float_packed = p->qi_packed = p->amx = p->bf16_blocked = p->bf16_packed = 0;
#endif
}

/* The kernel and the copy of the activations for n tokens of matrices like Ws[0], and where chunks
 * start: a multiple of the row block (4, q4 8), or of 16 (QP_ROWS for the q8 panels) where
 * panels or AMX tiles take the chunk, so that which rows take them (and so their rounding) does
 * not depend on the thread count. */
#define USE_KERNEL(p, k) ((p)->kernel = (k), (p)->kernel_name = #k)
static void plan_kernel(ProductPlan* p, const MatmulScratch* s, const Matrix* const* Ws, int n_mats, int n) {
    USE_KERNEL(p, rows_scalar);
    p->prep = PREP_FP32;
    p->align = quant_block_rows(Ws[0]->type);
#if defined(KERNELS_AVX2) || defined(KERNELS_NEON) /* else every product runs the scalar reference */
    const Matrix* W = Ws[0];
    const int C = W->cols, quant = W->type == WEIGHT_Q8 || W->type == WEIGHT_Q4;
    if (quant && W->group_size % 32 == 0 && uniform(Ws, n_mats, 1) && (size_t)n * (size_t)C <= s->xq_cap) {
        if (n > 1) USE_KERNEL(p, rows_qi);
        else if (W->type == WEIGHT_Q8) USE_KERNEL(p, rows_qi_n1), p->prefetch = PF_Q8;
        else USE_KERNEL(p, rows_q4_n1), p->prefetch = PF_Q4;
        p->prep = PREP_INT8;
        if (p->qi_packed) p->align = QP_ROWS;
        if (p->amx) p->align = 16;
        return;
    }
    if (quant) return; /* rows_scalar */
    if (W->type == WEIGHT_F32 && n == 1) USE_KERNEL(p, rows_f32_n1);
    else if (W->type == WEIGHT_F32) USE_KERNEL(p, rows_f32_nn);
    else if (n == 1) USE_KERNEL(p, rows_bf16_n1_plain);
    else USE_KERNEL(p, rows_bf16_nn);
    if (p->float_packed) p->align = 16;
#if defined(KERNELS_AVX2) /* x86/matmul_float.c's other bf16 kernels */
    const int bf16 = W->type == WEIGHT_BF16 && uniform(Ws, n_mats, 0);
#if defined(KERNELS_AMX_BF16) /* from 9 tokens (the A tiles are padded to 16 with zeros), n rounded up to 16 in the scratch */
    if (bf16 && s->amx_usable && !s->bf16_activations && n >= 9 && C % 32 == 0 && W->rows >= 16 && C <= s->xp_cap &&
        (size_t)((n + 15) / 16 * 16) * (size_t)C <= s->split_cap) {
        USE_KERNEL(p, rows_bf16_split);
        p->prep = PREP_BF16_SPLIT;
        p->align = 16;
        p->float_packed = 0; /* the tiles leave fewer rows than a panel's 16 */
        return;
    }
#endif
#if defined(KERNELS_BF16_DOT)
    if (bf16 && s->bf16_activations && n > 1 && (size_t)n * (size_t)C <= s->xq_cap) {
        USE_KERNEL(p, rows_bf16_dot);
        p->prep = p->bf16_blocked ? PREP_BF16_BLOCK : PREP_BF16_ROUND;
        p->align = p->bf16_blocked || p->bf16_packed ? 16 : 4;
        return;
    }
#endif
    /* bf16 decode from a de-interleaved row, on zmm where its steps of 32 columns fit */
    if (bf16 && n == 1 && C % 16 == 0 && C <= s->xp_cap) {
        USE_KERNEL(p, rows_bf16_n1);
        p->prep = PREP_DEINTERLEAVE;
        p->span = 16;
        p->prefetch = PF_BF16;
#if defined(KERNELS_AVX512)
        if (C % 32 == 0) USE_KERNEL(p, rows_bf16_n1_zmm), p->span = 32, p->prefetch = PF_BF16_ZMM;
#endif
    }
#endif
#endif
}

/* How the work splits over the nt threads (docs/design.md#row-chunks). Decode runs one pool task
 * per thread, which claims chunks of its own range CLAIM_BATCH per atomic: a token has ~9,000
 * chunks, every claim is a locked instruction that waits for the weight loads in flight, and one
 * task per chunk would add two more (the pool's item counter and done count, shared by the cores).
 * Prefill runs one task per chunk, so a thread descheduled between two chunks holds nothing up.
 * The n_prep tokens' activations are prepared in items of about 4 per thread (whole blocks of the
 * prep's tokens), and below 16 tokens by the calling thread, where a dispatch would cost more than
 * it saves; per token, so the split does not change the result. */
#define CLAIM_BATCH 4
static void plan_split(ProductPlan* p, int n, int n_prep, int nt) {
    p->task_per_thread = n == 1;
    p->claim = n == 1 ? CLAIM_BATCH : 1;
    const int block = p->prep == PREP_BF16_BLOCK ? 16 : 1;
    p->prep_tokens = n_prep < 16 ? 0 : ((n_prep + nt * 4 - 1) / (nt * 4) + block - 1) / block * block;
}

/* The whole plan of a product of n tokens (n_prep rows of activations to prepare): its kernel and
 * paths, its rows per chunk, about 32 chunks per thread for decode (small chunks keep the last
 * one, which the others may wait for, short), at most PREFILL_CHUNK_ROWS for prefill so a chunk's
 * weights stay in L2 while the token blocks go by (docs/design.md#row-chunks), and its split. */
static ProductPlan plan_product(const MatmulScratch* s, const Matrix* const* Ws, int n_mats, int n, int n_prep,
                                int nt) {
    ProductPlan p = {0};
    plan_paths(&p, s, Ws[0], n);
    plan_kernel(&p, s, Ws, n_mats, n);
    for (int m = 0; m < n_mats; m++)
        if (quant_block_rows(Ws[m]->type) > p.align) p.align = quant_block_rows(Ws[m]->type);
    size_t total_rows = 0;
    for (int m = 0; m < n_mats; m++) total_rows += (size_t)Ws[m]->rows;
    const int per_thread = n == 1 ? 32 : 8;
    int chunk = (int)((total_rows + (size_t)nt * per_thread - 1) / ((size_t)nt * per_thread));
    if (n > 1 && chunk > PREFILL_CHUNK_ROWS) chunk = PREFILL_CHUNK_ROWS;
    chunk = (chunk + p.align - 1) / p.align * p.align;
    p.chunk = chunk < p.align ? p.align : chunk;
    plan_split(&p, n, n_prep, nt);
    return p;
}

/* The paths inside the kernel that plan p takes, each followed by ", ". */
static void paths_text(const ProductPlan* p, const Matrix* W, char* text, size_t len) {
    const int int8 = p->prep == PREP_INT8, bf16_dot = p->prep == PREP_BF16_ROUND || p->prep == PREP_BF16_BLOCK;
    snprintf(text, len, "%s%s%s%s%s", int8 && p->amx ? "AMX tiles, " : "",
             int8 && p->qi_packed ? (W->type == WEIGHT_Q8 ? "q8 panels, " : "q4 panels, ") : "",
             p->prep == PREP_BF16_SPLIT ? "AMX-BF16 tiles, " : "",
             bf16_dot && p->bf16_packed ? "AMX-BF16 panels, " : "",
             p->prep == PREP_FP32 && p->float_packed ? "packed panels, " : "");
}

/* ", prefetch 1536 B" for a decode kernel of an AVX2 build (the only one that prefetches). */
static void prefetch_text(const ProductPlan* p, const PrefetchPlan* pf, char* text, size_t len) {
    int distance = 0;
    switch (p->prefetch) {
    case PF_Q8: distance = pf->q8; break;
    case PF_Q4: distance = pf->q4; break;
    case PF_BF16: distance = pf->bf16; break;
    case PF_BF16_ZMM: distance = pf->bf16_zmm; break;
    default: text[0] = 0; return;
    }
    if (!BUILD_AVX2) text[0] = 0;
    else if (distance > 0) snprintf(text, len, ", prefetch %d B", distance);
    else snprintf(text, len, ", prefetch %s", p->prefetch == PF_Q8 ? "one row block" : "none");
}

/* The plan of n tokens through W alone, as the bench prints it (fast.h): the kernel, the paths
 * inside it that this plan takes, the activations it reads and decode's prefetch distance. */
int kernels_describe_product(const Kernels* k, const Matrix* W, int n, char* text, size_t len) {
    static const char* const reads[] = {
        [PREP_FP32] = "fp32 activations", [PREP_INT8] = "int8 activations",
        [PREP_BF16_ROUND] = "bf16 activations", [PREP_BF16_BLOCK] = "bf16 activations in blocks of 16 tokens",
        [PREP_BF16_SPLIT] = "activations as three bf16 parts", [PREP_DEINTERLEAVE] = "a de-interleaved row"};
    const MatmulScratch* s = kernels_scratch(k);
    const ProductPlan p = plan_product(s, &W, 1, n, n, kernels_threads(k));
    char paths[80], prefetch[40];
    paths_text(&p, W, paths, sizeof paths);
    prefetch_text(&p, &s->prefetch, prefetch, sizeof prefetch);
    snprintf(text, len, "%s (%s%s%s)", p.kernel_name, paths, reads[p.prep], prefetch);
    return (p.prep == PREP_INT8 && p.amx) || p.prep == PREP_BF16_SPLIT ||
           ((p.prep == PREP_BF16_ROUND || p.prep == PREP_BF16_BLOCK) && p.bf16_packed);
}

/* ---- The driver: matmul runs several matrices that share the input x (q/k/v, gate/up) in one
 * dispatch, and matmul_segments with one row per matrix (decode's chosen experts) as well; the
 * activations are prepared once for all of them. ---- */

#define MAX_MULTI 16
#define MAX_RANGES 64  /* threads beyond this share ranges */

typedef struct MatmulJob {
    Kernels* k;
    MatmulScratch* s;    /* k's */
    Product pr;          /* the plan and the prepared activations, as each chunk's kernel reads them */
    float* out[MAX_MULTI];
    const Matrix* W[MAX_MULTI];
    int first_item[MAX_MULTI + 1]; /* matrix m's chunks are first_item[m] .. first_item[m + 1] - 1 */
    int n_mats;
    int each;            /* matmul_segments: matrix m reads token m of the prepared activations, as n = 1 */
    int group_sums;      /* PREP_INT8: quantize_rows also sums each group (Product.xgsum) */
    int n_ranges;        /* claim_chunks: one range of chunks per thread */
    struct {
        _Alignas(64) atomic_int next; /* a cache line each, so that claims in different ranges */
        int end;                      /* do not move one line between the cores */
    } range[MAX_RANGES];
} MatmulJob;

/* The next row chunks [first, *end) for the calling thread, or -1 when none is left. Thread k takes
 * the k-th of n_ranges contiguous ranges in order, `batch` per claim, so its weight reads stay one
 * stream from chunk to chunk (each block's prefetch runs into the next); then it takes the other
 * ranges' chunks one at a time. docs/design.md#row-chunks */
static int claim_chunks(MatmulJob* j, int thread, int batch, int* end) {
    const int me = thread % j->n_ranges;
    for (int k = 0; k < j->n_ranges; k++) {
        const int r = (me + k) % j->n_ranges, n = k == 0 ? batch : 1;
        if (atomic_load_explicit(&j->range[r].next, memory_order_relaxed) >= j->range[r].end) continue;
        const int c = atomic_fetch_add(&j->range[r].next, n);
        if (c < j->range[r].end) {
            *end = c + n < j->range[r].end ? c + n : j->range[r].end;
            return c;
        }
    }
    return -1;
}

/* Token t of a prepared product as a product of that token alone (matmul_segments, one row per
 * matrix: decode's kernels, which read the row or its int8 copy). */
static Product token_view(const Product* pr, int t, const Matrix* W) {
    const size_t C = (size_t)W->cols;
    Product v = *pr;
    v.x = pr->x + (size_t)t * C;
    if (pr->plan.prep == PREP_INT8) { /* quantize_rows' layout: per token C values, G groups */
        const size_t G = C / (size_t)W->group_size;
        v.xq = pr->xq + (size_t)t * C;
        v.xs = pr->xs + (size_t)t * G;
        v.xsum = pr->xsum + (size_t)t * G * 8;
        v.xgsum = pr->xgsum + (size_t)t * G;
    }
    return v;
}

/* The pool's task: row chunks of the job's matrices, each on the plan's kernel, claimed as the
 * plan's split says. */
static void matmul_task(void* ctx, int task, int thread) {
    MatmulJob* j = ctx;
    const MatmulThread mt = thread_view(j->s, thread);
    Product view;
    const Product* pr = &j->pr;
    int i, end, token = -1; /* the token pr is, and (bf16 decode) mt.xp holds de-interleaved */
    while ((i = claim_chunks(j, thread, j->pr.plan.claim, &end)) >= 0) {
        for (; i < end; i++) {
            int m = 0;
            while (i >= j->first_item[m + 1]) m++;
            const Matrix* W = j->W[m];
            const int want = j->each ? m : 0;
            if (token != want) {
                token = want;
                if (j->each) pr = (view = token_view(&j->pr, m, W), &view);
#if defined(KERNELS_AVX2)
                if (pr->plan.prep == PREP_DEINTERLEAVE) deinterleave(mt.xp, pr->x, W->cols, pr->plan.span);
#endif
            }
            const int r0 = (i - j->first_item[m]) * pr->plan.chunk;
            pr->plan.kernel(&mt, pr, j->out[m], W, r0, r0 + pr->plan.chunk < W->rows ? r0 + pr->plan.chunk : W->rows);
        }
        if (!j->pr.plan.task_per_thread) return; /* a task per chunk */
    }
}

/* The activations' per-token preparation before the products, as the plan says (prep): tokens
 * t0 .. t1-1 quantised to int8 per group, or rounded, blocked or split to bf16. */
ALWAYS_INLINE void prepare_range(const MatmulJob* j, int t0, int t1) {
    switch (j->pr.plan.prep) {
#if defined(HAVE_Q8_INT8)
    case PREP_INT8:
        quantize_rows(j->s->xq_buf, j->s->xs_buf, j->s->xsum_buf, j->group_sums ? j->s->xgsum_buf : NULL, j->pr.x,
                      j->W[0]->cols, j->W[0]->group_size, t0, t1);
        break;
#endif
#if defined(KERNELS_BF16_DOT)
    case PREP_BF16_BLOCK:
        bf16_block_rows((uint32_t*)(void*)j->s->xb16_buf, j->pr.x, j->W[0]->cols, j->pr.n, t0, t1);
        break;
    case PREP_BF16_ROUND: {
        const size_t C = (size_t)j->W[0]->cols;
        bf16_round_rows(j->s->xb16_buf + (size_t)t0 * C, j->pr.x + (size_t)t0 * C, (size_t)(t1 - t0) * C);
        break;
    }
#endif
#if defined(KERNELS_AMX_BF16)
    case PREP_BF16_SPLIT: bf16_split_rows(j->s->xb16_buf, j->pr.x, j->W[0]->cols, t0, t1); break;
#endif
    default: break;
    }
}

/* prepare_range over all the tokens, in items of the plan's prep_tokens. */
static void prepare_item(void* ctx, int i, int thread) {
    const MatmulJob* j = ctx;
    const int per = j->pr.plan.prep_tokens;
    int t0 = i * per, t1 = t0 + per < j->pr.n ? t0 + per : j->pr.n;
    prepare_range(j, t0, t1);
}

ALWAYS_INLINE void prepare_tokens(MatmulJob* j) {
    const int per = j->pr.plan.prep_tokens;
    if (per == 0) prepare_range(j, 0, j->pr.n);
    else parallel_for(j->k, (j->pr.n + per - 1) / per, prepare_item, j);
}

/* The copy of the activations the plan's kernel reads, made here once for all threads (the
 * de-interleaved row of bf16 decode: by each thread, matmul_task). */
ALWAYS_INLINE void prepare_activations(MatmulJob* j) {
    const MatmulScratch* s = j->s;
    Product* pr = &j->pr;
    pr->xq = s->xq_buf;
    pr->xs = s->xs_buf;
    pr->xsum = s->xsum_buf;
    pr->xb16 = s->xb16_buf;
    pr->xgsum = s->xgsum_buf;
    switch (pr->plan.prep) {
    case PREP_INT8:
        /* the groups' sums, which q4's tiles and the q8 panels with VNNI start from */
        j->group_sums = j->W[0]->type == WEIGHT_Q4;
#if defined(KERNELS_AVX2) && defined(Q8_VNNI)
        j->group_sums |= pr->plan.qi_packed;
#endif
        prepare_tokens(j);
        break;
    case PREP_BF16_BLOCK:
    case PREP_BF16_ROUND: prepare_tokens(j); break;
#if defined(KERNELS_AMX_BF16)
    case PREP_BF16_SPLIT: {
        const int n = pr->n, n16 = (n + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS, C = j->W[0]->cols;
        prepare_tokens(j);
        /* the last A tile's rows beyond n: zeros (their C rows are not stored) */
        memset(s->xb16_buf + (size_t)n * 3 * C, 0, (size_t)(n16 - n) * 3 * C * sizeof(uint16_t));
        break;
    }
#endif
    default: break;
    }
}

/* Sets j up for one dispatch of 1 .. MAX_MULTI matrices (matmul's, or with each set matmul_segments':
 * x holds n_mats rows, matrix m reads row m, n is 1) and prepares the activations; returns the
 * pool's task count, for the caller's parallel_for over matmul_task. */
ALWAYS_INLINE int start_product(MatmulJob* j, const Ops* o, float* const* outs, const float* x,
                                const Matrix* const* Ws, int n_mats, int n, int each) {
    j->k = ops_kernels(o);
    j->s = kernels_scratch(j->k);
    memcpy(j->out, outs, (size_t)n_mats * sizeof *outs);
    memcpy(j->W, Ws, (size_t)n_mats * sizeof *Ws);
    j->n_mats = n_mats;
    j->each = each;
    const int nt = kernels_threads(j->k);
    j->pr.plan = plan_product(j->s, Ws, n_mats, n, each ? n_mats : n, nt);
    j->pr.x = x;
    j->pr.n = each ? n_mats : n; /* matmul_segments prepares every matrix's row; each chunk reads one */
    prepare_activations(j);
    j->pr.n = n;
    j->first_item[0] = 0;
    for (int m = 0; m < n_mats; m++)
        j->first_item[m + 1] = j->first_item[m] + (j->W[m]->rows + j->pr.plan.chunk - 1) / j->pr.plan.chunk;
    const int n_items = j->first_item[n_mats];
    j->n_ranges = nt < MAX_RANGES ? nt : MAX_RANGES;
    for (int r = 0; r < j->n_ranges; r++) {
        atomic_init(&j->range[r].next, (int)((long long)n_items * r / j->n_ranges));
        j->range[r].end = (int)((long long)n_items * (r + 1) / j->n_ranges);
    }
    return j->pr.plan.task_per_thread ? nt : n_items;
}

void matmul(const Ops* o, float* const* outs, const float* x, const Matrix* const* Ws, int n_mats, int n) {
    MatmulJob j;
    for (int m = 0; m < n_mats; m += MAX_MULTI) {
        const int tasks = start_product(&j, o, outs + m, x, Ws + m, n_mats - m < MAX_MULTI ? n_mats - m : MAX_MULTI, n, 0);
        parallel_for(j.k, tasks, matmul_task, &j);
    }
}

/* One row per matrix (decode's chosen experts): one dispatch for them all, x prepared once. Else
 * a dispatch per matrix, as matmul's. */
void matmul_segments(const Ops* o, float* out, const float* x, const Matrix* const* Ws, const int* ns, int n_mats) {
    if (n_mats <= 0) return;
    const int R = Ws[0]->rows, C = Ws[0]->cols, per_job = n_mats < MAX_MULTI ? n_mats : MAX_MULTI;
    int one_row = (size_t)per_job * (size_t)C <= kernels_scratch(ops_kernels(o))->xq_cap;
    for (int m = 0; m < n_mats; m++) one_row &= ns[m] == 1;
    float* outs[MAX_MULTI];
    MatmulJob j;
    for (int m0 = 0, row = 0; m0 < n_mats; m0 += MAX_MULTI) {
        const int n = n_mats - m0 < MAX_MULTI ? n_mats - m0 : MAX_MULTI;
        if (one_row) {
            for (int m = 0; m < n; m++) outs[m] = out + (size_t)(row + m) * R;
            const int tasks = start_product(&j, o, outs, x + (size_t)row * C, Ws + m0, n, 1, 1);
            parallel_for(j.k, tasks, matmul_task, &j);
            row += n;
            continue;
        }
        for (int m = m0; m < m0 + n; row += ns[m++]) {
            if (ns[m] <= 0) continue;
            float* seg_out = out + (size_t)row * R;
            const int tasks = start_product(&j, o, &seg_out, x + (size_t)row * C, Ws + m, 1, ns[m], 0);
            parallel_for(j.k, tasks, matmul_task, &j);
        }
    }
}

/* ---- Decode's prefetch distance, timed on the model's own weights ----
 * Which distance reads fastest differs from core to core (near on Zen 4, mid on Zen 3 and Intel,
 * farther on Zen 5: docs/design.md#decode-prefetch), so instead of a table of CPU models the fast
 * ops time a few distances when they start, on a stretch of the model's weights too large for
 * any cache, with the decode product itself on one thread (how far a core's stream must ask
 * ahead shows when that core reads alone), and keep the quickest; mid's stays unless another is
 * at least 3% faster: ten passes over at most 256 MB, once per load. */
#define MEASURE_BYTES ((size_t)256 << 20)
#define MEASURE_ROUNDS 3

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The prefetch distance that the kernel decode's plan names for W reads, and the distances to time
 * (mid's first); NULL where that kernel does not prefetch (f32 decode, bf16 of odd widths, the
 * scalar products). */
static int* measured_distance(PrefetchPlan* p, const MatmulScratch* s, const Matrix* W, const int** candidates) {
    static const int q8[] = {1536, 128, 6144}, q4[] = {2048, 0, 6144}, bf16[] = {1024, 0, 2048},
                     zmm[] = {2048, 0, 3072};
    switch (plan_product(s, &W, 1, 1, 1, 1).prefetch) {
    case PF_Q8: return *candidates = q8, &p->q8;
    case PF_Q4: return *candidates = q4, &p->q4;
    case PF_BF16: return *candidates = bf16, &p->bf16;
    case PF_BF16_ZMM: return *candidates = zmm, &p->bf16_zmm;
    default: return NULL;
    }
}

/* The weights as one matrix of their format, cols wide, from the middle of the section: what
 * measure_prefetch reads (any bytes are valid weights of every format). */
static Matrix measure_sample(const OpsSpec* spec) {
    const size_t bytes = spec->weights_bytes < MEASURE_BYTES ? spec->weights_bytes : MEASURE_BYTES;
    Matrix W = {spec->weight_type, 0, spec->weight_cols, spec->group_size,
                (const char*)spec->weights + (spec->weights_bytes - bytes) / 2 / 64 * 64};
    if (W.type == WEIGHT_Q8 || W.type == WEIGHT_Q4)
        W.rows = (int)(bytes / quant_block_bytes(W.type, W.cols, W.group_size)) * quant_block_rows(W.type);
    else
        W.rows = (int)(bytes / ((size_t)W.cols * (W.type == WEIGHT_F32 ? 4 : 2)));
    return W;
}

const char* measure_prefetch(const Ops* o, const OpsSpec* spec) {
    MatmulScratch* s = kernels_scratch(ops_kernels(o));
    const Matrix W = measure_sample(spec);
    const int* cand;
    int* distance = measured_distance(&s->prefetch, s, &W, &cand);
    if (!BUILD_AVX2 || s->prefetch_fixed || !distance || W.rows < 64) return NULL;
    float* x = malloc((size_t)W.cols * sizeof(float));
    float* out = malloc((size_t)W.rows * sizeof(float));
    if (!x || !out) {
        free(x);
        free(out);
        return NULL;
    }
    for (int c = 0; c < W.cols; c++) x[c] = (float)(c % 17) - 8.0f;
    const Matrix* Ws[1] = {&W};
    Kernels* k = ops_kernels(o);
    const int threads = kernels_threads(k);
    kernels_set_threads(k, 1);
    matmul(o, &out, x, Ws, 1, 1); /* the pages and the code warm */
    double best[3] = {1e30, 1e30, 1e30};
    for (int round = 0; round < MEASURE_ROUNDS; round++)
        for (int i = 0; i < 3; i++) {
            const int c = (round + i) % 3; /* each distance in a new place of the order each round */
            *distance = cand[c];
            const double t0 = seconds_now();
            matmul(o, &out, x, Ws, 1, 1);
            const double t = seconds_now() - t0;
            best[c] = t < best[c] ? t : best[c];
        }
    kernels_set_threads(k, threads);
    free(x);
    free(out);
    int pick = 0;
    for (int c = 1; c < 3; c++)
        if (best[c] < best[pick]) pick = c;
    if (best[pick] > 0.97 * best[0]) pick = 0;
    *distance = cand[pick];
    snprintf(s->prefetch_name, sizeof s->prefetch_name, "%s %d B, measured",
             W.type == WEIGHT_Q8 ? "q8" : W.type == WEIGHT_Q4 ? "q4" : "bf16", cand[pick]);
    s->prefetch.name = s->prefetch_name;
    return s->prefetch.name;
}
