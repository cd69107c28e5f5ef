"""``jax.shard_map`` on virtual devices: JAX traces the program, spmdsim computes every value.

A call of ``spmdsim.jax.shard_map(f, ...)`` (or of ``jax.shard_map`` under ``spmdsim run``) lets JAX's own
``shard_map`` trace it, so every check JAX makes (specs, divisibility, varying-manual-axes types under
``check_vma=True``, Explicit mesh axes) and every choice of primitive (``psum_invariant``, ``pvary``,
``all_gather_invariant``) is JAX's. The traced program is then run by spmdsim:

- called outside any JAX transformation (an un-jitted shard_map), it runs eagerly, as JAX 0.10 runs it: the
  body's Python once per device, each in its own thread, on that device's values, every primitive computed by
  spmdsim as it is bound (:mod:`._eager`; ``print`` shows each device's block, Python control flow works on
  values that are the same on every device);
- with concrete arguments otherwise (a jitted program), the jaxpr is evaluated by spmdsim's interpreter on
  global NumPy values, and each ``shard_map`` equation in it runs per device (:func:`simulate_shard_map`), in threads by default; the
  outputs are placed on JAX's devices as JAX places them (:mod:`._placement`);
- with JAX tracers as arguments (under ``grad``, ``vmap``, ``jit``, ...), each ``shard_map`` equation is
  re-bound as the ``spmdsim_map`` primitive, whose transformation rules follow JAX's shard_map conventions
  (:mod:`spmdsim.jax.integration._map`), and everything else as itself.

:func:`jit` is what ``spmdsim run`` puts in place of ``jax.jit``: a jitted function whose program contains a
map is evaluated the same way (the parts outside the maps once, on global values, by NumPy); any other is
left to JAX.
"""
from __future__ import annotations

import functools
import inspect
import threading
import types

import jax
from spmdsim.jax._internals import core, source_info_util
from spmdsim.jax._internals import mesh_lib
from spmdsim.jax._internals import pe
from jax.extend import core as ext_core

from spmdsim.runtime import _hosts, _runtime

from spmdsim.jax.integration import _eager
from spmdsim.jax.integration._api import with_axis_errors
from spmdsim.jax.evaluation._interpreter import PER_DEVICE, Executor, eval_jaxpr, higher_order
from spmdsim.jax.evaluation import _jaxprs
from spmdsim.jax.integration._map import simulate, spmdsim_map_p, to_jax, to_numpy
from spmdsim.jax.integration._placement import program_shardings
from spmdsim.jax.integration._specs import shard_map_params

__all__ = ["shard_map", "jit", "simulated", "real_shard_map"]

real_shard_map = jax.shard_map
_INFER = inspect.signature(jax.shard_map).parameters["in_specs"].default  # JAX's "infer from the arguments"


@higher_order("shard_map")
def _shard_map(ex: Executor, *args, **params):
    """A ``shard_map`` equation met by spmdsim's interpreter (a jitted program, a map inside a map)."""
    return simulate(list(args), ex=None if ex is PER_DEVICE else ex, **shard_map_params(params, _executor.get()))


class _Executor(threading.local):
    """The executor (``threads``/``vectorized``) for shard_map equations evaluated in this thread."""

    def __init__(self):
        self.name = "threads"

    def get(self) -> str:
        return self.name


_executor = _Executor()


def _contains_map(jaxpr) -> bool:
    return _jaxprs.binds_any(jaxpr, _MAPS)


_MAPS = frozenset({"shard_map", "spmdsim_map"})


def _rebind(jaxpr, consts, args, executor: str) -> list:
    """Evaluate ``jaxpr`` on JAX values (tracers), binding each primitive as itself except ``shard_map``,
    which becomes ``spmdsim_map`` (JAX's ``core.eval_jaxpr`` with that one substitution)."""
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, ext_core.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        with source_info_util.user_context(eqn.source_info.traceback, name_stack=eqn.source_info.name_stack), \
                eqn.ctx.manager:
            if eqn.primitive.name == "shard_map":
                outs = spmdsim_map_p.bind(*invals, **shard_map_params(eqn.params, executor))
            else:
                outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
        outs = outs if eqn.primitive.multiple_results else [outs]
        for v, x in zip(eqn.outvars, outs, strict=True):
            if not isinstance(v, ext_core.DropVar):
                env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _run_traced(closed, flat_args, executor: str) -> list:
    """Run a traced program: re-bound under JAX tracers, evaluated by spmdsim on concrete values (its outputs
    placed as JAX places them: :func:`._placement.program_shardings`)."""
    if any(isinstance(x, core.Tracer) for x in (*flat_args, *closed.consts)):  # under an outer transformation
        return _rebind(closed.jaxpr, closed.consts, flat_args, executor)          # (a JVP tracer closed over too)
    previous, _executor.name = _executor.name, executor
    try:
        outs = eval_jaxpr(closed.jaxpr, [to_numpy(c) for c in closed.consts], *(to_numpy(x) for x in flat_args),
                          executor=PER_DEVICE)
    finally:
        _executor.name = previous
    return [to_jax(o, a, s) for o, a, s in zip(outs, closed.out_avals, program_shardings(closed.jaxpr, flat_args),
                                                strict=True)]


