"""The OS threads that lanes run in: one per lane, all pinned to one CPU, created per call or reused.

CPython runs one thread at a time, so a collective costs one thread switch per device. Two things make that
switch and the call around it cheap:

- **One CPU.** Every device thread is pinned to the same CPU (``os.sched_setaffinity``, Linux), so a wake-up
  is a context switch on that CPU instead of a cross-CPU wake-up followed by a fight over the GIL with the
  thread that woke it; as ``SCHED_BATCH`` threads, a woken device does not preempt the one that woke it.
  A bare hand-off costs ~3.6 instead of ~12 µs on a 2-core VM. Device threads cannot run Python in parallel
  anyway; NumPy's own BLAS threads are not affected. Set ``SPMDSIM_PIN_THREADS=0`` to leave placement to the
  OS (e.g. when devices run large GIL-free NumPy work).
- **Reuse, opt in.** Starting a thread costs ~40-70 µs here, more than a whole small training step of
  ``jax.pmap``. By default no thread outlives its mapped call; inside ``with spmdsim.reuse_threads():``
  device threads are parked after a call and reused by the next one, and leaving the block stops them.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Sequence

__all__ = ["reuse_threads", "run_threads"]


def _pinned_cpu() -> set | None:
    if os.environ.get("SPMDSIM_PIN_THREADS", "1") == "0" or not hasattr(os, "sched_setaffinity") \
            or not hasattr(os, "SCHED_BATCH"):
        return None
    try:
        allowed = os.sched_getaffinity(0)
    except OSError:
        return None
    return {min(allowed)} if len(allowed) > 1 else None


_CPU = _pinned_cpu()


def _pin() -> None:
    """Put the calling thread (pid 0 means this thread only) on the lanes' CPU, as a batch thread: no
    wake-up preemption, so a lane that wakes the next one keeps the CPU until it blocks itself."""
    if _CPU is not None:
        try:
            os.sched_setaffinity(0, _CPU)
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass


def _fresh_threads(bodies: Sequence[Callable[[], None]], names: Sequence[str]) -> Callable[[], None]:
    def pinned(body):
        def run():
            _pin()
            body()
        return run

    threads = [threading.Thread(target=pinned(body), name=name, daemon=True) for body, name in zip(bodies, names)]
    for t in threads:
        t.start()

    def join():
        for t in threads:
            t.join()
    return join


class _Worker:
    """A parked thread: ``go`` is held until a task (or the stop signal, ``None``) is handed over."""

    __slots__ = ("thread", "go", "task")

    def __init__(self, pool: "_Pool"):
        self.go = threading.Lock()
        self.go.acquire()
        self.task: Callable[[], None] | None = None
        self.thread = threading.Thread(target=pool.serve, args=(self,), name="spmdsim idle thread", daemon=True)
        self.thread.start()


class _Pool:
    def __init__(self):
        self.lock = threading.Lock()
        self.users = 0      # open reuse_threads() blocks
        self.idle: list[_Worker] = []

    @staticmethod
    def serve(worker: _Worker) -> None:
        _pin()
        while True:
            worker.go.acquire()
            task, worker.task = worker.task, None
            if task is None:
                return
            task()

    def park(self, worker: _Worker) -> None:
        """Back to the idle list; or, when no reuse_threads() block is open any more, stop."""
        threading.current_thread().name = "spmdsim idle thread"
        with self.lock:
            if self.users:
                self.idle.append(worker)
                return
        worker.go.release()  # with no task: the thread returns

    def run(self, bodies: Sequence[Callable[[], None]], names: Sequence[str]) -> Callable[[], None]:
        n = len(bodies)
        with self.lock:
            keep = max(0, len(self.idle) - n)
            taken, self.idle = self.idle[keep:], self.idle[:keep]
        taken += [_Worker(self) for _ in range(n - len(taken))]
        done = threading.Lock()
        done.acquire()
        count_lock, remaining = threading.Lock(), [n]

        def task(i: int) -> Callable[[], None]:
            def run():
                threading.current_thread().name = names[i]
                if i + 1 < n:  # the start baton: each thread wakes the next (one wake-up each, no herd)
                    taken[i + 1].go.release()
                try:
                    bodies[i]()
                finally:
                    self.park(taken[i])  # before the count: the next call finds every thread idle
                    with count_lock:
                        remaining[0] -= 1
                        last = remaining[0] == 0
                    if last:
                        done.release()
            return run

        for i, worker in enumerate(taken):
            worker.task = task(i)
        if taken:
            taken[0].go.release()
        else:
            done.release()
        return done.acquire

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for worker in idle:
            worker.go.release()  # with no task: the thread returns
        for worker in idle:
            worker.thread.join()


_pool = _Pool()


def run_threads(bodies: Sequence[Callable[[], None]], names: Sequence[str]) -> Callable[[], None]:
    """Start ``bodies[i]`` in its own thread named ``names[i]``; return a function that waits for all.

    The bodies must not raise (lanes record their own errors). Fresh threads, or parked ones inside
    :func:`reuse_threads`.
    """
    if _pool.users:
        return _pool.run(bodies, names)
    return _fresh_threads(bodies, names)


class reuse_threads:
    """Keep device threads between mapped calls: ``with spmdsim.reuse_threads(): ...``.

    Starting an OS thread costs tens of microseconds (~50 µs on a 2-core VM, ~0.4 ms per call at 8 devices),
    which dominates short calls such as a training step. Inside this block a call's device threads are
    parked when it returns and reused by the next call (and by nested maps); leaving the outermost block
    stops and joins them, so afterwards no spmdsim thread exists, as without the block. Semantics are
    unchanged: each device still runs in its own thread, errors and deadlock reports are the same.
    Blocks nest and may be entered from several threads. ``spmdsim run`` and ``spmdsim demo`` run inside one.
    """

    def __enter__(self):
        with _pool.lock:
            _pool.users += 1
        return self

    def __exit__(self, *exc):
        with _pool.lock:
            _pool.users -= 1
            last = _pool.users == 0
        if last:
            _pool.close()
