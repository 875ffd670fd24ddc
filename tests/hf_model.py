"""Writes tiny random Hugging Face checkpoints (Qwen3, Qwen3-MoE, Qwen2, Llama) for the end-to-end tests.

A folder written by write_model() looks like a real `save_pretrained` output (QWEN3.md 1 and 3):
config.json, generation_config.json, model.safetensors (or model-0000k-of-0000N.safetensors shards
plus model.safetensors.index.json), tokenizer.json and tokenizer_config.json. Python 3 standard
library only.

Weight scales are chosen so activations stay well-conditioned (unit-ish RMS everywhere) and logits
are O(1..10), so a relative error of 1e-4 is a meaningful bar:
  * embeddings ~ N(0, emb_std^2) (emb_std = 0.3 by default, so the layers move the residual)
  * every projection matrix [out, in] ~ N(0, (gain / sqrt(in))^2): y = W x keeps x's RMS
  * RMSNorm weights (input/post-attention/final/q_norm/k_norm) = 1 + N(0, 0.2^2)
  * Qwen2 q/k/v biases ~ N(0, 0.3^2)
  * Qwen3-MoE routers ~ N(0, (router_gain / sqrt(in))^2), router_gain 2 (top-k choices not near ties)
"""

import functools
import json
import math
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import unittest
from array import array

# ------------------------------------------------------------------------------------------------
# number formats


def f32_round(x):
    """x rounded to the nearest float32 (as a Python float)."""
    return struct.unpack('<f', struct.pack('<f', x))[0]


