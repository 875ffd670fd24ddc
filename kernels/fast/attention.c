/* fast/attention.c: the fast build's attention (kernels.h: attention_group for decode, attention_rows
 * for prefill, softmax), written over simd_math.h's vectors for every instruction set, and
 * attention_task, which runs them as the thread pool's work (fast.h). Each is checked against the
 * scalar reference in ../attention.c (tests/test_kernels.c); head_dims and caches the vectors do not
 * take run that reference. */
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "kernels/simd_math.h"
#include "kernels/fast/fast.h"

#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
/* The decode kernels are written over simd_math.h's fixed-width vector, fvec: 8 lanes (ymm) or
 * NEON's 4; with AVX-512 VNNI the fp16 and q8 caches take the zmm kernels of the section below.
 *
 * The cache arrays hold fp32, halves or q8 rows (KVRows.type); the SIMD kernels take that as T, a
 * constant in each inlined copy, so the fp32 copies test no element type in loops. kv_at: element
 * i's address; kv_row_bytes: a row's bytes, scales included. */
ALWAYS_INLINE const void* kv_at(const void* base, size_t i, KVType T) {
    return (const char*)base + i * kv_elem_size(T);
}
ALWAYS_INLINE int kv_row_bytes(int d, KVType T) { return (int)(kv_row_elems(T, d) * kv_elem_size(T)); }

/* FV_LANES values of a cache row (d values) from value i on, as fp32 (a q8 group never straddles a
 * load: FV_LANES and WV_LANES divide KV_Q8_GROUP). Without KERNELS_KV_F16 the KV_F16 copies are
 * never called (attention_simd sends an fp16 cache to the scalar reference then). */
ALWAYS_INLINE fvec kv_load(const void* row, size_t i, int d, KVType T) {
    if (T == KV_Q8)
        return fv_mul(fv_load_i8((const int8_t*)row + i), fv_set1_half(kv_q8_scale(row, d, (int)i)));
#if defined(KERNELS_KV_F16)
    if (T == KV_F16) return fv_load_half((const uint16_t*)row + i);
#endif
    return fv_load((const float*)row + i);
}

/* The same for WV_LANES values: prefill's widest vector. */
ALWAYS_INLINE wvec kv_load_wide(const void* row, size_t i, int d, KVType T) {
    if (T == KV_Q8)
        return wv_mul(wv_load_i8((const int8_t*)row + i), wv_set1_half(kv_q8_scale(row, d, (int)i)));
#if defined(KERNELS_KV_F16)
    if (T == KV_F16) return wv_load_half((const uint16_t*)row + i);
#endif
    return wv_load((const float*)row + i);
}

/* The largest of m and x[0 .. n). */
ALWAYS_INLINE float row_max(const float* x, int n, float m) {
    int i = 0;
    fvec vm = fv_set1(m);
    for (; i + FV_LANES <= n; i += FV_LANES) vm = fv_max(vm, fv_load(x + i));
    m = fv_hmax(vm);
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

/* x[i] = exp(x[i] - m), m = max(*max, every x[i]) stored back in *max; returns the sum of the
 * exponentials: softmax's first two steps, and decode attention's per chunk (attend_queries). */
ALWAYS_INLINE float exp_shifted(float* x, int n, float* max) {
    const float m = row_max(x, n, *max);
    fvec vm = fv_set1(m);
    fvec vs = fv_set1(0.0f);
    int i = 0;
    /* The exponentials WV_LANES at a time (zmm halves the polynomial's instructions), summed
     * FV_LANES at a time as below, so that the sum's order and bits do not depend on the vector. */
    for (const wvec wm = wv_set1(m); WV_LANES > FV_LANES && i + WV_LANES <= n; i += WV_LANES) {
        wv_store(x + i, wv_exp(wv_sub(wv_load(x + i), wm)));
        for (int h = 0; h < WV_LANES; h += FV_LANES) vs = fv_add(vs, fv_load(x + i + h));
    }
    for (; i + FV_LANES <= n; i += FV_LANES) {
        const fvec e = fv_exp(fv_sub(fv_load(x + i), vm));
        fv_store(x + i, e);
        vs = fv_add(vs, e);
    }
    float sum = fv_hsum(vs);
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    *max = m;
    return sum;
}

/* x[0 .. n) *= s (softmax's last step; gcc 12 -O2 leaves the plain loop scalar). */
ALWAYS_INLINE void scale_row(float* x, int n, float s) {
    int i = 0;
    const fvec vs = fv_set1(s);
    for (; i + FV_LANES <= n; i += FV_LANES) fv_store(x + i, fv_mul(fv_load(x + i), vs));
    for (; i < n; i++) x[i] *= s;
}

/* Decode takes the group's queries two at a time inside one pass over the cache (over q8 at
 * head_dim 128 up to eight): every key and value vector is loaded once for them (2 query heads per
 * kv head in Qwen3-0.6B, 8 in 30B-A3B); what makes decode attention fast is the value prefetch in
 * scores (docs/design.md#attention-decode). Per query, the sums run in the same order as for a
 * query alone, so the result does not depend on how queries are grouped. */
#define DIM_STEP 16 /* head_dim a multiple of this takes the SIMD path */

/* a[j][u] += q_j * k over the FV_LANES dimensions from i + FV_LANES u on, for u < NU (4, or 2 for a
 * head_dim's last 2 FV_LANES). */
ALWAYS_INLINE void scores_step(fvec a[2][4], const float* q, int NQ, const void* k, int d, int i, int NU, KVType T) {
#pragma GCC unroll 4
    for (int u = 0; u < NU; u++) {
        const fvec kv = kv_load(k, i + FV_LANES * u, d, T);
#pragma GCC unroll 2
        for (int j = 0; j < NQ; j++) a[j][u] = fv_fma(fv_load(q + (size_t)j * d + i + FV_LANES * u), kv, a[j][u]);
    }
}

/* att[j][t] = (q_j . k_t) * scale for NQ (1 or 2) queries: four accumulators per query over each
 * 4 FV_LANES dimensions, the first two over a last 2 FV_LANES (head_dim 48 on AVX2: 32 + 16). With
 * prefetch_values set, value row t is prefetched into L2 while key row t is read, so the values
 * stream in beside the keys and the weighted sum finds them in cache; into L1 they would evict the
 * keys that the weighted sum brings into L2 for the next chunk (docs/design.md#attention-decode). */
ALWAYS_INLINE void scores(float* att, int att_stride, const float* q, int NQ, const void* keys,
                          const void* prefetch_values, int stride, int n, int d, float scale, KVType T) {
    for (int t = 0; t < n; t++) {
        const void* k = kv_at(keys, (size_t)t * stride, T);
        const char* v = prefetch_values ? kv_at(prefetch_values, (size_t)t * stride, T) : NULL;
        for (int i = 0; v && i < kv_row_bytes(d, T); i += 64) __builtin_prefetch(v + i, 0, 2); /* into L2 */
        fvec a[2][4];
#pragma GCC unroll 2
        for (int j = 0; j < NQ; j++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) a[j][u] = fv_set1(0.0f);
        int i = 0;
        for (; i + 4 * FV_LANES <= d; i += 4 * FV_LANES) scores_step(a, q, NQ, k, d, i, 4, T);
        if (i < d) scores_step(a, q, NQ, k, d, i, 2, T);
#pragma GCC unroll 2
        for (int j = 0; j < NQ; j++)
            att[(size_t)j * att_stride + t] =
                fv_hsum(fv_add(fv_add(a[j][0], a[j][1]), fv_add(a[j][2], a[j][3]))) * scale;
    }
}

/* Decode attention reads the positions in chunks of this many, each chunk's values while they are
 * still in cache from its scores (attend_queries). */
#ifndef ATTENTION_DECODE_CHUNK
#define ATTENTION_DECODE_CHUNK 128
#endif

/* ---- Decode over a q8 cache: int8 dot products ----
 * Widening a q8 key to fp32 costs three instructions per 8 values before its FMA, so decode over a
 * q8 cache is bound by that arithmetic, not by its bytes. With AVX-512 VNNI, or AVX2 alone, each
 * query is quantised as a cached row is (kv_quantize_row: int8 in groups of KV_Q8_GROUP, a half
 * scale each), and a score is the sum over the groups of (query scale x key scale) x the group's
 * int8 dot product, exact in int32: vpdpbusd takes 64 products per instruction (AVX2's vpmaddubsw
 * 32, below). vpdpbusd multiplies unsigned by signed bytes, so one side is taken plus 128 and each
 * sum starts at -128 x the other side's sum over the same bytes. With AVX-512, head_dim 128, every
 * Qwen3's, has its own kernels (q8_scores_128, four key rows at a time, and q8_weighted_sum_128,
 * the value scales folded into the weights), each taking up to eight queries a call: a GQA group
 * of 8 queries (30B-A3B, 32B) spends most of decode at depth in this arithmetic. The weights and
 * values stay fp32, as over an fp16 cache, but for a run of eight queries, whose weighted sum
 * multiplies int16 weights by the int8 values (q8_pairs_sum_128; docs/design.md#kv-cache-q8). */
#if defined(KERNELS_Q8_DOT) && defined(KERNELS_AVX512)
#define ATTENTION_Q8_DOT KERNELS_Q8_DOT_MAX_DIM /* the longest head_dim it takes */
/* One query's int8 form. */
typedef struct {
    wbytes u[KERNELS_Q8_DOT_MAX_DIM / 64]; /* its int8 values + 128, 64 per step (q8_row) */
    wvec s[KERNELS_Q8_DOT_MAX_DIM / 64];   /* its group scales, each in its group's 4 lanes */
    uint64_t mask[KERNELS_Q8_DOT_MAX_DIM / 64]; /* the step's bytes of a row */
    int groups[KERNELS_Q8_DOT_MAX_DIM / 64];    /* the step's groups (4, fewer in a last step) */
    int steps;
    /* head_dim 128 (q8_scores_128): per step, dword c of each group in all four lanes of the group's
     * 128-bit block, and -128 x the group's sum in each lane */
    wbytes dw[2][4];
    wbytes below[2];
} Q8Query;

/* n_q queries of d values as q8_scores takes them, query j in qq[j]. */
ALWAYS_INLINE void q8_query(Q8Query* qq, const float* q, int n_q, int d) {
    int8_t row[KERNELS_Q8_DOT_MAX_DIM + KERNELS_Q8_DOT_MAX_DIM / KV_Q8_GROUP * 2];
    for (int j = 0; j < n_q; j++) {
        Q8Query* x = &qq[j];
        x->steps = (d + 63) / 64;
        kv_quantize_row(row, q + (size_t)j * d, d);
        for (int s = 0; s < x->steps; s++) {
            const int n = d - 64 * s < 64 ? d - 64 * s : 64;
            x->mask[s] = n == 64 ? ~0ull : (1ull << n) - 1;
            x->groups[s] = n / KV_Q8_GROUP;
            const wbytes b = wb_load(row + 64 * s, x->mask[s]);
            x->s[s] = wv_set4x4_half((const uint16_t*)(row + kv_q8_scale_at(d, 64 * s)), x->groups[s]);
            if (d != 128) { /* q8_row's form */
                x->u[s] = wb_xor(b, wb_set1(0x80));
                continue;
            }
            for (int c = 0; c < 4; c++) x->dw[s][c] = wb_block_lane(b, c); /* q8_scores_128's */
            x->below[s] = wb_neg(wb_block_sums(wb_dot(wb_set1(0), wb_set1(0x80), b)));
        }
    }
}

/* One q8 key row's products with the queries in qq, one vector of partial sums per query. */
ALWAYS_INLINE void q8_row(wvec a[2], const Q8Query* qq, int NQ, const int8_t* k, int d) {
    const wbytes c128 = wb_set1(0x80);
    /* d a multiple of 64: whole steps, no masks read */
    const int whole = d % 64 == 0;
    a[0] = a[1] = wv_set1(0.0f);
    for (int s = 0; s < qq->steps; s++) {
        const wbytes kb = wb_load(k + 64 * s, whole ? ~0ull : qq->mask[s]);
        const wbytes below = wb_neg(wb_dot(wb_set1(0), c128, kb)); /* -128 x each lane's keys */
        const wvec ks = wv_set4x4_half((const uint16_t*)(k + kv_q8_scale_at(d, 64 * s)), whole ? 4 : qq->groups[s]);
#pragma GCC unroll 2
        for (int j = 0; j < NQ; j++)
            a[j] = wv_fma(wv_from_i32(wb_dot(below, qq[j].u[s], kb)), wv_mul(ks, qq[j].s[s]), a[j]);
    }
}

#elif defined(KERNELS_Q8_DOT)
#define ATTENTION_Q8_DOT KERNELS_Q8_DOT_MAX_DIM
/* With AVX2 alone: the same arithmetic 32 bytes at a time, through vpmaddubsw (fv_dot_i8), which
 * takes the query's magnitudes as its unsigned side and the keys with the query's signs, so no
 * offset is needed; per 32-byte step, two groups of a row in the lanes 0-3 and 4-7. */
typedef struct {
    qbytes q[KERNELS_Q8_DOT_MAX_DIM / 32], abs[KERNELS_Q8_DOT_MAX_DIM / 32]; /* its int8 values, |values| */
    fvec s[KERNELS_Q8_DOT_MAX_DIM / 32]; /* the step's two group scales, each in its group's 4 lanes */
    int steps, last;                     /* 32-byte steps; the last one's bytes (32, or 16) */
} Q8Query;

ALWAYS_INLINE void q8_query(Q8Query* qq, const float* q, int n_q, int d) {
    int8_t row[KERNELS_Q8_DOT_MAX_DIM + KERNELS_Q8_DOT_MAX_DIM / KV_Q8_GROUP * 2];
    for (int j = 0; j < n_q; j++) {
        Q8Query* x = &qq[j];
        x->steps = (d + 31) / 32;
        x->last = d % 32 ? 16 : 32;
        kv_quantize_row(row, q + (size_t)j * d, d);
        for (int s = 0; s < x->steps; s++) {
            const int n = s == x->steps - 1 ? x->last : 32;
            x->q[s] = qb_load(row + 32 * s, n);
            x->abs[s] = qb_abs(x->q[s]);
            x->s[s] = fv_set2x4_half((const uint16_t*)(row + kv_q8_scale_at(d, 32 * s)), n / KV_Q8_GROUP);
        }
    }
}

ALWAYS_INLINE void q8_row(wvec a[2], const Q8Query* qq, int NQ, const int8_t* k, int d) {
    a[0] = a[1] = wv_set1(0.0f);
    for (int s = 0; s < qq->steps; s++) {
        const int n = s == qq->steps - 1 ? qq->last : 32;
        const qbytes kb = qb_load(k + 32 * s, n);
        const fvec ks = fv_set2x4_half((const uint16_t*)(k + kv_q8_scale_at(d, 32 * s)), n / KV_Q8_GROUP);
#pragma GCC unroll 2
        for (int j = 0; j < NQ; j++) a[j] = fv_fma(fv_dot_i8(qq[j].abs[s], qq[j].q[s], kb), fv_mul(ks, qq[j].s[s]), a[j]);
    }
}
#else
/* Without an int8 query (NEON, or AVX2 without F16C) every call of these sits behind
 * ATTENTION_Q8_DOT = 0 (no head_dim) and folds away. */
#define ATTENTION_Q8_DOT 0
typedef struct {
    int steps;
} Q8Query;
ALWAYS_INLINE void q8_query(Q8Query* qq, const float* q, int NQ, int d) {}
ALWAYS_INLINE void q8_scores(float* att, int att_stride, const Q8Query* qq, int NQ, const int8_t* keys,
                             const int8_t* prefetch_values, int stride, int n, int d, float scale) {}
#endif

#if defined(KERNELS_Q8_DOT)
/* scores() over a q8 cache for the queries in qq, four rows at a time: their sums in one tree
 * (wv_hsum4_store), which gives every row's score the same bits in a group of four or fewer. */
ALWAYS_INLINE void q8_scores(float* att, int att_stride, const Q8Query* qq, int NQ, const int8_t* keys,
                             const int8_t* prefetch_values, int stride, int n, int d, float scale) {
    for (int t = 0; t < n; t += 4) {
        const int m = n - t < 4 ? n - t : 4;
        wvec a[4][2];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= m) {
                a[r][0] = a[r][1] = wv_set1(0.0f);
                continue;
            }
            for (int i = 0; prefetch_values && i < kv_row_bytes(d, KV_Q8); i += 64)
                __builtin_prefetch(prefetch_values + (size_t)(t + r) * stride + i, 0, 2); /* into L2 */
            q8_row(a[r], qq, NQ, keys + (size_t)(t + r) * stride, d);
        }
#pragma GCC unroll 2
        for (int j = 0; j < NQ; j++)
            wv_hsum4_store(att + (size_t)j * att_stride + t, m, a[0][j], a[1][j], a[2][j], a[3][j], scale);
    }
}

