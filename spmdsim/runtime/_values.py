"""What counts as a value in a NumPy program mapped by spmdsim: arrays, and Python scalars (weakly typed)."""
from __future__ import annotations

import functools
import operator

import numpy as np

__all__ = ["PYTHON_SCALAR_DTYPES", "is_python_scalar", "as_array", "check_array_dtype", "read_only",
           "error_state_switch", "broadcast_view", "shape_of", "dtype_of", "explain_read_only"]

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


# NumPy's messages for a write into a read-only array: an assignment's, and a ufunc's (x += 1)
READ_ONLY = ("assignment destination is read-only", "output array is read-only")


def explain_read_only(error: ValueError, arguments: list, device: str) -> None:
    """Make NumPy's "assignment destination is read-only", raised in a mapped function, say what was written
    to and how to write the line instead (in the message itself: ``print(e)`` shows it). ``arguments``: the
    device's argument leaves; ``device``: what runs the function (``device``, or ``lane`` for vmap)."""
    if not isinstance(error, ValueError) or str(error) not in READ_ONLY:
        return
    try:
        name, obj, fix = _written(error.__traceback__)
    except Exception:  # noqa: BLE001 - the explanation is a nicety: the user's error stays as it is
        name = obj = fix = None
    if obj is not None and any(isinstance(a, np.ndarray) and np.shares_memory(obj, a) for a in arguments):
        why = (f"{name} is the {device}'s argument (or a view of it): a read-only view of the caller's array, as "
               f"JAX arrays are immutable")
    elif obj is not None:
        why = (f"{name} is not one of the {device}'s arguments: a collective's result (one array shared by the "
               f"devices of its group) or another read-only array; JAX arrays are immutable")
    else:
        why = (f"a {device}'s arguments (views of the caller's arrays) and collectives' results (shared by the "
               f"devices of a group) are read-only, as JAX arrays are immutable")
    error.args = (f"{error}: {why}. {fix or 'Write x = x + 1 instead of x += 1, or work on a copy: x = x.copy()'}.",)


def _written(tb) -> tuple[str | None, object, str | None]:
    """For the assignment on the line that raised (the innermost frame of ``tb``): the variable written into,
    its value there, and the line written so that it works (``x = x + 1`` for ``x += 1``; a copy first for
    ``x[0] = 2``); Nones when it cannot be told."""
    import ast
    import linecache

    if tb is None:
        return None, None, None
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    line = linecache.getline(frame.f_code.co_filename, tb.tb_lineno).strip()
    try:
        statement = ast.parse(line).body[0]
    except (SyntaxError, IndexError):
        return None, None, None
    targets = [statement.target] if isinstance(statement, ast.AugAssign) else \
        statement.targets if isinstance(statement, ast.Assign) else []
    for target in targets:
        base = target
        while isinstance(base, (ast.Subscript, ast.Attribute)):
            base = base.value
        if isinstance(base, ast.Name) and base.id in frame.f_locals:
            name = base.id
            if isinstance(statement, ast.AugAssign) and target is base:
                new = ast.unparse(ast.Assign([target], ast.BinOp(ast.Name(name), statement.op, statement.value),
                                             lineno=1))
                fix = f"Write {new} instead of {line}: a new array, as in JAX"
            else:
                fix = f"Copy it first, {name} = {name}.copy(), then {line}"
            return name, frame.f_locals[name], fix
    return None, None, None


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
