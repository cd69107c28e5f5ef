"""The op records of ``test_lax_ops.py`` (in the style of JAX's ``lax_test`` op records), and the one tolerance
table.

A :class:`Record` names a primitive, a function applying it (``fn(*args, **variant)``), an argument
generator (``args(dtype, rng, variant)`` -> one argument list per shape: scalars, empty arrays, vectors,
non-contiguous matrices, special values), the dtypes to try and the parameter variants. A dtype that JAX
rejects for the primitive (a TypeError when tracing) is dropped, so each primitive is tested with the dtypes
JAX allows among those listed. Families group the primitives in the conformance report and the README.
"""
from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Callable

import jax
import jax.extend.random
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

BOOL = ("bool",)
SINT = ("int8", "int16", "int32", "int64")
UINT = ("uint8", "uint16", "uint32", "uint64")
INT = SINT + UINT
LOWF = ("float16", "bfloat16")
FLOAT = LOWF + ("float32", "float64")
COMPLEX = ("complex64", "complex128")
INEXACT = FLOAT + COMPLEX
NUM = INT + INEXACT
ALL = BOOL + NUM
WIDE = frozenset({"int64", "uint64", "float64", "complex128"})
LINALG = ("float32", "float64", "complex64", "complex128")


def dtype_of(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


# -- the tolerance table: ulps per (primitive, dtype); exact (0) where not listed ----------------------------------
# Measured on jax/jaxlib 0.10.2, XLA:CPU, x86-64 with AVX-512 (see the conformance report for the worst
# distances). Exact: data movement, integer arithmetic, IEEE +,-,*,/,sqrt, comparisons, conversions, the
# XLA:CPU float32 exp/log/log1p/tanh/logistic/erf/expm1 (ported operation for operation), LAPACK
# decompositions (the same LAPACK routines), threefry/Philox bits.

def _all(names, value):
    return {n: value for n in names}


TOLERANCE: dict[tuple[str, str], float] = {}


def _tol(primitive: str, dtypes, ulp) -> None:
    for d in (dtypes if isinstance(dtypes, (tuple, list)) else (dtypes,)):
        TOLERANCE[(primitive, d)] = ulp


F32, F64, C64, C128, F16, BF16 = "float32", "float64", "complex64", "complex128", "float16", "bfloat16"
# XLA:CPU's own float64 and complex transcendental approximations, and its float32 ones that spmdsim computes
# with NumPy (the inverse and hyperbolic functions, exp2; atan on small arrays). Exact: what XLA:CPU leaves to
# the C library, which spmdsim calls too (spmdsim/jax/numerics/_libm.py): float32 and float64 tan, atan2, cbrt,
# pow, float64 erf and log.
for _p, _table in {
    "acos": {F16: 1, F32: 1, F64: 1, C64: 3, C128: 2}, "acosh": {BF16: 1, F16: 1, F32: 2, F64: 1, C64: 2, C128: 4},
    "asin": {BF16: 1, F16: 1, F32: 2, F64: 1, C64: 2, C128: 2}, "asinh": {BF16: 1, F16: 1, F32: 1, F64: 2, C64: 4,
                                                                          C128: 4},
    "atan": {F32: 2, F64: 2, C64: 2, C128: 2}, "atanh": {BF16: 1, F16: 1, F32: 1, F64: 128, C64: 4, C128: 4},
    "cos": {F32: 1, C64: 2, C128: 2},
    "cosh": {F32: 2, F64: 1, C64: 16, C128: 5}, "sin": {F32: 1, C64: 2, C128: 2}, "sinh": {F32: 2, F64: 2, C64: 2,
                                                                                        C128: 3},
    "tan": {C64: 4, C128: 4}, "exp2": {C64: 2, C128: 2},
    "exp": {F32: 1, C64: 1, C128: 2}, "log": {F32: 1, C64: 1, C128: 1}, "log1p": {C64: 4, C128: 2},
    "expm1": {F16: 1, C64: 32, C128: 32}, "tanh": {C64: 3, C128: 2},
    "logistic": {C64: 8, C128: 4}, "rsqrt": {C64: 3, C128: 4},  # (float32: measured; float64: the CPU's estimate, executed; exact)
    "sqrt": {C64: 1, C128: 1}, "pow": {C64: 16, C128: 16}, "sign": {C64: 2, C128: 2},
    "square": {C64: 2, C128: 1}, "div": {C64: 2, C128: 2}, "integer_pow": {C64: 4, C128: 4},
    # jaxlib 0.12's float64 multiply-add in |z|^2 of a complex128's abs (keyed by its float64 result)
    "abs": {F64: 1},
    # special functions: SciPy in float64 (XLA:CPU evaluates its own float32 and float64 approximations)
    "digamma": {F32: 10, F64: 22}, "polygamma": {F32: 10, F64: 12}, "zeta": {F32: 1, F64: 2},
    "igamma": {F32: 22, F64: 16}, "igammac": {F32: 24, F64: 24}, "igamma_grad_a": {F32: 26},
    "regularized_incomplete_beta": {F32: 10, F64: 13}, "bessel_i0e": {F32: 2, F64: 4},
    "bessel_i1e": {BF16: 1, F16: 1, F32: 2, F64: 2},
    # sums in another order than XLA:CPU's (its reductions are vectorized, its windows dilated, ...); float16 and
    # bfloat16 reductions follow XLA's (bit for bit over one axis), float16 over several axes within 2 ulps
    "reduce_sum": {BF16: 1, F16: 2, F32: 1, F64: 1, C64: 1, C128: 1}, "reduce_prod": {BF16: 2, F16: 2, F32: 1,
                                                                                        F64: 1},
    "cumsum": {BF16: 1, F16: 1, F32: 1, F64: 1, C64: 1, C128: 1}, "cumprod": {BF16: 1, F16: 1, F32: 1, F64: 1},
    "cumlogsumexp": {BF16: 1, F16: 2, F32: 2, F64: 2}, "reduce_window_sum": {BF16: 1, F16: 2, F32: 1, F64: 1,
                                                                             C64: 8, C128: 4},
    "reduce_window": {F32: 2, F64: 1}, "dot_general": {F32: 2, F64: 2}, "conv_general_dilated": {F32: 4, F64: 4},
    "ragged_dot_general": {F32: 2, F64: 2},  # dot_general's: one dot of the dense groups, as JAX lowers it
    "random_gamma": {BF16: 9, F32: 4, F64: 256}, "scatter-mul": {C64: 13},
}.items():
    for _d, _u in _table.items():
        _tol(_p, _d, float(_u))
# results with cancellation (complex products, transforms, rank-one updates, numerical derivatives): relative to
# the largest magnitude of the result
for _p, _dtypes, _eps in (("dot_general", (C64, C128), 1e-6), ("ragged_dot_general", (C64, C128), 1e-6),
                          ("conv_general_dilated", (C64,), 1e-6),
                          ("reduce_prod", (C64, C128), 1e-6), ("fft", (C64,), 1e-6),
                          ("cholesky_update", (F32,), 1e-6), ("cholesky_update", (F64,), 1e-14),
                          ("igamma_grad_a", (F64,), 1e-9),
                          # lgamma crosses zero at 1 and 2, where XLA's own approximation loses relative accuracy
                          ("lgamma", (F32,), 4e-6), ("lgamma", (F64,), 1e-14), ("lgamma", (F16, BF16), 1e-2)):
    _tol(_p, _dtypes, ("norm", _eps))


# JAX 0.11/0.12's primitives, where the installed JAX has them (complex results and polynomial's complex and
# float64 steps: multiply-adds whose contraction in those dtypes is not modelled bit for bit)
for _p, _table in {"log2": {F64: 2, C64: 2, C128: 2}, "one_minus_square": {C64: 2, C128: 8},
                   "polynomial": {F64: 8, C64: 8, C128: 8}}.items():
    if hasattr(lax, f"{_p}_p"):
        for _d, _u in _table.items():
            _tol(_p, _d, float(_u))

# Per jaxlib: XLA:CPU 0.11 and 0.12 compute the fused float32 logistic differently where exp(-x) is large, and 0.12
# float32 expm1 by a new approximation and its FFTs in another order than 0.10's, which spmdsim ports (not yet
# ported: README's table of differences between releases). Measured on an AMD EPYC (Zen 4) with jaxlib 0.11.2
# and 0.12.0.1.
# jaxlib 0.10: the inverse and hyperbolic functions as CHLO decomposes them, each step XLA:CPU's (float32 and
# float64 bit for bit); later jaxlibs compute some of the steps otherwise (atan2, expm1, log1p)
if jax.__version_info__ < (0, 11):
    for _p in ("acos", "acosh", "asin", "asinh", "atanh", "cosh", "sinh"):
        for _d in (F32, F64):
            TOLERANCE.pop((_p, _d), None)
if jax.__version_info__ >= (0, 11):  # (float64, float32 erfc: ported from jaxlib 0.10's code)
    _tol("erfc", F32, 2.0)
    _tol("logistic", F32, 2.0)
    _tol("tanh", F64, 2.0)
if jax.__version_info__ >= (0, 12):
    _tol("expm1", F32, 2.0)
    _tol("expm1", F64, 1.0)
    _tol("logistic", F64, 1.0)
    _tol("fft", (F32,), ("norm", 1e-6))
    _tol("fft", (F64, C128), ("norm", 1e-14))


# Per ISA (spmdsim/jax/numerics/_xla_cpu_isa.py), where XLA:CPU's result changes with it and spmdsim's model does not
# follow: without AVX-512 XLA reduces over two axes in another vectorised order (measured under
# --xla_cpu_max_isa=AVX2 and AVX on an AVX-512 Xeon: 2 ulps; 1 with AVX-512).
TOLERANCE_WITHOUT_AVX512 = {("reduce_sum", C128): 2.0, ("reduce_prod", F32): 2.0, ("reduce_prod", F64): 2.0}


# Per CPU model: the float32 products' order of additions is modelled for small shapes on AMD Zen 4 only
# (spmdsim/jax/numerics/_xla_cpu_dot.py; on Zen 3 not for these cases' shapes, e.g. 4 x 6 @ 6 x 5). Elsewhere BLAS's
# order differs from YNNPACK's, and a reordered sum that cancels is many ulps from XLA's (up to 140 measured on
# Zen 3). The portable bound is the reordering's: |a - e| <= 2 (k - 1) u sum |x y| with u = 2**-24, k <= 20 terms
# in these cases and max sum |x y| <= 7 max |e| in their seeded operands: 1.6e-5 max |e|.
UNMODELLED_ORDER = {("dot_general", F32): ("norm", 2e-5)}  # (ragged_dot_general's cases passed within 2 ulps)


def _float64_rsqrt_estimate_missing() -> bool:
    """Whether XLA:CPU refines vrsqrt14pd here but spmdsim cannot run it (then 1 / sqrt(x): within an ulp)."""
    from spmdsim.jax.numerics import _cpu_estimate, _xla_cpu_isa
    return _xla_cpu_isa.current().avx512 and _cpu_estimate.rsqrt14(np.ones(1)) is None


# Against an accelerator (``spmdsim conformance --platform gpu``) the expected values are XLA:GPU's (or TPU's),
# whose arithmetic spmdsim does not model (it computes XLA:CPU's: XLA:GPU's float32 division, square root and
# transcendental functions differ from it by 1-4 ulps, its linear algebra is cuSOLVER's): floats compare by size,
# max |a - e| <= eps * max |e|, eps a few dozen of the dtype's ulps. What differs beyond that on an accelerator is
# in ACCELERATOR_DIFFERENCES (test_lax_ops.py).
ACCELERATOR_NORM = {F16: 4e-3, BF16: 3e-2, F32: 1e-5, C64: 1e-5, F64: 1e-12, C128: 1e-12}


def on_accelerator() -> bool:
    """Whether jax's default backend (where ``jax.jit`` runs the expected values) is not XLA:CPU."""
    import jax
    return jax.default_backend() != "cpu"


def tolerance(primitive: str, dtype: str):
    """Allowed distance from XLA:CPU on this machine's ISA: ulps (a float), or ("norm", eps): max |a - e| <=
    eps * max |e| for results whose small entries are rounding residue (the lower triangle of a Cholesky
    update). Against an accelerator: ``ACCELERATOR_NORM``'s bound for the dtype."""
    from spmdsim.jax.numerics import _xla_cpu_isa
    if dtype in ACCELERATOR_NORM and on_accelerator():
        return ("norm", ACCELERATOR_NORM[dtype])
    if not _xla_cpu_isa.current().avx512 and (primitive, dtype) in TOLERANCE_WITHOUT_AVX512:
        return TOLERANCE_WITHOUT_AVX512[(primitive, dtype)]
    if (primitive, dtype) in UNMODELLED_ORDER and _xla_cpu_isa.cpu_model() != "amd-zen4":
        return UNMODELLED_ORDER[(primitive, dtype)]
    if (primitive, dtype) == ("rsqrt", F64) and _float64_rsqrt_estimate_missing():
        return 1.0
    return TOLERANCE.get((primitive, dtype), 0.0)


# -- argument generators --------------------------------------------------------------------------------------

def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def values(rng, shape, dtype, kind: str = "normal") -> np.ndarray:
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        kind = {"unit": "small", "ge1": "pos", "prob": "index", "wide": "full", "integral": "normal",
                "positive-sum": "nonneg"}.get(kind, kind)
        lo, hi = {"normal": (-9, 10), "pos": (1, 9), "nonneg": (0, 9), "full": (info.min, info.max),
                  "shift": (-2, 8 * dtype.itemsize + 2), "small": (-3, 4), "index": (0, 3)}[kind]
        lo, hi = max(lo, info.min), min(hi, info.max)
        return rng.integers(lo, hi, size=shape, endpoint=True, dtype=dtype)
    if dtype.kind == "c":
        real = np.dtype(dtype).type(0).real.dtype
        return (values(rng, shape, real, kind) + 1j * values(rng, shape, real, kind)).astype(dtype)
    kind = {"full": "normal", "shift": "normal", "index": "pos", "nonneg": "pos"}.get(kind, kind)
    if kind == "normal":
        x = rng.standard_normal(shape) * 2
    elif kind == "pos":
        x = rng.uniform(0.1, 5, shape)
    elif kind == "unit":
        x = rng.uniform(-0.99, 0.99, shape)
    elif kind == "ge1":
        x = rng.uniform(1.05, 5, shape)
    elif kind == "prob":
        x = rng.uniform(0.02, 0.98, shape)
    elif kind == "small":
        x = rng.uniform(-0.4, 0.4, shape)
    elif kind == "wide":
        x = rng.uniform(-60, 60, shape)
    elif kind == "integral":
        x = rng.integers(-8, 9, shape).astype(np.float64)
    elif kind == "positive-sum":
        x = rng.uniform(0.5, 1.0, shape)
    else:
        raise ValueError(kind)
    return np.asarray(x).astype(dtype)


def specials(dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return (specials(np.float64)[:, None] + 1j * np.array([0.0, 1.0])[None, :]).reshape(-1).astype(dtype)
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -2.5, 3.0]).astype(dtype)


