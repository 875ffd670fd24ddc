/* bench.c: `./run MODEL -m bench` (see bench.h): prefill and decode speed, achieved decode read
 * bandwidth, and the machine's own read bandwidth measured in the same run as the roof. */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint_map.h"
#include "kernels/kernels.h"
#include "kernels/simd_math.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {  /* CPU time of the whole process (all threads) */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- memory bandwidth ---- */

/* A streaming read over up to two spans of memory, in items of READ_CHUNK bytes that the threads
 * claim in turn: the bench's own buffer (one span), or the weights a decode token reads (two). */
#define READ_CHUNK ((size_t)1 << 20)

typedef struct {
    const uint8_t* p[2];
    size_t bytes[2];
    int first_item[3]; /* items of span s: first_item[s] .. first_item[s + 1] - 1 */
    double* sums;      /* one per item, so the reads cannot be optimised away */
    Kernels* k;        /* the model's threads, which read */
} ReadSet;

static void read_item(void* ctx, int i, int thread) {
    const ReadSet* rs = ctx;
    (void)thread;
    const int s = i >= rs->first_item[1];
    size_t a = (size_t)(i - rs->first_item[s]) * READ_CHUNK;
    size_t b = a + READ_CHUNK < rs->bytes[s] ? a + READ_CHUNK : rs->bytes[s];
    const uint8_t* buf = rs->p[s];
#if defined(KERNELS_AVX2)
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t o = a; o + 128 <= b; o += 128) {
        const __m256i* p = (const __m256i*)(buf + o);
        s0 = _mm256_xor_si256(s0, _mm256_loadu_si256(p));
        s1 = _mm256_xor_si256(s1, _mm256_loadu_si256(p + 1));
        s2 = _mm256_xor_si256(s2, _mm256_loadu_si256(p + 2));
        s3 = _mm256_xor_si256(s3, _mm256_loadu_si256(p + 3));
    }
    s0 = _mm256_xor_si256(_mm256_xor_si256(s0, s1), _mm256_xor_si256(s2, s3));
    rs->sums[i] = (double)(uint32_t)_mm256_extract_epi32(s0, 0);
#else
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t o = a; o + 32 <= b; o += 32) {
        uint64_t v[4];
        memcpy(v, buf + o, sizeof v);
        s0 ^= v[0];
        s1 ^= v[1];
        s2 ^= v[2];
        s3 ^= v[3];
    }
    rs->sums[i] = (double)((s0 ^ s1 ^ s2 ^ s3) & 0xFFFF);
#endif
}

static void read_set_free(ReadSet* rs) {
    free(rs->sums);
    memset(rs, 0, sizeof *rs);
}

/* span 1 may be empty (b1 == 0). Returns 0, or -1 when out of memory. */
static int read_set_init(ReadSet* rs, Kernels* k, const void* p0, size_t b0, const void* p1, size_t b1) {
    memset(rs, 0, sizeof *rs);
    rs->k = k;
    rs->p[0] = p0;
    rs->p[1] = p1;
    rs->bytes[0] = b0;
    rs->bytes[1] = b1;
    rs->first_item[1] = (int)((b0 + READ_CHUNK - 1) / READ_CHUNK);
    rs->first_item[2] = rs->first_item[1] + (int)((b1 + READ_CHUNK - 1) / READ_CHUNK);
    rs->sums = calloc((size_t)rs->first_item[2] + 1, sizeof(double));
    return rs->sums ? 0 : -1;
}

/* GB/s of the best of `reps` passes. */
static double read_set_best(ReadSet* rs, int reps) {
    const int n = rs->first_item[2];
    double best = 0, check = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        parallel_for(rs->k, n, read_item, rs);
        double dt = now_s() - t0;
        const double gbps = (double)(rs->bytes[0] + rs->bytes[1]) / dt / 1e9;
        if (gbps > best) best = gbps;
        for (int i = 0; i < n; i++) check += rs->sums[i];
    }
    return check < 0 ? -1 : best; /* never -1: keeps the reads observable */
}

/* The roof's buffer: 512 MiB in 2 MB pages like the weights (alloc_huge_anonymous), faulted in
 * and read once. */
static int read_buffer_init(ReadSet* rs, Kernels* k, uint8_t** buf, size_t bytes) {
    *buf = alloc_huge_anonymous(bytes);
    if (!*buf || read_set_init(rs, k, *buf, bytes, NULL, 0) != 0) return -1;
    memset(*buf, 1, bytes);
    read_set_best(rs, 1);
    return 0;
}

/* ---- bytes read per decode token ---- */

static double matrix_bytes(const Matrix* m) {
    double n = (double)m->rows * (double)m->cols;
    if (m->type == WEIGHT_F32) return 4 * n;
    if (m->type == WEIGHT_BF16) return 2 * n;
    return (double)quant_bytes(m->type, (size_t)n) + (double)QUANT_SCALE_BYTES * n / m->group_size;
}

