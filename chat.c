/* chat.c: Qwen3's chat template (QWEN3.md section 5) rendered natively, and the chat loop. */
#include "chat.h"

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

int chat_main(Transformer* t, const Tokenizer* tok, Sampler* s, const ChatOptions* o) {
    if (!tok || tokenizer_size(tok) == 0) {
        fprintf(stderr, "chat: the checkpoint has no tokenizer\n");
        return 1;
    }
    const int V = t->config.vocab_size, seq_len = t->config.seq_len;
    const int im_end = tokenizer_find(tok, "<|im_end|>");
    const int think_open = tokenizer_find(tok, "<think>");
    const int think_close = tokenizer_find(tok, "</think>");
    const int interactive_in = isatty(fileno(stdin));
    const int color = isatty(fileno(stdout));
    int* history = malloc(((size_t)seq_len + 1) * sizeof(int));
    if (!history) {
        fprintf(stderr, "chat: out of memory\n");
        return 1;
    }
    int pos = 0, status = 0, turn = 0;
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
            if (!user) break;
            if (strcmp(user, "/bye") == 0) {
                free(user);
                break;
            }
            if (!user[0]) { /* an empty line is no message */
                free(user);
                continue;
            }
        }
        if (!user) {
            fprintf(stderr, "chat: out of memory\n");
            status = 1;
            break;
        }
        /* the previous answer's <|im_end|> was sampled but not run through the model: close_answer */
        char* text = turn == 0 ? chat_first_turn(o->system_prompt, user, o->thinking)
                               : chat_next_turn(user, o->thinking, 1);
        free(user);
        int n = 0;
        int* ids = text ? tokenizer_encode(tok, text, strlen(text), &n) : NULL;
        free(text);
        if (!ids) {
            fprintf(stderr, "chat: out of memory\n");
            status = 1;
            break;
        }
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= V) {
                fprintf(stderr, "chat: the tokenizer gave id %d, outside the model's vocabulary of %d\n", ids[i], V);
                free(ids);
                free(history);
                return 1;
            }
        if (pos + n >= seq_len) {
            fprintf(stderr, "chat: the context is full (%d of %d tokens); a larger -c/--ctx allows more\n",
                    pos, seq_len);
            free(ids);
            status = 1;
            break;
        }
        float* logits = forward(t, ids, n, pos, NULL);
        if (!logits) {
            fprintf(stderr, "chat: forward pass failed\n");
            free(ids);
            status = 1;
            break;
        }
        memcpy(history + pos, ids, (size_t)n * sizeof(int));
        pos += n;
        free(ids);

        /* the answer */
        Utf8Stream st = {{0}, 0};
        int in_think = 0, after_think = 0, generated = 0;
        double t0 = now_s();
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
            if (pos >= seq_len) { /* no room to keep this token */
                fprintf(stderr, "\nchat: the context is full (%d tokens)\n", seq_len);
                break;
            }
            history[pos] = next;
            logits = forward(t, &next, 1, pos, NULL);
            if (!logits) {
                fprintf(stderr, "chat: forward pass failed\n");
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
        fflush(stdout);
        double dt = now_s() - t0;
        if (interactive_in && generated > 1)
            fprintf(stderr, "[%d tokens, %.1f tok/s, context %d/%d]\n", generated, generated / (dt > 0 ? dt : 1e-9),
                    pos, seq_len);
        turn++;
        if (status) break;
        if (pos >= seq_len) break;
    }
    free(history);
    return status;
}
