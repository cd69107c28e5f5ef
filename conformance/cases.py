"""The case matrix: every collective x dtypes x ranks x axis sizes x groups x options, pmap's argument rules,
two named axes, and the error catalogue. Each case is built once against an abstract api (see harness)."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

from conformance.harness import Case

DTYPES = ["bool", "int8", "uint8", "int32", "float16", "bfloat16", "float32", "complex64"]
SIZES = [1, 2, 3, 8]
RANK_SHAPES = {0: (), 1: (5,), 2: (2, 3), 3: (2, 1, 3)}


def array(dtype: str, shape, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int8", "uint8"):
        return rng.integers(0, 100, shape).astype(dtype)       # sums over 8 devices wrap, as they should
    if dtype == "int32":
        return rng.integers(-1000, 1000, shape).astype(np.int32)
    if dtype == "complex64":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return rng.standard_normal(shape).astype(dt)


def mapped(n, dtype, block_shape, seed=0):
    return array(dtype, (n, *block_shape), seed)


def collective(op, **kw):
    """build(api) for ``pmap(lambda x: api.lax.<op>(x, 'i', **kw), axis_name='i')``."""
    return lambda api: api.pmap(lambda x: getattr(api.lax, op)(x, "i", **kw), axis_name="i")


CASES: dict[str, Case] = {}


def add(case: Case) -> None:
    assert case.id not in CASES, case.id
    CASES[case.id] = case


# -- reductions: every dtype, size and rank -----------------------------------------------------------------
for op, dtype, n, rank in itertools.product(["psum", "pmean", "pmax", "pmin"], DTYPES, SIZES, [0, 2]):
    add(Case(f"{op}-{dtype}-n{n}-r{rank}", op, collective(op), (mapped(n, dtype, RANK_SHAPES[rank], seed=n),),
             devices_needed=n))
for op, n, rank in itertools.product(["psum", "pmean", "pmax", "pmin"], SIZES, [1, 3]):
    add(Case(f"{op}-float32-n{n}-r{rank}", op, collective(op), (mapped(n, "float32", RANK_SHAPES[rank], seed=n),),
             devices_needed=n))

# -- all_gather ------------------------------------------------------------------------------------------
for dtype, n in itertools.product(DTYPES, SIZES):
    x = mapped(n, dtype, (2, 3), seed=n)
    add(Case(f"all_gather-{dtype}-n{n}-axis0", "all_gather", collective("all_gather"), (x,), devices_needed=n))
    add(Case(f"all_gather-{dtype}-n{n}-tiled1", "all_gather", collective("all_gather", axis=1, tiled=True), (x,),
             devices_needed=n))
for n, rank in itertools.product(SIZES, [0, 1, 3]):
    x = mapped(n, "float32", RANK_SHAPES[rank])
    add(Case(f"all_gather-float32-n{n}-r{rank}-axis-1", "all_gather", collective("all_gather", axis=-1), (x,),
             devices_needed=n))

# -- psum_scatter ----------------------------------------------------------------------------------------
for dtype, n in itertools.product(["int32", "float32", "float16", "int8"], SIZES):
    add(Case(f"psum_scatter-{dtype}-n{n}-d0", "psum_scatter", collective("psum_scatter"),
             (mapped(n, dtype, (n, 3)),), devices_needed=n))
    add(Case(f"psum_scatter-{dtype}-n{n}-d1", "psum_scatter", collective("psum_scatter", scatter_dimension=1),
             (mapped(n, dtype, (2, n)),), devices_needed=n))
    add(Case(f"psum_scatter-{dtype}-n{n}-tiled", "psum_scatter", collective("psum_scatter", tiled=True),
             (mapped(n, dtype, (2 * n, 3)),), devices_needed=n))

# -- all_to_all and pswapaxes ----------------------------------------------------------------------------
for dtype, n in itertools.product(["int32", "float32", "bool"], SIZES):
    for s, c in [(0, 0), (0, 1), (1, 0), (1, 2)]:
        shape = [2, 3, 2]
        shape[s] = n
        add(Case(f"all_to_all-{dtype}-n{n}-s{s}c{c}", "all_to_all", lambda api, s=s, c=c: api.pmap(
            lambda x: api.lax.all_to_all(x, "i", s, c), axis_name="i"), (mapped(n, dtype, shape),), devices_needed=n))
    add(Case(f"all_to_all-{dtype}-n{n}-tiled", "all_to_all", lambda api: api.pmap(
        lambda x: api.lax.all_to_all(x, "i", 0, 1, tiled=True), axis_name="i"), (mapped(n, dtype, (2 * n, 3)),),
        devices_needed=n))
    add(Case(f"pswapaxes-{dtype}-n{n}", "all_to_all", lambda api: api.pmap(
        lambda x: api.lax.pswapaxes(x, "i", 1), axis_name="i"), (mapped(n, dtype, (2, n)),), devices_needed=n))

# -- ppermute, pshuffle, axis_index ----------------------------------------------------------------------
for dtype, n in itertools.product(["int32", "float32", "bool", "bfloat16"], SIZES):
    perms = {"shift": [(i, (i + 1) % n) for i in range(n)], "partial": [(i, i + 1) for i in range(n - 1)],
             "empty": [], "reverse": [(i, n - 1 - i) for i in range(n)], "negative": [(-1, 0)]}
    for name, perm in perms.items():
        add(Case(f"ppermute-{dtype}-n{n}-{name}", "ppermute", collective("ppermute", perm=perm),
                 (mapped(n, dtype, (3,)),), devices_needed=n))
for n in SIZES:
    add(Case(f"pshuffle-n{n}", "ppermute", collective("pshuffle", perm=list(reversed(range(n)))),
             (mapped(n, "float32", (2,)),), devices_needed=n))
    add(Case(f"axis_index-n{n}", "axis_index", lambda api: api.pmap(lambda x: api.lax.axis_index("i") + 0 * x,
                                                                     axis_name="i"), (np.zeros(n, np.int32),),
             devices_needed=n))
    add(Case(f"axis_size-n{n}", "axis_index", lambda api: api.pmap(lambda x: x + api.lax.psum(1, "i"), axis_name="i"),
             (np.zeros(n, np.int32),), devices_needed=n))

# -- axis_index_groups -----------------------------------------------------------------------------------
GROUPS = {4: {"even": [[0, 1], [2, 3]], "reordered": [[3, 1], [0, 2]], "uneven": [[0], [1, 2, 3]]},
          8: {"even": [[0, 1, 2, 3], [4, 5, 6, 7]], "reordered": [[7, 5, 3, 1], [6, 4, 2, 0]],
              "uneven": [[0, 1, 2], [3, 4, 5, 6, 7]]},
          3: {"uneven": [[0], [1, 2]]}}
for n, kinds in GROUPS.items():
    for kind, groups in kinds.items():
        for op in ["psum", "pmean", "pmax", "pmin"]:
            add(Case(f"groups-{kind}-{op}-n{n}", "groups", collective(op, axis_index_groups=groups),
                     (mapped(n, "float32", (2,)),), devices_needed=n))
        g = len(groups[0])
        add(Case(f"groups-{kind}-all_gather-n{n}", "groups", collective("all_gather", axis_index_groups=groups),
                 (mapped(n, "float32", (2,)),), devices_needed=n))
        add(Case(f"groups-{kind}-psum_scatter-n{n}", "groups", collective("psum_scatter", axis_index_groups=groups),
                 (mapped(n, "float32", (g, 2)),), devices_needed=n))
        add(Case(f"groups-{kind}-all_to_all-n{n}", "groups", lambda api, groups=groups: api.pmap(
            lambda x: api.lax.all_to_all(x, "i", 0, 0, axis_index_groups=groups), axis_name="i"),
            (mapped(n, "float32", (g, 2)),), devices_needed=n))

# -- pmap's argument rules -------------------------------------------------------------------------------
X8 = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
A = "pmap-args"
add(Case("pmap-in_axes-tuple-none", A, lambda api: api.pmap(lambda x, c: x * c, in_axes=(0, None)),
         (X8, np.float32(3))))
add(Case("pmap-in_axes-1", A, lambda api: api.pmap(lambda x: x * 2, in_axes=1), (X8.T.copy(),)))
add(Case("pmap-in_axes-dict", A, lambda api: api.pmap(lambda d: d["a"] + d["b"], in_axes=({"a": 0, "b": None},)),
         ({"a": X8, "b": np.float32(1)},)))
add(Case("pmap-in_axes-nested", A, lambda api: api.pmap(lambda t: t[0][0] * t[0][1] + t[1],
                                                         in_axes=(((0, None), 1),)),
         (((X8, np.float32(2)), X8.T.copy()),)))
add(Case("pmap-in_axes-negative", A, lambda api: api.pmap(lambda x: x + 0, in_axes=-1),
         (np.arange(3 * 8, dtype=np.float32).reshape(3, 8),)))
add(Case("pmap-in_axes-negative-1d", A, lambda api: api.pmap(lambda x: x + 1, in_axes=-1), (X8[:, 0].copy(),)))
add(Case("pmap-out_axes-1", A, lambda api: api.pmap(lambda x: x * 2, out_axes=1), (X8,), out_axis=1))
add(Case("pmap-out_axes-none-psum", A, lambda api: api.pmap(lambda x: api.lax.psum(x, "i"), "i", out_axes=None),
         (X8,), out_axis=None))
add(Case("pmap-out_axes-none-device0", A, lambda api: api.pmap(lambda x: x * 10, out_axes=None), (X8,), out_axis=None))
add(Case("pmap-out_axes-tuple", A, lambda api: api.pmap(lambda x: (x, api.lax.pmax(x, "i")), "i", out_axes=(0, None)),
         (X8,), out_axis=None))
add(Case("pmap-out_axes-dict", A, lambda api: api.pmap(lambda x: {"b": x, "a": x.sum()}, out_axes={"a": 0, "b": 1}),
         (X8,), out_axis=None))
add(Case("pmap-out_axes-negative", A, lambda api: api.pmap(lambda x: x * 1, out_axes=-1), (X8,), out_axis=None))
add(Case("pmap-out_axes-scalar-negative", A, lambda api: api.pmap(lambda x: x.sum(), out_axes=-1), (X8,)))
add(Case("pmap-kwargs", A, lambda api: api.pmap(lambda x, y: x + y, in_axes=(None,)), (np.float32(1),),
         front_ends=()))  # kwargs are exercised below with a wrapper
add(Case("pmap-kwargs-mapped", A, lambda api: (lambda f: lambda x: f(np.float32(1), y=x))(
    api.pmap(lambda c, y: c + y, in_axes=(None,))), (X8,)))
add(Case("pmap-static", A, lambda api: (lambda f: lambda x: f(x, 3))(
    api.pmap(lambda x, k: x * k, static_broadcasted_argnums=1)), (X8,)))
add(Case("pmap-static-tuple-in_axes", A, lambda api: (lambda f: lambda x: f(x, "double", 2.0))(
    api.pmap(lambda x, mode, c: x * c if mode == "double" else x, in_axes=(0, None, None),
             static_broadcasted_argnums=(1,))), (X8,)))
add(Case("pmap-axis_size", A, lambda api: api.pmap(lambda x: x + 1, axis_size=8), (X8,)))
add(Case("pmap-devices-prefix", A, lambda api: api.pmap(lambda x: api.lax.axis_index("i") + 0 * x.astype(np.int32), "i",
                                                         devices=(__import__("jax").devices() if api.name == "jax"
                                                                  else __import__("spmdsim").devices())[::-1][:4]),
         (np.zeros((4,), np.float32),)))
add(Case("pmap-constant-output", A, lambda api: api.pmap(lambda x: (x, 3.0)), (X8,), out_axis=None))
add(Case("pmap-none-output", A, lambda api: api.pmap(lambda x: (x, None)), (X8,), out_axis=None))
add(Case("pmap-unmapped-psum", A, lambda api: api.pmap(lambda x, c: api.lax.psum(c, "i") + 0 * x, "i",
                                                        in_axes=(0, None)), (X8, np.float32(2.5))))
add(Case("pmap-unmapped-all_gather", A, lambda api: api.pmap(lambda x, c: api.lax.all_gather(c, "i"), "i",
                                                              in_axes=(0, None)), (X8, np.arange(3, dtype=np.int32))))
add(Case("pmap-size-3", A, lambda api: api.pmap(lambda x: api.lax.psum(x, "i"), "i"), (X8[:3],)))
add(Case("pmap-size-7", A, lambda api: api.pmap(lambda x: api.lax.pmean(x, "i"), "i"), (X8[:7],)))
add(Case("pmap-bool-in-out", A, lambda api: api.pmap(lambda x: x > 4), (X8,)))

class Pair:
    """A custom pytree node, registered with JAX (for jax.pmap and spmdsim.jax) and with spmdsim (for
    spmdsim.pmap)."""

    def __init__(self, a, b):
        self.a, self.b = a, b


def _register_pair():
    import jax

    import spmdsim
    flatten, unflatten = (lambda p: ((p.a, p.b), None)), (lambda _, children: Pair(*children))
    jax.tree_util.register_pytree_node(Pair, flatten, unflatten)
    spmdsim.register_pytree_node(Pair, flatten, unflatten)


_register_pair()
add(Case("pmap-in_axes-custom-pytree", A, lambda api: api.pmap(lambda p: Pair(p.a * 2, p.b + p.a.sum()),
                                                                in_axes=(Pair(0, None),), out_axes=Pair(0, 0)),
         (Pair(X8, np.float32(5)),), out_axis=None))
add(Case("pmap-custom-pytree-psum", A, lambda api: api.pmap(lambda p: api.lax.psum(p, "i"), "i"),
         (Pair(X8, X8[:, 0].copy()),)))

# -- two named axes: pmap(vmap(f, axis_name='j'), axis_name='i') -------------------------------------------
X24 = np.arange(2 * 4, dtype=np.float32).reshape(2, 4)
T = "two-axes"


def two_axes(body):
    return lambda api: api.pmap(api.vmap(lambda v: body(api, v), axis_name="j"), axis_name="i")


for name, body in {
    "psum-j": lambda api, v: api.lax.psum(v, "j"), "psum-i": lambda api, v: api.lax.psum(v, "i"),
    "psum-ij": lambda api, v: api.lax.psum(v, ("i", "j")), "psum-ji": lambda api, v: api.lax.psum(v, ("j", "i")),
    "pmean-ij": lambda api, v: api.lax.pmean(v, ("i", "j")), "pmax-i": lambda api, v: api.lax.pmax(v, "i"),
    "pmin-j": lambda api, v: api.lax.pmin(v, "j"),
    "axis_index-ij": lambda api, v: api.lax.axis_index(("i", "j")) + 0 * v.astype(np.int32),
    "axis_index-ji": lambda api, v: api.lax.axis_index(("j", "i")) + 0 * v.astype(np.int32),
    "ppermute-j": lambda api, v: api.lax.ppermute(v, "j", [(0, 1), (1, 2), (2, 3), (3, 0)]),
    "ppermute-i": lambda api, v: api.lax.ppermute(v, "i", [(0, 1), (1, 0)]),
    "all_gather-j": lambda api, v: api.lax.all_gather(v, "j"),
    "all_gather-i": lambda api, v: api.lax.all_gather(v, "i"),
    "shadow": None,
}.items():
    if body is None:
        continue
    add(Case(f"two-axes-{name}", T, two_axes(body), (X24,)))
add(Case("two-axes-shadow", T, lambda api: api.pmap(api.vmap(lambda v: api.lax.psum(v, "i"), axis_name="i"),
                                                    axis_name="i"), (X24,)))
add(Case("two-axes-all_gather-both", T, two_axes(lambda api, v: api.lax.all_gather(v, ("i", "j"))), (X24,)))
add(Case("two-axes-psum_scatter-j", T, two_axes(lambda api, v: api.lax.psum_scatter(v, "j")),
         (np.arange(2 * 4 * 4, dtype=np.float32).reshape(2, 4, 4),)))
add(Case("two-axes-all_to_all-ij", T, two_axes(lambda api, v: api.lax.all_to_all(v, ("i", "j"), 0, 0)),
         (np.arange(2 * 4 * 8, dtype=np.float32).reshape(2, 4, 8),)))
add(Case("nested-pmap", T, lambda api: api.pmap(api.pmap(lambda v: api.lax.psum(v, "i"), axis_name="j"),
                                                 axis_name="i"), (X24,), front_ends=("numpy",)))

# -- the error catalogue: same exception class as JAX ----------------------------------------------------
E = "errors"
Z4 = np.zeros(4, np.float32)
for name, build, args, phrase in [
    ("unbound-psum", collective("psum") if False else (lambda api: api.pmap(lambda x: api.lax.psum(x, "j"), "i")),
     (Z4,), "unbound axis name: j"),
    ("unbound-pmax", lambda api: api.pmap(lambda x: api.lax.pmax(x, "j"), "i"), (Z4,), "unbound axis name: j"),
    ("unbound-all_gather", lambda api: api.pmap(lambda x: api.lax.all_gather(x, "j"), "i"), (Z4,),
     "unbound axis name: j"),
    ("unbound-ppermute", lambda api: api.pmap(lambda x: api.lax.ppermute(x, "j", []), "i"), (Z4,),
     "unbound axis name: j"),
    ("unbound-axis_index", lambda api: api.pmap(lambda x: api.lax.axis_index("j") + x, "i"), (Z4,),
     "unbound axis name: j"),
    ("unbound-no-axis-name", lambda api: api.pmap(lambda x: api.lax.psum(x, "batch")), (Z4,),
     "unbound axis name: batch"),
    ("no-mapped-argument", lambda api: api.pmap(lambda x: x, in_axes=None), (Z4,),
     "requires at least one argument with a mapped axis"),
    ("no-mapped-argument-axis_size", lambda api: api.pmap(lambda x: x, in_axes=None, axis_size=4), (Z4,),
     "requires at least one argument with a mapped axis"),
    ("empty-dict", lambda api: api.pmap(lambda d: d), ({},), "requires at least one argument with a mapped axis"),
    ("axis_size-mismatch", lambda api: api.pmap(lambda x: x, axis_size=3), (Z4,),
     "Specified axis_size 3 doesn't match received axis_size 4"),
    ("size-mismatch-indivisible", lambda api: api.pmap(lambda a, b: a), (Z4, np.zeros(3, np.float32)), None),
    ("size-mismatch-multiple", lambda api: api.pmap(lambda a, b: a), (np.zeros(2, np.float32), Z4), None),
    ("too-many-rows-9", lambda api: api.pmap(lambda x: x), (np.zeros(9, np.float32),), None),
    ("too-many-rows-16", lambda api: api.pmap(lambda x: x), (np.zeros(16, np.float32),), None),
    ("scalar-mapped", lambda api: api.pmap(lambda a, b: a), (Z4, np.float32(1)), None),
    ("in_axes-not-prefix", lambda api: api.pmap(lambda a, b: b, in_axes=((0, 0, 0), 0)), ((Z4, Z4), Z4),
     "pytree structure error"),
    ("in_axes-list", lambda api: api.pmap(lambda a, b: b, in_axes=[0, None]), (Z4, Z4), None),
    ("static-by-keyword", lambda api: (lambda f: lambda x: f(x, s=1))(api.pmap(lambda x, s: x,
                                                                               static_broadcasted_argnums=1)),
     (Z4,), "All static broadcasted arguments must be passed positionally"),
    ("static-unhashable", lambda api: (lambda f: lambda x: f(x, [1]))(api.pmap(lambda x, s: x,
                                                                             static_broadcasted_argnums=1)),
     (Z4,), "Non-hashable static arguments are not supported"),
    ("repeated-axis", lambda api: api.pmap(lambda x: api.lax.psum(x, ("i", "i")), "i"), (Z4,), "repeated axis"),
    ("groups-not-a-cover", collective("psum", axis_index_groups=[[0, 1], [1, 2, 3]]), (Z4,),
     "axis_index_groups must cover all indices exactly once"),
    ("groups-positional", lambda api: api.pmap(lambda x: api.lax.psum(x, ("i", 0), axis_index_groups=[[0, 1], [2, 3]]),
                                               "i"), (np.zeros((4, 2), np.float32),), "just named axes"),
    ("ppermute-duplicate", collective("ppermute", perm=[(0, 1), (0, 2)]), (Z4,),
     "ppermute sources and destinations must be unique"),
    ("ppermute-out-of-range", collective("ppermute", perm=[(0, 5)]), (Z4,), None),
    ("pshuffle-not-permutation", collective("pshuffle", perm=[1, 1, 2, 3]), (Z4,),
     "does not represent a permutation"),
    ("psum_scatter-size", collective("psum_scatter"), (np.zeros((4, 3), np.float32),),
     "scatter dimension size 3 must match shard count 4"),
    ("psum_scatter-tiled-size", collective("psum_scatter", tiled=True), (np.zeros((4, 6), np.float32),),
     "must be divisible by shard_count 4"),
    ("psum_scatter-bool", collective("psum_scatter"), (np.zeros((4, 4), bool),), None),
    ("all_to_all-size", lambda api: api.pmap(lambda x: api.lax.all_to_all(x, "i", 0, 0), "i"),
     (np.zeros((4, 3), np.float32),), "they are 4 and 3 respectively"),
    ("all_to_all-tiled-size", lambda api: api.pmap(lambda x: api.lax.all_to_all(x, "i", 0, 0, tiled=True), "i"),
     (np.zeros((4, 6), np.float32),), "has to be divisible by the size of the named axis"),
    ("all_gather-axis-out-of-bounds", collective("all_gather", axis=2), (np.zeros((4, 3), np.float32),), None),
    ("all_gather-tiled-scalar", collective("all_gather", tiled=True), (Z4,), None),
    ("in_axes-bool", lambda api: api.pmap(lambda x: x, in_axes=False), (Z4,), "in_axes must be an int, None, or"),
    ("out_axes-float", lambda api: api.pmap(lambda x: x, out_axes=0.0), (Z4,), "out_axes must be an int, None, or"),
    ("devices-empty", lambda api: api.pmap(lambda x: x, devices=[]), (Z4,), "must be non-empty"),
    ("string-output", lambda api: api.pmap(lambda x: "a"), (Z4,), None),
    ("groups-partial-cover", collective("psum", axis_index_groups=[[0, 1]]), (Z4,), None),
]:
    add(Case(f"error-{name}", E, build, args, phrase=phrase, jax_may_abort=name == "repeated-axis"))

# -- documented differences (xfail) ----------------------------------------------------------------------
add(Case("psum_scatter-negative-dimension", "psum_scatter", collective("psum_scatter", scatter_dimension=-1),
         (np.ones((4, 3, 4), np.float32),), devices_needed=4))
add(Case("pbroadcast-cpu", "ppermute", collective("pbroadcast", source=1), (np.arange(4, dtype=np.float32),),
         devices_needed=4))
