"""What ``spmdsim run`` changes in JAX for the duration of a script.

- ``jax.pmap`` becomes :func:`spmdsim.jax.pmap` (so ``from jax import pmap`` in the script gets it too).
- ``jax.shard_map`` (and the legacy ``jax.experimental.shard_map.shard_map``) builds functions that JAX
  traces and spmdsim runs (:mod:`spmdsim.jax.integration._shard_map`), and ``jax.jit`` evaluates a jitted program that
  contains a map with spmdsim (the parts outside the maps once, on global values); other jitted functions are
  JAX's.
- JAX's CPU platform gets as many devices as spmdsim has virtual devices (``jax_num_cpu_devices``, set before
  JAX's backend starts), so ``jax.devices()``, ``jax.local_devices()``, ``jax.device_count()`` and
  ``jax.local_device_count()`` agree with spmdsim, and the devices are real JAX devices: ``jax.device_put``,
  ``jax.sharding.Mesh``, ``jax.make_mesh`` and ``flax.jax_utils.replicate`` accept them. They only *hold*
  arrays; every value of a mapped function is computed by spmdsim.
"""
from __future__ import annotations

import contextlib
import functools
import sys

import spmdsim

__all__ = ["patched_jax", "use_cpu_devices"]


def use_cpu_devices(n: int) -> bool:
    """Give JAX ``n`` CPU devices (and make the CPU its platform) if its backend has not started yet. Returns
    whether JAX now has ``n`` devices; when the backend already started with another count, says so on
    stderr (spmdsim still simulates ``n`` devices; only ``jax.devices()`` reports the others)."""
    import jax
    from spmdsim.jax._internals import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", n)
    if jax.device_count() == n:
        return True
    print(f"spmdsim: JAX's backend started before spmdsim could give it {n} CPU devices; jax.devices() reports "
          f"{jax.device_count()}. spmdsim simulates {n} devices regardless. To make them agree, set "
          f"jax.config.update('jax_num_cpu_devices', {n}) before JAX is first used.", file=sys.stderr)
    return False


@contextlib.contextmanager
def patched_jax(n_devices: int, executor: str = "threads", host=None, eager: str = "once", replace=None):
    """For the block: ``jax.pmap`` is :func:`spmdsim.jax.pmap` (with ``executor``; an eager ``jax.shard_map``'s body
    runs as ``eager`` says: once, as in JAX, or once per device), ``jax.jit`` spmdsim's and ``jax.shard_map``
    spmdsim's; spmdsim has ``n_devices`` virtual devices, and so has JAX's CPU platform (see
    :func:`use_cpu_devices`). ``replace``: which of ``"pmap"``, ``"jit"``, ``"shard_map"`` to replace (default all;
    ``("shard_map",)`` is a program that imports spmdsim's shard_map and keeps JAX's jit). ``host``: this process's
    :class:`~spmdsim.hosts.host.Host` in a multi-host run (see :func:`host_replacements`)."""
    import jax

    import spmdsim.jax as sjax

    from spmdsim.jax._internals import jax_shard_map, jax_shard_map_build

    from spmdsim.jax.integration import _shard_map

    use_cpu_devices(n_devices)
    pmap = sjax.pmap if executor == "threads" else functools.wraps(sjax.pmap)(
        functools.partial(sjax.pmap, executor=executor))
    build = jax_shard_map_build

    @functools.wraps(build)
    def shard_map(f, **kwargs):
        return _shard_map.simulated(build(_shard_map.with_axis_errors(f), **kwargs), executor, eager)

    replaced = [(owner, name, value) for owner, name, value, key in (
        (jax, "pmap", pmap, "pmap"), (jax, "jit", _shard_map.jit_for(executor), "jit"),
        (jax_shard_map, "_shard_map", shard_map, "shard_map")) if replace is None or key in replace]
    if host is not None:
        replaced += host_replacements(host)
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in replaced]
    from spmdsim.runtime import _devices

    # In a multi-host job a host's JAX puts new arrays on its first local device.
    default_device = contextlib.nullcontext() if host is None else \
        jax.default_device(jax.devices()[host.devices.start])
    with (spmdsim.set_device_count(n_devices) if host is None else contextlib.nullcontext()), \
            _devices.devices_hint("--devices {n} (spmdsim run's option)"), default_device:
        for owner, name, value in replaced:
            setattr(owner, name, value)
        try:
            yield
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)


