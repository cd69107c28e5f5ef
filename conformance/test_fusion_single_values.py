"""A fused run (spmdsim/jax/compiled/_fusion.py) whose operands include a single value of the run's rank, ``(1, 1, 1)``
against ``(2, 131072, 1)`` (lax's size-1 broadcasting, as ``jax.random.uniform`` emits it for ``minval`` and
``maxval``): blocks index the leading axis, so a block has fewer axes than the run, and the single value must not
add its own (random_lax_test's ``testLowProbabilityGumbel`` failed with "mul returned bfloat16[1, 16384, 1]").
Compared with XLA:CPU (``jax.jit``), bit for bit, the fused program against the unfused one too."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from spmdsim.jax.evaluation._interpreter import PER_DEVICE  # the compiled, fused form a device thread runs

pytestmark = pytest.mark.area("lax primitives vs XLA:CPU")


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16) if x.dtype.itemsize == 2 else x.view(np.uint32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_single_value_operands_of_a_fused_run(dtype):
    dtype = jnp.dtype(dtype)
    x = (np.arange(2 * 131072, dtype=np.float32).reshape(2, 131072, 1) % 97 / 97).astype(dtype)
    s = np.full((1, 1, 1), 0.375, dtype)
    fn = lambda x, s: lax.max(s, lax.add(lax.mul(lax.sub(x, s), s), s))  # noqa: E731
    expected = jax.jit(fn)(x, s)
    closed = jax.make_jaxpr(fn)(x, s)
    got = PER_DEVICE.eval_jaxpr(closed.jaxpr, closed.consts, [x, s])[0]
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def test_gumbel_bfloat16_inside_a_loop_as_xla():
    f = lambda key: jax.random.gumbel(key, (131072, 1), dtype=jnp.bfloat16, mode="high")  # noqa: E731
    key = jax.random.key(0)
    closed = jax.make_jaxpr(f)(key)
    got = PER_DEVICE.eval_jaxpr(closed.jaxpr, closed.consts, [np.asarray(jax.random.key_data(key))])[0]
    np.testing.assert_array_equal(_bits(got), _bits(jax.jit(f)(key)))
