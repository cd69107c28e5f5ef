"""The fast forms of the windowed rules (spmdsim/jax/rules/_windows.py, issue 27) against their references, bit for bit:
the im2col patches (one strided view, copied in blocks) against the patches written one kernel offset at a time
with a Python loop; reduce_window max/min (NumPy's maximum in place, the sign of zeros from the elements' bits)
against the generic fold of XLA's max/min; select_and_scatter_add (the selection as a maximum of positions, the
scatter through strided views) against a window-by-window reference. Each also vectorized against per device.
Inputs hold -0.0, +0.0, infinities, subnormals and NaNs."""
from __future__ import annotations

import itertools
import math
import types

import ml_dtypes
import numpy as np
import pytest
from jax.lax import ConvDimensionNumbers

from spmdsim.jax.rules import _windows
from spmdsim.jax.rules._structural import pad_array
from spmdsim.jax.evaluation._registry import PER_DEVICE, VECTORIZED

pytestmark = [pytest.mark.area("lax primitives vs XLA:CPU"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # inf - inf, NaN in products

SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, 1e-40, -1e-40, -3.0])


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _random(rng, shape, dtype, nans=True):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0 if dtype.kind == "u" else -5, 6, shape).astype(dtype)
    x = np.where(rng.random(shape) < 0.5, rng.choice(SPECIALS, shape), rng.standard_normal(shape).round(1))
    if nans:
        x = np.where(rng.random(shape) < 0.05, np.nan, x)
    x = x.astype(dtype)
    if nans and dtype == np.float32:  # NaNs of other payloads and signs
        bits = x.view(np.uint32).copy()
        other = rng.random(shape) < 0.05
        bits[other] = rng.choice(np.uint32([0x7FC00001, 0xFFC00000, 0xFFC12345, 0x7F800001]), int(other.sum()))
        x = bits.view(np.float32)
    return x


# -- convolution patches ---------------------------------------------------------------------------------------