def _inside_a_map_trace() -> bool:
    """Whether JAX is tracing the body of a map now (its mesh has manual axes)."""
    return bool(mesh_lib.get_abstract_mesh().manual_axes)


def _without_our_frames(fun):
    """``fun`` raising its errors with spmdsim's frames taken out of their tracebacks, its own included, as JAX's
    jitted functions raise theirs (the traceback shows the user's call, then the user's code JAX traced);
    ``SPMDSIM_TRACEBACK_FILTERING=off`` keeps them."""
    @functools.wraps(fun)
    def entry(*args, **kwargs):
        try:
            return fun(*args, **kwargs)
        except Exception as e:
            if _runtime.current_lane() is None:
                e.with_traceback(_runtime._filtered(e.__traceback__))
            raise  # (a bare raise adds no frame of this one)
    return entry


def _check_eager_device_puts(jaxpr) -> None:
    """An eager shard_map's body runs op by op in JAX, where ``jax.device_put(x, device)`` raises (JAX's
    ``_device_put_eager_rule``; under ``jit`` it is ignored, as spmdsim ignores it everywhere else).

    Raises:
        ValueError: as JAX's, naming the device.
    """
    for eqn in jaxpr.eqns:
        if eqn.primitive.name != "shard_map":
            continue
        for inner in eqn.params["jaxpr"].eqns:
            if inner.primitive.name == "device_put":
                for device in inner.params.get("devices", ()):
                    if device is not None:
                        raise ValueError("device_put with explicit device not allowed within shard_map-decorated "
                                         f"functions, but got device {device}")


_PYTHON_SCALARS = (bool, int, float, complex)


def simulated(fun, executor: str = "threads", eager: str = "once"):
    """``fun`` (a JAX function, e.g. one built by ``jax.shard_map``) run by spmdsim (see the module docstring):
    eagerly outside any transformation (not in a multi-host run): the body once, as JAX runs it, or once per
    device (``eager="per-device"``; see :func:`spmdsim.jax.integration._eager.call`), else traced by JAX once per
    argument structure and avals."""
    if eager not in _eager.EAGER_MODES:
        raise ValueError(f"eager must be one of {_eager.EAGER_MODES}, got {eager!r}")
    cache: dict = {}
    lock = threading.Lock()

    @_without_our_frames
    @functools.wraps(fun)
    def run(*args, **kwargs):
        if _inside_a_map_trace():  # a shard_map nested in a body JAX is tracing: JAX's own, run by spmdsim later
            return fun(*args, **kwargs)
        flat, in_tree = jax.tree_util.tree_flatten((args, kwargs))
        if _hosts.current() is None and _eager.runs_eagerly(flat):  # JAX runs it op by op: see ._eager
            return _eager.call(fun, executor, eager, *args, **kwargs)
        # leaves that are not JAX arrays reach ``fun`` as they are, closed over by the traced function, as JAX's
        # shard_map passes them: an object with in_specs None (never cached: JAX keeps them by identity), a Python
        # number (a static shape under jit; cached by its value)
        values = [core.valid_jaxtype(x) and type(x) not in _PYTHON_SCALARS for x in flat]
        dynamic = [x for x, value in zip(flat, values) if value]
        numbers = tuple((type(x), repr(x)) for x in flat if type(x) in _PYTHON_SCALARS)
        key = (in_tree, tuple(core.typeof(x) for x in dynamic), numbers)
        cacheable = all(value or type(x) in _PYTHON_SCALARS for x, value in zip(flat, values))
        with lock:
            found = cache.get(key) if cacheable else None
        if found is None:
            def flat_fun(*leaves):
                it = iter(leaves)
                a, k = jax.tree_util.tree_unflatten(in_tree, [next(it) if value else x for x, value in
                                                              zip(flat, values)])
                return fun(*a, **k)
            closed, shape = jax.make_jaxpr(flat_fun, return_shape=True)(*dynamic)
            if not any(isinstance(x, pe.DynamicJaxprTracer) for x in dynamic):  # eager, not traced by jit
                _check_eager_device_puts(closed.jaxpr)
            found = (closed, jax.tree_util.tree_structure(shape))
            if cacheable and not any(isinstance(c, core.Tracer) for c in closed.consts):
                with lock:
                    cache[key] = found
        closed, out_tree = found
        return jax.tree_util.tree_unflatten(out_tree, _run_traced(closed, dynamic, executor))

    return run


