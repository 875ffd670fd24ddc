/* tests/test_kernels.c: every SIMD kernel (the plain names) against its scalar reference, over
 * awkward sizes, all three weight types, one and two threads. Tolerances are stated next to each
 * check. Prints "N passed, M failed" and exits non-zero on any failure. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fast/fast.h"
#include "kernels/ops.h"
#include "kernels/simd_math.h" /* which SIMD paths this build has (KERNELS_AMX) */

#if defined(KERNELS_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "tests/check.h"
#include "tests/test_matrix.h"

/* Fast ops (the kernel context behind them: ops_kernels) for matmuls of up to max_batch tokens and
 * max_cols columns; attention's part is sized small, since these tests call the kernels directly. */
static Ops* fast_ops(int threads, int max_batch, int max_cols) {
    const OpsSpec spec = {.threads = threads, .max_batch = max_batch, .max_cols = max_cols, .n_heads = 1,
                          .n_kv_heads = 1, .head_dim = 16, .max_pos = 16};
    return ops_new(&spec);
}

/* The product of one matrix: matmul takes a list of them. */
static void matmul_one(Ops* k, float* out, const float* x, const Matrix* W, int n) { matmul(k, &out, x, &W, 1, n); }

/* Each output of the product against the reference within matmul_tolerance (test_matrix.h). */
static int check_matmul(Ops* k, WeightType type, int rows, int cols, int gs, int n) {
    TestMatrix t = make_matrix(type, rows, cols, gs);
    float* x = malloc((size_t)n * cols * sizeof(float));
    float* ref = malloc((size_t)n * rows * sizeof(float));
    float* out = malloc((size_t)n * rows * sizeof(float));
    float* out2 = malloc((size_t)n * rows * sizeof(float));
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = frand() * (1.0f + 3.0f * (i % 7 == 0));
    matmul_scalar(ref, x, &t.M, n);
    matmul_one(k, out, x, &t.M, n);
    int ok = 1;
    double worst = 0;
    for (int tk = 0; tk < n && ok; tk++) {
        const float* xt = x + (size_t)tk * cols;
        for (int r = 0; r < rows; r++) {
            double abssum, exact;
            const double tol = matmul_tolerance(&t, xt, r, &abssum, &exact);
            double e = fabs((double)out[(size_t)tk * rows + r] - ref[(size_t)tk * rows + r]);
            double e_ref = fabs((double)ref[(size_t)tk * rows + r] - exact); /* reference vs double */
            if (e / tol > worst) worst = e / tol;
            if (!(e <= tol) || !(e_ref <= 2e-5 * abssum + 1e-6)) {
                printf("  %s %dx%d gs=%d n=%d: token %d row %d: simd %.8g ref %.8g exact %.8g tol %.3g\n",
                       tname(type), rows, cols, gs, n, tk, r, out[(size_t)tk * rows + r],
                       ref[(size_t)tk * rows + r], exact, tol);
                ok = 0;
                break;
            }
        }
    }
    char what[160];
    snprintf(what, sizeof what, "matmul %s rows=%d cols=%d gs=%d n=%d (worst error/tol %.3f)", tname(type),
             rows, cols, gs, n, worst);
    check(ok, what);

    /* one matmul call on two matrices (this one and a slice of it) equals a call for each */
    Matrix half = t.M;
    half.rows = rows / 2 > 0 ? rows / 2 : 1;
    float* out3 = malloc((size_t)n * half.rows * sizeof(float));
    float* outs[2] = {out2, out3};
    const Matrix* Ws[2] = {&t.M, &half};
    memset(out2, 0, (size_t)n * rows * sizeof(float));
    matmul(k, outs, x, Ws, 2, n);
    int same = memcmp(out, out2, (size_t)n * rows * sizeof(float)) == 0;
    float* out4 = malloc((size_t)n * half.rows * sizeof(float));
    matmul_one(k, out4, x, &half, n);
    same = same && memcmp(out3, out4, (size_t)n * half.rows * sizeof(float)) == 0;
    snprintf(what, sizeof what, "matmul of two matrices %s rows=%d cols=%d n=%d equals one at a time", tname(type),
             rows, cols, n);
    check(same, what);
    free(out3);
    free(out4);
    free(x);
    free(ref);
    free(out);
    free(out2);
    free_matrix(&t);
    return ok;
}

/* n tokens at once (prefill) against each token alone (decode's matrix-vector kernel): both
 * quantise a token's activations the same way, so for q8 and q4 they differ only by fp32
 * rounding, 2e-5 * sum|w x|, far below check_matmul's bound for the quantisation itself, which at
 * thousands of columns is near the size of an output (tokens left out of a block, their outputs
 * zero, failed it by only 1.1x its tolerance). */
static void check_tokens_alone(Ops* k, WeightType type, int rows, int cols, int gs, int n) {
    TestMatrix t = make_matrix(type, rows, cols, gs);
    float* x = malloc((size_t)n * cols * sizeof(float));
    float* all = malloc((size_t)n * rows * sizeof(float));
    float* one = malloc((size_t)rows * sizeof(float));
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = frand();
    matmul_one(k, all, x, &t.M, n);
    int ok = 1;
    for (int tk = 0; tk < n && ok; tk++) {
        const float* xt = x + (size_t)tk * cols;
        matmul_one(k, one, xt, &t.M, 1);
        for (int r = 0; r < rows && ok; r++) {
            double abssum = 0;
            for (int c = 0; c < cols; c++) abssum += fabs((double)t.deq[(size_t)r * cols + c] * xt[c]);
            if (!(fabs((double)all[(size_t)tk * rows + r] - one[r]) <= 2e-5 * abssum)) {
                printf("  token %d row %d: %d tokens %.8g, alone %.8g\n", tk, r, n, all[(size_t)tk * rows + r], one[r]);
                ok = 0;
            }
        }
    }
    char what[120];
    snprintf(what, sizeof what, "matmul %s %dx%d: %d tokens at once == each alone, to fp32 rounding", tname(type), rows,
             cols, n);
    check(ok, what);
    free(x);
    free(all);
    free(one);
    free_matrix(&t);
}

/* kernels.h's half_to_float (q8's and q4's scales) against the definition of binary16, for every finite
 * half: (-1)^s 2^(e-15) (1 + m/1024), and m 2^-24 where e = 0. */
static void test_half_to_float(void) {
    int ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        const int e = (h >> 10) & 31, m = h & 1023;
        if (e == 31) continue;
        double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
        if (h & 0x8000) v = -v;
        const float f = half_to_float((uint16_t)h);
        ok &= (double)f == v && !!signbit(f) == !!(h & 0x8000);
    }
    check(ok, "half_to_float exact for every finite float16");
}

/* The value of IEEE binary16 nearest to x (ties to even), from the definition with libm in double:
 * the half's spacing at x's exponent (2^-24 below 2^-14), nearbyint (ties to even); +-inf from
 * 65520 on. The definition float_to_half must meet. */
static double nearest_half(float x) {
    double a = fabs((double)x), ulp;
    if (a >= 65520.0) return copysign(INFINITY, x);
    if (a < 0x1p-14) ulp = 0x1p-24;
    else {
        int e;
        frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
        ulp = ldexp(1.0, e - 11);
    }
    return copysign(nearbyint(a / ulp) * ulp, x);
}

/* float_to_half: every finite half back to itself; against the definition on floats that matter
 * (each half, the midpoints to the next half and the floats just beside them, random bit
 * patterns, the overflow edge); float_to_half_row (F16C or NEON in SIMD builds) the same bits. */
static void test_float_to_half(void) {
    int round_trip = 1, nearest = 1, even = 1;
    size_t cap = 4 * 65536 + 40000, n = 0;
    float* xs = malloc(cap * sizeof(float));
    for (uint32_t h = 0; h < 0x7c00; h++) { /* the positive finite halves; signs below */
        const float v = half_to_float((uint16_t)h);
        round_trip &= float_to_half(v) == h && float_to_half(-v) == (h | 0x8000);
        xs[n++] = v;
        if (h + 1 < 0x7c00) { /* halfway to the next half: exact in float (12 significant bits) */
            const float mid = (float)(0.5 * ((double)v + half_to_float((uint16_t)(h + 1))));
            const uint16_t r = float_to_half(mid);
            even &= (r & 1) == 0 && (r == h || r == h + 1);
            xs[n++] = mid;
            xs[n++] = nextafterf(mid, 0.0f);
            xs[n++] = nextafterf(mid, INFINITY);
        }
    }
    for (int i = 0; i < 40000 - 8; i++) { /* random floats over the exponents near half's range */
        union { uint32_t u; float f; } v;
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        v.u = (uint32_t)(rng >> 32);
        v.u = (v.u & 0x807fffffu) | ((uint32_t)(96 + (rng & 63)) << 23); /* 2^-31 .. 2^32 */
        xs[n++] = v.f;
    }
    const float edges[8] = {65504.0f, 65519.996f, 65520.0f, 1e30f, 0x1p-25f, 0x1.000002p-25f, 0x1p-26f, -0.0f};
    for (int i = 0; i < 8; i++) xs[n++] = edges[i];
    for (size_t i = 0; i < n; i++)
        for (int s = 0; s < 2; s++) {
            const float x = s ? -xs[i] : xs[i];
            nearest &= (double)half_to_float(float_to_half(x)) == nearest_half(x);
        }
    check(round_trip, "float_to_half: every finite half (and its negative) back to its bits");
    check(nearest, "float_to_half: the nearest half (libm's nearbyint on the half's spacing), inf from 65520");
    check(even, "float_to_half: halfway between two halves rounds to the even one");
    /* the row kernel against the scalar one, tails included (n not a multiple of 8); infinities
     * and a NaN too */
    xs[n++] = INFINITY, xs[n++] = -INFINITY, xs[n++] = NAN;
    uint16_t *a = malloc(n * sizeof(uint16_t)), *b = malloc(n * sizeof(uint16_t));
    float_to_half_row_scalar(a, xs, (int)n);
    float_to_half_row(b, xs, (int)n);
    check(memcmp(a, b, n * sizeof(uint16_t)) == 0, "float_to_half_row == float_to_half_row_scalar bitwise");
    free(xs), free(a), free(b);
}

static void test_matrix_row(void) {
    WeightType types[4] = {WEIGHT_F32, WEIGHT_BF16, WEIGHT_Q8, WEIGHT_Q4};
    for (int k = 0; k < 4; k++) {
        TestMatrix t = make_matrix(types[k], 5, 96, 32);
        float out[96];
        int ok = 1;
        for (int r = 0; r < 5; r++) {
            matrix_row(out, &t.M, r);
            for (int c = 0; c < 96; c++) ok &= out[c] == t.deq[(size_t)r * 96 + c];
        }
        char what[64];
        snprintf(what, sizeof what, "matrix_row %s exact", tname(types[k]));
        check(ok, what);
        free_matrix(&t);
    }
}

