/* chat.c: Qwen3's chat template (QWEN3.md section 5) rendered natively, and the chat loop. */
#include "chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------- */
/* String builder                                                                               */
/* ------------------------------------------------------------------------------------------- */

typedef struct {
    char* p;
    size_t n, cap;
    int oom;
} Str;

static void sadd(Str* s, const char* t, size_t n) {
    if (s->oom) return;
    if (s->cap - s->n < n + 1) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap - s->n < n + 1) cap *= 2;
        char* p = realloc(s->p, cap);
        if (!p) {
            s->oom = 1;
            return;
        }
        s->p = p;
        s->cap = cap;
    }
    if (n) memcpy(s->p + s->n, t, n);
    s->n += n;
    s->p[s->n] = 0;
}

static void scat(Str* s, const char* t) { sadd(s, t ? t : "", t ? strlen(t) : 0); }

static char* sdone(Str* s) {
    if (s->oom) {
        free(s->p);
        return NULL;
    }
    if (!s->p) sadd(s, "", 0);
    if (s->oom) {
        free(s->p);
        return NULL;
    }
    return s->p;
}

/* A view of part of a string. */
typedef struct {
    const char* p;
    size_t n;
} View;

static View lstrip_nl(View v) {
    while (v.n && v.p[0] == '\n') v.p++, v.n--;
    return v;
}
static View rstrip_nl(View v) {
    while (v.n && v.p[v.n - 1] == '\n') v.n--;
    return v;
}

/* Last occurrence of needle in v, or NULL. */
static const char* find_last(View v, const char* needle) {
    size_t k = strlen(needle);
    if (k > v.n) return NULL;
    for (size_t i = v.n - k + 1; i-- > 0;)
        if (memcmp(v.p + i, needle, k) == 0) return v.p + i;
    return NULL;
}

static int starts_with(const char* s, const char* pre) { return strncmp(s, pre, strlen(pre)) == 0; }
static int ends_with(const char* s, const char* suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && memcmp(s + a - b, suf, b) == 0;
}

static const char THINK_EMPTY[] = "<think>\n\n</think>\n\n";

/* ------------------------------------------------------------------------------------------- */
/* Template                                                                                     */
/* ------------------------------------------------------------------------------------------- */

char* chat_render(const ChatMessage* msgs, int n, int add_generation_prompt, int enable_thinking) {
    Str s = {0};
    if (n > 0 && msgs[0].role && strcmp(msgs[0].role, "system") == 0) {
        scat(&s, "<|im_start|>system\n");
        scat(&s, msgs[0].content);
        scat(&s, "<|im_end|>\n");
    }
    /* the last user message that is not a tool response wrapper */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        const char* c = msgs[i].content ? msgs[i].content : "";
        if (msgs[i].role && strcmp(msgs[i].role, "user") == 0 &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        const char* role = msgs[i].role ? msgs[i].role : "";
        const char* content = msgs[i].content ? msgs[i].content : "";
        if (strcmp(role, "user") == 0 || (strcmp(role, "system") == 0 && i > 0)) {
            scat(&s, "<|im_start|>");
            scat(&s, role);
            scat(&s, "\n");
            scat(&s, content);
            scat(&s, "<|im_end|>\n");
        } else if (strcmp(role, "assistant") == 0) {
            View c = {content, strlen(content)};
            View r = {"", 0};
            if (msgs[i].reasoning_content) {
                r = (View){msgs[i].reasoning_content, strlen(msgs[i].reasoning_content)};
            } else {
                const char* close_last = find_last(c, "</think>");
                if (close_last) {
                    const char* close_first = strstr(content, "</think>");
                    View before = rstrip_nl((View){content, (size_t)(close_first - content)});
                    const char* open = find_last(before, "<think>");
                    if (open) before = (View){open + 7, (size_t)(before.p + before.n - (open + 7))};
                    r = lstrip_nl(before);
                    c = lstrip_nl((View){close_last + 8, strlen(close_last + 8)});
                }
            }
            scat(&s, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || r.n > 0)) {
                View rs = rstrip_nl(lstrip_nl(r));
                scat(&s, "<think>\n");
                sadd(&s, rs.p, rs.n);
                scat(&s, "\n</think>\n\n");
                c = lstrip_nl(c);
            }
            sadd(&s, c.p, c.n);
            scat(&s, "<|im_end|>\n");
        } else if (strcmp(role, "tool") == 0) {
            if (i == 0 || !msgs[i - 1].role || strcmp(msgs[i - 1].role, "tool") != 0) scat(&s, "<|im_start|>user");
            scat(&s, "\n<tool_response>\n");
            scat(&s, content);
            scat(&s, "\n</tool_response>");
            if (i == n - 1 || !msgs[i + 1].role || strcmp(msgs[i + 1].role, "tool") != 0) scat(&s, "<|im_end|>\n");
        }
        /* other roles: the template writes nothing */
    }
    if (add_generation_prompt) {
        scat(&s, "<|im_start|>assistant\n");
        if (!enable_thinking) scat(&s, THINK_EMPTY);
    }
    return sdone(&s);
}

