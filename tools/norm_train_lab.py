#!/usr/bin/python3
"""The RMSNorm training lab: the shipped model's shape trained from one seed with the norms in
different places, or left out, and what they do to the attention logits and the residual stream
while the model learns.

    /usr/bin/python3 tools/norm_train_lab.py                  # every variant, then the report
    /usr/bin/python3 tools/norm_train_lab.py --report-only    # the report again from the JSON
    /usr/bin/python3 tools/norm_train_lab.py --variants qwen3,post-norm --steps 20 ...

`make norm-lab` removes a norm from a model that was trained with it, so it shows what the trained
weights have come to depend on. This lab trains without the norm from the start, so it shows what
the norm does for training itself. Every variant is tools/train.py's Qwen3, built under one seed
(the same initial matrices) and fed the same batches in the same order; only the norms, or the
learning rate, differ.

Writes OUT_DIR/VARIANT.json for each variant (the training loss of every step, validation losses,
and every --probe-every steps, per layer: the largest attention logit q.k/sqrt(d), the rms of what
attention reads, the residual stream's rms after the layer), then the Markdown report (--report)
and its pictures (--svg-dir/norm-train-*.svg). Needs PyTorch: Debian's python3-torch, through
/usr/bin/python3, as tools/train.py.
"""
import argparse
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import sys
import time


def _threads_from_argv(default=1):
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return str(default)


# Set before torch loads its libraries: OpenBLAS starts one thread per core of its own unless told,
# which on a shared 2-core machine oversubscribes the cores (several times slower) and leaves the
# thread count, which the sums' order depends on, to the machine; idle OpenMP threads sleep
# instead of spinning on cores that others use.
THREADS = _threads_from_argv()
os.environ["OPENBLAS_NUM_THREADS"] = THREADS
os.environ["OMP_NUM_THREADS"] = THREADS
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    import torch  # noqa: E402
    import torch.nn as nn  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
except ImportError:
    sys.exit("norm_train_lab.py: needs PyTorch, which %s does not have: run it with Debian's python3 and "
             "python3-torch (`make norm-train-lab` does)" % sys.executable)

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
from train import (RMSNorm, Qwen3, apply_rope, load_stories, encode_stories,  # noqa: E402
                   random_batch, evaluate, lr_at)
import train_tokenizer  # noqa: E402
from plot_norms import FONT, esc, fmt_tick, legend, linear_ticks, log_ticks, write_svg  # noqa: E402

# ------------------------------------------------------------------------------------------------
# The variants
# ------------------------------------------------------------------------------------------------

# name -> placement of the block norms ("pre", "post", "none"), the norm ("rms", "layer", None),
# whether q and k heads are normalised (QK-Norm), whether the learning rate is --high-lr, and a
# description for the report.
VARIANTS = {
    "qwen3": ("pre", "rms", True, False,
              "as Qwen3: RMSNorm before attention and before the MLP, QK-Norm, a final norm"),
    "no-qk-norm": ("pre", "rms", False, False, "as Qwen3 without QK-Norm"),
    "post-norm": ("post", "rms", True, False,
                  "RMSNorm after each residual add, x = norm(x + f(x)) (the original Transformer's "
                  "placement), QK-Norm; the last block's norm is the final norm"),
    "no-norms": ("none", None, False, False, "no norm anywhere"),
    "layernorm": ("pre", "layer", True, False,
                  "as Qwen3 with LayerNorm (mean subtracted, gain and bias) in all four uses"),
    "qwen3-high-lr": ("pre", "rms", True, True, "as qwen3, at the high learning rate"),
    "no-qk-norm-high-lr": ("pre", "rms", False, True, "as no-qk-norm, at the high learning rate"),
}


class LayerNorm(nn.Module):
    """y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias: the LayerNorm that Zhang & Sennrich
    compare RMSNorm with (gain and bias; eps inside the sqrt as in RMSNorm)."""

    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight + self.bias


class PostNormLayer(nn.Module):
    """The original Transformer's placement: x = norm(x + attention(x)); x = norm(x + mlp(x)).
    Built from a train.py Layer, whose modules (and so whose initial weights) it keeps."""

    def __init__(self, layer):
        super().__init__()
        self.self_attn, self.mlp, self.drop = layer.self_attn, layer.mlp, layer.drop
        self.attn_norm = layer.input_layernorm          # after the attention's residual add
        self.mlp_norm = layer.post_attention_layernorm  # after the MLP's residual add

    def forward(self, x, cos, sin, mask):
        x = self.attn_norm(x + self.drop(self.self_attn(x, cos, sin, mask)))
        return self.mlp_norm(x + self.drop(self.mlp(x)))


def build_model(c, variant, seed):
    """train.py's Qwen3 under `seed`, its norms then swapped for the variant's. The norms take no
    random numbers, so every variant starts from the same matrices."""
    place, kind, qk_norm = VARIANTS[variant][:3]
    torch.manual_seed(seed)
    model = Qwen3(c)
    eps = c["rms_norm_eps"]

    def norm(n):
        return {"rms": RMSNorm, "layer": LayerNorm}[kind](n, eps) if kind else nn.Identity()

    for i, layer in enumerate(model.layers):
        layer.input_layernorm = norm(c["hidden_size"]) if place != "none" else nn.Identity()
        layer.post_attention_layernorm = norm(c["hidden_size"]) if place != "none" else nn.Identity()
        a = layer.self_attn
        a.q_norm = norm(c["head_dim"]) if qk_norm else nn.Identity()  # Identity: train.py's forward
        a.k_norm = norm(c["head_dim"]) if qk_norm else nn.Identity()  # then skips QK-Norm
        if place == "post":
            model.layers[i] = PostNormLayer(layer)
    # pre-norm reads the raw stream at the end and needs the final norm; post-norm's stream already
    # leaves the last block normalised
    model.norm = norm(c["hidden_size"]) if place == "pre" else nn.Identity()
    return model


# ------------------------------------------------------------------------------------------------
# What is measured
# ------------------------------------------------------------------------------------------------

def token_rms(t):
    """rms over the hidden (or head) dimension per token, then the mean over tokens."""
    return t.double().pow(2).mean(-1).sqrt().mean().item()


