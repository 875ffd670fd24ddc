/* test_tokenizer_unit.c: unit tests of tokenizer.c that need nothing outside the repository (a tiny
 * tokenizer section is built here), plus tool modes used by tests/test_tokenizer.py and for
 * benchmarks:
 *
 *   tests/test_tokenizer_unit                      run the unit tests (exit 0 = all passed)
 *   tests/test_tokenizer_unit --encode FILE        FILE: a checkpoint (QW3C) or a bare tokenizer
 *       section (QTOK). Reads records "u32 length (little-endian), bytes" from stdin until EOF and
 *       prints, per record, one line: its ids separated by spaces, then a tab, then 1 or 0: whether
 *       decode(encode(text)) == NFC(text) byte for byte.
 *   tests/test_tokenizer_unit --nfc                 reads the same records from stdin and writes,
 *       per record, "u32 length, bytes" of its NFC (tokenizer_nfc) to stdout.
 *   tests/test_tokenizer_unit --pieces               reads the same records and writes, per record,
 *       "u32 length, bytes" of its NFC, then "u32 count" and count u32s: the lengths in code points
 *       of the pre-tokenizer's pieces of that NFC text (what tokenizer_encode splits it into).
 *   tests/test_tokenizer_unit --unicode-props        writes two bytes per code point 0..0x10FFFF: its
 *       UT_* bits (ut_props) and its canonical combining class (ut_ccc).
 *   tests/test_tokenizer_unit --bench FILE TEXT [REPS]   encode throughput of the file TEXT (MB/s)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_tables.h"

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        checks++;                                                 \
        if (!(cond)) {                                            \
            failures++;                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                         \
            fputc('\n', stderr);                                  \
        }                                                         \
    } while (0)

/* ---------------------------------------------------------------------------------------------- */
/* Tool modes                                                                                      */
/* ---------------------------------------------------------------------------------------------- */

static uint8_t* read_file(const char* path, size_t* n) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 20, len = 0;
    uint8_t* p = malloc(cap);
    for (;;) {
        if (len == cap) p = realloc(p, cap *= 2);
        size_t r = fread(p + len, 1, cap - len, f);
        if (r == 0) break;
        len += r;
    }
    fclose(f);
    *n = len;
    return p;
}

/* Loads the tokenizer from a checkpoint or a bare section; exits on error. */
static Tokenizer* load_tokenizer(const char* path, uint8_t** keep) {
    size_t n;
    uint8_t* data = read_file(path, &n);
    if (!data) {
        fprintf(stderr, "%s: cannot read\n", path);
        exit(2);
    }
    const uint8_t* sec = data;
    size_t sec_n = n;
    if (n >= sizeof(FileHeader) && memcmp(data, CHECKPOINT_MAGIC, 4) == 0) {
        FileHeader h;
        memcpy(&h, data, sizeof h);
        if (h.tokenizer_offset > n || h.tokenizer_bytes > n - h.tokenizer_offset) {
            fprintf(stderr, "%s: tokenizer section outside the file\n", path);
            exit(2);
        }
        sec = data + h.tokenizer_offset;
        sec_n = (size_t)h.tokenizer_bytes;
    }
    char err[256];
    Tokenizer* t = tokenizer_new(sec, sec_n, err, sizeof err);
    if (!t) {
        fprintf(stderr, "%s: %s\n", path, err);
        exit(2);
    }
    *keep = data;
    return t;
}

/* One length-prefixed record from stdin (u32 little-endian length, then the bytes). NULL at the
 * end of input (*status 0) or on a truncated record (*status 2, after a message). */
static char* read_record(size_t* len, int* status) {
    uint8_t hdr[4];
    *status = 0;
    if (fread(hdr, 1, 4, stdin) != 4) return NULL;
    *len = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 | (size_t)hdr[3] << 24;
    char* text = malloc(*len + 1);
    if (text == NULL || fread(text, 1, *len, stdin) != *len) {
        fprintf(stderr, "truncated input\n");
        free(text);
        *status = 2;
        return NULL;
    }
    return text;
}

static int mode_encode(const char* path) {
    uint8_t* data;
    Tokenizer* t = load_tokenizer(path, &data);
    for (;;) {
        size_t len;
        int status;
        char* text = read_record(&len, &status);
        if (text == NULL) {
            if (status != 0) return status;
            break;
        }
        int n;
        int* ids = tokenizer_encode(t, text, len, &n);
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        size_t dn, nn;
        char* dec = tokenizer_decode(t, ids, n, 0, &dn);
        char* norm = tokenizer_nfc(text, len, &nn);
        printf("\t%d\n", dn == nn && memcmp(dec, norm, dn) == 0);
        free(dec);
        free(norm);
        free(ids);
        free(text);
    }
    tokenizer_free(t);
    free(data);
    return 0;
}

