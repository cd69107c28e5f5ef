"""spmdsim.lax inside pmap: values, shapes and dtypes, checked against NumPy reasoning and the numbers
measured on JAX 0.10.2 (../shared/JAX-PMAP-SEMANTICS.md)."""
import collections

import numpy as np
import pytest

import spmdsim
from spmdsim import lax


def run(fn, x, **kw):
    return spmdsim.pmap(fn, axis_name="i", **kw)(x)


def test_psum_pmean_pmax_pmin_values():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(run(lambda v: lax.psum(v, "i"), x), np.broadcast_to(x.sum(0), (4, 4)))
    np.testing.assert_array_equal(run(lambda v: lax.pmean(v, "i"), x), np.broadcast_to(x.mean(0), (4, 4)))
    np.testing.assert_array_equal(run(lambda v: lax.pmax(v, "i"), x), np.broadcast_to(x.max(0), (4, 4)))
    np.testing.assert_array_equal(run(lambda v: lax.pmin(v, "i"), x), np.broadcast_to(x.min(0), (4, 4)))


def test_psum_groups_jax_docstring_example():
    x = np.arange(16).reshape(4, 4)
    out = run(lambda v: lax.psum(v, "i", axis_index_groups=[[0, 1], [2, 3]]), x)
    np.testing.assert_array_equal(out, [[4, 6, 8, 10], [4, 6, 8, 10], [20, 22, 24, 26], [20, 22, 24, 26]])


@pytest.mark.parametrize("dtype,expected", [(np.bool_, np.int32), (np.int8, np.int8), (np.uint8, np.uint8),
                                            (np.int32, np.int32), (np.float16, np.float16),
                                            (np.float32, np.float32), (np.complex64, np.complex64)])
def test_psum_dtypes(dtype, expected):
    out = run(lambda v: lax.psum(v, "i"), np.ones((4, 2), dtype))
    assert out.dtype == expected
    np.testing.assert_array_equal(out, np.full((4, 2), 4))


def test_psum_uint8_wraps():
    out = run(lambda v: lax.psum(v, "i"), np.array([200, 100, 1, 2], np.uint8))
    assert out.dtype == np.uint8 and out.tolist() == [47] * 4


@pytest.mark.parametrize("dtype,expected", [(np.int32, np.float32), (np.bool_, np.float32),
                                            (np.float16, np.float16), (np.float32, np.float32),
                                            (np.float64, np.float64)])
def test_pmean_dtypes(dtype, expected):
    out = run(lambda v: lax.pmean(v, "i"), np.arange(4).astype(dtype))
    assert out.dtype == expected
    np.testing.assert_allclose(out.astype(np.float64), np.arange(4).astype(dtype).astype(np.float64).mean())


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_pmean_of_scalars_is_bit_for_bit_the_pmean_of_one_element_arrays(dtype):
    """Scalar blocks (a loss) are summed and divided with NumPy's scalar arithmetic: the same bits as the array
    path gives for the same values as 1-element blocks (and XLA:CPU for the same sum and division)."""
    rng = np.random.default_rng(3)
    for n in (2, 3, 8):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dtype)
        with spmdsim.set_device_count(n):
            scalar = run(lambda v: lax.pmean(v, "i"), x)
            array = run(lambda v: lax.pmean(v, "i"), x.reshape(n, 1))
        assert scalar.dtype == dtype and scalar.tobytes() == array.reshape(n).tobytes()


