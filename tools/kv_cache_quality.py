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

Prints two markdown tables (README's Limits has them; docs/design.md#kv-cache the layout).
Standard library only; run from anywhere: python3 tools/kv_cache_quality.py [--tokens N].
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests'))
import hf_model  # noqa: E402
from reference import Reference, log_softmax_loss  # noqa: E402

CACHES = ('f32', 'f16', 'q8')


def engine_loss(model, args):
    """The engine's -m eval --json record for model with extra arguments."""
    p = subprocess.run([os.path.join(ROOT, 'run'), model, '-m', 'eval', '--json'] + args, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit('kv_cache_quality.py: ./run failed: ' + p.stderr.strip()[-500:])
    return json.loads(p.stdout.splitlines()[0])


def reference_loss(rows, ids):
    """Mean -log softmax(row)[next id] over every position but the last, as -m eval scores."""
    return log_softmax_loss(rows, ids[1:])[0] / (len(ids) - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--tokens', type=int, default=120, help='random token ids for the random model (default 120)')
    ap.add_argument('--seed', type=int, default=3)
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


if __name__ == '__main__':
    main()
