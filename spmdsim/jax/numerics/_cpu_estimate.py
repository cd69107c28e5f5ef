"""The CPU's own reciprocal square root estimate (``vrsqrt14pd``), executed, for XLA:CPU's float64 ``rsqrt``.

XLA:CPU (jaxlib 0.10.2 to 0.12.0.1) computes float64 ``rsqrt`` where AVX-512F is in effect as the CPU's 14-bit
estimate ``vrsqrt14pd`` refined by two Newton-Raphson steps (``xla/codegen/intrinsic/rsqrt.cc``), so its result
depends on the estimate's exact bits, which the instruction set leaves to each CPU (they are not derivable from
its documentation; on AMD Zen 4 the float64 estimate equals the float32 one, ``vrsqrt14ps``, of the operand
truncated to float32). spmdsim runs that one instruction on the operands (a 38-byte x86-64 function, put in
executable memory and called through :mod:`ctypes`): the CPU's bits, whatever its vendor. :func:`rsqrt14` gives
None where it cannot run (not x86-64 Linux or macOS, no AVX-512F, executable memory refused); callers then use
the correctly rounded value and say so.

Measured: with the estimate so computed, XLA:CPU's float64 ``rsqrt`` is reproduced bit for bit (524,288 operands
over 1e-304 to 1e304, array lengths 1-13 and 2**19, jaxlib 0.10.2, 0.11.2 and 0.12.0.1, AMD EPYC Zen 4).
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import platform
import sys

import numpy as np

__all__ = ["rsqrt14"]

# void est(const double *in, double *out, long n), n a multiple of 8 (System V ABI: rdi, rsi, rdx):
#   xor eax, eax; shl rdx, 3; test rdx, rdx; je done
#   loop: vrsqrt14pd zmm0, [rdi + rax]; vmovupd [rsi + rax], zmm0; add rax, 64; cmp rax, rdx; jb loop
#   done: vzeroupper; ret
_CODE = bytes.fromhex("31c048c1e2034885d2741762f2fd484e040762f1fd481104064883c04048"
                      "39d072e9c5f877c3")


@functools.cache
def _function():
    """The estimate function in executable memory, or None where it cannot run here."""
    from spmdsim.jax.numerics import _xla_cpu_isa
    flags = _xla_cpu_isa._cpu_flags()
    if platform.machine().lower() not in ("x86_64", "amd64") or sys.platform not in ("linux", "darwin") \
            or flags is None or "avx512f" not in flags:
        return None
    try:
        memory = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError, AttributeError):
        return None  # W^X policies (SELinux's execmem, hardened kernels) refuse it
    memory.write(_CODE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    function = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long)(address)
    function.memory = memory  # kept alive with the function
    return function


def rsqrt14(x: np.ndarray) -> np.ndarray | None:
    """``vrsqrt14pd`` of every element of float64 ``x`` (any shape), as this CPU computes it (relative error
    below 2**-14; +inf at +-0, 0 at +inf, NaN below zero; subnormals are not flushed: flush them first for
    XLA's DAZ), or None where the instruction cannot be run here."""
    function = _function()
    if function is None:
        return None
    flat = np.ascontiguousarray(x, np.float64).reshape(-1)
    padded = np.ones(-(-flat.size // 8) * 8, np.float64)
    padded[:flat.size] = flat
    out = np.empty_like(padded)
    function(padded.ctypes.data, out.ctypes.data, padded.size)
    return out[:flat.size].reshape(np.shape(x))