def noncontiguous(x: np.ndarray) -> np.ndarray:
    """The same values as a transposed (non-contiguous) view."""
    return np.ascontiguousarray(x.T).T if x.ndim >= 2 else x


SHAPES = ((), (0,), (7,), (3, 5))


def elementwise(nargs: int = 1, kinds=("normal",), with_specials: bool = True, shapes=SHAPES):
    """Arguments for an n-ary elementwise primitive: every operand of the same shape; the matrix case
    non-contiguous; float operands also get the special values (0, -0, +-inf, NaN, ...)."""
    kinds = tuple(kinds) + (kinds[-1],) * (nargs - len(kinds))

    def make(dtype, rng, variant):
        cases = []
        for shape in shapes:
            cases.append([noncontiguous(values(rng, shape, dtype, k)) for k in kinds[:nargs]])
        dt = np.dtype(dtype)
        # special values for real floats only: complex infinities and NaNs follow C99 Annex G in NumPy and
        # XLA's own formulas on XLA:CPU (a documented difference, not measured here)
        if with_specials and (dt.kind == "f" or dt in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))):
            s = specials(dt)
            grid = np.meshgrid(*([s] * nargs), indexing="ij")
            cases.append([g.reshape(-1).copy() for g in grid])
        return cases
    return make


def fixed(*arrays_per_case):
    """Arguments that do not depend on the dtype: a list of argument lists."""
    def make(dtype, rng, variant):
        return [list(a) for a in arrays_per_case]
    return make


# -- records ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    primitive: str
    dtype: str
    label: str
    fn: Callable
    device_args: list

    def describe(self) -> str:
        shapes = ", ".join(f"{np.asarray(a).dtype}{list(np.shape(a))}" for a in self.device_args[0])
        return f"{self.primitive}[{self.dtype}] {self.label} ({shapes})"


@dataclasses.dataclass
class Record:
    primitive: str
    family: str
    fn: Callable
    args: Callable
    dtypes: tuple
    variants: tuple = ({},)
    label: str = ""
    wide: bool | None = None  # run every dtype with x64 on (True) or off (False); None: 64-bit dtypes with it on

    def cases(self, wide: bool, devices: int) -> list[Case]:
        if self.wide is not None and self.wide != wide:
            return []
        filtering = jax.config.jax_traceback_filtering
        jax.config.update("jax_traceback_filtering", "off")  # JAX rejects many variants: its filtering costs 8%
        try:
            return self._cases(wide, devices)
        finally:
            jax.config.update("jax_traceback_filtering", filtering)

    def _cases(self, wide: bool, devices: int) -> list[Case]:
        out = []
        for name in self.dtypes:
            if self.wide is None and (name in WIDE) != wide:
                continue
            dtype = dtype_of(name)
            for variant in self.variants:
                fn = functools.partial(self.fn, **variant) if variant else self.fn
                per_device = [self.args(dtype, np.random.default_rng(_seed(self.primitive, self.label, name,
                                                                           repr(variant), d)), variant)
                              for d in range(devices)]
                for k in range(len(per_device[0])):
                    args = [per_device[d][k] for d in range(devices)]
                    try:
                        jax.eval_shape(fn, *args[0])
                    except (TypeError, ValueError, NotImplementedError):
                        continue  # JAX rejects this dtype, shape or variant: not a case
                    label = ", ".join(f"{k}={v}" for k, v in variant.items())
                    out.append(Case(self.primitive, name, label, fn, args))
        return out


RECORDS: list[Record] = []


