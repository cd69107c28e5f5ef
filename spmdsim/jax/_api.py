"""``spmdsim.jax.pmap``: run an unmodified JAX function on virtual devices, computing every value with NumPy.

The per-device function is traced once per (argument structure, block shapes and dtypes, static
arguments, axis sizes) with ``jax.make_jaxpr(..., axis_env=...)``; the jaxpr is then evaluated by
:func:`spmdsim.jax.eval_jaxpr` once per virtual device, each in its own thread, through the same runtime
(rendezvous, error reports) and collective rules as the NumPy front end.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Hashable, Sequence

import jax
import numpy as np
from jax._src import api_util

from spmdsim import _pmap, _runtime
from spmdsim.jax._dtypes import is_key
from spmdsim.jax._interpreter import eval_jaxpr
from spmdsim.jax._vectorized import Devices, eval_jaxpr_batched

__all__ = ["pmap"]


def _to_numpy(leaf) -> tuple[np.ndarray, Any]:
    """A leaf as the NumPy array the devices see, and the dtype JAX traces it with (a key dtype for keys).
    dtypes are canonicalised as JAX does on input (float64 -> float32 while x64 is off)."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and is_key(dtype):
        return np.asarray(jax.random.key_data(leaf)), dtype
    arr = np.asarray(leaf)
    if arr.dtype.kind in "OUS":
        return arr, None
    canonical = jax.dtypes.canonicalize_dtype(arr.dtype)
    return (arr if arr.dtype == canonical else arr.astype(canonical)), canonical


def _block_aval(shape: tuple, dtype, ax: int | None, weak: bool) -> jax.ShapeDtypeStruct:
    """What one device's block of an argument of ``shape`` (mapped along ``ax``) looks like to the tracer."""
    shape = shape[:-1] if is_key(dtype) else shape
    if ax is not None:
        shape = shape[:ax % len(shape)] + shape[ax % len(shape) + 1:]
    return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak)


def _to_jax(arr: np.ndarray) -> jax.Array:
    """A result as the ``jax.Array`` that ``jnp.asarray(arr)`` gives (a copy on JAX's default device,
    uncommitted), through the batched device put that ``jnp.asarray`` ends in: ~4 instead of ~17 µs per
    array. The first call, dtypes JAX would convert, and everything after a failure of that internal entry
    point (another JAX version) go through ``jnp.asarray`` itself."""
    global _fast_put
    if _fast_put not in (None, ...) and arr.dtype == jax.dtypes.canonicalize_dtype(arr.dtype):
        try:
            return _fast_put(arr)
        except Exception:  # noqa: BLE001 - an internal API: use the public one from now on
            _fast_put = None
    out = jax.numpy.asarray(arr)
    if _fast_put is ...:
        _fast_put = _fast_put_like(out)
    return out


def _fast_put_like(template: jax.Array):
    """A device put to where ``template`` lives (JAX's default device), or None."""
    try:
        from jax._src import core
        from jax._src.lib import xla_client
        sharding = template.sharding
        devices = [next(iter(sharding.device_set))]
    except Exception:  # noqa: BLE001
        return None
    avals: dict = {}

    def put(arr):
        aval = avals.get((arr.shape, arr.dtype))
        if aval is None:
            if len(avals) > 1024:
                avals.clear()
            aval = avals[(arr.shape, arr.dtype)] = core.ShapedArray(arr.shape, arr.dtype)
        return xla_client.batched_device_put(aval, sharding, [arr], devices, False)
    return put


_fast_put = ...  # not yet known: made from the first jnp.asarray result


class _Traced:
    """One traced per-device program: the jaxpr, its constants as NumPy arrays, the output tree and
    ``out_axes`` per output leaf."""

    def __init__(self, closed, out_tree):
        self.jaxpr = closed.jaxpr
        self.consts = [np.asarray(c) for c in closed.consts]
        self.out_avals = closed.out_avals
        self.out_tree = out_tree
        self.out_axes: list = []

    def __call__(self, *blocks):
        return eval_jaxpr(self.jaxpr, self.consts, *blocks)

    def run_vectorized(self, inputs, n: int, name) -> "_pmap.Stacked":
        """All devices at once (the vectorized executor); the outputs keep the device axis first."""
        return _pmap.Stacked(eval_jaxpr_batched(self.jaxpr, self.consts, inputs.stacked(n),
                                                Devices(name, n, np.arange(n))))