#endif

#if defined(KERNELS_Q8_DOT) && defined(KERNELS_AVX512)
#define ATTENTION_WIDE 1 /* decode over an fp16 cache on zmm too (wide_scores) */
#define ATTENTION_Q8_128 1 /* head_dim 128 over q8: q8_scores_128, q8_weighted_sum_128, q8_pairs_sum_128 */
#define Q8_RUN 8 /* queries per call of the head_dim 128 kernels above */

/* weighted_sum_pass on the widest vector: WV_LANES NU outputs per query from dimension i on (NU up
 * to 8: 128 with zmm), widened WV_LANES at a time (kv_load_wide: over q8 one group, one scale); the
 * next chunk's first n_next key rows are prefetched into L2 on the way, whole in the first pass. */
ALWAYS_INLINE void wide_weighted_sum_pass(float* out, const float* att, int att_stride, int NQ, const void* values,
                                          const void* next_keys, int n_next, int stride, int n, int d, int i, int add,
                                          int NU, KVType T) {
    wvec o[2][8];
#pragma GCC unroll 2
    for (int j = 0; j < NQ; j++)
#pragma GCC unroll 8
        for (int u = 0; u < NU; u++) o[j][u] = add ? wv_load(out + (size_t)j * d + i + WV_LANES * u) : wv_set1(0.0f);
    for (int t = 0; t < n; t++) {
        const void* v = kv_at(values, (size_t)t * stride, T);
        for (int b = 0; i == 0 && t < n_next && b < kv_row_bytes(d, T); b += 64)
            __builtin_prefetch((const char*)kv_at(next_keys, (size_t)t * stride, T) + b, 0, 2);
        wvec vv[8];
#pragma GCC unroll 8
        for (int u = 0; u < NU; u++) vv[u] = kv_load_wide(v, i + WV_LANES * u, d, T);
#pragma GCC unroll 2
        for (int j = 0; j < NQ; j++) {
            const wvec a = wv_set1(att[(size_t)j * att_stride + t]);
#pragma GCC unroll 8
            for (int u = 0; u < NU; u++) o[j][u] = wv_fma(a, vv[u], o[j][u]);
        }
    }
#pragma GCC unroll 2
    for (int j = 0; j < NQ; j++)
#pragma GCC unroll 8
        for (int u = 0; u < NU; u++) wv_store(out + (size_t)j * d + i + WV_LANES * u, o[j][u]);
}

