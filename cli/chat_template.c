/* chat_template.c: Qwen3's chat template (QWEN3.md section 5) rendered natively. */
#include "chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int has_role(const ChatMessage* m, const char* role) { return m->role && strcmp(m->role, role) == 0; }

/* A user message that wraps a tool's response. */
static int is_tool_response(const char* s) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    const size_t n = strlen(s), k = sizeof close - 1;
    return strncmp(s, open, sizeof open - 1) == 0 && n >= k && strcmp(s + n - k, close) == 0;
}

static const char THINK_EMPTY[] = "<think>\n\n</think>\n\n";

char* chat_render(const ChatMessage* msgs, int n, int add_generation_prompt, int enable_thinking) {
    char* text = NULL;
    size_t size = 0;
    FILE* f = open_memstream(&text, &size);
    if (f == NULL) return NULL;
    if (n > 0 && has_role(&msgs[0], "system"))
        fprintf(f, "<|im_start|>system\n%s<|im_end|>\n", msgs[0].content ? msgs[0].content : "");
    /* the last user message that is not a tool response wrapper */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        if (has_role(&msgs[i], "user") && !is_tool_response(msgs[i].content ? msgs[i].content : "")) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        const char* role = msgs[i].role ? msgs[i].role : "";
        const char* content = msgs[i].content ? msgs[i].content : "";
        if (strcmp(role, "user") == 0 || (strcmp(role, "system") == 0 && i > 0)) {
            fprintf(f, "<|im_start|>%s\n%s<|im_end|>\n", role, content);
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
            fputs("<|im_start|>assistant\n", f);
            if (i > last_query && (i == n - 1 || r.n > 0)) {
                View rs = rstrip_nl(lstrip_nl(r));
                fprintf(f, "<think>\n%.*s\n</think>\n\n", (int)rs.n, rs.p);
                c = lstrip_nl(c);
            }
            fprintf(f, "%.*s<|im_end|>\n", (int)c.n, c.p);
        } else if (strcmp(role, "tool") == 0) {
            if (i == 0 || !has_role(&msgs[i - 1], "tool")) fputs("<|im_start|>user", f);
            fprintf(f, "\n<tool_response>\n%s\n</tool_response>", content);
            if (i == n - 1 || !has_role(&msgs[i + 1], "tool")) fputs("<|im_end|>\n", f);
        }
        /* other roles: the template writes nothing */
    }
    if (add_generation_prompt) fprintf(f, "<|im_start|>assistant\n%s", enable_thinking ? "" : THINK_EMPTY);
    if (fclose(f) == 0) return text; /* text is final only once the stream is closed */
    free(text);
    return NULL;
}

char* chat_first_turn(const char* system, const char* user, int enable_thinking) {
    ChatMessage m[2];
    int n = 0;
    if (system && system[0]) m[n++] = (ChatMessage){"system", system, NULL};
    m[n++] = (ChatMessage){"user", user, NULL};
    return chat_render(m, n, 1, enable_thinking);
}

char* chat_next_turn(const char* user, int enable_thinking, int close_answer) {
    char* text;
    if (asprintf(&text, "%s\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n%s",
                 close_answer ? "<|im_end|>" : "", user, enable_thinking ? "" : THINK_EMPTY) < 0)
        return NULL;
    return text;
}
