/* matmul.c: y = W x for f32, bf16, q8 and q4 weights, the embedding-row lookup, and the parallel
 * driver. The scalar reference comes first; the SIMD twins follow. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd_math.h"

#if defined(KERNELS_AMX)
#include <sys/syscall.h> /* arch_prctl: the tile state's permission */
#include <unistd.h>
#endif

/* ---------------------------------------------------------------------------------------------
 * Scalar reference
 * ------------------------------------------------------------------------------------------- */

/* q and scale of a quantised weight (kernels.h's layouts). */
static inline int quant_q(const Matrix* W, int r, int c) {
    return W->type == WEIGHT_Q4 ? q4_value(W, r, c)
                                : (int)(int8_t)quant_group(W, r, c / W->group_size)[c % W->group_size];
}

static inline float quant_scale(const Matrix* W, int r, int g) {
    return W->type == WEIGHT_Q4 ? q4_scale(W, r, g) : half_to_float(quant_scales(W, r)[g]);
}

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
        for (int c = 0; c < C; c++) out[c] = quant_scale(W, row, c / W->group_size) * (float)quant_q(W, row, c);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Scratch
 * ------------------------------------------------------------------------------------------- */

static float* xp_buf;      /* [max_threads * xp_stride] each thread's de-interleaved activation row (bf16, n == 1) */
static int xp_cap, xp_stride;
static int8_t* xq_buf;     /* [max_batch * max_cols] quantised activations */
static float* xs_buf;      /* [max_batch * max_cols / 8] their scales */
static int32_t* xsum_buf;  /* [max_batch * max_cols / 4] 8 partial sums per group (AVX2 twin) */
static int32_t* xgsum_buf; /* [max_batch * max_cols / 32] one sum per group (AVX2 twin, tile_q4) */
static size_t xq_cap;
static uint16_t* xb16_buf; /* [max_batch * max_cols] activations rounded to bf16 (--bf16-activations); with
                              AMX-BF16 [3 * split_cap]: fp32 activations split in three bf16 */
#if defined(KERNELS_AMX_BF16)
static size_t split_cap;   /* tokens x columns that xb16_buf holds split (max_batch up to a multiple of 16) */
#endif
static int bf16_activations;
static float* float_pack_buf; /* [max_threads * FLOAT_MAX_PANELS * 16 * max_cols] each thread's f32/bf16 panels (prefill) */
static uint8_t* amx_wt_buf; /* [max_threads * amx_thread_bytes] each thread's repacked q8/q4 rows, int32 tiles, scales (AMX) */
static int amx_usable;      /* q8 and q4 prefill run on AMX tiles (amx_request) */

/* KERNELS_PREFETCH: the decode prefetch plan asked for (used by the AVX2 kernels only, checked in
 * every build so that a mistyped value is reported wherever it is set). */
enum { PREFETCH_FROM_CPU = -1, PREFETCH_NEAR, PREFETCH_MID, PREFETCH_MID_L2, PREFETCH_FAR };
static int prefetch_from_env(void) {
    const char* s = getenv("KERNELS_PREFETCH");
    if (!s || !*s) return PREFETCH_FROM_CPU;
    if (strcmp(s, "near") == 0) return PREFETCH_NEAR;
    if (strcmp(s, "mid") == 0) return PREFETCH_MID;
    if (strcmp(s, "mid-l2") == 0) return PREFETCH_MID_L2;
    if (strcmp(s, "far") == 0) return PREFETCH_FAR;
    fprintf(stderr, "warning: KERNELS_PREFETCH=%s is not near, mid, mid-l2 or far; using the CPU's default\n", s);
    return PREFETCH_FROM_CPU;
}

#if defined(KERNELS_AVX2)
static void choose_prefetch(void);
#endif

/* The calling thread's scratch row of max_cols floats: bf16 decode's de-interleaved activations,
 * or q8's row-block scales as floats (q8_scales_float: at most 4 * cols / 32 floats, since the
 * int8 path runs only for group sizes that are multiples of 32). For bf16, each thread writes its
 * own copy at the start of its matmul_task rather than the dispatching thread writing one shared
 * copy: a line that the other core has read (in the previous product) must be taken back from it
 * before it can be written, and the shared copy's 64-192 lines took ~10 us per product while the
 * other thread waited (bf16 decode, 2 threads: run_job 6.5% of the calling thread's samples). */
#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
static float* thread_xp(void) { return xp_buf + (size_t)kernels_thread_index() * (size_t)xp_stride; }
#endif

#if defined(KERNELS_AVX2)
#define FLOAT_PANEL_ROWS 16 /* rows per packed panel (f32 and bf16 prefill, rows_float_packed) */
#define FLOAT_MAX_PANELS 4 /* panels of 16 rows per packing: prefill's chunks are at most 64 rows */
static float* thread_float_pack(void) {
    return float_pack_buf + (size_t)kernels_thread_index() * FLOAT_MAX_PANELS * 16 * (size_t)xp_stride;
}
/* How many whole 16-row tiles (panels, AMX's B tiles) from row r the next repacking takes: as many
 * as [r, r1) holds, at most max (what the thread's scratch holds). */
static inline int row_tiles_next(int r, int r1, int max) {
    const int k = (r1 - r) / 16;
    return k < max ? k : max;
}
/* Whether rows_float_nn packs W's rows for n tokens (run_job aligns its row chunks to 16 when so).
 * Below the thresholds the 4 x 3 (AVX2) or 4 x 4 (AVX-512) tiles are quicker: with few tokens
 * the weights' one pass from memory bounds the product (the tiles overlap it with their
 * arithmetic, prefetching the next rows), and the packing's writes and second read cost more
 * than the panels' tiles gain. Measured against the tiles with their prefetch, one thread, 0.6B
 * shape, tok/s (twenty-seventh session): x86-64-v3 f32 pp48 64-67 / 65-67, pp64 68-70 / 68,
 * pp96 74-75 / 72-73; bf16 pp64 66-67 / 74-78, pp96 74-79 / 75-80, pp112 86 / 82-83, pp128 81 /
 * 74-79; AVX-512 (AMX off for bf16) f32 pp16 48-51 / 52-55, pp24 66-67 / 65-67, pp32 76-81 /
 * 67-75; bf16 pp32 79-81 / 86-88, pp40 92 / 89-94, pp48 99-101 / 92-95. */
static int float_packed_takes(const Matrix* W, int n) {
#if defined(KERNELS_AVX512)
    const int min_tokens = W->type == WEIGHT_F32 ? 24 : 40;
#else
    const int min_tokens = W->type == WEIGHT_F32 ? 64 : 112;
#endif
    return (W->type == WEIGHT_F32 || W->type == WEIGHT_BF16) && n >= min_tokens && W->cols <= xp_cap;
}
#endif
#if defined(KERNELS_BF16_DOT)
/* The same for rows_bf16_dot (bf16 activations), whose panels take whole 32-column steps. */
static int bf16_packed_takes(const Matrix* W, int n) {
    return W->type == WEIGHT_BF16 && n >= 16 && W->cols % 32 == 0 && W->cols <= xp_cap;
}
#endif

#if defined(KERNELS_AMX)
#define AMX_MAX_TILES 4 /* row tiles of 16 per repacking: prefill's chunks are at most 64 rows */
static int amx_request(void);
/* The calling thread's part of amx_wt_buf, in 64-byte multiples: its repacked rows
 * (AMX_MAX_TILES * 16 rows of cols bytes: q4's widened to a byte each), the int32 tiles of one
 * row of groups (at most cols / 32 tiles of 1 KB, q4's groups), and the rows' scales as floats
 * (AMX_MAX_TILES * 16 rows x at most cols / 32 groups: 2 * cols floats). */
static size_t amx_thread_bytes(void) { return (size_t)(AMX_MAX_TILES * 16 + 32 + 8) * (size_t)xp_stride; }
static uint8_t* thread_amx_wt(void) { return amx_wt_buf + (size_t)kernels_thread_index() * amx_thread_bytes(); }
static int32_t* thread_amx_c(void) {
    return (int32_t*)(thread_amx_wt() + (size_t)AMX_MAX_TILES * 16 * (size_t)xp_stride);
}
static float* thread_amx_ws(void) {
    return (float*)(thread_amx_wt() + (size_t)(AMX_MAX_TILES * 16 + 32) * (size_t)xp_stride);
}
#endif

int kernels_amx(void) { return amx_usable; }

#if defined(KERNELS_AMX)
static int amx_granted; /* amx_request's answer at kernels_init */
#endif
int kernels_set_amx(int on) {
#if defined(KERNELS_AMX)
    amx_usable = on && amx_granted;
#else
    (void)on;
#endif
    return amx_usable;
}

int matmul_scratch_init(int max_threads, int max_batch, int max_cols) {
    matmul_scratch_free();
#if defined(KERNELS_AVX2)
    choose_prefetch();
#else
    (void)prefetch_from_env();
#endif
    if (max_batch < 1) max_batch = 1;
    if (max_cols < 1) max_cols = 1;
    if (max_threads < 1) max_threads = 1;
    xq_cap = (size_t)max_batch * (size_t)max_cols;
    xq_buf = aligned_alloc(64, (xq_cap + 63) / 64 * 64);
    xs_buf = aligned_alloc(64, ((xq_cap / 8 + 1) * sizeof(float) + 63) / 64 * 64);
    xsum_buf = aligned_alloc(64, ((xq_cap / 4 + 8) * sizeof(int32_t) + 63) / 64 * 64);
    xgsum_buf = aligned_alloc(64, ((xq_cap / 32 + 8) * sizeof(int32_t) + 63) / 64 * 64);
    xp_cap = max_cols;
    xp_stride = (max_cols + 15) / 16 * 16; /* whole cache lines: no line is shared by two threads */
    xp_buf = aligned_alloc(64, (size_t)max_threads * (size_t)xp_stride * sizeof(float));
    int ok = xq_buf && xs_buf && xsum_buf && xgsum_buf && xp_buf;
#if defined(KERNELS_AVX2)
    float_pack_buf = aligned_alloc(64, (size_t)max_threads * FLOAT_MAX_PANELS * 16 * (size_t)xp_stride * sizeof(float));
    ok = ok && float_pack_buf;
#endif
#if defined(KERNELS_AMX)
    amx_usable = amx_granted = amx_request();
    if (amx_usable) {
        amx_wt_buf = aligned_alloc(64, (size_t)max_threads * amx_thread_bytes());
        ok = ok && amx_wt_buf;
    }
#endif
#if defined(KERNELS_BF16_DOT)
    size_t xb16_cap = xq_cap;
#if defined(KERNELS_AMX_BF16) /* bf16_split_rows: three parts, tokens up to a whole A tile */
    split_cap = (size_t)((max_batch + 15) / 16 * 16) * (size_t)max_cols; /* an A tile: 16 tokens */
    xb16_cap = 3 * split_cap;
#endif
    xb16_buf = aligned_alloc(64, (xb16_cap * sizeof(uint16_t) + 63) / 64 * 64);
    ok = ok && xb16_buf;
#endif
    if (!ok) {
        matmul_scratch_free();
        return -1;
    }
    return 0;
}

void matmul_scratch_free(void) {
    free(xq_buf);
    free(xs_buf);
    free(xsum_buf);
    free(xgsum_buf);
    free(xp_buf);
    free(xb16_buf);
    free(float_pack_buf);
    float_pack_buf = NULL;
    free(amx_wt_buf);
    amx_wt_buf = NULL;
    amx_usable = 0;
#if defined(KERNELS_AMX)
    amx_granted = 0;
#endif
    xq_buf = NULL;
    xs_buf = NULL;
    xsum_buf = NULL;
    xgsum_buf = NULL;
    xp_buf = NULL;
    xb16_buf = NULL;
#if defined(KERNELS_AMX_BF16)
    split_cap = 0;
#endif
    xq_cap = 0;
    xp_cap = 0;
    xp_stride = 0;
}

int kernels_bf16_activations(void) { return bf16_activations; }

int kernels_set_bf16_activations(int on) {
#if defined(KERNELS_BF16_DOT)
    bf16_activations = on != 0;
#else
    bf16_activations = 0;
    (void)on;
#endif
    return bf16_activations;
}

/* ---------------------------------------------------------------------------------------------
 * SIMD twins. Each computes the rows [r0, r1) of out for all n tokens. The float path (f32, bf16,
 * and q8 when its group size is not a multiple of 32) computes tiles of RT weight rows x TT tokens
 * with RT*TT vector accumulators, so each weight vector loaded is used TT times and each
 * activation vector RT times; bf16 and int8 weights are widened to fp32 in registers. The q8 path
 * proper multiplies int8 weights by int8-quantised activations (see quantize_rows) and scales the
 * int32 group sums by (weight scale * activation scale) into fp32 accumulators.
 * ------------------------------------------------------------------------------------------- */

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Tokens per block of prefill (a multiple of 4, at least 4): as many activation rows of
 * row_bytes each as fit in 192 KB, so the block stays in L2 while the weight tiles of a chunk meet
 * it (rows_float_nn, rows_bf16_dot, rows_qi_t, rows_q4). */
static inline int token_block(size_t row_bytes) {
    int tb = (int)(((size_t)192 * 1024) / row_bytes);
    if (tb < 4) tb = 4;
    return tb & ~3;
}

/* Row r of an f32 or bf16 matrix. */
ALWAYS_INLINE const void* row_ptr(const Matrix* W, int r) {
    return (const char*)W->data + (size_t)r * (size_t)W->cols * (W->type == WEIGHT_F32 ? 4 : 2);
}

#if defined(KERNELS_AVX2)

#ifndef PF_AHEAD
#define PF_AHEAD 512 /* bytes ahead: software prefetch of rows_float_n1's weight streams */
#endif

/* How far ahead the matrix-vector products (decode) ask for their weights. The best distance
 * depends on the core, and the four this engine was measured on disagree:
 *  - Zen 5 (AMD family 1Ah; seventh session, one thread on a 194 MB q4 matrix): 23.2-23.7 GB/s one
 *    2560-byte row block ahead, 28.7-31.6 at 5120 bytes, 23.9-30.3 at 8192. "far".
 *  - Zen 4 (family 19h; eleventh session, decode on the 0.6B shape, one thread, alternating): q4
 *    65-68 tok/s at 256 bytes against 41-43 at 5120 (61-62 at 0, 63-67 at 128, 54-59 at 512); q8
 *    (rows_qi_n1) 41-44 at 128 bytes against 36-42 one block (4352 bytes) ahead with the kernel
 *    before and 37-38 with this one, 38-47 at 256, 29-36 at 512. There a prefetch far ahead seems
 *    to hold one of the core's few outstanding L1 misses for longer, while near ones meet lines
 *    the hardware prefetcher is already bringing in. "near".
 *  - Zen 3 (family 19h too, no AVX-512, the issue's machine; fourteenth session): the other way for q8.
 *    tools/q8_read_probe.c's engine loop, one thread, 264 MB, as a share of its streaming read
 *    in the same rounds: 0.76-0.77 at 128 bytes, 0.82 at 768, 0.88 at 1024, 0.90 at 1536, 0.88
 *    at 2048 and 3072, 0.84 one block ahead. Decode q8 tg128, one thread, three alternating
 *    rounds: 18.1-19.4 tok/s at 128 against 20.6-22.9 at 1536 (70-73% -> 82-86% of the roof).
 *    q4 moved no more than the noise between 256 (t1) and 5120 (t0) (29-35 tok/s either way),
 *    so it keeps Zen 4's. bf16, which relies on the hardware prefetcher elsewhere
 *    (rows_bf16_n1), gained from 1024 bytes ahead: 10.2-10.6 -> 10.6-11.3 tok/s, 71% -> 77-81%
 *    of the roof. "mid".
 *  - Intel (twenty-third session: a 2-core KVM guest of a Xeon with AVX-512, VNNI, BF16 and AMX,
 *    family 6, ~15 GB/s for one thread): decode tg64 of the 0.6B shape, two alternating rounds of
 *    the three plans, one thread: q8 near 25.7 / 23.3 tok/s, mid 24.3 / 24.2, far 21.5 / 21.7
 *    (97-101% / 100% / 89-91% of the roof); q4 34.4-35.8 / 40.6-41.6 / 41.0-43.4; bf16 11.3-11.5 /
 *    11.6-12.2 / 11.7-12.0. Two threads, mid / far: q8 44.5 / 40.4-39.7 (93-94% / 85%), q4
 *    78.0-79.3 / 74.4-81.2, bf16 21.3-21.5 / 21.4-21.6. "mid". The AVX-512 bf16 kernel
 *    (rows_bf16_n1_zmm), which no plan prefetched for before, with KERNELS_PREFETCH=mid's 1024
 *    bytes / 2048 / none / 4096, one thread 96-99% / 101-102% / 89-91% / 91-93% of the roof, two
 *    threads 94-95% / 99% / 86-88% / 83-86% (two rounds, tg64): mid's bf16_zmm is 2048; Zen 3
 *    (mid's other CPU) has no AVX-512, and near and far keep none, as measured before. f32
 *    (rows_f32_n1, no prefetch before) 2048 bytes ahead against none, three alternating rounds of
 *    tg32: one thread 93-94% against 85-88% of the roof, two 90-92% against 81-86%; in an earlier,
 *    slower phase of the VM 1024 / 2048 / 4096 read 78-80% / 80-82% / 64-66% against 74-78%. So
 *    mid's f32 is 2048; near and far keep none (Zen 3, mid's other CPU, was not measured with it).
 * q4 (tile_q4 in the 8-row layout, sixteenth session): 2048 bytes ahead into L1 in the mid and far
 * plans, none in near. On Zen 3, decode tg128, three rounds of five distances in turn, one / two threads:
 * none 41.1-42.5 / 70.7-77.2 tok/s, 1024 47.2-48.2 / 72.1-78.6, 2048 51.7-53.1 / 77.6-84.9
 * (88-94% of the roof), 3072 48.3-49.5 / 73.3-75.4, 4096 46.6-48.3 / 71.0-73.0. Before this
 * layout q4 went near (256 bytes into L2) on Zen 3 and 4, where its arithmetic, not memory, was
 * the limit. On Zen 4 (seventeenth session, two rounds, one / two threads) no distance stood out:
 * 0 59.4-60.6 / 76.7-80.3, 1024 52.4-68.3 / 76.2-90.6, 2048 59.8-67.6 / 79.2-87.2, 3072
 * 60.8-60.9 / 71.8-77.3, 4096 61.4-64.7 / 78.3-82.4; with float16 scales (eighteenth session,
 * seven alternating rounds, one thread) none read 83-87 tok/s in six rounds and 73 in one (79-92%
 * of the roof) against 74-80 (79-83%) at 2048; two threads level or better. Zen 5 was not
 * measured with this kernel.
 * Intel, q4 into L2 (prefetcht1) instead of L1 at the same distance (twenty-ninth session,
 * decode tg128, one binary, KERNELS_PREFETCH=mid alternating with a plan that sent q4's prefetch
 * to L2 at every thread count). AVX2 build (-march=x86-64-v3, the 256-bit kernel without VNNI),
 * one thread, three rounds: 33.8-34.8 against 36.5-37.6 tok/s (83-84% -> 88-89% of the roof);
 * half an hour later, when L1 read 87-96%, six rounds level (36.8-41.0 against 37.9-40.2): as in
 * the twenty-eighth session, an L2 prefetch pays where the pages are slow. Two threads, five
 * rounds: 73.6-77.1 against 70.8-73.7, 1-6% slower in each. Native build (AVX-512 VNNI,
 * q4_group_sums1_zmm), two rounds: one thread level (38.3-39.1 against 38.3-39.3), two threads
 * 73.2-74.1 against 69.6-73.1. So Intel's plan, "mid-l2", is mid with q4's prefetch into L2 when
 * one thread decodes, into L1 with more. "One thread" is kernels_alone(), not the thread count:
 * beside a busy core the pool runs two threads' dispatches on the calling thread, and with the
 * count two threads ran those on L1 and read 0.93-0.95 of one thread's speed there
 * (tools/bench_busy.py, q4, three rounds; 0.99-1.01 with both on L1). Zen 3's q4 was not
 * measured with t1 in this layout, so its plan stays "mid".
 * The rest stays at prefetcht0: q8's weights (with t1 44.5-46.5 tok/s against 45.2-47.1 on Zen 4;
 * weights and scales with t1 42) and the far distance, as measured on Zen 5.
 * KERNELS_PREFETCH=near, mid, mid-l2 or far overrides the choice from the CPU (choose_prefetch). */
