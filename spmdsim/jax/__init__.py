"""The JAX front end: run unmodified ``jax.pmap`` programs on virtual devices, every value computed by NumPy.

Requires jax (``python -m pip install "spmdsim[jax]"``); the rest of spmdsim does not. ``pmap`` traces the
per-device function to a jaxpr once, then evaluates the jaxpr with NumPy once per virtual device, each in its
own thread, sharing the runtime and the collective rules with :mod:`spmdsim.lax`.
"""
try:
    import jax as _jax  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised in the jax-free test environment
    raise ImportError("spmdsim.jax needs jax: python -m pip install \"spmdsim[jax]\" (or jax jaxlib). The core, "
                      "spmdsim.pmap and spmdsim.lax, works without it.") from e

from spmdsim.jax import _collective_rules, _control_flow, _numpy_rules, _prng  # noqa: F401  (register rules)
from spmdsim.jax import _linalg, _special, _windows  # noqa: F401  (register rules)
from spmdsim.jax._api import pmap
from spmdsim.jax._interpreter import eval_closed_jaxpr, eval_jaxpr, supported_primitives

__all__ = ["pmap", "eval_jaxpr", "eval_closed_jaxpr", "supported_primitives"]
