/* matmul_shared.h: what the fast product files share (the engine's interface is kernels.h):
 * matmul.c (the plan, the scratch, the driver) and the SIMD twins in x86/ and arm/
 * (matmul_float.c: f32 and bf16; matmul_int8.c: q8 and q4 x int8 activations; x86/matmul_amx.c).
 * One reader outside them: the bench's roof (cli/peak.c) includes it for the build's choice of dot
 * products (Q8_VNNI and the rest), so that it times the instructions the products run.
 * No file keeps state: the scratch, the prefetch plan and the switches belong to a kernel context
 * (fast.h, Kernels) and reach the twins in a MatmulThread. */
#ifndef MATMUL_SHARED_H
#define MATMUL_SHARED_H

#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/simd_math.h"
#include "kernels/fast/fast.h"


/* Row r of an f32 or bf16 matrix. */
ALWAYS_INLINE const void* row_ptr(const Matrix* W, int r) {
    return (const char*)W->data + (size_t)r * (size_t)W->cols * (W->type == WEIGHT_F32 ? 4 : 2);
}

/* ---- What a SIMD twin gets from the kernel context that runs it ---- */

/* Decode's software prefetch distances (matmul.c: choose_prefetch, measure_prefetch; AVX2 kernels only). */
typedef struct {
    const char* name;
    int q8;       /* bytes ahead in rows_qi_n1; 0: one row block ahead */
    int q4;       /* bytes ahead in tile_q4 */
    int bf16;     /* bytes ahead in rows_bf16_n1 (256-bit); 0: none */
    int bf16_zmm; /* bytes ahead in rows_bf16_n1_zmm (AVX-512 builds); 0: none */
} PrefetchPlan;
/* Which of those distances a decode kernel reads (ProductPlan.prefetch). */
enum { PF_NONE, PF_Q8, PF_Q4, PF_BF16, PF_BF16_ZMM };

/* One thread's share of a product: its part of the context's scratch (matmul.c, MatmulScratch)
 * and the context's prefetch plan, made per task by matmul.c's thread_view. The twins reach no
 * other state. */
typedef struct {
    /* The thread's row of max_cols floats: bf16 decode's de-interleaved activations (each thread's
     * own copy: a shared one would have to take back every line the other core read in the
     * previous product, docs/design.md#row-chunks). */
    float* xp;
    float* scales;         /* q8: a row block's scales as floats (q8_scales_float: at most 4 * cols / 32) */
    /* AVX2: FLOAT_MAX_PANELS * 16 * xp_stride floats, the thread's repacked weights for f32 and bf16
     * prefill: panels of 16 rows whose 64-byte vector k is column k of the rows in fp32 (f32, or
     * bf16 widened), or column pair k in bf16 (AMX-BF16's panels, half the size); tile_packed reads
     * either. */
    float* panels;
    int8_t* qi_pack;       /* AVX2: qi_pack_bytes(xp_stride), the thread's q8/q4 panels and their scales */
    uint8_t* amx_wt;       /* AMX: amx_thread_bytes(xp_stride), the thread's repacked q8/q4 rows, int32 tiles, scales */
    int xp_stride;         /* max_cols rounded up to whole cache lines */
#if defined(KERNELS_AVX2)
    const PrefetchPlan* prefetch;
#endif
} MatmulThread;

typedef struct Product Product;

/* A chunk's kernel: rows [r0, r1) of out for every token of the product. */
typedef void (*RowsKernel)(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1);

/* Which copy of the activations a product's kernel reads (matmul.c prepares it once for all
 * threads, or each thread its own): the fp32 rows as they are, int8 groups (q8, q4), bf16-rounded
 * rows or blocks of 16 tokens of them (--bf16-activations), three bf16 parts (AMX-BF16), or a
 * de-interleaved row (bf16 decode). */
enum { PREP_FP32, PREP_INT8, PREP_BF16_ROUND, PREP_BF16_BLOCK, PREP_BF16_SPLIT, PREP_DEINTERLEAVE };

/* Prefill's most rows per chunk (plan_product), and so what a thread's panel and tile scratch holds
 * for one repacking. */
#define PREFILL_CHUNK_ROWS 64

