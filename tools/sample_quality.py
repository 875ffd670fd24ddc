#!/usr/bin/env python3
"""Dictionary-word share of generated stories: a crude, honest quality measure for the tiny model.

    python3 tools/sample_quality.py [--model models/tinystories.bin] [--samples 20] [--tokens 200]
                                    [--prompt "Once upon a time"] [-- extra ./run flags]
    python3 tools/sample_quality.py --text FILE      (measure text already generated, e.g. by
                                                      `train.py --sample`; samples separated by
                                                      lines of -----)

Generates --samples stories with the C engine (`./run MODEL -i PROMPT -n TOKENS -s SEED` for seeds
1..N, plus any extra flags), and counts, over the generated text only (the prompt is removed):

  * words: the text is split on whitespace; from each chunk, leading and trailing characters that
    are not letters are stripped (quotes, commas, full stops, "--"...). A chunk that then has no
    letter (a number, a lone dash) is not counted. A chunk that still holds an inner hyphen or
    dash is split there ("well-known" counts as two words).
  * dictionary words: a word whose lowercase form is in the lowercased word list
    (/usr/share/dict/words, Debian's wamerican). The list holds possessives ("dog's") and plain
    forms; a word ending in 's or ’s also counts when the part before it is in the list
    ("Lily's"). Names absent from the list (e.g. "Timmy") count as non-words.

Prints every sample, then the share. Exit status 0; 1 when the engine fails. Standard library only.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_dictionary(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return {w.strip().lower() for w in f if w.strip()}


def words_of(text):
    out = []
    for chunk in text.split():
        for part in re.split(r"[-\u2010-\u2015]+", chunk):
            i, j = 0, len(part)
            while i < j and not part[i].isalpha():
                i += 1
            while j > i and not part[j - 1].isalpha():
                j -= 1
            if i < j:
                out.append(part[i:j])
    return out


def is_word(w, dictionary):
    lw = w.lower().replace("\u2019", "'")
    if lw in dictionary:
        return True
    return lw.endswith("'s") and lw[:-2] in dictionary


def measure(samples, dictionary):
    n_words = n_dict = 0
    misses = {}
    for s in samples:
        for w in words_of(s):
            n_words += 1
            if is_word(w, dictionary):
                n_dict += 1
            else:
                misses[w] = misses.get(w, 0) + 1
    return n_words, n_dict, misses


def main():
    ap = argparse.ArgumentParser(description="dictionary-word share of generated stories")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tinystories.bin"))
    ap.add_argument("--run", default=os.path.join(ROOT, "run"), help="the engine binary")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--dict", default="/usr/share/dict/words")
    ap.add_argument("--text", help="measure this file instead of running the engine")
    ap.add_argument("--quiet", action="store_true", help="do not print the samples")
    ap.add_argument("extra", nargs="*", help="extra ./run flags (after --)")
    args = ap.parse_args()

    dictionary = load_dictionary(args.dict)
    samples = []
    if args.text:
        with open(args.text, encoding="utf-8") as f:
            samples = [s for s in re.split(r"\n-----\n?", f.read()) if s.strip()]
        # the prompt is part of these samples: drop it from each when it is there
        samples = [s[len(args.prompt):] if s.startswith(args.prompt) else s for s in samples]
    else:
        for seed in range(1, args.samples + 1):
            cmd = [args.run, args.model, "-i", args.prompt, "-n", str(args.tokens), "-s", str(seed)] + args.extra
            p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
            if p.returncode != 0:
                print("engine failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
                return 1
            out = p.stdout
            samples.append(out[len(args.prompt):] if out.startswith(args.prompt) else out)
    n_words, n_dict, misses = measure(samples, dictionary)
    if not args.quiet:
        for i, s in enumerate(samples):
            print("--- sample %d ---\n%s%s" % (i + 1, args.prompt, s.rstrip()))
    top = sorted(misses.items(), key=lambda kv: -kv[1])[:20]
    print("non-dictionary words (most frequent): " + ", ".join("%s x%d" % kv for kv in top))
    print("samples %d, words %d, dictionary words %d, share %.1f%%"
          % (len(samples), n_words, n_dict, 100.0 * n_dict / max(1, n_words)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