static int mode_nfc(void) {
    for (;;) {
        size_t len;
        int status;
        char* text = read_record(&len, &status);
        if (text == NULL) {
            if (status != 0) return status;
            break;
        }
        size_t n;
        char* out = tokenizer_nfc(text, len, &n);
        uint8_t h[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
        fwrite(h, 1, 4, stdout);
        fwrite(out, 1, n, stdout);
        free(out);
        free(text);
    }
    return 0;
}

static void put_u32(uint32_t v) {
    uint8_t h[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    fwrite(h, 1, 4, stdout);
}

static int mode_pieces(void) {
    for (;;) {
        size_t len;
        int status;
        char* text = read_record(&len, &status);
        if (text == NULL) return status;
        size_t n;
        char* norm = tokenizer_nfc(text, len, &n);
        put_u32((uint32_t)n);
        fwrite(norm, 1, n, stdout);
        size_t count = 0;
        for (size_t i = 0; i < n; i += tokenizer_next_piece(norm, n, i)) count++;
        put_u32((uint32_t)count);
        for (size_t i = 0; i < n;) {
            size_t end = i + tokenizer_next_piece(norm, n, i);
            uint32_t cps = 0;
            for (; i < end; i++) cps += ((uint8_t)norm[i] & 0xC0) != 0x80;
            put_u32(cps);
        }
        free(norm);
        free(text);
    }
}

static int mode_unicode_props(void) {
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        uint8_t b[2] = {(uint8_t)ut_props(cp), (uint8_t)ut_ccc(cp)};
        fwrite(b, 1, 2, stdout);
    }
    return 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int mode_bench(const char* path, const char* text_path, int reps) {
    uint8_t* data;
    Tokenizer* t = load_tokenizer(path, &data);
    size_t len;
    uint8_t* text = read_file(text_path, &len);
    if (!text) {
        fprintf(stderr, "%s: cannot read\n", text_path);
        return 2;
    }
    double best = 1e30;
    int n = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        int* ids = tokenizer_encode(t, (const char*)text, len, &n);
        double dt = now() - t0;
        free(ids);
        if (dt < best) best = dt;
    }
    printf("%s: %zu bytes -> %d tokens, best of %d: %.3f s, %.1f MB/s\n", text_path, len, n, reps, best,
           (double)len / best / 1e6);
    free(text);
    tokenizer_free(t);
    free(data);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* A tiny tokenizer section                                                                        */
/* ---------------------------------------------------------------------------------------------- */

typedef struct {
    uint8_t* p;
    size_t n, cap;
} Buf;

static void put(Buf* b, const void* s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void put32(Buf* b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}
static void put_str(Buf* b, const char* s) {
    put32(b, (uint32_t)strlen(s));
    put(b, s, strlen(s));
}

/* Vocabulary: ids 0..255 = the single bytes (in byte order), then the merges below. */
static const char* MERGES[][2] = {
    {"h", "e"},   /* 256 he */
    {"l", "l"},   /* 257 ll */
    {"he", "ll"}, /* 258 hell */
    {"hell", "o"},/* 259 hello */
    {" ", "w"},   /* 260 " w" */
    {"o", "r"},   /* 261 or */
    {" w", "or"}, /* 262 " wor" */
    {"l", "d"},   /* 263 ld */
    {" wor", "ld"}, /* 264 " world" */
    {"e", "l"},   /* 265 el */
    {"ll", "o"},  /* 266 llo */
    {"o", "l"},   /* 267 ol */
    {"ll", "ll"}, /* 268 llll */
    {"h", "h"},   /* 269 hh */
    {"1", "2"},   /* 270 12 */
    {"12", "3"},  /* 271 123 */
    {"y", "z"},   /* 272 yz */
    {"x", "y"},   /* 273 xy */
    {"xy", "z"},  /* 274 xyz: plain BPE never makes it from "xyz" (yz ranks first) */
};
#define N_MERGES (int)(sizeof MERGES / sizeof MERGES[0])
#define N_VOCAB (256 + N_MERGES)
static char vocab_str[N_VOCAB][16];

static const struct {
    int id, special;
    const char* s;
} ADDED[] = {
    {300, 1, "<|im_start|>"}, {301, 0, "<think>"}, {302, 1, "<|im_end|>"}, {303, 0, "<|im"},
};
#define N_ADDED (int)(sizeof ADDED / sizeof ADDED[0])

static int vocab_id(const char* s) {
    for (int i = 0; i < N_VOCAB; i++)
        if (strlen(vocab_str[i]) == strlen(s) && strcmp(vocab_str[i], s) == 0 && (s[0] || i == 0)) return i;
    return -1;
}

static Buf tiny_section(const char* regex, uint32_t flags) {
    for (int b = 0; b < 256; b++) {
        vocab_str[b][0] = (char)b;
        vocab_str[b][1] = 0;
    }
    for (int k = 0; k < N_MERGES; k++) snprintf(vocab_str[256 + k], 16, "%s%s", MERGES[k][0], MERGES[k][1]);
    Buf b = {0};
    put(&b, "QTOK", 4);
    put32(&b, N_VOCAB);
    put32(&b, N_MERGES);
    put32(&b, N_ADDED);
    put32(&b, flags);
    put_str(&b, regex);
    for (int i = 0; i < N_VOCAB; i++) {
        uint32_t len = i < 256 ? 1 : (uint32_t)strlen(vocab_str[i]);
        put32(&b, len);
        put(&b, vocab_str[i], len);
    }
    for (int k = 0; k < N_MERGES; k++) {
        put32(&b, (uint32_t)vocab_id(MERGES[k][0]));
        put32(&b, (uint32_t)vocab_id(MERGES[k][1]));
        put32(&b, (uint32_t)(256 + k));
    }
    for (int k = 0; k < N_ADDED; k++) {
        put32(&b, (uint32_t)ADDED[k].id);
        put32(&b, (uint32_t)ADDED[k].special);
        put_str(&b, ADDED[k].s);
    }
    put_str(&b, "{{ messages }}");
    return b;
}

static const char QWEN_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Reference BPE: the textbook O(n^3) procedure on strings of ids. */
static int merge_left[N_MERGES], merge_right[N_MERGES];
static int naive_bpe(const uint8_t* s, int n, int* out) {
    int m = n;
    for (int k = 0; k < N_MERGES; k++) {
        merge_left[k] = vocab_id(MERGES[k][0]);
        merge_right[k] = vocab_id(MERGES[k][1]);
    }
    for (int i = 0; i < n; i++) out[i] = s[i];
    for (;;) {
        int best = -1, best_rank = 1 << 30;
        for (int i = 0; i + 1 < m; i++)
            for (int k = 0; k < N_MERGES && k < best_rank; k++)
                if (merge_left[k] == out[i] && merge_right[k] == out[i + 1]) {
                    best = i;
                    best_rank = k;
                    break;
                }
        if (best < 0) return m;
        out[best] = 256 + best_rank;
        memmove(out + best + 1, out + best + 2, (size_t)(m - best - 2) * sizeof(int));
        m--;
    }
}

static int ids_equal(const int* a, int na, const int* b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof(int)) == 0);
}

static void check_encode(Tokenizer* t, const char* text, size_t len, const int* want, int n_want) {
    int n;
    int* ids = tokenizer_encode(t, text, len, &n);
    int ok = ids && ids_equal(ids, n, want, n_want);
    CHECK(ok, "encode(\"%.*s\") gave %d ids", (int)len, text, n);
    if (!ok && ids) {
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fputc('\n', stderr);
    }
    free(ids);
}
#define ENC(t, text, ...)                                                       \
    do {                                                                        \
        const int want_[] = {__VA_ARGS__};                                      \
        check_encode(t, text, sizeof(text) - 1, want_, (int)(sizeof want_ / sizeof(int))); \
    } while (0)

/* The pieces of the pre-tokenizer, joined by '|'. */
static void pieces(const char* s, size_t n, char* out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t l = tokenizer_next_piece(s, n, i);
        if (l == 0 || l > n - i) {
            snprintf(out, cap, "BAD PIECE LENGTH %zu at %zu", l, i);
            return;
        }
        if (i && o + 1 < cap) out[o++] = '|';
        for (size_t k = 0; k < l && o + 1 < cap; k++) out[o++] = s[i + k];
        i += l;
    }
    out[o] = 0;
}

