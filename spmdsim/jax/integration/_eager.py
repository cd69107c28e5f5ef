"""An un-jitted ``shard_map``, run eagerly as JAX 0.10 runs it, with every value computed by spmdsim.

JAX runs a ``shard_map`` called outside any transformation op by op (its ``ShardMapTrace``): the body's Python
runs on values that hold every device's block, ``print(x)`` shows each device's block ("On cpu:0 at mesh
coordinates (i,) = (0,):"), and Python control flow works on values that are the same on every device. spmdsim
runs that body once per device, each in its own thread (the thread executor, :func:`spmdsim.runtime._runtime.run_mapped`),
on a :class:`ShardMapTracer` holding that device's NumPy block:

- JAX's own ``shard_map`` front end checks the call (specs, divisibility, Explicit axes) and binds its primitive;
  the call is made under :data:`_EAGER` (JAX's eval trace, whose ``process_shard_map`` is :func:`run`), so that
  binding starts the devices instead of XLA.
- Each device's body runs under its own :class:`_DeviceTrace`, with the map's axes bound and manual as in JAX
  (and the caller's JAX configuration, which is thread-local in JAX). Every primitive the body binds is typed by
  JAX (its abstract evaluation: JAX's errors, the varying-manual-axes checks) and computed by spmdsim's
  interpreter on that device's values, as a one-equation jaxpr: NumPy rules, collectives as rendezvous with the
  other devices' threads, jitted functions and control flow through their sub-jaxprs.
- The outputs are checked as JAX checks them (out_spec ranks, varying axes) and assembled by their out_specs.

A shard_map inside the body runs the same way, its devices nested in the caller's. JAX raises where JAX raises:
``bool`` of a value that varies across devices (``TracerBoolConversionError``), ``device_put`` to a device, a
returned ``jax.Ref`` (JAX's own eager rules). Differences: the body's Python (and so each ``print``) runs once
per device, each device printing its own block, labelled by spmdsim's ordered output.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from spmdsim.jax._internals import abstract_mesh_context_manager, config, core, device_context, source_info_util
from spmdsim.jax._internals import lu
from spmdsim.jax._internals import mesh_lib
from spmdsim.jax._internals import jax_shard_map
from jax.sharding import NamedSharding, PartitionSpec

from spmdsim.runtime import _runtime

from spmdsim.primitives import _sharding
from spmdsim.jax.evaluation import _dtypes, _unreduced
from spmdsim.jax.evaluation._interpreter import PER_DEVICE, REFERENCE, eval_jaxpr
from spmdsim.jax.integration._map import _numpy_spec, body_name, to_jax, to_numpy
from spmdsim.jax.integration._placement import map_out_shardings
from spmdsim.jax.integration._specs import _spec_dims

__all__ = ["call", "runs_eagerly", "ShardMapTracer"]


# -- JAX's configuration in the device threads ------------------------------------------------------------

def _config_states() -> list:
    """JAX's thread-local configuration (x64, matmul precision, ...), less the trace state, axis environment and
    abstract mesh that a device's body gets from its map, and the concrete mesh of ``jax.set_mesh`` (the body's
    values are spmdsim's; what JAX runs in a device thread, a host callback, runs outside it, as in XLA)."""
    own = {id(core.trace_state), id(core.trace_state_strong_ref), id(core.axis_env_state),
           id(abstract_mesh_context_manager), id(device_context), id(config.mesh_context_manager)}
    found = {id(s): s for s in (*config.config_states.values(), *vars(config).values())
             if isinstance(s, config.config_ext.Config) and id(s) not in own}
    return list(found.values())


_STATES = _config_states()


class _CallerConfig:
    """The caller's thread-local JAX configuration, put in place in a device thread for the block (and taken back:
    device threads are reused)."""

    def __init__(self):
        unset = config.config_ext.unset
        self.values = [(s, v) for s in _STATES if (v := s.get_local()) is not unset]

    def __enter__(self):
        self.previous = [(s, s.swap_local(v)) for s, v in self.values]

    def __exit__(self, *exc):
        for s, v in reversed(self.previous):
            s.set_local(v)


