"""``spmdsim compare``: the first equations where a program's values leave XLA:CPU's, found equation by equation.

A program's maps run once, through the reference loop, and an observer
(:class:`spmdsim.jax.evaluation._interpreter.observe_equations`) sees each equation right after spmdsim's rule computed it,
with the operands it had. It computes the same equation on **the same operands** by the other side named by
``against``, compares the results, and keeps, per equation, the first occurrence and the largest distance: each
difference is the equation's own, not one accumulated from the equations before it. Nothing is recorded but
these per-equation summaries: memory is bounded by one equation's operands per device.

What the other side is (``against``):

- ``"xla"`` (the default): XLA:CPU. An equation inside a map is computed by ``jax.jit`` of the primitive bound
  with the equation's parameters, on JAX's default (CPU) device, once per device on that device's operands.
  spmdsim's fused multiply-add (``xla_cpu_fma``, see :mod:`._contraction`) is compared with XLA compiling the
  multiply and the add it replaced in one jitted function, where XLA fuses them as it does in the user's
  program. A sum over devices (``psum``, and ``psum_scatter``: the primitive ``reduce_scatter``, whose device
  then takes its slice of the sum) is checked on all devices' operands at once, gathered from the devices
  of its group, against the fold in XLA:CPU's order (rank order, left to right: the conformance suite checks
  that order bit for bit against ``jax.pmap``); the other collectives move data, or take a maximum or minimum,
  and are exact in any order, so they are not recomputed.
- ``"order=pairwise"`` (or ``ring``, ``sequential``): each sum over devices (``psum``, ``psum_scatter``) folded
  in that order on the same operands: which collective's result a different all-reduce algorithm (another
  topology) changes, and by how much. Nothing but such sums depends on the order, so only they are compared.
- ``"executor=vectorized"`` (or ``threads``): each equation's rule of the other executor on the same operands
  (the vectorized rule on a one-device stack, or the per-device rule device by device). The collectives of both
  executors are one primitive layer and are not recomputed.

Loops: an equation in the body of a ``while_loop``, ``fori_loop`` or ``scan`` is evaluated once per iteration,
each evaluation compared on its own operands. Its entry says in how many evaluations it differed out of how many
(``occurrences`` of ``evaluations``), the iteration of each enclosing loop (outer first, from 0) at its first
occurrence, and in how many iterations it differed: where a drift accumulated over a loop started.

Then, end to end: after each top-level map call, the same map is run whole by the other side on the same inputs
(XLA: a real ``jax.shard_map`` of the map's body over JAX's devices, jitted) and its outputs are compared with
spmdsim's: how far the outputs drifted.

Multi-host (``spmdsim compare --hosts H``, as ``spmdsim run --hosts H``): each host process compares the equations
of its own devices (a collective's operands gathered across the hosts, as the collective itself does); the hosts'
reports are gathered and host 0 prints one (:func:`merge`), its devices named with their hosts (``host 1 device 3
[i=3]``). The end-to-end drift against XLA is not measured for a ``pmap`` there (each host holds only its devices'
part of the arguments).

Not covered: the NumPy front end (``spmdsim.pmap`` of a NumPy function; compare its JAX twin instead), and
equations on PRNG keys or with effects (callbacks).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
import threading
import time
from typing import Any, Callable

import numpy as np

from spmdsim.primitives import _primitives

from spmdsim.runtime import _process_group, _runtime
from spmdsim.primitives._reduction import REDUCTION_ORDERS, ReductionOrder
from spmdsim.jax.evaluation import _dtypes, _registry
from spmdsim.jax.integration import _map
from spmdsim.jax.evaluation._interpreter import (HIGHER_ORDER, Vectorized, current_site, eqn_stack, observe_equations,
                                      site_of)

__all__ = ["Against", "Difference", "Drift", "Report", "compare_call", "distance", "merge", "main", "SCHEMA_PATH"]

SCHEMA_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "compare.schema.json")
SCHEMA_ID = "spmdsim-compare/1"

# Primitives compared with nothing: collectives (below), tokens, side effects, and layout-only equations.
_COLLECTIVES = set(_primitives.PRIMITIVES) | {"psum_invariant", "all_gather_invariant", "axis_index", "precv",
                                              "pvary", "pbroadcast", "reshard"}
_SUMS = ("psum", "psum_invariant", "reduce_scatter")  # the collectives whose result depends on the order
_LOOPS = ("while", "scan")  # their bodies' equations are evaluated once per iteration
_NOT_COMPUTED = {"create_token", "after_all", "debug_print", "debug_callback", "pure_callback", "io_callback"}


# -- what is compared with what -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Against:
    """The other side of a comparison: ``kind`` is ``"xla"``, ``"order"`` or ``"executor"``; ``value`` the
    reduction order or executor named (None for XLA)."""

    kind: str
    value: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Against":
        """``"xla"``, ``"order=pairwise"`` (``ring``, ``sequential``) or ``"executor=vectorized"`` (``threads``).

        Raises:
            ValueError: anything else, with the accepted forms.
        """
        key, _, value = text.partition("=")
        if text == "xla":
            return cls("xla")
        if key == "order" and value in REDUCTION_ORDERS:
            return cls("order", value)
        if key == "executor" and value in ("threads", "vectorized"):
            return cls("executor", value)
        raise ValueError(f"--against {text!r}: expected xla, order=ORDER (ORDER one of {', '.join(REDUCTION_ORDERS)})"
                         f" or executor=threads|vectorized.")

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}={self.value}"


# -- distances ----------------------------------------------------------------------------------------------

def _float_bits(dtype: np.dtype) -> np.dtype | None:
    """The signed integer dtype of ``dtype``'s bits for a real floating dtype (bfloat16 and float8 included)."""
    if dtype.kind == "f" or (dtype.kind == "V" and dtype.itemsize <= 2 and "float" in dtype.name):
        return np.dtype(f"int{8 * dtype.itemsize}")
    return None


