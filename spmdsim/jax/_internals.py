"""The one module of spmdsim that touches JAX's internals (``jax._src``).

Every other module imports what it needs of JAX's private modules from here, so that a JAX release that moves
or renames something is adapted in one place (``tests/test_import_graph.py`` fails when another module imports
``jax._src``). Differences between the supported releases are adapted by *feature*, by what the installed JAX
has, never by comparing version numbers; each adaptation below names the releases it was written for.

Supported releases: :data:`SUPPORTED` (checked by :mod:`spmdsim.jax` before this module is imported, see
:func:`spmdsim._jax_versions.check`).
"""
from __future__ import annotations

import contextlib

from jax._src import api_util, config, core, effects, source_info_util, xla_bridge
from jax._src import linear_util as lu
from jax._src import mesh as mesh_lib
from jax._src import pretty_printer as pp
from jax._src import shard_map as jax_shard_map
jax_shard_map_build = jax_shard_map._shard_map  # JAX's own, whatever a patch later puts there (``_patch``)
from jax._src.api import jit as jax_jit  # JAX's own jit, whatever ``spmdsim run`` puts at ``jax.jit``
from jax._src.array import ArrayImpl
from jax._src.interpreters import ad, batching, mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lax import lax as lax_internal
from jax._src.lax import special as jax_special
from jax._src.lib import _jax as jaxlib_ext
from jax._src.lib import xla_client
from jax._src.random import core as random_core
from jax._src.random import prng as jax_prng
from jax._src.sharding import IndivisibleError
from jax._src.tree_util import prefix_errors
from jax._src.util import weakref_lru_cache

# JAX's own jit placing a spmdsim map (``spmdsim.jax.integration._map``'s lowering): the shardings a jitted program's
# equations name (``dispatch.get_intermediate_shardings``, which picks the program's devices and mesh) and the
# lowering's axis context (``sharding_impls.ShardingContext``).
from jax._src import dispatch as jax_dispatch
from jax._src import callback as jax_callback  # emit_python_callback, _callback_op_sharding (0.10 to 0.12 alike)
from jax._src import sharding_impls

__all__ = [
    "ArrayImpl", "IndivisibleError", "abstract_mesh_context_manager", "ad", "api_util", "batching", "config",
    "core", "device_context", "effects", "jax_callback", "jax_dispatch", "jax_jit", "jax_prng", "jax_shard_map",
    "jax_shard_map_build", "jax_special", "jaxlib_ext", "outside_mesh_context", "lax_internal", "lgamma_float32_program", "lu", "mesh_lib", "mlir", "pe", "pp", "prefix_errors",
    "random_core", "scan_counts", "sharding_impls", "source_info_util", "weakref_lru_cache", "xla_bridge",
    "xla_client",
]


def _first(name: str, *owners):
    """The attribute ``name`` of the first of ``owners`` that has it (a configuration state that moved between
    releases)."""
    for owner in owners:
        if hasattr(owner, name):
            return getattr(owner, name)
    raise AttributeError(f"spmdsim: the installed JAX has no {name!r} in {[o.__name__ for o in owners]}; "
                         "this JAX release is not supported (see spmdsim._jax_versions.SUPPORTED)")


try:  # JAX 0.12: float32 (and float16/bfloat16 through it) lgamma is JAX's own program, lowered by lower_fun
    from jax._src.lax.lgamma import lgamma_impl as lgamma_float32_program
except ImportError:  # up to 0.11: CHLO's Lanczos approximation, XLA's (spmdsim.jax.numerics._xla_cpu_math64.lgamma)
    lgamma_float32_program = None

# The abstract mesh of ``jax.sharding.use_abstract_mesh`` and the concrete mesh of ``jax.set_mesh``: thread-local
# configuration states in ``jax._src.config`` up to 0.10, in ``jax._src.mesh`` from 0.11.
abstract_mesh_context_manager = _first("abstract_mesh_context_manager", config, mesh_lib)
device_context = _first("device_context", config, mesh_lib)


@contextlib.contextmanager
def outside_mesh_context():
    """For the block, none of ``jax.set_mesh``'s, ``use_mesh``'s or ``use_abstract_mesh``'s contexts in this thread:
    where XLA runs a host callback (its own thread, which has none)."""
    states = (abstract_mesh_context_manager, device_context, config.mesh_context_manager)
    saved = [state.swap_local(config.config_ext.unset) for state in states]
    try:
        yield
    finally:
        for state, value in zip(states, saved, strict=True):
            state.set_local(value)


def scan_counts(params: dict) -> tuple[int, int]:
    """``(num_consts, num_carry)`` of a ``scan`` equation's parameters: parameters of their own up to 0.11; from
    0.12 the number of leaves of the first two of the three flat trees in ``ft_in`` (consts, carry, xs)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts)), len(list(carry))
