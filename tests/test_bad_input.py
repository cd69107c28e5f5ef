"""Bad arguments raise JAX's exception class with a message naming the argument, in both front ends (the
cases of issue 17's fault-injection catalogue). Where spmdsim's class deliberately differs from what JAX 0.10
raises, the test says so (and the README's table lists it)."""
import re

import numpy as np
import pytest

import spmdsim
from spmdsim import lax

X = np.arange(8.0)
NOT_NUMBERS = {"str": np.array(list("abcdefgh")), "object": np.array([object()] * 8, dtype=object),
               "datetime64": np.arange(8).astype("datetime64[s]")}


def numpy_pmap(fun, **kwargs):
    return spmdsim.pmap(fun, axis_name="i", **kwargs)


def jax_pmap(fun, **kwargs):
    pytest.importorskip("jax")
    import spmdsim.jax
    return spmdsim.jax.pmap(fun, axis_name="i", **kwargs)


def psum(x, *args, **kwargs):
    """The front end's psum (spmdsim.lax for NumPy values, jax.lax under the JAX front end's tracing)."""
    if isinstance(x, np.ndarray):
        return lax.psum(x, *args, **kwargs)
    import jax
    return jax.lax.psum(x, *args, **kwargs)


FRONT_ENDS = [numpy_pmap, jax_pmap]


@pytest.mark.parametrize("pmap", FRONT_ENDS)
def test_static_argnum_out_of_range_is_a_value_error_naming_it(pmap):
    """JAX 0.10 ignores a negative static_broadcasted_argnums and fails later in sharding (ValueError)."""
    with pytest.raises(ValueError, match=r"static_broadcasted_argnums=\(-5,\) but was called with only 2 positional"):
        pmap(lambda a, b: a, static_broadcasted_argnums=(-5,))(X.astype(np.float32), 1)


@pytest.mark.parametrize("pmap, kwargs", [(numpy_pmap, {}), (jax_pmap, {"executor": "threads"}),
                                           (jax_pmap, {"executor": "vectorized"})], ids=["numpy", "threads", "vectorized"])
def test_an_empty_axis_index_group_is_a_value_error_naming_the_groups(pmap, kwargs):
    """JAX raises JaxRuntimeError from XLA's HLO verifier ("cannot have an empty replica group")."""
    groups = [[], list(range(8))]
    with pytest.raises(ValueError, match=r"psum: axis_index_groups must cover all indices exactly once \(in "
                                         r"non-empty groups\), got \(\(\), \(0, 1, 2, 3, 4, 5, 6, 7\)\)"):
        pmap(lambda v: psum(v, "i", axis_index_groups=groups), **kwargs)(X.astype(np.float32))


@pytest.mark.parametrize("kind", list(NOT_NUMBERS))
@pytest.mark.parametrize("pmap", FRONT_ENDS)
def test_arguments_that_are_not_numbers_are_a_type_error_naming_the_argument_and_dtype(pmap, kind):
    x = NOT_NUMBERS[kind]
    with pytest.raises(TypeError, match=rf"pmap: argument args\[1\] has dtype {re.escape(str(x.dtype))}, which is "
                                        r"not a valid JAX type"):
        pmap(lambda a, b: a)(X.astype(np.float32), x)


@pytest.mark.parametrize("kind", list(NOT_NUMBERS))
def test_numpy_collectives_and_outputs_refuse_values_that_are_not_numbers(kind):
    x = NOT_NUMBERS[kind]
    dtype = re.escape(str(x.dtype))
    with pytest.raises(TypeError, match=rf"psum: operand leaf 0 has dtype {dtype}, which is not a valid JAX"):
        numpy_pmap(lambda v: lax.psum(x, "i"))(X)
    with pytest.raises(TypeError, match=rf"pmap: output\['w'\] has dtype {dtype}, which is not a valid JAX type"):
        numpy_pmap(lambda v: {"w": x[:2]})(X)


def test_a_python_string_argument_to_the_jax_front_end_is_a_type_error_naming_it():
    """JAX 0.10 says "pmap requires at least one argument with a mapped axis" (ValueError) here."""
    with pytest.raises(TypeError, match=r"pmap: argument args\[0\] of type str is not an array") as info:
        jax_pmap(lambda v: v)("abcdefgh")
    assert "flat_fun" not in str(info.value) and "scalar" not in str(info.value)


