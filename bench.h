/* bench.h: `./run MODEL -m bench`, a llama-bench-like speed test of the loaded model.
 *
 *   --bench-prompt N   prefill test ppN: N prompt tokens in one forward() call from position 0
 *                      (default 512)
 *   --bench-gen N      decode test tgN: N tokens one at a time from position 0 (default 128)
 *   --bench-reps N     timed repetitions of each test after one warm-up (default 5)
 *   --json             one JSON object per test and line instead of the table:
 *       {"test": "pp512", "threads": 2, "tokens_per_s": <median>, "min": .., "max": ..,
 *        "gbps": .., "roof_pct": .., "mem_gbps": .., "weight_type": "q8", "cpu_share": 0.97}
 *     gbps is the decode's achieved read bandwidth (bytes of weights and KV cache read per token /
 *     seconds per token, at the median) and roof_pct its percentage of mem_gbps, the machine's
 *     read bandwidth measured in the same run with the same threads; both are null for pp.
 *     cpu_share is the CPU time the process got / (wall time x threads) during the test: well
 *     below 1 on a shared machine means other processes took the cores (numbers not comparable).
 * Token ids are fixed pseudo-random ids; EOS is ignored. The thread count is the kernels' (set
 * when the model was loaded). */
#ifndef BENCH_H
#define BENCH_H

#include "model.h"

/* Scans argv[0 .. argc-1] for the options above (others are ignored, so run.c can pass its own
 * argv through), runs the tests on t and prints the results on stdout. Returns 0, or 1 after an
 * error line on stderr. */
int bench_main(Transformer* t, int argc, char** argv);

#endif
