"""./run MODEL.bin -m quantize --dtype q8|q4 -o OUT.bin (cli/quantize.c) and export.py's use of it.

The C quantiser must write exactly the bytes of export.py's Python quantisers (export.py
--dtype q8|q4 --no-fast-quantize) from the same Hugging Face folder, whichever lossless checkpoint
it reads (an f32 export, or a bf16 export of a BF16 source). Tiny random models (tests/hf_model.py)
cover row counts that are not a multiple of q8's 4-row or q4's 8-row blocks, untied heads, Qwen2's
biases, several q8 group sizes, groups that are all zeros (+0.0 and -0.0), and both thread counts.
Then: the refusals (one line, exit status 1, nothing written), no file left behind after a
failure or Ctrl-C, export.py taking the C path when ./run is built (`-m quantize --stream`, fed
rows as it reads them: it says so, and the bytes are the same, for a MoE model and an F16 source
too) and the Python path when it is not or when asked to, the stream's frames on their own, and
the output's size known before it is written.
"""

import contextlib
import errno
import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402
from hf_model import Spec  # noqa: E402
from hf_model import PYTHON  # noqa: E402
sys.path.insert(0, hf_model.ROOT)
import export as export_py  # noqa: E402

ROOT_RUN = os.path.join(hf_model.ROOT, 'run')  # the ./run that export.py looks for beside itself
WEIGHTS_OFFSET_AT = 144  # FileHeader.weights_offset (model.h)

# name -> Spec fields. Rows of embed_tokens / lm_head: 302 = 4*75 + 2 = 8*37 + 6, 301, 299.
MODELS = {
    # Qwen3 as shipped: BF16, tied; two vocabulary rows all zeros, of random signs (-0.0 * w) and
    # +0.0, so whole groups are +-0.0 (q8's scale keeps the sign of the group's first value).
    'qwen3_bf16': dict(vocab_size=302, row_scales={7: -0.0, 8: 0.0, hf_model.IM_END_ID: 0.02}),
    # Qwen2: q/k/v biases, no QK-norm, F32, untied; hidden 96 is no multiple of 64, so q8's
    # default group becomes 32.
    'qwen2_f32_untied': dict(arch='qwen2', dtype='F32', tie=False, vocab_size=301, hidden_dim=96,
                             head_dim=16),
    # Llama, F16 source (exported as f32), one layer, head_dim 32 != dim / heads.
    'llama_f16': dict(arch='llama', dtype='F16', vocab_size=299, n_layers=1, head_dim=32),
}
# Qwen3-MoE: the router stays f32 between the quantised experts.
MOE = dict(arch='qwen3_moe', num_experts=4, num_experts_per_tok=2, vocab_size=302)
# (export.py / ./run options, label): q8 at its default group and at smaller ones, and q4.
QUANTS = [(['--dtype', 'q8'], 'q8'), (['--dtype', 'q8', '--group-size', '16'], 'q8_g16'),
          (['--dtype', 'q8', '--group-size', '8'], 'q8_g8'), (['--dtype', 'q4'], 'q4')]


def export(hf_dir, out, *extra, exporter=hf_model.EXPORT):
    return subprocess.run([*PYTHON, exporter, hf_dir, out] + list(extra), cwd=hf_model.ROOT,
                          capture_output=True, text=True, timeout=300)


def quantize(src, out, *extra, timeout=120):
    return hf_model.run_engine([src, '-m', 'quantize', '-o', out] + list(extra), timeout=timeout)


def read(path):
    with open(path, 'rb') as f:
        return f.read()


class InTempDir(hf_model.TempDirTestCase):
    def assert_failed(self, p, *must_mention, status=1):
        """Exit status `status` (1; 2 for a bad command line) and exactly one line, "run: error:
        ...", that mentions every string."""
        self.assertEqual(p.returncode, status, 'stdout %r stderr %r' % (p.stdout, p.stderr))
        lines = p.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, 'not one error line: %r' % p.stderr)
        self.assertTrue(lines[0].startswith('run: error: '), lines[0])
        for s in must_mention:
            self.assertIn(s, lines[0])


