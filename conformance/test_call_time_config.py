"""JAX's configuration options that change what a call does (issue 40), beside real ``jax.pmap``.

``jax.disable_jit()`` around a pmap: JAX runs the body's Python at every call and keeps no trace of
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


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
@pytest.mark.parametrize("flag, x, what", [("jax_debug_nans", np.zeros(4, np.float32), "nan"),
                                           ("jax_debug_infs", np.ones(4, np.float32), "inf")])
def test_debug_nans_and_infs_raise_as_jax(flag, x, what, executor):
    """JAX checks a pmap's outputs under ``jax_debug_nans``/``jax_debug_infs``: FloatingPointError."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")
    body = lambda v: jnp.log(v - 1.0) * jax.lax.psum(v, "i")  # noqa: E731  log(-1): nan; log(0): -inf
    message = f"Invalid value ({what}) encountered in sharded computation."
    with jax.config.update_context(flag, True) if hasattr(jax.config, "update_context") else _flag(flag):
        with pytest.raises(FloatingPointError) as theirs:
            jax.pmap(body, "i", devices=jax.devices()[:4])(x)
        with pytest.raises(FloatingPointError) as ours:
            sjax.pmap(body, "i", executor=executor)(x)
    assert str(theirs.value).startswith(message) and str(ours.value) == message
    assert np.isnan(np.asarray(sjax.pmap(body, "i", executor=executor)(np.zeros(4, np.float32)))).all()


class _flag:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        jax.config.update(self.name, True)

    def __exit__(self, *exc):
        jax.config.update(self.name, False)
