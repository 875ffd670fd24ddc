/* tests/test_norm_properties.c: what RMSNorm is, as properties of norm.c's rmsnorm (the SIMD twin
 * where the build has one) and rmsnorm_scalar, for a student of the four uses in forward():
 *   - scale invariance: RMSNorm(alpha x) = RMSNorm(x) while alpha^2 mean(x^2) is far above eps;
 *   - a zero vector gives a finite zero (eps keeps 1/sqrt away from 1/0);
 *   - with w = 1 the output has RMS 1 (while mean(x^2) is far above eps);
 *   - LayerNorm without a bias is RMSNorm of the centred vector (checked against a LayerNorm
 *     written here in double), and so is the lab's NORM_VARIANT_CENTER (cli/norm_lab.h).
 * Prints "N passed, M failed" and exits non-zero on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/norm_lab.h"
#include "kernels/kernels.h"

#include "tests/check.h"

static unsigned long long rng = 0x2545F4914F6CDD1Dull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

typedef void (*NormFn)(float* out, const float* x, const float* w, int n, float eps);
static const struct { const char* name; NormFn fn; } norms[] = {{"rmsnorm", rmsnorm}, {"rmsnorm_scalar", rmsnorm_scalar}};
#define N_NORMS 2
/* D-sized and head-sized vectors of the real models and the shipped one, and awkward lengths. */
static const int sizes[] = {1, 7, 48, 128, 192, 1024, 1027};
#define N_SIZES ((int)(sizeof sizes / sizeof sizes[0]))

/* A value of magnitude 0.25 .. 1 and a random sign: mean(x^2) stays well above 0 even for n = 1. */
static float away_from_zero(void) {
    const float m = 0.25f + 0.375f * (frand() + 1.0f);
    return frand() < 0.0f ? -m : m;
}

static double max_abs(const float* a, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

static double max_diff(const float* a, const float* b, int n) {
    double e = 0;
    for (int i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - b[i]));
    return e;
}

static double mean_square(const float* x, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    return ss / n;
}

/* x of magnitude 0.25 .. 1 has mean(x^2) >= 1/16; eps 1e-12 makes alpha^2 mean(x^2) at least
 * 6e4 eps for alpha = 1e-3, so eps moves the result by under 1e-5 relative (typically 2e-6). Tolerance 1e-5 of max|out|: float
 * rounding of alpha x, the sum of squares and the products. */
static void test_scale_invariance(float* x, float* w, float* a, float* b, float* ax) {
    const float alphas[] = {1e-3f, 1.0f, 1e3f};
    for (int f = 0; f < N_NORMS; f++)
        for (int k = 0; k < N_SIZES; k++) {
            const int n = sizes[k];
            for (int i = 0; i < n; i++) x[i] = away_from_zero(), w[i] = frand();
            norms[f].fn(a, x, w, n, 1e-12f);
            int ok = 1;
            for (int j = 0; j < 3; j++) {
                for (int i = 0; i < n; i++) ax[i] = alphas[j] * x[i];
                ok &= (double)alphas[j] * alphas[j] * mean_square(x, n) > 5e4 * 1e-12; /* the premise */
                norms[f].fn(b, ax, w, n, 1e-12f);
                ok &= max_diff(a, b, n) <= 1e-5 * max_abs(a, n);
            }
            char what[96];
            snprintf(what, sizeof what, "%s n=%d: scale invariant for alpha 1e-3, 1, 1e3", norms[f].name, n);
            check(ok, what);
        }
}

static void test_zero_vector(float* x, float* w, float* a) {
    for (int f = 0; f < N_NORMS; f++)
        for (int k = 0; k < N_SIZES; k++) {
            const int n = sizes[k];
            for (int i = 0; i < n; i++) x[i] = 0.0f, w[i] = frand(), a[i] = 1.0f;
            norms[f].fn(a, x, w, n, 1e-6f);
            int ok = 1;
            for (int i = 0; i < n; i++) ok &= isfinite(a[i]) && a[i] == 0.0f;
            char what[96];
            snprintf(what, sizeof what, "%s n=%d: a zero vector gives a finite zero (eps 1e-6)", norms[f].name, n);
            check(ok, what);
        }
}

