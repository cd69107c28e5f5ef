"""How spmdsim writes down a collective call and the state of every device: the texts of its errors,
traces and debugger."""
from __future__ import annotations

import os
import re
import sys
from typing import NamedTuple, Sequence

__all__ = ["Signature", "describe", "shown_avals", "format_table", "TABLE_HEADER", "deadlock_text", "mismatch_text",
           "who", "cell_names", "cell_number"]

TABLE_HEADER = ("device", "state", "collective", "axis", "step", "source line")


class Signature(NamedTuple):
    """What every device of a communicator must agree on at one step: the primitive, the axis names and
    sizes, the rule's parameters (name, value pairs, ``axis_index_groups`` included) and the operands'
    shapes and dtypes."""

    op: str
    names: tuple
    sizes: tuple
    params: tuple
    avals: tuple  # ((shape, dtype), ...) per operand


def shown_avals(avals) -> str:
    """``float32[4], int32[]``: operand shapes and dtypes, as JAX prints avals."""
    return ", ".join(f"{dtype}{list(shape)}" for shape, dtype in avals)


def describe(signature: Signature, api: str | None = None) -> str:
    """``psum(float32[4], axis_name='i', axis_index_groups=((0, 1), (2, 3)))``; ``api`` names the public
    function the user called when it differs from the primitive (``pmean`` binds ``psum``)."""
    names = signature.names[0] if len(signature.names) == 1 else signature.names
    extra = "".join(f", {k}={v!r}" for k, v in signature.params if v is not None)
    return f"{api or signature.op}({shown_avals(signature.avals)}, axis_name={names!r}{extra})"


def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows of strings as an aligned text table; the first row is the header. Notebook cells' source lines are
    named as IPython names them (:func:`cell_names`)."""
    rows = [[cell_names(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def deadlock_text(call: str, reason: str, table: str) -> str:
    """The text of a CollectiveDeadlockError: ``call`` (the collective, described) can never complete."""
    return cell_names(
        f"{call} can never complete: {reason}. On real hardware this program hangs.\n\n{table}\n\nFix: make every "
        f"device of the group call the same collectives in the same order (no collective inside a branch or loop "
        f"that only some devices take).")


def mismatch_text(where: str, calls: Sequence[str], table: str) -> str:
    """The text of a CollectiveMismatchError: ``calls`` lists who called what, one line each."""
    return cell_names(
        f"devices called different collectives {where}:\n" + "\n".join(f"  {c}" for c in calls)
        + f"\nOn real hardware this hangs or exchanges garbage.\n\n{table}\n\nFix: every device of the group must "
        f"make the same collective call (op, axis names, parameters, shapes, dtypes) in the same order.")


def cell_number(filename: str) -> int | None:
    """The execution count of the notebook cell whose code IPython compiled to ``filename`` (a Jupyter kernel's
    ``/tmp/ipykernel_1234/1688.py``, or ``<ipython-input-3-…>``); None outside IPython or for another file."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    shell = ipython.get_ipython() if hasattr(ipython, "get_ipython") else None
    cells = getattr(getattr(shell, "compile", None), "_filename_map", None)
    number = cells.get(filename) if isinstance(cells, dict) else None
    return number if isinstance(number, int) else None


def cell_names(text: str) -> str:
    """``text`` with the source lines of notebook cells written as IPython writes them: ``In [3], line 2``
    for ``/tmp/ipykernel_1234/1688.py:2`` (a Jupyter kernel's file for cell 3) or ``<ipython-input-3-…>:2``;
    a JAX site's column is dropped (``:2:11 (f)`` becomes ``, line 2 (f)``). Unchanged outside IPython."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    cells = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if not cells or not isinstance(cells, dict):
        return text
    names = {}
    for filename, number in cells.items():
        names[filename] = number
        if not filename.startswith("<"):  # sites are relative to the working directory when under it
            names.setdefault(os.path.relpath(filename), number)
    pattern = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.sub(rf"({pattern}):(\d+)(?::\d+)?",
                  lambda m: f"In [{names[m.group(1)]}], line {m.group(2)}", text)


def who(labels: Sequence[str]) -> str:
    """``device 3 [i=3]``, or ``5 devices (device 1 [i=1] ... device 7 [i=7])``."""
    return labels[0] if len(labels) == 1 else f"{len(labels)} devices ({labels[0]} ... {labels[-1]})"
