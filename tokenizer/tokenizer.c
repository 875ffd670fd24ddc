/* tokenizer.c: Qwen3's byte-level BPE tokenizer (QWEN3.md section 4), read from the tokenizer
 * section of the checkpoint (layout in tokenizer.h). Encoding, exactly as the reference (Rust
 * `tokenizers` with tokenizer.json):
 *   1. split off the added tokens (<|im_start|>, <think>, ...) in the raw text, leftmost-longest,
 *      special or not;
 *   2. NFC-normalise each remaining segment (Unicode 9.0 data, as the reference's normalizer),
 *      touching only the stretches around characters that NFC can change;
 *   3. pre-tokenize with a hand-written scanner equivalent to the Split regex
 *        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *      (one branch per alternative, in order; \s = Unicode White_Space; Unicode 16.0 classes, as
 *      the reference's regex engine);
 *   4. BPE on the token ids of each piece's bytes: repeatedly merge the adjacent pair of lowest
 *      rank, leftmost among equals (short pieces in an array, long ones with a heap: O(n log n));
 *   5. a per-call cache of short pieces (most words repeat) skips step 4 for repeated pieces.
 * No BOS is added. Each byte that is not valid UTF-8 (and NUL) is one unit of the "other" class
 * (like punctuation) encoded by its single-byte token, so decode(encode(x)) keeps it.
 */
#include "tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "unicode_tables.h"

/* Llama 3's Split regex: Qwen2's above with numbers in runs of up to three. */
static const char LLAMA3_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

#define NO_RANK UINT32_MAX

/* A slot of the merge hash; an empty one is all ones (left UINT32_MAX, rank NO_RANK). */
typedef struct {
    uint32_t left, right;
    uint32_t rank, result;
} MergeSlot;

typedef struct {
    const uint8_t* s;  /* its bytes (NULL: an unknown id) */
    uint32_t len;
    uint8_t special;   /* an added token marked special */
} Token;

typedef struct {
    const uint8_t* s;
    uint32_t len;
    int id;
} Added;

struct Tokenizer {
    int n_vocab, n_added, size;
    uint32_t flags;
    int max_digits;    /* 1 (Qwen2 regex) or 3 (Llama 3 regex) */
    int ignore_merges; /* a piece that is a vocabulary token is taken whole (Llama 3) */
    Token* tok;           /* [size] */
    int byte_id[256];     /* id of the single-byte token of each byte, -1 if none */
    MergeSlot* merges;
    uint32_t merge_mask;
    int32_t* vocab_slots; /* hash of token bytes -> id (vocabulary and added tokens), -1 empty */
    uint32_t vocab_mask;
    Added* added;         /* sorted longest first */
    uint8_t added_first[256];
};

/* ---- Small helpers ---- */