# -- the per-device values ---------------------------------------------------------------------------------

class ShardMapTracer(core.Tracer):
    """One device's value in an eager shard_map's body: its NumPy block and its JAX type (the block's shape and
    dtype on the manual mesh, with the mesh axes it varies along). Printed as JAX prints its eager shard_map's
    values, for this device: ``On cpu:0 at mesh coordinates (i,) = (0,):`` and the block."""

    __slots__ = ("val",)

    def __init__(self, trace: "_DeviceTrace", val: np.ndarray, aval):
        super().__init__(trace, aval)
        self.val = val

    def to_concrete_value(self):
        """The block where it is the same on every device (JAX's rule: checked varying axes, none); else None,
        so that ``bool``/``int`` raise JAX's concretization errors."""
        trace = self._trace
        if trace.check and not self.aval.mat.vur:
            return self.val
        return None

    def __str__(self) -> str:
        trace = self._trace
        names = f"({', '.join(map(str, trace.mesh.axis_names))},)"
        return f"On {trace.device} at mesh coordinates {names} = {trace.coords}:\n{_block_str(self.val, self.aval)}\n"

    __repr__ = __str__


def _block_str(val: np.ndarray, aval) -> str:
    if _dtypes.is_key(aval.dtype):
        return str(jax.random.wrap_key_data(val, impl=aval.dtype))
    return str(val)


_DEBUG_INFO = lu.DebugInfo("eager shard_map", "<one primitive>", None, None)  # for each primitive's jaxpr

# The primitives whose eager rules in JAX are its errors (device_put to a device, returning a jax.Ref).
_JAX_EAGER_CHECKS = {p for p in jax_shard_map.eager_rules if p.name in ("device_put", "new_ref", "empty_ref")}


def _source_info():
    """The source info of the primitive being bound, as JAX's own traces record it: the caller's traceback, here
    without the frames of spmdsim's trace (the user's line and the ``jax.lax`` function called, e.g. ``pmean``)."""
    info = source_info_util.current()
    return info.replace(traceback=_Traceback(info.traceback)) if info.traceback is not None else info


class _Traceback:
    """A JAX ``Traceback`` without its innermost frames, up to the last of spmdsim's own files (what JAX's readers of an
    equation's traceback use of it: ``frames`` and ``raw_frames`` innermost first, ``as_python_traceback``)."""

    __slots__ = ("_tb", "_skip")

    def __init__(self, tb):
        self._tb = tb
        ours = [c.co_filename.startswith(_PACKAGE_DIR) for c in tb.raw_frames()[0]]
        k = ours.index(True) if True in ours else 0  # (JAX's source_info_util.current, then spmdsim's frames)
        while k < len(ours) and ours[k]:
            k += 1
        self._skip = k

    @property
    def frames(self):
        return self._tb.frames[self._skip:]

    def raw_frames(self):
        code, lasti = self._tb.raw_frames()
        return code[self._skip:], lasti[self._skip:]

    def as_python_traceback(self):
        return self._tb.as_python_traceback()


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


