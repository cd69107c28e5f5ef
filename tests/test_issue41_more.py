"""Issue 41, part 2 (rough edges): each test failed before its change. The NumPy front end's part; the JAX
front end's is conformance/test_issue41_more.py."""
import functools
import traceback

import numpy as np
import pytest

import spmdsim
from spmdsim import lax
from spmdsim.errors import MappedSizeError


# -- a trace names each device call after the mapped function ---------------------------------------------

def step(x):
    return lax.psum(x, "i")


def test_a_trace_of_a_pmap_names_its_device_calls_after_the_function(tmp_path):
    with spmdsim.set_device_count(4), spmdsim.trace() as tr:
        spmdsim.pmap(step, "i")(np.arange(4.0))
        spmdsim.pmap(functools.partial(step), "i")(np.arange(4.0))
    doc = tr.to_perfetto(tmp_path / "t.json")
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "call"]
    assert names == ["step"] * 8


def test_a_trace_of_a_shard_map_and_of_a_nested_pmap_names_their_calls():
    def local_sum(x):
        return lax.psum(x, "x")

    def outer(x):
        return spmdsim.pmap(step, "i")(x)

    mesh = spmdsim.make_mesh((4,), ("x",))
    with spmdsim.set_device_count(4), spmdsim.trace() as tr:
        spmdsim.shard_map(local_sum, mesh=mesh, in_specs=spmdsim.P("x"), out_specs=spmdsim.P())(np.arange(8.0))
        spmdsim.pmap(outer, "o")(np.ones((2, 2)))
    assert sorted({c.name for c in tr.calls}) == ["local_sum", "outer", "step"]
    assert "mapped call" not in {c.name for c in tr.calls}


# -- a size error says which axis has the mapped size ------------------------------------------------------

def first(a, b):
    return a


def test_a_size_error_hints_at_the_axis_that_has_the_mapped_size():
    with spmdsim.set_device_count(4), pytest.raises(MappedSizeError) as info:
        spmdsim.pmap(first)(np.ones((4, 3)), np.ones((3, 4)))
    assert str(info.value).endswith("args[1] has size 4 on axis 1: in_axes=(0, 1)?")
    text = "".join(traceback.format_exception_only(info.value))
    assert text.startswith("spmdsim.errors.MappedSizeError: ")
    with spmdsim.set_device_count(4), pytest.raises(MappedSizeError) as info:   # with a broadcast argument
        spmdsim.pmap(lambda a, s, b: a, in_axes=(0, None, 0))(np.ones((4, 3)), 2.0, np.ones((3, 4)))
    assert str(info.value).endswith("args[2] has size 4 on axis 1: in_axes=(0, None, 1)?")


def test_no_axis_hint_where_no_other_axis_has_the_size():
    with spmdsim.set_device_count(4), pytest.raises(MappedSizeError) as info:
        spmdsim.pmap(first)(np.ones((4, 3)), np.ones((3, 3)))
    assert "in_axes=(0, 1)" not in str(info.value) and "on axis 1" not in str(info.value)
