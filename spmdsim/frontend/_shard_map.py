"""``shard_map`` for NumPy programs: a mesh of virtual devices, PartitionSpecs, one thread per device.

Mirrors ``jax.shard_map`` (JAX 0.10): each input, a global array, is split into one block per device as its
``PartitionSpec`` says (see :mod:`spmdsim.primitives._sharding`); every device runs ``f`` once in its own thread on its
blocks and may call the collectives of :mod:`spmdsim.lax` over any mesh axis or tuple of axes; the outputs are
assembled from the devices' blocks as ``out_specs`` say. Devices are labelled by their mesh coordinates:
``device 5 [x=2, y=1]``.
"""
from __future__ import annotations

import functools
import math
import threading
from typing import Callable, Hashable, Sequence

import numpy as np

from spmdsim.runtime import _devices, _hosts, _runtime, _tree

from spmdsim.primitives import _sharding
from spmdsim.runtime._axes import Frame, frames_label
from spmdsim.runtime._values import as_array, explain_read_only

__all__ = ["Mesh", "make_mesh", "PartitionSpec", "P", "shard_map"]


class PartitionSpec:
    """How an array's dimensions are split over mesh axes; mirrors ``jax.sharding.PartitionSpec``.

    One entry per leading dimension: ``None`` (not split), a mesh axis name, or a tuple of names (split over
    their product, the first name major). Dimensions after the last entry are not split; mesh axes no entry
    names replicate the array. ``P()`` is fully replicated.

    >>> P('x', None, ('y', 'z'))
    P('x', None, ('y', 'z'))
    """

    __slots__ = ("_parts",)

    def __init__(self, *parts):
        for part in parts:
            names = part if isinstance(part, tuple) else (part,)
            if any(not isinstance(n, Hashable) or isinstance(n, (list, int)) for n in names if n is not None):
                raise TypeError(f"PartitionSpec entries are None, a mesh axis name or a tuple of names; got {part!r}.")
        self._parts = tuple(parts)

    def __iter__(self):
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __getitem__(self, i):
        return self._parts[i]

    def __eq__(self, other) -> bool:
        return isinstance(other, PartitionSpec) and other._parts == self._parts

    def __hash__(self) -> int:
        return hash(("PartitionSpec", self._parts))

    def __repr__(self) -> str:
        return f"P({', '.join(map(repr, self._parts))})"


P = PartitionSpec


class Mesh:
    """A mesh of virtual devices with named axes; mirrors ``jax.sharding.Mesh``.

    Args:
      devices: an array (or nested list) of devices, one dimension per axis (``spmdsim.devices()`` reshaped).
      axis_names: one name per dimension.

    Attributes: ``shape`` (name -> size, in order), ``axis_names``, ``axis_sizes``, ``size``, ``devices``.
    The devices are numbered row-major over the axes (``device 5 [x=2, y=1]`` in a (4, 2) mesh).
    """

    def __init__(self, devices, axis_names):
        devices = np.array(devices, dtype=object)
        axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        if devices.ndim != len(axis_names):
            raise ValueError(f"Mesh: devices has {devices.ndim} dimensions but {len(axis_names)} axis names were "
                             f"given ({axis_names!r}); give one name per dimension.")
        if len(set(axis_names)) != len(axis_names):
            raise ValueError(f"Mesh: axis names must be unique, got {axis_names!r}.")
        self.devices = devices
        self.axis_names = axis_names
        self.axis_sizes = tuple(devices.shape)
        self.shape = dict(zip(axis_names, self.axis_sizes))
        self.size = devices.size

    @property
    def axes(self) -> tuple:
        """The mesh as ``(name, size)`` pairs, row-major."""
        return tuple(self.shape.items())

    def __repr__(self) -> str:
        return f"Mesh({', '.join(f'{n!r}: {s}' for n, s in self.shape.items())})"


