"""Which primitives JAX 0.10 can emit, found by construction, and which of them spmdsim leaves out and why.

:func:`enumerate_primitives` is the union of

- every primitive that ``jax.lax`` and ``jax.lax.linalg`` export as ``*_p``, and
- every primitive in the jaxprs (sub-jaxprs included) of :func:`representative_programs`: calls of
  ``jax.numpy``, ``jax.numpy.linalg``, ``jax.numpy.fft``, ``jax.scipy.special``, ``jax.scipy.linalg``,
  ``jax.nn`` and ``jax.random``, with their gradients where JAX's transpose rules emit primitives of their
  own (max-pooling's ``select_and_scatter_add``, ``jnp.stack``'s ``unstack``, ``lgamma``'s ``digamma``), and
  the functions JAX lowers the key primitives of every registered PRNG impl to (spmdsim evaluates those for
  impls other than threefry2x32: their hash primitives are found there).

Every enumerated primitive has a rule in both rule tables (:mod:`spmdsim.jax.evaluation._registry`), except

- :data:`EXCLUDED`: at most ten, one reason each;
- :data:`LEAD_OWNED`: collectives, ``axis_index`` and the higher-order (control flow and call) primitives,
  whose rules live with the executors (:mod:`._collective_rules`, :mod:`._control_flow`).

``conformance/test_primitive_coverage.py`` checks both statements.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["EXCLUDED", "LEAD_OWNED", "PER_DEVICE_ONLY", "enumerate_primitives", "representative_programs",
           "primitives_of"]

EXCLUDED: dict[str, str] = {
    "rng_uniform": "XLA's stateful RNG: values depend on a hidden per-module seed, not on the program",
}

LEAD_OWNED: frozenset[str] = frozenset({
    # collectives and the axis index
    "psum", "pmax", "pmin", "all_gather", "all_to_all", "ppermute", "ragged_all_to_all", "reduce_scatter",
    "pbroadcast", "axis_index", "psum_invariant", "all_gather_invariant", "psend", "precv",
    # tokens (psend's result; lax.create_token): opaque values that order effects
    "create_token", "after_all",
    # control flow and calls
    "pjit", "jit", "closed_call", "core_call", "call", "eval_jaxpr", "cond", "while", "scan", "custom_jvp_call",
    "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "remat2", "checkpoint", "shard_map", "composite",
    "custom_partitioning",
    "call_hi_primitive",  # JAX 0.12's hijax: the program JAX expands it into
})


# Per-device rules without a vectorized twin, on purpose (not enumerated: jax.debug is outside the modules
# above). A callback is a per-device side effect: a print per device, the user's function called once per
# device with that device's values, in device order, through spmdsim's ordered output. A stacked evaluation
# cannot reproduce it (one call with every device's values would change what the user's function sees): the
# vectorized executor runs these rules device by device instead. The host callbacks ``pure_callback`` and
# ``io_callback`` (also not enumerated) have a rule in both tables, the vectorized one calling once per device
# too (``spmdsim/jax/rules/_callbacks.py``).
PER_DEVICE_ONLY: dict[str, str] = {
    "debug_print": "a print per device, in device order: a per-device side effect",
    "debug_callback": "the user's callback once per device with its values: a per-device side effect",
}


def primitives_of(jaxpr) -> set[str]:
    """Names of the primitives in ``jaxpr`` (a Jaxpr or ClosedJaxpr), sub-jaxprs in parameters included."""
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    names: set[str] = set()
    for eqn in inner.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value):
                names |= primitives_of(sub)
    return names


def _sub_jaxprs(value):
    if hasattr(value, "eqns") or (hasattr(value, "jaxpr") and hasattr(getattr(value, "jaxpr"), "eqns")):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _sub_jaxprs(v)
    elif hasattr(value, "__dataclass_fields__"):  # e.g. custom_linear_solve's jaxprs
        for field in value.__dataclass_fields__:
            yield from _sub_jaxprs(getattr(value, field))
    elif isinstance(value, tuple) and hasattr(value, "_fields"):
        for v in value:
            yield from _sub_jaxprs(v)


def _exported(module) -> set[str]:
    from jax.extend import core as ext_core

    return {getattr(module, k).name for k in dir(module)
            if k.endswith("_p") and isinstance(getattr(module, k), ext_core.Primitive)}


def representative_programs() -> list[tuple[str, Callable, tuple]]:
    """``(label, function, arguments)``: the calls whose jaxprs the enumeration reads."""
    import jax
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl
    import jax.scipy.special as jss
    from jax import lax

    f32 = np.float32
    v = np.linspace(0.1, 0.9, 6, dtype=f32)
    m = np.eye(4, dtype=f32) * 3 + np.arange(16, dtype=f32).reshape(4, 4) / 20
    spd = m @ m.T
    img = np.ones((2, 8, 8, 3), f32)
    key = jax.random.key(0)
    raw_key = jax.random.PRNGKey(0)
    ints = np.arange(6, dtype=np.int32)
    c64 = v.astype(np.complex64)

    def grad(fn):
        return jax.grad(lambda *a: sum(jnp.sum(jnp.real(leaf)) for leaf in jax.tree_util.tree_leaves(fn(*a))))

    def max_pool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def min_pool(x):
        return lax.reduce_window(x, jnp.inf, lax.min, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def avg_pool(x):
        return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "SAME") / 4

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    w = np.ones((3, 3, 3, 4), f32)
    programs = [
        # jax.numpy
        ("jnp.searchsorted", lambda a, b: jnp.searchsorted(a, b), (v, v[::2])),
        ("jnp.digitize", lambda a, b: jnp.digitize(a, b), (v, v[::2])),
        ("jnp.interp", lambda a, b: jnp.interp(a, b, b), (v, v)),
        ("jnp.histogram", lambda a: jnp.histogram(a, bins=3), (v,)),
        ("jnp.bincount", lambda a: jnp.bincount(a, length=8), (ints,)),
        ("jnp.unique", lambda a: jnp.unique(a, size=6), (ints,)),
        ("jnp.sort/argsort", lambda a: (jnp.sort(a), jnp.argsort(a), jnp.lexsort((a, a))), (v,)),
        ("jnp.partition", lambda a: jnp.partition(a, 2), (v,)),
        ("jnp.median/quantile", lambda a: (jnp.median(a), jnp.quantile(a, 0.3)), (v,)),
        ("jnp.cumsum/cumprod", lambda a: (jnp.cumsum(a), jnp.cumprod(a), lax.cummax(a), lax.cummin(a),
                                           lax.cumlogsumexp(a)), (v,)),
        ("jnp.convolve", lambda a: jnp.convolve(a, a), (v,)),
        ("jnp.correlate", lambda a: jnp.correlate(a, a, mode="full"), (v,)),
        ("jnp.einsum/matmul", lambda a, b: (jnp.einsum("ij,jk->ik", a, b), a @ b), (m, m)),
        ("jnp.roots", lambda a: jnp.roots(a, strip_zeros=False), (v,)),
        ("jnp.argmax/argmin", lambda a: (jnp.argmax(a), jnp.argmin(a)), (v,)),
        ("jnp.nan-reductions", lambda a: (jnp.nansum(a), jnp.nanmax(a), jnp.nanprod(a)), (v,)),
        ("jnp.bitwise", lambda a: (jnp.bitwise_count(a), jnp.left_shift(a, 1), jnp.right_shift(a, 1),
                                   jnp.packbits(a > 2), jnp.gcd(a, a + 2)), (ints,)),
        ("jnp.frexp/ldexp", lambda a: (jnp.frexp(a), jnp.ldexp(a, 2), jnp.nextafter(a, a + 1),
                                       jnp.spacing(a)), (v,)),
        ("jnp.special", lambda a: (jnp.i0(a), jnp.sinc(a), jnp.logaddexp(a, a), jnp.hypot(a, a),
                                   jnp.float_power(a, 2), jnp.cbrt(a), jnp.round(a, 2)), (v,)),
        ("jnp.pad", lambda a: (jnp.pad(a, 2, mode="reflect"), jnp.pad(a, 1, mode="wrap"),
                               jnp.pad(a, 1, mode="edge")), (v,)),
        ("jnp.shapes", lambda a: (jnp.roll(a, 2), jnp.tile(a, 2), jnp.repeat(a, 2), jnp.stack([a, a]),
                                  jnp.tril(jnp.outer(a, a)), jnp.flip(a), jnp.diff(a), jnp.kron(a, a)), (v,)),
        ("jnp.take/put", lambda a, i: (jnp.take(a, i), a.at[i].add(1.0), a.at[i].multiply(2.0), a.at[i].min(0.0),
                                       a.at[i].max(0.0), a.at[i].set(0.0), a.at[i].get(mode="fill")),
         (v, ints[:3])),
        ("jnp.complex", lambda a: (jnp.abs(a), jnp.angle(a), jnp.conj(a), jnp.exp(a), jnp.sqrt(a)), (c64,)),
        ("jnp.top_k", lambda a: lax.top_k(a, 2), (v,)),
        ("lax.approx_max_k", lambda a: lax.approx_max_k(a, 2), (v,)),
        ("jnp.clip/where", lambda a: (jnp.clip(a, 0.2, 0.5), jnp.where(a > 0.5, a, 0.0)), (v,)),
        ("jnp.polyval/vander", lambda a: (jnp.polyval(a, a), jnp.vander(a, 3)), (v,)),
        # jax.numpy.linalg
        ("linalg.solve/inv", lambda a: (jnp.linalg.solve(a, a[0]), jnp.linalg.inv(a)), (m,)),
        ("linalg.det/slogdet", lambda a: (jnp.linalg.det(a), jnp.linalg.slogdet(a)), (m,)),
        ("linalg.cholesky", lambda a: jnp.linalg.cholesky(a), (spd,)),
        ("linalg.eigh", lambda a: jnp.linalg.eigh(a), (spd,)),
        ("linalg.eig", lambda a: jnp.linalg.eig(a), (m,)),
        ("linalg.svd", lambda a: (jnp.linalg.svd(a), jnp.linalg.pinv(a), jnp.linalg.norm(a, 2),
                                  jnp.linalg.matrix_rank(a)), (m,)),
        ("linalg.qr", lambda a: jnp.linalg.qr(a), (m,)),
        # QR's LAPACK steps, bound by jax.numpy and jax.scipy themselves (qr's own lowering binds them too)
        ("linalg.qr-modes", lambda a: (jnp.linalg.qr(a, mode="raw"), jnp.linalg.qr(a, mode="r"),
                                       jnp.linalg.qr(a, mode="complete"), jnp.linalg.slogdet(a, method="qr"),
                                       jsl.qr(a, pivoting=True), jsl.qr_multiply(a, a[0]),
                                       jsl.qr_multiply(a, a[0], pivoting=True)), (m,)),
        ("linalg.lstsq", lambda a: jnp.linalg.lstsq(a, a[0]), (m,)),
        ("linalg.matrix_power", lambda a: jnp.linalg.matrix_power(a, 3), (m,)),
        # jax.numpy.fft
        ("fft", lambda a: (jnp.fft.fft(a), jnp.fft.ifft(a), jnp.fft.rfft(a), jnp.fft.irfft(a),
                           jnp.fft.fft2(jnp.outer(a, a)), jnp.fft.fftfreq(6)), (v,)),
        # jax.scipy.special
        ("special.gamma-family", lambda a: (jss.gammaln(a), jss.digamma(a), jss.polygamma(1, a), jss.zeta(a + 1, a),
                                            jss.gammainc(a, a), jss.gammaincc(a, a), jss.betainc(a, a, a),
                                            jss.betaln(a, a), jss.gamma(a)), (v,)),
        ("special.erf-family", lambda a: (jss.erf(a), jss.erfc(a), jss.erfinv(a), jss.ndtr(a), jss.ndtri(a),
                                          jss.log_ndtr(a)), (v,)),
        ("special.bessel", lambda a: (jss.i0e(a), jss.i1e(a), jss.i0(a), jss.i1(a)), (v,)),
        ("special.misc", lambda a: (jss.logsumexp(a), jss.xlogy(a, a), jss.xlog1py(a, a), jss.expit(a),
                                    jss.logit(a), jss.entr(a), jss.multigammaln(a + 2, 2), jss.expi(a)), (v,)),
        ("special.grads", lambda a: (grad(jss.gammainc)(a, a), grad(jss.digamma)(a), grad(jss.gammaln)(a),
                                     grad(jss.erfinv)(a)), (v,)),
        # jax.scipy.linalg
        ("scipy.linalg.factorizations", lambda a: (jsl.lu(a), jsl.lu_factor(a), jsl.cho_factor(a),
                                                   jsl.qr(a), jsl.svd(a), jsl.eigh(a), jsl.schur(a),
                                                   jsl.hessenberg(a)), (spd,)),
        ("scipy.linalg.solves", lambda a: (jsl.solve_triangular(a, a[0], lower=True), jsl.cho_solve(jsl.cho_factor(a),
                                                                                                  a[0]),
                                           jsl.lu_solve(jsl.lu_factor(a), a[0]), jsl.solve(a, a[0]),
                                           jsl.inv(a)), (spd,)),
        ("scipy.linalg.functions", lambda a: (jsl.expm(a), jsl.sqrtm(a), jsl.polar(a), jsl.det(a)), (spd,)),
        ("scipy.linalg.eigh_tridiagonal", lambda a: jsl.eigh_tridiagonal(a, a[:-1], eigvals_only=True), (v,)),
        ("lax.linalg.extra", lambda a: (lax.linalg.tridiagonal(a), lax.linalg.tridiagonal_solve(
            a[0], a[1], a[2], a[:, :1]), lax.linalg.householder_product(a, a[0]),
            lax.linalg.symmetric_product(a, a), lax.linalg.cholesky_update(a, a[0])), (spd,)),
        # jax.nn
        ("nn.activations", lambda a: (jax.nn.relu(a), jax.nn.gelu(a), jax.nn.gelu(a, approximate=False),
                                      jax.nn.softmax(a), jax.nn.log_softmax(a), jax.nn.sigmoid(a), jax.nn.silu(a),
                                      jax.nn.softplus(a), jax.nn.elu(a), jax.nn.celu(a), jax.nn.selu(a),
                                      jax.nn.glu(a), jax.nn.one_hot(ints, 6), jax.nn.standardize(a),
                                      jax.nn.logsumexp(a), jax.nn.relu6(a), jax.nn.hard_tanh(a),
                                      jax.nn.sparse_plus(a), jax.nn.mish(a)), (v,)),
        ("nn.grads", lambda a: (grad(jax.nn.relu)(a), grad(jax.nn.gelu)(a), grad(jax.nn.softmax)(a)), (v,)),
        ("nn.dot_product_attention", lambda q: jax.nn.dot_product_attention(q, q, q), (np.ones((1, 4, 2, 8), f32),)),
        ("lax.ragged_dot", lambda a, b, g: lax.ragged_dot(a, b, g), (m[:, :3], np.ones((2, 3, 5), f32),
                                                                    np.array([1, 3], np.int32))),
        # pooling and convolution, and their gradients
        ("pooling", lambda x: (max_pool(x), min_pool(x), avg_pool(x), grad(max_pool)(x), grad(avg_pool)(x),
                               grad(min_pool)(x)), (img,)),
        ("conv", lambda x, k: (conv(x, k), jax.grad(lambda a, b: jnp.sum(conv(a, b)), (0, 1))(x, k)), (img, w)),
        ("conv.grouped", lambda x: lax.conv_general_dilated(x, np.ones((3, 3, 1, 6), f32), (2, 2), "VALID",
                                                            rhs_dilation=(2, 2), feature_group_count=3,
                                                            dimension_numbers=("NHWC", "HWIO", "NHWC")), (img,)),
        ("grad.stack", grad(lambda a: jnp.stack([a, 2 * a])), (v,)),
        ("grad.sort/cummax", lambda a: (grad(jnp.sort)(a), grad(lambda b: lax.cummax(b))(a),
                                        grad(lambda b: lax.cumprod(b))(a)), (v,)),
        ("grad.linalg", lambda a: (grad(jnp.linalg.eigh)(a), grad(lambda b: jnp.linalg.svd(b)[1])(a),
                                   grad(jnp.linalg.cholesky)(a), grad(jnp.linalg.det)(a), grad(jnp.linalg.qr)(a),
                                   grad(jnp.linalg.inv)(a)), (spd,)),
        ("grad.reduce_max", grad(lambda a: jnp.max(a) + jnp.prod(a)), (v,)),
        # jax.random
        ("random.basic", lambda k: (jax.random.normal(k, (3,)), jax.random.uniform(k, (3,)),
                                    jax.random.bernoulli(k, 0.5, (3,)), jax.random.randint(k, (3,), 0, 9),
                                    jax.random.split(k), jax.random.fold_in(k, 3), jax.random.key_data(k),
                                    jax.random.truncated_normal(k, -1.0, 1.0, (3,)), jax.random.permutation(k, 5),
                                    jax.random.categorical(k, v), jax.random.choice(k, 5, (2,), replace=False),
                                    jax.random.bits(k, (2,), np.uint8), jax.random.clone(k)), (key,)),
        ("random.gamma-family", lambda k: (jax.random.gamma(k, v), jax.random.beta(k, v, v),
                                           jax.random.dirichlet(k, v), jax.random.loggamma(k, v),
                                           jax.random.chisquare(k, 3.0), jax.random.t(k, 3.0),
                                           jax.random.poisson(k, 3.0, (2,)), jax.random.binomial(k, 5.0, 0.3),
                                           jax.random.orthogonal(k, 3),
                                           jax.random.multivariate_normal(k, v[:2], np.eye(2, dtype=f32))),
         (key,)),
        ("random.gamma-grad", lambda a: grad(lambda b: jax.random.gamma(jax.random.key(1), b))(a), (v,)),
        ("random.legacy-key", lambda k: (jax.random.normal(k, (2,)), jax.random.split(k)), (raw_key,)),
        ("lax.rng_bit_generator", lambda k: lax.rng_bit_generator(k, (4,), dtype=np.uint32),
         (np.zeros(4, np.uint32),)),
        ("random.impls", lambda: [(jax.random.normal(k, (2,)), jax.random.split(k), jax.random.fold_in(k, 3))
                                  for k in (jax.random.key(0, impl=name) for name in _prng_impls())], ()),
        *_impl_lowerings(),
        # others reachable from user code
        ("lax.misc", lambda a: (lax.reduce_precision(a, 5, 10), lax.population_count(ints), lax.clz(ints),
                                lax.mulhi(ints, ints), lax.tile(a, (2,)), lax.optimization_barrier(a),
                                jax.lax.stop_gradient(a), lax.reduce((a, a), (0.0, 0.0),
                                                                     lambda x, y: (x[0] + y[0], x[1] * y[1]), (0,))),
         (v,)),
        # higher-order autodiff and loops: what their transposes and carries emit
        ("hessian.linalg", jax.hessian(lambda a: jnp.linalg.slogdet(a)[1] + jnp.sum(jnp.linalg.cholesky(a @ a.T))),
         (m,)),
        ("hessian.gaussian-process", jax.hessian(lambda s: jnp.sum(jnp.log(jnp.diag(jnp.linalg.cholesky(
            spd * jnp.exp(s[0]) + jnp.eye(4)))))), (v[:2],)),
        ("jacfwd.pooling", jax.jacfwd(lambda x: jnp.sum(max_pool(x))), (img[:1, :4, :4],)),
        ("loops", lambda a: (lax.scan(lambda c, x: (c + x, c * x), 0.0, a), lax.fori_loop(0, 3, lambda i, c: c * 2, a),
                             jax.checkpoint(jnp.sin)(a), jax.vmap(jnp.cumsum)(jnp.outer(a, a))), (v,)),
        ("lax.custom_root/solve", lambda a: jax.lax.custom_linear_solve(lambda x: a @ x, a[0],
                                                                       lambda mv, b: jnp.linalg.solve(a, b)), (m,)),
    ]
    return programs


def _prng_impls() -> list[str]:
    from spmdsim.jax._internals import jax_prng
    return sorted(jax_prng.prngs)


def _impl_lowerings() -> list[tuple[str, Callable, tuple]]:
    """For every registered PRNG impl, the functions JAX lowers its key primitives to (its seed, split, fold_in
    and random_bits on key data), which spmdsim traces and evaluates for impls other than threefry2x32: their hash
    primitives (threefry4x32, philox4x32, philox2x32, iota_2x32_shape, rng_bit_generator) are found here."""
    import jax
    from spmdsim.jax._internals import jax_prng

    programs = []
    for name in _prng_impls():
        impl = jax_prng.prngs[name]
        data = np.zeros(impl.key_shape, np.uint32)
        programs.append((f"random.lowering.{name}", lambda k, impl=impl: (
            impl.seed(np.int32(3)), impl.split(k, (2,)), impl.fold_in(k, np.uint32(5)),
            impl.random_bits(k, 32, (3,)), jax.vmap(lambda kk: impl.random_bits(kk, 8, (2,)))(jax.numpy.stack([k, k]))),
            (data,)))
    return programs


def enumerate_primitives() -> tuple[set[str], dict[str, str]]:
    """The enumerated primitives, and for each traced one the first program it was found in."""
    import jax
    import jax.lax.linalg

    names = _exported(jax.lax) | _exported(jax.lax.linalg)
    found: dict[str, str] = {}
    for label, fn, args in representative_programs():
        for name in primitives_of(jax.make_jaxpr(fn)(*args)):
            found.setdefault(name, label)
    return names | set(found), found
