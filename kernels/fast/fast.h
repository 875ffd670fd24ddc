/* fast.h: the fast engine behind the seam (kernels/ops.h): a kernel context with its thread pool
 * (threads.c) and the product driver that plans which SIMD twin multiplies each matrix
 * (matmul.c). Only the fast ops (ops_fast.c), the fast kernels and their tests include it; the
 * reference build (make SCALAR=1) compiles none of this folder. */
#ifndef FAST_H
#define FAST_H

#include "kernels/kernels.h"
#include "kernels/ops.h"

/* A kernel context: the thread pool, the matmul scratch, decode's prefetch plan and the prefill
 * switches. The fast ops own one each (ops_fast.c); the per-vector kernels (rmsnorm, rope,
 * softmax, attention_group, ...) need none. Two contexts share nothing, so two models in one
 * process run and free independently. One context serves one calling thread at a time. */
typedef struct Kernels Kernels;

/* n_threads threads in all (the caller's included; <= 0: kernels_available_cpus(); at most 256),
 * scratch for matmuls of up to max_batch rows (tokens) and max_cols input columns. NULL when out
 * of memory. */
Kernels* kernels_new(int n_threads, int max_batch, int max_cols);
void kernels_free(Kernels* k); /* stops its threads and frees its scratch; NULL is fine */
int kernels_threads(const Kernels* k);
int kernels_available_cpus(void); /* the CPUs this process may run on: the default thread count */
/* Runs k's kernels on n_threads from now on (1 .. the count kernels_new started, which sized the
 * callers' per-thread scratch): the bench compares thread counts in one process. Returns the count. */
int kernels_set_threads(Kernels* k, int n_threads);
const char* kernels_simd_name(const Kernels* k); /* "avx2[+int8]", "avx2+avx512[+vnni][+bf16][+amx]", "neon" or "scalar" */
/* Decode's software prefetch plan (fast/matmul.c): in an x86 build "mid", or "near" / "mid" as
 * KERNELS_PREFETCH says, or after measure_prefetch the distance it kept ("q8 6144 B, measured");
 * "none" in the others. */
const char* kernels_prefetch_plan(const Kernels* k);
/* Times decode's prefetch distances for spec's weight format on spec->weights with o's own
 * product on one of its threads and keeps the quickest; returns the plan's new name, or NULL
 * where nothing was timed (no AVX2, KERNELS_PREFETCH set, a decode kernel without prefetch: f32,
 * bf16 of odd widths or the scalar products, a section too small, out of memory). */
const char* measure_prefetch(const Ops* o, const OpsSpec* spec);
/* The prefill paths; each setter (for tests of both paths) returns its getter's answer.
 * kernels_amx: 1 when q8 and q4 prefill (with AMX-BF16 also bf16 with bf16 activations) run on
 * AMX tiles: an x86 build for a CPU with AMX, on a Linux that grants the tile state, without
 * KERNELS_AMX=0; the setter turns AMX off or back on where kernels_new was granted it.
 * kernels_float_panels: 1 when f32 and bf16 prefill take packed panels from their thresholds on
 * (x86 builds; off by default with AVX-512 on Zen 4, or as KERNELS_FLOAT_PANELS=0 or 1 says). */
int kernels_amx(const Kernels* k);
int kernels_set_amx(Kernels* k, int on);
int kernels_float_panels(const Kernels* k);
int kernels_set_float_panels(Kernels* k, int on);

/* Which kernel a product of n tokens through W alone runs, as plan_product (matmul.c) chooses it,
 * for the bench (cli/bench_plan.c): text gets the kernel's name, the paths inside it that the plan
 * takes, the activations it reads and decode's prefetch distance ("rows_qi (q8 panels, int8
 * activations)"). Returns 1 where the product runs on AMX tiles, which the bench's compute roof
 * does not time. */
int kernels_describe_product(const Kernels* k, const Matrix* W, int n, char* text, size_t len);

