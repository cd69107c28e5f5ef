"""Recording what the devices did: ``with spmdsim.trace() as tr:``.

Per device: the mapped call's start and end. Per collective: its name as the user called it (``pmean``, also
in a jitted JAX program, where JAX binds ``psum`` and a division), the primitive bound, axis names, group
parameters, the step number within its communicator, shapes, dtypes, bytes, every device's source line, arrival
and release times (the wait is visible), and on request the values (``values="summary"``: min/max/mean per
device; ``values="full"``: copies of every operand and result). Every view names a collective by that name and
its axes: ``tr.summary()`` is a table per collective and axis; ``tr.to_perfetto(path)`` writes the Chrome
trace-event JSON format (one track per device, an event ``pmean(data)`` per collective, flow arrows tying
together the devices of each rendezvous), which opens in https://ui.perfetto.dev and chrome://tracing;
``tr.to_svg(path)`` draws the timeline, a colour per collective and axis.
"""
from __future__ import annotations

import bisect
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

from spmdsim.runtime import _runtime
from spmdsim.tools._tables import print_table

__all__ = ["CollectiveEvent", "CallEvent", "Trace", "trace"]


@dataclasses.dataclass(frozen=True)
class CallEvent:
    """One device's run of the mapped function: ``start``/``end`` in ``time.perf_counter()`` seconds."""

    device: str
    start: float
    end: float
    outcome: str   # "returned", "raised", "stopped"
    name: str = "mapped call"  # the mapped function's name, when the runtime gives it
    call: int | None = None    # the top-level mapped call's number, when the runtime gives it


