"""JAX's random primitives in NumPy, bit for bit with ``jax.random`` on XLA:CPU, for every PRNG implementation.

A key array is its key data: a uint32 array with the key's shape followed by its impl's key shape
(``random_wrap``/``random_unwrap`` are identities). A key's impl is not in its data: each rule learns it from its
equation (see "the key primitives" below).

threefry2x32 (partitionable, JAX's default) is computed here in NumPy. Every rule works on a whole batch of keys at
once (the leading axes of the key array), so its vectorized twin is the same rule: the device axis is one more batch
axis of keys. Every other implementation (rbg, unsafe_rbg, philox2x32/4x32, threefry4x32, or one made with
``jax.extend.random.define_prng_impl``) is computed as JAX lowers it: the impl's own function, traced and
evaluated with spmdsim's rules (for rbg and unsafe_rbg, ``rng_bit_generator`` below), device by device in the
vectorized twin. The hash primitives those lowerings bind (``threefry4x32``, ``philox4x32``, ``philox2x32``,
``iota_2x32_shape``) have rules of their own.

``random_gamma`` is JAX's own sampler (Marsaglia and Tsang's rejection method, with JAX's boost for alpha < 1
and its log-space variant) written in NumPy on the same threefry bits, with XLA:CPU's float32 ``log``,
``log1p`` and ``erf_inv`` (:mod:`._xla_cpu_math`) and its fused multiply-adds where XLA:CPU fuses. Samples equal
``jax.random.gamma``'s on XLA:CPU bit for bit except where XLA's ``rsqrt`` (a hardware estimate refined by two
Newton steps, in ``c = 1/3 * rsqrt(d)``) or ``pow`` (alpha < 1) differ by an ulp: about 3% of float32 samples,
within 4 ulps (the conformance report has the measured distance). For keys of other impls it is JAX's CPU
lowering of the sampler (a ``lax.map`` over the keys), traced and evaluated, with the same ulp-level differences.

``rng_bit_generator`` is XLA's RngBitGenerator: Philox-4x32 (XLA:CPU's default) or Threefry on the key as a
u64[2] state, with XLA's counters and its interleaving of the generated words, bit for bit.
"""
from __future__ import annotations

import functools
import math

import jax
import numpy as np

from spmdsim.jax.evaluation import _dtypes

from spmdsim.jax.numerics import _xla_cpu_math
from spmdsim.jax.evaluation._interpreter import PER_DEVICE as per_device_executor
from spmdsim.jax.rules._elementwise import LOW_FLOATS, elementwise, expand_to
from spmdsim.jax.evaluation._registry import PER_DEVICE, per_device, vectorized

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotl(x, d):
    return (x << np.uint32(d)) | (x >> np.uint32(32 - d))


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash with 20 rounds (Salmon et al. 2011), on broadcasting uint32 arrays."""
    k1, k2, x1, x2 = (np.asarray(a, dtype=np.uint32) for a in (k1, k2, x1, x2))
    if k1.size <= _FEW and k2.size <= _FEW and x1.size <= _FEW and x2.size <= _FEW:
        shape = np.broadcast_shapes(k1.shape, k2.shape, x1.shape, x2.shape)
        if 0 < math.prod(shape) <= _FEW:  # a key or two (a sampler's loop): Python's integers, the same words
            size = math.prod(shape)
            words = [a.ravel().tolist() * size if a.size == 1 else a.ravel().tolist() if a.shape == shape else
                     np.broadcast_to(a, shape).ravel().tolist() for a in (k1, k2, x1, x2)]
            y1, y2 = zip(*map(_threefry2x32_words, *words))
            return np.array(y1, np.uint32).reshape(shape), np.array(y2, np.uint32).reshape(shape)
    ks = [k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA)]
    x = [x1 + ks[0], x2 + ks[1]]
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x[0] = x[0] + x[1]
            x[1] = _rotl(x[1], r) ^ x[0]
        x[0] = x[0] + ks[(block + 1) % 3]
        x[1] = x[1] + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x[0], x[1]


_FEW = 16  # hashes of at most this many words are computed word by word (NumPy's per-call cost dominates)
_MASK = 0xFFFFFFFF


def _threefry2x32_words(k1: int, k2: int, x1: int, x2: int) -> tuple[int, int]:
    """:func:`threefry2x32` of one pair of words, in Python's integers (uint32 arithmetic: modulo 2**32)."""
    ks = (k1, k2, k1 ^ k2 ^ 0x1BD11BDA)
    a, b = (x1 + k1) & _MASK, (x2 + k2) & _MASK
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            a = (a + b) & _MASK
            b = (((b << r) & _MASK) | (b >> (32 - r))) ^ a
        a = (a + ks[(block + 1) % 3]) & _MASK
        b = (b + ks[(block + 2) % 3] + block + 1) & _MASK
    return a, b