static void test_rmsnorm(void) {
    int sizes[] = {1, 7, 8, 31, 128, 1024, 1027};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int n = sizes[k];
        float *x = malloc(n * sizeof(float)), *w = malloc(n * sizeof(float));
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        for (int i = 0; i < n; i++) {
            x[i] = frand() * 10;
            w[i] = frand();
        }
        rmsnorm_scalar(a, x, w, n, 1e-6f);
        rmsnorm(b, x, w, n, 1e-6f);
        /* tolerance 1e-5 relative to max|out| (sum of squares reassociated) */
        double m = 0, e = 0, ss = 0;
        for (int i = 0; i < n; i++) {
            if (fabs(a[i]) > m) m = fabs(a[i]);
            if (fabs(a[i] - b[i]) > e) e = fabs(a[i] - b[i]);
            ss += (double)x[i] * x[i];
        }
        /* the reference against double precision, and out == x in place */
        double inv = 1.0 / sqrt(ss / n + 1e-6), e2 = 0;
        for (int i = 0; i < n; i++) e2 = fmax(e2, fabs(a[i] - w[i] * x[i] * inv));
        memcpy(a, x, n * sizeof(float));
        rmsnorm(a, a, w, n, 1e-6f);
        char what[64];
        snprintf(what, sizeof what, "rmsnorm n=%d", n);
        check(e <= 1e-5 * m + 1e-12 && e2 <= 1e-5 * m + 1e-12 && memcmp(a, b, n * sizeof(float)) == 0, what);
        free(x), free(w), free(a), free(b);
    }
}

static void test_rope(void) {
    int dims[] = {2, 16, 18, 64, 128};
    for (size_t k = 0; k < sizeof dims / sizeof *dims; k++) {
        int d = dims[k], H = 3, half = d / 2;
        float *x = malloc(H * d * sizeof(float)), *a = malloc(H * d * sizeof(float)), *b = malloc(H * d * sizeof(float));
        float *c = malloc(half * sizeof(float)), *s = malloc(half * sizeof(float));
        for (int i = 0; i < H * d; i++) x[i] = frand();
        for (int i = 0; i < half; i++) {
            float ang = 7.0f * powf(10000.0f, -2.0f * i / d);
            c[i] = cosf(ang);
            s[i] = sinf(ang);
        }
        memcpy(a, x, H * d * sizeof(float));
        memcpy(b, x, H * d * sizeof(float));
        rope_scalar(a, H, d, c, s);
        rope(b, H, d, c, s);
        double e = 0, e_pair = 0;
        for (int h = 0; h < H; h++)
            for (int i = 0; i < half; i++) {
                /* rotate-half pairing: (i, i + d/2) */
                float xa = x[h * d + i], xb = x[h * d + i + half];
                e_pair = fmax(e_pair, fabs(a[h * d + i] - (xa * c[i] - xb * s[i])));
                e_pair = fmax(e_pair, fabs(a[h * d + i + half] - (xb * c[i] + xa * s[i])));
            }
        for (int i = 0; i < H * d; i++) e = fmax(e, fabs(a[i] - b[i]));
        /* rope.c's twins round as its reference (products, then sum): the same bits under gcc's
         * -std=c11, which does not fuse the reference's products; other compilers may, by one
         * rounding. */
#if defined(__GNUC__) && !defined(__clang__)
        const double tol = 0;
#else
        const double tol = 1e-6;
#endif
        char what[80];
        snprintf(what, sizeof what, "rope head_dim=%d (rotate-half pairs; twin tol %g)", d, tol);
        check(e <= tol && e_pair <= 1e-6, what);
        free(x), free(a), free(b), free(c), free(s);
    }
}

/* wv_exp, AVX-512's 16-lane exponential of its own, gives lane for lane the bits of fv_exp (so
 * prefill's softmax gives the same bits on either): floats of every magnitude, both clamps' edges,
 * zeros, infinities and NaN. */
static void test_wide_exp(void) {
#if defined(WV_LANES) && defined(FV_LANES)
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -87.3365478515625f, -87.34f, 88.3762626647949f,
                             88.38f, 1e-40f, -1e-40f, 0.5f, -0.5f, 1.0f};
    int same = 1;
    for (int rep = 0; rep < 20000; rep++) {
        float x[WV_LANES], a[WV_LANES], b[WV_LANES];
        for (int i = 0; i < WV_LANES; i++)
            x[i] = rep % 7 == 0 ? special[(rep / 7 + i) % (sizeof special / sizeof *special)]
                                : frand() * ldexpf(1.0f, rep % 12 - 4);
        wv_store(a, wv_exp(wv_load(x)));
        for (int i = 0; i < WV_LANES; i += FV_LANES) fv_store(b + i, fv_exp(fv_load(x + i)));
        same &= memcmp(a, b, sizeof a) == 0;
    }
    check(same, "wv_exp == fv_exp lane for lane (every magnitude, the clamps' edges, infinities, NaN)");
#endif
}

static void test_softmax_swiglu(void) {
    int sizes[] = {1, 5, 8, 9, 100, 1000, 4099};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int n = sizes[k];
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        float *g = malloc(n * sizeof(float)), *g2 = malloc(n * sizeof(float)), *u = malloc(n * sizeof(float));
        for (int i = 0; i < n; i++) {
            a[i] = b[i] = frand() * 30.0f;
            g[i] = g2[i] = frand() * 20.0f;
            u[i] = frand() * 3.0f;
        }
        if (n > 3) a[3] = b[3] = -1e30f;  /* far below the max: exp underflows to 0 */
        softmax_scalar(a, n);
        softmax(b, n);
        /* tolerance: 1e-6 absolute per probability (exp error ~2e-7 relative), and sums to 1 */
        double e = 0, sum = 0;
        for (int i = 0; i < n; i++) {
            e = fmax(e, fabs(a[i] - b[i]));
            sum += b[i];
        }
        char what[64];
        snprintf(what, sizeof what, "softmax n=%d", n);
        check(e <= 1e-6 && fabs(sum - 1.0) <= 1e-5, what);
        swiglu_scalar(g, u, n);
        swiglu(g2, u, n);
        /* tolerance: 2e-6 relative + 1e-7 absolute */
        e = 0;
        int ok = 1;
        for (int i = 0; i < n; i++) ok &= fabs(g[i] - g2[i]) <= 2e-6 * fabs(g[i]) + 1e-7;
        snprintf(what, sizeof what, "swiglu n=%d", n);
        check(ok, what);
        free(a), free(b), free(g), free(g2), free(u);
    }
}

/* n cached rows of keys and values (row stride `stride`, the head's d values at offset d in it),
 * twice: as one array, and in blocks of TEST_BLOCK_LEN rows with a gap after each block, as the
 * engine's KV cache keeps them (KVRows); each both as floats and as halves (`--kv-cache f16`),
 * the values chosen exactly representable as halves, so that the fp16 cache holds the same
 * numbers as the fp32 one and attention over either must give the same bits (but prefill where
 * the build multiplies bf16 pairs: pairs_as_reference). */
#define TEST_BLOCK_LEN 5
/* An AVX2 build without F16C (-mavx2 alone) runs fp16 attention on the scalar reference, so
 * there its results are the reference's bits. */
#if !defined(KERNELS_SCALAR) && defined(__AVX2__) && !defined(__F16C__)
#define KV_F16_SIMD 0
#else
#define KV_F16_SIMD 1
#endif
/* Decode over a q8 cache multiplies int8 keys by an int8-quantised query in builds with AVX-512
 * VNNI or AVX2 alone (fast/attention.c, q8_scores), for head_dims up to this. */
#if defined(KERNELS_Q8_DOT)
#define Q8_DOT_DIMS KERNELS_Q8_DOT_MAX_DIM
#else
#define Q8_DOT_DIMS 0
#endif
/* With AVX-512 VNNI decode over an fp16 cache runs on zmm (fast/attention.c, wide_scores), its sums in
 * another order than the fp32 cache's 8-lane kernel. */
#if defined(KERNELS_Q8_DOT) && defined(KERNELS_AVX512)
#define F16_WIDE 1
#else
#define F16_WIDE 0
#endif
/* With AVX-512 VNNI decode's weighted sum over a q8 cache at head_dim 128 multiplies int16 weights
 * by the int8 values, two rows at a time, for a run of eight queries (fast/attention.c, q8_pairs_sum_128). */
#if defined(KERNELS_Q8_DOT) && defined(KERNELS_AVX512)
#define Q8_PAIRS_128 1
#else
#define Q8_PAIRS_128 0
#endif
/* Prefill over an fp16 or q8 cache multiplies bf16 pairs in builds with AVX-512 BF16. */
#if defined(KERNELS_BF16_DOT)
#define ATTENTION_PAIRS_HERE 1
#else
#define ATTENTION_PAIRS_HERE 0
#endif
typedef struct {
    float *kc, *vc, *kb, *vb;
    uint16_t *kc16, *vc16, *kb16, *vb16;
    KVRows flat, blocked, flat16, blocked16;
    /* where KV_Q8_GROUP divides d: the rows quantised (kv_quantize_row) in blocks, and the values
     * they hold as floats, in blocks alike: attention over the two must give the same bits */
    int8_t *kb8, *vb8;
    float *kq, *vq;
    KVRows blocked8, blocked_q;
    /* the same q8 rows as one array, and the q8 values (blocked) and the halves (one array)
     * rounded to bf16 as floats: prefill over an fp16 or q8 cache multiplies bf16 pairs where the
     * build has them (fast/attention.c, ATTENTION_PAIRS) */
    int8_t *kf8, *vf8;
    float *kr, *vr, *kcr, *vcr;
    KVRows flat8, blocked_r, flat_r16;
} TestKV;