@dataclasses.dataclass(frozen=True)
class CollectiveEvent:
    """One collective step of one communicator, as every participating device saw it.

    ``op`` is the collective as the user called it (``pmean``; ``psum`` for the ``psum_invariant`` that
    ``jax.lax.psum`` binds in a ``jax.shard_map``), ``primitive`` the JAX primitive bound (``psum`` for a pmean:
    JAX's pmean is a psum and a division; the values recorded for a ``jax.lax.pmean`` are the psum's).
    ``devices``, ``sites``, ``arrived`` (and ``operands``/``results`` when recorded) are indexed by the rank
    over the named axes (the axis index for one axis); times are ``time.perf_counter()`` seconds; ``nbytes``
    is one device's operand size in bytes; ``step`` counts the collectives of this communicator.
    """

    op: str
    primitive: str
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

    @property
    def name(self) -> str:
        """``pmean(data)``: the collective as the user called it and its axes (Perfetto's event name; the
        timeline's legend says ``pmean over 'data'``)."""
        return f"{self.op}({', '.join(map(str, self.axis_name))})"


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
        called = next((api for api in rv.apis if api), None) or op  # the name the user wrote (pmean binds psum)
        event = CollectiveEvent(called, op, names, rv.size, rv.seq, dict(params), tuple(s for s, _ in avals),
                                tuple(str(d) for _, d in avals), nbytes, tuple(lane.label for lane in rv.lanes),
                                tuple(rv.sites), tuple(rv.arrivals), released, operands, results)
        with self._lock:
            self.events.append(event)

    def lane(self, label: str, start: float, end: float, outcome: str, name: str | None = None,
             call: int | None = None) -> None:
        """One device's run of the mapped function (``name``, when known: Perfetto's event is named after it;
        ``call``: the number of the top-level mapped call it belongs to)."""
        with self._lock:
            self.calls.append(CallEvent(label, start, end, outcome, name or "mapped call", call))

    # -- reports ---------------------------------------------------------------------------------------

    def counts(self) -> collections.Counter:
        """How many collectives of each name ran (as the user called them), e.g. ``Counter({'psum': 500})``."""
        return collections.Counter(e.op for e in self.events)

    def summary_rows(self) -> list[dict]:
        """One row per collective (as the user called it) and axis: ``op``, ``axis``, ``count``, ``bytes`` (per
        device), ``total_wait_ms``, ``worst_wait_ms`` and ``slowest_device``."""
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
        title = f"{_counted(len(self.events), 'collective')} in {_calls_text(self.calls, self.events)}"
        return print_table(title, header, body, file=file, right=[h for h in header if h[0] in "cbtw" and
                                                                  h != "collective"])

    def to_perfetto(self, path) -> dict | None:
        """Write the Chrome trace-event JSON (https://ui.perfetto.dev, chrome://tracing): a track per device
        with its call and its collectives (arrival to release), and a flow arrow through the devices of each
        rendezvous. Returns the JSON object.

        In a multi-host run (see :mod:`spmdsim.runtime._hosts`) every host's devices meet on host 0, whose trace holds
        them all: there each host is a process track (``host 1``) with a thread track per device; on the other
        hosts nothing is written (their traces are empty) and None is returned."""
        from spmdsim.runtime import _hosts
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
            events.append({"ph": "X", "pid": pid(c.device), "tid": tid(c.device), "name": c.name, "cat": "call",
                           "ts": us(c.start), "dur": max(us(c.end) - us(c.start), 0.001),
                           "args": {"outcome": c.outcome}})
        for k, e in enumerate(self.events):
            for rank, (device, arrived, site) in enumerate(zip(e.devices, e.arrived, e.sites)):
                args: dict[str, Any] = {"collective": e.op, "primitive": e.primitive,
                                        "axis_name": list(map(str, e.axis_name)), "step": e.step, "rank": rank,
                                        "shapes": [list(s) for s in e.shapes], "dtypes": list(e.dtypes),
                                        "bytes": e.nbytes, "site": site,
                                        "wait_us": round((e.released - arrived) * 1e6, 3)}
                args.update({k2: repr(v) for k2, v in e.params.items() if v is not None})
                if self.values == "summary" and e.operands is not None:
                    args["operand"] = e.operands[rank]
                    args["result"] = e.results[rank] if e.results is not None else None
                events.append({"ph": "X", "pid": pid(device), "tid": tid(device), "name": e.name, "cat": "collective",
                               "ts": us(arrived), "dur": max(us(e.released) - us(arrived), 0.001), "args": args})
            order = sorted(range(len(e.devices)), key=lambda r: tid(e.devices[r]))
            for j, rank in enumerate(order):
                phase = "s" if j == 0 else ("f" if j == len(order) - 1 else "t")
                flow = {"ph": phase, "pid": pid(e.devices[rank]), "tid": tid(e.devices[rank]), "id": k,
                        "name": "rendezvous", "cat": "rendezvous", "ts": us(e.released)}
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
        """Draw the timeline: a panel per set of devices (the calls of one map), a row per device with its mapped
        calls (grey) and each collective from the device's arrival to the release (a colour per collective and
        axes, so the bar's length is the wait), a line through the devices of each rendezvous at its release.
        Idle time between calls longer than the longest call (a script tracing and compiling between them) is
        cut where it would be wider than a few breaks: a zigzag marks each cut, labelled with its length.
        Below: the time axis in milliseconds since the first call started (continuous between cuts) and the
        legend.

        Args:
            path: also write the SVG document there.
            width: the picture's width in pixels.

        Returns:
            A :class:`spmdsim.show.Picture` (Jupyter shows it inline; ``.svg`` is the document).

        Raises:
            ValueError: nothing was recorded.
        """
        from spmdsim.tools import _svg

        calls = _mapped_calls(self.calls, self.events)
        if not calls:
            raise ValueError("the trace is empty: nothing ran inside the trace() block")
        panels = _panels(calls)
        labels = [label for panel in panels for label in panel.rows]
        left = 20 + max(_svg.text_width(label, 11) for label in labels)
        width = max(width, left + 300)
        row, right = 26, 20
        axis = _TimeAxis([(c.start, c.end) for c in calls], left, width - right)
        keys = list(dict.fromkeys((e.op, e.axis_name) for e in self.events))
        colours = {key: _svg.device_colour(k, len(keys)) for k, key in enumerate(keys)}
        title = (f"spmdsim trace: {_counted(len(self.events), 'collective')} in {_calls_text(self.calls, self.events)}"
                 f", {1e3 * axis.busy:.2f} ms busy of {1e3 * axis.span:.2f} ms")
        top = y = 40
        axis_y = top + sum(18 + len(panel.rows) * row + 10 for panel in panels)
        out = [_svg.text(10, 22, title, size=13), *axis.bands(top, axis_y)]
        for panel in panels:
            out += _panel_svg(panel, y, row, axis, colours)
            y += 18 + len(panel.rows) * row + 10
        out += axis.draw(axis_y)
        below = axis_y + (56 if axis.cuts else 32)  # under the cuts' lengths
        out.append(_svg.text(width - right, below, "time since the first call started (ms)", size=11, anchor="end"))
        items = [("#e6e6e6", "a device's mapped call")] + [
            (colours[key], f"{_called(*key)}: arrival to release") for key in keys]
        lx, ly = 10.0, below + 20
        for colour, name in items:
            item_w = 16 + _svg.text_width(name, 11) + 16
            if lx + item_w > width - 10 and lx > 10:
                lx, ly = 10.0, ly + 18
            out.append(f'<g class="legend"><rect x="{lx:.1f}" y="{ly - 10}" width="12" height="12" fill="{colour}"/>'
                       + _svg.text(lx + 16, ly, name, size=11) + "</g>")
            lx += item_w
        notes = ["a black line joins the devices of one rendezvous at its release"]
        if axis.cuts:
            notes.append("a zigzag marks idle time cut out (no device ran), labelled with its length")
        for k, note in enumerate(notes):
            out.append(_svg.text(10, ly + 20 + 16 * k, note, size=11))
        picture = _svg.Picture(title, _svg.document(width, ly + 16 + 16 * len(notes), out))
        if path is not None:
            picture.save(path)
        return picture


