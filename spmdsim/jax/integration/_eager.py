"""An un-jitted ``shard_map``, run eagerly as JAX 0.10 runs it, with every value computed by spmdsim.

JAX runs a ``shard_map`` called outside any transformation op by op (its ``ShardMapTrace``): the body's Python
runs once, on values that hold every device's block, ``print(x)`` shows each device's block ("On cpu:0 at mesh
coordinates (i,) = (0,):"), and Python control flow works on values that are the same on every device.

- JAX's own ``shard_map`` front end checks the call (specs, divisibility, Explicit axes) and binds its primitive;
  the call is made under an :class:`_EagerTrace` (JAX's eval trace, whose ``process_shard_map`` is spmdsim's), so
  that binding starts spmdsim's devices instead of XLA.
- **Once per call, as JAX** (the default, :func:`run_once`): the body runs under a :class:`_MeshTrace` on
  :class:`ShardMapTracer` values, every device's block stacked on a leading axis (one row per mesh device). Every
  primitive the body binds is typed by JAX (its abstract evaluation: JAX's errors, the varying-manual-axes
  checks) and computed by spmdsim for every device as a one-equation jaxpr: with the thread executor one thread
  per device (collectives meet in the rendezvous: the debugger stops there, a trace records them), with the
  vectorized one the rows as its batch.
- **Once per device, on request** (``eager="per-device"``, :func:`run`): each device's body runs in its own
  thread (:func:`spmdsim.runtime._runtime.run_mapped`) under its own :class:`_DeviceTrace`, on a
  :class:`DeviceShardMapTracer` holding that device's block, with the map's axes bound and manual as in JAX and
  the caller's JAX configuration (thread-local in JAX); each device prints its own block, labelled by spmdsim's
  ordered output, and ``breakpoint()`` stops in one device.
- The outputs are checked as JAX's eager map checks them (out_spec ranks, varying axes) and assembled by their
  out_specs.

A shard_map inside the body runs the same way, nested in the caller's. JAX raises where JAX raises: ``bool`` of a
value that varies across devices (``TracerBoolConversionError``), ``device_put`` to a device, a returned
``jax.Ref`` (JAX's own eager rules). Difference: in a partial-manual map ``print(x)`` works where JAX raises
NameError.
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

from spmdsim.primitives import _batch
from spmdsim.jax.evaluation import _dtypes, _unreduced
from spmdsim.jax.evaluation._interpreter import PER_DEVICE, REFERENCE, Vectorized, eval_jaxpr
from spmdsim.jax.integration._map import _numpy_spec, body_name, to_jax, to_numpy
from spmdsim.jax.integration._placement import map_out_shardings
from spmdsim.jax.integration._specs import _spec_dims

__all__ = ["call", "runs_eagerly", "EAGER_MODES", "ShardMapTracer", "DeviceShardMapTracer"]


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

class _BlockTracer(core.Tracer):
    """A value of an eager shard_map's body: NumPy block(s) in ``val`` and the block's JAX type (its shape and dtype
    on the manual mesh, with the mesh axes it varies along). Concrete where it is the same on every device (JAX's
    rule: checked varying axes, none), else ``bool``/``int`` raise JAX's concretization errors; printed as JAX
    prints its eager values, a block per device under ``On cpu:0 at mesh coordinates (i,) = (0,):``."""

    __slots__ = ("val",)

    def __init__(self, trace, val: np.ndarray, aval):
        super().__init__(trace, aval)
        self.val = val

    def one_block(self) -> np.ndarray:
        """A device's block (the same on every device where the value is concrete)."""
        raise NotImplementedError

    def blocks(self):
        """``(device, its mesh coordinates, its block)`` for each device the value shows."""
        raise NotImplementedError

    def to_concrete_value(self):
        if self._trace.check and not self.aval.mat.vur:
            return self.one_block()
        return None

    def __str__(self) -> str:
        names = f"({', '.join(map(str, self._trace.mesh.axis_names))},)"
        return "\n".join(f"On {device} at mesh coordinates {names} = {index}:\n{_block_str(block, self.aval)}\n"
                         for device, index, block in self.blocks())

    __repr__ = __str__


