"""Regressions from JAX's own shard_map_test (issue 25), each against JAX's shard_map on the same CPU devices: a map
whose body closes over a value of an outer transformation (``test_grads_closure``, ``test_vmap_closure``), and
``in_specs=None`` passing a Python object through (``test_in_spec_none``)."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import spmdsim.jax as sj

pytestmark = pytest.mark.area("shard_map under transformations")


def _program(shard_map, jit):
    mesh = Mesh(np.array(jax.devices()[:4]), ("i",))

    def f(x, y):
        @partial(shard_map, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"))
        def g(a):
            return jnp.sin(x * a) * y  # x and y: closed over, traced by the outer transformation
        if jit is not None:
            g = jit(g)
        return g(jnp.arange(8.0, dtype=jnp.float32)).sum()
    return f


@pytest.mark.parametrize("jit", ["eager", "jit"])
def test_transformations_of_a_map_closing_over_their_tracers(jit):
    """Jitted: spmdsim's ``jit`` (what ``spmdsim run`` makes ``jax.jit``) against JAX's."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")
    ours = _program(sj.shard_map, sj.jit if jit == "jit" else None)
    theirs = _program(jax.shard_map, jax.jit if jit == "jit" else None)
    for transform in (lambda f: jax.jvp(lambda x: f(x, 3.0), (0.2,), (1.0,)),
                      lambda f: jax.grad(f, argnums=(0, 1))(0.2, 3.0),
                      lambda f: jax.vmap(lambda x: f(x, 3.0))(jnp.arange(3.0, dtype=jnp.float32))):
        for a, b in zip(jax.tree.leaves(transform(ours)), jax.tree.leaves(transform(theirs)), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_in_specs_none_passes_any_object_through():
    """JAX passes an argument whose in_spec is None to the body as it is (the same object), whatever it is."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")
    mesh = Mesh(np.array(jax.devices()[:4]), ("i",))
    token, seen = object(), []

    def body(o, x, options):
        seen.append((o, options["activation"]))
        return options["activation"](x) * 2

    x = jnp.arange(8.0, dtype=jnp.float32)
    for shard_map in (sj.shard_map, jax.shard_map):
        seen.clear()
        y = shard_map(body, mesh=mesh, in_specs=(None, P("i"), {"activation": None}), out_specs=P("i"))(
            token, x, {"activation": jnp.sin})
        np.testing.assert_allclose(np.asarray(y), np.sin(np.arange(8.0, dtype=np.float32)) * 2, rtol=1e-6)
        assert seen and all(o is token and activation is jnp.sin for o, activation in seen)


def test_device_put_to_a_device_inside_an_eager_map_raises_as_in_jax():
    """JAX runs an eager shard_map's body op by op and rejects ``device_put(x, device)`` there; under ``jit`` the
    device_put is ignored (``test_device_put``)."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")
    mesh = Mesh(np.array(jax.devices()[:4]), ("i",))
    x = jnp.arange(8.0, dtype=jnp.float32)
    for shard_map, jit in ((sj.shard_map, sj.jit), (jax.shard_map, jax.jit)):
        plain = shard_map(lambda v: v + jax.device_put(1.0), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
        np.testing.assert_array_equal(np.asarray(plain(x)), np.arange(8.0) + 1)
        placed = shard_map(lambda v: v + jax.device_put(1.0, jax.devices()[0]), mesh=mesh, in_specs=P("i"),
                           out_specs=P("i"))
        with pytest.raises(ValueError, match="got device"):
            placed(x)
        np.testing.assert_array_equal(np.asarray(jit(placed)(x)), np.arange(8.0) + 1)


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_core_call_inside_a_map(executor):
    """shard_map_test's ``test_rewrite_process_call``: JAX's generic ``call`` primitive (``core.call_p``, an open
    sub-jaxpr in ``call_jaxpr``; from JAX 0.12 an alias of ``eval_jaxpr_p``, whose ``call_jaxpr`` is a jaxpr
    given to ``bind``) inside a jitted map."""
    from jax._src import api_util, core
    from jax._src import linear_util as lu
    from spmdsim.jax.integration._shard_map import jit_for  # the jit of `spmdsim run --executor E`

    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")

    def f(x):
        if core.call_p.name == "eval_jaxpr":
            return core.call_p.bind(x, call_jaxpr=jax.make_jaxpr(lambda x: [2. * x])(x).jaxpr)[0] * x
        sub = lu.wrap_init(lambda x: [2. * x], debug_info=api_util.debug_info("test", lambda x: [2. * x], (x,), {}))
        return core.call_p.bind(x, subfuns=(sub,))[0] * x

    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    x = jnp.arange(4.)
    expected = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("x"),), out_specs=P("x")))(x)
    np.testing.assert_array_equal(np.asarray(expected), 2 * np.arange(4.) ** 2)
    ours = jit_for(executor)(sj.shard_map(f, mesh=mesh, in_specs=(P("x"),), out_specs=P("x"), executor=executor))
    np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(expected))


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_custom_partitioning_and_dead_primitive_inside_a_map(executor):
    """shard_map_test's ``test_custom_partitioning`` (the function's own ``call`` jaxpr is what runs on a device's
    block) and ``test_check_rep_false_doesnt_hit_rep_rules`` (a primitive with no outputs and no effects, which
    JAX's DCE drops before XLA sees it: no rule needed)."""
    from jax._src import core
    from jax.experimental.custom_partitioning import custom_partitioning
    from spmdsim.jax.integration._shard_map import jit_for

    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")

    @custom_partitioning
    def double(x):
        return x * 2

    double.def_partition(
        infer_sharding_from_operands=lambda mesh, args, result: args[0].sharding,
        partition=lambda mesh, args, result: (mesh, lambda x: x * 2, args[0].sharding, (args[0].sharding,)),
        propagate_user_sharding=lambda mesh, user: user.sharding, sharding_rule="i -> i")
    nothing = core.Primitive("spmdsim_test_nothing")
    nothing.multiple_results = True
    nothing.def_impl(lambda: [])
    nothing.def_abstract_eval(lambda: [])

    def body(x):
        nothing.bind()
        return double(x) + 1

    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    x = jnp.arange(8.)
    expected = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))(x)
    np.testing.assert_array_equal(np.asarray(expected), np.arange(8.) * 2 + 1)
    ours = jit_for(executor)(sj.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False,
                                          executor=executor))
    np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(expected))


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_histogram_of_a_varying_value_inside_a_map(executor):
    """shard_map_test's ``test_jnp_histogram``: JAX 0.12's ``jnp.histogram`` is a hi primitive (searchsorted by
    scan) whose expansion ``pvary``s along the map's axis: spmdsim traces that expansion with the map's axes bound
    and manual, as JAX traced the equation. Values as jax.shard_map's, eager and jitted."""
    from spmdsim.jax.integration._shard_map import jit_for

    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    x = np.arange(8 * 4 * 2, dtype=np.float32).reshape(8, 4, 2)
    edges = jnp.histogram_bin_edges(x, bins=10)

    def f(x, bin_edges):
        return jax.vmap(lambda q: jnp.histogram(q, bins=bin_edges)[0])(x)

    expected = jax.shard_map(f, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))(x, edges)
    ours = sj.shard_map(f, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"), executor=executor)
    np.testing.assert_array_equal(np.asarray(ours(x, edges)), np.asarray(expected))
    np.testing.assert_array_equal(np.asarray(jit_for(executor)(ours)(x, edges)), np.asarray(expected))


@pytest.mark.parametrize("names", [("y", "x"), ("x", "y")])
def test_ppermute_over_axes_out_of_mesh_order_as_the_installed_jax(names):
    """shard_map_test's ``test_ppermute_different_axis_order_error``: from JAX 0.11 a ppermute over a tuple of axes
    in another order than the mesh's is a RuntimeError (``jax_raise_on_ppermute_sort_diff``); JAX 0.10 ranks the
    devices in mesh order. spmdsim does what the installed JAX does: the same result, or the same error."""
    from jax import lax

    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))
    perm = [(0, 1), (1, 2), (2, 3), (3, 0)]
    outcomes = []
    for shard_map in (jax.shard_map, sj.shard_map):
        f = jax.jit(shard_map(lambda v: lax.ppermute(v, axis_name=names, perm=perm), mesh=mesh, in_specs=P(names),
                              out_specs=P(names)))
        try:
            outcomes.append(np.asarray(f(jnp.arange(4.0))).tolist())
        except RuntimeError as e:
            outcomes.append(str(e)[:60])
    assert outcomes[0] == outcomes[1]
