"""Loops of small operations (issue 43): the vectorized executor's ``while`` whose devices leave at different
iterations (``._lanes``), and the quick paths for tiny operands, give every device the values of the thread
executor and of the reference loop, bit for bit."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import spmdsim.jax as sjax  # noqa: E402
from spmdsim.jax.evaluation._interpreter import Vectorized  # noqa: E402


def reference(run):
    saved, Vectorized.compiled = Vectorized.compiled, False
    try:
        return run()
    finally:
        Vectorized.compiled = saved


def lanes_leave_at_different_iterations(x):
    """Each device iterates a number of times set by its own data, with a nested loop, a cond, a PRNG key and a
    carry of several dtypes (a token-free pytree); some devices do not enter the loop at all."""
    i = jax.lax.axis_index("i")
    key = jax.random.fold_in(jax.random.PRNGKey(0), i)

    def cond(c):
        k, v, n, _ = c
        return n < (i * 3) % 7

    def body(c):
        k, v, n, total = c
        k, sub = jax.random.split(k)
        step = jax.random.normal(sub, v.shape)
        inner = jax.lax.while_loop(lambda t: t[0] < n % 3, lambda t: (t[0] + 1, jnp.exp(t[1] * 0.5) - 1.0),
                                   (0, v))[1]
        v = jax.lax.cond(n % 2 == 0, lambda a: a + step, lambda a: jnp.log1p(jnp.abs(a)) * step, inner)
        return k, v, n + 1, total + jnp.sum(v).astype(jnp.float64 if jax.config.x64_enabled else jnp.float32)

    k, v, n, total = jax.lax.while_loop(cond, body, (key, x, 0, jnp.float32(0)))
    return v, n, total, jax.random.key_data(k)


@pytest.mark.parametrize("devices", [3, 8])
def test_a_while_whose_devices_leave_at_different_iterations_equals_the_thread_executor_bit_for_bit(devices):
    x = np.linspace(-1, 1, devices * 5, dtype=np.float32).reshape(devices, 5)
    threads = sjax.pmap(lanes_leave_at_different_iterations, axis_name="i", executor="threads")(x)
    vectorized = sjax.pmap(lanes_leave_at_different_iterations, axis_name="i", executor="vectorized")(x)
    definition = reference(lambda: sjax.pmap(lanes_leave_at_different_iterations, axis_name="i",
                                             executor="vectorized")(x))
    for a, b, c in zip(threads, vectorized, definition, strict=True):
        a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
        assert a.dtype == b.dtype == c.dtype and a.shape == b.shape == c.shape
        assert a.tobytes() == b.tobytes() == c.tobytes()
    assert len(set(np.asarray(threads[1]).tolist())) > 2  # the devices did leave at different iterations


def test_a_while_that_no_device_enters_returns_its_operands():
    def f(x):
        return jax.lax.while_loop(lambda c: c[1] < 0, lambda c: (c[0] * 2, c[1] + 1), (x, 0))

    x = np.arange(4, dtype=np.float32)
    out = sjax.pmap(f, axis_name="i", executor="vectorized")(x)
    assert np.array_equal(np.asarray(out[0]), x) and np.array_equal(np.asarray(out[1]), np.zeros(4, np.int32))


def test_threefry_of_a_few_words_equals_numpys_words():
    from spmdsim.jax.rules import _prng
    rng = np.random.default_rng(0)
    k1, k2, x1, x2 = (rng.integers(0, 2**32, size=40, dtype=np.uint64).astype(np.uint32) for _ in range(4))
    whole = _prng.threefry2x32(k1, k2, x1, x2)  # 40 words: NumPy's arrays
    for lo, hi in [(0, 1), (3, 5), (10, 26)]:
        few = _prng.threefry2x32(k1[lo:hi], k2[lo:hi], x1[lo:hi], x2[lo:hi])  # Python's integers
        for a, b in zip(few, whole, strict=True):
            assert a.dtype == np.uint32 and np.array_equal(a, b[lo:hi])
    scalar = _prng.threefry2x32(k1[7], k2[7], x1[7:9], x2[7:9])  # a broadcast key
    big = _prng.threefry2x32(np.full(40, k1[7]), np.full(40, k2[7]), x1, x2)
    assert all(np.array_equal(a, b[7:9]) for a, b in zip(scalar, big, strict=True))


@pytest.mark.parametrize("mode", ["clip", "drop", "promise_in_bounds"])
def test_a_one_window_scatter_equals_the_general_scatter(mode):
    """``x.at[i].set(row)`` (one window: a slice) against the same update as a batch of one window."""
    from spmdsim.jax.evaluation._registry import PER_DEVICE
    rule = PER_DEVICE["scatter"]
    dnums = jax.lax.ScatterDimensionNumbers(update_window_dims=(0,), inserted_window_dims=(0,),
                                            scatter_dims_to_operand_dims=(0,))
    batched = jax.lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                              scatter_dims_to_operand_dims=(0,))
    mode = jax.lax.GatherScatterMode.from_any(mode)
    operand = np.arange(40, dtype=np.float32).reshape(10, 4)
    row = np.full(4, -1.0, np.float32)
    for i in [-11, -1, 0, 3, 9, 10, 12]:
        one = rule(operand, np.array([i], np.int32), row, dimension_numbers=dnums, mode=mode)
        general = rule(operand, np.array([[i]], np.int32), row[None], dimension_numbers=batched, mode=mode)
        assert one.tobytes() == general.tobytes() and one.dtype == general.dtype


def calls_and_switches(x):
    """Calls of every kind the compiled programs call directly (``_compiled._SubCall``): ``jit``, ``checkpoint``,
    a ``custom_jvp`` function (``relu``), library functions that are jits (``cumsum``), nested, and a ``switch`` on
    the axis index whose index goes past the branches (``switch`` clamps it: the last branch)."""
    i = jax.lax.axis_index("i")
    v = jax.checkpoint(jax.jit(lambda a: jnp.tanh(a) * 2.0 + jax.nn.relu(a)))(x)
    v = jax.lax.switch(i, [lambda a: a + 1, lambda a: jax.nn.relu(a - 0.5), lambda a: jnp.sin(a) * i], v)
    return jax.jit(jnp.cumsum)(v), jax.lax.cond(i % 2 == 0, jnp.exp, jnp.log1p, jnp.abs(v))


def test_calls_and_conds_called_directly_equal_the_reference_loop(monkeypatch):
    from spmdsim.jax.compiled import _compiled

    calls = []
    direct = _compiled._SubCall.__call__
    monkeypatch.setattr(_compiled._SubCall, "__call__", lambda self, *a: calls.append(self.cond) or direct(self, *a))
    x = np.linspace(-2, 2, 5 * 6, dtype=np.float32).reshape(5, 6)
    threads = sjax.pmap(calls_and_switches, axis_name="i", executor="threads")(x)
    assert True in calls and False in calls  # conds and calls went the direct way
    vectorized = sjax.pmap(calls_and_switches, axis_name="i", executor="vectorized")(x)
    definition = sjax.pmap(calls_and_switches, axis_name="i", executor="reference")(x)
    expected = jax.pmap(calls_and_switches, axis_name="i")(x) if jax.device_count() >= 5 else definition
    for a, b, c, e in zip(threads, vectorized, definition, expected, strict=True):
        a, b, c, e = (np.asarray(v) for v in (a, b, c, e))
        assert a.dtype == b.dtype == c.dtype == e.dtype and a.shape == b.shape == c.shape == e.shape
        assert a.tobytes() == b.tobytes() == c.tobytes()
        np.testing.assert_allclose(a, e, rtol=2e-6, atol=2e-6)  # real JAX: its own rounding of tanh, sin, ...


def test_a_compiled_program_holds_only_the_values_alive_at_once():
    """A chain of 100 products (each read once) needs two or three locals, not one per variable: a dead value's
    local is bound again (its array let go), and a loop body's frame stays small (``_compiled.program_source``)."""
    from spmdsim.jax.compiled import _compiled
    from spmdsim.jax.evaluation._interpreter import PER_DEVICE

    w = np.eye(3, dtype=np.float32)[::-1].copy()

    def chain(x):
        for _ in range(100):
            x = jnp.dot(x, w) + x[0]
        return x

    closed = jax.make_jaxpr(chain)(np.ones(3, np.float32))
    assert len(closed.jaxpr.eqns) >= 200
    source, ns = _compiled.program_source(closed.jaxpr, PER_DEVICE)
    exec(compile(source, "<test>", "exec"), ns)  # noqa: S102
    assert ns["run"].__code__.co_nlocals <= 12, ns["run"].__code__.co_varnames
    x = np.arange(3, dtype=np.float32)
    got = ns["run"]([None], PER_DEVICE, list(closed.consts), [x], False)[0]
    np.testing.assert_array_equal(got, np.asarray(jax.jit(chain)(x)))
