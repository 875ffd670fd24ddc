/* tests/test_mapped_weights.c: transformer_load maps the checkpoint file as it is, at a 2 MB
 * boundary, and leaves the system's page cache alone.
 *
 * The file is the shipped model (models/tinystories.bin) with bytes appended (the loader ignores
 * what no section covers), so that the file's size falls around multiples of the 2 MB page size,
 * where the mapping's trimmed reservation has its edge cases. Each load must give back the file's
 * exact bytes at a 2 MB-aligned address, a count of 2 MB-page bytes within the file's size, and
 * the shipped model's logits.
 *
 * The page cache: each file is written just before its load, so its pages are dirty (not yet
 * written back), which /proc/self/smaps reports for any mapping of them (Private_Dirty,
 * Shared_Dirty). A load that wrote the file back (fsync, fdatasync) or dropped it from the cache
 * (POSIX_FADV_DONTNEED starts the write-back of dirty pages) would leave them clean; a load that
 * only maps and reads keeps them dirty. Whether 2 MB pages are had depends on the kernel and the
 * filesystem, so that is reported, not asserted. The files live under $BUILD_DIR (default build/),
 * not /tmp, which may be a tmpfs.
 *
 * And a load maps every page of the file (smaps' Rss), but with lazy_pages only what its checks
 * read. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model.h"
#include "checkpoint.h"
#include "cli/bench.h"

#define MODEL_PATH "models/tinystories.bin"
#define MB2 ((size_t)2 << 20)

static int passed = 0, failed = 0;

static void check(int ok, const char* what, size_t size) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL: %s (file of %zu bytes)\n", what, size);
    }
}

typedef struct {
    unsigned char* model; /* the shipped model's bytes */
    size_t model_size;
    float* logits;        /* its logits after token 1 at position 0 */
    int vocab;
} Shipped;

static unsigned char pad_byte(size_t i) { return (unsigned char)((i * 2654435761u) >> 13); }

/* The byte at offset i of a file of the model followed by padding. */
static unsigned char file_byte(const Shipped* s, size_t i) {
    return i < s->model_size ? s->model[i] : pad_byte(i);
}

/* A new file each time: ext4 writes a file back on close when it was truncated and written again. */
static int write_file(const char* path, const Shipped* s, size_t size) {
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return -1;
    unsigned char buf[65536];
    for (size_t done = 0; done < size;) {
        size_t n = size - done < sizeof buf ? size - done : sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = file_byte(s, done + i);
        if (write(fd, buf, n) != (ssize_t)n) {
            close(fd);
            return -1;
        }
        done += n;
    }
    return close(fd);
}

/* The sum of smaps' fields a and b (b NULL: a alone) for the mapping that starts at `start`, in
 * bytes, or -1 where /proc/self/smaps cannot tell. */
static long long mapping_bytes(const void* start, const char* a, const char* b) {
    FILE* f = fopen("/proc/self/smaps", "r");
    if (f == NULL) return -1;
    char line[4096];
    int ours = 0;
    long long total = -1, kb;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            if (ours) break;
            ours = lo == (unsigned long)(uintptr_t)start;
            continue;
        }
        const size_t na = strlen(a), nb = b ? strlen(b) : 0;
        const char* field = strncmp(line, a, na) == 0 ? line + na : b && strncmp(line, b, nb) == 0 ? line + nb : NULL;
        if (ours && field && sscanf(field, " %lld kB", &kb) == 1) total = (total < 0 ? 0 : total) + kb * 1024;
    }
    fclose(f);
    return total;
}

/* Dirty bytes of the mapping that starts at `start` (Private_Dirty + Shared_Dirty), or -1. */
static long long dirty_bytes(const void* start) { return mapping_bytes(start, "Private_Dirty:", "Shared_Dirty:"); }

/* Dirty bytes of path's first size bytes in the page cache, seen through a mapping of our own. */
static long long dirty_in_cache(const char* path, size_t size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    const unsigned char* p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return -1;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    volatile unsigned char sink = 0;
    for (size_t i = 0; i < size; i += page) sink ^= p[i];
    (void)sink; /* read for its page faults only */
    long long dirty = dirty_bytes(p);
    munmap((void*)p, size);
    return dirty;
}

/* One load of a file of `size` bytes written just now. */
static void load_once(const char* path, const Shipped* s, size_t size) {
    if (write_file(path, s, size) != 0) {
        check(0, "the test file can be written", size);
        return;
    }
    const long long dirty_before = dirty_in_cache(path, size);
    const TransformerOptions opt = {.threads = 1, .ctx = 16};
    Transformer t;
    char err[512];
    int rc = transformer_load(&t, path, &opt, err, sizeof err);
    check(rc == 0, "transformer_load succeeds", size);
    if (rc != 0) {
        printf("  %s\n", err);
        return;
    }
    const long long dirty_after = dirty_bytes(t.file);
    check(t.file_size == size, "file_size is the file's", size);
    check((uintptr_t)t.file % MB2 == 0, "the mapping starts on a 2 MB boundary", size);
    int same = 1;
    for (size_t i = 0; i < size && same; i++) same = t.file[i] == file_byte(s, i);
    check(same, "the mapping holds the file's bytes", size);
    const long long huge = transformer_huge_page_bytes(&t);
    check(huge >= -1 && huge <= (long long)size, "the bytes in 2 MB pages are within the file", size);
    const int token = 1;
    const float* logits = forward(&t, &token, 1, 0, NULL);
    check(logits && memcmp(logits, s->logits, (size_t)s->vocab * sizeof(float)) == 0,
          "the shipped model's logits", size);

    if (dirty_before > 0)
        check(dirty_after > 0, "a load does not write the file back or drop it (its pages stay dirty)", size);
    else
        printf("  page cache check skipped: %s\n", dirty_before < 0 ? "no /proc/self/smaps here"
               : "the file was written back before the load (the system's flusher)");
    printf("%10zu bytes: in 2 MB pages %lld, dirty %lld before the load, %lld after\n", size, huge,
           dirty_before, dirty_after);
    transformer_free(&t);
    check(t.file == NULL, "transformer_free clears the mapping", size);
}