def test_tree_operands_of_every_kind_in_one_rendezvous():
    """A pytree of bool and int8 arrays, NumPy scalars (np.mean returns one) and a Python float: converted as
    JAX converts them (bool sums in int32, a NumPy scalar keeps its dtype, the Python float is float32),
    reduced leaf by leaf, every device getting the same values: what jax.pmap gives for the same program (JAX
    0.10.2, jnp in place of np)."""
    def f(v):
        tree = {"flags": v > 1, "flag": np.bool_(True), "mean": np.mean(v), "small": v.astype(np.int8), "c": 2.0}
        return lax.psum(tree, "i"), lax.pmean(tree, "i"), lax.pmax(tree, "i")

    total, mean, top = run(f, np.arange(4, dtype=np.float32))
    assert {k: (v.dtype, v.tolist()) for k, v in total.items()} == {
        "flags": (np.int32, [2] * 4), "flag": (np.int32, [4] * 4), "mean": (np.float32, [6.0] * 4),
        "small": (np.int8, [6] * 4), "c": (np.float32, [8.0] * 4)}
    assert {k: (v.dtype, v.tolist()) for k, v in mean.items()} == {
        "flags": (np.float32, [0.5] * 4), "flag": (np.float32, [1.0] * 4), "mean": (np.float32, [1.5] * 4),
        "small": (np.float32, [1.5] * 4), "c": (np.float32, [2.0] * 4)}
    assert {k: (v.dtype, v.tolist()) for k, v in top.items()} == {
        "flags": (np.bool_, [True] * 4), "flag": (np.bool_, [True] * 4), "mean": (np.float32, [3.0] * 4),
        "small": (np.int8, [3] * 4), "c": (np.float32, [2.0] * 4)}


def test_pmax_keeps_bool_and_int():
    assert run(lambda v: lax.pmax(v, "i"), np.array([False, True, False, False])).dtype == np.bool_
    out = run(lambda v: lax.pmin(v, "i"), np.array([3, -1, 2, 5], np.int8))
    assert out.dtype == np.int8 and out.tolist() == [-1] * 4


def test_uneven_groups_reductions():
    # Measured on JAX: x = arange(4), groups [[0], [1, 2, 3]]: psum [0,6,6,6], pmax [0,3,3,3], pmin [0,1,1,1].
    x, g = np.arange(4), [[0], [1, 2, 3]]
    assert run(lambda v: lax.psum(v, "i", axis_index_groups=g), x).tolist() == [0, 6, 6, 6]
    assert run(lambda v: lax.pmax(v, "i", axis_index_groups=g), x).tolist() == [0, 3, 3, 3]
    assert run(lambda v: lax.pmin(v, "i", axis_index_groups=g), x).tolist() == [0, 1, 1, 1]
    # Documented difference: JAX divides by len(groups[0]) = 1 and gives [0, 6, 6, 6]; spmdsim's mean is exact.
    assert run(lambda v: lax.pmean(v, "i", axis_index_groups=g), x).tolist() == [0, 2, 2, 2]


def test_unmapped_value_is_reduced_n_times():
    f = spmdsim.pmap(lambda x, c: lax.psum(c, "i"), axis_name="i", in_axes=(0, None))
    assert f(np.zeros(4), np.float32(2.5)).tolist() == [10.0] * 4


def test_constant_operands_fold_without_communication():
    def f(v):
        return lax.psum(1, "i"), lax.psum(2.0, "i"), lax.pmax(7, "i"), lax.pmean(3, "i"), \
            lax.psum(1, "i", axis_index_groups=[[0, 1], [2, 3]])
    with spmdsim.trace() as tr:
        out = run(f, np.zeros(4))
    assert [o.tolist() for o in out] == [[4] * 4, [8.0] * 4, [7] * 4, [3.0] * 4, [2] * 4]
    assert not tr.events


def test_python_int_inside_is_a_python_int():
    seen = []
    run(lambda v: seen.append((type(lax.axis_size("i")), type(lax.psum(1, "i")))) or v, np.zeros(2))
    assert seen == [(int, int)] * 2


def test_positional_axes_in_psum():
    x = np.arange(24).reshape(4, 2, 3)
    out = run(lambda v: lax.psum(v, ("i", 0)), x)
    np.testing.assert_array_equal(out, np.broadcast_to(x.sum((0, 1)), (4, 3)))
    assert out.dtype == x.dtype
    assert run(lambda v: lax.psum(v, 1), x).shape == (4, 2)
    assert run(lambda v: lax.psum(v, ()), x).shape == x.shape


