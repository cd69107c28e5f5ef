"""The documented semantics of shard_map layouts and collectives as plain NumPy, per device.

A written-down specification, checked against real JAX by ``conformance/shard_map_real_jax_check.py``: the
cases whose ``expected`` is computed here must agree with XLA's results exactly (and, for ragged_all_to_all,
psend/precv and pbroadcast, which XLA:CPU cannot run, it is the result a simulator should give). Not used by
spmdsim itself.

Conventions (verified on jax 0.10.2, see docs/notes/shard_map_jax_0_10_2.md):

* Devices are numbered row-major over the mesh axes in mesh order; device ``d`` has coordinates
  ``coords[d]``.
* A PartitionSpec entry naming axes ``(a, b)`` splits that array dimension into ``size(a) * size(b)``
  blocks; device ``d`` takes block ``idx(a) * size(b) + idx(b)``: the FIRST listed axis is major. Axes the
  spec does not mention: every device along them gets the same block (replicated).
* Output assembly is the inverse; along an axis the spec does not mention, the block of the device at
  index 0 of that axis is used (check_vma=False leaves this unchecked).
* A collective over ``axes`` (a name or a tuple) acts within groups of devices that agree on every other
  mesh axis. A device's rank in its group is row-major over ``axes`` **in the order given**, for
  axis_index, all_gather, psum_scatter, all_to_all, axis_index_groups and pbroadcast; **ppermute and
  pshuffle use the mesh order of the axes instead**, whatever the order given.
"""
from __future__ import annotations

import itertools
import math

import numpy as np


class MeshModel:
    def __init__(self, shape, names):
        self.shape, self.names = tuple(shape), tuple(names)
        self.sizes = dict(zip(self.names, self.shape))
        self.coords = list(itertools.product(*[range(s) for s in self.shape]))

    @property
    def n(self) -> int:
        return len(self.coords)

    def index(self, d, axis) -> int:
        return self.coords[d][self.names.index(axis)]

    def rank(self, d, axes) -> int:
        r = 0
        for a in axes:
            r = r * self.sizes[a] + self.index(d, a)
        return r

    def group(self, d, axes) -> list:
        """The devices sharing d's coordinates on every axis not in ``axes``, ordered by rank over ``axes``."""
        others = [a for a in self.names if a not in axes]
        members = [e for e in range(self.n) if all(self.index(e, a) == self.index(d, a) for a in others)]
        return sorted(members, key=lambda e: self.rank(e, axes))

    def mesh_order(self, axes) -> tuple:
        return tuple(a for a in self.names if a in axes)


def _axes(axes) -> tuple:
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def _entry_axes(entry) -> tuple:
    return () if entry is None else _axes(entry)


def split(x, mesh: MeshModel, spec) -> list:
    """The block of the global array ``x`` each device sees under ``spec`` (a tuple of entries)."""
    x = np.asarray(x)
    blocks = []
    for d in range(mesh.n):
        index = []
        for dim, entry in enumerate(spec):
            axes = _entry_axes(entry)
            parts = math.prod(mesh.sizes[a] for a in axes)
            size = x.shape[dim] // parts
            k = mesh.rank(d, axes)
            index.append(slice(k * size, (k + 1) * size))
        blocks.append(x[tuple(index)])
    return blocks


def assemble(blocks, mesh: MeshModel, spec):
    """The global array out_specs ``spec`` builds from per-device ``blocks`` (index 0 of unmentioned axes)."""
    mentioned = {a for entry in spec for a in _entry_axes(entry)}
    block = np.asarray(blocks[0])
    shape = list(block.shape)
    for dim, entry in enumerate(spec):
        shape[dim] *= math.prod(mesh.sizes[a] for a in _entry_axes(entry))
    out = np.empty(shape, block.dtype)
    for d in range(mesh.n):
        if any(mesh.index(d, a) != 0 for a in mesh.names if a not in mentioned):
            continue
        index = []
        for dim in range(block.ndim):
            entry = spec[dim] if dim < len(spec) else None
            k = mesh.rank(d, _entry_axes(entry))
            index.append(slice(k * block.shape[dim], (k + 1) * block.shape[dim]))
        out[tuple(index)] = blocks[d]
    return out


