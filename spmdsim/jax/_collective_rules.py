"""Collective primitives of a jaxpr, sent to the same rendezvous and rule table as :mod:`spmdsim.lax`.

:func:`collective_call` says what one collective equation does in the rule table's terms, after the checks
that JAX makes only when lowering (after tracing, so a jaxpr can hold calls that jax.pmap would reject):
uneven groups for gathers and scatters, bool operands of a reduce-scatter, duplicate ``ppermute`` pairs.
Both executors use it: the thread executor here (one rendezvous per equation, or per pytree call, which JAX
splits into one equation per leaf; the site being the user's line that produced it), the vectorized
executor along its device axis.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from spmdsim import _runtime, lax as _lax
from spmdsim.jax._interpreter import current_site, impl, site_of

REDUCTIONS = {"psum": np.add, "pmax": np.maximum, "pmin": np.minimum}


class CollectiveCall(NamedTuple):
    """A collective equation as the rule table sees it: the rule, the named axes, groups, rule parameters."""

    rule: str
    axis_names: tuple
    groups: tuple | None
    params: dict


def split_axes(params: dict) -> tuple[tuple, tuple]:
    """``(named axes, positional axes)`` of a collective equation: its ``axis_name``, or a reduction's
    ``axes``, whose int entries are axes of the block."""
    return _lax._split_axis_name(params.get("axis_name", params.get("axes")))


def collective_call(prim: str, x: np.ndarray, size: int, params: dict) -> CollectiveCall | None:
    """The rule call for collective equation ``prim`` on operand ``x`` over an axis of ``size`` devices, or
    None when the equation is the identity. Raises what JAX raises when it lowers the equation."""
    names = _lax._axis_names(params.get("axis_name", params.get("axes")))
    groups = params.get("axis_index_groups")
    if groups is not None:
        groups = _lax._check_groups(groups, size, prim)
        if prim in ("all_gather", "reduce_scatter") or (prim == "all_to_all" and len(groups[0]) > 1):
            _lax._require_even(groups, prim)
    if prim in REDUCTIONS:
        return CollectiveCall(prim, split_axes(params)[0], groups, {})
    if prim == "all_gather":
        return CollectiveCall(prim, names, groups, {"all_gather_dimension": params["all_gather_dimension"],
                                                    "tiled": bool(params["tiled"])})
    if prim == "reduce_scatter":
        if x.dtype == np.bool_:
            raise TypeError("add does not accept dtype bool at position 0 (psum_scatter of a bool array). Convert "
                            "first, e.g. x.astype(jnp.int32).")
        return CollectiveCall(prim, names, groups, {"scatter_dimension": params["scatter_dimension"],
                                                    "tiled": bool(params["tiled"])})
    if prim == "all_to_all":
        # The primitive always splits and concatenates in place (jax.lax.all_to_all adds and removes the unit
        # axis around it when tiled=False); as in XLA's lowering, a first group of one is the identity.
        if groups is not None and len(groups[0]) == 1:
            return None
        return CollectiveCall(prim, names, groups, {"split_axis": params["split_axis"],
                                                    "concat_axis": params["concat_axis"], "tiled": True})
    if prim == "ppermute":
        return CollectiveCall(prim, names, None, {"perm": _lax._check_perm(params["perm"], size)})
    if prim == "pbroadcast":
        return CollectiveCall(prim, names, None, {"source": params["source"]})
    raise NotImplementedError(f"collective primitive {prim!r}")


def positional_reduce(prim: str, x: np.ndarray, axes, shift: int = 0) -> np.ndarray:
    """The int entries of a reduction's ``axes`` are axes of the block, reduced on each device first."""
    positional = tuple(a + shift for a in axes if isinstance(a, int))
    if not positional:
        return x
    ufunc = REDUCTIONS[prim]
    return ufunc.reduce(x, axis=positional, dtype=x.dtype if ufunc is np.add else None)


def _thread_rule(prim: str):
    def rule(x, **params):
        return prepare(prim, params)(x)[0]

    def specialize(eqn):
        run = prepare(prim, eqn.params, site_of(eqn))
        return lambda x: run(x)[0]

    rule.specialize = specialize
    rule.specialize_call = lambda eqns: prepare(prim, eqns[0].params, site_of(eqns[0]))
    return rule


def prepare(prim: str, params: dict, site: str = ""):
    """The thread executor's function for a collective equation, or for the equations of one pytree call
    (one per leaf, same parameters): its operands meet the other devices' in one rendezvous, and it
    returns the list of results. What the equation fixes (axis names, positional axes, the lowering checks,
    the rule binding per axis size, the user's source line when the equation has one) is worked out once."""
    named, positional = split_axes(params)
    positional = prim in REDUCTIONS and bool(positional)
    bindings: dict = {}  # axis size -> Binding, or None for the identity

    def run(*xs) -> list:
        if positional:
            xs = [positional_reduce(prim, x, params["axes"]) for x in xs]
        chan = _runtime.channel(_runtime.current_lane(), named, prim)
        if not chan.frames:
            return list(xs)
        size = chan.size
        if size not in bindings:
            calls = [collective_call(prim, x, size, params) for x in xs]  # raises what JAX raises when lowering
            bindings[size] = None if calls[0] is None else _lax.Binding(calls[0].rule, calls[0].groups,
                                                                          **calls[0].params)
        binding = bindings[size]
        return list(xs) if binding is None else binding(list(xs), chan, site or current_site())
    return run


for _prim in ("psum", "pmax", "pmin", "all_gather", "reduce_scatter", "all_to_all", "ppermute", "pbroadcast"):
    impl(_prim)(_thread_rule(_prim))


@impl("axis_index")
def _axis_index(*, axis_name):
    return _lax.axis_index(axis_name)
