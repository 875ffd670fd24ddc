/* tests/test_norm_backward.c: RMSNorm's backward pass (kernels/norm.c, rmsnorm_backward) against
 * central finite differences of the forward computed in double precision, and the property the
 * formula implies: at eps = 0 the norm is scale-invariant, so its gradient is orthogonal to x
 * (x . dx = 0); with eps > 0, x . dx = n * mean(g * x^) * eps / (mean(x^2) + eps). Each check
 * would fail on a plausible slip: the mean's factor 1/n dropped, r^3 for r, the weight left out
 * of g, dw not summed over the rows. Prints "N passed, M failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/check.h"

static unsigned long long rng = 0x243F6A8885A308D3ull;
static double urand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

/* L = sum_i dy[i] * y[i], y = RMSNorm(x) in double: the scalar whose gradient the backward gives. */
static double loss(const double* x, const double* w, const double* dy, int n, double eps) {
    double ss = 0.0, l = 0.0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) l += dy[i] * w[i] * x[i] * inv;
    return l;
}

/* d loss / d v[i] by central differences, v being x or w (the other arrays as they are). */
static double difference(double* v, int i, double h, const double* x, const double* w, const double* dy, int n,
                         double eps) {
    const double keep = v[i];
    v[i] = keep + h;
    const double plus = loss(x, w, dy, n, eps);
    v[i] = keep - h;
    const double minus = loss(x, w, dy, n, eps);
    v[i] = keep;
    return (plus - minus) / (2 * h);
}

/* dx and dw of one row, both against central differences in double (step h relative to each
 * value), within 1e-4 of the size of the terms the formula adds: max |w dy| / r for dx (its two
 * terms can cancel, as for n = 1, where the gradient is eps-small), max |dy x^| for dw. fp32's
 * rounding of the formula is about 1e-6 of that; the differences' own error about 1e-9. */
static void check_against_differences(int n, double scale, double eps) {
    float *x = calloc(n, sizeof(float)), *w = calloc(n, sizeof(float)), *dy = calloc(n, sizeof(float));
    float *dx = calloc(n, sizeof(float)), *dw = calloc(n, sizeof(float));
    double *xd = calloc(n, sizeof(double)), *wd = calloc(n, sizeof(double)), *dyd = calloc(n, sizeof(double));
    for (int i = 0; i < n; i++) {
        xd[i] = x[i] = (float)(urand() * scale);
        wd[i] = w[i] = (float)(1.0 + 0.5 * urand());
        dyd[i] = dy[i] = (float)urand();
    }
    rmsnorm_backward(dx, dw, dy, x, w, 1, n, (float)eps);
    double ms = 0, worst_x = 0, worst_w = 0, big_x = 0, big_w = 0;
    for (int i = 0; i < n; i++) ms += xd[i] * xd[i] / n;
    for (int i = 0; i < n; i++) {
        big_x = fmax(big_x, fabs(wd[i] * dyd[i]) / sqrt(ms + eps));
        big_w = fmax(big_w, fabs(dyd[i] * xd[i]) / sqrt(ms + eps));
    }
    for (int i = 0; i < n; i++) {
        const double num_x = difference(xd, i, 1e-5 * (fabs(xd[i]) + scale), xd, wd, dyd, n, eps);
        const double num_w = difference(wd, i, 1e-5, xd, wd, dyd, n, eps);
        worst_x = fmax(worst_x, fabs(dx[i] - num_x));
        worst_w = fmax(worst_w, fabs(dw[i] - num_w));
    }
    char what[160];
    snprintf(what, sizeof what, "n=%d, |x| ~ %g, eps=%g: dx and dw against central differences (worst %.2g and %.2g of "
             "the terms' size)", n, scale, eps, worst_x / big_x, worst_w / big_w);
    check(worst_x <= 1e-4 * big_x && worst_w <= 1e-4 * big_w, what);
    free(x), free(w), free(dy), free(dx), free(dw), free(xd), free(wd), free(dyd);
}

