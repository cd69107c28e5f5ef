"""Chains of elementwise equations evaluated block by block (spmdsim/jax/_fusion.py) give every element the result the
reference loop gives, bit for bit: in both executors, on arrays large enough to be fused, with NaN, infinities,
signed zeros and subnormals among the values, single values and broadcasts mixed in, float16 and float32."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import spmdsim.jax as sj
from spmdsim.jax import _fusion

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

