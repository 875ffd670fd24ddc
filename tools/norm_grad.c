/* norm_grad.c: `make norm-grad`, RMSNorm's backward pass (kernels/norm.c, rmsnorm_backward) worked
 * on one small vector, for the handout (docs/rmsnorm.md, "The backward pass"): each dx[i] beside
 * the slope a central difference measures, then x . dx as eps and the size of x change. Usage:
 *   build/tools/norm_grad [n] [eps]      defaults: 8 values, eps 1e-6
 * Deterministic: the same numbers on every run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"

/* L = sum_i dy[i] * RMSNorm(x)[i], in double: what the gradient is of. */
static double loss(const double* x, const float* w, const float* dy, int n, double eps) {
    double ss = 0.0, l = 0.0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    for (int i = 0; i < n; i++) l += dy[i] * w[i] * x[i] / sqrt(ss / n + eps);
    return l;
}

int main(int argc, char** argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 8;
    const double eps = argc > 2 ? atof(argv[2]) : 1e-6;
    if (n < 1 || n > 4096 || !(eps >= 0)) {
        fprintf(stderr, "usage: norm_grad [n: 1..4096] [eps >= 0]\n");
        return 2;
    }
    float *x = malloc(n * sizeof(float)), *w = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float));
    float *dx = malloc(n * sizeof(float)), *dw = calloc(n, sizeof(float));
    double* xd = malloc(n * sizeof(double));
    for (int i = 0; i < n; i++) { /* a fixed, unremarkable vector */
        x[i] = (float)(0.5 * sin(1.0 + 2.3 * i) + 0.1 * i / n);
        w[i] = (float)(1.0 + 0.3 * cos(0.7 * i));
        dy[i] = (float)cos(0.9 + 1.7 * i);
        xd[i] = x[i];
    }
    rmsnorm_backward(dx, dw, dy, x, w, 1, n, (float)eps);
    printf("RMSNorm backward, n = %d, eps = %g: dx from the formula against the slope of L = sum dy * y\n", n, eps);
    printf("%4s %10s %10s %10s %13s %13s %10s\n", "i", "x", "w", "dy", "dx (formula)", "dx (slope)", "dw");
    for (int i = 0; i < n && i < 16; i++) {
        const double h = 1e-6, keep = xd[i];
        xd[i] = keep + h;
        const double lp = loss(xd, w, dy, n, eps);
        xd[i] = keep - h;
        const double lm = loss(xd, w, dy, n, eps);
        xd[i] = keep;
        printf("%4d %10.5f %10.5f %10.5f %13.7f %13.7f %10.5f\n", i, x[i], w[i], dy[i], dx[i], (lp - lm) / (2 * h),
               dw[i]);
    }
    printf("\nx . dx (0 when the norm cannot see x's scale) as x is scaled by s, for three eps:\n");
    printf("%8s %14s %14s %14s\n", "s", "eps = 0", "eps = 1e-6", "eps = 1e-2");
    const double scales[] = {1.0, 0.1, 0.01, 0.001};
    const double epss[] = {0.0, 1e-6, 1e-2};
    for (int k = 0; k < 4; k++) {
        printf("%8g", scales[k]);
        for (int e = 0; e < 3; e++) {
            float* xs = malloc(n * sizeof(float));
            for (int i = 0; i < n; i++) xs[i] = (float)(x[i] * scales[k]);
            rmsnorm_backward(dx, dw, dy, xs, w, 1, n, (float)epss[e]);
            double dot = 0;
            for (int i = 0; i < n; i++) dot += (double)xs[i] * dx[i];
            printf(" %14.3e", dot);
            free(xs);
        }
        printf("\n");
    }
    free(x), free(w), free(dy), free(dx), free(dw), free(xd);
    return 0;
}
