/* bench_plan.c: which kernel each of the model's products runs in a bench test, as the fast ops'
 * plan chooses it (kernels/fast/matmul.c: plan_product, from the format, the width and the tokens
 * of a product and the CPU). The bench prints it beside the kernels' name, and takes from it whether
 * prefill runs on AMX tiles, which its compute roof does not time (cli/peak.c). The reference
 * build has one product, the scalar reference. */
#include "cli/bench_plan.h"

#include <stdio.h>
#include <string.h>

#include "checkpoint.h"
#if !defined(KERNELS_SCALAR)
#include "kernels/fast/fast.h"
#endif

/* The plan of n tokens through W alone, as text; 1 where it runs on AMX tiles. */
static int product_plan(const Transformer* t, const Matrix* W, int n, char* text, size_t len) {
#if defined(KERNELS_SCALAR)
    (void)t, (void)W, (void)n;
    snprintf(text, len, "matmul_scalar_rows (the reference)");
    return 0;
#else
    return kernels_describe_product(ops_kernels(t->kernels), W, n, text, len);
#endif
}

/* Appends "FROM to TO tokens PLAN" to text at `at` (", " before all but the first); returns the end. */
static size_t append_run(char* text, size_t at, size_t len, int from, int to, const char* plan) {
    if (at >= len) return at;
    const char* sep = at ? ", " : "";
    if (from == to) return at + (size_t)snprintf(text + at, len - at, "%s%d token%s %s", sep, from, from == 1 ? "" : "s", plan);
    return at + (size_t)snprintf(text + at, len - at, "%s%d to %d tokens %s", sep, from, to, plan);
}

/* The plans of an expert's product at each count of tokens from 1 to n, as runs of counts that
 * share one ("1 token PLAN, 2 to 23 tokens PLAN, ..."), or PLAN alone where one holds for all: the
 * router decides the count. Returns 1 where any of them runs on AMX tiles. */
static int expert_plans(const Transformer* t, const Matrix* W, int n, char* text, size_t len) {
    char plan[160], prev[160];
    int amx = product_plan(t, W, 1, prev, sizeof prev), from = 1;
    size_t at = 0;
    text[0] = 0;
    for (int k = 2; k <= n; k++) {
        amx |= product_plan(t, W, k, plan, sizeof plan);
        if (strcmp(plan, prev) == 0) continue;
        at = append_run(text, at, len, from, k - 1, prev);
        from = k;
        memcpy(prev, plan, sizeof prev);
    }
    if (from == 1) snprintf(text, len, "%s", prev);
    else append_run(text, at, len, from, n, prev);
    return amx;
}

typedef struct {
    const Transformer* t;
    int n;
    PlanGroup* g;
    int max, count;
    const TensorInfo* seen[64];
    int n_seen;
} Grouping;

/* Adds the matrix named name to the group of its plan, one (its text and amx), or to a new one. */
static void add_product(Grouping* gr, const char* name, const PlanGroup* one) {
    int i = 0;
    while (i < gr->count && strcmp(gr->g[i].text, one->text) != 0) i++;
    if (i == gr->count) {
        if (gr->count == gr->max) return;
        gr->g[gr->count] = *one;
        gr->g[gr->count++].names[0] = 0;
    }
    PlanGroup* g = &gr->g[i];
    const size_t used = strlen(g->names);
    snprintf(g->names + used, sizeof g->names - used, "%s%s", used ? ", " : "", name);
}

/* Each matrix of the table once, at the first layer (and expert) that stores it; the embedding
 * is a lookup, and the head comes last. */
static void group_tensor(void* ctx, const TensorInfo* ti, int layer, int expert) {
    Grouping* gr = ctx;
    if (ti->cols == SIZE_NONE || strcmp(ti->name, "embed_tokens") == 0 || strcmp(ti->name, "lm_head") == 0) return;
    for (int i = 0; i < gr->n_seen; i++)
        if (gr->seen[i] == ti) return;
    if (gr->n_seen < 64) gr->seen[gr->n_seen++] = ti;
    const Matrix* W = tensor_slot(ti, &gr->t->weights, layer, expert);
    PlanGroup one;
    if (ti->place == EXPERT) one.amx = expert_plans(gr->t, W, gr->n, one.text, sizeof one.text);
    else one.amx = product_plan(gr->t, W, gr->n, one.text, sizeof one.text);
    add_product(gr, ti->name, &one);
}

int bench_plan_groups(const Transformer* t, int n, PlanGroup* g, int max) {
    Grouping gr = {.t = t, .n = n, .g = g, .max = max};
    for_each_tensor(&t->config, group_tensor, &gr);
    PlanGroup head;
    head.amx = product_plan(t, &t->weights.lm_head, 1, head.text, sizeof head.text);
    add_product(&gr, n > 1 ? "lm_head (the last token)" : "lm_head", &head);
    return gr.count;
}
