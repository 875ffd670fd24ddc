#!/usr/bin/env python3
"""bench_models.py: the random Qwen3 checkpoints of one size that `make bench` and
tools/llama_cpp/compare.py measure, each written only where it is missing.

    python3 tools/bench_models.py DIR FORMAT... [--size 0.6b|1.7b|4b|8b|14b|30b-a3b] [--layers N]
                                                   # e.g. build/bench q8 q4

DIR/hf (0.6b) or DIR/hf-SIZE (the other sizes) is the Hugging Face folder from
tools/make_random_qwen3.py (2 bytes a parameter: 1.2 GB for 0.6b, 16.4 GB for 8b), written once.
DIR/qwen3-SIZE-FORMAT.bin is export.py's checkpoint (q8 and q4 quantised as they stream through
./run -m quantize --stream when ./run is built), written again also when the engine (--run,
default ./run) cannot read it, e.g. a file of an older layout. A MoE size (30b-a3b: 61 GB of BF16), and any size
cut to --layers N (then named SIZE-Nl), has only the folder's config.json and tokenizer, and its
checkpoint is written straight in the engine's format by tools/make_random_checkpoint.py. The
paths of the checkpoints that are there in the end are printed on standard output, one a line,
for `make bench` to run.

A format is skipped, with a line on stderr that says why, when its checkpoint would be larger than
half of this machine's memory (the bench reads every weight for each token, from the page cache: a
file that does not stay there measures the disk; 3/4 for a MoE size, whose tokens read a part of
it each), or when writing it (with the Hugging Face folder it needs)
would not fit in the free space of DIR's disk. Python 3 standard library.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from make_random_qwen3 import ALL_SIZES, MOE_SIZES, len_of, size_config, tensor_list  # noqa: E402
SIZES = ALL_SIZES

FORMATS = ("q8", "q4", "bf16", "f32")
# Checkpoint bytes per parameter, a little above what export.py writes for 0.6b (the scales of
# q8's groups of 64 and q4's of 32, and the tokenizer, included).
BYTES_PER_PARAM = {"f32": 4.0, "bf16": 2.0, "q8": 1.04, "q4": 0.57}


def shape_name(size, layers=None):
    """The size, and the layer count where --layers cuts it short: 30b-a3b, 30b-a3b-12l."""
    return size if layers is None else f"{size}-{layers}l"


def hf_folder(directory, size="0.6b", layers=None):
    return os.path.join(directory, "hf" if (size, layers) == ("0.6b", None) else f"hf-{shape_name(size, layers)}")


def checkpoint(directory, fmt, size="0.6b", layers=None):
    return os.path.join(directory, f"qwen3-{shape_name(size, layers)}-{fmt}.bin")


def parameters(size, layers=None):
    cfg = size_config(size)
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    return sum(len_of(shape) for _, shape, _ in tensor_list(cfg))


def step(cmd, what, who):
    """Runs a command that writes a file (its output passed through to stderr); exits with a
    message naming the command if it fails."""
    print(f"{who}: {what}", file=sys.stderr, flush=True)
    if subprocess.run(cmd, cwd=ROOT, stdout=sys.stderr).returncode != 0:
        sys.exit(f"{who}: {what} failed: {' '.join(cmd)}")


def readable(run, ckpt):
    """Whether the engine reads the checkpoint (it exits 0 on a prompt of one token, no output)."""
    if not os.path.exists(ckpt):
        return False
    return subprocess.run([run, ckpt, "--prompt-ids", "1", "-n", "0"], cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def too_large(size, fmt, layers=None):
    """Why the checkpoint does not fit this machine's memory, or None. A MoE token reads only its
    experts, but the tokens of a run read all of them, so the whole file has to stay cached too;
    the bench itself needs little else (3/4 of memory leaves the system its share)."""
    nbytes = BYTES_PER_PARAM[fmt] * parameters(size, layers)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    share = 0.75 if size in MOE_SIZES else 0.5
    if nbytes > ram * share:
        return (f"about {nbytes / 1e9:.1f} GB, more than {'3/4' if share == 0.75 else 'half'} of this "
                f"machine's {ram / 1e9:.1f} GB of memory" + ("" if size not in MOE_SIZES else
                                                            "; give fewer layers (e.g. --layers 12)"))
    return None


def written_directly(size, layers):
    """Whether the checkpoint is written straight from the config (make_random_checkpoint.py)
    rather than exported from a Hugging Face folder of random weights."""
    return size in MOE_SIZES or layers is not None


def no_room(directory, size, fmt, layers=None):
    """Why writing the checkpoint (and the Hugging Face folder when missing; a checkpoint written
    directly alone) does not fit the free disk space of directory, or None."""
    params = parameters(size, layers)
    parts = [(f"the {fmt} file", BYTES_PER_PARAM[fmt] * params)]
    if not written_directly(size, layers):
        if not os.path.exists(os.path.join(hf_folder(directory, size), "model.safetensors")):
            parts.append(("the Hugging Face folder", 2.0 * params))
    need = sum(n for _, n in parts)
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    if need > free:
        detail = " + ".join(f"{what} {n / 1e9:.1f}" for what, n in parts)
        return f"needs about {need / 1e9:.1f} GB of disk ({detail}), {free / 1e9:.1f} GB free in {directory}"
    return None


def ensure(directory, formats, run, who="bench_models.py", size="0.6b", layers=None):
    """Writes what is missing and fits; returns {format: checkpoint path} of those that are there.
    A MoE size's checkpoint is written straight from its config (make_random_checkpoint.py)."""
    os.makedirs(directory, exist_ok=True)
    hf = hf_folder(directory, size, layers)
    cut = [] if layers is None else ["--layers", str(layers)]
    paths = {}
    for f in formats:
        ckpt = checkpoint(directory, f, size, layers)
        why = too_large(size, f, layers)
        if why is None and not readable(run, ckpt):
            why = no_room(directory, size, f, layers)
            if why is None and written_directly(size, layers):
                if not os.path.exists(os.path.join(hf, "config.json")):
                    step([sys.executable, "tools/make_random_qwen3.py", hf, "--size", size, "--config-only"] + cut,
                         f"writing {hf}/config.json", who)
                step([sys.executable, "tools/make_random_checkpoint.py", hf, ckpt, "--dtype", f],
                     f"writing {ckpt} (random weights)", who)
            elif why is None:
                if not os.path.exists(os.path.join(hf, "model.safetensors")):
                    step([sys.executable, "tools/make_random_qwen3.py", hf, "--size", size],
                         f"writing the random {size} model in {hf}", who)
                step([sys.executable, "export.py", hf, ckpt, "--dtype", f], f"exporting {ckpt}", who)
        if why:
            print(f"{who}: skipping {f} of {size}: {why}", file=sys.stderr, flush=True)
        else:
            paths[f] = ckpt
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="where the models live (make bench: build/bench)")
    ap.add_argument("formats", nargs="+", choices=FORMATS, metavar="FORMAT", help=" | ".join(FORMATS))
    ap.add_argument("--size", choices=list(SIZES), default="0.6b", help="the Qwen3 size (default 0.6b)")
    ap.add_argument("--layers", type=int, help="the size's shape with fewer layers (a smaller file)")
    ap.add_argument("--run", default=os.path.join(ROOT, "run"), help="the engine that must read them; default ./run")
    a = ap.parse_args()
    if not os.access(a.run, os.X_OK):
        sys.exit(f"bench_models.py: {a.run}: no engine there; build it with make (or give --run)")
    if a.layers is not None and a.layers < 1:
        ap.error("--layers must be at least 1")
    for path in ensure(a.dir, a.formats, a.run, size=a.size, layers=a.layers).values():
        print(path)


if __name__ == "__main__":
    main()
