/* kernels.h: the numeric kernels of the forward pass, each a scalar reference (name_scalar) and,
 * right below it in its file, SIMD twins under the plain name (AVX2+FMA on x86-64, wider where the
 * CPU has AVX-512, VNNI or AVX-512 BF16: simd_math.h; NEON on arm64); -DKERNELS_SCALAR (make
 * SCALAR=1) compiles the references alone, the plain names then one-line calls of them (for the
 * tools and tests that use the plain names). Two differ: the products' twins are row-chunk kernels
 * in fast/x86/ and fast/arm/ that fast/matmul.c's plan picks, and attention's are fast/attention.c,
 * in fast builds only. forward() calls them through the ops of kernels/ops.h
 * (ops_reference.c, or fast/ops_fast.c on threads). tests/test_kernels.c checks every twin against
 * its reference, tests/test_ops.c every op.
 *
 * Weights are fp32, bf16, q8 or q4; activations are fp32, and every sum of products accumulates in
 * fp32 (in int32 inside a group where both factors are integers). matmul_scalar keeps the
 * activations in fp32; the SIMD q8 and q4 products quantise them to int8 per group first (as
 * llama.cpp's q8_0 does; fast/matmul_shared.h, quantize_rows), so they differ from it by that
 * rounding, which the tests bound (tests/test_matrix.h; end to end, tests/test_model.py). */
#ifndef KERNELS_H
#define KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef ALWAYS_INLINE
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#endif

typedef enum { WEIGHT_F32 = 0, WEIGHT_BF16 = 1, WEIGHT_Q8 = 2, WEIGHT_Q4 = 3 } WeightType;

/* A weight matrix [rows = out_features, cols = in_features] in the mapped checkpoint, in one of the
 * layouts model.h draws (the accessors below find a q8 or q4 row's scales and values). */
typedef struct {
    WeightType type;
    int rows, cols;
    int group_size;        /* WEIGHT_Q8 and WEIGHT_Q4 only */
    const void* data;      /* float*, uint16_t* (bf16), or the first row block (q8, q4) */
} Matrix;

#define Q8_BLOCK_ROWS 4
#define Q4_BLOCK_ROWS 8
#define Q4_GROUP 32        /* q4's only group size */
#define Q4_GROUP_BYTES (Q4_BLOCK_ROWS * (sizeof(uint16_t) + Q4_GROUP / 2)) /* one group of a q4 block: 144 */

static inline int quant_block_rows(WeightType type) {
    return type == WEIGHT_Q4 ? Q4_BLOCK_ROWS : Q8_BLOCK_ROWS;
}

/* Bytes that n values of a quantised row take: one each (q8), half a byte each (q4). */
static inline size_t quant_bytes(WeightType type, size_t n) {
    return type == WEIGHT_Q4 ? n / 2 : n;
}

/* Bytes of one group's scale: a float16. */
#define QUANT_SCALE_BYTES sizeof(uint16_t)

/* Bytes of one row block: its rows' G scales each and their values. */
static inline size_t quant_block_bytes(WeightType type, int cols, int group_size) {
    return (size_t)quant_block_rows(type) *
           (quant_bytes(type, (size_t)cols) + QUANT_SCALE_BYTES * (size_t)(cols / group_size));
}

/* The bytes of W as stored in the checkpoint (q8 / q4: whole row blocks, scales included, the last
 * block padded with zero rows). */
static inline uint64_t matrix_stored_bytes(const Matrix* W) {
    if (W->type == WEIGHT_F32 || W->type == WEIGHT_BF16)
        return (uint64_t)W->rows * (uint64_t)W->cols * (W->type == WEIGHT_F32 ? 4 : 2);
    const uint64_t br = (uint64_t)quant_block_rows(W->type);
    return ((uint64_t)W->rows + br - 1) / br * quant_block_bytes(W->type, W->cols, W->group_size);
}