def _reference_patches(lhs, *, window_strides, padding, lhs_dilation, rhs_dilation, lhs_spec, kernel, groups,
                       batch_groups, compute, leading):
    """The patches as the rule wrote them before issue 27: one kernel offset at a time."""
    lead = tuple(range(leading))
    x = np.transpose(lhs, lead + tuple(d + leading for d in lhs_spec)).astype(compute, copy=False)
    front = x.shape[:leading]
    n, c, *_ = x.shape[leading:]
    config = [(0, 0, 0)] * (leading + 2) + [(lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_dilation)]
    x = pad_array(x, np.zeros((), compute), config)
    out = tuple(max(0, (p - ((k - 1) * d + 1)) // s + 1)
                for p, k, d, s in zip(x.shape[leading + 2:], kernel, rhs_dilation, window_strides))
    if batch_groups > 1:
        g, rows, depth = batch_groups, n // batch_groups, c

        def arrange(v):
            return np.moveaxis(v.reshape(front + (g, rows, c) + out), leading + 2, -1)
    else:
        g, rows, depth = groups, n, c // groups

        def arrange(v):
            v = np.moveaxis(v.reshape(front + (n, g, depth) + out), leading + 1, leading)
            return np.moveaxis(v, leading + 2, -1)
    patches = np.empty(front + (g, rows) + out + (depth, math.prod(kernel)), compute)
    for k, offset in enumerate(itertools.product(*(range(size) for size in kernel))):
        index = tuple(slice(q * d, q * d + (m - 1) * s + 1, s) if m else slice(0, 0)
                      for q, d, m, s in zip(offset, rhs_dilation, out, window_strides))
        patches[..., k] = arrange(x[(Ellipsis,) + index])
    return patches.reshape(front + (g, rows * math.prod(out), depth * math.prod(kernel)))


def _conv_case(rng):
    rank = int(rng.integers(1, 3))
    groups = int(rng.choice([1, 1, 2, 3]))
    batch_groups = 1 if groups > 1 else int(rng.choice([1, 1, 2]))
    n, c = int(rng.integers(1, 4)) * batch_groups, int(rng.integers(1, 3)) * groups
    o = int(rng.integers(1, 3)) * groups * batch_groups
    spatial = tuple(int(s) for s in rng.integers(1, 10, rank))
    kernel = tuple(int(k) for k in rng.integers(1, 5 if rng.random() < 0.8 else 12, rank))
    params = dict(window_strides=tuple(int(s) for s in rng.integers(1, 3, rank)),
                  padding=tuple((int(lo), int(hi)) for lo, hi in rng.integers(-1 if rng.random() < 0.2 else 0, 3,
                                                                               (rank, 2))),
                  lhs_dilation=tuple(int(d) for d in rng.integers(1, 3, rank)) if rng.random() < 0.3 else (1,) * rank,
                  rhs_dilation=tuple(int(d) for d in rng.integers(1, 3, rank)) if rng.random() < 0.3 else (1,) * rank,
                  dimension_numbers=ConvDimensionNumbers(*(tuple(int(p) for p in rng.permutation(rank + 2))
                                                           for _ in range(3))),
                  feature_group_count=groups, batch_group_count=batch_groups)
    lhs_spec, rhs_spec, _ = params["dimension_numbers"]
    lhs_shape, rhs_shape = [0] * (rank + 2), [0] * (rank + 2)
    for k, d in enumerate(lhs_spec):
        lhs_shape[d] = ((n, c) + spatial)[k]
    for k, d in enumerate(rhs_spec):
        rhs_shape[d] = ((o, c // groups) + kernel)[k]
    return params, tuple(lhs_shape), tuple(rhs_shape), kernel


@pytest.mark.parametrize("block,parallel", [(1 << 19, 1 << 22), (64, 1 << 22), (64, 0)])
def test_conv_patches_are_the_kernel_offset_loops(monkeypatch, block, parallel):
    """The patches (per device and with a leading device axis) equal the loop's bit for bit and are C-order (the
    layout BLAS reads, which picks its kernel); blocks of rows copied separately, and by several threads, change
    nothing."""
    monkeypatch.setattr(_windows, "_GATHER_BLOCK", block)
    monkeypatch.setattr(_windows, "_PARALLEL_BYTES", parallel)
    rng = np.random.default_rng(block)
    for _ in range(150):
        params, lhs_shape, rhs_shape, kernel = _conv_case(rng)
        dtype = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32][int(rng.integers(5))]
        compute = np.dtype(np.float32) if np.dtype(dtype).itemsize == 2 else np.dtype(dtype)
        for leading in (0, 1):
            lhs = _random(rng, (3,) * leading + lhs_shape, dtype)
            if rng.random() < 0.3:
                lhs = np.asfortranarray(lhs)
            rhs = _random(rng, (3,) * leading + rhs_shape, dtype)
            try:
                a, *_ = _windows._conv_operands(lhs, rhs, compute=compute, leading=leading, **params)
            except ValueError:  # a shape lax.conv rejects
                continue
            expected = _reference_patches(lhs, lhs_spec=params["dimension_numbers"][0], kernel=kernel,
                                          groups=params["feature_group_count"],
                                          batch_groups=params["batch_group_count"], compute=compute, leading=leading,
                                          **{k: params[k] for k in ("window_strides", "padding", "lhs_dilation",
                                                                    "rhs_dilation")})
            assert _same(a, expected), params
            assert a.flags.c_contiguous


def test_conv_vectorized_is_per_device():
    """The vectorized convolution, with a broadcast or stacked kernel, a kernel read backwards (``rev``) and
    a broadcast input, equals the per-device one on every device, bit for bit."""
    rng = np.random.default_rng(7)
    for _ in range(100):
        params, lhs_shape, rhs_shape, _ = _conv_case(rng)
        dtype = [np.float32, np.float16, np.int32, np.bool_][int(rng.integers(4))]
        lhs = _random(rng, (3,) + lhs_shape, dtype)
        lhs = np.broadcast_to(lhs[0], lhs.shape) if rng.random() < 0.3 else lhs  # a replicated input
        rhs = _random(rng, rhs_shape, dtype)
        rhs = np.flip(rhs, -1) if rng.random() < 0.3 else rhs
        rhs = np.broadcast_to(rhs, (3,) + rhs.shape) if rng.random() < 0.5 else np.stack([rhs] * 3)
        params.update(precision=None, preferred_element_type=None)
        stacked = VECTORIZED["conv_general_dilated"](lhs, rhs, **params)
        for d in range(3):
            assert _same(stacked[d], PER_DEVICE["conv_general_dilated"](lhs[d], rhs[d], **params)), params


# -- reduce_window max and min ---------------------------------------------------------------------------------

def _window_case(rng, rank):
    return dict(window_dimensions=tuple(int(w) for w in rng.integers(0 if rng.random() < 0.05 else 1, 4, rank)),
                window_strides=tuple(int(s) for s in rng.integers(1, 4, rank)),
                padding=tuple((int(lo), int(hi)) for lo, hi in rng.integers(0, 3, (rank, 2)))
                if rng.random() < 0.5 else ((0, 0),) * rank,
                base_dilation=tuple(int(d) for d in rng.integers(1, 3, rank)) if rng.random() < 0.3 else (1,) * rank,
                window_dilation=tuple(int(d) for d in rng.integers(1, 3, rank)) if rng.random() < 0.3 else (1,) * rank)


@pytest.mark.parametrize("name", ["reduce_window_max", "reduce_window_min"])
def test_reduce_window_extremum_is_the_fold(name):
    """max/min pooling equals the fold of XLA's max/min (-0.0 below +0.0) from the identity, window position by
    window position, bit for bit (NaNs included: they take the fold itself); vectorized equals per device."""
    rng = np.random.default_rng(len(name))
    combine = PER_DEVICE["max" if name.endswith("max") else "min"]
    for _ in range(200):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(s) for s in rng.integers(1, 7, rank))
        params = _window_case(rng, rank)
        dtype = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8, np.bool_][
            int(rng.integers(7))]
        x = _random(rng, shape, dtype, nans=rng.random() < 0.3)
        wide = x.astype(np.float32) if np.dtype(dtype).itemsize == 2 and np.dtype(dtype).kind != "i" else x
        init = (_windows._lowest if name.endswith("max") else _windows._highest)(wide.dtype)
        fold = combine if np.dtype(wide.dtype).kind == "f" else (np.maximum if name.endswith("max") else np.minimum)
        expected, = _windows._fold_windows([wide], [init], lambda acc, xs: [fold(acc[0], xs[0])], **params)
        assert _same(PER_DEVICE[name](x, **params), expected.astype(x.dtype)), (params, dtype)
        stacked = np.stack([x, _random(rng, shape, dtype)])
        out = VECTORIZED[name](stacked, **params)
        for d in range(2):
            assert _same(out[d], PER_DEVICE[name](stacked[d], **params)), (params, dtype)