def record(primitive, family, fn, args, dtypes, variants=({},), label="", wide=None):
    RECORDS.append(Record(primitive, family, fn, args, tuple(dtypes), tuple(variants), label, wide))


# elementwise arithmetic -------------------------------------------------------------------------------------------
ARITH = "elementwise arithmetic"
record("neg", ARITH, lax.neg, elementwise(1), NUM)
record("sign", ARITH, lax.sign, elementwise(1), NUM)
record("abs", ARITH, lax.abs, elementwise(1, ("full",)), NUM)
record("add", ARITH, lax.add, elementwise(2, ("full",)), NUM)
record("sub", ARITH, lax.sub, elementwise(2, ("full",)), NUM)
record("mul", ARITH, lax.mul, elementwise(2, ("full",)), NUM)
# out_dtype: both operands converted to it (canonicalised: float64 is float32 while x64 is off), then multiplied
record("mul", ARITH, lambda x, y, out: lax.mul(x, y, out_dtype=out), elementwise(2, ("full",)),
       ("int8", "uint16", "bfloat16", "float16", "float32", "float64"), label="out-dtype",
       variants=[{"out": np.float64}, {"out": np.int32}, {"out": jnp.bfloat16}, {"out": np.float32}])
record("div", ARITH, lax.div, elementwise(2, ("full", "normal")), NUM)
record("rem", ARITH, lax.rem, elementwise(2, ("full", "normal")), INT + FLOAT)
record("max", ARITH, lax.max, elementwise(2, ("full",)), ALL)
record("min", ARITH, lax.min, elementwise(2, ("full",)), ALL)
record("pow", ARITH, lax.pow, elementwise(2, ("pos", "normal")), INEXACT)
record("pow", ARITH, lambda x, y: lax.pow(x, y), lambda d, r, v: [[values(r, (6,), d, "pos"),
                                                                     np.arange(-3, 3, dtype=np.int32)]],
       INEXACT, label="int-exponent")
record("integer_pow", ARITH, lambda x, y: lax.integer_pow(x, y), elementwise(1, ("small",)), NUM,
       variants=[{"y": y} for y in (0, 1, 2, 3, 5, -1, -2)])
record("square", ARITH, lax.square, elementwise(1), NUM)
record("sqrt", ARITH, lax.sqrt, elementwise(1, ("pos",)), INEXACT)
record("rsqrt", ARITH, lax.rsqrt, elementwise(1, ("pos",)), INEXACT)
record("cbrt", ARITH, lax.cbrt, elementwise(1), FLOAT)
record("floor", ARITH, lax.floor, elementwise(1), FLOAT)
record("ceil", ARITH, lax.ceil, elementwise(1), FLOAT)
record("round", ARITH, lambda x, m: lax.round(x, m), elementwise(1), FLOAT,
       variants=[{"m": lax.RoundingMethod.AWAY_FROM_ZERO}, {"m": lax.RoundingMethod.TO_NEAREST_EVEN}])
record("round", ARITH, lambda x, m: lax.round(x, m),
       fixed([np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997], np.float32)]), ("float32",),
       variants=[{"m": lax.RoundingMethod.AWAY_FROM_ZERO}, {"m": lax.RoundingMethod.TO_NEAREST_EVEN}], label="halves")
record("is_finite", ARITH, lax.is_finite, elementwise(1), FLOAT)
record("nextafter", ARITH, lax.nextafter, elementwise(2), FLOAT)
record("atan2", ARITH, lax.atan2, elementwise(2), FLOAT)
record("complex", ARITH, lax.complex, elementwise(2), ("float32", "float64"))
record("real", ARITH, lax.real, elementwise(1), COMPLEX)
record("imag", ARITH, lax.imag, elementwise(1), COMPLEX)
record("conj", ARITH, lax.conj, elementwise(1), INEXACT)
record("clamp", ARITH, lambda lo, x, hi: lax.clamp(lo, x, hi),
       lambda d, r, v: [[values(r, (), d, "small"), values(r, (7,), d), values(r, (), d, "pos")],
                        [values(r, (5,), d, "small"), values(r, (5,), d), values(r, (5,), d, "pos")]],
       INT + FLOAT)
record("select_n", ARITH, lambda p, *xs: lax.select_n(p, *xs),
       lambda d, r, v: [[values(r, (7,), np.bool_), values(r, (7,), d), values(r, (7,), d)],
                        [np.asarray(True), values(r, (4,), d), values(r, (4,), d)],
                        [values(r, (6,), np.int32, "index"), values(r, (6,), d), values(r, (6,), d),
                         values(r, (6,), d), values(r, (6,), d)]], ALL)
record("add_any", ARITH, lambda x, y: jax._src.ad_util.add_jaxvals_p.bind(x, y), elementwise(2), NUM)

# comparisons and bitwise --------------------------------------------------------------------------------------
BITS = "comparisons and bitwise"
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    record(_name, BITS, getattr(lax, _name), elementwise(2, ("small",)), ALL)
for _name in ("eq_to", "lt_to", "le_to"):
    record(_name, BITS, functools.partial(lambda p, x, y: p.bind(x, y), getattr(lax, _name + "_p")),
           elementwise(2, ("small",)), INT + FLOAT)
for _name in ("and", "or", "xor"):
    record(_name, BITS, getattr(lax, f"bitwise_{_name}"), elementwise(2, ("full",)), BOOL + INT)
record("not", BITS, lax.bitwise_not, elementwise(1, ("full",)), BOOL + INT)
record("population_count", BITS, lax.population_count, elementwise(1, ("full",)), INT)
record("clz", BITS, lax.clz, elementwise(1, ("full",)), INT)
record("shift_left", BITS, lax.shift_left, elementwise(2, ("full", "shift")), INT)
record("shift_right_logical", BITS, lax.shift_right_logical, elementwise(2, ("full", "shift")), INT)
record("shift_right_arithmetic", BITS, lax.shift_right_arithmetic, elementwise(2, ("full", "shift")), INT)
record("mulhi", BITS, lax.mulhi, elementwise(2, ("full",)), INT)

# transcendental ----------------------------------------------------------------------------------------------
TRANS = "transcendental"
for _name, _kind in (("exp", "normal"), ("exp2", "normal"), ("log", "pos"), ("log1p", "normal"),
                     ("expm1", "normal"), ("tanh", "normal"), ("logistic", "normal"), ("sin", "normal"),
                     ("cos", "normal"), ("tan", "small"), ("asin", "unit"), ("acos", "unit"), ("atan", "normal"),
                     ("sinh", "normal"), ("cosh", "normal"), ("asinh", "normal"), ("acosh", "ge1"),
                     ("atanh", "unit")):
    record(_name, TRANS, getattr(lax, _name), elementwise(1, (_kind,)), INEXACT)
record("exp", TRANS, lax.exp, elementwise(1, ("wide",), with_specials=False, shapes=((4096,),)),
       ("float32",), label="range")
# primitives of later JAX releases, recorded where the installed JAX has them: log2 and one_minus_square (0.11),
# polynomial (0.12)
if hasattr(lax, "log2_p"):
    record("log2", TRANS, lax.log2, elementwise(1, ("pos",)), INEXACT)
if hasattr(lax, "one_minus_square_p"):
    record("one_minus_square", ARITH, lax.one_minus_square, elementwise(1, ("unit",)), NUM)
if hasattr(lax, "polynomial_p"):
    record("polynomial", ARITH, lambda x: lax.polynomial(x, [1.0, -0.5, 0.25, 2.0]), elementwise(1, ("unit",)),
           INEXACT)
    record("polynomial", ARITH, lambda x, c: lax.polynomial(x, [c, 3.0, c, -1.5] + [0.125] * 9),
           elementwise(2, ("unit", "normal")), FLOAT, label="array-coefficients-scan")
record("log", TRANS, lax.log, lambda d, r, v: [[(10.0 ** r.uniform(-37, 38, 4096)).astype(d)]], ("float32",),
       label="range")
record("tanh", TRANS, lax.tanh, elementwise(1, ("wide",), with_specials=False, shapes=((4096,),)),
       ("float32",), label="range")
record("logistic", TRANS, lax.logistic, elementwise(1, ("wide",), with_specials=False, shapes=((4096,),)),
       ("float32",), label="range")

# special functions ---------------------------------------------------------------------------------------------
SPECIAL = "special functions"
record("erf", SPECIAL, lax.erf, elementwise(1), FLOAT)
record("erf", SPECIAL, lax.erf, elementwise(1, ("normal",), with_specials=False, shapes=((4096,),)),
       ("float32",), label="range")
record("erfc", SPECIAL, lax.erfc, elementwise(1), FLOAT)
record("erf_inv", SPECIAL, lax.erf_inv, elementwise(1, ("unit",)), FLOAT)
record("erf_inv", SPECIAL, lax.erf_inv, elementwise(1, ("unit",), with_specials=False, shapes=((4096,),)),
       ("float32",), label="range")
record("lgamma", SPECIAL, lax.lgamma, elementwise(1, ("pos",)), FLOAT)
record("digamma", SPECIAL, lax.digamma, elementwise(1, ("pos",)), FLOAT)
record("polygamma", SPECIAL, lax.polygamma, lambda d, r, v: [[np.array([0, 1, 2, 3, 1, 2], d),
                                                             values(r, (6,), d, "pos")]], FLOAT)
