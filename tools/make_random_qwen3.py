#!/usr/bin/env python3
"""make_random_qwen3.py: a random checkpoint with the real Qwen3-0.6B shape, for speed tests.

    python3 tools/make_random_qwen3.py OUT_DIR [--config config.json] [--layers N] [--seed S]
                                               [--tokenizer DIR]
    python3 export.py OUT_DIR out.bin --dtype f32|bf16|q8

Writes OUT_DIR/config.json, generation_config.json and model.safetensors (BF16, the tensor names of
QWEN3.md 3.3, tie_word_embeddings true, so no lm_head.weight) in Hugging Face layout. The shape comes
from ../shared/qwen3-0.6b/config.json next to the repository when it exists (or --config), else
from the numbers embedded below (the same ones). With --tokenizer DIR (default:
../shared/qwen3-tokenizer when it exists) tokenizer.json and tokenizer_config.json are copied too.

The weights are random but not meaningless in scale: projections are uniform with standard
deviation 1/sqrt(in_features) so activations stay O(1), norm weights are 1. For speed a block of
random bf16 values is generated once and written repeatedly (each tensor from another offset).
Python 3 standard library only; a 0.6B checkpoint (1.2 GB) takes seconds.
"""
import argparse
import json
import os
import random
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "shared"))

# Qwen/Qwen3-0.6B config.json (QWEN3.md 1.1), used when no config file is found.
DEFAULT_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

DEFAULT_GENERATION = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}

BLOCK_VALUES = 1 << 20  # random bf16 values generated once (2 MiB), written repeatedly


def bf16_bits(x):
    """float -> bfloat16 bits (round to nearest even)."""
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def random_block(rng, std):
    """BLOCK_VALUES bf16 values uniform in [-std*sqrt(3), std*sqrt(3)] (standard deviation std),
    as little-endian bytes. A table of 4096 values is built with struct, then indexed."""
    a = std * 3 ** 0.5
    table = [struct.pack("<H", bf16_bits(rng.uniform(-a, a))) for _ in range(4096)]
    idx = [rng.getrandbits(12) for _ in range(BLOCK_VALUES)]
    return b"".join(table[i] for i in idx)


def tensor_list(cfg):
    D, F = cfg["hidden_size"], cfg["intermediate_size"]
    H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or D // H
    V, L = cfg["vocab_size"], cfg["num_hidden_layers"]
    out = [("model.embed_tokens.weight", [V, D], "embed")]
    for l in range(L):
        p = f"model.layers.{l}."
        out += [
            (p + "input_layernorm.weight", [D], "norm"),
            (p + "self_attn.q_proj.weight", [H * d, D], "proj"),
            (p + "self_attn.k_proj.weight", [K * d, D], "proj"),
            (p + "self_attn.v_proj.weight", [K * d, D], "proj"),
            (p + "self_attn.o_proj.weight", [D, H * d], "proj"),
            (p + "self_attn.q_norm.weight", [d], "norm"),
            (p + "self_attn.k_norm.weight", [d], "norm"),
            (p + "post_attention_layernorm.weight", [D], "norm"),
            (p + "mlp.gate_proj.weight", [F, D], "proj"),
            (p + "mlp.up_proj.weight", [F, D], "proj"),
            (p + "mlp.down_proj.weight", [D, F], "proj"),
        ]
    out.append(("model.norm.weight", [D], "norm"))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [V, D], "embed"))
    return out


def write_repeated(f, block, nbytes, start):
    """Writes nbytes taken cyclically from block, beginning at byte `start` (even)."""
    n = len(block)
    pos = start % n
    while nbytes > 0:
        take = min(nbytes, n - pos)
        f.write(block[pos:pos + take] if (pos or take != n) else block)
        nbytes -= take
        pos = 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--config", help="a config.json to take the shape from")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers (smaller test files)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tokenizer", metavar="DIR",
                    help="copy tokenizer.json and tokenizer_config.json from DIR")
    args = ap.parse_args()

    cfg_path = args.config or os.path.join(SHARED, "qwen3-0.6b", "config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    elif args.config:
        sys.exit(f"make_random_qwen3.py: error: {cfg_path}: not found")
    else:
        cfg = dict(DEFAULT_CONFIG)
    if args.layers is not None:
        if args.layers < 1:
            sys.exit("make_random_qwen3.py: error: --layers must be at least 1")
        cfg["num_hidden_layers"] = args.layers
        cfg["max_window_layers"] = args.layers
    gen_path = os.path.join(os.path.dirname(cfg_path), "generation_config.json")
    gen = DEFAULT_GENERATION
    if os.path.exists(gen_path):
        with open(gen_path, encoding="utf-8") as f:
            gen = json.load(f)

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(args.out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=2)

    tok_dir = args.tokenizer or os.path.join(SHARED, "qwen3-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(tok_dir, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(args.out_dir, name))
        elif args.tokenizer:
            sys.exit(f"make_random_qwen3.py: error: {src}: not found")

    rng = random.Random(args.seed)
    tensors = tensor_list(cfg)
    D = cfg["hidden_size"]
    header, offset = {}, 0
    for name, shape, _ in tensors:
        n = 2
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * (-len(hbytes) % 8)

    # one block per kind of tensor: projections scaled by 1/sqrt(in), embeddings 0.3 (QWEN3-like
    # RMS of the residual stream), norms exactly 1.0 (bf16 0x3F80)
    blocks = {"proj": {}, "embed": random_block(rng, 0.3), "norm": struct.pack("<H", 0x3F80) * 4096}
    path = os.path.join(args.out_dir, "model.safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for name, shape, kind in tensors:
            nbytes = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if kind == "proj":
                fan_in = shape[1]
                if fan_in not in blocks["proj"]:
                    blocks["proj"][fan_in] = random_block(rng, 1.0 / fan_in ** 0.5)
                block = blocks["proj"][fan_in]
            else:
                block = blocks[kind]
            write_repeated(f, block, nbytes, 2 * rng.randrange(len(block) // 2))
    os.replace(path + ".tmp", path)
    print(f"{args.out_dir}: {len(tensors)} tensors, {offset / 1e9:.2f} GB of BF16 weights "
          f"(dim {D}, {cfg['num_hidden_layers']} layers, vocab {cfg['vocab_size']})")


if __name__ == "__main__":
    main()
