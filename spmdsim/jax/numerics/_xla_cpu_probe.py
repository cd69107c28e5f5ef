"""What the installed jaxlib's XLA:CPU computes where neither the ISA nor the JAX source says it: learnt once per
process by running a small program on XLA:CPU (JAX's own ``jit``, on the CPU backend) and comparing its bits
with the candidate formulas.

Each probe names the jaxlib releases seen to take each answer, and falls back to the first candidate (the one
spmdsim computed before the probe existed) when XLA matches none, or cannot be run. The inputs are fixed (a
seeded generator), so a probe's answer depends only on the jaxlib, the CPU and ``XLA_FLAGS``.
"""
from __future__ import annotations

import functools
import os
import threading

import numpy as np

__all__ = ["complex64_multiply", "complex64_abs", "digamma_at_zero", "rsqrt_offsets", "RSQRT_TABLE_ENV"]

_lock = threading.Lock()


def _on_xla(fun, *args) -> np.ndarray | None:
    """``fun(*args)`` compiled and run by XLA:CPU; None when that fails (no CPU backend, say)."""
    try:
        import jax

        from spmdsim.jax._internals import jax_jit
        with jax.default_device(jax.devices("cpu")[0]):
            return np.asarray(jax_jit(fun)(*args))
    except Exception:  # noqa: BLE001 - the probe is an optimisation of fidelity: without it the default holds
        return None


def _fma32(a, b, c) -> np.ndarray:
    """float32 ``a * b + c`` rounded once (the product of two float32 values is exact in float64; the sum then
    rounded twice agrees with one rounding for these inputs' magnitudes, checked by the probe itself)."""
    return (a.astype(np.float64) * b + c).astype(np.float32)


def _operands(n: int = 512):
    rng = np.random.default_rng(20261129)
    x = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    y = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    return x, y


@functools.cache
def complex64_multiply() -> str:
    """Which product of complex64 ``(a + bi)(c + di)`` XLA:CPU fuses into the imaginary part's multiply-add:
    ``"bc"``: ``fma(b, c, a*d)`` (jaxlib 0.10); ``"ad"``: ``fma(a, d, b*c)`` (jaxlib 0.12). The real part is
    ``fma(a, c, -(b*d))`` in both."""
    with _lock:
        x, y = _operands()
        got = _on_xla(lambda p, q: p * q, x, y)
        if got is None:
            return "bc"
        a, b, c, d = x.real, x.imag, y.real, y.imag
        for name, imag in (("bc", _fma32(b, c, a * d)), ("ad", _fma32(a, d, b * c))):
            if np.array_equal(got.imag, imag):
                return name
        return "bc"


@functools.cache
def complex64_abs() -> str:
    """How XLA:CPU computes ``abs`` of a complex64 of moderate magnitude: ``"hypot"`` (NumPy's, spmdsim's
    before the probe; jaxlib 0.10 in its programs of one equation was not seen to differ) or ``"fma"``:
    ``sqrt(fma(a, a, b*b))`` (jaxlib 0.12)."""
    with _lock:
        x, _ = _operands()
        got = _on_xla(lambda p: abs(p), x)
        if got is None:
            return "hypot"
        a, b = x.real, x.imag
        if np.array_equal(got, np.abs(x)):
            return "hypot"
        if np.array_equal(got, np.sqrt(_fma32(a, a, b * b))):
            return "fma"
        return "hypot"


@functools.cache
def digamma_at_zero() -> float:
    """XLA:CPU's ``digamma(+-0)``: NaN, as at the other poles (jaxlib 0.10), or -inf (jaxlib 0.12)."""
    with _lock:
        got = _on_xla(lambda p: __import__("jax").lax.digamma(p), np.zeros(1, np.float32))
        return float("nan") if got is None or np.isnan(got[0]) else float(got[0])


RSQRT_TABLE_ENV = "SPMDSIM_XLA_CPU_RSQRT_TABLE"


@functools.cache
def rsqrt_offsets() -> np.ndarray | None:
    """XLA:CPU's float32 ``rsqrt`` on this CPU and jaxlib, as offsets from the correctly rounded value: for every
    float32 ``x`` in [1, 4) in the order of its bits (entry ``i`` is ``x = (127 << 23) + i`` as float32 bits),
    XLA's result's bits minus those of ``(1 / sqrt(float64(x))).astype(float32)`` (int8, 2**24 entries). Every
    other positive normal float32 follows: ``rsqrt(4**k * x) == rsqrt(x) / 2**k`` exactly (XLA refines the CPU's
    estimate instruction, whose table repeats every two binades). None where XLA cannot be run.

    XLA's result depends on the CPU's estimate instruction and the refinement the jaxlib emits (AVX-512's
    ``vrsqrt14ps`` and two Newton steps on Intel; other bits on AMD's Zen 4, ``../shared/data/xla-cpu/``), so it
    is measured here, once per process (about 0.3 s). ``$SPMDSIM_XLA_CPU_RSQRT_TABLE``: an ``.npz`` holding such a
    table as ``ulp_vs_correct`` (another CPU's, recorded there) is used instead."""
    path = os.environ.get(RSQRT_TABLE_ENV)
    if path:
        return np.load(path)["ulp_vs_correct"].astype(np.int8)
    with _lock:
        x = (np.arange(1 << 24, dtype=np.uint32) + np.uint32(127 << 23)).view(np.float32)
        got = _on_xla(lambda v: __import__("jax").lax.rsqrt(v), x)
        if got is None:
            return None
        correct = (1 / np.sqrt(x.astype(np.float64))).astype(np.float32)
        offsets = got.view(np.int32) - correct.view(np.int32)
        if np.abs(offsets).max() > 127:
            return None
        return offsets.astype(np.int8)
