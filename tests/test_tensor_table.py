"""The checkpoint's tensors are named once (model.h, TensorInfo): model.c's TENSORS table, which the
loader, quantize and the bench walk. export.py mirrors it in its TENSORS list, and
docs/checkpoint.md shows it; these tests hold the three to the same names, order, shapes and
conditions, so that a tensor added to one and not the others fails here before it writes a file
./run cannot read."""
import os
import re
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import export  # noqa: E402

SIZES = {"SIZE_DIM": "dim", "SIZE_HIDDEN": "hidden_dim", "SIZE_VOCAB": "vocab_size",
         "SIZE_Q": "n_heads*head_dim", "SIZE_KV": "n_kv_heads*head_dim", "SIZE_HEAD": "head_dim",
         "SIZE_EXPERTS": "n_experts", "SIZE_EXPERT_HIDDEN": "moe_hidden_dim", "SIZE_NONE": None}
FLAGS = {"0": 0, "FLAG_QK_NORM": export.FLAG_QK_NORM, "FLAG_QKV_BIAS": export.FLAG_QKV_BIAS,
         "FLAG_TIED_EMBED": export.FLAG_TIED_EMBED, "FLAG_MOE_LAYER": export.FLAG_MOE_LAYER}
PLACES = {"GLOBAL": export.GLOBAL, "LAYER": export.LAYER, "EXPERT": export.EXPERT}
DOC_PLACES = {"once": export.GLOBAL, "per layer": export.LAYER, "per expert": export.EXPERT}


def c_table():
    """model.c's TENSOR TABLE block as (name, rows, cols, place, only with, not with, float32) rows."""
    with open(os.path.join(ROOT, "model.c")) as f:
        text = f.read()
    m = re.search(r"/\* BEGIN TENSOR TABLE.*?\*/(.*?)/\* END TENSOR TABLE \*/", text, re.S)
    assert m, "model.c has no TENSOR TABLE block"
    rows = []
    for line in m.group(1).strip().splitlines():
        f = re.fullmatch(r'\s*\{"(\w+)",\s*(\w+),\s*(\w+),\s*(\w+),\s*(\w+),\s*(\w+),\s*([01]),\s*'
                         r'offsetof\((\w+), (\w+)\)\},', line)
        assert f, "a TENSOR TABLE line this test cannot read: " + line
        name, place, r, c, only, not_with, f32, struct, field = f.groups()
        assert field == name, f"{name}'s pointer is {struct}.{field}"
        assert (struct == "LayerWeights") == (place != "GLOBAL"), f"{name}: {place}, but in {struct}"
        rows.append((name, SIZES[r], SIZES[c], PLACES[place], FLAGS[only], FLAGS[not_with], f32 == "1"))
    return rows


