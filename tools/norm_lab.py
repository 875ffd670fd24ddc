#!/usr/bin/env python3
"""The RMSNorm lab (`make norm-lab`): what each use of RMSNorm does for a trained model.

Runs `./run MODEL -m eval --json --file TEXT` once as trained and once per switch of the lab
(--ablate qk-norm / pre-norms / final-norm / norm-weight / norm-scale, --norm-eps, --norm
layernorm), prints a Markdown table of loss, perplexity and top-1 accuracy, and a greedy sample
per configuration (those with the same text together), and writes the same to docs/norm-lab.md
(--out). Standard library only.

The default text is models/tinystories_valid_excerpt.txt: the first 32,520 bytes of the TinyStories
validation text the shipped model was validated on and never trained on (tools/train.py --valid;
its tokenizer was trained on the training text only); models/tinystories_valid_excerpt.SOURCE.md
says where it comes from and its licence (CDLA-Sharing-1.0).

    python3 tools/norm_lab.py [--model PATH] [--text PATH] [--out PATH|-] [--run PATH]
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (label, ./run switches, what changes at the RMSNorm call sites)
CONFIGS = [
    ('baseline', [], 'the model as trained: out = w * (x / sqrt(mean(x^2) + eps)), eps = the model\'s'),
    ('--ablate qk-norm', ['--ablate', 'qk-norm'], 'q and k heads go to RoPE unnormalised'),
    ('--ablate pre-norms', ['--ablate', 'pre-norms'], 'attention and the MLP read the raw residual stream'),
    ('--ablate final-norm', ['--ablate', 'final-norm'], 'lm_head reads the raw residual stream'),
    ('--ablate norm-weight', ['--ablate', 'norm-weight'], 'w = 1 everywhere: only the 1/rms scale'),
    ('--ablate norm-scale', ['--ablate', 'norm-scale'], 'no 1/rms anywhere: only the weight'),
    ('--norm-eps 0', ['--norm-eps', '0'], 'no epsilon'),
    ('--norm-eps 1e-4', ['--norm-eps', '1e-4'], 'epsilon %s the model\'s'),  # %s: eps_ratio's
    ('--norm-eps 1e-2', ['--norm-eps', '1e-2'], 'epsilon %s'),
    ('--norm-eps 1', ['--norm-eps', '1'], 'epsilon %s'),
    ('--norm layernorm', ['--norm', 'layernorm'], 'x - mean(x) first: LayerNorm without a bias'),
    # the final norm in its two parts: the per-channel weight's shape, and its size (one gain)
    ('--ablate norm-gain@final', ['--ablate', 'norm-gain@final'],
     'the final norm\'s weight replaced by one gain, its mean: its size kept, its shape across channels lost'),
    ('--ablate norm-weight@final', ['--ablate', 'norm-weight@final'],
     'the final norm\'s weight = 1: its size and its shape lost, only the 1/rms scale'),
]


def per_layer_configs(n_layers):
    """QK-Norm and the pre-norms left out in one layer at a time: which layer's norm matters."""
    rows = []
    for name, what in (('qk-norm', 'QK-Norm left out in layer %d only'),
                       ('pre-norms', 'pre-attention and pre-MLP norms left out in layer %d only')):
        for l in range(n_layers):
            rows.append(('--ablate %s@%d' % (name, l), ['--ablate', '%s@%d' % (name, l)], what % l))
    return rows


def checkpoint_header(path):
    """(n_layers, rms_norm_eps) from the checkpoint's header (model.h, FileHeader: the seventh
    32-bit field, and the float after the first fourteen)."""
    with open(path, 'rb') as f:
        head = f.read(60)
    if len(head) < 60 or head[:4] != b'QW3C':
        fail('%s: not a checkpoint of this engine' % path)
    return struct.unpack_from('<I', head, 24)[0], struct.unpack_from('<f', head, 56)[0]


def eps_ratio(eps, model_eps):
    """How many times the model's epsilon eps is: '100x', '10^4 x' for whole powers of ten."""
    r = eps / model_eps
    k = round(math.log10(r))
    if abs(r / 10 ** k - 1) < 1e-4:
        return '%dx' % 10 ** k if k <= 2 else '10^%d x' % k
    return '%.3gx' % r
SAMPLE_PROMPT = 'Once upon a time'
SAMPLE_TOKENS = 40


def fail(msg):
    sys.exit('norm_lab: error: ' + msg)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, errors='replace')
    if p.returncode != 0:
        fail('%s failed (status %d): %s' % (' '.join(cmd), p.returncode, p.stderr.strip()))
    return p.stdout


def evaluate(args, switches):
    out = run([args.run_path, args.model_path, '-m', 'eval', '--json', '--file', args.text_path] + switches)
    return json.loads(out.strip().splitlines()[-1])


def sample(args, switches):
    cmd = [args.run_path, args.model_path, '-i', SAMPLE_PROMPT, '-n', str(SAMPLE_TOKENS), '-t', '0'] + switches
    p = subprocess.run(cmd, capture_output=True, text=True, errors='replace')
    if p.returncode == 1 and 'is NaN' in p.stderr:  # a switch that breaks the model: its text is that
        return '(no text: %s)' % p.stderr.strip().splitlines()[-1].replace('run: error: ', '')
    if p.returncode != 0:
        fail('%s failed (status %d): %s' % (' '.join(cmd), p.returncode, p.stderr.strip()))
    return ' '.join(p.stdout.split())  # one line: newlines and runs of spaces as single spaces


