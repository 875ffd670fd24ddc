/* peak.c: the bench's compute roof. How many operations per second the instruction that prefill of a
 * weight format relies on can do on this machine, on every thread of the model's ops: the bench
 * divides a prefill's achieved rate by it (cli/bench.c, compute_roof_pct).
 *
 * Each thread runs independent chains of that instruction on values held in registers (no memory
 * traffic), enough chains to cover its latency on two pipes, until a deadline. A multiply-add
 * counts as two operations, as the model's operations per token count them:
 *   f32, and bf16 with fp32 activations (the default)  fp32 FMA, at the prefill kernels' width
 *   bf16 with --bf16-activations (AVX-512 BF16)         vdpbf16ps: 32 bf16 pairs per zmm
 *   q8, q4 (int8 activations)                          vpdpbusd with VNNI; without it AVX2's
 *                                                      vpmaddubsw + vpmaddwd + vpaddd; NEON SDOT,
 *                                                      or its widening stand-in
 * Where prefill runs a product on AMX tiles (the bench asks the plan: cli/bench_plan.c) there is
 * no roof (the loop would measure the vector units, not the tiles): peak_ops returns 0. */
#include <time.h>

#include "cli/peak.h"
#include "kernels/fast/matmul_shared.h" /* which int8 and bf16 dot products the product kernels use */

#define CHAINS 12   /* independent accumulators per thread: latency 4-5 cycles x 2 pipes, with room */
#define STEPS 2048  /* instructions per chain between two looks at the clock */

typedef enum { PEAK_FMA, PEAK_BF16_DOT, PEAK_INT8_DOT } PeakKind;

#if defined(KERNELS_AVX2)
/* int8 dot products as the q8/q4 prefill panels do them (x86/matmul_int8.c, qp_dot): with 512-bit
 * VNNI on zmm, 64 multiply-adds per step and chain (a CPU with full-width 512-bit units does twice
 * the ymm rate), else on ymm as qi_dot, 32. The accumulators are named, not an array: gcc 12 keeps
 * inline asm operands of an array in memory, and its vpdpbusd intrinsic shuffles registers
 * (x86/matmul_int8.c's dpbusd says why the asm). */
#if defined(Q8_VNNI) && defined(KERNELS_AVX512) && defined(__AVX512VNNI__)
typedef __m512i int8_vec;
#define INT8_SET1_8 _mm512_set1_epi8
#define INT8_SET1_32 _mm512_set1_epi32
#define INT8_ADD _mm512_add_epi32
#define INT8_FIRST(v) _mm512_reduce_add_epi32(v)
#define INT8_MACS 64
#else
typedef __m256i int8_vec;
#define INT8_SET1_8 _mm256_set1_epi8
#define INT8_SET1_32 _mm256_set1_epi32
#define INT8_ADD _mm256_add_epi32
#define INT8_FIRST(v) _mm256_extract_epi32(v, 0)
#define INT8_MACS 32
#endif
#if defined(Q8_VNNI) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__GNUC__)
#define INT8_STEP(acc) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x))
#define INT8_INSTRUCTION "vpdpbusd"
#elif defined(Q8_VNNI)
#define INT8_STEP(acc) acc = _mm256_dpbusd_avx_epi32(acc, w, x)
#define INT8_INSTRUCTION "vpdpbusd"
#else
/* Here the products do not depend on the accumulator: as intrinsics gcc computes them once before
 * the loop and keeps one chain of adds, a roof three times too high. Volatile asm keeps them in
 * every step of every chain. */
ALWAYS_INLINE __m256i int8_products(__m256i w, __m256i x, __m256i one16) {
    __m256i p;
    __asm__ volatile("vpmaddubsw %2, %1, %0\n\tvpmaddwd %3, %0, %0" : "=&x"(p) : "x"(w), "x"(x), "x"(one16));
    return p;
}
#define INT8_STEP(acc) acc = _mm256_add_epi32(acc, int8_products(w, x, one16))
#define INT8_INSTRUCTION "vpmaddubsw+vpmaddwd"
#endif
static float int8_steps(float seed) {
    const int8_vec w = INT8_SET1_8((char)(int)seed), x = INT8_SET1_8(3);
    const __m256i one16 = _mm256_set1_epi16(1);
    (void)one16;
    int8_vec a0 = INT8_SET1_32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
             a9 = a0, a10 = a0, a11 = a0;
    for (int s = 0; s < STEPS; s++) {
        INT8_STEP(a0); INT8_STEP(a1); INT8_STEP(a2); INT8_STEP(a3); INT8_STEP(a4); INT8_STEP(a5);
        INT8_STEP(a6); INT8_STEP(a7); INT8_STEP(a8); INT8_STEP(a9); INT8_STEP(a10); INT8_STEP(a11);
    }
    const int8_vec t = INT8_ADD(INT8_ADD(INT8_ADD(a0, a1), INT8_ADD(a2, a3)), INT8_ADD(INT8_ADD(a4, a5), INT8_ADD(a6, a7)));
    const int8_vec u = INT8_ADD(INT8_ADD(a8, a9), INT8_ADD(a10, a11));
    return (float)INT8_FIRST(INT8_ADD(t, u));
}

#if defined(KERNELS_BF16_DOT)
static float bf16_steps(float seed) {
    __m512 a[CHAINS];
    const __m512bh w = (__m512bh)_mm512_set1_epi16(0x3f80), x = (__m512bh)_mm512_set1_epi16((short)(0x3f00 + (int)seed));
    for (int c = 0; c < CHAINS; c++) a[c] = _mm512_set1_ps((float)c);
    for (int s = 0; s < STEPS; s++)
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) a[c] = _mm512_dpbf16_ps(a[c], w, x);
    __m512 t = a[0];
    for (int c = 1; c < CHAINS; c++) t = _mm512_add_ps(t, a[c]);
    return _mm512_reduce_add_ps(t);
}
#define BF16_MACS 32
#endif

