"""Both executors' fast path: each jaxpr compiled once into a Python function.

The reference loop (:func:`spmdsim.jax.evaluation._interpreter.eval_jaxpr`) spends most of its time on the environment
dictionary, operand lists and the generic rule call. Here each jaxpr becomes the source of one function, a line
per equation calling the rule with its parameters already bound (or the rule's ``specialize(eqn)`` result) on
local variables, followed by the shape-and-dtype check of each result. About 2.5x faster per equation; the same
rules, the same checks, the same results (the conformance suite runs both and compares them bit for bit). A
program is made per jaxpr and executor kind (for the vectorized executor: per device count, which its literals
and expected shapes carry); the executor itself is an argument of the program (higher-order rules and
``missing`` get the one evaluating).

Equations of pure primitives whose operands are all constants (JAX's gradients emit ``1.0 / n`` broadcast to a
shape) are computed once, by the same rule, when the program is made: their results are constants of the program,
read-only, shared by every call (small ones only).

Collective equations with a user source line bind through a call prepared once per equation
(:func:`spmdsim.primitives._primitives.prepare`: its axis names and parameters worked out in advance, its checks once per
mesh and operand shapes). The equations JAX emits for one collective call on a pytree (``lax.psum((a, b), 'i')``
gives one ``psum`` per leaf, all with the same parameters and source line, none feeding another) are computed
together, in one rendezvous, as the NumPy front end does. Results are the same; a trace shows one collective.
"""
from __future__ import annotations

import functools
import os
import sys
import weakref
from typing import Callable

import numpy as np
from jax import dtypes as jax_dtypes
from jax.extend import core as ext_core

from spmdsim.runtime import _blas, _buffers, _threads

from spmdsim.primitives import _primitives
from spmdsim.jax.evaluation._names import user_name
from spmdsim.jax.evaluation._contraction import contract
from spmdsim.jax.compiled import _fusion
from spmdsim.jax.rules._elementwise import elementwise_vectorized, expand_to
from spmdsim.jax.rules._control_flow import CALLS
from spmdsim.jax.rules._reductions import splits
from spmdsim.jax.evaluation._registry import IN_PLACE, PER_DEVICE, compiled_form
from spmdsim.primitives import _batch
from spmdsim.jax.evaluation import _interpreter
from spmdsim.jax.evaluation._interpreter import (HIGHER_ORDER, Executor, PerDevice, Vectorized, bad_result, eqn_stack,
                                                 ignore_errors, restore_errors, site_of)
from spmdsim.jax.evaluation._interpreter import eval_jaxpr as reference_eval_jaxpr

__all__ = ["eval_jaxpr", "evaluator", "program_source"]


class _Step:
    """One equation (or the equations of one pytree call), prepared once: the function computing it from its
    operands, the operands (literals and constants already NumPy arrays) and every result's expected shape and
    dtype. ``folded``: its results, computed now, when every operand is a constant (see :func:`_fold`)."""

    __slots__ = ("eqns", "eqn", "call", "higher", "nullary", "operands", "outvars", "expected", "multiple",
                 "operands_tuple", "folded")

    def __init__(self, eqns: list, executor: Executor, known: dict):
        self.eqns, self.eqn = eqns, eqns[0]
        eqn = self.eqn
        name = eqn.primitive.name
        self.operands = [(True, executor.literal(v)) if isinstance(v, ext_core.Literal) else
                         (True, known[v]) if v in known else (False, v) for e in eqns for v in e.invars]
        self.outvars = [None if isinstance(v, ext_core.DropVar) else v for e in eqns for v in e.outvars]
        self.expected = [executor.expected(v.aval) for e in eqns for v in e.outvars]
        collective = name in _GROUPABLE and bool(site_of(eqn))  # one bind for every leaf of a pytree call
        self.multiple = eqn.primitive.multiple_results or collective
        self.higher = not collective and name in HIGHER_ORDER  # called with the evaluating executor first
        self.nullary = False
        self.operands_tuple = collective  # the call takes the operands as one tuple
        if collective:
            self.call = _primitives.prepare(name, eqn.params, site=site_of(eqn), api=user_name(eqn))
        elif self.higher:
            self.call = functools.partial(HIGHER_ORDER[name], **eqn.params)
        else:
            rule = executor.rules.get(name)
            specializer = getattr(rule, "specialize", None)
            self.call = specializer(eqn) if specializer is not None else None
            if self.call is None and rule is not None:
                self.call = functools.partial(rule, **eqn.params) if eqn.params else rule
            self.nullary = self.call is not None and not self.operands  # its result goes through ex.nullary
        self.folded = _fold(self) if name in _FOLDABLE and not eqn.effects and self.operands and \
            all(constant for constant, _ in self.operands) and self.call is not None else None


