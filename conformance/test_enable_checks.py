"""``jax_enable_checks`` with spmdsim's JAX front end (issue 25).

With checks on, JAX type-checks every jaxpr it makes; a ``spmdsim_map`` equation is checked by its own rule
(``core.custom_typechecks``), which checks the body with the map's named axes bound (a shard_map's body also
with its mesh's axes manual and its ``check_vma``), as JAX's rule for ``shard_map`` does. Every program here
runs with checks on under spmdsim (both executors; ``spmdsim.jax.pmap``/``shard_map`` and the functions
``spmdsim run`` patches), and its values are compared with real JAX's (``jax.pmap``/``jax.shard_map`` on 8 CPU
devices, computed once per case). The rule is also shown to reject ill-typed map equations.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src import core

import spmdsim.jax as sjax
from spmdsim.testing import assert_trees_match

pytestmark = pytest.mark.area("jax_enable_checks")

N = 4
RNG = np.random.default_rng(25)
X = RNG.standard_normal((N, 3)).astype(np.float32)
W = RNG.standard_normal((3,)).astype(np.float32)
X84 = RNG.standard_normal((8, 4)).astype(np.float32)
PERM = [(k, (k + 1) % N) for k in range(N)]
EXECUTORS = ("threads", "vectorized")


@pytest.fixture(autouse=True)
def checks_on():
    """jax_enable_checks on, for the whole process (device threads trace nested maps too)."""
    previous = jax.config.jax_enable_checks
    jax.config.update("jax_enable_checks", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_checks", previous)


def close(actual, expected, tol=2e-5):
    assert_trees_match(actual, expected, out_axis=None, rtol=tol, atol=tol, what=("spmdsim", "jax"))


@functools.cache
def real(cases: str, case: str, *args):
    """Real JAX's result of a case, checks off (it is the reference), once per case."""
    with jax.enable_checks(False):
        if cases == "pmap":
            return PMAP_CASES[case](jax.pmap)
        return SHARD_MAP_CASES[case](jax.shard_map, *args)


# -- the reproducer ------------------------------------------------------------------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_pmap_of_psum_with_checks_on(executor):
    assert jax.config.jax_enable_checks
    with jax.enable_checks(False):
        expected = jax.pmap(lambda x: lax.psum(x, "i"), axis_name="i")(jnp.arange(8.))
    actual = sjax.pmap(lambda x: lax.psum(x, "i"), axis_name="i", executor=executor)(jnp.arange(8.))
    close(actual, expected)
    closed = jax.make_jaxpr(sjax.pmap(lambda x: lax.psum(x, "i") * 2, "i", executor=executor))(X)
    assert [e.primitive.name for e in closed.eqns] == ["spmdsim_map"]


# -- pmap under every transformation, checks on ------------------------------------------------------------

def body(x, w):
    """Collectives of every kind the rules rewrite: psum, ppermute, all_gather, axis_index."""
    y = jnp.sin(x) * w
    return lax.psum(y, "i") + lax.ppermute(jnp.tanh(x), "i", PERM) * (lax.axis_index("i") + 1) \
        + jnp.sum(lax.all_gather(x * w, "i"), axis=0)


def mapped(pmap):
    return pmap(body, axis_name="i", in_axes=(0, None))


def total(pmap):
    f = mapped(pmap)
    return lambda x, w: jnp.sum(f(x, w) ** 2)


PMAP_CASES = {
    "eager": lambda pmap: mapped(pmap)(X, W),
    "jit": lambda pmap: jax.jit(mapped(pmap))(X, W),
    "grad": lambda pmap: jax.grad(total(pmap), argnums=(0, 1))(X, W),
    "jit_of_grad": lambda pmap: jax.jit(jax.grad(total(pmap), argnums=1))(X, W),
    "jvp": lambda pmap: jax.jvp(mapped(pmap), (X, W), (np.ones_like(X), np.ones_like(W))),
    "vjp": lambda pmap: jax.vjp(mapped(pmap), X, W)[1](np.ones_like(X)),
    "linearize": lambda pmap: jax.linearize(mapped(pmap), X, W)[1](np.ones_like(X), np.ones_like(W)),
    "vmap": lambda pmap: jax.vmap(mapped(pmap), in_axes=(0, None))(np.stack([X, 2 * X]), W),
    "vmap_of_grad": lambda pmap: jax.vmap(jax.grad(total(pmap), argnums=1), in_axes=(None, 0))(
        X, np.stack([W, W + 1])),
    "scan": lambda pmap: lax.scan(lambda c, _: (mapped(pmap)(c, W) * 0.5, c.sum()), X, None, length=2),
    "grad_of_scan": lambda pmap: jax.grad(lambda w: lax.scan(
        lambda c, _: (mapped(pmap)(c, w) * 0.5, None), X, None, length=2)[0].sum())(W),
    "cond": lambda pmap: lax.cond(True, lambda x: mapped(pmap)(x, W), lambda x: x, X),
    "while_loop": lambda pmap: lax.while_loop(lambda c: c[1] < 2, lambda c: (
        mapped(pmap)(c[0], W) * 0.5, c[1] + 1), (X, 0))[0],
    "remat": lambda pmap: jax.grad(jax.checkpoint(total(pmap)), argnums=(0, 1))(X, W),
    "remat_inside": lambda pmap: jax.grad(lambda x: (jax.checkpoint(
        lambda v: mapped(pmap)(jnp.sin(v), W))(x) ** 2).sum())(X),
    "remat_policy": lambda pmap: jax.grad(lambda w: jax.checkpoint(
        lambda v: mapped(pmap)(X, v) ** 2, policy=jax.checkpoint_policies.nothing_saveable)(w).sum())(W),
    "hessian": lambda pmap: jax.hessian(total(pmap), argnums=1)(X, W),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(PMAP_CASES))
