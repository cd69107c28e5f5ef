"""float32 conv_general_dilated in XLA:CPU's own order of additions (``_xla_cpu_dot.ynn_conv``), bit for bit.

Live: against ``jax.jit`` on the machine running the test, over convolutions whose order spmdsim models on its
CPU model (``MEASURED``: strides, padding, window dilation, NCHW and NHWC, batch and feature sizes, and the
convolutions ``jax.grad`` makes); skipped where the CPU's model was not measured (the order is YNNPACK's kernel
choice for this CPU model). Both executors of a mapped convolution give each device's bits. Recorded: the AMD
Zen 4 file's ``conv_nhwc_3x3`` under ``SPMDSIM_XLA_CPU_MODEL=amd-zen4``, in a subprocess; and
``data/convs_amd_zen3_jaxlib0.10.2.npz`` (written by :func:`record_zen3` on a Zen 3) under
``SPMDSIM_XLA_CPU_MODEL=amd-zen3``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
from jax import lax  # noqa: E402

import spmdsim.jax  # noqa: E402
from spmdsim.jax.evaluation._interpreter import eval_jaxpr  # noqa: E402
from spmdsim.jax.numerics import _xla_cpu_dot, _xla_cpu_isa  # noqa: E402

DATA = Path(__file__).parents[2] / "shared/data/xla-cpu"
AMD_FILE = DATA / "cases_amd_zen4_jaxlib0.10.2.npz"

NHWC = ("NHWC", "HWIO", "NHWC")
NCHW = ("NCHW", "OIHW", "NCHW")
# (input shape, kernel shape, strides, padding, window dilation, dimension numbers)
CASES = {
    "case_3x3_c8_o16": ((2, 16, 16, 8), (3, 3, 8, 16), (1, 1), "SAME", (1, 1), NHWC),
    "c1_o8_mnist": ((4, 28, 28, 1), (3, 3, 1, 8), (1, 1), "SAME", (1, 1), NHWC),
    "c3_o16_valid": ((2, 12, 12, 3), (3, 3, 3, 16), (1, 1), "VALID", (1, 1), NHWC),
    "c18_o8_tails": ((1, 8, 8, 18), (3, 3, 18, 8), (1, 1), "SAME", (1, 1), NHWC),
    "c24_o16_tile4": ((2, 8, 8, 24), (3, 3, 24, 16), (1, 1), "SAME", (1, 1), NHWC),
    "c16_o32_tile2": ((1, 8, 8, 16), (3, 3, 16, 32), (1, 1), "SAME", (1, 1), NHWC),
    "c6_o24_tile2": ((1, 8, 8, 6), (3, 3, 6, 24), (1, 1), "SAME", (1, 1), NHWC),
    "c8_o48": ((1, 8, 8, 8), (3, 3, 8, 48), (1, 1), "SAME", (1, 1), NHWC),
    "c32_o64_tile1": ((1, 8, 8, 32), (3, 3, 32, 64), (1, 1), "SAME", (1, 1), NHWC),
    "stride2": ((2, 16, 16, 8), (3, 3, 8, 16), (2, 2), "SAME", (1, 1), NHWC),
    "dilated": ((1, 12, 12, 20), (3, 3, 20, 8), (1, 1), "SAME", (2, 2), NHWC),
    "nchw_5x5": ((2, 8, 12, 12), (16, 8, 5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1), NCHW),
    "asym_pad_1x3": ((2, 9, 11, 12), (1, 3, 12, 4), (1, 2), ((0, 1), (1, 0)), (1, 1), NHWC),
    # Zen 3's kernel of two lanes for the last 1-3 positions (_xla_cpu_dot.conv_lanes): 3 fused, an odd k (27
    # positions, k = 27); 1 unfused (49 positions, k = 45); and 16 features both ways (the input's gradient too)
    "c3_o16_tail3": ((1, 5, 11, 3), (3, 3, 3, 16), (1, 1), "VALID", (1, 1), NHWC),
    "c5_o16_tail1": ((1, 9, 9, 5), (3, 3, 5, 16), (1, 1), "VALID", (1, 1), NHWC),
    "c16_o16": ((2, 8, 8, 16), (3, 3, 16, 16), (1, 1), "SAME", (1, 1), NHWC),
}

# The cases whose order each CPU model's tables give (jaxlib 0.10.2), checked live on that model only. Zen 3 has
# one chain per output (16, 32, 48 output features; 1-24 input features) and the two-lane tail of 16 features;
# not case_3x3_c8_o16 there: XLA cuts its 512 positions in tasks by the number of CPU devices (this suite's 8:
# the chain for its last 2 positions; one device, as recorded: the two lanes; _xla_cpu_dot.conv_lanes).
MEASURED = {"amd-zen4": list(CASES)[:13],
            "amd-zen3": ["c3_o16_valid", "c24_o16_tile4", "c16_o32_tile2", "c8_o48", "stride2", "nchw_5x5",
                         "c3_o16_tail3", "c5_o16_tail1", "c16_o16"]}


def _measured() -> bool:
    return _xla_cpu_isa.ynnpack_orders() and _xla_cpu_isa.cpu_model() in MEASURED and \
        not os.environ.get("SPMDSIM_XLA_CPU_MODEL") and not os.environ.get("XLA_FLAGS")


def _skip_unmeasured(case: str | None = None):
    if not _measured():
        pytest.skip(f"XLA:CPU's convolution order is measured on AMD Zen 4 and Zen 3 with jaxlib 0.10.2 only "
                    f"(this CPU model: {_xla_cpu_isa.cpu_model()}, jax {jax.__version__})")
    if case is not None and case not in MEASURED[_xla_cpu_isa.cpu_model()]:
        pytest.skip(f"{case}: not in the order measured on {_xla_cpu_isa.cpu_model()}")


def _conv_fun(strides, padding, dilation, dn):
    return lambda x, k: lax.conv_general_dilated(x, k, strides, padding, rhs_dilation=dilation,
                                                 dimension_numbers=dn)


def _operands(case, seed=0):
    xs, ks, *_ = CASES[case]
    rng = np.random.default_rng(seed)
    return rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ks).astype(np.float32)


def _spmdsim(fun, *args):
    closed = jax.make_jaxpr(fun)(*args)
    return [np.asarray(v) for v in eval_jaxpr(closed.jaxpr, closed.consts, *args)]


def _assert_bits(got, expected):
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(g).view(np.int32), np.asarray(e).view(np.int32))


@pytest.fixture
def exact(monkeypatch):
    monkeypatch.setenv("SPMDSIM_EXACT", "1")
    _xla_cpu_isa.exact.cache_clear()
    yield
    monkeypatch.delenv("SPMDSIM_EXACT")
    _xla_cpu_isa.exact.cache_clear()


@pytest.mark.parametrize("case", list(CASES))
def test_live_forward(case, exact):
    _skip_unmeasured(case)
    x, k = _operands(case)
    fun = _conv_fun(*CASES[case][2:])
    _assert_bits(_spmdsim(fun, x, k), [jax.jit(fun)(x, k)])


def test_default_mode_small_conv():
    """The recorded case's shape (Zen 3: one of 200 positions) is in XLA's order without SPMDSIM_EXACT (at most
    CONV_DEFAULT_WORK)."""
    _skip_unmeasured()
    if _xla_cpu_isa.exact():
        pytest.skip("SPMDSIM_EXACT is set")
    case = {"amd-zen4": "case_3x3_c8_o16", "amd-zen3": "c3_o16_valid"}[_xla_cpu_isa.cpu_model()]
    x, k = _operands(case)
    fun = _conv_fun(*CASES[case][2:])
    _assert_bits(_spmdsim(fun, x, k), [jax.jit(fun)(x, k)])


# (on Zen 3 the gradients of the first three have 3, 24 and 8 output features: not measured there)
GRAD_CASES = ["case_3x3_c8_o16", "c24_o16_tile4", "c3_o16_valid", "c16_o16"]


@pytest.mark.parametrize("case", GRAD_CASES)
def test_live_input_gradient(case, exact):
    """The input's gradient (stride 1): a convolution of the cotangent with the flipped kernel."""
    _skip_unmeasured(case)
    if _xla_cpu_isa.cpu_model() == "amd-zen3" and case != "c16_o16":
        pytest.skip("the gradient's output features (the input's: 3, 8, 24) are not measured on Zen 3")
    x, k = _operands(case)
    fun = _conv_fun(*CASES[case][2:])
    g = np.random.default_rng(5).standard_normal(np.shape(jax.eval_shape(fun, x, k))).astype(np.float32)
    grad = lambda x, k, g: jax.vjp(lambda x: fun(x, k), x)[1](g)[0]  # noqa: E731
    _assert_bits(_spmdsim(grad, x, k, g), [jax.jit(grad)(x, k, g)])