@torch.no_grad()
def probe(model, x):
    """One forward pass over the probe windows x, caught by hooks: per layer the largest attention
    logit q.k/sqrt(d) before softmax (over heads and causal pairs, q and k as the attention uses
    them: after QK-Norm where there is one, after RoPE), the rms of what attention reads, and the
    rms of the residual stream after the layer (resid_rms[0]: the embeddings)."""
    model.eval()
    caught, hooks = {}, []

    def keep(key):
        return lambda module, inp, out: caught.__setitem__(key, out)

    hooks.append(model.embed_tokens.register_forward_hook(keep(("out", -1))))
    for l, layer in enumerate(model.layers):
        a = layer.self_attn
        hooks.append(a.q_norm.register_forward_hook(keep(("q", l))))
        hooks.append(a.k_norm.register_forward_hook(keep(("k", l))))
        hooks.append(a.register_forward_pre_hook(lambda m, inp, l=l: caught.__setitem__(("in", l), inp[0])))
        hooks.append(layer.register_forward_hook(keep(("out", l))))
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    model.train()
    T = x.shape[1]
    cos, sin = model.cos[:T], model.sin[:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    max_logit = []
    for l, layer in enumerate(model.layers):
        a = layer.self_attn
        q = apply_rope(caught["q", l].transpose(1, 2), cos, sin)
        k = apply_rope(caught["k", l].transpose(1, 2), cos, sin).repeat_interleave(a.n_heads // a.n_kv, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(a.hd)
        max_logit.append(s.masked_fill(mask, float("-inf")).max().item())
    return {"max_logit": max_logit,
            "attn_in_rms": [token_rms(caught["in", l]) for l in range(len(model.layers))],
            "resid_rms": [token_rms(caught["out", l]) for l in range(-1, len(model.layers))]}


def finite(v):
    """JSON has no NaN or infinity: a diverged value is written as null."""
    return v if v is not None and math.isfinite(v) else None


def clean(o):
    if isinstance(o, float):
        return finite(o)
    if isinstance(o, dict):
        return {k: clean(v) for k, v in o.items()}
    if isinstance(o, list):
        return [clean(v) for v in o]
    return o


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------

def train_variant(variant, args, c, train_data, valid_data, probe_x, run_info):
    lr = args.high_lr if VARIANTS[variant][3] else args.lr
    model = build_model(c, variant, args.seed)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    sched = argparse.Namespace(lr=lr, min_lr=lr * args.min_lr_ratio, warmup=args.warmup, steps=args.steps)
    gen = torch.Generator().manual_seed(args.seed)  # the same batches, in the same order, for every variant
    losses, vals, probes = [], [], [dict(step=0, **probe(model, probe_x))]
    diverged, train_s = None, 0.0
    t_start = time.time()
    model.train()
    for step in range(1, args.steps + 1):
        t0 = time.time()
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step - 1, sched)
        x, y = random_batch(train_data, args.batch, args.ctx, gen)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        train_s += time.time() - t0
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            diverged = step
            print("  %s: loss %s at step %d: stopped" % (variant, losses[-1], step), flush=True)
            break
        last = step == args.steps
        if step % args.probe_every == 0 or last:
            probes.append(dict(step=step, **probe(model, probe_x)))
        if step % args.eval_every == 0 or last:
            vals.append({"step": step, "val": evaluate(model, valid_data, args.ctx, args.eval_windows)})
        if step % args.print_every == 0 or last:
            print("  %-20s step %4d/%d  loss %.4f%s  max logit %s  %.2f s/step" % (
                variant, step, args.steps, losses[-1],
                "  val %.4f" % vals[-1]["val"] if vals and vals[-1]["step"] == step else "",
                " ".join("%.1f" % v for v in probes[-1]["max_logit"]), train_s / step), flush=True)
    tail = [v for v in losses[-args.loss_tail:] if math.isfinite(v)]
    out = {
        "variant": variant,
        "description": VARIANTS[variant][4],
        "placement": VARIANTS[variant][0], "norm": VARIANTS[variant][1], "qk_norm": VARIANTS[variant][2],
        "lr": lr, "min_lr": sched.min_lr,
        "params": sum(p.numel() for p in model.parameters()),
        "config": c,
        "run": run_info,
        "loss": losses,
        "val": vals,
        "probes": probes,
        "diverged_at": diverged,
        "final": {"train_loss_tail": sum(tail) / len(tail) if tail and diverged is None else None,
                  "val": vals[-1]["val"] if vals and diverged is None else None},
        "train_seconds": train_s,
        "seconds_per_step": train_s / max(1, len(losses)),
        "wall_seconds": time.time() - t_start,
    }
    return clean(out)


def machine():
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                info.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    cpu = info.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in info:
        cpu += " (family %s, model %s)" % (info["cpu family"], info.get("model", "?"))
    return "%s, %d CPUs, %s %s" % (cpu, os.cpu_count() or 0, platform.system(), platform.release())


def blas():
    """The BLAS library this process loaded (Debian's torch takes whichever libblas.so.3 the system's
    alternatives point at; the bits of the products can differ between them)."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.rsplit("/", 1)[-1]}
    except OSError:
        return "unknown"
    return ", ".join(sorted(os.path.relpath(os.path.realpath(p), "/usr/lib") for p in libs)) or "none seen"


def tokenizer_dir(args):
    """--tokenizer, or tools/train_tokenizer.py's 2,048-token BPE of the training text, trained once
    into norm-train-lab-tok beside OUT_DIR (the procedure of the shipped model's tokenizer,
    docs/design.md)."""
    if args.tokenizer:
        return args.tokenizer
    d = os.path.join(os.path.dirname(os.path.abspath(args.out_dir)), "norm-train-lab-tok")
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        with open(args.train, encoding="utf-8") as f:
            text = f.read()
        tmp = d + ".tmp%d" % os.getpid()
        merges = train_tokenizer.train_bpe(text, 2048 - 256 - len(train_tokenizer.ADDED_TOKENS), log=False)
        train_tokenizer.write_tokenizer(tmp, merges)
        try:
            os.rename(tmp, d)
        except OSError:  # another run wrote it first: the same file (training is deterministic)
            shutil.rmtree(tmp, ignore_errors=True)
    return d


def valid_prefix(tok, path, need):
    """The first `need` tokens (or more) of the validation text: its opening lines, cut at a line
    end, encoded; the file is not tokenized further than the windows read."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    n = need * 6  # about 4 characters a token here
    while True:
        cut = text.rfind("\n", 0, n) if n < len(text) else len(text)
        ids = tok.encode(text[:max(cut, 1)].strip("\n"))
        if len(ids) >= need or n >= len(text):
            return torch.tensor(ids, dtype=torch.long)
        n *= 2


def run(args):
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out_dir, exist_ok=True)
    t0 = time.time()
    tok = train_tokenizer.Tokenizer(os.path.join(tokenizer_dir(args), "tokenizer.json"))
    eot = tok.added["<|endoftext|>"]
    stories = load_stories(args.train)
    if args.max_stories:
        stories = stories[:args.max_stories]
    train_data = encode_stories(tok, stories, eot)
    need = max(args.eval_windows, args.probe_windows) * args.ctx + 1
    valid_data = valid_prefix(tok, args.valid, need)
    print("train tokens %d, validation tokens read %d (%.1f s to tokenize)"
          % (len(train_data), len(valid_data), time.time() - t0), flush=True)
    probe_x = torch.stack([valid_data[i * args.ctx:(i + 1) * args.ctx] for i in range(args.probe_windows)])
    c = {"vocab_size": max(tok.added.values()) + 1, "hidden_size": args.dim, "num_hidden_layers": args.layers,
         "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "head_dim": args.head_dim,
         "intermediate_size": args.hidden, "max_position_embeddings": args.ctx, "rope_theta": 10000.0,
         "rms_norm_eps": 1e-6, "eot_id": eot, "im_end_id": tok.added["<|im_end|>"]}
    run_info = {
        "command": args.command,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(), "torch": torch.__version__, "blas": blas(), "python": platform.python_version(),
        "threads": args.threads, "seed": args.seed, "steps": args.steps, "batch": args.batch, "ctx": args.ctx,
        "warmup": args.warmup, "weight_decay": args.weight_decay, "clip": args.clip,
        "min_lr_ratio": args.min_lr_ratio, "lr": args.lr, "high_lr": args.high_lr,
        "eval_every": args.eval_every, "eval_windows": args.eval_windows,
        "probe_every": args.probe_every, "probe_windows": args.probe_windows, "loss_tail": args.loss_tail,
        "train_tokens": len(train_data), "train": os.path.basename(args.train),
        "valid": os.path.basename(args.valid), "variants": args.variants,
    }
    for v in args.variants:
        print("%s: %s" % (v, VARIANTS[v][4]), flush=True)
        out = train_variant(v, args, c, train_data, valid_data, probe_x, run_info)
        path = os.path.join(args.out_dir, v + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump(out, f, indent=None, separators=(",", ":"))
            f.write("\n")
        os.replace(path + ".tmp", path)
        print("  %s: final train loss %s, val %s, %.1f s; wrote %s" % (
            v, fmt(out["final"]["train_loss_tail"], 4), fmt(out["final"]["val"], 4), out["wall_seconds"], path),
            flush=True)
    total = time.time() - t0
    print("lab: %d variants in %.1f min" % (len(args.variants), total / 60), flush=True)
    return total


# ------------------------------------------------------------------------------------------------
# SVG, by hand, with tools/plot_norms.py's axes and legends
# ------------------------------------------------------------------------------------------------

COLORS = {"qwen3": "#1f77b4", "no-qk-norm": "#d62728", "post-norm": "#2ca02c", "no-norms": "#7f7f7f",
          "layernorm": "#9467bd", "qwen3-high-lr": "#17becf", "no-qk-norm-high-lr": "#ff7f0e"}
LAYER_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


class Panel:
    """One plot area at (x, y) of size (w, h), with its axes, ticks, title and axis labels."""

    def __init__(self, svg, x, y, w, h, xrange, yrange, title, xlabel, ylabel, ylog=False, xticks=None):
        self.svg, self.x, self.y, self.w, self.h, self.ylog = svg, x, y, w, h, ylog
        self.x0, self.x1 = xrange
        self.y0, self.y1 = (math.log10(yrange[0]), math.log10(yrange[1])) if ylog else yrange
        if self.x1 == self.x0:
            self.x1 += 1
        if self.y1 == self.y0:
            self.y1 += 1
        s = svg
        s.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="white" stroke="#444"/>' % (x, y, w, h))
        for v in xticks or linear_ticks(*xrange):
            X = self.px(v)
            s.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>' % (X, y, X, y + h))
            s.append('<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle" %s>%s</text>'
                     % (X, y + h + 14, FONT, esc(fmt_tick(v))))
        for v in log_ticks(*yrange) if ylog else linear_ticks(*yrange):
            Y = self.py(v)
            s.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>' % (x, Y, x + w, Y))
            s.append('<text x="%.1f" y="%.1f" font-size="11" text-anchor="end" %s>%s</text>'
                     % (x - 5, Y + 4, FONT, esc(fmt_tick(v))))
        s.append('<text x="%.1f" y="%.1f" font-size="13" font-weight="bold" text-anchor="middle" %s>%s</text>'
                 % (x + w / 2, y - 8, FONT, esc(title)))
        s.append('<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" %s>%s</text>'
                 % (x + w / 2, y + h + 32, FONT, esc(xlabel)))
        cx, cy = x - 48, y + h / 2
        s.append('<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" '
                 'transform="rotate(-90 %.1f %.1f)" %s>%s</text>' % (cx, cy, cx, cy, FONT, esc(ylabel)))

    def px(self, v):
        return self.x + (v - self.x0) / (self.x1 - self.x0) * self.w

    def py(self, v):
        t = math.log10(v) if self.ylog else v
        t = min(max(t, self.y0), self.y1)  # off-scale values sit on the frame
        return self.y + self.h - (t - self.y0) / (self.y1 - self.y0) * self.h

    def line(self, pts, color, dash=False, width=1.8, marker=False):
        pts = [(a, b) for a, b in pts if b is not None and (b > 0 or not self.ylog)]
        if not pts:
            return
        d = " ".join("%.1f,%.1f" % (self.px(a), self.py(b)) for a, b in pts)
        self.svg.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="%.1f"%s/>'
                        % (d, color, width, ' stroke-dasharray="6,4"' if dash else ""))
        if marker:
            for a, b in pts:
                self.svg.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (self.px(a), self.py(b), color))

    def mark(self, x, y, color, label):
        """A cross where a run stopped, with a label."""
        X, Y = self.px(x), self.py(y)
        self.svg.append('<path d="M%.1f,%.1f l8,8 m0,-8 l-8,8" stroke="%s" stroke-width="2"/>' % (X - 4, Y - 4, color))
        self.svg.append('<text x="%.1f" y="%.1f" font-size="11" text-anchor="end" fill="%s" %s>%s</text>'
                        % (X - 6, Y - 6, color, FONT, esc(label)))


