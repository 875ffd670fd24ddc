#!/usr/bin/env python3
"""make_random_gguf.py: the random Qwen3 checkpoint's shape as a GGUF file, to run llama.cpp's own
llama-bench beside `./run -m bench` on the same machine.

    python3 tools/make_random_qwen3.py DIR                 # config.json (+ tokenizer.json)
    python3 tools/make_random_gguf.py DIR OUT.gguf --type q8_0|q4_0|bf16|f32
    llama-bench -m OUT.gguf -p 512 -n 128 -r 5 -t 1

Takes the shape from DIR/config.json (a Hugging Face Qwen3 or Qwen3-MoE folder: hidden size, layers,
heads, head_dim, vocabulary, rope_theta, rms_norm_eps, tied embeddings, experts) and the vocabulary and merges
from DIR/tokenizer.json when it is there (else placeholder tokens and no merges: enough for
llama-bench, which feeds random token ids). Every matrix gets the one type (as `llama-quantize
--pure` would; a plain llama-quantize to q4_0 would give the tied embedding/head q6_K), norms f32,
a MoE router f32 and wholly random (N(0, 1/hidden)), so that tokens spread over the experts.
The weights are not DIR's: like make_random_qwen3.py's they are a repeated random block (SCALE,
STD below). GGUF version 3, tensors aligned to 32 bytes, written to a temporary file and renamed
at the end, then dropped from the page cache (drop_from_page_cache). Python 3 standard library
only.
"""
import argparse
import json
import os
import random
import struct
import sys

