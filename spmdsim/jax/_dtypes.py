"""How JAX avals map to NumPy arrays: a PRNG key array is its key data, a uint32 array with the key's shape
followed by its implementation's ``key_shape`` (``(2,)`` for threefry2x32, JAX's default; ``(4,)`` for rbg and
unsafe_rbg; whatever a custom implementation declares)."""
from __future__ import annotations

import functools

import numpy as np
import jax

from spmdsim.jax import _registry

KEY_DATA_SHAPE = (2,)  # threefry2x32's key data (JAX's default implementation); others: key_data_shape(dtype)


@functools.lru_cache(maxsize=256)
def is_key(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


@functools.lru_cache(maxsize=256)
def key_data_shape(dtype) -> tuple:
    """The trailing shape of the key data of one key of PRNG key dtype ``dtype`` (its impl's ``key_shape``)."""
    return tuple(int(d) for d in dtype._impl.key_shape)


def key_impl(dtype):
    """The ``PRNGImpl`` of PRNG key dtype ``dtype``."""
    return dtype._impl


def numpy_dtype(dtype) -> np.dtype:
    return np.dtype(np.uint32) if is_key(dtype) else np.dtype(dtype)


def is_token(aval) -> bool:
    return not hasattr(aval, "dtype")


def numpy_shape_dtype(aval) -> tuple[tuple, np.dtype] | None:
    """The NumPy shape and dtype of a value of ``aval``; None for a token (an opaque value, not checked)."""
    if is_token(aval):
        return None
    if is_key(aval.dtype):
        return tuple(aval.shape) + key_data_shape(aval.dtype), np.dtype(np.uint32)
    return tuple(aval.shape), np.dtype(aval.dtype)


def key_data_shape_of(eqn) -> tuple | None:
    """The key data shape of the PRNG keys among ``eqn``'s operands and results (one impl per equation), or None
    when it has none."""
    for v in (*eqn.invars, *eqn.outvars):
        dtype = getattr(getattr(v, "aval", None), "dtype", None)
        if dtype is not None and is_key(dtype):
            return key_data_shape(dtype)
    return None


def equation_being_evaluated(name: str):
    """The equation of primitive ``name`` that an executor is evaluating on this thread (both executors, the
    reference loop and the compiled form, record the equation before calling its rule), or None (a rule called
    by hand, or by another rule for another equation). How a rule called without ``specialize`` learns what its
    operands do not say: the PRNG impl of a key, whether a uint32 array is key data."""
    stack = _registry.eqn_stack()
    eqn = stack[-1] if stack else None
    return eqn if eqn is not None and eqn.primitive.name == name else None