def doc_table():
    """docs/checkpoint.md's table under "## The tensors", in the same form."""
    with open(os.path.join(ROOT, "docs", "checkpoint.md")) as f:
        text = f.read()
    section = text.split("## The tensors", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        f = re.fullmatch(r"\| `(\w+)` \| (once|per layer|per expert) \| (MATRIX|float32 MATRIX|vector) "
                         r"\[([\w*]+)(?:, ([\w*]+))?\] \| (.*) \|", line)
        if not f:
            continue
        name, place, kind, r, c, stored = f.groups()
        assert (kind != "vector") == (c is not None), line
        phrase = stored.split(" (")[0]
        only = {"in an expert layer": export.FLAG_MOE_LAYER}.get(phrase, 0)
        not_with = {"not in an expert layer": export.FLAG_MOE_LAYER}.get(phrase, 0)
        if phrase.startswith("with "):
            only = FLAGS[phrase.split()[1]]
        if phrase.startswith("without "):
            not_with = FLAGS[phrase.split()[1]]
        assert stored == "always" or only or not_with, line
        rows.append((name, r, c, DOC_PLACES[place], only, not_with, kind == "float32 MATRIX"))
    return rows


class TensorTable(unittest.TestCase):
    def test_export_mirrors_the_table(self):
        self.assertEqual(c_table(), [(n, r, c, p, o, w, f) for n, _, r, c, p, o, w, f in export.TENSORS])

    def test_docs_show_the_table(self):
        self.assertEqual(c_table(), doc_table())

    def test_the_reader_can_fail(self):
        """A changed row shows: the comparison is not of two empty lists."""
        rows = c_table()
        self.assertGreaterEqual(len(rows), 17)
        self.assertIn(("lm_head", "vocab_size", "dim", export.GLOBAL, 0, export.FLAG_TIED_EMBED, False), rows)
        self.assertIn(("router", "n_experts", "dim", export.LAYER, export.FLAG_MOE_LAYER, 0, True), rows)
        self.assertNotEqual(rows[:-1], doc_table())

    def test_export_plan_follows_the_flags(self):
        """export.py's plan for each combination of the flags its table's rows depend on (the
        experts' apart: test_export_plan_of_experts): the layers' tensors between embed_tokens and
        norm, biases only with FLAG_QKV_BIAS, QK-Norm only with FLAG_QK_NORM, no lm_head when tied."""
        c = dict(dim=8, hidden_dim=16, vocab_size=10, head_dim=4, n_heads=2, n_kv_heads=1, n_layers=2)
        bits = sorted({f for t in export.TENSORS for f in (t[5], t[6]) if f and f != export.FLAG_MOE_LAYER})
        self.assertEqual(len(bits), 3)  # QK-Norm, the q/k/v biases, the tied head; a new one is tried too
        for mask in range(1 << len(bits)):
            flags = sum(b for i, b in enumerate(bits) if mask >> i & 1)
            plan = [name for name, _, _ in export.tensor_plan(dict(c, flags=flags))]
            self.assertEqual(plan[0], "model.embed_tokens.weight")
            self.assertEqual(plan[-1] if flags & export.FLAG_TIED_EMBED else plan[-2], "model.norm.weight")
            self.assertEqual(any(n.endswith("q_proj.bias") for n in plan), bool(flags & export.FLAG_QKV_BIAS))
            self.assertEqual(any(n.endswith("q_norm.weight") for n in plan), bool(flags & export.FLAG_QK_NORM))
            per_layer = sum(1 for t in export.TENSORS if t[4] == export.LAYER and (flags & t[5]) == t[5] and
                            not flags & t[6])
            self.assertEqual(len(plan), per_layer * 2 + 2 + (0 if flags & export.FLAG_TIED_EMBED else 1))

    def test_export_plan_of_experts(self):
        """A Qwen3-MoE plan: an expert layer's router, then each expert's three matrices, expert by
        expert; a layer left dense (mlp_only_layers) keeps the dense MLP; the router as a float32."""
        c = dict(dim=8, hidden_dim=16, vocab_size=10, head_dim=4, n_heads=2, n_kv_heads=1, n_layers=2,
                 flags=export.FLAG_QK_NORM | export.FLAG_MOE | export.FLAG_TIED_EMBED,
                 moe=dict(n_experts=3, n_active=2, hidden=4, sparse_step=1, norm_topk=True, mlp_only=[1]))
        plan = export.tensor_plan(c)
        names = [n for n, _, _ in plan]
        i = names.index("model.layers.0.mlp.gate.weight")
        self.assertEqual(plan[i], ("model.layers.0.mlp.gate.weight", [3, 8], False))
        self.assertEqual(names[i + 1:i + 4], ["model.layers.0.mlp.experts.0.%s_proj.weight" % p for p in ("gate", "up", "down")])
        self.assertEqual(names[i + 9], "model.layers.0.mlp.experts.2.down_proj.weight")
        self.assertIn("model.layers.1.mlp.gate_proj.weight", names)
        self.assertNotIn("model.layers.0.mlp.gate_proj.weight", names)
        self.assertNotIn("model.layers.1.mlp.gate.weight", names)


if __name__ == "__main__":
    unittest.main()
