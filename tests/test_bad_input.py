"""Error handling: export.py on bad Hugging Face folders, ./run on bad checkpoint files and bad
flags. Every case must end with a clear message and a non-zero exit status, never a crash (a
negative return code in Python's subprocess means the process died of a signal), never a hang,
and a failed export must leave no output file and no temporary file behind."""

import errno
import json
import os
import stat
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402
from hf_model import Spec, DELETE  # noqa: E402

HEADER_FORMAT = '<4s13I f i d I 8i f f i 2I 4Q f I f f f I 72x'  # FileHeader (model.h), as export.py writes it
# Byte offsets of FileHeader fields (model.h, struct '<4s13I f i d I 8i f f i 2I 4Q f I f f f I 72x'), for patching.
OFF = {'magic': 0, 'version': 4, 'arch': 8, 'flags': 12, 'dim': 16, 'hidden_dim': 20,
       'n_layers': 24, 'n_heads': 28, 'n_kv_heads': 32, 'head_dim': 36, 'vocab_size': 40,
       'max_seq_len': 44, 'weight_type': 48, 'group_size': 52, 'rms_norm_eps': 56, 'rope_theta': 64,
       'tokenizer_offset': 128, 'tokenizer_bytes': 136, 'weights_offset': 144, 'weights_bytes': 152,
       'rope_factor': 160, 'rope_original_max': 164, 'rope_beta_fast': 168, 'rope_beta_slow': 172,
       'rope_attention_factor': 176, 'rope_truncate': 180}


class InTempDir(hf_model.TempDirTestCase):
    """A temporary folder per test class; the tests that need export.py or ./run say so with
    skip_without_tools()."""
    NEEDS_TOOLS = False


