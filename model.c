/* model.c: loading a Qwen3 checkpoint (memory-mapped, validated, never copied) and the forward pass.
 *
 * The file layout is documented at the top of model.h; docs/design.md has the measurements behind
 * the choices here. forward() is one function in the style of llama2.c: every weight is a named
 * pointer, every step cites the spec, and every operation that costs time goes through the kernels
 * of kernels.h (SIMD or scalar; nothing here knows which). The spec is QWEN3.md (../shared/QWEN3.md;
 * docs/spec-sections.md says what each cited section says): "2.2 step 2.4" is its section 2.2,
 * step 4 of the per-layer step 2; "(7.3)" is item 3 of its section 7, the checklist of easy mistakes. */
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* How many positions one batch (one matmul) holds; longer prompts go through in chunks. Each chunk
 * reads every weight once: with 256 rows the matmuls are compute-bound, and the activation buffers
 * stay modest (about 16 MB for Qwen3-0.6B, touched only as far as a prompt reaches; docs/design.md#prefill-chunks). */
#define MAX_BATCH 256

/* ---- The checkpoint file in memory ----
 *
 * Decode reads every weight once per token, so the weights' page size decides how much address
 * translation each gigabyte costs (docs/design.md#mapped-weights). Anonymous memory gets
 * transparent huge pages; a file mapping gets the folio size the page cache holds the file in.
 * On Linux 6.x a mapping marked MADV_HUGEPAGE reads page cache misses in as 2 MB folios
 * (mm/filemap.c, do_sync_mmap_readahead) and maps each with one page-table entry when the address
 * and the file offset agree modulo 2 MB. A file just written, copied or read with read() sits in
 * the cache in small folios and is mapped so: the cache is shared by every process, so a load
 * leaves it alone; tools/drop_page_cache.py drops the file so that it comes back in 2 MB pages
 * (docs/design.md#small-file-pages). */
#define HUGE_PAGE ((size_t)2 << 20)

void* alloc_huge_anonymous(size_t size) {
    size_t alloc = (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void* buf = NULL;
    if (posix_memalign(&buf, HUGE_PAGE, alloc) != 0) {
        errno = ENOMEM;
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(buf, alloc, MADV_HUGEPAGE); /* a hint; without THP the memory still works */
#endif
    return buf;
}

/* mmap(fd) read-only at a multiple of 2 MB, marked MADV_HUGEPAGE and populated (pages the cache
 * already holds are mapped as they are). A 2 MB page can only back a 2 MB aligned stretch of
 * addresses that maps a 2 MB aligned stretch of the file (here from offset 0): reserve size + 2 MB,
 * map the file over the first aligned address, give back the rest. MAP_FAILED and errno on failure. */
static void* map_file(int fd, size_t size) {
    char* area = mmap(NULL, size + HUGE_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) return MAP_FAILED;
    char* start = (char*)(((uintptr_t)area + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (mmap(start, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED) {
        int e = errno;
        munmap(area, size + HUGE_PAGE);
        errno = e;
        return MAP_FAILED;
    }
    /* Both lengths round up to whole pages, and HUGE_PAGE is a whole number of pages, so the
     * reservation's tail past the mapping is HUGE_PAGE - head long: never empty. */
    size_t head = (size_t)(start - area), page = (size_t)sysconf(_SC_PAGESIZE);
    if (head > 0) munmap(area, head);
    munmap(start + (size + page - 1) / page * page, HUGE_PAGE - head);
#ifdef MADV_HUGEPAGE
    madvise(start, size, MADV_HUGEPAGE); /* a hint: EINVAL without THP is fine */
#endif
    /* Fault the file in now rather than page by page in the first forward pass. */
#ifdef MADV_POPULATE_READ
    if (madvise(start, size, MADV_POPULATE_READ) == 0) return start;
#endif
    volatile char sink = 0;
    for (size_t i = 0; i < size; i += page) sink ^= start[i];
    (void)sink;
    return start;
}

/* The mapping's FilePmdMapped in /proc/self/smaps: one read of that file, a few milliseconds. */
long long transformer_huge_page_bytes(const Transformer* t) {
    FILE* f = t->file ? fopen("/proc/self/smaps", "r") : NULL;
    if (f == NULL) return -1;
    char line[4096];
    int ours = 0;
    long long kb = -1;
    /* A mapping's header line is "lo-hi perms ..."; its field lines are "Name: value kB". */
    while (kb < 0 && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
            ours = lo == (unsigned long)(uintptr_t)t->file;
        else if (ours)
            sscanf(line, "FilePmdMapped: %lld kB", &kb);
    }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* ---- Loading ---- */

/* Where a load reports its one error line, "PATH: problem". */
typedef struct {
    const char* path;
    char* buf;
    size_t len;
} LoadError;

/* Writes "PATH: message" into e's buffer and returns -1. */
static int __attribute__((format(printf, 2, 3))) fail(const LoadError* e, const char* fmt, ...) {
    if (e->buf == NULL || e->len == 0) return -1;
    int n = snprintf(e->buf, e->len, "%s: ", e->path);
    if (n < 0 || (size_t)n >= e->len) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->buf + n, e->len - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t max3(uint64_t a, uint64_t b, uint64_t c) {
    return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

/* Maps the file at path, a regular file at least a header long, into t->file. Returns 0, or -1
 * with the error written and nothing mapped. */
static int map_checkpoint(Transformer* t, const LoadError* e) {
    /* stat before open: opening a FIFO for reading waits for a writer, forever if none comes. */
    struct stat st;
    if (stat(e->path, &st) != 0) return fail(e, "cannot open: %s", strerror(errno));
    if (!S_ISREG(st.st_mode))
        return fail(e, "not a regular file (%s)",
                    S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket");
    int fd = open(e->path, O_RDONLY);
    if (fd < 0) return fail(e, "cannot open: %s", strerror(errno));
    void* p = MAP_FAILED;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = fail(e, "cannot stat: %s", strerror(errno));
    else if ((uint64_t)st.st_size < sizeof(FileHeader))
        rc = fail(e, "file is %lld byte%s, too short for the %zu-byte checkpoint header", (long long)st.st_size,
                  st.st_size == 1 ? "" : "s", sizeof(FileHeader));
    else if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX)
        rc = fail(e, "file is too large to map on this machine");
    else if ((p = map_file(fd, (size_t)st.st_size)) == MAP_FAILED)
        rc = fail(e, "cannot mmap: %s", strerror(errno));
    close(fd); /* a mapping keeps the file alive */
    if (rc != 0) return -1;
    t->file = p;
    t->file_size = (size_t)st.st_size;
    return 0;
}

/* The header's format: magic, version, architecture and flags. Returns 0 or -1 with the error written. */
static int check_format(const FileHeader* h, const LoadError* e) {
    if (memcmp(h->magic, CHECKPOINT_MAGIC, 4) != 0)
        return fail(e, "not a checkpoint of this engine (bad magic; convert the model with export.py)");
    /* Versions before 5 differ only in their q8 layout and before 4 in their q4 layout (model.h),
     * so their f32 and bf16 files read as they are. */
    if (h->version < 1 || h->version > CHECKPOINT_VERSION)
        return fail(e, "checkpoint version %u, this engine reads versions 1 to %d", h->version, CHECKPOINT_VERSION);
    const char* quant = h->weight_type == WEIGHT_Q4 ? "q4" : "q8";
    if ((h->version < 5 && h->weight_type == WEIGHT_Q8) || (h->version < 4 && h->weight_type == WEIGHT_Q4))
        return fail(e, "a %s checkpoint of version %u, whose %s layout this engine no longer reads: export it "
                    "again with export.py", quant, h->version, quant);
    if (h->arch < ARCH_QWEN3 || h->arch > ARCH_LLAMA)
        return fail(e, "unknown architecture %u", h->arch);
    if (h->flags & ~(uint32_t)(FLAG_QK_NORM | FLAG_QKV_BIAS | FLAG_TIED_EMBED))
        return fail(e, "unknown flags 0x%x", h->flags);
    return 0;
}

/* The model's sizes: each in its range (model.h's CHECKPOINT LIMITS), the heads consistent, every
 * matrix indexable; then the weight type and its group size, which must divide every row length
 * that is quantised. */
static int check_sizes(const FileHeader* h, const LoadError* e) {
    struct { const char* name; uint32_t value, max; } sizes[] = {
        {"dim", h->dim, MAX_DIM}, {"hidden_dim", h->hidden_dim, MAX_HIDDEN},
        {"n_layers", h->n_layers, MAX_LAYERS}, {"n_heads", h->n_heads, MAX_HEADS},
        {"n_kv_heads", h->n_kv_heads, MAX_HEADS}, {"head_dim", h->head_dim, MAX_HEAD_DIM},
        {"vocab_size", h->vocab_size, MAX_VOCAB}, {"max_seq_len", h->max_seq_len, MAX_POSITIONS},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value == 0 || sizes[i].value > sizes[i].max)
            return fail(e, "%s = %u is out of range (1 .. %u)", sizes[i].name, sizes[i].value, sizes[i].max);
    if (h->n_heads % h->n_kv_heads != 0)
        return fail(e, "n_heads = %u is not a multiple of n_kv_heads = %u", h->n_heads, h->n_kv_heads);
    if (h->head_dim % 2 != 0)
        return fail(e, "head_dim = %u is odd (RoPE rotates pairs)", h->head_dim);
    uint64_t q_dim = (uint64_t)h->n_heads * h->head_dim;
    if (q_dim > MAX_HIDDEN) return fail(e, "n_heads * head_dim = %llu is out of range", (unsigned long long)q_dim);
    /* The kernels index a matrix with int arithmetic: every matrix must have < 2^31 values. */
    if (max3(h->dim, h->hidden_dim, q_dim) * max3(h->vocab_size, h->hidden_dim, q_dim) > MAX_MATRIX_VALUES)
        return fail(e, "matrices with more than 2^31 values are not supported");
    if (h->weight_type > WEIGHT_Q4)
        return fail(e, "unknown weight type %u", h->weight_type);
    if (h->weight_type == WEIGHT_Q4 && h->group_size != Q4_GROUP)
        return fail(e, "q4 group size %u: this engine's q4 has groups of %d", h->group_size, Q4_GROUP);
    if (h->weight_type == WEIGHT_Q8 || h->weight_type == WEIGHT_Q4) {
        if (h->group_size == 0 || h->dim % h->group_size || h->hidden_dim % h->group_size || q_dim % h->group_size)
            return fail(e, "%s group size %u must be nonzero and divide dim %u, hidden_dim %u and n_heads*head_dim "
                        "%llu", h->weight_type == WEIGHT_Q4 ? "q4" : "q8", h->group_size, h->dim, h->hidden_dim,
                        (unsigned long long)q_dim);
    } else if (h->group_size != 0) {
        return fail(e, "group_size = %u for an unquantised checkpoint (must be 0)", h->group_size);
    }
    return 0;
}

/* The constants (RMSNorm's eps, RoPE's base), the special tokens and the generation defaults. */
static int check_constants(const FileHeader* h, const LoadError* e) {
    if (!(h->rms_norm_eps > 0.0f && h->rms_norm_eps < 1.0f))
        return fail(e, "rms_norm_eps = %g is not in (0, 1)", h->rms_norm_eps);
    if (!(h->rope_theta > 0.0 && h->rope_theta < MAX_ROPE_THETA))
        return fail(e, "rope_theta = %g is not a positive number", h->rope_theta);
    if (h->bos_id < -1 || h->bos_id >= (int32_t)h->vocab_size)
        return fail(e, "bos_id = %d is not -1 or a token id", h->bos_id);
    if (h->n_eos > MAX_EOS_IDS)
        return fail(e, "n_eos = %u is more than %d", h->n_eos, MAX_EOS_IDS);
    for (uint32_t i = 0; i < h->n_eos; i++)
        if (h->eos_ids[i] < 0)
            return fail(e, "eos id %d is negative", h->eos_ids[i]);
    if (!(h->temperature >= 0.0f && h->temperature <= MAX_TEMPERATURE) ||
        !(h->top_p >= 0.0f && h->top_p <= MAX_TOP_P) || h->top_k < 0)
        return fail(e, "generation defaults out of range (temperature %g, top_p %g, top_k %d)", h->temperature,
                    h->top_p, h->top_k);
    return 0;
}

/* The two sections: inside the file, after the header, not overlapping, no wrap-around. */
static int check_sections(const FileHeader* h, uint64_t size, const LoadError* e) {
    const struct { const char* name; uint64_t offset, bytes; } sections[] = {
        {"tokenizer", h->tokenizer_offset, h->tokenizer_bytes}, {"weights", h->weights_offset, h->weights_bytes}};
    for (int i = 0; i < 2; i++) {
        uint64_t offset = sections[i].offset, bytes = sections[i].bytes;
        if (offset < sizeof(FileHeader) || offset > size || bytes > size - offset)
            return fail(e, "%s section [%llu, +%llu) is not inside the %llu-byte file (truncated?)", sections[i].name,
                        (unsigned long long)offset, (unsigned long long)bytes, (unsigned long long)size);
    }
    if (h->tokenizer_offset < h->weights_offset + h->weights_bytes &&
        h->weights_offset < h->tokenizer_offset + h->tokenizer_bytes)
        return fail(e, "the tokenizer and weights sections overlap");
    return 0;
}

/* Checks every header field and the sections, and fills the Config; seq_len is ctx (<= 0: the
 * default) held to the model's context. Returns 0 or -1 with the error written. */
static int read_config(Transformer* t, int ctx, const LoadError* e) {
    const FileHeader* h = &t->header;
    if (check_format(h, e) != 0 || check_sizes(h, e) != 0 || check_constants(h, e) != 0 ||
        check_sections(h, t->file_size, e) != 0)
        return -1;
    const int max_seq_len = (int)h->max_seq_len, seq_len = ctx <= 0 ? DEFAULT_CTX : ctx;
    t->config = (Config){
        .dim = (int)h->dim, .hidden_dim = (int)h->hidden_dim, .n_layers = (int)h->n_layers,
        .n_heads = (int)h->n_heads, .n_kv_heads = (int)h->n_kv_heads, .head_dim = (int)h->head_dim,
        .vocab_size = (int)h->vocab_size, .max_seq_len = max_seq_len,
        .seq_len = seq_len < max_seq_len ? seq_len : max_seq_len,
        .rms_norm_eps = h->rms_norm_eps, .rope_theta = h->rope_theta, .flags = (int)h->flags,
        .weight_type = (WeightType)h->weight_type, .group_size = (int)h->group_size,
    };
    return 0;
}

/* Walks the tensors (TENSORS): each tensor starts at the next multiple of CHECKPOINT_ALIGN
 * and must end inside the weights section. Offsets are uint64_t and start inside the file
 * (check_sections), and a tensor has fewer than 2^31 values, so no sum here can wrap around. */
typedef struct {
    const uint8_t* base;  /* the mapped file */
    uint64_t pos, end;    /* file offsets: the end of the previous tensor, the end of the weights section */
    const Config* c;
    Weights* w;           /* where the pointers go */
    int layer;            /* the layer being walked, for the error; -1: outside the layers */
    const LoadError* e;
    int failed;
} TensorWalk;

static const void* take(TensorWalk* w, uint64_t bytes, const char* what) {
    uint64_t start = (w->pos + CHECKPOINT_ALIGN - 1) / CHECKPOINT_ALIGN * CHECKPOINT_ALIGN;
    if (w->failed) return NULL;
    if (start + bytes > w->end) {
        char layer[32] = "";
        if (w->layer >= 0) snprintf(layer, sizeof layer, "layer %d ", w->layer);
        w->failed = 1;
        fail(w->e, "tensor %s%s (%llu bytes at offset %llu) ends past the weights section (which ends at %llu): the "
             "file is truncated or its header does not match its tensors", layer, what, (unsigned long long)bytes,
             (unsigned long long)start, (unsigned long long)w->end);
        return NULL;
    }
    w->pos = start + bytes;
    return w->base + start;
}

/* Every tensor of the file in its order (model.h, TensorInfo). */
const TensorInfo TENSORS[] = {
    /* BEGIN TENSOR TABLE: name, per layer, rows, cols (SIZE_NONE: a float32 vector), only with, not with */
    {"embed_tokens",             0, SIZE_VOCAB,  SIZE_DIM,    0, 0, offsetof(Weights, embed_tokens)},
    {"input_layernorm",          1, SIZE_DIM,    SIZE_NONE,   0, 0, offsetof(LayerWeights, input_layernorm)},
    {"q_proj",                   1, SIZE_Q,      SIZE_DIM,    0, 0, offsetof(LayerWeights, q_proj)},
    {"q_bias",                   1, SIZE_Q,      SIZE_NONE,   FLAG_QKV_BIAS, 0, offsetof(LayerWeights, q_bias)},
    {"k_proj",                   1, SIZE_KV,     SIZE_DIM,    0, 0, offsetof(LayerWeights, k_proj)},
    {"k_bias",                   1, SIZE_KV,     SIZE_NONE,   FLAG_QKV_BIAS, 0, offsetof(LayerWeights, k_bias)},
    {"v_proj",                   1, SIZE_KV,     SIZE_DIM,    0, 0, offsetof(LayerWeights, v_proj)},
    {"v_bias",                   1, SIZE_KV,     SIZE_NONE,   FLAG_QKV_BIAS, 0, offsetof(LayerWeights, v_bias)},
    {"q_norm",                   1, SIZE_HEAD,   SIZE_NONE,   FLAG_QK_NORM, 0, offsetof(LayerWeights, q_norm)},
    {"k_norm",                   1, SIZE_HEAD,   SIZE_NONE,   FLAG_QK_NORM, 0, offsetof(LayerWeights, k_norm)},
    {"o_proj",                   1, SIZE_DIM,    SIZE_Q,      0, 0, offsetof(LayerWeights, o_proj)},
    {"post_attention_layernorm", 1, SIZE_DIM,    SIZE_NONE,   0, 0, offsetof(LayerWeights, post_attention_layernorm)},
    {"gate_proj",                1, SIZE_HIDDEN, SIZE_DIM,    0, 0, offsetof(LayerWeights, gate_proj)},
    {"up_proj",                  1, SIZE_HIDDEN, SIZE_DIM,    0, 0, offsetof(LayerWeights, up_proj)},
    {"down_proj",                1, SIZE_DIM,    SIZE_HIDDEN, 0, 0, offsetof(LayerWeights, down_proj)},
    {"norm",                     0, SIZE_DIM,    SIZE_NONE,   0, 0, offsetof(Weights, norm)},
    {"lm_head",                  0, SIZE_VOCAB,  SIZE_DIM,    0, FLAG_TIED_EMBED, offsetof(Weights, lm_head)},
    /* END TENSOR TABLE */
};
const int N_TENSORS = sizeof TENSORS / sizeof TENSORS[0];

int tensor_size(TensorSize s, const Config* c) {
    switch (s) {
    case SIZE_DIM: return c->dim;
    case SIZE_HIDDEN: return c->hidden_dim;
    case SIZE_VOCAB: return c->vocab_size;
    case SIZE_Q: return c->n_heads * c->head_dim;
    case SIZE_KV: return c->n_kv_heads * c->head_dim;
    case SIZE_HEAD: return c->head_dim;
    default: return 1;
    }
}

int tensor_stored(const TensorInfo* ti, const Config* c) {
    return (c->flags & ti->only_with) == ti->only_with && !(c->flags & ti->not_with);
}

void* tensor_slot(const TensorInfo* ti, Weights* w, int layer) {
    return ti->per_layer ? (char*)&w->layers[layer] + ti->field : (char*)w + ti->field;
}

void for_each_tensor(const Config* c, void (*fn)(void* ctx, const TensorInfo* ti, int layer), void* ctx) {
    int first = 0, end;
    while (first < N_TENSORS && !TENSORS[first].per_layer) first++;
    for (end = first; end < N_TENSORS && TENSORS[end].per_layer; end++) {}
    for (int i = 0; i < first; i++)
        if (tensor_stored(&TENSORS[i], c)) fn(ctx, &TENSORS[i], -1);
    for (int l = 0; l < c->n_layers; l++)
        for (int i = first; i < end; i++)
            if (tensor_stored(&TENSORS[i], c)) fn(ctx, &TENSORS[i], l);
    for (int i = end; i < N_TENSORS; i++)
        if (tensor_stored(&TENSORS[i], c)) fn(ctx, &TENSORS[i], -1);
}

/* One tensor of the walk: a MATRIX in the header's weight type (rows * cols < 2^31, check_sizes)
 * or a float32 vector, pointed to where the table says. */
static void map_tensor(void* ctx, const TensorInfo* ti, int layer) {
    TensorWalk* walk = ctx;
    void* slot = tensor_slot(ti, walk->w, layer);
    const int rows = tensor_size(ti->rows, walk->c);
    walk->layer = layer;
    if (ti->cols == SIZE_NONE) {
        *(const float**)slot = take(walk, (uint64_t)rows * sizeof(float), ti->name);
        return;
    }
    Matrix m = {walk->c->weight_type, rows, tensor_size(ti->cols, walk->c), walk->c->group_size, NULL};
    m.data = take(walk, matrix_stored_bytes(&m), ti->name);
    *(Matrix*)slot = m;
}

/* Points every weight into the mapping, in the order of TENSORS. */
static int map_weights(Transformer* t, const LoadError* e) {
    const Config* c = &t->config;
    Weights* w = &t->weights;
    const uint64_t start = t->header.weights_offset;
    TensorWalk walk = {t->file, start, start + t->header.weights_bytes, c, w, -1, e, 0};

    w->layers = calloc((size_t)c->n_layers, sizeof(LayerWeights));
    if (w->layers == NULL) return fail(e, "out of memory");
    for_each_tensor(c, map_tensor, &walk);
    /* QWEN3.md 2.2 step 4 and 7.7: a tied model's output projection is the embedding matrix. */
    if (c->flags & FLAG_TIED_EMBED) w->lm_head = w->embed_tokens;
    if (walk.failed) return -1;
    /* export.py pads the section to a multiple of 64 after the last tensor; anything more means the
     * header describes a different model than the one stored. */
    if (walk.end - walk.pos >= CHECKPOINT_ALIGN)
        return fail(e, "the weights section has %llu bytes after the last tensor: the header does not match the "
                    "tensors", (unsigned long long)(walk.end - walk.pos));
    return 0;
}

/* RoPE tables (QWEN3.md 2.4): inv_freq[i] = 1 / theta^(2i/d) in float32 with powf, and
 * angle = p * inv_freq[i] as a float32 product, exactly as HF computes them in float32. */
static void rope_tables(const Config* c, float* cos_t, float* sin_t) {
    int half = c->head_dim / 2;
    for (int p = 0; p < c->seq_len; p++) {
        for (int i = 0; i < half; i++) {
            float inv_freq = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->head_dim);
            float angle = (float)p * inv_freq;
            cos_t[(size_t)p * half + i] = cosf(angle);
            sin_t[(size_t)p * half + i] = sinf(angle);
        }
    }
}

/* The KV cache (keys and values alike) in blocks of KV_BLOCK_LEN positions,
 * [block][layer][kv head][position in block][d]: the cache grows in position order, so its 2 MB
 * pages map little more than the positions reached, and a kv head's rows in a block are one run
 * that attention reads as a stream (64 KB for Qwen3's head_dim; docs/design.md#kv-cache). */
static size_t kv_block_elems(const Config* c) {
    return (size_t)c->n_layers * c->n_kv_heads * (size_t)KV_BLOCK_LEN * c->head_dim;
}

/* Where layer l, kv head h, position p sits in either cache, in elements (floats or halves). */
static size_t kv_offset(const Config* c, int l, int h, int p) {
    size_t row = ((size_t)l * c->n_kv_heads + (size_t)h) * KV_BLOCK_LEN + (size_t)(p % KV_BLOCK_LEN);
    return (size_t)(p / KV_BLOCK_LEN) * kv_block_elems(c) + row * c->head_dim;
}

/* Stores n values at element `at` of a cache: as they are, or rounded to halves. */
static void kv_store(const RunState* s, void* cache, size_t at, const float* x, int n) {
    if (s->kv_f16)
        float_to_half_row((uint16_t*)cache + at, x, n);
    else
        memcpy((float*)cache + at, x, (size_t)n * sizeof(float));
}

/* The activations and the KV cache. Returns 0 or -1 with the error written. */
static int alloc_state(Transformer* t, int kv_f16, const LoadError* e) {
    const Config* c = &t->config;
    RunState* s = &t->state;
    const size_t B = MAX_BATCH, D = (size_t)c->dim, F = (size_t)c->hidden_dim, half = (size_t)c->head_dim / 2;
    const size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    const struct { float** buf; size_t floats; } buffers[] = {
        {&s->x, B * D}, {&s->xb, B * D}, {&s->proj, B * D}, {&s->q, B * q_dim}, {&s->att_out, B * q_dim},
        {&s->k, B * kv_dim}, {&s->v, B * kv_dim}, {&s->gate, B * F}, {&s->up, B * F}, {&s->logits, (size_t)c->vocab_size},
        {&s->rope_cos, (size_t)c->seq_len * half}, {&s->rope_sin, (size_t)c->seq_len * half},
    };
    s->max_batch = MAX_BATCH;
    /* The cache is the one big allocation (whole blocks of positions, twice), mapped lazily: memory
     * is only used for the blocks reached (populate_kv_cache). */
    s->kv_f16 = kv_f16 != 0;
    size_t kv_bytes = (size_t)((c->seq_len + KV_BLOCK_LEN - 1) / KV_BLOCK_LEN) * kv_block_elems(c) * kv_elem_bytes(s);
    s->key_cache = alloc_huge_anonymous(kv_bytes);
    s->value_cache = alloc_huge_anonymous(kv_bytes);
    int ok = s->key_cache && s->value_cache;
    for (size_t i = 0; ok && i < sizeof buffers / sizeof buffers[0]; i++)
        ok = (*buffers[i].buf = calloc(buffers[i].floats, sizeof(float))) != NULL;
    if (!ok)
        return fail(e, "out of memory for the run state (KV cache of %d positions: try a smaller -c/--ctx)",
                    c->seq_len);
    rope_tables(c, s->rope_cos, s->rope_sin);
    return 0;
}

/* The model's own ops (kernels/ops.h): options.threads threads (default the CPUs this process may
 * run on), scratch sized for the widest matrix, the largest batch and the whole context. */
static int start_ops(Transformer* t, const TransformerOptions* o, const LoadError* e) {
    const Config* c = &t->config;
    const OpsSpec spec = {.threads = o->threads, .max_batch = MAX_BATCH,
                          .max_cols = (int)max3(c->dim, c->hidden_dim, (uint64_t)c->n_heads * c->head_dim),
                          .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                          .max_pos = c->seq_len, .bf16_activations = o->bf16_activations};
    t->ops = t->kernels = ops_new(&spec);
    if (!t->kernels) return fail(e, "out of memory for the kernels' threads and scratch");
    return 0;
}

int transformer_load(Transformer* t, const char* path, const TransformerOptions* opt, char* err, size_t errlen) {
    const TransformerOptions o = opt ? *opt : (TransformerOptions){0};
    const LoadError e = {path, err, errlen};
    memset(t, 0, sizeof *t);
    if (err && errlen) err[0] = '\0';
    const uint32_t one = 1;
    if (*(const uint8_t*)&one != 1) return fail(&e, "this engine needs a little-endian machine");
    if (map_checkpoint(t, &e) != 0) return -1;
    memcpy(&t->header, t->file, sizeof(FileHeader));
    if (read_config(t, o.ctx, &e) != 0 || map_weights(t, &e) != 0 || start_ops(t, &o, &e) != 0 ||
        alloc_state(t, o.kv_f16, &e) != 0) {
        transformer_free(t);
        return -1;
    }
    t->tokenizer_data = t->file + t->header.tokenizer_offset;
    t->tokenizer_bytes = (size_t)t->header.tokenizer_bytes;
    return 0;
}

void transformer_free(Transformer* t) {
    if (t->file == NULL) return;
    ops_free(t->kernels);
    RunState* s = &t->state;
    void* buffers[] = {s->x, s->xb, s->q, s->k, s->v, s->att_out, s->proj, s->gate, s->up,
                       s->logits, s->key_cache, s->value_cache, s->rope_cos, s->rope_sin};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) free(buffers[i]);
    free(t->weights.layers);
    munmap((void*)t->file, t->file_size);
    memset(t, 0, sizeof *t);
}

/* ---- The forward pass ---- */

#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Maps the KV cache's pages for positions below `end` before a chunk writes them: one
 * MADV_POPULATE_WRITE call costs a small part of a write fault per 4 KB page (docs/design.md#kv-cache).
 * Whole blocks are populated, so memory stays what the blocks reached use, plus the rest of their
 * last 2 MB page (tests/test_kv_cache.c). Where the call does not exist or fails, the writes fault them in. */
static void populate_kv_cache(Transformer* t, int end) {
#ifdef MADV_POPULATE_WRITE
    RunState* s = &t->state;
    const int seq_len = t->config.seq_len;
    if (end <= s->kv_populated) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const int bl = KV_BLOCK_LEN;
    const size_t block = kv_block_elems(&t->config) * kv_elem_bytes(s);
    const int blocks = (end + bl - 1) / bl;
    char* const caches[2] = {(char*)s->key_cache, (char*)s->value_cache};
    for (int which = 0; which < 2; which++) {
        uintptr_t a = (uintptr_t)(caches[which] + (size_t)(s->kv_populated / bl) * block) & ~(page - 1);
        uintptr_t b = (uintptr_t)(caches[which] + (size_t)blocks * block);
        if (madvise((void*)a, b - a, MADV_POPULATE_WRITE) != 0) {
            s->kv_populated = seq_len; /* not supported here: leave it to the page faults */
            return;
        }
    }
    s->kv_populated = blocks * bl < seq_len ? blocks * bl : seq_len;
#endif
}

/* Row r of a batch buffer whose rows are `width` floats wide. */
#define ROW(buf, r, width) ((buf) + (size_t)(r) * (size_t)(width))

float* forward(Transformer* t, const int* tokens, int n, int pos, float* all_logits) {
    const Config* c = &t->config;
    const Weights* w = &t->weights;
    RunState* s = &t->state;
    const Ops* ops = t->ops;                  /* the kernels (kernels/ops.h): nothing here knows which */
    const int D = c->dim, F = c->hidden_dim, L = c->n_layers, V = c->vocab_size;
    const int H = c->n_heads, K = c->n_kv_heads, d = c->head_dim;
    const int q_dim = H * d, kv_dim = K * d;  /* q is H*d wide, which is not D for 0.6B/4B/32B (7.1) */
    const float eps = c->rms_norm_eps;        /* from the header: 1e-6 for Qwen3, not 1e-5 (7.4) */

    /* Bad arguments return NULL instead of reading outside the cache or the embedding. */
    if (t->file == NULL || tokens == NULL || n <= 0 || pos < 0 || pos > c->seq_len - n) return NULL;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V) return NULL;

    /* Long inputs go through in chunks of max_batch rows. QWEN3.md 2.3: a batch is the decode step
     * applied to all rows at once, with a causal mask. A chunk's keys and values are in the cache
     * before its attention runs, so later chunks see earlier ones exactly as in one big batch. */
    for (int c0 = 0; c0 < n; c0 += s->max_batch) {
        const int nb = n - c0 < s->max_batch ? n - c0 : s->max_batch;  /* rows in this chunk */
        const int p0 = pos + c0;                                         /* position of its row 0 */
        populate_kv_cache(t, p0 + nb); /* map the cache pages this chunk writes in one call, not by faults */

        /* QWEN3.md 2.2 step 1: the embedding row of each token; no scaling, no BOS. */
        for (int r = 0; r < nb; r++) matrix_row(ROW(s->x, r, D), &w->embed_tokens, tokens[c0 + r]);

        for (int l = 0; l < L; l++) {
            const LayerWeights* lw = &w->layers[l];

            /* 2.2 step 2.1: pre-norm residual block: attention reads a normalised copy of each row of x. */
            ops->rmsnorm(ops, &(NormSite){1, "pre-attention", l, p0, nb, 1}, s->xb, s->x, lw->input_layernorm, D, eps);  /* RMSNorm use 1 of 4: pre-attention */

            /* 2.2 step 2.2: the q, k, v projections, in one call since they read the same input
             * (biases: Qwen2 only, QWEN3.md 6). */
            ops->matmul(ops, (float*[]){s->q, s->k, s->v}, s->xb,
                        (const Matrix*[]){&lw->q_proj, &lw->k_proj, &lw->v_proj}, 3, nb);
            if (lw->q_bias)
                for (int r = 0; r < nb; r++) {
                    for (int i = 0; i < q_dim; i++) ROW(s->q, r, q_dim)[i] += lw->q_bias[i];
                    for (int i = 0; i < kv_dim; i++) ROW(s->k, r, kv_dim)[i] += lw->k_bias[i];
                    for (int i = 0; i < kv_dim; i++) ROW(s->v, r, kv_dim)[i] += lw->v_bias[i];
                }

            /* 2.2 step 2.4: Qwen3's QK-Norm: q_norm [d] shared by every query head and k_norm by
             * every key head, each head normalised on its own, after the projection, before RoPE
             * (7.2); v is not normalised. A row of q is H heads of d values (k: K heads). */
            if (lw->q_norm) {
                ops->rmsnorm(ops, &(NormSite){2, "QK-Norm q", l, p0, nb, H}, s->q, s->q, lw->q_norm, d, eps);  /* RMSNorm use 2 of 4: QK-Norm on every q head (before RoPE) */
                ops->rmsnorm(ops, &(NormSite){2, "QK-Norm k", l, p0, nb, K}, s->k, s->k, lw->k_norm, d, eps);  /* RMSNorm use 2 of 4: QK-Norm on every k head (before RoPE) */
            }

            for (int r = 0; r < nb; r++) {
                /* 2.2 step 2.5: RoPE (section 2.4) at this row's position, pairs (i, i + d/2) (7.3). */
                const float* cos_p = ROW(s->rope_cos, p0 + r, d / 2);
                const float* sin_p = ROW(s->rope_sin, p0 + r, d / 2);
                ops->rope(ops, ROW(s->q, r, q_dim), H, d, cos_p, sin_p);
                ops->rope(ops, ROW(s->k, r, kv_dim), K, d, cos_p, sin_p);
                /* 2.2 step 2.6: the cache stores keys after QK-Norm and RoPE (7.5); halves with --kv-cache f16. */
                for (int h = 0; h < K; h++) {
                    size_t at = kv_offset(c, l, h, p0 + r);
                    kv_store(s, s->key_cache, at, ROW(s->k, r, kv_dim) + h * d, d);
                    kv_store(s, s->value_cache, at, ROW(s->v, r, kv_dim) + h * d, d);
                }
            }

            /* 2.2 step 2.7: causal attention of every row and query head: query head j of row r
             * reads kv head j / (H / K) (GQA, 2.5) at positions 0 .. p0 + r, with scores scaled by
             * 1/sqrt(d), not by 1/sqrt(D / H) (7.1). */
            const size_t layer_at = kv_offset(c, l, 0, 0) * kv_elem_bytes(s);
            const KVRows cache = {(const char*)s->key_cache + layer_at, (const char*)s->value_cache + layer_at, d,
                                  KV_BLOCK_LEN, kv_block_elems(c), s->kv_f16};
            ops->attention(ops, &(AttentionCall){s->att_out, s->q, nb, p0, H, K, d, 1.0f / sqrtf((float)d), cache,
                                                 kv_offset(c, l, 1, 0) - kv_offset(c, l, 0, 0), l});

            /* 2.2 steps 2.8-2.9: output projection, residual add. */
            ops->matmul(ops, (float*[]){s->proj}, s->att_out, (const Matrix*[]){&lw->o_proj}, 1, nb);
            for (size_t i = 0; i < (size_t)nb * D; i++) s->x[i] += s->proj[i];

            /* 2.2 steps 2.10-2.12: SwiGLU MLP on a normalised copy of x, residual add. */
            ops->rmsnorm(ops, &(NormSite){3, "pre-MLP", l, p0, nb, 1}, s->xb, s->x, lw->post_attention_layernorm, D, eps);  /* RMSNorm use 3 of 4: pre-MLP */
            ops->matmul(ops, (float*[]){s->gate, s->up}, s->xb, (const Matrix*[]){&lw->gate_proj, &lw->up_proj}, 2, nb);
            ops->swiglu(ops, s->gate, s->up, nb * F);  /* gate = silu(gate) * up */
            ops->matmul(ops, (float*[]){s->proj}, s->gate, (const Matrix*[]){&lw->down_proj}, 1, nb);
            for (size_t i = 0; i < (size_t)nb * D; i++) s->x[i] += s->proj[i];
        }

        /* 2.2 steps 3-4: final norm and logits. Sampling needs only the last position (2.3), so
         * without all_logits only the last row of the last chunk goes through the head, the
         * biggest matmul of the model (V x D). */
        const int last_chunk = c0 + nb == n;
        if (!all_logits && !last_chunk) continue;
        const int r0 = all_logits ? 0 : nb - 1; /* the first row that needs logits */
        ops->rmsnorm(ops, &(NormSite){4, "final norm", -1, p0 + r0, nb - r0, 1}, ROW(s->xb, r0, D), ROW(s->x, r0, D), w->norm, D, eps);  /* RMSNorm use 4 of 4: final norm */
        float* logits = all_logits ? ROW(all_logits, c0, V) : s->logits;  /* the logits of rows r0 .. nb-1 */
        ops->matmul(ops, (float*[]){logits}, ROW(s->xb, r0, D), (const Matrix*[]){&w->lm_head}, 1, nb - r0);
        if (all_logits && last_chunk) memcpy(s->logits, ROW(logits, nb - 1, V), (size_t)V * sizeof(float));
    }
    return s->logits;
}