static TestKV make_kv(int n, int d, int stride) {
    TestKV t;
    const size_t n_blocks = (size_t)(n + TEST_BLOCK_LEN - 1) / TEST_BLOCK_LEN;
    const size_t block_stride = (size_t)TEST_BLOCK_LEN * stride + 24;
    t.kc = malloc((size_t)n * stride * sizeof(float));
    t.vc = malloc((size_t)n * stride * sizeof(float));
    t.kb = calloc(n_blocks * block_stride, sizeof(float));
    t.vb = calloc(n_blocks * block_stride, sizeof(float));
    t.kc16 = malloc((size_t)n * stride * sizeof(uint16_t));
    t.vc16 = malloc((size_t)n * stride * sizeof(uint16_t));
    t.kb16 = calloc(n_blocks * block_stride, sizeof(uint16_t));
    t.vb16 = calloc(n_blocks * block_stride, sizeof(uint16_t));
    t.kcr = malloc((size_t)n * stride * sizeof(float));
    t.vcr = malloc((size_t)n * stride * sizeof(float));
    for (size_t i = 0; i < (size_t)n * stride; i++) {
        t.kc16[i] = float_to_half(frand() * 2);
        t.vc16[i] = float_to_half(frand());
        t.kc[i] = half_to_float(t.kc16[i]);
        t.vc[i] = half_to_float(t.vc16[i]);
        t.kcr[i] = bf16_to_f32(f32_to_bf16(t.kc[i]));
        t.vcr[i] = bf16_to_f32(f32_to_bf16(t.vc[i]));
    }
    for (int r = 0; r < n; r++) {
        size_t at = (size_t)(r / TEST_BLOCK_LEN) * block_stride + (size_t)(r % TEST_BLOCK_LEN) * stride;
        memcpy(t.kb + at, t.kc + (size_t)r * stride, (size_t)stride * sizeof(float));
        memcpy(t.vb + at, t.vc + (size_t)r * stride, (size_t)stride * sizeof(float));
        memcpy(t.kb16 + at, t.kc16 + (size_t)r * stride, (size_t)stride * sizeof(uint16_t));
        memcpy(t.vb16 + at, t.vc16 + (size_t)r * stride, (size_t)stride * sizeof(uint16_t));
    }
    t.kb8 = t.vb8 = t.kf8 = t.vf8 = NULL;
    t.kq = t.vq = t.kr = t.vr = NULL;
    if (d % KV_Q8_GROUP == 0) { /* rows of d + d / 8 bytes, a gap of 8 after each; blocks as above */
        const int stride8 = (int)kv_row_elems(KV_Q8, d) + 8;
        const size_t block8 = (size_t)TEST_BLOCK_LEN * stride8 + 24;
        t.kb8 = calloc(n_blocks * block8, 1);
        t.vb8 = calloc(n_blocks * block8, 1);
        t.kq = calloc(n_blocks * block_stride, sizeof(float));
        t.vq = calloc(n_blocks * block_stride, sizeof(float));
        t.kr = calloc(n_blocks * block_stride, sizeof(float));
        t.vr = calloc(n_blocks * block_stride, sizeof(float));
        t.kf8 = calloc((size_t)n * stride8, 1);
        t.vf8 = calloc((size_t)n * stride8, 1);
        for (int r = 0; r < n; r++) {
            const size_t at8 = (size_t)(r / TEST_BLOCK_LEN) * block8 + (size_t)(r % TEST_BLOCK_LEN) * stride8;
            const size_t at = (size_t)(r / TEST_BLOCK_LEN) * block_stride + (size_t)(r % TEST_BLOCK_LEN) * stride;
            kv_quantize_row(t.kb8 + at8, t.kc + (size_t)r * stride + d, d);
            float x[512]; /* the values at scales 1 to 1/16 by row and group, so that groups' scales differ */
            for (int i = 0; i < d; i++) x[i] = ldexpf(t.vc[(size_t)r * stride + d + i], -((i / KV_Q8_GROUP + r) % 5));
            kv_quantize_row(t.vb8 + at8, x, d);
            memcpy(t.kf8 + (size_t)r * stride8, t.kb8 + at8, (size_t)stride8);
            memcpy(t.vf8 + (size_t)r * stride8, t.vb8 + at8, (size_t)stride8);
            for (int i = 0; i < d; i++) {
                t.kq[at + d + i] = kv_value(t.kb8, at8, i, d, KV_Q8);
                t.vq[at + d + i] = kv_value(t.vb8, at8, i, d, KV_Q8);
                t.kr[at + d + i] = bf16_to_f32(f32_to_bf16(t.kq[at + d + i]));
                t.vr[at + d + i] = bf16_to_f32(f32_to_bf16(t.vq[at + d + i]));
            }
        }
        t.blocked8 = (KVRows){t.kb8, t.vb8, stride8, TEST_BLOCK_LEN, block8, KV_Q8};
        t.blocked_q = (KVRows){t.kq + d, t.vq + d, stride, TEST_BLOCK_LEN, block_stride, KV_F32};
        t.flat8 = (KVRows){t.kf8, t.vf8, stride8, n, 0, KV_Q8};
        t.blocked_r = (KVRows){t.kr + d, t.vr + d, stride, TEST_BLOCK_LEN, block_stride, KV_F32};
    }
    t.flat = (KVRows){t.kc + d, t.vc + d, stride, n, 0, 0};
    t.blocked = (KVRows){t.kb + d, t.vb + d, stride, TEST_BLOCK_LEN, block_stride, 0};
    t.flat16 = (KVRows){t.kc16 + d, t.vc16 + d, stride, n, 0, 1};
    t.blocked16 = (KVRows){t.kb16 + d, t.vb16 + d, stride, TEST_BLOCK_LEN, block_stride, 1};
    t.flat_r16 = (KVRows){t.kcr + d, t.vcr + d, stride, n, 0, 0};
    return t;
}

static void free_kv(TestKV* t) {
    free(t->kc), free(t->vc), free(t->kb), free(t->vb);
    free(t->kc16), free(t->vc16), free(t->kb16), free(t->vb16);
    free(t->kb8), free(t->vb8), free(t->kq), free(t->vq);
    free(t->kf8), free(t->vf8), free(t->kr), free(t->vr), free(t->kcr), free(t->vcr);
}

/* kv_quantize_row against its definition (kernels.h, KV_Q8): per group of 16 the scale is
 * float_to_half(max|x| / 127), every |q| <= 127 and q * s within s / 2 of x (a zero group: zeros),
 * over rows of mixed magnitudes with a zero group and a group of one value. */
static void test_kv_quantize_row(void) {
    enum { D = 64 };
    int ok = 1;
    for (int rep = 0; rep < 200; rep++) {
        float x[D];
        int8_t row[D + D / 8];
        for (int i = 0; i < D; i++) x[i] = frand() * (float)(1 << (rep % 12)) * 1e-2f;
        for (int i = 16; i < 32; i++) x[i] = 0.0f;                       /* a zero group */
        for (int i = 32; i < 48; i++) x[i] = i == 40 ? -3.5f * (rep + 1) : 0.0f; /* one value */
        kv_quantize_row(row, x, D);
        for (int g = 0; g < D / KV_Q8_GROUP; g++) {
            float amax = 0.0f;
            for (int i = g * 16; i < g * 16 + 16; i++) amax = fmaxf(amax, fabsf(x[i]));
            uint16_t h;
            memcpy(&h, row + D + 2 * g, sizeof h);
            const float s = half_to_float(h);
            ok &= h == float_to_half(amax / 127.0f);
            for (int i = g * 16; i < g * 16 + 16; i++)
                ok &= row[i] >= -127 && fabsf(kv_value(row, 0, i, D, KV_Q8) - x[i]) <= s / 2 * (1 + 1e-6f) &&
                      kv_value(row, 0, i, D, KV_Q8) == (float)row[i] * s;
        }
    }
    check(ok, "kv_quantize_row: scales float16(max|x| / 127), values within half a step, zero groups zero");
    /* the SIMD row (where the build has it) against the reference, bit for bit: random rows of
     * every magnitude down to subnormals, a group of exact ties (x / s = k + 1/2, s = 2^-4), and
     * now and then a NaN or an infinity (what a checkpoint of broken weights gives) */
    int same = 1;
    for (int rep = 0; rep < 2000; rep++) {
        float x[D];
        int8_t a[D + D / 8], b[D + D / 8];
        for (int i = 0; i < D; i++) x[i] = frand() * ldexpf(1.0f, rep % 160 - 140);
        for (int i = 16; i < 32; i++) x[i] = i == 16 ? 127.0f / 16 : ((float)(i % 9) - 4.5f) / 16 * (rep % 2 ? 1 : -1);
        if (rep % 50 == 0) x[40] = NAN;
        if (rep % 50 == 1) x[57] = -INFINITY;
        kv_quantize_row_scalar(a, x, D);
        kv_quantize_row(b, x, D);
        same &= memcmp(a, b, sizeof a) == 0;
    }
    check(same, "kv_quantize_row == kv_quantize_row_scalar bitwise (ties, subnormals, zero groups, NaN, infinity)");
}

/* How far q8_pairs_sum_128's rounding of the weights may move output i of n positions: each row's
 * weight a s is within 0.5 / k of w / k, k = 32766 / (the largest a, at most 1, x the largest
 * scale of its chunk), so the sum moves at most 0.5 x (the largest scale) / 32766 x the sum of
 * |q[i]| over the rows, and the division by the total weight (at least 1) only shrinks that. */
static float q8_pairs_bound(const KVRows* flat8, int n, int d, int i) {
    float top = 0.0f, q = 0.0f;
    for (int t = 0; t < n; t++) {
        const int8_t* row = (const int8_t*)flat8->values + (size_t)t * flat8->stride;
        for (int g = 0; g < d; g += KV_Q8_GROUP) {
            uint16_t h;
            memcpy(&h, row + kv_q8_scale_at(d, g), sizeof h);
            top = fmaxf(top, half_to_float(h));
        }
        q += fabsf((float)row[i]);
    }
    return 0.5f * top / 32766.0f * q;
}

/* attention_group (decode) over the q8 cache: the reference gives the bits of the same over the
 * q8 values as floats; the fast kernel too, or where it multiplies int8 (Q8_DOT_DIMS), matches the
 * reference over those values and the queries quantised as a cached row (kv_quantize_row) within
 * 1e-5 (|v| <= 1: the sums' rounding), and the cache as one array, and each query alone, give the
 * same bits. Where a run of eight queries takes int16 weights (Q8_PAIRS_128, head_dim 128), the
 * group is within q8_pairs_bound more of the reference, and each query alone (fp32 weights) within
 * 1e-5. */
