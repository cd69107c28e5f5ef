"""``jax.shard_map`` on virtual devices: JAX traces the program, spmdsim computes every value.

A call of ``spmdsim.jax.shard_map(f, ...)`` (or of ``jax.shard_map`` under ``spmdsim run``) lets JAX's own
``shard_map`` trace it, so every check JAX makes (specs, divisibility, varying-manual-axes types under
``check_vma=True``, Explicit mesh axes) and every choice of primitive (``psum_invariant``, ``pvary``,
``all_gather_invariant``) is JAX's. The traced program is then run by spmdsim:

- with concrete arguments, the jaxpr is evaluated by spmdsim's interpreter on global NumPy values, and each
  ``shard_map`` equation in it runs per device (:func:`simulate_shard_map`), in threads by default;
- with JAX tracers as arguments (under ``grad``, ``vmap``, ``jit``, ...), each ``shard_map`` equation is
  re-bound as the ``spmdsim_map`` primitive, whose transformation rules follow JAX's shard_map conventions
  (:mod:`spmdsim.jax._map`), and everything else as itself.

:func:`jit` is what ``spmdsim run`` puts in place of ``jax.jit``: a jitted function whose program contains a
map is evaluated the same way (the parts outside the maps once, on global values, by NumPy); any other is
left to JAX.
"""
from __future__ import annotations

import functools
import inspect
import threading

import jax
from jax._src import core, source_info_util
from jax._src.util import weakref_lru_cache
from jax.extend import core as ext_core

from spmdsim.jax._interpreter import PER_DEVICE, Executor, eval_jaxpr, higher_order
from spmdsim.jax._map import map_params, simulate, spmdsim_map_p, to_jax, to_numpy

__all__ = ["shard_map", "jit", "simulated", "real_shard_map"]

real_shard_map = jax.shard_map
_INFER = inspect.signature(jax.shard_map).parameters["in_specs"].default  # JAX's "infer from the arguments"


def _spec_dims(spec, ndim: int) -> tuple:
    """A ``PartitionSpec`` as one tuple of mesh axis names per dimension (``()``: not split). ValueError for a
    mesh axis named twice (JAX's ``DuplicateSpecError``, raised only when XLA runs the program)."""
    parts = tuple(spec) + (None,) * (ndim - len(tuple(spec)))
    dims = tuple(() if p is None else tuple(p) if isinstance(p, tuple) else (p,) for p in parts)
    names = [n for d in dims for n in d]
    if len(set(names)) != len(names):
        raise ValueError(f"A single NamedSharding spec specification can map every mesh axis to at most one "
                         f"positional dimension, but {spec} has duplicate entries.")
    return dims


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


@higher_order("shard_map")
def _shard_map(ex: Executor, *args, **params):
    """A ``shard_map`` equation met by spmdsim's interpreter (a jitted program, a map inside a map)."""
    return simulate(list(args), ex=None if ex is PER_DEVICE else ex, **shard_map_params(params, _executor.get()))


class _Executor(threading.local):
    """The executor (``threads``/``vectorized``) for shard_map equations evaluated in this thread."""

    def __init__(self):
        self.name = "threads"

    def get(self) -> str:
        return self.name


_executor = _Executor()


