"""A plain-Python reference forward pass of Qwen3 / Qwen3-MoE / Qwen2 / Llama (QWEN3.md 2.1-2.5, 6, 8).

Independent of export.py and of the engine: it reads the Hugging Face folder itself (config.json and
the safetensors, sharded or not) and computes in double precision with lists of floats and the math
module, one token at a time with a KV cache (QWEN3.md 2.2; mathematically identical to a causal
prefill, 2.3). forward() returns the logits of every position.

Deliberate mistakes (to prove the end-to-end test would catch them), all off by default:
  eps=1e-5            use this epsilon instead of config's rms_norm_eps (llama2.c hard-codes 1e-5)
  rope='interleaved'  rotate pairs (2i, 2i+1) (llama2.c) instead of rotate-half (i, i+d/2)
  skip_qk_norm=True   leave out Qwen3's per-head RMSNorm of q and k
  gqa='mod'           query head j reads kv head j % K instead of j // G
  moe_mistake=        Qwen3-MoE's sparse block (QWEN3.md 8.3) done wrong: 'softmax-after-topk' (Mixtral's
                      order: softmax over the k largest logits only), 'no-renorm' (the k probabilities
                      not divided by their sum though norm_topk_prob is true), 'expert-off-by-one'
                      (expert e computed with expert (e + 1) % E's weights)

The RMSNorm lab (./run --ablate, --norm-eps, --norm layernorm): forward(ablate=NAMES, eps=X,
layernorm=True) with NAMES a subset of ABLATIONS (see Reference.lab_norm for what each one does).

To model what an export dtype stores, Reference(folder, matrix_transform=as_bf16, as_q8, as_q4 ...)
changes the weight matrices, and act_group= also rounds every matrix-vector input to int8 (the
SIMD q8 matmul's activation quantisation). forward(kv_f16=True) rounds every cached key and value
to IEEE half precision (struct's 'e' format: round to nearest, ties to even), as `./run --kv-cache
f16` stores them; forward(kv_q8=True) quantises them as `--kv-cache q8` does (Reference.q8). With
either, bf16_prefill=N makes the first N positions attend as the engine's prefill over those
caches does where the build has AVX-512 BF16 (kernels name "+bf16"): queries, cached values and
the softmax's unnormalised weights rounded to bf16 (kernels/fast/attention.c, bf16 pairs). With
kv_q8, q8_decode_from=N makes positions N and later attend as decode over a q8 cache does where
the build has AVX-512 VNNI or AVX2 alone (kernels name "+vnni" or "+int8"): each query quantised
as a cached row is (q8_scores).
"""

import json
import math
import os
import struct
import sys
from operator import mul

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402  (the safetensors reader and the number formats)


f32 = hf_model.f32_round  # rounds a Python float to the nearest float32


MATRIX_SUFFIXES = ('embed_tokens.weight', 'q_proj.weight', 'k_proj.weight', 'v_proj.weight',
                   'o_proj.weight', 'gate_proj.weight', 'up_proj.weight', 'down_proj.weight',
                   'lm_head.weight')


def is_matrix(name):
    """The tensors export.py stores as MATRIX (model.h): these change with --dtype bf16 / q8;
    norm weights, biases and Qwen3-MoE's routers (mlp.gate.weight) are always float32. (The
    experts' mlp.experts.E.{gate,up,down}_proj.weight are matrices.)"""
    return name.endswith(MATRIX_SUFFIXES) and not is_router(name)


def is_router(name):
    """Qwen3-MoE's router, model.layers.L.mlp.gate.weight [num_experts, hidden]: stored float32 in
    every export format, and its product's input is never quantised to int8."""
    return name.endswith('mlp.gate.weight')


def as_bf16(values, cols):
    """What export --dtype bf16 stores: round to nearest even bfloat16."""
    return hf_model.round_to_dtype(values, 'BF16')


