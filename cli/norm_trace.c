/* norm_trace.c: `--show-norms` and `--norms-json`, what each RMSNorm call site does (norm_trace.h).
 * Off, it is not in the model's op table at all. */
#include "norm_trace.h"
#include "generation.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "kernels/ops.h"

/* What RMSNorm does to one vector x of n values with weight w. */
typedef struct {
    double rms_in, mean_in, scale, rms_out;
    int skipped;
} NormStats;

static double rms(const float* x, int n) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    return sqrt(ss / n);
}

/* As applied at the site (a): the model's RMSNorm, the lab's variant of it, or nothing. */
static NormStats norm_stats(const float* x, const float* w, int n, NormApplied a, float* out) {
    double sum = 0.0, var = 0.0;
    for (int i = 0; i < n; i++) sum += x[i];
    const double rms_in = rms(x, n), mean = sum / n;
    if (a.skipped) return (NormStats){rms_in, mean, 1.0, rms_in, 1};
    if (a.variant) rmsnorm_variant_rows(out, x, w, 1, n, a.eps, a.variant);
    else rmsnorm_scalar(out, x, w, n, a.eps);
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean) / n;
    const double ms = a.variant & NORM_VARIANT_CENTER ? var : rms_in * rms_in;
    const double scale = a.variant & NORM_VARIANT_NO_SCALE ? 1.0 : 1.0 / sqrt(ms + (double)a.eps);
    return (NormStats){rms_in, mean, scale, rms(out, n), 0};
}

/* The RMS of the weight applied: w's, 1 (w = 1 or a site left out), or |mean(w)| (one gain). */
static double applied_rms_w(const float* w, int n, NormApplied a) {
    if (a.skipped || (a.variant & NORM_VARIANT_UNIT_WEIGHT)) return 1.0;
    if (!(a.variant & NORM_VARIANT_MEAN_WEIGHT)) return rms(w, n);
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += w[i];
    return fabs(sum / n);
}

/* The formula the table's columns follow: RMSNorm's, or under --norm layernorm the centred one. */
static const char* formula(const NormTrace* tr) {
    return tr->lab && (tr->lab->variant & NORM_VARIANT_CENTER)
               ? "out = w * ((x - mean(x)) * scale),\nscale = 1/sqrt(mean((x - mean(x))^2) + eps)"
               : "out = w * (x * scale), scale = 1/sqrt(mean(x^2) + eps)";
}

/* The header's line of switches: the lab's in force, or none. */
static void print_switches(const NormTrace* tr) {
    if (!tr->lab) return;
    char* json = norm_lab_json(tr->lab);
    fprintf(tr->table, "RMSNorm lab switches in force (what each line shows is what they apply): %s\n",
            json ? json : "(out of memory)");
    free(json);
}

/* Whether position p is traced (in the table or the JSON lines). */
static int norm_trace_wants(const NormTrace* tr, int p) {
    return tr->json != NULL || tr->pos < 0 || tr->pos == p;
}

/* v as text in buf, or none when v < 0 (the final norm's layer, a site of one vector's head). */
static const char* number_or(char* buf, size_t size, int v, const char* none) {
    if (v < 0) return none;
    snprintf(buf, size, "%d", v);
    return buf;
}

/* "value" for one vector, "min..max" over several (QK-Norm's heads), in a column of `width`
 * characters and at least one space after it (0: the last column, unpadded). */
static void print_cell(FILE* f, double lo, double hi, int many, int width) {
    char cell[40];
    if (many) snprintf(cell, sizeof cell, "%.4g..%.4g", lo, hi);
    else snprintf(cell, sizeof cell, "%.4g", lo);
    if (width > 0) fprintf(f, "%-*s ", width - 1, cell);
    else fputs(cell, f);
}

/* The default table: one line per call site at one position, QK-Norm's heads as min..max of the
 * columns rms(in), scale and rms(out). */