def _ordered(x: np.ndarray, bits: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Each float's position on the line of representable values (+0 and -0 both 0), as its magnitude (uint64)
    and whether it is negative."""
    raw = np.ascontiguousarray(x).view(bits).astype(np.int64)
    return (raw & ((1 << (8 * bits.itemsize - 1)) - 1)).astype(np.uint64), raw < 0


def _ulps_apart(a: np.ndarray, b: np.ndarray, bits: np.dtype) -> np.ndarray:
    """The number of representable values between ``a`` and ``b``, counted in integers (a float64's position
    needs 63 bits: in float64 a distance of one ulp between large positions would round away), then as float64."""
    (ma, na), (mb, nb) = _ordered(a, bits), _ordered(b, bits)
    same = na == nb
    return np.where(same, np.where(ma >= mb, ma - mb, mb - ma), ma + mb).astype(np.float64)


def distance(actual, expected) -> tuple[np.ndarray, np.ndarray]:
    """``(ulps, absolute)`` per element of two arrays of one shape and dtype: ulps the number of representable
    values between them (floats; integers: their difference), absolute ``|actual - expected|`` in float64. Two
    NaNs are 0 apart, a NaN and a number infinitely far; +0 and -0 are 0 apart. Complex: the larger of the real
    and imaginary parts' distances."""
    a, b = np.asarray(actual), np.asarray(expected)
    if a.dtype.kind == "c":
        re, im = distance(a.real, b.real), distance(a.imag, b.imag)
        return np.maximum(re[0], im[0]), np.maximum(re[1], im[1])
    bits = _float_bits(a.dtype)
    if bits is None:  # integers and bools: their difference
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        return diff, diff
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    with np.errstate(invalid="ignore"):
        ulps = _ulps_apart(a, b, bits)
        absolute = np.where(a64 == b64, 0.0, np.abs(a64 - b64))
    both, one = nan_a & nan_b, nan_a ^ nan_b
    ulps = np.where(both, 0.0, np.where(one, np.inf, ulps))
    absolute = np.where(both, 0.0, np.where(one, np.inf, absolute))
    return ulps, absolute


# -- the report ------------------------------------------------------------------------------------------------

def _finite(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


@dataclasses.dataclass
class Difference:
    """One equation whose results differ (beyond the tolerance) from the other side's on the same operands."""

    rank: int                       # first occurrences in order (0: the first equation to differ)
    primitive: str
    params: dict[str, str]
    operands: list[tuple[tuple, str]]   # one device's (shape, dtype) per operand
    results: list[tuple[tuple, str]]
    site: str                       # the user's file:line (function)
    devices: list[str]              # the devices where it differed ("outside the maps" for a jit's own parts)
    occurrences: int = 0            # evaluations that differed (a loop's body counts once per iteration)
    ulps: float = 0.0               # the largest distance, in ulps (inf: NaN against a number, shapes differ)
    absolute: float = 0.0
    elements: int = 0               # elements beyond the tolerance, over every occurrence and device
    detail: str = ""
    evaluations: int = 0            # evaluations compared (differing or not), counted as occurrences are
    iteration: list[int] | None = None  # the first occurrence's iteration of each enclosing loop, outer first
    iterations: int = 0             # iterations of the innermost enclosing loop in which it differed
    key: str = dataclasses.field(default="", repr=False)  # the equation, for merging the reports of hosts
    first: tuple = dataclasses.field(default=(), repr=False)  # the first occurrence's place in program order
    seen: set = dataclasses.field(default_factory=set, repr=False)  # the iteration paths where it differed
    hosts: list[int] | None = None  # under --hosts: the hosts on whose devices it differed

    def to_json(self) -> dict:
        return {"rank": self.rank, "primitive": self.primitive, "params": self.params,
                "operands": [{"shape": list(s), "dtype": d} for s, d in self.operands],
                "results": [{"shape": list(s), "dtype": d} for s, d in self.results],
                "site": self.site, "devices": self.devices, "occurrences": self.occurrences,
                "ulps": _finite(self.ulps), "absolute": _finite(self.absolute), "elements": self.elements,
                "detail": self.detail, "evaluations": self.evaluations, "iteration": self.iteration,
                "iterations": self.iterations, **({} if self.hosts is None else {"hosts": self.hosts})}


@dataclasses.dataclass
class Drift:
    """How far one output of one top-level map call ended from the other side's run of the whole map."""

    call: int        # the top-level map calls in order, from 0
    api: str         # pmap or shard_map
    output: int
    shape: tuple
    dtype: str
    ulps: float | None
    absolute: float | None
    note: str = ""   # why it was not measured, when it was not
    beyond: bool = dataclasses.field(default=False, repr=False)  # some element differs beyond the tolerance

    def to_json(self) -> dict:
        return {"call": self.call, "api": self.api, "output": self.output, "shape": list(self.shape),
                "dtype": self.dtype, "ulps": None if self.ulps is None else _finite(self.ulps),
                "absolute": None if self.absolute is None else _finite(self.absolute), "note": self.note}


@dataclasses.dataclass
class Report:
    """What :func:`compare_call` found: the differing equations, first occurrence first, and the drift of each
    top-level map call's outputs. ``bool(report)`` is true when some equation (or fused run of equations)
    differs, or some map call's outputs differ end to end, beyond the tolerance."""

    against: str
    ulps: int
    rtol: float | None
    compared: int = 0                                   # equation evaluations compared (per device)
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)   # reason -> evaluations not compared
    differences: list[Difference] = dataclasses.field(default_factory=list)
    drift: list[Drift] = dataclasses.field(default_factory=list)
    result: Any = dataclasses.field(default=None, repr=False)  # what the compared function returned (not in JSON)
    hosts: int | None = None                            # under --hosts: how many hosts' reports were merged
    evaluated: dict = dataclasses.field(default_factory=dict, repr=False)  # equation's key -> evaluations compared

    def __bool__(self) -> bool:
        return bool(self.differences) or any(d.beyond for d in self.drift)

    def to_json(self) -> dict:
        """The report as the JSON object ``spmdsim compare --json`` writes (schema: ``spmdsim/data/
        compare.schema.json``)."""
        return {"schema": SCHEMA_ID, "against": self.against, "tolerance": {"ulps": self.ulps, "rtol": self.rtol},
                **({} if self.hosts is None else {"hosts": self.hosts}),
                "compared": self.compared, "skipped": dict(sorted(self.skipped.items())),
                "differences": [d.to_json() for d in self.differences], "drift": [d.to_json() for d in self.drift]}

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    def text(self, max_rows: int = 50) -> str:
        """The report as the tables ``spmdsim compare`` prints."""
        return self.print(file=_Discard(), max_rows=max_rows)

    def print(self, file=None, max_rows: int = 50) -> str:
        """Print the tables (rich when installed) to ``file`` (default stdout); returns their plain text."""
        from spmdsim.tools._tables import print_table
        file = sys.stdout if file is None else file
        tolerance = "bit-exact" if self.ulps == 0 and not self.rtol else \
            f"beyond {self.ulps} ulps" + (f" and rtol {self.rtol:g}" if self.rtol else "")
        on = "" if self.hosts is None else f" on {self.hosts} hosts"
        head = (f"spmdsim compare against {self.against}{on}: {self.compared} equation evaluations compared, "
                f"{len(self.differences)} {'equation differs' if len(self.differences) == 1 else 'equations differ'} "
                f"({tolerance})")
        parts = [head]
        print(head, file=file)
        if self.differences:
            rows = [[str(d.rank + 1), d.primitive, _short(_params_text(d.params), 48), _avals_text(d.operands),
                     _devices_text(d.devices), _num(d.ulps), _num(d.absolute), f"{d.occurrences} of {d.evaluations}",
                     _iteration_text(d), d.site or "<unknown>"]
                    for d in self.differences[:max_rows]]
            parts.append(print_table("equations that differ, first occurrence first",
                                     ["#", "primitive", "params", "operands", "devices", "ulps", "abs", "differed",
                                      "first in", "line"],
                                     rows, file=file, right=["#", "ulps", "abs", "differed"]))
            if len(self.differences) > max_rows:
                parts.append(f"... and {len(self.differences) - max_rows} more (--json has them all)")
                print(parts[-1], file=file)
        if self.drift:
            rows = [[str(d.call), d.api, str(d.output), f"{d.dtype}{list(d.shape)}",
                     "-" if d.ulps is None else _num(d.ulps), "-" if d.absolute is None else _num(d.absolute),
                     d.note] for d in self.drift[:max_rows]]
            parts.append(print_table("end to end: each map call's outputs against the other side's run of the map",
                                     ["call", "api", "output", "value", "ulps", "abs", "note"], rows, file=file,
                                     right=["ulps", "abs"]))
            if len(self.drift) > max_rows:
                more = len(self.drift) - max_rows
                parts.append(f"... and {more} more row{'s' * (more != 1)} (--json has them all)")
                print(parts[-1], file=file)
        if self.skipped:
            line = "not compared: " + ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
            parts.append(line)
            print(line, file=file)
        return "\n".join(parts)


class _Discard:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def _num(x: float) -> str:
    return "inf" if not np.isfinite(x) else f"{x:.3g}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _params_text(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def _avals_text(avals) -> str:
    return ", ".join(f"{d}{list(s)}" for s, d in avals)


def _iteration_text(d: Difference) -> str:
    """``iteration 3`` (of the loop around it; ``iteration 1, 4`` in nested loops, outer first), and in how many
    iterations it differed; ``-`` outside loops."""
    if d.iteration is None:
        return "-"
    text = "iteration " + ", ".join(map(str, d.iteration))
    return text if d.iterations <= 1 else f"{text} ({d.iterations} iterations)"


def _devices_text(devices: list[str]) -> str:
    return devices[0] if len(devices) == 1 else f"{len(devices)} devices: {devices[0]}, ..."


# -- the session: observing every equation ---------------------------------------------------------------------

class _Session:
    """The observer of one comparison (see the module docstring)."""

    def __init__(self, against: Against, ulps: int, rtol: float | None, progress: bool):
        self.against, self.max_ulps, self.rtol = against, int(ulps), rtol
        self.report = Report(str(against), int(ulps), rtol)
        self.lock = threading.Lock()
        self.records: dict[int, tuple] = {}  # id(eqn) -> (first sequence number, its Difference, the equation)
        self.seq = itertools.count()
        self.calls_done = 0
        self.local = threading.local()  # a device thread's lane, and its equations observed so far
        self.bases: dict[int, tuple] = {}  # id(world of a mapped call) -> (world, position of its first equation)
        self.xla_functions: dict[tuple, tuple] = {}  # (id(eqn), operand avals) -> (eqn, XLA's executable)
        self.compiling = threading.Lock()
        self.calls = itertools.count()
        self.evaluations: dict[int, tuple] = {}  # id(eqn) -> (eqn, evaluations compared: per thread or step)
        self.progress = _Progress() if progress else None
        self.watch = observe_equations(self.observe)

    # -- per equation

    def observe(self, ex, eqn, operands: list, outs: list) -> None:
        name = eqn.primitive.name
        try:
            self._observe(ex, eqn, name, operands, outs)
        finally:
            self._step_loops(eqn, name)

    def _loops(self) -> dict:
        """This thread's loops being evaluated: id(loop equation) -> {id(equation of its body): evaluations
        completed in this run of the loop}."""
        found = getattr(self.local, "loops", None)
        if found is None:
            found = self.local.loops = {}
        return found

    def _iteration(self) -> tuple:
        """The iteration (from 0) of each loop (``while``, ``scan``: ``fori_loop`` is one) around the equation being
        observed, outer first: for each loop on this thread's equation stack, how many times the equation of its
        body that holds this one (or is this one) completed before, in this run of the loop."""
        stack, loops = eqn_stack(), self._loops()
        path = []
        for k in range(len(stack) - 1):
            e = stack[k]
            if e is not None and e.primitive.name in _LOOPS:
                path.append(loops.get(id(e), {}).get(id(stack[k + 1]), 0))
        return tuple(path)

    def _step_loops(self, eqn, name: str) -> None:
        """After an equation: one more evaluation of it in its loop's body; a loop that ended starts afresh."""
        stack, loops = eqn_stack(), self._loops()
        if len(stack) >= 2 and stack[-1] is eqn and stack[-2] is not None and stack[-2].primitive.name in _LOOPS:
            counts = loops.setdefault(id(stack[-2]), {})
            counts[id(eqn)] = counts.get(id(eqn), 0) + 1
        if name in _LOOPS:
            loops.pop(id(eqn), None)

    def _observe(self, ex, eqn, name: str, operands: list, outs: list) -> None:
        if name in HIGHER_ORDER:
            return  # its equations were observed one by one
        seq = self._position()
        vectorized = isinstance(ex, Vectorized)
        reason = self._skip_reason(eqn, name)
        if reason is None:
            try:
                reference = self._reference(ex, eqn, name, operands, vectorized)
            except Exception as e:  # noqa: BLE001 - the other side could not compute it: say so, go on
                reference, reason = None, f"{type(e).__name__} on the other side"
            if reference is None and reason is None:
                reason = "same computation on both sides"
        if reason is not None:
            self._count(reason, 1)
            return
        self._compare(ex, eqn, seq, [np.asarray(o) for o in outs], reference, vectorized)
        with self.lock:
            found = self.evaluations.get(id(eqn))
            self.evaluations[id(eqn)] = (eqn, 1 if found is None else found[1] + 1)

    def _position(self) -> tuple:
        """Where the equation being observed stands in program order: (top-level map calls done, its index in
        its device's run, counted from the point where that run's first equation was observed). Device threads
        interleave; this keeps one device's order and lines up the devices of one map."""
        n = next(self.seq)
        lane = _runtime.current_lane()
        if lane is None:
            return self.calls_done, n
        local = self.local
        if getattr(local, "lane", None) is not lane:
            with self.lock:
                base = self.bases.setdefault(id(lane.world), (lane.world, n))[1]
            local.lane, local.base, local.count = lane, base, 0
            local.loops = {}  # a thread that runs another device (or call) starts outside loops
        local.count += 1
        return self.calls_done, local.base + local.count

    def _skip_reason(self, eqn, name: str) -> str | None:
        kind = self.against.kind
        if name in _COLLECTIVES:  # (their effects name their axes)
            if kind == "executor" or name not in _SUMS:
                return "collectives (exact in any order, or one layer for both executors)"
            return None
        if kind == "order":
            return "independent of the reduction order"
        if name in _NOT_COMPUTED or eqn.effects:
            return "with effects or tokens"
        if any(_dtypes.is_key(v.aval.dtype) for v in (*eqn.invars, *eqn.outvars) if hasattr(v.aval, "dtype")):
            return "on PRNG keys"
        return None

    def _reference(self, ex, eqn, name: str, operands: list, vectorized: bool):
        if name in _SUMS:
            order = ReductionOrder("sequential" if self.against.kind == "xla" else self.against.value)
            if name == "reduce_scatter":
                return _folded_scatter(eqn, operands, order, vectorized)
            return _folded_sums(eqn, operands, order, vectorized)
        if self.against.kind == "executor":
            return _other_executor(eqn, operands, vectorized, ex)
        if not vectorized:
            return [np.asarray(o) for o in self._xla_function(eqn, operands)(*operands)]
        per_device = [[x[d] for x in operands] for d in range(ex.n)]
        fn = self._xla_function(eqn, per_device[0])
        outs = [fn(*blocks) for blocks in per_device]
        return [np.stack([np.asarray(o[k]) for o in outs]) for k in range(len(outs[0]))]

    def _xla_function(self, eqn, operands: list) -> Callable:
        """XLA's executable of ``eqn`` for operands like these, compiled once (not once per device thread; once
        for equations of one primitive with equal parameters)."""
        avals = tuple((np.shape(x), np.result_type(x)) for x in operands)
        try:
            key = (eqn.primitive, tuple(eqn.params.items()), avals)
            hash(key)
        except TypeError:  # an unhashable parameter
            key = (id(eqn), avals)
        found = self.xla_functions.get(key)
        if found is None:
            with self.compiling:
                found = self.xla_functions.get(key)
                if found is None:
                    found = self.xla_functions[key] = (eqn, _jitted(eqn).lower(*operands).compile())
        return found[1]

    def _compare(self, ex, eqn, seq: tuple, outs: list, reference: list, vectorized: bool) -> None:
        n = ex.n if vectorized else 1
        differs = np.zeros(n, bool)
        worst_ulps = worst_abs = 0.0
        elements, detail = 0, ""
        for k, (o, r) in enumerate(zip(outs, reference, strict=True)):
            if o.shape != r.shape or o.dtype != r.dtype:
                differs[:] = True
                worst_ulps = worst_abs = np.inf
                detail = f"result {k}: spmdsim {o.dtype}{list(o.shape)}, other side {r.dtype}{list(r.shape)}"
                continue
            ulps, absolute = (np.ravel(d) for d in distance(o, r))
            beyond = self._beyond(ulps, absolute, r)
            if not beyond.any():
                continue
            per_device = beyond.reshape(n, -1).any(axis=1) if vectorized else np.array([True])
            differs |= per_device
            elements += int(beyond.sum())
            worst_ulps = max(worst_ulps, float(ulps[beyond].max()))
            worst_abs = max(worst_abs, float(absolute[beyond].max()))
        self._count(None, n)
        if not differs.any():
            return
        if vectorized:
            present = ex.batch.present()
            devices = [ex.batch.label(int(present[d])) for d in np.flatnonzero(differs)]
        else:
            lane = _runtime.current_lane()
            devices = [lane.label if lane is not None else "outside the maps"]
        self._record(eqn, seq, devices, worst_ulps, worst_abs, elements, detail, outs, vectorized)

    def _record(self, eqn, seq, devices, ulps, absolute, elements, detail, outs, vectorized) -> None:
        iteration = self._iteration()
        with self.lock:
            found = self.records.get(id(eqn))
            if found is not None and seq < found[0]:  # another device got here earlier in program order
                found = self.records[id(eqn)] = (seq, *found[1:])
                found[1].iteration = list(iteration) if iteration else None
            if found is None:
                blocks = [(tuple(np.shape(x)[1 if vectorized else 0:]), str(np.asarray(x).dtype)) for x in outs]
                diff = Difference(0, eqn.primitive.name, {k: _short(str(v), 120) for k, v in eqn.params.items()},
                                  [_aval(v.aval) for v in eqn.invars], blocks, current_site(), [], detail=detail,
                                  iteration=list(iteration) if iteration else None)
                found = self.records[id(eqn)] = (seq, diff, eqn)
            diff = found[1]
            if iteration:
                diff.seen.add(iteration)
            diff.occurrences += 1
            diff.devices.extend(d for d in devices if d not in diff.devices)
            diff.ulps, diff.absolute = max(diff.ulps, ulps), max(diff.absolute, absolute)
            diff.elements += elements
            diff.detail = diff.detail or detail

    def _count(self, reason: str | None, n: int) -> None:
        with self.lock:
            if reason is None:
                self.report.compared += n
            else:
                self.report.skipped[reason] = self.report.skipped.get(reason, 0) + n
        if self.progress is not None:
            self.progress.update(self.report.compared, len(self.records))

    # -- per top-level map call: the outputs end to end

    def observe_map(self, args: list, params: dict, outs: list) -> None:
        call = next(self.calls)
        self.calls_done = call + 1
        self.bases.clear()
        api = params.get("api", "pmap")
        self.watch.__exit__(None, None, None)  # the other side's run is not itself compared
        _map.map_observer = None
        try:
            if self.against.kind == "xla" and api == "pmap" and _process_group.layout() is not None:
                raise _NotMeasured("under --hosts a pmap's arguments on each host are its own devices' part")
            other, note = self._whole_map(args, params), ""
        except _NotMeasured as e:
            other, note = None, f"not measured: {e}"
        except Exception as e:  # noqa: BLE001 - reported as not measured
            first_line = str(e).splitlines()[0] if str(e) else ""
            other, note = None, f"not measured: {type(e).__name__}: {_short(first_line, 80)}"
        finally:
            _map.map_observer = self.observe_map
            self.watch.__enter__()
        for k, o in enumerate(outs):
            o = np.asarray(o)
            if other is None:
                self.report.drift.append(Drift(call, api, k, o.shape, str(o.dtype), None, None, note))
                continue
            r = np.asarray(other[k])
            if r.shape != o.shape or r.dtype != o.dtype:
                self.report.drift.append(Drift(call, api, k, o.shape, str(o.dtype), None, None,
                                               f"the other side gave {r.dtype}{list(r.shape)}"))
                continue
            ulps, absolute = distance(o, r)
            self.report.drift.append(Drift(call, api, k, o.shape, str(o.dtype),
                                           float(ulps.max()) if ulps.size else 0.0,
                                           float(absolute.max()) if absolute.size else 0.0,
                                           beyond=bool(self._beyond(np.ravel(ulps), np.ravel(absolute), r).any())))
        drifted = any(d.beyond for d in self.report.drift if d.call == call)
        if drifted and self.against.kind == "xla" and not any(seq[0] == call for seq, _, _ in self.records.values()):
            self.watch.__exit__(None, None, None)
            _map.map_observer = None
            try:
                self._find_fused(call, args, params)
            finally:
                _map.map_observer = self.observe_map
                self.watch.__enter__()

    def _whole_map(self, args: list, params: dict) -> list:
        kind = self.against.kind
        if kind == "order":
            from spmdsim.primitives._reduction import set_reduction_order
            with set_reduction_order(self.against.value):
                return _map.simulate_map(args, **params)
        if kind == "executor":
            return _map.simulate_map(args, **dict(params, executor=self.against.value))
        key = (id(params["jaxpr"]), params["in_specs"], params["out_specs"], params["axes"],
               tuple((np.shape(x), np.result_type(x)) for x in args))
        found = self.xla_functions.get(key)
        if found is None:
            found = self.xla_functions[key] = (params["jaxpr"], _xla_map(args, params))
        return [np.asarray(o) for o in found[1](*args)]

    def _beyond(self, ulps: np.ndarray, absolute: np.ndarray, expected) -> np.ndarray:
        """Which elements (flat) differ beyond the tolerance: more than ``ulps`` apart and, with ``rtol``, more
        than ``rtol`` times the other side's magnitude."""
        beyond = ulps > self.max_ulps
        if self.rtol:
            with np.errstate(invalid="ignore"):
                beyond &= ~(absolute <= self.rtol * np.abs(np.asarray(expected)).astype(np.float64).ravel())
        return beyond

    # -- per top-level map call whose outputs differ where no equation did: the runs of equations XLA fuses

    def _find_fused(self, call: int, args: list, params: dict) -> None:
        """Record the shortest runs of consecutive equations of the map's body whose results XLA, compiling the
        run as one program on spmdsim's operands, computes differently (see the block comment above
        :func:`_flattened`): the first such run of that length, and any later one apart from it."""
        eqns, outvars = _flattened(params["jaxpr"])
        wanted = {v for e in eqns for v in (*e.invars, *e.outvars) if not hasattr(v, "val")}
        recorder = _Recorder(wanted)
        with observe_equations(recorder):
            _map.simulate_map(args, **dict(params, executor="threads"))
        budget = FUSED_MAX_RUNS
        for length in range(1, min(FUSED_MAX_EQUATIONS, len(eqns)) + 1):
            taken: list = []
            for start in range(len(eqns) - length + 1):
                window = eqns[start:start + length]
                if length == 1 and window[0].primitive.name not in HIGHER_ORDER:
                    continue  # compared on its own already
                if any(start < stop and begin < start + length for begin, stop in taken) \
                        or not all(_runnable(e) for e in window):
                    continue
                jaxpr = _run_of(eqns, outvars, start, length)
                if jaxpr is None:
                    continue
                budget -= 1
                if budget < 0:
                    return
                if self._fused_run(call, start, jaxpr, recorder.values):
                    taken.append((start, start + length))
            if taken:
                return

    def _fused_run(self, call: int, start: int, jaxpr, values: dict) -> bool:
        """Compare XLA's compilation of the run ``jaxpr`` with spmdsim's recorded results, device by device;
        record it as a fused entry when some device differs beyond the tolerance."""
        import jax
        fn = _jax_jit()(lambda *a: jax.core.eval_jaxpr(jaxpr, [], *a))
        devices, compared = [], 0
        worst_ulps = worst_abs = 0.0
        elements = 0
        for label, env in values.items():
            if not all(v in env for v in (*jaxpr.invars, *jaxpr.outvars)):
                continue
            try:
                outs = fn(*(env[v] for v in jaxpr.invars))
            except Exception:  # noqa: BLE001 - XLA cannot compile this run alone (an unbound axis in a loop...)
                return False
            compared += 1
            differs = False
            for v, o in zip(jaxpr.outvars, outs, strict=True):
                ours, theirs = np.asarray(env[v]), np.asarray(o)
                if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
                    return False
                ulps, absolute = (np.ravel(d) for d in distance(ours, theirs))
                beyond = self._beyond(ulps, absolute, theirs)
                if beyond.any():
                    differs = True
                    elements += int(beyond.sum())
                    worst_ulps = max(worst_ulps, float(ulps[beyond].max()))
                    worst_abs = max(worst_abs, float(absolute[beyond].max()))
            if differs:
                devices.append(label)
        if not devices:
            return False
        names = [e.primitive.name for e in jaxpr.eqns]
        sites = list(dict.fromkeys(s for s in (site_of(e) for e in jaxpr.eqns) if s))
        lines = [f"{e.primitive.name} at {site_of(e) or '<unknown>'}" for e in jaxpr.eqns]
        diff = Difference(
            0, "fused: " + ", ".join(names), {"equations": str(len(names)), "run": _short("; ".join(lines), 120)},
            [_aval(v.aval) for v in jaxpr.invars], [_aval(v.aval) for v in jaxpr.outvars],
            "; ".join(sites) or "<unknown>", sorted(devices, key=_device_order), occurrences=len(devices),
            ulps=worst_ulps, absolute=worst_abs, elements=elements, evaluations=compared,
            detail=f"XLA compiles these {len(names)} equations together (a fusion: a fused multiply-add, a fused "
                   f"reduction, a reordered sum) and its result differs; each equation alone agrees",
            key="fused|" + "|".join(_key(e) for e in jaxpr.eqns))
        with self.lock:
            self.records[("fused", call, start)] = ((call, 1 << 62, start), diff, None)
        return True

    # -- the whole session

    def __enter__(self):
        self.watch.__enter__()
        _map.map_observer = self.observe_map
        return self

    def __exit__(self, *exc):
        _map.map_observer = None
        self.watch.__exit__(*exc)
        if self.progress is not None:
            self.progress.close()
        found = sorted(self.records.values(), key=lambda r: r[0])
        for rank, (seq, diff, eqn) in enumerate(found):
            diff.rank, diff.first = rank, seq
            diff.devices.sort(key=_device_order)
            if eqn is None:  # a fused run of equations: counted when it was found
                continue
            diff.evaluations = max(self.evaluations.get(id(eqn), (eqn, 0))[1], diff.occurrences)
            diff.iterations = len(diff.seen)
            diff.key = _key(eqn)
        for eqn, n in self.evaluations.values():
            key = _key(eqn)
            self.report.evaluated[key] = self.report.evaluated.get(key, 0) + n
        self.report.differences = [d for _, d, _ in found]


class _NotMeasured(Exception):
    """Why a map call's drift is not measured."""


def _device_order(label: str) -> tuple:
    """``device 10 [i=10]`` after ``device 2 [i=2]`` (``host 1 device 10 [i=10]`` too: devices are numbered
    globally); ``outside the maps`` (``host 1: outside the maps``) last."""
    words = label.split(" ")
    if words[0] == "host" and len(words) > 3 and words[2] == "device":
        words = words[2:]
    return (0, int(words[1])) if words[0] == "device" and len(words) > 1 and words[1].isdigit() else (1, label)


def _to_plain(report: Report) -> dict:
    """``report`` as plain data that travels between hosts (no pickle: :mod:`spmdsim.hosts.wire`); a
    difference's set of iteration paths as a sorted list."""
    plain = dataclasses.asdict(report)
    for difference in plain["differences"]:
        difference["seen"] = sorted(difference["seen"])
    return plain


def _from_plain(plain: dict) -> Report:
    """The :class:`Report` that :func:`_to_plain` made ``plain`` of."""
    differences = [Difference(**dict(d, seen={tuple(p) for p in d["seen"]})) for d in plain["differences"]]
    drift = [Drift(**d) for d in plain["drift"]]
    return Report(**dict(plain, differences=differences, drift=drift))


def merge(reports: list[Report]) -> Report:
    """The reports of the hosts of a multi-host run (``spmdsim compare --hosts H``; host order), each of its own
    devices' equations, as one: an equation's entries (the same primitive, parameters, operands and line) become
    one, over the devices of every host where it differed (``hosts``), its counts added up and its largest
    distances kept, first occurrence first (each host's program order, the hosts run the same program); the
    equation evaluations outside the maps are named by host. Each map call's drift: its outputs' largest distance
    over the hosts (each host's outputs are its devices' part)."""
    first = reports[0]
    merged = Report(first.against, first.ulps, first.rtol, hosts=len(reports))
    by_key: dict[str, Difference] = {}
    order: dict[str, tuple] = {}
    for h, report in enumerate(reports):
        merged.compared += report.compared
        for reason, n in report.skipped.items():
            merged.skipped[reason] = merged.skipped.get(reason, 0) + n
        for d in report.differences:
            devices = [f"host {h}: {label}" if not label.startswith("host ") else label for label in d.devices]
            m = by_key.get(d.key)
            place = (d.first, h, d.rank)
            if m is None:
                m = by_key[d.key] = dataclasses.replace(d, devices=[], seen=set(), hosts=[], occurrences=0,
                                                        evaluations=0, elements=0, ulps=0.0, absolute=0.0)
                order[d.key] = place
            elif place < order[d.key]:
                order[d.key] = place
                m.iteration, m.first = d.iteration, d.first
            m.devices.extend(x for x in devices if x not in m.devices)
            m.hosts.append(h)
            m.seen |= d.seen
            m.occurrences += d.occurrences
            m.evaluations += d.evaluations
            m.elements += d.elements
            m.ulps, m.absolute = max(m.ulps, d.ulps), max(m.absolute, d.absolute)
            m.detail = m.detail or d.detail
    merged.differences = sorted(by_key.values(), key=lambda m: order[m.key])
    for report in reports:
        for key, n in report.evaluated.items():
            merged.evaluated[key] = merged.evaluated.get(key, 0) + n
    for rank, m in enumerate(merged.differences):
        m.rank, m.iterations = rank, len(m.seen)
        m.evaluations = max(m.evaluations, merged.evaluated.get(m.key, 0))
        m.devices.sort(key=_device_order)
    drift: dict[tuple, Drift] = {}
    for report in reports:
        for d in report.drift:
            m = drift.get((d.call, d.output))
            if m is None:
                drift[(d.call, d.output)] = dataclasses.replace(d)
            elif m.ulps is not None and d.ulps is not None:
                m.ulps, m.absolute = max(m.ulps, d.ulps), max(m.absolute, d.absolute)
                m.beyond = m.beyond or d.beyond
            elif d.ulps is None and m.ulps is not None:
                m.ulps, m.absolute, m.note = None, None, d.note
    merged.drift = [drift[k] for k in sorted(drift)]
    return merged


def _key(eqn) -> str:
    """The equation, as the same text in every host's process: its primitive, user's line, parameters and
    operands."""
    params = _params_text({k: _short(str(v), 120) for k, v in eqn.params.items()})
    return "|".join([eqn.primitive.name, site_of(eqn), params, _avals_text([_aval(v.aval) for v in eqn.invars])])


def _aval(aval) -> tuple[tuple, str]:
    return tuple(getattr(aval, "shape", ())), str(getattr(aval, "dtype", type(aval).__name__))


# -- the other sides ---------------------------------------------------------------------------------------------

def _jax_jit():
    from spmdsim.jax._internals import jax_jit as jit
    return jit


def _jitted(eqn):
    """``jax.jit`` of ``eqn``'s primitive bound with its parameters (for ``xla_cpu_fma``: of the multiply and add
    it fused, which XLA fuses again), returning a list of results."""
    import jax
    jit = _jax_jit()
    prim, params = eqn.primitive, dict(eqn.params)
    if prim.name == "xla_cpu_fma":
        def fma(a, b, c):
            product = jax.lax.mul(a, b)
            if params["negate_product"]:
                return [jax.lax.sub(c, product)]
            return [jax.lax.sub(product, c) if params["negate_addend"] else jax.lax.add(product, c)]
        return jit(fma)
    if prim.multiple_results:
        return jit(lambda *a: list(prim.bind(*a, **params)))
    return jit(lambda *a: [prim.bind(*a, **params)])


def _folded_sums(eqn, operands: list, order: ReductionOrder, vectorized: bool) -> list | None:
    """Each operand of a ``psum`` equation summed over the devices of its group in ``order``, from every device's
    operand gathered by an all_gather over the same axes and groups; None for positional axes (a vmapped psum)."""
    axes = eqn.params["axes"]
    named, positional = _primitives.split_axis_names(axes)
    if positional or not named:
        return None
    out = []
    for x in operands:
        gathered = _primitives.bind("all_gather", [np.asarray(x)], axis_name=named, all_gather_dimension=0,
                                    tiled=False, axis_index_groups=eqn.params.get("axis_index_groups"))[0]
        if vectorized:
            blocks = [gathered[:, k] for k in range(gathered.shape[1])]
            out.append(order.fold(np.add, blocks, lead=1))
        else:
            out.append(order.fold(np.add, list(gathered)))
    return out


def _folded_scatter(eqn, operands: list, order: ReductionOrder, vectorized: bool) -> list | None:
    """A ``reduce_scatter`` (``psum_scatter``) equation's results, each operand summed over the devices of its group
    in ``order`` (from every device's operand, gathered as for ``psum``) and this device's slice of the sum taken:
    the r-th index (the r-th of equal chunks when ``tiled``) along ``scatter_dimension`` for the device of rank r
    in its group. Its rank is found by a ``reduce_scatter`` of ``arange(group size)`` from every device (exact, in
    integers): rank r receives ``group size * r``, with ``axis_index_groups`` honoured as the equation does."""
    params = eqn.params
    named, positional = _primitives.split_axis_names(params["axis_name"])
    if positional or not named:
        return None
    groups, dim, tiled = params.get("axis_index_groups"), params["scatter_dimension"], params["tiled"]
    totals, size = [], None
    for x in operands:
        gathered = _primitives.bind("all_gather", [np.asarray(x)], axis_name=named, all_gather_dimension=0,
                                    tiled=False, axis_index_groups=groups)[0]
        size = gathered.shape[1 if vectorized else 0]
        blocks = [gathered[:, k] for k in range(size)] if vectorized else list(gathered)
        totals.append(order.fold(np.add, blocks, lead=1 if vectorized else 0))
    if size is None:
        return []
    ranks = np.arange(size, dtype=np.int32)
    if vectorized:
        ranks = np.ascontiguousarray(np.broadcast_to(ranks, (np.shape(operands[0])[0], size)))
    ranks = _primitives.bind("reduce_scatter", [ranks], axis_name=named, scatter_dimension=0, tiled=False,
                             axis_index_groups=groups)[0] // size

    def mine(total, r):
        if not tiled:
            return np.take(total, int(r), axis=dim)
        chunk = total.shape[dim] // size
        return np.take(total, np.arange(int(r) * chunk, (int(r) + 1) * chunk), axis=dim)

    if vectorized:
        return [np.stack([mine(t[d], ranks[d]) for d in range(len(ranks))]) for t in totals]
    return [mine(t, ranks) for t in totals]


def _other_executor(eqn, operands: list, vectorized: bool, ex) -> list | None:
    """The equation by the other executor's rule: per-device rules device by device, or the vectorized rule on a
    one-device stack."""
    name = eqn.primitive.name
    if vectorized:
        rule = _registry.PER_DEVICE.get(name)
        if rule is None:
            return None
        per_device = [rule(*(x[d] for x in operands), **eqn.params) for d in range(ex.n)]
        if not eqn.primitive.multiple_results:
            per_device = [[o] for o in per_device]
        return [np.stack([np.asarray(o[k]) for o in per_device]) for k in range(len(per_device[0]))]
    rule = _registry.VECTORIZED.get(name)
    if rule is None:
        return None
    outs = rule(*(np.asarray(x)[None] for x in operands), **eqn.params)
    outs = outs if eqn.primitive.multiple_results else [outs]
    return [np.asarray(o)[0] if np.ndim(o) else np.asarray(o) for o in outs]


def _xla_map(args: list, params: dict) -> Callable:
    """XLA's executable of the whole map, for arguments like ``args``: a jitted ``jax.shard_map`` of its body over
    JAX's first devices, with the map's specs."""
    import jax
    from spmdsim.jax._internals import jax_shard_map
    from jax.sharding import Mesh, PartitionSpec

    jaxpr, axes = params["jaxpr"], params["axes"]
    if any(_dtypes.is_key(a.dtype) for a in (*jaxpr.in_avals, *jaxpr.out_avals)):
        raise ValueError("PRNG keys in or out of the map")
    n = int(np.prod([size for _, size in axes]))
    devices = jax.devices()
    if len(devices) < n:
        raise ValueError(f"JAX has {len(devices)} devices, the map {n}")
    # a pmap without axis_name has an unnamed axis (no collective can name it): a string of its own for JAX's mesh
    named = {name: name if isinstance(name, str) else f"_unnamed_axis_{k}" for k, (name, _) in enumerate(axes)}
    mesh = Mesh(np.array(devices[:n]).reshape([size for _, size in axes]), tuple(named[name] for name, _ in axes))

    def spec(s):
        s = [tuple(named.get(a, a) for a in names) for names in s]
        return PartitionSpec(*[None if not names else names[0] if len(names) == 1 else tuple(names) for names in s])

    build = jax_shard_map._shard_map
    build = getattr(build, "__wrapped__", build)  # JAX's own, under spmdsim run too
    body = build(lambda *a: tuple(jax.core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *a)), mesh=mesh,
                 in_specs=tuple(spec(s) for s in params["in_specs"]),
                 out_specs=tuple(spec(s) for s in params["out_specs"]), axis_names=frozenset(mesh.axis_names),
                 check_vma=False)
    return _jax_jit()(body).lower(*args).compile()