@pytest.mark.parametrize("pmap", FRONT_ENDS)
def test_in_axes_out_of_bounds_is_a_value_error_naming_the_argument(pmap):
    """JAX 0.10 raises IndexError ("tuple index out of range")."""
    with pytest.raises(ValueError, match=r"in_axes=2 is out of bounds for args\[0\] of shape \(8,\)"):
        pmap(lambda v: v, in_axes=2)(X.astype(np.float32))


@pytest.mark.parametrize("pmap", FRONT_ENDS)
def test_a_mapped_scalar_is_a_value_error_naming_the_argument(pmap):
    with pytest.raises(ValueError, match=r"in_axes=0 maps args\[0\], but it is a scalar \(rank 0\)"):
        pmap(lambda v: v)(np.float32(1.0))


@pytest.mark.parametrize("pmap", FRONT_ENDS)
def test_ppermute_pairs_out_of_range_are_an_index_error_naming_the_pair(pmap):
    def f(v):
        if isinstance(v, np.ndarray):
            return lax.ppermute(v, "i", [(0, 9)])
        import jax
        return jax.lax.ppermute(v, "i", [(0, 9)])

    with pytest.raises(IndexError, match=r"ppermute: perm pair \(0, 9\) is out of range for an axis of size 8"):
        pmap(f)(X.astype(np.float32))


# -- writing into a read-only array: the message itself says what and how (print(e) shows it) ---------------

def _increment_argument(x):
    x += 1
    return x


def _write_into_result(x):
    total = lax.psum(x, "i")
    total[0] = 3.0
    return total


def test_writing_into_an_argument_says_so_in_the_message_and_the_line_to_write():
    with pytest.raises(ValueError) as info:
        spmdsim.pmap(_increment_argument, "i")(np.ones((2, 3)))
    assert str(info.value) == (
        "output array is read-only: x is the device's argument (or a view of it): a read-only view of the caller's "
        "array, as JAX arrays are immutable. Write x = x + 1 instead of x += 1: a new array, as in JAX.")


def test_writing_into_a_collectives_result_names_it_not_an_argument():
    with pytest.raises(ValueError) as info:
        spmdsim.pmap(_write_into_result, "i")(np.ones((2, 3)))
    message = str(info.value)
    assert message.startswith("assignment destination is read-only: total is not one of the device's arguments: "
                              "a collective's result"), message
    assert message.endswith("Copy it first, total = total.copy(), then total[0] = 3.0."), message
    assert "argument (or a view of it)" not in message


def test_shard_map_explains_a_write_into_a_block_or_a_result_as_pmap_does():
    mesh = spmdsim.make_mesh((2,), ("i",))
    with pytest.raises(ValueError) as info:
        spmdsim.shard_map(_increment_argument, mesh=mesh, in_specs=spmdsim.P("i"), out_specs=spmdsim.P("i"))(
            np.ones((4, 3)))
    assert str(info.value).startswith("output array is read-only: x is the device's argument (or a view of it)")
    assert not [n for n in getattr(info.value, "__notes__", []) if "read-only" in n]   # no stale second hint
    with pytest.raises(ValueError) as info:
        spmdsim.shard_map(_write_into_result, mesh=mesh, in_specs=spmdsim.P("i"), out_specs=spmdsim.P())(
            np.ones((4, 3)))
    assert str(info.value).startswith("assignment destination is read-only: total is not one of the device's "
                                      "arguments: a collective's result")


def test_inconsistent_mapped_sizes_suggest_the_in_axes_that_broadcasts_the_odd_argument():
    def step(params, x, y):
        return x

    with pytest.raises(ValueError, match=re.escape(
            "If args[0] should be the same on every device (parameters, a constant), broadcast it instead of "
            "mapping: in_axes=(None, 0, 0).")):
        spmdsim.pmap(step)({"w": np.ones(3)}, np.ones((4, 2)), np.ones(4))
    with pytest.raises(ValueError, match=re.escape("broadcast it instead of mapping: in_axes=(0, 0, None).")):
        spmdsim.pmap(step)(np.ones(4), np.ones((4, 2)), 1.5 * np.ones(3))
    with pytest.raises(ValueError) as info:                  # one against one: no guess
        spmdsim.pmap(lambda a, b: a)(np.ones(3), np.ones(4))
    assert "in_axes=(" not in str(info.value)
