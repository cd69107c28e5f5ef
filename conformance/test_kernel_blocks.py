"""The large-array kernels of issue 27 compute what the plain NumPy expressions compute: the fused multiply-add in
cache-sized blocks (against float64 arithmetic), XLA's transcendental ports a block at a time (against the same
port on the whole array), products whatever the batch and the operands' layout (against the 2-D product of each
slice), and kernels split over the CPUs (errors and NumPy's error state as in the caller)."""
from __future__ import annotations

import gc
import warnings

import jax
import numpy as np
import pytest

from spmdsim.runtime import _threads
from spmdsim.jax.numerics import _xla_cpu_math
from spmdsim.jax.rules._dot import c_slices, matmul_slices

pytestmark = pytest.mark.area("performance: kernels")

# Shapes of (a, b, c) that broadcast: a per-device scalar against stacked blocks, a replicated block, a row, a
# column, scalars, blocks larger than one cache block and than the parallel threshold.
SHAPES = [((), (), ()), ((5,), (), (3, 5)), ((70000,), (70000,), ()), ((3, 40000), (40000,), (3, 1)),
          ((9, 1024, 128), (), (9, 1024, 128)), ((1,), (100000,), (1,)), ((0, 4), (4,), ()),
          ((8, 1, 1), (8, 300, 300), (1, 300, 300)), ((3, 1, 70000), (70000,), (3, 5, 1)),
          ((8, 1, 1), (8, 1024, 160), (8, 1024, 160)), ((1100000,), (), ()), ((5, 70000), (1, 70000), (5, 1)),
          ((8, 1), (8, 70000), (70000,)), ((32, 28, 28, 8), (8,), (32, 28, 28, 8)),
          ((1, 1024, 160), (), (8, 1024, 160)), ((1, 70000), (1, 70000), (5, 70000)), ((1, 70000), (), (5, 1))]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rounded_once_is_float64_arithmetic_rounded_once(shapes, dtype):
    rng = np.random.default_rng(len(str(shapes)))
    a, b, c = (rng.standard_normal(s).astype(dtype) for s in shapes)
    for x, zeros in zip((a, b, c), ([0.0, -0.0, 0.0, -0.0], [-0.0, 1.0, 0.0, -0.0], [-0.0, -0.0, 0.0, 0.0])):
        x.reshape(-1)[:min(4, x.size)] = zeros[:min(4, x.size)]  # signed zeros' sums
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


@pytest.mark.parametrize("shapes", [((9, 1024, 128), (), (9, 1024, 128)), ((8, 300, 300), (), (8, 1, 1)),
                                    ((3, 1, 70000), (70000,), (3, 5, 70000)), ((5,), (), (5,))], ids=str)
def test_rounded_once_into_an_operand_and_from_broadcast_views(shapes):
    """``out=`` one of the operands (each block read before it is written) and operands that are broadcast views
    of a replicated value (read as the one array they are) give float64 arithmetic rounded once, as above."""
    rng = np.random.default_rng(7)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    shape = np.broadcast_shapes(*shapes)
    expected = (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)
    if c.shape == shape:
        into = c.copy()
        got = _xla_cpu_math.rounded_once(a, b, into, out=into)
        assert got is into
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    replicated = [np.broadcast_to(x[:1], x.shape) if x.ndim and x.shape[0] > 1 else x for x in (a, b, c)]
    expected = np.broadcast_to(
        replicated[0].astype(np.float64) * replicated[1].astype(np.float64) + replicated[2].astype(np.float64),
        shape).astype(np.float32)
    got = _xla_cpu_math.rounded_once(*replicated)
    assert got.shape == shape
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    with pytest.raises(ValueError, match="out must be a C-contiguous float32"):
        _xla_cpu_math.rounded_once(a, b, c, out=np.empty(shape, np.float16))


def _xla_max(row: np.ndarray, largest: bool):
    """One row's max (min) as XLA orders floats: the first NaN if there is one, else the extremum with -0.0 below
    +0.0 (Python's sort key, element by element)."""
    for v in row:
        if np.isnan(v):
            return v
    def key(v):
        return float(v), not np.signbit(v)
    return max(row, key=key) if largest else min(row, key=key)