# Primitives whose value depends on their operands alone (no device, executor or effect): an equation of one of
# them whose operands are all constants (literals, or results of such equations; JAX's gradients make them, e.g.
# ``1.0 / 64.0`` broadcast to a shape) is computed once, when its program is made, by the same rule.
_FOLDABLE = {"add", "sub", "mul", "div", "rem", "neg", "max", "min", "pow", "integer_pow", "square", "sqrt",
             "rsqrt", "exp", "log", "log1p", "expm1", "abs", "sign", "floor", "ceil", "round", "tanh", "logistic",
             "and", "or", "not", "xor", "eq", "ne", "lt", "le", "gt", "ge", "select_n", "convert_element_type",
             "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "reduce_sum", "reduce_max",
             "reduce_min", "slice", "concatenate"}
_FOLDED_BYTES = 1 << 16  # larger results are computed at every call, not kept in the program


def _fold(step: _Step) -> list | None:
    """``step``'s results from its constant operands, checked as every evaluation checks them and read-only
    (a program's constants are shared by every call), or None where that fails or the results are large (the
    equation is then computed at every call, as usual, and reports its errors there)."""
    errors = ignore_errors()
    try:
        outs = step.call(*(value for _, value in step.operands))
    except Exception:  # noqa: BLE001 - computed again, and reported, when the program runs
        return None
    finally:
        restore_errors(errors)
    folded = []
    for out, expected in zip(outs if step.multiple else [outs], step.expected, strict=True):
        out = np.asarray(out)
        if expected is None or out.shape != expected[0] or out.dtype != expected[1] or out.nbytes > _FOLDED_BYTES:
            return None
        out = out.view()
        out.flags.writeable = False
        folded.append(out)
    return folded


# Collectives whose operands are independent blocks under one set of parameters (so a pytree call's equations
# can share a rendezvous).
_GROUPABLE = {name for name, prim in _primitives.PRIMITIVES.items() if not prim.joint and name != "psend"}


def _same_call(eqns: list, eqn) -> bool:
    """Whether ``eqn`` continues the pytree call ``eqns``: a collective with the same primitive, parameters and
    user source line, and no operand produced inside the call."""
    first = eqns[0]
    if eqn.primitive is not first.primitive or eqn.primitive.name not in _GROUPABLE:
        return False
    if eqn.params != first.params or not site_of(first) or site_of(eqn) != site_of(first):
        return False
    produced = {v for e in eqns for v in e.outvars}
    return not any(v in produced for v in eqn.invars if not isinstance(v, ext_core.Literal))


def _prepare(jaxpr, executor: Executor) -> tuple[list[_Step], dict]:
    """The steps left to compute when the program runs, and the values of the variables folded into constants."""
    calls: list[list] = []
    for eqn in jaxpr.eqns:
        if calls and _same_call(calls[-1], eqn):
            calls[-1].append(eqn)
        else:
            calls.append([eqn])
    steps, known = [], {}
    for eqns in calls:
        step = _Step(eqns, executor, known)
        if step.folded is None:
            steps.append(step)
        else:
            known.update((v, value) for v, value in zip(step.outvars, step.folded, strict=True) if v is not None)
    return steps, known


