"""An un-jitted shard_map runs eagerly, as in JAX 0.10 (issue 25): its body's values print as JAX's eager values
("On cpu:0 at mesh coordinates (i,) = (0,):" and the block), Python control flow works on values that are the same
on every device and raises JAX's error on values that vary, JAX's eager errors come where JAX raises them. Each
program runs on ``jax.shard_map`` and on spmdsim's side by side on the same CPU devices, in both of spmdsim's eager
modes (issue 40): ``once`` (the default), the body's Python run once per call as JAX runs it, printing what JAX
prints; ``per-device``, once per device, each device showing its own block (JAX's text is every device's, in device
order)."""
from __future__ import annotations

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import spmdsim.jax as sj

pytestmark = [pytest.mark.area("eager shard_map"),
              pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 JAX devices")]

EXECUTORS = ["threads", "vectorized"]
EAGER = ["once", "per-device"]


def mesh_1d():
    return Mesh(np.array(jax.devices()[:4]), ("i",))


def mesh_2d():
    return Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))


def both(executor, eager="once"):
    """(name, shard_map) for JAX's and spmdsim's."""
    return [("jax", jax.shard_map),
            ("spmdsim", lambda f, **kw: sj.shard_map(f, executor=executor, eager=eager, **kw))]


def _by_device(texts: list[str]) -> str:
    """spmdsim's per-device texts of one value as JAX's one text: every device's, in device order."""
    def device(text):
        return tuple(int(c) for c in re.search(r"= \(([\d, ]+)\)", text).group(1).replace(" ", "").split(",") if c)
    return "\n".join(sorted(texts, key=device))


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("mesh,spec,check_vma", [(mesh_1d, P("i"), True), (mesh_2d, P("x", "y"), True),
                                                 (mesh_2d, P("x"), True), (mesh_1d, P("i"), False)])