@pytest.mark.parametrize("name", ["reduce_max", "reduce_min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_max_and_min_reductions_order_signed_zeros_and_keep_the_first_nan(name, dtype):
    from spmdsim.jax.evaluation._registry import PER_DEVICE
    rng = np.random.default_rng(3)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 2.5], dtype)
    nans = np.array([0x7FC00001, 0xFFC00002, 0x7FC00003], np.uint32).view(np.float32).astype(dtype)
    x = rng.choice(np.concatenate([special, nans]), (6, 40, 17)).astype(dtype)
    x[:, :20] = rng.choice(special[:2], (6, 20, 17))  # rows of zeros of both signs
    x[0, 20:] = -0.0
    x[1, 20:] = rng.choice(special[:2], (20, 17))
    rule = PER_DEVICE[name]
    for axes in [(1,), (0, 1), (2,), (0, 2)]:
        with np.errstate(invalid="ignore"):  # NaN + NaN in the fold of the NaN rows (the executors ignore it)
            got = rule(x, axes=axes)
        kept = [d for d in range(3) if d not in axes]
        rows = np.transpose(x, kept + list(axes)).reshape(*(x.shape[d] for d in kept), -1)
        expected = np.array([_xla_max(r, name == "reduce_max") for r in rows.reshape(-1, rows.shape[-1])],
                            dtype).reshape(rows.shape[:-1])
        assert got.dtype == dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("shape,axes", [((8, 1024, 256), (0, 1)), ((4, 8, 128, 256), (1, 2)),
                                        ((3, 70, 129, 65), (1, 2)), ((2, 200, 300), (1,))], ids=str)
def test_sums_over_leading_axes_transpose_by_tiles(shape, axes, monkeypatch, request):
    """The operand of a sum over consecutive axes is moved to ``(kept..., R)`` tile by tile: the same array as
    NumPy's transposed copy, so every sum adds the same values in the same order (where the sum is NumPy's: a
    CPU model whose float32 order spmdsim does not model, pinned here)."""
    from spmdsim.jax.evaluation._registry import PER_DEVICE
    from spmdsim.jax.numerics import _xla_cpu_isa
    monkeypatch.setenv("SPMDSIM_XLA_CPU_MODEL", "intel")
    _xla_cpu_isa.cpu_model.cache_clear()
    request.addfinalizer(_xla_cpu_isa.cpu_model.cache_clear)
    from spmdsim.jax.rules._reductions import _canonical
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    kept = [d for d in range(len(shape)) if d not in axes]
    moved = np.ascontiguousarray(np.transpose(x, kept + list(axes))).reshape(*(shape[d] for d in kept), -1)
    got = _canonical(x, axes)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, moved)
    np.testing.assert_array_equal(PER_DEVICE["reduce_sum"](x, axes=axes), np.add.reduce(moved, axis=-1))


def test_fresh_buffers_are_aligned_as_xla_aligns_its_own():
    from spmdsim.runtime import _buffers
    for shape, dtype in [((8, 1024, 1024), np.float32), (70000, np.float16), ((3, 5000), np.complex64),
                         ((2, 3), np.float32)]:
        x = _buffers.empty(shape, dtype, faulted=True)
        assert x.shape == (shape if isinstance(shape, tuple) else (shape,)) and x.dtype == dtype
        assert x.flags.c_contiguous and x.flags.writeable
        if x.nbytes >= 1 << 18:
            assert x.ctypes.data % _buffers.ALIGNMENT == 0


