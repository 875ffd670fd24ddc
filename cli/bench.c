/* bench.c: `./run MODEL -m bench` (see bench.h): prefill and decode speed, achieved decode read
 * bandwidth, and the machine's own read bandwidth measured in the same run as the roof. */
#include "bench.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "cli/bench_plan.h"
#include "cli/generation.h"
#include "cli/peak.h"
#include "kernels/kernels.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* Test 0 is prefill (ppN), test 1 decode (tgN). */
static const char* const TEST_NAME[2] = {"pp", "tg"};
static const char* const TYPE_NAME[] = {[WEIGHT_F32] = "f32", [WEIGHT_BF16] = "bf16", [WEIGHT_Q8] = "q8",
                                        [WEIGHT_Q4] = "q4"};

static double seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A streaming read over up to two spans of memory, in items of READ_CHUNK bytes that the threads
 * claim in turn: the bench's own buffer (one span), or the weights a decode token reads (two). */
#define READ_CHUNK ((size_t)1 << 20)

typedef struct {
    const uint8_t* p[2];
    size_t bytes[2];
    int first_item[3]; /* items of span s: first_item[s] .. first_item[s + 1] - 1 */
    double* sums;      /* one per item, so the reads cannot be optimised away */
    const Ops* k;      /* the model's ops, whose threads read */
} ReadSet;

static void read_item(void* ctx, int i, int thread) {
    const ReadSet* rs = ctx;
    const int s = i >= rs->first_item[1];
    size_t a = (size_t)(i - rs->first_item[s]) * READ_CHUNK;
    size_t b = a + READ_CHUNK < rs->bytes[s] ? a + READ_CHUNK : rs->bytes[s];
    const uint8_t* buf = rs->p[s];
#if defined(__AVX2__)
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

/* span 1 may be empty (b1 == 0). Returns 0, or -1 when out of memory. */
static int read_set_init(ReadSet* rs, const Ops* k, const void* p0, size_t b0, const void* p1, size_t b1) {
    *rs = (ReadSet){{p0, p1}, {b0, b1}, {0}, NULL, k};
    rs->first_item[1] = (int)((b0 + READ_CHUNK - 1) / READ_CHUNK);
    rs->first_item[2] = rs->first_item[1] + (int)((b1 + READ_CHUNK - 1) / READ_CHUNK);
    rs->sums = calloc((size_t)rs->first_item[2] + 1, sizeof(double));
    return rs->sums ? 0 : -1;
}

/* GB/s of the best of `reps` passes. */
static double read_set_best(ReadSet* rs, int reps) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = seconds(CLOCK_MONOTONIC);
        rs->k->parallel_for(rs->k, rs->first_item[2], read_item, rs);
        double dt = seconds(CLOCK_MONOTONIC) - t0;
        best = fmax(best, (double)(rs->bytes[0] + rs->bytes[1]) / dt / 1e9);
    }
    return best;
}

static double matrix_bytes(const Matrix* m) {
    double n = (double)m->rows * (double)m->cols;
    if (m->type == WEIGHT_F32) return 4 * n;
    if (m->type == WEIGHT_BF16) return 2 * n;
    return (double)quant_bytes(m->type, (size_t)n) + (double)QUANT_SCALE_BYTES * n / m->group_size;
}

/* The first word of /sys/devices/system/cpu/cpu0/cache/index<i>/<name> into word[32] ("" where
 * none). Returns -1 where there is no such file. */
static int read_cache_info(int i, const char* name, char* word) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, name);
    FILE* f = fopen(path, "r");
    word[0] = '\0';
    if (!f) return -1;
    if (fscanf(f, "%31s", word) != 1) word[0] = '\0';
    fclose(f);
    return 0;
}

/* Bytes of the largest data cache of CPU 0 (the highest level of type Data or Unified), or -1
 * where that cannot be read (some VMs have no /sys/devices/system/cpu/cpu0/cache; the CPUID the
 * C library reads instead can be the whole socket's, 512 MB on one such Zen 5). BENCH_LLC_BYTES
 * overrides it (0: compare decode with the memory roof whatever its size). */
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
    char level[32], type[32], size[32];
    for (int i = 0; i < 16 && read_cache_info(i, "level", level) == 0; i++) {
        read_cache_info(i, "type", type);
        read_cache_info(i, "size", size);
        char* unit;
        double bytes = strtod(size, &unit);
        bytes *= *unit == 'K' ? 1024.0 : *unit == 'M' ? 1048576.0 : *unit == 'G' ? 1073741824.0 : 1.0;
        const int data = strcmp(type, "Data") == 0 || strcmp(type, "Unified") == 0;
        if (data && atoi(level) > best_level && bytes > 0) {
            best_level = atoi(level);
            best = bytes;
        }
    }
    return best_level ? best : -1;
}

/* The reps' wall time below which no cpu share is given (test_row says why). */
#define SHARE_MIN_WALL 0.25

/* One thread count's results. */
typedef struct {
    int threads;       /* what the pool runs: kernels_set_threads may give fewer than asked */
    int warm_steps;    /* decode steps of the warm-up */
    double best;       /* best streaming read of the run, GB/s */
    double* tps[2];    /* tok/s of each rep of each test, in the order measured */
    double* rd;        /* each rep's roof, GB/s: the best streaming read just before and after its decode */
    double* wr;        /* the same for a streaming read of the decode's own weights (NULL: none) */
    double wall[2], cpu[2]; /* of each test, summed over the complete reps */
    double rep_wall[2], rep_cpu[2]; /* the same for the rep under way, added when every count ran it */
    double peak;       /* the compute roof: ops/s of prefill's instruction on these threads (0: none) */
} ThreadRun;