static int q8_group_as_reference(const TestKV* kv, const float* q, int nq, int n, int d, float scale, float* att1,
                                 float* att2) {
    const size_t m = (size_t)nq * d;
    float *a = malloc(m * sizeof(float)), *b = malloc(m * sizeof(float)), *qd = malloc(m * sizeof(float));
    float* r = malloc(m * sizeof(float));
    int8_t* row = malloc(kv_row_elems(KV_Q8, d));
    int ok = 1;
    attention_group_scalar(a, q, nq, &kv->blocked8, n, d, scale, att1);
    attention_group_scalar(b, q, nq, &kv->blocked_q, n, d, scale, att1);
    for (size_t i = 0; i < m; i++) ok &= a[i] == b[i];
    attention_group(a, q, nq, &kv->blocked8, n, d, scale, att2);
    if (attention_simd(d, KV_Q8) && d <= Q8_DOT_DIMS) {
        for (int j = 0; j < nq; j++) {
            kv_quantize_row(row, q + (size_t)j * d, d);
            for (int i = 0; i < d; i++) qd[(size_t)j * d + i] = kv_value(row, 0, i, d, KV_Q8);
        }
        attention_group_scalar(r, qd, nq, &kv->blocked_q, n, d, scale, att1);
        const int pairs = Q8_PAIRS_128 && d == 128 && nq >= 8; /* runs of eight take int16 weights */
        for (size_t i = 0; i < m; i++)
            ok &= fabsf(a[i] - r[i]) <= 1e-5f + (pairs ? q8_pairs_bound(&kv->flat8, n, d, (int)(i % d)) : 0.0f);
        attention_group(b, q, nq, &kv->flat8, n, d, scale, att2);
        for (size_t i = 0; i < m; i++) ok &= a[i] == b[i];
        for (int j = 0; j < nq; j++) attention_group(b + (size_t)j * d, q + (size_t)j * d, 1, &kv->blocked8, n, d, scale, att2);
        for (size_t i = 0; i < m; i++) ok &= pairs ? fabsf(b[i] - r[i]) <= 1e-5f : a[i] == b[i];
    } else {
        attention_group(b, q, nq, &kv->blocked_q, n, d, scale, att2);
        for (size_t i = 0; i < m; i++) ok &= a[i] == b[i];
    }
    free(a), free(b), free(qd), free(r), free(row);
    return ok;
}

/* attention_group against the scalar reference; each query alone against its group; and the
 * blocked layout against one array: the same bits, in the SIMD kernels (which continue each sum
 * from block to block in the same order) and in the reference. */
static void test_attention(const Ops* k) {
    /* which head_dims and caches take the SIMD kernels, the ones the comparisons below test */
    const int simd = strcmp(kernels_simd_name(ops_kernels(k)), "scalar") != 0;
    check(attention_simd(128, 0) == simd && attention_simd(48, 0) == simd && attention_simd(80, 0) == simd &&
              !attention_simd(40, 0) && attention_simd(128, 1) == (simd && KV_F16_SIMD) && !attention_simd(40, 1) &&
              attention_simd(128, KV_Q8) == simd && attention_simd(48, KV_Q8) == simd,
          "attention_simd: head_dim 128, 48, 80 on the SIMD kernels (fp16 where widened in registers; q8), 40 not");
    /* 160: five 32-wide passes of the weighted sum; 48 and 80: a last 16 (the
     * shipped model's 48); 40: the scalar reference in every build */
    int dims[] = {128, 64, 40, 160, 48, 80};
    int npos[] = {1, 2, 7, 33, 300};
    /* 5 and 8: several pairs in one pass over the cache (Qwen3-14B's and 30B-A3B's groups), over q8
     * at head_dim 128 runs of 4 + 1 and 8; 17: more than one pass (ATTENTION_GROUP_PASS), 8 + 8 + 1 */
    int nqs[] = {1, 2, 3, 5, 8, 17};
    for (size_t a = 0; a < 6; a++)
        for (size_t p = 0; p < 5; p++)
            for (size_t g = 0; g < 6; g++) {
                int d = dims[a], n = npos[p], nq = nqs[g], stride = d * 3 + 8;
                TestKV kv = make_kv(n, d, stride);
                float* q = malloc((size_t)nq * d * sizeof(float));
                float *o1 = malloc((size_t)nq * d * sizeof(float)), *o2 = malloc((size_t)nq * d * sizeof(float));
                float *o3 = malloc((size_t)nq * d * sizeof(float)), *o4 = malloc((size_t)nq * d * sizeof(float));
                float* o5 = malloc((size_t)nq * d * sizeof(float));
                float *att1 = malloc((size_t)nq * n * sizeof(float)), *att2 = malloc((size_t)nq * n * sizeof(float));
                for (int i = 0; i < nq * d; i++) q[i] = frand() * 2;
                float scale = 1.0f / sqrtf((float)d);
                attention_group_scalar(o1, q, nq, &kv.flat, n, d, scale, att1);
                attention_group(o2, q, nq, &kv.flat, n, d, scale, att2);
                attention_group_scalar(o4, q, nq, &kv.blocked, n, d, scale, att1);
                attention_group(o5, q, nq, &kv.blocked, n, d, scale, att2);
                /* tolerance 1e-5 absolute (|v| <= 1, weights sum to 1) */
                double e = 0;
                for (int i = 0; i < nq * d; i++) e = fmax(e, fabs(o1[i] - o2[i]));
                /* each query alone: the same bits as in its group (the kernels take queries in pairs
                 * or runs) */
                int same = 1;
                for (int j = 0; j < nq; j++) {
                    attention_group(o3 + (size_t)j * d, q + (size_t)j * d, 1, &kv.flat, n, d, scale, att2);
                    for (int i = 0; i < d; i++) same &= o3[(size_t)j * d + i] == o2[(size_t)j * d + i];
                }
                int blocks_same = 1;
                for (int i = 0; i < nq * d; i++) blocks_same &= o4[i] == o1[i] && o5[i] == o2[i];
                /* the q8 cache, blocked, reference and SIMD: the bits of the same over its values as floats */
                int q8_same = kv.kb8 ? q8_group_as_reference(&kv, q, nq, n, d, scale, att1, att2) : 1;
                /* the fp16 cache, flat and blocked, reference and SIMD: the fp32 results' bits; where
                 * decode over fp16 runs on zmm (F16_WIDE), within 1e-5 of the reference, flat and
                 * blocked and each query alone the same bits */
                int f16_same = 1;
                const KVRows* kv16[2] = {&kv.flat16, &kv.blocked16};
                for (int b = 0; b < 2; b++) {
                    attention_group_scalar(o4, q, nq, kv16[b], n, d, scale, att1);
                    attention_group(o5, q, nq, kv16[b], n, d, scale, att2);
                    for (int i = 0; i < nq * d; i++) f16_same &= o4[i] == o1[i];
                    if (!(F16_WIDE && attention_simd(d, KV_F16))) {
                        for (int i = 0; i < nq * d; i++) f16_same &= o5[i] == (KV_F16_SIMD ? o2 : o1)[i];
                        continue;
                    }
                    for (int i = 0; i < nq * d; i++) f16_same &= fabsf(o5[i] - o1[i]) <= 1e-5f;
                    if (b == 0) memcpy(o3, o5, (size_t)nq * d * sizeof(float));
                    for (int i = 0; i < nq * d; i++) f16_same &= o5[i] == o3[i];
                    for (int j = 0; j < nq; j++) {
                        attention_group(o4, q + (size_t)j * d, 1, kv16[b], n, d, scale, att2);
                        for (int i = 0; i < d; i++) f16_same &= o4[i] == o5[(size_t)j * d + i];
                    }
                }
                char what[96];
                snprintf(what, sizeof what, "attention_group head_dim=%d n_pos=%d n_q=%d", d, n, nq);
                check(e <= 1e-5, what);
                snprintf(what, sizeof what, "attention_group n_q=%d: each query as alone (head_dim=%d n_pos=%d)", nq, d, n);
                check(same, what);
                snprintf(what, sizeof what, "attention_group n_q=%d: blocks of %d rows as one array (head_dim=%d n_pos=%d)",
                         nq, TEST_BLOCK_LEN, d, n);
                check(blocks_same, what);
                snprintf(what, sizeof what, "attention_group n_q=%d: fp16 cache as fp32 (head_dim=%d n_pos=%d)", nq, d, n);
                check(f16_same, what);
                snprintf(what, sizeof what, "attention_group n_q=%d: q8 cache against its values (head_dim=%d n_pos=%d)",
                         nq, d, n);
                check(q8_same, what);
                free_kv(&kv);
                free(q), free(o1), free(o2), free(o3), free(o4), free(o5), free(att1), free(att2);
            }
}

/* Prefill over a cache that rounds (fp16, q8) where the build multiplies bf16 pairs
 * (ATTENTION_PAIRS): the fast kernel over `cache` matches the reference over the queries and
 * `rounded` (the cache's values rounded to bf16, as floats) within 2^-9 max|v| (the softmax's
 * weights are rounded to bf16 too: each moves by at most 2^-9 of itself, and they sum to 1;
 * |v| <= 1 here) plus fp32 noise; the same values in another layout (`other`), and each row
 * alone, give the same bits. */
static int pairs_as_reference(const KVRows* cache, const KVRows* other, const KVRows* rounded, const float* q, int row,
                              int nq, int R, int n0, int d, float scale, float* att) {
    const size_t n = (size_t)R * row;
    float* a = calloc(n, sizeof(float));
    float* b = calloc(n, sizeof(float));
    float* qr = malloc(n * sizeof(float));
    int ok = 1;
    attention_rows(a, q, row, nq, R, cache, n0, d, scale, att);
    for (size_t i = 0; i < n; i++) qr[i] = bf16_to_f32(f32_to_bf16(q[i]));
    attention_rows_scalar(b, qr, row, nq, R, rounded, n0, d, scale, att);
    for (size_t i = 0; i < n; i++) ok &= fabsf(a[i] - b[i]) <= 1.0f / 512 + 1e-5f;
    attention_rows(b, q, row, nq, R, other, n0, d, scale, att);
    for (size_t i = 0; i < n; i++) ok &= a[i] == b[i];
    for (int r = 0; r < R; r++)
        attention_rows(b + (size_t)r * row, q + (size_t)r * row, row, nq, 1, cache, n0 + r, d, scale, att);
    for (size_t i = 0; i < n; i++) ok &= a[i] == b[i];
    free(a), free(b), free(qr);
    return ok;
}

/* attention_rows over the q8 cache (prefill): the reference gives the bits of the same over the
 * q8 values as floats; the fast kernel too, or where it multiplies bf16 pairs, pairs_as_reference. */
