"""spmdsim.testing out of the box: the helpers give real jax the CPU devices jax.pmap needs, or say exactly
what to set. Each runs in a fresh interpreter (jax's device count is fixed once its backend starts); this file
never imports jax."""
import os
import subprocess
import sys

import pytest

from terminal import ROOT, jax_installed

pytestmark = pytest.mark.skipif(not jax_installed(), reason="needs jax")

USER_TESTS = '''import jax
import numpy as np
from spmdsim.testing import assert_pmap_matches_jax


def step(params, batch):
    return jax.lax.pmean(batch @ params["w"], "batch")


def test_with_the_function():
    out = assert_pmap_matches_jax(lambda x: jax.lax.psum(x, "i"), np.arange(4.0, dtype=np.float32), axis_name="i")
    assert out.tolist() == [6.0] * 4 and jax.device_count() >= 4


def test_with_the_fixture(pmap_matches_jax):
    params = {"w": np.ones((3, 2), np.float32)}
    pmap_matches_jax(step, params, np.ones((8, 5, 3), np.float32), axis_name="batch", in_axes=(None, 0))
'''


def run(args, tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


def docs_test_file() -> str:
    """The docs' example of a user's test file (docs/compare_and_conformance.md: the python block that starts
    with its file name)."""
    with open(os.path.join(ROOT, "docs", "compare_and_conformance.md")) as f:
        page = f.read()
    start = page.index("```python\n# test_train_step.py") + len("```python\n")
    return page[start:page.index("```", start)]


def test_a_users_test_files_pass_with_jax_left_at_its_defaults(tmp_path):
    (tmp_path / "test_mine.py").write_text(USER_TESTS)
    (tmp_path / "test_train_step.py").write_text(docs_test_file())
    proc = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mine.py", "test_train_step.py"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout


TOO_FEW = ("import jax, numpy as np\njax.numpy.zeros(1)  # the backend starts with 1 CPU device\n{patch}"
           "from spmdsim.testing import TooFewJaxDevices, assert_pmap_matches_jax\n"
           "assert issubclass(TooFewJaxDevices, RuntimeError)\n"
           "assert_pmap_matches_jax(lambda x: jax.lax.psum(x, 'i'), np.arange(4.0), axis_name='i')")


def test_too_late_to_add_devices_says_what_to_set_and_where(tmp_path):
    proc = run(["-c", TOO_FEW.format(patch="")], tmp_path)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("spmdsim.testing.TooFewJaxDevices: assert_pmap_matches_jax: jax.pmap needs 4 devices, "
                           "but jax has 1 (cpu)")
    assert 'jax.config.update("jax_num_cpu_devices", 8)` right after `import jax` at the top of your ' \
           'conftest.py' in last
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=8" in last


def test_on_an_accelerator_the_message_says_its_count_is_the_hardwares(tmp_path):
    """One GPU (jax's default backend, patched: no GPU here): no CPU setting gives it four; the message says
    where four are."""
    proc = run(["-c", TOO_FEW.format(patch="jax.default_backend = lambda: 'gpu'\n")], tmp_path)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("spmdsim.testing.TooFewJaxDevices: assert_pmap_matches_jax: jax.pmap needs 4 devices, "
                           "but jax has 1 (gpu), and an accelerator's device count is the hardware's.")
    assert "on a machine with 4 gpu devices, or on CPU devices: set JAX_PLATFORMS=cpu" in last
    assert "jax_num_cpu_devices" not in last


def test_a_mismatch_against_a_gpu_says_what_xla_gpu_computes_otherwise(tmp_path):
    """Values that differ where jax.pmap ran on a GPU (the backend's name patched; the comparison made to fail):
    the Mismatch adds that spmdsim computes XLA:CPU's arithmetic and what to do about TF32."""
    code = ("import jax, numpy as np\nimport spmdsim.testing as t\n"
            "def differ(*a, **k):\n    raise t.Mismatch('values differ at index (0,)')\n"
            "t.assert_trees_match = differ\njax.default_backend = lambda: 'gpu'\n"
            "t.assert_pmap_matches_jax(lambda x: x * 2, np.arange(1.0), axis_name='i')")
    proc = run(["-c", code], tmp_path)
    assert proc.returncode == 1
    tail = proc.stderr.strip().splitlines()[-2:]
    assert tail[0] == "spmdsim.testing.Mismatch: values differ at index (0,)"
    assert "jax.pmap ran on gpu: spmdsim computes XLA:CPU's arithmetic" in tail[1]
    assert "jax.default_matmul_precision('highest')" in tail[1]