/* One run of the bench: its options, the runs of each thread count, what a token costs. */
typedef struct {
    Transformer* t;
    int len[2];        /* tokens of each test (0: not run); a default length is fitted to the context */
    int reps, depth, json;
    int counts[BENCH_MAX_THREAD_COUNTS], n_runs;
    ThreadRun runs[BENCH_MAX_THREAD_COUNTS];
    const int* tokens; /* each test's tokens, after the depth's */
    ReadSet buffer;    /* the bench's own 512 MiB */
    ReadSet weights;   /* the weights a decode step reads (sums NULL: not measured) */
    double* scratch;   /* reps doubles */
    double weight_bytes, bytes_per_token; /* read by one decode token (KV cache: average over tgN) */
    double llc;        /* the last-level cache's size (-1: unknown; 0: BENCH_LLC_BYTES=0) */
    int in_cache;      /* bytes_per_token fit in it */
    double matmul_ops, attention_ops; /* per prefill token: a multiply-add counts 2 */
    const char* peak_instruction;     /* what peak_ops timed */
    double experts_per_chunk; /* Qwen3-MoE: distinct experts a MoE layer multiplies in a prefill chunk,
                               * the mean over layers and chunks (0: dense, or no prefill) */
    int show;          /* stderr is a terminal: a progress line, written over */
    int reps_done;     /* reps every thread count has completed */
} Bench;

/* The progress line on a terminal ("\rbench: ..."), written over by the next and cleared by
 * progress_end; nothing elsewhere. */
__attribute__((format(printf, 2, 3))) static void progress(const Bench* b, const char* format, ...) {
    if (!b->show) return;
    va_list ap;
    va_start(ap, format);
    fputs("\rbench: ", stderr);
    vfprintf(stderr, format, ap);
    fputs("\033[K", stderr);
    va_end(ap);
}

static void progress_end(const Bench* b) {
    if (b->show) fputs("\r\033[K", stderr);
}

/* The KV cache positions the tests take: the depth and the longer test. */
static int positions_needed(int depth, const int* len) { return depth + (len[0] > len[1] ? len[0] : len[1]); }

int bench_positions(const BenchOptions* o) { return positions_needed(o->depth, o->len); }

/* n tokens of one test from position depth: prefill in forward()'s own chunks of max_batch rows (in
 * every build: the experts' count, count_prefill_experts, is per chunk), decode a token at a time.
 * 0, 1 when a Ctrl-C stopped it between two chunks or tokens, or -1 if forward() failed. */
static int run_test(Transformer* t, const int* tokens, int test, int n, int depth) {
    if (test == 0) {
        for (int i = 0, nb; i < n; i += nb) {
            if (i > 0 && ctrl_c_pressed) return 1;
            nb = n - i < t->state.max_batch ? n - i : t->state.max_batch;
            if (!forward(t, tokens + i, nb, depth + i, NULL)) return -1;
        }
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (ctrl_c_pressed) return 1;
        if (!forward(t, tokens + i, 1, depth + i, NULL)) return -1;
    }
    return 0;
}

/* From the expert products one prefill ran: how many distinct experts a MoE layer's chunk read.
 * Every prefill of the bench has the same tokens, so one count holds for all of them. */
static void count_prefill_experts(Bench* b, long long products) {
    const Config* c = &b->t->config;
    int moe_layers = 0;
    for (int l = 0; l < c->n_layers; l++) moe_layers += config_layer_is_moe(c, l);
    const int chunk = b->t->state.max_batch, chunks = (b->len[0] + chunk - 1) / chunk;
    if (moe_layers > 0 && b->len[0] > 0) b->experts_per_chunk = (double)products / (moe_layers * chunks);
}

/* Warm-up: one prefill, then decode steps in windows of 8 until a window is no faster than the
 * best before it (at most 20 s). The first passes over a mapped file can be much slower (page
 * faults, on some machines pages back from disk: docs/design.md#bench-roof); the figures are the
 * steady state, as llama-bench's are. Returns the decode steps taken, or -1 if forward() failed. */
static int warm_up(Bench* b) {
    const long long experts_before = b->t->state.experts_run;
    const int pre = b->len[0] > 0 ? run_test(b->t, b->tokens, 0, b->len[0], b->depth) : 0;
    if (pre != 0) return pre < 0 ? -1 : 0;
    count_prefill_experts(b, b->t->state.experts_run - experts_before);
    if (b->len[1] <= 0) return 0;
    const int win = b->len[1] < 8 ? b->len[1] : 8;
    double best = 1e30, t_start = seconds(CLOCK_MONOTONIC);
    for (int steps = win;; steps += win) {
        double t0 = seconds(CLOCK_MONOTONIC);
        const int r = run_test(b->t, b->tokens, 1, win, b->depth);
        if (r != 0) return r < 0 ? -1 : steps - win;
        double dt = seconds(CLOCK_MONOTONIC) - t0;
        if (dt > 0.95 * best || seconds(CLOCK_MONOTONIC) - t_start > 20.0 || ctrl_c_pressed) return steps;
        if (dt < best) best = dt;
    }
}

/* Rep r of one test: its tok/s, and its wall and CPU time added to the sums. 0, 1 when a Ctrl-C
 * stopped it (nothing added), or -1 if forward() failed. */
static int time_test(Bench* b, ThreadRun* tr, int test, int r) {
    double t0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
    const int stopped = run_test(b->t, b->tokens, test, b->len[test], b->depth);
    if (stopped != 0) return stopped;
    double dt = seconds(CLOCK_MONOTONIC) - t0;
    tr->tps[test][r] = b->len[test] / dt;
    tr->rep_wall[test] += dt;
    tr->rep_cpu[test] += seconds(CLOCK_PROCESS_CPUTIME_ID) - c0;
    return 0;
}

/* One rep of each test with tr->threads: prefill, two streaming reads, decode, one more read; the
 * best of the three is this rep's roof. The same around the decode for the weights' own pages
 * (two reads before the buffer's, one after). Returns 0, 1 when a Ctrl-C stopped it (the rep not
 * complete), or -1 if forward() failed. */