/* weighted_sum() on the widest vector: 8 WV_LANES dimensions per pass, then 4, 2, 1. */
ALWAYS_INLINE void wide_weighted_sum(float* out, const float* att, int att_stride, int NQ, const void* values,
                                     const void* next_keys, int n_next, int stride, int n, int d, int add, KVType T) {
    int i = 0;
    for (; i + 8 * WV_LANES <= d; i += 8 * WV_LANES)
        wide_weighted_sum_pass(out, att, att_stride, NQ, values, next_keys, n_next, stride, n, d, i, add, 8, T);
    if (d - i >= 4 * WV_LANES) {
        wide_weighted_sum_pass(out, att, att_stride, NQ, values, next_keys, n_next, stride, n, d, i, add, 4, T);
        i += 4 * WV_LANES;
    }
    if (d - i >= 2 * WV_LANES) {
        wide_weighted_sum_pass(out, att, att_stride, NQ, values, next_keys, n_next, stride, n, d, i, add, 2, T);
        i += 2 * WV_LANES;
    }
    if (d - i >= WV_LANES)
        wide_weighted_sum_pass(out, att, att_stride, NQ, values, next_keys, n_next, stride, n, d, i, add, 1, T);
}

/* q8_scores for head_dim 128, four key rows at a time: each step's 64 bytes of the four rows
 * transposed by dwords within the groups' 128-bit blocks (wb_transpose4), so that four vpdpbusd
 * leave in lane 4 g + r row r's whole dot product over group g, the keys taken plus 128 and the
 * sum started at -128 x the query's group sum; one conversion and one scaling then serve four
 * rows, where the row-at-a-time form converts and scales each row's partial sums and adds them in
 * a tree. A row's score is the sum of its lanes across the blocks (wv_block_sums4_store), added in
 * the same order for every row, so it is the same bits whichever rows share its four; a last run of
 * fewer than four repeats its last row. It takes up to Q8_RUN queries (NQ) a call, so that a GQA
 * group of 8 (30B-A3B) loads and transposes each key row once, not once per pair of queries. */
ALWAYS_INLINE void q8_scores_128(float* att, int att_stride, const Q8Query* qq, int NQ, const int8_t* keys,
                                 const int8_t* prefetch_values, int stride, int n, float scale) {
    const wbytes c128 = wb_set1(0x80);
    for (int t = 0; t < n; t += 4) {
        const int m = n - t < 4 ? n - t : 4;
        const int8_t* k[4];
        const uint16_t* h[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            k[r] = keys + (size_t)(t + (r < m ? r : m - 1)) * stride;
            h[r] = (const uint16_t*)(k[r] + 128);
            for (int i = 0; prefetch_values && r < m && i < kv_row_bytes(128, KV_Q8); i += 64)
                __builtin_prefetch(prefetch_values + (size_t)(t + r) * stride + i, 0, 2); /* into L2 */
        }
        wvec ks[2], f[Q8_RUN];
#pragma GCC unroll 8
        for (int j = 0; j < NQ; j++) f[j] = wv_set1(0.0f);
        wv_halves_4x8_t(h, ks);
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
            wbytes kb[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) kb[r] = wb_xor(wb_load(k[r] + 64 * s, ~0ull), c128);
            wb_transpose4(kb);
#pragma GCC unroll 8
            for (int j = 0; j < NQ; j++) {
                wbytes e = qq[j].below[s];
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) e = wb_dot(e, kb[c], qq[j].dw[s][c]);
                f[j] = wv_fma(wv_from_i32(e), wv_mul(ks[s], qq[j].s[s]), f[j]);
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < NQ; j++) wv_block_sums4_store(att + (size_t)j * att_stride + t, m, f[j], scale);
    }
}

/* One pass of q8_sum_128: groups g0 .. g0 + G - 1 of NQ queries' outputs, NQ x G <= 16
 * sums in registers, each group's 16 int8 values widened once for all NQ queries. */
ALWAYS_INLINE void q8_sum_pass_128(float* out, const float* w, int NQ, const int8_t* values,
                                   const int8_t* next_keys, int n_next, int stride, int n, int add, int g0, int G) {
    wvec o[16];
#pragma GCC unroll 8
    for (int j = 0; j < NQ; j++)
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) o[j * G + g] = add ? wv_load(out + (size_t)j * 128 + 16 * (g0 + g)) : wv_set1(0.0f);
    for (int t = 0; t < n; t++) {
        const int8_t* v = values + (size_t)t * stride;
        for (int b = 0; g0 == 0 && t < n_next && b < kv_row_bytes(128, KV_Q8); b += 64)
            __builtin_prefetch(next_keys + (size_t)t * stride + b, 0, 2);
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) {
            const wvec x = wv_load_i8(v + 16 * (g0 + g));
#pragma GCC unroll 8
            for (int j = 0; j < NQ; j++)
                o[j * G + g] = wv_fma(x, wv_broadcast(&w[((size_t)t * NQ + j) * 8 + g0 + g]), o[j * G + g]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NQ; j++)
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) wv_store(out + (size_t)j * 128 + 16 * (g0 + g), o[j * G + g]);
}

/* wide_weighted_sum over a q8 cache at head_dim 128 for up to Q8_RUN queries (NQ): each value row's
 * eight group scales folded into its weights first (w = a s, eight per row and query, for the
 * run's rows), so that each group's 16 int8 values are widened once and meet w as a broadcast
 * operand of the FMA; in passes of 8, 4 or 2 groups for 2, 4 or 8 queries, each value widened once
 * for all of them (the next chunk's keys prefetched in the first). Each output's sum runs over the
 * rows in the same order whatever NQ is. */
ALWAYS_INLINE void q8_sum_128(float* out, const float* att, int att_stride, int NQ, const int8_t* values,
                              const int8_t* next_keys, int n_next, int stride, int n, int add) {
    float w[ATTENTION_DECODE_CHUNK * Q8_RUN * 8] __attribute__((aligned(64))); /* w[t][j][g], NQ queries a row */
    for (int t = 0; t < n; t++) {
        const fvec s = fv_load_half((const uint16_t*)(values + (size_t)t * stride + 128));
#pragma GCC unroll 8
        for (int j = 0; j < NQ; j++)
            fv_store(w + ((size_t)t * NQ + j) * 8, fv_mul(s, fv_broadcast(att + (size_t)j * att_stride + t)));
    }
    const int G = NQ <= 2 ? 8 : 16 / NQ;
#pragma GCC unroll 4
    for (int g0 = 0; g0 < 8; g0 += G) q8_sum_pass_128(out, w, NQ, values, next_keys, n_next, stride, n, add, g0, G);
}

/* q8_sum_128 with NQ a constant, in a function of its own: inlined beside the other decode
 * kernels, its loops run short of registers and spill (docs/design.md#attention-decode). */
static __attribute__((noinline)) void q8_weighted_sum_128(float* out, const float* att, int att_stride, int NQ,
                                                          const int8_t* values, const int8_t* next_keys, int n_next,
                                                          int stride, int n, int add) {
    if (NQ == 4) q8_sum_128(out, att, att_stride, 4, values, next_keys, n_next, stride, n, add);
    else if (NQ == 2) q8_sum_128(out, att, att_stride, 2, values, next_keys, n_next, stride, n, add);
    else q8_sum_128(out, att, att_stride, 1, values, next_keys, n_next, stride, n, add);
}

/* One pass of q8_pairs_sum_128: groups g0 and g0 + 1 of eight queries' outputs, 16 int32 sums in
 * registers; each pair of rows' values widened and paired once for the eight queries, each
 * query's pair of weights a broadcast operand of vpdpwssd. Each of the four passes prefetches every
 * fourth pair of the next chunk's key rows, so that those prefetches spread over the whole sum: all
 * in the first pass, they would wait for miss buffers, and the next chunk's scores for its keys
 * (docs/design.md#attention-decode). */
ALWAYS_INLINE void q8_pairs_pass_128(float* out, const int16_t* w, const int8_t* const* rows, int n_pairs,
                                     const int8_t* const* next_keys, int n_next, int add, const float* unit, int g0) {
    enum { NQ = Q8_RUN, G = 2, PASSES = 8 / G };
    wbytes acc[NQ * G];
#pragma GCC unroll 16
    for (int k = 0; k < NQ * G; k++) acc[k] = wb_set1(0);
    for (int i = 0; i < n_pairs; i++) {
        for (int r = 2 * i; i % PASSES == g0 / G && r < 2 * i + 2 && r < n_next; r++)
            for (int c = 0; c < kv_row_bytes(128, KV_Q8); c += 64) __builtin_prefetch(next_keys[r] + c, 0, 2);
        wbytes v[G];
        wb_word_pairs2(rows[2 * i] + 16 * g0, rows[2 * i + 1] + 16 * g0, v);
#pragma GCC unroll 8
        for (int j = 0; j < NQ; j++)
#pragma GCC unroll 2
            for (int g = 0; g < G; g++)
                acc[j * G + g] = wb_dot_words_at(acc[j * G + g], v[g], w + (((size_t)i * NQ + j) * 8 + g0 + g) * 2);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NQ; j++)
#pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
            float* o = out + (size_t)j * 128 + 16 * (g0 + g);
            const wvec x = wv_from_i32(acc[j * G + g]), u = wv_set1(unit[j]);
            wv_store(o, add ? wv_fma(x, u, wv_load(o)) : wv_mul(x, u));
        }
}

/* The weighted sum over a q8 cache at head_dim 128 for a run of eight queries (Q8_RUN), on int16
 * weights, two rows at a time: a row's weight a (a query's exponential) times each of its eight
 * group scales s is rounded to an int16 w = round(a s k), k = 32766 / (the query's largest a in
 * the chunk x the chunk's largest s), so that w / k is within 0.5 / k of a s, a step that shrinks
 * with the chunk's weights; vpdpwssd adds w times the int8 values of two rows into exact int32
 * sums, and the chunk's sums over k are added to out. Two rows a lane and no widening to fp32
 * take about half the instructions of q8_sum_128's fp32 FMAs, which fewer queries keep: there the
 * pairing costs more than it saves (docs/design.md#attention-decode). The chunk's rows come as
 * pointers (n odd: one more, its weights 0), so the sums do not depend on the cache's blocks. In
 * a function of its own, as q8_weighted_sum_128. */
