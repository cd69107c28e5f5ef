"""The lowering of :data:`spmdsim.jax.integration._map.spmdsim_map_p` (``jit``, and control flow that XLA runs): a
host callback into the simulator, inside a shard_map's boundary on the map's mesh when the jitted program spans
it (issue 39; ``SPMDSIM_SHARDED_LOWERING=0``: the plain callback on device 0). Registered with JAX when this
module is imported."""
from __future__ import annotations

import functools
import math
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback
from spmdsim.jax._internals import core
from spmdsim.jax._internals import mlir

from spmdsim.runtime import _axes, _fpenv, _runtime
from spmdsim.jax.evaluation import _dtypes, _jaxprs, _unreduced
from spmdsim.jax import _internals
from spmdsim.jax.integration import _placement
from spmdsim.jax.integration import _map
from spmdsim.jax.integration._map import _partials_body, global_avals, simulate, spmdsim_map_p, to_numpy


def _callback_form(*args, as_bits: bool = False, **params):
    """The map as a host callback; ``as_bits``: its real float results come back as their bits (see
    :func:`_from_device_0`)."""
    out_avals = global_avals(params)
    keys_in = [_dtypes.is_key(core.typeof(x).dtype) for x in args]
    keys_out = [_dtypes.is_key(a.dtype) for a in out_avals]
    args = [jax.random.key_data(x) if k else x for x, k in zip(args, keys_in, strict=True)]
    shapes = [jax.ShapeDtypeStruct((*a.shape, *_dtypes.key_data_shape(a.dtype)), np.uint32) if k
              else jax.ShapeDtypeStruct(a.shape, _crossing_dtype(a.dtype) if as_bits else a.dtype)
              for a, k in zip(out_avals, keys_out, strict=True)]

    crossing = _crossing(out_avals)

    def host(*values):
        outs = simulate([to_numpy(v) for v in values], **params)
        return _as_bits(outs, crossing) if as_bits else outs

    outs = _host_call(host, shapes, args, params["jaxpr"].effects)
    return [jax.random.wrap_key_data(o, impl=a.dtype) if k else o
            for o, a, k in zip(outs, out_avals, keys_out, strict=True)]


_plain_lowering = mlir.lower_fun(_callback_form, multiple_results=True)


# In JAX's own jit (spmdsim's map imported into a program that ``spmdsim run`` does not run) the callback runs on
# device 0, and XLA must see neither an unreduced or reduced value handed to it (Shardy aborts the process: the
# maximal mesh of device 0 is not the map's) nor its results left there (the whole array on device 0, where JAX's
# shard_map hands back the out_specs' NamedShardings). So the program names the map's mesh, as a shard_map
# equation does (``dispatch.get_intermediate_shardings``: the jit's devices and mesh), and the lowering is a
# shard_map's boundary around the callback: the operands constrained to the in_specs, the results to the
# out_specs; an unreduced operand crosses as its partials stacked on a leading dimension split over its unreduced
# axes (JAX's own shard_map stacks them, a reduced one is crossed as the plain value it is), an unreduced result
# comes back the same way and is unstacked by JAX's shard_map into each device's partial.

def _lowering(ctx, *args, **params):
    # Under spmdsim compare the callback runs JAX's own map, on the map's devices, to compare with: while the
    # program's other devices wait in a collective for device 0's callback, XLA:CPU deadlocks on that inner run
    # and aborts the process (conformance/test_compare.py's grad of a pmap did). The program compiled then holds
    # device 0 only, as the plain lowering's does.
    mesh = _module_mesh(ctx, params) if _map.map_observer is None and not _calls_host(params["jaxpr"]) else None
    if mesh is None:
        return _plain_lowering(ctx, *args, **params)
    in_shardings = _shardings_on(mesh, params["in_specs"])
    out_shardings = _shardings_on(mesh, params["out_specs"])
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    # A value that is not unreduced goes to the callback's device through the replicated sharding and comes back
    # the same way (an all-gather, a broadcast, a slice), which XLA does without an "Involuntary full
    # rematerialization" (an unreduced one crosses as its stacked partials, see _sharded_callback_form).
    args = [_constrain(ctx, _constrain(ctx, x, aval, s), aval, replicated) if not _unreduced.spec_unreduced(spec)
            else _constrain(ctx, x, aval, s)
            for x, aval, s, spec in zip(args, ctx.avals_in, in_shardings, params["in_specs"], strict=True)]
    outs = mlir.lower_fun(functools.partial(_sharded_callback_form, mesh=mesh), multiple_results=True)(
        ctx, *args, **params)
    return [_from_device_0(ctx, o, aval, replicated, s) if not _unreduced.spec_unreduced(spec)
            else _constrain(ctx, o, aval, s)
            for o, aval, s, spec in zip(outs, ctx.avals_out, out_shardings, params["out_specs"], strict=True)]


