"""The chat at a terminal (chat.c): Ctrl-C, the terminal's attributes, the commands, the hint, the
seed and the speed line.

The chat runs with a pseudo-terminal as its stdin, stdout and controlling terminal (so that Ctrl-C
and Ctrl-S typed there act as at a real one) and stderr on a pipe, read as it comes: each step
waits for the line on stderr that says the chat got there, so nothing depends on timing.

- Ctrl-C while an answer streams: Ctrl-S (stop output) is typed before the message, so the answer's
  first write blocks; the Ctrl-C then lands inside the answer. The chat goes on, the partial answer
  is in the next turn's prompt (the KV cache and the conversation agree), the dim thinking is
  followed by the attribute reset ESC[0m, and two Ctrl-C at the prompt leave with status 0.
- Ctrl-C during a prompt of more than one chunk (256 positions): with stderr on a terminal whose
  output is stopped, the progress line after the first chunk waits and the Ctrl-C lands there; the
  message is not sent, and the next turn's prompt has none of it.
- SIGTERM while the thinking is shown dim: the process dies of the signal after writing ESC[0m.
- Ctrl-Z (SIGTSTP) there: ESC[0m before the process stops, ESC[2m when it continues (the chat runs
  as a shell's job would, a process group of its own in the test's session, so the stop is real);
  at the prompt (and at a three-quote message's "... "), the prompt drawn again when it continues.
- the commands (/help, /bye = /quit = /exit, /clear, /system and /system "", /save, unknown ones),
  the one-line hint at a terminal only, the seed printed when it came from the clock (and
  repeating the chat with it), generate's speed line for -m chat -i.

The model: hf_model's tiny random Qwen3 with the <think> row of the (tied) embedding scaled up, so
that greedy decoding answers "hello there" with <think> tokens (checked, not assumed).
"""
import fcntl
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402

THINK_ID = hf_model.IM_END_ID + 1
DIM, RESET = b'\x1b[2m', b'\x1b[0m'
CTRL_C, CTRL_D, CTRL_S, CTRL_Q = b'\x03', b'\x04', b'\x13', b'\x11'
HINT = 'chat: /help lists the commands; Ctrl-C stops an answer; Ctrl-D or /bye leaves\n'
PROMPT_RE = r'chat: prompt of (\d+) tokens?, (\d+) of them already in the KV cache: ([\d,]+)\n'
ANSWER_RE = r'chat: answer of (\d+) tokens? run through the model: ?([\d,]*)\n'
NEXT_PROMPT = r'\n> '  # the prompt after a turn or a command
WRITE_SYSCALL = {'x86_64': '1', 'aarch64': '64'}.get(os.uname().machine)
DEADLINE = 60  # seconds: a guard against a hung chat, not a measurement


def process_state(pid):
    """The state letter of /proc/PID/stat ('T': stopped)."""
    with open('/proc/%d/stat' % pid) as f:
        return f.read().rsplit(')', 1)[1].split()[0]


def as_at_a_terminal():
    """In the chat's process before it starts: SIGINT and SIGQUIT at their defaults, as a shell
    leaves them for a job in the foreground. A test run started in the background by a shell
    without job control (`make test &` in a script) has them ignored, and the chat keeps a signal
    it inherits ignored (nohup's convention), so Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def terminal_env(extra=None):
    """The environment of a chat on a terminal that shows the dim thinking, whatever TERM and
    NO_COLOR the test runner has, with extra's variables on top."""
    env = {k: v for k, v in os.environ.items() if k != 'NO_COLOR'}
    env['TERM'] = 'xterm'
    env.update(extra or {})
    return env


def ids_of(text):
    return [int(x) for x in text.split(',') if x]


