"""spmdsim's map as a JAX primitive, so that every JAX transformation composes with it.

``spmdsim_map`` is shard_map's semantics with spmdsim as its implementation: a per-device body (a closed jaxpr)
run once per device of a mesh (``axes``: (name, size) pairs), each input split into blocks by its spec, each
output assembled from the blocks by its spec (see :mod:`spmdsim.primitives._sharding`). ``pmap`` is the one-axis case
whose body squeezes the unit axis of each mapped block and expands each output (exactly how JAX 0.10 builds
``pmap`` from ``shard_map``).

Why a primitive: when ``spmdsim.jax.pmap`` is called with JAX tracers (under ``grad``, ``vjp``, ``jvp``,
``linearize``, ``vmap``, ``jit``, ``cond``, ``scan``, ``checkpoint``, ``custom_jvp``, or inside another map)
it binds this primitive, and the transformation rules below rewrite the *body* jaxpr the way JAX's own
shard_map rules do; the values are still computed by the simulator, never by XLA:

- JVP: the map of the body's JVP (tangents laid out like their primals).
- Partial evaluation (``linearize``/``vjp``, and remat's policy-driven form): the map splits into a map of the
  known part, which also returns the residuals (one block per device, on a new leading axis split over every
  mesh axis), and a map of the unknown part that takes them back.
- Transpose: the map of the body's transpose. With ``check_vma=False`` (pmap) JAX's convention holds: the
  cotangent of an output replicated along some mesh axes is divided by their size, and the cotangent of an
  input replicated along some axes is psummed over them (so ``grad`` of a pmapped ``psum`` is N).
- Batching (``vmap`` outside the map): the map of the batched body, the batch axis first and not split.
- Lowering (``jit``, and control flow that XLA runs): a host callback into the simulator.

Evaluated by spmdsim's own interpreter (a map nested in a mapped body) the primitive runs as a nested mapped
call in the devices' threads (thread executor) or widens the device axis (vectorized executor).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Hashable

import jax
import numpy as np
from spmdsim.jax._internals import core, source_info_util
from jax.extend import core as ext_core
from spmdsim.jax._internals import pp
from spmdsim.jax._internals import weakref_lru_cache
from spmdsim.jax._internals import ad, batching, mlir
from spmdsim.jax._internals import pe

from spmdsim.runtime import _buffers, _hosts, _runtime, _threads

from spmdsim.primitives import _sharding
from spmdsim.primitives._batch import Batch, Diverged, current_batch
from spmdsim.runtime._values import broadcast_view, read_only
from spmdsim.runtime import _axes
from spmdsim.jax.evaluation import _dtypes, _unreduced
from spmdsim.jax import _internals
from spmdsim.jax.integration import _placement
from spmdsim.jax.compiled import _compiled  # noqa: F401  (the compiled form of jaxprs installs itself: _registry.COMPILED)
from spmdsim.jax.evaluation._interpreter import PER_DEVICE, REFERENCE, Executor, Vectorized, higher_order
from spmdsim.jax.integration._placement import PMAP_AXIS, local_mesh, map_out_shardings

__all__ = ["spmdsim_map_p", "simulate", "threads_run", "global_avals", "map_params", "to_numpy", "to_jax", "EXECUTORS"]

EXECUTORS = ("threads", "vectorized", "reference")

spmdsim_map_p = core.Primitive("spmdsim_map")
spmdsim_map_p.multiple_results = True


# -- values in and out ------------------------------------------------------------------------------------

def to_numpy(x) -> np.ndarray:
    """A JAX value (or NumPy/Python value) as the NumPy array the simulator computes with: PRNG keys as their
    uint32 key data, dtypes canonicalised as JAX does on input (float64 -> float32 while x64 is off); an array
    with an unreduced sharding as its partials (:class:`._unreduced.Unreduced`)."""
    if type(x) is _unreduced.Unreduced:
        return x
    if isinstance(x, jax.Array) and _unreduced.has_unreduced(x):
        return _unreduced.from_jax(x, to_numpy)
    dtype = getattr(x, "dtype", None)
    if dtype is not None and _dtypes.is_key(dtype):
        return np.asarray(jax.random.key_data(x))
    arr = np.asarray(x)
    canonical = jax.dtypes.canonicalize_dtype(arr.dtype)
    return arr if arr.dtype == canonical else arr.astype(canonical)


def to_jax(arr: np.ndarray, aval, sharding=None) -> jax.Array:
    """A result as the ``jax.Array`` JAX hands back: with ``sharding`` (a ``jax.sharding.Sharding``: where JAX
    puts a map's output), the committed array of that sharding, each device's shard cut from ``arr``; without
    (JAX names no devices for it), what ``jnp.asarray(arr)`` gives where it is called (JAX's default device,
    uncommitted; under ``jax.set_mesh``, the mesh, replicated and committed). Weak types as ``aval``'s, keys
    wrapped back. Both through the batched device put that ``jax.device_put`` ends in, prepared once per
    placement and shape (~4 µs for one device, ~30 µs for eight, instead of ~17 and ~120); ``jnp.asarray`` and
    ``jax.device_put`` for dtypes JAX converts and after any failure of that internal entry point."""
    global _fast_put
    if _unreduced.has_unreduced(sharding) and not _dtypes.is_key(aval.dtype):  # each device's partial
        out = _unreduced.to_jax(_unreduced.Unreduced(
            _unreduced.promote(arr, _unreduced.sharding_axes(sharding)), _unreduced.sharding_axes(sharding)),
            aval, sharding)
        if out is not None:
            return out
        sharding = None
    arr = _unreduced.total(arr)
    key = _dtypes.is_key(aval.dtype)
    key_sharding = sharding
    if key and sharding is not None and hasattr(sharding, "spec"):  # the key data's trailing axes: not split
        spec = tuple(sharding.spec)
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(
            *spec, *(None,) * (arr.ndim - len(spec))))
    if _fast_put is ...:
        _fast_put = _fast_put_like()
    if _fast_put is not None and arr.dtype == jax.dtypes.canonicalize_dtype(arr.dtype) \
            and arr.dtype != jax.dtypes.float0:
        try:
            out = _fast_put(arr, aval.weak_type and not key, sharding)
        except Exception:  # noqa: BLE001 - an internal API: use the public ones from now on
            _fast_put = None
        else:
            return jax.random.wrap_key_data(out, impl=aval.dtype) if key else out
    if key:
        out, sharding = jax.random.wrap_key_data(arr, impl=aval.dtype), key_sharding  # (a key array's own rank)
    else:
        out = jax.numpy.asarray(arr)
        if aval.weak_type:  # as the fast put makes it (jnp.asarray of an array makes no weak type)
            from spmdsim.jax._internals import lax_internal
            out = lax_internal._convert_element_type(out, weak_type=True)
    return out if sharding is None else jax.device_put(out, sharding)


def _fast_put_like():
    """``put(arr, weak_type, sharding)``: the batched device put that ``jax.device_put`` ends in, of a NumPy
    array of a dtype JAX keeps: committed to ``sharding``, one shard per device (``jax.device_put``'s order and
    indices); with ``sharding=None``, placed as ``jnp.asarray`` places it in the caller's context (learnt from
    one ``jnp.asarray`` per context: default device and context mesh). What depends only on the placement and
    the shape is worked out once. None where JAX's internal entry point is missing."""
    try:
        from spmdsim.jax._internals import config, device_context, xla_client
        batched_device_put = xla_client.batched_device_put
        default_device = config.default_device
    except Exception:  # noqa: BLE001
        return None
    contexts: dict = {}  # (default device, context mesh) -> (sharding, committed) of jnp.asarray's results there
    placements: dict = {}  # sharding -> (its devices, {(shape, dtype, weak type): (aval, each device's index)})

    def put(arr: np.ndarray, weak_type: bool, sharding):
        committed = True
        if sharding is None:
            context = (default_device.value, device_context.value)
            found = contexts.get(context)
            if found is None:
                found = contexts[context] = _context_placement(*context)
            sharding, committed = found
        prepared = placements.get(sharding)
        if prepared is None:
            if len(placements) > 256:
                placements.clear()
            prepared = placements[sharding] = (list(sharding._addressable_device_assignment), {})
        devices, shapes = prepared
        signature = (arr.shape, arr.dtype, weak_type)
        found = shapes.get(signature)
        if found is None:
            if len(shapes) > 1024:
                shapes.clear()
            indices = None if sharding.is_fully_replicated else \
                tuple(sharding.addressable_devices_indices_map(arr.shape).values())
            found = shapes[signature] = (core.ShapedArray(arr.shape, arr.dtype, weak_type=weak_type), indices)
        shaped, indices = found
        shards = [arr] * len(devices) if indices is None else [arr[index] for index in indices]
        return batched_device_put(shaped, sharding, shards, devices, committed)
    return put


