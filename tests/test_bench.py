"""Bench mode (`./run MODEL -m bench`, bench.h) on the shipped model: the output other tools parse.

Speed is never asserted (benchmarks are programs, not tests); what is checked is the contract:
* --json: one JSON object per test and thread count, with exactly the documented keys and types,
  min <= median <= max, null bandwidth for prefill;
* the decode's gbps is tokens/s x the bytes a decode step reads, counted here independently from
  the checkpoint's header (every matrix, norm, one embedding row, the KV cache averaged over tgN),
  roof_pct is the median over the reps of each rep's GB/s / the read bandwidth measured around
  that rep (recomputed here from the per-rep lists), roof_pct_best is gbps / the run's best read,
  roof_pct_weights the same pairing against reads of the weights' own pages, whose size the text
  header gives and which is counted here again;
* --threads 1,2 measures both counts in one process, in the order given; a list is refused
  outside bench mode, and a malformed list or a context too short for the test ends with a
  message that names the options to change and a non-zero exit;
* the default test lengths shrink to the context (a note on stderr says so), so that `-m bench`
  runs on this model of 256 positions as it is;
* where decode's bytes per token fit in the last-level cache the roof percentages are null (and
  "-" in the table, with a line saying why): such a decode is not bound by memory, and its "% of
  roof" went past 100. The contract's arithmetic is checked with BENCH_LLC_BYTES=0 (always a roof).

Skips, with the reason, when ./run or models/tinystories.bin is missing. Standard library only.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402
from hf_model import PYTHON  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.environ.get("QWEN3_RUN") or os.path.join(ROOT, "run")  # run_tests.py: this build's engine
MODEL = os.path.join(ROOT, "models", "tinystories.bin")
KEYS = ["test", "threads", "depth", "tokens_per_s", "min", "max", "gbps", "roof_pct", "mem_gbps",
        "roof_pct_best", "mem_gbps_best", "weight_type", "cpu_share", "prefetch", "weights", "huge_pct",
        "kv_cache", "kv_bytes_per_position", "reps_tokens_per_s", "reps_mem_gbps", "weights_gbps", "roof_pct_weights", "reps_weights_gbps",
        "ops_per_token", "gops", "peak_gops", "compute_roof_pct", "peak_instruction", "kernels", "kernels_last_chunk", "interrupted"]
FLAG_QK_NORM, FLAG_QKV_BIAS, FLAG_TIED_EMBED = 1, 2, 4
REFERENCE_THREADS = "the reference engine runs one thread (ReferenceBuildThreads checks its --threads)"
ONE_THREAD = "one CPU, or the reference engine: --threads 2 would run with 1"


def missing():
    if not os.path.exists(RUN):
        return "./run is not built (run `make`)"
    if not os.path.exists(MODEL):
        return "models/tinystories.bin is missing"
    return None


def run(*args, env=None):
    """./run MODEL args; env: variables set on top of this process's environment."""
    return subprocess.run([RUN, MODEL] + list(args), capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def decode_bytes_per_token(path, n_gen, kv_elem=4, depth=0):
    """Bytes one decode step reads from an f32 checkpoint (model.h FileHeader), averaged over
    positions depth .. depth+n_gen-1 for the KV cache (kv_elem bytes per cached value: 4, 2 with
    --kv-cache f16, 1.125 with q8)."""
    with open(path, "rb") as f:
        head = f.read(64)
    (flags, dim, hidden, n_layers, n_heads, n_kv, hd, vocab, _, wtype) = struct.unpack_from("<10I", head, 12)
    assert wtype == 0, "this count is for f32 checkpoints"
    per_layer = (n_heads * hd * dim + 2 * n_kv * hd * dim + dim * n_heads * hd + 3 * hidden * dim) * 4
    per_layer += 2 * dim * 4                                  # input and post-attention RMSNorm
    if flags & FLAG_QK_NORM:
        per_layer += 2 * hd * 4
    if flags & FLAG_QKV_BIAS:
        per_layer += (n_heads + 2 * n_kv) * hd * 4
    total = n_layers * per_layer + dim * 4                    # + final norm
    total += vocab * dim * 4 + dim * 4                        # head (tied or not) + one embedding row
    kv = sum(2 * kv_elem * n_layers * (p + 1) * n_kv * hd for p in range(depth, depth + n_gen)) / n_gen
    return total + kv


def prefill_ops_per_token(path, n_prompt, depth=0):
    """Operations (a multiply-add is 2) of one token of a prompt of n_prompt tokens: every layer's
    matrix products, the head's once per prompt, and attention over depth + i + 1 positions for
    prompt token i in every query head (model.h FileHeader)."""
    with open(path, "rb") as f:
        head = f.read(64)
    (_, dim, hidden, n_layers, n_heads, n_kv, hd, vocab) = struct.unpack_from("<8I", head, 12)
    per_layer = 2 * (n_heads * hd * dim + 2 * n_kv * hd * dim + dim * n_heads * hd + 3 * hidden * dim)
    mean_ctx = sum(depth + i + 1 for i in range(n_prompt)) / n_prompt
    return n_layers * per_layer + 2 * vocab * dim / n_prompt + 4 * n_layers * n_heads * hd * mean_ctx


def layers_kv(path):
    """n_layers x n_kv_heads x head_dim of a checkpoint: the cached values per position, per K or V."""
    with open(path, "rb") as f:
        head = f.read(64)
    (_, _, _, n_layers, _, n_kv, hd) = struct.unpack_from("<7I", head, 12)
    return n_layers * n_kv * hd


def is_zen4():
    """Whether this CPU is an AMD Zen 4 (family 19h with AVX-512; Zen 3 is family 19h without it),
    from /proc/cpuinfo; None where it cannot be read. f32 and bf16 prefill leave out the packed
    panels there (matmul.c, choose_float_panels)."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read().split("\n\n")[0]
    except OSError:
        return None
    fields = dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in info.splitlines()))
    return (fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25"
            and "avx512f" in fields.get("flags", "").split())


# Decode's prefetch plan as the bench names it: a fixed plan, or the distance timed at load
# (matmul.c, measure_prefetch), for models whose weights are 64 MB or more.
PREFETCH_PLAN = re.compile(r"(near|mid|none|(q8|q4|bf16) \d+ B, measured)")


DEC3 = 5e-4  # the largest rounding error of a value printed with 3 decimals
PCT = 5e-3   # ... with 2 decimals


def quotient_error(a, b, ea, eb):
    """The largest change of a / b when a moves by ea and b by eb (b - eb > 0)."""
    return (abs(a) + ea) / (b - eb) - abs(a) / b


@unittest.skipIf(missing() is not None, missing() or "")
class BenchMode(unittest.TestCase):
    def json_lines(self, *args, llc="0"):
        """The JSON records; llc: BENCH_LLC_BYTES (default 0: decode always has a roof percentage)."""
        p = run("-m", "bench", "--json", *args, env={"BENCH_LLC_BYTES": llc})
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        return [json.loads(line) for line in p.stdout.splitlines()]

    def test_json_contract_two_thread_counts(self):
        if hf_model.engine_threads() < 2:
            self.skipTest(ONE_THREAD)
        recs = self.json_lines("--threads", "2,1", "--bench-prompt", "8", "--bench-gen", "16",
                               "--bench-reps", "3")
        self.assertEqual([(r["test"], r["threads"]) for r in recs],
                         [("pp8", 2), ("tg16", 2), ("pp8", 1), ("tg16", 1)])
        for r in recs:
            self.assertEqual(list(r), KEYS, "keys and their order")
            self.assertEqual(r["weight_type"], "f32")
            self.assertEqual(r["weights"], "mapped")
            self.assertEqual(r["kv_cache"], "f32")
            self.assertEqual(r["depth"], 0)
            self.assertIs(r["interrupted"], False)
            self.assertTrue(r["huge_pct"] is None or 0 <= r["huge_pct"] <= 100, r)
            self.assertTrue(0 < r["min"] <= r["tokens_per_s"] <= r["max"], r)
            self.assertGreater(r["mem_gbps"], 0)
            # a cpu share only over reps of 0.25 s or more in all (their wall time from their tok/s)
            n = int(r["test"][2:])
            wall = sum(n / v for v in r["reps_tokens_per_s"])
            if wall < 0.24:
                self.assertIsNone(r["cpu_share"], r)
            elif wall > 0.26:
                self.assertGreater(r["cpu_share"], 0)
            self.assertRegex(r["prefetch"], PREFETCH_PLAN)
            reps = r["reps_tokens_per_s"]
            self.assertEqual(len(reps), 3)
            self.assertEqual((min(reps), max(reps)), (r["min"], r["max"]))
            self.assertEqual(median(reps), r["tokens_per_s"])
            if r["test"].startswith("pp"):
                self.assert_compute_roof(r, prefill_ops_per_token(MODEL, 8))
                self.assertIsNone(r["gbps"])
                self.assertIsNone(r["roof_pct"])
                self.assertIsNone(r["roof_pct_best"])
                self.assertIsNone(r["reps_mem_gbps"])
                self.assertIsNone(r["weights_gbps"])
                self.assertIsNone(r["roof_pct_weights"])
                self.assertIsNone(r["reps_weights_gbps"])
            else:
                bytes_per_token = decode_bytes_per_token(MODEL, 16)
                self.assert_gbps(r, bytes_per_token)
                reads = r["reps_mem_gbps"]
                self.assertEqual(len(reads), 3)
                self.assertEqual(median(reads), r["mem_gbps"])
                self.assertGreaterEqual(r["mem_gbps_best"], max(reads))
                # each rep against the read of its own moment, then the median
                self.assert_paired_pct(r["roof_pct"], reps, reads, bytes_per_token)
                ratio = 100 * r["gbps"] / r["mem_gbps_best"]
                self.assertLessEqual(abs(r["roof_pct_best"] - ratio),
                                     PCT + 100 * quotient_error(r["gbps"], r["mem_gbps_best"], DEC3, DEC3),
                                     (r["roof_pct_best"], ratio))
                for key in ("ops_per_token", "gops", "peak_gops", "compute_roof_pct", "peak_instruction"):
                    self.assertIsNone(r[key], key)
                own = r["reps_weights_gbps"]
                self.assertEqual(len(own), 3)
                self.assertGreater(min(own), 0)
                self.assertEqual(median(own), r["weights_gbps"])
                self.assert_paired_pct(r["roof_pct_weights"], reps, own, bytes_per_token)

    # The JSON prints rates with 3 decimals and percentages with 2, so a value recomputed here from
    # printed figures can differ from the printed one by the rounding of each: the bounds below
    # are that rounding carried through the formula, and nothing more (one KV position more or
    # less per step changes gbps by about 5e-4 relative, far beyond them on this model).
    def assert_gbps(self, r, bytes_per_token):
        want = r["tokens_per_s"] * bytes_per_token / 1e9
        bound = DEC3 + DEC3 * bytes_per_token / 1e9 + 1e-9 * want
        self.assertLessEqual(abs(r["gbps"] - want), bound,
                             "gbps %.3f, tok/s x bytes per token %.6f" % (r["gbps"], want))

    def assert_compute_roof(self, r, ops):
        """A prefill row: its operations per token as counted here (printed whole), the achieved
        rate ops x tok/s, and the percentage of the compute roof that rate is; or, where the build
        has no roof to measure (scalar, AMX), no rate or percentage and the reason."""
        self.assertLessEqual(abs(r["ops_per_token"] - ops), 0.5 + 1e-9 * ops, (r["ops_per_token"], ops))
        want = r["tokens_per_s"] * ops / 1e9
        self.assertLessEqual(abs(r["gops"] - want), DEC3 + DEC3 * ops / 1e9 + 1e-9 * want, (r["gops"], want))
        if r["peak_instruction"] in ("scalar", "amx"):
            self.assertIsNone(r["peak_gops"])
            self.assertIsNone(r["compute_roof_pct"])
            return
        self.assertIn(r["peak_instruction"], ("fp32 fma", "vdpbf16ps", "vpdpbusd", "vpmaddubsw+vpmaddwd", "sdot",
                                              "smull+sadalp"))
        self.assertEqual(r["peak_instruction"] == "fp32 fma", r["weight_type"] in ("f32", "bf16"), r)
        self.assertGreater(r["peak_gops"], 0)
        pct = 100 * r["gops"] / r["peak_gops"]
        self.assertLessEqual(abs(r["compute_roof_pct"] - pct),
                             PCT + 100 * quotient_error(r["gops"], r["peak_gops"], DEC3, DEC3), (r["compute_roof_pct"], pct))

    def assert_paired_pct(self, pct, reps, reads, bytes_per_token):
        paired = [100 * tok * bytes_per_token / 1e9 / rd for tok, rd in zip(reps, reads)]
        # the median moves by at most the largest change of any one term
        bound = PCT + max(100 * bytes_per_token / 1e9 * quotient_error(tok, rd, DEC3, DEC3)
                          for tok, rd in zip(reps, reads))
        self.assertLessEqual(abs(pct - median(paired)), bound, (pct, median(paired), bound))

    def test_weights_read_covers_what_decode_reads(self):
        """The second roof reads the weights a decode step reads: every layer's tensors, the final
        norm and the head, so its size in the text header is decode's weight bytes less the one
        embedding row (within the alignment padding between tensors, under 0.05 MB here)."""
        p = run("-m", "bench", "--threads", "1", "--bench-prompt", "0", "--bench-gen", "2", "--bench-reps", "1")
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        m = re.search(r"the weights' own pages \(([0-9.]+) MB\) around each decode rep ([0-9.]+) GB/s", p.stdout)
        self.assertIsNotNone(m, p.stdout)
        with open(MODEL, "rb") as f:
            dim = struct.unpack_from("<I", f.read(32), 16)[0]
        want = decode_bytes_per_token(MODEL, 2) - sum(2 * 4 * layers_kv(MODEL) * (q + 1) for q in range(2)) / 2 - dim * 4
        self.assertAlmostEqual(float(m.group(1)), want / 1e6, delta=0.06, msg=(m.group(1), want / 1e6))
        self.assertGreater(float(m.group(2)), 0)
        self.assertIn("bench: 1 thread: warm-up of ", p.stdout)
        self.assertNotIn("prefill", p.stdout.split("warm-up of ")[1].split(";")[0], "a decode-only run warms no prefill")

    def test_kv_cache_bytes(self):
        """--kv-cache f16 and q8: reported in the JSON, and decode's bytes per token count 2 bytes
        per cached value, or 1 and a half scale per 16 (1.125) with q8 (gbps = tokens/s x that
        count); the bytes per position are those of keys and values in every layer."""
        for kv, elem in (("f32", 4), ("f16", 2), ("q8", 1.125)):
            with self.subTest(kv=kv):
                recs = self.json_lines("--threads", "1", "--bench-prompt", "0", "--bench-gen", "16",
                                       "--bench-reps", "1", "--kv-cache", kv)
                self.assertEqual(len(recs), 1)
                r = recs[0]
                self.assertEqual(r["kv_cache"], kv)
                self.assertEqual(r["kv_bytes_per_position"], 2 * elem * layers_kv(MODEL))
                self.assert_gbps(r, decode_bytes_per_token(MODEL, 16, kv_elem=elem))

    def test_depth(self):
        """--bench-depth N: both tests start with N positions in the cache, the JSON says so, and
        decode's bytes per token count the cache from position N on; a context too small for depth
        plus the longer test is an error naming the -c it needs."""
        recs = self.json_lines("--threads", "1", "--bench-prompt", "8", "--bench-gen", "16",
                               "--bench-reps", "1", "--bench-depth", "200")
        self.assertEqual([(r["test"], r["depth"]) for r in recs], [("pp8", 200), ("tg16", 200)])
        self.assert_compute_roof(recs[0], prefill_ops_per_token(MODEL, 8, depth=200))
        r = recs[1]
        self.assert_gbps(r, decode_bytes_per_token(MODEL, 16, depth=200))
        p = run("-m", "bench", "--bench-prompt", "8", "--bench-gen", "16", "--bench-depth", "250")
        self.assertEqual(p.returncode, 1)
        self.assertIn("needs a context of 266 positions", p.stderr)

    def test_depth_sizes_the_cache_without_c(self):
        """Without -c the KV cache holds what the tests take, as llama-bench's -d needs no other
        option: a depth past the default 4,096 positions runs without "use -c 4104",
        and a -c given too small is still the error that names the -c needed. A tiny random
        model of 8,192 positions, exported here."""
        import shutil
        why = hf_model.missing_tools()
        if why:
            self.skipTest(why)
        tmp = tempfile.mkdtemp(prefix="qwen3_bench_depth_")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        hf_model.write_model(os.path.join(tmp, "hf"), hf_model.Spec(max_position_embeddings=8192))
        model = os.path.join(tmp, "model.bin")
        p = hf_model.run_export(os.path.join(tmp, "hf"), model)
        self.assertEqual(p.returncode, 0, p.stderr)
        args = [RUN, model, "-m", "bench", "--json", "--threads", "1", "--bench-depth", "4100", "--bench-prompt",
                "4", "--bench-gen", "4", "--bench-reps", "1"]
        p = subprocess.run(args, capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertEqual([(json.loads(line)["test"], json.loads(line)["depth"]) for line in p.stdout.splitlines()],
                         [("pp4", 4100), ("tg4", 4100)])
        p = subprocess.run(args + ["-c", "4096"], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("needs a context of 4104 positions (--bench-depth 4100 + --bench-prompt 4), the KV cache has "
                      "4096 (use -c 4104", p.stderr)

    def test_default_is_the_kernels_thread_count(self):
        recs = self.json_lines("--threads", "1", "--bench-prompt", "0", "--bench-gen", "2",
                               "--bench-reps", "1")
        self.assertEqual([(r["test"], r["threads"]) for r in recs], [("tg2", 1)])

    def test_prefetch_plan_is_reported(self):
        """The plan decode ran with is in the output: the test model's weights are too small to be
        timed, so an x86 build keeps mid's distances whatever the CPU (no table of CPU models
        decides it), and KERNELS_PREFETCH picks another. tests/test_kernels.c checks the timing
        itself (measure_prefetch)."""
        def plan(env):
            base = {k: v for k, v in os.environ.items() if k != "KERNELS_PREFETCH"}
            p = subprocess.run([RUN, MODEL, "-m", "bench", "--json", "--threads", "1", "--bench-prompt", "0",
                                "--bench-gen", "2", "--bench-reps", "1"], capture_output=True, text=True,
                               timeout=300, env=dict(base, **env))
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            return json.loads(p.stdout.splitlines()[0])["prefetch"]
        default = plan({})
        if default == "none":
            self.skipTest("this build has no software prefetch plans (not x86-64 with AVX2)")
        self.assertEqual(default, "mid", "a model below 64 MB keeps the default plan")
        self.assertEqual(plan({"KERNELS_PREFETCH": "near"}), "near")  # the other plan (mid is the default)
        p = subprocess.run([RUN, MODEL, "-m", "bench", "--threads", "1", "--bench-prompt", "0", "--bench-gen", "2",
                            "--bench-reps", "1"], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, KERNELS_PREFETCH="near"))
        self.assertIn("decode prefetch near\n", p.stdout)

    def test_float_panels_choice_is_reported(self):
        """f32 and bf16 prefill leave out the packed panels in an AVX-512 build on Zen 4, where the
        tiles alone are faster (docs/design.md#prefill-panels), and take them on every other x86
        CPU; the bench's first line says when they are off (the shipped model is f32), and
        KERNELS_FLOAT_PANELS=0 or 1 overrides the CPU's choice."""
        def first_line(env):
            base = {k: v for k, v in os.environ.items() if k != "KERNELS_FLOAT_PANELS"}
            p = subprocess.run([RUN, MODEL, "-m", "bench", "--threads", "1", "--bench-prompt", "2", "--bench-gen",
                                "0", "--bench-reps", "1"], capture_output=True, text=True, timeout=300,
                               env=dict(base, **env))
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            return p.stdout.splitlines()[0]
        line = first_line({})
        if "kernels avx2" not in line:
            self.skipTest("this build has no packed panels (not x86-64 with AVX2): " + line)
        self.assertIn("weights f32", line)
        off = "prefill without packed panels" in line
        if is_zen4() is not None:
            self.assertEqual(off, is_zen4() and "avx512" in line, line)
        self.assertIn("prefill without packed panels", first_line({"KERNELS_FLOAT_PANELS": "0"}))
        self.assertNotIn("without packed panels", first_line({"KERNELS_FLOAT_PANELS": "1"}))

    def test_table_shows_both_counts_and_their_ratio(self):
        if hf_model.engine_threads() < 2:
            self.skipTest(ONE_THREAD)
        p = run("-m", "bench", "--threads", "1,2", "--bench-prompt", "8", "--bench-gen", "4",
                "--bench-reps", "2")
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        rows = [line.split("|")[1:3] for line in p.stdout.splitlines() if line.startswith("| pp8") or
                line.startswith("| tg4")]
        self.assertEqual([(a.strip(), int(b)) for a, b in rows], [("pp8", 1), ("tg4", 1), ("pp8", 2), ("tg4", 2)])
        self.assertIn("tg4, 2 threads / 1:", p.stdout)
        self.assertIn("pp8, 2 threads / 1:", p.stdout)

    def interrupted_on_a_terminal(self, *args):
        """The bench on a pty, many reps of tiny tests, SIGINT (as a terminal's Ctrl-C sends it)
        once the progress line shows rep 3: (everything it wrote, its exit status)."""
        import pty
        import select
        import signal
        import time
        pid, fd = pty.fork()
        if pid == 0:  # the child
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(RUN, [RUN, MODEL, "-m", "bench", "--threads", "1", "--bench-prompt", "8", "--bench-gen", "4",
                           "--bench-reps", "1000000", *args])
        out, sent, t0 = b"", False, time.time()
        while time.time() - t0 < 30:
            if not sent and b"rep 3 of 1000000" in out:
                os.kill(pid, signal.SIGINT)
                sent = True
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # the child has gone
                    break
                if not data:
                    break
                out += data
        if not sent:  # no progress line to wait for: end it
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        text = out.decode(errors="replace")
        self.assertTrue(sent, "no progress line: " + text[-1000:])
        return text, os.waitstatus_to_exitcode(status)

    def test_ctrl_c(self):
        """Ctrl-C: the reps complete by then are reported, with a line that says how many, and the
        exit status is 130; before the first rep ends, a line that nothing was measured (the
        standard output has the model line, printed first, and no figures). On a
        terminal a progress line (the warm-up, each rep) is written over as the bench runs. With
        --json each line says it was interrupted, and its lists hold the reps complete."""
        import signal
        import time
        text, status = self.interrupted_on_a_terminal()
        self.assertIn("\rbench: warm-up, 1 thread\x1b[K", text)
        self.assertEqual(status, 130, text[-2000:])
        self.assertRegex(text, r"bench: interrupted after \d+ of 1000000 reps: the figures below are over those")
        self.assertRegex(text, r"\| pp8 +\| +1 \|")
        self.assertRegex(text, r"\| tg4 +\| +1 \|")
        text, status = self.interrupted_on_a_terminal("--json")
        self.assertEqual(status, 130, text[-2000:])
        done = int(re.search(r"bench: interrupted after (\d+) of 1000000 reps", text).group(1))
        recs = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        self.assertEqual([r["test"] for r in recs], ["pp8", "tg4"], text[-2000:])
        for r in recs:
            self.assertIs(r["interrupted"], True)
            self.assertEqual(len(r["reps_tokens_per_s"]), done)
        # from a pipe, interrupted at once: no progress line, nothing measured
        if not os.path.exists("/proc/self/status"):
            self.skipTest("no /proc: cannot tell when the bench catches SIGINT (the terminal half passed)")
        if hf_model.EMULATOR:
            self.skipTest("under %s /proc shows the emulator's signal handlers: cannot tell when the bench "
                          "catches SIGINT (the terminal half passed)" % hf_model.EMULATOR)
        p = subprocess.Popen([RUN, MODEL, "-m", "bench", "--bench-reps", "1000000", "--bench-prompt", "8",
                              "--bench-gen", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        # the signal once the bench catches it (before, SIGINT's default would end the process)
        t0 = time.time()
        while time.time() - t0 < 30 and os.path.exists("/proc/%d/status" % p.pid):
            with open("/proc/%d/status" % p.pid) as f:
                caught = [l for l in f if l.startswith("SigCgt:")]
            if caught and int(caught[0].split()[1], 16) & (1 << (signal.SIGINT - 1)):
                break
            time.sleep(0.01)
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 130, stderr)
        self.assertNotIn("\r", stderr)
        if "nothing measured" in stderr:  # the model line only, which comes before any measurement
            self.assertRegex(stdout, r"\Abench: \d+ layers, [^\n]*, kernels [^\n]*\n\Z")
        else:  # a slow start: the signal came after the first rep
            self.assertIn("bench: interrupted after", stderr)

    def test_note_when_the_cores_were_taken(self):
        """A busy loop on the bench's one CPU leaves it about half the CPU time: a note says so (on
        stderr with --json), where the reps took long enough for a cpu share (30 reps of the shipped
        model's 64 tokens: about 1 s beside the loop on a Zen 5, so only a CPU over three times
        faster skips)."""
        if not hasattr(os, "sched_setaffinity"):
            self.skipTest("no sched_setaffinity: cannot put both on one CPU")
        cpu = min(os.sched_getaffinity(0))
        pin = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin)
        try:
            p = subprocess.run([RUN, MODEL, "-m", "bench", "--threads", "1", "--bench-prompt", "0", "--bench-gen",
                                "64", "--bench-reps", "30", "--json"], capture_output=True, text=True, timeout=300,
                               preexec_fn=pin)
        finally:
            hog.kill()
            hog.wait()
        self.assertEqual(p.returncode, 0, p.stderr)
        share = json.loads(p.stdout.splitlines()[0])["cpu_share"]
        if share is None:
            self.skipTest("this CPU ran the reps in under 0.25 s: no cpu share to judge")
        self.assertLess(share, 0.9, p.stderr)
        self.assertRegex(p.stderr, r"bench: note: tg64 with 1 thread got \d+% of its threads' CPU time: other "
                                   r"processes took the cores")

    def test_bad_thread_lists(self):
        for value in ("1,,2", "0", "1,2,", "-1", "a", "2000", ",".join(["1"] * 17)):
            p = run("-m", "bench", "--threads", value, "--bench-gen", "1", "--bench-prompt", "1")
            self.assertEqual(p.returncode, 2, "--threads %s: %s" % (value, p.stderr))
            self.assertIn("--threads", p.stderr)
        p = run("--threads", "1,2", "-n", "1")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("only in bench mode", p.stderr)
        p = run("-m", "bench", "--threads", "2,1,2")
        self.assertEqual((p.returncode, p.stderr), (2, "run: error: --threads 2,1,2: 2 is there twice\n"))

    def test_note_above_the_roof(self):
        """A decode above 100% of the roof comes with one note naming each such row; none without."""
        p = run("-m", "bench", "--json", "--threads", "1", "--bench-prompt", "4", "--bench-gen", "16",
                "--bench-reps", "2", env={"BENCH_LLC_BYTES": "0"})
        self.assertEqual(p.returncode, 0, p.stderr)
        pct = [r["roof_pct"] for r in map(json.loads, p.stdout.splitlines()) if r["test"] == "tg16"]
        notes = [l for l in p.stderr.splitlines() if "above the roof" in l]
        if abs(pct[0] - 100.05) < 0.01:  # the JSON's two decimals cannot tell which side of the line
            self.skipTest("decode at %.2f%% of the roof, on the note's threshold" % pct[0])
        if pct[0] < 100.05:
            self.assertEqual(notes, [])
            return
        self.assertEqual(len(notes), 1, p.stderr)
        m = re.fullmatch(r"bench: note: tg16 read above the roof \(([\d.]+)% with 1 thread\): faster than the "
                         r"buffer's streaming read, so the roof understates what the weights get here \(a cache "
                         r"that holds them, slower memory behind the buffer than behind the file, or a slow "
                         r"minute for the buffer's reads; % of own read compares with the weights' own pages\)",
                         notes[0])
        self.assertTrue(m, notes[0])
        self.assertAlmostEqual(float(m[1]), pct[0], delta=0.051)

    def test_counts_above_the_cpus_run_once(self):
        """Counts above the CPUs this process may use run with that many, once: no two rows of one
        count."""
        if hf_model.reference_engine():
            self.skipTest(REFERENCE_THREADS)
        cpus = hf_model.usable_cpus()
        p = run("-m", "bench", "--threads", "1,%d,%d" % (cpus + 1, cpus + 2), "--bench-prompt", "4", "--bench-gen",
                "2", "--bench-reps", "1", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("counts above the %d CPU" % cpus, p.stderr)
        rows = [(r["test"], r["threads"]) for r in map(json.loads, p.stdout.splitlines())]
        self.assertEqual(rows, [("pp4", 1), ("tg2", 1)] + ([("pp4", cpus), ("tg2", cpus)] if cpus > 1 else []))

    def test_context_too_short(self):
        p = run("-m", "bench", "-c", "16", "--bench-prompt", "32", "--bench-gen", "4")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("context of 32 positions (--bench-prompt 32), the KV cache has 16 (use -c 32, or give "
                      "--bench-prompt and --bench-gen at most 16)", p.stderr)
        self.assertEqual(p.stdout, "")
        p = run("-m", "bench", "--bench-prompt", "600", "--bench-gen", "4")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stderr, "run: error: the bench needs a context of 600 positions (--bench-prompt 600), "
                         "more than the model's 256: give --bench-prompt and --bench-gen at most 256\n")
        self.assertEqual(p.stdout, "")
        # beyond the model, the advice follows the model's limit, and says that the smaller -c given
        # must grow too (following the first half alone met the KV cache's error next)
        p = run("-m", "bench", "-c", "64", "--bench-depth", "64", "--bench-prompt", "300", "--bench-gen", "4")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("more than the model's 256: give --bench-prompt and --bench-gen at most 192, and -c up to the "
                      "model's\n", p.stderr)

    def test_defaults_fit_the_context(self):
        """`-m bench` on this model of 256 positions runs: the defaults (pp512, tg128) shrink to the
        context, with a note naming the option, rather than stop at "needs a context of 512"; a
        length given is kept."""
        p = run("-m", "bench", "--json", "--threads", "1", "--bench-gen", "2", "--bench-reps", "1")
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertEqual([json.loads(line)["test"] for line in p.stdout.splitlines()], ["pp256", "tg2"])
        said = [l for l in p.stderr.splitlines()  # less the notes of a busy or fast machine (other tests' own)
                if "read above the roof" not in l and "of its threads' CPU time" not in l]
        self.assertEqual(said, ["run: note: the bench runs pp256 instead of pp512: the model's context is 256 "
                                "positions (--bench-prompt N sets it)"])
        p = run("-m", "bench", "--json", "--threads", "1", "-c", "24", "--bench-depth", "8", "--bench-reps", "1")
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertEqual([json.loads(line)["test"] for line in p.stdout.splitlines()], ["pp16", "tg16"])
        self.assertIn("the bench runs tg16 instead of tg128: the KV cache (-c) has 24 positions, less "
                      "--bench-depth (--bench-gen N sets it)", p.stderr)

    def test_decode_in_cache_has_no_roof(self):
        """Decode whose bytes per token fit in the last-level cache reads them from there: no % of
        the memory roof (this model's went to 198%). The JSON keeps every key, with null; the table
        prints "-" and one line that says why. BENCH_LLC_BYTES sets the cache's size, so the test
        does not depend on this CPU's."""
        args = ("--threads", "1", "--bench-prompt", "0", "--bench-gen", "4", "--bench-reps", "2")
        (r,) = self.json_lines(*args, llc="1000000000")
        self.assertEqual(list(r), KEYS)
        for key in ("roof_pct", "roof_pct_best", "roof_pct_weights"):
            self.assertIsNone(r[key], key)
        self.assert_gbps(r, decode_bytes_per_token(MODEL, 4))
        self.assertEqual(len(r["reps_mem_gbps"]), 2)
        self.assertEqual(len(r["reps_weights_gbps"]), 2)
        p = run("-m", "bench", *args, env={"BENCH_LLC_BYTES": "1000000000"})
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        mb = decode_bytes_per_token(MODEL, 4) / 1e6
        self.assertIn("bench: no %% of roof for decode: its %.1f MB per token fit in the 1000.0 MB last-level "
                      "cache, so it is not bound by memory bandwidth" % mb, p.stdout)
        row = [line for line in p.stdout.splitlines() if line.startswith("| tg4")]
        self.assertEqual(len(row), 1, p.stdout)
        self.assertEqual([c.strip() for c in row[0].split("|")[7:10]], ["-", "-", "-"], row[0])
        # A cache smaller than the bytes per token: the percentages are back.
        (r,) = self.json_lines(*args, llc="1000")
        self.assertIsNotNone(r["roof_pct"])

    def test_nothing_to_measure_and_beyond_the_model(self):
        """Zero reps or zero tokens of both tests measure nothing (they printed an empty table, or
        ran one rep where none was asked); a depth beyond the model's maximum context is not
        fixed by the -c the usual message suggests."""
        for args, says, status in ((("--bench-reps", "0"), "--bench-reps must be in [1, 1000000], got 0", 2),
                                   (("--bench-reps", "-1"), "--bench-reps must be in [1, 1000000], got -1", 2),
                                   (("--bench-prompt", "0", "--bench-gen", "0"), "nothing to measure", 2),
                                   (("--bench-depth", "100000"), "more than the model's", 1)):
            p = run("-m", "bench", "--bench-prompt", "4", "--bench-gen", "2", *args)
            self.assertEqual(p.returncode, status, p.stderr)
            self.assertIn(says, p.stderr)
            self.assertNotIn("use -c", p.stderr)
            self.assertEqual(p.stdout, "")

    def test_options_checked_before_the_model_loads(self):
        """Options that measure nothing are refused at once, before a (possibly large, possibly
        missing) model is read: the message names the option, not the file."""
        for args, says in ((("--bench-reps", "0"), "--bench-reps must be in [1, 1000000], got 0"),
                           (("--bench-prompt", "0", "--bench-gen", "0"),
                            "nothing to measure: --bench-prompt and --bench-gen are both 0")):
            p = subprocess.run([RUN, "/nonexistent/model.bin", "-m", "bench", *args], capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertEqual(p.stderr, "run: error: " + says + "\n")


def bench_tokens(n, vocab_size):
    """cli/bench.c's fill_tokens: the bench's fixed token ids (a 64-bit LCG)."""
    s, out = 0x2545F4914F6CDD1D, []
    for _ in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((s >> 33) % vocab_size)
    return out


@unittest.skipIf(not os.path.exists(RUN), "./run is not built (run `make`)")
class BenchMoe(unittest.TestCase):
    def test_distinct_experts_per_prefill_chunk(self):
        """On a tiny Qwen3-MoE model (32 experts, 2 a token, layers 0 and 2 sparse, 1 dense), a prompt
        of two chunks (the second of 14 rows, so it cannot reach every expert): the head's count of
        distinct experts a chunk reads is the mean, over the MoE layers and the chunks, of the experts
        tests/reference.py routes that chunk's rows to."""
        import reference
        with tempfile.TemporaryDirectory() as d:
            hf_model.write_model(d, hf_model.Spec(
                arch="qwen3_moe", dtype="F32", n_layers=3, num_experts=32, num_experts_per_tok=2,
                moe_intermediate_size=16, mlp_only_layers=[1], max_position_embeddings=600,
                n_heads=2, n_kv_heads=1, head_dim=8))  # small heads: the reference's attention over 526 positions
            model = os.path.join(d, "m.bin")
            p = subprocess.run([*PYTHON, os.path.join(ROOT, "export.py"), d, model, "--dtype", "f32"],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            n = 526  # a MoE model's chunks are 512 rows (model.c, MAX_BATCH)
            p = subprocess.run([RUN, model, "-m", "bench", "--bench-prompt", str(n), "--bench-gen", "2",
                                "--bench-reps", "1", "--threads", "2"], capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            m = re.search(r"bench: experts: a decode token reads 2 of each MoE layer's 32; a prefill chunk "
                          r"\(up to (\d+) rows\) reads ([\d.]+) distinct ones", p.stdout)
            self.assertIsNotNone(m, p.stdout)
            rows, got = int(m.group(1)), float(m.group(2))
            chunks = (n + rows - 1) // rows
            self.assertGreater(chunks, 1, "the prompt should take two chunks")

            ref = reference.Reference(d)
            layer_of = {id(w): l for l, w in enumerate(ref.layers)}
            route, calls, chosen = ref.route, {}, {}  # chosen: (layer, chunk) -> the experts its rows chose

            def watched(w, h, moe_mistake=None):
                """The reference routes each position once per MoE layer, in order."""
                layer = layer_of[id(w)]
                position = calls[layer] = calls.get(layer, -1) + 1
                picks = route(w, h, moe_mistake)
                chosen.setdefault((layer, position // rows), set()).update(e for e, _ in picks)
                return picks
            ref.route = watched
            ref.forward(bench_tokens(n, ref.V))
            self.assertEqual(sorted(chosen), [(l, c) for l in (0, 2) for c in range(chunks)])
            want = sum(len(v) for v in chosen.values()) / len(chosen)
            self.assertAlmostEqual(got, want, delta=0.005, msg=(got, {k: sorted(v) for k, v in chosen.items()}))


def kernels_lines(model, *args, env=None, json_too=False):
    """From one bench run's text: its first line and its "kernels of TEST (...): PLANS" lines as
    {test: PLANS}; json_too: also {test: (kernels, peak_instruction)} from the JSON rows of a
    second run."""
    cmd = [RUN, model, "-m", "bench", "--threads", "1", "--bench-reps", "1", *args]
    env = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    first = p.stdout.splitlines()[0]
    text = dict(re.findall(r"^bench: kernels of (\w+) \([^)]*\): (.*)$", p.stdout, re.M))
    if not json_too:
        return first, text
    p = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    return first, text, {r["test"]: (r["kernels"], r["peak_instruction"]) for r in rows}


@unittest.skipIf(missing() is not None, missing() or "")
class BenchKernels(unittest.TestCase):
    """The bench names the kernel each product runs, as the fast ops' plan chooses it
    (kernels/fast/matmul.c, plan_product; cli/bench_plan.c), in a line per test and in the JSON's
    "kernels": decode's kernel for a token, prefill's for the prompt's tokens (the head's for the
    last token only), and the paths that begin at a number of tokens (q8 panels from 24, AMX tiles
    from 13); where a prefill product runs on AMX tiles, no compute roof ("amx")."""
    LAYERS = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"

    def test_shipped_f32_model(self):
        first, text = kernels_lines(MODEL, "--bench-prompt", "64", "--bench-gen", "2", env={"KERNELS_FLOAT_PANELS": "1"})
        self.assertEqual(sorted(text), ["pp64", "tg2"], text)
        if hf_model.reference_engine():
            for t in text:
                self.assertEqual(text[t], "every matrix: matmul_scalar_rows (the reference)")
            return
        self.assertEqual(text["tg2"], "every matrix: rows_f32_n1 (fp32 activations)")
        panels = "packed panels, " if "kernels avx2" in first else ""  # the panels are x86 code
        self.assertEqual(text["pp64"], f"{self.LAYERS}: rows_f32_nn ({panels}fp32 activations); "
                                       "lm_head (the last token): rows_f32_n1 (fp32 activations)")
        if panels:
            _, without = kernels_lines(MODEL, "--bench-prompt", "64", "--bench-gen", "1",
                                       env={"KERNELS_FLOAT_PANELS": "0"})
            self.assertTrue(without["pp64"].startswith(f"{self.LAYERS}: rows_f32_nn (fp32 activations)"), without)

    def test_last_chunk_and_experts(self):
        """A prompt longer than a chunk (256 rows) has a line for its last, shorter chunk, and the JSON
        its "kernels_last_chunk" (null where there is none); a Qwen3-MoE model's experts take as many
        tokens as the router sends them, so their plans are named for each count, 1 token to the
        chunk's, in runs that share one."""
        reference = hf_model.reference_engine()
        with tempfile.TemporaryDirectory() as d:
            dense, moe = os.path.join(d, "dense"), os.path.join(d, "moe")
            hf_model.write_model(dense, hf_model.Spec(max_position_embeddings=300))
            hf_model.write_model(moe, hf_model.Spec(arch="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                                                    moe_intermediate_size=32))
            for folder, dtype in ((dense, "f32"), (moe, "q8")):
                p = hf_model.run_export(folder, folder + ".bin", dtype)
                self.assertEqual(p.returncode, 0, p.stderr)
            bench = [RUN, dense + ".bin", "-m", "bench", "--threads", "1", "--bench-reps", "1", "--bench-prompt", "260",
                     "--bench-gen", "1"]
            p = subprocess.run(bench, capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            last = re.findall(r"^bench: kernels of pp260's last chunk \(4 tokens a product\): (.*)$", p.stdout, re.M)
            self.assertEqual(len(last), 1, p.stdout)
            p = subprocess.run(bench + ["--json"], capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            json_rows = {r["test"]: r for r in map(json.loads, p.stdout.splitlines())}
            _, text = kernels_lines(moe + ".bin", "--bench-prompt", "40", "--bench-gen", "1")
        self.assertEqual(json_rows["pp260"]["kernels_last_chunk"], last[0])
        self.assertIsNone(json_rows["tg1"]["kernels_last_chunk"])
        if reference:
            self.assertEqual(text["pp40"], "every matrix: matmul_scalar_rows (the reference)")
            return
        self.assertTrue(last[0].startswith(self.LAYERS + ": rows_f32_nn (fp32 activations); "), last)  # below the panels
        experts = [g for g in text["pp40"].split("; ") if g.startswith("expert_gate, expert_up, expert_down: ")]
        self.assertEqual(len(experts), 1, text)
        runs = experts[0].split(": ", 1)[1]
        self.assertTrue(runs.startswith("1 token rows_qi_n1 (int8 activations"), runs)
        self.assertRegex(runs, r", 2 to \d+ tokens rows_qi \(int8 activations\)")
        self.assertRegex(runs, r" to 40 tokens rows_qi \([^)]*\)$")

    def test_q8_paths_begin_at_their_token_counts(self):
        if hf_model.reference_engine():
            self.skipTest("the reference build has one product kernel (test_shipped_f32_model checks its line)")
        with tempfile.TemporaryDirectory() as d:
            hf_model.write_model(d, hf_model.Spec(seed=21))
            q8 = os.path.join(d, "q8.bin")
            p = hf_model.run_export(d, q8, "q8")
            self.assertEqual(p.returncode, 0, p.stderr)
            got = {16: kernels_lines(q8, "--bench-prompt", "16", "--bench-gen", "1")}
            first, text, rows = kernels_lines(q8, "--bench-prompt", "32", "--bench-gen", "1", json_too=True)
            got[32] = first, text
            below = 8 if "AMX" in got[16][1]["pp16"] else 16  # a prompt below every path's threshold
            if below == 8:
                got[8] = kernels_lines(q8, "--bench-prompt", "8", "--bench-gen", "1")
        self.assertEqual({t: k for t, (k, _) in rows.items()}, text, "the JSON's kernels are the text's")
        for n, (_, text) in got.items():
            self.assertTrue(text["tg1"].startswith("every matrix: rows_qi_n1 (int8 activations"), text)
            layers, head = text[f"pp{n}"].split("; ")
            self.assertTrue(layers.startswith(self.LAYERS + ": rows_qi ("), text)
            self.assertTrue(head.startswith("lm_head (the last token): rows_qi_n1 (int8 activations"), text)
            if n == below:
                self.assertEqual(layers, self.LAYERS + ": rows_qi (int8 activations)")
        pp16, pp32 = got[16][1]["pp16"], got[32][1]["pp32"]
        self.assertEqual(rows["pp32"][1] == "amx", "AMX tiles" in pp32,
                         "no compute roof where prefill runs on AMX tiles: %r" % (rows,))
        if "AMX tiles" in pp16:  # an AMX CPU: tiles from 13 tokens, and no panels after them
            self.assertNotIn("q8 panels", pp16)
            self.assertIn("rows_qi (AMX tiles, int8 activations)", pp32)
        elif "kernels avx2" in first:  # the panels from 24 tokens (x86)
            self.assertNotIn("q8 panels", pp16)
            self.assertIn("rows_qi (q8 panels, int8 activations)", pp32)


@unittest.skipIf(missing() is not None, missing() or "")
class ReferenceBuildThreads(unittest.TestCase):
    """`make test-scalar` runs this on the reference build, which has no thread pool: --threads 1,2
    measures its one thread once, with a note, rather than twice as if they were two counts; and
    --threads 2 in any mode says that it runs one."""

    def setUp(self):
        if not hf_model.reference_engine():
            self.skipTest("not the reference build (make test-scalar runs this on it)")
        if hf_model.usable_cpus() < 2:
            self.skipTest("one CPU: --threads 2 is held to 1 before the kernels are asked")

    def test_each_count_once(self):
        p = run("-m", "bench", "--json", "--threads", "1,2", "--bench-prompt", "4", "--bench-gen", "2",
                "--bench-reps", "1", env={"BENCH_LLC_BYTES": "0"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([json.loads(l)["threads"] for l in p.stdout.splitlines()], [1, 1], p.stdout)  # pp4, tg2
        self.assertIn("run: note: --threads: these kernels (reference) run at most 1 thread: each count is measured "
                      "once", p.stderr)

    def test_one_thread_said(self):
        for args in (["-i", "Once", "-n", "2"], ["-m", "bench", "--bench-prompt", "2", "--bench-gen", "1",
                                                  "--bench-reps", "1"]):
            p = run(*args, "--threads", "2")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("run: note: --threads 2: these kernels (reference) run 1 thread\n", p.stderr)
            p = run(*args)  # the default: no note
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertNotIn("run: note", p.stderr)


if __name__ == "__main__":
    unittest.main()
