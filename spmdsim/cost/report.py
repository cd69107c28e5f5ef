"""Predictions where a person sees them: the table ``spmdsim run --hardware`` prints, a Python API, and a
"predicted on <hardware>" track in the Perfetto trace.

- :class:`Predictor` (``with spmdsim.cost.predicting("tpu-v5e:2x4") as p:``) watches every top-level map
  call the block makes (through ``spmdsim.jax.integration._map.map_observer``, the hook ``spmdsim compare`` uses; nothing
  is installed without it), analyses each map's body jaxpr once (:func:`spmdsim.cost.model.analyze`) and
  counts its calls. ``p.report()`` prints the tables; ``p.predictions`` has the numbers.
- :func:`predict` predicts without running: it traces ``fn(*args)`` with ``jax.make_jaxpr`` (arguments may be
  ``jax.ShapeDtypeStruct``\\ s, so real sizes cost nothing) and predicts every map in it.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import sys
import time

from spmdsim.tools._tables import print_table
from spmdsim.cost.hardware import Topology, topology
from spmdsim.cost.model import MapPrediction, analyze

__all__ = ["Predictor", "predicting", "predict", "Report", "format_time", "format_bytes"]


def format_time(seconds: float) -> str:
    if seconds == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def _flops(n: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} FLOP"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


@dataclasses.dataclass
class Report:
    """Predictions of some maps on one topology, with what prints them."""

    topology: Topology
    predictions: list

    @property
    def total(self) -> float:
        """Every call of every map, no overlap (s)."""
        return sum(p.serial * p.calls for p in self.predictions)

    def text(self, file=None, *, top: int = 5) -> str:
        """Print (to ``file``, default stdout) and return the tables: per map the step's predicted time and its
        split, MFU, peak memory against HBM, the slowest equations and collectives with their source lines."""
        out = []
        topo = self.topology
        head = (f"predicted on {topo.label} ({topo.count} chips; spmdsim.cost, the scaling book's rooflines and "
                f"collective formulas: see docs/cost_model.md)")
        print(head, file=file)
        out.append(head)
        for k, p in enumerate(self.predictions):
            out.append(self._map_tables(k, p, file, top))
        if len(self.predictions) > 1 or any(p.calls > 1 for p in self.predictions):
            line = (f"whole run: {sum(p.calls for p in self.predictions)} map calls, predicted "
                    f"{format_time(self.total)} with no overlap of compute and communication, "
                    f"{format_time(sum(p.overlapped * p.calls for p in self.predictions))} with perfect overlap")
            print(line, file=file)
            out.append(line)
        return "\n".join(out)

    def _map_tables(self, k: int, p: MapPrediction, file, top: int) -> str:
        chip = self.topology.chip
        mesh = ", ".join(f"{name}={size}" for name, size in p.cost.axes)
        title = f"map {k + 1}: {p.cost.name} over {mesh} ({p.calls} call{'s' * (p.calls != 1)}), per call and device"
        s = p.serial or 1.0
        rows = [
            ["step, no overlap (sum)", format_time(p.serial), "100%",
             f"unfused: {format_time(p.unfused_serial)}"],
            ["step, perfect overlap (max)", format_time(p.overlapped), _pct(p.overlapped / s), ""],
            ["  compute-bound equations", format_time(p.compute_bound), _pct(p.compute_bound / s),
             f"unfused: {format_time(p.unfused_compute_bound)}"],
            ["  memory-bound equations", format_time(p.memory_bound), _pct(p.memory_bound / s),
             f"unfused: {format_time(p.unfused_memory_bound)}"],
            ["  communication", format_time(p.comm), _pct(p.comm / s), ""],
            ["MFU", _pct(p.mfu), "", f"perfect overlap: {_pct(p.mfu_overlapped)}"],
            ["FLOPs per device", _flops(p.cost.flops), "", f"critical intensity {chip.critical_intensity:.0f} FLOP/B"],
            ["peak memory per device", format_bytes(p.cost.peak_bytes), _pct(p.hbm_fraction),
             f"of {format_bytes(chip.hbm_bytes)} HBM"],
        ]
        text = [print_table(title, ["", "predicted", "share", "note"], rows, file=file, right=["predicted", "share"])]
        grouped: dict = collections.OrderedDict()
        for t in p.ops:
            if t.comm is not None or t.time <= 0:
                continue
            key = (t.op.name, t.op.site, t.bound)
            g = grouped.setdefault(key, [0.0, 0.0, 0.0, 0, 0, 0])
            g[0] += t.time
            g[1] += t.op.flops * t.op.count
            g[2] += t.time_unfused
            g[3] += t.op.bytes(True) * t.op.count
            g[4] += t.op.bytes(False) * t.op.count
            g[5] += 1
        slow = sorted(grouped.items(), key=lambda kv: -kv[1][0])[:top]
        eq_rows = []
        for (name, site, bound), (tm, fl, tu, bf, bu, n) in slow:
            intensity = f"{fl / bf:.1f}" if bf else "-"
            differ = f" (unfused {format_bytes(bu)})" if bu > 2 * bf + 1 else ""
            eq_rows.append([name + (f" x{n}" if n > 1 else ""), site or "(JAX's own code)", format_time(tm), bound,
                            _flops(fl), format_bytes(bf) + differ, intensity])
        if eq_rows:
            text.append(print_table(f"slowest equations (fused; {len(grouped)} kinds and lines in all)",
                                    ["equation", "source line", "time", "bound", "FLOPs", "HBM bytes",
                                     "FLOP/B"], eq_rows, file=file, right=["time", "FLOPs", "FLOP/B"]))
        comms = collections.OrderedDict()
        for t in p.ops:
            if t.comm is None:
                continue
            key = (t.op.name, t.op.axes, t.op.site, t.op.collective)
            g = comms.setdefault(key, [0.0, 0.0, 0, t.comm])
            g[0] += t.time
            g[1] += t.op.comm_bytes * t.op.count
            g[2] += 1
        c_rows = []
        for (name, axes, site, kind), (tm, nb, n, cc) in sorted(comms.items(), key=lambda kv: -kv[1][0])[:top]:
            c_rows.append([name + (f" x{n}" if n > 1 else ""), ",".join(map(str, axes)), kind, format_bytes(nb),
                           cc.links, format_time(tm), cc.bound, site or "(JAX's own code)"])
        if c_rows:
            text.append(print_table("slowest collectives", ["collective", "axes", "as", "array bytes", "links",
                                                            "time", "bound", "source line"], c_rows, file=file,
                                    right=["array bytes", "time"]))
        for note in p.cost.notes:
            print(f"note: {note}", file=file)
            text.append(f"note: {note}")
        return "\n".join(text)


class _MapRecord:
    def __init__(self, jaxpr, prediction: MapPrediction):
        self.jaxpr = jaxpr  # held, so that its id is not reused
        self.prediction = prediction
        self.ends: list = []


class Predictor:
    """Predict every top-level map call made while it is active (``with Predictor(hw):`` or :func:`predicting`).
    ``hardware``: a :class:`~spmdsim.cost.hardware.Topology` or a spec such as ``"tpu-v5e:2x4"``, ``"h100:8"``
    (``devices``: the chip count when the spec gives none)."""

    def __init__(self, hardware, devices: int | None = None):
        self.topology = topology(hardware, devices)
        self._maps: dict = {}
        self._order: list = []
        self.errors: list = []
        self._previous = None

    def observe(self, args, params, outs) -> None:
        """``spmdsim.jax.integration._map.map_observer``'s signature: one top-level map call ended."""
        end = time.perf_counter()
        key = (id(params["jaxpr"]), params["axes"])
        rec = self._maps.get(key)
        if rec is None:
            try:
                cost = analyze(params["jaxpr"], params["axes"], f"{params.get('api', 'map')} #{len(self._order) + 1}")
                rec = _MapRecord(params["jaxpr"], cost.predict(self.topology))
            except Exception as e:  # noqa: BLE001 - a prediction must never break the program
                if str(e) not in self.errors:
                    self.errors.append(str(e))
                return
            self._maps[key] = rec
            self._order.append(rec)
        rec.prediction.calls = len(rec.ends) + 1
        rec.ends.append(end)

    def __enter__(self) -> "Predictor":
        from spmdsim.jax.integration import _map
        previous = self._previous = _map.map_observer

        def observer(args, params, outs):
            if previous is not None:
                previous(args, params, outs)
            self.observe(args, params, outs)
        self._observer = observer
        _map.map_observer = observer
        return self

    def __exit__(self, *exc) -> None:
        from spmdsim.jax.integration import _map
        if _map.map_observer is self._observer:
            _map.map_observer = self._previous

    @property
    def predictions(self) -> list:
        return [rec.prediction for rec in self._order]

    def report(self, file=None, top: int = 5) -> str:
        """Print the tables (see :meth:`Report.text`); also any map that could not be predicted."""
        if not self._order:
            line = f"spmdsim.cost: no mapped call ran, so nothing was predicted on {self.topology.label}"
            print(line, file=file)
            return line
        text = Report(self.topology, self.predictions).text(file, top=top)
        for e in self.errors:
            print(f"spmdsim.cost: not predicted: {e}", file=file)
        return text

    def add_to_perfetto(self, path: str, tr, *, detailed_calls: int = 3) -> int:
        """Add a "predicted on <hardware>" process to the Perfetto JSON at ``path`` (written by
        ``tr.to_perfetto``): a track per map, each call's predicted step starting where the measured call
        started, its equations and collectives laid end to end (no overlap) for the first ``detailed_calls``
        calls of each map. Returns the number of events added."""
        from spmdsim.tools._trace import _mapped_calls
        with open(path) as f:
            doc = json.load(f)
        events = doc["traceEvents"]
        pid = max((e.get("pid", 0) for e in events), default=0) + 1
        measured = _mapped_calls(tr.calls, tr.events)
        added = [{"ph": "M", "pid": pid, "name": "process_name",
                  "args": {"name": f"predicted on {self.topology.label}"}},
                 {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": 1000}}]

        def us(t):
            return round((t - tr.origin) * 1e6, 3)

        for tid, rec in enumerate(self._order, start=1):
            p = rec.prediction
            added.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                          "args": {"name": f"{p.cost.name} predicted"}})
            for k, end in enumerate(rec.ends):
                starts = [m.start for m in measured if m.end <= end + 1e-3]
                start = starts[-1] if starts else end
                ts = us(start)
                added.append({"ph": "X", "pid": pid, "tid": tid, "cat": "predicted", "ts": ts,
                              "dur": max(p.serial * 1e6, 0.001),
                              "name": f"{p.cost.name} on {self.topology.label}",
                              "args": {"no_overlap_us": p.serial * 1e6, "overlapped_us": p.overlapped * 1e6,
                                       "compute_bound_us": p.compute_bound * 1e6,
                                       "memory_bound_us": p.memory_bound * 1e6, "comm_us": p.comm * 1e6,
                                       "mfu": p.mfu}})
                if k >= detailed_calls:
                    continue
                t = ts
                for ot in p.ops:
                    if ot.time <= 0:
                        continue
                    args = {"site": ot.op.site, "bound": ot.bound, "count": ot.op.count}
                    if ot.comm is not None:
                        args.update(collective=ot.op.collective, array_bytes=ot.op.comm_bytes, links=ot.comm.links)
                    else:
                        args.update(flops=ot.op.flops * ot.op.count, hbm_bytes=ot.op.bytes(True) * ot.op.count)
                    added.append({"ph": "X", "pid": pid, "tid": tid, "cat": "predicted", "ts": round(t, 3),
                                  "dur": max(ot.time * 1e6, 0.001), "name": ot.op.name, "args": args})
                    t += ot.time * 1e6
        events.extend(added)
        with open(path, "w") as f:
            json.dump(doc, f)
        return len(added)