class DeviceShardMapTracer(_BlockTracer):
    """One device's value in an eager shard_map's body run per device: its block (printed for this device)."""

    __slots__ = ()

    def one_block(self) -> np.ndarray:
        return self.val

    def blocks(self):
        return [(self._trace.device, self._trace.coords, self.val)]


DeviceShardMapTracer.__name__ = "ShardMapTracer"  # as JAX names its eager values (``type(x).__name__``)


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


def _block_aval(trace, shape, dtype, weak_type: bool, varying: frozenset):
    """A block's JAX type on ``trace``'s manual mesh, varying along ``varying`` (under ``check_vma``); ``shape``:
    its NumPy form's (for PRNG keys, with the key data's trailing axes)."""
    if _dtypes.is_key(dtype):
        shape = shape[:len(shape) - len(_dtypes.key_data_shape(dtype))]
    aval = core.ShapedArray(tuple(shape), dtype, weak_type=weak_type)
    return aval.update(sharding=NamedSharding(trace.manual_mesh, PartitionSpec(*(None,) * len(shape))),
                       manual_axis_type=core.ManualAxisType(varying=varying) if trace.check else core.empty_mat)


def _one_equation(mesh, prim, ins: list, params: dict):
    """``prim`` bound to the tracers ``ins`` as a one-equation jaxpr, typed by JAX (its abstract evaluation: JAX's
    errors, the varying-manual-axes checks; JAX's eager rules where they are errors); and its outputs' types."""
    if prim in _JAX_EAGER_CHECKS:
        jax_shard_map.eager_rules[prim](mesh, *(t.val for t in ins), **params)
    out_avals, effects = prim.abstract_eval(*(t.aval for t in ins), **params)
    out_avals = list(out_avals) if prim.multiple_results else [out_avals]
    invars = [core.Var(t.aval) for t in ins]
    outvars = [core.Var(a) for a in out_avals]
    eqn = core.new_jaxpr_eqn(invars, outvars, prim, params, effects, _source_info())
    return core.Jaxpr([], invars, outvars, [eqn], effects, _DEBUG_INFO), out_avals


class _BodyTrace(core.Trace):
    """What both eager bodies' traces do alike: calls and custom derivatives run their function in the trace (an
    eager body needs no derivative rule), a nested map must keep ``check_vma``, outputs are typed as checked."""

    check: bool

    def process_call(self, call_primitive, fun, tracers, params, /):
        with core.set_current_trace(self):
            return fun.call_wrapped(*tracers)

    def process_custom_jvp_call(self, prim, fun, jvp, tracers, /, *, symbolic_zeros):
        with core.set_current_trace(self):
            return fun.call_wrapped(*tracers)

    def process_custom_vjp_call(self, prim, fun, fwd, bwd, tracers, /, *, out_trees, symbolic_zeros):
        with core.set_current_trace(self):
            return fun.call_wrapped(*tracers)

    def check_nested(self, check_vma: bool) -> None:
        if check_vma != self.check:
            raise ValueError(f"A shard_map nested in an eager shard_map must have the same check_vma "
                             f"({self.check}), got {check_vma}.")

    def _typed(self, aval):
        return aval if self.check else aval.update(manual_axis_type=core.empty_mat)