/* Weights read by one decode step (every matrix including the head, the embedding row, norms,
 * biases), without the KV cache. */
static double weight_bytes_per_token(const Transformer* t) {
    const Config* c = &t->config;
    const Weights* w = &t->weights;
    double b = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights* lw = &w->layers[l];
        b += matrix_bytes(&lw->q_proj) + matrix_bytes(&lw->k_proj) + matrix_bytes(&lw->v_proj);
        b += matrix_bytes(&lw->o_proj);
        b += matrix_bytes(&lw->gate_proj) + matrix_bytes(&lw->up_proj) + matrix_bytes(&lw->down_proj);
        b += 2.0 * 4 * c->dim;  /* the two RMSNorm weights */
        if (lw->q_norm) b += 2.0 * 4 * c->head_dim;
        if (lw->q_bias) b += 4.0 * (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    }
    b += 4.0 * c->dim;                                                  /* final norm */
    b += matrix_bytes(&w->lm_head);                                     /* the head */
    b += matrix_bytes(&w->embed_tokens) / (double)w->embed_tokens.rows; /* one embedding row */
    return b;
}

/* The weights one decode step reads, as two spans of the mapping: model.c takes the layers'
 * tensors and then the final norm one after the other (the file's order), so they are one span
 * from the first layer's first tensor to the end of the final norm; the head is the other (the
 * embedding, before the layers, when tied). Returns 0, or -1 if the pointers are not in that
 * order (then the bench reads only its own buffer). */
static int decode_weight_spans(const Transformer* t, const uint8_t** p, size_t* bytes) {
    const Weights* w = &t->weights;
    const uint8_t* first = (const uint8_t*)w->layers[0].input_layernorm;
    const uint8_t* end = (const uint8_t*)(w->norm + t->config.dim);
    if (t->config.n_layers < 1 || end <= first) return -1;
    p[0] = first;
    bytes[0] = (size_t)(end - first);
    p[1] = w->lm_head.data;
    bytes[1] = (size_t)matrix_stored_bytes(&w->lm_head);
    return 0;
}

/* KV cache bytes read by the decode step at position p (keys and values of positions 0 .. p). */
static double kv_bytes_at(const Transformer* t, int p) {
    const Config* c = &t->config;
    return 2.0 * (double)kv_elem_bytes(&t->state) * c->n_layers * (double)(p + 1) * c->n_kv_heads * c->head_dim;
}

/* ---- the last-level cache ---- */

/* Bytes of the largest data cache of CPU 0 (/sys/devices/system/cpu/cpu0/cache: the highest
 * level of type Data or Unified), or 0 where that cannot be read. BENCH_LLC_BYTES overrides it
 * (0: compare decode with the memory roof whatever its size). */
static double last_level_cache_bytes(void) {
    const char* env = getenv("BENCH_LLC_BYTES");
    if (env && *env) {
        char* end;
        double v = strtod(env, &end);
        if (*end == '\0' && v >= 0) return v;
        fprintf(stderr, "warning: BENCH_LLC_BYTES=%s is not a number of bytes; using the CPU's\n", env);
    }
    double best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[96], type[32] = "", size[32] = "";
        int level = 0;
        FILE* f;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (!(f = fopen(path, "r"))) break;
        if (fscanf(f, "%d", &level) != 1) level = 0;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if ((f = fopen(path, "r"))) {
            if (fscanf(f, "%31s", type) != 1) type[0] = '\0';
            fclose(f);
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if ((f = fopen(path, "r"))) {
            if (fscanf(f, "%31s", size) != 1) size[0] = '\0';
            fclose(f);
        }
        if (strcmp(type, "Data") != 0 && strcmp(type, "Unified") != 0) continue;
        char* unit;
        double bytes = strtod(size, &unit);
        bytes *= *unit == 'K' ? 1024.0 : *unit == 'M' ? 1048576.0 : *unit == 'G' ? 1073741824.0 : 1.0;
        if (level > best_level && bytes > 0) {
            best_level = level;
            best = bytes;
        }
    }
    return best;
}

/* ---- the tests ---- */

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

static const char* type_name(WeightType t) {
    return t == WEIGHT_F32 ? "f32" : t == WEIGHT_BF16 ? "bf16" : t == WEIGHT_Q8 ? "q8" : "q4";
}

