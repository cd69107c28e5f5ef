"""Teaching pictures: which device holds which slice of an array (pmap's ``in_axes``, or a ``PartitionSpec``
over a mesh), every device's block from inside the mapped function, and every device's block before and after
a collective.

Each function prints a table (with rich when it is installed) and returns a :class:`Picture`: ``print`` it
for the table, ``picture.svg`` or ``picture.save(path)`` for the drawing, which Jupyter shows inline. In
the drawing every element is coloured by the device that holds it (or, after a collective that moves data,
the device it came from); a legend names the colours, and large blocks are elided in the middle. Devices of
a mesh are labelled by their coordinates, as in spmdsim's reports: ``device 5 [x=2, y=1]``.

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

import dataclasses
import itertools
import math
import textwrap

import numpy as np

import spmdsim
from spmdsim.runtime import _runtime
from spmdsim.tools import _svg
from spmdsim import lax
from spmdsim.runtime._axes import Frame, Unnamed, frames_label, resolve_axes
from spmdsim.tools._svg import Picture
from spmdsim.tools._tables import print_table, text_table
from spmdsim.errors import UnboundAxisError

__all__ = ["sharding", "blocks", "collective", "Picture"]

# Drawing: cells at least MIN_CELL px wide, a block shown whole up to MAX_CELLS cells along each of its two
# axes and elided in the middle beyond (EDGE cells kept at each end), panels GAP px apart.
MIN_CELL, CELL_H, PAD, MAX_CELLS, EDGE, GAP = 30, 30, 4, 10, 4, 24
MAX_PANELS, EDGE_PANELS = 8, 3  # blocks(): devices' panels shown along each mesh direction, kept at each end
LEGEND_MAX = 16  # devices (or blocks) named in the legend, the rest elided
TITLE_MAX = 100  # characters of a title line in a drawing

_MOVES = {"all_gather", "all_to_all", "pswapaxes", "ppermute", "pshuffle", "pbroadcast"}
_REDUCTIONS = {"psum", "pmean", "pmax", "pmin", "psum_scatter"}
_MESH_ORDER = {"ppermute", "pshuffle"}  # rank a tuple of axes in mesh order (as XLA); the others in the order given


def _fmt(a) -> str:
    return np.array2string(np.asarray(a), precision=3, separator=", ", threshold=12, edgeitems=2).replace("\n", "")


def _show(echo: bool, title: str, header: list[str], rows: list[list[str]]) -> str:
    """The table's text, printed when ``echo``, its title as lines above the table (rich would wrap a title to
    the table's width)."""
    if not echo:
        return text_table(title, header, rows)
    if title:
        print(title)
    table = print_table("", header, rows)
    return f"{title}\n{table}" if title else table


