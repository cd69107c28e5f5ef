"""The JAX front end: run unmodified ``jax.pmap`` and ``jax.shard_map`` programs on virtual devices, every value
computed by NumPy.

Requires jax (``python -m pip install "spmdsim[jax]"``); the rest of spmdsim does not. ``pmap`` traces the
per-device function to a jaxpr once, then evaluates the jaxpr with NumPy once per virtual device, each in its
own thread, sharing the runtime and the collective primitives with :mod:`spmdsim.lax`. It composes with every
JAX transformation (see :mod:`spmdsim.jax.integration._map`).
"""
from spmdsim import _jax_versions

try:
    _jax_versions.check()  # before anything of JAX's internals is imported: an unsupported JAX fails here, in one line
except _jax_versions.UnsupportedJaxError:
    raise
except ImportError as e:  # pragma: no cover - exercised in the jax-free test environment
    raise ImportError(_jax_versions.MISSING) from e

from spmdsim.jax.rules import _collective_rules, _control_flow  # noqa: F401  (register rules)
from spmdsim.jax.rules import _elementwise, _arithmetic, _structural, _reductions, _dot  # noqa: F401  (register rules)
from spmdsim.jax.integration import _map, _map_lowering, _map_rules  # noqa: F401  (the map primitive, its JAX rules)
from spmdsim.jax.rules import _prng  # noqa: F401  (register rules)
from spmdsim.jax.rules import _callbacks, _linalg, _special, _windows  # noqa: F401  (register rules)
from spmdsim.jax.integration._api import pmap
from spmdsim.jax.evaluation._interpreter import eval_closed_jaxpr, eval_jaxpr, supported_primitives
from spmdsim.jax.integration._shard_map import jit, shard_map

__all__ = ["pmap", "shard_map", "jit", "eval_jaxpr", "eval_closed_jaxpr", "supported_primitives"]