class SameBytesAsExport(InTempDir):
    """./run -m quantize from an f32 (and a bf16) export == export.py's Python path, byte for byte."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sources = {}  # model -> {'f32': path, 'bf16': path (BF16 sources only)}
        cls.expected = {}  # (model, label) -> path of export.py's Python-path output
        if hf_model.missing_tools():
            return
        for name, fields in MODELS.items():
            hf = os.path.join(cls.tmp, name)
            spec = Spec(**fields)
            hf_model.write_model(hf, spec)
            cls.sources[name] = {}
            for dtype in ('f32', 'bf16') if spec.dtype == 'BF16' else ('f32',):
                out = os.path.join(cls.tmp, '%s.%s.bin' % (name, dtype))
                p = export(hf, out, '--dtype', dtype)
                assert p.returncode == 0, p.stderr
                cls.sources[name][dtype] = out
            for args, label in QUANTS:
                out = os.path.join(cls.tmp, '%s.py_%s.bin' % (name, label))
                p = export(hf, out, '--no-fast-quantize', *args)
                assert p.returncode == 0, p.stderr
                assert 'in Python (--no-fast-quantize)' in p.stderr, p.stderr
                cls.expected[name, label] = out

    def test_same_bytes(self):
        n = 0
        for name in MODELS:
            for source, src in self.sources[name].items():
                for args, label in QUANTS:
                    with self.subTest(model=name, source=source, quant=label):
                        out = os.path.join(self.tmp, '%s.c_%s_%s.bin' % (name, source, label))
                        p = quantize(src, out, *args)
                        self.assertEqual(p.returncode, 0, p.stderr)
                        self.assertEqual(read(out), read(self.expected[name, label]))
                        n += 1
        self.assertEqual(n, 16)

    def test_thread_counts_agree(self):
        name = 'qwen3_bf16'
        for threads in ('1', '2', '3'):
            for args, label in (QUANTS[0], QUANTS[-1]):
                with self.subTest(threads=threads, quant=label):
                    out = os.path.join(self.tmp, 't%s_%s.bin' % (threads, label))
                    p = quantize(self.sources[name]['bf16'], out, '--threads', threads, *args)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    # the reference runs one thread; more than the CPUs: as many as the CPUs, with a note
                    ran = 1 if hf_model.reference_engine() else min(int(threads), hf_model.usable_cpus())
                    self.assertIn('on %d thread' % ran, p.stderr)
                    self.assertEqual('is more than the' in p.stderr, int(threads) > hf_model.usable_cpus())
                    self.assertEqual(read(out), read(self.expected[name, label]))

    def test_the_engine_runs_the_output(self):
        out = os.path.join(self.tmp, 'runs_q4.bin')
        p = quantize(self.sources['qwen2_f32_untied']['f32'], out, '--dtype', 'q4')
        self.assertEqual(p.returncode, 0, p.stderr)
        p = hf_model.run_engine([out, '--prompt-ids', '1,2,3', '-n', '2', '-t', '0'])
        self.assertEqual(p.returncode, 0, p.stderr)


class Refusals(InTempDir):
    """Each refusal: one line, exit status 1, and nothing written beside the input."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if hf_model.missing_tools():
            return
        hf = os.path.join(cls.tmp, 'hf')
        hf_model.write_model(hf, Spec())
        cls.f32 = os.path.join(cls.tmp, 'model.f32.bin')
        cls.q8 = os.path.join(cls.tmp, 'model.q8.bin')
        cls.q4 = os.path.join(cls.tmp, 'model.q4.bin')
        for path, dtype in ((cls.f32, 'f32'), (cls.q8, 'q8'), (cls.q4, 'q4')):
            p = export(hf, path, '--dtype', dtype, '--no-fast-quantize')
            assert p.returncode == 0, p.stderr

    def refused(self, src, args, *must_mention, out_name='out.bin', status=1):
        d = self.fresh_dir('case')
        out = os.path.join(d, out_name)
        p = hf_model.run_engine([src, '-m', 'quantize'] + [a.replace('OUT', out) for a in args])
        self.assert_failed(p, *must_mention, status=status)
        self.assertEqual(os.listdir(d), [], 'a refused run left files behind')

    def test_quantize_as_a_prompt_is_text(self):
        """'-m quantize' inside the value of -i is a prompt, not the mode: generate runs it."""
        p = hf_model.run_engine([self.f32, '-i', '-m quantize', '-n', '1', '-t', '0'])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn('quantize:', p.stderr)

    def test_quantize_after_a_value_is_not_the_mode(self):
        """A file named '-m' is --dump-logits' value, so the 'quantize' after it is a stray argument
        of generate mode, not the quantize mode."""
        p = hf_model.run_engine([self.f32, '-i', 'hi', '--dump-logits', '-m', 'quantize'])
        self.assertEqual(p.returncode, 2, p.stderr)  # a usage error of generate mode
        self.assertIn("unexpected argument 'quantize'", p.stderr)

    def test_already_quantised(self):
        self.refused(self.q8, ['--dtype', 'q4', '-o', 'OUT'], self.q8, 'already q8')
        self.refused(self.q4, ['--dtype', 'q8', '-o', 'OUT'], self.q4, 'already q4')

    # a bad command line exits 2, as in ./run's other modes
    def test_bad_dtype(self):
        self.refused(self.f32, ['--dtype', 'q5', '-o', 'OUT'], '--dtype', "'q5'", status=2)
        self.refused(self.f32, ['--dtype', 'bf16', '-o', 'OUT'], '--dtype', "'bf16'", status=2)
        self.refused(self.f32, ['-o', 'OUT'], '--dtype', status=2)

    def test_output_missing(self):
        self.refused(self.f32, ['--dtype', 'q8'], '-o', status=2)
        self.refused(self.f32, ['--dtype', 'q8', '-o'], '-o', status=2)

    def test_bad_group_size(self):
        self.refused(self.f32, ['--dtype', 'q8', '--group-size', '12', '-o', 'OUT'], '--group-size', status=2)
        self.refused(self.f32, ['--dtype', 'q8', '--group-size', '4', '-o', 'OUT'], '--group-size', status=2)
        self.refused(self.f32, ['--dtype', 'q4', '--group-size', '64', '-o', 'OUT'], 'q4', '32', status=2)
        self.refused(self.f32, ['--dtype', 'q8', '--group-size', '+32', '-o', 'OUT'], "'+32'", status=2)
        self.refused(self.f32, ['--dtype', 'q8', '--threads', ' 2', '-o', 'OUT'], "' 2'", status=2)

    def test_unknown_option(self):
        self.refused(self.f32, ['--dtype', 'q8', '-o', 'OUT', '--temperature', '0'], '--temperature', status=2)

    def test_output_is_the_input(self):
        before = read(self.f32)
        link = os.path.join(self.tmp, 'hard_link.bin')
        os.link(self.f32, link)
        for out in (self.f32, link, os.path.join(self.tmp, '.', 'model.f32.bin')):
            with self.subTest(out=out):
                p = quantize(self.f32, out, '--dtype', 'q8')
                self.assert_failed(p, out, 'is the input checkpoint', status=2)  # a bad command line
                self.assertEqual(read(self.f32), before)
        os.unlink(link)
        self.assertEqual(sorted(n for n in os.listdir(self.tmp) if n.endswith('.tmp')), [])

    def test_not_a_checkpoint(self):
        junk = os.path.join(self.tmp, 'junk.bin')
        with open(junk, 'wb') as f:
            f.write(b'not a checkpoint at all' * 20)
        self.refused(junk, ['--dtype', 'q8', '-o', 'OUT'], junk, 'magic')
        self.refused(os.path.join(self.tmp, 'missing.bin'), ['--dtype', 'q8', '-o', 'OUT'], 'missing.bin')

    def test_output_folder_missing(self):
        out = os.path.join(self.tmp, 'no', 'such', 'dir', 'out.bin')
        p = quantize(self.f32, out, '--dtype', 'q8')
        self.assert_failed(p, out)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'no')))

    def test_help(self):
        p = hf_model.run_engine(['-m', 'quantize', '--help'])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('--dtype q8|q4', p.stdout)
        p = hf_model.run_engine(['--help'])
        self.assertIn('-m quantize', p.stdout)
        if os.path.exists('/dev/full'):  # help that cannot be written: said, status 1, as ./run --help
            for args in (['-m', 'quantize', '--help'], ['--help']):
                with open('/dev/full', 'w') as full:
                    p = subprocess.run([hf_model.RUN] + args, stdout=full, stderr=subprocess.PIPE, text=True,
                                       timeout=30)
                self.assertEqual((p.returncode, p.stderr), (1, 'run: error: standard output: write failed: %s\n'
                                                            % os.strerror(errno.ENOSPC)))