def test_values_print_as_jax_eager_values(executor, eager, mesh, spec, check_vma):
    x = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    printed = {}
    for name, shard_map in both(executor, eager):
        texts, lock = [], threading.Lock()

        def body(b):
            y = jax.lax.psum(b, "i" if "i" in spec else "x") * 2 + 1
            with lock:
                texts.append((str(b), repr(y), jax.typeof(b).str_short(), type(b).__name__))
            return b
        out = shard_map(body, mesh=mesh(), in_specs=spec, out_specs=spec, check_vma=check_vma)(x)
        np.testing.assert_array_equal(np.asarray(out), x)
        printed[name] = texts
    (jax_b, jax_y, jax_type, jax_class), = printed["jax"]
    if eager == "once":  # the body ran once, printing what JAX prints
        assert printed["spmdsim"] == printed["jax"]
        return
    assert len(printed["spmdsim"]) == 4
    assert _by_device([t[0] for t in printed["spmdsim"]]) == jax_b
    assert _by_device([t[1] for t in printed["spmdsim"]]) == jax_y
    assert {(t[2], t[3]) for t in printed["spmdsim"]} == {(jax_type, jax_class)}


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_python_control_flow_on_values(executor, eager):
    """JAX's test_eager_control_flow and test_axis_index_eager: ``if`` on a value the same on every device works;
    on a varying one (under check_vma=False, on any value) both raise TracerBoolConversionError."""
    x = jnp.arange(4.0).reshape(2, 2)
    for name, shard_map in both(executor, eager):
        def f(b):
            return b if jax.lax.psum(b, ("x", "y")) < 0 else -b
        y = shard_map(f, mesh=mesh_2d(), in_specs=P("x", "y"), out_specs=P("x", "y"))(x)
        np.testing.assert_array_equal(np.asarray(y), -np.asarray(x), err_msg=name)

        def g():
            return 1.0 if jax.lax.psum(jax.lax.axis_index("i"), "i") > 0 else -1.0
        assert float(shard_map(g, mesh=mesh_1d(), in_specs=(), out_specs=P())()) == 1.0, name
        for check_vma, body in ((True, lambda b: b if b[0] > 0 else -b),
                                (False, lambda b: b if jax.lax.psum(b, "i")[0] > 0 else -b)):
            with pytest.raises(jax.errors.TracerBoolConversionError, match=r"bool\[\]"):
                shard_map(body, mesh=mesh_1d(), in_specs=P("i"), out_specs=P("i"), check_vma=check_vma)(
                    jnp.arange(8.0))


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_values_collectives_jit_and_keys_as_jax(executor, eager):
    """A body with collectives, a jitted function, JAX's own jitted numpy functions, PRNG keys and a nested map,
    computed by spmdsim, equal JAX's."""
    x = jnp.arange(16.0).reshape(8, 2)

    def body(b, k):
        s = jax.lax.psum(b, "x")
        i = jax.lax.axis_index("x")
        noise = jax.random.uniform(jax.random.fold_in(k[0], i), b.shape)
        g = jax.lax.all_gather(b, "x", tiled=True)
        return jnp.cumsum(b, axis=0) + jax.jit(lambda a: jnp.sin(a) * 2)(s) + noise + g[:b.shape[0]], \
            jax.lax.ppermute(b, "x", [(j, (j + 1) % 4) for j in range(4)])

    keys = jax.random.split(jax.random.key(0), 4)
    outs = {}
    for name, shard_map in both(executor, eager):
        mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
        outs[name] = shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=(P("x"), P("x")))(x, keys)
    for a, b in zip(outs["spmdsim"], outs["jax"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
        assert a.sharding == b.sharding


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_transformations_and_control_flow_inside_the_body(executor, eager):
    """custom_jvp functions, cond, fori_loop with a collective, grad, checkpoint and vmap inside an eager body."""
    def body(b):
        y = jax.nn.relu(b - 2) + jax.nn.softmax(b)
        z = jax.lax.cond(jax.lax.psum(1, "x") > 1, lambda v: v * 2, lambda v: v, y)
        w = jax.lax.fori_loop(0, 3, lambda i, c: c + jax.lax.pmean(c, "x"), z)
        g = jax.grad(lambda v: jnp.sum(jnp.sin(v)))(b)
        return w + g + jax.checkpoint(lambda v: jnp.cos(v) * 2)(b) + jax.vmap(lambda r: r * 3)(b)

    x = jnp.arange(8.0).reshape(4, 2)
    outs = {name: shard_map(body, mesh=mesh_2d(), in_specs=P("x"), out_specs=P("x"))(x)
            for name, shard_map in both(executor, eager)}
    np.testing.assert_allclose(np.asarray(outs["spmdsim"]), np.asarray(outs["jax"]), rtol=1e-6)


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_nested_eager_maps(executor, eager):
    x = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    outs, printed = {}, {}
    for name, shard_map in both(executor, eager):
        texts, lock = [], threading.Lock()

        def inner(c):
            y = jax.lax.psum(c, "y") + jax.lax.axis_index("x")
            with lock:
                texts.append(str(y))
            return y

        def outer(b):
            return shard_map(inner, mesh=None, in_specs=P(None, "y"), out_specs=P(None, "y"), axis_names={"y"})(b)
        outs[name] = shard_map(outer, mesh=mesh_2d(), in_specs=P("x"), out_specs=P("x"), axis_names={"x"})(x)
        printed[name] = texts
    np.testing.assert_array_equal(np.asarray(outs["spmdsim"]), np.asarray(outs["jax"]))
    (jax_text,) = printed["jax"]
    if eager == "once":
        assert printed["spmdsim"] == [jax_text]
    else:
        assert _by_device(printed["spmdsim"]) == jax_text


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_jax_eager_errors(executor, eager):
    """JAX's eager rules: device_put to a device, a returned jax.Ref; an out_spec that replicates a varying value."""
    x = jnp.arange(8.0)
    for name, shard_map in both(executor, eager):
        with pytest.raises(ValueError, match="got device"):
            shard_map(lambda b: b + jax.device_put(1.0, jax.devices()[0]), mesh=mesh_1d(), in_specs=P("i"),
                      out_specs=P("i"))(x)
        with pytest.raises(ValueError, match="Eager shard_map cannot return a `jax.Ref`"):
            shard_map(lambda b: jax.freeze(jax.new_ref(b)), mesh=mesh_1d(), in_specs=P("i"), out_specs=P("i"),
                      check_vma=False)(x)
        with pytest.raises(ValueError, match="out_specs which require replication"):
            shard_map(lambda b: b, mesh=mesh_1d(), in_specs=P("i"), out_specs=P())(x)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_error_names_the_device_and_line_and_leaves_no_device_waiting(executor):
    """A device that raises while the others wait in a collective: its error, naming it, at once; the next call
    runs."""
    def check(v):
        if v[0] == 4:
            raise RuntimeError("device two")
        return v

    def body(b):
        b = jax.pure_callback(check, jax.ShapeDtypeStruct(b.shape, b.dtype), b)
        return jax.lax.psum(b, "i")

    f = sj.shard_map(body, mesh=mesh_1d(), in_specs=P("i"), out_specs=P(), executor=executor)
    with pytest.raises(RuntimeError, match="device two") as info:
        f(jnp.arange(8.0))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "device 2 [i=2]" in notes
    assert any(entry.path.name == "test_eager_shard_map.py" and "raise RuntimeError" in str(entry.statement)
               for entry in info.traceback)
    np.testing.assert_array_equal(np.asarray(f(-jnp.arange(8.0))), -np.array([12.0, 16.0]))


@pytest.mark.parametrize("manual", ["x", "y"])
def test_partial_manual_output_placed_as_jax_places_it(manual):
    """shard_map_test's ``test_smap_auto_explicit``: an eager partial-manual map on a mesh with an Explicit axis
    ('x') and an Auto one ('y'): the output is split by its type's Explicit axes and by the manual axis as written
    (``P('y')`` for a map over the Auto axis 'y')."""
    from jax.sharding import AxisType, NamedSharding

    mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit, AxisType.Auto))
    results = {}
    with jax.set_mesh(mesh):
        arr = jax.device_put(np.arange(4), P(manual))
        for name, shard_map in both("threads"):
            f = shard_map(lambda b: b * 2, in_specs=P(manual), out_specs=P(manual), axis_names={manual})
            results[name] = f(arr)
    assert results["jax"].sharding == NamedSharding(mesh, P(manual))
    assert results["spmdsim"].sharding == results["jax"].sharding
    np.testing.assert_array_equal(np.asarray(results["spmdsim"]), np.arange(4) * 2)


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_debug_print_in_an_eager_body(executor, eager, capsys):
    """shard_map_test's ``test_debug_print_eager``: jax.debug.print in an eager body prints each device's block
    (spmdsim labels each line with its device, as in every map) and the map returns its value."""
    x = jnp.arange(8.0)
    printed = {}
    for name, shard_map in both(executor, eager):
        def body(b):
            jax.debug.print("b={b}", b=b)
            return b * 2
        out = shard_map(body, mesh=mesh_1d(), in_specs=P("i"), out_specs=P("i"))(x)
        jax.effects_barrier()
        np.testing.assert_array_equal(np.asarray(out), 2 * np.asarray(x))
        printed[name] = sorted(line.split("| ")[-1] for line in capsys.readouterr().out.splitlines())
    assert printed["spmdsim"] == printed["jax"] == [f"b=[{2 * k:.0f}. {2 * k + 1:.0f}.]" for k in range(4)]
