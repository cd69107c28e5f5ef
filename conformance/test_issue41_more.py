"""Issue 41, part 2 (rough edges), the JAX front end's part (see tests/test_issue41_more.py): each test failed
before its change."""
import json
import os
import pickle
import subprocess
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import spmdsim
import spmdsim.jax as sjax
from spmdsim.errors import MappedSizeError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step(x):
    return jax.lax.psum(x, "i")


def local_sum(x):
    return jax.lax.psum(x, "x")


def test_a_trace_of_a_jax_pmap_and_shard_map_names_the_device_calls_after_the_function(tmp_path):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("x",))
    with spmdsim.set_device_count(4), spmdsim.trace() as tr:
        sjax.pmap(step, "i")(jnp.arange(4.0))
        sjax.pmap(step, "i", executor="vectorized")(jnp.arange(4.0))    # (no device calls to name)
        sjax.pmap(step, "i", executor="reference")(jnp.arange(4.0))
        sjax.shard_map(local_sum, mesh=mesh, in_specs=P("x"), out_specs=P())(jnp.arange(8.0))
    doc = tr.to_perfetto(tmp_path / "t.json")
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "call"]
    assert sorted(set(names)) == ["local_sum", "step"] and len(names) == 12, names


def test_spmdsim_run_traces_a_jax_pmap_under_the_functions_name(tmp_path):
    (tmp_path / "s.py").write_text("import jax, jax.numpy as jnp\n\ndef step(x):\n    return jax.lax.psum(x, 'i')\n\n"
                                   "print(jax.pmap(step, 'i')(jnp.ones(4)))\n")
    proc = subprocess.run([sys.executable, "-m", "spmdsim", "run", "--devices", "4", "--trace", "t.json", "s.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert [e["name"] for e in events if e.get("cat") == "call"] == ["step"] * 4


def first(a, b):
    return a


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_the_jax_front_end_raises_the_public_size_error_with_the_axis_hint(executor):
    from jax._src.sharding import IndivisibleError
    with pytest.raises(MappedSizeError) as info:
        sjax.pmap(first, executor=executor)(np.ones((4, 3)), np.ones((3, 4)))
    e = info.value
    assert isinstance(e, IndivisibleError) and isinstance(e, ValueError)
    assert str(e).endswith("args[1] has size 4 on axis 1: in_axes=(0, 1)?")
    assert "".join(traceback.format_exception_only(e)).startswith("spmdsim.errors.MappedSizeError: pmap got ")
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is type(e) and again.args == e.args
