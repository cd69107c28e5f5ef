"""What a jaxpr binds, its sub-jaxprs included (a ``cond``'s branches, a ``while``'s body, a call's jaxpr, a map's
body): the questions the front ends ask of a body before they run it."""
from __future__ import annotations

from jax.extend import core as jax_core

from spmdsim.jax._internals import weakref_lru_cache

__all__ = ["binds_any"]


@weakref_lru_cache  # held weakly: from JAX 0.11 a jaxpr holds its constants
def binds_any(jaxpr, names: frozenset) -> bool:
    """Whether ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``), or a jaxpr in one of its equations' parameters, has an
    equation of a primitive named in ``names``."""
    return any(eqn.primitive.name in names or any(binds_any(sub, names) for sub in
                                                  jax_core.jaxprs_in_params(eqn.params))
               for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns)
