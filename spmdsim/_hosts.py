"""Hosts: a multi-process JAX job, simulated.

- A **host** (JAX's *process*) runs the whole program and owns ``L`` local devices. With ``H`` hosts there are
  ``N = H * L`` global devices, numbered host-major: global device ``d = h * L + l`` lives on host ``h`` (JAX's
  process-major order). ``spmdsim.device_count()`` and ``spmdsim.devices()`` are global,
  ``local_device_count()`` and ``local_devices()`` this host's, ``process_index()`` and ``process_count()``
  are JAX's.
- A top-level ``pmap`` or ``shard_map`` made by the hosts is **one global call**: the k-th mapped call of every
  host meet; each host passes its *process-local data* (pmap: arrays whose mapped axis is its local device count
  ``L``; shard_map: the part of each global array that its devices hold, as
  ``jax.make_array_from_process_local_data`` takes it); every device of every host runs the function,
  collectives and ``axis_index`` span the global devices, and each host gets its own devices' outputs. A host
  that finished, or made a different call, is reported as a deadlock or mismatch naming the hosts.
- Reports and traces name the host of every device: ``host 1 device 5 [i=5]``.

Hosts run either as threads of one process (:func:`run_hosts`, for tests and notebooks) or as processes started
by ``mpiexec`` (``spmdsim run --hosts H``; see :mod:`spmdsim._transport`). Both run the same protocol
(:mod:`spmdsim._host_world`): the results are bit for bit those of one process with the same devices.
"""
from __future__ import annotations

import atexit
import math
import threading
from typing import Any, Callable, Sequence

from spmdsim import _runtime

__all__ = ["current", "layout", "process_index", "process_count", "local_devices", "run_hosts", "local_mesh",
           "mpi_host"]

class _Local(threading.local):
    host = None  # the Host of a spoofed host thread; a class default: no exception to catch when unset


_local = _Local()
_process_host = None                 # the Host of this process under MPI


def current():
    """The :class:`~spmdsim._host_world.Host` this code runs on, or None outside a multi-host run: a device's
    (its world's), a spoofed host thread's, or this MPI process's."""
    lane = _runtime.current_lane()
    if lane is not None:
        host = lane.world.host
        if host is not None:
            return host
    host = _local.host
    return host if host is not None else _process_host


def layout() -> tuple[int, int] | None:
    """``(H, L)``: the host count and local device count, or None outside a multi-host run."""
    host = current()
    return None if host is None else (host.count, host.local)


def process_index() -> int:
    """This host's index, ``0 <= process_index() < process_count()`` (``jax.process_index()``); 0 with one host."""
    host = current()
    return 0 if host is None else host.index


def process_count() -> int:
    """The number of hosts (``jax.process_count()``); 1 outside a multi-host run."""
    host = current()
    return 1 if host is None else host.count


def local_devices() -> list:
    """This host's virtual devices (``jax.local_devices()``): global devices ``h * L`` to ``h * L + L - 1``."""
    from spmdsim import _devices
    devices = _devices.devices()
    host = current()
    return devices if host is None else devices[host.devices.start:host.devices.stop]


def local_mesh(axes: Sequence[tuple[Any, int]], what: str = "the mesh") -> tuple:
    """This host's part of a global mesh ``axes`` ((name, size) pairs, row-major over the global devices): the
    same names with the extents its devices cover, ``L`` devices in all. Process-local data is laid out over this
    box exactly as global data over the mesh (JAX's ``make_array_from_process_local_data``).

    Raises ValueError when the mesh does not span every host's devices, or a host's devices do not form a box of
    the mesh (then process-local data would not be an array)."""
    axes = tuple(axes)
    host = current()
    if host is None:
        return axes
    total = math.prod(s for _, s in axes)
    if total != host.count * host.local:
        raise ValueError(f"{what} has {total} devices, but a multi-host call spans every host's devices: "
                         f"{host.count} hosts x {host.local} local devices = {host.count * host.local}. Build it "
                         f"from spmdsim.devices() (all of them).")
    return host_box(axes, host.local, what)


