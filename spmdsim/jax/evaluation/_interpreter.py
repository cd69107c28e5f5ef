"""Evaluate a jaxpr with NumPy: one interpreter loop, over one of two kinds of value.

:func:`eval_jaxpr` is the reference evaluation, the shape of autodidax's ``eval_jaxpr``: an environment, then
for each equation read its operands, apply the rule for its primitive, check every result's shape and dtype
against the jaxpr, write the results. An :class:`Executor` says what a value is:

- :class:`PerDevice` (the thread executor): one device's block. Rules come from
  :data:`~spmdsim.jax.evaluation._registry.PER_DEVICE`; a collective meets the other devices' threads in a rendezvous.
- :class:`Vectorized`: every device's block at once, stacked on a leading device axis (the devices of a
  :class:`~spmdsim.primitives._batch.Batch`). Rules come from :data:`~spmdsim.jax.evaluation._registry.VECTORIZED`; a
  collective applies its vectorized form along the device axis.

Higher-order primitives (calls, ``cond``, ``while``, ``scan``, custom derivatives, remat, nested maps) are
written once, in :data:`HIGHER_ORDER`, against the executor's few control-flow methods (which devices take
which branch, and how values are selected and merged). Collective primitives go to
:func:`spmdsim.primitives._primitives.bind` from both executors.

Both executors normally run each jaxpr compiled to a Python function (:mod:`._compiled`); that faster form is
a separate layer, tested equal to this loop on the conformance suite (``executor="reference"`` and
``Vectorized.compiled = False`` select the loop).
"""
from __future__ import annotations

import functools
from typing import Callable, Hashable, Sequence

import numpy as np
from jax.extend import core as ext_core

from spmdsim.primitives import _batch
from spmdsim.runtime._values import error_state_switch
from spmdsim.jax.evaluation import _dtypes, _registry
from spmdsim.jax.evaluation._contraction import contract
from spmdsim.jax.evaluation._unreduced import Unreduced
from spmdsim.jax.evaluation._lowered import lowering_jaxpr

__all__ = ["eval_jaxpr", "eval_closed_jaxpr", "Executor", "PerDevice", "Vectorized", "HIGHER_ORDER",
           "higher_order", "current_site", "site_of", "supported_primitives", "PER_DEVICE", "REFERENCE",
           "observe_equations"]

# name -> rule(executor, *operands, **params): primitives that evaluate sub-jaxprs, written once for both.
HIGHER_ORDER: dict[str, Callable] = {}
# The registry under the names the rule modules use.
IMPL, impl, specialize = _registry.PER_DEVICE, _registry.per_device, _registry.specialize
eqn_stack = _registry.eqn_stack  # the equations being evaluated on this thread, innermost last


# XLA computes through overflow and NaN without a warning: ``token = ignore_errors()`` ... ``restore_errors(token)``.
ignore_errors, restore_errors = error_state_switch(all="ignore")


def higher_order(*names: str):
    """Decorator: ``rule(executor, *operands, **params)`` computes the higher-order primitives ``names``."""
    return _registry.register(HIGHER_ORDER, "higher-order", names)


def supported_primitives() -> list[str]:
    """Every primitive with a per-device rule (the thread executor)."""
    return sorted(set(_registry.PER_DEVICE) | set(HIGHER_ORDER))


def site_of(eqn) -> str:
    """``file:line (function)`` of the user's code that produced ``eqn``; '' for an equation of JAX's own
    code (see :func:`current_site`). Worked out once per equation's source info (a collective needs it at
    every call, for its reports and trace)."""
    try:
        return _summarize(eqn.source_info)
    except Exception:  # noqa: BLE001 - source info is a nicety, never an error
        return "<unknown>"


@functools.lru_cache(maxsize=8192)
def _summarize(source_info) -> str:
    from spmdsim.runtime._reports import cell_names
    from spmdsim.jax._internals import source_info_util
    return cell_names(source_info_util.summarize(source_info))  # a notebook cell's line: ``In [3], line 2 (f)``


def current_site() -> str:
    """``file:line (function)`` of the user's code that produced the equation being evaluated. Equations
    inside JAX's own functions (``jnp.cumsum`` is a jit) have no user frame: the enclosing call's line is
    used."""
    for eqn in reversed(eqn_stack()):
        site = site_of(eqn) if eqn is not None else ""
        if site:
            return site
    return "<unknown>"


def missing_rule(eqn, executor: "Executor"):
    raise NotImplementedError(
        f"spmdsim has no {executor.kind} rule for primitive {eqn.primitive.name!r} (params {dict(eqn.params)}), "
        f"used at {current_site()}. Supported primitives: spmdsim.jax.supported_primitives().")


