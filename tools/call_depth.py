#!/usr/bin/env python3
"""call_depth.py: how deep forward() goes to reach each op's arithmetic, in the reference and
the fast build, read from gdb backtraces (the seam table of docs/design.md#seam).

    python3 tools/call_depth.py [--formats q8,q4,bf16,f32] [--kv-cache f32|f16|q8] [--threads 1]
                                [--dir build/depth] [--vector-helpers]

Builds the engine twice with -O2 -g (DIR/fast: `make`; DIR/ref: `make SCALAR=1`), writes
Qwen3-0.6B's random shape cut to one layer in each format (tools/bench_models.py, into DIR), and
runs each build on each file under gdb: a 51-token prompt (prefill: one call of forward()) and two
decoded tokens (decode). Every function of kernels/ gets a breakpoint that never stops the program:
when one is hit on a stack that reaches forward(), the chain of functions from forward() down to
it is recorded, the thread pool's own frames (kernels/fast/threads.c) left out, inlined functions
kept (gdb shows them as frames too; one it shows twice in a row counts once). A breakpoint then
stays off until forward() calls its next op, so a loop's thousand calls cost one stop; a hit
outside forward() (loading times the decode kernels) turns it off until then too.

Prints, per op (the function forward() calls through the Ops table) and phase, each chain that no
longer chain extends, deepest first, with its calls (real frames) and frames (with the inlined
ones, in brackets): `matmul > matmul_task > rows_qi_n1 > [qi_step4] > [qi_dot] > [dpbusd]: 3
calls, 6 frames`. Chains end in the arithmetic's loops, in the plan and the activations'
preparation, and in one-line accessors (a row's scale, a cache row's address); which one holds the
op's arithmetic is the reader's call, and design.md's table names it.

A chain's calls are exact: a real function's breakpoint is at its entry, and the frames above it
come from the return addresses. Its inlined frames are gdb's guess in optimised code: it puts an
inlined function's breakpoint at the lowest address of its code, which a run may pass without
entering it (q8_query with an fp32 cache) or never pass while inside it (the branch for a last
partial group of rows, when there is none). A function reached on two paths in one op call shows
the first only. Needs gdb; a few minutes, most of it writing the four files (about 1.3 GB).
Python 3 standard library only.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from bench_models import checkpoint  # noqa: E402

PROMPT = ("Once upon a time there was a little cat who lived in a big house with a garden full "
          "of flowers. Every morning the cat went out to look at the bees and the birds, and "
          "every evening she came back home to sleep by the warm fire.")

# Runs inside gdb (gdb -batch -x THIS): the breakpoints, the stack walks, the record. Its inputs
# come from the environment: CALL_DEPTH_NAMES, the functions to probe; CALL_DEPTH_OUT, the JSON.
GDB_SCRIPT = r'''
import gdb, json, os, re

gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("set print thread-events off")
gdb.execute("set breakpoint pending off")

def pool_frame(frame):
    fn = frame.function()
    return fn is not None and fn.symtab is not None and fn.symtab.filename.endswith("threads.c")

chains = {}     # "op|phase" -> list of chains, each a list of [name, inlined]
probes = []

def walk(newest):
    """The chain from forward() down to newest, or None when forward() is not on this stack."""
    chain, f = [], newest
    while f is not None:
        fn = f.function()
        name = fn.name if fn is not None else (f.name() or "?")
        if name == "forward":
            return list(reversed(chain)), f
        if not pool_frame(f):
            chain.append([name, f.type() == gdb.INLINE_FRAME])
        f = f.older()
    return None

def arm(but=None):
    for p in probes:
        if p is not but and not p.enabled:
            p.enabled = True

class ForwardEntry(gdb.Breakpoint):
    def stop(self):
        arm()
        return False

class Probe(gdb.Breakpoint):
    def __init__(self, name):
        super().__init__(function=name)  # a user breakpoint: gdb shows its inlined frame
        self.silent = True

    def stop(self):
        found = walk(gdb.newest_frame())
        if found is None:               # outside forward() (loading: the prefetch timing), or a
            self.enabled = False        # worker's stack: off until forward() or an op arms it
            return False
        chain, fwd = found
        if not chain:
            return False
        if len(chain) == 1:             # an op's own entry: every probe is armed again
            arm(self)
        chain = [c for i, c in enumerate(chain) if i == 0 or c[0] != chain[i - 1][0]]
        phase = "prefill" if int(fwd.read_var("n")) > 1 else "decode"
        key = chain[0][0] + "|" + phase
        chains.setdefault(key, [])
        if chain not in chains[key]:
            chains[key].append(chain)
        if len(chain) > 1:
            self.enabled = False        # one stop per op call is enough
        return False

# Every function of kernels/ (its names from the sources, call_depth.py's candidates; gdb keeps
# those it knows, inlined-only ones too, at every place they were inlined).
for name in os.environ["CALL_DEPTH_NAMES"].split():
    try:
        probes.append(Probe(name))
    except (gdb.error, RuntimeError):
        pass
ForwardEntry("forward", internal=True)
gdb.execute("run")
with open(os.environ["CALL_DEPTH_OUT"], "w") as f:
    json.dump({"probes": len(probes), "chains": chains}, f)
'''


def kernel_function_names(vector_helpers):
    """The names defined at the start of a line in kernels/ (.c and .h): `ALWAYS_INLINE void
    scores_step(...` gives scores_step. A few are not functions (gdb finds none and skips them).
    Without vector_helpers, not those of kernels/simd_math.h (fv_fma, wb_dot, ...): each is an
    instruction or a few under a portable name, and design.md's table counts to the function whose
    loop holds them."""
    names = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "kernels")):
        for name in files:
            if name.endswith((".c", ".h")) and (vector_helpers or name != "simd_math.h"):
                with open(os.path.join(folder, name)) as f:
                    for line in f:
                        m = re.match(r"[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\(", line)
                        if m and not line.startswith(("return", "typedef")):
                            names.add(m.group(1))
    return sorted(names)


def build(directory, scalar):
    """make with -g into directory; returns its run."""
    flags = "-O2 -g -Wall -Wextra -Wno-unused-parameter"
    cmd = ["make", "--no-print-directory", "B=" + directory, "CFLAGS=" + flags, directory + "/run"]
    if scalar:
        cmd.insert(2, "SCALAR=1")
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return os.path.join(ROOT, directory, "run")


def maximal(chains):
    """The chains that no other chain extends (a chain that is a prefix of a longer one is dropped)."""
    return [c for c in chains if not any(len(o) > len(c) and o[:len(c)] == c for o in chains)]


def shown(chain):
    """forward()'s callee first, inlined functions in brackets: matmul > rows_qi_n1 > [qi_dot]."""
    return " > ".join("[%s]" % name if inlined else name for name, inlined in chain)


