"""Teaching pictures: which device holds which slice of an input, and every device's block before and after
a collective.

Each function prints a table (with rich when it is installed) and returns a :class:`Picture`: ``print`` it
for the table, ``picture.svg`` or ``picture.save(path)`` for the drawing, which Jupyter shows inline. In
the drawing every element is coloured by the device that holds it (or, after a collective that moves data,
the device it came from); a legend names the colours, and large blocks are elided in the middle.

Example:
    >>> import numpy as np, spmdsim
    >>> print(spmdsim.show.sharding(np.arange(6).reshape(2, 3), in_axes=1, echo=False))
    pmap(..., in_axes=1) on x of shape (2, 3): one block per device
    device    slice    block shape  values
    device 0  x[:, 0]  (2,)         [0, 3]
    device 1  x[:, 1]  (2,)         [1, 4]
    device 2  x[:, 2]  (2,)         [2, 5]
"""
from __future__ import annotations

import math

import numpy as np

import spmdsim
from spmdsim import _svg, lax
from spmdsim._svg import Picture
from spmdsim._tables import print_table, text_table

__all__ = ["sharding", "collective", "Picture"]

# Drawing: cells at least MIN_CELL px wide, a block shown whole up to MAX_CELLS cells along each of its two
# axes and elided in the middle beyond (EDGE cells kept at each end), panels GAP px apart.
MIN_CELL, CELL_H, PAD, MAX_CELLS, EDGE, GAP = 30, 30, 4, 10, 4, 24
LEGEND_MAX = 16  # devices named in the legend, the rest elided

_MOVES = {"all_gather", "all_to_all", "pswapaxes", "ppermute", "pshuffle", "pbroadcast"}


def _fmt(a) -> str:
    return np.array2string(np.asarray(a), precision=3, separator=", ", threshold=12, edgeitems=2).replace("\n", "")


def sharding(x, in_axes: int | None = 0, *, axis_size: int | None = None, svg: str | None = None,
             echo: bool = True) -> Picture:
    """Which device holds which slice of ``x`` when it is passed to pmap with ``in_axes``.

    Args:
        x: an array (anything ``np.asarray`` takes).
        in_axes: the mapped axis (negative counts from the end), or None: every device holds all of ``x``.
        axis_size: with ``in_axes=None``, the number of devices (default: spmdsim's device count).
        svg: also write the drawing to this path.
        echo: print the table.

    Returns:
        A :class:`Picture`: one row per device (its slice, block shape and values); the drawing shows ``x`` as
        2-D (its first axis down, the others flattened across), each element in its device's colour.

    Raises:
        TypeError: ``in_axes`` is not an int or None.
        ValueError: ``in_axes`` is out of range for ``x``.
    """
    x = np.asarray(x)
    if in_axes is not None and (not isinstance(in_axes, (int, np.integer)) or isinstance(in_axes, bool)):
        raise TypeError(f"show.sharding: in_axes must be an int or None, got {in_axes!r}")
    if in_axes is None:
        n = spmdsim.device_count() if axis_size is None else int(axis_size)
        rows = [[f"device {d}", "x (all of it)", str(x.shape), _fmt(x)] for d in range(n)]
        title = f"pmap(..., in_axes=None) on x of shape {x.shape}: every one of the {n} devices holds all of x"
        owner = np.full(x.shape, -1)
        caption = f"in_axes=None: replicated, each of the {n} devices holds a copy of all of x"
    else:
        if not -x.ndim <= in_axes < x.ndim:
            raise ValueError(f"show.sharding: in_axes={in_axes} is out of range for x of shape {x.shape} (valid: "
                             f"{-x.ndim}..{x.ndim - 1}, or None)")
        ax = in_axes % x.ndim
        n = x.shape[ax]
        rows = []
        for d in range(n):
            index = ", ".join(str(d) if k == ax else ":" for k in range(x.ndim))
            block = np.take(x, d, axis=ax)
            rows.append([f"device {d}", f"x[{index}]", str(block.shape), _fmt(block)])
        title = f"pmap(..., in_axes={in_axes}) on x of shape {x.shape}: one block per device"
        owner = np.broadcast_to(np.arange(n).reshape([-1 if k == ax else 1 for k in range(x.ndim)]), x.shape)
        caption = f"in_axes={in_axes}: colour = the device holding the element"
    text = print_table(title, ["device", "slice", "block shape", "values"], rows) if echo else \
        text_table(title, ["device", "slice", "block shape", "values"], rows)
    drawing = _draw([("", [(_as_grid(x), _as_grid(owner))])], headers=[f"x {x.shape}, drawn as 2-D"], title=caption,
                    n_devices=n, grey="every device holds it (replicated)")
    return _finish(Picture(text, drawing), svg)


