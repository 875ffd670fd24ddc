#!/usr/bin/env python3
"""drop_page_cache.py: drops model files from the system's page cache, so that the next run of
./run reads them back in 2 MB pages.

    python3 tools/drop_page_cache.py MODEL [MODEL ...]

./run maps its checkpoint as the page cache holds it. A file that was copied, read with read() or
cat, or cached for a long time sits there, wholly or in part, in 4 KB pages, which decode reads
several times slower on some virtual machines (docs/design.md#small-file-pages); the bench says
when (`./run MODEL -m bench`: "weights mapped, N of M MB in 2 MB pages", and a note below 99%).
This tool writes each file's dirty pages back (fsync, where the file is writable) and asks the
kernel to drop its cached pages (posix_fadvise POSIX_FADV_DONTNEED). The next run of ./run maps
the file with MADV_HUGEPAGE and reads it in again as 2 MB pages, where the kernel gives file
mappings transparent huge pages (Linux 6.x, THP enabled or madvise).

The page cache is shared by every process: after the drop, any program that reads the file reads
it from disk again. Pages that a running process has mapped stay. Linux; Python 3 standard
library only. Exit status 0, or 1 when any file could not be dropped (one line on stderr each).
"""
import argparse
import os
import stat
import sys


def drop(path):
    """Writes back (where writable) and drops path's cached pages; returns a line saying what it
    did. Raises OSError, or ValueError for a path that is not a regular file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        synced = os.access(path, os.W_OK)
        if synced:
            os.fsync(fd)  # dirty pages cannot be dropped: write them back first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return "%s: %.1f MB %sdropped from the page cache" % (
        path, st.st_size / 1e6, "written back and " if synced else "")


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="The next ./run of each file reads it back in 2 MB pages where the kernel allows. "
               "See docs/design.md#small-file-pages.")
    ap.add_argument("models", nargs="+", metavar="MODEL", help="a file to drop from the page cache")
    a = ap.parse_args()
    if not hasattr(os, "posix_fadvise"):
        sys.exit("drop_page_cache.py: this system has no posix_fadvise (Linux only)")
    status = 0
    for path in a.models:
        try:
            print(drop(path))
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            print("drop_page_cache.py: %s: %s" % (path, reason), file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
