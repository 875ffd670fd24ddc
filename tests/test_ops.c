/* tests/test_ops.c: the seam forward() calls (kernels/ops.h). Each op of the build's table
 * (ops_new: the fast ops; in the reference build, make SCALAR=1, the reference itself) against the
 * reference ops (ops_reference_new) on the same inputs, at one and two threads, within the
 * tolerance stated beside each check; and the fast ops give the same bits at any thread count.
 * tests/test_kernels.c checks each SIMD twin on its own. Prints "N passed, M failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/peak.h"
#include "kernels/ops.h"
#include "kernels/simd_math.h" /* KERNELS_BF16_DOT, KERNELS_Q8_DOT: which attention arithmetic runs */
#include "tests/check.h"
#include "tests/test_matrix.h"

/* Sizes the ops are made for: a GQA group of 4 query heads per kv head, head_dim 128 (every
 * Qwen3's), 300 positions, batches of up to 48 rows. */
enum { BATCH = 48, COLS = 1024, HEADS = 8, KV_HEADS = 2, HEAD_DIM = 128, POSITIONS = 300 };

static Ops* make_ops(int threads, int reference) {
    const OpsSpec s = {.threads = threads, .max_batch = BATCH, .max_cols = COLS, .n_heads = HEADS,
                       .n_kv_heads = KV_HEADS, .head_dim = HEAD_DIM, .max_pos = POSITIONS};
    return reference ? ops_reference_new(&s) : ops_new(&s);
}

static float* random_floats(size_t n, float scale) {
    float* x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

/* matmul: two matrices that read the same x (as q and k do) in every format, decode and prefill;
 * each output within matmul_tolerance of the reference (fp32 reassociation, and for q8 and q4 the
 * int8 activations' rounding, test_matrix.h); the fast op's bits the same at 1 and 2 threads. */
static void test_matmul(Ops* fast[2], const Ops* ref) {
    const struct { WeightType type; int gs; } formats[] = {{WEIGHT_F32, 0}, {WEIGHT_BF16, 0}, {WEIGHT_Q8, 64},
                                                            {WEIGHT_Q4, 32}};
    const int ns[] = {1, 3, 17, BATCH};
    for (size_t f = 0; f < sizeof formats / sizeof *formats; f++)
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
            const int n = ns[k], rows[2] = {72, 40};
            TestMatrix m[2] = {make_matrix(formats[f].type, rows[0], COLS, formats[f].gs),
                               make_matrix(formats[f].type, rows[1], COLS, formats[f].gs)};
            const Matrix* Ws[2] = {&m[0].M, &m[1].M};
            float* x = random_floats((size_t)n * COLS, 2.0f);
            float *want[2], *got[2][2];
            for (int i = 0; i < 2; i++) {
                want[i] = malloc((size_t)n * rows[i] * sizeof(float));
                for (int t = 0; t < 2; t++) got[t][i] = malloc((size_t)n * rows[i] * sizeof(float));
            }
            ref->matmul(ref, want, x, Ws, 2, n);
            for (int t = 0; t < 2; t++) fast[t]->matmul(fast[t], got[t], x, Ws, 2, n);
            int ok = 1, same = 1;
            for (int i = 0; i < 2; i++) {
                same &= memcmp(got[0][i], got[1][i], (size_t)n * rows[i] * sizeof(float)) == 0;
                for (int tk = 0; tk < n; tk++)
                    for (int r = 0; r < rows[i]; r++) {
                        double abssum, exact;
                        const double tol = matmul_tolerance(&m[i], x + (size_t)tk * COLS, r, &abssum, &exact);
                        const size_t at = (size_t)tk * rows[i] + r;
                        ok &= fabs((double)got[0][i][at] - want[i][at]) <= tol;
                    }
            }
            char what[128];
            snprintf(what, sizeof what, "matmul op %s n=%d: within tolerance of the reference, 1 thread == 2",
                     tname(formats[f].type), n);
            check(ok && same, what);
            for (int i = 0; i < 2; i++) {
                free(want[i]), free(got[0][i]), free(got[1][i]);
                free_matrix(&m[i]);
            }
            free(x);
        }
}

