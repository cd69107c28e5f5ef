"""Recording what the devices did: ``with spmdsim.trace() as tr:``.

Per device: the mapped call's start and end. Per collective: op, axis names, group parameters, the step
number within its communicator, shapes, dtypes, bytes, every device's source line, arrival and release
times (the wait is visible), and on request the values (``values="summary"``: min/max/mean per device;
``values="full"``: copies of every operand and result). ``tr.summary()`` is a table per collective and axis;
``tr.to_perfetto(path)`` writes the Chrome trace-event JSON format (one track per device, flow arrows tying
together the devices of each rendezvous), which opens in https://ui.perfetto.dev and chrome://tracing.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import html
import json
import math
import threading
import time
from typing import Any

import numpy as np

from spmdsim import _runtime
from spmdsim._tables import print_table

__all__ = ["CollectiveEvent", "CallEvent", "Trace", "trace"]


@dataclasses.dataclass(frozen=True)
class CallEvent:
    """One device's run of the mapped function: ``start``/``end`` in ``time.perf_counter()`` seconds."""

    device: str
    start: float
    end: float
    outcome: str   # "returned", "raised", "stopped"


@dataclasses.dataclass(frozen=True)
class CollectiveEvent:
    """One collective step of one communicator, as every participating device saw it.

    ``devices``, ``sites``, ``arrived`` (and ``operands``/``results`` when recorded) are indexed by the rank
    over the named axes (the axis index for one axis); times are ``time.perf_counter()`` seconds; ``nbytes``
    is one device's operand size in bytes; ``step`` counts the collectives of this communicator.
    """

    op: str
    axis_name: tuple
    axis_size: int
    step: int
    params: dict
    shapes: tuple
    dtypes: tuple
    nbytes: int
    devices: tuple[str, ...]
    sites: tuple[str, ...]
    arrived: tuple[float, ...]
    released: float
    operands: tuple | None = None
    results: tuple | None = None

    @property
    def wait(self) -> float:
        """Seconds between the first arrival and the release (how long the earliest device waited)."""
        return self.released - min(self.arrived)

    @property
    def slowest(self) -> str:
        """The device that arrived last (everyone else waited for it)."""
        return self.devices[int(np.argmax(self.arrived))]


def _summarize(a) -> dict:
    a = np.asarray(a)
    if a.size == 0 or a.dtype.kind not in "biufc" and a.dtype.name != "bfloat16":
        return {"shape": list(a.shape), "dtype": str(a.dtype)}
    v = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
    return {"shape": list(a.shape), "dtype": str(a.dtype), "min": float(np.min(v.real)), "max": float(np.max(v.real)),
            "mean": complex(np.mean(v)) if a.dtype.kind == "c" else float(np.mean(v))}


