/* chat.c: the chat loop of `./run MODEL -m chat` (the template is chat_template.c). */
#include "chat.h"
#include "cli/output_path.h"
#include "cli/read_text.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The user's line, NUL-terminated (oom: it ran out of memory). */
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

/* ---- Ctrl-C and the terminal's attributes ---- */

/* SIGINT only sets a flag and writes a byte to a pipe: the token loop checks the flag between
 * tokens, and the wait for the user's line polls the pipe, which wakes it whichever thread the
 * signal lands on. SIGTERM, SIGHUP and SIGQUIT keep their usual effect, after resetting the
 * terminal's text attributes when stdout shows the thinking dim; Ctrl-Z (SIGTSTP) resets them
 * before the process stops and sets the dim again when it continues. */
static volatile sig_atomic_t interrupted; /* a Ctrl-C not yet taken */
static volatile sig_atomic_t dim_shown;   /* stdout is a terminal set to dim text */
static volatile sig_atomic_t waiting_at;  /* the prompt the chat waits at (PROMPTS), for a Ctrl-Z */
static const char* const PROMPTS[] = {"", "> ", "... "}; /* none, a message's, a """ message's next line */
static int wake_pipe[2] = {-1, -1};

static const char ATTR_DIM[] = "\033[2m", ATTR_RESET[] = "\033[0m";
static const int SIGNALS[] = {SIGINT, SIGTSTP, SIGTERM, SIGHUP, SIGQUIT}; /* Ctrl-C, Ctrl-Z, the fatal ones */
#define N_SIGNALS (int)(sizeof SIGNALS / sizeof SIGNALS[0])
static struct sigaction old_actions[N_SIGNALS];

/* For the signal handlers: writes attr (async-signal-safe) when stdout shows the dim. */
static void write_if_dim(const char* attr) {
    if (!dim_shown) return;
    ssize_t r = write(STDOUT_FILENO, attr, strlen(attr));
    (void)r;
}

static void on_interrupt(int sig) {
    const int saved_errno = errno;
    interrupted = 1;
    ssize_t r = write(wake_pipe[1], "", 1); /* non-blocking: a full pipe is awake already */
    (void)r;
    errno = saved_errno;
}

/* Stops the process as SIGTSTP's default action does, with the dim switched off meanwhile: the
 * default action for the moment of a raise (the signal unblocked in this thread), then this
 * handler again. In an orphaned process group the kernel discards the stop and raise returns at once.
 * At the prompt it draws the prompt again when the chat continues: the shell's fg left the cursor
 * on a line of its own. */
static void on_stop_signal(int sig) {
    const int saved_errno = errno;
    write_if_dim(ATTR_RESET);
    struct sigaction dfl = {.sa_handler = SIG_DFL}, mine;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, &mine);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig); /* stops here until SIGCONT */
    sigaction(sig, &mine, NULL);
    const char* prompt = PROMPTS[waiting_at];
    if (*prompt) {
        ssize_t r = write(STDERR_FILENO, prompt, strlen(prompt));
        (void)r;
    }
    write_if_dim(ATTR_DIM);
    errno = saved_errno;
}

static void on_fatal_signal(int sig) {
    write_if_dim(ATTR_RESET);
    raise(sig); /* SA_RESETHAND restored the default action, which runs when this handler returns */
}

static void drain_wake_pipe(void) {
    char buf[64];
    while (read(wake_pipe[0], buf, sizeof buf) > 0) continue;
}

/* 1 (and the Ctrl-C is taken) when one came since the last call. */
static int take_interrupt(void) {
    if (!interrupted) return 0;
    interrupted = 0;
    drain_wake_pipe();
    return 1;
}

/* A signal ignored when the chat starts (nohup, a background job) stays ignored. 0, or -1 after
 * an error message. */
static int signals_install(void) {
    if (pipe2(wake_pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
        fprintf(stderr, "chat: cannot create a pipe: %s\n", strerror(errno));
        return -1;
    }
    interrupted = dim_shown = 0;
    struct sigaction sa = {0};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_SIGNALS; i++) {
        sa.sa_handler = i == 0 ? on_interrupt : i == 1 ? on_stop_signal : on_fatal_signal;
        /* SA_RESTART: a write to a slow terminal resumes; the line wait polls the pipe */
        sa.sa_flags = i >= 2 ? SA_RESETHAND : SA_RESTART;
        sigaction(SIGNALS[i], NULL, &old_actions[i]);
        if (old_actions[i].sa_handler != SIG_IGN) sigaction(SIGNALS[i], &sa, NULL);
    }
    return 0;
}

static void signals_restore(void) {
    for (int i = 0; i < N_SIGNALS; i++) sigaction(SIGNALS[i], &old_actions[i], NULL);
    close(wake_pipe[0]);
    close(wake_pipe[1]);
    wake_pipe[0] = wake_pipe[1] = -1;
}

/* ---- The user's lines ---- */

typedef struct {
    char buf[4096];
    size_t at, n;
    int eof;
} Input;

enum { LINE_READ, LINE_EOF, LINE_INTERRUPTED, LINE_ERROR };

/* Reads the next line of standard input into line (without its newline; a last line without one
 * counts). LINE_INTERRUPTED when a Ctrl-C comes first; the part of the line read so far is
 * dropped (a terminal drops what was typed on the line itself). */