typedef struct {
    const char* name;
    int q8;       /* bytes ahead in rows_qi_n1; 0: one row block ahead */
    int q4;       /* bytes ahead in tile_q4 */
    int bf16;     /* bytes ahead in rows_bf16_n1 (256-bit); 0: none */
    int bf16_zmm; /* bytes ahead in rows_bf16_n1_zmm (AVX-512 builds); 0: none */
    int f32;      /* bytes ahead in rows_f32_n1; 0: none */
    int q4_l2;    /* 1: tile_q4's prefetch goes into L2 (prefetcht1) when one thread decodes (kernels_alone), 0: into L1 */
} PrefetchPlan;
static const PrefetchPlan prefetch_near = {"near", 128, 0, 0, 0, 0, 0},
                          prefetch_mid = {"mid", 1536, 2048, 1024, 2048, 2048, 0},
                          prefetch_mid_l2 = {"mid-l2", 1536, 2048, 1024, 2048, 2048, 1},
                          prefetch_far = {"far", 0, 2048, 0, 0, 0, 0};
static PrefetchPlan decode_prefetch;

/* Zen 3 and Zen 4 are both AMD family 19h. gcc 12.2's __builtin_cpu_is("znver3") cannot tell
 * them apart: it predates znver4, and its libgcc calls every family-19h model with VAES a
 * znver3, Zen 4 included. So from the fourteenth session on, Zen 4 ran Zen 3's plan, unseen
 * until the eighteenth (q8 decode with one thread 7-15% slower than with near). AVX-512 is a
 * difference every compiler can see: Zen 4 has it, Zen 3 does not. */
static void choose_prefetch(void) {
    decode_prefetch = prefetch_far;
#if defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_is("amdfam19h")) decode_prefetch = __builtin_cpu_supports("avx512f") ? prefetch_near : prefetch_mid;
    if (__builtin_cpu_is("intel")) decode_prefetch = prefetch_mid_l2;
#endif
    switch (prefetch_from_env()) {
    case PREFETCH_NEAR: decode_prefetch = prefetch_near; break;
    case PREFETCH_MID: decode_prefetch = prefetch_mid; break;
    case PREFETCH_MID_L2: decode_prefetch = prefetch_mid_l2; break;
    case PREFETCH_FAR: decode_prefetch = prefetch_far; break;
    default: break;
    }
}

const char* kernels_prefetch_plan(void) {
    return decode_prefetch.name ? decode_prefetch.name : "none";
}

/* Tokens per float prefill tile (rows_float_nn): a 4 x 4 f32 tile needs 16 accumulators + 4
 * activations + 1 weight, which fits in the 32 vector registers of an AVX-512 build (also for
 * ymm code) but not in AVX2's 16, where gcc spills in the inner loop; there 4 x 3 fits. Built with
 * -march=x86-64-v3 (AVX2 + FMA only) on the development VM, pp512 with one thread, alternating:
 * f32 62-65 -> 84-88 tok/s, bf16 63-65 -> 83-88 (q8 then used it too: 76-81 -> 86-90; it has its
 * own tile now, below); the -march=native build (AVX-512) keeps 4 x 4. From 16 tokens on, f32 and
 * bf16 take the packed panels instead (rows_float_packed); this tile is left to fewer tokens, the
 * rows after a chunk's last whole panel, and q8 whose group size is not a multiple of 32. */
#if defined(__AVX512F__)
#define TILE_TOKENS 4
#else
#define TILE_TOKENS 3
#endif

/* q8 prefill tiles (tile_qi): 4 tokens, so that a row's four sums share one scaling step; 4 rows
 * where there are 32 vector registers, 2 in AVX2's 16 (16 int32 sums alone would fill them).
 * (-march=x86-64-v3, Intel VM, pp512 one thread, alternating: 2 x 4 tiles 96-99 tok/s, 4 x 4 86.)
 * With VNNI (AVX-512, AMX off) 4 x 4: 171-174, 2 x 4 152-156. */
#define Q8_TILE_TOKENS 4
#if defined(__AVX512F__)
#define Q8_TILE_ROWS 4
#else
#define Q8_TILE_ROWS 2
#endif

ALWAYS_INLINE __m256 ldw(const void* w, size_t i, WeightType type) {
    if (type == WEIGHT_F32) return _mm256_loadu_ps((const float*)w + i);
    if (type == WEIGHT_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)w + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    __m128i b = _mm_loadl_epi64((const __m128i*)((const int8_t*)w + i));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

ALWAYS_INLINE float ldw1(const void* w, size_t i, WeightType type) {
    if (type == WEIGHT_F32) return ((const float*)w)[i];
    if (type == WEIGHT_BF16) return bf16_to_f32(((const uint16_t*)w)[i]);
    return (float)((const int8_t*)w)[i];
}

/* A float16 scale (q8, q4) as a float, one (scale1) or eight in a row (scales8): F16C's vcvtph2ps,
 * which every AVX2 CPU has but a build for -mavx2 -mfma alone does not say so; else the scalar
 * half_to_float, the same values. */
ALWAYS_INLINE float scale1(uint16_t h) {
#if defined(__F16C__)
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
#else
    return half_to_float(h);
#endif
}

ALWAYS_INLINE __m256 scales8(const void* b) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b));
#else
    float f[8];
    for (int i = 0; i < 8; i++) {
        uint16_t h;
        memcpy(&h, (const char*)b + 2 * i, 2);
        f[i] = half_to_float(h);
    }
    return _mm256_loadu_ps(f);
#endif
}

/* out[k] = the float of h[k], k < n <= 8: eight at a time where there are eight. */
ALWAYS_INLINE void scales_upto8(float out[8], const uint16_t* h, int n) {
    if (n == 8) {
        _mm256_storeu_ps(out, scales8(h));
    } else {
        for (int k = 0; k < n; k++) out[k] = scale1(h[k]);
    }
}

/* q8: the G scales of rows r .. r+RT-1 (one row block) as floats, row r + i's at out + i * G.
 * Prefill converts a row block's scales once for all its token tiles: converting them inside the
 * tile (per group, or per 8 groups) made q8 pp512 4-9% slower (gcc spilled more of the tile). */
ALWAYS_INLINE void q8_scales_float(float* out, const Matrix* W, int r, int RT) {
    const int G = W->cols / W->group_size;
    const uint16_t* sc = quant_scales(W, r);
    for (int i = 0; i < RT; i++)
        for (int g = 0; g < G; g += 8)
            scales_upto8(out + (size_t)i * G + g, sc + (size_t)i * G + g, G - g < 8 ? G - g : 8);
}

/* One step of a prefill tile's prefetch of the next rows into L2 (rows_float_nn, rows_qi_tiles):
 * the bytes [next, next + bytes), one request per 64-byte line. Returns where the next step starts. */
ALWAYS_INLINE const char* prefetch_next_rows(const char* next, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(next + o, _MM_HINT_T1);
    return next + bytes;
}

/* Tile of RT rows x TT tokens over the columns [c0, c1) (c1 - c0 a multiple of 8), added into
 * acc (not reduced). Weight (row i of the tile, column c) is element i * rs + (c - c0) of wb. The
 * 4 x 4 and 4 x 3 cases (TILE_TOKENS) are spelled out with named registers: gcc otherwise reloads
 * the operands from L1 on every FMA and runs at half the speed clang gets from the generic loop.
 * With TT == 3 the fourth token's lines are dead code and vanish. next: NULL, or f32/bf16 weights
 * to bring into L2 at the pace this tile reads its own (4 rows x 8 columns per step: one 64-byte
 * line of bf16, two of f32; rows_float_nn). */
ALWAYS_INLINE void tile_float_acc(__m256 acc[4][4], const float* x, const void* wb, size_t rs, WeightType type, int C,
                                  int t, int c0, int c1, int RT, int TT, const char* next) {
    const size_t next_step = type == WEIGHT_F32 ? 128 : 64;
    if (RT == 4 && (TT == 4 || TT == 3)) {
        const __m256 z = _mm256_setzero_ps();
        __m256 a00 = acc[0][0], a01 = acc[0][1], a02 = acc[0][2], a03 = TT == 4 ? acc[0][3] : z;
        __m256 a10 = acc[1][0], a11 = acc[1][1], a12 = acc[1][2], a13 = TT == 4 ? acc[1][3] : z;
        __m256 a20 = acc[2][0], a21 = acc[2][1], a22 = acc[2][2], a23 = TT == 4 ? acc[2][3] : z;
        __m256 a30 = acc[3][0], a31 = acc[3][1], a32 = acc[3][2], a33 = TT == 4 ? acc[3][3] : z;
        const float* x0 = x + (size_t)t * C;
        const float* x1 = x0 + C;
        const float* x2 = x1 + C;
        const float* x3 = x2 + C; /* read only when TT == 4 */
        for (int c = c0; c < c1; c += 8) {
            const size_t w0 = (size_t)(c - c0), w1 = w0 + rs, w2 = w1 + rs, w3 = w2 + rs;
            if (next) next = prefetch_next_rows(next, next_step);
            __m256 v0 = _mm256_loadu_ps(x0 + c), v1 = _mm256_loadu_ps(x1 + c);
            __m256 v2 = _mm256_loadu_ps(x2 + c), v3 = TT == 4 ? _mm256_loadu_ps(x3 + c) : z;
            /* keep the activation vectors in registers (gcc would fold each load into every FMA
             * that uses it: 16 loads instead of 4) */
            __asm__("" : "+v"(v0), "+v"(v1), "+v"(v2));
            if (TT == 4) __asm__("" : "+v"(v3));
            __m256 w = ldw(wb, w0, type);
            __asm__("" : "+v"(w));
            a00 = _mm256_fmadd_ps(w, v0, a00);
            a01 = _mm256_fmadd_ps(w, v1, a01);
            a02 = _mm256_fmadd_ps(w, v2, a02);
            if (TT == 4) a03 = _mm256_fmadd_ps(w, v3, a03);
            w = ldw(wb, w1, type);
            __asm__("" : "+v"(w));
            a10 = _mm256_fmadd_ps(w, v0, a10);
            a11 = _mm256_fmadd_ps(w, v1, a11);
            a12 = _mm256_fmadd_ps(w, v2, a12);
            if (TT == 4) a13 = _mm256_fmadd_ps(w, v3, a13);
            w = ldw(wb, w2, type);
            __asm__("" : "+v"(w));
            a20 = _mm256_fmadd_ps(w, v0, a20);
            a21 = _mm256_fmadd_ps(w, v1, a21);
            a22 = _mm256_fmadd_ps(w, v2, a22);
            if (TT == 4) a23 = _mm256_fmadd_ps(w, v3, a23);
            w = ldw(wb, w3, type);
            __asm__("" : "+v"(w));
            a30 = _mm256_fmadd_ps(w, v0, a30);
            a31 = _mm256_fmadd_ps(w, v1, a31);
            a32 = _mm256_fmadd_ps(w, v2, a32);
            if (TT == 4) a33 = _mm256_fmadd_ps(w, v3, a33);
        }
        acc[0][0] = a00, acc[0][1] = a01, acc[0][2] = a02;
        acc[1][0] = a10, acc[1][1] = a11, acc[1][2] = a12;
        acc[2][0] = a20, acc[2][1] = a21, acc[2][2] = a22;
        acc[3][0] = a30, acc[3][1] = a31, acc[3][2] = a32;
        if (TT == 4) acc[0][3] = a03, acc[1][3] = a13, acc[2][3] = a23, acc[3][3] = a33;
        return;
    }
    for (int c = c0; c < c1; c += 8) {
        if (next) next = prefetch_next_rows(next, next_step);
        __m256 wv[4];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) wv[i] = ldw(wb, (size_t)i * rs + (size_t)(c - c0), type);
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)(t + j) * C + c);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
}

#if defined(KERNELS_AVX512)
/* 16 rows of 16 four-byte words, in place: r[j] becomes the column j of what came in. Three
 * rounds of interleaving (32-bit, 64-bit, 128-bit lanes), 64 shuffles. */
ALWAYS_INLINE void transpose16_epi32(__m512i r[16]) {
    __m512i b[16], c[16];
    for (int i = 0; i < 16; i += 2) {
        b[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);     /* per 128-bit lane L: r_i[4L], r_i+1[4L], r_i[4L+1], r_i+1[4L+1] */
        b[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]); /* the same for 4L+2, 4L+3 */
    }
    for (int q = 0; q < 16; q += 4) { /* c[q + k], lane L: rows q .. q+3 of column 4L + k */
        c[q] = _mm512_unpacklo_epi64(b[q], b[q + 2]);
        c[q + 1] = _mm512_unpackhi_epi64(b[q], b[q + 2]);
        c[q + 2] = _mm512_unpacklo_epi64(b[q + 1], b[q + 3]);
        c[q + 3] = _mm512_unpackhi_epi64(b[q + 1], b[q + 3]);
    }
    for (int k = 0; k < 4; k++) { /* column 4L + k: lane L of c[k], c[4+k], c[8+k], c[12+k] */
        const __m512i d0 = _mm512_shuffle_i32x4(c[k], c[4 + k], 0x44), d1 = _mm512_shuffle_i32x4(c[k], c[4 + k], 0xEE);
        const __m512i d2 = _mm512_shuffle_i32x4(c[8 + k], c[12 + k], 0x44), d3 = _mm512_shuffle_i32x4(c[8 + k], c[12 + k], 0xEE);
        r[k] = _mm512_shuffle_i32x4(d0, d2, 0x88);
        r[4 + k] = _mm512_shuffle_i32x4(d0, d2, 0xDD);
        r[8 + k] = _mm512_shuffle_i32x4(d1, d3, 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(d1, d3, 0xDD);
    }
}

/* tile_float for f32 and bf16 on 512-bit vectors: twice the products per FMA of the ymm tile, with
 * the 32 registers holding a 4 x 4 tile (16 accumulators, 4 activations, 1 weight). Only the lanes
 * in mask k are loaded (the rest are zero): the last step of a row whose width is not a multiple
 * of 16 needs no scalar tail. */
ALWAYS_INLINE __m512 ldw_zmm(const void* w, size_t i, WeightType type, __mmask16 k) {
    if (type == WEIGHT_F32) return _mm512_maskz_loadu_ps(k, (const float*)w + i);
    const __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t*)w + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE void tile_float_zmm_step(__m512 acc[4][4], const float* x, const void* wr, WeightType type, int C, int t,
                                       int c, __mmask16 k, int RT, int TT) {
    __m512 xv[4];
#pragma GCC unroll 4
    for (int j = 0; j < TT; j++) {
        xv[j] = _mm512_maskz_loadu_ps(k, x + (size_t)(t + j) * C + c);
        __asm__("" : "+v"(xv[j])); /* in a register, not folded into each FMA (see tile_float_acc) */
    }
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++) {
        __m512 w = ldw_zmm(wr, (size_t)i * C + c, type, k);
        __asm__("" : "+v"(w));
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) acc[i][j] = _mm512_fmadd_ps(w, xv[j], acc[i][j]);
    }
}

ALWAYS_INLINE void tile_float_zmm(float* out, const float* x, const Matrix* W, WeightType type, int r, int t, int RT,
                                  int TT, const char* next) {
    const int C = W->cols, R = W->rows, C16 = C & ~15;
    const void* wr = row_ptr(W, r);
    const size_t next_step = type == WEIGHT_F32 ? 256 : 128; /* 4 rows x 16 columns per step */
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) acc[i][j] = _mm512_setzero_ps();
    for (int c = 0; c < C16; c += 16) {
        if (next) next = prefetch_next_rows(next, next_step);
        tile_float_zmm_step(acc, x, wr, type, C, t, c, (__mmask16)0xFFFF, RT, TT);
    }
    if (C16 < C) tile_float_zmm_step(acc, x, wr, type, C, t, C16, (__mmask16)((1u << (C - C16)) - 1), RT, TT);
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) out[(size_t)(t + j) * R + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}
#endif

#if defined(KERNELS_AVX512)
/* f32 and bf16 prefill on 512-bit vectors with the weights repacked (the GEMM kernels' way): a
 * chunk's rows are first transposed, 16 rows at a time, into panels where column c of the 16
 * rows is one vector (bf16 widened to fp32 on the way); then each vector of 16 rows meets a
 * token's x[c] broadcast from memory in one FMA, and a tile of FLOAT_TILE_TOKENS tokens x 32 rows
 * keeps 24 accumulators with no horizontal sum at the end. tile_float_zmm (4 rows x 4 tokens,
 * each accumulator over 16 columns) loads two vectors per four FMAs and ends with 16 horizontal
 * sums; this one loads 2 vectors and 12 broadcasts per 24 FMAs. Each output is one fp32 sum over
 * the columns in order, one FMA per column (the scalar reference's order, fused). */
#define FLOAT_TILE_TOKENS 12

/* Rows [r, r + 16) as a panel: column c at panel + 16 * c. */
static void float_pack_panel(float* panel, const Matrix* W, WeightType type, int r) {
    const int C = W->cols, C16 = C & ~15;
    const void* wr = row_ptr(W, r);
    for (int c = 0; c < C16; c += 16) {
        __m512i v[16];
        for (int n = 0; n < 16; n++)
            v[n] = _mm512_castps_si512(ldw_zmm(wr, (size_t)n * C + c, type, (__mmask16)0xFFFF));
        transpose16_epi32(v);
        for (int k = 0; k < 16; k++) _mm512_storeu_si512((void*)(panel + (size_t)(c + k) * 16), v[k]);
    }
    for (int c = C16; c < C; c++)
        for (int n = 0; n < 16; n++) panel[(size_t)c * 16 + n] = ldw1(wr, (size_t)n * C + c, type);
}

/* out rows [r, r + 16 * RP) (RP panels: 1 or 2) x TT tokens, over the K vectors of each panel
 * (64 bytes each: a column of f32, or a column pair of bf16 for rows_bf16_packed). Token j's
 * operand for vector k is the 4 bytes at xt + j * xstride + 4 * k, broadcast: its x[k] as fp32
 * for an FMA, or (dot, --bf16-activations) its bf16 pair k for a vdpbf16ps. */
ALWAYS_INLINE void tile_packed(float* out, const char* xt, size_t xstride, const void* panels, int K, int R, int r,
                               int TT, int RP, int dot) {
    const uint32_t* p0 = panels;
    const uint32_t* p1 = p0 + (size_t)16 * K;
    __m512 acc[FLOAT_TILE_TOKENS][2];
#pragma GCC unroll 12
    for (int j = 0; j < TT; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        const __m512i w0 = _mm512_loadu_si512((const void*)(p0 + (size_t)16 * k));
        const __m512i w1 = RP > 1 ? _mm512_loadu_si512((const void*)(p1 + (size_t)16 * k)) : w0;
#pragma GCC unroll 12
        for (int j = 0; j < TT; j++) {
            const char* xk = xt + (size_t)j * xstride + (size_t)4 * k;
#if defined(KERNELS_BF16_DOT)
            if (dot) {
                int32_t pair;
                memcpy(&pair, xk, sizeof pair);
                const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
                acc[j][0] = _mm512_dpbf16_ps(acc[j][0], (__m512bh)w0, xv);
                if (RP > 1) acc[j][1] = _mm512_dpbf16_ps(acc[j][1], (__m512bh)w1, xv);
                continue;
            }
#endif
            float xf; /* as a float, so that gcc folds the broadcast into the FMA ({1to16}) */
            memcpy(&xf, xk, sizeof xf);
            const __m512 xv = _mm512_set1_ps(xf);
            acc[j][0] = _mm512_fmadd_ps(_mm512_castsi512_ps(w0), xv, acc[j][0]);
            if (RP > 1) acc[j][1] = _mm512_fmadd_ps(_mm512_castsi512_ps(w1), xv, acc[j][1]);
        }
    }
#pragma GCC unroll 12
    for (int j = 0; j < TT; j++) {
        _mm512_storeu_ps(out + (size_t)j * R + r, acc[j][0]);
        if (RP > 1) _mm512_storeu_ps(out + (size_t)j * R + r + 16, acc[j][1]);
    }
}