#elif defined(KERNELS_NEON)
/* As arm/matmul_int8.c's dot16: 16 multiply-adds per step and chain. */
#if defined(__ARM_FEATURE_DOTPROD)
#define INT8_STEP(acc) acc = vdotq_s32(acc, w, x)
#define INT8_INSTRUCTION "sdot"
#else
#define INT8_STEP(acc) acc = vpadalq_s16(acc, vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)), vmull_high_s8(w, x)))
#define INT8_INSTRUCTION "smull+sadalp"
#endif
static float int8_steps(float seed) {
    int32x4_t a[CHAINS];
    const int8x16_t w = vdupq_n_s8((int8_t)(int)seed), x = vdupq_n_s8(3);
    for (int c = 0; c < CHAINS; c++) a[c] = vdupq_n_s32(c);
    for (int s = 0; s < STEPS; s++)
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) INT8_STEP(a[c]);
    int32x4_t t = a[0];
    for (int c = 1; c < CHAINS; c++) t = vaddq_s32(t, a[c]);
    return (float)vaddvq_s32(t);
}
#define INT8_MACS 16
#endif

#if defined(KERNELS_AVX2) || defined(KERNELS_NEON) /* the scalar build times no loop */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* fma_steps' vector, at the prefill kernels' width, and its operations (FMA(a, m, x) = a m + x). */
#if defined(KERNELS_AVX512)
typedef __m512 fma_vec;
#define FMA_LANES 16 /* the multiply-adds of one FMA step per chain */
#define FMA_SET1 _mm512_set1_ps
#define FMA(a, m, x) _mm512_fmadd_ps(a, m, x)
#define FMA_ADD _mm512_add_ps
#define FMA_SUM _mm512_reduce_add_ps
#elif defined(KERNELS_AVX2)
typedef __m256 fma_vec;
#define FMA_LANES 8
#define FMA_SET1 _mm256_set1_ps
#define FMA(a, m, x) _mm256_fmadd_ps(a, m, x)
#define FMA_ADD _mm256_add_ps
#define FMA_SUM hsum256
#elif defined(KERNELS_NEON)
typedef float32x4_t fma_vec;
#define FMA_LANES 4
#define FMA_SET1 vdupq_n_f32
#define FMA(a, m, x) vfmaq_f32(x, a, m)
#define FMA_ADD vaddq_f32
#define FMA_SUM vaddvq_f32
#endif

/* One look's worth of fp32 FMAs; returns a value that depends on every chain. */
static float fma_steps(float seed) {
    fma_vec a[CHAINS];
    const fma_vec m = FMA_SET1(0.999f), x = FMA_SET1(seed);
    for (int c = 0; c < CHAINS; c++) a[c] = FMA_SET1((float)c);
    for (int s = 0; s < STEPS; s++)
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) a[c] = FMA(a[c], m, x);
    fma_vec t = a[0];
    for (int c = 1; c < CHAINS; c++) t = FMA_ADD(t, a[c]);
    return FMA_SUM(t);
}

typedef struct {
    PeakKind kind;
    double deadline;
    long long steps[256]; /* per thread: looks done (each STEPS x CHAINS instructions) */
    float sink[256];
} PeakJob;

static void peak_item(void* ctx, int item, int thread) {
    PeakJob* j = ctx;
    (void)item;
    float s = 0.0f;
    long long looks = 0;
    while (now_s() < j->deadline) {
        const float seed = 1.0f + (float)(looks & 7);
        if (j->kind == PEAK_INT8_DOT) s += int8_steps(seed);
#if defined(KERNELS_BF16_DOT)
        else if (j->kind == PEAK_BF16_DOT) s += bf16_steps(seed);
#endif
        else s += fma_steps(seed);
        looks++;
    }
    j->steps[thread] += looks;
    j->sink[thread] += s;
}
#endif

double peak_ops(const Ops* k, WeightType type, int on_amx, double seconds, const char** instruction) {
    const int int8 = type == WEIGHT_Q8 || type == WEIGHT_Q4;
    const int bf16_dot = type == WEIGHT_BF16 && k->bf16_activations;
#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
    if (on_amx) {
        *instruction = "amx";
        return 0.0;
    }
    PeakJob job = {.kind = int8 ? PEAK_INT8_DOT : bf16_dot ? PEAK_BF16_DOT : PEAK_FMA};
    double macs = int8 ? INT8_MACS : FMA_LANES;
    *instruction = int8 ? INT8_INSTRUCTION : "fp32 fma";
#if defined(KERNELS_BF16_DOT)
    if (bf16_dot) {
        macs = BF16_MACS;
        *instruction = "vdpbf16ps";
    }
#endif
    const int nt = k->threads(k);
    const double t0 = now_s();
    job.deadline = t0 + seconds;
    k->parallel_for(k, nt, peak_item, &job);
    const double wall = now_s() - t0;
    long long looks = 0;
    for (int t = 0; t < nt && t < 256; t++) looks += job.steps[t];
    return (double)looks * STEPS * CHAINS * macs * 2.0 / wall;
#else
    (void)k, (void)int8, (void)bf16_dot, (void)on_amx, (void)seconds;
    *instruction = "scalar";
    return 0.0;
#endif
}
