"""``pmap`` and ``vmap``: split the inputs along mapped axes, run one lane per index, stack the outputs.

Both share one engine (:func:`_mapped_call`); they differ only where JAX's rules differ: pmap counts
virtual devices, takes static arguments and returns device 0's value for ``out_axes=None``; vmap needs no
devices, accepts a top-level list ``in_axes`` and ``axis_size`` without mapped arguments, and requires an
``out_axes=None`` output to be the same in every lane.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Hashable, Sequence

import numpy as np
from numpy.exceptions import AxisError

from spmdsim.runtime import _devices, _hosts, _runtime, _tree
from spmdsim.runtime._axes import Frame, Unnamed, frames_label
from spmdsim.runtime._values import as_array, dtype_of, explain_read_only, is_python_scalar, read_only, shape_of
from spmdsim.errors import AxisNameError, MappedSizeError, NotAnArrayError, ReplicationError

__all__ = ["pmap", "vmap"]


_UNNAMED = {"pmap": Unnamed("pmap"), "vmap": Unnamed("vmap")}  # no user name matches these (one per API)


def _check_axes_spec(spec, api: str, what: str, leaves: Callable = _tree.prefix_leaves) -> None:
    for leaf in leaves(spec):
        if leaf is not None and type(leaf) is not int:
            raise TypeError(f"{api} {what} must be an int, None, or (nested) container with those types as leaves, "
                            f"but got {leaf!r} of type {type(leaf).__name__}. Use a plain Python int such as 0.")


def _check_axis_name(axis_name, api: str) -> None:
    if axis_name is None:
        return
    if isinstance(axis_name, (int, tuple, list)) or not isinstance(axis_name, Hashable):
        raise AxisNameError(f"{api}: axis_name must be a hashable name such as 'i' (not an int, tuple or list: "
                            f"ints mean positional axes in psum, tuples mean several axes), got {axis_name!r}.")


def _as_array(leaf, path, api: str, what: str = "argument") -> np.ndarray:
    """``leaf`` (an argument, or with ``what="output"`` a device's output) as a NumPy array; TypeError naming
    ``path`` (formatted only then) for what is not a JAX value (:class:`NotAnArrayError`, also a ValueError,
    for an argument that is not an array at all)."""
    if type(leaf) is np.ndarray and leaf.dtype.kind in "biufc":  # the common case, without formatting `path`
        return leaf
    try:
        return as_array(leaf, _Named("argument ", path) if what == "argument" else _Named("", path), api)
    except TypeError:
        if not isinstance(leaf, (np.ndarray, np.generic)):
            if what == "output":
                raise TypeError(f"{api}: {path} of type {type(leaf).__name__} is not an array; the mapped function "
                                f"must return arrays or numbers (in any pytree).") from None
            raise NotAnArrayError(f"{api}: argument {path} of type {type(leaf).__name__} is not an array; mapped "
                                  f"function arguments must be arrays or numbers. Pass non-array values with "
                                  f"static_broadcasted_argnums, or close over them.") from None
        raise


class _Named:
    """``prefix + str(path)``, formatted only when an error message needs it."""

    __slots__ = ("prefix", "path")

    def __init__(self, prefix: str, path):
        self.prefix, self.path = prefix, path

    def __str__(self) -> str:
        return f"{self.prefix}{self.path}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


@dataclasses.dataclass
class _Inputs:
    """The flat leaves of the dynamic arguments and, per leaf, its mapped axis (None: broadcast)."""

    paths: "LazyPaths"
    leaves: list[np.ndarray]
    axes: list[int | None]
    treedef: Any
    flat: bool  # the arguments are ``f(x, y, ...)``: each positional argument one leaf, no keywords

    def __post_init__(self):
        # Read-only views made once per call: a device's block, a view of one, is read-only too.
        self.views = [self.shared(leaf) if ax is None else read_only(leaf)
                      for leaf, ax in zip(self.leaves, self.axes)]

    def block(self, i: int):
        """Device ``i``'s arguments ``(args, kwargs)``: read-only views of the caller's arrays, no copies."""
        out = [v if ax is None else v[i, ...] if ax == 0 else v[(slice(None),) * ax + (i, Ellipsis)]
               for v, ax in zip(self.views, self.axes)]
        return (out, {}) if self.flat else _tree.unflatten(self.treedef, out)

    @staticmethod
    def shared(leaf):
        """A broadcast (``in_axes=None``) leaf as every device sees it: a read-only view; a Python scalar as
        is, so it stays weakly typed, as in JAX (``x_f32 * 2.0`` is float32)."""
        return leaf if is_python_scalar(leaf) else read_only(leaf)


def _flatten_inputs(dyn_args: tuple, kwargs: dict, in_axes, api: str, hint: str) -> _Inputs:
    if not kwargs and type(in_axes) is int and len(dyn_args) == 1 and type(dyn_args[0]) is np.ndarray \
            and dyn_args[0].dtype.kind in "biufc":  # f(x): one array, nothing to walk
        x = dyn_args[0]
        return _Inputs(LazyPaths((dyn_args, kwargs), 1, argument_path), [x],
                       [canonical_in_axis(in_axes, x.shape, "args[0]", api)], None, True)
    leaves, treedef = _tree.flatten((dyn_args, kwargs))
    n_kw = len(_tree.flatten(kwargs)[0]) if kwargs else 0
    if in_axes is None or type(in_axes) is int:  # one entry for every positional leaf: nothing to walk
        axes = [in_axes] * (len(leaves) - n_kw) + [0] * n_kw
    else:
        axes = _tree.broadcast_prefix(in_axes, dyn_args, name=f"{api} in_axes", hint=hint) + [0] * n_kw
    paths = LazyPaths((dyn_args, kwargs), len(leaves), argument_path)
    arrays = []
    for k, (leaf, ax) in enumerate(zip(leaves, axes)):
        if ax is None and is_python_scalar(leaf):
            arrays.append(leaf)
            continue
        arr = leaf if type(leaf) is np.ndarray and leaf.dtype.kind in "biufc" else _as_array(leaf, paths[k], api)
        if ax is not None and not 0 <= ax < arr.ndim:  # (the path named only for an error)
            axes[k] = canonical_in_axis(ax, arr.shape, paths[k], api)
        arrays.append(arr)
    flat = not kwargs and len(leaves) == len(dyn_args) and all(a is b for a, b in zip(dyn_args, leaves))
    return _Inputs(paths, arrays, axes, treedef, flat)


def canonical_in_axis(ax: int, shape: tuple, path, api: str) -> int:
    """``in_axes`` entry ``ax`` for an argument of ``shape``, counted from the front. NumPy's ``AxisError``, a
    ValueError and an IndexError, for a scalar or an axis out of bounds (JAX raises IndexError, or a sharding
    ValueError for an argument after the first mapped one)."""
    if len(shape) == 0:
        raise AxisError(f"{api}: in_axes={ax} maps {path}, but it is a scalar (rank 0) and has no axis {ax}. "
                        f"Give it in_axes=None to broadcast it to every {'device' if api == 'pmap' else 'lane'}, "
                        f"or add a leading axis.")
    if not -len(shape) <= ax < len(shape):
        raise AxisError(f"{api}: in_axes={ax} is out of bounds for {path} of shape {tuple(shape)} "
                        f"(rank {len(shape)}; valid: {-len(shape)}..{len(shape) - 1}).")
    return ax % len(shape)


def _mapped_size(inputs: _Inputs, api: str, axis_size: int | None) -> int:
    return mapped_size(inputs.paths, [np.shape(leaf) for leaf in inputs.leaves], inputs.axes, api, axis_size)


def mapped_size(paths: Sequence, shapes: Sequence[tuple], axes: Sequence[int | None], api: str,
                axis_size: int | None, size_error: type[MappedSizeError] = MappedSizeError) -> int:
    """The mapped size N: from the first mapped argument, checked against every other one and ``axis_size``.
    ``paths[k]`` names argument leaf k in errors (formatted only then); inconsistent sizes raise ``size_error``
    (the JAX front end passes its subclass that is also JAX's IndivisibleError)."""
    mapped = [(p, shape[ax], ax) for p, shape, ax in zip(paths, shapes, axes) if ax is not None]
    if not mapped:
        if api == "vmap" and axis_size is not None:
            return axis_size
        raise ValueError(f"{api} requires at least one argument with a mapped axis. Every argument has in_axes=None"
                         f"{' (axis_size does not replace a mapped argument in pmap)' if axis_size is not None else ''}"
                         f". Map at least one array (in_axes=0); to give every device the same value, stack copies: "
                         f"np.broadcast_to(x, (n,) + np.shape(x)).")
    first_path, n, first_ax = mapped[0]
    bad = [(p, size, ax) for p, size, ax in mapped if size != n]
    if bad:
        listing = "; ".join(f"{p} has size {size} on axis {ax}" for p, size, ax in [mapped[0], *bad])
        raise size_error(f"{api} got inconsistent sizes for the mapped axis: {listing}. Every mapped argument "
                         f"must have the same size along its mapped axis (the size comes from the first, "
                         f"{first_path})."
                         f"{_other_axis_hint(paths, shapes, axes, n) or _broadcast_hint(paths, axes, mapped, api)}")
    if axis_size is not None and axis_size != n:
        raise ValueError(f"Specified axis_size {axis_size} doesn't match received axis_size {n} (from {first_path}).")
    if n == 0:
        raise ValueError(f"{api}: the mapped axis of {first_path} has size 0; there must be at least one "
                         f"{'device' if api == 'pmap' else 'lane'}.")
    return n


def _other_axis_hint(paths: Sequence, shapes: Sequence[tuple], axes: Sequence[int | None], n: int) -> str:
    """For inconsistent mapped sizes: the arguments whose size on another axis is the mapped size ``n`` (mapped
    over the wrong axis), e.g. `` args[1] has size 4 on axis 1: in_axes=(0, 1)?``; with the ``in_axes`` to write
    when the arguments are positional ones mapped whole; "" when there is none."""
    import re

    moved: dict[int, int] = {}  # leaf -> the axis of size n to map instead
    for k, (shape, ax) in enumerate(zip(shapes, axes, strict=True)):
        if ax is not None and shape[ax] != n:
            other = [d for d, size in enumerate(shape) if size == n and d != ax]
            if len(other) == 1:
                moved[k] = other[0]
    if not moved:
        return ""
    said = "; ".join(f"{paths[k]} has size {n} on axis {d}" for k, d in moved.items())
    positions = [re.fullmatch(r"args\[(\d+)\]", str(paths[k])) for k in range(len(shapes))]
    if all(positions):
        entries = {int(m.group(1)): moved.get(k, ax) for k, (m, ax) in enumerate(zip(positions, axes))}
        if sorted(entries) == list(range(len(entries))):
            return f" {said}: in_axes={tuple(entries[i] for i in range(len(entries)))}?"
    return f" {said}: map it over that axis (in_axes)?"


def _broadcast_hint(paths: Sequence, axes: Sequence[int | None], mapped: list, api: str) -> str:
    """For inconsistent mapped sizes: the ``in_axes`` that broadcasts the positional arguments whose size is not
    the most common one (parameters mapped by mistake), e.g. `` ... in_axes=(None, 0, 0)``; "" when the
    arguments are not all positional or some is mapped over another axis than 0."""
    import collections
    import re

    counts = collections.Counter(size for _, size, _ in mapped).most_common(2)
    if len(counts) > 1 and counts[0][1] == counts[1][1]:  # no size is the most common: which one is meant?
        return ""
    common = counts[0][0]
    entries: dict[int, int | None] = {}
    for path, ax in zip(paths, axes, strict=True):
        match = re.match(r"args\[(\d+)\]", str(path))
        if match is None or ax not in (0, None):
            return ""
        i = int(match.group(1))
        entries[i] = 0 if ax == 0 or entries.get(i) == 0 else None
    odd = sorted({int(re.match(r"args\[(\d+)\]", str(p)).group(1)) for p, size, _ in mapped if size != common})
    if not odd or len(odd) == len([e for e in entries.values() if e == 0]):
        return ""
    example = tuple(None if i in odd else entries.get(i) for i in range(max(entries) + 1))
    names = ", ".join(f"args[{i}]" for i in odd)
    return (f" If {names} should be the same on every {'device' if api == 'pmap' else 'lane'} (parameters, a "
            f"constant), broadcast "
            f"{'them' if len(odd) > 1 else 'it'} instead of mapping: in_axes={example}.")


def check_device_count(n: int, devices: Sequence | None, outer: int = 1,
                       size_error: type[MappedSizeError] = MappedSizeError) -> None:
    """``size_error`` (a ValueError), with the reshape to do, when ``n`` devices are more than are available (in a
    nested pmap: per block of the enclosing ones: those running, and ``outer`` more being traced)."""
    lane = _runtime.current_lane()
    outer *= math.prod(f.size for f in lane.frames if f.is_device) if lane is not None else 1
    total = len(devices) if devices is not None else _devices.device_count()
    available = total // outer
    if n <= available:
        return
    where = (f"devices= lists {total}" if devices is not None else f"spmdsim.device_count() is {total}")
    if outer > 1:
        where += f", and the enclosing pmaps already use {outer} devices per block"
    fix = (f"reshape the input to ({available}, {n // available}, ...) and map over the leading axis"
           if n % available == 0 else f"pad it to a multiple of {available}, then reshape to "
                                        f"({available}, {-(-n // available)}, ...)")
    raise size_error(f"pmap: the mapped axis has size {n}, but only {available} virtual devices are available "
                     f"({where}). pmap runs one block per device and never splits an axis into chunks: {fix}, "
                     f"or use more virtual devices: {_devices.more_devices_hint(n * outer)}.")


def multi_host_size(n: int) -> tuple[int, int]:
    """For a top-level pmap whose mapped axis has size ``n`` here: ``(global index of this host's first device,
    global size)``. In a multi-host run each host maps its local devices (``n`` must be the local device count,
    as in JAX) and the axis spans every host's; otherwise ``(0, n)``."""
    host = _hosts.current() if _runtime.current_lane() is None else None
    if host is None:
        return 0, n
    if n != host.local:
        raise ValueError(f"On multi-host platforms, the input to pmapped functions must have leading axis size "
                         f"equal to the number of local devices if no `devices` argument is specified. Got "
                         f"axis_size={n}, num_local_devices={host.local} (host {host.index} of {host.count}). "
                         f"Pass each host's own part of the data: its mapped axis has the local device count.")
    return host.index * n, host.count * n


def _stack_outputs(outputs: list, out_axes, api: str, lane_label: Callable[[int], str],
                   check_replicated: bool):
    """Stack per-lane output pytrees along ``out_axes``; ``None`` takes lane 0's value."""
    ref = outputs[0]
    if type(out_axes) is int and out_axes == 0 and type(ref) is np.ndarray and ref.dtype.kind in "biufc":
        shape, dtype = ref.shape, ref.dtype
        for o in outputs:
            if type(o) is not np.ndarray or o.shape != shape or o.dtype != dtype:
                break
        else:  # one array per lane, stacked on a new leading axis: what the general path below does
            return np.array(outputs)
    first_leaves, treedef = _tree.flatten(ref)
    try:  # the other lanes' leaves, structure checked (~0.2 µs each; flattening anew costs ~1 µs)
        per_lane = [first_leaves, *(treedef.flatten_up_to(out) for out in outputs[1:])]
    except ValueError:
        _check_structures(outputs, treedef, api, lane_label)
        per_lane = [_tree.flatten(out)[0] for out in outputs]
    axes = [out_axes] * len(first_leaves) if out_axes is None or type(out_axes) is int \
        else _tree.broadcast_prefix(out_axes, outputs[0], name=f"{api} out_axes")
    stacked = []
    for k, (ax, blocks) in enumerate(zip(axes, zip(*per_lane))):
        path = LazyPath(outputs[0], k)
        ref = blocks[0]
        if not (isinstance(ref, (np.ndarray, np.generic)) and ref.dtype.kind in "biufc"
                and len(set(map(type, blocks))) == 1 and len(set(map(shape_of, blocks))) == 1
                and len(set(map(dtype_of, blocks))) == 1):  # (each set made in C: no Python per block)
            if not all(map(_tree.is_leaf, blocks)):  # a lane has a subtree where lane 0 has a leaf
                _check_structures(outputs, treedef, api, lane_label)
            blocks = [_as_array(b, path, api, "output") for b in blocks]  # scalars, other dtypes; or an error
            ref = blocks[0]
            for i, b in enumerate(blocks):
                if b.shape != ref.shape or b.dtype != ref.dtype:
                    raise ValueError(f"{api}: {path} is {b.dtype}{list(b.shape)} on {lane_label(i)} but "
                                     f"{ref.dtype}{list(ref.shape)} on {lane_label(0)}; outputs can only be stacked "
                                     f"when every {'device' if api == 'pmap' else 'lane'} returns the same shape "
                                     f"and dtype.")
        stacked.append(_place(path, blocks, ax, api, lane_label, check_replicated))
    return _tree.unflatten(treedef, stacked)


def _check_structures(outputs: list, treedef, api: str, lane_label: Callable[[int], str]) -> None:
    """ValueError naming the first lane whose output's pytree structure is not lane 0's (``treedef``)."""
    for i, out in enumerate(outputs):
        other = _tree.flatten(out)[1]
        if other != treedef:
            raise ValueError(f"{api}: {lane_label(i)} returned {other}, but {lane_label(0)} returned {treedef}. "
                             f"Every {'device' if api == 'pmap' else 'lane'} must return the same pytree structure.")


def argument_path(keystr: str) -> str:
    """``args[1]['w']`` or ``kwargs['x']`` from the key path into ``(args, kwargs)``."""
    return ("args" if keystr.startswith("[0]") else "kwargs") + keystr[3:]


class LazyPaths:
    """The :class:`LazyPath` of every leaf of ``tree`` (``count`` of them), made when one is looked at."""

    __slots__ = ("tree", "count", "spell", "keystrs")

    def __init__(self, tree, count: int, spell: Callable[[str], str], keystrs: Callable | None = None):
        self.tree, self.count, self.spell, self.keystrs = tree, count, spell, keystrs

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, k: int) -> "LazyPath":
        if not 0 <= k < self.count:
            raise IndexError(k)
        return LazyPath(self.tree, k, self.spell, self.keystrs)

    def __iter__(self):
        return (self[k] for k in range(self.count))


class LazyPath:
    """The path of leaf ``k`` of ``tree`` (``output['w']``, ``args[1]``), worked out only when an error message
    needs it: formatting key paths costs more than a small mapped call. ``keystrs(tree)`` lists every leaf's
    key path (spmdsim's pytree registry by default; the JAX front end passes JAX's)."""

    def __init__(self, tree, k: int, spell: Callable[[str], str] = lambda keystr: "output" + keystr,
                 keystrs: Callable | None = None):
        self.tree, self.k, self.spell = tree, k, spell
        self.keystrs = keystrs or (lambda t: _tree.flatten_with_paths(t)[0])

    def __str__(self) -> str:
        return self.spell(self.keystrs(self.tree)[self.k])

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _place(path: str, blocks, ax: int | None, api: str, lane_label: Callable[[int], str], check_replicated: bool):
    """One output leaf from its per-lane blocks (arrays, or NumPy scalars, of one shape and dtype): stacked along
    ``ax``, or lane 0's value for ``ax=None`` (checked to be the same everywhere when asked, and for vmap)."""
    ref = blocks[0]
    if ax is None:
        if check_replicated or api == "vmap":
            differ = [lane_label(i) for i in range(len(blocks))
                      if not np.array_equal(blocks[i], ref, equal_nan=ref.dtype.kind in "fc")]
            if differ:
                cls = ReplicationError if api == "pmap" else ValueError
                raise cls(f"{api}: {path} has out_axes=None but is not the same everywhere: {', '.join(differ)} "
                          f"differ from {lane_label(0)}. Reduce it first (e.g. psum/pmean over the axis) or give "
                          f"it a mapped out_axes.")
        if type(ref) is not np.ndarray:
            return np.asarray(ref)  # a NumPy scalar (np.float32(1.0)): a new 0-d array
        if ref.flags.owndata and not ref.flags.writeable:
            return ref  # a collective's result, shared by the devices and read-only (as a JAX array): no copy
        return np.array(ref)
    if not -(ref.ndim + 1) <= ax <= ref.ndim:
        raise ValueError(f"{api}: out_axes={ax} for {path} is out of bounds: per-"
                         f"{'device' if api == 'pmap' else 'lane'} values have rank {ref.ndim}, so the mapped "
                         f"axis can go at {-(ref.ndim + 1)}..{ref.ndim}.")
    return np.array(blocks) if ax == 0 else np.stack(blocks, axis=ax)


def split_static(fun: Callable, args: tuple, in_axes, static_argnums: tuple) -> tuple[dict, tuple, Any]:
    """Take the static arguments out of ``args``: returns ``({position: value}, dynamic args, in_axes for
    them)``. Raises ValueError (JAX's texts) for static arguments passed by keyword or not hashable."""
    if not static_argnums:
        return {}, tuple(args), in_axes
    if any(not -len(args) <= a < len(args) for a in static_argnums):
        raise ValueError(f"pmapped function has static_broadcasted_argnums={tuple(static_argnums)} but was called "
                         f"with only {len(args)} positional argument{'s' if len(args) != 1 else ''}. All static "
                         f"broadcasted arguments must be passed positionally.")
    argnums = sorted({a % len(args) for a in static_argnums})
    statics = {}
    for a in argnums:
        try:
            hash(args[a])
        except TypeError:
            raise ValueError(f"Non-hashable static arguments are not supported, as this can lead to unexpected "
                             f"cache-misses. Static argument (index {a}) of type {type(args[a])} for function "
                             f"{getattr(fun, '__name__', fun)} is non-hashable. Pass a tuple instead of a list, "
                             f"or make the value an array argument.") from None
        statics[a] = args[a]
    dyn_argnums = [i for i in range(len(args)) if i not in statics]
    if isinstance(in_axes, tuple):
        if len(in_axes) != len(args):
            raise ValueError(f"pmap in_axes has {len(in_axes)} entries, but the function was called with "
                             f"{len(args)} positional arguments; with static_broadcasted_argnums, in_axes has "
                             f"one slot per positional argument (static slots are ignored).")
        in_axes = tuple(in_axes[i] for i in dyn_argnums)
    return statics, tuple(args[i] for i in dyn_argnums), in_axes


def merge_static(statics: dict, dyn: Sequence) -> Sequence:
    """The full positional argument list from the static values and the dynamic ones."""
    if not statics:
        return dyn
    it = iter(dyn)
    return [statics[k] if k in statics else next(it) for k in range(len(dyn) + len(statics))]


def _mapped_call(fun: Callable, args: tuple, kwargs: dict, *, api: str, axis_name, in_axes, out_axes,
                 axis_size: int | None, static_argnums: tuple = (), devices=None, check_replicated: bool = False,
                 hint: str = ""):
    """Validate and split the arguments, run one lane per index, stack the outputs."""
    statics, args, in_axes = split_static(fun, args, in_axes, static_argnums)
    if kwargs:
        hint += (" When some arguments are passed by keyword, they are not included in the comparison to in_axes: "
                 "each is mapped over its leading axis.")
    inputs = _flatten_inputs(tuple(args), kwargs, in_axes, api, hint)
    n = _mapped_size(inputs, api, axis_size)
    first, n_global = 0, n
    if api == "pmap":
        check_device_count(n, devices)
        first, n_global = multi_host_size(n)
    name = axis_name if axis_name is not None else _UNNAMED[api]

    def body(i: int):
        dyn, kw = inputs.block(i)
        try:
            return fun(*merge_static(statics, dyn), **kw)
        except ValueError as e:  # a write into a read-only argument or result: the message says which
            explain_read_only(e, _tree.flatten((dyn, kw))[0], "device" if api == "pmap" else "lane")
            raise

    outputs = _runtime.run_mapped(body, [(name, n_global)], is_device=(api == "pmap"),
                                  name=_runtime.function_name(fun))
    parent = _runtime.current_lane()
    frames = parent.frames if parent is not None else ()

    def lane_label(i: int) -> str:
        return frames_label(frames + (Frame(name, n_global, first + i, (), api == "pmap"),))

    return _stack_outputs(outputs, out_axes, api, lane_label, check_replicated)


def check_pmap_arguments(axis_name, in_axes, out_axes, static_broadcasted_argnums, devices,
                         prefix_leaves: Callable = _tree.prefix_leaves) -> tuple[int, ...]:
    """pmap's construction-time checks (as in JAX); returns the static argnums as a tuple. ``prefix_leaves``
    lists the leaves of an ``in_axes``/``out_axes`` tree (the JAX front end passes JAX's pytree registry)."""
    _check_axis_name(axis_name, "pmap")
    if devices is not None and len(devices) == 0:
        raise ValueError("'devices' argument to pmap must be non-empty, or None.")
    _check_axes_spec(in_axes, "pmap", "in_axes", prefix_leaves)
    _check_axes_spec(out_axes, "pmap", "out_axes", prefix_leaves)
    static = (static_broadcasted_argnums,) if isinstance(static_broadcasted_argnums, int) \
        else tuple(static_broadcasted_argnums)
    if any(type(a) is not int for a in static):
        raise TypeError(f"pmap: static_broadcasted_argnums must be ints, got {static_broadcasted_argnums!r}.")
    return static


PMAP_HINT = (" The value of in_axes must be a tree prefix of the tuple of arguments passed positionally to the "
              "mapped function, e.g. in_axes=(0, None) for f(x, params); a list is not a tuple.")


def pmap(fun: Callable, axis_name: Hashable | None = None, *, in_axes=0, out_axes=0,
         static_broadcasted_argnums: int | Sequence[int] = (), devices: Sequence | None = None, backend: str | None = None,
         axis_size: int | None = None, donate_argnums: int | Sequence[int] = (), check_replicated: bool = False):
    """Map ``fun`` over the mapped axis of its arguments, one virtual device per index; mirrors ``jax.pmap``.

    Each device runs ``fun`` in its own thread on concrete NumPy blocks (so Python ``if``, ``for``, ``print``
    and ``breakpoint()`` work per device), and may call the collectives of :mod:`spmdsim.lax` over
    ``axis_name``.

    Args:
      fun: the per-device function. Its outputs are pytrees of arrays (or numbers).
      axis_name: the name collectives use for this axis; hashable, not an int or tuple.
      in_axes: int, None, or a tree prefix of the tuple of positional arguments, leaves Python ints or None.
        Negative ints count from the end of each argument's shape. Keyword arguments are always mapped on
        axis 0. With ``static_broadcasted_argnums`` a tuple has one slot per positional argument.
      out_axes: int, None or a tree prefix of the output. ``k`` inserts the mapped axis at position ``k``
        (negative: from the end of the stacked rank). None returns device 0's value.
      static_broadcasted_argnums: positional arguments passed unchanged to every device (hashable).
      devices: the devices to use (the first N); only the count matters. backend, donate_argnums: accepted
        for compatibility; no effect on values.
      axis_size: checked against the mapped size.
      check_replicated: spmdsim only. With ``out_axes=None``, check that every device returned the same
        value and raise :class:`~spmdsim.errors.ReplicationError` naming the ones that differ.

    Returns:
      A function returning the output pytree with NumPy arrays stacked along ``out_axes``: shape
      ``(N, *block_shape)`` for ``out_axes=0``; dtypes as computed by the devices.

    Raises:
      ValueError: no mapped argument (also with ``axis_size``), a non-prefix ``in_axes``/``out_axes``,
        non-hashable or keyword-passed static arguments, empty ``devices``.
      MappedSizeError: (a ValueError) inconsistent mapped sizes (naming the key paths), a mapped size above
        the devices available.
      numpy.exceptions.AxisError: (a ValueError and an IndexError, as JAX raises) ``in_axes`` out of bounds
        for an argument, a scalar with a mapped axis.
      TypeError: ``in_axes``/``out_axes`` leaves that are not Python ints or None (at construction).
      NotAnArrayError: (a TypeError and a ValueError, as JAX raises either) a non-array argument.
      AxisNameError: (a TypeError and a ValueError) an int, tuple or list ``axis_name`` (at construction).
      CollectiveMismatchError: devices called different collectives at the same step.
      CollectiveDeadlockError: a collective some device never reaches.

    Any exception a device raises is raised too: the first in device order, with a note naming the device and
    the others' errors in ``exc.device_errors``.

    Differences from ``jax.pmap`` (JAX 0.10.2):
      - NumPy dtypes are kept: float64 and int64 inputs are not canonicalised to 32 bits.
      - Negative ``in_axes``/``out_axes`` count from the end, as in vmap; JAX 0.10 mis-shards them.
      - Negative ``static_broadcasted_argnums`` count from the end; JAX 0.10 silently ignores them.
      - Nested ``pmap`` works (product of sizes <= device count), with the semantics of
        ``pmap(vmap(f, axis_name='j'), axis_name='i')``; JAX 0.10 rejects nested pmap.
      - ``fun`` runs once per device on concrete values, not once under tracing.
      - Mapped-size errors are MappedSizeErrors (ValueErrors) with a fix, where JAX raises IndivisibleError or
        a squeeze error (``spmdsim.jax.pmap``'s are also IndivisibleErrors).
    """
    static = check_pmap_arguments(axis_name, in_axes, out_axes, static_broadcasted_argnums, devices)

    @_runtime.api_boundary
    @functools.wraps(fun)
    def mapped(*args, **kwargs):
        return _mapped_call(fun, args, kwargs, api="pmap", axis_name=axis_name, in_axes=in_axes, out_axes=out_axes,
                            axis_size=axis_size, static_argnums=static, devices=devices,
                            check_replicated=check_replicated, hint=PMAP_HINT)

    return mapped


def vmap(fun: Callable, in_axes=0, out_axes=0, *, axis_name: Hashable | None = None, axis_size: int | None = None):
    """Map ``fun`` over an axis without devices; mirrors ``jax.vmap``, run by the same engine as
    :func:`pmap`: one lane (thread) per index, with ``axis_name`` bound for collectives.

    ``pmap(vmap(f, axis_name='j'), axis_name='i')`` gives two named axes, as in JAX. ``in_axes`` may be a
    list at the top level (as in JAX); ``axis_size`` sets the size when no argument is mapped.

    Differences from ``jax.vmap``: ``fun`` runs once per lane on concrete values (per-lane Python control flow
    works); an ``out_axes=None`` output is checked by value (JAX checks whether it depends on a mapped
    input), raising ValueError when lanes differ.
    """
    _check_axis_name(axis_name, "vmap")
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    _check_axes_spec(in_axes, "vmap", "in_axes")
    _check_axes_spec(out_axes, "vmap", "out_axes")

    @_runtime.api_boundary
    @functools.wraps(fun)
    def mapped(*args, **kwargs):
        spec = in_axes
        if isinstance(spec, tuple) and len(spec) != len(args):
            raise ValueError(f"vmap in_axes must be an int, None, or a tuple of entries corresponding to the "
                             f"positional arguments passed to the function, but got len(in_axes)={len(spec)}, "
                             f"len(args)={len(args)}.")
        return _mapped_call(fun, args, kwargs, api="vmap", axis_name=axis_name, in_axes=spec, out_axes=out_axes,
                            axis_size=axis_size)

    return mapped