/* --bf16-activations: prefill (n > 1) with bf16 weights multiplies them by the activations
 * rounded to bf16 (up to 2^-8 relative error each), with the CPU's bf16 dot product, where the
 * build has one (AVX-512 BF16): faster, and the precision llama.cpp uses for bf16 weights. Off
 * by default (fp32 activations). Returns 1 if now on, 0 if off or not available. No scalar
 * twin: builds without the instruction ignore the option, and tests/test_kernels.c checks the
 * kernel against the exact sum over the rounded activations. */
int kernels_set_bf16_activations(Kernels* k, int on);

/* The fast ops' matmul (kernels/ops.h): outs[m][t*Ws[m]->rows + r] = sum_c Ws[m][r][c] * x[t*cols + c]  for m < n_mats, t < n, r < rows.
 * (y = W x for each of n input rows: a matrix-vector product when n == 1, a matrix-matrix
 * product when n > 1.) The matrices listed read the same input x (the q/k/v projections,
 * gate/up; one matrix elsewhere) and have the same cols and weight type: they go to the threads
 * in one dispatch, and x is prepared (quantised for q8 and q4) once for all of them. Threads split
 * the rows; the result does not depend on n_mats or on the thread count. */
void matmul(const Ops* o, float* const* outs, const float* x, const Matrix* const* Ws, int n_mats, int n);
void matmul_segments(const Ops* o, float* out, const float* x, const Matrix* const* Ws, const int* ns,
                     int n_mats); /* ops.h */

/* The fast ops' attention (ops.h), as the pool's work: parallel_for(k, n_tasks, attention_task, &job)
 * runs one layer's attention, each task on its share of the kv heads with its own scratch
 * (scratch + task * scratch_floats, attention_rows_scratch(group, ATTENTION_BLOCK_ROWS, ...)
 * floats). Prefill goes in blocks of ATTENTION_BLOCK_ROWS rows per kv head: each block reads its
 * kv head's cache once, so bigger blocks read it fewer times (docs/design.md#attention-prefill). */
#define ATTENTION_BLOCK_ROWS 32
typedef struct {
    const AttentionCall* a;
    float* scratch;
    size_t scratch_floats;
    int n_tasks;
} AttentionJob;
void attention_task(void* job, int task, int thread); /* fast/attention.c */

/* The kernel context of fast ops (ops_fast.c), which matmul and the tests reach through the table. */
Kernels* ops_kernels(const Ops* o);

/* Runs fn(ctx, i, thread) for i in [0, n) on k's threads (the caller's thread included) and
 * returns when all are done; thread is the index of the thread running the item (0: the caller,
 * 1 .. kernels_threads(k) - 1: the workers), for per-thread scratch. Idle threads spin for at
 * most KERNELS_SPIN_US (200 us by default; not at all while another process competes for the
 * cores), then sleep: see threads.c. A call from inside an item of k (nested) runs its items
 * serially on that thread. */
void parallel_for(Kernels* k, int n, void (*fn)(void* ctx, int i, int thread), void* ctx);

/* Runs fn(ctx, begin, end) over [0, n) cut into one contiguous span per thread of k. The cuts fall
 * on multiples of align, so a kernel whose vector body and scalar tail depend on where a span
 * starts gives the same bits as one call over [0, n). */
void parallel_spans(Kernels* k, int n, int align, void (*fn)(void* ctx, int begin, int end), void* ctx);

/* matmul.c's scratch (activation quantisation, each thread's rows and panels), the prefetch plan
 * and the AMX and bf16-activation switches of one kernel context, made by kernels_new (threads.c)
 * and reached through kernels_scratch. NULL when out of memory. */
typedef struct MatmulScratch MatmulScratch;
MatmulScratch* matmul_scratch_new(int max_threads, int max_batch, int max_cols);
void matmul_scratch_free(MatmulScratch* s);
MatmulScratch* kernels_scratch(const Kernels* k);

#endif