/* What matmul.c's plan_product decides for one product, the only place that holds the thresholds:
 * the kernel every chunk runs, the activations it reads, where chunks start, how the work splits
 * over the threads, and the paths that kernel takes. */
typedef struct {
    RowsKernel kernel;
    const char* kernel_name; /* its name, for the bench (kernels_describe_product) */
    int prep;         /* PREP_* */
    int span;         /* PREP_DEINTERLEAVE: columns per step of the de-interleaved row */
    int prefetch;     /* decode: the prefetch distance the kernel reads in an AVX2 build (PF_*) */
    int chunk;        /* rows per chunk, a multiple of align */
    int align;        /* chunks start at multiples of this (row blocks, panels, tiles) */
    int task_per_thread; /* decode: a pool task per thread, claiming chunks until none is left;
                            prefill: a task per chunk */
    int claim;        /* chunks per claim (claim_chunks) */
    int prep_tokens;  /* tokens per item of the activations' preparation; 0: the calling thread
                         prepares them all */
    int amx;          /* rows_qi: whole 16-row tiles on AMX first */
    int qi_packed;    /* rows_qi: then packed q8 / q4 panels of QP_ROWS rows */
    int float_packed; /* rows_f32_nn, rows_bf16_nn: packed panels of 16 rows first */
    int bf16_blocked; /* rows_bf16_dot: the activations in blocks of 16 tokens */
    int bf16_packed;  /* rows_bf16_dot: AMX-BF16 panels of 16 rows first */
} ProductPlan;

/* A product as its kernel reads it: the plan and the activations (those the plan's prep made). */
struct Product {
    ProductPlan plan;
    int n;                    /* tokens */
    const float* x;           /* [n, cols] fp32 */
    const int8_t* xq;         /* PREP_INT8: [n, cols] int8, */
    const float* xs;          /* their scales, one per group of 32 */
    const int32_t* xsum;      /* 8 partial sums per group (the AVX2 twin) */
    const int32_t* xgsum;     /* one sum per group (q4, and the q8 panels with VNNI) */
    const uint16_t* xb16;     /* PREP_BF16_*: the bf16 copy */
};

#if defined(KERNELS_AVX2)
#define FLOAT_PANEL_ROWS 16 /* rows per packed panel (f32 and bf16 prefill, rows_float_packed) */
#define FLOAT_MAX_PANELS (PREFILL_CHUNK_ROWS / FLOAT_PANEL_ROWS) /* panels per packing: a whole chunk */
/* The q8 / q4 panels of one packing (rows_qi_packed): a chunk's rows of cols int8 values, then
 * their scales as floats (rows * cols / 32 of 4 bytes: rows / 8 bytes per column), in whole cache
 * lines. */
static inline size_t qi_pack_bytes(int xp_stride) {
    return (size_t)(PREFILL_CHUNK_ROWS + PREFILL_CHUNK_ROWS / 8) * (size_t)xp_stride;
}
/* How many whole 16-row tiles (panels, AMX's B tiles) from row r the next repacking takes: as many
 * as [r, r1) holds, at most max (what the thread's scratch holds). */
static inline int row_tiles_next(int r, int r1, int max) {
    const int k = (r1 - r) / 16;
    return k < max ? k : max;
}
#endif

#if defined(KERNELS_AMX)
#define AMX_MAX_TILES (PREFILL_CHUNK_ROWS / 16) /* row tiles of 16 per repacking: a whole chunk */
/* A thread's part of the AMX scratch, in 64-byte multiples: its repacked rows (AMX_MAX_TILES * 16
 * rows of cols bytes, q4's widened to a byte each), the int32 tiles of one row of groups (at most
 * cols / 32 tiles of 1 KB) and the rows' scales as floats (at most rows * cols / 32 of 4 bytes). */
static inline size_t amx_thread_bytes(int xp_stride) {
    return (size_t)(AMX_MAX_TILES * 16 + 32 + PREFILL_CHUNK_ROWS / 8) * (size_t)xp_stride;
}
#endif

/* Tokens per block of prefill (a multiple of 4, at least 4): as many activation rows of
 * row_bytes each as fit in 192 KB, so the block stays in L2 while the weight tiles of a chunk meet
 * it (rows_float_nn, rows_bf16_dot, rows_qi). */
