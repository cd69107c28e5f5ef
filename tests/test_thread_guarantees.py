"""What reused device threads guarantee (spmdsim/runtime/_threads.py): when a call returns or raises, no device thread
runs user code or holds a reference to the call's data; parked threads end after the idle time, at
interpreter exit and in a forked child; thread count and memory do not grow over many calls. (After Ctrl-C:
tests/test_interrupt.py.)"""
import gc
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import weakref

import numpy as np
import pytest

import spmdsim
from spmdsim.runtime import _threads
from spmdsim import lax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(spmdsim.__file__)))


def spmdsim_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("spmdsim"))


# An idle time that no test outlasts: parked threads stay parked while a test checks them, however long a loaded
# machine takes between two steps (a short idle time could end them in between).
NEVER = 3600.0


def until(condition, seconds: float = 60.0) -> bool:
    """Poll ``condition`` until it holds; the deadline is only there to fail instead of hanging."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def call_that_raises(x: np.ndarray) -> None:
    def f(v):
        if lax.axis_index("i") == 2:
            raise ValueError("device 2 fails")
        return lax.psum(v, "i")   # the others wait here and are released by the failure

    with pytest.raises(ValueError, match="device 2 fails"):
        spmdsim.pmap(f, axis_name="i")(x)


def test_after_a_call_that_raised_the_threads_are_parked_and_hold_nothing_of_the_call(monkeypatch):
    """Parked at once (checked with an idle time no test outlasts); the next call takes those same threads, and
    with a short idle time they end by themselves after it."""
    monkeypatch.setattr(_threads, "IDLE_SECONDS", NEVER)
    x = np.arange(8.0)
    data = weakref.ref(x)
    call_that_raises(x)
    parked = [t for t in threading.enumerate() if t.name.startswith("spmdsim")]
    assert [t.name for t in parked] == ["spmdsim idle thread"] * 8     # parked at once, no user code running
    assert _threads.idle_thread_count() == 8
    del x
    gc.collect()
    assert data() is None, "a parked device thread still holds the call's argument"
    monkeypatch.setattr(_threads, "IDLE_SECONDS", 0.2)                 # read by each thread when it parks
    ran_on = set()
    spmdsim.pmap(lambda v: ran_on.add(threading.current_thread()) or v, axis_name="i")(np.zeros(8))
    assert ran_on == set(parked)                                       # the next call took them
    assert until(lambda: not spmdsim_threads())                        # and they end after the idle time
    assert _threads.idle_thread_count() == 0



def test_a_device_thread_not_scheduled_again_after_its_body_returned_holds_nothing_of_the_call(monkeypatch):
    """A device thread may lose its CPU right after its body counted as returned (the caller then returns and
    runs on): by then it must hold no reference to the call. Made certain here by a pause after parking, where
    a loaded machine may deschedule the thread."""
    park = _threads._Pool.park

    def park_then_pause(pool, worker, threads, i):
        park(pool, worker, threads, i)
        time.sleep(0.2)

    monkeypatch.setattr(_threads._Pool, "park", park_then_pause)
    x = np.arange(8.0)
    data = weakref.ref(x)
    np.testing.assert_array_equal(spmdsim.pmap(lambda v: lax.psum(v, "i"), axis_name="i")(x), np.full(8, 28.0))
    del x
    gc.collect()
    assert data() is None, "a device thread still holds the call's argument after the call returned"

def test_parked_threads_end_at_interpreter_exit():
    """The program's own exit hook, registered before spmdsim's (exit hooks run last registered first), runs
    after spmdsim's and finds no spmdsim thread, with a 60 s idle time."""
    program = (
        "import atexit, threading\n"
        "atexit.register(lambda: print('left at exit:', sorted(t.name for t in threading.enumerate() "
        "if t.name.startswith('spmdsim'))))\n"
        "import numpy as np, spmdsim\n"
        "f = spmdsim.pmap(lambda v: spmdsim.lax.psum(v, 'i'), axis_name='i')\n"
        "for _ in range(3): f(np.ones(8))\n"
        "print('parked:', spmdsim.runtime._threads.idle_thread_count())\n")
    assert_prints(program, ["parked: 8", "left at exit: []"], SPMDSIM_IDLE_THREAD_SECONDS="60")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_starts_with_no_parked_thread_and_its_calls_work():
    """In a fresh interpreter (forking a process that runs JAX's threads is unsafe)."""
    program = (
        "import os, numpy as np, spmdsim\n"
        "f = spmdsim.pmap(lambda v: spmdsim.lax.psum(v, 'i'), axis_name='i')\n"
        "f(np.ones(8))\n"
        "parked = spmdsim.runtime._threads.idle_thread_count()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    before = spmdsim.runtime._threads.idle_thread_count()\n"
        "    ok = f(np.ones(8)).tolist() == [8.0] * 8\n"
        "    print('child', before, ok, spmdsim.runtime._threads.idle_thread_count(), flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('parent', parked, spmdsim.runtime._threads.idle_thread_count())\n")
    assert_prints(program, ["child 0 True 8", "parent 8 8"])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_is_not_blocked_by_locks_its_parents_threads_held():
    """A thread of the parent inside a fused run (``one_at_a_time``) or taking a kept buffer (the buffer pool's
    lock) while another forks: the child has no such thread, and must still compute."""
    program = (
        "import os, threading, numpy as np\n"
        "from spmdsim.runtime import _buffers, _threads\n"
        "held, done = threading.Event(), threading.Event()\n"
        "def holder():\n"
        "    with _threads._pool.one_at_a_time, _buffers._pool_lock:\n"
        "        held.set()\n"
        "        done.wait()\n"
        "t = threading.Thread(target=holder)\n"
        "t.start()\n"
        "held.wait()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    one = _threads._pool.one_at_a_time.acquire(timeout=10)\n"
        "    pool = _buffers._pool_lock.acquire(timeout=10)\n"
        "    if pool:\n"
        "        _buffers._pool_lock.release()\n"
        "    x = _buffers.empty((1 << 21,), np.float32)\n"
        "    print('child', one, pool, x.shape, flush=True)\n"
        "    os._exit(0)\n"
        "done.set()\n"
        "t.join()\n"
        "os.waitpid(pid, 0)\n")
    assert_prints(program, ["child True True (2097152,)"])


