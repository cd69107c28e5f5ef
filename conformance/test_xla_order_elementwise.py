"""Elementwise operations as XLA:CPU computes them, bit for bit against live ``jax.jit`` on the machine running the
test (issue 38): float32 ``sin``/``cos`` (the C library's sinf/cosf, which XLA:CPU calls), divisions that XLA's
algebraic simplifier turns into products (``x / broadcast(y)`` and ``x / constant`` as ``x * (1 / y)``,
``x / sqrt(y)`` as ``x * rsqrt(y)``), and the programs of the recorded cases built from them. Each case runs
through spmdsim's reference interpreter and through ``spmdsim.jax.pmap`` with both executors on two devices.
"""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
from jax import lax  # noqa: E402

import spmdsim.jax  # noqa: E402
from spmdsim.jax.evaluation._interpreter import eval_jaxpr  # noqa: E402
from spmdsim.jax.numerics import _xla_cpu_isa, _xla_cpu_probe  # noqa: E402

f32 = np.float32
rng = np.random.default_rng(38)


def _bits(a):
    a = np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _check(fun, *ins, executors=True):
    """``fun`` on ``ins`` by spmdsim's reference interpreter, and by pmap over two devices (each device the same
    inputs, so each equals jax.jit's) in both executors: every bit equal to XLA:CPU's."""
    expected = jax.jit(fun)(*ins)
    expected = expected if isinstance(expected, tuple) else (expected,)
    closed = jax.make_jaxpr(fun)(*ins)
    got = eval_jaxpr(closed.jaxpr, closed.consts, *ins)
    for g, e in zip(got, expected, strict=True):
        bad = _bits(g) != _bits(e)
        assert not bad.any(), f"reference: {int(bad.sum())}/{bad.size} differ, e.g. at {np.argwhere(bad)[:3].tolist()}"
    if not executors:
        return
    stacked = [np.stack([x, x]) for x in ins]
    for executor in ("vectorized", "threads"):
        out = spmdsim.jax.pmap(fun, executor=executor)(*stacked)
        out = out if isinstance(out, tuple) else (out,)
        for o, e in zip(out, expected, strict=True):
            for d in range(2):
                bad = _bits(np.asarray(o)[d]) != _bits(e)
                assert not bad.any(), f"{executor}, device {d}: {int(bad.sum())}/{bad.size} differ"


def _float32_operands():
    """Normal values of every magnitude: ``normal * 10`` (the recorded case's range, where 15% of results
    differed by an ulp from NumPy's float32 sin), near multiples of pi/2, large arguments up to 3e38 (the C
    library's long reduction), tiny and subnormal ones, and the special values."""
    parts = [rng.standard_normal(8192) * 10, rng.standard_normal(4096) * 1000,
             np.exp(rng.uniform(np.log(1e3), np.log(3e38), 4096)) * rng.choice([-1, 1], 4096),
             (np.arange(-2048, 2048) * (np.pi / 2)) + rng.standard_normal(4096) * 1e-3,
             np.exp(rng.uniform(np.log(1e-45), np.log(1e-2), 2048)) * rng.choice([-1, 1], 2048),
             [0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 1e-40, -1e-40, 1.1754944e-38]]
    return np.concatenate([np.asarray(p, np.float64).ravel() for p in parts]).astype(f32)


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos_float32(name):
    """XLA:CPU's float32 sin/cos call sinf/cosf (every jaxlib 0.10-0.12): spmdsim's agree on every operand."""
    _check(getattr(jnp, name), _float32_operands())


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos_low_precision(name, dtype):
    """float16 and bfloat16 through float32's sinf/cosf, rounded."""
    _check(getattr(jnp, name), (rng.standard_normal(8192) * 10).astype(dtype))


def test_sin_times_two_plus_one():
    """The recorded ``jnp.sin(x) * 2.0 + 1.0``: one ulp of sin was 128 ulps of the result near -1/2."""
    _check(lambda x: jnp.sin(x) * 2.0 + 1.0, (rng.standard_normal(8192) * 10).astype(f32))


def _normal(*shape, dtype=f32):
    return rng.standard_normal(shape).astype(dtype)


def _positive(*shape, dtype=f32):
    return (np.abs(rng.standard_normal(shape)) + 0.5).astype(dtype)


_CONSTANT = _positive(64, 32)

