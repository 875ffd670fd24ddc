/* tokenizer.c: Qwen3's byte-level BPE tokenizer (QWEN3.md section 4), read from the tokenizer
 * section of the checkpoint (layout in model.h).
 *
 * Encoding pipeline, exactly as the reference (Rust `tokenizers` with tokenizer.json):
 *   1. split off the added tokens (<|im_start|>, <think>, ...) where they occur in the raw text,
 *      leftmost-longest, special or not;
 *   2. NFC-normalise each remaining segment (unicode_tables.c, with the Unicode 9.0 data of the
 *      reference's normalizer; only the stretches around characters that NFC can change are
 *      touched, the rest is copied);
 *   3. pre-tokenize with a hand-written scanner equivalent to the Split regex
 *        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *      (one branch per alternative, tried in order; \s = Unicode White_Space; the classes are
 *      Unicode 16.0, as in the reference's regex engine);
 *   4. BPE on the bytes of each piece, on token ids: one id per byte (the single-byte token), then
 *      repeatedly merge the adjacent pair of lowest merge rank, leftmost among equals. Merges are
 *      found by a hash of (left id, right id). Short pieces use an array, long ones a binary heap
 *      over a linked list, so the cost is O(n log n) per piece;
 *   5. a per-call cache of short pieces (most words repeat) skips step 4 for repeated pieces.
 * No BOS is added. Bytes that are not valid UTF-8 (and NUL) are kept: each invalid byte is one
 * unit of the "other" class (like punctuation) and is encoded by its single-byte token, so
 * decode(encode(x)) gives back the same bytes for them.
 */
#include "tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "unicode_tables.h"

/* The Split regex of Qwen2/Qwen2.5/Qwen3, and Llama 3's (numbers in runs of up to three). */
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char LLAMA3_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct {
    uint32_t left, right;  /* left == UINT32_MAX: empty slot */
    uint32_t rank, result;
} MergeSlot;

typedef struct {
    const uint8_t* s;
    uint32_t len;
    int id;
} Added;

struct Tokenizer {
    int n_vocab, n_merges, n_added, size;
    uint32_t flags;
    int max_digits;    /* 1 (Qwen2 regex) or 3 (Llama 3 regex) */
    int ignore_merges; /* a piece that is a vocabulary token is taken whole (Llama 3) */
    int monotone;      /* every token is made by one merge, and a merge's inputs by earlier ones */
    const uint8_t** tok;  /* [size] bytes of each id (NULL: unknown id) */
    uint32_t* tok_len;    /* [size] */
    uint8_t* special;     /* [size] */
    int byte_id[256];     /* id of the single-byte token of each byte, -1 if none */
    MergeSlot* merges;
    uint32_t merge_mask;
    int32_t* vocab_slots; /* hash of token bytes -> id (vocabulary and added tokens), -1 empty */
    uint32_t vocab_mask;
    Added* added;         /* sorted longest first */
    uint8_t added_first[256];
    const uint8_t* chat_template;
    uint32_t chat_template_len;
};

/* ------------------------------------------------------------------------------------------- */
/* Small helpers                                                                                */
/* ------------------------------------------------------------------------------------------- */