def make_mesh(axis_shapes: Sequence[int], axis_names: Sequence[Hashable], *, devices=None) -> Mesh:
    """A mesh of the first ``prod(axis_shapes)`` virtual devices; mirrors ``jax.make_mesh``.

    Raises ValueError when the mesh needs more devices than there are (with the fix), when the shapes and
    names differ in length, or when a name repeats.

    Difference from JAX 0.10: ``make_mesh((4, 2), ('x', 'x'))`` is a ValueError here; JAX silently returns a
    one-axis mesh. Meshes have no axis types: spmdsim's arrays carry no sharding, so JAX's Explicit-axes
    requirements do not arise in NumPy programs.

    >>> import spmdsim
    >>> spmdsim.make_mesh((4, 2), ('x', 'y'))
    Mesh('x': 4, 'y': 2)
    """
    shape = tuple(int(s) for s in axis_shapes)
    names = tuple(axis_names)
    if len(shape) != len(names):
        raise ValueError(f"make_mesh: {len(shape)} axis sizes {shape} but {len(names)} names {names!r}.")
    if len(set(names)) != len(names):
        raise ValueError(f"make_mesh: axis names must be unique, got {names!r} (JAX 0.10 silently merges them).")
    pool = list(devices) if devices is not None else _devices.devices()
    need = math.prod(shape)
    if need > len(pool):
        raise ValueError(f"make_mesh: a mesh of shape {shape} needs {need} devices, but only {len(pool)} are "
                         f"available. Use fewer, or more virtual devices: {_devices.more_devices_hint(need)}.")
    return Mesh(np.array(pool[:need], dtype=object).reshape(shape), names)


def _dims(spec, ndim: int, mesh_names: Sequence, what: str) -> tuple:
    """``spec`` as one tuple of mesh axis names per dimension of a rank-``ndim`` array, checked."""
    if spec is None:
        raise ValueError(f"shard_map: pytree structure error: {what} is None where the value has an array; give "
                         f"a PartitionSpec (P() for replicated).")
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"shard_map: {what} must be a PartitionSpec (P(...)), got {spec!r}.")
    if len(spec) > ndim:
        raise ValueError(f"shard_map: {what} {spec} has {len(spec)} entries, but the array has rank {ndim}. A spec "
                         f"names at most one entry per dimension.")
    dims, used = [], []
    for part in tuple(spec) + (None,) * (ndim - len(spec)):
        names = () if part is None else part if isinstance(part, tuple) else (part,)
        for name in names:
            if name not in mesh_names:
                raise ValueError(f"shard_map: {what} {spec} names the axis {name!r}, which is not a mesh axis "
                                 f"(the mesh axes are {tuple(mesh_names)!r}).")
            if name in used:
                raise ValueError(f"shard_map: {what} {spec} uses the mesh axis {name!r} twice; each mesh axis may "
                                 f"split at most one dimension, once.")
            used.append(name)
        dims.append(tuple(names))
    return tuple(dims)


def _check_divisible(shape, dims, axes, what: str, spec) -> None:
    sizes = dict(axes)
    for d, names in enumerate(dims):
        count = math.prod(sizes[n] for n in names)
        if shape[d] % count:
            raise ValueError(f"shard_map: {what} has shape {tuple(shape)}, and its spec {spec} splits dimension {d} "
                             f"over {names} ({count} blocks), but {shape[d]} is not divisible by {count}.")


def _is_spec(x) -> bool:
    """A leaf of an in_specs/out_specs tree: a PartitionSpec, or anything that is not a container (checked
    to be a PartitionSpec when used)."""
    return isinstance(x, PartitionSpec) or _tree.is_prefix_leaf(x)


