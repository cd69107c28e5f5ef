"""Primitives spmdsim has no rule for, whose XLA lowering JAX builds from a JAX function; and JAX's "hi"
primitives (``call_hi_primitive``, JAX 0.12's hijax: ``jnp.searchsorted(method='scan')``), which JAX expands
into ordinary ("lo") primitives before lowering (the primitive's ``to_lojax``).

A primitive registered with ``mlir.register_lowering(p, mlir.lower_fun(fun, multiple_results))`` (how a user or
a library defines a primitive by the JAX program that computes it; lax_test's custom element types do) means,
on XLA, exactly ``fun`` traced on the equation's avals. spmdsim evaluates that same program: ``fun`` traced
by JAX into a jaxpr (as ``lower_fun`` traces it: ``pe.trace_to_jaxpr_dynamic(..., lower=True)``), its equations
computed by spmdsim's rules. The lowering for CPU is looked up first, then the platform-independent one.

Values of extended dtypes are in physical form throughout (:mod:`._dtypes`), which is what such a program
computes with on XLA too: ``lax_test``'s ``make`` lowers to ``jnp.zeros((*shape, 2), 'uint32')``, the physical
form of a ``foo[*shape]``.
"""
from __future__ import annotations

import contextlib
import threading

from spmdsim.jax._internals import api_util, config, core, mesh_lib
from spmdsim.jax._internals import lu
from spmdsim.jax._internals import mlir
from spmdsim.jax._internals import pe
from jax.extend import core as ext_core

__all__ = ["lowering_jaxpr"]

_cache: dict = {}  # id(eqn) -> (eqn, jaxpr): the equation is held, so its id is not reused while cached
_lock = threading.Lock()
_CACHED = 1024


def _lowering_function(primitive):
    """``(fun, multiple_results)`` of ``primitive``'s ``lower_fun`` lowering on CPU, or None."""
    for table in (mlir._platform_specific_lowerings.get("cpu", {}), mlir._lowerings):
        entry = table.get(primitive)
        if entry is None:
            continue
        rule = getattr(entry, "rule", entry)
        code = getattr(rule, "__code__", None)
        if code is None or not rule.__qualname__.startswith("lower_fun.") or rule.__closure__ is None:
            return None
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in rule.__closure__)))
        return (cells["fun"], cells["multiple_results"]) if "fun" in cells else None
    return None


def _axes_of(eqn) -> list:
    """The mesh axes ``eqn``'s operands vary along (or are unreduced or reduced over), with their sizes, to bind
    while its program is traced (a hi primitive's expansion ``pvary``s along them): the sizes from the map being
    evaluated (a device thread's frames, the vectorized executor's batch)."""
    names = []
    for v in eqn.invars:
        mat = getattr(v.aval, "mat", None)
        for attr in ("varying", "unreduced", "reduced"):
            names += [n for n in getattr(mat, attr, ()) if n not in names]
    if not names:
        return []
    from spmdsim.primitives import _batch
    from spmdsim.runtime import _runtime
    lane, batch = _runtime.current_lane(), _batch.current_batch()
    sizes = dict((f.name, f.size) for f in lane.frames) if lane is not None else {}
    if batch is not None:
        sizes.update(batch.axes)
    return [(n, sizes.get(n, 1)) for n in names]


def _traced_as_in_its_map(eqn):
    """The context JAX traced ``eqn`` in, for tracing its program: the map's axes bound, and (operands that vary
    along them: a shard_map with ``check_vma``) the operands' mesh with those axes manual, as JAX's own context
    inside a shard_map's body."""
    stack = contextlib.ExitStack()
    axes = _axes_of(eqn)
    if axes:
        stack.enter_context(core.extend_axis_env_nd(axes))
        mesh = next((m for v in eqn.invars if not (m := getattr(getattr(v.aval, "sharding", None), "mesh", None)
                                                   ) is None and not m.empty), None)
        if mesh is not None:
            stack.enter_context(mesh_lib.use_abstract_mesh(mesh))
            stack.enter_context(config._check_vma(True))
    return stack


def _is_high(eqn) -> bool:
    """Whether ``eqn`` is of a hi primitive, which JAX expands before lowering (``is_high``, ``to_lojax``)."""
    is_high = getattr(eqn.primitive, "is_high", None)
    return is_high is not None and hasattr(eqn.primitive, "to_lojax") and bool(
        is_high(*(v.aval for v in eqn.invars), **eqn.params))


def lowering_jaxpr(eqn):
    """The program XLA runs for ``eqn`` (a ClosedJaxpr whose results are ``eqn``'s, always a list), or None when
    its primitive's lowering is not made by ``mlir.lower_fun``."""
    with _lock:
        found = _cache.get(id(eqn))
    if found is not None:
        return found[1]
    lowering = (eqn.primitive.to_lojax, True) if _is_high(eqn) else _lowering_function(eqn.primitive)
    if lowering is None:
        return None
    fun, multiple = lowering
    f = fun if multiple else (lambda *args, **kw: (fun(*args, **kw),))
    traced = lu.wrap_init(f, dict(eqn.params), debug_info=api_util.debug_info("lower_fun", fun, eqn.invars, {}))
    with _traced_as_in_its_map(eqn):
        jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(traced, [v.aval for v in eqn.invars], lower=True)
    closed = ext_core.ClosedJaxpr(jaxpr, consts)
    with _lock:
        if len(_cache) >= _CACHED:
            _cache.clear()
        _cache[id(eqn)] = (eqn, closed)
    return closed