def test_pmap_transformations_with_checks_on(case, executor):
    close(PMAP_CASES[case](functools.partial(sjax.pmap, executor=executor)), real("pmap", case))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_nested_pmap_with_checks_on(executor):
    """A map in a map's body: the inner equation is checked inside the outer body, both axes bound (JAX
    rejects nested pmap: compared with pmap of vmap)."""
    sim = functools.partial(sjax.pmap, executor=executor)
    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)

    def inner(v):
        return lax.psum(jnp.sin(v), "j") + lax.psum(v, "i") * lax.axis_index(("i", "j"))

    nested = sim(lambda row: sim(inner, axis_name="j")(row), axis_name="i")
    reference = jax.pmap(jax.vmap(inner, axis_name="j"), axis_name="i")
    with jax.enable_checks(False):
        expected = reference(x), jax.grad(lambda v: reference(v).sum())(x)
    close(nested(x), expected[0])
    close(jax.grad(lambda v: nested(v).sum())(x), expected[1])
    close(jax.jit(nested)(x), expected[0])


# -- shard_map under every transformation, checks on -------------------------------------------------------

def mesh():
    return jax.make_mesh((4, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=jax.devices()[:8])


def smapped(shard_map, check_vma):
    def f(x):
        return lax.psum(jnp.sin(x) + lax.ppermute(x, "b", [(0, 1), (1, 0)]), "a") * (lax.axis_index("b") + 1)
    return shard_map(f, mesh=mesh(), in_specs=jax.P("a", "b"), out_specs=jax.P(None, "b"), check_vma=check_vma)


def nested_smap(shard_map):
    inner = shard_map(lambda c: lax.psum(jnp.cos(c), "b") + lax.axis_index("a"), mesh=None,
                      in_specs=jax.P(None, "b"), out_specs=jax.P(None, "b"), axis_names={"b"})
    return shard_map(lambda x: inner(x) * 2, mesh=mesh(), in_specs=jax.P("a"), out_specs=jax.P("a"),
                     axis_names={"a"})


SHARD_MAP_CASES = {
    "eager": lambda sm, vma: smapped(sm, vma)(X84),
    "jit": lambda sm, vma: jax.jit(smapped(sm, vma))(X84),
    "grad": lambda sm, vma: jax.grad(lambda x: (smapped(sm, vma)(x) ** 2).sum())(X84),
    "jit_of_grad": lambda sm, vma: jax.jit(jax.grad(lambda x: (smapped(sm, vma)(x) ** 2).sum()))(X84),
    "jvp": lambda sm, vma: jax.jvp(smapped(sm, vma), (X84,), (np.ones_like(X84),)),
    "vjp": lambda sm, vma: jax.vjp(smapped(sm, vma), X84)[1](np.ones((2, 4), np.float32)),
    "linearize": lambda sm, vma: jax.linearize(smapped(sm, vma), X84)[1](np.ones_like(X84)),
    "vmap": lambda sm, vma: jax.vmap(smapped(sm, vma))(np.stack([X84, -X84, 2 * X84])),
    "scan": lambda sm, vma: lax.scan(lambda c, _: (c + smapped(sm, vma)(c).sum(), c.sum()), X84, None,
                                     length=2),
    "remat": lambda sm, vma: jax.grad(jax.checkpoint(lambda x: (smapped(sm, vma)(x) ** 2).sum()))(X84),
    "remat_policy": lambda sm, vma: jax.grad(lambda x: jax.checkpoint(
        lambda v: smapped(sm, vma)(jnp.sin(v)) ** 2, policy=jax.checkpoint_policies.nothing_saveable)(x).sum())(
        X84),
    "nested": lambda sm, vma: nested_smap(sm)(X84),
    "nested_jit": lambda sm, vma: jax.jit(nested_smap(sm))(X84),  # (JAX 0.10.2 cannot differentiate it)
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("check_vma", [True, False], ids=["check_vma", "no_check_vma"])
@pytest.mark.parametrize("case", sorted(SHARD_MAP_CASES))
def test_shard_map_transformations_with_checks_on(case, check_vma, executor):
    actual = SHARD_MAP_CASES[case](functools.partial(sjax.shard_map, executor=executor), check_vma)
    close(actual, real("shard_map", case, check_vma), tol=1e-5)


# -- under `spmdsim run` (jax.pmap, jax.shard_map and jax.jit patched), checks on ---------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_patched_jax_with_checks_on(executor):
    from spmdsim.jax.integration._patch import patched_jax

    def program():
        step = jax.pmap(body, axis_name="i", in_axes=(0, None))
        grads = jax.jit(jax.grad(lambda x, w: (step(x, w) ** 2).sum(), argnums=1))(X, W)
        sm = jax.shard_map(lambda x: lax.psum(x, "a"), mesh=mesh(), in_specs=jax.P("a"), out_specs=jax.P())
        return step(X, W), grads, jax.jit(sm)(X84), jax.grad(lambda x: jax.jit(sm)(x).sum())(X84), \
            jax.vmap(jax.pmap(lambda x: lax.pmean(x, "i"), "i"))(np.stack([X, X + 1]))

    with jax.enable_checks(False):
        expected = program()
    with patched_jax(8, executor):
        actual = program()
    close(actual, expected)


# -- the rule rejects what is ill typed ----------------------------------------------------------------------

def _map_equation(fun, *args):
    """The jaxpr of ``fun`` (checks off while tracing) and its one spmdsim_map equation."""
    with jax.enable_checks(False):
        closed = jax.make_jaxpr(fun)(*args)
    eqn, = [e for e in closed.jaxpr.eqns if e.primitive.name == "spmdsim_map"]
    return closed.jaxpr, eqn


def _with(jaxpr, eqn, **params):
    return jaxpr.replace(eqns=[eqn.replace(params=dict(eqn.params, **params))])


def test_rule_checks_the_body_under_the_maps_axes_and_its_operands_against_the_in_specs():
    jaxpr, eqn = _map_equation(sjax.pmap(lambda x: lax.psum(x, "i") * 2, "i"), X)
    core.check_jaxpr(jaxpr)  # well typed
    other = (("j", N),)  # the body's psum over "i" no longer has its axis
    with pytest.raises(NameError, match="unbound axis name: i"):
        core.check_jaxpr(_with(jaxpr, eqn, axes=other, in_specs=((("j",), ()),), out_specs=((("j",), ()),)))
    with pytest.raises(core.JaxprTypeError, match=r"operand 0 of type f32\[4,3\] does not match"):
        core.check_jaxpr(_with(jaxpr, eqn, in_specs=(((), ()),)))  # as if replicated: a (1, 3) operand
    with pytest.raises(core.JaxprTypeError, match="operands and 2 in_specs"):
        core.check_jaxpr(_with(jaxpr, eqn, in_specs=eqn.params["in_specs"] * 2))
    with pytest.raises(core.JaxprTypeError, match="inconsistently typed"):  # results: the out_specs' avals
        core.check_jaxpr(_with(jaxpr, eqn, out_specs=(((), ()),)))


def test_rule_checks_that_check_vma_outputs_are_replicated_as_their_out_specs_say():
    jaxpr, eqn = _map_equation(sjax.shard_map(lambda x: x * 2, mesh=mesh(), in_specs=jax.P("a"),
                                              out_specs=jax.P("a")), X84)
    core.check_jaxpr(jaxpr)
    with pytest.raises(core.JaxprTypeError, match=r"varies along \['a'\]"):
        core.check_jaxpr(_with(jaxpr, eqn, out_specs=(((), ()),)))


def test_rule_gives_the_equations_effects():
    """A map's effects are its body's, without the named-axis effects of its own axes: a nested map's
    equation may keep the outer axis's, the outer map's has none left."""
    jaxpr, eqn = _map_equation(sjax.pmap(lambda r: sjax.pmap(lambda v: lax.psum(v, ("i", "j")), "j")(r), "i"),
                               np.zeros((2, 4), np.float32))
    core.check_jaxpr(jaxpr)
    inner, = [e for e in eqn.params["jaxpr"].jaxpr.eqns if e.primitive.name == "spmdsim_map"]
    assert {e.name for e in inner.effects if isinstance(e, core.NamedAxisEffect)} <= {"i"}
    assert not any(isinstance(e, core.NamedAxisEffect) for e in eqn.effects)
