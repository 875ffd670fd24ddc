/* read_text.h: the text that generate, tokenize and eval work on, from -i, a file or standard input. */
#ifndef READ_TEXT_H
#define READ_TEXT_H

#include <stddef.h>

/* A malloc'ed, NUL-terminated copy of text; when text is NULL, the whole of the file path, or of
 * standard input when path is NULL too or "-". Files are read with read(2) until it returns 0, so that one
 * Ctrl-D at a terminal ends the text (stdio's fread would wait for a second one). *len: the bytes
 * before the NUL. NULL after one error line on stderr. */
char* read_text(const char* text, const char* path, size_t* len);

#endif