/* matmul_segments: MATS matrices (a mixture-of-experts layer's experts), each on its segment of
 * the rows: one row each (decode: one dispatch for them all, more matrices than the fast driver
 * takes at once), or 0 to 3 rows each (prefill). Each output within matmul_tolerance of the
 * reference, and the fast op's bits those of its matmul of each matrix alone on its rows, at 1 and
 * 2 threads (so the experts give the same bits however they are grouped). */
static void test_matmul_segments(Ops* fast[2], const Ops* ref) {
    enum { MATS = 20, MOST_ROWS = 3, R = 40 };
    const struct { WeightType type; int gs; } formats[] = {{WEIGHT_F32, 0}, {WEIGHT_BF16, 0}, {WEIGHT_Q8, 64},
                                                            {WEIGHT_Q4, 32}};
    for (size_t f = 0; f < sizeof formats / sizeof *formats; f++)
        for (int decode = 0; decode < 2; decode++) {
            TestMatrix m[MATS];
            const Matrix* Ws[MATS];
            int ns[MATS], rows = 0;
            for (int i = 0; i < MATS; i++) {
                m[i] = make_matrix(formats[f].type, R, COLS, formats[f].gs);
                Ws[i] = &m[i].M;
                rows += ns[i] = decode ? 1 : (i * 7) % (MOST_ROWS + 1);
            }
            float* x = random_floats((size_t)rows * COLS, 2.0f);
            float *want = malloc((size_t)rows * R * sizeof(float)), *alone = malloc((size_t)rows * R * sizeof(float));
            float* got[2] = {malloc((size_t)rows * R * sizeof(float)), malloc((size_t)rows * R * sizeof(float))};
            for (int i = 0, row = 0; i < MATS; row += ns[i++])
                if (ns[i]) fast[0]->matmul(fast[0], (float*[]){alone + (size_t)row * R}, x + (size_t)row * COLS, &Ws[i], 1, ns[i]);
            ref->matmul_segments(ref, want, x, Ws, ns, MATS);
            for (int t = 0; t < 2; t++) fast[t]->matmul_segments(fast[t], got[t], x, Ws, ns, MATS);
            const size_t bytes = (size_t)rows * R * sizeof(float);
            int ok = 1, same = memcmp(got[0], alone, bytes) == 0 && memcmp(got[1], alone, bytes) == 0;
            for (int i = 0, row = 0; i < MATS; row += ns[i++])
                for (int tk = row; tk < row + ns[i]; tk++)
                    for (int r = 0; r < R; r++) {
                        double abssum, exact;
                        const double tol = matmul_tolerance(&m[i], x + (size_t)tk * COLS, r, &abssum, &exact);
                        ok &= fabs((double)got[0][(size_t)tk * R + r] - want[(size_t)tk * R + r]) <= tol;
                    }
            char what[128];
            snprintf(what, sizeof what, "matmul_segments op %s, %s: within tolerance of the reference, the bits of matmul",
                     tname(formats[f].type), decode ? "one row each" : "0-3 rows each");
            check(ok && same, what);
            for (int i = 0; i < MATS; i++) free_matrix(&m[i]);
            free(x), free(want), free(alone), free(got[0]), free(got[1]);
        }
}

/* rmsnorm and swiglu, short (a decoded token) and long enough for the fast ops to split over the
 * threads (a prefill chunk), at lengths whose parts do not divide evenly: within 1e-5 relative
 * (RMSNorm: the sum of squares in another order) and 2e-6 relative + 1e-7 (SwiGLU: the vector
 * exp) of the reference; the fast op's bits the same at 1 and 2 threads, in place too. */
