"""The OS threads that lanes run in: pinned to one CPU, and parked between calls for the next one.

CPython runs one thread at a time, so a collective costs one thread switch per device. Three things make that
switch and the call around it cheap:

- **One CPU.** Every device thread is pinned to the same CPU (``os.sched_setaffinity``, Linux), so a wake-up
  is a context switch on that CPU instead of a cross-CPU wake-up followed by a fight over the GIL with the
  thread that woke it; as ``SCHED_BATCH`` threads, a woken device does not preempt the one that woke it.
  A bare hand-off costs ~3.6 instead of ~12 µs on a 2-core VM. The calling thread joins that CPU while it
  starts the devices and waits for them (:class:`on_lanes_cpu`; its own affinity is restored when the call
  returns or raises): on a VM, waking a thread on another, idle, virtual CPU costs tens of µs. Device threads
  cannot run Python in parallel anyway; a device entering a long kernel that releases the GIL (a large BLAS
  product) leaves that CPU for every CPU of the process until its call ends (:class:`spread`), and the
  vectorized executor's long kernels run in parts over the CPUs (:func:`in_parallel`).
  ``SPMDSIM_PIN_THREADS=0`` leaves placement to the OS.
- **Reuse.** Starting a thread costs ~40-70 µs here, more than a whole small training step of ``jax.pmap``.
  A call's device threads are parked when it returns and taken by the next call (and by nested maps).
- **No leftovers.** A parked thread holds no reference to the call it served and runs no user code. It ends
  after ``SPMDSIM_IDLE_THREAD_SECONDS`` (default 2) without work, at interpreter exit, and in a forked child
  it does not exist (the child starts with no parked thread). Inside ``with spmdsim.reuse_threads():`` parked
  threads wait without a time limit, and the end of the outermost block stops and joins them.
  ``SPMDSIM_REUSE_THREADS=0`` gives every call fresh threads that end with it.
- **Freed memory reused.** Each device allocates fresh NumPy results, and returning that memory to the OS
  only to fault it in again costs more than the arithmetic on a VM (1-3 µs per 4 KiB page here): a
  transformer step with threads faulted in ~260 MB per step (13% of its CPU time in the kernel), CNN steps 20%.
  XLA's allocator keeps its buffers. Under ``spmdsim run`` (a process spmdsim owns), and in any process with
  ``SPMDSIM_MALLOC=1``, glibc's malloc is set (:func:`keep_freed_memory`) to serve
  allocations below 32 MiB from its heap (glibc's own ceiling for its adaptive threshold, reached at once), to
  keep up to 256 MiB of freed memory at the top of the heap, and to keep every thread on that one heap (device
  threads run one at a time, holding the GIL while they allocate; glibc gives each thread a heap of its own, of
  at most 64 MiB, unmapped and mapped again as the devices' arrays come and go: with two heaps the transformer
  still faulted ~30,000 pages per step). Set when ``spmdsim run`` starts, before the script (or at import with
  ``SPMDSIM_MALLOC=1``): threads that allocated before keep their heaps. A plain ``import spmdsim`` leaves the
  process's allocator as it is (a library does not change it for everything else in the process). Results
  are unchanged; page faults per step went from ~65,000 to ~0 (the transformer with threads) and from ~20,000
  to ~70 (the CNN; arrays of 32 MiB and more, as the vectorized MLP's, are still mapped afresh). Not where the
  user set malloc's own tunables (``MALLOC_*`` or ``GLIBC_TUNABLES`` in the environment), or with
  ``SPMDSIM_MALLOC=0``; not outside glibc.
- **Interrupts.** :func:`interrupt` raises an exception in a device thread (Ctrl-C: see
  :mod:`spmdsim.runtime._runtime`). An interrupted thread is never parked again: it ends when its task returns, and
  an interrupt that arrives after the task's body returned ends the thread silently.
- **IEEE arithmetic.** A thread inherits the floating-point environment of the thread that started it, and XLA
  calls host callbacks with subnormals flushed: a device thread is put back in the default environment before
  each body (:mod:`spmdsim.runtime._fpenv`), so what a device computes does not depend on where its thread began.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import threading
from typing import Callable, Sequence

import numpy as np

from spmdsim.runtime import _blas, _fpenv, _stack

__all__ = ["reuse_threads", "run_threads", "Threads", "idle_thread_count", "stop_idle_threads", "interrupt", "spread",
           "one_at_a_time", "in_lane", "in_parallel"]

IDLE_SECONDS = float(os.environ.get("SPMDSIM_IDLE_THREAD_SECONDS", "2"))
REUSE = os.environ.get("SPMDSIM_REUSE_THREADS", "1") != "0"
# CPython raises a signal's exception (Ctrl-C) in the main thread where its bytecode next checks for one; a blocking
# lock acquire checks nothing and wakes only when the signal interrupts that very thread's wait. A SIGINT whose C
# handler ran after the caller's last check and before it blocked (e.g. while it waited for the GIL on a loaded
# machine), or in another thread, was never raised, and the call waited for its devices forever: the caller's wait
# for them comes back to Python this often.
SIGNAL_CHECK_SECONDS = 0.1


def _pinned_cpu() -> set | None:
    if os.environ.get("SPMDSIM_PIN_THREADS", "1") == "0" or not hasattr(os, "sched_setaffinity") \
            or not hasattr(os, "SCHED_BATCH"):
        return None
    try:
        allowed = os.sched_getaffinity(0)
    except OSError:
        return None
    return {min(allowed)} if len(allowed) > 1 else None


def keep_freed_memory(default: bool = True) -> None:
    """glibc's malloc tuned as the module docstring says, where ``default`` (``SPMDSIM_MALLOC=1``/``0`` decide
    instead when set); nothing where it does not apply."""
    chosen = os.environ.get("SPMDSIM_MALLOC")
    if not (default if chosen is None else chosen == "1") or "GLIBC_TUNABLES" in os.environ \
            or any(name.startswith("MALLOC_") for name in os.environ):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: another libc's mallopt takes other parameters
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8  # glibc's malloc.h
    for parameter, value in ((m_mmap_threshold, 32 << 20), (m_trim_threshold, 256 << 20),
                             (m_arena_max, 1)):
        mallopt(parameter, value)


keep_freed_memory(default=False)  # in-process: only on request (spmdsim run asks, see spmdsim/jax/tools/_run.py)
_CPU = _pinned_cpu()
_ALLOWED = os.sched_getaffinity(0) if _CPU is not None else None


def _place(cpus: set) -> bool:
    """Put the calling thread (pid 0 means this thread only) on ``cpus``; False where the OS refused."""
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return False
    return True


def _pin() -> None:
    """Put the calling thread on the lanes' CPU, as a batch thread: no wake-up preemption, so a lane that wakes
    the next one keeps the CPU until it blocks itself."""
    if _CPU is not None and _place(_CPU):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass


class _Worker:
    """A device thread. ``go`` is held until a task (or the stop signal, ``None``) is handed over;
    ``abandoned`` workers (a call gave up waiting for them) end when their task returns, never parked."""

    __slots__ = ("thread", "go", "task", "abandoned", "spread")

    def __init__(self, pool: "_Pool"):
        self.go = threading.Lock()
        self.go.acquire()
        self.task: tuple[_Call, int] | None = None
        self.abandoned = False
        self.spread = False  # left the lanes' CPU for a long kernel (see `spread`): pinned again when parked
        self.thread = threading.Thread(target=pool.serve, args=(self,), name="spmdsim idle thread", daemon=True)
        self.thread._spmdsim_worker = self
        self.thread.start()


class Threads:
    """The threads running one call's bodies: :meth:`wait` for them, :meth:`running` lists those that have
    not returned, :meth:`abandon` gives up on some (they end when their body returns). Its state changes under
    the pool's lock (a body's return and its thread's parking are one step)."""

    def __init__(self, workers: list[_Worker], lock: threading.Lock):
        self.workers = workers
        self.returned = [False] * len(workers)
        self._lock = lock
        self._remaining = len(workers)
        self._done = threading.Lock()  # held until every body returned
        if workers:
            self._done.acquire()

    def _returned_locked(self, i: int) -> None:
        self.returned[i] = True
        self._remaining -= 1
        if self._remaining == 0:
            self._done.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every body returned (True) or ``timeout`` seconds passed (False). Without a timeout, in the
        main thread (the one that gets Ctrl-C), the wait comes back to Python every ``SIGNAL_CHECK_SECONDS``: a
        Ctrl-C is raised there even when its handler ran in C without waking this thread (see there)."""
        if timeout is None and threading.current_thread() is threading.main_thread():
            while not self._done.acquire(True, SIGNAL_CHECK_SECONDS):
                pass
        elif not self._done.acquire(True, -1 if timeout is None else timeout):
            return False
        self._done.release()
        return True

    def running(self) -> list[int]:
        with self._lock:
            return [i for i, r in enumerate(self.returned) if not r]

    def abandon(self, indexes: Sequence[int]) -> None:
        for i in indexes:
            self.workers[i].abandoned = True


class _Call:
    """One call's bodies, handed to its threads: thread ``i`` runs ``body(i)``."""

    __slots__ = ("pool", "body", "names", "workers", "threads")

    def __init__(self, pool: "_Pool", body: Callable[[int], None], names: Sequence[str], workers: list[_Worker]):
        self.pool, self.body, self.names, self.workers = pool, body, names, workers
        self.threads = Threads(workers, pool.lock)

    def run(self, i: int) -> None:
        """Body ``i`` in this thread (the caller parks the thread after, holding no reference to the call)."""
        worker = self.workers[i]
        worker.thread.name = self.names[i]
        if i + 1 < len(self.workers):  # the start baton: each thread wakes the next (one wake-up each, no herd)
            self.workers[i + 1].go.release()
        self.body(i)


