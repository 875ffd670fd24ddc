#!/usr/bin/env python3
"""Compares two logits dumps of ./run --dump-logits (same prompt, same model shape, e.g. a q4 and
an f32 export of one model): top-1 agreement over the positions, and the error measure of
tests/test_model.py, max over positions of max|a - b| / max|b| (b is the baseline).

    ./run m_f32.bin --prompt-ids 1,2,...,64 -n 0 --dump-logits f32.logits
    ./run m_q4.bin  --prompt-ids 1,2,...,64 -n 0 --dump-logits q4.logits
    python3 tools/compare_logits.py q4.logits f32.logits VOCAB_SIZE

Python 3 standard library only.
"""
import array
import sys


def read_rows(path, vocab):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    if len(a) % vocab:
        sys.exit(f"compare_logits.py: {path}: {len(a)} floats is not a multiple of {vocab}")
    return [a[i:i + vocab] for i in range(0, len(a), vocab)]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    vocab = int(sys.argv[3])
    a, b = read_rows(sys.argv[1], vocab), read_rows(sys.argv[2], vocab)
    if len(a) != len(b):
        sys.exit(f"compare_logits.py: {len(a)} rows against {len(b)}")
    top1 = err = 0.0
    for ra, rb in zip(a, b):
        top1 += max(range(vocab), key=ra.__getitem__) == max(range(vocab), key=rb.__getitem__)
        err = max(err, max(abs(x - y) for x, y in zip(ra, rb)) / max(abs(y) for y in rb))
    print(f"{len(a)} positions: top-1 agreement {top1 / len(a):.3f}, max relative error {err:.3e}")


if __name__ == "__main__":
    main()
