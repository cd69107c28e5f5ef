"""float32 functions that XLA:CPU computes with its own code, against what it returned on an Intel Xeon.

``conformance/data/elementwise_intel_emerald_rapids_jaxlib0.11.2.npz`` holds six of the cases of
``../shared/data/xla-cpu/record_xla_cpu.py`` (inputs ``NAME/in0``..., ``jax.jit``'s result ``NAME/out0``) as
recorded on 2026-11-30 on an Intel Xeon, family 6 model 207 (Emerald Rapids: AVX-512, AVX512-FP16, AMX), 16
cores, jax/jaxlib 0.11.2, Python 3.12, no XLA_FLAGS. XLA computes these with its own polynomials and rewrites
(``exp``, ``log``, ``tanh``, ``gelu``'s ``erf``, a contracted multiply-add, a division by a broadcast as a
product with the reciprocal), multiply-adds fused as LLVM fuses them: spmdsim computes them the same way on every
CPU with FMA, so on any such CPU with jaxlib 0.11 it must give these bits (docs/jax_programs.md, "XLA:CPU's CPU
model and jaxlib").

Not recorded here, and why: that CPU's float32 ``rsqrt`` estimate is learned on the machine that runs
(``test_rsqrt_learned.py``; there 13% of the float32 in [1, 4) were one ulp from the correctly rounded value,
none two), ``sin``/``cos`` are the C library's, and its products, sums and convolutions keep BLAS's and NumPy's
orders in spmdsim (within 6.5e-7 of the largest value of each of the recorded ones; 1.9e-6 for float32 sums over
two axes).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from spmdsim.jax.evaluation._interpreter import eval_jaxpr  # noqa: E402
from spmdsim.jax.numerics import _xla_cpu_isa  # noqa: E402

pytestmark = pytest.mark.area("lax primitives vs XLA:CPU")

DATA = Path(__file__).parent / "data" / "elementwise_intel_emerald_rapids_jaxlib0.11.2.npz"

# the functions of record_xla_cpu.py's cases of these names
CASES = {"exp_4096": jnp.exp, "log_4096": jnp.log, "tanh_4096": jnp.tanh, "gelu_4096": jax.nn.gelu,
         "fused_mul_add_4096": lambda a, b, c: a * b + c, "div_bcast_16x4_1x4": lambda x, y: x / y}


@pytest.fixture
def unpinned(monkeypatch):
    """This CPU's own ISA (no SPMDSIM_XLA_CPU_ISA), read afresh."""
    monkeypatch.delenv("SPMDSIM_XLA_CPU_ISA", raising=False)
    _xla_cpu_isa.current.cache_clear()
    yield
    _xla_cpu_isa.current.cache_clear()


@pytest.mark.skipif(_xla_cpu_isa.jaxlib_minor() != (0, 11), reason="recorded with jaxlib 0.11.2")
@pytest.mark.parametrize("name", list(CASES))
def test_emerald_rapids_recording(name, unpinned):
    if not _xla_cpu_isa.current().fma:
        pytest.skip("XLA:CPU computes these with fused multiply-adds on a CPU with FMA (and under no cap below AVX2)")
    data = np.load(DATA)
    args = [data[f"{name}/in{i}"] for i in range(3) if f"{name}/in{i}" in data]
    closed = jax.make_jaxpr(CASES[name])(*args)
    (got,) = eval_jaxpr(closed.jaxpr, closed.consts, *args)
    expected = data[f"{name}/out0"]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    differ = np.asarray(got).view(np.uint32) != expected.view(np.uint32)
    assert not differ.any(), f"{name}: {int(differ.sum())} of {differ.size} elements differ from the Intel recording"
