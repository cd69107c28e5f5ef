"""Collective primitives of a jaxpr, sent to the same rendezvous and rule table as :mod:`spmdsim.lax`.

The jaxpr's parameters are passed through unchanged (``axes``, ``axis_index_groups``,
``all_gather_dimension``, ``scatter_dimension``, ``split_axis``, ``concat_axis``, ``perm``, ``source``); the
site reported in errors and traces is the user's line that produced the equation.
"""
from __future__ import annotations

import math

import numpy as np

from spmdsim import _runtime, lax as _lax
from spmdsim.jax._interpreter import current_site, impl


def _names(axis_name) -> tuple:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _frames(op, axis_name):
    return _runtime.resolve_axes(_runtime.current_lane(), _names(axis_name), op)


def _bind(op, x, axis_name, groups=None, *, even_groups=False, **params):
    """JAX checks some arguments only when lowering (after tracing), so the rules check them here."""
    frames = _frames(op, axis_name)
    if groups is not None:
        groups = _lax._check_groups(groups, math.prod(f.size for f in frames), op)
        if even_groups:
            _lax._require_even(groups, op)
    return _lax.bind(op, [x], frames, groups, site=current_site(), **params)[0]


def _reduction(op, ufunc):
    def rule(x, *, axes, axis_index_groups):
        named = tuple(a for a in axes if not isinstance(a, int))
        positional = tuple(a for a in axes if isinstance(a, int))
        if positional:
            x = ufunc.reduce(x, axis=positional, dtype=x.dtype if ufunc is np.add else None)
        return _bind(op, x, named, axis_index_groups) if named else x
    return rule


impl("psum")(_reduction("psum", np.add))
impl("pmax")(_reduction("pmax", np.maximum))
impl("pmin")(_reduction("pmin", np.minimum))


@impl("all_gather")
def _all_gather(x, *, all_gather_dimension, axis_name, axis_index_groups, axis_size, tiled, **_):
    return _bind("all_gather", x, axis_name, axis_index_groups, even_groups=True,
                 all_gather_dimension=all_gather_dimension, tiled=bool(tiled))


@impl("reduce_scatter")
def _reduce_scatter(x, *, scatter_dimension, axis_name, axis_index_groups, axis_size, tiled):
    if x.dtype == np.bool_:
        raise TypeError("add does not accept dtype bool at position 0 (psum_scatter of a bool array). Convert "
                        "first, e.g. x.astype(jnp.int32).")
    return _bind("reduce_scatter", x, axis_name, axis_index_groups, even_groups=True,
                 scatter_dimension=scatter_dimension, tiled=bool(tiled))


@impl("all_to_all")
def _all_to_all(x, *, split_axis, concat_axis, axis_name, axis_index_groups, tiled):
    # The primitive always splits and concatenates in place; jax.lax.all_to_all adds and removes the unit
    # axis around it for tiled=False. As in XLA's lowering, a first group of size one is the identity.
    if axis_index_groups is not None and len(axis_index_groups[0]) == 1:
        return x
    return _bind("all_to_all", x, axis_name, axis_index_groups, even_groups=True, split_axis=split_axis,
                 concat_axis=concat_axis, tiled=True)


@impl("ppermute")
def _ppermute(x, *, axis_name, perm):
    size = 1
    for f in _frames("ppermute", axis_name):
        size *= f.size
    return _bind("ppermute", x, axis_name, perm=_lax._check_perm(perm, size))


@impl("pbroadcast")
def _pbroadcast(x, *, axis_name, source):
    return _bind("pbroadcast", x, axis_name, source=source)


@impl("axis_index")
def _axis_index(*, axis_name):
    return _lax.axis_index(axis_name)