class ExportErrors(InTempDir):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.n = 0

    def setUp(self):
        if not os.path.exists(hf_model.EXPORT):
            self.skipTest('export.py is missing')

    def export_fails(self, spec, must_mention, edit=None, dtype='f32'):
        """Writes the folder, lets edit(folder) spoil it further, runs export.py into an empty
        directory and checks the failure. must_mention: strings of which at least one must appear
        in the message (case-insensitive)."""
        type(self).n += 1
        d = os.path.join(self.tmp, 'hf%d' % self.n)
        hf_model.write_model(d, spec)
        if edit:
            edit(d)
        out_dir = os.path.join(self.tmp, 'out%d' % self.n)
        os.makedirs(out_dir)
        out = os.path.join(out_dir, 'model.bin')
        p = hf_model.run_export(d, out, dtype)
        msg = p.stderr.strip()
        self.assertGreater(p.returncode, 0, 'export.py should fail, got rc %d: %s' % (p.returncode, msg))
        self.assertNotIn('Traceback', msg, 'a crash instead of a message')
        self.assertTrue(msg, 'no message')
        self.assertTrue(any(m.lower() in msg.lower() for m in must_mention),
                        'message %r names none of %r' % (msg, must_mention))
        self.assertEqual(os.listdir(out_dir), [], 'a failed export left files behind')
        return msg

    def test_missing_tensor(self):
        self.export_fails(Spec(omit=('model.layers.1.mlp.up_proj.weight',)),
                          ['model.layers.1.mlp.up_proj.weight'])

    def test_missing_tensor_in_shard(self):
        self.export_fails(Spec(shards=3, omit=('model.layers.0.self_attn.k_norm.weight',)),
                          ['model.layers.0.self_attn.k_norm.weight'])

    def test_untied_without_lm_head(self):
        self.export_fails(Spec(tie=False, omit=('lm_head.weight',)), ['lm_head.weight'])

    def test_mixtral(self):
        self.export_fails(Spec(config_overrides={'architectures': ['MixtralForCausalLM'],
                                                 'model_type': 'mixtral', 'num_local_experts': 8}),
                          ['MixtralForCausalLM'])

    def test_qwen3_moe(self):
        """Qwen3-MoE is read (test_model.py checks its logits); what the engine does not implement,
        or a config that does not match its tensors, is refused naming the field or the tensor."""
        moe = dict(arch='qwen3_moe', num_experts=4, num_experts_per_tok=2)
        for overrides, words in (({'shared_expert_intermediate_size': 64}, ['shared_expert_intermediate_size']),
                                 ({'num_experts_per_tok': 5}, ['num_experts_per_tok', '1 .. 4']),
                                 ({'num_experts_per_tok': DELETE}, ["missing field 'num_experts_per_tok'"]),
                                 ({'moe_intermediate_size': 0}, ['moe_intermediate_size']),
                                 ({'norm_topk_prob': 'yes'}, ['norm_topk_prob']),
                                 ({'decoder_sparse_step': 0}, ['decoder_sparse_step']),
                                 ({'mlp_only_layers': [7]}, ['mlp_only_layers']),
                                 ({'num_experts': 8}, ['mlp.experts.4', 'mlp.gate.weight', 'shape']),
                                 ({'num_local_experts': 8}, ["'num_experts' (4)", "'num_local_experts' (8)", 'disagree'])):
            with self.subTest(overrides=overrides):
                self.export_fails(Spec(**moe, config_overrides=overrides), words)
        # the experts fused ([E, 2 x width, hidden] and [E, hidden, width]), as transformers holds them in
        # memory and can save them: refused naming the layout, not as a missing expert
        def fuse(d):
            path = os.path.join(d, 'model.safetensors')
            t = hf_model.read_safetensors(path)
            for l in range(Spec(**moe).n_layers):
                p = 'model.layers.%d.mlp.' % l
                gate_up, down = [], []
                for e in range(4):
                    gate_up += t.pop(p + 'experts.%d.gate_proj.weight' % e)[2] + t.pop(p + 'experts.%d.up_proj.weight' % e)[2]
                    down += t.pop(p + 'experts.%d.down_proj.weight' % e)[2]
                t[p + 'experts.gate_up_proj'] = ('BF16', [4, len(gate_up) // 4 // 64, 64], gate_up)
                t[p + 'experts.down_proj'] = ('BF16', [4, 64, len(down) // 4 // 64], down)
            hf_model.write_safetensors(path, [(n, dt, sh, v) for n, (dt, sh, v) in t.items()])
        self.export_fails(Spec(**moe), ['experts.gate_up_proj', 'fused', 'one tensor per expert'], edit=fuse)
        # a shared expert's tensors (Qwen2-MoE's) without the config field: refused, not dropped with a warning
        def add_shared_expert(d):
            path = os.path.join(d, 'model.safetensors')
            t = hf_model.read_safetensors(path)
            t['model.layers.0.mlp.shared_expert.gate_proj.weight'] = ('BF16', [32, 64], [0.0] * (32 * 64))
            hf_model.write_safetensors(path, [(n, dt, sh, v) for n, (dt, sh, v) in t.items()])
        self.export_fails(Spec(**moe), ['shared_expert.gate_proj', 'shared expert'], edit=add_shared_expert)
        # a dense Qwen3 with MoE fields is refused rather than read without its experts
        self.export_fails(Spec(config_overrides={'num_experts': 8, 'moe_intermediate_size': 32}), ['num_experts'])

    def test_layers_the_engine_lacks(self):
        """Configs whose layers hold what the engine has no tensor or function for are refused, not
        read without it: attention_bias (Qwen3's and Llama's o_proj gets a bias too; Qwen2's q/k/v
        biases, which the engine has, are read), mlp_bias, an activation other than SiLU."""
        for arch, overrides in (('qwen3', {'attention_bias': True}), ('llama', {'attention_bias': True}),
                                ('llama', {'mlp_bias': True}), ('qwen3', {'hidden_act': 'gelu'})):
            with self.subTest(arch=arch, overrides=overrides):
                self.export_fails(Spec(arch=arch, config_overrides=overrides), ["'%s'" % next(iter(overrides))])

    def test_unsupported_dtype(self):
        name = 'model.layers.0.self_attn.q_proj.weight'
        self.export_fails(Spec(dtype_overrides={name: 'F8_E4M3'}), ['F8_E4M3'])

    def test_rope_scaling(self):
        """YaRN is read (test_model.py checks its logits); every other scaling, and a YaRN without
        what it needs or with values outside its range, is refused naming the field."""
        yarn = {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 32768}
        for scaling, words in (({'rope_type': 'linear', 'factor': 2.0}, ["rope_scaling.rope_type", "'linear'", 'yarn']),
                               ({'type': 'dynamic', 'factor': 2.0}, ["rope_scaling.rope_type", "'dynamic'"]),
                               (dict(yarn, factor=0.5), ['rope_scaling.factor', '[1, 1e+06)']),
                               (dict(yarn, factor='4'), ['rope_scaling.factor']),
                               ({'rope_type': 'yarn', 'original_max_position_embeddings': 4096}, ['rope_scaling.factor', 'missing']),
                               ({'rope_type': 'yarn', 'factor': 4.0}, ["original_max_position_embeddings' is missing"]),
                               (dict(yarn, original_max_position_embeddings=0), ['original_max_position_embeddings']),
                               (dict(yarn, beta_fast=-1.0), ['rope_scaling.beta_fast']),
                               (dict(yarn, attention_factor=0), ['rope_scaling.attention_factor']),
                               (dict(yarn, truncate='yes'), ['rope_scaling.truncate']),
                               (dict(yarn, mscale=0.707), ['rope_scaling.mscale'])):
            with self.subTest(scaling=scaling):
                self.export_fails(Spec(config_overrides={'rope_scaling': scaling}), words)
        self.export_fails(Spec(config_overrides={'rope_parameters': {'rope_type': 'longrope', 'rope_theta': 1e6}}),
                          ["rope_parameters.rope_type", "'longrope'"])

    def test_missing_config(self):
        self.export_fails(Spec(), ['config.json'], edit=lambda d: os.remove(os.path.join(d, 'config.json')))

    def test_missing_config_field(self):
        self.export_fails(Spec(config_overrides={'hidden_size': DELETE}), ['hidden_size'])

    def test_shape_disagrees_with_config(self):
        self.export_fails(Spec(config_overrides={'intermediate_size': 256}),
                          ['gate_proj', 'shape', 'intermediate_size'])

    def test_missing_shard_file(self):
        self.export_fails(Spec(shards=2), ['model-00002-of-00002.safetensors'],
                          edit=lambda d: os.remove(os.path.join(d, 'model-00002-of-00002.safetensors')))

    def test_truncated_safetensors(self):
        def cut(d):
            path = os.path.join(d, 'model.safetensors')
            with open(path, 'r+b') as f:
                f.truncate(os.path.getsize(path) - 1000)
        msg = self.export_fails(Spec(), ['model.safetensors'], edit=cut)
        self.assertIn('truncated', msg)  # the file is short, not the tensor's offsets wrong

    def test_missing_folder(self):
        out_dir = os.path.join(self.tmp, 'out_no_folder')
        os.makedirs(out_dir)
        missing = os.path.join(self.tmp, 'no_such_model')
        p = hf_model.run_export(missing, os.path.join(out_dir, 'model.bin'), 'f32')
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(missing + ': no such folder', p.stderr)
        self.assertEqual(os.listdir(out_dir), [])

    def test_truncated_inside_the_safetensors_header(self):
        def cut(d):
            path = os.path.join(d, 'model.safetensors')
            with open(path, 'r+b') as f:
                f.truncate(100)
        msg = self.export_fails(Spec(), ['model.safetensors'], edit=cut)
        self.assertIn('truncated', msg)

    def test_no_architectures_field(self):
        msg = self.export_fails(Spec(config_overrides={'architectures': DELETE}), ['architectures'])
        self.assertIn("no field 'architectures'", msg)

    def test_q4_width_not_a_multiple_of_32(self):
        """q4 groups are 32 columns (model.h): a q width of 2 x 24 = 48 cannot be grouped, and
        export says so before writing anything, naming the config and the width."""
        msg = self.export_fails(Spec(n_heads=2, head_dim=24), ['multiple of 32'], dtype='q4')
        self.assertIn('config.json: ', msg)
        self.assertIn('num_attention_heads x head_dim 48', msg)

    def test_q4_group_size_other_than_32(self):
        self.n += 1
        d = os.path.join(self.tmp, 'hf_gs%d' % self.n)
        hf_model.write_model(d, Spec())
        out = os.path.join(self.tmp, 'gs%d.bin' % self.n)
        p = hf_model.run_export(d, out, 'q4', extra=['--group-size', '64'])
        self.assertEqual(p.returncode, 2)  # a bad command line, as ./run -m quantize says it
        self.assertEqual(p.stderr, 'export.py: error: q4 groups are 32 columns (got --group-size 64)\n')
        self.assertFalse(os.path.exists(out))

    def test_safetensors_consistency(self):
        """Two tensors on the same bytes, and a shard index that places a tensor in another shard
        than the one holding it, are refused (the safetensors library refuses the first; the second
        would take whichever copy came last)."""
        a, b = 'model.layers.0.self_attn.q_proj.weight', 'model.layers.0.self_attn.o_proj.weight'

        def overlap(d):
            path = os.path.join(d, 'model.safetensors')
            with open(path, 'rb') as f:
                raw = f.read()
            n = struct.unpack('<Q', raw[:8])[0]
            header = json.loads(raw[8:8 + n])
            header[b]['data_offsets'] = header[a]['data_offsets']  # the same count of values
            text = json.dumps(header).encode()
            with open(path, 'wb') as f:
                f.write(struct.pack('<Q', len(text)) + text + raw[8 + n:])

        def misplaced(d):
            path = os.path.join(d, 'model.safetensors.index.json')
            with open(path) as f:
                index = json.load(f)
            shards = sorted(set(index['weight_map'].values()))
            index['weight_map'][a] = shards[1] if index['weight_map'][a] == shards[0] else shards[0]
            with open(path, 'w') as f:
                json.dump(index, f)
        self.export_fails(Spec(dtype='F32'), ['overlap in the file'], edit=overlap)
        self.export_fails(Spec(dtype='F32', shards=2), ['but found in'], edit=misplaced)

    def test_group_size_notes(self):
        """--group-size where it does nothing, or where export.py takes a smaller one, says so."""
        d = os.path.join(self.tmp, 'hf_gs_notes')
        hf_model.write_model(d, Spec())
        p = hf_model.run_export(d, os.path.join(self.tmp, 'gs_f32.bin'), 'f32', extra=['--group-size', '64'])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('--group-size 64 is for q8', p.stderr)
        widest = 1 << 20
        p = hf_model.run_export(d, os.path.join(self.tmp, 'gs_q8.bin'), 'q8', extra=['--group-size', str(widest)])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stderr, r"q8 groups of \d+: --group-size %d does not divide every input width" % widest)

    def test_output_directory_missing(self):
        d = os.path.join(self.tmp, 'hf_ok')
        hf_model.write_model(d, Spec())
        out = os.path.join(self.tmp, 'no', 'such', 'dir', 'model.bin')
        p = hf_model.run_export(d, out, 'f32')
        self.assertGreater(p.returncode, 0)
        self.assertNotIn('Traceback', p.stderr)
        self.assertFalse(os.path.exists(out))
        # the user's path, not the temporary file's
        self.assertIn(os.path.dirname(out) + ': no such directory', p.stderr)
        self.assertNotIn('.tmp', p.stderr)

    def test_output_is_a_directory(self):
        """Refused before any conversion, naming the path, rather than at the final rename after all
        the work."""
        d = os.path.join(self.tmp, 'hf_dir_out')
        hf_model.write_model(d, Spec())
        out = os.path.join(self.tmp, 'an_existing_dir')
        os.makedirs(out)
        p = hf_model.run_export(d, out, 'q8')
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(out + ': is a directory', p.stderr)
        self.assertEqual(os.listdir(out), [])
        self.assertEqual([n for n in os.listdir(self.tmp) if n.endswith('.tmp')], [])

    def test_output_path_odd(self):
        """Before any conversion: a FIFO (or, as root, /dev/null) is refused, not replaced by a file
        at the rename; a name ending in / or empty, or too long for the temporary name beside it, is
        refused naming it. A link to a file keeps its link and gets the new file."""
        d = os.path.join(self.tmp, 'hf_odd_out')
        hf_model.write_model(d, Spec())
        out_dir = os.path.join(self.tmp, 'odd_out')
        os.makedirs(out_dir, exist_ok=True)
        fifo = os.path.join(out_dir, 'model.fifo')
        os.mkfifo(fifo)
        for out, words in ((fifo, fifo + ': is not a regular file'), (out_dir + '/new/', 'give a file name'),
                           ('', "'': give a file name"), (os.path.join(out_dir, 'x' * 250), 'a file name of at most')):
            with self.subTest(out=out):
                p = hf_model.run_export(d, out, 'f32')
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn(words, p.stderr)
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode), 'the FIFO was replaced')
        self.assertEqual(os.listdir(out_dir), ['model.fifo'])
        target, link = os.path.join(out_dir, 'target.bin'), os.path.join(out_dir, 'link.bin')
        with open(target, 'wb') as f:
            f.write(b'old')
        os.symlink('target.bin', link)
        dangling = os.path.join(out_dir, 'later_link.bin')
        os.symlink('later.bin', dangling)  # a link to a file not yet there: as ./run -m quantize -o
        for out, file in ((link, target), (dangling, os.path.join(out_dir, 'later.bin'))):
            p = hf_model.run_export(d, out, 'f32')
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertTrue(os.path.islink(out), 'the link was replaced')
            self.assertEqual(hf_model.read_header(file)['magic'], b'QW3C')

    def test_write_error_names_the_output(self):
        """An error of the write itself (the file-size limit here; a full disk alike) carries no file
        name of its own: the message names the output, and the temporary file goes."""
        import resource
        import signal
        import subprocess
        d = os.path.join(self.tmp, 'hf_fsize')
        hf_model.write_model(d, Spec())
        out_dir = os.path.join(self.tmp, 'fsize_out')
        os.makedirs(out_dir)
        out = os.path.join(out_dir, 'model.bin')

        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
        p = subprocess.run([*hf_model.PYTHON, hf_model.EXPORT, d, out, '--dtype', 'f32'], capture_output=True,
                           text=True, timeout=120, preexec_fn=limit)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn('export.py: error: %s: [Errno %d]' % (out, errno.EFBIG), p.stderr)
        self.assertEqual(os.listdir(out_dir), [])

    def test_output_is_one_of_the_inputs(self):
        """`export.py hf hf/model.safetensors` would have replaced the model's own weights."""
        d = os.path.join(self.tmp, 'hf_self')
        hf_model.write_model(d, Spec(shards=2))
        for name in ('model-00002-of-00002.safetensors', 'config.json', 'tokenizer.json'):
            src = os.path.join(d, name)
            with open(src, 'rb') as f:
                before = f.read()
            p = hf_model.run_export(d, src, 'f32')
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn('is one of the files being converted', p.stderr)
            with open(src, 'rb') as f:
                self.assertEqual(f.read(), before, name + ' was changed')

    def test_tokenizer_dir_without_tokenizer(self):
        """--tokenizer names a folder on purpose: without tokenizer.json there it is an error, not
        a checkpoint without a tokenizer."""
        d = os.path.join(self.tmp, 'hf_tokdir')
        hf_model.write_model(d, Spec())
        missing = os.path.join(self.tmp, 'no_such_tokenizer_dir')
        out = os.path.join(self.tmp, 'tokdir.bin')
        p = hf_model.run_export(d, out, 'f32', extra=['--tokenizer', missing])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(missing + ': no tokenizer.json', p.stderr)
        self.assertFalse(os.path.exists(out))

    def test_stale_temporary_removed(self):
        """A temporary file left by an export that was killed outright (no cleanup could run) is
        removed by the next export to that name; one of a running process is left alone."""
        d = os.path.join(self.tmp, 'hf_stale')
        hf_model.write_model(d, Spec())
        out_dir = os.path.join(self.tmp, 'stale_out')
        os.makedirs(out_dir)
        _, alive = hf_model.stale_and_live_temporaries(out_dir, 'model.bin')
        p = hf_model.run_export(d, os.path.join(out_dir, 'model.bin'), 'f32')
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('left by an export that was killed', p.stderr)
        self.assertEqual(sorted(os.listdir(out_dir)), sorted(['model.bin', os.path.basename(alive)]))

    def test_config_not_an_object(self):
        def spoil(d):
            with open(os.path.join(d, 'config.json'), 'w') as f:
                f.write('[1, 2]')
        self.export_fails(Spec(), ['not a JSON object'], edit=spoil)


class ExportGenerationDefaults(InTempDir):
    """generation_config.json's temperature / top_p / top_k are advice: one that ./run could not
    use is left out with a warning, so that the export never writes a file ./run would refuse,
    and with do_sample false (greedy in transformers) none is stored."""

    def setUp(self):
        self.skip_without_tools()

    def export_with(self, name, gen_edit):
        d = os.path.join(self.tmp, name)
        hf_model.write_model(d, Spec())
        path = os.path.join(d, 'generation_config.json')
        with open(path) as f:
            gen = json.load(f)
        gen.update(gen_edit)
        with open(path, 'w') as f:
            json.dump(gen, f)
        out = os.path.join(self.tmp, name + '.bin')
        p = hf_model.run_export(d, out, 'f32')
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out, 'rb') as f:
            header = f.read(256)
        fields = struct.unpack(HEADER_FORMAT, header)
        temperature, top_p, top_k = fields[26:29]
        return p.stderr, out, (round(temperature, 6), round(top_p, 6), top_k)

    def test_out_of_range_left_out(self):
        err, out, stored = self.export_with('bad', {'temperature': -3, 'top_p': 7})
        self.assertIn("field 'temperature' is -3", err)
        self.assertIn("field 'top_p' is 7", err)
        self.assertEqual(stored, (0.0, 0.0, 20))  # top_k 20 was fine and is kept
        p = hf_model.run_engine([out, '--prompt-ids', '1', '-n', '2', '-s', '1'])
        self.assertEqual(p.returncode, 0, p.stderr)
        err, _, stored = self.export_with('text', {'temperature': '0.6'})
        self.assertIn("field 'temperature' is '0.6', not a number: not stored", err)
        self.assertEqual(stored, (0.0, 0.95, 20))

    def test_in_range_stored(self):
        err, _, stored = self.export_with('good', {})
        self.assertNotIn('warning', err)
        self.assertEqual(stored, (0.6, 0.95, 20))

    def test_do_sample_false(self):
        err, _, stored = self.export_with('greedy', {'do_sample': False})
        self.assertIn('do_sample is false', err)
        self.assertIn('-t 0', err)
        self.assertEqual(stored, (0.0, 0.0, 0))


