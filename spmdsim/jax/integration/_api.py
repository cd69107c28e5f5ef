"""``spmdsim.jax.pmap``: ``jax.pmap`` on virtual devices, every value computed by NumPy from the jaxpr.

A call flattens the arguments with JAX's pytrees, checks them with the same rules as :func:`spmdsim.pmap`,
traces the per-device function once per signature into a body jaxpr (each mapped block squeezed, each output
expanded at its ``out_axes``, as JAX 0.10 builds pmap from shard_map), and then either runs the simulator at
once (concrete arguments) or binds :data:`spmdsim.jax.integration._map.spmdsim_map_p` (arguments that are JAX tracers:
under ``grad``, ``jit``, ``vmap``, control flow, or inside another map), whose rules carry every JAX
transformation through to the body.
"""
from __future__ import annotations

import functools
import linecache
import math
import os
import threading
from typing import Callable, Hashable, Sequence

import jax
import numpy as np
from spmdsim.jax._internals import api_util, core
from spmdsim.jax._internals import ArrayImpl
from spmdsim.jax._internals import IndivisibleError
from jax.extend import core as ext_core

from spmdsim.runtime import _hosts, _runtime

from spmdsim.frontend import _pmap

from spmdsim import errors
from spmdsim.runtime._axes import Unnamed, unbound_message
from spmdsim.runtime._values import check_array_dtype
from spmdsim.jax.integration._map import global_avals, map_params, simulate, spmdsim_map_p, threads_run, to_jax, to_numpy
from spmdsim.jax.integration._placement import map_out_shardings

__all__ = ["pmap"]


def _prefix_leaves(tree) -> list:
    """The leaves of an ``in_axes``/``out_axes`` tree under JAX's pytree registry (custom nodes included),
    ``None`` counted as a leaf."""
    return jax.tree_util.tree_leaves(tree, is_leaf=lambda x: x is None)


class MappedSizeError(errors.MappedSizeError, IndivisibleError):
    """``spmdsim.jax.pmap``'s error for mapped sizes that cannot be run (arguments whose mapped axes differ in
    size, more rows than virtual devices): :class:`spmdsim.errors.MappedSizeError`, its message naming the key
    paths, the sizes and the reshape to do, and JAX's ``IndivisibleError``, which ``jax.pmap`` raises there.
    Shown as the public class (a traceback reads ``spmdsim.errors.MappedSizeError: ...``, not this module's
    private path); it pickles as itself."""

    def __reduce__(self):
        return _mapped_size_error, self.args, self.__dict__ or None


MappedSizeError.__module__ = "spmdsim.errors"  # the public class's name (what the user catches)


def _mapped_size_error(*args) -> MappedSizeError:
    """Unpickles :class:`MappedSizeError` (whose name resolves to the public base class)."""
    return MappedSizeError(*args)


def _aval(leaf, path: str):
    """The abstract value a leaf is traced with (JAX's dtype canonicalisation, weak types for Python
    scalars); TypeError naming the argument for what is not an array (:class:`~spmdsim.errors.NotAnArrayError`,
    also a ValueError, as ``jax.pmap`` raises when no mapped argument is an array)."""
    try:
        aval = core.shaped_abstractify(leaf)
    except TypeError:
        if isinstance(getattr(leaf, "dtype", None), np.dtype):  # strings, objects, datetimes
            check_array_dtype(np.asarray(leaf), f"argument {path}", "pmap")
        raise errors.NotAnArrayError(f"pmap: argument {path} of type {type(leaf).__name__} is not an array; mapped "
                                     f"function arguments must be arrays or numbers. Pass non-array values with "
                                     f"static_broadcasted_argnums, or close over them.") from None
    # A block's type carries no sharding: inside the map each device holds a plain array, whatever mesh the
    # caller's array lives on (tracing with it would add resharding equations).
    return core.ShapedArray(aval.shape, aval.dtype, weak_type=aval.weak_type)


