"""``spmdsim compare``'s report: what is compared with what (:class:`Against`), the distance of two values in
ulps (:func:`distance`), the entries (:class:`Difference`, :class:`Drift`) and the :class:`Report` that holds them,
its tables and JSON, and the merging of the reports of the hosts of a multi-host run (:func:`merge`). The
observer that fills the report is :mod:`spmdsim.jax.tools._compare`."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

import numpy as np

from spmdsim.primitives._reduction import REDUCTION_ORDERS
from spmdsim.jax.evaluation._interpreter import site_of

__all__ = ["Against", "Difference", "Drift", "Report", "distance", "merge", "SCHEMA_PATH"]


SCHEMA_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "compare.schema.json")
SCHEMA_ID = "spmdsim-compare/1"


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

