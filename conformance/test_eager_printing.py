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