char* chat_first_turn(const char* system, const char* user, int enable_thinking) {
    ChatMessage m[2];
    int n = 0;
    if (system && system[0]) m[n++] = (ChatMessage){"system", system, NULL};
    m[n++] = (ChatMessage){"user", user, NULL};
    return chat_render(m, n, 1, enable_thinking);
}

char* chat_next_turn(const char* user, int enable_thinking, int close_answer) {
    Str s = {0};
    if (close_answer) scat(&s, "<|im_end|>");
    scat(&s, "\n<|im_start|>user\n");
    scat(&s, user);
    scat(&s, "<|im_end|>\n<|im_start|>assistant\n");
    if (!enable_thinking) scat(&s, THINK_EMPTY);
    return sdone(&s);
}

/* ------------------------------------------------------------------------------------------- */
/* The chat loop                                                                                */
/* ------------------------------------------------------------------------------------------- */

/* Reads one line from f (without its newline) into a malloc'ed string; NULL at EOF. */
static char* read_line(FILE* f) {
    Str s = {0};
    int c, any = 0;
    while ((c = fgetc(f)) != EOF) {
        any = 1;
        if (c == '\n') break;
        char ch = (char)c;
        sadd(&s, &ch, 1);
    }
    if (!any) return NULL;
    if (s.n && s.p[s.n - 1] == '\r') s.p[--s.n] = 0;
    return sdone(&s);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char* context_advice(const Config* c, char* buf, size_t size) {
    if (c->seq_len < c->max_seq_len)
        snprintf(buf, size, "a larger -c/--ctx allows more (the model supports %d)", c->max_seq_len);
    else
        snprintf(buf, size, "%d is the model's maximum", c->max_seq_len);
    return buf;
}

void print_token_ids(FILE* out, const char* label, const int* ids, int n) {
    fputs(label, out);
    for (int i = 0; i < n; i++) fprintf(out, "%s%d", i ? "," : " ", ids[i]);
    fputc('\n', out);
}

/* The conversation as the template takes it, each message's text owned here. */
typedef struct {
    ChatMessage* m;
    int n, cap;
} Conversation;

/* Appends a message whose content (malloc'ed, NULL = out of memory) the conversation then owns;
 * 0, or -1 when out of memory. */
static int conversation_add(Conversation* c, const char* role, char* content) {
    if (!content) return -1;
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        ChatMessage* m = realloc(c->m, (size_t)cap * sizeof *m);
        if (!m) {
            free(content);
            return -1;
        }
        c->m = m;
        c->cap = cap;
    }
    c->m[c->n++] = (ChatMessage){role, content, NULL};
    return 0;
}

/* The index of the first message after the system prompt (0 or 1). */
static int conversation_first(const Conversation* c) { return c->n && strcmp(c->m[0].role, "system") == 0; }

/* Drops every message after the system prompt. */
static void conversation_clear(Conversation* c) {
    const int first = conversation_first(c);
    for (int i = first; i < c->n; i++) free((char*)c->m[i].content);
    c->n = first;
}

/* Drops the oldest turn after the system prompt: the oldest user message and the answer after it.
 * Returns 0 when only the last user message is left (nothing to drop). */