def host_box(axes: Sequence[tuple[Any, int]], per_host: int, what: str = "the mesh") -> tuple:
    """The box of the mesh ``axes`` that a run of ``per_host`` consecutive devices (row-major) covers, the same
    for every host: its axes with their extents. ValueError when such a run is not a box."""
    sizes = [s for _, s in axes]
    extents, inner = [1] * len(sizes), 1
    for k in range(len(sizes) - 1, -1, -1):
        if per_host % (inner * sizes[k]) == 0:
            extents[k], inner = sizes[k], inner * sizes[k]
            continue
        if per_host % inner or sizes[k] % (per_host // inner):
            raise ValueError(f"{what} ({', '.join(f'{n}={s}' for n, s in axes)}) does not give each host a box of "
                             f"devices: a host's {per_host} devices are not a block of the mesh, so its "
                             f"process-local data would not be an array. Reorder the mesh axes so that the "
                             f"leading axis runs over hosts.")
        extents[k], inner = per_host // inner, per_host
        break
    return tuple((name, e) for (name, _), e in zip(axes, extents, strict=True))


def run_hosts(count: int, fn: Callable, *args, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` once per host, as a multi-host JAX job would run its script on every host,
    and return the hosts' results in host order.

    With ``count`` hosts and ``N = spmdsim.device_count()`` virtual devices, each host owns ``N // count`` local
    devices; inside ``fn``, ``spmdsim.process_index()`` is the host's index, and every top-level ``pmap`` or
    ``shard_map`` is one global call over the devices of all hosts (see :mod:`spmdsim._hosts`).

    Spoofed (the default): each host is a thread of this process. Under ``mpiexec -n count`` (this process
    started by MPI, ``mpi4py`` installed): this process is host ``MPI rank`` and runs ``fn`` once, the other
    processes run the other hosts; the results of every host are gathered, so both ways return the same list.

    Raises:
      ValueError: ``count`` does not divide the device count, or ``run_hosts`` inside a multi-host run.
      The error of the first host (in host order) whose ``fn`` raised, with a note naming the host; a mapped
      call made by only some hosts is a CollectiveDeadlockError, different calls a CollectiveMismatchError.
    """
    from spmdsim import _devices, _host_world, _transport

    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"run_hosts: the host count must be a positive int, got {count!r}.")
    if current() is not None and _process_host is None:
        raise ValueError("run_hosts: already inside a multi-host run; hosts do not nest.")
    n = _devices.device_count() if _process_host is None else _process_host.count * _process_host.local
    if n % count:
        raise ValueError(f"run_hosts: {n} virtual devices cannot be split evenly over {count} hosts. Use a device "
                         f"count that {count} divides: spmdsim.set_device_count({count * max(1, n // count)}).")
    if _process_host is not None or _transport.launched_by_mpi():
        host = mpi_host(n)
        if host.count != count:
            raise ValueError(f"run_hosts({count}, ...) in an MPI job of {host.count} processes: start it with "
                             f"mpiexec -n {count}.")
        return host.run_program(fn, args, kwargs)
    return _host_world.run_spoofed(count, n // count, fn, args, kwargs)


def mpi_host(n_devices: int):
    """This process as a host of an MPI job (started once): rank ``r`` of ``size`` processes, ``n_devices //
    size`` local devices. ValueError when ``size`` does not divide ``n_devices``."""
    global _process_host
    if _process_host is None:
        from spmdsim import _host_world, _transport
        transport = _transport.MPITransport()
        if n_devices % transport.count:
            raise ValueError(f"{n_devices} virtual devices cannot be split evenly over {transport.count} MPI "
                             f"processes (hosts); give a device count that {transport.count} divides.")
        _process_host = _host_world.Host(transport.index, transport.count, n_devices // transport.count, transport)
        _process_host.watch_main_thread()
        atexit.register(_process_host.exit_process)
    return _process_host
