/* test_chat.c: the chat template (chat.c) against the exact strings of QWEN3.md section 5, which
 * were rendered there with jinja2 from tokenizer_config.json's template. Needs nothing outside the
 * repository. The cases beyond the spec's four (final assistant, reasoning_content, tool responses,
 * late system message) were checked against jinja2 3.1.6 rendering the real template (sandboxed,
 * trim_blocks, lstrip_blocks) when this test was written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/chat.h"

static int failures = 0, checks = 0;

static void check_str(char* got, const char* want, const char* what) {
    checks++;
    if (!got || strcmp(got, want) != 0) {
        failures++;
        fprintf(stderr, "FAIL %s:\n  got:  ", what);
        for (const char* p = got ? got : "(null)"; *p; p++) fputs(*p == '\n' ? "\\n" : (char[2]){*p, 0}, stderr);
        fputs("\n  want: ", stderr);
        for (const char* p = want; *p; p++) fputs(*p == '\n' ? "\\n" : (char[2]){*p, 0}, stderr);
        fputc('\n', stderr);
    }
    free(got);
}

int main(void) {
    const char* Q = "What is 2+2?";
    /* one turn, thinking on (the default) */
    check_str(chat_first_turn(NULL, Q, 1), "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
              "one turn, thinking");
    ChatMessage one[] = {{"user", "What is 2+2?", NULL}};
    check_str(chat_render(one, 1, 1, 1), "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
              "render one turn, thinking");
    /* enable_thinking = False: the empty think block */
    check_str(chat_first_turn("", Q, 0),
              "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
              "one turn, no thinking");
    /* system prompt */
    check_str(chat_first_turn("You are a helpful assistant.", Q, 1),
              "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
              "<|im_start|>assistant\n",
              "system prompt");
    /* two turns: the earlier answer's thinking is stripped */
    ChatMessage two[] = {
        {"system", "You are terse.", NULL},
        {"user", "What is 2+2?", NULL},
        {"assistant", "<think>\nThe user wants 2+2. That is 4.\n</think>\n\n4", NULL},
        {"user", "And 3+3?", NULL},
    };
    const char* two_want =
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n";
    check_str(chat_render(two, 4, 1, 1), two_want, "two turns");
    char no_think[1024];
    snprintf(no_think, sizeof no_think, "%s<think>\n\n</think>\n\n", two_want);
    check_str(chat_render(two, 4, 1, 0), no_think, "two turns, no thinking");
    /* the same conversation built incrementally (kept KV cache): first turn + answer + next turn.
     * Identical to the template except that the cached answer keeps its thinking. */
    {
        char* a = chat_first_turn("You are terse.", "What is 2+2?", 1);
        char* b = chat_next_turn("And 3+3?", 1, 1);
        char buf[1024];
        snprintf(buf, sizeof buf, "%s%s%s", a, "<think>\nThe user wants 2+2. That is 4.\n</think>\n\n4", b);
        check_str(strdup(buf),
                  "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\nThe user wants 2+2. That is 4.\n</think>\n\n4<|im_end|>\n"
                  "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n",
                  "incremental two turns");
        free(a);
        free(b);
    }
    check_str(chat_next_turn("Hi", 0, 0), "\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
              "next turn, no thinking, <|im_end|> already in the cache");
    /* the last assistant message (after the last query) keeps its thinking; with none it gets an
     * empty block */
    ChatMessage last[] = {{"user", "Hi", NULL}, {"assistant", "<think>\nhmm\n</think>\n\nHello", NULL}};
    check_str(chat_render(last, 2, 0, 1),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello<|im_end|>\n",
              "final assistant with thinking");
    ChatMessage last2[] = {{"user", "Hi", NULL}, {"assistant", "Hello", NULL}};
    check_str(chat_render(last2, 2, 0, 1),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n",
              "final assistant without thinking");
    /* reasoning_content given separately */
    ChatMessage rc[] = {{"user", "Hi", NULL}, {"assistant", "\n\nHello", "\nI think.\n"}};
    check_str(chat_render(rc, 2, 0, 1),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nI think.\n</think>\n\nHello<|im_end|>\n",
              "reasoning_content");
    /* tool responses: merged into one user turn, and not a "real" query */
    ChatMessage tools[] = {{"user", "Weather?", NULL},
                           {"assistant", "<think>\nneed tool\n</think>\n\ncalling", NULL},
                           {"tool", "sunny", NULL},
                           {"tool", "22C", NULL}};
    check_str(chat_render(tools, 4, 1, 1),
              "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\nneed tool\n</think>\n\ncalling<|im_end|>\n"
              "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
              "<|im_start|>assistant\n",
              "tool responses");
    /* a system message that is not first is a turn like the user's */
    ChatMessage sys2[] = {{"user", "a", NULL}, {"system", "b", NULL}};
    check_str(chat_render(sys2, 2, 0, 1), "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n",
              "late system message");
    printf("test_chat: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