def program_source(jaxpr, executor: Executor) -> tuple[str, dict]:
    """The jaxpr as the source of one Python function ``run(stack, ex, *consts, *args)``, and its namespace.

    One line per equation calls the step's prepared function on local variables, then checks each result;
    ``stack[-1]`` holds the equation being computed (for error sites), ``ex`` is the executor evaluating it (an
    executor with ``executor``'s program key). A variable's local is given to a later one once nothing reads it
    any more (constants excepted): a dead value is let go as soon as its local is bound again, and the function's
    frame holds as many locals as the jaxpr has values alive at once, not one per variable (smaller frames: less
    of CPython's frame stack, see :mod:`spmdsim.runtime._stack`).
    """
    jaxpr = contract(jaxpr)  # XLA:CPU's fused multiply-adds (see ._contraction)
    steps, known = _prepare(jaxpr, executor)
    ns: dict = {"ndarray": np.ndarray, "asarray": np.asarray, "bad_result": bad_result}
    last_use = _last_uses(steps, jaxpr)
    returned = {v for v in jaxpr.outvars if not isinstance(v, ext_core.Literal)}
    kept = returned | set(jaxpr.constvars)
    names: dict = {}
    free: list[str] = []  # the locals of dead variables
    dead: set = set()

    def local(var) -> str:
        if var not in names:
            assert var not in dead, f"{var} read after its last use"
            names[var] = free.pop() if free else f"v{len(names) + len(dead)}"
        return names[var]

    def release(variables, step: int) -> None:  # their locals, where nothing reads them after ``step``
        for v in variables:
            if v in names and v not in kept and last_use.get(v, -1) <= step:
                dead.add(v)
                free.append(names.pop(v))

    consts = [local(v) for v in jaxpr.constvars]
    params = [local(v) for v in jaxpr.invars]
    release(jaxpr.invars, -1)  # arguments nothing reads
    lines = ["def run(stack, ex, consts, args, consume):"]
    if consts:
        lines.append(f"    {', '.join(consts)}, = consts")
    if params:
        lines.append(f"    {', '.join(params)}, = args")
    lines.append("    if consume: args.clear()")  # the caller's list held the arguments: now only the locals do
    lines += [f"    {c} = asarray({c})" for c in consts]
    runs = dict(_fusion.fusible_runs(steps, executor)) if FUSION else {}
    inside = {j for start, stop in runs.items() for j in range(start + 1, stop)}
    for k, step in enumerate(steps):
        if k in inside:
            continue
        if k in runs:  # elementwise equations block by block (see ._fusion)
            used_after = {s.eqn.outvars[0] for s in steps[k:runs[k]]
                          if last_use.get(s.eqn.outvars[0], -1) >= runs[k] or s.eqn.outvars[0] in returned}
            dying = {v for v, last in last_use.items() if k <= last < runs[k]}
            fused = ns[f"F{k}"] = _fusion.FusedRun(steps[k:runs[k]], executor, used_after, dying)
            outs = [local(v) for v in fused.outputs]
            call = f"F{k}(stack, {', '.join(local(v) for v in fused.inputs)})"
            lines.append(f"    {', '.join(outs)}, = {call}" if outs else f"    {call}")
            release([*fused.inputs, *fused.outputs], runs[k] - 1)
            continue
        ns[f"E{k}"] = step.eqn
        lines.append(f"    stack[-1] = E{k}")
        operands = []
        for j, (literal, value) in enumerate(step.operands):
            if literal:
                ns[f"L{k}_{j}"] = value
                operands.append(f"L{k}_{j}")
            else:
                operands.append(local(value))
        outs = [local(v) if v is not None else f"_{k}_{i}" for i, v in enumerate(step.outvars)]
        target = (f"{', '.join(outs)}, = " if outs else "") if step.multiple else f"{outs[0]} = "
        if step.call is None:  # no rule here: the executor's fallback (or its NotImplementedError)
            lines.append(f"    {target}ex.missing(E{k}, [{', '.join(operands)}])")
        else:
            dies = bool(step.operands) and not step.operands[0][0] and last_use.get(step.operands[0][1]) == k
            ns[f"C{k}"] = _donating_call(step, executor) if dies else step.call
            into = None if dies and ns[f"C{k}"] is not step.call else _into_dead_call(step, executor, last_use, k)
            if into is not None:  # the dying operand first (see _into_dead)
                ns[f"C{k}"], position = into
                operands.insert(0, operands.pop(position))
            elif ns[f"C{k}"] is step.call:
                ns[f"C{k}"] = _split_call(step, executor) or _stacked_ufunc(step, executor) or step.call
            direct = _direct_call(step)
            if direct is not None:  # a call or a cond: its sub-program called directly (see _SubCall)
                ns[f"C{k}"] = direct
            call = f"C{k}(({', '.join(operands)},))" if step.operands_tuple else \
                f"C{k}({', '.join(['stack'] * (direct is not None) + ['ex'] * step.higher + operands)})"
            lines.append(f"    {target}{f'ex.nullary({call}, {step.multiple})' if step.nullary else call}")
        for i, (out, expected) in enumerate(zip(outs, step.expected, strict=True)):
            if expected is None:  # a token: opaque, not checked
                continue
            ns[f"S{k}_{i}"], ns[f"D{k}_{i}"] = expected
            lines.append(f"    if type({out}) is not ndarray: {out} = asarray({out})")
            lines.append(f"    if {out}.shape != S{k}_{i} or {out}.dtype is not D{k}_{i} and {out}.dtype != D{k}_{i}: "
                         f"bad_result(E{k}, {out}, S{k}_{i}, D{k}_{i})")
        release([*(v for constant, v in step.operands if not constant), *filter(None, step.outvars)], k)
    results = []
    for j, v in enumerate(jaxpr.outvars):
        if isinstance(v, ext_core.Literal):
            ns[f"R{j}"] = v
            results.append(f"ex.literal(R{j})")
        elif v in known:  # a folded constant
            ns[f"R{j}"] = known[v]
            results.append(f"R{j}")
        else:
            results.append(local(v))
    lines.append(f"    return [{', '.join(results)}]")
    return "\n".join(lines) + "\n", ns


