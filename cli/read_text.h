/* read_text.h: the text that generate, tokenize and eval work on, from -i, a file or standard input. */
#ifndef READ_TEXT_H
#define READ_TEXT_H

#include <stddef.h>

/* A malloc'ed, NUL-terminated copy of text; when text is NULL, the whole of the file path, or of
 * standard input when path is NULL too or "-". Files are read with read(2) until it returns 0, so that one
 * Ctrl-D at a terminal ends the text (stdio's fread would wait for a second one). *len: the bytes
 * before the NUL. NULL after one error line on stderr. */
char* read_text(const char* text, const char* path, size_t* len);

/* The most text a file or standard input may hold: -f /dev/zero or an endless pipe ends with an
 * error line instead of filling the memory. Eval scores a long text in windows, so the limit is far
 * beyond a context: 256 MiB is some 60 million tokens, days of eval for Qwen3-0.6B on a CPU. */
#define READ_TEXT_MAX ((size_t)1 << 28)

#endif