DIVISIONS = {
    "by_row_1x32": (lambda x, y: x / y, lambda dt: (_normal(64, 32, dtype=dt), _positive(1, 32, dtype=dt))),
    "by_column_64x1": (lambda x, y: x / y, lambda dt: (_normal(64, 32, dtype=dt), _positive(64, 1, dtype=dt))),
    "by_vector_32": (lambda x, y: x / y, lambda dt: (_normal(64, 32, dtype=dt), _positive(32, dtype=dt))),
    "by_scalar": (lambda x, y: x / y, lambda dt: (_normal(64, 32, dtype=dt), _positive(dtype=dt))),
    "by_broadcast_to": (lambda x, y: x / jnp.broadcast_to(y, x.shape),
                        lambda dt: (_normal(64, 32, dtype=dt), _positive(32, dtype=dt))),
    "by_literal_3": (lambda x, y: x / 3.0 + y * 0, lambda dt: (_normal(64, 32, dtype=dt), _normal(64, 32, dtype=dt))),
    "by_constant_array": (lambda x, y: x / _CONSTANT.astype(x.dtype) + y,
                          lambda dt: (_normal(64, 32, dtype=dt), _normal(64, 32, dtype=dt))),
    "same_shape": (lambda x, y: x / y, lambda dt: (_normal(64, 32, dtype=dt), _positive(64, 32, dtype=dt))),
    "broadcast_numerator": (lambda x, y: x / y, lambda dt: (_normal(64, 1, dtype=dt), _positive(64, 32, dtype=dt))),
    "then_add": (lambda x, y: x / y + 1.5, lambda dt: (_normal(64, 32, dtype=dt), _positive(1, 32, dtype=dt))),
    "mean_of_3": (lambda x, y: x.mean(0) + y, lambda dt: (_normal(3, 64, dtype=dt), _normal(64, dtype=dt))),
    "mean_of_5": (lambda x, y: x.mean(1) + y, lambda dt: (_normal(7, 5, dtype=dt), _normal(7, dtype=dt))),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", sorted(DIVISIONS))
def test_division(case, dtype):
    """A division by a broadcast or a constant is a product by the rounded reciprocal on XLA:CPU (its algebraic
    simplifier); by an array of the result's own shape, a division."""
    if np.dtype(dtype) == np.float16 and _xla_cpu_isa.current().fp16 and case == "then_add":
        pytest.skip("float16 multiply-adds on an AVX512-FP16 CPU are float16 FMAs: not what this case measures")
    fun, make = DIVISIONS[case]
    # a closed-over array reaches the executors as an operand, not a constant of the jaxpr: not modelled there
    _check(fun, *make(dtype), executors=case != "by_constant_array")


def test_division_float64():
    """float64 the same way (x64 on), with the multiply-add that follows contracted (a CPU with FMA)."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        x, y = _normal(64, 32, dtype=np.float64), _positive(1, 32, dtype=np.float64)
        _check(lambda x, y: (x / y, x / y + 1.5, x / 3.0), x, y)
    finally:
        jax.config.update("jax_enable_x64", before)


def _needs_measured_rsqrt():
    if _xla_cpu_probe.rsqrt_offsets() is None:
        pytest.skip("XLA:CPU's rsqrt on this CPU model is not measured (its estimate's bits): x / sqrt(y) is "
                    "x * rsqrt(y) there, so spmdsim can match only where rsqrt does")


def _needs_measured_sums():
    if not _xla_cpu_isa.ynnpack_orders():
        pytest.skip("the float32 sums' order (softmax's, mean's and var's) is measured on AMD Zen 4 with jaxlib "
                    "0.10 only (_xla_cpu_isa.ynnpack_orders)")


SQRT_DIVISIONS = {
    "x_over_sqrt_y": (lambda x, y: x / jnp.sqrt(y), (64, 32)),
    "x_over_sqrt_row": (lambda x, y: x / jnp.sqrt(y), (1, 32)),
    "x_over_rsqrt_y": (lambda x, y: x / lax.rsqrt(y), (64, 32)),
    "one_over_sqrt": (lambda x, y: 1.0 / jnp.sqrt(y) + x * 0, (64, 32)),
    "times_one_over_sqrt": (lambda x, y: x * (1.0 / jnp.sqrt(y)), (1, 32)),
}


@pytest.mark.parametrize("case", sorted(SQRT_DIVISIONS))
def test_division_by_square_root(case):
    """``A / sqrt(B)`` is ``A * rsqrt(B)`` and ``A / rsqrt(B)`` ``A * sqrt(B)`` on XLA:CPU."""
    _needs_measured_rsqrt()
    fun, shape = SQRT_DIVISIONS[case]
    _check(fun, _normal(64, 32), _positive(*shape))


def test_normalisation_by_square_root():
    """``(x - mean) / sqrt(var + eps)``: the division by a broadcast square root is a product by rsqrt."""
    _needs_measured_rsqrt()
    _needs_measured_sums()
    _check(lambda x: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5), _normal(16, 256))


@pytest.mark.parametrize("rows", [6, 16])
@pytest.mark.parametrize("n", [2, 3, 5, 6, 8, 16, 31, 32])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("form", ["square", "pow", "mul"])
def test_sum_of_squares(form, axis, n, rows):
    """A sum of up to 32 squares that XLA:CPU fuses into the sum's loop: each square contracted into its add (over
    the last axis of 16 rows, jaxlib 0.10 vectorises 5-8 plain squares and 2-8 squares of a difference, unfused)."""
    if not _xla_cpu_isa.current().fma:
        pytest.skip("no FMA in this ISA: nothing is contracted")
    square = {"square": jnp.square, "pow": lambda d: d ** 2, "mul": lambda d: d * d}[form]
    shape = (n, rows) if axis == 0 else (rows, n)
    for seed in range(3):
        r = np.random.default_rng(seed)
        x, m = r.standard_normal(shape).astype(f32), r.standard_normal(shape).astype(f32)
        _check(lambda x, m: jnp.sum(square(x - m), axis=axis), x, m)
        _check(lambda x: jnp.sum(square(x), axis=axis), x)


PRODUCT_SUMS = {  # (the summed products, a second output or None)
    "a*b": (lambda a, b, c, axis: a * b, None),
    "a*broadcast(w)": (lambda a, b, c, axis: a * (b[:1] if axis == 0 else b[:, :1]), None),
    "-(a*b)": (lambda a, b, c, axis: -(a * b), None),
    "exp(a)*b": (lambda a, b, c, axis: jnp.exp(a) * b, None),
    "a*b, also added": (lambda a, b, c, axis: a * b, lambda p, c: p + c),
    "a*b, also returned": (lambda a, b, c, axis: a * b, lambda p, c: p),
}


@pytest.mark.parametrize("n", [2, 3, 6, 8, 16, 31, 32, 33])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("form", sorted(PRODUCT_SUMS))
def test_sum_of_products(form, axis, n):
    """A sum of up to 32 products of two values that XLA:CPU fuses into the sum's loop: from the init 0, each
    product contracted into its add, also when something else uses the product (XLA duplicates it into each
    fusion), but not when the program returns it; over the last axis of 6 or 8 elements and 16 outputs, jaxlib
    0.10's vectorised loop adds the plain products unfused (jaxlib 0.12 contracts them: both compared live)."""
    if not _xla_cpu_isa.current().fma:
        pytest.skip("no FMA in this ISA: nothing is contracted")
    if n > 32 or form == "a*b, also returned":
        _needs_measured_sums()  # a plain sum of the products: XLA's loop order
    product, other = PRODUCT_SUMS[form]
    shape = (n, 16) if axis == 0 else (16, n)

    def fun(a, b, c):
        p = product(a, b, c, axis)
        return (jnp.sum(p, axis=axis),) + (() if other is None else (other(p, c),))

    for seed in range(3):
        r = np.random.default_rng(seed)
        _check(fun, *(r.standard_normal(shape).astype(f32) for _ in range(3)))


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12])
def test_product_broadcast_into_an_add_is_not_contracted(n):
    """A product of fewer elements than the add it feeds (``x - x.mean(-1, keepdims=True)``'s mean, ``x + s * u``
    with ``s * u`` of shape (6, 1)) is computed once, outside the add's loop: XLA contracts nothing there. (``jnp.var``
    over the last axis went wrong this way for every length but 2, 4 and 8.)"""
    if n >= 8:
        _needs_measured_sums()  # the mean's sum in XLA's order (NumPy's pairwise sum agrees below 8 elements)
    r = np.random.default_rng(n)
    x, s, u = (r.standard_normal(shape).astype(f32) for shape in ((6, n), (6, 1), (6, 1)))
    _check(lambda x: (x - x.mean(-1, keepdims=True), x.var(-1)), x)
    _check(lambda x, s, u: x + s * u, x, s, u)
    _check(lambda x, s, u: x - s[:1].T * u[:1], x.T.copy(), s, u)


