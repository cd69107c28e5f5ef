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

import itertools
import os
import sys
import threading
import time
from typing import Any, Callable

import numpy as np

from spmdsim.runtime import _process_group, _runtime
from spmdsim.primitives._reduction import ReductionOrder
from spmdsim.jax.evaluation import _dtypes
from spmdsim.jax.integration import _map
from spmdsim.jax.evaluation._interpreter import (HIGHER_ORDER, Vectorized, current_site, eqn_stack, observe_equations,
                                      site_of)
from spmdsim.jax.tools._compare_report import (Against, Difference, Drift, Report, _aval, _device_order, _from_plain,
                                               _key, _short, _to_plain, distance, merge)
from spmdsim.jax.tools._compare_sides import (_COLLECTIVES, _NOT_COMPUTED, FUSED_MAX_EQUATIONS, FUSED_MAX_RUNS,
                                              _flattened, _folded_scatter, _folded_sums, _jax_jit, _jitted,
                                              _other_executor, _Recorder, _run_of, _runnable, _xla_map)

__all__ = ["compare_call", "main", "parser"]


_SUMS = ("psum", "psum_invariant", "reduce_scatter")  # the collectives whose result depends on the order
_LOOPS = ("while", "scan")  # their bodies' equations are evaluated once per iteration



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
    from spmdsim.cli import ArgumentParser, add_device_options, positive_int
    p = ArgumentParser(
        prog="spmdsim compare",
        usage="spmdsim compare [options] SCRIPT.py [args]\n       spmdsim compare [options] -m MODULE [args]",
        description="Run an unmodified JAX script as spmdsim run does, comparing every equation of its maps with "
                    "XLA:CPU (or another reduction order, or the other executor) on the same operands; print each "
                    "equation that differs, first occurrence first, then how far each map call's outputs drifted.",
        epilog="Exit status: the script's if it failed, else 1 when something differs beyond the tolerance (an "
               "equation, a run of equations XLA fuses, or a map call's outputs end to end), 0 when nothing does.")
    add_device_options(p, devices_default=spmdsim.device_count(),
                       executor_help="the executor that runs the maps (default: threads)")
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
    host = host_of(args, lambda: _host_argv(args, program))  # spmdsim compare --hosts H
    if isinstance(host, int):  # this process launched the hosts: done
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