def _quantize_groups(values, group_size, scale):
    """Per group of group_size consecutive values: m = max|v|, q = round(v * 127 / m) clamped to
    [-127, 127], returned dequantised as scale(m) * q (0 for an all-zero group)."""
    out = []
    for g in range(0, len(values), group_size):
        grp = values[g:g + group_size]
        m = max(abs(v) for v in grp)
        if m == 0.0:
            out.extend(0.0 for _ in grp)
            continue
        s = scale(m)
        inv = 127.0 / m
        out.extend(s * max(-127, min(127, round(v * inv))) for v in grp)
    return out


def as_q8(values, cols, group_size):
    """What export --dtype q8 stores, dequantised (model.h): per group of group_size consecutive
    values of a row, m = max|w|, s = float16(m / 127), q = round(w / s) clamped to [-127, 127]
    (an int8), w' = s * q (0 where s is 0)."""
    assert cols % group_size == 0
    out = []
    for g in range(0, len(values), group_size):
        grp = values[g:g + group_size]
        s = hf_model.f16_round(max(abs(v) for v in grp) / 127.0)
        if s == 0.0:
            out.extend(0.0 for _ in grp)
            continue
        inv = 1.0 / s
        out.extend(s * max(-127, min(127, round(v * inv))) for v in grp)
    return out


def as_q4(values, cols, group_size):
    """What export --dtype q4 stores, dequantised (model.h): per group of group_size consecutive
    values of a row, m = the value of largest magnitude (the negative one if two tie),
    s = float16(m / -8), q = round(w * -8 / m) clipped to [-8, 7], w' = s * q."""
    assert cols % group_size == 0
    out = []
    for g in range(0, len(values), group_size):
        grp = values[g:g + group_size]
        m = max(grp, key=lambda v: (abs(v), v < 0))
        if m == 0.0:
            out.extend(0.0 for _ in grp)
            continue
        s = hf_model.f16_round(m / -8.0)
        out.extend(s * max(-8, min(7, round(v * (-8.0 / m)))) for v in grp)
    return out


def quantize_activations(x, group_size):
    """int8 activations as llama2.c's runq.c (and our q8 matmul on SIMD builds) make them, returned
    dequantised: per group, s = max|x| / 127, q = round-half-even(x / s), x' = s * q."""
    return _quantize_groups(x, group_size, lambda m: m / 127.0)


# ./run --ablate's names: three RMSNorm uses that can be left out, three parts of the formula that
# can be changed. An item may name layers: 'qk-norm@1,2', 'pre-norms@0-1', 'norm-weight@final'.
ABLATIONS = ('qk-norm', 'final-norm', 'pre-norms', 'norm-weight', 'norm-scale', 'norm-gain')


def parse_ablation(item):
    """'name' or 'name@L,L-M,final' -> (name, the layers named or None for every one; -1: final)."""
    name, _, where = item.partition('@')
    assert name in ABLATIONS, item
    if not where:
        return name, None
    layers = set()
    for part in where.split(','):
        if part == 'final':
            layers.add(-1)
        else:
            a, _, b = part.partition('-')
            layers.update(range(int(a), int(b or a) + 1))
    return name, layers