/* Every one of n tokens (token t's operands from x + t * xstride, its outputs at out + t * R)
 * through RP panels (constant) from row r: tiles of 12 tokens, then of 4 and 1. */
ALWAYS_INLINE void panel_token_tiles(float* out, const char* x, size_t xstride, const uint32_t* pp, int K, int R, int r,
                                     int n, int RP, int dot) {
    int t = 0;
    for (; t + FLOAT_TILE_TOKENS <= n; t += FLOAT_TILE_TOKENS)
        tile_packed(out + (size_t)t * R, x + t * xstride, xstride, pp, K, R, r, FLOAT_TILE_TOKENS, RP, dot);
    for (; t + 4 <= n; t += 4) tile_packed(out + (size_t)t * R, x + t * xstride, xstride, pp, K, R, r, 4, RP, dot);
    for (; t < n; t++) tile_packed(out + (size_t)t * R, x + t * xstride, xstride, pp, K, R, r, 1, RP, dot);
}

/* The np packed panels from row r0 (a panel: 16 * K words), two at a time (one where an odd one
 * is left), for all n tokens. dot: a constant at each caller. */
ALWAYS_INLINE void panel_tiles(float* out, const char* x, size_t xstride, const uint32_t* packed, int K, int R, int r0,
                               int n, int np, int dot) {
    for (int p = 0; p < np; p += 2) {
        const uint32_t* pp = packed + (size_t)p * 16 * K;
        if (p + 2 <= np) panel_token_tiles(out, x, xstride, pp, K, R, r0 + 16 * p, n, 2, dot);
        else panel_token_tiles(out, x, xstride, pp, K, R, r0 + 16 * p, n, 1, dot);
    }
}

/* Rows [r0, r0 + 16 * np) (np <= FLOAT_MAX_PANELS) for all n tokens: packed into the thread's
 * scratch, then panel_tiles. */
static void rows_float_packed(float* out, const float* x, const Matrix* W, WeightType type, int n, int r0, int np,
                              float* packed) {
    const int C = W->cols;
    for (int p = 0; p < np; p++) float_pack_panel(packed + (size_t)p * 16 * C, W, type, r0 + 16 * p);
    panel_tiles(out, (const char*)x, (size_t)C * sizeof(float), (const uint32_t*)(const void*)packed, C, W->rows, r0,
                n, np, 0);
}
#endif

/* 8 rows of 8 four-byte words (floats, or q8's groups of 4 values), in place: r[j] becomes the
 * column j of what came in (the AVX2 panels: f32/bf16 here, q8 in q8_pack_panel). */
ALWAYS_INLINE void transpose8_ps(__m256 r[8]) {
    __m256 a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* per 128-bit half H: r_i[4H], r_i+1[4H], r_i[4H+1], r_i+1[4H+1] */
        a[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* the same for 4H+2, 4H+3 */
    }
    for (int q = 0; q < 8; q += 4) { /* b[q + k], half H: rows q .. q+3 of column 4H + k */
        b[q] = _mm256_shuffle_ps(a[q], a[q + 2], 0x44);
        b[q + 1] = _mm256_shuffle_ps(a[q], a[q + 2], 0xEE);
        b[q + 2] = _mm256_shuffle_ps(a[q + 1], a[q + 3], 0x44);
        b[q + 3] = _mm256_shuffle_ps(a[q + 1], a[q + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) { /* column k: the low halves of b[k] (rows 0-3) and b[4 + k] (4-7); 4 + k: the high */
        r[k] = _mm256_permute2f128_ps(b[k], b[4 + k], 0x20);
        r[4 + k] = _mm256_permute2f128_ps(b[k], b[4 + k], 0x31);
    }
}

#if defined(KERNELS_AVX2) && !defined(KERNELS_AVX512)
/* The packed panels above on AVX2's 16 ymm registers (the issue's Zen 3 has no AVX-512): the same
 * panels of 16 rows (column c of the 16 rows at panel + 16 * c, bf16 widened to fp32), a tile of
 * 6 tokens x 16 rows in 12 accumulators, 2 weight vectors and 1 broadcast: per column 2 loads and
 * 6 broadcasts for 12 FMAs (the BLAS kernels' 6 x 16 shape), where the 4 x 3 tile_float loads 7
 * vectors per 12 FMAs and ends with 12 horizontal sums. Each output is one fp32 sum over the
 * columns in order, one FMA per column, so the bits are those of the AVX-512 panels. */
#define FLOAT_TILE_TOKENS 6

/* Rows [r, r + 16) as a panel: column c at panel + 16 * c. */
static void float_pack_panel(float* panel, const Matrix* W, WeightType type, int r) {
    const int C = W->cols, C8 = C & ~7;
    const void* wr = row_ptr(W, r);
    for (int c = 0; c < C8; c += 8)
        for (int h = 0; h < 16; h += 8) {
            __m256 v[8];
            for (int k = 0; k < 8; k++) v[k] = ldw(wr, (size_t)(h + k) * C + c, type);
            transpose8_ps(v);
            for (int k = 0; k < 8; k++) _mm256_storeu_ps(panel + (size_t)(c + k) * 16 + h, v[k]);
        }
    for (int c = C8; c < C; c++)
        for (int k = 0; k < 16; k++) panel[(size_t)c * 16 + k] = ldw1(wr, (size_t)k * C + c, type);
}

/* out rows [r, r + 16) x TT tokens (token j's x at x + j * C, its outputs at out + j * R). */
ALWAYS_INLINE void tile_packed(float* out, const float* x, const float* panel, int C, int R, int r, int TT) {
    __m256 acc[FLOAT_TILE_TOKENS][2];
#pragma GCC unroll 6
    for (int j = 0; j < TT; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int c = 0; c < C; c++) {
        const __m256 w0 = _mm256_loadu_ps(panel + (size_t)16 * c), w1 = _mm256_loadu_ps(panel + (size_t)16 * c + 8);
#pragma GCC unroll 6
        for (int j = 0; j < TT; j++) {
            const __m256 xv = _mm256_broadcast_ss(x + (size_t)j * C + c);
            acc[j][0] = _mm256_fmadd_ps(w0, xv, acc[j][0]);
            acc[j][1] = _mm256_fmadd_ps(w1, xv, acc[j][1]);
        }
    }
#pragma GCC unroll 6
    for (int j = 0; j < TT; j++) {
        _mm256_storeu_ps(out + (size_t)j * R + r, acc[j][0]);
        _mm256_storeu_ps(out + (size_t)j * R + r + 8, acc[j][1]);
    }
}

/* Rows [r0, r0 + 16 * np) (np <= FLOAT_MAX_PANELS) for all n tokens: packed into the thread's
 * scratch, then per block of tokens (a multiple of 6 that stays in L2, as rows_float_nn's) every
 * panel meets the block's tokens, 6 at a time, then 4, then 1. */
static void rows_float_packed(float* out, const float* x, const Matrix* W, WeightType type, int n, int r0, int np,
                              float* packed) {
    const int C = W->cols, R = W->rows;
    for (int p = 0; p < np; p++) float_pack_panel(packed + (size_t)p * 16 * C, W, type, r0 + 16 * p);
    int tb = token_block((size_t)C * sizeof(float)) / FLOAT_TILE_TOKENS * FLOAT_TILE_TOKENS;
    if (tb < FLOAT_TILE_TOKENS) tb = FLOAT_TILE_TOKENS;
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        for (int p = 0; p < np; p++) {
            const float* pp = packed + (size_t)p * 16 * C;
            const int r = r0 + 16 * p;
            int t = t0;
            for (; t + FLOAT_TILE_TOKENS <= t1; t += FLOAT_TILE_TOKENS)
                tile_packed(out + (size_t)t * R, x + (size_t)t * C, pp, C, R, r, FLOAT_TILE_TOKENS);
            for (; t + 4 <= t1; t += 4) tile_packed(out + (size_t)t * R, x + (size_t)t * C, pp, C, R, r, 4);
            for (; t < t1; t++) tile_packed(out + (size_t)t * R, x + (size_t)t * C, pp, C, R, r, 1);
        }
    }
}
#endif

/* Rows r .. r+RT-1 of tile_float; for q8, RT > 1 only from the first row of a row block (the
 * row loops step by 4 from a multiple of 4), so the tile's rows lie in one block. next: NULL, or
 * (f32, bf16) the next 4 rows, brought into L2 as this tile goes (rows_float_nn). */
ALWAYS_INLINE void tile_float(float* out, const float* x, const Matrix* W, WeightType type, int r, int t, int RT,
                              int TT, const void* next) {
#if defined(KERNELS_AVX512)
    if (type != WEIGHT_Q8) {
        tile_float_zmm(out, x, W, type, r, t, RT, TT, next);
        return;
    }
#endif
    const int C = W->cols, R = W->rows;
    const int C8 = C & ~7;
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) acc[i][j] = _mm256_setzero_ps();
    if (type == WEIGHT_Q8) {
        /* weights widened to fp32; the group scale is applied to each group's partial sums */
        const int gs = W->group_size, G = C / gs;
        const uint16_t* sc = quant_scales(W, r); /* row r + i's scales at sc + i * G */
        __m256 tot[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) tot[i][j] = _mm256_setzero_ps();
        float tail[4][4] = {{0}};  /* the last gs % 8 columns of each group, scalar */
        for (int g = 0; g < G; g++) {
            const int c8 = g * gs + (gs & ~7), c1 = g * gs + gs;
            const int8_t* wg = (const int8_t*)quant_group(W, r, g); /* row r + i's values at wg + i * gs */
            tile_float_acc(acc, x, wg, (size_t)gs, type, C, t, g * gs, c8, RT, TT, NULL);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                const float sg = scale1(sc[(size_t)i * G + g]);
                __m256 sv = _mm256_set1_ps(sg);
#pragma GCC unroll 4
                for (int j = 0; j < TT; j++) {
                    tot[i][j] = _mm256_fmadd_ps(acc[i][j], sv, tot[i][j]);
                    acc[i][j] = _mm256_setzero_ps();
                    float s = 0.0f;
                    for (int c = c8; c < c1; c++)
                        s += (float)wg[i * gs + c - g * gs] * x[(size_t)(t + j) * C + c];
                    tail[i][j] += s * sg;
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) out[(size_t)(t + j) * R + r + i] = hsum256(tot[i][j]) + tail[i][j];
        return;
    }
    const void* wr = row_ptr(W, r);
    tile_float_acc(acc, x, wr, (size_t)C, type, C, t, 0, C8, RT, TT, next);
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) {
            float s = hsum256(acc[i][j]);
            for (int c = C8; c < C; c++)
                s += ldw1(wr, (size_t)i * C + c, type) * x[(size_t)(t + j) * C + c];
            out[(size_t)(t + j) * R + r + i] = s;
        }
}

/* Matrix-vector (n == 1) for the cases without a special kernel (bf16 with cols % 16 != 0, q8
 * with fp32 activations): 4 rows at a time, each with two accumulators so the FMA chains overlap;
 * the weights are streamed once. */
ALWAYS_INLINE void rows_float_n1(float* out, const float* x, const Matrix* W, WeightType type, int r0, int r1) {
    const int C = W->cols;
    const int C16 = C & ~15;
    int r = r0;
    if (type != WEIGHT_Q8) {
        for (; r + 4 <= r1; r += 4) {
            __m256 a[4][2];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
            for (int c = 0; c < C16; c += 16) {
                __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
                __asm__("" : "+v"(x0), "+v"(x1));
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    if (type == WEIGHT_F32 || (c & 31) == 0)  /* one prefetch per 64-byte line */
                        _mm_prefetch((const char*)W->data + ((size_t)(r + i) * C + c) * (type == WEIGHT_F32 ? 4 : 2) + PF_AHEAD,
                                     _MM_HINT_T0);
                    a[i][0] = _mm256_fmadd_ps(ldw(W->data, (size_t)(r + i) * C + c, type), x0, a[i][0]);
                    a[i][1] = _mm256_fmadd_ps(ldw(W->data, (size_t)(r + i) * C + c + 8, type), x1, a[i][1]);
                }
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                int c = C16;
                if (c + 8 <= C) {
                    a[i][0] = _mm256_fmadd_ps(ldw(W->data, (size_t)(r + i) * C + c, type),
                                              _mm256_loadu_ps(x + c), a[i][0]);
                    c += 8;
                }
                float s = hsum256(_mm256_add_ps(a[i][0], a[i][1]));
                for (; c < C; c++) s += ldw1(W->data, (size_t)(r + i) * C + c, type) * x[c];
                out[r + i] = s;
            }
        }
    } else {
        for (; r + 4 <= r1; r += 4) tile_float(out, x, W, type, r, 0, 4, 1, NULL);
    }
    for (; r < r1; r++) tile_float(out, x, W, type, r, 0, 1, 1, NULL);
}

/* bf16 matrix-vector product without widening instructions: a 32-byte load holds 16 bf16, and
 * 32-bit lane k holds elements 2k (low half) and 2k+1 (high half), so `lane << 16` is element 2k
 * as an fp32 and `lane & 0xFFFF0000` is element 2k+1. The activation row was de-interleaved once
 * per call (deinterleave with a span of 16: per 16 columns, the 8 even ones then the 8 odd ones), so each 16
 * weights cost one load, a shift, an and and two FMAs. Needs cols % 16 == 0. One row at a time,
 * as rows_f32_n1, so the weights are one sequential stream that the hardware prefetcher follows
 * on its own: one thread on a 352 MB matrix read 26.7 GB/s, against 17.1 for four rows side by
 * side with the next block prefetched (four streams), where a streaming read gave 27.5
 * (docs/notes-kernels.md, "Fifth session"). 64 columns per step into 8 accumulators, not 32 into
 * 4: fewer loop instructions per byte let the core keep more loads in flight (scratch, 1 thread,
 * 352 MB: 29.0 -> 30.2 GB/s against a streaming read of 33.5; sixth session). */
static void deinterleave(float* xp, const float* x, int C, int span) {
    const int h = span / 2;
    for (int c = 0; c < C; c += span)
        for (int k = 0; k < h; k++) {
            xp[c + k] = x[c + 2 * k];
            xp[c + h + k] = x[c + 2 * k + 1];
        }
}

ALWAYS_INLINE void bf16_step16(__m256* a, __m256* b, const uint16_t* w, const float* xp) {
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256i v = _mm256_loadu_si256((const __m256i*)w);
    *a = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), _mm256_load_ps(xp), *a);
    *b = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hi)), _mm256_load_ps(xp + 8), *b);
}

/* With prefetch (a constant at each call), each 128 bytes of a row ask for the two lines pf bytes
 * ahead (Zen 3: choose_prefetch). */
ALWAYS_INLINE void rows_bf16_n1_pf(float* out, const float* xp, const Matrix* W, int r0, int r1, const int prefetch,
                                   int pf) {
    const int C = W->cols;
    for (int r = r0; r < r1; r++) {
        const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        int c = 0;
        for (; c + 64 <= C; c += 64) {
            if (prefetch) {
                _mm_prefetch((const char*)(w + c) + pf, _MM_HINT_T0);
                _mm_prefetch((const char*)(w + c) + pf + 64, _MM_HINT_T0);
            }
            bf16_step16(&a0, &b0, w + c, xp + c);
            bf16_step16(&a1, &b1, w + c + 16, xp + c + 16);
            bf16_step16(&a2, &b2, w + c + 32, xp + c + 32);
            bf16_step16(&a3, &b3, w + c + 48, xp + c + 48);
        }
        for (; c < C; c += 16) bf16_step16(&a0, &b0, w + c, xp + c);
        __m256 s01 = _mm256_add_ps(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1));
        __m256 s23 = _mm256_add_ps(_mm256_add_ps(a2, b2), _mm256_add_ps(a3, b3));
        out[r] = hsum256(_mm256_add_ps(s01, s23));
    }
}

#if defined(KERNELS_AVX512)
/* rows_bf16_n1 on 512-bit vectors: a 64-byte load is 32 bf16, the activation row de-interleaved
 * per 32 columns (16 even, then 16 odd), and 128 columns per step into 8 accumulators: half the
 * instructions per weight byte of the ymm kernel, so the core keeps more loads in flight. On Zen 4
 * (AVX-512 on 256-bit units), decode tg128 of the 0.6B shape with one thread, three alternating
 * rounds: 20.5-20.7 -> 23.2-25.2 tok/s, 75-76% -> 86-87% of the roof (seventeenth session). No
 * software prefetch: the plans that have AVX-512 CPUs (choose_prefetch) give bf16 none. The 64
 * bytes come in as two 32-byte loads joined by vinserti64x4: Zen 4 splits a 512-bit load in two
 * anyway, and with 256-bit loads the same kernel read 50-53 -> 69-71 GB/s in L2 (one thread,
 * 256 KB matrix) and 30.2-30.8 -> 30.5-31.2 from memory (345 MB), a plain streaming read 6%
 * faster with ymm loads than with zmm loads there too (nineteenth session). Needs
 * cols % 32 == 0. */
ALWAYS_INLINE void bf16_step32(__m512* a, __m512* b, const uint16_t* w, const float* xp) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)w)),
                                   _mm256_loadu_si256((const __m256i*)(w + 16)), 1);
    *a = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_load_ps(xp), *a);
    *b = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hi)), _mm512_load_ps(xp + 16), *b);
}

ALWAYS_INLINE void rows_bf16_n1_zmm_pf(float* out, const float* xp, const Matrix* W, int r0, int r1, int PF, int pf) {
    const int C = W->cols;
    for (int r = r0; r < r1; r++) {
        const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
        __m512 a0 = _mm512_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        int c = 0;
        for (; c + 128 <= C; c += 128) {
            if (PF)
                for (int o = 0; o < 256; o += 64) _mm_prefetch((const char*)(w + c) + pf + o, _MM_HINT_T0);
            bf16_step32(&a0, &b0, w + c, xp + c);
            bf16_step32(&a1, &b1, w + c + 32, xp + c + 32);
            bf16_step32(&a2, &b2, w + c + 64, xp + c + 64);
            bf16_step32(&a3, &b3, w + c + 96, xp + c + 96);
        }
        for (; c < C; c += 32) bf16_step32(&a0, &b0, w + c, xp + c);
        __m512 s01 = _mm512_add_ps(_mm512_add_ps(a0, b0), _mm512_add_ps(a1, b1));
        __m512 s23 = _mm512_add_ps(_mm512_add_ps(a2, b2), _mm512_add_ps(a3, b3));
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(s01, s23));
    }
}

/* The plan's distance (bf16_zmm) as a constant-folded branch: the copy without prefetch is the
 * code it was before there was one. */
static void rows_bf16_n1_zmm(float* out, const float* xp, const Matrix* W, int r0, int r1) {
    if (decode_prefetch.bf16_zmm) rows_bf16_n1_zmm_pf(out, xp, W, r0, r1, 1, decode_prefetch.bf16_zmm);
    else rows_bf16_n1_zmm_pf(out, xp, W, r0, r1, 0, 0);
}
#endif

/* The activation span of rows_bf16_n1's de-interleaved row: 32 columns for the zmm kernel. */
static int bf16_span(int cols) {
#if defined(KERNELS_AVX512)
    if (cols % 32 == 0) return 32;
#endif
    (void)cols;
    return 16;
}

static void rows_bf16_n1(float* out, const float* xp, const Matrix* W, int r0, int r1) {
#if defined(KERNELS_AVX512)
    if (bf16_span(W->cols) == 32) {
        rows_bf16_n1_zmm(out, xp, W, r0, r1);
        return;
    }
#endif
    if (decode_prefetch.bf16) rows_bf16_n1_pf(out, xp, W, r0, r1, 1, decode_prefetch.bf16);
    else rows_bf16_n1_pf(out, xp, W, r0, r1, 0, 0);
}