def fmt(v, spec):
    return 'n/a' if v is None else format(v, spec)


def table(results):
    base = results[0][3]['loss']
    lines = ['| switches | what changes | loss (nats/token) | perplexity | top-1 | loss - baseline |',
             '|---|---|---:|---:|---:|---:|']
    for label, _, what, r in results:
        delta = None if r['loss'] is None or base is None else r['loss'] - base
        lines.append('| `%s` | %s | %s | %s | %s | %s |' % (
            label, what, fmt(r['loss'], '.4f'), fmt_ppl(r['ppl']), fmt(r['top1'], '.4f'),
            '' if label == 'baseline' else fmt(delta, '+.4f')))
    return lines


def grouped_samples(args, results):
    """[(labels, text)]: a greedy sample per configuration, those with the same text together."""
    groups = {}
    for label, switches, _, _ in results:
        groups.setdefault(sample(args, switches), []).append(label)
    return [(labels, text) for text, labels in groups.items()]


def fmt_ppl(v):
    return 'n/a' if v is None else ('%.2f' % v if v < 1e4 else '%.3g' % v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default='models/tinystories.bin')
    ap.add_argument('--text', default='models/tinystories_valid_excerpt.txt')
    ap.add_argument('--out', default='docs/norm-lab.md', help="the Markdown file to write ('-': none)")
    ap.add_argument('--run', default=os.environ.get('QWEN3_RUN') or './run')
    args = ap.parse_args()
    # The defaults are the repository's files wherever this runs from; paths given are the user's.
    for name in ('run', 'model', 'text'):
        given = getattr(args, name)
        path = given if given != ap.get_default(name) else os.path.join(ROOT, given)
        if not os.path.exists(path):
            fail('%s: %s not found%s' % (given, {'run': 'the engine', 'model': 'the model', 'text': 'the text'}[name],
                                         ' (run make)' if name == 'run' else ''))
        setattr(args, name + '_path', os.path.abspath(path))

    t0 = time.time()
    results = []
    n_layers, model_eps = checkpoint_header(args.model_path)
    configs = [(label, switches, what % eps_ratio(float(switches[1]), model_eps) if '%s' in what else what)
               for label, switches, what in CONFIGS]
    for label, switches, what in configs + per_layer_configs(n_layers):
        sys.stderr.write('norm_lab: %s\n' % label)
        results.append((label, switches, what, evaluate(args, switches)))
    samples = grouped_samples(args, results)
    seconds = time.time() - t0

    n_bytes = os.path.getsize(args.text_path)
    lines = [
        '# The RMSNorm lab: each use of RMSNorm on the shipped model',
        '',
        'Generated by `make norm-lab` (`python3 tools/norm_lab.py`); do not edit by hand. Each row is',
        '`./run %s -m eval --file %s`' % (args.model, args.text),
        'with the switches shown: the text (%d bytes) in windows of the model\'s context, every token of' % n_bytes,
        'a window but its first scored (%d tokens). Loss is the mean' % results[0][3]['tokens'],
        'negative log-likelihood in nats per token, perplexity exp(loss), top-1 the share of tokens that',
        'are the argmax of their logits. The switches change only the forward pass, never the weights:',
        'the model was trained with every RMSNorm as Qwen3 has them, so each row shows what it has come',
        'to depend on. A switch with @ changes one layer only (@final: the final norm only). What each',
        'norm does for training, with models trained with and without it, is `make norm-train-lab`',
        '([norm-train-lab.md](norm-train-lab.md)).',
        '',
    ]
    if args.text == 'models/tinystories_valid_excerpt.txt':
        lines += ['The text is the first %d bytes of the TinyStories validation text the shipped model was' % n_bytes,
                  'validated on and never trained on (CDLA-Sharing-1.0; models/tinystories_valid_excerpt.SOURCE.md).',
                  '']
    lines += table(results)
    lines += ['', 'Greedy samples, `-i "%s" -n %d -t 0` with the same switches (switches whose samples are' % (
        SAMPLE_PROMPT, SAMPLE_TOKENS), 'the same text share a line):', '']
    for labels, text in samples:
        lines += ['* %s: %s' % (', '.join('`%s`' % l for l in labels), text.replace('|', '\\|')), '']
    text = '\n'.join(lines).rstrip('\n') + '\n'  # the same file on every run: no timing in it
    sys.stdout.write(text)
    sys.stderr.write('norm_lab: %d evaluations and %d samples in %.0f s\n' % (len(results), len(results), seconds))
    if args.out != '-':
        out = os.path.join(ROOT, args.out) if args.out == ap.get_default('out') else args.out
        tmp = out + '.tmp'
        with open(tmp, 'w', encoding='utf-8') as f:
            f.write(text)
        os.replace(tmp, out)  # never a half-written file
        sys.stderr.write('norm_lab: wrote %s\n' % args.out)


if __name__ == '__main__':
    main()
