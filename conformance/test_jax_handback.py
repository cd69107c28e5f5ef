"""What spmdsim hands to JAX is what JAX hands back (issue 25, points 2 and 7).

Every ``jax.Array`` a map returns has the placement JAX gives it: a pmap's output a committed ``NamedSharding``
over ``Mesh(devices[:n], (axis_name or '_internal_pmap_axis_name',))`` (JAX 0.10's pmap is a jit of a
shard_map), a shard_map's on its mesh by its out_spec (the context mesh for a shard_map without ``mesh=`` under
``jax.set_mesh``), a jitted program's outputs on its maps' mesh; the same shards on the same devices, the same
type (``float32[8@X]`` for Explicit axes) and weak type, on the first call and on calls remembered, under
``jit``, ``grad`` and ``vmap``, with both executors. Where JAX has no such devices the output is placed as
``jnp.asarray`` places it where it is called. The issue's reproducers also run as scripts under ``spmdsim run``
against the same scripts under plain ``python`` with JAX's 8 CPU devices: their output is the same, and so is
the file name JAX prints in an error (the script runs from its absolute path, as Python runs it).
"""
import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import spmdsim
import spmdsim.jax as sjax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXECUTORS = ["threads", "vectorized"]
X = np.arange(24, dtype=np.float32).reshape(8, 3)


def _data(shard):
    data = shard.data
    if jax.dtypes.issubdtype(data.dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(data)
    return np.asarray(data)


def placement(y) -> tuple:
    """Everything about a jax.Array that the caller can see, but its identity."""
    assert isinstance(y, jax.Array), type(y)
    return (type(y.sharding).__name__, y.sharding, y.committed, str(jax.typeof(y)), getattr(y, "weak_type", None),
            [(s.device.id, s.index, _data(s).dtype.str, _data(s).tobytes()) for s in y.addressable_shards])


def handed_back(results) -> list:
    return [[placement(leaf) for leaf in jax.tree_util.tree_leaves(r)] for r in results]


def assert_as_jax(build, executor: str, calls: int = 2):
    """``build(api)`` (``api``: ``"jax"`` or an executor) returns a thunk; its results, on the first call and on
    those after (remembered signatures), are placed as JAX places them."""
    expected = handed_back([thunk() for thunk in [build("jax")] * calls])
    thunk = build(executor)
    got = handed_back([thunk() for _ in range(calls)])
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected)):
        assert len(g) == len(e), (k, g, e)
        for leaf, (gl, el) in enumerate(zip(g, e)):
            assert gl == el, f"call {k}, leaf {leaf}:\n  spmdsim {gl[:5]}\n  JAX     {el[:5]}"


def pmap(api, f, **kwargs):
    return jax.pmap(f, **kwargs) if api == "jax" else sjax.pmap(f, executor=api, **kwargs)


def shard_map(api, f, **kwargs):
    return jax.shard_map(f, **kwargs) if api == "jax" else sjax.shard_map(f, executor=api, **kwargs)


def jit(api):
    return jax.jit if api == "jax" else sjax.jit


# -- pmap ----------------------------------------------------------------------------------------------------

PMAP_CASES = {
    "default": (lambda x: x * 2, {}, X),
    "named, out_axes=None": (lambda x: jax.lax.psum(x, "i"), {"axis_name": "i", "out_axes": None}, X),
    "out_axes=1": (lambda x: x * 2, {"out_axes": 1}, X),
    "four devices": (lambda x: x * 2, {}, X[:4]),
    "devices=": (lambda x: x * 2, {"devices": "last four"}, X[:4]),
    "weak type": (lambda x: 2.0, {}, X),
    "pytree of dtypes": (lambda d: {"a": d["a"].astype(jnp.int32), "b": (d["b"] > 3, d["a"].sum())}, {},
                         {"a": X, "b": X[:, :2]}),
    "key": (lambda s: jax.random.key(jax.lax.psum(s.astype(jnp.int32).sum(), "i")),
            {"axis_name": "i", "out_axes": None}, X),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(PMAP_CASES))