/* f32 matrix-vector product, one row at a time with four accumulators. An f32 row of the 0.6B
 * shape is 4 KB, a page: reading four rows side by side (as bf16 and q8 do, to share the
 * activation loads) makes four streams that each start on a page the hardware prefetcher has not
 * seen, while one row after the other is a single sequential stream. Measured on the 0.6B shape,
 * decode with --no-mmap, alternating runs on the 2-core VM: 1 thread 11.9 vs 9.4 tok/s (median of
 * 4), 2 threads 20.9 vs 18.5 (docs/notes-kernels.md). bf16 does the same (rows_bf16_n1); q8
 * reads row blocks (rows_qi_n1). */
ALWAYS_INLINE void rows_f32_n1_pf(float* out, const float* x, const Matrix* W, int r0, int r1, int PF, int pf) {
    const int C = W->cols;
    const float* wd = (const float*)W->data;
    for (int r = r0; r < r1; r++) {
        const float* w = wd + (size_t)r * C;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int c = 0;
        for (; c + 32 <= C; c += 32) {
            if (PF) {
                _mm_prefetch((const char*)(w + c) + pf, _MM_HINT_T0);
                _mm_prefetch((const char*)(w + c) + pf + 64, _MM_HINT_T0);
            }
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(x + c), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c + 16), _mm256_loadu_ps(x + c + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c + 24), _mm256_loadu_ps(x + c + 24), a3);
        }
        float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (; c < C; c++) s += w[c] * x[c];
        out[r] = s;
    }
}

/* The plan's distance (choose_prefetch) as a constant-folded branch, as rows_bf16_n1_zmm. */
static void rows_f32_n1(float* out, const float* x, const Matrix* W, int r0, int r1) {
    if (decode_prefetch.f32) rows_f32_n1_pf(out, x, W, r0, r1, 1, decode_prefetch.f32);
    else rows_f32_n1_pf(out, x, W, r0, r1, 0, 0);
}

/* ---- q8 and q4 x int8 activations ---- */

#if !defined(KERNELS_Q8_F32ACT) /* that build multiplies fp32 activations only */
/* Quantises token rows [t0, t1) of x (width C) to int8 per group of gs (a multiple of 32):
 * s = max|x| / 127, q = round(x / s). Also stores, per group, -128 times the sums of q that land
 * in each of the 8 int32 lanes of the dot product (lane k: the columns c with c % 32 in
 * 4k .. 4k+3), the start of the accumulator (qi_acc0 below), and, when xgsum is not NULL (q4
 * weights), -8 times the sum of all the group's q there (tile_q4). */
static void quantize_rows(int8_t* xq, float* xs, int32_t* xsum, int32_t* xgsum, const float* x, int C, int gs,
                          int t0, int t1) {
    const int G = C / gs;
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int t = t0; t < t1; t++) {
        for (int g = 0; g < G; g++) {
            const float* v = x + (size_t)t * C + (size_t)g * gs;
            __m256 m = _mm256_setzero_ps();
            for (int c = 0; c < gs; c += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(signbit, _mm256_loadu_ps(v + c)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            float s = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            xs[(size_t)t * G + g] = s;
            __m256 vi = _mm256_set1_ps(inv);
            int8_t* q = xq + (size_t)t * C + (size_t)g * gs;
            __m256i sum = _mm256_setzero_si256();
            for (int c = 0; c < gs; c += 32) {
                __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c), vi));
                __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c + 8), vi));
                __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c + 16), vi));
                __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c + 24), vi));
                __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(d, e));
                p = _mm256_permutevar8x32_epi32(p, perm);
                _mm256_storeu_si256((__m256i*)(q + c), p);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16));
            }
            _mm256_storeu_si256((__m256i*)(xsum + ((size_t)t * G + g) * 8),
                                _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 7)));
            if (xgsum) {
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
                xgsum[(size_t)t * G + g] = -8 * _mm_cvtsi128_si32(s4);
            }
        }
    }
}
#endif

/* The q8 dot product of 32 weights and 32 int8 activations, in three parts: qi_load once per
 * weight vector, qi_acc0 once per group and token (the accumulator's start), qi_dot per weight
 * vector and token. Each 32-bit lane adds the products of 4 neighbouring columns; the lanes are
 * summed at the group's end. The two x86 instructions multiply an unsigned byte by a signed one:
 *  - VNNI (vpdpbusd): the q8 weight as w + 128 (w XOR 0x80, an unsigned byte), so a lane sums
 *    (w + 128) x = w x + 128 x over its columns, and it starts at -128 times the sum of those
 *    columns' x (quantize_rows). One instruction per vector and token, and each lane ends with
 *    exactly the int32 of the plain AVX2 path, so both give the same bits after the fp32 steps.
 *    (One correction for the whole group in lane 0 gave the same total, but with lanes that are
 *    larger and cancel only in the final sum, so the fp32 steps rounded differently: logits
 *    moved by up to 3e-6 against the plain AVX2 build.)
 *  - plain AVX2 (vpmaddubsw, which saturates pairs at int16): |w| times x with w's sign, pairs of
 *    at most 2 * 128 * 127 < 32768, then vpmaddwd by 1 into int32.
 * (q4 has its own kernel below, tile_q4; it uses dpbusd too.) */
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__GNUC__)) || defined(__AVXVNNI__)
#define Q8_VNNI 1
#endif

#if defined(Q8_VNNI)
/* acc + per 32-bit lane the sum of its 4 products of an unsigned byte of a by a signed byte of x. */
ALWAYS_INLINE __m256i dpbusd(__m256i acc, __m256i a, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__GNUC__)
    /* Where both encodings exist, gcc 12 emits the VEX one ({vex} vpdpbusd, ymm0-15 only) for
     * either intrinsic and then shuffles values between ymm0-15, ymm16-31 and the stack. As inline
     * asm with "v" operands the register allocator may use all 32 registers. */
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(x));
    return acc;
#else
    return _mm256_dpbusd_avx_epi32(acc, a, x);
#endif
}
#endif

typedef struct {
    __m256i a, w; /* VNNI: a = w + 128 (w unused); plain: a = |w|, w for its sign */
} QW;

/* The 32 weights of a row group from column c (a multiple of 32) on; wrow is the row's group. */
ALWAYS_INLINE QW qi_load(const uint8_t* wrow, int c) {
    QW p;
    const __m256i w = _mm256_loadu_si256((const __m256i*)(wrow + c));
#if defined(Q8_VNNI)
    p.a = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
#else
    p.a = _mm256_abs_epi8(w);
#endif
    p.w = w;
    return p;
}

/* xsum8: the group's 8 lane corrections from quantize_rows (-128 x each lane's sum of q_x). */
ALWAYS_INLINE __m256i qi_acc0(const int32_t* xsum8) {
#if defined(Q8_VNNI)
    return _mm256_loadu_si256((const __m256i*)xsum8);
#else
    (void)xsum8;
    return _mm256_setzero_si256();
#endif
}

ALWAYS_INLINE __m256i qi_dot(__m256i acc, QW p, __m256i x) {
#if defined(Q8_VNNI)
    return dpbusd(acc, p.a, x);
#else
    __m256i s = _mm256_maddubs_epi16(p.a, _mm256_sign_epi8(x, p.w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s, _mm256_set1_epi16(1)));
#endif
}

/* Four int32 sums of 8 lanes each into one vector: lane k (k < 4) holds a[k]'s lanes 0-3 added,
 * lane 4 + k its lanes 4-7 (integer adds: exact, in any order). */
ALWAYS_INLINE __m256i sum_halves4(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
}

/* Rows r .. r+RT-1 (RT 1, 2 or 4, within one row block) x tokens t .. t+TT-1 (TT 1 or 4), 32
 * columns per step. At a group's end, with four tokens, a row's four int32 sums are reduced to
 * their two halves (sum_halves4), converted, and scaled by (weight scale x activation scale) into
 * the row's fp32 total, whose halves are added at the end: one conversion, multiply and fma per
 * four outputs instead of per output. Per output and group that scaling cost about as much as
 * the group's int8 products on AVX2 (no VNNI: sign, maddubs, madd and add per 32 columns). One
 * token (the tail of a token block) keeps a total per output, scaled lane by lane and summed at
 * the end, the arithmetic of the matrix-vector kernel (rows_qi_n1). Which of the two an output
 * gets depends only on its token's place in the token block, never on the row split, so the
 * thread count cannot change a result (test_kernels: 1 thread == 2 threads and matmul_multi ==
 * matmul, bitwise). ws: the rows' scales as floats (q8_scales_float), row r + i's at ws + i * G.
 * next: NULL, or the next row block, brought into L2 a G-th of it per group (rows_qi_tiles). */
ALWAYS_INLINE void tile_qi(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum, const Matrix* W,
                           const float* ws, int r, int t, int RT, int TT, const char* next) {
    const int C = W->cols, R = W->rows, gs = W->group_size, G = C / gs;
    const size_t gb = (size_t)gs;
    const size_t next_bytes = quant_block_bytes(W->type, C, gs), next_step = (next_bytes + (size_t)G - 1) / (size_t)G;
    __m256 tot[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) tot[i] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        const size_t next_at = (size_t)g * next_step; /* the next block's g-th slice */
        if (next && next_at < next_bytes)
            prefetch_next_rows(next + next_at, next_bytes - next_at < next_step ? next_bytes - next_at : next_step);
        const uint8_t* wg = quant_group(W, r, g); /* row r + i at wg + i * gb */
        __m256i acc[4][4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i a0 = j < TT ? qi_acc0(xsum + ((size_t)(t + j) * G + g) * 8) : _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) acc[i][j] = i < RT ? a0 : _mm256_setzero_si256();
        }
        for (int c = 0; c < gs; c += 32) {
            QW wv[4];
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) wv[i] = qi_load(wg + (size_t)i * gb, c);
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) {
                const int8_t* xj = xq + (size_t)(t + j) * C + (size_t)g * gs;
                __m256i xv = _mm256_loadu_si256((const __m256i*)(xj + c));
#pragma GCC unroll 4
                for (int i = 0; i < RT; i++) acc[i][j] = qi_dot(acc[i][j], wv[i], xv);
            }
        }
        if (TT == 4) {
            const __m128 x4 = _mm_setr_ps(xsc[(size_t)t * G + g], xsc[(size_t)(t + 1) * G + g],
                                          xsc[(size_t)(t + 2) * G + g], xsc[(size_t)(t + 3) * G + g]);
            const __m256 xs = _mm256_set_m128(x4, x4);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                const __m256i s = sum_halves4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
                tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(_mm256_set1_ps(ws[(size_t)i * G + g]), xs), tot[i]);
            }
        } else {
            const __m256 xs = _mm256_set1_ps(xsc[(size_t)t * G + g]);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++)
                tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][0]), _mm256_mul_ps(_mm256_set1_ps(ws[(size_t)i * G + g]), xs), tot[i]);
        }
    }
    if (TT == 4) {
        float o[4];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) {
            _mm_storeu_ps(o, _mm_add_ps(_mm256_castps256_ps128(tot[i]), _mm256_extractf128_ps(tot[i], 1)));
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) out[(size_t)(t + j) * R + r + i] = o[j];
        }
    } else {
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) out[(size_t)t * R + r + i] = hsum256(tot[i]);
    }
}

/* One 32-column step of rows_qi_n1: the activation vector shared by the four rows of a block,
 * row i's group at wg + i * gb. */
ALWAYS_INLINE void qi_step4(__m256i a[4], const uint8_t* wg, size_t gb, int c, __m256i xv) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) a[i] = qi_dot(a[i], qi_load(wg + (size_t)i * gb, c), xv);
}

#if defined(KERNELS_AVX512) && defined(Q8_VNNI)
#define Q8_ZMM 1
/* A group of 64 of the four rows of a block on 512-bit vectors (decode, with VNNI): each row's
 * 64 weights meet the 64 activations in one vpdpbusd, whose lanes k and k + 8 (columns 4k .. 4k+3
 * and 32 + 4k .. 32 + 4k + 3) are then added: the same 8 int32 lanes, bit for bit, as qi_step4's
 * two 32-column steps, so the result does not depend on the build. a0: the group's lane
 * corrections (qi_acc0). On Zen 4 (AVX-512 on 256-bit units), decode tg128 of the 0.6B shape with
 * one thread, three alternating rounds: 35.0-37.5 -> 37.0-40.1 tok/s (seventeenth session). */
ALWAYS_INLINE void qi_group4_zmm(__m256i a[4], const uint8_t* wg, const int8_t* xg, __m256i a0) {
    const __m512i x = _mm512_loadu_si512((const void*)xg), start = _mm512_zextsi256_si512(a0);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m512i w = _mm512_xor_si512(_mm512_loadu_si512((const void*)(wg + (size_t)i * 64)),
                                           _mm512_set1_epi8((char)0x80));
        __m512i acc = start;
        __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x)); /* as dpbusd, on zmm */
        a[i] = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
    }
}
#endif

/* q8 matrix-vector product (decode): one row block at a time, front to back (its scales,
 * then per group the four rows' values), so the weights are one sequential stream; each group
 * step asks for the bytes pf ahead (choose_prefetch). Against the q8 layout before (all int8
 * rows, then all scales: two streams), with this kernel's shape, one thread on a 264 MB matrix:
 * 20.7 -> 34.5 GB/s, where a plain streaming read gave 31.6 (docs/notes-kernels.md). Each group's
 * four scales are (weight scale x activation scale), multiplied 8 groups at a time into sx, and
 * gs is a constant where rows_qi_n1 knows it, so the rows' addresses are one pointer plus fixed
 * offsets: on Zen 4 that took the q8 kernel from 37 to 58 GB/s on a matrix in L2 (eleventh
 * session), more room for the loads to run ahead of the arithmetic. */
ALWAYS_INLINE void rows_qi_n1_gs(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum, const Matrix* W,
                                 int r0, int r1, const int gs) {
    const int C = W->cols, G = C / gs;
    const size_t bb = quant_block_bytes(WEIGHT_Q8, C, gs), gb = (size_t)gs;
    const size_t pf = decode_prefetch.q8 ? (size_t)decode_prefetch.q8 : bb;
    int r = r0; /* a multiple of 4: run_job's chunks are */
    for (; r + 4 <= r1; r += 4) {
        const uint16_t* s0 = quant_scales(W, r);
        const uint8_t* wg = quant_group(W, r, 0);
        for (int o = 0; o < (int)(4 * sizeof(uint16_t)) * G; o += 64) _mm_prefetch((const char*)s0 + pf + o, _MM_HINT_T0);
        __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
        for (int g0 = 0; g0 < G; g0 += 8) {
            const int ng = G - g0 < 8 ? G - g0 : 8;
            float sx[4][8]; /* [row][group g0 + k]: weight scale x activation scale */
            if (ng == 8) {
                const __m256 xs8 = _mm256_loadu_ps(xsc + g0);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    _mm256_storeu_ps(sx[i], _mm256_mul_ps(scales8(s0 + (size_t)i * G + g0), xs8));
            } else {
                for (int i = 0; i < 4; i++)
                    for (int k = 0; k < ng; k++) sx[i][k] = scale1(s0[(size_t)i * G + g0 + k]) * xsc[g0 + k];
            }
            for (int k = 0; k < ng; k++, wg += 4 * gb) {
                const int g = g0 + k;
                for (int o = 0; o < (int)(4 * gb); o += 64) _mm_prefetch((const char*)wg + pf + o, _MM_HINT_T0);
                __m256i a[4];
                const int8_t* xg = xq + (size_t)g * gs;
#if defined(Q8_ZMM)
                if (gs == 64) {
                    qi_group4_zmm(a, wg, xg, qi_acc0(xsum + (size_t)g * 8));
                } else
#endif
                {
                    a[0] = a[1] = a[2] = a[3] = qi_acc0(xsum + (size_t)g * 8);
#pragma GCC unroll 4
                    for (int c = 0; c < gs; c += 32)
                        qi_step4(a, wg, gb, c, _mm256_loadu_si256((const __m256i*)(xg + c)));
                }
                t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[0]), _mm256_set1_ps(sx[0][k]), t0);
                t1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[1]), _mm256_set1_ps(sx[1][k]), t1);
                t2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[2]), _mm256_set1_ps(sx[2][k]), t2);
                t3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[3]), _mm256_set1_ps(sx[3][k]), t3);
            }
        }
        out[r] = hsum256(t0);
        out[r + 1] = hsum256(t1);
        out[r + 2] = hsum256(t2);
        out[r + 3] = hsum256(t3);
    }
    for (; r < r1; r++) {
        float* ws = thread_xp();
        q8_scales_float(ws, W, r, 1);
        tile_qi(out, xq, xsc, xsum, W, ws, r, 0, 1, 1, NULL);
    }
}

/* export.py's q8 default, 64, as a constant; any other group size as it comes. */
ALWAYS_INLINE void rows_qi_n1(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum, const Matrix* W,
                              int r0, int r1) {
    if (W->group_size == 64) rows_qi_n1_gs(out, xq, xsc, xsum, W, r0, r1, 64);
    else rows_qi_n1_gs(out, xq, xsc, xsum, W, r0, r1, W->group_size);
}

/* q8 prefill from packed panels, as q4's row lanes: a panel holds 8 rows with each 32-bit lane
 * one row's 4 values of columns c .. c+3, so a token's 4 activations of those columns, broadcast
 * to every lane, meet all 8 rows in one qi_dot (sign, maddubs, madd, add), and each group ends
 * with one int32 sum per row (lane) and token: no horizontal step. tile_qi (rows side by side, 32
 * columns per lane) reduces its lanes with vphaddd at each group's end, and its 2 x 4 tile
 * reloads each token's activations for every pair of rows; here a group's end is a convert,
 * multiply and fma per 8 outputs. -march=x86-64-v3 on the Intel VM, q8 pp512: one thread 77 ->
 * 109-110 tok/s, two 143-145 -> 206-208 (docs/notes-kernels.md, "Twenty-sixth session").
 * With VNNI, qi_dot is one vpdpbusd of w + 128 by x, which adds 128 times the token's 4
 * activations to every lane; so each lane starts the group at -128 times the token's sum over
 * the group (16 x quantize_rows' xgsum, which is -8 times it) and ends at the same int32.
 * That sum is tile_qi's exact int32, scaled once per group as AMX does (float(s) x weight scale,
 * then x activation scale, fused into the total). Panels are packed per chunk (<= 64 rows) into
 * the thread's float-panel scratch. */
#define Q8_PANEL_ROWS 8
#if defined(__AVX512F__)
#define Q8_PANEL_TOKENS 8
#else
#define Q8_PANEL_TOKENS 4
#endif

/* Whether rows_qi_t packs q8 panels for n tokens (run_job aligns its chunks to 8 rows when so).
 * Packing pays once tile_qi's passes over the chunk cost more than it: with AVX2's sign trick
 * from 20 tokens, with VNNI, where tile_qi is quicker, from 40 (one thread, tok/s, panels
 * against tile_qi with its prefetch of the next block; x86-64-v3: pp12 62 / 68-70, pp16 69 / 74,
 * pp18 73-74 / 69-74, pp20 79 / 71-77, pp24 81-83 / 77-78; native without AMX: pp24 120-129 /
 * 143-147, pp32 139-147 / 144-153, pp40 152-158 / 153-155, pp48 158-161 / 153-157;
 * twenty-seventh session). */
#if defined(Q8_VNNI)
#define Q8_PANEL_MIN_TOKENS 40
#else
#define Q8_PANEL_MIN_TOKENS 20
#endif
static int q8_packed_takes(const Matrix* W, int n) {
    return W->type == WEIGHT_Q8 && n >= Q8_PANEL_MIN_TOKENS && W->cols <= xp_cap;
}

/* Rows [r, r + 8) as a panel: columns c .. c+3 (c a multiple of 4) at panel + 8 * c, lane i row
 * r + i's; row r + i's scale of group g as a float at ps[8 * g + i]. */