def ema(values, a=0.9):
    out, m = [], None
    for v in values:
        if v is None:
            break
        m = v if m is None else a * m + (1 - a) * v
        out.append(m)
    return out


def plot_loss(runs, path, note):
    """Training loss (EMA 0.9) against the step for every variant, validation losses as dots: the
    whole run, and its second half on a finer scale (where the variants' differences are)."""
    body = []
    steps = max(r["run"]["steps"] for r in runs.values())
    vocab = runs[next(iter(runs))]["config"]["vocab_size"]
    pw, ph = 440, 360
    for i, first in enumerate((0, steps // 2)):
        vals = [v for r in runs.values() for k, v in enumerate(ema(r["loss"])) if k + 1 >= max(first, 5)] + \
               [e["val"] for r in runs.values() for e in r["val"] if e["val"] is not None and e["step"] >= first]
        if not vals:
            continue
        hi = min(math.log(vocab) + 0.5, max(vals))
        lo = min(vals)
        pad = 0.04 * (hi - lo if hi > lo else 1.0)
        panel = Panel(body, 90 + i * (pw + 90), 80, pw, ph, (first, steps), (lo - pad, hi + pad),
                      "the whole run" if first == 0 else "steps %d-%d, finer scale" % (first, steps),
                      "step", "loss (nats/token)")
        for name, r in runs.items():
            sm = ema(r["loss"])
            panel.line([(k + 1, v) for k, v in enumerate(sm) if k + 1 >= first], COLORS.get(name, "#000"), width=1.6)
            for e in r["val"]:
                if e["val"] is not None and e["step"] >= first:
                    body.append('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s" stroke="white"/>'
                                % (panel.px(e["step"]), panel.py(e["val"]), COLORS.get(name, "#000")))
            if r["diverged_at"] and r["diverged_at"] >= first:
                panel.mark(r["diverged_at"], hi, COLORS.get(name, "#000"),
                           "%s: not finite at step %d" % (name, r["diverged_at"]))
    x = 90 + 2 * (pw + 90) - 50
    y = legend(body, x, 100, [("%s (lr %g)" % (n, r["lr"]), COLORS.get(n, "#000"), False) for n, r in runs.items()],
               "variant")
    body.append('<circle cx="%.1f" cy="%.1f" r="3.5" fill="#333"/>' % (x + 14, y + 6))
    body.append('<text x="%.1f" y="%.1f" font-size="12" %s>validation loss</text>' % (x + 36, y + 10, FONT))
    body.append('<text x="%.1f" y="%.1f" font-size="12" %s>lines: training loss, EMA 0.9</text>' % (x, y + 34, FONT))
    write_svg(path, x + 250, 80 + ph + 70, body, "Loss against step: one seed, the same batches for every variant",
              note)


def plot_logits(runs, path, note):
    """The largest attention logit of each layer against the step: one panel per learning rate,
    solid with QK-Norm, dashed without; log axis."""
    pairs = [("qwen3", "no-qk-norm"), ("qwen3-high-lr", "no-qk-norm-high-lr")]
    pairs = [(a, b) for a, b in pairs if a in runs or b in runs]
    if not pairs:
        return False
    vals = [v for a, b in pairs for n in (a, b) if n in runs for p in runs[n]["probes"]
            for v in p["max_logit"] if v is not None and v > 0]
    if not vals:
        return False
    yr = (10 ** math.floor(math.log10(min(vals))), 10 ** math.ceil(math.log10(max(vals))))
    steps = max(r["run"]["steps"] for r in runs.values())
    body, pw, ph = [], 420, 340
    layers = 0
    for i, (a, b) in enumerate(pairs):
        lr = runs[a if a in runs else b]["lr"]
        panel = Panel(body, 90 + i * (pw + 90), 80, pw, ph, (0, steps), yr, "learning rate %g" % lr, "step",
                      "largest q.k/sqrt(d) per layer (log scale)", ylog=True)
        for name, dash in ((a, False), (b, True)):
            if name not in runs:
                continue
            probes = runs[name]["probes"]
            layers = max(layers, len(probes[0]["max_logit"]))
            for l in range(len(probes[0]["max_logit"])):
                panel.line([(p["step"], p["max_logit"][l]) for p in probes], LAYER_COLORS[l % len(LAYER_COLORS)],
                           dash=dash)
        bound = math.sqrt(runs[a if a in runs else b]["config"]["head_dim"])
        if yr[0] < bound < yr[1]:
            Y = panel.py(bound)
            body.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-width="1" '
                        'stroke-dasharray="2,3"/>' % (panel.x, Y, panel.x + pw, Y))
    x = 90 + len(pairs) * (pw + 90) - 50
    y = legend(body, x, 100, [("layer %d" % (l + 1), LAYER_COLORS[l % len(LAYER_COLORS)], False)
                              for l in range(layers)], "colour: layer")
    y = legend(body, x, y + 20, [("with QK-Norm", "#333", False), ("without QK-Norm", "#333", True)], "line")
    hd = runs[next(iter(runs))]["config"]["head_dim"]
    body.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="2,3"/>'
                % (x, y - 4, x + 28, y - 4))
    body.append('<text x="%.1f" y="%.1f" font-size="12" %s>sqrt(d) = %.2f: the largest logit</text>'
                % (x + 36, y, FONT, math.sqrt(hd)))
    body.append('<text x="%.1f" y="%.1f" font-size="12" %s>QK-Norm allows at unit weights</text>' % (x + 36, y + 16, FONT))
    write_svg(path, x + 250, 80 + ph + 70, body, "Largest attention logit against step, with and without QK-Norm", note)
    return True


