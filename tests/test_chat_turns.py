"""Multi-turn chat (chat.c, chat_main): each turn's prompt is the chat template's rendering of the
whole conversation (earlier answers without their thinking, as Qwen3's template renders them), and
the KV cache is kept only up to where it agrees with that prompt. Also --verbose-prompt.

A random tiny Qwen3 (hf_model.py's model, whose tokenizer has the chat tokens) chats for a few
turns with greedy sampling, printing each turn's prompt ids and answer ids (--verbose-prompt) and
writing the logits of every position it runs (--dump-logits). Then:

- logits: the positions run in each turn, after the cache was cut back to the shared prefix, give
  the logits (within 1e-4 of the row's largest) of the same ids run from position 0 in generate
  mode. A cache kept past the cut, or rows written at the wrong positions, would not: the control
  runs the turn's new tokens after the previous turn's prompt and answer as they were cached
  (the cache uncut), which must be farther off;
- ids: every prompt after the first ends with the template's next user turn and generation prompt;
  with --no-think the cache is cut right after the previous "<|im_start|>assistant\\n" (the
  template drops the empty think block of earlier answers); with --keep-thinking nothing is cut,
  each prompt being the previous prompt, the answer and chat_next_turn's text;
- a full context (-c 64) drops the oldest turns, the system prompt kept; /clear starts over.
"""
import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402

MESSAGES = ['hello there', 'and again', 'a third one']
STEPS = 6
TOL = 1e-4