class EngineErrors(InTempDir):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.good = None

    def setUp(self):
        self.skip_without_tools()
        if EngineErrors.good is None:
            d = os.path.join(self.tmp, 'hf')
            hf_model.write_model(d, Spec(dtype='F32'))
            good = os.path.join(self.tmp, 'good.bin')
            p = hf_model.run_export(d, good, 'f32')
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(good, 'rb') as f:
                EngineErrors.data = f.read()
            q8 = os.path.join(self.tmp, 'good_q8.bin')
            p = hf_model.run_export(d, q8, 'q8')
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(q8, 'rb') as f:
                EngineErrors.data_q8 = f.read()
            q4 = os.path.join(self.tmp, 'good_q4.bin')
            p = hf_model.run_export(d, q4, 'q4')
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(q4, 'rb') as f:
                EngineErrors.data_q4 = f.read()
            # The untouched file must work, or every failure below would prove nothing (the tests
            # write spoiled copies, never this file; until it runs, every test's setUp tries again).
            p = hf_model.run_engine([good, '--prompt-ids', '1,2,3', '-n', '2', '-t', '0'])
            self.assertEqual(p.returncode, 0, 'the valid checkpoint does not run: ' + p.stderr)
            EngineErrors.good = good

    def run_fails(self, args, path=None):
        p = hf_model.run_engine(args, timeout=30)
        msg = p.stderr.strip()
        self.assertGreaterEqual(p.returncode, 0, 'killed by signal %d: %s' % (-p.returncode, msg))
        self.assertNotEqual(p.returncode, 0, 'accepted %r: %s' % (args, msg))
        self.assertTrue(msg, 'no message on stderr for %r' % (args,))
        if path is not None:
            self.assertIn(path, msg, 'the message does not name the file')
            self.assertLessEqual(len(msg.splitlines()), 2, 'more than one clear line: %r' % msg)
        return msg

    def test_without_a_tokenizer(self):
        """A checkpoint exported without tokenizer.json runs from --prompt-ids; text in, chat and
        tokenize are refused with a message that names the file."""
        d = os.path.join(self.tmp, 'hf_no_tokenizer')
        hf_model.write_model(d, Spec(dtype='F32'))
        os.remove(os.path.join(d, 'tokenizer.json'))
        path = os.path.join(self.tmp, 'no_tokenizer.bin')
        p = hf_model.run_export(d, path, 'f32')
        self.assertEqual(p.returncode, 0, p.stderr)
        p = hf_model.run_engine([path, '--prompt-ids', '1,2', '-n', '2', '-t', '0'])
        self.assertEqual(p.returncode, 0, p.stderr)
        for args, why in ((['-i', 'hello'], 'give the prompt with --prompt-ids'),
                          (['-m', 'chat', '-i', 'hello'], 'chat needs one'),
                          (['-m', 'tokenize', '-i', 'hello'], 'tokenize needs one')):
            msg = self.run_fails([path] + args, path)
            self.assertIn(path + ' has no tokenizer: ' + why, msg)

    def test_vocabulary_without_every_byte(self):
        """A byte-level BPE encodes any text because its vocabulary holds all 256 single-byte tokens;
        one without them (here without the token for byte 0x21) could not, so the checkpoint
        gets no tokenizer, with a warning, and text in is refused by name rather than tokenized to
        nothing."""
        for name, keep in (('no_0x21', lambda s, i: s != '!'),):  # an empty vocabulary is one such
            with self.subTest(vocabulary=name):
                d = os.path.join(self.tmp, 'hf_vocab_' + name)
                hf_model.write_model(d, Spec(dtype='F32'))
                path = os.path.join(d, 'tokenizer.json')
                with open(path, encoding='utf-8') as f:
                    tok = json.load(f)
                vocab = {s: i for s, i in tok['model']['vocab'].items() if keep(s, i)}
                tok['model']['vocab'] = {s: k for k, s in enumerate(sorted(vocab, key=vocab.get))}
                tok['model']['merges'] = []
                with open(path, 'w', encoding='utf-8') as f:
                    json.dump(tok, f)
                out = os.path.join(self.tmp, 'vocab_%s.bin' % name)
                p = hf_model.run_export(d, out, 'f32')
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn('single-byte tokens', p.stderr)
                self.assertIn('the checkpoint gets no tokenizer', p.stderr)
                msg = self.run_fails([out, '-m', 'tokenize', '-i', 'Hello'], out)
                self.assertIn(out + ' has no tokenizer', msg)

    def test_context_and_prompt_limits(self):
        """-c beyond the model's maximum is clamped with a note that says so; an empty -i is a
        bad command line (Qwen3 has no BOS to start from), named as such."""
        h = hf_model.read_header(self.good)
        big = h['max_seq_len'] + 100
        p = hf_model.run_engine([self.good, '-c', str(big), '--prompt-ids', '1', '-n', '1', '-t', '0'])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('run: note: -c %d is more than the model\'s maximum context of %d; using %d\n'
                      % (big, h['max_seq_len'], h['max_seq_len']), p.stderr)
        p = hf_model.run_engine([self.good, '-i', '', '-n', '1'])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn('the prompt (-i) is empty', p.stderr)
        for message in ('', ' \n'):  # chat's -i: what a blank line is at the prompt, no message
            p = hf_model.run_engine([self.good, '-m', 'chat', '-i', message, '-n', '1'])
            self.assertEqual((p.returncode, p.stderr), (2, 'run: error: the message (-i) is empty\n'))

    def test_options_of_another_mode(self):
        """--prompt-ids outside generate, eval and tokenize mode is an error, and so is chat's -f
        without -i (chat would otherwise sit reading standard input). Chat's and bench's options
        elsewhere do nothing, and a note says so."""
        for mode in ('chat', 'bench'):
            msg = self.run_fails([self.good, '-m', mode, '--prompt-ids', '1,2'])
            self.assertIn('--prompt-ids is for generate, eval and tokenize mode, not -m ' + mode, msg)
        msg = self.run_fails([self.good, '-m', 'chat', '-f', self.good])  # -f too, where no -i gives the message
        self.assertIn('-m chat takes no --file: its messages come from standard input', msg)
        generate = ['--prompt-ids', '1', '-n', '1', '-t', '0']
        for args, note in (
                (generate + ['--no-think'], '-m generate ignores --no-think (-m chat option)'),
                (generate + ['-y', 'be brief'], '-m generate ignores --system (-m chat option)'),
                (generate + ['--thinking', '0', '--hide-think'],
                 '-m generate ignores --thinking and --hide-think (-m chat options)'),
                (generate + ['--json'], '-m generate ignores --json (-m bench and -m eval option)'),
                (generate + ['--bench-gen', '4'], '-m generate ignores --bench-gen (-m bench option)'),
                (['-m', 'tokenize', '-i', 'hi', '--dump-logits', os.path.join(self.tmp, 'never.f32'), '-s', '3',
                  '-n', '2'], '-m tokenize ignores --dump-logits, --seed and --steps (generate and chat options)'),
                (['-m', 'chat', '-i', 'hi', '-n', '1', '--show-norms'],
                 '-m chat ignores --show-norms (-m generate option)')):
            p = hf_model.run_engine([self.good] + args)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn('run: note: ' + note + '\n', p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'never.f32')))
        # A switch given a value is refused by name, not called an unknown option.
        msg = self.run_fails([self.good, '--no-think=1'])
        self.assertIn('option --no-think takes no value', msg)
        p = hf_model.run_engine([self.good, '--prompt-ids', '1', '-n', '1', '-t', '0'])
        self.assertNotIn('note', p.stderr)

    def test_chat_needs_chatml_tokens(self):
        """Chat renders Qwen's ChatML: with a tokenizer that lacks <|im_start|> (a Llama export,
        say) it refuses with status 1 instead of feeding the markers to the model as text."""
        d = os.path.join(self.tmp, 'hf_no_chatml')
        hf_model.write_model(d, Spec(dtype='F32'))
        path = os.path.join(d, 'tokenizer.json')
        with open(path, encoding='utf-8') as f:
            tok = json.load(f)
        tok['added_tokens'] = [t for t in tok['added_tokens'] if t['content'] != '<|im_start|>']
        with open(path, 'w', encoding='utf-8') as f:
            json.dump(tok, f)
        out = os.path.join(self.tmp, 'no_chatml.bin')
        p = hf_model.run_export(d, out, 'f32')
        self.assertEqual(p.returncode, 0, p.stderr)
        p = hf_model.run_engine([out, '-m', 'chat', '-t', '0', '-n', '2', '-i', 'hello'])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn('no ChatML chat template', p.stderr)
        p = hf_model.run_engine([self.good, '-m', 'chat', '-t', '0', '-n', '2', '-i', 'hello'])
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_unwritable_output(self):
        """Output that cannot be written is an error, never exit status 0 with nothing written: a
        full device, and a pipe closed early while SIGPIPE is ignored (as some runners do), where
        generation also stops instead of running its -n steps for nobody; no speed line follows
        the error."""
        import signal
        import subprocess
        if not os.path.exists('/dev/full'):
            self.skipTest('no /dev/full here')
        for args in (['--prompt-ids', '1,2,3', '-n', '4', '-t', '0'], ['-m', 'tokenize', '-i', 'hello'],
                     ['-m', 'chat', '-t', '0', '-n', '4', '-i', 'hello']):
            with self.subTest(args=args), open('/dev/full', 'w') as full:
                p = subprocess.run([hf_model.RUN, self.good] + args, stdout=full, stderr=subprocess.PIPE,
                                   text=True, timeout=30)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn('standard output: write failed: %s\n' % os.strerror(errno.ENOSPC), p.stderr)
                self.assertNotIn('tok/s', p.stderr)  # no speed line after the failure
        # The pipe's reading end is closed before the engine starts, so its first write fails; the
        # logits dump shows how many positions ran (the prompt's one and no decode step, where all
        # 100 ran before).
        dump = os.path.join(self.tmp, 'closed_pipe.f32')
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            proc = subprocess.run([hf_model.RUN, self.good, '--prompt-ids', '1', '-n', '100', '-t', '0',
                                   '--dump-logits', dump], stdout=write_end, stderr=subprocess.PIPE, text=True,
                                  timeout=60, preexec_fn=lambda: signal.signal(signal.SIGPIPE, signal.SIG_IGN))
        finally:
            os.close(write_end)
        err = proc.stderr
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn('standard output: write failed', err)
        vocab = hf_model.read_header(self.good)['vocab_size']
        self.assertEqual(os.path.getsize(dump), 4 * vocab, 'positions run after the failed write')

    def test_logits_dump_that_cannot_be_written_whole(self):
        """--dump-logits on a file that a write fails to (here past a file size limit, RLIMIT_FSIZE):
        one line naming the file and the reason, status 1, and no file left with part of the logits,
        in generate and chat; /dev/full, a device, is said and stays."""
        import resource
        import signal
        import subprocess

        def small_files():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        dump = os.path.join(self.tmp, 'too_large.f32')
        for args in (['--prompt-ids', '1,2,3', '-n', '4', '-t', '0'], ['-m', 'chat', '-t', '0', '-n', '4', '-i', 'hello']):
            with self.subTest(args=args):
                p = subprocess.run([hf_model.RUN, self.good, '--dump-logits', dump] + args, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, timeout=30, preexec_fn=small_files)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn('run: error: %s: write failed: ' % dump, p.stderr)
                self.assertFalse(os.path.exists(dump), 'a partial logits file was left')
        if os.path.exists('/dev/full'):
            p = subprocess.run([hf_model.RUN, self.good, '--dump-logits', '/dev/full', '--prompt-ids', '1,2,3', '-n', '4',
                                '-t', '0'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn('run: error: /dev/full: write failed: ', p.stderr)
            self.assertTrue(os.path.exists('/dev/full'))

    def test_failed_output_through_a_link(self):
        """--dump-logits and --norms-json written through a symbolic link: a failed write removes
        the regular file the link leads to (no partial file left) and keeps the link; through a
        link to /dev/full, a device, nothing is removed (the link stays, and so does the device).
        Each says the file and the reason."""
        import resource
        import signal
        import subprocess

        def small_files():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        run = ['--prompt-ids', '1,2,3', '-n', '8', '-t', '0']
        for option in ('--dump-logits', '--norms-json'):
            with self.subTest(option=option, to='a regular file'):
                target, link = os.path.join(self.tmp, 'behind.out'), os.path.join(self.tmp, 'link.out')
                open(target, 'w').close()
                os.symlink(target, link)
                try:
                    p = subprocess.run([hf_model.RUN, self.good, option, link] + run, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, timeout=30, preexec_fn=small_files)
                    self.assertEqual(p.returncode, 1, p.stderr)
                    self.assertIn('%s: write failed: %s' % (link, os.strerror(errno.EFBIG)), p.stderr)
                    self.assertFalse(os.path.exists(target), 'a partial file was left behind the link')
                    self.assertTrue(os.path.islink(link), 'the link was removed')
                finally:
                    os.unlink(link)
            if os.path.exists('/dev/full'):
                with self.subTest(option=option, to='/dev/full'):
                    link = os.path.join(self.tmp, 'full.out')
                    os.symlink('/dev/full', link)
                    try:
                        p = subprocess.run([hf_model.RUN, self.good, option, link] + run, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, timeout=30)
                        self.assertEqual(p.returncode, 1, p.stderr)
                        self.assertIn('%s: write failed: %s' % (link, os.strerror(errno.ENOSPC)), p.stderr)
                        self.assertTrue(os.path.islink(link), 'the link to a device was removed')
                        self.assertTrue(os.path.exists('/dev/full'))
                    finally:
                        os.unlink(link)

    def test_closed_standard_streams(self):
        """A standard stream the caller closed is not taken by the next file the engine opens: with
        stdin closed the text is empty (not a worker's /proc file read as the prompt), with stdout
        closed the text is a failed write (not lines inside the logits dump)."""
        import subprocess

        def closed(fd):
            return lambda: os.close(fd)
        for args, want in ((['-m', 'eval', '--json'], 'nothing to score: the text is 0 tokens'),
                           (['-f', '-', '-n', '2', '-t', '0'], 'standard input is empty'),
                           (['-m', 'tokenize'], None)):
            with self.subTest(stdin_closed=args):
                p = subprocess.run([hf_model.RUN, self.good] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, timeout=30, preexec_fn=closed(0))
                if want is None:  # tokenize: the ids of no text, none
                    self.assertEqual((p.returncode, p.stdout.strip()), (0, ''), p.stderr)
                else:
                    self.assertNotEqual(p.returncode, 0, p.stdout)
                    self.assertIn(want, p.stderr)
        dump = os.path.join(self.tmp, 'stdout_closed.f32')
        p = subprocess.run([hf_model.RUN, self.good, '--prompt-ids', '1,2', '-n', '3', '-t', '0', '--dump-logits', dump],
                           stderr=subprocess.PIPE, text=True, timeout=30, preexec_fn=closed(1))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn('standard output: write failed', p.stderr)
        self.assertEqual(os.path.getsize(dump) % (4 * hf_model.read_header(self.good)['vocab_size']), 0,
                         'the dump holds more than logits')

    def test_output_is_not_a_regular_file(self):
        """chat's /save and -m quantize -o write a new file and rename it over the path: a FIFO (or,
        as root, /dev/null) there is refused, not replaced by a file; a link to a file keeps its
        link and gets the new file."""
        import subprocess
        fifo = os.path.join(self.tmp, 'out.fifo')
        if not os.path.exists(fifo):
            os.mkfifo(fifo)
        p = subprocess.run([hf_model.RUN, self.good, '-m', 'chat', '-n', '2', '-t', '0', '--no-think'],
                           input='Hi\n/save %s\n' % fifo, capture_output=True, text=True, timeout=60)
        self.assertIn('chat: %s: is not a regular file (a device, FIFO or socket); the conversation was not saved'
                      % fifo, p.stderr)
        msg = self.run_fails([self.good, '-m', 'quantize', '--dtype', 'q8', '-o', fifo], fifo)
        self.assertIn('is not a regular file', msg)
        self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode), 'the FIFO was replaced')
        target, link = os.path.join(self.tmp, 'saved.json'), os.path.join(self.tmp, 'saved_link.json')
        with open(target, 'w') as f:
            f.write('old')
        if not os.path.lexists(link):
            os.symlink(target, link)
        os.chmod(target, 0o600)
        dangling, later = os.path.join(self.tmp, 'later_link.json'), os.path.join(self.tmp, 'later.json')
        if not os.path.lexists(dangling):
            os.symlink('later.json', dangling)
        p = subprocess.run([hf_model.RUN, self.good, '-m', 'chat', '-n', '2', '-t', '0', '--no-think'],
                           input='Hi\n/save %s\n/save %s\n' % (link, dangling), capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        for path, file in ((link, target), (dangling, later)):
            self.assertTrue(os.path.islink(path), 'the link was replaced')
            with open(file) as f:
                self.assertEqual(json.load(f)[0], {'role': 'user', 'content': 'Hi'})
        self.assertEqual(stat.S_IMODE(os.stat(target).st_mode), 0o600, 'a private file is private no more')

    def test_nan_logits(self):
        """Weights that make every logit NaN (here the embedding table): generate and chat stop with one
        line that says so and status 1, instead of printing token 0 again and again."""
        import array
        h = hf_model.read_header(self.good)
        data = bytearray(self.data)
        n = h['vocab_size'] * h['dim']
        data[h['weights_offset']:h['weights_offset'] + 4 * n] = array.array('f', [float('nan')] * n).tobytes()
        path = os.path.join(self.tmp, 'nan.bin')
        with open(path, 'wb') as f:
            f.write(data)
        for args in (['--prompt-ids', '1,2', '-n', '3', '-t', '0'], ['--prompt-ids', '1,2', '-n', '3', '-t', '0.8'],
                     ['-m', 'chat', '-i', 'hi', '-n', '3']):
            with self.subTest(args=args):
                p = hf_model.run_engine([path] + args)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn('is NaN (weights that hold NaN or infinity, or activations that overflowed', p.stderr)

    def test_output_is_the_checkpoint(self):
        """--dump-logits and --norms-json naming the checkpoint (itself or through a link) are
        refused before anything is written (the model reads that file through its mapping as it
        runs), and so is the chat's /save; the file stays as it was. The same for the text of -f,
        and "-" (standard output, which carries the text) is refused too."""
        import shutil
        import subprocess
        model = os.path.join(self.tmp, 'victim.bin')
        shipped = os.path.join(hf_model.ROOT, 'models', 'tinystories.bin')
        shutil.copy(shipped, model)
        link = os.path.join(self.tmp, 'victim_link.bin')
        if not os.path.lexists(link):
            os.symlink(model, link)
        for flag in ('--dump-logits', '--norms-json'):
            for out in (model, link):
                with self.subTest(flag=flag, out=out):
                    p = hf_model.run_engine([model, '-i', 'hi', '-n', '2', flag, out])
                    self.assertEqual(p.returncode, 2, p.stderr)
                    self.assertEqual(p.stderr.strip(), 'run: error: %s: is the checkpoint; %s would write over it: '
                                                       'give another file' % (out, flag))
            with self.subTest(flag=flag, out='the -f text'):  # nor the text it reads, nor "-"
                text = os.path.join(self.tmp, 'prompt.txt')
                with open(text, 'w') as f:
                    f.write('hi there')
                p = hf_model.run_engine([model, '-f', text, '-n', '2', flag, text])
                self.assertEqual((p.returncode, p.stderr), (2, 'run: error: %s: is the text file (-f); %s would write '
                                                            'over it: give another file\n' % (text, flag)))
                with open(text) as f:
                    self.assertEqual(f.read(), 'hi there')
                p = hf_model.run_engine([model, '-i', 'hi', '-n', '2', flag, '-'])
                self.assertEqual((p.returncode, p.stderr), (2, 'run: error: %s -: its output goes to a file (standard '
                                                            'output carries the text)\n' % flag))
        p = subprocess.run([hf_model.RUN, model, '-m', 'chat', '-n', '2', '--no-think', '-s', '1'],
                           input='Hi\n/save %s\n' % link, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)  # from a pipe a command that fails ends the chat
        self.assertIn('chat: %s: is the model\'s checkpoint; /save to another file' % link, p.stderr)
        dump = os.path.join(self.tmp, 'chat_dump.f32')
        p = subprocess.run([hf_model.RUN, model, '-m', 'chat', '-n', '2', '--no-think', '-s', '1', '--dump-logits',
                            dump], input='Hi\n/save %s\n' % dump, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn('chat: %s: is the --dump-logits file; /save to another file' % dump, p.stderr)
        self.assertEqual(os.path.getsize(dump) % (4 * hf_model.read_header(model)['vocab_size']), 0,
                         'the dump holds more than logits')
        with open(model, 'rb') as f, open(shipped, 'rb') as g:
            self.assertTrue(f.read() == g.read(), 'the checkpoint changed')

    def bad_file(self, name, data):
        path = os.path.join(self.tmp, name)
        with open(path, 'wb') as f:
            f.write(data)
        return self.run_fails([path, '--prompt-ids', '1,2,3', '-n', '2', '-t', '0'], path)

    def patched(self, name, field, fmt, value, base=None):
        data = bytearray(self.data if base is None else base)
        struct.pack_into('<' + fmt, data, OFF[field], value)
        return self.bad_file(name, bytes(data))

    def test_nonexistent_file(self):
        path = os.path.join(self.tmp, 'does_not_exist.bin')
        self.run_fails([path, '--prompt-ids', '1', '-n', '1'], path)

    def test_directory_instead_of_file(self):
        """A folder (a Hugging Face model's, most likely): one line that names it and export.py."""
        msg = self.run_fails([self.tmp, '--prompt-ids', '1', '-n', '1'], self.tmp)
        self.assertIn(self.tmp + ': a directory, not a checkpoint file', msg)
        self.assertIn('python3 export.py FOLDER MODEL.bin', msg)

    def test_fifo_instead_of_file(self):
        """Opening a FIFO for reading waits for a writer, with none for ever, so it is refused before
        it is opened, in one line that names it."""
        if not hasattr(os, 'mkfifo'):
            self.skipTest('no FIFOs here')
        path = os.path.join(self.tmp, 'model.fifo')
        if not os.path.exists(path):
            os.mkfifo(path)
        msg = self.run_fails([path, '--prompt-ids', '1', '-n', '1'], path)
        self.assertIn(path + ': not a regular file', msg)

    def test_truncated(self):
        h = hf_model.read_header(self.good)
        size = len(self.data)
        tok_off = struct.unpack_from('<Q', self.data, OFF['tokenizer_offset'])[0]
        w_off = struct.unpack_from('<Q', self.data, OFF['weights_offset'])[0]
        cuts = sorted({0, 1, 8, 100, 255, 256, tok_off + 10, w_off, w_off + 1000, (w_off + size) // 2,
                       size - 4 * h['dim'], size - 1})
        for cut in cuts:
            with self.subTest(cut=cut):
                self.bad_file('trunc_%d.bin' % cut, self.data[:cut])

    def test_wrong_magic(self):
        self.assertIn('bad magic', self.bad_file('magic.bin', b'QWEN' + self.data[4:]))
        # what a user of another engine may give instead: llama.cpp's file, a Hugging Face folder's weights
        self.assertIn("a GGUF file (llama.cpp's format)", self.bad_file('model.gguf', b'GGUF' + self.data[4:]))
        header = b'{"__metadata__":{"format":"pt"}}'
        msg = self.bad_file('model.safetensors', struct.pack('<Q', len(header)) + header + self.data[:4096])
        self.assertIn('a safetensors file', msg)
        self.assertIn('python3 export.py FOLDER MODEL.bin', msg)

    def test_yarn_fields(self):
        """With the YaRN flag (8), each of its fields out of range is one line naming them."""
        flags = struct.unpack_from('<I', self.data, OFF['flags'])[0] | 8
        yarn = bytearray(self.data)
        struct.pack_into('<I', yarn, OFF['flags'], flags)
        msg = self.bad_file('yarn_zero.bin', bytes(yarn))  # the flag without its fields
        self.assertIn('YaRN fields out of range', msg)
        fields = (('rope_factor', 'f', 4.0, 0.5), ('rope_original_max', 'I', 64, 0), ('rope_beta_fast', 'f', 32.0, -1.0),
                  ('rope_beta_slow', 'f', 1.0, float('nan')), ('rope_attention_factor', 'f', 1.1, 0.0),
                  ('rope_truncate', 'I', 1, 2))  # (field, format, a good value, a bad one)
        for field, fmt, good, _ in fields:
            struct.pack_into('<' + fmt, yarn, OFF[field], good)
        for field, fmt, _, bad in fields:
            with self.subTest(field=field):
                msg = self.patched('yarn_%s.bin' % field, field, fmt, bad, base=bytes(yarn))
                self.assertIn('YaRN fields out of range', msg)

    def test_future_version(self):
        self.patched('version.bin', 'version', 'I', 6)
        self.patched('version0.bin', 'version', 'I', 0)

    def old_version(self, version, refused, still_run):
        """Files of an older version whose layout of a dtype in `refused` changed are refused with
        a message that says to export again; files of the dtypes in still_run are the same bytes as
        today's and still run."""
        bases = {'f32': self.data, 'q8': self.data_q8, 'q4': self.data_q4}
        for name in refused:
            msg = self.patched('v%d_%s.bin' % (version, name), 'version', 'I', version, base=bases[name])
            self.assertIn('export it again', msg)
        for name in still_run:
            data = bytearray(bases[name])
            struct.pack_into('<I', data, OFF['version'], version)
            path = os.path.join(self.tmp, 'v%d_%s.bin' % (version, name))
            with open(path, 'wb') as f:
                f.write(data)
            p = hf_model.run_engine([path, '--prompt-ids', '1,2,3', '-n', '2', '-t', '0'])
            self.assertEqual(p.returncode, 0, 'a version-%d %s file does not run: %s' % (version, name, p.stderr))

    def test_version_1(self):
        """Version 1 laid q8 out differently (docs/checkpoint.md#versions)."""
        self.old_version(1, ['q8'], ['f32'])

    def test_version_2(self):
        """Version 2 laid q4 out differently, and stored q8's scales as float32 (docs/checkpoint.md#versions)."""
        self.old_version(2, ['q4', 'q8'], ['f32'])

    def test_version_3(self):
        """Version 3 stored q4's and q8's scales as float32 (docs/checkpoint.md#versions)."""
        self.old_version(3, ['q4', 'q8'], ['f32'])

    def test_version_4(self):
        """Version 4 stored q8's scales as float32 (docs/checkpoint.md#versions); its q4 and f32 files are today's."""
        self.old_version(4, ['q8'], ['q4', 'f32'])

    def test_offsets_out_of_range(self):
        size = len(self.data)
        cases = [('tokenizer_offset', size + 64), ('tokenizer_bytes', size), ('weights_offset', size),
                 ('weights_bytes', size), ('weights_offset', 1 << 40)]
        for field, value in cases:
            with self.subTest(field=field, value=value):
                self.patched('off_%s_%d.bin' % (field, value), field, 'Q', value)

    def test_offset_plus_size_overflows(self):
        """weights_offset + weights_bytes wraps around 2^64 to a small number: only 64-bit checks
        that cannot overflow (or checks of each term against the file size) reject it."""
        w_off = struct.unpack_from('<Q', self.data, OFF['weights_offset'])[0]
        data = bytearray(self.data)
        struct.pack_into('<Q', data, OFF['weights_bytes'], (1 << 64) - w_off + 64)
        self.bad_file('wrap_weights.bin', bytes(data))
        data = bytearray(self.data)
        struct.pack_into('<Q', data, OFF['tokenizer_offset'], (1 << 64) - 64)
        struct.pack_into('<Q', data, OFF['tokenizer_bytes'], 128)
        self.bad_file('wrap_tokenizer.bin', bytes(data))

    def test_config_fields_that_overflow_sizes(self):
        """Dimensions whose products overflow 32-bit (or 64-bit) size arithmetic, zeros that would
        divide by zero, and values that make no sense."""
        cases = [('dim', 1 << 16), ('vocab_size', 0xFFFFFFFF), ('dim', 0x80000000),
                 ('hidden_dim', 0x7FFFFFFF), ('n_layers', 0xFFFFFFFF), ('n_heads', 0),
                 ('n_kv_heads', 0), ('n_kv_heads', 3), ('head_dim', 0), ('head_dim', 0x40000000),
                 ('vocab_size', 0), ('dim', 0), ('weight_type', 7), ('max_seq_len', 0)]
        for field, value in cases:
            with self.subTest(field=field, value=value):
                self.patched('cfg_%s_%d.bin' % (field, value), field, 'I', value)

    def test_rope_theta(self):
        """Below 1 (a corrupt byte can make it 1e-314, whose float is 0) the RoPE frequencies grow
        along the head or become infinite, and the text NaN: refused, naming the field."""
        for theta in (0.5, 5e-324, 0.0, -10000.0, float('nan'), float('inf'), 1e30):
            with self.subTest(rope_theta=theta):
                self.assertIn('rope_theta', self.patched('theta_%g.bin' % theta, 'rope_theta', 'd', theta))

    def test_q8_group_size(self):
        for gs in (0, 3, 0x80000000):
            with self.subTest(group_size=gs):
                self.patched('q8_gs_%d.bin' % gs, 'group_size', 'I', gs, base=self.data_q8)

    def test_q4_group_size(self):
        """q4's groups are 32 columns: 16 and 64 divide every width and are refused all the same."""
        for gs in (0, 16, 64, 3, 0x80000000):
            with self.subTest(group_size=gs):
                self.patched('q4_gs_%d.bin' % gs, 'group_size', 'I', gs, base=self.data_q4)

    def test_corrupt_tokenizer_section(self):
        """Impossible counts in the tokenizer section are refused with a message naming the file;
        random byte damage inside it never crashes the engine (it may still run: a damaged token
        string is not an error the engine can see)."""
        tok_off = struct.unpack_from('<Q', self.data, OFF['tokenizer_offset'])[0]
        for field_off in (0, 4, 8, 12):  # magic, n_vocab, n_merges, n_added
            with self.subTest(field=field_off):
                data = bytearray(self.data)
                struct.pack_into('<I', data, tok_off + field_off, 0xFFFFFFFF)
                self.bad_file('tok_%d.bin' % field_off, bytes(data))
        import random
        tok_len = struct.unpack_from('<Q', self.data, OFF['tokenizer_bytes'])[0]
        rng = random.Random(5)
        path = os.path.join(self.tmp, 'tok_fuzz.bin')
        for k in range(12):
            data = bytearray(self.data)
            for _ in range(6):
                data[tok_off + rng.randrange(tok_len)] = rng.randrange(256)
            with open(path, 'wb') as f:
                f.write(data)
            for args in (['--prompt-ids', '1,2,3'], ['-i', 'the cat sat']):
                with self.subTest(fuzz=k, args=args[0]):
                    p = hf_model.run_engine([path] + args + ['-n', '3', '-t', '0'], timeout=30)
                    self.assertGreaterEqual(p.returncode, 0, 'killed by signal %d' % -p.returncode)
                    if p.returncode:
                        self.assertIn(path, p.stderr)

    def test_bad_flags(self):
        g = self.good
        cases = [
            [g, '--no-such-flag'],
            [g, '-n', 'abc', '--prompt-ids', '1'],
            [g, '-t', 'hot', '--prompt-ids', '1'],
            [g, '-n', '+5', '--prompt-ids', '1'],         # numbers as --seed reads them: no sign but '-',
            [g, '-n', ' 5', '--prompt-ids', '1'],         # no space, no hex, inf or nan
            [g, '-t', '0x1', '--prompt-ids', '1'],
            [g, '-t', 'inf', '--prompt-ids', '1'],
            [g, '--top-p', 'nan', '--prompt-ids', '1'],
            [g, '-s', '+5', '--prompt-ids', '1'],
            [g, '--prompt-ids', '1,x,3', '-n', '1'],
            [g, '--prompt-ids', '1', '-n'],               # missing value
            [g, '--prompt-ids', '100000', '-n', '1'],     # id >= vocab_size (300)
            [g, '--prompt-ids', '-5', '-n', '1'],
            [g, '--prompt-ids', '1', '--kv-cache', 'f8'],  # only f32 and f16
            [g, '-m', 'bench', '--bench-depth', '-1'],
            [],                                           # no checkpoint at all
        ]
        for args in cases:
            with self.subTest(args=args[1:]):
                self.run_fails(args)

    def test_messages_state_the_problem(self):
        """Each refusal says what is wrong: the range a value must be in (the one the check really
        applies, and for a number too large for a float, its range rather than "needs a number"),
        a prompt longer than the model's context as such (no -c can help then), and counts in the
        singular where there is one."""
        g = self.good
        for args, says in ((['--repeat-penalty', '101'], '--repeat-penalty must be in (0, 100], got 101'),
                           (['--repeat-penalty', '0'], '--repeat-penalty must be in (0, 100], got 0'),
                           (['-t', '1e39'], '-t must be in [0, 100], got 1e39'),
                           (['--top-p', '-1e40'], '--top-p must be in [0, 1], got -1e40'),
                           (['-n', '99999999999999999999'], '-n must be in [0, 2147483647], got 99999999999999999999')):
            with self.subTest(args=args):
                p = hf_model.run_engine([g, '--prompt-ids', '1'] + args)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertEqual(p.stderr, 'run: error: ' + says + '\n')
        p = hf_model.run_engine([g, '--repeat-penalty', '1e-30', '--prompt-ids', '1', '-n', '1'])
        self.assertEqual(p.returncode, 0, p.stderr)
        max_len = hf_model.read_header(g)['max_seq_len']
        too_long = ','.join(['5'] * (max_len + 1))
        p = hf_model.run_engine([g, '--prompt-ids', too_long, '-n', '1', '-t', '0'])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stderr, "run: error: the prompt has %d tokens, more than the model's context of %d "
                         "positions\n" % (max_len + 1, max_len))
        p = hf_model.run_engine([g, '-c', '8', '--prompt-ids', ','.join(['5'] * 9), '-n', '1', '-t', '0'])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn('the prompt has 9 tokens, more than the context of 8 (raise it with -c, at most %d)'
                      % max_len, p.stderr)
        p = hf_model.run_engine([g, '-c', '1', '--prompt-ids', '1', '-n', '3', '-t', '0', '--verbose-prompt'])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('run: prompt of 1 token: 1\n', p.stderr)
        self.assertIn('run: the context is full (1 token): generation stopped', p.stderr)

    def test_bad_tuning_variables(self):
        """KERNELS_PREFETCH, KERNELS_SPIN_US and KERNELS_AMX are tuning knobs: a value the engine
        cannot use is named in a warning and the default kept (the run goes on); a good value warns
        of nothing."""
        if hf_model.reference_engine():
            self.skipTest('the reference engine reads no tuning variable')
        args = [self.good, '--prompt-ids', '1,2,3', '-n', '2', '-t', '0']
        for name, bad, good in (('KERNELS_PREFETCH', 'nearest', 'mid'), ('KERNELS_SPIN_US', '20us', '50'),
                                ('KERNELS_SPIN_US', '-1', '0'), ('KERNELS_AMX', 'off', '0')):
            with self.subTest(name=name, value=bad):
                p = hf_model.run_engine(args, env={name: bad})
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn('warning: %s=%s' % (name, bad), p.stderr)
                p = hf_model.run_engine(args, env={name: good})
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertNotIn('warning', p.stderr)

    def test_context_limits_never_crash(self):
        """Generating past the context (max_position_embeddings = 128) or a prompt longer than
        the cache: a clean stop or a clean error, never a crash."""
        g = self.good
        for args in ([g, '--prompt-ids', '1,2,3', '-n', '500', '-t', '0'],
                     [g, '--prompt-ids', ','.join(['5'] * 200), '-n', '2', '-t', '0']):
            with self.subTest(args=args[1:]):
                p = hf_model.run_engine(args, timeout=60)
                self.assertGreaterEqual(p.returncode, 0, 'killed by signal %d: %s' % (-p.returncode, p.stderr))
                if p.returncode != 0:
                    self.assertTrue(p.stderr.strip(), 'failed without a message')


if __name__ == '__main__':
    unittest.main()
