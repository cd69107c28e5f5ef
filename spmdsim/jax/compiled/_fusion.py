"""Chains of elementwise equations evaluated a cache-sized block at a time, as XLA:CPU fuses them into one loop.

NumPy computes each primitive in one pass over memory with a fresh result: ``gelu(x) = 0.5 * x * (1 + tanh(...))``
on a million elements is a dozen passes through main memory, where XLA runs one loop. In the compiled form
(:mod:`._compiled`), a run of consecutive elementwise equations over arrays of one shape (at least
``MIN_ELEMENTS``) becomes one step: for each block of about ``BLOCK`` elements (a range of one axis, every index
of the axes before it), every equation of the run is computed on that block, by the same per-device rule, and the
run's results that are used after it are written into their arrays. Intermediate values never leave the cache.

Every element's result is the same: the rules are elementwise (an element's result depends only on the same
element of the operands), so cutting the arrays into blocks changes nothing but where the work happens. Each
result is checked, per block, against the jaxpr's dtype and the block's shape, and an error names the equation
being computed, as in the unfused program. Operands of another shape (a per-device scalar in the vectorized
executor, a row that broadcasts) end a run; JAX makes broadcasts explicit (``broadcast_in_dim``), whose results
are views that a block slices without copying.
"""
from __future__ import annotations

import functools
import itertools
import math
import sys

import numpy as np
from jax import dtypes as jax_dtypes
from jax.extend import core as ext_core

from spmdsim.runtime import _buffers, _threads
from spmdsim.jax.evaluation._interpreter import PER_DEVICE, bad_result, read_literal

__all__ = ["FUSIBLE", "fusible_runs", "FusedRun", "writable_alone"]

# Primitives whose per-device rule is elementwise, one result of the operands' shape: fused where their operands
# all have the run's shape (or are single values).
FUSIBLE = frozenset({
    "add", "add_any", "sub", "mul", "div", "neg", "max", "min", "abs", "sign", "square", "sqrt", "rsqrt", "cbrt",
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "erf", "erfc", "erf_inv", "sin", "cos", "tan",
    "integer_pow", "pow", "select_n", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor",
    "convert_element_type", "xla_cpu_fma", "floor", "ceil", "round", "is_finite", "clamp", "copy", "copy_p",
    "stop_gradient",
})
UNSHARED = 0  # the reference count of an array only a program's dead local holds (set by ._compiled)
MIN_ELEMENTS = 1 << 18   # a run over fewer elements is left to the unfused program (its Python would dominate)
BLOCK = 1 << 14          # elements per block: every intermediate of a run stays in a core's cache


def _run_shape(step, executor):
    """The shape of the arrays ``step`` (a prepared equation of ._compiled) computes if it may join a run, else
    None: a fusible primitive whose operands are literals, single values, or arrays of its result's shape."""
    eqn = step.eqn
    if len(step.eqns) > 1 or step.higher or step.operands_tuple or step.call is None \
            or eqn.primitive.name not in FUSIBLE or eqn.primitive.multiple_results or eqn.effects \
            or len(eqn.outvars) != 1 or step.expected[0] is None:
        return None
    shape = step.expected[0][0]
    if math.prod(shape) < MIN_ELEMENTS or any(jax_dtypes.issubdtype(v.aval.dtype, jax_dtypes.extended)
                                              for v in (*eqn.invars, *eqn.outvars)):
        return None
    for (constant, value), v in zip(step.operands, eqn.invars, strict=True):
        if isinstance(v, ext_core.Literal):
            continue
        found = np.shape(value) if constant else (executor.expected(v.aval) or (None,))[0]
        if found is None or found != shape and not (math.prod(found) == 1 and len(found) <= len(shape)):
            return None
    return shape


def fusible_runs(steps: list, executor) -> list[tuple[int, int]]:
    """``(start, stop)`` index ranges of ``steps`` to evaluate as one :class:`FusedRun` (two steps or more over
    arrays of one shape)."""
    runs, start, shape = [], None, None
    for k, step in enumerate([*steps, None]):
        this = _run_shape(step, executor) if step is not None else None
        if this is not None and this == shape:
            continue
        if start is not None and k - start >= 2:
            runs.append((start, k))
        start, shape = (k, this) if this is not None else (None, None)
    return runs