def _direct_call(step: _Step) -> "_SubCall | None":
    """For a call (``_control_flow.CALLS``) or a ``cond`` of sub-jaxprs without constants: a :class:`_SubCall`
    of its sub-programs; else None (the step's rule, through the executor)."""
    if not step.higher or len(step.eqns) > 1:
        return None
    name, params = step.eqn.primitive.name, step.eqn.params
    subs = params["branches"] if name == "cond" else [params[CALLS[name]]] if name in CALLS else None
    if subs is None or any(getattr(sub, "consts", ()) for sub in subs):
        return None
    return _SubCall(step.call, [getattr(sub, "jaxpr", sub) for sub in subs], name == "cond")


class _SubCall:
    """A call's sub-jaxpr (or a ``cond``'s branches) evaluated as the step's rule evaluates it -- the executor's
    ``eval_closed`` of the same jaxpr: its compiled program, with a stack entry of its own -- without the rule's
    bookkeeping on every call: the sub-program is looked up once (the calling program is made for one executor
    key, so is it), the error state is already the calling program's, and a ``cond`` in the thread executor takes
    its one branch (``PerDevice.partition``'s clipped index). Where that does not hold -- the vectorized
    executor outside its own batch, a ``cond`` there (devices may split), an observer watching, no compiled
    program -- the rule itself. Each jaxpr costs ~2 µs less per call (numpyro's NUTS: ~140,000 calls per 100 + 100
    iterations of 4 chains)."""

    __slots__ = ("rule", "jaxprs", "cond", "programs")

    def __init__(self, rule: Callable, jaxprs: list, cond: bool):
        self.rule, self.jaxprs, self.cond = rule, jaxprs, cond
        self.programs: list | None = None

    def __call__(self, stack, ex, *operands):
        if _interpreter._observer is not None or (
                type(ex) is not PerDevice if self.cond else
                type(ex) is Vectorized and _batch.current_batch() is not ex.batch):
            return self.rule(ex, *operands)
        programs = self.programs
        if programs is None:
            programs = [_program(jaxpr, ex) for jaxpr in self.jaxprs]
            if None in programs:  # past _PROGRAMS_PER_JAXPR: the reference loop, through the rule
                return self.rule(ex, *operands)
            self.programs = programs
        if self.cond:
            index, *operands = operands
            program = programs[min(max(int(index), 0), len(programs) - 1)]
        else:
            program = programs[0]
        stack.append(None)
        try:
            return program(stack, ex, (), list(operands), False)
        finally:
            stack.pop()


def _last_uses(steps: list[_Step], jaxpr) -> dict:
    """variable -> the index of the last step reading it (variables the program returns: none)."""
    last = {value: k for k, step in enumerate(steps) for constant, value in step.operands if not constant}
    for v in [*jaxpr.outvars, *jaxpr.constvars]:
        if not isinstance(v, ext_core.Literal):
            last.pop(v, None)
    return last


