/* x86/matmul_amx.c: q8 and q4 prefill on AMX tiles, built where the compiler targets AMX-TILE and
 * AMX-INT8 (-march=native on such a CPU). rows_qi (x86/matmul_int8.c) hands it a chunk's whole
 * tiles of 16 rows (amx_chunk) and does the rest. */
#include "../matmul_shared.h"

#if defined(KERNELS_AMX)
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h> /* arch_prctl: the tile state's permission */
#include <unistd.h>

/* AMX (Intel Sapphire Rapids and later): eight tile registers of up to 16 rows x 64 bytes, and
 * TDPBSSD, which adds the products of a 16 x K int8 tile A and a K x 16 int8 tile B into a
 * 16 x 16 int32 tile C in one instruction. K is one group's columns (q4: 32), or 64 of them (q8,
 * whose groups are a multiple of 64: S = gs / 64 products per group). A is 16 tokens'
 * activations of those columns, read straight from xq (row stride C): the tokens, not the
 * weights' 4-row blocks, are A's rows, since a product of 4-row tiles costs most of one of
 * 16-row tiles (docs/design.md#amx). B's row k holds, for each of 16 output rows, that row's
 * columns 4k .. 4k+3, so each chunk of rows is repacked once into the thread's scratch
 * (amx_pack: q8's 16 x 16 four-byte words of a group transposed; q4's row lanes are that layout
 * already, two 8-row blocks side by side, the nibbles widened to q = nibble - 8), with the 16
 * rows' scales of each group as floats, and every tile of 16 tokens meets it.
 * Each C is the exact int32 sum of one (token, row, group), as the VNNI kernels get it, turned
 * into fp32 by the group's own two scales (acc += float(C) x w_scale x x_scale; tile_qi's two
 * halves of 4 lanes per group round differently). Storing C and that step (16 x 3 vector
 * instructions per tile), not the product, are the bound (amx_rows). A chunk's rows after its
 * last 16 take the q8 panels or tile_qi (q4: tile_q4), which scale each group as amx_rows does. */

/* int8 columns per tile product: a q4 group, or 64 of a q8 group. */
static inline int amx_k(const Matrix* W) { return W->type == WEIGHT_Q4 ? Q4_GROUP : 64; }

/* The thread's int32 tiles and scales, after its repacked rows in mt->amx_wt (amx_thread_bytes). */
static inline int32_t* thread_amx_c(const MatmulThread* mt) {
    return (int32_t*)(mt->amx_wt + (size_t)AMX_MAX_TILES * 16 * (size_t)mt->xp_stride);
}
static inline float* thread_amx_ws(const MatmulThread* mt) {
    return (float*)(mt->amx_wt + (size_t)(AMX_MAX_TILES * 16 + 32) * (size_t)mt->xp_stride);
}

#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux (5.16+) hands out the tile data state on request */
#define XFEATURE_XTILEDATA 18

