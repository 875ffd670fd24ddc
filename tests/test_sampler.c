/* tests/test_sampler.c: checks sampler.c against a literal, slow transcription of HF's processors
 * (full sorts, ascending cumsum for top-p), by the kept set and by empirical frequencies over a
 * fixed-seed run of draws per setting (so the counts are deterministic), plus greedy and seeds. */
#include "cli/sampler.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}
typedef struct {
    float v;
    int i;
} VI;
static int cmp_vi_asc(const void *a, const void *b) {
    const VI *x = a;
    const VI *y = b;
    if (x->v != y->v)
        return x->v < y->v ? -1 : 1;
    return (x->i < y->i) - (x->i > y->i);
}

/* HF reference: returns probabilities in p[V] */
static void hf_ref(const float *logits0, int V, const int *hist, int nh, float T, int k,
                   float top_p, float min_p, float pen, double *p) {
    float *s = malloc(V * sizeof(float));
    memcpy(s, logits0, V * sizeof(float));
    if (pen != 1.0f) {
        float *g = malloc(nh * sizeof(float));
        for (int i = 0; i < nh; i++)
            g[i] = s[hist[i]];
        for (int i = 0; i < nh; i++)
            s[hist[i]] = g[i] < 0 ? g[i] * pen : g[i] / pen;
        free(g);
    }
    for (int i = 0; i < V; i++)
        s[i] /= T;
    if (k > 0 && k < V) {
        float *c = malloc(V * sizeof(float));
        memcpy(c, s, V * sizeof(float));
        qsort(c, V, sizeof(float), cmp_desc);
        float kth = c[k - 1];
        for (int i = 0; i < V; i++)
            if (s[i] < kth)
                s[i] = -INFINITY;
        free(c);
    }
    if (top_p > 0 && top_p < 1) {
        VI *a = malloc(V * sizeof(VI));
        for (int i = 0; i < V; i++) {
            a[i].v = s[i];
            a[i].i = i;
        }
        qsort(a, V, sizeof(VI), cmp_vi_asc);
        double m = -INFINITY, z = 0;
        for (int i = 0; i < V; i++)
            if (a[i].v > m)
                m = a[i].v;
        for (int i = 0; i < V; i++)
            z += exp(a[i].v - m);
        double cum = 0;
        for (int i = 0; i < V; i++) {
            cum += exp(a[i].v - m) / z;
            if (cum <= 1 - top_p && i < V - 1)
                s[a[i].i] = -INFINITY;
        }
        free(a);
    }
    if (min_p > 0) {
        double m = -INFINITY;
        for (int i = 0; i < V; i++)
            if (s[i] > m)
                m = s[i];
        for (int i = 0; i < V; i++)
            if (exp(s[i] - m) < min_p)
                s[i] = -INFINITY;
    }
    double m = -INFINITY, z = 0;
    for (int i = 0; i < V; i++)
        if (s[i] > m)
            m = s[i];
    for (int i = 0; i < V; i++) {
        p[i] = exp(s[i] - m);
        z += p[i];
    }
    for (int i = 0; i < V; i++)
        p[i] /= z;
    free(s);
}

