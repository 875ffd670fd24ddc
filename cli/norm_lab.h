/* norm_lab.h: the RMSNorm lab (run.c: --ablate, --norm-eps, --norm layernorm): teaching switches
 * that change what forward() does at its RMSNorm call sites, to see on a trained model why each
 * use matters. The lab puts its own rmsnorm op in front of the model's (kernels/ops.h); with every
 * switch off it is not installed, and the model runs as trained, bit for bit. */
#ifndef NORM_LAB_H
#define NORM_LAB_H

#include "model.h"

enum {
    NORM_SKIP_PRE = 1,    /* uses 1 and 3, pre-attention and pre-MLP: attention and the MLP read x */
    NORM_SKIP_QK = 2,     /* use 2, QK-Norm: q and k heads go to RoPE as projected */
    NORM_SKIP_FINAL = 4,  /* use 4, the final norm: lm_head reads the residual stream itself */
};

/* rmsnorm_variant_rows' switches, each one visible change to the formula:
 *   NORM_VARIANT_CENTER        x - mean(x) first: LayerNorm without a bias
 *   NORM_VARIANT_UNIT_WEIGHT   w = 1: out = x * scale
 *   NORM_VARIANT_NO_SCALE      scale = 1: out = w * x */
enum { NORM_VARIANT_CENTER = 1, NORM_VARIANT_UNIT_WEIGHT = 2, NORM_VARIANT_NO_SCALE = 4 };

typedef struct {
    int skip;      /* NORM_SKIP_* bits: call sites left out (their output is their input) */
    int variant;   /* NORM_VARIANT_* bits applied at every call site still in */
    int has_eps;   /* 1: eps replaces the config's rms_norm_eps everywhere */
    float eps;
} NormLab;

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
 * t->ops is set back to l->inner). */
void norm_lab_attach(NormLabOps* l, Transformer* t, const NormLab* lab);

#endif
