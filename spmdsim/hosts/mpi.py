"""A host that is a process started by ``mpiexec`` (``spmdsim run --hosts H``, or ``run_hosts`` under
``mpiexec -n H``): one :class:`~spmdsim.hosts.host.Host` per process, over the
:class:`~spmdsim.hosts.transport.MPITransport`, installed as the process's group for the rest of its life; a lost
host ends the program of every other (:func:`_interrupt_main`).
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time

from spmdsim.runtime import _process_group
from spmdsim.errors import HostLostError
from spmdsim.hosts.host import Host
from spmdsim.hosts.transport import MPITransport

__all__ = ["mpi_host", "process_host", "exit_process"]

_process_host: Host | None = None  # this process's Host under MPI


def process_host() -> Host | None:
    """This process's host in an MPI job, once :func:`mpi_host` started it; else None."""
    return _process_host


def mpi_host(n_devices: int) -> Host:
    """This process as a host of an MPI job (started once, and installed as the process's group): rank ``r`` of
    ``size`` processes, ``n_devices // size`` local devices. ValueError when ``size`` does not divide
    ``n_devices``."""
    global _process_host
    if _process_host is None:
        transport = MPITransport()
        if n_devices % transport.count:
            raise ValueError(f"{n_devices} virtual devices cannot be split evenly over {transport.count} MPI "
                             f"processes (hosts); give a device count that {transport.count} divides.")
        _process_host = Host(transport.index, transport.count, n_devices // transport.count, transport)
        _watch_main_thread(_process_host)
        _process_group.install(_process_host)
        atexit.register(exit_process, _process_host)
    return _process_host


def _watch_main_thread(host: Host) -> None:
    """This process's main thread runs the host's program; a lost host interrupts it (see
    :func:`_interrupt_main`). Call from the main thread."""
    host.main_thread = threading.main_thread()
    host.on_lost_main = lambda error: _interrupt_main(host, error)

    def raise_pending(signum, frame):
        error, host.pending = host.pending, None
        if error is not None:
            raise error

    signal.signal(LOST_SIGNAL, raise_pending)
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)  # MPICH: "a process died"; the watcher sees it


def exit_process(host: Host, how: str = "returned") -> None:
    """At the end of the process: the host's :meth:`~spmdsim.hosts.host.Host.finish`, then stop the messenger.
    After a lost host, end the process at once (MPI's own finalization would wait for the dead one)."""
    host.finish(how)
    host.transport.close()
    if host.lost:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


LOST_SIGNAL = signal.SIGUSR2  # MPICH's mpiexec sends SIGUSR1 itself
LOST_EXIT_SECONDS = 3.0


def _interrupt_main(host: Host, error: HostLostError) -> None:
    """MPI: a lost host ends this process's program within a few seconds, wherever its main thread is: a wait for
    another host or a mapped call ends with the error by itself; otherwise the main thread gets it from a signal
    (which also interrupts a ``time.sleep``). A program still running ``LOST_EXIT_SECONDS`` later (it caught the
    error, or is stuck in C) is ended with the error on stderr."""
    def end() -> None:
        time.sleep(0.2)
        if not host.waiting_main and host.call is None and not host.finished:
            host.pending = error
            signal.pthread_kill(host.main_thread.ident, LOST_SIGNAL)
        time.sleep(LOST_EXIT_SECONDS)
        sys.stderr.write(f"spmdsim: host {host.index}: {error}\nspmdsim: host {host.index}'s program did not end "
                         f"within {LOST_EXIT_SECONDS:g} s; exiting.\n")
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=end, name="spmdsim lost host", daemon=True).start()