@pytest.mark.parametrize("case", ["a*b", "a*a", "(a-b)**2", "var", "-(a*b)"])
@pytest.mark.parametrize("shape,axis", [((16, 4), 0), ((16, 6), 1), ((6, 7), 1), ((3, 32), 0), ((16, 12), 1)])
def test_float64_sums_of_products(case, shape, axis):
    """float64 sums of products and squares are fused as float32's (measured with jaxlib 0.10.2 and 0.12.0.1)."""
    if not _xla_cpu_isa.current().fma:
        pytest.skip("no FMA in this ISA: nothing is contracted")
    if case == "var" or _xla_cpu_isa.jaxlib_minor() == (0, 10) and axis == 1 and shape[1] <= 8:
        _needs_measured_sums()  # a plain float64 sum in XLA's order: jaxlib 0.10 on AMD Zen 4
    fun = {"a*b": lambda a, b: (a * b).sum(axis), "a*a": lambda a, b: (a * a).sum(axis),
           "(a-b)**2": lambda a, b: jnp.square(a - b).sum(axis), "var": lambda a, b: a.var(axis),
           "-(a*b)": lambda a, b: (-(a * b)).sum(axis)}[case]
    with jax.enable_x64(True):
        for seed in range(3):
            r = np.random.default_rng(seed)
            _check(fun, r.standard_normal(shape), r.standard_normal(shape), executors=False)