def predicting(hardware, devices: int | None = None) -> Predictor:
    """``with spmdsim.cost.predicting("tpu-v5e:2x4") as p: step(...)``; then ``p.report()``."""
    return Predictor(hardware, devices)


def _maps_in(jaxpr, found: list) -> None:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "spmdsim_map":
            found.append(eqn)
            continue
        for value in eqn.params.values():
            values = value if isinstance(value, (tuple, list)) else (value,)
            for v in values:
                inner = getattr(v, "jaxpr", v)
                if hasattr(inner, "eqns"):
                    _maps_in(inner, found)


def predict(fn, *args, hardware, **kwargs) -> Report:
    """Predict every spmdsim map (``spmdsim.jax.pmap``, ``spmdsim.jax.shard_map``, a ``jax.pmap`` or
    ``jax.shard_map`` under ``spmdsim run``) that ``fn(*args, **kwargs)`` calls, without running it: traced by
    ``jax.make_jaxpr`` (``args`` may be ``jax.ShapeDtypeStruct``). Returns a :class:`Report`
    (``.text()`` prints it, ``.predictions`` holds the numbers)."""
    import jax
    closed = jax.make_jaxpr(lambda *a: fn(*a, **kwargs))(*args)
    found: list = []
    _maps_in(closed.jaxpr, found)
    topo = topology(hardware, None if ":" in str(hardware) or isinstance(hardware, Topology) else
                    (max((_devices(e.params["axes"]) for e in found), default=1)))
    preds = []
    for k, eqn in enumerate(found):
        cost = analyze(eqn.params["jaxpr"], eqn.params["axes"], f"{eqn.params.get('api', 'map')} #{k + 1}")
        preds.append(cost.predict(topo))
    return Report(topo, preds)


def _devices(axes) -> int:
    n = 1
    for _, size in axes:
        n *= size
    return n


def _stderr():
    return sys.stderr
