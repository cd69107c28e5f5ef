"""Collective equations of a jaxpr: both executors hand them, with the equation's own parameters, to
:func:`spmdsim.primitives._primitives.bind`, the same primitive layer ``spmdsim.lax`` uses (its checks, rule,
vectorized form and rendezvous). The site reported for each call is the user's line that produced it, and the
name is the public function the user called (:func:`user_name`)."""
from __future__ import annotations

from spmdsim.primitives import _primitives
from spmdsim.jax.evaluation._interpreter import current_site
from spmdsim.jax.evaluation._names import user_name
from spmdsim.jax.evaluation._registry import eqn_stack, per_device, vectorized


def _current_name(default: str) -> str:
    """:func:`user_name` of the equation being evaluated (``default`` between equations)."""
    stack = eqn_stack()
    return user_name(stack[-1]) if stack and stack[-1] is not None else default


def _collective(name: str):
    def rule(x, **params):
        return _primitives.bind(name, [x], site=current_site, api=_current_name(name), **params)[0]

    # A compiled jaxpr's equation with a user line binds through its prepared call instead (see
    # spmdsim.jax.compiled._compiled); this rule serves the reference loop and equations of JAX's own code.
    rule.__name__ = rule.__qualname__ = f"bind_{name}"
    return rule


for _name in _primitives.PRIMITIVES:
    if _name not in ("psend", "ragged_all_to_all"):
        per_device(_name)(vectorized(_name)(_collective(_name)))


@per_device("ragged_all_to_all")
@vectorized("ragged_all_to_all")
def _ragged_all_to_all(*operands, **params):
    return _primitives.bind("ragged_all_to_all", operands, site=current_site(), **params)[0]


@per_device("psend")
@vectorized("psend")
def _psend(x, *, axis_name, perm):
    return _primitives.psend(x, axis_name, perm, site=current_site())


@per_device("precv")
@vectorized("precv")
def _precv(token, *, out_shape, axis_name, perm):
    return _primitives.precv(out_shape.shape, out_shape.dtype, axis_name, perm)


@per_device("create_token", "after_all")
@vectorized("create_token", "after_all")
def _token(*_tokens, **_params):
    return _primitives.TOKEN


@per_device("axis_index")
@vectorized("axis_index")
def _axis_index(*, axis_name):
    return _primitives.axis_index(axis_name)


# shard_map's varying-manual-axes forms (check_vma=True): the same values as their plain collectives.
def _invariant(name: str, plain: str):
    def rule(x, **params):
        return _primitives.bind(plain, [x], site=current_site(), api=_current_name(plain),
                                **dict(params, axis_index_groups=params.get("axis_index_groups")))[0]
    rule.__name__ = rule.__qualname__ = f"bind_{name}"
    return rule


per_device("psum_invariant")(vectorized("psum_invariant")(_invariant("psum_invariant", "psum")))
per_device("all_gather_invariant")(vectorized("all_gather_invariant")(_invariant("all_gather_invariant",
                                                                                 "all_gather")))
# Unreduced/reduced forms (a PartitionSpec's unreduced/reduced axes): each device's value is its block, so the
# collective is the plain one (``psum`` of an unreduced value sums the devices' partials in rank order).
for _name, _plain in (("unreduced_psum", "psum"), ("all_gather_reduced", "all_gather"),
                      ("unreduced_reduce_scatter", "reduce_scatter"),
                      ("unreduced_pmax", "pmax"), ("unreduced_pmin", "pmin")):  # (the last two: JAX 0.11)
    per_device(_name)(vectorized(_name)(_invariant(_name, _plain)))


_RETYPED = ("preduced", "vary_unreduced_cast", "reduced_vary_cast",
            "vary_unreduced_cast_p", "reduced_vary_cast_p")  # (the last two: their names up to JAX 0.11)


@per_device(*_RETYPED)
@vectorized(*_RETYPED)
def _retyped(x, **_params):
    """A change of the value's type only (invariant -> reduced, varying -> unreduced, reduced -> varying): each
    device keeps its block."""
    return x


@per_device("reshard")
@vectorized("reshard")
def _reshard(x, **_params):
    """A change of the (global) array's sharding: the value is unchanged."""
    return x