def _donating_call(step: _Step, executor: Executor) -> Callable:
    """The call of ``step``, whose first operand dies at it: for a primitive XLA updates in place (a scatter,
    ``dynamic_update_slice``: ``_registry.IN_PLACE``), one that updates that operand itself when the program holds
    it alone (:func:`_donating`); ``step.call`` otherwise."""
    eqn = step.eqn
    rule = executor.rules.get(eqn.primitive.name)
    if eqn.primitive.name not in IN_PLACE or step.higher or step.operands_tuple or len(step.eqns) > 1 \
            or rule is None or jax_dtypes.issubdtype(eqn.invars[0].aval.dtype, jax_dtypes.extended):
        return step.call
    rule = getattr(rule, "__wrapped__", rule)  # the rule itself (the PRNG-key wrapper: keys are never donated)
    return functools.partial(_donating, step.call, functools.partial(rule, **eqn.params, in_place=True))


def _donating(copying: Callable, in_place: Callable, operand, *rest):
    """``in_place(operand, ...)`` where nothing but the program's dead local holds ``operand`` (its reference
    count is that of such a local, measured once by :func:`_unshared_count`; a view of it, a caller's list, a
    user's variable, a trace would each add one) and it may be written into (:func:`._fusion.writable_alone`);
    else ``copying(operand, ...)``. The results are the same: only the copy is saved."""
    if sys.getrefcount(operand) <= _UNSHARED and _fusion.writable_alone(operand):
        return in_place(operand, *rest)
    return copying(operand, *rest)


_IN_PLACE_ELEMENTS = 1 << 16  # smaller results: a fresh array costs less than the checks


def _into_dead_call(step: _Step, executor: Executor, last_use: dict, k: int) -> tuple[Callable, int] | None:
    """For an equation computed by one NumPy ufunc (its per-device rule's specialization; the vectorized rule
    being that rule on the stacked operands) or by a rule of ``_WRITES_OUT``, with a result of at least
    ``_IN_PLACE_ELEMENTS`` elements and an operand that dies at it: the call :func:`_into_dead` and that operand's
    position, else None."""
    eqn = step.eqn
    if step.higher or step.operands_tuple or len(step.eqns) > 1 or step.multiple or step.call is None \
            or len(step.expected) != 1 or step.expected[0] is None:
        return None
    expected = step.expected[0]
    if np.prod(expected[0]) < _IN_PLACE_ELEMENTS:
        return None
    vectorized = executor.rules is not PER_DEVICE
    if eqn.primitive.name in _WRITES_OUT:
        ufunc = None  # the rule itself, given out=
    else:
        ufunc = _ufunc_of(step, executor)
        if ufunc is None:
            return None
    position = next((j for j, (constant, v) in enumerate(step.operands) if not constant and last_use.get(v) == k),
                    None)
    if position is None:
        return None
    plan = (step.call, position, *expected, len(expected[0]) if vectorized else None)
    return functools.partial(_into_dead, plan, ufunc), position


# Primitives whose rules (both executors') take ``out=``, an array of the result's shape and dtype that may be one
# of the operands: each element (or block) of it is read before it is written.
_WRITES_OUT = {"xla_cpu_fma"}


def _ufunc_of(step: _Step, executor: Executor) -> np.ufunc | None:
    """The NumPy ufunc computing ``step`` (its per-device rule's specialization, one result; in the vectorized
    executor only where its rule is that rule on the stacked operands), or None."""
    eqn = step.eqn
    rule = PER_DEVICE.get(eqn.primitive.name)
    specializer = getattr(rule, "specialize", None)
    ufunc = specializer(eqn) if specializer is not None else None
    if not isinstance(ufunc, np.ufunc) or ufunc.nout != 1 or ufunc.nin != len(step.operands):
        return None
    if executor.rules is not PER_DEVICE and not _stacks(executor.rules.get(eqn.primitive.name), rule):
        return None
    return ufunc


def _split_call(step: _Step, executor: Executor) -> Callable | None:
    """For an equation of the vectorized executor computed by one NumPy ufunc whose result is cut by devices
    (``_reductions.splits``): the call :func:`_split`, else None."""
    if executor.rules is PER_DEVICE or step.higher or step.operands_tuple or len(step.eqns) > 1 \
            or step.multiple or step.call is None or len(step.expected) != 1 or step.expected[0] is None:
        return None
    shape, dtype = step.expected[0]
    if not splits(shape):
        return None
    ufunc = _ufunc_of(step, executor)
    if ufunc is None:
        return None
    try:  # the result NumPy gives these operands is the equation's (else its check reports the rule's own)
        natural = ufunc.resolve_dtypes(tuple(np.dtype(v.aval.dtype) for v in step.eqn.invars) + (None,))[-1]
    except (TypeError, ValueError):
        return None
    return functools.partial(_split, ufunc, shape, dtype) if natural == dtype else None


