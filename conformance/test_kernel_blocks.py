"""The large-array kernels of issue 27 compute what the plain NumPy expressions compute: the fused multiply-add in
cache-sized blocks (against float64 arithmetic), XLA's transcendental ports a block at a time (against the same
port on the whole array), products whatever the batch and the operands' layout (against the 2-D product of each
slice), and kernels split over the CPUs (errors and NumPy's error state as in the caller)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from spmdsim import _threads
from spmdsim.jax import _xla_cpu_math
from spmdsim.jax._numpy_rules import c_slices, matmul_slices

pytestmark = pytest.mark.area("performance: kernels")

# Shapes of (a, b, c) that broadcast: a per-device scalar against stacked blocks, a replicated block, a row, a
# column, scalars, blocks larger than one cache block and than the parallel threshold.
SHAPES = [((), (), ()), ((5,), (), (3, 5)), ((70000,), (70000,), ()), ((3, 40000), (40000,), (3, 1)),
          ((9, 1024, 128), (), (9, 1024, 128)), ((1,), (100000,), (1,)), ((0, 4), (4,), ()),
          ((8, 1, 1), (8, 300, 300), (1, 300, 300)), ((3, 1, 70000), (70000,), (3, 5, 1)),
          ((8, 1, 1), (8, 1024, 160), (8, 1024, 160)), ((1100000,), (), ()), ((5, 70000), (1, 70000), (5, 1)),
          ((8, 1), (8, 70000), (70000,)), ((32, 28, 28, 8), (8,), (32, 28, 28, 8))]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rounded_once_is_float64_arithmetic_rounded_once(shapes, dtype):
    rng = np.random.default_rng(len(str(shapes)))
    a, b, c = (rng.standard_normal(s).astype(dtype) for s in shapes)
    for negate_product in (False, True):
        for negate_addend in (False, True):
            got = _xla_cpu_math.rounded_once(a, b, c, dtype, negate_product=negate_product,
                                             negate_addend=negate_addend)
            product = a.astype(np.float64) * b.astype(np.float64)
            expected = ((-product if negate_product else product)
                        + (-c.astype(np.float64) if negate_addend else c.astype(np.float64))).astype(dtype)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8), np.atleast_1d(expected).view(np.uint8))


@pytest.mark.parametrize("name", ["exp", "log", "log1p", "tanh", "erf", "logistic", "expm1", "rsqrt"])
def test_transcendental_ports_by_blocks_equal_the_whole_array(name):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(70000) * 30, np.float32([0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 1, -1])])
    x = np.tile(x.astype(np.float32), 2).reshape(2, -1)
    blockwise = getattr(_xla_cpu_math, name)
    with np.errstate(all="ignore"):
        got, whole = blockwise(x), blockwise.__wrapped__(x)
    np.testing.assert_array_equal(got.view(np.uint32), whole.view(np.uint32))


@pytest.mark.parametrize("m,k,n", [(3, 5, 7), (33, 65, 17), (1, 50, 40), (40, 50, 1), (64, 512, 256)])
def test_a_slice_product_does_not_depend_on_the_batch_or_the_layout(m, k, n):
    """A transposed operand is read in place by BLAS and small products' kernels depend on layout, so the layout
    of each slice must follow from shapes alone: the product of a batch, of a broadcast batch and of a transposed
    view made C-contiguous first all equal each slice's own product, bit for bit."""
    rng = np.random.default_rng(m * k * n)
    a = rng.standard_normal((4, m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)  # used transposed, as x @ w.T
    per_slice = [matmul_slices(c_slices(a[i]), c_slices(w).T) for i in range(4)]
    batched = matmul_slices(c_slices(a, 1), np.swapaxes(c_slices(np.broadcast_to(w, (4, n, k)), 1), -1, -2))
    for i in range(4):
        np.testing.assert_array_equal(batched[i], per_slice[i])
    scrambled = np.asfortranarray(a[0])  # the same values in another layout: canonicalised first
    np.testing.assert_array_equal(matmul_slices(c_slices(scrambled), c_slices(w).T), per_slice[0])


def test_c_slices_keeps_a_broadcast_device_axis():
    block = np.arange(12, dtype=np.float32).reshape(3, 4).T  # not C-contiguous
    stacked = np.broadcast_to(block, (8, 4, 3))
    canonical = c_slices(stacked, 1)
    assert canonical.strides[0] == 0 and canonical[0].flags.c_contiguous
    np.testing.assert_array_equal(canonical, stacked)


def test_kernel_parts_raise_the_first_error_and_keep_the_callers_error_state():
    def failing(lo, hi):
        if lo > 0:
            raise ZeroDivisionError(f"part {lo}")
    with pytest.raises(ZeroDivisionError):
        _threads.in_parallel(failing, 4, cpus=2)

    def overflowing(lo, hi):
        np.float32(3e38) * np.float32(10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="ignore"):
            _threads.in_parallel(overflowing, 4, cpus=2)  # no warning in any part
        with np.errstate(over="raise"), pytest.raises(FloatingPointError):
            _threads.in_parallel(overflowing, 4, cpus=2)