# -- fusions: runs of equations that XLA compiles together -------------------------------------------------------
#
# XLA fuses the equations of a program before it compiles them: a multiply feeding an add becomes one fused
# multiply-add, a chain of elementwise operations one loop, a reduction of a product one loop. Each equation alone
# can then agree with XLA while the map's outputs do not. When a map call's outputs differ end to end and none of
# its equations did, the map is run once more with every value of its body recorded (per device), and runs of
# consecutive equations of the body (``jit`` calls inlined, as XLA inlines them) are compiled by XLA as one
# program on spmdsim's operands, shortest first: the first run whose results differ is reported as one entry,
# marked ``fused``. A ``while``, ``scan`` or ``cond`` is a run of one equation (its body compiled whole).

_INLINED = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
            "custom_jvp_call": "call_jaxpr"}
FUSED_MAX_EQUATIONS = 8      # the longest run tried
FUSED_MAX_RUNS = 400         # runs compiled per map call at most


def _flattened(closed) -> tuple[list, list]:
    """The equations of a map's body with its ``jit`` calls inlined (each called jaxpr once; a second call of it
    stays a call), and the body's outputs; a call's inputs and outputs are named by the variables that hold their
    values when spmdsim evaluates the body."""
    from spmdsim.jax._internals import core
    alias: dict = {}
    inlined: set = set()
    eqns: list = []

    def canonical(v):
        return alias.get(v, v) if isinstance(v, core.Var) else v

    def walk(jaxpr) -> None:
        for e in jaxpr.eqns:
            key = _INLINED.get(e.primitive.name)
            inner = e.params.get(key) if key else None
            inner = getattr(inner, "jaxpr", inner)
            if inner is not None and id(inner) not in inlined and not inner.constvars:
                inlined.add(id(inner))
                for iv, ov in zip(inner.invars, e.invars, strict=True):
                    alias[iv] = canonical(ov)
                walk(inner)
                for ov, iv in zip(e.outvars, inner.outvars, strict=True):
                    alias[ov] = canonical(iv)
                continue
            eqns.append(core.new_jaxpr_eqn([canonical(v) for v in e.invars], e.outvars, e.primitive, e.params,
                                           e.effects, e.source_info, e.ctx))

    walk(closed.jaxpr)
    return eqns, [canonical(v) for v in closed.jaxpr.outvars]


