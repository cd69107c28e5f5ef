"""float32 dot_general in XLA:CPU's order on AMD Zen 3 (``_xla_cpu_dot._plan_amd_zen3``), on any x86 CPU with FMA.

``conformance/data/dots_amd_zen3_jaxlib0.10.2.npz`` holds what ``jax.jit`` (jaxlib 0.10.2) returned on an AMD EPYC
Zen 3 (family 25 model 1: AVX2 and FMA3, no AVX-512) for the products below, their operands drawn from
``operands`` (seeded); recorded by running this module's ``record()`` there. Here spmdsim computes them under
``SPMDSIM_XLA_CPU_MODEL=amd-zen3`` and must give the same bits (live checks on a Zen 3 are in
``test_xla_dot_order.py``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from spmdsim.jax.evaluation._interpreter import eval_jaxpr  # noqa: E402
from spmdsim.jax.numerics import _xla_cpu_dot, _xla_cpu_isa  # noqa: E402

DATA = Path(__file__).parent / "data" / "dots_amd_zen3_jaxlib0.10.2.npz"

# name: (batch, M, K, N): each in both modes where its chains are short enough for the default
CASES = {"8x16_16x4": ((), 8, 16, 4), "16x40_40x16": ((), 16, 40, 16), "5x50_50x20": ((), 5, 50, 20),
         "batched_8x32x64_8x64x16": ((8,), 32, 64, 16), "1x300_300x10": ((), 1, 300, 10),
         "24x12_12x100": ((), 24, 12, 100), "16x1024_1024x64": ((), 16, 1024, 64),
         # tasks of columns, each with its k chunks (_split_n, _l2_chunk), and B packed from 61 rows
         "2x512_512x256": ((), 2, 512, 256), "33x300_300x256": ((), 33, 300, 256),
         "40x784_784x128": ((), 40, 784, 128), "3x2048_2048x1000": ((), 3, 2048, 1000),
         "17x300_300x112": ((), 17, 300, 112), "16x784_784x1024": ((), 16, 784, 1024),
         "100x300_300x32": ((), 100, 300, 32), "64x2048_2048x64": ((), 64, 2048, 64)}


def operands(batch, m, k, n):
    rng = np.random.default_rng(m * 1_000_003 + k * 1009 + n)
    return (rng.standard_normal((*batch, m, k)).astype(np.float32),
            rng.standard_normal((*batch, k, n)).astype(np.float32))


def _fun(batch):
    return (lambda x, y: x @ y) if not batch else (lambda x, y: jnp.einsum("bij,bjk->bik", x, y))


def record() -> None:
    """Run on a Zen 3 with jaxlib 0.10.2: writes DATA."""
    np.savez_compressed(DATA, **{name: np.asarray(jax.jit(_fun(shape[0]))(*operands(*shape)))
                                 for name, shape in CASES.items()})


@pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} is absent")
@pytest.mark.skipif(_xla_cpu_isa.jaxlib_minor() != (0, 10), reason="the order is jaxlib 0.10's")
@pytest.mark.parametrize("exact", [False, True], ids=["default", "exact"])
@pytest.mark.parametrize("name", list(CASES))
def test_zen3_recorded(name, exact, monkeypatch):
    monkeypatch.setenv("SPMDSIM_XLA_CPU_MODEL", "amd-zen3")
    monkeypatch.setenv("SPMDSIM_EXACT", "1" if exact else "0")
    monkeypatch.delenv("SPMDSIM_XLA_CPU_ISA", raising=False)
    _xla_cpu_isa.exact.cache_clear()
    _xla_cpu_isa.cpu_model.cache_clear()  # read once per process: this machine's model may be cached already
    try:
        if not _xla_cpu_isa.current().fma:
            pytest.skip("the model chains fused multiply-adds: XLA:CPU's order on a CPU with FMA")
        batch, m, k, n = CASES[name]
        plan = _xla_cpu_dot.plan(m, n, k)
        assert plan is not None, f"{name}: modelled on Zen 3"
        if not exact and not _xla_cpu_dot.exact_by_default(m, n, k, plan):
            pytest.skip("long chains or a large product: XLA's order only under SPMDSIM_EXACT=1")
        a, b = operands(batch, m, k, n)
        closed = jax.make_jaxpr(_fun(batch))(a, b)
        got = np.asarray(eval_jaxpr(closed.jaxpr, closed.consts, a, b)[0])
        np.testing.assert_array_equal(got.view(np.int32), np.load(DATA)[name].view(np.int32))
    finally:
        monkeypatch.undo()
        _xla_cpu_isa.exact.cache_clear()
        _xla_cpu_isa.cpu_model.cache_clear()