def sharding(x, in_axes: int | None = 0, *, axis_size: int | None = None, mesh=None, spec=None,
             svg: str | None = None, echo: bool = True) -> Picture:
    """Which device holds which slice of ``x``: passed to pmap with ``in_axes``, or laid over ``mesh`` by ``spec``.

    The mesh form is ``jax.debug.visualize_array_sharding`` for the input of ``shard_map(..., mesh=mesh,
    in_specs=spec)``; :func:`blocks` shows the blocks from inside the mapped function, which JAX cannot.

    Args:
        x: an array (anything ``np.asarray`` takes).
        in_axes: pmap form: the mapped axis (negative counts from the end), or None: every device holds all of
            ``x``.
        axis_size: pmap form, with ``in_axes=None``: the number of devices (default: spmdsim's device count).
        mesh: mesh form: a :class:`spmdsim.Mesh` (``spmdsim.make_mesh(...)``); give ``spec`` with it.
        spec: mesh form: the PartitionSpec ``x`` has as an argument of ``spmdsim.shard_map``.
        svg: also write the drawing to this path.
        echo: print the table.

    Returns:
        A :class:`Picture`. pmap form: one row per device (its slice, block shape and values); the drawing
        shows ``x`` as 2-D (its first axis down, the others flattened across), each element in its device's
        colour. Mesh form: the mesh (device numbers by coordinate: the first axis down, the others across),
        then one row per device labelled by its coordinates, with its slice, block shape and values, and,
        where the spec replicates ``x`` along some mesh axes, which devices hold copies of the same block;
        the drawing shows ``x`` as 2-D coloured by block and, beside it, the mesh with each device in the
        colour of the block it holds; the legend names each block's slice and devices.

    Raises:
        TypeError: ``in_axes`` is not an int or None; ``mesh`` without ``spec`` (or the reverse), or with
            ``in_axes``/``axis_size``; a spec that is not a PartitionSpec, as ``spmdsim.shard_map`` raises it.
        ValueError: ``in_axes`` is out of range for ``x``; the mapped axis is longer than the number of virtual
            devices (the MappedSizeError ``spmdsim.pmap`` raises for ``x``); a spec that ``spmdsim.shard_map`` rejects for ``x``
            (a mesh axis unknown or named twice, more entries than ``x`` has dimensions, a dimension not
            divisible by its axes' sizes), with shard_map's message; the mesh form called inside a mapped
            function (use :func:`blocks` there).

    Example:
        >>> import numpy as np, spmdsim
        >>> mesh = spmdsim.make_mesh((2, 2), ('x', 'y'))
        >>> print(spmdsim.show.sharding(np.arange(8).reshape(4, 2), mesh=mesh, spec=spmdsim.P('x'), echo=False))
        x of shape (4, 2) laid out by P('x') over Mesh('x': 2, 'y': 2): 2 blocks of shape (2, 2)
        dimension 0 split over 'x'; replicated along 'y': each block is held by 2 devices
        mesh  y=0  y=1
        x=0   0    1
        x=1   2    3
        device               slice      block shape  values            copies held by
        device 0 [x=0, y=0]  x[0:2, :]  (2, 2)       [[0, 1], [2, 3]]  devices 0, 1
        device 1 [x=0, y=1]  x[0:2, :]  (2, 2)       [[0, 1], [2, 3]]  devices 0, 1
        device 2 [x=1, y=0]  x[2:4, :]  (2, 2)       [[4, 5], [6, 7]]  devices 2, 3
        device 3 [x=1, y=1]  x[2:4, :]  (2, 2)       [[4, 5], [6, 7]]  devices 2, 3
    """
    x = np.asarray(x)
    if mesh is not None or spec is not None:
        if mesh is None or spec is None:
            raise TypeError("show.sharding: the mesh form takes mesh= and spec= together, e.g. "
                            "show.sharding(x, mesh=spmdsim.make_mesh((4, 2), ('x', 'y')), spec=spmdsim.P('x', 'y')).")
        if in_axes != 0 or axis_size is not None:
            raise TypeError("show.sharding: in_axes/axis_size are pmap's; with mesh= and spec= leave them out.")
        return _finish(_mesh_sharding(x, mesh, spec, echo), svg)
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
        from spmdsim.frontend._pmap import check_device_count
        check_device_count(n, None)  # more blocks than devices: the error spmdsim.pmap raises for x
        rows = []
        for d in range(n):
            index = ", ".join(str(d) if k == ax else ":" for k in range(x.ndim))
            block = np.take(x, d, axis=ax)
            rows.append([f"device {d}", f"x[{index}]", str(block.shape), _fmt(block)])
        title = f"pmap(..., in_axes={in_axes}) on x of shape {x.shape}: one block per device"
        owner = np.broadcast_to(np.arange(n).reshape([-1 if k == ax else 1 for k in range(x.ndim)]), x.shape)
        caption = f"in_axes={in_axes}: colour = the device holding the element"
    text = _show(echo, title, ["device", "slice", "block shape", "values"], rows)
    drawing = _draw([("", [(_as_grid(x), _as_grid(owner))])], headers=[f"x {x.shape}, drawn as 2-D"], title=caption,
                    n_devices=n, grey="every device holds it (replicated)")
    return _finish(Picture(text, drawing), svg)


