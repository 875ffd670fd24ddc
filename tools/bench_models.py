#!/usr/bin/env python3
"""bench_models.py: the random Qwen3-0.6B-shape checkpoints that `make bench` and
tools/llama_cpp/compare.py measure, each written only where it is missing.

    python3 tools/bench_models.py DIR FORMAT...        # e.g. build/bench q8 q4 bf16 f32

DIR/hf is the Hugging Face folder from tools/make_random_qwen3.py (about 1.2 GB, written once).
DIR/qwen3-0.6b-FORMAT.bin is export.py's checkpoint, written again also when the engine (--run,
default ./run) cannot read it, e.g. a file of an older layout. Python 3 standard library.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("q8", "q4", "bf16", "f32")


def checkpoint(directory, fmt):
    return os.path.join(directory, f"qwen3-0.6b-{fmt}.bin")


def step(cmd, what, who):
    """Runs a command that writes a file (its output passed through); exits with a message naming
    the command if it fails."""
    print(f"{who}: {what}", file=sys.stderr, flush=True)
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        sys.exit(f"{who}: {what} failed: {' '.join(cmd)}")


def readable(run, ckpt):
    """Whether the engine reads the checkpoint (it exits 0 on a prompt of one token, no output)."""
    if not os.path.exists(ckpt):
        return False
    return subprocess.run([run, ckpt, "--prompt-ids", "1", "-n", "0"], cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def ensure(directory, formats, run, who="bench_models.py"):
    """Writes what is missing; returns {format: checkpoint path}."""
    hf = os.path.join(directory, "hf")
    if not os.path.exists(os.path.join(hf, "model.safetensors")):
        step([sys.executable, "tools/make_random_qwen3.py", hf], f"writing the random model in {hf}", who)
    paths = {}
    for f in formats:
        paths[f] = checkpoint(directory, f)
        if not readable(run, paths[f]):
            step([sys.executable, "export.py", hf, paths[f], "--dtype", f], f"exporting {paths[f]}", who)
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="where the models live (make bench: build/bench)")
    ap.add_argument("formats", nargs="+", choices=FORMATS, metavar="FORMAT", help=" | ".join(FORMATS))
    ap.add_argument("--run", default=os.path.join(ROOT, "run"), help="the engine that must read them; default ./run")
    a = ap.parse_args()
    if not os.access(a.run, os.X_OK):
        sys.exit(f"bench_models.py: {a.run}: no engine there; build it with make (or give --run)")
    ensure(a.dir, a.formats, a.run)


if __name__ == "__main__":
    main()