def host_replacements(host) -> list[tuple]:
    """What a multi-host run changes in JAX, as (owner, name, value): ``jax.process_index()`` and
    ``process_count()`` are the host's; ``jax.local_devices()`` are its ``L`` devices among the global
    ``jax.devices()`` (host-major: host h has devices h*L to h*L + L - 1) and ``jax.local_device_count()`` is
    ``L``; ``jax.distributed.initialize`` checks its arguments against the run and does nothing else; the
    functions of ``jax.experimental.multihost_utils`` move data between the hosts with spmdsim's collectives
    (:mod:`spmdsim.multihost`)."""
    import jax
    import jax.experimental.multihost_utils as mhu
    import numpy as np

    from spmdsim import multihost

    all_devices = jax.devices

    def process_index(backend=None):
        return host.index

    def process_count(backend=None):
        return host.count

    def process_indices(backend=None):
        return list(range(host.count))

    def local_devices(process_index=None, backend=None, host_id=None):
        index = host.index if process_index is None and host_id is None else \
            process_index if process_index is not None else host_id
        return all_devices(backend)[index * host.local:(index + 1) * host.local]

    def local_device_count(backend=None):
        return host.local

    state = {"initialized": False}

    def initialize(coordinator_address=None, num_processes=None, process_id=None, local_device_ids=None,
                   cluster_detection_method=None, initialization_timeout=300, heartbeat_timeout_seconds=100,
                   shutdown_timeout_seconds=300, coordinator_bind_address=None, slice_index=None,
                   partition_index=None):
        """``jax.distributed.initialize`` under spmdsim's hosts: the hosts already run; checks the arguments."""
        if state["initialized"]:
            raise RuntimeError("jax.distributed.initialize should only be called once.")
        if coordinator_address is not None and not isinstance(coordinator_address, str):
            raise TypeError(f"coordinator_address must be a string such as '127.0.0.1:1234', got "
                            f"{coordinator_address!r}.")
        if num_processes is not None and num_processes != host.count:
            raise ValueError(f"jax.distributed.initialize(num_processes={num_processes}), but spmdsim runs "
                             f"{host.count} hosts (spmdsim run --hosts {host.count}).")
        if process_id is not None and process_id != host.index:
            raise ValueError(f"jax.distributed.initialize(process_id={process_id}) on host {host.index}: the "
                             f"process ids are the hosts' indices (MPI ranks) 0..{host.count - 1}.")
        if local_device_ids is not None:
            ids = [local_device_ids] if isinstance(local_device_ids, int) else list(local_device_ids)
            if len(ids) != host.local or len(set(ids)) != len(ids):
                raise ValueError(f"local_device_ids={local_device_ids!r}: each host has {host.local} devices "
                                 f"(spmdsim run --devices N --hosts H gives N/H each).")
        state["initialized"] = True

    def is_initialized():
        return state["initialized"]

    def shutdown():
        state["initialized"] = False

    local_ids = set(host.devices)

    def spans_hosts(x) -> bool:
        """A jax.Array with shards on other hosts' devices: in JAX not fully addressable, a global array."""
        return isinstance(x, jax.Array) and not {d.id for d in x.sharding.device_set} <= local_ids

    def process_allgather(in_tree, tiled: bool = False):
        """``multihost_utils.process_allgather``: a global array's value as it is (every host has it), every
        process-local leaf gathered from every host (:func:`spmdsim.multihost.process_allgather`)."""
        leaves, treedef = jax.tree_util.tree_flatten(in_tree)
        local = [k for k, x in enumerate(leaves) if not spans_hosts(x)]
        if len(local) < len(leaves) and not tiled:
            raise ValueError("Gathering global non-fully-addressable arrays only supports tiled=True")  # JAX's
        gathered = dict(zip(local, multihost.process_allgather([np.asarray(leaves[k]) for k in local], tiled=tiled)
                            if local else [], strict=True))
        return jax.tree_util.tree_unflatten(treedef, [gathered[k] if k in gathered else np.asarray(x)
                                                      for k, x in enumerate(leaves)])

    def leaves_of(fn):
        def wrapped(in_tree, *args, **kwargs):
            leaves, treedef = jax.tree_util.tree_flatten(in_tree)
            out = fn([np.asarray(x) for x in leaves], *args, **kwargs)
            return None if out is None else jax.tree_util.tree_unflatten(treedef, out)
        wrapped.__name__ = wrapped.__qualname__ = fn.__name__
        wrapped.__doc__ = fn.__doc__
        return wrapped

    def make_array_from_process_local_data(sharding, local_data, global_shape=None):
        """``jax.make_array_from_process_local_data`` under spmdsim's hosts: this host's part of a global array
        (laid over its box of the mesh), gathered from every host through spmdsim's collectives into the global
        array, which every host's JAX holds whole (in JAX the other hosts' shards are not addressable)."""
        return jax.device_put(_global_from_process_local(sharding, np.asarray(local_data), global_shape), sharding)

    return [(jax, "process_index", process_index), (jax, "process_count", process_count),
            (jax, "make_array_from_process_local_data", make_array_from_process_local_data),
            (jax, "process_indices", process_indices), (jax, "local_devices", local_devices),
            (jax, "local_device_count", local_device_count), (jax.distributed, "initialize", initialize),
            (jax.distributed, "is_initialized", is_initialized), (jax.distributed, "shutdown", shutdown),
            (mhu, "process_allgather", process_allgather),
            (mhu, "broadcast_one_to_all", leaves_of(multihost.broadcast_one_to_all)),
            (mhu, "assert_equal", leaves_of(multihost.assert_equal)),
            (mhu, "sync_global_devices", multihost.sync_global_devices)]