GGML_TYPES = {"f32": 0, "q4_0": 2, "q8_0": 8, "bf16": 30}
# bytes per block and weights per block of each type
BLOCK = {"f32": (4, 1), "bf16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32)}
GGUF_U32, GGUF_F32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY, GGUF_I32 = 4, 6, 7, 8, 9, 5
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5
ALIGN = 32


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def metadata(cfg, tokenizer, name):
    """The key-value section: the llama.cpp `qwen3` architecture's keys and a gpt2-style BPE
    tokenizer."""
    kv = []

    def add(key, typ, payload):
        kv.append(gguf_string(key) + struct.pack("<I", typ) + payload)

    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or D // H
    arch = architecture(cfg)
    add("general.architecture", GGUF_STRING, gguf_string(arch))
    add("general.name", GGUF_STRING, gguf_string(name))
    add("general.alignment", GGUF_U32, struct.pack("<I", ALIGN))
    for key, value in (("context_length", cfg.get("max_position_embeddings", 40960)),
                       ("embedding_length", D), ("block_count", cfg["num_hidden_layers"]),
                       ("feed_forward_length", cfg["intermediate_size"]), ("attention.head_count", H),
                       ("attention.head_count_kv", cfg["num_key_value_heads"]),
                       ("attention.key_length", hd), ("attention.value_length", hd)):
        add(arch + "." + key, GGUF_U32, struct.pack("<I", value))
    if arch == "qwen3moe":
        for key, value in (("expert_count", cfg["num_experts"]), ("expert_used_count", cfg["num_experts_per_tok"]),
                           ("expert_feed_forward_length", cfg["moe_intermediate_size"])):
            add(arch + "." + key, GGUF_U32, struct.pack("<I", value))
    add(arch + ".rope.freq_base", GGUF_F32, struct.pack("<f", cfg.get("rope_theta", 1e6)))
    add(arch + ".attention.layer_norm_rms_epsilon", GGUF_F32, struct.pack("<f", cfg.get("rms_norm_eps", 1e-6)))

    V = cfg["vocab_size"]
    tokens, types, merges = [None] * V, [TOKEN_UNUSED] * V, []
    if tokenizer:
        for text, i in tokenizer["model"]["vocab"].items():
            if i < V:
                tokens[i], types[i] = text, TOKEN_NORMAL
        for a in tokenizer.get("added_tokens", []):
            if a["id"] < V:
                tokens[a["id"]], types[a["id"]] = a["content"], TOKEN_CONTROL
        merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    for i in range(V):
        if tokens[i] is None:
            tokens[i] = "[PAD%d]" % i
    add("tokenizer.ggml.model", GGUF_STRING, gguf_string("gpt2"))
    add("tokenizer.ggml.pre", GGUF_STRING, gguf_string("qwen2"))
    add("tokenizer.ggml.tokens", GGUF_ARRAY,
        struct.pack("<IQ", GGUF_STRING, V) + b"".join(gguf_string(t) for t in tokens))
    add("tokenizer.ggml.token_type", GGUF_ARRAY, struct.pack("<IQ", GGUF_I32, V) + struct.pack("<%di" % V, *types))
    add("tokenizer.ggml.merges", GGUF_ARRAY,
        struct.pack("<IQ", GGUF_STRING, len(merges)) + b"".join(gguf_string(m) for m in merges))
    eos = cfg.get("eos_token_id", 151645)
    bos = cfg.get("bos_token_id", 151643)
    for key, value in (("eos_token_id", eos), ("bos_token_id", bos), ("padding_token_id", bos)):
        if isinstance(value, int) and 0 <= value < V:
            add("tokenizer.ggml." + key, GGUF_U32, struct.pack("<I", value))
    add("tokenizer.ggml.add_bos_token", GGUF_BOOL, b"\x00")
    return kv


def architecture(cfg):
    """llama.cpp's architecture for the config: qwen3, or qwen3moe, whose every layer is sparse
    (it has no dense layers, so mlp_only_layers and decoder_sparse_step are refused)."""
    if "Qwen3MoeForCausalLM" not in cfg.get("architectures", []):
        return "qwen3"
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        sys.exit("make_random_gguf.py: llama.cpp's qwen3moe makes every layer sparse; this config has "
                 "mlp_only_layers or a decoder_sparse_step other than 1")
    return "qwen3moe"


def tensor_list(cfg):
    """(name, GGUF dims: innermost first, kind: MATRIX, VECTOR or ROUTER). llama.cpp's names for
    the Qwen3 and Qwen3-MoE tensors; a layer's experts are one 3-d tensor per projection."""
    D, F = cfg["hidden_size"], cfg["intermediate_size"]
    H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or D // H
    V = cfg["vocab_size"]
    moe = architecture(cfg) == "qwen3moe"
    out = [("token_embd.weight", (D, V), MATRIX)]
    for l in range(cfg["num_hidden_layers"]):
        p = "blk.%d." % l
        out += [(p + "attn_norm.weight", (D,), VECTOR), (p + "attn_q.weight", (D, H * hd), MATRIX),
                (p + "attn_k.weight", (D, K * hd), MATRIX), (p + "attn_v.weight", (D, K * hd), MATRIX),
                (p + "attn_output.weight", (H * hd, D), MATRIX), (p + "attn_q_norm.weight", (hd,), VECTOR),
                (p + "attn_k_norm.weight", (hd,), VECTOR), (p + "ffn_norm.weight", (D,), VECTOR)]
        if moe:
            E, Fe = cfg["num_experts"], cfg["moe_intermediate_size"]
            out += [(p + "ffn_gate_inp.weight", (D, E), ROUTER), (p + "ffn_gate_exps.weight", (D, Fe, E), MATRIX),
                    (p + "ffn_up_exps.weight", (D, Fe, E), MATRIX), (p + "ffn_down_exps.weight", (Fe, D, E), MATRIX)]
        else:
            out += [(p + "ffn_gate.weight", (D, F), MATRIX), (p + "ffn_up.weight", (D, F), MATRIX),
                    (p + "ffn_down.weight", (F, D), MATRIX)]
    out.append(("output_norm.weight", (D,), VECTOR))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("output.weight", (D, V), MATRIX))
    return out


MATRIX, VECTOR, ROUTER = "matrix", "vector", "router"

# The values: f32/bf16 weights N(0, 0.02^2); q8_0 blocks of uniform int8 with scale 0.0002, q4_0
# of uniform nibbles with scale 0.0004 (the speed does not depend on them).
SCALE = {"q8_0": 0.0002, "q4_0": 0.0004}
STD = 0.02


