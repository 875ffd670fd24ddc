/* norm_precision.c: the RMSNorm precision lab. `make norm-precision` builds and runs it; it prints
 * a Markdown report (docs/norm-precision.md is its output) on three questions:
 *
 *   1. the sum of squares, mean(x^2)'s numerator, accumulated in fp32 (in the scalar reference's
 *      order, and in the AVX2 twin's 16 lanes), bf16 and fp16, against fp64, for n = 128 .. 5120
 *      (Qwen3's head_dim and hidden sizes);
 *   2. 1/sqrt: the approximate instruction _mm_rsqrt_ps (about 12 bits) alone, with one
 *      Newton-Raphson step, and 1.0f / sqrtf (what kernels/norm.c uses), against fp64;
 *   3. Hugging Face's order in a bf16 model (normalise in fp32, cast to bf16, multiply by the bf16
 *      weight, the product rounded to bf16) against this engine's fp32 path (kernels/norm.c's
 *      rmsnorm, w * (x * scale) in fp32), both against fp64.
 *
 * The activations are a seeded distribution, not a model's: every value N(0, 1), except a few
 * outlier channels (1 in 200, at least one) of magnitude 20 to 60, as the massive activations of
 * an LLM's residual stream. The same seed gives the same report on every machine whose libm
 * gives the same sqrt and exp (both are correctly rounded or nearly so). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define HAVE_RSQRT_INSTRUCTION 1
#endif

#define TRIALS 400          /* vectors per size */
#define MAX_N 5120
static const int SIZES[] = {128, 256, 512, 1024, 2048, 2560, 4096, 5120};
#define N_SIZES (int)(sizeof SIZES / sizeof SIZES[0])

/* ---- seeded activations ------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double uniform01(void) { /* xorshift64*: (0, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0) + 1e-300;
}

static double normal01(void) { /* Box-Muller */
    return sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01());
}

/* n activations: N(0, 1), and every 200th channel (from a seeded offset) an outlier of magnitude
 * 20 to 60 with a random sign. Rounded to fp32, as the engine holds them. */
static void activations(float* x, int n) {
    int offset = (int)(uniform01() * 200);
    for (int i = 0; i < n; i++) x[i] = (float)normal01();
    for (int i = offset % n; i < n; i += 200) x[i] = (float)((uniform01() < 0.5 ? -1 : 1) * (20 + 40 * uniform01()));
}

/* ---- number formats ------------------------------------------------------------------------ */

/* v rounded to nearest-even in a binary format with `bits` significant bits, smallest normal
 * exponent emin (2^emin) and largest finite value max_finite: bf16 (8, -126), fp16 (11, -14). */
static double round_to(double v, int bits, int emin, double max_finite) {
    if (v == 0.0 || !isfinite(v)) return v;
    int e;
    frexp(v, &e); /* v = m * 2^e, 0.5 <= |m| < 1 */
    if (e - 1 < emin) e = emin + 1; /* subnormals: a fixed quantum */
    double quantum = ldexp(1.0, e - bits);
    double r = nearbyint(v / quantum) * quantum;
    return fabs(r) > max_finite ? copysign(INFINITY, v) : r;
}

static double to_bf16(double v) { return round_to(v, 8, -126, 3.3895313892515355e38); }
static double to_f16(double v) { return round_to(v, 11, -14, 65504.0); }
static double to_f32(double v) { return (float)v; }

/* ---- 1. the sum of squares ----------------------------------------------------------------- */

/* In one accumulator, each square and each sum rounded by `round` (the scalar reference's order). */
static double sum_squares_in(const float* x, int n, double (*round)(double)) {
    double acc = 0.0;
    for (int i = 0; i < n; i++) acc = round(acc + round((double)x[i] * x[i]));
    return acc;
}

/* fp32 as the AVX2 twin sums: 16 lanes of fused multiply-adds, then the lanes added together
 * (kernels/norm.c: two 8-lane accumulators, hsum256 of their sum). */
static double sum_squares_16_lanes(const float* x, int n) {
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) lane[k] = fmaf(x[i + k], x[i + k], lane[k]);
    float v[8];
    for (int k = 0; k < 8; k++) v[k] = lane[k] + lane[k + 8];
    float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    for (; i < n; i++) s += x[i] * x[i];
    return s;
}

