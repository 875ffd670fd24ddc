/* tests/test_checkpoint_map.c: checkpoint_map() gives back the file's exact bytes, mapped at a
 * 2 MB boundary or copied, for sizes around the 2 MB page size, on a freshly written file (whose
 * page cache is in small pages) and again on the same file.
 *
 * The default load leaves the system's page cache alone: it never writes the file back, drops it
 * or reads it again. The test sees a drop with mincore(): the file has a tail past the bytes
 * loaded (8 MB past them: populating the mapping's last 2 MB page reads ahead the next 2 MB of the
 * file), resident because it was just written, which no load reads back; a drop of the file's
 * cache (POSIX_FADV_DONTNEED over the whole file, what CHECKPOINT_REFILL does) empties it, so it
 * must still be resident after a default load. With CHECKPOINT_REFILL the bytes are the same;
 * where the loader did refill (the system gives file mappings 2 MB pages) the tail is gone from
 * the cache, the mapping is in 2 MB pages, and a second load does not refill again. Whether 2 MB
 * pages are had at all depends on the kernel and filesystem, so that is reported, not asserted.
 * The files live under $BUILD_DIR (default build/), not /tmp, which may be a tmpfs, whose pages
 * cannot be dropped; on a tmpfs the tail checks are skipped with a note. */
#include "checkpoint_map.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#define MB2 ((size_t)2 << 20)
#define TMPFS_MAGIC_NUMBER 0x01021994

static int passed = 0, failed = 0;

static void check(int ok, const char* what, size_t size) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL: %s (file of %zu bytes)\n", what, size);
    }
}

static unsigned char pattern_byte(size_t i) { return (unsigned char)((i * 2654435761u) >> 13); }

static int write_file(const char* path, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    unsigned char buf[65536];
    for (size_t done = 0; done < size;) {
        size_t n = size - done < sizeof buf ? size - done : sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = pattern_byte(done + i);
        if (write(fd, buf, n) != (ssize_t)n) {
            close(fd);
            return -1;
        }
        done += n;
    }
    return close(fd);
}

static int same_bytes(const unsigned char* p, size_t size) {
    for (size_t i = 0; i < size; i++)
        if (p[i] != pattern_byte(i)) return 0;
    return 1;
}

/* Pages of path's bytes [from, to) in the page cache, by mincore() of a mapping that faults
 * nothing in; -1 where that cannot be asked. */
static long resident_pages(const char* path, size_t from, size_t to) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    void* p = mmap(NULL, to, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return -1;
    size_t first = from / page, n = (to + page - 1) / page - first;
    unsigned char* vec = malloc(n);
    long in = -1;
    if (vec && mincore((char*)p + first * page, n * page, vec) == 0) {
        in = 0;
        for (size_t i = 0; i < n; i++) in += vec[i] & 1;
    }
    free(vec);
    munmap(p, to);
    return in;
}

/* One load of path's first size bytes; returns its 2 MB bytes and `refilled` through the pointers. */
static void load_once(const char* path, size_t size, int how, long long* huge, int* refilled) {
    int fd = open(path, O_RDONLY);
    CheckpointMap m;
    int err = checkpoint_map(&m, fd, size, how);
    close(fd);
    check(err == 0, "checkpoint_map succeeds", size);
    if (err != 0) return;
    check(m.size == size, "size is the file's", size);
    check(m.copied == (how == CHECKPOINT_COPIED), "copied says how it was loaded", size);
    check(same_bytes(m.data, size), "the bytes are the file's", size);
    check((uintptr_t)m.data % MB2 == 0, "the data starts on a 2 MB boundary", size);
    long long h = checkpoint_map_huge_bytes(&m);
    if (how == CHECKPOINT_COPIED) check(h == -1, "a copy has no 2 MB file pages to count", size);
    else check(h >= -1 && h <= (long long)size, "huge bytes in range", size);
    if (how != CHECKPOINT_REFILL) check(!m.refilled, "only CHECKPOINT_REFILL refills", size);
    if (huge) *huge = h;
    if (refilled) *refilled = m.refilled;
    checkpoint_unmap(&m);
    check(m.data == NULL, "unmap clears the map", size);
}

