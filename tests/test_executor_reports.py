"""The vectorized executor reports like the thread executor: the same programs, the same error classes, and
the same content (the device that raised; the collective, its axis and parameters, its source line, and which
devices are missing or called what)."""
import inspect

import numpy as np
import pytest


jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import spmdsim.jax as sjax  # noqa: E402
from spmdsim.errors import CollectiveDeadlockError, CollectiveMismatchError  # noqa: E402

EXECUTORS = ["threads", "vectorized"]
HERE = __file__.rsplit("/", 1)[-1]


def line_of(fn, text: str) -> str:
    lines, start = inspect.getsourcelines(fn)
    return f"{HERE}:{start + next(i for i, line in enumerate(lines) if text in line)}"


def run(fn, executor, x=None):
    x = np.arange(8, dtype=np.float32) if x is None else x
    return sjax.pmap(fn, axis_name="i", executor=executor)(x)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_raising_device_is_named_with_every_device_error_attached(executor):
    def check(i):
        if i in (3, 5):
            raise ValueError(f"bad value on {int(i)}")

    def f(x):
        jax.debug.callback(check, jax.lax.axis_index("i"))
        return jax.lax.psum(x, "i")

    with pytest.raises(ValueError, match="bad value on 3") as info:
        run(f, executor)
    notes = "\n".join(info.value.__notes__)
    assert "spmdsim: raised on device 3 [i=3]." in notes
    assert "spmdsim: device 5 [i=5] also raised ValueError: bad value on 5." in notes
    assert set(info.value.device_errors) == {"device 3 [i=3]", "device 5 [i=5]"}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_collective_that_some_devices_skip_in_a_cond_is_a_deadlock_naming_op_axis_line_and_devices(executor):
    def f(x):
        return jax.lax.cond(jax.lax.axis_index("i") == 2, lambda v: v,
                            lambda v: jax.lax.psum(v, "i", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]), x)

    with pytest.raises(CollectiveDeadlockError) as info:
        run(f, executor)
    msg = str(info.value)
    assert "psum(float32[], axis_name='i', axis_index_groups=((0, 1, 2, 3), (4, 5, 6, 7)))" in msg
    assert "can never complete: device 2 [i=2] " in msg and "On real hardware this program hangs." in msg
    assert line_of(f, "jax.lax.psum") in msg
    assert "device 0 [i=0]: waiting in psum" in "\n".join(info.value.devices)
    waiting = [line for line in msg.splitlines() if line.startswith("device ") and "  waiting  " in line]
    assert waiting and all(row.split()[3:6] == ["waiting", "psum(float32[])", "'i'"] and line_of(f, "jax.lax.psum")
                           in row for row in waiting)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_devices_leaving_a_while_loop_early_leave_the_others_in_a_deadlock(executor):
    def f(x):
        i = jax.lax.axis_index("i")
        return jax.lax.while_loop(lambda c: c[0] <= i, lambda c: (c[0] + 1, jax.lax.psum(c[1], "i")), (0, x))[1]

    with pytest.raises(CollectiveDeadlockError) as info:
        run(f, executor)
    msg = str(info.value)
    assert "psum(float32[], axis_name='i')" in msg and line_of(f, "jax.lax.psum") in msg
    assert "device 0 [i=0] " in msg.split("can never complete:")[1].splitlines()[0]


SECOND_CALLS = {  # (what the devices of branch 1 call, what the others call), equal result shapes
    "op": (lambda x: jax.lax.pmax(x, "i"), lambda x: jax.lax.psum(x, "i")),
    "shape": (lambda x: jax.lax.psum(jnp.stack([x, x]), "i")[0], lambda x: jax.lax.psum(x, "i")),
    "dtype": (lambda x: jax.lax.psum(x.astype(jnp.int32), "i").astype(jnp.float32), lambda x: jax.lax.psum(x, "i")),
    "groups": (lambda x: jax.lax.psum(x, "i", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]),
               lambda x: jax.lax.psum(x, "i")),
    "perm": (lambda x: jax.lax.ppermute(x, "i", [(k, (k + 1) % 8) for k in range(8)]),
             lambda x: jax.lax.ppermute(x, "i", [(k, (k - 1) % 8) for k in range(8)])),
    "tiled": (lambda x: jax.lax.all_gather(x, "i", tiled=True), lambda x: jax.lax.all_gather(x, "i").reshape(64, 8)),
    "all_to_all axes": (lambda x: jax.lax.all_to_all(x, "i", 0, 0), lambda x: jax.lax.all_to_all(x, "i", 1, 1)),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("differ", list(SECOND_CALLS))
def test_branches_calling_different_collectives_are_a_mismatch_listing_each_call_and_line(differ, executor):
    second, first = SECOND_CALLS[differ]

    def f(x):
        return jax.lax.cond(jax.lax.axis_index("i") >= 6, second, first, x)

    x = np.ones((8, 8, 8), np.float32)
    with pytest.raises(CollectiveMismatchError) as info:
        run(f, executor, x)
    msg = str(info.value)
    assert msg.startswith("devices called different collectives")
    if executor == "vectorized":
        first = msg.splitlines()[0]
        assert first.startswith("devices called different collectives in the branches of the cond at ")
        assert line_of(f, "jax.lax.cond") in first
    calls = msg.split("\nOn real hardware")[0]
    assert calls.count(" at ") >= 2 and calls.count(f"{HERE}:") >= 2
    assert "device 6 [i=6]" in calls and "device 0 [i=0]" in calls


def test_every_branch_calling_the_same_collective_runs_on_threads_and_is_refused_by_the_vectorized_executor():
    def f(x):
        return jax.lax.cond(jax.lax.axis_index("i") < 3, lambda v: jax.lax.psum(v * 2, "i"),
                            lambda v: jax.lax.psum(v, "i"), x)

    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(run(f, "threads", x), np.full(8, 2 * 3 + 3 + 4 + 5 + 6 + 7, np.float32))
    with pytest.raises(NotImplementedError, match="executor='threads'") as info:
        run(f, "vectorized", x)
    assert "psum(float32[], axis_name='i')" in str(info.value)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_cond_split_along_another_axis_runs_a_collective_over_whole_communicators(executor):
    def inner(x):
        return jax.lax.cond(jax.lax.axis_index("i") == 0, lambda v: jax.lax.psum(v, "j"), lambda v: -v, x)

    f = sjax.pmap(sjax.pmap(inner, axis_name="j", executor=executor), axis_name="i", executor=executor)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(f(x), [[6, 6, 6, 6], [-4, -5, -6, -7]])
