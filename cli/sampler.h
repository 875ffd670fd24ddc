/* sampler.h: picks the next token from the logits (llama2.c's sampler, extended with top-k, min-p
 * and a repetition penalty).
 *
 * The order is Hugging Face's generate: the repetition penalty (a logits processor, which runs
 * before the warpers), then temperature, top-k, top-p, min-p (the warpers, QWEN3.md 1.2), then
 * softmax and one multinomial draw. temperature 0 is greedy: the argmax of the
 * penalised logits, fully deterministic. Every buffer is allocated by sampler_init; sampling a
 * token allocates nothing.
 */
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stdint.h>

typedef struct {
    float prob;
    int index;
} ProbIndex;

typedef struct {
    int vocab_size;
    float temperature;     /* 0: greedy */
    float top_p;           /* 1 (or 0): off; keep the smallest set of tokens with mass >= top_p */
    int top_k;             /* 0: off; keep the k most likely tokens (and any tied with the k-th) */
    float min_p;           /* 0: off; drop tokens less likely than min_p * the most likely one */
    float repeat_penalty;  /* 1: off; HF's repetition_penalty over every token seen */
    uint64_t rng_state;    /* xorshift64* state, never 0 */
    ProbIndex* candidates; /* [vocab_size] scratch */
    float* heap;           /* [vocab_size] scratch for top-k */
    unsigned char* seen;   /* [vocab_size] scratch for the penalty (all zero between calls) */
} Sampler;

/* Returns 0, or -1 when out of memory. The same seed always gives the same tokens. */
int sampler_init(Sampler* s, int vocab_size, float temperature, float top_p, int top_k,
                 float min_p, float repeat_penalty, uint64_t seed);
void sampler_free(Sampler* s);

/* Samples a token from logits[vocab_size]; logits is modified (penalty and temperature are
 * applied in place). history[0 .. n_history-1] are the tokens seen so far (prompt and output), for
 * the repetition penalty; ids outside the vocabulary are ignored. Returns -1 when every logit is
 * NaN (weights that hold NaN or infinity, or activations that overflowed). */
int sampler_sample(Sampler* s, float* logits, const int* history, int n_history);

#endif