def test_pytree_operand_one_rendezvous():
    tree = {"a": np.ones((4, 2)), "b": (np.arange(4), None)}
    with spmdsim.trace() as tr:
        out = spmdsim.pmap(lambda t: lax.psum(t, "i"), axis_name="i")(tree)
    assert out["b"][1] is None
    np.testing.assert_array_equal(out["a"], np.full((4, 2), 4.0))
    assert out["b"][0].tolist() == [6] * 4
    assert tr.counts() == collections.Counter({"psum": 1})


def test_all_gather_variants():
    x = np.arange(1, 5)
    assert run(lambda v: lax.all_gather(v, "i"), x).tolist() == [[1, 2, 3, 4]] * 4
    g = run(lambda v: lax.all_gather(v, "i", axis_index_groups=[[0, 2], [3, 1]]), x)
    assert g.tolist() == [[1, 3], [4, 2], [1, 3], [4, 2]]
    X = np.arange(4 * 2 * 3).reshape(4, 2, 3)
    assert run(lambda v: lax.all_gather(v, "i", axis=-1), X).shape == (4, 2, 3, 4)
    np.testing.assert_array_equal(run(lambda v: lax.all_gather(v, "i", axis=1), X)[0], np.moveaxis(X, 0, 1))
    tiled = run(lambda v: lax.all_gather(v, "i", axis=1, tiled=True), X)
    assert tiled.shape == (4, 2, 12)
    np.testing.assert_array_equal(tiled[2], np.concatenate(list(X), axis=1))
    b = run(lambda v: lax.all_gather(v, "i"), np.array([True, False, True, True]))
    assert b.dtype == np.bool_


def test_all_gather_of_unmapped_value_stacks_copies():
    f = spmdsim.pmap(lambda x, c: lax.all_gather(c, "i"), axis_name="i", in_axes=(0, None))
    np.testing.assert_array_equal(f(np.zeros(3), np.array([7, 8]))[1], [[7, 8]] * 3)


def test_psum_scatter_variants():
    X = np.arange(4 * 4 * 3, dtype=np.float32).reshape(4, 4, 3)
    S = X.sum(0)
    out = run(lambda v: lax.psum_scatter(v, "i"), X)
    np.testing.assert_array_equal(out, S)                       # device r gets S[r]
    out = run(lambda v: lax.psum_scatter(v, "i", scatter_dimension=1, tiled=True), np.ones((4, 2, 8)))
    assert out.shape == (4, 2, 2) and out.max() == 4
    # groups of two, rank by listed order
    out = run(lambda v: lax.psum_scatter(v, "i", axis_index_groups=[[0, 2], [3, 1]]), np.arange(8.).reshape(4, 2))
    # group [0,2]: S=[4,6]+... rows: x0=[0,1], x2=[4,5] -> S=[4,6]; dev0 rank0 -> 4, dev2 rank1 -> 6
    # group [3,1]: x3=[6,7], x1=[2,3] -> S=[8,10]; dev3 rank0 -> 8, dev1 rank1 -> 10
    assert out.tolist() == [4, 10, 6, 8]
    neg = run(lambda v: lax.psum_scatter(v, "i", scatter_dimension=-1), np.ones((4, 3, 4)))
    assert neg.shape == (4, 3)  # documented difference: JAX 0.10 crashes on negative scatter_dimension


def test_all_to_all_and_pswapaxes_global_views():
    X = np.arange(4 * 4 * 3).reshape(4, 4, 3)
    np.testing.assert_array_equal(run(lambda v: lax.all_to_all(v, "i", 0, 0), X), np.moveaxis(X, (0, 1), (1, 0)))
    np.testing.assert_array_equal(run(lambda v: lax.all_to_all(v, "i", 0, 1), X), np.moveaxis(X, (0, 1), (2, 0)))
    Y = np.arange(4 * 3 * 4).reshape(4, 3, 4)
    np.testing.assert_array_equal(run(lambda v: lax.pswapaxes(v, "i", 1), Y), np.swapaxes(Y, 0, 2))
    t = run(lambda v: lax.all_to_all(v, "i", 1, 0, tiled=True), np.arange(4 * 2 * 8).reshape(4, 2, 8))
    assert t.shape == (4, 8, 2)