/* The kernel's permission for this process to use the tile registers, asked once. */
int amx_request(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* Palette 1: tiles 0-1 A (T tokens x K bytes), 2-3 B (K / 4 rows x 64 bytes), 4-7 C (T x 16
 * int32); T = 16 but for a prompt's last n % 16 tokens. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AmxConfig;

void amx_configure(int K, int T) {
    AmxConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t == 2 || t == 3 ? (uint8_t)(K / 4) : (uint8_t)T;
        cfg.colsb[t] = t < 2 ? (uint16_t)K : 64;
    }
    /* gcc 12 does not see that ldtilecfg reads cfg: out of line (two callers) it drops the loop's
     * stores as dead and the first tile instruction meets unconfigured tiles (SIGILL); the empty
     * asm with cfg as a memory input keeps the stores (docs/design.md#amx) */
    __asm__ volatile("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* Rows [r0, r0 + 16 * ntiles) repacked for amx_rows: B tile (i, g, s) (row tile i, group g,
 * product s of the group) at wt + ((i * G + g) * S + s) * 16 * K; the 16 rows' scales of group g
 * as floats at ws + (i * G + g) * 16. */
static void amx_pack(uint8_t* wt, float* ws, const Matrix* W, int r0, int ntiles) {
    const int gs = W->group_size, G = W->cols / gs, K = amx_k(W), S = gs / K;
    for (int i = 0; i < ntiles; i++) {
        const int r = r0 + i * AMX_ROWS;
        for (int g = 0; g < G; g++) {
            float* wsg = ws + (size_t)(i * G + g) * AMX_ROWS;
            if (W->type == WEIGHT_Q4) { /* B rows v and 4 + v: the low and the high nibbles of quarter v of both blocks */
                const __m512i m = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8);
                const uint8_t* b0 = q4_group(W, r, g);
                const uint8_t* b1 = q4_group(W, r + Q4_BLOCK_ROWS, g);
                uint8_t* dst = wt + (size_t)(i * G + g) * 16 * K;
                for (int v = 0; v < 4; v++) {
                    const size_t q = Q4_BLOCK_ROWS * sizeof(uint16_t) + 32 * (size_t)v;
                    const __m512i x = _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(b0 + q))),
                        _mm256_loadu_si256((const __m256i*)(b1 + q)), 1);
                    _mm512_storeu_si512((void*)(dst + 64 * v), _mm512_sub_epi8(_mm512_and_si512(x, m), eight));
                    _mm512_storeu_si512((void*)(dst + 64 * (4 + v)),
                                        _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(x, 4), m), eight));
                }
                for (int n = 0; n < AMX_ROWS; n++) wsg[n] = q4_scale(W, r + n, g);
                continue;
            }
            for (int s = 0; s < S; s++) {
                __m512i v[16];
                for (int n = 0; n < AMX_ROWS; n++)
                    v[n] = _mm512_loadu_si512((const void*)(quant_group(W, r + n, g) + s * K));
                transpose16_epi32(v);
                uint8_t* dst = wt + ((size_t)(i * G + g) * S + s) * 16 * K;
                for (int k = 0; k < 16; k++) _mm512_storeu_si512((void*)(dst + 64 * k), v[k]);
            }
            for (int n = 0; n < AMX_ROWS; n++) wsg[n] = scale1(quant_scales(W, r + n)[g]);
        }
    }
}

/* One C tile: the products of a group's S sub-tiles (A from the tokens' activations, row stride
 * C; B from the repacked weights), stored to c. Tile numbers must be constants: the instructions
 * have no register operand for them. */
#define AMX_GROUP(TA, TB, TC, a, b, S, K, stride, c)                            \
    do {                                                                        \
        _tile_zero(TC);                                                         \
        for (int s_ = 0; s_ < (S); s_++) {                                      \
            _tile_loadd(TA, (a) + s_ * (K), (stride));                          \
            _tile_loadd(TB, (b) + (size_t)s_ * 16 * (K), 64);                   \
            _tile_dpbssd(TC, TA, TB);                                           \
        }                                                                       \
        _tile_stored(TC, (c), 64);                                              \
    } while (0)

/* out[t][r] for tokens t < T of one tile and its 16 rows r (row stride R) from the group tiles in
 * cbuf: acc[j], token j's 16 rows, += float(C row j) x the rows' weight scales x token j's scale.
 * T is AMX_ROWS but for a prompt's last tile. */
ALWAYS_INLINE void amx_scale_tile(float* o, const int32_t* cbuf, const float* wsi, const float* xs, int G, int R,
                                  int T) {
    __m512 acc[AMX_ROWS];
#pragma GCC unroll 16
    for (int j = 0; j < AMX_ROWS; j++) acc[j] = _mm512_setzero_ps(); /* all 16: with T only, gcc warns of acc[T..] */
    for (int g = 0; g < G; g++) {
        const int32_t* c = cbuf + (size_t)g * 256;
        const __m512 wsv = _mm512_loadu_ps(wsi + (size_t)g * AMX_ROWS);
#pragma GCC unroll 16
        for (int j = 0; j < T; j++) {
            const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void*)(c + 16 * j))), wsv);
            acc[j] = _mm512_fmadd_ps(p, _mm512_set1_ps(xs[(size_t)j * G + g]), acc[j]);
        }
    }
#pragma GCC unroll 16
    for (int j = 0; j < T; j++) _mm512_storeu_ps(o + (size_t)j * R, acc[j]);
}

