"""Host callbacks inside a map (``io_callback`` ordered and not, ``pure_callback`` with each ``vmap_method``,
``jax.debug.callback``/``print``) on spmdsim's JAX front end against real ``jax.pmap`` and ``jax.shard_map`` on 8
CPU devices, both executors: the values, shapes and dtypes; what each device's callback was called with (for an
ordered io_callback, in order); the errors and their classes; and the transformations around and inside the map.

A callback records ``(device, tag, value)`` (the device from ``lax.axis_index``); the per-device sequences of
real JAX and spmdsim are compared. Across devices nothing orders callbacks, in JAX or here.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import spmdsim.jax as sjax

N = 8
EXECUTORS = ("threads", "vectorized")
ALL_EXECUTORS = EXECUTORS + ("reference",)  # the thread executor's plain interpreter loop too
APIS = ("pmap", "shard_map")
S = jax.ShapeDtypeStruct
X = np.arange(N, dtype=np.float32) * 1.5 - 2.0
X3 = np.arange(N * 3, dtype=np.float32).reshape(N, 3) / 4


def _mesh(shape=(N,), names=("i",)):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=jax.devices()[:int(np.prod(shape))])


def mapped(api: str, f, executor: str | None = None, in_axes=0, check_vma: bool = True):
    """``f`` mapped over axis 'i' of N devices: ``pmap`` (blocks squeezed) or ``shard_map`` (blocks of the
    leading axis); real JAX for ``executor=None``, else spmdsim with that executor."""
    if api == "pmap":
        if executor is None:
            return jax.pmap(f, axis_name="i", in_axes=in_axes)
        return sjax.pmap(f, axis_name="i", in_axes=in_axes, executor=executor)
    specs = P("i") if in_axes == 0 else tuple(P() if a is None else P("i") for a in in_axes)  # None: a scalar
    kwargs = dict(mesh=_mesh(), in_specs=specs, out_specs=P("i"), check_vma=check_vma)
    return jax.shard_map(f, **kwargs) if executor is None else sjax.shard_map(f, executor=executor, **kwargs)


class Recorder:
    """Callbacks that record ``(tag, value)`` per device, thread-safe (JAX and the thread executor call them from
    several threads)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls: dict[int, list] = collections.defaultdict(list)

    def __call__(self, tag: str, result=lambda v: v):
        def callback(i, v):
            with self.lock:
                self.calls[int(np.asarray(i).reshape(-1)[0])].append((tag, np.asarray(v).tolist()))
            return result(v)
        return callback

    def take(self) -> dict:
        calls, self.calls = dict(self.calls), collections.defaultdict(list)
        return calls


def done(results):
    """Real JAX's ``results`` once every callback has run (JAX dispatches asynchronously)."""
    results = jax.block_until_ready(results)
    jax.effects_barrier()
    return results


def _numpy(tree):
    return jax.tree.map(np.asarray, tree)


def assert_same(real, got):
    real, got = _numpy(real), _numpy(got)
    assert jax.tree.structure(real) == jax.tree.structure(got)
    for r, g in zip(jax.tree.leaves(real), jax.tree.leaves(got), strict=True):
        assert (r.shape, r.dtype) == (g.shape, g.dtype)
        np.testing.assert_array_equal(r, g)


@contextlib.contextmanager
def jax_raises(cls, match=None):
    """``pytest.raises`` for a real JAX callback failure, then JAX's runtime tokens forgotten: JAX keeps the failed
    computation's token and raises its error again at every later ``jax.effects_barrier()`` and at exit (and a
    failed ordered io_callback fails every later ordered computation)."""
    from jax._src import dispatch
    try:
        with pytest.raises(cls, match=match) as info:
            yield info
    finally:
        dispatch.runtime_tokens.clear()


def line_of(fn, text: str) -> str:
    lines, start = inspect.getsourcelines(fn)
    return f"{__file__}:{start + next(i for i, line in enumerate(lines) if text in line)}"


# -- the reproducer ----------------------------------------------------------------------------------

