"""Issue 26, classes 2 and 3: PRNG implementations other than threefry2x32 (rbg, unsafe_rbg, threefry4x32,
philox, a custom impl), typed keys through the shape rules, and the rules for ``geqrf``, ``geqp3`` and
``ragged_dot_general``; against XLA:CPU (``jax.jit``), per device (``spmdsim.jax.eval_jaxpr``, the reference
loop) and inside ``spmdsim.jax.pmap`` with ``executor="threads"`` and ``"vectorized"`` (against ``jax.pmap``).

Everything is compared bit for bit except samples that go through float transcendental functions XLA computes
its own way (gamma: the lax records' tolerance) and products (ragged_dot_general: dot_general's tolerance).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
from jax import lax
from jax._src.lax import linalg as lax_linalg

import spmdsim
import spmdsim.jax as sjax
from conformance.lax_records import tolerance
from conformance.test_lax_ops import ulps

pytestmark = pytest.mark.area("PRNG impls, key shapes, new rules")

N = 4  # rows of the maps
IMPLS = ("threefry2x32", "rbg", "unsafe_rbg", "threefry4x32", "philox4x32", "philox2x32")
# jax.pmap itself fails on the philox impls (XLA cannot legalise their mulhi under manual sharding): the maps are
# compared on the others
MAPPABLE = ("threefry2x32", "rbg", "unsafe_rbg", "threefry4x32")


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key)


def _numpy_leaves(tree) -> list[np.ndarray]:
    return [np.asarray(jax.random.key_data(x)) if _is_key(x) else np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _key_avals(tree) -> list:
    return [x.dtype if _is_key(x) else None for x in jax.tree_util.tree_leaves(tree)]


def _assert_same(actual: list, expected: list, what: str, allowed: float = 0.0) -> None:
    assert len(actual) == len(expected), what
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape and a.dtype == e.dtype, f"{what} output {k}: {a.dtype}{a.shape} vs {e.dtype}{e.shape}"
        if e.dtype.kind in "fc" or e.dtype.name in ("bfloat16", "float16"):
            assert ulps(a, e) <= allowed, f"{what} output {k}: {ulps(a, e)} ulps (allowed {allowed})"
        else:
            assert np.array_equal(a, e), f"{what} output {k}: values differ"


def _per_device(fn, *args) -> list[np.ndarray]:
    """``fn`` traced by JAX and evaluated by spmdsim's reference loop; keys in as their key data."""
    closed = jax.make_jaxpr(fn)(*args)
    return [np.asarray(x) for x in sjax.eval_jaxpr(closed.jaxpr, closed.consts, *_numpy_leaves(args))]


def _against_jit(fn, *args, allowed: float = 0.0) -> None:
    expected = jax.jit(fn)(*args)
    _assert_same(_per_device(fn, *args), _numpy_leaves(expected), "eval_jaxpr vs jax.jit", allowed)


def _against_pmap(fn, *args, allowed: float = 0.0) -> None:
    expected = jax.pmap(fn, "i")(*args)
    for executor in ("threads", "vectorized"):
        actual = sjax.pmap(fn, "i", executor=executor)(*args)
        assert _key_avals(actual) == _key_avals(expected), executor  # keys come back as keys of the same impl
        _assert_same(_numpy_leaves(actual), _numpy_leaves(expected), f"spmdsim.jax.pmap({executor}) vs jax.pmap",
                     allowed)


def _key(impl: str, seed: int = 0):
    return jax.random.key(seed, impl=impl)


# -- the key primitives of every impl ----------------------------------------------------------------------------

