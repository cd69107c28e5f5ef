"""The floating-point environment spmdsim computes in: IEEE's default, subnormal numbers kept.

XLA:CPU runs its programs, and the host callbacks it calls (``jax.pure_callback``, ``io_callback``,
``jax.debug.callback``), with subnormals flushed to zero: x86's MXCSR has its flush-to-zero and
denormals-are-zero bits set there (0x9fe2 in a callback against 0x1fa2 outside, jax 0.10.2 to 0.12.0.1), and a
thread started from such a thread inherits its environment. spmdsim's rules compute in the default environment
and flush explicitly where they port XLA's own flushing (``spmdsim.jax.numerics._xla_cpu_math``); elsewhere
spmdsim keeps IEEE subnormals (the documented difference, docs/jax_programs.md). So what spmdsim computes must
not depend on which thread computes it: a parked device thread first started inside a callback (a map in JAX's
own jit) computed sums and maxima of subnormals flushed, and only the devices that thread ran differed.

:func:`reset` puts the calling thread back in the default environment where it flushes (a device thread,
before each body); :class:`default` does so for a block and restores the caller's environment after it (an
entry point XLA calls back into). The check is one Python float multiplication (tens of ns); the environment
is changed with the C library's ``fegetenv``/``fesetenv`` (``FE_DFL_ENV``), only where the thread flushes.
Without those functions (not a glibc or musl process) nothing is changed.
"""
from __future__ import annotations

import ctypes

__all__ = ["flushes", "reset", "default"]

_SMALLEST = 5e-324  # the smallest positive subnormal double
_ONE = 1.0
_FE_DFL_ENV = ctypes.c_void_p(-1)  # glibc's and musl's FE_DFL_ENV: ((const fenv_t *) -1)
_FENV_BYTES = 64  # fenv_t is 32 bytes on x86-64, 8 on aarch64: room for either


def _libc():
    try:
        libc = ctypes.CDLL(None)
        return libc.fegetenv, libc.fesetenv
    except (OSError, AttributeError):
        return None


_FUNCTIONS = _libc()


def flushes() -> bool:
    """Whether this thread flushes subnormal numbers (x86: FTZ or DAZ; a subnormal operand or result is 0)."""
    return _SMALLEST * _ONE == 0.0


def reset() -> None:
    """Put this thread in the default floating-point environment if it flushes subnormals."""
    if _FUNCTIONS is not None and flushes():
        _FUNCTIONS[1](_FE_DFL_ENV)


class default:
    """``with default():`` runs the block in the default floating-point environment and gives the thread its
    own environment back after it, also when the block raises."""

    __slots__ = ("saved",)

    def __enter__(self):
        self.saved = None
        if _FUNCTIONS is not None and flushes():
            self.saved = ctypes.create_string_buffer(_FENV_BYTES)
            _FUNCTIONS[0](self.saved)
            _FUNCTIONS[1](_FE_DFL_ENV)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            _FUNCTIONS[1](self.saved)
        return False