def _stacked_ufunc(step: _Step, executor: Executor) -> np.ufunc | None:
    """For an equation of the vectorized executor computed by one NumPy ufunc whose operands have one rank (no
    per-device scalar to broadcast as ``(n, 1, ...)``) and whose natural result dtype is the equation's: the ufunc
    itself, called on the stacked operands (what its vectorized rule calls, without that rule's wrapping: small
    operands of a loop pay it at every equation); else None."""
    if executor.rules is PER_DEVICE or step.higher or step.operands_tuple or len(step.eqns) > 1 \
            or step.multiple or step.call is None or len(step.expected) != 1 or step.expected[0] is None:
        return None
    avals = [v.aval for v in step.eqn.invars]
    if not all(hasattr(a, "shape") for a in avals) or len({len(a.shape) for a in avals}) != 1:  # (tokens: none)
        return None
    ufunc = _ufunc_of(step, executor)
    if ufunc is None:
        return None
    try:
        natural = ufunc.resolve_dtypes(tuple(np.dtype(v.aval.dtype) for v in step.eqn.invars) + (None,))[-1]
    except (TypeError, ValueError):
        return None
    return ufunc if natural == step.expected[0][1] else None


def _split(ufunc: np.ufunc, shape: tuple, dtype, *operands, out: np.ndarray | None = None) -> np.ndarray:
    """``ufunc`` over stacked operands (per-device scalars ``(n,)`` broadcast as ``(n, 1, ...)``), its result
    (``shape``, ``dtype``: the equation's) cut along the device axis into one part per CPU
    (:func:`spmdsim.runtime._threads.in_parallel`): NumPy releases the GIL in the ufunc's loop, so the parts run side by
    side. Each element computed from the operands' elements at its index, as in one call: the same values."""
    xs = [expand_to(np.asarray(x), len(shape)) for x in operands]
    if out is None:
        out = _buffers.empty(shape, dtype, faulted=True)
    n = shape[0]

    def part(lo: int, hi: int) -> None:
        ufunc(*(x[lo:hi] if x.ndim and x.shape[0] == n else x for x in xs), out=out[lo:hi])
    _threads.in_parallel(part, n, cpus=_blas.cpus())
    return out


def _stacks(vectorized_rule, rule) -> bool:
    """Whether ``vectorized_rule`` is ``rule`` on the stacked operands (``_elementwise.elementwise_vectorized``)."""
    return getattr(vectorized_rule, "__code__", None) is _STACKED_CODE and \
        vectorized_rule.__closure__[0].cell_contents is rule


_STACKED_CODE = elementwise_vectorized(None).__code__


def _into_dead(plan: tuple, ufunc: np.ufunc | None, operand, *rest):
    """The equation's ufunc written into ``operand``, which dies at it, where nothing but the program's dead
    local holds it (as :func:`_donating` checks) and it has the result's shape and dtype; else the step's call.
    ``rest``: the other operands in order; ``plan``: the step's call, ``operand``'s position, the result's shape
    and dtype, and the vectorized executor's rank (its per-device scalars broadcast as ``(n, 1, ...)``) or None;
    ``ufunc`` None: the step's call given ``out=operand`` (a rule of ``_WRITES_OUT``). The same values either way:
    a ufunc computes each element from the operands' elements at its index, and NumPy buffers an operand that
    overlaps the output otherwise."""
    call, position, shape, dtype, rank = plan
    if sys.getrefcount(operand) <= _UNSHARED and type(operand) is np.ndarray and operand.shape == shape \
            and operand.dtype == dtype and _fusion.writable_alone(operand):
        if ufunc is None:  # a rule of _WRITES_OUT
            return call(*rest[:position], operand, *rest[position:], out=operand)
        if rank is not None:
            if splits(shape):
                return _split(ufunc, shape, dtype, *rest[:position], operand, *rest[position:], out=operand)
            rest = [expand_to(x, rank) for x in rest]
        return ufunc(*rest[:position], operand, *rest[position:], out=operand)
    return call(*rest[:position], operand, *rest[position:])