def blocks(x, axis_name=None, *, name: str = "x", echo: bool = True) -> Picture:
    """Inside a mapped function: every device's current block of ``x``, side by side, labelled by coordinates.

    A collective: every device of the named axes must call it (it gathers the blocks with
    ``spmdsim.lax.all_gather``, so a device that does not, or calls it with a block of another shape, is
    reported as for any collective, at the line that called ``blocks``; traces and the debugger show it as
    that all_gather). The device at coordinate 0 along the named axes prints the table; every device gets
    the picture. With some of the mesh axes named, each group of devices that differ only along them gets
    its own picture, printed by its own coordinate-0 device.

    JAX cannot draw this: ``jax.debug.visualize_array_sharding`` takes a global array, and inside
    ``jax.shard_map`` (or ``jax.pmap``) a value is one device's block, with no sharding to show.

    Args:
        x: this device's block (anything ``np.asarray`` takes; the same shape and dtype on every device).
        axis_name: a mesh axis name or a tuple of names (default: every axis the enclosing maps bind).
        name: what to call the value in the table.
        echo: print the table (on the device at coordinate 0 along the named axes).

    Returns:
        A :class:`Picture`: one row per device of the group (its coordinates, block shape and values); the
        drawing lays the blocks out as the devices lie in the mesh (its first axis down, the others across),
        each in its device's colour.

    Raises:
        NameError: an axis name that no enclosing map binds, or a call outside any mapped function
            (``spmdsim.errors.UnboundAxisError``).
        CollectiveMismatchError: devices of a group passed blocks of different shapes or dtypes.
        CollectiveDeadlockError: some device of a group never calls it.

    Example:
        >>> import numpy as np, spmdsim
        >>> pictures = []
        >>> def f(b):
        ...     pictures.append(spmdsim.show.blocks(b, ('x', 'y'), echo=False))
        ...     return b
        >>> mesh = spmdsim.make_mesh((2, 2), ('x', 'y'))
        >>> _ = spmdsim.shard_map(f, mesh=mesh, in_specs=spmdsim.P('x', 'y'),
        ...                       out_specs=spmdsim.P('x', 'y'))(np.arange(16).reshape(4, 4))
        >>> print(pictures[0])
        x: the blocks of the 4 devices along 'x', 'y'
        device               block shape  values
        device 0 [x=0, y=0]  (2, 2)       [[0, 1], [4, 5]]
        device 1 [x=0, y=1]  (2, 2)       [[2, 3], [6, 7]]
        device 2 [x=1, y=0]  (2, 2)       [[ 8,  9], [12, 13]]
        device 3 [x=1, y=1]  (2, 2)       [[10, 11], [14, 15]]
    """
    lane = _runtime.current_lane()
    if lane is None:
        raise UnboundAxisError("show.blocks is a collective: call it inside a function mapped by spmdsim.shard_map "
                               "or spmdsim.pmap, on every device of the axes it names; here no map encloses it.")
    frames = lane.frames
    names = (tuple(dict.fromkeys(f.name for f in frames)) if axis_name is None
             else axis_name if isinstance(axis_name, tuple) else (axis_name,))
    resolved = resolve_axes(frames, names, "show.blocks")  # NameError for an unbound name
    values = lax.all_gather(np.asarray(x), names)  # rank r: row-major over the named axes, in the order given
    members = [_member(frames, resolved, r) for r in range(len(values))]
    devices = [_number(m) for m in members]
    order = sorted(range(len(members)), key=devices.__getitem__)
    fixed = ", ".join(f"{f.name}={f.index}" for f in frames if f not in resolved and not isinstance(f.name, Unnamed))
    along = ", ".join(repr(m) for m in names if not isinstance(m, Unnamed))
    title = (f"{name}: the blocks of the {len(members)} devices" + (f" along {along}" if along else "")
             + (f", in the group {fixed}" if fixed else ""))
    rows = [[frames_label(members[r]), str(values[r].shape), _fmt(values[r])] for r in order]
    first = all(f.index == 0 for f in resolved)
    text = _show(echo and first, title, ["device", "block shape", "values"], rows)
    # The mesh's geometry: rows along the first axis, columns along the others (row-major).
    place = {(m[0].index, int(np.ravel_multi_index([f.index for f in m[1:]], [f.size for f in m[1:]]))
              if len(m) > 1 else 0): r for r, m in enumerate(members)}
    kept = [[None if i is None or j is None else place[i, j] for j in _kept_panels(sorted({j for _, j in place}))]
            for i in _kept_panels(sorted({i for i, _ in place}))]
    panels = [[None if r is None else _panel(frames_label(members[r]), values[r], devices[r]) for r in row]
              for row in kept]
    n_devices = math.prod(f.size for f in [f for f in frames if f.is_device] or frames)
    label = {devices[r]: frames_label(members[r]) for row in kept for r in row if r is not None}
    drawing = _draw_panels(panels, title=f"{title}\ncolour = the device holding the block", n_devices=n_devices,
                           items=_legend_items(list(label), n_devices, "", label.__getitem__))
    return Picture(text, drawing)


