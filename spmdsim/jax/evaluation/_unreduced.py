"""PartitionSpecs with ``unreduced`` / ``reduced`` mesh axes (JAX 0.10's partial sums across devices).

- ``reduced={'x'}``: the value is replicated over ``x`` (forward, like ``P()``); its cotangent is unreduced over
  ``x`` (a shard_map's transpose swaps the two: ``PartitionSpec.to_ct_spec``).
- ``unreduced={'x'}``: each device along ``x`` holds a partial value; the logical value is their sum, which JAX
  computes when the value is resharded to a spec without ``x`` (an all-reduce in rank order, as spmdsim's
  ``psum``), or a collective inside a map (``psum``, ``psum_scatter`` of an unreduced value).

In spmdsim a map's spec is its per-dimension tuple of mesh axis names; a spec with such axes is a
:class:`Spec` (that tuple, with ``unreduced`` and ``reduced`` sets). Outside a map a value unreduced over some
mesh axes is an :class:`Unreduced`: the partials, stacked on a leading axis (row-major over the unreduced
axes in mesh order), each of the global shape. A map runs such specs as a plain map of a body that takes and
returns the partials stacked on a leading dimension split over the unreduced axes (:func:`partials_body`).
The equations JAX applies to unreduced values outside maps (``reshard``, ``add``, ``mul`` by a replicated
value, shape changes, ``reduce_sum``/``dot_general`` into unreduced, ``jit`` calls) are evaluated here
(:func:`apply`), partial by partial, as each device does in XLA.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from spmdsim.jax._internals import weakref_lru_cache

__all__ = ["Spec", "Unreduced", "spec_unreduced", "spec_reduced", "partition_spec", "ct_spec", "apply",
           "involved", "from_jax", "to_jax", "total"]


class Spec(tuple):
    """A map's spec (one tuple of mesh axis names per dimension) with ``unreduced`` / ``reduced`` mesh axes.
    Equal and hashed with them; ``spec + ...`` and ``... + spec`` keep them (the batching and key-data
    specs add dimensions); a plain tuple is a spec with neither."""

    def __new__(cls, dims, unreduced=frozenset(), reduced=frozenset()):
        self = super().__new__(cls, dims)
        self.unreduced, self.reduced = frozenset(unreduced), frozenset(reduced)
        return self

    def _key(self):
        return tuple(self), self.unreduced, self.reduced

    def __eq__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return self._key() == (tuple(other), spec_unreduced(other), spec_reduced(other))

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(self._key())

    def __add__(self, other):
        return Spec(tuple(self) + tuple(other), self.unreduced, self.reduced)

    def __radd__(self, other):
        return Spec(tuple(other) + tuple(self), self.unreduced, self.reduced)

    def __reduce__(self):
        return Spec, (tuple(self), self.unreduced, self.reduced)

    def __repr__(self):
        return f"Spec({tuple(self)!r}, unreduced={set(self.unreduced) or '{}'}, reduced={set(self.reduced) or '{}'})"


def spec_unreduced(spec) -> frozenset:
    return getattr(spec, "unreduced", frozenset())


def spec_reduced(spec) -> frozenset:
    return getattr(spec, "reduced", frozenset())


def make_spec(dims: tuple, unreduced, reduced):
    """``dims`` as a :class:`Spec` when it has unreduced or reduced axes, else the plain tuple."""
    return Spec(dims, unreduced, reduced) if unreduced or reduced else tuple(dims)


def ct_spec(spec):
    """The spec of a cotangent: unreduced and reduced swapped (JAX's ``PartitionSpec.to_ct_spec``)."""
    if not isinstance(spec, Spec):
        return spec
    return make_spec(tuple(spec), spec.reduced, spec.unreduced)


def partition_spec(dims, name=lambda n: n):
    """A spec as JAX's ``PartitionSpec``, with its unreduced and reduced axes: trailing unsplit dimensions dropped,
    except in a spec with unreduced or reduced axes, which JAX writes out in full (``P(None, unreduced={'x'})``,
    as JAX derives it from the value's type)."""
    import jax
    parts = [None if not names else name(names[0]) if len(names) == 1 else tuple(map(name, names))
             for names in dims]
    while parts and parts[-1] is None and not (spec_unreduced(dims) or spec_reduced(dims)):
        parts.pop()
    return jax.sharding.PartitionSpec(*parts, unreduced=frozenset(map(name, spec_unreduced(dims))),
                                      reduced=frozenset(map(name, spec_reduced(dims))))


class Unreduced:
    """A value unreduced over mesh ``axes`` ((name, size) pairs, mesh order) outside a map: ``partials[p]`` is
    the global array of the partials of the devices at coordinate ``p`` along those axes (row-major)."""

    __slots__ = ("partials", "axes")

    def __init__(self, partials: np.ndarray, axes: tuple):
        self.partials, self.axes = partials, tuple(axes)
        assert partials.shape[0] == math.prod(size for _, size in axes), (partials.shape, axes)

    @property
    def shape(self):
        return self.partials.shape[1:]

    @property
    def dtype(self):
        return self.partials.dtype

    @property
    def ndim(self):
        return self.partials.ndim - 1

    @property
    def names(self) -> frozenset:
        return frozenset(name for name, _ in self.axes)

    def __repr__(self):
        return f"Unreduced({self.partials!r}, axes={self.axes})"


def total(x):
    """The logical value: the partials summed in rank order (XLA:CPU's all-reduce); anything else as it is."""
    if not isinstance(x, Unreduced):
        return x
    from spmdsim.primitives._reduction import fold
    return np.asarray(fold(np.add, list(x.partials)))


def promote(x, axes: tuple) -> np.ndarray:
    """The partials over ``axes`` of ``x``: an unreduced value's own; a plain value's as JAX makes them (the value
    at coordinate 0, zeros elsewhere: ``jax.reshard(x, P(unreduced=...))``)."""
    if isinstance(x, Unreduced):
        if x.axes == tuple(axes):
            return x.partials
        x = total(x)
    x = np.asarray(x)
    out = np.zeros((math.prod(size for _, size in axes), *x.shape), x.dtype)
    out[0] = x
    return out


# -- JAX arrays -------------------------------------------------------------------------------------------

def _mesh_axes(mesh, names) -> tuple:
    return tuple((name, size) for name, size in mesh.shape.items() if name in names)


def _coordinate(mesh, device, axes: tuple) -> int:
    """The row-major index along ``axes`` of ``device``'s position in ``mesh``."""
    where = np.argwhere(mesh.devices == device)[0]
    names = list(mesh.axis_names)
    return int(np.ravel_multi_index([where[names.index(n)] for n, _ in axes], [s for _, s in axes])) if axes else 0


def sharding_axes(sharding) -> tuple:
    """The (name, size) pairs of the mesh axes a NamedSharding is unreduced over, in mesh order."""
    return _mesh_axes(sharding.mesh, sharding.spec.unreduced)


def has_unreduced(x) -> bool:
    """Whether ``x`` (a NamedSharding, or a value with one) names unreduced axes."""
    spec = getattr(x if hasattr(x, "spec") else getattr(x, "sharding", None), "spec", None)
    return bool(getattr(spec, "unreduced", None))


def from_jax(x, convert) -> Unreduced:
    """A ``jax.Array`` with an unreduced NamedSharding as an :class:`Unreduced` (every device's buffer read;
    ``convert``: a buffer as spmdsim's NumPy value)."""
    import jax
    sharding = x.sharding
    mesh, spec = sharding.mesh, sharding.spec
    axes = _mesh_axes(mesh, spec.unreduced)
    plain = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec.partitions))
    indices = plain.devices_indices_map(x.shape)
    partials = None
    for shard in x.addressable_shards:
        data = convert(shard.data)
        if partials is None:
            partials = np.zeros((math.prod(s for _, s in axes), *x.shape), data.dtype)
        partials[_coordinate(mesh, shard.device, axes)][indices[shard.device]] = data
    return Unreduced(partials, axes)


