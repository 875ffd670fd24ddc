/* page_read.c: how fast a file's pages in the page cache stream, one thread, so that two programs
 * reading two files (this engine's checkpoint and llama.cpp's GGUF, tools/llama_cpp/compare.py)
 * can be told apart from the memory behind their files: on a VM two copies of one file can stream
 * at different speeds (docs/design.md#bench-roof).
 *
 *   cc -std=gnu11 -O2 -march=native -o build/page_read tools/page_read.c
 *   build/page_read FILE...      one line per file: "FILE: MB, GB/s (best of 5), % in 2 MB pages"
 *   build/page_read --pieces KB FILE...   and then the file read as KB-sized pieces at random
 *                                places: the access of a Qwen3-MoE decode, each chosen expert's
 *                                matrices one contiguous piece somewhere in the file
 *                                (docs/design.md#moe)
 *
 * Passive: the file is mapped as this engine maps a checkpoint (at a 2 MB boundary, with
 * MADV_HUGEPAGE) but its page cache is never dropped or read again, so the pages read are the ones
 * the next program to map the file gets. (compare.py drops both files from the page cache just
 * before, unless --keep-pages, so that this warm-up reads them back in 2 MB pages.) One warm-up
 * pass (it also faults the mapping in), then five timed passes. Linux; elsewhere the share of 2 MB
 * pages reads "unknown". */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HUGE ((size_t)2 << 20)

static volatile uint64_t sink;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* XOR of every 32-byte piece, four chains so the loads overlap (GCC / clang vector types: one
 * load each with AVX2, two with SSE2); the result keeps the reads. */
typedef uint64_t V4 __attribute__((vector_size(32)));

static uint64_t read_all(const uint8_t* p, size_t n) {
    V4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    size_t o = 0;
    for (; o + 128 <= n; o += 128) {
        V4 v[4];
        memcpy(v, p + o, sizeof v);
        s0 ^= v[0];
        s1 ^= v[1];
        s2 ^= v[2];
        s3 ^= v[3];
    }
    s0 ^= s1 ^ s2 ^ s3;
    uint64_t x = s0[0] ^ s0[1] ^ s0[2] ^ s0[3];
    for (; o < n; o++) x ^= p[o];
    return x;
}

/* As many bytes as the file holds, in pieces of `piece` bytes that start at random multiples of
 * `piece` (a fixed xorshift sequence, so every run reads the same places). */
static uint64_t read_pieces(const uint8_t* p, size_t n, size_t piece) {
    const size_t count = n / piece;
    uint64_t x = 0, state = 88172645463325252ull;
    for (size_t i = 0; i < count; i++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        x ^= read_all(p + (size_t)(state % count) * piece, piece);
    }
    return x;
}

/* FilePmdMapped of the mapping at addr in /proc/self/smaps, in bytes; -1 where unknown. */
static long long pmd_mapped_bytes(const void* addr) {
    FILE* f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0;
    long long kb = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
            continue;
        }
        if (in && sscanf(line, "FilePmdMapped: %lld kB", &kb) == 1) break;
    }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

static int probe(const char* path, size_t piece) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "page_read: %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        fprintf(stderr, "page_read: %s: empty or unreadable\n", path);
        close(fd);
        return 1;
    }
    const size_t n = (size_t)st.st_size;
    /* a 2 MB-aligned address: reserve n + 2 MB, then map the file over the aligned part */
    uint8_t* area = mmap(NULL, n + HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) {
        fprintf(stderr, "page_read: %s: cannot reserve %zu bytes: %s\n", path, n, strerror(errno));
        close(fd);
        return 1;
    }
    uint8_t* at = (uint8_t*)(((uintptr_t)area + HUGE - 1) / HUGE * HUGE);
    uint8_t* p = mmap(at, n, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "page_read: %s: cannot map: %s\n", path, strerror(errno));
        munmap(area, n + HUGE);
        return 1;
    }
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);
#endif
    uint64_t keep = read_all(p, n);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        const double t0 = now_s();
        keep ^= read_all(p, n);
        const double gbps = (double)n / (now_s() - t0) / 1e9;
        if (gbps > best) best = gbps;
    }
    const long long pmd = pmd_mapped_bytes(p);
    printf("%s: %.1f MB, %.2f GB/s (best of 5)", path, (double)n / 1e6, best);
    if (pmd >= 0) printf(", %.1f%% in 2 MB pages", 100.0 * (double)pmd / (double)n);
    else printf(", 2 MB pages unknown");
    if (piece > 0 && piece <= n) {
        const size_t bytes = n / piece * piece;
        best = 0;
        for (int r = 0; r < 5; r++) {
            const double t0 = now_s();
            keep ^= read_pieces(p, n, piece);
            const double gbps = (double)bytes / (now_s() - t0) / 1e9;
            if (gbps > best) best = gbps;
        }
        printf("; in %zu KB pieces at random places %.2f GB/s (best of 5)", piece >> 10, best);
    }
    printf("\n");
    sink = keep; /* the reads stay */
    munmap(area, n + HUGE);
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fprintf(argc < 2 ? stderr : stdout, "usage: page_read [--pieces KB] FILE...\n"
                "  how fast each file's pages in the page cache stream (one thread, best of 5 passes);\n"
                "  --pieces KB: also read as KB-sized pieces at random places\n");
        return argc < 2 ? 2 : 0;
    }
    int first = 1;
    size_t piece = 0;
    if (strcmp(argv[1], "--pieces") == 0) {
        char* end = NULL;
        const long kb = argc > 2 ? strtol(argv[2], &end, 10) : 0;
        if (argc < 4 || !end || *end || kb < 4 || kb > (1L << 22)) {
            fprintf(stderr, "page_read: --pieces takes a size in KB, 4 .. 4194304, then the files\n");
            return 2;
        }
        piece = (size_t)kb << 10, first = 3;
    }
    int status = 0;
    for (int i = first; i < argc; i++) status |= probe(argv[i], piece);
    return status;
}
