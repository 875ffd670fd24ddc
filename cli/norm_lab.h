/* norm_lab.h: the RMSNorm lab (run.c: --ablate, --norm-eps, --norm layernorm): teaching switches
 * that change what forward() does at its RMSNorm call sites, to see on a trained model why each
 * use matters, in every layer or in the layers named. The lab puts its own rmsnorm op in front of
 * the model's (kernels/ops.h); with every switch off it is not installed, and the model runs as
 * trained, bit for bit. */
#ifndef NORM_LAB_H
#define NORM_LAB_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

enum {
    NORM_SKIP_PRE = 1,    /* uses 1 and 3, pre-attention and pre-MLP: attention and the MLP read x */
    NORM_SKIP_QK = 2,     /* use 2, QK-Norm: q and k heads go to RoPE as projected */
    NORM_SKIP_FINAL = 4,  /* use 4, the final norm: lm_head reads the residual stream itself */
};

/* rmsnorm_variant_rows' switches, each one visible change to the formula:
 *   NORM_VARIANT_CENTER        x - mean(x) first: LayerNorm without a bias
 *   NORM_VARIANT_UNIT_WEIGHT   w = 1: out = x * scale
 *   NORM_VARIANT_NO_SCALE      scale = 1: out = w * x
 *   NORM_VARIANT_MEAN_WEIGHT   w = mean(w), one gain for every channel: out = mean(w) * x * scale */
enum { NORM_VARIANT_CENTER = 1, NORM_VARIANT_UNIT_WEIGHT = 2, NORM_VARIANT_NO_SCALE = 4, NORM_VARIANT_MEAN_WEIGHT = 8 };

#define NORM_LAB_SWITCHES 16
#define NORM_LAB_LAYERS MAX_LAYERS

/* One --ablate name: a use left out (skip) or a part of the formula changed (variant), at every
 * call site of its kind, or at those of the layers named (and with "final", the final norm's). */
typedef struct {
    int skip;       /* NORM_SKIP_* */
    int variant;    /* NORM_VARIANT_* */
    int every;      /* no @: every layer and the final norm */
    int final;      /* @...final: the final norm */
    uint64_t layers[NORM_LAB_LAYERS / 64]; /* @L,...: layer L's call sites */
    int last_layer; /* the largest layer named, -1: none */
    const char* text; /* the name and layers as given (text_len characters of --ablate's argument), */
    int text_len;     /* for --json and messages */
} NormSwitch;

typedef struct {
    NormSwitch sw[NORM_LAB_SWITCHES];
    int n;
    int variant;   /* --norm layernorm: NORM_VARIANT_CENTER at every call site */
    int has_eps;   /* 1: eps replaces the config's rms_norm_eps everywhere */
    float eps;
} NormLab;

/* What the lab does at one call site (use 1-4, layer -1 for the final norm): leaves it out, or
 * applies the variant with eps (the model's eps passed in, unless --norm-eps). */
typedef struct {
    int skipped;
    int variant;
    float eps;
} NormApplied;

NormApplied norm_lab_at(const NormLab* lab, int use, int layer, float eps);
int norm_lab_active(const NormLab* lab); /* any switch on */

/* Adds --ablate's LIST ("qk-norm@1,2,final-norm", "norm-weight@final"). Returns 0, or -1 with
 * one line in err. */
int norm_lab_parse_ablate(NormLab* lab, const char* list, char* err, size_t errlen);

/* The switches in force as a JSON object for eval's --json: {"ablate": [...], "norm_eps": X,
 * "norm": "layernorm"}, each key only when that switch is on ({} with none); malloc'ed, NULL when
 * out of memory. */
char* norm_lab_json(const NormLab* lab);

/* RMSNorm of n_rows vectors of n values with the variant's switches (variant 0: rmsnorm_scalar
 * row by row), scalar, for teaching, not speed. out may equal x. */
void rmsnorm_variant_rows(float* out, const float* x, const float* w, int n_rows, int n, float eps, int variant);

/* The lab's op table: a copy of the model's with rmsnorm replaced. */
typedef struct {
    Ops ops;
    const Ops* inner;
    NormLab lab;
} NormLabOps;

/* Puts the lab in front of t's ops when any switch is on (l stays in use until t is freed or
 * t->ops is set back to l->inner). Returns 0, or -1 with one line in err when a switch names a
 * layer the model does not have. */
int norm_lab_attach(NormLabOps* l, Transformer* t, const NormLab* lab, char* err, size_t errlen);

#endif
