"""``lax.pow`` as XLA:CPU computes it: the C library's ``powf``/``pow`` (spmdsim/jax/numerics/_libm.py).

Found by ``spmdsim compare --against executor=vectorized`` on numpyro's NUTS sampler in ``jax.pmap``: the
step-size adaptation's ``t ** 0.5`` at ``t = 3`` was ``1.7320508`` on the thread executor and ``1.7320509`` on
the vectorized one (NumPy's power takes a SIMD loop or not by the array's length), so 4 of 4 chains drifted
apart. Expected values here are XLA:CPU's.
"""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
from jax import lax  # noqa: E402
import ml_dtypes  # noqa: E402

import spmdsim.jax as sjax  # noqa: E402
from spmdsim.jax.numerics import _libm  # noqa: E402
from spmdsim.jax.evaluation import _registry

pytestmark = pytest.mark.skipif(not _libm.available(), reason="no C library to call")


def _operands(dtype, n=20000, seed=0):
    rng = np.random.default_rng(seed)
    x = np.exp(rng.uniform(-12, 12, n)).astype(np.float32)
    y = rng.uniform(-4, 4, n).astype(np.float32)
    x[:200], y[:200] = np.arange(200), 0.5                        # square roots of integers (t ** 0.5)
    x[200:300], y[200:300] = -np.arange(100), np.arange(100) // 3   # negative bases, integral exponents
    special = [(0, -1), (-0.0, -3), (np.inf, 0.5), (-np.inf, -3), (np.nan, 0), (1, np.nan), (1, np.inf),
               (2, 200), (2, -140), (3e38, 2), (0.9, 1e6), (-2, 0.5)]
    x[300:300 + len(special)], y[300:300 + len(special)] = zip(*special)
    with np.errstate(over="ignore"):
        return x.astype(dtype), y.astype(dtype)


def _bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_pow_rule_equals_xla_cpu_bit_for_bit(dtype):
    x, y = _operands(dtype)
    expected = np.asarray(jax.jit(lax.pow)(x, y))
    for rule in (_registry.PER_DEVICE["pow"], lambda a, b: _registry.VECTORIZED["pow"](a[None], b[None])[0]):
        with np.errstate(all="ignore"):  # as the interpreter calls rules: XLA computes through overflow
            got = rule(x, y)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(_bits(got), _bits(expected))


def test_float64_pow_equals_xla_cpu_bit_for_bit():
    rng = np.random.default_rng(1)
    x, y = np.exp(rng.uniform(-300, 300, 3000)), rng.uniform(-3, 3, 3000)
    with jax.enable_x64(True):
        expected = np.asarray(jax.jit(lax.pow)(x, y))
    np.testing.assert_array_equal(_bits(_registry.PER_DEVICE["pow"](x, y)), _bits(expected))


def test_integer_exponents_are_converted_as_xla_does():
    rng = np.random.default_rng(2)
    x, y = rng.uniform(0, 8, 3000).astype(np.float32), rng.integers(-6, 7, 3000).astype(np.int32)
    np.testing.assert_array_equal(_bits(_registry.PER_DEVICE["pow"](x, y)), _bits(jax.jit(lax.pow)(x, y)))


def test_an_elements_result_does_not_depend_on_the_arrays_length_or_layout():
    x, y = _operands(np.float32, n=4096, seed=3)
    whole = _libm.power(x, y)
    one_by_one = np.concatenate([_libm.power(x[i:i + 1], y[i:i + 1]) for i in range(0, 4096, 17)])
    np.testing.assert_array_equal(_bits(one_by_one), _bits(whole[::17]))
    np.testing.assert_array_equal(_bits(_libm.power(x[::3], y[::3])), _bits(whole[::3]))
    np.testing.assert_array_equal(_bits(_libm.power(np.full(16, np.float32(3)), np.float32(0.5))),
                                  _bits(np.full(16, _libm.power(np.float32(3), np.float32(0.5)))))


def test_the_numpyro_case_agrees_between_executors_and_with_jax_pmap():
    t = np.arange(1, 9, dtype=np.int32)

    def f(t):
        return t ** 0.5, t ** (-0.75)  # numpyro's dual averaging: x_t and weight_t

    real = jax.pmap(f)(t)
    for executor in ("threads", "vectorized"):
        for r, g in zip(real, sjax.pmap(f, executor=executor)(t), strict=True):
            np.testing.assert_array_equal(_bits(g), _bits(r))


def test_flushed_subnormals_as_xla_cpu():
    x = np.array([2, 1e-20, 0.5], np.float32)
    y = np.array([-130, 2.1, 140], np.float32)
    np.testing.assert_array_equal(_bits(_libm.power(x, y)), _bits(jax.jit(lax.pow)(x, y)))
