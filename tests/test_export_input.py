"""export.py on malformed and extreme input files: every problem ends as exit status 1 and one line
`export.py: error: FILE: ...` that names the file and the field, never a Python traceback; and a
checkpoint export.py writes is one ./run loads. Three parts:

  * the inputs that crashed export.py with a traceback, and those it wrote into files ./run refused;
  * the limits: model.h's CHECKPOINT LIMITS block (what the loader applies) and export.py's LIMITS
    table are equal, export.py refuses the value just beyond each limit, and ./run loads a
    checkpoint exported at the limit where a tiny model can be (the others are checked in-process);
  * a seeded, deterministic fuzz of config.json, generation_config.json, tokenizer.json,
    tokenizer_config.json, model.safetensors.index.json and safetensors headers, through
    export.read_inputs (every check export.py makes before it converts anything), in-process.
"""

import ast
import concurrent.futures
import contextlib
import copy
import io
import json
import math
import os
import random
import re
import shutil
import signal
import struct
import sys
import time
import traceback
import unittest
import unittest.mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402
from hf_model import Spec, DELETE  # noqa: E402

sys.path.insert(0, hf_model.ROOT)
import export  # noqa: E402

MODEL_H = os.path.join(hf_model.ROOT, 'model.h')

# A model small enough that one at a limit (1024 layers, 1024 heads) is written, exported and run
# in well under a second.
TINY = dict(dim=2, hidden_dim=2, n_heads=1, n_kv_heads=1, head_dim=2, n_layers=1, dtype='F32')


def replace_file(path, data):
    """path's content replaced by data: a new file, not the old one cut to nothing and written again,
    which ext4 (auto_da_alloc) flushes to disk at its close: 2.6 ms a time against 0.07 ms."""
    os.unlink(path)
    with open(path, 'wb') as f:
        f.write(data)