def shared_prefix(a, b):
    """How many leading ids a and b have in common."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def rel_err(rows_a, rows_b):
    """max over rows of max |a - b| / max |b|."""
    err = 0.0
    for a, b in zip(rows_a, rows_b):
        scale = max(abs(x) for x in b) or 1.0
        err = max(err, max(abs(x - y) for x, y in zip(a, b)) / scale)
    return err


class ChatTurns(hf_model.TempDirTestCase):
    NEEDS = 'for the chat tests'

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ckpt = None
        if hf_model.missing_tools():
            return
        d = os.path.join(cls.tmp, 'hf')
        hf_model.write_model(d, hf_model.Spec(max_position_embeddings=256, seed=11))
        cls.ckpt = os.path.join(cls.tmp, 'model.bin')
        p = hf_model.run_export(d, cls.ckpt, dtype='f32')
        assert p.returncode == 0, p.stderr
        cls.vocab = hf_model.read_header(cls.ckpt)['vocab_size']

    def tokenize(self, text):
        p = hf_model.run_engine([self.ckpt, '-m', 'tokenize', '-i', text])
        self.assertEqual(p.returncode, 0, p.stderr)
        return [int(x) for x in p.stdout.split()]

    def chat(self, *args, messages=MESSAGES, steps=STEPS):
        """One turn per message; returns [(prompt ids, ids already cached, answer ids)], the dumped
        rows and stderr."""
        dump = os.path.join(self.tmp, 'chat.f32')
        p = subprocess.run([hf_model.RUN, self.ckpt, '-m', 'chat', '-t', '0', '-n', str(steps), '--verbose-prompt',
                            '--dump-logits', dump] + list(args), input=''.join(m + '\n' for m in messages),
                           cwd=hf_model.ROOT, capture_output=True, text=True, errors='replace', timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        n_turns = sum(bool(m.strip()) and not m.startswith('/') for m in messages)  # /clear, blank lines: no turn
        return self.parse(p.stderr, n_turns), hf_model.read_logits(dump, self.vocab), p.stderr

    def parse(self, stderr, n_turns=len(MESSAGES)):
        prompts = re.findall(r'^chat: prompt of (\d+) tokens?, (\d+) of them already in the KV cache: ([\d,]+)$',
                             stderr, re.M)
        answers = re.findall(r'^chat: answer of (\d+) tokens? run through the model:(.*)$', stderr, re.M)
        self.assertEqual((len(prompts), len(answers)), (n_turns, n_turns), stderr)
        turns = []
        for (n, cached, ids), (m, ans) in zip(prompts, answers):
            ids = [int(x) for x in ids.split(',')]
            ans = [int(x) for x in ans.replace(' ', '').split(',') if x]
            self.assertEqual((len(ids), len(ans)), (int(n), int(m)))
            turns.append((ids, int(cached), ans))
        return turns

    def generate_rows(self, ids):
        """The logits of ids run from position 0 in generate mode (prompt only)."""
        dump = os.path.join(self.tmp, 'gen.f32')
        p = hf_model.run_engine([self.ckpt, '--prompt-ids', ','.join(map(str, ids)), '-n', '0',
                                 '--dump-logits', dump])
        self.assertEqual(p.returncode, 0, p.stderr)
        return hf_model.read_logits(dump, self.vocab)

    def check_logits(self, turns, rows, control=False):
        """Each turn's rows against generate mode over that turn's prompt + answer. control: also
        against the same new tokens run after the previous turn's cache uncut (its prompt and
        answer as they were cached), which must be farther off."""
        at = 0
        for k, (ids, cached, ans) in enumerate(turns):
            n_rows = len(ids) - cached + len(ans)
            mine = rows[at:at + n_rows]
            at += n_rows
            err = rel_err(mine, self.generate_rows(ids + ans)[cached:])
            self.assertLess(err, TOL, 'turn %d: logits of the positions run after the cut' % (k + 1))
            if control and k > 0:
                prev_ids, _, prev_ans = turns[k - 1]
                uncut = self.generate_rows(prev_ids + prev_ans + ids[cached:] + ans)[-n_rows:]
                self.assertGreater(rel_err(mine, uncut), max(10 * err, 1e-3),
                                   'turn %d: an uncut cache is not told apart' % (k + 1))
        self.assertEqual(at, len(rows), 'rows in the dump')

    def user_turn(self, message, no_think):
        text = '<|im_end|>\n<|im_start|>user\n' + message + '<|im_end|>\n<|im_start|>assistant\n'
        return self.tokenize(text + ('<think>\n\n</think>\n\n' if no_think else ''))

    def test_template_prompt_no_think(self):
        turns, rows, _ = self.chat('--no-think')
        first = self.tokenize('<|im_start|>user\n' + MESSAGES[0] + '<|im_end|>\n<|im_start|>assistant\n')
        empty_think = self.tokenize('<think>\n\n</think>\n\n')
        self.assertEqual(turns[0][0], first + empty_think)
        self.assertEqual(turns[0][1], 0)
        for k in (1, 2):
            ids, cached, _ = turns[k]
            prev_ids, _, prev_ans = turns[k - 1]
            # cut right after the previous "<|im_start|>assistant\n": its empty think block is gone
            self.assertEqual(cached, len(prev_ids) - len(empty_think))
            self.assertEqual(ids[:cached], prev_ids[:cached])
            self.assertNotEqual(ids[cached:cached + len(empty_think)], empty_think)
            self.assertEqual(ids[-len(self.user_turn(MESSAGES[k], True)):], self.user_turn(MESSAGES[k], True))
        self.check_logits(turns, rows, control=True)

    def test_template_prompt_thinking(self):
        turns, rows, _ = self.chat()
        self.assertEqual(turns[0][0],
                         self.tokenize('<|im_start|>user\n' + MESSAGES[0] + '<|im_end|>\n<|im_start|>assistant\n'))
        for k in (1, 2):
            ids, cached, _ = turns[k]
            prev_ids, _, prev_ans = turns[k - 1]
            self.assertGreaterEqual(cached, len(prev_ids))  # the previous prompt is kept whole
            self.assertLessEqual(cached, len(prev_ids) + len(prev_ans))
            self.assertEqual(ids[:cached], (prev_ids + prev_ans)[:cached])
            self.assertEqual(ids[-len(self.user_turn(MESSAGES[k], False)):], self.user_turn(MESSAGES[k], False))
        self.check_logits(turns, rows)

    def test_keep_thinking_appends(self):
        turns, rows, _ = self.chat('--no-think', '--keep-thinking')
        for k in (1, 2):
            ids, cached, _ = turns[k]
            prev_ids, _, prev_ans = turns[k - 1]
            self.assertEqual(cached, len(prev_ids) + len(prev_ans))
            self.assertEqual(ids, prev_ids + prev_ans + self.user_turn(MESSAGES[k], True))
        self.check_logits(turns, rows)

    def test_clear_starts_a_new_conversation(self):
        """/clear: the next prompt is the template's for a conversation of that message alone (the
        system prompt kept), the cache cut where it differs (append-only: from position 0)."""
        sys_turn = '<|im_start|>system\nbe brief<|im_end|>\n'
        for keep in ((), ('--keep-thinking',)):
            with self.subTest(keep=keep):
                turns, rows, err = self.chat('-y', 'be brief', *keep, messages=[MESSAGES[0], '/clear', MESSAGES[1]])
                self.assertIn('chat: the conversation is cleared', err)
                ids, cached, _ = turns[1]
                self.assertEqual(ids, self.tokenize(sys_turn + '<|im_start|>user\n' + MESSAGES[1] +
                                                    '<|im_end|>\n<|im_start|>assistant\n'))
                self.assertEqual(cached, 0 if keep else shared_prefix(ids, turns[0][0] + turns[0][2]))
                self.assertGreaterEqual(cached, 0 if keep else len(self.tokenize(sys_turn)))
                self.check_logits(turns, rows)

    def test_verbose_prompt_in_generate_mode(self):
        """--verbose-prompt outside chat: the prompt's ids, as tokenize mode gives them."""
        p = hf_model.run_engine([self.ckpt, '-i', MESSAGES[0], '-n', '0', '--verbose-prompt'])
        self.assertEqual(p.returncode, 0, p.stderr)
        got = re.findall(r'^run: prompt of (\d+) tokens?: ([\d,]+)$', p.stderr, re.M)
        want = self.tokenize(MESSAGES[0])
        self.assertEqual(got, [(str(len(want)), ','.join(map(str, want)))], p.stderr)

    def test_full_context_drops_oldest_turns(self):
        """-c 64 and answers until the context is full: each answer is cut at position 64, and the
        next turn's prompt is the template's rendering of the conversation without its oldest
        turns (three quarters of the context at most), the cache cut back to what that prompt
        shares with it (here about "<|im_start|>user\\n"); with and without a system prompt, which
        stays."""
        messages = MESSAGES + ['four']
        for system in ('', 'be brief'):
            with self.subTest(system=system):
                self.check_full_context(messages, system)

    def check_full_context(self, messages, system):
        sys_turn = '<|im_start|>system\n' + system + '<|im_end|>\n' if system else ''
        turns, rows, err = self.chat('-c', '64', '-y', system, messages=messages, steps=0)
        self.assertEqual(err.count('the oldest 1 turn left the conversation'), len(messages) - 1, err)
        head = self.tokenize(sys_turn + '<|im_start|>user\n')  # the system prompt stays
        for k, (ids, cached, ans) in enumerate(turns):
            self.assertEqual(len(ids) + len(ans), 64, 'turn %d: the answer runs to the end of the context' % (k + 1))
            self.assertEqual(ids, self.tokenize(sys_turn + '<|im_start|>user\n' + messages[k] +
                                                '<|im_end|>\n<|im_start|>assistant\n'))
            if k:  # the longest prefix shared with what the cache held: at least "<|im_start|>user\n"
                self.assertEqual(cached, shared_prefix(ids, turns[k - 1][0] + turns[k - 1][2]))
                self.assertGreaterEqual(cached, len(head))
        self.check_logits(turns, rows)

    def run_chat(self, *args, messages=MESSAGES):
        return subprocess.run([hf_model.RUN, self.ckpt, '-m', 'chat', '-t', '0'] + list(args),
                              input=''.join(m + '\n' for m in messages), cwd=hf_model.ROOT,
                              capture_output=True, text=True, errors='replace', timeout=120)

    def test_blank_lines_are_no_messages(self):
        turns, _, _ = self.chat('--no-think', messages=['', '  \t ', MESSAGES[0]])
        self.assertEqual(len(turns), 1)  # parse() also checks that stderr shows one prompt, one answer

    def test_keep_thinking_full_context_is_an_error(self):
        """--keep-thinking cannot drop turns: a full context ends the chat with status 1 and says
        so, rather than leave the remaining messages silently unanswered with status 0."""
        p = self.run_chat('--keep-thinking', '-c', '64', messages=MESSAGES + ['four'])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn('--keep-thinking cannot drop earlier turns: the chat ends here', p.stderr)

    def test_message_too_long_for_the_context(self):
        p = self.run_chat('-c', '64', messages=[' '.join(['word'] * 80)])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r'this turn needs \d+ tokens of context, more than the 64 there are; '
                                   r'a larger -c/--ctx allows more \(the model supports 256\)')
        # At the model's maximum a larger -c cannot help, and the message says that instead.
        p = self.run_chat('-c', '256', messages=[' '.join(['word'] * 300)])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r'this turn needs \d+ tokens of context, more than the 256 there are; '
                                   r'256 is the model\'s maximum\n')
        # A system prompt that takes the room: the line gives its share
        p = self.run_chat('-c', '64', '-y', ' '.join(['word'] * 70), messages=['hi'])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r'this turn needs \d+ tokens of context \(the system prompt takes \d+ of them\), '
                                   r'more than the 64 there are')

    def chat_at_terminal(self, args, lines, echo=True):
        """The chat with lines typed at a terminal (stdin; stdout and stderr are pipes), then
        Ctrl-D; returns its status, stdout and stderr. echo False: the terminal echoes nothing
        (so that a long line does not fill the echo's buffer before it is drained)."""
        import pty
        import select
        import termios
        master, slave = pty.openpty()
        if not echo:
            attrs = termios.tcgetattr(slave)
            attrs[3] &= ~termios.ECHO
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
        try:
            p = subprocess.Popen([hf_model.RUN, self.ckpt, '-m', 'chat', '-t', '0'] + list(args), stdin=slave,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=hf_model.ROOT)
            os.close(slave)
            slave = None
            for line in lines:
                os.write(master, (line + '\n').encode())
            os.write(master, b'\x04')  # Ctrl-D: end of input
            out, err = p.communicate(timeout=120)
        finally:
            if slave is not None:
                os.close(slave)
            while select.select([master], [], [], 0)[0]:  # drain the echo
                try:
                    if not os.read(master, 4096):
                        break
                except OSError:
                    break
            os.close(master)
        return p.returncode, out.decode('utf-8', 'replace'), err.decode('utf-8', 'replace')

    def terminal_prompts(self, err):
        prompts = re.findall(r'^(?:> |\.\.\. )*chat: prompt of \d+ tokens?, (\d+) of them already in the KV cache: '
                             r'([\d,]+)$', err, re.M)  # "> " and "... ": the terminal's prompts
        return [(int(cached), [int(x) for x in ids.split(',')]) for cached, ids in prompts]

    def test_too_long_at_a_terminal_is_not_sent(self):
        """At a terminal a message too long for the context is not sent and the chat goes on (the
        next message is answered, in a conversation without the long one); from a pipe it is an
        error (test_message_too_long_for_the_context)."""
        long_message = ' '.join(['word'] * 80)
        for keep in ((), ('--keep-thinking',)):
            with self.subTest(keep=keep):
                status, _, err = self.chat_at_terminal(['-n', '4', '-c', '64', '--verbose-prompt'] + list(keep),
                                                       [long_message, MESSAGES[0]])
                self.assertEqual(status, 0, err)
                self.assertIn('(the message was not sent)', err)
                want = self.tokenize('<|im_start|>user\n' + MESSAGES[0] + '<|im_end|>\n<|im_start|>assistant\n')
                self.assertEqual([ids for _, ids in self.terminal_prompts(err)], [want], err)

    @unittest.skipUnless(sys.platform.startswith('linux'), "the 4,095-byte line of Linux's terminals")
    def test_line_cut_by_the_terminal_is_not_sent(self):
        """A terminal keeps 4,095 bytes of a typed line and drops the rest: such a line is not sent
        (it says so and names /read), and the chat goes on."""
        status, _, err = self.chat_at_terminal(['-n', '4', '--verbose-prompt'], ['x' * 5000, MESSAGES[0]],
                                               echo=False)
        self.assertEqual(status, 0, err)
        self.assertIn('chat: a terminal takes at most 4095 bytes of a typed line, and this one reached that, so it '
                      'may have been cut: not sent; /read FILE sends a longer text', err)
        want = self.tokenize('<|im_start|>user\n' + MESSAGES[0] + '<|im_end|>\n<|im_start|>assistant\n')
        self.assertEqual([ids for _, ids in self.terminal_prompts(err)], [want], err)
        # inside a three-quote message the cut drops the message, whose other lines are read to its
        # end all the same (they are no messages of their own)
        status, _, err = self.chat_at_terminal(['-n', '4', '--verbose-prompt'],
                                               ['"""', 'x' * 5000, 'second line', '"""', MESSAGES[0]], echo=False)
        self.assertEqual(status, 0, err)
        self.assertEqual(err.count('it may have been cut: not sent'), 1, err)
        self.assertNotIn('inside a """ message', err)
        self.assertEqual([ids for _, ids in self.terminal_prompts(err)], [want], err)

    def test_message_of_several_lines(self):
        """Lines from one that starts with three quotes to one that ends with them are one message,
        joined with newlines (the text after the opening quotes and before the closing ones kept);
        at a terminal the lines after the first are asked for with "... "; an input that ends
        inside such a message sends nothing (from a pipe: status 1)."""
        lines = ['"""', MESSAGES[0], 'and more', '"""', '"""' + MESSAGES[1], 'the end"""']
        p = subprocess.run([hf_model.RUN, self.ckpt, '-m', 'chat', '-t', '0', '-n', str(STEPS), '--verbose-prompt'],
                           input=''.join(l + '\n' for l in lines), cwd=hf_model.ROOT, capture_output=True,
                           text=True, errors='replace', timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        turns = self.parse(p.stderr, 2)
        self.assertEqual(turns[0][0], self.tokenize('<|im_start|>user\n' + MESSAGES[0] + '\nand more<|im_end|>\n'
                                                    '<|im_start|>assistant\n'))
        self.assertEqual(turns[1][0][-len(self.tokenize(MESSAGES[1] + '\nthe end<|im_end|>\n<|im_start|>assistant\n')):],
                         self.tokenize(MESSAGES[1] + '\nthe end<|im_end|>\n<|im_start|>assistant\n'))
        status, _, err = self.chat_at_terminal(['-n', '2', '--verbose-prompt'], ['"""', MESSAGES[0], 'and more', '"""'])
        self.assertEqual(status, 0, err)
        self.assertEqual(err.count('... '), 3, err)
        self.assertEqual([ids for _, ids in self.terminal_prompts(err)], [turns[0][0]], err)
        p = subprocess.run([hf_model.RUN, self.ckpt, '-m', 'chat', '-t', '0', '-n', str(STEPS)],
                           input='"""\n' + MESSAGES[0] + '\n', cwd=hf_model.ROOT, capture_output=True, text=True,
                           errors='replace', timeout=120)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn('chat: the input ended inside a """ message: not sent', p.stderr)
        self.assertEqual(p.stdout, '')

    def test_full_context_keeps_what_was_printed(self):
        """An answer the context's end stops: the conversation (/save) ends where the printed text
        does; the token with no room is neither printed nor kept; the notice comes after it."""
        path = os.path.join(self.tmp, 'full.json')
        p = subprocess.run([hf_model.RUN, self.ckpt, '-m', 'chat', '-t', '0', '-c', '64', '--no-think'],
                           input=MESSAGES[0] + '\n/save ' + path + '\n', cwd=hf_model.ROOT, capture_output=True,
                           text=True, errors='replace', timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('chat: the context is full (64 tokens): the answer stops here', p.stderr)
        with open(path) as f:
            saved = json.load(f)[-1]['content']
        self.assertTrue(saved, p.stdout)
        self.assertEqual(p.stdout.rstrip('\n'), saved.rstrip('\n'))

    def test_read_sends_a_file(self):
        """/read FILE: the file's text (its last newline dropped) is the message; a file that
        cannot be read, one without text, one with a NUL byte (not text), and what is no file (a
        folder, standard input's "-") are named and nothing is sent; at a terminal the chat goes on,
        from a pipe it ends with status 1 (test_chat_terminal.py, a failed command)."""
        path = os.path.join(self.tmp, 'message.txt')
        with open(path, 'w') as f:
            f.write(MESSAGES[0] + '\n')
        missing = os.path.join(self.tmp, 'no-such-message.txt')
        blank = os.path.join(self.tmp, 'blank.txt')
        with open(blank, 'w') as f:
            f.write(' \n\n')
        binary = os.path.join(self.tmp, 'binary.txt')
        with open(binary, 'wb') as f:
            f.write(b'ab\0cd\n')
        lines = ['/read ' + missing, '/read ' + blank, '/read ' + binary, '/read ' + self.tmp, '/read -',
                 '/read ' + path]
        status, _, err = self.chat_at_terminal(['-n', str(STEPS), '--verbose-prompt'], lines)
        self.assertEqual(status, 0, err)
        self.assertIn('chat: %s: cannot open: No such file or directory\n' % missing, err)
        self.assertIn('chat: %s has no text: nothing sent\n' % blank, err)
        self.assertIn('chat: %s holds a NUL byte (at byte 2): not text; nothing sent\n' % binary, err)
        self.assertIn('chat: %s: not a file; /read sends a file\'s text\n' % self.tmp, err)
        self.assertIn('chat: -: ', err)
        turns = self.terminal_prompts(err)
        self.assertEqual([ids for _, ids in turns], [self.tokenize('<|im_start|>user\n' + MESSAGES[0] +
                                                                   '<|im_end|>\n<|im_start|>assistant\n')])

    def test_message_not_sent_keeps_the_conversation(self):
        """A message too long for the context, refused after a turn, leaves the conversation as it
        was: the next prompt holds the earlier turn (the cache kept up to its answer), not only the
        new message, and no turn is said to have left."""
        long_message = ' '.join(['word'] * 80)  # more than 128 tokens
        for keep in ((), ('--keep-thinking',)):
            with self.subTest(keep=keep):
                status, _, err = self.chat_at_terminal(['-n', '4', '-c', '128', '--verbose-prompt'] + list(keep),
                                                       [MESSAGES[0], long_message, MESSAGES[1]])
                self.assertEqual(status, 0, err)
                self.assertIn('(the message was not sent)', err)
                # with --keep-thinking the way out is named: every turn stays until /clear
                self.assertEqual('--keep-thinking keeps every turn: /clear starts over' in err, bool(keep), err)
                self.assertNotIn('left the conversation', err)
                (_, first), (cached, second) = self.terminal_prompts(err)
                answer = re.search(r'^chat: answer of \d+ tokens? run through the model: ([\d,]+)$', err, re.M)
                answer = [int(x) for x in answer.group(1).split(',')]
                self.assertEqual(second[:len(first)], first, err)
                self.assertGreaterEqual(cached, len(first))
                if keep:  # appended: the whole previous answer is kept
                    self.assertEqual(second[:len(first) + len(answer)], first + answer)
                self.assertEqual(second[-len(self.user_turn(MESSAGES[1], False)):], self.user_turn(MESSAGES[1], False))

    def test_one_shot_full_context_promises_no_next_turn(self):
        p = subprocess.run([hf_model.RUN, self.ckpt, '-m', 'chat', '-t', '0', '-c', '32', '-i', MESSAGES[0]],
                           cwd=hf_model.ROOT, capture_output=True, text=True, errors='replace', timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('the context is full (32 tokens): the answer stops here', p.stderr)
        self.assertNotIn('next turn', p.stderr)


if __name__ == '__main__':
    unittest.main()
