"""tools/make_random_gguf.py (the GGUF twin of the bench checkpoint, for llama-bench) read back by
an independent GGUF parser: header, every key and its value, every tensor's name, shape, type and
offset (aligned, in order, sizes of q8_0 / q4_0 / bf16 / f32), the file ending right after the
last tensor; with and without a tokenizer.json beside config.json. llama.cpp itself is not here,
so this checks the format as written down in ggml's gguf.h, not llama.cpp's acceptance of it (the
files were loaded and benchmarked with llama.cpp by hand: docs/speed.md). Standard library only."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_model import PYTHON  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "make_random_gguf.py")
CFG = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
       "num_key_value_heads": 2, "head_dim": 20, "vocab_size": 320, "rope_theta": 1000000.0,
       "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 4096}
TYPE_IDS = {"f32": 0, "q4_0": 2, "q8_0": 8, "bf16": 30}
BYTES = {0: (4, 1), 30: (2, 1), 8: (34, 32), 2: (18, 32)}  # bytes, values per block


def parse_gguf(path):
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v if len(v) > 1 else v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = buf[pos:pos + n].decode("utf-8")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert buf[:4] == b"GGUF", "magic"
    pos = 4
    version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("I"))
    tensors = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        tensors.append((name, dims, take("I"), take("Q")))
    align = kv.get("general.alignment", 32)
    data_start = (pos + align - 1) // align * align
    return version, kv, tensors, data_start, len(buf)


MOE_CFG = dict(CFG, architectures=["Qwen3MoeForCausalLM"], num_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=32, tie_word_embeddings=False)


class MakeRandomGGUF(unittest.TestCase):
    def write(self, typ, tokenizer, cfg=CFG):
        tmp = tempfile.mkdtemp(prefix="qwen3_gguf_")
        self.addCleanup(shutil.rmtree, tmp, True)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        if tokenizer:
            vocab = {"tok%d" % i: i for i in range(300)}
            with open(os.path.join(tmp, "tokenizer.json"), "w") as f:
                json.dump({"model": {"vocab": vocab, "merges": [["t", "o"], "to k"]},
                           "added_tokens": [{"id": 300, "content": "<|im_end|>"}]}, f)
        out = self.path = os.path.join(tmp, "m.gguf")
        p = subprocess.run([*PYTHON, TOOL, tmp, out, "--type", typ], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sorted(os.listdir(tmp)), sorted(["config.json", "m.gguf"] + (["tokenizer.json"] if tokenizer else [])),
                         "no temporary file left")
        return parse_gguf(out)

    def check(self, typ, tokenizer):
        version, kv, tensors, data_start, size = self.write(typ, tokenizer)
        self.assertEqual(version, 3)
        self.assertEqual(kv["general.architecture"], "qwen3")
        for key, want in (("embedding_length", 64), ("block_count", 2), ("feed_forward_length", 96),
                          ("attention.head_count", 8), ("attention.head_count_kv", 2),
                          ("attention.key_length", 20), ("attention.value_length", 20)):
            self.assertEqual(kv["qwen3." + key], want, key)
        self.assertAlmostEqual(kv["qwen3.rope.freq_base"], 1e6)
        self.assertAlmostEqual(kv["qwen3.attention.layer_norm_rms_epsilon"], 1e-6, delta=1e-12)
        self.assertEqual(len(kv["tokenizer.ggml.tokens"]), 320)
        self.assertEqual(len(kv["tokenizer.ggml.token_type"]), 320)
        self.assertEqual(len(set(kv["tokenizer.ggml.tokens"])), 320, "tokens are unique")
        if tokenizer:
            self.assertEqual(kv["tokenizer.ggml.tokens"][5], "tok5")
            self.assertEqual(kv["tokenizer.ggml.tokens"][300], "<|im_end|>")
            self.assertEqual(kv["tokenizer.ggml.merges"], ["t o", "to k"])
        else:
            self.assertEqual(kv["tokenizer.ggml.merges"], [])

        names = [t[0] for t in tensors]
        self.assertEqual(len(names), 1 + 2 * 11 + 1, "embedding, 11 per layer, final norm; tied: no output")
        self.assertNotIn("output.weight", names)
        shapes = {t[0]: t[1] for t in tensors}
        self.assertEqual(shapes["token_embd.weight"], [64, 320])
        self.assertEqual(shapes["blk.1.attn_q.weight"], [64, 160])
        self.assertEqual(shapes["blk.1.attn_k.weight"], [64, 40])
        self.assertEqual(shapes["blk.0.attn_output.weight"], [160, 64])
        self.assertEqual(shapes["blk.0.ffn_down.weight"], [96, 64])
        self.assertEqual(shapes["blk.0.attn_q_norm.weight"], [20])  # 80 bytes: padded to 96
        end = 0
        for name, dims, t, off in tensors:
            want_type = TYPE_IDS[typ] if len(dims) == 2 else 0
            self.assertEqual(t, want_type, name)
            self.assertEqual(off % 32, 0, name + " aligned")
            self.assertEqual(off, (end + 31) // 32 * 32, name + " follows the previous tensor")
            n = 1
            for d in dims:
                n *= d
            nbytes, per = BYTES[t]
            end = off + n // per * nbytes
        self.assertEqual(size, data_start + (end + 31) // 32 * 32, "file ends after the last tensor")

    def test_every_type_with_tokenizer(self):
        for typ in TYPE_IDS:
            with self.subTest(typ=typ):
                self.check(typ, tokenizer=True)

    def test_without_tokenizer(self):
        self.check("q8_0", tokenizer=False)

    def test_moe(self):
        """Qwen3-MoE as llama.cpp's qwen3moe: its expert keys, a float32 router [hidden, experts]
        of distinct rows, each projection's experts as one 3-d tensor, no dense MLP."""
        for typ in ("q8_0", "q4_0"):
            with self.subTest(typ=typ):
                version, kv, tensors, data_start, size = self.write(typ, False, MOE_CFG)
                self.assertEqual(kv["general.architecture"], "qwen3moe")
                for key, want in (("expert_count", 8), ("expert_used_count", 2), ("expert_feed_forward_length", 32),
                                  ("block_count", 2), ("attention.head_count_kv", 2)):
                    self.assertEqual(kv["qwen3moe." + key], want, key)
                info = {t[0]: t for t in tensors}
                self.assertEqual(len(tensors), 1 + 2 * 12 + 2, "embedding, 12 per layer, final norm, head")
                self.assertEqual(info["blk.1.ffn_gate_inp.weight"][1:3], ([64, 8], 0))
                self.assertEqual(info["blk.1.ffn_gate_exps.weight"][1:3], ([64, 32, 8], TYPE_IDS[typ]))
                self.assertEqual(info["blk.1.ffn_up_exps.weight"][1:3], ([64, 32, 8], TYPE_IDS[typ]))
                self.assertEqual(info["blk.0.ffn_down_exps.weight"][1:3], ([32, 64, 8], TYPE_IDS[typ]))
                self.assertNotIn("blk.0.ffn_gate.weight", info)
                with open(os.path.join(os.path.dirname(self.path), "m.gguf"), "rb") as f:
                    f.seek(data_start + info["blk.0.ffn_gate_inp.weight"][3])
                    router = struct.unpack("<512f", f.read(2048))
                self.assertEqual(len({router[i * 64:(i + 1) * 64] for i in range(8)}), 8, "distinct router rows")
                names = [t[0] for t in tensors]
                self.assertEqual(names.index("blk.1.ffn_down_exps.weight") + 1, names.index("output_norm.weight"))

    def test_moe_with_dense_layers_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(dict(MOE_CFG, mlp_only_layers=[0]), f)
            p = subprocess.run([*PYTHON, TOOL, tmp, os.path.join(tmp, "x.gguf")], capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("mlp_only_layers", p.stderr)
            self.assertEqual(os.listdir(tmp), ["config.json"])

    def test_missing_config(self):
        with tempfile.TemporaryDirectory() as tmp:
            p = subprocess.run([*PYTHON, TOOL, tmp, os.path.join(tmp, "x.gguf")], capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("config.json", p.stderr)
            self.assertEqual(os.listdir(tmp), [])


if __name__ == "__main__":
    unittest.main()
