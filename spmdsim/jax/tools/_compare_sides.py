"""The other sides of ``spmdsim compare`` (:mod:`spmdsim.jax.tools._compare`): an equation computed by XLA:CPU
(``jax.jit`` of its primitive), a sum over devices folded in another reduction order, an equation by the other
executor's rule, a whole map as a real jitted ``jax.shard_map``; and the runs of equations that XLA fuses, each
compiled as one program on spmdsim's recorded operands."""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from spmdsim.primitives import _primitives
from spmdsim.runtime import _runtime
from spmdsim.primitives._reduction import ReductionOrder
from spmdsim.jax.evaluation import _dtypes, _registry


# Primitives compared with nothing: collectives (below), tokens, side effects, and layout-only equations.
_COLLECTIVES = set(_primitives.PRIMITIVES) | {"psum_invariant", "all_gather_invariant", "axis_index", "precv",
                                              "pvary", "pbroadcast", "reshard"}
_NOT_COMPUTED = {"create_token", "after_all", "debug_print", "debug_callback", "pure_callback", "io_callback"}


# -- the other sides ---------------------------------------------------------------------------------------------

def _jax_jit():
    from spmdsim.jax._internals import jax_jit as jit
    return jit


def _jitted(eqn):
    """``jax.jit`` of ``eqn``'s primitive bound with its parameters (for ``xla_cpu_fma``: of the multiply and add
    it fused, which XLA fuses again), returning a list of results."""
    import jax
    jit = _jax_jit()
    prim, params = eqn.primitive, dict(eqn.params)
    if prim.name == "xla_cpu_fma":
        def fma(a, b, c):
            product = jax.lax.mul(a, b)
            if params["negate_product"]:
                return [jax.lax.sub(c, product)]
            return [jax.lax.sub(product, c) if params["negate_addend"] else jax.lax.add(product, c)]
        return jit(fma)
    if prim.multiple_results:
        return jit(lambda *a: list(prim.bind(*a, **params)))
    return jit(lambda *a: [prim.bind(*a, **params)])


def _folded_sums(eqn, operands: list, order: ReductionOrder, vectorized: bool) -> list | None:
    """Each operand of a ``psum`` equation summed over the devices of its group in ``order``, from every device's
    operand gathered by an all_gather over the same axes and groups; None for positional axes (a vmapped psum)."""
    axes = eqn.params["axes"]
    named, positional = _primitives.split_axis_names(axes)
    if positional or not named:
        return None
    out = []
    for x in operands:
        gathered = _primitives.bind("all_gather", [np.asarray(x)], axis_name=named, all_gather_dimension=0,
                                    tiled=False, axis_index_groups=eqn.params.get("axis_index_groups"))[0]
        if vectorized:
            blocks = [gathered[:, k] for k in range(gathered.shape[1])]
            out.append(order.fold(np.add, blocks, lead=1))
        else:
            out.append(order.fold(np.add, list(gathered)))
    return out


def _folded_scatter(eqn, operands: list, order: ReductionOrder, vectorized: bool) -> list | None:
    """A ``reduce_scatter`` (``psum_scatter``) equation's results, each operand summed over the devices of its group
    in ``order`` (from every device's operand, gathered as for ``psum``) and this device's slice of the sum taken:
    the r-th index (the r-th of equal chunks when ``tiled``) along ``scatter_dimension`` for the device of rank r
    in its group. Its rank is found by a ``reduce_scatter`` of ``arange(group size)`` from every device (exact, in
    integers): rank r receives ``group size * r``, with ``axis_index_groups`` honoured as the equation does."""
    params = eqn.params
    named, positional = _primitives.split_axis_names(params["axis_name"])
    if positional or not named:
        return None
    groups, dim, tiled = params.get("axis_index_groups"), params["scatter_dimension"], params["tiled"]
    totals, size = [], None
    for x in operands:
        gathered = _primitives.bind("all_gather", [np.asarray(x)], axis_name=named, all_gather_dimension=0,
                                    tiled=False, axis_index_groups=groups)[0]
        size = gathered.shape[1 if vectorized else 0]
        blocks = [gathered[:, k] for k in range(size)] if vectorized else list(gathered)
        totals.append(order.fold(np.add, blocks, lead=1 if vectorized else 0))
    if size is None:
        return []
    ranks = np.arange(size, dtype=np.int32)
    if vectorized:
        ranks = np.ascontiguousarray(np.broadcast_to(ranks, (np.shape(operands[0])[0], size)))
    ranks = _primitives.bind("reduce_scatter", [ranks], axis_name=named, scatter_dimension=0, tiled=False,
                             axis_index_groups=groups)[0] // size

    def mine(total, r):
        if not tiled:
            return np.take(total, int(r), axis=dim)
        chunk = total.shape[dim] // size
        return np.take(total, np.arange(int(r) * chunk, (int(r) + 1) * chunk), axis=dim)

    if vectorized:
        return [np.stack([mine(t[d], ranks[d]) for d in range(len(ranks))]) for t in totals]
    return [mine(t, ranks) for t in totals]


