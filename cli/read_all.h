/* read_all.h: the whole of a file descriptor as one NUL-terminated string (tokenize and eval read
 * their text from standard input or a file with it). */
#ifndef READ_ALL_H
#define READ_ALL_H

#include <stddef.h>

/* Reads fd with read(2) until it returns 0, so that one Ctrl-D at a terminal ends the text (stdio's
 * fread would wait for a second one). Returns the malloc'ed bytes with a NUL after them and their
 * count in *len, or NULL after one error line on stderr that names name. */
char* read_all(int fd, const char* name, size_t* len);

#endif
