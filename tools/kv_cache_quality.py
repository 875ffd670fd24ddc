#!/usr/bin/env python3
"""kv_cache_quality.py: what each KV cache type (--kv-cache f32, f16, q8) costs in -m eval loss.

  1. The shipped model (models/tinystories.bin) on its validation excerpt: the engine's loss with
     each cache.
  2. A tiny random Qwen3 (tests/hf_model.py; head_dim 32, GQA 2) on --tokens random token ids:
     the engine's loss with each cache beside the plain-Python reference's (tests/reference.py)
     with the same cache modelled (Reference.forward(kv_f16=..., kv_q8=...); where the kernels
     have AVX-512 BF16, "+bf16", prefill over the fp16 and q8 caches multiplies bf16 pairs and the
     reference models that too, bf16_prefill), and the f32 reference's loss, so that each line
     shows what the cache changes and that the engine computes what the reference says it should.

  3. Decode: the shipped model generating greedily from single token ids (every position then goes
     through decode attention, where over a q8 cache with AVX-512 VNNI or AVX2 alone ("+vnni",
     "+int8") the query is quantised to int8): each cache's logits (--dump-logits) against the f32 cache's, position by
     position up to where the greedy tokens first differ: the mean KL divergence and that position.

Prints three markdown tables (README's Limits has them; docs/design.md#kv-cache the layout).
Standard library only; run from anywhere: python3 tools/kv_cache_quality.py [--tokens N].
"""

import argparse
import json
import math
import os
import re
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests'))
import hf_model  # noqa: E402
from reference import Reference, argmax, log_softmax_loss  # noqa: E402

CACHES = ('f32', 'f16', 'q8')
DECODE_IDS = (300, 500, 700, 900, 1100)  # section 3's first tokens (the shipped model's vocab is 2,048)


def engine_loss(model, args):
    """The engine's -m eval --json record for model with extra arguments."""
    p = subprocess.run([os.path.join(ROOT, 'run'), model, '-m', 'eval', '--json'] + args, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit('kv_cache_quality.py: ./run failed: ' + p.stderr.strip()[-500:])
    return json.loads(p.stdout.splitlines()[0])


def shipped_vocab(model):
    """The vocabulary size in the bench's first line (\"vocab 2048\")."""
    p = subprocess.run([os.path.join(ROOT, 'run'), model, '-m', 'bench', '--bench-prompt', '1', '--bench-gen', '1',
                        '--bench-reps', '1'], cwd=ROOT, capture_output=True, text=True, timeout=600)
    m = re.search(r'vocab (\d+)', p.stdout)
    if not m:
        sys.exit('kv_cache_quality.py: no vocab in the bench output')
    return int(m.group(1))


def reference_loss(rows, ids):
    """Mean -log softmax(row)[next id] over every position but the last, as -m eval scores."""
    return log_softmax_loss(rows, ids[1:])[0] / (len(ids) - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--tokens', type=int, default=120, help='random token ids for the random model (default 120)')
    ap.add_argument('--seed', type=int, default=3)
    ap.add_argument('--steps', type=int, default=200, help='decode steps per start in section 3 (default 200)')
    a = ap.parse_args()
    if not os.path.exists(os.path.join(ROOT, 'run')):
        sys.exit('kv_cache_quality.py: no ./run: build it with make first')

    shipped = os.path.join(ROOT, 'models', 'tinystories.bin')
    text = os.path.join(ROOT, 'models', 'tinystories_valid_excerpt.txt')
    print('| cache | shipped model, loss (nats/token) | tokens |')
    print('|---|---|---|')
    for kv in CACHES:
        r = engine_loss(shipped, ['--file', text, '--kv-cache', kv])
        print('| %s | %.6f | %d |' % (kv, r['loss'], r['tokens']))

    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, 'hf')
        hf_model.write_model(hf, hf_model.Spec(dtype='F32', head_dim=32, n_heads=4, n_kv_heads=2, seed=a.seed,
                                               max_position_embeddings=max(128, a.tokens)))
        ckpt = os.path.join(tmp, 'model.bin')
        p = hf_model.run_export(hf, ckpt, 'f32')
        if p.returncode != 0:
            sys.exit('kv_cache_quality.py: export failed: ' + p.stderr.strip()[-500:])
        rng = random.Random(a.seed)
        ids = [rng.randrange(3, 270) for _ in range(a.tokens)]
        ref = Reference(hf)
        plain = reference_loss(ref.forward(ids), ids)
        kernels = hf_model.engine_kernels(ckpt)
        pairs = len(ids) if '+bf16' in kernels else 0  # -m eval scores the ids as one prefill
        print()
        print('kernels %s: prefill over the fp16 and q8 caches %s' % (kernels, 'in bf16 pairs' if pairs else 'in fp32'))
        print('| cache | random model, engine loss | reference, same cache | engine - reference | '
              'reference, cache - f32 |')
        print('|---|---|---|---|---|')
        for kv in CACHES:
            got = engine_loss(ckpt, ['--prompt-ids', ','.join(map(str, ids)), '-c', str(a.tokens), '--kv-cache', kv])
            want = reference_loss(ref.forward(ids, kv_f16=kv == 'f16', kv_q8=kv == 'q8',
                                                    bf16_prefill=pairs if kv != 'f32' else 0), ids)
            print('| %s | %.6f | %.6f | %+.1e | %+.1e |' % (kv, got['loss'], want, got['loss'] - want, want - plain))

    print()
    print('decode, the shipped model from %d single token ids, %d steps each:' % (len(DECODE_IDS), a.steps))
    decode_table(shipped, shipped_vocab(shipped), DECODE_IDS, a.steps)


def dumped_logits(model, args, vocab):
    """Every position's logits of a generation with extra arguments (--dump-logits)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'logits.bin')
        p = subprocess.run([os.path.join(ROOT, 'run'), model, '--dump-logits', path] + args, cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            sys.exit('kv_cache_quality.py: ./run failed: ' + p.stderr.strip()[-500:])
        return hf_model.read_logits(path, vocab)


def kl(p_row, q_row):
    """KL(softmax(p_row) || softmax(q_row)) in fp64."""
    def log_softmax(row):
        m = max(row)
        lse = m + math.log(sum(math.exp(v - m) for v in row))
        return [v - lse for v in row]
    lp, lq = log_softmax(p_row), log_softmax(q_row)
    return sum(math.exp(a) * (a - b) for a, b in zip(lp, lq))


def decode_table(model, vocab, first_ids, steps):
    """Section 3 of the module's docstring."""
    print('| cache | mean KL(f32 \u2016 cache) per position | positions until the greedy tokens differ |')
    print('|---|---|---|')
    runs = {kv: [dumped_logits(model, ['--prompt-ids', str(i), '-n', str(steps), '-t', '0', '-c', str(steps + 1),
                                       '--kv-cache', kv], vocab) for i in first_ids] for kv in CACHES}
    for kv in CACHES[1:]:
        total, n, first = 0.0, 0, []
        for want, got in zip(runs['f32'], runs[kv]):
            t = 0
            while t < min(len(want), len(got)):
                total += kl(want[t], got[t])
                n += 1
                if argmax(want[t]) != argmax(got[t]):
                    break
                t += 1
            first.append(t)
        print('| %s | %.2e | %s |' % (kv, total / n, ' / '.join(map(str, first))))


if __name__ == '__main__':
    main()
