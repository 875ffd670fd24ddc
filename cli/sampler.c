/* sampler.c: from logits to the next token (see sampler.h for the order of the steps). */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int sampler_init(Sampler* s, int vocab_size, float temperature, float top_p, int top_k,
                 float min_p, float repeat_penalty, uint64_t seed) {
    *s = (Sampler){.vocab_size = vocab_size, .temperature = temperature, .top_p = top_p, .top_k = top_k,
                   .min_p = min_p, .repeat_penalty = repeat_penalty,
                   .rng_state = seed ? seed : 0x9E3779B97F4A7C15ull, /* xorshift never leaves 0 */
                   .candidates = malloc((size_t)vocab_size * sizeof(ProbIndex)),
                   .heap = malloc((size_t)vocab_size * sizeof(float)),
                   .seen = calloc((size_t)vocab_size, 1)};
    if (s->candidates && s->heap && s->seen) return 0;
    sampler_free(s);
    return -1;
}

void sampler_free(Sampler* s) {
    free(s->candidates);
    free(s->heap);
    free(s->seen);
}

/* A uniform float in [0, 1) from xorshift64* (Marsaglia's xorshift with Vigna's multiplier), as in
 * llama2.c. */
static float random_float(Sampler* s) {
    uint64_t* x = &s->rng_state;
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    const uint32_t bits = (uint32_t)((*x * 0x2545F4914F6CDD1Dull) >> 32);
    return (float)(bits >> 8) / 16777216.0f;
}

/* The first index of the largest logit, NaN skipped (-1 when every logit is NaN). Two passes, the
 * maximum in eight independent lanes and then its first position: in one pass each comparison
 * waits for the previous one's result. */
static int argmax(const float* x, int n) {
    float m[8];
    for (int k = 0; k < 8; k++) m[k] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k]; /* a NaN never wins */
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    float top = m[0];
    for (int k = 1; k < 8; k++) top = m[k] > top ? m[k] : top;
    for (i = 0; i < n; i++)
        if (x[i] == top) return i;
    return -1; /* every logit NaN */
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

/* 1. Repetition penalty (HF RepetitionPenaltyLogitsProcessor): each distinct token seen so far has
 *    its logit divided by the penalty when positive, multiplied when negative. */
static void apply_repetition_penalty(Sampler* s, float* logits, const int* history, int n_history) {
    const int V = s->vocab_size;
    if (!(s->repeat_penalty != 1.0f && s->repeat_penalty > 0.0f)) return;
    for (int i = 0; i < n_history; i++) {
        int id = history[i];
        if (id < 0 || id >= V || s->seen[id]) continue;
        s->seen[id] = 1;
        logits[id] = logits[id] < 0.0f ? logits[id] * s->repeat_penalty : logits[id] / s->repeat_penalty;
    }
    for (int i = 0; i < n_history; i++)
        if (history[i] >= 0 && history[i] < V) s->seen[history[i]] = 0;
}

/* The tokens still in the running, in s->candidates, with weights w = exp(logit - max): the softmax
 * up to its normalisation `mass`; the most likely token has weight 1. They are in two groups: `sure`
 * tokens, certainly inside the top-p nucleus, at cand[0 .. n_sure), and `band` tokens, sorted to
 * decide which of them top-p keeps, right after them at band() = cand + n_sure, n_band of them. */
typedef struct {
    ProbIndex* cand;
    int n_sure, n_band;
    double mass;      /* the weight of the whole vocabulary, or of top-k's survivors */
    double sure_mass; /* the weight of the sure tokens */
} Candidates;

static ProbIndex* band(const Candidates* c) { return c->cand + c->n_sure; }

/* 3. Top-k (HF TopKLogitsWarper): keep every logit >= the k-th largest (ties with the k-th stay
 *    too), all of them in the band. HF renormalises afterwards: top-p's fractions refer to the
 *    survivors. */
static void keep_top_k(Sampler* s, const float* logits, float max_logit, Candidates* c) {
    const int V = s->vocab_size;
    float threshold = kth_largest(logits, V, s->top_k, s->heap);
    for (int i = 0; i < V; i++) {
        if (logits[i] >= threshold) {
            c->cand[c->n_band++] = (ProbIndex){expf(logits[i] - max_logit), i};
            c->mass += c->cand[c->n_band - 1].prob;
        }
    }
}

/* The weights of the whole vocabulary, in place of the logits; returns their sum. */
static double weigh_vocabulary(float* logits, int V, float max_logit) {
    double mass = 0.0;
    for (int i = 0; i < V; i++) {
        logits[i] = expf(logits[i] - max_logit);
        mass += logits[i];
    }
    return mass;
}

/* 6. without any filter: one multinomial draw over the whole vocabulary, nothing to sort. */
static int draw_from_vocabulary(Sampler* s, const float* weights, double mass) {
    const int V = s->vocab_size;
    double r = (double)random_float(s) * mass, cdf = 0.0;
    for (int i = 0; i < V; i++) {
        cdf += weights[i];
        if (r < cdf) return i;
    }
    return argmax(weights, V); /* rounding left r >= the sum */
}

/* Top-p and min-p without top-k, by thresholds instead of a sort of 151,936 weights: tokens with
 * w < lo are out, tokens with w >= hi are sure, only those in between (the band) are sorted. This
 * is exact because:
 *  - a token below (1 - top_p) / (V - 1) of the mass has more than top_p of the mass ranked above
 *    it, so top-p drops it (llama2.c's cutoff); min-p drops every w < min_p;
 *  - for any threshold t, the tokens with w >= t form a prefix of the sorted order, so if they
 *    carry >= top_p of the mass the nucleus lies inside them (lo may rise to t), and if they carry
 *    less they all lie inside the nucleus (hi may drop to t).
 * This first step keeps the tokens with w >= lo, all in the band for top-p; for min-p alone every
 * one of them is sure. Returns lo. */
