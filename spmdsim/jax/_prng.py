"""Threefry-2x32 random bits in NumPy, bit for bit with ``jax.random`` (partitionable threefry, JAX's default).

Key data is a uint32 array with a trailing axis of 2 (``random_wrap``/``random_unwrap`` are identities).
"""
from __future__ import annotations

import numpy as np

from spmdsim.jax._interpreter import impl

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotl(x, d):
    return (x << np.uint32(d)) | (x >> np.uint32(32 - d))


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash with 20 rounds (Salmon et al. 2011), on uint32 arrays."""
    k1, k2, x1, x2 = (np.asarray(a, dtype=np.uint32) for a in (k1, k2, x1, x2))
    ks = [k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA)]
    x = [x1 + ks[0], x2 + ks[1]]
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x[0] = x[0] + x[1]
            x[1] = _rotl(x[1], r) ^ x[0]
        x[0] = x[0] + ks[(block + 1) % 3]
        x[1] = x[1] + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x[0], x[1]


def _iota_2x32(shape):
    flat = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.uint64).reshape(shape)
    return (flat >> np.uint64(32)).astype(np.uint32), (flat & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _per_key(keys, fn):
    """Apply ``fn(key_pair)`` to every key of a key array (shape ``(..., 2)``)."""
    batch = keys.shape[:-1]
    outs = [fn(k) for k in keys.reshape(-1, 2)]
    return np.stack(outs).reshape((*batch, *outs[0].shape)) if outs else np.zeros((*batch, 2), np.uint32)


def split(key, shape):
    hi, lo = _iota_2x32(shape)
    b1, b2 = threefry2x32(key[0], key[1], hi, lo)
    return np.stack([b1, b2], axis=-1)


def fold_in(key, data):
    b1, b2 = threefry2x32(key[0], key[1], np.zeros(1, np.uint32), np.asarray([data], dtype=np.uint32))
    return np.concatenate([b1, b2])


def random_bits(key, bit_width, shape):
    hi, lo = _iota_2x32(shape)
    b1, b2 = threefry2x32(key[0], key[1], hi, lo)
    if bit_width == 64:
        return (b1.astype(np.uint64) << np.uint64(32)) | b2.astype(np.uint64)
    return (b1 ^ b2).astype(np.dtype(f"u{bit_width // 8}"))


def seed(value):
    v = int(value)
    return np.array([(v >> 32) & 0xFFFFFFFF if v >= 0 else 0, v & 0xFFFFFFFF], dtype=np.uint32)


@impl("threefry2x32")
def _threefry2x32(k1, k2, x1, x2):
    return list(threefry2x32(k1, k2, x1, x2))


@impl("random_wrap")
def _random_wrap(data, *, impl):
    return data


@impl("random_unwrap")
def _random_unwrap(keys):
    return keys


@impl("random_seed")
def _random_seed(seeds, *, impl):
    return np.stack([seed(s) for s in seeds.reshape(-1)]).reshape((*seeds.shape, 2))


@impl("random_split")
def _random_split(keys, *, shape):
    return _per_key(keys, lambda k: split(k, shape))


@impl("random_fold_in")
def _random_fold_in(keys, msgs):
    msgs = np.broadcast_to(msgs, keys.shape[:-1]).reshape(-1)
    flat = keys.reshape(-1, 2)
    return np.stack([fold_in(k, m) for k, m in zip(flat, msgs)]).reshape(keys.shape)


@impl("random_bits")
def _random_bits(keys, *, bit_width, shape):
    return _per_key(keys, lambda k: random_bits(k, bit_width, shape))