def _from_device_0(ctx, x, aval, replicated, sharding):
    """The callback's result ``x`` (on device 0) through the replicated sharding to ``sharding``. XLA's partitioner
    broadcasts a value from one device as an all-reduce sum with the other devices' zeros, which turns -0.0 into
    +0.0 and flushes subnormals: a real float comes from the callback as its bits (an unsigned integer of its
    width, :func:`_as_bits`) and is bitcast back here."""
    crossing = aval.update(dtype=_crossing_dtype(aval.dtype))
    x = _constrain(ctx, _constrain(ctx, x, crossing, replicated), crossing, sharding)
    return x if crossing == aval else mlir.hlo.bitcast_convert(mlir.aval_to_ir_type(ctx.module_context, aval), x)


def _crossing_dtype(dtype):
    """The dtype a callback's result of ``dtype`` crosses the devices as: a real float's the unsigned integer of
    its width; other dtypes, and floats narrower than a byte, their own."""
    if not jnp.issubdtype(dtype, jnp.floating) or jnp.finfo(dtype).bits != 8 * np.dtype(dtype).itemsize:
        return dtype
    return np.dtype(f"uint{8 * np.dtype(dtype).itemsize}")


def _crossing(avals) -> list:
    """(declared dtype, crossing dtype) of each result (see :func:`_crossing_dtype`)."""
    return [(a.dtype, _crossing_dtype(a.dtype)) for a in avals]


def _as_bits(outs: list, crossing: list) -> list:
    """The host's results as they cross (:func:`_crossing`): a real float first takes its declared dtype, then is
    viewed as its bits."""
    return [o if bits == dtype else np.asarray(o, dtype=dtype).view(bits)
            for o, (dtype, bits) in zip(outs, crossing, strict=True)]


_HOST_CALLS = frozenset({"pure_callback", "io_callback", "debug_callback"})


def _calls_host(jaxpr) -> bool:
    """Whether the map's body (or a jaxpr in it) calls the host: the user's callback may run JAX programs, which
    XLA:CPU cannot run while the other devices of a program spanning them wait for device 0 (it hangs, then
    aborts: a ``pure_callback`` computing ``jnp.asarray(a) + 1`` on an 8 x 4096 block, 8 devices, 2 cores). Such a
    map keeps the plain lowering: the program on device 0 alone."""
    return _jaxprs.binds_any(jaxpr, _HOST_CALLS)


def _module_mesh(ctx, params):
    """The map's mesh (abstract) when the jitted program being lowered spans its devices (a program on other
    devices, or inside a JAX shard_map's manual computation: None, the plain callback)."""
    context = ctx.module_context.axis_context
    if type(context) is not _internals.sharding_impls.ShardingContext:
        return None
    mesh = params.get("mesh") if params["api"] == "shard_map" else _placement.map_mesh(params)
    mesh = getattr(mesh, "abstract_mesh", mesh)
    if mesh is None or mesh.size != context.num_devices or context.num_devices == 1:
        return None
    found = context.abstract_mesh
    if found is not None and tuple(zip(found.axis_names, found.axis_sizes)) != \
            tuple(zip(mesh.axis_names, mesh.axis_sizes)):
        return None
    return mesh


def _shardings_on(mesh, specs) -> list:
    return [jax.sharding.NamedSharding(mesh, _unreduced.partition_spec(
        spec, lambda name: _placement.PMAP_AXIS if isinstance(name, _axes.Unnamed) else name)) for spec in specs]


def _constrain(ctx, x, aval, sharding):
    """``x`` constrained to ``sharding`` (a sharding_constraint op, as ``with_sharding_constraint`` lowers)."""
    if _dtypes.is_key(aval.dtype):
        aval = core.physical_aval(aval)
    if _internals.config.use_shardy_partitioner.value:
        proto = sharding._to_sdy_sharding(aval.ndim)
    else:
        proto = sharding._to_xla_hlo_sharding(aval.ndim).to_proto()
    return mlir.wrap_with_sharding_op(ctx, x, aval, proto)