class _Body:
    """One traced per-device program: the body jaxpr (closed-over values as its leading inputs), those
    values, the output tree and the specs of inputs and outputs."""

    def __init__(self, closed, consts, out_tree, in_specs, out_specs):
        self.jaxpr, self.consts, self.out_tree = closed, consts, out_tree
        self.in_specs, self.out_specs = in_specs, out_specs
        self.cacheable = not any(isinstance(c, core.Tracer) for c in consts)


def _trace_body(fun, statics, in_tree, avals, in_axes, out_axes, name, n, axis_env) -> _Body:
    """Trace ``fun`` on one device's blocks (``n`` devices): mapped blocks keep a unit axis (squeezed inside),
    outputs get one (expanded inside, at their ``out_axes``)."""
    found = {}

    def body(*blocks):
        squeezed = [jax.lax.squeeze(b, (ax,)) if ax is not None else b for b, ax in zip(blocks, in_axes, strict=True)]
        dyn, kw = jax.tree_util.tree_unflatten(in_tree, squeezed)
        out = with_axis_errors(fun)(*_pmap.merge_static(statics, dyn), **kw)
        leaves, out_tree = jax.tree_util.tree_flatten(out)
        flat_out_axes = api_util.flatten_axes("pmap out_axes", out_tree, out_axes)
        found["tree"], found["axes"] = out_tree, flat_out_axes
        outs = []
        for k, (leaf, ax) in enumerate(zip(leaves, flat_out_axes, strict=True)):
            core.typeof(leaf)  # TypeError, as in jax.pmap, for what is not a JAX type
            leaf = jax.numpy.asarray(leaf)
            if ax is not None:
                if not -(leaf.ndim + 1) <= ax <= leaf.ndim:
                    raise ValueError(f"pmap: out_axes={ax} for output leaf {k} is out of bounds: per-device values "
                                     f"have rank {leaf.ndim}, so the mapped axis can go at "
                                     f"{-(leaf.ndim + 1)}..{leaf.ndim}.")
                leaf = jax.lax.expand_dims(leaf, (ax % (leaf.ndim + 1),))
            outs.append(leaf)
        return outs

    block_avals = [a.update(shape=a.shape[:ax] + (1,) + a.shape[ax + 1:]) if ax is not None else a
                   for a, ax in zip(avals, in_axes, strict=True)]
    _tracing.stack.append(n)
    try:
        closed = jax.make_jaxpr(body, axis_env=axis_env)(*block_avals)
    finally:
        _tracing.stack.pop()
    with core.extend_axis_env_nd(axis_env):  # JAX checks the body here (jax_enable_checks): its axes bound
        inner = _convert_constvars(closed.jaxpr)
        try:  # the body's debug info names the user's function (a trace names each device's call after it)
            inner = inner.replace(debug_info=inner.debug_info._replace(func_src_info=api_util.fun_sourceinfo(fun)))
        except (AttributeError, TypeError, ValueError):
            pass
        jaxpr = ext_core.ClosedJaxpr(inner, ())
    in_specs = [tuple((name,) if d == ax else () for d in range(len(a.shape)))
                for a, ax in zip(avals, in_axes, strict=True)]
    const_specs = [((),) * len(v.aval.shape) for v in closed.jaxpr.constvars]  # closed-over: replicated
    out_specs = [tuple((name,) if d == (ax % len(a.shape)) else () for d in range(len(a.shape))) if ax is not None
                 else ((),) * len(a.shape) for a, ax in zip(closed.out_avals, found["axes"], strict=True)]
    return _Body(jaxpr, list(closed.consts), found["tree"], (*const_specs, *in_specs), tuple(out_specs))


def with_axis_errors(fun: Callable) -> Callable:
    """``fun``, a map's body that JAX traces, raising :class:`~spmdsim.errors.UnboundAxisError` (a NameError and an
    AssertionError) with the NumPy front end's message ("did you mean 'batch'?", and the line of the call) where
    a collective over an axis name no enclosing map binds makes JAX raise its NameError ("please call psum under
    `jax.shard_map`") or, under shard_map with ``check_vma=True``, a bare AssertionError. The bound names are
    those of JAX's axis environment while the body is traced; the collective, its ``axis_name`` and the user's
    line come from the traceback."""
    @functools.wraps(fun)
    def body(*args, **kwargs):
        try:
            return fun(*args, **kwargs)
        except (NameError, AssertionError) as e:
            if isinstance(e, errors.UnboundAxisError):
                raise  # a map inside this body already said it
            found = _unbound_axis_error(e, list(core.get_axis_env().axis_sizes))
            if found is None:
                raise
            raise found.with_traceback(e.__traceback__.tb_next) from None
    return body


