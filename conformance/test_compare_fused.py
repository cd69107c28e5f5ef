"""``spmdsim compare`` sees XLA's fusions (issue 38.5): when a map's outputs differ end to end from XLA:CPU's and
no single equation does, the shortest run of consecutive equations that XLA, compiling it as one program on
spmdsim's operands, computes differently is reported like an equation (its lines, devices, ulps), marked
``fused``; and the exit status is 1 whenever anything differs beyond the tolerance, end to end included.

The planted cases: spmdsim's multiply-add contraction switched off (``SPMDSIM_XLA_CPU_ISA=AVX``, a CPU without
FMA, while XLA:CPU here has it; or the model's fused dtypes emptied in-process), so that ``a * b + c`` is computed
as a product rounded, then a sum, where XLA fuses it. Real XLA:CPU is the other side."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from spmdsim.jax.evaluation import _contraction

from spmdsim.jax.numerics import _xla_cpu_isa
from spmdsim.jax.tools._compare_report import distance
from spmdsim.testing import compare

pytestmark = [pytest.mark.area("compare"),
              pytest.mark.skipif(not _xla_cpu_isa.current().fma, reason="XLA:CPU fuses nothing without FMA")]

PROGRAM = '''import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
rng = np.random.default_rng(38)
a, b, c = (rng.standard_normal((8, 4096)) for _ in range(3))


def step(a, b, c):
    return a * b + c  # line 10


print(np.asarray(jax.pmap(step)(a, b, c)).sum())
'''


def _run(tmp_path, env_extra: dict):
    script = tmp_path / "fma_prog.py"
    script.write_text(PROGRAM)
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("SPMDSIM_XLA_CPU_ISA",)}
    env.update(env_extra)
    done = subprocess.run([sys.executable, "-m", "spmdsim", "compare", "--json", str(report), str(script)],
                          env=env, capture_output=True, text=True, timeout=300)
    return done, json.loads(report.read_text()) if report.exists() else None


def test_compare_names_the_fused_multiply_add_and_exits_1(tmp_path):
    done, report = _run(tmp_path, {"SPMDSIM_XLA_CPU_ISA": "AVX", "COLUMNS": "250"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fused: mul, add" in done.stdout and "fma_prog.py:10" in done.stdout
    (entry,) = report["differences"]
    assert entry["primitive"] == "fused: mul, add" and entry["site"].startswith(str(tmp_path / "fma_prog.py") + ":10")
    assert entry["devices"] == [f"device {d}" for d in range(8)]
    assert entry["ulps"] >= 1 and entry["elements"] > 5000  # about one element in four: 7,600 of 32,768
    (drift,) = report["drift"]
    assert drift["ulps"] == entry["ulps"]  # the run accounts for the whole end-to-end difference


def test_compare_of_the_same_program_with_the_contraction_modelled_finds_nothing(tmp_path):
    done, report = _run(tmp_path, {})
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["differences"] == [] and report["drift"][0]["ulps"] == 0


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_run_found_in_process(monkeypatch, executor, dtype):
    """The model's contraction emptied in-process: float32 and float64 ``x * w + b`` inside a jitted helper
    (inlined, as XLA inlines it), after a maximum that agrees on its own."""
    monkeypatch.setattr(_contraction, "_fused_dtypes", lambda: ())
    jax.config.update("jax_enable_x64", True)
    try:
        rng = np.random.default_rng(385)
        x, w, b = (rng.standard_normal((8, 2048)).astype(dtype) for _ in range(3))
        helper = jax.jit(lambda x, w, b: x * w + b)  # <- helper

        def body(x, w, b):
            return helper(jax.numpy.maximum(x, -0.5), w, b)

        report = compare(body, x, w, b, axis_name="i", executor=executor)
    finally:
        jax.config.update("jax_enable_x64", False)
    assert report
    (entry,) = report.differences
    assert entry.primitive == "fused: mul, add"
    assert "test_compare_fused.py" in entry.site and "helper" not in entry.primitive
    with open(__file__) as f:
        line = next(k for k, text in enumerate(f, 1) if text.rstrip().endswith("# <- helper"))
    assert f"test_compare_fused.py:{line}" in entry.site
    assert len(entry.devices) == 8 and entry.ulps >= 1 and entry.occurrences == 8
    assert report.drift[0].ulps == entry.ulps


def test_exit_status_counts_an_end_to_end_difference():
    """``bool(report)`` (the command's exit status 1) holds for a drift beyond the tolerance alone."""
    from spmdsim.jax.tools._compare_report import Drift, Report
    report = Report("xla", 0, None)
    report.drift.append(Drift(0, "pmap", 0, (4,), "float64", 3.0, 1e-16, beyond=True))
    assert report and not Report("xla", 0, None)


def test_float64_distances_are_counted_in_integers():
    """One ulp between float64 values above 2**-970 (positions beyond 2**53) is one, not zero."""
    x = np.array([1.0, 1e300, -1.0, 0.0, 5e-324])
    y = np.nextafter(x, np.inf)
    ulps, _ = distance(x, y)
    assert ulps.tolist() == [1.0] * 5
    assert distance(np.array([-5e-324]), np.array([5e-324]))[0].tolist() == [2.0]
