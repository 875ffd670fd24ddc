/* bench_plan.h: which kernel each of the model's products runs in a bench test (bench_plan.c). */
#ifndef BENCH_PLAN_H
#define BENCH_PLAN_H

#include "model.h"

/* The model's matrices whose products share one plan in a test: the plan as text ("rows_qi (q8
 * panels, int8 activations)"; an expert's, by its tokens: "1 token PLAN, 2 to 23 tokens PLAN, ..."),
 * the tensors' names, and whether it runs on AMX tiles. */
typedef struct {
    char text[512];
    char names[256];
    int amx;
} PlanGroup;

/* The plans of a test whose products take n tokens each (1: decode), grouped, in the order of the
 * tensor table; prefill's head takes the last token only, and a Qwen3-MoE layer's expert as many
 * of the n as the router sends it, 1 to n. Returns the number of groups (at most max). */
int bench_plan_groups(const Transformer* t, int n, PlanGroup* g, int max);

#endif