/* With w = 1, rms(out) = sqrt(mean(x^2) / (mean(x^2) + eps)): for x of magnitude 0.75 .. 3 and eps
 * 1e-8 the formula alone is under 1e-8 from 1; the rest of the 1e-6 is the float rounding of the
 * sum of squares and of the products. */
static void test_unit_rms(float* x, float* w, float* a) {
    for (int f = 0; f < N_NORMS; f++)
        for (int k = 0; k < N_SIZES; k++) {
            const int n = sizes[k];
            for (int i = 0; i < n; i++) x[i] = 3.0f * away_from_zero(), w[i] = 1.0f;
            norms[f].fn(a, x, w, n, 1e-8f);
            const double r = sqrt(mean_square(a, n));
            char what[96];
            snprintf(what, sizeof what, "%s n=%d: w = 1 gives rms(out) = 1 (%.9f)", norms[f].name, n, r);
            check(mean_square(x, n) > 1e6 * 1e-8 && fabs(r - 1.0) <= 1e-6, what);
        }
}

/* LayerNorm without a bias, in double, written from its definition: (x - mean) / sqrt(var + eps) * w. */
static void layernorm_double(double* out, const float* x, const float* w, int n, double eps) {
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= n;
    for (int i = 0; i < n; i++) out[i] = (x[i] - mean) / sqrt(var + eps) * w[i];
}

/* x with a large mean (2 + noise), so that centring matters: RMSNorm of x itself differs from
 * LayerNorm by far more than the tolerance (checked too, so the test cannot pass vacuously). */
static void test_layernorm_identity(float* x, float* w, float* a, float* c) {
    double* want = malloc(1027 * sizeof(double));
    for (int f = 0; f < N_NORMS + 1; f++)
        for (int k = 1; k < N_SIZES; k++) {
            const int n = sizes[k];
            for (int i = 0; i < n; i++) x[i] = 2.0f + frand(), w[i] = frand();
            layernorm_double(want, x, w, n, 1e-6);
            double m = 0, e = 0, e_plain = 0;
            if (f < N_NORMS) {
                float mean = 0.0f;
                for (int i = 0; i < n; i++) mean += x[i];
                mean /= (float)n;
                for (int i = 0; i < n; i++) c[i] = x[i] - mean;
                norms[f].fn(a, c, w, n, 1e-6f);
            } else {
                rmsnorm_variant_rows(a, x, w, 1, n, 1e-6f, NORM_VARIANT_CENTER);
            }
            float* plain = c;
            rmsnorm_scalar(plain, x, w, n, 1e-6f);
            for (int i = 0; i < n; i++) {
                m = fmax(m, fabs(want[i]));
                e = fmax(e, fabs(a[i] - want[i]));
                e_plain = fmax(e_plain, fabs(plain[i] - want[i]));
            }
            char what[112];
            snprintf(what, sizeof what, "%s n=%d: RMSNorm(x - mean x) = LayerNorm without bias",
                     f < N_NORMS ? norms[f].name : "rmsnorm_variant_rows(CENTER)", n);
            /* 1e-5 of max|out|: the float mean and sum of squares of n values around 2 */
            check(e <= 1e-5 * m && e_plain > 1e-2 * m, what);
        }
    free(want);
}

int main(void) {
    enum { MAXN = 1027 };
    float *x = malloc(MAXN * sizeof(float)), *w = malloc(MAXN * sizeof(float));
    float *a = malloc(MAXN * sizeof(float)), *b = malloc(MAXN * sizeof(float)), *c = malloc(MAXN * sizeof(float));
    test_scale_invariance(x, w, a, b, c);
    test_zero_vector(x, w, a);
    test_unit_rms(x, w, a);
    test_layernorm_identity(x, w, a, c);
    free(x), free(w), free(a), free(b), free(c);
    return checks_done();
}