def test_pmap_outputs_are_placed_as_jax_pmap_places_them(case, executor):
    f, kwargs, x = PMAP_CASES[case]
    if kwargs.get("devices") == "last four":
        kwargs = dict(kwargs, devices=jax.devices()[4:])
    assert_as_jax(lambda api: (lambda g=pmap(api, f, **kwargs): g(x)), executor)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_pmap_under_transformations_hands_back_what_jax_does(executor):
    assert_as_jax(lambda api: lambda: jax.grad(lambda v: pmap(api, lambda u: u * u * 2)(v).sum())(X), executor)
    assert_as_jax(lambda api: lambda: jax.vmap(pmap(api, lambda u: u * 2))(np.ones((2, 8, 3), np.float32)),
                  executor)
    assert_as_jax(lambda api: (lambda g=jit(api)(pmap(api, lambda u: u * 2)): g(X)), executor)
    assert_as_jax(lambda api: (lambda g=jit(api)(lambda v: (pmap(api, lambda u: u * 2)(v).sum(), jnp.ones(3))): g(X)),
                  executor)
    assert_as_jax(lambda api: (lambda g=jit(api)(pmap(api, lambda u: u * 2, devices=jax.devices()[2:6])):
                               g(X[:4])), executor)


# -- shard_map -----------------------------------------------------------------------------------------------

def mesh4():
    return Mesh(jax.devices()[:4], ("i",))