class _DeviceTrace(_BodyTrace):
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

    aval = _block_aval

    def lift(self, x) -> DeviceShardMapTracer:
        """``x`` as this device's value: a constant (a Python or NumPy value, a ``jax.Array``) is the same on every
        device; an enclosing eager map's value is its block."""
        if isinstance(x, DeviceShardMapTracer):
            if x._trace is self:
                return x
            aval = x.aval
        elif isinstance(x, core.Tracer):
            raise TypeError(f"spmdsim: a value of another JAX transformation reached an eager shard_map's body: {x}")
        else:
            aval = core.typeof(x)
        mat = getattr(aval, "mat", core.empty_mat)
        val = to_numpy(x.val if isinstance(x, DeviceShardMapTracer) else x)
        return DeviceShardMapTracer(self, val, self.aval(val.shape, aval.dtype, aval.weak_type, mat.varying & self.manual))

    stage_value = lift

    def process_primitive(self, prim, tracers, params, /):
        with core.set_current_trace(core.eval_trace):  # as while JAX binds up to 0.11 (0.12: no trace at all)
            return self._computed(prim, tracers, params)

    def _computed(self, prim, tracers, params):
        ins = [self.lift(t) for t in tracers]
        jaxpr, out_avals = _one_equation(self.mesh, prim, ins, params)
        values = eval_jaxpr(jaxpr, [], *(t.val for t in ins), executor=self.executor)
        outs = [DeviceShardMapTracer(self, v, self._typed(a)) for v, a in zip(values, out_avals, strict=True)]
        return outs if prim.multiple_results else outs[0]

    def process_shard_map(self, prim, fun, args, *, mesh, in_specs, check_vma, newly_manual_axes, debug_info):
        """A shard_map inside this device's body: its devices nested in this one (JAX requires the same mesh)."""
        self.check_nested(check_vma)
        with core.set_current_trace(core.eval_trace):
            return run(fun, [self.lift(x) for x in args], self.mesh, in_specs, check_vma, newly_manual_axes,
                       self.executor, outer=self, name=body_name(debug_info))


# -- the map -------------------------------------------------------------------------------------------------

class _EagerTrace(core.EvalTrace):
    """JAX's eval trace, except that the shard_map it meets runs on spmdsim's devices: the body once, as JAX runs
    it (:func:`run_once`), or once per device (``per_device``, :func:`run`), its primitives evaluated by
    ``executor`` (``"threads"``, ``"vectorized"`` or ``"reference"``)."""

    def __init__(self, executor: str, per_device: bool):
        super().__init__()
        self.executor, self.per_device = executor, per_device

    def process_shard_map(self, prim, fun, args, *, mesh, in_specs, check_vma, newly_manual_axes, debug_info):
        if isinstance(mesh, mesh_lib.AbstractMesh):  # JAX's choice of the concrete mesh (the context's, the args')
            concrete = mesh_lib.get_concrete_mesh()
            mesh = jax_shard_map.get_mesh_from_args(args, concrete if not concrete.empty else mesh)
        with core.set_current_trace(core.eval_trace):  # as while JAX binds up to 0.11 (0.12: no trace at all)
            if self.per_device:
                executor = REFERENCE if self.executor == "reference" else PER_DEVICE
                return run(fun, args, mesh, in_specs, check_vma, newly_manual_axes, executor, outer=None,
                           name=body_name(debug_info))
            return run_once(fun, args, mesh, in_specs, check_vma, newly_manual_axes, self.executor, outer=None,
                            name=body_name(debug_info))


EAGER_MODES = ("once", "per-device")


def runs_eagerly(flat_args) -> bool:
    """Whether a shard_map called now with these arguments runs eagerly: outside any JAX transformation."""
    return type(core.trace_ctx.trace) is core.EvalTrace and not any(isinstance(x, core.Tracer) for x in flat_args)


def call(fun, executor: str, eager: str, *args, **kwargs):
    """Call ``fun``, a function built by JAX's ``shard_map``, with its map run eagerly by spmdsim: ``eager="once"``
    runs the body's Python once, as JAX does, on values holding every device's block (each primitive computed for
    all devices by ``executor``: ``"threads"``, one thread per device, or ``"vectorized"``); ``"per-device"``
    runs it once per device, each in its own thread (``"reference"``: each primitive's jaxpr by the reference
    loop)."""
    if eager not in EAGER_MODES:
        raise ValueError(f"eager must be one of {EAGER_MODES}, got {eager!r}")
    with core.set_current_trace(_EagerTrace(executor, eager == "per-device")):
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
            tracers = [DeviceShardMapTracer(trace, b[i], t) for b, t in zip(blocks, types, strict=True)]
            ans, out_specs = fun(*tracers).unpack_aux()
            outs = [trace.lift(x) for x in ans.vals]
        return ans, out_specs, [(o.val, o.aval) for o in outs]

    per_device = _runtime.run_mapped(device, axes, is_device=True, name=name)
    ans, out_specs, first = per_device[0]
    _check_same_types(per_device, axes)
    out_avals = [a for _, a in first]
    _check_outputs(ans, out_specs, out_avals, mesh, check, outer)
    outs = [_unreduced.assemble_blocks(np.stack([d[2][k][0] for d in per_device]), _numpy_spec(dims, a), axes)
            for k, (dims, a) in enumerate(zip(_out_dims(out_specs, out_avals), out_avals, strict=True))]
    if outer is not None:
        return ans.update([
            DeviceShardMapTracer(outer, o, outer.aval(o.shape, a.dtype, a.weak_type,
                                                frozenset(a.mat.varying) - _spec_axes(s) if check else frozenset()))
            for o, a, s in zip(outs, out_avals, out_specs, strict=True)])
    return ans.update(_placed(outs, out_avals, out_specs, mesh, manual, check, args))