def plot_resid(runs, path, note):
    """Residual stream rms against depth, one panel per placement (pre-norm at both learning rates,
    post-norm, no norms):
    the stream, and at the same depth the rms of what the next layer's attention reads from it
    (after its pre-norm, if any), at the end of training and, faint, at step 0. Log axis."""
    names = [n for n in ("qwen3", "qwen3-high-lr", "post-norm", "no-norms") if n in runs]
    if not names:
        return False
    vals = []
    for n in names:
        for p in (runs[n]["probes"][0], runs[n]["probes"][-1]):
            vals += [v for v in p["resid_rms"] + p["attn_in_rms"] if v is not None and v > 0]
    yr = (10 ** math.floor(math.log10(min(vals))), 10 ** math.ceil(math.log10(max(vals))))
    L = len(runs[names[0]]["probes"][0]["attn_in_rms"])
    titles = {"qwen3": "pre-norm (qwen3)", "post-norm": "post-norm", "no-norms": "no norms",
              "qwen3-high-lr": "pre-norm, lr %g (qwen3-high-lr)" % runs.get("qwen3-high-lr", {}).get("lr", 0)}
    stream, reads = "#1f77b4", "#ff7f0e"
    body, pw, ph = [], 270, 340
    for i, n in enumerate(names):
        panel = Panel(body, 90 + i * (pw + 80), 80, pw, ph, (-0.2, L + 0.2), yr, titles[n],
                      "depth (0: the embeddings; l: after layer l)", "rms (log scale)", ylog=True,
                      xticks=list(range(L + 1)))
        first, last = runs[n]["probes"][0], runs[n]["probes"][-1]
        panel.line(list(enumerate(first["resid_rms"])), "#b9d3ea", width=1.4, marker=True)
        panel.line(list(enumerate(first["attn_in_rms"])), "#fcd2ad", dash=True, width=1.4, marker=True)
        panel.line(list(enumerate(last["resid_rms"])), stream, width=2.2, marker=True)
        panel.line(list(enumerate(last["attn_in_rms"])), reads, dash=True, width=2.2, marker=True)
    x = 90 + len(names) * (pw + 80) - 40
    legend(body, x, 100, [("the residual stream", stream, False),
                          ("what the next layer's attention", reads, True),
                          ("   reads from it", "none", False),
                          ("faint: the same at step 0", "none", False)], "at the end of training")
    write_svg(path, x + 250, 80 + ph + 70, body, "Residual stream rms against depth: what each layer's attention "
              "reads stays at 1 with pre-norm, whatever the stream's scale", note)
    return True