def bad_result(eqn, value, shape, dtype):
    raise AssertionError(
        f"spmdsim bug: the NumPy rule for primitive {eqn.primitive.name!r} returned "
        f"{np.asarray(value).dtype}{list(np.shape(value))}, but the jaxpr says {dtype}{list(shape)} (equation "
        f"from {current_site()}; params {dict(eqn.params)}). Please report it.")


def read_literal(lit) -> np.ndarray:
    return np.asarray(lit.val, dtype=_dtypes.numpy_dtype(lit.aval.dtype))


class Executor:
    """What a value of the jaxpr is while it is evaluated (see the module docstring), and the operations the
    higher-order rules need: which devices take which ``cond`` branch or stay in a ``while`` loop, and how
    values of a subset of devices are taken and put back."""

    kind = "?"
    rules: dict
    program_key: Hashable = None  # executors with equal keys run the same compiled programs (see ._compiled)

    def literal(self, lit) -> np.ndarray:
        raise NotImplementedError

    def expected(self, aval) -> tuple[tuple, np.dtype]:
        raise NotImplementedError

    def eval_jaxpr(self, jaxpr, consts, args, consume: bool = False) -> list:
        """``consume``: ``args`` is a list the caller gives up (a loop's carry), see ``._compiled.eval_jaxpr``."""
        return eval_jaxpr(jaxpr, consts, *args, executor=self)

    def evaluator(self, jaxpr) -> Callable[[Sequence, Sequence], list]:
        """``evaluate(consts, args)``: :meth:`eval_jaxpr` of ``jaxpr``, with what can be looked up once looked up
        (a map's body is evaluated once per device)."""
        return functools.partial(self.eval_jaxpr, jaxpr)

    def eval_closed(self, closed, args, consume: bool = False) -> list:
        """A sub-jaxpr (a ClosedJaxpr, or an open Jaxpr without constants as in remat's params)."""
        if hasattr(closed, "consts"):
            return self.eval_jaxpr(closed.jaxpr, closed.consts, args, consume)
        return self.eval_jaxpr(closed, (), args, consume)

    def apply(self, eqn, operands: list):
        if self is PER_DEVICE or self is REFERENCE:  # values outside maps may be unreduced (see ._unreduced)
            from spmdsim.jax.evaluation import _unreduced
            if _unreduced.involved(eqn, operands):
                return _unreduced.apply(self, eqn, operands, self._apply, eval_jaxpr)
        return self._apply(eqn, operands)

    def _apply(self, eqn, operands: list):
        name = eqn.primitive.name
        rule = HIGHER_ORDER.get(name)
        if rule is not None:
            return rule(self, *operands, **eqn.params)
        rule = self.rules.get(name)
        if rule is None:
            return self.missing(eqn, operands)
        return rule(*operands, **eqn.params)

    def missing(self, eqn, operands):
        """The results of ``eqn``, whose primitive has no rule here: the JAX program its lowering is made of
        (:mod:`._lowered`), else NotImplementedError."""
        if not eqn.outvars and not eqn.effects:  # nothing to compute: JAX's DCE drops it before XLA sees it
            return []
        closed = lowering_jaxpr(eqn)
        if closed is None:
            missing_rule(eqn, self)
        outs = self.eval_closed(closed, operands)
        return outs if eqn.primitive.multiple_results else outs[0]

    def nullary(self, out, multiple: bool):
        """The result(s) of a rule that took no operands, as this executor's values."""
        return out

    def diverged(self, calls: list, went_on: list, where: str) -> None:
        """Devices that this executor split (``cond``, ``while``) reached collectives apart: ``calls`` as in
        :class:`~spmdsim.primitives._batch.Diverged`, ``went_on``: ``(selection, what they did)`` for the others,
        ``where``: the construct that split them. Raises (only the vectorized executor gets here)."""
        raise AssertionError("unreachable: only the vectorized executor splits devices")

    # -- control flow: a selection is None (every device) or what :meth:`partition` returned ------------

    def partition(self, index, count: int) -> list[tuple[int, object]]:
        """``[(value, selection)]``: the devices whose ``index`` (clipped to ``0..count-1``) has each value."""
        raise NotImplementedError

    def subset(self, selection) -> "Executor":
        return self

    def select(self, x, selection):
        return x

    def merge(self, whole, part, selection):
        """``whole`` (or None) with the devices of ``selection`` replaced by ``part``."""
        return part

    def scanned(self, x, i: int):
        """Element ``i`` of the leading (scanned) axis of ``x``."""
        raise NotImplementedError

    def stacked_buffer(self, aval, length: int) -> np.ndarray:
        """An empty array for ``length`` scan outputs of ``aval``."""
        raise NotImplementedError

    def put_scanned(self, buffer, i: int, value) -> None:
        raise NotImplementedError


