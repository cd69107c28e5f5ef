"""Regressions from JAX's own op tests (issue 26, failure classes 1, 4, 5, 6), each against XLA:CPU.

Every case is a function and one argument list per device (3 devices, the same shapes, other values). It runs

- on XLA:CPU: ``jax.jit(f)`` on each device's arguments, the expected values;
- per device: ``spmdsim.jax.eval_jaxpr`` of ``jax.make_jaxpr(f)``;
- equation by equation: each equation's vectorized rule on the devices' stacked operands against its per-device
  rule (``check_vectorized`` of ``test_lax_ops.py``);
- through ``spmdsim.jax.pmap`` over the 3 devices with every executor (threads, reference loop, vectorized: the
  vectorized executor splits the devices of a ``while`` by their own predicate);

shape, dtype and bits equal to XLA's (within the recorded ulps where XLA:CPU evaluates its own approximation of a
transcendental function, named per case).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import jax.scipy.special as jsp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import spmdsim.jax as sjax
from conformance.lax_records import tolerance
from conformance.test_lax_ops import _is_float, check_vectorized, ulps

pytestmark = pytest.mark.area("lax primitives vs XLA:CPU")

DEVICES = 3
EXECUTORS = ("threads", "reference", "vectorized")


def _differs(actual, expected, allowed) -> str:
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape or a.dtype != e.dtype:
        return f"spmdsim {a.dtype}{list(a.shape)}, XLA {e.dtype}{list(e.shape)}"
    if _is_float(e.dtype):
        if isinstance(allowed, tuple):  # ("norm", eps): complex products, as the TOLERANCE table has them
            a64, e64 = a.astype(np.complex128), e.astype(np.complex128)
            scale = float(np.max(np.abs(e64), initial=0.0))
            error = float(np.max(np.abs(a64 - e64), initial=0.0))
            return "" if error <= allowed[1] * max(scale, 1e-30) else f"error {error:g} > {allowed[1]:g} x {scale:g}"
        distance = ulps(a, e)
        return "" if distance <= allowed else f"{distance:g} ulps > {allowed:g} (spmdsim {a!r}, XLA {e!r})"
    return "" if np.array_equal(a, e) else f"values differ (spmdsim {a!r}, XLA {e!r})"


def check(f, device_args: list[list], *, allowed=0.0, executors=EXECUTORS):
    """``f`` on every device's arguments: XLA:CPU against spmdsim per device, the vectorized rules against the
    per-device rules, and every executor of ``spmdsim.jax.pmap`` over the devices."""
    assert len(device_args) == DEVICES
    expected = [jax.tree_util.tree_leaves(jax.jit(f)(*args)) for args in device_args]
    closed = jax.make_jaxpr(f)(*device_args[0])
    problems = []
    for d, args in enumerate(device_args):
        actual = sjax.eval_jaxpr(closed.jaxpr, closed.consts, *args)
        for k, (a, e) in enumerate(zip(actual, expected[d], strict=True)):
            if why := _differs(a, e, allowed):
                problems.append(f"eval_jaxpr, device {d}, output {k}: {why}")
    check_vectorized(closed.jaxpr, closed.consts, device_args, problems)
    stacked = [np.stack([np.asarray(args[k]) for args in device_args]) for k in range(len(device_args[0]))]
    for executor in executors:
        outs = jax.tree_util.tree_leaves(sjax.pmap(f, "i", executor=executor)(*stacked))
        for k, out in enumerate(outs):
            for d in range(DEVICES):
                if why := _differs(np.asarray(out)[d], expected[d][k], allowed):
                    problems.append(f"pmap ({executor}), device {d}, output {k}: {why}")
    assert not problems, "\n".join(problems[:20])


def per_device(make):
    """``[make(d) for d in devices]``: each device's argument list."""
    return [list(make(d)) for d in range(DEVICES)]


# -- class 1: while with a batched predicate ------------------------------------------------------------------------

