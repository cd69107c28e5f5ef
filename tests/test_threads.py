"""Device threads: one per device, parked between calls and reused, pinned to one CPU."""
import os
import threading
import time

import numpy as np
import pytest

import spmdsim
from spmdsim import _threads, lax


def thread_ids(n: int) -> list[int]:
    """Each device's thread id, taken while all devices are alive (they meet in a psum first)."""
    f = spmdsim.pmap(lambda x: lax.psum(x, "i") + np.int64(threading.get_ident()), axis_name="i")
    return [int(v) for v in f(np.zeros(n, np.int64))]


def spmdsim_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("spmdsim")]


def test_by_default_threads_are_parked_reused_and_end_after_the_idle_time(monkeypatch):
    monkeypatch.setattr(_threads, "IDLE_SECONDS", 0.2)
    first = thread_ids(4)
    assert len(set(first)) == 4 and threading.get_ident() not in first
    assert spmdsim_threads() == ["spmdsim idle thread"] * 4     # parked: no user code, no call held
    assert set(thread_ids(4)) == set(first)                     # the next call takes them
    deadline = time.monotonic() + 5
    while spmdsim_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert spmdsim_threads() == [] and _threads.idle_thread_count() == 0


def test_without_reuse_every_call_gets_new_threads_and_none_survives(monkeypatch):
    monkeypatch.setattr(_threads, "REUSE", False)
    before = threading.active_count()
    first, second = thread_ids(4), thread_ids(4)
    assert not set(first) & set(second) or len(set(first)) == 4
    for _ in range(100):
        if threading.active_count() == before:
            break
        time.sleep(0.01)
    assert threading.active_count() == before


def test_inside_the_block_calls_reuse_the_same_device_threads_and_leaving_it_stops_them(monkeypatch):
    monkeypatch.setattr(_threads, "IDLE_SECONDS", 0.01)   # the block keeps them parked anyway
    _threads.stop_idle_threads()
    before = threading.active_count()
    with spmdsim.reuse_threads():
        first = thread_ids(4)
        time.sleep(0.1)
        second = thread_ids(4)
        assert len(set(first)) == 4 and set(first) == set(second)
        assert threading.active_count() == before + 4       # parked between calls
        bigger = thread_ids(6)                               # more devices: two more threads
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