static int measure_rep(Bench* b, ThreadRun* tr, int r) {
    const int pre = b->len[0] > 0 ? time_test(b, tr, 0, r) : 0;
    if (pre != 0) return pre;
    if (b->len[1] <= 0) return 0;
    const double own_before = tr->wr ? read_set_best(&b->weights, 2) : 0;
    const double before = read_set_best(&b->buffer, 2);
    const int dec = time_test(b, tr, 1, r);
    if (dec != 0) return dec;
    tr->rd[r] = fmax(before, read_set_best(&b->buffer, 1));
    tr->best = fmax(tr->best, tr->rd[r]);
    if (tr->wr) tr->wr[r] = fmax(own_before, read_set_best(&b->weights, 1));
    return 0;
}

/* Tokens in each product of test (0 prefill, 1 decode): in its first chunk, or with last in the
 * prompt's last chunk where that is shorter (0 where it is not): forward() takes max_batch rows
 * a chunk. */
static int product_tokens(const Bench* b, int test, int last) {
    const int chunk = b->t->state.max_batch, len = b->len[0];
    if (test == 1) return last ? 0 : 1;
    if (!last) return len < chunk ? len : chunk;
    return len > chunk ? len % chunk : 0;
}

/* The plans of test's products (cli/bench_plan.c) in its first or last chunk; returns how many groups. */
#define MAX_PLAN_GROUPS 16
static int test_plans(const Bench* b, int test, int last, PlanGroup* g) {
    const int n = product_tokens(b, test, last);
    return n > 0 ? bench_plan_groups(b->t, n, g, MAX_PLAN_GROUPS) : 0;
}

/* One look at the compute roof with tr->threads, kept where better than the one before: a tenth of
 * a second of the instruction that prefill of this weight format relies on (cli/peak.c), as steady
 * as a longer look (docs/design.md#compute-roof); none where a product of prefill runs on AMX. */
#define ROOF_LOOK_SECONDS 0.1
static void look_at_compute_roof(Bench* b, ThreadRun* tr) {
    PlanGroup g[MAX_PLAN_GROUPS];
    int on_amx = 0;
    for (int last = 0; last < 2; last++)
        for (int i = test_plans(b, 0, last, g) - 1; i >= 0; i--) on_amx |= g[i].amx;
    b->t->kernels->set_threads(b->t->kernels, tr->threads);
    tr->peak = fmax(tr->peak, peak_ops(b->t->kernels, b->t->config.weight_type, on_amx, ROOF_LOOK_SECONDS,
                                       &b->peak_instruction));
}

/* Test's kernels in its first or last chunk as text: "every matrix: PLAN", or "NAMES: PLAN;
 * NAMES: PLAN ..."; empty where the chunk is not there. */
#define PLANS_TEXT_LEN 4096
static void plans_text(const Bench* b, int test, int last, char* text, size_t len) {
    PlanGroup g[MAX_PLAN_GROUPS];
    const int n = test_plans(b, test, last, g);
    size_t at = 0;
    text[0] = 0;
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(text + at, len - at, "%s%s: %s", i ? "; " : "", n == 1 ? "every matrix" : g[i].names,
                               g[i].text);
}

/* Every thread count's warm-up, then the reps. results: 4 x reps doubles per thread count.
 * Returns 0 (b->reps_done of them), or -1 if forward() failed. A Ctrl-C stops it between steps
 * (ctrl_c_pressed set, b->reps_done the reps complete by then). */