static int q8_rows_as_reference(const TestKV* kv, const float* q, int row, int nq, int R, int n0, int d,
                                float scale, float* att) {
    const size_t n = (size_t)R * row;
    float* a = calloc(n, sizeof(float));
    float* b = calloc(n, sizeof(float));
    int ok = 1;
    attention_rows_scalar(a, q, row, nq, R, &kv->blocked8, n0, d, scale, att);
    attention_rows_scalar(b, q, row, nq, R, &kv->blocked_q, n0, d, scale, att);
    for (size_t i = 0; i < n; i++) ok &= a[i] == b[i];
    if (ATTENTION_PAIRS_HERE && attention_simd(d, KV_Q8)) {
        ok &= pairs_as_reference(&kv->blocked8, &kv->flat8, &kv->blocked_r, q, row, nq, R, n0, d, scale, att);
    } else {
        attention_rows(a, q, row, nq, R, &kv->blocked8, n0, d, scale, att);
        attention_rows(b, q, row, nq, R, &kv->blocked_q, n0, d, scale, att);
        for (size_t i = 0; i < n; i++) ok &= a[i] == b[i];
    }
    free(a), free(b);
    return ok;
}

/* attention_rows (prefill) against the scalar reference, and each row alone against the block:
 * the tile's masking (scores past a query's causal length zeroed before the weighted sum) must not
 * change a query's result, whichever rows share its tile. */
static void test_attention_rows(void) {
    int dims[] = {128, 64, 40, 48};
    int groups[] = {1, 2, 3, 5};
    int nrows[] = {1, 2, 3, 7, 8, 13}; /* 13 rows x 5 heads: more than 4 vectors of 16 queries (AVX-512) */
    int firsts[] = {1, 5, 70};
    for (size_t a = 0; a < 4; a++)
        for (size_t g = 0; g < 4; g++)
            for (size_t rr = 0; rr < 6; rr++)
                for (size_t f = 0; f < 3; f++) {
                    int d = dims[a], nq = groups[g], R = nrows[rr], n0 = firsts[f];
                    int stride = d * 2 + 8, n_pos = n0 + R - 1, row = nq * d + 16; /* rows apart, with a gap */
                    size_t scratch = attention_rows_scratch(nq, R, n_pos, d);
                    TestKV kv = make_kv(n_pos, d, stride);
                    float* q = malloc((size_t)R * row * sizeof(float));
                    float* o1 = calloc((size_t)R * row, sizeof(float));
                    float* o2 = calloc((size_t)R * row, sizeof(float));
                    float* o3 = calloc((size_t)R * row, sizeof(float));
                    float* o4 = calloc((size_t)R * row, sizeof(float));
                    float* o5 = calloc((size_t)R * row, sizeof(float));
                    float* att = malloc(scratch * sizeof(float));
                    for (int i = 0; i < R * row; i++) q[i] = frand() * 2;
                    float scale = 1.0f / sqrtf((float)d);
                    attention_rows_scalar(o1, q, row, nq, R, &kv.flat, n0, d, scale, att);
                    attention_rows(o2, q, row, nq, R, &kv.flat, n0, d, scale, att);
                    for (int r = 0; r < R; r++)
                        attention_rows(o3 + (size_t)r * row, q + (size_t)r * row, row, nq, 1, &kv.flat, n0 + r, d, scale,
                                       att);
                    attention_rows_scalar(o4, q, row, nq, R, &kv.blocked, n0, d, scale, att);
                    attention_rows(o5, q, row, nq, R, &kv.blocked, n0, d, scale, att);
                    double e = 0; /* 1e-5 absolute, as attention_group */
                    int same = 1, blocks_same = 1, f16_same = 1;
                    for (int r = 0; r < R; r++)
                        for (int i = 0; i < nq * d; i++) {
                            size_t at = (size_t)r * row + i;
                            e = fmax(e, fabs(o1[at] - o2[at]));
                            same &= o2[at] == o3[at];
                            blocks_same &= o4[at] == o1[at] && o5[at] == o2[at];
                        }
                    int q8_same = kv.kb8 ? q8_rows_as_reference(&kv, q, row, nq, R, n0, d, scale, att) : 1;
                    const KVRows* kv16[2] = {&kv.flat16, &kv.blocked16}; /* as in test_attention */
                    const int f16_pairs = ATTENTION_PAIRS_HERE && attention_simd(d, KV_F16);
                    for (int b = 0; b < 2; b++) {
                        attention_rows_scalar(o4, q, row, nq, R, kv16[b], n0, d, scale, att);
                        attention_rows(o5, q, row, nq, R, kv16[b], n0, d, scale, att);
                        for (int r = 0; r < R; r++)
                            for (int i = 0; i < nq * d; i++) {
                                size_t at = (size_t)r * row + i;
                                f16_same &= o4[at] == o1[at] && (f16_pairs || o5[at] == (KV_F16_SIMD ? o2 : o1)[at]);
                            }
                    }
                    if (f16_pairs)
                        f16_same &= pairs_as_reference(&kv.blocked16, &kv.flat16, &kv.flat_r16, q, row, nq, R, n0, d,
                                                       scale, att);
                    char what[112];
                    snprintf(what, sizeof what, "attention_rows head_dim=%d n_q=%d rows=%d first_n_pos=%d", d, nq, R, n0);
                    check(e <= 1e-5, what);
                    snprintf(what, sizeof what, "attention_rows: each row as alone (head_dim=%d n_q=%d rows=%d first=%d)",
                             d, nq, R, n0);
                    check(same, what);
                    snprintf(what, sizeof what, "attention_rows: blocks of %d rows as one array (head_dim=%d n_q=%d rows=%d "
                             "first=%d)", TEST_BLOCK_LEN, d, nq, R, n0);
                    check(blocks_same, what);
                    snprintf(what, sizeof what, "attention_rows: fp16 cache as the reference (head_dim=%d n_q=%d rows=%d first=%d)",
                             d, nq, R, n0);
                    check(f16_same, what);
                    snprintf(what, sizeof what, "attention_rows: q8 cache as the reference (head_dim=%d n_q=%d rows=%d "
                             "first=%d)", d, nq, R, n0);
                    check(q8_same, what);
                    free_kv(&kv);
                    free(q), free(o1), free(o2), free(o3), free(o4), free(o5), free(att);
                }
}

static atomic_long pf_sum;
static atomic_int pf_hits[1000];
static void pf_fn(void* ctx, int i, int thread) {
    (void)ctx;
    (void)thread;
    atomic_fetch_add(&pf_sum, i);
    atomic_fetch_add(&pf_hits[i], 1);
}
/* A nested call runs its items on the thread of the item around it, and says so (per-thread
 * scratch stays the thread's own). */
static atomic_int pf_nested_bad;
static void pf_inner(void* ctx, int i, int thread) {
    if (thread != *(const int*)ctx) atomic_fetch_add(&pf_nested_bad, 1);
    pf_fn(NULL, i, thread);
}
typedef struct {
    Ops* k;
} PfNest;
static void pf_nested(void* ctx, int i, int thread) {
    (void)i;
    int outer = thread;
    parallel_for(ops_kernels(((const PfNest*)ctx)->k), 10, pf_inner, &outer);
}

static void test_parallel_for(Ops* k) {
    int ns[] = {0, 1, 2, 3, 17, 1000};
    for (int rep = 0; rep < 200; rep++)
        for (size_t c = 0; c < 6; c++) {
            int n = ns[c];
            atomic_store(&pf_sum, 0);
            for (int i = 0; i < n; i++) atomic_store(&pf_hits[i], 0);
            parallel_for(ops_kernels(k), n, pf_fn, NULL);
            int ok = atomic_load(&pf_sum) == (long)n * (n - 1) / 2;
            for (int i = 0; i < n; i++) ok &= atomic_load(&pf_hits[i]) == 1;
            if (!ok || rep == 199) {
                char what[64];
                snprintf(what, sizeof what, "parallel_for n=%d each index once (rep %d)", n, rep);
                check(ok, what);
                if (!ok) break;
            }
        }
    atomic_store(&pf_sum, 0);
    atomic_store(&pf_nested_bad, 0);
    PfNest nest = {k};
    for (int rep = 0; rep < 50; rep++) parallel_for(ops_kernels(k), 4, pf_nested, &nest);
    check(atomic_load(&pf_sum) == 50 * 4 * 45 && atomic_load(&pf_nested_bad) == 0,
          "parallel_for nested call runs serially, on the thread (and with the index) of the item around it");
}

static atomic_int pf_worker_items; /* items run by a thread other than the caller */
static void pf_where(void* ctx, int i, int thread) {
    (void)ctx;
    (void)i;
    if (thread != 0) atomic_fetch_add(&pf_worker_items, 1);
}

/* kernels_set_threads: the bench switches between thread counts in one process. One thread means
 * the caller runs every item; the pool can grow back up to kernels_new's count and no further,
 * and parallel_for stays correct across the switches (workers stopped and started each time). */
static void test_set_threads(void) {
    Ops* k = fast_ops(2, 8, 512);
    int ok = 1;
    for (int rep = 0; rep < 20; rep++) {
        ok &= kernels_set_threads(ops_kernels(k), 1) == 1 && kernels_threads(ops_kernels(k)) == 1;
        atomic_store(&pf_worker_items, 0);
        parallel_for(ops_kernels(k), 64, pf_where, NULL);
        ok &= atomic_load(&pf_worker_items) == 0;
        ok &= kernels_set_threads(ops_kernels(k), rep % 2 ? 2 : 7) == 2 && kernels_threads(ops_kernels(k)) == 2;
        atomic_store(&pf_sum, 0);
        parallel_for(ops_kernels(k), 1000, pf_fn, NULL);
        ok &= atomic_load(&pf_sum) == 1000L * 999 / 2;
    }
    check(ok, "kernels_set_threads: 1 thread runs every item in the caller, 2 (or more asked) gives 2, sums right");
    ops_free(k);
}

/* Two contexts side by side share nothing: interleaved matmuls on each give the bits of each
 * alone, a thread count changed on one leaves the other's, and freeing one (either order) leaves
 * the other working. */
static void test_two_contexts(void) {
    enum { ROWS = 301, COLS = 512, N = 40 };
    static float x[N * COLS], want[2][N * ROWS], got[N * ROWS];
    TestMatrix t = make_matrix(WEIGHT_Q8, ROWS, COLS, 64);
    for (int i = 0; i < N * COLS; i++) x[i] = frand();
    int ok = 1;
    for (int order = 0; order < 2; order++) {
        Ops* a = fast_ops(2, N, COLS);
        matmul_one(a, want[0], x, &t.M, N);
        matmul_one(a, want[1], x, &t.M, 1);
        Ops* b = fast_ops(1, N, COLS);
        ok &= kernels_threads(ops_kernels(a)) == 2 && kernels_threads(ops_kernels(b)) == 1;
        for (int rep = 0; rep < 3; rep++) {
            matmul_one(b, got, x, &t.M, N);
            ok &= memcmp(got, want[0], sizeof(float) * N * ROWS) == 0;
            matmul_one(a, got, x, &t.M, 1);
            ok &= memcmp(got, want[1], sizeof(float) * ROWS) == 0;
            matmul_one(a, got, x, &t.M, N);
            ok &= memcmp(got, want[0], sizeof(float) * N * ROWS) == 0;
        }
        Ops* keep = order == 0 ? b : a;
        ops_free(order == 0 ? a : b);
        matmul_one(keep, got, x, &t.M, N);
        ok &= memcmp(got, want[0], sizeof(float) * N * ROWS) == 0;
        ops_free(keep);
    }
    free_matrix(&t);
    check(ok, "two kernel contexts: interleaved matmuls bitwise as alone, either freed first, the other still right");
}

