"""Collective equations of a jaxpr: both executors hand them, with the equation's own parameters, to
:func:`spmdsim._primitives.bind`, the same primitive layer ``spmdsim.lax`` uses (its checks, rule,
vectorized form and rendezvous). The site reported for each call is the user's line that produced it."""
from __future__ import annotations

from spmdsim import _primitives
from spmdsim.jax._interpreter import current_site
from spmdsim.jax._registry import per_device, vectorized


def _collective(name: str):
    def rule(x, **params):
        return _primitives.bind(name, [x], site=current_site, **params)[0]  # called only if needed
    rule.__name__ = rule.__qualname__ = f"bind_{name}"
    return rule


for _name in _primitives.PRIMITIVES:
    per_device(_name)(vectorized(_name)(_collective(_name)))


@per_device("axis_index")
@vectorized("axis_index")
def _axis_index(*, axis_name):
    return _primitives.axis_index(axis_name)
