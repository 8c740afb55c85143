"""The project's Python passes pyflakes: no unused import or variable, no undefined name. An import kept for what
loading it does (libtorch before the extension, the ops registered) says so with `# noqa: F401`, as flake8 and ruff
read it."""
import linecache
import os
import re

import pytest

pytest.importorskip("pyflakes", reason="the lint needs pyflakes (requirements.txt installs it)")
from pyflakes.api import checkRecursive  # noqa: E402
from pyflakes.messages import UnusedImport  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ["easyscale_ext", "bench", "examples", "tests"]
KEPT_FOR_ITS_EFFECT = re.compile(r"#\s*noqa:[^#]*\bF401\b")


class Findings:
    """A pyflakes reporter that keeps each finding as pyflakes prints it."""

    def __init__(self):
        self.found = []

    def flake(self, message):
        line = linecache.getline(message.filename, message.lineno)
        if not (isinstance(message, UnusedImport) and KEPT_FOR_ITS_EFFECT.search(line)):
            self.found.append(str(message))

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {msg}")

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")


def test_pyflakes_finds_nothing():
    findings = Findings()
    checkRecursive([os.path.join(ROOT, folder) for folder in CHECKED], findings)
    assert not findings.found, "\n".join(findings.found)