def _other_executor(eqn, operands: list, vectorized: bool, ex) -> list | None:
    """The equation by the other executor's rule: per-device rules device by device, or the vectorized rule on a
    one-device stack."""
    name = eqn.primitive.name
    if vectorized:
        rule = _registry.PER_DEVICE.get(name)
        if rule is None:
            return None
        per_device = [rule(*(x[d] for x in operands), **eqn.params) for d in range(ex.n)]
        if not eqn.primitive.multiple_results:
            per_device = [[o] for o in per_device]
        return [np.stack([np.asarray(o[k]) for o in per_device]) for k in range(len(per_device[0]))]
    rule = _registry.VECTORIZED.get(name)
    if rule is None:
        return None
    outs = rule(*(np.asarray(x)[None] for x in operands), **eqn.params)
    outs = outs if eqn.primitive.multiple_results else [outs]
    return [np.asarray(o)[0] if np.ndim(o) else np.asarray(o) for o in outs]


def _xla_map(args: list, params: dict) -> Callable:
    """XLA's executable of the whole map, for arguments like ``args``: a jitted ``jax.shard_map`` of its body over
    JAX's first devices, with the map's specs."""
    import jax
    from spmdsim.jax._internals import jax_shard_map
    from jax.sharding import Mesh, PartitionSpec

    jaxpr, axes = params["jaxpr"], params["axes"]
    if any(_dtypes.is_key(a.dtype) for a in (*jaxpr.in_avals, *jaxpr.out_avals)):
        raise ValueError("PRNG keys in or out of the map")
    n = int(np.prod([size for _, size in axes]))
    devices = jax.devices()
    if len(devices) < n:
        raise ValueError(f"JAX has {len(devices)} devices, the map {n}")
    # a pmap without axis_name has an unnamed axis (no collective can name it): a string of its own for JAX's mesh
    named = {name: name if isinstance(name, str) else f"_unnamed_axis_{k}" for k, (name, _) in enumerate(axes)}
    mesh = Mesh(np.array(devices[:n]).reshape([size for _, size in axes]), tuple(named[name] for name, _ in axes))

    def spec(s):
        s = [tuple(named.get(a, a) for a in names) for names in s]
        return PartitionSpec(*[None if not names else names[0] if len(names) == 1 else tuple(names) for names in s])

    build = jax_shard_map._shard_map
    build = getattr(build, "__wrapped__", build)  # JAX's own, under spmdsim run too
    body = build(lambda *a: tuple(jax.core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *a)), mesh=mesh,
                 in_specs=tuple(spec(s) for s in params["in_specs"]),
                 out_specs=tuple(spec(s) for s in params["out_specs"]), axis_names=frozenset(mesh.axis_names),
                 check_vma=False)
    return _jax_jit()(body).lower(*args).compile()


# -- fusions: runs of equations that XLA compiles together -------------------------------------------------------
#
# XLA fuses the equations of a program before it compiles them: a multiply feeding an add becomes one fused
# multiply-add, a chain of elementwise operations one loop, a reduction of a product one loop. Each equation alone
# can then agree with XLA while the map's outputs do not. When a map call's outputs differ end to end and none of
# its equations did, the map is run once more with every value of its body recorded (per device), and runs of
# consecutive equations of the body (``jit`` calls inlined, as XLA inlines them) are compiled by XLA as one
# program on spmdsim's operands, shortest first: the first run whose results differ is reported as one entry,
# marked ``fused``. A ``while``, ``scan`` or ``cond`` is a run of one equation (its body compiled whole).

