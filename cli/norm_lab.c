/* norm_lab.c: the RMSNorm lab's rmsnorm op (norm_lab.h). */
#include "norm_lab.h"

#include <math.h>
#include <string.h>

/* The formula of kernels/norm.c with one part switched at a time, written out so that each switch
 * is one visible change. The centring is the only difference between RMSNorm and LayerNorm without
 * a bias: mean((x - mean x)^2) is the variance. */
void rmsnorm_variant_rows(float* out, const float* x, const float* w, int n_rows, int n, float eps, int variant) {
    for (int r = 0; r < n_rows; r++) {
        const float* xr = x + (size_t)r * n;
        float* o = out + (size_t)r * n;
        float mean = 0.0f;
        if (variant & NORM_VARIANT_CENTER) {
            for (int i = 0; i < n; i++) mean += xr[i];
            mean /= (float)n;
        }
        float ss = 0.0f;
        for (int i = 0; i < n; i++) ss += (xr[i] - mean) * (xr[i] - mean);
        const float inv = (variant & NORM_VARIANT_NO_SCALE) ? 1.0f : 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++) o[i] = ((variant & NORM_VARIANT_UNIT_WEIGHT) ? 1.0f : w[i]) * ((xr[i] - mean) * inv);
    }
}

/* One call site (NormSite.use) with the lab's switches: left out, changed, or the model's own op
 * with the lab's eps. */
static void lab_rmsnorm(const Ops* o, const NormSite* at, float* out, const float* x, const float* w, int n,
                        float eps) {
    static const int skip_bit[5] = {0, NORM_SKIP_PRE, NORM_SKIP_QK, NORM_SKIP_PRE, NORM_SKIP_FINAL};
    const NormLabOps* l = (const NormLabOps*)o;
    const int vectors = at->rows * at->per_row;
    if (l->lab.has_eps) eps = l->lab.eps;
    if (l->lab.skip & skip_bit[at->use]) {
        if (out != x) memcpy(out, x, (size_t)vectors * (size_t)n * sizeof(float));
    } else if (l->lab.variant) {
        rmsnorm_variant_rows(out, x, w, vectors, n, eps, l->lab.variant);
    } else {
        l->inner->rmsnorm(l->inner, at, out, x, w, n, eps);
    }
}

void norm_lab_attach(NormLabOps* l, Transformer* t, const NormLab* lab) {
    if (!lab->skip && !lab->variant && !lab->has_eps) return;
    l->inner = t->ops;
    l->ops = *t->ops;
    l->ops.rmsnorm = lab_rmsnorm;
    l->lab = *lab;
    t->ops = &l->ops;
}