def _sum(values):
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


def collective(op, blocks, mesh: MeshModel, axes, **params) -> list:
    """Apply one collective to the per-device ``blocks``; returns the per-device results."""
    axes = _axes(axes)
    groups = params.pop("axis_index_groups", None)
    out = []
    for d in range(mesh.n):
        order = mesh.mesh_order(axes) if op in ("ppermute", "pshuffle") else axes
        group = mesh.group(d, order)
        r, n = mesh.rank(d, order), len(group)
        if groups is not None:
            # axis_index_groups index the ranks over ``axes`` (given order); the rank within a sub-group is
            # the position in its list. pmean divides by len(groups[0]) for every group (a JAX quirk).
            sub = next(g for g in groups if r in g)
            group, r, n = [group[i] for i in sub], list(sub).index(r), len(sub)
        values = [np.asarray(blocks[e]) for e in group]
        if op in ("psum", "pmean"):
            v = _sum([x.astype(np.int32) if x.dtype == bool else x for x in values])
            if op == "pmean":
                n_div = len(groups[0]) if groups is not None else n
                v = ((v / n_div).astype(np.float32) if v.dtype.kind in "biu"
                     else (v / np.asarray(n_div, v.dtype)).astype(v.dtype))
        elif op == "pmax":
            v = np.maximum.reduce(values)
        elif op == "pmin":
            v = np.minimum.reduce(values)
        elif op == "axis_index":
            v = np.int32(r)
        elif op == "axis_size":
            v = n
        elif op == "all_gather":
            axis = params.get("axis", 0)
            v = np.concatenate(values, axis=axis) if params.get("tiled") else np.stack(values, axis=axis)
        elif op == "psum_scatter":
            total, dim = _sum(values), params.get("scatter_dimension", 0)
            v = np.split(total, n, axis=dim)[r] if params.get("tiled") else np.take(total, r, axis=dim)
        elif op == "all_to_all":
            s, c = params["split_axis"], params["concat_axis"]
            if params.get("tiled"):
                v = np.concatenate([np.split(x, n, axis=s)[r] for x in values], axis=c)
            else:
                v = np.stack([np.take(x, r, axis=s) for x in values], axis=c)
        elif op == "ppermute":
            sources = [src for src, dst in params["perm"] if dst % n == r]
            v = values[sources[0]] if sources else np.zeros_like(values[r])
        elif op == "pshuffle":
            perm = params["perm"]
            v = values[perm[r]] if r < len(perm) else np.zeros_like(values[r])
        elif op == "pbroadcast":
            v = values[params["source"]]
        else:
            raise ValueError(f"unknown collective {op}")
        out.append(v)
    return out


def ragged_all_to_all(operands, outputs, input_offsets, send_sizes, output_offsets, recv_sizes) -> list:
    """Per-device results of ``ragged_all_to_all`` over one group (device d = index d of each list): sender
    d's slice i, ``operand[d][input_offsets[d][i] : + send_sizes[d][i]]``, goes to the device of rank
    ``i // (K / N)`` and is written there at ``output_offsets[d][i]`` (the SENDER's offsets say where it
    lands); every other element of a device's ``output`` keeps its value. ``recv_sizes`` must equal the
    tiled all_to_all of ``send_sizes`` and is not needed to compute the result."""
    n, k = len(operands), len(input_offsets[0])
    per = k // n
    results = [np.array(o, copy=True) for o in outputs]
    for d in range(n):
        for i in range(k):
            lo, size, at = int(input_offsets[d][i]), int(send_sizes[d][i]), int(output_offsets[d][i])
            results[i // per][at:at + size] = np.asarray(operands[d])[lo:lo + size]
    return results
