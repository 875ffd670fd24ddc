/* quantize.c: `./run MODEL.bin -m quantize --dtype q8|q4 -o OUT.bin` (quantize.h).
 *
 * The output must be the very bytes export.py writes for --dtype q8|q4 from the Hugging Face
 * folder, so every rounding step below is export.py's (quantize_q8, quantize_q4,
 * quant_row_blocks) done in the same precision: Python floats are C doubles, Python's round() is
 * rint() in the default rounding mode (to nearest, ties to even), struct's 'e' is double_to_half
 * below, and export.py's array('f') is a C float. The checkpoint read is f32 or bf16, and both
 * widen to exactly the float32 values export.py quantises.
 *
 * The work is a stream: each matrix is cut into chunks of row blocks, the kernel threads quantise
 * a chunk's blocks into the output buffer, and the buffer goes to the file in large writes, so the
 * time is about what reading the input once and writing the output once costs.
 */
#include "quantize.h"
#include "generation.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "model.h"
#include "checkpoint.h"
#include "cli/output_path.h"

#define CHUNK_BYTES ((size_t)4 << 20)       /* output bytes of row blocks per dispatch to the threads,
                                             * then written to the file in one fwrite */
#define ITEM_BYTES ((size_t)64 << 10)       /* ... in items of about this many, which the threads claim
                                             * in turn: one that loses its core takes fewer */
#define PROGRESS_MIN_BYTES ((uint64_t)64 << 20) /* smaller inputs take a moment: no progress shown */

/* Whatever ends the program early removes the temporary file first. Errors name the output as the
 * user gave it (out_name), not this temporary name. */
static char tmp_path[PATH_MAX];
static const char* out_name = "standard output";
static volatile sig_atomic_t tmp_exists = 0;

/* One line "run: error: ...", then exit with status (the unfinished file removed first). */
static __attribute__((noreturn)) void error_exit(int status, const char* fmt, va_list ap) {
    if (tmp_exists) unlink(tmp_path);
    fputs("run: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    exit(status);
}

static __attribute__((noreturn, format(printf, 1, 2))) void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_exit(1, fmt, ap);
}

/* A bad command line: status 2, as ./run's other modes give. */
static __attribute__((noreturn, format(printf, 1, 2))) void usage_error(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_exit(2, fmt, ap);
}

/* Ctrl-C, kill, a closed terminal: remove the unfinished file, then die of the same signal (the
 * line after the progress line where one is open on a terminal). */
static volatile sig_atomic_t progress_open = 0;
static void on_signal(int sig) {
    if (tmp_exists) unlink(tmp_path);
    static const char msg[] = "\nrun: interrupted; no output written\n";
    ssize_t ignored = write(STDERR_FILENO, msg + !progress_open, sizeof msg - 1 - !progress_open);
    (void)ignored;
    signal(sig, SIG_DFL);
    raise(sig);
}

/* A signal that the parent left ignored (nohup, a script's `cmd &`) stays ignored, as in the chat. */
static void catch_signals(void) {
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
        if (signal(sigs[i], on_signal) == SIG_IGN) signal(sigs[i], SIG_IGN);
}

static int streq(const char* a, const char* b) { return strcmp(a, b) == 0; }

typedef struct {
    const char* input;
    const char* output;
    const char* dtype; /* "q8" or "q4" */
    int group_size;    /* 0: the default */
    int threads;       /* 0: one per online CPU */
    int stream;        /* --stream: rows from standard input, row blocks to standard output */
} QuantizeOptions;

static void usage(void) {
    fputs("Usage:   ./run MODEL.bin -m quantize --dtype q8|q4 -o OUT.bin [--group-size N] [--threads N]\n"
          "Writes MODEL.bin (an f32 or bf16 checkpoint) with its matrices quantised: the same bytes\n"
          "as `export.py --dtype q8|q4` writes from the model's Hugging Face folder.\n"
          "Options:\n"
          "      --dtype q8|q4      q8: int8 in groups of --group-size columns; q4: 4-bit in groups\n"
          "                         of 32 (both with a float16 scale per group; model.h)\n"
          "  -o, --output PATH      the checkpoint to write (not MODEL.bin itself)\n"
          "      --group-size N     q8's group size, a power of two >= 8 (default 64, halved until it\n"
          "                         divides every matrix width, as export.py does); q4 takes only 32\n"
          "      --threads N        threads (default and most: one per CPU this process may run on)\n"
          "      --stream           no MODEL.bin or -o: matrices' rows come on standard input and\n"
          "                         their q8 or q4 row blocks go to standard output (export.py's\n"
          "                         way to quantise without a temporary file; quantize.c says how)\n"
          "  -h, --help             this help\n",
          stdout);
}

