/* tokenizer.h: Qwen3's byte-level BPE tokenizer (QWEN3.md section 4), read from the tokenizer
 * section of the checkpoint file (model.h has the file's layout).
 *
 * The section (written by export.py, read by tokenizer.c), its numbers little-endian:
 *   char   magic[4] = "QTOK"
 *   u32    n_vocab             BPE vocabulary: ids 0 .. n_vocab-1
 *   u32    n_merges
 *   u32    n_added             added tokens (<|im_start|>, <think>, ...)
 *   u32    flags               TOK_FLAG_* below
 *   u32    len, bytes          the pre-tokenizer's Split regex as written in tokenizer.json
 *   n_vocab times:    u32 len, bytes          the token's raw bytes (byte-level map undone)
 *   n_merges times:   u32 left, u32 right, u32 result   (token ids; listed in rank order, rank 0 first)
 *   n_added times:    u32 id, u32 special (0/1), u32 len, bytes (the content, UTF-8)
 *   u32    len, bytes          the chat template from tokenizer_config.json ("" if none)
 */
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum {
    TOK_FLAG_NFC = 1,          /* normalizer is NFC */
    TOK_FLAG_QWEN2_REGEX = 2,  /* the Split regex is exactly Qwen2/Qwen3's (tokenizer.c implements it) */
    TOK_FLAG_BYTE_LEVEL = 4,   /* byte-level pre-tokenizer and decoder */
};

typedef struct Tokenizer Tokenizer;

/* Parses the tokenizer section (data points into the mapped checkpoint and must outlive the
 * tokenizer). Returns NULL after writing one line describing the problem into err. */
Tokenizer* tokenizer_new(const uint8_t* data, size_t n, char* err, size_t errlen);
void tokenizer_free(Tokenizer* t);

/* Number of ids the tokenizer knows (BPE vocabulary + added tokens); 0 for a checkpoint
 * exported without a tokenizer. */
int tokenizer_size(const Tokenizer* t);

/* Encodes len bytes of UTF-8 text (added tokens such as <|im_start|> in the text become their
 * ids; no BOS). Returns a malloc'ed array of *n_ids ids (free it), or NULL when out of memory.
 * Invalid UTF-8 and NUL bytes are handled, never a crash. */
int* tokenizer_encode(const Tokenizer* t, const char* text, size_t len, int* n_ids);

/* The bytes of one token (an added token's content, or a vocabulary token's raw bytes); NULL with
 * *len = 0 for ids the tokenizer does not know. */
const char* tokenizer_token(const Tokenizer* t, int id, size_t* len);

/* 1 if id is an added token marked special (<|im_end|>, ...), else 0. */
int tokenizer_is_special(const Tokenizer* t, int id);

/* The id of the added token or vocabulary token whose content is exactly s, or -1. */
int tokenizer_find(const Tokenizer* t, const char* s);

/* Streaming decoder: holds back the bytes of an incomplete UTF-8 character until it is complete,
 * so the output never shows a partial character. */
typedef struct {
    unsigned char pending[8];
    int n_pending;
    int terminal; /* out is a terminal: control characters but tab and newline are left out */
} Utf8Stream;

/* Writes the bytes of token id to out through the stream (special tokens only when show_special
 * is nonzero); invalid sequences as U+FFFD. On a terminal (s->terminal) the C0 control bytes but
 * tab and newline, DEL and the C1 controls (U+0080-U+009F) are not written: a model's ESC, BEL or
 * CSI would drive the terminal. utf8_stream_flush writes what is still held (an
 * incomplete character at the end) as U+FFFD. */
void tokenizer_print(const Tokenizer* t, Utf8Stream* s, int id, int show_special, FILE* out);
void utf8_stream_flush(Utf8Stream* s, FILE* out);

/* The length in bytes (1-4) of the valid UTF-8 character at s (n bytes left), or 0 where s starts
 * none (a stray continuation byte, an overlong form, a surrogate, beyond U+10FFFF, cut short). */
int utf8_valid_length(const char* s, size_t n);

/* Decodes n ids into a malloc'ed, NUL-terminated string (free it): the tokens' bytes concatenated,
 * invalid UTF-8 replaced by U+FFFD as in the reference decoder, special tokens left out when
 * skip_special is nonzero, unknown ids contribute nothing. *len (if not NULL) gets the length
 * without the NUL. NULL when out of memory. */
char* tokenizer_decode(const Tokenizer* t, const int* ids, int n, int skip_special, size_t* len);

/* For tests: the Unicode NFC of n bytes of UTF-8 (invalid bytes kept as they are) as a malloc'ed,
 * NUL-terminated copy (free it) of length *out_n, NULL when out of memory; and the length in bytes
 * of the pre-tokenizer's piece (the Qwen2/Qwen3 Split regex) that starts at byte i < n of s. */
char* tokenizer_nfc(const char* s, size_t n, size_t* out_n);
size_t tokenizer_next_piece(const char* s, size_t n, size_t i);

#endif
