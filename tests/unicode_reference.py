"""What the reference tokenizer (Rust `tokenizers` 0.22) does with each code point, computed by a code
path that shares nothing with tokenizer.c but the data: tests/data/unicode_reference.txt (written by
tools/gen_unicode_tables.py with the C tables), Python's re for the Split regex and Python's
unicodedata for NFC. Used by tests/test_tokenizer_unicode.py and tests/test_tokenizer.py.

The reference takes its regex classes from Oniguruma (Unicode 16.0) and its NFC from
unicode-normalization-alignments (Unicode 9.0):
  * pieces(text): the Split regex of tokenizer.json run by Python's re on a copy of the text in
    which every non-ASCII character is replaced by an ASCII one of the same class (letter 'A',
    number '0', White_Space '\\t', anything else '!'), and the regex's \\p{L}, \\p{N}, \\s by the
    ASCII classes. Only the class of a non-ASCII character matters to the regex, except for the
    case-insensitive contractions after an apostrophe ('ſ' matches 's' there): callers do not put
    an apostrophe before a non-ASCII character.
  * nfc(text): Python's unicodedata.normalize('NFC') on the stretches between the characters that
    Python's Unicode data treats as combining or composing but Unicode 9.0 did not know. A character
    unknown to Unicode 9.0 is, to the reference's normalizer, a starter that never decomposes or
    composes, so NFC never acts across it; and for characters Unicode 9.0 knew, Python's data gives
    the 9.0 results (combining classes, decompositions and exclusions never change once assigned;
    checked against the file's classes by test_tokenizer_unicode).
"""
import functools
import os
import re
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "tests", "data", "unicode_reference.txt")

# The pre-tokenizer regex of Qwen3's tokenizer.json (QWEN3.md 4.3), JSON-unescaped.
SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
ASCII_CLASS = {r"\p{L}": "A-Za-z", r"\p{N}": "0-9", r"\s": "\t\n\x0b\x0c\r "}


def _ranges(lo, hi):
    return range(int(lo, 16), int(hi, 16) + 1)


@functools.lru_cache(maxsize=None)
def table():
    """{'L', 'N', 'WS', 'M', 'A9': set of code points, 'CCC9': {code point: class}} from the file."""
    t = {"L": set(), "N": set(), "WS": set(), "M": set(), "A9": set(), "CCC9": {}}
    with open(TABLE, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            kind, lo, hi, *rest = line.split()
            if kind == "CCC9":
                t["CCC9"].update((cp, int(rest[0])) for cp in _ranges(lo, hi))
            else:
                t[kind].update(_ranges(lo, hi))
    return t


def ascii_regex(pattern=SPLIT_REGEX):
    """pattern with \\p{L}, \\p{N}, \\s, \\S written as ASCII classes (inside a bracket or alone)."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        token = next((k for k in ASCII_CLASS if pattern.startswith(k, i)), None)
        if token:
            out.append(ASCII_CLASS[token] if in_class else "[" + ASCII_CLASS[token] + "]")
            i += len(token)
        elif pattern.startswith(r"\S", i):
            assert not in_class
            out.append("[^" + ASCII_CLASS[r"\s"] + "]")
            i += 2
        elif pattern[i] == "\\":
            out.append(pattern[i:i + 2])
            i += 2
        else:
            in_class = (in_class and pattern[i] != "]") or (not in_class and pattern[i] == "[")
            out.append(pattern[i])
            i += 1
    return "".join(out)


@functools.lru_cache(maxsize=None)
def _class_map():
    t = table()
    for cp in range(128):  # the ASCII classes ascii_regex assumes
        ch = chr(cp)
        assert (cp in t["L"]) == ch.isalpha(), cp
        assert (cp in t["N"]) == ("0" <= ch <= "9"), cp
        assert (cp in t["WS"]) == (ch in ASCII_CLASS[r"\s"]), cp
    m = [chr(cp) if cp < 128 else "!" for cp in range(0x110000)]
    for kind, rep in (("L", "A"), ("N", "0"), ("WS", "\t")):
        for cp in t[kind]:
            if cp >= 128:
                m[cp] = rep
    return m


@functools.lru_cache(maxsize=None)
def _split_regex():
    return re.compile(ascii_regex())


def pieces(text):
    """The lengths in code points of the regex's pieces of text (text is already normalised)."""
    return [len(p) for p in _split_regex().findall(text.translate(_class_map()))]


@functools.lru_cache(maxsize=None)
def newer_normalizing():
    """The characters that Python's unicodedata decomposes, composes or gives a combining class but
    that Unicode 9.0 did not have, as a compiled character class (None when there are none)."""
    a9, found = table()["A9"], set()
    for cp in range(0x110000):
        if cp in a9 or 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        d = unicodedata.decomposition(ch)
        if unicodedata.combining(ch) or (d and not d.startswith("<")):
            found.add(cp)
            if d and not d.startswith("<"):
                found.update(x for x in (int(h, 16) for h in d.split()) if x not in a9)
    if not found:
        return None
    return re.compile("([" + "".join("\\U%08x" % cp for cp in sorted(found)) + "])")


def nfc(text):
    """NFC of text as the reference's Unicode 9.0 normalizer computes it."""
    split = newer_normalizing()
    parts = split.split(text) if split else [text]
    # odd indexes are the separating characters, left as they are
    return "".join(p if i % 2 else unicodedata.normalize("NFC", p) for i, p in enumerate(parts))
