/* bench.h: `./run MODEL -m bench`, a llama-bench-like speed test of the loaded model.
 *
 *   --bench-prompt N   prefill test ppN: N prompt tokens in one forward() call from position 0
 *                      (default 512, or the KV cache's positions after the depth where fewer,
 *                      with a note on stderr)
 *   --bench-gen N      decode test tgN: N tokens one at a time from position 0 (default 128,
 *                      fitted the same way)
 *   --bench-reps N     timed repetitions of each test after one warm-up (default 5)
 *   --threads N,M,...  the thread counts to measure (default: the kernels' count, set when the
 *                      model was loaded, which must be the largest in the list): each count gets
 *                      its own warm-up and roof, then the counts take turns rep by rep
 *   --json             one JSON object per test and line instead of the table:
 *       {"test": "pp512", "threads": 2, "tokens_per_s": <median>, "min": .., "max": ..,
 *        "gbps": .., "roof_pct": .., "mem_gbps": .., "roof_pct_best": .., "mem_gbps_best": ..,
 *        "weight_type": "q8", "cpu_share": 0.97, "weights": "mapped" or "copied" (--no-mmap),
 *        "huge_pct": % of the mapping in 2 MB pages (read from /proc/self/smaps after the reps;
 *        null for a copy or without smaps), "reps_tokens_per_s": [each rep's tok/s],
 *        "reps_mem_gbps": [each decode rep's roof], "weights_gbps": .., "roof_pct_weights": ..,
 *        "reps_weights_gbps": [..]}
 *     gbps is the decode's achieved read bandwidth (bytes of weights and KV cache read per token /
 *     seconds per token, at the median). The machine's read bandwidth is measured in the same run
 *     with the same threads: each decode rep's roof is the best of two streaming reads just before
 *     it and one just after; mem_gbps is their median, roof_pct the median over the reps of the
 *     rep's GB/s as a percentage of its own roof. mem_gbps_best is the best read of the run and
 *     roof_pct_best gbps as a percentage of it. weights_gbps, roof_pct_weights and
 *     reps_weights_gbps are the same for a streaming read of the weights a decode step reads, in
 *     their own pages (the mapping or the --no-mmap copy), measured around each rep as well: on a
 *     VM the memory behind them can read slower or faster than the bench's buffer. gbps, the
 *     roof_pcts and the per-rep reads are null for pp. Where decode's bytes per token fit in the
 *     last-level cache (sysfs's largest data cache of CPU 0, or BENCH_LLC_BYTES; 0 = never), decode
 *     reads them from that cache and is not bound by memory: roof_pct, roof_pct_best and
 *     roof_pct_weights are null, and the table says why in one line.
 *     cpu_share is the CPU time the process got / (wall time x threads) during the test: well
 *     below 1 on a shared machine means other processes took the cores (numbers not comparable).
 *     One line per test and thread count.
 * Token ids are fixed pseudo-random ids; EOS is ignored. */
#ifndef BENCH_H
#define BENCH_H

#include "model.h"

/* Scans argv[0 .. argc-1] for the options above (others are ignored, so run.c can pass its own
 * argv through), runs the tests on t and prints the results on stdout. Returns 0, or after an
 * error line on stderr 2 (options that measure nothing or are malformed) or 1 (anything else,
 * e.g. a context too small for the tests). */
int bench_main(Transformer* t, int argc, char** argv);

/* "1,2,4" -> counts[0..n-1]; each in 1..1024. Returns n, or -1 if s is not such a list of at most
 * max_counts numbers. BENCH_MAX_THREAD_COUNTS is the most the bench takes. */
#define BENCH_MAX_THREAD_COUNTS 16
int bench_parse_threads(const char* s, int* counts, int max_counts);

#endif
