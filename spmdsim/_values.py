"""What counts as a value in a NumPy program mapped by spmdsim: arrays, and Python scalars (weakly typed)."""
from __future__ import annotations

import functools
import operator

import numpy as np

__all__ = ["PYTHON_SCALAR_DTYPES", "is_python_scalar", "as_array", "check_array_dtype", "read_only",
           "error_state_switch", "broadcast_view", "shape_of", "dtype_of"]

# Python scalars are weakly typed in JAX: as outputs or operands they take JAX's default dtypes.
PYTHON_SCALAR_DTYPES = {bool: np.dtype(np.bool_), int: np.dtype(np.int32), float: np.dtype(np.float32),
                        complex: np.dtype(np.complex64)}

_NOT_NUMERIC = "OUSMm"  # object, str, bytes, datetime64, timedelta64: not JAX types (nor structured voids)


# ``shape_of(x)`` is ``x.shape``, ``dtype_of(x)`` is ``x.dtype``: for ``map`` over many arrays without a Python loop.
shape_of, dtype_of = operator.attrgetter("shape"), operator.attrgetter("dtype")


def is_python_scalar(leaf) -> bool:
    """A Python bool, int, float or complex: weakly typed in JAX (constants in collectives, broadcast as is)."""
    return type(leaf) in PYTHON_SCALAR_DTYPES


def check_array_dtype(arr: np.ndarray, what: str, api: str) -> np.ndarray:
    """``arr`` unchanged, or TypeError when its dtype is not one JAX has (strings, objects, datetimes)."""
    if arr.dtype.kind in _NOT_NUMERIC or arr.dtype.type is np.void:  # ml_dtypes (bfloat16...) are kind V too
        raise TypeError(f"{api}: {what} has dtype {arr.dtype}, which is not a valid JAX type (JAX arrays hold "
                        f"bool, integer, floating or complex numbers). Convert it to numbers first, or pass it with "
                        f"static_broadcasted_argnums / close over it.")
    return arr


def as_array(leaf, what: str, api: str) -> np.ndarray:
    """``leaf`` as a NumPy array with JAX's dtype for Python scalars; TypeError for non-numeric values."""
    if type(leaf) is np.ndarray:
        return check_array_dtype(leaf, what, api)
    if is_python_scalar(leaf):
        return np.asarray(leaf, dtype=PYTHON_SCALAR_DTYPES[type(leaf)])
    return check_array_dtype(np.asarray(leaf), what, api)


def read_only(x: np.ndarray) -> np.ndarray:
    """A read-only view of ``x`` (a device's blocks are views of the caller's arrays; views of it are read-only
    too)."""
    v = x.view()
    v.flags.writeable = False
    return v


def broadcast_view(x: np.ndarray, shape: tuple) -> np.ndarray:
    """``np.broadcast_to(x, shape)``: a read-only view, the broadcast axes with stride 0. Made directly for a
    C-contiguous, non-empty ``x`` of NumPy's own dtypes (~1 against ~3 µs); ``np.broadcast_to`` otherwise (and
    for its error when ``x`` does not broadcast to ``shape``)."""
    lead = len(shape) - x.ndim
    if lead < 0 or x.dtype.isbuiltin != 1 or not x.flags.c_contiguous or x.size == 0:
        return np.broadcast_to(x, shape)
    if x.ndim == 0:  # a scalar: every stride 0
        out = np.ndarray(shape, x.dtype, buffer=x, strides=(0,) * lead)
        out.flags.writeable = False
        return out
    strides = [0] * lead
    for size, have, stride in zip(shape[lead:], x.shape, x.strides):
        if have == size:
            strides.append(stride)
        elif have == 1:
            strides.append(0)
        else:
            return np.broadcast_to(x, shape)
    out = np.ndarray(shape, x.dtype, buffer=x, strides=strides)
    out.flags.writeable = False
    return out


def error_state_switch(**state: str):
    """``(enter, leave)`` for NumPy's floating-point error state ``state`` (``np.errstate``'s keywords) in the
    calling thread: ``token = enter()`` sets it, ``leave(token)`` puts back what was there. Made once, used on
    every collective and jaxpr: through NumPy 2's context variable with one prepared state (~0.1 µs against
    ~1.5 µs for a new ``np.errstate``); ``np.errstate`` itself if NumPy's internals differ. Unlike
    ``np.errstate``, the kinds ``state`` leaves out take NumPy's defaults, not the caller's settings: name
    every kind the computation can raise."""
    try:
        from numpy._core._multiarray_umath import _make_extobj
        from numpy._core._ufunc_config import _extobj_contextvar
        prepared = _make_extobj(**state)
        token = _extobj_contextvar.set(prepared)
        try:
            with np.errstate(**state):
                expected = np.geterr()
            if np.geterr() != expected:
                raise ImportError
        finally:
            _extobj_contextvar.reset(token)
        return functools.partial(_extobj_contextvar.set, prepared), _extobj_contextvar.reset
    except (ImportError, AttributeError, TypeError, ValueError):
        def enter():
            errstate = np.errstate(**state)
            errstate.__enter__()
            return errstate
        return enter, lambda errstate: errstate.__exit__(None, None, None)
