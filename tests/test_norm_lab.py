"""The RMSNorm lab: `./run -m eval` and the switches --ablate, --norm-eps, --norm layernorm.

  * Each switch (and a combination) against the plain-Python reference (tests/reference.py,
    Reference.lab_norm) on a tiny random Qwen3, prefill and greedy decode: TIGHT_TOL as in
    test_model.py (the engine computes in fp32, the reference in double).
  * Each switch changes the logits (by at least MISTAKE_MIN of the largest logit); without the
    switches, and with the ones that name the model as it is (--norm-eps equal to the model's,
    --norm rmsnorm), the logits are the same bits.
  * eval's loss, perplexity and top-1 equal what a user computes from --dump-logits of the same
    token ids, window by window, with log-softmax in fp64 (to the 6 decimals eval prints: 1e-4 is
    the bound the task sets, 2e-6 what the printing allows).
  * The command line: text from -i, --file or standard input; notes and errors.
"""

import json
import math
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402
from hf_model import Spec, IM_START_ID  # noqa: E402
from reference import Reference, rel_error, argmax, log_softmax_loss  # noqa: E402
from hf_model import PYTHON  # noqa: E402

TIGHT_TOL = 1e-4
MISTAKE_MIN = 1e-2
PROMPT = [IM_START_ID, 33, 256, 71, 259, 2, 100, 220]

# name -> (./run arguments, Reference.forward arguments)
SWITCHES = {
    'qk-norm': (['--ablate', 'qk-norm'], dict(ablate=('qk-norm',))),
    'final-norm': (['--ablate', 'final-norm'], dict(ablate=('final-norm',))),
    'pre-norms': (['--ablate', 'pre-norms'], dict(ablate=('pre-norms',))),
    'norm-weight': (['--ablate', 'norm-weight'], dict(ablate=('norm-weight',))),
    'norm-scale': (['--ablate', 'norm-scale'], dict(ablate=('norm-scale',))),
    'eps 1e-2': (['--norm-eps', '1e-2'], dict(eps=1e-2)),
    'eps 0': (['--norm-eps', '0'], dict(eps=0.0)),
    'layernorm': (['--norm', 'layernorm'], dict(layernorm=True)),
    'combined': (['--ablate', 'norm-weight,final-norm', '--norm', 'layernorm', '--norm-eps', '1e-3'],
                 dict(ablate=('norm-weight', 'final-norm'), layernorm=True, eps=1e-3)),
    # one layer, or the final norm, at a time (the test model has layers 0 and 1)
    'norm-gain': (['--ablate', 'norm-gain'], dict(ablate=('norm-gain',))),
    'qk-norm@1': (['--ablate', 'qk-norm@1'], dict(ablate=('qk-norm@1',))),
    'pre-norms@0': (['--ablate', 'pre-norms@0'], dict(ablate=('pre-norms@0',))),
    'norm-weight@final': (['--ablate', 'norm-weight@final'], dict(ablate=('norm-weight@final',))),
    'norm-gain@final': (['--ablate', 'norm-gain@final'], dict(ablate=('norm-gain@final',))),
    'per-layer combined': (['--ablate', 'qk-norm@0,1,norm-scale@1,final', '--norm-eps', '1e-3'],
                           dict(ablate=('qk-norm@0,1', 'norm-scale@1,final'), eps=1e-3)),
}


