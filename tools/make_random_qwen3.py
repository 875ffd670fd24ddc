#!/usr/bin/env python3
"""make_random_qwen3.py: a random checkpoint with the real shape of a Qwen3 size, for speed tests.

    python3 tools/make_random_qwen3.py OUT_DIR [--size 0.6b|1.7b|4b|8b|14b|30b-a3b | --config config.json]
                                               [--layers N] [--seed S] [--tokenizer DIR] [--config-only]
    python3 export.py OUT_DIR out.bin --dtype f32|bf16|q8|q4

Writes OUT_DIR/config.json, generation_config.json and model.safetensors (BF16, the tensor names of
QWEN3.md 3.3, and 8.2 for the experts) in Hugging Face layout. --size picks the shape of QWEN3.md
1.1 or 8.1, embedded below
(default 0.6b); --config takes it from a config.json instead. 0.6B, 1.7B and 4B tie the head to the
embedding (no lm_head.weight); 8B and 14B store lm_head.weight [vocab, hidden] as Hugging Face does.
With --tokenizer DIR (default: ../shared/qwen3-tokenizer when it exists) tokenizer.json and
tokenizer_config.json are copied too. --config-only writes everything but model.safetensors and
says how large it would be: what tools/make_random_checkpoint.py and make_random_gguf.py need to
write the engine's checkpoint and llama.cpp's GGUF straight away (30b-a3b is 61 GB of BF16).

The weights are random but not meaningless in scale: projections (and an untied head) are uniform
with standard deviation 1/sqrt(in_features) so activations stay O(1), norm weights are 1. For speed
a block of random bf16 values is generated once and written repeatedly (each tensor from another
offset), so memory stays small for every size. model.safetensors is written under a temporary name
and renamed when complete; a failed or interrupted run leaves none. Python 3 standard library only;
0.6B (1.2 GB) takes seconds, 8B (16.4 GB) about as long as the disk needs to write it.
"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "shared"))

# Qwen/Qwen3-0.6B config.json (QWEN3.md 1.1); the other sizes change only the fields of SIZES.
BASE_CONFIG = {
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

# The dense sizes (QWEN3.md 1.1): hidden, intermediate, layers, attention heads, kv heads, tied head.
# Every size has head_dim 128 and vocabulary 151936.
SIZES = {
    "0.6b": (1024, 3072, 28, 16, 8, True),
    "1.7b": (2048, 6144, 28, 16, 8, True),
    "4b": (2560, 9728, 36, 32, 8, True),
    "8b": (4096, 12288, 36, 32, 8, False),
    "14b": (5120, 17408, 40, 40, 8, False),
}

# The Qwen3-MoE size (QWEN3.md 8.1): the fields of Qwen/Qwen3-30B-A3B's config.json that differ
# from the 0.6B file. Every layer is a mixture of experts (decoder_sparse_step 1, no mlp_only_layers).
MOE_SIZES = {
    "30b-a3b": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                "intermediate_size": 6144, "num_hidden_layers": 48, "max_window_layers": 48,
                "num_attention_heads": 32, "num_key_value_heads": 4, "tie_word_embeddings": False,
                "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                "router_aux_loss_coef": 0.001, "output_router_logits": False},
}
ALL_SIZES = list(SIZES) + list(MOE_SIZES)

DEFAULT_GENERATION = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}


def generation_config(cfg):
    """Qwen3's generation config with cfg's own end-of-sequence id first and its bos id, keeping
    only ids inside cfg's vocabulary (a --config of a small shape): export.py refuses any other."""
    g = dict(DEFAULT_GENERATION)
    own = cfg.get("eos_token_id", [])
    ids = (own if isinstance(own, list) else [own]) + g["eos_token_id"]
    eos = [i for n, i in enumerate(ids) if isinstance(i, int) and 0 <= i < cfg["vocab_size"] and i not in ids[:n]]
    g["eos_token_id"] = eos or [cfg["vocab_size"] - 1]
    for key in ("bos_token_id", "pad_token_id"):
        v = cfg.get(key, g[key])
        if not isinstance(v, int) or not 0 <= v < cfg["vocab_size"]:
            del g[key]
        else:
            g[key] = v
    return g


BLOCK_VALUES = 1 << 20  # random bf16 values generated once (2 MiB), written repeatedly
PROGRESS_BYTES = 256 << 20  # files at least this large show their progress


