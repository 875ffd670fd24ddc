/* output_path.h: the file that a tool writing a whole new file replaces. The tools (chat's /save,
 * -m quantize) write under a temporary name beside it and rename that over it when complete, so an
 * interrupted write leaves the old file as it was. And the file that an output written as the run
 * goes (--dump-logits, --norms-json) removes when a write to it fails. */
#ifndef OUTPUT_PATH_H
#define OUTPUT_PATH_H

#include <stddef.h>
#include <stdio.h>

/* Into target[size]: path, or where path leads when it is a symbolic link (so the link stays and
 * the file it names is replaced or made; one link is followed where the file is not there yet). 0, or -1 with the reason in why[why_size]: path is a directory,
 * or a device, FIFO or socket, which the rename would replace itself (as root, /dev/null). */
int output_path_target(const char* path, char* target, size_t size, char* why, size_t why_size);

/* For a file opened for writing at path and written as a run goes (--dump-logits, --norms-json):
 * into written[size], the file to remove when a write to it fails: path, or where path leads when it
 * is a symbolic link (the link stays); "" when f is no regular file (a device such as /dev/null or
 * /dev/full, a FIFO), which is never removed. */
void output_path_written(FILE* f, const char* path, char* written, size_t size);

#endif
