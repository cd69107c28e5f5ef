"""XLA:CPU's numerics on the ISA it compiles for (issue 26): spmdsim's model of it, and the differential tests
under every ISA cap this machine supports.

- :func:`spmdsim.jax.numerics._xla_cpu_isa.model` from CPU flags, ``--xla_cpu_max_isa`` and ``SPMDSIM_XLA_CPU_ISA``;
- each ISA-dependent behaviour against XLA:CPU here (float64 -> float16, float16 multiply-adds in the gamma
  sampler, float32 fused multiply-adds), and the model's other side computed by NumPy reasoning;
- ``conformance/test_lax_ops.py``'s ISA-dependent cases and the bit-exactness tests in a subprocess under each
  lower cap that changes the model (the native run is the suite's own), so that CI checks every ISA level the
  machine can reproduce.
"""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from spmdsim.jax.numerics import _xla_cpu_isa as isa
from spmdsim.jax.numerics import _xla_cpu_math

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
    """The ISA caps below this CPU's own under which spmdsim's model changes: AVX2 on a CPU with AVX-512 (the
    cap takes away ``avx512f``), AVX512 on a CPU with AVX512-FP16 (it keeps FP16, which the model says). On a
    CPU with AVX2 and FMA alone (AMD Zen 3) the AVX2 cap takes nothing away: its rerun was the native run again
    (205 s there), so it is not made. On a CPU with
    AVX-512 but no FP16 (AMD Zen 4) the AVX512 cap leaves the model as it is (the whole of test_lax_ops.py passed
    under it there, issue 38), so it is not rerun. (``AVX``, a CPU without FMA, is not modelled: there
    XLA:CPU's float32 ``tanh``, ``erf`` and special functions take other paths, 1-5 ulps from spmdsim's,
    measured under the cap.)"""
    caps = []
    if {"avx2", "fma", "avx512f"} <= CPU:
        caps.append("AVX2")
    if "avx512f" in CPU and "avx512_fp16" in CPU:
        caps.append("AVX512")
    return caps


# The lax_ops cases whose results depend on no ISA feature: no arithmetic (shapes, indexing, selection,
# comparisons, orderings), integer and bit arithmetic (the PRNGs' too), and single IEEE operations, each
# correctly rounded on every ISA (add, sub, sqrt, floor, conversions other than to float16, ...). Every other
# case (products, sums, transcendental ports, special functions, linear algebra, FFT, multiply, divide and abs,
# whose complex forms fuse multiply-adds, conversions to float16) is rerun under each cap.
ISA_INDEPENDENT = frozenset("""
    broadcast_in_dim broadcast_in_dim-scalar concatenate copy dce_sink device_put dynamic_slice
    dynamic_update_slice empty2 gather gather-batching-dims iota iota_2x32_shape optimization_barrier pad
    pad-empty-and-value reshape rev select_n sharding_constraint slice split squeeze stack stop_gradient tile
    transpose unstack platform_index
    eq eq_to ge gt le le_to lt lt_to ne max min clamp argmax argmax-specials argmin reduce_max reduce_min cummax
    cummin reduce_window_max reduce_window_min sort sort-unstable top_k approx_top_k is_finite sign scatter
    scatter-max scatter-min
    and or xor not clz population_count shift_left shift_right_arithmetic shift_right_logical mulhi reduce_and
    reduce_or reduce_xor random_bits random_bits-64 random_clone random_fold_in random_seed random_split
    random_unwrap random_wrap rng_bit_generator rng_bit_generator-64 threefry2x32 threefry4x32 philox2x32
    philox4x32 lu_pivots_to_permutation
    add add_any sub neg floor ceil round round-halves nextafter rem real imag conj complex reduce_precision
    reduce_precision-bf16
""".split()) | {f"bitcast_convert_type-{label}" for label in (
    "sub-byte", "to-sub-byte", "to-bfloat16", "to-float16", "to-float32", "to-float64", "to-int8", "to-int16",
    "to-int32", "to-int64", "to-uint8", "to-uint16", "to-uint32", "to-uint64")} | {
    f"convert_element_type-to-{t}" for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                             "uint32", "uint64", "float32", "float64", "complex64", "complex128",
                                             "bfloat16")}