def test_all_to_all_with_groups_ranks_by_listed_order():
    X = np.arange(4 * 2).reshape(4, 2)
    out = run(lambda v: lax.all_to_all(v, "i", 0, 0, axis_index_groups=[[0, 2], [3, 1]]), X)
    # device 0 (rank 0 of [0,2]) gets [x0[0], x2[0]]; device 2 (rank 1) gets [x0[1], x2[1]]
    assert out.tolist() == [[0, 4], [7, 3], [1, 5], [6, 2]]


def test_ppermute_and_pshuffle():
    x = np.arange(1, 5, dtype=np.int32)
    assert run(lambda v: lax.ppermute(v, "i", [(0, 1), (1, 2), (2, 3)]), x).tolist() == [0, 1, 2, 3]
    assert run(lambda v: lax.ppermute(v, "i", []), x).tolist() == [0, 0, 0, 0]
    assert run(lambda v: lax.ppermute(v, "i", [(1, 1)]), x).tolist() == [0, 2, 0, 0]
    assert run(lambda v: lax.ppermute(v, "i", [(-1, 0)]), x).tolist() == [4, 0, 0, 0]
    assert run(lambda v: lax.ppermute(v, "i", zip(range(4), [1, 2, 3, 0])), x).tolist() == [4, 1, 2, 3]
    assert run(lambda v: lax.ppermute(v, "i", np.array([[0, 1], [1, 0]])), x).tolist() == [2, 1, 0, 0]
    assert run(lambda v: lax.ppermute(v > 2, "i", [(3, 0)]), x).tolist() == [True, False, False, False]
    assert run(lambda v: lax.pshuffle(v, "i", [3, 0, 1, 2]), x).tolist() == [4, 1, 2, 3]
    assert run(lambda v: lax.pshuffle(v, "i", [1, 0]), x).tolist() == [2, 1, 0, 0]


def test_pbroadcast():
    assert run(lambda v: lax.pbroadcast(v, "i", 2), np.arange(4) * 10).tolist() == [20] * 4


def test_axis_index_and_size():
    assert run(lambda v: lax.axis_index("i"), np.zeros(5)).tolist() == list(range(5))
    assert run(lambda v: lax.axis_index("i"), np.zeros(5)).dtype == np.int32
    assert run(lambda v: np.array(lax.axis_size("i")), np.zeros(5)).tolist() == [5] * 5


def test_axis_index_follows_position_not_device_id():
    devs = list(reversed(spmdsim.devices()[:4]))
    assert spmdsim.pmap(lambda v: lax.axis_index("i"), "i", devices=devs)(np.zeros(4)).tolist() == [0, 1, 2, 3]


# -- errors ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda v: lax.psum(v, "j"), lambda v: lax.pmean(v, "j"), lambda v: lax.pmax(v, "j"),
    lambda v: lax.all_gather(v, "j"), lambda v: lax.psum_scatter(v, "j"), lambda v: lax.all_to_all(v, "j", 0, 0),
    lambda v: lax.ppermute(v, "j", []), lambda v: lax.pshuffle(v, "j", [0]), lambda v: lax.pswapaxes(v, "j", 0),
    lambda v: lax.axis_index("j"), lambda v: lax.axis_size("j"), lambda v: lax.pbroadcast(v, "j", 0)])
def test_unbound_axis_name_is_a_name_error(call):
    with pytest.raises(NameError, match="unbound axis name: j") as info:
        run(call, np.zeros((4, 4)))
    assert "'i'" in str(info.value)        # says which names are bound
    assert "raised on device 0" in "\n".join(info.value.__notes__)


def test_collective_outside_any_map():
    with pytest.raises(NameError, match="unbound axis name: i"):
        lax.psum(np.ones(3), "i")
    with pytest.raises(NameError, match="unbound axis name: i"):
        lax.ppermute(np.ones(3), "i", [])


