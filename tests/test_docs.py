"""The documents that list what the code has: docs/design.md's table of the engine's inputs besides
its options (every environment variable the engine reads, and the count the table's first line
gives), and the README's table of files (every tool in tools/). A variable or a tool added to the
code and not to its list fails here."""
import glob
import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = ["model.c", "checkpoint.c", "run.c", "kernels/**/*.c", "kernels/**/*.h", "tokenizer/*.c", "cli/*.c"]
NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve".split()


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def engine_variables():
    """({name: [files]} of every environment variable the engine's sources read by name: getenv's
    literal arguments and those of matmul.c's env_choice, which passes its name on to getenv;
    [files] of each getenv whose argument is not a literal)."""
    found, passed_on = {}, []
    for pattern in ENGINE:
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            text = read(path)
            for name in re.findall(r'\b(?:getenv|env_choice)\("([A-Za-z_][A-Za-z0-9_]*)"', text):
                found.setdefault(name, []).append(os.path.relpath(path, ROOT))
            passed_on += [os.path.relpath(path, ROOT)] * len(re.findall(r'\bgetenv\((?!")', text))
    return found, passed_on


def section(text, anchor):
    """The text from <a id="anchor"> to the next anchor."""
    start = text.index('<a id="%s">' % anchor)
    end = text.find("<a id=", start + 1)
    return text[start:end if end > 0 else len(text)]


class Docs(unittest.TestCase):
    def test_every_variable_the_engine_reads_is_listed(self):
        """design.md#hidden-inputs names each variable the engine reads (in backquotes), and its
        first line counts them."""
        found, passed_on = engine_variables()
        self.assertIn("KERNELS_SPIN_US", found)  # the scan sees the engine's reads at all
        self.assertIn("KERNELS_AMX", found)      # and env_choice's
        self.assertEqual(passed_on, ["kernels/fast/matmul.c"], "a getenv of a name the scan cannot read "
                         "(only env_choice's is known): list its callers' names here")
        inputs = section(read("docs/design.md"), "hidden-inputs")
        missing = sorted(n for n in found if "`%s`" % n not in inputs)
        self.assertEqual(missing, [], "read by the engine (%s) but not in docs/design.md#hidden-inputs"
                         % "; ".join("%s: %s" % (n, ", ".join(found[n])) for n in missing))
        m = re.search(r"the engine reads (\w+) environment variables", inputs)
        self.assertTrue(m, "design.md#hidden-inputs no longer counts the variables")
        self.assertEqual(m.group(1), NUMBERS[len(found)] if len(found) < len(NUMBERS) else str(len(found)),
                         "design.md#hidden-inputs counts %s variables, the engine reads %d: %s"
                         % (m.group(1), len(found), ", ".join(sorted(found))))

    def test_every_tool_is_in_the_files_table(self):
        """The README's Files table names every file and folder of tools/."""
        readme = read("README.md")
        row = next(line for line in readme.splitlines() if line.startswith("| `tools/` |"))
        tools = sorted(os.listdir(os.path.join(ROOT, "tools")))
        self.assertIn("train.py", tools)
        named = set(re.findall(r"`([^`]+)`", row))
        missing = [t for t in tools if t not in named and t.rstrip("/") + "/" not in named and not t.startswith(".")
                   and t != "__pycache__"]
        self.assertEqual(missing, [], "tools/ has files the README's Files table does not name")


if __name__ == "__main__":
    unittest.main()