class _Recorder:
    """An equation observer that keeps, per device, the value of each variable of ``wanted``."""

    def __init__(self, wanted: set):
        self.wanted, self.values, self.lock = wanted, {}, threading.Lock()

    def __call__(self, ex, eqn, operands, outs) -> None:
        lane = _runtime.current_lane()
        label = lane.label if lane is not None else "outside the maps"
        with self.lock:
            env = self.values.setdefault(label, {})
        for v, x in (*zip(eqn.invars, operands), *zip(eqn.outvars, outs)):
            if not hasattr(v, "val") and v in self.wanted and v not in env:
                env[v] = np.array(x)


def _run_of(eqns: list, outvars: list, start: int, length: int):
    """The jaxpr of ``eqns[start:start + length]`` (inputs: what it reads from before it; outputs: what it defines
    that is read after it or returned), or None when it defines nothing used later."""
    import warnings

    from spmdsim.jax._internals import core
    window = eqns[start:start + length]
    defined = {v for e in window for v in e.outvars if isinstance(v, core.Var)}
    inputs: list = []
    for e in window:
        for v in e.invars:
            if isinstance(v, core.Var) and v not in defined and v not in inputs:
                inputs.append(v)
    later = {v for e in eqns[start + length:] for v in e.invars if isinstance(v, core.Var)}
    later.update(v for v in outvars if isinstance(v, core.Var))
    outputs = [v for e in window for v in e.outvars if isinstance(v, core.Var) and v in later]
    if not outputs:
        return None
    effects = set().union(*(e.effects for e in window))
    with warnings.catch_warnings():  # JAX deprecates a jaxpr without debugging info; this one is never shown
        warnings.simplefilter("ignore", DeprecationWarning)
        return core.Jaxpr([], inputs, outputs, window, effects)


