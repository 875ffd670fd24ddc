/* checkpoint.c: the checkpoint file (its format: model.h) in memory: mapped read-only at a 2 MB
 * boundary, never copied, every field of its header checked against the file, then every weight
 * (model.h, Weights) pointed into it in the order of the table TENSORS (model.c). A bad file is
 * one error line that names the file and the problem, never a crash. */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* size bytes (whole pages) of anonymous memory with prot at a multiple of 2 MB, where a 2 MB page can
 * back them: reserve size + 2 MB, keep the first aligned stretch, give back the rest (both lengths
 * are whole pages and HUGE_PAGE is a whole number of them, so the tail is HUGE_PAGE - head long,
 * never empty). NULL and errno on failure. */
static char* map_aligned(size_t size, int prot) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size = (size + page - 1) / page * page;
    char* area = mmap(NULL, size + HUGE_PAGE, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) return NULL;
    char* start = (char*)(((uintptr_t)area + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    const size_t head = (size_t)(start - area);
    if (head > 0) munmap(area, head);
    munmap(start + size, HUGE_PAGE - head);
    return start;
}

/* size rounded up to whole 2 MB pages: what alloc_huge_anonymous maps and its free gives back. */
static size_t whole_huge_pages(size_t size) { return (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE; }

/* Straight from mmap, never from malloc's heap: a heap can hand back pages an earlier allocation
 * of the process wrote (a model loaded before this one), and the KV cache counts on pages no
 * position reached staying unmapped (model.c, populate_kv_cache). */
void* alloc_huge_anonymous(size_t size) {
    const size_t alloc = whole_huge_pages(size);
    char* start = map_aligned(alloc, PROT_READ | PROT_WRITE);
    if (start == NULL) {
        errno = ENOMEM;
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(start, alloc, MADV_HUGEPAGE); /* a hint; without THP the memory still works */
#endif
    return start;
}

void free_huge_anonymous(void* p, size_t size) {
    if (p != NULL) munmap(p, whole_huge_pages(size));
}

/* mmap(fd) read-only at a multiple of 2 MB, marked MADV_HUGEPAGE (checkpoint_populate faults it
 * in). A 2 MB page can only back a 2 MB aligned stretch of addresses that maps a 2 MB aligned
 * stretch of the file (here from offset 0): the file goes over an aligned reservation
 * (map_aligned). MAP_FAILED and errno on failure. */
static void* map_file(int fd, size_t size) {
    char* start = map_aligned(size, PROT_NONE);
    if (start == NULL) return MAP_FAILED;
    if (mmap(start, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED) {
        int e = errno;
        munmap(start, size);
        errno = e;
        return MAP_FAILED;
    }
#ifdef MADV_HUGEPAGE
    madvise(start, size, MADV_HUGEPAGE); /* a hint: EINVAL without THP is fine */
#endif
    return start;
}

void checkpoint_populate(const Transformer* t, void (*progress)(void* ctx, size_t done, size_t total), void* ctx) {
    char* start = (char*)t->file;
    const size_t size = t->file_size, page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t done = 0, n; done < size; done += n) {
        if (done > 0 && progress) progress(ctx, done, size);
        n = size - done < LOAD_PIECE ? size - done : LOAD_PIECE;
#ifdef MADV_POPULATE_READ
        if (madvise(start + done, n, MADV_POPULATE_READ) == 0) continue; /* pages the cache holds: mapped as they are */
#endif
        volatile char sink = 0;
        for (size_t i = 0; i < n; i += page) sink ^= start[done + i];
        (void)sink;
    }
}

/* ---- Loading ---- */

int load_fail(const LoadError* e, const char* fmt, ...) {
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
int checkpoint_map(Transformer* t, const LoadError* e) {
    const uint32_t one = 1; /* the file's numbers are little-endian, and the engine reads them in place */
    if (*(const uint8_t*)&one != 1) return load_fail(e, "this engine needs a little-endian machine");
    /* stat before open: opening a FIFO for reading waits for a writer, forever if none comes. */
    struct stat st;
    if (stat(e->path, &st) != 0) return load_fail(e, "cannot open: %s", strerror(errno));
    if (S_ISDIR(st.st_mode))
        return load_fail(e, "a directory, not a checkpoint file (a Hugging Face model folder becomes one with: "
                            "python3 export.py FOLDER MODEL.bin)");
    if (!S_ISREG(st.st_mode))
        return load_fail(e, "not a regular file (%s)", S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket");
    int fd = open(e->path, O_RDONLY);
    if (fd < 0) return load_fail(e, "cannot open: %s", strerror(errno));
    void* p = MAP_FAILED;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = load_fail(e, "cannot stat: %s", strerror(errno));
    else if ((uint64_t)st.st_size < sizeof(FileHeader))
        rc = load_fail(e, "file is %lld byte%s, too short for the %zu-byte checkpoint header", (long long)st.st_size,
                  st.st_size == 1 ? "" : "s", sizeof(FileHeader));
    else if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX)
        rc = load_fail(e, "file is too large to map on this machine");
    else if ((p = map_file(fd, (size_t)st.st_size)) == MAP_FAILED)
        rc = load_fail(e, "cannot mmap: %s", strerror(errno));
    close(fd); /* a mapping keeps the file alive */
    if (rc != 0) return -1;
    t->file = p;
    t->file_size = (size_t)st.st_size;
    return 0;
}

/* The header's format: magic, version, architecture and flags. Returns 0 or -1 with the error written. */
static int check_format(const FileHeader* h, const LoadError* e) {
    if (memcmp(h->magic, CHECKPOINT_MAGIC, 4) != 0) {
        /* the files a user of other engines may give instead: llama.cpp's, and a Hugging Face
         * folder's weights (an 8-byte header length, then the JSON header) */
        if (memcmp(h->magic, "GGUF", 4) == 0)
            return load_fail(e, "a GGUF file (llama.cpp's format), not a checkpoint of this engine: convert the "
                                "Hugging Face folder with python3 export.py FOLDER MODEL.bin");
        if (((const unsigned char*)h)[8] == '{')
            return load_fail(e, "a safetensors file, not a checkpoint of this engine: convert its Hugging Face "
                                "folder with python3 export.py FOLDER MODEL.bin");
        return load_fail(e, "not a checkpoint of this engine (bad magic; convert the model with export.py)");
    }
    /* Every version has this header, tokenizer section and tensor order; they differ in the q8
     * and q4 layouts (docs/checkpoint.md#versions), so an f32 or bf16 file of any version reads. */
    if (h->version < 1 || h->version > CHECKPOINT_VERSION)
        return load_fail(e, "checkpoint version %u, this engine reads versions 1 to %d", h->version, CHECKPOINT_VERSION);
    const char* quant = h->weight_type == WEIGHT_Q4 ? "q4" : "q8";
    if ((h->version < 5 && h->weight_type == WEIGHT_Q8) || (h->version < 4 && h->weight_type == WEIGHT_Q4))
        return load_fail(e, "a %s checkpoint of version %u, whose %s layout this engine does not read: export it "
                    "again with export.py", quant, h->version, quant);
    if (h->arch < ARCH_QWEN3 || h->arch > ARCH_QWEN3_MOE)
        return load_fail(e, "unknown architecture %u", h->arch);
    if (h->flags & ~(uint32_t)(FLAG_QK_NORM | FLAG_QKV_BIAS | FLAG_TIED_EMBED | FLAG_ROPE_YARN | FLAG_MOE))
        return load_fail(e, "unknown flags 0x%x", h->flags);
    return 0;
}

/* Qwen3-MoE's fields (FLAG_MOE): each in its range, every expert matrix indexable, the expert width
 * divisible by the group size; without the flag, all zero. */
static int check_experts(const FileHeader* h, const LoadError* e) {
    if (!(h->flags & FLAG_MOE)) {
        if (h->n_experts || h->n_experts_active || h->moe_hidden_dim || h->moe_sparse_step || h->moe_norm_topk ||
            h->n_mlp_only)
            return load_fail(e, "mixture-of-experts fields set without the flag that says the model has experts");
        return 0;
    }
    if (h->n_experts == 0 || h->n_experts > MAX_EXPERTS || h->n_experts_active == 0 ||
        h->n_experts_active > h->n_experts || h->moe_hidden_dim == 0 || h->moe_hidden_dim > MAX_HIDDEN ||
        h->moe_sparse_step == 0 || h->moe_sparse_step > h->n_layers || h->moe_norm_topk > 1 ||
        h->n_mlp_only > MAX_MLP_ONLY)
        return load_fail(e, "mixture-of-experts fields out of range (%u experts, %u per token, width %u, sparse step %u, "
                         "norm_topk %u, %u mlp_only layers)", h->n_experts, h->n_experts_active, h->moe_hidden_dim,
                         h->moe_sparse_step, h->moe_norm_topk, h->n_mlp_only);
    for (uint32_t i = 0; i < h->n_mlp_only; i++)
        if (h->mlp_only[i] >= h->n_layers)
            return load_fail(e, "mlp_only layer %u is past the last layer (%u)", h->mlp_only[i], h->n_layers - 1);
    if ((uint64_t)h->moe_hidden_dim * h->dim > MAX_MATRIX_VALUES || (uint64_t)h->n_experts * h->dim > MAX_MATRIX_VALUES)
        return load_fail(e, "matrices with more than 2^31 values are not supported");
    if ((h->weight_type == WEIGHT_Q8 || h->weight_type == WEIGHT_Q4) && h->moe_hidden_dim % h->group_size)
        return load_fail(e, "group size %u must divide the experts' width %u", h->group_size, h->moe_hidden_dim);
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
            return load_fail(e, "%s = %u is out of range (1 .. %u)", sizes[i].name, sizes[i].value, sizes[i].max);
    if (h->n_heads % h->n_kv_heads != 0)
        return load_fail(e, "n_heads = %u is not a multiple of n_kv_heads = %u", h->n_heads, h->n_kv_heads);
    if (h->head_dim % 2 != 0)
        return load_fail(e, "head_dim = %u is odd (RoPE rotates pairs)", h->head_dim);
    uint64_t q_dim = (uint64_t)h->n_heads * h->head_dim;
    if (q_dim > MAX_HIDDEN) return load_fail(e, "n_heads * head_dim = %llu is out of range", (unsigned long long)q_dim);
    /* The kernels index a matrix with int arithmetic: every matrix must have < 2^31 values. */
    if (max3(h->dim, h->hidden_dim, q_dim) * max3(h->vocab_size, h->hidden_dim, q_dim) > MAX_MATRIX_VALUES)
        return load_fail(e, "matrices with more than 2^31 values are not supported");
    if (h->weight_type > WEIGHT_Q4)
        return load_fail(e, "unknown weight type %u", h->weight_type);
    if (h->weight_type == WEIGHT_Q4 && h->group_size != Q4_GROUP)
        return load_fail(e, "q4 group size %u: this engine's q4 has groups of %d", h->group_size, Q4_GROUP);
    if (h->weight_type == WEIGHT_Q8 || h->weight_type == WEIGHT_Q4) {
        if (h->group_size == 0 || h->dim % h->group_size || h->hidden_dim % h->group_size || q_dim % h->group_size)
            return load_fail(e, "%s group size %u must be nonzero and divide dim %u, hidden_dim %u and n_heads*head_dim "
                        "%llu", h->weight_type == WEIGHT_Q4 ? "q4" : "q8", h->group_size, h->dim, h->hidden_dim,
                        (unsigned long long)q_dim);
    } else if (h->group_size != 0) {
        return load_fail(e, "group_size = %u for an unquantised checkpoint (must be 0)", h->group_size);
    }
    return check_experts(h, e);
}

/* The constants (RMSNorm's eps, RoPE's base), the special tokens and the generation defaults. */
static int check_constants(const FileHeader* h, const LoadError* e) {
    if (!(h->rms_norm_eps > 0.0f && h->rms_norm_eps < 1.0f))
        return load_fail(e, "rms_norm_eps = %g is not in (0, 1)", h->rms_norm_eps);
    if (!(h->rope_theta >= 1.0 && h->rope_theta < MAX_ROPE_THETA)) /* below 1 the frequencies grow along the head */
        return load_fail(e, "rope_theta = %g is out of range: at least 1 and below %g", h->rope_theta, MAX_ROPE_THETA);
    if ((h->flags & FLAG_ROPE_YARN) &&
        (!(h->rope_factor >= 1.0f && h->rope_factor <= MAX_ROPE_FACTOR) || h->rope_original_max == 0 ||
         h->rope_original_max > MAX_POSITIONS || h->rope_truncate > 1 ||
         !(h->rope_attention_factor > 0.0f && h->rope_attention_factor < MAX_ROPE_FACTOR) ||
         !(h->rope_beta_fast > 0.0f && h->rope_beta_fast < MAX_ROPE_FACTOR) ||
         !(h->rope_beta_slow > 0.0f && h->rope_beta_slow < MAX_ROPE_FACTOR)))
        return load_fail(e, "YaRN fields out of range (factor %g, original_max_position_embeddings %u, attention "
                         "factor %g, beta_fast %g, beta_slow %g, truncate %u)", h->rope_factor, h->rope_original_max,
                         h->rope_attention_factor, h->rope_beta_fast, h->rope_beta_slow, h->rope_truncate);
    if (h->bos_id < -1 || h->bos_id >= (int32_t)h->vocab_size)
        return load_fail(e, "bos_id = %d is not -1 or a token id", h->bos_id);
    if (h->n_eos > MAX_EOS_IDS)
        return load_fail(e, "n_eos = %u is more than %d", h->n_eos, MAX_EOS_IDS);
    for (uint32_t i = 0; i < h->n_eos; i++)
        if (h->eos_ids[i] < 0)
            return load_fail(e, "eos id %d is negative", h->eos_ids[i]);
    if (!(h->temperature >= 0.0f && h->temperature <= MAX_TEMPERATURE) ||
        !(h->top_p >= 0.0f && h->top_p <= MAX_TOP_P) || h->top_k < 0)
        return load_fail(e, "generation defaults out of range (temperature %g, top_p %g, top_k %d)", h->temperature,
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
            return load_fail(e, "%s section [%llu, +%llu) is not inside the %llu-byte file (truncated?)", sections[i].name,
                        (unsigned long long)offset, (unsigned long long)bytes, (unsigned long long)size);
    }
    if (h->tokenizer_offset < h->weights_offset + h->weights_bytes &&
        h->weights_offset < h->tokenizer_offset + h->tokenizer_bytes)
        return load_fail(e, "the tokenizer and weights sections overlap");
    return 0;
}

/* Checks every header field and the sections, and fills the Config; seq_len is ctx (<= 0: the
 * default) held to the model's context. Returns 0 or -1 with the error written. */
int checkpoint_config(Transformer* t, int ctx, const LoadError* e) {
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
        .rope_factor = h->rope_factor, .rope_beta_fast = h->rope_beta_fast, .rope_beta_slow = h->rope_beta_slow,
        .rope_attention_factor = h->rope_attention_factor, .rope_original_max = (int)h->rope_original_max,
        .rope_truncate = (int)h->rope_truncate, .n_experts = (int)h->n_experts,
        .n_experts_active = (int)h->n_experts_active, .moe_hidden_dim = (int)h->moe_hidden_dim,
        .moe_sparse_step = (int)h->moe_sparse_step, .moe_norm_topk = (int)h->moe_norm_topk,
        .n_mlp_only = (int)h->n_mlp_only,
        .weight_type = (WeightType)h->weight_type, .group_size = (int)h->group_size,
    };
    for (uint32_t i = 0; i < h->n_mlp_only; i++) t->config.mlp_only[i] = (int)h->mlp_only[i];
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

/* The next tensor of the walk, `bytes` long (what: its name, for the error); NULL once one does
 * not fit, with w->failed set and the error written. */
static const void* checkpoint_take(TensorWalk* w, uint64_t bytes, const char* what) {
    uint64_t start = (w->pos + CHECKPOINT_ALIGN - 1) / CHECKPOINT_ALIGN * CHECKPOINT_ALIGN;
    if (w->failed) return NULL;
    if (start + bytes > w->end) {
        char layer[32] = "";
        if (w->layer >= 0) snprintf(layer, sizeof layer, "layer %d ", w->layer);
        w->failed = 1;
        load_fail(w->e, "tensor %s%s (%llu bytes at offset %llu) ends past the weights section (which ends at %llu): the "
             "file is truncated or its header does not match its tensors", layer, what, (unsigned long long)bytes,
             (unsigned long long)start, (unsigned long long)w->end);
        return NULL;
    }
    w->pos = start + bytes;
    return w->base + start;
}

/* ---- The tensors: every weight pointed into the mapping, in the order of TENSORS (model.c) ---- */

static int tensor_stored(const TensorInfo* ti, int flags) {
    return (flags & ti->only_with) == ti->only_with && !(flags & ti->not_with);
}

void* tensor_slot(const TensorInfo* ti, const Weights* w, int layer, int expert) {
    if (ti->place == GLOBAL) return (char*)w + ti->field;
    char* lw = (char*)&w->layers[layer];
    return ti->place == EXPERT ? (void*)(*(Matrix**)(lw + ti->field) + expert) : lw + ti->field;
}

void for_each_tensor(const Config* c, void (*fn)(void* ctx, const TensorInfo* ti, int layer, int expert), void* ctx) {
    int first = 0, end;
    while (first < N_TENSORS && TENSORS[first].place == GLOBAL) first++;
    for (end = first; end < N_TENSORS && TENSORS[end].place != GLOBAL; end++) {}
    for (int i = 0; i < first; i++)
        if (tensor_stored(&TENSORS[i], c->flags)) fn(ctx, &TENSORS[i], -1, -1);
    for (int l = 0; l < c->n_layers; l++) {
        const int flags = c->flags | (config_layer_is_moe(c, l) ? FLAG_MOE_LAYER : 0);
        for (int i = first; i < end; i++) {
            if (TENSORS[i].place != EXPERT) {
                if (tensor_stored(&TENSORS[i], flags)) fn(ctx, &TENSORS[i], l, -1);
                continue;
            }
            int j = i; /* a run of EXPERT rows: expert 0's, then expert 1's, ... */
            while (j < end && TENSORS[j].place == EXPERT) j++;
            for (int e = 0; e < c->n_experts && tensor_stored(&TENSORS[i], flags); e++)
                for (int k = i; k < j; k++) fn(ctx, &TENSORS[k], l, e);
            i = j - 1;
        }
    }
    for (int i = end; i < N_TENSORS; i++)
        if (tensor_stored(&TENSORS[i], c->flags)) fn(ctx, &TENSORS[i], -1, -1);
}

/* One tensor of the walk: a MATRIX in the header's weight type (rows * cols < 2^31, check_sizes),
 * or in float32 (the router), or a float32 vector, pointed to where the table says. */
static void map_tensor(void* ctx, const TensorInfo* ti, int layer, int expert) {
    TensorWalk* walk = ctx;
    void* slot = tensor_slot(ti, walk->w, layer, expert);
    const int rows = tensor_size(ti->rows, walk->c);
    walk->layer = layer;
    if (ti->cols == SIZE_NONE) {
        *(const float**)slot = checkpoint_take(walk, (uint64_t)rows * sizeof(float), ti->name);
        return;
    }
    Matrix m = {ti->float32 ? WEIGHT_F32 : walk->c->weight_type, rows, tensor_size(ti->cols, walk->c),
                ti->float32 ? 0 : walk->c->group_size, NULL};
    m.data = checkpoint_take(walk, matrix_stored_bytes(&m), ti->name);
    *(Matrix*)slot = m;
}

/* The experts' Matrix arrays of every mixture-of-experts layer, in one allocation. */
static int alloc_experts(Weights* w, const Config* c) {
    int n_moe = 0;
    for (int l = 0; l < c->n_layers; l++) n_moe += config_layer_is_moe(c, l);
    if (n_moe == 0) return 0;
    w->experts = calloc((size_t)n_moe * 3 * (size_t)c->n_experts, sizeof(Matrix));
    if (!w->experts) return -1;
    Matrix* next = w->experts;
    for (int l = 0; l < c->n_layers; l++) {
        if (!config_layer_is_moe(c, l)) continue;
        LayerWeights* lw = &w->layers[l];
        lw->expert_gate = next, lw->expert_up = next + c->n_experts, lw->expert_down = next + 2 * c->n_experts;
        next += 3 * c->n_experts;
    }
    return 0;
}

int checkpoint_weights(Transformer* t, const LoadError* e) {
    const Config* c = &t->config;
    Weights* w = &t->weights;
    const uint64_t start = t->header.weights_offset;
    TensorWalk walk = {t->file, start, start + t->header.weights_bytes, c, w, -1, e, 0};

    w->layers = calloc((size_t)c->n_layers, sizeof(LayerWeights));
    if (w->layers == NULL || alloc_experts(w, c) != 0) return load_fail(e, "out of memory");
    for_each_tensor(c, map_tensor, &walk);
    /* QWEN3.md 2.2 step 4 and 7.7: a tied model's output projection is the embedding matrix. */
    if (c->flags & FLAG_TIED_EMBED) w->lm_head = w->embed_tokens;
    if (walk.failed) return -1;
    /* export.py pads the section to a multiple of 64 after the last tensor; anything more means the
     * header describes a different model than the one stored. */
    if (walk.end - walk.pos >= CHECKPOINT_ALIGN)
        return load_fail(e, "the weights section has %llu bytes after the last tensor: the header does not match the "
                    "tensors", (unsigned long long)(walk.end - walk.pos));
    return 0;
}