/* --bf16-activations (kernels_set_bf16_activations): prefill with bf16 weights multiplies them by
 * the activations rounded to bf16. Checked against the exact sum over (weight x rounded
 * activation) in double with the fp32 tolerance of check_matmul; at 1024 columns a kernel that
 * skipped the rounding would be off by about 6e-5 of sum|w x|, three times that tolerance.
 * Decode (n == 1) keeps fp32 activations: bitwise the result without the option. */
static void test_bf16_activations(void) {
    /* room for every case's n x cols in one matmul: a smaller scratch splits the tokens into
     * smaller batches than the case means to test */
    Ops* kern = fast_ops(2, 112, 1088);
    if (!kernels_set_bf16_activations(ops_kernels(kern), 1)) {
        printf("bf16 activations: skipped, this build has no bf16 dot product (AVX-512 BF16)\n");
        ops_free(kern);
        return;
    }
    /* From 16 tokens on, where the columns are a multiple of 32: with AMX-BF16 the first 16
     * tokens on AMX tiles and the rest on the packed panels (64 x 1024 x 17, 50 x 96 x 29: whole
     * panels, an odd one, rows left over, token tiles of 12, 4 and 1), elsewhere the blocked
     * activations (tiles of 8 rows x 48 or 16 tokens, rows left over one at a time, token blocks
     * of 96, or of 48 above 1,024 columns: 19 x 64 x 112, 24 x 1088 x 100). 130 x 200 x 40 takes
     * neither (200 columns), nor do fewer than 16 tokens. */
    struct { int rows, cols, n; } cases[] = {{37, 1027, 5}, {64, 1024, 17}, {9, 13, 2},     {130, 200, 40},
                                             {11, 80, 3},   {50, 96, 29},   {19, 64, 112}, {24, 1088, 100}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const int rows = cases[k].rows, cols = cases[k].cols, n = cases[k].n;
        TestMatrix t = make_matrix(WEIGHT_BF16, rows, cols, 0);
        float* x = malloc((size_t)n * cols * sizeof(float));
        float* out = malloc((size_t)n * rows * sizeof(float));
        for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = frand() * (1.0f + 3.0f * (i % 7 == 0));
        matmul_one(kern, out, x, &t.M, n);
        double worst = 0;
        for (int tk = 0; tk < n; tk++)
            for (int r = 0; r < rows; r++) {
                double abssum = 0, exact = 0;
                for (int c = 0; c < cols; c++) {
                    double p = (double)t.deq[(size_t)r * cols + c] * bf16_to_f32(f32_to_bf16(x[(size_t)tk * cols + c]));
                    abssum += fabs(p);
                    exact += p;
                }
                const double e = fabs(out[(size_t)tk * rows + r] - exact) / (2e-5 * abssum + 1e-6);
                if (!(e <= worst)) worst = e;
            }
        char what[128];
        snprintf(what, sizeof what, "bf16 activations %dx%d n=%d (worst error/tol %.3f)", rows, cols, n, worst);
        check(worst <= 1.0, what);
        /* decode keeps fp32 activations */
        float o1[130], o2[130]; /* rows <= 130 */
        matmul_one(kern, o1, x, &t.M, 1);
        kernels_set_bf16_activations(ops_kernels(kern), 0);
        matmul_one(kern, o2, x, &t.M, 1);
        kernels_set_bf16_activations(ops_kernels(kern), 1);
        snprintf(what, sizeof what, "bf16 activations %dx%d: n=1 unchanged", rows, cols);
        check(memcmp(o1, o2, (size_t)rows * sizeof(float)) == 0, what);
        free(x);
        free(out);
        free_matrix(&t);
    }
    ops_free(kern);
}

/* f32 and bf16 weights with the default fp32 activations keep every bit of both (with AMX-BF16
 * a bf16 model's activations go in as three bf16 parts, x86/matmul_float.c bf16_split_rows; elsewhere as
 * fp32). With one nonzero weight per row the output is w x[c], exact in fp32 when w or x[c] is a
 * power of two, whatever the order of the sum. So: random 24-bit activations and power-of-two
 * weights (an activation rounded to bf16 would be off by up to 2^-9 of the output, two parts
 * h + m by up to 2^-17), and for f32 also random 24-bit weights and power-of-two activations (a
 * weight rounded on the way would show). Rows 72 = four 16-row panels + 8 rows left; n = 40 is
 * two whole A tiles and a partial one, 17 one and a token, 1 and 5 the other paths. */
static void test_exact_parts(WeightType type, int random_w) {
    enum { ROWS = 72, COLS = 1024, N = 40 };
    Ops* k = fast_ops(2, N, COLS);
    TestMatrix t = make_matrix(type, ROWS, COLS, 0);
    int col[ROWS];
    float wr[ROWS];
    for (int r = 0; r < ROWS; r++) {
        frand(); /* a new draw for each row's column */
        col[r] = (int)((rng >> 20) % COLS);
        wr[r] = random_w ? frand() * 3.0f : ldexpf(r % 2 ? -1.0f : 1.0f, r % 5 - 2); /* +-1/4 .. +-4 */
        for (int c = 0; c < COLS; c++) {
            const float v = c == col[r] ? wr[r] : 0.0f;
            if (type == WEIGHT_F32) ((float*)t.data)[(size_t)r * COLS + c] = v;
            else ((uint16_t*)t.data)[(size_t)r * COLS + c] = f32_to_bf16(v);
        }
    }
    static float x[N * COLS], out[N * ROWS];
    for (int i = 0; i < N * COLS; i++)
        x[i] = random_w ? ldexpf(frand() < 0 ? -1.0f : 1.0f, (int)(i % 9) - 4) : frand() * 3.0f;
    const int ns[4] = {1, 5, 17, 40};
    for (int i = 0; i < 4; i++) {
        const int n = ns[i];
        matmul_one(k, out, x, &t.M, n);
        int ok = 1;
        for (int tk = 0; tk < n; tk++)
            for (int r = 0; r < ROWS; r++) ok &= out[(size_t)tk * ROWS + r] == wr[r] * x[(size_t)tk * COLS + col[r]];
        char what[160];
        snprintf(what, sizeof what, "%s weights, fp32 activations, n=%d: one nonzero weight per row, w x exact (%s)",
                 tname(type), n, random_w ? "random w, x powers of two" : "w powers of two, random x");
        check(ok, what);
    }
    free_matrix(&t);
    ops_free(k);
}

/* A build for a CPU with AMX runs q8 and q4 prefill on it (rows_qi in fast/x86/matmul_int8.c;
 * x86/matmul_amx.c) whenever Linux supports the tile state (asked here on its own,
 * ARCH_GET_XCOMP_SUPP) and KERNELS_AMX=0 is not set: so the matmul checks above went through the
 * AMX tiles, not the AVX-512 kernels beside them. */
static void test_amx_in_use(const Ops* k) {
#if defined(KERNELS_AMX)
    unsigned long supported = 0;
    const char* e = getenv("KERNELS_AMX");
    const int off = e && strcmp(e, "0") == 0;
    const int os_has = syscall(SYS_arch_prctl, 0x1021 /* ARCH_GET_XCOMP_SUPP */, &supported) == 0 &&
                       (supported >> 18 & 1); /* XTILEDATA */
    printf("AMX: %s\n", off ? "off (KERNELS_AMX=0)" : os_has ? "in use" : "not granted by this kernel");
    check(kernels_amx(ops_kernels(k)) == (!off && os_has), "q8/q4 prefill on AMX exactly when the CPU, Linux and KERNELS_AMX allow");
#else
    check(kernels_amx(ops_kernels(k)) == 0, "no AMX in a build without it");
#endif
}

/* One line for tests/run_tests.py: the SIMD paths this build compiled in and this CPU runs, in the
 * words of its "kernels:" summary. AMX counts only where the kernel granted the tiles. */
static void print_kernel_paths(const Ops* k) {
    printf("kernel paths:");
#if defined(KERNELS_AVX2)
    printf(" avx2+fma");
#endif
#if defined(KERNELS_KV_F16) && defined(KERNELS_AVX2)
    printf(" f16c");
#endif
#if defined(KERNELS_AVX512)
    printf(" avx512");
#endif
#if defined(KERNELS_AVX2) && (defined(__AVX512VNNI__) || defined(__AVXVNNI__))
    printf(" vnni");
#endif
#if defined(KERNELS_BF16_DOT)
    printf(" avx512-bf16");
#endif
#if defined(KERNELS_AMX)
    if (kernels_amx(ops_kernels(k))) printf(" amx");
#endif
#if defined(KERNELS_AMX_BF16)
    if (kernels_amx(ops_kernels(k))) printf(" amx-bf16");
#endif
#if defined(KERNELS_NEON)
    printf(" neon");
#endif
#if defined(KERNELS_NEON) && defined(__ARM_FEATURE_DOTPROD)
    printf(" neon-dotprod");
#endif
    (void)k;
    printf("\n");
}

/* f32 and bf16 prefill the other way than this CPU's default (kernels_float_panels): the packed
 * panels where the tiles alone are the default (AVX-512 on Zen 4), the tiles alone elsewhere, so
 * that an x86 build checks both wherever it runs. */
static void test_float_panels_switched(Ops* k) {
    const int panels = kernels_float_panels(ops_kernels(k));
    if (kernels_set_float_panels(ops_kernels(k), !panels) == panels) return; /* no panels in this build */
    const int ns[3] = {5, 29, 40};
    for (int i = 0; i < 3; i++) {
        check_matmul(k, WEIGHT_F32, 37, 1027, 0, ns[i]);
        check_matmul(k, WEIGHT_BF16, 64, 1024, 0, ns[i]);
        check_matmul(k, WEIGHT_F32, 130, 200, 0, ns[i]);
    }
    check_matmul(k, WEIGHT_F32, 34, 4001, 0, 70);
    check_matmul(k, WEIGHT_BF16, 33, 3001, 0, 115);
    check_matmul(k, WEIGHT_BF16, 37, 1027, 0, 113);
    kernels_set_float_panels(ops_kernels(k), panels);
}

