"""The shard_map case matrix: array layouts over meshes (8,), (4, 2), (2, 2, 2); every collective over one
axis, a tuple of axes (both orders) and all axes; replicated outputs; check_vma on and off; VMA typing; grad
through collectives; jit; nesting and ``axis_names``; explicit axis types; the error catalogue; the
collectives XLA:CPU cannot run (with their documented results).

Each case is built once against the abstract ``api`` of ``conformance/shard_map_harness.py``. Every case was
run against real ``jax.shard_map`` (jax 0.10.2, 8 CPU devices) by ``conformance/shard_map_real_jax_check.py``:
it returns a result, or raises the class named in ``raises``. The facts behind the cases, with JAX's exact
messages, are in ``docs/notes/shard_map_jax_0_10_2.md``.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from conformance import shard_map_reference as ref
from conformance.shard_map_harness import JAX_FRONT_ENDS, ShardMapCase

CASES: dict[str, ShardMapCase] = {}


def add(case: ShardMapCase) -> None:
    assert case.id not in CASES, case.id
    CASES[case.id] = case


# -- meshes, axis choices, inputs ------------------------------------------------------------------------
MESHES = {"8": ((8,), ("i",)), "4x2": ((4, 2), ("x", "y")), "2x2x2": ((2, 2, 2), ("x", "y", "z"))}
# The axis_name arguments tried on each mesh: every single axis, tuples in mesh order and out of it, all axes.
AXES = {
    "8": ["i", ("i",)],
    "4x2": ["x", "y", ("x", "y"), ("y", "x")],
    "2x2x2": ["x", "y", "z", ("x", "y"), ("y", "z"), ("z", "x"), ("x", "y", "z"), ("z", "y", "x"),
              ("y", "x", "z")],
}


def label(axes) -> str:
    """'x' for the name, '(x+y)' for a tuple (also a 1-tuple: '(i)')."""
    return "(" + "+".join(axes) + ")" if isinstance(axes, tuple) else axes


def spec_label(spec: tuple) -> str:
    parts = []
    for p in spec:
        parts.append("_" if p is None else "(" + "+".join(p) + ")" if isinstance(p, tuple) else p)
    return "P(" + ",".join(parts) + ")"


def axis_sizes(mesh_key: str) -> dict:
    shape, names = MESHES[mesh_key]
    return dict(zip(names, shape))


def group_size(mesh_key: str, axes) -> int:
    sizes = axis_sizes(mesh_key)
    return math.prod(sizes[a] for a in (axes if isinstance(axes, tuple) else (axes,)))


def ints(shape, seed=0, low=-9, high=10, dtype=np.float32) -> np.ndarray:
    """Small integers stored as ``dtype``: float sums are then exact in any order."""
    return np.random.default_rng(seed).integers(low, high, shape).astype(dtype)


def array(dtype: str, shape, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int8", "uint8"):
        return rng.integers(0, 100, shape).astype(dtype)      # sums over 8 devices wrap, as they should
    if dtype == "int32":
        return rng.integers(-1000, 1000, shape).astype(np.int32)
    if dtype == "complex64":
        return (rng.integers(-9, 10, shape) + 1j * rng.integers(-9, 10, shape)).astype(np.complex64)
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return rng.integers(-9, 10, shape).astype(dt)


def mesh_of(api, mesh_key):
    shape, names = MESHES[mesh_key]
    return api.mesh(shape, names)


def per_device(mesh_key, body, *, check_vma=True, out=None):
    """build(api) for the standard collective case: the input ``X`` of shape ``(N, *block)`` gives device d
    (row-major mesh order) the row ``X[d]``; ``body(api, row)`` runs per device; its result comes back as
    row d of the output (``out_specs=P(all axes)``), or, with ``out`` (a tuple of mesh axes), as the
    replicated result assembled by ``P(out)`` (``out=()``: ``P()``, the result itself)."""
    _, names = MESHES[mesh_key]

    def build(api):
        def f(b):
            r = body(api, b[0])
            return r if out == () else r[None]
        out_spec = api.P(names) if out is None else api.P(out) if out else api.P()
        return api.shard_map(f, mesh=mesh_of(api, mesh_key), in_specs=api.P(names), out_specs=out_spec,
                             check_vma=check_vma)
    return build


def remaining(mesh_key, axes) -> tuple:
    """The mesh axes (in mesh order) a collective over ``axes`` leaves the result varying over."""
    _, names = MESHES[mesh_key]
    axes = axes if isinstance(axes, tuple) else (axes,)
    return tuple(n for n in names if n not in axes)


# ==========================================================================================================
# 1. layout: how a PartitionSpec lays an array over a mesh
# ==========================================================================================================
LAYOUT_SPECS = {
    "8": ((8, 16), [(), ("i",), (None, "i"), (("i",),), ("i", None)]),
    "4x2": ((8, 8), [(), ("x",), ("y",), (None, "x"), (None, "y"), ("x", "y"), ("y", "x"), (("x", "y"),),
                     (("y", "x"),), (None, ("x", "y")), (None, ("y", "x")), (("x", "y"), None), ("x", None)]),
    "2x2x2": ((4, 4, 8), [(), ("x",), (None, "z"), ("x", "y", "z"), ("z", "y", "x"), (("x", "y"), "z"),
                          (("z", "x"), "y"), (None, None, ("x", "y", "z")), (None, None, ("z", "y", "x")),
                          ("y", ("x", "z")), (("y", "z"), None, "x")]),
}


def mentions_all(mesh_key, spec) -> bool:
    _, names = MESHES[mesh_key]
    used = {n for p in spec if p is not None for n in (p if isinstance(p, tuple) else (p,))}
    return used == set(names)


def local_shape(mesh_key, global_shape, spec):
    sizes = axis_sizes(mesh_key)
    shape = list(global_shape)
    for d, p in enumerate(spec):
        if p is not None:
            shape[d] //= math.prod(sizes[a] for a in (p if isinstance(p, tuple) else (p,)))
    return tuple(shape)


A = "shard_map/layout"
for mesh_key, (gshape, specs) in LAYOUT_SPECS.items():
    n = math.prod(MESHES[mesh_key][0])
    names = MESHES[mesh_key][1]
    x = np.arange(math.prod(gshape), dtype=np.float32).reshape(gshape)
    for spec in specs:
        s = spec_label(spec)
        # which block each device sees: row d of the output is device d's block, flattened
        mm = ref.MeshModel(*MESHES[mesh_key])
        add(ShardMapCase(
            f"layout-in-{mesh_key}-{s}", A,
            lambda api, mk=mesh_key, spec=spec, names=names: api.shard_map(
                lambda b: b.reshape(1, -1), mesh=mesh_of(api, mk), in_specs=api.P(*spec),
                out_specs=api.P(names)), (x,),
            expected=lambda x, mm=mm, spec=spec: np.stack([b.reshape(-1) for b in ref.split(x, mm, spec)])))
        # split and reassemble with the same spec (unmentioned axes: replicated in and out)
        add(ShardMapCase(
            f"layout-roundtrip-{mesh_key}-{s}", A,
            lambda api, mk=mesh_key, spec=spec: api.shard_map(
                lambda b: b * 2 + 1, mesh=mesh_of(api, mk), in_specs=api.P(*spec), out_specs=api.P(*spec)),
            (x,), expected=lambda x, mm=mm, spec=spec: ref.assemble([b * 2 + 1 for b in ref.split(x, mm, spec)],
                                                                    mm, spec)))
        if mentions_all(mesh_key, spec):
            # how out_specs assembles: device d returns the block X[d] (shape = the local shape)
            blocks = np.arange(n * math.prod(local_shape(mesh_key, gshape, spec)), dtype=np.float32).reshape(
                n, *local_shape(mesh_key, gshape, spec))
            add(ShardMapCase(
                f"layout-out-{mesh_key}-{s}", A,
                lambda api, mk=mesh_key, spec=spec, names=names: api.shard_map(
                    lambda b: b[0], mesh=mesh_of(api, mk), in_specs=api.P(names), out_specs=api.P(*spec)),
                (blocks,), expected=lambda blocks, mm=mm, spec=spec: ref.assemble(list(blocks), mm, spec)))
# two arguments with different specs, a pytree argument, a prefix spec for a tuple argument
add(ShardMapCase("layout-two-args-4x2", A, lambda api: api.shard_map(
    lambda a, b: a + b.sum(), mesh=mesh_of(api, "4x2"), in_specs=(api.P("x", "y"), api.P("y")),
    out_specs=api.P("x", "y")), (np.arange(64, dtype=np.float32).reshape(8, 8), np.arange(4, dtype=np.float32))))
add(ShardMapCase("layout-prefix-spec-tuple-arg", A, lambda api: api.shard_map(
    lambda t: t[0] * t[1], mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x")),
    ((np.arange(8, dtype=np.float32), np.arange(8, dtype=np.float32) + 1),)))
add(ShardMapCase("layout-dict-arg-and-output", A, lambda api: api.shard_map(
    lambda d: {"sum": d["a"] + d["b"], "a": d["a"]}, mesh=mesh_of(api, "4x2"),
    in_specs=({"a": api.P("x"), "b": api.P()},), out_specs={"sum": api.P("x"), "a": api.P("x")}),
    ({"a": np.arange(8, dtype=np.float32), "b": np.float32(100)},)))
add(ShardMapCase("layout-out-prefix-for-tuple-output", A, lambda api: api.shard_map(
    lambda a: (a, a + 1), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x")),
    (np.arange(8, dtype=np.float32),)))
add(ShardMapCase("layout-none-output-leaf", A, lambda api: api.shard_map(
    lambda a: (a, None), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x")),
    (np.arange(8, dtype=np.float32),)))
add(ShardMapCase("layout-int32-bool-passthrough", A, lambda api: api.shard_map(
    lambda a, b: (a * 2, b), mesh=mesh_of(api, "2x2x2"), in_specs=(api.P("x", "y"), api.P(("x", "y", "z"))),
    out_specs=(api.P("x", "y"), api.P(("x", "y", "z")))),
    (np.arange(16, dtype=np.int32).reshape(4, 4), np.arange(8) % 3 == 0)))
add(ShardMapCase("layout-scalar-replicated-arg", A, lambda api: api.shard_map(
    lambda a, c: a * c, mesh=mesh_of(api, "8"), in_specs=(api.P("i"), api.P()), out_specs=api.P("i")),
    (np.arange(8, dtype=np.float32), np.float32(3))))
add(ShardMapCase("layout-mesh-subset-4-devices", A, lambda api: api.shard_map(
    lambda a: a + api.lax.axis_index("x").astype(api.numpy.float32), mesh=api.mesh((2, 2), ("x", "y")),
    in_specs=api.P("x", "y"), out_specs=api.P("x", "y")), (np.zeros((4, 4), np.float32),), devices_needed=4))
add(ShardMapCase("layout-mesh-2x4", A, lambda api: api.shard_map(
    lambda a: a.reshape(1, -1), mesh=api.mesh((2, 4), ("x", "y")), in_specs=api.P(None, ("y", "x")),
    out_specs=api.P(("x", "y"))), (np.arange(32, dtype=np.float32).reshape(4, 8),)))
add(ShardMapCase("layout-size-one-mesh-axis", A, lambda api: api.shard_map(
    lambda a: api.lax.psum(a, "z"), mesh=api.mesh((8, 1), ("x", "z")), in_specs=api.P("x", "z"),
    out_specs=api.P("x")), (np.arange(16, dtype=np.float32).reshape(8, 2),)))
add(ShardMapCase("layout-zero-size", A, lambda api: api.shard_map(
    lambda a: a * 2, mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x")),
    (np.zeros((0, 3), np.float32),)))

# ==========================================================================================================
# 2. every collective over one axis, a tuple of axes (both orders) and all axes of the three meshes
# ==========================================================================================================
def shift_perm(n):
    return [(j, (j + 1) % n) for j in range(n)]


OPS = {
    # name: (area, block shape from the group size n, body(api, v, axes, n),
    #        (reference op, its parameters from n) for conformance/shard_map_reference.py)
    "psum": ("psum", lambda n: (3,), lambda api, v, a, n: api.lax.psum(v, a), ("psum", lambda n: {})),
    "pmean": ("pmean", lambda n: (3,), lambda api, v, a, n: api.lax.pmean(v, a), ("pmean", lambda n: {})),
    "pmax": ("pmax", lambda n: (3,), lambda api, v, a, n: api.lax.pmax(v, a), ("pmax", lambda n: {})),
    "pmin": ("pmin", lambda n: (3,), lambda api, v, a, n: api.lax.pmin(v, a), ("pmin", lambda n: {})),
    "all_gather": ("all_gather", lambda n: (2, 3), lambda api, v, a, n: api.lax.all_gather(v, a),
                   ("all_gather", lambda n: {})),
    "all_gather-tiled-axis1": ("all_gather", lambda n: (2, 3),
                               lambda api, v, a, n: api.lax.all_gather(v, a, axis=1, tiled=True),
                               ("all_gather", lambda n: {"axis": 1, "tiled": True})),
    "all_gather-invarying": ("all_gather", lambda n: (2,),
                             lambda api, v, a, n: api.lax.all_gather(v, a, to="invarying"),
                             ("all_gather", lambda n: {})),
    "psum_scatter": ("psum_scatter", lambda n: (n, 3), lambda api, v, a, n: api.lax.psum_scatter(v, a),
                     ("psum_scatter", lambda n: {})),
    "psum_scatter-tiled-d1": ("psum_scatter", lambda n: (2, 2 * n),
                              lambda api, v, a, n: api.lax.psum_scatter(v, a, scatter_dimension=1, tiled=True),
                              ("psum_scatter", lambda n: {"scatter_dimension": 1, "tiled": True})),
    "all_to_all-s0c0": ("all_to_all", lambda n: (n, 3), lambda api, v, a, n: api.lax.all_to_all(v, a, 0, 0),
                        ("all_to_all", lambda n: {"split_axis": 0, "concat_axis": 0})),
    "all_to_all-s0c1": ("all_to_all", lambda n: (n, 3), lambda api, v, a, n: api.lax.all_to_all(v, a, 0, 1),
                        ("all_to_all", lambda n: {"split_axis": 0, "concat_axis": 1})),
    "all_to_all-tiled-s0c1": ("all_to_all", lambda n: (2 * n, 3),
                              lambda api, v, a, n: api.lax.all_to_all(v, a, 0, 1, tiled=True),
                              ("all_to_all", lambda n: {"split_axis": 0, "concat_axis": 1, "tiled": True})),
    "ppermute-shift": ("ppermute", lambda n: (3,), lambda api, v, a, n: api.lax.ppermute(v, a, shift_perm(n)),
                       ("ppermute", lambda n: {"perm": shift_perm(n)})),
    "ppermute-partial": ("ppermute", lambda n: (3,),
                         lambda api, v, a, n: api.lax.ppermute(v, a, partial_perm(n)),
                         ("ppermute", lambda n: {"perm": partial_perm(n)})),
    "pshuffle-rotate": ("ppermute", lambda n: (3,),
                        lambda api, v, a, n: api.lax.pshuffle(v, a, [(j + 1) % n for j in range(n)]),
                        ("pshuffle", lambda n: {"perm": [(j + 1) % n for j in range(n)]})),
    "axis_index": ("axis_index", lambda n: (1,),
                   lambda api, v, a, n: api.lax.axis_index(a) + 0 * v.astype(api.numpy.int32), None),
    "axis_size": ("axis_index", lambda n: (1,),
                  lambda api, v, a, n: api.lax.axis_size(a) + 0 * v.astype(api.numpy.int32), None),
}


def partial_perm(n):
    return [(0, n - 1), (n - 1, 1 % n)] if n > 2 else [(0, 1)]


def reference_rows(mesh_key, op, axes, params, out=None, post=None):
    """``expected(x)`` for a per_device case: the reference collective on the rows of ``x``, assembled as
    per_device assembles them."""
    mm = ref.MeshModel(*MESHES[mesh_key])

    def expected(x):
        results = ref.collective(op, list(x), mm, axes, **params)
        if post is not None:
            results = [post(r, row) for r, row in zip(results, x)]
        if out is None:
            return np.stack(results)
        if out == ():
            return ref.assemble(results, mm, ())
        return ref.assemble([np.asarray(r)[None] for r in results], mm, (out,))
    return expected


def op_reference(op, mesh_key, axes, n, out=None):
    if op == "axis_index":
        return reference_rows(mesh_key, "axis_index", axes, {}, out,
                              post=lambda r, row: (r + 0 * row.astype(np.int32)).astype(np.int32))
    if op == "axis_size":
        return reference_rows(mesh_key, "axis_size", axes, {}, out,
                              post=lambda r, row: (r + 0 * row.astype(np.int32)).astype(np.int32))
    ref_op, params = OPS[op][3]
    return reference_rows(mesh_key, ref_op, axes, params(n), out)


MESH_ORDER_NOTE = ("ppermute/pshuffle over a tuple of axes index the group in MESH order, whatever order the "
                   "tuple is given in (axis_index, all_gather, psum_scatter, all_to_all use the given order)")

for mesh_key, axes_list in AXES.items():
    n_dev = math.prod(MESHES[mesh_key][0])
    for axes in axes_list:
        n = group_size(mesh_key, axes)
        out_of_order = isinstance(axes, tuple) and list(axes) != [a for a in MESHES[mesh_key][1] if a in axes]
        for op, (area, block, body, _) in OPS.items():
            x = ints((n_dev, *block(n)), seed=len(CASES))
            note = MESH_ORDER_NOTE if out_of_order and op.startswith(("ppermute", "pshuffle")) else ""
            add(ShardMapCase(f"{op}-{mesh_key}-{label(axes)}", f"shard_map/{area}",
                             per_device(mesh_key, lambda api, v, body=body, a=axes, n=n: body(api, v, a, n)),
                             (x,), note=note, expected=op_reference(op, mesh_key, axes, n)))
        # replicated outputs: a reduction's result is invariant over the reduced axes, so out_specs may
        # leave them out (P() when every axis is reduced); check_vma=True must infer this.
        for op in ["psum", "pmean", "pmax", "pmin", "all_gather-invarying"]:
            area, block, body, _ = OPS[op]
            x = ints((n_dev, *block(n)), seed=len(CASES))
            out = remaining(mesh_key, axes)
            add(ShardMapCase(f"{op}-{mesh_key}-{label(axes)}-replicated-out", f"shard_map/{area}",
                             per_device(mesh_key, lambda api, v, body=body, a=axes, n=n: body(api, v, a, n),
                                        out=out), (x,), expected=op_reference(op, mesh_key, axes, n, out)))
        # the same collectives with check_vma=False (psum binds psum_p, not psum_invariant_p)
        for op in ["psum", "all_gather", "ppermute-shift", "psum_scatter"]:
            area, block, body, _ = OPS[op]
            x = ints((n_dev, *block(n)), seed=len(CASES))
            add(ShardMapCase(f"{op}-{mesh_key}-{label(axes)}-unchecked", f"shard_map/{area}",
                             per_device(mesh_key, lambda api, v, body=body, a=axes, n=n: body(api, v, a, n),
                                        check_vma=False), (x,), expected=op_reference(op, mesh_key, axes, n)))

# a collective on a value that is replicated (in_specs=P()) and on Python constants
C = "shard_map/constants"
for mesh_key, (_, names) in MESHES.items():
    everything = names if len(names) > 1 else names[0]
    for op in ["psum", "pmean", "pmax", "pmin"]:
        for check in (True, False):
            add(ShardMapCase(f"{op}-of-replicated-{mesh_key}-vma{int(check)}", C, lambda api, op=op, mk=mesh_key,
                             a=everything, check=check: api.shard_map(
                                 lambda c: getattr(api.lax, op)(c, a), mesh=mesh_of(api, mk), in_specs=api.P(),
                                 out_specs=api.P(), check_vma=check), (np.arange(3, dtype=np.float32) + 1,)))
add(ShardMapCase("psum-python-int-is-axis-size", C, lambda api: api.shard_map(
    lambda b: b + api.lax.psum(1, ("x", "y")), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
    out_specs=api.P("x")), (np.zeros(8, np.int32),)))
add(ShardMapCase("psum-python-float", C, lambda api: api.shard_map(
    lambda b: b + api.lax.psum(2.5, "x"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
    out_specs=api.P("x")), (np.zeros(8, np.float32),)))
add(ShardMapCase("axis_size-all-axes-3d", C, lambda api: api.shard_map(
    lambda b: b + api.lax.axis_size(("x", "y", "z")) * 100 + api.lax.axis_size("y"),
    mesh=mesh_of(api, "2x2x2"), in_specs=api.P("x"), out_specs=api.P("x")), (np.zeros(8, np.int32),)))
add(ShardMapCase("psum-empty-axes-identity", C, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, ()), mesh=mesh_of(api, "4x2"), in_specs=api.P(("x", "y")),
    out_specs=api.P(("x", "y"))), (np.arange(8, dtype=np.float32),)))
add(ShardMapCase("psum-list-axes", C, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, ["x", "y"]), mesh=mesh_of(api, "4x2"), in_specs=api.P(("x", "y")),
    out_specs=api.P()), (np.arange(8, dtype=np.float32),)))
add(ShardMapCase("psum-pytree", C, lambda api: api.shard_map(
    lambda b: api.lax.psum({"b": b, "a": (b * 2, None)}, "x"), mesh=mesh_of(api, "4x2"),
    in_specs=api.P(("x", "y")), out_specs=api.P("y")), (np.arange(8, dtype=np.float32),)))
add(ShardMapCase("psum-positional-and-named-unchecked", C, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, ("x", 0)), mesh=mesh_of(api, "4x2"), in_specs=api.P(("x", "y")),
    out_specs=api.P("y"), check_vma=False), (np.arange(16, dtype=np.float32).reshape(8, 2),)))
add(ShardMapCase("psum-positional-and-named-checked", C, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, ("x", 0)), mesh=mesh_of(api, "4x2"), in_specs=api.P(("x", "y")),
    out_specs=api.P("y")), (np.arange(16, dtype=np.float32).reshape(8, 2),), raises="ValueError",
    phrase="can only accept axis_name which corresponds to one of varying",
    note="check_vma=True rejects a positional axis mixed with named ones; check_vma=False sums both"))
add(ShardMapCase("psum_scatter-of-replicated", C, lambda api: api.shard_map(
    lambda c: api.lax.psum_scatter(c, "i", tiled=True), mesh=mesh_of(api, "8"), in_specs=api.P(),
    out_specs=api.P("i")), (np.arange(8, dtype=np.float32),)))
add(ShardMapCase("all_gather-of-replicated-invarying", C, lambda api: api.shard_map(
    lambda c: api.lax.all_gather(c, "x", to="invarying"), mesh=mesh_of(api, "4x2"), in_specs=api.P(),
    out_specs=api.P()), (np.arange(3, dtype=np.float32),)))
add(ShardMapCase("ppermute-of-replicated", C, lambda api: api.shard_map(
    lambda c: api.lax.ppermute(c, "x", [(0, 1), (1, 2)]), mesh=mesh_of(api, "4x2"), in_specs=api.P(),
    out_specs=api.P("x")), (np.arange(3, dtype=np.float32) + 1,)))

# ==========================================================================================================
# 3. dtypes
# ==========================================================================================================
D = "shard_map/dtypes"
DTYPES = ["bool", "int8", "uint8", "int32", "float16", "bfloat16", "float32", "complex64"]
for dtype in DTYPES:
    x = array(dtype, (8, 2, 3), seed=3)
    add(ShardMapCase(f"dtype-psum-{dtype}", D, per_device("4x2", lambda api, v: api.lax.psum(v, "x")), (x,),
                     expected=reference_rows("4x2", "psum", "x", {})))
    add(ShardMapCase(f"dtype-pmean-{dtype}", D, per_device("4x2", lambda api, v: api.lax.pmean(v, ("x", "y"))),
                     (x,), expected=reference_rows("4x2", "pmean", ("x", "y"), {})))
    add(ShardMapCase(f"dtype-pmax-{dtype}", D, per_device("4x2", lambda api, v: api.lax.pmax(v, "y")), (x,),
                     raises="JaxRuntimeError" if dtype == "complex64" else None,
                     note="XLA:CPU has no complex max all-reduce (UNIMPLEMENTED); the pmap suite's decision "
                          "(lexicographic max) applies" if dtype == "complex64" else ""))
    add(ShardMapCase(f"dtype-all_gather-{dtype}", D,
                     per_device("2x2x2", lambda api, v: api.lax.all_gather(v, ("z", "x"), axis=1)), (x,),
                     expected=reference_rows("2x2x2", "all_gather", ("z", "x"), {"axis": 1})))
    add(ShardMapCase(f"dtype-ppermute-{dtype}", D,
                     per_device("2x2x2", lambda api, v: api.lax.ppermute(v, "y", [(0, 1)])), (x,),
                     expected=reference_rows("2x2x2", "ppermute", "y", {"perm": [(0, 1)]})))
    add(ShardMapCase(f"dtype-all_to_all-{dtype}", D,
                     per_device("4x2", lambda api, v: api.lax.all_to_all(v, "y", 0, 1)), (array(dtype, (8, 2, 3)),),
                     expected=reference_rows("4x2", "all_to_all", "y", {"split_axis": 0, "concat_axis": 1})))
    if dtype != "bool":
        add(ShardMapCase(f"dtype-psum_scatter-{dtype}", D,
                         per_device("4x2", lambda api, v: api.lax.psum_scatter(v, "y")), (x,),
                         expected=reference_rows("4x2", "psum_scatter", "y", {})))
add(ShardMapCase("dtype-psum_scatter-bool", D, per_device("4x2", lambda api, v: api.lax.psum_scatter(v, "y")),
                 (array("bool", (8, 2, 3)),), raises="TypeError", phrase="add does not accept dtype bool"))
add(ShardMapCase("dtype-int64-input-canonicalized", D, lambda api: api.shard_map(
    lambda b: b * 2, mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x")),
    (np.arange(8, dtype=np.int64),), front_ends=JAX_FRONT_ENDS,
    note="JAX canonicalizes int64/float64 inputs to 32 bits (x64 off); the NumPy front end keeps NumPy dtypes"))

# ==========================================================================================================
# 4. axis_index_groups, where JAX allows them
# ==========================================================================================================
G = "shard_map/groups"
GROUPS8 = {"even": [[0, 1, 2, 3], [4, 5, 6, 7]], "reordered": [[7, 5, 3, 1], [6, 4, 2, 0]],
           "uneven": [[0, 1, 2], [3, 4, 5, 6, 7]]}
X8 = np.arange(8, dtype=np.float32) * 3 + 1


def group_reference(mesh_key, op, axes, groups, **params):
    """``expected(x)`` for a groups case whose input ``x`` is split evenly over all devices (P over all
    axes): the reference collective with ``axis_index_groups`` on the per-device blocks, concatenated along
    axis 0 in device order."""
    mm = ref.MeshModel(*MESHES[mesh_key])

    def expected(x):
        blocks = np.split(np.asarray(x), mm.n)
        results = ref.collective(op, blocks, mm, axes, axis_index_groups=groups, **params)
        return np.concatenate(results)
    return expected
for kind, groups in GROUPS8.items():
    for op in ["pmax", "pmin"]:
        add(ShardMapCase(f"groups-{op}-{kind}", G, lambda api, op=op, g=groups: api.shard_map(
            lambda b: getattr(api.lax, op)(b, "i", axis_index_groups=g), mesh=mesh_of(api, "8"),
            in_specs=api.P("i"), out_specs=api.P("i")), (X8,), expected=group_reference("8", op, "i", groups)))
    for op in ["psum", "pmean"]:
        add(ShardMapCase(f"groups-{op}-{kind}-unchecked", G, lambda api, op=op, g=groups: api.shard_map(
            lambda b: getattr(api.lax, op)(b, "i", axis_index_groups=g), mesh=mesh_of(api, "8"),
            in_specs=api.P("i"), out_specs=api.P("i"), check_vma=False), (X8,),
            expected=group_reference("8", op, "i", groups),
            note="pmean with uneven groups divides every group by len(groups[0]) (JAX quirk, as in pmap)"
            if op == "pmean" and kind == "uneven" else ""))
for op in ["psum", "pmean"]:
    add(ShardMapCase(f"groups-{op}-checked-not-implemented", G, lambda api, op=op: api.shard_map(
        lambda b: getattr(api.lax, op)(b, "i", axis_index_groups=GROUPS8["even"]), mesh=mesh_of(api, "8"),
        in_specs=api.P("i"), out_specs=api.P("i")), (X8,), raises="NotImplementedError",
        note="psum/pmean with axis_index_groups under check_vma=True: bare NotImplementedError (empty message)"))
for kind in ["even", "reordered"]:
    g = GROUPS8[kind]
    add(ShardMapCase(f"groups-all_gather-{kind}", G, lambda api, g=g: api.shard_map(
        lambda b: api.lax.all_gather(b, "i", axis_index_groups=g), mesh=mesh_of(api, "8"), in_specs=api.P("i"),
        out_specs=api.P("i")), (X8,), expected=group_reference("8", "all_gather", "i", g)))
    add(ShardMapCase(f"groups-all_gather-tiled-{kind}", G, lambda api, g=g: api.shard_map(
        lambda b: api.lax.all_gather(b, "i", axis_index_groups=g, tiled=True), mesh=mesh_of(api, "8"),
        in_specs=api.P("i"), out_specs=api.P("i")), (X8,),
        expected=group_reference("8", "all_gather", "i", g, tiled=True)))
    add(ShardMapCase(f"groups-psum_scatter-{kind}", G, lambda api, g=g: api.shard_map(
        lambda b: api.lax.psum_scatter(b, "i", axis_index_groups=g, tiled=True), mesh=mesh_of(api, "8"),
        in_specs=api.P(), out_specs=api.P("i")), (np.arange(16, dtype=np.float32),)))
    add(ShardMapCase(f"groups-all_to_all-{kind}", G, lambda api, g=g: api.shard_map(
        lambda b: api.lax.all_to_all(b, "i", 0, 0, axis_index_groups=g), mesh=mesh_of(api, "8"),
        in_specs=api.P("i"), out_specs=api.P("i")), (np.arange(32, dtype=np.float32),),
        expected=group_reference("8", "all_to_all", "i", g, split_axis=0, concat_axis=0)))
add(ShardMapCase("groups-all_gather-uneven", G, lambda api: api.shard_map(
    lambda b: api.lax.all_gather(b, "i", axis_index_groups=GROUPS8["uneven"]), mesh=mesh_of(api, "8"),
    in_specs=api.P("i"), out_specs=api.P("i")), (X8,), raises="ValueError", phrase="Invalid replica id -1",
    note="all_gather with uneven groups fails in JAX's lowering (verifier error)"))
for axes in [("x", "y"), ("y", "x")]:
    add(ShardMapCase(f"groups-psum-tuple-{label(axes)}-unchecked", G, lambda api, a=axes: api.shard_map(
        lambda b: api.lax.psum(b, a, axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]), mesh=mesh_of(api, "4x2"),
        in_specs=api.P(("x", "y")), out_specs=api.P(("x", "y")), check_vma=False), (X8,),
        expected=group_reference("4x2", "psum", axes, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        note="group ids index the tuple's axis_index in the GIVEN order"))
    add(ShardMapCase(f"groups-all_gather-tuple-{label(axes)}", G, lambda api, a=axes: api.shard_map(
        lambda b: api.lax.all_gather(b, a, axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]], tiled=True),
        mesh=mesh_of(api, "4x2"), in_specs=api.P(("x", "y")), out_specs=api.P(("x", "y"))), (X8,),
        expected=group_reference("4x2", "all_gather", axes, [[0, 1, 2, 3], [4, 5, 6, 7]], tiled=True)))
add(ShardMapCase("groups-pmax-one-axis-of-2d", G, lambda api: api.shard_map(
    lambda b: api.lax.pmax(b, "x", axis_index_groups=[[0, 3], [1, 2]]), mesh=mesh_of(api, "4x2"),
    in_specs=api.P(("x", "y")), out_specs=api.P(("x", "y"))), (X8,),
    expected=group_reference("4x2", "pmax", "x", [[0, 3], [1, 2]])))
add(ShardMapCase("groups-psum-one-axis-of-2d-unchecked", G, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, "x", axis_index_groups=[[0, 1], [2, 3]]), mesh=mesh_of(api, "4x2"),
    in_specs=api.P(("x", "y")), out_specs=api.P(("x", "y")), check_vma=False), (X8,),
    expected=group_reference("4x2", "psum", "x", [[0, 1], [2, 3]])))
add(ShardMapCase("groups-pmax-typed-invariant", G, lambda api: api.shard_map(
    lambda b: api.lax.pmax(b, "i", axis_index_groups=GROUPS8["even"]), mesh=mesh_of(api, "8"),
    in_specs=api.P("i"), out_specs=api.P()), (X8,), front_ends=JAX_FRONT_ENDS,
    note="JAX BUG: pmax/pmin with axis_index_groups are typed invariant under check_vma=True, so out_specs=P() "
         "is accepted and device 0's group result comes back; a runtime replication check would reject it"))
add(ShardMapCase("groups-not-a-cover", G, lambda api: api.shard_map(
    lambda b: api.lax.pmax(b, "i", axis_index_groups=[[0, 1, 2, 3], [3, 4, 5, 6, 7]]), mesh=mesh_of(api, "8"),
    in_specs=api.P("i"), out_specs=api.P("i")), (X8,), raises="ValueError",
    phrase="axis_index_groups must cover all indices exactly once"))
add(ShardMapCase("groups-partial-cover-unchecked", G, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, "i", axis_index_groups=[[0, 1, 2, 3]]), mesh=mesh_of(api, "8"),
    in_specs=api.P("i"), out_specs=api.P("i"), check_vma=False), (X8,), raises="JaxRuntimeError",
    note="groups covering part of the axis pass JAX's check and fail in XLA (as in pmap); spmdsim's pmap "
         "suite raises ValueError there"))
add(ShardMapCase("groups-ppermute-rejected", G, lambda api: api.shard_map(
    lambda b: api.lax.ppermute(b, "i", [(0, 1)], axis_index_groups=[[0, 1]]), mesh=mesh_of(api, "8"),
    in_specs=api.P("i"), out_specs=api.P("i")), (X8,), raises="TypeError", phrase="axis_index_groups"))

# ==========================================================================================================
# 5. replication: out_specs that leave mesh axes out, checked and unchecked
# ==========================================================================================================
R = "shard_map/replication"


def stamp(api, names):
    """A per-device value that differs on every device: 10 * (row-major device index) + 1."""
    return (api.lax.axis_index(names) * 10 + 1).astype(api.numpy.float32)


for mesh_key, outs in {"8": [()], "4x2": [(), ("x",), ("y",)],
                       "2x2x2": [(), ("x",), ("z",), ("x", "y"), ("y", "z"), ("z", "x")]}.items():
    _, names = MESHES[mesh_key]
    for out in outs:
        o = "P(" + ",".join(out) + ")"
        build = (lambda check, mk=mesh_key, names=names, out=out: lambda api: api.shard_map(
            lambda b: b + stamp(api, names), mesh=mesh_of(api, mk), in_specs=api.P(),
            out_specs=api.P(out) if out else api.P(), check_vma=check))
        mm = ref.MeshModel(*MESHES[mesh_key])
        add(ShardMapCase(f"replication-unchecked-{mesh_key}-{o}", R, build(False), (np.zeros(1, np.float32),),
                         note="check_vma=False: the block at index 0 of every unmentioned mesh axis, unchecked",
                         expected=lambda z, mm=mm, out=out: ref.assemble(
                             [z + np.float32(10 * d + 1) for d in range(mm.n)], mm, (out,) if out else ())))
        add(ShardMapCase(f"replication-checked-{mesh_key}-{o}", R, build(True), (np.zeros(1, np.float32),),
                         raises="ValueError", phrase="out_specs which require replication"))
for mesh_key in ["4x2", "2x2x2"]:
    _, names = MESHES[mesh_key]
    add(ShardMapCase(f"replication-invariant-tiled-out-{mesh_key}", R, lambda api, mk=mesh_key, names=names:
                     api.shard_map(lambda c: c * 2, mesh=mesh_of(api, mk), in_specs=api.P(),
                                   out_specs=api.P(names)), (np.arange(3, dtype=np.float32),),
                     note="an invariant value under a spec that mentions axes is concatenated (copies)"))
    add(ShardMapCase(f"replication-invariant-tiled-out-{mesh_key}-unchecked", R,
                     lambda api, mk=mesh_key, names=names: api.shard_map(
                         lambda c: c * 2, mesh=mesh_of(api, mk), in_specs=api.P(), out_specs=api.P(names[0]),
                         check_vma=False), (np.arange(3, dtype=np.float32),)))
add(ShardMapCase("replication-replicated-input-passthrough", R, lambda api: api.shard_map(
    lambda c: c, mesh=mesh_of(api, "2x2x2"), in_specs=api.P(), out_specs=api.P()),
    (np.arange(6, dtype=np.float32).reshape(2, 3),)))
add(ShardMapCase("replication-constant-output-P()", R, lambda api: api.shard_map(
    lambda b: api.numpy.ones((2,), api.numpy.float32) * 3, mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
    out_specs=api.P()), (np.zeros(8, np.float32),)))
add(ShardMapCase("replication-constant-output-P(x)", R, lambda api: api.shard_map(
    lambda b: api.numpy.ones((1,), api.numpy.float32), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
    out_specs=api.P("x")), (np.zeros(8, np.float32),)))
add(ShardMapCase("replication-partial-reduction", R, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, ("x", "z")), mesh=mesh_of(api, "2x2x2"), in_specs=api.P(("x", "y", "z")),
    out_specs=api.P("y")), (np.arange(8, dtype=np.float32),)))
add(ShardMapCase("replication-partial-reduction-too-little", R, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, "x"), mesh=mesh_of(api, "2x2x2"), in_specs=api.P(("x", "y", "z")),
    out_specs=api.P("y")), (np.arange(8, dtype=np.float32),), raises="ValueError",
    phrase="out_specs which require replication"))
add(ShardMapCase("replication-equal-values-typed-varying", R, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, "i") + 0 * b, mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P()),
    (np.arange(8, dtype=np.float32),), front_ends=JAX_FRONT_ENDS, raises="ValueError",
    phrase="out_specs which require replication",
    note="the values ARE equal on every device but JAX's static VMA type says varying: a NumPy-front-end "
         "runtime check would accept it"))
add(ShardMapCase("replication-unchecked-jit-device0", R, lambda api: api.jax.jit(api.shard_map(
    lambda b: b * 10, mesh=mesh_of(api, "4x2"), in_specs=api.P(("x", "y")), out_specs=api.P(),
    check_vma=False)), (np.arange(8, dtype=np.float32) + 1,), front_ends=JAX_FRONT_ENDS))

# ==========================================================================================================
# 6. VMA typing (check_vma=True)
# ==========================================================================================================
V = "shard_map/vma"
add(ShardMapCase("vma-pcast-to-varying", V, lambda api: api.shard_map(
    lambda c: api.lax.pcast(c, "x", to="varying") * 2, mesh=mesh_of(api, "4x2"), in_specs=api.P(),
    out_specs=api.P("x")), (np.arange(3, dtype=np.float32),)))
add(ShardMapCase("vma-pcast-tuple-to-varying", V, lambda api: api.shard_map(
    lambda c: api.lax.pcast(c, ("x", "y"), to="varying") + 1, mesh=mesh_of(api, "4x2"), in_specs=api.P(),
    out_specs=api.P(("x", "y"))), (np.arange(3, dtype=np.float32),)))
add(ShardMapCase("vma-pcast-then-out-P()", V, lambda api: api.shard_map(
    lambda c: api.lax.pcast(c, "x", to="varying"), mesh=mesh_of(api, "4x2"), in_specs=api.P(),
    out_specs=api.P()), (np.arange(3, dtype=np.float32),), front_ends=JAX_FRONT_ENDS, raises="ValueError",
    phrase="out_specs which require replication", note="typing error: the values are equal"))
add(ShardMapCase("vma-pcast-already-varying", V, lambda api: api.shard_map(
    lambda b: api.lax.pcast(b, "x", to="varying"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
    out_specs=api.P("x")), (np.arange(8, dtype=np.float32),), raises="ValueError",
    phrase="Unsupported pcast from=varying, to='varying'"))
add(ShardMapCase("vma-pcast-to-invarying", V, lambda api: api.shard_map(
    lambda c: api.lax.pcast(c, "x", to="invarying"), mesh=mesh_of(api, "4x2"), in_specs=api.P(),
    out_specs=api.P()), (np.arange(3, dtype=np.float32),), raises="ValueError",
    phrase="Got unexpected `to` value. Allowed `to` values are"))
add(ShardMapCase("vma-pcast-set-axis", V, lambda api: api.shard_map(
    lambda c: api.lax.pcast(c, {"x"}, to="varying"), mesh=mesh_of(api, "4x2"), in_specs=api.P(),
    out_specs=api.P("x")), (np.arange(3, dtype=np.float32),), raises="TypeError",
    phrase="must be a tuple or a str"))
add(ShardMapCase("vma-pcast-empty-axes", V, lambda api: api.shard_map(
    lambda c: api.lax.pcast(c, (), to="varying"), mesh=mesh_of(api, "4x2"), in_specs=api.P(),
    out_specs=api.P()), (np.arange(3, dtype=np.float32),)))
add(ShardMapCase("vma-pcast-unchecked", V, lambda api: api.shard_map(
    lambda c: api.lax.pcast(c, "x", to="varying"), mesh=mesh_of(api, "4x2"), in_specs=api.P(),
    out_specs=api.P(), check_vma=False), (np.arange(3, dtype=np.float32),), front_ends=JAX_FRONT_ENDS,
    note="check_vma=False: pcast is accepted and out_specs=P() unchecked"))
add(ShardMapCase("vma-all_gather-varying-out-P()", V, lambda api: api.shard_map(
    lambda b: api.lax.all_gather(b, "x"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P()),
    (np.arange(8, dtype=np.float32),), front_ends=JAX_FRONT_ENDS, raises="ValueError",
    phrase="out_specs which require replication",
    note="all_gather's result is equal on the group but typed varying unless to='invarying'"))
add(ShardMapCase("vma-all_gather-invarying-out-P()", V, lambda api: api.shard_map(
    lambda b: api.lax.all_gather(b, "x", to="invarying", tiled=True), mesh=mesh_of(api, "4x2"),
    in_specs=api.P("x"), out_specs=api.P()), (np.arange(8, dtype=np.float32),)))
add(ShardMapCase("vma-all_gather-bad-to", V, lambda api: api.shard_map(
    lambda b: api.lax.all_gather(b, "x", to="bad"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
    out_specs=api.P("x")), (np.arange(8, dtype=np.float32),), raises="ValueError",
    phrase="Got unexpected `to` value for `jax.lax.all_gather`"))
add(ShardMapCase("vma-axis_index-out-P()", V, lambda api: api.shard_map(
    lambda b: api.lax.axis_index("x"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P()),
    (np.arange(8, dtype=np.float32),), raises="ValueError", phrase="out_specs which require replication"))
add(ShardMapCase("vma-axis_index-out-P(x)-scalar", V, lambda api: api.shard_map(
    lambda b: api.lax.axis_index("x"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x")),
    (np.arange(8, dtype=np.float32),), raises="ValueError", phrase="which has rank 0"))
add(ShardMapCase("vma-ppermute-of-replicated-out-P()", V, lambda api: api.shard_map(
    lambda c: api.lax.ppermute(c, "x", shift_perm(4)), mesh=mesh_of(api, "4x2"), in_specs=api.P(),
    out_specs=api.P()), (np.arange(3, dtype=np.float32),), front_ends=JAX_FRONT_ENDS, raises="ValueError",
    phrase="out_specs which require replication", note="typing: ppermute output is varying (values equal here)"))
add(ShardMapCase("vma-pmax-result-out-P()", V, lambda api: api.shard_map(
    lambda b: api.lax.pmax(b, ("x", "y")), mesh=mesh_of(api, "4x2"), in_specs=api.P(("x", "y")),
    out_specs=api.P()), (np.arange(8, dtype=np.float32),)))
add(ShardMapCase("vma-varying-plus-invariant", V, lambda api: api.shard_map(
    lambda b, c: b * c + api.lax.psum(b, "y"), mesh=mesh_of(api, "4x2"), in_specs=(api.P("x", "y"), api.P()),
    out_specs=api.P("x", "y")), (np.arange(16, dtype=np.float32).reshape(4, 4), np.float32(2))))
add(ShardMapCase("vma-weak-python-scalar-output-P()", V, lambda api: api.shard_map(
    lambda b: 3.0, mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P()),
    (np.arange(8, dtype=np.float32),), front_ends=JAX_FRONT_ENDS,
    note="a Python float output becomes a float32 (weak) array"))
# loop carries whose varying-ness changes need a pcast (JAX: TypeError while tracing)
LOOP = {
    "fori": lambda api, b, init: api.jax.lax.fori_loop(0, 3, lambda k, acc: acc + b, init),
    "scan": lambda api, b, init: api.jax.lax.scan(lambda c, _: (c + b, None), init, None, length=3)[0],
    "while": lambda api, b, init: api.jax.lax.while_loop(
        lambda c: c[1] < 3, lambda c: (c[0] + b, c[1] + 1), (init, 0))[0],
}
for loop, run in LOOP.items():
    for init_kind in ["zeros", "pcast", "zeros_like"]:
        for check in (True, False):
            def init(api, b, kind=init_kind):
                if kind == "zeros":
                    return api.numpy.zeros(2, api.numpy.float32)
                if kind == "pcast":
                    return api.lax.pcast(api.numpy.zeros(2, api.numpy.float32), "i", to="varying")
                return api.numpy.zeros_like(b)
            if init_kind == "pcast" and not check:
                continue
            fails = init_kind == "zeros" and check
            add(ShardMapCase(f"vma-{loop}-carry-{init_kind}-vma{int(check)}", V,
                             lambda api, run=run, init=init, check=check: api.shard_map(
                                 lambda b: run(api, b, init(api, b)), mesh=mesh_of(api, "8"), in_specs=api.P("i"),
                                 out_specs=api.P("i"), check_vma=check), (np.arange(16, dtype=np.float32),),
                             front_ends=JAX_FRONT_ENDS, raises="TypeError" if fails else None,
                             phrase="so the manual axis types do not match" if fails else None))
for check in (True, False):
    add(ShardMapCase(f"vma-cond-mixed-branches-vma{int(check)}", V, lambda api, check=check: api.shard_map(
        lambda b: api.jax.lax.cond(b.sum() > 3, lambda: b, lambda: api.numpy.zeros(2, api.numpy.float32)),
        mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P("i"), check_vma=check),
        (np.arange(16, dtype=np.float32),), front_ends=JAX_FRONT_ENDS, raises="TypeError" if check else None,
        phrase="cond branches must have equal output types" if check else None,
        note="JAX's hint in this message is wrong: it suggests pcast(..., (), to='varying') on true_fun"
        if check else "devices take different branches"))
add(ShardMapCase("vma-ring-loop-varying-carry", V, lambda api: api.shard_map(
    lambda b: api.jax.lax.fori_loop(0, 8, lambda k, acc: api.lax.ppermute(acc, "i", shift_perm(8)) + b, b),
    mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P("i")), (np.arange(16, dtype=np.float32),),
    front_ends=JAX_FRONT_ENDS))

# ==========================================================================================================
# 7. autodiff through collectives (JAX front ends)
# ==========================================================================================================
AD = "shard_map/autodiff"
XG = np.arange(8, dtype=np.float32) + 1
W8 = np.arange(8, dtype=np.float32) + 1


def inside_grad(loss, check, mesh_key="8", spec=("i",)):
    return lambda api: api.shard_map(lambda b: api.jax.grad(lambda v: loss(api, v))(b), mesh=mesh_of(api, mesh_key),
                                     in_specs=api.P(*spec), out_specs=api.P(*spec), check_vma=check)


INSIDE = {
    "psum": lambda api, v: api.lax.psum(v, "i").sum(),
    "pmean": lambda api, v: api.lax.pmean(v, "i").sum(),
    "v-times-psum": lambda api, v: (v * api.lax.psum(v, "i")).sum(),
    "psum-squared": lambda api, v: api.lax.psum(v * v, "i").sum(),
    "all_gather-weighted": lambda api, v: (api.lax.all_gather(v, "i", tiled=True) * W8).sum(),
    "ppermute-weighted": lambda api, v: (api.lax.ppermute(v, "i", [(j, j + 1) for j in range(7)])
                                         * (api.lax.axis_index("i") + 1)).sum(),
    "psum_scatter-weighted": lambda api, v: (api.lax.psum_scatter(v * W8, "i", tiled=True)
                                             * (api.lax.axis_index("i") + 1)).sum(),
    "all_to_all-weighted": lambda api, v: (api.lax.all_to_all(v * W8, "i", 0, 0, tiled=True) * W8).sum(),
}
for name, loss in INSIDE.items():
    for check in (True, False):
        shape = (64,) if name in ("psum_scatter-weighted", "all_to_all-weighted") else (8,)
        add(ShardMapCase(f"grad-inside-{name}-vma{int(check)}", AD, inside_grad(loss, check),
                         (np.arange(shape[0], dtype=np.float32) / 8 + 1,), front_ends=JAX_FRONT_ENDS,
                         note="grad of psum: 1 per device with check_vma=True, N with check_vma=False (as pmap)"
                         if name == "psum" else ""))
add(ShardMapCase("grad-inside-pmax-not-differentiable", AD, inside_grad(
    lambda api, v: api.lax.pmax(v, "i").sum(), True), (XG,), front_ends=JAX_FRONT_ENDS,
    raises="NotImplementedError", phrase="Differentiation rule for 'pmax' not implemented"))
add(ShardMapCase("grad-inside-2d-psum-over-y", AD, inside_grad(
    lambda api, v: (api.lax.psum(v, "y") ** 2).sum(), True, "4x2", ("x", "y")),
    (np.arange(16, dtype=np.float32).reshape(4, 4),), front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("grad-inside-2d-psum-over-y-unchecked", AD, inside_grad(
    lambda api, v: (api.lax.psum(v, "y") ** 2).sum(), False, "4x2", ("x", "y")),
    (np.arange(16, dtype=np.float32).reshape(4, 4),), front_ends=JAX_FRONT_ENDS))

# data-parallel linear regression: w replicated (P()), rows sharded
RNG = np.random.default_rng(0)
XDP = RNG.standard_normal((16, 3)).astype(np.float32)
YDP = RNG.standard_normal(16).astype(np.float32)
WDP = np.array([0.5, -1.0, 2.0], np.float32)


def mse(api, w, xb, yb):
    return ((xb @ w - yb) ** 2).mean()


DP = {
    # N x the full-batch gradient under check_vma=True (the pmap idiom's trap), right under check_vma=False
    "grad-then-pmean": lambda api, w, xb, yb: api.lax.pmean(api.jax.grad(lambda w: mse(api, w, xb, yb))(w), "i"),
    # right under check_vma=True; device 0's local gradient under check_vma=False
    "grad-of-pmean-loss": lambda api, w, xb, yb: api.jax.grad(lambda w: api.lax.pmean(mse(api, w, xb, yb), "i"))(w),
    "plain-grad": lambda api, w, xb, yb: api.jax.grad(lambda w: mse(api, w, xb, yb))(w),
    "grad-of-psum-loss": lambda api, w, xb, yb: api.jax.grad(lambda w: api.lax.psum(mse(api, w, xb, yb), "i"))(w),
    "pcast-then-grad-then-pmean": lambda api, w, xb, yb: api.lax.pmean(api.jax.grad(
        lambda w: mse(api, w, xb, yb))(api.lax.pcast(w, "i", to="varying")), "i"),
}
for name, step in DP.items():
    for check in (True, False):
        if name.startswith("pcast") and not check:
            continue
        add(ShardMapCase(f"grad-data-parallel-{name}-vma{int(check)}", AD, lambda api, step=step, check=check:
                         api.shard_map(lambda w, xb, yb: step(api, w, xb, yb), mesh=mesh_of(api, "8"),
                                       in_specs=(api.P(), api.P("i"), api.P("i")), out_specs=api.P(),
                                       check_vma=check), (WDP, XDP, YDP), front_ends=JAX_FRONT_ENDS))
# grad from outside: jax.grad of a function that calls shard_map
OUTSIDE = {
    "psum-out-P()": (lambda api, check: lambda x: api.shard_map(
        lambda b: api.lax.psum(b, "i"), mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P(),
        check_vma=check)(x).sum(), (XG,)),
    "weighted-P(i)": (lambda api, check: lambda x: (api.shard_map(
        lambda b: b * b, mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P("i"),
        check_vma=check)(x) * W8).sum(), (XG,)),
    "replicated-param": (lambda api, check: lambda c: api.shard_map(
        lambda b, c: b * c, mesh=mesh_of(api, "8"), in_specs=(api.P("i"), api.P()), out_specs=api.P("i"),
        check_vma=check)(XG, c).sum(), (np.float32(3),)),
    "replicated-param-psum": (lambda api, check: lambda c: api.shard_map(
        lambda b, c: api.lax.psum(b * c, "i"), mesh=mesh_of(api, "8"), in_specs=(api.P("i"), api.P()),
        out_specs=api.P(), check_vma=check)(XG, c).sum(), (np.float32(3),)),
    "all_gather-2d": (lambda api, check: lambda x: (api.shard_map(
        lambda b: api.lax.all_gather(b, "y", tiled=True, axis=1), mesh=mesh_of(api, "4x2"),
        in_specs=api.P("x", "y"), out_specs=api.P("x"), check_vma=check)(x) ** 2).sum() if not check else
        (api.shard_map(lambda b: api.lax.all_gather(b, "y", tiled=True, axis=1, to="invarying"),
                       mesh=mesh_of(api, "4x2"), in_specs=api.P("x", "y"), out_specs=api.P("x"))(x) ** 2).sum(),
        (np.arange(16, dtype=np.float32).reshape(4, 4),)),
}
for name, (make, args) in OUTSIDE.items():
    for check in (True, False):
        add(ShardMapCase(f"grad-outside-{name}-vma{int(check)}", AD,
                         lambda api, make=make, check=check: api.jax.grad(make(api, check)), args,
                         front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("grad-outside-unreplicated-out-P()-unchecked", AD, lambda api: api.jax.grad(
    lambda x: api.shard_map(lambda b: b * 2, mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P(),
                            check_vma=False)(x).sum()), (XG,), front_ends=JAX_FRONT_ENDS,
    note="check_vma=False: the forward returns device 0's block, the cotangent is split 1/N over all devices "
         "(0.25 = 2/8), not [2, 0, ...]"))
add(ShardMapCase("grad-value_and_grad-train-step", AD, lambda api: api.jax.jit(
    lambda w, x, y: api.jax.value_and_grad(lambda w: api.shard_map(
        lambda w, xb, yb: api.lax.pmean(mse(api, w, xb, yb), "i"), mesh=mesh_of(api, "8"),
        in_specs=(api.P(), api.P("i"), api.P("i")), out_specs=api.P())(w, x, y))(w)), (WDP, XDP, YDP),
    front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("grad-jvp-psum", AD, lambda api: lambda x: api.jax.jvp(api.shard_map(
    lambda b: api.lax.psum(b * b, "i"), mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P()),
    (x,), (np.ones(8, np.float32),)), (XG,), front_ends=JAX_FRONT_ENDS))

# ==========================================================================================================
# 8. jit (JAX front ends)
# ==========================================================================================================
J = "shard_map/jit"
for op in ["psum", "all_gather", "ppermute-shift", "axis_index", "psum_scatter", "all_to_all-s0c1"]:
    area, block, body, _ = OPS[op]
    for mesh_key, axes in [("4x2", ("y", "x")), ("2x2x2", ("z", "x"))]:
        n = group_size(mesh_key, axes)
        add(ShardMapCase(f"jit-{op}-{mesh_key}-{label(axes)}", J, lambda api, body=body, a=axes, n=n, mk=mesh_key:
                         api.jax.jit(per_device(mk, lambda api, v: body(api, v, a, n))(api)),
                         (ints((8, *block(n)), seed=7),), front_ends=JAX_FRONT_ENDS,
                         note=MESH_ORDER_NOTE if op.startswith("ppermute") else "",
                         expected=op_reference(op, mesh_key, axes, n)))
add(ShardMapCase("jit-global-ops-around", J, lambda api: api.jax.jit(lambda x: api.shard_map(
    lambda b: api.lax.psum(b, "x"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x", "y"), out_specs=api.P(None, "y"))(
    x.T * 2).sum(axis=0) + 1), (np.arange(32, dtype=np.float32).reshape(4, 8),), front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("jit-inside-body", J, lambda api: api.shard_map(
    api.jax.jit(lambda b: api.lax.psum(b * 2, "i")), mesh=mesh_of(api, "8"), in_specs=api.P("i"),
    out_specs=api.P()), (np.arange(16, dtype=np.float32),), front_ends=JAX_FRONT_ENDS))
def two_meshes(api):
    first = api.shard_map(lambda b: b + api.lax.axis_index("i").astype(api.numpy.float32), mesh=mesh_of(api, "8"),
                          in_specs=api.P("i"), out_specs=api.P("i"))
    second = api.shard_map(lambda b: api.lax.psum(b, "y"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x", "y"),
                           out_specs=api.P("x"))
    return lambda x: second(first(x))


add(ShardMapCase("jit-two-meshes-eager", J, two_meshes, (np.zeros((8, 8), np.float32),)))
add(ShardMapCase("jit-two-meshes", J, lambda api: api.jax.jit(two_meshes(api)), (np.zeros((8, 8), np.float32),),
                 front_ends=JAX_FRONT_ENDS, raises="IndivisibleError", phrase="is not divisible by axis_size=8",
                 note="JAX BUG: two shard_maps over different meshes of the same devices, chained in one jit, fail "
                      "in sharding propagation (eager works: jit-two-meshes-eager). A simulator should compute "
                      "the eager result (a known difference)"))
def call_with(f, *extra, **kwargs):
    """``lambda x: f(x, *extra, **kwargs)``: a case callable that adds fixed (static or keyword) arguments."""
    return lambda x: f(x, *extra, **kwargs)


add(ShardMapCase("jit-static-argument", J, lambda api: call_with(api.jax.jit(
    lambda x, k: api.shard_map(lambda b: b * k, mesh=mesh_of(api, "8"), in_specs=api.P("i"),
                               out_specs=api.P("i"))(x), static_argnums=1), 3), (np.arange(8, dtype=np.float32),),
    front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("jit-in_specs-None-static", J, lambda api: call_with(api.shard_map(
    lambda b, k: b * k, mesh=mesh_of(api, "8"), in_specs=(api.P("i"), None), out_specs=api.P("i")), 3),
    (np.arange(8, dtype=np.float32),), front_ends=JAX_FRONT_ENDS,
    note="an in_specs leaf None makes that argument static (passed through as a Python value)"))
add(ShardMapCase("jit-vmap-of-shard_map", J, lambda api: api.jax.vmap(api.shard_map(
    lambda b: api.lax.psum(b, "i"), mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P())),
    (np.arange(24, dtype=np.float32).reshape(3, 8),), front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("jit-decorator-form", J, lambda api: api.jax.jit(api.jax.shard_map(
    mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P("i"))(lambda b: b * 2)),
    (np.arange(8, dtype=np.float32),), front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("jit-cond-per-device", J, lambda api: api.jax.jit(api.shard_map(
    lambda b: api.jax.lax.cond(b.sum() > 10, lambda v: v * 2, lambda v: v - 1, b), mesh=mesh_of(api, "8"),
    in_specs=api.P("i"), out_specs=api.P("i"))), (np.arange(16, dtype=np.float32),), front_ends=JAX_FRONT_ENDS))

# ==========================================================================================================
# 9. nesting and axis_names (manual over a subset of the mesh axes)
# ==========================================================================================================
N_ = "shard_map/nested"
X84 = np.arange(32, dtype=np.float32).reshape(8, 4)


def nested(inner_body, inner_in, inner_out, outer_out=("x",)):
    return lambda api: api.shard_map(
        lambda b: api.shard_map(lambda c: inner_body(api, c), mesh=None, in_specs=api.P(*inner_in),
                                out_specs=api.P(*inner_out), axis_names={"y"})(b),
        mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P(*outer_out), axis_names={"x"})


add(ShardMapCase("nested-x-then-y-psum-y", N_, nested(
    lambda api, c: api.lax.psum(c, "y") + (100 * api.lax.axis_index("x") + 10 * api.lax.axis_index("y")).astype(
        api.numpy.float32), (None, "y"), (None, "y")), (X84,)))
add(ShardMapCase("nested-identity", N_, nested(lambda api, c: c * 2, (None, "y"), (None, "y")), (X84,)))
add(ShardMapCase("nested-inner-out-replicated", N_, nested(
    lambda api, c: api.lax.psum(c, "y"), (None, "y"), ()), (X84,)))
add(ShardMapCase("nested-inner-collective-over-outer-axis", N_, nested(
    lambda api, c: api.lax.psum(c, "x"), (None, "y"), (None, "y")), (X84,), raises="ValueError",
    phrase="not evenly divisible",
    note="JAX 0.10.2 rejects a collective over the OUTER (already manual) axis inside an inner shard_map with "
         "a confusing divisibility message about an internal shard_map"))
add(ShardMapCase("nested-inner-out_specs-mentions-outer-axis", N_, nested(
    lambda api, c: c, (None, "y"), ("x", "y")), (X84,), raises="ValueError",
    phrase="must refer to an axis marked as manual"))
add(ShardMapCase("nested-inner-concrete-mesh", N_, lambda api: api.shard_map(
    lambda b: api.shard_map(lambda c: c, mesh=mesh_of(api, "4x2"), in_specs=api.P(None, "y"),
                            out_specs=api.P(None, "y"), axis_names={"y"})(b),
    mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x"), axis_names={"x"}), (X84,),
    raises="ValueError", phrase="should match the mesh passed to shard_map"))
add(ShardMapCase("nested-inner-all-remaining-axes", N_, lambda api: api.shard_map(
    lambda b: api.shard_map(lambda c: c * api.lax.axis_index("y").astype(api.numpy.float32), mesh=None,
                            in_specs=api.P(None, "y"), out_specs=api.P(None, "y"))(b),
    mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x"), axis_names={"x"}), (X84,),
    note="inner axis_names defaults to all mesh axes; the already-manual 'x' stays manual"))
add(ShardMapCase("nested-inner-over-outer-axis-again", N_, lambda api: api.shard_map(
    lambda b: api.shard_map(lambda c: c, mesh=None, in_specs=api.P("x"), out_specs=api.P("x"),
                            axis_names={"x"})(b),
    mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x"), axis_names={"x"}), (X84,),
    raises="ValueError", phrase="not evenly divisible"))
add(ShardMapCase("nested-jit", N_, lambda api: api.jax.jit(nested(
    lambda api, c: api.lax.psum(c, "y"), (None, "y"), ())(api)), (X84,), front_ends=JAX_FRONT_ENDS))
# axis_names: manual over a subset; the other axes stay automatic and are invisible in the body
add(ShardMapCase("axis_names-x-body", N_, lambda api: api.shard_map(
    lambda b: b * 2 + api.lax.axis_index("x").astype(api.numpy.float32), mesh=mesh_of(api, "4x2"),
    in_specs=api.P("x"), out_specs=api.P("x"), axis_names={"x"}), (X84,)))
add(ShardMapCase("axis_names-x-psum-x", N_, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, "x"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P(),
    axis_names={"x"}), (X84,)))
add(ShardMapCase("axis_names-x-block-shape", N_, lambda api: api.shard_map(
    lambda b: api.numpy.zeros((1, 1), api.numpy.int32) + b.shape[1] * 10 + b.shape[0], mesh=mesh_of(api, "4x2"),
    in_specs=api.P("x"), out_specs=api.P("x"), axis_names={"x"}), (X84,),
    note="the body sees the full extent along the automatic axis 'y'"))
add(ShardMapCase("axis_names-3d-xz", N_, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, "z") + api.lax.axis_index("x").astype(api.numpy.float32),
    mesh=mesh_of(api, "2x2x2"), in_specs=api.P(("x", "z")), out_specs=api.P("x"), axis_names={"x", "z"}),
    (np.arange(16, dtype=np.float32).reshape(8, 2),)))
add(ShardMapCase("axis_names-collective-over-auto-axis", N_, lambda api: api.shard_map(
    lambda b: api.lax.psum(b, "y"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x"),
    axis_names={"x"}), (X84,), raises="NameError", phrase="Found an unbound axis name: y",
    note="the message says 'please call pvary under jax.shard_map' (auto_pcast inserts a pvary first)"))
add(ShardMapCase("axis_names-axis_size-of-auto-axis", N_, lambda api: api.shard_map(
    lambda b: b + api.lax.axis_size("y"), mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x"),
    axis_names={"x"}), (X84,), raises="NameError", phrase="unbound axis name: y"))
add(ShardMapCase("axis_names-in_specs-mentions-auto-axis", N_, lambda api: api.shard_map(
    lambda b: b, mesh=mesh_of(api, "4x2"), in_specs=api.P("x", "y"), out_specs=api.P("x"), axis_names={"x"}),
    (X84,), raises="ValueError", phrase="must refer to an axis marked as manual"))
add(ShardMapCase("axis_names-not-a-subset", N_, lambda api: api.shard_map(
    lambda b: b, mesh=mesh_of(api, "4x2"), in_specs=api.P(), out_specs=api.P(), axis_names={"q"}), (X84,),
    raises="ValueError", phrase="to be a subset of mesh.axis_names"))
add(ShardMapCase("axis_names-list", N_, lambda api: api.shard_map(
    lambda b: b, mesh=mesh_of(api, "4x2"), in_specs=api.P(), out_specs=api.P(), axis_names=["x"]), (X84,),
    raises="TypeError", phrase="should be of type `frozenset` or `set`"))
add(ShardMapCase("axis_names-jit", N_, lambda api: api.jax.jit(api.shard_map(
    lambda b: api.lax.psum(b, "x") * 2, mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P(),
    axis_names={"x"})), (X84,), front_ends=JAX_FRONT_ENDS))

# ==========================================================================================================
# 10. the error catalogue (class as JAX 0.10.2 raises it; phrase from its message)
# ==========================================================================================================
E = "shard_map/errors"
X82 = np.arange(16, dtype=np.float32).reshape(8, 2)
ID = lambda b: b


for name, build, args, raises, phrase, note in [
    ("unknown-axis-in_specs", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"), in_specs=api.P("q"),
                                                         out_specs=api.P("x")), (X82,), "ValueError",
     "in_specs argument must refer to an axis marked as manual", ""),
    ("unknown-axis-out_specs", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                          out_specs=api.P("q")), (X82,), "ValueError",
     "out_specs argument must refer to an axis marked as manual", ""),
    ("axis-twice-in-spec-indivisible", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"),
                                                                  in_specs=api.P("x", "x"), out_specs=api.P("x")),
     (X82,), "ValueError", "not evenly divisible",
     "P('x','x') where a dimension is not divisible: the divisibility check comes first"),
    ("axis-twice-in-spec", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"), in_specs=api.P("x", "x"),
                                                      out_specs=api.P("x")),
     (np.zeros((16, 16), np.float32),), "DuplicateSpecError", "has duplicate entries for `x`",
     "DuplicateSpecError subclasses Exception directly (not ValueError)"),
    ("axis-twice-in-tuple", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"), in_specs=api.P(("x", "x")),
                                                       out_specs=api.P("x")),
     (np.zeros((16, 16), np.float32),), "DuplicateSpecError", "has duplicate entries for `x`", ""),
    ("axis-twice-in-tuple-indivisible", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"),
                                                                   in_specs=api.P(("x", "x")),
                                                                   out_specs=api.P("x")),
     (X82,), "ValueError", "of total size 16", ""),
    ("axis-twice-across-dims", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"),
                                                          in_specs=api.P(("x", "y"), "x"), out_specs=api.P("x")),
     (np.zeros((16, 16), np.float32),), "DuplicateSpecError", "has duplicate entries for `x`", ""),
    ("axis-twice-out_specs", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                        out_specs=api.P("x", "x")), (X82,), "DuplicateSpecError",
     "has duplicate entries for `x`", ""),
    ("spec-longer-than-rank", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"),
                                                         in_specs=api.P("x", "y", None), out_specs=api.P("x")),
     (X82,), "ValueError", "in_specs entry which is too long", ""),
    ("spec-on-scalar", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                  out_specs=api.P()), (np.float32(1),), "ValueError",
     "For scalar values (rank 0), consider using an in_specs entry of `P()`", ""),
    ("out-spec-longer-than-rank", lambda api: api.shard_map(lambda b: b.sum(), mesh=mesh_of(api, "4x2"),
                                                             in_specs=api.P("x"), out_specs=api.P("x")),
     (X82,), "ValueError", "out_specs entry which is too long", ""),
    ("not-divisible", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"), in_specs=api.P("y", "x"),
                                                 out_specs=api.P("y", "x")), (X82,), "ValueError",
     "but 4 does not evenly divide 2", ""),
    ("not-divisible-two-axes", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"),
                                                          in_specs=api.P(None, ("x", "y")), out_specs=api.P()),
     (X82,), "ValueError", "(of total size 8), but 8 does not evenly divide 2", ""),
    ("not-divisible-second-arg", lambda api: api.shard_map(lambda a, b: a, mesh=mesh_of(api, "8"),
                                                            in_specs=api.P("i"), out_specs=api.P("i")),
     (np.zeros(8, np.float32), np.zeros(12, np.float32)), "ValueError", "args[1]", ""),
    ("mesh-larger-than-devices", lambda api: api.mesh((4, 4), ("x", "y")), (), "ValueError",
     "must be >= the product of mesh_shape", ""),
    ("mesh-names-length-mismatch", lambda api: api.mesh((4, 2), ("x",)), (), "ValueError",
     "to equal the length of its second argument", ""),
    ("out_specs-structure-length", lambda api: api.shard_map(lambda b: (b, b), mesh=mesh_of(api, "4x2"),
                                                              in_specs=api.P("x"),
                                                              out_specs=(api.P("x"),) * 3), (X82,), "ValueError",
     "pytree structure error: different lengths of tuple", ""),
    ("out_specs-structure-dict-keys", lambda api: api.shard_map(lambda b: {"a": b}, mesh=mesh_of(api, "4x2"),
                                                                 in_specs=api.P("x"), out_specs={"b": api.P("x")}),
     (X82,), "ValueError", "pytree structure error: different pytree metadata", ""),
    ("out_specs-None", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                  out_specs=None), (X82,), "ValueError",
     "pytree structure error: different types", ""),
    ("in_specs-structure-length", lambda api: api.shard_map(lambda a, b: a, mesh=mesh_of(api, "4x2"),
                                                             in_specs=(api.P("x"),), out_specs=api.P("x")),
     (X82, X82), "ValueError", "pytree structure error: different lengths of tuple", ""),
    ("in_specs-list-for-args", lambda api: api.shard_map(lambda a, b: a, mesh=mesh_of(api, "4x2"),
                                                          in_specs=[api.P("x"), api.P("x")],
                                                          out_specs=api.P("x")), (X82, X82), "ValueError",
     "pytree structure error: different types", "in_specs must be a tuple for the positional args, not a list"),
    ("in_specs-not-a-spec", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"), in_specs=("x",),
                                                       out_specs=api.P()), (X82,), "TypeError",
     "in_specs argument must be a pytree of `jax.sharding.PartitionSpec` instances", ""),
    ("mesh-not-a-mesh", lambda api: api.shard_map(ID, mesh="mesh", in_specs=api.P(), out_specs=api.P()),
     (X82,), "TypeError", "requires a `jax.sharding.Mesh` or a `jax.sharding.AbstractMesh`", ""),
    ("f-not-callable", lambda api: api.shard_map(3, mesh=mesh_of(api, "4x2"), in_specs=api.P(),
                                                  out_specs=api.P()), (), "TypeError",
     "shard_map requires a callable for its first argument", "raised by shard_map(...) itself, not the call"),
    ("keyword-argument", lambda api: (lambda f: lambda x: f(x, b=x))(api.shard_map(  # noqa: PLC3002
        lambda a, b=1: a + b, mesh=mesh_of(api, "4x2"), in_specs=api.P("x"), out_specs=api.P("x"))), (X82,),
     "TypeError", "unexpected keyword argument 'b'", "the shard_map'd function takes positional args only"),
    ("string-argument", lambda api: api.shard_map(ID, mesh=mesh_of(api, "4x2"), in_specs=api.P(),
                                                   out_specs=api.P()), ("a",), "TypeError",
     "is not a valid JAX type", ""),
    ("psum-unknown-axis", lambda api: api.shard_map(lambda b: api.lax.psum(b, "q"), mesh=mesh_of(api, "4x2"),
                                                     in_specs=api.P("x"), out_specs=api.P("x")), (X82,),
     "AssertionError", None, "bare AssertionError (empty message) under check_vma=True"),
    ("psum-unknown-axis-unchecked", lambda api: api.shard_map(lambda b: api.lax.psum(b, "q"),
                                                               mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                               out_specs=api.P("x"), check_vma=False), (X82,),
     "NameError", "Found an unbound axis name: q", "check_vma=False: NameError, as in pmap"),
    ("pmean-unknown-axis", lambda api: api.shard_map(lambda b: api.lax.pmean(b, "q"), mesh=mesh_of(api, "4x2"),
                                                      in_specs=api.P("x"), out_specs=api.P("x")), (X82,),
     "AssertionError", None, ""),
    ("pmax-unknown-axis", lambda api: api.shard_map(lambda b: api.lax.pmax(b, "q"), mesh=mesh_of(api, "4x2"),
                                                     in_specs=api.P("x"), out_specs=api.P("x")), (X82,),
     "AssertionError", None, ""),
    ("ppermute-unknown-axis", lambda api: api.shard_map(lambda b: api.lax.ppermute(b, "q", [(0, 1)]),
                                                         mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                         out_specs=api.P("x")), (X82,), "AssertionError", None, ""),
    ("pcast-unknown-axis", lambda api: api.shard_map(lambda b: api.lax.pcast(b, "q", to="varying"),
                                                      mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                      out_specs=api.P("x")), (X82,), "AssertionError", None, ""),
    ("psum-tuple-with-unknown-axis", lambda api: api.shard_map(lambda b: api.lax.psum(b, ("x", "q")),
                                                                mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                                out_specs=api.P("x")), (X82,), "ValueError",
     "can only accept axis_name which corresponds to one of varying", ""),
    ("all_gather-unknown-axis", lambda api: api.shard_map(lambda b: api.lax.all_gather(b, "q"),
                                                           mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                           out_specs=api.P("x")), (X82,), "NameError",
     "unbound axis name: q", ""),
    ("psum_scatter-unknown-axis", lambda api: api.shard_map(lambda b: api.lax.psum_scatter(b, "q"),
                                                             mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                             out_specs=api.P("x")), (X82,), "NameError",
     "unbound axis name: q", ""),
    ("all_to_all-unknown-axis", lambda api: api.shard_map(lambda b: api.lax.all_to_all(b, "q", 0, 0),
                                                           mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                           out_specs=api.P("x")), (X82,), "NameError",
     "unbound axis name: q", ""),
    ("axis_index-unknown-axis", lambda api: api.shard_map(lambda b: b + api.lax.axis_index("q"),
                                                           mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                           out_specs=api.P("x")), (X82,), "NameError",
     "Found an unbound axis name: q", ""),
    ("axis_size-unknown-axis", lambda api: api.shard_map(lambda b: b + api.lax.axis_size("q"),
                                                          mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                          out_specs=api.P("x")), (X82,), "NameError",
     "unbound axis name: q", ""),
    ("psum-repeated-axis", lambda api: api.shard_map(lambda b: api.lax.psum(b, ("x", "x")),
                                                      mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                      out_specs=api.P("x"), check_vma=False), (X82,), "ValueError",
     "repeated axis in `source` argument", ""),
    ("ppermute-index-out-of-range", lambda api: api.shard_map(lambda b: api.lax.ppermute(b, "i", [(0, 8)]),
                                                               mesh=mesh_of(api, "8"), in_specs=api.P("i"),
                                                               out_specs=api.P("i")), (X82,), "IndexError",
     "list index out of range", ""),
    ("ppermute-source-out-of-range", lambda api: api.shard_map(lambda b: api.lax.ppermute(b, "i", [(9, 0)]),
                                                                mesh=mesh_of(api, "8"), in_specs=api.P("i"),
                                                                out_specs=api.P("i")), (X82,), "IndexError",
     "list index out of range", ""),
    ("ppermute-duplicate", lambda api: api.shard_map(lambda b: api.lax.ppermute(b, "i", [(0, 1), (0, 2)]),
                                                      mesh=mesh_of(api, "8"), in_specs=api.P("i"),
                                                      out_specs=api.P("i")), (X82,), "ValueError",
     "ppermute sources and destinations must be unique", ""),
    ("ppermute-duplicate-modulo", lambda api: api.shard_map(lambda b: api.lax.ppermute(b, "i", [(0, 1), (-8, 2)]),
                                                             mesh=mesh_of(api, "8"), in_specs=api.P("i"),
                                                             out_specs=api.P("i")), (X82,), "ValueError",
     "ppermute sources and destinations must be unique", "uniqueness is checked modulo the axis size"),
    ("pshuffle-not-a-permutation", lambda api: api.shard_map(
        lambda b: api.lax.pshuffle(b, "i", [1, 1, 2, 3, 4, 5, 6, 7]), mesh=mesh_of(api, "8"), in_specs=api.P("i"),
        out_specs=api.P("i")), (X82,), "ValueError", "does not represent a permutation", ""),
    ("psum_scatter-size", lambda api: api.shard_map(lambda b: api.lax.psum_scatter(b, "i"),
                                                     mesh=mesh_of(api, "8"), in_specs=api.P("i"),
                                                     out_specs=api.P("i")), (X82,), "ValueError",
     "scatter dimension size 1 must match shard count 8", ""),
    ("psum_scatter-tiled-size", lambda api: api.shard_map(lambda b: api.lax.psum_scatter(b, "x", tiled=True),
                                                           mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                           out_specs=api.P("x")), (X82,), "ValueError",
     "must be divisible by shard_count 4", ""),
    ("all_to_all-size", lambda api: api.shard_map(lambda b: api.lax.all_to_all(b, "i", 1, 1),
                                                   mesh=mesh_of(api, "8"), in_specs=api.P("i"),
                                                   out_specs=api.P("i")), (X82,), "ValueError",
     "but they are 8 and 2 respectively", ""),
    ("all_to_all-tiled-size", lambda api: api.shard_map(lambda b: api.lax.all_to_all(b, "x", 1, 1, tiled=True),
                                                         mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                         out_specs=api.P("x")), (X82,), "ValueError",
     "has to be divisible by the size of the named axis", ""),
    ("all_gather-axis-out-of-bounds", lambda api: api.shard_map(lambda b: api.lax.all_gather(b, "x", axis=3),
                                                                 mesh=mesh_of(api, "4x2"), in_specs=api.P("x"),
                                                                 out_specs=api.P("x")), (X82,), "ValueError",
     "out of bounds", ""),
    ("collective-outside-shard_map", lambda api: lambda x: api.lax.all_gather(x, "x"), (X82,), "NameError",
     "unbound axis name: x", ""),
    ("psum-outside-shard_map", lambda api: lambda x: api.lax.psum(x, "x"), (X82,), "NameError",
     "unbound axis name: x", "a concrete (non-tracer) operand: the axis-size lookup raises first"),
    ("control-pmax-out-P()", lambda api: api.shard_map(lambda b: api.lax.pmax(b, "i"), mesh=mesh_of(api, "8"),
                                                        in_specs=api.P("i"), out_specs=api.P()), (X82,), None,
     None, "control: the same shard_map without the mistake"),
]:
    add(ShardMapCase(f"error-{name}", E, build, args, raises=raises, phrase=phrase, note=note,
                     jax_may_abort=name == "psum-repeated-axis"))  # jaxlib 0.12: an XLA check aborts
add(ShardMapCase("error-context-mesh-missing", E, lambda api: api.shard_map(
    ID, mesh=None, in_specs=api.P(), out_specs=api.P()), (X82,), raises="ValueError",
    phrase="The context mesh cannot be empty", front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("error-in_specs-omitted-auto-mesh", E, lambda api: api.jax.shard_map(
    ID, mesh=mesh_of(api, "4x2"), out_specs=api.P()), (X82,), raises="TypeError",
    phrase="but it was `None` when axis_names=", front_ends=JAX_FRONT_ENDS,
    note="in_specs defaults to Infer, which needs Explicit axes; the message wrongly says it was `None`"))
add(ShardMapCase("error-positional-mesh", E, lambda api: api.jax.shard_map(
    ID, mesh_of(api, "4x2"), api.P(), api.P()), (), raises="TypeError",
    phrase="takes from 0 to 1 positional arguments", front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("error-duplicate-mesh-names", E, lambda api: api.shard_map(
    lambda b: b, mesh=api.mesh((4, 2), ("x", "x")), in_specs=api.P("x"), out_specs=api.P("x")),
    (np.zeros(8, np.float32),), raises="DuplicateSpecError", phrase="has duplicate entries for `x`",
    note="make_mesh((4, 2), ('x', 'x')) itself succeeds (shape collapses to {'x': 2}); the first shard_map on "
         "it fails. Recommendation: reject duplicate names in make_mesh with ValueError (a known difference)"))

# ==========================================================================================================
# 11. explicit axis types (jax.make_mesh's default) and the legacy API (JAX front ends)
# ==========================================================================================================
X_ = "shard_map/explicit"


def emesh(api, shape=(4, 2), names=("x", "y"), types=None):
    return api.jax.make_mesh(shape, names) if types is None else api.jax.make_mesh(shape, names, axis_types=types)


def placed(api, mesh, spec):
    return lambda x: api.jax.device_put(x, api.jax.sharding.NamedSharding(mesh, spec))


def under_mesh(api, mesh, thunk):
    with api.jax.set_mesh(mesh):
        return thunk()


def sm_sq_sum(api, mesh=None):
    """shard_map of sum(b * b) over every device, replicated out (``mesh=None``: the context mesh)."""
    return api.jax.shard_map(lambda b: api.lax.psum((b * b).sum(), ("x", "y")), mesh=mesh,
                             in_specs=api.P("x", "y"), out_specs=api.P())


def explicit(build_with_mesh, types=None):
    """build(api) for an Explicit-axes (4, 2) mesh: ``build_with_mesh(api, mesh)`` returns the callable."""
    return lambda api: build_with_mesh(api, emesh(api, types=types))


EXPLICIT = [
    ("numpy-input-rejected", explicit(lambda api, m: api.jax.shard_map(
        lambda b: b * 2, mesh=m, in_specs=api.P("x", "y"), out_specs=api.P("x", "y"))),
     "ValueError", "does not match the specs of the input: P(None, None)"),
    ("numpy-input-rejected-jit", explicit(lambda api, m: api.jax.jit(api.jax.shard_map(
        lambda b: b * 2, mesh=m, in_specs=api.P("x", "y"), out_specs=api.P("x", "y")))),
     "ValueError", "does not match the specs of the input"),
    ("numpy-input-replicated-spec-ok", explicit(lambda api, m: api.jax.shard_map(
        lambda b: b * 2, mesh=m, in_specs=api.P(), out_specs=api.P())), None, None),
    ("device_put-input", explicit(lambda api, m: lambda x: api.jax.shard_map(
        lambda b: api.lax.psum(b, "y"), mesh=m, in_specs=api.P("x", "y"), out_specs=api.P("x"))(
        placed(api, m, api.P("x", "y"))(x))), None, None),
    ("device_put-input-jit", explicit(lambda api, m: lambda x: api.jax.jit(api.jax.shard_map(
        lambda b: api.lax.psum(b, "y"), mesh=m, in_specs=api.P("x", "y"), out_specs=api.P("x")))(
        placed(api, m, api.P("x", "y"))(x))), None, None),
    ("device_put-wrong-spec", explicit(lambda api, m: lambda x: api.jax.shard_map(
        lambda b: b, mesh=m, in_specs=api.P("x"), out_specs=api.P("x"))(placed(api, m, api.P("x", "y"))(x))),
     "ValueError", "in_specs passed to shard_map: P('x', None) does not match the specs of the input: P('x', 'y')"),
    ("infer-in_specs", explicit(lambda api, m: lambda x: api.jax.shard_map(
        lambda b: b * 2, mesh=m, out_specs=api.P("x", "y"))(placed(api, m, api.P("x", "y"))(x))), None, None),
    ("reshard-under-set_mesh", explicit(lambda api, m: lambda x: under_mesh(api, m, lambda: api.jax.shard_map(
        lambda b: b + 1, in_specs=api.P("x", "y"), out_specs=api.P("x", "y"))(api.jax.reshard(x, api.P("x", "y"))))),
     None, None),
    ("reshard-in-jit-under-set_mesh", explicit(lambda api, m: lambda x: under_mesh(api, m, lambda: api.jax.jit(
        lambda a: api.jax.shard_map(lambda b: api.lax.psum(b, "x"), in_specs=api.P("x", "y"),
                                    out_specs=api.P(None, "y"))(api.jax.reshard(a, api.P("x", "y"))))(x))),
     None, None),
    ("reshard-PartitionSpec-without-mesh", lambda api: lambda x: api.jax.reshard(x, api.P("x")), "ValueError",
     "Using PartitionSpec when you are not under a mesh context is not allowed"),
    ("reshard-NamedSharding-without-mesh", explicit(lambda api, m: lambda x: api.jax.shard_map(
        lambda b: b * 3, mesh=m, in_specs=api.P("x", "y"), out_specs=api.P("x", "y"))(
        api.jax.reshard(x, api.jax.sharding.NamedSharding(m, api.P("x", "y"))))), None, None),
    ("grad-outside-jit-without-set_mesh", explicit(lambda api, m: lambda x: api.jax.grad(sm_sq_sum(api, m))(
        placed(api, m, api.P("x", "y"))(x))), "ValueError",
     "Please enter your `jit` into a mesh context via `jax.set_mesh`"),
    ("grad-inside-jit-without-set_mesh", explicit(lambda api, m: lambda x: api.jax.jit(api.jax.grad(
        sm_sq_sum(api, m)))(placed(api, m, api.P("x", "y"))(x))), None, None),
    ("grad-outside-jit-with-set_mesh", explicit(lambda api, m: lambda x: under_mesh(api, m, lambda: api.jax.grad(
        sm_sq_sum(api, m))(placed(api, m, api.P("x", "y"))(x)))), None, None),
    ("reshape-splitting-sharded-dim", explicit(lambda api, m: lambda x: placed(api, m, api.P("x", "y"))(x).reshape(
        4, 8)), "ShardingTypeError", "This reshape is not supported"),
    ("reshape-merging-dims", explicit(lambda api, m: lambda x: placed(api, m, api.P("x", "y"))(x).reshape(32)),
     None, None),
    ("mixed-explicit-auto-numpy-input", lambda api: explicit(lambda api, m: api.jax.shard_map(
        lambda b: b * 2, mesh=m, in_specs=api.P("x", "y"), out_specs=api.P("x", "y")),
        types=(api.jax.sharding.AxisType.Explicit, api.jax.sharding.AxisType.Auto))(api), None, None),
    ("partial-manual-explicit", explicit(lambda api, m: lambda x: api.jax.shard_map(
        lambda b: b * 2, mesh=m, in_specs=api.P("x"), out_specs=api.P("x"), axis_names={"x"})(
        placed(api, m, api.P("x", "y"))(x))), None, None),
    ("context-mesh-no-mesh-argument", explicit(lambda api, m: lambda x: under_mesh(api, m, lambda: api.jax.shard_map(
        lambda b: api.lax.pmax(b, "y"), in_specs=api.P("x", "y"), out_specs=api.P("x"))(
        placed(api, m, api.P("x", "y"))(x)))), None, None),
    ("context-mesh-grad-sum", explicit(lambda api, m: lambda x: under_mesh(api, m, lambda: api.jax.grad(
        sm_sq_sum(api))(api.jax.reshard(x, api.P("x", "y"))))), None, None),
]
for name, build, raises, phrase in EXPLICIT:
    add(ShardMapCase(f"explicit-{name}", X_, build, (np.arange(32, dtype=np.float32).reshape(8, 4),),
                     front_ends=JAX_FRONT_ENDS, raises=raises, phrase=phrase))

L_ = "shard_map/legacy"
add(ShardMapCase("legacy-positional", L_, lambda api: api.legacy_shard_map(
    lambda b: api.lax.psum(b, "x"), mesh_of(api, "4x2"), api.P("x"), api.P()), (np.arange(8, dtype=np.float32),),
    front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("legacy-check_rep-false-device0", L_, lambda api: api.legacy_shard_map(
    lambda b: b, mesh_of(api, "4x2"), api.P("x"), api.P(), check_rep=False), (np.arange(8, dtype=np.float32),),
    front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("legacy-check_rep-true-error", L_, lambda api: api.legacy_shard_map(
    lambda b: b, mesh_of(api, "4x2"), api.P("x"), api.P()), (np.arange(8, dtype=np.float32),),
    front_ends=JAX_FRONT_ENDS, raises="ValueError", phrase="out_specs which require replication"))
add(ShardMapCase("legacy-grad-psum-is-N-unchecked", L_, lambda api: api.legacy_shard_map(
    lambda b: api.jax.grad(lambda v: api.lax.psum(v, "i").sum())(b), mesh_of(api, "8"), api.P("i"), api.P("i"),
    check_rep=False), (np.arange(8, dtype=np.float32),), front_ends=JAX_FRONT_ENDS))
add(ShardMapCase("legacy-jit", L_, lambda api: api.jax.jit(api.legacy_shard_map(
    lambda b: api.lax.all_gather(b, "y", tiled=True), mesh_of(api, "4x2"), api.P("x", "y"), api.P("x"),
    check_rep=False)), (np.arange(32, dtype=np.float32).reshape(8, 4),), front_ends=JAX_FRONT_ENDS))

# ==========================================================================================================
# 12. small programs (forward passes; both front ends)
# ==========================================================================================================
PR = "shard_map/programs"
RP = np.random.default_rng(5)
XB = RP.integers(-3, 4, (8, 4)).astype(np.float32)
W1 = RP.integers(-3, 4, (4, 6)).astype(np.float32)
W2 = RP.integers(-3, 4, (6, 4)).astype(np.float32)


def megatron(api, x, w1, w2):
    h = api.numpy.maximum(x @ w1, 0)               # column-parallel: w1 split over 'model' (columns)
    return api.lax.psum(h @ w2, "model")           # row-parallel: w2 split over 'model' (rows)


add(ShardMapCase("program-megatron-mlp", PR, lambda api: api.shard_map(
    lambda x, w1, w2: megatron(api, x, w1, w2),
    mesh=api.mesh((4, 2), ("data", "model")), in_specs=(api.P("data"), api.P(None, "model"), api.P("model")),
    out_specs=api.P("data")), (XB, W1, W2)))
add(ShardMapCase("program-megatron-mlp-mean-loss", PR, lambda api: api.shard_map(
    lambda x, w1, w2: api.lax.pmean((megatron(api, x, w1, w2) ** 2).mean(), "data"),
    mesh=api.mesh((4, 2), ("data", "model")), in_specs=(api.P("data"), api.P(None, "model"), api.P("model")),
    out_specs=api.P()), (XB, W1, W2)))


def collective_matmul(api, xb, wb, axis="i", n=8):
    """x sharded by rows, w by rows (contraction dim): each device accumulates x_blk[:, k-block] @ w_k while
    the w blocks travel around the ring with ppermute; the result rows are complete on every device."""
    idx = api.lax.axis_index(axis)
    k = wb.shape[0]
    acc = api.numpy.zeros((xb.shape[0], wb.shape[1]), xb.dtype)
    # the k-blocks of x in the order the w blocks arrive: block (idx + step) % n at each step
    blocks = xb.reshape(xb.shape[0], n, k)[:, (idx + api.numpy.arange(n)) % n]
    w = wb
    for step in range(n):
        acc = acc + blocks[:, step] @ w
        w = api.lax.ppermute(w, axis, [(j, (j - 1) % n) for j in range(n)])
    return acc


XM = RP.integers(-3, 4, (8, 16)).astype(np.float32)
WM = RP.integers(-3, 4, (16, 5)).astype(np.float32)
# (a ring of 4: real JAX's eager shard_map compiles each operation once per device, 280 programs for a ring of 8)
add(ShardMapCase("program-collective-matmul-ring", PR, lambda api: api.shard_map(
    lambda xb, wb: collective_matmul(api, xb, wb, n=4), mesh=api.mesh((4,), ("i",)),
    in_specs=(api.P("i"), api.P("i")), out_specs=api.P("i")), (XM, WM)))
add(ShardMapCase("program-allgather-matmul", PR, lambda api: api.shard_map(
    lambda xb, wb: xb @ api.lax.all_gather(wb, "i", tiled=True), mesh=mesh_of(api, "8"),
    in_specs=(api.P("i"), api.P("i")), out_specs=api.P("i")), (XM, WM)))
add(ShardMapCase("program-matmul-reduce-scatter", PR, lambda api: api.shard_map(
    lambda xb, wb: api.lax.psum_scatter(xb @ wb, "i", scatter_dimension=0, tiled=True), mesh=mesh_of(api, "8"),
    in_specs=(api.P(None, "i"), api.P("i")), out_specs=api.P("i")), (XM, WM)))
add(ShardMapCase("program-2d-matmul-x-y", PR, lambda api: api.shard_map(
    lambda a, b: api.lax.psum(a @ b, "y"), mesh=mesh_of(api, "4x2"), in_specs=(api.P("x", "y"), api.P("y")),
    out_specs=api.P("x")), (XM, WM)))
def sharded_softmax(api, s):
    """Softmax over dimension 1, which is split over 'y': the max and the sum are collectives."""
    e = api.numpy.exp(s - api.lax.pmax(s.max(axis=1, keepdims=True), "y"))
    return e / api.lax.psum(e.sum(axis=1, keepdims=True), "y")


def sharded_layernorm(api, h):
    """Normalize over dimension 1, which is split over 'y' (equal blocks: pmean of means is the mean)."""
    mu = api.lax.pmean(h.mean(axis=1, keepdims=True), "y")
    var = api.lax.pmean(((h - mu) ** 2).mean(axis=1, keepdims=True), "y")
    return (h - mu) / api.numpy.sqrt(var + 1)


add(ShardMapCase("program-softmax-over-sharded-dim", PR, lambda api: api.shard_map(
    lambda s: sharded_softmax(api, s), mesh=mesh_of(api, "4x2"), in_specs=api.P("x", "y"),
    out_specs=api.P("x", "y")), (XM / 4,)))
add(ShardMapCase("program-layernorm-sharded-features", PR, lambda api: api.shard_map(
    lambda h: sharded_layernorm(api, h), mesh=mesh_of(api, "4x2"), in_specs=api.P("x", "y"),
    out_specs=api.P("x", "y")), (XM,)))


def ring_allreduce(api, b, n=8):
    acc = send = b
    for _ in range(n - 1):
        send = api.lax.ppermute(send, "i", shift_perm(n))
        acc = acc + send
    return acc


add(ShardMapCase("program-ring-allreduce", PR, lambda api: api.shard_map(
    lambda b: ring_allreduce(api, b), mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P("i")),
    (np.arange(16, dtype=np.float32),)))
add(ShardMapCase("program-all_to_all-transpose", PR, lambda api: api.shard_map(
    lambda b: api.lax.all_to_all(b, "i", 1, 0, tiled=True), mesh=mesh_of(api, "8"), in_specs=api.P("i"),
    out_specs=api.P(None, "i")), (np.arange(64, dtype=np.float32).reshape(8, 8),)))
add(ShardMapCase("program-data-parallel-step-handwritten-grad", PR, lambda api: api.shard_map(
    lambda w, xb, yb: w - 0.1 * api.lax.pmean(2.0 * xb.T @ (xb @ w - yb) / xb.shape[0], "i"),
    mesh=mesh_of(api, "8"), in_specs=(api.P(), api.P("i"), api.P("i")), out_specs=api.P()), (WDP, XDP, YDP)))
add(ShardMapCase("program-pipeline-shift", PR, lambda api: api.shard_map(
    lambda b: api.lax.ppermute(api.numpy.tanh(b), "stage", [(j, j + 1) for j in range(3)]),
    mesh=api.mesh((4, 2), ("stage", "data")), in_specs=api.P("stage", "data"), out_specs=api.P("stage", "data")),
    (XM / 4,)))
add(ShardMapCase("program-3d-mesh-all-collectives", PR, lambda api: api.shard_map(
    lambda b: api.lax.psum(api.lax.all_gather(api.lax.ppermute(b, "z", [(0, 1), (1, 0)]), "y", tiled=True),
                           "x") * (1 + api.lax.axis_index(("z", "y")).astype(api.numpy.float32)),
    mesh=mesh_of(api, "2x2x2"), in_specs=api.P(("x", "y", "z")), out_specs=api.P(("y", "z"))),
    (np.arange(16, dtype=np.float32).reshape(8, 2),)))

# ==========================================================================================================
# 13. collectives XLA:CPU cannot run: the documented results (JAX raises on CPU; a simulator returns these)
# ==========================================================================================================
U = "shard_map/cpu-unimplemented"


def ragged_reference(*args):
    return np.stack(ref.ragged_all_to_all(*[list(a) for a in args]))


def ragged_case(cid, operand, output, io, ss, oo, rs, note=""):
    args = tuple(np.asarray(a) for a in (operand, output, io, ss, oo, rs))
    args = tuple(a.astype(np.int32) if a.dtype == np.int64 else a for a in args)  # JAX's dtypes (x64 off)
    n = args[0].shape[0]
    add(ShardMapCase(cid, U, lambda api, n=n: api.shard_map(
        lambda *a: api.lax.ragged_all_to_all(*[v[0] for v in a], axis_name="x")[None],
        mesh=api.mesh((n,), ("x",)), in_specs=api.P("x"), out_specs=api.P("x")), args,
        raises="JaxRuntimeError", phrase="ragged-all-to-all", expected=ragged_reference, devices_needed=n,
        note=note or "XLA:CPU: UNIMPLEMENTED: HLO opcode `ragged-all-to-all` is not supported"))


# the docstring's example (axis of size 2)
ragged_case("ragged_all_to_all-docstring-2", [[1, 2, 2], [3, 4, 0]], [[0] * 4, [0] * 4],
            [[0, 1], [0, 1]], [[1, 2], [1, 1]], [[0, 0], [1, 2]], [[1, 1], [2, 1]])
# 4 devices, one slice per destination: device d sends d+1 copies of its id... to each other device
ragged_case("ragged_all_to_all-4-one-slice-each",
            np.arange(4 * 8, dtype=np.float32).reshape(4, 8), np.full((4, 10), -1, np.float32),
            [[0, 1, 2, 3]] * 4, [[1, 1, 1, 1], [2, 2, 2, 2], [1, 2, 1, 2], [0, 1, 0, 1]],
            [[0, 0, 0, 0], [1, 1, 1, 1], [3, 3, 3, 3], [4, 5, 4, 5]],
            [[1, 2, 1, 0], [1, 2, 2, 1], [1, 2, 1, 0], [1, 2, 2, 1]])
# two slices per destination (K = 2N), padding left in the output
ragged_case("ragged_all_to_all-2-two-slices-each",
            [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]], [[0] * 8, [0] * 8],
            [[0, 1, 3, 4], [0, 2, 3, 5]], [[1, 2, 1, 1], [2, 1, 2, 1]], [[0, 1, 0, 1], [3, 5, 2, 4]],
            [[1, 2, 2, 1], [1, 1, 2, 1]])
# 2-D payload rows (operand (N, A)): slices move whole rows
ragged_case("ragged_all_to_all-rows",
            np.arange(2 * 4 * 2, dtype=np.float32).reshape(2, 4, 2), np.zeros((2, 5, 2), np.float32),
            [[0, 1], [0, 3]], [[1, 3], [3, 1]], [[0, 0], [1, 3]], [[1, 3], [3, 1]])
ragged_case("ragged_all_to_all-int32-zero-sizes",
            np.arange(12, dtype=np.int32).reshape(2, 6), np.full((2, 4), 7, np.int32),
            [[0, 2], [1, 4]], [[0, 2], [2, 0]], [[0, 0], [0, 2]], [[0, 2], [2, 0]],
            note="zero-size slices leave the output untouched")
add(ShardMapCase("ragged_all_to_all-float-offsets", U, lambda api: api.shard_map(
    lambda *a: api.lax.ragged_all_to_all(*[v[0] for v in a], axis_name="x")[None], mesh=api.mesh((2,), ("x",)),
    in_specs=api.P("x"), out_specs=api.P("x")),
    (np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32), np.zeros((2, 2), np.float32),
     np.ones((2, 2), np.int32), np.zeros((2, 2), np.int32), np.ones((2, 2), np.int32)), raises="ValueError",
    phrase="ragged_all_to_all input_offsets must be integer type.", devices_needed=2))
add(ShardMapCase("ragged_all_to_all-outside-shard_map", U, lambda api: lambda *a: api.lax.ragged_all_to_all(
    *a, axis_name="x"), (np.zeros(3, np.float32), np.zeros(4, np.float32), np.zeros(2, np.int32),
                         np.ones(2, np.int32), np.zeros(2, np.int32), np.ones(2, np.int32)),
    front_ends=JAX_FRONT_ENDS, raises="RuntimeError", phrase="must be used within a mapped context"))


def ppermute_reference(perm, n):
    def expected(x):
        out = np.zeros_like(x)
        for s, t in perm:
            out[t] = x[s]
        return out
    return expected


for perm_name, perm in {"forward-edge": [(0, 1)], "chain": [(j, j + 1) for j in range(7)],
                        "back-edge": [(7, 0)]}.items():
    add(ShardMapCase(f"psend-precv-{perm_name}", U, lambda api, perm=perm: api.jax.jit(api.shard_map(
        lambda b: api.lax.precv(api.lax.psend(b, "i", perm), api.jax.ShapeDtypeStruct(b.shape, b.dtype), "i", perm),
        mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P("i"))),
        (np.arange(16, dtype=np.float32).reshape(8, 2) + 1,), front_ends=JAX_FRONT_ENDS,
        raises="NotImplementedError", phrase="psend is currently only implemented on GPU",
        expected=ppermute_reference(perm, 8),
        note="as ppermute: a destination receives the source's block, the rest get zeros (NCCL send/recv)"))
add(ShardMapCase("psend-precv-eager", U, lambda api: api.shard_map(
    lambda b: api.lax.precv(api.lax.psend(b, "i", [(0, 1)]), api.jax.ShapeDtypeStruct(b.shape, b.dtype), "i",
                            [(0, 1)]), mesh=mesh_of(api, "8"), in_specs=api.P("i"), out_specs=api.P("i")),
    (np.arange(16, dtype=np.float32).reshape(8, 2),), front_ends=JAX_FRONT_ENDS, raises="AttributeError",
    phrase="'AbstractToken' object has no attribute 'mat'", expected=ppermute_reference([(0, 1)], 8),
    note="JAX BUG: psend/precv under an un-jitted shard_map crash in the eager path"))


for mesh_key, axes, source in [("8", "i", 3), ("4x2", "x", 2), ("4x2", "y", 1), ("2x2x2", ("x", "y"), 2),
                               ("2x2x2", ("z", "x"), 1)]:
    add(ShardMapCase(f"pbroadcast-{mesh_key}-{label(axes)}-source{source}", U,
                     per_device(mesh_key, lambda api, v, a=axes, s=source: api.lax.pbroadcast(v, a, s)),
                     (np.arange(8 * 2, dtype=np.float32).reshape(8, 2),), raises="NotImplementedError",
                     phrase="MLIR translation rule for primitive 'pbroadcast' not found for platform cpu",
                     expected=reference_rows(mesh_key, "pbroadcast", axes, {"source": source}),
                     note="GPU-only in 0.10.2; over a tuple the source rank is taken in the GIVEN order (the "
                          "lowering indexes the replica group, built in the given order; not run on a GPU)"
                     if isinstance(axes, tuple) else "GPU-only in 0.10.2"))


def areas() -> dict:
    out: dict[str, int] = {}
    for case in CASES.values():
        out[case.area] = out.get(case.area, 0) + 1
    return out
