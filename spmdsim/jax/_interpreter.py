"""Evaluate a jaxpr with NumPy: an environment, one rule per primitive, an aval check per equation.

``IMPL[name](*invals, **params)`` computes one equation: it returns one array, or a list of arrays for
primitives with several results. Rules live in :mod:`._numpy_rules`, :mod:`._control_flow`,
:mod:`._collective_rules` and :mod:`._prng`; each module registers its own with :func:`impl`.
"""
from __future__ import annotations

import threading
import weakref
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


def _report_aval(value, expected_shape, expected_dtype, eqn) -> None:
    raise AssertionError(
        f"spmdsim bug: the NumPy rule for primitive {eqn.primitive.name!r} returned "
        f"{value.dtype}{list(value.shape)}, but the jaxpr says {expected_dtype}{list(expected_shape)} "
        f"(equation from {current_site()}; params {dict(eqn.params)}). Please report it.")


class _Step:
    """One equation, prepared once per jaxpr: its rule, operands (literals already NumPy arrays) and the
    shape and dtype every result must have."""

    __slots__ = ("eqn", "rule", "operands", "params", "outvars", "expected", "multiple")

    def __init__(self, eqn):
        self.eqn, self.params = eqn, eqn.params
        self.rule = IMPL.get(eqn.primitive.name)
        self.operands = [(True, _read_literal(v)) if isinstance(v, ext_core.Literal) else (False, v)
                         for v in eqn.invars]
        self.outvars = [None if isinstance(v, ext_core.DropVar) else v for v in eqn.outvars]
        self.expected = [_dtypes.numpy_shape_dtype(v.aval) for v in eqn.outvars]
        self.multiple = eqn.primitive.multiple_results


_programs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _program(jaxpr) -> list[_Step]:
    program = _programs.get(jaxpr)
    if program is None:
        program = _programs[jaxpr] = [_Step(eqn) for eqn in jaxpr.eqns]
    return program


def eval_jaxpr(jaxpr, consts, *args) -> list[np.ndarray]:
    """Evaluate ``jaxpr`` (a ``jax.extend.core.Jaxpr``) on NumPy arrays; returns the output arrays."""
    env: dict = {}
    for v, val in zip(jaxpr.constvars, consts):
        env[v] = np.asarray(val)
    for v, val in zip(jaxpr.invars, args):
        env[v] = val
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(None)
    try:
        with np.errstate(all="ignore"):
            for step in _program(jaxpr):
                eqn = stack[-1] = step.eqn
                if step.rule is None:
                    raise NotImplementedError(
                        f"spmdsim has no NumPy rule for primitive {eqn.primitive.name!r} (params "
                        f"{dict(eqn.params)}), used at {current_site()}. Supported primitives: "
                        f"spmdsim.jax.supported_primitives().")
                out = step.rule(*[value if literal else env[value] for literal, value in step.operands],
                                **step.params)
                for var, val, (shape, dtype) in zip(step.outvars, out if step.multiple else (out,), step.expected):
                    if type(val) is not np.ndarray:
                        val = np.asarray(val)
                    if val.shape != shape or val.dtype != dtype:
                        _report_aval(val, shape, dtype, eqn)
                    if var is not None:
                        env[var] = val
    finally:
        stack.pop()
    return [_read_literal(v) if isinstance(v, ext_core.Literal) else env[v] for v in jaxpr.outvars]


def split_closed(jaxpr) -> tuple:
    """(jaxpr, consts) of a ClosedJaxpr; an open Jaxpr (as in remat's params) has no constants."""
    return (jaxpr.jaxpr, jaxpr.consts) if hasattr(jaxpr, "consts") else (jaxpr, ())


def eval_closed_jaxpr(closed, *args) -> list[np.ndarray]:
    return eval_jaxpr(closed.jaxpr, closed.consts, *args)
