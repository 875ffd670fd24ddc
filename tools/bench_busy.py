#!/usr/bin/env python3
"""bench_busy.py: decode speed with 1 and 2 threads, on a quiet machine and beside a busy core.

    python3 tools/bench_busy.py MODEL.bin [MODEL.bin ...] [--rounds 4] [--gen 32] [--run ./run]
                                [-- extra ./run arguments, e.g. --kv-cache f16]

Issue 4 asks that two threads are never slower than one, also when another process keeps a core
busy. Each round runs `./run MODEL -m bench --threads 1,2 --json` twice, once quiet and once beside
a CPU-bound neighbour process (a busy loop started just before and killed right after). Inside one
bench process the two thread counts take turns rep by rep, so a slow phase of a shared machine hits
both alike, and the round's ratio (2 threads / 1 thread, decode tok/s medians of the same process)
is steadier than a ratio across processes. Prints, per model and case, the median tok/s over the
rounds and the median, lowest and highest of the rounds' ratios.
Python 3 standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def busy_loop():
    """A process that spins until killed: the busy neighbour."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def decode_rates(run, model, gen, reps, extra):
    """{threads: decode tok/s median} of one bench process that measures 1 and 2 threads."""
    cmd = [run, model, "-m", "bench", "--threads", "1,2", "--bench-prompt", "1",
           "--bench-gen", str(gen), "--bench-reps", str(reps), "--json"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("bench_busy.py: %s failed:\n%s" % (" ".join(cmd), out.stderr))
    rates = {}
    for line in out.stdout.splitlines():
        rec = json.loads(line)
        if rec["test"].startswith("tg"):
            rates[rec["threads"]] = rec["tokens_per_s"]
    if sorted(rates) != [1, 2]:
        sys.exit("bench_busy.py: expected tg lines for 1 and 2 threads from " + " ".join(cmd))
    return rates


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5, help="bench reps per thread count in each process")
    ap.add_argument("--run", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "run"))
    a = ap.parse_args(argv)
    for m in a.models:
        if not os.path.exists(m):
            sys.exit("bench_busy.py: %s: no such file" % m)
    print("| model | neighbour | 1 thread tok/s | 2 threads tok/s | 2t / 1t median of rounds | lowest | highest |")
    print("|---|---|---|---|---|---|---|")
    for m in a.models:
        rounds = {False: [], True: []}
        for r in range(a.rounds):
            for b in (False, True):
                p = busy_loop() if b else None
                try:
                    rounds[b].append(decode_rates(a.run, m, a.gen, a.reps, extra))
                finally:
                    if p:
                        p.kill()
                        p.wait()
                one, two = rounds[b][-1][1], rounds[b][-1][2]
                print("  round %d, %s: 1 thread %.2f, 2 threads %.2f tok/s, ratio %.3f" %
                      (r + 1, "busy" if b else "quiet", one, two, two / one), file=sys.stderr)
        for b in (False, True):
            ratios = [x[2] / x[1] for x in rounds[b]]
            print("| %s | %s | %.1f | %.1f | %.2f | %.2f | %.2f |" % (
                os.path.basename(m), "busy core" if b else "none",
                statistics.median(x[1] for x in rounds[b]), statistics.median(x[2] for x in rounds[b]),
                statistics.median(ratios), min(ratios), max(ratios)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