def on_mesh4():
    return jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh4(), P("i")))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_shard_map_outputs_are_placed_as_jax_shard_map_places_them(executor):
    m, x = mesh4(), on_mesh4()

    def double(api, **kwargs):
        return shard_map(api, lambda b: b * 2, mesh=m, in_specs=P("i"), **kwargs)

    assert_as_jax(lambda api: (lambda f=double(api, out_specs=P("i")): f(x)), executor)
    assert_as_jax(lambda api: (lambda f=double(api, out_specs=P("i", None)): f(np.ones((8, 4), np.float32))),
                  executor)
    assert_as_jax(lambda api: (lambda f=shard_map(api, lambda b: jax.lax.psum(b, "i"), mesh=m, in_specs=P("i"),
                                                  out_specs=P()): f(x)), executor)
    assert_as_jax(lambda api: (lambda f=jit(api)(double(api, out_specs=P("i"))): f(x)), executor)
    assert_as_jax(lambda api: (lambda s=double(api, out_specs=P("i")):  # map outputs, inputs, other values
                               jit(api)(lambda v, w: (s(v), s(v).sum(), w, v, jnp.ones(3)))(x, np.ones(3, np.float32))),
                  executor)
    assert_as_jax(lambda api: (lambda s=double(api, out_specs=P("i")): jax.grad(lambda v: s(v).sum())(x)), executor)
    assert_as_jax(lambda api: (lambda s=double(api, out_specs=P("i")): jax.vmap(s)(jnp.ones((2, 8, 4)))), executor)
    m2 = jax.make_mesh((4, 2), ("X", "Y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    y = jax.device_put(jnp.ones((8, 4)), NamedSharding(m2, P("X", "Y")))
    assert_as_jax(lambda api: (lambda f=shard_map(api, lambda b: b * 2, mesh=m2, in_specs=P("X", "Y"),
                                                  out_specs=P(("Y", "X"))): f(y)), executor)
    assert_as_jax(lambda api: (lambda f=shard_map(api, jax.vmap(lambda k: jax.random.fold_in(k, 1)), mesh=m,
                                                  in_specs=P("i"), out_specs=P("i")):
                               f(jax.random.split(jax.random.key(0), 8))), executor)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_issue_25_point_2_a_jitted_shard_map_result_stays_usable(executor):
    """The context mesh's placement of a plain result (replicated, committed) was learnt once and then used with
    one device's buffer for every later result: the second call's output was an uncommitted array on 4 devices."""
    m, x = mesh4(), on_mesh4()
    with jax.set_mesh(m):
        for api in ("jax", executor):
            f = jit(api)(shard_map(api, lambda b: b * 2, in_specs=P("i"), out_specs=P("i")))
            assert [float(jnp.sum(f(x))) for _ in range(3)] == [64.0] * 3
        assert_as_jax(lambda api: (lambda f=jit(api)(shard_map(api, lambda b: b * 2, in_specs=P("i"),
                                                               out_specs=P("i"))): f(x)), executor, calls=3)
        assert_as_jax(lambda api: (lambda s=shard_map(api, lambda b: b * 2, in_specs=P("i"), out_specs=P("i")):
                                   jit(api)(lambda v: s(v).sum())(x)), executor)
        assert_as_jax(lambda api: (lambda s=shard_map(api, lambda b: b * 2, in_specs=P("i"), out_specs=P("i")):
                                   jax.grad(lambda v: s(v).sum())(x)), executor)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_issue_25_point_7a_a_shard_map_on_the_context_mesh_returns_its_sharding(executor):
    with jax.set_mesh(jax.make_mesh((4, 2), ("X", "Y"))):  # Explicit axes
        x = jax.device_put(jnp.arange(8.), jax.P("X"))
        z = shard_map(executor, lambda b: b * 2, out_specs=jax.P("X"))(x)
        assert (str(jax.typeof(z)), z.sharding.spec) == ("float32[8@X]", P("X"))
        assert_as_jax(lambda api: (lambda f=shard_map(api, lambda b: b * 2, out_specs=jax.P("X")): f(x)), executor)
        assert_as_jax(lambda api: (lambda s=shard_map(api, lambda b: b * 2, out_specs=jax.P("X")):
                                   jit(api)(lambda v: (s(v), s(v).sum(), v, jnp.ones((2, 3)), s(v) * 2))(x)),
                      executor)
        assert_as_jax(lambda api: (lambda s=shard_map(api, lambda b: b * 2, out_specs=jax.P("X")):
                                   jax.grad(lambda v: s(v).sum())(x)), executor)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_vmap_over_an_explicit_axis_keeps_the_batch_split_over_it(executor):
    """``jax.vmap`` of a shard_map over an array split along an Explicit mesh axis: the result's batch dimension
    stays split over it, eager and jitted (JAX's shard_map_test ``test_vmap_shmap_psum``; the eager result was
    once ``P()``)."""
    with jax.set_mesh(jax.make_mesh((2, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)):
        arr = jax.device_put(jnp.arange(16).reshape(2, 8), P("x", "y"))
        for jitted in (False, True):
            assert_as_jax(lambda api, jitted=jitted: (
                lambda f=shard_map(api, lambda b: jax.lax.psum(b, "y"), in_specs=P("y"), out_specs=P(None)):
                (jit(api)(jax.vmap(f)) if jitted else jax.vmap(f))(arr)), executor)


# -- jit of programs without a map --------------------------------------------------------------------------

def unpack(state):
    x, y, z = state
    return x + y * z


def test_issue_25_point_7b_jit_of_vmap_of_jit_is_jaxs():
    """JAX's wrappers copy a function's ``__dict__``; spmdsim's jitted function keeps ``trace`` on its class (as
    JAX's does), so ``jax.jit(jax.vmap(f))`` does not trace the unbatched ``f``."""
    expected = jax.jit(jax.vmap(jax.jit(unpack)))(jnp.ones((8, 3)))
    got = sjax.jit(jax.vmap(sjax.jit(unpack)))(jnp.ones((8, 3)))
    assert placement(got) == placement(expected)
    assert "trace" not in vars(jax.vmap(sjax.jit(unpack)))
    assert placement(sjax.jit(jax.grad(sjax.jit(lambda v: unpack(v) ** 2)))(jnp.ones(3))) == \
        placement(jax.jit(jax.grad(jax.jit(lambda v: unpack(v) ** 2)))(jnp.ones(3)))


def test_spmdsims_jit_is_a_method_like_jaxs_and_keeps_jaxs_attributes():
    class Model:
        scale = 3.0

        @functools.partial(sjax.jit, static_argnums=0)
        def apply(self, v):
            return v * self.scale

    assert float(Model().apply(jnp.float32(2.0))) == 6.0
    f = sjax.jit(unpack)
    assert f.__name__ == "unpack" and f.__wrapped__ is unpack
    assert f.lower(jnp.ones(3)).as_text() == jax.jit(unpack).lower(jnp.ones(3)).as_text()
    assert f.eval_shape(jnp.ones(3)).shape == ()
    f(jnp.ones(3))
    assert f._cache_size() >= 1  # JAX's own attribute


# -- where JAX has no such devices: jnp.asarray's placement, wherever it is called ---------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_map_larger_than_jaxs_platform_is_placed_as_jnp_asarray_places_it_there(executor):
    x = np.ones((16, 2), np.float32)
    f = sjax.pmap(lambda v: v * 2, executor=executor)
    with spmdsim.set_device_count(16):
        for _ in range(2):
            got = f(x)
            assert placement(got)[:5] == placement(jnp.asarray(np.asarray(got)))[:5]
            assert got.sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0]) and not got.committed
        with jax.set_mesh(mesh4()):  # jnp.asarray's placement here: the context mesh, replicated, committed
            for _ in range(2):
                got = f(x)
                assert placement(got)[:5] == placement(jnp.asarray(np.asarray(got)))[:5]
                assert got.committed and got.sharding.mesh == mesh4()
                assert float(jnp.sum(got)) == 64.0
        got = f(x)
        assert got.sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0]) and not got.committed
        with jax.default_device(jax.devices()[3]):
            assert f(x).sharding == jax.sharding.SingleDeviceSharding(jax.devices()[3])


