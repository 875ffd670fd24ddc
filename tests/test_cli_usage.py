"""The command line as a newcomer meets it, on the shipped model (models/tinystories.bin):

* without -s, runs started within the same second get different seeds, each printed;
* -m tokenize at a terminal says on stderr that it reads standard input, and one Ctrl-D at the
  start of a line ends that input; from a pipe it prints no hint;
* --threads above the CPUs this process may run on is held to them, with a note (generate) and
  in what the bench reports (its JSON's "threads");
* --no-mmap reads the file into its own memory: the logits are the same bytes as with the
  mapping, and the peak resident memory stays near one copy of the file (it was two: the mapped
  pages and the copy);
* --refill-page-cache (documented in --help) loads a freshly written copy of the model, whose page
  cache is in small pages, to the same logits as the default load, and is ignored with a note
  beside --no-mmap; the bench reports the share of the mapping in 2 MB pages (huge_pct, measured
  by the bench itself) and null for a copy. That a default load leaves the page cache alone is
  tested in tests/test_checkpoint_map.c, with mincore().

Skips, with the reason, when ./run or the model is missing. Standard library only."""
import json
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402
from hf_model import Spec  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.environ.get("QWEN3_RUN") or os.path.join(ROOT, "run")
MODEL = os.path.join(ROOT, "models", "tinystories.bin")


def missing():
    if not os.access(RUN, os.X_OK):
        return "./run is not built (run `make`)"
    if not os.path.exists(MODEL):
        return "models/tinystories.bin is missing"
    return None


def run(*args, timeout=120):
    return subprocess.run([RUN, MODEL] + list(args), capture_output=True, text=True, timeout=timeout)


def usable_cpus():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@unittest.skipIf(missing() is not None, missing() or "")
class Seed(unittest.TestCase):
    def test_runs_in_the_same_second_differ(self):
        """The seed was time(NULL): three runs within one second printed the same seed and text."""
        seeds = []
        for _ in range(3):
            p = run("-i", "Once upon a time", "-n", "4", "-t", "1")
            self.assertEqual(p.returncode, 0, p.stderr)
            m = re.search(r"^seed: (\d+) \(from the clock; -s \1 repeats this run\)$", p.stderr, re.M)
            self.assertIsNotNone(m, p.stderr)
            seeds.append(int(m.group(1)))
        self.assertEqual(len(set(seeds)), 3, seeds)
        # The printed seed repeats the run.
        a = run("-i", "Once upon a time", "-n", "8", "-t", "1", "-s", str(seeds[0]))
        b = run("-i", "Once upon a time", "-n", "8", "-t", "1", "-s", str(seeds[0]))
        self.assertEqual(a.stdout, b.stdout)