def collective(op: str, blocks, *, svg: str | None = None, echo: bool = True, **params) -> Picture:
    """Every device's block before and after ``spmdsim.lax.<op>(block, 'i', **params)``.

    Runs the real collective on virtual devices, so the picture shows exactly what spmdsim (and JAX) compute.

    Args:
        op: a collective of :mod:`spmdsim.lax` (``"psum"``, ``"all_gather"``, ``"ppermute"``, ...).
        blocks: the stacked input, device axis first (device d holds ``blocks[d]``).
        svg: also write the drawing to this path.
        echo: print the table.
        **params: the collective's other arguments (``perm=``, ``tiled=``, ``split_axis=``, ...).

    Returns:
        A :class:`Picture`: one row per device with its block before and after; in the drawing, data that
        moved keeps the colour of the device it came from, and combined values (reductions) are grey.

    Raises:
        ValueError: ``op`` is not a collective of spmdsim.lax; otherwise whatever the collective raises.
    """
    if op not in _MOVES | {"psum", "pmean", "pmax", "pmin", "psum_scatter"}:
        raise ValueError(f"show.collective: {op!r} is not a collective of spmdsim.lax; one of "
                         f"{', '.join(sorted(_MOVES | {'psum', 'pmean', 'pmax', 'pmin', 'psum_scatter'}))}")
    blocks = np.asarray(blocks)
    n = blocks.shape[0]
    after = _run(op, blocks, params)
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
    call = f"lax.{op}(x, 'i'{', ' + shown if shown else ''})"
    rows = [[f"device {d}", _fmt(blocks[d]), _fmt(after[d])] for d in range(n)]
    title = f"{call} on {n} devices"
    text = print_table(title, ["device", "before", "after"], rows) if echo else \
        text_table(title, ["device", "before", "after"], rows)
    origin = _origins(op, blocks, params)
    drawn = [(f"device {d}", [(_as_grid(blocks[d]), np.full(_as_grid(blocks[d]).shape, d)),
                             (_as_grid(after[d]), _as_grid(origin[d]) if origin is not None
                              else np.full(_as_grid(after[d]).shape, -1))]) for d in range(n)]
    caption = "after: colour = the device an element came from" if origin is not None else \
        "after: grey = combined from every device of the group"
    drawing = _draw(drawn, headers=[f"before {blocks.shape[1:]}", f"after {after.shape[1:]}"],
                    title=f"{_shorten(call, 72)}\n{caption}", n_devices=n,
                    grey="zeros (received nothing)" if origin is not None else "combined from every device")
    return _finish(Picture(text, drawing), svg)


def _finish(picture: Picture, path: str | None) -> Picture:
    if path:
        picture.save(path)
    return picture


def _run(op: str, blocks: np.ndarray, params: dict) -> np.ndarray:
    with spmdsim.set_device_count(max(blocks.shape[0], spmdsim.device_count())):
        return spmdsim.pmap(lambda b: getattr(lax, op)(b, "i", **params), axis_name="i")(np.ascontiguousarray(blocks))


def _origins(op: str, blocks: np.ndarray, params: dict) -> np.ndarray | None:
    """For collectives that move data, the same collective applied to device ids: where each result element
    came from (-1 where a device received zeros). None for reductions, whose results mix every device."""
    if op not in _MOVES:
        return None
    n = blocks.shape[0]
    ids = np.broadcast_to(np.arange(1, n + 1, dtype=np.int32).reshape((n,) + (1,) * (blocks.ndim - 1)), blocks.shape)
    return np.asarray(_run(op, ids, params)) - 1


def _as_grid(block) -> np.ndarray:
    """A block as rows x columns: a scalar is 1 x 1, a vector one row, higher ranks their first axis down."""
    block = np.asarray(block)
    if block.ndim <= 1:
        return block.reshape(1, -1)
    return block.reshape(block.shape[0], -1)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _kept(n: int) -> list[int | None]:
    """Indices shown along an axis of ``n`` cells: all, or the first and last EDGE with None (…) between."""
    return list(range(n)) if n <= MAX_CELLS else [*range(EDGE), None, *range(n - EDGE, n)]