def shard_map(f=None, /, *, out_specs, in_specs=_INFER, mesh=None, axis_names=frozenset(),
              check_vma: bool = True, executor: str = "threads", eager: str = "once"):
    """``jax.shard_map`` on spmdsim's virtual devices, with every value computed by NumPy.

    Same signature and semantics as ``jax.shard_map`` (JAX 0.10): ``mesh`` a ``jax.sharding.Mesh`` (or
    None: the context mesh of ``jax.set_mesh``), ``in_specs`` (default: inferred from the arguments'
    shardings) and ``out_specs`` trees of ``PartitionSpec``, ``axis_names`` the manual axes, ``check_vma``
    JAX's varying-manual-axes checks. Called outside any transformation it runs eagerly, as JAX 0.10 does: ``f``
    runs once per call on values that hold every device's block, print as JAX's eager values (``On cpu:0 at
    mesh coordinates (i,) = (0,):`` and each device's block) and that Python control flow can branch on where
    they are the same on every device; each primitive is computed for every device by the ``executor`` (threads:
    one thread per device, meeting in collectives). ``eager="per-device"`` runs ``f`` once per device instead,
    each in its own thread on its own block (printing that device's block, labelled by device; a debugger
    stops in one device), as the NumPy front end's :func:`spmdsim.shard_map` does. Under ``jit``, ``grad``,
    ``vmap`` JAX traces ``f`` (so its errors and checks are JAX's own) and each device's block is computed by
    spmdsim in its own thread (``executor="vectorized"``: all at once). Composes with ``jit``, ``grad``,
    ``vmap`` and control flow like :func:`spmdsim.jax.pmap`.

    Returns ``jax.Array`` leaves of the global shapes the out_specs give, placed as ``jax.shard_map`` places
    them: committed, ``NamedSharding(mesh, out_spec)`` (without ``mesh``, the concrete mesh of ``jax.set_mesh``
    or of the arguments), typed as JAX types them (``float32[8@X]`` on Explicit axes).

    A collective over an axis name that no enclosing map binds raises
    :class:`~spmdsim.errors.UnboundAxisError` (a NameError and an AssertionError, the classes JAX raises there)
    with a "did you mean" and the line of the call.

    Differences from ``jax.shard_map``: where the body's values are per device (under a transformation, or eager
    with ``eager="per-device"``), a partial-manual map (``axis_names`` a subset of the mesh axes) computes once per
    coordinate of the manual axes on values that are whole along the others.
    """
    kwargs = dict(out_specs=out_specs, in_specs=in_specs, mesh=mesh, axis_names=axis_names, check_vma=check_vma)
    if f is None:
        return lambda g: shard_map(g, executor=executor, eager=eager, **kwargs)
    return simulated(real_shard_map(with_axis_errors(f), **kwargs), executor, eager)


def jit(fun=None, /, **jit_kwargs):
    """``jax.jit`` as ``spmdsim run`` provides it: a jitted function whose program contains a map (a
    ``shard_map`` or a pmap) is evaluated by spmdsim with concrete arguments, the parts outside the maps once,
    on global values, by NumPy, its outputs placed as JAX places them; any other jitted function, and any call
    under a JAX transformation, is JAX's ``jit`` unchanged. ``lower``, ``trace``, ``eval_shape`` and every other
    attribute are JAX's."""
    return jit_for("threads")(fun, **jit_kwargs)


@functools.lru_cache(maxsize=None)
def jit_for(executor: str):
    """:func:`jit` with the maps of jitted programs run by ``executor`` (``spmdsim run --executor``)."""
    @functools.wraps(jit)
    def jit_(fun=None, /, **jit_kwargs):
        if fun is None:
            return lambda f: jit_(f, **jit_kwargs)
        return _Jitted(fun, jit_kwargs, executor)
    return jit_