def collective(op: str, blocks, *, mesh=None, spec=None, axis_name=None, svg: str | None = None,
               echo: bool = True, **params) -> Picture:
    """Every device's block before and after a collective: ``spmdsim.lax.<op>(block, 'i', **params)`` under
    pmap, or, with ``mesh``, ``spmdsim.lax.<op>(block, axis_name, **params)`` under ``spmdsim.shard_map``.

    Runs the real collective on virtual devices, so the picture shows exactly what spmdsim (and JAX) compute.
    The mesh form shows a collective over one mesh axis (or a tuple) of a multi-axis mesh: its rows are
    grouped by communicator (the devices that differ only along ``axis_name``, which exchange data with each
    other), a bracket and the ``group`` column naming each group by its coordinates along the other axes,
    and ``rank`` giving each device's position in its group (what ``perm=`` and ``source=`` refer to; over a
    tuple of axes row-major in the order named, but in mesh order for ppermute and pshuffle, as XLA ranks them).

    Args:
        op: a collective of :mod:`spmdsim.lax` (``"psum"``, ``"all_gather"``, ``"ppermute"``, ...).
        blocks: pmap form: the stacked input, device axis first (device d holds ``blocks[d]``); mesh form: the
            global array, laid over the mesh by ``spec``.
        mesh: mesh form: a :class:`spmdsim.Mesh`; give ``spec`` and ``axis_name`` with it.
        spec: mesh form: the PartitionSpec of ``blocks`` (shard_map's ``in_specs``).
        axis_name: mesh form: the mesh axis (or tuple of axes) the collective runs over.
        svg: also write the drawing to this path.
        echo: print the table.
        **params: the collective's other arguments (``perm=``, ``tiled=``, ``split_axis=``, ...).

    Returns:
        A :class:`Picture`: one row per device, labelled by its coordinates in the mesh form, with its block
        before and after; in the drawing, data that moved keeps the colour of the device it came from, and
        combined values (reductions) are grey.

    Raises:
        ValueError: ``op`` is not a collective of spmdsim.lax; a spec ``spmdsim.shard_map`` rejects;
            otherwise whatever the collective raises.
        TypeError: ``mesh``, ``spec`` and ``axis_name`` not given together.
        NameError: ``axis_name`` is not a mesh axis (``spmdsim.errors.UnboundAxisError``, as the collective).

    Example:
        >>> import numpy as np, spmdsim
        >>> mesh = spmdsim.make_mesh((2, 2), ('x', 'y'))
        >>> print(spmdsim.show.collective("psum", np.arange(4.0).reshape(2, 2), mesh=mesh,
        ...                               spec=spmdsim.P('x', 'y'), axis_name='x', echo=False))
        lax.psum(x, 'x') on x of shape (2, 2) laid out by P('x', 'y') over Mesh('x': 2, 'y': 2)
        2 communicator groups of 2 devices, the devices that differ only along 'x'; rank: the position in the group
        device               group  rank  before  after
        device 0 [x=0, y=0]  y=0    0     [[0.]]  [[2.]]
        device 2 [x=1, y=0]  y=0    1     [[2.]]  [[2.]]
        device 1 [x=0, y=1]  y=1    0     [[1.]]  [[4.]]
        device 3 [x=1, y=1]  y=1    1     [[3.]]  [[4.]]
    """
    ops = _MOVES | _REDUCTIONS
    if op not in ops:
        raise ValueError(f"show.collective: {op!r} is not a collective of spmdsim.lax; one of "
                         f"{', '.join(sorted(ops))}")
    if mesh is not None or spec is not None or axis_name is not None:
        if mesh is None or spec is None or axis_name is None:
            raise TypeError("show.collective: the mesh form takes mesh=, spec= and axis_name= together, e.g. "
                            "show.collective('psum', x, mesh=mesh, spec=spmdsim.P('x', 'y'), axis_name='x').")
        return _finish(_mesh_collective(op, np.asarray(blocks), mesh, spec, axis_name, params, echo), svg)
    blocks = np.asarray(blocks)
    n = blocks.shape[0]
    after = _run(op, blocks, params)
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
    call = f"lax.{op}(x, 'i'{', ' + shown if shown else ''})"
    rows = [[f"device {d}", _fmt(blocks[d]), _fmt(after[d])] for d in range(n)]
    text = _show(echo, f"{call} on {n} devices", ["device", "before", "after"], rows)
    origin = _origins(op, blocks, params)
    drawn = [_before_after(f"device {d}", d, blocks[d], after[d], None if origin is None else origin[d])
             for d in range(n)]
    caption = "after: colour = the device an element came from" if origin is not None else \
        "after: grey = combined from every device of the group"
    drawing = _draw(drawn, headers=[f"before {blocks.shape[1:]}", f"after {after.shape[1:]}"],
                    title=f"{_shorten(call, 72)}\n{caption}", n_devices=n,
                    grey="zeros (received nothing)" if origin is not None else "combined from every device")
    return _finish(Picture(text, drawing), svg)


# -- the mesh forms ------------------------------------------------------------------------------------------

def _mesh_sharding(x: np.ndarray, mesh, spec, echo: bool) -> Picture:
    """show.sharding's mesh form: the layout from spmdsim.shard_map (:func:`_layout`), each distinct block
    coloured as the lowest device holding it (grey when every device holds all of x)."""
    held = _layout(x.shape, mesh, spec)
    if x.size == 0:
        raise ValueError(f"show.sharding: x of shape {x.shape} has no elements, so no device holds any; give an "
                         f"array with elements to see how {spec} lays it over the mesh.")
    n = held.shape[0]
    slices = [_slice(held[d], x.shape) for d in range(n)]
    holders: dict[str, list[int]] = {}  # each distinct block (by its slice): the devices holding it
    for d, s in enumerate(slices):
        holders.setdefault(s, []).append(d)
    everywhere = len(holders) == 1 and n > 1
    colour = {s: -1 if everywhere else ds[0] for s, ds in holders.items()}  # the lowest holder's colour
    copies = n // len(holders)
    block = held.shape[1:]
    mentioned = {m for part in spec for m in (part if isinstance(part, tuple) else (part,)) if m is not None}
    split = ", ".join(f"dimension {k} split over {part!r}" for k, part in enumerate(spec) if part is not None)
    along = ", ".join(repr(m) for m in mesh.axis_names if m not in mentioned)
    shared = (f"replicated along {along}: every one of the {n} devices holds all of x" if everywhere else
              f"replicated along {along}: each block is held by {copies} devices" if copies > 1 else
              "every device holds a different block")
    blocks_of = f"{len(holders)} block{'s' if len(holders) > 1 else ''} of shape {block}"
    titles = [f"x of shape {x.shape} laid out by {spec} over {mesh!r}: {blocks_of}",
              f"{split or 'not split'}; {shared}"]
    mesh_header, mesh_rows = _mesh_table(mesh)
    header = ["device", "slice", "block shape", "values"] + (["copies held by"] if copies > 1 else [])
    flat = x.reshape(-1)
    rows = [[_mesh_label(d, mesh), slices[d], str(block), _fmt(flat[held[d]])]
            + ([_some(holders[slices[d]])] if copies > 1 else []) for d in range(n)]
    text = "\n".join([_show(echo, "\n".join(titles), mesh_header, mesh_rows), _show(echo, "", header, rows)])
    owner = np.empty(x.size, dtype=int)
    for s, ds in holders.items():
        owner[held[ds[0]].reshape(-1)] = colour[s]
    shown = list(holders.items())[:LEGEND_MAX]
    items = [(_svg.device_colour(colour[s], n), f"{s}: {'every device (replicated)' if everywhere else _some(ds)}")
             for s, ds in shown]
    if len(holders) > LEGEND_MAX:
        items.append(("white", f"… {len(holders)} blocks in all"))
    drawing = _draw_sharding(_as_grid(x), _as_grid(owner.reshape(x.shape)), mesh,
                             np.array([colour[s] for s in slices]),
                             header=f"x {x.shape}, drawn as 2-D", title="\n".join(
                                 [*titles, "colour = the block; left: x as 2-D, right: the mesh's devices"]),
                             items=items)
    return Picture(text, drawing)


