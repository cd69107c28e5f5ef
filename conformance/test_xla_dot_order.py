"""float32 dot_general in XLA:CPU's own order of additions (``spmdsim.jax.numerics._xla_cpu_dot``), bit for bit.

Live: against ``jax.jit`` on the machine running the test, over shapes whose order spmdsim models (small products
by default, large ``k`` and the rest under ``SPMDSIM_EXACT=1``); skipped where the CPU's model was not measured
(the order depends on the CPU model: YNNPACK's kernel choice and blocking), and on Zen 3 for the shapes its
model leaves to BLAS. Recorded: the AMD Zen 4 file's dot
cases, with ``SPMDSIM_XLA_CPU_MODEL=amd-zen4``, in a subprocess (the model is read once per process).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from spmdsim.jax.evaluation._interpreter import eval_jaxpr  # noqa: E402
from spmdsim.jax.numerics import _xla_cpu_dot, _xla_cpu_isa  # noqa: E402

DATA = Path(__file__).parents[2] / "shared/data/xla-cpu"
AMD_FILE = DATA / "cases_amd_zen4_jaxlib0.10.2.npz"

# (batch, M, K, N): small (the default order), large k (chunks), batched
SHAPES = [((), 16, 5, 4), ((), 8, 16, 4), ((), 16, 40, 16), ((), 4, 300, 8), ((), 64, 64, 64),
          ((), 32, 256, 128), ((8,), 32, 64, 16), ((3,), 8, 7, 2), ((), 16, 3, 64),
          # vector times matrix (M = 1): one chain over k
          ((), 1, 64, 16), ((4,), 1, 300, 10), ((), 1, 5, 3), ((), 1, 100, 50)]
LARGE = [((), 16, 784, 1024), ((), 16, 1024, 64), ((), 8, 1200, 1024), ((), 1, 784, 256), ((), 1, 2048, 64)]


def _measured() -> bool:
    return _xla_cpu_isa.ynnpack_orders() and not os.environ.get("SPMDSIM_XLA_CPU_MODEL") and \
        not os.environ.get("XLA_FLAGS")


def _operands(batch, m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((*batch, m, k)).astype(np.float32),
            rng.standard_normal((*batch, k, n)).astype(np.float32))


def _spmdsim(fun, *args):
    closed = jax.make_jaxpr(fun)(*args)
    return np.asarray(eval_jaxpr(closed.jaxpr, closed.consts, *args)[0])


def _check(batch, m, k, n):
    a, b = _operands(batch, m, k, n)
    fun = (lambda x, y: x @ y) if not batch else (lambda x, y: jnp.einsum("bij,bjk->bik", x, y))
    expected = np.asarray(jax.jit(fun)(a, b))
    if _xla_cpu_dot.plan(m, n, k) is None:
        assert _xla_cpu_isa.cpu_model() != "amd-zen4", (m, n, k)  # every shape here is measured on Zen 4
        pytest.skip(f"the order of {m}x{k} @ {k}x{n} is not modelled on {_xla_cpu_isa.cpu_model()}")
    np.testing.assert_array_equal(_spmdsim(fun, a, b).view(np.int32), expected.view(np.int32))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_live_default(shape):
    if not _measured():
        pytest.skip(f"XLA:CPU's dot order is measured on AMD Zen 4 and Zen 3 with jaxlib 0.10.2 only (this CPU model: "
                    f"{_xla_cpu_isa.cpu_model()}, jax {jax.__version__})")
    batch, m, k, n = shape
    p = _xla_cpu_dot.plan(m, n, k)
    if p is not None and not _xla_cpu_dot.exact_by_default(m, n, k, p) and not _xla_cpu_isa.exact():
        pytest.skip("a large product or long chains: the exact order only under SPMDSIM_EXACT=1 (see test_live_exact)")
    _check(batch, m, k, n)


@pytest.mark.parametrize("shape", SHAPES + LARGE, ids=str)
def test_live_exact(shape, monkeypatch):
    if not _measured():
        pytest.skip(f"XLA:CPU's dot order is measured on AMD Zen 4 and Zen 3 with jaxlib 0.10.2 only (this CPU model: "
                    f"{_xla_cpu_isa.cpu_model()}, jax {jax.__version__})")
    monkeypatch.setenv("SPMDSIM_EXACT", "1")
    _xla_cpu_isa.exact.cache_clear()
    try:
        _check(*((shape[0],) + shape[1:]))
    finally:
        monkeypatch.delenv("SPMDSIM_EXACT")
        _xla_cpu_isa.exact.cache_clear()


def test_vectorized_matches_per_device():
    """A device axis in front (the vectorized executor) gives each device's bits."""
    a, b = _operands((3,), 16, 5, 4, seed=1)
    whole = _xla_cpu_dot.ynn_matmul(a, b, _xla_cpu_dot.Plan(4, None))
    for d in range(3):
        np.testing.assert_array_equal(whole[d], _xla_cpu_dot.ynn_matmul(a[d], b[d], _xla_cpu_dot.Plan(4, None)))


_AMD_SCRIPT = r"""
import importlib.util, sys, numpy as np, jax
spec = importlib.util.spec_from_file_location("rec", sys.argv[1] + "/record_xla_cpu.py")
rec = importlib.util.module_from_spec(spec); spec.loader.exec_module(rec)
from spmdsim.jax.evaluation._interpreter import eval_jaxpr
d = np.load(sys.argv[1] + "/cases_amd_zen4_jaxlib0.10.2.npz")
bad = []
for name in sys.argv[2:]:
    fun = rec.CASES[name][0]
    ins = [d[f"{name}/in{i}"] for i in range(10) if f"{name}/in{i}" in d]
    cj = jax.make_jaxpr(fun)(*ins)
    got = np.asarray(eval_jaxpr(cj.jaxpr, cj.consts, *ins)[0])
    if not np.array_equal(got.view(np.int32), d[f"{name}/out0"].view(np.int32)):
        bad.append(name)
print("BAD", bad)
sys.exit(1 if bad else 0)
"""

AMD_DOT_CASES = ["dot_16x5_5x4", "dot_bias_16x5_5x4", "dot_64x64_64x64", "dot_128x256_256x64",
                 "batched_dot_8x32x64_8x64x16", "dot_16x784_784x1024"]
AMD_SMALL_CASES = ["dot_16x5_5x4", "dot_bias_16x5_5x4", "batched_dot_8x32x64_8x64x16"]


@pytest.mark.skipif(not AMD_FILE.exists(), reason=f"{AMD_FILE} is absent")
@pytest.mark.skipif(_xla_cpu_isa.jaxlib_minor() != (0, 10), reason="the file and the order are jaxlib 0.10's")
@pytest.mark.parametrize("exact", [False, True], ids=["default", "exact"])
def test_amd_zen4_recorded(exact):
    """The AMD Zen 4 file's dot cases under SPMDSIM_XLA_CPU_MODEL=amd-zen4 (any x86 CPU with FMA): the small
    ones in the default mode, all of them with SPMDSIM_EXACT=1."""
    cases = AMD_DOT_CASES if exact else AMD_SMALL_CASES
    env = dict(os.environ, SPMDSIM_XLA_CPU_MODEL="amd-zen4", SPMDSIM_EXACT="1" if exact else "0")
    env.pop("SPMDSIM_XLA_CPU_ISA", None)
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", _AMD_SCRIPT, str(DATA), *cases], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