def random_blocks(typ, rng):
    """4096 weights' worth of `typ` data (whole quantization blocks)."""
    if typ in ("f32", "bf16"):
        f = struct.pack("<4096f", *[rng.gauss(0, STD) for _ in range(4096)])
        return f if typ == "f32" else b"".join(f[i + 2:i + 4] for i in range(0, len(f), 4))
    # q8_0: fp16 scale + 32 int8; q4_0: fp16 scale + 16 bytes of two nibbles (value = nibble - 8)
    n_bytes = 32 if typ == "q8_0" else 16
    return b"".join(struct.pack("<e", SCALE[typ]) + bytes(rng.randrange(256) for _ in range(n_bytes))
                    for _ in range(4096 // 32))


def write_repeated(f, pattern, size):
    """size bytes of pattern repeated (whole blocks: pattern holds whole quantization blocks),
    in pieces of about 8 MB."""
    piece = pattern * max(1, (8 << 20) // len(pattern))
    while size > 0:
        f.write(piece[:size])
        size -= min(size, len(piece))


def drop_from_page_cache(path):
    """Writes the file out and drops it from the page cache, so that the next reader reads it
    back (readahead fills large folios). llama.cpp maps the file as the page cache holds it, and
    a file just written sits there in 4 KB pages: q8_0 decode of the 0.6B shape, one thread, ran at
    20.9-24.5 tok/s on a freshly written file against 34.7-35.8 on the same file read back
    (alternating, 2-core Zen 5 VM). No effect where posix_fadvise does not exist."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir", help="a folder with config.json (and tokenizer.json), e.g. from make_random_qwen3.py")
    ap.add_argument("out")
    ap.add_argument("--type", choices=sorted(GGML_TYPES), default="q8_0")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    try:
        with open(os.path.join(a.hf_dir, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("make_random_gguf.py: %s: %s" % (os.path.join(a.hf_dir, "config.json"), e))
    tokenizer = None
    tok_path = os.path.join(a.hf_dir, "tokenizer.json")
    if os.path.exists(tok_path):
        with open(tok_path, encoding="utf-8") as f:
            tokenizer = json.load(f)

    kv = metadata(cfg, tokenizer, "random-qwen3-" + a.type)
    rng = random.Random(a.seed)
    infos, plan, offset = [], [], 0
    for name, dims, kind in tensor_list(cfg):
        typ = a.type if kind == MATRIX else "f32"
        n = 1
        for d in dims:
            n *= d
        per_block, weights_per_block = BLOCK[typ]
        if n % weights_per_block:
            sys.exit("make_random_gguf.py: %s has %d values, not a multiple of %s's block of %d"
                     % (name, n, typ, weights_per_block))
        size = n // weights_per_block * per_block
        infos.append(gguf_string(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", GGML_TYPES[typ], offset))
        plan.append((kind, size, dims[0]))
        offset += (size + ALIGN - 1) // ALIGN * ALIGN

    tmp = a.out + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, len(plan), len(kv)))
            for item in kv + infos:
                f.write(item)
            f.write(b"\0" * (-f.tell() % ALIGN))
            pattern = random_blocks(a.type, rng)
            router = None
            for kind, size, cols in plan:
                if kind == ROUTER:  # all of it random: a repeated block would tie experts' scores
                    router = router or struct.pack("<%df" % (size // 4),
                                                   *[rng.gauss(0, cols ** -0.5) for _ in range(size // 4)])
                write_repeated(f, {MATRIX: pattern, VECTOR: struct.pack("<f", 1.0), ROUTER: router}[kind], size)
                f.write(b"\0" * (-size % ALIGN))
        os.replace(tmp, a.out)
        drop_from_page_cache(a.out)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    print("make_random_gguf.py: wrote %s (%.1f MB, %s, %d tensors)" % (a.out, os.path.getsize(a.out) / 1e6,
                                                                      a.type, len(plan)))


if __name__ == "__main__":
    main()