def _label(value) -> str:
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, complex):
        return f"{value:.2g}"
    text = str(value)
    return text if len(text) <= 7 else f"{float(value):.2e}"


def _draw(rows, *, headers: list[str], title: str, n_devices: int, grey: str) -> str:
    """A table of blocks: ``rows`` of (label, [(2-D values, 2-D owning device or -1), ...]) under the column
    ``headers``, the ``title`` lines above and a legend below (``grey`` says what an owner of -1 means)."""
    grids = [grid for _, row in rows for grid, _ in row]
    labels = {id(grid): [[_label(grid[i, j]) if i is not None and j is not None else "…"
                          for j in _kept(grid.shape[1])] for i in _kept(grid.shape[0])] for grid in grids}
    longest = max(len(s) for cells in labels.values() for row in cells for s in row)
    cell_w = max(MIN_CELL, math.ceil(_svg.text_width("x" * longest)) + 2 * PAD)
    col_w = [max(_svg.text_width(h), *(len(_kept(row[c][0].shape[1])) * cell_w for _, row in rows))
             for c, h in enumerate(headers)]
    left = GAP + max((_svg.text_width(label) + GAP for label, _ in rows if label), default=0)
    titles = title.split("\n")
    y = 30 + 20 * len(titles)
    body, x0 = [], left
    for c, h in enumerate(headers):
        body.append(_svg.text(x0, y, h))
        x0 += col_w[c] + GAP
    y += 8
    for label, row in rows:
        if label:
            body.append(_svg.text(GAP, y + CELL_H / 2 + 3, label))
        x0, row_h = left, 0
        for c, (grid, owner) in enumerate(row):
            rows_kept, cols_kept = _kept(grid.shape[0]), _kept(grid.shape[1])
            for a, i in enumerate(rows_kept):
                for b, j in enumerate(cols_kept):
                    cx, cy = x0 + b * cell_w, y + a * CELL_H
                    colour = "white" if i is None or j is None else _svg.device_colour(int(owner[i, j]), n_devices)
                    body.append(f'<g class="cell"><rect x="{cx:.1f}" y="{cy}" width="{cell_w - 2}" '
                                f'height="{CELL_H - 2}" fill="{colour}" fill-opacity="0.75"/>'
                                + _svg.text(cx + (cell_w - 2) / 2, cy + CELL_H / 2 + 3, labels[id(grid)][a][b],
                                            anchor="middle") + "</g>")
            row_h = max(row_h, len(rows_kept) * CELL_H)
            x0 += col_w[c] + GAP
        y += row_h + 10
    width = max(left + sum(col_w) + len(col_w) * GAP, *(_svg.text_width(t, 14) + 2 * GAP for t in titles), 480)
    owners = [owner for _, row in rows for _, owner in row]
    legend, height = _legend(owners, n_devices, y + 6, width, grey)
    heads = [_svg.text(GAP, 28 + 20 * k, t, size=14) for k, t in enumerate(titles)]
    return _svg.document(width, height, [*heads, *body, *legend])


def _legend(owners, n_devices: int, y: float, width: float, grey: str) -> tuple[list[str], float]:
    """Swatches naming the colours used (devices, grey), wrapped to ``width``; returns them and the height."""
    used = sorted({int(d) for owner in owners for d in np.unique(owner)})
    devices = [d for d in used if d >= 0]
    items = [(_svg.device_colour(d, n_devices), f"device {d}") for d in devices[:LEGEND_MAX]]
    if len(devices) > LEGEND_MAX:
        items.append(("white", f"… device {devices[-1]}"))
    if -1 in used:
        items.append((_svg.GREY, grey))
    out, x, y = [_svg.text(GAP, y + 12, "colours:")], GAP + _svg.text_width("colours: "), y
    for colour, name in items:
        item_w = 16 + _svg.text_width(name) + 14
        if x + item_w > width - GAP:
            x, y = GAP + _svg.text_width("colours: "), y + 20
        out.append(f'<g class="legend"><rect x="{x:.1f}" y="{y + 2}" width="12" height="12" fill="{colour}" '
                   f'fill-opacity="0.75" stroke="#888888" stroke-width="0.5"/>' + _svg.text(x + 16, y + 12, name)
                   + "</g>")
        x += item_w
    return out, y + 20 + GAP
