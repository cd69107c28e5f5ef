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
by ``mpiexec`` (``spmdsim run --hosts H``; see :mod:`spmdsim.hosts.transport`). Both run the same protocol
(:mod:`spmdsim.hosts.host`): the results are bit for bit those of one process with the same devices.

**The seam.** This package is a backend of the core's one abstraction, the process group
(:mod:`spmdsim.runtime._process_group`), kept as torch.distributed keeps its ``ProcessGroup`` backends (gloo, MPI) behind
one interface: :class:`~spmdsim.hosts.host.Host` subclasses :class:`~spmdsim.runtime._process_group.ProcessGroup`, and a
multi-host run installs it when it starts (:func:`run_hosts` enters it in each host's thread;
:func:`~spmdsim.hosts.mpi.mpi_host` installs it for the MPI process), as ``init_process_group`` does. The core
(runtime, primitives, axes, devices) never imports this package; this package sits one floor above it.

One job per module:

- :mod:`~spmdsim.hosts.host`: a host, the protocol's steps (meeting, one global call, outcome, the end);
- :mod:`~spmdsim.hosts.coordinator`: host 0's World and the stand-in lanes of the other hosts' devices;
- :mod:`~spmdsim.hosts.remote_world`: the world of the devices on another host, whose collectives are messages;
- :mod:`~spmdsim.hosts.vectorized`: the vectorized executor's communicator across hosts;
- :mod:`~spmdsim.hosts.messages`: what travels: the steps, how a program ended, errors made portable;
- :mod:`~spmdsim.hosts.transport`: how messages move (threads of one process, or MPI);
- :mod:`~spmdsim.hosts.spoofed` and :mod:`~spmdsim.hosts.mpi`: hosts as threads, hosts as MPI processes.
"""
from __future__ import annotations

from typing import Callable

from spmdsim.runtime import _devices, _process_group
from spmdsim.hosts import mpi
from spmdsim.hosts.mpi import mpi_host
from spmdsim.hosts.spoofed import run_spoofed
from spmdsim.hosts.transport import launched_by_mpi

__all__ = ["run_hosts", "mpi_host"]


def run_hosts(count: int, fn: Callable, *args, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` once per host, as a multi-host JAX job would run its script on every host,
    and return the hosts' results in host order.

    With ``count`` hosts and ``N = spmdsim.device_count()`` virtual devices, each host owns ``N // count`` local
    devices; inside ``fn``, ``spmdsim.process_index()`` is the host's index, and every top-level ``pmap`` or
    ``shard_map`` is one global call over the devices of all hosts (see :mod:`spmdsim.hosts`).

    Spoofed (the default): each host is a thread of this process. Under ``mpiexec -n count`` (this process
    started by MPI, ``mpi4py`` installed): this process is host ``MPI rank`` and runs ``fn`` once, the other
    processes run the other hosts; the results of every host are gathered, so both ways return the same list.

    Raises:
      ValueError: ``count`` does not divide the device count, or ``run_hosts`` inside a multi-host run.
      The error of the first host (in host order) whose ``fn`` raised, with a note naming the host; a mapped
      call made by only some hosts is a CollectiveDeadlockError, different calls a CollectiveMismatchError.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"run_hosts: the host count must be a positive int, got {count!r}.")
    process_host = mpi.process_host()
    if _process_group.current() is not _process_group.SINGLE_PROCESS and process_host is None:
        raise ValueError("run_hosts: already inside a multi-host run; hosts do not nest.")
    n = _devices.device_count() if process_host is None else process_host.count * process_host.local
    if n % count:
        raise ValueError(f"run_hosts: {n} virtual devices cannot be split evenly over {count} hosts. Use a device "
                         f"count that {count} divides: spmdsim.set_device_count({count * max(1, n // count)}).")
    if process_host is not None or launched_by_mpi():
        host = mpi_host(n)
        if host.count != count:
            raise ValueError(f"run_hosts({count}, ...) in an MPI job of {host.count} processes: start it with "
                             f"mpiexec -n {count}.")
        return host.run_program(fn, args, kwargs)
    return run_spoofed(count, n // count, fn, args, kwargs)