static int parse_count(const char* flag, const char* s, int lo, int hi) {
    char* end;
    errno = 0;
    long v = strtol(s, &end, 10);
    const int digits = isdigit((unsigned char)s[*s == '-']); /* as ./run's options: no '+' or space first */
    if (!digits || end == s || *end != '\0' || errno == ERANGE || v < lo || v > hi)
        usage_error("%s needs a whole number in %d .. %d, got '%s'", flag, lo, hi, s);
    return (int)v;
}

static void set_option(QuantizeOptions* o, const char* name, const char* value) {
    if (streq(name, "-m") || streq(name, "--mode")) {
        if (!streq(value, "quantize")) usage_error("%s is given twice: quantize and '%s'", name, value);
    } else if (streq(name, "--dtype")) {
        if (!streq(value, "q8") && !streq(value, "q4"))
            usage_error("--dtype must be q8 or q4, got '%s' (f32 and bf16 come from export.py)", value);
        o->dtype = value;
    } else if (streq(name, "-o") || streq(name, "--output")) {
        if (!value[0]) usage_error("%s needs a file name", name);
        o->output = value;
    } else if (streq(name, "--group-size")) {
        o->group_size = parse_count(name, value, 8, 1 << 20);
        if (o->group_size & (o->group_size - 1)) usage_error("--group-size must be a power of two >= 8, got %s", value);
    } else {
        o->threads = parse_count(name, value, 1, 1024);
    }
}

static void parse_options(int argc, char** argv, QuantizeOptions* o) {
    static const char* const names[] = {"-m", "--mode", "--dtype", "-o", "--output", "--group-size", "--threads"};
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (streq(arg, "-h") || streq(arg, "--help")) {
            usage();
            if (fflush(stdout) != 0 || ferror(stdout)) fail("standard output: write failed: %s", strerror(errno));
            exit(0);
        }
        if (streq(arg, "--stream")) {
            o->stream = 1;
            continue;
        }
        if (arg[0] != '-' || arg[1] == '\0') {
            if (o->input) usage_error("unexpected argument '%s' (the checkpoint is '%s')", arg, o->input);
            o->input = arg;
            continue;
        }
        const char* eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        const size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        const char* name = NULL;
        for (size_t k = 0; k < sizeof names / sizeof *names; k++)
            if (strlen(names[k]) == len && strncmp(arg, names[k], len) == 0) name = names[k];
        if (!name) usage_error("-m quantize: unknown option '%s' (see ./run -m quantize --help)", arg);
        const char* value = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (value == NULL) usage_error("option %s needs a value (see ./run -m quantize --help)", name);
        set_option(o, name, value);
    }
    if (o->stream && (o->input || o->output)) usage_error("--stream takes no checkpoint and no -o: it reads standard input");
    if (o->input == NULL && !o->stream)
        usage_error("no checkpoint given (./run MODEL.bin -m quantize --dtype q8|q4 -o OUT.bin)");
    if (!o->dtype) usage_error("-m quantize needs --dtype q8 or --dtype q4");
    if (o->output == NULL && !o->stream) usage_error("-m quantize needs -o OUT.bin, the file to write");
    if (streq(o->dtype, "q4") && o->group_size != 0 && o->group_size != Q4_GROUP)
        usage_error("q4 groups are %d columns (got --group-size %d)", Q4_GROUP, o->group_size);
}

/* Into target: the file that the output replaces (output_path_target: the output, or where its link
 * leads), which must be able to be a file and must not be the input (a bad command line, as
 * --dump-logits naming the checkpoint is). */