/* q8: the G float16 scales of row r (half_to_float below). */
static inline const uint16_t* quant_scales(const Matrix* W, int r) {
    const char* block = (const char*)W->data +
                        (size_t)(r / Q8_BLOCK_ROWS) * quant_block_bytes(W->type, W->cols, W->group_size);
    return (const uint16_t*)block + (size_t)(r % Q8_BLOCK_ROWS) * (size_t)(W->cols / W->group_size);
}

/* q8: the group_size values of row r, group g; the next row of the same block follows group_size bytes later. */
static inline const uint8_t* quant_group(const Matrix* W, int r, int g) {
    const int gs = W->group_size, G = W->cols / gs;
    const char* block =
        (const char*)W->data + (size_t)(r / Q8_BLOCK_ROWS) * quant_block_bytes(W->type, W->cols, gs);
    return (const uint8_t*)(block + QUANT_SCALE_BYTES * Q8_BLOCK_ROWS * (size_t)G) +
           ((size_t)g * Q8_BLOCK_ROWS + (size_t)(r % Q8_BLOCK_ROWS)) * (size_t)gs;
}

/* q4: group g of the block that holds row r: 8 float16 scales (row r's at lane r % 8), then the
 * 128 bytes of values. */
static inline const uint8_t* q4_group(const Matrix* W, int r, int g) {
    return (const uint8_t*)W->data + ((size_t)(r / Q4_BLOCK_ROWS) * (size_t)(W->cols / Q4_GROUP) + (size_t)g) *
                                         Q4_GROUP_BYTES;
}

/* IEEE 754 binary16 -> float (exact: every half is a float). q8's and q4's scales are stored so,
 * as llama.cpp's q8_0 and q4_0 store their own (export.py never writes an infinity or a NaN),
 * and so is the KV cache with `--kv-cache f16` (float_to_half below). */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 31, man = h & 0x3FFu;
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in a float */
        const float small = (float)man * 0x1p-24f;
        return sign ? -small : small;
    }
    const uint32_t bits = sign | (exp == 31 ? 0x7F800000u : (exp + 127 - 15) << 23) | man << 13;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float q4_scale(const Matrix* W, int r, int g) {
    uint16_t h;
    memcpy(&h, q4_group(W, r, g) + sizeof(uint16_t) * (size_t)(r % Q4_BLOCK_ROWS), sizeof h);
    return half_to_float(h);
}

/* q of row r, column c (-8 .. 7). */
static inline int q4_value(const Matrix* W, int r, int c) {
    const int k = c % Q4_GROUP;
    const uint8_t b = q4_group(W, r, c / Q4_GROUP)[Q4_BLOCK_ROWS * sizeof(uint16_t) + 32 * ((k % 16) / 4) +
                                                   4 * (r % Q4_BLOCK_ROWS) + k % 4];
    return (k < 16 ? b & 15 : b >> 4) - 8;
}

/* out[c] = W[row][c] for c < W->cols, as fp32 (dequantised): the embedding lookup. */
void matrix_row(float* out, const Matrix* W, int row);

/* RMSNorm (QWEN3.md 2.1): out[i] = w[i] * (x[i] * 1/sqrt(mean(x^2) + eps)), the mean over the n
 * values of x: normalise, then multiply by the weight as stored (norm.c says why in this order).
 * n is D for the pre-attention, pre-MLP and final norms, head_dim for QK-Norm. out may equal x. */
void rmsnorm(float* out, const float* x, const float* w, int n, float eps);

/* RoPE with rotate-half pairing (QWEN3.md 2.4) on n_heads head vectors of head_dim values laid
 * out one after another: for i < head_dim/2, (x[i], x[i+head_dim/2]) is rotated by the angle whose
 * cos and sin are cos_t[i], sin_t[i] (the tables of one position). */
void rope(float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t);

/* SwiGLU's gate (QWEN3.md 2.2 step 2.11): gate[i] = silu(gate[i]) * up[i], silu(z) = z / (1 + e^-z). */
void swiglu(float* gate, const float* up, int n);

