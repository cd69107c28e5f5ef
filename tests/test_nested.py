"""Two named axes: pmap(vmap(...)), nested pmap, shadowing. Expected numbers are those measured on JAX 0.10.2
for pmap(vmap(f, axis_name='j'), axis_name='i') with x = arange(8).reshape(2, 4)."""
import numpy as np
import pytest

import spmdsim
from spmdsim import lax

X = np.arange(8).reshape(2, 4)


def both(f, inner=spmdsim.vmap):
    return spmdsim.pmap(inner(f, axis_name="j"), axis_name="i")


@pytest.mark.parametrize("inner", [spmdsim.vmap, spmdsim.pmap], ids=["pmap_vmap", "nested_pmap"])
def test_collectives_over_inner_outer_and_both(inner):
    assert both(lambda v: lax.psum(v, "j"), inner)(X).tolist() == [[6] * 4, [22] * 4]
    assert both(lambda v: lax.psum(v, "i"), inner)(X).tolist() == [[4, 6, 8, 10]] * 2
    assert both(lambda v: lax.psum(v, ("i", "j")), inner)(X).tolist() == [[28] * 4] * 2
    assert both(lambda v: lax.psum(v, ("j", "i")), inner)(X).tolist() == [[28] * 4] * 2
    assert both(lambda v: lax.pmean(v, ("i", "j")), inner)(X).tolist() == [[3.5] * 4] * 2
    assert both(lambda v: lax.pmax(v, "i"), inner)(X).tolist() == [[4, 5, 6, 7]] * 2


def test_axis_index_of_a_tuple_is_row_major_in_the_given_order():
    x = np.zeros((2, 3))
    assert both(lambda v: lax.axis_index(("i", "j")))(x).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert both(lambda v: lax.axis_index(("j", "i")))(x).tolist() == [[0, 2, 4], [1, 3, 5]]
    assert both(lambda v: np.array(lax.axis_size(("i", "j"))))(x).tolist() == [[6] * 3] * 2


def test_ppermute_gather_scatter_all_to_all_over_either_axis():
    assert both(lambda v: lax.ppermute(v, "j", [(0, 1), (1, 2), (2, 3), (3, 0)]))(X).tolist() == [[3, 0, 1, 2], [7, 4, 5, 6]]
    assert both(lambda v: lax.ppermute(v, "i", [(0, 1), (1, 0)]))(X).tolist() == [[4, 5, 6, 7], [0, 1, 2, 3]]
    g = both(lambda v: lax.all_gather(v, "i"))(X)
    assert g.shape == (2, 4, 2) and g[1, 2].tolist() == [2, 6]
    y = np.arange(2 * 4 * 4).reshape(2, 4, 4)
    s = both(lambda v: lax.psum_scatter(v, "j"))(y)
    np.testing.assert_array_equal(s, y.sum(1))
    # all_to_all over the flattened product axis (works in JAX too)
    z = np.arange(2 * 4 * 8).reshape(2, 4, 8)
    out = both(lambda v: lax.all_to_all(v, ("i", "j"), 0, 0))(z)
    flat = z.reshape(8, 8)
    np.testing.assert_array_equal(out.reshape(8, 8), flat.T)


def test_superset_gathers_over_both_axes():
    # JAX 0.10 raises AssertionError for all_gather over ('i', 'j') in pmap(vmap); spmdsim gathers row-major.
    g = both(lambda v: lax.all_gather(v, ("i", "j")))(X)
    assert g.shape == (2, 4, 8) and g[0, 0].tolist() == list(range(8))


def test_inner_name_shadows_outer():
    f = spmdsim.pmap(spmdsim.vmap(lambda v: lax.psum(v, "i"), axis_name="i"), axis_name="i")
    assert f(X).tolist() == [[6] * 4, [22] * 4]


def test_nested_pmap_counts_devices():
    f = spmdsim.pmap(spmdsim.pmap(lambda v: v, axis_name="j"), axis_name="i")
    assert f(np.zeros((2, 4))).shape == (2, 4)
    with pytest.raises(ValueError, match="enclosing pmaps already use 4 devices per block"):
        f(np.zeros((4, 4)))
    # vmap uses no devices
    assert spmdsim.pmap(spmdsim.vmap(lambda v: v, axis_name="j"), axis_name="i")(np.zeros((8, 16))).shape == (8, 16)


def test_nested_device_labels():
    labels = []
    spmdsim.pmap(spmdsim.pmap(lambda v: labels.append(lax.axis_index(("i", "j")).item()) or v, axis_name="j"),
                 axis_name="i")(np.zeros((2, 2)))
    assert sorted(labels) == [0, 1, 2, 3]


def test_sequential_nested_calls_are_separate_communicators():
    def outer(v):
        a = spmdsim.vmap(lambda w: lax.psum(w, "i"), axis_name="j")(v)
        b = spmdsim.vmap(lambda w: lax.psum(w * 10, "i"), axis_name="j")(v)
        return a + b

    assert spmdsim.pmap(outer, axis_name="i")(X).tolist() == [[44, 66, 88, 110]] * 2