static void output_target(const char* input, const char* output, char* target, size_t size) {
    char why[256];
    if (output_path_target(output, target, size, why, sizeof why) != 0)
        fail("%s: %s; give a file name for the checkpoint", output, why);
    struct stat in, out;
    if (stat(target, &out) == 0 && stat(input, &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino)
        usage_error("%s: is the input checkpoint; write the quantised one somewhere else", output);
}

enum { GROUP_OK = 0, GROUP_NONFINITE, GROUP_OVERFLOW };

/* double -> IEEE binary16 bits, rounded to nearest, ties to even, from the double itself (one
 * rounding, as Python's struct.pack('e') does). -1 where the result is not finite: |x| >= 65520
 * rounds to 65536 or more, which struct refuses with OverflowError. x must not be a NaN. */
static int double_to_half(double x) {
    const int sign = signbit(x) ? 0x8000 : 0;
    const double a = fabs(x);
    if (a >= 65520.0) return -1;
    /* Below 2^-14: zero or a subnormal, a multiple of 2^-24 (a result of 1024 is the smallest
     * normal, whose bits are that same 0x400). */
    if (a < 0x1p-14) return sign | (int)rint(a * 0x1p24);
    /* a = 1.f * 2^e with e in -14 .. 15, the half's exponent: a * 2^(10 - e) in [1024, 2048)
     * rounds to its 11 significant bits (2048 carries into the exponent, as it should). */
    const int e = ilogb(a);
    const int q = (int)rint(ldexp(a, 10 - e));
    return sign | (((e + 15) << 10) + (q - 1024));
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void store_half(uint8_t* at, int h) {
    const uint16_t v = (uint16_t)h;
    memcpy(at, &v, sizeof v);
}

/* One q8 group of gs values (export.py, quantize_q8): m = max|w|, s = m / 127 rounded to float16,
 * q = round(w / s) from the rounded s, clamped to [-127, 127]; a group whose s is 0 is all 0.
 * The magnitudes are compared as the integers of their bit patterns (the same order for
 * non-negative floats, and an infinity or NaN compares above every finite value). */
static int q8_quantize_group(const float* v, int gs, uint8_t* scale, int8_t* q) {
    uint32_t amax = 0;
    for (int i = 0; i < gs; i++) {
        const uint32_t a = float_bits(v[i]) & 0x7fffffffu;
        amax = a > amax ? a : amax;
    }
    if (amax >= 0x7f800000u) return GROUP_NONFINITE;
    /* export.py's m is max(max(block), -min(block)); Python's max keeps the first of equal
     * values, so an all-zero group's m is its first value, -0.0 included (its scale 0x8000). */
    const double m = amax ? (double)float_of_bits(amax) : (double)v[0];
    const int h = double_to_half(m / 127.0);
    if (h < 0) return GROUP_OVERFLOW;
    store_half(scale, h);
    const double s = half_to_float((uint16_t)h);
    const double inv = s > 0 ? 1.0 / s : 0.0; /* s = 0: every q is 0 */
    for (int i = 0; i < gs; i++) {
        const double x = rint((double)v[i] * inv);
        q[i] = (int8_t)(x > 127 ? 127 : x < -127 ? -127 : x);
    }
    return GROUP_OK;
}

/* One q4 group of 32 values of row i of a block (export.py, quantize_q4, llama.cpp's q4_0): m = the
 * value of largest magnitude (the negative one when w and -w tie), q = round(w * (-8 / m)) + 8
 * clipped to 15, s = m / -8 rounded to float32 (export.py keeps the scales in array('f')), then to
 * float16; an all-zero group is q = 8 with s = 0. The group's 144 bytes in the block (model.h):
 * the 8 rows' scales, then byte 4i + k of quarter v holds row i's column 4v + k in its low nibble
 * and column 16 + 4v + k in its high one. */
static int q4_quantize_group(const float* v, uint8_t* group, int i) {
    uint32_t pos = 0, neg = 0; /* the largest magnitude among the non-negative / negative values */
    for (int j = 0; j < Q4_GROUP; j++) {
        const uint32_t bits = float_bits(v[j]), a = bits & 0x7fffffffu, negative = 0u - (bits >> 31);
        neg = (a & negative) > neg ? a & negative : neg; /* no branch on the sign: it is random */
        pos = (a & ~negative) > pos ? a & ~negative : pos;
    }
    if (pos >= 0x7f800000u || neg >= 0x7f800000u) return GROUP_NONFINITE;
    uint8_t nib[Q4_GROUP];
    memset(nib, 8, Q4_GROUP);
    int h = 0;
    if (pos != 0 || neg != 0) {
        const double m = neg >= pos ? -(double)float_of_bits(neg) : (double)float_of_bits(pos);
        h = double_to_half((double)(float)(m / -8.0));
        if (h < 0) return GROUP_OVERFLOW;
        const double inv = -8.0 / m;
        for (int j = 0; j < Q4_GROUP; j++) {
            const double x = rint((double)v[j] * inv) + 8;
            nib[j] = (uint8_t)(x > 15 ? 15 : x < 0 ? 0 : x); /* only 15 is reached: |w * inv| <= 8 */
        }
    }
    store_half(group + QUANT_SCALE_BYTES * i, h);
    uint8_t* values = group + QUANT_SCALE_BYTES * Q4_BLOCK_ROWS;
    for (int quarter = 0; quarter < 4; quarter++)
        for (int k = 0; k < 4; k++)
            values[32 * quarter + 4 * i + k] = (uint8_t)(nib[4 * quarter + k] | nib[16 + 4 * quarter + k] << 4);
    return GROUP_OK;
}

/* Row r of W as float32: the mapping itself (f32), widened into scratch (bf16), or zeros in scratch
 * for a padding row past the end (the last row block, model.h, is padded with zero rows). */
static const float* row_values(const Matrix* W, int r, float* scratch) {
    if (r >= W->rows) memset(scratch, 0, (size_t)W->cols * sizeof(float));
    else if (W->type == WEIGHT_F32) return (const float*)W->data + (size_t)r * (size_t)W->cols;
    else matrix_row(scratch, W, r); /* the embedding lookup's widening */
    return scratch;
}

/* Row block b: q8's holds the 4 rows' scales s[4][G], then per group g the 4 rows' values
 * q[g][4][gs]; q4's is G groups of 144 bytes (q4_quantize_group). Returns GROUP_OK, or the first
 * problem with *bad_row set. */
static int quantize_block(const Matrix* W, WeightType type, int gs, int b, uint8_t* out, float* scratch,
                          int* bad_row) {
    const int G = W->cols / gs, br = quant_block_rows(type);
    int8_t* q8_values = (int8_t*)(out + QUANT_SCALE_BYTES * Q8_BLOCK_ROWS * (size_t)G);
    for (int i = 0; i < br; i++) {
        const int r = b * br + i;
        const float* v = row_values(W, r, scratch);
        for (int g = 0; g < G; g++) {
            const int status = type == WEIGHT_Q4
                ? q4_quantize_group(v + (size_t)g * gs, out + (size_t)g * Q4_GROUP_BYTES, i)
                : q8_quantize_group(v + (size_t)g * gs, gs, out + QUANT_SCALE_BYTES * ((size_t)i * G + g),
                                    q8_values + ((size_t)g * Q8_BLOCK_ROWS + i) * gs);
            if (status != GROUP_OK) {
                *bad_row = r;
                return status;
            }
        }
    }
    return GROUP_OK;
}

/* What the conversion of every matrix shares. */
typedef struct {
    const Ops* k;
    FILE* out;
    WeightType type;
    int group_size;
    float* scratch;    /* a row of row_floats floats per kernel thread */
    size_t row_floats;
} Conversion;

/* One chunk of a matrix's row blocks, spread over the kernel threads. */
typedef struct {
    const Conversion* cv;
    const Matrix* src;
    int first_block;
    int n_blocks, per_item; /* the chunk's blocks, and how many one item holds */
    uint8_t* out;           /* where the chunk's first block goes */
    size_t block_bytes;
    atomic_int status;      /* GROUP_OK, or the problem found at problem_row */
    atomic_int problem_row;
} ChunkJob;

static void quantize_item(void* ctx, int item, int thread) {
    ChunkJob* job = ctx;
    const Conversion* cv = job->cv;
    const int begin = item * job->per_item;
    const int end = begin + job->per_item < job->n_blocks ? begin + job->per_item : job->n_blocks;
    float* scratch = cv->scratch + (size_t)thread * cv->row_floats;
    for (int k = begin; k < end && atomic_load(&job->status) == GROUP_OK; k++) {
        int bad_row = -1, expected = GROUP_OK;
        const int status = quantize_block(job->src, cv->type, cv->group_size, job->first_block + k,
                                          job->out + (size_t)k * job->block_bytes, scratch, &bad_row);
        if (status != GROUP_OK && atomic_compare_exchange_strong(&job->status, &expected, status))
            atomic_store(&job->problem_row, bad_row);
    }
}

static void put(FILE* f, const void* data, size_t n) {
    if (fwrite(data, 1, n, f) != n) fail("%s: write failed: %s", out_name, strerror(errno));
}

static uint64_t align_up(uint64_t x) { return (x + CHECKPOINT_ALIGN - 1) / CHECKPOINT_ALIGN * CHECKPOINT_ALIGN; }

/* Zero bytes up to the next multiple of CHECKPOINT_ALIGN: where every tensor starts. */
static void put_padding(FILE* f) {
    static const uint8_t zeros[CHECKPOINT_ALIGN];
    const uint64_t at = (uint64_t)ftello(f);
    put(f, zeros, (size_t)(align_up(at) - at));
}

/* A tensor of the checkpoint (model.h, TensorInfo). */
typedef struct {
    char name[128];       /* "embed_tokens", "layer 3 q_proj", ... for progress and errors */
    const Matrix* matrix; /* quantised; NULL for a float32 vector, copied as it is */
    const float* vector;
    int n;
    uint64_t in_bytes;    /* as read from the input */
    int first_row;        /* the tensor's row that is the matrix's first (--stream: a run of its rows) */
} Piece;

static void add_piece(Piece* pieces, int* n, int layer, const char* what, const Matrix* m, const float* v, int len) {
    Piece* p = &pieces[(*n)++];
    if (layer >= 0) snprintf(p->name, sizeof p->name, "layer %d %s", layer, what);
    else snprintf(p->name, sizeof p->name, "%s", what);
    p->matrix = m;
    p->vector = v;
    p->n = len;
    p->in_bytes = m ? matrix_stored_bytes(m) : (uint64_t)len * sizeof(float);
    p->first_row = 0;
}

typedef struct {
    const Transformer* t;
    Piece* pieces;
    int n;
} PieceList;

/* A tensor as a piece: a MATRIX to quantise, or float32 values copied as they are (a vector, or a
 * matrix the format keeps in float32: the router). */
static void add_tensor(void* ctx, const TensorInfo* ti, int layer, int expert) {
    PieceList* list = ctx;
    const void* slot = tensor_slot(ti, &list->t->weights, layer, expert);
    const Config* c = &list->t->config;
    if (ti->cols == SIZE_NONE)
        add_piece(list->pieces, &list->n, layer, ti->name, NULL, *(const float* const*)slot, tensor_size(ti->rows, c));
    else if (ti->float32)
        add_piece(list->pieces, &list->n, layer, ti->name, NULL, ((const Matrix*)slot)->data,
                  tensor_size(ti->rows, c) * tensor_size(ti->cols, c));
    else
        add_piece(list->pieces, &list->n, layer, ti->name, slot, NULL, 0);
}

static void count_piece(void* ctx, const TensorInfo* ti, int layer, int expert) { ++*(int*)ctx; }

/* The pieces in the order of model.c's TENSORS (*n of them), or NULL when out of memory. */
static Piece* list_pieces(const Transformer* t, int* n) {
    *n = 0;
    for_each_tensor(&t->config, count_piece, n);
    PieceList list = {t, malloc((size_t)*n * sizeof(Piece)), 0};
    if (list.pieces) for_each_tensor(&t->config, add_tensor, &list);
    return list.pieces;
}

/* The piece as stored in the output (type: the quantised one). */
static uint64_t piece_out_bytes(const Piece* p, WeightType type, int gs) {
    if (!p->matrix) return p->in_bytes;
    const Matrix m = {type, p->matrix->rows, p->matrix->cols, gs, NULL};
    return matrix_stored_bytes(&m);
}

/* q8: the requested group size (default 64) if it divides every matrix width, else the largest
 * power of two below it (at least 8) that does; q4: 32. export.py's choose_group_size. */
static int choose_group_size(const Config* c, WeightType type, int requested, const char* path) {
    const int widths[4] = {c->dim, c->hidden_dim, c->n_heads * c->head_dim, c->moe_hidden_dim ? c->moe_hidden_dim : c->dim};
    const int smallest = type == WEIGHT_Q4 ? Q4_GROUP : 8;
    for (int g = type == WEIGHT_Q4 ? Q4_GROUP : requested ? requested : 64; g >= smallest; g /= 2)
        if (widths[0] % g == 0 && widths[1] % g == 0 && widths[2] % g == 0 && widths[3] % g == 0) return g;
    fail("%s: %s needs every input width ([%d, %d, %d, %d]) to be a multiple of %d", path,
         type == WEIGHT_Q4 ? "q4" : "q8", widths[0], widths[1], widths[2], widths[3], smallest);
}

/* Progress on stderr: one updating line on a terminal, a line every 10% elsewhere. */
typedef struct {
    uint64_t done, total;
    double t0, last_shown;
    int tty, decile;
} Progress;

static void progress_add(Progress* p, uint64_t bytes, const char* name) {
    p->done += bytes;
    if (p->total <= PROGRESS_MIN_BYTES) return;
    const double now = now_seconds(), elapsed = now - p->t0;
    const int decile = (int)(10 * p->done / p->total);
    if (p->tty ? now - p->last_shown < 0.1 && p->done < p->total : decile <= p->decile) return;
    p->last_shown = now;
    p->decile = decile;
    const double eta = p->done ? elapsed * (double)(p->total - p->done) / (double)p->done : 0;
    fprintf(stderr, "%srun: quantize %5.1f%%  %llu/%llu MB  eta %3.0fs  %-*s%s", p->tty ? "\r" : "",
            100.0 * (double)p->done / (double)p->total, (unsigned long long)(p->done >> 20),
            (unsigned long long)(p->total >> 20), eta, p->tty ? 32 : 0, name, p->tty ? "" : "\n");
    progress_open = p->tty;
    fflush(stderr);
}

static void quantize_matrix(const Conversion* cv, const Piece* p, Progress* progress) {
    const Matrix* src = p->matrix;
    const int br = quant_block_rows(cv->type);
    const int n_blocks = (src->rows + br - 1) / br;
    const size_t block_bytes = quant_block_bytes(cv->type, src->cols, cv->group_size);
    const uint64_t in_block_bytes = p->in_bytes / (uint64_t)src->rows * (uint64_t)br;
    const int per_chunk = block_bytes < CHUNK_BYTES ? (int)(CHUNK_BYTES / block_bytes) : 1;
    const int per_item = block_bytes < ITEM_BYTES ? (int)(ITEM_BYTES / block_bytes) : 1;
    const char* dtype = cv->type == WEIGHT_Q4 ? "q4" : "q8";
    uint8_t* chunk = malloc((size_t)(per_chunk < n_blocks ? per_chunk : n_blocks) * block_bytes);
    if (chunk == NULL) fail("out of memory");
    for (int b = 0; b < n_blocks; b += per_chunk) {
        const int n = n_blocks - b < per_chunk ? n_blocks - b : per_chunk;
        ChunkJob job = {cv, src, b, n, per_item, chunk, block_bytes, GROUP_OK, -1};
        cv->k->parallel_for(cv->k, (n + per_item - 1) / per_item, quantize_item, &job);
        if (atomic_load(&job.status) == GROUP_NONFINITE)
            fail("tensor %s: row %d holds a NaN or an infinity, which %s cannot store", p->name,
                 p->first_row + atomic_load(&job.problem_row), dtype);
        if (atomic_load(&job.status) == GROUP_OVERFLOW)
            fail("tensor %s: row %d has a weight too large for %s's float16 scales (|w| above %s)", p->name,
                 p->first_row + atomic_load(&job.problem_row), dtype, cv->type == WEIGHT_Q4 ? "524,000" : "8,300,000");
        put(cv->out, chunk, (size_t)n * block_bytes);
        progress_add(progress, (uint64_t)n * in_block_bytes, p->name);
    }
    free(chunk);
}

/* The output's header: the input's, with the new weight type, and the sections where export.py
 * puts them (the tokenizer right after the header, the tensors at the next multiple of 64). */
static FileHeader output_header(const Transformer* t, WeightType type, int gs, const Piece* pieces, int n) {
    FileHeader h = t->header;
    h.version = CHECKPOINT_VERSION;
    h.weight_type = (uint32_t)type;
    h.group_size = (uint32_t)gs;
    h.reserved0 = h.reserved1 = 0;
    memset(h.reserved, 0, sizeof h.reserved);
    h.tokenizer_offset = sizeof(FileHeader);
    h.tokenizer_bytes = t->tokenizer_bytes;
    h.weights_offset = align_up(h.tokenizer_offset + h.tokenizer_bytes);
    uint64_t end = h.weights_offset;
    for (int i = 0; i < n; i++) end = align_up(end) + piece_out_bytes(&pieces[i], type, gs);
    h.weights_bytes = align_up(end) - h.weights_offset;
    return h;
}

/* Writes the whole checkpoint to the open temporary file. */
static void write_checkpoint(FILE* f, const Transformer* t, WeightType type, int gs) {
    int n;
    Piece* pieces = list_pieces(t, &n);
    if (pieces == NULL) fail("out of memory");
    const FileHeader h = output_header(t, type, gs, pieces, n);
    const Config* c = &t->config;
    size_t widest = (size_t)(c->dim > c->hidden_dim ? c->dim : c->hidden_dim);
    if ((size_t)c->n_heads * c->head_dim > widest) widest = (size_t)c->n_heads * c->head_dim;
    if ((size_t)c->moe_hidden_dim > widest) widest = (size_t)c->moe_hidden_dim;
    const Conversion cv = {t->kernels, f, type, gs,
                           malloc((size_t)t->kernels->threads(t->kernels) * widest * sizeof(float)), widest};
    if (cv.scratch == NULL) fail("out of memory");
    Progress progress = {0, 0, now_seconds(), 0, isatty(STDERR_FILENO), -1};
    for (int i = 0; i < n; i++) progress.total += pieces[i].in_bytes;

    put(f, &h, sizeof h);
    put(f, t->tokenizer_data, t->tokenizer_bytes);
    for (int i = 0; i < n; i++) {
        put_padding(f);
        if (pieces[i].matrix) {
            quantize_matrix(&cv, &pieces[i], &progress);
        } else {
            put(f, pieces[i].vector, (size_t)pieces[i].n * sizeof(float));
            progress_add(&progress, pieces[i].in_bytes, pieces[i].name);
        }
    }
    put_padding(f);
    if (fflush(f) != 0) fail("%s: write failed: %s", out_name, strerror(errno));
    if ((uint64_t)ftello(f) != h.weights_offset + h.weights_bytes)
        fail("%s: wrote %llu bytes, expected %llu", out_name, (unsigned long long)ftello(f),
             (unsigned long long)(h.weights_offset + h.weights_bytes));
    if (progress.total > PROGRESS_MIN_BYTES && progress.tty) fputc('\n', stderr);
    progress_open = 0;
    free(cv.scratch);
    free(pieces);
}

/* Removes what a run writing the same name left when it was killed outright (SIGKILL, a power
 * cut: no handler ran): .NAME.PID.tmp files in dir whose process no longer exists, as export.py
 * does for its own. A file of a running process is left alone. */
static void remove_stale_temporaries(const char* dir, const char* name) {
    DIR* d = opendir(dir);
    if (d == NULL) return;
    const size_t n = strlen(name);
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        const char* f = e->d_name;
        const size_t len = strlen(f);
        if (len < n + 7 || f[0] != '.' || strncmp(f + 1, name, n) != 0 || f[n + 1] != '.' ||
            strcmp(f + len - 4, ".tmp") != 0)
            continue;
        char* end;
        const long pid = strtol(f + n + 2, &end, 10);
        if (end != f + len - 4 || end == f + n + 2 || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* running, or not ours to ask */
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir, f) < (int)sizeof path && unlink(path) == 0)
            fprintf(stderr, "run: note: removed %s, left by a run that was killed\n", path);
    }
    closedir(d);
}