def test_division_by_a_square_root_used_twice():
    """XLA rewrites ``A / sqrt(B)`` as ``A * rsqrt(B)`` only where nothing else uses the square root
    (``Sqrt(B).WithOneUse()``): a normalisation's gradient divides by it twice, as ``0.5 / s`` and ``x / s``."""
    def fun(x, v):
        s = jnp.sqrt(v + 1e-5)
        return 0.5 / s, x / s
    r = np.random.default_rng(1)
    _check(fun, r.standard_normal((16, 4)).astype(f32), np.abs(r.standard_normal(4)).astype(f32))


def test_gradient_of_a_bias_before_a_normalisation():
    """pgx's case (issue 38), on new inputs: the gradient of a bias right before a normalisation is 0 up to
    rounding, so every fused sum and division of its backward pass shows in its bits."""
    _needs_measured_sums()

    def loss(b, x, w):
        h = x @ w + b
        h = (h - h.mean(0)) / jnp.sqrt(h.var(0) + 1e-5)
        return jnp.sum(jnp.sin(h))
    for seed in range(4):
        r = np.random.default_rng(seed)
        _check(jax.grad(loss), np.zeros(4, f32), r.standard_normal((16, 5)).astype(f32),
               r.standard_normal((5, 4)).astype(f32))


@pytest.mark.parametrize("case", ["softmax_16x128", "mean_var_16x4", "div_bcast_16x4_1x4"])
def test_recorded_programs(case):
    """The recorded programs built on these divisions, on new inputs (their sums' order: AMD Zen 4's)."""
    if case != "div_bcast_16x4_1x4":
        _needs_measured_sums()
    for seed in range(4):
        r = np.random.default_rng(seed)
        if case == "softmax_16x128":
            _check(lambda x: jax.nn.softmax(x, axis=-1), (r.standard_normal((16, 128)) * 4).astype(f32))
        elif case == "mean_var_16x4":
            _check(lambda x: (x.mean(0), x.var(0)), r.standard_normal((16, 4)).astype(f32))
        else:
            _check(lambda x, y: x / y, r.standard_normal((16, 4)).astype(f32),
                   (np.abs(r.standard_normal((1, 4))) + 0.5).astype(f32))


def test_rewrites_keep_a_literal_output():
    """A jaxpr may return a literal (numpyro's NUTS loops do): the division and sum-of-squares rewrites read its
    outputs without hashing it (a TypeError took every numpyro chain down once)."""
    from spmdsim.jax.evaluation._interpreter import eval_jaxpr
    x = np.arange(1.0, 5.0, dtype=np.float32)
    closed = jax.make_jaxpr(lambda v: (v / 3.0, (v * v).sum(0), 1.0))(x)
    got = eval_jaxpr(closed.jaxpr, closed.consts, x)
    expected = jax.jit(lambda v: (v / 3.0, (v * v).sum(0), 1.0))(x)
    for g, e in zip(got, expected, strict=True):
        assert np.asarray(g).tobytes() == np.asarray(e).tobytes()
