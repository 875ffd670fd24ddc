"""--show-norms=all and --norms-json (cli/norm_trace.c) against the plain-Python reference
(tests/reference.py) on tiny random models: every field of every line, at every position (the
prompt's and each generated token's), for every call site and head; and the logits unchanged with
the trace on. The default --show-norms table is tests/test_model.py's test_show_norms.

Precision: the JSON numbers are printed with 9 significant digits (float32's), and the engine
computes in float32 what the reference computes in double, so they are compared to 1e-4 relative
(the end-to-end logits bound, TIGHT_TOL in test_model.py); the table's are printed with 4
significant digits and compared to 1e-3 relative, as test_show_norms does.
"""

import json
import math
import os
import re
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402
from hf_model import Spec, IM_START_ID  # noqa: E402
import reference  # noqa: E402
from reference import Reference, argmax  # noqa: E402

USE_OF = {'pre-attention': 1, 'QK-Norm q': 2, 'QK-Norm k': 2, 'pre-MLP': 3, 'final norm': 4}
JSON_TOL = 1e-4
TABLE_TOL = 1e-3

# name -> (Spec fields, prompt ids, greedy steps)
MODELS = {
    # Qwen3 with head_dim 32 != 64/4 and one kv head for four query heads; F32.
    'qwen3_gqa4_hd32': (dict(dtype='F32', n_heads=4, n_kv_heads=1, head_dim=32, seed=21),
                        [IM_START_ID, 5, 6, 7, 290, 9], 4),
    # Qwen2: q/k/v biases, no QK-Norm (the attention scores are still reported).
    'qwen2_bias': (dict(arch='qwen2', head_dim=None, n_kv_heads=2, seed=22), [40, 41, 42, 43], 3),
}


def rms(v):
    return math.sqrt(sum(a * a for a in v) / len(v))


def expected_lines(ref, seq, kv_f16=False, bf16_prefill=0):
    """(pos, layer, site, head) -> the fields --norms-json must give there, from the reference."""
    norms, scores = [], []
    logits = ref.forward(seq, norms=norms, scores=scores, kv_f16=kv_f16, bf16_prefill=bf16_prefill)
    want = {}
    for pos, layer, site, vectors, weight in norms:
        for h, x in enumerate(vectors):
            r = rms(x)
            want[(pos, layer, site, h if len(vectors) > 1 else None)] = {
                'use': USE_OF[site], 'rms_in': r, 'mean_in': sum(x) / len(x),
                'scale': 1.0 / math.sqrt(r * r + ref.eps), 'rms_w': rms(weight),
                'rms_out': rms(ref.rmsnorm(x, weight, ref.eps))}
    G = ref.H // ref.K
    for pos, layer, head, s in scores:
        want[(pos, layer, 'attention', head)] = {'kv_head': head // G, 'keys': pos + 1,
                                                 'max_score': max(abs(v) for v in s)}
    return want, logits


