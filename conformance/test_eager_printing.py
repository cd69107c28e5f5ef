"""Unmodified programs that print inside an eager ``jax.shard_map`` print under ``spmdsim run`` what they print on
JAX (issue 40): the body's Python runs once per call, its values print one block per device under JAX's ``On cpu:k
at mesh coordinates ...`` headings, shapes print once, ``if`` on a value the same on every device works. Reduced
forms of JAX's shard_map collectives tutorial (BEFORE/AFTER a psum), uvadlc's data-parallel introduction (local,
original and gathered shapes) and JAX's shard_map JEP (block shapes), each run by real JAX on 8 CPU devices and by
``spmdsim run --devices 8`` with both executors; the whole standard output must be equal, character for character.
``--eager-shard-map per-device`` keeps spmdsim's per-device Python: each line once per device, labelled."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")
pytestmark = pytest.mark.area("eager shard_map")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300

PROGRAM = '''
from functools import partial
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((8,), ('i',), axis_types=(jax.sharding.AxisType.Explicit,))
x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P('i')))

@partial(jax.shard_map, mesh=mesh, in_specs=P('i'), out_specs=P())   # the collectives tutorial's psum
def f1(x_block):
    print('BEFORE:\\n', x_block)
    y_block = jax.lax.psum(x_block, 'i')
    print('AFTER:\\n', y_block)
    return y_block
print(f1(x))

mesh2 = jax.make_mesh((4, 2), ('x', 'y'), axis_types=(jax.sharding.AxisType.Explicit,) * 2)

@partial(jax.shard_map, mesh=mesh2, in_specs=(P('x', 'y'), P('x', None)), out_specs=P('x', None))
def layer(a, w):   # uvadlc's data-parallel introduction: shapes, once per call
    print("Local x shape", a.shape)
    print("Original w shape", w.shape)
    g = jax.lax.all_gather(w, 'x', axis=0, tiled=True)
    print("Gathered w shape", g.shape)
    if jax.lax.psum(1, 'x') == 4:   # the same on every device: Python may branch on it
        print("four along x")
    return jax.lax.psum(a, 'y') @ g[:2, :2].T
a = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh2, P('x', 'y')))
w = jax.device_put(jnp.ones((8, 6)), NamedSharding(mesh2, P('x', None)))
out = layer(a, w)
print(out.shape, out.sharding.spec, np.asarray(out).sum())

def matmul_basic(a, b):   # the JEP's first example, with its block shapes printed
    print("blocks", a.shape, b.shape)
    c = jnp.dot(a, b)
    print("partial", c.shape)
    return jax.lax.psum(c, 'y')
m = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
c = jax.shard_map(matmul_basic, mesh=m, in_specs=(P('x', 'y'), P('y', None)), out_specs=P('x', None))(
    jnp.arange(64.0).reshape(8, 8), jnp.arange(32.0).reshape(8, 4))
print(c.shape, np.asarray(c)[:2].tolist())
'''


ERRORS = '''
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P

def show(thunk):
    try:
        thunk()
    except Exception as e:
        print(type(e).__name__, e)

mesh = Mesh(np.array(jax.devices()[:4]), ('i',))
mesh2 = jax.make_mesh((4, 2), ('i', 'j'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
x = np.arange(16).reshape(4, 4)
# an output's rank too small for its out_specs (uvadlc's scatter_example): JAX names the type without {V:i}
scatter = lambda x: jax.lax.psum_scatter(x, 'i', scatter_dimension=1)
show(lambda: jax.shard_map(scatter, mesh=mesh, in_specs=P('i', None), out_specs=P('i', None))(x))
show(lambda: jax.shard_map(lambda x: {'a': x, 'b': jnp.sum(x)}, mesh=mesh, in_specs=P('i'),
                           out_specs={'a': P('i'), 'b': P('i')})(x))
# an output varying where its out_specs say replicated (the collectives tutorial's identity with out_specs P()):
# JAX's eager map finds it moving that one output to its spec, in jit(shard_map(_rem_singleton))
show(lambda: jax.shard_map(lambda x: x, mesh=mesh, in_specs=P('i'), out_specs=P())(x))
def three(x):
    return x, jnp.sin(x), x * 2
show(lambda: jax.shard_map(three, mesh=mesh, in_specs=P('i'), out_specs=(P('i'), P(), P()))(x))
show(lambda: jax.shard_map(lambda x: {'a': x, 'b': [x]}, mesh=mesh2, in_specs=P('i', 'j'),
                           out_specs={'a': P('i', 'j'), 'b': [P('i')]})(x))
show(lambda: jax.shard_map(lambda x: x, mesh=mesh2, in_specs=P('i', 'j'), out_specs=P())(x))
# under jit, the user's function and every output, with its type's varying axes
show(lambda: jax.jit(jax.shard_map(three, mesh=mesh, in_specs=P('i'), out_specs=(P('i'), P(), P())))(x))
show(lambda: jax.jit(jax.shard_map(scatter, mesh=mesh, in_specs=P('i', None), out_specs=P('i', None)))(x))
'''

def run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", **env})


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    path = tmp_path_factory.mktemp("eager") / "eager_prints.py"
    path.write_text(PROGRAM)
    jax_run = run([str(path)], {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    assert jax_run.returncode == 0, jax_run.stderr
    return path, jax_run.stdout


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_an_eager_shard_map_prints_what_jax_prints(program, executor):
    path, expected = program
    sim = run(["-m", "spmdsim", "run", "--devices", "8", "--executor", executor, str(path)], {})
    assert sim.returncode == 0, sim.stderr
    assert expected.count("Local x shape (2, 2)\n") == 1 and expected.count("On cpu:7 at mesh") == 2
    assert sim.stdout == expected


def test_per_device_bodies_on_request(program):
    path, _ = program
    sim = run(["-m", "spmdsim", "run", "--devices", "8", "--eager-shard-map", "per-device", str(path)], {})
    assert sim.returncode == 0, sim.stderr
    lines = sim.stdout.splitlines()
    assert sorted(line for line in lines if "Local x shape" in line) == [
        f"device {d} [x={d // 2}, y={d % 2}] | Local x shape (2, 2)" for d in range(8)]
    assert sum("On cpu:" in line for line in lines) == 16   # each device prints its own block, twice


@pytest.fixture(scope="module")
def errors_program(tmp_path_factory):
    path = tmp_path_factory.mktemp("eager") / "eager_errors.py"
    path.write_text(ERRORS)
    jax_run = run([str(path)], {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    assert jax_run.returncode == 0, jax_run.stderr
    return path, jax_run.stdout


@pytest.mark.parametrize("options", [["--executor", "threads"], ["--executor", "vectorized"],
                                     ["--eager-shard-map", "per-device"]])
def test_an_eager_shard_map_s_out_specs_errors_read_as_jax_s(errors_program, options):
    """The out_specs errors of an eager map name what JAX 0.10-0.12's eager map names: the rank error the types
    without varying axes (``int32[1]``), the replication error ``_rem_singleton`` and one output; under jit, the
    user's function and every failing output."""
    path, expected = errors_program
    sim = run(["-m", "spmdsim", "run", "--devices", "8", *options, str(path)], {})
    assert sim.returncode == 0, sim.stderr
    assert expected.count("'_rem_singleton'") == 4 and expected.count("int32[1]{V:i}") == 1
    assert sim.stdout == expected