def bf16_bits(x):
    """float -> bfloat16 bits (round to nearest even)."""
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def random_block(rng, std, n=BLOCK_VALUES):
    """n bf16 values uniform in [-std*sqrt(3), std*sqrt(3)] (standard deviation std), as
    little-endian bytes. A table of 4096 values is built with struct, then indexed."""
    a = std * 3 ** 0.5
    table = [struct.pack("<H", bf16_bits(rng.uniform(-a, a))) for _ in range(4096)]
    idx = [rng.getrandbits(12) for _ in range(n)]
    return b"".join(table[i] for i in idx)


def layer_is_moe(cfg, l):
    """transformers' rule (QWEN3.md 8.1): a Qwen3-MoE layer is sparse unless mlp_only_layers keeps
    it dense or decoder_sparse_step skips it."""
    return (cfg.get("num_experts", 0) > 0 and "Qwen3MoeForCausalLM" in cfg.get("architectures", [])
            and l not in cfg.get("mlp_only_layers", []) and (l + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def mlp_tensors(cfg, p, l):
    """Layer l's MLP: the dense SwiGLU, or the router and each expert's three matrices."""
    D, F = cfg["hidden_size"], cfg["intermediate_size"]
    if not layer_is_moe(cfg, l):
        return [(p + "mlp.gate_proj.weight", [F, D], "proj"), (p + "mlp.up_proj.weight", [F, D], "proj"),
                (p + "mlp.down_proj.weight", [D, F], "proj")]
    E, Fe = cfg["num_experts"], cfg["moe_intermediate_size"]
    out = [(p + "mlp.gate.weight", [E, D], "proj")]
    for e in range(E):
        q = f"{p}mlp.experts.{e}."
        out += [(q + "gate_proj.weight", [Fe, D], "proj"), (q + "up_proj.weight", [Fe, D], "proj"),
                (q + "down_proj.weight", [D, Fe], "proj")]
    return out


def tensor_list(cfg):
    D = cfg["hidden_size"]
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
        ] + mlp_tensors(cfg, p, l)
    out.append(("model.norm.weight", [D], "norm"))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [V, D], "proj"))  # logits O(1), and other values than the embedding
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


def size_config(size):
    """config.json of a size: the 0.6B file with the fields of SIZES or MOE_SIZES changed."""
    cfg = dict(BASE_CONFIG)
    if size in MOE_SIZES:
        cfg.update(MOE_SIZES[size])
        return cfg
    D, F, L, H, K, tie = SIZES[size]
    cfg.update(hidden_size=D, intermediate_size=F, num_hidden_layers=L, max_window_layers=L,
               num_attention_heads=H, num_key_value_heads=K, tie_word_embeddings=tie)
    return cfg


def len_of(shape):
    """The number of values of a tensor of this shape."""
    n = 1
    for s in shape:
        n *= s
    return n


