"""tools/llama_cpp/compare.py (this engine beside llama.cpp, docs/speed.md): the rounds it runs and
the table it makes from their output. llama.cpp is not built in a test (npm and minutes of
compiling), so a stand-in `lbench` prints llama-bench-style lines with known figures and records
its arguments; the engine is the real ./run on the shipped model. Checked: each round runs lbench
per thread count with the model, prompt, gen and reps asked for, then ./run's bench with the same;
the table's ratio is this engine's median tok/s (read here from the logged JSON) / the median of
lbench's reps, per round; before each format both files are dropped from the page cache (not with
--keep-pages; the drop does empty a file's cache, by mincore()) and tools/page_read.c streams the
GGUF and the checkpoint, and the table ends with their GB/s per round (as the log has them, marked
when read back afresh); --table reads a log again; a checkpoint the engine cannot read is exported
again; a missing lbench, an unknown format or every format skipped ends with a message and a
non-zero exit. Speed is not asserted. Skips, with the reason, when ./run or
models/tinystories.bin is missing. Standard library only."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402
from hf_model import PYTHON  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "llama_cpp", "compare.py")
RUN = os.environ.get("QWEN3_RUN") or os.path.join(ROOT, "run")  # run_tests.py: this build's engine
MODEL = os.path.join(ROOT, "models", "tinystories.bin")

# lbench stand-in: reps of prefill 100, 100, 40 x threads, decode 10, 10, 4 x threads tok/s (the
# median 100 and 10 x threads, the mean it prints first 80 and 8; " @ dDEPTH" after the test's name
# with a sixth argument, as lbench prints); appends its argv to CALLS.
FAKE_LBENCH = """#!{python}
import sys
model, t, npr, ng, reps = sys.argv[1:6]
at = f" @ d{{sys.argv[6]}}" if len(sys.argv) > 6 else ""
with open({calls!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
t = int(t)
print(f"pp{{npr}}{{at}} {{t}} t: {{80.0 * t:8.2f}} ± {{1.0:6.2f}} tok/s  [{{100.0 * t:.2f}}, {{40.0 * t:.2f}}, {{100.0 * t:.2f}}]")
print(f"tg{{ng}}{{at}} {{t}} t: {{8.0 * t:8.2f}} ± {{0.5:6.2f}} tok/s  [{{10.0 * t:.2f}}, {{10.0 * t:.2f}}, {{4.0 * t:.2f}}]")
"""

# upstream llama-bench stand-in (-m GGUF -t T -p N -n N -r R -o jsonl [-d D] [--progress]): one JSON
# line per test with its reps' tok/s (samples_ts; median prefill 200 x threads, decode 20 x threads)
# and their mean (avg_ts, lower), its cache type f16, and with --progress a line on standard error
# first; argv to CALLS.
FAKE_UPSTREAM = """#!{python}
import json, sys
a = sys.argv[1:]
with open({calls!r}, "a") as f:
    f.write(" ".join(a) + "\\n")
if "--progress" in a:
    a.remove("--progress")
    print("llama-bench: benchmark 1/2: starting", file=sys.stderr, flush=True)
opt = dict(zip(a[0::2], a[1::2]))
t, d = int(opt["-t"]), int(opt.get("-d", 0))
for n_prompt, n_gen, rate in ((int(opt["-p"]), 0, 200.0), (0, int(opt["-n"]), 20.0)):
    print(json.dumps({{"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": d, "n_threads": t, "type_k": "f16",
                      "type_v": "f16", "avg_ts": 0.75 * rate * t, "samples_ts": [rate * t, 0.25 * rate * t, rate * t]}}))
"""


class CompareTool(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(RUN):
            self.skipTest("./run is not built (run `make`)")
        if not os.path.exists(MODEL):
            self.skipTest("models/tinystories.bin is missing")
        self.dir = tempfile.mkdtemp(prefix="compare_")
        self.addCleanup(shutil.rmtree, self.dir)
        # The files compare.py would otherwise write (1.2 GB): present, so it writes none.
        os.makedirs(os.path.join(self.dir, "hf"))
        open(os.path.join(self.dir, "hf", "model.safetensors"), "wb").close()
        os.symlink(MODEL, os.path.join(self.dir, "qwen3-0.6b-q8.bin"))
        with open(os.path.join(self.dir, "qwen3-0.6b-q8_0.gguf"), "wb") as f:
            f.write(bytes(range(256)) * 4096)  # 1 MB for tools/page_read.c to stream
        self.calls = os.path.join(self.dir, "calls.txt")
        self.lbench = os.path.join(self.dir, "lbench")
        with open(self.lbench, "w") as f:
            f.write(FAKE_LBENCH.format(python=" ".join(PYTHON), calls=self.calls))
        os.chmod(self.lbench, 0o755)

    def two_threads(self):
        """Skips a test whose rounds run the engine on 2 threads in the reference build, which runs 1."""
        if hf_model.reference_engine():
            self.skipTest("the reference build runs one thread (make test runs this on the fast build)")

    def tool(self, *args):
        # BENCH_LLC_BYTES=0: decode gets its % of roof even where the small stand-in model fits in
        # the CPU's last-level cache (the bench gives none then, as it would not for Qwen3-0.6B).
        # --run: this build's engine (make B=... test links no ./run, and the reference build's tests
        # run beside the fast build's ./run).
        return subprocess.run([*PYTHON, TOOL, "--run", RUN] + list(args), cwd=ROOT, capture_output=True,
                              text=True, timeout=600, env=dict(os.environ, BENCH_LLC_BYTES="0"))

    def test_rounds_and_table(self):
        self.two_threads()
        log = os.path.join(self.dir, "log.txt")
        p = self.tool("--lbench", self.lbench, "--dir", self.dir, "--formats", "q8", "--threads", "1,2",
                      "--rounds", "2", "--prompt", "8", "--gen", "4", "--reps", "1", "--log", log)
        self.assertEqual(p.returncode, 0, p.stderr)
        gguf = os.path.join(self.dir, "qwen3-0.6b-q8_0.gguf")
        with open(self.calls) as f:
            self.assertEqual(f.read().splitlines(), [f"{gguf} {t} 8 4 1" for t in (1, 2, 1, 2)])

        # The engine's medians, per round, straight from the log's JSON lines.
        engine, json_compute, r = {}, {}, 0
        with open(log) as f:
            for line in f:
                m = re.match(r"== round (\d+) q8 engine", line)
                if m:
                    r = int(m[1])
                elif line.startswith("{") and r:
                    j = json.loads(line)
                    engine[(r, j["test"], j["threads"])] = j["tokens_per_s"]
                    if j["test"] == "pp8":
                        json_compute[(r, j["threads"])] = j["compute_roof_pct"]
        self.assertEqual(len(engine), 8, engine)  # 2 rounds x pp8, tg4 x 1, 2 threads

        rows = {}
        for line in p.stdout.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 9 and cells[0] == "q8":
                rows[(cells[2], int(cells[1]))] = cells
        self.assertEqual(sorted(rows), [("pp8", 1), ("pp8", 2), ("tg4", 1), ("tg4", 2)])
        lowest = {}
        for (test, t), cells in rows.items():
            llama = (100.0 if test == "pp8" else 10.0) * t
            self.assertEqual(cells[3], f"{llama:.1f} / {llama:.1f}")
            want = [engine[(k, test, t)] / llama for k in (1, 2)]
            self.assertEqual(cells[5], " / ".join(f"{x:.2f}" for x in want), cells)
            self.assertEqual(cells[4], " / ".join(f"{engine[(k, test, t)]:.1f}" for k in (1, 2)))
            lowest[test[:2]] = min(lowest.get(test[:2], 1e30), *want)
            if test == "tg4":
                self.assertEqual(cells[6].count("%"), 2, cells)  # a roof share per round
                self.assertEqual(cells[7].count("%"), 2, cells)  # and one of the weights' own read
                self.assertEqual(cells[8], "- / -")  # decode has no compute roof
            else:
                self.assertEqual(cells[6], "- / -")  # prefill has no memory roof
                self.assertEqual(cells[7], "- / -")
                compute = [json_compute[(k, t)] for k in (1, 2)]  # but one of compute, where the build has one
                self.assertEqual(cells[8], " / ".join("-" if c is None else f"{c:.0f}%" for c in compute), cells)
        self.assertIn(f"lowest prefill ratio (this engine / llama.cpp): {lowest['pp']:.2f}", p.stdout)
        self.assertIn(f"lowest decode ratio (this engine / llama.cpp): {lowest['tg']:.2f}", p.stdout)

        # tools/page_read.c before each round's format: the GGUF's and the checkpoint's pages
        pages, r = {}, 0
        with open(log) as f:
            for line in f:
                m = re.match(r"== round (\d+) q8 (\S+)", line)
                if m:
                    r = int(m[1]) if m[2] == "pages" else 0
                elif r:
                    m = re.match(r"(\S+): ([\d.]+) MB, ([\d.]+) GB/s \(best of 5\)", line)
                    self.assertIsNotNone(m, line)
                    pages.setdefault(r, []).append((os.path.basename(m[1]), float(m[2]), float(m[3])))
        self.assertEqual([[(name, mb) for name, mb, _ in pages[k]] for k in (1, 2)],
                         [[("qwen3-0.6b-q8_0.gguf", 1.0), ("qwen3-0.6b-q8.bin", round(os.path.getsize(MODEL) / 1e6, 1))]] * 2)
        # by default both files are dropped from the page cache before each round's page read,
        # and the table marks those rounds
        with open(log) as f:
            self.assertEqual(re.findall(r"^== round (\d+) q8 fresh", f.read(), re.M), ["1", "2"])
        want = ", ".join(f"{pages[k][0][2]:.1f} / {pages[k][1][2]:.1f}*" for k in (1, 2))
        self.assertIn(f"\n  q8: {want}\n", p.stdout + "\n")
        self.assertIn("(* both files dropped from the page cache and read back just before)", p.stdout)

        again = self.tool("--table", log, "--formats", "q8")
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(again.stdout.strip(), p.stdout.strip())

    def test_depth_and_engine_args(self):
        """--depth N goes to lbench as its sixth argument and to the engine as --bench-depth (with
        a context that holds it); --engine-args reach the engine; the table's tests say the depth."""
        log = os.path.join(self.dir, "log.txt")
        p = self.tool("--lbench", self.lbench, "--dir", self.dir, "--formats", "q8", "--threads", "1",
                      "--rounds", "1", "--prompt", "8", "--gen", "4", "--reps", "1", "--depth", "100",
                      "--engine-args=--kv-cache f16", "--log", log)
        self.assertEqual(p.returncode, 0, p.stderr)
        gguf = os.path.join(self.dir, "qwen3-0.6b-q8_0.gguf")
        with open(self.calls) as f:
            self.assertEqual(f.read().splitlines(), [f"{gguf} 1 8 4 1 100"])
        with open(log) as f:
            recs = [json.loads(line) for line in f if line.startswith("{")]
        self.assertEqual([(r["test"], r["depth"], r["kv_cache"]) for r in recs],
                         [("pp8", 100, "f16"), ("tg4", 100, "f16")])
        tests = [c.strip() for line in p.stdout.splitlines() for c in line.strip("|").split("|")[2:3]
                 if line.startswith("| q8")]
        self.assertEqual(tests, ["pp8 @ d100", "tg4 @ d100"])

    def test_upstream_llama_bench_and_size(self):
        """--llama-bench runs upstream's llama-bench with its own options, -o jsonl, --llama-args
        and --progress (its lines reach the terminal), and the table takes the median of its
        samples_ts (as this engine's figure is its median), and says both programs' KV caches;
        --size picks the files of that shape (qwen3-SIZE-*)."""
        self.two_threads()
        os.symlink(MODEL, os.path.join(self.dir, "qwen3-1.7b-q8.bin"))
        gguf = os.path.join(self.dir, "qwen3-1.7b-q8_0.gguf")
        shutil.copy(os.path.join(self.dir, "qwen3-0.6b-q8_0.gguf"), gguf)
        upstream = os.path.join(self.dir, "llama-bench")
        with open(upstream, "w") as f:
            f.write(FAKE_UPSTREAM.format(python=" ".join(PYTHON), calls=self.calls))
        os.chmod(upstream, 0o755)
        p = self.tool("--llama-bench", upstream, "--size", "1.7b", "--dir", self.dir, "--formats", "q8",
                      "--threads", "1,2", "--rounds", "1", "--prompt", "8", "--gen", "4", "--reps", "1",
                      "--llama-args", "-fa on -ctk q8_0", "--log", os.path.join(self.dir, "log.txt"))
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(self.calls) as f:
            self.assertEqual(f.read().splitlines(),
                             [f"-m {gguf} -t {t} -p 8 -n 4 -r 1 -o jsonl -fa on -ctk q8_0 --progress" for t in (1, 2)])
        # llama-bench's progress (its standard error) reaches the terminal as it comes, not only
        # when a run fails
        self.assertEqual(p.stderr.count("  llama-bench: benchmark 1/2: starting"), 2, p.stderr)
        llama = {}
        for line in p.stdout.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 9 and cells[0] == "q8":
                llama[(cells[2], int(cells[1]))] = cells[3]
        self.assertEqual(llama, {("pp8", 1): "200.0", ("pp8", 2): "400.0", ("tg4", 1): "20.0", ("tg4", 2): "40.0"})
        self.assertIn("\nKV cache: this engine f32; llama.cpp f16/f16\n", p.stdout)

    def test_keep_pages(self):
        """--keep-pages: no drop, no mark; the page reads are still made and shown."""
        log = os.path.join(self.dir, "log.txt")
        p = self.tool("--lbench", self.lbench, "--dir", self.dir, "--formats", "q8", "--threads", "1",
                      "--rounds", "1", "--prompt", "8", "--gen", "4", "--reps", "1", "--keep-pages", "--log", log)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(log) as f:
            text = f.read()
        self.assertNotIn("fresh", text)
        self.assertRegex(text, r"== round 1 q8 pages")
        self.assertRegex(p.stdout, r"\n  q8: [\d.]+ / [\d.]+\n")
        self.assertNotIn("*", p.stdout)

    def test_drop_leaves_no_page_cached(self):
        """The drop that fresh_pages makes (make_random_gguf.drop_from_page_cache) empties the file's
        page cache: mincore() of a mapping of it, before and after. In build/, not a temporary
        folder, which may be a tmpfs (whose pages cannot be dropped)."""
        if not sys.platform.startswith("linux"):
            self.skipTest("mincore() and posix_fadvise() as Linux has them")
        import ctypes
        import mmap
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        from make_random_gguf import drop_from_page_cache
        os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
        fs = subprocess.run(["stat", "-f", "-c", "%T", os.path.join(ROOT, "build")], capture_output=True, text=True)
        if fs.stdout.strip() in ("tmpfs", "ramfs"):
            self.skipTest(f"build/ is on a {fs.stdout.strip()}, whose pages cannot be dropped")
        path = os.path.join(ROOT, "build", f"drop_test_{os.getpid()}.tmp")
        self.addCleanup(os.remove, path)
        size = 64 * mmap.PAGESIZE
        with open(path, "wb") as f:
            f.write(bytes(range(256)) * (size // 256))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]

        def resident():
            with open(path, "rb") as f:
                m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # writable: from_buffer needs it
                try:
                    buf = ctypes.c_char.from_buffer(m)
                    vec = ctypes.create_string_buffer(size // mmap.PAGESIZE)
                    rc = libc.mincore(ctypes.addressof(buf), size, vec)
                    del buf
                finally:
                    m.close()
            self.assertEqual(rc, 0, os.strerror(ctypes.get_errno()))
            return sum(b & 1 for b in vec.raw)

        self.assertEqual(resident(), 64)  # just written: every page cached
        drop_from_page_cache(path)
        self.assertEqual(resident(), 0)

    def test_busy_rounds_marked(self):
        """A round in which the engine's test had under 90% of its cores (cpu_share): its ratio is
        marked, said why below the table, and left out of the lowest ratio while others remain."""
        log = os.path.join(self.dir, "busy.log")
        rec = '{"test": "tg16", "threads": 2, "tokens_per_s": %s, "cpu_share": %s, "roof_pct": 90.0}\n'
        with open(log, "w") as f:
            f.write("== round 1 q8 llama 2 10:00:00\ntg16 2 t:   4.97 \u00b1   0.94 tok/s\n"
                    "== round 1 q8 engine 10:00:05\n" + rec % ("46.5", "0.488") +
                    "== round 2 q8 llama 2 10:01:00\ntg16 2 t:   40.00 \u00b1   0.10 tok/s\n"
                    "== round 2 q8 engine 10:01:05\n" + rec % ("48.0", "0.97") + "== end 10:02:00\n")
        p = self.tool("--table", log, "--formats", "q8")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("| q8 | 2 | tg16 | 5.0 / 40.0 | 46.5 / 48.0 | 9.36\u2020 / 1.20 |", p.stdout)
        self.assertIn("\u2020 the engine's CPU share was below 90%", p.stdout)
        self.assertIn("lowest decode ratio (this engine / llama.cpp): 1.20 (\u2020 rounds left out)", p.stdout)

    def test_refusals(self):
        p = self.tool("--lbench", os.path.join(self.dir, "nothing"), "--dir", self.dir, "--formats", "q8")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("nothing: no llama.cpp bench harness there", p.stderr)
        self.assertIn("tools/llama_cpp/build.sh", p.stderr)
        p = self.tool("--lbench", self.lbench, "--dir", self.dir, "--formats", "q8,q5")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("unknown format 'q5'", p.stderr)
        # A checkpoint this engine cannot read is exported again, from hf/ (empty here, so the
        # export fails, and the comparison stops before any round).
        os.remove(os.path.join(self.dir, "qwen3-0.6b-q8.bin"))
        with open(os.path.join(self.dir, "qwen3-0.6b-q8.bin"), "wb") as f:
            f.write(b"not a checkpoint")
        p = self.tool("--lbench", self.lbench, "--dir", self.dir, "--formats", "q8")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("exporting " + os.path.join(self.dir, "qwen3-0.6b-q8.bin") + " failed", p.stderr)
        p = self.tool("--table", os.path.join(self.dir, "no.log"))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no.log: no such log", p.stderr)
        p = self.tool("--lbench", self.lbench, "--dir", self.dir, "--formats", "q8", "--llama-args", "-fa on")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--llama-args are llama-bench's options: give --llama-bench too", p.stderr)
        p = self.tool("--lbench", self.lbench, "--formats", "")
        self.assertEqual(p.stderr.strip(), "compare.py: --formats '': no format (give some of q8, q4, bf16, f32)")
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        p = self.tool("--lbench", self.lbench, "--dir", self.dir, "--formats", "q8", "--threads", "1,%d" % (cpus + 1))
        self.assertEqual(p.stderr.strip(), "compare.py: --threads %d: this process may use %d CPU%s (this engine "
                         "would run fewer threads than llama.cpp)" % (cpus + 1, cpus, "s" if cpus > 1 else ""))
        p = self.tool("--llama-bench", MODEL, "--dir", self.dir, "--formats", "q8")
        self.assertIn("not an executable file; --llama-bench is llama.cpp's llama-bench program", p.stderr)
        self.assertFalse(os.path.exists(self.calls))
        not_a_log = os.path.join(self.dir, "other.log")
        with open(not_a_log, "w") as f:
            f.write("== round 1 q8 engine\nsomething else\n")
        p = self.tool("--table", not_a_log, "--formats", "q8")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("other.log: no result of both programs for q8", p.stderr)

    def test_a_program_without_results(self):
        """A llama.cpp that prints no result (here `true`) leaves its rows unpaired: the table
        has none of them, and compare.py names them and exits non-zero."""
        silent = os.path.join(self.dir, "silent")
        with open(silent, "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(silent, 0o755)
        p = self.tool("--lbench", silent, "--dir", self.dir, "--formats", "q8", "--threads", "1", "--rounds", "1",
                      "--prompt", "8", "--gen", "4", "--reps", "1", "--log", os.path.join(self.dir, "log.txt"))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("compare.py: no result of both programs for q8 with 1 thread (their output: ", p.stderr)


class NothingToCompare(unittest.TestCase):
    """Where every format asked for is skipped (too large for the machine's memory, or no room on
    its disk: bench_models.ensure returns none of them), compare.py ends with a message and a
    non-zero exit, not an empty table. In-process, with ensure standing in for a full machine."""

    def test_every_format_skipped(self):
        import argparse
        from unittest import mock
        sys.path.insert(0, os.path.join(ROOT, "tools", "llama_cpp"))
        import compare
        a = argparse.Namespace(dir=tempfile.gettempdir(), run=RUN, size="0.6b", layers=None)
        with mock.patch.object(compare.bench_models, "ensure", return_value={}):
            with self.assertRaises(SystemExit) as e:
                compare.prepare(a, ["q8", "q4"])
        self.assertEqual(str(e.exception.code), "compare.py: nothing to compare: q8, q4 skipped (the reasons above)")


class PageReadPieces(unittest.TestCase):
    """tools/page_read.c --pieces: the file read again in pieces at random places (the access of a
    MoE decode), reported beside the front-to-back figure; a bad size is a usage error."""

    def test_pieces(self):
        cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler to build tools/page_read.c")
        d = tempfile.mkdtemp(prefix="page_read_")
        self.addCleanup(shutil.rmtree, d)
        exe, data = os.path.join(d, "page_read"), os.path.join(d, "data")
        subprocess.run([cc, "-std=gnu11", "-O2", "-o", exe, os.path.join(ROOT, "tools", "page_read.c")], check=True)
        with open(data, "wb") as f:
            f.write(bytes(range(256)) * 4096)
        p = subprocess.run([exe, "--pieces", "64", data], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"GB/s \(best of 5\).*; in 64 KB pieces at random places [\d.]+ GB/s")
        for bad in (["--pieces", "2", data], ["--pieces", "x", data], ["--pieces", "64"]):
            p = subprocess.run([exe] + bad, capture_output=True, text=True)
            self.assertEqual(p.returncode, 2, bad)
            self.assertIn("--pieces", p.stderr)


if __name__ == "__main__":
    unittest.main()