class NormTrace(hf_model.TempDirTestCase):
    NEEDS = 'for the trace tests'

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.expected = {}  # (model, kv_f16, sequence) -> expected_lines(...)[0]

    def model(self, name):
        """(HF folder, f32 checkpoint) of MODELS[name], made once."""
        folder = os.path.join(self.tmp, name)
        ckpt = folder + '.bin'
        if not os.path.exists(ckpt):
            hf_model.write_model(folder, Spec(**MODELS[name][0]))
            p = hf_model.run_export(folder, ckpt, 'f32')
            self.assertEqual(p.returncode, 0, p.stderr)
        return folder, ckpt

    def want(self, name, seq, kv_f16=False, bf16_prefill=0):
        key = (name, kv_f16, bf16_prefill, tuple(seq))
        if key not in self.expected:
            self.expected[key] = expected_lines(Reference(self.model(name)[0]), seq, kv_f16=kv_f16,
                                                bf16_prefill=bf16_prefill)[0]
        return self.expected[key]

    def run_traced(self, name, extra, tag, base=()):
        """./run greedy with --dump-logits and `base`, once plain and once with `extra` too: the
        traced run's process and the sequence of tokens that went through the model."""
        folder, ckpt = self.model(name)
        _, prompt, n = MODELS[name]
        rows = {}
        for label, more in (('plain', list(base)), (tag, list(base) + extra)):
            dump = os.path.join(self.tmp, '%s.%s.logits' % (name, label))
            args = [ckpt, '--prompt-ids', ','.join(map(str, prompt)), '-n', str(n), '-t', '0',
                    '--dump-logits', dump] + more
            p = hf_model.run_engine(args)
            self.assertEqual(p.returncode, 0, p.stderr)
            rows[label] = hf_model.read_logits(dump, MODELS[name][0].get('vocab_size', 300))
        self.assertEqual(rows[tag], rows['plain'], '%s changed the logits' % ' '.join(extra))
        seq = list(prompt) + [argmax(r) for r in rows['plain'][len(prompt) - 1:-1]]
        self.assertEqual(len(seq), len(rows['plain']))
        self.assertGreater(len(seq), len(prompt), 'no generated token went through the model')
        return p, seq

    def check_json(self, name, kv_flags=(), kv_f16=False):
        path = os.path.join(self.tmp, '%s%s.jsonl' % (name, '.f16' if kv_f16 else ''))
        _, seq = self.run_traced(name, ['--norms-json', path], 'json', base=kv_flags)
        prompt = MODELS[name][1]
        # prefill over an fp16 cache multiplies bf16 pairs where the kernels are "+bf16" (reference.py)
        pairs = kv_f16 and len(prompt) > 1 and '+bf16' in hf_model.engine_kernels(self.model(name)[1])
        want = self.want(name, seq, kv_f16, len(prompt) if pairs else 0)
        got = {}
        with open(path) as f:
            for line in f:
                obj = json.loads(line)
                key = (obj['position'], obj['layer'], obj['site'], obj['head'])
                self.assertNotIn(key, got, 'line twice: %s' % line)
                got[key] = obj
        self.assertEqual(sorted(got, key=repr), sorted(want, key=repr), name + ': the lines')
        for key, fields in want.items():
            for field, b in fields.items():
                a = got[key][field]
                if isinstance(b, int):
                    self.assertEqual(a, b, '%s %s %s' % (name, key, field))
                    continue
                # mean(x) can be near 0: its error is measured against the vector's size.
                size = abs(fields['rms_in']) if field == 'mean_in' else abs(b)
                self.assertLess(abs(a - b), JSON_TOL * size + 1e-9,
                                '%s %s %s: %r printed, reference %.9g' % (name, key, field, a, b))
        return want

    def test_norms_json_qwen3(self):
        """Every call site, position and head of q and k, every field, and each query head's
        largest |q.k|/sqrt(d) over its keys; the decode path's positions included."""
        want = self.check_json('qwen3_gqa4_hd32')
        self.assertIn((7, 1, 'QK-Norm k', None), want)  # one kv head: k is one vector of head_dim
        self.assertTrue(any(k[2] == 'QK-Norm q' and k[3] == 3 for k in want))

    def test_norms_json_qwen2(self):
        """No QK-Norm: the other three sites, and the attention scores of un-normalised q and k."""
        want = self.check_json('qwen2_bias')
        self.assertFalse(any(k[2].startswith('QK-Norm') for k in want))
        self.assertTrue(any(k[2] == 'attention' for k in want))

    def test_norms_json_f16_cache(self):
        """--kv-cache f16: the scores use the keys as the cache holds them (halves); where prefill
        multiplies bf16 pairs over them, the reference does too."""
        self.check_json('qwen3_gqa4_hd32', kv_flags=('--kv-cache', 'f16'), kv_f16=True)

    def test_final_norm_where_the_head_runs(self):
        """Without --dump-logits only the last row of each forward() call goes through the final norm:
        the prompt's last position, then each decoded one. The trace's table keeps forward()'s own
        chunks in the reference build too, whose prompt otherwise goes in pieces of 16 (a final
        norm at 15 would show that): a prompt of 20 tokens."""
        name = 'qwen3_gqa4_hd32'
        _, ckpt = self.model(name)
        prompt, n = MODELS[name][1] + list(range(100, 114)), MODELS[name][2]
        path = os.path.join(self.tmp, 'final_norms.jsonl')
        p = hf_model.run_engine([ckpt, '--prompt-ids', ','.join(map(str, prompt)), '-n', str(n), '-t', '0',
                                 '--norms-json', path])
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(path) as f:
            final = [obj['position'] for obj in map(json.loads, f) if obj['site'] == 'final norm']
        self.assertEqual(final, list(range(len(prompt) - 1, len(prompt) + n - 1)))

    def test_show_norms_all_table(self):
        """--show-norms=all: one line per position, call site and head, with the reference's
        values to the 4 digits printed."""
        name = 'qwen3_gqa4_hd32'
        p, seq = self.run_traced(name, ['--show-norms=all'], 'all')
        line_re = re.compile(r'^\s*(\d+)\s+(-|\d+)\s+([1-4])\s+(pre-attention|QK-Norm q|QK-Norm k|pre-MLP|final norm)'
                             r'\s+(-|\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$')
        got = [m.groups() for m in map(line_re.match, p.stderr.splitlines()) if m]
        want = {k: v for k, v in self.want(name, seq).items() if k[2] != 'attention'}
        keys = [(int(g[0]), int(g[1]) if g[1] != '-' else -1, g[3], int(g[4]) if g[4] != '-' else None) for g in got]
        self.assertEqual(sorted(keys, key=repr), sorted(want, key=repr), p.stderr)
        self.assertEqual(len(set(keys)), len(keys))
        for key, g in zip(keys, got):
            w = want[key]
            self.assertEqual(int(g[2]), w['use'])
            for text, field in zip(g[5:], ('rms_in', 'mean_in', 'scale', 'rms_w', 'rms_out')):
                size = w['rms_in'] if field == 'mean_in' else abs(w[field])
                self.assertLess(abs(float(text) - w[field]), TABLE_TOL * size + 1e-12,
                                '%s %s: %s printed, reference %.6g' % (key, field, text, w[field]))

    def test_plot_norms_copies_and_pictures(self):
        """tools/plot_norms.py: a checkpoint copy scaled by 1 is the file itself; one without
        QK-Norm runs as the reference does without it; doubling q_proj and k_proj quadruples layer
        0's scores without QK-Norm and leaves them with it; the pictures are well-formed SVG with
        their titles and legends."""
        import xml.etree.ElementTree as ET
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tools'))
        import plot_norms
        name = 'qwen3_gqa4_hd32'
        folder, ckpt = self.model(name)
        _, prompt, _ = MODELS[name]
        same = os.path.join(self.tmp, 'same.bin')
        plot_norms.scale_qk_checkpoint(ckpt, 1, same)
        with open(ckpt, 'rb') as a, open(same, 'rb') as b:
            self.assertEqual(a.read(), b.read())
        # a Qwen3-MoE checkpoint (its layers hold experts, not the MLP the tool walks) is refused
        with open(ckpt, 'rb') as f:
            moe = bytearray(f.read())
        struct.pack_into('<I', moe, 12, struct.unpack_from('<I', moe, 12)[0] | 16)  # FLAG_MOE
        with self.assertRaisesRegex(ValueError, 'Qwen3-MoE'):
            plot_norms.checkpoint_plan(plot_norms.HEADER.unpack_from(bytes(moe), 0))
        traces = {}
        for factor in (1, 2):
            for qk_norm in (True, False):
                copy = os.path.join(self.tmp, 'x%d%s.bin' % (factor, '' if qk_norm else '.noqk'))
                plot_norms.scale_qk_checkpoint(ckpt, factor, copy, drop_qk_norm=not qk_norm)
                trace, dump = copy + '.jsonl', copy + '.logits'
                p = hf_model.run_engine([copy, '--prompt-ids', ','.join(map(str, prompt)), '-n', '0',
                                         '--norms-json', trace, '--dump-logits', dump])
                self.assertEqual(p.returncode, 0, p.stderr)
                traces[factor, qk_norm] = plot_norms.read_trace(trace)
                if factor == 1 and not qk_norm:
                    rows = hf_model.read_logits(dump, 300)
                    ref = Reference(folder).forward(prompt, skip_qk_norm=True)
                    self.assertLess(reference.rel_error(rows, ref), JSON_TOL)
        best = {k: plot_norms.max_score_per_layer(v) for k, v in traces.items()}
        self.assertAlmostEqual(best[2, False][0] / best[1, False][0], 4.0, places=4)
        self.assertAlmostEqual(best[2, True][0] / best[1, True][0], 1.0, places=4)
        self.assertFalse(any(o['site'].startswith('QK') for o in traces[1, False]))
        plot_norms.sites_pictures(traces[1, True], self.tmp, 'test')
        plot_norms.plot_scores({1: traces[1, True], 2: traces[2, True]}, {1: traces[1, False], 2: traces[2, False]},
                               os.path.join(self.tmp, 'scores.svg'), 'test')
        for svg, words in (('norms-rms-in.svg', ('pre-attention', 'QK-Norm k', 'final norm', 'layer 1', 'position')),
                           ('norms-scale.svg', ('pre-MLP', 'scale = 1/sqrt')),
                           ('scores.svg', ('without QK-Norm', 'with QK-Norm', 'layer 0', 'factor on q_proj'))):
            root = ET.parse(os.path.join(self.tmp, svg)).getroot()
            text = ' '.join(t.text or '' for t in root.iter('{http://www.w3.org/2000/svg}text'))
            for w in words:
                self.assertIn(w, text, svg)
            self.assertTrue(list(root.iter('{http://www.w3.org/2000/svg}polyline')), svg)

    def test_norm_precision_report(self):
        """tools/norm_precision.c (make norm-precision): its tables have every size and the
        properties the formats imply, by wide margins: fp32 sums within 1e-5 of fp64 and bf16 ones
        further off; the rsqrt instruction alone 11 to 13 correct bits, with a Newton step over 20;
        Hugging Face's bf16 order further from fp64 than the engine's fp32 path."""
        import subprocess
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        lab = os.path.join(os.environ.get('BUILD_DIR', os.path.join(root, 'build')), 'tools', 'norm_precision')
        if not os.access(lab, os.X_OK):
            self.skipTest('%s is not built (make test or make norm-precision builds it)' % lab)
        p = subprocess.run([lab], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = {}
        for line in p.stdout.splitlines():
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            if line.startswith('|') and not line.startswith('|-') and cells[0] not in ('n', '1/sqrt(m) in fp32'):
                rows.setdefault(cells[0], []).append(cells[1:])

        def median(cell):
            return float(cell.split('/')[0])
        for n in ('128', '256', '512', '1024', '2048', '2560', '4096', '5120'):
            f32, lanes, bf16, f16 = rows[n][0]
            self.assertLess(median(f32), 1e-5)
            self.assertLess(median(lanes), 1e-5)
            self.assertGreater(median(bf16), 10 * median(f32))
        for n in ('128', '1024', '5120'):
            engine, hf, _ = rows[n][1]
            self.assertGreater(median(hf), 100 * median(engine))
        division = rows['`1.0f / sqrtf(m)` (kernels/norm.c)'][0]
        self.assertGreater(float(division[2]), 22)
        alone = rows['`_mm_rsqrt_ps` alone'][0]
        if 'not measured' in alone[0]:
            return
        self.assertTrue(11 <= float(alone[2]) <= 13, alone)
        self.assertGreater(float(rows['`_mm_rsqrt_ps` + one Newton step'][0][2]), 20)

    def test_header_follows_the_formula(self):
        """The table's header gives the formula its columns follow: RMSNorm's, and under --norm
        layernorm the centred one (scale from the variance), in both tables."""
        _, ckpt = self.model('qwen2_bias')
        rms = 'out = w * (x * scale), scale = 1/sqrt(mean(x^2) + eps)'
        centred = 'out = w * ((x - mean(x)) * scale),\nscale = 1/sqrt(mean((x - mean(x))^2) + eps)'
        for show in ('--show-norms', '--show-norms=all'):
            for lab, want, other in (([], rms, centred), (['--norm', 'layernorm'], centred, rms)):
                p = hf_model.run_engine([ckpt, '--prompt-ids', '1,2', '-n', '0', show] + lab)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn(want, p.stderr, show)
                self.assertNotIn(other, p.stderr, show)

    def test_bad_options(self):
        _, ckpt = self.model('qwen2_bias')
        p = hf_model.run_engine([ckpt, '--prompt-ids', '1', '-n', '0', '--show-norms=some'])
        self.assertEqual(p.returncode, 2)
        self.assertIn("--show-norms takes no value or =all, got '--show-norms=some'", p.stderr)
        missing = os.path.join(self.tmp, 'no-such-folder', 'n.jsonl')
        p = hf_model.run_engine([ckpt, '--prompt-ids', '1', '-n', '0', '--norms-json', missing])
        self.assertEqual(p.returncode, 1)
        self.assertIn(missing + ': cannot open for writing', p.stderr)
        self.assertFalse(os.path.exists(missing))
        p = hf_model.run_engine([ckpt, '-m', 'tokenize', '-i', 'a', '--norms-json', missing])
        self.assertIn('ignores --norms-json', p.stderr)


if __name__ == '__main__':
    unittest.main()
