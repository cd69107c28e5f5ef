"""How ``jax.make_jaxpr`` prints a program with a spmdsim map (issue 25): as JAX prints the program the map
stands for. A shard_map's ``spmdsim_map`` equation prints as JAX's ``shard_map`` equation; a pmap's as
``jax.pmap``'s, which JAX 0.10 builds as a ``jit`` (named ``_fun``) of a ``shard_map`` over a one-axis mesh.
The simulator's own parameters (executor, api, axes) are not shown. Compared with real JAX's text.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import spmdsim.jax as sjax

pytestmark = pytest.mark.area("jaxpr printing")

RNG = np.random.default_rng(6)
X = RNG.standard_normal((4, 3)).astype(np.float32)
W = RNG.standard_normal((3,)).astype(np.float32)
X84 = RNG.standard_normal((8, 4)).astype(np.float32)


def mesh():
    return jax.make_mesh((4, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=jax.devices()[:8])


def _text(fun, *args) -> str:
    return str(jax.make_jaxpr(fun)(*args))


def _apis(case: str):
    """(real JAX's, spmdsim's) for a case named ``pmap-...`` or ``shard_map-...``."""
    return (jax.pmap, sjax.pmap) if case.startswith("pmap") else (jax.shard_map, sjax.shard_map)


def body(x, w):
    return lax.psum(jnp.sin(x) * w, "i") + lax.ppermute(x, "i", [(0, 1), (1, 2), (2, 3), (3, 0)])


PRINTED_AS_JAX = {
    "pmap-psum": lambda pmap: _text(pmap(lambda x: lax.psum(x, "i"), axis_name="i"), jnp.arange(8.)),
    "pmap-unnamed-in_axes-1": lambda pmap: _text(pmap(lambda x: x * 2, in_axes=1), X.T),
    "pmap-replicated-in-and-out": lambda pmap: _text(pmap(
        lambda x, w: (lax.psum(x * w, "i"), x.sum()), axis_name="i", in_axes=(0, None), out_axes=(0, None)), X, W),
    "pmap-under-jit": lambda pmap: _text(jax.jit(pmap(body, "i", in_axes=(0, None))), X, W),
    "pmap-unused-output": lambda pmap: _text(lambda x: pmap(lambda v: (v, lax.pmax(v, "i")), "i")(x)[1], X),
    "pmap-twice": lambda pmap: _text(lambda x: pmap(jnp.sin)(x) + pmap(jnp.cos)(x), X),
    "shard_map-check_vma": lambda sm: _text(sm(lambda x: x * 2, mesh=mesh(), in_specs=jax.P(("a", "b")),
                                               out_specs=jax.P(("a", "b"))), X84),
    "shard_map-no-check_vma": lambda sm: _text(sm(lambda x: lax.psum(x, "a"), mesh=mesh(), in_specs=jax.P("a", "b"),
                                                  out_specs=jax.P(None, "b"), check_vma=False), X84),
    "shard_map-partial-manual": lambda sm: _text(sm(lambda x: lax.psum(x, "a"), mesh=mesh(), in_specs=jax.P("a"),
                                                    out_specs=jax.P(), axis_names={"a"}, check_vma=False), X84),
    "shard_map-under-jit": lambda sm: _text(jax.jit(sm(lambda x: lax.psum(x, ("a", "b")), mesh=mesh(),
                                                       in_specs=jax.P("a", "b"), out_specs=jax.P())), X84),
}


@pytest.mark.parametrize("case", sorted(PRINTED_AS_JAX))
def test_make_jaxpr_prints_a_map_as_jax_prints_the_program_it_stands_for(case):
    real, sim = _apis(case)
    expected, actual = PRINTED_AS_JAX[case](real), PRINTED_AS_JAX[case](sim)
    assert "spmdsim_map" not in actual and "executor" not in actual
    assert actual == expected


def _maps(text: str) -> list[str]:
    """The maps' equations as printed, without their values: each ``jit[``/``shard_map[`` and the names of
    their parameters, in order."""
    found = re.findall(r"= (jit|shard_map)\[|^\s+(name|check_vma|in_specs|jaxpr|mesh|newly_manual_axes|out_specs)=",
                       text, flags=re.M)
    return [a or b for a, b in found]


# Where the text differs, by design: spmdsim prints a spec without trailing unsplit dimensions (JAX prints
# the PartitionSpec the program wrote); a pmap's closed-over arrays are operands of the map (jax.pmap makes
# them constants of its jit's jaxpr); a transformed map's body is what spmdsim's rules make (JAX's rules make
# other residuals and equations, and name the jit of a transpose the same ``_fun``).
PRINTED_ALIKE = {
    "shard_map-spec-with-trailing-None": lambda sm: _text(sm(lambda x: lax.psum(x, "a"), mesh=mesh(),
                                                             in_specs=jax.P("a", None), out_specs=jax.P(None, None)),
                                                          X84),
    "pmap-closure": lambda pmap: _text(pmap(lambda x: x * W, "i"), X),
    "pmap-grad": lambda pmap: _text(jax.grad(lambda x: pmap(lambda v: lax.psum(jnp.sin(v), "i"), "i")(x).sum()), X),
    "shard_map-grad": lambda sm: _text(jax.grad(lambda x: sm(lambda v: lax.psum(jnp.sin(v), "a"), mesh=mesh(),
                                                             in_specs=jax.P("a"), out_specs=jax.P())(x).sum()), X84),
}


@pytest.mark.parametrize("case", sorted(PRINTED_ALIKE))
def test_make_jaxpr_prints_the_same_map_equations_where_the_text_differs(case):
    real, sim = _apis(case)
    expected, actual = PRINTED_ALIKE[case](real), PRINTED_ALIKE[case](sim)
    assert actual != expected  # else the case belongs in PRINTED_AS_JAX
    assert "spmdsim_map" not in actual and "executor" not in actual
    assert _maps(actual) == _maps(expected) and _maps(actual)


def test_printing_options_as_for_jax():
    """Name stacks (a jit's equations' are relative to it), no shapes; with source lines, the same equations."""
    closed = jax.make_jaxpr(jax.named_call(sjax.pmap(lambda x: lax.psum(x, "i"), "i"), name="step"))(X)
    real = jax.make_jaxpr(jax.named_call(jax.pmap(lambda x: lax.psum(x, "i"), "i"), name="step"))(X)
    for kwargs in ({"name_stack": True}, {"print_shapes": False}):
        assert str(closed.jaxpr.pretty_print(**kwargs)) == str(real.jaxpr.pretty_print(**kwargs)), kwargs
    with_lines = str(closed.jaxpr.pretty_print(source_info=True))
    assert _maps(with_lines) == _maps(str(real.jaxpr.pretty_print(source_info=True)))
    assert "test_jaxpr_printing.py" in with_lines  # the user's line, where JAX names its own pmap.py


def test_a_simulator_error_in_a_checked_jaxpr_prints_the_map_as_jax_would():
    """JAX's type errors print the jaxpr they are about: the map shows there as it does in make_jaxpr."""
    from jax._src import core
    with jax.enable_checks(False):
        closed = jax.make_jaxpr(sjax.pmap(lambda x: x * 2, "i"))(X)
    eqn = closed.jaxpr.eqns[0]
    bad = closed.jaxpr.replace(eqns=[eqn.replace(params=dict(eqn.params, in_specs=(((), ()),)))])
    with pytest.raises(core.JaxprTypeError) as info:
        core.check_jaxpr(bad)
    assert "jit[" in str(info.value) and "shard_map[" in str(info.value) and "executor" not in str(info.value)


def test_a_body_used_twice_is_printed_once_as_in_jax():
    """A pmapped function called twice: its body is one jaxpr, printed once at the top (``let jaxpr = ...``)
    in both. (JAX also shares the jit's jaxpr, as ``let _fun = ...``; spmdsim prints the jit in place.)"""
    def program(pmap):
        f = pmap(jnp.sin)
        return _text(lambda x: f(x) + f(x), X)

    expected, actual = program(jax.pmap), program(sjax.pmap)
    assert actual.count("let jaxpr = ") == expected.count("let jaxpr = ") == 1
    assert actual.count(" sin ") == expected.count(" sin ") == 1
    assert actual.count("shard_map[") == 2 and expected.count("shard_map[") == 1 and "let _fun = " in expected