def _global_from_process_local(sharding, local_data, global_shape):
    """The global array of which ``local_data`` is this host's part, by a ``NamedSharding`` over every host's
    devices (see :func:`spmdsim.runtime._hosts.local_mesh`).

    Raises:
      NotImplementedError: a sharding other than a NamedSharding, or a mesh whose devices are not in id order.
      ValueError: ``global_shape`` is not the shape the hosts' parts make.
    """

    from spmdsim.runtime import _hosts

    from spmdsim.primitives import _sharding

    from spmdsim import multihost
    from spmdsim.jax.integration._specs import _spec_dims

    mesh = getattr(sharding, "mesh", None)
    if mesh is None or not hasattr(sharding, "spec"):
        raise NotImplementedError(f"make_array_from_process_local_data under spmdsim's hosts takes a NamedSharding, "
                                  f"got {type(sharding).__name__}.")
    if [d.id for d in mesh.devices.flat] != list(range(mesh.devices.size)):
        raise NotImplementedError("make_array_from_process_local_data under spmdsim's hosts needs a mesh of the "
                                  "devices in id order (jax.make_mesh gives one).")
    if global_shape is not None and tuple(global_shape) == local_data.shape:
        return local_data  # every host passed the whole array
    axes = tuple(zip(mesh.axis_names, mesh.devices.shape))
    dims = _spec_dims(sharding.spec, local_data.ndim)
    blocks = _sharding.split(local_data, dims, _hosts.local_mesh(axes, "the sharding's mesh"))
    whole = _sharding.assemble(multihost.process_allgather(blocks, tiled=True), dims, axes)
    if global_shape is not None and tuple(global_shape) != whole.shape:
        raise ValueError(f"make_array_from_process_local_data: global_shape {tuple(global_shape)}, but the hosts' "
                         f"local data of shape {local_data.shape} make an array of shape {whole.shape}.")
    return whole
