/* chat.h: the chat loop of `./run MODEL -m chat`. */
#ifndef CHAT_H
#define CHAT_H

#include "chat_template.h"
#include "generation.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer/tokenizer.h"

/* The options of chat mode: run.c's --help describes each. */
typedef struct {
    const char* system_prompt; /* NULL or "": none */
    const char* prompt;        /* -i: answer this one message; NULL: read them from stdin, one a line */
    int steps;                 /* at most this many tokens per answer; <= 0: until the context is full */
    int thinking, show_thinking, keep_thinking, verbose_prompt;
    const char* dump_logits;   /* NULL, or the file for every position's logits, in the order run */
    const char* checkpoint;    /* the model's file, which /save refuses to write over */
} ChatOptions;

/* The chat. Each turn's prompt is chat_render of the conversation so far, tokenized whole; the KV
 * cache keeps the longest prefix it shares with the previous turn's tokens and only the rest is
 * run. Where the prompt would fill more than three quarters of the context, the oldest turns
 * (after the system prompt) are dropped first; a message too long even so is not sent. With
 * keep_thinking each turn's text is appended instead, and a full context ends the chat.
 *
 * Each line is a message, but for lines whose first word is a command (/help lists them) and
 * messages of several lines between three quotes. When stdin is a terminal: a "> " prompt ("... "
 * inside such a message) and a one-line hint (stderr); Ctrl-C stops the answer (what was printed stays), or
 * between two chunks of a long prompt drops the message; Ctrl-C twice at the prompt, Ctrl-D or
 * /bye leave. From a pipe or with -i a Ctrl-C ends the chat with status 130. The thinking's dim
 * attribute is reset on every way out, SIGTERM, SIGHUP and SIGQUIT included, and while Ctrl-Z
 * stops the process. Returns 0, 130, or 1 after an error message; *n_generated: the tokens
 * generated in the whole chat. */
int chat_main(Transformer* t, const Tokenizer* tok, Sampler* s, const ChatOptions* o, int* n_generated);

#endif
