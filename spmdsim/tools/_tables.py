"""Printing a table for people: with rich when it is installed, as aligned plain text otherwise.

rich cuts a table to the console's width, and a console that is not a terminal (a pipe, a file, a CI log)
is 80 columns wide; such output gets the table's natural width instead, so that nothing is cut.
"""
from __future__ import annotations

import sys
from typing import Sequence

__all__ = ["text_table", "print_table"]


def text_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The title, then the header and rows as left-aligned columns two spaces apart."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join([title, *lines] if title else lines)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, file=None,
                right: Sequence[str] = (), bold_last: bool = False) -> str:
    """Print a table (rich if installed) to ``file`` (default ``sys.stdout``) and return its plain text.

    Args:
        title: a line above the table.
        header: the column names.
        rows: the cells, as strings.
        file: where to print.
        right: the names of the columns to right-align (rich only).
        bold_last: show the last row in bold (a total; rich only).

    Returns:
        The table as plain text (see :func:`text_table`).
    """
    text = text_table(title, header, rows)
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        print(text, file=file)
        return text
    stream = file if file is not None else sys.stdout
    table = Table(title=Text(title) if title else None)
    for h in header:
        table.add_column(Text(h), justify="right" if h in right else "left")
    for k, r in enumerate(rows):  # Text: a device label's "[i=3]" is not rich markup
        table.add_row(*map(Text, r), style="bold" if bold_last and k == len(rows) - 1 else None)
    is_terminal = getattr(stream, "isatty", lambda: False)()
    Console(file=stream, width=None if is_terminal else 10_000).print(table)
    return text
