"""Chains of elementwise equations evaluated block by block (spmdsim/jax/compiled/_fusion.py) give every element the result the
reference loop gives, bit for bit: in both executors, on arrays large enough to be fused, with NaN, infinities,
signed zeros and subnormals among the values, single values and broadcasts mixed in, float16 and float32."""
from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import spmdsim.jax as sj
from spmdsim.jax.compiled import _fusion

pytestmark = pytest.mark.area("performance: fusion")


def _values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    flat = x.reshape(-1)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-42 if dtype == np.float32 else 1e-7, 1.0, -1.0])
    flat[:len(special)] = special.astype(dtype)
    return x


def _chain(x, y):
    """gelu, an optimizer-like update, comparisons and selects, integer powers, casts, a scalar and a broadcast."""
    g = 0.5 * x * (1 + jnp.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
    m = 0.9 * y + 0.1 * g
    v = jnp.sqrt(jnp.abs(m) + 1e-8)
    out = jnp.where(x > y, m / v, jnp.maximum(x, -y)) - jnp.exp(-jnp.abs(y)) * jnp.log1p(jnp.abs(x))
    row = jnp.arange(x.shape[-1], dtype=x.dtype)
    return out * row, (out.astype(jnp.float32) * 2).astype(x.dtype), lax.logistic(out) + x.mean()


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_fused_chains_equal_the_reference_loop(executor, dtype):
    n = 2 if executor == "threads" else 4
    shape = (n, 256, 1100)  # each device's block (and the stacked blocks) above _fusion.MIN_ELEMENTS
    assert 256 * 1100 >= _fusion.MIN_ELEMENTS
    x, y = _values(shape, dtype, 0), _values(shape, dtype, 1)
    fused_runs = []
    original = _fusion.FusedRun.__init__

    def counting(self, *args, **kwargs):
        original(self, *args, **kwargs)
        fused_runs.append(len(self.plan))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_fusion.FusedRun, "__init__", counting)
        got = sj.pmap(_chain, executor=executor)(x, y)
    assert fused_runs and max(fused_runs) >= 3  # the chain was fused
    expected = sj.pmap(_chain, executor="reference")(x, y)
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        g, e = np.asarray(g), np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_array_equal(g.view(np.uint8), e.view(np.uint8))




@pytest.mark.parametrize("kernel", ["fused run", "port"])
def test_devices_compute_their_fused_runs_and_ports_one_at_a_time(kernel):
    """With the thread executor, a device computes a fused run, or a transcendental port over many blocks, start
    to end before another device starts one (``spmdsim.runtime._threads.one_at_a_time``). Each block sleeps here, which
    lets the other device run in between: its blocks must still come after all of the first device's."""
    from spmdsim.jax.numerics import _xla_cpu_math
    from spmdsim.jax.evaluation._interpreter import PER_DEVICE

    seen: list = []

    def recording(fn):
        def call(*args, **params):
            seen.append(threading.get_ident())
            time.sleep(0.001)  # releases the GIL
            return fn(*args, **params)
        return call

    def f(x):
        return jnp.tanh(x * 2 + 1) * 3 if kernel == "fused run" else jnp.tanh(x)
    x = _values((2, 256, 1100), np.float32, 2)  # each device's block above _fusion.MIN_ELEMENTS
    with pytest.MonkeyPatch.context() as patch:
        if kernel == "fused run":  # each block of the run calls the rule
            patch.setitem(PER_DEVICE.rules, "tanh", recording(PER_DEVICE.rules["tanh"]))
        else:  # each block of the port flushes its operand's subnormals first
            patch.setattr(_xla_cpu_math, "_daz", recording(_xla_cpu_math._daz))
        got = sj.pmap(f, executor="threads")(x)
    expected = sj.pmap(f, executor="reference")(x)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), np.asarray(expected).view(np.uint32))
    assert len(seen) >= 2 * (256 * 1100 // _fusion.BLOCK)  # every block of both devices
    assert len(set(seen)) == 2
    switches = sum(a != b for a, b in zip(seen, seen[1:]))
    assert switches == 1, f"the devices' blocks interleaved: {switches} switches between them"
