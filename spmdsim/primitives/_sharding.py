"""How a global array is laid over a mesh of devices, and put back together: the ``PartitionSpec`` algebra of
``jax.shard_map``, on NumPy arrays.

A mesh is a tuple of ``(name, size)`` axes; its devices are numbered row-major over them. A *spec* says, for
every dimension of an array, which mesh axes split it: a tuple of names per dimension (empty: not split). A
dimension split over ``('x', 'y')`` is cut into ``size(x) * size(y)`` equal blocks, numbered row-major in the
order named (``x`` major). Mesh axes a spec does not mention replicate the array along them. (``pmap`` is the
one-axis case: ``in_axes=k`` splits dimension k over the axis, into blocks of size 1.)

Blocks travel *stacked*: one array with every device's block on a leading axis, in device order.
"""
from __future__ import annotations

import math
from typing import Hashable, Sequence

import numpy as np

__all__ = ["Axes", "Spec", "split", "assemble", "replicas_differ", "block_shape", "global_shape"]

Axes = tuple[tuple[Hashable, int], ...]   # the mesh: (name, size) per axis, row-major
Spec = tuple[tuple[Hashable, ...], ...]    # per dimension, the mesh axes splitting it


def _sizes(axes: Axes) -> dict:
    return dict(axes)


def block_shape(shape: Sequence[int], spec: Spec, axes: Axes) -> tuple[int, ...]:
    """The shape of one device's block of an array of ``shape`` laid out by ``spec`` (dimensions must divide)."""
    sizes = _sizes(axes)
    return tuple(d // math.prod(sizes[n] for n in names) for d, names in zip(shape, spec, strict=True))


def global_shape(shape: Sequence[int], spec: Spec, axes: Axes) -> tuple[int, ...]:
    """The global shape assembled from blocks of ``shape`` by ``spec``."""
    sizes = _sizes(axes)
    return tuple(d * math.prod(sizes[n] for n in names) for d, names in zip(shape, spec, strict=True))


def split(x: np.ndarray, spec: Spec, axes: Axes) -> np.ndarray:
    """Every device's block of ``x``, stacked: shape ``(devices, *block_shape)``, in row-major device order.
    A view of ``x`` where the layout allows, a copy otherwise."""
    sizes = _sizes(axes)
    names = [n for n, _ in axes]
    # Cut every split dimension d into (size of each naming axis..., block): the mesh parts come first.
    cut_shape, mesh_part, block_part = [], {}, []
    for d, dim_names in enumerate(spec):
        for n in dim_names:
            mesh_part[n] = len(cut_shape)
            cut_shape.append(sizes[n])
        block_part.append(len(cut_shape))
        cut_shape.append(x.shape[d] // math.prod(sizes[n] for n in dim_names))
    unmentioned = [n for n in names if n not in mesh_part]  # replicated along these: broadcast
    for k, n in enumerate(unmentioned):
        mesh_part[n] = len(cut_shape) + k
    cut = np.broadcast_to(x.reshape(cut_shape + [1] * len(unmentioned)),
                          (*cut_shape, *(sizes[n] for n in unmentioned)))
    stacked = np.transpose(cut, [mesh_part[n] for n in names] + block_part)
    return stacked.reshape(math.prod(sizes.values()) if axes else 1, *stacked.shape[len(names):])


def assemble(stacked: np.ndarray, spec: Spec, axes: Axes) -> np.ndarray:
    """The global array from every device's block (``stacked``: shape ``(devices, *block)``), the inverse of
    :func:`split`. Mesh axes the spec does not mention contribute the block of coordinate 0 along them."""
    names = [n for n, _ in axes]
    sizes = [s for _, s in axes]
    grid = stacked.reshape(*sizes, *stacked.shape[1:])
    mentioned = {n for dim_names in spec for n in dim_names}
    grid = grid[tuple(slice(None) if n in mentioned else 0 for n in names)]
    kept = [n for n in names if n in mentioned]
    position = {n: k for k, n in enumerate(kept)}
    block_dims = len(spec)
    order, shape = [], []
    for d, dim_names in enumerate(spec):
        order += [position[n] for n in dim_names] + [len(kept) + d]
        shape.append(stacked.shape[1 + d] * math.prod(dict(axes)[n] for n in dim_names))
    assert len(order) == len(kept) + block_dims
    return np.transpose(grid, order).reshape(shape)


def replicas_differ(stacked: np.ndarray, spec: Spec, axes: Axes) -> list[int]:
    """The devices whose block differs from the block at coordinate 0 along the mesh axes ``spec`` does not
    mention (the axes an output is replicated along). NaNs compare equal to NaNs."""
    sizes = [s for _, s in axes]
    mentioned = {n for dim_names in spec for n in dim_names}
    grid = stacked.reshape(*sizes, *stacked.shape[1:])
    reference = grid[tuple(slice(None) if n in mentioned else slice(0, 1) for n, _ in axes)]
    equal_nan = stacked.dtype.kind in "fc"
    same = (grid == reference) | (np.isnan(grid) & np.isnan(reference) if equal_nan else False)
    same = same.reshape(*sizes, -1).all(axis=-1) if stacked.ndim > 1 else same
    return [int(d) for d in np.flatnonzero(~same.reshape(-1))]