static void test_elementwise(Ops* fast[2], const Ops* ref) {
    const int shapes[][3] = {{1, 1, 1024}, {3, 1, 128}, {1, 8, 128}, {257, 1, 128}, {37, 8, 128}, {300, 1, 130},
                             {331, 1, 101}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const NormSite at = {1, "test", 0, 0, shapes[k][0], shapes[k][1]};
        const int n = shapes[k][2];
        const size_t total = (size_t)at.rows * at.per_row * n;
        float *x = random_floats(total, 4.0f), *w = random_floats((size_t)n, 1.0f), *up = random_floats(total, 3.0f);
        float *want = malloc(total * sizeof(float)), *got[2], *g[3];
        for (int t = 0; t < 2; t++) got[t] = malloc(total * sizeof(float));
        for (int i = 0; i < 3; i++) g[i] = malloc(total * sizeof(float));
        for (size_t i = 0; i < total; i++) g[0][i] = g[1][i] = g[2][i] = frand() * 20.0f;
        ref->rmsnorm(ref, &at, want, x, w, n, 1e-6f);
        ref->swiglu(ref, g[0], up, (int)total);
        int ok = 1, same = 1;
        for (int t = 0; t < 2; t++) {
            memcpy(got[t], x, total * sizeof(float)); /* in place, as QK-Norm runs */
            fast[t]->rmsnorm(fast[t], &at, got[t], got[t], w, n, 1e-6f);
            fast[t]->swiglu(fast[t], g[1 + t], up, (int)total);
        }
        for (size_t i = 0; i < total; i++) {
            ok &= fabs(got[0][i] - want[i]) <= 1e-5 * fabs(want[i]) + 1e-6;
            ok &= fabs(g[1][i] - g[0][i]) <= 2e-6 * fabs(g[0][i]) + 1e-7;
        }
        same = memcmp(got[0], got[1], total * sizeof(float)) == 0 && memcmp(g[1], g[2], total * sizeof(float)) == 0;
        char what[128];
        snprintf(what, sizeof what, "rmsnorm and swiglu ops, %d x %d vectors of %d: as the reference, 1 thread == 2",
                 at.rows, at.per_row, n);
        check(ok && same, what);
        free(x), free(w), free(up), free(want), free(got[0]), free(got[1]), free(g[0]), free(g[1]), free(g[2]);
    }
}

/* rope on 8 heads at one position's angles: within 1e-6 absolute of the reference (the same
 * products, rounded the same; kernels/rope.c). */
static void test_rope(Ops* fast[2], const Ops* ref) {
    const int d = HEAD_DIM;
    float *x = random_floats((size_t)HEADS * d, 3.0f), *y = malloc((size_t)HEADS * d * sizeof(float));
    float cos_t[HEAD_DIM / 2], sin_t[HEAD_DIM / 2];
    for (int i = 0; i < d / 2; i++) cos_t[i] = cosf(0.37f * (float)i), sin_t[i] = sinf(0.37f * (float)i);
    memcpy(y, x, (size_t)HEADS * d * sizeof(float));
    ref->rope(ref, x, HEADS, d, cos_t, sin_t);
    fast[1]->rope(fast[1], y, HEADS, d, cos_t, sin_t);
    int ok = 1;
    for (int i = 0; i < HEADS * d; i++) ok &= fabs(x[i] - y[i]) <= 1e-6;
    check(ok, "rope op: within 1e-6 of the reference");
    free(x), free(y);
}

/* attention over a cache in blocks of 16 positions, [block][kv head][position][d] as model.c lays
 * it out, fp32 and fp16: decode at the cache's end, prefill of 37 rows from position 5 (two fast
 * blocks of rows), and of 45 from 0; head_dim 128 (the SIMD kernels) and 40 (their scalar
 * fallback). Within 2e-5 absolute of the reference (the outputs are averages of values in
 * [-1, 1], summed in another order), 1 thread == 2 bitwise. Prefill over an fp16 or q8 cache
 * where the build multiplies bf16 pairs: against the reference over the queries and the cache's
 * values rounded to bf16 (fp32 cache), within 2^-9 more (the softmax's weights rounded to bf16;
 * test_kernels.c). Decode over a q8 cache where the build has AVX-512 VNNI: against the reference
 * over the queries quantised as cached rows (kv_quantize_row). */
