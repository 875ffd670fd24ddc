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
         "SIZE_NONE": None}
FLAGS = {"0": 0, "FLAG_QK_NORM": export.FLAG_QK_NORM, "FLAG_QKV_BIAS": export.FLAG_QKV_BIAS,
         "FLAG_TIED_EMBED": export.FLAG_TIED_EMBED}


def c_table():
    """model.c's TENSOR TABLE block as (name, rows, cols, per layer, only with, not with) rows."""
    with open(os.path.join(ROOT, "model.c")) as f:
        text = f.read()
    m = re.search(r"/\* BEGIN TENSOR TABLE.*?\*/(.*?)/\* END TENSOR TABLE \*/", text, re.S)
    assert m, "model.c has no TENSOR TABLE block"
    rows = []
    for line in m.group(1).strip().splitlines():
        f = re.fullmatch(r'\s*\{"(\w+)",\s*([01]),\s*(\w+),\s*(\w+),\s*(\w+),\s*(\w+),\s*offsetof\((\w+), (\w+)\)\},',
                         line)
        assert f, "a TENSOR TABLE line this test cannot read: " + line
        name, per_layer, r, c, only, not_with, struct, field = f.groups()
        assert field == name, f"{name}'s pointer is {struct}.{field}"
        assert (struct == "LayerWeights") == (per_layer == "1"), f"{name}: per layer, but in {struct}"
        rows.append((name, SIZES[r], SIZES[c], per_layer == "1", FLAGS[only], FLAGS[not_with]))
    return rows


def doc_table():
    """docs/checkpoint.md's table under "## The tensors", in the same form."""
    with open(os.path.join(ROOT, "docs", "checkpoint.md")) as f:
        text = f.read()
    section = text.split("## The tensors", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        f = re.fullmatch(r"\| `(\w+)` \| (yes|no) \| (MATRIX|vector) \[([\w*]+)(?:, ([\w*]+))?\] \| (.*) \|", line)
        if not f:
            continue
        name, per_layer, kind, r, c, stored = f.groups()
        assert (kind == "MATRIX") == (c is not None), line
        only = FLAGS[stored.split()[1]] if stored.startswith("with ") else 0
        not_with = FLAGS[stored.split()[1]] if stored.startswith("without ") else 0
        assert stored == "always" or only or not_with, line
        rows.append((name, r, c, per_layer == "yes", only, not_with))
    return rows


class TensorTable(unittest.TestCase):
    def test_export_mirrors_the_table(self):
        self.assertEqual(c_table(), [(n, r, c, p, o, w) for n, _, r, c, p, o, w in export.TENSORS])

    def test_docs_show_the_table(self):
        self.assertEqual(c_table(), doc_table())

    def test_the_reader_can_fail(self):
        """A changed row shows: the comparison is not of two empty lists."""
        rows = c_table()
        self.assertGreaterEqual(len(rows), 17)
        self.assertIn(("lm_head", "vocab_size", "dim", False, 0, export.FLAG_TIED_EMBED), rows)
        self.assertNotEqual(rows[:-1], doc_table())

    def test_export_plan_follows_the_flags(self):
        """export.py's plan for each flag combination: the layers' tensors between embed_tokens and
        norm, biases only with FLAG_QKV_BIAS, QK-Norm only with FLAG_QK_NORM, no lm_head when tied."""
        c = dict(dim=8, hidden_dim=16, vocab_size=10, head_dim=4, n_heads=2, n_kv_heads=1, n_layers=2)
        for flags in range(8):
            plan = [name for name, _, _ in export.tensor_plan(dict(c, flags=flags))]
            self.assertEqual(plan[0], "model.embed_tokens.weight")
            self.assertEqual(plan[-1] if flags & export.FLAG_TIED_EMBED else plan[-2], "model.norm.weight")
            self.assertEqual(any(n.endswith("q_proj.bias") for n in plan), bool(flags & export.FLAG_QKV_BIAS))
            self.assertEqual(any(n.endswith("q_norm.weight") for n in plan), bool(flags & export.FLAG_QK_NORM))
            per_layer = sum(1 for t in export.TENSORS if t[4] and (flags & t[5]) == t[5])
            self.assertEqual(len(plan), per_layer * 2 + 2 + (0 if flags & export.FLAG_TIED_EMBED else 1))


if __name__ == "__main__":
    unittest.main()