def _context_placement(default_device, mesh) -> tuple:
    """``(sharding, committed)`` of what ``jnp.asarray`` makes in this context, worked out without making one (a
    jitted conversion dispatched from inside a jitted call of the same signature is refused by JAX as recursive):
    under ``jax.set_mesh``, the mesh, replicated, committed; else ``jax_default_device`` (a device or a platform)
    or JAX's first device, uncommitted."""
    if mesh is not None and not mesh.empty:
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), True
    if default_device is None or isinstance(default_device, str):
        default_device = jax.devices(default_device)[0]
    return jax.sharding.SingleDeviceSharding(default_device), False


_fast_put = ...  # not yet known: made at the first result


def _numpy_spec(spec: tuple, aval) -> tuple:
    """A spec for the NumPy form of a value: PRNG key data has one more, unsplit, axis."""
    return spec + ((),) if _dtypes.is_key(aval.dtype) else spec


# -- the simulation ----------------------------------------------------------------------------------------

# spmdsim compare's end-to-end check: ``map_observer(args, params, outs)`` after each top-level map call (None: off).
map_observer = None


def simulate(args: list[np.ndarray], **params) -> list[np.ndarray]:
    """Run the map on NumPy values: split the inputs into blocks, evaluate the body per device (threads) or all
    devices at once (vectorized), assemble the outputs. ``params``: the map's (see :func:`map_params`); ``ex`` is
    the evaluating executor when the map is an equation of an outer body (a nested map), None at top level;
    ``check_replicated``: raise ReplicationError when an output replicated along some mesh axes differs between
    the devices along them."""
    if _unreduced.map_needs_partials(params["in_specs"], params["out_specs"]):
        return _simulate_partials(args, **params)
    outs = simulate_map(args, **params, observe=False)
    if map_observer is not None and _runtime.current_lane() is None and current_batch() is None:
        map_observer(args, params, outs)
    return outs


def _simulate_partials(args: list, *, jaxpr, axes, in_specs, out_specs, **params) -> list:
    """A map with unreduced in_specs or out_specs (see :mod:`._unreduced`): the plain map of a body that takes
    and returns the partials stacked on a leading dimension split over the unreduced axes."""
    body, plain_in, plain_out = _partials_body(jaxpr, in_specs, out_specs, axes, params.get("mesh"),
                                               params.get("check_vma", False))
    stacked = [_unreduced.promote(x, _unreduced.partials_axes(s, axes)) if _unreduced.spec_unreduced(s)
               else _unreduced.total(x) for x, s in zip(args, in_specs, strict=True)]
    outs = simulate(stacked, jaxpr=body, axes=axes, in_specs=plain_in, out_specs=plain_out, **params)
    return [_unreduced.Unreduced(o, _unreduced.partials_axes(s, axes)) if _unreduced.spec_unreduced(s) else o
            for o, s in zip(outs, out_specs, strict=True)]


@weakref_lru_cache
def _partials_body(jaxpr, in_specs: tuple, out_specs: tuple, axes: tuple, mesh, check_vma: bool):
    return _unreduced.partials_body(jaxpr, in_specs, out_specs, axes, lambda fun, avals: _trace(
        fun, avals, axes, "a map of unreduced values", mesh, check_vma))


def simulate_map(args: list[np.ndarray], *, jaxpr, axes, in_specs, out_specs, executor: str, api: str,
                 ex: Executor | None = None, check_replicated: bool = False, observe: bool = False,
                 **_params) -> list[np.ndarray]:
    """:func:`simulate`, unobserved (``observe``: for the thread executor's run, see :class:`_ThreadsRun`)."""
    if isinstance(ex, Vectorized) or (ex is None and executor == "vectorized"):
        return _simulate_vectorized(args, jaxpr, axes, *_numpy_specs(jaxpr, in_specs, out_specs), ex, api)
    mine = _global_arrays(api, axes, ex)
    if mine is not None:  # shard_map across hosts: global arrays in and out
        in_specs, out_specs = _numpy_specs(jaxpr, in_specs, out_specs)
        body_ex = REFERENCE if executor == "reference" else PER_DEVICE
        inner, consts = jaxpr.jaxpr, jaxpr.consts
        blocks = [_split(x, spec, axes)[mine] for x, spec in zip(args, in_specs, strict=True)]
        per_device = _runtime.run_mapped(lambda i: body_ex.eval_jaxpr(inner, consts, [b[i] for b in blocks]), axes,
                                         is_device=True, name=body_name(jaxpr))
        stacked = _every_hosts_blocks([np.stack([outs[k] for outs in per_device]) for k in range(len(out_specs))])
        if check_replicated:
            _check_replicated(stacked, out_specs, axes, api)
        return [_sharding.assemble(o, spec, axes) for o, spec in zip(stacked, out_specs, strict=True)]
    local = axes if _runtime.current_lane() is not None else local_mesh(axes)  # top level: this host's box
    return threads_run(jaxpr, in_specs, out_specs, axes, local, executor, api)(args, check_replicated, observe)


@weakref_lru_cache
def threads_run(jaxpr, in_specs: tuple, out_specs: tuple, axes: tuple, local: tuple, executor: str,
                api: str) -> "_ThreadsRun":
    """The thread executor's run of the map of body ``jaxpr`` over ``axes`` with the map's specs (``local``: the
    devices this host runs, the mesh itself outside a multi-host run), made once per body, specs and mesh."""
    return _ThreadsRun(jaxpr, in_specs, out_specs, axes, local, executor, api)


_SPREAD_BYTES = 1 << 20  # an output block this large is copied with the device off the lanes' CPU (_threads.spread)
_COPIED_BYTES = 1 << 16  # output blocks from this size on are copied into the output by their device
# Primitives whose rules call BLAS, and callbacks (user code may): a body without them leaves BLAS's threads alone.
_BLAS_PRIMITIVES = {"dot_general", "conv_general_dilated", "pure_callback", "io_callback", "debug_callback",
                    "cholesky", "lu", "qr", "householder_product", "eigh", "eig", "svd", "triangular_solve",
                    "symmetric_product", "schur", "hessenberg", "tridiagonal", "tridiagonal_solve"}


def body_name(jaxpr) -> str | None:
    """The mapped function's name, from the body's debug info (``step`` for a map of ``def step``: a trace names
    each device's call after it); None when JAX does not know it. ``jaxpr``: a (closed) jaxpr or its debug info."""
    info = getattr(jaxpr, "jaxpr", jaxpr)
    info = getattr(info, "debug_info", info)
    name = getattr(info, "func_name", None)
    return name if isinstance(name, str) and name and name != "<unknown>" else None


