"""The process group: the processes (hosts) of the job this code runs in, and the seam where a mapped call leaves
this process.

spmdsim keeps this seam as torch.distributed keeps its ``ProcessGroup``: the core (the runtime, the primitives,
the device and axis labels) is written against one class, :class:`ProcessGroup`; the single-process group
(:data:`SINGLE_PROCESS`) is the default and needs nothing else; a backend subclasses it in its own package and is
installed when a multi-process run starts (torch: ``init_process_group``), and the core never imports a backend.
spmdsim's one backend is :mod:`spmdsim.hosts` (hosts as threads of one process, or MPI processes), whose
:class:`~spmdsim.hosts.host.Host` is a process group.

What the core asks of a process group:

- its **layout**: ``index`` of ``count`` processes, ``local`` devices each (global device ``d = h * local + l``
  lives on process ``h``); the device count, ``jax.devices()`` and every device label (``host 1 device 5``)
  follow it;
- a **top-level mapped call** over devices: :meth:`ProcessGroup.run` (thread executor: ``body(j)`` runs this
  process's j-th device; the lanes it starts meet in a world, :class:`~spmdsim.runtime._rendezvous.World` or the
  backend's own with the same methods) and :meth:`ProcessGroup.run_vectorized` (the vectorized executor: the
  :class:`~spmdsim.primitives._batch.Batch` it hands ``fn`` carries a *communicator* whose ``collective`` computes the
  collectives that leave the process).

A group is in force for a thread (:func:`entered`: a spoofed host's thread, and the device threads of its
calls) or for the whole process (:func:`install`: an MPI process).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["ProcessGroup", "SINGLE_PROCESS", "current", "layout", "install", "installed", "enter", "leave", "entered"]


class ProcessGroup:
    """One process's view of a multi-process job. This base class is the single-process group: one process
    holding every device, every call local (``run`` and ``run_vectorized`` are never called on it)."""

    index: int = 0                # this process's index (``jax.process_index()``)
    count: int = 1                # the number of processes (``jax.process_count()``)
    local: int | None = None      # devices per process; None: one process holding every device

    @property
    def layout(self) -> tuple[int, int] | None:
        """``(count, local)``, or None for the single-process group."""
        return None if self.local is None else (self.count, self.local)

    @property
    def devices(self) -> range:
        """The global indices of this process's devices: ``index * local`` up to ``(index + 1) * local``."""
        return range(self.index * self.local, (self.index + 1) * self.local)

    def run(self, body: Callable[[int], Any], axes: tuple) -> list:
        """A top-level mapped call over the global mesh ``axes`` on the thread executor: ``body(j)`` runs this
        process's j-th device; returns this process's devices' results."""
        raise NotImplementedError(f"{type(self).__name__} runs no multi-process call")

    def run_vectorized(self, fn: Callable, axes: tuple):
        """The same on the vectorized executor: ``fn(batch)`` computes this process's devices."""
        raise NotImplementedError(f"{type(self).__name__} runs no multi-process call")


SINGLE_PROCESS = ProcessGroup()


class _Entered(threading.local):
    group = None  # the group entered by this thread; a class default: no exception to catch when unset


_entered = _Entered()
_installed: ProcessGroup = SINGLE_PROCESS


def current() -> ProcessGroup:
    """The process group in force in this thread: the one it entered, else the process's (default
    :data:`SINGLE_PROCESS`)."""
    group = _entered.group
    return _installed if group is None else group


def layout() -> tuple[int, int] | None:
    """``(processes, local devices)`` of the group in force, or None with one process."""
    group = _entered.group
    return (_installed if group is None else group).layout


def install(group: ProcessGroup) -> None:
    """Make ``group`` the whole process's (an MPI process: for the rest of its life)."""
    global _installed
    _installed = group


def installed() -> ProcessGroup:
    """The whole process's group (:data:`SINGLE_PROCESS` unless one was installed)."""
    return _installed


def enter(group: ProcessGroup | None) -> None:
    """Make ``group`` this thread's (None: back to the process's). The runtime enters a call's group in the device
    threads that run it."""
    _entered.group = group


def leave() -> None:
    _entered.group = None


def entered() -> ProcessGroup | None:
    """The group this thread entered, or None."""
    return _entered.group