class _DeviceTrace(core.Trace):
    """One device's trace in an eager shard_map's body: primitives typed by JAX and computed by spmdsim's rules
    on this device's blocks (see the module docstring)."""

    def __init__(self, mesh, manual: frozenset, check: bool, index: int, axes: tuple, outer: "_DeviceTrace | None",
                 executor):
        super().__init__()
        self.mesh, self.manual, self.check, self.executor = mesh, manual, check, executor
        self.manual_mesh = jax_shard_map._as_manual_mesh(mesh, manual)
        position = dict(outer.position) if outer is not None else {}
        position.update(zip((name for name, _ in axes), np.unravel_index(index, [size for _, size in axes])))
        self.position = position  # manual axis -> this device's coordinate
        self.coords = tuple(int(position.get(name, 0)) for name in mesh.axis_names)
        self.device = mesh.devices[self.coords] if hasattr(mesh, "devices") else None

    def aval(self, shape, dtype, weak_type: bool, varying: frozenset):
        """A block's JAX type on the manual mesh, varying along ``varying`` (under ``check_vma``); ``shape``: its
        NumPy form's (for PRNG keys, with the key data's trailing axes)."""
        if _dtypes.is_key(dtype):
            shape = shape[:len(shape) - len(_dtypes.key_data_shape(dtype))]
        aval = core.ShapedArray(tuple(shape), dtype, weak_type=weak_type)
        return aval.update(sharding=NamedSharding(self.manual_mesh, PartitionSpec(*(None,) * len(shape))),
                           manual_axis_type=core.ManualAxisType(varying=varying) if self.check else core.empty_mat)

    def lift(self, x) -> ShardMapTracer:
        """``x`` as this device's value: a constant (a Python or NumPy value, a ``jax.Array``) is the same on every
        device; an enclosing eager map's value is its block."""
        if isinstance(x, ShardMapTracer):
            if x._trace is self:
                return x
            aval = x.aval
        elif isinstance(x, core.Tracer):
            raise TypeError(f"spmdsim: a value of another JAX transformation reached an eager shard_map's body: {x}")
        else:
            aval = core.typeof(x)
        mat = getattr(aval, "mat", core.empty_mat)
        val = to_numpy(x.val if isinstance(x, ShardMapTracer) else x)
        return ShardMapTracer(self, val, self.aval(val.shape, aval.dtype, aval.weak_type, mat.varying & self.manual))

    stage_value = lift

    def process_primitive(self, prim, tracers, params, /):
        with core.set_current_trace(core.eval_trace):  # as while JAX binds up to 0.11 (0.12: no trace at all)
            return self._computed(prim, tracers, params)

    def _computed(self, prim, tracers, params):
        ins = [self.lift(t) for t in tracers]
        if prim in _JAX_EAGER_CHECKS:
            jax_shard_map.eager_rules[prim](self.mesh, *(t.val for t in ins), **params)
        out_avals, effects = prim.abstract_eval(*(t.aval for t in ins), **params)
        out_avals = list(out_avals) if prim.multiple_results else [out_avals]
        invars = [core.Var(t.aval) for t in ins]
        outvars = [core.Var(a) for a in out_avals]
        eqn = core.new_jaxpr_eqn(invars, outvars, prim, params, effects, _source_info())
        values = eval_jaxpr(core.Jaxpr([], invars, outvars, [eqn], effects, _DEBUG_INFO), [], *(t.val for t in ins),
                            executor=self.executor)
        outs = [ShardMapTracer(self, v, self._typed(a)) for v, a in zip(values, out_avals, strict=True)]
        return outs if prim.multiple_results else outs[0]

    def _typed(self, aval):
        if self.check:
            return aval
        return aval.update(manual_axis_type=core.empty_mat)

    def process_call(self, call_primitive, fun, tracers, params, /):
        with core.set_current_trace(self):
            return fun.call_wrapped(*tracers)

    def process_custom_jvp_call(self, prim, fun, jvp, tracers, /, *, symbolic_zeros):
        with core.set_current_trace(self):
            return fun.call_wrapped(*tracers)

    def process_custom_vjp_call(self, prim, fun, fwd, bwd, tracers, /, *, out_trees, symbolic_zeros):
        with core.set_current_trace(self):
            return fun.call_wrapped(*tracers)

    def process_shard_map(self, prim, fun, args, *, mesh, in_specs, check_vma, newly_manual_axes, debug_info):
        """A shard_map inside this device's body: its devices nested in this one (JAX requires the same mesh)."""
        if check_vma != self.check:
            raise ValueError(f"A shard_map nested in an eager shard_map must have the same check_vma "
                             f"({self.check}), got {check_vma}.")
        with core.set_current_trace(core.eval_trace):
            return run(fun, [self.lift(x) for x in args], self.mesh, in_specs, check_vma, newly_manual_axes,
                       self.executor, outer=self, name=body_name(debug_info))