def pmap(fun: Callable, axis_name: Hashable | None = None, *, in_axes=0, out_axes=0,
         static_broadcasted_argnums: int | Sequence[int] = (), devices: Sequence | None = None,
         backend: str | None = None, axis_size: int | None = None, donate_argnums: int | Sequence[int] = (),
         check_replicated: bool = False, executor: str = "threads"):
    """``jax.pmap`` on spmdsim's virtual devices, with every value computed by NumPy from the jaxpr.

    Same signature and argument rules as :func:`spmdsim.pmap` (and ``jax.pmap``); ``fun`` is an ordinary JAX
    function (``jax.numpy``, ``jax.lax`` collectives, ``jax.grad``, ``jax.random``, ``jax.tree_util``).
    Inputs are converted to NumPy with JAX's dtype canonicalisation; outputs are returned as ``jax.Array``
    leaves (values computed by NumPy) so JAX code keeps working on them.

    ``executor`` (spmdsim only): ``"threads"`` (the default and the reference: one thread per device) or
    ``"vectorized"`` (each equation once over all devices' blocks stacked on a leading axis, in the caller's
    thread; for thousands of devices; one named axis; see :mod:`spmdsim.jax._vectorized`).

    The trace is cached per argument structure, block shapes and dtypes, static arguments and axis sizes.
    ``cond`` and ``while`` run on each device's concrete values, so devices may diverge; a collective reached
    by only some devices raises CollectiveDeadlockError / CollectiveMismatchError naming the jaxpr's source
    line. Differences from ``jax.pmap``: as for :func:`spmdsim.pmap` (negative axes count from the end,
    ``check_replicated``); nested ``spmdsim.jax.pmap`` is not supported (JAX 0.10 rejects nested pmap too):
    use ``jax.vmap(..., axis_name=...)`` inside for a second named axis.
    """
    static = _pmap.check_pmap_arguments(axis_name, in_axes, out_axes, static_broadcasted_argnums, devices)
    if executor not in ("threads", "vectorized"):
        raise ValueError(f"executor must be 'threads' or 'vectorized', got {executor!r}.")
    name = axis_name if axis_name is not None else _runtime.Unnamed("pmap")
    cache: dict = {}
    axes_cache: dict = {}  # (in_tree, in_axes) -> in_axes per leaf
    lock = threading.Lock()

    @functools.wraps(fun)
    def mapped(*args, **kwargs):
        statics, dyn_args, dyn_in_axes = _pmap.split_static(fun, args, in_axes, static)
        leaves, in_tree = jax.tree_util.tree_flatten((dyn_args, kwargs))
        axes_key = (in_tree, dyn_in_axes)
        try:
            flat_in_axes = axes_cache.get(axes_key)
        except TypeError:  # in_axes holding lists or dicts: not hashable, flattened every call
            axes_key = flat_in_axes = None
        if flat_in_axes is None:
            flat_in_axes = api_util.flatten_axes("pmap in_axes", in_tree, (dyn_in_axes, 0), kws=True)
            if axes_key is not None:
                axes_cache[axes_key] = flat_in_axes
        converted = [_to_numpy(leaf) for leaf in leaves]
        arrays = [a for a, _ in converted]
        mapped_axes = [(a, ax) for a, ax in zip(arrays, flat_in_axes) if ax is not None]
        if not mapped_axes or any(not -a.ndim <= ax < a.ndim for a, ax in mapped_axes) \
                or any(dt is None for _, dt in converted):
            # The shared engine raises the error (no mapped argument, a scalar with an axis, a non-array).
            _pmap._mapped_call(lambda *b: b, tuple(arrays), {}, api="pmap", axis_name=name,
                               in_axes=tuple(flat_in_axes), out_axes=0, axis_size=axis_size, devices=devices,
                               hint=_pmap.PMAP_HINT)
            raise AssertionError("spmdsim bug: these arguments should have been rejected")
        first, ax = mapped_axes[0]
        n = first.shape[ax]
        lane = _runtime.current_lane()
        outer = [(f.name, f.size) for f in (lane.frames if lane is not None else ())
                 if not isinstance(f.name, _runtime.Unnamed)]
        axis_env = outer + ([(name, n)] if not isinstance(name, _runtime.Unnamed) else [])
        blocks = tuple((a.shape, dt, ax, isinstance(leaf, (bool, int, float, complex)))
                       for (a, dt), ax, leaf in zip(converted, flat_in_axes, leaves))
        key = (in_tree, blocks, tuple(sorted(statics.items())), tuple(axis_env))
        with lock:
            traced = cache.get(key)
            if traced is None:
                avals = tuple(_block_aval(shape, dt, ax, weak) for shape, dt, ax, weak in blocks)
                traced = _trace(fun, statics, in_tree, avals, axis_env)
                traced.out_axes = list(api_util.flatten_axes("pmap out_axes", traced.out_tree, out_axes))
                cache[key] = traced
        outs = _pmap._mapped_call(traced, tuple(arrays), {}, api="pmap", axis_name=name,
                                  in_axes=tuple(flat_in_axes), out_axes=traced.out_axes, axis_size=axis_size,
                                  devices=devices, check_replicated=check_replicated, hint=_pmap.PMAP_HINT,
                                  run=traced.run_vectorized if executor == "vectorized" else None)
        outs = [jax.random.wrap_key_data(o) if is_key(aval.dtype) else _to_jax(o)
                for o, aval in zip(outs, traced.out_avals)]
        return jax.tree_util.tree_unflatten(traced.out_tree, outs)

    mapped._spmdsim_cache = cache  # for tests and the benchmarks: how many traces were made
    return mapped


def _trace(fun, statics, in_tree, avals, axis_env) -> _Traced:
    out_tree_box = []

    def flat_fun(*blocks):
        dyn, kw = jax.tree_util.tree_unflatten(in_tree, blocks)
        out = fun(*_pmap.merge_static(statics, dyn), **kw)
        out_leaves, out_tree = jax.tree_util.tree_flatten(out)
        out_tree_box.append(out_tree)
        return out_leaves

    closed = jax.make_jaxpr(flat_fun, axis_env=axis_env)(*avals)
    return _Traced(closed, out_tree_box[0])
