"""pmap/vmap argument rules: in_axes, out_axes, static and keyword arguments, axis_size, devices."""
import collections
import functools

import numpy as np
import pytest

import spmdsim
from spmdsim import lax


def test_decorator_partial_and_wraps():
    @functools.partial(spmdsim.pmap, axis_name="i")
    def f(x):
        """doc"""
        return lax.psum(x, "i")

    assert f(np.ones(3)).tolist() == [3.0] * 3
    assert f.__name__ == "f" and f.__doc__ == "doc" and f.__wrapped__ is not None

    @spmdsim.pmap
    def g(x):
        return x + 1

    assert g(np.arange(2)).tolist() == [1, 2]


def test_in_axes_prefix_tuple_dict_none():
    def f(a, b):
        return a["x"] + a["y"] * b

    x, y = np.arange(6.).reshape(2, 3), np.arange(6.).reshape(3, 2)
    out = spmdsim.pmap(f, in_axes=({"x": 1, "y": 0}, None))({"x": x, "y": y}, 2.0)
    np.testing.assert_array_equal(out, x.T + 2 * y)


def test_negative_in_axes_count_from_the_end():
    x = np.arange(24).reshape(2, 3, 4)
    out = spmdsim.pmap(lambda v: v, in_axes=-1)(x)   # documented: JAX 0.10 mis-shards this
    np.testing.assert_array_equal(out, np.moveaxis(x, -1, 0))


def test_out_axes_positions_and_none():
    x = np.arange(12).reshape(4, 3)
    f = lambda v: (v, v.sum())
    a, s = spmdsim.pmap(f, out_axes=(1, None))(x)
    np.testing.assert_array_equal(a, x.T)
    assert s.tolist() == 3          # device 0's value: 0 + 1 + 2
    np.testing.assert_array_equal(spmdsim.pmap(lambda v: v, out_axes=-1)(x), x.T)  # vmap-style negative


def test_out_axes_none_returns_device_zero_value_unchecked_by_default():
    # JAX: pmap(lambda x: x*10 + axis_index('i'), out_axes=None)(arange(4)+1) gives 10.
    f = spmdsim.pmap(lambda x: x * 10 + lax.axis_index("i"), axis_name="i", out_axes=None)
    assert f(np.arange(4) + 1).tolist() == 10


def test_check_replicated_reports_the_differing_devices():
    f = spmdsim.pmap(lambda x: x * 10 + lax.axis_index("i") // 2, axis_name="i", out_axes=None,
                     check_replicated=True)
    with pytest.raises(spmdsim.ReplicationError, match=r"device 2 \[i=2\], device 3 \[i=3\] differ"):
        f(np.ones(4))
    ok = spmdsim.pmap(lambda x: lax.psum(x, "i"), axis_name="i", out_axes=None, check_replicated=True)
    assert ok(np.arange(4.)).tolist() == 6.0


def test_outputs_constants_none_and_dict_order():
    out = spmdsim.pmap(lambda x: {"b": 3.0, "a": None, "c": x})(np.arange(4))
    assert out["b"].tolist() == [3.0] * 4 and out["a"] is None
    assert out["c"].tolist() == [0, 1, 2, 3]


def test_keyword_arguments_are_mapped_on_axis_zero():
    f = spmdsim.pmap(lambda x, y: x + y, in_axes=(None,))
    assert f(np.float32(1), y=np.arange(3.)).tolist() == [1.0, 2.0, 3.0]


def test_static_broadcasted_argnums():
    calls = []

    def f(x, mode, scale):
        calls.append(mode)
        return x * scale if mode == "mul" else x + scale

    g = spmdsim.pmap(f, in_axes=(0, None, None), static_broadcasted_argnums=1)
    assert g(np.arange(3), "mul", 2).tolist() == [0, 2, 4]
    assert g(np.arange(3), "add", 2).tolist() == [2, 3, 4]
    assert calls.count("mul") == 3
    h = spmdsim.pmap(f, static_broadcasted_argnums=(-2,), in_axes=(0, None, None))  # negative: from the end
    assert h(np.arange(3), "add", 1).tolist() == [1, 2, 3]