record("zeta", SPECIAL, lax.zeta, lambda d, r, v: [[values(r, (6,), d, "ge1") + np.asarray(1, d),
                                                   values(r, (6,), d, "pos")]], FLOAT)
record("igamma", SPECIAL, lax.igamma, elementwise(2, ("pos",), with_specials=False), FLOAT)
record("igammac", SPECIAL, lax.igammac, elementwise(2, ("pos",), with_specials=False), FLOAT)
record("igamma_grad_a", SPECIAL, lax.igamma_grad_a, elementwise(2, ("pos",), with_specials=False), FLOAT)
_SPECIAL, _ORDINARY = (0.0, -0.0, np.inf, -1.0, np.nan), (0.5, 1.0, 2.0, 7.5)


def _boundary_grid(*axes):
    """XLA's boundary cases (a = 0, x = 0, x = inf, ...): every combination of ``(special, ordinary)`` values
    per operand with at least one special value (only ordinary values: XLA's own approximation, recorded by the
    other cases within their tolerance)."""
    def make(dtype, rng, variant):
        grid = np.meshgrid(*(np.array(special + ordinary) for special, ordinary in axes), indexing="ij")
        special = np.zeros(grid[0].shape, bool)
        for g, (values_, _) in zip(grid, axes):
            special |= np.isin(g, values_) | (np.isnan(g) & any(np.isnan(v) for v in values_))
        return [[g[special].astype(dtype) for g in grid]]
    return make


for _name, _fn in (("igamma", lax.igamma), ("igammac", lax.igammac), ("igamma_grad_a", lax.igamma_grad_a)):
    record(_name, SPECIAL, _fn, _boundary_grid((_SPECIAL, _ORDINARY), (_SPECIAL, _ORDINARY)), FLOAT,
           label="boundaries")
record("regularized_incomplete_beta", SPECIAL, lax.betainc,
       lambda d, r, v: [[values(r, (7,), d, "pos"), values(r, (7,), d, "pos"), values(r, (7,), d, "prob")]], FLOAT)
record("regularized_incomplete_beta", SPECIAL, lax.betainc,
       _boundary_grid((_SPECIAL, (0.5, 2.0)), (_SPECIAL, (0.5, 2.0)), ((0.0, -0.0, 1.0, 1.5, -1.0, np.nan), (0.25,))),
       FLOAT, label="boundaries")
record("bessel_i0e", SPECIAL, lax.bessel_i0e, elementwise(1), FLOAT)
record("bessel_i1e", SPECIAL, lax.bessel_i1e, elementwise(1), FLOAT)

# conversions ----------------------------------------------------------------------------------------------------
CONVERT = "conversions"


def _convert_args(dtype, rng, variant):
    d = np.dtype(dtype)
    cases = [[values(rng, (9,), d, "full" if d.kind in "iu" else "normal")]]
    if d.kind in "fc" or d in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        wide = np.array([1e10, -1e10, 300.7, -300.7, 65504.0, 2.0 ** 31, -2.0 ** 31, 2.0 ** 63, 1.00048828125 + 1e-9,
                         1.00390625 + 1e-9, 3.4e38, 1e-5]).astype(np.float64)
        with np.errstate(over="ignore"):
            cases.append([wide.astype(d)])
        cases.append([specials(d)])
    return cases


for _target in ALL:
    record("convert_element_type", CONVERT, functools.partial(lambda t, x: lax.convert_element_type(x, dtype_of(t)),
                                                              _target),
           _convert_args, ALL, label=f"to-{_target}", wide=True if _target in WIDE else None)


def _bitcast_targets(name):
    size = dtype_of(name).itemsize
    return [t for t in ALL if t != "bool" and dtype_of(t).kind != "c" and dtype_of(t).itemsize in
            (size, size // 2, size * 2)]


for _target in [t for t in ALL if t != "bool" and dtype_of(t).kind != "c"]:
    record("bitcast_convert_type", CONVERT, functools.partial(
        lambda t, x: lax.bitcast_convert_type(x, dtype_of(t)), _target),
        lambda d, r, v: [[values(r, shape, d, "full" if np.dtype(d).kind in "iu" else "normal")]
                         for shape in ((3, 4), (), (3, 2), (3, 8), (0, 2))],  # every width ratio JAX allows
        [t for t in ALL if t != "bool" and dtype_of(t).kind != "c"], label=f"to-{_target}",
        wide=True if _target in WIDE else None)


def _sub_byte_args(dtype, rng, variant):
    """int4/uint4/float4_e2m1fn/int2/uint2 operands (from int8 values; ``dtype`` is only the record's key)."""
    source = np.dtype(getattr(ml_dtypes, variant["source"]))
    lo, hi = (-8, 7) if source.name in ("int4", "float4_e2m1fn") else (0, 15) if source.name == "uint4" else \
        (-2, 1) if source.name == "int2" else (0, 3)
    make = lambda shape: rng.integers(lo, hi, shape, endpoint=True).astype(np.int8).astype(  # noqa: E731
        np.float32 if source.kind == "V" and "float" in source.name else np.int8).astype(source)
    return [[make(shape)] for shape in ((3, 2), (3, 4), (3, 8), (3, 16), (2, 3))]


_SUB_BYTE = [n for n in ("int4", "uint4", "float4_e2m1fn", "int2", "uint2") if hasattr(ml_dtypes, n)]
record("bitcast_convert_type", CONVERT, lambda x, source, target: lax.bitcast_convert_type(x, dtype_of(target)),
       _sub_byte_args, ("int8",), label="sub-byte",
       variants=[{"source": s, "target": t} for s in _SUB_BYTE for t in
                 ("int8", "uint8", "int16", "float16", "bfloat16", "int32", "float32") + tuple(_SUB_BYTE)])
record("bitcast_convert_type", CONVERT, lambda x, target: lax.bitcast_convert_type(x, getattr(ml_dtypes, target)),
       lambda d, r, v: [[values(r, shape, d, "full" if np.dtype(d).kind in "iu" else "normal")]
                        for shape in ((3,), ())], ("int8", "uint8", "int16", "float16", "bfloat16", "int32",
                                                    "float32"), label="to-sub-byte",
       variants=[{"target": t} for t in _SUB_BYTE])
record("reduce_precision", CONVERT, lambda x, e, m: lax.reduce_precision(x, e, m), elementwise(1, ("wide",)),
       FLOAT, variants=[{"e": 5, "m": 10}, {"e": 8, "m": 7}, {"e": 4, "m": 3}, {"e": 2, "m": 1}, {"e": 11, "m": 52},
                        {"e": 8, "m": 0}])

# shapes and indexing -----------------------------------------------------------------------------------------
SHAPE = "shapes and indexing"
DATA = ("bool", "int8", "uint16", "int32", "int64", "bfloat16", "float32", "float64", "complex64")


def _one(shape, kind="normal"):
    return lambda d, r, v: [[noncontiguous(values(r, shape, d, kind))]]


record("broadcast_in_dim", SHAPE, lambda x, shape, dims: lax.broadcast_in_dim(x, shape, dims), _one((3, 1)), DATA,
       variants=[{"shape": (2, 3, 4), "dims": (1, 2)}, {"shape": (3, 5), "dims": (0, 1)}])
record("broadcast_in_dim", SHAPE, lambda x: lax.broadcast_in_dim(x, (2, 0), ()), _one(()), DATA, label="scalar")
record("reshape", SHAPE, lambda x, sizes, dims: lax.reshape(x, sizes, dims), _one((2, 3, 4)), DATA,
       variants=[{"sizes": (6, 4), "dims": None}, {"sizes": (4, 6), "dims": (2, 0, 1)}, {"sizes": (24,),
                                                                                        "dims": None}])
record("squeeze", SHAPE, lambda x: lax.squeeze(x, (0, 2)), _one((1, 3, 1, 2)), DATA)
record("transpose", SHAPE, lambda x, p: lax.transpose(x, p), _one((2, 3, 4)), DATA,
       variants=[{"p": (2, 0, 1)}, {"p": (0, 1, 2)}, {"p": (1, 0, 2)}])
record("rev", SHAPE, lambda x, d: lax.rev(x, d), _one((3, 4)), DATA, variants=[{"d": (0,)}, {"d": (0, 1)}, {"d": ()}])
record("pad", SHAPE, lambda x, c: lax.pad(x, np.asarray(0, x.dtype) if x.dtype != np.bool_ else np.asarray(True), c),
       _one((3, 4)), DATA, variants=[{"c": ((1, 2, 0), (0, 0, 1))}, {"c": ((-1, 1, 1), (2, -2, 0))},
                                     {"c": ((0, 0, 2), (-1, -1, 0))}])
record("pad", SHAPE, lambda x, pv: lax.pad(x, pv, ((1, 1, 1),)),
       lambda d, r, v: [[values(r, (0,), d), values(r, (), d)], [values(r, (4,), d), values(r, (), d)]], DATA,
       label="empty-and-value")
record("concatenate", SHAPE, lambda *xs: lax.concatenate(xs, 1),
       lambda d, r, v: [[values(r, (2, 3), d), noncontiguous(values(r, (2, 2), d)), values(r, (2, 0), d)]], DATA)
record("stack", SHAPE, lambda x, y, axis: lax.stack_p.bind(x, y, axis=axis),
       lambda d, r, v: [[values(r, (2, 3), d), values(r, (2, 3), d)]], DATA, variants=[{"axis": 0}, {"axis": 2}])
record("unstack", SHAPE, lambda x, axis: lax.unstack_p.bind(x, axis=axis), _one((2, 3)), DATA,
       variants=[{"axis": 0}, {"axis": 1}])
record("split", SHAPE, lambda x: lax.split(x, (1, 0, 3), axis=1), _one((2, 4)), DATA)
record("tile", SHAPE, lambda x: lax.tile(x, (2, 3)), _one((2, 2)), DATA)
record("slice", SHAPE, lambda x, s, lim, st: lax.slice(x, s, lim, st), _one((5, 6)), DATA,
       variants=[{"s": (1, 0), "lim": (4, 6), "st": None}, {"s": (0, 1), "lim": (5, 6), "st": (2, 3)},
                 {"s": (2, 2), "lim": (2, 5), "st": None}])
record("dynamic_slice", SHAPE, lambda x, i, j: lax.dynamic_slice(x, (i, j), (2, 3)),
       lambda d, r, v: [[values(r, (5, 6), d), np.int32(i), np.int32(j)] for i, j in ((1, 2), (-3, 1), (4, 9))],
       DATA)
record("dynamic_update_slice", SHAPE, lambda x, u, i, j: lax.dynamic_update_slice(x, u, (i, j)),
       lambda d, r, v: [[values(r, (5, 6), d), values(r, (2, 3), d), np.int32(i), np.int32(j)]
                        for i, j in ((1, 2), (-3, 1), (4, 9))], DATA)
record("iota", SHAPE, lambda dtype, shape, dim: lax.broadcasted_iota(dtype, shape, dim), fixed([]),
       ("int32",), variants=[{"dtype": np.int32, "shape": (3, 4), "dim": 1}, {"dtype": np.float32, "shape": (5,),
                                                                              "dim": 0},
                             {"dtype": jnp.bfloat16, "shape": (2, 3), "dim": 0},
                             {"dtype": np.uint8, "shape": (0, 2), "dim": 1}])


def _gather_args(dtype, rng, variant):
    x = values(rng, (5, 4, 3), dtype)
    return [[x, rng.integers(-2, 6, (6, 2)).astype(np.int32)], [x, np.zeros((0, 2), np.int32)]]


_GATHER = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0, 1), start_index_map=(0, 1))
_GATHER_BATCHED = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(1,), start_index_map=(1,),
                                             operand_batching_dims=(0,), start_indices_batching_dims=(0,))