def _mesh_collective(op: str, x: np.ndarray, mesh, spec, axis_name, params: dict, echo: bool) -> Picture:
    """show.collective's mesh form: one spmdsim.shard_map returns every device's block before and after (and,
    for data that moves, the same collective applied to device numbers: the origins); rows by communicator."""
    moves = op in _MOVES

    def body(b):
        out = [b[None], np.asarray(getattr(lax, op)(b, axis_name, **params))[None]]
        if moves:  # the same collective on device numbers: where each element of the result came from
            ids = np.full(b.shape, lax.axis_index(mesh.axis_names) + 1, dtype=np.int32)
            out.append(np.asarray(getattr(lax, op)(ids, axis_name, **params))[None] - 1)
        return tuple(out)

    _no_enclosing_map("show.collective")
    outs = spmdsim.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spmdsim.P(_axis_names(mesh)))(x)
    before, after = outs[0], outs[1]
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    n, axes = mesh.size, mesh.axis_names
    ranked = sorted(names, key=axes.index) if op in _MESH_ORDER else names
    coords = np.array(np.unravel_index(np.arange(n), mesh.axis_sizes)).T
    rank = np.ravel_multi_index(tuple(coords[:, axes.index(m)] for m in ranked), [mesh.shape[m] for m in ranked])
    fixed = [k for k, m in enumerate(axes) if m not in names]
    index_groups = [list(g) for g in params.get("axis_index_groups") or ()]
    within = [_position(int(r), index_groups) for r in rank]  # (index group, position in it)
    group = [", ".join([*(f"{axes[k]}={coords[d, k]}" for k in fixed),
                        *([f"ranks {index_groups[within[d][0]]}"] if index_groups else [])]) or "all" for d in range(n)]
    order = sorted(range(n), key=lambda d: (tuple(coords[d, fixed]), within[d]))
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
    call = f"lax.{op}(x, {axis_name!r}{', ' + shown if shown else ''})"
    count = len(set(group))
    titles = [f"{call} on x of shape {x.shape} laid out by {spec} over {mesh!r}",
              (f"{count} communicator group{'s' if count > 1 else ''} of {n // count} devices, the devices that "
               f"differ only along {', '.join(map(repr, names))}; rank: the position in the group")]
    rows = [[_mesh_label(d, mesh), group[d], str(rank[d]), _fmt(before[d]), _fmt(after[d])] for d in order]
    text = _show(echo, "\n".join(titles), ["device", "group", "rank", "before", "after"], rows)
    drawn = [_before_after(f"{_mesh_label(d, mesh)}, rank {rank[d]}", d, before[d], after[d],
                           outs[2][d] if moves else None) for d in order]
    runs: list[list] = []
    for d in order:
        if runs and runs[-1][0] == group[d]:
            runs[-1][1] += 1
        else:
            runs.append([group[d], 1])
    caption = ("after: colour = the device an element came from" if moves else
               "after: grey = combined from every device of the group") + "; brackets: the communicator groups"
    drawing = _draw(drawn, headers=[f"before {before.shape[1:]}", f"after {after.shape[1:]}"],
                    title=f"{call}\nx {x.shape} laid out by {spec} over {mesh!r}\n{caption}", n_devices=n,
                    grey="zeros (received nothing)" if moves else "combined from every device of the group",
                    groups=runs, name=lambda d: _mesh_label(d, mesh))
    return Picture(text, drawing)


def _position(rank: int, index_groups: list[list[int]]) -> tuple[int, int]:
    """(which of ``axis_index_groups`` holds ``rank``, its position there); (0, rank) without groups."""
    for g, ranks in enumerate(index_groups):
        if rank in ranks:
            return g, ranks.index(rank)
    return 0, rank


def _no_enclosing_map(api: str) -> None:
    if _runtime.current_lane() is not None:
        raise ValueError(f"{api}: the mesh form lays out a global array and runs its own shard_map; inside a mapped "
                         f"function, show every device's block with spmdsim.show.blocks(x, axis_name).")


def _axis_names(mesh) -> tuple:
    return tuple(getattr(mesh, "axis_names", ()))  # not a Mesh: shard_map raises its TypeError