static __attribute__((noinline)) void q8_pairs_sum_128(float* out, const float* att, int att_stride,
                                                       const int8_t* const* rows, int n, const int8_t* const* next_keys,
                                                       int n_next, int add) {
    enum { NQ = Q8_RUN };
    wvec s[ATTENTION_DECODE_CHUNK / 2];
    int16_t w[ATTENTION_DECODE_CHUNK / 2 * NQ * 16] __attribute__((aligned(64))); /* w[pair][query][group][row] */
    const int n_pairs = (n + 1) / 2;
    wvec top = wv_set1(0.0f);
    for (int i = 0; i < n_pairs; i++) {
        s[i] = wv_half_pairs((const uint16_t*)(rows[2 * i] + 128), (const uint16_t*)(rows[2 * i + 1] + 128));
        top = wv_max(top, s[i]);
    }
    const float largest = wv_hmax(top);
    float k[NQ], unit[NQ];
    for (int j = 0; j < NQ; j++) {
        const float bound = largest * row_max(att + (size_t)j * att_stride, n, 0.0f); /* >= each a s here */
        k[j] = bound > 0.0f ? 32766.0f / bound : 0.0f;
        unit[j] = bound > 0.0f ? bound / 32766.0f : 0.0f;
    }
    for (int i = 0; i < n_pairs; i++) {
        if (2 * i + 1 == n) { /* the last row alone */
#pragma GCC unroll 8
            for (int j = 0; j < NQ; j++) {
                const float last[2] = {att[(size_t)j * att_stride + 2 * i] * k[j], 0.0f};
                wv_store_i16(w + ((size_t)i * NQ + j) * 16, wv_mul(wv_set1_pair(last), s[i]));
            }
            break;
        }
#pragma GCC unroll 8
        for (int j = 0; j < NQ; j++) {
            const wvec a = wv_mul(wv_set1_pair(att + (size_t)j * att_stride + 2 * i), wv_set1(k[j]));
            wv_store_i16(w + ((size_t)i * NQ + j) * 16, wv_mul(a, s[i]));
        }
    }
#pragma GCC unroll 4
    for (int g0 = 0; g0 < 8; g0 += 2) q8_pairs_pass_128(out, w, rows, n_pairs, next_keys, n_next, add, unit, g0);
}

/* scores() on the widest vector, over an fp16 cache: each key row widened WV_LANES halves at a time
 * into one sum per query, four rows' sums reduced in one tree (wv_hsum4_store), the same order for
 * every row. Widening halves is most of fvec's arithmetic per row, and a GQA group of 8 (30B-A3B)
 * spends most of decode at depth in it; zmm halves the instructions. Over an fp32 cache, which
 * widens nothing, zmm is slower on the 0.6B shape and faster on 30B-A3B's, and fvec stays
 * (docs/design.md#attention-decode). */
ALWAYS_INLINE void wide_scores(float* att, int att_stride, const float* q, int NQ, const void* keys,
                               const void* prefetch_values, int stride, int n, int d, float scale, KVType T) {
    for (int t = 0; t < n; t += 4) {
        const int m = n - t < 4 ? n - t : 4;
        wvec a[4][2];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            a[r][0] = a[r][1] = wv_set1(0.0f);
            if (r >= m) continue;
            const void* k = kv_at(keys, (size_t)(t + r) * stride, T);
            const char* v = prefetch_values ? kv_at(prefetch_values, (size_t)(t + r) * stride, T) : NULL;
            for (int i = 0; v && i < kv_row_bytes(d, T); i += 64) __builtin_prefetch(v + i, 0, 2); /* into L2 */
            for (int i = 0; i < d; i += WV_LANES) {
                const wvec kv = kv_load_wide(k, i, d, T);
#pragma GCC unroll 2
                for (int j = 0; j < NQ; j++) a[r][j] = wv_fma(wv_load(q + (size_t)j * d + i), kv, a[r][j]);
            }
        }
#pragma GCC unroll 2
        for (int j = 0; j < NQ; j++)
            wv_hsum4_store(att + (size_t)j * att_stride + t, m, a[0][j], a[1][j], a[2][j], a[3][j], scale);
    }
}
#else
/* Without AVX-512 VNNI every call below sits behind ATTENTION_WIDE and ATTENTION_Q8_128 = 0 and
 * folds away. */
#define Q8_RUN 2
#define ATTENTION_WIDE 0
#define ATTENTION_Q8_128 0
ALWAYS_INLINE void wide_weighted_sum(float* out, const float* att, int att_stride, int NQ, const void* values,
                                     const void* next_keys, int n_next, int stride, int n, int d, int add, KVType T) {}
ALWAYS_INLINE void q8_scores_128(float* att, int att_stride, const Q8Query* qq, int NQ, const int8_t* keys,
                                 const int8_t* prefetch_values, int stride, int n, float scale) {}
ALWAYS_INLINE void wide_scores(float* att, int att_stride, const float* q, int NQ, const void* keys,
                               const void* prefetch_values, int stride, int n, int d, float scale, KVType T) {}
ALWAYS_INLINE void q8_weighted_sum_128(float* out, const float* att, int att_stride, int NQ, const int8_t* values,
                                       const int8_t* next_keys, int n_next, int stride, int n, int add) {}
ALWAYS_INLINE void q8_pairs_sum_128(float* out, const float* att, int att_stride, const int8_t* const* rows, int n,
                                    const int8_t* const* next_keys, int n_next, int add) {}
#endif

/* weighted_sum's FV_LANES NU outputs per query from dimension i on (NU 4, or 2 for a head_dim's last
 * 2 FV_LANES), in registers for one pass over the value rows. On the way this pass prefetches into
 * L2 its share of the cache lines of next_keys' first n_next rows, in address order (pass p of P
 * takes the p-th of P equal runs), so that the next chunk's keys come in as one stream rather than
 * a line of every row per pass (docs/design.md#attention-decode). */
ALWAYS_INLINE void weighted_sum_pass(float* out, const float* att, int att_stride, int NQ, const void* values,
                                     const void* next_keys, int n_next, int stride, int n, int d, int i, int add,
                                     int NU, KVType T, int folded) {
    const int P = (d + 4 * FV_LANES - 1) / (4 * FV_LANES), p = i / (4 * FV_LANES);
    const int row_lines = (kv_row_bytes(d, T) + 63) / 64, lines = n_next * row_lines;
    const int first = p * lines / P, last = (p + 1) * lines / P;
    const int per_row = n > 0 ? (last - first + n - 1) / n : 0; /* lines to prefetch per value row */
    int line = first, row = first / row_lines, col = first % row_lines; /* the next line to prefetch */
    fvec o[2][4];
#pragma GCC unroll 2
    for (int j = 0; j < NQ; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NU; u++) o[j][u] = add ? fv_load(out + (size_t)j * d + i + FV_LANES * u) : fv_set1(0.0f);
    for (int t = 0; t < n; t++) {
        const void* v = kv_at(values, (size_t)t * stride, T);
        if (folded)
            for (int b = 0; i == 0 && t < n_next && b < kv_row_bytes(d, T); b += 64)
                __builtin_prefetch((const char*)kv_at(next_keys, (size_t)t * stride, T) + b, 0, 2);
        else
            for (const int end = first + (t + 1) * per_row; line < end && line < last; line++) {
                __builtin_prefetch((const char*)kv_at(next_keys, (size_t)row * stride, T) + 64 * col, 0, 2);
                if (++col == row_lines) col = 0, row++;
            }
        fvec vv[4];
#pragma GCC unroll 4
        for (int u = 0; u < NU; u++)
            vv[u] = folded ? fv_load_i8((const int8_t*)v + i + FV_LANES * u) : kv_load(v, i + FV_LANES * u, d, T);
#pragma GCC unroll 2
        for (int j = 0; j < NQ; j++) {
            if (folded) { /* att is q8_fold_weights' w: the weight of each value's group */
                const float* w = att + ((size_t)t * NQ + j) * (d / KV_Q8_GROUP);
#pragma GCC unroll 4
                for (int u = 0; u < NU; u++)
                    o[j][u] = fv_fma(fv_broadcast(w + (i + FV_LANES * u) / KV_Q8_GROUP), vv[u], o[j][u]);
                continue;
            }
            const fvec a = fv_broadcast(att + (size_t)j * att_stride + t);
#pragma GCC unroll 4
            for (int u = 0; u < NU; u++) o[j][u] = fv_fma(a, vv[u], o[j][u]);
        }
    }
#pragma GCC unroll 2
    for (int j = 0; j < NQ; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NU; u++) fv_store(out + (size_t)j * d + i + FV_LANES * u, o[j][u]);
}

/* out_j (+)= sum_{t < n} att[j * att_stride + t] v_t for NQ (1 or 2) queries, in passes of 4 FV_LANES
 * outputs per query (2 FV_LANES in a last one); with add, the sums continue from out (a block after
 * the first: the same order as over one array). Meanwhile the next chunk's first n_next key rows
 * are prefetched into L2, so that memory keeps streaming while the sum works from cache. folded:
 * over a q8 cache, att is q8_fold_weights' w instead, and the first pass prefetches each next key
 * row whole (a q8 row is 2.25 lines; the line schedule's bookkeeping is slower there:
 * docs/design.md#kv-cache-q8). */
ALWAYS_INLINE void weighted_sum(float* out, const float* att, int att_stride, int NQ, const void* values,
                                const void* next_keys, int n_next, int stride, int n, int d, int add, KVType T,
                                int folded) {
    int i = 0;
    for (; i + 4 * FV_LANES <= d; i += 4 * FV_LANES)
        weighted_sum_pass(out, att, att_stride, NQ, values, next_keys, n_next, stride, n, d, i, add, 4, T, folded);
    if (i < d)
        weighted_sum_pass(out, att, att_stride, NQ, values, next_keys, n_next, stride, n, d, i, add, 2, T, folded);
}

/* Where decode's query is int8 and the vector is fvec (AVX2 alone), weighted_sum over a q8 cache
 * multiplies each value row's group scales into its weights first, w[t][j][g] = a_j,t s_t,g for the
 * chunk's n rows, so that a value is widened without its scale and meets w as the FMA's operand (as
 * q8_sum_128 does on zmm): each term is rounded twice (a s, then the FMA) where it was once. */
