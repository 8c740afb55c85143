"""The examples that docstrings carry, as scripts to run."""
import inspect
import textwrap


def docstring_example(obj) -> str:
    """The `.. code-block:: python` example of `obj`'s docstring, as a script."""
    doc = inspect.getdoc(obj)
    block = doc[doc.index(".. code-block:: python"):].split("\n", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:  # after the blank line that opens the block
        if line and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))