@pytest.mark.parametrize("executor", ALL_EXECUTORS)
def test_the_reproducer_io_callback_in_pmap(executor):
    def f(x):
        return io_callback(lambda v: v, jax.ShapeDtypeStruct((), jnp.float32), x)

    real = jax.pmap(f)(jnp.arange(8.))
    got = sjax.pmap(f, executor=executor)(jnp.arange(8.))
    assert_same(real, got)


# -- each kind of callback, in pmap and shard_map ---------------------------------------------------------------

def _kinds(rec: Recorder) -> dict:
    """name -> (per-device function of a block, whether each device's calls are in a guaranteed order)."""
    def io_unordered(v):
        i = lax.axis_index("i")
        a = io_callback(rec("a", lambda u: np.asarray(u) * 2), S(v.shape, v.dtype), i, v)
        b = io_callback(rec("b", lambda u: np.asarray(u) + 1), S(v.shape, v.dtype), i, a)
        return a + b

    def io_ordered(v):
        i = lax.axis_index("i")
        a = io_callback(rec("a", lambda u: np.asarray(u) * 2), S(v.shape, v.dtype), i, v, ordered=True)
        b = io_callback(rec("b", lambda u: np.asarray(u) + 1), S(v.shape, v.dtype), i, v, ordered=True)
        c = io_callback(rec("c", lambda u: -np.asarray(u)), S(v.shape, v.dtype), i, a * b, ordered=True)
        return lax.psum(c, "i") + a

    def pure(v):
        i = lax.axis_index("i")
        return jax.pure_callback(rec("p", lambda u: np.sin(u)), S(v.shape, v.dtype), i, v) * 3

    def pure_tree(v):  # pytrees of results and keyword arguments
        i = lax.axis_index("i")
        out = jax.pure_callback(lambda i, v, *, w: {"s": np.asarray(v) + w, "n": (np.asarray(i) * 1).astype(np.int32)},
                                {"s": S(v.shape, v.dtype), "n": S((), jnp.int32)}, i, v, w=v * 2)
        return out["s"] + out["n"].astype(v.dtype)

    def debug_callback(v):
        i = lax.axis_index("i")
        jax.debug.callback(rec("d"), i, v * 2)
        return v + 1

    return {"io_unordered": (io_unordered, False), "io_ordered": (io_ordered, True), "pure": (pure, False),
            "pure_tree": (pure_tree, False), "debug_callback": (debug_callback, False)}


KINDS = ("io_unordered", "io_ordered", "pure", "pure_tree", "debug_callback")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("api", APIS)
def test_each_callback_kind_matches_jax_in_values_and_calls_per_device(api, kind):
    rec = Recorder()
    f, ordered = _kinds(rec)[kind]
    real = done(mapped(api, f)(X))
    real_calls = rec.take()
    if kind != "pure_tree":  # (its callback records nothing)
        assert sorted(real_calls) == list(range(N))
    for executor in ALL_EXECUTORS:
        assert_same(real, mapped(api, f, executor)(X))
        calls = rec.take()
        if ordered:
            assert calls == real_calls, executor
        else:
            assert {d: sorted(c) for d, c in calls.items()} == {d: sorted(c) for d, c in real_calls.items()}, executor


@pytest.mark.parametrize("executor", ALL_EXECUTORS)
def test_ordered_io_callbacks_run_in_program_order_on_each_device_through_scan_cond_and_nesting(executor):
    rec = Recorder()

    def f(v):
        i = lax.axis_index("i")

        def step(c, t):
            y = io_callback(rec("scan", lambda u: np.asarray(u) + 1), S((), jnp.float32), i, c + t, ordered=True)
            return y, y * 2

        c, ys = lax.scan(step, v, jnp.arange(4, dtype=jnp.float32))
        z = lax.cond(v > 1, lambda u: io_callback(rec("then", lambda w: np.asarray(w) * 10), S((), jnp.float32), i, u,
                                                  ordered=True),
                     lambda u: io_callback(rec("else", lambda w: np.asarray(w) - 10), S((), jnp.float32), i, u,
                                           ordered=True), c)
        w = jax.jit(lambda u: io_callback(rec("jit", lambda w: np.asarray(w) / 2), S((), jnp.float32), i, u,
                                          ordered=True))(z)
        k = lax.fori_loop(0, 3, lambda j, u: io_callback(rec("fori", lambda w: np.asarray(w) + 1), S((), jnp.float32),
                                                         i, u, ordered=True), w)
        return k, ys

    real = done(mapped("pmap", f)(X))
    real_calls = rec.take()
    assert [t for t, _ in real_calls[0]] == ["scan"] * 4 + ["else", "jit"] + ["fori"] * 3
    assert_same(real, mapped("pmap", f, executor)(X))
    assert rec.take() == real_calls