/* ---- --stream: a matrix's rows in, its row blocks out ----
 * export.py's way to quantise without writing a lossless temporary checkpoint first (Qwen3-30B-A3B's
 * is 61 GB): it writes the checkpoint itself and sends each matrix here in runs of rows. Standard
 * input is a series of frames: six little-endian uint32 (the rows' type, 0 f32, 1 bf16 or 2 IEEE
 * half, widened to f32 here first; rows;
 * columns; the run's first row in its tensor; the length of the tensor's name; 0), the name, then
 * the rows; a frame of 0 rows, or the end of the input, ends the stream. For each frame standard
 * output gets the run's row blocks, the last padded with zero rows: the bytes the checkpoint holds
 * for those rows. A run starts at a whole row block, so the runs of a tensor make its bytes. A
 * NaN, an infinity or a weight too large ends the program with the usual line naming the tensor
 * and the row. */
enum { FRAME_TYPE, FRAME_ROWS, FRAME_COLS, FRAME_FIRST_ROW, FRAME_NAME_BYTES, FRAME_ZERO, FRAME_FIELDS };

/* n bytes of standard input into buf: 1, or 0 at the end of the input before any of them. */
static int read_input(void* buf, size_t n, int may_end) {
    const size_t got = fread(buf, 1, n, stdin);
    if (got == 0 && may_end && feof(stdin)) return 0;
    if (got != n) fail("--stream: standard input ended inside a frame (%zu of %zu bytes)", got, n);
    return 1;
}