static void q8_pack_panel(int8_t* panel, float* ps, const Matrix* W, int r) {
    const int gs = W->group_size, G = W->cols / gs;
    for (int g = 0; g < G; g++) {
        for (int c = 0; c < gs; c += 32) {
            __m256 v[8];
            for (int i = 0; i < 8; i++)
                v[i] = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i*)(quant_group(W, r + i, g) + c)));
            transpose8_ps(v);
            for (int k = 0; k < 8; k++)
                _mm256_storeu_si256((__m256i*)(panel + (size_t)8 * ((size_t)g * gs + c + 4 * k)), _mm256_castps_si256(v[k]));
        }
        for (int i = 0; i < 8; i++) ps[(size_t)8 * g + i] = scale1(quant_scales(W, r + i)[g]);
    }
}

/* out rows [r, r + 8) x tokens t .. t+TT-1 (TT <= Q8_PANEL_TOKENS: 8 where there are 32 vector
 * registers, 4 in AVX2's 16) from one panel. */
ALWAYS_INLINE void tile_q8_packed(float* out, const int8_t* xq, const float* xsc, const int32_t* xgsum,
                                  const int8_t* panel, const float* ps, const Matrix* W, int r, int t, int TT) {
    const int C = W->cols, R = W->rows, gs = W->group_size, G = C / gs;
    __m256 tot[Q8_PANEL_TOKENS];
#pragma GCC unroll 8
    for (int j = 0; j < TT; j++) tot[j] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        const uint8_t* pg = (const uint8_t*)panel + (size_t)8 * g * gs;
        const int8_t* xg = xq + (size_t)t * C + (size_t)g * gs;
        __m256i s[Q8_PANEL_TOKENS];
#pragma GCC unroll 8
#if defined(Q8_VNNI)
        for (int j = 0; j < TT; j++) s[j] = _mm256_set1_epi32(16 * xgsum[(size_t)(t + j) * G + g]);
#else
        for (int j = 0; j < TT; j++) s[j] = _mm256_setzero_si256();
        (void)xgsum;
#endif
        for (int c = 0; c < gs; c += 4) {
            const QW wv = qi_load(pg, 8 * c);
#pragma GCC unroll 8
            for (int j = 0; j < TT; j++) {
                int32_t x4; /* token j's columns c .. c+3 */
                memcpy(&x4, xg + (size_t)j * C + c, sizeof x4);
                s[j] = qi_dot(s[j], wv, _mm256_set1_epi32(x4));
            }
        }
        const __m256 wsv = _mm256_loadu_ps(ps + (size_t)8 * g);
#pragma GCC unroll 8
        for (int j = 0; j < TT; j++)
            tot[j] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[j]), wsv),
                                     _mm256_set1_ps(xsc[(size_t)(t + j) * G + g]), tot[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < TT; j++) _mm256_storeu_ps(out + (size_t)(t + j) * R + r, tot[j]);
}

/* Whole panels of 8 rows from r0 (a multiple of 8: run_job's chunks are) x tokens [ta, n), at
 * most 64 rows per packing; per block of tokens (token_block) each panel meets the block's tokens
 * Q8_PANEL_TOKENS at a time, then 4, then 1. Returns the first row not done (the rest:
 * rows_qi_tiles). */
static int rows_q8_packed(float* out, const int8_t* xq, const float* xsc, const int32_t* xgsum, const Matrix* W,
                          int ta, int n, int r0, int r1) {
    const int C = W->cols, G = C / W->group_size;
    const int max_panels = FLOAT_MAX_PANELS * FLOAT_PANEL_ROWS / Q8_PANEL_ROWS;
    int8_t* panels = (int8_t*)(void*)thread_float_pack(); /* max_panels * 8 * C bytes, then the scales */
    float* ps = (float*)(void*)(panels + (size_t)max_panels * Q8_PANEL_ROWS * C);
    const int tb = token_block((size_t)C);
    while (r1 - r0 >= Q8_PANEL_ROWS) {
        const int np = (r1 - r0) / Q8_PANEL_ROWS < max_panels ? (r1 - r0) / Q8_PANEL_ROWS : max_panels;
        for (int p = 0; p < np; p++)
            q8_pack_panel(panels + (size_t)p * Q8_PANEL_ROWS * C, ps + (size_t)p * Q8_PANEL_ROWS * G, W,
                          r0 + Q8_PANEL_ROWS * p);
        for (int t0 = ta; t0 < n; t0 += tb) {
            const int t1 = t0 + tb < n ? t0 + tb : n;
            for (int p = 0; p < np; p++) {
                const int8_t* pp = panels + (size_t)p * Q8_PANEL_ROWS * C;
                const float* pps = ps + (size_t)p * Q8_PANEL_ROWS * G;
                const int r = r0 + Q8_PANEL_ROWS * p;
                int t = t0;
                for (; t + Q8_PANEL_TOKENS <= t1; t += Q8_PANEL_TOKENS)
                    tile_q8_packed(out, xq, xsc, xgsum, pp, pps, W, r, t, Q8_PANEL_TOKENS);
                for (; t + 4 <= t1; t += 4) tile_q8_packed(out, xq, xsc, xgsum, pp, pps, W, r, t, 4);
                for (; t < t1; t++) tile_q8_packed(out, xq, xsc, xgsum, pp, pps, W, r, t, 1);
            }
        }
        r0 += Q8_PANEL_ROWS * np;
    }
    return r0;
}

#if defined(KERNELS_AMX)
/* q8 and q4 prefill on AMX (Intel Sapphire Rapids and later: eight tile registers of up to 16 rows
 * x 64 bytes, and TDPBSSD, which adds the products of a 16 x K int8 tile A and a K x 16 int8 tile
 * B into a 16 x 16 int32 tile C: 16 x 16 x K products in one instruction). K is one group's
 * columns (q4: 32), or 64 of them (q8, whose groups are a multiple of 64: S = gs / 64 products
 * per group). A is 16 tokens' quantised activations of those columns, read straight from xq (row
 * stride C). B must hold the weights "VNNI-packed": its row k holds, for each of 16 output rows,
 * that row's columns 4k .. 4k+3. So each chunk of rows is first repacked once into the thread's
 * scratch (amx_pack: q8's 16 x 16 four-byte words of a group transposed; q4's row lanes are that
 * layout already, two 8-row blocks side by side, the nibbles widened to q = nibble - 8), with the
 * 16 rows' scales of each group as floats, and then every tile of 16 tokens meets it.
 * Each C is the exact int32 sum of one (token, row, group), as the VNNI kernels get it; the
 * group's scales turn it into fp32 (acc += float(C) x w_scale x x_scale: one sum per group, then
 * its scales, where tile_qi keeps two halves of 4 lanes per group, so their fp32 results differ
 * by rounding), because each group has its own two scales. Storing C and that step (16 x 3 vector
 * instructions per tile), not the product, are the bound (amx_rows). A TDPBSSD with 16-row tiles
 * took ~4.4 ns, with 4-row tiles ~2.7 ns (twenty-third session's VM), which is why the tokens,
 * not the weights' 4-row blocks, are the 16 rows of A. Tiles of 16 tokens x 16 rows, and a last
 * tile of the n % 16 tokens left (amx_rows); a chunk's rows after its last 16 take the q8 panels
 * or tile_qi (q4: tile_q4), which scale each group as amx_rows does. */
#define AMX_ROWS 16 /* output rows per B tile, tokens per A tile */

/* int8 columns per tile product: a q4 group, or 64 of a q8 group. */
static inline int amx_k(const Matrix* W) { return W->type == WEIGHT_Q4 ? Q4_GROUP : 64; }

/* Whether W x n tokens run on AMX (run_job aligns its row chunks to 16 when so). The repacking
 * pays from 13 tokens for q8 and from 32 for q4, whose nibbles it widens (0.6B shape, one thread,
 * tok/s on AMX against tile_qi / tile_q4 with their prefetch of the next block: q8 pp10 100-104
 * / 105-107, pp12 117-120 / 117-125, pp13 126-130 / 117-122, pp14 130-138 / 113-123, pp16 152 /
 * 129-132; q4 pp28 219 on tile_q4, pp32 216-217 / 208-211, pp40 226-242 / 205-211;
 * twenty-seventh session). */
static int amx_takes(const Matrix* W, int n) {
    return amx_usable && (W->type == WEIGHT_Q4 ? n >= 32 : W->type == WEIGHT_Q8 && W->group_size % 64 == 0 && n >= 13) &&
           W->cols <= xp_cap;
}

#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux (5.16+) hands out the tile data state on request */
#define XFEATURE_XTILEDATA 18

/* The kernel's permission for this process to use the tile registers, asked once;
 * KERNELS_AMX=0 turns AMX off (for measuring and testing the path without it). */
static int amx_request(void) {
    const char* e = getenv("KERNELS_AMX");
    if (e && strcmp(e, "0") == 0) return 0;
    if (e && *e && strcmp(e, "1") != 0)
        fprintf(stderr, "warning: KERNELS_AMX=%s is not 0 or 1; AMX stays on where the CPU has it\n", e);
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* Palette 1: tiles 0-1 A (T tokens x K bytes), 2-3 B (K / 4 rows x 64 bytes), 4-7 C (T x 16
 * int32); T = 16 but for a prompt's last n % 16 tokens. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AmxConfig;

static void amx_configure(int K, int T) {
    AmxConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t == 2 || t == 3 ? (uint8_t)(K / 4) : (uint8_t)T;
        cfg.colsb[t] = t < 2 ? (uint16_t)K : 64;
    }
    /* gcc 12 does not see that ldtilecfg reads cfg: out of line (two callers) it dropped the loop's
     * stores as dead, and the tiles came up unconfigured (SIGILL at the first tile instruction) */
    __asm__ volatile("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* Rows [r0, r0 + 16 * ntiles) repacked for amx_rows: B tile (i, g, s) (row tile i, group g,
 * product s of the group) at wt + ((i * G + g) * S + s) * 16 * K; the 16 rows' scales of group g
 * as floats at ws + (i * G + g) * 16. */
static void amx_pack(uint8_t* wt, float* ws, const Matrix* W, int r0, int ntiles) {
    const int gs = W->group_size, G = W->cols / gs, K = amx_k(W), S = gs / K;
    for (int i = 0; i < ntiles; i++) {
        const int r = r0 + i * AMX_ROWS;
        for (int g = 0; g < G; g++) {
            float* wsg = ws + (size_t)(i * G + g) * AMX_ROWS;
            if (W->type == WEIGHT_Q4) { /* B rows v and 4 + v: the low and the high nibbles of quarter v of both blocks */
                const __m512i m = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8);
                const uint8_t* b0 = q4_group(W, r, g);
                const uint8_t* b1 = q4_group(W, r + Q4_BLOCK_ROWS, g);
                uint8_t* dst = wt + (size_t)(i * G + g) * 16 * K;
                for (int v = 0; v < 4; v++) {
                    const size_t q = Q4_BLOCK_ROWS * sizeof(uint16_t) + 32 * (size_t)v;
                    const __m512i x = _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(b0 + q))),
                        _mm256_loadu_si256((const __m256i*)(b1 + q)), 1);
                    _mm512_storeu_si512((void*)(dst + 64 * v), _mm512_sub_epi8(_mm512_and_si512(x, m), eight));
                    _mm512_storeu_si512((void*)(dst + 64 * (4 + v)),
                                        _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(x, 4), m), eight));
                }
                for (int n = 0; n < AMX_ROWS; n++) wsg[n] = q4_scale(W, r + n, g);
                continue;
            }
            for (int s = 0; s < S; s++) {
                __m512i v[16];
                for (int n = 0; n < AMX_ROWS; n++)
                    v[n] = _mm512_loadu_si512((const void*)(quant_group(W, r + n, g) + s * K));
                transpose16_epi32(v);
                uint8_t* dst = wt + ((size_t)(i * G + g) * S + s) * 16 * K;
                for (int k = 0; k < 16; k++) _mm512_storeu_si512((void*)(dst + 64 * k), v[k]);
            }
            for (int n = 0; n < AMX_ROWS; n++) wsg[n] = scale1(quant_scales(W, r + n)[g]);
        }
    }
}

/* One C tile: the products of a group's S sub-tiles (A from the tokens' activations, row stride
 * C; B from the repacked weights), stored to c. Tile numbers must be constants: the instructions
 * have no register operand for them. */
#define AMX_GROUP(TA, TB, TC, a, b, S, K, stride, c)                            \
    do {                                                                        \
        _tile_zero(TC);                                                         \
        for (int s_ = 0; s_ < (S); s_++) {                                      \
            _tile_loadd(TA, (a) + s_ * (K), (stride));                          \
            _tile_loadd(TB, (b) + (size_t)s_ * 16 * (K), 64);                   \
            _tile_dpbssd(TC, TA, TB);                                           \
        }                                                                       \
        _tile_stored(TC, (c), 64);                                              \
    } while (0)

/* out[t][r] for tokens t < T of one tile and its 16 rows r (row stride R) from the group tiles in
 * cbuf: acc[j], token j's 16 rows, += float(C row j) x the rows' weight scales x token j's scale.
 * T is AMX_ROWS but for a prompt's last tile. */
ALWAYS_INLINE void amx_scale_tile(float* o, const int32_t* cbuf, const float* wsi, const float* xs, int G, int R,
                                  int T) {
    __m512 acc[AMX_ROWS];
#pragma GCC unroll 16
    for (int j = 0; j < AMX_ROWS; j++) acc[j] = _mm512_setzero_ps(); /* all 16: gcc warned of acc[T..] */
    for (int g = 0; g < G; g++) {
        const int32_t* c = cbuf + (size_t)g * 256;
        const __m512 wsv = _mm512_loadu_ps(wsi + (size_t)g * AMX_ROWS);
#pragma GCC unroll 16
        for (int j = 0; j < T; j++) {
            const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void*)(c + 16 * j))), wsv);
            acc[j] = _mm512_fmadd_ps(p, _mm512_set1_ps(xs[(size_t)j * G + g]), acc[j]);
        }
    }
#pragma GCC unroll 16
    for (int j = 0; j < T; j++) _mm512_storeu_ps(o + (size_t)j * R, acc[j]);
}

/* Tokens [0, n) x rows [r0, r0 + 16 * ntiles) of out, from the repacked wt, ws. Per tile of 16
 * tokens x 16 rows, first every group's int32 tile into cbuf (G x 1 KB; four C tiles in turn, so
 * that a product does not wait for the store of the one before), then the scaling in plain
 * AVX-512 with the 16 accumulators in registers (between tile instructions, which gcc writes as
 * asm with a memory clobber, it kept them on the stack). pp512 of the 0.6B shape, q8, one thread:
 * 379 -> 395 tok/s against scaling each group's tile between the products. The stores cost: with
 * them left out (wrong results, for timing) 475, with the scaling also left out 540. Two token
 * tiles x two row tiles per step (each tile loaded serves two products) was slower: 375-379.
 * The last n % 16 tokens take a tile of their own, with A and C configured to that many rows
 * (the instructions then read and write only those): the same products and the same scaling, so
 * every token's result has the same bits as in a full tile, and as the q8 panels' and tile_q4's
 * (which scale a group's exact int32 sum the same way). */
static void amx_rows(float* out, const int8_t* xq, const float* xsc, const Matrix* W, const uint8_t* wt,
                     const float* ws, int32_t* cbuf, int n, int r0, int ntiles) {
    const int C = W->cols, R = W->rows, gs = W->group_size, G = C / gs, K = amx_k(W), S = gs / K;
    const size_t gb = (size_t)S * 16 * K; /* repacked bytes per group */
    __asm__ volatile("" ::: "memory");    /* amx_pack's stores before the tile loads read them */
    amx_configure(K, AMX_ROWS);
    for (int t = 0; t < n; t += AMX_ROWS) {
        const int T = n - t < AMX_ROWS ? n - t : AMX_ROWS;
        if (T < AMX_ROWS) amx_configure(K, T);
        const int8_t* xt = xq + (size_t)t * C;
        const float* xs = xsc + (size_t)t * G;
        for (int i = 0; i < ntiles; i++) {
            const uint8_t* wi = wt + (size_t)i * G * gb;
            int g = 0;
            for (; g + 4 <= G; g += 4) {
                AMX_GROUP(0, 2, 4, xt + (size_t)g * gs, wi + g * gb, S, K, C, cbuf + (size_t)g * 256);
                AMX_GROUP(1, 3, 5, xt + (size_t)(g + 1) * gs, wi + (g + 1) * gb, S, K, C, cbuf + (size_t)(g + 1) * 256);
                AMX_GROUP(0, 2, 6, xt + (size_t)(g + 2) * gs, wi + (g + 2) * gb, S, K, C, cbuf + (size_t)(g + 2) * 256);
                AMX_GROUP(1, 3, 7, xt + (size_t)(g + 3) * gs, wi + (g + 3) * gb, S, K, C, cbuf + (size_t)(g + 3) * 256);
            }
            for (; g < G; g++) AMX_GROUP(0, 2, 4, xt + (size_t)g * gs, wi + g * gb, S, K, C, cbuf + (size_t)g * 256);
            float* o = out + (size_t)t * R + r0 + i * AMX_ROWS;
            const float* wsi = ws + (size_t)i * G * AMX_ROWS;
            if (T == AMX_ROWS) amx_scale_tile(o, cbuf, wsi, xs, G, R, AMX_ROWS); /* a constant: registers */
            else amx_scale_tile(o, cbuf, wsi, xs, G, R, T);
        }
    }
    _tile_release();
}

/* Whole tiles of 16 rows (from r0, a multiple of 16: run_job's chunks are) x all n tokens on AMX,
 * in pieces of at most AMX_MAX_TILES row tiles (the thread's scratch). Returns the first row not
 * done; the caller does the rest (fewer than 16 rows). */
static int amx_chunk(float* out, const int8_t* xq, const float* xsc, const Matrix* W, int n, int r0, int r1) {
    int r = r0;
    for (int tiles; (tiles = row_tiles_next(r, r1, AMX_MAX_TILES)) > 0; r += tiles * AMX_ROWS) {
        amx_pack(thread_amx_wt(), thread_amx_ws(), W, r, tiles);
        amx_rows(out, xq, xsc, W, thread_amx_wt(), thread_amx_ws(), thread_amx_c(), n, r, tiles);
    }
    return r;
}
#endif /* KERNELS_AMX */

/* q4 (kernels.h's row lanes, groups of 32): a kernel of its own for decode and prefill. A block
 * of 8 rows stores each group as 8 scales and four 32-byte quarters; in quarter v the 32-bit
 * lane i holds row i's columns 4v .. 4v+3 in its low nibbles and 16+4v .. 16+4v+3 in its high
 * ones. So masking (low) or shifting and masking (high) gives 8 rows x 4 columns, and the
 * token's 4 activations of those columns, broadcast to every lane, meet them in one vpmaddubsw
 * (or vpdpbusd): the products of a group end with one row per lane, and no horizontal step is
 * left (the 4-row layout before needed three per 4 groups and spilled registers in gcc's build).
 * In L2 (1024 columns, one thread, Zen 3): 24.4 GB/s in the 4-row layout, 36.0 in this one;
 * from memory (a 252 MB matrix) 14.2-14.7 against 18.5-19.1 GB/s, where a streaming read of the
 * same buffer gave 18.3-18.9 (docs/notes-kernels.md, "Sixteenth session"). */

/* s[j] += the 8 rows' sums over one group of (q + 8) x for tokens j < TT, lane i = row i.
 * w: the group's 128 bytes of values; x + j * C: token j's 32 activations of the group. Without
 * VNNI the sums stay int16 until the group's end: a lane of vpmaddubsw is at most
 * 2 * 15 * 128 = 3840 in magnitude, the 8 of a group 30720 < 32768. Both paths give the same
 * int32. */