class NothingLeftBehind(InTempDir):
    """A run that fails midway, or is interrupted, leaves no output and no temporary file; an
    existing output stays as it was."""

    def spoiled_source(self, name, spoil):
        """An f32 export of a tiny model whose embed_tokens row 5 is spoiled by spoil(floats)."""
        hf = os.path.join(self.tmp, 'hf_' + name)
        hf_model.write_model(hf, Spec(vocab_size=302))
        src = os.path.join(self.tmp, name + '.f32.bin')
        p = export(hf, src, '--dtype', 'f32')
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(src, 'r+b') as f:
            (weights_offset,) = struct.unpack_from('<Q', f.read(256), WEIGHTS_OFFSET_AT)
            at = weights_offset + 5 * 64 * 4  # embed_tokens [302, 64] is the first tensor
            f.seek(at)
            row = list(struct.unpack('<64f', f.read(256)))
            f.seek(at)
            f.write(struct.pack('<64f', *spoil(row)))
        return src

    def test_stale_temporary_removed(self):
        """A temporary file left by a run to the same name that was killed outright (SIGKILL: no
        handler ran) is removed by the next run; one of a running process is left alone."""
        src = self.spoiled_source('stale', lambda row: row)  # nothing spoiled: a good source
        d = self.fresh_dir('stale')
        _, alive = hf_model.stale_and_live_temporaries(d, 'out.bin')
        p = quantize(src, os.path.join(d, 'out.bin'), '--dtype', 'q8')
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('left by a run that was killed', p.stderr)
        self.assertEqual(sorted(os.listdir(d)), sorted(['out.bin', os.path.basename(alive)]))

    def test_write_failure(self):
        """A write that fails (here past a file size limit, RLIMIT_FSIZE): one line that names the
        output as given (not its temporary name) and the reason, status 1, nothing left."""
        import resource

        def small_files():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
        src = self.spoiled_source('too_large', lambda row: row)  # nothing spoiled: a good source
        d = self.fresh_dir('too_large')
        out = os.path.join(d, 'out.bin')
        p = subprocess.run([hf_model.RUN, src, '-m', 'quantize', '--dtype', 'q8', '-o', out], capture_output=True,
                           text=True, timeout=120, preexec_fn=small_files)
        self.assertEqual((p.returncode, p.stderr), (1, 'run: error: %s: write failed: %s\n'
                                                    % (out, os.strerror(errno.EFBIG))))
        self.assertEqual(os.listdir(d), [])

    def fails_cleanly(self, src, *must_mention):
        for dtype in ('q8', 'q4'):
            with self.subTest(dtype=dtype):
                d = self.fresh_dir('out_%s_%s' % (os.path.basename(src), dtype))
                out = os.path.join(d, 'out.bin')
                p = quantize(src, out, '--dtype', dtype)
                self.assert_failed(p, 'embed_tokens', 'row 5', *must_mention)
                self.assertEqual(os.listdir(d), [])
                with open(out, 'wb') as f:  # an earlier file under the name survives a failure
                    f.write(b'earlier')
                p = quantize(src, out, '--dtype', dtype)
                self.assertEqual(p.returncode, 1)
                self.assertEqual(os.listdir(d), ['out.bin'])
                self.assertEqual(read(out), b'earlier')

    def test_weight_too_large(self):
        self.fails_cleanly(self.spoiled_source('huge', lambda row: [1e7 * (i + 1) for i in range(64)]),
                           'too large')

    def test_nan_and_infinity(self):
        self.fails_cleanly(self.spoiled_source('nan', lambda row: row[:10] + [float('nan')] + row[11:]),
                           'NaN')
        self.fails_cleanly(self.spoiled_source('inf', lambda row: row[:63] + [float('-inf')]), 'infinity')

    def random_folder(self, name, config_only=False, **fields):
        """A Hugging Face folder of random BF16 weights of Spec(**fields)'s shape
        (tools/make_random_qwen3.py), with the tiny tokenizer's files (config_only: those and the
        config, no weights)."""
        hf, tok = os.path.join(self.tmp, name), os.path.join(self.tmp, 'hf_tok')
        if not os.path.exists(tok):
            hf_model.write_model(tok, Spec())  # its tokenizer files, small
        config = os.path.join(self.tmp, name + '.json')
        with open(config, 'w') as f:
            json.dump(Spec(**fields).config(), f)
        p = subprocess.run([*PYTHON, os.path.join(hf_model.ROOT, 'tools', 'make_random_qwen3.py'), hf,
                            '--config', config, '--tokenizer', tok] + ['--config-only'] * config_only,
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        # the real Qwen3's end-of-sequence ids lie beyond this vocabulary: take the tiny tokenizer's
        with open(os.path.join(hf, 'generation_config.json')) as f:
            gen = json.load(f)
        gen['eos_token_id'] = [hf_model.IM_END_ID, hf_model.ENDOFTEXT_ID]
        with open(os.path.join(hf, 'generation_config.json'), 'w') as f:
            json.dump(gen, f)
        return hf

    def medium_source(self):
        """An f32 checkpoint of about 90 MB: above the 64 MB from which quantize shows progress."""
        src = os.path.join(self.tmp, 'medium.f32.bin')
        if os.path.exists(src):
            return src
        # written straight in the engine's format (tools/make_random_checkpoint.py): a Hugging Face
        # folder and its export would take twice as long
        hf = self.random_folder('hf_medium', config_only=True, dim=512, hidden_dim=1024, n_heads=8, n_kv_heads=4,
                                head_dim=64, vocab_size=40000, n_layers=1)
        p = subprocess.run([*PYTHON, os.path.join(hf_model.ROOT, 'tools', 'make_random_checkpoint.py'), hf, src,
                            '--dtype', 'f32'], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        return src

    def start_quantize(self, d, sigint):
        """./run -m quantize of medium_source() into d, started with SIGINT at `sigint` (a terminal's
        foreground job has it at its default; a script's `cmd &` ignored)."""
        src = self.medium_source()
        return subprocess.Popen([hf_model.RUN, src, '-m', 'quantize', '--dtype', 'q8', '-o', os.path.join(d, 'out.bin'),
                                 '--threads', '1'], stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))

    def test_ctrl_c(self):
        """SIGINT once the progress shows the run under way: the temporary file is removed."""
        d = self.fresh_dir('ctrl_c')
        proc = self.start_quantize(d, signal.SIG_DFL)
        first = proc.stderr.readline()
        self.assertIn('run: quantize', first)
        self.assertTrue(any(n.endswith('.tmp') for n in os.listdir(d)), os.listdir(d))
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        proc.wait(timeout=60)
        proc.stderr.close()
        if proc.returncode == 0:
            self.skipTest('the run finished before SIGINT arrived')
        self.assertEqual(proc.returncode, -signal.SIGINT, rest)
        self.assertIn('\nrun: interrupted; no output written\n', '\n' + rest)
        self.assertNotIn('\n\n', '\n' + rest)  # stderr is a pipe: no progress line to end, no blank line
        self.assertEqual(os.listdir(d), [])

    def test_export_ctrl_c(self):
        """Ctrl-C at a terminal (SIGINT to export.py and its ./run -m quantize --stream together) once
        the export's progress shows: status 130, one line, no file, no ./run left running. (kill and
        a closed terminal take the same cleanup: test_export_input.ProgressLine.)"""
        # about 175 MB of BF16: above the 64 MB from which export.py shows progress
        hf = self.random_folder('hf_export_ctrl_c', dim=1024, hidden_dim=3072, n_heads=16, n_kv_heads=8,
                                head_dim=64, vocab_size=60000, n_layers=2)
        d = self.fresh_dir('export_ctrl_c')
        proc = subprocess.Popen([*PYTHON, hf_model.EXPORT, hf, os.path.join(d, 'out.bin'), '--dtype', 'q8'],
                                cwd=hf_model.ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
        with proc:
            first = proc.stderr.readline()
            if 'is not built' in first:  # export.py quantizes through the ./run beside it
                proc.kill()
                proc.stderr.read()
                self.skipTest('no ./run beside export.py (make B=... links none), so the export runs in Python')
            self.assertIn('by ./run -m quantize --stream', first)
            self.assertIn('export.py: ', proc.stderr.readline())  # the first progress line
            os.killpg(proc.pid, signal.SIGINT)
            rest = proc.stderr.read()
            proc.wait(timeout=60)
        if proc.returncode == 0:
            self.skipTest('the export finished before SIGINT arrived')
        self.assertEqual(proc.returncode, 130, rest)
        self.assertEqual(rest.strip().splitlines()[-1], 'export.py: interrupted; no output written')
        self.assertEqual(os.listdir(d), [])
        with self.assertRaises(ProcessLookupError, msg='./run still runs in the export\'s process group'):
            os.killpg(proc.pid, 0)

    def test_ignored_sigint_stays_ignored(self):
        """Started with SIGINT ignored (nohup, a script's `cmd &`), a SIGINT does not stop the run."""
        d = self.fresh_dir('sigint_ignored')
        proc = self.start_quantize(d, signal.SIG_IGN)
        first = proc.stderr.readline()
        self.assertIn('run: quantize', first)
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        proc.wait(timeout=120)
        proc.stderr.close()
        self.assertEqual(proc.returncode, 0, rest)
        self.assertEqual(os.listdir(d), ['out.bin'])


class Stream(InTempDir):
    """./run -m quantize --stream, as export.py drives it (cli/quantize.c has the frames): each run
    of rows comes back as export.py's quant_row_blocks writes it (f32, bf16 and half rows, a last block
    padded with zero rows, several runs in one stream); an empty stream is status 0; a malformed
    frame or a weight q8 cannot store ends it with one line that names the tensor and its row."""

    TYPES = {'F32': 0, 'BF16': 1, 'F16': 2}

    @staticmethod
    def rows(values, dtype):
        """The values as dtype's bytes."""
        if dtype == 'F16':
            return struct.pack('<%de' % len(values), *values)
        raw = struct.pack('<%df' % len(values), *values)
        return export_py.f32_to_bf16_bytes(raw) if dtype == 'BF16' else raw

    def frame(self, values, cols, dtype='F32', first=0, name='w'):
        return (struct.pack('<6I', self.TYPES[dtype], len(values) // cols, cols, first, len(name), 0) + name.encode()
                + self.rows(values, dtype))

    def expected(self, values, cols, dtype, quant, gs):
        raw = export_py.to_f32_bytes(self.rows(values, dtype), dtype)
        return export_py.quant_row_blocks(raw, cols, gs, export_py.DTYPES[quant])

    def stream(self, data, *args):
        return subprocess.run([hf_model.RUN, '-m', 'quantize', '--stream'] + list(args), input=data,
                              capture_output=True, timeout=60)

    def setUp(self):
        super().setUp()
        import random
        self.rng = random.Random(7)

    def values(self, n):
        return [self.rng.gauss(0, 1) for _ in range(n)]

    def test_same_bytes_as_python(self):
        for dtype, gs in (('q8', 32), ('q8', 64), ('q4', 32)):
            with self.subTest(dtype=dtype, group_size=gs):
                runs = [(self.values(6 * 64), 64, 'F32'), (self.values(11 * 128), 128, 'BF16'),
                        (self.values(8 * 64), 64, 'BF16'), (self.values(7 * 64), 64, 'F16')]
                data = b''.join(self.frame(v, c, b) for v, c, b in runs)
                p = self.stream(data + bytes(24), '--dtype', dtype, '--group-size', str(gs))
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual(p.stdout, b''.join(self.expected(v, c, b, dtype, gs) for v, c, b in runs))
                self.assertEqual(self.stream(data, '--dtype', dtype, '--group-size', str(gs)).stdout, p.stdout,
                                 'the end of the input ends the stream as a frame of 0 rows does')

    def test_empty_stream(self):
        p = self.stream(b'', '--dtype', 'q8')
        self.assertEqual((p.returncode, p.stdout, p.stderr), (0, b'', b''))

    def test_refusals(self):
        good = self.frame(self.values(4 * 64), 64)
        nan = self.values(8 * 64)
        nan[2 * 64 + 5] = float('nan')
        cases = [
            (good[:-7], 'standard input ended inside a frame'),
            (struct.pack('<6I', 3, 4, 64, 0, 1, 0) + b'w', 'a frame that is not one (type 3'),
            (self.frame(self.values(4 * 48), 48, name='odd'), 'tensor odd: its 48 columns are not a multiple of '
                                                              'the group size 64'),
            (good + self.frame(nan, 64, first=100, name='model.layers.3.mlp.down_proj.weight'),
             'tensor model.layers.3.mlp.down_proj.weight: row 102 holds a NaN or an infinity'),
        ]
        for data, message in cases:
            with self.subTest(message=message):
                p = self.stream(data, '--dtype', 'q8')
                self.assertEqual(p.returncode, 1)
                lines = p.stderr.decode().strip().splitlines()
                self.assertEqual(len(lines), 1, lines)
                self.assertTrue(lines[0].startswith('run: error: ') and message in lines[0], lines[0])
        p = hf_model.run_engine(['model.bin', '-m', 'quantize', '--stream', '--dtype', 'q8'])
        self.assertEqual(p.returncode, 2)  # a bad command line
        self.assertIn('--stream takes no checkpoint and no -o', p.stderr)


class ExportUsesIt(InTempDir):
    """export.py --dtype q8|q4 takes ./run -m quantize --stream when ./run is built, says so, and
    writes the bytes of its Python path; without a working ./run (or one built before --stream), or
    with --no-fast-quantize, it quantises in Python and says why."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.hf = {}
        for name, fields in list(MODELS.items()) + [('moe', MOE)]:
            cls.hf[name] = os.path.join(cls.tmp, name)
            hf_model.write_model(cls.hf[name], Spec(**fields))

    def setUp(self):
        super().setUp()
        if not os.access(ROOT_RUN, os.X_OK):
            self.skipTest('%s is not built (run `make`)' % ROOT_RUN)

    def test_fast_path_same_bytes(self):
        for name in sorted(self.hf):
            for args, label in QUANTS:
                with self.subTest(model=name, quant=label):
                    d = self.fresh_dir('fast_%s_%s' % (name, label))
                    fast, slow = os.path.join(d, 'fast.bin'), os.path.join(d, 'slow.bin')
                    p = export(self.hf[name], fast, *args)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    self.assertIn('export.py: %s by ./run -m quantize --stream (C)' % label[:2], p.stderr)
                    self.assertNotIn('in Python', p.stderr)
                    q = export(self.hf[name], slow, '--no-fast-quantize', *args)
                    self.assertEqual(q.returncode, 0, q.stderr)
                    self.assertIn('in Python (--no-fast-quantize)', q.stderr)
                    self.assertNotIn('./run -m quantize', q.stderr)
                    self.assertEqual(read(fast), read(slow))
                    self.assertEqual(sorted(os.listdir(d)), ['fast.bin', 'slow.bin'])

    def test_small_q8_groups_are_said_to_be_slow(self):
        """q8 groups that are no multiple of 32 take the scalar products: export warns, and ./run
        (a SIMD build) says so once at load; the default group says nothing."""
        d = self.fresh_dir('small_groups')
        for gs, slow in ((['--group-size', '16'], True), ([], False)):
            out = os.path.join(d, 'g%s.bin' % (gs[1] if gs else 'default'))
            p = export(self.hf['qwen3_bf16'], out, '--dtype', 'q8', *gs)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual('export.py: warning: q8 groups of 16: the engine\'s SIMD products take groups of a '
                             'multiple of 32' in p.stderr, slow, p.stderr)
            r = hf_model.run_engine([out, '--prompt-ids', '1,2', '-n', '1'])
            self.assertEqual(r.returncode, 0, r.stderr)
            simd = hf_model.engine_kernels(out) != 'reference'
            self.assertEqual('run: note: q8 groups of 16: the SIMD products take groups of a multiple of 32' in r.stderr,
                             slow and simd, r.stderr)

    def test_group_size_notes_of_quantize(self):
        """./run -m quantize says what export.py says of a --group-size: one that does not divide
        every width (the group it takes instead), and groups no multiple of 32 (the scalar products,
        and the default's group); the default says nothing."""
        d = self.fresh_dir('quantize_notes')
        src = os.path.join(d, 'src.f32.bin')
        self.assertEqual(export(self.hf['qwen3_bf16'], src, '--dtype', 'f32').returncode, 0)
        for gs, notes in (('16', ['run: note: q8 groups of 16: the SIMD products take groups of a multiple of 32, '
                                  'so this file\'s run on the scalar reference, tens of times slower; without '
                                  '--group-size they are 64']),
                          ('128', ['run: note: q8 groups of 64: --group-size 128 does not divide every input width']),
                          (None, [])):
            with self.subTest(group_size=gs):
                p = quantize(src, os.path.join(d, 'out.bin'), '--dtype', 'q8', *(['--group-size', gs] if gs else []))
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual([l for l in p.stderr.splitlines() if l.startswith('run: note:')], notes)

    def test_tensors_smaller_than_a_pipe_buffer(self):
        """Every tensor of a 32-wide model is under 8 KB: each frame reaches ./run as it is
        written, not when the next fills the pipe's buffer (that stalled the export for good)."""
        hf = self.fresh_dir('tiny_hf')
        hf_model.write_model(hf, Spec(dim=32, hidden_dim=64, n_heads=2, n_kv_heads=1, head_dim=16,
                                      vocab_size=280))
        for dtype in ('q8', 'q4'):
            with self.subTest(dtype=dtype):
                d = self.fresh_dir('tiny_' + dtype)
                fast, slow = os.path.join(d, 'fast.bin'), os.path.join(d, 'slow.bin')
                p = subprocess.run([*PYTHON, hf_model.EXPORT, hf, fast, '--dtype', dtype], cwd=hf_model.ROOT,
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn('by ./run -m quantize --stream (C)', p.stderr)
                q = export(hf, slow, '--no-fast-quantize', '--dtype', dtype)
                self.assertEqual(q.returncode, 0, q.stderr)
                self.assertEqual(read(fast), read(slow))

    def fallback(self, make_run, must_mention):
        """export.py copied into a folder where ./run is make_run(path) (or absent)."""
        d = self.fresh_dir('fallback')
        exporter = os.path.join(d, 'export.py')
        shutil.copy(hf_model.EXPORT, exporter)
        if make_run:
            make_run(os.path.join(d, 'run'))
        out = os.path.join(d, 'out.bin')
        p = export(self.hf['qwen3_bf16'], out, '--dtype', 'q8', exporter=exporter)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('export.py: q8 in Python (', p.stderr)
        self.assertIn(must_mention, p.stderr)
        q = export(self.hf['qwen3_bf16'], os.path.join(d, 'ref.bin'), '--dtype', 'q8', '--no-fast-quantize')
        self.assertEqual(q.returncode, 0, q.stderr)
        self.assertEqual(read(out), read(os.path.join(d, 'ref.bin')))

    def test_fallback_without_run(self):
        self.fallback(None, 'is not built')

    def test_fallback_when_run_does_not_start(self):
        def not_executable(path):
            with open(path, 'w') as f:
                f.write('not a program\n')
            os.chmod(path, 0o644)
        self.fallback(not_executable, 'does not start')

    def test_fallback_for_a_run_without_quantize(self):
        def old_build(path):  # what an engine built before -m quantize answers
            with open(path, 'w') as f:
                f.write("#!/bin/sh\necho \"run: error: -m must be generate, chat, tokenize or bench\" >&2\nexit 2\n")
            os.chmod(path, 0o755)
        self.fallback(old_build, 'has no -m quantize')

    def test_failure_leaves_nothing(self):
        hf = os.path.join(self.tmp, 'hf_huge')
        hf_model.write_model(hf, Spec(dtype='F32', row_scales={5: 1e8}))
        d = self.fresh_dir('huge')
        p = export(hf, os.path.join(d, 'out.bin'), '--dtype', 'q8')
        self.assertEqual(p.returncode, 1, p.stderr)
        # one line: ./run's reason, naming the tensor and row, as export.py's
        self.assertRegex(p.stderr, r"(?m)^export.py: error: tensor model\.\S+: row \d+ has a weight too large for "
                                   r"q8's float16 scales .*; no output written \(./run -m quantize --stream, status 1\)$")
        self.assertNotIn('run: error', p.stderr)
        self.assertEqual(os.listdir(d), [])
        p = export(hf, os.path.join(d, 'out.bin'), '--dtype', 'q8', '--no-fast-quantize')  # the same line in Python
        self.assertRegex(p.stderr, r"(?m)^export.py: error: tensor model\.\S+: row \d+ has a weight too large for "
                                   r"q8's float16 scales \(\|w\| above 8,300,000\)$")
        self.assertEqual(os.listdir(d), [])
        hf = os.path.join(self.tmp, 'hf_nan')
        hf_model.write_model(hf, Spec(dtype='F32', row_scales={3: float('nan')}))
        for how in ([], ['--no-fast-quantize']):
            with self.subTest(how=how):
                p = export(hf, os.path.join(d, 'out.bin'), '--dtype', 'q4', *how)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertRegex(p.stderr, r"(?m)^export.py: error: tensor model\.\S+: row 3 holds a NaN or an "
                                           r"infinity, which q4 cannot store")
                self.assertEqual(len(p.stderr.strip().splitlines()), 2, p.stderr)  # which quantiser, the error
                self.assertEqual(os.listdir(d), [])


class DiskRoom(InTempDir):
    """export.py knows its output's size before it writes it (export.checkpoint_bytes, the exact
    size in every format, dense and MoE), and refuses, in one line and before writing anything, an
    output whose disk has less free space than that. The disk's free space is export.main's
    shutil.disk_usage, replaced for the refusal (in this process)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.hf = {}
        for name, fields in (('qwen3_bf16', MODELS['qwen3_bf16']), ('qwen2_f32_untied', MODELS['qwen2_f32_untied']),
                             ('moe', MOE)):
            cls.hf[name] = os.path.join(cls.tmp, name)
            hf_model.write_model(cls.hf[name], Spec(**fields))

    def test_sizes_known_before_writing(self):
        for name, hf in sorted(self.hf.items()):
            for args, label in [(['--dtype', 'f32'], 'f32'), (['--dtype', 'bf16'], 'bf16')] + QUANTS:
                with self.subTest(model=name, dtype=label):
                    out = os.path.join(self.fresh_dir('size_%s_%s' % (name, label)), 'out.bin')
                    p = export(hf, out, *args)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    gs = int(args[3]) if len(args) > 2 else None
                    with contextlib.redirect_stderr(io.StringIO()):  # its warnings: the export above said them
                        inputs = export_py.read_inputs(hf, args[1], gs, None)
                    self.assertEqual(export_py.checkpoint_bytes(inputs['plan'], inputs['wtype'], inputs['gs'],
                                                               len(inputs['tok'])), os.path.getsize(out))

    def export_with_free(self, free, *args):
        """export.main on the BF16 model with `free` bytes free on every disk: status, stderr, the files
        left in the output's folder, the output's path."""
        d = self.fresh_dir('room')
        out = os.path.join(d, 'out.bin')
        err = io.StringIO()
        saved = os.dup(2)  # ./run's lines too, not on the test's output
        try:
            with tempfile.TemporaryFile() as run_err:
                os.dup2(run_err.fileno(), 2)
                with mock.patch.object(export_py.shutil, 'disk_usage', lambda path: types.SimpleNamespace(free=free)), \
                        contextlib.redirect_stderr(err):
                    rc = export_py.main([self.hf['qwen3_bf16'], out, '--jobs', '1'] + list(args))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        return rc, err.getvalue(), sorted(os.listdir(d)), out

    def test_no_room(self):
        if not os.access(ROOT_RUN, os.X_OK):
            self.skipTest('%s is not built (run `make`)' % ROOT_RUN)
        sizes = {}
        for dtype in ('bf16', 'q8'):  # the outputs' sizes, from exports on the real disk
            out = os.path.join(self.fresh_dir('real_' + dtype), 'out.bin')
            p = export(self.hf['qwen3_bf16'], out, '--dtype', dtype)
            self.assertEqual(p.returncode, 0, p.stderr)
            sizes[dtype] = os.path.getsize(out)
        for dtype, needs in sizes.items():
            with self.subTest(dtype=dtype):
                rc, err, left, out = self.export_with_free(needs - 1, '--dtype', dtype)
                self.assertEqual(rc, 1, err)
                kb = lambda n: '%.0f KB' % (n / 1e3)  # noqa: E731
                self.assertEqual(err.strip().splitlines()[-1], 'export.py: error: %s: needs %s free for the %s output; '
                                 'its disk has %s free: nothing written' % (out, kb(needs), dtype, kb(needs - 1)))
                self.assertEqual(left, [])
                rc, err, left, _ = self.export_with_free(needs, '--dtype', dtype)
                self.assertEqual(rc, 0, err)
                self.assertEqual(left, ['out.bin'])


if __name__ == '__main__':
    unittest.main()