/* The KV cache's element type: fp32 (what the reference computes), IEEE half (`--kv-cache f16`:
 * half the bytes attention reads, each value rounded to 11 significant bits), or q8 (`--kv-cache
 * q8`): a cached row (one position of one kv head) is head_dim int8 values q, then one float16
 * scale s per KV_Q8_GROUP values, s = max|x| / 127 and q = round(x / s) (KV_Q8_GROUP needs to
 * divide head_dim): the value is s * q, exact in fp32. Every sum stays fp32. */
typedef enum { KV_F32 = 0, KV_F16 = 1, KV_Q8 = 2 } KVType;
#define KV_Q8_GROUP 16

/* Bytes of one element (q8: one value's byte), and elements of one cached row of head_dim values. */
static inline size_t kv_elem_size(KVType t) { return t == KV_F32 ? 4 : t == KV_F16 ? 2 : 1; }
static inline size_t kv_row_elems(KVType t, int head_dim) {
    return t == KV_Q8 ? (size_t)head_dim + (size_t)head_dim / KV_Q8_GROUP * 2 : (size_t)head_dim;
}

/* One kv head's cached keys and values. The cache holds positions in blocks (model.c, the KV
 * cache): position t's key is at keys + (t / block_len) * block_stride + (t % block_len) * stride,
 * its value at the same offset from values (all in elements of `type`). One block as long as the
 * context (block_len >= n_pos) is a plain array of rows. */
typedef struct {
    const void* keys;
    const void* values;
    int stride;          /* from one position to the next within a block */
    int block_len;       /* positions per block */
    size_t block_stride; /* from one block to the next */
    KVType type;
} KVRows;

static inline size_t kv_row_offset(const KVRows* kv, int t) {
    return (size_t)(t / kv->block_len) * kv->block_stride + (size_t)(t % kv->block_len) * (size_t)kv->stride;
}

/* Where a q8 row of d values keeps the scale of value i (bytes from its start), and that scale. */
static inline size_t kv_q8_scale_at(int d, int i) { return (size_t)d + 2 * (size_t)(i / KV_Q8_GROUP); }
static inline uint16_t kv_q8_scale(const void* row, int d, int i) {
    uint16_t s;
    memcpy(&s, (const char*)row + kv_q8_scale_at(d, i), sizeof s);
    return s;
}

/* Value i of the row of head_dim d values at element `row` of a cache array, as fp32. */
static inline float kv_value(const void* base, size_t row, int i, int d, KVType t) {
    if (t == KV_F32) return ((const float*)base)[row + i];
    if (t == KV_F16) return half_to_float(((const uint16_t*)base)[row + i]);
    const int8_t* q = (const int8_t*)base + row;
    return (float)q[i] * half_to_float(kv_q8_scale(q, d, i));
}

/* The q8 cache's store of one row (KV_Q8 above): d values of x into row's d + d / 8 bytes (SIMD: the same). */
void kv_quantize_row(int8_t* row, const float* x, int d);

/* Whether attention_group and attention_rows run SIMD kernels for this head_dim and cache type or
 * the scalar reference: in SIMD builds head_dim a multiple of 16 (every Qwen3's 128, the shipped
 * model's 48), and halves where the build widens them in registers. */
int attention_simd(int head_dim, KVType type);

#if !defined(KERNELS_SCALAR) /* the fast builds' (the reference build has attention_group_scalar) */
/* Attention of the n_q query heads of one GQA group over their kv head's n_pos cached positions
 * (QWEN3.md 2.2 step 2.7, 2.5): for each query j (q + j * head_dim, its output at out + j * head_dim)
 * s[t] = (q_j . k_t) * scale, a = softmax(s), out_j = sum_t a[t] v_t. att is scratch of n_q * n_pos floats. */
void attention_group(float* out, const float* q, int n_q, const KVRows* kv, int n_pos, int head_dim, float scale,
                     float* att);

