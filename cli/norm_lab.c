/* norm_lab.c: the RMSNorm lab's switches and its rmsnorm op (norm_lab.h). */
#include "norm_lab.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The formula of kernels/norm.c with one part switched at a time, written out so that each switch
 * is one visible change. The centring is the only difference between RMSNorm and LayerNorm without
 * a bias: mean((x - mean x)^2) is the variance. */
void rmsnorm_variant_rows(float* out, const float* x, const float* w, int n_rows, int n, float eps, int variant) {
    float gain = 0.0f; /* NORM_VARIANT_MEAN_WEIGHT: one gain, the mean of the weight */
    for (int i = 0; i < n; i++) gain += w[i];
    gain /= (float)n;
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
        for (int i = 0; i < n; i++) {
            const float wi = variant & NORM_VARIANT_UNIT_WEIGHT ? 1.0f : variant & NORM_VARIANT_MEAN_WEIGHT ? gain : w[i];
            o[i] = wi * ((xr[i] - mean) * inv);
        }
    }
}

/* ---- Which call sites a switch reaches ---- */

static int names_layer(const NormSwitch* s, int layer) {
    if (s->every) return 1;
    if (layer < 0) return s->final;
    return layer < NORM_LAB_LAYERS && (s->layers[layer / 64] >> (layer % 64) & 1);
}

NormApplied norm_lab_at(const NormLab* lab, int use, int layer, float eps) {
    static const int skip_bit[5] = {0, NORM_SKIP_PRE, NORM_SKIP_QK, NORM_SKIP_PRE, NORM_SKIP_FINAL};
    NormApplied a = {0, lab->variant, lab->has_eps ? lab->eps : eps};
    for (int k = 0; k < lab->n; k++) {
        const NormSwitch* s = &lab->sw[k];
        if (!names_layer(s, layer)) continue;
        if (s->skip & skip_bit[use]) a.skipped = 1;
        a.variant |= s->variant;
    }
    return a;
}

int norm_lab_active(const NormLab* lab) { return lab->n > 0 || lab->variant || lab->has_eps; }

/* ---- --ablate LIST ---- */

static const struct {
    const char* name;
    int skip, variant;
    int layers; /* 1: takes @layers; final-norm has none of its own */
} ABLATIONS[] = {
    {"qk-norm", NORM_SKIP_QK, 0, 1},         {"final-norm", NORM_SKIP_FINAL, 0, 0},
    {"pre-norms", NORM_SKIP_PRE, 0, 1},      {"norm-weight", 0, NORM_VARIANT_UNIT_WEIGHT, 1},
    {"norm-scale", 0, NORM_VARIANT_NO_SCALE, 1}, {"norm-gain", 0, NORM_VARIANT_MEAN_WEIGHT, 1},
};
#define N_ABLATIONS (int)(sizeof ABLATIONS / sizeof ABLATIONS[0])
#define VALID_NAMES "qk-norm, final-norm, pre-norms, norm-weight, norm-scale, norm-gain"

/* The digits at *p as a number (at most 999,999,999), *p moved past them; -1 where none. */
static long read_digits(const char** p, const char* end) {
    long v = -1;
    for (int n = 0; *p < end && isdigit((unsigned char)**p); (*p)++, n++)
        v = n < 9 ? (v < 0 ? 0 : v) * 10 + (**p - '0') : v;
    return v;
}

/* One layer item after @ or a comma: "3", "1-4" or "final" (len characters), digits only. Returns
 * 0 or -1. A layer past the last one any model has is kept as the largest named, for the model's
 * own range to refuse (norm_lab_attach). */
static int add_layers(NormSwitch* s, const char* item, size_t len, int final_ok) {
    if (len == 5 && strncmp(item, "final", 5) == 0 && final_ok) {
        s->final = 1;
        return 0;
    }
    const char *p = item, *end = item + len;
    const long a = read_digits(&p, end);
    long b = a;
    if (p < end && *p == '-') {
        p++;
        b = read_digits(&p, end);
    }
    if (a < 0 || b < a || p != end) return -1;
    for (long l = a; l <= b && l < NORM_LAB_LAYERS; l++) s->layers[l / 64] |= (uint64_t)1 << (l % 64);
    if (b > s->last_layer) s->last_layer = (int)b;
    return 0;
}

static int is_ablation_name(const char* item, size_t len) {
    for (int k = 0; k < N_ABLATIONS; k++)
        if (strlen(ABLATIONS[k].name) == len && strncmp(item, ABLATIONS[k].name, len) == 0) return 1;
    return 0;
}

