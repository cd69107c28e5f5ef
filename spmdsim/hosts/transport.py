"""How hosts reach each other: a transport moves messages (tuples of Python objects and NumPy arrays) from one
host to another, and tells a host when another one is gone. It never computes: the protocol that uses it
(:mod:`spmdsim.hosts.host`) does.

- :class:`Fabric` / :class:`ThreadTransport`: hosts that are threads of one process (``spmdsim.run_hosts``).
  A message is handed to the receiving host at once, in the sender's thread, by reference.
- :class:`MPITransport`: hosts that are processes started by ``mpiexec`` (mpi4py, imported only here). One
  messenger thread per process receives every message and hands it on; it polls (``Iprobe``) with a short
  sleep instead of blocking in ``MPI_Recv``, whose busy wait would take a whole CPU per process. The same
  thread watches the other processes: one on this machine that no longer exists (its pid is gone or a zombie)
  is reported at once; for processes on other machines, which cannot be watched, a heartbeat every
  ``HEARTBEAT_SECONDS`` and a host silent for ``HEARTBEAT_TIMEOUT_SECONDS`` reported as lost. Every message is
  one buffer of :mod:`spmdsim.hosts.wire`'s format (a fixed header, JSON, raw array bytes; sent with
  ``comm.Send``, received with ``comm.Recv`` into a NumPy buffer): no pickle, so receiving one runs no code. A
  message that is not one of the protocol's ends this host's run as a lost host: "malformed message from host
  N: ...".

A receiving host's ``deliver(source, message)`` must not block: it files the message and wakes whoever waits.
"""
from __future__ import annotations

import ctypes
import os
import socket
import sys
import threading
import time
import traceback
from typing import Callable

import numpy as np

from spmdsim.hosts import wire

__all__ = ["Transport", "Fabric", "ThreadTransport", "MPITransport", "launched_by_mpi"]

POLL_SECONDS = (0.00002, 0.0002, 0.001)  # the messenger's sleeps: after a message, a while later, when idle
WATCH_SECONDS = 0.1
HEARTBEAT_SECONDS = 1.0
HEARTBEAT_TIMEOUT_SECONDS = float(os.environ.get("SPMDSIM_HEARTBEAT_TIMEOUT", "10"))


def launched_by_mpi() -> bool:
    """Whether this process was started by an MPI launcher (``mpiexec``) with more than one process."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(var, "1").strip() not in ("", "0", "1"):
            return True
    return False


class Transport:
    """One host's end of the connection to the others. ``index``: this host, ``count``: the number of hosts."""

    index: int
    count: int

    def start(self, deliver: Callable[[int, tuple], None], lost: Callable[[int, str], None]) -> None:
        """Begin handing incoming messages to ``deliver(source, message)`` and lost hosts to
        ``lost(host, reason)``."""
        raise NotImplementedError

    def send(self, dest: int, message: tuple) -> None:
        raise NotImplementedError

    def departed(self, host: int) -> None:
        """``host`` said goodbye: its end is expected, not a loss."""

    def close(self) -> None:
        """Stop receiving (after every host said goodbye, or one was lost)."""


class Fabric:
    """The hosts of one process (spoofed hosts): ``fabric.transport(h)`` is host ``h``'s end. Messages go by
    reference; with ``wire`` True (tests), each is encoded and decoded as MPI would carry it."""

    wire = False

    def __init__(self, count: int):
        self.count = count
        self.receivers: list = [None] * count

    def transport(self, index: int) -> "ThreadTransport":
        return ThreadTransport(self, index)


class ThreadTransport(Transport):
    """A host that is a thread (see :class:`Fabric`): ``send`` calls the receiver's ``deliver`` directly."""

    def __init__(self, fabric: Fabric, index: int):
        self.fabric, self.index, self.count = fabric, index, fabric.count

    def start(self, deliver, lost) -> None:
        self.fabric.receivers[self.index] = deliver

    def send(self, dest: int, message: tuple) -> None:
        if self.fabric.wire:
            message = wire.check(wire.decode(wire.encode(message)))
        self.fabric.receivers[dest](self.index, message)