static int conversation_drop_oldest(Conversation* c) {
    const int first = conversation_first(c);
    int end = first + 1;
    while (end < c->n - 1 && strcmp(c->m[end].role, "user") != 0) end++;
    if (end >= c->n) return 0;
    for (int i = first; i < end; i++) free((char*)c->m[i].content);
    memmove(c->m + first, c->m + end, (size_t)(c->n - end) * sizeof *c->m);
    c->n -= end - first;
    return 1;
}

/* The template's prompt for the conversation, as token ids (malloc'ed; NULL when out of memory). */
static int* conversation_ids(const Conversation* c, const Tokenizer* tok, int thinking, int* n) {
    char* text = chat_render(c->m, c->n, 1, thinking);
    int* ids = text ? tokenizer_encode(tok, text, strlen(text), n) : NULL;
    free(text);
    return ids;
}

/* Drops the last message (a user message that did not fit). */
static void conversation_drop_last(Conversation* c) {
    if (c->n > conversation_first(c)) free((char*)c->m[--c->n].content);
}

static void conversation_free(Conversation* c) {
    for (int i = 0; i < c->n; i++) free((char*)c->m[i].content);
    free(c->m);
}

/* forward() of n tokens from position pos; with dump, in chunks of max_batch rows whose logits all
 * go to the file (rows: scratch for max_batch of them). The last position's logits, or NULL after
 * an error message. */
static float* run_tokens(Transformer* t, const int* ids, int n, int pos, FILE* dump, const char* dump_path,
                         float* rows) {
    const int V = t->config.vocab_size, max_batch = t->state.max_batch;
    float* logits = NULL;
    for (int i = 0; i < n;) {
        const int nb = dump && n - i > max_batch ? max_batch : n - i;
        logits = forward(t, ids + i, nb, pos + i, dump ? rows : NULL);
        if (!logits) {
            fprintf(stderr, "chat: forward pass failed\n");
            return NULL;
        }
        if (dump && fwrite(rows, sizeof(float), (size_t)nb * V, dump) != (size_t)nb * V) {
            fprintf(stderr, "chat: %s: write failed\n", dump_path);
            return NULL;
        }
        i += nb;
    }
    return logits;
}