static void check_pieces(const char* s, size_t n, const char* want) {
    char got[1024];
    pieces(s, n, got, sizeof got);
    CHECK(strcmp(got, want) == 0, "pieces of \"%s\": got \"%s\", want \"%s\"", s, got, want);
}
#define PIECES(s, want) check_pieces(s, sizeof(s) - 1, want)

static void test_pretokenizer(void) {
    /* 1. contractions (ASCII apostrophe, case-insensitive) */
    PIECES("it's", "it|'s");
    PIECES("I'M SURE", "I|'M| SURE");
    PIECES("we'll they've you're he'd", "we|'ll| they|'ve| you|'re| he|'d");
    PIECES("'LL'Re't", "'LL|'Re|'t");
    PIECES("it\xe2\x80\x99s", "it|\xe2\x80\x99s"); /* U+2019 is not an apostrophe for rule 1 */
    PIECES("'x", "'x");                            /* rule 2: punctuation + letters */
    PIECES("''s", "''|s");                          /* rule 4 takes the apostrophes */
    /* 2. optional non-letter/number/newline + letters */
    PIECES("Hello world", "Hello| world");
    PIECES("\tprintf(void", "\tprintf|(void");
    PIECES("$hello", "$hello");
    PIECES("\nabc", "\n|abc");          /* a newline cannot lead a word */
    PIECES("\xe4\xb8\xad\xe6\x96\x87", "\xe4\xb8\xad\xe6\x96\x87"); /* CJK letters */
    PIECES("\xe3\x80\x80x", "\xe3\x80\x80x");   /* U+3000 (white space) leads a word */
    PIECES("e\xcc\x81", "e|\xcc\x81");           /* combining mark is not a letter */
    /* 3. numbers: one character each */
    PIECES("2024", "2|0|2|4");
    PIECES("x1\xe2\x85\xab\xc2\xbd", "x|1|\xe2\x85\xab|\xc2\xbd"); /* Roman numeral XII, one half */
    /* 4. optional space + symbols + newlines */
    PIECES("a):\n", "a|):\n");
    PIECES("a {\n\n", "a| {\n\n");
    PIECES(" ((()))", " ((()))");
    PIECES("x \xef\xbb\xbfy", "x| \xef\xbb\xbf|y"); /* U+FEFF is not white space */
    PIECES("x \xe2\x80\x8by", "x| \xe2\x80\x8b|y"); /* nor U+200B */
    /* 5. white space ending in newlines */
    PIECES("a    \nb", "a|    \n|b");
    PIECES("a  \n\n\n  b", "a|  \n\n\n| | b");
    PIECES("\r\n\r\n", "\r\n\r\n");
    PIECES("a \n \n b", "a| \n \n| b");
    /* 6. white space not followed by non-space */
    PIECES("a   b", "a|  | b");
    PIECES("a   ", "a|   ");
    PIECES("   ", "   ");
    PIECES("a\xc2\x85 b", "a|\xc2\x85| b"); /* U+0085 is white space */
    /* 7. single white space before a digit / symbol it cannot join */
    PIECES("a 2", "a| |2");
    PIECES("a\t(", "a|\t|(");
    PIECES("a \t2", "a| |\t|2");
    /* invalid UTF-8 bytes are "other" characters; NUL too */
    PIECES("a\xff\xfe b", "a|\xff\xfe| b");
    PIECES("\xc3(", "\xc3(");
    {
        char got[64];
        const char s[] = "a\0b c";
        pieces(s, 5, got, sizeof got);
        CHECK(memcmp(got, "a|\0b| c", 7) == 0, "NUL piece"); /* NUL is a control character */
    }
}

