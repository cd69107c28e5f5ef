"""spmdsim.jax.numerics._xla_cpu_math.fma32_step, a float32 fused multiply-add rounded once (the steps of
SPMDSIM_EXACT=1's product chains), against exact rational arithmetic rounded to float32 (round half to even).
Sums that the float64 route rounds twice (exactly on a float32 midpoint after float64's rounding), ordinary
magnitudes, cancellations and float32 subnormals; deterministic."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from spmdsim.jax.numerics._xla_cpu_math import fma32_step

f32, f64 = np.float32, np.float64


def _round32(x: Fraction) -> float:
    """``x`` (nonzero) rounded to the nearest float32 (ties to even), as a float; within float32's finite range; a
    value that rounds to zero keeps its sign."""
    e = max(abs(x.numerator).bit_length() - abs(x.denominator).bit_length() - 24, -151)
    while abs(x) >= Fraction(2) ** (e + 24):  # the quantum 2**e: 24 significant bits, or 2**-149 below normal
        e += 1
    while e > -149 and abs(x) < Fraction(2) ** (e + 23):
        e -= 1
    e = max(e, -149)
    return math.copysign(float(round(x / Fraction(2) ** e) * Fraction(2) ** e), x)  # round: half to even


def _exact(a, b, c) -> np.ndarray:
    """Correctly rounded ``a * b + c``; an exact zero with IEEE's sign (float64's, exact there)."""
    exact = [Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)) for x, y, z in zip(a, b, c)]
    return np.array([_round32(x) if x else f64(y) * z + f64(w) for x, y, z, w in zip(exact, a, b, c)], f32)


def _near_midpoints(rng, n: int):
    """``c + a * b`` within 2**-24 of its ulp of a float32 midpoint: ``a * b = ±(ulp(c) / 2) * (1 - u**2)``
    (``a = (1 + u) * ulp / 2``, ``b = ±(1 - u)``), which float64 rounds onto the midpoint for small ``u``."""
    e = rng.integers(-125, 100, n)
    c = np.ldexp(1 + rng.integers(0, 2 ** 23, n) * 2.0 ** -23, e).astype(f32)
    half = np.spacing(c).astype(f64) / 2
    u = 2.0 ** -rng.integers(12, 22, n).astype(f64)
    a = ((1 + u) * half).astype(f32)
    b = ((1 - u) * rng.choice([-1.0, 1.0], n)).astype(f32)
    return a, b, c * rng.choice([-1, 1], n).astype(f32)


def _check(a, b, c):
    want = _exact(a, b, c)
    acc = c.copy()
    fma32_step(a.astype(f64) * b, acc, np.empty(acc.shape, f64))
    np.testing.assert_array_equal(acc.view(np.int32), want.view(np.int32))
    return want


def test_near_midpoints_are_rounded_once():
    rng = np.random.default_rng(0)
    a, b, c = _near_midpoints(rng, 3000)
    want = _check(a, b, c)
    twice = (a.astype(f64) * b + c).astype(f32)  # float64 first: the double rounding this step removes
    assert (twice.view(np.int32) != want.view(np.int32)).sum() > 100


def test_ordinary_cancelling_and_subnormal_sums():
    rng = np.random.default_rng(1)
    n = 4000
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20, n)).astype(f32)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20, n)).astype(f32)
    c = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 30, n)).astype(f32)
    c[::7] = -(a[::7].astype(f64) * b[::7]).astype(f32)  # cancellation to the product's rounding error
    tiny = slice(1, None, 5)  # products and addends near float32's subnormal range
    a[tiny] = (rng.standard_normal(a[tiny].size) * 2.0 ** -70).astype(f32)
    b[tiny] = (rng.standard_normal(b[tiny].size) * 2.0 ** -70).astype(f32)
    c[tiny] = (rng.standard_normal(c[tiny].size) * 2.0 ** -140).astype(f32)
    _check(a, b, c)


def test_accumulator_views_and_broadcast_products():
    """The chains' use: a float32 accumulator that is a strided view, and products broadcast against it."""
    rng = np.random.default_rng(2)
    a, b, c = _near_midpoints(rng, 64)
    lanes = np.zeros((2, 64, 3), f32)
    lanes[1, :, 1] = c
    view = lanes[1, :, 1:2]  # (64, 1), not contiguous
    fma32_step((a.astype(f64) * b)[:, None], view, np.empty(view.shape, f64))
    np.testing.assert_array_equal(lanes[1, :, 1].view(np.int32), _exact(a, b, c).view(np.int32))
    acc = np.broadcast_to(c[:1], (8,)).copy()  # one product against 8 accumulators
    fma32_step(np.array([a[0] * f64(b[0])]), acc, np.empty(8, f64))
    want = _exact(a[:1].repeat(8), b[:1].repeat(8), np.full(8, c[0]))
    np.testing.assert_array_equal(acc.view(np.int32), want.view(np.int32))
