"""The rule tables of the JAX front end: what each primitive computes, keyed by the primitive's name.

Two tables, one per executor, each a plain dict (the shape of autodidax's ``impl_rules``):

- ``PER_DEVICE[name](*operands, **params)`` computes one equation on one device's values: NumPy arrays in,
  one array out (a list of arrays for primitives with several results). The equation's parameters arrive
  under JAX's own names.
- ``VECTORIZED[name](*operands, **params)`` computes the same equation for every device at once: each
  operand carries a leading device axis (the same size N for all; literals are broadcast to it), and so does
  every result. ``VECTORIZED[name](*xs)[d]`` must equal ``PER_DEVICE[name](*(x[d] for x in xs))`` bit for
  bit.

Rules never modify their operands (they may be read-only views shared between devices) and return exactly
the dtype the jaxpr declares (the interpreter checks every result's shape and dtype). A per-device rule may
carry ``rule.specialize(eqn) -> fn(*operands) | None``: a function with everything the equation fixes worked
out once per jaxpr (see :func:`specialize`).

Both executors record, per thread, the equation whose rule they are calling (:func:`eqn_stack`): for error
sites, and for the few rules whose operands do not say all they need (a key's PRNG impl).
"""
from __future__ import annotations

import threading
from typing import Callable

__all__ = ["PER_DEVICE", "VECTORIZED", "IN_PLACE", "per_device", "vectorized", "specialize", "register", "COMPILED",
           "compiled_form"]

PER_DEVICE: dict[str, Callable] = {}
VECTORIZED: dict[str, Callable] = {}
# Primitives whose rules (both kinds) take ``in_place=True``: the result written into the first operand instead of a
# copy of it, as XLA updates a buffer in place. The compiled evaluator passes it only for an operand the program
# owns alone and that dies at the equation (see ._compiled).
IN_PLACE: set[str] = set()


def register(table: dict, kind: str, names: tuple[str, ...]):
    """Decorator: put the rule it decorates in ``table`` under ``names`` (a second rule for a name is a bug)."""
    def register(rule):
        for name in names:
            assert name not in table, f"duplicate {kind} rule for primitive {name!r}"
            table[name] = rule
        return rule
    return register


def per_device(*names: str):
    """Decorator: ``rule`` computes primitives ``names`` on one device's operands."""
    return register(PER_DEVICE, "per-device", names)


def vectorized(*names: str):
    """Decorator: ``rule`` computes primitives ``names`` for all devices at once (leading device axis)."""
    return register(VECTORIZED, "vectorized", names)


def specialize(specializer):
    """Decorator for a per-device rule: attach ``specializer(eqn) -> fn(*operands) | None``."""
    def attach(rule):
        rule.specialize = specializer
        return rule
    return attach


_local = threading.local()


def eqn_stack() -> list:
    """The equations being evaluated on this thread, innermost last (None while between equations)."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


class CompiledForm:
    """Where the interpreter finds the compiled form of jaxprs: :mod:`spmdsim.jax.compiled._compiled`, a layer on the
    interpreter (it imports the interpreter, never the reverse), puts its two entry points here when it is
    imported (:func:`compiled_form`; ``spmdsim.jax`` imports it with the front end)."""

    def eval_jaxpr(self, jaxpr, consts, args, executor, consume: bool = False) -> list:
        raise AssertionError("spmdsim bug: spmdsim.jax.compiled._compiled was not imported")

    def evaluator(self, jaxpr, executor) -> Callable:
        raise AssertionError("spmdsim bug: spmdsim.jax.compiled._compiled was not imported")


COMPILED = CompiledForm()


def compiled_form(eval_jaxpr: Callable, evaluator: Callable) -> None:
    """Install the compiled form's ``eval_jaxpr(jaxpr, consts, args, executor, consume=False)`` and ``evaluator(jaxpr,
    executor)``: what :data:`COMPILED` calls from then on."""
    COMPILED.eval_jaxpr, COMPILED.evaluator = eval_jaxpr, evaluator