/* Causal attention of n_rows consecutive batch rows for one GQA group (prefill): row r's n_q query
 * heads are at q + r * row_stride (head j at + j * head_dim), its outputs at out + r * row_stride,
 * and it sees positions 0 .. first_n_pos + r - 1 of the kv head. Each query gets attention_group's
 * result up to float rounding (its sums run in another order), and the same bits whichever rows
 * share its block. att is scratch of attention_rows_scratch(n_q, n_rows, first_n_pos + n_rows - 1,
 * head_dim) floats (or more): the scores of all the block's queries and, in SIMD builds, the
 * queries and outputs transposed. */
void attention_rows(float* out, const float* q, size_t row_stride, int n_q, int n_rows, const KVRows* kv,
                    int first_n_pos, int head_dim, float scale, float* att);
size_t attention_rows_scratch(int n_q, int n_rows, int max_pos, int head_dim);

/* In-place softmax, max-subtracted, fp32. */
void softmax(float* x, int n);
#endif

/* The references: what the reference build runs (ops_reference.c), and what the tests check each
 * twin against. */
void matmul_scalar(float* out, const float* x, const Matrix* W, int n);
void matmul_scalar_rows(float* out, const float* x, const Matrix* W, int n, int r0, int r1); /* rows r0 .. r1-1 */
void rmsnorm_scalar(float* out, const float* x, const float* w, int n, float eps);
/* RMSNorm's gradients for n_rows vectors (norm.c): dx = dL/dx written, dw += dL/dw. */
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int n_rows, int n,
                      float eps);
void rope_scalar(float* x, int n_heads, int head_dim, const float* cos_t, const float* sin_t);
void softmax_scalar(float* x, int n);
void swiglu_scalar(float* gate, const float* up, int n);
/* attention_group's arithmetic (above): one GQA group's n_q query heads at q (head j at q + j *
 * head_dim, its output at out + j * head_dim) over n_pos cached positions; att: n_q * n_pos floats. */
void attention_group_scalar(float* out, const float* q, int n_q, const KVRows* kv, int n_pos, int head_dim,
                            float scale, float* att);
void attention_rows_scalar(float* out, const float* q, size_t row_stride, int n_q, int n_rows, const KVRows* kv,
                           int first_n_pos, int head_dim, float scale, float* att);
void float_to_half_row_scalar(uint16_t* out, const float* x, int n);
void kv_quantize_row_scalar(int8_t* row, const float* x, int d);

/* float -> IEEE 754 binary16, rounded to nearest, ties to even, as F16C's vcvtps2ph and NEON's
 * fcvtn do (tests/test_kernels.c checks it against them and against the definition): the KV
 * cache's fp16 elements (`--kv-cache f16`), read back with half_to_float above. */
static inline uint16_t float_to_half(float f) {
    union { float f; uint32_t u; } v = {f};
    const uint32_t sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffff;
    if (a > 0x7f800000) return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff)); /* NaN, quiet */
    if (a >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* >= 65520 (and inf): rounds to inf */
    if (a < 0x38800000) { /* below 2^-14: a subnormal half or zero, round(|f| * 2^24) */
        v.u = a;
        v.f = v.f * 0x1p24f + 0x1p23f; /* the sum rounds to an integer, ties to even */
        return (uint16_t)(sign | (v.u - 0x4b000000));
    }
    uint32_t r = a - 0x38000000;       /* rebias the exponent from 127 to 15 */
    r += 0xfff + ((r >> 13) & 1);      /* round the 13 dropped bits, ties to even */
    return (uint16_t)(sign | (r >> 13)); /* a carry into the exponent is the right result */
}

/* The fp16 KV cache's store: out[i] = float_to_half(x[i]) (F16C or NEON where present, the same bits). */
void float_to_half_row(uint16_t* out, const float* x, int n);

/* bf16 -> fp32: bf16 is the top half of an fp32 (QWEN3.md 2.6). */
static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

#endif