static void check_nfc(const char* in, const char* want) {
    size_t n;
    char* out = tokenizer_nfc(in, strlen(in), &n);
    CHECK(out && n == strlen(want) && memcmp(out, want, n) == 0, "NFC of \"%s\" gave \"%s\"", in, out ? out : "(null)");
    free(out);
}

static void test_nfc(void) {
    check_nfc("plain ASCII", "plain ASCII");
    check_nfc("A\xcc\x8a", "\xc3\x85");              /* A + ring -> U+00C5 */
    check_nfc("\xe2\x84\xab", "\xc3\x85");           /* U+212B ANGSTROM SIGN -> U+00C5 */
    check_nfc("\xe2\x84\xa6", "\xce\xa9");           /* U+2126 OHM -> U+03A9 */
    check_nfc("\xef\xa4\x80", "\xe8\xb1\x88");       /* U+F900 -> U+8C48 */
    check_nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"); /* jamo G A G -> U+AC01 */
    check_nfc("\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81");             /* LV syllable + T */
    check_nfc("a\xcc\x81\xcc\xa7", "\xc3\xa1\xcc\xa7"); /* a acute cedilla: reordered, a+acute composed */
    check_nfc("e\xcc\xa7\xcc\x81", "\xc8\xa9\xcc\x81"); /* e cedilla acute -> U+0229 + acute */
    check_nfc("\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc"); /* U+0958 is excluded from composition */
    check_nfc("\xcd\x84", "\xcc\x88\xcc\x81");          /* U+0344 -> diaeresis + acute */
    check_nfc("\xc3\xa9t\xc3\xa9", "\xc3\xa9t\xc3\xa9");  /* already NFC */
    check_nfc("\xff" "e\xcc\x81" "\xfe", "\xff\xc3\xa9\xfe"); /* invalid bytes kept */
    check_nfc("\xcc\x81" "a", "\xcc\x81" "a");          /* leading combining mark stays */
    check_nfc("x\xe1\xbe\x82y", "x\xe1\xbe\x82y");       /* U+1F82 stays (4-char decomposition) */
    check_nfc("\xce\xb1\xcc\x93\xcc\x80\xcd\x85", "\xe1\xbe\x82"); /* and composes from its parts */
}