def _out_dims(out_specs, out_avals) -> tuple:
    return tuple(_spec_dims(s, len(a.shape)) for s, a in zip(out_specs, out_avals, strict=True))


def _check_outputs(ans, out_specs, out_avals: list, mesh, check: bool, outer) -> None:
    """The outputs' specs against their types, as JAX checks them (a nested map on the mesh as JAX sees it
    there: the outer map's axes manual).

    A top-level map as JAX 0.10-0.12's eager ``shard_map`` (``_shard_map_impl``) checks it: the ranks on the
    outputs' global values' types, which have no varying axes (its error shows ``int32[1]``, not
    ``int32[1]{V:i}``); the varying axes output by output where each is moved to its out_specs, by
    ``jit(shard_map(_rem_singleton, in_specs=<its varying axes>, out_specs=<its spec>))``, whose error names
    that function and that one output (``out_specs is P() ...``, no path)."""
    if outer is not None:
        jax_shard_map._check_names(out_specs, ans.update(out_avals))
        if check:
            jax_shard_map._check_mats(outer.manual_mesh, out_specs, ans.update(out_avals))
        return
    jax_shard_map._check_names(out_specs, ans.update([a.update(manual_axis_type=core.empty_mat) for a in out_avals]))
    if check:
        for spec, a in zip(out_specs, out_avals, strict=True):
            if isinstance(spec, PartitionSpec) and not jax_shard_map._valid_repeats(mesh, a.mat, spec):
                raise ValueError(jax_shard_map._inout_vma_error(
                    jax_shard_map._rem_singleton, mesh, jax.tree_util.tree_structure(0), spec, [a.mat]))


def _placed(outs: list, out_avals: list, out_specs, mesh, manual: frozenset, check: bool, args) -> list:
    """A top-level eager map's outputs (whole NumPy values) as ``jax.Array``s placed as JAX places them."""
    if set(mesh.axis_names) == manual:  # by the out_specs as written
        shardings = [NamedSharding(mesh, spec) for spec in out_specs]
    elif jax.sharding.AxisType.Explicit in mesh.axis_types:  # partial manual: the output's type's Explicit axes,
        shardings = [NamedSharding(mesh, _merged(core.unshard_aval(mesh, check, spec, a).sharding.spec, spec))
                     for a, spec in zip(out_avals, out_specs, strict=True)]  # and the manual axes as written
    else:
        shardings = map_out_shardings(dict(api="shard_map", mesh=mesh, out_specs=_out_dims(out_specs, out_avals)),
                                      args)
    return [to_jax(o, a, s) for o, a, s in zip(outs, out_avals, shardings, strict=True)]


# -- the body run once, as JAX runs it ----------------------------------------------------------------------

class ShardMapTracer(_BlockTracer):
    """A value of an eager shard_map's body run once, as JAX runs it: every device's block stacked on a leading
    axis, one row per device of the mesh in row-major order (along the axes that are not manual, the same block).
    Prints every device's block, as JAX's eager values print."""

    __slots__ = ()

    def one_block(self) -> np.ndarray:
        return self.val[0]

    def blocks(self):
        mesh = self._trace.mesh
        return [(device, index, block)
                for (index, device), block in zip(np.ndenumerate(mesh.devices), self.val, strict=True)]


# psend delivers into a mailbox that its precv, a later equation, reads: in a body run once, both go to the
# trace's one batch of devices (the vectorized rules: the same values as the thread executor's).
_POINT_TO_POINT = frozenset({"psend", "precv"})