class MPITransport(Transport):
    """A host that is an MPI process: rank ``index`` of ``count`` in a duplicate of ``MPI.COMM_WORLD``."""

    def __init__(self):
        from mpi4py import MPI  # the optional dependency: pip install "spmdsim[mpi]"

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD.Dup()
        self.index, self.count = self.comm.Get_rank(), self.comm.Get_size()
        me = (os.getpid(), socket.gethostname())
        self.peers = self.comm.allgather(me)  # (pid, machine) of every host
        self.remote = [h for h, (_, machine) in enumerate(self.peers) if machine != me[1]]
        self._gone: set = set()       # hosts that said goodbye
        self._lost: set = set()
        self._heard = [time.monotonic()] * self.count
        self._running = False
        self._thread: threading.Thread | None = None
        self._send_lock = threading.Lock()

    def start(self, deliver, lost) -> None:
        self._deliver, self._on_lost = deliver, lost
        self._running = True
        self._thread = threading.Thread(target=self._serve, name="spmdsim host messenger", daemon=True)
        self._thread.start()

    def send(self, dest: int, message: tuple) -> None:
        if dest in self._lost:
            return
        buf = wire.encode(message)
        with self._send_lock:  # one sender at a time: MPI's own locking is a busy wait
            self.comm.Send([buf, self.MPI.BYTE], dest=dest, tag=0)

    def departed(self, host: int) -> None:
        self._gone.add(host)

    def close(self) -> None:
        self._running = False
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    # -- the messenger thread ----------------------------------------------------------------------------

    def _serve(self) -> None:
        """The messenger: receives for this host, watches the others. If it fails (a message that does not
        cannot be received here, a bug), this host could never hear from the others again: it says why on stderr and ends
        the process, which the other hosts then report as a lost host."""
        try:
            self._messenger_loop()
        except BaseException:  # noqa: BLE001 - reported, then the process ends
            sys.stderr.write(f"spmdsim: the messenger of host {self.index} failed; this host stops:\n"
                             f"{traceback.format_exc()}")
            sys.stderr.flush()
            os._exit(1)

    def _messenger_loop(self) -> None:
        _fine_timer_slack()
        status = self.MPI.Status()
        idle_since = time.monotonic()
        next_watch = next_beat = 0.0
        while self._running:
            if self._receive(status):
                idle_since = time.monotonic()
                continue
            now = time.monotonic()
            if now >= next_watch:
                next_watch = now + WATCH_SECONDS
                self._watch(now)
            if self.remote and now >= next_beat:
                next_beat = now + HEARTBEAT_SECONDS
                # Never blocking here: a large send of another thread may hold the lock until the peer
                # receives, and the peer's messenger may be sending to us too; any message counts as a beat.
                if self._send_lock.acquire(blocking=False):
                    try:
                        for h in self.remote:
                            if h not in self._lost:
                                self.comm.Send([_HEARTBEAT, self.MPI.BYTE], dest=h, tag=0)
                    finally:
                        self._send_lock.release()
            quiet = now - idle_since
            time.sleep(POLL_SECONDS[0] if quiet < 0.01 else POLL_SECONDS[1] if quiet < 0.2 else POLL_SECONDS[2])

    def _receive(self, status) -> bool:
        """Hand on one waiting message, if there is one."""
        if not self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=0, status=status):
            return False
        source = status.Get_source()
        buf = np.empty(status.Get_count(self.MPI.BYTE), np.uint8)
        self.comm.Recv([buf, self.MPI.BYTE], source=source, tag=0)
        self._heard[source] = time.monotonic()
        if source in self._lost:
            return True
        try:
            message = wire.check(wire.decode(buf))
        except wire.Malformed as e:
            self._lose(source, f"malformed message from host {source}: {e}")
            return True
        if message != ("heartbeat",):
            try:
                self._deliver(source, message)
            except Exception as e:  # noqa: BLE001 - fields of the wrong types for its kind
                self._lose(source, f"malformed message from host {source}: a {message[0]!r} message that cannot "
                                   f"be handled ({type(e).__name__}: {e})")
        return True

    def _watch(self, now: float) -> None:
        for h, (pid, machine) in enumerate(self.peers):
            if h == self.index or h in self._gone or h in self._lost:
                continue
            if h in self.remote:
                if now - self._heard[h] > HEARTBEAT_TIMEOUT_SECONDS:
                    self._lose(h, f"host {h} (pid {pid} on {machine}) sent nothing for "
                                  f"{HEARTBEAT_TIMEOUT_SECONDS:g} s (no heartbeat): presumed dead")
            elif not _alive(pid):
                while self._receive(self.MPI.Status()):  # its last words (a goodbye) may still be waiting
                    pass
                if h not in self._gone:
                    self._lose(h, f"host {h} (process {pid}) died")

    def _lose(self, host: int, reason: str) -> None:
        self._lost.add(host)
        self._on_lost(host, reason)


_HEARTBEAT = wire.encode(("heartbeat",))


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a dead child its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _fine_timer_slack() -> None:
    """Let this thread's short sleeps be short (Linux rounds them up by 50 µs otherwise)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK, 1 ns
        except (OSError, AttributeError):
            pass