class FusedRun:
    """``run(stack, *inputs) -> [outputs]``: the steps of one run, block by block (see the module docstring).
    ``inputs`` are the values of ``self.inputs`` (variables defined before the run), ``outputs`` the values of
    ``self.outputs`` (variables of the run used after it)."""

    def __init__(self, steps: list, executor, used_after: set, dying: set = frozenset()):
        self.shape = steps[0].expected[0][0]
        produced = {step.eqn.outvars[0] for step in steps}
        self.inputs: list = []
        # per equation: (eqn, call, operands, dtype); an operand is ("in", index of an input), ("env", a variable of
        # the run), ("block", a constant array of the run's shape, sliced per block) or ("value", a single value)
        plan = []
        for step in steps:
            eqn = step.eqn
            operands = []
            for (constant, value), v in zip(step.operands, eqn.invars, strict=True):
                if isinstance(v, ext_core.Literal):
                    operands.append(("value", read_literal(v)))  # a scalar: the per-device rules broadcast it
                elif constant:  # a folded constant: of the run's shape, or a single value
                    operands.append(("block", value) if np.shape(value) == self.shape
                                    else ("value", np.reshape(value, ())))
                elif v in produced:
                    operands.append(("env", v))
                else:
                    if v not in self.inputs:
                        self.inputs.append(v)
                    operands.append(("in", self.inputs.index(v)))
            rule = PER_DEVICE.rules[eqn.primitive.name]
            specializer = getattr(rule, "specialize", None)
            call = specializer(eqn) if specializer is not None else None
            if call is None:
                call = functools.partial(rule, **eqn.params) if eqn.params else rule
            plan.append((eqn, call, operands, step.expected[0][1]))
        self.plan = plan
        self.outputs = [step.eqn.outvars[0] for step in steps if step.eqn.outvars[0] in used_after]
        self.output_dtypes = {step.eqn.outvars[0]: step.expected[0][1] for step in steps}
        self.blocks = _blocks(self.shape)
        # the last output may be written into an input of its dtype that dies in the run (see __call__)
        last_dtype = self.output_dtypes[self.outputs[-1]] if self.outputs else None
        self.reusable = [k for k, v in enumerate(self.inputs)
                         if v in dying and executor.expected(v.aval) == (self.shape, last_dtype)]

    def __call__(self, stack, *inputs):
        # An input that dies in the run, held by nothing but the program's dead local (as _compiled._donating
        # checks), holds the last output: each block of it is written after every equation of that block has read
        # it (and the other outputs have been written), and no later block reads it. Else a fresh array.
        reused = next((inputs[k] for k in self.reusable if sys.getrefcount(inputs[k]) <= UNSHARED
                       and writable_alone(inputs[k])), None)
        outputs = {v: _buffers.empty(self.shape, self.output_dtypes[v]) for v in self.outputs[:-1 if reused is not None
                                                                                            else None]}
        if reused is not None:
            outputs[self.outputs[-1]] = reused
        whole = [x if np.shape(x) == self.shape else None for x in inputs]
        # else a single value (size 1, of rank up to the run's), passed 0-d: a block may have fewer axes than the run
        # (an index of its leading axes), and a (1, 1, 1) operand would add axes to a block's result
        single = [np.reshape(x, ()) if w is None else None for x, w in zip(inputs, whole, strict=True)]
        with _threads.one_at_a_time():  # (in a device thread)
            self._blocks_into(outputs, stack, whole, single)
        return [outputs[v] for v in self.outputs]

    def _blocks_into(self, outputs: dict, stack, whole: list, single: list) -> None:
        """Every equation of the run on each block, the run's outputs written into ``outputs``' arrays."""
        for block, block_shape in self.blocks:
            env = {}
            for eqn, call, operands, dtype in self.plan:
                args = []
                for kind, what in operands:
                    if kind == "in":
                        args.append(whole[what][block] if whole[what] is not None else single[what])
                    elif kind == "env":
                        args.append(env[what])
                    elif kind == "block":
                        args.append(what[block])
                    else:
                        args.append(what)
                stack[-1] = eqn
                out = call(*args)
                if type(out) is not np.ndarray:
                    out = np.asarray(out)
                if out.dtype != dtype or out.shape != block_shape:
                    bad_result(eqn, out, block_shape, dtype)
                env[eqn.outvars[0]] = out
            for v, array in outputs.items():
                array[block] = env[v]


def writable_alone(x) -> bool:
    """Whether ``x``, which only a program's dead local holds (the caller checked its reference count), may be
    written into: a writable C-contiguous NumPy array that owns its memory, or the one view of all of an array
    that nothing else holds (a product's result reshaped; an aligned array of :func:`spmdsim.runtime._buffers.empty`)."""
    if type(x) is not np.ndarray or not x.flags.writeable or not x.flags.c_contiguous:
        return False
    base = x.base
    return base is None or type(base) is np.ndarray and base.base is None \
        and base.nbytes in (x.nbytes, x.nbytes + _buffers.ALIGNMENT) \
        and sys.getrefcount(base) <= 3 + _buffers.kept_by_pool(base)  # x's, this local's, the call's, the pool's


def _blocks(shape: tuple) -> list[tuple[tuple, tuple]]:
    """(index, block shape) pairs cutting ``shape`` into blocks of about ``BLOCK`` elements: a range of one axis,
    every index of the axes before it (row-major)."""
    axis = next((a for a in range(len(shape)) if math.prod(shape[a + 1:]) <= BLOCK), len(shape) - 1)
    step = max(1, BLOCK // max(1, math.prod(shape[axis + 1:])))
    return [((*index, slice(start, start + step)), (min(step, shape[axis] - start), *shape[axis + 1:]))
            for index in itertools.product(*(range(n) for n in shape[:axis])) for start in range(0, shape[axis], step)]
