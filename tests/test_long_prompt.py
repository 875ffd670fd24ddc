"""The long prompt a user meets in generate mode: the prompt from a file (-f/--file, - for standard
input) gives what the same text through -i gives; the run's last line reports the time to the
first token; on a terminal the prompt's progress shows, and Ctrl-C stops the prompt before its next
chunk (one line, status 130, the progress line cleared) or the decode before its next token (the
text so far, the speed line, status 130), and -m eval after its chunk (the scores so far, 130). The Ctrl-C tests run a random model of Qwen3-0.6B's
width cut to 4 layers (tools/make_random_checkpoint.py), whose 6,000-token prompt takes seconds,
and interrupt it at its first progress line; on a terminal the same file shows how far it is read
at load. Standard library only."""
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import hf_model
from hf_model import PYTHON  # noqa: E402

ROOT = hf_model.ROOT
SHIPPED = os.path.join(ROOT, "models", "tinystories.bin")
TEXT = "Once upon a time, there was a little dog named Max. He liked to run in the park."


class PromptFromFile(hf_model.TempDirTestCase):
    def setUp(self):
        super().setUp()
        if not os.path.exists(SHIPPED):
            self.skipTest("models/tinystories.bin is missing")

    def run_generate(self, *args, stdin=None):
        return subprocess.run([hf_model.RUN, SHIPPED, "-n", "12", "-s", "1", "-t", "0"] + list(args), cwd=ROOT,
                              input=stdin, capture_output=True, text=True, timeout=60)

    def test_file_and_stdin_as_the_prompt(self):
        path = os.path.join(self.fresh_dir("prompt"), "prompt.txt")
        with open(path, "w") as f:
            f.write(TEXT)
        by_text = self.run_generate("-i", TEXT)
        self.assertEqual(by_text.returncode, 0, by_text.stderr)
        continuation = by_text.stdout[len(TEXT):]
        self.assertGreater(len(continuation.strip()), 0)
        for args, stdin in ((["-f", path], None), (["--file", path], None), (["-f", "-"], TEXT)):
            with self.subTest(args=args):
                p = self.run_generate(*args, stdin=stdin)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual(p.stdout, continuation, "the prompt from a file is not echoed")
                self.assertRegex(p.stderr, r"prompt tokens: \d+, .*, first token after \d+\.\d{3} s\n")

    def test_refusals(self):
        path = os.path.join(self.fresh_dir("none"), "missing.txt")
        p = self.run_generate("-f", path)
        self.assertEqual(p.returncode, 1)
        self.assertIn(path, p.stderr)
        p = self.run_generate("-f", "-", "-i", TEXT)
        self.assertEqual(p.returncode, 2)
        self.assertIn("one of -i, --file and --prompt-ids", p.stderr)


def write_slow_model(folder):
    """A q8 checkpoint of Qwen3-0.6B's width (dim 1024, 16 query / 8 kv heads of 128, MLP 3072) and 4
    layers, random weights, the tests' small tokenizer; 16,384 positions."""
    spec = hf_model.Spec(dim=1024, hidden_dim=3072, n_layers=4, n_heads=16, n_kv_heads=8, head_dim=128,
                         max_position_embeddings=16384)
    os.makedirs(folder, exist_ok=True)
    for name, value in (("config.json", spec.config()), ("tokenizer.json", hf_model.tokenizer_json()),
                        ("tokenizer_config.json", hf_model.tokenizer_config_json())):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            json.dump(value, f)
    out = os.path.join(folder, "slow.bin")
    subprocess.run([*PYTHON, os.path.join(ROOT, "tools", "make_random_checkpoint.py"), folder, out,
                    "--dtype", "q8"], check=True, capture_output=True)
    return out


