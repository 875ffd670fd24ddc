#!/usr/bin/env python3
"""make_random_checkpoint.py: a checkpoint of random weights written straight in this engine's
format, for speed tests at shapes whose Hugging Face source is too large to write and export
(Qwen3-30B-A3B is 61 GB of BF16; its q4 checkpoint 17 GB).

    python3 tools/make_random_qwen3.py DIR --size 30b-a3b --config-only [--layers N]
    python3 tools/make_random_checkpoint.py DIR OUT.bin --dtype q4|q8|bf16|f32
    python3 tools/make_random_gguf.py DIR OUT.gguf --type q4_0        # the same shape for llama.cpp

Takes DIR/config.json, generation_config.json and tokenizer.json through export.py's own parsing,
so the file has the header, tokenizer section, tensor order and row-block layout that export.py
writes for that folder (tests/test_random_checkpoint.py checks that the two files are the same size
with the same header). Only the values differ: each matrix repeats one block of ROWS random rows
(uniform, standard deviation 1/sqrt(columns), quantised by export.py's own functions), norms are 1,
biases 0, and a MoE router is fully random (float32, N(0, 1/columns)), so that tokens spread over
the experts as they do in a trained model rather than all picking the same k. The text such a
model writes is noise; its speed is that of a real model of the shape. Written under a temporary
name, renamed when complete, then dropped from the page cache (as export.py does). Python 3
standard library only; 30b-a3b in q4 takes about as long as the disk needs to write 17 GB.
"""
import argparse
import os
import random
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import export  # noqa: E402  (the format: parse_config, tensor_plan, quantisation, header)

ROWS = 64  # rows of each matrix's random block; a multiple of q8's 4 and q4's 8 rows per row block


def random_rows(rng, rows, cols):
    """rows x cols float32 values, uniform with standard deviation 1/sqrt(cols), as bytes."""
    a = (3.0 / cols) ** 0.5
    return struct.pack(f"<{rows * cols}f", *[rng.uniform(-a, a) for _ in range(rows * cols)])


def stored_rows(raw_f32, cols, wtype, gs):
    """Float32 rows in the checkpoint's weight type (export.py's conversions)."""
    if wtype == export.WEIGHT_F32:
        return raw_f32
    if wtype == export.WEIGHT_BF16:
        return export.f32_to_bf16_bytes(raw_f32)
    return export.quant_row_blocks(raw_f32, cols, gs, wtype)


class Blocks:
    """One random block of ROWS rows per width (and weight type), stored form and float32."""

    def __init__(self, rng, wtype, gs):
        self.rng, self.wtype, self.gs, self.cache = rng, wtype, gs, {}

    def matrix(self, rows, cols):
        """A rows x cols matrix's bytes as a list of pieces: the block repeated, and a tail."""
        if cols not in self.cache:
            raw = random_rows(self.rng, ROWS, cols)
            self.cache[cols] = (raw, stored_rows(raw, cols, self.wtype, self.gs))
        raw, block = self.cache[cols]
        pieces = [block] * (rows // ROWS)
        if rows % ROWS:  # a short tail, stored from the block's first rows
            pieces.append(stored_rows(raw[:rows % ROWS * cols * 4], cols, self.wtype, self.gs))
        return pieces


def tensor_bytes(name, shape, is_matrix, blocks, router):
    """The stored bytes of one tensor of export.tensor_plan, as a list of pieces."""
    if is_matrix:
        return blocks.matrix(shape[0], shape[1])
    if len(shape) == 2:  # a matrix kept in float32: the router
        if tuple(shape) not in router:
            rng, n = blocks.rng, shape[0] * shape[1]
            router[tuple(shape)] = struct.pack(f"<{n}f", *[rng.gauss(0, shape[1] ** -0.5) for _ in range(n)])
        return [router[tuple(shape)]]
    return [struct.pack(f"<{shape[0]}f", *([0.0 if name.endswith(".bias") else 1.0] * shape[0]))]


def write(folder, out_path, dtype_name, seed):
    cfg = export.read_json(os.path.join(folder, "config.json"), "the model config")
    gen_path = os.path.join(folder, "generation_config.json")
    gen = export.read_json(gen_path, "the generation config") if os.path.exists(gen_path) else {}
    c = export.parse_config(folder, cfg, gen)
    c["flags"] = flags = export.file_flags(c, False)
    if c["arch"] == export.ARCH_LLAMA:
        raise export.ExportError(f"{folder}: a Llama config; this tool writes Qwen3 and Qwen2 shapes")
    wtype = export.DTYPES[dtype_name]
    gs = export.choose_group_size(c, export.DEFAULT_GROUP[wtype], wtype) if wtype in export.DEFAULT_GROUP else 0
    tok_json = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(tok_json):
        raise export.ExportError(f"{folder}: no tokenizer.json there (make_random_qwen3.py copies "
                                 "one from --tokenizer DIR)")
    tok = export.tokenizer_section(tok_json, os.path.join(folder, "tokenizer_config.json"), c["vocab_size"])
    plan = export.tensor_plan(c)
    export.check_output_path(out_path, [])

    blocks, router = Blocks(random.Random(seed), wtype, gs), {}
    out_dir = os.path.dirname(os.path.abspath(out_path))
    tmp_path = os.path.join(out_dir, f".{os.path.basename(out_path)}.{os.getpid()}.tmp")
    t0, shown = time.time(), 0
    try:
        with open(tmp_path, "wb") as f:
            w = export.Writer(f)
            w.write(bytes(256))  # the header, written last
            tok_offset = f.tell()
            w.write(tok)
            w.pad()
            weights_offset = f.tell()
            for i, (name, shape, is_matrix) in enumerate(plan):
                w.pad()
                for piece in tensor_bytes(name, shape, is_matrix, blocks, router):
                    w.write(piece)
                if f.tell() - shown >= (1 << 30):
                    shown = f.tell()
                    print(f"make_random_checkpoint.py: {shown / 1e9:.1f} GB, tensor {i + 1} of {len(plan)}, "
                          f"{time.time() - t0:.0f} s", file=sys.stderr, flush=True)
            w.pad()
            end = f.tell()
            f.seek(0)
            f.write(export.pack_header(c, flags, wtype, gs, -1, tok_offset, len(tok), weights_offset,
                                       end - weights_offset))
            f.flush()
            os.fsync(f.fileno())
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        os.replace(tmp_path, out_path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise
    return end, len(plan)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="a folder with config.json and tokenizer.json (make_random_qwen3.py --config-only)")
    ap.add_argument("out", help="the checkpoint to write")
    ap.add_argument("--dtype", choices=sorted(export.DTYPES), default="q8")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    try:
        size, n = write(a.folder, a.out, a.dtype, a.seed)
    except export.ExportError as e:
        sys.exit(f"make_random_checkpoint.py: {e}")
    except KeyboardInterrupt:
        sys.exit(f"make_random_checkpoint.py: interrupted; {a.out} not written")
    except OSError as e:
        sys.exit(f"make_random_checkpoint.py: {e.filename or a.out}: {e.strerror or e}; {a.out} not written")
    print(f"make_random_checkpoint.py: wrote {a.out} ({size / 1e9:.2f} GB, {a.dtype}, {n} tensors)")


if __name__ == "__main__":
    main()