def shard_map(f: Callable, *, mesh: Mesh, in_specs, out_specs, check_vma: bool = True,
              axis_names: frozenset = frozenset()) -> Callable:
    """Map ``f`` over the devices of ``mesh``, each running on its own blocks; mirrors ``jax.shard_map``.

    Args:
      f: the per-device function; its arguments are the blocks of the inputs, its outputs the blocks of the
        outputs. It may call :mod:`spmdsim.lax` collectives over any (manual) mesh axis or tuple of axes.
      mesh: a :class:`Mesh`.
      in_specs: a PartitionSpec, or a tree prefix of the tuple of arguments with PartitionSpec leaves.
      out_specs: a PartitionSpec, or a tree prefix of the output.
      check_vma: True (default): an output whose spec replicates it along some mesh axes must be equal on the
        devices along them (checked by value; JAX checks it by type, when tracing); False: the block of the
        device at coordinate 0 along them is returned unchecked, as in JAX.
      axis_names: the mesh axes ``f`` is manual over (default: all). ``f`` runs once per coordinate of those
        axes; specs and collectives may name only them; values are whole along the others.

    Returns:
      A function returning NumPy arrays in ``f``'s output tree, each of the global shape its spec gives.

    Raises:
      ValueError: a spec naming an axis that is not a (manual) mesh axis, or one axis twice; a spec longer
        than its array's rank; a dimension not divisible by its axes' sizes; in_specs/out_specs that are not
        tree prefixes; with ``check_vma``, a replicated output that differs between devices (naming them).
      TypeError: a non-PartitionSpec spec leaf; a non-numeric argument. Any exception a device raises (the
        first in device order, the others in ``exc.device_errors``); CollectiveMismatchError /
        CollectiveDeadlockError when the devices' collectives cannot meet.

    >>> import numpy as np, spmdsim
    >>> mesh = spmdsim.make_mesh((4,), ('x',))
    >>> f = spmdsim.shard_map(lambda b: spmdsim.lax.psum(b, 'x'), mesh=mesh, in_specs=spmdsim.P('x'),
    ...                       out_specs=spmdsim.P())
    >>> f(np.arange(8.0))
    array([12., 16.])
    """
    if not isinstance(axis_names, (set, frozenset)):
        raise TypeError(f"`axis_names` argument of shard_map should be of type `frozenset` or `set`. Got type: "
                        f"{type(axis_names)}")
    if mesh is not None and _context.mesh is not None:
        raise ValueError(f"shard_map: a shard_map inside another must use the context mesh (mesh=None, with "
                         f"axis_names for the axes it maps over), got {mesh!r} inside {_context.mesh!r} (as JAX).")
    if mesh is None:
        mesh = _context.mesh
        if mesh is None:
            raise ValueError("shard_map: mesh=None means the context mesh (the enclosing shard_map's), but there "
                             "is none here. Pass mesh=spmdsim.make_mesh(...).")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"shard_map: mesh must be a spmdsim.Mesh (spmdsim.make_mesh(...)), got {type(mesh).__name__}.")
    unknown = set(axis_names) - set(mesh.axis_names)
    if unknown:
        raise ValueError(f"shard_map: axis_names {sorted(map(str, unknown))} are not mesh axes {mesh.axis_names!r}.")
    enclosing = _manual_axes()
    manual = tuple(n for n in mesh.axis_names if (not axis_names or n in axis_names) and n not in enclosing)
    axes = tuple((n, mesh.shape[n]) for n in manual)

    @_runtime.api_boundary
    @functools.wraps(f)
    def mapped(*args):
        # In a multi-host run each host passes, and gets back, its process-local data: the part of each global
        # array its devices hold, laid over its box of the mesh (the same names, smaller extents).
        local = _hosts.local_mesh(axes, "shard_map's mesh") if _runtime.current_lane() is None else axes
        in_spec_leaves = _tree.broadcast_prefix(in_specs, args, name="shard_map in_specs", is_prefix_leaf=_is_spec,
                                                hint=" in_specs must be a PartitionSpec or a tree prefix of the "
                                                     "tuple of arguments.")
        leaves, treedef = _tree.flatten(args)
        stacked = []
        for k, (leaf, spec) in enumerate(zip(leaves, in_spec_leaves, strict=True)):
            if spec is None:  # JAX: a None in_spec makes the argument static, passed to every device as it is
                stacked.append(_Static(leaf))
                continue
            arr = as_array(leaf, f"argument leaf {k}", "shard_map")
            dims = _dims(spec, arr.ndim, manual, f"in_specs for argument leaf {k}")
            _check_divisible(arr.shape, dims, local, f"argument leaf {k}", spec)
            blocks = _sharding.split(arr, dims, local)
            blocks.flags.writeable = False
            stacked.append(blocks)

        def body(i: int):
            previous, _context.mesh = _context.mesh, mesh
            blocks = [b.value if type(b) is _Static else b[i] for b in stacked]
            try:
                return f(*_tree.unflatten(treedef, blocks))
            except ValueError as e:  # a write into a read-only block or result: the message says which
                explain_read_only(e, blocks, "device")
                raise
            finally:
                _context.mesh = previous

        outputs = _runtime.run_mapped(body, axes, is_device=True, name=_runtime.function_name(f))
        return _assemble(outputs, out_specs, local, manual, check_vma, axes)

    return mapped