def f32_to_bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (what torch's .to(torch.bfloat16) does)."""
    bits = struct.unpack('<I', struct.pack('<f', x))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def bf16_bits_to_f32(h):
    return struct.unpack('<f', struct.pack('<I', (h & 0xFFFF) << 16))[0]


def bf16_round(x):
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def f16_round(x):
    return struct.unpack('<e', struct.pack('<e', x))[0]


# The same for whole lists, the per-value work in C where it can be (a model's tensors are
# millions of values): bit for bit what the functions above give value by value.

def bf16_bits_of(values):
    """[f32_to_bf16_bits(v) for v in values]."""
    return [((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF for b in array('I', array('f', values).tobytes())]


def bf16_bits_to_f32s(bits):
    """[bf16_bits_to_f32(h) for h in bits]."""
    return array('f', array('I', [(h & 0xFFFF) << 16 for h in bits]).tobytes()).tolist()


DTYPE_SIZE = {'F32': 4, 'BF16': 2, 'F16': 2, 'F8_E4M3': 1, 'F8_E5M2': 1, 'I8': 1, 'U8': 1}


def round_to_dtype(values, dtype):
    """The values a tensor of this dtype actually holds."""
    if dtype == 'F32':
        return array('f', values).tolist()
    if dtype == 'BF16':
        return bf16_bits_to_f32s(bf16_bits_of(values))
    if dtype == 'F16':
        return list(struct.unpack('<%de' % len(values), struct.pack('<%de' % len(values), *values)))
    raise ValueError('no float values for dtype %s' % dtype)


def encode_tensor(values, dtype):
    """Little-endian bytes of a flat list of values in a safetensors dtype."""
    if dtype == 'F32':
        a = array('f', values)
    elif dtype == 'BF16':
        a = array('H', bf16_bits_of(values))
    elif dtype == 'F16':
        return struct.pack('<%de' % len(values), *values)
    elif dtype in ('F8_E4M3', 'F8_E5M2', 'I8', 'U8'):
        # Only used to produce files export.py must reject: any byte pattern will do.
        return bytes((int(abs(v) * 16) & 0x7F) for v in values)
    else:
        raise ValueError('cannot encode dtype %s' % dtype)
    if sys.byteorder != 'little':
        a.byteswap()
    return a.tobytes()


# ------------------------------------------------------------------------------------------------
# safetensors (QWEN3.md 3.1, 3.2)


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape, values). Writes the file; returns the data byte count.

    Layout: u64 little-endian header length N, the JSON header padded with spaces so that 8 + N is
    a multiple of 8, then the tensors back to back in the order given, data_offsets relative to the
    start of the data area."""
    header = {'__metadata__': {'format': 'pt'}}
    blobs = []
    offset = 0
    for name, dtype, shape, values in tensors:
        blob = encode_tensor(values, dtype)
        n = 1
        for s in shape:
            n *= s
        assert len(blob) == n * DTYPE_SIZE[dtype], name
        header[name] = {'dtype': dtype, 'shape': list(shape), 'data_offsets': [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    hjson = json.dumps(header, separators=(',', ':')).encode('utf-8')
    hjson += b' ' * ((-(8 + len(hjson))) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    return offset


def read_safetensors(path):
    """name -> (dtype, shape, list of float values). Independent of export.py."""
    with open(path, 'rb') as f:
        data = f.read()
    (n,) = struct.unpack_from('<Q', data, 0)
    header = json.loads(data[8:8 + n].decode('utf-8'))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == '__metadata__':
            continue
        dtype, shape = info['dtype'], info['shape']
        b, e = info['data_offsets']
        raw = data[base + b:base + e]
        count = 1
        for s in shape:
            count *= s
        if dtype == 'F32':
            vals = list(struct.unpack('<%df' % count, raw))
        elif dtype == 'BF16':
            vals = bf16_bits_to_f32s(struct.unpack('<%dH' % count, raw))
        elif dtype == 'F16':
            vals = list(struct.unpack('<%de' % count, raw))
        else:
            raise ValueError('%s: tensor %s has dtype %s' % (path, name, dtype))
        out[name] = (dtype, shape, vals)
    return out


def read_hf_tensors(folder):
    """All tensors of an HF folder, single-file or sharded: name -> (dtype, shape, values)."""
    index = os.path.join(folder, 'model.safetensors.index.json')
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)['weight_map']
        out = {}
        for shard in sorted(set(weight_map.values())):
            for name, t in read_safetensors(os.path.join(folder, shard)).items():
                assert weight_map.get(name) == shard, (name, shard)
                out[name] = t
        assert set(out) == set(weight_map), 'index and shards disagree'
        return out
    return read_safetensors(os.path.join(folder, 'model.safetensors'))


# ------------------------------------------------------------------------------------------------
# tokenizer (QWEN3.md 4.1, 4.4, 4.6): a tiny one in Qwen3's exact format


def bytes_to_unicode_order():
    """The 256 (byte, char) pairs in GPT-2's order: printable bytes first, then the rest -> U+0100.."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [(b, chr(c)) for b, c in zip(bs, cs)]


BYTE_CHARS = bytes_to_unicode_order()
BYTE_TO_CHAR = {b: c for b, c in BYTE_CHARS}

# Merge k makes token id 256 + k, as in the real file.
MERGES = [('Ġ', 't'), ('h', 'e'), ('i', 'n'), ('Ġt', 'he'), ('Ġ', 'a'), ('e', 'r'), ('o', 'n'),
          ('Ġ', 's'), ('r', 'e'), ('Ġ', 'Ġ'), ('a', 't'), ('o', 'r')]
ADDED_TOKENS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<think>', '</think>']
N_BPE = 256 + len(MERGES)               # 268 BPE ids
TOKENIZER_SIZE = N_BPE + len(ADDED_TOKENS)  # 273 ids with the added tokens
ENDOFTEXT_ID = N_BPE                    # 268
IM_START_ID = N_BPE + 1
IM_END_ID = N_BPE + 2

QWEN_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
              "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")

CHAT_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content"
                 " + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
                 "{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def tokenizer_json():
    vocab = {c: i for i, (_, c) in enumerate(BYTE_CHARS)}
    for k, (a, b) in enumerate(MERGES):
        assert a in vocab and b in vocab, (a, b)
        vocab[a + b] = 256 + k
    added = [{'id': N_BPE + i, 'content': s, 'single_word': False, 'lstrip': False, 'rstrip': False,
              'normalized': False, 'special': not s.startswith('<think') and not s.startswith('</think')}
             for i, s in enumerate(ADDED_TOKENS)]
    bl = {'type': 'ByteLevel', 'add_prefix_space': False, 'trim_offsets': False, 'use_regex': False}
    return {
        'version': '1.0', 'truncation': None, 'padding': None, 'added_tokens': added,
        'normalizer': {'type': 'NFC'},
        'pre_tokenizer': {'type': 'Sequence', 'pretokenizers': [
            {'type': 'Split', 'pattern': {'Regex': QWEN_REGEX}, 'behavior': 'Isolated', 'invert': False},
            bl]},
        'post_processor': dict(bl), 'decoder': dict(bl),
        'model': {'type': 'BPE', 'dropout': None, 'unk_token': None, 'continuing_subword_prefix': '',
                  'end_of_word_suffix': '', 'fuse_unk': False, 'byte_fallback': False,
                  'ignore_merges': False, 'vocab': vocab, 'merges': [[a, b] for a, b in MERGES]},
    }


def tokenizer_config_json():
    return {
        'add_bos_token': False, 'add_prefix_space': False,
        'added_tokens_decoder': {str(N_BPE + i): {'content': s, 'lstrip': False, 'normalized': False,
                                                  'rstrip': False, 'single_word': False,
                                                  'special': not s.startswith('<think') and not s.startswith('</think')}
                                 for i, s in enumerate(ADDED_TOKENS)},
        'additional_special_tokens': ['<|im_start|>', '<|im_end|>'],
        'bos_token': None, 'chat_template': CHAT_TEMPLATE, 'clean_up_tokenization_spaces': False,
        'eos_token': '<|im_end|>', 'errors': 'replace', 'model_max_length': 131072,
        'pad_token': '<|endoftext|>', 'split_special_tokens': False, 'tokenizer_class': 'Qwen2Tokenizer',
        'unk_token': None,
    }


# ------------------------------------------------------------------------------------------------
# the model


ARCHS = {
    # arch: (architectures, model_type, has QK-norm, has q/k/v bias)
    'qwen3': ('Qwen3ForCausalLM', 'qwen3', True, False),
    'qwen3_moe': ('Qwen3MoeForCausalLM', 'qwen3_moe', True, False),  # QWEN3.md 8
    'qwen2': ('Qwen2ForCausalLM', 'qwen2', False, True),
    'llama': ('LlamaForCausalLM', 'llama', False, False),
}


class Spec:
    """Everything that defines one tiny model. Keyword arguments override the defaults."""

    def __init__(self, **kw):
        self.arch = 'qwen3'
        self.dim = 64
        self.hidden_dim = 128
        self.n_layers = 2
        self.n_heads = 4
        self.n_kv_heads = 2
        self.head_dim = 16            # None: no head_dim key in config.json (then dim / n_heads)
        self.vocab_size = 300         # embedding rows; the tokenizer knows ids 0..272
        self.rms_norm_eps = 1e-6
        self.rope_theta = 1000000.0
        self.max_position_embeddings = 128
        self.tie = True
        self.store_lm_head = False    # tied only: also store a (redundant, identical) lm_head.weight;
                                      # 'different': store a different one (must be ignored)
        self.dtype = 'BF16'           # safetensors dtype of every tensor: BF16, F32 or F16
        self.shards = 1               # > 1: model-0000k-of-0000N.safetensors + index.json
        self.seed = 1
        self.emb_std = 0.3            # std of the embedding rows (tied logits ~ emb_std * sqrt(dim) * 3)
        self.gain = 1.0               # projection matrices ~ N(0, (gain/sqrt(in))^2)
        self.qk_gain = 1.0            # extra factor on q_proj/k_proj (QK-norm divides it out)
        self.norm_noise = 0.2         # norm weights = 1 + N(0, norm_noise^2)
        # Embedding and lm_head rows scaled by these factors: by default the end-of-sequence ids'
        # rows are shrunk so their logits stay near 0 and greedy generation never stops early
        # (every -n step is really decoded).
        self.row_scales = {ENDOFTEXT_ID: 0.02, IM_END_ID: 0.02}
        # For the error tests: drop tensors, change a tensor's dtype, edit config.json.
        self.omit = ()
        self.dtype_overrides = {}
        self.config_overrides = {}
        # Qwen3-MoE (arch='qwen3_moe', QWEN3.md 8); ignored by the other archs. hidden_dim is then
        # config's intermediate_size, the width of the dense layers' MLP.
        self.num_experts = 4
        self.num_experts_per_tok = 2
        self.moe_intermediate_size = 32
        self.norm_topk_prob = True
        self.decoder_sparse_step = 1
        self.mlp_only_layers = []
        self.router_gain = 2.0        # router rows ~ N(0, (router_gain/sqrt(dim))^2): wide logit gaps,
                                      # so a quantised export rarely flips a top-k choice
        for k, v in kw.items():
            if not hasattr(self, k):
                raise TypeError('unknown Spec field %s' % k)
            setattr(self, k, v)
        if self.arch == 'qwen2':
            assert self.head_dim in (None, self.dim // self.n_heads), 'Qwen2 has head_dim = dim / heads'

    def is_moe_layer(self, l):
        """transformers' rule (Qwen3MoeDecoderLayer): layer l has the sparse MoE block."""
        return (self.arch == 'qwen3_moe' and l not in self.mlp_only_layers and self.num_experts > 0
                and (l + 1) % self.decoder_sparse_step == 0)

    @property
    def hd(self):
        return self.head_dim if self.head_dim is not None else self.dim // self.n_heads

    def config(self):
        cls, model_type, _, _ = ARCHS[self.arch]
        c = {
            'architectures': [cls],
            'attention_bias': False,
            'attention_dropout': 0.0,
            'bos_token_id': ENDOFTEXT_ID,
            'eos_token_id': IM_END_ID,
            'hidden_act': 'silu',
            'hidden_size': self.dim,
            'initializer_range': 0.02,
            'intermediate_size': self.hidden_dim,
            'max_position_embeddings': self.max_position_embeddings,
            'model_type': model_type,
            'num_attention_heads': self.n_heads,
            'num_hidden_layers': self.n_layers,
            'num_key_value_heads': self.n_kv_heads,
            'rms_norm_eps': self.rms_norm_eps,
            'rope_scaling': None,
            'rope_theta': self.rope_theta,
            'tie_word_embeddings': self.tie,
            'torch_dtype': {'BF16': 'bfloat16', 'F32': 'float32', 'F16': 'float16'}[self.dtype],
            'transformers_version': '4.51.0',
            'use_cache': True,
            'vocab_size': self.vocab_size,
        }
        if self.head_dim is not None:
            c['head_dim'] = self.head_dim
        if self.arch == 'qwen2':
            c.pop('attention_bias')  # Qwen2's config has no such key: its q/k/v biases are implied
            c.update({'max_window_layers': self.n_layers, 'sliding_window': None, 'use_sliding_window': False})
        elif self.arch == 'qwen3':
            c.update({'max_window_layers': self.n_layers, 'sliding_window': None, 'use_sliding_window': False})
        elif self.arch == 'qwen3_moe':
            c.update({'max_window_layers': self.n_layers, 'sliding_window': None, 'use_sliding_window': False,
                      'decoder_sparse_step': self.decoder_sparse_step,
                      'moe_intermediate_size': self.moe_intermediate_size,
                      'num_experts_per_tok': self.num_experts_per_tok, 'num_experts': self.num_experts,
                      'norm_topk_prob': self.norm_topk_prob, 'output_router_logits': False,
                      'router_aux_loss_coef': 0.001, 'mlp_only_layers': list(self.mlp_only_layers)})
        else:
            c.update({'mlp_bias': False, 'pretraining_tp': 1})
        c.update(self.config_overrides)
        for k in [k for k, v in self.config_overrides.items() if v is DELETE]:
            del c[k]
        return c

    def tensor_list(self):
        """[(name, shape, values)] in HF module order, values as Python floats (not yet rounded).
        Drawn once per process for the fields that shape them (a test's many folders of one model
        with a different config.json or a tensor left out share the draw); each call gets its own
        lists."""
        key = repr(sorted((k, v) for k, v in vars(self).items() if k not in CONFIG_ONLY_FIELDS))
        if key not in _drawn_tensors:
            if len(_drawn_tensors) >= 4:  # a few models' worth of Python floats, not every test's
                del _drawn_tensors[next(iter(_drawn_tensors))]
            _drawn_tensors[key] = self.draw_tensors()
        return [(name, list(shape), list(values)) for name, shape, values in _drawn_tensors[key]]

    def draw_tensors(self):
        """tensor_list's values, drawn from the seed."""
        rng = random.Random(self.seed)
        D, F, H, K, d, V = self.dim, self.hidden_dim, self.n_heads, self.n_kv_heads, self.hd, self.vocab_size
        _, _, qk_norm, bias = ARCHS[self.arch]

        def mat(rows, cols, gain=1.0):
            s = self.gain * gain / math.sqrt(cols)
            return [rng.gauss(0.0, s) for _ in range(rows * cols)]

        def normw(n):
            return [1.0 + rng.gauss(0.0, self.norm_noise) for _ in range(n)]

        def vec(n, s):
            return [rng.gauss(0.0, s) for _ in range(n)]

        t = [('model.embed_tokens.weight', [V, D], vec(V * D, self.emb_std))]
        for l in range(self.n_layers):
            p = 'model.layers.%d.' % l
            t.append((p + 'input_layernorm.weight', [D], normw(D)))
            t.append((p + 'self_attn.q_proj.weight', [H * d, D], mat(H * d, D, self.qk_gain)))
            t.append((p + 'self_attn.k_proj.weight', [K * d, D], mat(K * d, D, self.qk_gain)))
            t.append((p + 'self_attn.v_proj.weight', [K * d, D], mat(K * d, D)))
            if bias:
                t.append((p + 'self_attn.q_proj.bias', [H * d], vec(H * d, 0.3)))
                t.append((p + 'self_attn.k_proj.bias', [K * d], vec(K * d, 0.3)))
                t.append((p + 'self_attn.v_proj.bias', [K * d], vec(K * d, 0.3)))
            if qk_norm:
                t.append((p + 'self_attn.q_norm.weight', [d], normw(d)))
                t.append((p + 'self_attn.k_norm.weight', [d], normw(d)))
            t.append((p + 'self_attn.o_proj.weight', [D, H * d], mat(D, H * d)))
            t.append((p + 'post_attention_layernorm.weight', [D], normw(D)))
            if self.is_moe_layer(l):
                E, M = self.num_experts, self.moe_intermediate_size
                t.append((p + 'mlp.gate.weight', [E, D], vec(E * D, self.router_gain / math.sqrt(D))))
                for e in range(E):
                    q = p + 'mlp.experts.%d.' % e
                    t.append((q + 'gate_proj.weight', [M, D], mat(M, D)))
                    t.append((q + 'up_proj.weight', [M, D], mat(M, D)))
                    t.append((q + 'down_proj.weight', [D, M], mat(D, M)))
            else:
                t.append((p + 'mlp.gate_proj.weight', [F, D], mat(F, D)))
                t.append((p + 'mlp.up_proj.weight', [F, D], mat(F, D)))
                t.append((p + 'mlp.down_proj.weight', [D, F], mat(D, F)))
        t.append(('model.norm.weight', [D], normw(D)))
        if not self.tie:
            t.append(('lm_head.weight', [V, D], mat(V, D, 1.0)))
        for name, shape, values in (t[0], t[-1]):
            if name in ('model.embed_tokens.weight', 'lm_head.weight'):
                for row, scale in self.row_scales.items():
                    for i in range(row * D, (row + 1) * D):
                        values[i] *= scale
        if self.tie and self.store_lm_head == 'different':
            # Not in real files: a stored head that differs, to show that tied means embed_tokens.
            t.append(('lm_head.weight', [V, D], vec(V * D, self.emb_std)))
        elif self.tie and self.store_lm_head:
            t.append(('lm_head.weight', [V, D], list(t[0][2])))  # the stored copy equals the embedding
        return t


# The Spec fields that change config.json or which tensors are written and how, not the values drawn.
CONFIG_ONLY_FIELDS = ('rms_norm_eps', 'rope_theta', 'max_position_embeddings', 'dtype', 'shards', 'omit',
                      'dtype_overrides', 'config_overrides')
_drawn_tensors = {}  # tensor_list's latest draws in this process, the oldest first


class _Delete:
    def __repr__(self):
        return 'DELETE'


DELETE = _Delete()  # config_overrides={'key': DELETE} removes a key from config.json


def write_model(folder, spec):
    """Writes the HF folder for spec; returns {name: (dtype, shape, values as stored)}."""
    os.makedirs(folder, exist_ok=True)
    cfg = spec.config()
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=2)
    gen = {'bos_token_id': ENDOFTEXT_ID, 'do_sample': True, 'eos_token_id': [IM_END_ID, ENDOFTEXT_ID],
           'pad_token_id': ENDOFTEXT_ID, 'temperature': 0.6, 'top_k': 20, 'top_p': 0.95,
           'transformers_version': '4.51.0'}
    with open(os.path.join(folder, 'generation_config.json'), 'w') as f:
        json.dump(gen, f, indent=4)
    with open(os.path.join(folder, 'tokenizer.json'), 'w', encoding='utf-8') as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False, indent=2)
    with open(os.path.join(folder, 'tokenizer_config.json'), 'w', encoding='utf-8') as f:
        json.dump(tokenizer_config_json(), f, ensure_ascii=False, indent=2)

    stored = {}
    tensors = []
    for name, shape, values in spec.tensor_list():
        if name in spec.omit:
            continue
        dtype = spec.dtype_overrides.get(name, spec.dtype)
        tensors.append((name, dtype, shape, values))
        if dtype in ('F32', 'BF16', 'F16'):
            stored[name] = (dtype, shape, round_to_dtype(values, dtype))

    if spec.shards <= 1:
        write_safetensors(os.path.join(folder, 'model.safetensors'), tensors)
        return stored
    # Split by bytes into spec.shards nearly equal parts, at tensor granularity (so mid-layer).
    sizes = [len(v) * DTYPE_SIZE[dt] for _, dt, _, v in tensors]
    total = sum(sizes)
    n = spec.shards
    groups = [[] for _ in range(n)]
    acc = 0
    for t, s in zip(tensors, sizes):
        k = min(n - 1, acc * n // total)
        groups[k].append(t)
        acc += s
    groups = [g for g in groups if g]
    n = len(groups)
    weight_map = {}
    for k, g in enumerate(groups):
        fname = 'model-%05d-of-%05d.safetensors' % (k + 1, n)
        write_safetensors(os.path.join(folder, fname), g)
        for t in g:
            weight_map[t[0]] = fname
    index = {'metadata': {'total_size': total}, 'weight_map': dict(sorted(weight_map.items()))}
    with open(os.path.join(folder, 'model.safetensors.index.json'), 'w') as f:
        json.dump(index, f, indent=2)
    return stored


# ------------------------------------------------------------------------------------------------
# running export.py and ./run (shared by test_model.py and test_bad_input.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.environ.get('QWEN3_RUN') or os.path.join(ROOT, 'run')  # QWEN3_RUN: test another build
# QWEN3_EMULATOR: the engine runs under this emulator (make test-arm: qemu-aarch64), whose own signal
# handlers and masks are what /proc shows of the engine's process and threads.
EMULATOR = os.environ.get('QWEN3_EMULATOR')
EXPORT = os.path.join(ROOT, 'export.py')
# The Python scripts the tests run (export.py, tools/*.py) use the standard library only; -S runs
# them without site-packages, which holds them to that, and skips what a site's .pth files import
# at each start (65 ms a process where one imports certifi, and the tests start over 300).
PYTHON = [sys.executable, '-S']


def missing_tools():
    """Why the end-to-end tests cannot run here, or None."""
    if not os.path.exists(EXPORT):
        return 'export.py is missing'
    if not os.access(RUN, os.X_OK):
        return './run is not built (run `make`)'
    return None


class TempDirTestCase(unittest.TestCase):
    """The base of the end-to-end test classes: a temporary folder per class (cls.tmp), removed
    after its tests even when setUpClass fails, and every test skipped, with the reason, when
    export.py or ./run is missing (NEEDS_TOOLS = False for classes that need neither; NEEDS says
    what for)."""
    NEEDS_TOOLS = True
    NEEDS = ''

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix='qwen3_%s_' % cls.__name__)
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)

    def setUp(self):
        if self.NEEDS_TOOLS:
            self.skip_without_tools()

    def skip_without_tools(self):
        why = missing_tools()
        if why:
            self.skipTest(why + (': ' + self.NEEDS if self.NEEDS else ''))

    def fresh_dir(self, name):
        """A new empty folder in cls.tmp, its name made unique by a count."""
        type(self).n_dirs = getattr(type(self), 'n_dirs', 0) + 1
        d = os.path.join(self.tmp, '%s_%d' % (name, self.n_dirs))
        os.makedirs(d)
        return d