static inline int token_block(size_t row_bytes) {
    int tb = (int)(((size_t)192 * 1024) / row_bytes);
    if (tb < 4) tb = 4;
    return tb & ~3;
}

/* ---- Helpers that more than one of the SIMD files inline ---- */

#if defined(KERNELS_AVX2)
/* A float16 scale (q8, q4) as a float: F16C's vcvtph2ps, which every AVX2 CPU has but a build for
 * -mavx2 -mfma alone does not say so; else the scalar half_to_float, the same values. */
ALWAYS_INLINE float scale1(uint16_t h) {
#if defined(__F16C__)
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
#else
    return half_to_float(h);
#endif
}

/* One step of a prefill tile's prefetch of the next rows into L2 (rows_float_nn, rows_qi):
 * the bytes [next, next + bytes), one request per 64-byte line. Returns where the next step starts. */
ALWAYS_INLINE const char* prefetch_next_rows(const char* next, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(next + o, _MM_HINT_T1);
    return next + bytes;
}

#elif defined(KERNELS_NEON)

/* A float16 scale (q8) as a float: fcvtl, as the q4 kernel's vcvt_f32_f16. */
ALWAYS_INLINE float scale1(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

#endif

/* ---- What the files call in each other ---- */

#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
#define HAVE_Q8_INT8 1 /* q8 and q4 multiply int8 activations (a group size that is not a multiple of 32: the scalar reference) */

/* The chunk kernels (RowsKernel), one per (format, decode or prefill) that plan_product names.
 * matmul_float.c (x86/ or arm/): fp32 activations x. */
void rows_f32_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1); /* f32 decode */
void rows_f32_nn(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1); /* f32 prefill */
/* bf16 decode from x as it is: on arm64, and on x86 for widths rows_bf16_n1 does not take */
void rows_bf16_n1_plain(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1);
void rows_bf16_nn(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1); /* bf16 prefill */

/* matmul_int8.c (x86/ or arm/): x quantised per group (quantize_rows), then q8 or q4 weights x
 * those int8 values. */
void quantize_rows(int8_t* xq, float* xs, int32_t* xsum, int32_t* xgsum, const float* x, int C, int gs, int t0,
                   int t1);
void rows_qi_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1); /* q8 decode */
void rows_q4_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1); /* q4 decode */
void rows_qi(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1); /* q8 or q4 prefill */
#endif

#if defined(KERNELS_AVX2)
/* Q8_VNNI: the q8 and q4 dot products use vpdpbusd (AVX-512 VNNI or AVX-VNNI). */
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__GNUC__)) || defined(__AVXVNNI__)
#define Q8_VNNI 1
#endif

/* x86/matmul_float.c */
void deinterleave(float* xp, const float* x, int C, int span); /* rows_bf16_n1's activation row */
/* bf16 decode, x de-interleaved in mt->xp in steps of 16 columns (and in AVX-512 builds on zmm, of 32) */
void rows_bf16_n1(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1);
void rows_bf16_n1_zmm(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1);

#endif

/* rows per q8 or q4 panel (rows_qi_packed): one vector of int32 lanes, a zmm with 512-bit VNNI */
#if defined(Q8_VNNI) && defined(KERNELS_AVX512)
#define QP_ROWS 16
#else
#define QP_ROWS 8
#endif

#if defined(KERNELS_BF16_DOT) /* x86/matmul_float.c: bf16 weights x bf16 activations (--bf16-activations) */
void rows_bf16_dot(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1);
void bf16_round_rows(uint16_t* xb, const float* x, size_t count);
void bf16_block_rows(uint32_t* xt, const float* x, int C, int n, int t0, int t1);
#endif

#if defined(KERNELS_AMX)
#define AMX_ROWS 16 /* output rows per B tile, tokens per A tile */
/* x86/matmul_amx.c */
int amx_request(void);
void amx_configure(int K, int T);
int amx_chunk(const MatmulThread* mt, float* out, const int8_t* xq, const float* xsc, const Matrix* W, int n, int r0, int r1);
#endif

#if defined(KERNELS_AMX_BF16) /* x86/matmul_float.c: bf16 weights x fp32 activations split in three bf16 */
void bf16_split_rows(uint16_t* xs, const float* x, int C, int t0, int t1);
void rows_bf16_split(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1);
#endif

#endif /* MATMUL_SHARED_H */
