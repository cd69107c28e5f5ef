"""Where a result JAX names no devices for is placed (``spmdsim.jax.integration._map.to_jax`` with no sharding): as
``jnp.asarray`` places a new array in the caller's context, worked out without dispatching a conversion (from
inside a jitted call of the same signature JAX refuses one as recursive: random_lax_test's
``RandomOutShardingTest``, run through ``python -m conformance.jax_suite --ops``)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from spmdsim.jax.integration import _map

pytestmark = pytest.mark.area("JAX front end")


def _contexts():
    yield "default", lambda: jax.default_device(None)
    yield "a default device", lambda: jax.default_device(jax.devices()[-1])
    yield "a default platform", lambda: jax.default_device("cpu")
    for types in ((AxisType.Explicit,), (AxisType.Auto,)):
        mesh = jax.make_mesh((min(4, jax.device_count()),), ("x",), axis_types=types)
        yield f"set_mesh {types[0].name}", lambda mesh=mesh: jax.set_mesh(mesh)


def _refused(*args, **kwargs):
    raise AssertionError("jnp.asarray dispatched while placing a result")


@pytest.mark.parametrize("name,context", list(_contexts()), ids=[n for n, _ in _contexts()])
def test_results_placed_as_jnp_asarray_places_them(name, context, monkeypatch):
    with context():
        expected = jnp.asarray(np.arange(3, dtype=np.float32))
        monkeypatch.setattr(_map, "_fast_put", ...)  # a fresh placement memo: this context is learnt anew,
        monkeypatch.setattr(jnp, "asarray", _refused)  # without dispatching a conversion
        got = _map.to_jax(np.arange(3, dtype=np.float32), jax.core.ShapedArray((3,), np.float32))
        monkeypatch.undo()
        assert got.sharding == expected.sharding, name
        assert got.committed == expected.committed, name
        assert jax.typeof(got) == jax.typeof(expected), name
        np.testing.assert_array_equal(np.asarray(got), np.arange(3))