def safetensors_header(tensors):
    """The header bytes (JSON padded to 8 bytes) and the data size of BF16 tensors stored in order."""
    header, offset = {}, 0
    for name, shape, _ in tensors:
        n = 2 * len_of(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return hbytes + b" " * (-len(hbytes) % 8), offset


def write_safetensors(path, tensors, rng):
    """Streams the tensors into path through path + ".tmp" (removed if anything fails), one line
    of progress on stderr per 10% when the file is large."""
    hbytes, total = safetensors_header(tensors)
    # one block per kind of tensor: projections scaled by 1/sqrt(in), embeddings 0.3 (QWEN3-like
    # RMS of the residual stream), norms exactly 1.0 (bf16 0x3F80)
    # a block no longer than the largest tensor it fills (a small model's take a moment, not seconds)
    largest = {}
    for _, shape, kind in tensors:
        key = (kind, shape[1] if kind == "proj" else 0)
        largest[key] = min(BLOCK_VALUES, max(largest.get(key, 0), len_of(shape)))
    blocks = {"proj": {}, "embed": random_block(rng, 0.3, largest.get(("embed", 0), BLOCK_VALUES)),
              "norm": struct.pack("<H", 0x3F80) * 4096}
    done, shown = 0, 0
    try:
        with open(path + ".tmp", "wb") as f:
            f.write(struct.pack("<Q", len(hbytes)))
            f.write(hbytes)
            for _, shape, kind in tensors:
                if kind == "proj":
                    fan_in = shape[1]
                    if fan_in not in blocks["proj"]:
                        blocks["proj"][fan_in] = random_block(rng, 1.0 / fan_in ** 0.5, largest[("proj", fan_in)])
                    block = blocks["proj"][fan_in]
                else:
                    block = blocks[kind]
                nbytes = 2 * len_of(shape)
                write_repeated(f, block, nbytes, 2 * rng.randrange(len(block) // 2))
                done += nbytes
                if total >= PROGRESS_BYTES and 10 * done // total > shown:
                    shown = 10 * done // total
                    print(f"make_random_qwen3.py: {100 * done // total:3d}%  {done / 1e9:.1f}/{total / 1e9:.1f} GB",
                          file=sys.stderr, flush=True)
        os.replace(path + ".tmp", path)
    except BaseException:
        if os.path.exists(path + ".tmp"):
            os.unlink(path + ".tmp")
        raise


def load_config(args):
    """The config of --config, or of --size, with --layers applied; exits with a message if the
    file cannot be read."""
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as f:
                cfg = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"make_random_qwen3.py: error: {args.config}: {e}")
    else:
        cfg = size_config(args.size)
    if args.layers is not None:
        cfg["num_hidden_layers"] = args.layers
        cfg["max_window_layers"] = args.layers
    return cfg


def check_free_space(directory, nbytes):
    """Exits with a message when nbytes (and some room to spare) do not fit on directory's disk."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    if free < nbytes + (64 << 20):
        sys.exit(f"make_random_qwen3.py: error: {directory}: {nbytes / 1e9:.1f} GB to write, "
                 f"{free / 1e9:.1f} GB free on its disk")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    shape = ap.add_mutually_exclusive_group()
    shape.add_argument("--size", choices=ALL_SIZES, default="0.6b",
                       help="the Qwen3 size whose shape to use (default 0.6b)")
    shape.add_argument("--config", help="a config.json to take the shape from instead")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers (smaller test files)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tokenizer", metavar="DIR",
                    help="copy tokenizer.json and tokenizer_config.json from DIR")
    ap.add_argument("--config-only", action="store_true",
                    help="write the JSON and tokenizer files, not model.safetensors")
    args = ap.parse_args()
    if args.layers is not None and args.layers < 1:
        ap.error("--layers must be at least 1")
    cfg = load_config(args)
    tensors = tensor_list(cfg)
    params = sum(len_of(shape) for _, shape, _ in tensors)

    tok_dir = args.tokenizer or os.path.join(SHARED, "qwen3-tokenizer")
    tok_files = [os.path.join(tok_dir, name) for name in ("tokenizer.json", "tokenizer_config.json")]
    if args.tokenizer:
        for src in tok_files:
            if not os.path.exists(src):
                sys.exit(f"make_random_qwen3.py: error: {src}: not found")
    os.makedirs(args.out_dir, exist_ok=True)
    if not args.config_only:
        check_free_space(args.out_dir, 2 * params)
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # cleans up too
        try:
            write_safetensors(os.path.join(args.out_dir, "model.safetensors"), tensors,
                              random.Random(args.seed))
        except KeyboardInterrupt:
            sys.exit("make_random_qwen3.py: interrupted; no model.safetensors written")
        except OSError as e:
            sys.exit(f"make_random_qwen3.py: error: {e.filename or args.out_dir}: {e.strerror or e}; "
                     "no model.safetensors written")
    for name, value in (("config.json", cfg), ("generation_config.json", generation_config(cfg))):
        with open(os.path.join(args.out_dir, name), "w", encoding="utf-8") as f:
            json.dump(value, f, indent=2)
    for src in tok_files:
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(args.out_dir, os.path.basename(src)))
    head = "tied head" if cfg.get("tie_word_embeddings", False) else "untied head"
    count = f"{params / 1e9:.3f}B" if params >= 1e8 else f"{params / 1e6:.3f}M"
    print(f"{args.out_dir}: {len(tensors)} tensors, {count} parameters, "
          f"{2 * params / 1e9:.2f} GB of BF16 weights (dim {cfg['hidden_size']}, "
          f"{cfg['num_hidden_layers']} layers, vocab {cfg['vocab_size']}, {head})"
          + ("; model.safetensors not written (--config-only)" if args.config_only else ""))


if __name__ == "__main__":
    main()
