/* chat.h: Qwen3's chat template (ChatML with thinking, QWEN3.md section 5), the chat loop of
 * `./run MODEL -m chat`, and what generate (run.c) shares with it.
 *
 * Two ways to use the template:
 *   - chat_render: a whole conversation -> the exact string the Jinja template in
 *     tokenizer_config.json gives (no tools), including its removal of the thinking of assistant
 *     turns before the last user query. The chat loop renders every turn's prompt with it and runs
 *     only the tokens after the part the KV cache already holds.
 *   - chat_first_turn / chat_next_turn: the pieces of text to APPEND to what is already in the KV
 *     cache (`--keep-thinking`): earlier assistant turns keep their thinking in the cache.
 * Every function returns a malloc'ed NUL-terminated string (free it), or NULL when out of memory.
 */
#ifndef CHAT_H
#define CHAT_H

#include "model.h"
#include "sampler.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char* role;               /* "system", "user", "assistant" or "tool" */
    const char* content;            /* NULL is taken as "" */
    const char* reasoning_content;  /* assistant only; NULL: taken from <think>...</think> in content */
} ChatMessage;

/* The template applied to n messages (tools are not supported). add_generation_prompt appends
 * "<|im_start|>assistant\n", plus the empty think block "<think>\n\n</think>\n\n" when
 * enable_thinking is 0. */
char* chat_render(const ChatMessage* msgs, int n, int add_generation_prompt, int enable_thinking);

/* chat_render of [system,] user with add_generation_prompt. system NULL or "": no system turn
 * (Qwen3 has no default). */
char* chat_first_turn(const char* system, const char* user, int enable_thinking);

/* The text of a following turn, to append after the model's answer:
 *   [<|im_end|>] "\n<|im_start|>user\n" user "<|im_end|>\n<|im_start|>assistant\n" [empty think block]
 * close_answer = 1 puts the <|im_end|> that closes the previous answer first, for when that token
 * is not in the KV cache (the chat loop samples it and stops without running it). */
char* chat_next_turn(const char* user, int enable_thinking, int close_answer);

/* The options of chat mode: run.c's --help describes each. */
typedef struct {
    const char* system_prompt; /* NULL or "": none */
    const char* prompt;        /* -i: answer this one message; NULL: read them from stdin, one a line */
    int steps;                 /* at most this many tokens per answer; <= 0: until the context is full */
    int thinking, show_thinking, keep_thinking, verbose_prompt;
    const char* dump_logits;   /* NULL, or the file for every position's logits, in the order run */
} ChatOptions;

/* The chat. Each turn's prompt is chat_render of the conversation so far, tokenized whole; the KV
 * cache keeps the longest prefix it shares with the previous turn's tokens and only the rest is
 * run. Where the prompt would fill more than three quarters of the context, the oldest turns
 * (after the system prompt) are dropped first; a message too long even so is not sent. With
 * keep_thinking each turn's text is appended instead, and a full context ends the chat.
 *
 * When stdin is a terminal: a "> " prompt and a one-line hint (stderr); lines whose first word is
 * a command (/help lists them) are not sent; Ctrl-C stops the answer (what was printed stays in the
 * conversation and the cache); Ctrl-C twice in a row at the prompt, Ctrl-D or /bye leave. From a
 * pipe or with -i a Ctrl-C ends the chat with status 130. The dim attributes of the thinking are
 * reset on every way out, SIGTERM, SIGHUP and SIGQUIT included. Returns 0, 130, or 1 after an
 * error message on stderr; *n_generated: the tokens generated in the whole chat. */
int chat_main(Transformer* t, const Tokenizer* tok, Sampler* s, const ChatOptions* o, int* n_generated);

/* ---- Shared by generate (run.c) and chat; errors are one line on stderr. ---- */

/* --dump-logits: the file and room for one prefill chunk's rows. */
typedef struct {
    FILE* file; /* NULL: no dump */
    float* rows;
    const char* path;
} LogitsDump;

/* 0 (path NULL: no dump), or -1 after an error line. */
int logits_dump_open(LogitsDump* d, const char* path, const Transformer* t);
/* 0, or -1 after an error line when the file could not be written whole. */
int logits_dump_close(LogitsDump* d);

/* forward() of n tokens from position pos; with a dump, in chunks of max_batch rows whose logits
 * all go to the file. The last position's logits, or NULL after an error line. */
float* forward_dumped(Transformer* t, const int* ids, int n, int pos, LogitsDump* d);

int is_eos(const FileHeader* h, int id);
double now_seconds(void);

/* The line that ends a run: prompt tokens, prefill tok/s, generated tokens, decode tok/s. */
void print_speed(int n_prompt, double prefill_s, int n_generated, int n_decoded, double decode_s);

/* What a full context leaves the user to do, into buf: "a larger -c/--ctx allows more (the model
 * supports N)", or that the context is already the model's maximum. Returns buf. */
const char* context_advice(const Config* c, char* buf, size_t size);

/* --verbose-prompt's line on stderr: the label (a printf format), then the ids as " 1,2,3". */
void print_token_ids(const int* ids, int n, const char* label, ...) __attribute__((format(printf, 3, 4)));

#endif
