"""The tokenizer's Unicode data on every code point against the reference tokenizer's (Rust
`tokenizers` 0.22: regex classes of Unicode 16.0 from Oniguruma, NFC of Unicode 9.0 from
unicode-normalization-alignments; tools/gen_unicode_tables.py says where each table comes from).

The expectation is computed by tests/unicode_reference.py (Python's re and unicodedata on the ranges
of tests/data/unicode_reference.txt), a code path separate from tokenizer.c's tables; the ranges
file itself is checked against Python's own Unicode data for every character Python knows. Needs
tests/test_tokenizer_unit (built by `make test`), nothing outside the repository.

    python3 -m unittest tests/test_tokenizer_unicode.py     (from the repository root)
"""
import os
import struct
import subprocess
import sys
import unicodedata
import unittest
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import unicode_reference as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(os.environ.get("BUILD_DIR") or os.path.join(ROOT, "build"), "tests", "test_tokenizer_unit")
UT_L, UT_N, UT_WS, UT_UNSAFE = 1, 2, 4, 8

# Unicode White_Space (QWEN3.md 4.3: Oniguruma's \s in the reference).
WHITE_SPACE = {*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
               0x205F, 0x3000}

# Where every code point x is put: the contexts in which a difference in its class shows.
CONTEXTS = ["{}'", " {}", "{}\n", "1{}", "{}{}"]
# Where every mark and every character with a combining class or a canonical decomposition in any
# of the Unicode versions at hand (9.0, 16.0, this Python's) is put: next to U+0301 (class 230) and
# U+0345 (class 240) on either side, which shows whether it is reordered or composed. (That every
# other code point has class 0 and no decomposition in tokenizer.c is test_c_tables_equal_file.)
MARK_CONTEXTS = ["x{}\u0301", "x\u0301{}", "x{}\u0345", "x\u0345{}"]
SEPARATOR = "\n"  # a starter that never composes, so NFC of the joined probes = joined NFCs


def all_code_points():
    return [cp for cp in range(0x110000) if not 0xD800 <= cp < 0xE000]


def normalization_candidates():
    t = ref.table()
    out = t["M"] | set(t["CCC9"])
    for cp in all_code_points():
        d = unicodedata.decomposition(chr(cp))
        if unicodedata.combining(chr(cp)) or (d and not d.startswith("<")):
            out.add(cp)
    return sorted(out)


def need_binary():
    if not os.path.exists(BINARY):
        raise unittest.SkipTest(f"{BINARY} is not built (run `make test`)")


