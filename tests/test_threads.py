"""Device threads: one per device, parked between calls and reused, pinned to one CPU."""
import os
import threading
import time

import numpy as np
import pytest

import spmdsim
from spmdsim.runtime import _threads
from spmdsim import lax


def device_threads(n: int) -> list[threading.Thread]:
    """Each device's thread. Thread objects, not ids: the OS reuses the id of a thread that ended."""
    seen = {}

    def f(x):
        seen[int(lax.axis_index("i"))] = threading.current_thread()
        return lax.psum(x, "i")

    spmdsim.pmap(f, axis_name="i")(np.zeros(n))
    return [seen[i] for i in range(n)]


def spmdsim_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("spmdsim")]


def until(condition, seconds: float = 60.0) -> bool:
    """Poll ``condition`` until it holds; the deadline is only there to fail instead of hanging."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_by_default_threads_are_parked_reused_and_end_after_the_idle_time(monkeypatch):
    """Parked and taken by the next call, checked with an idle time no test outlasts (a loaded machine may
    pause for long between two calls); with a short one, they end by themselves after the next call."""
    monkeypatch.setattr(_threads, "IDLE_SECONDS", 3600.0)
    first = device_threads(4)
    assert len(set(first)) == 4 and threading.current_thread() not in first
    assert spmdsim_threads() == ["spmdsim idle thread"] * 4     # parked: no user code, no call held
    assert set(device_threads(4)) == set(first)                 # the next call takes them (in any order)
    monkeypatch.setattr(_threads, "IDLE_SECONDS", 0.2)          # read by each thread when it parks
    assert set(device_threads(4)) == set(first)
    assert until(lambda: not spmdsim_threads())
    assert _threads.idle_thread_count() == 0 and not any(t.is_alive() for t in first)


def test_without_reuse_every_call_gets_new_threads_and_none_survives(monkeypatch):
    monkeypatch.setattr(_threads, "REUSE", False)
    before = threading.active_count()
    first, second = device_threads(4), device_threads(4)
    assert len(set(first)) == 4 and len(set(second)) == 4 and not set(first) & set(second)
    assert until(lambda: not any(t.is_alive() for t in first + second))   # each ends with its call
    assert threading.active_count() == before and _threads.idle_thread_count() == 0


def test_inside_the_block_calls_reuse_the_same_device_threads_and_leaving_it_stops_them(monkeypatch):
    monkeypatch.setattr(_threads, "IDLE_SECONDS", 0.01)   # the block keeps them parked anyway
    _threads.stop_idle_threads()
    before = threading.active_count()
    with spmdsim.reuse_threads():
        first = device_threads(4)
        time.sleep(0.1)                                      # their idle waits time out, and they stay
        second = device_threads(4)
        assert len(set(first)) == 4 and set(second) == set(first)
        assert threading.active_count() == before + 4       # parked between calls
        bigger = device_threads(6)                           # more devices: two more threads
        assert set(first) < set(bigger)
    assert threading.active_count() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("spmdsim")]


def test_reused_threads_run_nested_maps_and_report_errors_like_fresh_ones():
    inner = spmdsim.vmap(lambda v: lax.psum(v, "j"), axis_name="j")
    f = spmdsim.pmap(lambda x: lax.psum(inner(x), "i"), axis_name="i")
    x = np.arange(12.0).reshape(4, 3)
    with spmdsim.reuse_threads():
        np.testing.assert_allclose(f(x), np.full((4, 3), x.sum()))
        with pytest.raises(spmdsim.CollectiveDeadlockError, match="device 2"):
            spmdsim.pmap(lambda v: lax.psum(v, "i") if lax.axis_index("i") != 2 else v, axis_name="i")(x)
        with pytest.raises(ZeroDivisionError) as info:
            spmdsim.pmap(lambda v: 1 // 0 if lax.axis_index("i") == 1 else lax.psum(v, "i"), axis_name="i")(x)
        assert "device 1" in "".join(info.value.__notes__)
        np.testing.assert_allclose(f(x), np.full((4, 3), x.sum()))  # the threads are back and work
        names = spmdsim.pmap(lambda v: np.array(threading.current_thread().name.endswith("device 3 [i=3]")),
                             axis_name="i")(x)
        assert names[3] and not names[:3].any()


@pytest.mark.skipif(_threads._CPU is None, reason="thread affinity unavailable or a single CPU allowed")
def test_device_threads_share_one_cpu_and_the_caller_keeps_its_own():
    caller = os.sched_getaffinity(0)
    cpus = spmdsim.pmap(lambda x: np.array(sorted(os.sched_getaffinity(0)) == sorted(_threads._CPU)))(np.zeros(3))
    assert cpus.all()
    assert os.sched_getaffinity(0) == caller and len(_threads._CPU) == 1 and _threads._CPU <= caller


@pytest.mark.skipif(_threads._CPU is None, reason="thread affinity unavailable or a single CPU allowed")
def test_the_caller_waits_on_the_devices_cpu_and_gets_its_own_back_also_when_a_device_raises():
    """While a call runs, its caller sleeps on the devices' CPU (waking it there is cheaper); after the call,
    returned or raised, the caller's own affinity is back."""
    caller = os.sched_getaffinity(0)
    me = threading.get_native_id()
    seen = spmdsim.pmap(lambda x: np.array(sorted(os.sched_getaffinity(me))))(np.zeros(2))
    assert (seen == sorted(_threads._CPU)).all()
    assert os.sched_getaffinity(0) == caller

    def fails(x):
        raise KeyError("device failure")

    with pytest.raises(KeyError):
        spmdsim.pmap(fails)(np.zeros(2))
    assert os.sched_getaffinity(0) == caller


def test_blas_runs_one_thread_while_devices_compute():
    """OpenBLAS's split of a product over its threads changes the product's bits on some CPUs (AMD Zen 3: 3,228 of
    16,384 elements of a 64x512 @ 512x256 between one and two threads), so inside a mapped call, and around a
    large kernel outside one, BLAS runs one thread whatever it had, and gets its count back after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from spmdsim.runtime import _blas

    def blas_threads() -> int:
        return max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")

    seen = []

    def f(x):
        seen.append(blas_threads())
        return x @ x.T

    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        outside = blas_threads()
        spmdsim.pmap(f, axis_name="i")(np.ones((2, 3, 3)))
        with _blas.limited():
            seen.append(blas_threads())
        assert blas_threads() == outside
    assert seen == [1, 1, 1]
