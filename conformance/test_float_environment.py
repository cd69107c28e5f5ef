"""spmdsim computes in the default floating-point environment wherever it is called from (see
:mod:`spmdsim.runtime._fpenv`). XLA:CPU calls host callbacks with subnormals flushed to zero, and a thread started
there inherits that: a parked device thread first started inside a callback flushed every sum and maximum of
subnormals it computed afterwards (test_windows_speed_parity's large windows differed on one CPU's devices in
four of seven full CI runs)."""
import jax
import numpy as np
import pytest

import spmdsim.jax
from spmdsim.runtime import _fpenv, _threads

SUBNORMALS = np.array([1e-40, -1e-40, 2e-40, 3e-39], np.float32)
IEEE_DOUBLED = SUBNORMALS + SUBNORMALS  # NumPy, default environment: subnormal sums, none zero


def _in_callback(fn):
    """``fn()``'s result, computed inside an XLA host callback of a jitted program."""
    out = []

    def host(x):
        out.append(fn())
        return x
    x = np.zeros(1, np.float32)
    jax.jit(lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x))(x).block_until_ready()
    return out[0]


def test_xla_calls_host_callbacks_with_subnormals_flushed():
    """The premise: in a callback, and in a thread started there, a subnormal is zero; outside, it is not."""
    assert not _fpenv.flushes()
    assert _in_callback(_fpenv.flushes)
    assert not _fpenv.flushes()


def test_device_threads_started_inside_a_callback_keep_subnormals():
    """Device threads first started inside a callback (no parked thread to take) are parked flushing; the
    next call's bodies run in the default environment all the same."""
    flushed_at_start = []

    def start_threads():
        _threads._pool.stop_idle()  # the call below must start its threads here
        _threads.run_threads(lambda i: flushed_at_start.append(_fpenv.flushes()), ["a", "b"]).wait()
        return True
    with spmdsim.reuse_threads():  # the threads stay parked between the two calls
        assert _in_callback(start_threads)
        assert flushed_at_start == [False, False]  # reset before the body, as before every body
        sums = {}

        def body(i):
            sums[i] = SUBNORMALS + SUBNORMALS
        _threads.run_threads(body, ["a", "b"]).wait()
    for i in (0, 1):
        assert sums[i].tobytes() == IEEE_DOUBLED.tobytes()


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_a_map_called_from_a_callback_computes_with_subnormals(executor):
    """spmdsim's pmap called inside the user's own callback (XLA's thread, flushing) gives what it gives at top
    level; the caller's environment is its own again after it."""
    f = spmdsim.jax.pmap(lambda x: x + x, executor=executor)
    stacked = np.stack([SUBNORMALS, -SUBNORMALS])
    expected = np.stack([IEEE_DOUBLED, -IEEE_DOUBLED])
    assert np.asarray(f(stacked)).tobytes() == expected.tobytes()

    def call():
        out = np.asarray(f(stacked))
        return out, _fpenv.flushes()
    out, flushing_after = _in_callback(call)
    assert out.tobytes() == expected.tobytes()
    assert flushing_after


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_a_map_in_jax_jit_computes_with_subnormals(executor, dtype):
    """spmdsim's shard_map inside JAX's own jit runs as a host callback: its values are those of the map run
    eagerly, IEEE subnormals included (XLA's own shard_map flushes them: the documented difference), and its
    results cross from the callback's device to the others bit for bit (XLA broadcasts a value from one device
    as a sum with the other devices' zeros: -0.0 came back +0.0 and subnormals 0)."""
    mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    tiny = np.finfo(dtype).smallest_subnormal
    x = np.array([tiny, -tiny, 3 * tiny, -0.0, 1.0, -2.5, np.inf, -0.0], dtype)
    expected = x + x  # NumPy, IEEE: -0.0 + -0.0 is -0.0
    for body in (lambda b: b + b, lambda b: b):
        f = spmdsim.jax.shard_map(body, mesh=mesh, in_specs=jax.P("x"), out_specs=jax.P("x"), executor=executor)
        want = expected if body(1) == 2 else x
        assert np.asarray(f(x)).tobytes() == want.tobytes()
        assert np.asarray(jax.jit(f)(x)).tobytes() == want.tobytes()
    xla = np.asarray(jax.jit(jax.shard_map(lambda b: b + b, mesh=mesh, in_specs=jax.P("x"),
                                           out_specs=jax.P("x")))(x))
    # XLA:CPU flushes float32's subnormals; float16 it computes in float32 and rounds back: kept
    flushed = np.where(np.abs(x) < np.finfo(np.float32).tiny, np.copysign(0, x), expected).astype(dtype)
    assert xla.tobytes() == (expected if dtype == np.float16 else flushed).tobytes()


@pytest.mark.skipif(not _fpenv._X86_64_LINUX, reason="spmdsim flushes in callbacks on x86-64 Linux only")
@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_a_users_callback_computes_as_xla_calls_it(executor):
    """The user's NumPy function in a ``pure_callback``/``debug.callback`` inside a map computes as XLA calls it:
    subnormals flushed (``v + v`` is 0), the same bytes as under ``jax.pmap``; the device thread's own
    environment is the default again after it."""
    seen = []

    def doubled(v):
        seen.append(_fpenv.flushes())
        return v + v

    def body(x):
        jax.debug.callback(lambda v: seen.append(_fpenv.flushes()), x)
        return jax.pure_callback(doubled, jax.ShapeDtypeStruct(x.shape, x.dtype), x), x + x

    stacked = np.stack([SUBNORMALS, -SUBNORMALS])
    want = [np.asarray(o) for o in jax.pmap(body)(stacked)]
    jax.effects_barrier()
    assert seen and all(seen)  # JAX: every callback ran flushing
    seen.clear()
    got = [np.asarray(o) for o in spmdsim.jax.pmap(body, executor=executor)(stacked)]
    assert seen == [True] * 4
    assert not want[0].any() and got[0].tobytes() == want[0].tobytes()  # the callback's sums: zeros
    assert got[1].tobytes() == np.stack([IEEE_DOUBLED, -IEEE_DOUBLED]).tobytes()  # spmdsim's own: IEEE
    assert not _fpenv.flushes()