def to_jax(x: Unreduced, aval, sharding):
    """An :class:`Unreduced` as the ``jax.Array`` JAX hands back for it (each device's buffer its partial's
    block); summed first where ``sharding`` names no unreduced axes (None when it does not apply)."""
    import jax
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    if spec is None or not isinstance(mesh, jax.sharding.Mesh) or frozenset(spec.unreduced) != x.names:
        return None
    plain = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec.partitions))
    indices = plain.devices_indices_map(x.shape)
    dtype = jax.dtypes.canonicalize_dtype(x.dtype)
    buffers = [jax.device_put(np.asarray(x.partials[_coordinate(mesh, d, x.axes)][indices[d]], dtype), d)
               for d in sharding._addressable_device_assignment]
    return jax.make_array_from_single_device_arrays(tuple(x.shape), sharding, buffers)


# -- a map with unreduced specs: partials stacked on a leading dimension -----------------------------------

def partials_axes(spec, axes: tuple) -> tuple:
    return tuple((name, size) for name, size in axes if name in spec_unreduced(spec))


def map_needs_partials(in_specs, out_specs) -> bool:
    return any(spec_unreduced(s) for s in (*in_specs, *out_specs))


def partials_spec(spec, axes: tuple) -> tuple:
    """The plain spec of the stacked partials: a leading dimension split over the unreduced axes."""
    return (tuple(name for name, _ in partials_axes(spec, axes)),) + tuple(spec)


