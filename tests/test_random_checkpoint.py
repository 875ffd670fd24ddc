"""tools/make_random_checkpoint.py (random weights straight in the engine's format, for shapes such
as Qwen3-30B-A3B whose Hugging Face source is too large to write) against export.py on the same
folder: in every format (each on one of dense and MoE with a dense layer among the sparse ones), the same file
size, header and tokenizer section, so the engine reads the same layout; the engine loads the
file and generates; a MoE router is random in full (tokens spread over the experts, as the bench's
expert count shows). And tools/make_random_qwen3.py's 30b-a3b shape: 30.5B parameters (QWEN3.md
8.1). Standard library only."""
import os
import struct
import subprocess
import sys

import hf_model
from hf_model import Spec

ROOT = hf_model.ROOT
TOOL = os.path.join(ROOT, "tools", "make_random_checkpoint.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_random_qwen3  # noqa: E402
from hf_model import PYTHON  # noqa: E402

SHAPES = {
    "dense": dict(arch="qwen3", tie=False),
    "moe": dict(arch="qwen3_moe", tie=False, num_experts=8, num_experts_per_tok=2, mlp_only_layers=[0]),
}


def weights_offset(path):
    """The header's weights_offset (FileHeader, model.h): the tokenizer section ends before it."""
    return hf_model.read_header(path)["weights_offset"]


# Every format once, on one of the two shapes (each export and write takes a second or two).
CASES = (("dense", "f32"), ("dense", "q4"), ("moe", "bf16"), ("moe", "q8"))


class RandomCheckpoint(hf_model.TempDirTestCase):
    written = {}

    def write_both(self, shape, dtype):
        """export.py's file and the tool's, from one folder per shape; each pair written once."""
        if (shape, dtype) in self.written:
            return self.written[(shape, dtype)]
        d = os.path.join(self.tmp, shape)
        if not os.path.exists(d):
            hf_model.write_model(d, Spec(**SHAPES[shape]))
        d_out = self.fresh_dir(shape + "_" + dtype)
        exported, random_ckpt = os.path.join(d_out, "exported.bin"), os.path.join(d_out, "random.bin")
        p = hf_model.run_export(d, exported, dtype)
        self.assertEqual(p.returncode, 0, p.stderr)
        p = subprocess.run([*PYTHON, TOOL, d, random_ckpt, "--dtype", dtype], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertFalse([n for n in os.listdir(d_out) if n.endswith(".tmp")], "no temporary left")
        self.written[(shape, dtype)] = exported, random_ckpt
        return exported, random_ckpt

    def test_same_layout_as_export(self):
        for shape, dtype in CASES:
            with self.subTest(shape=shape, dtype=dtype):
                exported, random_ckpt = self.write_both(shape, dtype)
                self.assertEqual(os.path.getsize(exported), os.path.getsize(random_ckpt))
                with open(exported, "rb") as a, open(random_ckpt, "rb") as b:
                    head = weights_offset(exported)
                    self.assertEqual(a.read(head), b.read(head), "header and tokenizer section")
                    self.assertNotEqual(a.read(), b.read(), "the weights are the tool's own")
                p = hf_model.run_engine([random_ckpt, "--prompt-ids", "1,2,3", "-n", "4", "-s", "1"])
                self.assertEqual(p.returncode, 0, p.stderr)

    def test_router_is_random_in_full(self):
        """Every expert's router row differs (a repeated block would tie experts' scores, and all
        tokens would pick the same k): the float32 router rows read back from the file."""
        _, random_ckpt = self.write_both("moe", "q8")
        h = hf_model.read_header(random_ckpt)
        dim, n_experts = 64, SHAPES["moe"]["num_experts"]
        data = open(random_ckpt, "rb").read()
        rows = set()
        router_bytes = 4 * dim * n_experts
        # the router of layer 1 (layer 0 is dense): a float32 block of n_experts rows of dim values
        # with every value in (-1, 1) and no two rows alike; find it by scanning 64-byte boundaries
        for off in range(h["weights_offset"], len(data) - router_bytes, 64):
            vals = struct.unpack_from(f"<{dim * n_experts}f", data, off)
            if all(-1 < v < 1 and v != 0 for v in vals):
                rows = {vals[i * dim:(i + 1) * dim] for i in range(n_experts)}
                break
        self.assertEqual(len(rows), n_experts, "a router of distinct random rows")

    def test_bad_folder_one_line(self):
        d = self.fresh_dir("empty")
        p = subprocess.run([*PYTHON, TOOL, d, os.path.join(d, "x.bin")], capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("config.json", p.stderr)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "x.bin")))


class MoeSize(hf_model.TempDirTestCase):
    NEEDS_TOOLS = False

    def test_30b_a3b_parameters(self):
        """QWEN3.md 8.1: 30.5B parameters, 48 layers of 128 experts."""
        cfg = make_random_qwen3.size_config("30b-a3b")
        params = sum(make_random_qwen3.len_of(s) for _, s, _ in make_random_qwen3.tensor_list(cfg))
        self.assertAlmostEqual(params / 1e9, 30.53, delta=0.01)
        names = [n for n, _, _ in make_random_qwen3.tensor_list(cfg)]
        self.assertIn("model.layers.47.mlp.experts.127.down_proj.weight", names)
        self.assertNotIn("model.layers.0.mlp.gate_proj.weight", names)


if __name__ == "__main__":
    import unittest
    unittest.main()