def test_pmap_without_axis_name_binds_no_name():
    with pytest.raises(NameError, match="unbound axis name: batch"):
        spmdsim.pmap(lambda v: lax.psum(v, "batch"))(np.zeros(2))


@pytest.mark.parametrize("call,cls,phrase", [
    (lambda v: lax.psum(v, ("i", "i")), ValueError, "repeated axis"),
    (lambda v: lax.psum(v, "i", axis_index_groups=[[0, 1], [1, 2, 3]]), ValueError, "exactly once"),
    (lambda v: lax.psum(v, "i", axis_index_groups=[[0, 1]]), ValueError, "has size 4"),
    (lambda v: lax.psum(v, ("i", 0), axis_index_groups=[[0, 1], [2, 3]]), ValueError, "just named axes"),
    (lambda v: lax.ppermute(v, "i", [(0, 1), (0, 2)]), ValueError, "must be unique"),
    (lambda v: lax.ppermute(v, "i", [(0, 5)]), IndexError, "out of range"),
    (lambda v: lax.pshuffle(v, "i", [1, 1, 2, 3]), ValueError, "does not represent a permutation"),
    (lambda v: lax.psum_scatter(v, "i"), ValueError, "size 3 must match shard count 4"),
    (lambda v: lax.psum_scatter(v, "i", tiled=True), ValueError, "divisible"),
    (lambda v: lax.psum_scatter(v > 0, "i", scatter_dimension=1), TypeError, "bool"),
    (lambda v: lax.psum_scatter(v[0, 0], "i"), ValueError, "rank"),
    (lambda v: lax.all_to_all(v, "i", 0, 0), ValueError, "they are 4 and 3"),
    (lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True), ValueError, "divisible"),
    (lambda v: lax.all_gather(v, "i", axis=3), ValueError, "out of bounds"),
    (lambda v: lax.all_gather(v[0, 0], "i", tiled=True), ValueError, "rank"),
    (lambda v: lax.all_gather(v, "i", axis_index_groups=[[0], [1, 2, 3]]), ValueError, "same size"),
])
def test_collective_argument_errors(call, cls, phrase):
    with pytest.raises(cls, match=phrase):
        run(call, np.ones((4, 3, 4)))


def test_pytree_leaves_of_different_ranks_with_a_negative_axis():
    t = {"a": np.arange(4 * 3).reshape(4, 3), "b": np.arange(4 * 3 * 2).reshape(4, 3, 2)}
    with spmdsim.trace() as tr:
        out = spmdsim.pmap(lambda v: lax.all_gather(v, "i", axis=-1), "i")(t)
    np.testing.assert_array_equal(out["a"][1], np.moveaxis(t["a"], 0, -1))
    np.testing.assert_array_equal(out["b"][2], np.moveaxis(t["b"], 0, -1))
    assert [e.params["all_gather_dimension"] for e in tr.events] == [1, 2]    # one rendezvous per leaf
    same = spmdsim.pmap(lambda v: lax.psum_scatter(v, "i", scatter_dimension=-1), "i")(
        {"a": np.ones((4, 4)), "b": np.ones((4, 2, 4))})
    assert same["a"].shape == (4,) and same["b"].shape == (4, 2)


def test_psend_then_precv_is_a_ppermute_split_in_two():
    def f(x):
        token = lax.psend(x, "i", [(0, 1), (1, 2), (2, 0)])
        return lax.precv(token, x, "i", [(0, 1), (1, 2), (2, 0)])
    assert run(f, np.arange(1.0, 5.0)).tolist() == [3.0, 1.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="no psend with that perm"):
        run(lambda x: lax.precv(None, x, "i", [(0, 1)]), np.arange(4.0))
    with pytest.raises(ValueError, match="asked for"):
        run(lambda x: lax.precv(lax.psend(x, "i", [(0, 1)]), np.zeros(2), "i", [(0, 1)]), np.arange(4.0))
