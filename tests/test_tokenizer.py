"""The tokenizer against the reference: every case of shared/qwen3-tokenizer/cases.jsonl (ids from
the Rust `tokenizers` library) must encode to exactly the listed ids, and decode back to NFC(text).
Also the chat template strings of QWEN3.md section 5 must encode to the ids listed there.

Needs ../shared/qwen3-tokenizer (next to the repository); SKIPS with a message when it is absent
(a user's clone). Uses export.py's tokenizer_section to build the tokenizer section from the real
tokenizer.json, and tests/test_tokenizer_unit --encode (built by `make test`) to run tokenizer.c.

    python3 -m unittest tests/test_tokenizer.py     (from the repository root, after make test)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unicodedata
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import unicode_reference  # noqa: E402
from hf_model import PYTHON  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK_DIR = os.environ.get("QWEN3_TOKENIZER_DIR", os.path.join(ROOT, "..", "shared", "qwen3-tokenizer"))
QWEN3_VOCAB_SIZE = 151936  # every Qwen3's embedding rows (QWEN3.md 1.1); the tokenizer's ids lie below
BINARY = os.path.join(os.environ.get("BUILD_DIR") or os.path.join(ROOT, "build"), "tests", "test_tokenizer_unit")

# QWEN3.md section 5: rendered template strings and their reference ids.
CHAT_CASES = [
    ("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
     [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198]),
    ("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
     [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198,
      151667, 271, 151668, 271]),
    ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
     "<|im_start|>assistant\n",
     [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 3838, 374, 220,
      17, 10, 17, 30, 151645, 198, 151644, 77091, 198]),
    ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>"
     "assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n",
     [151644, 8948, 198, 2610, 525, 50537, 13, 151645, 198, 151644, 872, 198, 3838, 374, 220, 17, 10, 17,
      30, 151645, 198, 151644, 77091, 198, 19, 151645, 198, 151644, 872, 198, 3036, 220, 18, 10, 18, 30,
      151645, 198, 151644, 77091, 198]),
]

# Ids from the reference (Rust tokenizers 0.22) where Unicode versions matter: U+31350 (CJK
# Extension H, Unicode 15.0) is a letter to its regex (Unicode 16.0); U+1DFA (Unicode 14.0) is not
# reordered by its NFC (Unicode 9.0).
UNICODE_VERSION_CASES = [
    ("\U00031350's", [172, 109, 235, 238, 594]),
    ("x\u0301\u1dfa", [87, 53839, 157, 115, 118]),
]


def have_reference():
    return os.path.exists(os.path.join(TOK_DIR, "tokenizer.json")) and os.path.exists(
        os.path.join(TOK_DIR, "cases.jsonl"))


def run_nfc(texts):
    data = b"".join(struct.pack("<I", len(t)) + t for t in (x.encode("utf-8") for x in texts))
    p = subprocess.run([BINARY, "--nfc"], input=data, capture_output=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(p.stderr.decode(errors="replace"))
    out, pos = [], 0
    while pos < len(p.stdout):
        (n,) = struct.unpack_from("<I", p.stdout, pos)
        out.append(p.stdout[pos + 4:pos + 4 + n].decode("utf-8"))
        pos += 4 + n
    return out


class TestNFC(unittest.TestCase):
    """tokenizer.c's NFC (unicode_tables.c) equals the reference's Unicode 9.0 NFC: Python's
    unicodedata.normalize('NFC') except across the characters Unicode 9.0 did not have
    (tests/unicode_reference.py). Needs nothing outside the repository."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(BINARY):
            raise unittest.SkipTest(f"{BINARY} is not built (run `make test`)")

    def test_every_decomposable_and_combining_character(self):
        texts = []
        chars = [chr(c) for c in range(0x110000)
                 if not 0xD800 <= c < 0xE000 and (unicodedata.decomposition(chr(c)) and
                                                  not unicodedata.decomposition(chr(c)).startswith("<")
                                                  or unicodedata.combining(chr(c)))]
        for ch in chars:  # alone, after a base letter, before and after combining marks
            texts += [ch, "a" + ch, ch + "́", "e" + ch + "̧", "ᄀ" + ch]
        got = run_nfc(texts)
        want = [unicode_reference.nfc(t) for t in texts]
        bad = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
        self.assertEqual(bad[:5], [], f"{len(bad)} of {len(texts)} differ")

    def test_random_sequences(self):
        import random
        rng = random.Random(1)
        pool = [chr(c) for c in list(range(0x300, 0x370)) + list(range(0x1100, 0x1200)) + [0x41, 0x61, 0x65,
                0x3b1, 0x3c9, 0x915, 0x93c, 0xb47, 0xb3e, 0xb57, 0x1f00, 0x1f80, 0xac00, 0xac01, 0x212b, 0xc5,
                0x20, 0x4e2d, 0x1d15e, 0x1d165, 0x1d16e, 0x0f71, 0x0f72, 0x0f80, 0x0fb3, 0x05d0, 0x05b4, 0x05bc]]
        texts = ["".join(rng.choice(pool) for _ in range(rng.randrange(1, 30))) for _ in range(20000)]
        got = run_nfc(texts)
        bad = [t for t, g in zip(texts, got) if g != unicode_reference.nfc(t)]
        self.assertEqual(bad[:3], [], f"{len(bad)} of {len(texts)} differ")


@unittest.skipUnless(have_reference(), f"reference tokenizer data not found at {TOK_DIR} "
                     "(only in the development workspace; set QWEN3_TOKENIZER_DIR to point elsewhere)")
