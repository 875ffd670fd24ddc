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
    snprintf(text, len, "matmul_scalar_rows (the reference)");
    return 0;
#else
    return kernels_describe_product(ops_kernels(t->kernels), W, n, text, len);
#endif
}

typedef struct {
    const Transformer* t;
    int n, expert_n;
    PlanGroup* g;
    int max, count;
    const TensorInfo* seen[64];
    int n_seen;
} Grouping;

/* Adds the matrix W (name) at n tokens to the group of its plan, or to a new one. */
static void add_product(Grouping* gr, const char* name, const Matrix* W, int n) {
    PlanGroup one;
    one.amx = product_plan(gr->t, W, n, one.text, sizeof one.text);
    int i = 0;
    while (i < gr->count && strcmp(gr->g[i].text, one.text) != 0) i++;
    if (i == gr->count) {
        if (gr->count == gr->max) return;
        one.names[0] = 0;
        gr->g[gr->count++] = one;
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
    const Matrix* W = tensor_slot(ti, (Weights*)&gr->t->weights, layer, expert);
    add_product(gr, ti->name, W, ti->place == EXPERT ? gr->expert_n : gr->n);
}

int bench_expert_tokens(const Transformer* t, int n, double experts_per_chunk) {
    const Config* c = &t->config;
    if (n == 1 || c->n_experts == 0) return 1;
    const int k = (int)((double)n * c->n_experts_active / (experts_per_chunk > 0 ? experts_per_chunk : c->n_experts) + 0.5);
    return k < 1 ? 1 : k;
}

int bench_plan_groups(const Transformer* t, int n, double experts_per_chunk, PlanGroup* g, int max) {
    Grouping gr = {.t = t, .n = n, .expert_n = bench_expert_tokens(t, n, experts_per_chunk), .g = g, .max = max};
    for_each_tensor(&t->config, group_tensor, &gr);
    add_product(&gr, n > 1 ? "lm_head (the last token)" : "lm_head", &t->weights.lm_head, 1);
    return gr.count;
}