ALWAYS_INLINE void q4_group_sums(__m256i s[], const uint8_t* w, const int8_t* x, size_t C, int TT) {
    const __m256i m = _mm256_set1_epi8(15);
#if !defined(Q8_VNNI)
    __m256i s16[4];
#pragma GCC unroll 4
    for (int j = 0; j < TT; j++) s16[j] = _mm256_setzero_si256();
#endif
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m256i b = _mm256_loadu_si256((const __m256i*)(w + 32 * v));
        const __m256i lo = _mm256_and_si256(b, m), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) {
            int32_t xl, xh; /* columns 4v .. 4v+3 and 16+4v .. 16+4v+3 */
            memcpy(&xl, x + j * C + 4 * v, 4);
            memcpy(&xh, x + j * C + 16 + 4 * v, 4);
#if defined(Q8_VNNI)
            s[j] = dpbusd(dpbusd(s[j], lo, _mm256_set1_epi32(xl)), hi, _mm256_set1_epi32(xh));
#else
            s16[j] = _mm256_add_epi16(s16[j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
            s16[j] = _mm256_add_epi16(s16[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
#endif
        }
    }
#if !defined(Q8_VNNI)
#pragma GCC unroll 4
    for (int j = 0; j < TT; j++) s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(s16[j], _mm256_set1_epi16(1)));
#endif
}

#if defined(Q8_ZMM)
/* q4_group_sums for one token on 512-bit vectors (decode, with VNNI): each 64-byte load is two
 * quarters of the group, v and v + 1 (lanes 0-7 and 8-15), whose activations (the group's 4-byte
 * pieces v and v + 1 for the low nibbles, 4 + v and 5 + v for the high ones) one vpermd spreads
 * over the two halves; at the end the halves are added, row i in lane i. Integer sums, so the same
 * int32 as q4_group_sums, bit for bit. Half the instructions per group; on Zen 4, decode tg128 of
 * the 0.6B shape, one thread, six alternating pairs: 83.0-84.4 -> 84.6-86.1 tok/s (two threads
 * level, at 95-97% of the roof; twenty-first session). */
ALWAYS_INLINE void q4_group_sums1_zmm(__m256i s[1], const uint8_t* w, const int8_t* x) {
    const __m512i m = _mm512_set1_epi8(15);
    const __m512i xv = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)x));
    const __m512i i01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i two = _mm512_set1_epi32(2), four = _mm512_set1_epi32(4);
    __m512i acc = _mm512_zextsi256_si512(s[0]);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* quarters 2h and 2h + 1 */
        const __m512i b = _mm512_loadu_si512((const void*)(w + 64 * h));
        const __m512i lo = _mm512_and_si512(b, m), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m);
        const __m512i il = h ? _mm512_add_epi32(i01, two) : i01;
        const __m512i xl = _mm512_permutexvar_epi32(il, xv), xh = _mm512_permutexvar_epi32(_mm512_add_epi32(il, four), xv);
        __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(lo), "v"(xl)); /* as dpbusd, on zmm */
        __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(hi), "v"(xh));
    }
    s[0] = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
}
#endif

/* The block of rows r .. r+7 (computed whole: the last block is padded with zero rows; rows past
 * R are not stored) x tokens t .. t+TT-1 (TT <= 4). Per group and token: the sums of (q + 8) x,
 * corrected to q x with xgsum (-8 times the group's sum of x, quantize_rows), converted, and
 * scaled into fp32 totals, one row per lane, as AMX scales its tiles (float(s) x the 8 rows'
 * weight scales, then fused with x the activation scale), so q4 prefill has the same bits with
 * AMX on and off. pf: bytes ahead to prefetch as the block is read, 0 for none; into L2 where l2
 * (a constant: the hint is part of the instruction), else into L1. */
ALWAYS_INLINE void tile_q4(float* out, const int8_t* xq, const float* xsc, const int32_t* xgsum, const Matrix* W, int r,
                           int t, int TT, int pf, const int l2) {
    const int C = W->cols, R = W->rows, G = C / Q4_GROUP;
    const uint8_t* b = q4_group(W, r, 0);
    __m256 tot[4];
#pragma GCC unroll 4
    for (int j = 0; j < TT; j++) tot[j] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++, b += Q4_GROUP_BYTES) {
        if (pf && !(g & 1)) /* two groups: 288 bytes, 4.5 lines (unrolled: gcc kept a loop) */
#pragma GCC unroll 5
            for (int o = 0; o < 2 * (int)Q4_GROUP_BYTES; o += 64) {
                if (l2) _mm_prefetch((const char*)b + pf + o, _MM_HINT_T1);
                else _mm_prefetch((const char*)b + pf + o, _MM_HINT_T0);
            }
        __m256i s[4];
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) s[j] = _mm256_set1_epi32(xgsum[(size_t)(t + j) * G + g]);
#if defined(Q8_ZMM)
        if (TT == 1)
            q4_group_sums1_zmm(s, b + Q4_BLOCK_ROWS * sizeof(uint16_t), xq + ((size_t)t * G + g) * Q4_GROUP);
        else
#endif
            q4_group_sums(s, b + Q4_BLOCK_ROWS * sizeof(uint16_t), xq + ((size_t)t * G + g) * Q4_GROUP, (size_t)C,
                          TT);
        const __m256 ws = scales8(b); /* the group's 8 rows' scales */
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++)
            tot[j] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[j]), ws),
                                     _mm256_set1_ps(xsc[(size_t)(t + j) * G + g]), tot[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < TT; j++) {
        if (r + Q4_BLOCK_ROWS <= R) {
            _mm256_storeu_ps(out + (size_t)(t + j) * R + r, tot[j]);
        } else {
            float o[8];
            _mm256_storeu_ps(o, tot[j]);
            for (int i = 0; r + i < R; i++) out[(size_t)(t + j) * R + r + i] = o[i];
        }
    }
}

/* Rows [r0, r1) (r0 a multiple of 8: run_job's chunks are) for n tokens: decode walks the row
 * blocks with the prefetch; prefill keeps a block of tokens in L2 (as rows_qi_t) while each row
 * block of the chunk meets them 4 at a time; with AMX, whole tiles of 16 rows take it (amx_chunk). */
static void rows_q4(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum,
                    const int32_t* xgsum, const Matrix* W, int n, int r0, int r1) {
    (void)xsum;
    if (n == 1) {
        const int pf = decode_prefetch.q4;
        if (decode_prefetch.q4_l2 && kernels_alone())
            for (int r = r0; r < r1; r += Q4_BLOCK_ROWS) tile_q4(out, xq, xsc, xgsum, W, r, 0, 1, pf, 1);
        else
            for (int r = r0; r < r1; r += Q4_BLOCK_ROWS) tile_q4(out, xq, xsc, xgsum, W, r, 0, 1, pf, 0);
        return;
    }
    int ra = r0; /* AMX did every token of rows [r0, ra) */
#if defined(KERNELS_AMX)
    if (amx_takes(W, n)) ra = amx_chunk(out, xq, xsc, W, n, r0, r1);
#endif
    const int tb = token_block((size_t)W->cols);
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        for (int r = ra; r < r1; r += Q4_BLOCK_ROWS) {
            /* the first tile over this block prefetches the next one, a block ahead (as
             * rows_float_nn; x86-64-v3, one thread: pp8 94-95 -> 115-120 tok/s) */
            int pf = t0 == 0 && r + Q4_BLOCK_ROWS < W->rows ? (W->cols / Q4_GROUP) * (int)Q4_GROUP_BYTES : 0;
            int t = t0;
            for (; t + 4 <= t1; t += 4, pf = 0) tile_q4(out, xq, xsc, xgsum, W, r, t, 4, pf, 0);
            for (; t < t1; t++, pf = 0) tile_q4(out, xq, xsc, xgsum, W, r, t, 1, pf, 0);
        }
    }
}

#elif defined(KERNELS_NEON)

#define TILE_TOKENS 4 /* 32 NEON registers: 16 accumulators + 8 weights + 2 activations */
#define Q8_TILE_TOKENS 4
#define Q8_TILE_ROWS 4

/* The arm64 twins follow the AVX2 ones in shape (same tiles, same token blocking, same q8
 * scheme) at half the vector width. They were checked for correctness under qemu-aarch64 only:
 * no tuning or prefetch distances were chosen here, because none could be measured (no arm64
 * hardware; docs/notes-kernels.md). */

/* A float16 scale (q8) as a float: fcvtl, as the q4 kernel's vcvt_f32_f16. */
ALWAYS_INLINE float scale1(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* q8: the G scales of rows r .. r+RT-1 (one row block) as floats, row r + i's at out + i * G (as
 * the AVX2 twin's, for the shared rows_qi_t). */
ALWAYS_INLINE void q8_scales_float(float* out, const Matrix* W, int r, int RT) {
    const int G = W->cols / W->group_size;
    const uint16_t* sc = quant_scales(W, r);
    for (int i = 0; i < RT; i++)
        for (int g = 0; g < G; g++) out[(size_t)i * G + g] = scale1(sc[(size_t)i * G + g]);
}

/* Eight weights of one row as two fp32 vectors. bf16 is the top half of an fp32 (QWEN3.md 2.6),
 * so widening each u16 with a shift by 16 is the exact conversion, done in registers. */
ALWAYS_INLINE void ldw8(const void* w, size_t i, WeightType type, float32x4_t* lo, float32x4_t* hi) {
    if (type == WEIGHT_F32) {
        *lo = vld1q_f32((const float*)w + i);
        *hi = vld1q_f32((const float*)w + i + 4);
    } else if (type == WEIGHT_BF16) {
        uint16x8_t h = vld1q_u16((const uint16_t*)w + i);
        *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    } else {
        int16x8_t s = vmovl_s8(vld1_s8((const int8_t*)w + i));
        *lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(s)));
        *hi = vcvtq_f32_s32(vmovl_high_s16(s));
    }
}

ALWAYS_INLINE float ldw1(const void* w, size_t i, WeightType type) {
    if (type == WEIGHT_F32) return ((const float*)w)[i];
    if (type == WEIGHT_BF16) return bf16_to_f32(((const uint16_t*)w)[i]);
    return (float)((const int8_t*)w)[i];
}

/* Tile of RT rows x TT tokens over the columns [c0, c1) (c1 - c0 a multiple of 8), added into
 * acc (not reduced); weight (row i of the tile, column c) is element i * rs + (c - c0) of wb.
 * Both halves of each 8-column step go into the same accumulator so that a 4 x 4 tile needs 16
 * accumulators + 8 weight + 2 activation registers: it fits in the 32 NEON registers without
 * spilling. */
ALWAYS_INLINE void tile_float_acc(float32x4_t acc[4][4], const float* x, const void* wb, size_t rs, WeightType type,
                                  int C, int t, int c0, int c1, int RT, int TT) {
    for (int c = c0; c < c1; c += 8) {
        float32x4_t wl[4], wh[4];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) ldw8(wb, (size_t)i * rs + (size_t)(c - c0), type, &wl[i], &wh[i]);
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) {
            const float* xj = x + (size_t)(t + j) * C + c;
            float32x4_t xl = vld1q_f32(xj), xh = vld1q_f32(xj + 4);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                acc[i][j] = vfmaq_f32(acc[i][j], wl[i], xl);
                acc[i][j] = vfmaq_f32(acc[i][j], wh[i], xh);
            }
        }
    }
}

/* next: the AVX2 twin's L2 prefetch of the next rows, not used here (not measured on arm64). */
ALWAYS_INLINE void tile_float(float* out, const float* x, const Matrix* W, WeightType type, int r, int t, int RT,
                              int TT, const void* next) {
    (void)next;
    const int C = W->cols, R = W->rows;
    float32x4_t acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) acc[i][j] = vdupq_n_f32(0.0f);
    if (type == WEIGHT_Q8) {
        /* weights widened to fp32; the group scale is applied to each group's partial sums. A
         * group size that is not a multiple of 8 (model.c accepts any divisor of the widths)
         * leaves a few columns per group to the scalar loop. */
        const int gs = W->group_size, G = C / gs, gv = gs & ~7;
        const uint16_t* sc = quant_scales(W, r); /* row r + i's scales at sc + i * G */
        float32x4_t tot[4][4];
        float tail[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) {
                tot[i][j] = vdupq_n_f32(0.0f);
                tail[i][j] = 0.0f;
            }
        for (int g = 0; g < G; g++) {
            const int8_t* wg = (const int8_t*)quant_group(W, r, g); /* rows in one block (RT > 1 only from its first row) */
            tile_float_acc(acc, x, wg, (size_t)gs, type, C, t, g * gs, g * gs + gv, RT, TT);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                const float sg = scale1(sc[(size_t)i * G + g]);
#pragma GCC unroll 4
                for (int j = 0; j < TT; j++) {
                    tot[i][j] = vfmaq_n_f32(tot[i][j], acc[i][j], sg);
                    acc[i][j] = vdupq_n_f32(0.0f);
                    if (gv < gs) {
                        float s = 0.0f;
                        for (int c = gv; c < gs; c++)
                            s += (float)wg[i * gs + c] * x[(size_t)(t + j) * C + g * gs + c];
                        tail[i][j] += s * sg;
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++)
                out[(size_t)(t + j) * R + r + i] = vaddvq_f32(tot[i][j]) + tail[i][j];
        return;
    }
    const int C8 = C & ~7;
    const void* wr = row_ptr(W, r);
    tile_float_acc(acc, x, wr, (size_t)C, type, C, t, 0, C8, RT, TT);
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) {
            float s = vaddvq_f32(acc[i][j]);
            for (int c = C8; c < C; c++)
                s += ldw1(wr, (size_t)i * C + c, type) * x[(size_t)(t + j) * C + c];
            out[(size_t)(t + j) * R + r + i] = s;
        }
}

/* Matrix-vector (n == 1): 4 rows at a time, each with two accumulators (one per half of the
 * 8-column step) so consecutive FMAs of a row do not wait on each other; the weights are
 * streamed once and the activation vectors are shared by the 4 rows. */
ALWAYS_INLINE void rows_float_n1(float* out, const float* x, const Matrix* W, WeightType type, int r0, int r1) {
    const int C = W->cols;
    const int C8 = C & ~7;
    int r = r0;
    if (type != WEIGHT_Q8) {
        for (; r + 4 <= r1; r += 4) {
            float32x4_t a[4][2];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = vdupq_n_f32(0.0f);
            for (int c = 0; c < C8; c += 8) {
                float32x4_t x0 = vld1q_f32(x + c), x1 = vld1q_f32(x + c + 4);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    float32x4_t lo, hi;
                    ldw8(W->data, (size_t)(r + i) * C + c, type, &lo, &hi);
                    a[i][0] = vfmaq_f32(a[i][0], lo, x0);
                    a[i][1] = vfmaq_f32(a[i][1], hi, x1);
                }
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                float s = vaddvq_f32(vaddq_f32(a[i][0], a[i][1]));
                for (int c = C8; c < C; c++) s += ldw1(W->data, (size_t)(r + i) * C + c, type) * x[c];
                out[r + i] = s;
            }
        }
    } else {
        for (; r + 4 <= r1; r += 4) tile_float(out, x, W, type, r, 0, 4, 1, NULL);
    }
    for (; r < r1; r++) tile_float(out, x, W, type, r, 0, 1, 1, NULL);
}

/* ---- q8 x int8 activations ---- */

#if !defined(KERNELS_Q8_F32ACT)
/* Quantises token rows [t0, t1) of x (width C) to int8 per group of gs (a multiple of 16; run_job
 * only comes here for multiples of 32): s = max|x| / 127, q = round(x / s). The scheme of the
 * AVX2 twin, rounded the same way: x * (127 / max) and round to nearest even (vcvtnq_s32_f32,
 * as _mm256_cvtps_epi32 does under the default MXCSR), so both targets quantise alike. xsum and
 * xgsum are not written: they serve the AVX2 twin's unsigned x signed products, and SDOT
 * multiplies signed by signed. */
static void quantize_rows(int8_t* xq, float* xs, int32_t* xsum, int32_t* xgsum, const float* x, int C, int gs,
                          int t0, int t1) {
    const int G = C / gs;
    (void)xsum;
    (void)xgsum;
    for (int t = t0; t < t1; t++) {
        for (int g = 0; g < G; g++) {
            const float* v = x + (size_t)t * C + (size_t)g * gs;
            float32x4_t m = vdupq_n_f32(0.0f);
            for (int c = 0; c < gs; c += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(v + c)));
            float amax = vmaxvq_f32(m);
            float s = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            xs[(size_t)t * G + g] = s;
            int8_t* q = xq + (size_t)t * C + (size_t)g * gs;
            for (int c = 0; c < gs; c += 16) {
                int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(v + c), inv));
                int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(v + c + 4), inv));
                int32x4_t d = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(v + c + 8), inv));
                int32x4_t e = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(v + c + 12), inv));
                /* saturating narrows, like the AVX2 packs: |x * inv| can round a hair above 127 */
                int16x8_t lo = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
                int16x8_t hi = vcombine_s16(vqmovn_s32(d), vqmovn_s32(e));
                vst1q_s8(q + c, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
            }
        }
    }
}
#endif

/* The 16 q8 weights of a row group from column c (a multiple of 16) on; wrow is the row's group. */
ALWAYS_INLINE int8x16_t qi_load(const uint8_t* wrow, int c) {
    return vld1q_s8((const int8_t*)wrow + c);
}

/* acc[k] += sum of the 4 int8 products of lanes 4k..4k+3. */
ALWAYS_INLINE int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t x) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, x);
#else
    /* Without SDOT (plain armv8-a): int16 products, added in adjacent pairs (two products of
     * |w| <= 128 and |x| <= 127 sum to at most 32512: no int16 overflow), then pairs of pairs
     * into int32, so each lane holds its own 4 bytes as with SDOT (tile_q4's lanes are rows). */
    const int16x8_t pairs = vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)), vmull_high_s8(w, x));
    return vpadalq_s16(acc, pairs);
#endif
}

/* The int32 partial sums of a group are reduced across lanes with pairwise adds into one vector
 * per row (lanes = tokens), or for a single token into one vector whose lanes are the rows: then
 * 16 group accumulators + 4 weights + 1 activation + 4 totals fit in the 32 registers, where
 * keeping 16 fp32 totals as well would spill. Each output's arithmetic is the same whatever the
 * tile shape (fma of float(isum) by ws * xs in its own lane), so the thread split cannot change
 * a result (tests/test_kernels.c checks 1 thread == 2 threads bitwise). next: the AVX2 twin's L2
 * prefetch of the next row block, not used here (not measured on arm64). */
ALWAYS_INLINE void tile_qi(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum, const Matrix* W,
                           const float* ws_r, int r, int t, int RT, int TT, const char* next) {
    const int C = W->cols, R = W->rows, gs = W->group_size, G = C / gs;
    const size_t gb = (size_t)gs;
    (void)xsum;
    (void)next;
    float32x4_t tot[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) tot[i] = vdupq_n_f32(0.0f);
    for (int g = 0; g < G; g++) {
        int32x4_t acc[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[i][j] = vdupq_n_s32(0);
        const uint8_t* wg = quant_group(W, r, g); /* row r + i at wg + i * gb */
        for (int c = g * gs; c < g * gs + gs; c += 16) {
            int8x16_t wv[4];
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) wv[i] = qi_load(wg + (size_t)i * gb, c - g * gs);
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) {
                int8x16_t xv = vld1q_s8(xq + (size_t)(t + j) * C + c);
#pragma GCC unroll 4
                for (int i = 0; i < RT; i++) acc[i][j] = dot16(acc[i][j], wv[i], xv);
            }
        }
        if (TT == 1) {
            float ws[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) ws[i] = ws_r[(size_t)i * G + g];
            int32x4_t s = vpaddq_s32(vpaddq_s32(acc[0][0], acc[1][0]), vpaddq_s32(acc[2][0], acc[3][0]));
            tot[0] = vfmaq_f32(tot[0], vcvtq_f32_s32(s), vmulq_n_f32(vld1q_f32(ws), xsc[(size_t)t * G + g]));
        } else {
            float xa[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) xa[j] = xsc[(size_t)(t + j) * G + g];
            float32x4_t xsv = vld1q_f32(xa);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                int32x4_t s = vpaddq_s32(vpaddq_s32(acc[i][0], acc[i][1]), vpaddq_s32(acc[i][2], acc[i][3]));
                tot[i] = vfmaq_f32(tot[i], vcvtq_f32_s32(s),
                                   vmulq_n_f32(xsv, ws_r[(size_t)i * G + g]));
            }
        }
    }
    float o[4];
    if (TT == 1) {
        vst1q_f32(o, tot[0]);
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) out[(size_t)t * R + r + i] = o[i];
    } else {
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) {
            vst1q_f32(o, tot[i]);
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) out[(size_t)(t + j) * R + r + i] = o[j];
        }
    }
}

