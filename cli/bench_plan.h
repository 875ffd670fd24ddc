/* bench_plan.h: which kernel each of the model's products runs in a bench test (bench_plan.c). */
#ifndef BENCH_PLAN_H
#define BENCH_PLAN_H

#include "model.h"

/* The model's matrices whose products share one plan in a test: the plan as text ("rows_qi (q8
 * panels, int8 activations)"), the tensors' names, and whether it runs on AMX tiles. */
typedef struct {
    char text[160];
    char names[256];
    int amx;
} PlanGroup;

/* The tokens of an expert's product in a prefill chunk of n tokens (1 for decode): the chunk's n x
 * top-k rows over the experts_per_chunk distinct experts it reads (0: not counted, over all of the
 * layer's experts), rounded. */
int bench_expert_tokens(const Transformer* t, int n, double experts_per_chunk);

/* The plans of a test whose products take n tokens each (1: decode), grouped, in the order of the
 * tensor table; prefill's head takes the last token only, and a Qwen3-MoE layer's experts
 * bench_expert_tokens. Returns the number of groups (at most max). */
int bench_plan_groups(const Transformer* t, int n, double experts_per_chunk, PlanGroup* g, int max);

#endif