@pytest.mark.parametrize("shapes", [((2, 6, 6, 8), (3, 3, 8, 16)), ((1, 8, 8, 24), (3, 3, 24, 16)),
                                    ((1, 4, 4, 20), (3, 3, 20, 8))], ids=str)
def test_live_kernel_gradient(shapes, exact):
    """The kernel's gradient: a convolution of the input (its batch as the features) with the cotangent as the
    window (K = batch * output positions; within the measured sizes)."""
    _skip_unmeasured()
    if _xla_cpu_isa.cpu_model() == "amd-zen3" and shapes[1][-1] % 16:
        pytest.skip("output features not a multiple of 16: not measured on Zen 3")
    rng = np.random.default_rng(3)
    x, k = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    fun = _conv_fun((1, 1), "SAME", (1, 1), NHWC)
    g = rng.standard_normal(np.shape(jax.eval_shape(fun, x, k))).astype(np.float32)
    grad = lambda x, k, g: jax.vjp(lambda k: fun(x, k), k)[1](g)[0]  # noqa: E731
    closed = jax.make_jaxpr(grad)(x, k, g)
    assert closed.jaxpr.eqns[-1].primitive.name == "conv_general_dilated"
    _assert_bits(_spmdsim(grad, x, k, g), [jax.jit(grad)(x, k, g)])