class NormLab(hf_model.TempDirTestCase):
    NEEDS = 'for the RMSNorm lab tests'

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        why = hf_model.missing_tools()
        if why:
            return
        # Small q/k projections (mean square ~2.5e-5 before QK-Norm): eps 0 against 1e-6 changes the
        # logits by a few percent, not a rounding error.
        cls.hf = os.path.join(cls.tmp, 'hf')
        hf_model.write_model(cls.hf, Spec(dtype='F32', qk_gain=0.005, seed=7, max_position_embeddings=512))
        cls.ckpt = os.path.join(cls.tmp, 'model.bin')
        p = hf_model.run_export(cls.hf, cls.ckpt, 'f32')
        assert p.returncode == 0, p.stderr
        cls.V = hf_model.read_header(cls.ckpt)['vocab_size']
        cls.ref = Reference(cls.hf)
        cls.n_dump = 0

    def engine(self, args, ckpt=None, stdin=None):
        p = subprocess.run([hf_model.RUN, ckpt or self.ckpt] + list(args), cwd=hf_model.ROOT, capture_output=True,
                           text=True, timeout=60, input=stdin)
        return p

    def dump(self, ids, extra=(), n=0):
        """The logits rows of ./run --prompt-ids ids -n n -t 0 with extra arguments, as bytes and rows."""
        NormLab.n_dump += 1
        path = os.path.join(self.tmp, 'd%d.f32' % self.n_dump)
        args = ['--prompt-ids', ','.join(map(str, ids)), '-n', str(n), '-t', '0', '--dump-logits', path] + list(extra)
        p = self.engine(args)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn('note', p.stderr)
        with open(path, 'rb') as f:
            raw = f.read()
        return raw, hf_model.read_logits(path, self.V)

    def eval_json(self, args, ckpt=None, stdin=None):
        p = self.engine(['-m', 'eval', '--json'] + list(args), ckpt, stdin)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        self.assertEqual(len(lines), 1, p.stdout)
        return json.loads(lines[0])

    # ---- the switches -------------------------------------------------------------------------

    def test_switches_match_the_reference(self):
        """Prompt (prefill) and 5 greedy steps (decode) under each switch, against the reference
        with the same switch on the sequence the engine produced."""
        for name, (args, ref_kw) in SWITCHES.items():
            with self.subTest(switch=name):
                _, rows = self.dump(PROMPT, args, n=5)
                seq = PROMPT + [argmax(r) for r in rows[len(PROMPT) - 1:-1]]
                self.assertEqual(len(seq), len(rows))
                err = rel_error(rows, self.ref.forward(seq, **ref_kw))
                self.assertLess(err, TIGHT_TOL, '%s: engine vs reference' % name)

    def test_reference_switches_are_not_the_plain_model(self):
        """The reference's switches themselves change its logits (so the comparison above is not
        the plain model compared with itself)."""
        plain = self.ref.forward(PROMPT)
        for name, (_, ref_kw) in SWITCHES.items():
            self.assertGreater(rel_error(self.ref.forward(PROMPT, **ref_kw), plain), MISTAKE_MIN, name)

    def test_each_switch_changes_the_logits(self):
        raw, base = self.dump(PROMPT)
        for name, (args, _) in SWITCHES.items():
            with self.subTest(switch=name):
                _, rows = self.dump(PROMPT, args)
                self.assertGreater(rel_error(rows, base), MISTAKE_MIN, name)

    def test_absent_switches_change_no_bit(self):
        """Without switches the forward pass is the model's own rmsnorm op at every call site; the switches that
        name the model as it is (its own eps, --norm rmsnorm) keep those bits."""
        raw, _ = self.dump(PROMPT, n=3)
        eps = repr(hf_model.read_header(self.ckpt)['rms_norm_eps'])  # the float32 value, exactly
        for extra in (['--norm-eps', eps], ['--norm', 'rmsnorm']):
            other, _ = self.dump(PROMPT, extra, n=3)
            self.assertEqual(other, raw, extra)

    def test_chat_takes_the_switches(self):
        p = self.engine(['-m', 'chat', '-i', 'hi', '-n', '2', '-t', '0', '--ablate', 'final-norm', '--norm-eps', '1e-3'])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn('note', p.stderr)

    def test_unknown_and_bad_values(self):
        for args, msg in ((['--ablate', 'qk-norm,bias'], "--ablate: unknown name 'bias' (valid: qk-norm, final-norm, "
                                                          "pre-norms, norm-weight, norm-scale, norm-gain)"),
                          (['--ablate', ''], "--ablate: unknown name ''"),
                          (['--ablate', 'qk-norm@x'], "--ablate: qk-norm@: 'x' is not a layer number, a range such as 1-3"),
                          (['--ablate', 'qk-norm@final'], "--ablate: qk-norm has no final site (final-norm leaves the final norm out; @final is for norm-weight, norm-scale and norm-gain)"),
                          (['--ablate', 'final-norm@0'], '--ablate: final-norm is one call site, after the last layer'),
                          (['--ablate', 'pre-norms@2'], "--ablate pre-norms@2: the model's layers are 0 to 1"),
                          (['--ablate', 'norm-weight@3-1'], "--ablate: norm-weight@: '3-1' is not a layer number"),
                          # digits only: strtol took these as layer 0, 1 to 2, 1 to 2
                          (['--ablate', 'qk-norm@0-'], "--ablate: qk-norm@: '0-' is not a layer number"),
                          (['--ablate', 'qk-norm@1-+1'], "--ablate: qk-norm@: '1-+1' is not a layer number"),
                          (['--ablate', 'qk-norm@0- 1'], "--ablate: qk-norm@: '0- 1' is not a layer number"),
                          (['--ablate', 'qk-norm@99999'], "--ablate qk-norm@99999: the model's layers are 0 to 1"),
                          (['--norm', 'batchnorm'], '--norm must be rmsnorm or layernorm'),
                          (['--norm-eps', '-1'], '--norm-eps must be in [0, 100]')):
            p = self.engine(['--prompt-ids', '1', '-n', '1'] + args)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn('run: error: ' + msg, p.stderr)
            self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)

    def test_notes_in_other_modes(self):
        for args, note in ((['-m', 'tokenize', '-i', 'hi', '--ablate', 'qk-norm', '--norm', 'layernorm'],
                            '-m tokenize ignores --ablate and --norm (generate, chat and eval options)'),
                           (['-m', 'chat', '-i', 'hi', '-n', '1', '--file', 'x'],
                            '-m chat ignores --file (generate, eval and tokenize option)'),
                           (['--prompt-ids', '1', '-n', '1', '--json'],
                            '-m generate ignores --json (-m bench and -m eval option)'),
                           (['-m', 'eval', '-i', 'hello world', '-t', '0.5'],
                            '-m eval ignores --temperature (generate and chat option)')):
            p = self.engine(args)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn('run: note: ' + note + '\n', p.stderr)

    def test_qk_norm_on_a_model_without_it(self):
        d = os.path.join(self.tmp, 'hf_llama')
        hf_model.write_model(d, Spec(arch='llama', dtype='F32', head_dim=None, seed=4))
        ckpt = os.path.join(self.tmp, 'llama.bin')
        self.assertEqual(hf_model.run_export(d, ckpt, 'f32').returncode, 0)
        p = self.engine(['--prompt-ids', '1,2', '-n', '1', '--ablate', 'qk-norm'], ckpt)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('run: note: --ablate qk-norm changes nothing: this model has no QK-Norm', p.stderr)

    def test_per_layer_switches_reach_their_layers_only(self):
        """A switch limited to every layer the model has gives the bits of the switch itself, and
        one limited to a layer is neither the plain model nor the switch everywhere."""
        _, base = self.dump(PROMPT)
        for name, at in (('qk-norm', '0-1'), ('pre-norms', '0,1'), ('norm-weight', '0-1,final')):
            with self.subTest(switch=name):
                everywhere, rows = self.dump(PROMPT, ['--ablate', name])
                limited, _ = self.dump(PROMPT, ['--ablate', '%s@%s' % (name, at)])
                self.assertEqual(limited, everywhere)
                _, one = self.dump(PROMPT, ['--ablate', '%s@1' % name])
                self.assertGreater(rel_error(one, base), MISTAKE_MIN)
                self.assertGreater(rel_error(one, rows), MISTAKE_MIN)

    def test_show_norms_shows_what_is_applied(self):
        """Under the lab's switches --show-norms and --norms-json report what was applied: the
        lab's eps in the header and in each scale, a site left out marked skipped (scale 1, out =
        in), the weight as changed; not the model as trained."""
        path = os.path.join(self.tmp, 'applied.jsonl')
        p = self.engine(['--prompt-ids', ','.join(map(str, PROMPT)), '-n', '1', '-t', '0', '--show-norms',
                         '--norms-json', path, '--ablate', 'final-norm,qk-norm@1,norm-weight@0', '--norm-eps', '0.125'])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn('note', p.stderr)
        self.assertIn('eps 0.125;', p.stderr)
        self.assertIn('switches in force', p.stderr)
        self.assertIn('{"ablate": ["final-norm", "qk-norm@1", "norm-weight@0"], "norm_eps": 0.125}', p.stderr)
        lines = [l.split() for l in p.stderr.splitlines()]
        final = [l for l in lines if l[:2] == ['-', '4']]
        self.assertEqual(len(final), 1)
        self.assertEqual(final[0][8], 'skipped')  # layer use site(2) vectors(3) rms(in) scale
        with open(path) as f:
            sites = [json.loads(l) for l in f if '"use"' in l]
        for s in sites:
            skipped = s['use'] == 4 or (s['use'] == 2 and s['layer'] == 1)
            self.assertEqual(s.get('skipped', False), skipped, s)
            self.assertEqual(s['eps'], 0.125)
            if skipped:
                self.assertEqual((s['scale'], s['rms_w'], s['rms_out']), (1, 1, s['rms_in']))
            else:
                want = 1 / math.sqrt(s['rms_in'] ** 2 + 0.125)
                self.assertLess(abs(s['scale'] - want), 1e-6 * want, s)
            if s['layer'] == 0:
                self.assertEqual(s['rms_w'], 1, s)

    def test_eval_json_echoes_the_switches(self):
        ids = ['--prompt-ids', ','.join(map(str, PROMPT))]
        self.assertEqual(self.eval_json(ids)['switches'], {})
        got = self.eval_json(ids + ['--ablate', 'qk-norm@1,final-norm', '--norm-eps', '1e-3', '--norm', 'layernorm'])
        self.assertEqual(got['switches'], {'ablate': ['qk-norm@1', 'final-norm'], 'norm_eps': 1e-3, 'norm': 'layernorm'})
        # as given, however long (the echo was cut at 95 characters, the object at 1,023)
        long = ['norm-weight@' + ','.join(['0'] * 60) + ',final'] * 12
        got = self.eval_json(ids + ['--ablate', ','.join(long)])
        self.assertEqual(got['switches'], {'ablate': long})

    def test_nan_logits(self):
        """A switch that makes the logits NaN (--norm-eps 0 on a token whose embedding is zero: 0/0):
        eval's loss and perplexity are null with a note, NaN rows are no top-1 hits, --norms-json
        stays JSON (null), and generate stops with status 1 after the --show-norms table."""
        hf = os.path.join(self.tmp, 'hf_zero_row')
        hf_model.write_model(hf, Spec(dtype='F32', seed=7, row_scales={5: 0.0}))
        ckpt = os.path.join(self.tmp, 'zero_row.bin')
        p = hf_model.run_export(hf, ckpt, 'f32')
        self.assertEqual(p.returncode, 0, p.stderr)
        p = self.engine(['-m', 'eval', '--json', '--prompt-ids', '5,0,0,0', '--norm-eps', '0'], ckpt)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout)
        self.assertEqual((got['loss'], got['ppl'], got['top1']), (None, None, 0.0))
        self.assertIn('at 3 of the 3 scored positions the logits are NaN or infinite', p.stderr)
        trace = os.path.join(self.tmp, 'nan_trace.jsonl')
        p = self.engine(['--prompt-ids', '5,0', '-n', '3', '-t', '0', '--norm-eps', '0', '--show-norms',
                         '--norms-json', trace], ckpt)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn('RMSNorm at each call site', p.stdout + p.stderr)
        self.assertIn('run: error: every logit at position 1 is NaN', p.stderr)
        with open(trace) as f:
            lines = [json.loads(line) for line in f]  # json.loads takes no -nan
        self.assertIn(None, [line.get('rms_out') for line in lines])

    # ---- eval ---------------------------------------------------------------------------------

    def check_eval_against_dumps(self, ids, ctx, extra=()):
        got = self.eval_json(['--prompt-ids', ','.join(map(str, ids)), '-c', str(ctx)] + list(extra))
        nll, top1, scored = 0.0, 0, 0
        for w0 in range(0, len(ids), ctx):
            window = ids[w0:w0 + ctx]
            if len(window) < 2:
                continue
            _, rows = self.dump(window, ['-c', str(ctx)] + list(extra))
            a, b = log_softmax_loss(rows[:-1], window[1:])
            nll, top1, scored = nll + a, top1 + b, scored + len(window) - 1
        self.assertEqual(got['tokens'], scored)
        self.assertLess(abs(got['loss'] - nll / scored), 1e-4)
        self.assertLess(abs(got['ppl'] - math.exp(nll / scored)), 1e-5 * math.exp(nll / scored))
        self.assertLess(abs(got['top1'] - top1 / scored), 1e-6)

    def test_eval_equals_the_dumped_logits(self):
        """Windows of 8: 8 + 8 + 4 tokens (7 + 7 + 3 scored); one more token makes a last window of
        1 token, which has nothing to score; a window longer than a prefill chunk (256 rows)."""
        ids = [(i * 37 + 11) % 273 for i in range(20)]
        self.check_eval_against_dumps(ids, 8)
        self.check_eval_against_dumps(ids + [5], 10)
        self.check_eval_against_dumps(ids, 8, ['--ablate', 'final-norm', '--norm', 'layernorm'])
        long_ids = [(i * 53 + 7) % 273 for i in range(300)]
        self.check_eval_against_dumps(long_ids, 290)

    def test_eval_text_sources_agree(self):
        text = 'Hello world, hello tokenizer. <|im_start|>abc 123'
        ids = self.engine(['-m', 'tokenize', '-i', text]).stdout.split()
        path = os.path.join(self.tmp, 'text.txt')
        with open(path, 'w') as f:
            f.write(text)
        want = self.eval_json(['--prompt-ids', ','.join(ids)])
        self.assertEqual(want['tokens'], len(ids) - 1)
        self.assertEqual(self.eval_json(['-i', text]), want)
        self.assertEqual(self.eval_json(['--file', path]), want)
        self.assertEqual(self.eval_json([], stdin=text), want)
        p = self.engine(['-m', 'eval', '-i', text])
        self.assertEqual(p.returncode, 0, p.stderr)
        out = p.stdout
        self.assertIn('scored tokens  %d ' % want['tokens'], out)
        self.assertIn('loss           %.6f nats/token' % want['loss'], out)
        self.assertIn('top-1          %.6f' % want['top1'], out)

    def test_eval_errors(self):
        for args, rc, msg in ((['-i', 'a'], 1, 'nothing to score: the text is 1 token, eval needs at least 2'),
                              (['-i', ''], 1, 'nothing to score: the text is 0 tokens'),
                              (['--file', os.path.join(self.tmp, 'absent.txt')], 1,
                               os.path.join(self.tmp, 'absent.txt') + ': cannot open: No such file'),
                              (['-i', 'a b', '--file', 'x'], 2, '-m eval takes one text: give one of -i, --file and --prompt-ids'),
                              (['--prompt-ids', '1,2,99999'], 2, '--prompt-ids: id 99999 is outside the vocabulary')):
            p = self.engine(['-m', 'eval'] + args)
            self.assertEqual(p.returncode, rc, (args, p.stderr))
            self.assertIn('run: error: ' + msg, p.stderr)
            self.assertEqual(p.stdout, '')

    # ---- tools/norm_lab.py --------------------------------------------------------------------

    def test_norm_lab_tool(self):
        """The lab's table on the tiny model and a short text: a row per configuration, the baseline
        row is what -m eval prints, and the Markdown file is written."""
        text = os.path.join(self.tmp, 'lab.txt')
        with open(text, 'w') as f:
            f.write('Hello world, hello tokenizer. ' * 12)
        out = os.path.join(self.tmp, 'lab.md')
        p = subprocess.run([*PYTHON, os.path.join(hf_model.ROOT, 'tools', 'norm_lab.py'), '--model', self.ckpt,
                            '--text', text, '--out', out, '--run', hf_model.RUN], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            md = f.read()
        self.assertEqual(md, p.stdout)
        rows = [l for l in md.splitlines() if l.startswith('| `')]
        # 13 configurations, and QK-Norm and the pre-norms left out in each of the model's 2 layers
        self.assertEqual(len(rows), 13 + 2 * 2, md)
        base = self.eval_json(['--file', text])
        self.assertTrue(rows[0].startswith('| `baseline` |'), rows[0])
        self.assertIn('| %.4f | %.2f | %.4f |' % (base['loss'], base['ppl'], base['top1']), rows[0])
        for switches in ('--ablate qk-norm', '--ablate pre-norms', '--ablate final-norm', '--ablate norm-weight',
                         '--ablate norm-scale', '--norm-eps 0', '--norm layernorm', '--ablate norm-gain@final',
                         '--ablate qk-norm@0', '--ablate pre-norms@1'):
            self.assertEqual(sum(r.startswith('| `%s` |' % switches) for r in rows), 1, switches)
        missing = subprocess.run([*PYTHON, os.path.join(hf_model.ROOT, 'tools', 'norm_lab.py'), '--model',
                                  os.path.join(self.tmp, 'absent.bin'), '--out', '-'], capture_output=True, text=True)
        self.assertNotEqual(missing.returncode, 0)
        self.assertIn('absent.bin: the model not found', missing.stderr)


if __name__ == '__main__':
    unittest.main()
