/* norm_trace.h: `--show-norms` (run.c), for a student of RMSNorm: what each of the four RMSNorm
 * call sites of forward() (model.c) does to the vectors it gets, at one position of the prompt.
 * forward() calls norm_trace_see just before each call site when Transformer.norm_trace is set. */
#ifndef NORM_TRACE_H
#define NORM_TRACE_H

#include <stdio.h>

typedef struct NormTrace {
    int pos;        /* the position traced (run.c: the prompt's last, whose logits pick the first token) */
    FILE* out;      /* where the table goes (run.c: a memory stream, printed to stderr after the text) */
    float* scratch; /* max(dim, head_dim) floats, the caller's */
    int lines;      /* lines printed so far (the column heads come before the first) */
} NormTrace;

/* One call site of RMSNorm use `use` (1 pre-attention, 2 QK-Norm, 3 pre-MLP, 4 final norm),
 * called `site`, in layer `layer` (-1: after the last layer). `in` holds the nb rows of the chunk
 * that starts at position p0, each row per_row vectors of width values (QK-Norm: every head of q,
 * or of k; the other uses: one vector of dim = hidden_size). When the traced position is one of those
 * rows, prints one line: over that row's vectors, the RMS of what goes in, the scale
 * 1/sqrt(mean(x^2) + eps) RMSNorm multiplies it by, the RMS of the weight, and the RMS of what
 * comes out, recomputed from the same input with norm.c's scalar reference (the engine's own
 * output is the SIMD twin's, equal to float rounding; a range over the heads for QK-Norm). */
void norm_trace_see(NormTrace* tr, int use, const char* site, int layer, const float* in, const float* weight,
                    int per_row, int width, int p0, int nb, float eps);

#endif