class TestTokenizerReference(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(BINARY):
            raise unittest.SkipTest(f"{BINARY} is not built (run `make test`)")
        sys.path.insert(0, ROOT)
        import export  # the same code that writes real checkpoints
        cls.tmp = tempfile.TemporaryDirectory()
        cls.section = os.path.join(cls.tmp.name, "qwen3.tok")
        with open(cls.section, "wb") as f:
            f.write(export.tokenizer_section(os.path.join(TOK_DIR, "tokenizer.json"),
                                             os.path.join(TOK_DIR, "tokenizer_config.json"),
                                             QWEN3_VOCAB_SIZE))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def encode(self, texts):
        """[(ids, round_trip_ok)] for each text (bytes or str)."""
        data = b"".join(struct.pack("<I", len(t)) + t for t in
                        (x.encode("utf-8") if isinstance(x, str) else x for x in texts))
        p = subprocess.run([BINARY, "--encode", self.section], input=data, capture_output=True,
                           timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        lines = p.stdout.decode().split("\n")[:-1]
        self.assertEqual(len(lines), len(texts))
        out = []
        for line in lines:
            ids, ok = line.split("\t")
            out.append(([int(x) for x in ids.split()], ok == "1"))
        return out

    def test_cases_jsonl(self):
        with open(os.path.join(TOK_DIR, "cases.jsonl"), encoding="utf-8") as f:
            cases = [json.loads(line) for line in f if line.strip()]
        self.assertGreater(len(cases), 1000)
        results = self.encode([c["text"] for c in cases])
        wrong = [(c["text"], c["ids"], got) for c, (got, _) in zip(cases, results) if got != c["ids"]]
        msg = "\n".join(f"{t[:80]!r}: want {w[:20]} got {g[:20]}" for t, w, g in wrong[:5])
        self.assertEqual(len(wrong), 0, f"{len(wrong)} of {len(cases)} cases differ:\n{msg}")
        # decode(encode(text)) == NFC(text) (checked in C against tokenizer.c's NFC) ...
        bad_rt = [c["text"] for c, (_, ok) in zip(cases, results) if not ok]
        self.assertEqual(bad_rt, [], "round trip failed")

    def test_chat_template_ids(self):
        results = self.encode([t for t, _ in CHAT_CASES])
        for (text, want), (got, ok) in zip(CHAT_CASES, results):
            self.assertEqual(got, want, repr(text))
            self.assertTrue(ok)

    def test_unicode_version_cases(self):
        results = self.encode([t for t, _ in UNICODE_VERSION_CASES])
        for (text, want), (got, ok) in zip(UNICODE_VERSION_CASES, results):
            self.assertEqual(got, want, ascii(text))
            self.assertTrue(ok)

    def test_invalid_utf8_and_nul(self):
        texts = [b"\xff\xfe", b"a\x00b", b"\xc3", b"\xe4\xb8", b"ok \xed\xa0\x80 surrogate", b"\x00" * 100,
                 bytes(range(256)), b"<|im_start|>\xff<|im_end|>"]
        for (ids, _), t in zip(self.encode(texts), texts):
            self.assertTrue(all(0 <= i < 151669 for i in ids), t)
            self.assertGreater(len(ids), 0, t)

    def test_random_bytes_do_not_crash(self):
        import random
        rng = random.Random(7)
        texts = [bytes(rng.randrange(256) for _ in range(rng.randrange(200))) for _ in range(300)]
        self.assertEqual(len(self.encode(texts)), 300)

    def test_run_tokenize_mode(self):
        """The contract `./run MODEL -m tokenize` (stdin or -i; --prompt-ids the other way) on a
        checkpoint that carries the real tokenizer (a tiny random model from tests/hf_model.py, exported with --tokenizer)."""
        run = os.environ.get("QWEN3_RUN") or os.path.join(ROOT, "run")
        if not os.path.exists(run):
            self.skipTest("./run is not built (make)")
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import hf_model
        # as many embedding rows as a Qwen3 (every id of the real tokenizer needs one), the rest
        # tiny: tokenize mode never looks at the weights
        spec = hf_model.Spec(vocab_size=QWEN3_VOCAB_SIZE, dim=4, hidden_dim=8, n_layers=1, n_heads=1,
                             n_kv_heads=1, head_dim=4)
        hf = os.path.join(self.tmp.name, "hf")
        hf_model.write_model(hf, spec)
        ck = os.path.join(self.tmp.name, "tiny.bin")
        p = subprocess.run([*PYTHON, os.path.join(ROOT, "export.py"), hf, ck, "--tokenizer", TOK_DIR],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(TOK_DIR, "cases.jsonl"), encoding="utf-8") as f:
            cases = [json.loads(line) for line in f if line.strip()][:30]
        for c in cases:
            p = subprocess.run([run, ck, "-m", "tokenize"], input=c["text"].encode("utf-8"),
                               capture_output=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual([int(x) for x in p.stdout.split()], c["ids"], repr(c["text"]))
        p = subprocess.run([run, ck, "-m", "tokenize", "-i", "Hello, world!"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.stdout.strip(), "9707 11 1879 0")
        # --prompt-ids: the other way, each case's ids to its text as the tokenizer normalised it (NFC)
        for c in cases:
            p = subprocess.run([run, ck, "-m", "tokenize", "--prompt-ids", ",".join(map(str, c["ids"]))],
                               capture_output=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout, unicodedata.normalize("NFC", c["text"]).encode("utf-8"), repr(c["text"]))


if __name__ == "__main__":
    unittest.main()
