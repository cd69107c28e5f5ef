"""The one-value forms of XLA:CPU's float32 ports (``_xla_cpu_scalar``, Python floats) against the ports
themselves (``_xla_cpu_math``, NumPy arrays): the same bits for every value they take, and the rules that use
them (0-d and small operands, a sampler's loop) unchanged."""
import numpy as np
import pytest

from spmdsim.jax.evaluation._registry import PER_DEVICE
from spmdsim.jax.numerics import _xla_cpu_math, _xla_cpu_scalar

pytestmark = pytest.mark.skipif(not _xla_cpu_scalar.SCALAR, reason="no FMA in effect: the one-value forms are off")

NAMES = ["exp", "log", "log1p", "logistic"]


def _values() -> np.ndarray:
    rng = np.random.default_rng(43)
    scaled = [rng.standard_normal(4000).astype(np.float32) * s for s in (1e-4, 0.05, 0.4, 1.5, 8, 40, 200)]
    bits = rng.integers(0, 2**32, 6000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 0.70710677, 0.7071068, 0.41421354, 0.41421357, -0.41421354,
                      -0.41421357, 2**-20, -(2**-20), 9.536743e-07, 79.99999, -79.99999, 80.0, -80.0, 87.5, -87.5,
                      -0.99999994, 1.2676506e30, 1e-38, -1e-38, 1e-45, 3.4028235e38, np.inf, -np.inf, np.nan],
                     np.float32)
    return np.concatenate([*scaled, bits, edges, np.nextafter(edges, np.float32(np.inf))])


@pytest.mark.parametrize("name", NAMES)
def test_one_value_form_is_the_port(name):
    one, port = _xla_cpu_scalar.SCALAR[name], getattr(_xla_cpu_math, name)
    values = _values()
    with np.errstate(all="ignore"):
        expected = port(values)
    taken = 0
    for v, want in zip(values.tolist(), expected):
        got = one(v)
        if got is None:
            continue
        taken += 1
        assert np.float32(got).tobytes() == want.tobytes(), (name, v, got, want)
    assert taken > 0.45 * len(values)  # most values (log: the positive half) take the one-value form


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(), (1,), (3,), (4, 4), (17,)])
def test_rule_on_small_operands_is_the_port(name, shape):
    """The rule (0-d and up to 16 values one by one, the port beyond) returns the port's array: dtype, shape,
    bits; a NaN, an infinity or a subnormal among the values sends the whole operand to the port."""
    rng = np.random.default_rng(len(shape))
    for scale, special in [(0.3, None), (3.0, None), (3.0, np.nan), (3.0, np.float32(1e-40)), (3.0, np.inf)]:
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        if name in ("log",):
            x = np.abs(x) + np.float32(0.01)
        if special is not None and x.size:
            x.reshape(-1)[-1] = special
        with np.errstate(all="ignore"):
            got, want = PER_DEVICE[name](x), getattr(_xla_cpu_math, name)(x)
        assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == x.shape
        assert got.tobytes() == np.asarray(want, np.float32).tobytes(), (name, x, got, want)


def test_one_value_fused_multiply_add_is_the_array_form():
    """``xla_cpu_fma`` on three 0-d float32 operands (Python floats) against the same rule on arrays of them."""
    fma = PER_DEVICE["xla_cpu_fma"]
    rng = np.random.default_rng(7)
    pool = np.concatenate([rng.standard_normal(200).astype(np.float32) * s for s in (1e-20, 1e-3, 1, 1e3, 1e19)]
                          + [np.array([0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-45, 1e-39], np.float32)])
    for _ in range(3000):
        a, b, c = rng.choice(pool, 3)
        for negate_product in (False, True):
            for negate_addend in (False, True):
                params = dict(negate_product=negate_product, negate_addend=negate_addend)
                with np.errstate(all="ignore"):
                    got = fma(np.asarray(a), np.asarray(b), np.asarray(c), **params)
                    want = fma(np.array([a, a]), np.array([b, b]), np.array([c, c]), **params)[0]
                assert got.dtype == np.float32 and got.shape == (), (a, b, c, params)
                assert got.tobytes() == want.tobytes(), (a, b, c, params)


