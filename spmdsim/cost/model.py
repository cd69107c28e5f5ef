"""FLOPs, bytes and collectives of a map's per-device jaxpr, and their time on a topology.

:func:`analyze` walks the body jaxpr that a map traced (the one ``spmdsim.jax`` runs), once per body: calls
(``pjit``, custom derivatives, remat) are inlined, loops counted by their trip count (``scan``'s length; a
``while`` once, said in a note), the costlier branch of a ``cond`` kept, nested maps entered with their axes.
Each equation becomes an :class:`Op`:

- ``dot_general``: ``2 * output size * contracted size`` FLOPs; ``conv_general_dilated``: ``2 * output size *
  kernel size / output features``; elementwise operations one FLOP per output element; reductions one per input
  element; data movement (broadcast, reshape, transpose, slices, gathers, scatters) none.
- Bytes under two assumptions: *unfused*, every equation reads its operands from HBM and writes its results;
  *fused* (XLA-like, declared in :data:`FUSIBLE`), a value made by a fusible equation and used only by
  fusible ones stays on chip. Gathers and dynamic slices read what they return (and their indices), scatters
  and dynamic updates what they write.
- Collectives: the group of devices each spans (the axes named, ``axis_index_groups``), the bytes moved, and
  for ``ppermute`` the device pairs.

:meth:`MapCost.predict` times the ops on a :class:`~spmdsim.cost.hardware.Topology`: each compute op by its
roofline, ``max(FLOPs / peak, bytes / HBM bandwidth)``, each collective by :mod:`spmdsim.cost.collectives`.

The jaxprs are read through their public attributes (``eqns``, ``invars``, ``aval``, ``params``); no JAX
internals are imported.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np

from spmdsim.cost import collectives
from spmdsim.cost.hardware import Topology

__all__ = ["Op", "MapCost", "analyze", "OpTime", "MapPrediction", "FUSIBLE"]

CALLS = {"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
         "remat", "remat2", "checkpoint", "custom_lin", "composite", "eval_jaxpr", "call_hi_primitive"}
MAPS = {"spmdsim_map", "shard_map", "xla_pmap"}
REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
              "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "reduce_precision"}
MOVES = {"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "slice", "pad", "concatenate", "rev",
         "convert_element_type", "copy", "copy_p", "iota", "bitcast_convert_type", "split", "device_put"}
INDEXED = {"gather", "dynamic_slice", "scatter", "scatter-add", "scatter_add", "scatter_mul", "scatter_min",
           "scatter_max", "scatter_sub", "dynamic_update_slice"}
FREE = {"axis_index", "pvary", "create_token", "after_all", "preduced", "vary_unreduced_cast", "reduced_vary_cast",
        "vary_unreduced_cast_p", "reduced_vary_cast_p", "reshard", "random_wrap", "random_unwrap", "random_seed",
        "optimization_barrier", "debug_callback", "debug_print", "mesh_cast", "sharding_constraint"}
COLLECTIVES = {
    "psum": "all-reduce", "psum_invariant": "all-reduce", "unreduced_psum": "all-reduce", "pmax": "all-reduce",
    "pmin": "all-reduce", "unreduced_pmax": "all-reduce", "unreduced_pmin": "all-reduce",
    "all_gather": "all-gather", "all_gather_invariant": "all-gather", "all_gather_reduced": "all-gather",
    "pbroadcast": "all-gather",
    "reduce_scatter": "reduce-scatter", "unreduced_reduce_scatter": "reduce-scatter", "psum_scatter": "reduce-scatter",
    "all_to_all": "all-to-all", "ragged_all_to_all": "all-to-all",
    "ppermute": "ppermute", "psend": "ppermute",
}
# The declared fusion rule: these fuse with their producers and consumers (XLA's loop and input fusion);
# everything else (dots, convolutions, gathers, scatters, sorts, collectives, custom calls) reads its operands
# from HBM and writes its results there.
NOT_FUSIBLE = {"dot_general", "conv_general_dilated", "sort", "precv", "ragged_dot", "ragged_dot_general"} | INDEXED


def fusible(prim: str) -> bool:
    return prim not in NOT_FUSIBLE and prim not in COLLECTIVES and prim not in CALLS and prim not in MAPS


FUSIBLE = "elementwise, broadcast/reshape/transpose/slice/pad/concatenate/convert, reductions"


def _itemsize(dtype) -> int:
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        return int(getattr(dtype, "itemsize", 8) or 8)  # extended dtypes (PRNG keys)


def _nbytes(aval) -> int:
    shape = getattr(aval, "shape", None)
    if shape is None:
        return 0  # tokens
    return int(math.prod(shape)) * _itemsize(aval.dtype)


def _size(aval) -> int:
    return int(math.prod(getattr(aval, "shape", ()) or ()))


def dtype_class(dtype) -> str:
    """The peak a dot of ``dtype`` runs at: ``bf16`` (bfloat16, float16), ``f32``, ``f64``, ``int8``, ``fp8``."""
    name = str(np.dtype(dtype)) if not hasattr(dtype, "name") else str(dtype.name)
    if name in ("bfloat16", "float16"):
        return "bf16"
    if name.startswith("float8"):
        return "fp8"
    if name in ("int8", "uint8", "int4", "uint4"):
        return "int8"
    if name == "float64":
        return "f64"
    return "f32"


_RANK = {"int8": 0, "fp8": 1, "bf16": 2, "f32": 3, "f64": 4}


class Val:
    """A value of the flattened program: its bytes, the op that makes it (None: a map input or constant), the
    ops that read it; ``kept``: it must be in HBM anyway (an input, an output, a loop's state)."""

    __slots__ = ("nbytes", "producer", "consumers", "kept")

    def __init__(self, nbytes: int, producer=None, kept: bool = False):
        self.nbytes, self.producer, self.consumers, self.kept = nbytes, producer, [], kept


@dataclasses.dataclass(eq=False)
class Op:
    """One equation of the flattened body. ``count``: how many times it runs per call (loop trip counts);
    ``kind``: ``dot`` (matrix unit), ``vector`` (elementwise, reductions), ``memory`` (data movement only),
    ``collective`` or ``free``."""

    primitive: str
    name: str
    site: str
    kind: str
    flops: float = 0.0
    count: float = 1.0
    inputs: list = dataclasses.field(default_factory=list)
    outputs: list = dataclasses.field(default_factory=list)
    read_extra: int = 0   # bytes read besides whole operands (gathers: indices and the rows taken)
    dtype: str = "f32"
    precision: str | None = None
    collective: str | None = None   # all-reduce, all-gather, reduce-scatter, all-to-all, ppermute
    comm_bytes: float = 0.0         # V: the array the book's formula takes (see spmdsim.cost.collectives)
    groups: Any = None              # device ids: one group per row
    pairs: Any = None               # ppermute: (source, destination) device ids
    axes: tuple = ()                # the mesh axes a collective spans

    def bytes(self, fused: bool) -> int:
        """HBM bytes read and written per run: every operand and result (unfused), or only those kept in HBM
        under the fusion rule (fused)."""
        if self.kind in ("collective", "free"):
            return 0
        if self.primitive in INDEXED:
            return self.read_extra + sum(v.nbytes for v in self.outputs)
        ins = [v for v in self.inputs if v is not None]
        if fused:
            ins = [v for v in ins if _materialized(v)]
            outs = [v for v in self.outputs if _materialized(v)]
        else:
            outs = self.outputs
        return sum(v.nbytes for v in ins) + sum(v.nbytes for v in outs) + self.read_extra


def _materialized(v: Val) -> bool:
    if v.kept or v.producer is None or not fusible(v.producer.primitive):
        return True
    return any(not fusible(c.primitive) for c in v.consumers)


@dataclasses.dataclass
class MapCost:
    """The flattened per-device program of one map: its ops, mesh ``axes`` ((name, size), ...), the devices'
    ``input_bytes`` and ``peak_bytes`` (the most bytes live at once, inputs included), ``notes`` (what was
    approximated)."""

    axes: tuple
    ops: list
    input_bytes: int
    peak_bytes: int
    notes: list
    name: str = "map"

    @property
    def devices(self) -> int:
        return math.prod(size for _, size in self.axes)

    @property
    def flops(self) -> float:
        return sum(op.flops * op.count for op in self.ops)

    def predict(self, topo: Topology) -> "MapPrediction":
        return predict(self, topo)


# -- the walk -------------------------------------------------------------------------------------------------

def _site(eqn) -> str:
    """The user's line that made ``eqn`` (``spmdsim.jax``'s site), shortened: relative to the working
    directory, or from ``site-packages/`` on."""
    try:
        from spmdsim.jax.evaluation._interpreter import site_of
        site = site_of(eqn)
    except Exception:  # noqa: BLE001 - jax missing or no source info
        return ""
    return _short(site)


def _short(site: str) -> str:
    if "site-packages" + os.sep in site:
        return site.split("site-packages" + os.sep, 1)[1]
    here = os.getcwd() + os.sep
    return site[len(here):] if site.startswith(here) else site


def _user_name(eqn) -> str:
    try:
        from spmdsim.jax.evaluation._names import user_name
        return user_name(eqn)
    except Exception:  # noqa: BLE001
        return eqn.primitive.name


def _is_literal(v) -> bool:
    return hasattr(v, "val") and not hasattr(v, "suffix") and type(v).__name__ == "Literal"


def _sub_jaxpr(params: dict):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in params and params[key] is not None:
            return params[key]
    for value in params.values():
        if hasattr(value, "eqns") or hasattr(getattr(value, "jaxpr", None), "eqns"):
            return value
    return None


def _open(closed) -> tuple:
    """(jaxpr, consts) of a ClosedJaxpr or an open Jaxpr."""
    if hasattr(closed, "consts"):
        return closed.jaxpr, list(closed.consts)
    return closed, []


class _Walk:
    def __init__(self, axes: tuple):
        self.ops: list[Op] = []
        self.notes: list[str] = []
        self.top_axes = tuple(axes)

    def jaxpr(self, closed, in_vals: list, axes: tuple, count: float, ops: list) -> list:
        jaxpr, consts = _open(closed)
        env: dict = {}
        for v, c in zip(jaxpr.constvars, consts):
            env[v] = Val(int(np.asarray(c).nbytes) if hasattr(c, "shape") else 0, kept=True)
        for v, val in zip(jaxpr.invars, in_vals):
            env[v] = val if val is not None else Val(_nbytes(v.aval), kept=True)
        for v in jaxpr.constvars:
            env.setdefault(v, Val(_nbytes(v.aval), kept=True))

        def read(v):
            if _is_literal(v):
                return None
            found = env.get(v)
            if found is None:
                found = env[v] = Val(_nbytes(v.aval), kept=True)
            return found

        for eqn in jaxpr.eqns:
            outs = self.eqn(eqn, [read(v) for v in eqn.invars], axes, count, ops)
            for v, val in zip(eqn.outvars, outs):
                env[v] = val
        return [read(v) for v in jaxpr.outvars]

    def _boundary(self, eqn, ins, name: str, ops: list) -> list:
        """A zero-cost op standing for a loop or map boundary: its results are loop state, kept in HBM."""
        op = Op(eqn.primitive.name, name, _site(eqn), "free", inputs=list(ins))
        op.outputs = [Val(_nbytes(v.aval), op, kept=True) for v in eqn.outvars]
        ops.append(op)
        return op.outputs

    def eqn(self, eqn, ins: list, axes: tuple, count: float, ops: list) -> list:
        prim = eqn.primitive.name
        params = eqn.params
        if prim in CALLS or (prim not in ("scan", "while", "cond") and prim not in MAPS
                             and prim not in COLLECTIVES and _sub_jaxpr(params) is not None
                             and prim not in REDUCTIONS and prim != "sort"):
            sub = _sub_jaxpr(params)
            if sub is not None:
                sub_jaxpr, _ = _open(sub)
                if len(sub_jaxpr.invars) == len(ins):
                    return self.jaxpr(sub, ins, axes, count, ops)
                # a call whose operands do not match its jaxpr's inputs one to one: its own inputs, kept
                self.jaxpr(sub, [None] * len(sub_jaxpr.invars), axes, count, ops)
                return self._boundary(eqn, ins, prim, ops)
        if prim == "scan":
            length = int(params.get("length", 1))
            body = params["jaxpr"]
            body_jaxpr, _ = _open(body)
            self.jaxpr(body, [Val(_nbytes(v.aval), kept=True) for v in body_jaxpr.invars], axes,
                       count * length, ops)
            return self._boundary(eqn, ins, "scan", ops)
        if prim == "while":
            body = params["body_jaxpr"]
            body_jaxpr, _ = _open(body)
            self.jaxpr(body, [Val(_nbytes(v.aval), kept=True) for v in body_jaxpr.invars], axes, count, ops)
            note = f"a while loop at {_site(eqn) or 'an equation of JAX'} is counted once (its trip count is " \
                   f"known only when it runs)"
            if note not in self.notes:
                self.notes.append(note)
            return self._boundary(eqn, ins, "while", ops)
        if prim == "cond":
            best, best_cost = None, -1.0
            for branch in params["branches"]:
                trial: list = []
                outs = self.jaxpr(branch, list(ins[1:]), axes, count, trial)
                cost = sum(o.flops * o.count + o.bytes(False) * o.count for o in trial)
                if cost > best_cost:
                    best, best_cost = (trial, outs), cost
            ops.extend(best[0])
            return [o if o is not None else Val(_nbytes(v.aval)) for o, v in zip(best[1], eqn.outvars)]
        if prim in MAPS:
            inner_axes = tuple(params.get("axes", ()))
            body = params["jaxpr"]
            body_jaxpr, _ = _open(body)
            self.jaxpr(body, [Val(_nbytes(v.aval), kept=True) for v in body_jaxpr.invars], axes + inner_axes,
                       count, ops)
            return self._boundary(eqn, ins, prim, ops)
        if _bitcast(eqn) and ins and ins[0] is not None:  # a reshape keeping the elements: the same buffer
            return [ins[0]]
        op = self.primitive(eqn, ins, axes, count)
        op.outputs = [Val(_nbytes(v.aval), op) for v in eqn.outvars]
        ops.append(op)
        return op.outputs

    def primitive(self, eqn, ins: list, axes: tuple, count: float) -> Op:
        prim = eqn.primitive.name
        params = eqn.params
        in_avals = [v.aval for v in eqn.invars]
        out_avals = [v.aval for v in eqn.outvars]
        site = _site(eqn)
        if prim in COLLECTIVES:
            return self.collective(eqn, ins, axes, count, site)
        if prim in FREE or prim.startswith("random_") and prim != "random_bits":
            return Op(prim, prim, site, "free", count=count, inputs=ins)
        out_size = sum(_size(a) for a in out_avals)
        if prim == "dot_general":
            (lc, _), _ = params["dimension_numbers"]
            contracted = math.prod(in_avals[0].shape[d] for d in lc)
            dtype = max((dtype_class(a.dtype) for a in in_avals[:2]), key=lambda d: _RANK.get(d, 3))
            return Op(prim, "dot_general", site, "dot", 2.0 * out_size * contracted, count, ins, dtype=dtype,
                      precision=_precision(params.get("precision")))
        if prim == "conv_general_dilated":
            rhs = in_avals[1]
            dn = params.get("dimension_numbers")
            out_feature_dim = dn.rhs_spec[0] if dn is not None and hasattr(dn, "rhs_spec") else 0
            per_output = _size(rhs) / max(rhs.shape[out_feature_dim], 1)
            dtype = max((dtype_class(a.dtype) for a in in_avals[:2]), key=lambda d: _RANK.get(d, 3))
            return Op(prim, "conv", site, "dot", 2.0 * out_size * per_output, count, ins, dtype=dtype,
                      precision=_precision(params.get("precision")))
        if prim in INDEXED:
            if prim == "gather" or prim == "dynamic_slice":
                extra = sum(_nbytes(a) for a in in_avals[1:]) + sum(_nbytes(a) for a in out_avals)
            elif prim == "dynamic_update_slice":
                extra = _nbytes(in_avals[1]) + sum(_nbytes(a) for a in in_avals[2:])
            else:  # scatters: read the updates, the indices and the rows they change
                updates = _nbytes(in_avals[-1])
                extra = 2 * updates + _nbytes(in_avals[1])
            op = Op(prim, prim, site, "memory", 0.0, count, ins, read_extra=extra)
            if prim == "dynamic_update_slice":  # written in place: the update's bytes, not the whole result
                op.read_extra = extra + _nbytes(in_avals[1]) - sum(_nbytes(a) for a in out_avals)
            return op
        if prim in MOVES:
            return Op(prim, prim, site, "memory", 0.0, count, ins)
        if prim in REDUCTIONS:
            return Op(prim, prim, site, "vector", float(sum(_size(a) for a in in_avals)), count, ins)
        if prim == "sort":
            n = max(_size(in_avals[0]), 1)
            last = in_avals[0].shape[-1] if in_avals[0].shape else 1
            return Op(prim, prim, site, "vector", float(n * max(math.log2(max(last, 2)), 1.0)), count, ins)
        return Op(prim, prim, site, "vector", float(out_size), count, ins)

    def collective(self, eqn, ins, axes: tuple, count: float, site: str) -> Op:
        prim = eqn.primitive.name
        params = eqn.params
        kind = COLLECTIVES[prim]
        names = params.get("axes", params.get("axis_name", ()))
        names = tuple(names) if isinstance(names, (tuple, list)) else (names,)
        sizes = [size for _, size in axes]
        positions = []
        for name in names:
            found = [k for k, (n, _) in enumerate(axes) if n == name]
            if found:
                positions.append(found[0])
        if len(positions) != len(names):
            note = f"{prim} at {site or '?'} names axes {names} not all found among the map's {axes}; taken " \
                   f"over every device"
            if note not in self.notes:
                self.notes.append(note)
            positions = list(range(len(axes)))
        ids = np.arange(math.prod(sizes) if sizes else 1).reshape(sizes or [1])
        other = [k for k in range(len(axes)) if k not in positions]
        rows = ids.transpose(other + positions).reshape(-1, math.prod(sizes[k] for k in positions) if positions else 1)
        groups_param = params.get("axis_index_groups")
        if groups_param:
            rows = np.concatenate([rows[:, list(g)] for g in groups_param])
        n = rows.shape[1]
        operand = sum(_nbytes(v.aval) for v in eqn.invars)
        pairs = None
        if kind == "all-reduce" or kind == "reduce-scatter":
            volume = float(operand)
        elif kind == "all-gather" and prim != "pbroadcast":
            volume = float(operand) * n
        elif kind == "all-to-all":
            volume = float(operand) * n
        elif kind == "ppermute":
            volume = float(operand)
            perm = params.get("perm", ())
            pairs = [(int(row[s]), int(row[d])) for row in rows[:64] for s, d in perm]
        else:
            volume = float(operand)
        name = _user_name(eqn)
        return Op(prim, name, site, "collective", 0.0, count, ins, collective=kind, comm_bytes=volume,
                  groups=rows, pairs=pairs, axes=tuple(axes[k][0] for k in positions))


def _bitcast(eqn) -> bool:
    """A reshape, squeeze, expand_dims, or a broadcast that only adds unit dimensions: XLA reinterprets the
    buffer (no HBM traffic; pmap's body squeezes and expands its blocks this way)."""
    prim = eqn.primitive.name
    if prim not in ("reshape", "squeeze", "expand_dims", "broadcast_in_dim") or len(eqn.invars) < 1:
        return False
    a, b = eqn.invars[0].aval, eqn.outvars[0].aval
    if _size(a) != _size(b) or getattr(a, "dtype", None) != getattr(b, "dtype", None):
        return False
    if prim != "broadcast_in_dim":
        return prim != "reshape" or eqn.params.get("dimensions") is None
    return True


def _precision(p) -> str | None:
    if p is None:
        return None
    text = str(p).upper()
    if "HIGHEST" in text or "FLOAT32" in text:
        return "HIGHEST"
    if "HIGH" in text or "TENSORFLOAT32" in text or "BF16_BF16_F32_X3" in text:
        return "HIGH"
    return None


def _peak_bytes(ops: list, inputs: list, outputs: list) -> int:
    """The most bytes live at once in the flattened program (unfused: every value materialised), inputs and
    outputs held throughout."""
    held = {id(v): v for v in inputs if v is not None}
    held.update({id(v): v for v in outputs if v is not None})
    last: dict = {}
    for k, op in enumerate(ops):
        for v in op.inputs:
            if v is not None:
                last[id(v)] = k
    base = sum(v.nbytes for v in held.values())
    live, peak = base, base
    frees: dict = {}
    for k, op in enumerate(ops):
        for v in op.outputs:
            if id(v) in held:
                continue
            live += v.nbytes
            frees.setdefault(last.get(id(v), k), []).append(v)
        peak = max(peak, live)
        for v in frees.pop(k, []):
            live -= v.nbytes
    return int(peak)


def analyze(closed_jaxpr, axes: tuple, name: str = "map") -> MapCost:
    """The :class:`MapCost` of a map's per-device body (a ClosedJaxpr) over mesh ``axes`` ((name, size), ...)."""
    walk = _Walk(axes)
    jaxpr, _ = _open(closed_jaxpr)
    inputs = [Val(_nbytes(v.aval), kept=True) for v in jaxpr.invars]
    outputs = walk.jaxpr(closed_jaxpr, inputs, tuple(axes), 1.0, walk.ops)
    for v in outputs:
        if v is not None:
            v.kept = True
    for op in walk.ops:
        for v in op.inputs:
            if v is not None:
                v.consumers.append(op)
    return MapCost(tuple(axes), walk.ops, sum(v.nbytes for v in inputs), _peak_bytes(walk.ops, inputs, outputs),
                   walk.notes, name)


# -- times on a topology ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class OpTime:
    """One op's predicted time per call (its count included). ``compute``: FLOPs / peak; ``memory``: HBM bytes /
    bandwidth under each fusion assumption; ``time``: the roofline (fused), ``time_unfused``; ``bound``:
    ``compute``, ``memory`` or the collective's ``bandwidth``/``latency``."""

    op: Op
    compute: float
    memory_fused: float
    memory_unfused: float
    time: float
    time_unfused: float
    bound: str
    intensity: float
    comm: collectives.CommCost | None = None


@dataclasses.dataclass
class MapPrediction:
    """A map's predicted time per call on ``topology``: ``ops`` (each :class:`OpTime`), and totals in seconds:
    ``compute_bound`` and ``memory_bound`` (the roofline times of the ops each bound, fused), ``comm``, and the
    step with no overlap of compute and communication (``serial``, the book's upper bound) or perfect overlap
    (``overlapped``, its lower bound); ``unfused_*``: with every equation reading and writing HBM."""

    cost: MapCost
    topology: Topology
    ops: list
    compute_bound: float
    memory_bound: float
    comm: float
    unfused_compute_bound: float
    unfused_memory_bound: float
    dot_time_at_peak: float
    calls: int = 1

    @property
    def local(self) -> float:
        return self.compute_bound + self.memory_bound

    @property
    def serial(self) -> float:
        return self.local + self.comm

    @property
    def overlapped(self) -> float:
        return max(self.local, self.comm)

    @property
    def unfused_serial(self) -> float:
        return self.unfused_compute_bound + self.unfused_memory_bound + self.comm

    @property
    def mfu(self) -> float:
        """The dots' FLOPs at the chip's peak over the predicted step (no overlap)."""
        return self.dot_time_at_peak / self.serial if self.serial > 0 else 0.0

    @property
    def mfu_overlapped(self) -> float:
        return self.dot_time_at_peak / self.overlapped if self.overlapped > 0 else 0.0

    @property
    def hbm_fraction(self) -> float:
        return self.cost.peak_bytes / self.topology.chip.hbm_bytes

    def slowest(self, kind: str = "compute", n: int = 5) -> list:
        """The ``n`` slowest ops: ``compute`` (everything but collectives) or ``collective``."""
        chosen = [t for t in self.ops if (t.comm is not None) == (kind == "collective") and t.time > 0]
        return sorted(chosen, key=lambda t: -t.time)[:n]


def _comm(op: Op, topo: Topology) -> collectives.CommCost:
    if op.collective == "ppermute":
        return collectives.ppermute(topo, op.pairs or [], op.comm_bytes)
    fn = {"all-reduce": collectives.all_reduce, "all-gather": collectives.all_gather,
          "reduce-scatter": collectives.reduce_scatter, "all-to-all": collectives.all_to_all}[op.collective]
    worst = None
    seen = set()
    for row in op.groups[:64]:
        key = tuple(int(d) for d in row)
        shape = collectives.group_shape(topo, key)
        sig = (shape.axes, shape.regular, shape.per_node, shape.nodes)
        if sig in seen:
            continue
        seen.add(sig)
        cost = fn(topo, key, op.comm_bytes)
        if worst is None or cost.time > worst.time:
            worst = cost
    return worst or collectives.CommCost(0.0, 0.0, 0.0, "no devices")


def predict(cost: MapCost, topo: Topology) -> MapPrediction:
    """Time ``cost``'s ops on ``topo`` (see the module docstring). Raises ValueError when the map has more
    devices than the topology has chips."""
    if cost.devices > topo.count:
        raise ValueError(f"the map's mesh {dict(cost.axes)} has {cost.devices} devices; {topo.label} has only "
                         f"{topo.count} chips")
    chip = topo.chip
    bw = chip.hbm_bandwidth
    times = []
    cb = mb = comm = ucb = umb = dots = 0.0
    for op in cost.ops:
        if op.kind == "collective":
            c = _comm(op, topo).scaled(op.count)
            times.append(OpTime(op, 0.0, 0.0, 0.0, c.time, c.time, c.bound, 0.0, c))
            comm += c.time
            continue
        if op.kind == "free":
            continue
        if op.kind == "dot":
            peak = chip.peak(op.dtype, op.precision)
        elif op.kind == "vector":
            peak = chip.vector_flops or 0.0
        else:
            peak = 0.0
        compute = op.flops * op.count / peak if peak else 0.0
        fused_bytes, unfused_bytes = op.bytes(True) * op.count, op.bytes(False) * op.count
        mem_f, mem_u = fused_bytes / bw, unfused_bytes / bw
        t, tu = max(compute, mem_f), max(compute, mem_u)
        bound = "compute" if compute >= mem_f and compute > 0 else "memory"
        intensity = op.flops * op.count / fused_bytes if fused_bytes else math.inf
        times.append(OpTime(op, compute, mem_f, mem_u, t, tu, bound, intensity))
        if bound == "compute":
            cb += t
        else:
            mb += t
        if compute >= mem_u and compute > 0:
            ucb += tu
        else:
            umb += tu
        if op.kind == "dot":
            dots += compute
    return MapPrediction(cost, topo, times, cb, mb, comm, ucb, umb, dots)


# -- a matmul's roofline by hand (the roofline chapter's worked examples) ---------------------------------------

def matmul_times(chip, batch: float, d: float, f: float, *, x_bytes: float = 2, w_bytes: float = 2,
                 out_bytes: float = 2, dtype: str = "bf16") -> tuple[float, float]:
    """``(T_math, T_hbm)`` of ``x[batch, d] @ w[d, f]`` on one chip: ``2 batch d f`` FLOPs at ``dtype``'s peak,
    and the operands read and the result written at HBM bandwidth (what :func:`analyze` counts for a
    ``dot_general`` whose operands and result are in HBM)."""
    flops = 2.0 * batch * d * f
    hbm = batch * d * x_bytes + d * f * w_bytes + batch * f * out_bytes
    return flops / chip.peak(dtype), hbm / chip.hbm_bandwidth


def critical_batch(chip, d: float, f: float, **kw) -> float:
    """The batch above which ``x[batch, d] @ w[d, f]`` is compute-bound (:func:`matmul_times`; the book's
    ``B > peak / HBM bandwidth`` as ``d, f`` grow)."""
    t0 = matmul_times(chip, 0.0, d, f, **kw)
    t1 = matmul_times(chip, 1.0, d, f, **kw)
    a, b, c = t1[0] - t0[0], t1[1] - t0[1], t0[1]
    return c / (a - b) if a > b else math.inf
