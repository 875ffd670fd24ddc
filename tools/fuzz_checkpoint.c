/* fuzz_checkpoint.c: libFuzzer target for the checkpoint loader (not built by the Makefile).
 *
 *   clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -I. -o /tmp/fuzz_checkpoint \
 *       tools/fuzz_checkpoint.c model.c checkpoint.c $(find kernels tokenizer cli -name '*.c') -lm -lpthread
 *   /tmp/fuzz_checkpoint -max_total_time=600 CORPUS_DIR SEEDS_DIR
 *
 * SEEDS_DIR: small checkpoints written by export.py (tests/hf_model.py's tiny models in each
 * format), which libFuzzer mutates. Each input is written to a file and loaded as ./run loads a
 * checkpoint (transformer_load with a context of 16, with an fp32, fp16 or q8 KV cache by the
 * input's size); whatever loads also runs a two-token prefill, a decode
 * step, and its tokenizer section (tokenizer_new, an encode and a decode). Checks: no crash, no
 * sanitizer report, no leak; a file the loader refuses must come with a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "tokenizer/tokenizer.h"

static char path[64]; /* each input goes to this file, removed at exit */

static void remove_input(void) { unlink(path); }

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/fuzz_checkpoint.%d.bin", (int)getpid());
        atexit(remove_input);
    }
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    /* the KV cache's type by the input's size, so that one input always runs the same way */
    const TransformerOptions opt = {.threads = 1, .ctx = 16, .kv_type = (KVType)(size % 3)};
    Transformer t;
    char err[512] = "";
    if (transformer_load(&t, path, &opt, err, sizeof err) != 0) {
        if (!err[0]) abort(); /* refused without saying why */
        return 0;
    }
    const int prompt[2] = {0, 1 % t.config.vocab_size}, next = 2 % t.config.vocab_size;
    if (forward(&t, prompt, 2, 0, NULL) == NULL || forward(&t, &next, 1, 2, NULL) == NULL) abort();
    Tokenizer* tok = tokenizer_new(t.tokenizer_data, t.tokenizer_bytes, err, sizeof err);
    if (tok) {
        static const char text[] = "Hello, world! <|im_start|>user\n caf\xc3\xa9 123";
        int n = 0;
        int* ids = tokenizer_encode(tok, text, sizeof text - 1, &n);
        if (ids) {
            size_t len = 0;
            free(tokenizer_decode(tok, ids, n, 0, &len));
            free(ids);
        }
        tokenizer_free(tok);
    }
    transformer_free(&t);
    return 0;
}