_JAX_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, __import__("jaxlib")))
_NOT_USER_DIRS = (*_JAX_DIRS, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep)  # and spmdsim's


def _unbound_axis_error(error: Exception, bound: list) -> "errors.UnboundAxisError | None":
    """The UnboundAxisError for JAX's ``error`` (raised while tracing a body whose bound axis names are ``bound``),
    or None when it is not about an unbound axis name: the innermost JAX function with an ``axis_name`` argument
    that user code called (``lax.pmean``) names the axes and, with its caller, the line."""
    if isinstance(error, AssertionError) and str(error):
        return None  # JAX's unbound-axis assertion is a bare one
    if isinstance(error, NameError) and "unbound axis name" not in str(error):
        return None
    call = caller = None
    tb, previous = error.__traceback__, None
    while tb is not None:
        frame = tb.tb_frame
        in_jax = frame.f_code.co_filename.startswith(_JAX_DIRS)
        if in_jax and previous is not None and "axis_name" in frame.f_locals \
                and not previous.tb_frame.f_code.co_filename.startswith(_NOT_USER_DIRS):
            call, caller = frame, previous
        previous, tb = tb, tb.tb_next
    if call is None:
        return None
    axis_name = call.f_locals["axis_name"]
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    unbound = [n for n in names if not isinstance(n, int) and n not in bound]
    if isinstance(error, NameError):  # JAX names the one it met
        unbound = [n for n in unbound if f"axis name: {n}" in str(error)] or unbound
    if not unbound:
        return None
    code = caller.tb_frame.f_code
    line = linecache.getline(code.co_filename, caller.tb_lineno).strip()
    line = line if len(line) <= 80 else line[:77] + "..."
    where = f" at {os.path.basename(code.co_filename)}:{caller.tb_lineno} (in {code.co_name}: {line})"
    text = unbound_message(unbound[0], bound, call.f_code.co_name, where)
    from spmdsim.jax._internals import mesh_lib
    mesh = mesh_lib.get_abstract_mesh()
    if not mesh.empty and unbound[0] in mesh.axis_names:
        manual = ", ".join(map(repr, mesh.manual_axes)) or "none"
        text += (f" {unbound[0]!r} is an axis of the mesh, but not a manual axis of this shard_map (manual: "
                 f"{manual}): add it to axis_names to use it in collectives.")
    return errors.UnboundAxisError(text)


class _Tracing(threading.local):
    """The device counts of the maps whose bodies this thread is tracing (a pmap inside another pmap's body
    is traced while the outer one is: its devices are per block of the outer ones)."""

    def __init__(self):
        self.stack: list[int] = []


_tracing = _Tracing()


def _convert_constvars(jaxpr):
    from spmdsim.jax._internals import pe
    return pe.convert_constvars_jaxpr(jaxpr)