def _iota_2x32(shape):
    """The counters 0, 1, ... of ``shape`` as (high, low) uint32 words (JAX's iota_2x32_shape)."""
    flat = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.uint64).reshape(shape)
    return (flat >> np.uint64(32)).astype(np.uint32), (flat & np.uint64(0xFFFFFFFF)).astype(np.uint32)


@functools.lru_cache(maxsize=256)
def _counters(shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_iota_2x32` of ``shape``, read-only, made once per shape (a sampler splits its key at every step)."""
    words = tuple(np.array(w, np.uint32) for w in _iota_2x32(shape))
    for w in words:
        w.flags.writeable = False
    return words


def _hash_counters(keys: np.ndarray, shape) -> tuple[np.ndarray, np.ndarray]:
    """threefry2x32 of every key (shape ``K + (2,)``) with the counters of ``shape``: two ``K + shape`` arrays."""
    shape = tuple(shape)
    hi, lo = _counters(shape)
    expand = (Ellipsis,) + (np.newaxis,) * len(shape)
    return threefry2x32(keys[..., 0][expand], keys[..., 1][expand], hi, lo)


def split(keys: np.ndarray, shape) -> np.ndarray:
    """``K + (2,)`` keys to ``K + shape + (2,)`` new keys."""
    b1, b2 = _hash_counters(keys, shape)
    return np.stack([b1, b2], axis=-1)


def fold_in(keys: np.ndarray, data: np.ndarray) -> np.ndarray:
    """threefry2x32(key, seed(data)) for uint32 data broadcast against the keys."""
    data = np.asarray(data, np.uint32)
    b1, b2 = threefry2x32(keys[..., 0], keys[..., 1], np.zeros_like(data), data)
    return np.stack(np.broadcast_arrays(b1, b2), axis=-1)


def random_bits(keys: np.ndarray, bit_width: int, shape) -> np.ndarray:
    b1, b2 = _hash_counters(keys, shape)
    if bit_width == 64:
        return (b1.astype(np.uint64) << np.uint64(32)) | b2.astype(np.uint64)
    return (b1 ^ b2).astype(np.dtype(f"u{bit_width // 8}"))


def seed(seeds: np.ndarray) -> np.ndarray:
    """JAX's threefry_seed: the high word is the seed shifted right (logically) by 32 bits, which is 0 for
    seeds of 32 bits or fewer; the low word is the seed's low 32 bits."""
    seeds = np.asarray(seeds)
    wide = seeds.astype(np.int64).view(np.uint64) if seeds.dtype.kind == "i" else seeds.astype(np.uint64)
    high = (wide >> np.uint64(32)) if seeds.dtype.itemsize == 8 else np.zeros_like(wide)  # sign-extended below
    return np.stack([high.astype(np.uint32), (wide & np.uint64(0xFFFFFFFF)).astype(np.uint32)], axis=-1)


elementwise("threefry2x32")(lambda k1, k2, x1, x2: list(threefry2x32(k1, k2, x1, x2)))


# The hash primitives of JAX's other counter-based impls (jax/_src/random/{threefry4x32,philox4x32,philox2x32}.py),
# which their lowerings bind, and the counters their splits and bits hash (iota_2x32_shape).

_ROTATIONS_4X32 = ((10, 26), (11, 21), (13, 27), (23, 5), (6, 20), (17, 11), (25, 10), (18, 20))


def threefry4x32(k0, k1, k2, k3, x0, x1, x2, x3):
    """The Threefry-4x32 hash with 20 rounds (Random123's rotations and key schedule), on broadcasting uint32
    arrays."""
    k = list(np.broadcast_arrays(*(np.asarray(a, np.uint32) for a in (k0, k1, k2, k3, x0, x1, x2, x3))))
    ks = [*k[:4], k[0] ^ k[1] ^ k[2] ^ k[3] ^ np.uint32(0x1BD11BDA)]
    x = [k[4 + i] + ks[i] for i in range(4)]
    for rnd in range(20):
        r0, r1 = _ROTATIONS_4X32[rnd % 8]
        if rnd % 2 == 0:
            x[0] = x[0] + x[1]
            x[1] = x[0] ^ _rotl(x[1], r0)
            x[2] = x[2] + x[3]
            x[3] = x[2] ^ _rotl(x[3], r1)
        else:
            x[0] = x[0] + x[3]
            x[3] = x[0] ^ _rotl(x[3], r0)
            x[2] = x[2] + x[1]
            x[1] = x[2] ^ _rotl(x[1], r1)
        if rnd % 4 == 3:
            j = rnd // 4
            x = [x[i] + ks[(1 + i + j) % 5] for i in range(4)]
            x[3] = x[3] + np.uint32(1 + j)
    return x


def _mulhilo(m: np.uint64, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = x.astype(np.uint64) * m
    return p.astype(np.uint32), (p >> np.uint64(32)).astype(np.uint32)


def philox2x32(k0, x0, x1):
    """The Philox-2x32 hash with 10 rounds, on broadcasting uint32 arrays."""
    k0, x0, x1 = np.broadcast_arrays(*(np.asarray(a, np.uint32) for a in (k0, x0, x1)))
    for rnd in range(10):
        if rnd:
            k0 = k0 + np.uint32(0x9E3779B9)
        lo, hi = _mulhilo(np.uint64(0xD256D193), x0)
        x0, x1 = hi ^ x1 ^ k0, lo
    return [x0, x1]


elementwise("threefry4x32")(lambda *words: threefry4x32(*words))
elementwise("philox2x32")(lambda k0, x0, x1: philox2x32(k0, x0, x1))
elementwise("philox4x32")(lambda k0, k1, x0, x1, x2, x3: philox4x32(
    list(np.broadcast_arrays(*(np.asarray(a, np.uint32) for a in (x0, x1, x2, x3, k0, k1))))[:4],
    [np.asarray(k0, np.uint32), np.asarray(k1, np.uint32)]))


@per_device("iota_2x32_shape")
def _iota_2x32_shape(*, shape):
    return list(_iota_2x32(tuple(shape)))


vectorized("iota_2x32_shape")(lambda *, shape: [w[np.newaxis] for w in _iota_2x32(tuple(shape))])


# -- the key primitives, for every PRNG implementation ------------------------------------------------------------
# A key's impl is not in its key data: the rules learn it from the equation (the key operand's dtype, or the
# ``impl`` parameter), once per equation through ``specialize``, or from the equation being evaluated (the reference
# loop). threefry2x32 (JAX's default) is computed by the NumPy code above. Any other implementation (rbg,
# unsafe_rbg, philox, threefry4x32, or one made with jax.extend.random.define_prng_impl) is computed as JAX lowers it:
# the impl's own function (its ``seed``, ``split``, ``fold_in`` or ``random_bits``) vmapped over the key batch as
# jax/_src/random/prng.py does, traced once per impl, shapes and parameters, and evaluated with spmdsim's rules
# (rbg and unsafe_rbg draw their bits from ``rng_bit_generator``, XLA's Philox; JAX's batching of that primitive
# draws a whole batch from the batch's first key, and so does the traced function). The vectorized twins evaluate
# it device by device, so that the device axis never becomes a key batch axis.

def _is_threefry(impl) -> bool:
    return impl is _threefry_impl()


@functools.lru_cache(maxsize=1)
def _threefry_impl():
    from spmdsim.jax._internals import jax_prng
    return jax_prng.prngs["threefry2x32"]


def _default_impl():
    from spmdsim.jax._internals import jax_prng
    return jax_prng.prngs[jax.config.jax_default_prng_impl]


def _impl_of(eqn):
    """The PRNG impl of ``eqn``'s key operand (or of its ``impl`` parameter)."""
    impl = eqn.params.get("impl")
    if impl is not None:
        return impl
    return _dtypes.key_impl(eqn.invars[0].aval.dtype)


def _impl_now(name: str, keys: np.ndarray, vect: bool):
    """The impl of the keys of the ``name`` equation being evaluated; called by hand (no equation), JAX's default
    impl when the key data has its shape."""
    eqn = _dtypes.equation_being_evaluated(name)
    if eqn is not None:
        return _impl_of(eqn)
    default = _default_impl()
    if keys.shape[keys.ndim - len(default.key_shape):] == tuple(default.key_shape) and keys.ndim >= 1 + vect:
        return default
    raise TypeError(f"spmdsim: {name} on key data of shape {keys.shape}: which PRNG implementation it belongs to is "
                    f"only known from its equation (evaluate the jaxpr, or call the rule's specialize(eqn))")


def _shape_dtype(x: np.ndarray):
    return jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype)


@functools.lru_cache(maxsize=1024)
def _lowered(impl, op: str, in_avals: tuple, params: tuple):
    """The jaxpr of what JAX lowers ``op`` of ``impl`` to, for physical operands of ``in_avals`` ((shape, dtype)
    pairs: key data, seeds, messages). Traced with 64-bit types on where an operand or the result is 64-bit (the
    evaluating thread need not be the one that enabled them)."""
    from spmdsim.jax._internals import jax_prng
    params = dict(params)
    shapes = [s for s, _ in in_avals]
    key_rank = len(impl.key_shape)
    if op == "seed":
        fn = jax_prng.iterated_vmap_unary(len(shapes[0]), impl.seed)
    elif op == "split":
        fn = jax_prng.iterated_vmap_unary(len(shapes[0]) - key_rank, lambda k: impl.split(k, params["shape"]))
    elif op == "fold_in":
        fn = jax_prng.iterated_vmap_binary_bcast(shapes[0][:len(shapes[0]) - key_rank], shapes[1], impl.fold_in)
    elif op == "bits":
        fn = jax_prng.iterated_vmap_unary(len(shapes[0]) - key_rank, lambda k: impl.random_bits(
            k, params["bit_width"], params["shape"]))
    else:
        raise AssertionError(op)
    wide = any(np.dtype(d).itemsize == 8 for _, d in in_avals) or params.get("bit_width") == 64
    with jax.enable_x64(wide):
        return jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, d) for s, d in in_avals))


def _through_jax(impl, op: str, *operands, **params):
    """``op`` of ``impl`` on one device's physical operands, evaluated from the jaxpr JAX lowers it to."""
    operands = [np.asarray(x) for x in operands]
    closed = _lowered(impl, op, tuple((x.shape, x.dtype) for x in operands),
                      tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in params.items())))
    return per_device_executor.eval_jaxpr(closed.jaxpr, closed.consts, operands)[0]


def _device_by_device(fn, *operands):
    """The vectorized form of a per-device ``fn``: each device's operands in turn, results stacked."""
    n = max(np.shape(x)[0] for x in operands)
    operands = [np.broadcast_to(x, (n, *np.shape(x)[1:])) for x in operands]
    return np.stack([np.asarray(fn(*(x[d] for x in operands))) for d in range(n)])


def _key_rule(name: str, threefry, op: str, key_operand: bool = True, **fixed):
    """Register both rules of key primitive ``name``: ``threefry(*operands, **params)`` for threefry2x32 keys (any
    leading batch axes, the device axis one of them), JAX's lowering of the impl's ``op`` for the others."""
    def compute(impl, vect, operands, params):
        if _is_threefry(impl):
            return threefry(*operands, vect=vect, **params)
        physical = {k: v for k, v in params.items() if k != "impl"}
        one = lambda *xs: _through_jax(impl, op, *xs, **physical)  # noqa: E731
        return _device_by_device(one, *operands) if vect else one(*operands)

    for vect, table in ((False, per_device), (True, vectorized)):
        def rule(*operands, _vect=vect, **params):
            impl = params.get("impl") or _impl_now(name, operands[0], _vect)
            return compute(impl, _vect, operands, params)

        def specialized(eqn, _vect=vect):
            impl, params = _impl_of(eqn), dict(eqn.params)
            return lambda *operands: compute(impl, _vect, operands, params)
        rule.specialize = specialized
        table(name)(rule)


@per_device("random_wrap")
@vectorized("random_wrap")
def _random_wrap(data, *, impl):
    return data


@per_device("random_unwrap")
@vectorized("random_unwrap")
def _random_unwrap(keys):
    return keys


def _fold_in_threefry(keys, msgs, *, vect):
    """fold_in of threefry2x32 keys: JAX broadcasts a key array and messages of equal ranks, or either of rank 0."""
    msgs, lead = np.asarray(msgs), int(vect)
    rank_keys, rank_msgs = keys.ndim - 1 - lead, msgs.ndim - lead
    if rank_keys < rank_msgs:
        keys = keys.reshape(keys.shape[:lead] + (1,) * (rank_msgs - rank_keys) + keys.shape[lead:])
    return fold_in(keys, expand_to(msgs, keys.ndim - 1))


_key_rule("random_seed", lambda seeds, *, impl, vect: seed(seeds), "seed")
_key_rule("random_split", lambda keys, *, shape, vect: split(keys, shape), "split")
_key_rule("random_fold_in", _fold_in_threefry, "fold_in")
_key_rule("random_bits", lambda keys, *, bit_width, shape, vect: random_bits(keys, bit_width, shape), "bits")


# -- jax.random.gamma ------------------------------------------------------------------------------------------

def _uniform01(keys: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """jax.random.uniform(key, (), dtype) for every key: the mantissa bits of a float in [1, 2), minus 1."""
    dtype = np.dtype(dtype)
    nbits, nmant = 8 * dtype.itemsize, {2: {np.dtype(np.float16): 10}.get(dtype, 7), 4: 23, 8: 52}[dtype.itemsize]
    rng_bits = 8 if nmant < 8 else nbits
    uint = np.dtype(f"u{nbits // 8}")
    bits = random_bits(keys, rng_bits, ()).astype(uint)
    float_bits = (bits >> np.asarray(rng_bits - nmant, uint)) | np.asarray(1.0, dtype).view(uint)
    return float_bits.view(dtype) - np.asarray(1, dtype)


class _Ops:
    """The float operations of the sampler in ``dtype`` as XLA:CPU computes them (multiply-adds as on this
    machine's ISA: :func:`._xla_cpu_math.multiply_add`; float16/bfloat16 rounded after every operation)."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.const = lambda v: np.asarray(v, self.dtype)  # noqa: E731

    def fma(self, a, b, c):
        return _xla_cpu_math.multiply_add(a, b, c, self.dtype)

    def __getattr__(self, name):  # log, log1p, sqrt, erf_inv, pow: the per-device rules themselves
        rule = PER_DEVICE[name]
        return lambda *xs: np.asarray(rule(*(np.asarray(x, self.dtype) for x in xs)), self.dtype)


def _normal(ops: _Ops, keys: np.ndarray) -> np.ndarray:
    """jax.random.normal(key, (), dtype) for every key: sqrt(2) erf_inv(u), u uniform in (-1, 1)."""
    lo = np.nextafter(np.asarray(-1, ops.dtype), np.asarray(0, ops.dtype)) if ops.dtype not in LOW_FLOATS else \
        PER_DEVICE["nextafter"](np.asarray(-1, ops.dtype), np.asarray(0, ops.dtype))
    hi = ops.const(1)
    u = np.maximum(lo, ops.fma(_uniform01(keys, ops.dtype), np.asarray(hi - lo, ops.dtype), lo))
    return np.asarray(ops.const(np.sqrt(2)) * ops.erf_inv(u), ops.dtype)


def gamma_samples(keys: np.ndarray, alpha: np.ndarray, log_space: bool) -> np.ndarray:
    """One sample per (key, alpha) pair, flat arrays: JAX's _gamma_one for every pair at once."""
    ops = _Ops(alpha.dtype)
    c_ = ops.const
    with np.errstate(all="ignore"):
        boost_mask = alpha >= c_(1)
        alpha_boosted = np.where(boost_mask, alpha, np.asarray(alpha + c_(1), ops.dtype))
        d = np.asarray(alpha_boosted - c_(1 / 3), ops.dtype)
        c = np.asarray(c_(1 / 3) * ops.rsqrt(d), ops.dtype)  # XLA rewrites a / sqrt(b) as a * rsqrt(b)
        pair = split(keys, (2,))
        key, subkey = pair[:, 0], pair[:, 1]
        X, V, U = np.zeros_like(alpha), np.ones_like(alpha), np.full_like(alpha, 2)

        def rejected(X, V, U):
            squeeze = U >= ops.fma(c_(-0.0331), np.asarray(X * X, ops.dtype), c_(1))
            tail = ops.log(U) >= np.asarray(X * c_(0.5) + np.asarray(d * np.asarray(
                np.asarray(c_(1) - V, ops.dtype) + ops.log(V), ops.dtype), ops.dtype), ops.dtype)
            return squeeze & tail

        active = rejected(X, V, U)
        while active.any():
            idx = np.flatnonzero(active)
            three = split(key[idx], (3,))
            key[idx] = three[:, 0]
            inner_key, x, v = three[:, 1], np.zeros(len(idx), ops.dtype), np.full(len(idx), -1, ops.dtype)
            c_active = c[idx]
            todo = v <= c_(0)
            while todo.any():
                j = np.flatnonzero(todo)
                two = split(inner_key[j], (2,))
                inner_key[j] = two[:, 0]
                x[j] = _normal(ops, two[:, 1])
                v[j] = ops.fma(x[j], c_active[j], c_(1))
                todo = v <= c_(0)
            X[idx] = np.asarray(x * x, ops.dtype)
            V[idx] = np.asarray(np.asarray(v * v, ops.dtype) * v, ops.dtype)
            U[idx] = _uniform01(three[:, 2], ops.dtype)
            active = rejected(X, V, U)

        if log_space:
            u = _uniform01(subkey, ops.dtype)
            log_samples = np.asarray(ops.log1p(np.asarray(-u, ops.dtype)), ops.dtype)  # -exponential
            log_boost = np.where(boost_mask | (log_samples == 0), c_(0),
                                 np.asarray(log_samples * np.asarray(c_(1) / alpha, ops.dtype), ops.dtype))
            return np.asarray(np.asarray(ops.log(d) + ops.log(V), ops.dtype) + log_boost, ops.dtype)
        samples = np.asarray(c_(1) - _uniform01(subkey, ops.dtype), ops.dtype)
        boost = np.where(boost_mask, c_(1), ops.pow(samples, np.asarray(c_(1) / alpha, ops.dtype)))
        return np.asarray(np.asarray(d * V, ops.dtype) * boost, ops.dtype)


def _gamma_threefry(keys, a, *, log_space):
    """JAX's _gamma_impl: each key split into as many keys as alphas it covers, then one sample per alpha."""
    key_batch = keys.shape[:-1]
    per_key = int(np.prod(a.shape[len(key_batch):], dtype=np.int64))
    sub = split(keys.reshape(-1, 2), (per_key,)).reshape(-1, 2)
    return gamma_samples(sub, np.asarray(a, a.dtype).reshape(-1).copy(), bool(log_space)).reshape(a.shape)


@functools.lru_cache(maxsize=256)
def _gamma_lowered(key_dtype, key_shape: tuple, a_shape: tuple, a_dtype, log_space: bool):
    """The jaxpr of JAX's CPU lowering of random_gamma (its _gamma_impl, a lax.map of _gamma_one over the keys for
    impls other than threefry2x32), on typed keys."""
    from spmdsim.jax._internals import random_core as jax_random_core
    fn = functools.partial(jax_random_core._gamma_impl, log_space=log_space, use_vmap=True)
    with jax.enable_x64(np.dtype(a_dtype).itemsize == 8):
        return jax.make_jaxpr(fn)(jax.ShapeDtypeStruct(key_shape, key_dtype), jax.ShapeDtypeStruct(a_shape, a_dtype))


def _gamma(key_dtype, vect: bool, keys, a, log_space):
    if key_dtype is None:  # called by hand: JAX's default impl, if the key data has its shape
        from spmdsim.jax._internals import jax_prng
        key_dtype = jax_prng.KeyTy(_default_impl())
        if keys.shape[keys.ndim - len(_dtypes.key_data_shape(key_dtype)):] != _dtypes.key_data_shape(key_dtype):
            raise TypeError(f"spmdsim: random_gamma on key data of shape {keys.shape}: which PRNG implementation it "
                            f"belongs to is only known from its equation")
    if _is_threefry(_dtypes.key_impl(key_dtype)):
        return _gamma_threefry(keys, a, log_space=log_space)
    key_rank = len(_dtypes.key_data_shape(key_dtype))

    def one(k, alpha):
        closed = _gamma_lowered(key_dtype, k.shape[:k.ndim - key_rank], alpha.shape, alpha.dtype, bool(log_space))
        return per_device_executor.eval_jaxpr(closed.jaxpr, closed.consts, [k, alpha])[0]
    return _device_by_device(one, keys, a) if vect else one(keys, a)


def _gamma_key_dtype(eqn):
    return eqn.invars[0].aval.dtype if eqn is not None and _dtypes.is_key(eqn.invars[0].aval.dtype) else None


for _vect, _table in ((False, per_device), (True, vectorized)):
    def _random_gamma(keys, a, *, log_space, _vect=_vect):
        """threefry2x32 keys: :func:`gamma_samples`; other impls: JAX's lowering, traced and evaluated."""
        return _gamma(_gamma_key_dtype(_dtypes.equation_being_evaluated("random_gamma")), _vect, keys, a, log_space)

    _random_gamma.specialize = lambda eqn, _vect=_vect: functools.partial(
        _gamma, _gamma_key_dtype(eqn), _vect, log_space=eqn.params["log_space"])
    _table("random_gamma")(_random_gamma)


# -- lax.rng_bit_generator: XLA's RngBitGenerator (Philox-4x32 on CPU by default, or Threefry) ----------------

_PHILOX_W = (np.uint32(0x9E3779B9), np.uint32(0xBB67AE85))
_PHILOX_M = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))


def philox4x32(x: list[np.ndarray], key: list[np.ndarray]) -> list[np.ndarray]:
    """Philox-4x32 with 10 rounds (Salmon et al. 2011), as XLA's prng library writes it."""
    k0, k1 = np.asarray(key[0], np.uint32), np.asarray(key[1], np.uint32)
    for _ in range(10):
        p0 = x[0].astype(np.uint64) * _PHILOX_M[0]
        p1 = x[2].astype(np.uint64) * _PHILOX_M[1]
        hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), p0.astype(np.uint32)
        hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), p1.astype(np.uint32)
        x = [hi1 ^ x[1] ^ k0, lo1, hi0 ^ x[3] ^ k1, lo0]
        k0 = ((k0.astype(np.uint64) + np.uint64(_PHILOX_W[0])) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        k1 = ((k1.astype(np.uint64) + np.uint64(_PHILOX_W[1])) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return x


def _words(u64) -> tuple[np.ndarray, np.ndarray]:
    u64 = np.asarray(u64, np.uint64)
    return u64.astype(np.uint32), (u64 >> np.uint64(32)).astype(np.uint32)


def _philox_bits(key64, counter_lo, counter_hi, count: int) -> tuple[list[np.ndarray], np.ndarray]:
    """For states (key, 128-bit counter (lo, hi)) of shape (B,): 4 words per counter step 0 .. ceil(count/4) - 1,
    each (B, steps); and the advanced counters' low words."""
    blocks = -(-count // 4)
    steps = np.arange(blocks, dtype=np.uint64)
    lo = counter_lo[:, None] + steps
    hi = np.where(lo < counter_lo[:, None], counter_hi[:, None] + np.uint64(1), counter_hi[:, None]).astype(np.uint64)
    x = [*_words(lo), *_words(hi)]
    key = [w[:, None] for w in _words(key64)]
    return philox4x32(x, key), counter_lo + np.uint64(blocks)


def _rng_philox(state: np.ndarray, shape, width: int) -> tuple[np.ndarray, np.ndarray]:
    """XLA's RNG_PHILOX for u64[2] states (shape (B, 2)): key state[0], 128-bit counter (state[1], state[0])."""
    count = int(np.prod(shape, dtype=np.int64))
    key64 = state[:, 0]
    if width == 64:
        bits, new_lo = _philox_bits(key64, state[:, 1], state[:, 0], 2 * count)
        pair = [bits[0].astype(np.uint64) | (bits[1].astype(np.uint64) << np.uint64(32)),
                bits[2].astype(np.uint64) | (bits[3].astype(np.uint64) << np.uint64(32))]
        values = np.stack(pair, axis=-1).reshape(len(state), -1)[:, :count]
    else:
        bits, new_lo = _philox_bits(key64, state[:, 1], state[:, 0], count)
        values = np.stack(bits, axis=-1).reshape(len(state), -1)[:, :count]
    return np.stack([key64, new_lo], axis=-1), values.reshape((len(state), *shape))


def _split_shape(shape):
    """XLA's SplitShapeIntoHalves: the first even dimension (else the largest) halved, with a new unit
    dimension after it."""
    if not shape:
        return (1,), 0, 0
    split = next((i for i, d in enumerate(shape) if d % 2 == 0), None)
    if split is None:
        split = int(np.argmax(shape))
    half = list(shape)
    half[split] = -(-shape[split] // 2)
    half.insert(split + 1, 1)
    return tuple(half), split, split + 1


def _rng_threefry(state: np.ndarray, shape, width: int) -> tuple[np.ndarray, np.ndarray]:
    """XLA's RNG_THREE_FRY for u64[2] states (shape (B, 2)): key state[0], 64-bit counter state[1]."""
    b = len(state)
    key = [w.reshape((b,) + (1,) * max(len(shape), 1)) for w in _words(state[:, 0])]
    if width == 64:
        count = int(np.prod(shape, dtype=np.int64))
        counters = state[:, 1:2] + np.arange(count, dtype=np.uint64)
        x0, x1 = threefry2x32(key[0].reshape(b, 1), key[1].reshape(b, 1), *_words(counters))
        values = (x0.astype(np.uint64) | (x1.astype(np.uint64) << np.uint64(32))).reshape((b, *shape))
        return np.stack([state[:, 0], state[:, 1] + np.uint64(count)], axis=-1), values
    half, split, concat = _split_shape(tuple(shape))
    count = int(np.prod(half, dtype=np.int64))
    counters = (state[:, 1:2] + np.arange(count, dtype=np.uint64)).reshape((b, *half))
    key = [w.reshape((b,) + (1,) * len(half)) for w in _words(state[:, 0])]
    x0, x1 = threefry2x32(key[0], key[1], *_words(counters))
    if not shape:
        values = x0.reshape(b)
    else:
        joined = np.concatenate([x0, x1], axis=concat + 1)
        dims = list(shape)
        dims[split] = dims[split] + dims[split] % 2
        values = joined.reshape((b, *dims))[(slice(None),) + tuple(slice(0, d) for d in shape)]
    return np.stack([state[:, 0], state[:, 1] + np.uint64(count)], axis=-1), values


def _rng_bit_generator_batch(keys, *, shape, dtype, algorithm, out_sharding=None):
    """Keys ``(B, 4)`` uint32 (JAX's form; or ``(B, 2)`` uint64) as XLA's u64[2] states; u8/u16 values come from
    u32 values, as JAX lowers them."""
    dtype = np.dtype(dtype)
    name = getattr(algorithm, "name", str(algorithm)).upper()
    b = keys.shape[0]
    state = np.asarray(keys, np.uint32, order="C").reshape(b, 2, 2).view(np.uint64).reshape(b, 2) \
        if keys.dtype == np.uint32 else np.asarray(keys, np.uint64)
    width = 64 if dtype.itemsize == 8 else 32
    generate = _rng_threefry if name.endswith("THREE_FRY") else _rng_philox  # RNG_DEFAULT is Philox on XLA:CPU
    with np.errstate(over="ignore"):  # 64-bit counters wrap
        new_state, values = generate(state, tuple(shape), width)
    new_keys = np.asarray(new_state, order="C").view(np.uint32).reshape(keys.shape) if keys.dtype == np.uint32 \
        else new_state
    return [new_keys.astype(keys.dtype), values.astype(dtype)]


@per_device("rng_bit_generator")
def _rng_bit_generator(key, **params):
    new_key, values = _rng_bit_generator_batch(key[None], **params)
    return [new_key[0], values[0]]


vectorized("rng_bit_generator")(_rng_bit_generator_batch)
