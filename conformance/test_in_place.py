"""Updates in place where XLA updates in place (issue 27): a scatter or ``dynamic_update_slice`` whose operand dies
at the equation, held by nothing else (a loop's carry, a fresh intermediate), is updated without a copy by the
compiled evaluator; every other operand is copied as before. Expected values are NumPy's; the user's arrays and
every value still in use must come out unchanged."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import spmdsim.jax as sj
from spmdsim.jax.evaluation import _registry

pytestmark = pytest.mark.area("performance: updates in place")

EXECUTORS = ["threads", "vectorized"]


@pytest.fixture
def in_place_calls(monkeypatch):
    """How many scatter-add / dynamic_update_slice rule calls asked for ``in_place=True`` (rules are looked up
    when a program is made: every test's functions are new, so are their programs)."""
    calls = {"in place": 0, "copied": 0}
    for table in (_registry.PER_DEVICE, _registry.VECTORIZED):
        for name in ("scatter-add", "dynamic_update_slice"):
            rule = table[name]
            inner = getattr(rule, "__wrapped__", rule)

            def counting(*args, _inner=inner, in_place=False, **params):
                calls["in place" if in_place else "copied"] += 1
                return _inner(*args, in_place=in_place, **params)
            if inner is rule:
                monkeypatch.setitem(table, name, counting)
            else:
                monkeypatch.setattr(rule, "__wrapped__", counting)
    return calls


def _expected_image(steps: int) -> np.ndarray:
    image = np.zeros((10, 7), np.float32)
    for i in range(steps):
        image[i % 10, i % 7] += 1.0
    return image


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_loop_carry_is_updated_in_place_and_the_input_is_not(executor, in_place_calls):
    """The issue's program: ``im.at[x, y].add(1)`` in a ``fori_loop``. The first iteration's operand is the
    caller's (copied); each later one is the previous iteration's fresh result, the loop's alone."""
    x = np.zeros((4, 10, 7), np.float32)
    f = sj.pmap(lambda im: lax.fori_loop(0, 25, lambda i, im: im.at[i % 10, i % 7].add(1.0), im), executor=executor)
    out = np.asarray(f(x))
    np.testing.assert_array_equal(out, np.broadcast_to(_expected_image(25), out.shape))
    assert not x.any()  # the user's array
    per_iteration = 4 if executor == "threads" else 1  # one call per device, or one for all
    assert in_place_calls["in place"] >= 20 * per_iteration
    assert in_place_calls["copied"] >= per_iteration  # at least the first iteration, on the caller's value


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_while_loop_carry_is_updated_in_place(executor, in_place_calls):
    def body(carry):
        i, buf = carry
        return i + 1, lax.dynamic_update_slice(buf, jnp.full((1, 3), i, jnp.float32), (i % 5, 0))

    f = sj.pmap(lambda b: lax.while_loop(lambda c: c[0] < 12, body, (0, b))[1], executor=executor)
    out = np.asarray(f(np.zeros((2, 5, 3), np.float32)))
    expected = np.zeros((5, 3), np.float32)
    for i in range(12):
        expected[i % 5] = i
    np.testing.assert_array_equal(out, np.broadcast_to(expected, out.shape))
    assert in_place_calls["in place"] > 0


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_value_used_after_the_update_is_not_changed(executor, in_place_calls):
    """``x`` is read again after the scatter (not its last use), ``v`` is a view of ``x``'s memory alive after it:
    both must keep ``x``'s old values."""
    def f(a):
        x = a * 2.0
        v = x.reshape(-1)                     # a view of x's buffer in NumPy
        y = x.at[0, 0].add(100.0)             # x's last use; v still alive
        z = (a * 3.0).at[1, 1].add(10.0)      # a fresh operand, nothing else holds it: in place
        return y, v, z, y - x

    a = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)
    y, v, z, diff = (np.asarray(o) for o in sj.pmap(f, executor=executor)(a))
    np.testing.assert_array_equal(v, (a * 2).reshape(2, -1))
    expected_y = a * 2
    expected_y[:, 0, 0] += 100
    np.testing.assert_array_equal(y, expected_y)
    expected_diff = np.zeros_like(a)
    expected_diff[:, 0, 0] = 100
    np.testing.assert_array_equal(diff, expected_diff)
    expected_z = a * 3
    expected_z[:, 1, 1] += 10
    np.testing.assert_array_equal(z, expected_z)
    assert in_place_calls["in place"] > 0 and in_place_calls["copied"] > 0


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_carry_the_caller_keeps_is_copied(executor):
    """The loop's initial value is also returned: the loop must not update it."""
    def f(a):
        start = a + 1.0
        out = lax.fori_loop(0, 3, lambda i, im: im.at[i].add(5.0), start)
        return out, start

    a = np.zeros((2, 4), np.float32)
    out, start = (np.asarray(o) for o in sj.pmap(f, executor=executor)(a))
    np.testing.assert_array_equal(start, np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(out, np.broadcast_to(np.float32([6, 6, 6, 1]), (2, 4)))


def test_in_place_results_equal_the_reference_loop():
    """The compiled evaluator (in place) against the reference loop (always copies), bit for bit, on a scan that
    scatters float16 values (rounded at every update) into its carry."""
    def f(a):
        def step(carry, x):
            return carry.at[jnp.int32(x) % 6].add(x * jnp.float16(0.1)), carry.sum()
        return lax.scan(step, a, jnp.arange(40, dtype=jnp.float16))

    a = np.linspace(0, 1, 2 * 6, dtype=np.float16).reshape(2, 6)
    compiled = jax.tree.leaves(sj.pmap(f)(a))
    reference = jax.tree.leaves(sj.pmap(f, executor="reference")(a))
    for c, r in zip(compiled, reference, strict=True):
        np.testing.assert_array_equal(np.asarray(c), np.asarray(r))