class _Pool:
    def __init__(self):
        self.lock = threading.Lock()
        self.scopes = 0      # open reuse_threads() blocks
        self.idle: list[_Worker] = []
        self.one_at_a_time = threading.RLock()  # see one_at_a_time()

    def serve(self, worker: _Worker) -> None:
        try:
            _stack.run_deep(self._serve, worker)  # the bodies' frames in one stack chunk (see _stack)
        except BaseException:
            if not worker.abandoned:
                raise
            # An interrupt (see `interrupt`) that arrived after the device's body had returned: the thread ends.

    def _serve(self, worker: _Worker) -> None:
        _pin()
        while True:
            if not worker.go.acquire(timeout=IDLE_SECONDS):
                with self.lock:
                    if self.scopes or worker not in self.idle:
                        continue  # in a reuse block, or taken by a call right now: its task is on its way
                    self.idle.remove(worker)
                return
            task, worker.task = worker.task, None
            if task is None:
                return
            call, i = task
            threads = call.threads
            del task
            if worker.spread:
                worker.spread = False
                _pin()
            _fpenv.reset()  # started from XLA's callback thread, or a body changed it (see _fpenv)
            try:
                call.run(i)
            finally:
                # The call (its arguments, its results) must not outlive it here: dropped before the body counts
                # as returned, for the caller may return then and this thread may not run again for a while.
                del call
                self.park(worker, threads, i)
            if worker.abandoned:
                return

    def park(self, worker: _Worker, threads: Threads, i: int) -> None:
        """``worker``'s body ``i`` of ``threads`` returned: park the thread (unless it was abandoned, or threads
        are not reused) and count the body as returned, in one step: the next call finds every thread idle."""
        worker.thread.name = "spmdsim idle thread"
        with self.lock:
            keep = not worker.abandoned and (REUSE or self.scopes)
            if keep:
                self.idle.append(worker)
            threads._returned_locked(i)
        if not keep and not worker.abandoned:
            worker.go.release()  # with no task: the thread returns

    def run(self, body: Callable[[int], None], names: Sequence[str]) -> Threads:
        n = len(names)
        with self.lock:
            keep = max(0, len(self.idle) - n)
            taken, self.idle = self.idle[keep:], self.idle[:keep]
        taken += [_Worker(self) for _ in range(n - len(taken))]
        call = _Call(self, body, names, taken)
        for i, worker in enumerate(taken):
            worker.task = (call, i)
        if taken:
            taken[0].go.release()
        return call.threads

    def stop_idle(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for worker in idle:
            worker.go.release()  # with no task: the thread returns
        for worker in idle:
            worker.thread.join()

    def after_fork(self) -> None:
        """In a forked child the parent's threads do not exist: forget them (and the locks they may have held)."""
        self.lock = threading.Lock()
        self.idle = []
        self.one_at_a_time = threading.RLock()


_pool = _Pool()
atexit.register(_pool.stop_idle)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool.after_fork)