static void quantize_stream(const QuantizeOptions* o) {
    const WeightType type = streq(o->dtype, "q8") ? WEIGHT_Q8 : WEIGHT_Q4;
    const int gs = type == WEIGHT_Q4 ? Q4_GROUP : o->group_size ? o->group_size : 64;
    const OpsSpec spec = {.threads = o->threads, .max_batch = 1, .max_cols = gs, .max_pos = 1, .n_heads = 1,
                          .n_kv_heads = 1, .head_dim = gs, .weight_type = WEIGHT_F32, .weight_cols = gs};
    Ops* k = ops_new(&spec); /* for its threads */
    if (k == NULL) fail("out of memory");
    void* rows = NULL;
    float* wide = NULL; /* half rows as f32 */
    size_t rows_cap = 0, wide_cap = 0;
    Conversion cv = {k, stdout, type, gs, NULL, 0};
    Progress none = {0}; /* export.py shows the progress */
    uint32_t f[FRAME_FIELDS];
    while (read_input(f, sizeof f, 1) && f[FRAME_ROWS] > 0) {
        Piece p = {.first_row = (int)f[FRAME_FIRST_ROW]};
        if (f[FRAME_TYPE] > 2 || f[FRAME_COLS] == 0 || f[FRAME_COLS] > (1u << 24) || f[FRAME_ROWS] > (1u << 24) ||
            f[FRAME_NAME_BYTES] >= sizeof p.name || f[FRAME_FIRST_ROW] > INT32_MAX - f[FRAME_ROWS] || f[FRAME_ZERO] != 0)
            fail("--stream: a frame that is not one (type %u, %u rows, %u columns, name of %u bytes)", f[FRAME_TYPE],
                 f[FRAME_ROWS], f[FRAME_COLS], f[FRAME_NAME_BYTES]);
        read_input(p.name, f[FRAME_NAME_BYTES], 0);
        if (f[FRAME_COLS] % (uint32_t)gs != 0)
            fail("tensor %s: its %u columns are not a multiple of the group size %d", p.name, f[FRAME_COLS], gs);
        Matrix in = {f[FRAME_TYPE] == 1 ? WEIGHT_BF16 : WEIGHT_F32, (int)f[FRAME_ROWS], (int)f[FRAME_COLS], 0, NULL};
        const size_t n = (size_t)in.rows * (size_t)in.cols, bytes = n * (f[FRAME_TYPE] ? 2 : 4);
        if (bytes > rows_cap) { /* the largest run so far: a few MB, export.py's blocks */
            free(rows);
            rows = malloc(rows_cap = bytes);
        }
        if ((size_t)in.cols > cv.row_floats) {
            free(cv.scratch);
            cv.row_floats = (size_t)in.cols;
            cv.scratch = malloc((size_t)k->threads(k) * cv.row_floats * sizeof(float));
        }
        if (f[FRAME_TYPE] == 2 && n > wide_cap) {
            free(wide);
            wide = malloc((wide_cap = n) * sizeof(float));
        }
        if (rows == NULL || cv.scratch == NULL || (f[FRAME_TYPE] == 2 && wide == NULL)) fail("out of memory");
        read_input(rows, bytes, 0);
        in.data = rows;
        if (f[FRAME_TYPE] == 2) { /* exact: every half is a float */
            for (size_t i = 0; i < n; i++) wide[i] = half_to_float(((const uint16_t*)rows)[i]);
            in.data = wide;
        }
        p.matrix = &in;
        p.in_bytes = bytes;
        quantize_matrix(&cv, &p, &none);
        if (fflush(stdout) != 0) fail("standard output: write failed: %s", strerror(errno));
    }
    free(rows);
    free(wide);
    free(cv.scratch);
    ops_free(k);
}

