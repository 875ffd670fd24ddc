/* matmul_float_tiles.h: the loops over row and token tiles of the f32 and bf16 products, included
 * once, at the end of x86/matmul_float.c or arm/matmul_float.c, after the twin's tile_float,
 * rows_f32_n1 and rows_float_n1 (the same names and shapes on each target). */
#ifndef MATMUL_FLOAT_TILES_H
#define MATMUL_FLOAT_TILES_H

/* Token-blocked matrix-matrix product for rows [r0, r1): the activation block (tb tokens) stays in
 * L2 while every weight tile of the chunk is used against it. On x86, where the plan says
 * (packed), whole panels of 16 rows first (from a multiple of 16: the driver's chunks are). */
ALWAYS_INLINE void rows_float_nn(const MatmulThread* mt, float* out, const float* x, const Matrix* W, WeightType type,
                                int n, int packed, int r0, int r1) {
#if defined(KERNELS_AVX2)
    if (packed) {
        for (int np; (np = row_tiles_next(r0, r1, FLOAT_MAX_PANELS)) > 0; r0 += np * FLOAT_PANEL_ROWS)
            rows_float_packed(out, x, W, type, n, r0, np, mt->float_pack);
    }
#else
    (void)mt, (void)packed;
#endif
    const int C = W->cols;
    const int tb = token_block((size_t)C * sizeof(float));
    for (int t0 = 0; t0 < n; t0 += tb) {
        int t1 = t0 + tb < n ? t0 + tb : n;
        int r = r0;
        for (; r + 4 <= r1; r += 4) {
            /* While the first token block's first tile reads these 4 rows from memory, it brings
             * the next 4 into L2, so that their read overlaps this tile's arithmetic; a few tokens
             * (below the panels) are otherwise memory-latency-bound on the first pass and compute-
             * bound on the others (docs/design.md#short-prompt-prefetch). */
            const void* next = t0 == 0 && r + 8 <= W->rows ? row_ptr(W, r + 4) : NULL;
            int t = t0;
            for (; t + TILE_TOKENS <= t1; t += TILE_TOKENS, next = NULL)
                tile_float(out, x, W, type, r, t, 4, TILE_TOKENS, next);
            for (; t < t1; t++, next = NULL) tile_float(out, x, W, type, r, t, 4, 1, next);
        }
        for (; r < r1; r++) {
            int t = t0;
            for (; t + 4 <= t1; t += 4) tile_float(out, x, W, type, r, t, 1, 4, NULL);
            for (; t < t1; t++) tile_float(out, x, W, type, r, t, 1, 1, NULL);
        }
    }
}

void rows_f32(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    if (pr->n == 1) rows_f32_n1(mt, out, pr->x, W, r0, r1);
    else rows_float_nn(mt, out, pr->x, W, WEIGHT_F32, pr->n, pr->plan.float_packed, r0, r1);
}
void rows_bf16(const MatmulThread* mt, const Product* pr, float* out, const Matrix* W, int r0, int r1) {
    if (pr->n == 1) rows_float_n1(out, pr->x, W, WEIGHT_BF16, r0, r1);
    else rows_float_nn(mt, out, pr->x, W, WEIGHT_BF16, pr->n, pr->plan.float_packed, r0, r1);
}

#endif /* MATMUL_FLOAT_TILES_H */