@weakref_lru_cache
def _calls_blas(jaxpr) -> bool:
    """Whether evaluating ``jaxpr`` (sub-jaxprs included) may call BLAS."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _BLAS_PRIMITIVES:
            return True
        if any(_calls_blas(sub) for sub in ext_core.jaxprs_in_params(eqn.params)):
            return True
    return False


class _ThreadsRun:
    """One map on the thread executor, with what depends only on its body, specs and mesh worked out once (the
    body's compiled evaluator, the device count): called with the NumPy inputs, it splits them into blocks,
    runs the body once per device, each in its own thread, and assembles the NumPy outputs."""

    def __init__(self, jaxpr, in_specs: tuple, out_specs: tuple, axes: tuple, local: tuple, executor: str, api: str):
        self.in_specs, self.out_specs = _numpy_specs(jaxpr, in_specs, out_specs)
        self.axes, self.local, self.api = axes, local, api
        self.consts = jaxpr.consts
        self.evaluate = (REFERENCE if executor == "reference" else PER_DEVICE).evaluator(jaxpr.jaxpr)
        self.count = math.prod(size for _, size in local)
        self.params = dict(jaxpr=jaxpr, in_specs=in_specs, out_specs=out_specs, axes=axes, executor=executor, api=api)
        # outputs split along their leading dimension by the one mesh axis (pmap's out_axes=0): each device copies
        # its block into the output itself, in its own thread, while it is in cache (no concatenation after)
        self.stacked_outputs = []
        for k, (aval, spec) in enumerate(zip(jaxpr.out_avals, self.out_specs)):
            expected = PER_DEVICE.expected(aval)
            if len(local) == 1 and spec and spec[0] == (local[0][0],) and not any(spec[1:]) and expected is not None \
                    and not _dtypes.is_key(aval.dtype) and aval.size * np.dtype(expected[1]).itemsize >= _COPIED_BYTES:
                self.stacked_outputs.append((k, expected))
        self.blas = _calls_blas(jaxpr.jaxpr)
        self.name = body_name(jaxpr)

    def __call__(self, args: list, check_replicated: bool = False, observe: bool = True) -> list[np.ndarray]:
        local = self.local
        blocks = [_split(x, spec, local) for x, spec in zip(args, self.in_specs, strict=True)]
        device_args = list(zip(*blocks)) if blocks else [()] * self.count  # views, made in C
        evaluate, consts = self.evaluate, self.consts
        stacked = [(k, _buffers.empty((self.count, *shape), dtype)) for k, (shape, dtype) in self.stacked_outputs]

        def device(i: int) -> list:
            outs = evaluate(consts, device_args[i])
            for k, whole in stacked:
                with _threads.spread() if outs[k].nbytes >= _SPREAD_BYTES else contextlib.nullcontext():
                    whole[i] = outs[k]
            return outs
        per_device = _runtime.run_mapped(device, self.axes, is_device=True, blas=self.blas, name=self.name)
        if check_replicated:
            every = [np.stack([outs[k] for outs in per_device]) for k in range(len(self.out_specs))]
            _check_replicated(every, self.out_specs, local, self.api)
        ready = {k: whole.reshape(whole.shape[0] * whole.shape[1], *whole.shape[2:]) for k, whole in stacked}
        outs = [ready[k] if k in ready else _assemble([device[k] for device in per_device], spec, local)
                for k, spec in enumerate(self.out_specs)]
        if observe and map_observer is not None and _runtime.current_lane() is None:
            map_observer(args, self.params, outs)
        return outs


def _global_arrays(api: str, axes: tuple, ex) -> slice | None:
    """A top-level ``shard_map`` in a multi-host run takes and returns *global* arrays, as ``jax.Array``s are in a
    multi-process JAX job (JAX traces it with their global shapes): the slice of the mesh's devices that this host
    runs, or None for any other map (pmap takes process-local data: see :func:`._placement.local_mesh`)."""
    if api != "shard_map" or isinstance(ex, Vectorized) or _runtime.current_lane() is not None \
            or local_mesh(axes) == axes:
        return None
    host = _hosts.current()
    return slice(host.devices.start, host.devices.stop)


def _every_hosts_blocks(stacked: list[np.ndarray]) -> list[np.ndarray]:
    """Every device's blocks, from this host's ``(L, *block)`` stacks: gathered from every host (one step of the
    hosts, the blocks moved unchanged), ``(N, *block)`` in global device order. In JAX the other hosts' shards of
    a global array are not addressable; in spmdsim every host's JAX holds all of them (see the README)."""
    from spmdsim import multihost
    return multihost.process_allgather(stacked, tiled=True)


@weakref_lru_cache
def _numpy_specs(jaxpr, in_specs: tuple, out_specs: tuple) -> tuple[list, list]:
    """The specs of the NumPy forms of the map's inputs and outputs (see :func:`_numpy_spec`), once per body."""
    return ([_numpy_spec(s, a) for s, a in zip(in_specs, jaxpr.in_avals, strict=True)],
            [_numpy_spec(s, a) for s, a in zip(out_specs, jaxpr.out_avals, strict=True)])


def _split(x: np.ndarray, spec: tuple, axes) -> np.ndarray:
    """Every device's block of ``x``, stacked and read-only (:func:`spmdsim.primitives._sharding.split`); for one mesh axis
    and a spec that splits the leading dimension or nothing (pmap's layouts), one reshape or broadcast."""
    if len(axes) == 1 and not any(spec[1:]):
        n = axes[0][1]
        if not spec or not spec[0]:
            return broadcast_view(x, (n, *x.shape))
        if spec[0] == (axes[0][0],):
            return read_only(x.reshape(n, x.shape[0] // n, *x.shape[1:]))
    return read_only(_sharding.split(x, spec, axes))


def _assemble(blocks: list, spec: tuple, axes) -> np.ndarray:
    """The output of the devices' ``blocks`` by ``spec`` (:func:`spmdsim.primitives._sharding.assemble`): replicated,
    device 0's block (not a stack of every device's copy); one mesh axis splitting the leading dimension, one
    concatenation."""
    if not any(spec):
        return blocks[0]
    if len(axes) == 1 and spec[0] == (axes[0][0],) and not any(spec[1:]):
        return np.concatenate(blocks)
    return _sharding.assemble(np.stack(blocks), spec, axes)


def _assemble_stacked(stacked: np.ndarray, spec: tuple, axes) -> np.ndarray:
    """:func:`_assemble` of every device's block stacked on a leading axis (the vectorized executor's)."""
    if len(axes) == 1 and spec and spec[0] == (axes[0][0],) and not any(spec[1:]):
        return stacked.reshape(stacked.shape[0] * stacked.shape[1], *stacked.shape[2:])
    return _sharding.assemble(stacked, spec, axes)


def _check_replicated(stacked: list[np.ndarray], out_specs, axes, api: str) -> None:
    from spmdsim.runtime._axes import Frame, frames_label
    from spmdsim.errors import ReplicationError
    for k, (o, spec) in enumerate(zip(stacked, out_specs, strict=True)):
        differ = _sharding.replicas_differ(o, spec, axes)
        if differ:
            labels = [frames_label([Frame(name, size, c, (), True) for (name, size), c in
                                    zip(axes, np.unravel_index(d, [s for _, s in axes]), strict=True)]) for d in differ]
            raise ReplicationError(f"{api}: output {k} is replicated by its out_axes/out_specs but not the same on "
                                   f"every device: {', '.join(labels)} differ from the device at coordinate 0. "
                                   f"Reduce it first (e.g. psum/pmean over the axis) or give it a mapped out_axes.")


def _simulate_vectorized(args, jaxpr, axes, in_specs, out_specs, ex: "Vectorized | None",
                         api: str = "pmap") -> list[np.ndarray]:
    if ex is None and _runtime.current_lane() is None and _hosts.layout() is not None:
        # a multi-host run: this host's devices, their collectives across hosts
        mine = _global_arrays(api, axes, ex)
        local = axes if mine is not None else local_mesh(axes)
        stacked = [_sharding.split(x, spec, local) for x, spec in zip(args, in_specs, strict=True)]
        if mine is not None:
            stacked = [x[mine] for x in stacked]
        outs = _hosts.current().run_vectorized(
            lambda batch: Vectorized(batch).eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, stacked), axes)
        if mine is not None:
            outs = _every_hosts_blocks(list(outs))
        return [_sharding.assemble(o, spec, local) for o, spec in zip(outs, out_specs, strict=True)]
    if ex is None:  # top level: the mesh alone
        stacked = [_split(x, spec, axes) for x, spec in zip(args, in_specs, strict=True)]
        outs = Vectorized(Batch(axes)).eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, stacked)
        return [_assemble_stacked(o, spec, axes) for o, spec in zip(outs, out_specs, strict=True)]
    # Nested in a vectorized body: every outer device's value splits into the inner mesh's blocks; the device
    # axis widens to (outer devices x inner devices), row-major.
    outer = ex.batch
    inner = math.prod(size for _, size in axes)
    stacked = []
    for x, spec in zip(args, in_specs, strict=True):
        blocks = _sharding.split(x, ((),) + spec, axes)  # (inner, outer, *block)
        stacked.append(np.swapaxes(blocks, 0, 1).reshape(ex.n * inner, *blocks.shape[2:]))
    ids = None if outer.ids is None else (outer.ids[:, None] * inner + np.arange(inner)).ravel()
    try:
        batch = Batch(outer.axes + tuple(axes), ids, outer.comm)
        outs = Vectorized(batch).eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, stacked)
    except Diverged as d:  # a collective over an outer axis: the outer devices, as the outer batch counts
        raise Diverged([(np.unique(group // inner), *call) for group, *call in d.calls]) from None
    result = []
    for o, spec in zip(outs, out_specs, strict=True):
        per_inner = np.swapaxes(o.reshape(ex.n, inner, *o.shape[1:]), 0, 1)
        result.append(_sharding.assemble(per_inner, ((),) + spec, axes))
    return result


@higher_order("spmdsim_map")
def _nested(ex: Executor, *args, **params):
    """A map inside a mapped body, evaluated by spmdsim: a nested mapped call (at the top level of a program,
    the map itself, as a ``shard_map`` equation there is)."""
    return simulate(list(args), ex=None if ex is PER_DEVICE and _runtime.current_lane() is None else ex, **params)


# -- the primitive -----------------------------------------------------------------------------------------

def _impl(*args, **params):
    outs = simulate([to_numpy(x) for x in args], **params)
    return [to_jax(o, aval, sharding) for o, aval, sharding in
            zip(outs, global_avals(params), map_out_shardings(params, args), strict=True)]


def global_avals(params) -> list:
    """The map's output avals: the body's, assembled by the out_specs (plain arrays, no varying axes); in a
    multi-host run, this host's part of them (its process-local data), except a shard_map's (global arrays).
    A shard_map over a mesh with Explicit axes types them as JAX's shard_map does (``float32[8@X]``: JAX's
    ``unshard_aval``, the sharding on the context's abstract mesh or the map's)."""
    axes = params["axes"]
    mesh = params.get("mesh")
    if params.get("api") != "shard_map":
        return _global_avals(params["jaxpr"], params["out_specs"], local_mesh(axes))
    if mesh is None or jax.sharding.AxisType.Explicit not in getattr(mesh, "axis_types", ()):
        return _global_avals(params["jaxpr"], params["out_specs"], axes)
    from spmdsim.jax._internals import mesh_lib
    return _global_avals(params["jaxpr"], params["out_specs"], axes, mesh, params.get("check_vma", True),
                         mesh_lib.get_abstract_mesh())


@weakref_lru_cache
def _global_avals(jaxpr, out_specs: tuple, axes: tuple, mesh=None, check_vma: bool = True, _context=None) -> list:
    """(``_context``: the abstract mesh JAX's typing reads, for the cache.)"""
    if mesh is None:
        return [_unshard(aval, spec, axes) for aval, spec in zip(jaxpr.out_avals, out_specs, strict=True)]
    out = []
    for aval, dims in zip(jaxpr.out_avals, out_specs, strict=True):
        spec = jax.sharding.PartitionSpec(*(None if not names else names[0] if len(names) == 1 else names
                                            for names in dims), unreduced=_unreduced.spec_unreduced(dims),
                                          reduced=_unreduced.spec_reduced(dims))
        try:
            typed = core.unshard_aval(mesh, check_vma, spec, aval)
        except Exception:  # noqa: BLE001 - a type JAX's rule does not take: the plain array
            typed = None
        plain = _unshard(aval, dims, axes)
        out.append(typed if typed is not None and typed.shape == plain.shape else plain)
    return out


def _unshard(aval, spec, axes):
    return core.ShapedArray(_sharding.global_shape(aval.shape, spec, axes), aval.dtype, weak_type=aval.weak_type)


def _abstract_eval(*avals, jaxpr, axes, **params):
    names = [name for name, _ in axes]
    return global_avals({"jaxpr": jaxpr, "axes": axes, **params}), \
        core.filter_named_axis_effects(jaxpr.effects, names)


spmdsim_map_p.def_impl(_impl)
spmdsim_map_p.def_effectful_abstract_eval(_abstract_eval)


class _axis_env:
    """The map's named axes bound while a body is traced or transformed (collectives need their sizes); for a
    shard_map's body also JAX's context for it: the mesh with those axes manual, and ``check_vma``."""

    def __init__(self, axes, mesh=None, check_vma: bool = False):
        self.named = list(axes)  # an unnamed pmap axis too: the transpose psums over it
        self.mesh, self.check_vma = mesh, check_vma

    def __enter__(self):
        import contextlib
        self.stack = contextlib.ExitStack()
        self.stack.enter_context(core.extend_axis_env_nd(self.named))
        if self.mesh is not None:
            from spmdsim.jax._internals import config, mesh_lib
            manual_types = {n: jax.sharding.AxisType.Manual for n, _ in self.named}
            manual = self.mesh.abstract_mesh.update_axis_types(manual_types)
            self.stack.enter_context(mesh_lib.use_abstract_mesh(manual))
            self.stack.enter_context(config._check_vma(self.check_vma))
        return self

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)


def _stacked_spec(axes, ndim: int, spmd: tuple = ()) -> tuple:
    """The spec of a per-device value carried out of a map: a new leading axis split over every mesh axis, less
    those of an enclosing ``vmap(..., spmd_axis_name=...)`` (which splits the batch axis it adds: JAX's
    ``_all_mesh_names_except_spmd``)."""
    return (tuple(name for name, _ in axes if name not in spmd),) + ((),) * ndim


def _spmd_names() -> tuple:
    """The mesh axes that enclosing ``vmap(..., spmd_axis_name=...)``s split their batch axes over."""
    return tuple(getattr(core.get_axis_env(), "spmd_axis_names", ()) or ())


def _trace(fun, avals, axes, debug_name: str = "spmdsim_map", mesh=None, check_vma=False) -> core.ClosedJaxpr:
    """``fun`` traced on ``avals`` with the map's axes bound (see :class:`_axis_env`); the jaxpr has no
    constants."""
    with _axis_env(axes, mesh, check_vma):
        closed = jax.make_jaxpr(fun)(*avals)
    if closed.consts:
        raise AssertionError(f"spmdsim bug: {debug_name} traced with constants")
    return closed


# -- JVP ---------------------------------------------------------------------------------------------------

def _jvp(primals, tangents, *, jaxpr, in_specs, out_specs, axes, **params):
    nonzeros = [type(t) is not ad.Zero for t in tangents]
    with _axis_env(axes, params.get("mesh"), params["check_vma"]):
        jvp_jaxpr, out_nonzeros = ad.jvp_jaxpr(jaxpr, nonzeros, instantiate=False)
    nz_tangents = [t for t, nz in zip(tangents, nonzeros, strict=True) if nz]
    n_out = len(out_specs)
    outs = spmdsim_map_p.bind(
        *primals, *nz_tangents, jaxpr=jvp_jaxpr, axes=axes,
        in_specs=(*in_specs, *(s for s, nz in zip(in_specs, nonzeros, strict=True) if nz)),
        out_specs=(*out_specs, *(s for s, nz in zip(out_specs, out_nonzeros, strict=True) if nz)), **params)
    primals_out, nz_tangents_out = outs[:n_out], iter(outs[n_out:])
    tangents_out = [next(nz_tangents_out) if nz else ad.Zero(core.typeof(p).to_tangent_aval())
                    for p, nz in zip(primals_out, out_nonzeros, strict=True)]
    return primals_out, tangents_out


ad.primitive_jvps[spmdsim_map_p] = _jvp


# -- partial evaluation ------------------------------------------------------------------------------------

def _with_stacked_residuals(known: core.ClosedJaxpr, n_res: int, axes, mesh=None, check_vma=False):
    """``known`` with each of its last ``n_res`` outputs (residuals) given a leading unit axis, so that they
    leave the map stacked per device."""
    def fun(*args):
        outs = core.eval_jaxpr(known.jaxpr, known.consts, *args)
        split = len(outs) - n_res
        return [*outs[:split], *(jax.lax.expand_dims(r, (0,)) for r in outs[split:])]
    return _trace(fun, known.in_avals, axes, mesh=mesh, check_vma=check_vma)


def _with_unstacked_residuals(unknown: core.ClosedJaxpr, n_res: int, axes, mesh=None, check_vma=False):
    """``unknown`` taking its first ``n_res`` inputs (residuals) with the leading unit axis added above."""
    def fun(*args):
        res = [jax.lax.squeeze(r, (0,)) for r in args[:n_res]]
        return core.eval_jaxpr(unknown.jaxpr, unknown.consts, *res, *args[n_res:])
    avals = [a.update(shape=(1, *a.shape)) for a in unknown.in_avals[:n_res]] + list(unknown.in_avals[n_res:])
    return _trace(fun, avals, axes, mesh=mesh, check_vma=check_vma)


@weakref_lru_cache
def _split_known(jaxpr, unknowns: tuple, axes: tuple, mesh, check_vma: bool, spmd: tuple = ()):
    """The known and unknown halves of a body (residuals stacked per device), once per body and mask."""
    with _axis_env(axes, mesh, check_vma):
        known, unknown, out_unknowns, res_avals = pe.partial_eval_jaxpr_nounits(jaxpr, unknowns, instantiate=False)
    n_res = len(res_avals)
    return (_with_stacked_residuals(known, n_res, axes, mesh, check_vma),
            _with_unstacked_residuals(unknown, n_res, axes, mesh, check_vma),
            tuple(out_unknowns), tuple(_stacked_spec(axes, len(a.shape), spmd) for a in res_avals))


def _partial_eval(trace, *tracers, jaxpr, in_specs, out_specs, axes, **params):
    unknowns = tuple(not t.pval.is_known() for t in tracers)
    known, unknown, out_unknowns, res_specs = _split_known(jaxpr, unknowns, axes, params.get("mesh"),
                                                           params["check_vma"], _spmd_names())
    known_out_specs = tuple(s for s, u in zip(out_specs, out_unknowns, strict=True) if not u)
    known_outs = spmdsim_map_p.bind(
        *(t.pval.get_known() for t, u in zip(tracers, unknowns, strict=True) if not u), jaxpr=known, axes=axes,
        in_specs=tuple(s for s, u in zip(in_specs, unknowns, strict=True) if not u),
        out_specs=(*known_out_specs, *res_specs), **params)
    known_values, residuals = known_outs[:len(known_out_specs)], known_outs[len(known_out_specs):]
    unknown_params = dict(params, jaxpr=unknown, axes=axes,
                          in_specs=(*res_specs, *(s for s, u in zip(in_specs, unknowns, strict=True) if u)),
                          out_specs=tuple(s for s, u in zip(out_specs, out_unknowns, strict=True) if u))
    in_tracers = [*map(trace.new_instantiated_const, residuals),
                  *(trace.instantiate_const(t) for t, u in zip(tracers, unknowns, strict=True) if u)]
    out_tracers = [pe.JaxprTracer(trace, pe.PartialVal.unknown(a), None) for a in global_avals(unknown_params)]
    effects = core.filter_named_axis_effects(unknown.effects, [name for name, _ in axes])
    eqn = pe.new_eqn_recipe(trace, in_tracers, out_tracers, spmdsim_map_p, unknown_params, effects,
                            source_info_util.current())
    for t in out_tracers:
        t.recipe = eqn
    known_iter, unknown_iter = iter(known_values), iter(out_tracers)
    return [next(unknown_iter) if u else next(known_iter) for u in out_unknowns]


pe.custom_partial_eval_rules[spmdsim_map_p] = _partial_eval


def _partial_eval_custom(saveable, unks_in, inst_in, eqn):
    """Remat's policy-driven partial evaluation (``jax.checkpoint`` around a map): the same split, on
    equations."""
    params = dict(eqn.params)
    jaxpr, axes, mesh, check_vma = params.pop("jaxpr"), params["axes"], params.get("mesh"), params["check_vma"]
    in_specs, out_specs = params.pop("in_specs"), params.pop("out_specs")
    with _axis_env(axes, mesh, check_vma):
        known, staged, unks_out, inst_out, n_res = pe.partial_eval_jaxpr_custom(
            jaxpr.jaxpr, unks_in, inst_in, False, False, saveable)
    known, staged = pe.close_jaxpr(known), pe.close_jaxpr(staged)
    res_avals = staged.in_avals[:n_res]
    known = _with_stacked_residuals(known, n_res, axes, mesh, check_vma)
    staged = _with_unstacked_residuals(staged, n_res, axes, mesh, check_vma)
    res_specs = tuple(_stacked_spec(axes, len(a.shape), _spmd_names()) for a in res_avals)
    ins_known = [v for v, u in zip(eqn.invars, unks_in, strict=True) if not u]
    outs_known = [v for v, u in zip(eqn.outvars, unks_out, strict=True) if not u]
    ins_staged = [v for v, inst in zip(eqn.invars, inst_in, strict=True) if inst]
    outs_staged = [v for v, inst in zip(eqn.outvars, inst_out, strict=True) if inst]
    known_params = dict(params, jaxpr=known, out_specs=(*(s for s, u in zip(out_specs, unks_out, strict=True)
                                                             if not u), *res_specs),
                        in_specs=tuple(s for s, u in zip(in_specs, unks_in, strict=True) if not u))
    residuals = [core.Var(a) for a in global_avals(known_params)[len(outs_known):]]
    staged_params = dict(params, jaxpr=staged, out_specs=tuple(s for s, i in zip(out_specs, inst_out, strict=True)
                                                               if i),
                         in_specs=(*res_specs, *(s for s, i in zip(in_specs, inst_in, strict=True) if i)))
    names = [name for name, _ in axes]
    eqn_known = pe.new_jaxpr_eqn(ins_known, [*outs_known, *residuals], spmdsim_map_p, known_params,
                                 core.filter_named_axis_effects(known.effects, names), eqn.source_info, eqn.ctx)
    eqn_staged = pe.new_jaxpr_eqn([*residuals, *ins_staged], outs_staged, spmdsim_map_p, staged_params,
                                  core.filter_named_axis_effects(staged.effects, names), eqn.source_info, eqn.ctx)
    new_inst = [x for x, inst in zip(eqn.invars, inst_in, strict=True) if type(x) is core.Var and not inst]
    return eqn_known, eqn_staged, unks_out, inst_out, new_inst + residuals


pe.partial_eval_jaxpr_custom_rules[spmdsim_map_p] = _partial_eval_custom


# -- transpose ---------------------------------------------------------------------------------------------

def _unmentioned(spec, axes, spmd: tuple = ()) -> tuple:
    """The mesh axes a spec replicates a value over (its unreduced axes are not, nor those an enclosing
    ``vmap(..., spmd_axis_name=...)`` splits its batch over: JAX's ``_unmentioned2``)."""
    mentioned = {name for names in spec for name in names} | _unreduced.spec_unreduced(spec) | set(spmd)
    return tuple((name, size) for name, size in axes if name not in mentioned)


@weakref_lru_cache
def _transposed_body(jaxpr, undefined: tuple, nonzero_cts: tuple, in_specs: tuple, out_specs: tuple, axes: tuple,
                     check_vma: bool, mesh, spmd: tuple = ()):
    """The body of the transposed map: residual blocks and cotangent blocks in, the cotangent blocks of the
    linear inputs out (psummed over the axes they are replicated along, under pmap's convention). Once per
    body and mask."""
    res_avals = [a for a, u in zip(jaxpr.in_avals, undefined, strict=True) if not u]
    ct_avals = [_ct_aval(a) for a, nz in zip(jaxpr.out_avals, nonzero_cts, strict=True) if nz]
    linear_avals = [_ct_type(a) for a, u in zip(jaxpr.in_avals, undefined, strict=True) if u]

    def transposed(*res_and_cts):
        res, ct_blocks = iter(res_and_cts[:len(res_avals)]), iter(res_and_cts[len(res_avals):])
        linear = iter(linear_avals)
        primals = [ad.UndefinedPrimal(next(linear)) if u else next(res) for u in undefined]
        ct_in = [next(ct_blocks) if nz else ad.Zero(_ct_aval(a))
                 for a, nz in zip(jaxpr.out_avals, nonzero_cts, strict=True)]
        ct_out = ad.backward_pass(jaxpr.jaxpr, False, jaxpr.consts, primals, ct_in)
        out = []
        for ct, spec, u in zip(ct_out, in_specs, undefined, strict=True):
            if not u:
                continue
            if type(ct) is ad.Zero:
                ct = ad.instantiate_zeros(ct)
            replicated = [name for name, _ in _unmentioned(_unreduced.ct_spec(spec), axes, spmd)]  # pmap's axis too
            if not check_vma and replicated and ct.dtype != jax.dtypes.float0:
                ct = jax.lax.psum(ct, tuple(replicated))
            out.append(ct)
        return out

    return _trace(transposed, [*res_avals, *ct_avals], axes, "the transpose of spmdsim_map", mesh, check_vma)


def _ct_aval(aval):
    """A cotangent's type: the tangent's, reduced and unreduced axes swapped (JAX's ``to_ct_aval``)."""
    return aval.to_ct_aval() if hasattr(aval, "to_ct_aval") else aval.to_tangent_aval()


def _ct_type(aval):
    """``aval`` with its reduced and unreduced axes swapped (the type of a linear input's cotangent)."""
    mat = getattr(aval, "mat", None)
    if mat is None or not (getattr(mat, "unreduced", None) or getattr(mat, "reduced", None)):
        return aval
    return aval.update(manual_axis_type=mat.to_ct_mat())


def _transpose(cts, *args, jaxpr, in_specs, out_specs, axes, check_vma, **params):
    undefined = tuple(ad.is_undefined_primal(x) for x in args)
    ct_specs = tuple(map(_unreduced.ct_spec, out_specs))  # a cotangent's spec: unreduced and reduced swapped
    spmd = _spmd_names()
    if not check_vma:  # pmap's convention: an output replicated along some axes got their devices' cotangents
        cts = [ct if type(ct) is ad.Zero or ct.dtype == jax.dtypes.float0 or not _unmentioned(spec, axes, spmd)
               else ct / math.prod(size for _, size in _unmentioned(spec, axes, spmd))
               for ct, spec in zip(cts, ct_specs, strict=True)]
    nonzero_cts = tuple(type(ct) is not ad.Zero for ct in cts)
    body = _transposed_body(jaxpr, undefined, nonzero_cts, in_specs, out_specs, axes, check_vma, params.get("mesh"),
                            spmd)
    outs = spmdsim_map_p.bind(
        *(x for x, u in zip(args, undefined, strict=True) if not u),
        *(ct for ct, nz in zip(cts, nonzero_cts, strict=True) if nz), jaxpr=body, axes=axes,
        in_specs=(*(s for s, u in zip(in_specs, undefined, strict=True) if not u),
                  *(s for s, nz in zip(ct_specs, nonzero_cts, strict=True) if nz)),
        out_specs=tuple(_unreduced.ct_spec(s) for s, u in zip(in_specs, undefined, strict=True) if u),
        check_vma=check_vma, **params)
    outs = iter(outs)
    return [next(outs) if u else None for u in undefined]


ad.primitive_transposes[spmdsim_map_p] = _transpose


# -- batching (vmap outside the map) -------------------------------------------------------------------------

def _batch(axis_data, args, dims, *, jaxpr, in_specs, out_specs, axes, **params):
    """JAX's shard_map batching rule (``_shard_map_batch``): the batch axis first and not split, or, under
    ``vmap(..., spmd_axis_name=...)`` naming axes of this map, split over those mesh axes (each device batches
    its block of it)."""
    batched = [d is not None for d in dims]
    args = [batching.moveaxis(x, d, 0) if b else x for x, d, b in zip(args, dims, batched, strict=True)]
    spmd = getattr(axis_data, "spmd_name", None)
    spmd = tuple(spmd) if spmd is not None else None
    sizes = dict(axes)
    if spmd is not None and all(name in sizes for name in spmd):
        used = {name for spec in in_specs for names in spec for name in names}
        if set(spmd) & used:
            raise ValueError("vmap spmd_axis_name cannot appear in shard_map in_specs")
        inner_data = batching.AxisData(axis_data.name, axis_data.size // math.prod(sizes[n] for n in spmd),
                                       axis_data.spmd_name, axis_data.explicit_mesh_axis)
        with _axis_env(axes, params.get("mesh"), params["check_vma"]):  # batched inputs vary along spmd's axes
            batched_jaxpr, out_dims = batching.batch_jaxpr2(jaxpr, inner_data, tuple(0 if b else None
                                                                                     for b in batched))
        used = {name for spec, d in zip(out_specs, out_dims, strict=True) for names in spec for name in names}
        if set(spmd) & used:
            raise ValueError("vmap spmd_axis_name cannot appear in shard_map out_specs")
        out_specs = tuple(s if d is None else _inserted(s, d, spmd) for s, d in zip(out_specs, out_dims, strict=True))
        outs = spmdsim_map_p.bind(
            *args, jaxpr=batched_jaxpr, axes=axes,
            in_specs=tuple((spmd,) + s if b else s for s, b in zip(in_specs, batched, strict=True)),
            out_specs=out_specs, **params)
        return outs, list(out_dims)
    lead = ((),)
    with _axis_env(axes, params.get("mesh"), params["check_vma"]):
        batched_jaxpr, out_batched = batching.batch_jaxpr(jaxpr, axis_data, batched, instantiate=False)
    outs = spmdsim_map_p.bind(
        *args, jaxpr=batched_jaxpr, axes=axes,
        in_specs=tuple(lead + s if b else s for s, b in zip(in_specs, batched, strict=True)),
        out_specs=tuple(lead + s if b else s for s, b in zip(out_specs, out_batched, strict=True)), **params)
    return outs, [0 if b else None for b in out_batched]


def _inserted(spec, d: int, names: tuple):
    """``spec`` with a dimension split over ``names`` inserted at ``d`` (JAX's ``pxla.batch_spec``)."""
    dims = tuple(spec)
    out = dims[:d] + (names,) + dims[d:]
    return _unreduced.make_spec(out, _unreduced.spec_unreduced(spec), _unreduced.spec_reduced(spec))


batching.fancy_primitive_batchers[spmdsim_map_p] = _batch


# -- lowering (jit): a host callback into the simulator ----------------------------------------------------

def _callback_form(*args, **params):
    out_avals = global_avals(params)
    keys_in = [_dtypes.is_key(core.typeof(x).dtype) for x in args]
    keys_out = [_dtypes.is_key(a.dtype) for a in out_avals]
    args = [jax.random.key_data(x) if k else x for x, k in zip(args, keys_in, strict=True)]
    shapes = [jax.ShapeDtypeStruct((*a.shape, *_dtypes.key_data_shape(a.dtype)), np.uint32) if k
              else jax.ShapeDtypeStruct(a.shape, a.dtype) for a, k in zip(out_avals, keys_out, strict=True)]

    def host(*values):
        return simulate([to_numpy(v) for v in values], **params)

    effects = params["jaxpr"].effects
    if effects:  # a body with side effects (host callbacks): XLA must neither drop the map nor reorder it
        from spmdsim.jax._internals import effects as jax_effects
        from jax.experimental import io_callback
        outs = io_callback(host, shapes, *args, ordered=bool(jax_effects.ordered_effects.filter_in(effects)))
    else:
        outs = jax.pure_callback(host, shapes, *args)
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
    mesh = _module_mesh(ctx, params)
    if mesh is None:
        return _plain_lowering(ctx, *args, **params)
    in_shardings = _shardings_on(mesh, params["in_specs"])
    out_shardings = _shardings_on(mesh, params["out_specs"])
    args = [_constrain(ctx, x, aval, s) for x, aval, s in zip(args, ctx.avals_in, in_shardings, strict=True)]
    outs = mlir.lower_fun(functools.partial(_sharded_callback_form, mesh=mesh), multiple_results=True)(
        ctx, *args, **params)
    return [_constrain(ctx, o, aval, s) for o, aval, s in zip(outs, ctx.avals_out, out_shardings, strict=True)]


def _module_mesh(ctx, params):
    """The map's mesh (abstract) when the jitted program being lowered spans its devices (a program on other
    devices, or inside a JAX shard_map's manual computation: None, the plain callback)."""
    from spmdsim.jax._internals import sharding_impls
    context = ctx.module_context.axis_context
    if type(context) is not sharding_impls.ShardingContext:
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
    from spmdsim.jax._internals import config
    if _dtypes.is_key(aval.dtype):
        aval = core.physical_aval(aval)
    if config.use_shardy_partitioner.value:
        proto = sharding._to_sdy_sharding(aval.ndim)
    else:
        proto = sharding._to_xla_hlo_sharding(aval.ndim).to_proto()
    return mlir.wrap_with_sharding_op(ctx, x, aval, proto)


def _sharded_callback_form(*args, mesh, **params):
    """:func:`_callback_form` with unreduced operands and results crossing as their stacked partials (JAX's
    shard_map stacks and unstacks them on the map's mesh)."""
    from spmdsim.jax._internals import jax_shard_map
    P = jax.sharding.PartitionSpec
    axes = params["axes"]
    in_specs, out_specs = params["in_specs"], params["out_specs"]
    if not _unreduced.map_needs_partials(in_specs, out_specs):
        return _callback_form(*args, **params)
    stacked_in = []
    for x, spec, sharding in zip(args, in_specs, _shardings_on(mesh, in_specs), strict=True):
        if _unreduced.spec_unreduced(spec):
            names = tuple(name for name, _ in _unreduced.partials_axes(spec, axes))
            x = jax_shard_map.shard_map(lambda block: block[None], mesh=mesh, in_specs=sharding.spec,
                                        out_specs=P(names, *_padded_parts(sharding.spec, x.ndim)), check_vma=False)(x)
        stacked_in.append(x)
    out_avals = global_avals(params)
    shapes = [jax.ShapeDtypeStruct((math.prod(n for _, n in _unreduced.partials_axes(s, axes)), *a.shape), a.dtype)
              if _unreduced.spec_unreduced(s) else jax.ShapeDtypeStruct(a.shape, a.dtype)
              for a, s in zip(out_avals, out_specs, strict=True)]

    # The body over the stacked partials, traced here (in the program's mesh context; the callback's thread has
    # none): the plain map the simulator runs on them, as :func:`_simulate_partials` does.
    with _no_mesh_context():
        body, plain_in, plain_out = _partials_body(params["jaxpr"], in_specs, out_specs, axes, params.get("mesh"),
                                                   params.get("check_vma", False))
    plain = {**params, "jaxpr": body, "in_specs": plain_in, "out_specs": plain_out}

    def host(*values):
        return [_unreduced.total(o) for o in simulate([to_numpy(v) for v in values], **plain)]

    outs = _host_call(host, shapes, stacked_in, params["jaxpr"].effects)
    result = []
    for o, spec, sharding in zip(outs, out_specs, _shardings_on(mesh, out_specs), strict=True):
        if _unreduced.spec_unreduced(spec):
            names = tuple(name for name, _ in _unreduced.partials_axes(spec, axes))
            o = jax_shard_map.shard_map(lambda block: block[0], mesh=mesh,
                                        in_specs=P(names, *_padded_parts(sharding.spec, o.ndim - 1)),
                                        out_specs=sharding.spec, check_vma=False)(o)
        result.append(o)
    return result


@contextlib.contextmanager
def _no_mesh_context():
    """No ``jax.set_mesh`` / ``use_abstract_mesh`` context (a map's body is traced in its own, see
    :class:`_axis_env`)."""
    from spmdsim.jax._internals import abstract_mesh_context_manager, device_context
    concrete = device_context.swap_local(None)
    abstract = abstract_mesh_context_manager.swap_local(None)
    try:
        yield
    finally:
        abstract_mesh_context_manager.set_local(abstract)
        device_context.set_local(concrete)


def _padded_parts(spec, ndim: int) -> tuple:
    parts = tuple(spec.partitions)
    return parts + (None,) * (ndim - len(parts))


def _host_call(host, shapes, args, effects):
    if effects:
        from spmdsim.jax._internals import effects as jax_effects
        from jax.experimental import io_callback
        return io_callback(host, shapes, *args, ordered=bool(jax_effects.ordered_effects.filter_in(effects)))
    return jax.pure_callback(host, shapes, *args)


def _intermediate_shardings(jaxpr):
    """JAX's ``dispatch.get_intermediate_shardings``, and a spmdsim map's mesh by its specs, as JAX names a
    shard_map's (a map over a concrete mesh: the program runs on its devices)."""
    out = list(_jax_intermediate_shardings(jaxpr))
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
if os.environ.get("SPMDSIM_SHARDED_LOWERING") == "1":  # issue 39, in progress: opt in (see the README)
    _internals.jax_dispatch.get_intermediate_shardings = _intermediate_shardings
    mlir.register_lowering(spmdsim_map_p, _lowering)
else:
    mlir.register_lowering(spmdsim_map_p, _plain_lowering)


def map_params(jaxpr, axes: tuple[tuple[Hashable, int], ...], in_specs, out_specs, *, check_vma: bool,
               executor: str, api: str, mesh=None) -> dict:
    """The primitive's parameters, checked. ``mesh``: the JAX mesh of a shard_map (its body is traced and
    transformed with those axes manual); None for pmap."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}.")
    if mesh is not None and getattr(jax.config, "jax_raise_on_ppermute_sort_diff", False):
        _check_ppermute_order(getattr(jaxpr, "jaxpr", jaxpr), tuple(name for name, _ in axes))
    return dict(jaxpr=jaxpr, axes=tuple(axes), in_specs=tuple(in_specs), out_specs=tuple(out_specs),
                check_vma=check_vma, executor=executor, api=api, mesh=mesh)


@weakref_lru_cache
def _check_ppermute_order(jaxpr, order: tuple) -> None:
    """JAX 0.11's ``jax_raise_on_ppermute_sort_diff`` (on by default): a ``ppermute`` over a tuple of mesh axes
    given in another order than the mesh's is a RuntimeError when JAX lowers the map (the devices are ranked in
    mesh order whatever the order given); spmdsim raises it when the map is made."""
    todo = [jaxpr]
    while todo:
        for eqn in todo.pop().eqns:
            names = eqn.params.get("axis_name") if eqn.primitive.name == "ppermute" else None
            if isinstance(names, tuple) and len(names) > 1:
                where = [order.index(n) for n in names if n in order]
                if where != sorted(where):
                    raise RuntimeError(
                        "Make sure that the axis_name passed to jax.lax.ppermute is in the same order as the "
                        "axis_names declared on the mesh. If you want to allow different order, you can disable "
                        "the check via `with jax.raise_on_ppermute_sort_diff(False):` context manager.")
            todo.extend(getattr(j, "jaxpr", j) for j in core.jaxprs_in_params(eqn.params))


# -- type checking (jax_enable_checks) ---------------------------------------------------------------------

def _effects(jaxpr, axes) -> set:
    """A map's effects: its body's, less the named-axis effects of the map's own axes (which it binds)."""
    return core.filter_named_axis_effects(jaxpr.effects, [name for name, _ in axes])


def _typecheck(_ctx_factory, *in_atoms, jaxpr, axes, in_specs, out_specs, check_vma, mesh=None, api="pmap",
               **_params):
    """``core.check_jaxpr``'s rule for a map equation (what ``jax_enable_checks`` runs on every jaxpr made): the
    operands have the global shapes and dtypes that the body's inputs and the in_specs give, the body is
    well typed with the map's named axes bound (for a shard_map's body also its mesh, those axes manual, and
    ``check_vma``: the context it was traced and transformed in), under ``check_vma`` no output varies along
    an axis its out_spec replicates it over; the result is the map's output avals and effects, as the
    abstract evaluation gives them."""
    if not len(in_atoms) == len(in_specs) == len(jaxpr.in_avals):
        raise core.JaxprTypeError(f"spmdsim_map has {len(in_atoms)} operands and {len(in_specs)} in_specs for a "
                                  f"body of {len(jaxpr.in_avals)} inputs")
    if len(out_specs) != len(jaxpr.out_avals):
        raise core.JaxprTypeError(f"spmdsim_map has {len(out_specs)} out_specs for a body of "
                                  f"{len(jaxpr.out_avals)} outputs")
    layout = axes if api == "shard_map" else local_mesh(axes)
    for k, (x, aval, spec) in enumerate(zip(in_atoms, jaxpr.in_avals, in_specs)):
        got = x.aval
        if len(spec) != len(aval.shape) or got.dtype != aval.dtype \
                or tuple(got.shape) != _sharding.global_shape(aval.shape, spec, layout):
            raise core.JaxprTypeError(f"spmdsim_map operand {k} of type {got.str_short(short_dtypes=True)} does not "
                                      f"match its body input {aval.str_short(short_dtypes=True)} split by the "
                                      f"in_spec {spec} over the axes {axes}")
    with _axis_env(axes, mesh, check_vma):
        core.check_jaxpr(jaxpr.jaxpr)
    if check_vma:
        for k, (aval, spec) in enumerate(zip(jaxpr.out_avals, out_specs)):
            varying = getattr(getattr(aval, "mat", None), "vur", frozenset())
            replicated = [name for name, _ in _unmentioned(spec, axes) if name in varying
                          and name not in _unreduced.spec_reduced(spec)]
            if replicated:
                raise core.JaxprTypeError(f"spmdsim_map output {k} of type {aval.str_short(short_dtypes=True)} "
                                          f"varies along {replicated}, which its out_spec {spec} replicates it over")
    return global_avals({"jaxpr": jaxpr, "axes": axes, "out_specs": out_specs, "api": api}), _effects(jaxpr, axes)


core.custom_typechecks[spmdsim_map_p] = _typecheck


# -- printing (make_jaxpr) ---------------------------------------------------------------------------------

def _shown_name(name):
    return PMAP_AXIS if isinstance(name, _runtime.Unnamed) else name


def _shown_spec(dims: tuple) -> jax.sharding.PartitionSpec:
    """A spec (a tuple of mesh axis names per dimension) as a PartitionSpec, without trailing unsplit
    dimensions (as jax.pmap writes its specs: ``P()``, ``P('i',)``, ``P(None, 'i')``)."""
    return _unreduced.partition_spec(dims, _shown_name)


def _shown_mesh(axes) -> str:
    """A pmap's mesh as jax.pmap's is printed: ``Mesh('i': 8, axis_types=(Auto,))``."""
    types = ", ".join("Auto" for _ in axes) + ("," if len(axes) == 1 else "")
    return "Mesh(" + "".join(f"'{_shown_name(name)}': {size}, " for name, size in axes) + f"axis_types=({types}))"


def _pp_params(pairs: list, context, settings) -> pp.Doc:
    """An equation's ``[key=value ...]``, laid out as JAX lays out parameters; a :class:`_Later` value is
    called for its Doc when its turn comes (variables are named in the order they are printed)."""
    docs = [pp.text(f"{key}=") + value.doc() if isinstance(value, _Later) else
            core.pp_kv_pair(key, value, context, settings) for key, value in pairs]
    return pp.group(pp.nest(2, pp.text("[") + pp.brk("") + pp.join(pp.brk(), docs)) + pp.brk("") + pp.text("]"))


def _pp_equation(outvars, name: str, params, invars, eqn, context, settings, name_stack=None) -> pp.Doc:
    """``outvars = name[params] invars``, with the annotations JAX's equations get (source line, name stack:
    the equation's unless given); ``params()`` gives the parameters' Doc, made after the results are named and
    before the operands are."""
    lhs = core.pp_vars(outvars, context, print_shapes=settings.print_shapes, is_binder=True)
    name_stack = eqn.source_info.name_stack if name_stack is None else name_stack
    rhs = [pp.text(name, annotation=f"[{name_stack}]" if settings.name_stack else None), params(),
           pp.text(" ") + core.pp_vars(invars, context)]
    if not outvars:
        return pp.concat(rhs)
    annotation = source_info_util.summarize(eqn.source_info) if settings.source_info else None
    return pp.concat([lhs, pp.text(" = ", annotation=annotation), *rhs])


class _Later:
    """A parameter's Doc, made when it is printed."""

    def __init__(self, doc):
        self.doc = doc


class _Skeleton:
    """What JAX's jaxpr printer reads of a jaxpr whose equations are printed separately."""

    def __init__(self, invars: list, outvars: list, effects):
        self.constvars, self.invars, self.outvars, self.effects = [], invars, outvars, effects


def _pp_rule(eqn, context, settings) -> pp.Doc:
    """A map equation printed as JAX 0.10 prints the program it stands for: a shard_map's as its ``shard_map``
    equation; a pmap's as jax.pmap's, a ``jit`` named ``_fun`` of a ``shard_map`` over a one-axis mesh (how
    JAX 0.10 builds pmap). The simulator's own parameters (``api``, ``executor``, ``axes``) are left out."""
    params = eqn.params
    axes = params["axes"]
    mesh = params.get("mesh")

    def shard_map():
        return _pp_params([("check_vma", params["check_vma"]),
                           ("in_specs", tuple(map(_shown_spec, params["in_specs"]))),
                           ("jaxpr", params["jaxpr"]),
                           ("mesh", mesh if mesh is not None else _shown_mesh(axes)),
                           ("newly_manual_axes", frozenset(_shown_name(name) for name, _ in axes)),
                           ("out_specs", tuple(map(_shown_spec, params["out_specs"])))], context, settings)

    if params.get("api") != "pmap":
        return _pp_equation(eqn.outvars, "shard_map", shard_map, eqn.invars, eqn, context, settings)
    # pmap: the jit's jaxpr has the equation's operands and results, named like them (as JAX names a jit's)
    inner_in, inner_out = [core.Var(x.aval) for x in eqn.invars], [core.Var(v.aval) for v in eqn.outvars]
    context.suggest_same_var_names(inner_in, eqn.invars)
    context.suggest_same_var_names(inner_out, eqn.outvars)

    def jit():
        def inner():
            return core.pp_jaxpr_skeleton(
                _Skeleton(inner_in, inner_out, eqn.effects),
                lambda: _pp_equation(inner_out, "shard_map", shard_map, inner_in, eqn, context, settings,
                                     name_stack=""),  # names inside a jit's jaxpr are relative to it
                context, settings)
        return _pp_params([("name", "_fun"), ("jaxpr", _Later(inner))], context, settings)

    return _pp_equation(eqn.outvars, "jit", jit, eqn.invars, eqn, context, settings)


core.pp_eqn_rules[spmdsim_map_p] = _pp_rule