KEY_PROGRAMS = {
    "seed": lambda k: jax.random.key_data(jax.random.key(jnp.int32(12345), impl=jax.random.key_impl(k))),
    "wrap-unwrap": lambda k: jax.random.key_data(jax.random.wrap_key_data(jax.random.key_data(k) + np.uint32(1),
                                                                         impl=jax.random.key_impl(k))),
    "split": lambda k: jax.random.split(k, 3),
    "split-shape": lambda k: jax.random.split(k, (2, 3)),
    "split-batch": lambda k: jax.vmap(lambda kk: jax.random.split(kk, 2))(jax.random.split(k, 3)),
    "fold_in": lambda k: (jax.random.fold_in(k, 7), jax.random.fold_in(k, jnp.uint32(2 ** 32 - 1))),
    "fold_in-batch": lambda k: jax.vmap(jax.random.fold_in, (None, 0))(k, jnp.arange(3)),
    "fold_in-both": lambda k: jax.vmap(jax.random.fold_in)(jax.random.split(k, 3), jnp.arange(3)),
    "bits": lambda k: (jax.random.bits(k, (5,)), jax.random.bits(k, (3, 2), jnp.uint8),
                       jax.random.bits(k, (), jnp.uint16)),
    "bits-batch": lambda k: jax.vmap(lambda kk: jax.random.bits(kk, (2,)))(jax.random.split(k, 3)),
    "bits-batch-2d": lambda k: jax.vmap(jax.vmap(lambda kk: jax.random.bits(kk, (3,))))(jax.random.split(k, (2, 2))),
    "uniform-normal": lambda k: (jax.random.uniform(k, (6,)), jax.random.normal(k, (2, 3))),
    "randint-permutation": lambda k: (jax.random.randint(k, (4,), 0, 100), jax.random.permutation(k, 6)),
    "bernoulli-categorical": lambda k: (jax.random.bernoulli(k, 0.3, (5,)),
                                        jax.random.categorical(k, jnp.linspace(-1.0, 1.0, 4))),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("program", sorted(KEY_PROGRAMS))
def test_key_primitives_against_jit(impl, program):
    if (impl, program) == ("threefry4x32", "split-batch"):
        pytest.skip("XLA:CPU does not finish compiling a vmapped threefry4x32 split (jax 0.10.2: minutes, 15 GB)")
    _against_jit(KEY_PROGRAMS[program], _key(impl, 3))


@pytest.mark.parametrize("impl", IMPLS)
def test_64_bit_bits_against_jit(impl):
    with jax.enable_x64(True):
        _against_jit(lambda k: (jax.random.bits(k, (4,), jnp.uint64), jax.random.uniform(k, (3,), jnp.float64),
                                jax.random.key_data(jax.random.key(jnp.int64(-(2 ** 40) - 5),
                                                                   impl=jax.random.key_impl(k)))), _key(impl, 5))


@pytest.mark.parametrize("impl", ("rbg", "unsafe_rbg", "threefry4x32"))
def test_gamma_of_other_impls_within_the_sampler_tolerance(impl):
    """random_gamma on keys of other impls: JAX's CPU lowering of its sampler, traced and evaluated."""
    alpha = np.array([0.3, 1.0, 2.5, 7.0], np.float32)
    _against_jit(lambda k, a: (jax.random.gamma(k, a), jax.random.loggamma(k, a)), _key(impl, 1), alpha,
                 allowed=tolerance("random_gamma", "float32"))


def test_the_issues_key_data_call():
    data = np.arange(4, dtype=np.uint32)
    fn = lambda d: jax.random.key_data(jax.random.wrap_key_data(d, impl="rbg"))  # noqa: E731
    _against_jit(fn, data)
    assert np.array_equal(_per_device(fn, data)[0], data)


MAP_PROGRAMS = {
    "keys-through": lambda k: k,
    "keys-expanded": lambda k: k[None],
    "split": lambda k: jax.random.split(k, 3),
    "split-index": lambda k: jax.random.split(k)[1],
    "fold_in-axis-index": lambda k: jax.random.fold_in(k, lax.axis_index("i")),
    "fold_in-batch": lambda k: jax.vmap(jax.random.fold_in, (None, 0))(k, jnp.arange(3)),
    "bits": lambda k: (jax.random.bits(k, (5,)), jax.random.bits(k, (3, 2), jnp.uint8)),
    "bits-batch": lambda k: jax.vmap(lambda kk: jax.random.bits(kk, (2,)))(jax.random.split(k, 3)),
    "uniform-normal": lambda k: (jax.random.uniform(k, (6,)), jax.random.normal(k, (6,))),
    "permutation": lambda k: jax.random.permutation(k, 6),
    "ppermute": lambda k: lax.ppermute(k, "i", [(j, (j + 1) % N) for j in range(N)]),
    "where": lambda k: jnp.where(lax.axis_index("i") > 1, k, jax.random.fold_in(k, 1)),
    "cond": lambda k: lax.cond(lax.axis_index("i") > 1, lambda a: jax.random.split(a)[0], lambda a: a, k),
    "scan": lambda k: lax.scan(lambda c, _: (jax.random.split(c)[0], jax.random.bits(c)), k, None, length=3),
}


@pytest.mark.parametrize("impl", MAPPABLE)
@pytest.mark.parametrize("program", sorted(MAP_PROGRAMS))
def test_keys_inside_pmap_against_jax_pmap(impl, program):
    _against_pmap(MAP_PROGRAMS[program], jax.random.split(_key(impl, 2), N))


@pytest.mark.parametrize("impl", ("rbg", "unsafe_rbg"))
def test_gamma_inside_pmap(impl):
    _against_pmap(lambda k: jax.random.gamma(k, jnp.array([0.5, 2.0, 3.0])), jax.random.split(_key(impl), N),
                  allowed=tolerance("random_gamma", "float32"))


def test_the_issues_expanded_keys():
    """``sjax.pmap(lambda k: k[None])`` of threefry keys: a broadcast_in_dim of key data (it raised ValueError:
    cannot reshape array of size 2 into shape (1,))."""
    keys = jax.random.split(jax.random.key(0), 8)
    expected = jax.pmap(lambda k: k[None])(keys)
    for executor in ("threads", "vectorized"):
        actual = sjax.pmap(lambda k: k[None], executor=executor)(keys)
        assert actual.shape == (8, 1) and actual.dtype == expected.dtype
        assert np.array_equal(jax.random.key_data(actual), jax.random.key_data(expected))


@pytest.mark.parametrize("impl", ("rbg", "unsafe_rbg", "threefry2x32"))
def test_keys_of_other_impls_out_of_a_pmap_under_jit(impl):
    keys = jax.random.split(_key(impl), N)
    fn = lambda k: (jax.random.split(k)[0], jax.random.bits(k, (3,)))  # noqa: E731
    expected = jax.pmap(fn)(keys)
    actual = jax.jit(sjax.pmap(fn))(keys)
    _assert_same(_numpy_leaves(actual), _numpy_leaves(expected), "jit(spmdsim.jax.pmap) vs jax.pmap")


# -- a custom PRNG implementation (jax.extend.random.define_prng_impl) --------------------------------------------

def _custom_impl(key_shape):
    size = math.prod(key_shape)

    def seed(s):
        s = lax.convert_element_type(s, np.uint32)
        return (jnp.arange(size, dtype=np.uint32) * np.uint32(0x9E3779B9) ^ s).reshape(key_shape)

    def split(k, shape):
        count = jnp.arange(math.prod(shape), dtype=np.uint32)[:, None]
        flat = k.reshape(1, size) * (count + np.uint32(1)) + count * np.uint32(0x85EBCA6B)
        return flat.reshape(*shape, *key_shape)

    def random_bits(k, bit_width, shape):
        flat = k.reshape(size)
        count = jnp.arange(math.prod(shape), dtype=np.uint32)
        bits = (flat[0] * count + flat[-1]) ^ (count >> np.uint32(3)) * np.uint32(0xC2B2AE35)
        return lax.convert_element_type(bits, np.dtype(f"uint{bit_width}")).reshape(shape)

    def fold_in(k, data):
        return k ^ lax.convert_element_type(data, np.uint32) * np.uint32(2654435761)

    return jax.extend.random.define_prng_impl(key_shape=key_shape, seed=seed, split=split, random_bits=random_bits,
                                              fold_in=fold_in, name=f"toy{key_shape}", tag=f"toy{len(key_shape)}")


@pytest.mark.parametrize("key_shape", [(3,), (2, 2)])
@pytest.mark.parametrize("program", ["split", "split-batch", "fold_in", "bits", "uniform-normal",
                                     "randint-permutation"])
def test_a_custom_impl_against_jit(key_shape, program):
    impl = _custom_impl(key_shape)
    _against_jit(KEY_PROGRAMS[program], jax.random.key(11, impl=impl))


def test_a_custom_impl_inside_pmap():
    impl = _custom_impl((3,))
    _against_pmap(lambda k: (jax.random.split(k)[0], jax.random.uniform(k, (4,)), k[None]),
                  jax.random.split(jax.random.key(5, impl=impl), N))


# -- typed keys through the shape rules -------------------------------------------------------------------------

SHAPE_PROGRAMS = {
    "index": lambda k: k[0],
    "expand": lambda k: (k[None], lax.expand_dims(k, (1,))),
    "reshape-transpose": lambda k: (k.reshape(2, 4), k.reshape(2, 4).T),
    "broadcast": lambda k: jnp.broadcast_to(k[0], (3, 2)),
    "concatenate-stack-tile": lambda k: (jnp.concatenate([k, k]), jnp.stack([k, k], axis=1), jnp.tile(k, 2)),
    "slice-rev": lambda k: (k[1:7:2], k[::-1]),
    "dynamic-slices": lambda k: (lax.dynamic_slice_in_dim(k, jnp.int32(2), 3),
                                 lax.dynamic_update_slice_in_dim(k, k[:2], jnp.int32(7), 0)),
    "gather-scatter": lambda k: (k[jnp.array([3, 1, 0, 9])], k.at[jnp.array([1, 2])].set(k[:2]),
                                 k.at[jnp.array([1, 20])].get(mode="fill", fill_value=None)),
    "select": lambda k: (jnp.where(jnp.arange(8) > 3, k, k[::-1]), lax.select_n(jnp.int32(1), k, k[::-1])),
    "compare": lambda k: (k == k[::-1], k != k.at[0].set(k[1]), k[0] == k[0]),
    "squeeze": lambda k: lax.squeeze(k[:1], (0,)),  # (XLA cannot pad keys: no reference for pad)
    "loops": lambda k: (lax.cond(True, lambda a: a, lambda a: a[::-1], k),
                        lax.scan(lambda c, x: (c, x), k[0], k)[1]),
}


@pytest.mark.parametrize("impl", ("threefry2x32", "rbg", "philox2x32"))
@pytest.mark.parametrize("program", sorted(SHAPE_PROGRAMS))
def test_key_shapes_against_jit(impl, program):
    _against_jit(SHAPE_PROGRAMS[program], jax.random.split(_key(impl), 8))


@pytest.mark.parametrize("impl", ("threefry2x32", "unsafe_rbg"))
@pytest.mark.parametrize("program", ["index", "expand", "reshape-transpose", "broadcast", "gather-scatter",
                                     "select", "compare", "dynamic-slices"])
def test_key_shapes_inside_pmap(impl, program):
    keys = jax.random.split(_key(impl), N * 8).reshape(N, 8)
    _against_pmap(SHAPE_PROGRAMS[program], keys)


def test_a_key_rule_called_by_hand_needs_its_equation():
    """The key data of a non-default impl does not say which impl it is: a rule called without its equation
    (no specialize, no evaluation under way) says so, rather than guess."""
    from spmdsim.jax.evaluation._registry import PER_DEVICE, VECTORIZED

    with pytest.raises(TypeError, match="only known from its equation"):
        PER_DEVICE["random_bits"](np.zeros(4, np.uint32), bit_width=32, shape=(2,))
    # threefry2x32 (JAX's default) is assumed for key data of its shape, in both tables
    expected = np.asarray(jax.random.bits(jax.random.wrap_key_data(np.arange(2, dtype=np.uint32)), (2,)))
    assert np.array_equal(PER_DEVICE["random_bits"](np.arange(2, dtype=np.uint32), bit_width=32, shape=(2,)),
                          expected)
    assert np.array_equal(VECTORIZED["random_bits"](np.arange(2, dtype=np.uint32)[None], bit_width=32,
                                                    shape=(2,))[0], expected)


# -- geqrf, geqp3, ragged_dot_general ----------------------------------------------------------------------------

def _matrix(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


QR_PROGRAMS = {
    "jnp.linalg.qr": lambda a: [jnp.linalg.qr(a, mode=m) for m in ("reduced", "complete", "r", "raw")],
    "jsl.qr-pivoting": lambda a: (jsl.qr(a, pivoting=True), jsl.qr(a, pivoting=True, mode="economic")),
    "jsl.qr_multiply": lambda a: (jsl.qr_multiply(a, a[:, 0]), jsl.qr_multiply(a, a[:, 0], pivoting=True),
                                  jsl.qr_multiply(a, a[:min(a.shape), :2], mode="left", pivoting=True)),
    "slogdet-qr": lambda a: jnp.linalg.slogdet(a[:3, :3] if a.ndim == 2 else a[..., :3, :3], method="qr"),
    "geqrf-geqp3": lambda a: (lax_linalg.geqrf(a), lax_linalg.geqp3(a, jnp.zeros(a.shape[:-2] + a.shape[-1:],
                                                                                    jnp.int32))),
}


@pytest.mark.parametrize("dtype", ["float32", "complex64"])
@pytest.mark.parametrize("program", sorted(QR_PROGRAMS))
def test_qr_steps_against_jit(program, dtype):
    if program == "slogdet-qr" and dtype == "complex64":
        pytest.skip("JAX: slogdet method='qr' not implemented for complex inputs")
    for shape in ((5, 3), (4, 4), (2, 5, 3)):
        if program.startswith("jsl") and len(shape) == 3:
            continue
        _against_jit(QR_PROGRAMS[program], _matrix(shape, dtype))


@pytest.mark.parametrize("program", ["jnp.linalg.qr", "jsl.qr-pivoting", "jsl.qr_multiply", "geqrf-geqp3"])
def test_qr_steps_inside_pmap(program):
    _against_pmap(QR_PROGRAMS[program], _matrix((N, 5, 3)))


def test_geqp3_keeps_the_callers_fixed_columns():
    a = _matrix((2, 4, 5), np.float64)
    jpvt = np.array([[0, 0, 1, 0, 0], [1, 0, 0, 1, 0]], np.int32)
    with jax.enable_x64(True):
        _against_jit(lambda x, p: lax_linalg.geqp3(x, p), a, jpvt)
        r, p, tau = _per_device(lambda x, p: lax_linalg.geqp3(x, p), a, jpvt)
    assert list(p[0][:1]) == [3] and sorted(p[1][:2]) == [1, 4]  # marked columns first (1-based)


RD = lax.RaggedDotDimensionNumbers


def test_the_issues_ragged_dot():
    lhs, rhs = _matrix((4, 3)), _matrix((2, 3, 5), seed=1)
    sizes = np.array([1, 3], np.int32)
    _against_jit(lambda a, b, g: lax.ragged_dot(a, b, g), lhs, rhs, sizes, allowed=tolerance("ragged_dot_general",
                                                                                               "float32"))


RAGGED = {
    "non-contracting": (lambda a, b, g: lax.ragged_dot(a, b, g), (7, 3), (3, 3, 5), [2, 0, 4]),
    "non-contracting-batched": (lambda a, b, g: lax.ragged_dot_general(a, b, g, RD(
        dot_dimension_numbers=(((2,), (2,)), ((0,), (1,))), lhs_ragged_dimensions=(1,), rhs_group_dimensions=(0,))),
        (2, 5, 3), (3, 2, 3, 4), [[1, 2, 2], [0, 5, 0]]),
    "contracting": (lambda a, b, g: lax.ragged_dot_general(a, b, g, RD(
        dot_dimension_numbers=(((1,), (0,)), ((), ())), lhs_ragged_dimensions=(1,), rhs_group_dimensions=())),
        (4, 6), (6, 5), [1, 3, 2]),
    "batch": (lambda a, b, g: lax.ragged_dot_general(a, b, g, RD(
        dot_dimension_numbers=(((2,), (1,)), ((0,), (0,))), lhs_ragged_dimensions=(0,), rhs_group_dimensions=())),
        (3, 4, 2), (3, 2, 5), [1, 2]),
}


@pytest.mark.parametrize("mode", sorted(RAGGED))
def test_ragged_dot_general_inside_pmap(mode):
    fn, lhs, rhs, sizes = RAGGED[mode]
    rng = np.random.default_rng(3)
    args = (rng.uniform(0.5, 1, (N, *lhs)).astype(np.float32), rng.uniform(0.5, 1, (N, *rhs)).astype(np.float32),
            np.broadcast_to(np.asarray(sizes, np.int32), (N, *np.shape(sizes))).copy())
    _against_pmap(fn, *args, allowed=tolerance("ragged_dot_general", "float32"))
    ints = tuple(rng.integers(-4, 5, a.shape).astype(np.int32) for a in args[:2]) + args[2:]
    _against_pmap(fn, *ints)  # integers: exact