@pytest.mark.parametrize("devices", [2])
@pytest.mark.parametrize("executor", ["vectorized", "threads"])
def test_executors_give_each_devices_bits(executor, devices, exact):
    """A pmapped convolution: every device's result is jax.jit's for that device's operands."""
    _skip_unmeasured()
    case = {"amd-zen4": "c18_o8_tails", "amd-zen3": "c3_o16_tail3"}[_xla_cpu_isa.cpu_model()]  # each model's tails
    fun = _conv_fun(*CASES[case][2:])
    xs, ks = zip(*(_operands(case, seed=d) for d in range(devices)))
    x, k = np.stack(xs), np.stack(ks)
    got = np.asarray(spmdsim.jax.pmap(fun, executor=executor)(x, k))
    for d in range(devices):
        np.testing.assert_array_equal(got[d].view(np.int32), np.asarray(jax.jit(fun)(xs[d], ks[d])).view(np.int32))


_AMD_SCRIPT = r"""
import importlib.util, sys, numpy as np, jax
spec = importlib.util.spec_from_file_location("rec", sys.argv[1] + "/record_xla_cpu.py")
rec = importlib.util.module_from_spec(spec); spec.loader.exec_module(rec)
from spmdsim.jax.evaluation._interpreter import eval_jaxpr
d = np.load(sys.argv[1] + "/cases_amd_zen4_jaxlib0.10.2.npz")
name = "conv_nhwc_3x3"
fun = rec.CASES[name][0]
ins = [d[f"{name}/in{i}"] for i in range(10) if f"{name}/in{i}" in d]
cj = jax.make_jaxpr(fun)(*ins)
got = np.asarray(eval_jaxpr(cj.jaxpr, cj.consts, *ins)[0])
bad = int((got.view(np.int32) != d[f"{name}/out0"].view(np.int32)).sum())
print("differ", bad)
sys.exit(1 if bad else 0)
"""


