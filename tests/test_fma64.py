"""spmdsim.jax.numerics._xla_cpu_math.fma64, the exactly rounded float64 fused multiply-add (issue 38.4), against a correctly
rounded reference: Python 3.13's math.fma where the interpreter has it, else exact rational arithmetic (fractions,
rounded by CPython's correctly rounded integer division). Random bit patterns, ordinary magnitudes, ties,
cancellations, subnormal and overflowing products and sums, infinities, NaNs and signed zeros; deterministic."""
from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pytest

from spmdsim.jax.numerics._xla_cpu_math import fma64

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 2.0 ** -1022, -(2.0 ** -1022),
                     2.0 ** -1022 - 2.0 ** -1074, 1.7976931348623157e308, -1.7976931348623157e308, 1.0, -1.0,
                     2.0 ** 1023, 2.0 ** -537, 2.0 ** 512, 1.5, 3.0, 1 + 2.0 ** -52])


def _exact(a: float, b: float, c: float) -> float:
    """Correctly rounded ``a * b + c`` (IEEE's fusedMultiplyAdd, round to nearest even)."""
    if math.isnan(a) or math.isnan(b) or math.isnan(c):
        return math.nan
    if math.isinf(a) or math.isinf(b):
        return a * b + c  # exact infinite (or NaN) product
    if math.isinf(c):
        return c
    x = Fraction(a) * Fraction(b) + Fraction(c)
    if x == 0:
        return a * b + c  # the sign of an exact zero: IEEE's sum of the product's and c's zero signs
    try:
        r = x.numerator / x.denominator
    except OverflowError:
        return math.inf if x > 0 else -math.inf
    if abs(r) == math.inf or (abs(r) > 1.7976931348623157e308):
        return math.inf if x > 0 else -math.inf
    return r if r != 0 else (0.0 if x > 0 else -0.0)


def _reference(a, b, c) -> np.ndarray:
    fma = getattr(math, "fma", None)

    def one(x, y, z):
        if fma is None:
            return _exact(x, y, z)
        try:
            return fma(x, y, z)
        except (OverflowError, ValueError):  # math.fma raises where IEEE overflows to inf or is invalid (NaN)
            return _exact(x, y, z)
    return np.array(list(map(one, a.tolist(), b.tolist(), c.tolist())), np.float64)


def _cases(n: int, rng) -> dict:
    def spread(k, lo, hi):
        return rng.uniform(-2, 2, n) * 2.0 ** rng.integers(lo, hi, n)

    bits = lambda: rng.integers(0, 2 ** 64, n, dtype=np.uint64).view(np.float64)  # noqa: E731
    a, b = spread(0, -4, 5), spread(0, -4, 5)
    with np.errstate(all="ignore"):
        p = a * b
    odd = lambda: (rng.integers(1, 2 ** 27, n) * 2 + 1) * 2.0 ** -28  # noqa: E731 - products on a midpoint
    tiny_a, tiny_b = spread(0, -560, -480), spread(0, -560, -480)
    big_a, big_b = spread(0, 500, 530), spread(0, 490, 512)
    with np.errstate(all="ignore"):
        tiny_p, big_p = tiny_a * tiny_b, big_a * big_b
    pick = lambda: SPECIALS[rng.integers(0, len(SPECIALS), n)]  # noqa: E731
    mix = lambda x: np.where(rng.random(n) < 0.3, pick(), x)  # noqa: E731
    return {
        "random bits": (bits(), bits(), bits()),
        "ordinary": (a, b, spread(0, -4, 5)),
        "cancellation": (a, b, -p),
        "near cancellation": (a, b, -p * (1 + rng.uniform(-1e-15, 1e-15, n))),
        "ties": (odd(), odd(), rng.choice([0.0, 1.0, -1.0, 2.0 ** -60, -(2.0 ** -60), 2.0 ** -110, 2.0 ** -200], n)),
        "subnormal": (tiny_a, tiny_b, np.where(rng.random(n) < 0.5, -tiny_p * (1 + rng.uniform(-1e-3, 1e-3, n)),
                                               spread(0, -1074, -1000))),
        "overflow": (big_a, big_b, np.where(rng.random(n) < 0.5, -big_p * (1 + rng.uniform(-1e-3, 1e-3, n)),
                                            spread(0, 900, 1023))),
        "skewed": (spread(0, 990, 1023), spread(0, -1074, -900), spread(0, -1074, 1023)),
        "specials": (pick(), pick(), pick()),
        "mixed": (mix(bits()), mix(spread(0, -600, 600)), mix(spread(0, -1000, 1000))),
    }


@pytest.mark.parametrize("seed", [0, 1])
def test_fma64_is_correctly_rounded(seed):
    rng = np.random.default_rng(3804 + seed)
    for name, (a, b, c) in _cases(20000, rng).items():
        got, want = fma64(a, b, c), _reference(a, b, c)
        same = (got.view(np.uint64) == want.view(np.uint64)) | (np.isnan(got) & np.isnan(want))
        k = np.flatnonzero(~same)
        assert not k.size, f"{name}: {k.size} differ, first fma64({a[k[0]]!r}, {b[k[0]]!r}, {c[k[0]]!r}) = " \
                           f"{got[k[0]]!r}, correctly rounded {want[k[0]]!r}"


def test_fma64_negations_broadcasting_and_out():
    rng = np.random.default_rng(3805)
    a, c = rng.standard_normal((3, 40000)), rng.standard_normal(40000)
    b = np.float64(1.1)
    want = _reference(*(x.ravel() for x in np.broadcast_arrays(-a, b, -c)))
    assert np.array_equal(fma64(a, b, c, negate_product=True, negate_addend=True), want.reshape(3, 40000))
    out = a.copy()
    assert fma64(out, b, c, negate_product=True, negate_addend=True, out=out) is out
    assert np.array_equal(out, want.reshape(3, 40000))
    assert fma64(2.0, 3.0, 1.0).shape == ()
    assert fma64(np.float64(0.1), 10.0, -1.0) == 5.551115123125783e-17  # not 0: the product kept whole


def test_fma64_speed_against_the_float32_path():
    """Elements per second, printed (``-s``): the float64 emulation is a few times slower than float32's
    multiply-add through float64 (about 40 NumPy operations per element against 3) but still tens of millions per
    second; the bound only catches a fall into the per-element path."""
    from spmdsim.jax.numerics._xla_cpu_math import rounded_once
    rng = np.random.default_rng(3806)
    a, b, c = rng.standard_normal((3, 1 << 20))
    a32, b32, c32 = (x.astype(np.float32) for x in (a, b, c))
    rates = {}
    for name, fn in (("float64 fma64", lambda: fma64(a, b, c)),
                     ("float32 rounded_once", lambda: rounded_once(a32, b32, c32, np.float32))):
        fn()
        start = time.perf_counter()
        fn()
        rates[name] = a.size / (time.perf_counter() - start)
    print(", ".join(f"{k}: {v / 1e6:.0f} M elements/s" for k, v in rates.items()))
    assert rates["float64 fma64"] > 2e6
