/* chat_template.h: Qwen3's chat template (ChatML with thinking, QWEN3.md section 5), two ways:
 *   - chat_render: a whole conversation -> the exact string of the Jinja template in
 *     tokenizer_config.json (no tools), which drops the thinking of assistant turns before the last
 *     user query. The chat loop renders every turn's prompt with it.
 *   - chat_first_turn / chat_next_turn: the text to APPEND to what the KV cache holds
 *     (`--keep-thinking`): earlier answers keep their thinking in the cache.
 * Every function returns a malloc'ed NUL-terminated string (free it), or NULL when out of memory. */
#ifndef CHAT_TEMPLATE_H
#define CHAT_TEMPLATE_H

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

#endif