static int input_line(Input* in, Str* line) {
    line->n = 0;
    for (;;) {
        while (in->at < in->n && in->buf[in->at] != '\n') sadd(line, &in->buf[in->at++], 1);
        if (in->at < in->n || (in->eof && line->n)) { /* a newline, or a last line without one */
            in->at++;
            if (line->n && line->p[line->n - 1] == '\r') line->n--;
            sadd(line, "", 0);
            return line->oom ? LINE_ERROR : LINE_READ;
        }
        if (take_interrupt()) return LINE_INTERRUPTED;
        if (in->eof) return LINE_EOF;
        struct pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {wake_pipe[0], POLLIN, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return LINE_ERROR;
        }
        if (fds[1].revents) drain_wake_pipe(); /* the flag says whether the Ctrl-C is still untaken */
        if (!fds[0].revents) continue;
        const ssize_t r = read(STDIN_FILENO, in->buf, sizeof in->buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return LINE_ERROR;
        in->at = 0;
        in->n = (size_t)r;
        in->eof = r == 0; /* a terminal's Ctrl-D: the next read would wait for more */
    }
}

/* input_line after showing a prompt of PROMPTS on stderr (0: none; before: what comes first),
 * which a Ctrl-Z from then on draws again when the chat continues. */
static int input_at_prompt(Input* in, Str* line, const char* before, int prompt) {
    waiting_at = prompt;
    if (prompt) {
        fputs(before, stderr);
        fputs(PROMPTS[prompt], stderr);
        fflush(stderr);
    }
    const int r = input_line(in, line);
    waiting_at = 0;
    return r;
}

/* ---- The conversation ---- */

/* The conversation as the template takes it, each message's text owned here: the transcript that
 * /save writes, and (without --keep-thinking) what each turn's prompt renders. */
typedef struct {
    ChatMessage* m;
    int n;
} Conversation;

/* Appends a message that owns content (malloc'ed; NULL: out of memory). 0, or -1 when out of memory. */
static int conversation_add(Conversation* c, const char* role, char* content) {
    ChatMessage* m = content ? realloc(c->m, (size_t)(c->n + 1) * sizeof *m) : NULL;
    if (m == NULL) {
        free(content);
        return -1;
    }
    c->m = m;
    c->m[c->n++] = (ChatMessage){role, content, NULL};
    return 0;
}

static void conversation_drop_last(Conversation* c) { free((char*)c->m[--c->n].content); }

/* The index of the first message after the system prompt (0 or 1). */
static int conversation_first(const Conversation* c) { return c->n && strcmp(c->m[0].role, "system") == 0; }

static const char* conversation_system(const Conversation* c) {
    return conversation_first(c) ? c->m[0].content : NULL;
}

/* Removes the system prompt, if there is one. */
static void conversation_drop_system(Conversation* c) {
    if (!conversation_first(c)) return;
    free((char*)c->m[0].content);
    memmove(c->m, c->m + 1, (size_t)--c->n * sizeof *c->m);
}

/* Sets the system prompt (text malloc'ed, owned from here); 0, or -1 when out of memory. */
static int conversation_set_system(Conversation* c, char* text) {
    if (text && conversation_first(c)) {
        free((char*)c->m[0].content);
        c->m[0].content = text;
        return 0;
    }
    if (conversation_add(c, "system", text) != 0) return -1;
    const ChatMessage sys = c->m[c->n - 1];
    memmove(c->m + 1, c->m, (size_t)(c->n - 1) * sizeof *c->m);
    c->m[0] = sys;
    return 0;
}

/* Where the turn that starts at message i ends (the next user message, or the last message), or
 * -1 when nothing but the last message is left from i on. */
static int conversation_turn_end(const Conversation* c, int i) {
    int end = i + 1;
    while (end < c->n - 1 && strcmp(c->m[end].role, "user") != 0) end++;
    return end >= c->n ? -1 : end;
}

/* Drops the messages from after the system prompt up to (not including) message from. */
static void conversation_drop_before(Conversation* c, int from) {
    const int first = conversation_first(c);
    for (int i = first; i < from; i++) free((char*)c->m[i].content);
    memmove(c->m + first, c->m + from, (size_t)(c->n - from) * sizeof *c->m);
    c->n -= from - first;
}

/* The template's prompt for the conversation as token ids, the oldest turns after the system
 * prompt left out until it has at most max_ids ids (or only the last message is left). The
 * conversation itself is not changed: *from is the first message kept after the system prompt,
 * *dropped the number of turns left out. NULL when out of memory. */
static int* conversation_fit(const Conversation* c, const Tokenizer* tok, int thinking, int max_ids, int* n,
                             int* from, int* dropped) {
    const int first = conversation_first(c);
    ChatMessage* view = malloc((size_t)c->n * sizeof *view);
    int* ids = NULL;
    *from = first;
    *dropped = 0;
    while (view) {
        const int kept = c->n - *from;
        if (first) view[0] = c->m[0];
        memcpy(view + first, c->m + *from, (size_t)kept * sizeof *view);
        char* text = chat_render(view, first + kept, 1, thinking);
        free(ids);
        ids = text ? tokenizer_encode(tok, text, strlen(text), n) : NULL;
        free(text);
        const int next = conversation_turn_end(c, *from);
        if (!ids || *n <= max_ids || next < 0) break;
        *from = next;
        (*dropped)++;
    }
    free(view);
    return ids;
}

static void conversation_free(Conversation* c) {
    for (int i = 0; i < c->n; i++) free((char*)c->m[i].content);
    free(c->m);
}

/* s as a JSON string: escapes, and U+FFFD for each byte that starts no valid UTF-8 character (a
 * typed or /read message can hold any bytes; the file must be valid JSON). */
static void json_string(FILE* f, const char* s) {
    fputc('"', f);
    for (const char* end = s + strlen(s); *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        const int n = utf8_valid_length(s, (size_t)(end - s));
        if (n == 0) fputs("\uFFFD", f);
        else if (n > 1) {
            fwrite(s, 1, (size_t)n, f);
            s += n - 1;
        } else if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch == '\n') fputs("\\n", f);
        else if (ch == '\t') fputs("\\t", f);
        else if (ch < 0x20 || ch == 0x7f) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* /save: the conversation as JSON, [{"role": ..., "content": ...}, ...] (json_string makes any
 * bytes of a typed or /read message valid UTF-8; answers are decoded with U+FFFD already).
 * Written to a temporary file that replaces path only when complete. 0, or -1 after an error
 * message. */
static int conversation_save(const Conversation* c, const char* path_given) {
    char path[4096], tmp[4096 + 32], why[256];
    if (output_path_target(path_given, path, sizeof path, why, sizeof why) != 0) {
        fprintf(stderr, "chat: %s: %s; the conversation was not saved\n", path_given, why);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE* f = fopen(tmp, "w");
    struct stat old;
    if (f && stat(path, &old) == 0) fchmod(fileno(f), old.st_mode & 07777); /* a private file stays private */
    if (f) {
        fputs("[", f);
        for (int i = 0; i < c->n; i++) {
            fputs(i ? ",\n  {\"role\": " : "\n  {\"role\": ", f);
            json_string(f, c->m[i].role);
            fputs(", \"content\": ", f);
            json_string(f, c->m[i].content);
            fputc('}', f);
        }
        fputs(c->n ? "\n]\n" : "]\n", f);
    }
    const int failed = !f || ferror(f) | (fclose(f) != 0) || rename(tmp, path) != 0;
    if (failed) {
        fprintf(stderr, "chat: %s: cannot write the conversation: %s\n", path, strerror(errno));
        remove(tmp);
    }
    return failed ? -1 : 0;
}
/* ---- The chat loop ---- */

typedef struct {
    Transformer* t;
    const Tokenizer* tok;
    Sampler* s;
    const ChatOptions* o;
    Conversation conv;
    int* history;  /* the tokens in the KV cache, [seq_len + 1] */
    int pos, turn; /* tokens cached; turns answered since the cache started */
    LogitsDump dump;
    int terminal;  /* the messages come from a terminal (stdin is one, and no -i) */
    int color;     /* stdout is a terminal */
    int im_end, think_open, think_close;
    int generated; /* tokens generated in the whole chat */
    int answered;  /* the last thing printed is an answer */
    Utf8Stream out;              /* the answer being printed */
    int in_think, after_think;   /* inside its thinking, or right after it */
} Chat;

/* The error line for a failed allocation; returns status. */
static int out_of_memory(int status) {
    fprintf(stderr, "chat: out of memory\n");
    return status;
}

/* Drops every message after the system prompt. With --keep-thinking the next turn starts the
 * cache again: earlier turns cannot leave it. */
static void clear_conversation(Chat* c) {
    conversation_drop_before(&c->conv, c->conv.n);
    if (c->o->keep_thinking) c->pos = c->turn = 0;
}

static const char CHAT_HINT[] =
    "chat: /help lists the commands; Ctrl-C stops an answer; Ctrl-D or /bye leaves\n";

static const char CHAT_HELP[] =
    "Commands (a line whose first word is one of these; another /word is refused, //word sends it):\n"
    "  /help            this list\n"
    "  /bye             leave the chat (also /quit, /exit, Ctrl-D, or Ctrl-C twice at the prompt)\n"
    "  /clear           start a new conversation (the system prompt stays)\n"
    "  /system TEXT     set the system prompt (/system alone shows it, /system \"\" removes it)\n"
    "  /save FILE       write the conversation to FILE as JSON: [{\"role\": ..., \"content\": ...}]\n"
    "  /read FILE       send the text of FILE as your message (longer than a terminal takes in a line)\n"
    "                   (in /save's and /read's FILE, ~/ is your home folder)\n"
    "A message of several lines: start it with \"\"\" and end it with \"\"\" (a paste between two such lines).\n"
    "Ctrl-C while an answer streams stops it; what was written stays in the conversation.\n";

enum { COMMAND_NONE, COMMAND_DONE, COMMAND_LEAVE, COMMAND_FAILED, COMMAND_MESSAGE };

/* /read FILE: the file's text in place of the line (COMMAND_MESSAGE), or `failed` after the
 * line that says why not. A regular file only: standard input is where the chat reads its lines. */
static int read_message(Str* line, const char* path, int failed) {
    struct stat st;
    if (stat(path, &st) != 0 || access(path, R_OK) != 0) {
        fprintf(stderr, "chat: %s: cannot open: %s\n", path, strerror(errno));
        return failed;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "chat: %s: not a file; /read sends a file's text\n", path);
        return failed;
    }
    size_t len;
    char* text = read_text(NULL, path, &len);
    if (text == NULL) return failed;
    size_t n = strlen(text);
    if (n < len) { /* a message is text, which holds no NUL */
        fprintf(stderr, "chat: %s holds a NUL byte (at byte %zu): not text; nothing sent\n", path, n);
        free(text);
        return failed;
    }
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r')) n--; /* the file's last newline, as typed */
    if (text[strspn(text, " \t\r\n\v\f")] == '\0') {
        fprintf(stderr, "chat: %s has no text: nothing sent\n", path);
        free(text);
        return failed;
    }
    line->n = 0;
    sadd(line, text, n);
    sadd(line, "", 0);
    free(text);
    if (line->oom) return out_of_memory(COMMAND_FAILED);
    return COMMAND_MESSAGE;
}

/* A command's file name with "~/" at its start (or "~" alone) read as a shell reads it: under $HOME,
 * since no shell sees the chat's lines. The name as given where there is no HOME or it does not fit. */
static const char* home_path(const char* name, char* buf, size_t size) {
    const char* home = getenv("HOME");
    if (name[0] != '~' || (name[1] != '/' && name[1] != '\0') || home == NULL || home[0] == '\0') return name;
    return (size_t)snprintf(buf, size, "%s%s", home, name + 1) < size ? buf : name;
}

/* The line's command, carried out: COMMAND_NONE when the line is a message, COMMAND_MESSAGE when
 * the command put one in its place (/read). A line is a command when its first word is "/" and
 * letters: "/usr/bin is ..." is a message, "/etc is ..." an unknown command, "//etc is ..." the
 * message "/etc is ...". A command that fails ends a chat read from a pipe (COMMAND_FAILED), so
 * that a script does not go on with a turn missing; at a terminal the user sees it and goes on. */
static int chat_command(Chat* c, Str* text) {
    const size_t lead = strspn(text->p, " \t"); /* " /bye": the first word is /bye */
    char* line = text->p + lead;
    if (line[0] != '/') return COMMAND_NONE;
    if (line[1] == '/') {
        memmove(line, line + 1, text->n-- - lead); /* the NUL too */
        return COMMAND_NONE;
    }
    const int failed = c->terminal ? COMMAND_DONE : COMMAND_FAILED;
    size_t k = 1;
    while (isalpha((unsigned char)line[k]) || line[k] == '?') k++;
    if (k == 1 || (line[k] && !isspace((unsigned char)line[k]))) return COMMAND_NONE;
    while (text->n > lead + k && isspace((unsigned char)text->p[text->n - 1])) text->p[--text->n] = '\0'; /* "/save f " */
    const char* arg = line + k + strspn(line + k, " \t\r\v\f");
    char home_buf[4096];
    const char* path = home_path(arg, home_buf, sizeof home_buf); /* /read's and /save's file */
#define IS(name) (k == strlen(name) && strncmp(line, name, k) == 0)
    if (IS("/bye") || IS("/quit") || IS("/exit")) return COMMAND_LEAVE;
    if (IS("/help") || IS("/?")) {
        fputs(CHAT_HELP, stderr);
    } else if (IS("/clear")) {
        clear_conversation(c);
        fprintf(stderr, "chat: the conversation is cleared\n");
    } else if (IS("/system") && !*arg) {
        const char* sys = conversation_system(&c->conv);
        fprintf(stderr, sys ? "chat: the system prompt: %s\n" : "chat: no system prompt\n", sys);
    } else if (IS("/system")) {
        const int none = strcmp(arg, "\"\"") == 0 || strcmp(arg, "''") == 0; /* /system "": none, as -y "" */
        if (none) conversation_drop_system(&c->conv);
        else if (conversation_set_system(&c->conv, strdup(arg)) != 0) return out_of_memory(COMMAND_FAILED);
        if (c->o->keep_thinking) /* the cache cannot change its start: the conversation starts over */
            clear_conversation(c);
        fprintf(stderr, "chat: the system prompt is %s%s\n", none ? "removed" : "set",
                c->o->keep_thinking ? "; --keep-thinking: the conversation starts over" : "");
    } else if (IS("/read")) {
        if (!*arg) fprintf(stderr, "chat: /read needs a file name\n");
        else return read_message(text, path, failed);
        return failed;
    } else if (IS("/save")) {
        if (!*arg) {
            fprintf(stderr, "chat: /save needs a file name\n");
            return failed;
        }
        const char* taken = c->o->checkpoint && same_file(path, c->o->checkpoint) ? "the model's checkpoint"
                            : c->o->dump_logits && same_file(path, c->o->dump_logits) ? "the --dump-logits file" : NULL;
        if (taken) fprintf(stderr, "chat: %s: is %s; /save to another file\n", path, taken);
        if (taken || conversation_save(&c->conv, path) != 0) return failed;
        fprintf(stderr, "chat: %d message%s saved to %s\n", c->conv.n, c->conv.n == 1 ? "" : "s", path);
    } else {
        fprintf(stderr, "chat: unknown command %.*s; /help lists the commands (the line was not sent; //%.*s "
                "sends it as a message)\n", (int)k, line, (int)k - 1, line + 1);
        return failed;
    }
#undef IS
    return COMMAND_DONE;
}

/* The ids to run from *start for the user's message (the conversation's last), into *run (malloc'ed,
 * *n_run of them); without --keep-thinking, the prompt leaves out the oldest *dropped turns (those
 * before message *from) where it would fill more than 3/4 of the context: the caller drops them from
 * the conversation once the prompt has run. Returns 0; 1 when the message does not fit even so (said;
 * the conversation is left as it was); -1 after an error message. */
static int turn_ids(Chat* c, int** run, int* start, int* n_run, int* from, int* dropped) {
    const ChatOptions* o = c->o;
    const int seq_len = c->t->config.seq_len, V = c->t->config.vocab_size;
    int n = 0, *ids;
    *from = *dropped = 0;
    *start = c->pos;
    if (o->keep_thinking) { /* the previous answer's <|im_end|> was sampled, not run: close_answer */
        const char* user = c->conv.m[c->conv.n - 1].content;
        char* text = c->turn == 0 ? chat_first_turn(conversation_system(&c->conv), user, o->thinking)
                                  : chat_next_turn(user, o->thinking, 1);
        ids = text ? tokenizer_encode(c->tok, text, strlen(text), &n) : NULL;
        free(text);
    } else {
        ids = conversation_fit(&c->conv, c->tok, o->thinking, seq_len - seq_len / 4, &n, from, dropped);
        /* After the longest prefix the cache shares with this prompt (the previous turn's prompt,
         * then the previous answer up to where the template drops its thinking or tokenizes its
         * text otherwise); at least the last token runs: its logits give the answer's first. */
        *start = 0;
        while (ids && *start < c->pos && *start < n && c->history[*start] == ids[*start]) (*start)++;
        if (*start == n) *start = n - 1;
        n -= *start;
        if (ids) memmove(ids, ids + *start, (size_t)n * sizeof *ids);
    }
    if (!ids) return out_of_memory(-1);
    *run = ids;
    *n_run = n;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            fprintf(stderr, "chat: the tokenizer gave id %d, outside the model's vocabulary of %d\n", ids[i], V);
            free(ids);
            return -1;
        }
    if (*start + n >= seq_len) {
        char advice[80], sys_note[64] = "";
        const char* sys = conversation_system(&c->conv); /* which may be what takes the room */
        if (sys) {
            ChatMessage m = {"system", sys, NULL};
            char* text = chat_render(&m, 1, 0, o->thinking);
            int n_sys = 0;
            int* sys_ids = text ? tokenizer_encode(c->tok, text, strlen(text), &n_sys) : NULL;
            if (sys_ids) snprintf(sys_note, sizeof sys_note, " (the system prompt takes %d of them)", n_sys);
            free(sys_ids);
            free(text);
        }
        fprintf(stderr, "chat: this turn needs %d tokens of context%s, more than the %d there are; %s%s\n",
                *start + n + 1, sys_note, seq_len, context_advice(&c->t->config, advice, sizeof advice),
                !c->terminal ? "" : c->o->keep_thinking && *start > 0 ? " (the message was not sent); --keep-thinking "
                "keeps every turn: /clear starts over" : " (the message was not sent)");
        free(ids);
        return 1;
    }
    return 0;
}

static void end_dim(void) {
    if (!dim_shown) return;
    fputs(ATTR_RESET, stdout);
    fflush(stdout);
    dim_shown = 0;
}

/* The thinking is printed dim on a terminal, or not at all (--hide-think). */
static void print_answer_token(Chat* c, int id) {
    const int show = c->o->show_thinking;
    const int thinking = c->in_think || id == c->think_open || id == c->think_close;
    if (id == c->think_open) {
        c->in_think = 1;
        if (show && c->color) {
            dim_shown = 1; /* first: a signal from here on resets the attributes */
            fputs(ATTR_DIM, stdout);
        }
    } else if (id == c->think_close) {
        c->in_think = 0;
        c->after_think = 1;
    } else if (!c->in_think) {
        size_t len;
        const char* text = tokenizer_token(c->tok, id, &len);
        /* hidden thinking: the blank lines that separate it from the answer are not printed */
        if (c->after_think && !show && text && len && strspn(text, "\n") >= len) return;
        c->after_think = 0;
    }
    if (thinking && !show) return;
    tokenizer_print(c->tok, &c->out, id, 0, stdout);
    if (id == c->think_close) {
        utf8_stream_flush(&c->out, stdout);
        end_dim();
    }
}

/* Samples and streams the answer from logits (the prompt's last), each token printed then run, so
 * that the cache and history hold exactly what was printed, until the end of the turn, -n tokens, a
 * full context or a Ctrl-C (*stopped = 1). *n_tokens: the tokens generated. Returns 0, or 1 after
 * an error message (or when --keep-thinking cannot go on). */
static int chat_answer(Chat* c, float* logits, int* stopped, int* n_tokens) {
    const ChatOptions* o = c->o;
    const int seq_len = c->t->config.seq_len;
    int status = 0, out_errno = 0; /* out_errno: why a write to stdout failed */
    char notice[256] = ""; /* why the answer stopped, said after it (its dim reset, its line ended) */
    *stopped = *n_tokens = 0;
    c->out = (Utf8Stream){.terminal = isatty(STDOUT_FILENO)};
    c->in_think = c->after_think = 0;
    for (;;) {
        const int next = sampler_sample(c->s, logits, c->history, c->pos);
        if (next < 0) {
            snprintf(notice, sizeof notice, "chat: error: every logit at position %d is NaN (" NAN_LOGITS_WHY ")\n",
                     c->pos - 1);
            status = 1;
            break;
        }
        if (next == c->im_end || is_eos(&c->t->header, next)) break;
        if (c->pos >= seq_len) { /* no room to keep this token: it is not printed either */
            char advice[80];
            if (o->keep_thinking) {
                snprintf(notice, sizeof notice, "chat: the context is full (%d tokens) and --keep-thinking cannot "
                         "drop earlier turns: the chat ends here; %s\n", seq_len,
                         context_advice(&c->t->config, advice, sizeof advice));
                status = 1;
            } else {
                snprintf(notice, sizeof notice, "chat: the context is full (%d tokens): the answer stops here%s\n",
                         seq_len, o->prompt ? "" : ", the next turn drops the oldest turns");
            }
            break;
        }
        (*n_tokens)++;
        c->generated++;
        print_answer_token(c, next);
        fflush(stdout);
        if (ferror(stdout)) { /* nobody reads the answer: reported below */
            out_errno = errno;
            break;
        }
        c->history[c->pos] = next;
        logits = forward_dumped(c->t, &next, 1, c->pos, &c->dump);
        if (!logits) {
            status = 1;
            break;
        }
        c->pos++;
        if (take_interrupt()) { /* after the token is run: the cache holds what was printed */
            *stopped = 1;
            break;
        }
        if (o->steps > 0 && *n_tokens >= o->steps) {
            snprintf(notice, sizeof notice, "chat: answer cut at %d token%s (-n)\n", o->steps, o->steps == 1 ? "" : "s");
            break;
        }
    }
    utf8_stream_flush(&c->out, stdout);
    end_dim();
    fputc('\n', stdout);
    errno = 0;
    const int written = fflush(stdout) == 0 && !ferror(stdout), err = errno ? errno : out_errno;
    fputs(notice, stderr);
    if (take_interrupt()) *stopped = 1; /* during the prompt or the last token: still this answer's */
    if (!written) {
        fprintf(stderr, "chat: standard output: write failed%s%s\n", err ? ": " : "", err ? strerror(err) : "");
        status = 1;
    }
    return status;
}

/* One turn for the user's message (the conversation's last): its prompt, then the answer, which joins
 * the conversation (also when Ctrl-C stopped it). Returns 0; 1 when the message was not sent (too
 * long, or a Ctrl-C during its prompt: it left the conversation); 130 when a Ctrl-C stopped a chat
 * that does not read a terminal; -1 after an error message. */
static int chat_turn(Chat* c) {
    const ChatOptions* o = c->o;
    int *run = NULL, start = 0, n_run = 0, from = 0, dropped = 0; /* turn_ids sets them when it returns 0 */
    const int r = turn_ids(c, &run, &start, &n_run, &from, &dropped);
    if (r > 0) conversation_drop_last(&c->conv); /* the message, not sent */
    if (r != 0) return r;
    const double t_prompt = now_seconds();
    PromptProgress progress = {.label = "chat", .show = isatty(STDERR_FILENO), .stop = &interrupted};
    int cut = 0;
    float* logits = forward_prompt(c->t, run, n_run, start, &c->dump, prompt_progress, &progress, &cut);
    prompt_progress_end(&progress);
    if (logits) memcpy(c->history + start, run, (size_t)n_run * sizeof(int));
    free(run);
    if (cut) { /* the cache holds the conversation up to start; after it, part of this prompt */
        take_interrupt();
        conversation_drop_last(&c->conv); /* and the turns the prompt left out stay */
        c->pos = start;
        if (!c->terminal) return 130;
        fputs("chat: Ctrl-C: the message was not sent\n", stderr);
        return 1;
    }
    if (!logits) return -1;
    if (dropped) {
        conversation_drop_before(&c->conv, from);
        fprintf(stderr, "chat: the context (%d tokens) is nearly full: the oldest %d turn%s left the conversation\n",
                c->t->config.seq_len, dropped, dropped > 1 ? "s" : "");
    }
    c->pos = start + n_run;
    if (o->verbose_prompt)
        print_token_ids(c->history, c->pos, "chat: prompt of %d token%s, %d of them already in the KV cache:", c->pos,
                        c->pos == 1 ? "" : "s", start);
    const int answer_start = c->pos;
    const double t0 = now_seconds();
    int stopped, n_tokens;
    const int failed = chat_answer(c, logits, &stopped, &n_tokens);
    const double dt = now_seconds() - t0, prompt_s = t0 - t_prompt;
    const int n_answer = c->pos - answer_start; /* the tokens run: the last one sampled may not be */
    if (o->verbose_prompt)
        print_token_ids(c->history + answer_start, n_answer, "chat: answer of %d token%s run through the model:",
                        n_answer, n_answer == 1 ? "" : "s");
    if (!failed && o->prompt) { /* after a failure, said already, no speed: as generate */
        print_speed(n_run, prompt_s, n_tokens, n_answer, dt, 0);
    } else if (!failed && c->terminal && n_tokens > 1) {
        fprintf(stderr, "[prompt: %d tokens run, %.2f s; answer: %d tokens, %.1f tok/s; context %d/%d]\n", n_run,
                prompt_s, n_tokens, n_tokens / (dt > 0 ? dt : 1e-9), c->pos, c->t->config.seq_len);
    }
    c->turn++;
    c->answered = 1;
    if (failed) return -1;
    /* the answer as text, as the template takes it next turn (its thinking dropped there) */
    char* answer = tokenizer_decode(c->tok, c->history + answer_start, n_answer, 0, NULL);
    if (conversation_add(&c->conv, "assistant", answer) != 0) return out_of_memory(-1);
    return stopped && !c->terminal ? 130 : 0;
}

enum { LINE_IS_MESSAGE, LINE_IS_DONE, LINE_LEAVES }; /* what a line read at the prompt asks for */
/* The most of a typed line a terminal's canonical mode passes on (it drops the rest): Linux's
 * 4,096-byte buffer less the newline's byte; elsewhere MAX_CANON, where the system defines it. */
#if defined(__linux__)
#define TERMINAL_LINE 4095
#elif defined(MAX_CANON)
#define TERMINAL_LINE (MAX_CANON - 1)
#else
#define TERMINAL_LINE 0 /* unknown: no check */
#endif

/* Whether a line typed at a terminal may have lost its end there (TERMINAL_LINE), said if so. */
static int cut_by_the_terminal(const Chat* c, const Str* line) {
    if (!c->terminal || TERMINAL_LINE <= 0 || line->n < TERMINAL_LINE) return 0;
    fprintf(stderr, "chat: a terminal takes at most %d bytes of a typed line, and this one reached that, so "
            "it may have been cut: not sent; /read FILE sends a longer text\n", TERMINAL_LINE);
    return 1;
}

/* Whether a line (of a message: in_block) cannot be sent, said if so: a NUL would end the message
 * there; an escape code is a key this chat does not edit with (an arrow: it reads lines as the
 * terminal gives them) and would go to the model as text. */
static int unsendable(const Chat* c, const Str* line, int in_block) {
    const int nul = memchr(line->p, '\0', line->n) != NULL, esc = c->terminal && memchr(line->p, 0x1b, line->n);
    if (nul || esc)
        fprintf(stderr, "chat: %s holds %s: not sent\n", in_block ? "a line of the message" : "the line",
                nul ? "a NUL byte" : "an escape code (an arrow or function key: this chat edits no lines)");
    return nul || esc;
}

/* Adds part (n bytes) to msg as its next line: a newline before every line but the first. */
static void add_line(Str* msg, int* lines, const char* part, size_t n) {
    if ((*lines)++) sadd(msg, "\n", 1);
    sadd(msg, part, n);
}

static int ends_with_quotes(const char* s, size_t n) { return n >= 3 && memcmp(s + n - 3, "\"\"\"", 3) == 0; }

/* A message of several lines, from a line that starts with three quotes to one that ends with
 * them (as Ollama takes them): the lines between joined with newlines, with the text after the
 * opening quotes and before the closing ones. line holds the opening line and receives the
 * message; cut: the opening line reached the terminal's limit. A line the terminal cut, or one that
 * cannot be sent (unsendable), drops the message, whose lines are read up to the closing quotes all
 * the same (they are not messages); from a pipe the latter then ends the chat with status 1. A
 * Ctrl-C drops it (a first Ctrl-C at a terminal: *armed; from a pipe it ends the chat), as does an
 * end of input inside it. */
static int read_block(Chat* c, Input* in, Str* line, int cut, int* armed, int* status) {
    Str msg = {0}, next = {0};
    int lines = 0, r = LINE_IS_MESSAGE, bad = 0;
    const char* first = line->p + 3;
    const size_t first_n = line->n - 3;
    int closed = !cut && first_n >= 3 && ends_with_quotes(first, first_n);
    if (closed || first_n > 0) add_line(&msg, &lines, first, closed ? first_n - 3 : first_n);
    while (!closed) {
        const int got = input_at_prompt(in, &next, "", c->terminal ? 2 : 0);
        if (got == LINE_INTERRUPTED) {
            if (c->terminal) {
                fputs("\nchat: the message is dropped\n", stderr);
                *armed = 1;
            } else {
                *status = 130;
            }
            r = c->terminal ? LINE_IS_DONE : LINE_LEAVES;
            break;
        }
        if (got == LINE_ERROR) {
            fprintf(stderr, "chat: standard input: %s\n", next.oom ? "out of memory" : strerror(errno));
            *status = 1;
            r = LINE_LEAVES;
            break;
        }
        if (got == LINE_EOF) {
            fprintf(stderr, "%schat: the input ended inside a \"\"\" message: not sent\n", c->terminal ? "\n" : "");
            if (!c->terminal) *status = 1;
            r = LINE_LEAVES;
            break;
        }
        closed = ends_with_quotes(next.p, next.n);
        /* said once; the message's lines still come */
        if (!cut && !bad && cut_by_the_terminal(c, &next)) cut = 1;
        if (!cut && !bad && unsendable(c, &next, 1)) bad = 1;
        if (!cut && !bad && (!closed || next.n > 3)) add_line(&msg, &lines, next.p, closed ? next.n - 3 : next.n);
    }
    free(next.p);
    if (msg.oom) r = out_of_memory(LINE_LEAVES), *status = 1;
    if (r == LINE_IS_MESSAGE && bad && !c->terminal) r = LINE_LEAVES, *status = 1;
    if (r == LINE_IS_MESSAGE && !cut && !bad) {
        free(line->p);
        *line = msg;
        if (line->p == NULL) sadd(line, "", 0);
        return line->p[strspn(line->p, " \t\r\n\v\f")] ? LINE_IS_MESSAGE : LINE_IS_DONE;
    }
    free(msg.p);
    return r == LINE_IS_MESSAGE ? LINE_IS_DONE : r;
}

/* The prompt and the user's next line, into line, and what it asks for: a message (in line), a
 * command carried out, nothing (a blank line), or to leave (*status set where that is an error). A
 * Ctrl-C at the prompt drops what was typed and says how to leave; a second one in a row leaves
 * (*armed: the previous line was such a Ctrl-C). From a pipe a Ctrl-C ends the chat with status
 * 130 (*status). */
static int chat_prompt(Chat* c, Input* in, Str* line, int* armed, int* status) {
    /* a blank line after an answer */
    const int r = input_at_prompt(in, line, c->answered ? "\n" : "", c->terminal ? 1 : 0);
    c->answered = 0;
    if (r == LINE_INTERRUPTED) {
        if (!c->terminal) {
            *status = 130;
            return LINE_LEAVES;
        }
        fputc('\n', stderr); /* after the terminal's "^C" */
        if (*armed) return LINE_LEAVES;
        *armed = 1;
        fputs("chat: Ctrl-C again, Ctrl-D or /bye leaves the chat\n", stderr);
        return LINE_IS_DONE;
    }
    *armed = 0;
    if (r == LINE_EOF) {
        if (c->terminal) fputc('\n', stderr); /* Ctrl-D: end the prompt's line */
        return LINE_LEAVES;
    }
    if (r == LINE_ERROR) {
        fprintf(stderr, "chat: standard input: %s\n", line->oom ? "out of memory" : strerror(errno));
        *status = 1;
        return LINE_LEAVES;
    }
    if (unsendable(c, line, 0)) {
        if (c->terminal) return LINE_IS_DONE;
        *status = 1;
        return LINE_LEAVES;
    }
    const int cut = cut_by_the_terminal(c, line);
    if (strncmp(line->p, "\"\"\"", 3) == 0 && !(cut && ends_with_quotes(line->p + 3, line->n - 3)))
        return read_block(c, in, line, cut, armed, status);
    if (cut) return LINE_IS_DONE;
    const int command = chat_command(c, line);
    if (command == COMMAND_FAILED) *status = 1;
    if (command == COMMAND_MESSAGE) return LINE_IS_MESSAGE;
    if (command != COMMAND_NONE) return command == COMMAND_DONE ? LINE_IS_DONE : LINE_LEAVES;
    /* an empty or blank line is no message */
    return line->p[strspn(line->p, " \t\r\v\f")] ? LINE_IS_MESSAGE : LINE_IS_DONE;
}

/* The checkpoint's chat tokens, the history and the logits file; 0, or 1 after an error message. */
static int chat_open(Chat* c) {
    const Tokenizer* tok = c->tok;
    c->im_end = tokenizer_find(tok, "<|im_end|>");
    /* The template is ChatML: a tokenizer without its tokens (a Llama export, say) would see plain text. */
    if (tokenizer_find(tok, "<|im_start|>") < 0 || c->im_end < 0) {
        fprintf(stderr, "chat: the checkpoint's tokenizer has no <|im_start|> / <|im_end|> tokens, so it has "
                        "no ChatML chat template; use generate mode (-i TEXT)\n");
        return 1;
    }
    c->think_open = tokenizer_find(tok, "<think>");
    c->think_close = tokenizer_find(tok, "</think>");
    c->terminal = isatty(STDIN_FILENO) && !c->o->prompt;
    /* dim thinking on a terminal, unless NO_COLOR is set (no-color.org) or the terminal is dumb */
    const char* term = getenv("TERM");
    const char* no_color = getenv("NO_COLOR");
    c->color = isatty(STDOUT_FILENO) && !(no_color && *no_color) && !(term && strcmp(term, "dumb") == 0);
    c->history = malloc(((size_t)c->t->config.seq_len + 1) * sizeof(int));
    if (!c->history) return out_of_memory(1);
    if (logits_dump_open(&c->dump, c->o->dump_logits, c->t) != 0) return 1;
    const char* sys = c->o->system_prompt;
    if (sys && sys[0] && conversation_add(&c->conv, "system", strdup(sys)) != 0) return out_of_memory(1);
    return 0;
}

/* Frees what chat_open made; returns status, or 1 when the logits file fails to close. */
static int chat_close(Chat* c, int status) {
    if (logits_dump_close(&c->dump) != 0) status = 1;
    conversation_free(&c->conv);
    free(c->history);
    return status;
}

int chat_main(Transformer* t, const Tokenizer* tok, Sampler* s, const ChatOptions* o, int* n_generated) {
    Chat c = {.t = t, .tok = tok, .s = s, .o = o};
    int status = chat_open(&c);
    if (status == 0 && signals_install() != 0) status = 1;
    if (status) return chat_close(&c, status);
    if (c.terminal) fputs(CHAT_HINT, stderr);
    Input in = {.eof = 0};
    Str line = {0};
    int armed = 0;
    while (!status) {
        if (!o->prompt) {
            const int r = chat_prompt(&c, &in, &line, &armed, &status);
            if (r == LINE_LEAVES) break;
            if (r == LINE_IS_DONE) continue;
        }
        if (conversation_add(&c.conv, "user", strdup(o->prompt ? o->prompt : line.p)) != 0) {
            status = out_of_memory(1);
            break;
        }
        const int r = chat_turn(&c);
        /* At a terminal a message too long for the context is not sent and the chat goes on; from
         * a pipe or -i it is an error, so that a script does not go on with a turn missing. */
        if (r == 1 && c.terminal) continue;
        if (r != 0) status = r < 0 ? 1 : r;
        if (o->prompt) break;
    }
    free(line.p);
    signals_restore();
    *n_generated = c.generated;
    return chat_close(&c, status);
}