def partials_body(jaxpr, in_specs: tuple, out_specs: tuple, axes: tuple, trace):
    """The body of the plain map that runs a map with unreduced specs: each unreduced input and output with a
    leading unit dimension (its block of the stacked partials); ``trace(fun, avals)`` traces it as the map's
    body is traced."""
    import jax
    ins = [bool(spec_unreduced(s)) for s in in_specs]
    outs = [bool(spec_unreduced(s)) for s in out_specs]

    def fun(*args):
        from spmdsim.jax._internals import core
        args = [jax.lax.squeeze(a, (0,)) if u else a for a, u in zip(args, ins, strict=True)]
        results = core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *args)
        return [jax.lax.expand_dims(r, (0,)) if u else r for r, u in zip(results, outs, strict=True)]

    avals = [a.update(shape=(1, *a.shape)) if u else a for a, u in zip(jaxpr.in_avals, ins, strict=True)]
    body = trace(fun, avals)
    return (body, tuple(partials_spec(s, axes) if u else tuple(s) for s, u in zip(in_specs, ins, strict=True)),
            tuple(partials_spec(s, axes) if u else tuple(s) for s, u in zip(out_specs, outs, strict=True)))


# -- equations on unreduced values outside maps -------------------------------------------------------------

_CALLS = ("pjit", "jit", "closed_call", "core_call", "call", "eval_jaxpr", "remat", "checkpoint", "custom_jvp_call",
          "custom_vjp_call", "custom_vjp_call_jaxpr")
# Applied to each partial: linear in the one unreduced operand, the others' values the same on every device.
_PER_PARTIAL = {"neg", "copy", "copy_p", "convert_element_type", "reshape", "broadcast_in_dim", "transpose", "squeeze",
                "expand_dims", "reduce_sum", "slice", "dynamic_slice", "rev", "pad", "real", "imag", "conj",
                "complex", "pvary", "pcast", "stop_gradient", "optimization_barrier", "gather", "cumsum",
                "reduce_precision", "select_n", "dot_general", "mul", "div", "symmetric_product"}
_ELEMENTWISE_SUM = {"add", "add_any", "sub", "concatenate", "dynamic_update_slice", "scatter-add", "scatter_add"}
_RESHARD = {"reshard", "sharding_constraint", "device_put", "mesh_cast"}


def _aval_unreduced(aval) -> frozenset:
    spec = getattr(getattr(aval, "sharding", None), "spec", None)
    return frozenset(getattr(spec, "unreduced", ()) or ())


