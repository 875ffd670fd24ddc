#!/usr/bin/env python3
"""bench_busy.py: decode speed with 1 and 2 threads, on a quiet machine and beside a busy core.

    python3 tools/bench_busy.py MODEL.bin [MODEL.bin ...] [--rounds 4] [--gen 32] [--run ./run]
                                [-- extra ./run arguments, e.g. --no-mmap]

Issue 4 asks that two threads are never slower than one, also when another process keeps a core
busy. This runs `./run MODEL -m bench --json` with --threads 1 and --threads 2, each once quiet
and once beside a CPU-bound neighbour process (a busy loop started just before and killed right
after), in alternating rounds so that slow phases of a shared machine hit every case alike, and
prints the median decode tok/s of each case with the ratio 2 threads / 1 thread.
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


def decode_rate(run, model, threads, gen, extra):
    cmd = [run, model, "-m", "bench", "--threads", str(threads), "--bench-prompt", "1",
           "--bench-gen", str(gen), "--bench-reps", "3", "--json"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("bench_busy.py: %s failed:\n%s" % (" ".join(cmd), out.stderr))
    for line in out.stdout.splitlines():
        rec = json.loads(line)
        if rec["test"].startswith("tg"):
            return rec["tokens_per_s"]
    sys.exit("bench_busy.py: no tg line in the output of " + " ".join(cmd))


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
    ap.add_argument("--run", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "run"))
    a = ap.parse_args(argv)
    for m in a.models:
        if not os.path.exists(m):
            sys.exit("bench_busy.py: %s: no such file" % m)
    print("| model | neighbour | 1 thread tok/s | 2 threads tok/s | 2t / 1t |")
    print("|---|---|---|---|---|")
    for m in a.models:
        rates = {(b, t): [] for b in (False, True) for t in (1, 2)}
        for r in range(a.rounds):
            for b in (False, True):
                for t in (1, 2):
                    p = busy_loop() if b else None
                    try:
                        rates[(b, t)].append(decode_rate(a.run, m, t, a.gen, extra))
                    finally:
                        if p:
                            p.kill()
                            p.wait()
                    print("  round %d, %s, %d thread(s): %.2f tok/s" %
                          (r + 1, "busy" if b else "quiet", t, rates[(b, t)][-1]), file=sys.stderr)
        for b in (False, True):
            one, two = statistics.median(rates[(b, 1)]), statistics.median(rates[(b, 2)])
            print("| %s | %s | %.1f | %.1f | %.2f |" % (os.path.basename(m), "busy core" if b else "none",
                                                     one, two, two / one))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
