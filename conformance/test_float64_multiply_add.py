"""float64 multiply-adds as XLA:CPU computes them (issue 38.4): with FMA in the ISA (AVX2 on), XLA:CPU contracts a
float64 multiply feeding an add into one fused multiply-add, as it does float32's, and spmdsim's contraction model
(``spmdsim/jax/evaluation/_contraction.py``) makes the same contractions with an exactly rounded float64 fused multiply-add
(``spmdsim/jax/numerics/_xla_cpu_math.fma64``). Every test compares with ``jax.jit`` on the machine running it."""
from __future__ import annotations

import jax
import numpy as np
import pytest

import spmdsim.jax as sjax
from spmdsim.jax.numerics import _xla_cpu_isa
from spmdsim.jax.numerics._xla_cpu_math import fma64

pytestmark = pytest.mark.area("lax primitives vs XLA:CPU")

EXECUTORS = ["threads", "vectorized", "reference"]
FUSED = _xla_cpu_isa.current().fma


@pytest.fixture(autouse=True)
def x64():
    jax.config.update("jax_enable_x64", True)  # the global value: the reference loop's device threads see it too
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", False)


def _bits(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x)).view(np.uint64)


def _operands(n: int, shape=(8, 4096)):
    rng = np.random.default_rng(38)
    return [rng.standard_normal(shape) for _ in range(n)]


def test_xla_contracts_a_float64_multiply_add_here():
    """The fact modelled: XLA:CPU's ``a * b + c`` in float64 is the fused multiply-add where the ISA has FMA (about
    one element in four differs from the product rounded first), the product rounded first where it has none."""
    a, b, c = _operands(3)
    xla = np.asarray(jax.jit(lambda a, b, c: a * b + c)(a, b, c))
    separate = a * b + c
    assert (_bits(fma64(a, b, c)) != _bits(separate)).sum() > 5000
    assert np.array_equal(_bits(xla), _bits(fma64(a, b, c) if FUSED else separate))


CASES = {  # measured with jax.jit (jax 0.10.2 and 0.12.0.1): float64 contracts as float32 does
    "a*b+c": lambda a, b, c: a * b + c,
    "c-a*b": lambda a, b, c: c - a * b,
    "a*b-c": lambda a, b, c: a * b - c,
    "square(a)+c": lambda a, b, c: jax.numpy.square(a) + c,
    "2.5*a+c": lambda a, b, c: 2.5 * a + c,
    "a*b+c*a": lambda a, b, c: a * b + c * a,
    "product also returned": lambda a, b, c: (a * b + c, a * b),
    "product also multiplied": lambda a, b, c: (a * b + c) * (a * b),
    "fori_loop x*b+c": lambda a, b, c: jax.lax.fori_loop(0, 3, lambda i, x: x * b + c, a),
}


@pytest.mark.parametrize("name", CASES)
def test_float64_contractions_equal_xla_in_a_jaxpr(name):
    a, b, c = _operands(3, (4, 2048))
    f = CASES[name]
    xla = jax.tree_util.tree_leaves(jax.jit(f)(a, b, c))
    closed = jax.make_jaxpr(f)(a, b, c)
    ours = sjax.eval_jaxpr(closed.jaxpr, closed.consts, a, b, c)
    for x, y in zip(xla, ours, strict=True):
        assert np.asarray(y).dtype == np.float64
        assert np.array_equal(_bits(x), _bits(y)), f"{(_bits(x) != _bits(y)).sum()} elements differ"


def _newton_reciprocal(x):
    """1/x by Newton's iteration ``y <- y (2 - x y)`` from 1/2: each step a multiply-add ``2 - x*y`` XLA fuses."""
    y = jax.numpy.full_like(x, 0.5)
    return jax.lax.fori_loop(0, 6, lambda i, y: y * (2.0 - x * y), y)


def _newton_sqrt(x):
    """sqrt(x) by Newton's iteration ``y <- y + (x / y - y) * 0.5``: the step's multiply feeds the add."""
    return jax.lax.fori_loop(0, 8, lambda i, y: y + (x / y - y) * 0.5, jax.numpy.ones_like(x))


PROGRAMS = {"a*b+c": lambda a, b, c: a * b + c, "newton reciprocal": lambda a, b, c: _newton_reciprocal(1 + a * a),
            "newton sqrt": lambda a, b, c: _newton_sqrt(1 + jax.numpy.abs(a) * 3)}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("program", PROGRAMS)
def test_float64_programs_equal_jax_pmap_bit_for_bit(program, executor):
    """8 x 4096 float64 elements, one row per device: spmdsim's pmap in every executor against ``jax.pmap`` (and
    ``jax.jit`` of one row, which gives the same bits)."""
    a, b, c = _operands(3)
    f = PROGRAMS[program]
    ours = np.asarray(sjax.pmap(f, executor=executor)(a, b, c))
    real = np.asarray(jax.pmap(f)(a, b, c))
    assert ours.dtype == np.float64
    assert np.array_equal(_bits(ours), _bits(real)), f"{(_bits(ours) != _bits(real)).sum()} elements differ"
    assert np.array_equal(_bits(real[3]), _bits(jax.jit(f)(a[3], b[3], c[3])))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_float64_multiply_add_in_a_shard_map_equals_xla(executor):
    from jax.sharding import Mesh, PartitionSpec as P

    a, b, c = _operands(3)
    mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
    body = lambda a, b, c: a * b + c  # noqa: E731
    ours = jax.jit(sjax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), executor=executor))(a, b, c)
    xla = jax.jit(body)(a, b, c)
    assert np.array_equal(_bits(ours), _bits(xla))
