"""Inside a notebook (an IPython shell), stops and error tables name the cell as IPython's tracebacks do
(``In [2], line 5``), not the kernel's temporary file (issue 29, point 14)."""
import subprocess
import sys

import pytest

from terminal import ROOT

pytest.importorskip("IPython")

SHELL = r'''
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_cell(store_history=True, raw_cell="import numpy as np, spmdsim\nfrom spmdsim import lax")
shell.run_cell(store_history=True, raw_cell="""def f(x):
    if lax.axis_index('i') != 1:
        return lax.psum(x, 'i')
    return x""")
shell.run_cell(store_history=True, raw_cell="""try:
    spmdsim.pmap(f, 'i')(np.arange(3.0))
except spmdsim.CollectiveDeadlockError as e:
    print('ERROR', e)""")
shell.run_cell(store_history=True, raw_cell="""def g(x):
    return lax.psum(x * 2, 'i')""")
shell.run_cell(store_history=True, raw_cell="""s = spmdsim.debug.step(spmdsim.pmap(g, 'i'), np.arange(3.0))
print('STOP', s.stop)
s.finish()""")
'''


def test_stops_and_error_tables_name_the_notebook_cell():
    proc = subprocess.run([sys.executable, "-c", SHELL], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin", "SPMDSIM_NUM_DEVICES": "8"})
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    error = out.split("ERROR ", 1)[1].split("STOP", 1)[0]
    assert "device 0 [i=0]  waiting   psum(float64[])  'i'   0     In [2], line 3" in error, error
    assert "ipython-input" not in out and ".py:" not in out
    assert "----  " + "-" * len("In [2], line 3") + "\n" in error    # the column as wide as the cell's name
    assert "STOP stop 0: psum(float64[], axis_name='i') (step 0) at In [4], line 2\n" in out, out