static uint32_t rd32(const uint8_t* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t hash_bytes(const uint8_t* s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h ^ (h >> 15);
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t p = 16;
    while (p < n && p < (1u << 30)) p <<= 1;
    return p;
}

/* The slot of the merge of the pair (a, b), or the empty slot where it goes. */
static inline MergeSlot* merge_slot(const Tokenizer* t, uint32_t a, uint32_t b) {
    uint32_t hash = (uint32_t)(((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull >> 32);
    for (uint32_t h = hash & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        MergeSlot* m = &t->merges[h];
        if (m->left == UINT32_MAX || (m->left == a && m->right == b)) return m;
    }
}

/* The rank of the merge of the pair (a, b), its result in *result; NO_RANK when there is none. */
static inline uint32_t merge_rank(const Tokenizer* t, int a, int b, uint32_t* result) {
    const MergeSlot* m = merge_slot(t, (uint32_t)a, (uint32_t)b);
    *result = m->result;
    return m->rank;
}

/* The id whose bytes are s[0..n), or -1 (after recording new_id as theirs when new_id >= 0). */
static int vocab_find(const Tokenizer* t, const uint8_t* s, size_t n, int new_id) {
    for (uint32_t h = hash_bytes(s, n) & t->vocab_mask;; h = (h + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slots[h];
        if (id < 0) {
            if (new_id >= 0) t->vocab_slots[h] = new_id;
            return -1;
        }
        if (t->tok[id].len == n && memcmp(t->tok[id].s, s, n) == 0) return id; /* the first one wins */
    }
}

/* ---- Loading ---- */

typedef struct {
    const uint8_t* p;
    size_t n, pos;
    int bad;
} Reader;

/* The next len bytes of the section; NULL (and r->bad set) when it ends first. */
static const uint8_t* r_bytes(Reader* r, size_t len) {
    if (r->bad || r->n - r->pos < len) {
        r->bad = 1;
        return NULL;
    }
    r->pos += len;
    return r->p + r->pos - len;
}

static uint32_t r_u32(Reader* r) {
    const uint8_t* p = r_bytes(r, 4);
    return p ? rd32(p) : 0;
}

static int cmp_added(const void* a, const void* b) {
    const Added* x = a;
    const Added* y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id - y->id;
}

/* Writes the message into err (when there is room for one) and returns -1. */
static int __attribute__((format(printf, 3, 4))) tok_error(char* err, size_t errlen, const char* fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Where the parts of the tokenizer section are, found by walking it once with every length
 * checked against the section's size; the tables are filled from them afterwards. */
typedef struct {
    uint32_t n_vocab, n_merges, n_added;
    const uint8_t* vocab;  /* n_vocab entries: u32 length, bytes */
    const uint8_t* merges; /* n_merges entries: u32 left, right, result */
    const uint8_t* added;  /* n_added entries: u32 id, special, length, bytes */
    int64_t size;          /* ids: the vocabulary and every added token's id */
} Section;

/* The header (whose Split regex picks the pre-tokenizer), then the vocabulary, the merges, the
 * added tokens and the chat template, which must fill the section exactly. */
static int read_section(Tokenizer* t, Reader* r, Section* sec, char* err, size_t errlen) {
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
    /* any regex but Llama 3's gets the Qwen2 scanner (export.py warns that encoding may differ) */
    if (regex_len == sizeof LLAMA3_REGEX - 1 && memcmp(regex, LLAMA3_REGEX, regex_len) == 0) {
        t->max_digits = 3;
        t->ignore_merges = 1; /* Llama 3's tokenizer.json has "ignore_merges": true */
    }
    sec->vocab = r->p + r->pos;
    for (uint32_t i = 0; i < sec->n_vocab; i++) r_bytes(r, r_u32(r));
    if (r->bad) return tok_error(err, errlen, "tokenizer section: truncated vocabulary");
    sec->merges = r_bytes(r, (size_t)sec->n_merges * 12);
    if (r->bad) return tok_error(err, errlen, "tokenizer section: truncated merges");
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
    r_bytes(r, r_u32(r)); /* the chat template: chat.c renders Qwen3's natively */
    if (r->bad) return tok_error(err, errlen, "tokenizer section: truncated chat template");
    if (r->pos != n) return tok_error(err, errlen, "tokenizer section: %zu unexpected bytes at its end", n - r->pos);
    return 0;
}

/* Fills the tables: each token's bytes (and the single-byte token of each byte, the first one
 * wins), the merge hash (left, right) -> (rank, result), the added tokens sorted longest first for
 * the split of step 1, and the hash of token bytes, added tokens first so tokenizer_find prefers
 * them. */
static int load_tables(Tokenizer* t, const Section* sec, char* err, size_t errlen) {
    t->n_vocab = (int)sec->n_vocab;
    t->n_added = (int)sec->n_added;
    t->size = (int)sec->size;
    t->tok = calloc((size_t)sec->size, sizeof *t->tok);
    t->added = calloc(sec->n_added ? sec->n_added : 1, sizeof *t->added);
    t->vocab_mask = pow2_at_least(((uint64_t)sec->n_vocab + sec->n_added) * 2) - 1;
    t->vocab_slots = malloc(((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slots);
    t->merge_mask = pow2_at_least((uint64_t)sec->n_merges * 2) - 1;
    t->merges = malloc(((size_t)t->merge_mask + 1) * sizeof *t->merges);
    if (!t->tok || !t->added || !t->vocab_slots || !t->merges)
        return tok_error(err, errlen, "tokenizer: out of memory");
    memset(t->vocab_slots, 0xff, ((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slots);
    memset(t->merges, 0xff, ((size_t)t->merge_mask + 1) * sizeof *t->merges);

    const uint8_t* p = sec->vocab;
    for (uint32_t i = 0; i < sec->n_vocab; i++) {
        t->tok[i] = (Token){p + 4, rd32(p), 0};
        if (t->tok[i].len == 1 && t->byte_id[p[4]] < 0) t->byte_id[p[4]] = (int)i;
        p += 4 + (size_t)t->tok[i].len;
    }
    for (uint32_t i = 0; i < sec->n_merges; i++) {
        const uint8_t* m = sec->merges + 12 * (size_t)i;
        uint32_t a = rd32(m), b = rd32(m + 4), c = rd32(m + 8);
        if (a >= sec->n_vocab || b >= sec->n_vocab || c >= sec->n_vocab)
            return tok_error(err, errlen,
                             "tokenizer section: merge %u (%u, %u -> %u) uses an id outside the vocabulary of %u",
                             i, a, b, c, sec->n_vocab);
        MergeSlot* slot = merge_slot(t, a, b);
        if (slot->left == UINT32_MAX) *slot = (MergeSlot){a, b, i, c}; /* a repeated pair keeps its lowest rank */
    }
    p = sec->added;
    for (uint32_t i = 0; i < sec->n_added; i++) {
        uint32_t id = rd32(p), special = rd32(p + 4), len = rd32(p + 8);
        t->added[i] = (Added){p + 12, len, (int)id};
        t->tok[id] = (Token){p + 12, len, special != 0};
        if (len) t->added_first[p[12]] = 1;
        p += 12 + (size_t)len;
    }
    qsort(t->added, sec->n_added, sizeof *t->added, cmp_added);
    for (int i = 0; i < t->n_added; i++) {
        const Token* a = &t->tok[t->added[i].id]; /* the last of the added tokens that share an id */
        vocab_find(t, a->s, a->len, t->added[i].id);
    }
    for (int i = 0; i < t->n_vocab; i++) vocab_find(t, t->tok[i].s, t->tok[i].len, i);
    return 0;
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
    if (read_section(t, &r, &sec, err, errlen) != 0 || load_tables(t, &sec, err, errlen) != 0) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

void tokenizer_free(Tokenizer* t) {
    if (!t) return;
    free(t->tok);
    free(t->added);
    free(t->vocab_slots);
    free(t->merges);
    free(t);
}

int tokenizer_size(const Tokenizer* t) { return t ? t->size : 0; }

const char* tokenizer_token(const Tokenizer* t, int id, size_t* len) {
    int known = t && id >= 0 && id < t->size && t->tok[id].s;
    if (len) *len = known ? t->tok[id].len : 0;
    return known ? (const char*)t->tok[id].s : NULL;
}

int tokenizer_is_special(const Tokenizer* t, int id) {
    return t && id >= 0 && id < t->size && t->tok[id].special;
}

int tokenizer_find(const Tokenizer* t, const char* s) {
    if (!t || !s || t->size == 0) return -1;
    return vocab_find(t, (const uint8_t*)s, strlen(s), -1);
}

/* ---- UTF-8 ---- */

/* A byte that is not part of a valid UTF-8 sequence decodes to INVALID_BASE + byte: it has no
 * Unicode properties (ut_props gives 0: the "other" class; no decomposition, combining class 0),
 * and is written back as that byte. */
#define INVALID_BASE 0x110000u

/* Bytes a character with lead byte c needs in all (0: c cannot start one). */
static int utf8_need(uint8_t c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Whether c can be the k-th byte (k >= 1) of a character whose lead byte is lead: the ranges
 * after E0, ED, F0 and F4 rule out overlong forms, surrogates and code points above U+10FFFF. */
static int utf8_cont_ok(uint8_t lead, int k, uint8_t c) {
    if (k == 1) {
        if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;
        if (lead == 0xED) return c >= 0x80 && c <= 0x9F;
        if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;
        if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;
    }
    return (c & 0xC0) == 0x80;
}

/* Decodes the character at s[i] (i < n); *l gets its length in bytes (1 for an invalid byte). */
static inline uint32_t utf8_next(const uint8_t* s, size_t n, size_t i, int* l) {
    int need = utf8_need(s[i]);
    *l = 1;
    if (need == 1) return s[i];
    if (need == 0 || n - i < (size_t)need) return INVALID_BASE + s[i];
    uint32_t c = s[i] & (0xFFu >> (need + 1));
    for (int k = 1; k < need; k++) {
        if (!utf8_cont_ok(s[i], k, s[i + k])) return INVALID_BASE + s[i];
        c = c << 6 | (s[i + k] & 0x3F);
    }
    *l = need;
    return c;
}

/* Writes c as UTF-8 (an invalid byte as itself) to o; returns the number of bytes. */
static int utf8_put(uint32_t c, uint8_t* o) {
    static const uint8_t lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
    if (c >= INVALID_BASE) {
        o[0] = (uint8_t)(c - INVALID_BASE);
        return 1;
    }
    int n = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    for (int i = n - 1; i > 0; i--, c >>= 6) o[i] = (uint8_t)(0x80 | (c & 0x3F));
    o[0] = (uint8_t)(lead[n] | c);
    return n;
}

/* ---- Growable arrays ---- */

/* An array of n elements (capacity cap) that grows by doubling; oom, once set by a failed
 * allocation, stays set and the array takes no more room. */
typedef struct {
    void* p;
    size_t n, cap;
    int oom;
} Vec;

/* Room for extra more elements of `size` bytes; 0 when out of memory. */
static int vec_reserve(Vec* v, size_t extra, size_t size) {
    if (v->oom) return 0;
    if (v->n + extra <= v->cap && v->p) return 1;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra) cap *= 2;
    void* p = realloc(v->p, cap * size);
    if (!p) {
        v->oom = 1;
        return 0;
    }
    v->p = p;
    v->cap = cap;
    return 1;
}

static void bytes_add(Vec* b, const void* s, size_t n) {
    if (!vec_reserve(b, n, 1)) return;
    if (n) memcpy((uint8_t*)b->p + b->n, s, n);
    b->n += n;
}

static inline void ids_add(Vec* v, int id) {
    if (v->n == v->cap && !vec_reserve(v, 1, sizeof(int))) return;
    ((int*)v->p)[v->n++] = id;
}

/* ---- NFC ---- */

typedef struct {
    uint32_t c;   /* code point (or INVALID_BASE + byte) */
    uint8_t ccc;  /* its canonical combining class */
} Mark;

/* Normalises the characters s[0..n) (n > 0: a stretch that starts at a "safe" character or at the
 * start of the segment, and ends before a safe character or at its end) and appends the result to
 * out; marks is scratch. */
static void nfc_stretch(const uint8_t* s, size_t n, Vec* out, Vec* marks) {
    /* each byte decomposes into at most UT_MAX_DECOMP characters */
    if (!vec_reserve(marks, n * UT_MAX_DECOMP + 1, sizeof(Mark))) {
        out->oom = 1;
        return;
    }
    Mark* c = marks->p;
    size_t m = 0;
    /* full canonical decomposition */
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t ch = utf8_next(s, n, i, &l);
        i += (size_t)l;
        uint32_t d[UT_MAX_DECOMP];
        int nd = ut_decompose(ch, d);
        for (int j = 0; j < nd; j++) c[m++] = (Mark){d[j], (uint8_t)ut_ccc(d[j])};
    }
    /* canonical ordering: stable sort of every run of non-zero combining classes */
    for (size_t i = 1; i < m; i++) {
        Mark x = c[i];
        size_t j = i;
        for (; x.ccc && j > 0 && c[j - 1].ccc > x.ccc; j--) c[j] = c[j - 1];
        c[j] = x;
    }
    /* canonical composition */
    size_t starter = 0, w = 1;
    int starter_ok = c[0].ccc == 0;
    int last = starter_ok ? 0 : 256;
    for (size_t i = 1; i < m; i++) {
        Mark x = c[i];
        uint32_t comp = (starter_ok && (last < x.ccc || last == 0)) ? ut_compose(c[starter].c, x.c) : 0;
        if (comp) {
            c[starter].c = comp;
            continue;
        }
        if (x.ccc == 0) {
            starter = w;
            starter_ok = 1;
        }
        last = x.ccc;
        c[w++] = x;
    }
    if (!vec_reserve(out, w * 4, 1)) return;
    for (size_t i = 0; i < w; i++) out->n += (size_t)utf8_put(c[i].c, (uint8_t*)out->p + out->n);
}

/* The end of the run of characters from s[j] on that are unsafe (unsafe = 1) or safe (0) for NFC;
 * *last gets the start of the run's last character (unchanged when the run is empty). */
static size_t nfc_run(const uint8_t* s, size_t n, size_t j, int unsafe, size_t* last) {
    while (j < n) {
        int l = 1;
        uint32_t ch = s[j] < 0x80 ? s[j] : utf8_next(s, n, j, &l); /* ASCII is safe */
        if (((ut_props(ch) & UT_UNSAFE) != 0) != unsafe) break;
        *last = j;
        j += (size_t)l;
    }
    return j;
}

/* NFC of s[0..n). Returns s itself when it is already NFC (no unsafe character), else out->p. */
static const uint8_t* nfc(const uint8_t* s, size_t n, size_t* out_n, Vec* out, Vec* marks) {
    size_t safe = 0, unused;                 /* safe: start of the last safe character (or 0) */
    size_t i = nfc_run(s, n, 0, 0, &safe);   /* the first unsafe character */
    if (i == n) {
        *out_n = n;
        return s;
    }
    out->n = 0;
    size_t done = 0;
    while (i < n) {
        /* a stretch from the last safe character before an unsafe one to the next safe one */
        bytes_add(out, s + done, safe - done);
        done = nfc_run(s, n, i, 1, &unused);
        nfc_stretch(s + safe, done - safe, out, marks);
        safe = done;
        i = nfc_run(s, n, done, 0, &safe);
    }
    bytes_add(out, s + done, n - done);
    *out_n = out->n;
    return out->p;
}

/* ---- Pre-tokenizer: the Split regex as a scanner ---- */

static inline int is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* The end of the run of characters from s[j] on that have one of the properties in mask (want 1)
 * or none of them (want 0). */
static size_t run_end(const uint8_t* s, size_t n, size_t j, unsigned mask, int want) {
    int l;
    while (j < n && ((ut_props(utf8_next(s, n, j, &l)) & mask) != 0) == want) j += (size_t)l;
    return j;
}

/* Length in bytes of the piece that starts at s[i] (i < n). */
static size_t next_piece(const uint8_t* s, size_t n, size_t i, int max_digits) {
    int l0, l;
    uint32_t c0 = utf8_next(s, n, i, &l0);
    unsigned p0 = ut_props(c0);
    const unsigned OTHER = UT_WS | UT_L | UT_N; /* [^\s\p{L}\p{N}] lacks all three */
    size_t j;

    /* 1. (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (c0 == '\'' && i + 1 < n && s[i + 1] < 0x80) { /* ASCII letters in either case */
        uint8_t a = s[i + 1] | 0x20, b = i + 2 < n && s[i + 2] < 0x80 ? s[i + 2] | 0x20 : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((b == 'e' && (a == 'r' || a == 'v')) || (a == 'l' && b == 'l')) return 3;
    }
    /* 2. [^\r\n\p{L}\p{N}]?\p{L}+ */
    j = i;
    if (p0 & UT_L) {
        j = i + (size_t)l0;
    } else if (!is_crlf(c0) && !(p0 & UT_N) && i + (size_t)l0 < n) {
        uint32_t c1 = utf8_next(s, n, i + (size_t)l0, &l);
        if (ut_props(c1) & UT_L) j = i + (size_t)l0 + (size_t)l;
    }
    if (j > i) return run_end(s, n, j, UT_L, 1) - i;
    /* 3. \p{N} (Llama 3: \p{N}{1,3}) */
    if (p0 & UT_N) {
        j = i + (size_t)l0;
        for (int d = 1; d < max_digits && j < n && (ut_props(utf8_next(s, n, j, &l)) & UT_N); d++) j += (size_t)l;
        return j - i;
    }
    /* 4. ' '?[^\s\p{L}\p{N}]+[\r\n]* */
    j = i;
    if (!(p0 & OTHER)) {
        j = i + (size_t)l0;
    } else if (c0 == ' ' && i + 1 < n) {
        uint32_t c1 = utf8_next(s, n, i + 1, &l);
        if (!(ut_props(c1) & OTHER)) j = i + 1 + (size_t)l;
    }
    if (j > i) {
        j = run_end(s, n, j, OTHER, 0);
        while (j < n && is_crlf(s[j])) j++;
        return j - i;
    }
    /* c0 is white space: find its run, the end of its last CR/LF and the start of its last character */
    size_t end_nl = 0, last = i;
    j = i;
    while (j < n) {
        uint32_t c = utf8_next(s, n, j, &l);
        if (!(ut_props(c) & UT_WS)) break;
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

/* ---- BPE ---- */

typedef struct {
    int id;           /* -1: merged into its left neighbour (heap method) */
    int prev, next;   /* neighbours in the list (heap method); -1: none */
    uint32_t rank;    /* array method: the rank of the pair (this, next) */
    uint32_t result;  /* array method: that merge's result */
} Symbol;

#define ARRAY_BPE_MAX 48   /* pieces up to this many bytes use the simple array method */
#define CACHE_MAX_PIECE 32 /* pieces up to this many bytes are cached */

/* A cached piece and its ids (key_len 0: empty). */
typedef struct {
    uint8_t key[CACHE_MAX_PIECE];
    uint8_t key_len, n_ids;
    int ids[CACHE_MAX_PIECE];
} CacheEntry;

/* The piece cache: open addressing over the entries themselves, sized from the text's length, that
 * takes no more pieces once half full (so probes stay short and always end). */
typedef struct {
    CacheEntry* slots;  /* NULL: no cache */
    uint32_t mask, used;
} Cache;

/* The scratch of one tokenizer_encode call, so that the tokenizer itself stays read-only. */
typedef struct {
    Vec sym, heap;  /* Symbol, Candidate; a piece of m symbols never holds more than 2m candidates */
    Vec nfc, marks;
    Cache cache;
} Work;

/* A candidate merge for the heap: its rank in the high half, the index of its left symbol in the
 * low half, so that the smallest number is the lowest rank, leftmost among equals. */
typedef uint64_t Candidate;

static void heap_push(Candidate* h, size_t* n, Candidate x) {
    size_t i = (*n)++;
    while (i > 0 && x < h[(i - 1) / 2]) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static Candidate heap_pop(Candidate* h, size_t* n) {
    Candidate top = h[0], x = h[--(*n)];
    size_t i = 0, c;
    while ((c = 2 * i + 1) < *n) {
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= x) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

/* Short pieces: an array of symbols with each adjacent pair's rank; after a merge only the two
 * neighbouring pairs are looked up again. */
static void bpe_array(const Tokenizer* t, Symbol* sym, int m, Vec* out) {
    for (int i = 0; i + 1 < m; i++) sym[i].rank = merge_rank(t, sym[i].id, sym[i + 1].id, &sym[i].result);
    while (m > 1) {
        int best = -1;
        uint32_t best_rank = NO_RANK;
        for (int i = 0; i + 1 < m; i++)
            if (sym[i].rank < best_rank) {
                best_rank = sym[i].rank;
                best = i;
            }
        if (best < 0) break;
        sym[best].id = (int)sym[best].result;
        memmove(&sym[best + 1], &sym[best + 2], (size_t)(m - best - 2) * sizeof *sym);
        m--;
        if (best > 0) sym[best - 1].rank = merge_rank(t, sym[best - 1].id, sym[best].id, &sym[best - 1].result);
        if (best + 1 < m) sym[best].rank = merge_rank(t, sym[best].id, sym[best + 1].id, &sym[best].result);
    }
    for (int i = 0; i < m; i++) ids_add(out, sym[i].id);
}

/* Pushes the candidate merge of sym[pos] with its right neighbour, if that pair has a merge. */
static inline void push_pair(const Tokenizer* t, const Symbol* sym, int pos, Candidate* heap, size_t* hn) {
    uint32_t result;
    if (pos < 0 || sym[pos].next < 0) return;
    uint32_t rank = merge_rank(t, sym[pos].id, sym[sym[pos].next].id, &result);
    if (rank != NO_RANK) heap_push(heap, hn, (Candidate)rank << 32 | (uint32_t)pos);
}

/* Long pieces: a linked list of symbols and a binary heap of candidate merges ordered by (rank,
 * position); a candidate whose symbols have changed since it was pushed is skipped. */
static void bpe_heap(const Tokenizer* t, Symbol* sym, Candidate* heap, int m, Vec* out) {
    size_t hn = 0;
    for (int i = 0; i < m; i++) {
        sym[i].prev = i - 1;
        sym[i].next = i + 1 < m ? i + 1 : -1;
    }
    for (int i = 0; i + 1 < m; i++) push_pair(t, sym, i, heap, &hn);
    while (hn > 0) {
        Candidate top = heap_pop(heap, &hn);
        int pos = (int)(uint32_t)top;
        Symbol* a = &sym[pos];
        if (a->id < 0 || a->next < 0) continue;
        Symbol* b = &sym[a->next];
        uint32_t result;
        if (merge_rank(t, a->id, b->id, &result) != top >> 32) continue; /* stale */
        a->id = (int)result;
        b->id = -1;
        a->next = b->next;
        if (b->next >= 0) sym[b->next].prev = pos;
        push_pair(t, sym, a->prev, heap, &hn);
        push_pair(t, sym, pos, heap, &hn);
    }
    for (int i = 0; i >= 0; i = sym[i].next) ids_add(out, sym[i].id);
}

/* BPE of the bytes s[0..n): one symbol per byte (a byte without a token is dropped), merged. */
static void bpe(const Tokenizer* t, Work* w, const uint8_t* s, size_t n, Vec* out) {
    if (!vec_reserve(&w->sym, n, sizeof(Symbol)) || !vec_reserve(&w->heap, 2 * n, sizeof(Candidate))) {
        out->oom = 1;
        return;
    }
    Symbol* sym = w->sym.p;
    int m = 0;
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] >= 0) sym[m++].id = t->byte_id[s[i]];
    if (m <= ARRAY_BPE_MAX) bpe_array(t, sym, m, out);
    else bpe_heap(t, sym, w->heap.p, m, out);
}

/* The entry of piece s[0..n), or the empty slot where it goes. */
static CacheEntry* cache_slot(const Cache* c, const uint8_t* s, size_t n) {
    for (uint32_t h = hash_bytes(s, n) & c->mask;; h = (h + 1) & c->mask) {
        CacheEntry* e = &c->slots[h];
        if (e->key_len == 0 || (e->key_len == n && memcmp(e->key, s, n) == 0)) return e;
    }
}

/* Encodes one pre-tokenized piece. */
static void encode_piece(const Tokenizer* t, Work* w, const uint8_t* s, size_t n, Vec* out) {
    if (n == 1) {
        if (t->byte_id[s[0]] >= 0) ids_add(out, t->byte_id[s[0]]);
        return;
    }
    if (t->ignore_merges) {
        int id = vocab_find(t, s, n, -1);
        if (id >= 0 && id < t->n_vocab) {
            ids_add(out, id);
            return;
        }
    }
    CacheEntry* ce = NULL;
    if (w->cache.slots && n <= CACHE_MAX_PIECE) {
        ce = cache_slot(&w->cache, s, n);
        if (ce->key_len) {
            for (int i = 0; i < ce->n_ids; i++) ids_add(out, ce->ids[i]);
            return;
        }
    }
    size_t before = out->n;
    bpe(t, w, s, n, out);
    if (ce && !out->oom && w->cache.used * 2 < w->cache.mask) {
        memcpy(ce->key, s, n);
        ce->key_len = (uint8_t)n;
        ce->n_ids = (uint8_t)(out->n - before);
        memcpy(ce->ids, (int*)out->p + before, ce->n_ids * sizeof *ce->ids);
        w->cache.used++;
    }
}

static void encode_segment(const Tokenizer* t, Work* w, const uint8_t* s, size_t n, Vec* out) {
    if (n == 0) return;
    if (t->flags & TOK_FLAG_NFC) s = nfc(s, n, &n, &w->nfc, &w->marks);
    if (w->nfc.oom) {
        out->oom = 1;
        return;
    }
    for (size_t i = 0; i < n;) {
        size_t len = next_piece(s, n, i, t->max_digits);
        encode_piece(t, w, s + i, len, out);
        i += len;
    }
}

/* Where the first added token in s[from..len) starts (the longest of those that start at the
 * same byte goes in *hit); len, with *hit NULL, when there is none. */
static size_t next_added(const Tokenizer* t, const uint8_t* s, size_t len, size_t from, const Added** hit) {
    for (size_t i = from; i < len; i++) {
        if (!t->added_first[s[i]]) continue;
        for (int k = 0; k < t->n_added; k++) { /* sorted longest first */
            const Added* a = &t->added[k];
            if (a->len && a->len <= len - i && memcmp(s + i, a->s, a->len) == 0) {
                *hit = a;
                return i;
            }
        }
    }
    *hit = NULL;
    return len;
}

int* tokenizer_encode(const Tokenizer* t, const char* text, size_t len, int* n_ids) {
    *n_ids = 0;
    Vec out = {0};
    if (!vec_reserve(&out, len / 3 + 16, sizeof(int))) return NULL;
    if (!t || t->size == 0 || !text) return out.p; /* no tokenizer: no ids */
    const uint8_t* s = (const uint8_t*)text;
    Work w = {0};
    if (len > 256) { /* the cache pays off on longer texts only; 4096 to 131072 slots */
        size_t slots = len / 8 < 131072 ? len / 8 : 131072;
        w.cache.mask = pow2_at_least(slots > 4096 ? slots : 4096) - 1;
        w.cache.slots = calloc((size_t)w.cache.mask + 1, sizeof *w.cache.slots);
    }
    for (size_t seg = 0;;) {
        const Added* hit;
        size_t i = next_added(t, s, len, seg, &hit);
        encode_segment(t, &w, s + seg, i - seg, &out);
        if (!hit) break;
        ids_add(&out, hit->id);
        seg = i + hit->len;
    }
    free(w.sym.p);
    free(w.heap.p);
    free(w.cache.slots);
    free(w.nfc.p);
    free(w.marks.p);
    if (out.oom) {
        free(out.p);
        return NULL;
    }
    *n_ids = (int)out.n;
    return out.p;
}

/* ---- Decoding ---- */

static const uint8_t REPLACEMENT[3] = {0xEF, 0xBF, 0xBD};

static void put(FILE* out, const void* p, size_t n) {
    if (out) fwrite(p, 1, n, out);
}

/* Complete characters are written as they are, an invalid sequence (a maximal subpart, as Rust's
 * from_utf8_lossy and the W3C/Unicode recommendation) as one U+FFFD. */
void tokenizer_print(const Tokenizer* t, Utf8Stream* st, int id, int show_special, FILE* out) {
    size_t n;
    const uint8_t* s = (const uint8_t*)tokenizer_token(t, id, &n);
    if (!s || (!show_special && tokenizer_is_special(t, id))) return;
    for (size_t i = 0; i < n; i++) {
        if (st->n_pending > 0 && !utf8_cont_ok(st->pending[0], st->n_pending, s[i])) {
            put(out, REPLACEMENT, 3); /* and s[i] starts afresh */
            st->n_pending = 0;
        }
        if (st->n_pending == 0 && utf8_need(s[i]) == 0) {
            put(out, REPLACEMENT, 3);
            continue;
        }
        if (st->terminal && st->n_pending == 0 && (s[i] < 0x20 || s[i] == 0x7f) && s[i] != '\t' && s[i] != '\n')
            continue;
        st->pending[st->n_pending++] = s[i];
        if (st->n_pending == utf8_need(st->pending[0])) {
            const int c1 = st->n_pending == 2 && st->pending[0] == 0xC2 && st->pending[1] < 0xA0; /* U+0080-009F */
            if (!(st->terminal && c1)) put(out, st->pending, (size_t)st->n_pending);
            st->n_pending = 0;
        }
    }
}

int utf8_valid_length(const char* s, size_t n) {
    int l;
    return n > 0 && utf8_next((const uint8_t*)s, n, 0, &l) < INVALID_BASE ? l : 0;
}

void utf8_stream_flush(Utf8Stream* s, FILE* out) {
    if (s->n_pending > 0) put(out, REPLACEMENT, 3);
    s->n_pending = 0;
}

char* tokenizer_decode(const Tokenizer* t, const int* ids, int n, int skip_special, size_t* len) {
    char* text = NULL;
    size_t size = 0;
    FILE* f = open_memstream(&text, &size); /* text stays NUL-terminated */
    if (f) {
        Utf8Stream st = {{0}, 0, 0};
        for (int i = 0; i < n; i++) tokenizer_print(t, &st, ids[i], !skip_special, f);
        utf8_stream_flush(&st, f);
        int failed = ferror(f);
        if (fclose(f) != 0 || failed) {
            free(text);
            text = NULL;
            size = 0;
        }
    }
    if (len) *len = size;
    return text;
}

/* ---- Helpers exposed for tests ---- */

char* tokenizer_nfc(const char* s, size_t n, size_t* out_n) {
    Vec b = {0}, marks = {0};
    size_t m;
    const uint8_t* r = nfc((const uint8_t*)s, n, &m, &b, &marks);
    char* out = b.oom ? NULL : malloc(m + 1);
    if (out) {
        if (m) memcpy(out, r, m);
        out[m] = 0;
    }
    free(b.p);
    free(marks.p);
    if (out_n) *out_n = out ? m : 0;
    return out;
}

size_t tokenizer_next_piece(const char* s, size_t n, size_t i) {
    return next_piece((const uint8_t*)s, n, i, 1);
}