/* measure_prefetch (fast/matmul.c) on 8 MB of random bytes read as q8, q4, bf16 and f32 weights: an
 * x86 build keeps a distance for the format and names it ("q8 6144 B, measured"), and decode gives
 * the same bits before and after (the distance moves no arithmetic); f32 weights, which decode
 * does not prefetch, other builds, and KERNELS_PREFETCH leave the plan as it was. The timing runs
 * on one thread; the ops keep the threads they were made with. */
static void test_measure_prefetch(void) {
    const struct { WeightType t; int gs; const char* name; } formats[] = {
        {WEIGHT_Q8, 64, "q8 "}, {WEIGHT_Q4, 32, "q4 "}, {WEIGHT_BF16, 0, "bf16 "}, {WEIGHT_F32, 0, NULL}};
    const size_t bytes = (size_t)8 << 20;
    uint8_t* weights = malloc(bytes);
    float* x = malloc(1024 * sizeof(float));
    float *before = malloc(256 * sizeof(float)), *after = malloc(256 * sizeof(float));
    for (size_t i = 0; i < bytes; i++) weights[i] = (uint8_t)(int)(frand() * 128.0f); /* every byte value */
    for (int c = 0; c < 1024; c++) x[c] = frand();
    unsetenv("KERNELS_PREFETCH"); /* a choice in the caller's environment would fix the plan */
    for (int fixed = 0; fixed < 2; fixed++)
        for (size_t f = 0; f < sizeof formats / sizeof *formats; f++) {
            if (fixed) setenv("KERNELS_PREFETCH", "mid", 1);
            Ops* o = fast_ops(2, 4, 1024);
            unsetenv("KERNELS_PREFETCH");
            const OpsSpec spec = {.weights = weights, .weights_bytes = bytes, .weight_type = formats[f].t,
                                  .weight_cols = 1024, .group_size = formats[f].gs};
            const Matrix W = {formats[f].t, 256, 1024, formats[f].gs, weights};
            const char* old = kernels_prefetch_plan(ops_kernels(o));
            matmul_one(o, before, x, &W, 1);
            const char* name = measure_prefetch(o, &spec);
            matmul_one(o, after, x, &W, 1);
#if defined(KERNELS_AVX2)
            const int timed = formats[f].name && !fixed;
#else
            const int timed = 0;
#endif
            int ok = memcmp(before, after, 256 * sizeof(float)) == 0 && o->threads(o) == 2;
            if (timed)
                ok &= name && strncmp(name, formats[f].name, strlen(formats[f].name)) == 0 &&
                      strstr(name, " B, measured") && strcmp(kernels_prefetch_plan(ops_kernels(o)), name) == 0;
            else
                ok &= !name && strcmp(kernels_prefetch_plan(ops_kernels(o)), old) == 0;
            char what[160];
            snprintf(what, sizeof what, "measure_prefetch %s%s: %s (%s), decode's bits unchanged, two threads kept", tname(formats[f].t),
                     fixed ? " with KERNELS_PREFETCH=mid" : "", timed ? "a distance kept" : "the plan left", name ? name : old);
            check(ok, what);
            ops_free(o);
        }
    free(weights), free(x), free(before), free(after);
}

/* One plan as the bench prints it (kernels_describe_product): its text and whether it runs on AMX. */
static void expect_plan(Ops* o, WeightType type, int rows, int cols, int gs, int n, const char* want, int want_amx) {
    static const uint8_t none[1]; /* the plan reads the shape, never the weights */
    const Matrix W = {type, rows, cols, gs, none};
    char got[200], what[400];
    const int amx = kernels_describe_product(ops_kernels(o), &W, n, got, sizeof got);
    snprintf(what, sizeof what, "plan of %s %dx%d gs=%d n=%d: \"%s\"%s (got \"%s\"%s)", tname(type), rows, cols, gs, n,
             want, want_amx ? " on AMX" : "", got, amx ? " on AMX" : "");
    check(strcmp(got, want) == 0 && amx == want_amx, what);
}

/* The plan's own account of itself (kernels_describe_product, which the bench prints) at the token
 * counts where its paths begin (matmul.c: plan_paths): decode's kernel and the prefetch distance
 * it reads (KERNELS_PREFETCH=mid: q8 1536, q4 2048, bf16 1024, on zmm 2048: a distance read from
 * another format's field shows), the panels from their thresholds and only for matrices of a whole
 * panel, the bf16 dot product's blocks from 16 tokens, and where the CPU grants AMX its tiles
 * (q8 from 13 tokens, q4 from 32, no panels after them, bf16 split from 9). */
#if defined(KERNELS_AVX2) && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
#define TEST_Q4_PANELS 1 /* matmul_shared.h's Q8_VNNI: q4 takes the panels too */
#else
#define TEST_Q4_PANELS 0
#endif
#if defined(KERNELS_AVX512)
#define TEST_AVX512 1 /* the panels' thresholds and bf16 decode on zmm */
#else
#define TEST_AVX512 0
#endif
static void test_describe_product(void) {
    setenv("KERNELS_PREFETCH", "mid", 1);
    Ops* o = fast_ops(2, 128, 1040);
    unsetenv("KERNELS_PREFETCH");
    const int amx = kernels_amx(ops_kernels(o));
    kernels_set_amx(ops_kernels(o), 0);
    kernels_set_float_panels(ops_kernels(o), 1);
#if defined(KERNELS_AVX2)
    const char* bf16_decode = TEST_AVX512 ? "rows_bf16_n1_zmm (a de-interleaved row, prefetch 2048 B)"
                                          : "rows_bf16_n1 (a de-interleaved row, prefetch 1024 B)";
    expect_plan(o, WEIGHT_Q8, 64, 1024, 64, 1, "rows_qi_n1 (int8 activations, prefetch 1536 B)", 0);
    expect_plan(o, WEIGHT_Q4, 64, 1024, 32, 1, "rows_q4_n1 (int8 activations, prefetch 2048 B)", 0);
    expect_plan(o, WEIGHT_BF16, 64, 1040, 0, 1, "rows_bf16_n1 (a de-interleaved row, prefetch 1024 B)", 0);
    expect_plan(o, WEIGHT_BF16, 64, 1024, 0, 1, bf16_decode, 0);
    expect_plan(o, WEIGHT_F32, 64, 1024, 0, 1, "rows_f32_n1 (fp32 activations)", 0);
    expect_plan(o, WEIGHT_Q8, 64, 1024, 64, 23, "rows_qi (int8 activations)", 0);
    expect_plan(o, WEIGHT_Q8, 64, 1024, 64, 24, "rows_qi (q8 panels, int8 activations)", 0);
    expect_plan(o, WEIGHT_Q8, 4, 1024, 64, 24, "rows_qi (int8 activations)", 0); /* less than a panel */
    expect_plan(o, WEIGHT_Q4, 64, 1024, 32, 24, TEST_Q4_PANELS ? "rows_qi (q4 panels, int8 activations)"
                                                               : "rows_qi (int8 activations)", 0);
    const int f32_min = TEST_AVX512 ? 24 : 64, bf16_min = TEST_AVX512 ? 40 : 112;
    expect_plan(o, WEIGHT_F32, 64, 1024, 0, f32_min - 1, "rows_f32_nn (fp32 activations)", 0);
    expect_plan(o, WEIGHT_F32, 64, 1024, 0, f32_min, "rows_f32_nn (packed panels, fp32 activations)", 0);
    expect_plan(o, WEIGHT_F32, 8, 1024, 0, f32_min, "rows_f32_nn (fp32 activations)", 0); /* less than a panel */
    expect_plan(o, WEIGHT_BF16, 64, 1024, 0, bf16_min - 1, "rows_bf16_nn (fp32 activations)", 0);
    expect_plan(o, WEIGHT_BF16, 64, 1024, 0, bf16_min, "rows_bf16_nn (packed panels, fp32 activations)", 0);
    kernels_set_float_panels(ops_kernels(o), 0);
    expect_plan(o, WEIGHT_F32, 64, 1024, 0, f32_min, "rows_f32_nn (fp32 activations)", 0);
#if defined(KERNELS_BF16_DOT)
    kernels_set_bf16_activations(ops_kernels(o), 1);
    expect_plan(o, WEIGHT_BF16, 64, 1024, 0, 15, "rows_bf16_dot (bf16 activations)", 0);
    expect_plan(o, WEIGHT_BF16, 64, 1024, 0, 16, "rows_bf16_dot (bf16 activations in blocks of 16 tokens)", 0);
    expect_plan(o, WEIGHT_BF16, 64, 1040, 0, 16, "rows_bf16_dot (bf16 activations)", 0); /* not whole steps of 32 */
    expect_plan(o, WEIGHT_BF16, 64, 1024, 0, 1, bf16_decode, 0);
    kernels_set_bf16_activations(ops_kernels(o), 0);
#endif
    if (amx && kernels_set_amx(ops_kernels(o), 1)) {
        expect_plan(o, WEIGHT_Q8, 64, 1024, 64, 12, "rows_qi (int8 activations)", 0);
        expect_plan(o, WEIGHT_Q8, 64, 1024, 64, 13, "rows_qi (AMX tiles, int8 activations)", 1);
        expect_plan(o, WEIGHT_Q8, 64, 1024, 64, 24, "rows_qi (AMX tiles, int8 activations)", 1);
        expect_plan(o, WEIGHT_Q8, 64, 1024, 32, 24, "rows_qi (q8 panels, int8 activations)", 0); /* groups of 32 */
        expect_plan(o, WEIGHT_Q8, 8, 1024, 64, 13, "rows_qi (int8 activations)", 0);             /* less than a tile */
        expect_plan(o, WEIGHT_Q4, 64, 1024, 32, 31, "rows_qi (q4 panels, int8 activations)", 0);
        expect_plan(o, WEIGHT_Q4, 64, 1024, 32, 32, "rows_qi (AMX tiles, int8 activations)", 1);
#if defined(KERNELS_AMX_BF16)
        expect_plan(o, WEIGHT_BF16, 64, 1024, 0, 8, "rows_bf16_nn (fp32 activations)", 0);
        expect_plan(o, WEIGHT_BF16, 64, 1024, 0, 9, "rows_bf16_split (AMX-BF16 tiles, activations as three bf16 parts)", 1);
        expect_plan(o, WEIGHT_BF16, 8, 1024, 0, 9, "rows_bf16_nn (fp32 activations)", 0); /* less than a tile */
        kernels_set_bf16_activations(ops_kernels(o), 1);
        expect_plan(o, WEIGHT_BF16, 64, 1024, 0, 16, "rows_bf16_dot (AMX-BF16 panels, bf16 activations)", 1);
        kernels_set_bf16_activations(ops_kernels(o), 0);
#endif
    } else {
#if defined(KERNELS_AMX)
        printf("plans on AMX: skipped, the CPU, Linux or KERNELS_AMX=0 does not grant it\n");
#else
        printf("plans on AMX: skipped, no AMX in this build\n");
#endif
    }
#elif defined(KERNELS_NEON) /* no panels, AMX or prefetch: the x86 code's */
    expect_plan(o, WEIGHT_Q8, 64, 1024, 64, 1, "rows_qi_n1 (int8 activations)", 0);
    expect_plan(o, WEIGHT_Q4, 64, 1024, 32, 1, "rows_q4_n1 (int8 activations)", 0);
    expect_plan(o, WEIGHT_BF16, 64, 1024, 0, 1, "rows_bf16_n1_plain (fp32 activations)", 0);
    expect_plan(o, WEIGHT_Q8, 64, 1024, 64, 64, "rows_qi (int8 activations)", 0);
    expect_plan(o, WEIGHT_F32, 64, 1024, 0, 64, "rows_f32_nn (fp32 activations)", 0);
    expect_plan(o, WEIGHT_BF16, 64, 1024, 0, 112, "rows_bf16_nn (fp32 activations)", 0);
#else /* a fast build without SIMD kernels: the scalar reference for every product */
    expect_plan(o, WEIGHT_Q8, 64, 1024, 64, 1, "rows_scalar (fp32 activations)", 0);
    expect_plan(o, WEIGHT_F32, 64, 1024, 0, 64, "rows_scalar (fp32 activations)", 0);
#endif
    (void)amx;
    ops_free(o);
}