class _MeshTrace(_BodyTrace):
    """An eager shard_map's body run once: each primitive typed by JAX and computed by spmdsim for every device at
    once, as a one-equation jaxpr (``executor``: ``"vectorized"``, the rows as the vectorized executor's batch;
    else one thread per device, meeting in collectives as in a mapped call)."""

    def __init__(self, mesh, manual: frozenset, check: bool, executor: str, name: str | None):
        super().__init__()
        self.mesh, self.manual, self.check, self.executor = mesh, manual, check, executor
        self.name = name  # the user's function's: each primitive's mapped call is named after it
        self.manual_mesh = jax_shard_map._as_manual_mesh(mesh, manual)
        self.axes = tuple(mesh.shape.items())
        self.env = [(axis, size) for axis, size in self.axes if axis in manual]
        self.batch = _batch.Batch(self.axes)  # every device, for the whole body: psend's mailboxes last till precv

    aval = _block_aval

    def lift(self, x) -> ShardMapTracer:
        """``x`` as a value of this body: a constant is the same on every device; an enclosing eager map's value
        keeps its rows (the same mesh)."""
        if isinstance(x, ShardMapTracer):
            if x._trace is self:
                return x
            val, aval = x.val, x.aval
        elif isinstance(x, core.Tracer):
            raise TypeError(f"spmdsim: a value of another JAX transformation reached an eager shard_map's body: {x}")
        else:
            aval = core.typeof(x)
            one = to_numpy(x)
            val = np.broadcast_to(one, (self.mesh.size, *np.shape(one)))
        mat = getattr(aval, "mat", core.empty_mat)
        return ShardMapTracer(self, val, self.aval(val.shape[1:], aval.dtype, aval.weak_type, mat.varying & self.manual))

    stage_value = lift

    def process_primitive(self, prim, tracers, params, /):
        with core.set_current_trace(core.eval_trace):  # as while JAX binds up to 0.11 (0.12: no trace at all)
            ins = [self.lift(t) for t in tracers]
            jaxpr, out_avals = _one_equation(self.mesh, prim, ins, params)
            values = self._evaluate(jaxpr, [t.val for t in ins])
        outs = [ShardMapTracer(self, v, self._typed(a)) for v, a in zip(values, out_avals, strict=True)]
        return outs if prim.multiple_results else outs[0]

    def _evaluate(self, jaxpr, stacked: list) -> list:
        caller = _CallerConfig()
        with caller, core.extend_axis_env_nd(self.env), mesh_lib.use_abstract_mesh(self.manual_mesh):
            if self.executor == "vectorized" or jaxpr.eqns[0].primitive.name in _POINT_TO_POINT:
                ex = Vectorized(self.batch)
                ex.compiled = False  # one equation, once: the reference loop
                return [np.asarray(v) for v in ex.eval_jaxpr(jaxpr, [], stacked)]
        executor = REFERENCE if self.executor == "reference" else PER_DEVICE

        def device(i: int):
            with caller, core.extend_axis_env_nd(self.env), mesh_lib.use_abstract_mesh(self.manual_mesh):
                return eval_jaxpr(jaxpr, [], *(v[i] for v in stacked), executor=executor)
        per_device = _runtime.run_mapped(device, self.axes, is_device=True, name=self.name)
        return [np.stack([np.asarray(d[k]) for d in per_device]) for k in range(len(jaxpr.outvars))]

    def process_shard_map(self, prim, fun, args, *, mesh, in_specs, check_vma, newly_manual_axes, debug_info):
        """A shard_map inside this body (JAX requires the same mesh): its body once too, more axes manual."""
        self.check_nested(check_vma)
        with core.set_current_trace(core.eval_trace):
            return run_once(fun, [self.lift(x) for x in args], self.mesh, in_specs, check_vma, newly_manual_axes,
                            self.executor, outer=self, name=body_name(debug_info))