record("gather", SHAPE, lambda x, i, mode, fill: lax.gather(x, i, _GATHER, (1, 1, 3), mode=mode, fill_value=fill),
       _gather_args, DATA, variants=[{"mode": lax.GatherScatterMode.CLIP, "fill": None},
                                     {"mode": lax.GatherScatterMode.FILL_OR_DROP, "fill": None},
                                     {"mode": lax.GatherScatterMode.FILL_OR_DROP, "fill": 1},
                                     {"mode": lax.GatherScatterMode.PROMISE_IN_BOUNDS, "fill": None}])
record("gather", SHAPE, lambda x, i: lax.gather(x, i, _GATHER_BATCHED, (1, 1, 2),
                                                mode=lax.GatherScatterMode.CLIP),
       lambda d, r, v: [[values(r, (5, 4, 3), d), r.integers(0, 4, (5, 2, 1)).astype(np.int32)]], DATA,
       label="batching-dims")
_SCATTER = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                       scatter_dims_to_operand_dims=(0,))


def _scatter_args(dtype, rng, variant):
    x = values(rng, (5, 3), dtype, "small")
    unique = np.array([[4], [0], [2]], np.int32)
    repeated = np.array([[1], [1], [3], [7], [-1], [1]], np.int32)
    return [[x, unique, values(rng, (3, 3), dtype, "small")], [x, repeated, values(rng, (6, 3), dtype, "small")]]


for _name, _fn in (("scatter", lax.scatter), ("scatter-add", lax.scatter_add), ("scatter-sub", lax.scatter_sub),
                   ("scatter-mul", lax.scatter_mul), ("scatter-min", lax.scatter_min),
                   ("scatter-max", lax.scatter_max)):
    record(_name, SHAPE, functools.partial(lambda f, x, i, u, mode: f(x, i, u, _SCATTER, mode=mode), _fn),
           _scatter_args, DATA if _name == "scatter" else ("int8", "uint16", "int32", "int64", "bfloat16", "float32",
                                                           "float64", "complex64"),
           variants=[{"mode": lax.GatherScatterMode.FILL_OR_DROP}, {"mode": lax.GatherScatterMode.CLIP}])



def _scatter_apply_args(dtype, rng, variant):
    x = values(rng, (5, 3), dtype, "small")
    return [[x, np.array([[4], [0], [2]], np.int32)], [x, np.array([[1], [1], [3], [7], [-1], [1]], np.int32)],
            [values(rng, (0, 3), dtype), np.zeros((2, 1), np.int32)]]


# update_jaxpr: x.at[i].apply(f) / lax.scatter_apply, the update computation applied once per index, in order
record("scatter", SHAPE, lambda x, i, f, mode: lax.scatter_apply(x, i, f, _SCATTER, update_shape=(len(i), 3),
                                                                 mode=mode),
       _scatter_apply_args, ("int8", "uint16", "int32", "int64", "bfloat16", "float32", "float64", "complex64"),
       label="update-jaxpr", variants=[{"f": f, "mode": m} for f in (lambda v: (v + 1) * 3, lambda v: -v)
                                       for m in (lax.GatherScatterMode.FILL_OR_DROP, lax.GatherScatterMode.CLIP)])

# reductions and cumulative ops ------------------------------------------------------------------------------------
REDUCE = "reductions and cumulative"


def _reduce_args(kind):
    def make(dtype, rng, variant):
        return [[noncontiguous(values(rng, (4, 6), dtype, kind))], [values(rng, (3, 0), dtype, kind)],
                [values(rng, (2, 3, 40), dtype, kind)]]
    return make


_AXES = [{"axes": (1,)}, {"axes": (0,)}, {"axes": (0, 1)}]
record("reduce_sum", REDUCE, lambda x, axes: lax.reduce_sum_p.bind(x, axes=axes, out_sharding=None),
       _reduce_args("positive-sum"), NUM, variants=_AXES)
record("reduce_prod", REDUCE, lambda x, axes: lax.reduce_prod_p.bind(x, axes=axes, out_sharding=None),
       _reduce_args("small"), INT + FLOAT + COMPLEX, variants=_AXES)
record("reduce_max", REDUCE, lambda x, axes: lax.reduce_max_p.bind(x, axes=axes, out_sharding=None),
       _reduce_args("normal"), BOOL + INT + FLOAT, variants=_AXES)
record("reduce_min", REDUCE, lambda x, axes: lax.reduce_min_p.bind(x, axes=axes, out_sharding=None),
       _reduce_args("normal"), BOOL + INT + FLOAT, variants=_AXES)
for _name in ("and", "or", "xor"):
    record(f"reduce_{_name}", REDUCE, functools.partial(lambda p, x, axes: p.bind(x, axes=axes),
                                                        getattr(lax, f"reduce_{_name}_p")),
           _reduce_args("full"), BOOL + INT, variants=_AXES)
record("argmax", REDUCE, lambda x, axis: lax.argmax(x, axis, np.int32), _reduce_args("small"), BOOL + INT + FLOAT,
       variants=[{"axis": 0}, {"axis": 1}])
record("argmin", REDUCE, lambda x, axis: lax.argmin(x, axis, np.int32), _reduce_args("small"), BOOL + INT + FLOAT,
       variants=[{"axis": 0}, {"axis": 1}])
record("argmax", REDUCE, lambda x: lax.argmax(x, 0, np.int32), fixed([specials(np.float32)]), ("float32",),
       label="specials")
record("reduce", REDUCE, lambda x, y: lax.reduce((x, y), (np.asarray(0, x.dtype), np.asarray(1, y.dtype)),
                                                 lambda a, b: (a[0] + b[0], a[1] * b[1]), (1,)),
       lambda d, r, v: [[values(r, (3, 5), d, "small"), values(r, (3, 5), d, "small")]], ("int32", "float32",
                                                                                          "float64"))
for _name, _fn, _dtypes in (("cumsum", lax.cumsum, NUM), ("cumprod", lax.cumprod, INT + FLOAT),
                            ("cummax", lax.cummax, INT + FLOAT), ("cummin", lax.cummin, INT + FLOAT),
                            ("cumlogsumexp", lax.cumlogsumexp, FLOAT)):
    record(_name, REDUCE, functools.partial(lambda f, x, axis, reverse: f(x, axis, reverse), _fn),
           _reduce_args("positive-sum" if _name in ("cumsum", "cumprod") else "small"), _dtypes,
           variants=[{"axis": 1, "reverse": False}, {"axis": 0, "reverse": True}])

# dot_general and convolution ------------------------------------------------------------------------------------------
DOT = "dot_general and convolution"


def _dot_args(dtype, rng, variant):
    k = "small" if np.dtype(dtype).kind in "iu" else "positive-sum"
    return [[values(rng, variant["ls"], dtype, k), noncontiguous(values(rng, variant["rs"], dtype, k))]]