ALWAYS_INLINE void q8_fold_weights(float* w, const float* att, int att_stride, int NQ, const int8_t* values,
                                   int stride, int n, int d) {
    const int G = d / KV_Q8_GROUP;
    for (int t = 0; t < n; t++) {
        const uint16_t* s = (const uint16_t*)(values + (size_t)t * stride + kv_q8_scale_at(d, 0));
#pragma GCC unroll 2
        for (int j = 0; j < NQ; j++) {
            const float a = att[(size_t)j * att_stride + t];
            float* wt = w + ((size_t)t * NQ + j) * G;
            int g = 0;
#if defined(KERNELS_KV_F16)
            for (; g + FV_LANES <= G; g += FV_LANES) fv_store(wt + g, fv_mul(fv_load_half(s + g), fv_set1(a)));
#endif
            for (; g < G; g++) wt[g] = half_to_float(s[g]) * a;
        }
    }
}

/* The kernels above read rows at a fixed stride, and the cache keeps its positions in blocks
 * (KVRows), so the loops below call them a run of rows at a time: this one is positions [p, p + its
 * length) of those before end, up to the end of p's block, at *off in the cache. */
static inline int kv_block(const KVRows* kv, int p, int end, size_t* off) {
    *off = (size_t)(p / kv->block_len) * kv->block_stride + (size_t)(p % kv->block_len) * kv->stride;
    const int block_end = (p / kv->block_len + 1) * kv->block_len;
    return (end < block_end ? end : block_end) - p;
}

/* rows[i] = where position p0 + i of a q8 cache's keys or values (base) begins, for p0 + i < p1. */
static inline void q8_row_pointers(const int8_t** rows, const KVRows* kv, const void* base, int p0, int p1) {
    size_t off;
    for (int p = p0, n; p < p1; p += n) {
        n = kv_block(kv, p, p1, &off);
        for (int r = 0; r < n; r++) rows[p - p0 + r] = (const int8_t*)base + off + (size_t)r * kv->stride;
    }
}


/* softmax_scalar's twin over decode attention's own steps (exp_shifted, scale_row): attention
 * runs those steps inline; tests/test_kernels.c checks them through this function. */
void softmax(float* x, int n) {
    if (n <= 0) return;
    float m = -INFINITY;
    scale_row(x, n, 1.0f / exp_shifted(x, n, &m));
}

/* One chunk's scores for NQ (a constant: 1 or 2, up to Q8_RUN over q8 at head_dim 128) queries, a
 * run of rows per block of the cache (kv_block); with prefetch, the chunk's values go into L2 on
 * the way. */
ALWAYS_INLINE void decode_chunk_scores(float* att, int n_pos, const Q8Query* qq, const float* q, int NQ,
                                       const KVRows* kv, int c0, int c1, int d, float scale, int prefetch, KVType T) {
    const int I8 = T == KV_Q8 && d <= ATTENTION_Q8_DOT;
    size_t off;
    for (int p = c0, n; p < c1; p += n) {
        n = kv_block(kv, p, c1, &off);
        const void* prefetch_values = prefetch ? kv_at(kv->values, off, T) : NULL;
        if (I8 && d == 128 && ATTENTION_Q8_128)
            q8_scores_128(att + p, n_pos, qq, NQ, kv_at(kv->keys, off, T), prefetch_values, kv->stride, n, scale);
        else if (NQ > 2)
            continue; /* not reached: attend_queries takes more than 2 queries a call only into q8_scores_128 */
        else if (I8)
            q8_scores(att + p, n_pos, qq, NQ, kv_at(kv->keys, off, T), prefetch_values, kv->stride, n, d, scale);
        else if (T == KV_F16 && ATTENTION_WIDE)
            wide_scores(att + p, n_pos, q, NQ, kv_at(kv->keys, off, T), prefetch_values, kv->stride, n, d, scale, T);
        else
            scores(att + p, n_pos, q, NQ, kv_at(kv->keys, off, T), prefetch_values, kv->stride, n, d, scale, T);
    }
}

/* One chunk's weighted sum for NQ (as decode_chunk_scores') queries, continuing out after the first
 * chunk; with prefetch, the next chunk's keys go into L2 on the way. */
ALWAYS_INLINE void decode_chunk_sum(float* out, const float* att, int n_pos, int NQ, const KVRows* kv, int c0, int c1,
                                    int d, int prefetch, KVType T) {
    const int I8 = T == KV_Q8 && d <= ATTENTION_Q8_DOT;
    size_t off;
    if (I8 && d == 128 && ATTENTION_Q8_128 && NQ == Q8_RUN) { /* the rows, and the next keys, as pointers */
        const int8_t *rows[ATTENTION_DECODE_CHUNK + 1], *next_keys[ATTENTION_DECODE_CHUNK];
        const int n_next = !prefetch || c1 >= n_pos ? 0 : n_pos - c1 < c1 - c0 ? n_pos - c1 : c1 - c0;
        q8_row_pointers(rows, kv, kv->values, c0, c1);
        rows[c1 - c0] = rows[c1 - c0 - 1];
        q8_row_pointers(next_keys, kv, kv->keys, c1, c1 + n_next);
        q8_pairs_sum_128(out, att + c0, n_pos, rows, c1 - c0, next_keys, n_next, c0 > 0);
        return;
    }
    for (int p = c0, n; p < c1; p += n) {
        n = kv_block(kv, p, c1, &off);
        size_t next = 0;
        int n_next = 0;
        if (prefetch && p + ATTENTION_DECODE_CHUNK < n_pos)
            n_next = kv_block(kv, p + ATTENTION_DECODE_CHUNK, n_pos, &next);
        if (n_next > n) n_next = n; /* the next chunk's keys, a row per value row read */
        if (I8 && d == 128 && ATTENTION_Q8_128)
            q8_weighted_sum_128(out, att + p, n_pos, NQ, kv_at(kv->values, off, T), kv_at(kv->keys, next, T), n_next,
                                kv->stride, n, p > 0);
        else if (NQ > 2) /* only over q8 at head_dim 128 (decode_chunk_scores): the sums below */
            continue;    /* are compiled for NQ 1 and 2 alone */
        else if ((I8 || T == KV_F16) && ATTENTION_WIDE)
            wide_weighted_sum(out, att + p, n_pos, NQ, kv_at(kv->values, off, T), kv_at(kv->keys, next, T), n_next,
                              kv->stride, n, d, p > 0, T);
        else if (I8) { /* AVX2 alone */
            float w[ATTENTION_DECODE_CHUNK * 2 * (ATTENTION_Q8_DOT > 0 ? ATTENTION_Q8_DOT / KV_Q8_GROUP : 1)];
            q8_fold_weights(w, att + p, n_pos, NQ, kv_at(kv->values, off, T), kv->stride, n, d);
            weighted_sum(out, w, 0, NQ, kv_at(kv->values, off, T), kv_at(kv->keys, next, T), n_next, kv->stride, n, d,
                         p > 0, T, 1);
        } else
            weighted_sum(out, att + p, n_pos, NQ, kv_at(kv->values, off, T), kv_at(kv->keys, next, T), n_next,
                         kv->stride, n, d, p > 0, T, 0);
    }
}

/* A GQA group's queries share one kv head; decode takes up to this many in one pass over its rows. */
#define ATTENTION_GROUP_PASS 16

/* How many of the `left` queries one kernel call takes: up to Q8_RUN into the head_dim 128 kernels
 * over q8 (q8_128), else up to 2; a power of two, so that NQ is one of a few constants. */
ALWAYS_INLINE int query_run(int left, int q8_128) {
    int n = q8_128 ? Q8_RUN : 2;
    while (n > left) n /= 2;
    return n;
}

/* Scores, softmax and weighted sum of the n_q (up to ATTENTION_GROUP_PASS) queries of one GQA group
 * in one pass over the cache, ATTENTION_DECODE_CHUNK positions at a time: the chunk's scores (the
 * first run prefetching its values), their exponentials against each query's running maximum,
 * then its weighted sum (the first run prefetching the next chunk's keys), so that memory streams
 * through both halves of a chunk instead of idling while one works from cache. The queries go in
 * pairs, or over q8 at head_dim 128 in runs of up to Q8_RUN (query_run; NQ a constant in each call,
 * so the accumulators stay in registers); the runs after the first find the chunk's keys and values
 * in cache, so the group reads the cache once however many queries share it. Where a chunk raises
 * a query's maximum from m to m', what was summed before (output and total weight) is scaled by
 * exp(m - m'); one division ends it: Milakov and Gimelshein's online softmax (2018), per chunk.
 * The chunks are the same whatever the cache's blocks, so the result does not depend on the block
 * length (the tests compare a blocked cache with one array bit for bit), nor on how many queries
 * share the pass. Two passes would find the values prefetched in the first partly evicted by the
 * second at long caches (docs/design.md#attention-decode). */
