"""``_primitives.prepare``: a collective bound from a fixed call site gives what ``bind`` gives, results and
errors alike, however the lanes, meshes and operands around it change."""
import numpy as np
import pytest

import spmdsim
from spmdsim.primitives import _primitives
from spmdsim.errors import CollectiveMismatchError, UnboundAxisError

PSUM_I = _primitives.prepare("psum", {"axes": ("i",), "axis_index_groups": None})


def test_one_prepared_call_over_meshes_and_operands_of_every_size():
    """The same prepared psum under 2, 4 and 8 devices and three operand shapes and dtypes, twice each (the
    second time through the checked call kept for that size and avals): the rank-order sum every time."""
    for n in (2, 4, 8):
        for shape, dtype in [((3,), np.float32), ((2, 2), np.int32), ((), np.float64)]:
            x = (np.arange(n * int(np.prod(shape))) + 1).reshape(n, *shape).astype(dtype)
            with spmdsim.set_device_count(n):
                f = spmdsim.pmap(lambda v: PSUM_I([v, v * 2]), axis_name="i")
                for _ in range(2):
                    a, b = f(x)
                    np.testing.assert_array_equal(a, np.broadcast_to(x.sum(0, dtype=dtype), x.shape))
                    np.testing.assert_array_equal(b, np.broadcast_to((x * 2).sum(0, dtype=dtype), x.shape))
                    assert a.dtype == b.dtype == dtype


def test_other_parameters_and_a_mesh():
    gather = _primitives.prepare("all_gather", {"axis_name": ("j",), "all_gather_dimension": 0, "tiled": True,
                                                "axis_index_groups": None, "axis_size": 2})
    x = np.arange(8.0).reshape(4, 2)
    f = spmdsim.pmap(spmdsim.pmap(lambda v: gather([v])[0], axis_name="j"), axis_name="i")
    out = f(x.reshape(2, 2, 2))
    for i in range(2):  # each 'i' row gathers its own two blocks, concatenated
        for j in range(2):
            np.testing.assert_array_equal(out[i, j], x.reshape(2, 2, 2)[i].reshape(4))


def test_what_bind_takes_instead_is_still_right():
    """Positional axes, unhashable groups and point-to-point over two names go through bind."""
    x = np.arange(12.0).reshape(4, 3)
    positional = _primitives.prepare("psum", {"axes": ("i", 0), "axis_index_groups": None})
    out = spmdsim.pmap(lambda v: positional([v])[0], axis_name="i")(x)
    np.testing.assert_array_equal(out, np.full(4, x.sum()))
    grouped = _primitives.prepare("psum", {"axes": ("i",), "axis_index_groups": [[0, 2], [1, 3]]})
    out = spmdsim.pmap(lambda v: grouped([v])[0], axis_name="i")(x)
    np.testing.assert_array_equal(out, np.stack([x[0] + x[2], x[1] + x[3], x[0] + x[2], x[1] + x[3]]))


def test_outside_a_map_it_raises_binds_error():
    with pytest.raises(UnboundAxisError, match="unbound axis name: i"):
        PSUM_I([np.ones(2)])


def test_checks_run_for_each_new_signature_on_the_fast_path():
    """The second call on a lane takes the kept path; a new shape there is checked like bind's first call."""
    scatter = _primitives.prepare("reduce_scatter", {"axis_name": ("i",), "scatter_dimension": 0, "tiled": False,
                                                     "axis_index_groups": None})

    def body(v):
        first = scatter([np.ones((2, 3))])[0]            # fine: dimension 0 has size 2 = the axis size
        return first, scatter([np.ones((3, 3))])[0]      # not: size 3 != 2

    with pytest.raises(ValueError, match="must match shard count 2"):
        spmdsim.pmap(body, axis_name="i")(np.zeros((2, 1)))


def test_devices_that_disagree_are_a_mismatch():
    def body(v):
        PSUM_I([v])                                       # step 0: agreed
        return PSUM_I([v if spmdsim.lax.axis_index("i") == 0 else v[:1]])[0]  # step 1: shapes differ

    with pytest.raises(CollectiveMismatchError, match="step 1"):
        spmdsim.pmap(body, axis_name="i")(np.zeros((4, 2)))


def test_a_checked_call_is_kept_per_axis_size():
    """Operands that passed the checks under 2 devices are checked again under 4."""
    scatter = _primitives.prepare("reduce_scatter", {"axis_name": ("i",), "scatter_dimension": 0, "tiled": False,
                                                     "axis_index_groups": None})

    def body(v):
        n = spmdsim.lax.axis_size("i")
        return scatter([np.ones((n, 3))])[0], scatter([np.ones((2, 3))])[0]  # the second: the kept path

    with spmdsim.set_device_count(4):
        f = spmdsim.pmap(body, axis_name="i")
        np.testing.assert_array_equal(f(np.zeros((2, 1)))[1], np.full((2, 3), 2.0))
        with pytest.raises(ValueError, match="must match shard count 4"):
            f(np.zeros((4, 1)))