record("dot_general", DOT, lambda x, y, ls, rs, dn, pref: lax.dot_general(x, y, dn, preferred_element_type=pref),
       _dot_args, NUM, variants=[
           {"ls": (4, 6), "rs": (6, 5), "dn": (((1,), (0,)), ((), ())), "pref": None},
           {"ls": (6,), "rs": (6, 5), "dn": (((0,), (0,)), ((), ())), "pref": None},
           {"ls": (3, 4, 6), "rs": (6, 5), "dn": (((2,), (0,)), ((), ())), "pref": None},
           {"ls": (2, 4, 6), "rs": (2, 5, 6), "dn": (((2,), (2,)), ((0,), (0,))), "pref": None},
           {"ls": (3, 0), "rs": (0, 2), "dn": (((1,), (0,)), ((), ())), "pref": None},
           {"ls": (3, 4, 5), "rs": (5, 4, 2), "dn": (((1, 2), (1, 0)), ((), ())), "pref": None}])
record("dot_general", DOT, lambda x, y, pref: lax.dot_general(x, y, (((1,), (0,)), ((), ())),
                                                              preferred_element_type=pref),
       lambda d, r, v: [[values(r, (4, 6), d, "small"), values(r, (6, 3), d, "small")]], ("int8", "bfloat16",
                                                                                          "float16"),
       variants=[{"pref": np.int32}, {"pref": np.float32}], label="preferred")
# operands of two types: the result type is XLA's of higher precision (JAX's dtype rule), both operands converted
# to it (or to the preferred type) before the product, as JAX lowers it for XLA:CPU
record("dot_general", DOT, lambda x, y, other, pref: lax.dot_general(
           x, y.astype(dtype_of(other)), (((1,), (0,)), ((), ())), preferred_element_type=pref),
       lambda d, r, v: [[values(r, (4, 6), d, "small"), values(r, (6, 3), d, "small")]],
       ("bool", "int8", "uint8", "int16", "bfloat16", "float16", "float32"), label="mixed",
       variants=[{"other": o, "pref": p} for o in ("bool", "int8", "uint8", "int16", "int32", "bfloat16", "float16",
                                                    "float32") for p in (None, np.float32, np.int32)])


def _ragged_dims(contract, batch, ragged, group):
    return lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(contract, batch), lhs_ragged_dimensions=ragged,
                                         rhs_group_dimensions=group)


def _ragged_args(dtype, rng, variant):
    k = "small" if np.dtype(dtype).kind in "iu" else "positive-sum"
    return [[values(rng, variant["ls"], dtype, k), noncontiguous(values(rng, variant["rs"], dtype, k)),
             np.asarray(variant["gs"], np.int32)]]


# lax.ragged_dot's modes (jax/_src/lax/lax.py's RaggedDotMode): ragged non-contracting (groups of rows, one rhs per
# group; a zero-size group, rows left over; group sizes per batch index), ragged contracting (a result per group),
# ragged batch (group sizes unused)
record("ragged_dot_general", DOT, lambda x, y, g, ls, rs, gs, dn, pref: lax.ragged_dot_general(
    x, y, g, dn, preferred_element_type=pref), _ragged_args, NUM, variants=[
        {"ls": (7, 3), "rs": (3, 3, 5), "gs": [2, 0, 4], "dn": _ragged_dims(((1,), (1,)), ((), ()), (0,), (0,)),
         "pref": None},
        {"ls": (6, 4), "rs": (2, 4, 3), "gs": [2, 3], "dn": _ragged_dims(((1,), (1,)), ((), ()), (0,), (0,)),
         "pref": None},
        {"ls": (2, 5, 3), "rs": (3, 2, 3, 4), "gs": [[1, 2, 2], [0, 5, 0]],
         "dn": _ragged_dims(((2,), (2,)), ((0,), (1,)), (1,), (0,)), "pref": None},
        {"ls": (4, 6), "rs": (6, 5), "gs": [1, 3, 2], "dn": _ragged_dims(((1,), (0,)), ((), ()), (1,), ()),
         "pref": None},
        {"ls": (3, 4, 2), "rs": (3, 2, 5), "gs": [1, 2], "dn": _ragged_dims(((2,), (1,)), ((0,), (0,)), (0,), ()),
         "pref": None}])
record("ragged_dot_general", DOT, lambda x, y, g, pref: lax.ragged_dot(x, y, g, preferred_element_type=pref),
       lambda d, r, v: [[values(r, (6, 4), d, "small"), values(r, (2, 4, 3), d, "small"),
                         np.array([4, 2], np.int32)]], ("int8", "bfloat16", "float16"),
       variants=[{"pref": np.int32}, {"pref": np.float32}], label="preferred")


def _conv_args(dtype, rng, variant):
    k = "small" if np.dtype(dtype).kind in "iu" else "positive-sum"
    return [[values(rng, variant["lhs"], dtype, k), values(rng, variant["rhs"], dtype, k)]]


_CONV = [
    dict(lhs=(2, 3, 9, 8), rhs=(4, 3, 3, 2), strides=(1, 1), padding="SAME", ld=(1, 1), rd=(1, 1), fg=1, bg=1,
         dn=("NCHW", "OIHW", "NCHW")),
    dict(lhs=(2, 9, 8, 3), rhs=(3, 3, 3, 4), strides=(2, 1), padding=((1, 0), (2, -1)), ld=(1, 1), rd=(2, 1), fg=1,
         bg=1, dn=("NHWC", "HWIO", "NHWC")),
    dict(lhs=(1, 4, 7, 7), rhs=(6, 2, 3, 3), strides=(1, 2), padding=((0, 1), (1, 1)), ld=(2, 1), rd=(1, 1), fg=2, bg=1,
         dn=("NCHW", "OIHW", "NHWC")),
    dict(lhs=(4, 3, 6, 5), rhs=(4, 3, 2, 2), strides=(1, 1), padding="VALID", ld=(1, 1), rd=(1, 1), fg=1, bg=2,
         dn=("NCHW", "OIHW", "NCHW")),
    dict(lhs=(2, 3, 10), rhs=(5, 3, 3), strides=(3,), padding=((2, 2),), ld=(1,), rd=(3,), fg=1, bg=1,
         dn=("NCH", "OIH", "NCH")),
    dict(lhs=(1, 2, 4, 4, 4), rhs=(2, 2, 2, 2, 2), strides=(1, 1, 1), padding="SAME", ld=(1, 1, 1), rd=(1, 1, 1),
         fg=1, bg=1, dn=("NCDHW", "OIDHW", "NCDHW")),
    dict(lhs=(2, 3, 5, 5), rhs=(3, 1, 3, 3), strides=(1, 1), padding="SAME", ld=(1, 1), rd=(1, 1), fg=3, bg=1,
         dn=("NCHW", "OIHW", "NCHW")),
]
record("conv_general_dilated", DOT, lambda x, w, lhs, rhs, strides, padding, ld, rd, fg, bg, dn:
       lax.conv_general_dilated(x, w, strides, padding, ld, rd, dn, fg, bg), _conv_args,
       ("int32", "float16", "bfloat16", "float32", "float64", "complex64"), variants=_CONV)
record("conv_general_dilated", DOT, lambda x, w: lax.conv_general_dilated(x, w, (1,), "SAME",
                                                                          preferred_element_type=np.int32),
       lambda d, r, v: [[values(r, (2, 3, 8), d, "small"), values(r, (4, 3, 3), d, "small")]], ("int8",),
       label="preferred")

# windows ------------------------------------------------------------------------------------------------------------
WINDOW = "windowed reductions"


def _window_args(dtype, rng, variant):
    return [[noncontiguous(values(rng, (2, 7, 6), dtype, "positive-sum" if np.dtype(dtype).kind in "fV" else
                                  "normal"))]]


_WINDOWS = [dict(w=(1, 2, 2), s=(1, 2, 2), p=((0, 0), (0, 0), (0, 0)), bd=(1, 1, 1), wd=(1, 1, 1)),
            dict(w=(1, 3, 3), s=(1, 1, 2), p=((0, 0), (1, 1), (2, 0)), bd=(1, 1, 1), wd=(1, 1, 1)),
            dict(w=(2, 2, 2), s=(1, 1, 1), p=((0, 1), (0, 0), (1, 1)), bd=(1, 2, 1), wd=(1, 1, 2)),
            dict(w=(1, 7, 1), s=(1, 1, 1), p=((0, 0), (6, 0), (0, 0)), bd=(1, 1, 1), wd=(1, 1, 1))]
for _name, _p in (("reduce_window_sum", "reduce_window_sum_p"), ("reduce_window_max", "reduce_window_max_p"),
                  ("reduce_window_min", "reduce_window_min_p")):
    record(_name, WINDOW, functools.partial(lambda prim, x, w, s, p, bd, wd: getattr(lax, prim).bind(
        x, window_dimensions=w, window_strides=s, padding=p, base_dilation=bd, window_dilation=wd), _p),
        _window_args, (INT + FLOAT) if _name != "reduce_window_sum" else (INT + FLOAT + COMPLEX), variants=_WINDOWS)
record("reduce_window", WINDOW, lambda x, w, s, p, bd, wd: lax.reduce_window(
    (x, x), (np.asarray(0, x.dtype), np.asarray(-np.inf, x.dtype)), lambda a, b: (a[0] + b[0], lax.max(a[1], b[1])),
    w, s, p, bd, wd), _window_args, ("float32", "float64"), variants=_WINDOWS[:3])


