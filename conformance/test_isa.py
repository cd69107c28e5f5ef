"""XLA:CPU's numerics on the ISA it compiles for (issue 26): spmdsim's model of it, and the differential tests
under every ISA cap this machine supports.

- :func:`spmdsim.jax._xla_cpu_isa.model` from CPU flags, ``--xla_cpu_max_isa`` and ``SPMDSIM_XLA_CPU_ISA``;
- each ISA-dependent behaviour against XLA:CPU here (float64 -> float16, float16 multiply-adds in the gamma
  sampler, float32 fused multiply-adds), and the model's other side computed by NumPy reasoning;
- ``conformance/test_lax_ops.py`` and the bit-exactness tests in subprocesses under each lower cap (the native
  run is the suite's own), so that CI checks every ISA level the machine can reproduce.
"""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from spmdsim.jax import _xla_cpu_isa as isa
from spmdsim.jax import _xla_cpu_math

pytestmark = pytest.mark.area("lax primitives vs XLA:CPU")

SAPPHIRE = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512_fp16", "avx512_bf16", "amx_bf16"}
SKYLAKE_X = {"avx", "avx2", "fma", "f16c", "avx512f"}
HERE = isa.current()
CPU = isa._cpu_flags() or set()


@pytest.mark.parametrize("flags, cap, fma, fp16", [
    (SAPPHIRE, None, True, True), (SAPPHIRE, "AMX", True, True), (SAPPHIRE, "AVX512", True, True),
    (SAPPHIRE, "avx2", True, False), (SAPPHIRE, "AVX", False, False), (SAPPHIRE, "SSE4_2", False, False),
    (SKYLAKE_X, None, True, False), ({"avx", "f16c"}, None, False, False), ({"avx"}, "AMX_FP16", False, False),
])
def test_model_of_a_cpu_under_a_cap(flags, cap, fma, fp16):
    m = isa.model(flags, cap)
    assert (m.fma, m.fp16) == (fma, fp16)
    assert m.avx512 == ("avx512f" in flags and (cap is None or cap.upper() not in ("SSE4_2", "AVX", "AVX2")))
    assert (cap.upper() in m.source) if cap else m.source == "this CPU"


@pytest.mark.parametrize("pinned, fma, avx512, fp16", [
    ("avx2", True, False, False), ("AVX512", True, True, False), ("avx512_fp16", True, True, True),
    ("AMX", True, True, True), ("AVX", False, False, False)])
def test_pinned_model_ignores_the_cpu(pinned, fma, avx512, fp16):
    m = isa.model(SAPPHIRE if not fp16 else {"avx"}, "AVX", pinned=pinned)
    assert (m.fma, m.avx512, m.fp16) == (fma, avx512, fp16) and "SPMDSIM_XLA_CPU_ISA" in m.source


def test_unknown_levels_are_refused_with_the_levels_named():
    with pytest.raises(ValueError, match="AVX512_FP16"):
        isa.model(SAPPHIRE, pinned="avx1024")
    with pytest.raises(ValueError, match="SSE4_2, AVX, AVX2"):
        isa.model(SAPPHIRE, "AVX3")


def test_the_last_max_isa_flag_counts():
    assert isa._max_isa("--xla_cpu_max_isa=AVX512 --foo=1 --xla_cpu_max_isa=AVX2") == "AVX2"
    assert isa._max_isa("--xla_force_host_platform_device_count=8") is None


def _f16_bits(x):
    return np.asarray(x).view(np.uint16)