def _runnable(eqn) -> bool:
    """An equation XLA can compile outside the map: no collective, effect or PRNG key."""
    return eqn.primitive.name not in _COLLECTIVES and eqn.primitive.name not in _NOT_COMPUTED and not eqn.effects \
        and not any(_dtypes.is_key(v.aval.dtype) for v in (*eqn.invars, *eqn.outvars) if hasattr(v.aval, "dtype"))


# -- progress -----------------------------------------------------------------------------------------------------

class _Progress:
    """A rich progress line on stderr for a long comparison (after ``DELAY`` seconds, redrawn at most every
    ``INTERVAL``; nothing without rich or a terminal). Transient: gone when the comparison ends."""

    DELAY, INTERVAL = 2.0, 0.2

    def __init__(self):
        self.start, self.bar, self.last = time.monotonic(), None, 0.0

    def update(self, compared: int, differing: int) -> None:
        now = time.monotonic()
        if now - self.last < self.INTERVAL or now - self.start < self.DELAY:
            return
        self.last = now
        if self.bar is None:
            try:
                from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            except ImportError:
                self.bar = False
                return
            if not sys.stderr.isatty():
                self.bar = False
                return
            from rich.console import Console
            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                console=Console(file=sys.stderr), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("")
        if self.bar:
            self.bar.update(self.task, description=f"compared {compared} equation evaluations, {differing} "
                                                   f"equations differ")

    def close(self) -> None:
        if self.bar:
            self.bar.stop()