static char* print_to_string_on(Tokenizer* t, const int* ids, int n, int show_special, int flush, int terminal,
                                size_t* len) {
    FILE* f = tmpfile();
    Utf8Stream st = {{0}, 0, terminal};
    for (int i = 0; i < n; i++) tokenizer_print(t, &st, ids[i], show_special, f);
    if (flush) utf8_stream_flush(&st, f);
    long size = ftell(f);
    rewind(f);
    char* out = calloc((size_t)size + 1, 1);
    size_t r = fread(out, 1, (size_t)size, f);
    fclose(f);
    *len = r;
    return out;
}

static char* print_to_string(Tokenizer* t, const int* ids, int n, int show_special, int flush, size_t* len) {
    return print_to_string_on(t, ids, n, show_special, flush, 0, len);
}

static uint32_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static const char LLAMA3_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Llama 3's tokenizer (its Split regex, byte-identical, selects it): numbers in pieces of up to
 * three digits, and a piece that is a vocabulary token taken whole ("ignore_merges"). With the
 * Qwen2 regex the same section splits every digit and runs plain BPE. */
static void test_llama3(void) {
    char err[200];
    Buf qs = tiny_section(QWEN_REGEX, TOK_FLAG_QWEN2_REGEX | TOK_FLAG_BYTE_LEVEL);
    Buf ls = tiny_section(LLAMA3_REGEX, TOK_FLAG_BYTE_LEVEL);
    Tokenizer* q = tokenizer_new(qs.p, qs.n, err, sizeof err);
    CHECK(q != NULL, "tokenizer_new (Qwen2 regex): %s", err);
    Tokenizer* l = tokenizer_new(ls.p, ls.n, err, sizeof err);
    CHECK(l != NULL, "tokenizer_new (Llama 3 regex): %s", err);
    if (q && l) {
        ENC(q, "12345", '1', '2', '3', '4', '5');
        ENC(l, "12345", 271, '4', '5');
        ENC(l, "1212", 270, '1', '2'); /* pieces "121" (BPE: 12 1) and "2" */
        ENC(q, "xyz", 'x', 272);
        ENC(l, "xyz", 274);
        ENC(l, "xyzz", 'x', 272, 'z'); /* not a token: plain BPE */
        ENC(l, "hello world 123", 259, 264, ' ', 271);
    }
    tokenizer_free(q);
    tokenizer_free(l);
    free(qs.p);
    free(ls.p);
}

