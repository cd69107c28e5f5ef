"""JAX transformations applied *outside* a pmap: spmdsim.jax.pmap (both executors) against real jax.pmap.

Each case is ``transformation(pmapped body)``: grad, value_and_grad, vjp, jvp, linearize, hessian, vmap over
batch sizes 2 and 3, jit with static arguments, cond/switch, scan/fori_loop/while_loop, checkpoint,
custom_jvp/custom_vjp around the pmap, and a pmap nested in another spmdsim pmap (checked against
pmap(vmap), what JAX 0.10 offers instead). The bodies cover every differentiable collective, closed-over
values, in_axes=None and out_axes=None. Values come from XLA:CPU; shapes and dtypes must be equal, values to
float32 rounding (transcendental functions differ from XLA's by a few ULPs).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import spmdsim.jax as sjax
from spmdsim.testing import assert_trees_match

N = 4
RNG = np.random.default_rng(0)
X = RNG.standard_normal((N, 3)).astype(np.float32)
W = RNG.standard_normal((3,)).astype(np.float32)
PERM = [(0, 1), (1, 2), (2, 3)]

# Per-device bodies f(x_block, w) with w replicated (in_axes=None); each returns one block.
BODIES = {
    "psum": lambda x, w: lax.psum(jnp.sin(x) * w, "i"),
    "pmean": lambda x, w: lax.pmean(x * x * w, "i"),
    "all_gather": lambda x, w: jnp.sum(lax.all_gather(x * w, "i"), axis=0) + x,
    "ppermute": lambda x, w: lax.ppermute(jnp.tanh(x) * w, "i", PERM),
    "psum_scatter": lambda x, w: lax.psum_scatter(jnp.outer(jnp.arange(N, dtype=x.dtype), x * w), "i"),
    "all_to_all": lambda x, w: lax.all_to_all(jnp.outer(jnp.ones(N, x.dtype), x * w), "i", 0, 0).sum(0),
    "axis_index": lambda x, w: x * w * (lax.axis_index("i") + 1),
    "psum_of_psum": lambda x, w: x * lax.psum(x * w, "i"),
    "closure": lambda x, w: lax.psum(x * W * w, "i"),
}


def mapped(pmap, body, **kw):
    return pmap(body, axis_name="i", in_axes=(0, None), **kw)


def total(pmap, body):
    f = mapped(pmap, body)
    return lambda x, w: jnp.sum(f(x, w) ** 2)


TRANSFORMS = {
    "grad_x": lambda pmap, body: jax.grad(total(pmap, body))(X, W),
    "grad_w": lambda pmap, body: jax.grad(total(pmap, body), argnums=1)(X, W),
    "value_and_grad": lambda pmap, body: jax.value_and_grad(total(pmap, body), argnums=(0, 1))(X, W),
    "vjp": lambda pmap, body: jax.vjp(mapped(pmap, body), X, W)[1](np.ones_like(X)),
    "jvp": lambda pmap, body: jax.jvp(mapped(pmap, body), (X, W), (np.ones_like(X), np.ones_like(W))),
    "linearize": lambda pmap, body: jax.linearize(mapped(pmap, body), X, W)[1](np.ones_like(X), np.ones_like(W)),
    "hessian_w": lambda pmap, body: jax.hessian(total(pmap, body), argnums=1)(X, W),
    "vmap2": lambda pmap, body: jax.vmap(mapped(pmap, body), in_axes=(0, None))(np.stack([X, 2 * X]), W),
    "vmap3_axis1": lambda pmap, body: jax.vmap(mapped(pmap, body), in_axes=(1, None))(np.stack([X, X, -X], 1), W),
    "vmap_w": lambda pmap, body: jax.vmap(mapped(pmap, body), in_axes=(None, 0))(X, np.stack([W, W + 1])),
    "jit": lambda pmap, body: jax.jit(mapped(pmap, body))(X, W),
    "jit_static": lambda pmap, body: jax.jit(lambda x, w, k: mapped(pmap, body)(x, w) * k,
                                             static_argnums=2)(X, W, 3),
    "jit_grad": lambda pmap, body: jax.jit(jax.grad(total(pmap, body), argnums=1))(X, W),
    "cond": lambda pmap, body: lax.cond(True, lambda x: mapped(pmap, body)(x, W), lambda x: x, X),
    "switch": lambda pmap, body: lax.switch(1, [lambda x: x, lambda x: mapped(pmap, body)(x, W)], X),
    "fori_loop": lambda pmap, body: lax.fori_loop(0, 2, lambda k, x: mapped(pmap, body)(x, W) * 0.5, X),
    "scan": lambda pmap, body: lax.scan(lambda c, _: (mapped(pmap, body)(c, W) * 0.5, c.sum()), X, None,
                                        length=2),
    "while_loop": lambda pmap, body: lax.while_loop(lambda c: c[1] < 2, lambda c: (
        mapped(pmap, body)(c[0], W) * 0.5, c[1] + 1), (X, 0))[0],
    "checkpoint_grad": lambda pmap, body: jax.grad(jax.checkpoint(total(pmap, body)), argnums=(0, 1))(X, W),
    "grad_of_scan": lambda pmap, body: jax.grad(lambda w: lax.scan(
        lambda c, _: (mapped(pmap, body)(c, w) * 0.5, None), X, None, length=2)[0].sum())(W),
}


def _custom_jvp_case(pmap, body):
    f = mapped(pmap, body)

    @jax.custom_jvp
    def g(x):
        return f(x, W)

    @g.defjvp
    def g_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return g(x), jax.jvp(lambda v: f(v, W), (x,), (t,))[1] * 2.0

    return jax.grad(lambda x: g(x).sum())(X)


def _custom_vjp_case(pmap, body):
    f = mapped(pmap, body)

    @jax.custom_vjp
    def g(x):
        return f(x, W)

    def fwd(x):
        y, pullback = jax.vjp(lambda v: f(v, W), x)
        return y, pullback

    def bwd(pullback, ct):
        return pullback(3.0 * ct)

    g.defvjp(fwd, bwd)
    return jax.grad(lambda x: g(x).sum())(X)


TRANSFORMS["custom_jvp"] = _custom_jvp_case
TRANSFORMS["custom_vjp"] = _custom_vjp_case

# Every transformation on three representative bodies, and grad/vmap/jit on every body.
CASES = [(t, b) for t in TRANSFORMS for b in ("psum", "all_gather", "ppermute")]
CASES += [(t, b) for t in ("grad_x", "grad_w", "vmap2", "jit", "jvp") for b in BODIES
          if (t, b) not in CASES]

EXECUTORS = {"threads": sjax.pmap, "vectorized": functools.partial(sjax.pmap, executor="vectorized")}


@pytest.mark.area("transformations outside pmap")
@pytest.mark.parametrize("executor", list(EXECUTORS))
@pytest.mark.parametrize("transform,body", CASES, ids=[f"{t}-{b}" for t, b in CASES])
def test_transformation_of_pmap_matches_jax(transform, body, executor):
    expected = TRANSFORMS[transform](jax.pmap, BODIES[body])
    actual = TRANSFORMS[transform](EXECUTORS[executor], BODIES[body])
    assert_trees_match(actual, expected, out_axis=None, rtol=2e-5, atol=2e-5, what=(executor, "jax"))


def test_there_are_at_least_80_differential_functions():
    assert len(CASES) >= 80


# -- out_axes=None and in_axes=None under grad: JAX's pmap convention ------------------------------------

@pytest.mark.area("transformations outside pmap")
@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_grad_conventions_of_replicated_inputs_and_outputs(executor):
    """JAX-PMAP-SEMANTICS.md §8: out_axes=None cotangents are divided by n, in_axes=None cotangents summed."""
    sim = EXECUTORS[executor]
    cases = [
        lambda pmap: jax.grad(lambda x: pmap(lambda v: lax.psum(v, "i"), "i", out_axes=None)(x))(X[:, 0]),
        lambda pmap: jax.grad(lambda x: pmap(lambda v: 2 * v, "i", out_axes=None)(x))(X[:, 0]),
        lambda pmap: jax.grad(lambda c: pmap(lambda u, c: u * c, "i", in_axes=(0, None))(X[:, 0], c).sum())(2.0),
        lambda pmap: jax.grad(lambda c: pmap(lambda u, c: lax.psum(u * c, "i"), "i", in_axes=(0, None),
                                             out_axes=None)(X[:, 0], c))(2.0),
        lambda pmap: jax.grad(lambda x: pmap(lambda v: lax.psum(v, "i"), "i")(x).sum())(X[:, 0]),
    ]
    for case in cases:
        assert_trees_match(case(sim), case(jax.pmap), out_axis=None, rtol=1e-6, atol=1e-6)


# -- nested spmdsim pmap ----------------------------------------------------------------------------------

@pytest.mark.area("transformations outside pmap")
@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_nested_pmap_equals_pmap_of_vmap_and_differentiates(executor):
    """JAX 0.10 rejects nested pmap; spmdsim runs it with the numbers of pmap(vmap(..., axis_name))."""
    sim = EXECUTORS[executor]
    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)

    def inner_body(v):
        return lax.psum(jnp.sin(v), "j") + lax.psum(v, "i") * lax.axis_index(("i", "j"))

    nested = sim(lambda row: sim(inner_body, axis_name="j")(row), axis_name="i")
    reference = jax.pmap(jax.vmap(inner_body, axis_name="j"), axis_name="i")
    assert_trees_match(nested(x), reference(x), out_axis=None, rtol=1e-6, atol=1e-6)
    grad_nested = jax.grad(lambda v: nested(v).sum())(x)
    grad_reference = jax.grad(lambda v: reference(v).sum())(x)
    assert_trees_match(grad_nested, grad_reference, out_axis=None, rtol=1e-5, atol=1e-5)


def test_nested_pmap_over_too_many_devices_is_a_value_error():
    import spmdsim
    with spmdsim.set_device_count(4), pytest.raises(ValueError, match="virtual devices are available"):
        sjax.pmap(lambda r: sjax.pmap(lambda v: v, "j")(r), "i")(np.zeros((2, 4)))


def test_a_trace_is_made_once_per_signature_and_not_kept_with_outer_tracers():
    f = sjax.pmap(lambda x, w: x * w, "i", in_axes=(0, None))
    f(X, W), f(X, W)
    assert len(f._spmdsim_cache) == 1
    g = sjax.pmap(lambda x: x * W, "i")
    jax.grad(lambda w: sjax.pmap(lambda x: x * w, "i")(X).sum())(1.0)  # closes over a tracer: not cached
    g(X)
    assert len(g._spmdsim_cache) == 1


@pytest.mark.parametrize("executor", ["threads", "vectorized", "reference"])
@pytest.mark.parametrize("axis_name", [None, "i"])
def test_grad_of_a_broadcast_argument_sums_every_devices_cotangent(executor, axis_name):
    """JAX's pmap_test testPmapInAxesGrad: the gradient with respect to an ``in_axes=None`` argument is the sum
    of every device's cotangent, with or without an axis name (without one, spmdsim's transpose psums over the
    unnamed axis; it used to return device 0's alone)."""
    f = lambda x, y: jnp.sin(x + y)  # noqa: E731
    x = jnp.linspace(0.0, 1.0, 8)
    ours = jax.grad(lambda y: sjax.pmap(f, axis_name, in_axes=(0, None), executor=executor)(x, y).sum())(0.5)
    real = jax.grad(lambda y: jax.pmap(f, axis_name, in_axes=(0, None))(x, y).sum())(0.5)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(real), rtol=1e-6)
    assert np.asarray(real) > 4  # eight cotangents near cos(1), not one