# -- the map -------------------------------------------------------------------------------------------------

class _EagerTrace(core.EvalTrace):
    """JAX's eval trace, except that the shard_map it meets runs on spmdsim's devices (:func:`run`), the jaxprs of
    their primitives evaluated by ``executor`` (an :class:`~spmdsim.jax.evaluation._interpreter.PerDevice`)."""

    def __init__(self, executor):
        super().__init__()
        self.executor = executor

    def process_shard_map(self, prim, fun, args, *, mesh, in_specs, check_vma, newly_manual_axes, debug_info):
        if isinstance(mesh, mesh_lib.AbstractMesh):  # JAX's choice of the concrete mesh (the context's, the args')
            concrete = mesh_lib.get_concrete_mesh()
            mesh = jax_shard_map.get_mesh_from_args(args, concrete if not concrete.empty else mesh)
        with core.set_current_trace(core.eval_trace):  # as while JAX binds up to 0.11 (0.12: no trace at all)
            return run(fun, args, mesh, in_specs, check_vma, newly_manual_axes, self.executor, outer=None,
                       name=body_name(debug_info))


_EAGER = {"threads": _EagerTrace(PER_DEVICE), "reference": _EagerTrace(REFERENCE)}


def runs_eagerly(flat_args) -> bool:
    """Whether a shard_map called now with these arguments runs eagerly: outside any JAX transformation."""
    return type(core.trace_ctx.trace) is core.EvalTrace and not any(isinstance(x, core.Tracer) for x in flat_args)


def call(fun, executor: str, *args, **kwargs):
    """Call ``fun``, a function built by JAX's ``shard_map``, with its map run eagerly by spmdsim: one thread per
    device whatever the ``executor`` (the body's Python runs per device; ``"reference"``: each primitive's jaxpr
    by the reference loop)."""
    with core.set_current_trace(_EAGER.get(executor, _EAGER["threads"])):
        return fun(*args, **kwargs)