/* 0 where madvise(MADV_POPULATE_READ) succeeds on path's first page and maps nothing (qemu-user
 * takes it as a hint it may ignore): a load's Rss then tells nothing about what the engine asked. */
static int populate_read_maps(const char* path) {
#ifdef MADV_POPULATE_READ
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 1;
    void* p = mmap(NULL, page, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return 1;
    const int ignored = madvise(p, page, MADV_POPULATE_READ) == 0 && mapping_bytes(p, "Rss:", NULL) == 0;
    munmap(p, page);
    return !ignored;
#else
    return 1;
#endif
}

/* A load faults the whole file in (its mapping's Rss the file's size), unless lazy_pages asks it
 * not to (quantize and tokenize, which read each weight once or not at all): then only what the
 * checks read is mapped (the header and the tensor table; prefill_only leaves decode's prefetch
 * untimed, which would read the weights). */
static void test_lazy_pages(const char* path, const Shipped* s, size_t size) {
    const TransformerOptions whole = {.threads = 1, .ctx = 16}, lazy = {.threads = 1, .ctx = 16, .lazy_pages = 1,
                                                                      .prefill_only = 1};
    const TransformerOptions* opts[] = {&whole, &lazy};
    if (write_file(path, s, size) != 0) {
        check(0, "the test file can be written", size);
        return;
    }
    for (int k = 0; k < 2; k++) {
        Transformer t;
        char err[512];
        if (transformer_load(&t, path, opts[k], err, sizeof err) != 0) {
            check(0, "transformer_load succeeds", size);
            continue;
        }
        const long long rss = mapping_bytes(t.file, "Rss:", NULL);
        if (rss < 0) printf("  lazy_pages check skipped: no /proc/self/smaps here\n");
        else if (k == 0 && !populate_read_maps(path))
            printf("  whole-file check skipped: madvise(MADV_POPULATE_READ) succeeds and maps nothing (qemu-user)\n");
        else if (k == 0) check(rss >= (long long)t.file_size, "a load maps every page of the file", t.file_size);
        else check(rss < (long long)t.file_size / 2, "lazy_pages: a load maps what its checks read only", t.file_size);
        printf("%10zu bytes: %lld resident after a load%s\n", t.file_size, rss, k ? " with lazy_pages" : "");
        transformer_free(&t);
    }
}

/* The shipped model's bytes and its logits after token 1, from a load of the file itself. */
static int read_shipped(Shipped* s) {
    FILE* f = fopen(MODEL_PATH, "rb");
    if (f == NULL) return -1;
    fseek(f, 0, SEEK_END);
    s->model_size = (size_t)ftell(f);
    rewind(f);
    s->model = malloc(s->model_size);
    int ok = s->model && fread(s->model, 1, s->model_size, f) == s->model_size;
    fclose(f);
    Transformer t;
    char err[512];
    const TransformerOptions opt = {.threads = 1, .ctx = 16};
    if (!ok || transformer_load(&t, MODEL_PATH, &opt, err, sizeof err) != 0) return -1;
    const int token = 1;
    s->vocab = t.config.vocab_size;
    s->logits = malloc((size_t)s->vocab * sizeof(float));
    const float* logits = forward(&t, &token, 1, 0, NULL);
    if (s->logits && logits) memcpy(s->logits, logits, (size_t)s->vocab * sizeof(float));
    transformer_free(&t);
    return s->logits && logits ? 0 : -1;
}

int main(void) {
    Shipped s = {0};
    if (access(MODEL_PATH, R_OK) != 0) {
        printf("skipped: %s not found (run from the repository root)\n", MODEL_PATH);
        return 0;
    }
    if (read_shipped(&s) != 0) {
        printf("FAIL: %s does not load\n", MODEL_PATH);
        return 1;
    }
    const char* build = getenv("BUILD_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test_mapped_weights.XXXXXX", build && *build ? build : "build");
    if (mkdtemp(dir) == NULL) {
        printf("cannot make a temporary directory %s: %s\n", dir, strerror(errno));
        return 1;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.bin", dir);
    /* The model as it is, then sizes a byte below, at and a byte above a multiple of 2 MB, and
     * one neither a multiple of 2 MB nor of the page size. */
    const size_t whole = (s.model_size + MB2 - 1) / MB2 * MB2 + MB2;
    const size_t sizes[] = {s.model_size, whole - 1, whole, whole + 1, whole + 3 * MB2 + 12345};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) load_once(path, &s, sizes[k]);
    test_lazy_pages(path, &s, whole + 3 * MB2 + 12345); /* the checks read none of the padding */
    unlink(path);
    rmdir(dir);
    free(s.model);
    free(s.logits);

    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
