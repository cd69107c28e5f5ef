"""spmdsim's map inside JAX's own ``jax.jit`` (issue 39): a program that imports ``spmdsim.jax.shard_map`` or
``pmap`` and keeps ``jax.jit``. Each program runs in a subprocess (an XLA abort must fail the test, not end
pytest), once with spmdsim's map and once with JAX's, and prints its result's value and sharding."""
import os
import subprocess
import sys
import textwrap

import pytest

HEADER = """
import os, sys; os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import numpy as np, jax, jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P, AxisType
if sys.argv[1] == "jax":
    shard_map, pmap = jax.shard_map, jax.pmap
else:
    from spmdsim.jax import shard_map, pmap
def show(r):
    print("VALUE", np.asarray(r).round(5).tolist())
    print("SHARDING", r.sharding)
"""

PLACED = """
mesh = jax.make_mesh((4, 2), ('x', 'y'), axis_types=(AxisType.Auto,) * 2)
f = jax.jit(shard_map(lambda b: b * 2, mesh=mesh, in_specs=P('x', 'y'), out_specs=P('x', 'y')))
show(f(jnp.arange(32.).reshape(8, 4)))
"""

PMAP = """
g = jax.jit(pmap(lambda x: lax.psum(x, 'i'), axis_name='i'))
show(g(jnp.arange(8.)))
"""

REPLICATED_OUT = """
mesh = jax.make_mesh((4,), ('x',), axis_types=(AxisType.Auto,))
f = jax.jit(shard_map(lambda b: lax.psum(b, 'x'), mesh=mesh, in_specs=P('x'), out_specs=P()))
show(f(jnp.arange(8.)))
"""

UNREDUCED_GRAD = """
mesh = jax.make_mesh((2,), ('x',), axis_types=(AxisType.Explicit,))
with jax.set_mesh(mesh):
    a = jax.device_put(np.arange(8.).reshape(4, 2), P('x', None))
    b = jax.device_put(np.arange(12.).reshape(2, 6), P('x', None))
    @shard_map(in_specs=P('x', None), out_specs=P(None, None, reduced={'x'}))
    def gather(blk):
        return lax.all_gather(blk, 'x', tiled=True, to='reduced')
    show(jax.jit(jax.grad(lambda a, b: (a @ gather(b)).sum(), argnums=1))(a, b))
"""


def _run(program: str, which: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(HEADER) + textwrap.dedent(program), which],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})


def _lines(out: str) -> list:
    return [line for line in out.splitlines() if line.startswith(("VALUE", "SHARDING"))]


@pytest.mark.parametrize("program", [PLACED, PMAP, REPLICATED_OUT], ids=["shard_map", "pmap", "replicated_out"])
def test_results_carry_jax_shardings(program):
    jax_run, ours = _run(program, "jax"), _run(program, "spmdsim")
    assert jax_run.returncode == 0, jax_run.stderr[-3000:]
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert _lines(ours.stdout) == _lines(jax_run.stdout)


def test_unreduced_under_grad_never_aborts():
    """Shardy aborted the process (explicit_reshards_util.cc: an unreduced value handed to the callback on the
    maximal mesh of device 0)."""
    ours = _run(UNREDUCED_GRAD, "spmdsim")
    assert ours.returncode >= 0, f"killed by signal {-ours.returncode}: {ours.stderr[-3000:]}"
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert _lines(ours.stdout) == _lines(_run(UNREDUCED_GRAD, "jax").stdout)