static uint32_t rd32(const uint8_t* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t hash_bytes(const uint8_t* s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h ^ (h >> 15);
}

static inline uint32_t hash_pair(uint32_t a, uint32_t b) {
    uint64_t k = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(k >> 32);
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t p = 16;
    while (p < n && p < (1u << 30)) p <<= 1;
    return p;
}

/* Merge (rank, result) of the pair (a, b); returns 0 when the pair is no merge. */
static inline int merge_lookup(const Tokenizer* t, uint32_t a, uint32_t b, uint32_t* rank, uint32_t* result) {
    if (!t->merges) return 0;
    for (uint32_t h = hash_pair(a, b) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        const MergeSlot* m = &t->merges[h];
        if (m->left == UINT32_MAX) return 0;
        if (m->left == a && m->right == b) {
            *rank = m->rank;
            *result = m->result;
            return 1;
        }
    }
}

static int vocab_lookup(const Tokenizer* t, const uint8_t* s, size_t n) {
    if (!t->vocab_slots) return -1;
    for (uint32_t h = hash_bytes(s, n) & t->vocab_mask;; h = (h + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slots[h];
        if (id < 0) return -1;
        if (t->tok_len[id] == n && memcmp(t->tok[id], s, n) == 0) return id;
    }
}

static void vocab_insert(Tokenizer* t, int id) {
    const uint8_t* s = t->tok[id];
    size_t n = t->tok_len[id];
    for (uint32_t h = hash_bytes(s, n) & t->vocab_mask;; h = (h + 1) & t->vocab_mask) {
        int32_t other = t->vocab_slots[h];
        if (other < 0) {
            t->vocab_slots[h] = id;
            return;
        }
        if (t->tok_len[other] == n && memcmp(t->tok[other], s, n) == 0) return; /* first one wins */
    }
}

/* ------------------------------------------------------------------------------------------- */
/* Loading                                                                                      */
/* ------------------------------------------------------------------------------------------- */

typedef struct {
    const uint8_t* p;
    size_t n, pos;
    int bad;
} Reader;

static uint32_t r_u32(Reader* r) {
    if (r->bad || r->n - r->pos < 4) {
        r->bad = 1;
        return 0;
    }
    uint32_t v = rd32(r->p + r->pos);
    r->pos += 4;
    return v;
}

static const uint8_t* r_bytes(Reader* r, uint32_t len) {
    if (r->bad || r->n - r->pos < len) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t* s = r->p + r->pos;
    r->pos += len;
    return s;
}

static int cmp_added(const void* a, const void* b) {
    const Added* x = a;
    const Added* y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id - y->id;
}

/* Writes the message into err (when there is room for one) and returns -1. */
static int tok_error(char* err, size_t errlen, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static int tok_error(char* err, size_t errlen, const char* fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Where the parts of the tokenizer section are (layout in model.h), found by walking it once with
 * every length checked against the section's size; the tables are filled from them afterwards. */
typedef struct {
    uint32_t n_vocab, n_merges, n_added;
    const uint8_t* vocab;  /* n_vocab entries: u32 length, bytes */
    const uint8_t* merges; /* n_merges entries: u32 left, right, result */
    const uint8_t* added;  /* n_added entries: u32 id, special, length, bytes */
    int64_t size;          /* ids: the vocabulary and every added token's id */
} Section;

/* The header: magic, counts, flags and the Split regex, which picks the pre-tokenizer. */
static int read_section_header(Tokenizer* t, Reader* r, Section* sec, char* err, size_t errlen) {
    const size_t n = r->n;
    const uint8_t* magic = r_bytes(r, 4);
    if (!magic || memcmp(magic, "QTOK", 4) != 0)
        return tok_error(err, errlen, "tokenizer section: bad magic (expected QTOK)");
    sec->n_vocab = r_u32(r);
    sec->n_merges = r_u32(r);
    sec->n_added = r_u32(r);
    t->flags = r_u32(r);
    uint32_t regex_len = r_u32(r);
    const uint8_t* regex = r_bytes(r, regex_len);
    if (r->bad) return tok_error(err, errlen, "tokenizer section: truncated header");
    /* every entry takes at least 4 bytes, which bounds the counts by the section size */
    if (sec->n_vocab > (n - r->pos) / 4 || sec->n_merges > (n - r->pos) / 12 || sec->n_added > (n - r->pos) / 12)
        return tok_error(err, errlen, "tokenizer section: counts (%u vocab, %u merges, %u added) exceed its %zu bytes",
                         sec->n_vocab, sec->n_merges, sec->n_added, n);
    t->n_vocab = (int)sec->n_vocab;
    t->n_merges = (int)sec->n_merges;
    t->n_added = (int)sec->n_added;
    if (regex_len == sizeof QWEN2_REGEX - 1 && memcmp(regex, QWEN2_REGEX, regex_len) == 0) {
        t->max_digits = 1;
    } else if (regex_len == sizeof LLAMA3_REGEX - 1 && memcmp(regex, LLAMA3_REGEX, regex_len) == 0) {
        t->max_digits = 3;
        t->ignore_merges = 1; /* Llama 3's tokenizer.json has "ignore_merges": true */
    }
    /* any other regex: the Qwen2 scanner is used (export.py warns that encoding may differ) */
    return 0;
}

/* The vocabulary, the merges, the added tokens (whose largest id sets the size) and the chat
 * template, each checked to lie inside the section, which they must fill exactly. */
static int find_section_parts(Tokenizer* t, Reader* r, Section* sec, char* err, size_t errlen) {
    const size_t n = r->n;
    sec->vocab = r->p + r->pos;
    for (uint32_t i = 0; i < sec->n_vocab; i++) r_bytes(r, r_u32(r));
    if (r->bad) return tok_error(err, errlen, "tokenizer section: truncated vocabulary");
    sec->merges = r_bytes(r, 0);
    if (r->bad || (uint64_t)sec->n_merges * 12 > n - r->pos)
        return tok_error(err, errlen, "tokenizer section: truncated merges");
    r->pos += (size_t)sec->n_merges * 12;
    sec->added = r->p + r->pos;
    sec->size = sec->n_vocab;
    for (uint32_t i = 0; i < sec->n_added; i++) {
        uint32_t id = r_u32(r);
        r_u32(r);
        r_bytes(r, r_u32(r));
        if (r->bad) return tok_error(err, errlen, "tokenizer section: truncated added tokens");
        if (id >= MAX_VOCAB) return tok_error(err, errlen, "tokenizer section: added token id %u is too large", id);
        if ((int64_t)id + 1 > sec->size) sec->size = (int64_t)id + 1;
    }
    uint32_t tlen = r_u32(r);
    t->chat_template = r_bytes(r, tlen);
    t->chat_template_len = tlen;
    if (r->bad) return tok_error(err, errlen, "tokenizer section: truncated chat template");
    if (r->pos != n) return tok_error(err, errlen, "tokenizer section: %zu unexpected bytes at its end", n - r->pos);
    return 0;
}

/* The per-id arrays and the two hash tables (every slot empty). */
static int alloc_tables(Tokenizer* t, const Section* sec, char* err, size_t errlen) {
    t->size = (int)sec->size;
    t->tok = calloc((size_t)sec->size, sizeof *t->tok);
    t->tok_len = calloc((size_t)sec->size, sizeof *t->tok_len);
    t->special = calloc((size_t)sec->size, 1);
    t->added = calloc(sec->n_added ? sec->n_added : 1, sizeof *t->added);
    t->vocab_mask = pow2_at_least(((uint64_t)sec->n_vocab + sec->n_added) * 2) - 1;
    t->vocab_slots = malloc(((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slots);
    t->merge_mask = pow2_at_least((uint64_t)sec->n_merges * 2) - 1;
    t->merges = malloc(((size_t)t->merge_mask + 1) * sizeof *t->merges);
    if (!t->tok || !t->tok_len || !t->special || !t->added || !t->vocab_slots || !t->merges)
        return tok_error(err, errlen, "tokenizer: out of memory");
    memset(t->vocab_slots, 0xff, ((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slots);
    memset(t->merges, 0xff, ((size_t)t->merge_mask + 1) * sizeof *t->merges);
    return 0;
}

/* Each token's bytes, and the single-byte token of each byte (the first one wins). */
static void load_vocabulary(Tokenizer* t, const Section* sec) {
    const uint8_t* p = sec->vocab;
    for (uint32_t i = 0; i < sec->n_vocab; i++) {
        uint32_t len = rd32(p);
        t->tok[i] = p + 4;
        t->tok_len[i] = len;
        p += 4 + (size_t)len;
        if (len == 1 && t->byte_id[t->tok[i][0]] < 0) t->byte_id[t->tok[i][0]] = (int)i;
    }
}

/* The merge hash: (left, right) -> (rank, result); every id must be a vocabulary token. */
static int load_merges(Tokenizer* t, const Section* sec, char* err, size_t errlen) {
    const uint8_t* m = sec->merges;
    for (uint32_t i = 0; i < sec->n_merges; i++) {
        uint32_t a = rd32(m + 12 * (size_t)i), b = rd32(m + 12 * (size_t)i + 4), c = rd32(m + 12 * (size_t)i + 8);
        if (a >= sec->n_vocab || b >= sec->n_vocab || c >= sec->n_vocab)
            return tok_error(err, errlen,
                             "tokenizer section: merge %u (%u, %u -> %u) uses an id outside the vocabulary of %u",
                             i, a, b, c, sec->n_vocab);
        for (uint32_t h = hash_pair(a, b) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
            MergeSlot* slot = &t->merges[h];
            if (slot->left == UINT32_MAX) {
                *slot = (MergeSlot){a, b, i, c};
                break;
            }
            if (slot->left == a && slot->right == b) break; /* a repeated pair keeps its lowest rank */
        }
    }
    return 0;
}

/* Monotone merges (true for Qwen's: token 256 + k is made by merge k): then a pair that a merge
 * creates always has a higher rank than that merge, which the bucket method for very long pieces
 * relies on. */
static int check_monotone(Tokenizer* t, const Section* sec, char* err, size_t errlen) {
    const uint8_t* m = sec->merges;
    int32_t* made_by = malloc((size_t)(sec->n_vocab ? sec->n_vocab : 1) * sizeof *made_by);
    if (!made_by) return tok_error(err, errlen, "tokenizer: out of memory");
    memset(made_by, 0xff, (size_t)sec->n_vocab * sizeof *made_by);
    t->monotone = 1;
    for (uint32_t i = 0; i < sec->n_merges && t->monotone; i++) {
        uint32_t c = rd32(m + 12 * (size_t)i + 8);
        if (made_by[c] >= 0) t->monotone = 0;
        made_by[c] = (int32_t)i;
    }
    for (uint32_t i = 0; i < sec->n_merges && t->monotone; i++) {
        uint32_t a = rd32(m + 12 * (size_t)i), b = rd32(m + 12 * (size_t)i + 4);
        if (made_by[a] >= (int32_t)i || made_by[b] >= (int32_t)i) t->monotone = 0;
    }
    free(made_by);
    return 0;
}

/* The added tokens: their bytes under their ids, sorted longest first for the split of step 1. */
static void load_added(Tokenizer* t, const Section* sec) {
    const uint8_t* p = sec->added;
    for (uint32_t i = 0; i < sec->n_added; i++) {
        uint32_t id = rd32(p), special = rd32(p + 4), len = rd32(p + 8);
        Added* a = &t->added[i];
        a->id = (int)id;
        a->s = p + 12;
        a->len = len;
        p += 12 + (size_t)len;
        t->tok[id] = a->s;
        t->tok_len[id] = len;
        t->special[id] = special != 0;
        if (len) t->added_first[a->s[0]] = 1;
    }
    qsort(t->added, sec->n_added, sizeof *t->added, cmp_added);
}

Tokenizer* tokenizer_new(const uint8_t* data, size_t n, char* err, size_t errlen) {
    Tokenizer* t = calloc(1, sizeof *t);
    if (!t) {
        tok_error(err, errlen, "tokenizer: out of memory");
        return NULL;
    }
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    t->max_digits = 1;
    if (n == 0 || !data) return t; /* no tokenizer in the checkpoint */
    Reader r = {data, n, 0, 0};
    Section sec = {0};
    if (read_section_header(t, &r, &sec, err, errlen) != 0 || find_section_parts(t, &r, &sec, err, errlen) != 0 ||
        alloc_tables(t, &sec, err, errlen) != 0) {
        tokenizer_free(t);
        return NULL;
    }
    load_vocabulary(t, &sec);
    if (load_merges(t, &sec, err, errlen) != 0 || check_monotone(t, &sec, err, errlen) != 0) {
        tokenizer_free(t);
        return NULL;
    }
    load_added(t, &sec);
    /* added tokens first, so tokenizer_find prefers them */
    for (uint32_t i = 0; i < sec.n_added; i++) vocab_insert(t, t->added[i].id);
    for (uint32_t i = 0; i < sec.n_vocab; i++) vocab_insert(t, (int)i);
    return t;
}

void tokenizer_free(Tokenizer* t) {
    if (!t) return;
    free(t->tok);
    free(t->tok_len);
    free(t->special);
    free(t->added);
    free(t->vocab_slots);
    free(t->merges);
    free(t);
}

int tokenizer_size(const Tokenizer* t) { return t ? t->size : 0; }

const char* tokenizer_token(const Tokenizer* t, int id, size_t* len) {
    if (!t || id < 0 || id >= t->size || !t->tok[id]) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->tok_len[id];
    return (const char*)t->tok[id];
}

int tokenizer_is_special(const Tokenizer* t, int id) {
    return t && id >= 0 && id < t->size && t->special[id];
}

int tokenizer_find(const Tokenizer* t, const char* s) {
    if (!t || !s) return -1;
    return vocab_lookup(t, (const uint8_t*)s, strlen(s));
}

const char* tokenizer_chat_template(const Tokenizer* t, size_t* len) {
    if (len) *len = t ? t->chat_template_len : 0;
    return t && t->chat_template ? (const char*)t->chat_template : "";
}

/* ------------------------------------------------------------------------------------------- */
/* UTF-8                                                                                        */
/* ------------------------------------------------------------------------------------------- */

/* A byte that is not part of a valid UTF-8 sequence decodes to INVALID_BASE + byte: it has no
 * Unicode properties (the "other" class), combining class 0, and is written back as that byte. */
#define INVALID_BASE 0x110000u

/* Decodes the character at s[i] (i < n); *l gets its length in bytes (1 for an invalid byte). */
static inline uint32_t utf8_next(const uint8_t* s, size_t n, size_t i, int* l) {
    uint32_t c = s[i];
    if (c < 0x80) {
        *l = 1;
        return c;
    }
    size_t left = n - i;
    if (c >= 0xC2 && c <= 0xDF) {
        if (left >= 2 && (s[i + 1] & 0xC0) == 0x80) {
            *l = 2;
            return (c & 0x1F) << 6 | (s[i + 1] & 0x3F);
        }
    } else if (c >= 0xE0 && c <= 0xEF) {
        if (left >= 3 && (s[i + 1] & 0xC0) == 0x80 && (s[i + 2] & 0xC0) == 0x80) {
            uint32_t v = (c & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F);
            if (v >= 0x800 && (v < 0xD800 || v > 0xDFFF)) {
                *l = 3;
                return v;
            }
        }
    } else if (c >= 0xF0 && c <= 0xF4) {
        if (left >= 4 && (s[i + 1] & 0xC0) == 0x80 && (s[i + 2] & 0xC0) == 0x80 && (s[i + 3] & 0xC0) == 0x80) {
            uint32_t v = (c & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 | (uint32_t)(s[i + 2] & 0x3F) << 6 |
                         (s[i + 3] & 0x3F);
            if (v >= 0x10000 && v <= 0x10FFFF) {
                *l = 4;
                return v;
            }
        }
    }
    *l = 1;
    return INVALID_BASE + c;
}

static int utf8_put(uint32_t c, uint8_t* o) {
    if (c >= INVALID_BASE) {
        o[0] = (uint8_t)(c - INVALID_BASE);
        return 1;
    }
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | c >> 6);
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12);
        o[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | c >> 18);
    o[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* Unicode properties (UT_* bits); 0 for invalid bytes. */
static inline unsigned props_of(uint32_t c) { return c < INVALID_BASE ? ut_props(c) : 0; }

/* ------------------------------------------------------------------------------------------- */
/* Growable buffers                                                                             */
/* ------------------------------------------------------------------------------------------- */

typedef struct {
    uint8_t* p;
    size_t n, cap;
    int oom;
} Bytes;

static int bytes_reserve(Bytes* b, size_t extra) {
    if (b->oom) return 0;
    if (b->cap - b->n >= extra) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->n < extra) cap *= 2;
    uint8_t* p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

static void bytes_add(Bytes* b, const void* s, size_t n) {
    if (!bytes_reserve(b, n)) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}

typedef struct {
    int* p;
    size_t n, cap;
    int oom;
} Ids;

static int ids_reserve(Ids* v, size_t extra) {
    if (v->oom) return 0;
    if (v->cap - v->n >= extra) return 1;
    size_t cap = v->cap ? v->cap : 64;
    while (cap - v->n < extra) cap *= 2;
    int* p = realloc(v->p, cap * sizeof *p);
    if (!p) {
        v->oom = 1;
        return 0;
    }
    v->p = p;
    v->cap = cap;
    return 1;
}

static inline void ids_add(Ids* v, int id) {
    if (v->n == v->cap && !ids_reserve(v, 1)) return;
    v->p[v->n++] = id;
}

/* ------------------------------------------------------------------------------------------- */
/* NFC                                                                                          */
/* ------------------------------------------------------------------------------------------- */

typedef struct {
    uint32_t* cp;
    uint8_t* cc;
    size_t cap;
} CpBuf;

/* Normalises the characters s[0..n) (a stretch that starts at a "safe" character or at the start of
 * the segment, and ends before a safe character or at its end) and appends the result to out. */
static void nfc_stretch(const uint8_t* s, size_t n, Bytes* out, CpBuf* cb) {
    size_t need = n * UT_MAX_DECOMP + 1; /* each byte decomposes into at most UT_MAX_DECOMP characters */
    if (need > cb->cap) {
        uint32_t* cp = realloc(cb->cp, need * sizeof *cp);
        if (cp) cb->cp = cp;
        uint8_t* cc = realloc(cb->cc, need);
        if (cc) cb->cc = cc;
        if (!cp || !cc) {
            out->oom = 1;
            return;
        }
        cb->cap = need;
    }
    uint32_t* c = cb->cp;
    uint8_t* k = cb->cc;
    size_t m = 0;
    /* full canonical decomposition */
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t ch = utf8_next(s, n, i, &l);
        i += (size_t)l;
        if (ch >= INVALID_BASE) {
            c[m] = ch;
            k[m++] = 0;
            continue;
        }
        uint32_t d[UT_MAX_DECOMP];
        int nd = ut_decompose(ch, d);
        for (int j = 0; j < nd; j++) {
            c[m] = d[j];
            k[m++] = (uint8_t)ut_ccc(d[j]);
        }
    }
    /* canonical ordering: stable sort of every run of non-zero combining classes */
    for (size_t i = 1; i < m; i++) {
        if (k[i] == 0) continue;
        size_t j = i;
        uint32_t ch = c[i];
        uint8_t cl = k[i];
        while (j > 0 && k[j - 1] > cl) {
            c[j] = c[j - 1];
            k[j] = k[j - 1];
            j--;
        }
        c[j] = ch;
        k[j] = cl;
    }
    /* canonical composition */
    if (m > 0) {
        size_t starter = 0, w = 1;
        int starter_ok = k[0] == 0;
        int last = k[0] == 0 ? 0 : 256;
        for (size_t i = 1; i < m; i++) {
            uint32_t ch = c[i];
            int cl = k[i];
            uint32_t comp = (starter_ok && (last < cl || last == 0)) ? ut_compose(c[starter], ch) : 0;
            if (comp) {
                c[starter] = comp;
                continue;
            }
            if (cl == 0) {
                starter = w;
                starter_ok = 1;
            }
            last = cl;
            c[w] = ch;
            k[w++] = (uint8_t)cl;
        }
        m = w;
    }
    if (!bytes_reserve(out, m * 4)) return;
    for (size_t i = 0; i < m; i++) out->n += (size_t)utf8_put(c[i], out->p + out->n);
}

/* NFC of s[0..n). Returns s itself when it is already NFC (no unsafe character), else out->p. */
static const uint8_t* nfc(const uint8_t* s, size_t n, size_t* out_n, Bytes* out, CpBuf* cb) {
    size_t i = 0, safe = 0; /* safe: start of the last safe character (or 0) */
    while (i < n) {
        if (s[i] < 0x80) { /* ASCII is safe */
            safe = i++;
            continue;
        }
        int l;
        uint32_t ch = utf8_next(s, n, i, &l);
        if (props_of(ch) & UT_UNSAFE) break;
        safe = i;
        i += (size_t)l;
    }
    if (i == n) {
        *out_n = n;
        return s;
    }
    out->n = 0;
    size_t done = 0;
    while (i < n) {
        /* s[i] is unsafe: the stretch starts at the last safe character before it */
        size_t start = safe;
        bytes_add(out, s + done, start - done);
        while (i < n) {
            int l;
            uint32_t ch = utf8_next(s, n, i, &l);
            if (!(props_of(ch) & UT_UNSAFE)) break;
            i += (size_t)l;
        }
        nfc_stretch(s + start, i - start, out, cb);
        done = i;
        /* skip safe characters, remembering the last one */
        safe = i;
        while (i < n) {
            int l;
            uint32_t ch = utf8_next(s, n, i, &l);
            if (props_of(ch) & UT_UNSAFE) break;
            safe = i;
            i += (size_t)l;
        }
    }
    bytes_add(out, s + done, n - done);
    *out_n = out->n;
    return out->p;
}

/* ------------------------------------------------------------------------------------------- */
/* Pre-tokenizer: the Split regex as a scanner                                                  */
/* ------------------------------------------------------------------------------------------- */

static inline int is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* Length in bytes of the piece that starts at s[i] (i < n). */
static size_t next_piece(const uint8_t* s, size_t n, size_t i, int max_digits) {
    int l0, l;
    uint32_t c0 = utf8_next(s, n, i, &l0);
    unsigned p0 = props_of(c0);
    size_t j;

    /* 1. (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (c0 == '\'' && i + 1 < n) {
        uint8_t a = s[i + 1] | 0x20, b = i + 2 < n ? (s[i + 2] | 0x20) : 0;
        int ascii_a = s[i + 1] < 0x80, ascii_b = i + 2 < n && s[i + 2] < 0x80;
        if (ascii_a && (a == 's' || a == 't' || a == 'm' || a == 'd')) return 2;
        if (ascii_a && ascii_b && ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')))
            return 3;
    }
    /* 2. [^\r\n\p{L}\p{N}]?\p{L}+ */
    j = i;
    if (p0 & UT_L) {
        j = i + (size_t)l0;
    } else if (!is_crlf(c0) && !(p0 & UT_N) && i + (size_t)l0 < n) {
        uint32_t c1 = utf8_next(s, n, i + (size_t)l0, &l);
        if (props_of(c1) & UT_L) j = i + (size_t)l0 + (size_t)l;
    }
    if (j > i) {
        while (j < n) {
            uint32_t c = utf8_next(s, n, j, &l);
            if (!(props_of(c) & UT_L)) break;
            j += (size_t)l;
        }
        return j - i;
    }
    /* 3. \p{N} (Llama 3: \p{N}{1,3}) */
    if (p0 & UT_N) {
        j = i + (size_t)l0;
        for (int d = 1; d < max_digits && j < n; d++) {
            uint32_t c = utf8_next(s, n, j, &l);
            if (!(props_of(c) & UT_N)) break;
            j += (size_t)l;
        }
        return j - i;
    }
    /* 4. ' '?[^\s\p{L}\p{N}]+[\r\n]* */
    j = i;
    if (!(p0 & (UT_WS | UT_L | UT_N))) {
        j = i + (size_t)l0;
    } else if (c0 == ' ' && i + 1 < n) {
        uint32_t c1 = utf8_next(s, n, i + 1, &l);
        if (!(props_of(c1) & (UT_WS | UT_L | UT_N))) j = i + 1 + (size_t)l;
    }
    if (j > i) {
        while (j < n) {
            uint32_t c = utf8_next(s, n, j, &l);
            if (props_of(c) & (UT_WS | UT_L | UT_N)) break;
            j += (size_t)l;
        }
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j - i;
    }
    /* c0 is white space: find its run, the end of its last CR/LF and the start of its last character */
    size_t end_nl = 0, last = i;
    j = i;
    while (j < n) {
        uint32_t c = utf8_next(s, n, j, &l);
        if (!(props_of(c) & UT_WS)) break;
        last = j;
        j += (size_t)l;
        if (is_crlf(c)) end_nl = j;
    }
    /* 5. \s*[\r\n]+ */
    if (end_nl) return end_nl - i;
    /* 6. \s+(?!\S) */
    if (j == n) return n - i;
    if (last > i) return last - i;
    /* 7. \s+ (a single white space character before a non-space) */
    return (size_t)l0;
}

/* ------------------------------------------------------------------------------------------- */
/* BPE                                                                                          */
/* ------------------------------------------------------------------------------------------- */

typedef struct {
    uint32_t rank;
    int pos; /* index of the left symbol */
} HeapItem;

typedef struct {
    int* id;
    int* next;
    int* prev;
    uint32_t* rank; /* array method: rank of the pair (i, i+1) */
    uint32_t* res;
    HeapItem* heap;
    size_t cap;
    /* bucket method (very long pieces, monotone merges): per rank a list of positions */
    uint32_t* bucket_head;  /* [n_merges]: 1 + index of the first entry, 0 = empty */
    struct BucketEntry { int pos; uint32_t next; }* bentries;
    size_t n_bentries, cap_bentries;
    uint32_t* rank_heap;
    size_t n_rank_heap, cap_rank_heap;
    int* sorted;
    size_t cap_sorted;
    /* cache of short pieces: bytes -> ids */
    uint32_t* cache_slots; /* index into cache entries + 1, 0 = empty */
    uint32_t cache_mask;
    Bytes cache_keys;   /* concatenated piece bytes */
    Ids cache_ids;      /* concatenated ids */
    struct CacheEntry { uint32_t key_off, key_len, ids_off, ids_len; }* entries;
    size_t n_entries, cap_entries;
} Work;

static int work_reserve(Work* w, size_t n) {
    if (n <= w->cap) return 1;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < n) cap *= 2;
    int* id = realloc(w->id, cap * sizeof *id);
    if (id) w->id = id;
    int* nx = realloc(w->next, cap * sizeof *nx);
    if (nx) w->next = nx;
    int* pv = realloc(w->prev, cap * sizeof *pv);
    if (pv) w->prev = pv;
    uint32_t* rk = realloc(w->rank, cap * sizeof *rk);
    if (rk) w->rank = rk;
    uint32_t* rs = realloc(w->res, cap * sizeof *rs);
    if (rs) w->res = rs;
    HeapItem* hp = realloc(w->heap, 2 * cap * sizeof *hp);
    if (hp) w->heap = hp;
    if (!id || !nx || !pv || !rk || !rs || !hp) return 0;
    w->cap = cap;
    return 1;
}

static inline int heap_less(HeapItem a, HeapItem b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(HeapItem* h, size_t* n, HeapItem x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(x, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static HeapItem heap_pop(HeapItem* h, size_t* n) {
    HeapItem top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

#define NO_RANK UINT32_MAX
#define ARRAY_BPE_MAX 48 /* pieces up to this many bytes use the simple array method */


#define BUCKET_BPE_MIN 1024 /* pieces of at least this many bytes use the bucket method */

static int int_cmp(const void* a, const void* b) {
    int x = *(const int*)a, y = *(const int*)b;
    return (x > y) - (x < y);
}

static int bucket_push(Work* w, uint32_t rank, int pos) {
    if (w->n_bentries == w->cap_bentries) {
        size_t cap = w->cap_bentries ? w->cap_bentries * 2 : 4096;
        void* p = realloc(w->bentries, cap * sizeof *w->bentries);
        if (!p) return 0;
        w->bentries = p;
        w->cap_bentries = cap;
    }
    if (w->bucket_head[rank] == 0) { /* a new rank: into the min-heap of ranks */
        if (w->n_rank_heap == w->cap_rank_heap) {
            size_t cap = w->cap_rank_heap ? w->cap_rank_heap * 2 : 1024;
            void* p = realloc(w->rank_heap, cap * sizeof *w->rank_heap);
            if (!p) return 0;
            w->rank_heap = p;
            w->cap_rank_heap = cap;
        }
        uint32_t* h = w->rank_heap;
        size_t i = w->n_rank_heap++;
        while (i > 0 && h[(i - 1) / 2] > rank) {
            h[i] = h[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        h[i] = rank;
    }
    w->bentries[w->n_bentries] = (struct BucketEntry){pos, w->bucket_head[rank]};
    w->bucket_head[rank] = (uint32_t)++w->n_bentries;
    return 1;
}

static uint32_t rank_pop(Work* w) {
    uint32_t* h = w->rank_heap;
    uint32_t top = h[0], x = h[--w->n_rank_heap];
    size_t n = w->n_rank_heap, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= x) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = x;
    return top;
}

/* BPE for very long pieces when the merges are monotone: a merge of rank r only creates pairs of
 * rank > r, so the ranks are processed in increasing order (a heap of the distinct ranks present),
 * each rank's positions left to right. Same result as the heap method; about linear time.
 * Returns 0 when out of memory (then nothing was appended). */
static int bpe_buckets(const Tokenizer* t, Work* w, int m, Ids* out) {
    int* id = w->id;
    int* next = w->next;
    int* prev = w->prev;
    if (!w->bucket_head) {
        w->bucket_head = calloc((size_t)t->n_merges + 1, sizeof *w->bucket_head);
        if (!w->bucket_head) return 0;
    }
    w->n_bentries = 0;
    w->n_rank_heap = 0;
    int ok = 1;
    for (int i = 0; i < m; i++) {
        next[i] = i + 1 < m ? i + 1 : -1;
        prev[i] = i - 1;
    }
    for (int i = 0; i + 1 < m && ok; i++) {
        uint32_t rk, rs;
        if (merge_lookup(t, (uint32_t)id[i], (uint32_t)id[i + 1], &rk, &rs)) ok = bucket_push(w, rk, i);
    }
    while (ok && w->n_rank_heap > 0) {
        uint32_t r = rank_pop(w);
        size_t k = 0;
        for (uint32_t e = w->bucket_head[r]; e; e = w->bentries[e - 1].next) k++;
        if (k > w->cap_sorted) {
            int* p = realloc(w->sorted, k * 2 * sizeof *p);
            if (!p) {
                ok = 0;
                break;
            }
            w->sorted = p;
            w->cap_sorted = k * 2;
        }
        k = 0;
        for (uint32_t e = w->bucket_head[r]; e; e = w->bentries[e - 1].next) w->sorted[k++] = w->bentries[e - 1].pos;
        w->bucket_head[r] = 0;
        qsort(w->sorted, k, sizeof *w->sorted, int_cmp);
        for (size_t j = 0; j < k && ok; j++) {
            int a = w->sorted[j];
            if (id[a] < 0) continue;
            int b = next[a];
            if (b < 0) continue;
            uint32_t rk, rs;
            if (!merge_lookup(t, (uint32_t)id[a], (uint32_t)id[b], &rk, &rs) || rk != r) continue; /* stale */
            id[a] = (int)rs;
            id[b] = -1;
            next[a] = next[b];
            if (next[b] >= 0) prev[next[b]] = a;
            if (prev[a] >= 0 && merge_lookup(t, (uint32_t)id[prev[a]], (uint32_t)id[a], &rk, &rs)) ok = bucket_push(w, rk, prev[a]);
            if (ok && next[a] >= 0 && merge_lookup(t, (uint32_t)id[a], (uint32_t)id[next[a]], &rk, &rs)) ok = bucket_push(w, rk, a);
        }
    }
    /* leave the bucket heads empty for the next piece */
    while (w->n_rank_heap > 0) w->bucket_head[rank_pop(w)] = 0;
    if (!ok) return 0;
    for (int i = 0; i >= 0; i = next[i]) ids_add(out, id[i]);
    return 1;
}

/* BPE on the m symbols w->id[0..m) (one per byte); appends the resulting ids to out. */
static void bpe(const Tokenizer* t, Work* w, int m, Ids* out) {
    int* id = w->id;
    if (m <= ARRAY_BPE_MAX) {
        uint32_t* rank = w->rank;
        uint32_t* res = w->res;
        for (int i = 0; i + 1 < m; i++)
            if (!merge_lookup(t, (uint32_t)id[i], (uint32_t)id[i + 1], &rank[i], &res[i])) rank[i] = NO_RANK;
        while (m > 1) {
            int best = -1;
            uint32_t br = NO_RANK;
            for (int i = 0; i + 1 < m; i++)
                if (rank[i] < br) {
                    br = rank[i];
                    best = i;
                }
            if (best < 0) break;
            id[best] = (int)res[best];
            for (int i = best + 1; i + 1 < m; i++) {
                id[i] = id[i + 1];
                rank[i] = rank[i + 1];
                res[i] = res[i + 1];
            }
            m--;
            if (best > 0 && !merge_lookup(t, (uint32_t)id[best - 1], (uint32_t)id[best], &rank[best - 1], &res[best - 1]))
                rank[best - 1] = NO_RANK;
            if (best + 1 < m && !merge_lookup(t, (uint32_t)id[best], (uint32_t)id[best + 1], &rank[best], &res[best]))
                rank[best] = NO_RANK;
        }
        if (!ids_reserve(out, (size_t)m)) return;
        memcpy(out->p + out->n, id, (size_t)m * sizeof *id);
        out->n += (size_t)m;
        return;
    }
    if (m >= BUCKET_BPE_MIN && t->monotone) {
        if (!bpe_buckets(t, w, m, out)) out->oom = 1;
        return;
    }
    /* linked list of symbols + binary heap of candidate merges ordered by (rank, position) */
    int* next = w->next;
    int* prev = w->prev;
    HeapItem* heap = w->heap;
    size_t hn = 0;
    for (int i = 0; i < m; i++) {
        next[i] = i + 1 < m ? i + 1 : -1;
        prev[i] = i - 1;
    }
    for (int i = 0; i + 1 < m; i++) {
        uint32_t rk, rs;
        if (merge_lookup(t, (uint32_t)id[i], (uint32_t)id[i + 1], &rk, &rs)) heap_push(heap, &hn, (HeapItem){rk, i});
    }
    while (hn > 0) {
        HeapItem top = heap_pop(heap, &hn);
        int a = top.pos;
        if (id[a] < 0) continue;  /* merged into its left neighbour */
        int b = next[a];
        if (b < 0) continue;
        uint32_t rk, rs;
        if (!merge_lookup(t, (uint32_t)id[a], (uint32_t)id[b], &rk, &rs) || rk != top.rank) continue; /* stale */
        id[a] = (int)rs;
        id[b] = -1;
        next[a] = next[b];
        if (next[b] >= 0) prev[next[b]] = a;
        if (prev[a] >= 0 && merge_lookup(t, (uint32_t)id[prev[a]], (uint32_t)id[a], &rk, &rs))
            heap_push(heap, &hn, (HeapItem){rk, prev[a]});
        if (next[a] >= 0 && merge_lookup(t, (uint32_t)id[a], (uint32_t)id[next[a]], &rk, &rs))
            heap_push(heap, &hn, (HeapItem){rk, a});
    }
    for (int i = 0; i >= 0; i = next[i]) ids_add(out, id[i]);
}

#define CACHE_MAX_PIECE 32 /* pieces up to this many bytes are cached */

static int cache_find(const Work* w, const uint8_t* s, size_t n, uint32_t h, uint32_t* slot) {
    for (uint32_t k = h & w->cache_mask;; k = (k + 1) & w->cache_mask) {
        uint32_t e = w->cache_slots[k];
        if (!e) {
            *slot = k;
            return -1;
        }
        const struct CacheEntry* ce = &w->entries[e - 1];
        if (ce->key_len == n && memcmp(w->cache_keys.p + ce->key_off, s, n) == 0) return (int)(e - 1);
    }
}

static void cache_grow(Work* w) {
    uint32_t cap = (w->cache_mask + 1) * 2;
    uint32_t* slots = calloc(cap, sizeof *slots);
    if (!slots) return;
    for (size_t e = 0; e < w->n_entries; e++) {
        const struct CacheEntry* ce = &w->entries[e];
        uint32_t k = hash_bytes(w->cache_keys.p + ce->key_off, ce->key_len) & (cap - 1);
        while (slots[k]) k = (k + 1) & (cap - 1);
        slots[k] = (uint32_t)e + 1;
    }
    free(w->cache_slots);
    w->cache_slots = slots;
    w->cache_mask = cap - 1;
}

/* Encodes one pre-tokenized piece. */
static void encode_piece(const Tokenizer* t, Work* w, const uint8_t* s, size_t n, Ids* out) {
    if (n == 1) {
        if (t->byte_id[s[0]] >= 0) ids_add(out, t->byte_id[s[0]]);
        return;
    }
    if (t->ignore_merges) {
        int id = vocab_lookup(t, s, n);
        if (id >= 0 && id < t->n_vocab) {
            ids_add(out, id);
            return;
        }
    }
    uint32_t h = 0, slot = 0;
    int use_cache = n <= CACHE_MAX_PIECE && w->cache_slots;
    if (use_cache) {
        h = hash_bytes(s, n);
        int e = cache_find(w, s, n, h, &slot);
        if (e >= 0) {
            const struct CacheEntry* ce = &w->entries[e];
            if (!ids_reserve(out, ce->ids_len)) return;
            memcpy(out->p + out->n, w->cache_ids.p + ce->ids_off, ce->ids_len * sizeof(int));
            out->n += ce->ids_len;
            return;
        }
    }
    if (!work_reserve(w, n)) {
        out->oom = 1;
        return;
    }
    int m = 0;
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] >= 0) w->id[m++] = t->byte_id[s[i]]; /* a byte without a token is dropped */
    size_t before = out->n;
    bpe(t, w, m, out);
    if (use_cache && !out->oom) {
        if (w->n_entries == w->cap_entries) {
            size_t cap = w->cap_entries ? w->cap_entries * 2 : 1024;
            void* p = realloc(w->entries, cap * sizeof *w->entries);
            if (!p) return;
            w->entries = p;
            w->cap_entries = cap;
        }
        size_t k = out->n - before;
        struct CacheEntry ce = {(uint32_t)w->cache_keys.n, (uint32_t)n, (uint32_t)w->cache_ids.n, (uint32_t)k};
        bytes_add(&w->cache_keys, s, n);
        if (!ids_reserve(&w->cache_ids, k) || w->cache_keys.oom) return;
        memcpy(w->cache_ids.p + w->cache_ids.n, out->p + before, k * sizeof(int));
        w->cache_ids.n += k;
        w->entries[w->n_entries++] = ce;
        w->cache_slots[slot] = (uint32_t)w->n_entries;
        if (w->n_entries * 2 > w->cache_mask + 1) cache_grow(w);
    }
}

static void encode_segment(const Tokenizer* t, Work* w, const uint8_t* s, size_t n, Ids* out, Bytes* nb, CpBuf* cb) {
    if (n == 0) return;
    if (t->flags & TOK_FLAG_NFC) s = nfc(s, n, &n, nb, cb);
    if (nb->oom) {
        out->oom = 1;
        return;
    }
    for (size_t i = 0; i < n;) {
        size_t len = next_piece(s, n, i, t->max_digits);
        encode_piece(t, w, s + i, len, out);
        i += len;
    }
}

int* tokenizer_encode(const Tokenizer* t, const char* text, size_t len, int* n_ids) {
    *n_ids = 0;
    Ids out = {0};
    if (!ids_reserve(&out, len / 3 + 16)) return NULL;
    if (!t || t->size == 0 || !text) return out.p; /* no tokenizer: no ids */
    const uint8_t* s = (const uint8_t*)text;
    Work w = {0};
    Bytes nb = {0};
    CpBuf cb = {0};
    if (len > 256) { /* the piece cache pays off on longer texts only */
        w.cache_mask = 4095;
        w.cache_slots = calloc(w.cache_mask + 1, sizeof *w.cache_slots);
    }
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        if (t->added_first[s[i]]) {
            const Added* hit = NULL;
            for (int k = 0; k < t->n_added; k++) { /* sorted longest first */
                const Added* a = &t->added[k];
                if (a->len && a->len <= len - i && memcmp(s + i, a->s, a->len) == 0) {
                    hit = a;
                    break;
                }
            }
            if (hit) {
                encode_segment(t, &w, s + seg, i - seg, &out, &nb, &cb);
                ids_add(&out, hit->id);
                i += hit->len;
                seg = i;
                continue;
            }
        }
        i++;
    }
    encode_segment(t, &w, s + seg, len - seg, &out, &nb, &cb);
    free(w.id);
    free(w.next);
    free(w.prev);
    free(w.rank);
    free(w.res);
    free(w.heap);
    free(w.bucket_head);
    free(w.bentries);
    free(w.rank_heap);
    free(w.sorted);
    free(w.cache_slots);
    free(w.cache_keys.p);
    free(w.cache_ids.p);
    free(w.entries);
    free(nb.p);
    free(cb.cp);
    free(cb.cc);
    if (out.oom) {
        free(out.p);
        return NULL;
    }
    *n_ids = (int)out.n;
    return out.p;
}

/* ------------------------------------------------------------------------------------------- */
/* Decoding                                                                                     */
/* ------------------------------------------------------------------------------------------- */

typedef struct {
    FILE* f;
    Bytes* b;
} Sink;

static void sink_put(Sink* k, const void* s, size_t n) {
    if (k->f) fwrite(s, 1, n, k->f);
    if (k->b) bytes_add(k->b, s, n);
}

static const uint8_t REPLACEMENT[3] = {0xEF, 0xBF, 0xBD};

/* Bytes a character with lead byte c needs in all (0: c cannot start one). */
static int utf8_need(uint8_t c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Whether c can be the k-th byte (k >= 1) of a character whose lead byte is lead. */
static int utf8_cont_ok(uint8_t lead, int k, uint8_t c) {
    if (k == 1) {
        if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;
        if (lead == 0xED) return c >= 0x80 && c <= 0x9F;
        if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;
        if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;
    }
    return (c & 0xC0) == 0x80;
}

/* Feeds bytes through the stream: complete characters are written, an invalid sequence (a maximal
 * subpart, as Rust's from_utf8_lossy and the W3C/Unicode recommendation) becomes one U+FFFD. */
static void stream_feed(Utf8Stream* st, const uint8_t* s, size_t n, Sink* k) {
    size_t run = 0; /* start of a run of ASCII/complete bytes written in one go */
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (st->n_pending == 0) {
            int need = utf8_need(c);
            if (need == 1) continue; /* ASCII: part of the run */
            sink_put(k, s + run, i - run);
            run = i + 1;
            if (need == 0) {
                sink_put(k, REPLACEMENT, 3);
            } else {
                st->pending[0] = c;
                st->n_pending = 1;
            }
            continue;
        }
        /* inside a character: run == i here */
        int need = utf8_need(st->pending[0]);
        if (utf8_cont_ok(st->pending[0], st->n_pending, c)) {
            st->pending[st->n_pending++] = c;
            if (st->n_pending == need) {
                sink_put(k, st->pending, (size_t)need);
                st->n_pending = 0;
            }
            run = i + 1;
        } else {
            sink_put(k, REPLACEMENT, 3);
            st->n_pending = 0;
            run = i;
            i--; /* this byte starts afresh */
        }
    }
    if (st->n_pending == 0) sink_put(k, s + run, n - run);
}

void tokenizer_print(const Tokenizer* t, Utf8Stream* s, int id, int show_special, FILE* out) {
    size_t len;
    const char* p = tokenizer_token(t, id, &len);
    if (!p || (!show_special && tokenizer_is_special(t, id))) return;
    Sink k = {out, NULL};
    stream_feed(s, (const uint8_t*)p, len, &k);
}

void utf8_stream_flush(Utf8Stream* s, FILE* out) {
    if (s->n_pending > 0 && out) fwrite(REPLACEMENT, 1, 3, out);
    s->n_pending = 0;
}

char* tokenizer_decode(const Tokenizer* t, const int* ids, int n, int skip_special, size_t* len) {
    Bytes b = {0};
    Utf8Stream st = {{0}, 0};
    Sink k = {NULL, &b};
    bytes_reserve(&b, 64);
    for (int i = 0; i < n; i++) {
        size_t l;
        const char* p = tokenizer_token(t, ids[i], &l);
        if (!p || (skip_special && tokenizer_is_special(t, ids[i]))) continue;
        stream_feed(&st, (const uint8_t*)p, l, &k);
    }
    if (st.n_pending) bytes_add(&b, REPLACEMENT, 3);
    bytes_add(&b, "", 1);
    if (b.oom) {
        free(b.p);
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = b.n - 1;
    return (char*)b.p;
}

/* ------------------------------------------------------------------------------------------- */
/* Helpers exposed for tests                                                                    */
/* ------------------------------------------------------------------------------------------- */

char* tokenizer_nfc(const char* s, size_t n, size_t* out_n) {
    Bytes b = {0};
    CpBuf cb = {0};
    size_t m;
    const uint8_t* r = nfc((const uint8_t*)s, n, &m, &b, &cb);
    char* out = b.oom ? NULL : malloc(m + 1);
    if (out) {
        if (m) memcpy(out, r, m);
        out[m] = 0;
    }
    free(b.p);
    free(cb.cp);
    free(cb.cc);
    if (out_n) *out_n = out ? m : 0;
    return out;
}

size_t tokenizer_next_piece(const char* s, size_t n, size_t i) {
    return next_piece((const uint8_t*)s, n, i, 1);
}
