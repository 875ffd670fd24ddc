/* chat.h: Qwen3's chat template (ChatML with thinking, QWEN3.md section 5) and the chat loop of
 * `./run MODEL -m chat`.
 *
 * Two ways to use the template:
 *   - chat_render: a whole conversation -> the exact string the Jinja template in
 *     tokenizer_config.json gives (no tools), including its removal of the thinking of assistant
 *     turns before the last user query. Used by tests, and by anyone who re-prefills from scratch.
 *     The chat loop renders every turn's prompt with it and runs only the tokens after the part
 *     the KV cache already holds.
 *   - chat_first_turn / chat_next_turn: the pieces of text to APPEND to what is already in the KV
 *     cache (`--keep-thinking`): a multi-turn chat never re-processes anything, and earlier
 *     assistant turns keep their thinking in the cache (the template would drop it).
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

/* The text of the first turn: [system turn] + user turn + "<|im_start|>assistant\n" [+ empty think
 * block when enable_thinking is 0]. system NULL or "": no system turn (Qwen3 has no default). Equal
 * to chat_render of [system,] user with add_generation_prompt. */
char* chat_first_turn(const char* system, const char* user, int enable_thinking);

/* The text of a following turn, to append after the model's answer:
 *   [<|im_end|>] "\n<|im_start|>user\n" user "<|im_end|>\n<|im_start|>assistant\n" [empty think block]
 * close_answer = 1 puts the <|im_end|> that closes the previous answer first: use it when that token
 * is not in the KV cache (the usual loop samples <|im_end|> and stops without running it through
 * the model, or the answer was cut by the length limit). close_answer = 0 when <|im_end|> was
 * already processed. */
char* chat_next_turn(const char* user, int enable_thinking, int close_answer);

typedef struct {
    const char* system_prompt; /* NULL or "": none */
    const char* prompt;        /* -i TEXT: answer this one message and return; NULL: read the user's
                                  messages from stdin, one per line, until EOF or /bye (the
                                  commands: CHAT_HELP in chat.c) */
    int steps;                 /* at most this many tokens per answer; <= 0: until the context is full */
    int thinking;              /* 1: thinking mode (Qwen3's default); 0: no-think (empty think block) */
    int show_thinking;         /* 1: print the thinking (dim on a terminal); 0: hide it */
    int keep_thinking;         /* 1: append each turn to the cache (chat_next_turn), earlier
                                  thinking kept; 0: each turn's prompt is the template's */
    int verbose_prompt;        /* 1: print each turn's prompt ids and answer ids to stderr */
    const char* dump_logits;   /* NULL, or a file for the logits of every position run through the
                                  model, in order: per turn the prompt's new tokens, then the
                                  answer's (raw float32, vocab_size per row) */
    uint64_t seed;             /* the sampler's seed, printed at the end when seed_from_clock */
    int seed_from_clock;       /* 1: the seed came from the clock (no -s): say it, for a repeat */
} ChatOptions;

/* The interactive chat. Each turn's prompt is chat_render of the conversation so far (the
 * template's exact prompt: earlier answers without their thinking), tokenized whole; the KV cache
 * keeps the longest prefix it shares with the previous turn's tokens and only the rest is run (the
 * previous answer from where the template changed it, and the new message). Where the prompt
 * would fill more than three quarters of the context, the oldest turns (after the system prompt)
 * are dropped first; a message too long even so is not sent and the conversation stays as it was.
 * With keep_thinking each turn's text is appended instead (chat_first_turn / chat_next_turn), and
 * a full context ends the chat. Streams the answer to stdout.
 *
 * When stdin is a terminal: a "> " prompt and a one-line hint (stderr); lines whose first word is
 * a command (/help, /bye = /quit = /exit, /clear, /system TEXT, /save FILE) are not sent; Ctrl-C
 * stops the answer (what was printed stays in the conversation and the cache) and the prompt
 * returns; Ctrl-C twice in a row at the prompt, Ctrl-D or /bye leave. From a pipe or with -i a
 * Ctrl-C stops the answer and ends the chat with status 130. The dim attributes of the thinking
 * are reset on every way out, SIGTERM, SIGHUP and SIGQUIT included (the signal handlers are
 * restored on return). Returns 0, 130 after a Ctrl-C from a pipe or -i, or 1 after an error
 * message on stderr. */
int chat_main(Transformer* t, const Tokenizer* tok, Sampler* s, const ChatOptions* o);

/* What a full context leaves the user to do, into buf: "a larger -c/--ctx allows more (the model
 * supports N)", or that the context is already the model's maximum. Returns buf. */
const char* context_advice(const Config* c, char* buf, size_t size);

/* --verbose-prompt's line (chat and generate mode): label, then the ids as " 1,2,3" and a newline. */
void print_token_ids(FILE* out, const char* label, const int* ids, int n);

#endif
