"""``spmdsim.trace()`` records the calls of the thread that opened it (nested calls included), and only whole
calls: every event has its arrival and release times."""
import threading

import numpy as np

import spmdsim
from spmdsim import lax


def psum_call(x):
    return spmdsim.pmap(lambda v: lax.psum(v, "i"), axis_name="i")(x)


def nested_call(x):
    inner = spmdsim.vmap(lambda v: lax.pmax(v, "j"), axis_name="j")
    return spmdsim.pmap(lambda v: lax.psum(inner(v), "i"), axis_name="i")(x)


def run_in_thread(fn, *args):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("out", fn(*args)))
    t.start()
    t.join(30)
    assert not t.is_alive()
    return box["out"]


def test_a_trace_records_only_the_calls_of_its_own_thread_while_another_thread_calls_too():
    go, done = threading.Event(), threading.Event()

    def other_thread():
        go.wait(10)
        for _ in range(20):
            psum_call(np.ones(4))
        done.set()

    t = threading.Thread(target=other_thread)
    t.start()
    with spmdsim.trace() as tr:
        go.set()
        for _ in range(5):
            nested_call(np.ones((2, 3)))
        done.wait(30)
    t.join(30)
    assert tr.counts() == {"psum": 5, "pmax": 10}         # ours only: per call 1 psum and 2 inner pmax
    assert {e.axis_size for e in tr.events if e.op == "psum"} == {2}   # not the other thread's 4 devices
    assert len(tr.calls) == 5 * (2 + 6)                    # 2 outer devices and 6 inner lanes per call


def test_all_threads_records_every_thread_and_the_trace_of_another_thread_is_not_disturbed():
    with spmdsim.trace(all_threads=True) as everything:
        psum_call(np.ones(4))
        inner_trace = run_in_thread(lambda: _traced(psum_call, np.ones(8)))
    assert everything.counts() == {"psum": 2}
    assert inner_trace.counts() == {"psum": 1} and inner_trace.events[0].axis_size == 8


def _traced(fn, *args):
    with spmdsim.trace() as tr:
        fn(*args)
    return tr


def test_a_call_already_running_when_the_trace_opens_is_not_recorded_so_every_event_is_whole():
    started, release = threading.Event(), threading.Event()

    def slow(v):
        if lax.axis_index("i") == 0:
            started.set()
            release.wait(10)
        return lax.psum(v, "i")

    t = threading.Thread(target=lambda: spmdsim.pmap(slow, axis_name="i")(np.ones(4)))
    t.start()
    assert started.wait(10)
    with spmdsim.trace(all_threads=True) as tr:      # the other call is under way: not recorded
        release.set()
        t.join(30)
        psum_call(np.ones(4))                         # recorded
    assert tr.counts() == {"psum": 1}
    for event in tr.events:
        assert min(event.arrived) > 0 and event.released >= max(event.arrived)
    assert 0 <= tr.summary_rows()[0]["worst_wait_ms"] < 60_000