class TerminalChat:
    """./run with a pseudo-terminal as stdin, stdout and controlling terminal; stderr on a pipe.
    job=True: the terminal is not the controlling one, and the chat is a process group of its own
    in this test's session, as a shell's job is (a stop signal stops it; in a session of its own
    the kernel would discard the stop, the group being orphaned). stderr_terminal=True: stderr on a
    second pseudo-terminal (err_master; Ctrl-S typed there stops its output), read as the pipe is.
    echo=False: the terminal does not echo what is typed, so the master reads only the chat's own
    bytes (an echo held back by Ctrl-S is released with the chat's writes, in either order)."""

    def __init__(self, args, job=False, stderr_terminal=False, echo=True, env=None):
        self.master, slave = pty.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[0] |= termios.IXON  # Ctrl-S / Ctrl-Q stop and restart output
        attrs[3] |= termios.ISIG | termios.ICANON  # Ctrl-C: SIGINT; lines
        attrs[3] = attrs[3] | termios.ECHO if echo else attrs[3] & ~termios.ECHO
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        err_slave = None
        if stderr_terminal:
            self.err_master, err_slave = pty.openpty()
            attrs = termios.tcgetattr(err_slave)
            attrs[0] |= termios.IXON
            attrs[1] &= ~termios.OPOST  # the bytes as written (no \n -> \r\n)
            termios.tcsetattr(err_slave, termios.TCSANOW, attrs)

        def start():
            as_at_a_terminal()
            if job:
                os.setpgid(0, 0)
            else:
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the controlling terminal

        self.p = subprocess.Popen([hf_model.RUN] + args, stdin=slave, stdout=slave, env=terminal_env(env),
                                  stderr=err_slave if stderr_terminal else subprocess.PIPE,
                                  cwd=hf_model.ROOT, start_new_session=not job, preexec_fn=start)
        os.close(slave)
        self.errf = self.p.stderr
        if stderr_terminal:
            os.close(err_slave)
            self.errf = os.fdopen(self.err_master, 'rb', buffering=0)
        self.out, self.err, self.err_at = b'', b'', 0

    def pump(self, timeout):
        """Reads what stdout (with the terminal's echo) and stderr have; False at the end of both."""
        fds = [fd for fd in (self.master, self.errf.fileno() if self.errf else None) if fd is not None]
        if not fds:
            return False
        for fd in select.select(fds, [], [], timeout)[0]:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                data = b''
            if fd == self.master:
                self.out += data
                if not data:
                    os.close(self.master)
                    self.master = None
            else:
                self.err += data
                if not data:
                    self.errf.close()
                    self.errf = None
        return True

    def wait_err(self, pattern):
        """Waits for pattern in stderr after the previous match; returns the match."""
        deadline = time.monotonic() + DEADLINE
        while True:
            m = re.compile(pattern, re.M).search(self.err.decode('utf-8', 'replace'), self.err_at)
            if m:
                self.err_at = m.end()
                return m
            if time.monotonic() > deadline or not self.pump(1.0) or (self.p.poll() is not None and
                                                                    not self.pump(0)):
                raise AssertionError('stderr never showed %r; status %s; stderr:\n%s' %
                                     (pattern, self.p.poll(), self.err.decode('utf-8', 'replace')))

    def wait_blocked_writing_stdout(self, fd=1):
        """Waits until the chat's main thread sleeps in write(fd, ...) (output stopped by Ctrl-S)."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            with open('/proc/%d/syscall' % self.p.pid) as f:
                fields = f.read().split()
            if fields[:2] == [WRITE_SYSCALL, hex(fd)]:
                return
            self.pump(0.01)
        raise AssertionError('the chat never blocked writing to fd %d' % fd)

    def type(self, data):
        os.write(self.master, data)

    def finish(self):
        """Waits for the end; returns the status."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline and self.pump(1.0):
            if self.p.poll() is not None and not select.select([fd for fd in (self.master,) if fd], [], [], 0)[0]:
                break
        if self.p.poll() is None:
            self.p.kill()
        status = self.p.wait()
        # Then both sides to their end (EOF, or EIO once the terminal's other side is closed): what
        # the chat wrote last can reach the terminal's master a moment after the chat has exited.
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline and self.pump(0.5):
            pass
        self.close()
        return status

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        if self.master is not None:
            os.close(self.master)
            self.master = None
        for f in (self.p.stdin, self.errf):
            if f:
                f.close()