def _panel_svg(panel: _Panel, y: float, row: int, axis: _TimeAxis, colours: dict) -> list[str]:
    """A panel from ``y`` down: its heading, a row per device (``row`` px high) with its mapped calls (grey), its
    collectives from arrival to release (in ``colours[op, axis_name]``) and a line through each rendezvous."""
    from spmdsim.tools import _svg

    heading = (f"{_counted(len(panel.rows), 'device')}{_over(panel.rows)}: {_counted(len(panel.calls), 'mapped call')}, "
               f"{_counted(sum(len(c.events) for c in panel.calls), 'collective')}")
    out = [_svg.text(10, y + 12, heading, size=12, extra=' class="panel" font-weight="bold"')]
    ys = {label: y + 18 + i * row for i, label in enumerate(panel.rows)}
    out += [_svg.text(10, ry + 16, label, size=11) for label, ry in ys.items()]
    for call in panel.calls:
        for c in call.devices:
            x0, x1 = axis.x(c.start), axis.x(c.end)
            out.append(f'<rect x="{x0:.1f}" y="{ys[c.device] + 4}" width="{max(x1 - x0, 1):.1f}" height="{row - 8}" '
                       f'fill="#e6e6e6"><title>{html.escape(c.device)}: mapped call {call.index + 1}, '
                       f'{1e3 * (c.end - c.start):.3f} ms, {c.outcome}</title></rect>')
        for e in call.events:
            what, released = html.escape(_called(e.op, e.axis_name)), axis.x(e.released)
            for device, arrived in zip(e.devices, e.arrived, strict=True):
                x0 = axis.x(arrived)
                out.append(f'<rect x="{x0:.1f}" y="{ys[device] + 7}" width="{max(released - x0, 1.5):.1f}" '
                           f'height="{row - 14}" fill="{colours[e.op, e.axis_name]}"><title>{what} step {e.step} '
                           f'wait {1e6 * (e.released - arrived):.0f} us</title></rect>')
            ry = sorted(ys[d] for d in e.devices)
            out.append(f'<line x1="{released:.1f}" y1="{ry[0] + 7}" x2="{released:.1f}" y2="{ry[-1] + row - 7}" '
                       f'stroke="black" stroke-width="0.6"/>')
    return out


@dataclasses.dataclass
class _MappedCall:
    """One top-level mapped call as the trace saw it: its devices' calls and its collectives."""

    index: int
    start: float
    end: float
    devices: list = dataclasses.field(default_factory=list)
    events: list = dataclasses.field(default_factory=list)
    labels: set = dataclasses.field(default_factory=set)


