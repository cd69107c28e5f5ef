"""Tracebacks show only the user's frames (issue 29, point 12): a program's error raised on a device, run with
python and under `spmdsim run`, has no frame of spmdsim's files above the program's message."""
import re

import pytest

from terminal import jax_installed, spmdsim_command

NUMPY_PROGRAM = """import numpy as np, spmdsim

def f(x):
    return x @ np.ones(3)

print(spmdsim.pmap(f)(np.ones((2, 2))))
"""

JAX_PROGRAMS = {"pmap": """import jax, jax.numpy as jnp

def f(x):
    return jnp.dot(x, jnp.ones(3))

print(jax.pmap(f)(jnp.ones((2, 2))))
""", "shard_map": """import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

def f(x):
    return jnp.dot(x, jnp.ones(3))

mesh = jax.make_mesh((2,), ("i",))
x = jax.device_put(jnp.ones(4), NamedSharding(mesh, P("i")))
print(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x))
"""}


def _frames(stderr: str) -> list[str]:
    return re.findall(r'^  File "([^"]+)", line \d+, in (\S+)$', stderr, re.M)


def test_a_device_error_in_a_numpy_program_shows_only_the_programs_frames(tmp_path):
    import subprocess
    import sys

    from terminal import ROOT

    (tmp_path / "prog.py").write_text(NUMPY_PROGRAM)
    proc = subprocess.run([sys.executable, "prog.py"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={"PYTHONPATH": ROOT, "SPMDSIM_NUM_DEVICES": "2", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1, proc.stderr
    assert _frames(proc.stderr) == [(str(tmp_path / "prog.py"), "<module>"), (str(tmp_path / "prog.py"), "f")], \
        proc.stderr
    assert "ValueError: matmul" in proc.stderr and "spmdsim: raised on device 0." in proc.stderr


@pytest.mark.skipif(not jax_installed(), reason="needs jax")
@pytest.mark.parametrize("api", sorted(JAX_PROGRAMS))
def test_a_jax_programs_error_under_spmdsim_run_shows_no_spmdsim_frame(tmp_path, api):
    (tmp_path / "jprog.py").write_text(JAX_PROGRAMS[api])
    proc = spmdsim_command("run", "--devices", "2", "jprog.py", cwd=tmp_path, env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 1, proc.stderr
    files = [file for file, _ in _frames(proc.stderr)]
    assert files[:2] == [str(tmp_path / "jprog.py")] * 2, proc.stderr
    assert not [f for f in files if "/spmdsim/" in f], proc.stderr   # JAX's own frames of jnp.dot may follow
    assert "TypeError: dot_general requires contracting dimensions" in proc.stderr