def engine_pieces(texts):
    """[(NFC text, [piece lengths in code points])] from tokenizer.c, one subprocess for all."""
    data = b"".join(struct.pack("<I", len(t)) + t for t in (x.encode("utf-8") for x in texts))
    p = subprocess.run([BINARY, "--pieces"], input=data, capture_output=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(p.stderr.decode(errors="replace"))
    out, pos = [], 0
    for _ in texts:
        (n,) = struct.unpack_from("<I", p.stdout, pos)
        norm = p.stdout[pos + 4:pos + 4 + n].decode("utf-8")
        (count,) = struct.unpack_from("<I", p.stdout, pos + 4 + n)
        lengths = array("I")
        lengths.frombytes(p.stdout[pos + 8 + n:pos + 8 + n + 4 * count])
        if sys.byteorder != "little":
            lengths.byteswap()
        out.append((norm, lengths.tolist()))
        pos += 8 + n + 4 * count
    return out


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def show(text, at):
    """The code points of text from a little before offset at, the one at `at` marked >...<."""
    cps = ["U+%04X" % ord(c) for c in text[max(0, at - 4):at + 6]]
    i = at - max(0, at - 4)
    if i < len(cps):
        cps[i] = ">" + cps[i] + "<"
    return " ".join(cps)


class TestReferenceTable(unittest.TestCase):
    """tests/data/unicode_reference.txt against Python's own Unicode data, and the C tables against
    the file."""

    def test_file_agrees_with_python_unicodedata(self):
        t = ref.table()
        wrong = []
        for cp in all_code_points():
            ch = chr(cp)
            cat = unicodedata.category(ch)
            if cat != "Cn" and ((cp in t["L"]) != (cat[0] == "L") or (cp in t["N"]) != (cat[0] == "N")):
                wrong.append("U+%04X %s in class" % (cp, cat))
            if cp in t["A9"] and unicodedata.combining(ch) != t["CCC9"].get(cp, 0):
                wrong.append("U+%04X combining class" % cp)
        self.assertEqual(wrong[:10], [], f"{len(wrong)} differences from unicodedata "
                         f"{unicodedata.unidata_version}")
        self.assertEqual(t["WS"], WHITE_SPACE)
        self.assertFalse(set(t["CCC9"]) - t["A9"], "a combining class outside Unicode 9.0")
        # the classes the reference has and this Python (Unicode 14 in 3.11) lacks
        for cp, kind in ((0x31350, "L"), (0x13460, "L"), (0x1D2C0, "N")):
            self.assertIn(cp, t[kind])

    def test_c_tables_equal_file(self):
        need_binary()
        p = subprocess.run([BINARY, "--unicode-props"], capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(p.stdout), 2 * 0x110000)
        t = ref.table()
        props, ccc = p.stdout[0::2], p.stdout[1::2]
        wrong = []
        for cp in range(0x110000):
            want = (UT_L * (cp in t["L"])) | (UT_N * (cp in t["N"])) | (UT_WS * (cp in t["WS"]))
            if props[cp] & (UT_L | UT_N | UT_WS) != want or ccc[cp] != t["CCC9"].get(cp, 0):
                wrong.append("U+%04X" % cp)
            elif ccc[cp] and not props[cp] & UT_UNSAFE:
                wrong.append("U+%04X not UT_UNSAFE" % cp)
        self.assertEqual(wrong[:10], [], f"{len(wrong)} code points differ")


class TestEveryCodePoint(unittest.TestCase):
    """Every code point in each of CONTEXTS (and the marks in MARK_CONTEXTS): tokenizer.c's NFC and
    pieces equal the reference's."""

    def test_contexts(self):
        need_binary()
        cps, marks = all_code_points(), normalization_candidates()
        self.assertGreater(len(marks), 3000)
        contexts = [(c, cps) for c in CONTEXTS] + [(c, marks) for c in MARK_CONTEXTS]
        texts = [SEPARATOR.join(c.replace("{}", chr(cp)) for cp in cps) for c, cps in contexts]
        for (context, _), text, (got_nfc, got_pieces) in zip(contexts, texts, engine_pieces(texts)):
            want_nfc = ref.nfc(text)
            if got_nfc != want_nfc:
                at = first_difference(got_nfc, want_nfc)
                self.fail(f"context {context!r}: NFC differs at {show(want_nfc, at)}: "
                          f"got {show(got_nfc, at)}")
            want_pieces = ref.pieces(want_nfc)
            if got_pieces != want_pieces:
                i = first_difference(got_pieces, want_pieces)
                at = sum(want_pieces[:i])
                self.fail(f"context {context!r}: pieces differ at {show(want_nfc, at)}: "
                          f"got {got_pieces[i:i + 4]}, want {want_pieces[i:i + 4]}")

    def test_unicode_versions(self):
        """One character of each kind the reference treats by its own Unicode versions."""
        need_binary()
        cases = [  # (text, NFC, piece lengths)
            ("\U00031350's", "\U00031350's", [1, 2]),            # CJK Ext. H (16.0): a letter
            ("\U000143FA\U00013460", "\U000143FA\U00013460", [2]),  # Egyptian hieroglyphs (16.0)
            ("\U0001D2C0\U0001D2D3", "\U0001D2C0\U0001D2D3", [1, 1]),  # Kaktovik numerals (15.0)
            ("x\u0301\u1dfa", "x\u0301\u1dfa", [1, 2]),        # U+1DFA (14.0): not reordered
            ("\U00011935\U00011930", "\U00011935\U00011930", [2]),  # not composed to U+11938 (13.0)
            ("x\u0301\u0316", "x\u0316\u0301", [1, 2]),        # Unicode 9.0 marks are reordered
            ("\u0958'", "\u0915\u093c'", [1, 2]),              # and exclusions decomposed
        ]
        got = engine_pieces([t for t, _, _ in cases])
        for (text, want_nfc, want_pieces), (nfc, pieces) in zip(cases, got):
            self.assertEqual((nfc, pieces), (want_nfc, want_pieces), ascii(text))
            self.assertEqual(ref.pieces(ref.nfc(text)), want_pieces, ascii(text))


if __name__ == "__main__":
    unittest.main()