static double sum_squares_f64(const float* x, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static double largest_sum = 0.0; /* over every vector of the sum-of-squares table */

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

/* "median / max" of n relative errors (sorted in place), or "overflow (k of n)" when some are
 * infinite. */
static void print_errors(double* e, int n) {
    int inf = 0;
    for (int i = 0; i < n; i++) inf += !isfinite(e[i]);
    if (inf) {
        printf(" overflow (%d of %d) |", inf, n);
        return;
    }
    qsort(e, (size_t)n, sizeof *e, cmp_double);
    printf(" %.1e / %.1e |", e[n / 2], e[n - 1]);
}

static void sum_of_squares_table(float* x) {
    enum { F32_SEQ, F32_LANES, BF16, F16, N_WAYS };
    static double err[N_WAYS][TRIALS];
    printf("| n | fp32, one accumulator (scalar reference) | fp32, 16 lanes (AVX2 twin) | bf16 | fp16 |\n");
    printf("|---:|---|---|---|---|\n");
    for (int s = 0; s < N_SIZES; s++) {
        const int n = SIZES[s];
        for (int t = 0; t < TRIALS; t++) {
            activations(x, n);
            const double exact = sum_squares_f64(x, n);
            largest_sum = exact > largest_sum ? exact : largest_sum;
            const double got[N_WAYS] = {sum_squares_in(x, n, to_f32), sum_squares_16_lanes(x, n),
                                        sum_squares_in(x, n, to_bf16), sum_squares_in(x, n, to_f16)};
            for (int w = 0; w < N_WAYS; w++) err[w][t] = isfinite(got[w]) ? fabs(got[w] - exact) / exact : INFINITY;
        }
        printf("| %d |", n);
        for (int w = 0; w < N_WAYS; w++) print_errors(err[w], TRIALS);
        printf("\n");
    }
}

/* ---- 2. 1/sqrt ----------------------------------------------------------------------------- */

#define RSQRT_POINTS 100000

static void rsqrt_table(void) {
    static double err[3][RSQRT_POINTS];
    for (int i = 0; i < RSQRT_POINTS; i++) {
        /* mean(x^2) + eps from 1e-6 to 1e4, log-uniform */
        const float m = (float)pow(10.0, -6.0 + 10.0 * (i + 0.5) / RSQRT_POINTS);
        const double exact = 1.0 / sqrt((double)m);
        const float by_division = 1.0f / sqrtf(m);
        err[2][i] = fabs(by_division - exact) / exact;
#ifdef HAVE_RSQRT_INSTRUCTION
        const float y0 = _mm_cvtss_f32(_mm_rsqrt_ss(_mm_set_ss(m)));
        const float y1 = y0 * (1.5f - 0.5f * m * y0 * y0);
        err[0][i] = fabs(y0 - exact) / exact;
        err[1][i] = fabs(y1 - exact) / exact;
#endif
    }
    printf("| 1/sqrt(m) in fp32 | median relative error | max relative error | correct bits (max) |\n");
    printf("|---|---|---|---|\n");
    const char* names[3] = {"`_mm_rsqrt_ps` alone", "`_mm_rsqrt_ps` + one Newton step", "`1.0f / sqrtf(m)` (kernels/norm.c)"};
    for (int w = 0; w < 3; w++) {
#ifndef HAVE_RSQRT_INSTRUCTION
        if (w < 2) {
            printf("| %s | not measured: not an x86 build | | |\n", names[w]);
            continue;
        }
#endif
        qsort(err[w], RSQRT_POINTS, sizeof(double), cmp_double);
        const double worst = err[w][RSQRT_POINTS - 1];
        printf("| %s | %.1e | %.1e | %.1f |\n", names[w], err[w][RSQRT_POINTS / 2], worst, -log2(worst));
    }
}

/* ---- 3. Hugging Face's bf16 order against the engine's fp32 path ---------------------------- */

static void order_table(float* x) {
    static float w[MAX_N], out[MAX_N];
    static double err[2][TRIALS], diff[TRIALS];
    const int sizes[] = {128, 1024, 5120};
    double ratio[3];
    const float eps = 1e-6f;
    printf("| n | engine fp32: `w * (x * scale)` | HF bf16: `bf16(w * bf16(x * scale))` | HF vs engine |\n");
    printf("|---:|---|---|---|\n");
    for (int s = 0; s < 3; s++) {
        const int n = sizes[s];
        for (int t = 0; t < TRIALS; t++) {
            activations(x, n);
            /* a bf16 model's activations and weights are bf16 values; the weight near 1 */
            for (int i = 0; i < n; i++) {
                x[i] = (float)to_bf16(x[i]);
                w[i] = (float)to_bf16(1.0 + 0.2 * normal01());
            }
            rmsnorm(out, x, w, n, eps);
            /* HF: variance and the scale in fp32, the normalised value cast to bf16, then times w */
            float ss = 0.0f;
            for (int i = 0; i < n; i++) ss += x[i] * x[i];
            const float scale = 1.0f / sqrtf(ss / (float)n + eps);
            const double exact_scale = 1.0 / sqrt(sum_squares_f64(x, n) / n + (double)eps);
            double worst[2] = {0, 0}, gap = 0, top = 0;
            for (int i = 0; i < n; i++) {
                const double exact = (double)w[i] * ((double)x[i] * exact_scale);
                const double hf = to_bf16((double)w[i] * to_bf16((double)(x[i] * scale)));
                top = fabs(exact) > top ? fabs(exact) : top;
                worst[0] = fmax(worst[0], fabs(out[i] - exact));
                worst[1] = fmax(worst[1], fabs(hf - exact));
                gap = fmax(gap, fabs(hf - out[i]));
            }
            err[0][t] = worst[0] / top;
            err[1][t] = worst[1] / top;
            diff[t] = gap / top;
        }
        printf("| %d |", n);
        print_errors(err[0], TRIALS);
        print_errors(err[1], TRIALS);
        print_errors(diff, TRIALS);
        printf("\n");
        ratio[s] = err[1][TRIALS / 2] / err[0][TRIALS / 2]; /* print_errors sorted them */
    }
    printf("\nThe median error of Hugging Face's bf16 order is %.0f, %.0f and %.0f times the engine's fp32 "
           "path's at n = %d, %d and %d: bf16 keeps 8 significant bits, and its two roundings dominate.\n",
           ratio[0], ratio[1], ratio[2], sizes[0], sizes[1], sizes[2]);
}

int main(void) {
    static float x[MAX_N];
    printf("# RMSNorm precision\n\n"
           "Generated by `make -s norm-precision > docs/norm-precision.md` (tools/norm_precision.c); "
           "the numbers are what that program measured, on a seeded distribution, not a model's "
           "activations: every value N(0, 1) except every 200th channel, an outlier of magnitude 20 "
           "to 60 (the massive activations of an LLM's residual stream). %d vectors per size; "
           "each cell is the median / the largest relative error over them.\n\n", TRIALS);
    printf("## 1. The sum of squares against fp64\n\n"
           "mean(x^2)'s sum, each square and each partial sum rounded to the format (round to "
           "nearest even), against the exact sum of the same fp32 values. Once the sum is large, its "
           "spacing (at 32768: 256 in bf16, 32 in fp16, 0.004 in fp32) swallows squares of order 1, "
           "so the error grows with n. fp16 also cannot hold a sum above 65504 (a cell then says "
           "overflow: the sum is infinite and RMSNorm's scale 0).\n\n");
    sum_of_squares_table(x);
    printf("\nThe largest exact sum of squares in these vectors: %.0f (fp16's largest finite value: 65504).\n",
           largest_sum);
    printf("\n## 2. 1/sqrt against fp64\n\n"
           "m = mean(x^2) + eps from 1e-6 to 1e4 (%d points, log-uniform). The instruction is x86's "
           "(SSE `rsqrtps`, Intel documents a relative error below 1.5 * 2^-12); one Newton step is "
           "`y * (1.5 - 0.5 * m * y * y)`. kernels/norm.c computes 1/sqrt once per vector, so the "
           "exact form costs nothing there.\n\n", RSQRT_POINTS);
    rsqrt_table();
    printf("\n## 3. Hugging Face's bf16 order against this engine's fp32 path\n\n"
           "A bf16 model: activations and weights (1 + N(0, 0.2^2)) are bf16 values. The engine "
           "(kernels/norm.c's `rmsnorm`, this build's SIMD twin) computes `w * (x * scale)` in fp32; "
           "Hugging Face (QWEN3.md 2.1) normalises in fp32, casts to bf16, multiplies by the bf16 "
           "weight, and the product is bf16 again. Error of the output vector against fp64: "
           "max |out - exact| / max |exact|, median / largest over the vectors.\n\n");
    order_table(x);
    return 0;
}
