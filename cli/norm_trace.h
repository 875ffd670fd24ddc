/* norm_trace.h: `--show-norms` and `--norms-json` (run.c), for a student of RMSNorm: what each of
 * the four RMSNorm call sites of forward() (model.c) does to the vectors it gets.
 * The trace puts its own op table in front of the model's (kernels/ops.h): its rmsnorm reports
 * what goes into each call (norm_trace.c: norm_trace_see) and its attention each query head's
 * largest score (norm_trace_score), then both call the model's own op.
 *
 * Three outputs, any of them on:
 *   the table (--show-norms)       one position (the prompt's last); QK-Norm's heads as min..max
 *   the full table (=all)          every position the model runs, every head of q and k on its own
 *   JSON lines (--norms-json)      every position, every head, one object per line:
 *     {"position":P,"layer":L,"use":U,"site":"QK-Norm q","head":J,"rms_in":..,"mean_in":..,
 *      "scale":..,"rms_w":..,"rms_out":..,"eps":..}   (and "skipped":true where the lab left it out)
 *       layer -1: the final norm (after the last layer), reported where forward() runs it: at
 *       every position with --dump-logits, else at the prompt's last one and at each generated
 *       token fed back (the last one generated is not: nothing needs its logits);
 *       head null: a site of one D-vector
 *     {"position":P,"layer":L,"site":"attention","head":J,"kv_head":G,"keys":N,"max_score":..}
 *       the largest |q.k|/sqrt(d) of query head J over the N keys it attends to (positions 0..P)
 * Nothing here allocates: the caller sizes `scratch` and opens the streams before the token loop. */
#ifndef NORM_TRACE_H
#define NORM_TRACE_H

#include <stdio.h>

#include "cli/norm_lab.h"
#include "model.h"

typedef struct NormTrace {
    Ops ops;        /* the model's ops with rmsnorm and attention watched (norm_trace_attach) */
    const Ops* inner;
    int pos;        /* the table's one position, or -1: every position that goes through forward()
                     * (the JSON lines always have every position) */
    int each_head;  /* the table: one line per head of q and k (1), or min..max over them (0) */
    FILE* table;    /* NULL, or where the table goes (run.c: a temporary file, copied to stderr after the text) */
    FILE* json;     /* NULL, or --norms-json's file */
    char json_written[4096]; /* the regular file behind it, which a failed write removes ("": a device) */
    float* scratch; /* max(dim, head_dim) floats, the caller's */
    const NormLab* lab; /* NULL, or the RMSNorm lab's switches: the trace reports what they apply */
    int lines;      /* table lines printed so far (the column heads come before the first) */
} NormTrace;

/* Puts the trace in front of t's ops, and takes it away again. */
void norm_trace_attach(NormTrace* tr, Transformer* t);
void norm_trace_detach(NormTrace* tr, Transformer* t);

#endif