def test_the_public_device_put_takes_over_when_the_fast_put_fails(monkeypatch):
    from spmdsim.jax.integration import _map
    f = sjax.pmap(lambda v: (v * 2, 2.0), axis_name="i")
    expected = handed_back([jax.pmap(lambda v: (v * 2, 2.0), axis_name="i")(X)])
    assert handed_back([f(X)]) == expected

    def failing(*args):
        raise RuntimeError("an internal API changed")

    monkeypatch.setattr(_map, "_fast_put", failing)
    got = f(X)
    assert _map._fast_put is None  # from now on the public entry points, which make no weak types

    def strong(placements):
        return [p[:3] + (p[3].lstrip("~"),) + p[5:] for p in placements]
    assert strong(handed_back([got])[0]) == strong(expected[0])
    assert strong(handed_back([f(X)])[0]) == strong(expected[0])


# -- the reproducers as scripts: spmdsim run against python -----------------------------------------------------

SCRIPT = textwrap.dedent('''
    import sys
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    def show(y):
        print(jax.typeof(y), y.sharding, y.committed, [s.device.id for s in y.addressable_shards])

    # issue 25, point 7b, and pmap's placement
    def g(state):
        x, y, z = state
        return x + y * z
    print(jax.jit(jax.vmap(jax.jit(g)))(jnp.ones((8, 3))))
    show(jax.pmap(lambda v: jax.lax.psum(v, "i"), "i")(jnp.ones((8, 2))))

    # point 7a
    with jax.set_mesh(jax.make_mesh((4, 2), ("X", "Y"))):
        x = jax.device_put(jnp.arange(8.), jax.P("X"))
        z = jax.shard_map(lambda b: b * 2, out_specs=jax.P("X"))(x)
        print(jax.typeof(z), z.sharding.spec)
        show(z)

    # point 2
    mesh = Mesh(jax.devices()[:4], ("i",)); jax.set_mesh(mesh)
    x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("i")))
    f = jax.jit(jax.shard_map(lambda b: b * 2, in_specs=P("i"), out_specs=P("i")))
    print(jnp.sum(f(x)))
    print(jnp.sum(f(x)))
    show(f(x))

    # point 7c: the script's path as Python gives it, and JAX's error names the function's file
    print(__file__ == sys.argv[0] or __file__.endswith("/" + sys.argv[0]), __file__.startswith("/"))
    jax.jit(lambda v: 1 if v > 0 else 0)(1.0)
''')


def run(*argv, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def reproducers(tmp_path_factory):
    where = tmp_path_factory.mktemp("handback")
    (where / "handback.py").write_text(SCRIPT)
    python = run("handback.py", cwd=where)
    assert "TracerBoolConversionError" in python.stderr, python.stderr
    return where, python


def error_lines(stderr: str) -> list:
    """The traceback and JAX's error (without ``spmdsim run``'s first line)."""
    lines = stderr.splitlines()
    return lines[next(k for k, line in enumerate(lines) if line.startswith("Traceback")):]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_issue_25_reproducers_under_spmdsim_run_print_what_python_prints(reproducers, executor):
    where, python = reproducers
    simulated = run("-m", "spmdsim", "run", "--devices", "8", "--executor", executor, "handback.py", cwd=where)
    assert simulated.stdout == python.stdout, simulated.stderr
    assert error_lines(simulated.stderr) == error_lines(python.stderr)
    assert f"{where / 'handback.py'}:" in "\n".join(error_lines(simulated.stderr))  # the absolute path


def test_unreduced_and_reduced_specs_are_read_with_their_axes():
    """JAX 0.10's PartitionSpecs with unreduced/reduced axes are read (not JAX's '*pspec is dangerous'): the
    per-dimension tuple, carrying the unreduced and reduced sets (conformance/test_unreduced.py runs them)."""
    from jax.sharding import PartitionSpec as P

    from spmdsim.jax.integration._specs import _spec_dims

    assert _spec_dims(P("x", None), 3) == (("x",), (), ())
    reduced, unreduced = _spec_dims(P(None, reduced={"seq"}), 2), _spec_dims(P("x", unreduced={"seq"}), 2)
    assert tuple(reduced) == ((), ()) and reduced.reduced == {"seq"} and not reduced.unreduced
    assert tuple(unreduced) == (("x",), ()) and unreduced.unreduced == {"seq"} and not unreduced.reduced
    assert reduced != ((), ())  # equal only with the same unreduced and reduced axes (the map's caches key on it)