ALWAYS_INLINE void attend_queries(float* out, const float* q, int n_q, const KVRows* kv, int n_pos, int d, float scale,
                                  float* att, KVType T) {
    float max[ATTENTION_GROUP_PASS], total[ATTENTION_GROUP_PASS];
    Q8Query qq[ATTENTION_GROUP_PASS];
    const int q8_128 = T == KV_Q8 && d == 128 && ATTENTION_Q8_128;
    for (int j = 0; j < n_q; j++) max[j] = -INFINITY, total[j] = 0.0f;
    if (T == KV_Q8 && d <= ATTENTION_Q8_DOT) q8_query(qq, q, n_q, d);
    for (int c0 = 0; c0 < n_pos; c0 += ATTENTION_DECODE_CHUNK) {
        const int c1 = n_pos - c0 < ATTENTION_DECODE_CHUNK ? n_pos : c0 + ATTENTION_DECODE_CHUNK;
        for (int j = 0, nq; j < n_q; j += nq) {
            float* a = att + (size_t)j * n_pos;
            const float* qj = q + (size_t)j * d;
            nq = query_run(n_q - j, q8_128);
            if (nq == 8) decode_chunk_scores(a, n_pos, &qq[j], qj, 8, kv, c0, c1, d, scale, j == 0, T);
            else if (nq == 4) decode_chunk_scores(a, n_pos, &qq[j], qj, 4, kv, c0, c1, d, scale, j == 0, T);
            else if (nq == 2) decode_chunk_scores(a, n_pos, &qq[j], qj, 2, kv, c0, c1, d, scale, j == 0, T);
            else decode_chunk_scores(a, n_pos, &qq[j], qj, 1, kv, c0, c1, d, scale, j == 0, T);
        }
        for (int j = 0; j < n_q; j++) {
            const float before = max[j];
            const float sum = exp_shifted(att + (size_t)j * n_pos + c0, c1 - c0, &max[j]);
            if (c0 > 0 && max[j] > before) {
                const float r = expf(before - max[j]);
                total[j] *= r;
                scale_row(out + (size_t)j * d, d, r);
            }
            total[j] += sum;
        }
        for (int j = 0, nq; j < n_q; j += nq) {
            float* o = out + (size_t)j * d;
            const float* a = att + (size_t)j * n_pos;
            nq = query_run(n_q - j, q8_128);
            if (nq == 8) decode_chunk_sum(o, a, n_pos, 8, kv, c0, c1, d, j == 0, T);
            else if (nq == 4) decode_chunk_sum(o, a, n_pos, 4, kv, c0, c1, d, j == 0, T);
            else if (nq == 2) decode_chunk_sum(o, a, n_pos, 2, kv, c0, c1, d, j == 0, T);
            else decode_chunk_sum(o, a, n_pos, 1, kv, c0, c1, d, j == 0, T);
        }
    }
    for (int j = 0; j < n_q; j++) scale_row(out + (size_t)j * d, d, 1.0f / total[j]);
}

#else
void softmax(float* x, int n) { softmax_scalar(x, n); }
#endif

/* The SIMD kernels take head_dim a multiple of DIM_STEP, and for halves a build that widens them
 * in registers (KERNELS_KV_F16); else the scalar reference runs. */
int attention_simd(int head_dim, KVType type) {
#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
#if !defined(KERNELS_KV_F16)
    if (type == KV_F16) return 0;
#endif
    return head_dim % DIM_STEP == 0;
#else
    return 0;
#endif
}


#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
/* ---- Prefill: the queries in the lanes ----
 * attend_lanes puts WV_LANES queries in a vector (16 with AVX-512, 8 with AVX2, 4 with NEON): the
 * block's queries are transposed once (Qt[i][j] = q_j[i]), so that a key's element i, broadcast,
 * meets WV_LANES queries in one FMA, and every step after that (the causal mask, the softmax, the
 * weighted sum) is vertical: no horizontal sum anywhere, where a tile with the dimensions in the
 * lanes ends each (query, key) pair with one. Written over simd_math.h's widest vector, wvec. */

/* A score tile: 4 keys x up to LANE_VECS vectors of queries, 4 * LANE_VECS accumulators. */
#if defined(KERNELS_AVX2) && !defined(KERNELS_AVX512)
#define LANE_VECS 3 /* 12 of the 16 ymm registers */
#else
#define LANE_VECS 4 /* 16 of the 32 zmm or NEON registers */
#endif

/* Keeps a vector in a register: on x86 gcc would fold its load into each FMA that uses it. */
#if defined(KERNELS_AVX2)
#define IN_REGISTER(x) __asm__("" : "+v"(x))
#else
#define IN_REGISTER(x) (void)0
#endif

/* ---- Prefill over an fp16 or q8 cache: bf16 pairs ----
 * vdpbf16ps takes two products per lane where an FMA takes one. So with AVX-512 BF16, prefill over
 * a cache that already rounds its keys and values (fp16, q8) multiplies bf16 pairs, with fp32
 * sums, as Qwen3 in bf16 computes attention (docs/design.md#attention-prefill): Qt as pairs of
 * dimensions, key rows as bf16 (a pair is one word), the softmax's weights and the values as
 * pairs of positions. Chunks start at multiples of ATTENTION_KEY_CHUNK whatever the cache's
 * blocks (rows are fetched by position), so the pairs are always (2m, 2m + 1) and a query's
 * result is the same bits beside any rows and in any blocking. The default fp32 cache keeps fp32
 * products, and decode keeps fp32 (attention_group). */
#if defined(KERNELS_BF16_DOT)
#define ATTENTION_PAIRS 1
/* a[k][v] += the QV query vectors' pairs (Qt [d / 2][nl]) . key k's (bf16 rows at stride). */
ALWAYS_INLINE void pair_scores(wvec a[4][LANE_VECS], const float* Qt, int nl, const void* keys, int stride, int NK,
                               int QV, int d) {
    for (int i = 0; i < d / 2; i++) {
        wpair qv[LANE_VECS];
#pragma GCC unroll 4
        for (int v = 0; v < QV; v++) {
            qv[v] = wp_load((const uint32_t*)Qt + (size_t)i * nl + WV_LANES * v);
            IN_REGISTER(qv[v]);
        }
#pragma GCC unroll 4
        for (int k = 0; k < NK; k++) {
            const wpair kb = wp_set1(((const uint32_t*)keys)[(size_t)k * stride / 2 + i]);
#pragma GCC unroll 4
            for (int v = 0; v < QV; v++) a[k][v] = wv_dot_pairs(a[k][v], qv[v], kb);
        }
    }
}

/* o[u][v] += sum over n pairs of positions of the weights' pairs (P [n][nl]) times dimension
 * i0 + u's pairs (values [n][stride]). */
ALWAYS_INLINE void pair_weighted_sum(wvec o[4][LANE_VECS], const float* P, int nl, const void* values, int stride, int n,
                                     int i0, int QV) {
    for (int t = 0; t < n; t++) {
        wpair p[LANE_VECS];
#pragma GCC unroll 4
        for (int v = 0; v < QV; v++) {
            p[v] = wp_load((const uint32_t*)P + (size_t)t * nl + WV_LANES * v);
            IN_REGISTER(p[v]);
        }
        const uint32_t* row = (const uint32_t*)values + (size_t)t * stride;
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            const wpair vb = wp_set1(row[i0 + u]);
#pragma GCC unroll 4
            for (int v = 0; v < QV; v++) o[u][v] = wv_dot_pairs(o[u][v], p[v], vb);
        }
    }
}

/* 16 values of position t's row of a cache array from i on, as fp32 (exact). */
ALWAYS_INLINE wvec cache_lanes(const KVRows* kv, const void* base, int t, int d, int i, KVType T) {
    return kv_load_wide(kv_at(base, kv_row_offset(kv, t), T), (size_t)i, d, T);
}

/* Rows 2t and 2t + 1 of A [rows][nl] as row t's pairs, in place (row t is read before it is
 * written); a last odd row pairs with zeros. */
static void pack_row_pairs(float* A, int nl, int rows) {
    for (int t = 0; 2 * t < rows; t++)
        for (int j = 0; j < nl; j += WV_LANES) {
            const wvec hi = 2 * t + 1 < rows ? wv_load(A + (size_t)(2 * t + 1) * nl + j) : wv_set1(0.0f);
            wp_store((uint32_t*)(A + (size_t)t * nl) + j, wp_pack(wv_load(A + (size_t)2 * t * nl + j), hi));
        }
}

/* Keys [p, p + c) as bf16 rows of d. */
ALWAYS_INLINE void pair_keys(uint16_t* out, const KVRows* kv, int p, int c, int d, KVType T) {
    for (int t = 0; t < c; t++)
        for (int i = 0; i < d; i += WV_LANES)
            wv_store_bf16(out + (size_t)t * d + i, cache_lanes(kv, kv->keys, p + t, d, i, T));
}

/* Values [p, p + c) as pairs of positions, out[t][i] = (v_{p+2t}[i], v_{p+2t+1}[i]), zeros past c. */
ALWAYS_INLINE void pair_values(uint32_t* out, const KVRows* kv, int p, int c, int d, KVType T) {
    for (int t = 0; 2 * t < c; t++)
        for (int i = 0; i < d; i += WV_LANES) {
            const wvec hi = 2 * t + 1 < c ? cache_lanes(kv, kv->values, p + 2 * t + 1, d, i, T) : wv_set1(0.0f);
            wp_store(out + (size_t)t * d + i, wp_pack(cache_lanes(kv, kv->values, p + 2 * t, d, i, T), hi));
        }
}
#else
/* Without vdpbf16ps every call below sits behind B = 0 and folds away; these only let it compile. */
#define ATTENTION_PAIRS 0
ALWAYS_INLINE void pair_scores(wvec a[4][LANE_VECS], const float* Qt, int nl, const void* keys, int stride, int NK,
                               int QV, int d) {}
ALWAYS_INLINE void pair_weighted_sum(wvec o[4][LANE_VECS], const float* P, int nl, const void* values, int stride, int n,
                                     int i0, int QV) {}
ALWAYS_INLINE void pack_row_pairs(float* A, int nl, int rows) {}
ALWAYS_INLINE void pair_keys(uint16_t* out, const KVRows* kv, int p, int c, int d, KVType T) {}
ALWAYS_INLINE void pair_values(uint32_t* out, const KVRows* kv, int p, int c, int d, KVType T) {}
#endif

/* S[k * nl + WV_LANES v + lane] = (q . key k) * scale for NK (<= 4) keys (rows at stride) and QV
 * vectors of queries (Qt: [d][nl]). Each sum runs over the dimensions in order, one FMA each,
 * whatever the other queries and keys of the tile. B: bf16 pairs instead (Qt [d / 2][nl] pairs,
 * keys bf16 rows), two dimensions per vdpbf16ps. */