class on_lanes_cpu:
    """The calling thread on the lanes' CPU while it starts them and waits for them (its affinity is restored
    after): on a VM, waking a thread on another virtual CPU, idle and halted, costs tens of µs."""

    __slots__ = ("saved",)

    def __enter__(self):
        self.saved = None
        if _CPU is not None:
            try:
                saved = os.sched_getaffinity(0)
            except OSError:
                return self
            if saved != _CPU and _place(_CPU):
                self.saved = saved
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            _place(self.saved)


def _worker() -> _Worker | None:
    """The calling thread's :class:`_Worker`, None outside spmdsim's device threads."""
    return getattr(threading.current_thread(), "_spmdsim_worker", None)


def in_lane() -> bool:
    """Whether the calling thread is one of spmdsim's device threads."""
    return _worker() is not None


_NOTHING = contextlib.nullcontext()


def one_at_a_time():
    """``with one_at_a_time():`` around a run of many short NumPy calls in a device thread (a fused run of
    elementwise equations, a transcendental port over many blocks): one device at a time computes such a run,
    start to end. Each NumPy call of a few microseconds releases the GIL, and device threads taking it from
    each other at every call cost a context switch each: ~20,000 per transformer step of 8 devices, its GELU
    runs 1.65x slower than one thread computing them all (issue 27). The others wait once, or run meanwhile
    what does not take it (BLAS products, collectives). Nothing outside device threads. The holder waits for
    nothing but the GIL, so no device waits for it longer than one run."""
    return _pool.one_at_a_time if _worker() is not None else _NOTHING