def run_once(fun, args: list, mesh, in_specs: tuple, check: bool, newly_manual: frozenset, executor: str,
             outer: "_MeshTrace | None", name: str | None = None):
    """The eager shard_map as JAX runs it: ``fun`` (JAX's flattened body, returning its outputs with their
    out_specs) run once on values holding every device's block of ``args``; returns JAX's FlatTree of the outputs
    (``jax.Array``s; inside ``outer``, an enclosing eager map, its values). ``name``: the user's function's (a trace
    names each primitive's mapped call after it)."""
    new_axes = tuple((name, size) for name, size in mesh.shape.items() if name in newly_manual)
    manual = newly_manual | (outer.manual if outer is not None else frozenset())
    trace = _MeshTrace(mesh, manual, check, executor, name)
    # each device's position among the newly manual axes' devices, and the devices that differ only there
    coords = np.indices(mesh.devices.shape).reshape(len(mesh.axis_names), -1)
    new = [i for i, name in enumerate(mesh.axis_names) if name in newly_manual]
    rest = [i for i in range(len(mesh.axis_names)) if i not in new]
    piece = np.ravel_multi_index(coords[new], [s for _, s in new_axes]) if new else np.zeros(mesh.size, int)
    group = np.ravel_multi_index(coords[rest], [mesh.devices.shape[i] for i in rest]) if rest else \
        np.zeros(mesh.size, int)

    def split(value, spec):  # (devices, *whole) -> (devices, *block)
        dims = _spec_dims(spec, np.ndim(value) - (outer is not None))
        if outer is None:
            return _unreduced.split_blocks(value, dims, new_axes)[piece]
        return np.stack([_unreduced.split_blocks(value[d], dims, new_axes)[piece[d]] for d in range(mesh.size)])

    if any(_unreduced.spec_unreduced(s) or _unreduced.spec_reduced(s) for s in in_specs) and outer is not None:
        raise NotImplementedError("Eager shard_map + unreduced/reduced + partial manual is not implemented. "
                                  "Please wrap your shard_map in `jax.jit`.")
    values = [x.val if outer is not None else to_numpy(x) for x in args]
    blocks = [split(v, s) for v, s in zip(values, in_specs, strict=True)]
    if outer is None:  # each block's type as JAX traces the body with it
        types = [core.shard_aval(mesh, newly_manual, check, s, core.typeof(x)) for s, x in zip(in_specs, args)]
    else:
        types = [trace.aval(b.shape[1:], x.aval.dtype, x.aval.weak_type,
                            _spec_axes(s) | (frozenset(x.aval.mat.varying) if check else frozenset()))
                 for b, s, x in zip(blocks, in_specs, args)]
    with core.set_current_trace(trace), core.extend_axis_env_nd(trace.env), \
            mesh_lib.use_abstract_mesh(trace.manual_mesh), config._check_vma(check):
        tracers = [ShardMapTracer(trace, b, t) for b, t in zip(blocks, types, strict=True)]
        ans, out_specs = fun(*tracers).unpack_aux()
        outs = [trace.lift(x) for x in ans.vals]
    out_avals = [o.aval for o in outs]
    _check_outputs(ans, out_specs, out_avals, mesh, check, outer)
    specs = [_numpy_spec(dims, a) for dims, a in zip(_out_dims(out_specs, out_avals), out_avals, strict=True)]

    def assembled(o: ShardMapTracer, spec, devices):  # the value of these devices' blocks (in piece order)
        return _unreduced.assemble_blocks(o.val[devices[np.argsort(piece[devices])]], spec, new_axes)

    if outer is None:
        first = np.flatnonzero(group == 0)
        return ans.update(_placed([assembled(o, spec, first) for o, spec in zip(outs, specs)], out_avals, out_specs,
                                  mesh, manual, check, args))
    result = []
    for o, spec, a, s in zip(outs, specs, out_avals, out_specs, strict=True):
        if _unreduced.spec_unreduced(spec) or _unreduced.spec_reduced(spec):
            raise NotImplementedError("Eager shard_map + unreduced/reduced + partial manual is not implemented. "
                                      "Please wrap your shard_map in `jax.jit`.")
        wholes = {g: assembled(o, spec, np.flatnonzero(group == g)) for g in np.unique(group)}
        val = np.stack([wholes[g] for g in group])
        result.append(ShardMapTracer(outer, val, outer.aval(val.shape[1:], a.dtype, a.weak_type,
                                                         frozenset(a.mat.varying) - _spec_axes(s) if check
                                                         else frozenset())))
    return ans.update(result)


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