def _aval_mesh_axes(aval, names) -> tuple:
    mesh = aval.sharding.mesh
    return tuple((name, size) for name, size in zip(mesh.axis_names, mesh.axis_sizes) if name in names)


@weakref_lru_cache  # held weakly: from JAX 0.11 a jaxpr holds its constants, which a strong cache keeps alive
def _jaxpr_involved(jaxpr) -> bool:
    from jax.extend import core as ext_core
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in ("shard_map", "spmdsim_map"):
            if any(spec_unreduced(s) or getattr(s, "unreduced", None) for s in eqn.params["out_specs"]):
                return True
            continue
        if any(_aval_unreduced(v.aval) for v in eqn.outvars):
            return True
        if any(_jaxpr_involved(getattr(sub, "jaxpr", sub)) for sub in ext_core.jaxprs_in_params(eqn.params)):
            return True
    return False


def involved(eqn, operands) -> bool:
    """Whether ``eqn`` (outside any map) is evaluated here: an operand is unreduced, its result's type is, or it
    calls a jaxpr where unreduced values appear."""
    if any(type(x) is Unreduced for x in operands):
        return True
    if any(_aval_unreduced(v.aval) for v in eqn.outvars) and eqn.primitive.name not in ("shard_map", "spmdsim_map"):
        return True
    if eqn.primitive.name in _CALLS:
        from jax.extend import core as ext_core
        return any(_jaxpr_involved(getattr(sub, "jaxpr", sub)) for sub in ext_core.jaxprs_in_params(eqn.params))
    return False


def apply(ex, eqn, operands: list, plain, eval_jaxpr):
    """The results of ``eqn`` (outside any map) on operands some of which are :class:`Unreduced`; ``plain(eqn,
    operands)``: the executor's own evaluation of it on plain values; ``eval_jaxpr``: the interpreter's reference
    loop, for the equations of a call (passed in: this module is below the interpreter, which imports it)."""
    name = eqn.primitive.name
    sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr")) if name in _CALLS else None
    if sub is not None:  # its equations through this loop too (the compiled form knows no unreduced values)
        inner, consts = (sub.jaxpr, sub.consts) if hasattr(sub, "consts") else (sub, ())
        outs = eval_jaxpr(inner, consts, *operands[:len(inner.invars)], executor=ex)
        return outs if eqn.primitive.multiple_results else outs[0]
    if name in ("shard_map", "spmdsim_map"):  # the map takes partials in (see partials_body)
        return plain(eqn, operands)
    out_u = [_aval_unreduced(v.aval) for v in eqn.outvars]
    unreduced = [x for x in operands if type(x) is Unreduced]
    if name in _RESHARD:
        named = eqn.params.get("dst_sharding", eqn.params.get("sharding"))
        if eqn.primitive.multiple_results or getattr(named, "spec", None) is None:
            named = None
        outs = [_reshard(x, named or v.aval.sharding) for x, v in zip(operands, eqn.outvars)]
        return outs if eqn.primitive.multiple_results else outs[0]
    if not unreduced:
        if any(out_u):  # a plain computation into an unreduced type: each device's contraction of its shards
            return _local(eqn, operands, out_u, plain)
        return plain(eqn, operands)
    axes = unreduced[0].axes
    if any(x.axes != axes for x in unreduced):
        raise NotImplementedError(f"spmdsim: {name} of values unreduced over different mesh axes "
                                  f"({[x.axes for x in unreduced]})")
    if name in _ELEMENTWISE_SUM or (name in _PER_PARTIAL and len(unreduced) == 1):
        per = [plain(eqn, [x.partials[p] if type(x) is Unreduced else x for x in operands])
               for p in range(unreduced[0].partials.shape[0])]
        if eqn.primitive.multiple_results:
            return [Unreduced(np.stack([np.asarray(o[k]) for o in per]), axes) for k in range(len(out_u))]
        return Unreduced(np.stack([np.asarray(o) for o in per]), axes)
    raise NotImplementedError(
        f"spmdsim does not evaluate {name} on values unreduced over mesh axes {sorted(unreduced[0].names)} outside "
        f"a map (JAX's type rules allow it); reshard the value to a spec without unreduced axes first.")


