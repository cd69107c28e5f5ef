"""float32 ``rsqrt`` as this machine's XLA:CPU computes it (issue 38): spmdsim measures XLA's result once per
process over one period of the CPU's estimate table (every float32 in [1, 4)), and scales it to every other
positive normal float32. Checked against XLA on the machine running the test, and against the table recorded on
an AMD Zen 4 (``../shared/data/xla-cpu/``) loaded as that CPU's profile."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax import lax

from spmdsim.jax.numerics import _xla_cpu_math, _xla_cpu_probe

pytestmark = pytest.mark.area("lax primitives vs XLA:CPU")

AMD = (pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "xla-cpu"
       / "rsqrt_f32_amd_zen4_jaxlib0.10.2.npz")


def _bits_equal(a, b) -> int:
    """How many elements differ in their bits."""
    return int((np.asarray(a, np.float32).view(np.int32) != np.asarray(b, np.float32).view(np.int32)).sum())


def test_every_float32_in_one_period_and_scaled_binades_equal_xla():
    x = (np.arange(1 << 24, dtype=np.uint32) + np.uint32(127 << 23)).view(np.float32)
    assert _bits_equal(_xla_cpu_math.rsqrt(x), jax.jit(lax.rsqrt)(x)) == 0
    rng = np.random.default_rng(0)
    wide = (10.0 ** rng.uniform(-37.9, 38.5, 1 << 18)).astype(np.float32)
    special = np.array([0.0, -0.0, 1e-40, -1e-40, np.inf, -np.inf, -1.0, np.nan, 1.0, 4.0, 2.0 ** -126,
                        np.finfo(np.float32).max], np.float32)
    for values in (wide, special):
        assert _bits_equal(_xla_cpu_math.rsqrt(values), jax.jit(lax.rsqrt)(values)) == 0


@pytest.mark.skipif(not AMD.exists(), reason="needs ../shared/data/xla-cpu/ beside the repository")
def test_the_amd_zen4_profile_reproduces_its_recorded_table_in_every_binade():
    """In a fresh interpreter with the AMD table as the CPU's profile: each of the 2**24 recorded results, also
    scaled by 4**k (k from -31 to 31: rsqrt(4**k x) = rsqrt(x) / 2**k)."""
    code = f"""
import numpy as np
from spmdsim.jax.numerics import _xla_cpu_math
d = np.load({str(AMD)!r})["ulp_vs_correct"].astype(np.int32)
x = (np.arange(1 << 24, dtype=np.uint32) + np.uint32(127 << 23)).view(np.float32)
expected = ((1 / np.sqrt(x.astype(np.float64))).astype(np.float32).view(np.int32) + d).view(np.float32)
bad = int((_xla_cpu_math.rsqrt(x).view(np.int32) != expected.view(np.int32)).sum())
for k in range(-31, 32, 5):
    scaled = (x * np.float32(4.0) ** k).astype(np.float32)
    bad += int((_xla_cpu_math.rsqrt(scaled).view(np.int32) != (expected / np.float32(2.0) ** k).view(np.int32)).sum())
print(bad, np.unique(d, return_counts=True)[1].tolist())
"""
    env = dict(os.environ, **{_xla_cpu_probe.RSQRT_TABLE_ENV: str(AMD)})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "0"
    assert "367" in out.stdout and "2452883" in out.stdout  # the README's counts of that table