# ------------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------------

def fmt(v, digits=3):
    if v is None:
        return "not finite"
    if abs(v) >= 1e4 or (v != 0 and abs(v) < 1e-3):
        return "%.2e" % v
    return "%.*f" % (digits, v)


def peak(r, l=None):
    """The largest attention logit over the run (of layer l, or of every layer)."""
    vals = [v for p in r["probes"] for i, v in enumerate(p["max_logit"]) if v is not None and (l is None or i == l)]
    return max(vals) if vals else None


def end_max(r):
    vals = [v for v in r["probes"][-1]["max_logit"] if v is not None]
    return max(vals) if vals and r["diverged_at"] is None else None


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def spike(r):
    """(step, loss) of the largest training loss after step 1, or None when no step's loss exceeds
    the first one's: a loss spike is a step that undoes what training had reached."""
    vals = [(i + 1, v) for i, v in enumerate(r["loss"]) if v is not None]
    if len(vals) < 2:
        return None
    step, worst = max(vals[1:], key=lambda sv: sv[1])
    return (step, worst) if worst > vals[0][1] else None


def diff(a, b):
    va, vb = a["final"]["val"], b["final"]["val"]
    return va - vb if va is not None and vb is not None else None


def early(r):
    """(first step, last step, mean training loss) over the first tenth of the run."""
    n = max(1, r["run"]["steps"] // 10)
    vals = r["loss"][:n]
    if len(vals) < n or any(v is None for v in vals):
        return None
    return 1, n, sum(vals) / n


def claims(runs, lines, unigram, not_shown):
    """The handout's claims, each beside the paper it tests, as measurements. The wording follows
    the numbers: what this run does not show is said, here and in `not_shown`."""
    R = runs.get
    q, nq, qh, nqh = R("qwen3"), R("no-qk-norm"), R("qwen3-high-lr"), R("no-qk-norm-high-lr")
    lines.append("## The claims, measured\n")

    lines.append("### QK-Norm keeps the attention logits from growing\n")
    lines.append("Dehghani et al. 2023, *Scaling Vision Transformers to 22 Billion Parameters*: without "
                 "QK-Norm the attention logits of a large ViT grow until the softmax saturates and training "
                 "diverges. Wortsman et al. 2023, *Small-scale proxies for large-scale Transformer training "
                 "instabilities*: the same logit growth appears in small models at high learning rates, and "
                 "QK-layernorm removes it.\n")
    pairs = [(w, wo) for w, wo in ((q, nq), (qh, nqh)) if w and wo]
    if pairs:
        hd = pairs[0][0]["config"]["head_dim"]
        lines.append("| learning rate | largest logit at step 0, with QK-Norm | without | at the end, with | without | "
                     "without / with | validation loss with | without | without minus with |")
        lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for w, wo in pairs:
            d = diff(wo, w)
            lines.append("| %g | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                w["lr"], fmt(max(w["probes"][0]["max_logit"]), 2), fmt(max(wo["probes"][0]["max_logit"]), 2),
                fmt(end_max(w), 2), fmt(end_max(wo), 2), fmt(ratio(end_max(wo), end_max(w)), 1),
                fmt(w["final"]["val"], 4), fmt(wo["final"]["val"], 4), "%+.4f" % d if d is not None else "n/a"))
        lines.append("")
        say = ["QK-Norm sets every q and k head to rms 1 (times the norm's weight), so with unit weights a "
               "logit q.k/sqrt(d) cannot exceed sqrt(d) = %s; past it, only through the learned weights. That is "
               "also why the logits start larger with QK-Norm: the initial projections are small (rms about "
               "0.02), and the norm scales them up." % fmt(math.sqrt(hd), 2)]
        for w, wo in pairs:
            r0 = ratio(end_max(wo), end_max(w))
            if wo["diverged_at"] and not w["diverged_at"]:
                say.append("At learning rate %g the run without QK-Norm stopped with a non-finite loss at step %d; "
                           "with QK-Norm it finished (validation loss %s)." % (
                               wo["lr"], wo["diverged_at"], fmt(w["final"]["val"], 4)))
            elif r0 is not None:
                say.append("At learning rate %g the largest logit ends at %s with QK-Norm and %s without (%sx)%s." % (
                    w["lr"], fmt(end_max(w), 1), fmt(end_max(wo), 1), fmt(r0, 1),
                    "" if r0 > 1.5 else ": no growth to speak of without the norm"))
            sw, swo = spike(w), spike(wo)
            if swo and not sw:
                say.append("Without QK-Norm the training loss spikes to %s at step %d, above the %s of step 1 "
                           "(uniform guessing over %d tokens is %s); with it, no step's loss exceeds step 1's." % (
                               fmt(swo[1], 2), swo[0], fmt(wo["loss"][0], 2), w["config"]["vocab_size"],
                               fmt(math.log(w["config"]["vocab_size"]), 2)))
            elif sw or swo:
                say.append("Loss spikes above step 1's loss: %s with QK-Norm, %s without." % (
                    "%s at step %d" % (fmt(sw[1], 2), sw[0]) if sw else "none",
                    "%s at step %d" % (fmt(swo[1], 2), swo[0]) if swo else "none"))
            d = diff(wo, w)
            if d is not None:
                say.append("Validation loss without QK-Norm minus with it: %+.4f%s." % (
                    d, " (QK-Norm helps)" if d > 0.02 else " (the model without QK-Norm is slightly better)"
                    if d < -0.02 else " (no difference to speak of)"))
        lines.append(" ".join(say) + "\n")
        if len(pairs) == 2:
            d_low, d_high = diff(pairs[0][1], pairs[0][0]), diff(pairs[1][1], pairs[1][0])
            if d_low is not None and d_high is not None:
                lines.append("QK-Norm is worth %+.4f nats/token at learning rate %g and %+.4f at %g: %s\n" % (
                    d_low, pairs[0][0]["lr"], d_high, pairs[1][0]["lr"],
                    "it matters most at the high learning rate, where the logits without it grow the most, as "
                    "Wortsman et al. report." if d_high > d_low + 0.02 else
                    "this run does not show it mattering more at the high learning rate."))
                if d_low < 0.02:
                    not_shown.append("QK-Norm helping at tools/train.py's learning rate (%g): the logits grow "
                                     "without it, but in %d steps that costs no loss (without QK-Norm minus with "
                                     "it: %+.4f)." % (pairs[0][0]["lr"], pairs[0][0]["run"]["steps"], d_low))
        if not any(r["diverged_at"] for r in runs.values()):
            not_shown.append("Divergence. No run's loss became non-finite; the papers' runs without QK-Norm "
                             "diverge. What shows here is the logit growth, %sand a worse loss." % (
                                 "an early loss spike " if any(spike(r) for r in runs.values()) else ""))

    pre, post = R("qwen3"), R("post-norm")
    lines.append("### Pre-norm: the stream grows with depth, each block reads a unit-scale input; "
                 "post-norm is harder to train\n")
    lines.append("Xiong et al. 2020, *On Layer Normalization in the Transformer Architecture*: with the "
                 "norm before each block (Pre-LN) the residual stream is a sum that grows with depth while "
                 "every block reads a normalised input, and the gradients are well behaved at "
                 "initialisation; with the norm after the residual add (Post-LN) the gradients near the "
                 "output are large at initialisation, so Post-LN needs a small learning rate and a long "
                 "warm-up, and trains more slowly.\n")
    if pre and post:
        L = len(pre["probes"][-1]["attn_in_rms"])
        rows = [(pre, "pre-norm (qwen3)"), (R("qwen3-high-lr"), "pre-norm at lr %g (qwen3-high-lr)" % (
            R("qwen3-high-lr") or {}).get("lr", 0)), (post, "post-norm")]
        lines.append("| at the end of training | " + " | ".join(
            ["embeddings"] + ["after layer %d" % (l + 1) for l in range(L)]) + " |")
        lines.append("|---|" + "---:|" * (L + 1))
        for r, label in rows:
            if not r:
                continue
            p = r["probes"][-1]
            lines.append("| %s: residual stream rms | %s |" % (label, " | ".join(fmt(v, 3) for v in p["resid_rms"])))
            lines.append("| %s: rms of what the next attention reads | %s | |" % (
                label, " | ".join(fmt(v, 3) for v in p["attn_in_rms"])))
        lines.append("")
        pr, pa = pre["probes"][-1]["resid_rms"], pre["probes"][-1]["attn_in_rms"]
        say = ["In the pre-norm model the stream's rms goes from %s (embeddings) to %s after layer 1, then %s "
               "after layer %d: %sx over the last %d layers%s. What each attention reads stays at %s-%s." % (
                   fmt(pr[0], 3), fmt(pr[1], 3), fmt(pr[-1], 3), L, fmt(pr[-1] / pr[1], 2), L - 1,
                   ", so it grows with depth" if pr[-1] > 1.5 * pr[1] else
                   ", so past the first layer it grows little with depth here", fmt(min(pa), 2), fmt(max(pa), 2))]
        if pr[-1] <= 1.5 * pr[1]:
            not_shown.append("Much growth of the pre-norm stream with depth: with %d layers it grows %sx from "
                             "layer 1 to layer %d (most of the growth is the first layer's)." % (
                                 L, fmt(pr[-1] / pr[1], 2), L))
        h = R("qwen3-high-lr")
        if h and not h["diverged_at"]:
            hp = h["probes"][-1]
            say.append("The norm's point shows best at learning rate %g, where the stream reaches %s after layer %d "
                       "and the attention still reads %s-%s." % (
                           h["lr"], fmt(hp["resid_rms"][-1], 1), L, fmt(min(hp["attn_in_rms"]), 2),
                           fmt(max(hp["attn_in_rms"]), 2)))
        po = [v for v in post["probes"][-1]["resid_rms"][1:] if v is not None]
        if po:
            say.append("Post-norm renormalises the stream after every block (%s-%s after each layer), so its first "
                       "layer's attention reads the raw embeddings (rms %s) and every later one reads rms 1." % (
                           fmt(min(po), 2), fmt(max(po), 2), fmt(post["probes"][-1]["attn_in_rms"][0], 3)))
        lines.append(" ".join(say) + "\n")
        d = diff(post, pre)
        say = []
        if post["diverged_at"]:
            say.append("Post-norm stopped with a non-finite loss at step %d." % post["diverged_at"])
        elif d is not None:
            say.append("Validation loss: post-norm %s, pre-norm %s (%+.4f)." % (
                fmt(post["final"]["val"], 4), fmt(pre["final"]["val"], 4), d))
            if unigram is not None and abs(post["final"]["val"] - unigram) < 0.1:
                say.append("That is the loss of predicting each token by its frequency alone, ignoring the context "
                           "(%s on these windows): in %d steps at learning rate %g with a warm-up of %d steps, "
                           "post-norm learned which tokens are common and not to use the context." % (
                               fmt(unigram, 4), post["run"]["steps"], post["lr"], post["run"]["warmup"]))
            if d > 0.02:
                say.append("Post-norm trains worse in the same budget, as Xiong et al. report.")
                not_shown.append("Whether post-norm catches up with Xiong et al.'s remedy, a smaller learning "
                                 "rate or a longer warm-up: every variant here has the same schedule.")
            else:
                say.append("With %d layers and a warm-up of %d steps post-norm trains about as well as pre-norm: this "
                           "run does not show Xiong et al.'s difficulty." % (L, pre["run"]["warmup"]))
                not_shown.append("Post-norm's difficulty: with %d layers it trains as well as pre-norm." % L)
        e_pre, e_post = early(pre), early(post)
        if e_pre and e_post:
            say.append("Early on (mean training loss over steps %d-%d): pre-norm %s, post-norm %s." % (
                e_pre[0], e_pre[1], fmt(e_pre[2], 3), fmt(e_post[2], 3)))
        lines.append(" ".join(say) + "\n")

    ln, rms = R("layernorm"), R("qwen3")
    lines.append("### RMSNorm against LayerNorm\n")
    lines.append("Zhang & Sennrich 2019, *Root Mean Square Layer Normalization*: dropping LayerNorm's "
                 "re-centring (the mean subtraction) costs no quality, and RMSNorm is cheaper to compute "
                 "(7%-64% faster in their models).\n")
    if ln and rms:
        d = diff(ln, rms)
        say = ["Validation loss: LayerNorm %s, RMSNorm %s (%s)." % (
            fmt(ln["final"]["val"], 4), fmt(rms["final"]["val"], 4), "%+.4f" % d if d is not None else "n/a")]
        if d is not None and abs(d) < 0.02:
            say.append("The two train alike here (under 0.02 nats/token apart), as the paper reports.")
        elif d is not None:
            say.append("%s in this run, by more than 0.02 nats/token; with one seed and %d steps this lab cannot "
                       "say whether that would last." % ("LayerNorm is worse" if d > 0 else "LayerNorm is better",
                                                        ln["run"]["steps"]))
            not_shown.append("The paper's equal quality: LayerNorm ends %+.4f nats/token from RMSNorm here (one "
                             "seed, %d steps)." % (d, ln["run"]["steps"]))
        say.append("Time a training step: LayerNorm %.3f s, RMSNorm %.3f s." % (
            ln["seconds_per_step"], rms["seconds_per_step"]))
        lines.append(" ".join(say) + "\n")

    nn_ = R("no-norms")
    lines.append("### No norms at all\n")
    if nn_ and rms:
        say = []
        if nn_["diverged_at"]:
            say.append("Without any norm the loss stopped being finite at step %d." % nn_["diverged_at"])
        else:
            say.append("Without any norm the model reaches validation loss %s (qwen3: %s, %+.4f)." % (
                fmt(nn_["final"]["val"], 4), fmt(rms["final"]["val"], 4), diff(nn_, rms)))
        s = spike(nn_)
        if s:
            say.append("Its training loss spikes to %s at step %d, during the warm-up." % (fmt(s[1], 2), s[0])
                       if s[0] <= nn_["run"]["warmup"] else
                       "Its training loss spikes to %s at step %d." % (fmt(s[1], 2), s[0]))
        p = nn_["probes"][-1]
        if p["resid_rms"][-1] is not None:
            say.append("Each layer reads the raw stream, whose rms goes from %s (embeddings) to %s after the last "
                       "layer." % (fmt(p["resid_rms"][0], 3), fmt(p["resid_rms"][-1], 3)))
        lines.append(" ".join(say) + "\n")