class PerDevice(Executor):
    """Values are one device's blocks; rules from ``PER_DEVICE``. ``compiled``: evaluate every jaxpr through
    its compiled Python function (:mod:`._compiled`) instead of the reference loop."""

    def __init__(self, compiled: bool):
        self.compiled = compiled
        self.kind = "per-device"
        self.rules = _registry.PER_DEVICE
        self.program_key = "per-device"

    def literal(self, lit):
        return read_literal(lit)

    def expected(self, aval):
        return _dtypes.numpy_shape_dtype(aval)

    def eval_jaxpr(self, jaxpr, consts, args, consume: bool = False):
        if self.compiled and _observer is None:
            return _registry.COMPILED.eval_jaxpr(jaxpr, consts, args, self, consume)
        return eval_jaxpr(jaxpr, consts, *args, executor=self)

    def evaluator(self, jaxpr):
        if not self.compiled:
            return super().evaluator(jaxpr)
        fast = _registry.COMPILED.evaluator(jaxpr, self)

        def evaluate(consts, args):  # the reference loop while an observer watches (see observe_equations)
            return fast(consts, args) if _observer is None else eval_jaxpr(jaxpr, consts, *args, executor=self)
        return evaluate

    def partition(self, index, count):
        return [(min(max(int(index), 0), count - 1), None)]

    def scanned(self, x, i):
        return x[i]

    def stacked_buffer(self, aval, length):
        shape, dtype = _dtypes.numpy_shape_dtype(aval)
        return np.empty((length, *shape), dtype)

    def put_scanned(self, buffer, i, value):
        buffer[i] = value


class Vectorized(Executor):
    """Values carry every device of ``batch`` on a leading axis; rules from ``VECTORIZED``. Each jaxpr runs
    through its compiled Python function (:mod:`._compiled`) while ``compiled`` is true (the class's default;
    not for a subset of the devices, see :meth:`subset`), through the reference loop otherwise."""

    kind = "vectorized"
    compiled = True

    def __init__(self, batch: _batch.Batch):
        self.batch = batch
        self.rules = _registry.VECTORIZED
        self.n = batch.count if batch.ids is None else len(batch.ids)
        self.program_key = ("vectorized", self.n)  # literals and expected shapes carry the device axis

    def literal(self, lit):
        value = read_literal(lit)
        return np.broadcast_to(value, (self.n, *value.shape))

    def expected(self, aval):
        found = _dtypes.numpy_shape_dtype(aval)
        return None if found is None else ((self.n, *found[0]), found[1])

    def eval_jaxpr(self, jaxpr, consts, args, consume: bool = False):
        with _batch.vectorized_batch(self.batch):
            consts = [np.broadcast_to(np.asarray(c), (self.n, *np.shape(c))) for c in consts]
            if self.compiled and _observer is None:
                return _registry.COMPILED.eval_jaxpr(jaxpr, consts, args, self, consume)
            return eval_jaxpr(jaxpr, consts, *args, executor=self)

    def apply(self, eqn, operands: list):
        out = super().apply(eqn, operands)
        if not operands and eqn.primitive.name in self.rules:
            return self.nullary(out, eqn.primitive.multiple_results)
        return out

    def nullary(self, out, multiple):
        """A nullary rule's value is the same on every device."""
        if multiple:
            return [np.broadcast_to(o, (self.n, *np.shape(o)[1:])) for o in out]
        return np.broadcast_to(out, (self.n, *np.shape(out)[1:]))

    def missing(self, eqn, operands):
        """A per-device side effect (``jax.debug.print``/``callback``: no vectorized form on purpose) runs device
        by device, in device order (a device that raises is named, as in the thread executor); any other
        primitive without a vectorized rule as :meth:`Executor.missing` says."""
        rule = _registry.PER_DEVICE.get(eqn.primitive.name)
        if rule is None or eqn.primitive.name not in _PER_DEVICE_SIDE_EFFECTS:
            return super().missing(eqn, operands)
        outs = self.batch.per_device(lambda d: rule(*(x[d] for x in operands), **eqn.params))
        if eqn.primitive.multiple_results:
            return [np.stack([np.asarray(o[k]) for o in outs]) for k in range(len(eqn.outvars))]
        return np.stack([np.asarray(o) for o in outs])

    def diverged(self, calls, went_on, where):
        self.batch.diverged(calls, [(self.batch.subset(selection).ids, what) for selection, what in went_on], where)

    def partition(self, index, count):
        index = np.asarray(index)
        if index.size and index.ndim == 1 and (index.dtype.kind in "bi" or index.dtype.kind == "u" and
                                               index.dtype.itemsize < 8):  # every device alike (the usual case)
            first = index[0]
            if (index == first).all():
                return [(min(max(int(first), 0), count - 1), None)]
        index = np.clip(index.astype(np.int64), 0, count - 1)
        values = np.unique(index)
        if len(values) == 1:
            return [(int(values[0]), None)]
        return [(int(v), index == v) for v in values]

    def subset(self, selection):
        """The devices of ``selection``, evaluated as this executor evaluates (a compiled program is made per
        device count; past a few counts per jaxpr, the reference loop: see ``._compiled``)."""
        if selection is None:
            return self
        sub = Vectorized(self.batch.subset(selection))
        sub.compiled = self.compiled
        return sub

    def select(self, x, selection):
        return x if selection is None else x[selection]

    def merge(self, whole, part, selection):
        if selection is None:
            return part
        if whole is None:
            whole = [np.empty((self.n, *p.shape[1:]), p.dtype) for p in part]
        else:
            whole = [np.array(w) for w in whole]
        for w, p in zip(whole, part, strict=True):
            w[selection] = p
        return whole

    def scanned(self, x, i):
        return x[:, i]

    def stacked_buffer(self, aval, length):
        shape, dtype = _dtypes.numpy_shape_dtype(aval)
        return np.empty((self.n, length, *shape), dtype)

    def put_scanned(self, buffer, i, value):
        buffer[:, i] = value


