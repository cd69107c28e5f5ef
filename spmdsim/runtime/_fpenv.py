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
Outside Linux (glibc, musl) nothing is changed.

:class:`like_xla` is the other way round, for the user's own code that XLA would call flushing: a host callback
in a map (``jax.pure_callback``'s NumPy function sees ``x + x`` of a subnormal ``x`` as 0 under JAX, and so it
does under spmdsim). It sets MXCSR's FTZ and DAZ bits on x86-64 Linux (glibc's ``fenv_t``: the x87 environment,
28 bytes, then MXCSR); elsewhere the callback runs in the thread's environment (a documented difference).
"""
from __future__ import annotations

import ctypes
import platform
import sys

__all__ = ["flushes", "reset", "default", "like_xla"]

_SMALLEST = 5e-324  # the smallest positive subnormal double
_ONE = 1.0
_FE_DFL_ENV = ctypes.c_void_p(-1)  # glibc's and musl's FE_DFL_ENV: ((const fenv_t *) -1)
_FENV_BYTES = 64  # fenv_t is 32 bytes on x86-64, 8 on aarch64: room for either
_MXCSR_AT = 28  # glibc's x86-64 fenv_t: the x87 environment, then MXCSR
_FTZ_DAZ = 0x8040  # MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6)
_X86_64_LINUX = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def _libc():
    if not sys.platform.startswith("linux"):  # FE_DFL_ENV is -1 in glibc and musl only (macOS: a real pointer)
        return None
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


class _Switch:
    """A block in another environment: ``__enter__`` saves the thread's own (:meth:`_save`) where it switches,
    ``__exit__`` restores it, also when the block raises."""

    __slots__ = ("saved",)

    def _save(self):
        self.saved = ctypes.create_string_buffer(_FENV_BYTES)
        _FUNCTIONS[0](self.saved)
        return self.saved

    def __exit__(self, *exc):
        if self.saved is not None:
            _FUNCTIONS[1](self.saved)
        return False


class default(_Switch):
    """``with default():`` runs the block in the default floating-point environment and gives the thread its
    own environment back after it."""

    __slots__ = ()

    def __enter__(self):
        self.saved = None
        if _FUNCTIONS is not None and flushes():
            self._save()
            _FUNCTIONS[1](_FE_DFL_ENV)
        return self


class like_xla(_Switch):
    """``with like_xla():`` runs the block with subnormals flushed, as XLA:CPU calls a host callback (MXCSR's FTZ
    and DAZ set; x86-64 Linux, elsewhere the thread's environment as it is), and gives the thread its own
    environment back after it."""

    __slots__ = ()

    def __enter__(self):
        self.saved = None
        if _FUNCTIONS is not None and _X86_64_LINUX and not flushes():
            flushing = ctypes.create_string_buffer(self._save().raw, _FENV_BYTES)
            mxcsr = int.from_bytes(flushing.raw[_MXCSR_AT:_MXCSR_AT + 4], "little") | _FTZ_DAZ
            flushing[_MXCSR_AT:_MXCSR_AT + 4] = mxcsr.to_bytes(4, "little")
            _FUNCTIONS[1](flushing)
        return self