static int int_arg(int argc, char** argv, int i, const char* name, int* out) {
    if (i + 1 >= argc) {
        fprintf(stderr, "run: error: %s needs a value\n", name);
        return -1;
    }
    char* end;
    long v = strtol(argv[i + 1], &end, 10);
    if (*argv[i + 1] == '\0' || *end != '\0' || v < 0 || v > 1000000) {
        fprintf(stderr, "run: error: %s must be a whole number, got '%s'\n", name, argv[i + 1]);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int bench_parse_threads(const char* s, int* counts, int max_counts) {
    int n = 0;
    for (const char* p = s;; p++) {
        if (*p < '0' || *p > '9' || n == max_counts) return -1;
        char* end;
        long v = strtol(p, &end, 10);
        if (v < 1 || v > 1024) return -1;
        counts[n++] = (int)v;
        if (*end == '\0') return n;
        if (*end != ',') return -1;
        p = end;
    }
}

/* One thread count's results. */
typedef struct {
    int threads;       /* what the pool runs: kernels_set_threads may give fewer than asked */
    double best;       /* best streaming read of the run, GB/s */
    int n_reads, warm_steps;
    double *pp, *tg;   /* tok/s of each rep, in the order measured */
    double *rd;        /* the roof of each rep: best streaming read just before and just after its
                        * decode, GB/s */
    double *wr;        /* the same for a streaming read of the decode's own weights (NULL: none) */
    double wall[2], cpu[2]; /* summed over the reps: [0] prefill, [1] decode */
} ThreadRun;

/* Warm-up: one prefill, then decode steps in windows of 8 until a window is no faster than the
 * best before it (at most 20 s). The first passes over a mapped file can be much slower than the
 * rest: page faults, and on some machines pages that must come back from disk (a freshly mapped
 * file can read several times slower for its first passes; docs/design.md#bench-roof). The figures are meant to be the steady state, as
 * llama-bench's are. Returns the decode steps taken, or -1 if forward() failed. */
static int warm_up(Transformer* t, const int* tokens, int depth, int n_prompt, int n_gen) {
    if (n_prompt > 0 && !forward(t, tokens, n_prompt, depth, NULL)) return -1;
    int steps = 0;
    if (n_gen > 0) {
        const int win = n_gen < 8 ? n_gen : 8;
        double best = 1e30, t_start = now_s();
        for (;;) {
            double t0 = now_s();
            for (int i = 0; i < win; i++)
                if (!forward(t, tokens + i, 1, depth + i, NULL)) return -1;
            double dt = now_s() - t0;
            steps += win;
            if (dt > 0.95 * best || now_s() - t_start > 20.0) break;
            if (dt < best) best = dt;
        }
    }
    return steps;
}

/* One rep of each test with tr->threads: prefill of n_prompt tokens, two streaming reads, decode
 * of n_gen tokens, one more read; the best of the three is this rep's roof. The same around the
 * decode for the weights' own pages (wr: two reads before the buffer's, one after). Both tests
 * start at position depth (the cache's positions below it were filled once, bench_main). Returns
 * 0, or -1 if forward() failed. */
static int measure_rep(Transformer* t, const int* tokens, int depth, int n_prompt, int n_gen, ReadSet* rb,
                       ReadSet* wr, ThreadRun* tr, int r) {
    if (n_prompt > 0) {
        double t0 = now_s(), c0 = cpu_s();
        if (!forward(t, tokens, n_prompt, depth, NULL)) return -1;
        double dt = now_s() - t0;
        tr->pp[r] = n_prompt / dt;
        tr->wall[0] += dt;
        tr->cpu[0] += cpu_s() - c0;
    }
    if (n_gen > 0) {
        double w_before = wr ? read_set_best(wr, 2) : 0;
        double before = read_set_best(rb, 2);
        double t0 = now_s(), c0 = cpu_s();
        for (int i = 0; i < n_gen; i++)
            if (!forward(t, tokens + i, 1, depth + i, NULL)) return -1;
        double dt = now_s() - t0;
        tr->tg[r] = n_gen / dt;
        tr->wall[1] += dt;
        tr->cpu[1] += cpu_s() - c0;
        double after = read_set_best(rb, 1);
        tr->rd[r] = before > after ? before : after;
        if (tr->rd[r] > tr->best) tr->best = tr->rd[r];
        tr->n_reads += 3;
        if (wr) {
            double w_after = read_set_best(wr, 1);
            tr->wr[r] = w_before > w_after ? w_before : w_after;
        }
    }
    return 0;
}

static double median(double* v, int n) { /* sorts v */
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The median over the reps of a[r] / b[r]: rep r of two thread counts ran one after the other, so
 * their ratio is steadier on a shared machine than the ratio of the two medians. */
static double median_ratio(const double* a, const double* b, int reps, double* scratch) {
    for (int r = 0; r < reps; r++) scratch[r] = a[r] / b[r];
    return median(scratch, reps);
}

/* The median of n values, left in order (scratch: n doubles). */
static double median_of(const double* v, int n, double* scratch) {
    memcpy(scratch, v, (size_t)n * sizeof(double));
    return median(scratch, n);
}

/* Decode as a percentage of the roof: the median over the reps of each rep's GB/s over the read
 * bandwidth measured around that rep. A shared VM's memory speed can move by almost 2x within
 * seconds, so a decode rep is compared with the machine of its own moment; the best read of the
 * whole run, printed as "% of best", sits above the typical read by the run's noise (a few percent with one thread). */
static double paired_roof_pct(const double* tg, const double* roof, double bytes_per_tok, int reps,
                              double* scratch) {
    for (int r = 0; r < reps; r++) scratch[r] = 100.0 * bytes_per_tok * tg[r] / 1e9 / roof[r];
    return median(scratch, reps);
}

static void print_json_list(const char* key, const double* v, int n, const char* fmt) {
    printf("\"%s\": [", key);
    for (int i = 0; i < n; i++) {
        printf(i ? ", " : "");
        printf(fmt, v[i]);
    }
    printf("]");
}

/* What one decode token reads (weights, and the KV cache averaged over tgN), and whether that fits
 * in the last-level cache. */
typedef struct {
    double weights;    /* bytes of weights */
    double per_token;  /* bytes in all */
    double llc;        /* the last-level cache's size (0: unknown, or BENCH_LLC_BYTES=0) */
    int in_cache;
} DecodeBytes;

static DecodeBytes decode_bytes(const Transformer* t, int depth, int n_gen) {
    DecodeBytes b;
    double kv = 0;
    b.weights = weight_bytes_per_token(t);
    for (int p = 0; p < n_gen; p++) kv += kv_bytes_at(t, depth + p);
    b.per_token = n_gen > 0 ? b.weights + kv / n_gen : b.weights;
    /* Bytes per token that fit in the last-level cache are read from it, not from memory, after the
     * first token: decode is then not bound by memory bandwidth and a % of the memory roof (which
     * can exceed 100) says nothing, so none is given. */
    b.llc = last_level_cache_bytes();
    b.in_cache = n_gen > 0 && b.llc > 0 && b.per_token <= b.llc;
    return b;
}

/* How the weights are held: copied, or mapped with `huge` bytes in 2 MB pages (-1: unknown), and a
 * note where the page cache holds much of the file in small pages. */
static void print_weight_pages(const Transformer* t, long long huge) {
    const size_t two_mb = (size_t)2 << 20, whole = t->map.size / two_mb * two_mb;
    if (t->map.copied) {
        printf("bench: weights read into memory (--no-mmap)\n");
        return;
    }
    if (huge < 0) {
        printf("bench: weights mapped (page size unknown: no /proc/self/smaps)\n");
        return;
    }
    printf("bench: weights mapped, %.0f of %.0f MB in 2 MB pages%s\n", huge / 1e6, t->map.size / 1e6,
           t->map.refilled ? " (the page cache held small pages: refilled, --refill-page-cache)" : "");
    if (whole > 0 && (size_t)huge < whole - whole / 100 && !t->map.refilled)
        printf("bench: note: the page cache holds the rest of the file in small pages, which read several times "
               "slower on some VMs; --refill-page-cache drops and reads them again in 2 MB pages where the system "
               "allows (docs/design.md#page-cache-repair)\n");
}

/* The table's first lines: the model, its weights in memory, the depth and the bytes per token. */
static void print_setup(const Transformer* t, long long huge, int depth, int n_gen, const DecodeBytes* b) {
    const Config* c = &t->config;
    printf("bench: %d layers, dim %d, vocab %d, weights %s", c->n_layers, c->dim, c->vocab_size,
           type_name(c->weight_type));
    if (c->group_size) printf(" (groups of %d)", c->group_size);
    printf(", kernels %s%s, decode prefetch %s\n", kernels_simd_name(t->kernels),
           kernels_bf16_activations(t->kernels) && c->weight_type == WEIGHT_BF16 ? ", bf16 activations in prefill" : "",
           kernels_prefetch_plan(t->kernels));
    print_weight_pages(t, huge);
    if (depth > 0)
        printf("bench: depth %d: both tests start with %d positions in the KV cache (llama-bench -d)\n", depth,
               depth);
    printf("bench: bytes read per decode token: %.1f MB weights + %.2f MB KV cache (%s, average over tg%d)\n",
           b->weights / 1e6, (b->per_token - b->weights) / 1e6, t->state.kv_f16 ? "fp16" : "fp32", n_gen);
    if (b->in_cache)
        printf("bench: no %% of roof for decode: its %.1f MB per token fit in the %.1f MB last-level cache, "
               "so it is not bound by memory bandwidth (BENCH_LLC_BYTES=0 compares it anyway)\n",
               b->per_token / 1e6, b->llc / 1e6);
}

/* Each thread count's warm-up and read bandwidth, then the table's head. */
static void print_reads(const Transformer* t, const ThreadRun* runs, int n_runs, int depth, int n_gen, int reps,
                        double* scratch) {
    for (int k = 0; k < n_runs; k++) {
        printf("bench: %d thread%s: warm-up of one prefill and %d decode steps; memory read bandwidth "
               "(512 MiB streaming reads, same threads): ", runs[k].threads, runs[k].threads == 1 ? "" : "s",
               runs[k].warm_steps);
        if (n_gen > 0)
            printf("around each decode rep %.1f GB/s (median, the roof), ", median_of(runs[k].rd, reps, scratch));
        printf("best of %d %.1f GB/s", runs[k].n_reads, runs[k].best);
        const uint8_t* wp[2];
        size_t wb[2];
        if (n_gen > 0 && runs[k].wr && decode_weight_spans(t, wp, wb) == 0)
            printf("; the weights' own pages (%.1f MB) around each decode rep %.1f GB/s (median)",
                   (double)(wb[0] + wb[1]) / 1e6, median_of(runs[k].wr, reps, scratch));
        printf("\n");
    }
    if (n_runs > 1)
        printf("bench: the thread counts take turns, one rep of each after the other\n");
    printf("| test   %*s| threads | tok/s median |      min |      max |  GB/s | %% of roof | %% of best | %% of own read | cpu share |\n",
           depth > 0 ? 9 : 0, "");
    printf("|--------%.*s|---------|--------------|----------|----------|-------|-----------|-----------|---------------|-----------|\n",
           depth > 0 ? 9 : 0, "---------");
}

/* One test's figures for one thread count: test 0 is ppN, test 1 tgN (n tokens). */
typedef struct {
    char name[32], label[48];
    int width;
    double med, lo, hi; /* tok/s over the reps */
    double share;       /* CPU seconds the process got / (wall seconds x threads) */
    double gbps, roof, pct;
    int own;            /* a read of the weights' own pages was measured */
    double own_gbps, own_pct;
} TestRow;

static TestRow test_row(const ThreadRun* tr, int test, int n, int depth, int n_gen, int reps, double bytes_per_tok,
                        double* scratch) {
    TestRow row;
    memcpy(scratch, test == 0 ? tr->pp : tr->tg, (size_t)reps * sizeof(double));
    row.med = median(scratch, reps);
    row.lo = scratch[0];
    row.hi = scratch[reps - 1];
    snprintf(row.name, sizeof row.name, "%s%d", test == 0 ? "pp" : "tg", n);
    if (depth > 0) snprintf(row.label, sizeof row.label, "%s @ d%d", row.name, depth);
    else snprintf(row.label, sizeof row.label, "%s", row.name);
    row.width = depth > 0 ? 15 : 6;
    /* below 1 means the threads waited (for memory, for each other) or, on a shared machine, were
     * descheduled */
    row.share = tr->wall[test] > 0 ? tr->cpu[test] / (tr->wall[test] * tr->threads) : 0;
    row.gbps = bytes_per_tok * row.med / 1e9;
    row.roof = n_gen > 0 ? median_of(tr->rd, reps, scratch) : tr->best;
    row.pct = test == 1 ? paired_roof_pct(tr->tg, tr->rd, bytes_per_tok, reps, scratch) : 0;
    /* the same against a streaming read of the weights' own pages (null without one) */
    row.own = test == 1 && tr->wr != NULL;
    row.own_gbps = row.own ? median_of(tr->wr, reps, scratch) : 0;
    row.own_pct = row.own ? paired_roof_pct(tr->tg, tr->wr, bytes_per_tok, reps, scratch) : 0;
    return row;
}

/* One JSON line (bench.h lists its keys). */
static void print_json_row(const Transformer* t, long long huge, const ThreadRun* tr, const TestRow* row, int test,
                           int depth, int reps, int in_cache) {
    printf("{\"test\": \"%s\", \"threads\": %d, \"depth\": %d, \"tokens_per_s\": %.3f, \"min\": %.3f, "
           "\"max\": %.3f, ", row->name, tr->threads, depth, row->med, row->lo, row->hi);
    if (test == 1 && !in_cache)
        printf("\"gbps\": %.3f, \"roof_pct\": %.2f, ", row->gbps, row->pct);
    else if (test == 1)
        printf("\"gbps\": %.3f, \"roof_pct\": null, ", row->gbps);
    else
        printf("\"gbps\": null, \"roof_pct\": null, ");
    printf("\"mem_gbps\": %.3f, ", row->roof);
    if (test == 1 && !in_cache)
        printf("\"roof_pct_best\": %.2f, ", 100.0 * row->gbps / tr->best);
    else
        printf("\"roof_pct_best\": null, ");
    printf("\"mem_gbps_best\": %.3f, \"weight_type\": \"%s\", \"cpu_share\": %.3f, ", tr->best,
           type_name(t->config.weight_type), row->share);
    printf("\"prefetch\": \"%s\", ", kernels_prefetch_plan(t->kernels));
    if (huge < 0)
        printf("\"weights\": \"%s\", \"huge_pct\": null, ", t->map.copied ? "copied" : "mapped");
    else
        printf("\"weights\": \"mapped\", \"huge_pct\": %.1f, ", 100.0 * huge / t->map.size);
    printf("\"kv_cache\": \"%s\", ", t->state.kv_f16 ? "f16" : "f32");
    print_json_list("reps_tokens_per_s", test == 0 ? tr->pp : tr->tg, reps, "%.3f");
    printf(", ");
    if (test == 1) print_json_list("reps_mem_gbps", tr->rd, reps, "%.3f");
    else printf("\"reps_mem_gbps\": null");
    if (row->own && in_cache) {
        printf(", \"weights_gbps\": %.3f, \"roof_pct_weights\": null, ", row->own_gbps);
        print_json_list("reps_weights_gbps", tr->wr, reps, "%.3f");
    } else if (row->own) {
        printf(", \"weights_gbps\": %.3f, \"roof_pct_weights\": %.2f, ", row->own_gbps, row->own_pct);
        print_json_list("reps_weights_gbps", tr->wr, reps, "%.3f");
    } else {
        printf(", \"weights_gbps\": null, \"roof_pct_weights\": null, \"reps_weights_gbps\": null");
    }
    printf("}\n");
}

/* One row of the table; prefill has no bandwidth columns. */
static void print_table_row(const ThreadRun* tr, const TestRow* row, int test, int in_cache) {
    if (test == 1) {
        char own_s[16] = "            -", pct_s[16] = "        -", best_s[16] = "        -";
        if (row->own && !in_cache) snprintf(own_s, sizeof own_s, "%12.1f%%", row->own_pct);
        if (!in_cache) {
            snprintf(pct_s, sizeof pct_s, "%8.1f%%", row->pct);
            snprintf(best_s, sizeof best_s, "%8.1f%%", 100.0 * row->gbps / tr->best);
        }
        printf("| %-*s | %7d | %12.2f | %8.2f | %8.2f | %5.1f | %s | %s | %s | %8.0f%% |\n", row->width,
               row->label, tr->threads, row->med, row->lo, row->hi, row->gbps, pct_s, best_s, own_s,
               100 * row->share);
    } else {
        printf("| %-*s | %7d | %12.2f | %8.2f | %8.2f |     - |         - |         - |             - | %8.0f%% |\n",
               row->width, row->label, tr->threads, row->med, row->lo, row->hi, 100 * row->share);
    }
}

/* Each further thread count's speed against the first's. */
static void print_ratios(const ThreadRun* runs, int n_runs, int n_prompt, int n_gen, int reps, double* scratch) {
    for (int k = 1; k < n_runs; k++)
        for (int test = 0; test < 2; test++) {
            int n = test == 0 ? n_prompt : n_gen;
            if (n <= 0) continue;
            const double *a = test == 0 ? runs[k].pp : runs[k].tg, *b = test == 0 ? runs[0].pp : runs[0].tg;
            printf("bench: %s%d, %d threads / %d: %.2f (median of the reps' ratios)\n", test == 0 ? "pp" : "tg",
                   n, runs[k].threads, runs[0].threads, median_ratio(a, b, reps, scratch));
        }
}

/* A weights' read well below the buffer's says where a low % of roof comes from. */
static void note_slow_weight_pages(const ThreadRun* runs, int n_runs, int reps, double* scratch) {
    for (int k = 0; k < n_runs; k++) {
        if (!runs[k].wr) continue;
        const double own = median_of(runs[k].wr, reps, scratch), buf = median_of(runs[k].rd, reps, scratch);
        if (own < 0.85 * buf)
            printf("bench: note: with %d thread%s the weights' own pages read at %.1f GB/s, %.0f%% of the buffer's "
                   "%.1f: the memory behind this file's pages is slower than the buffer's (on a VM it can differ "
                   "from file to file); %% of own read is decode against what its pages allow\n",
                   runs[k].threads, runs[k].threads == 1 ? "" : "s", own, 100 * own / buf, buf);
    }
}

static void print_results(const Transformer* t, const ThreadRun* runs, int n_runs, int depth, int n_prompt,
                          int n_gen, int reps, int json, double* scratch) {
    const DecodeBytes b = decode_bytes(t, depth, n_gen);
    /* Read once, after the timed reps: one pass over /proc/self/smaps (milliseconds), -1 for a copy. */
    const long long huge = checkpoint_map_huge_bytes(&t->map);
    if (!json) {
        print_setup(t, huge, depth, n_gen, &b);
        print_reads(t, runs, n_runs, depth, n_gen, reps, scratch);
    }
    for (int k = 0; k < n_runs; k++) {
        const ThreadRun* tr = &runs[k];
        for (int test = 0; test < 2; test++) {
            int n = test == 0 ? n_prompt : n_gen;
            if (n <= 0) continue;
            const TestRow row = test_row(tr, test, n, depth, n_gen, reps, b.per_token, scratch);
            if (json) print_json_row(t, huge, tr, &row, test, depth, reps, b.in_cache);
            else print_table_row(tr, &row, test, b.in_cache);
        }
    }
    if (!json) print_ratios(runs, n_runs, n_prompt, n_gen, reps, scratch);
    if (!json && n_gen > 0) note_slow_weight_pages(runs, n_runs, reps, scratch);
    fflush(stdout);
}

/* The default test lengths (pp512, tg128) shrunk to the positions the KV cache has after depth, so
 * that `-m bench` runs on a model of a short context as it is. n_prompt or n_gen is NULL when the
 * user gave it: that one is kept (too_short explains it if it does not fit). Returns the default
 * lengths before shrinking in was[0] (prefill) and was[1] (decode), 0 where none was shrunk. */
static void fit_defaults(const Config* c, int depth, int* n_prompt, int* n_gen, int was[2]) {
    const int room = c->seq_len - depth;
    int* lens[2] = {n_prompt, n_gen};
    for (int k = 0; k < 2; k++) {
        was[k] = 0;
        if (room < 1 || lens[k] == NULL || *lens[k] <= room) continue;
        was[k] = *lens[k];
        *lens[k] = room;
    }
}

/* The note for each shrunk default (on stderr: --json keeps standard output to JSON lines). */
static void note_fitted(const Config* c, int depth, int n_prompt, int n_gen, const int was[2]) {
    for (int k = 0; k < 2; k++)
        if (was[k])
            fprintf(stderr, "run: note: the bench runs %s%d instead of %s%d: the %s %d positions%s (%s N sets it)\n",
                    k ? "tg" : "pp", k ? n_gen : n_prompt, k ? "tg" : "pp", was[k],
                    c->seq_len < c->max_seq_len ? "KV cache (-c) has" : "model's context is", c->seq_len,
                    depth > 0 ? ", less --bench-depth" : "", k ? "--bench-gen" : "--bench-prompt");
}

/* The error for tests longer than the context: what they need, and what to pass instead. */
static void too_short(const Config* c, int depth, int n_prompt, int n_gen) {
    const int longer = n_prompt > n_gen ? n_prompt : n_gen;
    const char* which = n_prompt >= n_gen ? "--bench-prompt" : "--bench-gen";
    char parts[96], advice[96];
    if (depth > 0) snprintf(parts, sizeof parts, "--bench-depth %d + %s %d", depth, which, longer);
    else snprintf(parts, sizeof parts, "%s %d", which, longer);
    const int limit = c->seq_len < c->max_seq_len ? c->seq_len : c->max_seq_len;
    if (depth >= limit)
        snprintf(advice, sizeof advice, "--bench-depth below %d", limit);
    else
        snprintf(advice, sizeof advice, "--bench-prompt and --bench-gen at most %d", limit - depth);
    if (depth + longer > c->max_seq_len)
        fprintf(stderr, "run: error: the bench needs a context of %d positions (%s), more than the model's %d: "
                "give %s\n", depth + longer, parts, c->max_seq_len, advice);
    else
        fprintf(stderr, "run: error: the bench needs a context of %d positions (%s), the KV cache has %d "
                "(use -c %d, or give %s)\n", depth + longer, parts, c->seq_len, depth + longer, advice);
}

/* The options of bench.h, with their defaults. */
typedef struct {
    int n_prompt, n_gen, reps, depth, json, prompt_given, gen_given;
    int counts[BENCH_MAX_THREAD_COUNTS], n_runs;
} BenchArgs;

/* Returns 0, or the exit status after an error line on stderr. */
static int parse_bench_args(int argc, char** argv, int default_threads, BenchArgs* a) {
    *a = (BenchArgs){.n_prompt = 512, .n_gen = 128, .reps = 5, .n_runs = 1};
    a->counts[0] = default_threads;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--bench-prompt") == 0) {
            if (int_arg(argc, argv, i++, "--bench-prompt", &a->n_prompt)) return 2;
            a->prompt_given = 1;
        } else if (strcmp(argv[i], "--bench-gen") == 0) {
            if (int_arg(argc, argv, i++, "--bench-gen", &a->n_gen)) return 2;
            a->gen_given = 1;
        } else if (strcmp(argv[i], "--bench-reps") == 0) {
            if (int_arg(argc, argv, i++, "--bench-reps", &a->reps)) return 2;
        } else if (strcmp(argv[i], "--bench-depth") == 0) {
            if (int_arg(argc, argv, i++, "--bench-depth", &a->depth)) return 2;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            a->n_runs = bench_parse_threads(argv[++i], a->counts, BENCH_MAX_THREAD_COUNTS);
            if (a->n_runs < 1) {
                fprintf(stderr, "run: error: --threads must be a number or a comma-separated list of up "
                        "to %d numbers in 1..1024, got '%s'\n", BENCH_MAX_THREAD_COUNTS, argv[i]);
                return 1;
            }
        } else if (strcmp(argv[i], "--json") == 0) {
            a->json = 1;
        }
    }
    if (a->reps < 1) {
        fprintf(stderr, "run: error: --bench-reps must be at least 1, got %d\n", a->reps);
        return 2;
    }
    if (a->n_prompt <= 0 && a->n_gen <= 0) {
        fprintf(stderr, "run: error: nothing to measure: --bench-prompt and --bench-gen are both 0\n");
        return 2;
    }
    return 0;
}

/* Fixed pseudo-random token ids (a 64-bit LCG), the same in every run. */
static void fill_tokens(int* tokens, int n, int vocab_size) {
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int)((s >> 33) % (uint64_t)vocab_size);
    }
}