class _Jitted:
    """A function made by :func:`jit`. JAX's ``lower``, ``trace`` and ``eval_shape`` are methods of the class, as
    on JAX's own jitted functions, not attributes of the instance: JAX's wrappers (``vmap``, ``grad``, ...) copy
    a function's ``__dict__`` onto theirs, and a ``trace`` copied there would make ``jax.jit(jax.vmap(f))`` trace
    ``f`` unbatched."""

    def __init__(self, fun, jit_kwargs: dict, executor: str):
        functools.update_wrapper(self, fun)
        for name in ("lower", "trace", "eval_shape"):  # copied from fun's __dict__: JAX's jit's are ours
            self.__dict__.pop(name, None)
        self._spmdsim_jitted = _real_jit(fun, **jit_kwargs)
        self._spmdsim_static = _static_arguments(fun, jit_kwargs)
        self._spmdsim_executor = executor
        self._spmdsim_cache: dict = {}
        self._spmdsim_lock = threading.Lock()

    @_without_our_frames
    def __call__(self, *args, **kwargs):
        jitted = self._spmdsim_jitted
        static_nums, static_names = self._spmdsim_static
        nums = {i % len(args) for i in static_nums if -len(args) <= i < len(args)}
        dynamic = (tuple(a for i, a in enumerate(args) if i not in nums),
                   {k: v for k, v in kwargs.items() if k not in static_names})
        flat, in_tree = jax.tree_util.tree_flatten(dynamic)
        if any(isinstance(x, core.Tracer) for x in flat):
            return jitted(*args, **kwargs)
        if jax.config.jax_disable_jit:  # JAX calls the function itself: its Python, and its maps, run now
            return self.__wrapped__(*args, **kwargs)
        try:
            key = (tuple(args[i] for i in sorted(nums)), tuple(sorted((k, v) for k, v in kwargs.items()
                                                                      if k in static_names)),
                   in_tree, tuple(core.typeof(x) for x in flat))
            hash(key)
        except TypeError:  # let JAX report unhashable static arguments
            return jitted(*args, **kwargs)
        with self._spmdsim_lock:
            found = self._spmdsim_cache.get(key)
        if found is None:
            traced = jitted.trace(*args, **kwargs)
            if len(traced.jaxpr.jaxpr.invars) != len(flat) or any(isinstance(c, core.Tracer)
                                                                   for c in traced.jaxpr.consts):
                return jitted(*args, **kwargs)  # it closes over an outer transformation's values: JAX's path, as above
            found = (traced.jaxpr, traced.out_tree, _contains_map(traced.jaxpr.jaxpr))
            with self._spmdsim_lock:
                self._spmdsim_cache[key] = found
        closed, out_tree, has_map = found
        if not has_map:
            return jitted(*args, **kwargs)
        return jax.tree_util.tree_unflatten(out_tree, _run_traced(closed, flat, self._spmdsim_executor))

    def __get__(self, obj, objtype=None):  # a method of a class, as a function (and JAX's jitted) is
        return self if obj is None else types.MethodType(self, obj)

    def lower(self, *args, **kwargs):
        return self._spmdsim_jitted.lower(*args, **kwargs)

    def trace(self, *args, **kwargs):
        return self._spmdsim_jitted.trace(*args, **kwargs)

    def eval_shape(self, *args, **kwargs):
        return self._spmdsim_jitted.eval_shape(*args, **kwargs)

    def __getattr__(self, name: str):  # clear_cache, _cache_size, ...: JAX's jitted function's
        if name.startswith("_spmdsim_") or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(self._spmdsim_jitted, name)

    def __repr__(self) -> str:
        return f"<spmdsim jit of {getattr(self, '__qualname__', self.__wrapped__)!s}>"


def _static_arguments(fun, jit_kwargs: dict) -> tuple[tuple, frozenset]:
    """``jit``'s static argument positions and names, resolved against ``fun``'s signature as JAX does."""
    from spmdsim.jax._internals import api_util
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):
        signature = None
    nums, names = api_util.infer_argnums_and_argnames(signature, jit_kwargs.get("static_argnums"),
                                                      jit_kwargs.get("static_argnames"))
    return tuple(nums), frozenset(names)


_real_jit = jax.jit