def _reshard(x, sharding):
    """``reshard``/``sharding_constraint`` to ``sharding``: summed where it names no unreduced axes, partials
    over those it names (a plain value's as :func:`promote` makes them)."""
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    target = frozenset(getattr(spec, "unreduced", ()) or ())
    if not target or mesh is None:
        return total(x)
    axes = tuple((name, size) for name, size in zip(mesh.axis_names, mesh.axis_sizes) if name in target)
    if isinstance(x, Unreduced) and x.names != frozenset(target):
        x = total(x)
    return Unreduced(promote(x, axes), axes)


def _local(eqn, operands, out_u, plain):
    """An equation of plain operands whose result is typed unreduced (``reduce_sum``/``dot_general`` with an
    unreduced ``out_sharding``): each device's result on its own shards of the operands, as partials over the
    result's unreduced axes (the operands' dimensions split over those axes are cut to the device's block)."""
    target = next(u for u in out_u if u)
    aval = next(v.aval for v, u in zip(eqn.outvars, out_u) if u)
    axes = _aval_mesh_axes(aval, target)
    sizes = [s for _, s in axes]
    per = []
    for coords in itertools.product(*(range(s) for s in sizes)):
        at = dict(zip((n for n, _ in axes), coords))
        local = []
        for x, v in zip(operands, eqn.invars):
            spec = getattr(getattr(v.aval, "sharding", None), "spec", None)
            if spec is None or isinstance(x, Unreduced):
                local.append(x)
                continue
            index = []
            for d, part in enumerate(tuple(spec.partitions) + (None,) * (np.ndim(x) - len(spec.partitions))):
                names = () if part is None else part if isinstance(part, tuple) else (part,)
                mine = [n for n in names if n in at]
                if not mine:
                    index.append(slice(None))
                    continue
                count = math.prod(dict(axes)[n] for n in mine)
                k = int(np.ravel_multi_index([at[n] for n in mine], [dict(axes)[n] for n in mine]))
                size = np.shape(x)[d] // count
                index.append(slice(k * size, (k + 1) * size))
            local.append(np.asarray(x)[tuple(index)])
        per.append(plain(eqn, local))
    if eqn.primitive.multiple_results:
        return [Unreduced(np.stack([np.asarray(o[k]) for o in per]), axes) if u else per[0][k]
                for k, u in enumerate(out_u)]
    return Unreduced(np.stack([np.asarray(o) for o in per]), axes)


# -- blocks of a value by a spec with unreduced axes (for an eager map's devices) -------------------------------

def split_blocks(x, spec, axes: tuple) -> np.ndarray:
    """Every device's block of ``x`` by ``spec`` (stacked, ``(devices, *block)``), as
    :func:`spmdsim.primitives._sharding.split` gives them, where a spec unreduced over some axes gives each device its
    partial (a plain ``x`` as JAX makes partials of it: see :func:`promote`; an :class:`Unreduced` ``x`` under a
    spec without unreduced axes: its sum)."""
    from spmdsim.primitives import _sharding
    if not spec_unreduced(spec):
        return _sharding.split(np.asarray(total(x)), tuple(spec), axes)
    stacked = promote(x, partials_axes(spec, axes))
    return _sharding.split(stacked, partials_spec(spec, axes), axes)[:, 0]


def assemble_blocks(stacked: np.ndarray, spec, axes: tuple):
    """The value of every device's block (``stacked``: ``(devices, *block)``) by ``spec``: an
    :class:`Unreduced` of the devices' partials where ``spec`` has unreduced axes (the inverse of
    :func:`split_blocks`)."""
    from spmdsim.primitives import _sharding
    if not spec_unreduced(spec):
        return _sharding.assemble(stacked, tuple(spec), axes)
    return Unreduced(_sharding.assemble(stacked[:, None], partials_spec(spec, axes), axes), partials_axes(spec, axes))