def test_static_arguments_errors():
    f = spmdsim.pmap(lambda x, s: x, static_broadcasted_argnums=(1,))
    with pytest.raises(ValueError, match="only 1 positional argument. All static broadcasted arguments must be passed positionally"):
        f(np.zeros(2), s=3)
    with pytest.raises(ValueError, match=r"Non-hashable static arguments.*index 1.*list"):
        f(np.zeros(2), [1, 2])


def test_static_method_self():
    class Model:
        def __init__(self, k):
            self.k = k

        def __hash__(self):
            return hash(self.k)

        def apply(self, x):
            return x * self.k

    m = Model(3)
    assert spmdsim.pmap(Model.apply, static_broadcasted_argnums=0)(m, np.arange(2)).tolist() == [0, 3]


def test_namedtuple_is_a_node():
    P = collections.namedtuple("P", "w b")
    out = spmdsim.pmap(lambda p: P(p.w * 2, p.b), in_axes=(P(0, None),))(P(np.arange(3), np.float64(1)))
    assert isinstance(out, P) and out.w.tolist() == [0, 2, 4] and out.b.tolist() == [1.0] * 3


def test_inputs_are_read_only_views_without_copies():
    x = np.arange(8.).reshape(4, 2)
    c = np.ones(2)
    seen = []

    def f(v, w):
        seen.append((np.shares_memory(v, x), np.shares_memory(w, c), v.flags.writeable, w.flags.writeable))
        with pytest.raises(ValueError, match="read-only"):
            v[0] = 1
        return v

    spmdsim.pmap(f, in_axes=(0, None))(x, c)
    assert seen == [(True, True, False, False)] * 4
    assert x.flags.writeable and c.flags.writeable


def test_axis_size_is_checked_not_a_substitute():
    assert spmdsim.pmap(lambda x: x, axis_size=2)(np.zeros(2)).shape == (2,)
    with pytest.raises(ValueError, match="Specified axis_size 3 doesn't match received axis_size 4"):
        spmdsim.pmap(lambda x: x, axis_size=3)(np.zeros(4))
    with pytest.raises(ValueError, match="requires at least one argument with a mapped axis"):
        spmdsim.pmap(lambda x: x, in_axes=None, axis_size=4)(np.zeros(4))


def test_devices_argument():
    with pytest.raises(ValueError, match="must be non-empty"):
        spmdsim.pmap(lambda x: x, devices=[])
    assert spmdsim.pmap(lambda x: x, devices=spmdsim.devices()[:4])(np.zeros(3)).shape == (3,)
    with pytest.raises(ValueError, match="only 2 virtual devices"):
        spmdsim.pmap(lambda x: x, devices=spmdsim.devices()[:2])(np.zeros(3))


def test_backend_and_donate_argnums_are_accepted():
    x = np.arange(3.)
    assert spmdsim.pmap(lambda v: v, backend="cpu", donate_argnums=0)(x).tolist() == [0, 1, 2]
    assert x.tolist() == [0, 1, 2]


@pytest.mark.parametrize("spec", [False, np.int64(0), 0.0, "0", [0.5]])
def test_in_axes_leaves_must_be_python_ints_at_construction(spec):
    with pytest.raises(TypeError, match="in_axes must be an int, None, or"):
        spmdsim.pmap(lambda x: x, in_axes=spec)
    with pytest.raises(TypeError, match="out_axes must be an int, None, or"):
        spmdsim.pmap(lambda x: x, out_axes=spec)


