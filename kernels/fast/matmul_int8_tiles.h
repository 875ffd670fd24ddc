/* matmul_int8_tiles.h: the loops over row and token tiles of a prompt's q8 product, shared by
 * the instruction sets' twins. Included once, at the end of x86/matmul_int8.c or
 * arm/matmul_int8.c (whichever the build targets), after the twin's tile_qi and rows_q4, which
 * have the same names and shapes on each target. */
#ifndef MATMUL_INT8_TILES_H
#define MATMUL_INT8_TILES_H

/* A prompt's q8 or q4 weights x int8 activations for rows [r0, r1): AMX's whole tiles first, then
 * the packed panels, then the format's tiles for what is left: tile_q4's, or tile_qi's with a
 * block of tokens in L2 while every row tile of the chunk uses it. (One token goes straight to
 * rows_qi_n1 or rows_q4.) */
void rows_qi(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    const int8_t* xq = pr->xq;
    const float* xsc = pr->xs;
    const int32_t* xsum = pr->xsum;
    const int n = pr->n;
    int ra = r0; /* AMX did every token of rows [r0, ra) */
#if defined(KERNELS_AMX)
    if (pr->plan.amx) ra = amx_chunk(mt, out, xq, xsc, W, n, r0, r1);
#endif
    int rp = ra; /* the panels did every token of rows [ra, rp) */
#if defined(KERNELS_AVX2)
    if (pr->plan.qi_packed) rp = rows_qi_packed(mt, out, xq, xsc, pr->xgsum, W, n, ra, r1);
#endif
    if (W->type == WEIGHT_Q4) {
        rows_q4(mt, pr, out, W, rp, r1);
        return;
    }
    /* q8: the rest in tiles of Q8_TILE_ROWS rows x Q8_TILE_TOKENS tokens */
    const int C = W->cols, G = C / W->group_size;
    const int tb = token_block((size_t)C);
    float* ws = mt->scales; /* the row block's scales as floats */
    for (int t0 = 0; t0 < n; t0 += tb) {
        int t1 = t0 + tb < n ? t0 + tb : n;
        int r = rp;
        for (; r + 4 <= r1; r += 4) {
            /* the first tile over this block brings the next one into L2, as in rows_float_nn
             * (docs/design.md#short-prompt-prefetch) */
            const char* next = t0 == 0 && r + 8 <= W->rows ? (const char*)quant_scales(W, r + 4) : NULL;
            q8_scales_float(ws, W, r, 4);
            int t = t0;
            for (; t + Q8_TILE_TOKENS <= t1; t += Q8_TILE_TOKENS)
                for (int h = 0; h < 4; h += Q8_TILE_ROWS, next = NULL)
                    tile_qi(out, xq, xsc, xsum, W, ws + (size_t)h * G, r + h, t, Q8_TILE_ROWS, Q8_TILE_TOKENS, next);
            for (; t < t1; t++, next = NULL) tile_qi(out, xq, xsc, xsum, W, ws, r, t, 4, 1, next);
        }
        for (; r < r1; r++) {
            q8_scales_float(ws, W, r, 1);
            int t = t0;
            for (; t + 4 <= t1; t += 4) tile_qi(out, xq, xsc, xsum, W, ws, r, t, 1, 4, NULL);
            for (; t < t1; t++) tile_qi(out, xq, xsc, xsum, W, ws, r, t, 1, 1, NULL);
        }
    }
}

#endif /* MATMUL_INT8_TILES_H */