/* The q8 matrix-vector product: tile_qi's own TT == 1 path, which also reads a row block
 * front to back (the AVX2 twin's written-out kernel and its prefetch distance were measured on
 * x86 only). */
ALWAYS_INLINE void rows_qi_n1(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum, const Matrix* W,
                              int r0, int r1) {
    float* ws = thread_xp();
    for (int r = r0; r < r1;) {
        const int RT = r + 4 <= r1 ? 4 : 1;
        q8_scales_float(ws, W, r, RT);
        tile_qi(out, xq, xsc, xsum, W, ws, r, 0, RT, 1, NULL);
        r += RT;
    }
}


/* The f32 matrix-vector product: the generic four-row kernel (the one-row-at-a-time variant of
 * the AVX2 twin was measured on x86 only). */
static void rows_f32_n1(float* out, const float* x, const Matrix* W, int r0, int r1) {
    rows_float_n1(out, x, W, WEIGHT_F32, r0, r1);
}

#endif /* KERNELS_AVX2 / KERNELS_NEON */

#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
/* ---- Blocking shared by both twins: the loops over row and token tiles call the tile functions
 * (tile_float, tile_qi) and matrix-vector kernels (rows_f32_n1, rows_float_n1, rows_qi_n1) of the SIMD
 * block above, which have the same names and shapes on each target. ---- */

/* Token-blocked matrix-matrix product for rows [r0, r1): the activation block (tb tokens) stays in
 * L2 while every weight tile of the chunk is used against it. */
ALWAYS_INLINE void rows_float_nn(float* out, const float* x, const Matrix* W, WeightType type, int n, int r0, int r1) {
#if defined(KERNELS_AVX2)
    if (float_packed_takes(W, n)) { /* whole panels of 16 rows (from a multiple of 16: run_job's chunks are) */
        for (int np; (np = row_tiles_next(r0, r1, FLOAT_MAX_PANELS)) > 0; r0 += np * FLOAT_PANEL_ROWS)
            rows_float_packed(out, x, W, type, n, r0, np, thread_float_pack());
    }
#endif
    const int C = W->cols;
    const int tb = token_block((size_t)C * sizeof(float));
    for (int t0 = 0; t0 < n; t0 += tb) {
        int t1 = t0 + tb < n ? t0 + tb : n;
        int r = r0;
        for (; r + 4 <= r1; r += 4) {
            /* While the first token block's first tile reads these 4 rows from memory, it brings
             * the next 4 into L2, so that their read overlaps this tile's arithmetic; a few tokens
             * (below the panels) are otherwise memory-latency-bound on the first pass and compute-
             * bound on the others (x86-64-v3 on the Intel VM, one thread, bf16 pp8 37-38 -> 46-48
             * tok/s, pp20 53-57 -> 62, f32 level or better; twenty-seventh session). */
            const void* next = t0 == 0 && type != WEIGHT_Q8 && r + 8 <= W->rows ? row_ptr(W, r + 4) : NULL;
            int t = t0;
            for (; t + TILE_TOKENS <= t1; t += TILE_TOKENS, next = NULL)
                tile_float(out, x, W, type, r, t, 4, TILE_TOKENS, next);
            for (; t < t1; t++, next = NULL) tile_float(out, x, W, type, r, t, 4, 1, next);
        }
        for (; r < r1; r++) {
            int t = t0;
            for (; t + 4 <= t1; t += 4) tile_float(out, x, W, type, r, t, 1, 4, NULL);
            for (; t < t1; t++) tile_float(out, x, W, type, r, t, 1, 1, NULL);
        }
    }
}

#if defined(KERNELS_BF16_DOT)
/* Prefill with bf16 weights and bf16 activations (kernels_set_bf16_activations): vdpbf16ps
 * multiplies 32 pairs of bf16 and adds them into 16 fp32 lanes, twice the products per
 * instruction of widening the weights to fp32 for FMAs. The activations are rounded to bf16
 * (nearest even) once per matmul (bf16_round_rows), which is what llama.cpp does with bf16
 * weights and what a Hugging Face model run in bfloat16 does between its layers; the products
 * of two bf16 are exact in fp32, the sums are fp32. A tile: rows r .. r+RT-1 x tokens
 * t .. t+TT-1, the last columns loaded under a mask (zeros beyond C). */
ALWAYS_INLINE void tile_bf16_dot(float* out, const uint16_t* xb, const Matrix* W, int r, int t, int RT, int TT) {
    const int C = W->cols, R = W->rows;
    const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) acc[i][j] = _mm512_setzero_ps();
    for (int c = 0; c < C; c += 32) {
        const __mmask32 m = C - c >= 32 ? 0xFFFFFFFFu : (1u << (C - c)) - 1;
        __m512i wv[4], xv[4];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) wv[i] = _mm512_maskz_loadu_epi16(m, w + (size_t)i * C + c);
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) xv[j] = _mm512_maskz_loadu_epi16(m, xb + (size_t)(t + j) * C + c);
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
            for (int j = 0; j < TT; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)wv[i], (__m512bh)xv[j]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < TT; j++) out[(size_t)(t + j) * R + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

/* The packed panels of rows_float_packed for vdpbf16ps: a panel holds 16 rows with each 32-bit
 * lane one row's pair of bf16 weights (columns 2k, 2k + 1), so vector k of the panel is the 16
 * rows' pair k, transposed straight from the rows (no widening); a token's pair k is broadcast to
 * every lane and one vdpbf16ps adds both products into each row's fp32 lane. Tiles of 12 tokens x
 * 32 rows as there: 2 vector loads and 12 broadcasts per 24 instructions of 32 products each,
 * where tile_bf16_dot (4 x 4) loads 8 vectors per 16 and ends with 16 horizontal sums.
 * Rows [r, r + 16) as a panel, C a multiple of 32: pair k at panel + 16 * k. */
static void bf16_pack_panel(uint32_t* panel, const Matrix* W, int r) {
    const int C = W->cols;
    const uint16_t* w = (const uint16_t*)W->data + (size_t)r * C;
    for (int c = 0; c < C; c += 32) {
        __m512i v[16];
        for (int n = 0; n < 16; n++) v[n] = _mm512_loadu_si512((const void*)(w + (size_t)n * C + c));
        transpose16_epi32(v);
        for (int k = 0; k < 16; k++) _mm512_storeu_si512((void*)(panel + (size_t)(c / 2 + k) * 16), v[k]);
    }
}

#if defined(KERNELS_AMX_BF16)
/* The panels are AMX-BF16's B layout already: TDPBF16PS adds the products of A (16 tokens x 32
 * bf16 columns, straight from the activations) and B (16 pair-rows x 16 output rows, 16
 * consecutive panel vectors: 1 KB) into C, 16 tokens x 16 rows of fp32, which stays in the tile
 * over all the columns (no per-group scales, unlike q8's tiles) and is stored once, straight
 * into out. Activations of `parts` bf16 parts (1: --bf16-activations; 3: fp32 activations split
 * by bf16_split_rows), token t's part q at xb + (t * parts + q) * C: each part's A tile meets
 * the same B tile, and all the products go into the same C tile. Panels p and p + 1 of the np
 * from row r0 (two: a constant at each call) share each A tile and keep two products in flight.
 * rows: tokens in this tile of 16; under 16, the tile's other A rows must be readable (zeros)
 * and C goes through c_tile, of which the first rows are copied. */
ALWAYS_INLINE void amx_bf16_panels(float* out, size_t os, const uint16_t* xt, size_t xs, int parts, const uint32_t* b0,
                                   int C, int two, int rows) {
    const uint32_t* b1 = b0 + (size_t)8 * C;
    _tile_zero(4);
    if (two) _tile_zero(5);
    for (int s = 0; s < C / 32; s++) {
        _tile_loadd(2, b0 + (size_t)256 * s, 64);
        if (two) _tile_loadd(3, b1 + (size_t)256 * s, 64);
        _tile_loadd(0, xt + 32 * s, xs);
        _tile_dpbf16ps(4, 0, 2);
        if (two) _tile_dpbf16ps(5, 0, 3);
        if (parts == 3) {
            _tile_loadd(1, xt + C + 32 * s, xs);
            _tile_dpbf16ps(4, 1, 2);
            if (two) _tile_dpbf16ps(5, 1, 3);
            _tile_loadd(6, xt + 2 * C + 32 * s, xs);
            _tile_dpbf16ps(4, 6, 2);
            if (two) _tile_dpbf16ps(5, 6, 3);
        }
    }
    if (rows == AMX_ROWS) {
        _tile_stored(4, out, os);
        if (two) _tile_stored(5, out + 16, os);
        return;
    }
    float c_tile[2][AMX_ROWS * 16];
    _tile_stored(4, c_tile[0], 64);
    if (two) _tile_stored(5, c_tile[1], 64);
    for (int i = 0; i < rows; i++) {
        memcpy(out + (size_t)i * (os / sizeof(float)), c_tile[0] + 16 * i, 16 * sizeof(float));
        if (two) memcpy(out + (size_t)i * (os / sizeof(float)) + 16, c_tile[1] + 16 * i, 16 * sizeof(float));
    }
}

/* Tokens [0, n) x the np panels from row r0, into out (R floats per token). parts: a constant. */
ALWAYS_INLINE void amx_bf16_rows(float* out, const uint16_t* xb, int parts, const uint32_t* packed, int C, int R,
                                 int r0, int np, int n) {
    const size_t xs = (size_t)parts * C * sizeof(uint16_t), os = (size_t)R * sizeof(float);
    __asm__ volatile("" ::: "memory"); /* the packing's stores before the tile loads read them */
    amx_configure(64, AMX_ROWS);   /* A 16 x 64 bytes, B 16 x 64, C 16 x 64: q8's shapes */
    for (int t = 0; t < n; t += AMX_ROWS) {
        const uint16_t* xt = xb + (size_t)t * parts * C;
        float* ot = out + (size_t)t * R + r0;
        const int rows = n - t < AMX_ROWS ? n - t : AMX_ROWS;
        int p = 0;
        for (; p + 2 <= np; p += 2) amx_bf16_panels(ot + 16 * p, os, xt, xs, parts, packed + (size_t)p * 8 * C, C, 1, rows);
        if (p < np) amx_bf16_panels(ot + 16 * p, os, xt, xs, parts, packed + (size_t)p * 8 * C, C, 0, rows);
    }
    _tile_release();
}
#endif

/* Rows [r0, r0 + 16 * np) (np <= FLOAT_MAX_PANELS) for all n tokens, packed into the thread's
 * float-panel scratch (a bf16 panel is half a float one), then panel_tiles' vdpbf16ps tiles; with
 * AMX-BF16, whole tiles of 16 tokens on AMX first and the last tokens on the panel tiles. */
static void rows_bf16_packed(float* out, const uint16_t* xb, const Matrix* W, int n, int r0, int np) {
    const int C = W->cols, R = W->rows;
    uint32_t* packed = (uint32_t*)(void*)thread_float_pack();
    for (int p = 0; p < np; p++) bf16_pack_panel(packed + (size_t)p * 8 * C, W, r0 + 16 * p);
    int t = 0;
#if defined(KERNELS_AMX_BF16)
    if (amx_usable) {
        t = n / AMX_ROWS * AMX_ROWS;
        amx_bf16_rows(out, xb, 1, packed, C, R, r0, np, t);
    }
#endif
    panel_tiles(out + (size_t)t * R, (const char*)(xb + (size_t)t * C), (size_t)C * sizeof(uint16_t), packed, C / 2,
                R, r0, n - t, np, 1);
}

/* Rows [r0, r1) x n tokens: whole panels of 16 rows where bf16_packed_takes (from a multiple of
 * 16: run_job's chunks are), the rest blocked as rows_float_nn (a block of tokens stays in L2). */
static void rows_bf16_dot(float* out, const uint16_t* xb, const Matrix* W, int n, int r0, int r1) {
    if (bf16_packed_takes(W, n)) {
        for (int np; (np = row_tiles_next(r0, r1, FLOAT_MAX_PANELS)) > 0; r0 += np * FLOAT_PANEL_ROWS)
            rows_bf16_packed(out, xb, W, n, r0, np);
    }
    const int tb = token_block((size_t)W->cols * sizeof(uint16_t));
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        int r = r0;
        for (; r + 4 <= r1; r += 4) {
            int t = t0;
            for (; t + 4 <= t1; t += 4) tile_bf16_dot(out, xb, W, r, t, 4, 4);
            for (; t < t1; t++) tile_bf16_dot(out, xb, W, r, t, 4, 1);
        }
        for (; r < r1; r++) {
            int t = t0;
            for (; t + 4 <= t1; t += 4) tile_bf16_dot(out, xb, W, r, t, 1, 4);
            for (; t < t1; t++) tile_bf16_dot(out, xb, W, r, t, 1, 1);
        }
    }
}

/* xb[i] = x[i] rounded to bf16, nearest even (vcvtne2ps2bf16; the scalar tail does the same). */
static void bf16_round_rows(uint16_t* xb, const float* x, size_t count) {
    size_t i = 0;
    for (; i + 32 <= count; i += 32)
        _mm512_storeu_si512(xb + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
    for (; i < count; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        xb[i] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
}
#endif

#if defined(KERNELS_AMX_BF16)
/* bf16 weights with fp32 activations on AMX-BF16: each activation x split into three bf16,
 * x = h + m + l, h = bf16(x), m = bf16(x - h), l = x - h - m (each difference exact in fp32:
 * h keeps x's top 8 significant bits, m the next 8, l the last 8, so l is a bf16 exactly). The
 * three products with a bf16 weight are exact in fp32, so W x is summed in fp32 from the exact
 * products, as with the fp32 FMAs, in another order. TDPBF16PS reads denormal inputs as zero:
 * only an l below 2^-126 (x below about 2^-110) is lost. Token t's parts at xs + 3 t C: h, m,
 * l, C each (C a multiple of 16). */
static void bf16_split_rows(uint16_t* xs, const float* x, int C, int t0, int t1) {
    for (int t = t0; t < t1; t++) {
        const float* xt = x + (size_t)t * C;
        uint16_t* h = xs + (size_t)t * 3 * C;
        for (int c = 0; c < C; c += 16) {
            const __m512 v = _mm512_loadu_ps(xt + c);
            const __m256i hb = (__m256i)_mm512_cvtneps_pbh(v);
            const __m512 r = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hb), 16)));
            const __m256i mb = (__m256i)_mm512_cvtneps_pbh(r);
            const __m512 l = _mm512_sub_ps(r, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(mb), 16)));
            _mm256_storeu_si256((__m256i*)(h + c), hb);
            _mm256_storeu_si256((__m256i*)(h + C + c), mb);
            _mm256_storeu_si256((__m256i*)(h + 2 * C + c), (__m256i)_mm512_cvtneps_pbh(l));
        }
    }
}

/* Rows [r0, r1) x n tokens from the split activations xs (bf16_split_rows, rows up to the next
 * multiple of 16 tokens readable): whole panels of 16 rows on AMX-BF16, the rows left (a matrix
 * whose rows are not a multiple of 16) as rows_float_nn from x. */
static void rows_bf16_split(float* out, const float* x, const uint16_t* xs, const Matrix* W, int n, int r0, int r1) {
    const int C = W->cols;
    uint32_t* packed = (uint32_t*)(void*)thread_float_pack();
    for (int np; (np = row_tiles_next(r0, r1, FLOAT_MAX_PANELS)) > 0; r0 += np * FLOAT_PANEL_ROWS) {
        for (int p = 0; p < np; p++) bf16_pack_panel(packed + (size_t)p * 8 * C, W, r0 + 16 * p);
        amx_bf16_rows(out, xs, 3, packed, C, W->rows, r0, np, n);
    }
    if (r0 < r1) rows_float_nn(out, x, W, WEIGHT_BF16, n, r0, r1);
}
#endif

static void rows_f32(float* out, const float* x, const Matrix* W, int n, int r0, int r1) {
    if (n == 1) rows_f32_n1(out, x, W, r0, r1);
    else rows_float_nn(out, x, W, WEIGHT_F32, n, r0, r1);
}
static void rows_bf16(float* out, const float* x, const Matrix* W, int n, int r0, int r1) {
    if (n == 1) rows_float_n1(out, x, W, WEIGHT_BF16, r0, r1);
    else rows_float_nn(out, x, W, WEIGHT_BF16, n, r0, r1);
}
static void rows_q8f(float* out, const float* x, const Matrix* W, int n, int r0, int r1) {
    if (n == 1) rows_float_n1(out, x, W, WEIGHT_Q8, r0, r1);
    else rows_float_nn(out, x, W, WEIGHT_Q8, n, r0, r1);
}

/* n tokens x rows [r0, r1) in tiles of Q8_TILE_ROWS rows x Q8_TILE_TOKENS tokens. */
ALWAYS_INLINE void rows_qi_tiles(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum, const Matrix* W,
                                 int n, int r0, int r1) {
    const int C = W->cols, G = C / W->group_size;
    const int tb = token_block((size_t)C);
    float* ws = thread_xp(); /* the row block's scales as floats: 4 * C / group_size <= C floats */
    for (int t0 = 0; t0 < n; t0 += tb) {
        int t1 = t0 + tb < n ? t0 + tb : n;
        int r = r0;
        for (; r + 4 <= r1; r += 4) {
            /* the first tile over this block brings the next one into L2, as in rows_float_nn
             * (x86-64-v3, one thread: pp8 49-51 -> 66-69 tok/s; twenty-seventh session) */
            const char* next = t0 == 0 && r + 8 <= W->rows ? (const char*)quant_scales(W, r + 4) : NULL;
            q8_scales_float(ws, W, r, 4);
            int t = t0;
            for (; t + Q8_TILE_TOKENS <= t1; t += Q8_TILE_TOKENS)
                for (int h = 0; h < 4; h += Q8_TILE_ROWS, next = NULL)
                    tile_qi(out, xq, xsc, xsum, W, ws + (size_t)h * G, r + h, t, Q8_TILE_ROWS, Q8_TILE_TOKENS, next);
            for (; t < t1; t++, next = NULL) tile_qi(out, xq, xsc, xsum, W, ws, r, t, 4, 1, next);
        }
        for (; r < r1; r++) {
            q8_scales_float(ws, W, r, 1);
            int t = t0;
            for (; t + 4 <= t1; t += 4) tile_qi(out, xq, xsc, xsum, W, ws, r, t, 1, 4, NULL);
            for (; t < t1; t++) tile_qi(out, xq, xsc, xsum, W, ws, r, t, 1, 1, NULL);
        }
    }
}

ALWAYS_INLINE void rows_qi_t(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum, const int32_t* xgsum,
                             const Matrix* W, int n, int r0, int r1) {
    if (n == 1) {
        rows_qi_n1(out, xq, xsc, xsum, W, r0, r1);
        return;
    }
    int ra = r0; /* AMX did every token of rows [r0, ra) */
#if defined(KERNELS_AMX)
    if (amx_takes(W, n)) ra = amx_chunk(out, xq, xsc, W, n, r0, r1);
#endif
    int rp = ra; /* the panels did every token of rows [ra, rp) */
#if defined(KERNELS_AVX2)
    if (q8_packed_takes(W, n)) rp = rows_q8_packed(out, xq, xsc, xgsum, W, 0, n, ra, r1);
#else
    (void)xgsum;
#endif
    rows_qi_tiles(out, xq, xsc, xsum, W, n, rp, r1);
}