class ChatTerminal(hf_model.TempDirTestCase):
    NEEDS = 'for the chat tests'

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if hf_model.missing_tools():
            return
        d = os.path.join(cls.tmp, 'hf')
        rows = {hf_model.ENDOFTEXT_ID: 0.02, hf_model.IM_END_ID: 0.02, THINK_ID: 8.0}
        hf_model.write_model(d, hf_model.Spec(max_position_embeddings=256, seed=13, row_scales=rows))
        cls.ckpt = os.path.join(cls.tmp, 'model.bin')
        p = hf_model.run_export(d, cls.ckpt, dtype='f32')
        assert p.returncode == 0, p.stderr

    def tokenize(self, text):
        p = hf_model.run_engine([self.ckpt, '-m', 'tokenize', '-i', text])
        self.assertEqual(p.returncode, 0, p.stderr)
        return [int(x) for x in p.stdout.split()]

    def terminal(self, *args, job=False, echo=True, env=None):
        chat = TerminalChat([self.ckpt, '-m', 'chat', '-t', '0', '--verbose-prompt'] + list(args),
                            job=job, echo=echo, env=env)
        self.addCleanup(chat.close)
        return chat

    def piped(self, *args, lines=(), stdin_terminal=False):
        """The chat with lines on stdin (a pipe, or a terminal that is not its controlling one) and
        stdout and stderr on pipes."""
        cmd = [hf_model.RUN, self.ckpt, '-m', 'chat'] + list(args)
        text = ''.join(m + '\n' for m in lines)
        if not stdin_terminal:
            return subprocess.run(cmd, input=text, cwd=hf_model.ROOT, capture_output=True, text=True,
                                  errors='replace', timeout=DEADLINE)
        master, slave = pty.openpty()
        try:
            p = subprocess.Popen(cmd, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 cwd=hf_model.ROOT)
            os.close(slave)
            slave = None
            os.write(master, (text.encode() + CTRL_D))
            out, err = p.communicate(timeout=DEADLINE)
        finally:
            if slave is not None:
                os.close(slave)
            os.close(master)
        return subprocess.CompletedProcess(cmd, p.returncode, out.decode('utf-8', 'replace'),
                                           err.decode('utf-8', 'replace'))

    # --------------------------------------------------------------------------------------------
    # Ctrl-C and the terminal's attributes

    def test_ctrl_c_stops_the_answer_and_the_chat_goes_on(self):
        for keep in ((), ('--keep-thinking',)):
            with self.subTest(keep=keep):
                self.check_ctrl_c(keep)

    def check_ctrl_c(self, keep):
        chat = self.terminal('-n', '20', *keep)
        chat.wait_err('^' + re.escape(HINT) + '> ')
        chat.type(CTRL_S + b'hello there\n')  # output stopped: the answer's first write waits
        first = chat.wait_err(PROMPT_RE)
        chat.type(CTRL_C)  # SIGINT, and output restarts
        answer = chat.wait_err(ANSWER_RE)
        chat.wait_err(NEXT_PROMPT)
        chat.type(b'and again\n')
        second = chat.wait_err(PROMPT_RE)
        chat.wait_err(ANSWER_RE)
        chat.wait_err(NEXT_PROMPT)
        chat.type(CTRL_C)  # at the prompt: a hint
        chat.wait_err(r'chat: Ctrl-C again, Ctrl-D or /bye leaves the chat\n> ')
        chat.type(CTRL_C)  # a second one in a row leaves
        self.assertEqual(chat.finish(), 0, chat.err)

        p1, ans1 = ids_of(first.group(3)), ids_of(answer.group(2))
        self.assertEqual(ans1[:1], [THINK_ID], 'the model answers with <think> (the test needs dim text)')
        self.assertLess(len(ans1), 20, 'Ctrl-C stopped the answer, not -n')
        self.assertNotIn('(-n)', chat.err[:answer.start()].decode())
        # The partial answer is in the next prompt, as the cache holds it.
        p2, cached2 = ids_of(second.group(3)), int(second.group(2))
        self.assertEqual(p2[:len(p1) + len(ans1)], p1 + ans1)
        self.assertGreaterEqual(cached2, len(p1) + len(ans1))
        self.assertEqual(p2[len(p1) + len(ans1)], hf_model.IM_END_ID)
        # The dim text is followed by the reset.
        self.assertIn(DIM, chat.out)
        self.assertIn(RESET, chat.out[chat.out.rindex(DIM):], chat.out)

    def test_ctrl_c_inside_a_three_quote_message(self):
        """Ctrl-C in a message of several lines drops it; it counts as the first of two Ctrl-Cs
        that leave, as at the prompt."""
        chat = self.terminal('-n', '4')
        chat.wait_err('^' + re.escape(HINT) + '> ')
        chat.type(b'"""\nabc\n')
        chat.wait_err(r'\.\.\. \.\.\. ')
        chat.type(CTRL_C)
        chat.wait_err(r'chat: the message is dropped\n> ')
        chat.type(CTRL_C)
        self.assertEqual(chat.finish(), 0, chat.err)
        self.assertNotIn(b'chat: prompt of', chat.err)

    def test_no_dim_with_no_color_or_a_dumb_terminal(self):
        """NO_COLOR (no-color.org) or TERM=dumb: the thinking is shown without the dim attribute."""
        plain = {'TERM': 'xterm'}
        for env in ({'NO_COLOR': '1'}, {'TERM': 'dumb'}, plain):
            with self.subTest(env=env):
                chat = self.terminal('-n', '4', echo=False, env=env)
                chat.wait_err('^' + re.escape(HINT) + '> ')
                chat.type(b'hello there\n')
                answer = chat.wait_err(ANSWER_RE)
                chat.wait_err(NEXT_PROMPT)
                chat.type(CTRL_D)
                self.assertEqual(chat.finish(), 0, chat.err)
                self.assertEqual(ids_of(answer.group(2))[:1], [THINK_ID], 'the test needs a thinking answer')
                self.assertEqual(DIM in chat.out, env is plain, chat.out)

    def signal_while_dim(self, chat, sig):
        """Sends sig while the chat writes its answer's first, dim, token (stdout stopped by Ctrl-S,
        so the write waits), then lets the output go on. Run the chat without the terminal's echo:
        the typed message's echo waits behind Ctrl-S too, and comes out before or after the
        handler's reset."""
        chat.wait_err(NEXT_PROMPT)
        chat.type(CTRL_S + b'hello there\n')
        chat.wait_err(PROMPT_RE)
        chat.wait_blocked_writing_stdout()
        chat.p.send_signal(sig)
        chat.type(CTRL_Q)

    def test_ctrl_z_at_the_prompt_draws_it_again(self):
        """Ctrl-Z at the prompt, and at a three-quote message's next line: when the chat continues
        (a shell's fg) the prompt is drawn again, where fg left the cursor, and the chat goes on."""
        chat = self.terminal('-c', '256', '-n', '4', job=True, echo=False)

        def stop_and_continue():
            chat.p.send_signal(signal.SIGTSTP)
            deadline = time.monotonic() + DEADLINE
            while process_state(chat.p.pid) != 'T':
                self.assertLess(time.monotonic(), deadline, 'the chat never stopped')
                chat.pump(0.01)
            chat.p.send_signal(signal.SIGCONT)

        def next_on_stderr(text):  # text, and nothing before it since the last wait
            at = chat.err_at
            self.assertEqual(chat.wait_err(re.escape(text)).start(), at, chat.err)

        chat.wait_err('^' + re.escape(HINT) + '> ')
        stop_and_continue()
        next_on_stderr('> ')
        chat.type(b'"""\n')
        next_on_stderr('... ')
        stop_and_continue()
        next_on_stderr('... ')
        chat.type(b'hello\n"""\n')
        chat.wait_err(ANSWER_RE)
        chat.wait_err(NEXT_PROMPT)
        chat.type(CTRL_D)
        self.assertEqual(chat.finish(), 0, chat.err)

    @unittest.skipUnless(WRITE_SYSCALL and os.path.exists('/proc/self/syscall'),
                         'needs /proc/PID/syscall and a known write syscall number')
    def test_sigterm_resets_the_dim_attribute(self):
        chat = self.terminal('-c', '256', echo=False)
        self.signal_while_dim(chat, signal.SIGTERM)
        self.assertEqual(chat.finish(), -signal.SIGTERM, chat.err)
        self.assertTrue(chat.out.endswith(RESET), chat.out)

    @unittest.skipUnless(WRITE_SYSCALL and os.path.exists('/proc/self/syscall'),
                         'needs /proc/PID/syscall and a known write syscall number')
    def test_ctrl_z_resets_the_dim_until_the_chat_continues(self):
        """Ctrl-Z (SIGTSTP) while the thinking is shown dim: ESC[0m is written before the process
        stops, so the shell is not left dim, ESC[2m again when it continues, and the chat goes on."""
        chat = self.terminal('-c', '256', '-n', '20', job=True, echo=False)
        self.signal_while_dim(chat, signal.SIGTSTP)
        deadline = time.monotonic() + DEADLINE
        while process_state(chat.p.pid) != 'T':
            self.assertLess(time.monotonic(), deadline, 'the chat never stopped')
            chat.pump(0.01)
        while chat.pump(0.2) and select.select([chat.master], [], [], 0)[0]:
            pass
        # The answer's own write waits to be restarted after the stop: the handler's reset is last.
        self.assertTrue(chat.out.endswith(RESET), chat.out)
        stopped_at = len(chat.out)
        chat.p.send_signal(signal.SIGCONT)
        chat.wait_err(ANSWER_RE)
        chat.wait_err(NEXT_PROMPT)
        # The handler's ESC[2m, then the restarted write's own.
        self.assertTrue(chat.out[stopped_at:].startswith(DIM + DIM), chat.out[stopped_at:])
        chat.type(CTRL_D)
        self.assertEqual(chat.finish(), 0, chat.err)
        self.assertIn(RESET, chat.out[stopped_at:])

    @unittest.skipUnless(WRITE_SYSCALL and os.path.exists('/proc/self/syscall'),
                         'needs /proc/PID/syscall and a known write syscall number')
    def test_ctrl_c_during_a_long_prompt_drops_the_message(self):
        """A prompt longer than one chunk of the forward pass (256 positions) shows its progress on
        a terminal's stderr and stops between chunks at a Ctrl-C: the message is not sent, the
        chat goes on, and the next turn's prompt has no trace of it. stderr's output is stopped
        (Ctrl-S there), so the progress line after the first chunk waits; the Ctrl-C comes then.
        A model of 1,024 positions, exported here, chatting in 512 of them: the long message with the
        first turn would fill more than 3/4 of them, so its prompt leaves that turn out, which stays
        in the conversation all the same when the message is not sent."""
        d = self.fresh_dir('long')
        hf_model.write_model(os.path.join(d, 'hf'), hf_model.Spec(max_position_embeddings=1024, seed=13))
        ckpt = os.path.join(d, 'model.bin')
        p = hf_model.run_export(os.path.join(d, 'hf'), ckpt, dtype='f32')
        self.assertEqual(p.returncode, 0, p.stderr)
        long_message = 'once upon a time there was a little cat ' * 12
        p = hf_model.run_engine([ckpt, '-m', 'tokenize', '-i', long_message])
        n_long = len(p.stdout.split())
        self.assertGreater(n_long, 300, 'the message needs more than one chunk of 256')
        chat = TerminalChat([ckpt, '-m', 'chat', '-t', '0', '--verbose-prompt', '-n', '3', '-c', '512'],
                            stderr_terminal=True)
        self.addCleanup(chat.close)
        chat.wait_err(r'> ')
        chat.type(b'hello there ' * 25 + b'\n')
        first = chat.wait_err(PROMPT_RE)
        answer = chat.wait_err(ANSWER_RE)
        chat.wait_err(NEXT_PROMPT)
        os.write(chat.err_master, CTRL_S)
        chat.type(long_message.encode() + b'\n')
        chat.wait_blocked_writing_stdout(fd=2)  # the progress line after the first chunk
        chat.type(CTRL_C)
        os.write(chat.err_master, CTRL_Q)
        # the line written over, then cleared before the chat says what happened
        piece = 16 if hf_model.reference_engine() else 256  # cli/generation.h, EXACT_SPLIT_PIECE
        progress = chat.wait_err(r'\rchat: prompt %d/(\d+) tokens\x1b\[K\r\x1b\[Kchat: Ctrl-C: the message was not sent\n> '
                                 % piece)
        self.assertGreater(int(progress.group(1)), 256)
        chat.type(b'and again\n')
        second = chat.wait_err(PROMPT_RE)
        chat.wait_err(ANSWER_RE)
        chat.wait_err(NEXT_PROMPT)
        chat.type(CTRL_D)
        self.assertEqual(chat.finish(), 0, chat.err)
        p1, ans1, p2 = ids_of(first.group(3)), ids_of(answer.group(2)), ids_of(second.group(3))
        self.assertGreater(len(p1) + len(ans1) + n_long, 512 * 3 // 4, 'the long prompt leaves the first turn out')
        self.assertNotIn(b'left the conversation', chat.err)
        # the first turn, its answer, then the new message in the template (tens of tokens): none
        # of the long one's 300 and more (the answer as the template renders it: only the first
        # turn's prompt is compared)
        self.assertEqual(p2[:len(p1)], p1)
        self.assertLess(len(p2), len(p1) + len(ans1) + 100, p2)
        if piece == 256:  # a prompt of one chunk shows none (every chat prompt is longer than 16)
            self.assertNotRegex(chat.err[:progress.start()].decode(), r'prompt \d+/')

    def test_ctrl_d_leaves_at_once(self):
        chat = self.terminal('-n', '3')
        chat.wait_err(NEXT_PROMPT)
        chat.type(b'hello there\n')
        chat.wait_err(ANSWER_RE)
        chat.wait_err(NEXT_PROMPT)
        chat.type(CTRL_D)
        self.assertEqual(chat.finish(), 0, chat.err)

    @unittest.skipUnless(WRITE_SYSCALL and os.path.exists('/proc/self/syscall'),
                         'needs /proc/PID/syscall and a known write syscall number')
    def test_ctrl_c_from_a_pipe_ends_the_chat(self):
        """stdin a pipe (a script): Ctrl-C stops the answer and ends the chat with status 130, the
        attributes reset (stdout is still the terminal). The Ctrl-C comes while the answer's first,
        dim, token waits to be written (stdout stopped by Ctrl-S), not while the prompt runs, which
        on a loaded machine can take longer than the test's reading of stderr."""
        master, slave = pty.openpty()
        p = subprocess.Popen([hf_model.RUN, self.ckpt, '-m', 'chat', '-t', '0', '-c', '256', '--verbose-prompt'],
                             stdin=subprocess.PIPE, stdout=slave, stderr=subprocess.PIPE, cwd=hf_model.ROOT,
                             start_new_session=True, env=terminal_env(),
                             preexec_fn=lambda: (as_at_a_terminal(), fcntl.ioctl(1, termios.TIOCSCTTY, 0)))
        os.close(slave)
        chat = TerminalChat.__new__(TerminalChat)
        chat.master, chat.p, chat.errf, chat.out, chat.err, chat.err_at = master, p, p.stderr, b'', b'', 0
        self.addCleanup(chat.close)
        attrs = termios.tcgetattr(master)
        attrs[0] |= termios.IXON
        attrs[3] |= termios.ISIG
        termios.tcsetattr(master, termios.TCSANOW, attrs)
        chat.type(CTRL_S)
        p.stdin.write(b'hello there\nand again\n')
        p.stdin.flush()
        chat.wait_err(PROMPT_RE)
        chat.wait_blocked_writing_stdout()
        chat.type(CTRL_C)
        self.assertEqual(chat.finish(), 130, chat.err)
        self.assertEqual(len(re.findall(PROMPT_RE, chat.err.decode(), re.M)), 1, 'the second line is not sent')
        self.assertIn(RESET, chat.out[chat.out.rindex(DIM):], chat.out)

    # --------------------------------------------------------------------------------------------
    # commands and the hint

    def test_leave_commands(self):
        for word in ('/bye', '/quit', '/exit', ' /bye', '\t/quit'):  # the first word, after blanks too
            with self.subTest(word=word):
                p = self.piped('-t', '0', '-n', '2', '--verbose-prompt', lines=[word, 'hello there'],
                               stdin_terminal=True)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertNotIn('chat: prompt of', p.stderr)
                self.assertEqual(p.stdout, '')

    def test_help_and_unknown_commands_are_not_sent(self):
        """At a terminal /help and an unknown command are said and not sent, nor a line with an escape
        code (an arrow key: the chat edits no lines), nor a message of several lines with such a line; "/usr/bin ..."
        is a message, and "//word ..." sends "/word ..."."""
        p = self.piped('-t', '0', '-n', '2', '--verbose-prompt',
                       lines=['/help', '/frobnicate now', 'ab\x1b[Dc', '"""first', 'ab\x1b[Dc', 'last"""',
                              '/usr/bin is a folder', '//frobnicate now'],
                       stdin_terminal=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        for command in ('/help', '/bye', '/quit', '/exit', '/clear', '/system TEXT', '/save FILE', 'Ctrl-C'):
            self.assertIn(command, p.stderr)
        self.assertIn('chat: unknown command /frobnicate; /help lists the commands (the line was not sent; '
                      '//frobnicate sends it as a message)', p.stderr)
        self.assertIn('chat: the line holds an escape code (an arrow or function key: this chat edits no lines): '
                      'not sent', p.stderr)
        self.assertIn('chat: a line of the message holds an escape code (an arrow or function key: this chat edits '
                      'no lines): not sent', p.stderr)
        prompts = re.findall(PROMPT_RE, p.stderr, re.M)
        self.assertEqual(len(prompts), 2, p.stderr)
        want = self.tokenize('<|im_start|>user\n/usr/bin is a folder<|im_end|>\n<|im_start|>assistant\n')
        self.assertEqual(ids_of(prompts[0][2]), want)
        want = self.tokenize('<|im_start|>user\n/frobnicate now<|im_end|>\n<|im_start|>assistant\n')
        self.assertEqual(ids_of(prompts[1][2])[-len(want):], want)

    def test_failed_command_from_a_pipe_ends_the_chat(self):
        """From a pipe (a script) a line that is not sent ends the chat with status 1, so that the
        script does not go on with a turn missing: an unknown command, a /read or /save that fails,
        a NUL byte."""
        fifo_dir = self.fresh_dir('failed_commands')
        for line, said in (('/frobnicate now', 'unknown command /frobnicate'),
                           ('/read ' + os.path.join(fifo_dir, 'missing.txt'), 'cannot open'),
                           ('/save ' + fifo_dir, 'is a directory'),
                           ('ab\0cd', 'the line holds a NUL byte: not sent'),
                           ('"""first\nab\0cd\nlast"""', 'a line of the message holds a NUL byte: not sent')):
            with self.subTest(line=line):
                p = self.piped('-t', '0', '-n', '2', '--verbose-prompt', lines=line.split('\n') + ['hello there'])
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn(said, p.stderr)
                self.assertNotRegex(p.stderr, PROMPT_RE)

    def test_hint_at_a_terminal_only(self):
        p = self.piped('-t', '0', '-n', '2', lines=['hello there'], stdin_terminal=True)
        self.assertTrue(p.stderr.startswith(HINT), p.stderr)
        p = self.piped('-t', '0', '-n', '2', lines=['hello there'])
        self.assertNotIn('/help', p.stderr)
        p = self.piped('-t', '0', '-n', '2', '-i', 'hello there', stdin_terminal=True)
        self.assertNotIn('/help', p.stderr)

    def assert_second_prompt(self, p, messages):
        """The chat p (--verbose-prompt, --no-think) ran two prompts, the second the template's
        rendering of messages and then the no-think answer's start."""
        prompts = re.findall(PROMPT_RE, p.stderr, re.M)
        self.assertEqual(len(prompts), 2, p.stderr)
        text = ''.join('<|im_start|>%s\n%s<|im_end|>\n' % (m['role'], m['content']) for m in messages)
        self.assertEqual(ids_of(prompts[1][2]),
                         self.tokenize(text + '<|im_start|>assistant\n<think>\n\n</think>\n\n'))

    def test_system_and_save(self):
        """/save writes the conversation as JSON; /system replaces the system prompt, the turns kept:
        the next prompt is the template's rendering of the saved conversation and the new message."""
        saved = [os.path.join(self.tmp, 'one.json'), os.path.join(self.tmp, 'two.json')]
        p = self.piped('-t', '0', '-n', '4', '--no-think', '-y', 'be brief', '--verbose-prompt',
                       lines=['hello there', '/save ' + saved[0], '/system be terse', '/system',
                              'and again', '/save ' + saved[1]])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('chat: the system prompt: be terse\n', p.stderr)
        self.assertIn('chat: 3 messages saved to %s\n' % saved[0], p.stderr)
        with open(saved[0], encoding='utf-8') as f:
            one = json.load(f)
        with open(saved[1], encoding='utf-8') as f:
            two = json.load(f)
        self.assertEqual([(m['role'], m['content']) for m in one[:2]], [('system', 'be brief'), ('user', 'hello there')])
        self.assertEqual([m['role'] for m in one], ['system', 'user', 'assistant'])
        self.assertEqual(two[:3], [{'role': 'system', 'content': 'be terse'}] + one[1:])
        self.assertEqual([m['role'] for m in two[3:]], ['user', 'assistant'])
        self.assertEqual(two[3]['content'], 'and again')
        self.assert_second_prompt(p, two[:4])

    def test_system_removed(self):
        """/system "" removes the system prompt, as -y "" gives none: the next prompt renders the
        conversation without it (and /system says there is none)."""
        saved = os.path.join(self.tmp, 'no_system.json')
        p = self.piped('-t', '0', '-n', '4', '--no-think', '-y', 'be brief', '--verbose-prompt',
                       lines=['hello there', '/system ""', '/system', 'and again', '/save ' + saved])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('chat: the system prompt is removed\nchat: no system prompt\n', p.stderr)
        with open(saved, encoding='utf-8') as f:
            messages = json.load(f)
        self.assertEqual([m['role'] for m in messages], ['user', 'assistant', 'user', 'assistant'])
        self.assert_second_prompt(p, messages[:3])

    def test_home_in_file_names(self):
        """/save ~/FILE and /read ~/FILE name a file under $HOME, as a shell would read them (no
        shell sees the chat's lines); ~user stays as it is."""
        from unittest import mock
        home = os.path.join(self.tmp, 'home')
        os.makedirs(home, exist_ok=True)
        with open(os.path.join(home, 'question.txt'), 'w', encoding='utf-8') as f:
            f.write('hello there\n')
        with mock.patch.dict(os.environ, {'HOME': home}):
            p = self.piped('-t', '0', '-n', '2', lines=['/read ~/question.txt', '/save ~/chat.json',
                                                        '/save ~nobody/chat.json'], stdin_terminal=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('chat: 2 messages saved to %s\n' % os.path.join(home, 'chat.json'), p.stderr)
        with open(os.path.join(home, 'chat.json'), encoding='utf-8') as f:
            self.assertEqual(json.load(f)[0], {'role': 'user', 'content': 'hello there'})
        self.assertIn('chat: ~nobody/chat.json: cannot write the conversation', p.stderr)

    def test_save_failure_leaves_no_file(self):
        """A /save that fails is said, and leaves no file; at a terminal the chat goes on."""
        missing = os.path.join(self.tmp, 'no such folder', 'chat.json')
        p = self.piped('-t', '0', '-n', '2', lines=['hello there', '/save ' + missing, '/save'], stdin_terminal=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('chat: %s: cannot write the conversation: No such file or directory' % missing, p.stderr)
        self.assertIn('chat: /save needs a file name', p.stderr)
        self.assertEqual([f for f in os.listdir(self.tmp) if '.tmp' in f], [])

    # --------------------------------------------------------------------------------------------
    # the seed and the speed line

    def test_seed_is_printed_and_repeats_the_chat(self):
        lines = ['hello there', 'and again']
        p = self.piped('-n', '8', lines=lines)  # the model's temperature (0.6): sampled
        self.assertEqual(p.returncode, 0, p.stderr)
        m = re.search(r'^seed: (\d+) \(from the clock; -s (\d+) repeats this chat\)$', p.stderr, re.M)
        self.assertIsNotNone(m, p.stderr)
        self.assertEqual(m.group(1), m.group(2))
        self.assertNotIn('seed', p.stdout)
        again = self.piped('-n', '8', '-s', m.group(1), lines=lines)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(again.stdout, p.stdout)
        self.assertNotIn('seed:', again.stderr)  # given: nothing to repeat

    def test_one_shot_chat_prints_the_speed_line(self):
        p = self.piped('-t', '0', '-n', '4', '-i', 'hello there')
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stderr, r'(?m)^prompt tokens: \d+, prefill: \d+\.\d tok/s, generated tokens: 4, '
                                   r'decode: \d+\.\d tok/s$')
        self.assertNotIn('tok/s', p.stdout)


if __name__ == '__main__':
    unittest.main()
