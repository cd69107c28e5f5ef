"""How JAX avals map to NumPy arrays. A value of an extended dtype is its physical form, as XLA holds it: the
value's shape followed by the shape of the dtype's ``physical_element_aval``, of that aval's dtype
(``dtype._rules``, JAX's ``core.physical_aval``). A PRNG key array is so its key data, a uint32 array with the
key's shape followed by its implementation's ``key_shape`` (``(2,)`` for threefry2x32, JAX's default; ``(4,)``
for rbg and unsafe_rbg; whatever a custom implementation declares); a user's extended dtype (lax_test's
``foo``) whatever its rules declare."""
from __future__ import annotations

import functools

import numpy as np
import jax

from spmdsim.jax.evaluation import _registry

@functools.lru_cache(maxsize=256)
def is_key(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


@functools.lru_cache(maxsize=256)
def is_extended(dtype) -> bool:
    """Whether ``dtype`` is one of JAX's extended dtypes (PRNG keys, a user's ``dtypes.ExtendedDType``)."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


@functools.lru_cache(maxsize=256)
def physical_element(dtype) -> tuple[tuple, np.dtype]:
    """The trailing shape and the dtype of one element of extended dtype ``dtype`` in physical form."""
    aval = dtype._rules.physical_element_aval(dtype)
    return tuple(int(d) for d in aval.shape), np.dtype(aval.dtype)


def key_data_shape(dtype) -> tuple:
    """The trailing shape of the key data of one key of PRNG key dtype ``dtype`` (its impl's ``key_shape``)."""
    return physical_element(dtype)[0]


def key_impl(dtype):
    """The ``PRNGImpl`` of PRNG key dtype ``dtype``."""
    return dtype._impl


def numpy_dtype(dtype) -> np.dtype:
    return physical_element(dtype)[1] if is_extended(dtype) else np.dtype(dtype)


def is_token(aval) -> bool:
    return not hasattr(aval, "dtype")


def numpy_shape_dtype(aval) -> tuple[tuple, np.dtype] | None:
    """The NumPy shape and dtype of a value of ``aval``; None for a token (an opaque value, not checked)."""
    if is_token(aval):
        return None
    if is_extended(aval.dtype):
        trailing, dtype = physical_element(aval.dtype)
        return tuple(aval.shape) + trailing, dtype
    return tuple(aval.shape), np.dtype(aval.dtype)


def key_data_shape_of(eqn) -> tuple | None:
    """The trailing physical shape of the extended-dtype values (PRNG keys' key data) among ``eqn``'s operands and
    results (one extended dtype per equation), or None when it has none."""
    for v in (*eqn.invars, *eqn.outvars):
        dtype = getattr(getattr(v, "aval", None), "dtype", None)
        if dtype is not None and is_extended(dtype):
            return physical_element(dtype)[0]
    return None


def equation_being_evaluated(name: str):
    """The equation of primitive ``name`` that an executor is evaluating on this thread (both executors, the
    reference loop and the compiled form, record the equation before calling its rule), or None (a rule called
    by hand, or by another rule for another equation). How a rule called without ``specialize`` learns what its
    operands do not say: the PRNG impl of a key, whether a uint32 array is key data."""
    stack = _registry.eqn_stack()
    eqn = stack[-1] if stack else None
    return eqn if eqn is not None and eqn.primitive.name == name else None
