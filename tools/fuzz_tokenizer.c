/* fuzz_tokenizer.c: libFuzzer target for the encoder, decoder and NFC. `make fuzz-tokenizer`
 * builds it with clang (ASan and UBSan) and runs it FUZZ_SECONDS (default 60) on the shipped
 * model's tokenizer, or on another checkpoint's:
 *
 *   make fuzz-tokenizer FUZZ_SECONDS=600 FUZZ_CHECKPOINT=path/to/qwen3.bin
 *
 * TOK_SECTION (the program's one input): a checkpoint, whose tokenizer section it takes, or a bare
 * tokenizer section (QTOK, e.g. written with export.py's tokenizer_section()).
 * Checks: no crash or sanitizer report; every id is known; NFC is idempotent; the tokens' raw bytes
 * concatenated equal the input when the input has no added-token text and is already NFC.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "tokenizer/tokenizer.h"

static Tokenizer* tok;
static uint8_t* section;

static void load(void) {
    const char* path = getenv("TOK_SECTION");
    FILE* f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        fprintf(stderr, "set TOK_SECTION to a checkpoint or a tokenizer section file\n");
        abort();
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    section = malloc((size_t)n);
    if (fread(section, 1, (size_t)n, f) != (size_t)n) abort();
    fclose(f);
    const uint8_t* at = section;
    size_t bytes = (size_t)n;
    FileHeader h;
    if (bytes >= sizeof h && memcmp(section, CHECKPOINT_MAGIC, 4) == 0) { /* a checkpoint: its section */
        memcpy(&h, section, sizeof h);
        if (h.tokenizer_offset > bytes || h.tokenizer_bytes > bytes - h.tokenizer_offset) abort();
        at = section + h.tokenizer_offset;
        bytes = (size_t)h.tokenizer_bytes;
    }
    char err[256];
    tok = tokenizer_new(at, bytes, err, sizeof err);
    if (!tok) {
        fprintf(stderr, "%s\n", err);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (!tok) load();
    int n;
    int* ids = tokenizer_encode(tok, (const char*)data, size, &n);
    if (!ids) abort();
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t l;
        if (!tokenizer_token(tok, ids[i], &l)) abort();
        total += l;
    }
    size_t dl, n1, n2;
    char* dec = tokenizer_decode(tok, ids, n, 0, &dl);
    char* a = tokenizer_nfc((const char*)data, size, &n1);
    char* b = tokenizer_nfc(a, n1, &n2);
    if (n1 != n2 || memcmp(a, b, n1) != 0) abort(); /* NFC idempotent */
    if (!memchr(data, '<', size) && n1 == size && memcmp(a, data, size) == 0 && total != size) abort();
    Utf8Stream st = {{0}, 0, 0};
    FILE* null = fopen("/dev/null", "w");
    for (int i = 0; i < n; i++) tokenizer_print(tok, &st, ids[i], i & 1, null);
    utf8_stream_flush(&st, null);
    fclose(null);
    free(dec);
    free(a);
    free(b);
    free(ids);
    return 0;
}
