"""Recording collectives: ``with spmdsim.trace() as tr:`` keeps one event per completed rendezvous."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading

from spmdsim import _runtime

__all__ = ["CollectiveEvent", "Trace", "trace"]


@dataclasses.dataclass(frozen=True)
class CollectiveEvent:
    """One collective step of one communicator, as every participating device saw it.

    ``devices``, ``sites`` and ``arrived`` are indexed by the rank over the named axes (the axis index for
    one axis); times are ``time.perf_counter()`` seconds; ``nbytes`` is one device's operand size.
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

    @property
    def wait(self) -> float:
        """Seconds between the first arrival and the release (how long the earliest device waited)."""
        return self.released - min(self.arrived)


class Trace:
    """The collectives recorded while the ``trace()`` block ran, in completion order."""

    def __init__(self):
        self.events: list[CollectiveEvent] = []
        self._lock = threading.Lock()

    def record(self, rv, released: float) -> None:
        op, names, sizes, params, avals = rv.signature
        nbytes = sum(getattr(b, "nbytes", 0) for b in rv.blocks[0])
        event = CollectiveEvent(op, names, rv.size, rv.seq, dict(params), tuple(s for s, _ in avals),
                                tuple(str(d) for _, d in avals), nbytes, tuple(lane.label for lane in rv.lanes),
                                tuple(rv.sites), tuple(rv.arrivals), released)
        with self._lock:
            self.events.append(event)

    def counts(self) -> collections.Counter:
        """How many collectives of each op ran, e.g. ``Counter({'psum': 500})``."""
        return collections.Counter(e.op for e in self.events)


@contextlib.contextmanager
def trace():
    """Record every collective completed inside the block, from any thread. Yields a :class:`Trace`."""
    tr = Trace()
    _runtime.observers.append(tr)
    try:
        yield tr
    finally:
        _runtime.observers.remove(tr)