static void test_tiny(void) {
    Buf sec = tiny_section(QWEN_REGEX, TOK_FLAG_NFC | TOK_FLAG_QWEN2_REGEX | TOK_FLAG_BYTE_LEVEL);
    char err[200];
    Tokenizer* t = tokenizer_new(sec.p, sec.n, err, sizeof err);
    CHECK(t != NULL, "tokenizer_new: %s", err);
    if (!t) return;
    CHECK(tokenizer_size(t) == 304, "size %d", tokenizer_size(t));
    /* BPE */
    ENC(t, "hello", 259);
    ENC(t, "hello world", 259, 264);
    ENC(t, "lll", 257, 'l');                 /* leftmost among equal ranks */
    ENC(t, "llll", 268);                     /* ll ll -> llll */
    ENC(t, "lllll", 268, 'l');
    ENC(t, "hhh", 269, 'h');
    ENC(t, "hellollo", 259, 266);
    check_encode(t, "", 0, NULL, 0);
    /* added tokens: leftmost-longest, special or not, no stripping of spaces around them */
    ENC(t, "<|im_start|>hello<think>", 300, 259, 301);
    ENC(t, "<|im_end|><|im_end|>", 302, 302);
    ENC(t, "<|im_sta", 303, '_', 's', 't', 'a');
    ENC(t, "<<think> <think>", '<', 301, ' ', 301);
    ENC(t, "hello <|im_start|>", 259, ' ', 300);
    ENC(t, "<|im_start|", 303, '_', 's', 't', 'a', 'r', 't', '|');
    /* NFC before BPE; the added token is matched on the raw text */
    ENC(t, "A\xcc\x8a", 0xC3, 0x85);
    /* lookups */
    CHECK(tokenizer_find(t, "hello") == 259, "find hello");
    CHECK(tokenizer_find(t, "<think>") == 301, "find <think>");
    CHECK(tokenizer_find(t, "nope") == -1, "find nope");
    CHECK(tokenizer_is_special(t, 300) && !tokenizer_is_special(t, 301) && !tokenizer_is_special(t, 259) &&
              !tokenizer_is_special(t, -5) && !tokenizer_is_special(t, 1 << 30),
          "is_special");
    size_t len;
    CHECK(tokenizer_token(t, 280, &len) == NULL && len == 0, "unknown id has no bytes");
    CHECK(tokenizer_token(t, 1 << 30, &len) == NULL, "huge id");
    CHECK(tokenizer_token(t, -1, &len) == NULL, "negative id");
    const char* tok = tokenizer_token(t, 264, &len);
    CHECK(tok && len == 6 && memcmp(tok, " world", 6) == 0, "token 264");

    /* streaming printer */
    {
        int ids[] = {0xE4, 0xB8, 0xAD, 'a', 300, 301, 280, -1, 0xFF, 'b', 0xE4, 'c', 0xF0, 0x9F};
        char* out = print_to_string(t, ids, 3, 0, 0, &len);
        CHECK(len == 3 && memcmp(out, "\xe4\xb8\xad", 3) == 0, "streamed CJK char");
        free(out);
        out = print_to_string(t, ids, 2, 0, 0, &len);
        CHECK(len == 0, "partial character held back (%zu bytes out)", len);
        free(out);
        out = print_to_string(t, ids, 2, 0, 1, &len);
        CHECK(len == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0, "flush writes U+FFFD");
        free(out);
        out = print_to_string(t, ids, 14, 0, 1, &len);
        const char want[] = "\xe4\xb8\xad" "a<think>\xef\xbf\xbd" "b\xef\xbf\xbd" "c\xef\xbf\xbd";
        CHECK(len == sizeof want - 1 && memcmp(out, want, len) == 0, "stream: %s", out);
        free(out);
        out = print_to_string(t, ids, 14, 1, 1, &len);
        const char want2[] = "\xe4\xb8\xad" "a<|im_start|><think>\xef\xbf\xbd" "b\xef\xbf\xbd" "c\xef\xbf\xbd";
        CHECK(len == sizeof want2 - 1 && memcmp(out, want2, len) == 0, "stream with specials: %s", out);
        free(out);
        /* on a terminal the control bytes but tab and newline are left out (ESC, BEL, CR, DEL) */
        int ctl[] = {0x1B, '[', '2', 'J', 0x07, 'a', '\t', 'b', '\r', '\n', 0x7F, 'c', 0, 0xC2, 0x9B, 0xC2, 0xA0};
        out = print_to_string_on(t, ctl, 17, 0, 1, 1, &len);
        CHECK(len == 10 && memcmp(out, "[2Ja\tb\nc\xc2\xa0", 10) == 0, "terminal: control characters left out: %s",
              out);
        free(out);
        out = print_to_string(t, ctl, 17, 0, 1, &len);
        CHECK(len == 17 && out[0] == 0x1B && out[4] == 0x07, "not a terminal: every byte (%zu)", len);
        free(out);
        /* surrogates and overlong forms are invalid: one U+FFFD per maximal subpart */
        int bad[] = {0xED, 0xA0, 0x80, 0xC0, 0xAF, 0xE0, 0x80, 'x', 0xF4, 0x90};
        out = print_to_string(t, bad, 10, 0, 1, &len);
        const char want3[] = "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx"
                             "\xef\xbf\xbd\xef\xbf\xbd";
        CHECK(len == sizeof want3 - 1 && memcmp(out, want3, len) == 0, "invalid sequences");
        size_t dl;
        char* dec = tokenizer_decode(t, bad, 10, 0, &dl);
        CHECK(dec && dl == len && memcmp(dec, out, len) == 0, "decode == stream");
        free(dec);
        free(out);
        int sp[] = {300, 259, 301, 302, 280};
        dec = tokenizer_decode(t, sp, 5, 1, &dl);
        CHECK(dec && strcmp(dec, "hello<think>") == 0, "decode skip special: %s", dec);
        free(dec);
    }

    /* BPE against the naive procedure: short (array), long (heap) and very long (bucket) pieces */
    {
        const char alpha[] = "helo";
        static uint8_t s[1600];
        static int want[1600];
        for (int iter = 0; iter < 3020; iter++) {
            int n = iter < 3000 ? 1 + (int)(rnd() % (iter < 2000 ? 60 : 400)) : 1024 + (int)(rnd() % 500);
            for (int i = 0; i < n; i++) s[i] = (uint8_t)alpha[rnd() % 4];
            int nw = naive_bpe(s, n, want);
            int ng;
            int* got = tokenizer_encode(t, (const char*)s, (size_t)n, &ng);
            int ok = got && ids_equal(got, ng, want, nw);
            CHECK(ok, "BPE of %.*s", n, (const char*)s);
            free(got);
            if (!ok) break;
        }
    }

    /* round trip and robustness on random bytes, NULs, combining marks, added-token fragments */
    {
        static const char* frags[] = {"<|im_start|>", "<think>", "<|im", "\xcc\x81", "\xe1\x85\xa1", "\xea\xb0\x80",
                                      "\xe2\x84\xab", " ", "\n", "\r\n", "\xc2\x85", "'s", "7", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                                      "\xef\xbb\xbf", "\xff", "\xc3", "\0", "he", "ll", "o", "\xe1\x86\xa8"};
        char s[600];
        for (int iter = 0; iter < 4000; iter++) {
            size_t n = 0;
            int k = (int)(rnd() % 40);
            for (int j = 0; j < k; j++) {
                if (rnd() % 3 == 0) {
                    s[n++] = (char)(rnd() & 0xff);
                } else {
                    const char* f = frags[rnd() % (sizeof frags / sizeof frags[0])];
                    size_t fl = f[0] ? strlen(f) : 1;
                    memcpy(s + n, f, fl);
                    n += fl;
                }
            }
            int ni;
            int* ids = tokenizer_encode(t, s, n, &ni);
            CHECK(ids != NULL, "encode returned NULL");
            /* the raw bytes of the tokens (tokenizer_decode would turn invalid UTF-8 into U+FFFD) */
            size_t dn = 0, nn, nn2;
            char* dec = malloc(4 * n + 64);
            for (int i = 0; i < ni; i++) {
                size_t l;
                const char* p = tokenizer_token(t, ids[i], &l);
                memcpy(dec + dn, p, l);
                dn += l;
            }
            /* expected: the added tokens as they are, NFC of the text between them */
            char* norm = malloc(4 * n + 64);
            nn = 0;
            size_t seg = 0;
            for (size_t i = 0; i <= n;) {
                size_t hit = 0;
                for (int a = 0; a < N_ADDED && i < n; a++) {
                    size_t al = strlen(ADDED[a].s);
                    if (al <= n - i && al > hit && memcmp(s + i, ADDED[a].s, al) == 0) hit = al;
                }
                if (hit || i == n) {
                    size_t l;
                    char* part = tokenizer_nfc(s + seg, i - seg, &l);
                    memcpy(norm + nn, part, l);
                    nn += l;
                    free(part);
                    memcpy(norm + nn, s + i, hit);
                    nn += hit;
                    i += hit ? hit : 1;
                    seg = i;
                } else {
                    i++;
                }
            }
            int ok = norm && dn == nn && memcmp(dec, norm, dn) == 0;
            CHECK(ok, "round trip failed (iteration %d): %zu bytes decoded, %zu expected", iter, dn, nn);
            if (!ok) {
                for (size_t i = 0; i < n; i++) fprintf(stderr, "%02x", (uint8_t)s[i]);
                fputc('\n', stderr);
                for (size_t i = 0; i < dn; i++) fprintf(stderr, "%02x", (uint8_t)dec[i]);
                fputc('\n', stderr);
            }
            char* norm1 = tokenizer_nfc(s, n, &nn);
            char* norm2 = tokenizer_nfc(norm1, nn, &nn2);
            CHECK(nn2 == nn && memcmp(norm1, norm2, nn) == 0, "NFC not idempotent (iteration %d)", iter);
            free(norm1);
            for (int i = 0; i < ni; i++) CHECK(ids[i] >= 0 && ids[i] < tokenizer_size(t), "id out of range");
            free(dec);
            free(norm);
            free(norm2);
            free(ids);
            if (!ok) break;
        }
    }

    /* a long piece (heap path) and a long text */
    {
        size_t n = 200000;
        char* s = malloc(n);
        for (size_t i = 0; i < n; i++) s[i] = 'l';
        int ni;
        int* ids = tokenizer_encode(t, s, n, &ni);
        CHECK(ids && ni == 50000 && ids[0] == 268 && ids[ni - 1] == 268, "long piece: %d ids", ni);
        free(ids);
        free(s);
    }
    tokenizer_free(t);

    /* every truncation of the section is rejected with a message, never a crash */
    for (size_t cut = 1; cut < sec.n; cut++) {
        err[0] = 0;
        Tokenizer* bad = tokenizer_new(sec.p, cut, err, sizeof err);
        CHECK(bad == NULL && err[0], "truncated section of %zu bytes accepted", cut);
        tokenizer_free(bad);
    }
    /* a merge with an id outside the vocabulary */
    {
        Buf b2 = {0};
        put(&b2, sec.p, sec.n);
        size_t mpos = 4 + 16 + 4 + strlen(QWEN_REGEX);
        for (int i = 0; i < N_VOCAB; i++) mpos += 4 + (i < 256 ? 1 : strlen(vocab_str[i]));
        b2.p[mpos] = 0xff;
        b2.p[mpos + 1] = 0xff;
        Tokenizer* bad = tokenizer_new(b2.p, b2.n, err, sizeof err);
        CHECK(bad == NULL && strstr(err, "merge"), "bad merge id accepted: %s", err);
        tokenizer_free(bad);
        free(b2.p);
    }
    /* huge counts */
    {
        Buf b3 = {0};
        put(&b3, sec.p, sec.n);
        b3.p[4] = b3.p[5] = b3.p[6] = b3.p[7] = 0xff;
        Tokenizer* bad = tokenizer_new(b3.p, b3.n, err, sizeof err);
        CHECK(bad == NULL, "huge vocabulary count accepted");
        tokenizer_free(bad);
        free(b3.p);
    }
    free(sec.p);

    /* no tokenizer in the checkpoint: size 0, encoding gives nothing */
    {
        Tokenizer* e = tokenizer_new(NULL, 0, err, sizeof err);
        CHECK(e && tokenizer_size(e) == 0, "empty tokenizer");
        int ni;
        int* ids = tokenizer_encode(e, "abc", 3, &ni);
        CHECK(ids && ni == 0, "empty tokenizer encodes to nothing");
        free(ids);
        tokenizer_free(e);
    }
    /* without the NFC flag the text is not normalised */
    {
        Buf s2 = tiny_section(QWEN_REGEX, TOK_FLAG_QWEN2_REGEX | TOK_FLAG_BYTE_LEVEL);
        Tokenizer* t2 = tokenizer_new(s2.p, s2.n, err, sizeof err);
        CHECK(t2 != NULL, "no-NFC tokenizer: %s", err);
        if (t2) ENC(t2, "A\xcc\x8a", 'A', 0xCC, 0x8A);
        tokenizer_free(t2);
        free(s2.p);
    }
}

int main(int argc, char** argv) {
    if (argc >= 3 && strcmp(argv[1], "--encode") == 0) return mode_encode(argv[2]);
    if (argc == 2 && strcmp(argv[1], "--nfc") == 0) return mode_nfc();
    if (argc == 2 && strcmp(argv[1], "--pieces") == 0) return mode_pieces();
    if (argc == 2 && strcmp(argv[1], "--unicode-props") == 0) return mode_unicode_props();
    if (argc >= 4 && strcmp(argv[1], "--bench") == 0) return mode_bench(argv[2], argv[3], argc >= 5 ? atoi(argv[4]) : 5);
    if (argc > 1) {
        fprintf(stderr, "usage: %s [--encode FILE | --nfc | --pieces | --unicode-props | --bench FILE TEXT [REPS]]\n", argv[0]);
        return 2;
    }
    test_pretokenizer();
    test_nfc();
    test_tiny();
    test_llama3();
    printf("test_tokenizer_unit: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