def pmap(fun: Callable, axis_name: Hashable | None = None, *, in_axes=0, out_axes=0,
         static_broadcasted_argnums: int | Sequence[int] = (), devices: Sequence | None = None,
         backend: str | None = None, axis_size: int | None = None, donate_argnums: int | Sequence[int] = (),
         check_replicated: bool = False, executor: str = "threads"):
    """``jax.pmap`` on spmdsim's virtual devices, with every value computed by NumPy from the jaxpr.

    Same signature and argument rules as ``jax.pmap`` (and :func:`spmdsim.pmap`); ``fun`` is an ordinary JAX
    function (``jax.numpy``, ``jax.lax`` collectives, ``jax.grad``, ``jax.random``, ``jax.tree_util``).
    ``in_axes``/``out_axes`` may be any pytree prefix JAX accepts, custom pytree nodes included. The mapped
    function composes with every JAX transformation: ``grad``/``vjp``/``jvp``/``linearize``/``hessian`` of
    it, ``vmap`` over it, ``jit`` of it, ``cond``/``scan``/``fori_loop``/``checkpoint`` around it, and
    another ``spmdsim.jax.pmap`` around it (see :mod:`spmdsim.jax.integration._map`) — the values are always computed
    by spmdsim, never by XLA.

    Args:
      fun: the per-device function, an ordinary JAX function.
      axis_name: the name collectives use for the mapped axis.
      in_axes: as ``jax.pmap``: an int, None, or a pytree prefix of the positional arguments.
      out_axes: as ``jax.pmap``: an int, None, or a pytree prefix of the output.
      static_broadcasted_argnums: positional arguments passed unchanged to every device (hashable).
      devices: only their number matters to the simulation (the first N are used); JAX devices also say where
        the outputs go, as in ``jax.pmap``.
      backend: accepted for compatibility; no effect.
      axis_size: checked against the mapped size.
      donate_argnums: accepted for compatibility; no effect.
      check_replicated: spmdsim only. With ``out_axes=None``, check that every device returned the same value
        and raise :class:`~spmdsim.errors.ReplicationError` naming the ones that differ (eager calls).
      executor: spmdsim only. ``"threads"`` (the default and the reference semantics: one thread per device),
        ``"vectorized"`` (each equation once over all devices' blocks stacked on a leading axis, in the
        caller's thread: for thousands of devices) or ``"reference"`` (threads, each jaxpr evaluated by the
        plain reference loop instead of its compiled form).

    Returns:
      A function returning ``jax.Array`` leaves in ``fun``'s output tree, stacked along ``out_axes``: shape
      ``(N, *block_shape)`` for ``out_axes=0``; dtypes and weak types as JAX computes them (inputs
      canonicalised: float64 -> float32 while x64 is off). Placed as ``jax.pmap`` places them when JAX has
      the devices: committed, ``NamedSharding(Mesh(devices[:N], (axis_name,)), spec)`` (the axis named
      ``'_internal_pmap_axis_name'`` without ``axis_name``; the spec splits the ``out_axes`` dimension, or
      ``P()``), one block per device; in a multi-host run this host's devices. Otherwise (more devices than
      JAX's platform has, a pmap inside a mapped body) as ``jnp.asarray`` places them.

    Raises:
      ValueError: what ``jax.pmap`` raises for the same arguments, with the differences of
        :func:`spmdsim.pmap` (mapped-size errors name the key paths and sizes).
      TypeError: non-array arguments and non-int ``in_axes``/``out_axes`` leaves, as ``jax.pmap``.
      CollectiveMismatchError: devices' collectives that differ (a ``cond`` branch only some devices take).
      CollectiveDeadlockError: a collective some device never reaches.

    Any exception a device raises is raised too (the first in device order, the others in
    ``exc.device_errors``).

    Differences from ``jax.pmap``: as :func:`spmdsim.pmap` (negative axes count from the end,
    ``check_replicated``), and nested ``pmap`` works (JAX 0.10 rejects it) with ``pmap(vmap)`` semantics.
    """
    static = _pmap.check_pmap_arguments(axis_name, in_axes, out_axes, static_broadcasted_argnums, devices,
                                        prefix_leaves=_prefix_leaves)
    map_params(None, (), (), (), check_vma=False, executor=executor, api="pmap")  # checks ``executor``
    name = axis_name if axis_name is not None else Unnamed("pmap")
    jax_devices = tuple(devices) if devices is not None and all(isinstance(d, jax.Device) for d in devices) \
        else None
    cache: dict = {}
    calls: dict = {}  # call signature (see _call_key) -> its _Call, for concrete calls seen before
    lock = threading.Lock()

    def checked(statics: dict, dyn_args: tuple, dyn_in_axes, kwargs: dict, leaves: list, in_tree, lane):
        """The full path of a call: its checks and its traced body (once per signature); returns ``(mapped size
        here, mapped size in all, body, the primitive's parameters)``."""
        try:
            flat_in_axes = api_util.flatten_axes("pmap in_axes", in_tree, (dyn_in_axes, 0), kws=True)
        except ValueError:
            raise ValueError(_in_axes_error(dyn_in_axes, dyn_args, kwargs)) from None
        paths = _pmap.LazyPaths((dyn_args, kwargs), len(leaves), _pmap.argument_path, _keystrs)
        avals = [_aval(leaf, paths[k]) for k, leaf in enumerate(leaves)]
        flat_in_axes = [None if ax is None else _pmap.canonical_in_axis(ax, a.shape, p, "pmap")
                        for a, ax, p in zip(avals, flat_in_axes, paths, strict=True)]
        n = local = _pmap.mapped_size(paths, [a.shape for a in avals], flat_in_axes, "pmap", axis_size,
                                      size_error=MappedSizeError)
        _pmap.check_device_count(n, devices, outer=math.prod(_tracing.stack), size_error=MappedSizeError)
        if not _tracing.stack:  # a top-level pmap of a multi-host run spans every host's devices
            n = _pmap.multi_host_size(n)[1]
        outer = [(f.name, f.size) for f in (lane.frames if lane is not None else ())
                 if not isinstance(f.name, Unnamed)]
        axis_env = outer + ([(name, n)] if not isinstance(name, Unnamed) else [])
        key = (in_tree, tuple(avals), tuple(flat_in_axes), tuple(sorted(statics.items())), tuple(axis_env))
        eager = jax.config.jax_disable_jit  # JAX runs the body's Python at every call: no trace kept or reused
        with lock:
            body = None if eager else cache.get(key)
        if body is None:
            body = _trace_body(fun, statics, in_tree, avals, flat_in_axes, out_axes, name, n, axis_env)
            if body.cacheable and not eager:
                with lock:
                    cache[key] = body
        params = map_params(body.jaxpr, ((name, n),), body.in_specs, body.out_specs, check_vma=False,
                            executor=executor, api="pmap")
        if jax_devices is not None:  # where the outputs go (JAX's mesh of these devices)
            params["devices"] = jax_devices
        return local, n, body, params

    @_runtime.api_boundary
    @functools.wraps(fun)
    def mapped(*args, **kwargs):
        statics, dyn_args, dyn_in_axes = _pmap.split_static(fun, args, in_axes, static)
        leaves, in_tree = jax.tree_util.tree_flatten((dyn_args, kwargs))
        lane = _runtime.current_lane()
        call_key = _call_key(leaves, in_tree, statics, lane) if not (_tracing.stack or jax.config.jax_disable_jit) \
            else None
        call = calls.get(call_key) if call_key is not None else None
        if call is not None:  # checked and traced before: only the device count can differ
            _pmap.check_device_count(call.local, devices, size_error=MappedSizeError)
            if _pmap.multi_host_size(call.local)[1] != call.n:
                call = None
        if call is None:
            local, n, body, params = checked(statics, dyn_args, dyn_in_axes, kwargs, leaves, in_tree, lane)
            operands = [*body.consts, *leaves]
            if any(isinstance(x, core.Tracer) for x in operands):
                return jax.tree_util.tree_unflatten(body.out_tree, spmdsim_map_p.bind(*operands, **params))
            run = None if params["executor"] == "vectorized" else threads_run(
                params["jaxpr"], params["in_specs"], params["out_specs"], params["axes"], params["axes"],
                params["executor"], "pmap")
            call = _Call(local, n, body, params, global_avals(params), run,
                         map_out_shardings(params) if _hosts.current() is None else None)
            if call_key is not None and body.cacheable:
                with lock:
                    if len(calls) > 256:
                        calls.clear()
                    calls[call_key] = call
        args = [*call.consts, *map(to_numpy, leaves)]
        host = _hosts.current()
        if call.run is not None and host is None:  # no multi-host run: the mesh is this host's own
            numpy_outs = call.run(args, check_replicated)
        else:
            numpy_outs = simulate(args, **call.params, check_replicated=check_replicated)
        _check_debug_values(numpy_outs)
        shardings = call.shardings if host is None else None
        if shardings is None:  # a multi-host run: this host's devices
            shardings = map_out_shardings(call.params)
        outs = [to_jax(o, a, s) for o, a, s in zip(numpy_outs, call.out_avals, shardings, strict=True)]
        return jax.tree_util.tree_unflatten(call.body.out_tree, outs)

    mapped._spmdsim_cache = cache  # for tests and the benchmarks: how many traces were made
    return mapped