def _sharded_callback_form(*args, mesh, **params):
    """:func:`_callback_form` with unreduced operands and results crossing as their stacked partials (JAX's
    shard_map stacks and unstacks them on the map's mesh)."""
    P = jax.sharding.PartitionSpec
    axes = params["axes"]
    in_specs, out_specs = params["in_specs"], params["out_specs"]
    if not _unreduced.map_needs_partials(in_specs, out_specs):
        return _callback_form(*args, as_bits=True, **params)
    stacked_in = []
    for x, spec, sharding in zip(args, in_specs, _shardings_on(mesh, in_specs), strict=True):
        if _unreduced.spec_unreduced(spec):
            names = tuple(name for name, _ in _unreduced.partials_axes(spec, axes))
            x = _internals.jax_shard_map_build(lambda block: block[None], mesh=mesh, axis_names=frozenset(),
                                               in_specs=sharding.spec,
                                               out_specs=P(names, *_padded_parts(sharding.spec, x.ndim)),
                                               check_vma=False)(x)
        stacked_in.append(x)
    out_avals = global_avals(params)
    crossing = _crossing(out_avals)
    shapes = [jax.ShapeDtypeStruct((math.prod(n for _, n in _unreduced.partials_axes(s, axes)), *a.shape)
                                   if _unreduced.spec_unreduced(s) else a.shape, bits)
              for a, s, (_, bits) in zip(out_avals, out_specs, crossing, strict=True)]

    # The body over the stacked partials, traced here with the map's axes manual on its mesh (the program's,
    # when the map takes its mesh from the context), as :func:`_simulate_partials` traces it.
    body, plain_in, plain_out = _partials_body(params["jaxpr"], in_specs, out_specs, axes, params.get("mesh") or mesh,
                                               params.get("check_vma", False))
    plain = {**params, "jaxpr": body, "in_specs": plain_in, "out_specs": plain_out}

    def host(*values):
        outs = [_unreduced.total(o) for o in simulate([to_numpy(v) for v in values], **plain)]
        return _as_bits(outs, crossing)

    outs = _host_call(host, shapes, stacked_in, params["jaxpr"].effects)
    result = []
    for o, a, spec, sharding in zip(outs, out_avals, out_specs, _shardings_on(mesh, out_specs), strict=True):
        if _unreduced.spec_unreduced(spec):
            names = tuple(name for name, _ in _unreduced.partials_axes(spec, axes))
            # The callback's result is replicated (also in its type, on an Explicit mesh): each device takes its
            # own partial (the stacking's order: the axes major to minor), then its block of it.
            own = functools.partial(_own_block, names=names, spec=sharding.spec, mesh=mesh, dtype=a.dtype)
            o = _internals.jax_shard_map_build(own, mesh=mesh, axis_names=frozenset(), in_specs=P(),
                                               out_specs=sharding.spec, check_vma=False)(o)
        result.append(o)
    return result


def _own_block(stacked, *, names: tuple, spec, mesh, dtype):
    """In a shard_map's body, of the whole stacked partials (a real float's as its bits): this device's partial
    (by its index along ``names``) and its block of it along ``spec``, of ``dtype``."""
    block = lax.dynamic_index_in_dim(stacked, lax.axis_index(names), keepdims=False)
    for dim, part in enumerate(_padded_parts(spec, block.ndim)):
        if part is not None:
            split = (part,) if isinstance(part, str) else tuple(part)
            size = block.shape[dim] // math.prod(mesh.shape[name] for name in split)
            block = lax.dynamic_slice_in_dim(block, lax.axis_index(split) * size, size, axis=dim)
    return block if block.dtype == dtype else lax.bitcast_convert_type(block, dtype)


def _padded_parts(spec, ndim: int) -> tuple:
    parts = tuple(spec.partitions)
    return parts + (None,) * (ndim - len(parts))


# A pure map's callback, as ``jax.pure_callback``'s lowering emits it but handing the callback XLA's host buffers
# as NumPy arrays: ``jax.pure_callback`` first copies them onto a JAX CPU device and the callback reads them
# back, and in a program spanning several devices that read can wait forever on XLA:CPU (the other devices hold
# its threads, waiting in a collective for device 0's callback; XLA aborts after 40 s). Plain JAX does the same
# with a pure_callback reading an 8 x 4096 operand in an 8-device program on 2 cores.
_host_numpy_p = core.Primitive("spmdsim_host_callback")
_host_numpy_p.multiple_results = True
_host_numpy_p.def_abstract_eval(lambda *avals, host, result_avals: result_avals)
_host_numpy_p.def_impl(lambda *args, host, result_avals: host(*(np.asarray(x) for x in args)))


