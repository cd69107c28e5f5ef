"""A ``shard_map`` equation's PartitionSpecs and parameters as spmdsim's map reads them (``spmdsim_map``'s
parameters: the manual mesh axes, the body, one tuple of mesh axis names per dimension of each block)."""
from __future__ import annotations

from jax.extend import core as ext_core

from spmdsim.jax.integration._map import map_params
from spmdsim.jax.evaluation._unreduced import make_spec


def _spec_dims(spec, ndim: int) -> tuple:
    """A ``PartitionSpec`` as one tuple of mesh axis names per dimension (``()``: not split). ValueError for a
    mesh axis named twice (JAX's ``DuplicateSpecError``, raised only when XLA runs the program). A spec with
    ``unreduced``/``reduced`` mesh axes is a :class:`._unreduced.Spec` (the same tuple, with those sets)."""
    parts = tuple(getattr(spec, "partitions", spec))
    parts = parts + (None,) * (ndim - len(parts))
    dims = tuple(() if p is None else tuple(p) if isinstance(p, tuple) else (p,) for p in parts)
    names = [n for d in dims for n in d]
    if len(set(names)) != len(names):
        raise ValueError(f"A single NamedSharding spec specification can map every mesh axis to at most one "
                         f"positional dimension, but {spec} has duplicate entries.")
    unreduced, reduced = getattr(spec, "unreduced", frozenset()), getattr(spec, "reduced", frozenset())
    return make_spec(dims, unreduced, reduced)


def shard_map_params(params: dict, executor: str) -> dict:
    """A ``shard_map`` equation's parameters as ``spmdsim_map``'s: the newly manual mesh axes (in mesh order),
    the body, the specs per dimension (a block has its global value's rank)."""
    mesh = params["mesh"]
    if len(set(mesh.axis_names)) != len(mesh.axis_names):
        raise ValueError(f"The mesh {mesh} has duplicate axis names {mesh.axis_names}: a mesh axis can map at most "
                         f"one positional dimension, once (JAX raises DuplicateSpecError when it runs the program).")
    manual = params.get("newly_manual_axes", frozenset(mesh.axis_names))
    axes = tuple((name, size) for name, size in mesh.shape.items() if name in manual)
    body = params["jaxpr"]
    closed = body if hasattr(body, "consts") else ext_core.ClosedJaxpr(body, ())
    in_specs = tuple(_spec_dims(s, len(a.shape)) for s, a in zip(params["in_specs"], closed.in_avals, strict=True))
    out_specs = tuple(_spec_dims(s, len(a.shape)) for s, a in zip(params["out_specs"], closed.out_avals,
                                                                  strict=True))
    return map_params(closed, axes, in_specs, out_specs, check_vma=params["check_vma"], executor=executor,
                      api="shard_map", mesh=mesh)
