"""The benchmark's random checkpoints: tools/make_random_qwen3.py --size and tools/bench_models.py,
and `make bench` over BENCH_SIZES.

* --size S --config-only writes the config.json of each Qwen3 dense size as QWEN3.md 1.1 tabulates
  it (the numbers are written out here again, from the table), and the parameter count it reports
  is the model cards' total; no model.safetensors;
* an untied config gets an lm_head.weight [vocab, hidden] of its own values (not the embedding's)
  that export.py and ./run take; a tied one gets none;
* a write that fails part way leaves no model.safetensors and no temporary file, and says why in
  one line;
* bench_models.py keeps the 0.6B names (DIR/hf, DIR/qwen3-0.6b-FORMAT.bin) and names the other
  sizes DIR/hf-SIZE and DIR/qwen3-SIZE-FORMAT.bin; a format too large for the disk is skipped with
  the sizes in the message;
* `make bench` runs each size's checkpoints that are there (the 0.6B name here holds the shipped
  model) and skips, with a message, a format larger than half of the memory (14B in f32).

Python 3 standard library; skips, with the reason, what needs ./run or a current build.
"""
import json
import os
import struct
import subprocess
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402
from hf_model import Spec  # noqa: E402

ROOT = hf_model.ROOT
MAKE_RANDOM = os.path.join(ROOT, "tools", "make_random_qwen3.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_models  # noqa: E402
from hf_model import PYTHON  # noqa: E402

# QWEN3.md 1.1: hidden, intermediate, layers, heads, kv heads, tied; and the cards' total parameters.
TABLE = {
    "0.6b": (1024, 3072, 28, 16, 8, True, "0.596B"),
    "1.7b": (2048, 6144, 28, 16, 8, True, "1.721B"),
    "4b": (2560, 9728, 36, 32, 8, True, "4.022B"),
    "8b": (4096, 12288, 36, 32, 8, False, "8.191B"),
    "14b": (5120, 17408, 40, 40, 8, False, "14.768B"),
}


def make_random(*args):
    return subprocess.run([*PYTHON, MAKE_RANDOM] + list(args), capture_output=True, text=True,
                          timeout=300)


def safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


class MakeRandom(hf_model.TempDirTestCase):
    NEEDS_TOOLS = False  # only the untied test runs export.py and ./run, and skips without them

    def test_each_size_config(self):
        for size, (D, F, L, H, K, tie, params) in TABLE.items():
            out = os.path.join(self.tmp, "cfg-" + size)
            p = make_random(out, "--size", size, "--config-only")
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(out, "config.json")) as f:
                cfg = json.load(f)
            got = tuple(cfg[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "num_key_value_heads", "tie_word_embeddings"))
            self.assertEqual(got, (D, F, L, H, K, tie), size)
            self.assertEqual((cfg["head_dim"], cfg["vocab_size"], cfg["max_window_layers"]), (128, 151936, L), size)
            self.assertEqual((cfg["rms_norm_eps"], cfg["rope_theta"]), (1e-6, 1000000), size)
            self.assertIn(f" {params} parameters", p.stdout, size)
            self.assertIn("untied head" if not tie else "tied head", p.stdout)
            self.assertEqual(sorted(n for n in os.listdir(out) if n.endswith(".safetensors")), [], size)
        p = make_random(os.path.join(self.tmp, "both"), "--size", "8b", "--config", "x.json")
        self.assertEqual(p.returncode, 2)
        self.assertIn("not allowed with argument", p.stderr)

    def tiny(self, name, tie):
        """A tiny Qwen3 written by make_random_qwen3.py --config, with hf_model's tokenizer."""
        tok = os.path.join(self.tmp, "tok")
        if not os.path.exists(tok):
            hf_model.write_model(tok, Spec())
        cfg = Spec(tie=tie, dim=64, hidden_dim=128, vocab_size=300).config()
        path = os.path.join(self.tmp, name + ".json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        out = os.path.join(self.tmp, name)
        p = make_random(out, "--config", path, "--tokenizer", tok)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(out, "generation_config.json")) as f:
            gen = json.load(f)
        # the config's ids, inside its vocabulary (Qwen3's 151643 and up are not)
        self.assertEqual((gen["eos_token_id"], gen["bos_token_id"]), ([cfg["eos_token_id"]], cfg["bos_token_id"]))
        return out

    def test_untied_head_is_stored_and_runs(self):
        for tie in (False, True):
            out = self.tiny("untied" if not tie else "tied", tie)
            st = os.path.join(out, "model.safetensors")
            header, base = safetensors_header(st)
            self.assertEqual("lm_head.weight" in header, not tie)
            if tie:
                continue
            self.assertEqual(header["lm_head.weight"]["shape"], [300, 64])
            with open(st, "rb") as f:
                data = f.read()
            emb, head = (header[n]["data_offsets"] for n in ("model.embed_tokens.weight", "lm_head.weight"))
            self.assertNotEqual(data[base + emb[0]:base + emb[1]], data[base + head[0]:base + head[1]])
            why = hf_model.missing_tools()
            if why:
                self.skipTest(why)
            ckpt = os.path.join(self.tmp, "untied.bin")
            p = subprocess.run([*PYTHON, hf_model.EXPORT, out, ckpt, "--dtype", "bf16"],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            p = subprocess.run([hf_model.RUN, ckpt, "--prompt-ids", "1,2,3", "-n", "2", "-t", "0"],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)

    def test_failed_write_leaves_nothing(self):
        """The disk filling up in the middle (an OSError from the third write): one line (after the
        progress), exit 1, no model.safetensors and no temporary file."""
        out = os.path.join(self.tmp, "full")
        code = ("import sys; sys.argv = ['make_random_qwen3.py'] + sys.argv[1:]\n"
                "import make_random_qwen3 as m\n"
                "real, calls = m.write_repeated, []\n"
                "def failing(f, *a):\n"
                "    calls.append(1)\n"
                "    if len(calls) == 3:\n"
                "        raise OSError(28, 'No space left on device', f.name)\n"
                "    real(f, *a)\n"
                "m.write_repeated = failing\n"
                "m.main()\n")
        p = subprocess.run([*PYTHON, "-c", code, out, "--size", "0.6b", "--layers", "1"],
                           cwd=os.path.join(ROOT, "tools"), capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr.strip().splitlines()[-1], r"^make_random_qwen3.py: error: \S+model.safetensors.tmp: "
                                           r"No space left on device; no model.safetensors written$")
        self.assertEqual(os.listdir(out), [])


class BenchModels(hf_model.TempDirTestCase):
    NEEDS_TOOLS = False  # the make test checks that the build is current

    def test_names(self):
        d = "build/bench"
        self.assertEqual(bench_models.hf_folder(d), "build/bench/hf")
        self.assertEqual(bench_models.checkpoint(d, "q8"), "build/bench/qwen3-0.6b-q8.bin")
        self.assertEqual(bench_models.hf_folder(d, "8b"), "build/bench/hf-8b")
        self.assertEqual(bench_models.checkpoint(d, "q4", "8b"), "build/bench/qwen3-8b-q4.bin")

    def test_no_room_on_disk(self):
        """8B q4 with no Hugging Face folder yet: 16.4 GB of folder and about 4.7 of q4 (export
        quantises as it streams: no other file) do not fit in 10 GB; with the folder there, they
        do, and not in 3 GB."""
        free = mock.Mock(f_bavail=10 * 10**9 // 4096, f_frsize=4096)
        with mock.patch("os.statvfs", return_value=free):
            why = bench_models.no_room(self.tmp, "8b", "q4")
        self.assertRegex(why, r"^needs about 21\.\d GB of disk \(the q4 file 4\.\d \+ the Hugging Face "
                              r"folder 16\.4\), 10\.0 GB free in ")
        hf = os.path.join(self.tmp, "hf-8b")
        os.makedirs(hf, exist_ok=True)
        open(os.path.join(hf, "model.safetensors"), "wb").close()
        with mock.patch("os.statvfs", return_value=free):
            self.assertIsNone(bench_models.no_room(self.tmp, "8b", "q4"))
        free.f_bavail = 3 * 10**9 // 4096
        with mock.patch("os.statvfs", return_value=free):
            self.assertRegex(bench_models.no_room(self.tmp, "8b", "q4"), r"^needs about 4\.\d GB of disk \(the q4 file")

    def test_make_bench_sizes(self):
        """make bench BENCH_SIZES="0.6b 14b" BENCH_DTYPES=f32: the 0.6B file (the shipped model
        under that name) is benchmarked, 14B in f32 (59 GB) is skipped with the reason; 14B alone
        benchmarks nothing and fails with one line."""
        why = hf_model.missing_tools()
        if why:
            self.skipTest(why)
        here = os.path.join(ROOT, "run")  # make links it to build/run
        if not os.path.exists(here) or not os.path.samefile(hf_model.RUN, here):
            self.skipTest("make bench runs ./run, not this build's engine (%s)" % hf_model.RUN)
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if ram / 2 > 4 * 14.8e9:
            self.skipTest("this machine has the memory for 14B in f32: the test would write it")
        # a make of its own, not a part of the `make test` that may have started this test; -o all:
        # the recipe of bench with the ./run there is, not a build
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        d = os.path.join(self.tmp, "make_bench")
        os.makedirs(d)
        os.symlink(os.path.join(ROOT, "models", "tinystories.bin"), os.path.join(d, "qwen3-0.6b-f32.bin"))
        p = subprocess.run(["make", "-s", "-o", "all", "bench", "BENCH_DIR=" + d, "BENCH_SIZES=0.6b 14b",
                            "BENCH_DTYPES=f32", "BENCH_THREADS=1",
                            "BENCH_ARGS=--bench-prompt 0 --bench-gen 2 --bench-reps 1"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual([l for l in p.stdout.splitlines() if l.startswith("==")], ["== qwen3-0.6b-f32"])
        self.assertIn("tg2", p.stdout)
        self.assertRegex(p.stderr, r"bench_models.py: skipping f32 of 14b: about 59\.1 GB, more than half "
                                   r"of this machine's [\d.]+ GB of memory")
        self.assertEqual(os.listdir(d), ["qwen3-0.6b-f32.bin"])
        # 14b alone: nothing is benchmarked, and make says so with a non-zero exit
        p = subprocess.run(["make", "-s", "-o", "all", "bench", "BENCH_DIR=" + d, "BENCH_SIZES=14b",
                            "BENCH_DTYPES=f32"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
        self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertNotIn("==", p.stdout)
        self.assertIn("make bench: nothing benchmarked: every format of 14b skipped (the reasons above)", p.stderr)


if __name__ == "__main__":
    unittest.main()
