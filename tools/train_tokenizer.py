#!/usr/bin/env python3
"""Train a small byte-level BPE tokenizer in the format of Qwen3's tokenizer.json.

Standard library only. Usage:

    python3 tools/train_tokenizer.py --input TEXT --vocab-size 2048 --out DIR

writes DIR/tokenizer.json and DIR/tokenizer_config.json. The result has the structure of
Qwen3's files (QWEN3.md section 4): NFC normalizer; pre-tokenizer Sequence[Split(Qwen2 regex,
Isolated), ByteLevel]; ByteLevel decoder; BPE model whose ids 0-255 are the 256 byte-characters
in GPT-2 bytes_to_unicode order and whose merge k produces token id 256 + k; then the added
tokens <|endoftext|>, <|im_start|>, <|im_end|> (special) and <think>, </think> (not special).
--vocab-size counts everything, added tokens included.

The module also exports pretokenize() and a Tokenizer class (encode/decode) that train.py uses.
"""
import argparse
import json
import os
import sys
import time
import unicodedata

# The pre-tokenizer regex exactly as in Qwen3's tokenizer.json (JSON-unescaped). Python's `re`
# has no \p{L}/\p{N}, so pretokenize() below is a hand-written scanner equivalent to it.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# (content, special) in id order after the BPE vocabulary; same contents and flags as Qwen3.
ADDED_TOKENS = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                ("<think>", False), ("</think>", False)]

# Unicode White_Space (what Oniguruma's \s means in the Rust tokenizers), QWEN3.md 4.3.
WHITESPACE = set(map(chr, [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2028,
                           0x2029, 0x202F, 0x205F, 0x3000] + list(range(0x2000, 0x200B))))
CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")  # in the regex's order


def _is_letter(c):
    return unicodedata.category(c)[0] == "L"


def _is_number(c):
    return unicodedata.category(c)[0] == "N"


def pretokenize(text):
    """Split text into pieces exactly like the Qwen2/Qwen3 Split regex (first alternative wins)."""
    out = []
    n = len(text)
    i = 0
    while i < n:
        c = text[i]
        # 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == "'":
            hit = 0
            for suf in CONTRACTIONS:
                if text[i + 1:i + 1 + len(suf)].lower() == suf:
                    hit = 1 + len(suf)
                    break
            if hit:
                out.append(text[i:i + hit])
                i += hit
                continue
        # 2. [^\r\n\p{L}\p{N}]?\p{L}+
        j = i
        if c not in "\r\n" and not _is_letter(c) and not _is_number(c) and i + 1 < n \
                and _is_letter(text[i + 1]):
            j = i + 1
        if _is_letter(text[j]):
            k = j + 1
            while k < n and _is_letter(text[k]):
                k += 1
            out.append(text[i:k])
            i = k
            continue
        # 3. \p{N} (a single number character)
        if _is_number(c):
            out.append(c)
            i += 1
            continue
        # 4. ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        j = i + 1 if c == " " else i

        def other(ch):
            return ch not in WHITESPACE and not _is_letter(ch) and not _is_number(ch)

        if j < n and other(text[j]):
            k = j + 1
            while k < n and other(text[k]):
                k += 1
            while k < n and text[k] in "\r\n":
                k += 1
            out.append(text[i:k])
            i = k
            continue
        # 5-7 start with whitespace; c must be whitespace here (every other character matched above)
        k = i
        while k < n and text[k] in WHITESPACE:
            k += 1
        assert k > i, "scanner bug: uncovered character %r" % c
        # 5. \s*[\r\n]+  -> up to the last CR/LF of the whitespace run
        last = -1
        for m in range(i, k):
            if text[m] in "\r\n":
                last = m
        if last >= 0:
            out.append(text[i:last + 1])
            i = last + 1
            continue
        # 6. \s+(?!\S): the whole run at the end of the text, else the run minus its last char
        if k == n:
            out.append(text[i:k])
            i = k
            continue
        if k - i >= 2:
            out.append(text[i:k - 1])
            i = k - 1
            continue
        # 7. \s+ (a single whitespace character before a non-space)
        out.append(text[i:k])
        i = k
    return out


def bytes_to_unicode():
    """GPT-2's byte -> character map (QWEN3.md 4.4), as a list indexed by byte value."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    m = {}
    for b in keep:
        m[b] = chr(b)
    extra = 0
    for b in range(256):
        if b not in m:
            m[b] = chr(0x100 + extra)
            extra += 1
    return [m[b] for b in range(256)]


def byte_alphabet_in_id_order():
    """The 256 byte-characters in Qwen's id order: 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF, then the rest."""
    b2u = bytes_to_unicode()
    order = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    order += [b for b in range(256) if b not in set(order)]
    return [b2u[b] for b in order]


