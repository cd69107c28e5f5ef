"""spmdsim's map as a JAX primitive, so that every JAX transformation composes with it.

``spmdsim_map`` is shard_map's semantics with spmdsim as its implementation: a per-device body (a closed jaxpr)
run once per device of a mesh (``axes``: (name, size) pairs), each input split into blocks by its spec, each
output assembled from the blocks by its spec (see :mod:`spmdsim.primitives._sharding`). ``pmap`` is the one-axis case
whose body squeezes the unit axis of each mapped block and expands each output (exactly how JAX 0.10 builds
``pmap`` from ``shard_map``).

Why a primitive: when ``spmdsim.jax.pmap`` is called with JAX tracers (under ``grad``, ``vjp``, ``jvp``,
``linearize``, ``vmap``, ``jit``, ``cond``, ``scan``, ``checkpoint``, ``custom_jvp``, or inside another map)
it binds this primitive, and its transformation rules (:mod:`._map_rules`) rewrite the *body* jaxpr the way JAX's
own shard_map rules do; the values are still computed by the simulator, never by XLA:

- JVP: the map of the body's JVP (tangents laid out like their primals).
- Partial evaluation (``linearize``/``vjp``, and remat's policy-driven form): the map splits into a map of the
  known part, which also returns the residuals (one block per device, on a new leading axis split over every
  mesh axis), and a map of the unknown part that takes them back.
- Transpose: the map of the body's transpose. With ``check_vma=False`` (pmap) JAX's convention holds: the
  cotangent of an output replicated along some mesh axes is divided by their size, and the cotangent of an
  input replicated along some axes is psummed over them (so ``grad`` of a pmapped ``psum`` is N).
- Batching (``vmap`` outside the map): the map of the batched body, the batch axis first and not split.
- Lowering (``jit``, and control flow that XLA runs): a host callback into the simulator (:mod:`._map_lowering`).

Evaluated by spmdsim's own interpreter (a map nested in a mapped body) the primitive runs as a nested mapped
call in the devices' threads (thread executor) or widens the device axis (vectorized executor).

This module: the primitive, its implementation (the values in and out, the simulation) and abstract evaluation,
and its parameters. The rules of the other two modules register themselves when imported (by :mod:`spmdsim.jax`).
"""
from __future__ import annotations

import contextlib
import math
from typing import Hashable

import jax
import numpy as np
from spmdsim.jax._internals import core
from spmdsim.jax._internals import weakref_lru_cache

from spmdsim.runtime import _buffers, _hosts, _runtime, _threads

from spmdsim.primitives import _sharding
from spmdsim.primitives._batch import Batch, Diverged, current_batch
from spmdsim.runtime._values import broadcast_view, read_only
from spmdsim.jax.evaluation import _dtypes, _jaxprs, _unreduced
from spmdsim.jax.compiled import _compiled  # noqa: F401  (the compiled form of jaxprs installs itself: _registry.COMPILED)
from spmdsim.jax.evaluation._interpreter import PER_DEVICE, REFERENCE, Executor, Vectorized, higher_order
from spmdsim.jax.integration._placement import local_mesh, map_out_shardings

__all__ = ["spmdsim_map_p", "simulate", "threads_run", "global_avals", "map_params", "to_numpy", "to_jax", "EXECUTORS"]

EXECUTORS = ("threads", "vectorized", "reference")

spmdsim_map_p = core.Primitive("spmdsim_map")
spmdsim_map_p.multiple_results = True
# JAX >= 0.12 expands a "hi" equation (one whose jaxpr parameter holds hi primitives, e.g. jnp.histogram's) into lo
# ones before lowering (``Primitive.is_high``, ``to_lojax``). A map is opaque to JAX's lowering, a host callback, and
# the simulator expands its body's hi equations itself (:mod:`spmdsim.jax.evaluation._lowered`): the map is hi only
# when its operands are.
spmdsim_map_p.is_high = lambda *avals, **params: any(getattr(a, "is_high", False) for a in avals)


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
_BLAS_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated", "pure_callback", "io_callback", "debug_callback",
                    "cholesky", "lu", "qr", "householder_product", "eigh", "eig", "svd", "triangular_solve",
                    "symmetric_product", "schur", "hessenberg", "tridiagonal", "tridiagonal_solve"})


def body_name(jaxpr) -> str | None:
    """The mapped function's name, from the body's debug info (``step`` for a map of ``def step``: a trace names
    each device's call after it); None when JAX does not know it. ``jaxpr``: a (closed) jaxpr or its debug info."""
    info = getattr(jaxpr, "jaxpr", jaxpr)
    info = getattr(info, "debug_info", info)
    name = getattr(info, "func_name", None)
    return name if isinstance(name, str) and name and name != "<unknown>" else None


def _calls_blas(jaxpr) -> bool:
    """Whether evaluating ``jaxpr`` (sub-jaxprs included) may call BLAS."""
    return _jaxprs.binds_any(jaxpr, _BLAS_PRIMITIVES)


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


def _trace(fun, avals, axes, debug_name: str = "spmdsim_map", mesh=None, check_vma=False) -> core.ClosedJaxpr:
    """``fun`` traced on ``avals`` with the map's axes bound (see :class:`_axis_env`); the jaxpr has no
    constants."""
    with _axis_env(axes, mesh, check_vma):
        closed = jax.make_jaxpr(fun)(*avals)
    if closed.consts:
        raise AssertionError(f"spmdsim bug: {debug_name} traced with constants")
    return closed


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