def _host_numpy_lowering(ctx, *args, host, result_avals):
    sharding = _internals.jax_callback._callback_op_sharding(ctx.module_context.axis_context, None, ctx.avals_out)
    results, _, _ = _internals.jax_callback.emit_python_callback(
        ctx, lambda *values: tuple(host(*values)), None, list(args), ctx.avals_in, ctx.avals_out,
        has_side_effect=False, returns_token=False, sharding=sharding)
    return results


mlir.register_lowering(_host_numpy_p, _host_numpy_lowering, cacheable=False)


def _host_call(host, shapes, args, effects):
    """``host`` as XLA's host callback: an ``io_callback`` when the map's body has side effects (host callbacks:
    XLA must neither drop the map nor reorder it), else a pure callback on NumPy operands (``_host_numpy_p``). A
    body's named axes (JAX's ``NamedAxisEffect``, bound by the map itself) are no side effect. ``host`` runs in the
    default floating-point environment (XLA calls it with subnormals flushed: see :mod:`spmdsim.runtime._fpenv`)."""
    host = functools.partial(_in_default_environment, host)
    effects = [e for e in effects if not isinstance(e, core.NamedAxisEffect)]
    if effects:
        return io_callback(host, shapes, *args, ordered=bool(_internals.effects.ordered_effects.filter_in(effects)))
    avals = tuple(core.ShapedArray(s.shape, s.dtype) for s in shapes)
    return _host_numpy_p.bind(*args, host=_NumpyHost(host, avals), result_avals=avals)


def _in_default_environment(host, *values):
    with _fpenv.default():
        return host(*values)


class _NumpyHost:
    """``host`` on NumPy operands, its results as NumPy arrays of the declared types (hashable by identity, as a
    primitive parameter must be)."""

    def __init__(self, host, avals):
        self.host, self.avals = host, avals

    def __call__(self, *values):
        return [np.asarray(o, dtype=a.dtype).reshape(a.shape) for o, a in zip(self.host(*values), self.avals,
                                                                               strict=True)]


_skipped = threading.local()  # .bodies: ids of the maps' bodies met by _intermediate_shardings (JAX recurses)


def _intermediate_shardings(jaxpr):
    """JAX's ``dispatch.get_intermediate_shardings``, and a spmdsim map's mesh by its specs, as JAX names a
    shard_map's (a map over a concrete mesh: the program runs on its devices). A map's body is not looked into
    (JAX's recursion reaches it through this function): what runs there, a nested map or a jit, runs in the
    simulator, on no device of the program's."""
    if _map.map_observer is not None:  # spmdsim compare: the plain lowering (see _lowering)
        return _jax_intermediate_shardings(jaxpr)
    skipped = _skipped.__dict__.setdefault("bodies", set())
    if id(jaxpr) in skipped:
        return []
    bodies = [eqn.params["jaxpr"] for eqn in jaxpr.eqns if eqn.primitive is spmdsim_map_p]
    ids = {id(b) for body in bodies for b in (body, getattr(body, "jaxpr", body))} - skipped
    skipped.update(ids)
    try:
        out = list(_jax_intermediate_shardings(jaxpr))
    finally:
        skipped.difference_update(ids)
    for eqn in jaxpr.eqns:
        if eqn.primitive is not spmdsim_map_p or _runtime.current_lane() is not None:
            continue
        params = eqn.params
        mesh = params.get("mesh") if params["api"] == "shard_map" else _placement.map_mesh(params)
        if not isinstance(mesh, jax.sharding.Mesh):
            continue
        try:
            shardings = _shardings_on(mesh, (*params["in_specs"], *params["out_specs"]))
        except Exception:  # noqa: BLE001 - a spec JAX does not take: the program names no mesh for it
            continue
        info = _internals.jax_dispatch.SourceInfo(eqn.source_info, eqn.primitive.name)
        out.extend((s, info) for s in shardings)
    return out


_jax_intermediate_shardings = _internals.jax_dispatch.get_intermediate_shardings
if os.environ.get("SPMDSIM_SHARDED_LOWERING", "1") != "0":  # issue 39 (docs/jax_programs.md); "0": the plain callback
    _internals.jax_dispatch.get_intermediate_shardings = _intermediate_shardings
    mlir.register_lowering(spmdsim_map_p, _lowering)
else:
    mlir.register_lowering(spmdsim_map_p, _plain_lowering)
