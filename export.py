#!/usr/bin/env python3
"""export.py: a Hugging Face Qwen3 folder in, one checkpoint file out.

    python3 export.py path/to/Qwen3-0.6B qwen3-0.6b.bin [--dtype f32|bf16|q8|q4]

Reads config.json, generation_config.json, model.safetensors (or the shards listed in
model.safetensors.index.json; BF16, F16 or F32), tokenizer.json and tokenizer_config.json, and
writes the checkpoint format documented in model.h (THE CHECKPOINT FILE): a 256-byte header, the
tokenizer, then every tensor 64-byte aligned so the engine can memory-map the file.

Python 3 standard library only. Tensors are streamed in blocks of rows, so memory stays far below
the checkpoint size. The output is written under a temporary name and renamed at the end: a failed
export leaves no file behind, and one whose disk has too little free space for its files is
refused before it writes any (checkpoint_bytes knows their sizes).
"""
import argparse
import array
import collections
import json
import math
import os
import queue
import shutil
import signal
import struct
import sys
import threading
import time

MAGIC = b"QW3C"
VERSION = 5
ALIGN = 64
HEADER_FORMAT = "<4s13I f i d I 8i f f i 2I 4Q f I f f f I 6I 8I 16x"  # the FileHeader struct of model.h

# The loader's bounds on the header's fields and the tokenizer section: model.h's CHECKPOINT LIMITS,
# value for value (tests/test_export_input.py checks that the two tables are equal). A model outside
# them is refused here, so that no file is written that ./run would refuse.
LIMITS = {
    "MAX_DIM": 1 << 16,
    "MAX_HIDDEN": 1 << 18,
    "MAX_LAYERS": 1024,
    "MAX_HEADS": 1024,
    "MAX_HEAD_DIM": 1024,
    "MAX_VOCAB": 1 << 24,
    "MAX_POSITIONS": 1 << 24,
    "MAX_MATRIX_VALUES": 2147483647,
    "MAX_ROPE_THETA": 1e30,
    "MAX_ROPE_FACTOR": 1e6,
    "MAX_EOS_IDS": 8,
    "MAX_EXPERTS": 4096,
    "MAX_MLP_ONLY": 8,
    "MAX_TEMPERATURE": 100.0,
    "MAX_TOP_P": 1.0,
}
MAX_EOS = LIMITS["MAX_EOS_IDS"]
MAX_MLP_ONLY = LIMITS["MAX_MLP_ONLY"]

ARCH_QWEN3, ARCH_QWEN2, ARCH_LLAMA, ARCH_QWEN3_MOE = 1, 2, 3, 4
ARCHITECTURES = {"Qwen3ForCausalLM": ARCH_QWEN3, "Qwen3MoeForCausalLM": ARCH_QWEN3_MOE, "Qwen2ForCausalLM": ARCH_QWEN2,
                 "LlamaForCausalLM": ARCH_LLAMA}
FLAG_QK_NORM, FLAG_QKV_BIAS, FLAG_TIED_EMBED, FLAG_ROPE_YARN, FLAG_MOE = 1, 2, 4, 8, 16
FLAG_MOE_LAYER = 1 << 16  # a layer's, never the file's: a mixture-of-experts layer (model.h)
WEIGHT_F32, WEIGHT_BF16, WEIGHT_Q8, WEIGHT_Q4 = 0, 1, 2, 3
DTYPES = {"f32": WEIGHT_F32, "bf16": WEIGHT_BF16, "q8": WEIGHT_Q8, "q4": WEIGHT_Q4}
DEFAULT_GROUP = {WEIGHT_Q8: 64, WEIGHT_Q4: 32}  # q4: the groups of llama.cpp's q4_0
TOK_FLAG_NFC, TOK_FLAG_QWEN2_REGEX, TOK_FLAG_BYTE_LEVEL = 1, 2, 4

# The Split regex of Qwen2/Qwen3's tokenizer.json (QWEN3.md 4.3); tokenizer.c implements exactly this.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SAFETENSORS_DTYPES = {"BF16": 2, "F16": 2, "F32": 4}  # what we read; anything else is refused
BLOCK_BYTES = 16 << 20  # rows are converted in blocks of about this many source bytes
if sys.byteorder != "little":
    sys.exit("export.py: error: this script assumes a little-endian machine")


class ExportError(Exception):
    """A problem with the input, reported as one line and exit status 1."""