def test_reduce_window_sum_is_the_fold():
    """Sum pooling adds the window positions in row-major order from 0, bit for bit (NaN payloads included)."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(s) for s in rng.integers(1, 7, rank))
        params = _window_case(rng, rank)
        dtype = [np.float32, np.float64, np.float16, np.int8][int(rng.integers(4))]
        x = _random(rng, shape, dtype)
        wide = x.astype(np.float32) if dtype == np.float16 else x
        expected, = _windows._fold_windows([wide], [np.zeros((), wide.dtype)],
                                           lambda acc, xs: [np.add(acc[0], xs[0])], **params)
        assert _same(PER_DEVICE["reduce_window_sum"](x, **params), expected.astype(x.dtype)), (params, dtype)


def test_reduce_window_max_keeps_the_sign_of_zeros():
    x = np.float32([[-0.0, -0.0, 0.0, -0.0, -1.0, -0.0, -np.inf, -np.inf]])
    out = PER_DEVICE["reduce_window_max"](x, window_dimensions=(1, 2), window_strides=(1, 2), padding=((0, 0),) * 2,
                                          base_dilation=(1, 1), window_dilation=(1, 1))
    assert out.tobytes() == np.float32([[-0.0, 0.0, -0.0, -np.inf]]).tobytes()
    out = PER_DEVICE["reduce_window_min"](-x, window_dimensions=(1, 2), window_strides=(1, 2),
                                          padding=((0, 0),) * 2, base_dilation=(1, 1), window_dilation=(1, 1))
    assert out.tobytes() == np.float32([[0.0, -0.0, 0.0, np.inf]]).tobytes()


# -- select_and_scatter_add ------------------------------------------------------------------------------------

_SELECT = {"ge": np.greater_equal, "gt": np.greater, "le": np.less_equal, "lt": np.less}


def _reference_select_and_scatter_add(source, operand, select, window_dimensions, window_strides, padding):
    """Window by window in row-major order: the first real element, replaced by a later one unless
    ``select(kept, later)``; its source added to the output (from 0, rounded after every addition)."""
    real = pad_array(np.ones(operand.shape, bool), np.asarray(False), [(lo, hi, 0) for lo, hi in padding])
    padded = pad_array(operand, np.zeros((), operand.dtype), [(lo, hi, 0) for lo, hi in padding])
    out = np.zeros(padded.shape, source.dtype)
    for window in np.ndindex(source.shape):
        kept = None
        for offset in itertools.product(*(range(w) for w in window_dimensions)):
            at = tuple(i * s + o for i, s, o in zip(window, window_strides, offset))
            if real[at] and (kept is None or not select(padded[kept], padded[at])):
                kept = at
        if kept is not None:
            out[kept] = out[kept] + source[window]
    return out[tuple(slice(lo, out.shape[d] - hi) for d, (lo, hi) in enumerate(padding))]


def test_select_and_scatter_add_is_the_window_by_window_scatter():
    """The gradient of max/min pooling, tiled, overlapping, strided past the windows or padded, equals the
    window-by-window reference bit for bit (NaNs, ties and zeros of both signs included); vectorized equals
    per device."""
    rng = np.random.default_rng(3)
    for _ in range(150):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(s) for s in rng.integers(1, 7, rank))
        window = tuple(int(w) for w in rng.integers(1, 4, rank))
        strides = window if rng.random() < 0.4 else tuple(int(s) for s in rng.integers(1, 4, rank))
        padding = tuple((int(lo), int(hi)) for lo, hi in rng.integers(0, 2, (rank, 2))) if rng.random() < 0.4 \
            else ((0, 0),) * rank
        if rng.random() < 0.3:  # the windows tile the operand
            strides, padding = window, ((0, 0),) * rank
            shape = tuple(w * int(rng.integers(1, 4)) for w in window)
        dtype = [np.float32, np.float64, np.int32][int(rng.integers(3))]
        operand = _random(rng, shape, dtype, nans=rng.random() < 0.3)
        out_shape = tuple(max(0, (n + lo + hi - w) // s + 1) for n, (lo, hi), w, s in zip(shape, padding, window,
                                                                                          strides))
        # the sources' NaNs of one payload: the reference adds with NumPy's scalars, np.add.at with its own loop
        source = _random(rng, out_shape, np.float64).astype(np.float32)
        for name, select in _SELECT.items():
            params = dict(window_dimensions=window, window_strides=strides, padding=padding)
            prim = types.SimpleNamespace(name=name)
            out = PER_DEVICE["select_and_scatter_add"](source, operand, select_prim=prim, **params)
            expected = _reference_select_and_scatter_add(source, operand, select, **params)
            assert _same(out, expected), (name, params, dtype)
            operands = np.stack([operand, _random(rng, shape, dtype)])
            sources = np.stack([source, _random(rng, out_shape, np.float32)])
            stacked = VECTORIZED["select_and_scatter_add"](sources, operands, select_prim=prim, **params)
            for d in range(2):
                assert _same(stacked[d], PER_DEVICE["select_and_scatter_add"](sources[d], operands[d],
                                                                                select_prim=prim, **params))


def test_large_stacked_windows_split_over_the_devices_as_each_device_computes():
    """Max pooling, sum pooling and the max pooling's gradient of more than a million stacked elements run one
    part of the devices per CPU (``_reductions.by_devices``); each device's result is the per-device rule's on
    its own blocks, bit for bit, also where a NaN in one device's block sends only that part down the slow
    path."""
    rng = np.random.default_rng(8)
    operand = _random(rng, (6, 32, 28, 28, 8), np.float32)
    operand[4, 3, 5, 7, 1] = np.nan
    window = dict(window_dimensions=(1, 2, 2, 1), window_strides=(1, 2, 2, 1))
    padded = dict(window, padding=((0, 0),) * 4)
    for name in ("reduce_window_max", "reduce_window_sum"):
        params = dict(padded, base_dilation=(1,) * 4, window_dilation=(1,) * 4)
        stacked = VECTORIZED[name](operand, **params)
        for d in range(6):
            # (devices 3 to 5 differed in full CI runs: their part ran in a parked thread started inside an XLA
            # callback by an earlier test, flushing subnormals; see conformance/test_float_environment.py)
            assert _same(stacked[d], PER_DEVICE[name](operand[d], **params)), (name, d)
    source = _random(rng, (6, 32, 14, 14, 8), np.float32)
    prim = types.SimpleNamespace(name="ge")
    stacked = VECTORIZED["select_and_scatter_add"](source, operand, select_prim=prim, **padded)
    for d in range(6):
        assert _same(stacked[d], PER_DEVICE["select_and_scatter_add"](source[d], operand[d], select_prim=prim,
                                                                        **padded)), d