def stale_and_live_temporaries(out_dir, base):
    """Writes two temporaries for the output out_dir/base as export.py and ./run -m quantize name
    them, .BASE.PID.tmp: one of a process that has exited (a run killed outright leaves such a
    file) and one of this test's own, running process. Returns (stale path, live path)."""
    import subprocess
    gone = subprocess.Popen([*PYTHON, '-c', 'pass'])
    gone.wait()  # its pid now belongs to no process (reuse within a test is not a concern)
    paths = [os.path.join(out_dir, '.%s.%d.tmp' % (base, pid)) for pid in (gone.pid, os.getpid())]
    for path in paths:
        with open(path, 'wb') as f:
            f.write(b'partial')
    return paths


def run_export(hf_dir, out_path, dtype=None, timeout=120, extra=()):
    import subprocess
    cmd = [*PYTHON, EXPORT, hf_dir, out_path] + (['--dtype', dtype] if dtype else []) + list(extra)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def run_engine(args, timeout=60, env=None):
    """./run with args; env: variables to set on top of this process's environment."""
    import subprocess
    return subprocess.run([RUN] + list(args), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, errors='replace', env=dict(os.environ, **(env or {})))


def engine_kernels(ckpt):
    """The kernels ./run uses on this machine (the bench's first line: "kernels avx2+avx512+bf16",
    "neon", "reference", ...); the bench is stopped once it has printed that line."""
    import subprocess
    p = subprocess.Popen([RUN, ckpt, '-m', 'bench', '--threads', '1', '--bench-prompt', '2', '--bench-gen', '1',
                          '--bench-reps', '1'], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
    m = re.search(r'kernels ([\w+]+)', line)
    assert m, 'no kernels in the bench\'s first line: %r' % line
    return m.group(1)


def usable_cpus():
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)