def _layout(shape: tuple, mesh, spec) -> np.ndarray:
    """The flat indices of the elements of an array of ``shape`` that each device of ``mesh`` holds under
    ``spec``, stacked: shape (devices, *block). Computed by spmdsim.shard_map itself, so its checks of the
    spec (and their errors) apply."""
    _no_enclosing_map("show.sharding")
    index = np.arange(math.prod(shape)).reshape(shape)
    return spmdsim.shard_map(lambda b: b[None], mesh=mesh, in_specs=spec,
                             out_specs=spmdsim.P(_axis_names(mesh)))(index)


def _slice(held: np.ndarray, shape: tuple) -> str:
    """``x[0:2, :]``: the slice of x a device holds, from the flat indices it holds (a block)."""
    if not shape:
        return "x"
    parts = []
    for c, size in zip(np.unravel_index(held.reshape(-1), shape), shape, strict=True):
        lo, hi = int(c.min()), int(c.max()) + 1
        parts.append(":" if (lo, hi) == (0, size) else f"{lo}:{hi}")
    return f"x[{', '.join(parts)}]"


def _some(devices: list[int]) -> str:
    """``devices 0, 1``; long lists elided in the middle."""
    shown = devices if len(devices) <= 6 else [*devices[:4], "…", devices[-1]]
    return f"device{'s' if len(devices) > 1 else ''} {', '.join(map(str, shown))}" + \
        (f" ({len(devices)})" if len(devices) > 6 else "")


def _mesh_label(device: int, mesh) -> str:
    """``device 5 [x=2, y=1]``, as spmdsim's reports label a mesh's devices."""
    coords = np.unravel_index(device, mesh.axis_sizes)
    return frames_label([Frame(m, s, int(c), (), True) for m, s, c in zip(mesh.axis_names, mesh.axis_sizes, coords,
                                                                         strict=True)])


def _mesh_grid(mesh) -> tuple[np.ndarray, list[str | None], list[str | None]]:
    """The mesh's device numbers as a grid (its first axis down, the others across, row-major), elided like
    a block, with the row and column headings (None where elided)."""
    names, sizes = mesh.axis_names, mesh.axis_sizes
    grid = np.arange(mesh.size).reshape(sizes[0], -1)
    row_heads = [None if i is None else f"{names[0]}={i}" for i in _kept(grid.shape[0])]
    col_heads = [None if j is None else ", ".join(f"{m}={c}" for m, c in zip(names[1:], np.unravel_index(
        j, sizes[1:]), strict=True)) or "device" for j in _kept(grid.shape[1])]
    return grid, row_heads, col_heads


def _mesh_table(mesh) -> tuple[list[str], list[list[str]]]:
    grid, row_heads, col_heads = _mesh_grid(mesh)
    rows = [[head or "…", *(str(grid[i, j]) if i is not None and j is not None else "…"
                            for j in _kept(grid.shape[1]))] for head, i in zip(row_heads, _kept(grid.shape[0]))]
    return ["mesh", *(h or "…" for h in col_heads)], rows


def _member(frames, resolved, rank: int) -> list:
    """The frames of the device at ``rank`` in this device's group over the ``resolved`` frames (ranks row-major
    over them, in the order named): this device's frames with the coordinates along those replaced."""
    coords = dict(zip(map(id, resolved), np.unravel_index(rank, [f.size for f in resolved]), strict=True))
    return [dataclasses.replace(f, index=int(coords[id(f)])) if id(f) in coords else f for f in frames]


def _number(frames) -> int:
    """The virtual device (row-major over the device frames; over all frames under vmap alone)."""
    counted = [f for f in frames if f.is_device] or frames
    return int(np.ravel_multi_index([f.index for f in counted], [f.size for f in counted]))


def _panel(label: str, block, device: int) -> tuple:
    grid = _as_grid(block)
    return label, grid, np.full(grid.shape, device)


def _kept_panels(indices: list[int]) -> list[int | None]:
    return indices if len(indices) <= MAX_PANELS else [*indices[:EDGE_PANELS], None, *indices[-EDGE_PANELS:]]


# -- the pmap form's runs ------------------------------------------------------------------------------------

def _before_after(label: str, device: int, before, after, origin) -> tuple:
    """A row of the drawing: ``before`` in the device's colour, ``after`` in its elements' ``origin`` devices'
    (grey without one: combined)."""
    after = _as_grid(after)
    return label, [(_as_grid(before), np.full(_as_grid(before).shape, device)),
                   (after, np.full(after.shape, -1) if origin is None else _as_grid(origin))]


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


# -- drawing -------------------------------------------------------------------------------------------------

def _as_grid(block) -> np.ndarray:
    """A block as rows x columns: a scalar is 1 x 1, a vector one row, higher ranks their first axis down."""
    block = np.asarray(block)
    if block.ndim <= 1:
        return block.reshape(1, -1)
    return block.reshape(block.shape[0], math.prod(block.shape[1:]))


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