@unittest.skipIf(missing() is not None, missing() or "")
class TokenizeInput(unittest.TestCase):
    def tokenize_at_terminal(self, typed):
        """./run -m tokenize with a terminal (a pty) as standard input; typed is written to it.
        Returns (stdout, stderr, returncode), or fails when the run does not end in 20 s."""
        master, slave = pty.openpty()
        p = subprocess.Popen([RUN, MODEL, "-m", "tokenize"], stdin=slave, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        os.close(slave)
        try:
            os.write(master, typed)
            try:
                out, err = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
                self.fail("tokenize did not end after %r" % typed)
        finally:
            os.close(master)
        return out, err, p.returncode

    def test_one_ctrl_d_ends_the_input(self):
        out, err, rc = self.tokenize_at_terminal(b"Once upon a time\n\x04")
        self.assertEqual(rc, 0, err)
        want = run("-m", "tokenize", "-i", "Once upon a time\n")
        self.assertEqual(want.returncode, 0, want.stderr)
        self.assertEqual(out, want.stdout)
        hint = [line for line in err.splitlines() if "standard input" in line]
        self.assertEqual(len(hint), 1, err)
        self.assertIn("Ctrl-D", hint[0])
        self.assertIn("-i", hint[0])

    def test_no_hint_from_a_pipe(self):
        p = subprocess.run([RUN, MODEL, "-m", "tokenize"], input="Once upon a time", capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, run("-m", "tokenize", "-i", "Once upon a time").stdout)
        self.assertEqual(p.stderr, "")


@unittest.skipIf(missing() is not None, missing() or "")
class Threads(unittest.TestCase):
    def test_more_threads_than_cpus(self):
        cpus = usable_cpus()
        if cpus >= 1000:
            self.skipTest("this process may run on %d CPUs" % cpus)
        p = run("-i", "Once", "-n", "2", "-t", "0", "--threads", "1000")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("run: note: --threads 1000 is more than the %d CPU%s this process may run on; using %d\n"
                      % (cpus, "" if cpus == 1 else "s", cpus), p.stderr)
        p = run("-m", "bench", "--json", "--threads", "1000", "--bench-prompt", "2", "--bench-gen", "2",
                "--bench-reps", "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual({json.loads(line)["threads"] for line in p.stdout.splitlines()}, {cpus})
        p = run("-i", "Once", "-n", "2", "-t", "0", "--threads", str(cpus))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("note", p.stderr)

    def test_default_is_the_cpus_this_process_may_use(self):
        """Without --threads the engine starts one thread per CPU of its affinity mask (taskset,
        a container's cpuset), not per online CPU."""
        if not hasattr(os, "sched_setaffinity"):
            self.skipTest("no sched_setaffinity here")
        one = {min(os.sched_getaffinity(0))}
        p = subprocess.run([RUN, MODEL, "-m", "bench", "--json", "--bench-prompt", "2", "--bench-gen", "2",
                            "--bench-reps", "1"], capture_output=True, text=True, timeout=120,
                           preexec_fn=lambda: os.sched_setaffinity(0, one))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual({json.loads(line)["threads"] for line in p.stdout.splitlines()}, {1})


def peak_rss_bytes(args):
    """Runs ./run with args; returns (returncode, stderr, the child's peak resident set in bytes)."""
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([RUN] + args, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return p.returncode, err.read().decode(errors="replace"), usage.ru_maxrss * 1024


class NoMmap(hf_model.TempDirTestCase):
    """A tiny random model with 64 MB of bytes after its sections (the loader reads the whole file
    and ignores what no section covers), so that one copy of the file stands well above the
    engine's own memory (a few MB), and two copies well above one."""
    PAD = 64 << 20

    @classmethod
    def setUpClass(cls):
        super().setUpClass()

    def setUp(self):
        super().setUp()
        if not hasattr(os, "wait4") or not hasattr(os, "waitstatus_to_exitcode"):
            self.skipTest("no os.wait4 here (peak RSS of one child)")

    def padded_model(self):
        path = os.path.join(self.tmp, "padded.bin")
        if not os.path.exists(path):
            d = os.path.join(self.tmp, "hf")
            hf_model.write_model(d, Spec(dtype="F32"))
            p = hf_model.run_export(d, path, "f32")
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(path, "ab") as f:
                f.write(os.urandom(self.PAD))
        return path

    def test_logits_identical(self):
        for model in (MODEL, self.padded_model()):
            if not os.path.exists(model):
                continue
            rows = []
            for extra in ([], ["--no-mmap"]):
                dump = os.path.join(self.tmp, "logits%d.f32" % len(rows))
                p = hf_model.run_engine([model, "--prompt-ids", "1,2,3,4", "-n", "4", "-t", "0",
                                         "--dump-logits", dump] + extra)
                self.assertEqual(p.returncode, 0, p.stderr)
                with open(dump, "rb") as f:
                    rows.append(f.read())
            self.assertGreater(len(rows[0]), 0)
            self.assertEqual(rows[0], rows[1], "logits differ with --no-mmap (%s)" % model)

    def test_peak_memory_is_one_copy(self):
        model = self.padded_model()
        size = os.path.getsize(model)
        args = [model, "--prompt-ids", "1,2,3", "-n", "2", "-t", "0"]
        rc, err, mapped = peak_rss_bytes(args)
        self.assertEqual(rc, 0, err)
        rc, err, copied = peak_rss_bytes(args + ["--no-mmap"])
        self.assertEqual(rc, 0, err)
        mb = 1 << 20
        # The copy holds the whole file ...
        self.assertGreater(copied, 0.9 * size, "peak %.1f MB for a %.1f MB file" % (copied / mb, size / mb))
        # ... and only once: the mapped run's peak (the file's pages plus the engine) plus a quarter
        # of the file at most, where mapping and copying held the file twice.
        self.assertLess(copied, mapped + 0.25 * size,
                        "--no-mmap peak %.1f MB, mapped %.1f MB, file %.1f MB" % (copied / mb, mapped / mb,
                                                                                   size / mb))



@unittest.skipIf(missing() is not None, missing() or "")
class RefillPageCache(unittest.TestCase):
    """On a copy of the shipped model written into build/ (not a temporary folder, which may be a
    tmpfs): just written, its page cache is in small pages, so the refill runs where the system
    gives file mappings 2 MB pages."""

    def setUp(self):
        os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
        self.tmp = tempfile.mkdtemp(dir=os.path.join(ROOT, "build"), prefix="refill_test_")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.model = os.path.join(self.tmp, "copy.bin")
        with open(MODEL, "rb") as src, open(self.model, "wb") as dst:
            dst.write(src.read())

    def logits(self, model, *extra):
        dump = os.path.join(self.tmp, "logits%d.f32" % len(os.listdir(self.tmp)))
        p = subprocess.run([RUN, model, "--prompt-ids", "1,2,3,4", "-n", "4", "-t", "0", "--dump-logits", dump]
                           + list(extra), capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(dump, "rb") as f:
            return f.read(), p.stderr

    def test_help_documents_it(self):
        p = subprocess.run([RUN, "--help"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"--refill-page-cache +model file cached in 4 KB pages: drop it from the "
                                   r"system's page\s+cache and read it again in 2 MB pages")

    def test_same_logits(self):
        refilled, err = self.logits(self.model, "--refill-page-cache")
        self.assertNotIn("note", err)
        default, _ = self.logits(self.model)
        shipped, _ = self.logits(MODEL)
        self.assertGreater(len(default), 0)
        self.assertEqual(refilled, default, "--refill-page-cache changed the logits")
        self.assertEqual(default, shipped, "a copy of the model gives other logits")
        copied, err = self.logits(self.model, "--refill-page-cache", "--no-mmap")
        self.assertIn("run: note: --refill-page-cache ignored: --no-mmap reads the file without mapping it", err)
        self.assertEqual(copied, default)

    def test_bench_reports_2mb_pages(self):
        if not os.path.exists("/proc/self/smaps"):
            self.skipTest("no /proc/self/smaps here: huge_pct is null")
        short = ["-m", "bench", "--bench-prompt", "2", "--bench-gen", "2", "--bench-reps", "1", "--threads", "1"]
        for extra, weights in (([], "mapped"), (["--refill-page-cache"], "mapped"), (["--no-mmap"], "copied")):
            p = subprocess.run([RUN, self.model, "--json"] + short + extra, capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            for r in map(json.loads, p.stdout.splitlines()):
                self.assertEqual(r["weights"], weights)
                if weights == "copied":
                    self.assertIsNone(r["huge_pct"])
                else:
                    self.assertTrue(0 <= r["huge_pct"] <= 100, r)
        p = subprocess.run([RUN, self.model] + short, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"bench: weights mapped, \d+ of 9 MB in 2 MB pages")


if __name__ == "__main__":
    unittest.main()