class _Static:
    """An argument whose in_spec is None: every device gets it as it is."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _Context(threading.local):
    """The mesh of the shard_map a device thread runs in (``mesh=None`` in a nested shard_map means it)."""

    mesh: Mesh | None = None


_context = _Context()


def _manual_axes() -> set:
    """The mesh axes the enclosing maps already made manual (a nested shard_map maps over the others)."""
    lane = _runtime.current_lane()
    return {f.name for f in lane.frames} if lane is not None else set()


def _assemble(outputs: list, out_specs, axes, manual, check_vma: bool, mesh_axes):
    """The outputs (this host's part of them, laid over its box ``axes`` of the mesh ``mesh_axes``)."""
    first, treedef = _tree.flatten(outputs[0])
    spec_leaves = _tree.broadcast_prefix(out_specs, outputs[0], name="shard_map out_specs", is_prefix_leaf=_is_spec,
                                         hint=" out_specs must be a PartitionSpec or a tree prefix of the output.")
    per_device = [first] + [_tree.flatten(o)[0] for o in outputs[1:]]
    result = []
    for k, spec in enumerate(spec_leaves):
        blocks = [as_array(leaves[k], f"output leaf {k}", "shard_map") for leaves in per_device]
        if any(b.shape != blocks[0].shape or b.dtype != blocks[0].dtype for b in blocks):
            raise ValueError(f"shard_map: output leaf {k} has different shapes or dtypes on different devices "
                             f"({sorted({f'{b.dtype}{list(b.shape)}' for b in blocks})}); every device must return "
                             f"blocks of one shape and dtype.")
        dims = _dims(spec, blocks[0].ndim, manual, f"out_specs for output leaf {k}")
        stacked = np.stack(blocks)
        if check_vma:
            differ = _sharding.replicas_differ(stacked, dims, axes)
            if differ:
                raise ValueError(
                    f"shard_map: out_specs {spec} for output leaf {k} says it is replicated along mesh axes "
                    f"{[n for n, _ in axes if n not in {m for d in dims for m in d}]}, but the devices hold "
                    f"different values: {', '.join(_label(d, mesh_axes) for d in differ[:8])}"
                    f"{' ...' if len(differ) > 8 else ''} differ from the device at coordinate 0. Reduce it first "
                    f"(psum/pmean/all_gather over those axes), name them in the spec, or pass check_vma=False to "
                    f"take coordinate 0's block unchecked.")
        result.append(_sharding.assemble(stacked, dims, axes))
    return _tree.unflatten(treedef, result)


def _label(device: int, axes) -> str:
    """The label of this host's ``device``-th device of the mesh ``axes`` (with several hosts, the devices of
    this host are its box of the mesh, a run of global devices)."""
    host = _hosts.current()
    device += 0 if host is None else host.devices.start
    coords = np.unravel_index(device, [s for _, s in axes])
    return frames_label([Frame(n, s, int(c), (), True) for (n, s), c in zip(axes, coords, strict=True)])