def _cells(grid: np.ndarray, owner: np.ndarray) -> tuple[list[list[str]], list[list[int | None]]]:
    """The labels and owners of the cells drawn for a grid: elided in the middle (label "…", owner None)."""
    kept_rows, kept_cols = _kept(grid.shape[0]), _kept(grid.shape[1])
    labels = [[_label(grid[i, j]) if i is not None and j is not None else "…" for j in kept_cols] for i in kept_rows]
    owners = [[int(owner[i, j]) if i is not None and j is not None else None for j in kept_cols] for i in kept_rows]
    return labels, owners


def _width(labels: list[list[str]]) -> int:
    """The number of cells across a grid's labels (0 for a grid without rows)."""
    return len(labels[0]) if labels else 0


def _cell_width(*labels: list[list[str]]) -> int:
    longest = max((len(s) for cells in labels for row in cells for s in row), default=1)
    return max(MIN_CELL, math.ceil(_svg.text_width("x" * longest)) + 2 * PAD)


def _grid_svg(x0: float, y0: float, labels, owners, cell_w: float, n_devices: int) -> list[str]:
    """The cells of one grid, top left at (x0, y0): each a rect in its owner's colour (white where elided)
    and its label, as ``<g class="cell">``."""
    out = []
    for a, (label_row, owner_row) in enumerate(zip(labels, owners, strict=True)):
        for b, (label, owner) in enumerate(zip(label_row, owner_row, strict=True)):
            cx, cy = x0 + b * cell_w, y0 + a * CELL_H
            colour = "white" if owner is None else _svg.device_colour(owner, n_devices)
            out.append(f'<g class="cell"><rect x="{cx:.1f}" y="{cy:g}" width="{cell_w - 2}" height="{CELL_H - 2}" '
                       f'fill="{colour}" fill-opacity="0.75"/>'
                       + _svg.text(cx + (cell_w - 2) / 2, cy + CELL_H / 2 + 3, label, anchor="middle") + "</g>")
    return out


def _draw(rows, *, headers: list[str], title: str, n_devices: int, grey: str, groups=None,
          name=lambda d: f"device {d}") -> str:
    """A table of blocks: ``rows`` of (label, [(2-D values, 2-D owning device or -1), ...]) under the column
    ``headers``, the ``title`` lines above and a legend below (``grey`` says what an owner of -1 means,
    ``name`` names a device). ``groups``: (label, number of rows) for consecutive runs of rows, drawn as
    labelled brackets left of the row labels."""
    cells = [[_cells(grid, owner) for grid, owner in row] for _, row in rows]
    cell_w = _cell_width(*(labels for row in cells for labels, _ in row))
    col_w = [max(_svg.text_width(h), *(_width(row[c][0]) * cell_w for row in cells)) for c, h in enumerate(headers)]
    group_w = max((_svg.text_width(g) + 14 for g, _ in groups or ()), default=0)
    left = GAP + group_w + max((_svg.text_width(label) + GAP for label, _ in rows if label), default=0)
    titles = _title_lines(title)
    y = 30 + 20 * len(titles)
    body, x0 = [], left
    for c, h in enumerate(headers):
        body.append(_svg.text(x0, y, h))
        x0 += col_w[c] + GAP
    y += 8
    ends = list(itertools.accumulate(count for _, count in groups or ()))  # each group's row after its last
    for r, ((label, _), row) in enumerate(zip(rows, cells, strict=True)):
        if groups and r in [0, *ends]:
            y += 10 if r else 0
            top = y
        if label:
            body.append(_svg.text(GAP + group_w, y + CELL_H / 2 + 3, label))
        x0, row_h = left, 0
        for c, (labels, owners) in enumerate(row):
            body += _grid_svg(x0, y, labels, owners, cell_w, n_devices)
            row_h = max(row_h, len(labels) * CELL_H)
            x0 += col_w[c] + GAP
        if r + 1 in ends:
            group, bx = groups[ends.index(r + 1)][0], GAP + group_w - 6
            body.append(f'<g class="group"><path d="M{bx + 5:.1f},{top} H{bx:.1f} V{y + row_h - 2} H{bx + 5:.1f}" '
                        f'fill="none" stroke="#555555"/>'
                        + _svg.text(bx - 4, (top + y + row_h) / 2 + 3, group, anchor="end") + "</g>")
        y += row_h + 10
    owners = {o for row in cells for _, grid in row for line in grid for o in line if o is not None}
    return _page(titles, body, left + sum(col_w) + len(col_w) * GAP, y,
                 _legend_items(sorted(owners), n_devices, grey, name))