ALWAYS_INLINE void lane_scores(float* S, int nl, const float* Qt, const void* keys_, int stride, int NK, int QV, int d,
                               float scale, int B) {
    const float* keys = keys_;
    wvec a[4][LANE_VECS];
#pragma GCC unroll 4
    for (int k = 0; k < NK; k++)
#pragma GCC unroll 4
        for (int v = 0; v < QV; v++) a[k][v] = wv_set1(0.0f);
    if (B) pair_scores(a, Qt, nl, keys_, stride, NK, QV, d);
    for (int i = 0; !B && i < d; i++) {
        wvec qv[LANE_VECS];
#pragma GCC unroll 4
        for (int v = 0; v < QV; v++) {
            qv[v] = wv_load(Qt + (size_t)i * nl + WV_LANES * v);
            IN_REGISTER(qv[v]);
        }
#pragma GCC unroll 4
        for (int k = 0; k < NK; k++) {
            const wvec kb = wv_set1(keys[(size_t)k * stride + i]);
#pragma GCC unroll 4
            for (int v = 0; v < QV; v++) a[k][v] = wv_fma(qv[v], kb, a[k][v]);
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < NK; k++)
#pragma GCC unroll 4
        for (int v = 0; v < QV; v++) wv_store(S + (size_t)k * nl + WV_LANES * v, wv_mul(a[k][v], wv_set1(scale)));
}

/* Ot[i][lanes] (+)= sum_{t < n} P[t][lanes] v_t[i] for the 4 dimensions from i0 and QV vectors of
 * queries; add: continue the sums in Ot (a chunk after the first). B: bf16 pairs of positions
 * instead, n of them (P [n][nl] pairs, values [n][stride] pairs), one vdpbf16ps per two. */
ALWAYS_INLINE void lane_weighted_sum(float* Ot, int nl, const float* P, const void* values_, int stride, int n, int i0,
                                     int QV, int add, int B) {
    const float* values = values_;
    wvec o[4][LANE_VECS];
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++)
#pragma GCC unroll 4
        for (int v = 0; v < QV; v++) o[u][v] = add ? wv_load(Ot + (size_t)(i0 + u) * nl + WV_LANES * v) : wv_set1(0.0f);
    if (B) pair_weighted_sum(o, P, nl, values_, stride, n, i0, QV);
    for (int t = 0; !B && t < n; t++) {
        wvec p[LANE_VECS];
#pragma GCC unroll 4
        for (int v = 0; v < QV; v++) {
            p[v] = wv_load(P + (size_t)t * nl + WV_LANES * v);
            IN_REGISTER(p[v]);
        }
        const float* row = values + (size_t)t * stride;
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            const wvec vb = wv_set1(row[i0 + u]);
#pragma GCC unroll 4
            for (int v = 0; v < QV; v++) o[u][v] = wv_fma(p[v], vb, o[u][v]);
        }
    }
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++)
#pragma GCC unroll 4
        for (int v = 0; v < QV; v++) wv_store(Ot + (size_t)(i0 + u) * nl + WV_LANES * v, o[u][v]);
}

/* lane_scores and lane_weighted_sum over all nv vectors of queries, LANE_VECS at a time (QV a
 * constant in each call, so the accumulators stay in registers). */
ALWAYS_INLINE void scores_all(float* S, int nl, int nv, const float* Qt, const void* keys, int stride, int NK, int d,
                              float scale, int B) {
    int v = 0;
    for (; v + LANE_VECS <= nv; v += LANE_VECS)
        lane_scores(S + WV_LANES * v, nl, Qt + WV_LANES * v, keys, stride, NK, LANE_VECS, d, scale, B);
    if (LANE_VECS > 3 && nv - v == 3)
        lane_scores(S + WV_LANES * v, nl, Qt + WV_LANES * v, keys, stride, NK, 3, d, scale, B);
    if (nv - v == 2) lane_scores(S + WV_LANES * v, nl, Qt + WV_LANES * v, keys, stride, NK, 2, d, scale, B);
    if (nv - v == 1) lane_scores(S + WV_LANES * v, nl, Qt + WV_LANES * v, keys, stride, NK, 1, d, scale, B);
}

ALWAYS_INLINE void weighted_sum_all(float* Ot, int nl, int nv, const float* P, const void* values, int stride, int n,
                                    int d, int add, int B) {
    for (int i = 0; i < d; i += 4) {
        int v = 0;
        for (; v + LANE_VECS <= nv; v += LANE_VECS)
            lane_weighted_sum(Ot + WV_LANES * v, nl, P + WV_LANES * v, values, stride, n, i, LANE_VECS, add, B);
        if (LANE_VECS > 3 && nv - v == 3)
            lane_weighted_sum(Ot + WV_LANES * v, nl, P + WV_LANES * v, values, stride, n, i, 3, add, B);
        if (nv - v == 2) lane_weighted_sum(Ot + WV_LANES * v, nl, P + WV_LANES * v, values, stride, n, i, 2, add, B);
        if (nv - v == 1) lane_weighted_sum(Ot + WV_LANES * v, nl, P + WV_LANES * v, values, stride, n, i, 1, add, B);
    }
}

/* The scores of every vector of queries against keys [0, n) of a run (rows at stride, elements of
 * 4 bytes, or 2 when B): 4 keys at a time, then one. */
ALWAYS_INLINE void chunk_scores(float* S, int nl, int nv, const float* Qt, const void* keys, int stride, int n,
                                int d, float scale, int B) {
    const size_t row_bytes = (size_t)stride * (B ? 2 : 4);
    int t = 0;
    for (; t + 4 <= n; t += 4)
        scores_all(S + (size_t)t * nl, nl, nv, Qt, (const char*)keys + t * row_bytes, stride, 4, d, scale, B);
    for (; t < n; t++)
        scores_all(S + (size_t)t * nl, nl, nv, Qt, (const char*)keys + t * row_bytes, stride, 1, d, scale, B);
}

/* Rows [0, n) of a cache run (at stride, elements) as fp32 rows: the run itself in an fp32 cache
 * (*fstride = stride), else widened into buf (*fstride = d), so that the kernels above read fp32
 * only and a half or q8 value is widened once per block of queries, not once per query vector. */
ALWAYS_INLINE const float* rows_fp32(const void* rows, int stride, int n, int d, float* buf, int* fstride, KVType T) {
    *fstride = T == KV_F32 ? stride : d;
    if (T == KV_F32) return rows;
    for (int t = 0; t < n; t++) {
        const void* row = kv_at(rows, (size_t)t * stride, T);
        for (int i = 0; i < d; i += WV_LANES) wv_store(buf + (size_t)t * d + i, kv_load_wide(row, i, d, T));
    }
    return buf;
}

/* Prefill attention's keys and values go in chunks of this many positions: a chunk's weights and
 * values stay in cache while the dimensions go by. */
#define ATTENTION_KEY_CHUNK 64

/* The positions [p, p + return) of the next chunk (*off: the first one's row in the cache arrays):
 * a run of one cache block; with pairs, ATTENTION_KEY_CHUNK positions from a multiple of it. */
ALWAYS_INLINE int next_chunk(const KVRows* kv, int p, int n_all, size_t* off, int B) {
    if (B) return n_all - p < ATTENTION_KEY_CHUNK ? n_all - p : ATTENTION_KEY_CHUNK;
    return kv_block(kv, p, n_all - p < ATTENTION_KEY_CHUNK ? n_all : p + ATTENTION_KEY_CHUNK, off);
}

/* The keys of the chunk [p, p + c) as the scores read them (*fs: their row stride): rows_fp32's,
 * or (B) bf16 rows of d. */
ALWAYS_INLINE const void* chunk_keys(const KVRows* kv, int p, int c, size_t off, int d, float* buf, int* fs, KVType T,
                                     int B) {
    if (B) {
        pair_keys((uint16_t*)buf, kv, p, c, d, T);
        *fs = d;
        return buf;
    }
    return rows_fp32(kv_at(kv->keys, off, T), kv->stride, c, d, buf, fs, T);
}

/* The values of the chunk as the weighted sum reads them: rows_fp32's, or (B) pairs of positions,
 * buf[t][i] = (v_{p+2t}[i], v_{p+2t+1}[i]) with zeros past c. */
ALWAYS_INLINE const void* chunk_values(const KVRows* kv, int p, int c, size_t off, int d, float* buf, int* fs,
                                       KVType T, int B) {
    if (B) {
        pair_values((uint32_t*)buf, kv, p, c, d, T);
        *fs = d;
        return buf;
    }
    return rows_fp32(kv_at(kv->values, off, T), kv->stride, c, d, buf, fs, T);
}

/* One vector of queries' softmax over the keys, key t's scores at S + t * nl: each lane over its
 * own first npos[lane] keys, zeros after them. The exponentials stay in S unscaled (the weighted
 * sum is divided once at the end); returns 1 / their sum per lane. */
static wvec lane_softmax(float* S, int nl, int n_all, wvec npos) {
    wvec m = wv_set1(-INFINITY), sum = wv_set1(0.0f);
    for (int t = 0; t < n_all; t++) m = wv_if_less(wv_set1((float)t), npos, wv_max(m, wv_load(S + (size_t)t * nl)), m);
    for (int t = 0; t < n_all; t++) {
        float* s = S + (size_t)t * nl;
        const wvec e = wv_if_less(wv_set1((float)t), npos, wv_exp(wv_sub(wv_load(s), m)), wv_set1(0.0f));
        wv_store(s, e);
        sum = wv_add(sum, e);
    }
    return wv_div(wv_set1(1.0f), sum);
}

/* Query j of a prefill block: head j % n_q of row j / n_q. */
ALWAYS_INLINE size_t query_at(int j, int n_q, size_t row_stride, int d) {
    return (size_t)(j / n_q) * row_stride + (size_t)(j % n_q) * d;
}

