"""Results written into dying operands (issue 27): an elementwise equation computed by one NumPy ufunc writes its
result into an operand of its shape and dtype that dies at it and that only the program holds, and a fused run of
elementwise equations writes its last output into such an input (``spmdsim.jax.compiled._compiled._into_dead``,
``_fusion.FusedRun``). Expected values are the reference loop's (no compiled program, no reuse) bit for bit; the
user's arrays and every value still in use must come out unchanged, and the paths must be taken."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spmdsim.jax as sj
from spmdsim.runtime import _buffers
from spmdsim.jax.compiled import _compiled, _fusion
from spmdsim.jax.evaluation._interpreter import Vectorized

pytestmark = pytest.mark.area("performance: results into dying operands")

EXECUTORS = ["threads", "vectorized"]
SHAPE = (2, 320, 1024)  # per device 320 x 1024: above both size thresholds


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -0.0, 1e-40, -1e-40]
    return x, rng.standard_normal(SHAPE).astype(np.float32)


def _program(x, y):
    eye = jnp.eye(1024, dtype=x.dtype)
    a = jnp.dot(x, eye)   # fresh, the program's alone
    b = a * y             # one equation between products: written into a, which dies there
    c = jnp.tanh(jnp.dot(b, eye)) - y  # a fused run whose input (the product) dies in it
    d = x + c             # x is the caller's
    e = jax.lax.stop_gradient(d) * 2.0 + d  # d read twice
    return e, x * 1.0, jnp.sum(c)


class _CountingEmpty:
    """``spmdsim.runtime._buffers``, counting the arrays its ``empty`` makes (a fused run's outputs)."""

    def __init__(self):
        self.count = 0

    def __getattr__(self, name):
        return getattr(_buffers, name)

    def empty(self, *args, **kwargs):
        self.count += 1
        return _buffers.empty(*args, **kwargs)


def _reference(executor: str, x, y) -> list[np.ndarray]:
    """The reference loop's results (no compiled program: nothing written into an operand)."""
    if executor == "threads":
        return [np.asarray(o) for o in sj.pmap(_program, executor="reference")(x, y)]
    saved, Vectorized.compiled = Vectorized.compiled, False
    try:
        return [np.asarray(o) for o in sj.pmap(_program, executor="vectorized")(x, y)]
    finally:
        Vectorized.compiled = saved


@pytest.mark.parametrize("executor", EXECUTORS)
def test_results_equal_the_reference_loops_and_inputs_are_kept(executor, monkeypatch):
    taken = {"ufunc": 0, "fused": 0}
    find = _compiled._into_dead_call

    def counted(step, executor, last_use, k):  # the ufunc is called only where the result goes into the operand
        found = find(step, executor, last_use, k)
        if found is None:
            return None
        call, position = found
        ufunc = call.args[1]

        def counting(*args, **kwargs):
            taken["ufunc"] += 1
            return ufunc(*args, **kwargs)
        return functools.partial(call.func, call.args[0], counting), position
    monkeypatch.setattr(_compiled, "_into_dead_call", counted)
    empties = _CountingEmpty()
    monkeypatch.setattr(_fusion, "_buffers", empties)

    x, y = _data()
    x0, y0 = x.copy(), y.copy()
    got = [np.asarray(o) for o in sj.pmap(_program, executor=executor)(x, y)]
    for g, r in zip(got, _reference(executor, x, y), strict=True):
        assert g.tobytes() == r.tobytes()
    assert x.tobytes() == x0.tobytes() and y.tobytes() == y0.tobytes()
    np.testing.assert_array_equal(got[1], x)
    fresh = empties.count
    monkeypatch.setattr(_fusion, "UNSHARED", 0)  # no input may hold an output: one more fresh array per run
    again = [np.asarray(o) for o in sj.pmap(_program, executor=executor)(x, y)]
    assert [a.tobytes() for a in again] == [g.tobytes() for g in got]
    assert taken["ufunc"] > 0 and 0 < fresh < empties.count - fresh


def test_executors_agree_bit_for_bit():
    outs = {ex: [np.asarray(o) for o in sj.pmap(_program, executor=ex)(*_data(1))] for ex in EXECUTORS}
    for a, b in zip(outs["threads"], outs["vectorized"], strict=True):
        assert a.tobytes() == b.tobytes()


def test_a_shared_operand_is_not_written_into():
    """A value the caller holds too (a closed-over array) or a view of one is never an output buffer."""
    x, y = _data(2)
    kept = x.copy()
    out = np.asarray(sj.pmap(lambda a: (a + 3.0) * 2.0, executor="vectorized")(x))
    np.testing.assert_array_equal(out, (kept + np.float32(3.0)) * np.float32(2.0))
    assert x.tobytes() == kept.tobytes()


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_fused_multiply_add_writes_into_an_operand_that_dies(executor, monkeypatch):
    """XLA:CPU's contracted ``a * 0.5 + y`` (``xla_cpu_fma``) writes into the product ``a``, which dies there and
    only the program holds; the caller's ``y`` is never written. Bit for bit the reference loop's result."""
    from spmdsim.jax.numerics import _xla_cpu_math
    into = []
    rounded_once = _xla_cpu_math.rounded_once

    def counted(*args, out=None, **kwargs):
        into.append(out is not None and any(np.shares_memory(out, a) for a in args))
        return rounded_once(*args, out=out, **kwargs)
    monkeypatch.setattr(_xla_cpu_math, "rounded_once", counted)

    def program(x, y):  # products between the multiply-adds: each its own equation, not a fused run
        eye = jnp.eye(1024, dtype=x.dtype)
        b = jnp.dot(x, eye) * 0.5 + y
        return jnp.dot(b, eye), y * 0.25 + x

    x, y = _data(3)
    x0, y0 = x.copy(), y.copy()
    got = [np.asarray(o) for o in sj.pmap(program, executor=executor)(x, y)]
    assert any(into) and not all(into)  # the product was written into; the caller's x and y were not
    assert x.tobytes() == x0.tobytes() and y.tobytes() == y0.tobytes()
    monkeypatch.setattr(_xla_cpu_math, "rounded_once", rounded_once)
    saved, Vectorized.compiled = Vectorized.compiled, False
    try:
        reference = [np.asarray(o) for o in sj.pmap(program, executor="reference" if executor == "threads"
                                                     else "vectorized")(x, y)]
    finally:
        Vectorized.compiled = saved
    for g, r in zip(got, reference, strict=True):
        assert g.tobytes() == r.tobytes()


def test_large_vectorized_ufuncs_split_over_the_cpus(monkeypatch):
    """A vectorized equation computed by one ufunc over a million elements or more is cut along the device axis,
    one part per CPU (``_compiled._split``), with per-device scalars, a replicated operand and a result written
    into a dying operand among them: bit for bit the reference loop's results, the caller's arrays unchanged."""
    split = []
    original = _compiled._split

    def counted(ufunc, shape, dtype, *operands, out=None):
        split.append((ufunc.__name__, out is not None))
        return original(ufunc, shape, dtype, *operands, out=out)
    monkeypatch.setattr(_compiled, "_split", counted)

    def program(x, y, s):
        a = jnp.dot(x, jnp.eye(1024, dtype=x.dtype))  # fresh: the next multiply writes into it
        b = a * y
        c = jnp.dot(b, jnp.eye(1024, dtype=x.dtype)) / s  # s: a per-device scalar
        return c > x, jnp.maximum(c, 1.0) - jnp.ones(1024, x.dtype), y * 1.0

    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 320, 1024)).astype(np.float32)
    x.reshape(-1)[:5] = [np.nan, np.inf, -np.inf, -0.0, 1e-40]
    y, s = rng.standard_normal((4, 320, 1024)).astype(np.float32), np.float32([1.0, -2.0, 0.0, 3.0])
    kept = [v.copy() for v in (x, y, s)]
    got = [np.asarray(o) for o in sj.pmap(program, executor="vectorized")(x, y, s)]
    assert {name for name, _ in split} >= {"multiply", "subtract"} and any(into for _, into in split)
    assert all(a.tobytes() == b.tobytes() for a, b in zip((x, y, s), kept))
    saved, Vectorized.compiled = Vectorized.compiled, False
    try:
        reference = [np.asarray(o) for o in sj.pmap(program, executor="vectorized")(x, y, s)]
    finally:
        Vectorized.compiled = saved
    for g, r in zip(got, reference, strict=True):
        assert g.dtype == r.dtype and g.tobytes() == r.tobytes()