class Reference:
    def __init__(self, folder, matrix_transform=None, act_group=None):
        """matrix_transform(values, cols) -> values, applied to every MATRIX tensor (to model what
        an export dtype stores, e.g. as_bf16); None keeps the source values. act_group: also
        quantise the input of every matrix-vector product to int8 in groups of act_group (to
        model a q8 matmul that multiplies int8 weights by int8 activations). Qwen3-MoE's routers
        are exempt from both: the engine stores them float32 in every format (is_router)."""
        self.act_group = act_group
        with open(os.path.join(folder, 'config.json')) as f:
            cfg = json.load(f)
        self.cfg = cfg
        self.arch = cfg['architectures'][0]
        assert self.arch in ('Qwen3ForCausalLM', 'Qwen3MoeForCausalLM', 'Qwen2ForCausalLM', 'LlamaForCausalLM'), \
            self.arch
        self.D = cfg['hidden_size']
        self.F = cfg['intermediate_size']
        self.L = cfg['num_hidden_layers']
        self.H = cfg['num_attention_heads']
        self.K = cfg.get('num_key_value_heads', self.H)
        self.d = cfg.get('head_dim') or self.D // self.H
        self.V = cfg['vocab_size']
        self.eps = cfg['rms_norm_eps']
        # transformers 4.x: top-level rope_theta; v5: rope_parameters.rope_theta; absent: 10000.
        rope_params = cfg.get('rope_parameters') or {}
        self.theta = cfg.get('rope_theta') or rope_params.get('rope_theta') or 10000.0
        # YaRN (QWEN3.md 2.9) in rope_scaling (4.x) or rope_parameters (v5); no other scaling
        scaling = cfg.get('rope_scaling') or rope_params
        self.yarn = scaling if scaling.get('rope_type', scaling.get('type', 'default')) != 'default' else None
        assert self.yarn is None or self.yarn.get('rope_type', self.yarn.get('type')) == 'yarn', self.yarn
        self.tie = cfg.get('tie_word_embeddings', False)
        self.qk_norm = self.arch in ('Qwen3ForCausalLM', 'Qwen3MoeForCausalLM')
        # Qwen3-MoE (QWEN3.md 8.1): layer l is sparse iff l not in mlp_only_layers, num_experts > 0
        # and (l + 1) % decoder_sparse_step == 0 (transformers' Qwen3MoeDecoderLayer).
        moe = self.arch == 'Qwen3MoeForCausalLM'
        self.E = cfg.get('num_experts', 128) if moe else 0
        self.top_k = cfg.get('num_experts_per_tok', 8)
        self.M = cfg.get('moe_intermediate_size', 768)
        self.norm_topk_prob = cfg.get('norm_topk_prob', False)
        step = cfg.get('decoder_sparse_step', 1)
        only = cfg.get('mlp_only_layers') or []
        self.moe_layers = [l for l in range(self.L) if moe and l not in only and self.E > 0 and (l + 1) % step == 0]
        self.bias = self.arch == 'Qwen2ForCausalLM' or (self.arch == 'LlamaForCausalLM' and cfg.get('attention_bias', False))

        raw = hf_model.read_hf_tensors(folder)

        def get(name, shape):
            dtype, sh, vals = raw[name]
            assert list(sh) == list(shape), (name, sh, shape)
            if matrix_transform is not None and is_matrix(name):
                vals = matrix_transform(vals, shape[-1])
            if len(shape) == 1:
                return list(vals)
            rows, cols = shape
            return [vals[r * cols:(r + 1) * cols] for r in range(rows)]

        D, F, H, K, d, V = self.D, self.F, self.H, self.K, self.d, self.V
        self.embed = get('model.embed_tokens.weight', [V, D])
        self.layers = []
        for l in range(self.L):
            p = 'model.layers.%d.' % l
            w = {
                'in_norm': get(p + 'input_layernorm.weight', [D]),
                'wq': get(p + 'self_attn.q_proj.weight', [H * d, D]),
                'wk': get(p + 'self_attn.k_proj.weight', [K * d, D]),
                'wv': get(p + 'self_attn.v_proj.weight', [K * d, D]),
                'wo': get(p + 'self_attn.o_proj.weight', [D, H * d]),
                'post_norm': get(p + 'post_attention_layernorm.weight', [D]),
            }
            if l in self.moe_layers:
                E, M = self.E, self.M
                w['router'] = get(p + 'mlp.gate.weight', [E, D])  # never transformed (is_matrix)
                w['experts'] = [(get(p + 'mlp.experts.%d.gate_proj.weight' % e, [M, D]),
                                 get(p + 'mlp.experts.%d.up_proj.weight' % e, [M, D]),
                                 get(p + 'mlp.experts.%d.down_proj.weight' % e, [D, M])) for e in range(E)]
            else:
                w['gate'] = get(p + 'mlp.gate_proj.weight', [F, D])
                w['up'] = get(p + 'mlp.up_proj.weight', [F, D])
                w['down'] = get(p + 'mlp.down_proj.weight', [D, F])
            if self.bias:
                w['bq'] = get(p + 'self_attn.q_proj.bias', [H * d])
                w['bk'] = get(p + 'self_attn.k_proj.bias', [K * d])
                w['bv'] = get(p + 'self_attn.v_proj.bias', [K * d])
            if self.qk_norm:
                w['q_norm'] = get(p + 'self_attn.q_norm.weight', [d])
                w['k_norm'] = get(p + 'self_attn.k_norm.weight', [d])
            self.layers.append(w)
        self.norm = get('model.norm.weight', [D])
        # Tied: the head IS embed_tokens; a stored lm_head.weight is ignored (QWEN3.md 3.3, 7.7).
        self.lm_head = self.embed if self.tie else get('lm_head.weight', [V, D])

        self.inv_freq, self.rope_gain = self.frequencies()

    def frequencies(self, yarn_mistake=None):
        """inv_freq exactly as HF computes it (QWEN3.md 2.4): float32 exponent 2i/d, float32 power;
        with YaRN (2.9) blended between inv_freq and inv_freq / factor by a ramp over the dimensions,
        and the gain that cos and sin are multiplied by (transformers' _compute_yarn_parameters).
        yarn_mistake: 'no-attention-factor' (the gain left at 1) or 'swapped-ramp' (the ramp's
        ends exchanged: the slow dimensions kept, the fast ones interpolated)."""
        d = self.d
        pos_freq = [f32(self.theta ** f32(f32(2 * i) / d)) for i in range(d // 2)]
        if not self.yarn:
            return [f32(1.0 / p) for p in pos_freq], 1.0
        y = self.yarn
        s, L = y['factor'], y['original_max_position_embeddings']
        beta_fast, beta_slow = y.get('beta_fast', 32.0), y.get('beta_slow', 1.0)

        def dim_turning(rotations):  # the dimension pair that turns `rotations` times over L
            return d * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(self.theta))
        low, high = dim_turning(beta_fast), dim_turning(beta_slow)
        if y.get('truncate', True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        if yarn_mistake == 'swapped-ramp':
            low, high = high, low
        inv_freq = []
        for i, p in enumerate(pos_freq):
            ramp = min(max(f32(f32(i - low) / f32(high - low)), 0.0), 1.0)
            e = f32(1.0 - ramp)  # the share of the plain frequency
            inv_freq.append(f32(f32(f32(1.0 / f32(s * p)) * f32(1.0 - e)) + f32(f32(1.0 / p) * e)))
        gain = y.get('attention_factor')
        if gain is None:
            gain = 0.1 * math.log(s) + 1.0 if s > 1 else 1.0
        return inv_freq, (1.0 if yarn_mistake == 'no-attention-factor' else f32(gain))

    # --------------------------------------------------------------------------------------------

    def matvec(self, W, x, quantise=True):
        """W x; with act_group, x rounded to int8 groups first (quantise=False: never, the router)."""
        if self.act_group and quantise:
            x = quantize_activations(x, self.act_group)
        return [sum(map(mul, row, x)) for row in W]

    def swiglu(self, gate, up, down, h):
        """down (silu(gate h) * up h): the dense MLP and each expert."""
        gt = self.matvec(gate, h)
        u = self.matvec(up, h)
        # silu(z) = z / (1 + e^-z); below -700 math.exp would overflow (C's expf gives inf
        # and z / inf = -0), and the limit is 0
        act = [(z / (1.0 + math.exp(-z)) if z > -700 else 0.0) * b for z, b in zip(gt, u)]
        return self.matvec(down, act)

    def route(self, w, h, moe_mistake=None):
        """Qwen3MoeSparseMoeBlock's routing (QWEN3.md 8.3) for one token: [(expert, weight)] of the
        num_experts_per_tok chosen experts, the largest probability first (ties: lower index)."""
        logits = self.matvec(w['router'], h, quantise=False)
        k = self.top_k
        if moe_mistake == 'softmax-after-topk':  # Mixtral's order: top-k of the logits, softmax of those
            top = sorted(range(self.E), key=lambda e: (-logits[e], e))[:k]
            m = max(logits[e] for e in top)
            ex = [math.exp(logits[e] - m) for e in top]
            p = [v / sum(ex) for v in ex]
        else:  # softmax over all experts, then the k largest probabilities
            m = max(logits)
            ex = [math.exp(z - m) for z in logits]
            tot = sum(ex)
            probs = [v / tot for v in ex]
            top = sorted(range(self.E), key=lambda e: (-probs[e], e))[:k]
            p = [probs[e] for e in top]
        if self.norm_topk_prob and moe_mistake != 'no-renorm':
            s = sum(p)
            p = [v / s for v in p]
        return list(zip(top, p))

    def moe(self, w, h, moe_mistake=None):
        """The sparse block's output for one token's normalised vector h."""
        out = [0.0] * self.D
        for e, pe in self.route(w, h, moe_mistake):
            if moe_mistake == 'expert-off-by-one':
                e = (e + 1) % self.E
            y = self.swiglu(*w['experts'][e], h)
            out = [a + pe * b for a, b in zip(out, y)]
        return out

    @staticmethod
    def rmsnorm(x, w, eps):
        ms = sum(v * v for v in x) / len(x)
        r = 1.0 / math.sqrt(ms + eps)  # epsilon inside the square root (QWEN3.md 2.1)
        return [wi * (xi * r) for xi, wi in zip(x, w)]

    @staticmethod
    def lab_norm(x, w, eps, use, ablate=(), layernorm=False, layer=None):
        """One RMSNorm call site of the RMSNorm lab: use is 'pre-norms' (pre-attention, pre-MLP),
        'qk-norm' or 'final-norm', in layer `layer` (-1: the final norm). Left out (an ablate item
        names the use, at every layer or this one): x unchanged. Otherwise RMSNorm with: layernorm,
        x - mean(x) first; 'norm-weight', w = 1; 'norm-gain', w = mean(w); 'norm-scale', no 1/rms,
        each where its item reaches this layer."""
        assert use in ABLATIONS[:3], use
        here = set()
        for item in ablate:
            name, layers = parse_ablation(item)
            if layers is None or layer in layers:
                here.add(name)
        if use in here:
            return list(x)
        if layernorm:
            mu = sum(x) / len(x)
            x = [v - mu for v in x]
        if 'norm-weight' in here:
            w = [1.0] * len(x)
        elif 'norm-gain' in here:
            w = [sum(w) / len(w)] * len(x)
        if 'norm-scale' in here:
            return [wi * xi for xi, wi in zip(x, w)]
        return Reference.rmsnorm(x, w, eps)

    def rope(self, x, pos, interleaved):
        """Rotates one head vector in place. Angles: float32 product pos * inv_freq (as HF)."""
        d = self.d
        half = d // 2
        for i in range(half):
            a = f32(pos * self.inv_freq[i])
            c, s = math.cos(a) * self.rope_gain, math.sin(a) * self.rope_gain
            if interleaved:  # the mistake: llama2.c's pairing
                j, k = 2 * i, 2 * i + 1
            else:            # rotate_half: element i with element i + d/2
                j, k = i, i + half
            x0, x1 = x[j], x[k]
            x[j] = x0 * c - x1 * s
            x[k] = x1 * c + x0 * s

    @staticmethod
    def f16(x):
        """x rounded to IEEE half precision (nearest, ties to even), as Python floats."""
        return list(struct.unpack('<%de' % len(x), struct.pack('<%de' % len(x), *x)))

    @staticmethod
    def q8(x, group=16):
        """x as `./run --kv-cache q8` stores a cached row (kernels.h, KV_Q8), dequantised: per group
        of 16, s = float16(float32(max|x| / 127)), q = round(float32(x / s)) to nearest even,
        clamped to [-127, 127], the value s * q (0 where s is 0). x is rounded to float32 first, as
        the engine holds it."""
        f32 = hf_model.f32_round
        out = []
        for g in range(0, len(x), group):
            grp = [f32(v) for v in x[g:g + group]]
            s = hf_model.f16_round(f32(max(abs(v) for v in grp) / 127.0))
            out.extend(s * max(-127, min(127, round(f32(v / s)))) if s else 0.0 for v in grp)
        return out

    def forward(self, tokens, eps=None, rope='half', skip_qk_norm=False, gqa='div', kv_f16=False, norms=None,
                scores=None, ablate=(), layernorm=False, head=None, yarn_mistake=None, moe_mistake=None, kv_q8=False,
                bf16_prefill=0, q8_decode_from=None):
        """Logits (a list of V floats) for every position of tokens (positions 0..len-1). ablate,
        layernorm (and eps): the RMSNorm lab's switches (Reference.lab_norm). norms: a
        list that receives (position, layer, site, vectors, weight) at every RMSNorm call site,
        what the vectors are before the norm (layer -1: the final norm; the sites as ./run
        --show-norms names them). scores: a list that receives (position, layer, query head,
        scores), the head's q.k/sqrt(d) for every key it attends to (positions 0..position).
        head='embedding': the mistake of an untied model's logits taken from the embedding.
        moe_mistake: a Qwen3-MoE routing mistake (the module's docstring)."""
        assert moe_mistake in (None, 'softmax-after-topk', 'no-renorm', 'expert-off-by-one'), moe_mistake
        saved = self.inv_freq, self.rope_gain
        self.inv_freq, self.rope_gain = self.frequencies(yarn_mistake)
        try:
            return self.run(tokens, eps, rope, skip_qk_norm, gqa, kv_f16, norms, scores, ablate, layernorm, head,
                            moe_mistake, kv_q8, bf16_prefill, q8_decode_from)
        finally:
            self.inv_freq, self.rope_gain = saved

    def run(self, tokens, eps, rope, skip_qk_norm, gqa, kv_f16, norms, scores, ablate, layernorm, head,
            moe_mistake=None, kv_q8=False, bf16_prefill=0, q8_decode_from=None):
        """forward() with the RoPE frequencies in place."""
        def see(pos, layer, site, vectors, weight):
            if norms is not None:
                norms.append((pos, layer, site, [list(v) for v in vectors], weight))
        assert rope in ('half', 'interleaved') and gqa in ('div', 'mod')
        eps = self.eps if eps is None else eps

        def norm(x, w, use, layer):
            return self.lab_norm(x, w, eps, use, ablate, layernorm, layer)
        D, H, K, d = self.D, self.H, self.K, self.d
        G = H // K
        scale = 1.0 / math.sqrt(d)
        kcache = [[] for _ in range(self.L)]  # per layer: list over positions of K lists of d
        vcache = [[] for _ in range(self.L)]
        bf = hf_model.bf16_round
        kcache_bf = [[] for _ in range(self.L)]  # the same rounded to bf16 (bf16_prefill)
        vcache_bf = [[] for _ in range(self.L)]
        out = []
        for pos, tok in enumerate(tokens):
            x = list(self.embed[tok])
            for l, w in enumerate(self.layers):
                see(pos, l, 'pre-attention', [x], w['in_norm'])
                h = norm(x, w['in_norm'], 'pre-norms', l)
                q = self.matvec(w['wq'], h)
                k = self.matvec(w['wk'], h)
                v = self.matvec(w['wv'], h)
                if self.bias:
                    q = [a + b for a, b in zip(q, w['bq'])]
                    k = [a + b for a, b in zip(k, w['bk'])]
                    v = [a + b for a, b in zip(v, w['bv'])]
                qh = [q[j * d:(j + 1) * d] for j in range(H)]
                kh = [k[g * d:(g + 1) * d] for g in range(K)]
                vh = [v[g * d:(g + 1) * d] for g in range(K)]
                if self.qk_norm and not skip_qk_norm:  # per head, before RoPE
                    see(pos, l, 'QK-Norm q', qh, w['q_norm'])
                    see(pos, l, 'QK-Norm k', kh, w['k_norm'])
                    qh = [norm(t, w['q_norm'], 'qk-norm', l) for t in qh]
                    kh = [norm(t, w['k_norm'], 'qk-norm', l) for t in kh]
                for t in qh + kh:
                    self.rope(t, pos, rope == 'interleaved')
                if kv_f16:
                    kh = [self.f16(t) for t in kh]
                    vh = [self.f16(t) for t in vh]
                if kv_q8:
                    kh = [self.q8(t) for t in kh]
                    vh = [self.q8(t) for t in vh]
                kcache[l].append(kh)  # keys after QK-norm and RoPE
                vcache[l].append(vh)
                pairs = pos < bf16_prefill
                if pairs:  # positions 0 .. bf16_prefill - 1, in order
                    kcache_bf[l].append([[bf(u) for u in t] for t in kh])
                    vcache_bf[l].append([[bf(u) for u in t] for t in vh])
                keys, values = (kcache_bf[l], vcache_bf[l]) if pairs else (kcache[l], vcache[l])
                int8_query = kv_q8 and q8_decode_from is not None and pos >= q8_decode_from
                att = []
                for j in range(H):
                    g = j // G if gqa == 'div' else j % K
                    qj = [bf(u) for u in qh[j]] if pairs else self.q8(qh[j]) if int8_query else qh[j]
                    s = [sum(map(mul, qj, kc[g])) * scale for kc in keys]
                    if scores is not None:  # q.k over the cache's values, as ./run --norms-json prints them
                        scores.append((pos, l, j, [sum(map(mul, qh[j], kc[g])) * scale for kc in kcache[l]]
                                       if pairs or int8_query else list(s)))
                    m = max(s)
                    e = [math.exp(z - m) for z in s]
                    tot = sum(e)
                    p = [(bf(a) if pairs else a) / tot for a in e]
                    # output dimension i: sum over the positions in order of p_t v_t[i]
                    att.extend(sum(map(mul, p, col)) for col in zip(*(vc[g] for vc in values)))
                x = [a + b for a, b in zip(x, self.matvec(w['wo'], att))]
                see(pos, l, 'pre-MLP', [x], w['post_norm'])
                h = norm(x, w['post_norm'], 'pre-norms', l)
                if 'router' in w:
                    mlp = self.moe(w, h, moe_mistake)
                else:
                    mlp = self.swiglu(w['gate'], w['up'], w['down'], h)
                x = [a + b for a, b in zip(x, mlp)]
            see(pos, -1, 'final norm', [x], self.norm)
            h = norm(x, self.norm, 'final-norm', -1)
            out.append(self.matvec(self.embed if head == 'embedding' else self.lm_head, h))
        return out


def rel_error(engine_rows, ref_rows):
    """max over positions of max_i |engine - ref| / max_i |ref| (relative to each row's largest
    reference magnitude)."""
    assert engine_rows and len(engine_rows) == len(ref_rows), 'no rows, or row counts differ'
    worst = 0.0
    for e, r in zip(engine_rows, ref_rows):
        assert len(e) == len(r), 'row lengths differ'
        scale = max(abs(v) for v in r)
        worst = max(worst, max(abs(a - b) for a, b in zip(e, r)) / scale)
    return worst


def argmax(row):
    return max(range(len(row)), key=row.__getitem__)


def log_softmax_loss(rows, targets):
    """Sum of -log softmax(row)[target] in fp64, and how many targets are their row's argmax
    (what `./run -m eval` reports, before the mean)."""
    nll, top1 = 0.0, 0
    for row, t in zip(rows, targets):
        m = max(row)
        lse = m + math.log(sum(math.exp(v - m) for v in row))
        nll += lse - row[t]
        top1 += argmax(row) == t
    return nll, top1


if __name__ == '__main__':
    # python3 tests/reference.py HF_DIR 1,2,3 : prints the argmax and max|logit| of each position.
    ref = Reference(sys.argv[1])
    ids = [int(t) for t in sys.argv[2].split(',')]
    for p, row in enumerate(ref.forward(ids)):
        print(p, argmax(row), max(abs(v) for v in row))