def run(fun, args: list, mesh, in_specs: tuple, check: bool, newly_manual: frozenset, executor,
        outer: "_DeviceTrace | None", name: str | None = None):
    """The eager shard_map: ``fun`` (JAX's flattened body, returning its outputs with their out_specs) run once per
    device of the newly manual axes, on each device's blocks of ``args``; returns JAX's FlatTree of the outputs
    (``jax.Array``s; at ``outer``, an enclosing eager map's device, that device's values). ``name``: the user's
    function's (a trace names each device's call after it)."""
    axes = tuple((name, size) for name, size in mesh.shape.items() if name in newly_manual)
    manual = newly_manual | (outer.manual if outer is not None else frozenset())
    values = [x.val if outer is not None else to_numpy(x) for x in args]
    in_dims = [_spec_dims(s, np.ndim(v)) for s, v in zip(in_specs, values, strict=True)]
    blocks = [_unreduced.split_blocks(v, d, axes) for v, d in zip(values, in_dims, strict=True)]
    caller = _CallerConfig()
    env = [(name, size) for name, size in mesh.shape.items() if name in manual]
    if outer is None:  # each block's type as JAX traces the body with it
        in_types = [core.shard_aval(mesh, newly_manual, check, s, core.typeof(x)) for s, x in zip(in_specs, args)]

    def device(i: int):
        trace = _DeviceTrace(mesh, manual, check, i, axes, outer, executor)
        types = in_types if outer is None else [
            trace.aval(b.shape[1:], x.aval.dtype, x.aval.weak_type,
                       _spec_axes(s) | (frozenset(x.aval.mat.varying) if check else frozenset()))
            for b, s, x in zip(blocks, in_specs, args)]
        with caller, core.set_current_trace(trace), core.extend_axis_env_nd(env), \
                mesh_lib.use_abstract_mesh(trace.manual_mesh), config._check_vma(check):
            tracers = [ShardMapTracer(trace, b[i], t) for b, t in zip(blocks, types, strict=True)]
            ans, out_specs = fun(*tracers).unpack_aux()
            outs = [trace.lift(x) for x in ans.vals]
        return ans, out_specs, [(o.val, o.aval) for o in outs]

    per_device = _runtime.run_mapped(device, axes, is_device=True, name=name)
    ans, out_specs, first = per_device[0]
    _check_same_types(per_device, axes)
    out_avals = ans.update([a for _, a in first])
    jax_shard_map._check_names(out_specs, out_avals)
    if check:  # (a nested map is checked on the mesh as JAX sees it there: the outer map's axes manual)
        jax_shard_map._check_mats(mesh if outer is None else outer.manual_mesh, out_specs, out_avals)
    out_dims = tuple(_spec_dims(s, len(a.shape)) for s, a in zip(out_specs, out_avals.vals, strict=True))
    outs = [_unreduced.assemble_blocks(np.stack([d[2][k][0] for d in per_device]), _numpy_spec(dims, a), axes)
            for k, (dims, a) in enumerate(zip(out_dims, out_avals.vals, strict=True))]
    if outer is not None:
        return ans.update([
            ShardMapTracer(outer, o, outer.aval(o.shape, a.dtype, a.weak_type,
                                                frozenset(a.mat.varying) - _spec_axes(s) if check else frozenset()))
            for o, (_, a), s in zip(outs, first, out_specs, strict=True)])
    if set(mesh.axis_names) == manual:  # as JAX places them: by the out_specs as written
        shardings = [NamedSharding(mesh, spec) for spec in out_specs]
    elif jax.sharding.AxisType.Explicit in mesh.axis_types:  # partial manual: the output's type's Explicit axes,
        shardings = [NamedSharding(mesh, _merged(core.unshard_aval(mesh, check, spec, a).sharding.spec, spec))
                     for (_, a), spec in zip(first, out_specs, strict=True)]  # and the manual axes as written
    else:
        shardings = map_out_shardings(dict(api="shard_map", mesh=mesh, out_specs=out_dims), args)
    return ans.update([to_jax(o, a, s) for o, (_, a), s in zip(outs, first, shardings, strict=True)])


def _merged(typed, written) -> PartitionSpec:
    """Per dimension, the mesh axes of ``typed`` then those of ``written`` not among them (a partial-manual map
    over an Auto axis of a mesh with Explicit ones: JAX's result is split by both, ``P('y')`` for a map over
    ``'y'``)."""
    ndim = max(len(typed), len(written))
    both = [tuple(dict.fromkeys((*t, *w))) for t, w in zip(_spec_dims(typed, ndim), _spec_dims(written, ndim))]
    return PartitionSpec(*(None if not names else names[0] if len(names) == 1 else names for names in both))


def _spec_axes(spec) -> frozenset:
    return frozenset(name for part in getattr(spec, "partitions", spec) if part is not None
                     for name in (part if isinstance(part, tuple) else (part,)))


def _check_same_types(per_device: list, axes: tuple) -> None:
    """Every device returned outputs of the same structure, shapes and dtypes (Python control flow on a value can
    only differ between devices where it differs: JAX rejects that, spmdsim names the devices)."""
    first = per_device[0]
    for i, (ans, _, outs) in enumerate(per_device[1:], start=1):
        if ans.tree != first[0].tree or [(np.shape(v), a.dtype) for v, a in outs] != \
                [(np.shape(v), a.dtype) for v, a in first[2]]:
            coords = np.unravel_index(i, [size for _, size in axes])
            raise ValueError(f"eager shard_map: the device at mesh coordinates {tuple(map(int, coords))} returned "
                             f"outputs of other structure, shapes or dtypes than the device at coordinate 0: "
                             f"{[a.str_short() for _, a in outs]} vs {[a.str_short() for _, a in first[2]]}.")