/* Every thread count's warm-up, then the reps. results holds pp, tg, rd and wr of each rep for each
 * thread count; wr is NULL without a read of the weights' own pages. Returns 0, or -1 if forward()
 * failed. */
static int run_tests(Transformer* t, const BenchArgs* a, const int* tokens, ThreadRun* runs, double* results,
                     ReadSet* rb, ReadSet* wr) {
    const int n_runs = a->n_runs, reps = a->reps, depth = a->depth;
    /* --bench-depth: the cache's first positions, filled once; the tests (and warm-ups) only write
     * positions from depth on, so every rep starts from the same depth tokens. */
    if (depth > 0 && !forward(t, tokens, depth, 0, NULL)) return -1;
    const int* test_tokens = tokens + depth;
    /* Each thread count's first reads: 5 passes now, towards the run's best read (the decode reps
     * add their own, measure_rep). */
    for (int k = 0; k < n_runs; k++) {
        ThreadRun* tr = &runs[k];
        memset(tr, 0, sizeof *tr);
        tr->threads = kernels_set_threads(t->kernels, a->counts[k]);
        tr->pp = results + (size_t)(2 * k) * reps;
        tr->tg = results + (size_t)(2 * k + 1) * reps;
        tr->rd = results + (size_t)(2 * n_runs + k) * reps;
        tr->wr = wr ? results + (size_t)(3 * n_runs + k) * reps : NULL;
        tr->best = read_set_best(rb, 5);
        tr->n_reads = 5;
        if ((tr->warm_steps = warm_up(t, test_tokens, depth, a->n_prompt, a->n_gen)) < 0) return -1;
    }
    /* Several thread counts take turns rep by rep (in the opposite order every other rep), so that
     * a slow phase of a shared machine falls on all of them alike. */
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < n_runs; i++) {
            ThreadRun* tr = &runs[r % 2 ? n_runs - 1 - i : i];
            kernels_set_threads(t->kernels, tr->threads);
            if (measure_rep(t, test_tokens, depth, a->n_prompt, a->n_gen, rb, wr, tr, r) != 0) return -1;
        }
    return 0;
}

