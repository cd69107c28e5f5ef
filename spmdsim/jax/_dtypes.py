"""How JAX avals map to NumPy arrays: PRNG keys are uint32 arrays with a trailing axis of 2 (threefry)."""
from __future__ import annotations

import functools

import numpy as np
import jax

KEY_DATA_SHAPE = (2,)  # threefry2x32 key data


@functools.lru_cache(maxsize=256)
def is_key(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def numpy_dtype(dtype) -> np.dtype:
    return np.dtype(np.uint32) if is_key(dtype) else np.dtype(dtype)


def is_token(aval) -> bool:
    return not hasattr(aval, "dtype")


def numpy_shape_dtype(aval) -> tuple[tuple, np.dtype] | None:
    """The NumPy shape and dtype of a value of ``aval``; None for a token (an opaque value, not checked)."""
    if is_token(aval):
        return None
    if is_key(aval.dtype):
        return tuple(aval.shape) + KEY_DATA_SHAPE, np.dtype(np.uint32)
    return tuple(aval.shape), np.dtype(aval.dtype)