@pytest.mark.skipif(not AMD_FILE.exists(), reason=f"{AMD_FILE} is absent")
@pytest.mark.skipif(_xla_cpu_isa.jaxlib_minor() != (0, 10), reason="the file and the order are jaxlib 0.10's")
@pytest.mark.parametrize("exact_mode", [False, True], ids=["default", "exact"])
def test_amd_zen4_recorded(exact_mode):
    """The AMD Zen 4 file's conv_nhwc_3x3 under SPMDSIM_XLA_CPU_MODEL=amd-zen4 (any x86 CPU with FMA)."""
    env = dict(os.environ, SPMDSIM_XLA_CPU_MODEL="amd-zen4", SPMDSIM_EXACT="1" if exact_mode else "0")
    env.pop("SPMDSIM_XLA_CPU_ISA", None)
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", _AMD_SCRIPT, str(DATA)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


ZEN3_FILE = Path(__file__).parent / "data" / "convs_amd_zen3_jaxlib0.10.2.npz"
ZEN3_RECORDED = ["case_3x3_c8_o16", *MEASURED["amd-zen3"]]


def record_zen3() -> None:
    """Run on an AMD Zen 3 with jaxlib 0.10.2, one CPU device (no XLA_FLAGS): writes ZEN3_FILE."""
    assert jax.device_count() == 1 and _xla_cpu_isa.cpu_model() == "amd-zen3"
    np.savez_compressed(ZEN3_FILE, **{case: np.asarray(jax.jit(_conv_fun(*CASES[case][2:]))(*_operands(case)))
                                      for case in ZEN3_RECORDED})


@pytest.mark.skipif(not ZEN3_FILE.exists(), reason=f"{ZEN3_FILE} is absent")
@pytest.mark.skipif(_xla_cpu_isa.jaxlib_minor() != (0, 10), reason="the file and the order are jaxlib 0.10's")
@pytest.mark.parametrize("case", ZEN3_RECORDED)
def test_zen3_recorded(case, exact, monkeypatch, request):
    """What jax.jit returned on an AMD Zen 3 (one device), under SPMDSIM_XLA_CPU_MODEL=amd-zen3 on any CPU with FMA:
    the chains and the two-lane tails of 16 output features (case_3x3_c8_o16's last 2 positions)."""
    monkeypatch.setenv("SPMDSIM_XLA_CPU_MODEL", "amd-zen3")
    monkeypatch.delenv("SPMDSIM_XLA_CPU_ISA", raising=False)
    _xla_cpu_isa.cpu_model.cache_clear()  # read once per process: this machine's model may be cached already
    request.addfinalizer(_xla_cpu_isa.cpu_model.cache_clear)
    if not _xla_cpu_isa.current().fma:
        pytest.skip("the model chains fused multiply-adds: XLA:CPU's order on a CPU with FMA")
    x, k = _operands(case)
    _assert_bits(_spmdsim(_conv_fun(*CASES[case][2:]), x, k), [np.load(ZEN3_FILE)[case]])


@pytest.mark.parametrize("executor", ["vectorized", "threads"])
def test_replicated_input_gives_each_devices_bits(executor, exact):
    """An input replicated over the devices (in_axes None: a broadcast device axis in the vectorized executor)."""
    _skip_unmeasured()
    rng = np.random.default_rng(4)
    # Zen 4: 2 features past a tile of 4; Zen 3: 49 positions, the last one by two lanes of unfused adds
    xs, ks = {"amd-zen4": ((1, 8, 8, 18), (3, 3, 3, 18, 8)),
              "amd-zen3": ((1, 7, 7, 5), (3, 3, 3, 5, 16))}[_xla_cpu_isa.cpu_model()]
    x = rng.standard_normal(xs).astype(np.float32)
    k = rng.standard_normal(ks).astype(np.float32)
    fun = _conv_fun((1, 1), "SAME", (1, 1), NHWC)
    got = np.asarray(spmdsim.jax.pmap(fun, in_axes=(None, 0), executor=executor)(x, k))
    for d in range(3):
        np.testing.assert_array_equal(got[d].view(np.int32), np.asarray(jax.jit(fun)(x, k[d])).view(np.int32))
