"""Host callbacks inside a map: ``jax.pure_callback``, ``jax.experimental.io_callback`` (ordered or not) and
``jax.debug.callback``, run per device on concrete values.

What JAX 0.10.2 does, and so what these rules do:

- Inside ``pmap``/``shard_map`` (all mesh axes manual) the callback runs **once per device, with that device's
  block**: its operands arrive as ``jax.Array``s on JAX's first CPU device (a PRNG key as its uint32 key data),
  and the callback runs under ``jax.default_device`` of that device, with subnormals flushed to zero as XLA:CPU
  runs it (x86's FTZ and DAZ: NumPy's ``v + v`` of a subnormal float32 or float64 is 0 there;
  :class:`spmdsim.runtime._fpenv.like_xla`, x86-64 Linux).
- Its results are checked against the declared ``result_shape_dtypes`` after JAX's canonicalisation
  (``np.asarray``, then float64/int64 narrowed while x64 is off: a Python float is a valid float32 result).
  A wrong number of results, shape or dtype is a ``jax.errors.JaxRuntimeError`` in JAX; here too, with JAX's
  sentence, the primitive and the user's line in its message and the device in a note (as for every error a
  device raises). An exception the callback raises propagates as itself (JAX wraps it in a JaxRuntimeError).
- An ordered ``io_callback`` runs in program order on each device. Nothing orders callbacks *across*
  devices (XLA runs the devices concurrently): in the thread executor they interleave as the device threads do;
  the vectorized executor calls them equation by equation, in device order.
- ``vmap`` (inside the map, or around it) is resolved by JAX when it traces: ``pure_callback``'s
  ``vmap_method`` turns the equation into a ``scan`` of per-element calls (``sequential``,
  ``sequential_unrolled``) or one call on the batched operands (``expand_dims``, ``broadcast_all``,
  ``legacy_vectorized``); an unordered ``io_callback`` becomes a ``lax.map`` of calls; an ordered one is a
  ValueError. The jaxpr spmdsim evaluates already says which, so both executors just call the callback.
- The vectorized executor's stacked device axis is *not* a ``vmap`` axis: real JAX calls a callback in a map
  once per device, and so does the vectorized rule here (in device order, each device's error named), whatever
  the ``vmap_method``. The callback sees exactly the calls, shapes and values it sees under ``jax.pmap``.
- ``sharding=`` inside a map is JAX's NotImplementedError ("callbacks do not support specifying sharding
  inside spmd computations").

``debug_callback`` is per-device only (no vectorized rule: the vectorized executor's fallback runs it device by
device, see :data:`spmdsim.jax.evaluation._interpreter._PER_DEVICE_SIDE_EFFECTS`); ``pure_callback`` and ``io_callback``
have a vectorized rule that loops over the devices itself (``Batch.per_device``: every device called, the first
error in device order raised, naming its device, as the thread executor does).
"""
from __future__ import annotations

import functools

import jax
import numpy as np

from spmdsim.primitives import _batch

from spmdsim.runtime import _fpenv, _runtime
from spmdsim.jax.evaluation._interpreter import current_site
from spmdsim.jax.evaluation._registry import per_device, vectorized
from spmdsim.jax._internals import outside_mesh_context

__all__ = ["host_arguments", "check_results"]


@functools.cache
def _cpu_device():
    """JAX's first CPU device: where JAX places a callback's operands."""
    return jax.local_devices(backend="cpu")[0]


def host_arguments(operands) -> list:
    """The operands as the callback receives them in JAX: ``jax.Array``s on the first CPU device (a PRNG key as
    its key data, the physical value XLA hands the callback)."""
    cpu = _cpu_device()
    return [jax.device_put(np.asarray(x), cpu) for x in operands]


def _in_map() -> bool:
    """Whether a map's device is evaluating (a lane of the thread executor, or a vectorized batch)."""
    return _runtime.current_lane() is not None or _batch.current_batch() is not None


