"""Runtime guarantees: per-device threads, deterministic reductions, errors that never hang or get lost."""
import functools
import gc
import threading
import tracemalloc

import numpy as np
import pytest

import spmdsim
from spmdsim import lax

HERE = __file__.rsplit("/", 1)[-1]


def finishes(fn, *args, timeout=30.0):
    """Run fn in a helper thread and fail (instead of hanging the suite) if it does not return."""
    box = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the mapped call hung"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def line_of(fn, text):
    import inspect
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, l in enumerate(lines) if text in l)


def test_each_device_runs_in_its_own_thread_with_python_control_flow(capsys):
    def f(x):
        if x > 1:                       # a Python branch on a concrete value
            print(f"big {int(x)}")
            return x * 10
        return x

    out = spmdsim.pmap(f)(np.arange(4))
    assert out.tolist() == [0, 1, 20, 30]
    assert capsys.readouterr().out == "device 2 | big 2\ndevice 3 | big 3\n"  # labelled, in device order
    names = spmdsim.pmap(lambda x: np.array(threading.current_thread().name == threading.main_thread().name))(np.zeros(3))
    assert not names.any()


def test_reductions_are_bitwise_deterministic_and_fold_in_axis_index_order():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 64)) * 10.0 ** rng.integers(-8, 8, (8, 64))).astype(np.float32)
    expected = functools.reduce(np.add, list(x))
    f = spmdsim.pmap(lambda v: lax.psum(v, "i"), axis_name="i")
    for _ in range(20):
        out = f(x)
        assert out.tobytes() == np.broadcast_to(expected, x.shape).tobytes()


def test_device_error_first_in_device_order_with_others_attached():
    def f(x):
        i = int(lax.axis_index("i"))
        if i in (1, 3):
            raise KeyError(f"bad {i}")
        return lax.psum(x, "i")     # devices 0 and 2 wait here and must be released

    with pytest.raises(KeyError, match="bad 1") as info:
        finishes(spmdsim.pmap(f, axis_name="i"), np.zeros(4))
    notes = "\n".join(info.value.__notes__)
    assert "raised on device 1 [i=1]" in notes and "device 3 [i=3] also raised KeyError" in notes
    assert set(info.value.device_errors) == {"device 1 [i=1]", "device 3 [i=3]"}


def test_device_that_returns_early_is_a_deadlock_at_once():
    def f(x):
        if lax.axis_index("i") == 2:
            return x
        return lax.psum(x, "i")

    with pytest.raises(spmdsim.CollectiveDeadlockError) as info:
        finishes(spmdsim.pmap(f, axis_name="i"), np.zeros(4))
    msg = str(info.value)
    assert "psum(float64[], axis_name='i')" in msg
    assert "device 2 [i=2] returned without reaching it" in msg
    assert f"{HERE}:{line_of(f, 'return lax.psum')}" in msg
    assert any(": waiting in psum(float64[], axis_name='i') (step 0)" in l for l in info.value.devices)
    assert "device 2 [i=2]: returned" in info.value.devices
    assert isinstance(info.value, RuntimeError)


def test_collective_in_a_branch_some_devices_skip_is_reported_even_if_they_run_later():
    def f(x):
        if lax.axis_index("i") == 0:
            x = lax.pmax(x, "i")
        return lax.psum(x, "i")

    with pytest.raises(spmdsim.CollectiveMismatchError) as info:
        finishes(spmdsim.pmap(f, axis_name="i"), np.zeros(3))
    msg = str(info.value)
    assert "pmax(float64[], axis_name='i')" in msg and "psum(float64[], axis_name='i')" in msg
    assert f"{HERE}:{line_of(f, 'x = lax.pmax')}" in msg and f"{HERE}:{line_of(f, 'return lax.psum')}" in msg


@pytest.mark.parametrize("second", [
    lambda x: lax.psum(x.astype(np.float32), "i"),                 # dtype
    lambda x: lax.psum(np.stack([x, x]), "i"),                     # shape
    lambda x: lax.psum(x, "i", axis_index_groups=[[0, 1], [2]]),   # parameters
    lambda x: lax.all_gather(x, "i"),                              # op
])
def test_mismatched_calls_at_the_same_step(second):
    def f(x):
        return second(x) if lax.axis_index("i") == 2 else lax.psum(x, "i")

    with pytest.raises(spmdsim.CollectiveMismatchError, match="step 0"):
        finishes(spmdsim.pmap(f, axis_name="i"), np.zeros(3))


def test_crossed_calls_over_two_axes_are_a_mismatch():
    """Devices that call psum over 'i' where the others of their communicator call psum over 'j' called
    different collectives: a mismatch naming both calls, as soon as nobody can move."""
    def lane(x):
        i, j = int(lax.axis_index("i")), int(lax.axis_index("j"))
        first, second = ("i", "j") if i == j else ("j", "i")
        return lax.psum(lax.psum(x, first), second)

    f = spmdsim.pmap(spmdsim.vmap(lane, axis_name="j"), axis_name="i")
    with pytest.raises(spmdsim.CollectiveMismatchError, match="different collectives") as info:
        finishes(f, np.zeros((2, 2)))
    assert "axis_name='i'" in str(info.value) and "axis_name='j'" in str(info.value)
    assert sum("waiting in psum" in l for l in info.value.devices) == 4


def test_device_error_inside_nested_map_propagates_with_both_coordinates():
    def inner(x):
        if lax.axis_index("j") == 1 and lax.axis_index("i") == 1:
            raise ZeroDivisionError("inner")
        return lax.psum(x, ("i", "j"))

    with pytest.raises(ZeroDivisionError) as info:
        finishes(spmdsim.pmap(spmdsim.vmap(inner, axis_name="j"), axis_name="i"), np.zeros((2, 2)))
    assert "raised on device 1 [i=1, j=1]" in "\n".join(info.value.__notes__)


