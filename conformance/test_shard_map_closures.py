"""A shard_map whose body closes over a value of an outer transformation (JAX's shard_map_test
``test_grads_closure``/``test_vmap_closure``): ``jax.jvp``, ``jax.grad`` and ``jax.vmap`` of a function that calls
the map eagerly or under ``jax.jit``, against JAX's own shard_map on the same CPU devices."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import spmdsim.jax as sj

pytestmark = pytest.mark.area("shard_map under transformations")


def _program(shard_map, jit):
    mesh = Mesh(np.array(jax.devices()[:4]), ("i",))

    def f(x, y):
        @partial(shard_map, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"))
        def g(a):
            return jnp.sin(x * a) * y  # x and y: closed over, traced by the outer transformation
        if jit is not None:
            g = jit(g)
        return g(jnp.arange(8.0, dtype=jnp.float32)).sum()
    return f


@pytest.mark.parametrize("jit", ["eager", "jit"])
def test_transformations_of_a_map_closing_over_their_tracers(jit):
    """Jitted: spmdsim's ``jit`` (what ``spmdsim run`` makes ``jax.jit``) against JAX's."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")
    ours = _program(sj.shard_map, sj.jit if jit == "jit" else None)
    theirs = _program(jax.shard_map, jax.jit if jit == "jit" else None)
    for transform in (lambda f: jax.jvp(lambda x: f(x, 3.0), (0.2,), (1.0,)),
                      lambda f: jax.grad(f, argnums=(0, 1))(0.2, 3.0),
                      lambda f: jax.vmap(lambda x: f(x, 3.0))(jnp.arange(3.0, dtype=jnp.float32))):
        for a, b in zip(jax.tree.leaves(transform(ours)), jax.tree.leaves(transform(theirs)), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