def test_float64_to_float16_as_xla_cpu_here():
    """``1 + 2**-11 + 2**-40``: rounded once it is 0x3C01; through float32 (rounded to 1 + 2**-11, a tie) it is
    0x3C00. XLA:CPU gives the one that its ISA gives, and so does spmdsim."""
    import spmdsim.jax as sjax

    x = np.array([1.0 + 2**-11 + 2**-40, -(1.0 + 2**-11 + 2**-40), 65519.99, 2.0**-25 * 1.5])
    once, twice = x.astype(np.float16), x.astype(np.float32).astype(np.float16)
    assert _f16_bits(once)[0] == 0x3C01 and _f16_bits(twice)[0] == 0x3C00
    with jax.enable_x64(True):
        f = lambda v: v.astype(jax.numpy.float16)  # noqa: E731
        xla = np.asarray(jax.jit(f)(x))
        closed = jax.make_jaxpr(f)(x)
        ours = np.asarray(sjax.eval_jaxpr(closed.jaxpr, closed.consts, x)[0])
    assert _f16_bits(xla).tolist() == _f16_bits(once if HERE.fp16 else twice).tolist()
    assert _f16_bits(ours).tolist() == _f16_bits(xla).tolist()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_multiply_add_rounds_as_xla_cpu_here(dtype):
    """A multiply feeding an add inside one XLA program: XLA:CPU fuses it where the ISA has the instruction
    (float32: FMA; float16: AVX512-FP16); :func:`multiply_add` follows the model, and both sides of the model
    are what NumPy reasoning gives (the fused form rounded once from the exact value, the other the product
    rounded first)."""
    rng = np.random.default_rng(26)
    a, b, c = (rng.standard_normal((3, 20000)) * 3).astype(dtype)
    exact = a.astype(np.float64) * b + c  # exact for float16 operands; float32's product is exact here too
    fused = exact.astype(dtype)
    separate = (a * b).astype(dtype) + c
    assert (fused != separate).any()
    ours = _xla_cpu_math.multiply_add(a, b, c, dtype)
    fused_here = HERE.fp16 if dtype == np.float16 else HERE.fma
    assert np.array_equal(ours, fused if fused_here else separate)
    xla = np.asarray(jax.jit(lambda a, b, c: a * b + c)(a, b, c))
    assert np.array_equal(xla, fused if fused_here else separate)


def test_bfloat16_multiply_add_is_never_fused():
    import ml_dtypes
    rng = np.random.default_rng(27)
    a, b, c = (rng.standard_normal((3, 20000)) * 3).astype(ml_dtypes.bfloat16)
    separate = (a * b).astype(ml_dtypes.bfloat16) + c
    assert np.array_equal(_xla_cpu_math.multiply_add(a, b, c, a.dtype), separate)
    assert np.array_equal(np.asarray(jax.jit(lambda a, b, c: a * b + c)(a, b, c)), separate)


def _caps_below_native() -> list[str]:
    """The ISA caps below this CPU's own that XLA:CPU can run here: AVX2 on a CPU with AVX2 and FMA, AVX512 on
    one with AVX-512 (and AVX, a CPU without FMA, where the CPU has AVX)."""
    caps = []
    if "avx" in CPU:
        caps.append("AVX")
    if {"avx2", "fma"} <= CPU:
        caps.append("AVX2")
    if "avx512f" in CPU and CPU & {"avx512_vnni", "avx512_bf16", "amx_bf16", "avx512_fp16"}:
        caps.append("AVX512")
    return caps


@pytest.mark.skipif("--xla_cpu_max_isa" in os.environ.get("XLA_FLAGS", "") or
                    bool(os.environ.get("SPMDSIM_XLA_CPU_ISA")), reason="already running under a cap or a pin")
@pytest.mark.parametrize("cap", _caps_below_native() or [pytest.param("AVX2", marks=pytest.mark.skip(
    reason="this CPU has no ISA below its own that XLA:CPU runs"))])
def test_lax_ops_and_bit_exactness_under_an_isa_cap(cap):
    """The table-driven differential test and the bit-exactness tests pass under ``--xla_cpu_max_isa=cap``,
    with XLA:CPU and spmdsim's model both capped (they read the same XLA_FLAGS)."""
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_max_isa={cap}".strip())
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "conformance/test_lax_ops.py", "conformance/test_isa.py",
         "conformance/test_examples_and_bits.py::test_float32_psum_is_bit_exact_with_xla_cpu",
         "conformance/test_examples_and_bits.py::test_bf16_training_steps_collectives_equal_xla_cpus_bit_for_bit"],
        cwd=root, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, f"under --xla_cpu_max_isa={cap}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
