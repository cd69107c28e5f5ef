"""Virtual devices, the environment variable, and the package working without jax."""
import os
import subprocess
import sys

import numpy as np
import pytest

import spmdsim

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, **env}, timeout=120)


def test_devices_api():
    assert spmdsim.device_count() == spmdsim.local_device_count() == 8
    assert [d.id for d in spmdsim.devices()] == list(range(8))
    with spmdsim.set_device_count(3):
        assert spmdsim.device_count() == 3 and len(spmdsim.devices()) == 3
        with pytest.raises(ValueError, match="only 3 virtual devices"):
            spmdsim.pmap(lambda x: x)(np.zeros(4))
    assert spmdsim.device_count() == 8
    spmdsim.set_device_count(16)            # as a plain call the count stays
    assert spmdsim.pmap(lambda x: x)(np.zeros(16)).shape == (16,)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="positive int"):
            spmdsim.set_device_count(bad)


def test_environment_variable():
    out = run_python("import spmdsim; print(spmdsim.device_count())", SPMDSIM_NUM_DEVICES="64")
    assert out.stdout.strip() == "64"
    bad = run_python("import spmdsim", SPMDSIM_NUM_DEVICES="lots")
    assert bad.returncode != 0 and "SPMDSIM_NUM_DEVICES='lots'" in bad.stderr


def test_core_imports_and_runs_without_jax():
    code = ("import sys; sys.modules['jax'] = None\n"
            "import numpy as np, spmdsim\n"
            "print(spmdsim.pmap(lambda v: spmdsim.lax.psum(v, 'i'), 'i')(np.arange(4)).tolist())\n"
            "assert 'jaxlib' not in sys.modules")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[6, 6, 6, 6]"


def test_scipy_is_imported_by_the_first_rule_that_needs_it():
    """SciPy's import is a fifth of spmdsim.jax's (spmdsim.jax.rules._scipy): a program that never reaches a special
    function or LAPACK does not pay it; one that does gets SciPy's values."""
    pytest.importorskip("jax")
    code = ("import sys, numpy as np, spmdsim.jax, jax, jax.numpy as jnp\n"
            "print('scipy' in sys.modules)\n"
            "f = spmdsim.jax.pmap(lambda x: jax.lax.bessel_i1e(x) + jnp.linalg.cholesky(jnp.eye(2) * x)[0, 0])\n"
            "print(f(np.array([1.0, 2.0], np.float32)).tolist(), 'scipy' in sys.modules)\n")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    import scipy.special
    expected = [float(np.float32(scipy.special.i1e(v)) + np.float32(np.sqrt(v))) for v in (1.0, 2.0)]
    lines = out.stdout.splitlines()
    assert lines[0] == "False" and lines[1] == f"{expected} True"


def test_doctests_in_public_docstrings():
    import doctest

    import spmdsim.runtime._devices
    import spmdsim.lax
    for module in (spmdsim.lax, spmdsim.runtime._devices):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0 and result.attempted > 0