int norm_lab_parse_ablate(NormLab* lab, const char* list, char* err, size_t errlen) {
    const char* p = list;
    for (;;) {
        const size_t item_len = strcspn(p, ",");
        const size_t name_len = strcspn(p, ",@");
        int k = 0;
        while (k < N_ABLATIONS && !(strlen(ABLATIONS[k].name) == name_len && strncmp(p, ABLATIONS[k].name, name_len) == 0))
            k++;
        if (k == N_ABLATIONS) {
            snprintf(err, errlen, "--ablate: unknown name '%.*s' (valid: %s)", (int)item_len, p, VALID_NAMES);
            return -1;
        }
        if (lab->n == NORM_LAB_SWITCHES) {
            snprintf(err, errlen, "--ablate: more than %d names", NORM_LAB_SWITCHES);
            return -1;
        }
        NormSwitch* s = &lab->sw[lab->n++];
        *s = (NormSwitch){ABLATIONS[k].skip, ABLATIONS[k].variant, 1, 0, {0}, -1, p, 0};
        const char* start = p;
        p += name_len;
        if (*p == '@') { /* layers: the items after @ up to the next name */
            if (!ABLATIONS[k].layers) {
                snprintf(err, errlen, "--ablate: %s is one call site, after the last layer: it takes no @layers",
                         ABLATIONS[k].name);
                return -1;
            }
            s->every = 0;
            p++;
            for (;;) {
                const size_t len = strcspn(p, ",");
                if (add_layers(s, p, len, ABLATIONS[k].variant != 0) != 0) {
                    if (len == 5 && strncmp(p, "final", 5) == 0) /* only a variant has a final site */
                        snprintf(err, errlen, "--ablate: %s has no final site (final-norm leaves the final norm "
                                 "out; @final is for norm-weight, norm-scale and norm-gain)", ABLATIONS[k].name);
                    else
                        snprintf(err, errlen, "--ablate: %s@: '%.*s' is not a layer number, a range such as 1-3%s",
                                 ABLATIONS[k].name, (int)len, p, ABLATIONS[k].variant ? " or final" : "");
                    return -1;
                }
                p += len;
                if (*p == '\0' || is_ablation_name(p + 1, strcspn(p + 1, ",@"))) break;
                p++;
            }
        }
        s->text_len = (int)(p - start);
        if (*p == '\0') return 0;
        p++;
    }
}

/* norm_lab_json into buf[size]; returns the length it needs (as snprintf). The texts are names,
 * digits, '-', '@', ',' and "final" (norm_lab_parse_ablate takes nothing else): no escapes. */
static size_t lab_json(const NormLab* lab, char* buf, size_t size) {
    size_t at = 0;
    const char* sep = "";
#define PUT(...) (at += (size_t)snprintf(at < size ? buf + at : NULL, at < size ? size - at : 0, __VA_ARGS__))
    PUT("{");
    if (lab->n > 0) {
        PUT("\"ablate\": [");
        for (int k = 0; k < lab->n; k++) PUT("%s\"%.*s\"", k ? ", " : "", lab->sw[k].text_len, lab->sw[k].text);
        PUT("]");
        sep = ", ";
    }
    if (lab->has_eps) {
        PUT("%s\"norm_eps\": %.7g", sep, (double)lab->eps);
        sep = ", ";
    }
    if (lab->variant & NORM_VARIANT_CENTER) PUT("%s\"norm\": \"layernorm\"", sep);
    PUT("}");
#undef PUT
    return at;
}

char* norm_lab_json(const NormLab* lab) {
    const size_t n = lab_json(lab, NULL, 0) + 1;
    char* buf = malloc(n);
    if (buf) lab_json(lab, buf, n);
    return buf;
}

/* ---- The lab's rmsnorm op ---- */

/* One call site with the lab's switches: left out, changed, or the model's own op with the lab's
 * eps. */
static void lab_rmsnorm(const Ops* o, const NormSite* at, float* out, const float* x, const float* w, int n,
                        float eps) {
    const NormLabOps* l = (const NormLabOps*)o;
    const NormApplied a = norm_lab_at(&l->lab, at->use, at->layer, eps);
    const int vectors = at->rows * at->per_row;
    if (a.skipped) {
        if (out != x) memcpy(out, x, (size_t)vectors * (size_t)n * sizeof(float));
    } else if (a.variant) {
        rmsnorm_variant_rows(out, x, w, vectors, n, a.eps, a.variant);
    } else {
        l->inner->rmsnorm(l->inner, at, out, x, w, n, a.eps);
    }
}

int norm_lab_attach(NormLabOps* l, Transformer* t, const NormLab* lab, char* err, size_t errlen) {
    for (int k = 0; k < lab->n; k++)
        if (lab->sw[k].last_layer >= t->config.n_layers) {
            snprintf(err, errlen, "--ablate %.*s: the model's layers are 0 to %d", lab->sw[k].text_len, lab->sw[k].text,
                     t->config.n_layers - 1);
            return -1;
        }
    if (!norm_lab_active(lab)) return 0;
    l->inner = t->ops;
    l->ops = *t->ops;
    l->ops.rmsnorm = lab_rmsnorm;
    l->lab = *lab;
    t->ops = &l->ops;
    return 0;
}