int main(void) {
    test_set_threads();
    test_measure_prefetch();
    test_describe_product();
    test_two_contexts();
    int threads[2] = {1, 2};
    for (int ti = 0; ti < 2; ti++) {
        Ops* kern = fast_ops(threads[ti], 40, 4096);
        if (!kern) {
            printf("kernels_new failed\n");
            return 1;
        }
        printf("kernels: %s, threads: %d\n", kernels_simd_name(ops_kernels(kern)), kernels_threads(ops_kernels(kern)));
        if (ti == 0) test_amx_in_use(kern);
        if (ti == 0) print_kernel_paths(kern);
        struct { WeightType t; int rows, cols, gs; } cases[] = {
            {WEIGHT_F32, 37, 1027, 0}, {WEIGHT_F32, 64, 1024, 0}, {WEIGHT_F32, 5, 3, 0},
            {WEIGHT_F32, 130, 200, 0}, {WEIGHT_BF16, 37, 1027, 0}, {WEIGHT_BF16, 64, 1024, 0},
            {WEIGHT_F32, 34, 4001, 0}, {WEIGHT_BF16, 33, 3001, 0}, /* wide rows: several token blocks */
            {WEIGHT_BF16, 9, 13, 0}, {WEIGHT_BF16, 11, 80, 0}, {WEIGHT_BF16, 7, 48, 0}, /* 64-col steps + 16-col tail */
            {WEIGHT_BF16, 11, 96, 0}, {WEIGHT_BF16, 5, 160, 0}, /* AVX-512 decode: 32-col steps, 128 + 32 */
            {WEIGHT_Q8, 37, 192, 64}, {WEIGHT_Q8, 67, 1024, 64},
            {WEIGHT_Q8, 33, 96, 32}, {WEIGHT_Q8, 21, 48, 16}, {WEIGHT_Q8, 19, 40, 8},
            {WEIGHT_Q8, 130, 3072, 64}, {WEIGHT_Q8, 37, 384, 128}, {WEIGHT_Q8, 11, 36, 12},
            {WEIGHT_Q8, 13, 192, 96}, /* 96: one 64-column step and one 32-column step per group */
            {WEIGHT_Q4, 37, 192, 32}, {WEIGHT_Q4, 67, 1024, 32}, {WEIGHT_Q4, 33, 96, 32},
            {WEIGHT_Q4, 130, 3072, 32}, {WEIGHT_Q4, 13, 32, 32}, {WEIGHT_Q4, 6, 160, 32}, /* odd G */
        };
        /* 13 and 17: q8 on AMX with a tile of fewer than 16 tokens; 29: the q8 and q4 panels' tiles
         * of 8, 4 and 1 tokens */
        int ns[] = {1, 2, 3, 5, 13, 17, 29, 40};
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
            for (size_t k = 0; k < sizeof ns / sizeof *ns; k++)
                check_matmul(kern, cases[c].t, cases[c].rows, cases[c].cols, cases[c].gs, ns[k]);
        /* more tokens than the scratch holds (n * cols > max_batch * max_cols): still correct */
        check_matmul(kern, WEIGHT_Q8, 10, 4096, 64, 41);
        check_matmul(kern, WEIGHT_Q4, 10, 4096, 32, 41);
        /* the AVX2 panels take f32 from 64 tokens and bf16 from 112: token blocks of 12 (4001
         * columns: 70 = 5 x 12 + 10, tiles of 6, 4 and 1), 16 (3001: 115 = 7 x 16 + 3), 42 (1027:
         * 67 = 42 + 25, 113 = 2 x 42 + 29) */
        check_matmul(kern, WEIGHT_F32, 34, 4001, 0, 70);
        check_matmul(kern, WEIGHT_BF16, 33, 3001, 0, 115);
        check_matmul(kern, WEIGHT_F32, 37, 1027, 0, 67);
        check_matmul(kern, WEIGHT_BF16, 37, 1027, 0, 113);
        test_float_panels_switched(kern);
        test_parallel_for(kern);
        test_bf16_activations();
        test_exact_parts(WEIGHT_BF16, 0);
        test_exact_parts(WEIGHT_F32, 0);
        test_exact_parts(WEIGHT_F32, 1);
        ops_free(kern);
    }
    /* q8 prefill panels (AVX2 without VNNI) over several token blocks: at 8192 columns a block is
     * 24 tokens, so 50 tokens are 24 + 24 + 2 (tiles of 4, then single tokens) */
    Ops* kern = fast_ops(2, 50, 8192);
    if (kern) {
        check_matmul(kern, WEIGHT_Q8, 24, 8192, 64, 50);
        check_tokens_alone(kern, WEIGHT_Q8, 24, 8192, 64, 50);
        ops_free(kern);
    }
    /* q8 and q4 prefill: AMX's tiles and the kernels without it (the panels, tile_q4) scale each
     * group's exact int32 sum the same way: the same bits with AMX on and off wherever both take
     * every token (from 24 tokens the panels do; 40 and 45 end in a tile of 8 and 13 tokens on
     * AMX; 301 rows: whole tiles, then the rest) */
    if ((kern = fast_ops(2, 48, 512)) != NULL) {
        static float x[48 * 512], o1[48 * 301], o2[48 * 301];
        const int ns_amx[3] = {40, 45, 48};
        for (int k = 0; k < 2; k++) {
            const WeightType type = k == 0 ? WEIGHT_Q8 : WEIGHT_Q4;
            if (!kernels_set_amx(ops_kernels(kern), 1)) {
                printf("%s AMX == without AMX: skipped, no AMX here\n", tname(type));
                continue;
            }
            TestMatrix t = make_matrix(type, 301, 512, type == WEIGHT_Q4 ? 32 : 64);
            for (int ni = 0; ni < 3; ni++) {
                const int n = ns_amx[ni];
                for (int i = 0; i < n * 512; i++) x[i] = frand();
                kernels_set_amx(ops_kernels(kern), 1);
                matmul_one(kern, o1, x, &t.M, n);
                kernels_set_amx(ops_kernels(kern), 0);
                matmul_one(kern, o2, x, &t.M, n);
                char what[80];
                snprintf(what, sizeof what, "matmul %s n=%d: AMX == without AMX, bitwise", tname(type), n);
                check(memcmp(o1, o2, (size_t)n * 301 * sizeof(float)) == 0, what);
            }
            free_matrix(&t);
        }
        ops_free(kern);
    }
    /* 1 and 2 threads give bit-identical matmuls (the split does not change any row's arithmetic);
     * 40 tokens take the AMX tiles (q8, q4) and the packed panels (f32, bf16) where the build has
     * them, whose row tiles must not depend on where the chunks start */
    {
        /* the fifth: bf16 with --bf16-activations (its blocked activations, or AMX's panels), where
         * the build has them; the third and fourth with the f32/bf16 panels on, the last two with
         * them off, whatever this CPU's default */
        const WeightType types[7] = {WEIGHT_Q8, WEIGHT_Q4, WEIGHT_F32, WEIGHT_BF16, WEIGHT_BF16, WEIGHT_F32, WEIGHT_BF16};
        static float x[115 * 512], o1[115 * 301], o2[115 * 301];
        const int ns3[4] = {3, 40, 70, 115}; /* the AVX2 panels take f32 from 64 tokens, bf16 from 112 */
        for (int k = 0; k < 7; k++)
            for (int ni = 0; ni < 4; ni++) {
                const int n = ns3[ni];
                TestMatrix t = make_matrix(types[k], 301, 512, types[k] == WEIGHT_Q4 ? 32 : 64);
                for (int i = 0; i < n * 512; i++) x[i] = frand();
                Ops* k1 = fast_ops(1, 115, 512);
                kernels_set_float_panels(ops_kernels(k1), k < 5);
                if (k == 4 && !kernels_set_bf16_activations(ops_kernels(k1), 1)) {
                    ops_free(k1);
                    free_matrix(&t);
                    continue;
                }
                matmul_one(k1, o1, x, &t.M, n);
                ops_free(k1);
                Ops* k2 = fast_ops(2, 115, 512);
                kernels_set_float_panels(ops_kernels(k2), k < 5);
                kernels_set_bf16_activations(ops_kernels(k2), k == 4);
                matmul_one(k2, o2, x, &t.M, n);
                ops_free(k2);
                char what[80];
                snprintf(what, sizeof what, "matmul %s%s n=%d: 1 thread == 2 threads bitwise", tname(t.M.type),
                         k == 4 ? " (bf16 activations)" : k >= 5 ? " (no panels)" : "", n);
                check(memcmp(o1, o2, (size_t)n * 301 * sizeof(float)) == 0, what);
                free_matrix(&t);
            }
    }
    test_half_to_float();
    test_float_to_half();
    test_matrix_row();
    test_rmsnorm();
    test_rope();
    kern = fast_ops(2, 8, 512);
    test_wide_exp();
    test_softmax_swiglu();
    test_attention(kern);
    ops_free(kern);
    test_attention_rows();
    test_kv_quantize_row();
    return checks_done();
}