class spread:
    """A device thread on every CPU the process may use from a long kernel on (a large BLAS product): the kernel
    releases the GIL, other devices run meanwhile, and pinned to the lanes' one CPU they would all queue there
    while the other CPUs idle. One system call, the first time in a call; the thread stays spread until the call
    ends (it is pinned again when it takes its next task: moving back at once waits for the busy lanes' CPU, ~10%
    of a training step under load). For kernels of a millisecond or more; does nothing outside device threads or
    where threads are not pinned."""

    __slots__ = ()

    def __enter__(self):
        if _CPU is not None:
            worker = _worker()
            if worker is not None and not worker.spread:
                worker.spread = _place(_ALLOWED)
        return self

    def __exit__(self, *exc):
        pass


def in_parallel(work: Callable[[int, int], None], size: int, *, cpus: int) -> None:
    """``work(lo, hi)`` over ``range(size)`` cut in one part per CPU (at most ``cpus``): the first part in the
    calling thread, the others in parked device threads spread over the CPUs (:class:`spread`). For a long
    kernel of the vectorized executor (a batch of BLAS products, a fused multiply-add over every device's block)
    that NumPy runs in one thread with the GIL released. In a device thread ``work`` runs whole (the other
    devices use the other CPUs). Raises the first part's error."""
    parts = min(cpus, size)
    if parts < 2 or in_lane():
        with spread(), _blas.limited():  # one BLAS thread: a product's bits must not depend on the CPUs
            work(0, size)
        return
    bounds = [size * k // parts for k in range(parts + 1)]
    failures: list = []
    errors = np.geterr()  # NumPy's floating-point error handling is per thread: the caller's, in every part

    def part(k: int) -> None:
        try:
            with spread(), np.errstate(**errors):
                work(bounds[k], bounds[k + 1])
        except BaseException as e:  # noqa: BLE001 - raised in the caller below
            failures.append(e)
    with _blas.limited():  # BLAS's own threads would compete with the parts' (see spmdsim.runtime._blas)
        helpers = _pool.run(lambda k: part(k + 1), ["spmdsim kernel part"] * (parts - 1))
        part(0)
        helpers.wait()
    if failures:
        raise failures[0]


def run_threads(body: Callable[[int], None], names: Sequence[str]) -> Threads:
    """Start ``body(i)`` for each ``i`` in ``range(len(names))``, each in its own thread named ``names[i]``
    (a parked one when there is one). ``body`` must not raise (lanes record their own errors)."""
    return _pool.run(body, names)


def interrupt(thread: threading.Thread, exc_type: type) -> None:
    """Raise ``exc_type`` in device thread ``thread`` at its next Python instruction (CPython's asynchronous
    exception; a thread blocked in C, e.g. ``time.sleep``, gets it when that returns). The thread is never
    parked again. The caller makes sure ``thread`` still runs the body it means to stop."""
    worker = getattr(thread, "_spmdsim_worker", None)
    if worker is None or thread.ident is None:
        return
    worker.abandoned = True
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))


def idle_thread_count() -> int:
    """How many device threads are parked now, waiting for the next call."""
    with _pool.lock:
        return len(_pool.idle)


def stop_idle_threads() -> None:
    """Stop and join every parked device thread now (they would end by themselves after the idle time)."""
    _pool.stop_idle()


class reuse_threads:
    """Keep device threads parked without a time limit: ``with spmdsim.reuse_threads(): ...``.

    Device threads are reused between calls anyway (see :mod:`spmdsim.runtime._threads`); inside this block the parked
    ones do not end after the idle time, and leaving the outermost block stops and joins them, so afterwards no
    spmdsim thread exists. Semantics are unchanged: each device runs in its own thread, errors and deadlock
    reports are the same. Blocks nest and may be entered from several threads.
    """

    def __enter__(self):
        with _pool.lock:
            _pool.scopes += 1
        return self

    def __exit__(self, *exc):
        with _pool.lock:
            _pool.scopes -= 1
            last = _pool.scopes == 0
        if last:
            _pool.stop_idle()