@pytest.mark.parametrize("executor", EXECUTORS)
def test_ordered_io_callback_on_a_two_axis_shard_map(executor):
    rec = Recorder()
    mesh = _mesh((4, 2), ("a", "b"))

    def f(v):
        i = lax.axis_index(("a", "b"))
        a = io_callback(rec("a", lambda u: np.asarray(u) * 10), S(v.shape, v.dtype), i, v, ordered=True)
        return io_callback(rec("b", lambda u: np.asarray(u) + 1), S(v.shape, v.dtype), i, a, ordered=True)

    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    kwargs = dict(mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b"))
    real = done(jax.shard_map(f, **kwargs)(x))
    real_calls = rec.take()
    assert len(real_calls) == 8
    assert_same(real, sjax.shard_map(f, executor=executor, **kwargs)(x))
    assert rec.take() == real_calls


# -- pure_callback's vmap_method, for a vmap inside the map -----------------------------------------------------

@pytest.mark.parametrize("method", ["sequential", "sequential_unrolled", "expand_dims", "broadcast_all",
                                    "legacy_vectorized"])
@pytest.mark.parametrize("api", APIS)
def test_pure_callback_vmap_method_inside_the_map(api, method):
    """What the callback sees is JAX's choice when it traces: one call per element (sequential), or one call
    per device on the batch with unbatched operands given a unit axis (expand_dims), tiled (broadcast_all) or
    as they are (legacy_vectorized)."""
    rec = Recorder()

    def callback(i, a, b):
        rec("shapes")(i, np.asarray([np.ndim(a), *np.shape(a), -1, np.ndim(b), *np.shape(b)]))
        return np.asarray(a) * 2 + np.asarray(b)

    def f(x, y):
        i = lax.axis_index("i")
        return jax.vmap(lambda a: jax.pure_callback(callback, S(a.shape, a.dtype), i, a, y, vmap_method=method))(x)

    y = np.float32(0.5)
    real = done(mapped(api, f, in_axes=(0, None))(X3, y))
    real_calls = rec.take()
    for executor in EXECUTORS:
        assert_same(real, mapped(api, f, executor, in_axes=(0, None))(X3, y))
        calls = rec.take()
        assert {d: sorted(c) for d, c in calls.items()} == {d: sorted(c) for d, c in real_calls.items()}, executor


@pytest.mark.parametrize("executor", EXECUTORS)
def test_pure_callback_without_vmap_method_under_vmap_is_jaxs_not_implemented_error(executor):
    def f(x):
        return jax.vmap(lambda a: jax.pure_callback(lambda u: u, S((), jnp.float32), a))(x)

    with pytest.raises(NotImplementedError, match="vmap_method"):
        jax.pmap(f)(X3)
    with pytest.raises(NotImplementedError, match="vmap_method"):
        sjax.pmap(f, executor=executor)(X3)


# -- results: JAX's canonicalisation and checks -------------------------------------------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_results_are_canonicalised_as_jax_does(executor):
    """A Python float, float64 and int64 results are narrowed (x64 off) to the declared float32/int32; results
    come back as fresh arrays (the callback may reuse its buffer)."""
    buffer = np.zeros(3, np.float32)

    def reuse(v):
        buffer[:] = np.asarray(v)
        return buffer

    def f(v):
        a = io_callback(lambda u: float(u) * 2, S((), jnp.float32), v)
        b = jax.pure_callback(lambda u: np.float64(u) + 0.25, S((), jnp.float32), v)
        c = io_callback(lambda u: int(u), S((), jnp.int32), v)
        d = io_callback(lambda: None, None)  # no results
        e = io_callback(reuse, S((3,), jnp.float32), jnp.stack([v, v + 1, v + 2]), ordered=True)
        return a, b, c, d, e

    real = done(jax.pmap(f)(X))
    got = sjax.pmap(f, executor=executor)(X)
    assert_same(real[:4], got[:4])
    # The reused buffer: XLA:CPU may keep the callback's array without copying it, so real JAX's rows can show a
    # later device's values (seen in CI: device 1 got device 2's). spmdsim copies; NumPy gives the expectation.
    np.testing.assert_array_equal(np.asarray(got[4]), np.stack([X, X + 1, X + 2], axis=1))
    assert np.asarray(got[4]).dtype == np.float32


WRONG = {  # name -> (declared result, what the callback returns, JAX's sentence)
    "shape": (S((), jnp.float32), lambda v: np.zeros(2, np.float32),
              "Incorrect output shape for return value #0: Expected: (), Actual: (2,)"),
    "dtype": (S((), jnp.float32), lambda v: np.int32(3),
              "Incorrect output dtype for return value #0: Expected: float32, Actual: int32"),
    "count": (S((), jnp.float32), lambda v: (v, v),
              "Mismatched number of outputs from callback. Expected: 1, Actual: 2"),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("prim", ["io_callback", "io_callback_ordered", "pure_callback"])
@pytest.mark.parametrize("wrong", list(WRONG))
def test_a_wrong_result_is_jaxs_runtime_error_naming_device_primitive_and_line(wrong, prim, executor):
    declared, returns, sentence = WRONG[wrong]
    call = {"io_callback": io_callback, "io_callback_ordered": functools.partial(io_callback, ordered=True),
            "pure_callback": jax.pure_callback}[prim]

    def f(v):
        return call(returns, declared, v) + 1

    with jax_raises(jax.errors.JaxRuntimeError, match="CpuCallback error") as real:
        jax.block_until_ready(jax.pmap(f, axis_name="i")(X))
    assert sentence in str(real.value)
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        sjax.pmap(f, axis_name="i", executor=executor)(X)
    msg = str(info.value)
    assert sentence in msg and prim.replace("_ordered", "") in msg and line_of(f, "return call(") in msg
    notes = "\n".join(info.value.__notes__)
    assert "spmdsim: raised on device 0 [i=0]." in notes
    assert "also raised the same error" in notes  # every device: one line, not one per device
    assert set(info.value.device_errors) == {f"device {d} [i={d}]" for d in range(N)}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_error_on_some_devices_names_the_first(executor):
    def f(v):
        return io_callback(lambda u: np.zeros(2, np.float32) if float(u) > 2 else u, S((), jnp.float32), v,
                           ordered=True)

    with pytest.raises(jax.errors.JaxRuntimeError, match="Incorrect output shape") as info:
        sjax.pmap(f, axis_name="i", executor=executor)(X)
    first = int(np.argmax(X > 2))
    assert f"spmdsim: raised on device {first} [i={first}]." in info.value.__notes__
    assert set(info.value.device_errors) == {f"device {d} [i={d}]" for d in range(N) if X[d] > 2}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_exception_in_the_callback_propagates_as_itself(executor):
    """A documented difference: JAX wraps it in a JaxRuntimeError whose text holds the traceback; spmdsim raises
    the callback's own exception, its device named in a note (as for jax.debug.callback)."""
    def bad(u):
        if float(u) > 2:
            raise ValueError(f"bad value {float(u)}")
        return u

    def f(v):
        return jax.pure_callback(bad, S((), jnp.float32), v)

    with jax_raises(jax.errors.JaxRuntimeError, match="ValueError: bad value"):
        jax.block_until_ready(jax.pmap(f, axis_name="i")(X))
    first = int(np.argmax(X > 2))
    with pytest.raises(ValueError, match=f"bad value {X[first]}") as info:
        sjax.pmap(f, axis_name="i", executor=executor)(X)
    assert f"spmdsim: raised on device {first} [i={first}]." in info.value.__notes__


@pytest.mark.parametrize("executor", EXECUTORS)
def test_sharding_inside_a_map_is_jaxs_not_implemented_error(executor):
    def f(v):
        return jax.pure_callback(lambda u: u, S((), jnp.float32), v,
                                 sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))

    with pytest.raises(NotImplementedError, match="inside spmd computations"):
        jax.pmap(f)(X)
    with pytest.raises(NotImplementedError, match="inside spmd computations"):
        sjax.pmap(f, executor=executor)(X)


# -- operands as JAX gives them -----------------------------------------------------------------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_operands_arrive_as_jax_arrays_and_keys_as_their_key_data(executor):
    seen = []

    def look(k, raw, v):
        seen.append((type(k).__name__, str(k.dtype), k.shape, type(raw).__name__, str(v.dtype), v.shape))
        return np.asarray(k), np.asarray(v) * 2

    def f(k, v):
        return jax.pure_callback(look, (S((2,), jnp.uint32), S(v.shape, v.dtype)), k, jax.random.key_data(k), v)

    keys = jax.random.split(jax.random.key(3), N)
    real = done(jax.pmap(f)(keys, X))
    real_seen, seen[:] = sorted(seen), []
    assert_same(real, sjax.pmap(f, executor=executor)(keys, X))
    assert sorted(seen) == real_seen and real_seen[0][:3] == ("ArrayImpl", "uint32", (2,))


# -- transformations around the map ---------------------------------------------------------------------------

@jax.custom_jvp
def host_sin(v):
    return jax.pure_callback(np.sin, S(v.shape, v.dtype), v, vmap_method="expand_dims")


@host_sin.defjvp
def _host_sin_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    return host_sin(v), jax.pure_callback(np.cos, S(v.shape, v.dtype), v, vmap_method="expand_dims") * dv


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("api", APIS)
def test_grad_of_a_pure_callback_with_custom_jvp(api, executor):
    """(shard_map with check_vma=False: with it, JAX rejects this JVP rule, whose tangent varies over 'i'.)"""
    def loss(pm):
        return lambda x: jnp.sum(pm(lambda v: host_sin(v) * v)(x))

    real = jax.grad(loss(lambda f: mapped(api, f, check_vma=False)))(X)
    got = jax.grad(loss(lambda f: mapped(api, f, executor, check_vma=False)))(X)
    np.testing.assert_allclose(got, real, rtol=1e-6)
    assert got.dtype == real.dtype


@pytest.mark.parametrize("executor", EXECUTORS)
def test_jit_around_the_map(executor):
    rec = Recorder()

    def f(v):
        i = lax.axis_index("i")
        a = io_callback(rec("a", lambda u: np.asarray(u) * 2), S((), jnp.float32), i, v, ordered=True)
        b = jax.pure_callback(lambda u: np.asarray(u) + 1, S((), jnp.float32), a)
        jax.debug.callback(rec("d"), i, b)
        return io_callback(rec("c", lambda u: np.asarray(u) - 3), S((), jnp.float32), i, b, ordered=True)

    real = done(jax.jit(lambda x: jax.pmap(f, axis_name="i")(x) * 2)(X))
    real_calls = rec.take()
    got = jax.jit(lambda x: sjax.pmap(f, axis_name="i", executor=executor)(x) * 2)(X)
    jax.effects_barrier()
    assert_same(real, got)
    calls = rec.take()
    assert {d: [t for t, _ in c if t != "d"] for d, c in calls.items()} == \
        {d: [t for t, _ in c if t != "d"] for d, c in real_calls.items()}
    assert {d: sorted(c) for d, c in calls.items()} == {d: sorted(c) for d, c in real_calls.items()}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_jit_keeps_a_map_with_callbacks_whose_outputs_are_unused(executor):
    """jit lowers a map whose body has effects to an io_callback (ordered if an effect is), which XLA keeps."""
    rec = Recorder()

    def f(v):
        io_callback(rec("u", lambda u: u), S((), jnp.float32), lax.axis_index("i"), v)
        return v

    done(jax.jit(lambda x: (jax.pmap(f, axis_name="i")(x), 0)[1])(X))
    real_calls = rec.take()
    assert len(real_calls) == N
    jax.block_until_ready(jax.jit(lambda x: (sjax.pmap(f, axis_name="i", executor=executor)(x), 0)[1])(X))
    assert rec.take() == real_calls


@pytest.mark.parametrize("executor", EXECUTORS)
def test_vmap_around_the_map(executor):
    rec = Recorder()

    def f(v):
        i = lax.axis_index("i")
        a = io_callback(rec("io", lambda u: np.asarray(u) + 1), S((), jnp.float32), i, v)
        return a + host_sin(v)

    real = done(jax.vmap(jax.pmap(f, axis_name="i"))(X3.T))
    real_calls = rec.take()
    assert_same(real, jax.vmap(sjax.pmap(f, axis_name="i", executor=executor))(X3.T))
    calls = rec.take()
    assert {d: sorted(c) for d, c in calls.items()} == {d: sorted(c) for d, c in real_calls.items()}
    assert_same(jax.jit(jax.vmap(jax.pmap(f, axis_name="i")))(X3.T),
                jax.jit(jax.vmap(sjax.pmap(f, axis_name="i", executor=executor)))(X3.T))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_vmap_of_an_ordered_io_callback_is_jaxs_value_error(executor):
    def f(v):
        return io_callback(lambda u: u, S((), jnp.float32), v, ordered=True)

    with pytest.raises(ValueError, match="Cannot `vmap` ordered IO callback"):
        jax.vmap(jax.pmap(f))(X3.T)
    with pytest.raises(ValueError, match="Cannot `vmap` ordered IO callback"):
        jax.vmap(sjax.pmap(f, executor=executor))(X3.T)


@pytest.mark.parametrize("executor", EXECUTORS)   # the vectorized while runs only the devices still looping
def test_io_callback_in_a_while_condition_runs_once_per_test_on_each_device(executor):
    rec = Recorder()

    def f(v):
        i = lax.axis_index("i")
        return lax.while_loop(lambda c: io_callback(rec("cond", lambda u: u), S((), jnp.float32), i, c) < v,
                              lambda c: c + 1, jnp.float32(-3))

    real = done(jax.pmap(f, axis_name="i")(X))
    real_calls = rec.take()
    assert_same(real, sjax.pmap(f, axis_name="i", executor=executor)(X))
    assert rec.take() == real_calls


# -- debug.print still works ----------------------------------------------------------------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_debug_print_next_to_io_callbacks(executor, capsys):
    def f(v):
        jax.debug.print("v={v}", v=v)
        return io_callback(lambda u: np.asarray(u) + 1, S((), jnp.float32), v, ordered=True)

    got = sjax.pmap(f, axis_name="i", executor=executor)(X[:4])
    out = capsys.readouterr().out
    assert_same(jax.pmap(f, axis_name="i")(X[:4]), got)
    assert [line.split("| ")[-1] for line in out.splitlines()] == [f"v={x}" for x in X[:4]]


# -- a callback that computes with JAX under jax.set_mesh -------------------------------------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_callback_computes_with_jax_outside_the_programs_mesh(executor):
    """XLA runs a callback in its own thread, outside ``jax.set_mesh``'s context: ``arr + 1`` on the operand (on
    one CPU device) works. The vectorized executor, which evaluates in the caller's thread, once raised JAX's
    "Received incompatible devices" (JAX's shard_map_test ``test_pure_callback_return_multiple_arrays``)."""
    mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,))

    def host(arr):
        return arr + 1, arr * 2.0

    def body(block):
        spec = S(block.shape, block.dtype)
        return jax.pure_callback(host, (spec, spec), block)

    x = np.arange(32, dtype=np.float32).reshape(16, 2)
    with jax.set_mesh(mesh):
        real = done(jax.shard_map(body, in_specs=P("x"), out_specs=(P("x"), P("x")))(jax.device_put(x, P("x"))))
        got = sjax.shard_map(body, in_specs=P("x"), out_specs=(P("x"), P("x")), executor=executor)(
            jax.device_put(x, P("x")))
    assert_same(real, got)