static float keep_above_cutoff(const Sampler* s, const float* weights, int use_top_p, Candidates* c) {
    const int V = s->vocab_size;
    float lo = use_top_p ? (float)((1.0 - s->top_p) / (V - 1) * c->mass) : 0.0f;
    if (s->min_p > lo) lo = s->min_p;
    for (int i = 0; i < V; i++)
        if (weights[i] >= lo) c->cand[c->n_band++] = (ProbIndex){weights[i], i};
    if (!use_top_p) { /* min-p alone: every candidate stays */
        c->n_sure = c->n_band;
        c->n_band = 0;
    }
    return lo;
}

/* 4a. Top-p's band narrowed by bisection between lo and hi (in log space: weights span many orders
 *     of magnitude), each step looking only at the band, until it is small enough to sort. */
static void narrow_top_p_band(const Sampler* s, Candidates* c, float lo) {
    float hi = 2.0f; /* > every weight */
    double target = (double)s->top_p * c->mass;
    while (c->n_band > 256) {
        float mid = expf(0.5f * (logf(lo > 1e-30f ? lo : 1e-30f) + logf(hi)));
        if (!(mid > lo && mid < hi)) break; /* float resolution reached */
        /* the band's w >= mid first, in their order, and the mass of every token with w >= mid */
        ProbIndex* b = band(c);
        double above = c->sure_mass;
        int kept = 0;
        for (int j = 0; j < c->n_band; j++) {
            if (b[j].prob < mid) continue;
            above += b[j].prob;
            const ProbIndex tmp = b[kept];
            b[kept++] = b[j];
            b[j] = tmp;
        }
        if (above >= target) { /* the nucleus is inside w >= mid: drop the rest of the band */
            lo = mid;
            c->n_band = kept;
        } else { /* every w >= mid is in the nucleus: they become sure tokens */
            hi = mid;
            c->sure_mass = above;
            c->n_sure += kept;
            c->n_band -= kept;
        }
    }
}

/* 4b. Top-p (HF TopPLogitsWarper) on the sorted band: a token stays when the mass ranked strictly
 *     above it is below top_p: the smallest set that reaches top_p, and at least one token. */
static void cut_top_p(const Sampler* s, Candidates* c) {
    const ProbIndex* b = band(c);
    double above = c->sure_mass, target = (double)s->top_p * c->mass;
    for (int j = 0; j < c->n_band; j++) {
        if ((j > 0 || c->n_sure > 0) && above >= target) {
            c->n_band = j;
            break;
        }
        above += b[j].prob;
    }
}

/* 5. Min-p (HF MinPLogitsWarper): drop tokens less likely than min_p times the most likely one,
 *    whose weight is 1; renormalisation does not change these ratios. With min-p off the floor is
 *    0. The survivors stay in their order, all sure: cand[0 .. n_sure). */
static void keep_min_p(Candidates* c, float floor_w) {
    int kept = 0;
    for (int j = 0; j < c->n_sure + c->n_band; j++)
        if (c->cand[j].prob >= floor_w) c->cand[kept++] = c->cand[j];
    c->n_sure = kept;
    c->n_band = 0;
}

/* 6. Softmax over the survivors and one multinomial draw; -1 when none is left. */
static int draw_candidate(Sampler* s, const Candidates* c) {
    double total = 0.0;
    for (int j = 0; j < c->n_sure; j++) total += c->cand[j].prob;
    double r = (double)random_float(s) * total, cdf = 0.0;
    int last = -1;
    for (int j = 0; j < c->n_sure; j++) {
        cdf += c->cand[j].prob;
        last = c->cand[j].index;
        if (r < cdf) return last;
    }
    return last; /* rounding left r >= the sum */
}

int sampler_sample(Sampler* s, float* logits, const int* history, int n_history) {
    const int V = s->vocab_size;
    apply_repetition_penalty(s, logits, history, n_history);
    const int top = argmax(logits, V);
    if (s->temperature <= 0.0f || top < 0) return top; /* greedy decoding, no randomness */
    for (int i = 0; i < V; i++) logits[i] /= s->temperature; /* 2. temperature */
    float max_logit = logits[top];
    /* a temperature so small that the largest logit over it is infinite: the limit, greedy (and not
     * the first of the logits that also went to infinity) */
    if (!isfinite(max_logit)) return top;

    const int use_top_k = s->top_k > 0 && s->top_k < V;
    const int use_top_p = s->top_p > 0.0f && s->top_p < 1.0f;
    const int use_min_p = s->min_p > 0.0f;
    Candidates c = {s->candidates, 0, 0, 0.0, 0.0};
    if (use_top_k) {
        keep_top_k(s, logits, max_logit, &c);
    } else {
        c.mass = weigh_vocabulary(logits, V, max_logit);
        if (!use_top_p && !use_min_p) return draw_from_vocabulary(s, logits, c.mass);
        float lo = keep_above_cutoff(s, logits, use_top_p, &c);
        if (use_top_p) narrow_top_p_band(s, &c, lo);
    }
    if (c.n_sure + c.n_band == 0 || !(c.mass > 0.0)) return argmax(logits, V);
    qsort(band(&c), (size_t)c.n_band, sizeof(ProbIndex), by_prob_desc);
    if (use_top_p) cut_top_p(s, &c);
    keep_min_p(&c, use_min_p ? s->min_p : 0.0f);
    int id = draw_candidate(s, &c);
    return id >= 0 ? id : argmax(logits, V);
}