def probe(run, model, threads, kv_cache, vector_helpers):
    """The chains gdb saw: {"probes": N, "chains": {"op|phase": [chain, ...]}}."""
    with tempfile.TemporaryDirectory() as tmp:
        script, out = os.path.join(tmp, "probe.py"), os.path.join(tmp, "chains.json")
        with open(script, "w") as f:
            f.write(GDB_SCRIPT)
        args = [run, model, "-i", PROMPT, "-n", "2", "-s", "1", "-t", "0", "--kv-cache", kv_cache]
        args += ["--threads", str(threads)] if threads else []
        p = subprocess.run(["gdb", "-q", "-batch", "-x", script, "--args"] + args, cwd=ROOT,
                           capture_output=True, text=True, env=dict(
                               os.environ, CALL_DEPTH_OUT=out, CALL_DEPTH_NAMES=" ".join(kernel_function_names(vector_helpers))))
        if not os.path.exists(out):
            sys.exit("call_depth.py: gdb did not finish on %s with %s:\n%s" % (run, model, p.stderr[-2000:]))
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="q8,q4,bf16,f32")
    ap.add_argument("--kv-cache", default="f32", choices=("f32", "f16", "q8"), help="the cache type (default f32)")
    ap.add_argument("--threads", type=int, default=1,
                    help="the fast build's threads (default 1: the pool runs every item on the calling "
                         "thread, through the same kernels; with more, a worker's hit turns a probe off "
                         "before the calling thread meets it, and chains go missing)")
    ap.add_argument("--vector-helpers", action="store_true", help="probe kernels/simd_math.h's helpers too")
    ap.add_argument("--dir", default="build/depth", help="the builds and the models (default build/depth)")
    a = ap.parse_args()
    if shutil.which("gdb") is None:
        sys.exit("call_depth.py: needs gdb (apt-get install gdb)")
    builds = {"reference": build(a.dir + "/ref", True), "fast": build(a.dir + "/fast", False)}
    formats = a.formats.split(",")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_models.py"), a.dir] + formats +
                   ["--layers", "1", "--run", builds["fast"]], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    for fmt in formats:
        model = checkpoint(a.dir, fmt, "0.6b", 1)
        if not os.path.exists(model):
            print("%s: not written (bench_models.py said why above)" % fmt)
            continue
        for which, run in builds.items():
            threads = a.threads if which == "fast" else None
            r = probe(run, model, threads, a.kv_cache, a.vector_helpers)
            print("%s build, %s, %s cache (%d functions of kernels/ probed):" %
                  (which, os.path.basename(model), a.kv_cache, r["probes"]))
            for key in sorted(r["chains"]):
                op, phase = key.split("|")
                for chain in sorted(maximal(r["chains"][key]), key=lambda c: -len(c)):
                    calls = sum(1 for _, inlined in chain if not inlined)
                    print("  %-7s %s: %d calls, %d frames" % (phase, shown(chain), calls, len(chain)))


if __name__ == "__main__":
    main()