int chat_main(Transformer* t, const Tokenizer* tok, Sampler* s, const ChatOptions* o) {
    if (!tok || tokenizer_size(tok) == 0) {
        fprintf(stderr, "chat: the checkpoint has no tokenizer\n");
        return 1;
    }
    const int V = t->config.vocab_size, seq_len = t->config.seq_len;
    const int im_end = tokenizer_find(tok, "<|im_end|>");
    /* The template is Qwen's ChatML (chat_render): a model whose tokenizer lacks its tokens (a Llama
     * export, say) would see them as plain text. */
    if (tokenizer_find(tok, "<|im_start|>") < 0 || im_end < 0) {
        fprintf(stderr, "chat: the checkpoint's tokenizer has no <|im_start|> / <|im_end|> tokens, so it has "
                        "no ChatML chat template; use generate mode (-i TEXT)\n");
        return 1;
    }
    const int think_open = tokenizer_find(tok, "<think>");
    const int think_close = tokenizer_find(tok, "</think>");
    const int interactive_in = isatty(fileno(stdin));
    const int color = isatty(fileno(stdout));
    int* history = malloc(((size_t)seq_len + 1) * sizeof(int));
    if (!history) {
        fprintf(stderr, "chat: out of memory\n");
        return 1;
    }
    FILE* dump = NULL;
    float* dump_rows = NULL;
    if (o->dump_logits) {
        dump = fopen(o->dump_logits, "wb");
        const int open_errno = errno;
        dump_rows = malloc((size_t)t->state.max_batch * V * sizeof(float));
        if (!dump || !dump_rows) {
            if (dump) fprintf(stderr, "chat: out of memory\n");
            else fprintf(stderr, "chat: %s: cannot open for writing: %s\n", o->dump_logits, strerror(open_errno));
            if (dump) fclose(dump);
            free(dump_rows);
            free(history);
            return 1;
        }
    }
    Conversation conv = {0};
    int pos = 0, status = 0, turn = 0;
    if (o->system_prompt && o->system_prompt[0] && conversation_add(&conv, "system", strdup(o->system_prompt)) != 0) {
        fprintf(stderr, "chat: out of memory\n");
        status = 1;
        goto done;
    }
    for (;;) {
        char* user;
        if (o->prompt) {
            if (turn > 0) break;
            user = strdup(o->prompt);
        } else {
            if (interactive_in) {
                fputs(turn ? "\n> " : "> ", stderr);
                fflush(stderr);
            }
            user = read_line(stdin);
            if (!user) {
                if (interactive_in) fputc('\n', stderr); /* Ctrl-D: end the prompt's line */
                break;
            }
            if (strcmp(user, "/bye") == 0) {
                free(user);
                break;
            }
            if (strcmp(user, "/clear") == 0) { /* a new conversation; the system prompt stays */
                free(user);
                conversation_clear(&conv);
                if (o->keep_thinking) pos = 0, turn = 0; /* the next turn starts the cache again */
                fprintf(stderr, "chat: the conversation is cleared\n");
                continue;
            }
            if (!user[strspn(user, " \t\r\v\f")]) { /* an empty or blank line is no message */
                free(user);
                continue;
            }
        }
        if (!user) {
            fprintf(stderr, "chat: out of memory\n");
            status = 1;
            break;
        }
        int n = 0, *ids;
        if (o->keep_thinking) { /* the previous answer's <|im_end|> was sampled, not run: close_answer */
            char* text = turn == 0 ? chat_first_turn(o->system_prompt, user, o->thinking)
                                   : chat_next_turn(user, o->thinking, 1);
            free(user);
            ids = text ? tokenizer_encode(tok, text, strlen(text), &n) : NULL;
            free(text);
        } else {
            ids = conversation_add(&conv, "user", user) == 0 ? conversation_ids(&conv, tok, o->thinking, &n) : NULL;
            /* With the context three quarters full the oldest turns leave the conversation (the
             * system prompt stays), so that a quarter is left for the answer. */
            int dropped = 0;
            while (ids && n > seq_len - seq_len / 4 && conversation_drop_oldest(&conv)) {
                free(ids);
                ids = conversation_ids(&conv, tok, o->thinking, &n);
                dropped++;
            }
            if (dropped)
                fprintf(stderr, "chat: the context (%d tokens) is nearly full: the oldest %d turn%s left the conversation\n",
                        seq_len, dropped, dropped > 1 ? "s" : "");
        }
        if (!ids) {
            fprintf(stderr, "chat: out of memory\n");
            status = 1;
            break;
        }
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= V) {
                fprintf(stderr, "chat: the tokenizer gave id %d, outside the model's vocabulary of %d\n", ids[i], V);
                free(ids);
                status = 1;
                goto done;
            }
        /* Where the new tokens go: after the cache (keep_thinking), or after the longest prefix the
         * cache shares with this prompt (the previous turn's prompt, then the previous answer up to
         * where the template drops its thinking or tokenizes its text otherwise). At least the
         * prompt's last token is run: its logits give the answer's first token. */
        int start = pos;
        if (!o->keep_thinking) {
            start = 0;
            while (start < pos && start < n && history[start] == ids[start]) start++;
            if (start == n) start = n - 1;
        }
        const int* run_ids = o->keep_thinking ? ids : ids + start;
        const int n_run = o->keep_thinking ? n : n - start;
        if (start + n_run >= seq_len) {
            /* At a terminal the message is not sent and the chat goes on; from a pipe or -i it is
             * an error, so that a script does not go on with a conversation missing a turn. */
            const int reject = interactive_in && !o->prompt;
            char advice[80];
            fprintf(stderr, "chat: this turn needs %d tokens of context, more than the %d there are; %s%s\n",
                    start + n_run + 1, seq_len, context_advice(&t->config, advice, sizeof advice),
                    reject ? " (the message was not sent)" : "");
            free(ids);
            if (reject) {
                if (!o->keep_thinking) conversation_drop_last(&conv);
                continue;
            }
            status = 1;
            break;
        }
        const double t_prompt = now_s();
        float* logits = run_tokens(t, run_ids, n_run, start, dump, o->dump_logits, dump_rows);
        if (!logits) {
            free(ids);
            status = 1;
            break;
        }
        memcpy(history + start, run_ids, (size_t)n_run * sizeof(int));
        pos = start + n_run;
        free(ids);
        if (o->verbose_prompt) {
            char label[96];
            snprintf(label, sizeof label, "chat: prompt of %d tokens, %d of them already in the KV cache:", pos, start);
            print_token_ids(stderr, label, history, pos);
        }
        const int answer_start = pos;

        /* the answer */
        Utf8Stream st = {{0}, 0};
        int in_think = 0, after_think = 0, generated = 0;
        double t0 = now_s();
        const double prompt_s = t0 - t_prompt;
        for (;;) {
            int next = sampler_sample(s, logits, history, pos);
            int eos = next == im_end;
            for (uint32_t k = 0; k < t->header.n_eos && k < MAX_EOS_IDS; k++) eos |= next == t->header.eos_ids[k];
            if (eos) break;
            generated++;
            if (next == think_open && think_open >= 0) {
                in_think = 1;
                if (o->show_thinking) {
                    if (color) fputs("\033[2m", stdout);
                    tokenizer_print(tok, &st, next, 0, stdout);
                }
            } else if (next == think_close && think_close >= 0) {
                in_think = 0;
                after_think = 1;
                if (o->show_thinking) {
                    tokenizer_print(tok, &st, next, 0, stdout);
                    utf8_stream_flush(&st, stdout);
                    if (color) fputs("\033[0m", stdout);
                }
            } else if (in_think) {
                if (o->show_thinking) tokenizer_print(tok, &st, next, 0, stdout);
            } else {
                size_t len;
                const char* p = tokenizer_token(tok, next, &len);
                /* hidden thinking: also drop the blank lines that separate it from the answer */
                if (after_think && !o->show_thinking && p && len && strspn(p, "\n") == len) continue;
                after_think = 0;
                tokenizer_print(tok, &st, next, 0, stdout);
            }
            fflush(stdout);
            if (ferror(stdout)) break; /* nobody reads the answer: reported below */
            if (pos >= seq_len) { /* no room to keep this token */
                if (o->keep_thinking) {
                    char advice[80];
                    fprintf(stderr, "\nchat: the context is full (%d tokens) and --keep-thinking cannot drop "
                                    "earlier turns: the chat ends here; %s\n", seq_len,
                            context_advice(&t->config, advice, sizeof advice));
                    status = 1;
                } else {
                    fprintf(stderr, "\nchat: the context is full (%d tokens): the answer stops here%s\n", seq_len,
                            o->prompt ? "" : ", the next turn drops the oldest turns");
                }
                break;
            }
            history[pos] = next;
            logits = run_tokens(t, &next, 1, pos, dump, o->dump_logits, dump_rows);
            if (!logits) {
                status = 1;
                break;
            }
            pos++;
            if (o->steps > 0 && generated >= o->steps) {
                fprintf(stderr, "\nchat: answer cut at %d tokens (-n)\n", o->steps);
                break;
            }
        }
        utf8_stream_flush(&st, stdout);
        if (color && in_think && o->show_thinking) fputs("\033[0m", stdout);
        fputc('\n', stdout);
        if (fflush(stdout) != 0 || ferror(stdout)) {
            fprintf(stderr, "chat: standard output: write failed\n");
            status = 1;
            break;
        }
        if (o->verbose_prompt) {
            char label[64];
            snprintf(label, sizeof label, "chat: answer of %d tokens run through the model:", pos - answer_start);
            print_token_ids(stderr, label, history + answer_start, pos - answer_start);
        }
        double dt = now_s() - t0;
        if (interactive_in && generated > 1)
            fprintf(stderr, "[prompt: %d tokens run, %.2f s; answer: %d tokens, %.1f tok/s; context %d/%d]\n", n_run,
                    prompt_s, generated, generated / (dt > 0 ? dt : 1e-9), pos, seq_len);
        turn++;
        if (status) break;
        /* the answer as text, as the template will take it next turn (its thinking dropped there) */
        if (!o->keep_thinking &&
            conversation_add(&conv, "assistant", tokenizer_decode(tok, history + answer_start, pos - answer_start, 0,
                                                                  NULL)) != 0) {
            fprintf(stderr, "chat: out of memory\n");
            status = 1;
            break;
        }
    }
done:
    if (dump && fclose(dump) != 0 && !status) {
        fprintf(stderr, "chat: %s: write failed\n", o->dump_logits);
        status = 1;
    }
    free(dump_rows);
    conversation_free(&conv);
    free(history);
    return status;
}