def _check_debug_values(outs) -> None:
    """``jax_debug_nans`` / ``jax_debug_infs``: JAX checks a pmap's outputs and raises FloatingPointError
    ("Invalid value (nan) encountered in sharded computation."); so does spmdsim, on the same outputs."""
    for flag, found, what in (("jax_debug_nans", np.isnan, "nan"), ("jax_debug_infs", np.isinf, "inf")):
        if getattr(jax.config, flag) and any(jax.dtypes.issubdtype(np.asarray(o).dtype, np.inexact)
                                             and bool(found(o).any()) for o in outs):
            raise FloatingPointError(f"Invalid value ({what}) encountered in sharded computation.")


class _Call:
    """What a concrete call worked out from its arguments' signature: the mapped size here (``local``) and in
    all (``n``, every host's devices), the traced body, the primitive's parameters, the output avals, the
    closed-over values as NumPy arrays, the thread executor's run of the map outside a multi-host run
    (``run``; None for the vectorized executor) and where JAX puts the outputs outside a multi-host run
    (``shardings``, see :func:`spmdsim.jax.integration._placement.map_out_shardings`; None when made in one)."""

    __slots__ = ("local", "n", "body", "params", "out_avals", "consts", "run", "shardings")

    def __init__(self, local: int, n: int, body: "_Body", params: dict, out_avals: list, run, shardings):
        self.local, self.n, self.body, self.params, self.out_avals, self.run = local, n, body, params, out_avals, run
        self.shardings = shardings
        self.consts = [to_numpy(c) for c in body.consts]  # a body cached with its constants has concrete ones