def test_in_axes_not_a_prefix():
    x = np.zeros(2)
    with pytest.raises(ValueError, match=r"different lengths of tuple at key path pmap in_axes\[0\]: "):
        spmdsim.pmap(lambda a, b: b, in_axes=((0, 0, 0), 0))((x, x), x)
    with pytest.raises(ValueError, match="a list is not a tuple"):
        spmdsim.pmap(lambda a, b: b, in_axes=[0, None])(x, x)
    with pytest.raises(ValueError, match="metadata"):
        spmdsim.pmap(lambda a: a, in_axes=({"b": 0},))({"a": x})
    with pytest.raises(ValueError, match="passed by keyword"):
        spmdsim.pmap(lambda a, b, c: a, in_axes=(0, 0, 0))(x, x, c=x)


def test_out_axes_not_a_prefix():
    with pytest.raises(ValueError, match="pmap out_axes"):
        spmdsim.pmap(lambda x: (x, x), out_axes=(0, 0, 0))(np.zeros(2))


def test_mapped_size_errors_name_paths_and_sizes():
    with pytest.raises(ValueError, match=r"args\[1\] has size 3 on axis 0") as info:
        spmdsim.pmap(lambda a, b: a)(np.zeros(4), np.zeros(3))
    assert "args[0] has size 4" in str(info.value)
    with pytest.raises(ValueError, match=r"kwargs\['k'\] has size 2"):
        spmdsim.pmap(lambda a, k: a)(np.zeros(4), k=np.zeros(2))


def test_too_many_rows_for_the_devices_explains_the_reshape():
    with pytest.raises(ValueError, match=r"only 8 virtual devices.*reshape the input to \(8, 2, \.\.\.\)"):
        spmdsim.pmap(lambda x: x)(np.zeros((16, 3)))
    with pytest.raises(ValueError, match=r"pad it to a multiple of 8"):
        spmdsim.pmap(lambda x: x)(np.zeros(9))


def test_scalars_and_missing_mapped_axis():
    with pytest.raises(ValueError, match="requires at least one argument with a mapped axis"):
        spmdsim.pmap(lambda x: x, in_axes=None)(np.zeros(3))
    with pytest.raises(ValueError, match="requires at least one argument with a mapped axis"):
        spmdsim.pmap(lambda x: x)({})
    with pytest.raises(ValueError, match=r"args\[1\].*scalar.*in_axes=None"):
        spmdsim.pmap(lambda a, b: a)(np.zeros(2), 3.0)
    with pytest.raises(ValueError, match="size 0"):
        spmdsim.pmap(lambda x: x)(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="out of bounds"):
        spmdsim.pmap(lambda x: x, in_axes=2)(np.zeros((2, 3)))


def test_non_array_arguments_and_outputs_are_type_errors():
    with pytest.raises(TypeError, match=r"args\[1\] of type str"):
        spmdsim.pmap(lambda a, b: a, in_axes=(0, None))(np.zeros(2), "hello")
    with pytest.raises(TypeError, match="not an array"):
        spmdsim.pmap(lambda a: "a")(np.zeros(2))


def test_axis_name_must_be_a_plain_name():
    for bad in (3, ("a", "b"), ["a"]):
        with pytest.raises(TypeError, match="axis_name"):
            spmdsim.pmap(lambda x: x, axis_name=bad)


def test_per_device_outputs_must_agree():
    with pytest.raises(ValueError, match=r"float64\[2\] on device 1 but float64\[1\] on device 0"):
        spmdsim.pmap(lambda x: np.ones(1 + int(x)))(np.arange(2))
    with pytest.raises(ValueError, match="same pytree structure"):
        spmdsim.pmap(lambda x: (x,) if x == 0 else [x])(np.arange(2))
    # A lane with a subtree, or None, where device 0 has a leaf: the structure error, whatever out_axes says.
    for out_axes in (0, None):
        with pytest.raises(ValueError, match="device 1 returned .* same pytree structure"):
            spmdsim.pmap(lambda x: (x, x) if x == 0 else (x, (x, x)), out_axes=out_axes)(np.arange(2))
        with pytest.raises(ValueError, match="device 1 returned .* same pytree structure"):
            spmdsim.pmap(lambda x: (x, x) if x == 0 else (x, None), out_axes=out_axes)(np.arange(2))
    with pytest.raises(ValueError, match=r"int64\[\] on device 1 but float32\[\] on device 0"):
        spmdsim.pmap(lambda x: np.float32(1) if x == 0 else np.int64(1))(np.arange(2))


