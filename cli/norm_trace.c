/* norm_trace.c: `--show-norms`, one line per RMSNorm call site at one position (norm_trace.h).
 * Not on the speed path: forward() checks one pointer per call site when the trace is off. */
#include "norm_trace.h"

#include <math.h>

#include "kernels/kernels.h"

static double rms(const float* x, int n) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    return sqrt(ss / n);
}

/* "value" for one vector, "min..max" over several (QK-Norm's heads), in a column of `width`
 * characters (0: the last column, unpadded). */
static void print_cell(FILE* f, double lo, double hi, int many, int width) {
    char cell[40];
    if (many) snprintf(cell, sizeof cell, "%.4g..%.4g", lo, hi);
    else snprintf(cell, sizeof cell, "%.4g", lo);
    fprintf(f, "%-*s", width, cell);
}

void norm_trace_see(NormTrace* tr, int use, const char* site, int layer, const float* in, const float* weight,
                    int per_row, int width, int p0, int nb, float eps) {
    if (tr->pos < p0 || tr->pos >= p0 + nb) return;
    const float* row = in + (size_t)(tr->pos - p0) * (size_t)per_row * (size_t)width;
    float* out = tr->scratch;
    double lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {-INFINITY, -INFINITY, -INFINITY};
    for (int v = 0; v < per_row; v++) {
        const float* x = row + (size_t)v * (size_t)width;
        rmsnorm_scalar(out, x, weight, width, eps);
        const double r = rms(x, width);
        const double cols[3] = {r, 1.0 / sqrt(r * r + (double)eps), rms(out, width)};
        for (int k = 0; k < 3; k++) {
            lo[k] = cols[k] < lo[k] ? cols[k] : lo[k];
            hi[k] = cols[k] > hi[k] ? cols[k] : hi[k];
        }
    }
    if (tr->lines++ == 0)
        fprintf(tr->out,
                "RMSNorm at each call site, position %d: out = w * (x * scale), scale = 1/sqrt(mean(x^2) + eps),\n"
                "eps %g; over every head for QK-Norm (min..max)\n"
                "layer  use  site           vectors    rms(in)          scale            rms(w)    rms(out)\n",
                tr->pos, (double)eps);
    char where[16], shape[32];
    if (layer >= 0) snprintf(where, sizeof where, "%5d", layer);
    else snprintf(where, sizeof where, "%5s", "-");
    snprintf(shape, sizeof shape, "%d x %d", per_row, width);
    fprintf(tr->out, "%s  %d    %-13s  %-9s  ", where, use, site, shape);
    print_cell(tr->out, lo[0], hi[0], per_row > 1, 17);
    print_cell(tr->out, lo[1], hi[1], per_row > 1, 17);
    fprintf(tr->out, "%-8.4g  ", rms(weight, width));
    print_cell(tr->out, lo[2], hi[2], per_row > 1, 0);
    fputc('\n', tr->out);
}
