/* tests/test_two_models.c: two models loaded in one process share nothing. Each Transformer owns
 * its options, its kernel threads and its matmul scratch (model.h, TransformerOptions and
 * Transformer.kernels), so two of them decode side by side, their forward calls interleaved,
 * with exactly the logits each gives alone, and either can be freed first while the other goes on.
 *
 * The two are the shipped model (models/tinystories.bin) loaded twice with different options:
 * A with 2 threads, a context of 256 and the fp32 cache; B with 1 thread, a context of 128 and the
 * fp16 cache, each with its own mapping of the file. Each runs a prompt of PROMPT tokens
 * (prefill) and then STEPS decode steps of the greedy token; first alone (load, run, free), then
 * both loaded at once with every call interleaved, the first model freed halfway. Every step's
 * logits are compared bit for bit with the run alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define MODEL_PATH "models/tinystories.bin"
#define PROMPT 20
#define STEPS 12
#define FREE_AT 6 /* the first model is freed after this many decode steps */
#if defined(KERNELS_SCALAR)
#define A_THREADS 1 /* the reference build runs one thread whatever it is asked */
#else
#define A_THREADS 2
#endif

#include "tests/check.h"

/* One model's run alone: the logits after the prompt (row 0) and after each decode step, and the
 * tokens it fed (the prompt, then the greedy choice at each step). */
typedef struct {
    TransformerOptions opt;
    const char* name;
    int vocab;
    float* logits; /* (STEPS + 1) rows of vocab */
    int tokens[PROMPT + STEPS];
} Run;

static int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int load(Transformer* t, const Run* r) {
    char err[512];
    if (transformer_load(t, MODEL_PATH, &r->opt, err, sizeof err) != 0) {
        printf("FAIL: %s: %s\n", r->name, err);
        n_fail++;
        return -1;
    }
    return 0;
}

/* Step 0: the prompt; step s > 0: decode token PROMPT + s - 1 at its position. */
static const float* step(Transformer* t, const Run* r, int s) {
    if (s == 0) return forward(t, r->tokens, PROMPT, 0, NULL);
    return forward(t, &r->tokens[PROMPT + s - 1], 1, PROMPT + s - 1, NULL);
}

static int run_alone(Run* r) {
    Transformer t;
    if (load(&t, r) != 0) return -1;
    r->vocab = t.config.vocab_size;
    r->logits = malloc((size_t)(STEPS + 1) * (size_t)r->vocab * sizeof(float));
    for (int i = 0; i < PROMPT; i++) r->tokens[i] = (i * 37 + 11) % r->vocab;
    for (int s = 0; s <= STEPS; s++) {
        const float* l = step(&t, r, s);
        if (!l) {
            check(0, "forward failed");
            transformer_free(&t);
            return -1;
        }
        memcpy(r->logits + (size_t)s * r->vocab, l, (size_t)r->vocab * sizeof(float));
        if (s < STEPS) r->tokens[PROMPT + s] = argmax(l, r->vocab);
    }
    transformer_free(&t);
    return 0;
}

static int same_logits(const Run* r, int s, const float* l) {
    return l && memcmp(l, r->logits + (size_t)s * r->vocab, (size_t)r->vocab * sizeof(float)) == 0;
}

/* Both loaded; every step of A then the same step of B; `first` (0: A, 1: B) freed after FREE_AT
 * decode steps, the other run to the end. */
static void run_side_by_side(const Run runs[2], int first) {
    Transformer t[2];
    if (load(&t[0], &runs[0]) != 0) return;
    if (load(&t[1], &runs[1]) != 0) {
        transformer_free(&t[0]);
        return;
    }
    char what[200];
    snprintf(what, sizeof what, "each model keeps its own options: threads %d and %d, contexts %d and %d, caches %s and %s",
             t[0].kernels->threads(t[0].kernels), t[1].kernels->threads(t[1].kernels), t[0].config.seq_len, t[1].config.seq_len,
             t[0].state.kv_type == KV_F16 ? "fp16" : "fp32", t[1].state.kv_type == KV_F16 ? "fp16" : "fp32");
    check(t[0].kernels->threads(t[0].kernels) == A_THREADS && t[1].kernels->threads(t[1].kernels) == 1 && t[0].config.seq_len == 256 &&
              t[1].config.seq_len == 128 && t[0].state.kv_type == KV_F32 && t[1].state.kv_type == KV_F16 && t[0].kernels != t[1].kernels,
          what);
    int ok_both = 1, ok_after = 1, live[2] = {1, 1};
    for (int s = 0; s <= STEPS; s++) {
        for (int m = 0; m < 2; m++) {
            if (!live[m]) continue;
            const int same = same_logits(&runs[m], s, step(&t[m], &runs[m], s));
            if (live[0] && live[1]) ok_both &= same;
            else ok_after &= same;
        }
        if (s == FREE_AT) {
            transformer_free(&t[first]);
            live[first] = 0;
        }
    }
    transformer_free(&t[1 - first]);
    snprintf(what, sizeof what, "interleaved prefill and decode of two models: every logit as each alone, bitwise (%s freed first)",
             first ? "B" : "A");
    check(ok_both, what);
    snprintf(what, sizeof what, "%s freed after %d steps: %s decodes on with the logits it has alone, bitwise",
             first ? "B" : "A", FREE_AT, first ? "A" : "B");
    check(ok_after, what);
}

int main(void) {
    if (!readable_or_skipped(MODEL_PATH)) return 0;
    Run runs[2] = {{.opt = {.threads = 2, .ctx = 256}, .name = "A"},
                   {.opt = {.threads = 1, .ctx = 128, .kv_type = KV_F16}, .name = "B"}};
    if (run_alone(&runs[0]) == 0 && run_alone(&runs[1]) == 0) {
        check(memcmp(runs[0].logits, runs[1].logits, (size_t)runs[0].vocab * sizeof(float)) != 0,
              "A and B differ (fp32 and fp16 caches), so a mixed-up state would show");
        run_side_by_side(runs, 0);
        run_side_by_side(runs, 1);
    }
    free(runs[0].logits);
    free(runs[1].logits);
    return checks_done();
}
