"""Teaching pictures: which device holds which slice of an input, and every device's block before and after
a collective. As text (a rich table when rich is installed, plain text otherwise; the text is returned) and
as SVG images written without any plotting library.

    spmdsim.show.sharding(np.arange(12).reshape(4, 3), in_axes=0)
    spmdsim.show.collective("psum_scatter", np.arange(16.).reshape(4, 4))
    spmdsim.show.collective("ppermute", np.arange(4.), perm=[(0, 1), (1, 2), (2, 3), (3, 0)], svg="perm.svg")
"""
from __future__ import annotations

import html

import numpy as np

import spmdsim
from spmdsim import lax

__all__ = ["sharding", "collective"]

_PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
            "#bab0ac"]


def _fmt(a) -> str:
    a = np.asarray(a)
    return np.array2string(a, precision=3, separator=", ", threshold=12, edgeitems=2).replace("\n", "")


def _emit(title: str, header: list[str], rows: list[list[str]], echo: bool) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    text = title + "\n" + "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                                    for r in [header, *rows])
    if echo:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            print(text)
        else:
            table = Table(title=title)
            for h in header:
                table.add_column(h)
            for r in rows:
                table.add_row(*r)
            Console().print(table)
    return text


def sharding(x, in_axes: int = 0, *, svg: str | None = None, echo: bool = True) -> str:
    """Which device holds which slice of ``x`` when it is passed to pmap with ``in_axes`` (an int).

    Returns the text table (device, slice, block shape, values); with ``svg=PATH`` also draws ``x`` (as 2-D:
    the mapped axis and everything else flattened) with every element coloured by its device.
    """
    x = np.asarray(x)
    ax = in_axes % x.ndim
    rows = []
    for d in range(x.shape[ax]):
        index = ", ".join("d" if k == ax else ":" for k in range(x.ndim)).replace("d", str(d))
        block = np.take(x, d, axis=ax)
        rows.append([f"device {d}", f"x[{index}]", str(block.shape), _fmt(block)])
    text = _emit(f"pmap(..., in_axes={in_axes}) on x of shape {x.shape}: one block per device", 
                 ["device", "slice", "block shape", "values"], rows, echo)
    if svg:  # x drawn as 2-D (its first axis down, the rest flattened across), coloured by owning device
        grid = x.reshape(x.shape[0], -1) if x.ndim > 1 else x[None]
        owner = np.broadcast_to(np.arange(x.shape[ax]).reshape([-1 if k == ax else 1 for k in range(x.ndim)]),
                                x.shape).reshape(grid.shape)
        _write_svg(svg, [("x", grid, owner)], title=f"in_axes={in_axes}: colour = device")
    return text


def collective(op: str, blocks, *, svg: str | None = None, echo: bool = True, **params) -> str:
    """Every device's block before and after ``spmdsim.lax.<op>(block, 'i', **params)``.

    ``blocks`` is the stacked input (device axis first). Runs the real collective on virtual devices, so the
    picture shows exactly what spmdsim (and JAX) compute. Returns the text table; ``svg=PATH`` draws the
    blocks before and after, each device in its colour.
    """
    blocks = np.asarray(blocks)
    n = blocks.shape[0]
    with spmdsim.set_device_count(max(n, spmdsim.device_count())):
        after = spmdsim.pmap(lambda b: getattr(lax, op)(b, "i", **params), axis_name="i")(blocks)
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
    rows = [[f"device {d}", _fmt(blocks[d]), _fmt(after[d])] for d in range(n)]
    text = _emit(f"lax.{op}(x, 'i'{', ' + shown if shown else ''}) on {n} devices", ["device", "before", "after"],
                 rows, echo)
    if svg:
        origin = _origins(op, blocks, params)
        panels = []
        for d in range(n):
            panels.append((f"device {d} before", _as_grid(blocks[d]), np.full(_as_grid(blocks[d]).shape, d)))
            panels.append((f"device {d} after", _as_grid(after[d]), _as_grid(origin[d]) if origin is not None
                           else np.full(_as_grid(after[d]).shape, -1)))
        legend = "colour = the device an element came from" if origin is not None else \
            "grey = combined from every device of the group"
        _write_svg(svg, panels, title=f"lax.{op}(x, 'i'{', ' + shown if shown else ''}): {legend}", columns=2)
    return text


_MOVES = {"all_gather", "all_to_all", "pswapaxes", "ppermute", "pshuffle", "pbroadcast"}


def _origins(op: str, blocks: np.ndarray, params: dict) -> np.ndarray | None:
    """For collectives that move data, the same collective applied to device ids: where each result element
    came from (-1 where a device received zeros). None for reductions, whose results mix every device."""
    if op not in _MOVES:
        return None
    n = blocks.shape[0]
    ids = np.broadcast_to(np.arange(1, n + 1, dtype=np.int32).reshape((n,) + (1,) * (blocks.ndim - 1)), blocks.shape)
    with spmdsim.set_device_count(max(n, spmdsim.device_count())):
        moved = spmdsim.pmap(lambda b: getattr(lax, op)(b, "i", **params), axis_name="i")(np.ascontiguousarray(ids))
    return np.asarray(moved) - 1


def _as_grid(block) -> np.ndarray:
    """A block as rows x columns: a scalar is 1 x 1, a vector one row, higher ranks their first axis down."""
    block = np.asarray(block)
    if block.ndim <= 1:
        return block.reshape(1, -1)
    return block.reshape(block.shape[0], -1)


def _write_svg(path: str, panels, *, title: str, columns: int = 1) -> None:
    cell, gap, top = 44, 24, 40
    sizes = [(g.shape[0], g.shape[1]) for _, g, _ in panels]
    col_w = max(max(c for _, c in sizes) * cell, 8 * max(len(name) for name, _, _ in panels)) + gap
    rows_per_col = -(-len(panels) // columns)
    heights = []
    for r in range(rows_per_col):
        heights.append(max(sizes[r * columns + c][0] for c in range(columns) if r * columns + c < len(panels)))
    width = max(columns * col_w + gap, 9 * len(title) + 2 * gap)
    height = top + sum(h * cell + 30 for h in heights) + gap
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{gap}" y="24" font-size="15">{html.escape(title)}</text>']
    y = top
    for r in range(rows_per_col):
        for c in range(columns):
            k = r * columns + c
            if k >= len(panels):
                continue
            name, grid, owner = panels[k]
            x0 = gap + c * col_w
            out.append(f'<text x="{x0}" y="{y + 14}">{html.escape(name)}</text>')
            for i in range(grid.shape[0]):
                for j in range(grid.shape[1]):
                    colour = "#bbbbbb" if owner[i, j] < 0 else _PALETTE[int(owner[i, j]) % len(_PALETTE)]
                    cx, cy = x0 + j * cell, y + 20 + i * cell
                    value = np.asarray(grid[i, j]).item()
                    label = f"{value:.3g}" if isinstance(value, float) else str(value)
                    out.append(f'<rect x="{cx}" y="{cy}" width="{cell - 2}" height="{cell - 2}" fill="{colour}" '
                               f'fill-opacity="0.75"/><text x="{cx + cell / 2 - 1}" y="{cy + cell / 2 + 4}" '
                               f'text-anchor="middle">{html.escape(label)}</text>')
        y += heights[r] * cell + 30
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))