def write_report(runs, args, total_s, svgs):
    any_run = runs[next(iter(runs))]
    ri = any_run["run"]
    c = any_run["config"]
    tokens_step = ri["batch"] * ri["ctx"]
    blas_libs = ", ".join(b.split("/", 1)[-1] if b.split("/", 1)[0].endswith("-linux-gnu") else b
                          for b in ri.get("blas", "unknown").split(", "))
    lines = ["# The RMSNorm training lab: the shipped model's shape trained with each norm placement\n"]
    lines.append("Generated by `make norm-train-lab` (`%s`); do not edit by hand." % ri["command"])
    lines.append("Run on %s: %s; PyTorch %s with BLAS %s, %d thread%s; the %d variants trained in %.1f minutes. "
                 "Seed %d. Budget: %d steps of %d windows of %d tokens each (%d tokens a step, %.2f epochs of the "
                 "%d-token training text), AdamW (beta 0.9 / 0.95, weight decay %g on matrices), gradient clipping "
                 "%g, warm-up %d steps then cosine to 1/%g of the peak learning rate, no dropout." % (
                     ri["date"], ri["machine"], ri["torch"], blas_libs, ri["threads"],
                     "" if ri["threads"] == 1 else "s", len(runs), total_s / 60, ri["seed"],
                     ri["steps"], ri["batch"], ri["ctx"], tokens_step, ri["steps"] * tokens_step / ri["train_tokens"],
                     ri["train_tokens"], ri["weight_decay"], ri["clip"], ri["warmup"], 1 / ri["min_lr_ratio"]))
    lines.append("")
    lines.append("`make norm-lab` ([norm-lab.md](norm-lab.md)) removes a norm from a model that was trained with "
                 "it, so it shows what the trained weights have come to depend on. Here each variant is trained "
                 "with its norms from the start, so it shows what the norms do for training: tools/train.py's "
                 "Qwen3 in the shipped model's shape (hidden %d, %d layers, %d heads and %d kv heads of %d, MLP "
                 "%d, context %d, vocabulary %d, tied head), built under one seed so that every variant starts "
                 "from the same matrices, and fed the same batches of %s in the same order. A rerun on the same "
                 "machine, with the same BLAS and thread count, gives the same losses bit for bit."
                 % (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"],
                    c["head_dim"], c["intermediate_size"], c["max_position_embeddings"], c["vocab_size"], ri["train"]))
    lines.append("")
    lines.append("Measured: the training loss of every step (the table's is the mean of the last %d steps); the "
                 "validation loss every %d steps and at the end, over the first %d windows of %d tokens of %s "
                 "(predicting each token by its training-text frequency alone, ignoring the context, scores %s "
                 "there); and every %d steps, on the first %d of those windows, per layer: the largest attention "
                 "logit q.k/sqrt(d) before softmax (over heads and causal pairs, q and k as attention uses them, "
                 "after QK-Norm and RoPE), the rms of what the layer's attention reads, and the rms of the residual "
                 "stream after the layer (rms over the hidden dimension per token, then the mean over tokens)."
                 % (ri["loss_tail"], ri["eval_every"], ri["eval_windows"], ri["ctx"], ri["valid"],
                    fmt(args.unigram, 4), ri["probe_every"], ri["probe_windows"]))
    lines.append("")
    lines.append("| variant | what changes | learning rate | parameters | train loss | validation loss | "
                 "largest attention logit at the end (over layers) | largest during the run | residual rms after "
                 "the last layer | s / step |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in runs.items():
        lines.append("| `%s` | %s | %g | %d | %s | %s | %s | %s | %s | %.3f |" % (
            name, r["description"], r["lr"], r["params"],
            fmt(r["final"]["train_loss_tail"], 4) if not r["diverged_at"]
            else "not finite at step %d" % r["diverged_at"],
            fmt(r["final"]["val"], 4), fmt(end_max(r), 2), fmt(peak(r), 2),
            fmt(r["probes"][-1]["resid_rms"][-1] if not r["diverged_at"] else None, 3), r["seconds_per_step"]))
    lines.append("")
    lines.append("s / step is wall time on a 2-core machine shared with other work, a rough figure: the norms are a "
                 "small share of a %d-wide model's arithmetic, and the differences between variants here are "
                 "mostly the machine's load.\n" % c["hidden_size"])
    if svgs:
        lines.append("Pictures: " + " · ".join("[%s](%s)" % (t, os.path.basename(p)) for p, t in svgs) + "\n")
    not_shown = []
    claims(runs, lines, args.unigram, not_shown)
    lines.append("## What this small model does not show\n")
    for s in not_shown:
        lines.append("- " + s)
    lines.append("- Depth and length. %d layers and %d steps (%.1f minutes a variant here); the papers' effects "
                 "build up over far more layers and steps, so an effect that is small or absent here may still "
                 "appear there." % (c["num_hidden_layers"], ri["steps"], total_s / 60 / len(runs)))
    lines.append("- Speed. RMSNorm's speed advantage is not measured: the norms are a small share of this model's "
                 "arithmetic and the machine is shared (see s / step above).")
    lines.append("- Error bars. One seed, so that a rerun is exact; loss differences of a few hundredths of a "
                 "nat may be within what another seed would change.")
    lines.append("")
    lines.append("## Per variant, at the end of training\n")
    for name, r in runs.items():
        p = r["probes"][-1]
        lines.append("### `%s`: %s\n" % (name, r["description"]))
        lines.append("Learning rate %g; train loss %s (mean of the last %d steps), validation loss %s%s; "
                     "%.1f s (%.3f s a training step)." % (
                         r["lr"], fmt(r["final"]["train_loss_tail"], 4), ri["loss_tail"], fmt(r["final"]["val"], 4),
                         "; stopped at step %d: the loss was not finite" % r["diverged_at"] if r["diverged_at"] else "",
                         r["wall_seconds"], r["seconds_per_step"]))
        lines.append("")
        lines.append("| layer | largest attention logit (step %d) | largest during the run | rms of what attention "
                     "reads | residual rms after the layer |" % p["step"])
        lines.append("|---:|---:|---:|---:|---:|")
        lines.append("| embeddings | | | | %s |" % fmt(p["resid_rms"][0], 3))
        for l in range(len(p["max_logit"])):
            lines.append("| %d | %s | %s | %s | %s |" % (l + 1, fmt(p["max_logit"][l], 2), fmt(peak(r, l), 2),
                                                         fmt(p["attn_in_rms"][l], 3), fmt(p["resid_rms"][l + 1], 3)))
        lines.append("")
    lines.append("## Pictures\n")
    for p, t in svgs:
        lines.append("![%s](%s)\n" % (t, os.path.basename(p)))
    lines.append("## Reproduce\n")
    lines.append("```sh\napt-get install python3-torch libopenblas0-pthread   # PyTorch from Debian, as for "
                 "tools/train.py\nmake norm-train-lab                                   # %s\n```\n" % ri["command"])
    lines.append("Without libopenblas0-pthread PyTorch uses Debian's reference BLAS, which is slower, and the "
                 "losses may then differ from these in the last bits. The measurements are in `%s/VARIANT.json` (every step's loss, "
                 "the validation losses, the probes); `/usr/bin/python3 tools/norm_train_lab.py --report-only` "
                 "writes this page and its pictures again from them. `tests/test_norm_train_lab.py` runs the lab "
                 "for a few steps and checks the JSON fields and that a rerun gives the same numbers."
                 % os.path.relpath(args.out_dir, ROOT))
    with open(args.report + ".tmp", "w") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")
    os.replace(args.report + ".tmp", args.report)


def unigram_loss(args, ri):
    """The validation loss of a model that ignores the context: each token's frequency in the training
    text (add-one smoothed), over the same validation windows. A variant near it has learned only
    which tokens are common."""
    tok = train_tokenizer.Tokenizer(os.path.join(tokenizer_dir(args), "tokenizer.json"))
    eot = tok.added["<|endoftext|>"]
    stories = load_stories(args.train)
    if args.max_stories:
        stories = stories[:args.max_stories]
    counts = torch.bincount(encode_stories(tok, stories, eot), minlength=max(tok.added.values()) + 1).double()
    n = ri["eval_windows"] * ri["ctx"]
    y = valid_prefix(tok, args.valid, n + 1)[1:n + 1]
    return -torch.log((counts[y] + 1) / (counts.sum() + len(counts))).mean().item()


def report(args, total_s=None):
    runs = {}
    for name in VARIANTS:
        path = os.path.join(args.out_dir, name + ".json")
        if os.path.exists(path) and (not args.variants_given or name in args.variants):
            with open(path) as f:
                runs[name] = json.load(f)
    if not runs:
        sys.exit("norm_train_lab: no results in %s (run the lab first)" % args.out_dir)
    if total_s is None:
        total_s = sum(r["wall_seconds"] for r in runs.values())
    ri = runs[next(iter(runs))]["run"]
    note = "%s; %d steps of %d x %d tokens, seed %d; %s" % (
        "tools/norm_train_lab.py", ri["steps"], ri["batch"], ri["ctx"], ri["seed"], ri["date"])
    os.makedirs(args.svg_dir, exist_ok=True)
    svgs = []
    p = os.path.join(args.svg_dir, "norm-train-loss.svg")
    plot_loss(runs, p, note)
    svgs.append((p, "loss against step"))
    p = os.path.join(args.svg_dir, "norm-train-logits.svg")
    if plot_logits(runs, p, note):
        svgs.append((p, "largest attention logit against step"))
    p = os.path.join(args.svg_dir, "norm-train-resid.svg")
    if plot_resid(runs, p, note):
        svgs.append((p, "residual rms against layer"))
    args.unigram = unigram_loss(args, ri)
    write_report(runs, args, total_s, svgs)
    print("wrote %s and %s" % (args.report, ", ".join(p for p, _ in svgs)), flush=True)


def main():
    ap = argparse.ArgumentParser(description="train the shipped model's shape with each norm placement")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "build", "norm-train-lab"))
    ap.add_argument("--report", default=os.path.join(ROOT, "docs", "norm-train-lab.md"))
    ap.add_argument("--svg-dir", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--no-report", action="store_true", help="write only the JSON")
    ap.add_argument("--report-only", action="store_true", help="the report and pictures from the JSON in --out-dir")
    ap.add_argument("--train", default="/work/shared/data/tinystories_train_head_cased.txt")
    ap.add_argument("--valid", default="/work/shared/data/tinystories_valid_subset.txt")
    ap.add_argument("--tokenizer", help="folder with tokenizer.json (default: train one like the shipped model's)")
    ap.add_argument("--max-stories", type=int, default=0, help="train on the first N stories only (tests)")
    # the shipped model's shape (models/tinystories.bin)
    ap.add_argument("--dim", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=256)
    # the budget
    # 180 steps of 8 x 256 tokens: 2-3 minutes a variant on a 2-core machine shared with other work,
    # about 17 minutes for the seven
    ap.add_argument("--steps", type=int, default=180)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, help="warm-up steps (default: a tenth of --steps)")
    ap.add_argument("--lr", type=float, default=2e-3, help="tools/train.py's")
    ap.add_argument("--high-lr", type=float, default=1e-2, help="5x tools/train.py's")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=45)
    ap.add_argument("--eval-windows", type=int, default=32)
    ap.add_argument("--probe-every", type=int, default=10)
    ap.add_argument("--probe-windows", type=int, default=4)
    ap.add_argument("--loss-tail", type=int, default=20, help="the table's train loss: the mean of the last N steps")
    ap.add_argument("--print-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=int(THREADS),
                    help="a fixed count (default 1): the sums' order, so the bits, depend on it")
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()
    if args.warmup is None:
        args.warmup = max(1, args.steps // 10)
    args.variants_given = any(a.startswith("--variants") for a in sys.argv[1:])
    args.variants = [v for v in args.variants.split(",") if v]
    for v in args.variants:
        if v not in VARIANTS:
            ap.error("unknown variant %r (known: %s)" % (v, ", ".join(VARIANTS)))
    args.command = shlex.join(["/usr/bin/python3", "tools/norm_train_lab.py"] + sys.argv[1:])
    if args.report_only:
        report(args)
        return
    total = run(args)
    if not args.no_report:
        report(args, total)


if __name__ == "__main__":
    main()