def test_vmap_of_while_loop_runs_while_any_element_is_true():
    """The issue's reproducer: the jaxpr's cond returns bool[3] (no reduce_or in the jaxpr: XLA's lowering
    reduces it and selects inside the body). Devices start elsewhere, so they also leave the loop apart."""
    f = jax.vmap(lambda x: lax.while_loop(lambda c: c < 10, lambda c: c + 1, x))
    assert str(jax.make_jaxpr(f)(np.arange(3, dtype=np.int32)).jaxpr.eqns[0].params["cond_jaxpr"].out_avals[0]) \
        == "bool[3]"
    check(f, per_device(lambda d: [np.arange(3, dtype=np.int32) + 4 * d]))


def test_batched_while_keeps_finished_elements_and_trailing_axes():
    """Batched consts in the condition and the body, a carry with an axis beyond the predicate's (the predicate
    broadcast over it), and an unbatched counter: finished elements keep their values while others go on."""
    def body(carry, limit, step):
        i, v, n = carry
        return i + 1, v * step + 0.5, n + 1

    def one(x, limit, step):
        return lax.while_loop(lambda c: c[0] < limit, lambda c: body(c, limit, step), (x, jnp.zeros(2) + x, 0))

    f = jax.vmap(one, in_axes=(0, 0, None))
    check(f, per_device(lambda d: [np.array([0, 3, 7, 9], np.int32) - d, np.array([5, 5, 8, 2 + d], np.int32),
                                   np.float32(1.25)]))


@pytest.mark.parametrize("name", ["exp1", "expi", "expn", "hyp1f1", "hyp2f1"])
def test_special_functions_with_batched_while_loops(name):
    """jax.scipy.special's series run as while loops over a batched predicate (they crashed). The batched loop
    gives every element exactly what the loop on that element alone gives; against XLA within the distance
    the unbatched functions have too (up to 7 ulps: lgamma, pow and log by SciPy/NumPy feed the series)."""
    rng = np.random.default_rng(26)
    fns = {"exp1": jsp.exp1, "expi": jsp.expi, "expn": lambda n, x: jsp.expn(n, x),
           "hyp1f1": lambda x: jsp.hyp1f1(np.float32(0.7), np.float32(1.3), x),
           "hyp2f1": lambda x: jsp.hyp2f1(np.float32(0.7), np.float32(1.3), np.float32(2.1), x * 0.1)}
    sign = np.array([1, -1, 1, -1, 1, 1], np.float32) if name == "expi" else 1

    def args(d):
        x = (rng.uniform(0.1, 8.0, 6) * sign).astype(np.float32)
        return [np.arange(6, dtype=np.int32), x] if name == "expn" else [x]
    device_args = per_device(args)
    check(fns[name], device_args, allowed={"exp1": 6, "expi": 6, "expn": 7}.get(name, 1))
    closed = jax.make_jaxpr(fns[name])(*device_args[0])
    batched = sjax.eval_jaxpr(closed.jaxpr, closed.consts, *device_args[0])[0]
    for k in range(6):
        one = [np.asarray(a[k]) for a in device_args[0]]
        alone = jax.make_jaxpr(fns[name])(*one)
        assert sjax.eval_jaxpr(alone.jaxpr, alone.consts, *one)[0].tobytes() == batched[k].tobytes()


def test_batched_polar():
    """jax.scipy.linalg.polar (QDWH: a while loop whose predicate is batched under the batch of matrices)."""
    rng = np.random.default_rng(1)
    check(lambda m: jsl.polar(m), per_device(lambda d: [rng.standard_normal((2, 3, 3)).astype(np.float32)]),
          allowed=2)


# -- class 4: scatter with an update computation --------------------------------------------------------------------

_ROWS = lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,),
                                    scatter_dims_to_operand_dims=(0,))


