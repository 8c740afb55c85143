"""Sphinx configuration of the API reference: `make docs` builds it into build/docs (open build/docs/index.html)."""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import easyscale_ext  # noqa: E402

project = "easyscale_ext"
release = version = easyscale_ext.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.viewcode"]
default_role = "code"  # `name` in a docstring is code, as the docstrings mean it
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
exclude_patterns = ["generated"]  # included by cli.rst, not a page of its own
html_theme = "alabaster"
nitpicky = False


def _commands(parser: argparse.ArgumentParser, prefix: str):
    """(command line, help text) of `parser` and of each of its subcommands, depth first."""
    yield prefix, parser.format_help()
    for action in parser._actions:  # argparse offers its subparsers no other way
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix} {name}")


def _write_cli_reference(app):
    """generated/cli.rst: every `easyscale` command's --help, from the parser itself."""
    from easyscale_ext.cli.main import parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal's width: one width for the pages
    lines = []
    for command, text in _commands(parser(), "easyscale"):
        lines += [f".. _cli-{command.replace(' ', '-')}:", "", command, "-" * len(command), "",
                  ".. code-block:: text", ""]
        lines += [f"    {line}".rstrip() for line in text.splitlines()] + [""]
    folder = os.path.join(app.srcdir, "generated")
    os.makedirs(folder, exist_ok=True)
    text = "\n".join(lines)
    path = os.path.join(folder, "cli.rst")
    if not os.path.exists(path) or open(path).read() != text:  # rewritten only when it changes
        with open(path, "w") as f:
            f.write(text)


def setup(app):
    app.connect("builder-inited", _write_cli_reference)