/* Every size loaded twice mapped (the default) and once copied. */
static void test_sizes(const char* path) {
    const size_t sizes[] = {1, 4096, MB2 - 1, MB2, 3 * MB2 + 12345, 24 * MB2};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t size = sizes[k];
        if (write_file(path, size) != 0) {
            check(0, "the test file can be written", size);
            return;
        }
        long long huge1 = -1, huge2 = -1;
        load_once(path, size, CHECKPOINT_MAPPED, &huge1, NULL);
        load_once(path, size, CHECKPOINT_MAPPED, &huge2, NULL);
        load_once(path, size, CHECKPOINT_COPIED, NULL, NULL);
        printf("%10zu bytes, default loads: in 2 MB pages %lld, then %lld bytes\n", size, huge1, huge2);
    }
}

/* A default load keeps the just-written tail resident; a refilling one may drop it. */
static void test_page_cache(const char* path, int can_drop) {
    const size_t size = 24 * MB2, gap = 4 * MB2, tail = 2 * MB2, tail_pages = tail / (size_t)sysconf(_SC_PAGESIZE);
    const size_t end = size + gap + tail;
    if (write_file(path, end) != 0) {
        check(0, "the test file can be written", end);
        return;
    }
    long before = resident_pages(path, end - tail, end);
    if (!can_drop || before != (long)tail_pages) {
        printf("page cache checks skipped: %s\n", !can_drop ? "the test folder is on a tmpfs, whose pages cannot "
               "be dropped" : "the tail just written is not all resident (memory pressure or no mincore())");
    } else {
        load_once(path, size, CHECKPOINT_MAPPED, NULL, NULL);
        check(resident_pages(path, end - tail, end) == (long)tail_pages,
              "a default load leaves the file's cached pages in the page cache", size);
    }

    long long huge1 = -1, huge2 = -1;
    int refilled1 = 0, refilled2 = 0;
    load_once(path, size, CHECKPOINT_REFILL, &huge1, &refilled1);
    long after = resident_pages(path, end - tail, end);
    load_once(path, size, CHECKPOINT_REFILL, &huge2, &refilled2);
    if (refilled1) {
        if (can_drop && before == (long)tail_pages) check(after == 0, "a refill drops the file's cache", size);
        printf("tail pages resident: %ld before, %ld after the refill\n", before, after);
        check(huge1 >= (long long)(size - size / 100), "after a refill, 2 MB pages", size);
        check(!refilled2, "a second load does not refill the cache again", size);
    }
    printf("%10zu bytes, refilling loads: in 2 MB pages %lld%s, then %lld bytes%s\n", size, huge1,
           refilled1 ? " (cache refilled)" : "", huge2, refilled2 ? " (cache refilled)" : "");
}

int main(void) {
    const char* build = getenv("BUILD_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test_checkpoint_map.XXXXXX", build && *build ? build : "build");
    if (mkdtemp(dir) == NULL) {
        snprintf(dir, sizeof dir, "/tmp/test_checkpoint_map.XXXXXX");
        if (mkdtemp(dir) == NULL) {
            printf("cannot make a temporary directory: %s\n", strerror(errno));
            return 1;
        }
    }
    struct statfs fs;
    const int can_drop = statfs(dir, &fs) == 0 && fs.f_type != TMPFS_MAGIC_NUMBER;
    char path[4200];
    snprintf(path, sizeof path, "%s/ckpt", dir);
    test_sizes(path);
    test_page_cache(path, can_drop);
    unlink(path);
    rmdir(dir);

    CheckpointMap m;
    check(checkpoint_map(&m, -1, 4096, CHECKPOINT_MAPPED) != 0, "a bad descriptor is an error", 4096);
    check(checkpoint_map(&m, -1, 4096, CHECKPOINT_REFILL) != 0, "a bad descriptor is an error (refill)", 4096);
    check(checkpoint_map(&m, -1, 4096, CHECKPOINT_COPIED) != 0, "a bad descriptor is an error (copy)", 4096);

    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