def test_large_buffers_are_reused_only_once_nothing_refers_to_them(monkeypatch):
    from spmdsim.runtime import _buffers
    monkeypatch.setattr(_buffers, "_pool", [])
    monkeypatch.setattr(_buffers, "_pool_ids", set())
    monkeypatch.setattr(_buffers, "_POOL_BYTES", 3 * (_buffers._KEPT + _buffers.ALIGNMENT))
    shape = (_buffers._KEPT // 4,)
    x = _buffers.empty(shape, np.float32)
    x[:] = 1
    view = x[10:]
    address = x.ctypes.data
    del x
    y = _buffers.empty(shape, np.float32)  # x's buffer is still used by its view
    assert y.ctypes.data != address and view[0] == 1
    del view
    z = _buffers.empty(shape, np.float32)
    assert z.ctypes.data == address  # nothing refers to x's buffer any more
    jax_array = jax.device_put(z)  # without a copy: JAX refers to z's buffer
    assert jax_array.unsafe_buffer_pointer() == address
    del z
    assert _buffers.empty(shape, np.float32).ctypes.data not in (address, y.ctypes.data)
    del jax_array
    gc.collect()  # (a jax.Array lets go of its host buffer at a collection)
    assert _buffers.empty(shape, np.float32).ctypes.data == address
    assert _buffers.empty((_buffers._KEPT // 2 - 1,), np.uint16).ctypes.data != address  # another size
    # at most _POOL_BYTES kept, the oldest let go first
    kept = [_buffers.empty(shape, np.float32) for _ in range(5)]
    assert sum(b.nbytes for b in _buffers._pool) <= _buffers._POOL_BYTES
    assert all(_buffers.kept_by_pool(k.base) for k in kept[-3:]) and not _buffers.kept_by_pool(kept[0].base)
    from spmdsim.jax.compiled._fusion import writable_alone
    assert writable_alone(kept.pop())  # in place: the pool's reference is not a user's


@pytest.mark.parametrize("shape", [(8, 300, 300), (8, 400, 400)])  # below and above _buffers._KEPT
@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_results_handed_to_jax_stay_the_callers(executor, shape):
    """Large results become ``jax.Array``s without a copy (aligned buffers, kept for reuse from 4 MiB on): a
    later call, fed the earlier result, must neither change it nor share its memory with its own result."""
    import spmdsim.jax as sj
    f = sj.pmap(lambda x: x * 2.0 + 1.0, executor=executor)
    x = np.ones(shape, np.float32)
    first = f(x)
    kept = np.asarray(first).copy()
    second = f(first)
    third = f(np.zeros_like(x))
    np.testing.assert_array_equal(np.asarray(first), kept)
    np.testing.assert_array_equal(np.asarray(second), 2 * kept + 1)
    np.testing.assert_array_equal(np.asarray(third), np.ones_like(x))
    assert not np.shares_memory(np.asarray(first), np.asarray(second))


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_max", "reduce_min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_large_vectorized_reductions_split_over_the_devices_as_each_device_reduces(name, dtype):
    """A vectorized reduction of a million elements or more runs one part of the devices per CPU: each device's
    result is, bit for bit, its own block reduced by the per-device rule."""
    from spmdsim.jax.evaluation._registry import PER_DEVICE, VECTORIZED
    from spmdsim.jax.rules._reductions import SPLIT_ELEMENTS
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((5, 40, 90, 70)) * 100).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[1, 0, 0, :4] = [np.nan, -0.0, np.inf, -np.inf]
        x[2, :, 3, :] = -0.0
    assert x.size >= SPLIT_ELEMENTS
    with np.errstate(all="ignore"):
        for axes in [(0,), (0, 1), (2,), (1, 2)]:  # per-device axes
            got = VECTORIZED[name](x, axes=axes)
            expected = np.stack([PER_DEVICE[name](x[d], axes=axes) for d in range(5)])
            assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes(), axes


def test_select_n_reads_a_boolean_predicate_as_it_is():
    from spmdsim.jax.evaluation._registry import PER_DEVICE
    which = np.array([[True], [False]])
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), -np.ones(3, np.float32)
    got = PER_DEVICE["select_n"](which, a, b)
    np.testing.assert_array_equal(got, [[-1, -1, -1], [3, 4, 5]])
    got = PER_DEVICE["select_n"](np.array([0, 1, 1], np.int32), a, b)
    np.testing.assert_array_equal(got, [[0, -1, -1], [3, -1, -1]])


@pytest.mark.parametrize("batch,m,k,n", [((), 64, 256, 40), ((4,), 100, 100, 100), ((), 64, 512, 256)])
def test_a_product_does_not_depend_on_blas_threads(batch, m, k, n):
    """OpenBLAS's result depends on its thread count on some CPUs (AMD Zen 3), so spmdsim holds it to one thread
    for every product large enough for OpenBLAS to share (spmdsim.runtime._blas.threads): a product is the
    same whatever the user's BLAS thread count."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((*batch, m, k)).astype(np.float32)
    b = rng.standard_normal((*batch, k, n)).astype(np.float32)
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        one = matmul_slices(a, b)
    with threadpoolctl.threadpool_limits(4, user_api="blas"):
        shared = matmul_slices(a, b)
    np.testing.assert_array_equal(shared.view(np.int32), one.view(np.int32))