def test_numpy_scalar_outputs_become_arrays():
    """NumPy scalars returned by the devices (np.mean gives one) come back as arrays, as jax.pmap's do."""
    loss = spmdsim.pmap(lambda x: (x, np.mean(x)), out_axes=(0, None))(np.arange(4, dtype=np.float32).reshape(2, 2))
    assert type(loss[1]) is np.ndarray and loss[1].shape == () and loss[1].dtype == np.float32 and loss[1] == 0.5
    assert loss[1].flags.writeable
    stacked = spmdsim.pmap(lambda x: np.float32(x[0]) * 2)(np.arange(6, dtype=np.float32).reshape(3, 2))
    assert type(stacked) is np.ndarray and stacked.dtype == np.float32 and stacked.tolist() == [0.0, 4.0, 8.0]
    # a NumPy scalar on one device and a 0-d array on another still stack (same dtype and shape)
    mixed = spmdsim.pmap(lambda x: (np.float32(1) if x == 0 else np.ones((), np.float32),))(np.arange(2))
    assert mixed[0].dtype == np.float32 and mixed[0].tolist() == [1.0, 1.0]


# -- vmap ---------------------------------------------------------------------------------------------

def test_vmap_basics_and_differences_from_pmap():
    x = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(spmdsim.vmap(lambda v: v * 2, in_axes=[1])(x), (x * 2).T)  # list ok in vmap
    assert spmdsim.vmap(lambda: np.float32(1), axis_size=3)().tolist() == [1.0] * 3
    assert spmdsim.vmap(lambda v: lax.psum(v, "j"), axis_name="j")(np.arange(20)).shape == (20,)  # no device limit
    with pytest.raises(ValueError, match="not the same everywhere"):
        spmdsim.vmap(lambda v: v, out_axes=None)(np.arange(3))
    assert spmdsim.vmap(lambda v: v * 0, out_axes=None)(np.arange(3)).tolist() == 0
    with pytest.raises(ValueError, match="len\\(in_axes\\)=2, len\\(args\\)=1"):
        spmdsim.vmap(lambda v: v, in_axes=(0, 0))(x)


def test_too_many_devices_suggests_how_to_get_more():
    import numpy as np
    import pytest

    import spmdsim
    from spmdsim.runtime import _devices

    with pytest.raises(ValueError, match=r"spmdsim.set_device_count\(16\) or SPMDSIM_NUM_DEVICES=16"):
        spmdsim.pmap(lambda x: x)(np.zeros(16))
    with _devices.devices_hint("--devices {n}"), pytest.raises(ValueError, match="more virtual devices: --devices 16"):
        spmdsim.pmap(lambda x: x)(np.zeros(16))


def test_in_axes_checked_against_each_calls_structure_after_calls_that_fit():
    """An in_axes tree is expanded once per argument structure (issue 15): a call whose arguments no longer
    fit it still gets the structure error, and one that fits again the right axes."""
    f = spmdsim.pmap(lambda p, x: p[0] * x + p[1], in_axes=((None, 0), 0))
    x = np.arange(4.0)
    p = (np.float64(2.0), np.arange(4.0))
    for _ in range(2):
        np.testing.assert_array_equal(f(p, x), 2.0 * x + np.arange(4.0))
    with pytest.raises(ValueError, match=r"pytree structure error: .* at key path pmap in_axes\[0\]"):
        f(np.ones(4), x)
    with pytest.raises(ValueError, match=r"pytree structure error"):
        f((np.float64(2.0), np.arange(4.0), np.ones(4)), x)
    np.testing.assert_array_equal(f((np.float64(3.0), np.arange(4.0)), x), 3.0 * x + np.arange(4.0))