# Device calls of one top-level call that do not overlap in time (one device returned before another started:
# no collective held them together) still join it when they start within this many seconds of its end.
_SAME_CALL_S = 2e-3


def _mapped_calls(calls: list, events: list) -> list[_MappedCall]:
    """The trace's top-level mapped calls in time order: the device calls of one call number (the runtime's), or
    without one, those that overlap in time (a top-level call's devices run together, its nested calls inside) or
    follow within ``_SAME_CALL_S`` on devices not yet seen; each collective goes to the call during which it was
    released (collectives without a recorded call, such as other hosts', make their own)."""
    found: list[_MappedCall] = []
    for c in sorted(calls, key=lambda c: c.start):
        last = found[-1] if found else None
        if c.call is not None and last is not None and last.devices and last.devices[-1].call is not None:
            new = c.call != last.devices[-1].call
        else:
            new = last is None or c.start > last.end and (c.start - last.end >= _SAME_CALL_S or c.device in last.labels)
        if new:
            last = _MappedCall(len(found), c.start, c.end)
            found.append(last)
        last.end = max(last.end, c.end)
        last.devices.append(c)
        last.labels.add(c.device)
    starts = [m.start for m in found]
    alone: list[_MappedCall] = []
    for e in sorted(events, key=lambda e: e.released):
        k = bisect.bisect_right(starts, e.released) - 1
        home = found[k] if k >= 0 and e.released <= found[k].end else None
        if home is None:
            if not alone or min(e.arrived) > alone[-1].end:
                alone.append(_MappedCall(-1, min(e.arrived), e.released))
            home = alone[-1]
            home.end = e.released
        home.events.append(e)
    found = sorted(found + alone, key=lambda m: m.start)
    for k, m in enumerate(found):
        m.index = k
    return found


@dataclasses.dataclass
class _Panel:
    rows: list
    calls: list


def _panels(calls: list[_MappedCall]) -> list[_Panel]:
    """A panel per set of devices (the calls of one map, or of maps over the same devices), in order of first
    call; its rows are the devices, in device order."""
    panels: dict = {}
    for call in calls:
        rows = frozenset([c.device for c in call.devices] + [d for e in call.events for d in e.devices])
        panels.setdefault(rows, _Panel(sorted(rows, key=_device_sort_key), [])).calls.append(call)
    return list(panels.values())


def _counted(n: int, word: str) -> str:
    """``1 collective``, ``7 collectives``."""
    return f"{n} {word}{'s' * (n != 1)}"


def _calls_text(calls: list, events: list) -> str:
    """``1 mapped call (4 device calls)``: the top-level mapped calls, as the timeline's panels count them, and
    the device calls (one per device per call, nested calls included) that make them up."""
    return f"{_counted(len(_mapped_calls(calls, events)), 'mapped call')} ({_counted(len(calls), 'device call')})"


def _over(labels: list) -> str:
    """`` over 'x', 'y'``: the axes named in device labels (``device 5 [x=2, y=1]``), or nothing."""
    names = dict.fromkeys(part.split("=")[0] for label in labels if "[" in label
                          for part in label.split("[", 1)[1].rstrip("]").split(", "))
    return f" over {', '.join(map(repr, names))}" if names else ""


def _called(op: str, axis_name: tuple) -> str:
    """``pmean over 'data'``: a collective as the user called it, and its axes."""
    return f"{op} over {', '.join(map(repr, axis_name))}"