def read_json(path, what):
    """The JSON object in path (every file read here holds one at its top)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ExportError(f"{path}: not found ({what})")
    except OSError as e:
        raise ExportError(f"{path}: cannot read {what}: {e}")
    return parse_json(data, path, what)


def parse_json(data, path, what):
    """The JSON object in the bytes data, read from path."""
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError as e:  # also bad UTF-8 and integers too long to convert
        raise ExportError(f"{path}: cannot read {what}: {one_line(e)}")
    except RecursionError:
        raise ExportError(f"{path}: cannot read {what}: nested too deeply")
    if not isinstance(value, dict):
        raise ExportError(f"{path}: {what} is not a JSON object (found {type(value).__name__})")
    return value


def one_line(value, limit=80):
    """value as text for a one-line message: newlines escaped, cut to about limit characters."""
    text = str(value).replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + "..."


def show(value):
    """A JSON value as a message shows it: its repr, on one line and at most about 60 characters
    (an integer of thousands of digits is cut rather than printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**40:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return one_line(repr(value), 60)


def is_int(value):
    """A JSON integer (bool is an int to Python, never to JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def f32(x):
    """x rounded to the float32 the header stores (x must be within float32's range)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ---------------------------------------------------------------------------------------------
# config.json -> the header's config values
# ---------------------------------------------------------------------------------------------

YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}


def parse_yarn(path, scaling, field):
    """config.json's RoPE scaling as the engine applies it (QWEN3.md 2.9), or None without any: YaRN
    only, its factor and original context required, the rest at transformers' defaults
    (_compute_yarn_parameters; attention_factor 0.1 ln(factor) + 1)."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise ExportError(f"{path}: field '{field}' is {show(scaling)}, not an object")
    rtype = scaling.get("rope_type", scaling.get("type"))
    if rtype == "default":
        return None
    if rtype != "yarn":
        raise ExportError(f"{path}: field '{field}.rope_type' is {show(rtype)}; of the RoPE scalings only "
                          "yarn is supported (remove it to run at the native context)")
    for key in ("mscale", "mscale_all_dim"):
        if scaling.get(key) not in (None, 0):
            raise ExportError(f"{path}: field '{field}.{key}' is {show(scaling[key])}; YaRN's mscale "
                              "(DeepSeek's form) is not supported")
    top = LIMITS["MAX_ROPE_FACTOR"]
    y = {}
    for key, lo, required in (("factor", 1.0, True), ("beta_fast", 0.0, False), ("beta_slow", 0.0, False),
                              ("attention_factor", 0.0, False)):
        v = scaling.get(key)
        if v is None:
            if required:
                raise ExportError(f"{path}: field '{field}.factor' is missing: YaRN needs it")
            continue
        def fits(x):
            return (x >= 1.0 if lo == 1.0 else x > 0.0) and x < top
        # the header stores a float32, which the loader checks: 1e-50 would be 0 there
        if not is_number(v) or not fits(v) or not fits(f32(v)):
            raise ExportError(f"{path}: field '{field}.{key}' must be a number in "
                              f"{'[1' if lo == 1.0 else '(0'}, {top:g}) also as a float32, got {show(v)}")
        y[key] = float(v)
    original = scaling.get("original_max_position_embeddings")
    if original is None:
        raise ExportError(f"{path}: field '{field}.original_max_position_embeddings' is missing: YaRN needs the "
                          "context the model was trained at (Qwen3's model card gives 32768)")
    if not is_int(original) or not 1 <= original <= LIMITS["MAX_POSITIONS"]:
        raise ExportError(f"{path}: field '{field}.original_max_position_embeddings' must be an integer in "
                          f"1 .. {LIMITS['MAX_POSITIONS']}, got {show(original)}")
    y["original_max"] = original
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ExportError(f"{path}: field '{field}.truncate' must be true or false, got {show(truncate)}")
    y["truncate"] = truncate
    y.setdefault("beta_fast", YARN_DEFAULTS["beta_fast"])
    y.setdefault("beta_slow", YARN_DEFAULTS["beta_slow"])
    if "attention_factor" not in y:
        y["attention_factor"] = 0.1 * math.log(y["factor"]) + 1.0 if y["factor"] > 1 else 1.0
    return y


def yarn_context_warning(path, field, y, max_positions, given):
    """A warning where YaRN's factor times its original context is not max_position_embeddings (the
    model card's lines without the second one): the engine's -c stops at max_position_embeddings,
    and some transformers versions (huggingface/transformers#38224) take the factor as
    max_position_embeddings / original instead of the one given."""
    reach = y["factor"] * y["original_max"]
    if abs(reach - max_positions) < 0.5:
        return
    whole = reach == int(reach)
    positions = str(int(reach)) if whole else f"{reach:.1f}"
    have = f"is {max_positions}" if given else f"is absent ({max_positions}, transformers' default)"
    agree = (f"set max_position_embeddings to {positions} to agree" if whole else
             f"{positions} is no whole number of positions: give a factor that makes one")
    warn(f"{path}: {field}.factor {y['factor']:g} x original_max_position_embeddings {y['original_max']} = "
         f"{positions} positions, but max_position_embeddings {have}: ./run's -c goes up to {max_positions}, and "
         f"some transformers versions use the factor {max_positions}/{y['original_max']} = "
         f"{max_positions / y['original_max']:g} instead ({agree})")


def parse_moe(path, cfg, c):
    """Qwen3-MoE's block (QWEN3.md 8), as transformers' Qwen3MoeConfig gives it: the experts, the
    ones each token takes, their width, whether the k probabilities are renormalised, and which
    layers stay dense (mlp_only_layers, decoder_sparse_step)."""
    def count(key, lo, hi, default=None):
        v = cfg.get(key, default)
        if v is None:
            raise ExportError(f"{path}: missing field '{key}' (a Qwen3-MoE model needs it)")
        if not is_int(v) or not lo <= v <= hi:
            raise ExportError(f"{path}: field '{key}' must be an integer in {lo} .. {hi}, got {show(v)}")
        return v
    # transformers' newer Qwen3MoeConfig keeps num_experts under the name num_local_experts
    # (attribute_map), and a config it saves may hold either
    name = "num_experts"
    if cfg.get("num_local_experts") is not None:
        if cfg.get("num_experts") not in (None, cfg["num_local_experts"]):
            raise ExportError(f"{path}: fields 'num_experts' ({show(cfg['num_experts'])}) and 'num_local_experts' "
                              f"({show(cfg['num_local_experts'])}) disagree")
        name = "num_local_experts"
    m = {"n_experts": count(name, 1, LIMITS["MAX_EXPERTS"])}
    m["n_active"] = count("num_experts_per_tok", 1, m["n_experts"])
    m["hidden"] = count("moe_intermediate_size", 1, LIMITS["MAX_HIDDEN"])
    m["sparse_step"] = count("decoder_sparse_step", 1, c["n_layers"], 1)
    topk = cfg.get("norm_topk_prob", False)
    if not isinstance(topk, bool):
        raise ExportError(f"{path}: field 'norm_topk_prob' must be true or false, got {show(topk)}")
    m["norm_topk"] = topk
    only = cfg.get("mlp_only_layers") or []
    if (not isinstance(only, list) or len(only) > MAX_MLP_ONLY
            or not all(is_int(l) and 0 <= l < c["n_layers"] for l in only)):
        raise ExportError(f"{path}: field 'mlp_only_layers' must list at most {MAX_MLP_ONLY} layer numbers "
                          f"below {c['n_layers']}, got {show(only)}")
    m["mlp_only"] = sorted(set(only))
    if m["hidden"] * c["dim"] > LIMITS["MAX_MATRIX_VALUES"]:
        raise ExportError(f"{path}: moe_intermediate_size {m['hidden']} x hidden_size {c['dim']}: more than "
                          f"{LIMITS['MAX_MATRIX_VALUES']} values are not supported")
    return m


def layer_is_moe(c, l):
    """transformers' Qwen3MoeDecoderLayer: experts unless l is in mlp_only_layers, or (l + 1) is
    not a multiple of decoder_sparse_step (model.c, config_layer_is_moe)."""
    m = c.get("moe")
    return bool(m) and l not in m["mlp_only"] and (l + 1) % m["sparse_step"] == 0


def moe_fields(m):
    """The header's moe_* fields (model.h, FileHeader): zero without experts."""
    if not m:
        return (0,) * (6 + MAX_MLP_ONLY)
    only = m["mlp_only"] + [0] * (MAX_MLP_ONLY - len(m["mlp_only"]))
    return (m["n_experts"], m["n_active"], m["hidden"], m["sparse_step"], int(m["norm_topk"]), len(m["mlp_only"]),
            *only)


def yarn_fields(y):
    """The header's rope_* fields (model.h, FileHeader): zero without YaRN."""
    if not y:
        return (0.0, 0, 0.0, 0.0, 0.0, 0)
    return (y["factor"], y["original_max"], y["beta_fast"], y["beta_slow"], y["attention_factor"], int(y["truncate"]))


def parse_config(folder, cfg, gen):
    """config.json (and generation_config.json's end-of-sequence ids) -> the header's config values,
    every one checked against LIMITS and the loader's other rules (checkpoint.c checkpoint_config)."""
    path = os.path.join(folder, "config.json")
    gen_path = os.path.join(folder, "generation_config.json")

    def sized(key, value, hi):
        if not is_int(value) or not 1 <= value <= hi:
            raise ExportError(f"{path}: field '{key}' must be an integer in 1 .. {hi}, got {show(value)}")
        return value

    def need(key, hi):
        if key not in cfg:
            raise ExportError(f"{path}: missing field '{key}'")
        return sized(key, cfg[key], hi)

    def optional(key, hi, default):
        """A field that may be absent or null (then default)."""
        v = cfg.get(key)
        return default if v is None else sized(key, v, hi)

    archs = cfg.get("architectures")
    if archs is None:
        raise ExportError(f"{path}: no field 'architectures' (supported: " + ", ".join(ARCHITECTURES) + ")")
    if (not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str)
            or archs[0] not in ARCHITECTURES):
        raise ExportError(f"{path}: field 'architectures' is {show(archs)}; supported: "
                          + ", ".join(ARCHITECTURES))
    arch = ARCHITECTURES[archs[0]]
    keys = ("quantization_config", "shared_expert_intermediate_size")
    if arch != ARCH_QWEN3_MOE:  # newer transformers save Qwen3-MoE's num_experts as num_local_experts
        keys += ("num_experts", "num_local_experts", "moe_intermediate_size")
    for key in keys:
        if cfg.get(key):
            raise ExportError(f"{path}: field '{key}' = {show(cfg[key])} is not supported "
                              "(mixture-of-experts beyond Qwen3-MoE's, shared experts and pre-quantized "
                              "checkpoints are out of scope)")
    if cfg.get("use_sliding_window"):
        raise ExportError(f"{path}: field 'use_sliding_window' is {show(cfg['use_sliding_window'])}; "
                          "sliding-window attention is not supported")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ExportError(f"{path}: field 'hidden_act' is {show(act)}; only 'silu' is supported")
    if cfg.get("mlp_bias"):
        raise ExportError(f"{path}: field 'mlp_bias' is {show(cfg['mlp_bias'])}; MLP biases are "
                          "not supported")
    if cfg.get("attention_bias") and arch != ARCH_QWEN2:
        raise ExportError(f"{path}: field 'attention_bias' is {show(cfg['attention_bias'])}; only "
                          "Qwen2's q/k/v biases are supported")

    # RoPE: theta at top level (transformers 4.x) or inside rope_parameters (v5); scaling by YaRN
    # in rope_scaling (4.x) or rope_parameters (v5), nothing else.
    theta = cfg.get("rope_theta")
    theta_field = "rope_theta"
    rope_params = cfg.get("rope_parameters")
    scaling, scaling_field = None, "rope_scaling"
    if isinstance(rope_params, dict):
        if rope_params.get("rope_type", rope_params.get("type", "default")) != "default":
            scaling, scaling_field = rope_params, "rope_parameters"
        if "rope_theta" in rope_params:
            theta, theta_field = rope_params["rope_theta"], "rope_parameters.rope_theta"
    elif rope_params is not None:
        raise ExportError(f"{path}: field 'rope_parameters' is {show(rope_params)}, not an object")
    if cfg.get("rope_scaling") is not None:
        scaling, scaling_field = cfg["rope_scaling"], "rope_scaling"
    if theta is None:
        theta = 10000.0  # the transformers default for all three classes
    # The loader's test, 1 <= theta < MAX_ROPE_THETA, which NaN and infinity fail; compared before
    # float() so that a huge JSON integer cannot overflow it.
    max_theta = LIMITS["MAX_ROPE_THETA"]
    if not is_number(theta) or not 1 <= theta < max_theta:
        raise ExportError(f"{path}: field '{theta_field}' must be a number from 1 to below "
                          f"{max_theta:g}, got {show(theta)}")

    c = {
        "yarn": parse_yarn(path, scaling, scaling_field),
        "arch": arch,
        "dim": need("hidden_size", LIMITS["MAX_DIM"]),
        "hidden_dim": need("intermediate_size", LIMITS["MAX_HIDDEN"]),
        "n_layers": need("num_hidden_layers", LIMITS["MAX_LAYERS"]),
        "n_heads": need("num_attention_heads", LIMITS["MAX_HEADS"]),
        "vocab_size": need("vocab_size", LIMITS["MAX_VOCAB"]),
        "rope_theta": float(theta),
    }
    c["n_kv_heads"] = optional("num_key_value_heads", LIMITS["MAX_HEADS"], c["n_heads"])
    if cfg.get("head_dim") is None and c["dim"] < c["n_heads"]:
        raise ExportError(f"{path}: no field 'head_dim', and hidden_size {c['dim']} / "
                          f"num_attention_heads {c['n_heads']} is 0")
    c["head_dim"] = optional("head_dim", LIMITS["MAX_HEAD_DIM"], c["dim"] // c["n_heads"])
    if c["n_heads"] % c["n_kv_heads"]:
        raise ExportError(f"{path}: num_attention_heads {c['n_heads']} is not a multiple of "
                          f"num_key_value_heads {c['n_kv_heads']}")
    if c["head_dim"] % 2:
        raise ExportError(f"{path}: head_dim {c['head_dim']} is odd; RoPE needs an even head_dim")
    q_dim = c["n_heads"] * c["head_dim"]
    if q_dim > LIMITS["MAX_HIDDEN"]:
        raise ExportError(f"{path}: num_attention_heads {c['n_heads']} x head_dim {c['head_dim']} = "
                          f"{q_dim} is more than {LIMITS['MAX_HIDDEN']}")
    # The kernels index a matrix with int arithmetic; the loader bounds every matrix by the widest
    # width times the tallest height (model.c).
    widest = max(c["dim"], c["hidden_dim"], q_dim)
    tallest = max(c["vocab_size"], c["hidden_dim"], q_dim)
    if widest * tallest > LIMITS["MAX_MATRIX_VALUES"]:
        raise ExportError(f"{path}: matrices of up to {widest} columns and {tallest} rows "
                          f"(hidden_size, intermediate_size, vocab_size, num_attention_heads x "
                          f"head_dim): more than {LIMITS['MAX_MATRIX_VALUES']} values are not supported")
    c["max_seq_len"] = optional("max_position_embeddings", LIMITS["MAX_POSITIONS"], 32768)
    if c["yarn"]:
        yarn_context_warning(path, scaling_field, c["yarn"], c["max_seq_len"],
                             cfg.get("max_position_embeddings") is not None)
    c["moe"] = parse_moe(path, cfg, c) if arch == ARCH_QWEN3_MOE else None
    eps = cfg.get("rms_norm_eps", 1e-6)
    # The header holds a float32, and the loader wants that float32 inside (0, 1): a value such as
    # 1e-50 rounds to 0.
    if not is_number(eps) or not 0 < eps < 1 or not 0 < f32(eps) < 1:
        why = "" if not is_number(eps) or not 0 < eps < 1 else f" (as a float32, {f32(eps):g})"
        raise ExportError(f"{path}: field 'rms_norm_eps' must be in (0, 1), got {show(eps)}{why}")
    c["rms_norm_eps"] = float(eps)
    # transformers' Qwen3/Qwen2/Llama configs all default tie_word_embeddings to False.
    tied = cfg.get("tie_word_embeddings", False)
    if tied is None:
        tied = False
    if not isinstance(tied, bool):
        raise ExportError(f"{path}: field 'tie_word_embeddings' must be true or false, got {show(tied)}")
    c["tied"] = tied

    # End-of-sequence ids: generation_config's and config's, in order, without repeats. Each must
    # be a token of the model (an id beyond the vocabulary can never be generated).
    eos = []
    for source, where in ((gen.get("eos_token_id"), gen_path), (cfg.get("eos_token_id"), path)):
        for e in (source if isinstance(source, list) else [source]):
            if e is None and not isinstance(source, list):
                continue
            if not is_int(e) or not 0 <= e < c["vocab_size"]:
                raise ExportError(f"{where}: field 'eos_token_id' has {show(e)}, not a token id "
                                  f"(0 .. {c['vocab_size'] - 1}, vocab_size)")
            if e not in eos:
                eos.append(e)
    if len(eos) > MAX_EOS:
        raise ExportError(f"{path}: {len(eos)} different end-of-sequence ids (eos_token_id of "
                          f"config.json and generation_config.json); the checkpoint holds at most {MAX_EOS}")
    c["eos_ids"] = eos
    c.update(sampling_defaults(gen_path, gen))
    return c


def sampling_defaults(path, gen):
    """generation_config's temperature, top_p and top_k for the header, 0 where absent. A value
    that ./run could not use (the ranges model.c checks) is left out with a warning rather than
    failing the export: the defaults are advice, and -t / -p / -k override them. With do_sample
    false transformers decodes greedily and ignores the three; the header has no field for that,
    so they are left out and the warning says how to get greedy decoding."""
    out = {"temperature": 0.0, "top_p": 0.0, "top_k": 0}
    if gen.get("do_sample") is False:
        if any(gen.get(k) is not None for k in out):
            warn(f"{path}: do_sample is false (greedy decoding in transformers), so its "
                 "temperature / top_p / top_k are not stored; run with -t 0 for greedy decoding")
        return out
    ranges = {"temperature": (0.0, LIMITS["MAX_TEMPERATURE"]), "top_p": (0.0, LIMITS["MAX_TOP_P"]),
              "top_k": (0, 2**31 - 1)}
    for key, (lo, hi) in ranges.items():
        v = gen.get(key)
        if v is None:
            continue
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi
        if key == "top_k":
            ok = ok and v == int(v)
        if ok:
            out[key] = int(v) if key == "top_k" else float(v)
        else:
            what = f"outside {lo}..{hi}" if is_number(v) else "not a number"
            warn(f"{path}: field '{key}' is {show(v)}, {what}: not stored as a default")
    return out


# ---------------------------------------------------------------------------------------------
# safetensors: one name -> (file, offset, dtype, shape) table over every shard (QWEN3.md 3.1-3.2)
# ---------------------------------------------------------------------------------------------

class Tensor:
    def __init__(self, path, offset, dtype, shape, nbytes):
        self.path, self.offset, self.dtype, self.shape, self.nbytes = path, offset, dtype, shape, nbytes


def read_safetensors_header(path, table):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ExportError(f"{path}: too short for a safetensors file")
            (n,) = struct.unpack("<Q", raw)
            if n > 100_000_000:
                raise ExportError(f"{path}: bad safetensors header length {n} (not a safetensors file?)")
            if 8 + n > size:
                raise ExportError(f"{path}: truncated: its header alone needs {8 + n} bytes, the file "
                                  f"has {size}")
            data = f.read(n)
    except FileNotFoundError:
        raise ExportError(f"{path}: not found")
    except (OSError, ValueError) as e:  # ValueError: a path with a NUL byte (from an index)
        raise ExportError(f"{path}: cannot read the safetensors header: {one_line(e)}")
    header = parse_json(data, path, "the safetensors header")
    base = 8 + n
    mine = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if name in table:
            raise ExportError(f"{path}: tensor {show(name)} is also in {table[name].path}")
        parse_tensor_entry(path, name, info, base, size, table)
        mine.append(name)
    # each tensor's bytes its own, as the safetensors library requires (one shared would be two
    # tensors with one value)
    spans = sorted((table[m].offset, table[m].offset + table[m].nbytes, m) for m in mine if table[m].nbytes)
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise ExportError(f"{path}: tensors {show(a)} and {show(b)} overlap in the file (their data_offsets)")


def parse_tensor_entry(path, name, info, base, size, table):
    """One entry of a safetensors header: {"dtype": str, "shape": [int, ...], "data_offsets":
    [begin, end]}, offsets relative to the data after the header, inside the file."""
    def bad(problem):
        return ExportError(f"{path}: tensor {show(name)} has {problem} in the safetensors header")

    if not isinstance(info, dict):
        raise bad(f"the entry {show(info)}, not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad(f"dtype {show(dtype)}, not a string")
    if not isinstance(shape, list) or not all(is_int(s) and s >= 0 for s in shape):
        raise bad(f"shape {show(shape)}, not a list of sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise bad(f"data_offsets {show(offsets)}, not [begin, end] with 0 <= begin <= end")
    begin, end = offsets
    count = 1
    for s in shape:
        count *= s
    width = SAFETENSORS_DTYPES.get(dtype)
    if width is not None and end - begin != count * width:
        raise ExportError(f"{path}: tensor {show(name)} has data_offsets [{show(begin)}, {show(end)}] "
                          f"that do not fit its shape {show(shape)} and dtype {dtype}")
    if base + end > size:
        raise ExportError(f"{path}: truncated: tensor {show(name)} ends at byte {show(base + end)}, "
                          f"the file has {size}")
    table[name] = Tensor(path, base + begin, dtype, list(shape), end - begin)


def load_tensor_table(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    single = os.path.join(folder, "model.safetensors")
    table = {}
    if os.path.exists(index):
        weight_map = read_json(index, "the shard index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise ExportError(f"{index}: no 'weight_map' object")
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or any(ch < " " or ch == "\x7f" for ch in shard):
                raise ExportError(f"{index}: tensor {show(name)} is in the shard {show(shard)}, not "
                                  "a file name")
        for shard in sorted(set(weight_map.values())):
            read_safetensors_header(os.path.join(folder, shard), table)
        for name, shard in weight_map.items():
            if name not in table:
                raise ExportError(f"{index}: tensor {show(name)} is listed in {shard} but not found "
                                  "there")
            if table[name].path != os.path.join(folder, shard):
                raise ExportError(f"{index}: tensor {show(name)} is listed in {shard} but found in "
                                  f"{os.path.basename(table[name].path)}")
    elif os.path.exists(single):
        read_safetensors_header(single, table)
    else:
        raise ExportError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    return table


# ---------------------------------------------------------------------------------------------
# Conversion of row blocks to the stored format
# ---------------------------------------------------------------------------------------------

def to_f32_bytes(raw, dtype):
    """Raw little-endian BF16/F16/F32 bytes -> float32 bytes."""
    if dtype == "F32":
        return raw
    if dtype == "BF16":  # bf16 is the top half of a float32: put two zero bytes below each value
        out = bytearray(2 * len(raw))
        out[2::4] = raw[0::2]
        out[3::4] = raw[1::2]
        return bytes(out)
    n = len(raw) // 2
    return array.array("f", struct.unpack(f"<{n}e", raw)).tobytes()


def f32_to_bf16_bytes(raw):
    """float32 bytes -> bfloat16 bytes, round to nearest even (as torch's .to(bfloat16))."""
    bits = array.array("I", raw)
    out = array.array("H", bytes(2 * len(bits)))
    for i, b in enumerate(bits):
        if (b & 0x7F800000) == 0x7F800000 and (b & 0x7FFFFF):  # NaN stays a (quiet) NaN
            out[i] = (b >> 16) | 0x40
        else:
            out[i] = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    return out.tobytes()


class Unstorable(Exception):
    """A group of weights that q8 or q4 cannot store: the index of its first value, and why."""

    def __init__(self, at, why):
        super().__init__(why)
        self.at, self.why = at, why


def nonfinite_group(vals, group_size, dtype):
    """Raises Unstorable at the first group of vals that holds a NaN or an infinity (their sum is
    not finite: float32 values cannot overflow a double's sum)."""
    for g in range(len(vals) // group_size):
        if not math.isfinite(sum(vals[g * group_size:(g + 1) * group_size])):
            raise Unstorable(g * group_size, f"holds a NaN or an infinity, which {dtype} cannot store")


def quantize_q8(raw_f32, group_size):
    """float32 bytes -> (int8 bytes, float16 scale bytes): per group s = max|w| / 127 rounded to
    float16, q = round(w / s) clamped to [-127, 127] (q from the rounded s, so each weight is the
    nearest multiple of the stored scale; an all-zero group, or one whose s rounds to 0, is 0)."""
    vals = array.array("f", raw_f32)
    nonfinite_group(vals, group_size, "q8")
    n_groups = len(vals) // group_size
    q = array.array("b", bytes(len(vals)))
    maxes = array.array("d", bytes(8 * n_groups))
    for g in range(n_groups):
        block = vals[g * group_size:(g + 1) * group_size]
        maxes[g] = max(max(block), -min(block))
    try:
        halves = struct.pack(f"<{n_groups}e", *(m / 127.0 for m in maxes))
    except OverflowError:
        g = next(g for g, m in enumerate(maxes) if m / 127.0 >= 65520.0)
        raise Unstorable(g * group_size, "has a weight too large for q8's float16 scales (|w| above 8,300,000)") from None
    for g, s in enumerate(struct.unpack(f"<{n_groups}e", halves)):
        if s > 0:
            lo = g * group_size
            inv = 1.0 / s
            q[lo:lo + group_size] = array.array(
                "b", [max(-127, min(127, round(v * inv))) for v in vals[lo:lo + group_size]])
    return q.tobytes(), halves


def quantize_q4(raw_f32, group_size):
    """float32 bytes -> (q + 8 per value as bytes, float16 scale bytes). Per group, m is the value
    of largest magnitude, q = round(w * -8 / m) clamped to [-8, 7] (m itself becomes -8, so the
    whole range is used) and s = m / -8 rounded to float16, as in llama.cpp's q4_0."""
    vals = array.array("f", raw_f32)
    nonfinite_group(vals, group_size, "q4")
    nib = bytearray(len(vals))
    scales = array.array("f", bytes(4 * (len(vals) // group_size)))
    for g in range(len(scales)):
        lo = g * group_size
        block = vals[lo:lo + group_size]
        hi, low = max(block), min(block)
        m = hi if hi > -low else low
        if m == 0:
            nib[lo:lo + group_size] = bytes([8] * group_size)
        else:
            scales[g] = m / -8.0
            inv = -8.0 / m
            nib[lo:lo + group_size] = bytes(min(15, round(v * inv) + 8) for v in block)
    try:
        halves = struct.pack(f"<{len(scales)}e", *scales)
    except OverflowError:
        g = next(g for g, m in enumerate(scales) if abs(m) >= 65520.0)
        raise Unstorable(g * group_size, "has a weight too large for q4's float16 scales (|w| above 524,000)") from None
    return bytes(nib), halves


QUANT_BLOCK_ROWS = {WEIGHT_Q8: 4, WEIGHT_Q4: 8}  # rows per block (model.h)


def quant_row_blocks(raw_f32, cols, group_size, wtype):
    """float32 bytes of whole rows -> the q8 or q4 row blocks of model.h (the last block padded
    with zero rows). q8, blocks of 4 rows: their scales s[4][G], then per group the four rows'
    values. q4, blocks of 8 rows: per group the 8 float16 scales, then per quarter v and row i the
    4 bytes holding columns 4v + k (low nibble) and 16 + 4v + k (high nibble), k = 0 .. 3."""
    rows = len(raw_f32) // (4 * cols)
    br = QUANT_BLOCK_ROWS[wtype]
    pad = -rows % br
    G = cols // group_size
    out = []
    if wtype == WEIGHT_Q8:
        q, s = quantize_q8(raw_f32 + bytes(4 * cols * pad), group_size)
        for b in range(0, rows + pad, br):
            out.append(s[2 * b * G:2 * (b + br) * G])  # float16 scales
            for g in range(0, cols, group_size):
                for i in range(br):
                    at = (b + i) * cols + g
                    out.append(q[at:at + group_size])
        return b"".join(out)
    # q4, in 32-bit words: a group is 36 (4 words of 8 scales, then word 4 + 8v + i = row i's
    # columns 4v .. 4v+3); row i's columns 32g + 4v .. are its word 8g + v (low nibbles) and
    # 8g + 4 + v (high). Each nibble is < 16, so shifting the high plane left by 4 bits as one
    # integer moves every byte's nibble up within its byte, and OR merges the two planes (the
    # high plane is zero where the scales are).
    nib, s = quantize_q4(raw_f32 + bytes(4 * cols * pad), group_size)
    nw, sh = memoryview(nib).cast("I"), memoryview(s).cast("H")
    row_words = cols // 4
    for b in range(0, rows + pad, br):
        low, high = array.array("I", bytes(144 * G)), array.array("I", bytes(144 * G))
        low_halves = array.array("H", low.tobytes())  # the scales, as 16-bit halves of the words
        for i in range(br):
            low_halves[i::72] = array.array("H", sh[(b + i) * G:(b + i + 1) * G])
        low = array.array("I", low_halves.tobytes())
        for i in range(br):
            row = nw[(b + i) * row_words:(b + i + 1) * row_words]
            for v in range(4):
                low[4 + 8 * v + i::36] = array.array("I", row[v::8])
                high[4 + 8 * v + i::36] = array.array("I", row[4 + v::8])
        merged = int.from_bytes(low.tobytes(), "little") | int.from_bytes(high.tobytes(), "little") << 4
        out.append(merged.to_bytes(144 * G, "little"))
    return b"".join(out)


# ---------------------------------------------------------------------------------------------
# Tokenizer section (layout: model.h)
# ---------------------------------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte-level alphabet (QWEN3.md 4.4): byte -> code point."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = b
        else:
            table[b] = 256 + extra
            extra += 1
    return table


def lp(data):
    """A length-prefixed byte string: u32 length, then the bytes."""
    return struct.pack("<I", len(data)) + data


def utf8(text, path, what):
    """text as UTF-8 bytes; a JSON string may hold a lone surrogate (\\ud800), which has none."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ExportError(f"{path}: {what} {show(text)} is not valid Unicode (a lone surrogate)")


def tokenizer_section(tok_path, tok_config_path, vocab_size):
    """Returns the tokenizer section bytes, or an empty tokenizer (with a warning) when there is no
    byte-level BPE tokenizer.json. Every id it holds is below vocab_size, the model's vocabulary:
    the engine refuses a token id from the tokenizer that the model has no row for."""
    empty = b"QTOK" + struct.pack("<4I", 0, 0, 0, 0) + lp(b"") + lp(b"")
    if not os.path.exists(tok_path):
        warn(f"{tok_path} not found: the checkpoint gets no tokenizer (use --prompt-ids)")
        return empty
    tok = read_json(tok_path, "the tokenizer")

    def field(obj, key, kind, default, name=None):
        """obj[key] when it has the JSON type kind, default when absent or null, else an error."""
        v = obj.get(key)
        if v is None:
            return default
        if not isinstance(v, kind):
            raise ExportError(f"{tok_path}: field '{name or key}' is {show(v)}, not "
                              f"{'an object' if kind is dict else 'a list' if kind is list else 'a string'}")
        return v

    model = field(tok, "model", dict, {})
    if model.get("type") != "BPE":
        raise ExportError(f"{tok_path}: model.type is {show(model.get('type'))}; only BPE is supported")
    byte_of = {cp: b for b, cp in bytes_to_unicode().items()}
    vocab = field(model, "vocab", dict, {}, "model.vocab")
    n_vocab = len(vocab)
    tokens = [None] * n_vocab
    for s, i in vocab.items():
        if not is_int(i) or not 0 <= i < n_vocab or tokens[i] is not None:
            raise ExportError(f"{tok_path}: vocabulary ids are not exactly 0..{n_vocab - 1} "
                              f"(token {show(s)} has id {show(i)})")
        try:
            tokens[i] = bytes(byte_of[ord(ch)] for ch in s)
        except KeyError:
            warn(f"{tok_path}: token {show(s)} is not byte-level BPE: the checkpoint gets no "
                 "tokenizer (use --prompt-ids)")
            return empty
    single = {t[0] for t in tokens if len(t) == 1}
    if len(single) < 256:  # then some text has no tokens (an empty vocabulary: every text)
        first = min(set(range(256)) - single)
        warn(f"{tok_path}: the vocabulary lacks {256 - len(single)} of the 256 single-byte tokens with which "
             f"byte-level BPE encodes any text (byte 0x{first:02x} first): the checkpoint gets no tokenizer "
             "(use --prompt-ids)")
        return empty
    if n_vocab > vocab_size:
        raise ExportError(f"{tok_path}: the vocabulary has {n_vocab} tokens, more than the model's "
                          f"vocab_size {vocab_size} (config.json)")

    merges = []
    for rank, m in enumerate(field(model, "merges", list, [], "model.merges")):
        # "left right" (the older format) or ["left", "right"]
        pair = m.split(" ", 1) if isinstance(m, str) else m
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise ExportError(f"{tok_path}: merge {rank} is {show(m)}, not \"left right\" or "
                              "[left, right]")
        left, right = pair
        a, b, ab = vocab.get(left), vocab.get(right), vocab.get(left + right)
        if a is None or b is None or ab is None:
            raise ExportError(f"{tok_path}: merge {rank} ({show(left)}, {show(right)}) uses or makes "
                              "a token that is not in the vocabulary")
        merges.append(struct.pack("<3I", a, b, ab))

    added = []
    for k, t in enumerate(field(tok, "added_tokens", list, [])):
        if not isinstance(t, dict):
            raise ExportError(f"{tok_path}: added_tokens[{k}] is {show(t)}, not an object")
        tid, content = t.get("id"), t.get("content")
        if not is_int(tid) or not 0 <= tid < vocab_size:
            raise ExportError(f"{tok_path}: added_tokens[{k}] ({show(content)}) has id {show(tid)}, "
                              f"not a token id of the model (0 .. {vocab_size - 1}, vocab_size)")
        if not isinstance(content, str):
            raise ExportError(f"{tok_path}: added_tokens[{k}] (id {tid}) has content {show(content)}, "
                              "not a string")
        added.append(struct.pack("<2I", tid, 1 if t.get("special") else 0)
                     + lp(utf8(content, tok_path, f"added_tokens[{k}].content")))

    flags, regex = 0, ""
    norm = field(tok, "normalizer", dict, {})
    if norm.get("type") == "NFC":
        flags |= TOK_FLAG_NFC
    pre = field(tok, "pre_tokenizer", dict, {})
    parts = [pre]
    if pre.get("type") == "Sequence":
        parts = field(pre, "pretokenizers", list, [], "pre_tokenizer.pretokenizers")
    for k, p in enumerate(parts):
        if not isinstance(p, dict):
            raise ExportError(f"{tok_path}: pre_tokenizer.pretokenizers[{k}] is {show(p)}, not an object")
        if p.get("type") == "Split":
            pattern = field(p, "pattern", dict, {}, "pre_tokenizer's Split pattern")
            regex = field(pattern, "Regex", str, "", "pre_tokenizer's Split pattern.Regex")
        if p.get("type") == "ByteLevel":
            flags |= TOK_FLAG_BYTE_LEVEL
    if regex == QWEN2_REGEX and flags & TOK_FLAG_BYTE_LEVEL:
        flags |= TOK_FLAG_QWEN2_REGEX
    else:
        warn(f"{tok_path}: the pre-tokenizer is not Qwen2/Qwen3's; text encoding in the engine "
             "may differ from the reference (--prompt-ids is exact)")

    # The chat template is advice for chat mode: one of another form is left out, not an error.
    template = ""
    if os.path.exists(tok_config_path):
        t = read_json(tok_config_path, "the tokenizer config").get("chat_template") or ""
        if isinstance(t, list):  # a list of named templates: take the default one
            t = next((x.get("template", "") for x in t
                      if isinstance(x, dict) and x.get("name") == "default"), "")
        template = t if isinstance(t, str) else ""

    out = [b"QTOK", struct.pack("<4I", n_vocab, len(merges), len(added), flags),
           lp(utf8(regex, tok_path, "the pre-tokenizer's Split regex"))]
    out += [lp(t) for t in tokens]
    out += merges + added
    out.append(lp(utf8(template, tok_config_path, "the chat template")))
    return b"".join(out)


# ---------------------------------------------------------------------------------------------
# The export
# ---------------------------------------------------------------------------------------------

def warn(msg):
    print(f"export.py: warning: {msg}", file=sys.stderr)


# Every tensor of the checkpoint in file order, as model.c's TENSORS names them (model.h, TensorInfo;
# tests/test_tensor_table.py checks that the two tables and docs/checkpoint.md agree): the engine's
# name, the Hugging Face name (per layer after "model.layers.{l}.", {e}: the expert), rows, cols
# (None: a float32 vector), where (once, in every layer, in every layer once per expert), the
# flags it needs, the flags with which it is absent, and whether a matrix stays float32.
GLOBAL, LAYER, EXPERT = "global", "layer", "expert"
TENSORS = [
    ("embed_tokens", "model.embed_tokens.weight", "vocab_size", "dim", GLOBAL, 0, 0, False),
    ("input_layernorm", "input_layernorm.weight", "dim", None, LAYER, 0, 0, False),
    ("q_proj", "self_attn.q_proj.weight", "n_heads*head_dim", "dim", LAYER, 0, 0, False),
    ("q_bias", "self_attn.q_proj.bias", "n_heads*head_dim", None, LAYER, FLAG_QKV_BIAS, 0, False),
    ("k_proj", "self_attn.k_proj.weight", "n_kv_heads*head_dim", "dim", LAYER, 0, 0, False),
    ("k_bias", "self_attn.k_proj.bias", "n_kv_heads*head_dim", None, LAYER, FLAG_QKV_BIAS, 0, False),
    ("v_proj", "self_attn.v_proj.weight", "n_kv_heads*head_dim", "dim", LAYER, 0, 0, False),
    ("v_bias", "self_attn.v_proj.bias", "n_kv_heads*head_dim", None, LAYER, FLAG_QKV_BIAS, 0, False),
    ("q_norm", "self_attn.q_norm.weight", "head_dim", None, LAYER, FLAG_QK_NORM, 0, False),
    ("k_norm", "self_attn.k_norm.weight", "head_dim", None, LAYER, FLAG_QK_NORM, 0, False),
    ("o_proj", "self_attn.o_proj.weight", "dim", "n_heads*head_dim", LAYER, 0, 0, False),
    ("post_attention_layernorm", "post_attention_layernorm.weight", "dim", None, LAYER, 0, 0, False),
    ("gate_proj", "mlp.gate_proj.weight", "hidden_dim", "dim", LAYER, 0, FLAG_MOE_LAYER, False),
    ("up_proj", "mlp.up_proj.weight", "hidden_dim", "dim", LAYER, 0, FLAG_MOE_LAYER, False),
    ("down_proj", "mlp.down_proj.weight", "dim", "hidden_dim", LAYER, 0, FLAG_MOE_LAYER, False),
    ("router", "mlp.gate.weight", "n_experts", "dim", LAYER, FLAG_MOE_LAYER, 0, True),
    ("expert_gate", "mlp.experts.{e}.gate_proj.weight", "moe_hidden_dim", "dim", EXPERT, FLAG_MOE_LAYER, 0, False),
    ("expert_up", "mlp.experts.{e}.up_proj.weight", "moe_hidden_dim", "dim", EXPERT, FLAG_MOE_LAYER, 0, False),
    ("expert_down", "mlp.experts.{e}.down_proj.weight", "dim", "moe_hidden_dim", EXPERT, FLAG_MOE_LAYER, 0, False),
    ("norm", "model.norm.weight", "dim", None, GLOBAL, 0, 0, False),
    ("lm_head", "lm_head.weight", "vocab_size", "dim", GLOBAL, 0, FLAG_TIED_EMBED, False),
]


def hf_name(engine_name, layer=None):
    """The Hugging Face name of the tensor TENSORS calls engine_name (in layer `layer`)."""
    name = next(t[1] for t in TENSORS if t[0] == engine_name)
    return name if layer is None else f"model.layers.{layer}.{name}"


def tensor_plan(c):
    """(name in the HF folder, shape, is_matrix) in file order (TENSORS); a float32 matrix (the
    router) goes as a vector, which export writes in float32."""
    m = c.get("moe") or {}
    size = {"dim": c["dim"], "hidden_dim": c["hidden_dim"], "vocab_size": c["vocab_size"],
            "head_dim": c["head_dim"], "n_heads*head_dim": c["n_heads"] * c["head_dim"],
            "n_kv_heads*head_dim": c["n_kv_heads"] * c["head_dim"], "n_experts": m.get("n_experts", 0),
            "moe_hidden_dim": m.get("hidden", 0)}

    def stored(t, flags):
        return (flags & t[5]) == t[5] and not flags & t[6]

    def entry(t, prefix="", e=None):
        shape = [size[t[2]]] + ([size[t[3]]] if t[3] else [])
        name = t[1].format(e=e) if e is not None else t[1]
        return (prefix + name, shape, t[3] is not None and not t[7])

    n_first = next(i for i, t in enumerate(TENSORS) if t[4] != GLOBAL)  # the globals before the layers
    layer = [t for t in TENSORS[n_first:] if t[4] != GLOBAL]
    plan = [entry(t) for t in TENSORS[:n_first] if stored(t, c["flags"])]
    for l in range(c["n_layers"]):
        flags, p = c["flags"] | (FLAG_MOE_LAYER if layer_is_moe(c, l) else 0), f"model.layers.{l}."
        plan += [entry(t, p) for t in layer if t[4] == LAYER and stored(t, flags)]
        experts = [t for t in layer if t[4] == EXPERT and stored(t, flags)]
        plan += [entry(t, p, e) for e in range(size["n_experts"] if experts else 0) for t in experts]
    return plan + [entry(t) for t in TENSORS[n_first:] if t[4] == GLOBAL and stored(t, c["flags"])]


def choose_group_size(c, requested, wtype, path="config.json"):
    """q8 groups: `requested` when it divides every input width, else the largest power of two
    <= requested (at least 8) that does. q4 groups are always 32 columns (model.h). path: the
    config the widths come from, for the message."""
    named = {"hidden_size": c["dim"], "intermediate_size": c["hidden_dim"],
             "num_attention_heads x head_dim": c["n_heads"] * c["head_dim"]}
    if c.get("moe"):
        named["moe_intermediate_size"] = c["moe"]["hidden"]
    widths = list(named.values())
    if wtype == WEIGHT_Q4:
        if requested != 32:
            raise ExportError(f"q4 groups are 32 columns (got --group-size {requested})")
        bad = ", ".join(f"{k} {w}" for k, w in named.items() if w % 32)
        if bad:
            raise ExportError(f"{path}: q4 needs every input width to be a multiple of 32 "
                              f"(its groups are 32 columns): {bad}; export q8 instead")
        return 32
    if requested < 8:
        raise ExportError(f"q8 needs a group size of at least 8 (got {requested})")
    g = requested
    while g >= 8:
        if all(w % g == 0 for w in widths):
            return g
        g //= 2
    raise ExportError(f"{path}: q8 needs every input width to be a multiple of 8: "
                      + ", ".join(f"{k} {w}" for k, w in named.items()))


MAX_JOBS = 16  # default worker processes at most


def available_cpus():
    """CPUs this process may run on (the affinity mask where there is one, e.g. in a container)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


PAD = "pad"  # in the stream of blocks: align the file before the next tensor


def plan_blocks(plan, table, files, wtype, gs):
    """The export as a stream: PAD before each tensor, then its rows in blocks, each as
    (raw source bytes, source dtype, columns, stored type, group size, tensor name, first row)."""
    for name, shape, is_matrix in plan:
        t = table[name]
        if t.path not in files:
            files[t.path] = open(t.path, "rb")
        src = files[t.path]
        src.seek(t.offset)
        width = SAFETENSORS_DTYPES[t.dtype]
        rows = shape[0] if len(shape) == 2 else 1
        cols = shape[-1]
        stored = wtype if is_matrix else WEIGHT_F32  # norms and biases stay f32
        if stored in (WEIGHT_Q8, WEIGHT_Q4):  # whole row blocks of 4 or 8 rows (model.h)
            rows_per_block = max(1, (BLOCK_BYTES // 4) // (cols * width))
            rows_per_block += -rows_per_block % QUANT_BLOCK_ROWS[stored]
        else:
            rows_per_block = max(1, BLOCK_BYTES // (cols * width))
        yield PAD
        for r in range(0, rows, rows_per_block):
            raw = src.read(min(rows_per_block, rows - r) * cols * width)
            yield raw, t.dtype, cols, stored, gs, name, r


def convert_block(block):
    """One block of plan_blocks -> (stored bytes, source bytes, tensor name)."""
    raw, dtype, cols, stored, gs, name, first = block
    if stored == WEIGHT_F32:
        data = to_f32_bytes(raw, dtype)
    elif stored == WEIGHT_BF16:
        data = raw if dtype == "BF16" else f32_to_bf16_bytes(to_f32_bytes(raw, dtype))
    else:
        try:
            data = quant_row_blocks(to_f32_bytes(raw, dtype), cols, gs, stored)
        except Unstorable as e:  # as ./run -m quantize says it
            raise ExportError(f"tensor {name}: row {first + e.at // cols} {e.why}") from None
    return data, len(raw), name


def worker_signals():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # Pool.terminate() ends a worker with SIGTERM
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal too


def converted_blocks(blocks, workers):
    """convert_block over the stream, in order, on `workers` processes (in this one if 1), with at
    most 2 blocks per worker in flight, so memory stays bounded whatever the checkpoint size."""
    if workers <= 1:
        for block in blocks:
            yield block if block is PAD else convert_block(block)
        return
    # multiprocessing, subprocess and tempfile are imported where they are used, so that an export
    # that needs none of them (a small f32 or bf16 one) does not pay for importing them
    import multiprocessing
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                      else None)
    pool = ctx.Pool(workers, initializer=worker_signals)
    pending = collections.deque()

    def oldest():
        item = pending.popleft()
        return item if item is PAD else item.get()

    try:
        for block in blocks:
            pending.append(block if block is PAD else pool.apply_async(convert_block, (block,)))
            if len(pending) > 2 * workers:
                yield oldest()
        while pending:
            yield oldest()
    finally:
        pool.terminate()
        pool.join()


def quantized_in_c(blocks, run, wtype, gs, jobs):
    """converted_blocks with the q8 or q4 matrices' blocks quantised by `./run -m quantize --stream`
    (cli/quantize.c says how: frames of rows in, their row blocks out, the same bytes as
    quant_row_blocks); the rest converted here. A thread reads the source and feeds ./run while
    this one takes its output, so reading, quantising and writing overlap."""
    cmd = [run, "-m", "quantize", "--stream", "--dtype", "q8" if wtype == WEIGHT_Q8 else "q4",
           "--group-size", str(gs)] + (["--threads", str(jobs)] if jobs else [])
    import subprocess
    import tempfile
    errors = tempfile.TemporaryFile()  # its error line, which failed() makes export.py's one line
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors)
    # In order: ("here", a converted block or PAD), ("c", output bytes, source bytes, name) for a
    # frame sent to ./run, ("error", exception), then None at the end.
    records, stop = queue.Queue(maxsize=8), threading.Event()

    def put(record):
        while not stop.is_set():
            try:
                return records.put(record, timeout=0.1)
            except queue.Full:
                pass

    def feed():
        try:
            for block in blocks:
                if stop.is_set():
                    return
                if block is PAD or block[3] not in (WEIGHT_Q8, WEIGHT_Q4):
                    put(("here", block if block is PAD else convert_block(block)))
                    continue
                raw, dtype, cols, stored, _, name, first = block
                rows = len(raw) // (cols * SAFETENSORS_DTYPES[dtype])
                put(("c", stored_bytes(rows, cols, stored, gs), len(raw), name))
                key = name.encode()
                frame_type = {"F32": 0, "BF16": 1, "F16": 2}[dtype]
                proc.stdin.write(struct.pack("<6I", frame_type, rows, cols, first, len(key), 0) + key)
                proc.stdin.write(raw)
                # the reader waits for this frame's output: a frame smaller than the pipe's buffer
                # must not wait in it for the next (a model of tiny tensors stalled there)
                proc.stdin.flush()
            proc.stdin.write(bytes(24))  # a frame of 0 rows: the end
            proc.stdin.close()
            put(None)
        except BaseException as e:  # a closed pipe (./run ended), or the source could not be read
            put(("error", e))

    def failed():
        status = proc.wait()
        errors.seek(0)
        said = [line for line in errors.read().decode(errors="replace").splitlines() if line.strip()]
        if not said:
            return ExportError(f"./run -m quantize failed (status {status}); no output written")
        why = said[-1][len("run: error: "):] if said[-1].startswith("run: error: ") else said[-1]
        return ExportError(f"{why}; no output written (./run -m quantize --stream, status {status})")

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        while True:
            record = records.get()
            if record is None:
                break
            if record[0] == "here":
                yield record[1]
            elif record[0] == "error":
                raise failed() if isinstance(record[1], BrokenPipeError) else record[1]
            else:
                data = proc.stdout.read(record[1])
                if len(data) != record[1]:
                    raise failed()
                yield data, record[2], record[3]
        if proc.wait() != 0:
            raise failed()
        errors.seek(0)
        sys.stderr.write(errors.read().decode(errors="replace"))  # its notes, if any
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        feeder.join()
        errors.close()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class Writer:
    def __init__(self, f):
        self.f = f

    def pad(self):
        pos = self.f.tell()
        if pos % ALIGN:
            self.f.write(bytes(ALIGN - pos % ALIGN))

    def write(self, data):
        self.f.write(data)


def check_output_path(out_path, inputs):
    """Fails before any conversion, naming the user's path, where the output could not be written
    or would replace one of the files being read. Returns the file to replace: out_path, or where
    it leads when it is a link to a file (the link stays)."""
    if out_path == "" or out_path.endswith(os.sep):
        raise ExportError(f"{out_path!r}: give a file name for the checkpoint")
    if os.path.isdir(out_path):
        raise ExportError(f"{out_path}: is a directory; give a file name for the checkpoint")
    if os.path.exists(out_path) and not os.path.isfile(out_path):  # the rename would replace the node itself
        raise ExportError(f"{out_path}: is not a regular file (a device, FIFO or socket); give a file name "
                          "for the checkpoint")
    target = os.path.realpath(out_path) if os.path.islink(out_path) else out_path  # also to a file not yet there
    name_max = 255
    if hasattr(os, "pathconf"):
        try:
            name_max = os.pathconf(os.path.dirname(os.path.abspath(target)) or ".", "PC_NAME_MAX")
        except (OSError, ValueError):
            pass
    room = name_max - len(f"..{os.getpid()}.tmp")  # the temporary name beside it
    if len(os.path.basename(target).encode(errors="surrogateescape")) > room:
        raise ExportError(f"{out_path}: a file name of at most {room} bytes here (the temporary file beside it "
                          "adds a few)")
    out_dir = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(out_dir):
        raise ExportError(f"{out_dir}: no such directory (for the output {out_path})")
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ExportError(f"{out_dir}: cannot write there (for the output {out_path})")
    if os.path.exists(out_path):
        for path in inputs:
            if os.path.exists(path) and os.path.samefile(out_path, path):
                raise ExportError(f"{out_path}: is one of the files being converted; write the "
                                  "checkpoint somewhere else")
    return target


def remove_stale_temporaries(out_dir, base):
    """Removes what an export to the same name that was killed outright (SIGKILL, a power cut: no
    cleanup ran) left behind: .BASE.PID.tmp files whose process no longer exists."""
    prefix = f".{base}."
    for name in os.listdir(out_dir):
        pid = name[len(prefix):-len(".tmp")] if name.startswith(prefix) and name.endswith(".tmp") else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running: another export's file
        except ProcessLookupError:
            pass
        except OSError:
            continue  # exists but not ours to signal
        try:
            os.unlink(os.path.join(out_dir, name))
            warn(f"removed {os.path.join(out_dir, name)}, left by an export that was killed")
        except OSError:
            pass


def file_flags(c, has_qk_norm):
    """The header's flags for a parsed config; has_qk_norm: the source stores q_norm and k_norm
    (Qwen3 always does)."""
    flags = 0
    if c["arch"] in (ARCH_QWEN3, ARCH_QWEN3_MOE) or has_qk_norm:
        flags |= FLAG_QK_NORM
    if c["arch"] == ARCH_QWEN2:
        flags |= FLAG_QKV_BIAS
    if c["tied"]:
        flags |= FLAG_TIED_EMBED
    if c["yarn"]:
        flags |= FLAG_ROPE_YARN
    if c.get("moe"):
        flags |= FLAG_MOE
    return flags


def pack_header(c, flags, wtype, gs, bos, tok_offset, tok_size, weights_offset, weights_size):
    """The 256-byte FileHeader of model.h."""
    eos = c["eos_ids"] + [0] * (MAX_EOS - len(c["eos_ids"]))
    header = struct.pack(
        HEADER_FORMAT, MAGIC, VERSION, c["arch"], flags, c["dim"], c["hidden_dim"],
        c["n_layers"], c["n_heads"], c["n_kv_heads"], c["head_dim"], c["vocab_size"],
        c["max_seq_len"], wtype, gs, c["rms_norm_eps"], bos, c["rope_theta"],
        len(c["eos_ids"]), *eos, c["temperature"], c["top_p"], c["top_k"], 0, 0,
        tok_offset, tok_size, weights_offset, weights_size, *yarn_fields(c["yarn"]),
        *moe_fields(c.get("moe")))
    assert len(header) == 256
    return header


def read_inputs(folder, dtype_name, group_size, tokenizer_dir):
    """Reads and checks every input file before anything is converted. Returns the export's plan
    as a dict; raises ExportError (one line naming the file and the field) on any input that is
    malformed or outside what the engine loads."""
    if not os.path.isdir(folder):
        raise ExportError(f"{folder}: no such folder" if not os.path.exists(folder) else
                          f"{folder}: not a folder (give the Hugging Face model's folder)")
    cfg = read_json(os.path.join(folder, "config.json"), "the model config")
    gen_path = os.path.join(folder, "generation_config.json")
    gen = read_json(gen_path, "the generation config") if os.path.exists(gen_path) else {}
    c = parse_config(folder, cfg, gen)
    table = load_tensor_table(folder)
    tok_dir = tokenizer_dir or folder
    if tokenizer_dir is not None and not os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")):
        raise ExportError(f"{tokenizer_dir}: no tokenizer.json there (--tokenizer)")

    flags = file_flags(c, hf_name("q_norm", 0) in table)
    c["flags"] = flags
    plan = tensor_plan(c)

    # Check every tensor before writing anything.
    for name, shape, _ in plan:
        t = table.get(name)
        if t is None:
            fused = name.rsplit(".experts.", 1)[0] + ".experts.gate_up_proj"
            if ".experts." in name and fused in table:  # save_pretrained(save_original_format=False)
                raise ExportError(f"{folder}: tensor '{fused}' holds the experts fused, as transformers keeps "
                                  "them in memory; export reads the hub's layout of one tensor per expert "
                                  "(save_pretrained's default)")
            raise ExportError(f"{folder}: tensor '{name}' is missing from the checkpoint")
        if t.dtype not in SAFETENSORS_DTYPES:
            raise ExportError(f"{t.path}: tensor '{name}' has dtype {show(t.dtype)}; supported: "
                              + ", ".join(SAFETENSORS_DTYPES))
        if t.shape != shape:
            raise ExportError(f"{t.path}: tensor '{name}' has shape {show(t.shape)}, expected "
                              f"{shape} from config.json")
    unused = set(table) - {name for name, _, _ in plan} - {hf_name("lm_head")}
    unused = {n for n in unused if not n.endswith("rotary_emb.inv_freq")}
    shared = sorted(n for n in unused if ".shared_expert" in n)
    if shared:  # Qwen2-MoE's layout: the model is not Qwen3-MoE, whatever config.json says
        raise ExportError(f"{table[shared[0]].path}: tensor '{shared[0]}' belongs to a shared expert; "
                          "Qwen3-MoE has none, and shared experts are not supported")
    if unused:
        warn(f"{len(unused)} tensor(s) not used, e.g. {show(sorted(unused)[0])}")

    # Default stored format: the source's (BF16 stays bf16, F32 stays f32, F16 becomes f32).
    if dtype_name is None:
        dtype_name = "bf16" if table[hf_name("embed_tokens")].dtype == "BF16" else "f32"
    wtype = DTYPES[dtype_name]
    gs = 0
    if group_size and wtype not in DEFAULT_GROUP:
        warn(f"--group-size {group_size} is for q8 (and q4's 32): {dtype_name} has no groups, so it is ignored")
    if wtype in DEFAULT_GROUP:
        gs = choose_group_size(c, group_size or DEFAULT_GROUP[wtype], wtype, os.path.join(folder, "config.json"))
        if group_size and gs != group_size:
            warn(f"q8 groups of {gs}: --group-size {group_size} does not divide every input width")
        if wtype == WEIGHT_Q8 and gs % 32:
            default = choose_group_size(c, DEFAULT_GROUP[wtype], wtype)
            warn(f"q8 groups of {gs}: the engine's SIMD products take groups of a multiple of 32, so this "
                 "file's run on its scalar reference, tens of times slower"
                 + (f"; without --group-size they are {default}" if group_size and default % 32 == 0 else ""))

    tok = tokenizer_section(os.path.join(tok_dir, "tokenizer.json"),
                            os.path.join(tok_dir, "tokenizer_config.json"), c["vocab_size"])
    bos = -1
    if c["arch"] == ARCH_LLAMA:
        tc_path = os.path.join(tok_dir, "tokenizer_config.json")
        tc = read_json(tc_path, "the tokenizer config") if os.path.exists(tc_path) else {}
        bos_id = cfg.get("bos_token_id")
        if tc.get("add_bos_token") and bos_id is not None:
            if not is_int(bos_id) or not 0 <= bos_id < c["vocab_size"]:
                raise ExportError(f"{os.path.join(folder, 'config.json')}: field 'bos_token_id' is "
                                  f"{show(bos_id)}, not a token id (0 .. {c['vocab_size'] - 1}, "
                                  "vocab_size)")
            bos = bos_id
    return {"c": c, "table": table, "plan": plan, "flags": flags, "dtype_name": dtype_name,
            "wtype": wtype, "gs": gs, "tok": tok, "bos": bos, "tok_dir": tok_dir}


def checkpoint_bytes(plan, wtype, gs, tok_len):
    """The size of the file export() writes for plan in wtype: the 256-byte header and the
    tokenizer, then each tensor 64-byte aligned, norms and biases in f32, q8 and q4 in whole row
    blocks (quant_row_blocks: q8 a byte a value and a float16 scale a group of gs, q4 18 bytes a
    group of 32)."""
    size = 256 + tok_len + (-(256 + tok_len) % ALIGN)
    for _, shape, is_matrix in plan:
        n = stored_bytes(shape[0] if len(shape) == 2 else 1, shape[-1], wtype if is_matrix else WEIGHT_F32, gs)
        size += n + (-n % ALIGN)
    return size


def stored_bytes(rows, cols, stored, gs):
    """The bytes of rows x cols weights stored as `stored` (q8 and q4 in whole row blocks)."""
    rows += -rows % QUANT_BLOCK_ROWS.get(stored, 1)
    return rows * {WEIGHT_F32: 4 * cols, WEIGHT_BF16: 2 * cols, WEIGHT_Q4: cols // 32 * 18,
                   WEIGHT_Q8: cols + 2 * (cols // gs) if gs else 0}[stored]


def check_room(out_path, what, needs):
    """An ExportError, before anything is written, where the disk that out_path goes to has less
    free space than the `needs` bytes of `what`. A disk that fills up halfway would end the export
    the same way, but after minutes (17 GB of q4 for Qwen3-30B-A3B)."""
    def size(n):
        return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} KB"

    free = shutil.disk_usage(os.path.dirname(os.path.abspath(out_path))).free
    if free < needs:
        raise ExportError(f"{out_path}: needs {size(needs)} free for {what}; its disk has {size(free)} free: "
                          "nothing written")


def export(folder, out_path, dtype_name, group_size, tokenizer_dir, jobs=None, quantizer=None):
    """Writes the checkpoint; q8 and q4 by the ./run at `quantizer` (quantized_in_c) where given,
    else in Python. Returns (size, dtype name, group size)."""
    inputs = read_inputs(folder, dtype_name, group_size, tokenizer_dir)
    c, table, plan, flags = inputs["c"], inputs["table"], inputs["plan"], inputs["flags"]
    dtype_name, wtype, gs = inputs["dtype_name"], inputs["wtype"], inputs["gs"]
    tok, bos, tok_dir = inputs["tok"], inputs["bos"], inputs["tok_dir"]
    target = check_output_path(out_path, [t.path for t in table.values()] + [
        os.path.join(folder, name) for name in ("config.json", "generation_config.json",
                                                "model.safetensors.index.json")] + [
        os.path.join(tok_dir, name) for name in ("tokenizer.json", "tokenizer_config.json")])

    total = sum(table[name].shape[0] * (table[name].shape[1] if len(table[name].shape) > 1 else 1)
                * SAFETENSORS_DTYPES[table[name].dtype] for name, _, _ in plan)
    show_progress = total > (64 << 20)
    check_room(target, f"the {dtype_name} output", checkpoint_bytes(plan, wtype, gs, len(tok)))
    # Worker processes for the conversions that run a Python loop per value (quantizing, rounding
    # to bf16); plain copies and widening stay in this process. Output is the same either way.
    in_c = quantizer is not None and wtype in (WEIGHT_Q8, WEIGHT_Q4)
    workers = 1
    if not in_c:
        slow = wtype in (WEIGHT_Q8, WEIGHT_Q4) or (
            wtype == WEIGHT_BF16 and table[hf_name("embed_tokens")].dtype != "BF16")
        workers = max(1, jobs if jobs is not None else
                      min(MAX_JOBS, available_cpus()) if slow and show_progress else 1)
    done, t0 = 0, time.time()

    out_dir = os.path.dirname(os.path.abspath(target))
    remove_stale_temporaries(out_dir, os.path.basename(target))
    tmp_path = os.path.join(out_dir, f".{os.path.basename(target)}.{os.getpid()}.tmp")
    files = {}
    try:
        with open(tmp_path, "wb") as f:
            w = Writer(f)
            w.write(bytes(256))  # the header is written last, once the offsets are known
            tok_offset = f.tell()
            w.write(tok)
            w.pad()
            weights_offset = f.tell()
            blocks = plan_blocks(plan, table, files, wtype, gs)
            for item in (quantized_in_c(blocks, quantizer, wtype, gs, jobs) if in_c
                         else converted_blocks(blocks, workers)):
                if item is PAD:  # each tensor starts 64-byte aligned
                    w.pad()
                    continue
                data, src_bytes, name = item
                w.write(data)
                done += src_bytes
                if show_progress:
                    progress(done, total, t0, name)
            w.pad()
            end = f.tell()
            f.seek(0)
            f.write(pack_header(c, flags, wtype, gs, bos, tok_offset, len(tok), weights_offset,
                                end - weights_offset))
            # On disk before the rename, so a crash cannot leave a partial file under the final
            # name. Then the cached copy is dropped: written pages sit in the page cache in small
            # pages, and the engine maps weights in 2 MB pages only from a cache it fills itself
            # (checkpoint.c, map_file; it leaves a cache in small pages as it is).
            f.flush()
            os.fsync(f.fileno())
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        end_progress_line()
        os.replace(tmp_path, target)
    except BaseException:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise
    finally:
        for src in files.values():
            src.close()
    return end, dtype_name, gs


def c_quantizer(args):
    """The ./run beside this script, for --dtype q8 / q4: it quantises the matrices as export()
    streams them (`-m quantize --stream`), the same bytes as the Python path, many times faster.
    None after saying why the Python path runs instead: --no-fast-quantize, or ./run not built, not
    starting, or built before --stream; None without a word for q4 with a --group-size, which
    export() refuses."""
    import subprocess
    run = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run")
    why = None
    if args.no_fast_quantize:
        why = "--no-fast-quantize"
    elif args.dtype == "q4" and args.group_size not in (None, 32):
        return None  # export() refuses it, with the reason, before anything is read
    else:
        try:  # an empty stream: status 0 from a ./run that has --stream
            probe = subprocess.run([run, "-m", "quantize", "--stream", "--dtype", args.dtype],
                                   input=b"", capture_output=True, timeout=60)
            if probe.returncode != 0:
                why = f"{run} has no -m quantize --stream (status {probe.returncode}); `make` rebuilds it"
        except FileNotFoundError:
            why = f"{run} is not built; `make` builds it, and quantizes much faster"
        except (OSError, subprocess.SubprocessError) as e:
            why = f"{run} does not start: {e}"
    if why:
        print(f"export.py: {args.dtype} in Python ({why})", file=sys.stderr)
        return None
    print(f"export.py: {args.dtype} by ./run -m quantize --stream (C)", file=sys.stderr)
    return run


_last_logged = [-1]
_line_open = [False]  # a progress line is on the terminal without its newline


def end_progress_line():
    """The newline after the terminal's progress line, so the next message starts a line of its own."""
    if _line_open[0]:
        print(file=sys.stderr)
        _line_open[0] = False


def progress(done, total, t0, name):
    """One updating line on a terminal; on a pipe or log file, a plain line every 10%."""
    done = min(done, total)
    el = time.time() - t0
    eta = el * (total - done) / done if done else 0
    line = (f"export.py: {100 * done / total:5.1f}%  {done >> 20}/{total >> 20} MB  "
            f"eta {eta:4.0f}s  {name[:48]:<48}")
    if sys.stderr.isatty():
        print("\r" + line, end="", file=sys.stderr, flush=True)
        _line_open[0] = True
    elif 10 * done // total > _last_logged[0]:
        _last_logged[0] = 10 * done // total
        print(line.rstrip(), file=sys.stderr, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Convert a Hugging Face Qwen3 (or Qwen2 / Llama) folder into one checkpoint "
                    "file for ./run (format: model.h).")
    ap.add_argument("folder", help="Hugging Face model folder (config.json, *.safetensors, "
                                   "tokenizer.json, ...)")
    ap.add_argument("output", help="checkpoint file to write")
    ap.add_argument("--dtype", choices=sorted(DTYPES),
                    help="stored weight format (default: the source's; F16 sources become f32)")
    ap.add_argument("--group-size", type=int,
                    help="q8 group size (default 64; smaller when it does not divide the widths; "
                         "under 32 the engine multiplies on its scalar reference, tens of times slower); "
                         "q4's groups are always 32")
    ap.add_argument("--jobs", type=int, metavar="N",
                    help="processes that convert blocks of rows (default: one per CPU, up to "
                         f"{MAX_JOBS}, for q8 / q4 and bf16 from other formats above 64 MB; else 1); "
                         "for q8 / q4 by ./run, its threads (default: one per CPU)")
    ap.add_argument("--no-fast-quantize", action="store_true",
                    help="q8 / q4: quantize in Python even where ./run is built (./run -m quantize "
                         "--stream writes the same bytes, much faster)")
    ap.add_argument("--tokenizer", metavar="DIR",
                    help="take tokenizer.json and tokenizer_config.json from DIR instead of the "
                         "model folder")
    args = ap.parse_args(argv)
    if args.group_size is not None and (args.group_size < 8 or args.group_size & (args.group_size - 1)):
        ap.error("--group-size must be a power of two >= 8")
    if args.jobs is not None and args.jobs < 1:
        ap.error("--jobs must be at least 1")
    if args.dtype == "q4" and args.group_size not in (None, 32):  # a bad command line: status 2, as ./run's
        print(f"export.py: error: q4 groups are 32 columns (got --group-size {args.group_size})", file=sys.stderr)
        return 2
    # `kill` (SIGTERM) and a closed terminal (SIGHUP) end the export like Ctrl-C: through the cleanup
    # that removes the unfinished temporary file.
    for signum in (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,):
        signal.signal(signum, lambda signum, frame: sys.exit(128 + signum))
    try:
        t0 = time.time()
        quantizer = c_quantizer(args) if args.dtype in ("q8", "q4") else None
        size, dtype_name, gs = export(args.folder, args.output, args.dtype, args.group_size,
                                      args.tokenizer, args.jobs, quantizer)
        extra = f", group size {gs}" if gs else ""
        print(f"export.py: wrote {args.output} ({size / 1e6:.1f} MB, {dtype_name}{extra}) in "
              f"{time.time() - t0:.1f}s", file=sys.stderr)
    except ExportError as e:
        end_progress_line()
        print(f"export.py: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        end_progress_line()
        print("export.py: interrupted; no output written", file=sys.stderr)
        return 130
    except OSError as e:
        end_progress_line()
        where = "" if e.filename else f"{args.output}: "  # a write's error names no file: it is the output's
        print(f"export.py: error: {where}{one_line(e, 300)}", file=sys.stderr)
        return 1
    except Exception as e:
        end_progress_line()
        # Every input problem is an ExportError that names its file and field (the fuzz test in
        # tests/test_export_input.py holds read_inputs to that); anything else is a bug in this
        # script, still reported as one line rather than a traceback.
        print(f"export.py: error: internal error, {type(e).__name__}: {one_line(e, 200)} (a bug in "
              "export.py: please report it with the input that caused it)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