static int run_tests(Bench* b, double* results) {
    /* --bench-depth: the cache's first positions, filled once; the tests (and warm-ups) only write
     * positions from depth on, so every rep starts from the same depth tokens. */
    if (b->depth > 0) {
        PromptProgress fill = {.label = "bench: depth", .show = b->show, .stop = &ctrl_c_pressed};
        int stopped = 0;
        const float* done = forward_prompt(b->t, b->tokens - b->depth, b->depth, 0, NULL, prompt_progress, &fill,
                                           &stopped);
        prompt_progress_end(&fill);
        if (stopped) return 0;
        if (!done) return -1;
    }
    for (int k = 0; k < b->n_runs && !ctrl_c_pressed; k++) {
        ThreadRun* tr = &b->runs[k];
        double* v = results + (size_t)4 * k * b->reps;
        *tr = (ThreadRun){.threads = b->t->kernels->set_threads(b->t->kernels, b->counts[k]),
                          .tps = {v, v + b->reps}, .rd = v + 2 * b->reps,
                          .wr = b->weights.sums ? v + 3 * b->reps : NULL};
        progress(b, "warm-up, %d thread%s", tr->threads, tr->threads == 1 ? "" : "s");
        tr->best = read_set_best(&b->buffer, 5); /* towards the run's best read */
        if ((tr->warm_steps = warm_up(b)) < 0) return -1;
        if (b->len[0] > 0 && !ctrl_c_pressed) look_at_compute_roof(b, tr);
    }
    /* Several thread counts take turns rep by rep (in the opposite order every other rep), so that
     * a slow phase of a shared machine falls on all of them alike. */
    for (int r = 0; r < b->reps && !ctrl_c_pressed; r++) {
        progress(b, "rep %d of %d", r + 1, b->reps);
        int complete = 0; /* thread counts whose rep r ran whole */
        for (int i = 0; i < b->n_runs && !ctrl_c_pressed; i++) {
            ThreadRun* tr = &b->runs[r % 2 ? b->n_runs - 1 - i : i];
            b->t->kernels->set_threads(b->t->kernels, tr->threads);
            const int m = measure_rep(b, tr, r);
            if (m < 0) return -1;
            complete += m == 0;
        }
        if (complete == b->n_runs) b->reps_done = r + 1;
        for (int k = 0; k < b->n_runs; k++) /* a rep's times count where every thread count ran it */
            for (int test = 0; test < 2; test++) {
                ThreadRun* tr = &b->runs[k];
                if (complete == b->n_runs) {
                    tr->wall[test] += tr->rep_wall[test];
                    tr->cpu[test] += tr->rep_cpu[test];
                }
                tr->rep_wall[test] = tr->rep_cpu[test] = 0;
            }
    }
    if (ctrl_c_pressed) return 0;
    for (int k = 0; k < b->n_runs && b->len[0] > 0; k++) /* a second look, after the reps */
        look_at_compute_roof(b, &b->runs[k]);
    return 0;
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

/* The median over the reps of scale * x[r] / y[r] (y NULL: of x[r]); b->scratch holds the values
 * sorted after it. Two thread counts' rep r ran one after the other, so the median of their ratios
 * is steadier on a shared machine than the ratio of their medians. */
static double median_of(const Bench* b, const double* x, const double* y, double scale) {
    for (int r = 0; r < b->reps; r++) b->scratch[r] = y ? scale * x[r] / y[r] : x[r];
    qsort(b->scratch, (size_t)b->reps, sizeof(double), cmp_double);
    const int n = b->reps;
    return n % 2 ? b->scratch[n / 2] : 0.5 * (b->scratch[n / 2 - 1] + b->scratch[n / 2]);
}

/* What one decode token reads: every matrix including the head, the embedding row, norms, biases,
 * and the KV cache averaged over tgN; whether that fits in the last-level cache. And the operations
 * of one prefill token (a multiply-add is 2): every layer's matrix products, the head's once per
 * prompt (only the last position's logits are computed), and attention, whose token i of the
 * prompt (from 0) scores and sums over depth + i + 1 positions in every query head. */
typedef struct {
    const Transformer* t;
    double bytes, ops; /* a decode token's weight bytes; a prefill token's products' operations */
} TensorCount;

/* One tensor's part: all of it, but one row of the embedding and a token's k of an expert layer's
 * E experts; a layer's matrices' operations. */
static void count_tensor(void* ctx, const TensorInfo* ti, int layer, int expert) {
    TensorCount* n = ctx;
    const Config* c = &n->t->config;
    const void* slot = tensor_slot(ti, &n->t->weights, layer, expert);
    if (ti->cols == SIZE_NONE) {
        n->bytes += 4.0 * tensor_size(ti->rows, c);
        return;
    }
    const Matrix* m = slot;
    const double share = ti->place == EXPERT ? (double)c->n_experts_active / c->n_experts : 1.0;
    n->bytes += slot == &n->t->weights.embed_tokens ? matrix_bytes(m) / m->rows : share * matrix_bytes(m);
    if (ti->place != GLOBAL) n->ops += share * 2.0 * m->rows * m->cols;
}

/* Bytes the KV cache keeps per position: keys and values of every layer's kv heads. */
static double kv_position_bytes(const Transformer* t) {
    const Config* c = &t->config;
    return 2.0 * kv_elem_bytes(&t->state) * (double)t->state.kv_row * c->n_layers * c->n_kv_heads;
}

static void count_per_token(Bench* b) {
    const Config* c = &b->t->config;
    const Weights* w = &b->t->weights;
    const int n_prompt = b->len[0], n_gen = b->len[1];
    TensorCount count = {b->t, 0, 0};
    for_each_tensor(c, count_tensor, &count);
    if (c->flags & FLAG_TIED_EMBED) count.bytes += matrix_bytes(&w->lm_head); /* the head reads all of it */
    b->weight_bytes = count.bytes;
    /* keys and values of positions 0 .. p at decode position p, averaged over depth .. depth + n_gen - 1 */
    const double kv_per_position = kv_position_bytes(b->t);
    b->bytes_per_token = b->weight_bytes;
    if (n_gen > 0) b->bytes_per_token += kv_per_position * (b->depth + (n_gen + 1) / 2.0);
    /* Bytes per token that fit in the last-level cache are read from it after the first token: such
     * a decode is not bound by memory and a % of the memory roof (it can exceed 100) says nothing. */
    b->llc = last_level_cache_bytes();
    b->in_cache = n_gen > 0 && b->llc > 0 && b->bytes_per_token <= b->llc;
    b->matmul_ops = count.ops + (n_prompt > 0 ? 2.0 * w->lm_head.rows * w->lm_head.cols / n_prompt : 0);
    b->attention_ops = 4.0 * c->n_layers * c->n_heads * c->head_dim * (b->depth + (n_prompt + 1) / 2.0);
}

/* The cache's element type as --kv-cache names it, or (wide) as the bench's text does. */
static const char* kv_name(const Transformer* t, int wide) {
    const KVType k = t->state.kv_type;
    return k == KV_Q8 ? "q8" : k == KV_F16 ? (wide ? "fp16" : "f16") : (wide ? "fp32" : "f32");
}

/* The text's first line, before anything is measured: the model and the kernels that run it. */
static void print_model_line(const Transformer* t) {
    const Config* c = &t->config;
    printf("bench: %d layers, dim %d, vocab %d, weights %s", c->n_layers, c->dim, c->vocab_size,
           TYPE_NAME[c->weight_type]);
    if (c->group_size) printf(" (groups of %d)", c->group_size);
    const int float_weights = c->weight_type == WEIGHT_F32 || c->weight_type == WEIGHT_BF16;
    const int x86 = strncmp(t->kernels->name, "avx2", 4) == 0;
    printf(", kernels %s%s%s, decode prefetch %s\n", t->kernels->name,
           t->kernels->bf16_activations && c->weight_type == WEIGHT_BF16 ? ", bf16 activations in prefill" : "",
           float_weights && x86 && !t->kernels->float_panels ? ", prefill without packed panels" : "",
           t->kernels->prefetch);
    fflush(stdout);
}

/* The rest of the text before the table's rows: the weights in memory (huge: bytes in 2 MB pages,
 * -1: unknown), the depth, what a token costs, each thread count's warm-up and roofs, the head. */
static void print_head(const Bench* b, long long huge) {
    const Transformer* t = b->t;
    const Config* c = &t->config;
    const size_t two_mb = (size_t)2 << 20, whole = t->file_size / two_mb * two_mb;
    if (huge < 0) printf("bench: weights mapped (page size unknown: no /proc/self/smaps)\n");
    else printf("bench: weights mapped, %.0f of %.0f MB in 2 MB pages\n", huge / 1e6, t->file_size / 1e6);
    if (huge >= 0 && whole > 0 && (size_t)huge < whole - whole / 100)
        printf("bench: note: the page cache holds the rest of the file in small pages, which read several times "
               "slower on some VMs; after python3 tools/drop_page_cache.py MODEL the next run reads the file again "
               "in 2 MB pages where the system allows (docs/design.md#small-file-pages)\n");
    if (b->depth > 0)
        printf("bench: depth %d: both tests start with %d positions in the KV cache (llama-bench -d)\n", b->depth,
               b->depth);
    printf("bench: bytes read per decode token: %.1f MB weights + %.2f MB KV cache (%s, average over tg%d)\n",
           b->weight_bytes / 1e6, (b->bytes_per_token - b->weight_bytes) / 1e6, kv_name(t, 1),
           b->len[1]);
    printf("bench: KV cache %s: %.1f KiB per position (keys and values, every layer), %.1f MB for the %d "
           "positions of this context\n", kv_name(t, 0), kv_position_bytes(t) / 1024,
           kv_position_bytes(t) * c->seq_len / 1e6, c->seq_len);
    if (b->len[0] > 0)
        printf("bench: operations per prefill token: %.4g G (matrix products %.4g G, attention %.4g G at pp%d's "
               "average context)\n", (b->matmul_ops + b->attention_ops) / 1e9, b->matmul_ops / 1e9,
               b->attention_ops / 1e9, b->len[0]);
    for (int test = 0; test < 2; test++)
        for (int last = 0; last < 2 && b->len[test] > 0; last++) {
            const int n = product_tokens(b, test, last);
            if (n == 0) continue;
            char text[PLANS_TEXT_LEN];
            plans_text(b, test, last, text, sizeof text);
            printf("bench: kernels of %s%d%s (%d token%s a product%s): %s\n", TEST_NAME[test], b->len[test],
                   last ? "'s last chunk" : "", n, n == 1 ? "" : "s",
                   c->n_experts > 0 && n > 1 ? ", an expert's as many as the router sends it" : "", text);
        }
    if (b->experts_per_chunk > 0)
        printf("bench: experts: a decode token reads %d of each MoE layer's %d; a prefill chunk (up to %d rows) "
               "reads %.2f distinct ones (mean over layers and pp%d's chunks)\n", c->n_experts_active, c->n_experts,
               t->state.max_batch, b->experts_per_chunk, b->len[0]);
    if (b->in_cache)
        printf("bench: no %% of roof for decode: its %.1f MB per token fit in the %.1f MB last-level cache, "
               "so it is not bound by memory bandwidth (BENCH_LLC_BYTES=0 compares it anyway)\n",
               b->bytes_per_token / 1e6, b->llc / 1e6);
    if (b->llc < 0 && b->len[1] > 0)
        printf("bench: note: this system does not say how large the last-level cache is (no "
               "/sys/devices/system/cpu/cpu0/cache): decode's %% of roof is given whatever its %.1f MB per token, "
               "and a model that fits in the cache reads faster than the roof; BENCH_LLC_BYTES=N gives the size\n",
               b->bytes_per_token / 1e6);
    for (int k = 0; k < b->n_runs; k++) {
        const ThreadRun* tr = &b->runs[k];
        printf("bench: %d thread%s: warm-up of %s%d decode steps; memory read bandwidth "
               "(512 MiB streaming reads, same threads): ", tr->threads, tr->threads == 1 ? "" : "s",
               b->len[0] > 0 ? "one prefill and " : "", tr->warm_steps);
        if (b->len[1] > 0)
            printf("around each decode rep %.1f GB/s (median, the roof), ", median_of(b, tr->rd, NULL, 1));
        printf("best of %d %.1f GB/s", 5 + (b->len[1] > 0 ? 3 * b->reps : 0), tr->best);
        if (tr->wr)
            printf("; the weights' own pages (%.1f MB) around each decode rep %.1f GB/s (median)",
                   (double)(b->weights.bytes[0] + b->weights.bytes[1]) / 1e6, median_of(b, tr->wr, NULL, 1));
        if (b->len[0] > 0 && tr->peak > 0)
            printf("; compute roof (%s, same threads) %.1f Gop/s", b->peak_instruction, tr->peak / 1e9);
        else if (b->len[0] > 0)
            printf("; no compute roof (%s)", b->peak_instruction);
        printf("\n");
    }
    if (b->n_runs > 1) printf("bench: the thread counts take turns, one rep of each after the other\n");
    printf("| test   %*s| threads | tok/s median |      min |      max |  GB/s | %% of roof | %% of best | %% of own read | cpu share "
           "|  Gop/s | %% of compute |\n", b->depth > 0 ? 9 : 0, "");
    printf("|--------%.*s|---------|--------------|----------|----------|-------|-----------|-----------|---------------|-----------"
           "|--------|--------------|\n", b->depth > 0 ? 9 : 0, "---------");
}

/* One test's figures for one thread count; NAN where there is none (null in the JSON, "-" in the
 * table). */
typedef struct {
    double med, lo, hi; /* tok/s over the reps */
    double share;       /* CPU seconds the process got / (wall seconds x threads) */
    double gbps, roof, pct, pct_best;
    double own_gbps, own_pct; /* against a streaming read of the weights' own pages */
    double ops, gops, peak_gops, compute_pct; /* prefill: per token, achieved, the compute roof */
} TestRow;

static TestRow test_row(const Bench* b, const ThreadRun* tr, int test) {
    const int decode = test == 1, roofed = decode && !b->in_cache;
    /* % of roof: the median over the reps of each rep's GB/s over the read bandwidth measured around
     * that rep. A shared VM's memory speed can move by almost 2x within seconds, so a decode rep is
     * compared with the machine of its own moment; the best read of the whole run ("% of best")
     * sits above the typical read by the run's noise. */
    const double to_pct = 100.0 * b->bytes_per_token / 1e9; /* tok/s x to_pct / roof GB/s = % of roof */
    TestRow row;
    row.med = median_of(b, tr->tps[test], NULL, 1);
    row.lo = b->scratch[0];
    row.hi = b->scratch[b->reps - 1];
    /* below 1 means the threads waited (for memory, for each other) or, on a shared machine, were
     * descheduled. The kernel adds the other threads' CPU time at its ticks (milliseconds), so over
     * less than SHARE_MIN_WALL seconds of reps the figure is noise (above 100% at times): none then. */
    row.share = tr->wall[test] >= SHARE_MIN_WALL ? tr->cpu[test] / (tr->wall[test] * tr->threads) : NAN;
    row.gbps = decode ? b->bytes_per_token * row.med / 1e9 : NAN;
    row.roof = b->len[1] > 0 ? median_of(b, tr->rd, NULL, 1) : tr->best;
    row.pct = roofed ? median_of(b, tr->tps[1], tr->rd, to_pct) : NAN;
    row.pct_best = roofed ? 100.0 * row.gbps / tr->best : NAN;
    row.own_gbps = decode && tr->wr ? median_of(b, tr->wr, NULL, 1) : NAN;
    row.own_pct = roofed && tr->wr ? median_of(b, tr->tps[1], tr->wr, to_pct) : NAN;
    row.ops = decode ? NAN : b->matmul_ops + b->attention_ops;
    row.gops = row.ops * row.med / 1e9;
    row.peak_gops = !decode && tr->peak > 0 ? tr->peak / 1e9 : NAN;
    row.compute_pct = 100.0 * row.gops / row.peak_gops;
    return row;
}

static void json_number(const char* key, const char* format, double v) {
    char text[48];
    printf(", \"%s\": %s", key, json_value(text, sizeof text, format, v));
}

static void json_list(const char* key, const double* v, int n) {
    printf(", \"%s\": ", key);
    for (int i = 0; v && i < n; i++) printf("%s%.3f", i ? ", " : "[", v[i]);
    printf(v ? "]" : "null");
}

/* One JSON line (docs/speed.md lists its keys). */
static void print_json_row(const Bench* b, long long huge, const ThreadRun* tr, int test) {
    const Transformer* t = b->t;
    const TestRow row = test_row(b, tr, test);
    printf("{\"test\": \"%s%d\", \"threads\": %d, \"depth\": %d", TEST_NAME[test], b->len[test], tr->threads,
           b->depth);
    json_number("tokens_per_s", "%.3f", row.med);
    json_number("min", "%.3f", row.lo);
    json_number("max", "%.3f", row.hi);
    json_number("gbps", "%.3f", row.gbps);
    json_number("roof_pct", "%.2f", row.pct);
    json_number("mem_gbps", "%.3f", row.roof);
    json_number("roof_pct_best", "%.2f", row.pct_best);
    json_number("mem_gbps_best", "%.3f", tr->best);
    printf(", \"weight_type\": \"%s\"", TYPE_NAME[t->config.weight_type]);
    json_number("cpu_share", "%.3f", row.share);
    printf(", \"prefetch\": \"%s\", \"weights\": \"mapped\"", t->kernels->prefetch);
    json_number("huge_pct", "%.1f", huge < 0 ? NAN : 100.0 * huge / t->file_size);
    printf(", \"kv_cache\": \"%s\"", kv_name(t, 0));
    json_number("kv_bytes_per_position", "%.0f", kv_position_bytes(t));
    json_list("reps_tokens_per_s", tr->tps[test], b->reps);
    json_list("reps_mem_gbps", test ? tr->rd : NULL, b->reps);
    json_number("weights_gbps", "%.3f", row.own_gbps);
    json_number("roof_pct_weights", "%.2f", row.own_pct);
    json_list("reps_weights_gbps", test ? tr->wr : NULL, b->reps);
    json_number("ops_per_token", "%.0f", row.ops);
    json_number("gops", "%.3f", row.gops);
    json_number("peak_gops", "%.3f", row.peak_gops);
    json_number("compute_roof_pct", "%.2f", row.compute_pct);
    if (test == 0) printf(", \"peak_instruction\": \"%s\"", b->peak_instruction ? b->peak_instruction : "none");
    else printf(", \"peak_instruction\": null");
    char text[PLANS_TEXT_LEN];
    plans_text(b, test, 0, text, sizeof text);
    printf(", \"kernels\": \"%s\"", text);
    plans_text(b, test, 1, text, sizeof text);
    if (text[0]) printf(", \"kernels_last_chunk\": \"%s\"", text);
    else printf(", \"kernels_last_chunk\": null");
    /* a saved line keeps what the exit status (130) said: Ctrl-C cut the reps short */
    printf(", \"interrupted\": %s}\n", ctrl_c_pressed ? "true" : "false");
}

/* One cell of the table, right-aligned in width characters. */
static void table_cell(const char* format, int width, double v) {
    char s[32] = "-";
    if (!isnan(v)) snprintf(s, sizeof s, format, v);
    printf(" %*s |", width, s);
}

static void print_table_row(const Bench* b, const ThreadRun* tr, int test) {
    const TestRow row = test_row(b, tr, test);
    char label[48];
    int n = snprintf(label, sizeof label, "%s%d", TEST_NAME[test], b->len[test]);
    if (b->depth > 0) snprintf(label + n, sizeof label - n, " @ d%d", b->depth);
    printf("| %-*s | %7d | %12.2f | %8.2f | %8.2f |", b->depth > 0 ? 15 : 6, label, tr->threads, row.med, row.lo,
           row.hi);
    table_cell("%.1f", 5, row.gbps);
    table_cell("%.1f%%", 9, row.pct);
    table_cell("%.1f%%", 9, row.pct_best);
    table_cell("%.1f%%", 13, row.own_pct);
    table_cell("%.0f%%", 9, 100 * row.share);
    table_cell("%.1f", 6, row.gops);
    table_cell("%.1f%%", 12, row.compute_pct);
    printf("\n");
}

/* After the table: each further thread count's speed against the first's, and a note where the
 * weights' own pages read well below the buffer (it says where a low % of roof comes from). */
static void print_comparisons(const Bench* b) {
    const ThreadRun* runs = b->runs;
    for (int k = 1; k < b->n_runs; k++)
        for (int test = 0; test < 2; test++)
            if (b->len[test] > 0)
                printf("bench: %s%d, %d thread%s / %d: %.2f (median of the reps' ratios)\n", TEST_NAME[test],
                       b->len[test], runs[k].threads, runs[k].threads == 1 ? "" : "s", runs[0].threads,
                       median_of(b, runs[k].tps[test], runs[0].tps[test], 1));
    for (int k = 0; k < b->n_runs; k++) {
        if (!runs[k].wr) continue;
        const double own = median_of(b, runs[k].wr, NULL, 1), buf = median_of(b, runs[k].rd, NULL, 1);
        if (own < 0.85 * buf)
            printf("bench: note: with %d thread%s the weights' own pages read at %.1f GB/s, %.0f%% of the buffer's "
                   "%.1f: the memory behind this file's pages is slower than the buffer's (on a VM it can differ "
                   "from file to file); %% of own read is decode against what its pages allow\n",
                   runs[k].threads, runs[k].threads == 1 ? "" : "s", own, 100 * own / buf, buf);
    }
}

/* A note for each test whose threads got less than SHARE_LOW of their CPU time: other processes
 * took the cores (then its figures, and the roofs measured beside them, understate the code), or
 * its threads sat idle (a model too small to split over them). tools/llama_cpp/compare.py marks
 * such rounds with the same threshold (BUSY_SHARE). */
#define SHARE_LOW 0.9
static void note_low_shares(const Bench* b, FILE* f) {
    for (int k = 0; k < b->n_runs; k++)
        for (int test = 0; test < 2; test++) {
            if (b->len[test] <= 0) continue;
            const TestRow row = test_row(b, &b->runs[k], test);
            if (!isnan(row.share) && row.share < SHARE_LOW)
                fprintf(f, "bench: note: %s%d with %d thread%s got %.0f%% of its threads' CPU time: other processes "
                        "took the cores (its figures understate the code), or its threads sat idle\n",
                        TEST_NAME[test], b->len[test],
                        b->runs[k].threads, b->runs[k].threads == 1 ? "" : "s", 100 * row.share);
        }
}

/* One note where decode ran above the roof: the tokens' reads were faster than the buffer's
 * streaming read, so the roof understates what this machine's memory gives the weights (a cache that
 * holds them, or other memory behind the buffer than behind the file: docs/design.md#bench-roof). */
static void note_above_roof(const Bench* b, FILE* f) {
    int n = 0;
    for (int k = 0; k < b->n_runs && b->len[1] > 0; k++) {
        const TestRow row = test_row(b, &b->runs[k], 1);
        if (isnan(row.pct) || row.pct < 100.05) continue; /* above 100.0 as printed */
        if (n++ == 0) fprintf(f, "bench: note: %s%d read above the roof (", TEST_NAME[1], b->len[1]);
        else fputs(", ", f);
        fprintf(f, "%.1f%% with %d thread%s", row.pct, b->runs[k].threads, b->runs[k].threads == 1 ? "" : "s");
    }
    if (n > 0)
        fputs("): faster than the buffer's streaming read, so the roof understates what the weights get here (a "
              "cache that holds them, slower memory behind the buffer than behind the file, or a slow minute for "
              "the buffer's reads; % of own read compares with the weights' own pages)\n", f);
}

long long transformer_huge_page_bytes(const Transformer* t) {
    FILE* f = t->file ? fopen("/proc/self/smaps", "r") : NULL;
    if (f == NULL) return -1;
    char line[4096];
    int ours = 0;
    long long kb = -1;
    /* A mapping's header line is "lo-hi perms ..."; its field lines are "Name: value kB". */
    while (kb < 0 && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
            ours = lo == (unsigned long)(uintptr_t)t->file;
        else if (ours)
            sscanf(line, "FilePmdMapped: %lld kB", &kb);
    }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

static void print_results(Bench* b) {
    count_per_token(b);
    /* Read once, after the timed reps: one pass over /proc/self/smaps (milliseconds). */
    const long long huge = transformer_huge_page_bytes(b->t);
    if (!b->json) print_head(b, huge);
    for (int k = 0; k < b->n_runs; k++)
        for (int test = 0; test < 2; test++) {
            if (b->len[test] <= 0) continue;
            if (b->json) print_json_row(b, huge, &b->runs[k], test);
            else print_table_row(b, &b->runs[k], test);
        }
    if (!b->json) print_comparisons(b);
    note_low_shares(b, b->json ? stderr : stdout);
    note_above_roof(b, b->json ? stderr : stdout);
    fflush(stdout);
}

/* The tests against the KV cache. The default test lengths (pp512, tg128) shrink to the positions
 * the KV cache has after the depth, so that `-m bench` runs on a model of a short context as it is,
 * with a note on stderr (--json keeps standard output to JSON lines); a length the user gave is
 * kept. Returns 0, or 1 after an error line on stderr. */
static int check_and_fit(Bench* b, const int* given) {
    const Config* c = &b->t->config;
    const int room = c->seq_len - b->depth;
    int was[2] = {0, 0};
    for (int k = 0; k < 2; k++)
        if (room >= 1 && !given[k] && b->len[k] > room) {
            was[k] = b->len[k];
            b->len[k] = room;
        }
    const int need = positions_needed(b->depth, b->len);
    if (need > c->seq_len) { /* what the tests need, and what to pass instead */
        const char* which = b->len[0] >= b->len[1] ? "--bench-prompt" : "--bench-gen";
        char parts[96], advice[96];
        if (b->depth > 0) snprintf(parts, sizeof parts, "--bench-depth %d + %s %d", b->depth, which, need - b->depth);
        else snprintf(parts, sizeof parts, "%s %d", which, need);
        const int limit = need > c->max_seq_len ? c->max_seq_len : c->seq_len; /* the one to advise for */
        if (limit - b->depth < 1) snprintf(advice, sizeof advice, "--bench-depth below %d", limit);
        else snprintf(advice, sizeof advice, "--bench-prompt and --bench-gen at most %d", limit - b->depth);
        if (need > c->max_seq_len) /* and a -c below the model's, which those values need too */
            fprintf(stderr, "run: error: the bench needs a context of %d positions (%s), more than the model's %d: "
                    "give %s%s\n", need, parts, c->max_seq_len, advice,
                    c->seq_len < c->max_seq_len ? ", and -c up to the model's" : "");
        else
            fprintf(stderr, "run: error: the bench needs a context of %d positions (%s), the KV cache has %d "
                    "(use -c %d, or give %s)\n", need, parts, c->seq_len, need, advice);
        return 1;
    }
    for (int k = 0; k < 2; k++)
        if (was[k])
            fprintf(stderr, "run: note: the bench runs %s%d instead of %s%d: the %s %d positions%s (%s N sets it)\n",
                    TEST_NAME[k], b->len[k], TEST_NAME[k], was[k],
                    c->seq_len < c->max_seq_len ? "KV cache (-c) has" : "model's context is", c->seq_len,
                    b->depth > 0 ? ", less --bench-depth" : "", k ? "--bench-gen" : "--bench-prompt");
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

/* The thread counts as the kernels run them (the reference build runs one whatever it is asked),
 * each once, with a note where two became one. */
static void dedupe_counts(Bench* b) {
    const int asked = b->t->kernels->threads(b->t->kernels);
    int n = 0, most = 0;
    for (int k = 0; k < b->n_runs; k++) {
        const int runs = b->t->kernels->set_threads(b->t->kernels, b->counts[k]);
        int seen = 0;
        for (int j = 0; j < n; j++) seen |= b->counts[j] == runs;
        if (!seen) b->counts[n++] = runs;
        if (runs > most) most = runs;
    }
    b->t->kernels->set_threads(b->t->kernels, asked);
    if (n < b->n_runs)
        fprintf(stderr, "run: note: --threads: these kernels (%s) run at most %d thread%s: each count is measured "
                "once\n", b->t->kernels->name, most, most == 1 ? "" : "s");
    b->n_runs = n;
}

int bench_main(Transformer* t, const BenchOptions* o) {
    /* Without --threads the kernels' own count is the one measured. */
    Bench b = {.t = t, .len = {o->len[0], o->len[1]}, .reps = o->reps, .depth = o->depth, .json = o->json,
               .counts = {t->kernels->threads(t->kernels)}, .n_runs = o->n_threads > 0 ? o->n_threads : 1,
               .show = isatty(STDERR_FILENO)};
    memcpy(b.counts, o->threads, (size_t)o->n_threads * sizeof(int));
    dedupe_counts(&b);
    int status = check_and_fit(&b, o->given);
    if (status != 0) return status;
    if (!b.json) print_model_line(t);
    const int n_tok = positions_needed(b.depth, b.len);
    const size_t buffer_bytes = (size_t)512 << 20;
    int* tokens = malloc((size_t)n_tok * sizeof(int));
    /* per thread count: pp, tg, rd and wr of each rep; then the scratch */
    double* results = calloc((size_t)(4 * b.n_runs + 1) * (size_t)b.reps, sizeof(double));
    /* The roof's buffer: in 2 MB pages like the weights, faulted in and read once. */
    uint8_t* buffer = alloc_huge_anonymous(buffer_bytes);
    status = 1;
    if (!tokens || !results || !buffer || read_set_init(&b.buffer, t->kernels, buffer, buffer_bytes, NULL, 0) != 0) {
        fprintf(stderr, "run: error: out of memory%s\n", buffer ? "" : " for the bench's 512 MiB read buffer");
        goto done;
    }
    memset(buffer, 1, buffer_bytes);
    read_set_best(&b.buffer, 1);
    fill_tokens(tokens, n_tok, t->config.vocab_size);
    b.tokens = tokens + b.depth;
    b.scratch = results + (size_t)4 * b.n_runs * b.reps;
    /* The same streaming read over the weights a decode step reads: on a VM the physical memory
     * behind two copies of one file can read at different speeds (docs/design.md#bench-roof),
     * which a buffer of the bench's own cannot show. model.c takes the layers' tensors and then the
     * final norm in the file's order, so they are one span; the head is the other (the embedding,
     * before the layers, when tied). Out of memory, sums stays NULL: no such read. */
    const Weights* w = &t->weights;
    const uint8_t* first = (const uint8_t*)w->layers[0].input_layernorm;
    const uint8_t* end = (const uint8_t*)(w->norm + t->config.dim);
    if (b.len[1] > 0)
        read_set_init(&b.weights, t->kernels, first, (size_t)(end - first), w->lm_head.data,
                      (size_t)matrix_stored_bytes(&w->lm_head));
    struct sigaction old_int;
    catch_ctrl_c(&old_int);
    const int failed = run_tests(&b, results) != 0;
    release_ctrl_c(&old_int);
    progress_end(&b);
    if (failed) {
        fprintf(stderr, "run: error: forward() failed in the bench\n");
        goto done;
    }
    status = ctrl_c_pressed ? 130 : 0; /* as a shell reports a run that Ctrl-C ended */
    if (ctrl_c_pressed && b.reps_done == 0) {
        fprintf(stderr, "bench: interrupted before the first rep of every thread count ended: nothing measured\n");
        goto done;
    }
    if (ctrl_c_pressed) {
        fprintf(stderr, "bench: interrupted after %d of %d reps: the figures below are over those\n", b.reps_done,
                b.reps);
        b.reps = b.reps_done;
    }
    print_results(&b);
done:
    free(b.buffer.sums);
    free(b.weights.sums);
    free_huge_anonymous(buffer, buffer_bytes);
    free(tokens);
    free(results);
    return status;
}