def _contains_map(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("shard_map", "spmdsim_map"):
            return True
        if any(_contains_map(sub) for sub in ext_core.jaxprs_in_params(eqn.params)):
            return True
    return False


def _rebind(jaxpr, consts, args, executor: str) -> list:
    """Evaluate ``jaxpr`` on JAX values (tracers), binding each primitive as itself except ``shard_map``,
    which becomes ``spmdsim_map`` (JAX's ``core.eval_jaxpr`` with that one substitution)."""
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, ext_core.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        with source_info_util.user_context(eqn.source_info.traceback, name_stack=eqn.source_info.name_stack), \
                eqn.ctx.manager:
            if eqn.primitive.name == "shard_map":
                outs = spmdsim_map_p.bind(*invals, **shard_map_params(eqn.params, executor))
            else:
                outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
        outs = outs if eqn.primitive.multiple_results else [outs]
        for v, x in zip(eqn.outvars, outs, strict=True):
            if not isinstance(v, ext_core.DropVar):
                env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _run_traced(closed, flat_args, executor: str) -> list:
    """Run a traced program: re-bound under JAX tracers, evaluated by spmdsim on concrete values."""
    if any(isinstance(x, core.Tracer) for x in flat_args):
        return _rebind(closed.jaxpr, closed.consts, flat_args, executor)
    previous, _executor.name = _executor.name, executor
    try:
        outs = eval_jaxpr(closed.jaxpr, [to_numpy(c) for c in closed.consts], *(to_numpy(x) for x in flat_args),
                          executor=PER_DEVICE)
    finally:
        _executor.name = previous
    shardings = _out_shardings(closed.jaxpr)
    return [to_jax(o, a) if s is None else jax.device_put(to_jax(o, a), s)
            for o, a, s in zip(outs, closed.out_avals, shardings, strict=True)]


@weakref_lru_cache
def _out_shardings(jaxpr) -> list:
    """Where each output of a program lives, as JAX would place it: a shard_map's output on its mesh by its
    out_spec (also through a jit), a value whose type names an (Explicit) sharding on the concrete mesh of
    that name; None (JAX's default device) otherwise. Worked out once per program."""
    meshes: list = []
    produced = _shard_map_outputs(jaxpr, meshes)
    out = []
    for v in jaxpr.outvars:
        if v in produced:
            out.append(produced[v])
            continue
        sharding = getattr(v.aval, "sharding", None)
        spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
        concrete = next((m for m in meshes if mesh is not None and tuple(m.axis_names) == tuple(mesh.axis_names)
                         and tuple(m.axis_sizes) == tuple(mesh.axis_sizes)), None)
        out.append(jax.sharding.NamedSharding(concrete, spec) if concrete is not None and spec is not None
                   and any(p is not None for p in spec) else None)
    return out


def _partition_spec(dims: tuple) -> jax.sharding.PartitionSpec:
    """Per-dimension tuples of axis names as a PartitionSpec (trailing unsplit dimensions dropped)."""
    parts = [None if not names else names[0] if len(names) == 1 else names for names in dims]
    while parts and parts[-1] is None:
        parts.pop()
    return jax.sharding.PartitionSpec(*parts)


def _shard_map_outputs(jaxpr, meshes: list) -> dict:
    """Variables of ``jaxpr`` produced by a shard_map (directly, or as outputs of a jit around one), with their
    shardings; ``meshes`` collects the concrete meshes met."""
    found: dict = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("shard_map", "spmdsim_map") and isinstance(eqn.params.get("mesh"),
                                                                            jax.sharding.Mesh):
            mesh = eqn.params["mesh"]
            meshes.append(mesh)
            for v, spec in zip(eqn.outvars, eqn.params["out_specs"], strict=True):
                found[v] = jax.sharding.NamedSharding(mesh, spec if eqn.primitive.name == "shard_map"
                                                      else _partition_spec(spec))
        elif eqn.primitive.name in ("pjit", "jit", "closed_call"):
            inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            inner = getattr(inner, "jaxpr", inner)
            inner_found = _shard_map_outputs(inner, meshes)
            for v, inner_v in zip(eqn.outvars, inner.outvars, strict=True):
                if inner_v in inner_found:
                    found[v] = inner_found[inner_v]
    return found


def _inside_a_map_trace() -> bool:
    """Whether JAX is tracing the body of a map now (its mesh has manual axes)."""
    from jax._src import mesh as mesh_lib
    return bool(mesh_lib.get_abstract_mesh().manual_axes)


def simulated(fun, executor: str = "threads"):
    """``fun`` (a JAX function, e.g. one built by ``jax.shard_map``) traced by JAX and run by spmdsim (see the
    module docstring); traced once per argument structure and avals."""
    cache: dict = {}
    lock = threading.Lock()

    @functools.wraps(fun)
    def run(*args, **kwargs):
        if _inside_a_map_trace():  # a shard_map nested in a body JAX is tracing: JAX's own, run by spmdsim later
            return fun(*args, **kwargs)
        flat, in_tree = jax.tree_util.tree_flatten((args, kwargs))
        key = (in_tree, tuple(core.typeof(x) for x in flat))
        with lock:
            found = cache.get(key)
        if found is None:
            def flat_fun(*leaves):
                a, k = jax.tree_util.tree_unflatten(in_tree, leaves)
                return fun(*a, **k)
            closed, shape = jax.make_jaxpr(flat_fun, return_shape=True)(*flat)
            found = (closed, jax.tree_util.tree_structure(shape))
            if not any(isinstance(c, core.Tracer) for c in closed.consts):
                with lock:
                    cache[key] = found
        closed, out_tree = found
        return jax.tree_util.tree_unflatten(out_tree, _run_traced(closed, flat, executor))

    return run


def shard_map(f=None, /, *, out_specs, in_specs=_INFER, mesh=None, axis_names=frozenset(),
              check_vma: bool = True, executor: str = "threads"):
    """``jax.shard_map`` on spmdsim's virtual devices, with every value computed by NumPy.

    Same signature and semantics as ``jax.shard_map`` (JAX 0.10): ``mesh`` a ``jax.sharding.Mesh`` (or
    None: the context mesh of ``jax.set_mesh``), ``in_specs`` (default: inferred from the arguments'
    shardings) and ``out_specs`` trees of ``PartitionSpec``, ``axis_names`` the manual axes, ``check_vma``
    JAX's varying-manual-axes checks. JAX traces ``f`` (so its errors and checks are JAX's own); each device's
    block is computed by spmdsim in its own thread (``executor="vectorized"``: all at once). Composes with
    ``jit``, ``grad``, ``vmap`` and control flow like :func:`spmdsim.jax.pmap`.

    Returns ``jax.Array`` leaves of the global shapes the out_specs give.

    Differences from ``jax.shard_map``: partial-manual maps (``axis_names`` a subset of the mesh axes) run
    the body once per coordinate of the manual axes on values that are whole along the others.
    """
    kwargs = dict(out_specs=out_specs, in_specs=in_specs, mesh=mesh, axis_names=axis_names, check_vma=check_vma)
    if f is None:
        return lambda g: shard_map(g, executor=executor, **kwargs)
    return simulated(real_shard_map(f, **kwargs), executor)


def jit(fun=None, /, **jit_kwargs):
    """``jax.jit`` as ``spmdsim run`` provides it: a jitted function whose program contains a map (a
    ``shard_map`` or a pmap) is evaluated by spmdsim with concrete arguments, the parts outside the maps once,
    on global values, by NumPy; any other jitted function, and any call under a JAX transformation, is JAX's
    ``jit`` unchanged. ``lower``, ``trace`` and ``eval_shape`` are JAX's."""
    if fun is None:
        return lambda f: jit(f, **jit_kwargs)
    jitted = _real_jit(fun, **jit_kwargs)
    static_nums, static_names = _static_arguments(fun, jit_kwargs)
    cache: dict = {}
    lock = threading.Lock()

    @functools.wraps(fun)
    def run(*args, **kwargs):
        nums = {i % len(args) for i in static_nums if -len(args) <= i < len(args)}
        dynamic = (tuple(a for i, a in enumerate(args) if i not in nums),
                   {k: v for k, v in kwargs.items() if k not in static_names})
        flat, in_tree = jax.tree_util.tree_flatten(dynamic)
        if any(isinstance(x, core.Tracer) for x in flat):
            return jitted(*args, **kwargs)
        try:
            key = (tuple(args[i] for i in sorted(nums)), tuple(sorted((k, v) for k, v in kwargs.items()
                                                                      if k in static_names)),
                   in_tree, tuple(core.typeof(x) for x in flat))
            hash(key)
        except TypeError:  # let JAX report unhashable static arguments
            return jitted(*args, **kwargs)
        with lock:
            found = cache.get(key)
        if found is None:
            traced = jitted.trace(*args, **kwargs)
            found = (traced.jaxpr, traced.out_tree, _contains_map(traced.jaxpr.jaxpr))
            with lock:
                cache[key] = found
        closed, out_tree, has_map = found
        if not has_map:
            return jitted(*args, **kwargs)
        return jax.tree_util.tree_unflatten(out_tree, _run_traced(closed, flat, "threads"))

    for name in ("lower", "trace", "eval_shape"):
        if hasattr(jitted, name):
            setattr(run, name, getattr(jitted, name))
    return run


def _static_arguments(fun, jit_kwargs: dict) -> tuple[tuple, frozenset]:
    """``jit``'s static argument positions and names, resolved against ``fun``'s signature as JAX does."""
    from jax._src import api_util
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):
        signature = None
    nums, names = api_util.infer_argnums_and_argnames(signature, jit_kwargs.get("static_argnums"),
                                                      jit_kwargs.get("static_argnames"))
    return tuple(nums), frozenset(names)


_real_jit = jax.jit