INTEGERS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def _integers(dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = [info.min, info.min + 1, 0, 1, 2, 7, 31, 32, 33, 63, 64, 65, info.max - 1, info.max]
    if info.min < 0:
        edges += [-1, -2, -7, -31, -32, -33, -64]
    drawn = np.random.default_rng(3).integers(info.min, info.max, 12, endpoint=True, dtype=dtype)
    return np.unique(np.concatenate([np.array([e for e in edges if info.min <= e <= info.max], dtype), drawn]))


@pytest.mark.parametrize("dtype", INTEGERS)
def test_integer_scalars_are_the_array_form(dtype):
    """``rem``, the right shifts and ``population_count`` of 0-d integers (Python ints) against the same rules on
    arrays: C's remainder (x % 0 is x, INT_MIN % -1 is 0), shifts of every amount (out of range ones included)."""
    values = _integers(dtype)
    for name in ("rem", "shift_right_logical", "shift_right_arithmetic"):
        for a in values:
            for b in values:
                got = PER_DEVICE[name](np.asarray(a), np.asarray(b))
                want = PER_DEVICE[name](np.array([a, a]), np.array([b, b]))[0]
                assert got.dtype == dtype and got.shape == () and got.tobytes() == want.tobytes(), (name, a, b)
    for a in values:
        got, want = PER_DEVICE["population_count"](np.asarray(a)), PER_DEVICE["population_count"](np.array([a, a]))[0]
        assert got.dtype == dtype and got.tobytes() == want.tobytes(), a


@pytest.mark.parametrize("source", [np.float32, np.float64])
@pytest.mark.parametrize("dtype", INTEGERS)
def test_float_scalar_to_integer_is_the_array_form(source, dtype):
    """A 0-d float converted to an integer (truncated, saturated, NaN to 0) as the array form converts it."""
    values = np.array([0, -0.0, 0.5, -0.5, 1.5, -1.5, 255.9, 256, -129, 65535.5, 2147483647.0, 2147483648.0,
                       -2147483649.0, 4294967296.0, 9.3e18, -9.3e18, 1.9e19, np.inf, -np.inf, np.nan], source)
    convert = PER_DEVICE["convert_element_type"]
    for v in values:
        with np.errstate(all="ignore"):
            got = convert(np.asarray(v), new_dtype=dtype, weak_type=False, sharding=None)
            want = convert(np.array([v, v]), new_dtype=dtype, weak_type=False, sharding=None)[0]
        assert got.dtype == dtype and got.shape == () and got.tobytes() == want.tobytes(), v


@pytest.mark.parametrize("name", ["max", "min"])
def test_zeros_of_both_signs_in_small_operands(name):
    """max/min order -0.0 below +0.0 on small operands too (their check is on the result there)."""
    special = [0.0, -0.0, 1.0, -1.0, np.inf, np.nan]
    for dtype in (np.float32, np.float64):
        for a in special:
            for b in special:
                got = PER_DEVICE[name](np.asarray(a, dtype), np.asarray(b, dtype))
                want = PER_DEVICE[name](np.full(40, a, dtype), np.full(40, b, dtype))[0]
                assert got.tobytes() == want.tobytes(), (a, b)
        got = PER_DEVICE[name](np.asarray(-0.0, dtype), np.asarray(0.0, dtype))
        assert np.signbit(got) == (name == "min")


def test_select_n_of_one_predicate_returns_the_case():
    cases = [np.asarray(np.float32(v)) for v in (1, 2, 3)]
    assert PER_DEVICE["select_n"](np.asarray(True), *cases[:2]) is cases[1]
    assert PER_DEVICE["select_n"](np.asarray(2, np.int32), *cases) is cases[2]
    both = PER_DEVICE["select_n"](np.asarray(False), np.zeros(3, np.float32), np.ones((2, 3), np.float32))
    assert both.shape == (2, 3) and not both.any()  # broadcast: np.where's result
