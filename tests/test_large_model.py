"""A model's file larger than the memory available to ./run (cli/available_memory.h): the run says
so in one line, leaves the file's pages to come in as tokens read them instead of reading it whole
at load, and writes the same tokens. The file is the shipped model padded to 256 MB (a load reads
none of the padding: test_mapped_weights), the memory a cgroup limited to 128 MB made for the run
(cgroup v1 or v2; it needs root, and is skipped with the reason elsewhere). The cgroup's peak
memory tells the two loads apart: a whole read would fill its 128 MB with the file's pages; read
as tokens need them, the run holds a few MB of weights beside its own memory.
Standard library only."""
import os
import re
import shutil
import subprocess

import hf_model

ROOT = hf_model.ROOT
SHIPPED = os.path.join(ROOT, "models", "tinystories.bin")
LIMIT = 128 << 20
SIZE = 256 << 20
ARGS = ["-i", "Once upon a time", "-n", "16", "-s", "1", "-t", "0"]


def memory_cgroup(name):
    """A new memory cgroup limited to LIMIT: its folder, or the reason there is none."""
    if os.path.isfile("/sys/fs/cgroup/memory/memory.limit_in_bytes"):  # v1 (alone or beside v2)
        base, limit_file = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
    elif os.path.isfile("/sys/fs/cgroup/cgroup.controllers"):
        base, limit_file = "/sys/fs/cgroup", "memory.max"
        with open(os.path.join(base, "cgroup.subtree_control")) as f:
            if "memory" not in f.read().split():
                return None, "cgroup v2 without the memory controller enabled for its children"
    else:
        return None, "no memory cgroup here"
    path = os.path.join(base, name)
    try:
        os.mkdir(path)
    except OSError as e:
        return None, "cannot make a memory cgroup in %s (%s): needs root" % (base, e.strerror)
    try:
        with open(os.path.join(path, limit_file), "w") as f:
            f.write(str(LIMIT))
    except OSError as e:
        os.rmdir(path)
        return None, "cannot limit a memory cgroup (%s)" % e.strerror
    enter = subprocess.run(["sh", "-c", 'echo $$ > "$0"', os.path.join(path, "cgroup.procs")], capture_output=True,
                           text=True)
    if enter.returncode != 0:  # cgroup v2 inside a container: processes only in leaves, for one
        os.rmdir(path)
        return None, "a process cannot enter a new memory cgroup here: %s" % enter.stderr.strip()
    return path, None


def cgroup_peak(path):
    """The most memory the cgroup has held, page cache included (v1 memory.max_usage_in_bytes, v2
    memory.peak: Linux 5.19 on), or None."""
    for name in ("memory.max_usage_in_bytes", "memory.peak"):
        try:
            with open(os.path.join(path, name)) as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return None


class LargerThanMemory(hf_model.TempDirTestCase):
    def setUp(self):
        super().setUp()
        if not os.path.exists(SHIPPED):
            self.skipTest("models/tinystories.bin is missing")
        self.cgroup, why = memory_cgroup("qwen3_test_large_model_%d" % os.getpid())
        if self.cgroup is None:
            self.skipTest(why)
        self.addCleanup(os.rmdir, self.cgroup)

    def run_model(self, model, cgroup=None):
        """./run on model, in cgroup (entered by a shell that then becomes ./run) or not."""
        enter = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(cgroup, "cgroup.procs")] if cgroup else []
        return subprocess.run(enter + [hf_model.RUN, model] + ARGS, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)

    def test_read_as_tokens_need_it(self):
        model = os.path.join(self.tmp, "padded.bin")
        shutil.copyfile(SHIPPED, model)
        os.truncate(model, SIZE)  # a sparse tail: no disk
        limited = self.run_model(model, self.cgroup)  # first: none of the padding in the page cache yet
        free = self.run_model(model)
        self.assertEqual(free.returncode, 0, free.stderr)
        self.assertNotIn("larger than the memory", free.stderr)
        self.assertEqual(limited.returncode, 0, limited.stderr)
        self.assertRegex(limited.stderr, r"run: note: %s \(0\.3 GB\) is larger than the memory available to it "
                                         r"\(0\.1 GB\): its weights are read from the disk as tokens need them"
                                         % re.escape(model))
        self.assertEqual(limited.stdout, free.stdout)
        peak = cgroup_peak(self.cgroup)
        if peak is None:
            print("the cgroup's peak memory not checked: no memory.peak here")
            return
        self.assertLess(peak, SIZE // 4, "in 128 MB the load leaves the file's pages to the tokens (the cgroup's "
                                         "peak memory, page cache included)")
        print("the run's cgroup peaked at %.1f MB of %d MB" % (peak / 2**20, LIMIT >> 20))


if __name__ == "__main__":
    import unittest
    unittest.main()
