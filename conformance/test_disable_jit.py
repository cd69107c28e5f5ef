"""``jax.disable_jit()`` around a pmap (issue 40): JAX runs the body's Python at every call and keeps no trace of
it, so haiku's ``tabulate`` (which calls the function twice under ``disable_jit`` and records its modules in the
second call) sees the modules. spmdsim's pmap neither reuses a trace under ``disable_jit`` nor keeps the ones made
there; a jitted function is called as it is, as JAX does. Counted beside real ``jax.pmap``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spmdsim.jax as sjax

pytestmark = pytest.mark.area("JAX front end")


def _counts(pmap):
    calls = []

    def body(x):
        calls.append(1)
        return jax.lax.psum(x, "i")

    f = pmap(body, axis_name="i")
    x = jnp.ones(4)
    with jax.disable_jit():
        first = f(x)
        f(x)
    under = len(calls)
    calls.clear()
    f(x)
    f(x)
    return under, len(calls), np.asarray(first).tolist()


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_pmap_under_disable_jit_runs_the_body_each_call_as_jax(executor):
    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")
    expected = _counts(lambda f, axis_name: jax.pmap(f, axis_name=axis_name, devices=jax.devices()[:4]))
    assert expected == (2, 1, [4.0] * 4)  # JAX: once per call under disable_jit, then one trace for two calls
    assert _counts(lambda f, axis_name: sjax.pmap(f, axis_name, executor=executor)) == expected


def test_jit_under_disable_jit_calls_the_function():
    calls = []

    def f(x):
        calls.append(1)
        return sjax.pmap(lambda v: jax.lax.psum(v, "i"), "i")(x) * 2

    jitted = sjax.jit(f)
    with jax.disable_jit():
        out = jitted(jnp.ones(4))
        jitted(jnp.ones(4))
    assert len(calls) == 2 and np.asarray(out).tolist() == [8.0] * 4