def assert_prints(program: str, lines: list, **environment) -> None:
    """``program`` run by a fresh interpreter (spmdsim importable) succeeds and prints ``lines``."""
    env = {**os.environ, "PYTHONPATH": ROOT, **environment}
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == lines, proc.stdout + proc.stderr


def assert_calls_keep_nothing(call, monkeypatch) -> None:
    """``call()`` (a mapped call over 8 devices) 4,000 times after 200 warm-up calls: threads counted over all of
    them, Python objects over the first 2,500 (one object kept in 25 calls would show), bytes held by spmdsim's
    code (tracemalloc) over the last 1,000, after 500 more that fill NumPy's and JAX's own caches (a leak of one
    small object per call would show as ~50 KiB). The calls run with an idle time no test outlasts, so every call
    must find the same 8 parked threads (a pause for gc.collect or a snapshot on a loaded machine cannot end them);
    afterwards, with a short idle time, they end by themselves after the next call."""
    monkeypatch.setattr(_threads, "IDLE_SECONDS", NEVER)
    for _ in range(200):  # warm the caches
        call()
    gc.collect()
    threads, objects = threading.active_count(), len(gc.get_objects())
    parked = {t for t in threading.enumerate() if t.name.startswith("spmdsim")}
    for _ in range(2_500):
        call()
    gc.collect()
    assert len(gc.get_objects()) - objects < 100, "Python objects accumulate over the calls"
    tracemalloc.start()
    for _ in range(500):
        call()
    gc.collect()
    before = tracemalloc.take_snapshot()
    for _ in range(1_000):
        call()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename") if "spmdsim" in str(stat))
    assert threading.active_count() == threads
    assert spmdsim_threads() == ["spmdsim idle thread"] * 8
    assert {t for t in threading.enumerate() if t.name.startswith("spmdsim")} == parked   # the same 8 throughout
    assert grown < 16 * 1024, f"spmdsim kept {grown} bytes over 1,000 calls"
    monkeypatch.setattr(_threads, "IDLE_SECONDS", 0.2)   # read by each thread when it parks
    call()
    assert until(lambda: not spmdsim_threads()) and _threads.idle_thread_count() == 0


def test_jax_front_end_threads_and_memory_do_not_grow_over_4000_calls(monkeypatch):
    """The JAX front end's default path keeps nothing per call (tracemalloc slows JAX's array conversion
    tenfold: hence bytes over the last 1,000 calls only)."""
    jax = pytest.importorskip("jax")
    import spmdsim.jax as sjax

    f = sjax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")
    x = np.ones((8, 4), np.float32)
    assert_calls_keep_nothing(lambda: f(x), monkeypatch)


def test_numpy_front_end_threads_and_memory_do_not_grow_over_4000_calls(monkeypatch):
    """The NumPy front end's default path (parked threads, the remembered checks of binds and in_axes trees, the
    reused device output stream) keeps nothing per call: Python objects over 4,000 calls with a pytree
    argument, an in_axes tree and a pmean of a tuple; bytes held by spmdsim's code over the last 1,000."""
    def step(params, x):
        w, b = params
        loss, grad = lax.pmean((np.mean(x * w + b), x * 2.0), "i")
        return loss, grad

    f = spmdsim.pmap(step, axis_name="i", in_axes=((None, None), 0))
    params, x = (np.float32(0.5), np.float32(1.0)), np.ones((8, 4), np.float32)
    assert_calls_keep_nothing(lambda: f(params, x), monkeypatch)