def test_scatter_apply_applies_the_update_computation():
    """The issue's reproducers (spmdsim gave [1 0 3 0 5]): sin within XLA:CPU's float32 sin (1 ulp)."""
    x = [np.arange(1.0, 6.0, dtype=np.float32) * (d + 1) for d in range(DEVICES)]
    check(lambda v: lax.scatter_apply(v, jnp.array([[1], [3]]), jnp.sin, _ROWS, update_shape=(2,)),
          [[v] for v in x], allowed=tolerance("sin", "float32"))
    check(lambda v: v.at[jnp.array([1, 3])].apply(jnp.sin), [[v] for v in x], allowed=tolerance("sin", "float32"))


@pytest.mark.parametrize("mode", ["fill", "clip", "promise_in_bounds"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, ml_dtypes.bfloat16])
def test_scatter_apply_repeated_and_out_of_bounds_indices(mode, dtype):
    """A repeated index gets the computation once per occurrence, in order; out-of-bounds indices are dropped
    (fill) or clamped (clip); a constant captured by the computation (update_consts) and rows as windows."""
    scale = np.array(3, dtype)
    indices = np.array([1, 4, 1, 9, -7, 1, 0], np.int32) if mode != "promise_in_bounds" else \
        np.array([1, 4, 1, 0, 1], np.int32)

    def f(x, i):
        return x.at[i].apply(lambda v: (v + 1) * scale, mode=mode)
    check(f, per_device(lambda d: [(np.arange(15).reshape(5, 3) % 4 - d).astype(dtype), indices + d % 2]))


def test_scatter_apply_in_a_while_loop_of_devices():
    """The update computation as a sub-jaxpr: a device-dependent number of applications."""
    def f(x, n):
        return lax.fori_loop(0, n, lambda _, v: v.at[jnp.array([0, 2, 2])].apply(lambda u: u * 2 - 1), x)
    check(f, per_device(lambda d: [np.arange(4, dtype=np.int32) + d, np.int32(d + 1)]))


# -- class 5: bitcast_convert_type between widths ---------------------------------------------------------------------

def test_bitcast_scalar_to_narrower_type():
    """float32[] -> int16 is int16[2] (low half first): it raised ValueError per device."""
    check(lambda x: lax.bitcast_convert_type(x, jnp.int16), per_device(lambda d: [np.float32(1.5 + d)]))
    with jax.enable_x64(True):
        check(lambda x: lax.bitcast_convert_type(x, jnp.uint8), per_device(lambda d: [np.float64(-2.75 * d)]))


def test_bitcast_sub_byte_types_are_packed():
    """int4[2, 2] -> int8[2]: two nibbles per byte, the first element in the low bits (spmdsim returned int8[2, 2],
    a byte per int4); and back."""
    x = per_device(lambda d: [np.array([[1, -2], [3, 7 - d]], np.int8).astype(ml_dtypes.int4)])
    check(lambda v: lax.bitcast_convert_type(v, jnp.int8), x)
    check(lambda v: lax.bitcast_convert_type(v, jnp.uint4), x)
    check(lambda v: lax.bitcast_convert_type(v, jnp.int4), per_device(lambda d: [np.array([-31, 115 + d], np.int8)]))
    check(lambda v: lax.bitcast_convert_type(v, jnp.float32),
          per_device(lambda d: [np.array([1, 2, 3, 4, 5, 6, 7, 8 - d], np.int8).astype(ml_dtypes.uint4)]))


# -- class 6: mul's out_dtype, lu of 0x0, igamma/igammac/betainc boundaries, mixed dot_general ------------------------

@pytest.mark.parametrize("x64", [False, True])
def test_mul_out_dtype_is_canonicalised(x64):
    """mul(f32, f32, out_dtype=float64): float32 while x64 is off (the jaxpr's and XLA's type; spmdsim returned
    float64), float64 with it on; out_dtype int32 converts the operands first (truncating)."""
    # With x64 on only in this thread (jax.enable_x64), the reference loop's device threads see it off: its
    # mul rule canonicalises out_dtype by the x64 setting where it runs (the compiled programs, used by the
    # other executors, take the dtype from the jaxpr), and would make float32 where the jaxpr says float64.
    executors = ("threads", "vectorized") if x64 else EXECUTORS
    with jax.enable_x64(x64):
        args = per_device(lambda d: [np.float32([1.1, -2.7, 3.3]) * (d + 1), np.float32([3.3, 0.7, -1.9])])
        check(lambda x, y: lax.mul(x, y, out_dtype=np.float64), args, executors=executors)
        check(lambda x, y: lax.mul(x, y, out_dtype=np.int32), args)
        check(lambda x, y: lax.mul(x, y, out_dtype=jnp.bfloat16), args)