# -- entry points ---------------------------------------------------------------------------------------------------

def compare_call(run: Callable[[], Any], *, against: str | Against = "xla", ulps: int = 0, rtol: float | None = None,
                 progress: bool = True) -> tuple[Report, Any]:
    """Run ``run()`` with every equation that spmdsim evaluates compared (see the module docstring); returns the
    :class:`Report` and what ``run()`` returned."""
    against = against if isinstance(against, Against) else Against.parse(against)
    if ulps < 0 or (rtol is not None and rtol < 0):
        raise ValueError(f"compare: the tolerances must not be negative, got ulps={ulps}, rtol={rtol}.")
    session = _Session(against, ulps, rtol, progress)
    with session:
        result = run()
    return session.report, result


# -- the command ------------------------------------------------------------------------------------------------------

VALUED = ("--devices", "--executor", "--against", "--ulps", "--rtol", "--json", "--max-rows", "--hosts")


def parser():
    """The options of ``spmdsim compare`` (the program and its arguments are split off first)."""
    import spmdsim
    from spmdsim.cli import ArgumentParser, positive_int
    p = ArgumentParser(
        prog="spmdsim compare",
        usage="spmdsim compare [options] SCRIPT.py [args]\n       spmdsim compare [options] -m MODULE [args]",
        description="Run an unmodified JAX script as spmdsim run does, comparing every equation of its maps with "
                    "XLA:CPU (or another reduction order, or the other executor) on the same operands; print each "
                    "equation that differs, first occurrence first, then how far each map call's outputs drifted.",
        epilog="Exit status: the script's if it failed, else 1 when something differs beyond the tolerance (an "
               "equation, a run of equations XLA fuses, or a map call's outputs end to end), 0 when nothing does.")
    p.add_argument("--devices", type=positive_int, default=spmdsim.device_count(), metavar="N",
                   help="number of virtual devices (default: SPMDSIM_NUM_DEVICES or 8)")
    p.add_argument("--executor", choices=["threads", "vectorized"], default="threads",
                   help="the executor that runs the maps (default: threads)")
    p.add_argument("--against", default="xla", metavar="SIDE",
                   help="xla (default), order=pairwise|ring|sequential, or executor=vectorized|threads")
    p.add_argument("--ulps", type=int, default=0, metavar="N",
                   help="an element differs when more than N ulps apart (default 0: bit-exact)")
    p.add_argument("--rtol", type=float, default=None, metavar="X",
                   help="and more than X times the other side's magnitude apart")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the report as JSON (schema: "
                   "spmdsim/data/compare.schema.json)")
    p.add_argument("--max-rows", type=positive_int, default=50, metavar="N", help="rows shown per table (default 50)")
    p.add_argument("--hosts", type=positive_int, default=None, metavar="H",
                   help="run the script as H host processes through MPI, as spmdsim run --hosts does (the devices "
                        "split evenly): each host compares its own devices' equations; host 0 prints one report, "
                        "naming the hosts")
    return p