class CtrlC(hf_model.TempDirTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = None

    def slow_model(self):
        if type(self).model is None:
            type(self).model = write_slow_model(os.path.join(self.tmp, "slow"))
        return type(self).model

    def start(self, args):
        """./run with stderr on a terminal (so the progress shows), stdout a pipe, and SIGINT at its
        default as a terminal's shell starts it (./run keeps an ignored SIGINT ignored, as a
        background job's is when the suite itself runs in the background)."""
        master, slave = pty.openpty()
        p = subprocess.Popen([hf_model.RUN, self.slow_model()] + args, cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=slave, stdin=subprocess.DEVNULL,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        os.close(slave)
        self.addCleanup(os.close, master)
        self.addCleanup(lambda: p.poll() is None and p.kill())
        return p, master

    def read_until(self, fd, pattern, timeout=600):
        seen, end = b"", time.time() + timeout
        while pattern not in seen and time.time() < end:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    seen += os.read(fd, 4096)
                except OSError:
                    break
        return seen

    def rest(self, fd):
        out = b""
        while select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        return out

    def interrupt_long_prompt(self, args, marker, ctx=8192):
        """A 6,000-token prompt with args and a context of ctx, Ctrl-C at the first progress line
        that shows marker; status 130 and the progress line cleared. Returns (process, the rest of
        its stderr from the progress line's chunk on)."""
        ids = ",".join(str(1 + i % 250) for i in range(6000))
        t0 = time.time()
        p, err = self.start(args + ["--prompt-ids", ids, "-c", str(ctx), "--threads", "2"])
        # the load and the first chunk: a fraction of a second in the fast build, seconds in the
        # reference build (chunks of 16 positions there), longer on a busy machine
        head = self.read_until(err, marker)
        self.assertIn(marker, head, "the progress line on a terminal")
        first_chunk = time.time() - t0
        p.send_signal(signal.SIGINT)
        # it stops after the chunk under way, not after the rest of the prompt
        self.assertEqual(p.wait(timeout=60 + 3 * first_chunk), 130)
        tail = self.rest(err).decode(errors="replace")
        self.assertIn("\r\033[K", tail, "the progress line cleared")
        return p, head.decode(errors="replace") + tail

    def test_ctrl_c_during_the_prompt(self):
        # forward()'s chunks of 256 positions; the reference build's prompt goes in pieces of 16
        # (cli/generation.h, EXACT_SPLIT_PIECE), so that a Ctrl-C at its speed waits seconds, not minutes
        piece = 16 if hf_model.reference_engine() else 256
        p, tail = self.interrupt_long_prompt(["-n", "4"], b"prompt %d/6000 tokens" % piece)
        self.assertIn("run: interrupted during the prompt of 6000 tokens", tail)
        self.assertEqual(p.stdout.read(), b"", "nothing generated")

    def test_ctrl_c_during_eval(self):
        """-m eval stops after its chunk and reports the tokens scored so far, of the 5,994
        predictions in six windows of 1,000 tokens (each window's first token is predicted by
        none)."""
        p, tail = self.interrupt_long_prompt(["-m", "eval"], b"eval: ", ctx=1000)
        # the first chunk's predictions: 256, or the reference build's 16 (cli/generation.h, watched_piece)
        piece = 16 if hf_model.reference_engine() else 256
        first = re.search(r"\reval: (\d+) of 5994 predictions scored, loss so far", tail)
        self.assertEqual(int(first.group(1)) if first else None, piece, tail)
        self.assertRegex(tail, r"run: interrupted: the scores of the first \d+ of 5994 predictions")
        scored = int(tail.split("the first ")[1].split(" ")[0])
        self.assertLess(scored, 5994)
        self.assertIn("scored tokens  %d " % scored, p.stdout.read().decode())

    def test_ctrl_c_during_the_decode(self):
        p, err = self.start(["--prompt-ids", "1,2,3", "-n", "100000", "-c", "8192", "-t", "0"])
        first = p.stdout.read1(1)  # the first token's id
        self.assertNotEqual(first, b"")
        p.send_signal(signal.SIGINT)
        self.assertEqual(p.wait(timeout=60), 130)
        text = first + p.stdout.read()
        tail = self.rest(err).decode(errors="replace")
        self.assertIn("run: interrupted", tail)
        self.assertRegex(tail, r"generated tokens: \d+, decode: [\d.]+ tok/s, first token after")
        n = int(tail.split("generated tokens: ")[1].split(",")[0])
        self.assertLess(n, 8192, "stopped before the context was full")
        self.assertTrue(text.endswith(b"\n"), "the text so far, then a newline")
        self.assertGreaterEqual(len(text) - 1, n, "every token generated was printed (a byte at least each)")

    def test_reading_the_model_on_a_terminal(self):
        """The model's file (65 MB: three pieces of transformer_load's reading, LOAD_PIECE 32 MB)
        shows how far it is read on a terminal, one line cleared before the run goes on; not
        where stderr is a pipe."""
        # greedy, so that the one token is the same every run
        p, err = self.start(["--prompt-ids", "1", "-n", "1", "-t", "0"])
        text, status = p.stdout.read(), p.wait(timeout=60)
        out = self.rest(err).decode(errors="replace")
        self.assertEqual(status, 0, out)
        self.assertNotEqual(text, b"", "a token generated; stderr: %r" % out)
        self.assertRegex(out, r"run: reading slow\.bin: \d+% of 0\.1 GB(, [\d.]+ GB/s)?\033\[K")
        reading = out.index("run: reading")
        self.assertIn("\r\033[K", out[reading:out.index("prompt tokens:")], "the line cleared")
        piped = subprocess.run([hf_model.RUN, self.slow_model(), "--prompt-ids", "1", "-n", "1"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(piped.returncode, 0, piped.stderr)
        self.assertNotIn("reading", piped.stderr)


if __name__ == "__main__":
    import unittest
    unittest.main()
