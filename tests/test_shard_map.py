"""spmdsim.shard_map, Mesh, make_mesh and P (NumPy front end): layouts, collectives over mesh axes, errors.
Expected values from NumPy reasoning about the global arrays."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import spmdsim
from spmdsim import P, lax
from spmdsim.primitives import _sharding

X = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)


@pytest.fixture
def mesh():
    return spmdsim.make_mesh((4, 2), ("x", "y"))


def test_blocks_follow_the_specs_and_assemble_back(mesh):
    seen = {}

    def f(b):
        seen[(int(lax.axis_index("x")), int(lax.axis_index("y")))] = b.copy()
        return b

    out = spmdsim.shard_map(f, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))(X)
    np.testing.assert_array_equal(out, X)
    np.testing.assert_array_equal(seen[(2, 1)], X[4:6, 2:4])
    # one dimension over two axes: x major, block index x * 2 + y
    seen.clear()
    spmdsim.shard_map(f, mesh=mesh, in_specs=P(("x", "y")), out_specs=P(("x", "y")))(X)
    np.testing.assert_array_equal(seen[(1, 1)], X[3:4])
    seen.clear()
    spmdsim.shard_map(f, mesh=mesh, in_specs=P(("y", "x")), out_specs=P(("y", "x")))(X)
    np.testing.assert_array_equal(seen[(1, 1)], X[5:6])   # y major: 1 * 4 + 1


def test_collectives_over_one_axis_a_tuple_and_all_axes(mesh):
    f = spmdsim.shard_map(lambda b: (lax.psum(b, "x"), lax.psum(b, ("x", "y")), lax.axis_index(("y", "x"))[None],
                                     lax.axis_size(("x", "y"))),
                          mesh=mesh, in_specs=P("x", "y"), out_specs=(P(None, "y"), P(), P(("y", "x")), P()))
    col_sums, total, index, size = f(X)
    np.testing.assert_array_equal(col_sums, X.reshape(4, 2, 4).sum(0))
    np.testing.assert_array_equal(total, X.reshape(4, 2, 2, 2).sum((0, 2)))
    assert index.tolist() == list(range(8)) and size == 8


def test_all_gather_over_a_mesh_axis_rebuilds_the_rows(mesh):
    f = spmdsim.shard_map(lambda b: lax.all_gather(b, "y", axis=1, tiled=True), mesh=mesh, in_specs=P("x", "y"),
                          out_specs=P("x"))
    np.testing.assert_array_equal(f(X), X)


def test_ppermute_over_one_axis_of_a_2d_mesh(mesh):
    f = spmdsim.shard_map(lambda b: lax.ppermute(b, "x", [(k, (k + 1) % 4) for k in range(4)]), mesh=mesh,
                          in_specs=P("x", "y"), out_specs=P("x", "y"))
    np.testing.assert_array_equal(f(X), np.roll(X, 2, axis=0))   # blocks of 2 rows move one x step


def test_replicated_inputs_and_unchecked_outputs(mesh):
    f = spmdsim.shard_map(lambda b, w: b @ w, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
    w = np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(f(X, w), X @ w)
    g = spmdsim.shard_map(lambda b: b * 0 + lax.axis_index("x"), mesh=mesh, in_specs=P("x"), out_specs=P(),
                          check_vma=False)
    assert g(X).tolist() == [[0.0] * 4] * 2   # coordinate 0's block, unchecked


def test_replicated_output_that_varies_names_the_devices(mesh):
    with pytest.raises(ValueError, match=r"device 2 \[x=1, y=0\]"):
        spmdsim.shard_map(lambda b: b, mesh=mesh, in_specs=P("x", "y"), out_specs=P(None, "y"))(X)


@pytest.mark.parametrize("in_specs,phrase", [
    (P("z"), "not a mesh axis"), (P("x", "x"), "twice"), (P(("x", "x")), "twice"), (P("x", "y", None), "rank 2"),
    (P(None, ("x", "y")), "not divisible"),
])
def test_spec_errors(mesh, in_specs, phrase):
    with pytest.raises(ValueError, match=phrase):
        spmdsim.shard_map(lambda b: b, mesh=mesh, in_specs=in_specs, out_specs=P())(X)


def test_mesh_errors():
    with pytest.raises(ValueError, match="needs 16 devices"):
        spmdsim.make_mesh((4, 4), ("x", "y"))
    with pytest.raises(ValueError, match="unique"):
        spmdsim.make_mesh((4, 2), ("x", "x"))
    with pytest.raises(TypeError, match="PartitionSpec"):
        spmdsim.shard_map(lambda b: b, mesh=spmdsim.make_mesh((8,), ("x",)), in_specs=("x",), out_specs=P())(X)


def test_partial_manual_axes_run_once_per_manual_coordinate(mesh):
    calls = []
    f = spmdsim.shard_map(lambda b: calls.append(b.shape) or lax.psum(b, "x"), mesh=mesh, in_specs=P("x"),
                          out_specs=P(), axis_names={"x"})
    np.testing.assert_array_equal(f(X), X.reshape(4, 2, 4).sum(0))
    assert calls == [(2, 4)] * 4
    with pytest.raises(NameError, match="unbound axis name: y"):
        spmdsim.shard_map(lambda b: lax.psum(b, "y"), mesh=mesh, in_specs=P("x"), out_specs=P(), axis_names={"x"})(X)


def test_deadlock_report_labels_devices_by_mesh_coordinates(mesh):
    def f(b):
        if lax.axis_index("x") == 0:
            return lax.psum(b, "x")
        return b

    with pytest.raises(spmdsim.CollectiveDeadlockError, match=r"device 2 \[x=1, y=0\] returned"):
        spmdsim.shard_map(f, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))(X)


@given(sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3), data=st.data())
@settings(max_examples=60, deadline=None)
def test_split_then_assemble_is_the_identity(sizes, data):
    names = ["a", "b", "c"][:len(sizes)]
    axes = tuple(zip(names, sizes))
    ndim = data.draw(st.integers(1, 3), label="ndim")
    order = data.draw(st.permutations(names), label="names")
    cut = data.draw(st.lists(st.integers(0, ndim), min_size=len(names), max_size=len(names)), label="dims")
    spec = [[] for _ in range(ndim)]
    for name, d in zip(order, cut):
        if d < ndim:
            spec[d].append(name)
    spec = tuple(tuple(s) for s in spec)
    shape = [2 * int(np.prod([dict(axes)[n] for n in s])) for s in spec]
    x = np.arange(int(np.prod(shape))).reshape(shape)
    blocks = _sharding.split(x, spec, axes)
    assert blocks.shape == (int(np.prod(sizes)), *_sharding.block_shape(shape, spec, axes))
    np.testing.assert_array_equal(_sharding.assemble(blocks, spec, axes), x)