def _max_pool(x, w, s, p):
    lowest = -np.inf if np.dtype(x.dtype).kind == "f" or x.dtype == jnp.bfloat16 else np.iinfo(x.dtype).min
    return lax.reduce_window(x, np.asarray(lowest, x.dtype), lax.max, w, s, p)


def _pool_args(dtype, rng, variant):
    # distinct values: which of several equal maxima XLA:CPU picks depends on its window traversal (spmdsim picks
    # the first in row-major order)
    x = (rng.permutation(60).reshape(2, 6, 5) - 30).astype(dtype)
    return [[x, values(rng, x.shape, dtype, "normal")]]


_POOLS = [dict(w=(1, 2, 2), s=(1, 2, 2), p=((0, 0), (0, 0), (0, 1))),
          dict(w=(1, 3, 3), s=(1, 1, 1), p=((0, 0), (1, 1), (1, 1))),
          dict(w=(2, 2, 3), s=(1, 2, 1), p=((0, 0), (0, 0), (0, 0)))]
record("select_and_scatter_add", WINDOW, lambda x, g, w, s, p: jax.vjp(lambda v: _max_pool(v, w, s, p), x)[1](
    _max_pool(g, w, s, p))[0], _pool_args, FLOAT, variants=_POOLS)
record("select_and_gather_add", WINDOW, lambda x, t, w, s, p: jax.jvp(lambda v: _max_pool(v, w, s, p), (x,), (t,))[1],
       _pool_args, FLOAT, variants=_POOLS)
record("select_and_scatter", WINDOW, lambda x, g, w, s, p: jax._src.lax.windowed_reductions._select_and_scatter(
    x, lax.ge, w, s, p, _max_pool(g, w, s, p), np.asarray(0, x.dtype), lax.add), _pool_args,
    ("float32", "int32", "float64"), variants=[dict(v, p=tuple(v["p"])) for v in _POOLS])

# sorting -------------------------------------------------------------------------------------------------------------
SORT = "sort and top_k"


def _sort_args(dtype, rng, variant):
    x = values(rng, (4, 9), dtype, "small")
    cases = [[noncontiguous(x), values(rng, (4, 9), np.int32, "normal")]]
    d = np.dtype(dtype)
    if d.kind in "fc" or d in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        s = specials(d)
        cases.append([np.stack([s, s[::-1]]), np.arange(2 * len(s), dtype=np.int32).reshape(2, -1)])
    return cases


record("sort", SORT, lambda x, i, dim, keys: lax.sort((x, i), dimension=dim, num_keys=keys), _sort_args, ALL,
       variants=[{"dim": 1, "keys": 1}, {"dim": 0, "keys": 1}, {"dim": 1, "keys": 2}])
record("sort", SORT, lambda x: lax.sort(x, dimension=0, is_stable=False),
       lambda d, r, v: [[values(r, (7, 3), d, "normal")]], ("int32", "float32", "bfloat16"), label="unstable")
record("top_k", SORT, lambda x, i, k: lax.top_k(x, k), _sort_args, INT + FLOAT, variants=[{"k": 1}, {"k": 4}])
record("approx_top_k", SORT, lambda x, k, agg, is_max: (lax.approx_max_k if is_max else lax.approx_min_k)(
    x, k, aggregate_to_topk=agg), lambda d, r, v: [[noncontiguous(r.permutation(36).reshape(4, 9).astype(d))]], ("float32", "bfloat16", "float64"),
    variants=[{"k": 3, "agg": True, "is_max": True}, {"k": 3, "agg": False, "is_max": True},
              {"k": 2, "agg": True, "is_max": False}])

# linear algebra and FFT ------------------------------------------------------------------------------------------------
LINALGF = "linear algebra and FFT"


def _matrices(shape, kind="general"):
    def make(dtype, rng, variant):
        shape_ = variant.get("shape", shape)
        a = values(rng, shape_, dtype, "normal")
        n = shape_[-1]
        if kind == "spd":
            a = a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n, dtype=dtype)
        elif kind == "triangular":
            a = a + 4 * np.eye(n, dtype=dtype)
        return [[np.asarray(a, dtype)]]
    return make


record("cholesky", LINALGF, lambda a: lax.linalg.cholesky(a, symmetrize_input=False), _matrices((3, 4, 4), "spd"),
       LINALG)
record("cholesky", LINALGF, lambda a: lax.linalg.cholesky(a, symmetrize_input=False),
       fixed([-np.eye(3, dtype=np.float32)]), ("float32",), label="not-positive")
record("eigh", LINALGF, lambda a, lower: lax.linalg.eigh(a, lower=lower, symmetrize_input=False),
       _matrices((2, 5, 5), "spd"), LINALG, variants=[{"lower": True}, {"lower": False}])
record("eig", LINALGF, lambda a, left, right: lax.linalg.eig(a, compute_left_eigenvectors=left,
                                                              compute_right_eigenvectors=right),
       _matrices((2, 4, 4)), LINALG, variants=[{"left": True, "right": True}, {"left": False, "right": False},
                                               {"left": False, "right": True}])
record("schur", LINALGF, lambda a, v: lax.linalg.schur(a, compute_schur_vectors=v), _matrices((2, 4, 4)), LINALG,
       variants=[{"v": True}, {"v": False}])
record("hessenberg", LINALGF, lax.linalg.hessenberg, _matrices((2, 5, 5)), LINALG)
record("tridiagonal", LINALGF, lambda a, lower: lax.linalg.tridiagonal(a, lower=lower), _matrices((2, 5, 5), "spd"),
       LINALG, variants=[{"lower": True}, {"lower": False}])
record("lu", LINALGF, lambda a, shape: lax.linalg.lu(a), _matrices((2, 4, 4)), LINALG,
       variants=[{"shape": (2, 4, 4)}, {"shape": (5, 3)}, {"shape": (3, 5)}, {"shape": (0, 0)}, {"shape": (2, 0, 0)},
                 {"shape": (3, 0)}, {"shape": (0, 2)}])
record("lu_pivots_to_permutation", LINALGF, lambda p, size: lax.linalg.lu_pivots_to_permutation(p, size),
       fixed([np.array([[2, 2, 3], [0, 4, 2]], np.int32)]), ("int32",), variants=[{"size": 5}, {"size": 3}])
record("qr", LINALGF, lambda a, full, shape: lax.linalg.qr(a, full_matrices=full), _matrices((4, 4)), LINALG,
       variants=[{"full": f, "shape": s} for f in (True, False) for s in ((2, 5, 3), (3, 5), (4, 4))])
record("qr", LINALGF, lambda a, shape: lax.linalg.qr(a, pivoting=True, full_matrices=False), _matrices((4, 4)),
       LINALG, variants=[{"shape": (5, 3)}, {"shape": (3, 5)}], label="pivoting")
record("householder_product", LINALGF, lambda a, t: lax.linalg.householder_product(a, t),
       lambda d, r, v: [[values(r, (2, 5, 3), d), values(r, (2, 2), d)]], LINALG)
record("ormqr", LINALGF, lambda a, t, c, left, transpose: lax.linalg.ormqr(a, t, c, left=left, transpose=transpose),
       lambda d, r, v: [[values(r, (4, 4), d), values(r, (3,), d), values(r, (4, 2) if v["left"] else (2, 4), d)]],
       LINALG, variants=[{"left": True, "transpose": False}, {"left": False, "transpose": True}])
record("geqrf", LINALGF, lambda a, shape: jax._src.lax.linalg.geqrf(a), _matrices((4, 4)), LINALG,
       variants=[{"shape": s} for s in ((2, 5, 3), (3, 5), (4, 4), (0, 3), (3, 0))])


def _geqp3_args(dtype, rng, variant):
    a = _matrices(variant["shape"])(dtype, rng, variant)[0][0]
    jpvt = np.zeros(a.shape[:-2] + a.shape[-1:], np.int32)
    jpvt[..., list(variant["fixed"])] = 1  # columns moved to the front before pivoting
    return [[a, jpvt]]


# (no rows: XLA:CPU dies of a SIGFPE on it)
record("geqp3", LINALGF, lambda a, p, shape, fixed: jax._src.lax.linalg.geqp3(a, p), _geqp3_args, LINALG,
       variants=[{"shape": s, "fixed": f} for s, f in (((2, 5, 3), ()), ((3, 5), ()), ((4, 4), ()), ((3, 0), ()),
                                                       ((5, 4), (2,)), ((3, 5), (1, 4)))])
record("svd", LINALGF, lambda a, full, uv, shape: lax.linalg.svd(a, full_matrices=full, compute_uv=uv),
       _matrices((3, 3)), LINALG, variants=[{"full": f, "uv": uv, "shape": s} for f, uv in ((True, True),
                                                                                           (False, True),
                                                                                           (False, False))
                                            for s in ((2, 5, 3), (3, 5))])


def _tri_args(dtype, rng, variant):
    a = values(rng, (2, 4, 4), dtype) + 4 * np.eye(4, dtype=dtype)
    b = values(rng, (2, 4, 3) if variant["left"] else (2, 3, 4), dtype)
    return [[np.asarray(a, dtype), b]]


record("triangular_solve", LINALGF, lambda a, b, left, lower, ta, ca, ud: lax.linalg.triangular_solve(
    a, b, left_side=left, lower=lower, transpose_a=ta, conjugate_a=ca, unit_diagonal=ud), _tri_args, LINALG,
    variants=[dict(left=left, lower=lower, ta=ta, ca=ca, ud=ud) for left, lower, ta, ca, ud in
              ((True, True, False, False, False), (True, False, True, False, False), (False, True, False, True, False),
               (False, False, True, True, True), (True, True, True, True, False))])