def engine_threads():
    """The most threads ./run runs here: one per usable CPU, one in the reference engine."""
    return 1 if reference_engine() else usable_cpus()


@functools.lru_cache(maxsize=None)
def reference_engine():
    """Whether ./run is the reference engine (make SCALAR=1, make ref), as its bench names its
    kernels: it runs one thread, has no thread pool and reads no tuning variable, so the tests of
    those skip on it. Asked once a process."""
    return engine_kernels(os.path.join(ROOT, 'models', 'tinystories.bin')) == 'reference'


def read_logits(path, vocab_size):
    """The --dump-logits file: raw little-endian float32, vocab_size per row -> list of rows."""
    a = array('f')
    with open(path, 'rb') as f:
        a.frombytes(f.read())
    if sys.byteorder != 'little':
        a.byteswap()
    assert len(a) % vocab_size == 0, 'logits file of %d floats is not rows of %d' % (len(a), vocab_size)
    return [list(a[i:i + vocab_size]) for i in range(0, len(a), vocab_size)]


def read_header(path):
    """The checkpoint header fields the tests need (model.h FileHeader)."""
    with open(path, 'rb') as f:
        raw = f.read(256)
    fields = struct.unpack('<4s13I f i d I 8i f f i 2I 4Q f I f f f I 72x', raw)
    names = ['magic', 'version', 'arch', 'flags', 'dim', 'hidden_dim', 'n_layers', 'n_heads',
             'n_kv_heads', 'head_dim', 'vocab_size', 'max_seq_len', 'weight_type', 'group_size',
             'rms_norm_eps', 'bos_id', 'rope_theta', 'n_eos']
    h = dict(zip(names, fields))
    h['eos_ids'] = list(fields[18:18 + h['n_eos']])
    h.update(zip(['tok_offset', 'tok_size', 'weights_offset', 'weights_size'], fields[31:35]))
    h.update(zip(['rope_factor', 'rope_original_max', 'rope_beta_fast', 'rope_beta_slow', 'rope_attention_factor',
                  'rope_truncate'], fields[-6:]))
    return h


if __name__ == '__main__':
    # python3 tests/hf_model.py OUT_DIR [field=value ...]: write one model by hand.
    if len(sys.argv) < 2:
        sys.exit('usage: hf_model.py OUT_DIR [field=value ...]')
    kw = {}
    for a in sys.argv[2:]:
        k, v = a.split('=', 1)
        kw[k] = json.loads(v) if v[:1] in '0123456789-[{tfn' else v
    write_model(sys.argv[1], Spec(**kw))
    print('wrote', sys.argv[1])