_INLINED = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
            "custom_jvp_call": "call_jaxpr"}
FUSED_MAX_EQUATIONS = 8      # the longest run tried
FUSED_MAX_RUNS = 400         # runs compiled per map call at most


def _flattened(closed) -> tuple[list, list]:
    """The equations of a map's body with its ``jit`` calls inlined (each called jaxpr once; a second call of it
    stays a call), and the body's outputs; a call's inputs and outputs are named by the variables that hold their
    values when spmdsim evaluates the body."""
    from spmdsim.jax._internals import core
    alias: dict = {}
    inlined: set = set()
    eqns: list = []

    def canonical(v):
        return alias.get(v, v) if isinstance(v, core.Var) else v

    def walk(jaxpr) -> None:
        for e in jaxpr.eqns:
            key = _INLINED.get(e.primitive.name)
            inner = e.params.get(key) if key else None
            inner = getattr(inner, "jaxpr", inner)
            if inner is not None and id(inner) not in inlined and not inner.constvars:
                inlined.add(id(inner))
                for iv, ov in zip(inner.invars, e.invars, strict=True):
                    alias[iv] = canonical(ov)
                walk(inner)
                for ov, iv in zip(e.outvars, inner.outvars, strict=True):
                    alias[ov] = canonical(iv)
                continue
            eqns.append(core.new_jaxpr_eqn([canonical(v) for v in e.invars], e.outvars, e.primitive, e.params,
                                           e.effects, e.source_info, e.ctx))

    walk(closed.jaxpr)
    return eqns, [canonical(v) for v in closed.jaxpr.outvars]


class _Recorder:
    """An equation observer that keeps, per device, the value of each variable of ``wanted``."""

    def __init__(self, wanted: set):
        self.wanted, self.values, self.lock = wanted, {}, threading.Lock()

    def __call__(self, ex, eqn, operands, outs) -> None:
        lane = _runtime.current_lane()
        label = lane.label if lane is not None else "outside the maps"
        with self.lock:
            env = self.values.setdefault(label, {})
        for v, x in (*zip(eqn.invars, operands), *zip(eqn.outvars, outs)):
            if not hasattr(v, "val") and v in self.wanted and v not in env:
                env[v] = np.array(x)


def _run_of(eqns: list, outvars: list, start: int, length: int):
    """The jaxpr of ``eqns[start:start + length]`` (inputs: what it reads from before it; outputs: what it defines
    that is read after it or returned), or None when it defines nothing used later."""
    import warnings

    from spmdsim.jax._internals import core
    window = eqns[start:start + length]
    defined = {v for e in window for v in e.outvars if isinstance(v, core.Var)}
    inputs: list = []
    for e in window:
        for v in e.invars:
            if isinstance(v, core.Var) and v not in defined and v not in inputs:
                inputs.append(v)
    later = {v for e in eqns[start + length:] for v in e.invars if isinstance(v, core.Var)}
    later.update(v for v in outvars if isinstance(v, core.Var))
    outputs = [v for e in window for v in e.outvars if isinstance(v, core.Var) and v in later]
    if not outputs:
        return None
    effects = set().union(*(e.effects for e in window))
    with warnings.catch_warnings():  # JAX deprecates a jaxpr without debugging info; this one is never shown
        warnings.simplefilter("ignore", DeprecationWarning)
        return core.Jaxpr([], inputs, outputs, window, effects)


def _runnable(eqn) -> bool:
    """An equation XLA can compile outside the map: no collective, effect or PRNG key."""
    return eqn.primitive.name not in _COLLECTIVES and eqn.primitive.name not in _NOT_COMPUTED and not eqn.effects \
        and not any(_dtypes.is_key(v.aval.dtype) for v in (*eqn.invars, *eqn.outvars) if hasattr(v.aval, "dtype"))