/* Qt[i][j] = q_j[i] for the n queries, zeros in the lanes up to nl; WV_LANES x WV_LANES at a time. */
static void transpose_queries(float* Qt, int nl, const float* q, size_t row_stride, int n_q, int n, int d) {
    for (int j0 = 0; j0 < nl; j0 += WV_LANES)
        for (int i = 0; i < d; i += WV_LANES) {
            wvec r[WV_LANES];
            for (int l = 0; l < WV_LANES; l++)
                r[l] = j0 + l < n ? wv_load(q + query_at(j0 + l, n_q, row_stride, d) + i) : wv_set1(0.0f);
            wv_transpose(r);
            for (int k = 0; k < WV_LANES; k++) wv_store(Qt + (size_t)(i + k) * nl + j0, r[k]);
        }
}

/* out of query j = Ot[.][j] * inv[j], transposed back WV_LANES x WV_LANES at a time. */
static void transpose_outputs(float* out, size_t row_stride, int n_q, int n, int d, const float* Ot, int nl,
                              const float* inv) {
    for (int j0 = 0; j0 < n; j0 += WV_LANES)
        for (int i = 0; i < d; i += WV_LANES) {
            wvec r[WV_LANES];
            const wvec s = wv_load(inv + j0);
            for (int k = 0; k < WV_LANES; k++) r[k] = wv_mul(wv_load(Ot + (size_t)(i + k) * nl + j0), s);
            wv_transpose(r);
            for (int l = 0; l < WV_LANES && j0 + l < n; l++)
                wv_store(out + query_at(j0 + l, n_q, row_stride, d) + i, r[l]);
        }
}

/* The block's n = n_rows * n_q queries, nl with padding, and in att the scores S [n_all][nl], Qt
 * and Ot [d][nl], and a chunk of halves widened (attention_rows_scratch): every key's scores for
 * all the queries (4 keys at a time, each read once from the cache), each query's softmax over its
 * own causal length, then the weighted sum, all in chunks of ATTENTION_KEY_CHUNK positions (a
 * chunk's weights and values stay in cache while the dimensions go by). A query's sums run in the
 * same order whichever queries share its vector and however the cache is blocked, so its result
 * is the same bits. */
ALWAYS_INLINE void attend_lanes(float* out, const float* q, size_t row_stride, int n_q, int n_rows, const KVRows* kv,
                                int first_n_pos, int d, float scale, float* att, KVType T) {
    const int B = ATTENTION_PAIRS && T != KV_F32;
    const int n = n_rows * n_q, nl = (n + WV_LANES - 1) / WV_LANES * WV_LANES, nv = nl / WV_LANES;
    const int n_all = first_n_pos + n_rows - 1;
    float* S = att;
    float* Qt = S + (size_t)n_all * nl;
    float* Ot = Qt + (size_t)d * nl;
    float* widened = Ot + (size_t)d * nl;
    transpose_queries(Qt, nl, q, row_stride, n_q, n, d);
    if (B) pack_row_pairs(Qt, nl, d);
    size_t off = 0;
    int fs;
    for (int p = 0, c; p < n_all; p += c) {
        c = next_chunk(kv, p, n_all, &off, B);
        const void* k = chunk_keys(kv, p, c, off, d, widened, &fs, T, B);
        chunk_scores(S + (size_t)p * nl, nl, nv, Qt, k, fs, c, d, scale, B);
    }
    float* inv = Qt; /* the queries are spent: their first row holds the sums' inverses */
    for (int v = 0; v < nv; v++) {
        float npos[WV_LANES];
        for (int l = 0; l < WV_LANES; l++) {
            const int j = WV_LANES * v + l;
            npos[l] = j < n ? (float)(first_n_pos + j / n_q) : 0.0f; /* exact: positions < 2^24 */
        }
        wv_store(inv + WV_LANES * v, lane_softmax(S + WV_LANES * v, nl, n_all, wv_load(npos)));
    }
    for (int p = 0, c; p < n_all; p += c) {
        c = next_chunk(kv, p, n_all, &off, B);
        if (B) pack_row_pairs(S + (size_t)p * nl, nl, c);
        const void* v = chunk_values(kv, p, c, off, d, widened, &fs, T, B);
        weighted_sum_all(Ot, nl, nv, S + (size_t)p * nl, v, fs, B ? (c + 1) / 2 : c, d, p > 0, B);
    }
    transpose_outputs(out, row_stride, n_q, n, d, Ot, nl, inv);
}
#endif

/* Decode (attention_group, kernels.h), inlined into the pool's work (attention_task). */
ALWAYS_INLINE void attend_group(float* out, const float* q, int n_q, const KVRows* kv, int n_pos, int head_dim,
                                float scale, float* att) {
#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
    if (attention_simd(head_dim, kv->type)) {
        /* a group of more than ATTENTION_GROUP_PASS queries (none of Qwen3's) in several passes */
        for (int j = 0; j < n_q; j += ATTENTION_GROUP_PASS) {
            const int m = n_q - j < ATTENTION_GROUP_PASS ? n_q - j : ATTENTION_GROUP_PASS;
            float *o = out + (size_t)j * head_dim, *a = att + (size_t)j * n_pos;
            const float* qj = q + (size_t)j * head_dim;
            if (kv->type == KV_F16) attend_queries(o, qj, m, kv, n_pos, head_dim, scale, a, KV_F16);
            else if (kv->type == KV_Q8) attend_queries(o, qj, m, kv, n_pos, head_dim, scale, a, KV_Q8);
            else attend_queries(o, qj, m, kv, n_pos, head_dim, scale, a, KV_F32);
        }
        return;
    }
#endif
    attention_group_scalar(out, q, n_q, kv, n_pos, head_dim, scale, att);
}

/* Prefill attention (attention_rows, kernels.h; inlined into attention_task): the block's
 * n_rows * n_q queries together, the queries in the lanes (attend_lanes), so that each key and
 * value is read once for all of them (docs/design.md#attention-prefill). */
ALWAYS_INLINE void attend_block(float* out, const float* q, size_t row_stride, int n_q, int n_rows, const KVRows* kv,
                                int first_n_pos, int head_dim, float scale, float* att) {
#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
    if (attention_simd(head_dim, kv->type)) {
        const int n0 = first_n_pos, d = head_dim;
        if (kv->type == KV_F16) attend_lanes(out, q, row_stride, n_q, n_rows, kv, n0, d, scale, att, KV_F16);
        else if (kv->type == KV_Q8) attend_lanes(out, q, row_stride, n_q, n_rows, kv, n0, d, scale, att, KV_Q8);
        else attend_lanes(out, q, row_stride, n_q, n_rows, kv, n0, d, scale, att, KV_F32);
        return;
    }
#endif
    attention_rows_scalar(out, q, row_stride, n_q, n_rows, kv, first_n_pos, head_dim, scale, att);
}

void attention_rows(float* out, const float* q, size_t row_stride, int n_q, int n_rows, const KVRows* kv,
                    int first_n_pos, int head_dim, float scale, float* att) {
    attend_block(out, q, row_stride, n_q, n_rows, kv, first_n_pos, head_dim, scale, att);
}

/* The fast ops' attention as the pool's work (kernels/fast/fast.h). Decode (one row): task i takes
 * a contiguous range of kv heads, each with its GQA group of query heads. Prefill: task i takes the
 * (block of ATTENTION_BLOCK_ROWS rows, kv head) pairs i, i + n_tasks, ...: interleaved, since the
 * causal mask makes later rows longer. The kernels are inlined here, so that forward() reaches
 * their loops in three calls (docs/design.md#seam). */
void attention_task(void* ctx, int task, int thread) {
    const AttentionJob* job = ctx;
    const AttentionCall* a = job->a;
    const int K = a->n_kv_heads, G = a->n_heads / K, d = a->head_dim;
    const size_t row = (size_t)a->n_heads * d;
    float* scratch = job->scratch + (size_t)task * job->scratch_floats;
    if (a->rows == 1) {
        for (int kv = task * K / job->n_tasks; kv < (task + 1) * K / job->n_tasks; kv++) {
            const KVRows rows = attention_kv_head(a, kv);
            const size_t at = (size_t)kv * G * d;
            attend_group(a->out + at, a->q + at, G, &rows, a->p0 + 1, d, a->scale, scratch);
        }
        return;
    }
    const int n_blocks = (a->rows + ATTENTION_BLOCK_ROWS - 1) / ATTENTION_BLOCK_ROWS;
    for (int pair = task; pair < n_blocks * K; pair += job->n_tasks) {
        const int r = pair / K * ATTENTION_BLOCK_ROWS, kv = pair % K;
        const int n = a->rows - r < ATTENTION_BLOCK_ROWS ? a->rows - r : ATTENTION_BLOCK_ROWS;
        const KVRows rows = attention_kv_head(a, kv);
        const size_t at = (size_t)r * row + (size_t)kv * G * d;
        attend_block(a->out + at, a->q + at, row, G, n, &rows, a->p0 + r + 1, d, a->scale, scratch);
    }
}

/* One GQA group's decode, as the pool's work runs it (one task, one kv head): the kernel tests
 * check the same compiled kernels that forward() runs, and the file holds one copy of them. */
void attention_group(float* out, const float* q, int n_q, const KVRows* kv, int n_pos, int head_dim, float scale,
                     float* att) {
    const AttentionCall a = {.out = out, .q = q, .rows = 1, .p0 = n_pos - 1, .n_heads = n_q, .n_kv_heads = 1,
                             .head_dim = head_dim, .scale = scale, .kv = *kv};
    AttentionJob job = {.a = &a, .scratch = att, .n_tasks = 1};
    attention_task(&job, 0, 0);
}

size_t attention_rows_scratch(int n_q, int n_rows, int max_pos, int head_dim) {
    const size_t n = (size_t)n_q * (size_t)n_rows;
#if defined(KERNELS_AVX2) || defined(KERNELS_NEON)
    const size_t nl = (n + WV_LANES - 1) / WV_LANES * WV_LANES; /* attend_lanes: S, Qt, Ot and a chunk widened */
    return nl * ((size_t)max_pos + 2 * (size_t)head_dim) + ATTENTION_KEY_CHUNK * (size_t)head_dim;
#else
    return n * (size_t)max_pos;
#endif
}
