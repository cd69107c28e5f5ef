"""Issue 26: extended dtypes in physical form, primitives defined by the JAX program of their lowering, and what
XLA:CPU refuses to compile (LAPACK in float16, a platform_dependent without a cpu branch).

- ``key == keys``: ``lax.eq`` of a rank-0 extended value against an array (JAX broadcasts rank 0 in ``eq``); the
  key data's unit axes go before its trailing key axis, in both executors (the vectorized one added them after:
  a broadcast error).
- A primitive registered with ``mlir.register_lowering(p, mlir.lower_fun(fun, multiple_results))`` is what XLA
  computes for it: spmdsim evaluates ``fun``'s jaxpr (``spmdsim/jax/evaluation/_lowered.py``), per device and vectorized,
  and equals ``jax.pmap`` / ``jax.jit`` on it. A primitive whose lowering is written by hand still raises
  NotImplementedError naming it.

(JAX's own ``lax_test.py::CustomElementTypesTest``, a user-defined extended dtype ``foo`` whose primitives are
made this way, passes in ``python -m conformance.jax_suite --ops``: conformance/jax_suite/REPORT_OPS.md.)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import core
from jax._src.interpreters import mlir

import spmdsim.jax as sjax
from conformance.test_prng_impls_and_new_rules import N, _against_jit, _against_pmap

pytestmark = pytest.mark.area("PRNG impls, key shapes, new rules")


def _primitive(name: str, fun, abstract_eval, multiple_results: bool = False):
    p = core.Primitive(name)
    p.multiple_results = multiple_results
    p.def_abstract_eval(abstract_eval)
    mlir.register_lowering(p, mlir.lower_fun(fun, multiple_results))
    return p


# twice x plus one, and (x + y, x * y): exact in float32 on every ISA (x * 2 is exact: no fused multiply-add
# could round differently)
_affine = _primitive("spmdsim_test_affine", lambda x: x * 2 + 1, lambda x: x)
_pair = _primitive("spmdsim_test_pair", lambda x, y: (x + y, x * y), lambda x, y: (x, y), multiple_results=True)
_by_hand = core.Primitive("spmdsim_test_by_hand")
_by_hand.def_abstract_eval(lambda x: x)
mlir.register_lowering(_by_hand, lambda ctx, x: [x])


def _keys(shape):
    return jax.random.split(jax.random.key(0), int(np.prod(shape))).reshape(shape)


def test_key_equals_keys_rank_zero_broadcast():
    ks = _keys((N, 5))
    ks = ks.at[:, 2].set(jax.random.key(7))
    _against_jit(lambda k, ks: (k == ks, k != ks), jax.random.key(7), ks[0])
    k7 = jax.random.key(7)
    _against_pmap(lambda ks: (ks == k7, ks != k7), ks)


@pytest.mark.parametrize("shape", [(N,), (N, 3, 2)])
def test_lower_fun_primitive_in_maps(shape):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) - 5
    expected = np.asarray(x) * 2 + 1  # the lowering's arithmetic, exact in float32
    _against_pmap(lambda v: _affine.bind(v), x)
    out = sjax.pmap(lambda v: _affine.bind(v), "i", executor="vectorized")(x)
    np.testing.assert_array_equal(np.asarray(out), expected)


def test_lower_fun_primitive_multiple_results_and_jit():
    x = np.linspace(-3, 3, N * 4, dtype=np.float32).reshape(N, 4)
    y = np.float32(0.5) + x[::-1]
    _against_pmap(lambda a, b: _pair.bind(a, b), x, y)
    _against_jit(lambda a, b: _pair.bind(jnp.sin(a), b), x, y, allowed=2)  # sin: within the lax records' bound
    s, p = sjax.eval_jaxpr(jax.make_jaxpr(lambda a, b: _pair.bind(a, b))(x, y).jaxpr, [], x, y)
    np.testing.assert_array_equal(s, x + y)
    np.testing.assert_array_equal(p, x * y)


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
def test_hand_written_lowering_is_still_refused(executor):
    with pytest.raises(NotImplementedError, match="spmdsim_test_by_hand"):
        sjax.pmap(lambda v: _by_hand.bind(v), "i", executor=executor)(np.ones((N, 2), np.float32))


_LAPACK_FUNCTIONS = {
    "qr": jnp.linalg.qr, "cholesky": jnp.linalg.cholesky, "eigh": jnp.linalg.eigh, "svd": jnp.linalg.svd,
    "inv": jnp.linalg.inv, "eig": jnp.linalg.eig, "schur": jax.scipy.linalg.schur,
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(_LAPACK_FUNCTIONS))
def test_lapack_refuses_low_floats_as_xla_cpu(name, dtype):
    """linalg_test's testQrInvalidDtypeCPU and its siblings: XLA:CPU has no LAPACK routine for float16/bfloat16.
    Up to JAX 0.11, JAX raises NotImplementedError 'Unsupported dtype float16' when it compiles, and spmdsim
    raises the same when it computes; JAX 0.12 refuses the dtype when it traces (TypeError '... does not accept
    dtype float16'), before spmdsim sees a jaxpr, and so does a map of spmdsim's."""
    fn = _LAPACK_FUNCTIONS[name]
    x = (np.eye(3) * 2 + 0.25).astype(jnp.dtype(dtype))
    try:
        closed = jax.make_jaxpr(fn)(x)
    except TypeError as traced:
        assert f"does not accept dtype {dtype}" in str(traced)
        for executor in ("threads", "vectorized"):
            with pytest.raises(TypeError, match=f"does not accept dtype {dtype}"):
                sjax.pmap(fn, "i", executor=executor)(np.stack([x] * N))
        return
    with pytest.raises(NotImplementedError, match=f"Unsupported dtype {dtype}"):
        jax.block_until_ready(jax.jit(fn)(x))
    with pytest.raises(NotImplementedError, match=f"Unsupported dtype {dtype}"):
        sjax.eval_jaxpr(closed.jaxpr, closed.consts, x)
    if name == "qr":  # and inside maps, both executors
        for executor in ("threads", "vectorized"):
            with pytest.raises(NotImplementedError, match=f"Unsupported dtype {dtype}"):
                sjax.pmap(fn, "i", executor=executor)(np.stack([x] * N))


def test_lapack_free_low_float_primitives_still_computed():
    """triangular_solve (and det, through lu in float32 by JAX itself) are XLA's own for float16: no refusal."""
    a = (np.eye(3) * 2 + np.tri(3, k=-1) * 0.25).astype(np.float16)
    b = np.arange(6, dtype=np.float16).reshape(3, 2)
    fn = lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True)
    _against_jit(fn, a, b, allowed=1)


def test_platform_dependent_without_a_cpu_branch_raises_as_jax():
    """lax_control_flow_test's ``test_platform_dependent_no_default``: no branch for cpu and no default."""
    fn = lambda x: jax.lax.platform_dependent(x, tpu=lambda v: v + 2.)
    with pytest.raises(NotImplementedError, match="translation rule .* not found for platform"):
        jax.jit(fn)(3.)
    closed = jax.make_jaxpr(fn)(3.)
    with pytest.raises(NotImplementedError, match="translation rule .* not found for platform cpu"):
        sjax.eval_jaxpr(closed.jaxpr, closed.consts, np.float32(3.))