int quantize_main(int argc, char** argv) {
    QuantizeOptions o;
    parse_options(argc, argv, &o);
    if (o.threads > 0) o.threads = threads_held(o.threads);
    if (o.stream) {
        quantize_stream(&o);
        return 0;
    }
    char output[PATH_MAX];
    output_target(o.input, o.output, output, sizeof output);
    const double t0 = now_seconds();
    const TransformerOptions topt = {.threads = o.threads, .ctx = 1, .prefill_only = 1, .lazy_pages = 1};
    Transformer t;
    char err[512];
    if (transformer_load(&t, o.input, &topt, err, sizeof err) != 0) fail("%s", err);
    if (t.config.weight_type == WEIGHT_Q8 || t.config.weight_type == WEIGHT_Q4)
        fail("%s: is already %s; quantise from an f32 or bf16 checkpoint (export.py --dtype f32 or bf16)",
             o.input, t.config.weight_type == WEIGHT_Q8 ? "q8" : "q4");
    const WeightType type = streq(o.dtype, "q8") ? WEIGHT_Q8 : WEIGHT_Q4;
    const int gs = choose_group_size(&t.config, type, o.group_size, o.input);
    if (o.group_size && gs != o.group_size) /* as export.py says it */
        fprintf(stderr, "run: note: q8 groups of %d: --group-size %d does not divide every input width\n", gs,
                o.group_size);
    if (type == WEIGHT_Q8 && gs % 32) {
        const int plain = choose_group_size(&t.config, type, 0, o.input);
        fprintf(stderr, "run: note: q8 groups of %d: the SIMD products take groups of a multiple of 32, so this "
                "file's run on the scalar reference, tens of times slower", gs);
        if (o.group_size && plain % 32 == 0) fprintf(stderr, "; without --group-size they are %d", plain);
        fputc('\n', stderr);
    }

    /* Written as .NAME.PID.tmp in the output's folder (export.py's temporary name, which its
     * clean-up of files left by killed runs knows), then synced and renamed over NAME. */
    const char* slash = strrchr(output, '/');
    char dir[PATH_MAX]; /* also synced after the rename */
    if (slash) snprintf(dir, sizeof dir, "%.*s", slash == output ? 1 : (int)(slash - output), output);
    else snprintf(dir, sizeof dir, ".");
    if (snprintf(tmp_path, sizeof tmp_path, "%s/.%s.%ld.tmp", dir, slash ? slash + 1 : output, (long)getpid()) >=
        (int)sizeof tmp_path)
        fail("%s: path too long", o.output);
    out_name = o.output;
    remove_stale_temporaries(dir, slash ? slash + 1 : output);
    catch_signals();
    FILE* f = fopen(tmp_path, "we"); /* e: O_CLOEXEC */
    if (f == NULL) fail("%s: cannot create a file in %s: %s", o.output, dir, strerror(errno));
    tmp_exists = 1;
    write_checkpoint(f, &t, type, gs);
    if (fsync(fileno(f)) != 0) fail("%s: cannot sync to disk: %s", out_name, strerror(errno));
    /* Dropped from the page cache as export.py does: the engine maps weights in 2 MB pages only
     * from a cache it fills itself (checkpoint.c, map_file), and leaves small pages as they are. */
    posix_fadvise(fileno(f), 0, 0, POSIX_FADV_DONTNEED);
    if (fclose(f) != 0) fail("%s: write failed: %s", out_name, strerror(errno));
    if (rename(tmp_path, output) != 0) fail("%s: cannot rename %s to it: %s", output, tmp_path, strerror(errno));
    tmp_exists = 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the rename itself on disk too */
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    struct stat st;
    const double size_mb = stat(output, &st) == 0 ? (double)st.st_size / 1e6 : 0;
    const int threads = t.kernels->threads(t.kernels);
    fprintf(stderr, "run: wrote %s (%.1f MB, %s, group size %d) in %.1fs on %d thread%s\n", o.output, size_mb,
            o.dtype, gs, now_seconds() - t0, threads, threads == 1 ? "" : "s");
    transformer_free(&t);
    return 0;
}
