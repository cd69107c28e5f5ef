"""Evaluate a jaxpr with NumPy: an environment, one rule per primitive, an aval check per equation.

``IMPL[name](*invals, **params)`` computes one equation: it returns one array, or a list of arrays for
primitives with several results. Rules live in :mod:`._numpy_rules`, :mod:`._control_flow`,
:mod:`._collective_rules` and :mod:`._prng`; each module registers its own with :func:`impl`.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
from jax.extend import core as ext_core

from spmdsim.jax import _dtypes

__all__ = ["IMPL", "impl", "eval_jaxpr", "eval_closed_jaxpr", "current_site", "supported_primitives"]

IMPL: dict[str, Callable[..., Any]] = {}
_local = threading.local()


def impl(*names: str):
    """Register a rule for the primitives ``names``."""
    def register(rule):
        for name in names:
            assert name not in IMPL, f"duplicate rule for primitive {name!r}"
            IMPL[name] = rule
        return rule
    return register


def supported_primitives() -> list[str]:
    return sorted(IMPL)


def _summarize(eqn) -> str:
    try:
        from jax._src import source_info_util
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # noqa: BLE001 - source info is a nicety, never an error
        return "<unknown>"


def current_site() -> str:
    """``file:line (function)`` of the user's code that produced the equation being evaluated. Equations
    inside JAX's own functions (``jnp.cumsum`` is a jit) have no user frame: the enclosing call's line is
    used."""
    for eqn in reversed(getattr(_local, "stack", ())):
        site = _summarize(eqn)
        if site:
            return site
    return "<unknown>"


def _read_literal(lit) -> np.ndarray:
    return np.asarray(lit.val, dtype=_dtypes.numpy_dtype(lit.aval.dtype))


def _check_aval(value, aval, eqn) -> None:
    expected_shape, expected_dtype = _dtypes.numpy_shape_dtype(aval)
    if value.shape != expected_shape or value.dtype != expected_dtype:
        raise AssertionError(
            f"spmdsim bug: the NumPy rule for primitive {eqn.primitive.name!r} returned "
            f"{value.dtype}{list(value.shape)}, but the jaxpr says {expected_dtype}{list(expected_shape)} "
            f"(equation from {current_site()}; params {dict(eqn.params)}). Please report it.")


def eval_jaxpr(jaxpr, consts, *args) -> list[np.ndarray]:
    """Evaluate ``jaxpr`` (a ``jax.extend.core.Jaxpr``) on NumPy arrays; returns the output arrays."""
    env: dict = {}

    def read(v):
        return _read_literal(v) if isinstance(v, ext_core.Literal) else env[v]

    def write(v, val):
        if not isinstance(v, ext_core.DropVar):
            env[v] = val

    for v, val in zip(jaxpr.constvars, consts):
        write(v, np.asarray(val))
    for v, val in zip(jaxpr.invars, args):
        write(v, val)
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(None)
    try:
        for eqn in jaxpr.eqns:
            stack[-1] = eqn
            rule = IMPL.get(eqn.primitive.name)
            if rule is None:
                raise NotImplementedError(
                    f"spmdsim has no NumPy rule for primitive {eqn.primitive.name!r} (params "
                    f"{dict(eqn.params)}), used at {current_site()}. Supported primitives: "
                    f"spmdsim.jax.supported_primitives().")
            with np.errstate(all="ignore"):
                out = rule(*map(read, eqn.invars), **eqn.params)
            outs = out if eqn.primitive.multiple_results else [out]
            for var, val in zip(eqn.outvars, outs):
                val = np.asarray(val)
                _check_aval(val, var.aval, eqn)
                write(var, val)
    finally:
        stack.pop()
    return [read(v) for v in jaxpr.outvars]


def eval_closed_jaxpr(closed, *args) -> list[np.ndarray]:
    return eval_jaxpr(closed.jaxpr, closed.consts, *args)