def test_user_except_exception_does_not_swallow_the_abort():
    def f(x):
        if lax.axis_index("i") == 0:
            raise ValueError("first")
        try:
            return lax.psum(x, "i")
        except Exception:   # noqa: BLE001 - what a user might write
            return x * 0 + 99

    with pytest.raises(ValueError, match="first"):
        finishes(spmdsim.pmap(f, axis_name="i"), np.zeros(3))


def test_many_calls_leave_no_threads_or_memory_behind(monkeypatch):
    """With an idle time no test outlasts, so that the parked device threads cannot end by themselves during a
    long pause (gc.collect, a tracemalloc snapshot on a loaded machine) and make the count differ."""
    from spmdsim.runtime import _threads
    monkeypatch.setattr(_threads, "IDLE_SECONDS", 3600.0)
    f = spmdsim.pmap(lambda x: lax.psum(x, "i"), axis_name="i")
    x = np.ones(2)
    for _ in range(200):  # warm caches
        f(x)
    gc.collect()
    threads = threading.active_count()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(3_000):
        f(x)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename") if "spmdsim" in str(stat))
    assert threading.active_count() == threads
    assert grown < 16 * 1024, f"spmdsim kept {grown} bytes after 3,000 calls"  # 8 bytes a call would show


def test_a_call_after_clean_calls_starts_afresh():
    """Top-level calls of one mesh reuse the lanes of an earlier call that ended cleanly: each call still
    counts its collectives from step 0 and reports a mismatch at the right collective, whatever ran before."""
    def many(x):
        for _ in range(5):
            x = lax.psum(x, "i")
        return x

    def late_mismatch(x):
        x = lax.psum(x, "i")
        return lax.pmax(x, "i") if lax.axis_index("i") == 1 else lax.psum(x, "i")

    def early_return(x):
        return x if lax.axis_index("i") == 2 else lax.psum(x, "i")

    x = np.ones(4)
    for _ in range(3):
        np.testing.assert_array_equal(spmdsim.pmap(many, axis_name="i")(x), np.full(4, 4.0 ** 5))
        with pytest.raises(spmdsim.CollectiveMismatchError) as info:
            finishes(spmdsim.pmap(late_mismatch, axis_name="i"), x)
        assert "at step 1 of the same communicator" in str(info.value)
        with pytest.raises(spmdsim.CollectiveDeadlockError) as info:
            finishes(spmdsim.pmap(early_return, axis_name="i"), x)
        assert any(": waiting in psum(float64[], axis_name='i') (step 0)" in line for line in info.value.devices)


def test_a_finished_call_keeps_no_collective_result_alive():
    """What the devices exchanged (a collective's blocks and results) is not kept once the call returned,
    though its lanes are kept for the next call."""
    import weakref
    refs = []

    def f(x):
        total = lax.psum(x * 2, "i")
        refs.append(weakref.ref(total))
        return x + 1

    for _ in range(3):
        out = spmdsim.pmap(f, axis_name="i")(np.ones((4, 1000)))
        gc.collect()
        assert refs and all(r() is None for r in refs), "a psum result outlived its call"
        np.testing.assert_array_equal(out, np.full((4, 1000), 2.0))
        refs.clear()


def test_concurrent_calls_of_one_mesh_from_several_threads():
    """Callers in several threads at once, each with its own values: every call gets its own lanes."""
    f = spmdsim.pmap(lambda x: lax.psum(x, "i") + lax.axis_index("i"), axis_name="i")
    errors, bad = [], []

    def caller(k):
        try:
            for _ in range(200):
                out = f(np.full(4, float(k)))
                if out.tolist() != [4.0 * k + i for i in range(4)]:
                    bad.append((k, out.tolist()))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a concurrent call hung"
    assert not errors and not bad, (errors, bad[:3])


def test_set_device_count_is_refused_inside_a_mapped_function():
    with pytest.raises(ValueError, match="inside a mapped function"):
        spmdsim.pmap(lambda x: spmdsim.set_device_count(2) and x)(np.zeros(2))


def test_deadlock_is_reported_whichever_order_the_devices_get_there():
    """The device that returns may finish before or after the others arrive: both orders are reported.
    The order is forced by waiting on the runtime's own state (no sleeps), so the test is deterministic."""
    import time

    from spmdsim.runtime import _runtime

    def until(condition):
        deadline = time.monotonic() + 60  # only there to fail instead of hanging
        while not condition():
            assert time.monotonic() < deadline, "the devices never reached the expected state"
            time.sleep(0.001)

    def early_return(x):
        world = _runtime.current_lane().world
        if lax.axis_index("i") == 2:
            return x
        until(lambda: world.finished)                       # device 2 has returned before anyone arrives
        return lax.psum(x, "i")

    def late_return(x):
        world = _runtime.current_lane().world
        if lax.axis_index("i") == 2:
            until(lambda: sum(lane.state == _runtime.WAITING for lane in world.lanes) == 3)
            return x
        return lax.psum(x, "i")

    # early: reported at the first arrival (one device waiting); late: when device 2 returns (three waiting)
    for f, waiting in ((early_return, 1), (late_return, 3)):
        with pytest.raises(spmdsim.CollectiveDeadlockError, match=r"device 2 \[i=2\] (returned|done) without") as info:
            finishes(spmdsim.pmap(f, axis_name="i"), np.zeros(4))
        assert sum("waiting in psum" in line for line in info.value.devices) == waiting
        assert "device 2 [i=2]: returned" in info.value.devices