def test_lu_and_det_of_empty_matrices():
    """LAPACK's getrf rejects a 0x0 matrix (spmdsim crashed); XLA: no pivots, the identity permutation, det 1."""
    for shape in ((0, 0), (2, 0, 0), (3, 0), (0, 2)):
        check(lax.linalg.lu, per_device(lambda d: [np.zeros(shape, np.float32)]))
    check(jnp.linalg.det, per_device(lambda d: [np.zeros((0, 0), np.float32)]))
    check(jnp.linalg.slogdet, per_device(lambda d: [np.zeros((0, 0), np.float32)]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_incomplete_gamma_and_beta_boundaries(dtype):
    """igamma(0, 1) = 1 and igammac(0, 1) = 0 (spmdsim gave NaN), igamma(0, 0.5) NaN (XLA's series divides by
    a = 0), x = inf, a = inf; betainc with a = 0 (1 for x > 0, 0 at x = 0), b = 0 (0 for x < 1, 1 at x = 1),
    b = inf, a = b = 0 (NaN): each exactly XLA's value."""
    with jax.enable_x64(dtype == np.float64):
        a = np.array([0, -0.0, 0, 0, 0, 0, 0.5, 2, np.inf, np.inf, np.inf, np.inf, 1, 0, -1, np.nan], dtype)
        x = np.array([1, 1, 0.5, 2, np.inf, 0, np.inf, 0, 0.5, 1, 3, np.inf, -1, 1e-3, 1, 1], dtype)
        check(lambda a, x: (lax.igamma(a, x), lax.igammac(a, x)), per_device(lambda d: [a, x]))
        inf, nan = np.inf, np.nan
        # (a, b, x): a = 0 or b = inf is "a is zero" (1 for x > 0), b = 0 or a = inf "b is zero" (0 for x < 1)
        triples = np.array([(0, 0.5, 0), (0, 0.5, 0.25), (0, 2, 1), (0, inf, 0), (0, inf, 0.25), (0.5, inf, 0.25),
                            (0.5, 0, 0), (2, 0, 0.25), (0.5, 0, 1), (inf, 0.5, 0.25), (inf, 2, 1), (0, 0, 0.25),
                            (inf, inf, 0.5), (0, -0.0, 0.5), (-1, 0.5, 0.5), (0.5, 0.5, 1.5), (0.5, 2, 0),
                            (0.5, 2, 1), (nan, 0, 0.5)], dtype).T
        expected = np.array([0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1, nan, nan, nan, nan, nan, 0, 1, nan], dtype)
        check(jsp.betainc, per_device(lambda d: list(triples)))
        np.testing.assert_array_equal(np.asarray(jax.jit(jsp.betainc)(*triples)), expected)


@pytest.mark.parametrize("other, preferred", [(np.int16, None), (np.int16, np.float32), (np.int16, np.int32),
                                              (np.int8, None), (np.float16, None), (np.uint8, np.int32)])
def test_dot_general_of_two_operand_types(other, preferred):
    """bfloat16 x int16 (NumPy has no common type: it raised): XLA's result type is the operand of higher
    precision (bfloat16), or the preferred one, both operands converted to it before the product (a preferred
    int32 truncates the bfloat16 operand)."""
    rng = np.random.default_rng(3)

    def f(x, y):
        return lax.dot_general(x, y, (((1,), (0,)), ((), ())), preferred_element_type=preferred)
    check(f, per_device(lambda d: [rng.uniform(-3, 3, (4, 5)).astype(ml_dtypes.bfloat16),
                                   rng.integers(-4, 5, (5, 3)).astype(other)]))
