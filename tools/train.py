#!/usr/bin/python3
"""Train a tiny Qwen3 on TinyStories on the CPU and write it as a Hugging Face folder.

    /usr/bin/python3 tools/train.py --tokenizer build/tok --out-dir build/hf  [--resume] [options]

The model below is the Qwen3 dense decoder (QWEN3.md section 2), written to be read side by side
with the C engine's forward pass. The run checkpoints to --ckpt (resume with --resume); at the end
it writes --out-dir as a complete HF folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, generation_config.json) plus reference logits for a fixed prompt
(--ref-out, used by tests/test_shipped_model.py to check the C engine).
Other modes: --export-only (write the folder from the checkpoint), --sample N (stories from the
checkpoint with this file's own sampler).
"""
import argparse
import json
import math
import os
import random
import re
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/train_tokenizer.py
from train_tokenizer import Tokenizer  # noqa: E402


# ------------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight  (eps inside the sqrt; weight starts at ones)."""

    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim, seq_len, theta):
    """cos/sin [seq_len, head_dim]: frequency i is used by elements i and i + head_dim/2."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate-half (NeoX) pairing: element i pairs with element i + head_dim/2."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        D = c["hidden_size"]
        self.q_proj = nn.Linear(D, self.n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(D, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(D, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.hd, D, bias=False)
        self.q_norm = RMSNorm(self.hd, c["rms_norm_eps"])  # RMSNorm use 2 (QK-Norm): every query head
        self.k_norm = RMSNorm(self.hd, c["rms_norm_eps"])  # RMSNorm use 2 (QK-Norm): every key head

    def forward(self, h, cos, sin, mask):
        B, T, _ = h.shape
        q = self.q_proj(h).view(B, T, self.n_heads, self.hd)
        k = self.k_proj(h).view(B, T, self.n_kv, self.hd)
        v = self.v_proj(h).view(B, T, self.n_kv, self.hd)
        q, k = self.q_norm(q), self.k_norm(k)              # QK-norm: per head, before RoPE
        q = apply_rope(q.transpose(1, 2), cos, sin)        # [B, H, T, d]
        k = apply_rope(k.transpose(1, 2), cos, sin)        # [B, K, T, d]
        v = v.transpose(1, 2)
        g = self.n_heads // self.n_kv                      # GQA: query head j uses kv head j // g
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)  # scale 1/sqrt(head_dim)
        s = s.masked_fill(mask, float("-inf"))              # causal
        o = F.softmax(s, dim=-1) @ v                        # [B, H, T, d]
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, Fh = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(D, Fh, bias=False)
        self.up_proj = nn.Linear(D, Fh, bias=False)
        self.down_proj = nn.Linear(Fh, D, bias=False)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))  # SwiGLU


class Layer(nn.Module):
    def __init__(self, c, dropout):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])           # use 1: pre-attention
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])  # use 3: pre-MLP
        self.mlp = MLP(c)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, cos, sin, mask):
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        x = x + self.drop(self.mlp(self.post_attention_layernorm(x)))
        return x


class Qwen3(nn.Module):
    def __init__(self, c, dropout=0.0):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c, dropout) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])                      # use 4: final
        cos, sin = rope_tables(c["head_dim"], c["max_position_embeddings"], c["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        # init: N(0, 0.02); the two projections that write into the residual stream scaled down
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["num_hidden_layers"]) if name.endswith(
                    ("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.embed_tokens(ids)  # no scaling, no BOS
        cos, sin = self.cos[:T], self.sin[:T]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=ids.device), 1)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x) @ self.embed_tokens.weight.t()  # tied head: logits = E . x


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------

def load_stories(path):
    """Stories in these files are separated by a single newline; paragraphs by a blank line."""
    with open(path, encoding="utf-8") as f:
        text = f.read().strip("\n")
    return [s for s in re.split(r"(?<!\n)\n(?!\n)", text) if s.strip()]


def encode_stories(tok, stories, eot):
    ids = []
    for s in stories:
        ids.extend(tok.encode(s))
        ids.append(eot)  # <|endoftext|> after every story
    return torch.tensor(ids, dtype=torch.long)


def random_batch(data, batch, ctx, gen):
    ix = torch.randint(len(data) - ctx - 1, (batch,), generator=gen)
    x = torch.stack([data[i:i + ctx] for i in ix.tolist()])
    y = torch.stack([data[i + 1:i + 1 + ctx] for i in ix.tolist()])
    return x, y


@torch.no_grad()
def evaluate(model, data, ctx, max_windows=128):
    """Mean next-token loss over fixed, non-overlapping windows at the start of data."""
    model.eval()
    n = min(max_windows, (len(data) - 1) // ctx)
    tot = 0.0
    for b in range(0, n, 8):
        idx = list(range(b, min(n, b + 8)))
        x = torch.stack([data[i * ctx:(i + 1) * ctx] for i in idx])
        y = torch.stack([data[i * ctx + 1:(i + 1) * ctx + 1] for i in idx])
        logits = model(x)
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
    model.train()
    return tot / (n * ctx)


# ------------------------------------------------------------------------------------------------
# Export: Hugging Face folder
# ------------------------------------------------------------------------------------------------

def hf_tensors(model):
    """The exact HF names (QWEN3.md 3.3); lm_head omitted (tied)."""
    out = {"model.embed_tokens.weight": model.embed_tokens.weight}
    for l, layer in enumerate(model.layers):
        p = "model.layers.%d." % l
        a, m = layer.self_attn, layer.mlp
        out[p + "input_layernorm.weight"] = layer.input_layernorm.weight
        out[p + "self_attn.q_proj.weight"] = a.q_proj.weight
        out[p + "self_attn.k_proj.weight"] = a.k_proj.weight
        out[p + "self_attn.v_proj.weight"] = a.v_proj.weight
        out[p + "self_attn.o_proj.weight"] = a.o_proj.weight
        out[p + "self_attn.q_norm.weight"] = a.q_norm.weight
        out[p + "self_attn.k_norm.weight"] = a.k_norm.weight
        out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
        out[p + "mlp.gate_proj.weight"] = m.gate_proj.weight
        out[p + "mlp.up_proj.weight"] = m.up_proj.weight
        out[p + "mlp.down_proj.weight"] = m.down_proj.weight
    out["model.norm.weight"] = model.norm.weight
    return out


def write_safetensors(path, tensors):
    """8-byte LE header length, JSON header (dtype/shape/data_offsets), then F32 data, no gaps."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous().cpu()
        data = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)  # pad so the data starts at a multiple of 8
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def export_hf(model, c, tok_dir, out_dir, gen_cfg):
    os.makedirs(out_dir, exist_ok=True)
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": c["eot_id"],
        "eos_token_id": c["eot_id"],
        "head_dim": c["head_dim"],
        "hidden_act": "silu",
        "hidden_size": c["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": c["intermediate_size"],
        "max_position_embeddings": c["max_position_embeddings"],
        "max_window_layers": c["num_hidden_layers"],
        "model_type": "qwen3",
        "num_attention_heads": c["num_attention_heads"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_key_value_heads": c["num_key_value_heads"],
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": c["rope_theta"],
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": c["vocab_size"],
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    gen = {"bos_token_id": c["eot_id"], "do_sample": True, "eos_token_id": [c["eot_id"], c["im_end_id"]],
           "pad_token_id": c["eot_id"], "temperature": gen_cfg["temperature"], "top_p": gen_cfg["top_p"],
           "top_k": gen_cfg["top_k"], "transformers_version": "4.51.0"}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(tok_dir, name), "rb") as src, open(os.path.join(out_dir, name), "wb") as dst:
            dst.write(src.read())
    write_safetensors(os.path.join(out_dir, "model.safetensors"), hf_tensors(model))


REF_PROMPT = "Once upon a time, there was a little girl named Lily. She"


@torch.no_grad()
def write_reference(model, tok, path):
    """Float32 logits of every position of a fixed prompt: PATH (JSON: prompt, ids, shape) and
    PATH's .f32 sibling (raw little-endian float32, [len(prompt_ids), vocab_size], row per position,
    the layout of the C engine's --dump-logits)."""
    model.eval()
    ids = tok.encode(REF_PROMPT)
    logits = model(torch.tensor([ids]))[0].to(torch.float32).contiguous()
    raw = os.path.splitext(path)[0] + "_logits.f32"
    with open(raw, "wb") as f:
        f.write(logits.numpy().astype("<f4").tobytes())
    ref = {"prompt": REF_PROMPT, "prompt_ids": ids, "vocab_size": logits.shape[-1],
           "logits_file": os.path.basename(raw),
           "note": "float32 logits of train.py's model for prompt_ids, all positions"}
    with open(path, "w") as f:
        json.dump(ref, f, indent=1)
    model.train()


# ------------------------------------------------------------------------------------------------
# Sampling (this file's own; the C engine is the real one)
# ------------------------------------------------------------------------------------------------

@torch.no_grad()
def sample(model, ids, n, temperature, top_p, stop_ids, gen):
    model.eval()
    ids = list(ids)
    ctx = model.c["max_position_embeddings"]
    out = []
    for _ in range(n):
        logits = model(torch.tensor([ids[-ctx:]]))[0, -1]
        if temperature == 0:
            nxt = int(logits.argmax())
        else:
            probs = F.softmax(logits / temperature, dim=-1)
            sp, si = probs.sort(descending=True)
            keep = (sp.cumsum(0) - sp) < top_p  # smallest prefix whose mass reaches top_p
            sp = sp * keep
            nxt = int(si[torch.multinomial(sp / sp.sum(), 1, generator=gen)])
        if nxt in stop_ids:
            break
        ids.append(nxt)
        out.append(nxt)
    return out


def plot_svg(log, path, title):
    """A small hand-written SVG of training loss (per step, smoothed) and validation loss."""
    W, H, L, R, T, B = 640, 360, 56, 16, 28, 40
    steps = [e["step"] for e in log]
    sm, ema = [], None
    for e in log:
        ema = e["loss"] if ema is None else 0.9 * ema + 0.1 * e["loss"]
        sm.append(ema)
    val = [(e["step"], e["val"]) for e in log if "val" in e]
    lo = math.floor(min(sm + [v for _, v in val]) * 2) / 2
    hi = math.ceil(min(8.0, max(sm + [v for _, v in val])) * 2) / 2
    xmax = max(steps)

    def X(s):
        return L + (W - L - R) * s / xmax

    def Y(v):
        return T + (H - T - B) * (hi - min(v, hi)) / (hi - lo)

    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
         'font-size="11">' % (W, H), '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="16" font-size="13">%s</text>' % (L, title)]
    y = lo
    while y <= hi + 1e-9:
        o.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' % (L, W - R, Y(y), Y(y)))
        o.append('<text x="%d" y="%.1f" text-anchor="end">%.1f</text>' % (L - 4, Y(y) + 4, y))
        y += 0.5
    for k in range(6):
        s = xmax * k / 5
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (X(s), H - B + 16, s))
    o.append('<text x="%d" y="%d" text-anchor="middle">step</text>' % ((L + W - R) // 2, H - 6))
    o.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">loss (nats/token)</text>'
             % ((T + H - B) // 2, (T + H - B) // 2))
    o.append('<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="%s"/>'
             % " ".join("%.1f,%.1f" % (X(s), Y(v)) for s, v in zip(steps, sm)))
    o.append('<polyline fill="none" stroke="#d62728" stroke-width="1.5" points="%s"/>'
             % " ".join("%.1f,%.1f" % (X(s), Y(v)) for s, v in val))
    for s, v in val:
        o.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="#d62728"/>' % (X(s), Y(v)))
    o.append('<text x="%d" y="%d" fill="#1f77b4">train (EMA 0.9)</text>' % (W - R - 190, T + 14))
    o.append('<text x="%d" y="%d" fill="#d62728">validation</text>' % (W - R - 80, T + 14))
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


# ------------------------------------------------------------------------------------------------

def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * t))


def main():
    ap = argparse.ArgumentParser(description="train a tiny Qwen3 on TinyStories")
    ap.add_argument("--train", default="/work/shared/data/tinystories_train_head_cased.txt")
    ap.add_argument("--valid", default="/work/shared/data/tinystories_valid_subset.txt")
    ap.add_argument("--tokenizer", default="build/tok", help="folder with tokenizer.json")
    ap.add_argument("--ckpt", default="build/ckpt.pt")
    ap.add_argument("--best", default="build/best.pt", help="weights with the best validation loss")
    ap.add_argument("--out-dir", default="build/hf")
    ap.add_argument("--ref-out", default="models/tinystories_ref.json")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--export-only", action="store_true")
    ap.add_argument("--plot", help="write the loss curve of --ckpt's log as an SVG to this path")
    ap.add_argument("--sample", type=int, default=0, help="print N stories from the checkpoint")
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--sample-tokens", type=int, default=200)
    # model
    ap.add_argument("--dim", type=int, default=192)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--dropout", type=float, default=0.0)
    # optimisation
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=2e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=64, help="validation windows of --ctx tokens")
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--stop-by", default="", help="UTC HH:MM: stop early (and export) at this time")
    ap.add_argument("--temperature", type=float, default=0.8, help="written to generation_config")
    ap.add_argument("--top-p", type=float, default=0.9, help="written to generation_config")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.plot:
        st = torch.load(args.ckpt)
        plot_svg(st["log"], args.plot, "tiny Qwen3 on TinyStories: %d steps" % st["step"])
        return
    torch.manual_seed(args.seed)
    tok = Tokenizer(os.path.join(args.tokenizer, "tokenizer.json"))
    eot, im_end = tok.added["<|endoftext|>"], tok.added["<|im_end|>"]
    c = {"vocab_size": max(tok.added.values()) + 1, "hidden_size": args.dim, "num_hidden_layers": args.layers,
         "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "head_dim": args.head_dim,
         "intermediate_size": args.hidden, "max_position_embeddings": args.ctx, "rope_theta": args.rope_theta,
         "rms_norm_eps": 1e-6, "eot_id": eot, "im_end_id": im_end}

    state = None
    if args.resume:
        state = torch.load(args.ckpt)
        c = state["config"]
    elif args.export_only or args.sample:  # the exported weights are the best-validation ones
        state = torch.load(args.best)
        c = state["config"]
    model = Qwen3(c, args.dropout)
    if state is not None:
        model.load_state_dict(state["model"])
    n_params = sum(p.numel() for p in model.parameters())
    print("config %s\nparams %d (%.2f M)" % (json.dumps(c), n_params, n_params / 1e6), flush=True)
    gen_cfg = {"temperature": args.temperature, "top_p": args.top_p, "top_k": 0}

    if args.sample:
        g = torch.Generator().manual_seed(args.seed)
        for _ in range(args.sample):
            out = sample(model, tok.encode(args.prompt), args.sample_tokens, args.temperature, args.top_p,
                         {eot, im_end}, g)
            print(args.prompt + tok.decode(out))
            print("-----")
        return
    if args.export_only:
        export_hf(model, c, args.tokenizer, args.out_dir, gen_cfg)
        write_reference(model, tok, args.ref_out)
        print("exported %s and %s" % (args.out_dir, args.ref_out))
        return

    t0 = time.time()
    train_data = encode_stories(tok, load_stories(args.train), eot)
    valid_data = encode_stories(tok, load_stories(args.valid), eot)
    print("train tokens %d, valid tokens %d (%.1fs to tokenize)" % (len(train_data), len(valid_data),
                                                                  time.time() - t0), flush=True)

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    step, log = 0, []
    if state is not None:
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, log = state["step"], state["log"]
        print("resumed at step %d" % step, flush=True)

    def save():
        torch.save({"config": c, "model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "step": step, "log": log, "args": vars(args)}, args.ckpt + ".tmp")
        os.replace(args.ckpt + ".tmp", args.ckpt)

    tokens_per_step = args.batch * args.ctx
    best_val, best_step = min(((e["val"], e["step"]) for e in log if "val" in e), default=(float("inf"), 0))
    t_start, step_start = time.time(), step
    model.train()
    stopped_early = False
    while step < args.steps:
        lr = lr_at(step, args)
        for gr in opt.param_groups:
            gr["lr"] = lr
        x, y = random_batch(train_data, args.batch, args.ctx, gen)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        entry = {"step": step, "loss": loss.item(), "lr": lr, "time": time.time()}
        if step % args.eval_every == 0 or step == args.steps:
            entry["val"] = evaluate(model, valid_data, args.ctx, args.eval_windows)
            if entry["val"] < best_val:  # keep the weights with the best validation loss
                best_val, best_step = entry["val"], step
                torch.save({"config": c, "model": model.state_dict(), "step": step, "val": best_val},
                           args.best)
        log.append(entry)
        if step % 10 == 0 or "val" in entry:
            el = time.time() - t_start
            tps = (step - step_start) * tokens_per_step / el
            eta = (args.steps - step) * tokens_per_step / tps
            print("step %5d/%d  loss %.4f%s  lr %.2e  %.0f tok/s  elapsed %.1fm  ETA %.1fm  epoch %.2f"
                  % (step, args.steps, loss.item(), "  val %.4f" % entry["val"] if "val" in entry else "",
                     lr, tps, el / 60, eta / 60, step * tokens_per_step / len(train_data)), flush=True)
        if step % args.ckpt_every == 0:
            save()
        if args.stop_by and time.strftime("%H:%M", time.gmtime()) >= args.stop_by:
            print("stopping early at step %d (--stop-by %s)" % (step, args.stop_by), flush=True)
            stopped_early = True
            break
    if "val" not in log[-1]:
        log[-1]["val"] = evaluate(model, valid_data, args.ctx, args.eval_windows)
        if log[-1]["val"] < best_val:
            best_val, best_step = log[-1]["val"], step
            torch.save({"config": c, "model": model.state_dict(), "step": step, "val": best_val}, args.best)
    save()
    print("final step %d  train loss %.4f  val loss %.4f%s  (%.1f min)" % (
        step, log[-1]["loss"], log[-1]["val"], "  (stopped early)" if stopped_early else "",
        (time.time() - t_start) / 60), flush=True)
    model.load_state_dict(torch.load(args.best)["model"])
    print("exporting the weights of step %d (best validation loss %.4f)" % (best_step, best_val), flush=True)
    export_hf(model, c, args.tokenizer, args.out_dir, gen_cfg)
    write_reference(model, tok, args.ref_out)
    print("exported %s and %s" % (args.out_dir, args.ref_out), flush=True)
    full = evaluate(model, valid_data, args.ctx, max_windows=10 ** 9)
    print("validation loss of the exported weights over the whole validation file (%d tokens): %.4f"
          % ((len(valid_data) - 1) // args.ctx * args.ctx, full), flush=True)


if __name__ == "__main__":
    main()
