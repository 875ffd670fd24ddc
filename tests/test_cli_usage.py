"""The command line as a newcomer meets it, on the shipped model (models/tinystories.bin):

* without -s, runs started within the same second get different seeds, each printed;
* -m tokenize at a terminal says on stderr that it reads standard input, and one Ctrl-D at the
  start of a line ends that input; from a pipe it prints no hint; with --prompt-ids it writes the
  ids' text;
* --threads above the CPUs this process may run on is held to them, with a note (generate) and
  in what the bench reports (its JSON's "threads");
* --no-mmap and --refill-page-cache are no options of this engine (weights are mapped, never
  copied, and a load never changes the system's page cache): each is refused as any unknown
  option is, and --help names neither;
* a copy of the model written in 64 KB pieces (its page cache in small pages) loads to the same
  logits as the shipped file; the bench reports the share of the mapping in 2 MB pages (huge_pct,
  measured by the bench itself), and where it is below 99% a note that names
  tools/drop_page_cache.py; after that tool, the next run maps the copy in 2 MB pages (skipped,
  saying so, where the system gives file mappings none). That a load leaves the page cache alone
  is tested in tests/test_mapped_weights.c.

* a prompt of more than one chunk shows its progress where stderr is a terminal, nothing elsewhere;
* the kernel workers block the asynchronous signals: Ctrl-C's handler runs on the main thread.

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
from hf_model import PYTHON  # noqa: E402

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


@unittest.skipIf(missing() is not None, missing() or "")
class NoPrompt(unittest.TestCase):
    """Generate without a prompt names every way to give one; an empty file (or standard input)
    is called empty, by its name."""

    def test_messages(self):
        p = subprocess.run([RUN, MODEL, "-n", "2"], input="Once upon a time", capture_output=True, text=True,
                           timeout=60)
        self.assertEqual((p.returncode, p.stderr), (2, "run: error: no prompt: give -i TEXT, -f FILE (- for "
                                                       "standard input) or --prompt-ids IDS\n"))
        p = subprocess.run([RUN, MODEL, "-n", "2", "-f", "-"], input="", capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stderr), (2, "run: error: standard input is empty: no prompt, and the "
                                                       "model has no BOS token to start from\n"))
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            pass
        self.addCleanup(os.unlink, f.name)
        p = run("-n", "2", "-f", f.name)
        self.assertEqual((p.returncode, p.stderr), (2, "run: error: %s is empty: no prompt, and the model has no BOS "
                                                       "token to start from\n" % f.name))


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

    def test_only_digits(self):
        """A seed is digits: strtoull would take " -1" (leading space) as 2^64 - 1."""
        for seed in ("-1", " -1", "+5", " 5", "", "5x"):
            with self.subTest(seed=seed):
                p = run("-i", "a", "-n", "1", "-s", seed)
                self.assertEqual((p.returncode, p.stderr),
                                 (2, "run: error: -s needs a non-negative integer, got '%s'\n" % seed))


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

    def test_from_a_file(self):
        """-f FILE: the file as it is, the same ids as -i with its text; one text only."""
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("Once upon a time\n")
        self.addCleanup(os.unlink, f.name)
        p = run("-m", "tokenize", "-f", f.name)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, run("-m", "tokenize", "-i", "Once upon a time\n").stdout)
        p = run("-m", "tokenize", "-f", f.name, "-i", "x")
        self.assertEqual((p.returncode, p.stderr), (2, "run: error: -m tokenize takes one text: give one of -i, "
                                                       "--file and --prompt-ids\n"))

    def test_ids_to_text(self):
        """--prompt-ids: the ids' text exactly, no newline added, so a text's ids give the text back
        (and no ids, no text); an id outside the vocabulary is refused as generate refuses it."""
        text = "Once upon a time\nthere was a cat.\n"
        ids = run("-m", "tokenize", "-i", text).stdout.split()
        self.assertGreater(len(ids), 5)
        p = run("-m", "tokenize", "--prompt-ids", ",".join(ids))
        self.assertEqual((p.returncode, p.stdout, p.stderr), (0, text, ""))
        self.assertEqual(run("-m", "tokenize", "--prompt-ids", "").stdout, "")
        p = run("-m", "tokenize", "--prompt-ids", "1,99999")
        self.assertEqual((p.returncode, p.stdout), (2, ""))
        self.assertIn("--prompt-ids: id 99999 is outside the vocabulary", p.stderr)

    def test_endless_file(self):
        """-f /dev/zero: one line naming the file and the limit, status 1, no output: not a read until the
        memory is full."""
        if not os.path.exists("/dev/zero"):
            self.skipTest("no /dev/zero")
        p = subprocess.run([RUN, MODEL, "-m", "tokenize", "-f", "/dev/zero"], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual((p.returncode, p.stdout, p.stderr),
                         (1, "", "run: error: /dev/zero: more than 256 MiB of text, the most that run reads\n"))

    def test_no_hint_from_a_pipe(self):
        p = subprocess.run([RUN, MODEL, "-m", "tokenize"], input="Once upon a time", capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, run("-m", "tokenize", "-i", "Once upon a time").stdout)
        self.assertEqual(p.stderr, "")


class PromptProgress(unittest.TestCase):
    """A prompt of more than one chunk (256 positions) shows its progress on stderr when stderr is
    a terminal, one line written over and cleared before the run's own lines, and nothing when it
    is not; generate's output is the same either way. A tiny random model of 1,024 positions,
    exported here."""

    @classmethod
    def setUpClass(cls):
        cls.why = hf_model.missing_tools()
        if cls.why:
            return
        cls.tmp = tempfile.mkdtemp(prefix="qwen3_progress_")
        hf_model.write_model(os.path.join(cls.tmp, "hf"), hf_model.Spec(max_position_embeddings=1024))
        cls.ckpt = os.path.join(cls.tmp, "model.bin")
        p = hf_model.run_export(os.path.join(cls.tmp, "hf"), cls.ckpt)
        assert p.returncode == 0, p.stderr

    @classmethod
    def tearDownClass(cls):
        if not cls.why:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def generate(self, n_ids, stderr_terminal):
        if self.why:
            self.skipTest(self.why)
        args = [RUN, self.ckpt, "--prompt-ids", ",".join(str(1 + i % 200) for i in range(n_ids)), "-n", "4",
                "-t", "0"]
        if not stderr_terminal:
            p = subprocess.run(args, capture_output=True, timeout=120)
            return p.stdout, p.stderr
        master, slave = pty.openpty()
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        err = b""
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the run closed its side
                data = b""
            if not data:
                break
            err += data
        os.close(master)
        out = p.communicate(timeout=120)[0]
        self.assertEqual(p.returncode, 0, err)
        return out, err

    def test_progress_on_a_terminal_only(self):
        # a line after each chunk but the last: forward()'s 256 positions, the reference build's 16
        # (cli/generation.h, EXACT_SPLIT_PIECE)
        piece = 16 if hf_model.reference_engine() else 256
        out_tty, err_tty = self.generate(600, True)
        later = b"".join(rb"\rrun: prompt %d/600 tokens, \d+ tok/s, \d+:\d\d left\x1b\[K" % k
                         for k in range(2 * piece, 600, piece))
        self.assertRegex(err_tty, rb"^\rrun: prompt %d/600 tokens\x1b\[K" % piece + later + rb"\r\x1b\[Kprompt tokens: 600")
        out_pipe, err_pipe = self.generate(600, False)
        self.assertNotIn(b"run: prompt", err_pipe)
        self.assertEqual(out_tty, out_pipe)
        _, err_short = self.generate(min(200, piece), True)  # one chunk: nothing to show
        self.assertNotIn(b"run: prompt", err_short)


@unittest.skipIf(missing() is not None, missing() or "")
class Threads(unittest.TestCase):
    def test_more_threads_than_cpus(self):
        cpus = hf_model.usable_cpus()
        if cpus >= 1000:
            self.skipTest("this process may run on %d CPUs" % cpus)
        p = run("-i", "Once", "-n", "2", "-t", "0", "--threads", "1000")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("run: note: --threads 1000 is more than the %d CPU%s this process may run on; using %d\n"
                      % (cpus, "" if cpus == 1 else "s", cpus), p.stderr)
        p = run("-m", "bench", "--json", "--threads", "1000", "--bench-prompt", "2", "--bench-gen", "2",
                "--bench-reps", "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual({json.loads(line)["threads"] for line in p.stdout.splitlines()}, {hf_model.engine_threads()})
        p = run("-i", "Once", "-n", "2", "-t", "0", "--threads", str(cpus))
        self.assertEqual(p.returncode, 0, p.stderr)
        if hf_model.reference_engine() and cpus > 1:  # ReferenceBuildThreads checks its note
            self.assertEqual(p.stderr.count("note"), 1, p.stderr)
        else:
            self.assertNotIn("note", p.stderr)

    def test_signals_go_to_the_main_thread(self):
        """The kernel workers block the asynchronous signals, so a Ctrl-C's handler runs on the main
        thread, which reads the flag it sets (on a worker it was a data race ThreadSanitizer sees);
        a bus error or segfault stays with the thread that causes it. Read from each thread's
        SigBlk in /proc, in a chat that waits for its first line."""
        import signal
        import time
        if hf_model.engine_threads() < 2 or not os.path.exists("/proc/self/task"):
            self.skipTest("needs two CPUs and the fast engine (a worker thread), and /proc")
        if hf_model.EMULATOR:
            self.skipTest("under %s /proc shows the emulator's signal masks, not the engine's" % hf_model.EMULATOR)
        p = subprocess.Popen([RUN, MODEL, "-m", "chat", "--threads", "2"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            tasks = []
            for _ in range(200):  # the pool starts as the model loads
                tasks = os.listdir("/proc/%d/task" % p.pid)
                if len(tasks) >= 2:
                    break
                time.sleep(0.05)
            self.assertGreaterEqual(len(tasks), 2, "no worker thread")

            def blocked(tid):
                with open("/proc/%d/task/%s/status" % (p.pid, tid)) as f:
                    mask = int(re.search(r"^SigBlk:\s*([0-9a-f]+)$", f.read(), re.M).group(1), 16)
                return {sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGBUS, signal.SIGSEGV)
                        if mask >> (sig - 1) & 1}
            for tid in tasks:
                want = set() if int(tid) == p.pid else {signal.SIGINT, signal.SIGTERM}
                # a thread that pthread_create is still starting has every signal blocked for a
                # moment (glibc sets its mask last); on a busy machine the first look can see that
                for _ in range(100):
                    if blocked(tid) == want:
                        break
                    time.sleep(0.05)
                self.assertEqual(blocked(tid), want, "thread %s" % tid)
        finally:
            p.communicate(timeout=60)  # closes its standard input: the chat ends

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


@unittest.skipIf(missing() is not None, missing() or "")
class RemovedLoadOptions(unittest.TestCase):
    def test_refused_as_unknown_options(self):
        for option in ("--no-mmap", "--refill-page-cache"):
            with self.subTest(option=option):
                p = run(option, "-i", "Once", "-n", "2", "-t", "0")
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertEqual(p.stdout, "")
                self.assertEqual(p.stderr, "run: error: unknown option '%s' (see --help)\n" % option)

    def test_help_names_neither(self):
        p = subprocess.run([RUN, "--help"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("--no-mmap", p.stdout)
        self.assertNotIn("--refill-page-cache", p.stdout)


@unittest.skipIf(missing() is not None, missing() or "")
class FreshCopy(unittest.TestCase):
    """A copy of the shipped model written into build/ (not a temporary folder, which may be a
    tmpfs) in 64 KB pieces, as cp writes: just written, its page cache is in small pages, which
    the loader maps as they are. (One 9 MB write() can land in large folios on a filesystem that
    has them.)"""

    SHORT_BENCH = ["-m", "bench", "--bench-prompt", "2", "--bench-gen", "2", "--bench-reps", "1", "--threads", "1"]

    def setUp(self):
        os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
        self.tmp = tempfile.mkdtemp(dir=os.path.join(ROOT, "build"), prefix="fresh_copy_test_")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.model = os.path.join(self.tmp, "copy.bin")
        with open(MODEL, "rb") as src, open(self.model, "wb", buffering=0) as dst:
            for piece in iter(lambda: src.read(1 << 16), b""):
                dst.write(piece)

    def mb_in_2mb_pages(self):
        """The bench's text: (MB of the file in 2 MB pages as printed, its note lines)."""
        p = subprocess.run([RUN, self.model] + self.SHORT_BENCH, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        m = re.search(r"^bench: weights mapped, (\d+) of 9 MB in 2 MB pages$", p.stdout, re.M)
        self.assertIsNotNone(m, p.stdout)
        return int(m.group(1)), [line for line in p.stdout.splitlines() if "small pages" in line]

    def logits(self, model):
        dump = os.path.join(self.tmp, "logits%d.f32" % len(os.listdir(self.tmp)))
        p = subprocess.run([RUN, model, "--prompt-ids", "1,2,3,4", "-n", "4", "-t", "0", "--dump-logits", dump],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(dump, "rb") as f:
            return f.read()

    def test_same_logits(self):
        copy = self.logits(self.model)
        self.assertGreater(len(copy), 0)
        self.assertEqual(copy, self.logits(MODEL), "a copy of the model gives other logits")

    def test_bench_reports_2mb_pages(self):
        if not os.path.exists("/proc/self/smaps"):
            self.skipTest("no /proc/self/smaps here: huge_pct is null")
        p = subprocess.run([RUN, self.model, "--json"] + self.SHORT_BENCH, capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        for r in map(json.loads, p.stdout.splitlines()):
            self.assertEqual(r["weights"], "mapped")
            self.assertTrue(0 <= r["huge_pct"] <= 100, r)
        mb, notes = self.mb_in_2mb_pages()
        # The file is 9.0 MB: four whole 2 MB stretches, 8.4 MB. All four in 2 MB pages print 8
        # and no note; below 8 some stretch is in small pages, and the note names the tool.
        self.assertEqual(len(notes), 0 if mb == 8 else 1, notes)
        for note in notes:
            self.assertIn("python3 tools/drop_page_cache.py MODEL", note)
            self.assertNotIn("--refill-page-cache", note)

    def test_2mb_pages_after_drop_page_cache(self):
        """tools/drop_page_cache.py, then the next run reads the file back in 2 MB pages, where the
        kernel and the filesystem give file mappings 2 MB pages."""
        if not os.path.exists("/proc/self/smaps"):
            self.skipTest("no /proc/self/smaps here: the bench cannot tell the page size")
        p = subprocess.run([*PYTHON, os.path.join(ROOT, "tools", "drop_page_cache.py"), self.model],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        mb, notes = self.mb_in_2mb_pages()
        if mb < 8:
            self.skipTest("this system read the file back in small pages (no 2 MB pages for file mappings)")
        self.assertEqual(notes, [])


if __name__ == "__main__":
    unittest.main()
