"""Evaluate a jaxpr with NumPy: an environment, one rule per primitive, an aval check per equation.

``IMPL[name](*invals, **params)`` computes one equation: it returns one array, or a list of arrays for
primitives with several results. A rule may also carry ``rule.specialize(eqn)``, which returns a function of
the operands alone with everything that the equation fixes (parameters, shapes, dtypes) worked out once per
jaxpr, or None for the generic rule; and ``rule.specialize_call(eqns)`` for a *pytree call*: the equations
that JAX emits one per leaf for one call on a pytree (``lax.psum((a, b), 'i')`` gives one ``psum`` equation
per leaf, all with the same parameters and source line), computed together (one rendezvous, as in the
NumPy front end). Rules live in :mod:`._numpy_rules`, :mod:`._control_flow`,
:mod:`._collective_rules` and :mod:`._prng`; each module registers its own with :func:`impl`.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Callable

import numpy as np
from jax.extend import core as ext_core

from spmdsim.jax import _dtypes, _registry

__all__ = ["IMPL", "impl", "specialize", "eval_jaxpr", "eval_closed_jaxpr", "current_site", "site_of",
           "supported_primitives"]

IMPL = _registry.PER_DEVICE
impl = _registry.per_device
specialize = _registry.specialize
_local = threading.local()


def supported_primitives() -> list[str]:
    return sorted(IMPL)


def site_of(eqn) -> str:
    """``file:line (function)`` of the user's code that produced ``eqn``; '' for an equation of JAX's own
    code (see :func:`current_site`)."""
    try:
        from jax._src import source_info_util
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # noqa: BLE001 - source info is a nicety, never an error
        return "<unknown>"


def current_site() -> str:
    """``file:line (function)`` of the user's code that produced the equation being evaluated. Equations
    inside JAX's own functions (``jnp.cumsum`` is a jit) have no user frame: the enclosing call's line is
    used."""
    for step in reversed(getattr(_local, "stack", ())):
        site = step.site if step is not None else ""
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
    """One equation (or the equations of one pytree call), prepared once per jaxpr: the function computing
    it from its operands (the rule with its parameters bound, or the rule's specialisation), the operands
    (literals already NumPy arrays) and the shape and dtype every result must have."""

    __slots__ = ("eqns", "eqn", "call", "operands", "outvars", "expected", "multiple", "_site")

    def __init__(self, eqns: list):
        self.eqns, self.eqn = eqns, eqns[0]
        eqn = self.eqn
        rule = IMPL.get(eqn.primitive.name)
        if len(eqns) > 1:
            self.call = rule.specialize_call(eqns)
        else:
            specializer = getattr(rule, "specialize", None)
            self.call = specializer(eqn) if specializer is not None else None
            if self.call is None and rule is not None:
                self.call = functools.partial(rule, **eqn.params) if eqn.params else rule
        self.operands = [(True, _read_literal(v)) if isinstance(v, ext_core.Literal) else (False, v)
                         for e in eqns for v in e.invars]
        self.outvars = [None if isinstance(v, ext_core.DropVar) else v for e in eqns for v in e.outvars]
        self.expected = [_dtypes.numpy_shape_dtype(v.aval) for e in eqns for v in e.outvars]
        self.multiple = eqn.primitive.multiple_results or len(eqns) > 1
        self._site = None

    @property
    def site(self) -> str:
        """``file:line (function)`` of the user's code that produced this equation ('' inside JAX's own)."""
        if self._site is None:
            self._site = site_of(self.eqn)
        return self._site


def _same_call(eqns: list, eqn) -> bool:
    """Whether ``eqn`` continues the pytree call ``eqns``: a rule that computes such calls together, the same
    primitive, parameters and user source line, and no operand produced inside the call."""
    first = eqns[0]
    if eqn.primitive is not first.primitive or not hasattr(IMPL.get(eqn.primitive.name), "specialize_call"):
        return False
    if eqn.params != first.params or not site_of(first) or site_of(eqn) != site_of(first):
        return False
    produced = {v for e in eqns for v in e.outvars}
    return not any(v in produced for v in eqn.invars if not isinstance(v, ext_core.Literal))


def _prepare(jaxpr) -> list[_Step]:
    calls: list[list] = []
    for eqn in jaxpr.eqns:
        if calls and _same_call(calls[-1], eqn):
            calls[-1].append(eqn)
        else:
            calls.append([eqn])
    return [_Step(eqns) for eqns in calls]


def _missing(step: _Step):
    eqn = step.eqn
    raise NotImplementedError(
        f"spmdsim has no NumPy rule for primitive {eqn.primitive.name!r} (params {dict(eqn.params)}), used at "
        f"{current_site()}. Supported primitives: spmdsim.jax.supported_primitives().")


def _bad_aval(value, shape, dtype, step: _Step):
    _report_aval(np.asarray(value), shape, dtype, step.eqn)


def program_source(jaxpr) -> tuple[str, dict]:
    """The jaxpr as the source of one Python function ``run(stack, *consts, *args)``, and its namespace.

    One line per equation calls the step's prepared function on local variables (one per jaxpr variable),
    then the aval check of each result; ``stack[-1]`` names the step being computed (for error sites). This
    is the whole per-equation cost: no environment dictionary, no loop, no operand list.
    """
    steps = _prepare(jaxpr)
    ns: dict = {"ndarray": np.ndarray, "asarray": np.asarray, "_missing": _missing, "_bad_aval": _bad_aval,
                "_read_literal": _read_literal}
    names: dict = {}

    def local(var) -> str:
        if var not in names:
            names[var] = f"v{len(names)}"
        return names[var]

    consts = [local(v) for v in jaxpr.constvars]
    params = ", ".join(["stack", *consts, *(local(v) for v in jaxpr.invars)])
    lines = [f"def run({params}):"]
    lines += [f"    {c} = asarray({c})" for c in consts]
    for k, step in enumerate(steps):
        ns[f"S{k}"] = step
        lines.append(f"    stack[-1] = S{k}")
        if step.call is None:
            lines.append(f"    _missing(S{k})")
            continue
        ns[f"C{k}"] = step.call
        operands = []
        for j, (literal, value) in enumerate(step.operands):
            if literal:
                ns[f"L{k}_{j}"] = value
                operands.append(f"L{k}_{j}")
            else:
                operands.append(local(value))
        outs = [local(v) if v is not None else f"_{k}_{i}" for i, v in enumerate(step.outvars)]
        target = (f"{', '.join(outs)}, = " if outs else "") if step.multiple else f"{outs[0]} = "
        lines.append(f"    {target}C{k}({', '.join(operands)})")
        for i, (out, (shape, dtype)) in enumerate(zip(outs, step.expected)):
            ns[f"E{k}_{i}"], ns[f"D{k}_{i}"] = shape, dtype
            lines.append(f"    if type({out}) is not ndarray: {out} = asarray({out})")
            lines.append(f"    if {out}.shape != E{k}_{i} or {out}.dtype != D{k}_{i}: "
                         f"_bad_aval({out}, E{k}_{i}, D{k}_{i}, S{k})")
    results = []
    for j, v in enumerate(jaxpr.outvars):
        if isinstance(v, ext_core.Literal):
            ns[f"R{j}"] = v
            results.append(f"_read_literal(R{j})")
        else:
            results.append(local(v))
    lines.append(f"    return [{', '.join(results)}]")
    return "\n".join(lines) + "\n", ns


_programs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _program(jaxpr) -> Callable:
    program = _programs.get(jaxpr)
    if program is None:
        source, ns = program_source(jaxpr)
        exec(compile(source, "<spmdsim: jaxpr>", "exec"), ns)  # noqa: S102 - our own generated code
        program = _programs[jaxpr] = ns["run"]
    return program


def eval_jaxpr(jaxpr, consts, *args) -> list[np.ndarray]:
    """Evaluate ``jaxpr`` (a ``jax.extend.core.Jaxpr``) on NumPy arrays; returns the output arrays.

    The jaxpr is prepared once (rules specialised, pytree calls grouped, see :func:`program_source`); every
    result is checked against the jaxpr's shape and dtype (a mismatch is an spmdsim bug, reported as such).
    Raises NotImplementedError naming the primitive, its parameters and the user's line for a primitive
    without a rule, when it is reached.
    """
    run = _program(jaxpr)
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(None)
    try:
        with np.errstate(all="ignore"):
            return run(stack, *consts, *args)
    finally:
        stack.pop()


def split_closed(jaxpr) -> tuple:
    """(jaxpr, consts) of a ClosedJaxpr; an open Jaxpr (as in remat's params) has no constants."""
    return (jaxpr.jaxpr, jaxpr.consts) if hasattr(jaxpr, "consts") else (jaxpr, ())


def eval_closed_jaxpr(closed, *args) -> list[np.ndarray]:
    return eval_jaxpr(closed.jaxpr, closed.consts, *args)
