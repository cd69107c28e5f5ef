"""PartitionSpecs with ``unreduced`` / ``reduced`` mesh axes (issue 25; spmdsim/jax/evaluation/_unreduced.py), each program
run by spmdsim's jit of JAX's shard_map (both executors) and by JAX itself on the same CPU devices: the values
bit for bit (partial sums reduced in XLA:CPU's rank order), the shardings, and each device's buffer of an
unreduced result (its partial)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdsim.jax as sj
from spmdsim.jax.integration._shard_map import jit_for

pytestmark = pytest.mark.area("shard_map under transformations")

EXECUTORS = ["threads", "vectorized"]


@pytest.fixture
def mesh():
    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")
    mesh = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])  # Explicit axes
    with jax.set_mesh(mesh):
        yield mesh


def _values(n=16, seed=0):
    # values whose float32 sums depend on the order they are added in
    return (np.random.default_rng(seed).standard_normal(n) * 10.0 ** np.arange(n % 7 - 3, n % 7 - 3 + n) % 1e4
            ).astype(np.float32)


def _buffers(x):
    return {s.device.id: np.asarray(s.data) for s in x.addressable_shards}


def _partials_then_scatter(jit, shard_map=jax.shard_map, check_vma=True):
    """``(partial_sums, scatter)``: a map making each device's block its partial (``out_specs`` unreduced over x),
    and one taking such partials in and scattering their sum (``psum_scatter``), each wrapped in ``jit``."""
    partial_sums = jit(shard_map(lambda v: jax.lax.pcast(v, "x", to="unreduced"), out_specs=P(unreduced={"x"})))
    scatter = jit(shard_map(lambda u: jax.lax.psum_scatter(u, "x", tiled=True), in_specs=P(unreduced={"x"}),
                            out_specs=P("x"), check_vma=check_vma))
    return partial_sums, scatter


def _same(ours, theirs):
    assert ours.sharding == theirs.sharding
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    mine, jaxs = _buffers(ours), _buffers(theirs)
    assert mine.keys() == jaxs.keys()
    for d in mine:
        np.testing.assert_array_equal(mine[d], jaxs[d])


def _both(program, executor, *args):
    """``program(jit)`` built with spmdsim's jit and with JAX's, called on ``args``; results compared."""
    ours = program(jit_for(executor))(*args)
    theirs = program(jax.jit)(*args)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        _same(a, b)
    return ours


@pytest.mark.parametrize("executor", EXECUTORS)
def test_unreduced_out_specs_hold_each_devices_partial_and_reduce_in_rank_order(mesh, executor):
    x = jax.device_put(jnp.asarray(_values(16)), P("x"))

    def program(jit):
        @jit
        @jax.shard_map(out_specs=P(unreduced={"x"}))
        def f(v):
            return jax.lax.pcast(v * 1.5, "x", to="unreduced")

        return lambda v: (f(v), jit(lambda w: jax.reshard(f(w), P()))(v))

    out, total = _both(program, executor, x)
    assert out.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))
    blocks = (_values(16) * np.float32(1.5)).reshape(4, 4)
    expected = ((blocks[0] + blocks[1]) + blocks[2]) + blocks[3]  # rank order
    np.testing.assert_array_equal(np.asarray(total), expected)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_unreduced_in_specs_take_each_devices_partial(mesh, executor):
    x = jax.device_put(jnp.asarray(_values(16, 1)), P("x"))

    def program(jit):
        partial_sums, scatter = _partials_then_scatter(jit)

        @jit
        @jax.shard_map(in_specs=P(unreduced={"x"}), out_specs=P())
        def summed(u):
            return jax.lax.psum(u, "x")

        return lambda v: (scatter(partial_sums(v)), summed(partial_sums(v)), partial_sums(v) + partial_sums(v))

    _both(program, executor, x)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_replicated_value_resharded_to_unreduced_is_taken_by_a_map(mesh, executor):
    x = jnp.asarray(_values(8, 2))

    def program(jit):
        @jax.shard_map(in_specs=P(unreduced={"x"}), out_specs=P())
        def summed(u):
            return jax.lax.psum(u, "x") * 2

        return jit(lambda v: (jax.reshard(v, P(unreduced={"x"})), summed(jax.reshard(v, P(unreduced={"x"})))))

    _both(program, executor, x)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_reduced_in_specs_are_replicated_and_their_cotangents_unreduced(mesh, executor):
    y = jax.device_put(jnp.asarray(_values(8, 3)), P(None, reduced={"x"}))
    x = jax.device_put(jnp.asarray(_values(32, 4)), P("x"))

    def program(jit):
        @jax.shard_map(out_specs=P())
        def f(a, b):
            return jax.lax.psum(a.reshape(4, 2)[:, 1] * b.reshape(4, 2)[:, 0], "x")

        loss = lambda a, b: f(a, b).sum()
        return lambda a, b: (jit(f)(a, b), *jit(jax.grad(loss, argnums=(0, 1)))(a, b))

    out, ga, gb = _both(program, executor, x, y)
    assert gb.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_all_gather_to_reduced_and_its_transpose(mesh, executor):
    w = jax.device_put(jnp.asarray(_values(8 * 3, 5).reshape(8, 3)), P("x"))
    x = jax.device_put(jnp.asarray(_values(4 * 8, 6).reshape(4, 8)), P("x"))

    def program(jit):
        @jax.shard_map(out_specs=P(reduced={"x"}))
        def gather(v):
            return jax.lax.all_gather(v, "x", tiled=True, to="reduced")

        def loss(a, b):
            return (a @ gather(b)).sum()

        return lambda a, b: (jit(gather)(b), *jit(jax.grad(loss, argnums=(0, 1)))(a, b))

    _both(program, executor, x, w)


def test_check_vma_false_unreduced_in_spec_keeps_its_partials(mesh):
    """With check_vma=False an in_spec unreduced over x hands each device its partial (replicated out_specs then
    read device 0's block, as spmdsim does for every check_vma=False output: see the README)."""
    x = jax.device_put(jnp.asarray(_values(16, 7)), P("x"))

    def program(jit):
        partial_sums, scatter = _partials_then_scatter(jit, check_vma=False)

        return lambda v: scatter(partial_sums(v))

    _both(program, "threads", x)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_vmap_with_spmd_axis_name_splits_the_batch_over_that_mesh_axis(executor):
    """``vmap(..., spmd_axis_name='i')`` of a shard_map over a mesh with 'i': each device batches its block of the
    batch axis (JAX's ``_shard_map_batch``), also for grad's residuals and an unbatched replicated operand."""
    if jax.device_count() < 8:
        pytest.skip("needs 8 JAX devices")
    from functools import partial

    import spmdsim.jax as sj
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("i", "j"))
    xs = jnp.asarray(_values(4 * 16, 8).reshape(4, 16))
    c = jnp.asarray(_values(16, 9))
    results = []
    for shard_map in (partial(sj.shard_map, executor=executor), jax.shard_map):
        f = shard_map(lambda x, y: x * x * y, mesh=mesh, in_specs=(P("j"), P("j")), out_specs=P("j"))
        loss = lambda x: f(x, c).sum()
        results.append((jax.vmap(f, in_axes=(0, None), spmd_axis_name="i")(xs, c),
                        jax.vmap(jax.grad(loss), spmd_axis_name="i")(xs),
                        jax.vmap(jax.grad(jax.remat(loss, policy=lambda *_, **__: True)), spmd_axis_name="i")(xs)))
    for ours, theirs in zip(*results, strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_blocks_of_an_unreduced_spec_are_each_devices_partial():
    """The helpers an eager map uses: a device's block under P('y', unreduced={'x'}) is its x-partial's y-block;
    assembling those blocks gives the partials back (NumPy reasoning, 2x2 mesh)."""
    from spmdsim.jax.evaluation._unreduced import Spec, Unreduced, assemble_blocks, split_blocks
    axes = (("x", 2), ("y", 2))
    spec = Spec((("y",),), unreduced={"x"})
    partials = np.arange(8.0).reshape(2, 4)
    blocks = split_blocks(Unreduced(partials, (("x", 2),)), spec, axes)
    np.testing.assert_array_equal(blocks, [[0, 1], [2, 3], [4, 5], [6, 7]])  # devices (x, y) row-major
    back = assemble_blocks(blocks, spec, axes)
    assert back.axes == (("x", 2),)
    np.testing.assert_array_equal(back.partials, partials)
    plain = split_blocks(np.arange(4.0), spec, axes)  # a replicated value: its partials are (value, 0)
    np.testing.assert_array_equal(plain, [[0, 1], [2, 3], [0, 0], [0, 0]])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_unreduced_over_one_axis_of_two_and_a_contraction_into_unreduced_outside_the_map(executor):
    """P('x', None, unreduced={'y'}) out of a map on a 2x2 mesh; outside it, a dot_general whose out_sharding is
    unreduced (each device contracts its own shards), their sum, and the reshard that reduces it."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices")
    mesh = jax.make_mesh((2, 2), ("x", "y"), devices=jax.devices()[:4])
    with jax.set_mesh(mesh):
        a = jax.device_put(jnp.asarray(_values(8 * 6, 10).reshape(8, 6)), P("x", "y"))
        b = jax.device_put(jnp.asarray(_values(6 * 4, 11).reshape(6, 4)), P("y", None))

        def program(jit):
            @jax.shard_map(in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None, unreduced={"y"}))
            def f(u, v):  # (the cast to unreduced: implicit in JAX 0.10, required from 0.12)
                return jax.lax.pcast(jnp.einsum("ab,bc->ac", u, v), "y", to="unreduced")

            def g(u, v):
                local = jnp.dot(u, v, out_sharding=P("x", None, unreduced={"y"}))
                both = f(u, v) + local
                return both, jax.reshard(both, P("x", None))
            return jit(g)

        _both(program, executor, a, b)


def test_eager_maps_with_unreduced_and_reduced_specs(mesh):
    """shard_map_test's ``test_eager_unreduced_in/out`` and ``test_eager_reduced_in``: an un-jitted map (spmdsim's
    eager path) splits an unreduced input into its partials and hands an unreduced output back with JAX's buffers;
    a reduced input's cotangent is unreduced (JAX writes its spec out in full in its own test, ``P(None,
    unreduced={'x'})``, as spmdsim does; here JAX gives the equivalent ``P(unreduced={'x'})``)."""
    x = jax.device_put(jnp.asarray(_values(16, 3)), P("x"))
    results = {}
    for name, shard_map in (("jax", jax.shard_map), ("spmdsim", sj.shard_map)):
        to_partials, scatter = _partials_then_scatter(lambda f: f, shard_map)  # eager: not jitted
        vary = shard_map(lambda r: jax.lax.pcast(r, "x", to="varying"), in_specs=P(reduced={"x"}),
                         out_specs=P("x"))
        u = to_partials(x)
        r = jax.device_put(jnp.asarray(_values(8, 4)), P(reduced={"x"}))
        grad = jax.grad(lambda a: vary(a).sum())(r)
        results[name] = (u, scatter(u), grad)
    for ours, theirs in zip(results["spmdsim"][:2], results["jax"][:2], strict=True):
        _same(ours, theirs)
    ours, theirs = results["spmdsim"][2], results["jax"][2]  # the cotangent: its spec is written out in full by
    assert ours.sharding.is_equivalent_to(theirs.sharding, 1)  # JAX here (P(None, unreduced=...)), not always
    np.testing.assert_array_equal(np.asarray(jax.reshard(ours, P())), np.asarray(jax.reshard(theirs, P())))
