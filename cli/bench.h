/* bench.h: `./run MODEL -m bench`, a llama-bench-like speed test of the loaded model.
 *
 *   --bench-prompt N   prefill test ppN: N prompt tokens, forward()'s chunks at a time (default 512)
 *   --bench-gen N      decode test tgN: N tokens one at a time (default 128)
 *   --bench-depth N    positions already in the KV cache when each test starts (default 0)
 *   --bench-reps N     timed repetitions of each test after one warm-up (default 5)
 *   --threads N,M,...  the thread counts to measure, each with its own warm-up and roof, taking
 *                      turns rep by rep (default: the kernels' count, which must be the largest)
 *   --json             one JSON object per test and thread count and line instead of the table
 *
 * A default length that does not fit the KV cache after the depth shrinks to it, with a note on
 * stderr. The roof is the machine's read bandwidth, measured in the same run with the same
 * threads: a streaming read of the bench's own buffer around each decode rep, and one of the
 * weights a decode step reads in their own pages. Where decode's bytes per token fit in the
 * last-level cache (sysfs's largest data cache of CPU 0, or BENCH_LLC_BYTES; 0 = never) no
 * percentage of the roof is given. docs/speed.md#the-bench describes the table's columns and every
 * JSON key. A prefill test runs in forward()'s chunks of 256 positions (512 for a mixture of
 * experts), in every build. Token ids are fixed pseudo-random ids; EOS is ignored. The
 * table comes at the end (the thread counts take turns rep by rep); on a terminal a progress line
 * on stderr shows the depth's fill, each warm-up and each rep, and Ctrl-C prints the reps complete
 * by then and exits 130. */
#ifndef BENCH_H
#define BENCH_H

#include "model.h"

#define BENCH_MAX_THREAD_COUNTS 16

/* The options above, as run.c parses and checks them (each value in its range, reps >= 1, one
 * test length or both > 0); bench_main fits them to the KV cache. BENCH_DEFAULTS are the values of
 * the options not given. */
typedef struct {
    int len[2];   /* tokens of the prefill and the decode test (0: not run) */
    int given[2]; /* the user gave len[k]; else it is the default, which shrinks to fit the KV cache */
    int reps, depth, json;
    int threads[BENCH_MAX_THREAD_COUNTS], n_threads; /* --threads; n_threads 0: the kernels' count */
} BenchOptions;
#define BENCH_DEFAULTS {.len = {512, 128}, .reps = 5}

/* Runs the tests on t and prints the results on stdout. Returns 0, or 1 after an error line on
 * stderr (e.g. a context too small for the tests). */
int bench_main(Transformer* t, const BenchOptions* o);

/* The KV cache positions the tests take with these options: --bench-depth plus the longer test.
 * Without -c run.c sizes the cache to them, as llama-bench sizes its own. */
int bench_positions(const BenchOptions* o);

/* Bytes of t's mapped file in 2 MB pages now: its FilePmdMapped in /proc/self/smaps, one read of
 * that file (milliseconds); -1 where it cannot tell. The bench's only look at /proc for the model. */
long long transformer_huge_page_bytes(const Transformer* t);

#endif