class _TimeAxis:
    """Times to x positions between ``x0`` and ``x1``: the busy ``spans`` (start, end) to one scale, each idle
    gap between them that is longer than the longest span and would be wider than ``CUT_AT`` breaks cut to a
    break ``BREAK`` px wide (a loop's short pauses between calls stay to scale)."""

    BREAK, CUT_AT = 18.0, 3.0

    def __init__(self, spans: list, x0: float, x1: float):
        spans = sorted(spans)
        merged = [list(spans[0])]
        for start, end in spans[1:]:
            if start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        longest = max(end - start for start, end in merged)
        gaps = [(a[1], b[0]) for a, b in zip(merged, merged[1:]) if b[0] - a[1] > longest]
        self.origin, self.span = merged[0][0], merged[-1][1] - merged[0][0]
        self.busy = sum(end - start for start, end in merged)
        self.x0, self.x1 = x0, x1
        cuts: list = []
        while True:
            brk = min(self.BREAK, 0.25 * (x1 - x0) / max(len(cuts), 1))
            scale = (x1 - x0 - brk * len(cuts)) / max(self.span - sum(b - a for a, b in cuts), 1e-9)
            more = [g for g in gaps if g not in cuts and (g[1] - g[0]) * scale > self.CUT_AT * brk]
            if not more:
                break
            cuts = sorted(cuts + more)
        self.cuts, self.brk, self.scale = cuts, brk, scale
        self.pieces = []  # (first time, last time, x of the first) of each stretch drawn to scale
        t, x = self.origin, x0
        for a, b in cuts:
            self.pieces.append((t, a, x))
            x += (a - t) * scale + brk
            t = b
        self.pieces.append((t, self.origin + self.span, x))
        self.starts = [first for first, _, _ in self.pieces]

    def x(self, t: float) -> float:
        first, last, x = self.pieces[max(bisect.bisect_right(self.starts, t) - 1, 0)]
        return x + (min(max(t, first), last) - first) * self.scale

    def bands(self, top: float, bottom: float) -> list[str]:
        """A light band from ``top`` to ``bottom`` where each cut is (drawn first, under the panels)."""
        return [f'<rect class="gap-band" x="{self.x(a):.1f}" y="{top}" width="{self.brk:.1f}" height="{bottom - top}" '
                f'fill="#f2f2f2"/>' for a, _ in self.cuts]

    def draw(self, y: float) -> list[str]:
        """The axis line at ``y``, ticks in ms since the origin (round steps, labels that do not overlap), and
        each cut: a zigzag on the axis and its length below."""
        from spmdsim.tools import _svg

        out = [f'<line class="time-axis" x1="{self.x0}" y1="{y}" x2="{self.x1}" y2="{y}" stroke="black" '
               f'stroke-width="0.8"/>']
        step = _tick_step(70 / self.scale * 1e3, 1)  # ms: a tick at most every 70 px
        digits = max(0, -math.floor(math.log10(step)))
        ticks, last_right = [], -math.inf
        for first, last, x in self.pieces:
            k0 = math.ceil((first - self.origin) * 1e3 / step - 1e-9)
            k1 = math.floor((last - self.origin) * 1e3 / step + 1e-9)
            marks = [(self.x(self.origin + k * step / 1e3), f"{k * step:.{digits}f}") for k in range(k0, k1 + 1)]
            if x > self.x0 and (not marks or marks[0][0] - x > 40):  # after a cut: where the stretch begins
                marks.insert(0, (x, f"{(first - self.origin) * 1e3:.{digits + 1}f}"))
            ticks += marks
        for tx, label in ticks:
            out.append(f'<line x1="{tx:.1f}" y1="{y}" x2="{tx:.1f}" y2="{y + 4}" stroke="black"/>')
            half = _svg.text_width(label, 11) / 2
            if tx - half > last_right + 6 and tx + half <= self.x1 + 20:
                out.append(_svg.text(tx, y + 16, label, size=11, anchor="middle"))
                last_right = tx + half
        ends = [-math.inf, -math.inf]  # the right end of the last length label on each of two lines
        for a, b in self.cuts:
            xa = self.x(a)
            zig = " ".join(f"{xa + self.brk * k / 4:.1f},{y + (-4 if k % 2 else 4)}" for k in range(5))
            label = _duration(b - a)
            mid, half = xa + self.brk / 2, _svg.text_width(label, 9) / 2
            line = next((k for k in (0, 1) if mid - half > ends[k] + 4), None)  # the second if the first is taken
            text = ""
            if line is not None:
                text = _svg.text(mid, y + 30 + 11 * line, label, size=9, anchor="middle")
                ends[line] = mid + half
            out.append(f'<g class="gap"><title>idle {label} cut out</title><polyline points="{zig}" fill="white" '
                       f'stroke="black" stroke-width="0.8"/>{text}</g>')
        return out


def _duration(seconds: float) -> str:
    """``1.23 s``, ``412 ms``, ``85 us``."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


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