static void test_attention(Ops* fast[2], const Ops* ref) {
    enum { BLOCK = 16 };
    static const char* const names[] = {"fp32", "fp16", "q8"};
    const int dims[] = {HEAD_DIM, 40};
    for (int di = 0; di < 2; di++)
        for (KVType type = KV_F32; type <= KV_Q8; type++) {
            const int d = dims[di], blocks = (POSITIONS + BLOCK - 1) / BLOCK;
            if (type == KV_Q8 && d % KV_Q8_GROUP) continue; /* the loader refuses such a cache */
            const size_t row = kv_row_elems(type, d), rows_all = (size_t)blocks * KV_HEADS * BLOCK;
            const size_t elem = kv_elem_size(type);
            char *keys = malloc(rows_all * row * elem), *values = malloc(rows_all * row * elem);
            float *rkeys = malloc(rows_all * d * sizeof(float)), *rvalues = malloc(rows_all * d * sizeof(float));
            for (size_t r = 0; r < rows_all; r++) {
                float k[HEAD_DIM], v[HEAD_DIM];
                for (int i = 0; i < d; i++) k[i] = frand(), v[i] = frand();
                char *kr = keys + r * row * elem, *vr = values + r * row * elem;
                if (type == KV_Q8) kv_quantize_row((int8_t*)kr, k, d), kv_quantize_row((int8_t*)vr, v, d);
                for (int i = 0; type != KV_Q8 && i < d; i++) {
                    if (type == KV_F16) ((uint16_t*)kr)[i] = float_to_half(k[i]), ((uint16_t*)vr)[i] = float_to_half(v[i]);
                    else ((float*)kr)[i] = k[i], ((float*)vr)[i] = v[i];
                }
                for (int i = 0; type != KV_F32 && i < d; i++) {
                    rkeys[r * d + i] = bf16_to_f32(f32_to_bf16(kv_value(keys, r * row, i, d, type)));
                    rvalues[r * d + i] = bf16_to_f32(f32_to_bf16(kv_value(values, r * row, i, d, type)));
                }
            }
            const int cases[][2] = {{1, POSITIONS - 1}, {37, 5}, {45, 0}}; /* rows, p0 */
            for (int c = 0; c < 3; c++) {
                const int rows = cases[c][0];
                const size_t n = (size_t)rows * HEADS * d;
                float *q = random_floats(n, 2.0f), *want = malloc(n * sizeof(float)), *got[2];
                AttentionCall a = {want, q, rows, cases[c][1], HEADS, KV_HEADS, d, 1.0f / sqrtf((float)d),
                                   {keys, values, (int)row, BLOCK, (size_t)KV_HEADS * BLOCK * row, type},
                                   (size_t)BLOCK * row, 0};
                ref->attention(ref, &a);
                double tol = 2e-5;
#if defined(KERNELS_BF16_DOT)
                if (type != KV_F32 && rows > 1 && attention_simd(d, type)) {
                    float* qr = malloc(n * sizeof(float));
                    for (size_t i = 0; i < n; i++) qr[i] = bf16_to_f32(f32_to_bf16(q[i]));
                    AttentionCall r = a;
                    r.q = qr;
                    r.kv = (KVRows){rkeys, rvalues, d, BLOCK, (size_t)KV_HEADS * BLOCK * d, KV_F32};
                    r.kv_head_step = (size_t)BLOCK * d;
                    ref->attention(ref, &r);
                    tol += 1.0 / 512;
                    free(qr);
                }
#endif
#if defined(KERNELS_Q8_DOT)
                if (type == KV_Q8 && rows == 1 && attention_simd(d, type) && d <= KERNELS_Q8_DOT_MAX_DIM) {
                    float* qd = malloc(n * sizeof(float));
                    int8_t* qrow = malloc(kv_row_elems(KV_Q8, d));
                    for (size_t h = 0; h < n / d; h++) {
                        kv_quantize_row(qrow, q + h * d, d);
                        for (int i = 0; i < d; i++) qd[h * d + i] = kv_value(qrow, 0, i, d, KV_Q8);
                    }
                    AttentionCall r = a;
                    r.q = qd;
                    ref->attention(ref, &r);
                    free(qd), free(qrow);
                }
#endif
                for (int t = 0; t < 2; t++) {
                    a.out = got[t] = malloc(n * sizeof(float));
                    fast[t]->attention(fast[t], &a);
                }
                int ok = memcmp(got[0], got[1], n * sizeof(float)) == 0;
                for (size_t i = 0; i < n; i++) ok &= fabs(got[0][i] - want[i]) <= tol;
                char what[128];
                snprintf(what, sizeof what, "attention op, head_dim %d, %s cache, %d rows from position %d: as the "
                         "reference, 1 thread == 2", d, names[type], rows, cases[c][1]);
                check(ok, what);
                free(q), free(want), free(got[0]), free(got[1]);
            }
            free(keys), free(values), free(rkeys), free(rvalues);
        }
}

