"""The RMSNorm training lab (tools/norm_train_lab.py, `make norm-train-lab`) on a tiny budget.

  * Two variants (qwen3 and post-norm), a few steps of 2 windows of 32 tokens on the first stories:
    the JSON of each has the training loss of every step, the validation losses, and per probe
    the largest attention logit and the rms of what attention reads per layer, and the residual
    stream's rms for the embeddings and after each layer, all finite.
  * A second run with the same seed gives the same losses, validation losses and probes.
  * The report and its three pictures are written.

It needs PyTorch in /usr/bin/python3 (Debian's python3-torch), as tools/train.py does; without it
the tests are skipped. About 10 s.
"""

import json
import math
import os
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "norm_train_lab.py")
PYTHON = "/usr/bin/python3"
DATA = ["/work/shared/data/tinystories_train_head_cased.txt", "/work/shared/data/tinystories_valid_subset.txt"]
VARIANTS = ["qwen3", "post-norm"]
STEPS = 4
# A tiny budget: 2 layers, 2 windows of 32 tokens a step, the first 40 stories.
TINY = ["--variants", ",".join(VARIANTS), "--steps", str(STEPS), "--batch", "2", "--ctx", "32", "--layers", "2",
        "--max-stories", "40", "--eval-every", "2", "--eval-windows", "2", "--probe-every", "2",
        "--probe-windows", "2", "--print-every", "100", "--threads", "1"]


def torch_missing():
    """Why the lab cannot run here, or None."""
    if not os.path.exists(PYTHON):
        return "%s not found (the lab runs Debian's python3-torch through it)" % PYTHON
    # find_spec looks for the package without importing it (an import of torch takes 2 s; a torch
    # that is there but broken fails the lab's run, which is the place to see it)
    find = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    p = subprocess.run([PYTHON, "-c", find], capture_output=True, text=True)
    if p.returncode != 0:
        return "%s has no torch (Debian's python3-torch)" % PYTHON
    for path in DATA:
        if not os.path.exists(path):
            return "%s not found (the lab trains on tools/train.py's TinyStories text)" % path
    return None


class NormTrainLab(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.why = torch_missing()
        if cls.why:
            return
        cls.tmp = tempfile.TemporaryDirectory(prefix="norm-train-lab-")
        # The first run trains the tokenizer into tmp/norm-train-lab-tok; the second reuses it.
        cls.first = cls.lab("a", report=True)
        cls.second = cls.lab("b", report=False)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "tmp", None):
            cls.tmp.cleanup()

    @classmethod
    def lab(cls, name, report):
        out = os.path.join(cls.tmp.name, name)
        args = [PYTHON, TOOL] + TINY + ["--out-dir", out]
        args += ["--report", os.path.join(out, "report.md"), "--svg-dir", out] if report else ["--no-report"]
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise AssertionError("norm_train_lab.py exited %d\n%s\n%s"
                                 % (p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
        runs = {}
        for v in VARIANTS:
            with open(os.path.join(out, v + ".json")) as f:
                runs[v] = json.load(f)
        return out, runs

    def setUp(self):
        if self.why:
            self.skipTest(self.why)

    def test_recorded_fields(self):
        _, runs = self.first
        for v, r in runs.items():
            with self.subTest(variant=v):
                L = r["config"]["num_hidden_layers"]
                self.assertEqual(L, 2)
                self.assertEqual(len(r["loss"]), STEPS)
                self.assertTrue(all(isinstance(x, float) and math.isfinite(x) for x in r["loss"]), r["loss"])
                self.assertEqual([e["step"] for e in r["val"]], [2, 4])
                self.assertEqual([p["step"] for p in r["probes"]], [0, 2, 4])
                for p in r["probes"]:
                    self.assertEqual(len(p["max_logit"]), L)
                    self.assertEqual(len(p["attn_in_rms"]), L)
                    self.assertEqual(len(p["resid_rms"]), L + 1)  # the embeddings, then after each layer
                    for x in p["max_logit"] + p["attn_in_rms"] + p["resid_rms"]:
                        self.assertTrue(isinstance(x, float) and math.isfinite(x), p)
                    self.assertTrue(all(x > 0 for x in p["attn_in_rms"] + p["resid_rms"]), p)
                self.assertIsNone(r["diverged_at"])
                self.assertIsNotNone(r["final"]["val"])
                self.assertEqual(r["run"]["seed"], 1337)
        # the variants differ only in their norms: the same initial weights and batches, so the
        # same embeddings' rms at step 0, but different losses
        a, b = runs["qwen3"], runs["post-norm"]
        self.assertEqual(a["probes"][0]["resid_rms"][0], b["probes"][0]["resid_rms"][0])
        self.assertNotEqual(a["loss"], b["loss"])

    def test_same_seed_same_numbers(self):
        _, one = self.first
        _, two = self.second
        for v in VARIANTS:
            with self.subTest(variant=v):
                self.assertEqual(one[v]["loss"], two[v]["loss"])
                self.assertEqual(one[v]["val"], two[v]["val"])
                self.assertEqual(one[v]["probes"], two[v]["probes"])

    def test_report_and_pictures(self):
        out, _ = self.first
        with open(os.path.join(out, "report.md")) as f:
            text = f.read()
        self.assertIn("Generated by `make norm-train-lab`", text)
        self.assertIn("do not edit by hand", text)
        for v in VARIANTS:
            self.assertIn("`%s`" % v, text)
        for name in ("loss", "logits", "resid"):
            path = os.path.join(out, "norm-train-%s.svg" % name)
            with open(path) as f:
                svg = f.read()
            self.assertTrue(svg.startswith("<svg") and svg.rstrip().endswith("</svg>"), path)
            self.assertIn("norm-train-%s.svg" % name, text)


if __name__ == "__main__":
    unittest.main()