/* x . dx against n * mean(g * x^) * eps / (mean(x^2) + eps), in double, for eps = 0 and above:
 * 0 with no eps, and the closed form with it, both to 1e-5 of the terms that cancel in it
 * (|x| |g| / r: fp32's rounding). */
static void check_orthogonality(int n, double scale) {
    const double epss[] = {0.0, 1e-6, 1e-2, 1.0};
    float *x = calloc(n, sizeof(float)), *w = calloc(n, sizeof(float)), *dy = calloc(n, sizeof(float));
    float *dx = calloc(n, sizeof(float)), *dw = calloc(n, sizeof(float));
    for (int i = 0; i < n; i++) {
        x[i] = (float)(urand() * scale);
        w[i] = (float)(1.0 + 0.5 * urand());
        dy[i] = (float)urand();
    }
    for (int e = 0; e < 4; e++) {
        const double eps = epss[e];
        rmsnorm_backward(dx, dw, dy, x, w, 1, n, (float)eps);
        double ms = 0, dot = 0, nx = 0, ng = 0, gxh = 0;
        for (int i = 0; i < n; i++) ms += (double)x[i] * x[i] / n;
        const double r = sqrt(ms + eps);
        for (int i = 0; i < n; i++) {
            dot += (double)x[i] * dx[i];
            nx += (double)x[i] * x[i];
            ng += (double)w[i] * dy[i] * w[i] * dy[i];
            gxh += (double)w[i] * dy[i] * x[i] / r;
        }
        const double want = gxh * eps / (ms + eps); /* n * mean(g * x^) = sum(g * x^) */
        const double tol = 1e-5 * sqrt(nx * ng) / r;
        char what[160];
        snprintf(what, sizeof what, "n=%d, |x| ~ %g, eps=%g: x.dx = %.3g, the closed form %.3g", n, scale, eps, dot,
                 want);
        check(fabs(dot - want) <= tol && (eps > 0 || fabs(dot) <= tol), what);
    }
    free(x), free(w), free(dy), free(dx), free(dw);
}

/* Three rows at once: each row's dx as alone, and dw the sum of the rows' dy * x^ (the weight is
 * shared by every row), added to what dw held. */
static void check_rows_sum(void) {
    enum { ROWS = 3, N = 16 };
    float x[ROWS * N], dy[ROWS * N], w[N], dx[ROWS * N], dx1[N], dw[N], dw1[N];
    double want[N];
    for (int i = 0; i < ROWS * N; i++) x[i] = (float)urand(), dy[i] = (float)urand();
    for (int i = 0; i < N; i++) w[i] = (float)(1.0 + 0.5 * urand()), dw[i] = 1.0f, want[i] = 1.0;
    rmsnorm_backward(dx, dw, dy, x, w, ROWS, N, 1e-6f);
    int ok = 1;
    for (int r = 0; r < ROWS; r++) {
        memset(dw1, 0, sizeof dw1);
        rmsnorm_backward(dx1, dw1, dy + r * N, x + r * N, w, 1, N, 1e-6f);
        ok &= memcmp(dx1, dx + r * N, sizeof dx1) == 0;
        for (int i = 0; i < N; i++) want[i] += dw1[i];
    }
    for (int i = 0; i < N; i++) ok &= fabs(dw[i] - want[i]) <= 1e-6 * (1.0 + fabs(want[i]));
    check(ok, "three rows at once: each row's dx as alone, dw += the sum of the rows' dy * x^");
}

int main(void) {
    const int ns[] = {1, 2, 7, 48, 192, 1024};
    for (int k = 0; k < 6; k++) {
        check_against_differences(ns[k], 1.0, 1e-6);
        check_against_differences(ns[k], 0.01, 1e-6);  /* eps no longer negligible beside mean(x^2) */
        check_against_differences(ns[k], 30.0, 0.0);
        check_orthogonality(ns[k], 1.0);
        check_orthogonality(ns[k], 0.05);
    }
    check_rows_sum();
    return checks_done();
}
