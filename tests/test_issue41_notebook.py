"""Issue 41, part 2: inside a notebook (an IPython shell), a device's state line and the JAX front end's source
sites name the cell as IPython's tracebacks do (``In [3], line 2``), not the kernel's temporary file."""
import subprocess
import sys

import pytest

from terminal import ROOT

pytest.importorskip("IPython")

SHELL = r'''
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_cell(store_history=True, raw_cell="import numpy as np, spmdsim\nfrom spmdsim import lax")
shell.run_cell(store_history=True, raw_cell="""def check(x):
    local = x * 2
    if lax.axis_index('i') == 3:
        local = lax.psum(local, 'i')
    return local""")
shell.run_cell(store_history=True, raw_cell="""s = spmdsim.debug.step(spmdsim.pmap(check, 'i'), np.arange(4.0))
for line in s.stop.state:
    print('STATE', line)""")
'''

JAX_SHELL = r'''
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_cell(store_history=True, raw_cell="import jax, jax.numpy as jnp\nfrom spmdsim.jax.evaluation._interpreter import site_of")
shell.run_cell(store_history=True, raw_cell="""def loss_fn(x):
    return jnp.sin(x) * 2""")
shell.run_cell(store_history=True, raw_cell="""print('SITE', site_of(jax.make_jaxpr(loss_fn)(1.0).jaxpr.eqns[0]))""")
'''


def _run(program: str) -> str:
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin", "SPMDSIM_NUM_DEVICES": "8",
                               "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_devices_state_line_names_the_notebook_cell():
    out = _run(SHELL)
    assert "STATE device 3 [i=3]: waiting in psum(float64[], axis_name='i') (step 0) at In [2], line 4" in out, out
    assert "ipython-input" not in out and ".py:" not in out


def test_a_jax_site_names_the_notebook_cell():
    pytest.importorskip("jax")
    out = _run(JAX_SHELL)
    assert "SITE In [2], line 2 (loss_fn)" in out, out