class Trace:
    """The calls and collectives recorded while the ``trace()`` block ran."""

    def __init__(self, values: str | None = None, thread: int | None = None):
        if values not in (None, "summary", "full"):
            raise ValueError(f"trace(values=...) must be None, 'summary' or 'full', got {values!r}.")
        self.values = values
        self.thread = thread  # the ident of the thread whose calls are recorded; None: every thread
        self.events: list[CollectiveEvent] = []
        self.calls: list[CallEvent] = []
        self._lock = threading.Lock()
        self.origin = time.perf_counter()

    # -- recording (called by the runtime) ---------------------------------------------------------------

    def record(self, rv, released: float) -> None:
        op, names, sizes, params, avals = rv.signature
        operands = results = None
        if self.values == "full":
            operands = tuple(tuple(np.array(b) for b in blocks) for blocks in rv.blocks)
            results = None if rv.results is None else tuple(tuple(np.array(r) for r in res) for res in rv.results)
        elif self.values == "summary":
            operands = tuple(tuple(_summarize(b) for b in blocks) for blocks in rv.blocks)
            results = None if rv.results is None else tuple(tuple(_summarize(r) for r in res) for res in rv.results)
        nbytes = sum(getattr(b, "nbytes", 0) for b in rv.blocks[0])
        event = CollectiveEvent(op, names, rv.size, rv.seq, dict(params), tuple(s for s, _ in avals),
                                tuple(str(d) for _, d in avals), nbytes, tuple(lane.label for lane in rv.lanes),
                                tuple(rv.sites), tuple(rv.arrivals), released, operands, results)
        with self._lock:
            self.events.append(event)

    def lane(self, label: str, start: float, end: float, outcome: str) -> None:
        with self._lock:
            self.calls.append(CallEvent(label, start, end, outcome))

    # -- reports ---------------------------------------------------------------------------------------

    def counts(self) -> collections.Counter:
        """How many collectives of each op ran, e.g. ``Counter({'psum': 500})``."""
        return collections.Counter(e.op for e in self.events)

    def summary_rows(self) -> list[dict]:
        """One row per (op, axis): count, bytes per device, total and worst wait (ms), slowest device."""
        groups: dict = collections.defaultdict(list)
        for e in self.events:
            groups[(e.op, e.axis_name)].append(e)
        rows = []
        for (op, axis), events in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            slowest = collections.Counter(e.slowest for e in events).most_common(1)[0][0]
            rows.append({"op": op, "axis": axis[0] if len(axis) == 1 else axis, "count": len(events),
                         "bytes": sum(e.nbytes for e in events),
                         "total_wait_ms": 1e3 * sum(e.wait for e in events),
                         "worst_wait_ms": 1e3 * max(e.wait for e in events), "slowest_device": slowest})
        return rows

    def summary(self, file=None) -> str:
        """A table per collective and axis (count, bytes, total and worst wait, slowest device); printed
        with rich when it is installed (never cut to 80 columns when not a terminal), returned as plain text."""
        rows = self.summary_rows()
        header = ["collective", "axis", "count", "bytes/device", "total wait ms", "worst wait ms", "slowest device"]
        body = [[r["op"], repr(r["axis"]), str(r["count"]), str(r["bytes"]), f"{r['total_wait_ms']:.3f}",
                 f"{r['worst_wait_ms']:.3f}", r["slowest_device"]] for r in rows]
        title = f"collectives: {len(self.events)} in {len(self.calls)} device calls"
        return print_table(title, header, body, file=file, right=[h for h in header if h[0] in "cbtw" and
                                                                  h != "collective"])

    def to_perfetto(self, path) -> dict | None:
        """Write the Chrome trace-event JSON (https://ui.perfetto.dev, chrome://tracing): a track per device
        with its call and its collectives (arrival to release), and a flow arrow through the devices of each
        rendezvous. Returns the JSON object.

        In a multi-host run (see :mod:`spmdsim._hosts`) every host's devices meet on host 0, whose trace holds
        them all: there each host is a process track (``host 1``) with a thread track per device; on the other
        hosts nothing is written (their traces are empty) and None is returned."""
        from spmdsim import _hosts
        if _hosts.process_index() != 0:
            return None
        tids: dict[str, int] = {}

        def tid(label):
            return tids.setdefault(label, len(tids) + 1)

        def pid(label) -> int:
            return _host_of(label) + 1

        def us(t):
            return round((t - self.origin) * 1e6, 3)

        for label in sorted({c.device for c in self.calls} | {d for e in self.events for d in e.devices},
                            key=_device_sort_key):
            tid(label)
        hosts = sorted({_host_of(label) for label in tids}) or [0]
        multi = any(label.startswith("host ") for label in tids)
        events: list[dict] = [{"ph": "M", "pid": h + 1, "name": "process_name",
                               "args": {"name": f"host {h}" if multi else "spmdsim"}} for h in hosts]
        events += [{"ph": "M", "pid": h + 1, "name": "process_sort_index", "args": {"sort_index": h}}
                   for h in hosts]
        events += [{"ph": "M", "pid": pid(label), "tid": t, "name": "thread_name", "args": {"name": label}}
                   for label, t in tids.items()]
        events += [{"ph": "M", "pid": pid(label), "tid": t, "name": "thread_sort_index", "args": {"sort_index": t}}
                   for label, t in tids.items()]
        for c in self.calls:
            events.append({"ph": "X", "pid": pid(c.device), "tid": tid(c.device), "name": "mapped call", "cat": "call",
                           "ts": us(c.start), "dur": max(us(c.end) - us(c.start), 0.001), "args": {"outcome": c.outcome}})
        for k, e in enumerate(self.events):
            name = f"{e.op}({', '.join(map(str, e.axis_name))})"
            for rank, (device, arrived, site) in enumerate(zip(e.devices, e.arrived, e.sites)):
                args: dict[str, Any] = {"axis_name": list(map(str, e.axis_name)), "step": e.step, "rank": rank,
                                        "shapes": [list(s) for s in e.shapes], "dtypes": list(e.dtypes),
                                        "bytes": e.nbytes, "site": site,
                                        "wait_us": round((e.released - arrived) * 1e6, 3)}
                args.update({k2: repr(v) for k2, v in e.params.items() if v is not None})
                if self.values == "summary" and e.operands is not None:
                    args["operand"] = e.operands[rank]
                    args["result"] = e.results[rank] if e.results is not None else None
                events.append({"ph": "X", "pid": pid(device), "tid": tid(device), "name": name, "cat": "collective",
                               "ts": us(arrived), "dur": max(us(e.released) - us(arrived), 0.001), "args": args})
            order = sorted(range(len(e.devices)), key=lambda r: tid(e.devices[r]))
            for j, rank in enumerate(order):
                phase = "s" if j == 0 else ("f" if j == len(order) - 1 else "t")
                flow = {"ph": phase, "pid": pid(e.devices[rank]), "tid": tid(e.devices[rank]), "id": k, "name": "rendezvous",
                        "cat": "rendezvous", "ts": us(e.released)}
                if phase == "f":
                    flow["bp"] = "e"
                if len(order) > 1:
                    events.append(flow)
        doc = {"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"producer": "spmdsim", "collectives": len(self.events)}}
        with open(path, "w") as f:
            json.dump(doc, f, default=_json_default)
        return doc


    def to_svg(self, path=None, *, width: int = 900):
        """Draw the timeline: one row per device, its mapped call (grey), each collective from the device's
        arrival to the release (coloured by op, so the bar's length is the wait), a line through the devices
        of each rendezvous at its release; a time axis in milliseconds and a legend below.

        Args:
            path: also write the SVG document there.
            width: the picture's width in pixels.

        Returns:
            A :class:`spmdsim.show.Picture` (Jupyter shows it inline; ``.svg`` is the document).

        Raises:
            ValueError: nothing was recorded.
        """
        from spmdsim import _svg

        labels = sorted({c.device for c in self.calls} | {d for e in self.events for d in e.devices},
                        key=_device_sort_key)
        times = [c.start for c in self.calls] + [c.end for c in self.calls] + [e.released for e in self.events]
        if not labels or not times:
            raise ValueError("the trace is empty: nothing ran inside the trace() block")
        t0, t1 = min(times), max(times)
        left = 20 + max(_svg.text_width(label, 11) for label in labels)
        width = max(width, left + 300)
        row, top, right = 26, 40, 20
        scale = (width - left - right) / max(t1 - t0, 1e-9)

        def x(t):
            return left + (t - t0) * scale

        title = f"spmdsim trace: {len(self.events)} collectives, {1e3 * (t1 - t0):.2f} ms"
        colours: dict[str, str] = {}
        palette = ["#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"]
        ys = {label: top + i * row for i, label in enumerate(labels)}
        out = [_svg.text(10, 22, title, size=13)]
        for label, y in ys.items():
            out.append(_svg.text(10, y + 16, label, size=11))
        for c in self.calls:
            out.append(f'<rect x="{x(c.start):.1f}" y="{ys[c.device] + 4}" width="{max(x(c.end) - x(c.start), 1):.1f}" '
                       f'height="{row - 8}" fill="#e6e6e6"/>')
        for e in self.events:
            colour = colours.setdefault(e.op, palette[len(colours) % len(palette)])
            for device, arrived in zip(e.devices, e.arrived):
                out.append(f'<rect x="{x(arrived):.1f}" y="{ys[device] + 7}" '
                           f'width="{max(x(e.released) - x(arrived), 1.5):.1f}" height="{row - 14}" fill="{colour}">'
                           f'<title>{html.escape(e.op)} step {e.step} wait {1e6 * (e.released - arrived):.0f} us'
                           f'</title></rect>')
            ry = sorted(ys[d] for d in e.devices)
            out.append(f'<line x1="{x(e.released):.1f}" y1="{ry[0] + 7}" x2="{x(e.released):.1f}" '
                       f'y2="{ry[-1] + row - 7}" stroke="black" stroke-width="0.6"/>')
        axis_y = top + len(labels) * row + 6
        out.append(f'<line class="time-axis" x1="{left}" y1="{axis_y}" x2="{width - right}" y2="{axis_y}" '
                   f'stroke="black" stroke-width="0.8"/>')
        span_ms = 1e3 * (t1 - t0)
        step_ms = _tick_step(span_ms, (width - left - right) / 70)
        k = 0
        while k * step_ms <= span_ms * (1 + 1e-9):
            tx = x(t0 + k * step_ms / 1e3)
            out.append(f'<line x1="{tx:.1f}" y1="{axis_y}" x2="{tx:.1f}" y2="{axis_y + 4}" stroke="black"/>'
                       + _svg.text(tx, axis_y + 16, f"{k * step_ms:g}", size=11, anchor="middle"))
            k += 1
        out.append(_svg.text(width - right, axis_y + 30, "time since the first device started (ms)", size=11,
                             anchor="end"))
        items = [("#e6e6e6", "a device's mapped call")] + [(c, f"{op}: arrival to release")
                                                            for op, c in colours.items()]
        lx, ly = 10.0, axis_y + 48
        for colour, name in items:
            item_w = 16 + _svg.text_width(name, 11) + 16
            if lx + item_w > width - 10:
                lx, ly = 10.0, ly + 18
            out.append(f'<g class="legend"><rect x="{lx:.1f}" y="{ly - 10}" width="12" height="12" fill="{colour}"/>'
                       + _svg.text(lx + 16, ly, name, size=11) + "</g>")
            lx += item_w
        note = "a black line joins the devices of one rendezvous at its release"
        out.append(_svg.text(10, ly + 20, note, size=11))
        picture = _svg.Picture(title, _svg.document(width, ly + 32, out))
        if path is not None:
            picture.save(path)
        return picture


def _tick_step(span_ms: float, max_ticks: float) -> float:
    """A round tick spacing (1, 2 or 5 times a power of ten) giving at most ``max_ticks`` ticks."""
    raw = span_ms / max(max_ticks, 1)
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _json_default(value):
    if isinstance(value, complex):
        return [value.real, value.imag]
    if isinstance(value, np.generic):
        return value.item()
    return repr(value)


def _host_of(label: str) -> int:
    """The host a device label names (``host 1 device 5 [i=5]``), 0 without one."""
    parts = label.split()
    return int(parts[1]) if len(parts) > 1 and parts[0] == "host" and parts[1].isdigit() else 0


def _device_sort_key(label: str):
    head = label.split(" [")[0].split()
    if head and head[0] == "host":
        head = head[2:]
    return (head[0], int(head[1]) if len(head) > 1 and head[1].isdigit() else 0, label)


@contextlib.contextmanager
def trace(values: str | None = None, *, all_threads: bool = False):
    """Record the mapped calls made inside the block by the thread that opened it: every device call and
    collective, nested calls included.

    ``values``: None (shapes and times only), ``"summary"`` (min/max/mean of every device's operand and
    result) or ``"full"`` (copies of the arrays). ``all_threads=True`` records the calls that any thread
    starts inside the block. A call already running when the block opens is not recorded (events are whole:
    every one has its arrival and release times). Yields a :class:`Trace`.
    """
    tr = Trace(values, None if all_threads else threading.get_ident())
    _runtime.observers.append(tr)
    try:
        yield tr
    finally:
        _runtime.observers.remove(tr)