def main(argv: list[str] | None = None) -> int:
    """``spmdsim compare``: see :func:`parser`.

    Raises:
        UsageError: bad options, no script, a script or module that does not exist.
    """
    from spmdsim.tools._script import check_program, run_program, split_argv
    from spmdsim.cli import UsageError
    from spmdsim.jax.integration._patch import patched_jax

    raw = list(sys.argv[1:] if argv is None else argv)
    ours, program = split_argv(raw, VALUED)
    args = parser().parse_args(ours)
    if program is None:
        raise UsageError("give the script to compare: spmdsim compare [options] SCRIPT.py [args], or -m MODULE")
    try:
        against = Against.parse(args.against)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.ulps < 0 or (args.rtol is not None and args.rtol < 0):
        raise UsageError("--ulps and --rtol must not be negative")
    check_program(program)
    from spmdsim import hosts
    from spmdsim.jax.tools._run import host_of
    host = host_of("compare", raw, args, lambda: _host_argv(args, program))  # spmdsim compare --hosts H
    if isinstance(host, int):  # this process launched the hosts, or ran one as its child: done
        return host
    if host is None or host.index == 0:
        as_hosts = "" if host is None else f" as {host.count} hosts ({host.local} devices each, through MPI)"
        print(f"spmdsim compare: {program.name} on {args.devices} virtual devices{as_hosts} ({args.executor} "
              f"executor), every equation of its maps against {against}", file=sys.stderr)

    def compared():
        report, status = compare_call(lambda: run_program(program), against=against, ulps=args.ulps,
                                      rtol=args.rtol, progress=host is None or host.index == 0)
        report.result = None
        return (report if host is None else _to_plain(report)), status

    if host is None:
        with patched_jax(args.devices, args.executor):
            report, status = compared()
    else:
        status = 1
        try:
            with patched_jax(args.devices, args.executor, host):
                every = host.run_program(compared)  # each host's report, gathered on every host
            report = merge([_from_plain(r) for r, _ in every])
            status = next((s for _, s in every if s), 0)
        finally:
            hosts.mpi.exit_process(host, "returned" if status == 0 else f"exited with status {status}")
    if host is None or host.index == 0:
        report.print(max_rows=args.max_rows)
        if args.json:
            report.write_json(args.json)
            print(f"spmdsim compare: wrote the report to {args.json}", file=sys.stderr)
    return status if status else (1 if report else 0)


def _host_argv(args, program) -> list[str]:
    """The command line of each host process of ``spmdsim compare --hosts H``: these options, the program, ``--``,
    its arguments."""
    argv = ["compare", "--devices", str(args.devices), "--executor", args.executor, "--against", args.against,
            "--ulps", str(args.ulps), "--max-rows", str(args.max_rows)]
    if args.rtol is not None:
        argv += ["--rtol", repr(args.rtol)]
    if args.json:
        argv += ["--json", os.path.abspath(args.json)]
    argv += [program.path] if program.path is not None else ["-m", program.module]
    return argv + ["--", *program.args]