int main(void) {
    int V = 1000, fails = 0, N = 40000; /* draws per setting: fixed seeds, so the counts are deterministic */
    float *logits = malloc(V * sizeof(float));
    float *work = malloc(V * sizeof(float));
    double *p = malloc(V * sizeof(double));
    long *cnt = malloc(V * sizeof(long));
    unsigned long long r = 12345;
    for (int i = 0; i < V; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        logits[i] = ((r >> 33) % 10000) / 1000.0f - 3.0f;
    }
    logits[5] = logits[7] = 8.0f; /* a tie */
    int hist[] = {5, 10, 10, 999, 3, 0};
    struct {
        float T;
        int k;
        float tp, mp, pen;
    } cases[] = {
        {1, 0, 0, 0, 1},         {1, 0, 0, 0, 1},        {1, 0, 0, 0, 1},
        {0.7f, 20, 0, 0, 1},     {1, 0, 0.9f, 0, 1},     {1, 0, 0.5f, 0, 1},
        {0.6f, 20, 0.95f, 0, 1}, {1, 0, 0, 0.1f, 1},     {1.3f, 50, 0.8f, 0.05f, 1.5f},
        {1, 2, 0, 0, 1},         {1, 0, 0.99f, 0, 0.7f}, {0.5f, 1, 0.5f, 0, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        hf_ref(logits, V, hist, 6, cases[c].T, cases[c].k, cases[c].tp, cases[c].mp, cases[c].pen,
               p);
        Sampler s;
        sampler_init(&s, V, cases[c].T, cases[c].tp, cases[c].k, cases[c].mp, cases[c].pen, 42 + c);
        memset(cnt, 0, V * sizeof(long));
        for (int n = 0; n < N; n++) {
            memcpy(work, logits, V * sizeof(float));
            cnt[sampler_sample(&s, work, hist, 6)]++;
        }
        double worst = 0;
        int support_bad = 0, nsup = 0;
        for (int i = 0; i < V; i++) {
            double f = (double)cnt[i] / N;
            if (p[i] == 0 && cnt[i])
                support_bad++;
            if (p[i] > 0)
                nsup++;
            double sd = sqrt(p[i] * (1 - p[i]) / N) + 1e-9;
            double z = fabs(f - p[i]) / sd;
            if (N * p[i] >= 20 && z > worst)
                worst = z;
        }
        int ok = !support_bad && worst < 5.5;
        printf("case %zu T=%.2f k=%d top_p=%.2f min_p=%.2f pen=%.2f: support %d, worst z %.2f, "
               "outside %d -> %s\n",
               c, cases[c].T, cases[c].k, cases[c].tp, cases[c].mp, cases[c].pen, nsup, worst,
               support_bad, ok ? "ok" : "FAIL");
        fails += !ok;
        sampler_free(&s);
    }
    /* greedy: argmax after penalty, deterministic */
    {
        Sampler s;
        sampler_init(&s, V, 0, 0.9f, 20, 0, 1, 1);
        memcpy(work, logits, V * sizeof(float));
        int a = sampler_sample(&s, work, hist, 0);
        printf("greedy no penalty -> %d (expect 5, tie 5/7 -> first)\n", a);
        fails += a != 5;
        sampler_free(&s);
        sampler_init(&s, V, 0, 0.9f, 20, 0, 2.0f, 1);
        memcpy(work, logits, V * sizeof(float));
        a = sampler_sample(&s, work, hist, 6);
        printf("greedy penalty on 5 -> %d (expect 7)\n", a);
        fails += a != 7;
        sampler_free(&s);
    }
    /* a temperature so small that the logits over it overflow: the largest logit's token, as T -> 0
     * (4 and 5 over 1e-38 both go to infinity; 1 does not) */
    {
        const float tiny[3] = {4, 1, 5};
        float y[3];
        int bad = 0;
        for (int filter = 0; filter < 3; filter++) {
            Sampler s;
            sampler_init(&s, 3, 1e-38f, filter == 1 ? 0.9f : 0, filter == 2 ? 2 : 0, 0, 1, 1);
            memcpy(y, tiny, sizeof y);
            bad += sampler_sample(&s, y, hist, 0) != 2;
            sampler_free(&s);
        }
        printf("temperature 1e-38 (plain, top-p, top-k): %d of 3 not the largest -> %s\n", bad, bad ? "FAIL" : "ok");
        fails += bad != 0;
    }
    /* greedy = the first index of the largest logit, NaN skipped, -1 if all are NaN: against the
     * one-pass definition, on lengths around sampler.c's 8-wide blocks, with ties, NaNs and
     * infinities at the ends and in the middle. */
    {
        int bad = 0, checked = 0;
        unsigned long long g = 99;
        float x[37], y[37];
        for (int trial = 0; trial < 4000; trial++) {
            int n = 1 + trial % 37;
            for (int i = 0; i < n; i++) {
                g = g * 6364136223846793005ull + 1442695040888963407ull;
                int u = (int)(g >> 58); /* 0 .. 63 */
                x[i] = u < 6 ? NAN : u < 8 ? -INFINITY : u < 9 ? INFINITY : (float)(u % 5); /* ties */
            }
            if (trial % 10 == 0)
                for (int i = 0; i < n; i++) x[i] = trial % 20 ? NAN : -INFINITY;
            int want = 0;
            for (int i = 1; i < n; i++)
                if (x[i] > x[want] || (x[want] != x[want] && x[i] == x[i])) want = i;
            if (x[want] != x[want]) want = -1; /* every one NaN */
            Sampler s;
            sampler_init(&s, n, 0, 0, 0, 0, 1, 1);
            memcpy(y, x, (size_t)n * sizeof(float));
            int a = sampler_sample(&s, y, hist, 0);
            sampler_free(&s);
            bad += a != want;
            checked++;
        }
        printf("greedy edge cases (NaN, ties, +-inf, n = 1 .. 37): %d of %d differ -> %s\n", bad, checked,
               bad ? "FAIL" : "ok");
        fails += bad != 0;
    }
    /* same seed, same tokens */
    {
        Sampler s1, s2;
        sampler_init(&s1, V, 1, 0.9f, 0, 0, 1, 77);
        sampler_init(&s2, V, 1, 0.9f, 0, 0, 1, 77);
        int diff = 0;
        for (int n = 0; n < 1000; n++) {
            memcpy(work, logits, V * sizeof(float));
            int a = sampler_sample(&s1, work, hist, 6);
            memcpy(work, logits, V * sizeof(float));
            diff += a != sampler_sample(&s2, work, hist, 6);
        }
        printf("same seed -> %d differences\n", diff);
        fails += diff != 0;
        sampler_free(&s1);
        sampler_free(&s2);
    }
    printf("%d failed\n", fails);
    free(logits);
    free(work);
    free(p);
    free(cnt);
    return fails != 0;
}
