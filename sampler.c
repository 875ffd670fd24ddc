/* sampler.c: from logits to the next token (see sampler.h for the order of the steps). */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int sampler_init(Sampler* s, int vocab_size, float temperature, float top_p, int top_k,
                 float min_p, float repeat_penalty, uint64_t seed) {
    memset(s, 0, sizeof *s);
    if (vocab_size <= 0) return -1;
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->top_p = top_p;
    s->top_k = top_k;
    s->min_p = min_p;
    s->repeat_penalty = repeat_penalty;
    s->rng_state = seed ? seed : 0x9E3779B97F4A7C15ull; /* xorshift never leaves 0 */
    s->candidates = malloc((size_t)vocab_size * sizeof(ProbIndex));
    s->heap = malloc((size_t)vocab_size * sizeof(float));
    s->seen = calloc((size_t)vocab_size, 1);
    if (s->candidates == NULL || s->heap == NULL || s->seen == NULL) {
        sampler_free(s);
        return -1;
    }
    return 0;
}

void sampler_free(Sampler* s) {
    free(s->candidates);
    free(s->heap);
    free(s->seen);
    s->heap = NULL;
    s->candidates = NULL;
    s->seen = NULL;
}

/* xorshift64* (Marsaglia's xorshift with Vigna's multiplier), as in llama2.c. */
static uint32_t random_u32(uint64_t* state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

float sampler_random(Sampler* s) { return (float)(random_u32(&s->rng_state) >> 8) / 16777216.0f; }

static int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i])) best = i; /* skips NaN */
    return best;
}