static void table_line(NormTrace* tr, int use, const char* site, int layer, const double lo[3], const double hi[3],
                       int per_row, int width, int pos, double rms_w, float eps, int skipped) {
    if (tr->lines++ == 0)
        fprintf(tr->table,
                "RMSNorm at each call site, position %d: %s,\n"
                "eps %g; over every head for QK-Norm (min..max)\n",
                pos, formula(tr), (double)eps);
    if (tr->lines == 1) {
        print_switches(tr);
        fprintf(tr->table, "layer  use  site           vectors    rms(in)          scale            rms(w)    rms(out)\n");
    }
    char where[16], shape[32];
    snprintf(shape, sizeof shape, "%d x %d", per_row, width);
    fprintf(tr->table, "%5s  %d    %-13s  %-9s  ", number_or(where, sizeof where, layer, "-"), use, site, shape);
    print_cell(tr->table, lo[0], hi[0], per_row > 1, 17);
    if (skipped) fprintf(tr->table, "%-17s", "skipped");
    else print_cell(tr->table, lo[1], hi[1], per_row > 1, 17);
    fprintf(tr->table, "%-8.4g  ", rms_w);
    print_cell(tr->table, lo[2], hi[2], per_row > 1, 0);
    fputc('\n', tr->table);
}

/* --show-norms=all: one line per vector (each head of q and k on its own). */
static void full_table_line(NormTrace* tr, int use, const char* site, int layer, int head, int pos,
                            const NormStats* st, double rms_w, float eps) {
    if (tr->lines++ == 0)
        fprintf(tr->table,
                "RMSNorm at each call site, every position, every head: %s,\n"
                "eps %g; in forward()'s order (a prefill chunk's positions at each call site in turn)\n",
                formula(tr), (double)eps);
    if (tr->lines == 1) {
        print_switches(tr);
        fprintf(tr->table, "  pos  layer  use  site           head  rms(in)     mean(in)     scale       rms(w)      rms(out)\n");
    }
    char where[16], which[16];
    char scale[24];
    if (st->skipped) snprintf(scale, sizeof scale, "skipped");
    else snprintf(scale, sizeof scale, "%.4g", st->scale);
    fprintf(tr->table, "%5d  %5s  %d    %-13s  %-4s  %-10.4g  %-11.4g  %-10s  %-10.4g  %.4g\n", pos,
            number_or(where, sizeof where, layer, "-"), use, site, number_or(which, sizeof which, head, "-"),
            st->rms_in, st->mean_in, scale, rms_w, st->rms_out);
}

static void json_line(NormTrace* tr, int use, const char* site, int layer, int head, int pos, const NormStats* st,
                      double rms_w, float eps) {
    char which[16], v[6][32];
    fprintf(tr->json,
            "{\"position\":%d,\"layer\":%d,\"use\":%d,\"site\":\"%s\",\"head\":%s,\"rms_in\":%s,\"mean_in\":%s,"
            "\"scale\":%s,\"rms_w\":%s,\"rms_out\":%s,\"eps\":%s%s}\n",
            pos, layer, use, site, number_or(which, sizeof which, head, "null"), json_value(v[0], 32, "%.9g", st->rms_in),
            json_value(v[1], 32, "%.9g", st->mean_in), json_value(v[2], 32, "%.9g", st->scale), json_value(v[3], 32, "%.9g", rms_w),
            json_value(v[4], 32, "%.9g", st->rms_out), json_value(v[5], 32, "%.9g", eps), st->skipped ? ",\"skipped\":true" : "");
}

/* One call site of RMSNorm use `use` (1 pre-attention, 2 QK-Norm, 3 pre-MLP, 4 final norm),
 * called `site`, in layer `layer` (-1: after the last layer). `in` holds the nb rows of the chunk
 * that starts at position p0, each row per_row vectors of width values (QK-Norm: every head of q,
 * or of k; the other uses: one vector of dim values). For each traced row it reports the RMS and
 * mean of what goes in, the scale applied (1/sqrt(mean(x^2) + eps)), the RMS of the weight applied
 * and of what comes out, recomputed with norm.c's scalar reference (the engine's SIMD output equals
 * it to rounding). Under the RMSNorm lab (tr->lab) these are what the lab applies at the site: its
 * eps, its variant of the formula, or a site left out (marked skipped: scale 1, weight 1, out = in). */
