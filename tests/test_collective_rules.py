"""The primitive table alone: rules and vectorized forms, pure NumPy, no threads, no axis names."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import ml_dtypes

from spmdsim.primitives import _primitives
from spmdsim.primitives._primitives import PRIMITIVES, apply_grouped


def rule(name):
    return PRIMITIVES[name].rule


def blocks_of(n, shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]


def test_primitive_table_names_are_jax_primitive_names():
    assert set(PRIMITIVES) == {"psum", "pmax", "pmin", "all_gather", "reduce_scatter", "all_to_all",
                               "ppermute", "pbroadcast", "psend", "ragged_all_to_all"}


def test_duplicate_definition_is_refused():
    with pytest.raises(AssertionError, match="duplicate"):
        _primitives._define("psum", check=None, rule=None, vectorized=None)


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
def test_all_to_all_splits_and_concatenates(n, data):
    """Rank r receives chunk r of every rank's block (split n ways along split_axis), concatenated in rank
    order along concat_axis: the primitive's semantics (jax.lax.all_to_all's non-tiled form adds a unit axis)."""
    ndim = data.draw(st.integers(1, 3), label="ndim")
    s = data.draw(st.integers(0, ndim - 1), label="split_axis")
    c = data.draw(st.integers(0, ndim - 1), label="concat_axis")
    shape = [2] * ndim
    shape[s] = 2 * n
    X = np.arange(n * int(np.prod(shape))).reshape(n, *shape)
    out = rule("all_to_all")(list(X), split_axis=s, concat_axis=c)
    for r in range(n):
        chunk = [np.take(X[k], range(2 * r, 2 * r + 2), axis=s) for k in range(n)]
        np.testing.assert_array_equal(out[r], np.concatenate(chunk, axis=c))


def test_all_to_all_tiled_2d():
    X = np.arange(4 * 4 * 2).reshape(4, 4, 2)   # 4 devices, blocks (4, 2)
    out = rule("all_to_all")(list(X), split_axis=0, concat_axis=1)
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
    out = apply_grouped(rule("all_gather"), members, ((0, 2), (3, 1)), {"all_gather_dimension": 0, "tiled": False})
    assert [o[0].tolist() for o in out] == [[1, 3], [4, 2], [1, 3], [4, 2]]
    sums = apply_grouped(rule("psum"), members, ((0,), (1, 2, 3)), {})
    assert [int(o[0]) for o in sums] == [1, 9, 9, 9]


def test_bfloat16_sums_accumulate_in_float32_and_round_once():
    # XLA:CPU measured (8 devices, jax.pmap psum): bfloat16 sums are accumulated in float32 and rounded once;
    # float16 sums round after every addition. 256 + 1 + 1 in bfloat16: 256 + 1 rounds back to 256 each time.
    bf16 = ml_dtypes.bfloat16
    blocks = [np.array([256.0], bf16), np.array([1.0], bf16), np.array([1.0], bf16)]
    assert float(rule("psum")(blocks)[0][0]) == 258.0
    assert rule("psum")(blocks)[0].dtype == bf16
    halves = [np.array([2048.0], np.float16), np.array([1.0], np.float16), np.array([1.0], np.float16)]
    assert float(rule("psum")(halves)[0][0]) == 2048.0   # float16: 2048 + 1 rounds to 2048, twice


VECTORIZED_CASES = [
    ("psum", (3,), {}), ("pmax", (2, 2), {}), ("pmin", (), {}),
    ("all_gather", (2, 3), {"all_gather_dimension": 1, "tiled": False}),
    ("all_gather", (2, 3), {"all_gather_dimension": 1, "tiled": True}),
    ("all_gather", (), {"all_gather_dimension": 0, "tiled": False}),
    ("reduce_scatter", lambda n: (n, 3), {"scatter_dimension": 0, "tiled": False}),
    ("reduce_scatter", lambda n: (2, 2 * n), {"scatter_dimension": 1, "tiled": True}),
    ("all_to_all", lambda n: (2 * n, 3), {"split_axis": 0, "concat_axis": 1}),
    ("all_to_all", lambda n: (3, 2 * n), {"split_axis": 1, "concat_axis": 1}),
    ("all_to_all", lambda n: (n, 2, 1), {"split_axis": 0, "concat_axis": 2}),
    ("ppermute", (2,), {"perm": ((0, 1), (1, 0))}),
    ("pbroadcast", (2,), {"source": 1}),
]


@pytest.mark.parametrize("name,shape,params", VECTORIZED_CASES)
@pytest.mark.parametrize("groups,n", [(1, 2), (3, 2), (2, 4)])
def test_vectorized_form_equals_the_rule_bit_for_bit(name, shape, params, groups, n):
    """y[g, r] == rule(list(x[g]))[r] for G groups of n ranks; float32 sums in the same order, so exact."""
    if callable(shape):
        shape = shape(n)
    rng = np.random.default_rng(n)
    x = rng.standard_normal((groups, n, *shape)).astype(np.float32)
    prim = PRIMITIVES[name]
    y = prim.vectorized(x, **params)
    for g in range(groups):
        expected = prim.rule(list(x[g]), **params)
        for r in range(n):
            np.testing.assert_array_equal(y[g, r], expected[r])
            assert y[g, r].dtype == expected[r].dtype


def test_ragged_all_to_all_jax_docstring_example():
    blocks = [(np.array([1, 2, 2]), np.zeros(4, int), np.array([0, 1]), np.array([1, 2]), np.array([0, 0]),
               np.array([1, 1])),
              (np.array([3, 4, 0]), np.zeros(4, int), np.array([0, 1]), np.array([1, 1]), np.array([1, 2]),
               np.array([2, 1]))]
    out = rule("ragged_all_to_all")(blocks)
    assert [o.tolist() for o in out] == [[1, 3, 0, 0], [2, 2, 4, 0]]


def test_ragged_all_to_all_two_slices_per_destination_rows_and_errors():
    # 2 devices, K = 4 (two slices to each destination); rows of shape (2,).
    op0, op1 = np.arange(10).reshape(5, 2), 100 + np.arange(10).reshape(5, 2)
    out = np.full((6, 2), -1)
    # device 0 sends rows 0 and 1:3 to device 0 (at 0 and 4), row 3 and 4 to device 1 (at 1 and 5)
    b0 = (op0, out, np.array([0, 1, 3, 4]), np.array([1, 2, 1, 1]), np.array([0, 4, 1, 5]), np.array([1, 2, 1, 0]))
    # device 1 sends row 0 to device 0 (at 1), nothing else to 0, rows 1:3 to device 1 (at 2)
    b1 = (op1, out, np.array([0, 0, 1, 0]), np.array([1, 0, 2, 0]), np.array([1, 0, 2, 0]), np.array([1, 1, 2, 0]))
    r0, r1 = rule("ragged_all_to_all")([b0, b1])
    # device 0 receives recv sizes [1, 2 | 1, 0]; device 1 receives [1, 1 | 2, 0]
    assert r0.tolist() == [[0, 1], [100, 101], [-1, -1], [-1, -1], [2, 3], [4, 5]]
    assert r1.tolist() == [[-1, -1], [6, 7], [102, 103], [104, 105], [-1, -1], [8, 9]]
    with pytest.raises(ValueError, match="expects"):
        bad = (*b1[:5], np.array([1, 1, 1, 0]))   # device 1 expects 1 row from itself, gets 2
        rule("ragged_all_to_all")([b0, bad])
    with pytest.raises(ValueError, match="out of bounds"):
        rule("ragged_all_to_all")([(op0, out, np.array([0, 1, 3, 4]), np.array([1, 2, 1, 1]),
                                    np.array([0, 5, 1, 5]), np.array([1, 2, 1, 1])), b1])


def test_ragged_all_to_all_vectorized_equals_the_rule():
    rng = np.random.default_rng(3)
    G, n, K = 2, 3, 6
    operand = rng.standard_normal((G, n, 8, 2)).astype(np.float32)
    output = np.zeros((G, n, 9, 2), np.float32)
    send = rng.integers(0, 3, (G, n, K))
    recv = np.stack([send[g].reshape(n, n, 2).transpose(1, 0, 2).reshape(n, K) for g in range(G)])
    input_offsets = np.zeros((G, n, K), int)
    output_offsets = np.stack([np.stack([np.arange(K) for _ in range(n)]) for _ in range(G)])
    y = PRIMITIVES["ragged_all_to_all"].vectorized(operand, output, input_offsets, send, output_offsets, recv)
    for g in range(G):
        blocks = [(operand[g, r], output[g, r], input_offsets[g, r], send[g, r], output_offsets[g, r], recv[g, r])
                  for r in range(n)]
        for r, expected in enumerate(rule("ragged_all_to_all")(blocks)):
            np.testing.assert_array_equal(y[g, r], expected)


@pytest.mark.parametrize("dtype", [np.float32, np.int16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", ["psum", "pmax", "all_gather"])
def test_vectorized_results_given_to_every_rank_are_read_only_views_of_one_value(name, dtype):
    """The vectorized forms hand every rank of a group the same array: stride 0 along the rank axis, so it
    must be read-only (a write would reach every device's copy), whatever the dtype (NumPy's own dtypes take
    a direct view, ml_dtypes' np.broadcast_to)."""
    x = np.arange(2 * 4 * 3).reshape(2, 4, 3).astype(dtype)   # 2 groups of 4 ranks, blocks of shape (3,)
    params = {"all_gather_dimension": 0, "tiled": False} if name == "all_gather" else {}
    out = PRIMITIVES[name].vectorized(x, **params)
    assert not out.flags.writeable and out.strides[1] == 0 and out.dtype == np.dtype(dtype)
    for g in range(2):
        per_rank = rule(name)(list(x[g]), **params)
        for r in range(4):
            assert out[g, r].tobytes() == np.asarray(per_rank[r]).tobytes()


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_broadcast_view_is_np_broadcast_to(data):
    """broadcast_view gives np.broadcast_to's array (values, shape, dtype, read-only, no copy), made directly or
    by np.broadcast_to itself (other dtypes, strided or empty operands), and its error where shapes do not fit."""
    from spmdsim.runtime._values import broadcast_view
    dtype = data.draw(st.sampled_from([np.float32, np.int8, np.bool_, np.complex64, ml_dtypes.bfloat16]))
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=3))
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).astype(dtype)
    if data.draw(st.booleans()) and x.ndim:
        x = np.concatenate([x, x], axis=-1)[..., ::2]   # a strided view
    lead = data.draw(st.lists(st.integers(1, 3), max_size=2))
    target = (*lead, *(data.draw(st.sampled_from([n, 2, 3])) if n == 1 else n for n in x.shape))
    if data.draw(st.booleans()) and target:
        target = (*target[:-1], target[-1] + 1)             # may not fit
    try:
        expected = np.broadcast_to(x, target)
    except ValueError:
        with pytest.raises(ValueError):
            broadcast_view(x, target)
        return
    out = broadcast_view(x, target)
    assert out.shape == expected.shape and out.dtype == expected.dtype and not out.flags.writeable
    assert out.tobytes() == expected.tobytes()
    assert x.size == 0 or np.shares_memory(out, x)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16, np.float32,
                                   np.float64, np.complex64, np.complex128])
def test_psum_of_scalar_blocks_is_the_fold_of_one_element_blocks(dtype):
    """0-d blocks are summed with NumPy's scalar arithmetic: bit for bit what the array fold gives for the same
    values as 1-element blocks, overflow wrapping, inf, NaN and -0.0 included."""
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    special = [info.max, info.max, 1, info.min] if info is not None else \
        [True, False, True] if dtype is np.bool_ else [np.inf, -np.inf, np.nan, -0.0, 1e4, 1e-8, 3.3]
    rng = np.random.default_rng(1)
    values = [*special, *(rng.standard_normal(5) * 100)] if dtype is not np.bool_ else special * 2
    for n in (1, 2, 3, 8):
        for start in range(len(values) - n + 1):
            chosen = [np.asarray(v).astype(dtype) for v in values[start:start + n]]
            with np.errstate(all="ignore"):
                expected = rule("psum")([c.reshape(1) for c in chosen])[0].reshape(())
            got = rule("psum")(chosen)[0]
            assert got.shape == () and got.dtype == dtype and not got.flags.writeable
            assert got.tobytes() == expected.tobytes(), (chosen, got, expected)