def _draw_sharding(grid, owner, mesh, device_colour: np.ndarray, *, header: str, title: str, items) -> str:
    """Two panels: ``grid`` (x as 2-D, under ``header``) coloured by ``owner``, and the mesh's devices, device
    d coloured as ``device_colour[d]`` and labelled by its number, under headings of its coordinates."""
    labels, owners = _cells(grid, owner)
    x_w = _cell_width(labels)
    mesh_grid, row_heads, col_heads = _mesh_grid(mesh)
    mesh_labels, mesh_owners = _cells(mesh_grid, device_colour.reshape(mesh_grid.shape))
    mesh_w = max(_cell_width(mesh_labels), *(_svg.text_width(h or "…") + 2 * PAD for h in col_heads))
    panel_w = max(_svg.text_width(header), _width(labels) * x_w)
    mesh_x = GAP + panel_w + 2 * GAP
    heads_w = max(_svg.text_width(h or "…") for h in row_heads) + 2 * PAD
    titles = _title_lines(title)
    y = 30 + 20 * len(titles)
    top = y + 26  # the cells; the mesh's column headings above them
    n = mesh.size
    body = [_svg.text(GAP, y, header), _svg.text(mesh_x, y, repr(mesh)),
            *_grid_svg(GAP, top, labels, owners, x_w, n), *_grid_svg(mesh_x + heads_w, top, mesh_labels, mesh_owners,
                                                                     mesh_w, n)]
    body += [_svg.text(mesh_x + heads_w + b * mesh_w + (mesh_w - 2) / 2, top - 6, h or "…", anchor="middle")
             for b, h in enumerate(col_heads)]
    body += [_svg.text(mesh_x + heads_w - PAD, top + a * CELL_H + CELL_H / 2 + 3, h or "…", anchor="end")
             for a, h in enumerate(row_heads)]
    right = max(mesh_x + heads_w + len(col_heads) * mesh_w, mesh_x + _svg.text_width(repr(mesh)))
    bottom = top + max(len(labels), len(row_heads)) * CELL_H + 10
    return _page(titles, body, right + GAP, bottom, items)


def _draw_panels(panels, *, title: str, n_devices: int, items) -> str:
    """A grid of labelled blocks: ``panels`` rows of (label, 2-D values, 2-D owner) or None (elided, "…")."""
    titles = _title_lines(title)
    drawn = [[None if p is None else (p[0], *_cells(p[1], p[2])) for p in row] for row in panels]
    cell_w = _cell_width(*(p[1] for row in drawn for p in row if p is not None))
    n_cols = len(drawn[0])
    col_w = [max((max(_svg.text_width(p[0]), _width(p[1]) * cell_w) for row in drawn if (p := row[c]) is not None),
                 default=_svg.text_width("…")) for c in range(n_cols)]
    body, y = [], 30 + 20 * len(titles)
    for row in drawn:
        if all(p is None for p in row):
            body.append(_svg.text(GAP, y + 12, "…"))
            y += 24
            continue
        x0, row_h = GAP, 0
        for c, p in enumerate(row):
            if p is None:
                body.append(_svg.text(x0, y + 18 + CELL_H / 2, "…"))
            else:
                body.append(_svg.text(x0, y + 12, p[0]))
                body += _grid_svg(x0, y + 18, p[1], p[2], cell_w, n_devices)
                row_h = max(row_h, 18 + len(p[1]) * CELL_H)
            x0 += col_w[c] + GAP
        y += row_h + 12
    return _page(titles, body, GAP + sum(col_w) + len(col_w) * GAP, y, items)


def _legend_items(owners, n_devices: int, grey: str, name) -> list[tuple[str, str]]:
    """(colour, text) for the owners used: ``name(device)`` for each device (the first LEGEND_MAX), and
    ``grey`` for -1."""
    devices = sorted({d for d in owners if d >= 0})
    items = [(_svg.device_colour(d, n_devices), name(d)) for d in devices[:LEGEND_MAX]]
    if len(devices) > LEGEND_MAX:
        items.append(("white", f"… {name(devices[-1])}"))
    if -1 in owners:
        items.append((_svg.GREY, grey))
    return items


def _title_lines(title: str) -> list[str]:
    """The title's lines, each wrapped at TITLE_MAX characters."""
    return [part for line in title.split("\n") for part in textwrap.wrap(line, TITLE_MAX) or [""]]


def _page(titles: list[str], body: list[str], content_w: float, y: float, items) -> str:
    """The SVG document: the title lines above ``body`` (``content_w`` wide, ending at ``y``), the legend of
    ``items`` below."""
    swatch_w = max((_svg.text_width("colours: ") + 30 + _svg.text_width(t) for _, t in items), default=0)
    width = max(content_w, *(_svg.text_width(t, 14) + 2 * GAP for t in titles), swatch_w + 2 * GAP, 480)
    legend, height = _legend(items, y + 6, width)
    heads = [_svg.text(GAP, 28 + 20 * k, t, size=14) for k, t in enumerate(titles)]
    return _svg.document(width, height, [*heads, *body, *legend])


def _legend(items, y: float, width: float) -> tuple[list[str], float]:
    """Swatches naming the colours used, wrapped to ``width``; returns them and the height."""
    out, x = [_svg.text(GAP, y + 12, "colours:")], GAP + _svg.text_width("colours: ")
    for colour, name in items:
        item_w = 16 + _svg.text_width(name) + 14
        if x + item_w > width - GAP and x > GAP + _svg.text_width("colours: "):
            x, y = GAP + _svg.text_width("colours: "), y + 20
        out.append(f'<g class="legend"><rect x="{x:.1f}" y="{y + 2}" width="12" height="12" fill="{colour}" '
                   f'fill-opacity="0.75" stroke="#888888" stroke-width="0.5"/>' + _svg.text(x + 16, y + 12, name)
                   + "</g>")
        x += item_w
    return out, y + 20 + GAP