record("tridiagonal_solve", LINALGF, lax.linalg.tridiagonal_solve,
       lambda d, r, v: [[np.concatenate([[0], values(r, (4,), d)]).astype(d), values(r, (5,), d) + np.asarray(4, d),
                         np.concatenate([values(r, (4,), d), [0]]).astype(d), values(r, (5, 2), d)]], LINALG)
record("symmetric_product", LINALGF, lambda a, c: lax.linalg.symmetric_product(a, c, alpha=2.0, beta=0.5),
       lambda d, r, v: [[values(r, (3, 4), d, "positive-sum"), values(r, (3, 3), d, "positive-sum")]],
       ("float32", "float64"))
record("cholesky_update", LINALGF, lambda r_, w: lax.linalg.cholesky_update(r_, w),
       lambda d, r, v: [[np.triu(values(r, (4, 4), d)) + 4 * np.eye(4, dtype=d), values(r, (4,), d)]],
       ("float32", "float64"))
record("fft", LINALGF, lambda x, t, n: jax.lax.fft(x, t, n), lambda d, r, v: [[values(r, (3, 8), d)]],
       ("complex64", "complex128"), variants=[{"t": "FFT", "n": (8,)}, {"t": "IFFT", "n": (8,)},
                                              {"t": "FFT", "n": (3, 8)}, {"t": "IRFFT", "n": (14,)}])
record("fft", LINALGF, lambda x, t, n: jax.lax.fft(x, t, n), lambda d, r, v: [[values(r, (3, 8), d)]],
       ("float32", "float64"), variants=[{"t": "RFFT", "n": (8,)}, {"t": "RFFT", "n": (3, 8)}], label="real")
record("custom_linear_solve", LINALGF, lambda a, b: lax.custom_linear_solve(
    lambda x: a @ x, b, lambda mv, y: jnp.linalg.solve(a, y)), lambda d, r, v: [[values(r, (3, 3), d) + 3 * np.eye(
        3, dtype=d), values(r, (3,), d)]], ("float32", "float64"))

# random ---------------------------------------------------------------------------------------------------------------
RANDOM = "random"
_KEYS = lambda d, r, v: [[r.integers(0, 2 ** 32, (2,), dtype=np.uint32)],  # noqa: E731
                         [r.integers(0, 2 ** 32, (3, 2), dtype=np.uint32)]]


def _wrapped(fn):
    return lambda k, *a, **kw: fn(jax.random.wrap_key_data(k, impl="threefry2x32"), *a, **kw)


record("random_bits", RANDOM, _wrapped(lambda k, w, shape: jax.random.bits(k, shape, w) if k.ndim == 0 else
                                       jax.vmap(lambda kk: jax.random.bits(kk, shape, w))(k)), _KEYS, ("uint32",),
       variants=[{"w": np.uint8, "shape": (5,)}, {"w": np.uint32, "shape": (2, 3)}, {"w": np.uint16, "shape": ()}])
record("random_bits", RANDOM, _wrapped(lambda k: jax.random.bits(k, (4,), np.uint64) if k.ndim == 0 else
                                       jax.vmap(lambda kk: jax.random.bits(kk, (4,), np.uint64))(k)), _KEYS,
       ("uint64",), label="64")
record("random_split", RANDOM, _wrapped(lambda k, n: jax.random.key_data(jax.random.split(k, n) if k.ndim == 0 else
                                                                          jax.vmap(lambda kk: jax.random.split(kk, n))(
                                                                              k))), _KEYS, ("uint32",),
       variants=[{"n": 2}, {"n": (2, 3)}])
record("random_fold_in", RANDOM, _wrapped(lambda k, m: jax.random.key_data(jax.random.fold_in(k, m) if k.ndim == 0
                                                                            else jax.vmap(
                                                                                lambda kk: jax.random.fold_in(kk, m))(
                                                                                k))), _KEYS, ("uint32",),
       variants=[{"m": 0}, {"m": 12345}])
record("random_seed", RANDOM, lambda s: jax.random.key_data(jax.random.key(s)),
       lambda d, r, v: [[np.asarray(7, d)], [np.asarray(-3 if np.dtype(d).kind == "i" else 2 ** (8 * np.dtype(
           d).itemsize) - 3, d)]], ("int32", "uint32", "int64", "uint64", "int8"))
record("random_wrap", RANDOM, lambda k: jax.random.key_data(jax.random.wrap_key_data(k)), _KEYS, ("uint32",))
record("random_unwrap", RANDOM, lambda k: jax.random.key_data(jax.random.wrap_key_data(k)) + np.uint32(1), _KEYS,
       ("uint32",))
record("random_clone", RANDOM, _wrapped(lambda k: jax.random.key_data(jax.random.clone(k))), _KEYS, ("uint32",))
record("threefry2x32", RANDOM, lambda a, b, c, e: jax.extend.random.threefry2x32_p.bind(a, b, c, e),
       lambda d, r, v: [[r.integers(0, 2 ** 32, (5,), dtype=np.uint32) for _ in range(4)]], ("uint32",))


def _words(count):
    """uint32 words for a hash primitive: arrays of 5, one of them a scalar (the primitives broadcast)."""
    return lambda d, r, v: [[r.integers(0, 2 ** 32, (5,) if i else (), dtype=np.uint32) for i in range(count)]]


# the hash primitives that the lowerings of the other PRNG impls bind (spmdsim evaluates those lowerings)
record("threefry4x32", RANDOM, lambda *w: jax._src.random.threefry4x32.threefry4x32_p.bind(*w), _words(8),
       ("uint32",))
record("philox4x32", RANDOM, lambda *w: jax._src.random.philox4x32.philox4x32_p.bind(*w), _words(6), ("uint32",))
record("philox2x32", RANDOM, lambda *w: jax._src.random.philox2x32.philox2x32_p.bind(*w), _words(3), ("uint32",))
record("iota_2x32_shape", RANDOM, lambda x, shape: [w + x for w in jax._src.random.prng.iota_2x32_shape(shape)],
       lambda d, r, v: [[np.uint32(7)]], ("uint32",), variants=[{"shape": (3, 4)}, {"shape": (5,)}])
record("random_gamma", RANDOM, lambda k, a, log_space: jax.random.loggamma(jax.random.wrap_key_data(k), a, dtype=a.dtype)
       if log_space else jax.random.gamma(jax.random.wrap_key_data(k), a, dtype=a.dtype),
       lambda d, r, v: [[r.integers(0, 2 ** 32, (2,), dtype=np.uint32), values(r, (64,), d, "pos")]],
       FLOAT, variants=[{"log_space": False}, {"log_space": True}])
record("rng_bit_generator", RANDOM, lambda k, shape, dt, alg: lax.rng_bit_generator(k, shape, dtype=dt, algorithm=alg),
       lambda d, r, v: [[r.integers(0, 2 ** 32, (4,), dtype=np.uint32)]], ("uint32",),
       variants=[{"shape": s, "dt": dt, "alg": alg} for s, dt in (((5,), np.uint32), ((3, 3), np.uint8), ((), np.uint16))
                 for alg in (lax.RandomAlgorithm.RNG_DEFAULT, lax.RandomAlgorithm.RNG_THREE_FRY)])
record("rng_bit_generator", RANDOM, lambda k, alg: lax.rng_bit_generator(k, (3, 2), dtype=np.uint64, algorithm=alg),
       lambda d, r, v: [[r.integers(0, 2 ** 32, (4,), dtype=np.uint32)]], ("uint64",),
       variants=[{"alg": lax.RandomAlgorithm.RNG_DEFAULT}, {"alg": lax.RandomAlgorithm.RNG_THREE_FRY}], label="64")

# the rest ------------------------------------------------------------------------------------------------------------
MISC = "other"
record("copy", MISC, lambda x: lax.copy_p.bind(x), elementwise(1), ALL)
record("optimization_barrier", MISC, lambda x, y: lax.optimization_barrier((x, y)), elementwise(2), ("int32",
                                                                                                     "float32"))
record("device_put", MISC, lambda x: jax.device_put(x) * 2, elementwise(1), ("int32", "float32"))
record("platform_index", MISC, lambda x: lax.platform_dependent(x, cpu=lambda v: v + 1, default=lambda v: v - 1),
       elementwise(1), ("float32",))
record("reduce_precision", MISC, lambda x: lax.reduce_precision(x, 8, 7), elementwise(1), ("float32",), label="bf16")
record("stop_gradient", MISC, lambda x: lax.stop_gradient(x) * 2, elementwise(1), ("int32", "float32"))
record("dce_sink", MISC, lambda x: (lax.dce_sink(x, prevent_mlir_dce=False), x * 2)[1], elementwise(1),
       ("float32",))
record("sharding_constraint", MISC, lambda x: jax.lax.with_sharding_constraint(
    x, jax.sharding.SingleDeviceSharding(jax.devices()[0])) * 2, elementwise(1), ("float32",))
record("empty2", MISC, lambda p: jax.hessian(lambda q: jnp.sum(jnp.diag(jnp.eye(3, dtype=q.dtype) * jnp.exp(q[0]))))(p),
       lambda d, r, v: [[values(r, (2,), d, "small")]], ("float32", "float64"))
