"""tools/drop_page_cache.py, the tool a user runs on purpose to drop model files from the page
cache (./run itself never changes it):

* --help says what it does and exits 0;
* a just-written file (its pages resident and dirty) is written back and dropped: none of its pages
  are in the page cache afterwards (mincore(2) through ctypes), and the tool prints one line that
  names the file and what it did;
* a missing file or a directory is one error line on stderr naming the file and the problem and a
  non-zero exit, and the other files named are still dropped.

The test file lives under build/ (not a temporary folder, which may be a tmpfs, whose pages cannot
be dropped). Linux only (posix_fadvise, mincore); skips elsewhere. Standard library only."""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_model import PYTHON  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "drop_page_cache.py")


def tool(*args):
    return subprocess.run([*PYTHON, TOOL] + list(args), capture_output=True, text=True, timeout=60)


def filesystem_type(path):
    """The type of the filesystem path is on, from /proc/self/mounts (the longest mount point
    that contains it), or None."""
    path, best, kind = os.path.realpath(path), "", None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                point = fields[1].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind


def resident_pages(path):
    """Pages of path in the page cache, by mincore() of a mapping that faults nothing in."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    finally:
        os.close(fd)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), "mmap failed")
    try:
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        if libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return sum(v & 1 for v in vec)
    finally:
        libc.munmap(addr, size)


class DropPageCache(unittest.TestCase):
    def setUp(self):
        if not sys.platform.startswith("linux") or not hasattr(os, "posix_fadvise"):
            self.skipTest("Linux only (posix_fadvise, mincore)")
        os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
        self.tmp = tempfile.mkdtemp(dir=os.path.join(ROOT, "build"), prefix="drop_page_cache_test_")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def write(self, name, size):
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            f.write(os.urandom(size))
        return path

    def test_help(self):
        p = tool("--help")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("usage:", p.stdout)
        self.assertIn("MODEL", p.stdout)
        self.assertIn("page cache", p.stdout)

    def test_drops_a_just_written_file(self):
        if filesystem_type(self.tmp) in ("tmpfs", "ramfs"):
            self.skipTest("build/ is on a tmpfs, whose pages cannot be dropped")
        path = self.write("model.bin", 3 << 20)
        before = resident_pages(path)
        if before == 0:
            self.skipTest("the file just written is not resident (memory pressure)")
        p = tool(path)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        self.assertEqual(p.stdout, "%s: 3.1 MB written back and dropped from the page cache\n" % path)
        self.assertEqual(resident_pages(path), 0, "%d pages resident before the tool" % before)

    def test_missing_file_and_directory(self):
        path = self.write("model.bin", 1 << 20)
        missing = os.path.join(self.tmp, "missing.bin")
        p = tool(missing, self.tmp, path)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stderr, "drop_page_cache.py: %s: No such file or directory\n"
                                   "drop_page_cache.py: %s: not a regular file\n" % (missing, self.tmp))
        self.assertEqual(p.stdout, "%s: 1.0 MB written back and dropped from the page cache\n" % path)


if __name__ == "__main__":
    unittest.main()