# Per-device rules that the vectorized executor runs device by device: side effects per device.
_PER_DEVICE_SIDE_EFFECTS = {"debug_print", "debug_callback"}

PER_DEVICE = PerDevice(compiled=True)
REFERENCE = PerDevice(compiled=False)

# observer(executor, eqn, operands, results), called by the reference loop after each equation, in the thread
# that evaluated it; while one is set, every executor evaluates through the reference loop (see observe_equations).
_observer: Callable | None = None


class observe_equations:
    """For the block, ``observer(executor, eqn, operands, results)`` sees every equation that spmdsim evaluates
    (in every map, every device's thread, nested jaxprs included) right after its rule ran; the compiled form
    is set aside meanwhile, so each equation is seen on its own. One observer at a time (``spmdsim.compare``)."""

    def __init__(self, observer: Callable):
        self.observer = observer

    def __enter__(self):
        global _observer
        if _observer is not None:
            raise RuntimeError("observe_equations: another observer is already watching the equations.")
        _observer = self.observer
        return self

    def __exit__(self, *exc):
        global _observer
        _observer = None


def eval_jaxpr(jaxpr, consts, *args, executor: Executor | None = None) -> list[np.ndarray]:
    """Evaluate ``jaxpr`` (a ``jax.extend.core.Jaxpr``) on NumPy arrays; returns the output arrays.

    The reference loop. ``executor`` (default: one device's values, rules from ``PER_DEVICE``) says what the
    values are. Every result is checked against the jaxpr's shape and dtype (a mismatch is an spmdsim bug,
    reported as such). Raises NotImplementedError naming the primitive, its parameters and the user's line for
    a primitive without a rule, when it is reached.
    """
    ex = executor if executor is not None else REFERENCE
    jaxpr = contract(jaxpr)  # XLA:CPU's fused multiply-adds (see ._contraction)
    env: dict = {}

    def read(v):
        return ex.literal(v) if isinstance(v, ext_core.Literal) else env[v]

    def write(v, value):
        if not isinstance(v, ext_core.DropVar):
            env[v] = value

    for v, value in zip(jaxpr.constvars, consts, strict=True):
        write(v, np.asarray(value))
    for v, value in zip(jaxpr.invars, args, strict=True):
        write(v, value)
    stack = eqn_stack()
    stack.append(None)
    errors = ignore_errors()  # XLA computes through overflow and NaN without a warning
    try:
        for eqn in jaxpr.eqns:
            stack[-1] = eqn
            operands = [read(v) for v in eqn.invars]
            outs = ex.apply(eqn, operands)
            outs = outs if eqn.primitive.multiple_results else [outs]
            for v, value in zip(eqn.outvars, outs, strict=True):
                expected = ex.expected(v.aval)
                if expected is not None and type(value) is Unreduced:  # partials outside maps
                    if value.shape != expected[0] or value.dtype != expected[1]:
                        bad_result(eqn, value.partials[0], *expected)
                elif expected is not None:  # None: a token
                    if type(value) is not np.ndarray:
                        value = np.asarray(value)
                    if value.shape != expected[0] or value.dtype != expected[1]:
                        bad_result(eqn, value, *expected)
                write(v, value)
            if _observer is not None:
                _observer(ex, eqn, operands, outs)
    finally:
        restore_errors(errors)
        stack.pop()
    return [read(v) for v in jaxpr.outvars]


def eval_closed_jaxpr(closed, *args, executor: Executor | None = None) -> list[np.ndarray]:
    """:func:`eval_jaxpr` of a ``ClosedJaxpr`` (its constants included)."""
    return eval_jaxpr(closed.jaxpr, closed.consts, *args, executor=executor)