static void norm_trace_see(NormTrace* tr, int use, const char* site, int layer, const float* in,
                           const float* weight, int per_row, int width, int p0, int nb, float eps) {
    const NormApplied a = tr->lab ? norm_lab_at(tr->lab, use, layer, eps) : (NormApplied){0, 0, eps};
    const double rms_w = applied_rms_w(weight, width, a);
    for (int pos = p0; pos < p0 + nb; pos++) {
        if (!norm_trace_wants(tr, pos)) continue;
        const int in_table = tr->table != NULL && (tr->pos < 0 || tr->pos == pos);
        double lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {-INFINITY, -INFINITY, -INFINITY};
        for (int v = 0; v < per_row; v++) {
            const float* x = in + ((size_t)(pos - p0) * (size_t)per_row + (size_t)v) * (size_t)width;
            const NormStats st = norm_stats(x, weight, width, a, tr->scratch);
            const int head = per_row > 1 ? v : -1;
            if (in_table && tr->each_head) full_table_line(tr, use, site, layer, head, pos, &st, rms_w, a.eps);
            if (tr->json) json_line(tr, use, site, layer, head, pos, &st, rms_w, a.eps);
            const double cols[3] = {st.rms_in, st.scale, st.rms_out};
            for (int k = 0; k < 3; k++) {
                lo[k] = cols[k] < lo[k] ? cols[k] : lo[k];
                hi[k] = cols[k] > hi[k] ? cols[k] : hi[k];
            }
        }
        if (in_table && !tr->each_head) table_line(tr, use, site, layer, lo, hi, per_row, width, pos, rms_w, a.eps, a.skipped);
    }
}

/* Query head `head` (reading kv head `kv_head`) of layer `layer` at position `pos`: the largest
 * |q.k|/sqrt(d) over the n_keys keys it attends to. JSON only (the tables show the norms). */
static void norm_trace_score(NormTrace* tr, int layer, int pos, int head, int kv_head, int n_keys, double max_score) {
    if (tr->json == NULL) return;
    char v[32];
    fprintf(tr->json, "{\"position\":%d,\"layer\":%d,\"site\":\"attention\",\"head\":%d,\"kv_head\":%d,\"keys\":%d,"
            "\"max_score\":%s}\n", pos, layer, head, kv_head, n_keys, json_value(v, sizeof v, "%.9g", max_score));
}

/* Each traced row's query heads' largest |q.k|/sqrt(d) over the keys they attend to, read back from
 * the cache (after QK-Norm and RoPE, as attention reads them). */
static void see_scores(NormTrace* tr, const AttentionCall* a) {
    const int H = a->n_heads, d = a->head_dim, G = a->n_heads / a->n_kv_heads;
    for (int r = 0; r < a->rows; r++) {
        if (!norm_trace_wants(tr, a->p0 + r)) continue;
        for (int j = 0; j < H; j++) {
            const float* q = a->q + ((size_t)r * H + (size_t)j) * d;
            const KVRows kv = attention_kv_head(a, j / G);
            double best = 0.0;
            for (int p = 0; p <= a->p0 + r; p++) {
                const size_t at = kv_row_offset(&kv, p);
                double dot = 0.0;
                for (int i = 0; i < d; i++)
                    dot += (double)q[i] * kv_value(kv.keys, at, i, d, kv.type);
                best = fabs(dot) > best ? fabs(dot) : best;
            }
            norm_trace_score(tr, a->layer, a->p0 + r, j, j / G, a->p0 + r + 1, best / sqrt((double)d));
        }
    }
}

static void trace_rmsnorm(const Ops* o, const NormSite* at, float* out, const float* x, const float* w, int n,
                          float eps) {
    NormTrace* tr = (NormTrace*)o;
    norm_trace_see(tr, at->use, at->name, at->layer, x, w, at->per_row, n, at->p0, at->rows, eps);
    tr->inner->rmsnorm(tr->inner, at, out, x, w, n, eps);
}

static void trace_attention(const Ops* o, const AttentionCall* a) {
    NormTrace* tr = (NormTrace*)o;
    if (tr->json) see_scores(tr, a);
    tr->inner->attention(tr->inner, a);
}

void norm_trace_attach(NormTrace* tr, Transformer* t) {
    tr->inner = t->ops;
    tr->ops = *t->ops;
    tr->ops.rmsnorm = trace_rmsnorm;
    tr->ops.attention = trace_attention;
    tr->ops.split_exact = 0; /* its records follow the calls (each call's last row has a final norm) */
    t->ops = &tr->ops;
}

void norm_trace_detach(NormTrace* tr, Transformer* t) {
    if (t->ops == &tr->ops) t->ops = tr->inner;
}