_ARRAY_TYPES = (np.ndarray, ArrayImpl)


def _call_key(leaves: list, in_tree, statics: dict, lane) -> tuple | None:
    """What a call's checks and trace depend on, when every argument leaf is a NumPy or JAX array (None
    otherwise: Python scalars, tracers, other types take the full path every time): the tree, each leaf's
    type, shape, dtype and weak type, the static arguments, the enclosing maps' axes and the x64 flag."""
    sig = []
    for leaf in leaves:
        kind = type(leaf)
        if kind not in _ARRAY_TYPES:
            return None
        sig.append((kind, leaf.shape, leaf.dtype, kind is not np.ndarray and leaf.weak_type))
    try:
        return (in_tree, tuple(sig), tuple(sorted(statics.items())), jax.config.jax_enable_x64,
                tuple((f.name, f.size) for f in lane.frames) if lane is not None else ())
    except TypeError:  # statics whose values do not sort
        return None


def _in_axes_error(in_axes, args: tuple, kwargs: dict) -> str:
    """JAX's message for an ``in_axes`` that is not a tree prefix of the positional arguments: the key path
    (``pmap in_axes[0][0]``) where the trees differ, what the comparison is, and the keyword-argument rule."""
    from spmdsim.jax._internals import prefix_errors
    first, *_ = prefix_errors((in_axes, 0), (args, kwargs))
    text = first("pmap in_axes").args[0]
    text += ("\n\nThe 'full pytree' here is the tuple of arguments passed positionally to the pmapped function, "
             "and the value of `in_axes` must be a tree prefix of that tuple. But it was not a prefix.")
    if kwargs:
        text += ("\n\nWhen some arguments are passed by keyword to the pmapped function, they are not included in "
                 "the comparison to `in_axes`. Instead, each argument passed by keyword is mapped over its leading "
                 "axis.")
    return text + ("\n\nCheck that the value of the `in_axes` argument to `pmap` is a tree prefix of the tuple of "
                   "arguments passed positionally to the pmapped function, e.g. in_axes=(0, None) for f(x, params).")


def _keystrs(tree) -> list[str]:
    """``jax.tree_util.keystr`` of every leaf's key path (JAX's registry, custom nodes included)."""
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