#if defined(KERNELS_NEON)
/* q4 (kernels.h's row lanes): the AVX2 twin's scheme at half the width. Each 16-byte half of a
 * quarter holds 4 rows, one per 32-bit lane, so a block's 8 rows take two accumulators; the
 * nibbles minus 8 are q itself, which dot16 (SDOT, or its widening fallback) multiplies by the
 * token's 4 activations of those columns in every lane. The same int32 per (row, group) as the
 * AVX2 twin, and the same fp32 steps after it. One token at a time (correctness only: no arm64
 * hardware to tune a token tile on). */
static void tile_q4(float* out, const int8_t* xq, const float* xsc, const Matrix* W, int r, int t) {
    const int C = W->cols, R = W->rows, G = C / Q4_GROUP;
    const uint8_t* b = q4_group(W, r, 0);
    const int8_t* x = xq + (size_t)t * C;
    float32x4_t tot[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; /* rows 0-3, 4-7 */
    for (int g = 0; g < G; g++, b += Q4_GROUP_BYTES, x += Q4_GROUP) {
        const uint8_t* w = b + Q4_BLOCK_ROWS * sizeof(uint16_t);
        int32x4_t a[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int v = 0; v < 4; v++) {
            int32_t xl, xh; /* columns 4v .. 4v+3 and 16+4v .. 16+4v+3 */
            memcpy(&xl, x + 4 * v, 4);
            memcpy(&xh, x + 16 + 4 * v, 4);
            const int8x16_t xlv = vreinterpretq_s8_s32(vdupq_n_s32(xl)), xhv = vreinterpretq_s8_s32(vdupq_n_s32(xh));
            for (int h = 0; h < 2; h++) {
                const uint8x16_t q = vld1q_u8(w + 32 * v + 16 * h);
                const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vdupq_n_s8(8));
                const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
                a[h] = dot16(dot16(a[h], lo, xlv), hi, xhv);
            }
        }
        const float xs = xsc[(size_t)t * G + g];
        for (int h = 0; h < 2; h++)
            tot[h] = vfmaq_n_f32(tot[h],
                                 vmulq_f32(vcvtq_f32_s32(a[h]), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t*)b + 4 * h)))),
                                 xs);
    }
    float o[8];
    vst1q_f32(o, tot[0]);
    vst1q_f32(o + 4, tot[1]);
    for (int i = 0; i < Q4_BLOCK_ROWS && r + i < R; i++) out[(size_t)t * R + r + i] = o[i];
}

/* Rows [r0, r1) (r0 a multiple of 8: run_job's chunks are) for n tokens, a block of tokens at a
 * time as rows_qi_t. */
static void rows_q4(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum,
                    const int32_t* xgsum, const Matrix* W, int n, int r0, int r1) {
    (void)xsum;
    (void)xgsum;
    const int tb = token_block((size_t)W->cols);
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        for (int r = r0; r < r1; r += Q4_BLOCK_ROWS)
            for (int t = t0; t < t1; t++) tile_q4(out, xq, xsc, W, r, t);
    }
}
#endif

/* q8 or q4 weights x int8 activations, each with its own kernel. */
static void rows_qi(float* out, const int8_t* xq, const float* xsc, const int32_t* xsum,
                    const int32_t* xgsum, const Matrix* W, int n, int r0, int r1) {
    if (W->type == WEIGHT_Q4) rows_q4(out, xq, xsc, xsum, xgsum, W, n, r0, r1);
    else rows_qi_t(out, xq, xsc, xsum, xgsum, W, n, r0, r1);
}
#define HAVE_Q8_INT8 1  /* build with -DKERNELS_Q8_F32ACT to keep fp32 activations instead */
#endif

/* ---------------------------------------------------------------------------------------------
 * Parallel driver. matmul_multi runs several matrices that share the input x (q/k/v, gate/up) in
 * one dispatch; the q8 activations are quantised once for all of them.
 * ------------------------------------------------------------------------------------------- */

#define MAX_MULTI 8
#define MAX_RANGES 64  /* threads beyond this share ranges */

typedef struct MatmulJob {
    float* out[MAX_MULTI];
    const Matrix* W[MAX_MULTI];
    int chunk[MAX_MULTI];
    int first_item[MAX_MULTI + 1];
    int n_mats;
    const float* x;
    int n;
    int use_qi;          /* q8 / q4 weights x int8 activations (quantize_rows) */
    int32_t* xgsum;      /* xgsum_buf for q4 weights and the q8 panels with VNNI, else NULL (quantize_rows skips it) */
    int use_xp;          /* bf16, n == 1: each thread de-interleaves x into its own part of xp_buf */
    int use_xb16;        /* bf16, n > 1, --bf16-activations: xb16_buf holds x rounded to bf16 */
    int use_split;       /* bf16, n >= 16, fp32 activations, AMX-BF16: xb16_buf holds x split in three bf16 */
    int qgs;             /* group size of the quantised activations */
    void (*prepare)(const struct MatmulJob*, int t0, int t1); /* prepare_tokens: one range of tokens */
    int qtb;             /* tokens per prepare item */
    int n_ranges;        /* claim_chunks: one range of chunks per thread */
    struct {
        _Alignas(64) atomic_int next; /* a cache line each, so that claims in different ranges */
        int end;                      /* do not move one line between the cores */
    } range[MAX_RANGES];
} MatmulJob;

/* The next row chunks [first, *end) for the calling thread; returns first, or -1 when none is
 * left. Thread k starts on the k-th of n_ranges contiguous ranges of chunks and takes them in
 * order, up to `batch` per claim, so its weight reads stay one sequential stream from chunk to
 * chunk (each block's prefetch runs into the next chunk); when its range is done it takes the
 * next chunk of another range, one at a time. Against chunks taken in turn by whichever thread
 * came first: q8 decode tg128, 2 threads, four alternating rounds, 73.5/66.5/78.7/74.3 ->
 * 78.9/79.4/84.7/81.5 tok/s. */
static int claim_chunks(MatmulJob* j, int batch, int* end) {
    const int me = kernels_thread_index() % j->n_ranges;
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

static void compute_rows(const MatmulJob* j, int m, int r0, int r1) {
    const Matrix* W = j->W[m];
#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
    if (j->use_qi) {
        rows_qi(j->out[m], xq_buf, xs_buf, xsum_buf, xgsum_buf, W, j->n, r0, r1);
        return;
    }
    if (W->type == WEIGHT_Q4) { /* only with -DKERNELS_Q8_F32ACT: q4 has no fp32-activation twin */
        matmul_rows_scalar(j->out[m], j->x, W, j->n, r0, r1);
        return;
    }
#if defined(KERNELS_BF16_DOT)
    if (j->use_xb16) {
        rows_bf16_dot(j->out[m], xb16_buf, W, j->n, r0, r1);
        return;
    }
#endif
#if defined(KERNELS_AMX_BF16)
    if (j->use_split) {
        rows_bf16_split(j->out[m], j->x, xb16_buf, W, j->n, r0, r1);
        return;
    }
#endif
    if (W->type == WEIGHT_F32) rows_f32(j->out[m], j->x, W, j->n, r0, r1);
#if defined(KERNELS_AVX2) /* the de-interleaved bf16 path (use_xp) is AVX2-only */
    else if (W->type == WEIGHT_BF16 && j->use_xp) rows_bf16_n1(j->out[m], thread_xp(), W, r0, r1);
#endif
    else if (W->type == WEIGHT_BF16) rows_bf16(j->out[m], j->x, W, j->n, r0, r1);
    else rows_q8f(j->out[m], j->x, W, j->n, r0, r1);
#else
    matmul_rows_scalar(j->out[m], j->x, W, j->n, r0, r1);
#endif
}

static void run_chunk(const MatmulJob* j, int i) {
    int m = 0;
    while (i >= j->first_item[m + 1]) m++;
    const int r0 = (i - j->first_item[m]) * j->chunk[m];
    int r1 = r0 + j->chunk[m];
    if (r1 > j->W[m]->rows) r1 = j->W[m]->rows;
    compute_rows(j, m, r0, r1);
}

/* Prefill: one pool item per chunk, claimed one at a time, so a thread that the scheduler takes
 * off its core between two chunks holds nothing up. */
static void matmul_item(void* ctx, int item) {
    MatmulJob* j = ctx;
    (void)item; /* which chunk is claim_chunks' choice */
    int end;
    const int i = claim_chunks(j, 1, &end);
    if (i >= 0) run_chunk(j, i); /* always: there are as many items as chunks */
}

/* Decode: one pool task per thread, which takes the chunks of its own range CLAIM_BATCH per atomic
 * and then helps the other ranges one chunk at a time. A decoded token has ~9,000 chunks (32 per
 * thread in each of ~140 matmuls) and every claim is a locked instruction, which waits for the
 * weight loads in flight; per chunk, two more (the pool's item counter and its done count, shared
 * by both cores) came on top. q4 tg64 with two threads, alternating with one item per chunk:
 * 130.6 / 132.2 / 132.7 against 121.1 / 125.9 / 127.8 tok/s (84-86% of the roof against 79-82%),
 * bf16 level (40.9 / 40.1 / 40.2 against 40.9 / 39.5 / 39.1); beside a busy core, 2 threads / 1
 * unchanged (0.99 against 0.98, tools/bench_busy.py). The eighth session's one task per thread
 * with single claims had shown nothing: the pool's counters alone were not the cost. A worker
 * taken off its core between two chunks now holds the dispatch up until it runs again, but
 * pool.c runs everything in the caller once it sees another process on the cores. */
#define CLAIM_BATCH 4

static void matmul_task(void* ctx, int task) {
    MatmulJob* j = ctx;
    (void)task; /* the range is the calling thread's */
#if defined(KERNELS_AVX2) /* a thread that runs two tasks (pool.c's serial fallback) writes its copy twice */
    if (j->use_xp) deinterleave(thread_xp(), j->x, j->W[0]->cols, bf16_span(j->W[0]->cols));
#endif
    int c, end;
    while ((c = claim_chunks(j, CLAIM_BATCH, &end)) >= 0)
        for (; c < end; c++) run_chunk(j, c);
}

/* The activations' per-token preparation before the products (quantize_tokens, round_tokens):
 * items of qtb tokens, about 4 per thread; below 16 tokens one range in the calling thread, where
 * a dispatch would cost more than it saves. Per token, so the split does not change the result. */
#if (defined(HAVE_Q8_INT8) && !defined(KERNELS_Q8_F32ACT)) || defined(KERNELS_BF16_DOT)
static void prepare_item(void* ctx, int i) {
    const MatmulJob* j = ctx;
    int t0 = i * j->qtb, t1 = t0 + j->qtb < j->n ? t0 + j->qtb : j->n;
    j->prepare(j, t0, t1);
}

static void prepare_tokens(MatmulJob* j, void (*prepare)(const MatmulJob*, int, int)) {
    const int nt = kernels_threads();
    j->prepare = prepare;
    if (j->n < 16) {
        prepare(j, 0, j->n);
        return;
    }
    j->qtb = (j->n + nt * 4 - 1) / (nt * 4);
    parallel_for((j->n + j->qtb - 1) / j->qtb, prepare_item, j);
}
#endif

#if defined(HAVE_Q8_INT8) && !defined(KERNELS_Q8_F32ACT)
static void quantize_tokens(const MatmulJob* j, int t0, int t1) {
    quantize_rows(xq_buf, xs_buf, xsum_buf, j->xgsum, j->x, j->W[0]->cols, j->qgs, t0, t1);
}
#endif

#if defined(KERNELS_BF16_DOT)
static void round_tokens(const MatmulJob* j, int t0, int t1) {
    const size_t C = (size_t)j->W[0]->cols;
    bf16_round_rows(xb16_buf + (size_t)t0 * C, j->x + (size_t)t0 * C, (size_t)(t1 - t0) * C);
}
#endif
#if defined(KERNELS_AMX_BF16)
static void split_tokens(const MatmulJob* j, int t0, int t1) { bf16_split_rows(xb16_buf, j->x, j->W[0]->cols, t0, t1); }

/* Whether this job's bf16 products take the split activations: all its matrices bf16 of one
 * width (a multiple of 32, as the panels want), AMX granted, from 9 tokens on (the A tiles are
 * padded to 16 tokens with zeros; against the 4 x 4 tiles, one thread, tok/s: pp8 53-54 / 58-59,
 * pp9 62-65 / 57-58, pp12 82 / 66-67; twenty-seventh session), and the tokens rounded up to 16
 * within the scratch. Returns that rounded token count
 * (the A tiles' rows), 0 where not. (f32 weights split in three parts
 * too, six products per tile, ran 0-10% faster than their panels: not kept; notes-kernels.md,
 * "Twenty-fifth session".) */
static int split_tokens_padded(const MatmulJob* j) {
    const int C = j->W[0]->cols, n16 = (j->n + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS;
    if (!amx_usable || bf16_activations || j->n < 9 || C % 32 != 0 || C > xp_cap ||
        (size_t)n16 * (size_t)C > split_cap)
        return 0;
    for (int m = 0; m < j->n_mats; m++)
        if (j->W[m]->type != WEIGHT_BF16 || j->W[m]->cols != C) return 0;
    return n16;
}
#endif

static void run_job(MatmulJob* j) {
    const int nt = kernels_threads();
    j->use_qi = 0;
    j->use_xp = 0;
    j->use_xb16 = 0;
    j->use_split = 0;
#if defined(KERNELS_AMX_BF16)
    const int n16 = split_tokens_padded(j);
    if (n16 > 0) {
        const int C = j->W[0]->cols;
        prepare_tokens(j, split_tokens);
        /* the last A tile's rows beyond n: zeros (their C rows are not stored) */
        memset(xb16_buf + (size_t)j->n * 3 * C, 0, (size_t)(n16 - j->n) * 3 * C * sizeof(uint16_t));
        j->use_split = 1;
    }
#endif
#if defined(KERNELS_BF16_DOT)
    if (bf16_activations && j->n > 1 && (size_t)j->n * (size_t)j->W[0]->cols <= xq_cap) {
        int all = 1;
        for (int m = 0; m < j->n_mats; m++)
            if (j->W[m]->type != WEIGHT_BF16 || j->W[m]->cols != j->W[0]->cols) all = 0;
        if (all) {
            prepare_tokens(j, round_tokens);
            j->use_xb16 = 1;
        }
    }
#endif
#if defined(KERNELS_AVX2)
    if (j->n == 1 && j->W[0]->cols % 16 == 0 && j->W[0]->cols <= xp_cap) {
        int any = 0, same = 1;
        for (int m = 0; m < j->n_mats; m++) {
            if (j->W[m]->type == WEIGHT_BF16) any = 1;
            if (j->W[m]->cols != j->W[0]->cols) same = 0;
        }
        if (any && same) j->use_xp = 1; /* de-interleaved in matmul_task, by each thread */
    }
#endif
#if defined(HAVE_Q8_INT8) && !defined(KERNELS_Q8_F32ACT)
    const Matrix* W0 = j->W[0];
    if ((W0->type == WEIGHT_Q8 || W0->type == WEIGHT_Q4) && W0->group_size % 32 == 0 &&
        (size_t)j->n * (size_t)W0->cols <= xq_cap) {
        int same = 1;
        for (int m = 1; m < j->n_mats; m++)
            if (j->W[m]->type != W0->type || j->W[m]->group_size != W0->group_size ||
                j->W[m]->cols != W0->cols) same = 0;
        if (same) {
            j->use_qi = 1;
            j->qgs = W0->group_size;
            j->xgsum = W0->type == WEIGHT_Q4 ? xgsum_buf : NULL;
#if defined(KERNELS_AVX2) && defined(Q8_VNNI)
            if (q8_packed_takes(W0, j->n)) j->xgsum = xgsum_buf; /* the q8 panels' starting sums */
#endif
            prepare_tokens(j, quantize_tokens);
        }
    }
#endif
    /* Row chunks: a multiple of 4 rows (8 with q4: whole row blocks); about 32 items per thread
     * for matrix-vector products, and at most 64 rows when n > 1 so the chunk's weights stay in
     * L2 while the token blocks go by.
     * Each thread walks its own range of chunks (claim_chunks), so small chunks keep its reads one
     * stream, and the last chunk, which the other threads may wait for, is short: with 8 per
     * thread the calling thread waited 1.4-1.5 ms per decoded token for the other (bf16, 2
     * threads), with 32 0.5-0.6 ms (q8 0.42-0.63 -> 0.25-0.32, f32 1.8-2.0 -> 0.7-0.8). */
    size_t total_rows = 0;
    for (int m = 0; m < j->n_mats; m++) total_rows += (size_t)j->W[m]->rows;
    const int per_thread = j->n == 1 ? 32 : 8;
    int chunk = (int)((total_rows + (size_t)nt * per_thread - 1) / ((size_t)nt * per_thread));
    if (j->n > 1 && chunk > 64) chunk = 64;
    int align = 4;
    for (int m = 0; m < j->n_mats; m++)
        if (quant_block_rows(j->W[m]->type) > align) align = quant_block_rows(j->W[m]->type);
    /* AMX's row tiles and the f32/bf16 panels start at multiples of 16 in every chunk, so which
     * rows take them (and so their rounding) does not depend on the thread count */
#if defined(KERNELS_AVX2)
    if (j->use_qi && q8_packed_takes(j->W[0], j->n)) align = Q8_PANEL_ROWS;
#endif
#if defined(KERNELS_AMX)
    if (j->use_qi && amx_takes(j->W[0], j->n)) align = AMX_ROWS; /* 16: the q8 panels' 8 as well */
#endif
#if defined(KERNELS_AVX2)
    if (!j->use_qi && !j->use_xb16 && !j->use_split)
        for (int m = 0; m < j->n_mats; m++)
            if (float_packed_takes(j->W[m], j->n)) align = FLOAT_PANEL_ROWS;
#endif
#if defined(KERNELS_BF16_DOT)
    if (j->use_xb16 && bf16_packed_takes(j->W[0], j->n)) align = FLOAT_PANEL_ROWS;
#endif
#if defined(KERNELS_AMX_BF16)
    if (j->use_split) align = FLOAT_PANEL_ROWS;
#endif
    chunk = (chunk + align - 1) / align * align;
    if (chunk < align) chunk = align;
    j->first_item[0] = 0;
    for (int m = 0; m < j->n_mats; m++) {
        j->chunk[m] = chunk;
        j->first_item[m + 1] = j->first_item[m] + (j->W[m]->rows + chunk - 1) / chunk;
    }
    const int n_items = j->first_item[j->n_mats];
    j->n_ranges = nt < MAX_RANGES ? nt : MAX_RANGES;
    for (int k = 0; k < j->n_ranges; k++) {
        atomic_init(&j->range[k].next, (int)((long long)n_items * k / j->n_ranges));
        j->range[k].end = (int)((long long)n_items * (k + 1) / j->n_ranges);
    }
    if (j->n == 1) parallel_for(nt, matmul_task, j);
    else parallel_for(n_items, matmul_item, j);
}

void matmul(float* out, const float* x, const Matrix* W, int n) {
    MatmulJob j;
    j.out[0] = out;
    j.W[0] = W;
    j.n_mats = 1;
    j.x = x;
    j.n = n;
    run_job(&j);
}

void matmul_multi(float* const* outs, const float* x, const Matrix* const* Ws, int n_mats, int n) {
    MatmulJob j;
    while (n_mats > MAX_MULTI) {
        matmul_multi(outs, x, Ws, MAX_MULTI, n);
        outs += MAX_MULTI;
        Ws += MAX_MULTI;
        n_mats -= MAX_MULTI;
    }
    if (n_mats <= 0) return;
    for (int m = 0; m < n_mats; m++) {
        j.out[m] = outs[m];
        j.W[m] = Ws[m];
    }
    j.n_mats = n_mats;
    j.x = x;
    j.n = n;
    run_job(&j);
}

#if !defined(KERNELS_AVX2)
const char* kernels_prefetch_plan(void) { return "none"; }
#endif