int bench_main(Transformer* t, int argc, char** argv) {
    BenchArgs a;
    int status = parse_bench_args(argc, argv, kernels_threads(t->kernels), &a);
    if (status != 0) return status;
    const Config* c = &t->config;
    int was[2];
    fit_defaults(c, a.depth, a.prompt_given ? NULL : &a.n_prompt, a.gen_given ? NULL : &a.n_gen, was);
    int need = a.depth + (a.n_prompt > a.n_gen ? a.n_prompt : a.n_gen);
    if (need > c->seq_len) {
        too_short(c, a.depth, a.n_prompt, a.n_gen);
        return 1;
    }
    note_fitted(c, a.depth, a.n_prompt, a.n_gen, was);
    int n_tok = need > 0 ? need : 1;
    status = 1;
    int* tokens = malloc((size_t)n_tok * sizeof(int));
    /* per thread count: pp, tg, rd and wr of each rep; then the scratch of print_results */
    double* results = calloc((size_t)(4 * a.n_runs + 1) * (size_t)a.reps, sizeof(double));
    ThreadRun runs[BENCH_MAX_THREAD_COUNTS];
    ReadSet rb = {0}, wr = {0};
    uint8_t* rb_buf = NULL;
    const uint8_t* wp[2];
    size_t wbytes[2];
    if (!tokens || !results) {
        fprintf(stderr, "run: error: out of memory\n");
        goto done;
    }
    fill_tokens(tokens, n_tok, c->vocab_size);
    if (read_buffer_init(&rb, t->kernels, &rb_buf, (size_t)512 << 20) != 0) {
        fprintf(stderr, "run: error: out of memory for the bench's 512 MiB read buffer\n");
        goto done;
    }
    /* The same streaming read over the weights a decode step reads: on a VM the physical memory
     * behind two copies of one file can read at different speeds (docs/design.md#bench-roof),
     * which a buffer of the bench's own cannot show. */
    const int own = a.n_gen > 0 && decode_weight_spans(t, wp, wbytes) == 0 &&
                    read_set_init(&wr, t->kernels, wp[0], wbytes[0], wp[1], wbytes[1]) == 0;
    if (run_tests(t, &a, tokens, runs, results, &rb, own ? &wr : NULL) != 0) {
        fprintf(stderr, "run: error: forward() failed in the bench\n");
        goto done;
    }
    print_results(t, runs, a.n_runs, a.depth, a.n_prompt, a.n_gen, a.reps, a.json,
                  results + (size_t)4 * a.n_runs * a.reps);
    status = 0;
done:
    read_set_free(&rb);
    read_set_free(&wr);
    free(rb_buf);
    free(tokens);
    free(results);
    return status;
}