/* Descending probability; ties by ascending id, so the order never depends on qsort. */
static int by_prob_desc(const void* a, const void* b) {
    const ProbIndex* x = a;
    const ProbIndex* y = b;
    if (x->prob != y->prob) return x->prob > y->prob ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* The k-th largest of x[0 .. n-1] (1 <= k <= n), with a min-heap of the k largest seen so far in
 * heap[0 .. k-1]: O(n log k), much cheaper than sorting 151,936 logits for k = 20. */
static float kth_largest(const float* x, int n, int k, float* heap) {
    for (int i = 0; i < n; i++) {
        float v = x[i];
        int j;
        if (i < k) { /* grow: sift v up from the end */
            j = i;
            while (j > 0 && heap[(j - 1) / 2] > v) {
                heap[j] = heap[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            heap[j] = v;
        } else if (v > heap[0]) { /* replace the smallest: sift v down from the root */
            j = 0;
            for (;;) {
                int child = 2 * j + 1;
                if (child >= k) break;
                if (child + 1 < k && heap[child + 1] < heap[child]) child++;
                if (heap[child] >= v) break;
                heap[j] = heap[child];
                j = child;
            }
            heap[j] = v;
        }
    }
    return heap[0];
}

int sampler_sample(Sampler* s, float* logits, const int* history, int n_history) {
    const int V = s->vocab_size;

    /* 1. Repetition penalty (HF RepetitionPenaltyLogitsProcessor): each distinct token seen so far
     *    has its logit divided by the penalty when positive, multiplied when negative. */
    if (s->repeat_penalty != 1.0f && s->repeat_penalty > 0.0f) {
        for (int i = 0; i < n_history; i++) {
            int id = history[i];
            if (id < 0 || id >= V || s->seen[id]) continue;
            s->seen[id] = 1;
            logits[id] = logits[id] < 0.0f ? logits[id] * s->repeat_penalty
                                           : logits[id] / s->repeat_penalty;
        }
        for (int i = 0; i < n_history; i++)
            if (history[i] >= 0 && history[i] < V) s->seen[history[i]] = 0;
    }

    /* Temperature 0: greedy decoding, no randomness. */
    if (s->temperature <= 0.0f) return argmax(logits, V);

    /* 2. Temperature. */
    for (int i = 0; i < V; i++) logits[i] /= s->temperature;
    float max_logit = logits[argmax(logits, V)];
    if (!isfinite(max_logit)) return argmax(logits, V);

    const int use_top_k = s->top_k > 0 && s->top_k < V;
    const int use_top_p = s->top_p > 0.0f && s->top_p < 1.0f;
    const int use_min_p = s->min_p > 0.0f;
    ProbIndex* cand = s->candidates;
    int n = 0;
    double mass; /* the total that top-p's fractions refer to */

    if (use_top_k) {
        /* 3. Top-k (HF TopKLogitsWarper): keep every logit >= the k-th largest (ties with the k-th
         *    stay too). A survivor's weight is exp(logit - max): its softmax probability up to the
         *    normalisation, which top-p takes from the survivors' sum (HF renormalises after top-k). */
        float threshold = kth_largest(logits, V, s->top_k, s->heap);
        mass = 0.0;
        for (int i = 0; i < V; i++) {
            if (logits[i] >= threshold) {
                cand[n].prob = expf(logits[i] - max_logit);
                cand[n].index = i;
                mass += cand[n].prob;
                n++;
            }
        }
    } else {
        /* Softmax weights of the whole vocabulary (unnormalised: the sum is `mass`). */
        mass = 0.0;
        for (int i = 0; i < V; i++) {
            logits[i] = expf(logits[i] - max_logit);
            mass += logits[i];
        }
        if (!use_top_p && !use_min_p) {
            /* Plain multinomial draw over everything: no sorting needed. */
            double r = (double)sampler_random(s) * mass, cdf = 0.0;
            for (int i = 0; i < V; i++) {
                cdf += logits[i];
                if (r < cdf) return i;
            }
            return argmax(logits, V); /* rounding left r >= the sum */
        }
        /* Only tokens that can survive top-p and min-p need sorting (llama2.c's trick): a token
         * with probability below (1 - top_p) / (V - 1) has more than top_p of the mass ranked
         * above it, so top-p drops it; min-p drops whatever is below min_p * the top weight (1). */
        double cutoff = 0.0;
        if (use_top_p) cutoff = (1.0 - s->top_p) / (V - 1) * mass;
        if (use_min_p && s->min_p > cutoff) cutoff = s->min_p;
        for (int i = 0; i < V; i++) {
            if (logits[i] >= cutoff) {
                cand[n].prob = logits[i];
                cand[n].index = i;
                n++;
            }
        }
    }
    if (n == 0 || !(mass > 0.0)) return argmax(logits, V);
    qsort(cand, (size_t)n, sizeof(ProbIndex), by_prob_desc);

    /* 4. Top-p (HF TopPLogitsWarper): keep a token when the probability ranked strictly above it
     *    is below top_p, i.e. the smallest set whose mass reaches top_p; at least one token. */
    int kept = n;
    if (use_top_p) {
        double above = 0.0, limit = (double)s->top_p * mass;
        for (int i = 0; i < n; i++) {
            if (i > 0 && above >= limit) {
                kept = i;
                break;
            }
            above += cand[i].prob;
        }
    }
    /* 5. Min-p (HF MinPLogitsWarper): drop tokens less likely than min_p times the most likely
     *    one. Ratios do not change with renormalisation, so the raw weights can be compared. */
    if (use_min_p) {
        float floor_p = s->min_p * cand[0].prob;
        for (int i = 1; i < kept; i++) {
            if (cand[i].prob < floor_p) {
                kept = i;
                break;
            }
        }
    }

    /* 6. Softmax over the survivors and one multinomial draw. */
    double total = 0.0;
    for (int i = 0; i < kept; i++) total += cand[i].prob;
    double r = (double)sampler_random(s) * total, cdf = 0.0;
    for (int i = 0; i < kept; i++) {
        cdf += cand[i].prob;
        if (r < cdf) return cand[i].index;
    }
    return cand[kept - 1].index; /* rounding left r >= the sum */
}
