"""The rule table alone: pure NumPy, no threads, no axis names."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from spmdsim import _collectives
from spmdsim._collectives import COLLECTIVE_RULES, apply_grouped

rule = COLLECTIVE_RULES.__getitem__


def blocks_of(n, shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]


def test_rule_table_names_are_jax_primitive_names():
    assert set(COLLECTIVE_RULES) == {"psum", "pmax", "pmin", "all_gather", "reduce_scatter", "all_to_all",
                                     "ppermute", "pbroadcast"}


def test_duplicate_registration_is_refused():
    with pytest.raises(AssertionError, match="duplicate"):
        _collectives.collective_rule("psum")(lambda blocks: blocks)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.float16, np.float32, np.complex64])
def test_psum_keeps_dtype_and_sums(dtype):
    blocks = [np.array([1, 2], dtype) * (k + 1) for k in range(4)]
    out = rule("psum")(blocks)
    assert all(o.dtype == dtype for o in out)
    np.testing.assert_array_equal(out[0], np.array([10, 20], dtype))


def test_psum_int8_wraps_like_xla():
    out = rule("psum")([np.array(v, np.uint8) for v in (200, 100, 1, 2)])[0]
    assert out.dtype == np.uint8 and int(out) == (200 + 100 + 1 + 2) % 256 == 47


def test_psum_folds_left_to_right_in_rank_order():
    # float32 addition is not associative: 1e8 + 1 - 1e8 depends on the order.
    blocks = [np.float32(1e8), np.float32(1.0), np.float32(-1e8), np.float32(1.0)]
    blocks = [np.asarray(b) for b in blocks]
    expected = ((blocks[0] + blocks[1]) + blocks[2]) + blocks[3]
    assert rule("psum")(blocks)[0] == expected == np.float32(1.0)


def test_results_are_read_only_and_do_not_alias_inputs():
    blocks = [np.ones(3), np.ones(3)]
    for name, params in [("psum", {}), ("ppermute", {"perm": ((0, 1), (1, 0))}), ("pbroadcast", {"source": 0})]:
        out = rule(name)(blocks, **params)
        for o in out:
            assert not o.flags.writeable
            assert not any(np.shares_memory(o, b) for b in blocks)
    single = rule("psum")([blocks[0]])[0]          # a group of one still gets its own array
    assert not np.shares_memory(single, blocks[0])


def test_pmax_pmin_bool_and_nan():
    out = rule("pmax")([np.array([True, False]), np.array([False, False])])[0]
    assert out.dtype == np.bool_ and out.tolist() == [True, False]
    assert np.isnan(rule("pmin")([np.array(1.0), np.array(np.nan)])[0])


@given(n=st.integers(1, 5), shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3), data=st.data())
@settings(max_examples=60, deadline=None)
def test_all_gather_stack_and_tiled(n, shape, data):
    blocks = blocks_of(n, shape, seed=n)
    axis = data.draw(st.integers(0, len(shape)), label="axis")
    out = rule("all_gather")(blocks, all_gather_dimension=axis, tiled=False)
    expected = np.moveaxis(np.array(blocks), 0, axis)
    for o in out:
        np.testing.assert_array_equal(o, expected)
    if shape:
        taxis = data.draw(st.integers(0, len(shape) - 1), label="tiled_axis")
        tiled = rule("all_gather")(blocks, all_gather_dimension=taxis, tiled=True)[0]
        assert tiled.shape[taxis] == n * shape[taxis]
        np.testing.assert_array_equal(tiled, np.concatenate(blocks, axis=taxis))


@given(n=st.integers(1, 4), rest=hnp.array_shapes(min_dims=0, max_dims=2, max_side=3), data=st.data())
@settings(max_examples=60, deadline=None)
def test_reduce_scatter_is_sum_then_slice(n, rest, data):
    dim = data.draw(st.integers(0, len(rest)), label="scatter_dimension")
    shape = rest[:dim] + (n,) + rest[dim:]
    blocks = blocks_of(n, shape, np.float64, seed=1)
    total = sum(blocks)
    out = rule("reduce_scatter")(blocks, scatter_dimension=dim, tiled=False)
    for r, o in enumerate(out):
        np.testing.assert_allclose(o, np.take(total, r, axis=dim))
        assert o.shape == rest
    tiled_shape = rest[:dim] + (2 * n,) + rest[dim:]
    tblocks = blocks_of(n, tiled_shape, np.float64, seed=2)
    tout = rule("reduce_scatter")(tblocks, scatter_dimension=dim, tiled=True)
    np.testing.assert_allclose(np.concatenate(tout, axis=dim), sum(tblocks))


@given(n=st.integers(1, 4), data=st.data())
@settings(max_examples=60, deadline=None)
def test_all_to_all_global_view_is_a_moveaxis(n, data):
    """pmap(all_to_all(., s, c))(X) == moveaxis(X, (0, s+1), (c+1, 0)) for the stacked global array X."""
    ndim = data.draw(st.integers(1, 3), label="ndim")
    s = data.draw(st.integers(0, ndim - 1), label="split_axis")
    c = data.draw(st.integers(0, ndim - 1), label="concat_axis")
    shape = [2] * ndim
    shape[s] = n
    X = np.arange(n * int(np.prod(shape))).reshape(n, *shape)
    out = np.array(rule("all_to_all")(list(X), split_axis=s, concat_axis=c, tiled=False))
    np.testing.assert_array_equal(out, np.moveaxis(X, (0, s + 1), (c + 1, 0)))


def test_all_to_all_tiled_2d():
    X = np.arange(4 * 4 * 2).reshape(4, 4, 2)   # 4 devices, blocks (4, 2)
    out = rule("all_to_all")(list(X), split_axis=0, concat_axis=1, tiled=True)
    for r, o in enumerate(out):
        np.testing.assert_array_equal(o, np.concatenate([X[k][r:r + 1] for k in range(4)], axis=1))
        assert o.shape == (1, 8)


def test_ppermute_zero_fills_and_pbroadcast():
    blocks = [np.array([k + 1], np.int32) for k in range(4)]
    out = rule("ppermute")(blocks, perm=((0, 1), (1, 2), (2, 3)))
    assert [int(o[0]) for o in out] == [0, 1, 2, 3]
    assert out[0].dtype == np.int32
    assert [int(o[0]) for o in rule("pbroadcast")(blocks, source=2)] == [3, 3, 3, 3]


def test_apply_grouped_ranks_follow_the_listed_group_order():
    # JAX: all_gather with groups [[0, 2], [3, 1]] on x = 1..4 gives [[1, 3], [4, 2], [1, 3], [4, 2]].
    members = [[np.array(k + 1)] for k in range(4)]
    out = apply_grouped("all_gather", members, ((0, 2), (3, 1)), all_gather_dimension=0, tiled=False)
    assert [o[0].tolist() for o in out] == [[1, 3], [4, 2], [1, 3], [4, 2]]
    sums = apply_grouped("psum", members, ((0,), (1, 2, 3)))
    assert [int(o[0]) for o in sums] == [1, 9, 9, 9]