def _refcount_probe(copying: Callable, in_place: Callable, operand, *rest) -> int:
    return sys.getrefcount(operand)  # in a frame made as _donating's is


class _FusedProbe:
    def __call__(self, stack, *inputs) -> int:
        return sys.getrefcount(inputs[0])  # in a frame made as _fusion.FusedRun's is


def _unshared_count(call: Callable, line: str) -> int:
    """The reference count ``call`` (a probe of :func:`_donating`'s or ``FusedRun``'s form) sees for an array
    held only by a generated program's local ``v0`` that dies at ``line``: measured on a program of that form (it
    depends on the Python version)."""
    ns: dict = {}
    exec(compile(f"def probe(make, call):\n    v0 = make()\n    v1 = {line}\n    return v1\n",  # noqa: S102
                 "<spmdsim: probe>", "exec"), ns)
    return ns["probe"](lambda: np.empty(1), call)


_UNSHARED = _unshared_count(functools.partial(_refcount_probe, None, None), "call(v0, 0)")
_fusion.UNSHARED = _unshared_count(_FusedProbe(), "call(0, v0)")


FUSION = os.environ.get("SPMDSIM_FUSION", "1") != "0"  # chains of elementwise equations block by block (._fusion)
_programs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


_PROGRAMS_PER_JAXPR = 12  # programs per jaxpr (vectorized: one per device count, see _program)


def _program(jaxpr, executor: Executor) -> Callable | None:
    """The compiled program of ``jaxpr`` for ``executor``'s key; None where ``jaxpr`` already has
    ``_PROGRAMS_PER_JAXPR`` programs for other keys (the vectorized executor makes one per device count, and the
    devices of a ``while`` or ``cond`` split into subsets of many counts: those run the reference loop)."""
    programs = _programs.get(jaxpr)
    if programs is None:
        programs = _programs[jaxpr] = {}
    program = programs.get(executor.program_key)
    if program is None:
        if len(programs) >= _PROGRAMS_PER_JAXPR:
            return None
        source, ns = program_source(jaxpr, executor)
        exec(compile(source, "<spmdsim: jaxpr>", "exec"), ns)  # noqa: S102 - our own generated code
        # taken out of its own globals: a cycle (run -> ns -> run) would outlive the jaxpr until the next garbage
        # collection, and with it the arrays its equations close over (test_cond_memory_leak in JAX's tests)
        program = programs[executor.program_key] = ns.pop("run")
    return program


def evaluator(jaxpr, executor: Executor) -> Callable[[list, list], list[np.ndarray]]:
    """``evaluate(consts, args)``: ``jaxpr`` evaluated by its compiled function, looked up once; the same
    results and errors as the reference loop."""
    program = _program(jaxpr, executor)
    if program is None:
        return functools.partial(_reference, jaxpr, executor)
    return functools.partial(_run, program, executor)


def _reference(jaxpr, executor: Executor, consts, args, consume: bool = False) -> list[np.ndarray]:
    return reference_eval_jaxpr(jaxpr, consts, *args, executor=executor)


def eval_jaxpr(jaxpr, consts, args, executor: Executor, consume: bool = False) -> list[np.ndarray]:
    """Evaluate ``jaxpr`` with its compiled function; the same results and errors as the reference loop.
    ``consume``: ``args`` is a list the caller gives up (a loop's carry): emptied once read, so that an argument
    the caller holds nowhere else can be updated in place (see :func:`_donating`)."""
    program = _program(jaxpr, executor)
    if program is None:
        return reference_eval_jaxpr(jaxpr, consts, *args, executor=executor)
    return _run(program, executor, consts, args, consume)


def _run(run: Callable, executor: Executor, consts, args, consume: bool = False) -> list[np.ndarray]:
    stack = eqn_stack()
    stack.append(None)
    errors = ignore_errors()  # XLA computes through overflow and NaN without a warning
    try:
        return run(stack, executor, consts, args, consume)
    finally:
        restore_errors(errors)
        stack.pop()


compiled_form(eval_jaxpr, evaluator)  # the interpreter evaluates through these (see _registry.COMPILED)