def _isa_dependent_lax_ops() -> list[str]:
    """The node ids of ``conformance/test_lax_ops.py``'s cases outside :data:`ISA_INDEPENDENT`."""
    from conformance.test_lax_ops import PARAMS
    ids = [p.id for p in PARAMS]
    return [f"conformance/test_lax_ops.py::test_lax_op[{i}]" for i in ids
            if i.split("-bit-", 1)[1] not in ISA_INDEPENDENT]


def test_isa_independent_names_are_cases():
    """Every name in :data:`ISA_INDEPENDENT` is a lax_ops case (a renamed case would otherwise be rerun
    silently, or a typo leave one out)."""
    from conformance.test_lax_ops import PARAMS
    names = {p.id.split("-bit-", 1)[1] for p in PARAMS}
    assert ISA_INDEPENDENT <= names, sorted(ISA_INDEPENDENT - names)


@pytest.mark.skipif("--xla_cpu_max_isa" in os.environ.get("XLA_FLAGS", "") or
                    bool(os.environ.get("SPMDSIM_XLA_CPU_ISA")), reason="already running under a cap or a pin")
@pytest.mark.skipif(not _caps_below_native(), reason="this CPU has no ISA below its own that spmdsim models")
def test_lax_ops_and_bit_exactness_under_every_isa_cap():
    """The table-driven differential test's ISA-dependent cases and the bit-exactness tests pass under
    ``--xla_cpu_max_isa=CAP`` for every cap below this CPU's own, with XLA:CPU and spmdsim's model both capped
    (they read the same XLA_FLAGS). The caps run one after the other (each run's cases use the machine's CPUs as
    the rest of the suite does)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tests = [*_isa_dependent_lax_ops(), "conformance/test_isa.py", "conformance/test_xla_order_reductions.py",
             "conformance/test_xla_order_elementwise.py::test_sum_of_products",  # LLVM's vectorised loops: per ISA
             "conformance/test_examples_and_bits.py::test_float32_psum_is_bit_exact_with_xla_cpu",
             "conformance/test_examples_and_bits.py::test_bf16_training_steps_collectives_equal_xla_cpus_bit_for_bit"]
    failed = {}
    for cap in _caps_below_native():
        env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_max_isa={cap}".strip())
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=root,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
        if run.returncode != 0:
            failed[cap] = run.stdout[-6000:]
    assert not failed, "\n".join(f"under --xla_cpu_max_isa={cap}:\n{out}" for cap, out in failed.items())


# -- multiply-adds across equations (spmdsim/jax/evaluation/_contraction.py) ----------------------------------------------

CONTRACTED = {  # each equal to XLA:CPU bit for bit on every value, on every ISA (fused or not)
    "a*b+c": lambda a, b, c, d: a * b + c, "c+a*b": lambda a, b, c, d: c + a * b,
    "a*b-c": lambda a, b, c, d: a * b - c, "c-a*b": lambda a, b, c, d: c - a * b,
    "a*b+c*d": lambda a, b, c, d: a * b + c * d, "a*b+c*d-a": lambda a, b, c, d: a * b + c * d - a,
    "square+c": lambda a, b, c, d: jax.numpy.square(a) + c, "a*a*a+c": lambda a, b, c, d: a * a * a + c,
    "(a*b+c)*d+a": lambda a, b, c, d: (a * b + c) * d + a,
    "product also returned": lambda a, b, c, d: (a * b + c, a * b),
    "product also multiplied": lambda a, b, c, d: (a * b + c) * (a * b),
    "product in two sums": lambda a, b, c, d: (a * b + c, a * b + d),
    "normalise, scale, shift": lambda a, b, c, d: (a - d[0]) * b * c + d,
    "sigmoid(a)*b+c": lambda a, b, c, d: jax.nn.sigmoid(a) * b + c, "gelu": lambda a, b, c, d: jax.nn.gelu(a),
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", CONTRACTED)
def test_multiply_adds_across_equations_as_xla_cpu(name, dtype):
    import spmdsim.jax as sjax

    rng = np.random.default_rng(len(name))
    args = list((rng.standard_normal((4, 5000)) * 3).astype(jax.numpy.dtype(dtype)))
    f = CONTRACTED[name]
    xla = jax.tree_util.tree_leaves(jax.jit(f)(*args))
    closed = jax.make_jaxpr(f)(*args)
    ours = sjax.eval_jaxpr(closed.jaxpr, closed.consts, *args)
    for x, y in zip(xla, ours, strict=True):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@pytest.mark.parametrize("executor", ["threads", "vectorized", "reference"])
def test_uniform_inside_a_map_equals_xla(executor):
    """Issue 26's reproducer: flax's initialisers draw ``u * (hi - lo) + lo``, which XLA:CPU fuses."""
    import spmdsim.jax as sjax
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(jax.devices(), ("i",))
    key = jax.random.PRNGKey(0)

    def f(k):
        return jax.random.uniform(k, (65536,), minval=-0.9544997, maxval=0.9544997)

    inside = jax.jit(sjax.shard_map(lambda k: f(k)[None], mesh=mesh, in_specs=P(), out_specs=P("i"),
                                    executor=executor))(key)
    assert np.asarray(inside).shape == (len(jax.devices()), 65536)
    assert np.asarray(inside[3]).tobytes() == np.asarray(jax.jit(f)(key)).tobytes()
    pmapped = sjax.pmap(lambda k: f(k), executor=executor)(jax.random.split(key, 8))
    assert np.asarray(pmapped).tobytes() == np.asarray(jax.pmap(f)(jax.random.split(key, 8))).tobytes()


def _mixed_precision_step(params, batch):
    """bfloat16 compute, float32 master weights, a float16 matmul accumulated in float32, float16 loss scaling,
    bfloat16 gradients averaged over the devices (issue 26's mixed-precision case)."""
    import jax.numpy as jnp

    x, y = batch
    scale = jnp.float16(1024)

    def loss_fn(p):
        h = jnp.dot(x.astype(jnp.bfloat16), p["w1"].astype(jnp.bfloat16)) + p["b1"].astype(jnp.bfloat16)
        h = jax.nn.gelu(h) * jax.nn.sigmoid(h)
        out = jax.lax.dot(h.astype(jnp.float16), p["w2"].astype(jnp.float16), preferred_element_type=jnp.float32)
        loss = jnp.mean((out - y) ** 2)
        return (loss.astype(jnp.float16) * scale).astype(jnp.float32), loss

    grads, loss = jax.grad(loss_fn, has_aux=True)(params)
    grads = jax.lax.pmean(jax.tree_util.tree_map(lambda g: g.astype(jnp.bfloat16), grads), "i")
    new = jax.tree_util.tree_map(lambda p, g: p - 0.05 * (g.astype(jnp.float32) / 1024.0), params, grads)
    return new, jax.lax.pmean(loss, "i")


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_mixed_precision_training_agrees_with_jax_pmap_over_five_steps(executor):
    import spmdsim.jax as sjax

    rng = np.random.default_rng(2626)
    params = {"w1": rng.standard_normal((16, 32)).astype(np.float32) * 0.3, "b1": np.zeros(32, np.float32),
              "w2": rng.standard_normal((32, 4)).astype(np.float32) * 0.3}
    batch = (rng.standard_normal((8, 8, 16)).astype(np.float32), rng.standard_normal((8, 8, 4)).astype(np.float32))
    ours_step = sjax.pmap(_mixed_precision_step, "i", in_axes=(None, 0), out_axes=None, executor=executor)
    real_step = jax.pmap(_mixed_precision_step, "i", in_axes=(None, 0), out_axes=None)
    ours, real = params, params
    for _ in range(5):
        ours, ours_loss = ours_step(ours, batch)
        real, real_loss = real_step(real, batch)
        np.testing.assert_allclose(np.asarray(ours_loss), np.asarray(real_loss), rtol=2e-7, atol=0)
        for k in params:
            np.testing.assert_allclose(np.asarray(ours[k]), np.asarray(real[k]), rtol=2e-7, atol=1e-9, err_msg=k)