static void count_item(void* ctx, int i, int thread) {
    int* seen = ctx;
    __atomic_add_fetch(&seen[i], 1 + 1000 * thread, __ATOMIC_RELAXED); /* thread 1's items show */
}

/* The tools' part of the table: every item of parallel_for runs once, on a thread below
 * threads(); set_threads gives 1 .. the count the ops were made with; peak_ops (the bench's
 * compute roof) a rate and the instruction of each format, none on AMX, in the reference build or
 * in a fast build without SIMD kernels (NATIVE=-march=x86-64: its ops are named "scalar"). */
static void test_tools_part(Ops* fast[2], const Ops* ref) {
    const int reference_build = strcmp(fast[1]->name, "reference") == 0;
    for (int t = 0; t < 2; t++) {
        int seen[100] = {0}, ok = 1;
        fast[t]->parallel_for(fast[t], 100, count_item, seen);
        for (int i = 0; i < 100; i++) ok &= seen[i] % 1000 == 1 && seen[i] / 1000 < fast[t]->threads(fast[t]);
        check(ok, "parallel_for: every item once, on a thread below threads()");
    }
    check(fast[1]->set_threads(fast[1], 1) == 1 && fast[1]->set_threads(fast[1], 5) == (reference_build ? 1 : 2) &&
              ref->threads(ref) == 1,
          "set_threads: 1 .. the threads the ops were made with (the reference: 1)");
    int ok = 1;
    const int no_simd = reference_build || strcmp(fast[1]->name, "scalar") == 0;
    for (int w = WEIGHT_F32; w <= WEIGHT_Q4; w++)
        for (int on_amx = 0; on_amx < 2; on_amx++) {
            const char* ins = NULL;
            const double rate = peak_ops(fast[1], (WeightType)w, on_amx, 0.01, &ins);
            const int int8 = w == WEIGHT_Q8 || w == WEIGHT_Q4;
            if (no_simd) ok &= rate == 0.0 && strcmp(ins, "scalar") == 0;
            else if (on_amx) ok &= rate == 0.0 && strcmp(ins, "amx") == 0;
            else ok &= rate > 0.0 && (strcmp(ins, "fp32 fma") == 0) == !int8;
        }
    check(ok, "peak_ops: a positive rate of fp32 FMA (f32, bf16) or the int8 dot product (q8, q4), none where "
              "prefill runs on AMX tiles (\"amx\"); none in the reference build");
}

int main(void) {
    Ops* fast[2] = {make_ops(1, 0), make_ops(2, 0)};
    Ops* ref = make_ops(1, 1);
    if (!fast[0] || !fast[1] || !ref) {
        printf("ops_new failed\n");
        return 1;
    }
    printf("ops: %s (threads %d and %d) against %s\n", fast[1]->name, fast[0]->threads(fast[0]),
           fast[1]->threads(fast[1]), ref->name);
    test_matmul(fast, ref);
    test_matmul_segments(fast, ref);
    test_elementwise(fast, ref);
    test_rope(fast, ref);
    test_attention(fast, ref);
    test_tools_part(fast, ref);
    ops_free(fast[0]);
    ops_free(fast[1]);
    ops_free(ref);
    return checks_done();
}