class InTempDir(hf_model.TempDirTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.n = 0

    def new_dir(self, name):
        type(self).n += 1
        return os.path.join(self.tmp, '%s_%d' % (name, self.n))


def edit_json(folder, name, change):
    """Loads folder/name, lets change(doc) edit it in place, writes it back (NaN and Infinity as
    Python's json writes them)."""
    path = os.path.join(folder, name)
    with open(path, encoding='utf-8') as f:
        doc = json.load(f)
    change(doc)
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(doc, f)


def set_field(name, key, value):
    """An edit of folder's JSON file name: doc[key] = value (key a tuple: a path into the doc)."""
    keys = key if isinstance(key, tuple) else (key,)

    def change(doc):
        for k in keys[:-1]:
            doc = doc[k]
        if value is DELETE:
            del doc[keys[-1]]
        else:
            doc[keys[-1]] = value
    return lambda folder: edit_json(folder, name, change)


def replace_text(name, old, new):
    """An edit of folder/name as text (for JSON that json.dump cannot write, e.g. 1e400)."""
    def edit(folder):
        path = os.path.join(folder, name)
        with open(path, encoding='utf-8') as f:
            text = f.read()
        assert old in text, (name, old)
        with open(path, 'w', encoding='utf-8') as f:
            f.write(text.replace(old, new))
    return edit


def edit_safetensors_header(change, name='model.safetensors'):
    """An edit of a safetensors file's JSON header: change(header) edits it in place; the data
    after the header stays as it was."""
    def edit(folder):
        path = os.path.join(folder, name)
        with open(path, 'rb') as f:
            raw = f.read()
        (n,) = struct.unpack_from('<Q', raw, 0)
        header = json.loads(raw[8:8 + n])
        change(header)
        h = json.dumps(header).encode('utf-8')
        with open(path, 'wb') as f:
            f.write(struct.pack('<Q', len(h)) + h + raw[8 + n:])
    return edit


def run_parallel(jobs):
    """Runs the callables in jobs on threads (each runs a subprocess); returns their results."""
    with concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        return list(pool.map(lambda job: job(), jobs))


class ExportRefuses(InTempDir):
    """Shared: write a model, spoil it, check export.py's answer."""
    base = None

    @classmethod
    def base_folder(cls, spec=None):
        """A valid model folder written once per class and spec; cases copy it."""
        key = repr(sorted(vars(spec or Spec(dtype='F32')).items()))
        cache = cls.__dict__.get('_bases')
        if cache is None:
            cache = cls._bases = {}
        if key not in cache:
            d = os.path.join(cls.tmp, 'base%d' % len(cache))
            hf_model.write_model(d, spec or Spec(dtype='F32'))
            cache[key] = d
        return cache[key]

    def spoiled(self, edits, spec=None):
        """A copy of the base folder with edits applied (each a function of the folder)."""
        d = self.new_dir('hf')
        shutil.copytree(self.base_folder(spec), d)
        for e in (edits if isinstance(edits, (list, tuple)) else [edits]):
            e(d)
        return d

    def check_refusal(self, folder, p, out_dir, file_name, must_mention):
        """export.py's exit status 1 with one line naming folder/file_name and every string of
        must_mention, and nothing written."""
        err = p.stderr
        where = '%s: %r' % (file_name, must_mention)
        self.assertNotIn('Traceback', err, where)
        self.assertEqual(p.returncode, 1, '%s: rc %d, %s' % (where, p.returncode, err))
        lines = err.splitlines()
        errors = [l for l in lines if not l.startswith('export.py: warning: ')]
        self.assertEqual(len(errors), 1, '%s: not one line: %r' % (where, err))
        line = errors[0]
        self.assertTrue(line.startswith('export.py: error: '), line)
        self.assertIn(os.path.join(folder, file_name), line, 'the message does not name the file')
        for m in must_mention:
            self.assertIn(m, line, 'the message does not name %r' % m)
        self.assertEqual(os.listdir(out_dir), [], 'a failed export left files behind')

    def refusals(self, cases, spec=None):
        """cases: (file name, edits, strings the message must name). Each runs as its own
        export.py process, in parallel."""
        prepared = []
        for file_name, edits, must in cases:
            d = self.spoiled(edits, spec)
            out_dir = d + '_out'
            os.makedirs(out_dir)
            prepared.append((d, out_dir, file_name, must))
        results = run_parallel([lambda d=d, o=o: hf_model.run_export(d, os.path.join(o, 'model.bin'))
                                for d, o, _, _ in prepared])
        for (d, out_dir, file_name, must), p in zip(prepared, results):
            with self.subTest(file=file_name, must=must):
                self.check_refusal(d, p, out_dir, file_name, must)

    def exports_and_runs(self, folder, dtype='f32'):
        """Exports folder and runs the checkpoint; returns its header."""
        out = folder + '.bin'
        p = hf_model.run_export(folder, out, dtype)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn('Traceback', p.stderr)
        r = hf_model.run_engine([out, '--prompt-ids', '1,2', '-n', '2', '-t', '0'])
        self.assertEqual(r.returncode, 0, 'export.py wrote %s, ./run refused it: %s' % (out, r.stderr))
        return hf_model.read_header(out)


class CrashingInputs(ExportRefuses):
    """Inputs that Python would turn into a traceback (struct.error, OverflowError, TypeError,
    AttributeError, ValueError) if export.py did not check them: status 1 and one line naming
    file and field."""

    def test_config_json(self):
        c = 'config.json'
        mpe = 'max_position_embeddings'
        self.refusals([
            (c, set_field(c, mpe, -1), [mpe, '-1']),
            (c, set_field(c, mpe, 10**10), [mpe, '10000000000']),
            (c, set_field(c, mpe, 4096.5), [mpe, '4096.5']),
            (c, set_field(c, mpe, '4096'), [mpe, "'4096'"]),
            (c, set_field(c, mpe, True), [mpe, 'True']),            # bool is not an int
            (c, replace_text(c, '"rope_theta": 1000000.0', '"rope_theta": 1e400'), ['rope_theta', 'inf']),
            (c, replace_text(c, '"rope_theta": 1000000.0', '"rope_theta": 1' + '0' * 400), ['rope_theta']),
            (c, replace_text(c, '"rope_theta": 1000000.0', '"rope_theta": 0.5'), ['rope_theta', 'from 1', '0.5']),
            (c, set_field(c, 'eos_token_id', 10**12), ['eos_token_id', '1000000000000']),
            (c, set_field(c, 'eos_token_id', ['x']), ['eos_token_id', "'x'"]),
            (c, set_field(c, 'hidden_size', 10**10), ['hidden_size']),
            (c, set_field(c, 'num_key_value_heads', True), ['num_key_value_heads', 'True']),
            (c, set_field(c, 'num_key_value_heads', -2), ['num_key_value_heads', '-2']),
            (c, set_field(c, 'head_dim', 16.0), ['head_dim', '16.0']),
            (c, set_field(c, 'architectures', [['Qwen3ForCausalLM']]), ['architectures']),
            (c, set_field(c, 'architectures', [{'a': 1}]), ['architectures']),
            (c, set_field(c, 'rms_norm_eps', '1e-6'), ['rms_norm_eps']),
            (c, set_field(c, 'tie_word_embeddings', 'false'), ['tie_word_embeddings']),
            (c, set_field(c, 'rope_parameters', 5), ['rope_parameters']),
            ('generation_config.json', set_field('generation_config.json', 'eos_token_id', [270, None]),
             ['eos_token_id', 'None']),
        ])

    def test_safetensors_header(self):
        q = 'model.layers.0.self_attn.q_proj.weight'

        def entry(key, value):
            return edit_safetensors_header(lambda h: h[q].__setitem__(key, value))
        s = 'model.safetensors'
        self.refusals([
            (s, entry('shape', '64x64'), [q, 'shape', "'64x64'"]),
            (s, entry('shape', [-64, -64]), [q, 'shape']),
            (s, entry('shape', [64, True]), [q, 'shape']),
            (s, entry('shape', None), [q, 'shape']),
            (s, entry('dtype', ['F32']), [q, 'dtype']),
            (s, entry('dtype', 5), [q, 'dtype']),
            (s, entry('data_offsets', 'ab'), [q, 'data_offsets']),
            (s, entry('data_offsets', [0]), [q, 'data_offsets']),
            (s, entry('data_offsets', [-4, 16380]), [q, 'data_offsets']),
            (s, entry('data_offsets', [10**20, 10**20 + 16384]), [q, 'truncated']),
            (s, entry('data_offsets', [1.5, 16385.5]), [q, 'data_offsets']),
            (s, edit_safetensors_header(lambda h: h.__setitem__(q, [1, 2])), [q, 'not an object']),
            (s, edit_safetensors_header(lambda h: h[q].pop('dtype')), [q, 'dtype']),
            (s, edit_safetensors_header(lambda h: h.__setitem__('x', {'dtype': 'I8', 'shape': [1],
                                                                      'data_offsets': [0, 10**9]})),
             ["'x'", 'truncated']),
        ])

    def test_deep_json(self):
        """Nesting deeper than Python's recursion limit: json raises RecursionError."""
        deep = '[' * 100000 + ']' * 100000

        def write(name):
            def edit(folder):
                with open(os.path.join(folder, name), 'w') as f:
                    f.write('{"a": %s}' % deep)
            return edit
        self.refusals([(name, write(name), ['nested too deeply'])
                       for name in ('config.json', 'tokenizer.json', 'generation_config.json')])

    def test_shard_index(self):
        i = 'model.safetensors.index.json'
        spec = Spec(dtype='F32', shards=2)
        name = 'model.norm.weight'
        self.refusals([
            (i, set_field(i, ('weight_map', name), 5), [name, '5']),
            (i, set_field(i, ('weight_map', name), ['a']), [name]),
            (i, set_field(i, ('weight_map', name), 'a\nb'), [name]),
            (i, set_field(i, 'weight_map', [1]), ['weight_map']),
        ], spec)

    def test_tokenizer_json(self):
        t = 'tokenizer.json'
        self.refusals([
            (t, set_field(t, 'model', 5), ["'model'", '5']),
            (t, set_field(t, ('model', 'vocab'), ['a', 'b']), ['model.vocab']),
            (t, set_field(t, ('model', 'merges'), ['a']), ['merge 0', "'a'"]),
            (t, set_field(t, ('model', 'merges'), [['a', 5]]), ['merge 0']),
            (t, set_field(t, ('model', 'merges'), [['a']]), ['merge 0']),
            (t, set_field(t, ('model', 'merges'), {'a': 'b'}), ['model.merges']),
            (t, set_field(t, ('model', 'vocab', 'a'), True), ['True']),
            (t, set_field(t, ('added_tokens', 0, 'id'), 'x'), ['added_tokens[0]', "'x'"]),
            (t, set_field(t, ('added_tokens', 0, 'id'), 2**40), ['added_tokens[0]']),
            (t, set_field(t, ('added_tokens', 0, 'content'), 5), ['added_tokens[0]', 'content']),
            (t, set_field(t, ('added_tokens', 0), 'x'), ['added_tokens[0]']),
            (t, set_field(t, ('added_tokens', 0, 'content'), '\ud800'), ['added_tokens[0]', 'surrogate']),
            (t, set_field(t, 'added_tokens', {'a': 1}), ['added_tokens']),
            (t, set_field(t, 'normalizer', 'NFC'), ['normalizer']),
            (t, set_field(t, 'pre_tokenizer', [1]), ['pre_tokenizer']),
            (t, set_field(t, ('pre_tokenizer', 'pretokenizers'), [5]), ['pretokenizers[0]']),
            (t, set_field(t, ('pre_tokenizer', 'pretokenizers', 0, 'pattern'), 'x'), ['Split pattern']),
            (t, set_field(t, ('pre_tokenizer', 'pretokenizers', 0, 'pattern', 'Regex'), 5), ['Regex']),
        ])

    def test_tokenizer_config_json(self):
        """The chat template is advice: one of another form is left out, never a crash."""
        for template in ([5], [{'name': 'default', 'template': 5}], 5, {'a': 1}):
            with self.subTest(template=template):
                d = self.spoiled(set_field('tokenizer_config.json', 'chat_template', template))
                self.exports_and_runs(d)


class RefusedByRun(ExportRefuses):
    """Values that ./run refuses (when loading, or at the first token): export.py refuses them
    first, naming the field, instead of writing a file that does not run."""

    def test_refused(self):
        c, t, g = 'config.json', 'tokenizer.json', 'generation_config.json'
        self.refusals([
            (c, replace_text(c, '"rope_theta": 1000000.0', '"rope_theta": NaN'), ['rope_theta', 'nan']),
            (c, set_field(c, 'max_position_embeddings', 2**31), ['max_position_embeddings', '2147483648']),
            (c, set_field(c, 'eos_token_id', 300), ['eos_token_id', '300', '0 .. 299']),
            (g, set_field(g, 'eos_token_id', [270, 301]), ['eos_token_id', '301']),
            (c, set_field(c, 'eos_token_id', -1), ['eos_token_id', '-1']),
            (t, set_field(t, ('added_tokens', 0, 'id'), 300), ['added_tokens[0]', '300', '0 .. 299']),
            (c, set_field(c, 'rms_norm_eps', 1e-50), ['rms_norm_eps', 'float32']),   # rounds to 0
            (c, set_field(c, 'rms_norm_eps', 1 - 1e-12), ['rms_norm_eps', 'float32']),  # rounds to 1
        ])

    def test_tokenizer_larger_than_the_model(self):
        """268 BPE tokens for an embedding of 200 rows: text would encode to ids the model has no
        row for."""
        spec = Spec(dtype='F32', vocab_size=200, row_scales={}, config_overrides={'eos_token_id': 100})
        g = 'generation_config.json'
        self.refusals([('tokenizer.json', set_field(g, 'eos_token_id', 100),
                        ['268 tokens', 'vocab_size 200'])], spec)

    def test_llama_bos(self):
        """A Llama export with add_bos_token stores config.json's bos_token_id; the loader refuses
        one outside the vocabulary."""
        spec = Spec(arch='llama', dtype='F32')
        c = 'config.json'
        add_bos = set_field('tokenizer_config.json', 'add_bos_token', True)
        self.refusals([
            (c, [add_bos, set_field(c, 'bos_token_id', 300)], ['bos_token_id', '300']),
            (c, [add_bos, set_field(c, 'bos_token_id', 10**12)], ['bos_token_id']),
            (c, [add_bos, set_field(c, 'bos_token_id', True)], ['bos_token_id', 'True']),
        ], spec)
        d = self.spoiled([add_bos, set_field(c, 'bos_token_id', 299)], spec)
        self.assertEqual(self.exports_and_runs(d)['bos_id'], 299)


def read_limits_block(path=MODEL_H):
    """model.h's CHECKPOINT LIMITS block as {name: value}, each #define's C expression evaluated
    (integer and floating literals with or without an f suffix, parentheses, <<, *, +, -)."""
    with open(path) as f:
        text = f.read()
    m = re.search(r'/\* BEGIN CHECKPOINT LIMITS.*?\*/(.*?)/\* END CHECKPOINT LIMITS \*/', text, re.S)
    assert m, 'model.h has no CHECKPOINT LIMITS block'
    code = re.sub(r'/\*.*?\*/', '', m.group(1), flags=re.S)  # the comments
    limits = {}
    for line in code.splitlines():
        if not line.strip():
            continue
        d = re.fullmatch(r'\s*#define\s+(\w+)\s+(.+?)\s*', line)
        assert d, 'not a plain #define in the limits block: %r' % line
        expr = re.sub(r'(\d(?:[\d.]*(?:e[+-]?\d+)?))[fFuUlL]+\b', r'\1', d.group(2))
        limits[d.group(1)] = evaluate(ast.parse(expr, mode='eval').body)
    return limits


def evaluate(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -evaluate(node.operand)
    ops = {ast.LShift: lambda a, b: a << b, ast.Mult: lambda a, b: a * b,
           ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b}
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        return ops[type(node.op)](evaluate(node.left), evaluate(node.right))
    raise ValueError('cannot evaluate %s in the limits block' % ast.dump(node))


def quiet(fn, *args):
    """fn(*args) with its warnings (stderr) captured: (result or None, ExportError or None)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return fn(*args), None
        except export.ExportError as e:
            return None, e


class YarnContext(unittest.TestCase):
    """YaRN's factor times its original context against max_position_embeddings: where they differ
    (the model card's rope_scaling added without raising max_position_embeddings) export.py says
    what -c then reaches and what some transformers versions do instead; where they agree, nothing."""

    def warnings(self, max_positions, original, factor=4.0):
        cfg = Spec().config()
        cfg.update(max_position_embeddings=max_positions, rope_scaling={  # None: the field absent
            'rope_type': 'yarn', 'factor': factor, 'original_max_position_embeddings': original})
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            export.parse_config('model', cfg, {})
        return err.getvalue()

    def test_card_lines_alone(self):
        self.assertEqual(self.warnings(40960, 32768),
                         "export.py: warning: model/config.json: rope_scaling.factor 4 x original_max_position_embeddings "
                         "32768 = 131072 positions, but max_position_embeddings is 40960: ./run's -c goes up to 40960, "
                         "and some transformers versions use the factor 40960/32768 = 1.25 instead (set "
                         "max_position_embeddings to 131072 to agree)\n")

    def test_no_whole_number_or_no_field(self):
        self.assertIn("= 42598.4 positions, but max_position_embeddings is 40960: ./run's -c goes up to 40960, "
                      "and some transformers versions use the factor 40960/32768 = 1.25 instead (42598.4 is no whole "
                      "number of positions: give a factor that makes one)", self.warnings(40960, 32768, factor=1.3))
        self.assertIn("= 4096 positions, but max_position_embeddings is absent (32768, transformers' default)",
                      self.warnings(None, 1024))

    def test_agreeing_config_is_quiet(self):
        self.assertEqual(self.warnings(131072, 32768), '')
        self.assertEqual(self.warnings(96, 64, factor=1.5), '')


class MoeConfigNames(unittest.TestCase):
    def test_num_local_experts(self):
        """transformers' newer Qwen3MoeConfig saves num_experts as num_local_experts: the same model."""
        cfg = Spec(arch='qwen3_moe', num_experts=4, num_experts_per_tok=2).config()
        renamed = dict(cfg, num_local_experts=cfg['num_experts'])
        del renamed['num_experts']
        self.assertEqual(quiet(export.parse_config, 'model', renamed, {}), quiet(export.parse_config, 'model', cfg, {}))
        self.assertEqual(export.parse_config('model', renamed, {})['moe']['n_experts'], 4)


class Limits(ExportRefuses):
    """One table of limits: model.h's, which the loader applies, equals export.py's; export.py
    refuses each value just beyond a limit; a checkpoint at the limit loads in ./run."""

    def test_tables_equal(self):
        header = read_limits_block()
        self.assertEqual(header, export.LIMITS)
        # The loader uses the table, and keeps no limits of its own beside it.
        sources = ''
        for name in ('checkpoint.c', 'model.c', 'tokenizer/tokenizer.c', 'cli/chat.c', 'cli/generation.c'):
            with open(os.path.join(hf_model.ROOT, name)) as f:
                sources += f.read()
        for name in header:
            self.assertRegex(sources, r'\b%s\b' % name, '%s is not used by the loader' % name)
        for name in ('checkpoint.c', 'model.c'):
            with open(os.path.join(hf_model.ROOT, name)) as f:
                self.assertNotRegex(f.read(), r'#define\s+MAX_(DIM|HIDDEN|LAYERS|HEADS|HEAD_DIM|VOCAB|POSITIONS)\b')

    def test_read_limits_block(self):
        """The block's reader itself: C literals and shifts."""
        path = os.path.join(self.tmp, 'limits.h')
        with open(path, 'w') as f:
            f.write('/* BEGIN CHECKPOINT LIMITS\n * text */\n#define A (1 << 4)  /* a */\n'
                    '#define B 2.5f\n#define C 1e30\n#define D 7u\n/* END CHECKPOINT LIMITS */\n')
        self.assertEqual(read_limits_block(path), {'A': 16, 'B': 2.5, 'C': 1e30, 'D': 7})

    def parse(self, overrides, spec=None):
        """export.parse_config on spec's config.json with overrides: (config values, error)."""
        cfg = (spec or Spec()).config()
        cfg.update(overrides)
        return quiet(export.parse_config, self.tmp, cfg, {})

    def test_every_limit(self):
        YARN = {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 64}  # noqa: N806
        L = export.LIMITS
        c, g = 'config.json', 'generation_config.json'
        small = {'hidden_size': 64, 'intermediate_size': 64}  # keeps matrices below 2^31 values

        def beyond(key, value, *must, file=c):
            return (file, set_field(file, key, value), [key] + list(must))

        # Just beyond each limit: export.py refuses, naming the field.
        refused = {
            'MAX_DIM': [beyond('hidden_size', L['MAX_DIM'] + 1, '65536')],
            'MAX_HIDDEN': [beyond('intermediate_size', L['MAX_HIDDEN'] + 1, '262144')],
            'MAX_LAYERS': [beyond('num_hidden_layers', L['MAX_LAYERS'] + 1, '1024')],
            'MAX_HEADS': [beyond('num_attention_heads', L['MAX_HEADS'] + 1, '1024'),
                          beyond('num_key_value_heads', L['MAX_HEADS'] + 1, '1024')],
            'MAX_HEAD_DIM': [beyond('head_dim', L['MAX_HEAD_DIM'] + 2, '1024')],
            'MAX_VOCAB': [beyond('vocab_size', L['MAX_VOCAB'] + 1, '16777216')],
            'MAX_POSITIONS': [beyond('max_position_embeddings', L['MAX_POSITIONS'] + 1, '16777216')],
            'MAX_ROPE_THETA': [beyond('rope_theta', L['MAX_ROPE_THETA'], '1e+30')],
            'MAX_ROPE_FACTOR': [beyond('rope_scaling', dict(YARN, factor=L['MAX_ROPE_FACTOR']), 'factor', '1e+06')],
            'MAX_EOS_IDS': [beyond('eos_token_id', list(range(L['MAX_EOS_IDS'] + 1)), 'at most 8')],
        }
        cases = [case for name in sorted(refused) for case in refused[name]]
        self.refusals(cases)

        # YaRN's values as the float32 the header stores, which the loader checks: valid doubles
        # that round to 0 or to the limit are refused (in-process).
        for key, value in (('beta_fast', 1e-50), ('beta_slow', 999999.99999), ('attention_factor', 1e-50)):
            _, err = self.parse({'rope_scaling': dict(YARN, **{key: value})})
            self.assertIn("'rope_scaling.%s' must be a number in (0, 1e+06) also as a float32" % key, str(err))
        self.assertIsNone(self.parse({'rope_scaling': dict(YARN, beta_fast=1e-30)})[1])

        # Qwen3-MoE's counts, in-process on a MoE config: the limit passes, one beyond it is refused.
        moe = Spec(arch='qwen3_moe')
        self.assertIsNone(self.parse({'num_experts': L['MAX_EXPERTS']}, moe)[1])
        _, err = self.parse({'num_experts': L['MAX_EXPERTS'] + 1}, moe)
        self.assertIn("'num_experts' must be an integer in 1 .. 4096", str(err))
        self.assertIsNone(self.parse({'mlp_only_layers': [0] * L['MAX_MLP_ONLY']}, moe)[1])
        _, err = self.parse({'mlp_only_layers': list(range(L['MAX_MLP_ONLY'] + 1)), 'num_hidden_layers': 16}, moe)
        self.assertIn("'mlp_only_layers' must list at most 8 layer numbers", str(err))

        # Limits on products: checked in-process (parse_config), with the value at the limit.
        # n_heads x head_dim: MAX_HIDDEN.
        _, err = self.parse({'num_attention_heads': 1024, 'num_key_value_heads': 1,
                             'head_dim': L['MAX_HIDDEN'] // 1024 + 2})
        self.assertIn('num_attention_heads 1024 x head_dim 258 = 264192 is more than 262144', str(err))
        # Widest width x tallest height: MAX_MATRIX_VALUES (2^31 - 1, a prime, so "at the limit"
        # is the largest product below it that the test can build).
        _, err = self.parse(dict(small, hidden_size=128, vocab_size=L['MAX_VOCAB']))
        self.assertIn('more than %d values' % L['MAX_MATRIX_VALUES'], str(err))
        c_ok, err = self.parse(dict(small, hidden_size=128, vocab_size=L['MAX_VOCAB'] - 1))
        self.assertIsNone(err)
        self.assertEqual(128 * c_ok['vocab_size'], 2**31 - 128)
        # At the limits too large for a tiny model to be exported here: parse_config accepts them.
        for overrides in ({'hidden_size': L['MAX_DIM']}, dict(small, vocab_size=L['MAX_VOCAB'])):
            with self.subTest(at_limit=overrides):
                self.assertIsNone(self.parse(overrides)[1])
        # MAX_HIDDEN itself is never reached: hidden_dim is both a width and a height, so the
        # matrix bound (hidden_dim^2 < 2^31) refuses it first, in the loader as here.
        _, err = self.parse(dict(small, intermediate_size=L['MAX_HIDDEN']))
        self.assertIn('more than %d values' % L['MAX_MATRIX_VALUES'], str(err))

        # At the limit, with a tiny model: export.py writes it and ./run loads and runs it.
        eight = list(range(L['MAX_EOS_IDS'] - 2)) + [hf_model.IM_END_ID]  # + generation_config's two
        theta = math.nextafter(L['MAX_ROPE_THETA'], 0)
        at_limit = [
            ('MAX_LAYERS', Spec(**dict(TINY, n_layers=L['MAX_LAYERS'])), {}, 'n_layers'),
            ('MAX_HEADS', Spec(**dict(TINY, n_heads=L['MAX_HEADS'], n_kv_heads=L['MAX_HEADS'])), {},
             'n_kv_heads'),
            ('MAX_HEAD_DIM', Spec(**dict(TINY, head_dim=L['MAX_HEAD_DIM'])), {}, 'head_dim'),
            ('MAX_POSITIONS', Spec(**dict(TINY, max_position_embeddings=L['MAX_POSITIONS'])), {},
             'max_seq_len'),
            ('MAX_ROPE_THETA', Spec(**dict(TINY, rope_theta=theta)), {}, 'rope_theta'),
            ('MAX_ROPE_FACTOR', Spec(**dict(TINY, config_overrides={'rope_scaling': dict(YARN, factor=999999.0)})), {},
             'rope_factor'),
            ('MAX_EOS_IDS', Spec(**dict(TINY, config_overrides={'eos_token_id': eight})), {}, 'n_eos'),
            ('MAX_TEMPERATURE', Spec(**TINY), {'temperature': L['MAX_TEMPERATURE']}, 'temperature'),
            ('MAX_TOP_P', Spec(**TINY), {'top_p': L['MAX_TOP_P']}, 'top_p'),
        ]
        expected = {'n_layers': 1024, 'n_kv_heads': 1024, 'head_dim': 1024, 'max_seq_len': 1 << 24,
                    'rope_theta': theta, 'n_eos': 8, 'temperature': 100.0, 'top_p': 1.0, 'rope_factor': 999999.0}
        for name, spec, gen, field in at_limit:
            with self.subTest(at_limit=name):
                d = self.new_dir(name)
                hf_model.write_model(d, spec)
                edit_json(d, g, lambda doc: doc.update(gen))
                h = self.exports_and_runs(d)
                with open(d + '.bin', 'rb') as f:
                    fields = struct.unpack(export.HEADER_FORMAT, f.read(256))
                h['temperature'], h['top_p'] = fields[26], fields[27]
                self.assertEqual(h[field], expected[field])

        # The generation defaults are advice (README): just beyond the limit the export goes on
        # without them, with a warning, and the file loads.
        for key, limit in (('temperature', L['MAX_TEMPERATURE']), ('top_p', L['MAX_TOP_P'])):
            with self.subTest(beyond=key):
                d = self.new_dir(key)
                hf_model.write_model(d, Spec(**TINY))
                edit_json(d, g, lambda doc: doc.update({key: math.nextafter(limit, math.inf)}))
                p = hf_model.run_export(d, d + '.bin', 'f32')
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn("field '%s' is" % key, p.stderr)
                self.assertIn('not stored as a default', p.stderr)

        covered = (set(refused) | {n for n, _, _, _ in at_limit} |
                   {'MAX_MATRIX_VALUES', 'MAX_HIDDEN', 'MAX_EXPERTS', 'MAX_MLP_ONLY'})
        self.assertEqual(covered, set(L), 'a limit without a test')

    def test_ids_below_the_vocabulary(self):
        """End-of-sequence ids, added tokens and the BPE vocabulary: every id below vocab_size.
        The largest allowed id exports and runs."""
        g, t = 'generation_config.json', 'tokenizer.json'
        spec = Spec(dtype='F32', vocab_size=hf_model.TOKENIZER_SIZE)  # 273: the tokenizer's size
        last = hf_model.TOKENIZER_SIZE - 1
        d = self.spoiled([set_field(g, 'eos_token_id', [last, hf_model.IM_END_ID])], spec)
        self.assertIn(last, self.exports_and_runs(d)['eos_ids'])
        self.refusals([(g, set_field(g, 'eos_token_id', last + 1), ['eos_token_id', '273', '0 .. 272']),
                       (t, set_field(t, ('added_tokens', 4, 'id'), last + 1),
                        ['added_tokens[4]', '273', '0 .. 272'])], spec)


# ------------------------------------------------------------------------------------------------
# The fuzz test

class ProgressLine(unittest.TestCase):
    """On a terminal the progress is one line written over; whatever ends the export (an error,
    Ctrl-C) starts its message on a line of its own, not glued to the progress."""

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def ended_by(self, exc):
        def interrupted_export(*args):
            export.progress(3 << 20, 100 << 20, time.time(), 'model.embed_tokens.weight')
            raise exc
        err = self.Terminal()
        # main() sets a SIGTERM handler: not in this process's test runner
        with unittest.mock.patch.object(export, 'export', interrupted_export), \
                unittest.mock.patch.object(sys, 'stderr', err), unittest.mock.patch.object(export.signal, 'signal'):
            status = export.main(['in', 'out.bin', '--dtype', 'bf16'])
        return status, err.getvalue()

    def test_interrupted(self):
        status, text = self.ended_by(KeyboardInterrupt())
        self.assertEqual(status, 130)
        self.assertTrue(text.startswith('\rexport.py:   3.0%'), text)
        self.assertTrue(text.endswith('model.embed_tokens.weight' + ' ' * 23 + '\nexport.py: interrupted; no output '
                                      'written\n'), repr(text))

    def test_kill_and_a_closed_terminal_clean_up_as_ctrl_c(self):
        """main() makes SIGTERM (kill) and SIGHUP (a closed terminal) raise SystemExit(128 + n),
        which leaves export() through the cleanup of its unfinished file as Ctrl-C's
        KeyboardInterrupt does (test_quantize.py's test_export_ctrl_c runs that in a real export)."""
        import signal
        installed = {}
        with unittest.mock.patch.object(export, 'export', lambda *a: (0, 'f32', 0)), \
                unittest.mock.patch.object(sys, 'stderr', io.StringIO()), \
                unittest.mock.patch.object(export.signal, 'signal', lambda n, h: installed.__setitem__(n, h)):
            self.assertEqual(export.main(['in', 'out.bin']), 0)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            with self.assertRaises(SystemExit) as e:
                installed[signum](signum, None)
            self.assertEqual(e.exception.code, 128 + signum)

    def test_error(self):
        status, text = self.ended_by(export.ExportError('x.safetensors: truncated'))
        self.assertEqual(status, 1)
        self.assertTrue(text.endswith(' \nexport.py: error: x.safetensors: truncated\n'), repr(text))


class Mutator:
    """Seeded, deterministic mutations of JSON documents and raw bytes."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        deep = []
        for _ in range(50):
            deep = [deep]
        self.odd = [None, True, False, 0, -1, 1, 2, 3, 7, 64, 2**31 - 1, 2**31, 2**32, 2**63, 2**64,
                    10**12, 10**30, 10**400, -2**31 - 1, -10**20, 0.5, -0.0, 4096.5, 1e-50, 1e-320,
                    1e30, 1e300, float('nan'), float('inf'), float('-inf'), '', 'x', '4096', '64x64',
                    'F32', 'BF16', 'F8_E4M3', 'BPE', 'NFC', 'Split', 'Sequence', 'ByteLevel', 'default',
                    'a b', '\ud800', '\n', [], [1], [1, 2], [0, 10**20], ['a'], ['a', 'b', 'c'], [[1]],
                    [None], {}, {'a': 1}, {'type': 'BPE'}, {'Regex': 5}, deep]

    def nodes(self, doc):
        """Every (container, key) in doc, found by a walk so that each level is picked about as
        often as the next (a tokenizer's vocabulary would otherwise take every pick)."""
        path = []
        node = doc
        while isinstance(node, (dict, list)) and len(node):
            key = self.rng.choice(list(node.keys()) if isinstance(node, dict) else range(len(node)))
            path.append((node, key))
            node = node[key]
            if self.rng.random() < 0.35:
                break
        return path

    def value(self, doc):
        r = self.rng.random()
        if r < 0.6:
            return copy.deepcopy(self.rng.choice(self.odd))
        if r < 0.8:  # a value from elsewhere in the same document: plausible, wrong place
            path = self.nodes(doc)
            return copy.deepcopy(path[-1][0][path[-1][1]]) if path else None
        return self.rng.choice([self.rng.randint(-2**40, 2**40), self.rng.uniform(-1e6, 1e6),
                                ''.join(chr(self.rng.randint(1, 0x2FF)) for _ in range(self.rng.randint(0, 8)))])

    def mutate_doc(self, doc):
        """1 to 3 changes to a deep copy of doc: replace a value, delete a key or element, insert
        one, change a number a little or a lot."""
        doc = copy.deepcopy(doc)
        for _ in range(self.rng.randint(1, 3)):
            path = self.nodes(doc)
            if not path:
                return self.value(doc)
            parent, key = path[-1]
            op = self.rng.random()
            old = parent[key]
            if op < 0.45:
                parent[key] = self.value(doc)
            elif op < 0.6:
                del parent[key]
            elif op < 0.7:
                if isinstance(parent, dict):
                    parent[self.rng.choice(['x', 'id', 'type', 'vocab', 'shape', 'eos_token_id',
                                            'rope_theta', 'head_dim', 'name'])] = self.value(doc)
                else:
                    parent.insert(self.rng.randint(0, len(parent)), self.value(doc))
            elif op < 0.9 and isinstance(old, (int, float)) and not isinstance(old, bool):
                parent[key] = self.rng.choice([old + 1, old - 1, -old, old * 2**31, old / 3,
                                               old * 1e300 if old else 1e300, int(old) if
                                               math.isfinite(old) else 0])
            else:
                parent[key] = self.rng.choice([[old], {'a': old}, str(old)[:40]])
        return doc

    def mutate_bytes(self, data):
        data = bytearray(data)
        op = self.rng.random()
        if op < 0.3 or not data:
            del data[self.rng.randrange(len(data) + 1):]
        elif op < 0.7:
            for _ in range(self.rng.randint(1, 4)):
                i = self.rng.randrange(len(data))
                data[i] = self.rng.choice([data[i] ^ (1 << self.rng.randrange(8)), self.rng.randrange(256)])
        elif op < 0.85:
            i = self.rng.randrange(len(data) + 1)
            data[i:i] = bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 8)))
        else:
            i = self.rng.randrange(len(data))
            del data[i:i + self.rng.randint(1, 64)]
        return bytes(data)

    def dumps(self, doc):
        return json.dumps(doc, ensure_ascii=self.rng.random() < 0.8).encode('utf-8', 'surrogatepass')


def split_safetensors(raw):
    (n,) = struct.unpack_from('<Q', raw, 0)
    return json.loads(raw[8:8 + n]), raw[8 + n:]


class Fuzz(InTempDir):
    """Thousands of mutated inputs through export.read_inputs, in-process: each ends in success or
    an ExportError whose message is one line naming a file of the folder; anything else (a
    TypeError, a struct.error, ...) is a bug. Of the successes, some are exported through
    export.main and run: ./run must load every file export.py writes."""

    CASES = {  # file -> mutated inputs per run; about 3,000 in all
        'config.json': 700, 'generation_config.json': 300, 'tokenizer.json': 700,
        'tokenizer_config.json': 200, 'model.safetensors': 700,
        'model.safetensors.index.json': 200, 'model-00001-of-00002.safetensors': 200,
    }
    RUNS = 40  # successful cases exported and run with ./run
    MAINS = 40  # failed cases also run through export.main (one line, status 1)

    def test_fuzz(self):
        t0 = time.time()
        single = os.path.join(self.tmp, 'single')
        sharded = os.path.join(self.tmp, 'sharded')
        hf_model.write_model(single, Spec(dtype='F32', n_layers=1))
        hf_model.write_model(sharded, Spec(dtype='BF16', n_layers=1, shards=2))
        self.assertIsNone(quiet(export.read_inputs, single, None, None, None)[1])
        self.assertIsNone(quiet(export.read_inputs, sharded, None, None, None)[1])
        counts = {'ok': 0, 'refused': 0, 'ran': 0, 'mains': 0}
        for k, (name, n_cases) in enumerate(sorted(self.CASES.items())):
            folder = sharded if name.startswith('model-') or name.endswith('index.json') else single
            path = os.path.join(folder, name)
            with open(path, 'rb') as f:
                original = f.read()
            mut = Mutator(1000 + k)
            if name.endswith('.safetensors'):
                header, data = split_safetensors(original)
            else:
                doc = json.loads(original)
            try:
                for i in range(n_cases):
                    r = mut.rng.random()
                    if name.endswith('.safetensors'):
                        if r < 0.65:
                            h = mut.dumps(mut.mutate_doc(header))
                            raw = struct.pack('<Q', len(h)) + h + data
                        elif r < 0.8:  # the length field, or the bytes of the header
                            h = mut.dumps(header)
                            raw = mut.mutate_bytes(struct.pack('<Q', len(h)) + h) + data
                        else:
                            raw = mut.mutate_bytes(original[:len(original) - len(data) + 64]) + data[64:]
                    else:
                        raw = mut.dumps(mut.mutate_doc(doc)) if r < 0.8 else mut.mutate_bytes(original)
                    replace_file(path, raw)
                    self.one_case(folder, name, i, raw, counts)
            finally:
                replace_file(path, original)
        took = time.time() - t0
        sys.stderr.write('  [fuzz] %d inputs: %d exported, %d refused; %d exports run by ./run, %d '
                         'refusals through main(), %.1f s\n' % (counts['ok'] + counts['refused'], counts['ok'],
                                                                 counts['refused'], counts['ran'],
                                                                 counts['mains'], took))
        self.assertGreater(counts['ok'], 100, 'the mutations leave too few valid inputs to test')
        self.assertGreater(counts['refused'], 1000)

    def one_case(self, folder, name, i, raw, counts):
        where = '%s, case %d (%d bytes: %r...)' % (name, i, len(raw), raw[:120])
        try:
            with contextlib.redirect_stderr(io.StringIO()) as warnings:
                export.read_inputs(folder, None, None, None)
        except export.ExportError as e:
            msg = str(e)
            self.assertTrue(msg.startswith(folder), '%s: the message names no file: %r' % (where, msg))
            self.assertNotIn('\n', msg, '%s: more than one line: %r' % (where, msg))
            self.assertLess(len(msg), 600, '%s: a message of %d characters' % (where, len(msg)))
            counts['refused'] += 1
            if counts['mains'] < self.MAINS and counts['refused'] % 25 == 0:
                self.through_main(folder, where, counts, ok=False)
            return
        except Exception:
            self.fail('%s: %s' % (where, traceback.format_exc()))
        for line in warnings.getvalue().splitlines():
            self.assertTrue(line.startswith('export.py: warning: '), '%s: %r' % (where, line))
        counts['ok'] += 1
        if counts['ran'] < self.RUNS and counts['ok'] % 8 == 1:
            self.through_main(folder, where, counts, ok=True)

    def through_main(self, folder, where, counts, ok):
        """export.main on the folder: status 0 and a file ./run loads, or status 1 and one line."""
        out_dir = os.path.join(self.tmp, 'out')
        os.makedirs(out_dir, exist_ok=True)
        out = os.path.join(out_dir, 'model.bin')
        sigterm = signal.getsignal(signal.SIGTERM)  # main() sets its own
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err:
                rc = export.main([folder, out, '--jobs', '1'])
        finally:
            signal.signal(signal.SIGTERM, sigterm)
        lines = [l for l in err.getvalue().splitlines() if not l.startswith('export.py: warning: ')]
        if not ok:
            self.assertEqual(rc, 1, where)
            self.assertEqual(len(lines), 1, '%s: %r' % (where, err.getvalue()))
            self.assertTrue(lines[0].startswith('export.py: error: ' + folder), lines[0])
            self.assertEqual(os.listdir(out_dir), [])
            counts['mains'] += 1
            return
        self.assertEqual(rc, 0, '%s: %s' % (where, err.getvalue()))
        p = hf_model.run_engine([out, '--prompt-ids', '1,2', '-n', '1', '-t', '0'])
        self.assertEqual(p.returncode, 0, '%s: export.py wrote a file ./run refuses: %s' % (where, p.stderr))
        os.remove(out)
        counts['ran'] += 1


if __name__ == '__main__':
    unittest.main()