def check_results(name: str, outs, result_avals) -> list[np.ndarray]:
    """The callback's results ``outs`` (its flattened leaves) as NumPy arrays of the declared avals: JAX's
    checks (the number of results; each one's shape and dtype after ``np.asarray`` and dtype canonicalisation)
    and its error class, ``jax.errors.JaxRuntimeError``, naming the primitive and the user's line (the executors
    name the device, in a note, as for any error a device raises). Copies: a callback may reuse the buffer it
    returned."""
    outs = list(outs)
    if len(outs) != len(result_avals):
        _bad(name, f"Mismatched number of outputs from callback. Expected: {len(result_avals)}, "
                   f"Actual: {len(outs)}")
    checked = []
    for i, (out, aval) in enumerate(zip(outs, result_avals, strict=True)):
        arr = np.asarray(out)
        canonical = jax.dtypes.canonicalize_dtype(arr.dtype)
        if canonical != arr.dtype:
            arr = arr.astype(canonical)
        shape, dtype = tuple(aval.shape), np.dtype(aval.dtype)
        if arr.shape != shape:
            _bad(name, f"Incorrect output shape for return value #{i}: Expected: {shape}, Actual: {arr.shape}")
        if arr.dtype != dtype:
            _bad(name, f"Incorrect output dtype for return value #{i}: Expected: {dtype}, Actual: {arr.dtype}")
        checked.append(np.array(arr, copy=True))
    return checked


def _bad(name: str, what: str):
    raise jax.errors.JaxRuntimeError(
        f"INTERNAL: {name} called at {current_site()}: {what}. A callback must return values of the "
        f"result_shape_dtypes it declares (JAX raises this error when the callback returns).")


def _check_sharding(name: str, sharding) -> None:
    if sharding is not None and _in_map():
        raise NotImplementedError(f"callbacks do not support specifying sharding inside spmd computations "
                                  f"({name} called at {current_site()} with sharding={sharding}).")


def _invoke(name: str, callback, operands, result_avals) -> list[np.ndarray]:
    """One device's call: ``callback`` (JAX's flattened form of the user's function) on the device's
    ``operands``, its results checked."""
    args = host_arguments(operands)
    # XLA's callback thread has no mesh context, and flushes subnormals (see spmdsim.runtime._fpenv)
    with jax.default_device(_cpu_device()), outside_mesh_context(), _fpenv.like_xla():
        outs = callback(*args)
    return check_results(name, outs, result_avals)


# -- per device (the thread executor) -----------------------------------------------------------------------

@per_device("pure_callback")
def _pure_callback(*operands, callback, result_avals, sharding=None, vmap_method=None, **_):
    _check_sharding("pure_callback", sharding)
    return _invoke("pure_callback", callback, operands, result_avals)


@per_device("io_callback")
def _io_callback(*operands, callback, result_avals, sharding=None, ordered=False, **_):
    """Ordered or not: a device evaluates its equations in program order, so its ordered calls are in order."""
    _check_sharding("io_callback", sharding)
    return _invoke("io_callback", callback, operands, result_avals)


@per_device("debug_callback")
def _debug_callback(*operands, callback, **_):
    """``jax.debug.callback``: the user's function on the device's values (JAX's flattened form returns ())."""
    return _invoke("debug_callback", callback, operands, ())


# -- vectorized: still once per device, in device order ---------------------------------------------------

def _per_device_calls(name: str, stacked, callback, result_avals, sharding) -> list[np.ndarray]:
    _check_sharding(name, sharding)

    def call(k: int):
        return _invoke(name, callback, [x[k] for x in stacked], result_avals)

    batch = _batch.current_batch()
    if batch is not None:
        per_device = batch.per_device(call)
    else:  # called directly on stacked operands (no executor): one call per row
        per_device = [call(k) for k in range(len(stacked[0]) if stacked else 1)]
    return [np.stack([outs[j] for outs in per_device]) for j in range(len(result_avals))]


@vectorized("pure_callback")
def _pure_callback_v(*stacked, callback, result_avals, sharding=None, vmap_method=None, **_):
    return _per_device_calls("pure_callback", stacked, callback, result_avals, sharding)


@vectorized("io_callback")
def _io_callback_v(*stacked, callback, result_avals, sharding=None, ordered=False, **_):
    return _per_device_calls("io_callback", stacked, callback, result_avals, sharding)


# -- jax.debug.print and jax.debug.callback: run per device on concrete values -------------------------------
# What they print goes through spmdsim's ordered output: labelled with the device and released in device
# order at each rendezvous. They have no vectorized rule on purpose: a callback is a per-device side effect (a
# print per device, a user function called once per device with that device's values, in device order), which
# a stacked evaluation cannot reproduce; the vectorized executor reports them as unsupported.

@per_device("debug_print")
def _debug_print(*args, fmt, in_tree, static_args=(), np_printoptions=(), **_):
    import jax

    positional, keywords = jax.tree_util.tree_unflatten(in_tree, list(args))
    positional = list(positional)
    for index, value in static_args:
        positional.insert(index, value)
    with np.printoptions(**dict(np_printoptions)):
        print(fmt.format(*positional, **keywords))
    return []