def train_bpe(text, n_merges, log=True):
    """Return the list of merges (pairs of token strings) learned from text."""
    b2u = bytes_to_unicode()
    alphabet = byte_alphabet_in_id_order()
    tok_id = {s: i for i, s in enumerate(alphabet)}
    strings = list(alphabet)

    # unique pre-tokenized words with counts, as lists of byte-character ids
    counts = {}
    for piece in pretokenize(unicodedata.normalize("NFC", text)):
        counts[piece] = counts.get(piece, 0) + 1
    words = []
    freqs = []
    for piece, cnt in counts.items():
        words.append([tok_id[b2u[b]] for b in piece.encode("utf-8")])
        freqs.append(cnt)

    pair_count = {}
    pair_words = {}  # pair -> set of word indices that (may) contain it
    for wi, w in enumerate(words):
        f = freqs[wi]
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] = pair_count.get((a, b), 0) + f
            pair_words.setdefault((a, b), set()).add(wi)

    merges = []
    t0 = time.time()
    for k in range(n_merges):
        if not pair_count:
            break
        # most frequent pair; ties go to the pair with the smallest ids (deterministic)
        best = max(pair_count.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))
        (a, b), cnt = best
        if cnt < 2:
            break
        new_id = len(strings)
        strings.append(strings[a] + strings[b])
        merges.append((strings[a], strings[b]))
        for wi in list(pair_words.get((a, b), ())):
            w = words[wi]
            f = freqs[wi]
            # remove this word's old pair counts, merge, add the new ones
            for p in zip(w, w[1:]):
                pair_count[p] -= f
                if pair_count[p] == 0:
                    del pair_count[p]
            nw = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    nw.append(new_id)
                    i += 2
                else:
                    nw.append(w[i])
                    i += 1
            words[wi] = nw
            for p in zip(nw, nw[1:]):
                pair_count[p] = pair_count.get(p, 0) + f
                pair_words.setdefault(p, set()).add(wi)
        pair_words.pop((a, b), None)
        if log and (k + 1) % 500 == 0:
            print("  merge %d/%d  count %d  %r  (%.1fs)" % (k + 1, n_merges, cnt, strings[new_id],
                                                          time.time() - t0), file=sys.stderr)
    return merges


class Tokenizer:
    """Encoder/decoder for a tokenizer.json of this structure (the Qwen3 algorithm, QWEN3.md 4.2-4.7)."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        self.vocab = d["model"]["vocab"]
        self.id_to_str = {i: s for s, i in self.vocab.items()}
        self.ranks = {}
        for r, m in enumerate(d["model"]["merges"]):
            a, b = m if isinstance(m, list) else m.split(" ")
            self.ranks[(a, b)] = r
        self.added = {t["content"]: t["id"] for t in d["added_tokens"]}
        self.added_by_id = {t["id"]: t["content"] for t in d["added_tokens"]}
        self.special_ids = {t["id"] for t in d["added_tokens"] if t["special"]}
        self.b2u = bytes_to_unicode()
        self.u2b = {c: b for b, c in enumerate(self.b2u)}
        self.cache = {}

    def _bpe(self, piece):
        syms = [self.b2u[b] for b in piece.encode("utf-8")]
        while len(syms) > 1:
            best, best_i = None, -1
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, best_i = r, i
            if best is None:
                break
            syms[best_i:best_i + 2] = [syms[best_i] + syms[best_i + 1]]
        return [self.vocab[s] for s in syms]

    def encode(self, text):
        ids = []
        i = 0
        start = 0
        n = len(text)
        names = sorted(self.added, key=len, reverse=True)  # longest first at each position
        while i <= n:
            hit = None
            if i < n and text[i] == "<":
                for name in names:
                    if text.startswith(name, i):
                        hit = name
                        break
            if hit is None and i < n:
                i += 1
                continue
            seg = text[start:i]
            if seg:
                for piece in pretokenize(unicodedata.normalize("NFC", seg)):
                    got = self.cache.get(piece)
                    if got is None:
                        got = self.cache[piece] = self._bpe(piece)
                    ids.extend(got)
            if hit is None:
                break
            ids.append(self.added[hit])
            i += len(hit)
            start = i
        return ids

    def decode(self, ids, skip_special=False):
        out = bytearray()
        for t in ids:
            if t in self.added_by_id:
                if not (skip_special and t in self.special_ids):
                    out += self.added_by_id[t].encode("utf-8")
            elif t in self.id_to_str:
                out += bytes(self.u2b[c] for c in self.id_to_str[t])
        return out.decode("utf-8", errors="replace")


def write_tokenizer(out_dir, merges):
    alphabet = byte_alphabet_in_id_order()
    vocab = {s: i for i, s in enumerate(alphabet)}
    for a, b in merges:
        vocab[a + b] = len(vocab)  # merge k -> id 256 + k (every merged string is new)
    assert len(vocab) == 256 + len(merges), "a merge produced an existing token"
    added = []
    for k, (content, special) in enumerate(ADDED_TOKENS):
        added.append({"id": len(vocab) + k, "content": content, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": special})
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=2)
    added_decoder = {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                      "single_word", "special")} for t in added}
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True, help="training text (UTF-8)")
    ap.add_argument("--vocab-size", type=int, default=2048,
                    help="total size: 256 bytes + merges + %d added tokens" % len(ADDED_TOKENS))
    ap.add_argument("--out", required=True, help="output folder")
    args = ap.parse_args()
    with open(args.input, encoding="utf-8") as f:
        text = f.read()
    n_merges = args.vocab_size - 256 - len(ADDED_TOKENS)
    t0 = time.time()
    merges = train_bpe(text, n_merges)
    write_tokenizer(args.out, merges)
    tk = Tokenizer(os.path.join(args.out, "tokenizer.json"))
    ids = tk.encode(text)
    assert tk.decode(ids) == unicodedata.normalize("NFC", text), "round trip failed"
    print("%d merges, %d tokens total; %d chars -> %d tokens (%.2f chars/token); %.1fs"
          % (len(merges), 256 + len(merges) + len(ADDED_TOKENS), len(text), len(ids),
             len(text) / len(ids), time.time() - t0))


if __name__ == "__main__":
    main()