/* Tokens [0, n) x rows [r0, r0 + 16 * ntiles) of out, from the repacked wt, ws. Per tile of 16
 * tokens x 16 rows, every group's int32 tile goes to cbuf first (G x 1 KB; four C tiles in turn,
 * so that a product does not wait for the store of the one before), then the scaling runs in
 * plain AVX-512 with the 16 accumulators in registers (gcc would keep them on the stack between
 * the tile instructions, asm with a memory clobber): faster than scaling each group's tile
 * between the products, and than two token tiles x two row tiles per step (docs/design.md#amx).
 * The last n % 16 tokens take a tile with A and C configured to that many rows (the instructions
 * then read and write only those): the same products and scaling, so each token gets the bits of
 * a full tile, and of the q8 panels and tile_q4. */
static void amx_rows(float* out, const int8_t* xq, const float* xsc, const Matrix* W, const uint8_t* wt,
                     const float* ws, int32_t* cbuf, int n, int r0, int ntiles) {
    const int C = W->cols, R = W->rows, gs = W->group_size, G = C / gs, K = amx_k(W), S = gs / K;
    const size_t gb = (size_t)S * 16 * K; /* repacked bytes per group */
    __asm__ volatile("" ::: "memory");    /* amx_pack's stores before the tile loads read them */
    amx_configure(K, AMX_ROWS);
    for (int t = 0; t < n; t += AMX_ROWS) {
        const int T = n - t < AMX_ROWS ? n - t : AMX_ROWS;
        if (T < AMX_ROWS) amx_configure(K, T);
        const int8_t* xt = xq + (size_t)t * C;
        const float* xs = xsc + (size_t)t * G;
        for (int i = 0; i < ntiles; i++) {
            const uint8_t* wi = wt + (size_t)i * G * gb;
            int g = 0;
            for (; g + 4 <= G; g += 4) {
                AMX_GROUP(0, 2, 4, xt + (size_t)g * gs, wi + g * gb, S, K, C, cbuf + (size_t)g * 256);
                AMX_GROUP(1, 3, 5, xt + (size_t)(g + 1) * gs, wi + (g + 1) * gb, S, K, C, cbuf + (size_t)(g + 1) * 256);
                AMX_GROUP(0, 2, 6, xt + (size_t)(g + 2) * gs, wi + (g + 2) * gb, S, K, C, cbuf + (size_t)(g + 2) * 256);
                AMX_GROUP(1, 3, 7, xt + (size_t)(g + 3) * gs, wi + (g + 3) * gb, S, K, C, cbuf + (size_t)(g + 3) * 256);
            }
            for (; g < G; g++) AMX_GROUP(0, 2, 4, xt + (size_t)g * gs, wi + g * gb, S, K, C, cbuf + (size_t)g * 256);
            float* o = out + (size_t)t * R + r0 + i * AMX_ROWS;
            const float* wsi = ws + (size_t)i * G * AMX_ROWS;
            if (T == AMX_ROWS) amx_scale_tile(o, cbuf, wsi, xs, G, R, AMX_ROWS); /* a constant: registers */
            else amx_scale_tile(o, cbuf, wsi, xs, G, R, T);
        }
    }
    _tile_release();
}

/* Whole tiles of 16 rows (from r0, a multiple of 16: the driver's chunks are) x all n tokens on AMX,
 * in pieces of at most AMX_MAX_TILES row tiles (the thread's scratch). Returns the first row not
 * done; the caller does the rest (fewer than 16 rows). */
int amx_chunk(const MatmulThread* mt, float* out, const int8_t* xq, const float* xsc, const Matrix* W, int n, int r0,
              int r1) {
    int r = r0;
    for (int tiles; (tiles = row_tiles_next(r, r1, AMX_MAX_TILES)) > 0; r += tiles * AMX_ROWS) {
        amx_pack(mt->amx_wt, thread_amx_ws(mt), W, r, tiles);
        amx_rows(out, xq, xsc, W, mt->amx_wt, thread_amx_ws(mt), thread_amx_c(mt), n, r, tiles);
    }
    return r;
}
#endif /* KERNELS_AMX */
